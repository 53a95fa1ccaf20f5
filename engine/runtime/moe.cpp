// The mixture-of-experts MLP; see moe.h.
#include "runtime/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ms {

// Workspace slots (runtime/layers.h kLayerScratchSlots): the router's logits and their gradient (N, E) and
// the gates' gradients (R); one expert's gathered rows (n, C) and their gradient; its scratch gradients; and
// the bf16 staging of the kept expert tensors.
// Under expert parallelism three more: the all-to-all's send and receive staging, and the received rows in
// expert order (the kept expert inputs' bf16 staging in forward, their gradient in backward); in bf16 runs
// two more, the rows as they travel (bf16, Megatron-Core's dispatcher sends the activations' dtype).
namespace {
constexpr int kLogitsSlot = 15, kRowsSlot = 16, kScratchSlot = 17, kGuSlot = 18, kHSlot = 19, kYSlot = 20;
constexpr int kSendSlot = 21, kRecvSlot = 22, kExpertRowsSlot = 23;
// 24-28 are ring attention's (transformer.cpp), used only inside the attention's own calls.
constexpr int kWireSendSlot = 29, kWireRecvSlot = 30;
static_assert(kWireRecvSlot < kLayerScratchSlots);
}  // namespace

// The host's routing of one microbatch.
struct MoeMlp::Routing {
  std::vector<float> probs;    // (N, E) router softmax
  std::vector<int> choice;     // (N, k) chosen experts, best first
  std::vector<float> gate;     // (N, k) renormalised probabilities (a dropped slot's contribution is 0)
  std::vector<int> row;        // (N, k) the slot's row in the experts' batch, -1 where dropped
  std::vector<int> offsets;    // E + 1: expert e's rows are [offsets[e], offsets[e + 1])
  std::vector<int32_t> token;  // R: each row's token
  std::vector<float> rowGate;  // R
  std::vector<int> routed;     // E: tokens routed to e (before drops), the load-balancing loss's f_e N
  double aux = 0;
  int rows() const { return offsets.back(); }
  // Expert parallelism: the rows this rank's experts receive, source by source (each source's in its
  // expert order): recvCounts (ep, El) rows from source s for local expert l; the same rows in expert order
  // (local expert l's are [localOffsets[l], localOffsets[l + 1]), source by source), a total of received().
  std::vector<int> recvCounts;
  std::vector<int> localOffsets;
  int received() const { return localOffsets.empty() ? 0 : localOffsets.back(); }
};

struct MoeMlp::Cache {
  explicit Cache(MemoryTracker* t)
      : idx(0, MemoryCategory::Activations, t),
        gates(0, MemoryCategory::Activations, t),
        perm(0, MemoryCategory::Activations, t),
        xe(t),
        gu(t),
        h(t),
        y(t) {}
  Routing routing;
  float auxScale = 0;
  Buffer idx, gates;  // (R) int32 token indices (bit patterns in a float buffer) and gates
  // Expert parallelism: (2, received) int32: the received row (source order) of each row in expert order,
  // then the row in expert order of each received row (the inverse).
  Buffer perm;
  KeptInput xe;   // expert parallelism: the received rows in expert order, the experts' GEMM input
  KeptTensor gu;  // (R, 2Fl): each expert's rows' gate outputs, then their up outputs
  KeptInput h;    // (R, Fl) SwiGLU outputs
  KeptTensor y;   // (R, C) expert outputs (partial sums under TP)
};

MoeMlp::MoeMlp(const LayerContext& ctx, const std::string& prefix)
    : m_be(ctx.backend),
      m_tp(ctx.tp),
      m_ep(ctx.ep),
      m_ws(ctx.workspace),
      m_C(ctx.model.width),
      m_E(ctx.model.experts),
      m_k(ctx.model.expertsPerToken),
      m_Fl(static_cast<int>(ctx.model.expertHidden() / ctx.tp.size)),
      m_capacityFactor(ctx.model.capacityFactor),
      m_auxCoef(ctx.model.auxLossCoef),
      m_caches(std::make_unique<SlotCaches<Cache>>(ctx.tracker)),
      m_tracker(ctx.tracker) {
  m_router = bindParam(ctx.params, prefix + "mlp.gate.weight");
  m_El = m_E / m_ep.size;
  m_first = m_ep.rank * m_El;
  for (int e = m_first; e < m_first + m_El; ++e) {
    const std::string p = prefix + "mlp.experts." + std::to_string(e) + ".";
    m_gate.push_back(bindParam(ctx.params, p + "gate_proj.weight"));
    m_up.push_back(bindParam(ctx.params, p + "up_proj.weight"));
    m_down.push_back(bindParam(ctx.params, p + "down_proj.weight"));
  }
}

MoeMlp::~MoeMlp() = default;

void MoeMlp::release(int slot) {
  m_caches->release(slot);
}

double MoeMlp::auxLoss(int slot) const {
  const Cache* c = m_caches->find(slot);
  return c ? c->routing.aux : 0.0;
}

void MoeMlp::forward(int slot, const float* x, float* out, int N, float auxScale) {
  Cache& c = (*m_caches)[slot];
  c.auxScale = auxScale;
  Routing& r = c.routing;
  const int E = m_E, k = m_k, C = m_C, Fl = m_Fl;
  // Router logits (N, E) = x Wr^T, to the host.
  float* logits = m_ws->get(kLogitsSlot, size_t(N) * E, false);
  m_be.linearForwardT(logits, x, m_router.gemm(), nullptr, N, C, E);
  std::vector<float> z(size_t(N) * E);
  m_be.download(z.data(), logits, z.size() * sizeof(float));
  r.probs.assign(size_t(N) * E, 0.0f);
  r.choice.assign(size_t(N) * k, -1);
  r.gate.assign(size_t(N) * k, 0.0f);
  r.row.assign(size_t(N) * k, -1);
  r.routed.assign(E, 0);
  std::vector<int> order(E);
  for (int n = 0; n < N; ++n) {
    const float* zn = &z[size_t(n) * E];
    float* p = &r.probs[size_t(n) * E];
    const float mx = *std::max_element(zn, zn + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(double(zn[e]) - mx);
    for (int e = 0; e < E; ++e) p[e] = static_cast<float>(std::exp(double(zn[e]) - mx) / sum);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    double chosen = 0;
    for (int s = 0; s < k; ++s) chosen += p[order[s]];
    for (int s = 0; s < k; ++s) {
      r.choice[size_t(n) * k + s] = order[s];
      r.gate[size_t(n) * k + s] = static_cast<float>(p[order[s]] / chosen);
      ++r.routed[order[s]];
    }
  }
  // Rows: each expert's tokens in token order, up to its capacity.
  const int capacity =
      m_capacityFactor > 0 ? static_cast<int>(std::ceil(m_capacityFactor * double(N) * k / E)) : N;
  r.offsets.assign(E + 1, 0);
  r.token.clear();
  r.rowGate.clear();
  for (int e = 0; e < E; ++e) {
    int taken = 0;
    for (int n = 0; n < N && taken < capacity; ++n)
      for (int s = 0; s < k; ++s)
        if (r.choice[size_t(n) * k + s] == e) {
          r.row[size_t(n) * k + s] = static_cast<int>(r.token.size());
          r.token.push_back(n);
          r.rowGate.push_back(r.gate[size_t(n) * k + s]);
          ++taken;
        }
    r.offsets[e + 1] = static_cast<int>(r.token.size());
  }
  // The load-balancing loss of this microbatch.
  double aux = 0;
  for (int e = 0; e < E; ++e) {
    double P = 0;
    for (int n = 0; n < N; ++n) P += r.probs[size_t(n) * E + e];
    aux += double(r.routed[e]) / N * (P / N);
  }
  r.aux = m_auxCoef * E * aux;

  const int R = r.rows();
  c.idx.reserve(std::max(R, 1));
  c.gates.reserve(std::max(R, 1));
  if (R > 0) {
    m_be.upload(c.idx.data(), r.token.data(), size_t(R) * sizeof(int32_t));
    m_be.upload(c.gates.data(), r.rowGate.data(), size_t(R) * sizeof(float));
  }
  if (m_ep.size > 1) {  // every rank of the group takes part, whatever its own rows
    forwardParallel(c, x, out);
    return;
  }
  const auto* idx = reinterpret_cast<const int32_t*>(c.idx.data());
  int most = 0;
  for (int e = 0; e < E; ++e) most = std::max(most, r.offsets[e + 1] - r.offsets[e]);
  float* rows = m_ws->get(kRowsSlot, size_t(std::max(most, 1)) * C, false);
  float* gu = c.gu.target(size_t(std::max(R, 1)) * 2 * Fl, *m_ws, kGuSlot);
  for (int e = 0; e < E; ++e) {
    const int o = r.offsets[e], n = r.offsets[e + 1] - o;
    if (n == 0) continue;
    m_be.gatherRows(rows, x, idx + o, nullptr, n, C);
    float* g = gu + size_t(o) * 2 * Fl;
    m_be.linearForwardT(g, rows, m_gate[e].gemm(), nullptr, n, C, Fl);
    m_be.linearForwardT(g + size_t(n) * Fl, rows, m_up[e].gemm(), nullptr, n, C, Fl);
  }
  c.gu.keep(gu);  // in bf16 the rounded values, as backward reads them
  float* h = c.h.target(size_t(std::max(R, 1)) * Fl, *m_ws, kHSlot);
  for (int e = 0; e < E; ++e) {
    const int o = r.offsets[e], n = r.offsets[e + 1] - o;
    if (n == 0) continue;
    const float* g = gu + size_t(o) * 2 * Fl;
    m_be.swigluForward(h + size_t(o) * Fl, g, g + size_t(n) * Fl, size_t(n) * Fl);
  }
  const TensorIn hk = c.h.keep(h);
  float* y = c.y.target(size_t(std::max(R, 1)) * C, *m_ws, kYSlot);
  for (int e = 0; e < E; ++e) {
    const int o = r.offsets[e], n = r.offsets[e + 1] - o;
    if (n == 0) continue;
    m_be.linearForwardT(y + size_t(o) * C, hk.at(size_t(o) * Fl), m_down[e].gemm(), nullptr, n, Fl, C);
  }
  c.y.keep(y);
  // Expert by expert (a token's rows within one call are distinct), in expert order.
  for (int e = 0; e < E; ++e) {
    const int o = r.offsets[e], n = r.offsets[e + 1] - o;
    if (n > 0) m_be.scatterAddRows(out, y + size_t(o) * C, idx + o, c.gates.data() + o, n, C);
  }
}

void MoeMlp::backward(int slot, const float* x, const float* dout, float* dx, int N, bool routerInput) {
  Cache& c = (*m_caches)[slot];
  const Routing& r = c.routing;
  const int E = m_E, k = m_k, C = m_C, Fl = m_Fl, R = r.rows();
  const auto* idx = reinterpret_cast<const int32_t*>(c.idx.data());
  // The gates' gradients: <dout[token], y[row]> (summed over the TP group: y is a partial sum there).
  float* dgates = m_ws->get(kLogitsSlot, std::max(size_t(N) * E, size_t(std::max(R, 1))), false);
  std::vector<float> dgate(R);
  if (R > 0) {
    const float* y = c.y.read(*m_ws);
    for (int e = 0; e < E; ++e) {
      const int o = r.offsets[e], n = r.offsets[e + 1] - o;
      if (n > 0) m_be.rowDots(dgates + o, dout, idx + o, y + size_t(o) * C, n, C);
    }
    m_tp.allReduce(dgates, size_t(R));
    m_be.download(dgate.data(), dgates, size_t(R) * sizeof(float));
  }
  if (m_ep.size > 1) {
    backwardParallel(c, dout, dx);
  } else if (R > 0) {
    // The experts, one at a time.
    const float* gu = c.gu.read(*m_ws);
    const TensorIn hk = c.h.in();
    int most = 0;
    for (int e = 0; e < E; ++e) most = std::max(most, r.offsets[e + 1] - r.offsets[e]);
    float* rows = m_ws->get(kRowsSlot, size_t(most) * C * 2, false);  // gathered x rows | their gradient
    float* drows = rows + size_t(most) * C;
    float* scratch = m_ws->get(kScratchSlot, size_t(most) * (3 * size_t(Fl) + C), false);
    for (int e = 0; e < E; ++e) {
      const int o = r.offsets[e], n = r.offsets[e + 1] - o;
      if (n == 0) continue;
      float* dy = drows;                      // (n, C) gate * dout rows
      float* dh = scratch;                    // (n, Fl)
      float* dgu = scratch + size_t(n) * Fl;  // (n, 2Fl)
      m_be.gatherRows(dy, dout, idx + o, c.gates.data() + o, n, C);
      m_be.zero(scratch, size_t(n) * 3 * Fl * sizeof(float));
      m_be.linearBackwardT(dh, m_down[e].grad(), nullptr, dy, hk.at(size_t(o) * Fl), m_down[e].gemm(), n, Fl,
                           C);
      const float* g = gu + size_t(o) * 2 * Fl;
      m_be.swigluBackward(dgu, dgu + size_t(n) * Fl, dh, g, g + size_t(n) * Fl, size_t(n) * Fl);
      m_be.gatherRows(rows, x, idx + o, nullptr, n, C);
      float* dxr = drows;  // dy is done with
      m_be.zero(dxr, size_t(n) * C * sizeof(float));
      m_be.linearBackwardT(dxr, m_gate[e].grad(), nullptr, dgu, rows, m_gate[e].gemm(), n, C, Fl);
      m_be.linearBackwardT(dxr, m_up[e].grad(), nullptr, dgu + size_t(n) * Fl, rows, m_up[e].gemm(), n, C,
                           Fl);
      m_be.scatterAddRows(dx, dxr, idx + o, nullptr, n, C);
    }
  }
  // The router on the host: gates' gradients -> the renormalised top-k -> the softmax, plus the
  // load-balancing loss's d/dp[n, e] = auxScale * coef * E * f_e / N.
  std::vector<float> dz(size_t(N) * E, 0.0f);
  std::vector<double> dp(E);
  for (int n = 0; n < N; ++n) {
    const float* p = &r.probs[size_t(n) * E];
    for (int e = 0; e < E; ++e) dp[e] = double(c.auxScale) * m_auxCoef * E * double(r.routed[e]) / N / N;
    double chosen = 0, dot = 0;
    for (int s = 0; s < k; ++s) chosen += p[r.choice[size_t(n) * k + s]];
    for (int s = 0; s < k; ++s) {
      const int row = r.row[size_t(n) * k + s];
      const double dg = row >= 0 ? dgate[row] : 0.0;
      dot += dg * r.gate[size_t(n) * k + s];
    }
    for (int s = 0; s < k; ++s) {
      const int row = r.row[size_t(n) * k + s];
      const double dg = row >= 0 ? dgate[row] : 0.0;
      dp[r.choice[size_t(n) * k + s]] += (dg - dot) / chosen;
    }
    double pdp = 0;
    for (int e = 0; e < E; ++e) pdp += double(p[e]) * dp[e];
    for (int e = 0; e < E; ++e) dz[size_t(n) * E + e] = static_cast<float>(p[e] * (dp[e] - pdp));
  }
  float* dlogits = m_ws->get(kLogitsSlot, size_t(N) * E, false);
  m_be.upload(dlogits, dz.data(), dz.size() * sizeof(float));
  m_be.linearBackwardT(routerInput ? dx : nullptr, m_router.grad(), nullptr, dlogits, x, m_router.gemm(), N,
                       C, E);
}

void MoeMlp::planExchange(Cache& c) {
  Routing& r = c.routing;
  const int P = m_ep.size, El = m_El;
  // Rows for global expert e go to rank e / El: the routing's expert order is already destination order.
  std::vector<int32_t> sendCounts(size_t(P) * El), recvCounts(size_t(P) * El);
  for (int e = 0; e < m_E; ++e) sendCounts[size_t(e)] = r.offsets[e + 1] - r.offsets[e];
  // Through backend memory: the group's communicator carries backend tensors (NCCL's on a GPU).
  float* buf = m_ws->get(kSendSlot, 2 * size_t(P) * El, false);
  m_be.upload(buf, sendCounts.data(), sendCounts.size() * sizeof(int32_t));
  std::vector<size_t> counts(static_cast<size_t>(P), static_cast<size_t>(El)),
      offsets(static_cast<size_t>(P));
  for (int j = 0; j < P; ++j) offsets[size_t(j)] = size_t(j) * El;
  Status st = m_ep.comm->allToAllV(buf, counts.data(), offsets.data(), buf + size_t(P) * El, counts.data(),
                                   offsets.data(), CommType::I32);
  if (!st) throw CommFailure("expert-parallel all-to-all of the row counts: " + st.message());
  m_be.download(recvCounts.data(), buf + size_t(P) * El, recvCounts.size() * sizeof(int32_t));
  r.recvCounts.assign(recvCounts.begin(), recvCounts.end());
  // Expert order: local expert l's rows from source 0, then source 1, ...
  r.localOffsets.assign(size_t(El) + 1, 0);
  for (int l = 0; l < El; ++l) {
    int n = 0;
    for (int src = 0; src < P; ++src) n += r.recvCounts[size_t(src) * El + l];
    r.localOffsets[size_t(l) + 1] = r.localOffsets[size_t(l)] + n;
  }
  const int Rr = r.received();
  std::vector<int32_t> perm(2 * size_t(std::max(Rr, 1)));  // expert order -> source order, then the inverse
  std::vector<int> at(r.localOffsets.begin(), r.localOffsets.end() - 1);
  int row = 0;  // in source order
  for (int src = 0; src < P; ++src)
    for (int l = 0; l < El; ++l)
      for (int i = 0; i < r.recvCounts[size_t(src) * El + l]; ++i, ++row) {
        perm[size_t(at[size_t(l)])] = row;
        perm[size_t(Rr) + size_t(row)] = at[size_t(l)]++;
      }
  c.perm.reserve(std::max(2 * Rr, 1));
  if (Rr > 0) m_be.upload(c.perm.data(), perm.data(), 2 * size_t(Rr) * sizeof(int32_t));
}

void MoeMlp::exchange(const Routing& r, const float* send, float* recv, bool back) {
  const int P = m_ep.size, El = m_El, C = m_C;
  const auto n = static_cast<size_t>(P);
  std::vector<size_t> mine(n), theirs(n), mineAt(n), theirsAt(n);
  size_t a = 0, b = 0;
  for (int j = 0; j < P; ++j) {
    // Rows this rank routed to rank j's experts, and rows rank j routed to this rank's.
    const size_t routed = size_t(r.offsets[size_t(j + 1) * El] - r.offsets[size_t(j) * El]);
    size_t received = 0;
    for (int l = 0; l < El; ++l) received += size_t(r.recvCounts[size_t(j) * El + l]);
    mine[size_t(j)] = routed * C;
    theirs[size_t(j)] = received * C;
    mineAt[size_t(j)] = a;
    theirsAt[size_t(j)] = b;
    a += routed * C;
    b += received * C;
  }
  // In bf16 runs the rows travel as bf16, half the bytes. Forward's rows lose nothing (the experts' input is
  // a bf16 LayerNorm output widened, their output is kept rounded to bf16 before it is sent home); backward's
  // output gradients are rounded as the experts' GEMMs round them; only the input gradients going home are
  // rounded where fp32 would not be (Megatron-Core sends them in bf16 too).
  const size_t sent = back ? b : a, got = back ? a : b;
  const bool wire16 = m_be.gemmPrecision() == GemmPrecision::Bf16;
  const void* s = send;
  void* d = recv;
  if (wire16) {
    auto* s16 =
        reinterpret_cast<bfloat16*>(m_ws->get(kWireSendSlot, std::max<size_t>(sent, 2) / 2 + 1, false));
    d = m_ws->get(kWireRecvSlot, std::max<size_t>(got, 2) / 2 + 1, false);
    if (sent > 0) m_be.toBf16(s16, send, sent);
    s = s16;
  }
  const CommType type = wire16 ? CommType::BF16 : CommType::F32;
  Status st =
      back ? m_ep.comm->allToAllV(s, theirs.data(), theirsAt.data(), d, mine.data(), mineAt.data(), type)
           : m_ep.comm->allToAllV(s, mine.data(), mineAt.data(), d, theirs.data(), theirsAt.data(), type);
  if (!st) throw CommFailure("expert-parallel all-to-all: " + st.message());
  if (wire16 && got > 0) m_be.fromBf16(recv, reinterpret_cast<const bfloat16*>(d), got);
}

MoeMlp::Staging MoeMlp::dispatch(const Cache& c, const float* src, const float* scale) {
  const Routing& r = c.routing;
  const int R = r.rows();
  const size_t most = size_t(std::max({R, r.received(), 1})) * m_C;
  Staging s{m_ws->get(kSendSlot, most, false), m_ws->get(kRecvSlot, most, false)};
  if (R > 0) m_be.gatherRows(s.send, src, reinterpret_cast<const int32_t*>(c.idx.data()), scale, R, m_C);
  exchange(r, s.send, s.recv, false);
  return s;
}

void MoeMlp::forwardParallel(Cache& c, const float* x, float* out) {
  planExchange(c);
  const Routing& r = c.routing;
  const int C = m_C, Fl = m_Fl, El = m_El, R = r.rows(), Rr = r.received();
  const auto* idx = reinterpret_cast<const int32_t*>(c.idx.data());
  const auto* perm = reinterpret_cast<const int32_t*>(c.perm.data());
  // The routed rows, in destination order, to the experts' ranks.
  const auto [send, recv] = dispatch(c, x, nullptr);
  // In expert order, kept for the weight gradients.
  float* xe = c.xe.target(size_t(std::max(Rr, 1)) * C, *m_ws, kExpertRowsSlot);
  if (Rr > 0) m_be.gatherRows(xe, recv, perm, nullptr, Rr, C);
  const TensorIn xk = c.xe.keep(xe);
  float* gu = c.gu.target(size_t(std::max(Rr, 1)) * 2 * Fl, *m_ws, kGuSlot);
  for (int l = 0; l < El; ++l) {
    const int o = r.localOffsets[size_t(l)], n = r.localOffsets[size_t(l) + 1] - o;
    if (n == 0) continue;
    float* g = gu + size_t(o) * 2 * Fl;
    m_be.linearForwardT(g, xk.at(size_t(o) * C), m_gate[size_t(l)].gemm(), nullptr, n, C, Fl);
    m_be.linearForwardT(g + size_t(n) * Fl, xk.at(size_t(o) * C), m_up[size_t(l)].gemm(), nullptr, n, C, Fl);
  }
  c.gu.keep(gu);
  float* h = c.h.target(size_t(std::max(Rr, 1)) * Fl, *m_ws, kHSlot);
  for (int l = 0; l < El; ++l) {
    const int o = r.localOffsets[size_t(l)], n = r.localOffsets[size_t(l) + 1] - o;
    if (n == 0) continue;
    const float* g = gu + size_t(o) * 2 * Fl;
    m_be.swigluForward(h + size_t(o) * Fl, g, g + size_t(n) * Fl, size_t(n) * Fl);
  }
  const TensorIn hk = c.h.keep(h);
  float* ye = m_ws->get(kRowsSlot, size_t(std::max(Rr, 1)) * C, false);
  for (int l = 0; l < El; ++l) {
    const int o = r.localOffsets[size_t(l)], n = r.localOffsets[size_t(l) + 1] - o;
    if (n > 0)
      m_be.linearForwardT(ye + size_t(o) * C, hk.at(size_t(o) * Fl), m_down[size_t(l)].gemm(), nullptr, n, Fl,
                          C);
  }
  // Back in source order, home, and kept as without ep (the gates' gradients read them).
  if (Rr > 0) m_be.gatherRows(send, ye, perm + Rr, nullptr, Rr, C);
  float* y = c.y.target(size_t(std::max(R, 1)) * C, *m_ws, kYSlot);
  exchange(r, send, y, true);
  c.y.keep(y);
  for (int e = 0; e < m_E; ++e) {
    const int o = r.offsets[size_t(e)], n = r.offsets[size_t(e) + 1] - o;
    if (n > 0) m_be.scatterAddRows(out, y + size_t(o) * C, idx + o, c.gates.data() + o, n, C);
  }
}

void MoeMlp::backwardParallel(Cache& c, const float* dout, float* dx) {
  const Routing& r = c.routing;
  const int C = m_C, Fl = m_Fl, El = m_El, Rr = r.received();
  const auto* idx = reinterpret_cast<const int32_t*>(c.idx.data());
  const auto* perm = reinterpret_cast<const int32_t*>(c.perm.data());
  // The gated output gradients of the routed rows, to the experts' ranks.
  const auto [send, recv] = dispatch(c, dout, c.gates.data());
  int widest = 0;
  for (int l = 0; l < El; ++l)
    widest = std::max(widest, r.localOffsets[size_t(l) + 1] - r.localOffsets[size_t(l)]);
  float* dye = m_ws->get(kRowsSlot, size_t(std::max(Rr, 1)) * C, false);
  if (Rr > 0) m_be.gatherRows(dye, recv, perm, nullptr, Rr, C);
  const float* gu = c.gu.read(*m_ws);
  const TensorIn hk = c.h.in();
  const TensorIn xk = c.xe.in();
  float* scratch = m_ws->get(kScratchSlot, size_t(std::max(widest, 1)) * 3 * Fl, false);
  float* dxe = m_ws->get(kExpertRowsSlot, size_t(std::max(Rr, 1)) * C, true);
  for (int l = 0; l < El; ++l) {
    const int o = r.localOffsets[size_t(l)], n = r.localOffsets[size_t(l) + 1] - o;
    if (n == 0) continue;
    float* dh = scratch;                    // (n, Fl)
    float* dgu = scratch + size_t(n) * Fl;  // (n, 2Fl)
    m_be.zero(scratch, size_t(n) * 3 * Fl * sizeof(float));
    m_be.linearBackwardT(dh, m_down[size_t(l)].grad(), nullptr, dye + size_t(o) * C, hk.at(size_t(o) * Fl),
                         m_down[size_t(l)].gemm(), n, Fl, C);
    const float* g = gu + size_t(o) * 2 * Fl;
    m_be.swigluBackward(dgu, dgu + size_t(n) * Fl, dh, g, g + size_t(n) * Fl, size_t(n) * Fl);
    m_be.linearBackwardT(dxe + size_t(o) * C, m_gate[size_t(l)].grad(), nullptr, dgu, xk.at(size_t(o) * C),
                         m_gate[size_t(l)].gemm(), n, C, Fl);
    m_be.linearBackwardT(dxe + size_t(o) * C, m_up[size_t(l)].grad(), nullptr, dgu + size_t(n) * Fl,
                         xk.at(size_t(o) * C), m_up[size_t(l)].gemm(), n, C, Fl);
  }
  // The input gradients, in source order, home; then added to each routed row's token.
  if (Rr > 0) m_be.gatherRows(send, dxe, perm + Rr, nullptr, Rr, C);
  exchange(r, send, recv, true);
  for (int e = 0; e < m_E; ++e) {
    const int o = r.offsets[size_t(e)], n = r.offsets[size_t(e) + 1] - o;
    if (n > 0) m_be.scatterAddRows(dx, recv + size_t(o) * C, idx + o, nullptr, n, C);
  }
}

}  // namespace ms
