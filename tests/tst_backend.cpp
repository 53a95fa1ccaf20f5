// Tests of the Backend interface (kernels/backend.h). Every op is written once as a CASE that runs on a
// backend through the interface alone (inputs uploaded, outputs downloaded) on fixed-seed data, and two
// backends are compared output by output:
// - TestBackendCpu (CTest tst_backend, label unit): the CPU backend against its emulated device,
//   bit for bit, on every case and shape; the emulation's misuse checks (a host pointer given to an op, a
//   device pointer given as upload's or download's host side); marks, info, memory calls; the Tf32 and Bf16
//   GEMM precisions as the Fp32 ops on operands rounded by the test's own rounding, bit for bit; the
//   multi-tensor optimizer forms against the single forms segment by segment, bit for bit, and the CUDA
//   launch's plan (host code); convolution and the batch-norm parts on their own shapes (plain against
//   emulated, and the plain backend against ms::cpu's kernels called directly, bit for bit; the GEMM
//   precisions; bf16 parameters, inputs and gradients; bad shapes refused naming the op); the Llama-family
//   ops (RMSNorm, SwiGLU, RoPE with grouped-query heads) in every case, RMSNorm with a bf16 weight and
//   gradient, bad RoPE shapes refused naming the op; the mixture-of-experts row ops (gatherRows,
//   scatterAddRows, rowDots) with their index lists and gates in backend memory; ring attention's block ops
//   (context parallelism) assembled over cp ranks, plain and emulated: fp32 bit for bit against ms::cpu's,
//   Bf16 bit for bit against them on operands rounded on the host and within a stated bound of fp32.
// - TestBackendCuda (CTest tst_backend_gpu, label gpu; the same binary with the argument "gpu"): the CUDA
//   backend against the CPU backend on the same cases (fp32 GEMMs: within atol + 1e-4 * |ref|), in Bf16 too
//   (linear and attention), attention on the fused kernel's shapes and past its head-size limit, plus what
//   only a GPU has: allocator zero-fill and alignment after reuse, out of memory, event marks, memoryInfo;
//   the multi-tensor optimizer forms (one launch) against the CPU's single forms (1e-6 relative) and the
//   CUDA single forms (bitwise); convolution (fp32 and bf16, up to a chunked 10 x 64 x 56 x 56 and the
//   224 x 224 stem) and batch norm (up to 100k elements a channel; the double sums within 1e-9) against
//   the CPU backend; the Llama-family ops on Llama-like heads at positions past 4000; the MoE row ops on wide
//   rows and past the row grid, bad MoE shapes refused naming the op; ring attention's block ops refused (no
//   CUDA kernel yet). Without a device (or a CUDA build) it skips with "no CUDA device", which CTest reports
//   as skipped.
// Shapes are deliberately odd (N = 7, C = 33, V = 50, T = 5, H = 3): multiples of no block size.
#include <QtTest/QtTest>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "plan/model_spec.h"
#ifdef MESHSTUDIO_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_info.h"
#include "kernels/cuda/cuda_ops.h"
#endif

namespace {

using Vec = std::vector<float>;
using Ints = std::vector<int32_t>;

constexpr unsigned kSeed = 20240917;

// ---- One run of a case on one backend --------------------------------------------------------------------

struct Output {
  std::string name;
  Vec f;
  Ints i;
  std::vector<double> d;
};

// Owns the backend memory a case allocates and collects the outputs it downloads.
class Session {
 public:
  explicit Session(ms::Backend& backend) : be(backend) {}
  ~Session() {
    for (const auto& [p, bytes] : m_allocs) be.deallocate(p, bytes);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  template <typename T>
  T* alloc(size_t n) {
    void* p = be.allocate(n * sizeof(T));
    if (p) m_allocs.emplace_back(p, n * sizeof(T));
    return static_cast<T*>(p);
  }
  template <typename T>
  T* up(const std::vector<T>& host) {
    T* p = alloc<T>(host.size());
    be.upload(p, host.data(), host.size() * sizeof(T));
    return p;
  }
  void out(const std::string& name, const float* p, size_t n) {
    Output o{name, Vec(n), {}, {}};
    be.download(o.f.data(), p, n * sizeof(float));
    outputs.push_back(std::move(o));
  }
  void out(const std::string& name, const double* p, size_t n) {
    Output o{name, {}, {}, std::vector<double>(n)};
    be.download(o.d.data(), p, n * sizeof(double));
    outputs.push_back(std::move(o));
  }
  void out(const std::string& name, const int32_t* p, size_t n) {
    Output o{name, {}, Ints(n), {}};
    be.download(o.i.data(), p, n * sizeof(int32_t));
    outputs.push_back(std::move(o));
  }
  void value(const std::string& name, double v) { outputs.push_back(Output{name, {}, {}, {v}}); }

  ms::Backend& be;
  std::vector<Output> outputs;

 private:
  std::vector<std::pair<void*, size_t>> m_allocs;
};

// ---- Data ------------------------------------------------------------------------------------------------

struct Shape {
  const char* name;
  int B, T, C, H, V, OC, S, P;
  int N() const { return B * T; }
};

const Shape kShapes[] = {
    {"tiny B1 T1 C3 H3 V2 OC1 S2 P1", 1, 1, 3, 3, 2, 1, 2, 1},
    {"odd B1 T7 C33 H3 V50 OC5 S6 P3", 1, 7, 33, 3, 50, 5, 6, 3},
    {"odd B3 T5 C33 H3 V50 OC7 S10 P5", 3, 5, 33, 3, 50, 7, 10, 5},
    {"medium B2 T37 C48 H4 V257 OC65 S12 P4", 2, 37, 48, 4, 257, 65, 12, 4},
};

Vec rnd(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Ints tokens(std::mt19937& rng, size_t n, int lo, int hi) {  // in [lo, hi]
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  Ints v(n);
  for (int32_t& x : v) x = dist(rng);
  return v;
}

// ---- The cases: every Backend op, through the interface only ----------------------------------------------

void memoryCase(Session& s, const Shape& sh) {
  std::mt19937 rng(kSeed);
  const int rows = sh.T, C = sh.C;
  const size_t n = size_t(sh.N()) * C;
  const Vec x = rnd(rng, n);
  float* a = s.up(x);
  float* b = s.alloc<float>(n);
  s.out("allocate is zero-filled", b, n);
  s.be.copy(b, a, n * sizeof(float));
  s.out("copy", b, n);
  // (rows, C) out of a (rows, C + 3) pitch into a (rows, C + 1) pitch.
  float* src = s.up(rnd(rng, size_t(rows) * (C + 3)));
  float* dst = s.up(rnd(rng, size_t(rows) * (C + 1)));
  s.be.copy2D(dst, (C + 1) * sizeof(float), src, (C + 3) * sizeof(float), C * sizeof(float), rows);
  s.out("copy2D", dst, size_t(rows) * (C + 1));
  // A source pitch of 0 repeats one row.
  s.be.copy2D(dst, (C + 1) * sizeof(float), a, 0, C * sizeof(float), rows);
  s.out("copy2D broadcast", dst, size_t(rows) * (C + 1));
  // Equal pitches: one contiguous block.
  s.be.copy2D(dst, C * sizeof(float), src, C * sizeof(float), C * sizeof(float), rows);
  s.out("copy2D contiguous", dst, size_t(rows) * (C + 1));
  if (n > 2) {
    s.be.zero(b + 1, (n - 2) * sizeof(float));
    s.out("zero", b, n);
  }
  const Ints t = tokens(rng, size_t(sh.N()), -5, 5);
  s.out("int round trip", s.up(t), t.size());
  s.be.synchronize();
}

void linearCase(Session& s, const Shape& sh) {
  std::mt19937 rng(kSeed + 1);
  const int N = sh.N(), C = sh.C, OC = sh.OC;
  float* inp = s.up(rnd(rng, size_t(N) * C));
  float* w = s.up(rnd(rng, size_t(C) * OC));  // (C, OC), read as (OC, C) by the T variants
  float* bias = s.up(rnd(rng, size_t(OC)));
  float* dout = s.up(rnd(rng, size_t(N) * OC));
  float* out = s.up(Vec(size_t(N) * OC, 7.0f));  // overwritten
  for (const bool transposed : {false, true}) {
    const std::string v = transposed ? "T " : "";
    float* dinp = s.up(rnd(rng, size_t(N) * C));  // non-zero: backward accumulates
    float* dw = s.up(rnd(rng, size_t(C) * OC));
    float* db = s.up(rnd(rng, size_t(OC)));
    if (transposed) {
      s.be.linearForwardT(out, inp, w, bias, N, C, OC);
      s.out(v + "forward", out, size_t(N) * OC);
      s.be.linearBackwardT(dinp, dw, db, dout, inp, w, N, C, OC);
      s.be.linearForwardT(out, inp, w, nullptr, N, C, OC);
      s.out(v + "forward no bias", out, size_t(N) * OC);
      s.be.linearBackwardT(nullptr, dw, nullptr, dout, inp, w, N, C, OC);
    } else {
      s.be.linearForward(out, inp, w, bias, N, C, OC);
      s.out(v + "forward", out, size_t(N) * OC);
      s.be.linearBackward(dinp, dw, db, dout, inp, w, N, C, OC);
      s.be.linearForward(out, inp, w, nullptr, N, C, OC);
      s.out(v + "forward no bias", out, size_t(N) * OC);
      s.be.linearBackward(nullptr, dw, nullptr, dout, inp, w, N, C, OC);
    }
    s.out(v + "dinp", dinp, size_t(N) * C);
    s.out(v + "dweight (twice)", dw, size_t(C) * OC);
    s.out(v + "dbias", db, size_t(OC));
  }
}

void layerNormCase(Session& s, const Shape& sh) {
  std::mt19937 rng(kSeed + 2);
  const int N = sh.N(), C = sh.C;
  float* inp = s.up(rnd(rng, size_t(N) * C, -2.0f, 3.0f));
  float* w = s.up(rnd(rng, size_t(C)));
  float* b = s.up(rnd(rng, size_t(C)));
  float* dout = s.up(rnd(rng, size_t(N) * C));
  float* dinp = s.up(rnd(rng, size_t(N) * C));
  float* dw = s.up(rnd(rng, size_t(C)));
  float* db = s.up(rnd(rng, size_t(C)));
  float* out = s.alloc<float>(size_t(N) * C);
  float* mean = s.alloc<float>(size_t(N));
  float* rstd = s.alloc<float>(size_t(N));
  s.be.layerNormForward(out, mean, rstd, inp, w, b, N, C, 1e-5f);
  s.out("out", out, size_t(N) * C);
  s.out("mean", mean, size_t(N));
  s.out("rstd", rstd, size_t(N));
  s.be.layerNormBackward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  s.be.layerNormBackward(dinp, nullptr, nullptr, dout, inp, w, mean, rstd, N, C);
  s.out("dinp (twice)", dinp, size_t(N) * C);
  s.out("dweight", dw, size_t(C));
  s.out("dbias", db, size_t(C));
}

void pointwiseCase(Session& s, const Shape& sh) {
  std::mt19937 rng(kSeed + 3);
  const size_t rows = size_t(sh.N());
  const size_t n = rows * sh.C;
  float* x = s.up(rnd(rng, n, -4.0f, 4.0f));
  float* y = s.up(rnd(rng, n));
  float* out = s.alloc<float>(n);
  float* g = s.up(rnd(rng, n));  // accumulated into by every backward
  s.be.geluForward(out, x, n);
  s.out("gelu", out, n);
  s.be.geluBackward(g, y, x, n);
  s.out("gelu backward", g, n);
  // The fused bf16 GELU's fp32 gradient (its bf16 outputs are held to the unfused sequence's bits on each
  // backend by fusedGeluMatchesSequence; across backends a GELU rounded to bf16 may differ by an ulp).
  auto* kept = reinterpret_cast<ms::bfloat16*>(s.alloc<float>((n + 1) / 2));
  auto* gelu16 = reinterpret_cast<ms::bfloat16*>(s.alloc<float>((n + 1) / 2));
  s.be.geluForwardBf16(kept, gelu16, x, n);
  s.be.geluBackwardBf16(g, y, kept, n);
  s.out("gelu backward bf16", g, n);
  s.be.reluForward(out, x, n);
  s.out("relu", out, n);
  s.be.reluBackward(g, y, x, n);
  s.out("relu backward", g, n);
  s.be.tanhForward(out, x, n);
  s.out("tanh", out, n);
  s.be.tanhBackward(g, y, out, n);
  s.out("tanh backward", g, n);
  s.be.add(out, x, y, n);
  s.out("add", out, n);
  s.be.add(out, out, y, n);  // aliasing
  s.out("add aliased", out, n);
  s.be.accumulate(out, x, n);
  s.out("accumulate", out, n);
  s.be.scale(out, -0.37f, n);
  s.out("scale", out, n);
  float* row = s.up(rnd(rng, size_t(sh.C)));
  s.be.addRows(out, row, rows, sh.C);
  s.out("addRows", out, n);
}

void attentionCase(Session& s, const Shape& sh) {
  std::mt19937 rng(kSeed + 4);
  const int B = sh.B, T = sh.T, C = sh.C, H = sh.H;
  const size_t n = size_t(B) * T * C;
  float* qkv = s.up(rnd(rng, 3 * n, -2.0f, 2.0f));
  float* dout = s.up(rnd(rng, n));
  for (const bool causal : {true, false}) {
    const std::string v = causal ? "causal " : "full ";
    float* out = s.up(Vec(n, 5.0f));
    float* saved = s.up(Vec(s.be.attentionSavedFloats(B, T, C, H), 5.0f));
    float* scratch = s.up(Vec(s.be.attentionScratchFloats(B, T, C, H), 5.0f));
    float* dqkv = s.up(rnd(rng, 3 * n));
    s.be.attentionForward(out, saved, qkv, B, T, C, H, causal);
    s.be.attentionBackward(dqkv, scratch, dout, qkv, saved, out, B, T, C, H, causal);
    s.out(v + "out", out, n);
    s.out(v + "dqkv", dqkv, 3 * n);
  }
}

void embeddingCase(Session& s, const Shape& sh) {
  std::mt19937 rng(kSeed + 5);
  const int B = sh.B, T = sh.T, C = sh.C, V = sh.V, N = sh.N();
  const int maxT = T + 2;
  const Ints tok = tokens(rng, size_t(N), 0, V - 1);
  int32_t* t = s.up(tok);
  float* wte = s.up(rnd(rng, size_t(V) * C));
  float* wpe = s.up(rnd(rng, size_t(maxT) * C));
  float* dout = s.up(rnd(rng, size_t(N) * C));
  float* out = s.alloc<float>(size_t(N) * C);
  float* dwte = s.up(rnd(rng, size_t(V) * C));
  float* dwpe = s.up(rnd(rng, size_t(maxT) * C));
  s.be.embeddingForward(out, t, wte, wpe, B, T, C);
  s.out("forward", out, size_t(N) * C);
  s.be.embeddingBackward(dwte, dwpe, dout, t, B, T, C, V);
  s.be.embeddingBackward(nullptr, dwpe, dout, t, B, T, C, V);
  s.out("dwte", dwte, size_t(V) * C);
  s.out("dwpe (twice)", dwpe, size_t(maxT) * C);

  // Vocabulary-parallel: this rank holds rows [vs, vs + vc).
  const int vs = V / 3, vc = std::max(1, V / 2);
  float* wteLocal = s.up(rnd(rng, size_t(vc) * C));
  float* dwteLocal = s.up(rnd(rng, size_t(vc) * C));
  float* part = s.up(Vec(size_t(N) * C, 9.0f));  // rows out of range become 0
  s.be.embeddingRangeForward(part, t, wteLocal, vs, vc, N, C);
  s.out("range forward", part, size_t(N) * C);
  s.be.embeddingRangeBackward(dwteLocal, dout, t, vs, vc, N, C);
  s.out("range backward", dwteLocal, size_t(vc) * C);
  s.be.addPositions(part, wpe, B, T, C);
  s.out("addPositions", part, size_t(N) * C);
}

void lossCase(Session& s, const Shape& sh) {
  std::mt19937 rng(kSeed + 6);
  const int N = sh.N(), V = sh.V;
  const size_t nv = size_t(N) * V;
  const Vec logitsHost = rnd(rng, nv, -8.0f, 8.0f);
  Ints tg = tokens(rng, size_t(N), 0, V - 1);
  for (size_t i = 2; i < tg.size(); i += 3) tg[i] = -1;  // ignored rows
  float* logits = s.up(logitsHost);
  int32_t* targets = s.up(tg);
  float* losses = s.up(Vec(size_t(N), 3.0f));
  float* dlogits = s.up(Vec(nv, 3.0f));  // overwritten, ignored rows included
  s.be.softmaxCrossEntropy(losses, dlogits, logits, targets, N, V, 1.0f / float(N));
  s.out("losses", losses, size_t(N));
  s.out("dlogits", dlogits, nv);
  s.be.softmaxCrossEntropy(losses, nullptr, logits, targets, N, V, 0.5f);
  s.out("losses without dlogits", losses, size_t(N));
  int32_t* am = s.up(Ints(size_t(N), -7));
  s.be.argmaxRows(am, logits, N, V);
  s.out("argmaxRows", am, size_t(N));
  s.be.softmaxCrossEntropy(losses, logits, logits, targets, N, V, 2.0f);  // dlogits aliasing logits
  s.out("aliased losses", losses, size_t(N));
  s.out("aliased dlogits", logits, nv);
}

void vocabParallelLossCase(Session& s, const Shape& sh) {
  std::mt19937 rng(kSeed + 7);
  const int N = sh.N(), V = sh.V;
  const int vs = V / 3, vl = std::max(1, V / 2);  // this rank's columns [vs, vs + vl)
  const size_t nv = size_t(N) * vl;
  Ints tg = tokens(rng, size_t(N), 0, V - 1);  // some in this rank's range, some not
  for (size_t i = 1; i < tg.size(); i += 4) tg[i] = -1;
  int32_t* targets = s.up(tg);
  float* logits = s.up(rnd(rng, nv, -6.0f, 6.0f));
  float* mx = s.alloc<float>(size_t(N));
  float* sumExp = s.alloc<float>(size_t(N));
  float* targetLogit = s.up(Vec(size_t(N), 4.0f));
  float* losses = s.up(Vec(size_t(N), 4.0f));
  float* dlogits = s.up(Vec(nv, 4.0f));
  s.be.rowMax(mx, logits, N, vl);
  s.out("rowMax", mx, size_t(N));
  s.be.crossEntropyPartials(sumExp, targetLogit, logits, mx, targets, vs, N, vl);
  s.out("sumExp", sumExp, size_t(N));
  s.out("targetLogit", targetLogit, size_t(N));
  s.be.crossEntropyFinish(losses, dlogits, logits, mx, sumExp, targetLogit, targets, vs, N, vl, 0.25f);
  s.out("losses", losses, size_t(N));
  s.out("dlogits", dlogits, nv);
  s.be.crossEntropyFinish(losses, nullptr, logits, mx, sumExp, targetLogit, targets, vs, N, vl, 0.25f);
  s.out("losses without dlogits", losses, size_t(N));
  s.be.crossEntropyFinish(losses, logits, logits, mx, sumExp, targetLogit, targets, vs, N, vl, 0.5f);
  s.out("aliased dlogits", logits, nv);
}

void vitCase(Session& s, const Shape& sh) {
  std::mt19937 rng(kSeed + 8);
  const int B = sh.B, S = sh.S, P = sh.P, C = sh.C;
  const int G = S / P, NP = G * G;
  float* images = s.up(rnd(rng, size_t(B) * S * S));
  float* patches = s.alloc<float>(size_t(B) * NP * P * P);
  s.be.patchify(patches, images, B, S, P);
  s.out("patchify", patches, size_t(B) * NP * P * P);
  float* x = s.up(rnd(rng, size_t(B) * NP * C));
  float* cls = s.up(rnd(rng, size_t(C)));
  float* pos = s.up(rnd(rng, size_t(NP + 1) * C));
  for (const bool withCls : {true, false}) {
    const std::string v = withCls ? "cls " : "no cls ";
    const int T = NP + (withCls ? 1 : 0);
    const size_t n = size_t(B) * T * C;
    float* out = s.alloc<float>(n);
    s.be.tokensForward(out, x, withCls ? cls : nullptr, pos, B, NP, C, withCls);
    s.out(v + "tokensForward", out, n);
    float* dout = s.up(rnd(rng, n));
    float* dx = s.up(rnd(rng, size_t(B) * NP * C));
    float* dcls = s.up(rnd(rng, size_t(C)));
    float* dpos = s.up(rnd(rng, size_t(T) * C));
    s.be.tokensBackward(dx, dcls, dpos, dout, B, NP, C, withCls);
    s.be.tokensBackward(nullptr, nullptr, dpos, dout, B, NP, C, withCls);
    s.out(v + "dx", dx, size_t(B) * NP * C);
    s.out(v + "dcls", dcls, size_t(C));
    s.out(v + "dpos (twice)", dpos, size_t(T) * C);
    for (const bool useFirst : {true, false}) {
      const std::string u = v + (useFirst ? "first " : "mean ");
      float* pooled = s.up(Vec(size_t(B) * C, 6.0f));
      s.be.poolForward(pooled, out, B, T, C, useFirst);
      s.out(u + "poolForward", pooled, size_t(B) * C);
      float* pdout = s.up(rnd(rng, size_t(B) * C));
      float* dinp = s.up(rnd(rng, n));
      s.be.poolBackward(dinp, pdout, B, T, C, useFirst);
      s.out(u + "poolBackward", dinp, n);
    }
  }
}

void optimizerCase(Session& s, const Shape& sh) {
  std::mt19937 rng(kSeed + 9);
  const size_t n = size_t(sh.N()) * sh.C + 3;
  float* grads = s.up(rnd(rng, n));
  float* p = s.up(rnd(rng, n));
  float* m = s.up(rnd(rng, n, -0.1f, 0.1f));
  float* v = s.up(rnd(rng, n, 0.0f, 0.01f));
  for (int t = 1; t <= 2; ++t) s.be.adamwUpdate(p, grads, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f);
  s.out("adamw params", p, n);
  s.out("adamw m", m, n);
  s.out("adamw v", v, n);
  const Vec p0 = rnd(rng, n);
  for (const auto& [momentum, nesterov] :
       {std::pair{0.0f, false}, std::pair{0.9f, false}, std::pair{0.9f, true}}) {
    const std::string name = momentum == 0.0f ? "sgd plain " : nesterov ? "sgd nesterov " : "sgd momentum ";
    float* ps = s.up(p0);
    float* buf = momentum == 0.0f ? nullptr : s.alloc<float>(n);
    for (int step = 0; step < 2; ++step)
      s.be.sgdUpdate(ps, grads, buf, n, 0.1f, momentum, 0.01f, nesterov, step == 0, 0.5f);
    s.out(name + "params", ps, n);
    if (buf) s.out(name + "buf", buf, n);
  }
}

void sumSquaresCase(Session& s, const Shape& sh) {
  std::mt19937 rng(kSeed + 10);
  const size_t sizes[] = {size_t(sh.N()) * sh.C, 0, size_t(sh.C) + 5, 1};
  ms::TensorIn ptrs[4];
  for (int i = 0; i < 4; ++i) ptrs[i] = sizes[i] ? s.up(rnd(rng, sizes[i], -3.0f, 3.0f)) : nullptr;
  s.value("four buffers", s.be.sumSquares(ptrs, sizes, 4));
  s.value("again (not accumulated across calls)", s.be.sumSquares(ptrs, sizes, 4));
  s.value("one buffer", s.be.sumSquares(ptrs + 2, sizes + 2, 1));
  s.value("none", s.be.sumSquares(ptrs, sizes, 0));
}

// The Llama-family ops' shape: RMSNorm and SwiGLU over (B T, C); RoPE over H query heads and KV key/value
// heads of hs elements, positions from posStart.
struct LlamaShape {
  int B, T, C, H, KV, hs, posStart;
};

// RMSNorm forward and backward (twice onto non-zero gradients, the second without the weight gradient),
// SwiGLU forward (also into its gate: aliasing) and backward onto non-zero gradients, RoPE's pack into a
// buffer of 7s and its transpose (dq, dk, dv start at 7: overwritten). Output names start with `tag`.
void llamaOps(Session& s, const LlamaShape& l, const std::string& tag, unsigned seed) {
  std::mt19937 rng(seed);
  const int N = l.B * l.T, C = l.C;
  const size_t n = size_t(N) * C;
  float* inp = s.up(rnd(rng, n, -2.0f, 3.0f));
  float* w = s.up(rnd(rng, size_t(C), 0.5f, 1.5f));
  float* dout = s.up(rnd(rng, n));
  float* dinp = s.up(rnd(rng, n));
  float* dw = s.up(rnd(rng, size_t(C)));
  float* out = s.up(Vec(n, 7.0f));
  float* rstd = s.up(Vec(size_t(N), 7.0f));
  s.be.rmsNormForward(out, rstd, inp, w, N, C, 1e-5f);
  s.out(tag + "rmsNorm out", out, n);
  s.out(tag + "rmsNorm rstd", rstd, size_t(N));
  s.be.rmsNormBackward(dinp, dw, dout, inp, w, rstd, N, C);
  s.be.rmsNormBackward(dinp, nullptr, dout, inp, w, rstd, N, C);
  s.out(tag + "rmsNorm dinp (twice)", dinp, n);
  s.out(tag + "rmsNorm dweight", dw, size_t(C));

  float* gate = s.up(rnd(rng, n, -6.0f, 6.0f));
  float* up = s.up(rnd(rng, n, -2.0f, 2.0f));
  float* dgate = s.up(rnd(rng, n));
  float* dup = s.up(rnd(rng, n));
  float* sw = s.up(Vec(n, 7.0f));
  s.be.swigluForward(sw, gate, up, n);
  s.out(tag + "swiglu", sw, n);
  s.be.swigluBackward(dgate, dup, dout, gate, up, n);
  s.out(tag + "swiglu dgate", dgate, n);
  s.out(tag + "swiglu dup", dup, n);
  s.be.swigluForward(gate, gate, up, n);
  s.out(tag + "swiglu into its gate", gate, n);

  const size_t nq = size_t(N) * l.H * l.hs, nkv = size_t(N) * l.KV * l.hs;
  float* q = s.up(rnd(rng, nq));
  float* k = s.up(rnd(rng, nkv));
  float* v = s.up(rnd(rng, nkv));
  float* qkv = s.up(Vec(3 * nq, 7.0f));
  s.be.ropePackQkv(qkv, q, k, v, l.B, l.T, l.H, l.KV, l.hs, 10000.0f, l.posStart);
  s.out(tag + "rope qkv", qkv, 3 * nq);
  float* dqkv = s.up(rnd(rng, 3 * nq));
  float* dq = s.up(Vec(nq, 7.0f));
  float* dk = s.up(Vec(nkv, 7.0f));
  float* dv = s.up(Vec(nkv, 7.0f));
  s.be.ropeUnpackQkv(dq, dk, dv, dqkv, l.B, l.T, l.H, l.KV, l.hs, 10000.0f, l.posStart);
  s.out(tag + "rope dq", dq, nq);
  s.out(tag + "rope dk", dk, nkv);
  s.out(tag + "rope dv", dv, nkv);
}

// The Llama ops on the shape's rows and heads, head size 2 * max(1, C / 2H) (even): every query head its own
// key/value head (MHA) from position 0, one shared by all (MQA) from position 5, and groups of two (GQA) from
// position 3 where H is even.
void llamaCase(Session& s, const Shape& sh) {
  const int hs = 2 * std::max(1, sh.C / (2 * sh.H));
  llamaOps(s, {sh.B, sh.T, sh.C, sh.H, sh.H, hs, 0}, "MHA ", kSeed + 61);
  llamaOps(s, {sh.B, sh.T, sh.C, sh.H, 1, hs, 5}, "MQA ", kSeed + 62);
  if (sh.H % 2 == 0) llamaOps(s, {sh.B, sh.T, sh.C, sh.H, sh.H / 2, hs, 3}, "GQA ", kSeed + 63);
}

// Mixture-of-experts row movement as a top-2 layer routes it: N tokens' rows of C gathered into 2N expert
// rows (each token twice, so source rows repeat) with and without the gates, into a buffer of 7s; the
// experts' outputs added back onto non-zero values, one call a slot (distinct rows in each), with the gates
// and then without; the gates' gradients (rowDots into 7s: overwritten). The index list and the gates are
// backend memory, also passed from an offset into their buffers; calls with n = 0 change nothing. Output
// names start with `tag`.
void moeOps(Session& s, int N, int C, const std::string& tag, unsigned seed) {
  std::mt19937 rng(seed);
  const int n = 2 * N;
  Ints idx(size_t(n), 0);
  for (int k = 0; k < 2; ++k) {  // slot k: a permutation of the tokens
    const auto slot = idx.begin() + ptrdiff_t(k) * N;
    std::iota(slot, slot + N, 0);
    std::shuffle(slot, slot + N, rng);
  }
  int32_t* dIdx = s.up(idx);
  float* gates = s.up(rnd(rng, size_t(n), 0.0f, 1.0f));
  float* x = s.up(rnd(rng, size_t(N) * C));
  float* gathered = s.up(Vec(size_t(n) * C, 7.0f));
  s.be.gatherRows(gathered, x, dIdx, gates, n, C);
  s.out(tag + "gatherRows scaled", gathered, size_t(n) * C);
  s.be.gatherRows(gathered, x, dIdx, nullptr, n, C);
  s.out(tag + "gatherRows", gathered, size_t(n) * C);

  float* y = s.up(rnd(rng, size_t(n) * C));  // the experts' outputs, (2N, C)
  float* sum = s.up(rnd(rng, size_t(N) * C));
  for (int k = 0; k < 2; ++k)
    s.be.scatterAddRows(sum, y + size_t(k) * N * C, dIdx + size_t(k) * N, gates + size_t(k) * N, N, C);
  s.out(tag + "scatterAddRows scaled (two slots)", sum, size_t(N) * C);
  s.be.scatterAddRows(sum, y + size_t(N) * C, dIdx + N, nullptr, N, C);
  s.out(tag + "scatterAddRows (second slot again)", sum, size_t(N) * C);

  float* dout = s.up(rnd(rng, size_t(N) * C));
  float* dgates = s.up(Vec(size_t(n), 7.0f));
  s.be.rowDots(dgates, dout, dIdx, y, n, C);
  s.out(tag + "rowDots", dgates, size_t(n));

  s.be.gatherRows(gathered, x, dIdx, gates, 0, C);
  s.be.scatterAddRows(sum, y, dIdx, gates, 0, C);
  s.be.rowDots(dgates, dout, dIdx, y, 0, C);
  s.be.gatherRows(gathered, x, nullptr, nullptr, 0, C);
  s.be.scatterAddRows(sum, y, nullptr, nullptr, 0, C);
  s.be.rowDots(dgates, dout, nullptr, y, 0, C);
  s.out(tag + "gatherRows n = 0", gathered, size_t(n) * C);
  s.out(tag + "scatterAddRows n = 0", sum, size_t(N) * C);
  s.out(tag + "rowDots n = 0", dgates, size_t(n));
}

void moeCase(Session& s, const Shape& sh) {
  moeOps(s, sh.N(), sh.C, "", kSeed + 70);
}

using CaseFn = void (*)(Session&, const Shape&);
const struct {
  const char* name;
  CaseFn fn;
} kCases[] = {
    {"memory", memoryCase},
    {"linear", linearCase},
    {"layerNorm", layerNormCase},
    {"llama", llamaCase},
    {"moe", moeCase},
    {"pointwise", pointwiseCase},
    {"attention", attentionCase},
    {"embedding", embeddingCase},
    {"loss", lossCase},
    {"vocabParallelLoss", vocabParallelLossCase},
    {"vit", vitCase},
    {"optimizers", optimizerCase},
    {"sumSquares", sumSquaresCase},
};

void addCaseRows() {
  QTest::addColumn<int>("caseIndex");
  QTest::addColumn<int>("shapeIndex");
  for (int c = 0; c < int(std::size(kCases)); ++c)
    for (int sh = 0; sh < int(std::size(kShapes)); ++sh)
      QTest::addRow("%s %s", kCases[c].name, kShapes[sh].name) << c << sh;
}

std::vector<Output> runCase(ms::Backend& backend, int caseIndex, int shapeIndex) {
  Session s(backend);
  kCases[caseIndex].fn(s, kShapes[shapeIndex]);
  return std::move(s.outputs);
}

// ---- Comparisons -----------------------------------------------------------------------------------------

// "" when got and ref hold the same outputs bit for bit, else what differs.
QString bitDifference(const std::vector<Output>& got, const std::vector<Output>& ref) {
  if (got.size() != ref.size())
    return QStringLiteral("%1 outputs, expected %2").arg(got.size()).arg(ref.size());
  for (size_t k = 0; k < ref.size(); ++k) {
    const Output& g = got[k];
    const Output& r = ref[k];
    const QString name = QString::fromStdString(r.name);
    if (g.f.size() != r.f.size() || g.i.size() != r.i.size() || g.d.size() != r.d.size())
      return name + QStringLiteral(": sizes differ");
    for (size_t j = 0; j < r.f.size(); ++j)
      if (std::memcmp(&g.f[j], &r.f[j], sizeof(float)) != 0)
        return name + QStringLiteral(": index %1: %2, expected %3 (bitwise)")
                          .arg(j)
                          .arg(double(g.f[j]), 0, 'g', 9)
                          .arg(double(r.f[j]), 0, 'g', 9);
    if (g.i != r.i) return name + QStringLiteral(": integers differ");
    // memcmp on an empty vector's data() (null) is undefined behaviour (UBSan), even for 0 bytes.
    if (!r.d.empty() && std::memcmp(g.d.data(), r.d.data(), r.d.size() * sizeof(double)) != 0)
      return name +
             QStringLiteral(": %1, expected %2 (bitwise)").arg(g.d[0], 0, 'g', 17).arg(r.d[0], 0, 'g', 17);
  }
  return {};
}

// "" when every float is within rtol * |ref| + atol * max(1, max |ref| of that output), integers are equal
// and doubles agree to 1e-9 relative; else the first difference.
QString closeDifference(const std::vector<Output>& got, const std::vector<Output>& ref, double rtol,
                        double atol) {
  if (got.size() != ref.size())
    return QStringLiteral("%1 outputs, expected %2").arg(got.size()).arg(ref.size());
  for (size_t k = 0; k < ref.size(); ++k) {
    const Output& g = got[k];
    const Output& r = ref[k];
    const QString name = QString::fromStdString(r.name);
    if (g.f.size() != r.f.size() || g.i.size() != r.i.size() || g.d.size() != r.d.size())
      return name + QStringLiteral(": sizes differ");
    double scale = 1.0;
    for (float v : r.f) scale = std::max(scale, double(std::fabs(v)));
    for (size_t j = 0; j < r.f.size(); ++j) {
      const double err = std::fabs(double(g.f[j]) - double(r.f[j]));
      const double tol = rtol * std::fabs(double(r.f[j])) + atol * scale;
      if (!(err <= tol))
        return name + QStringLiteral(": index %1 of %2: got %3, expected %4 (|diff| %5 > %6)")
                          .arg(j)
                          .arg(r.f.size())
                          .arg(double(g.f[j]), 0, 'g', 9)
                          .arg(double(r.f[j]), 0, 'g', 9)
                          .arg(err, 0, 'g', 3)
                          .arg(tol, 0, 'g', 3);
    }
    for (size_t j = 0; j < r.i.size(); ++j)
      if (g.i[j] != r.i[j])
        return name + QStringLiteral(": index %1: got %2, expected %3").arg(j).arg(g.i[j]).arg(r.i[j]);
    for (size_t j = 0; j < r.d.size(); ++j)
      if (!(std::fabs(g.d[j] - r.d[j]) <= 1e-9 * std::fabs(r.d[j]) + 1e-12))
        return name + QStringLiteral(": got %1, expected %2").arg(g.d[j], 0, 'g', 17).arg(r.d[j], 0, 'g', 17);
  }
  return {};
}

// "" when fn throws DeviceFailure whose message contains `mention`, else what happened.
template <typename Fn>
QString throwsDeviceFailure(Fn fn, const char* mention) {
  try {
    fn();
  } catch (const ms::DeviceFailure& e) {
    if (std::string(e.what()).find(mention) == std::string::npos)
      return QStringLiteral("DeviceFailure \"%1\" does not mention \"%2\"").arg(e.what(), mention);
    return {};
  } catch (const std::exception& e) {
    return QStringLiteral("threw another exception: %1").arg(e.what());
  }
  return QStringLiteral("did not throw");
}

#define VERIFY_THROWS_DEVICE_FAILURE(expr, mention)                          \
  do {                                                                       \
    const QString why_ = throwsDeviceFailure([&] { expr; }, mention);        \
    QVERIFY2(why_.isEmpty(), qPrintable(QStringLiteral(#expr ": ") + why_)); \
  } while (false)

double hostSeconds(std::chrono::steady_clock::time_point epoch) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch).count();
}

// ---- GEMM precision
// ----------------------------------------------------------------------------------------

// x rounded to `drop` fewer mantissa bits (16: bf16, 13: TF32), to nearest with ties to even; infinities and
// NaN unchanged. Written here from the definition, independently of the backends' own rounding: the dropped
// bits are compared with half a unit of the last kept bit, and a round-up that overflows the mantissa
// carries into the exponent (up to infinity), as the IEEE bit layout makes it.
float roundHost(float x, int drop) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  if (((u >> 23) & 0xffu) == 0xffu) return x;
  const uint32_t unit = uint32_t(1) << drop;  // the last kept bit
  const uint32_t rest = u & (unit - 1);       // the dropped bits
  uint32_t r = u - rest;                      // the magnitude truncated
  if (rest > unit / 2 || (rest == unit / 2 && (r & unit) != 0)) r += unit;
  std::memcpy(&x, &r, sizeof x);
  return x;
}

Vec roundedHost(const Vec& v, int drop) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = roundHost(v[i], drop);
  return r;
}

int droppedBits(ms::GemmPrecision p) {
  return p == ms::GemmPrecision::Bf16 ? 16 : p == ms::GemmPrecision::Tf32 ? 13 : 0;
}

float bitsToFloat(uint32_t u) {
  float x = 0.0f;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

uint32_t floatToBits(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Kept bf16 inputs (TensorIn): in Bf16, toBf16 rounds like the host reference, and every op taking a
// TensorIn gives the same bits from a bf16 copy as from the fp32 tensor it was rounded from (the GEMMs round
// fp32 operands to the same values); attention's backward from a bf16 out matches it from the fp32 out
// rounded on the host. In Fp32 a bf16 input is refused. "" when all holds, else what failed.
QString keptBf16InputsHold(ms::Backend& be) {
  std::mt19937 rng(kSeed + 29);
  const int N = 37, C = 33, OC = 50;
  const Vec inp = rnd(rng, size_t(N) * C), w = rnd(rng, size_t(C) * OC), dout = rnd(rng, size_t(N) * OC);
  Session s(be);
  float* dInp = s.up(inp);
  float* dW = s.up(w);
  float* dDout = s.up(dout);
  auto* kept = reinterpret_cast<ms::bfloat16*>(s.alloc<float>((inp.size() + 1) / 2));
  be.setGemmPrecision(ms::GemmPrecision::Bf16);
  be.toBf16(kept, dInp, inp.size());
  std::vector<uint16_t> bits(inp.size());
  be.download(bits.data(), kept, bits.size() * sizeof(uint16_t));
  for (size_t i = 0; i < inp.size(); ++i)
    if (uint32_t(bits[i]) << 16 != floatToBits(roundHost(inp[i], 16)))
      return QStringLiteral("toBf16: index %1: 0x%2, expected the top half of 0x%3")
          .arg(i)
          .arg(bits[i], 0, 16)
          .arg(floatToBits(roundHost(inp[i], 16)), 0, 16);
  // Each op once from the fp32 input, once from the kept one; outputs start from zero.
  auto runLinear = [&](ms::TensorIn x, bool transposed) {
    Session r(be);
    float* out = r.alloc<float>(size_t(N) * OC);
    float* dinp = r.alloc<float>(size_t(N) * C);
    float* dw = r.alloc<float>(size_t(C) * OC);
    if (transposed) {  // w read as (OC, C)
      be.linearForwardT(out, x, dW, nullptr, N, C, OC);
      be.linearBackwardT(dinp, dw, nullptr, dDout, x, dW, N, C, OC);
    } else {
      be.linearForward(out, x, dW, nullptr, N, C, OC);
      be.linearBackward(dinp, dw, nullptr, dDout, x, dW, N, C, OC);
    }
    r.out("forward", out, size_t(N) * OC);
    r.out("dinp", dinp, size_t(N) * C);
    r.out("dweight", dw, size_t(C) * OC);
    return r.outputs;
  };
  for (const bool transposed : {false, true}) {
    const QString why = bitDifference(runLinear(kept, transposed), runLinear(dInp, transposed));
    if (!why.isEmpty()) return QStringLiteral("linear%1: ").arg(transposed ? "T" : "") + why;
  }
  // Attention: B 2, T 5, C 8, H 2, causal.
  const int B = 2, T = 5, AC = 8, H = 2;
  const Vec qkv = rnd(rng, size_t(B) * T * 3 * AC), adout = rnd(rng, size_t(B) * T * AC);
  float* dQkv = s.up(qkv);
  float* dAdout = s.up(adout);
  float* saved = s.alloc<float>(be.attentionSavedFloats(B, T, AC, H));
  float* out = s.alloc<float>(size_t(B) * T * AC);
  be.attentionForward(out, saved, dQkv, B, T, AC, H, true);
  Vec out32(size_t(B) * T * AC);
  be.download(out32.data(), out, out32.size() * sizeof(float));
  float* outRounded = s.up(roundedHost(out32, 16));
  auto* outKept = reinterpret_cast<ms::bfloat16*>(s.alloc<float>((out32.size() + 1) / 2));
  be.toBf16(outKept, out, out32.size());
  auto runAttention = [&](ms::TensorIn o) {
    Session r(be);
    float* dqkv = r.alloc<float>(qkv.size());
    float* scratch = r.alloc<float>(be.attentionScratchFloats(B, T, AC, H));
    be.attentionBackward(dqkv, scratch, dAdout, dQkv, saved, o, B, T, AC, H, true);
    r.out("dqkv", dqkv, qkv.size());
    return r.outputs;
  };
  const QString why = bitDifference(runAttention(outKept), runAttention(outRounded));
  if (!why.isEmpty()) return QStringLiteral("attention: ") + why;
  // Fp32 refuses a bf16 input, naming the op.
  be.setGemmPrecision(ms::GemmPrecision::Fp32);
  Session r(be);
  float* o = r.alloc<float>(size_t(N) * OC);
  QString refused = throwsDeviceFailure([&] { be.linearForward(o, kept, dW, nullptr, N, C, OC); }, "bf16");
  if (refused.isEmpty())
    refused = throwsDeviceFailure([&] { be.linearBackward(nullptr, o, nullptr, dDout, kept, dW, N, C, OC); },
                                  "linearBackward");
  if (refused.isEmpty()) {
    float* dqkv = r.alloc<float>(qkv.size());
    float* scratch = r.alloc<float>(be.attentionScratchFloats(B, T, AC, H));
    refused = throwsDeviceFailure(
        [&] { be.attentionBackward(dqkv, scratch, dAdout, dQkv, saved, outKept, B, T, AC, H, true); },
        "attentionBackward");
  }
  return refused.isEmpty() ? QString() : QStringLiteral("fp32 with a bf16 input: ") + refused;
}

// The fused bf16 GELU ops give the bits of the sequences they stand for (Backend::geluForwardBf16,
// geluBackwardBf16), for sizes on both sides of the CPU's 1M-element staging chunk and inputs out to where
// exp overflows. "" when all holds, else what differs.
QString fusedGeluMatchesSequence(ms::Backend& be) {
  std::mt19937 rng(kSeed + 31);
  for (const size_t n : {size_t(1), size_t(37), size_t(3) * 1000 * 1000 + 3}) {
    Vec x = rnd(rng, n, -8.0f, 8.0f);
    const float specials[] = {-100.0f, -30.0f, -10.0f, 0.0f, 1e-30f, 10.0f, 30.0f, 100.0f};
    for (size_t i = 0; i < std::size(specials) && i < n; ++i) x[i] = specials[i];
    const Vec dout = rnd(rng, n), g0 = rnd(rng, n);
    Session s(be);
    float* dX = s.up(x);
    float* dDout = s.up(dout);
    auto bf16Buffer = [&] { return reinterpret_cast<ms::bfloat16*>(s.alloc<float>((n + 1) / 2)); };
    ms::bfloat16 *kept1 = bf16Buffer(), *out1 = bf16Buffer(), *kept2 = bf16Buffer(), *out2 = bf16Buffer();
    float* g1 = s.up(g0);
    float* g2 = s.up(g0);
    float* w = s.alloc<float>(n);
    float* y = s.alloc<float>(n);
    be.geluForwardBf16(kept1, out1, dX, n);
    be.geluBackwardBf16(g1, dDout, kept1, n);
    be.toBf16(kept2, dX, n);
    be.fromBf16(w, kept2, n);
    be.geluForward(y, w, n);
    be.toBf16(out2, y, n);
    be.geluBackward(g2, dDout, w, n);
    auto bits = [&](const ms::bfloat16* p) {
      std::vector<uint16_t> h(n);
      be.download(h.data(), p, n * sizeof(uint16_t));
      return h;
    };
    if (bits(kept1) != bits(kept2)) return QStringLiteral("n %1: the kept input differs").arg(n);
    const std::vector<uint16_t> a = bits(out1), b = bits(out2);
    for (size_t i = 0; i < n; ++i)
      if (a[i] != b[i])
        return QStringLiteral("n %1: gelu of x = %2 (index %3): 0x%4, the sequence gives 0x%5")
            .arg(n)
            .arg(double(x[i]))
            .arg(i)
            .arg(a[i], 0, 16)
            .arg(b[i], 0, 16);
    Vec h1(n), h2(n);
    be.download(h1.data(), g1, n * sizeof(float));
    be.download(h2.data(), g2, n * sizeof(float));
    for (size_t i = 0; i < n; ++i)
      if (floatToBits(h1[i]) != floatToBits(h2[i]))
        return QStringLiteral("n %1: gelu backward at x = %2 (index %3): %4, the sequence gives %5")
            .arg(n)
            .arg(double(x[i]))
            .arg(i)
            .arg(double(h1[i]), 0, 'g', 9)
            .arg(double(h2[i]), 0, 'g', 9);
  }
  return QString();
}

// A parameter's bf16 working value as the weight (TensorIn, runtime/parameters.h weight()): in Bf16 every
// linear op gives the same bits from toBf16(w) as from w itself (the backend rounds an fp32 weight to the
// same values), in both layouts, with an fp32 or a kept bf16 input, with a bias, and for input-only and
// weight-only backward calls (zero-bubble schedules split them). In Fp32 and Tf32 a bf16 weight is refused
// naming the op, also by a call that would not read it (no dinp). "" when all holds, else what failed.
QString bf16WeightsHold(ms::Backend& be) {
  std::mt19937 rng(kSeed + 31);
  const int N = 29, C = 35, OC = 18;
  const Vec inp = rnd(rng, size_t(N) * C), w = rnd(rng, size_t(C) * OC), bias = rnd(rng, size_t(OC)),
            dout = rnd(rng, size_t(N) * OC), dinp0 = rnd(rng, size_t(N) * C), dw0 = rnd(rng, size_t(C) * OC);
  Session s(be);
  float* dInp = s.up(inp);
  float* dW = s.up(w);
  float* dBias = s.up(bias);
  float* dDout = s.up(dout);
  auto* keptW = reinterpret_cast<ms::bfloat16*>(s.alloc<float>((w.size() + 1) / 2));
  auto* keptInp = reinterpret_cast<ms::bfloat16*>(s.alloc<float>((inp.size() + 1) / 2));
  be.setGemmPrecision(ms::GemmPrecision::Bf16);
  be.toBf16(keptW, dW, w.size());
  be.toBf16(keptInp, dInp, inp.size());
  // Forward, a full backward, then an input-only and a weight-only backward accumulating on top.
  auto run = [&](ms::TensorIn x, ms::TensorIn weight, bool transposed) {
    Session r(be);
    float* out = r.alloc<float>(size_t(N) * OC);
    float* dinp = r.up(dinp0);
    float* dw = r.up(dw0);
    float* db = r.alloc<float>(size_t(OC));
    auto forward = transposed ? &ms::Backend::linearForwardT : &ms::Backend::linearForward;
    auto backward = transposed ? &ms::Backend::linearBackwardT : &ms::Backend::linearBackward;
    (be.*forward)(out, x, weight, dBias, N, C, OC);
    (be.*backward)(dinp, dw, db, dDout, x, weight, N, C, OC);
    (be.*backward)(dinp, nullptr, nullptr, dDout, x, weight, N, C, OC);
    (be.*backward)(nullptr, dw, nullptr, dDout, x, weight, N, C, OC);
    r.out("forward", out, size_t(N) * OC);
    r.out("dinp", dinp, size_t(N) * C);
    r.out("dweight", dw, size_t(C) * OC);
    r.out("dbias", db, size_t(OC));
    return r.outputs;
  };
  for (const bool transposed : {false, true})
    for (const bool keptInput : {false, true}) {
      const ms::TensorIn x = keptInput ? ms::TensorIn(keptInp) : ms::TensorIn(dInp);
      const QString why = bitDifference(run(x, keptW, transposed), run(x, dW, transposed));
      if (!why.isEmpty())
        return QStringLiteral("linear%1 with a %2 input: ")
                   .arg(transposed ? "T" : "", keptInput ? "bf16" : "fp32") +
               why;
    }
  // Another precision refuses a bf16 weight, naming the op, whether or not the call reads the weight.
  for (const ms::GemmPrecision p : {ms::GemmPrecision::Fp32, ms::GemmPrecision::Tf32}) {
    be.setGemmPrecision(p);
    Session r(be);
    float* out = r.alloc<float>(size_t(N) * OC);
    float* dw = r.alloc<float>(size_t(C) * OC);
    float* dinp = r.alloc<float>(size_t(N) * C);
    const struct {
      const char* op;
      std::function<void()> call;
    } calls[] = {
        {"linearForward", [&] { be.linearForward(out, dInp, keptW, nullptr, N, C, OC); }},
        {"linearForwardT", [&] { be.linearForwardT(out, dInp, keptW, nullptr, N, C, OC); }},
        {"linearBackward", [&] { be.linearBackward(dinp, nullptr, nullptr, dDout, dInp, keptW, N, C, OC); }},
        {"linearBackwardT", [&] { be.linearBackwardT(nullptr, dw, nullptr, dDout, dInp, keptW, N, C, OC); }},
    };
    for (const auto& c : calls) {
      QString refused = throwsDeviceFailure(c.call, c.op);
      if (refused.isEmpty()) refused = throwsDeviceFailure(c.call, "weight");
      if (!refused.isEmpty())
        return QStringLiteral("%1 with a bf16 weight in %2: ").arg(c.op, ms::toString(p)) + refused;
    }
  }
  be.setGemmPrecision(ms::GemmPrecision::Fp32);
  return {};
}

// Mixed precision's working parameters (runtime/parameters.h) as every op that reads a parameter gets them:
// a bf16 bias, LayerNorm weight, row, embedding table, position table or class token gives the same bits as
// the fp32 tensor holding the same (widened) values, in GemmPrecision::Bf16; another precision refuses a
// bf16 parameter, naming the op.
QString bf16ParametersHold(ms::Backend& be) {
  std::mt19937 rng(kSeed + 37);
  const int B = 2, T = 6, C = 24, V = 17, OC = 10, N = B * T, NP = 5;
  Session s(be);
  // One table per parameter: fp32 values, their bf16 rounding, and the fp32 tensor of the rounded values.
  struct Param {
    float* wide = nullptr;
    ms::bfloat16* half = nullptr;
  };
  auto param = [&](size_t n) {
    const Vec host = rnd(rng, n);
    float* f = s.up(host);
    Param p;
    p.half = reinterpret_cast<ms::bfloat16*>(s.alloc<float>((n + 1) / 2));
    be.setGemmPrecision(ms::GemmPrecision::Bf16);
    be.toBf16(p.half, f, n);
    std::vector<uint16_t> bits(n);
    be.download(bits.data(), p.half, n * sizeof(uint16_t));
    Vec wide(n);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t u = uint32_t(bits[i]) << 16;
      std::memcpy(&wide[i], &u, 4);
    }
    p.wide = s.up(wide);
    return p;
  };
  const Param bias = param(OC), lnw = param(C), lnb = param(C), row = param(C), wte = param(size_t(V) * C),
              wpe = param(size_t(T) * C), cls = param(C), pos = param(size_t(NP + 1) * C);
  const Vec inp = rnd(rng, size_t(N) * C), w = rnd(rng, size_t(C) * OC), dout = rnd(rng, size_t(N) * C),
            patches = rnd(rng, size_t(B) * NP * C);
  Ints tokens(N);
  for (int i = 0; i < N; ++i) tokens[i] = int32_t(rng() % V);
  float* dInp = s.up(inp);
  float* dW = s.up(w);
  float* dDout = s.up(dout);
  float* dPatches = s.up(patches);
  int32_t* dTokens = s.up(tokens);
  auto run = [&](bool half) {
    auto pick = [&](const Param& p) { return half ? ms::TensorIn(p.half) : ms::TensorIn(p.wide); };
    Session r(be);
    float* lin = r.alloc<float>(size_t(N) * OC);
    float* linT = r.alloc<float>(size_t(N) * OC);
    float* ln = r.alloc<float>(size_t(N) * C);
    float* mean = r.alloc<float>(size_t(N));
    float* rstd = r.alloc<float>(size_t(N));
    float* dln = r.alloc<float>(size_t(N) * C);
    float* dlnw = r.alloc<float>(size_t(C));
    float* dlnb = r.alloc<float>(size_t(C));
    float* rows = r.up(inp);
    float* emb = r.alloc<float>(size_t(N) * C);
    float* range = r.alloc<float>(size_t(N) * C);
    float* positions = r.up(inp);
    float* tok = r.alloc<float>(size_t(B) * (NP + 1) * C);
    be.linearForward(lin, dInp, dW, pick(bias), N, C, OC);
    be.linearForwardT(linT, dInp, dW, pick(bias), N, C, OC);
    be.layerNormForward(ln, mean, rstd, dInp, pick(lnw), pick(lnb), N, C, 1e-5f);
    be.layerNormBackward(dln, dlnw, dlnb, dDout, dInp, pick(lnw), mean, rstd, N, C);
    be.addRows(rows, pick(row), size_t(N), C);
    be.embeddingForward(emb, dTokens, pick(wte), pick(wpe), B, T, C);
    be.embeddingRangeForward(range, dTokens, pick(wte), 3, V - 5, N, C);
    be.addPositions(positions, pick(wpe), B, T, C);
    be.tokensForward(tok, dPatches, pick(cls), pick(pos), B, NP, C, true);
    r.out("linearForward", lin, size_t(N) * OC);
    r.out("linearForwardT", linT, size_t(N) * OC);
    r.out("layerNormForward", ln, size_t(N) * C);
    r.out("layerNormBackward dinp", dln, size_t(N) * C);
    r.out("layerNormBackward dweight", dlnw, size_t(C));
    r.out("addRows", rows, size_t(N) * C);
    r.out("embeddingForward", emb, size_t(N) * C);
    r.out("embeddingRangeForward", range, size_t(N) * C);
    r.out("addPositions", positions, size_t(N) * C);
    r.out("tokensForward", tok, size_t(B) * (NP + 1) * C);
    return r.outputs;
  };
  be.setGemmPrecision(ms::GemmPrecision::Bf16);
  const QString why = bitDifference(run(true), run(false));
  if (!why.isEmpty()) return QStringLiteral("bf16 parameters: ") + why;
  be.setGemmPrecision(ms::GemmPrecision::Fp32);
  Session r(be);
  float* ln = r.alloc<float>(size_t(N) * C);
  float* mean = r.alloc<float>(size_t(N));
  float* rstd = r.alloc<float>(size_t(N));
  float* emb = r.alloc<float>(size_t(N) * C);
  const struct {
    const char* op;
    std::function<void()> call;
  } calls[] = {
      {"layerNormForward",
       [&] { be.layerNormForward(ln, mean, rstd, dInp, lnw.half, lnb.wide, N, C, 1e-5f); }},
      {"embeddingForward", [&] { be.embeddingForward(emb, dTokens, wte.half, wpe.wide, B, T, C); }},
      {"embeddingRangeForward", [&] { be.embeddingRangeForward(emb, dTokens, wte.half, 0, V, N, C); }},
      {"addPositions", [&] { be.addPositions(emb, wpe.half, B, T, C); }},
      {"addRows", [&] { be.addRows(emb, row.half, size_t(N), C); }},
  };
  for (const auto& c : calls) {
    const QString refused = throwsDeviceFailure(c.call, c.op);
    if (!refused.isEmpty()) return QStringLiteral("%1 with a bf16 parameter in fp32: ").arg(c.op) + refused;
  }
  return {};
}

// bf16 GRADIENTS ("grad_precision": "bf16", kernels/backend.h GradOut): every op that accumulates into a
// parameter gradient, given a bf16 one, leaves exactly toBf16(g + contribution), where the same op given the
// widened fp32 gradient leaves g + contribution (one rounding per op); the optimizer and the norm read bf16
// gradients as their widened values. In fp32 a bf16 gradient is refused.
QString bf16GradientsHold(ms::Backend& be) {
  std::mt19937 rng(kSeed + 41);
  const int B = 2, T = 6, C = 24, V = 17, OC = 10, N = B * T, NP = 5;
  be.setGemmPrecision(ms::GemmPrecision::Bf16);
  Session s(be);
  const Vec inp = rnd(rng, size_t(N) * C), w = rnd(rng, size_t(C) * OC), dout = rnd(rng, size_t(N) * OC),
            dlnOut = rnd(rng, size_t(N) * C), demb = rnd(rng, size_t(N) * C),
            dtok = rnd(rng, size_t(B) * (NP + 1) * C);
  Ints tokens(N);
  for (int i = 0; i < N; ++i) tokens[i] = int32_t(rng() % V);
  float* dInp = s.up(inp);
  float* dW = s.up(w);
  float* dDout = s.up(dout);
  float* dLnOut = s.up(dlnOut);
  float* dEmb = s.up(demb);
  float* dTok = s.up(dtok);
  int32_t* dTokens = s.up(tokens);
  float* mean = s.alloc<float>(size_t(N));
  float* rstd = s.alloc<float>(size_t(N));
  float* ln = s.alloc<float>(size_t(N) * C);
  const Vec lnw = rnd(rng, size_t(C));
  float* dLnw = s.up(lnw);
  be.layerNormForward(ln, mean, rstd, dInp, dLnw, dLnw, N, C, 1e-5f);
  // The gradients' sizes, in the order the ops below take them.
  const size_t sizes[] = {size_t(C) * OC,    size_t(OC), size_t(C) * OC,    size_t(OC),
                          size_t(C),         size_t(C),  size_t(V) * C,     size_t(T) * C,
                          size_t(V - 5) * C, size_t(C),  size_t(NP + 1) * C};
  constexpr int kGrads = 11;
  // Initial gradients: random values already in bf16 (the first accumulation starts from them).
  std::vector<Vec> init(kGrads);
  for (int k = 0; k < kGrads; ++k) {
    init[k] = rnd(rng, sizes[k]);
    for (float& x : init[k]) {
      uint32_t u;
      std::memcpy(&u, &x, 4);
      u &= 0xffff0000u;
      std::memcpy(&x, &u, 4);
    }
  }
  // The bf16 bits of values already in bf16.
  auto bitsOf = [](const Vec& v) {
    std::vector<uint16_t> bits(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, &v[i], 4);
      bits[i] = uint16_t(u >> 16);
    }
    return bits;
  };
  auto run = [&](bool half) {
    Session r(be);
    std::vector<ms::GradOut> g(kGrads);
    std::vector<void*> raw(kGrads);
    for (int k = 0; k < kGrads; ++k) {
      if (half) {
        auto* p = reinterpret_cast<ms::bfloat16*>(r.up(bitsOf(init[k])));
        g[k] = p;
        raw[k] = p;
      } else {
        float* p = r.up(init[k]);
        g[k] = p;
        raw[k] = p;
      }
    }
    float* dx = r.alloc<float>(size_t(N) * C);
    be.linearBackward(nullptr, g[0], g[1], dDout, dInp, dW, N, C, OC);
    be.linearBackwardT(nullptr, g[2], g[3], dDout, dInp, dW, N, C, OC);
    be.layerNormBackward(dx, g[4], g[5], dLnOut, dInp, dLnw, mean, rstd, N, C);
    be.embeddingBackward(g[6], g[7], dEmb, dTokens, B, T, C, V);
    be.embeddingRangeBackward(g[8], dEmb, dTokens, 3, V - 5, N, C);
    be.tokensBackward(r.alloc<float>(size_t(B) * NP * C), g[9], g[10], dTok, B, NP, C, true);
    // Every gradient as bf16 bits: the bf16 run's as kept, the fp32 run's rounded once at the end.
    for (int k = 0; k < kGrads; ++k) {
      std::vector<uint16_t> bits(sizes[k]);
      if (half) {
        be.download(bits.data(), raw[k], sizes[k] * sizeof(uint16_t));
      } else {
        auto* rounded = reinterpret_cast<ms::bfloat16*>(r.alloc<uint16_t>(sizes[k]));
        be.toBf16(rounded, static_cast<float*>(raw[k]), sizes[k]);
        be.download(bits.data(), rounded, sizes[k] * sizeof(uint16_t));
      }
      Output o{"gradient " + std::to_string(k), Vec(sizes[k]), {}, {}};
      for (size_t i = 0; i < sizes[k]; ++i) {
        const uint32_t u = uint32_t(bits[i]) << 16;
        std::memcpy(&o.f[i], &u, 4);
      }
      r.outputs.push_back(std::move(o));
    }
    // The norm and an AdamW step read the (bf16 or widened) initial gradients of gradient 6 (the table).
    ms::TensorIn read = half ? ms::TensorIn(reinterpret_cast<const ms::bfloat16*>(r.up(bitsOf(init[6]))))
                             : ms::TensorIn(r.up(init[6]));
    const size_t n = sizes[6];
    r.value("sumSquares", be.sumSquares(&read, &n, 1));
    std::mt19937 prng(kSeed + 43);
    float* params = r.up(rnd(prng, n));
    float* m = r.alloc<float>(n);
    float* v = r.alloc<float>(n);
    ms::OptimizerSegment seg;
    seg.params = params;
    seg.grads = read;
    seg.m = m;
    seg.v = v;
    seg.n = n;
    seg.weightDecay = 0.1f;
    be.adamwUpdateSegments(&seg, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 1, 0.5f);
    r.out("adamw params", params, n);
    r.out("adamw v", v, n);
    return r.outputs;
  };
  const auto half = run(true), wide = run(false);
  const QString why = bitDifference(half, wide);
  if (!why.isEmpty()) return QStringLiteral("bf16 gradients: ") + why;
  // The accumulation did happen (the rounded sums are not the initial values).
  if (half[0].f == init[0]) return QStringLiteral("bf16 gradients: linearBackward left dweight unchanged");
  be.setGemmPrecision(ms::GemmPrecision::Fp32);
  auto* bad = reinterpret_cast<ms::bfloat16*>(s.alloc<uint16_t>(size_t(C) * OC));
  const QString refused = throwsDeviceFailure(
      [&] { be.linearBackward(nullptr, bad, nullptr, dDout, dInp, dW, N, C, OC); }, "linearBackward");
  if (!refused.isEmpty()) return QStringLiteral("a bf16 gradient in fp32: ") + refused;
  return {};
}

// The inputs of the GEMM-precision linear case (fixed seed): the GEMM operands inp, w, dout and the rest.
struct LinearData {
  Vec inp, w, bias, dout, dinp0, dw0, db0;
};

LinearData linearData(const Shape& sh) {
  std::mt19937 rng(kSeed + 11);
  const size_t N = size_t(sh.N()), C = size_t(sh.C), OC = size_t(sh.OC);
  LinearData d;
  d.inp = rnd(rng, N * C);
  d.w = rnd(rng, C * OC);  // (C, OC), read as (OC, C) by the T variants
  d.bias = rnd(rng, OC);
  d.dout = rnd(rng, N * OC);
  d.dinp0 = rnd(rng, N * C);  // non-zero: backward accumulates
  d.dw0 = rnd(rng, C * OC);
  d.db0 = rnd(rng, OC);
  return d;
}

// forward, dinp, dweight and dbias of one linear op (the T variants when transposed) on d. Without biasDout
// backward is one call; with it, one call for dinp and dweight from d.dout and a second for dbias alone from
// *biasDout (the reference: the bias gradient is no GEMM, so it reads the unrounded dout).
std::vector<Output> runLinear(ms::Backend& be, const Shape& sh, bool transposed, const LinearData& d,
                              const Vec* biasDout) {
  Session s(be);
  const int N = sh.N(), C = sh.C, OC = sh.OC;
  float* inp = s.up(d.inp);
  float* w = s.up(d.w);
  float* bias = s.up(d.bias);
  float* dout = s.up(d.dout);
  float* dinp = s.up(d.dinp0);
  float* dw = s.up(d.dw0);
  float* db = s.up(d.db0);
  float* out = s.up(Vec(size_t(N) * OC, 7.0f));
  auto forward = transposed ? &ms::Backend::linearForwardT : &ms::Backend::linearForward;
  auto backward = transposed ? &ms::Backend::linearBackwardT : &ms::Backend::linearBackward;
  (be.*forward)(out, inp, w, bias, N, C, OC);
  s.out("forward", out, size_t(N) * OC);
  if (!biasDout) {
    (be.*backward)(dinp, dw, db, dout, inp, w, N, C, OC);
  } else {
    (be.*backward)(dinp, dw, nullptr, dout, inp, w, N, C, OC);
    (be.*backward)(nullptr, nullptr, db, s.up(*biasDout), inp, w, N, C, OC);
  }
  s.out("dinp", dinp, size_t(N) * C);
  s.out("dweight", dw, size_t(C) * OC);
  s.out("dbias", db, size_t(OC));
  return std::move(s.outputs);
}

// The inputs of the GEMM-precision attention case: the GEMM operands qkv and dout, and the gradient's start.
struct AttentionData {
  Vec qkv, dout, dqkv0;
};

AttentionData attentionData(const Shape& sh) {
  std::mt19937 rng(kSeed + 12);
  const size_t n = size_t(sh.B) * sh.T * sh.C;
  AttentionData d;
  d.qkv = rnd(rng, 3 * n, -2.0f, 2.0f);
  d.dout = rnd(rng, n);
  d.dqkv0 = rnd(rng, 3 * n);
  return d;
}

// out, the saved state (att: the CPU's probabilities) when withSaved, and dqkv of attention forward and
// backward on d.
std::vector<Output> runAttention(ms::Backend& be, const Shape& sh, bool causal, const AttentionData& d,
                                 bool withSaved = true) {
  Session s(be);
  const int B = sh.B, T = sh.T, C = sh.C, H = sh.H;
  const size_t n = size_t(B) * T * C;
  const size_t savedFloats = be.attentionSavedFloats(B, T, C, H);
  float* qkv = s.up(d.qkv);
  float* dout = s.up(d.dout);
  float* dqkv = s.up(d.dqkv0);
  float* out = s.up(Vec(n, 5.0f));
  float* saved = s.up(Vec(savedFloats, 5.0f));
  float* scratch = s.up(Vec(be.attentionScratchFloats(B, T, C, H), 5.0f));
  be.attentionForward(out, saved, qkv, B, T, C, H, causal);
  be.attentionBackward(dqkv, scratch, dout, qkv, saved, out, B, T, C, H, causal);
  s.out("out", out, n);
  if (withSaved) s.out("att", saved, savedFloats);
  s.out("dqkv", dqkv, 3 * n);
  return std::move(s.outputs);
}

// The GEMM-precision cases: 0 linear, 1 linear T, 2 causal attention, 3 bidirectional attention.
constexpr const char* kPrecisionOps[] = {"linear", "linearT", "causal attention", "full attention"};

std::vector<Output> runPrecisionOp(ms::Backend& be, int op, const Shape& sh, const LinearData& ld,
                                   const AttentionData& ad, const Vec* biasDout = nullptr) {
  return op < 2 ? runLinear(be, sh, op == 1, ld, biasDout) : runAttention(be, sh, op == 2, ad);
}

const Output* findOutput(const std::vector<Output>& outputs, const std::string& name) {
  for (const Output& o : outputs)
    if (o.name == name) return &o;
  return nullptr;
}

// max over the float outputs of max_j |got - ref| / max(1, max_j |ref|).
double maxScaledDifference(const std::vector<Output>& got, const std::vector<Output>& ref) {
  double worst = 0.0;
  for (size_t k = 0; k < ref.size() && k < got.size(); ++k) {
    double scale = 1.0;
    for (float v : ref[k].f) scale = std::max(scale, double(std::fabs(v)));
    for (size_t j = 0; j < ref[k].f.size() && j < got[k].f.size(); ++j)
      worst = std::max(worst, std::fabs(double(got[k].f[j]) - double(ref[k].f[j])) / scale);
  }
  return worst;
}

// ---- Convolution and batch norm
// ----------------------------------------------------------------------------

// A convolution to run: its shape and whether it has a bias.
struct ConvCase {
  const char* name;
  ms::Conv2dShape s;
  bool bias;
};

// Both suites' shapes (kept small: the CPU suite runs each twice and the GPU suite against the CPU): 1x1,
// 3x3 with padding at strides 1 and 2, the 7x7 stride-2 ResNet stem, odd and non-square sizes, a kernel as
// large as the input (one output position), batch 1 and batch > 1, with and without a bias.
const ms::Conv2dShape kConvShapes[] = {
    // B, C, H, W, OC, KH, KW, stride, pad
    {2, 3, 5, 4, 4, 1, 1, 1, 0},   {2, 5, 7, 9, 3, 1, 1, 2, 0},   {1, 1, 4, 4, 1, 3, 3, 1, 1},
    {2, 3, 7, 6, 5, 3, 3, 1, 1},   {3, 4, 9, 8, 6, 3, 3, 2, 1},   {2, 8, 15, 13, 16, 3, 3, 2, 1},
    {2, 3, 28, 28, 8, 7, 7, 2, 3}, {1, 2, 11, 13, 3, 5, 3, 3, 0}, {2, 4, 5, 5, 6, 5, 5, 1, 0},
};

std::string convName(const ms::Conv2dShape& s) {
  return "B" + std::to_string(s.B) + " C" + std::to_string(s.C) + " " + std::to_string(s.H) + "x" +
         std::to_string(s.W) + " OC" + std::to_string(s.OC) + " k" + std::to_string(s.KH) + "x" +
         std::to_string(s.KW) + " s" + std::to_string(s.stride) + " p" + std::to_string(s.pad);
}

void addConvRows(const std::vector<ms::Conv2dShape>& shapes) {
  QTest::addColumn<int>("B");
  QTest::addColumn<int>("C");
  QTest::addColumn<int>("H");
  QTest::addColumn<int>("W");
  QTest::addColumn<int>("OC");
  QTest::addColumn<int>("KH");
  QTest::addColumn<int>("KW");
  QTest::addColumn<int>("stride");
  QTest::addColumn<int>("pad");
  QTest::addColumn<bool>("bias");
  for (const ms::Conv2dShape& s : shapes)
    for (const bool bias : {true, false})
      QTest::addRow("%s%s", convName(s).c_str(), bias ? " bias" : "")
          << s.B << s.C << s.H << s.W << s.OC << s.KH << s.KW << s.stride << s.pad << bias;
}

ConvCase fetchConvCase() {
  QFETCH(int, B);
  QFETCH(int, C);
  QFETCH(int, H);
  QFETCH(int, W);
  QFETCH(int, OC);
  QFETCH(int, KH);
  QFETCH(int, KW);
  QFETCH(int, stride);
  QFETCH(int, pad);
  QFETCH(bool, bias);
  return ConvCase{"conv", ms::Conv2dShape{B, C, H, W, OC, KH, KW, stride, pad}, bias};
}

// The inputs of a convolution case (fixed seed): the GEMM operands x, w, dout and the rest.
struct ConvData {
  Vec x, w, bias, dout, dinp0, dw0, db0;
};

ConvData convData(const ms::Conv2dShape& s) {
  std::mt19937 rng(kSeed + 51);
  ConvData d;
  d.x = rnd(rng, size_t(s.B) * s.C * s.H * s.W);
  d.w = rnd(rng, size_t(s.OC) * s.K());
  d.bias = rnd(rng, size_t(s.OC));
  d.dout = rnd(rng, size_t(s.B) * s.OC * s.P());
  d.dinp0 = rnd(rng, d.x.size());  // non-zero: backward accumulates
  d.dw0 = rnd(rng, d.w.size());
  d.db0 = rnd(rng, d.bias.size());
  return d;
}

// Forward (into a buffer of 7s: overwritten), a full backward, then an input-only, a weight-only and a
// bias-only backward accumulating on top (the nullable paths; the bias-only call gets no input or weight).
// With biasDout, the bias gradients come from *biasDout (the GEMM-precision reference: the bias gradient is
// no GEMM, it reads the unrounded dout).
std::vector<Output> runConv(ms::Backend& be, const ConvCase& c, const ConvData& d,
                            const Vec* biasDout = nullptr) {
  Session s(be);
  const ms::Conv2dShape& sh = c.s;
  float* x = s.up(d.x);
  float* w = s.up(d.w);
  float* bias = c.bias ? s.up(d.bias) : nullptr;
  float* dout = s.up(d.dout);
  float* bdout = biasDout ? s.up(*biasDout) : dout;
  float* dinp = s.up(d.dinp0);
  float* dw = s.up(d.dw0);
  float* db = c.bias ? s.up(d.db0) : nullptr;
  float* out = s.up(Vec(d.dout.size(), 7.0f));
  be.conv2dForward(out, x, w, bias, sh);
  s.out("forward", out, d.dout.size());
  be.conv2dBackward(dinp, dw, biasDout ? nullptr : db, dout, x, w, sh);
  if (biasDout && db) be.conv2dBackward(nullptr, nullptr, db, bdout, x, w, sh);
  be.conv2dBackward(dinp, nullptr, nullptr, dout, x, w, sh);
  be.conv2dBackward(nullptr, dw, nullptr, dout, x, w, sh);
  if (db) be.conv2dBackward(nullptr, nullptr, db, bdout, nullptr, nullptr, sh);
  s.out("dinp", dinp, d.x.size());
  s.out("dweight", dw, d.w.size());
  if (db) s.out("dbias", db, d.bias.size());
  return std::move(s.outputs);
}

// The same calls on ms::cpu's kernels directly, on host memory (the reference the CPU backend must equal
// bit for bit in Fp32).
std::vector<Output> runConvDirect(const ConvCase& c, const ConvData& d) {
  const ms::Conv2dShape& sh = c.s;
  Vec out(d.dout.size(), 7.0f), dinp = d.dinp0, dw = d.dw0, db = d.db0;
  const float* bias = c.bias ? d.bias.data() : nullptr;
  float* dbias = c.bias ? db.data() : nullptr;
  ms::cpu::conv2dForward(out.data(), d.x.data(), d.w.data(), bias, sh);
  ms::cpu::conv2dBackward(dinp.data(), dw.data(), dbias, d.dout.data(), d.x.data(), d.w.data(), sh);
  ms::cpu::conv2dBackward(dinp.data(), nullptr, nullptr, d.dout.data(), d.x.data(), d.w.data(), sh);
  ms::cpu::conv2dBackward(nullptr, dw.data(), nullptr, d.dout.data(), d.x.data(), d.w.data(), sh);
  if (dbias) ms::cpu::conv2dBackward(nullptr, nullptr, dbias, d.dout.data(), nullptr, nullptr, sh);
  std::vector<Output> o;
  o.push_back(Output{"forward", out, {}, {}});
  o.push_back(Output{"dinp", dinp, {}, {}});
  o.push_back(Output{"dweight", dw, {}, {}});
  if (dbias) o.push_back(Output{"dbias", db, {}, {}});
  return o;
}

// Batch norm over (B, C, S): small and large B * S per channel (one element; S 1 as after pooling; a
// channel of 100k elements, which the GPU sums in many slices), few and many channels.
struct BnShape {
  int B, C, S;
};
const BnShape kBnShapes[] = {{1, 3, 1}, {2, 3, 1}, {4, 5, 7}, {3, 16, 49}, {2, 300, 10}, {8, 3, 12544}};

void addBnRows(const std::vector<BnShape>& shapes) {
  QTest::addColumn<int>("B");
  QTest::addColumn<int>("C");
  QTest::addColumn<int>("S");
  for (const BnShape& s : shapes)
    QTest::addRow("B%d C%d S%d (B*S %d)", s.B, s.C, s.S, s.B * s.S) << s.B << s.C << s.S;
}

struct BnData {
  Vec x, gamma, beta, dout, runMean0, runVar0, dinp0, dgamma0, dbeta0;
  Vec mean, rstd;                                    // per channel, from the host's double sums
  std::vector<double> sum, sumSq, sumDy, sumDyXhat;  // the host's sums (stage inputs)
};

BnData bnData(const BnShape& b) {
  std::mt19937 rng(kSeed + 53);
  const size_t n = size_t(b.B) * b.C * b.S;
  BnData d;
  d.x = rnd(rng, n, -2.0f, 3.0f);
  d.gamma = rnd(rng, size_t(b.C), 0.5f, 1.5f);
  d.beta = rnd(rng, size_t(b.C));
  d.dout = rnd(rng, n);
  d.runMean0 = rnd(rng, size_t(b.C));
  d.runVar0 = rnd(rng, size_t(b.C), 0.5f, 2.0f);
  d.dinp0 = rnd(rng, n);
  d.dgamma0 = rnd(rng, size_t(b.C));
  d.dbeta0 = rnd(rng, size_t(b.C));
  d.sum.assign(size_t(b.C), 0.0);
  d.sumSq.assign(size_t(b.C), 0.0);
  d.sumDy.assign(size_t(b.C), 0.0);
  d.sumDyXhat.assign(size_t(b.C), 0.0);
  d.mean.resize(size_t(b.C));
  d.rstd.resize(size_t(b.C));
  const double count = double(b.B) * b.S;
  for (int c = 0; c < b.C; ++c) {
    for (int i = 0; i < b.B; ++i)
      for (int j = 0; j < b.S; ++j) {
        const double v = d.x[(size_t(i) * b.C + c) * b.S + j];
        d.sum[c] += v;
        d.sumSq[c] += v * v;
      }
    const double m = d.sum[c] / count;
    d.mean[c] = float(m);
    d.rstd[c] = float(1.0 / std::sqrt(std::max(0.0, d.sumSq[c] / count - m * m) + 1e-5));
    for (int i = 0; i < b.B; ++i)
      for (int j = 0; j < b.S; ++j) {
        const size_t at = (size_t(i) * b.C + c) * b.S + j;
        d.sumDy[c] += d.dout[at];
        d.sumDyXhat[c] += double(d.dout[at]) * (double(d.x[at]) - d.mean[c]) * d.rstd[c];
      }
  }
  return d;
}

// Training batch norm as a layer runs it (stats, moments, running statistics, apply, gradient sums,
// backward), its float outputs; then each part alone on inputs from the host (so that the per-channel
// double sums compare on their own), their outputs too, doubles included; then the nullable forms (no
// weight or bias, no variance, no parameter gradients) and an in-place apply.
std::vector<Output> runBatchNorm(ms::Backend& be, const BnShape& b, const BnData& d) {
  Session s(be);
  const int B = b.B, C = b.C, S = b.S;
  const size_t n = d.x.size(), nc = size_t(C);
  const double count = double(B) * S;
  const float eps = 1e-5f, momentum = 0.1f;
  float* x = s.up(d.x);
  float* gamma = s.up(d.gamma);
  float* beta = s.up(d.beta);
  float* dout = s.up(d.dout);
  double* sum = s.alloc<double>(nc);
  double* sumSq = s.alloc<double>(nc);
  double* var = s.alloc<double>(nc);
  double* sdy = s.alloc<double>(nc);
  double* sdyx = s.alloc<double>(nc);
  float* mean = s.alloc<float>(nc);
  float* rstd = s.alloc<float>(nc);
  float* runMean = s.up(d.runMean0);
  float* runVar = s.up(d.runVar0);
  float* out = s.up(Vec(n, 7.0f));
  float* dinp = s.up(d.dinp0);
  float* dgamma = s.up(d.dgamma0);
  float* dbeta = s.up(d.dbeta0);
  be.batchNormStats(sum, sumSq, x, B, C, S);
  be.batchNormMoments(mean, rstd, var, sum, sumSq, count, C, eps);
  be.batchNormUpdateRunning(runMean, runVar, mean, var, count, C, momentum);
  be.batchNormApply(out, x, mean, rstd, gamma, beta, B, C, S);
  be.batchNormGradStats(sdy, sdyx, dout, x, mean, rstd, B, C, S);
  be.batchNormBackwardApply(dinp, dgamma, dbeta, dout, x, mean, rstd, gamma, sdy, sdyx, sdy, sdyx, count, B,
                            C, S);
  s.out("chain: mean", mean, nc);
  s.out("chain: rstd", rstd, nc);
  s.out("chain: running mean", runMean, nc);
  s.out("chain: running var", runVar, nc);
  s.out("chain: out", out, n);
  s.out("chain: dinp", dinp, n);
  s.out("chain: dweight", dgamma, nc);
  s.out("chain: dbias", dbeta, nc);
  // The parts on their own, from the host's values.
  s.out("stats: sum", sum, nc);
  s.out("stats: sumSq", sumSq, nc);
  float* hMean = s.up(d.mean);
  float* hRstd = s.up(d.rstd);
  double* hSum = s.up(d.sum);
  double* hSumSq = s.up(d.sumSq);
  be.batchNormMoments(mean, rstd, var, hSum, hSumSq, count, C, eps);
  s.out("moments: mean", mean, nc);
  s.out("moments: rstd", rstd, nc);
  s.out("moments: var", var, nc);
  be.batchNormGradStats(sdy, sdyx, dout, x, hMean, hRstd, B, C, S);
  s.out("gradStats: sumDy", sdy, nc);
  s.out("gradStats: sumDyXhat", sdyx, nc);
  double* hSdy = s.up(d.sumDy);
  double* hSdyx = s.up(d.sumDyXhat);
  // Synchronised batch norm's shape of call: global sums (here twice the local ones, over twice the count)
  // and the local ones for the parameter gradients.
  std::vector<double> twice(d.sumDy), twiceX(d.sumDyXhat);
  for (size_t c = 0; c < nc; ++c) twice[c] *= 2, twiceX[c] *= 2;
  float* dinp2 = s.up(d.dinp0);
  float* dgamma2 = s.up(d.dgamma0);
  float* dbeta2 = s.up(d.dbeta0);
  be.batchNormBackwardApply(dinp2, dgamma2, dbeta2, dout, x, hMean, hRstd, gamma, s.up(twice), s.up(twiceX),
                            hSdy, hSdyx, 2 * count, B, C, S);
  s.out("backwardApply: dinp", dinp2, n);
  s.out("backwardApply: dweight", dgamma2, nc);
  s.out("backwardApply: dbias", dbeta2, nc);
  // Nullable forms: no weight or bias, no variance, input gradient only; apply in place.
  be.batchNormMoments(mean, rstd, nullptr, hSum, hSumSq, count, C, eps);
  float* out2 = s.alloc<float>(n);
  be.batchNormApply(out2, x, hMean, hRstd, nullptr, nullptr, B, C, S);
  s.out("apply without weight and bias", out2, n);
  float* inPlace = s.up(d.x);
  be.batchNormApply(inPlace, inPlace, hMean, hRstd, gamma, beta, B, C, S);
  s.out("apply in place", inPlace, n);
  float* dinp3 = s.alloc<float>(n);
  be.batchNormBackwardApply(dinp3, nullptr, nullptr, dout, x, hMean, hRstd, nullptr, hSdy, hSdyx, hSdy, hSdyx,
                            count, B, C, S);
  s.out("backwardApply without weight, dinp only", dinp3, n);
  be.batchNormBackwardApply(nullptr, dgamma2, dbeta2, dout, x, hMean, hRstd, gamma, hSdy, hSdyx, hSdy, hSdyx,
                            count, B, C, S);
  s.out("backwardApply parameter gradients only: dweight", dgamma2, nc);
  s.out("backwardApply parameter gradients only: dbias", dbeta2, nc);
  return std::move(s.outputs);
}

// The chain of runBatchNorm on ms::cpu's kernels directly (host memory).
std::vector<Output> runBatchNormDirect(const BnShape& b, const BnData& d) {
  const int B = b.B, C = b.C, S = b.S;
  const size_t n = d.x.size(), nc = size_t(C);
  const double count = double(B) * S;
  std::vector<double> sum(nc), sumSq(nc), var(nc), sdy(nc), sdyx(nc);
  Vec mean(nc), rstd(nc), runMean = d.runMean0, runVar = d.runVar0, out(n, 7.0f), dinp = d.dinp0,
                          dgamma = d.dgamma0, dbeta = d.dbeta0;
  ms::cpu::batchNormStats(sum.data(), sumSq.data(), d.x.data(), B, C, S);
  ms::cpu::batchNormMoments(mean.data(), rstd.data(), var.data(), sum.data(), sumSq.data(), count, C, 1e-5f);
  ms::cpu::batchNormUpdateRunning(runMean.data(), runVar.data(), mean.data(), var.data(), count, C, 0.1f);
  ms::cpu::batchNormApply(out.data(), d.x.data(), mean.data(), rstd.data(), d.gamma.data(), d.beta.data(), B,
                          C, S);
  ms::cpu::batchNormGradStats(sdy.data(), sdyx.data(), d.dout.data(), d.x.data(), mean.data(), rstd.data(), B,
                              C, S);
  ms::cpu::batchNormBackwardApply(dinp.data(), dgamma.data(), dbeta.data(), d.dout.data(), d.x.data(),
                                  mean.data(), rstd.data(), d.gamma.data(), sdy.data(), sdyx.data(),
                                  sdy.data(), sdyx.data(), count, B, C, S);
  return {Output{"chain: mean", mean, {}, {}},
          Output{"chain: rstd", rstd, {}, {}},
          Output{"chain: running mean", runMean, {}, {}},
          Output{"chain: running var", runVar, {}, {}},
          Output{"chain: out", out, {}, {}},
          Output{"chain: dinp", dinp, {}, {}},
          Output{"chain: dweight", dgamma, {}, {}},
          Output{"chain: dbias", dbeta, {}, {}},
          Output{"stats: sum", {}, {}, sum},
          Output{"stats: sumSq", {}, {}, sumSq}};
}

// The first `count` outputs of v.
std::vector<Output> firstOutputs(const std::vector<Output>& v, size_t count) {
  return std::vector<Output>(v.begin(), v.begin() + std::min(count, v.size()));
}

// Mixed precision on the convolution and batch-norm ops (GemmPrecision::Bf16): a bf16 weight, input or bias
// (toBf16 of the fp32 one) gives the bits of the fp32 tensor (the convolution's GEMMs round fp32 operands to
// the same values; the batch-norm parameters are widened exactly); bf16 gradients (GradOut) end as the fp32
// run's gradients rounded once (one op each: every op rounds a bf16 gradient once). In Fp32 every bf16
// operand or gradient is refused, naming the op, also by a call that would not read it. "" when all holds,
// else what failed.
QString convBatchNormBf16Hold(ms::Backend& be) {
  const ms::Conv2dShape cs{2, 3, 7, 6, 5, 3, 3, 2, 1};
  const BnShape bs{3, 4, 10};
  const ConvData cd = convData(cs);
  const BnData bd = bnData(bs);
  Session s(be);
  be.setGemmPrecision(ms::GemmPrecision::Bf16);
  // Every tensor as fp32 (its values rounded to bf16, so that the fp32 and bf16 runs see the same) and bf16.
  struct Pair {
    float* wide;
    ms::bfloat16* half;
  };
  auto pair = [&](const Vec& v) {
    const Vec r = roundedHost(v, 16);
    Pair p{s.up(r), reinterpret_cast<ms::bfloat16*>(s.alloc<uint16_t>(v.size()))};
    be.toBf16(p.half, p.wide, v.size());
    return p;
  };
  const Pair x = pair(cd.x), w = pair(cd.w), bias = pair(cd.bias), gamma = pair(bd.gamma),
             beta = pair(bd.beta), dw0 = pair(cd.dw0), db0 = pair(cd.db0), dg0 = pair(bd.dgamma0),
             dbe0 = pair(bd.dbeta0);
  float* cdout = s.up(cd.dout);
  float* bx = s.up(bd.x);
  float* bdout = s.up(bd.dout);
  float* mean = s.up(bd.mean);
  float* rstd = s.up(bd.rstd);
  double* sdy = s.up(bd.sumDy);
  double* sdyx = s.up(bd.sumDyXhat);
  const double count = double(bs.B) * bs.S;
  // half: bf16 parameters, inputs and gradients; else their fp32 twins, the gradients rounded at the end.
  auto run = [&](bool half) {
    Session r(be);
    auto in = [&](const Pair& p) { return half ? ms::TensorIn(p.half) : ms::TensorIn(p.wide); };
    auto grad = [&](const Pair& p, size_t n) -> std::pair<ms::GradOut, void*> {
      if (half) {
        auto* g = reinterpret_cast<ms::bfloat16*>(r.alloc<uint16_t>(n));
        be.copy(g, p.half, n * sizeof(uint16_t));
        return {ms::GradOut(g), g};
      }
      float* g = r.alloc<float>(n);
      be.copy(g, p.wide, n * sizeof(float));
      return {ms::GradOut(g), g};
    };
    const size_t nOut = cd.dout.size(), nx = cd.x.size(), nw = cd.w.size(), oc = size_t(cs.OC),
                 nc = size_t(bs.C), nb = bd.x.size();
    float* out = r.alloc<float>(nOut);
    float* dinp = r.alloc<float>(nx);
    const auto [dw, dwRaw] = grad(dw0, nw);
    const auto [db, dbRaw] = grad(db0, oc);
    const auto [dg, dgRaw] = grad(dg0, nc);
    const auto [dbe, dbeRaw] = grad(dbe0, nc);
    be.conv2dForward(out, in(x), in(w), in(bias), cs);
    be.conv2dBackward(dinp, dw, db, cdout, in(x), in(w), cs);
    float* bout = r.alloc<float>(nb);
    float* bdinp = r.alloc<float>(nb);
    be.batchNormApply(bout, bx, mean, rstd, in(gamma), in(beta), bs.B, bs.C, bs.S);
    be.batchNormBackwardApply(bdinp, dg, dbe, bdout, bx, mean, rstd, in(gamma), sdy, sdyx, sdy, sdyx, count,
                              bs.B, bs.C, bs.S);
    r.out("conv forward", out, nOut);
    r.out("conv dinp", dinp, nx);
    r.out("batchNorm out", bout, nb);
    r.out("batchNorm dinp", bdinp, nb);
    // The gradients as bf16 values: the bf16 run's as kept, the fp32 run's rounded once now.
    const std::pair<void*, size_t> grads[] = {{dwRaw, nw}, {dbRaw, oc}, {dgRaw, nc}, {dbeRaw, nc}};
    const char* names[] = {"conv dweight", "conv dbias", "batchNorm dweight", "batchNorm dbias"};
    for (int k = 0; k < 4; ++k) {
      const auto [p, n] = grads[k];
      std::vector<uint16_t> bits(n);
      if (half) {
        be.download(bits.data(), p, n * sizeof(uint16_t));
      } else {
        auto* rounded = reinterpret_cast<ms::bfloat16*>(r.alloc<uint16_t>(n));
        be.toBf16(rounded, static_cast<float*>(p), n);
        be.download(bits.data(), rounded, n * sizeof(uint16_t));
      }
      Output o{names[k], Vec(n), {}, {}};
      for (size_t i = 0; i < n; ++i) o.f[i] = bitsToFloat(uint32_t(bits[i]) << 16);
      r.outputs.push_back(std::move(o));
    }
    return r.outputs;
  };
  const auto half = run(true), wide = run(false);
  QString why = bitDifference(half, wide);
  be.setGemmPrecision(ms::GemmPrecision::Fp32);
  if (!why.isEmpty()) return QStringLiteral("bf16: ") + why;
  // Fp32 refuses every bf16 operand, naming the op.
  float* out = s.alloc<float>(cd.dout.size());
  float* dinp = s.alloc<float>(cd.x.size());
  const struct {
    const char* op;
    std::function<void()> call;
  } calls[] = {
      {"conv2dForward", [&] { be.conv2dForward(out, x.wide, w.half, nullptr, cs); }},
      {"conv2dForward", [&] { be.conv2dForward(out, x.half, w.wide, nullptr, cs); }},
      {"conv2dForward", [&] { be.conv2dForward(out, x.wide, w.wide, bias.half, cs); }},
      {"conv2dBackward", [&] { be.conv2dBackward(dinp, nullptr, nullptr, cdout, x.half, w.wide, cs); }},
      {"conv2dBackward", [&] { be.conv2dBackward(nullptr, dw0.half, nullptr, cdout, x.wide, w.wide, cs); }},
      {"batchNormApply",
       [&] { be.batchNormApply(out, bx, mean, rstd, gamma.half, nullptr, bs.B, bs.C, bs.S); }},
      {"batchNormBackwardApply",
       [&] {
         be.batchNormBackwardApply(nullptr, dg0.half, nullptr, bdout, bx, mean, rstd, nullptr, sdy, sdyx, sdy,
                                   sdyx, count, bs.B, bs.C, bs.S);
       }},
  };
  for (const auto& c : calls) {
    why = throwsDeviceFailure(c.call, c.op);
    if (!why.isEmpty()) return QStringLiteral("%1 with a bf16 operand in fp32: ").arg(c.op) + why;
  }
  return {};
}

// Shapes the ops cannot compute are a DeviceFailure naming the op (never a crash), checked before any
// memory is touched (the pointers here are null). "" when all hold, else what failed.
QString badConvBatchNormShapesFail(ms::Backend& be) {
  const ms::Conv2dShape bad[] = {
      {2, 3, 3, 3, 4, 5, 5, 1, 0},                    // kernel larger than the input: no output positions
      {2, 3, 3, 3, 4, 5, 5, 2, 0},                    // the same with stride 2 ((3 - 5) / 2 + 1 would say 1)
      {2, 3, 8, 8, 4, 3, 3, 0, 1},                    // stride 0
      {2, 3, 8, 8, 4, 3, 3, 1, -1},                   // negative padding
      {0, 3, 8, 8, 4, 3, 3, 1, 1},                    // empty batch
      {2, 3, 8, 8, 0, 3, 3, 1, 1},                    // no output channels
      {1, 1 << 16, 1 << 10, 1 << 10, 1, 1, 1, 1, 0},  // one sample past 2^31 elements
  };
  for (const ms::Conv2dShape& s : bad) {
    QString why = throwsDeviceFailure([&] { be.conv2dForward(nullptr, nullptr, nullptr, nullptr, s); },
                                      "conv2dForward");
    if (why.isEmpty())
      why = throwsDeviceFailure(
          [&] { be.conv2dBackward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, s); },
          "conv2dBackward");
    if (!why.isEmpty()) return QString::fromStdString(convName(s)) + ": " + why;
  }
  const struct {
    const char* op;
    std::function<void()> call;
  } calls[] = {
      {"batchNormStats", [&] { be.batchNormStats(nullptr, nullptr, nullptr, 0, 3, 4); }},
      {"batchNormStats", [&] { be.batchNormStats(nullptr, nullptr, nullptr, 2, 3, 0); }},
      {"batchNormMoments",
       [&] { be.batchNormMoments(nullptr, nullptr, nullptr, nullptr, nullptr, 8, 0, 1e-5f); }},
      {"batchNormMoments",
       [&] { be.batchNormMoments(nullptr, nullptr, nullptr, nullptr, nullptr, 0, 3, 1e-5f); }},
      {"batchNormUpdateRunning",
       [&] { be.batchNormUpdateRunning(nullptr, nullptr, nullptr, nullptr, -1, 3, 0.1f); }},
      {"batchNormApply",
       [&] { be.batchNormApply(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 2, -1, 4); }},
      {"batchNormGradStats",
       [&] { be.batchNormGradStats(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 2, 3, 0); }},
      {"batchNormBackwardApply",
       [&] {
         be.batchNormBackwardApply(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                   nullptr, nullptr, nullptr, nullptr, 0, 2, 3, 4);
       }},
  };
  for (const auto& c : calls) {
    const QString why = throwsDeviceFailure(c.call, c.op);
    if (!why.isEmpty()) return QString(c.op) + ": " + why;
  }
  return {};
}

// RMSNorm in GemmPrecision::Bf16 (the backend is left in Bf16): its weight a bf16 working parameter (half)
// or the fp32 tensor of the same values (wide), its weight gradient bf16 (half, starting from the bf16 of an
// initial gradient) or fp32 (wide, from the same values) rounded once at the end. Outputs out, rstd, dinp and
// the weight gradient as bf16 values.
std::vector<Output> runRmsNormBf16(ms::Backend& be, bool half) {
  std::mt19937 rng(kSeed + 65);
  const int N = 11, C = 37;
  const size_t n = size_t(N) * C;
  const Vec inp = rnd(rng, n, -2.0f, 3.0f), w = roundedHost(rnd(rng, size_t(C), 0.5f, 1.5f), 16),
            dout = rnd(rng, n), dinp0 = rnd(rng, n), dw0 = roundedHost(rnd(rng, size_t(C)), 16);
  be.setGemmPrecision(ms::GemmPrecision::Bf16);
  Session s(be);
  float* x = s.up(inp);
  float* dy = s.up(dout);
  float* dinp = s.up(dinp0);
  float* wWide = s.up(w);
  auto* wHalf = reinterpret_cast<ms::bfloat16*>(s.alloc<uint16_t>(size_t(C)));
  be.toBf16(wHalf, wWide, size_t(C));  // exact: w holds bf16 values
  float* dwWide = s.up(dw0);
  auto* dwHalf = reinterpret_cast<ms::bfloat16*>(s.alloc<uint16_t>(size_t(C)));
  be.toBf16(dwHalf, dwWide, size_t(C));
  const ms::TensorIn weight = half ? ms::TensorIn(wHalf) : ms::TensorIn(wWide);
  float* out = s.alloc<float>(n);
  float* rstd = s.alloc<float>(size_t(N));
  be.rmsNormForward(out, rstd, x, weight, N, C, 1e-5f);
  be.rmsNormBackward(dinp, half ? ms::GradOut(dwHalf) : ms::GradOut(dwWide), dy, x, weight, rstd, N, C);
  s.out("rmsNorm out", out, n);
  s.out("rmsNorm rstd", rstd, size_t(N));
  s.out("rmsNorm dinp", dinp, n);
  if (!half) be.toBf16(dwHalf, dwWide, size_t(C));
  std::vector<uint16_t> bits(static_cast<size_t>(C));
  be.download(bits.data(), dwHalf, bits.size() * sizeof(uint16_t));
  Output o{"rmsNorm dweight (bf16)", Vec(bits.size()), {}, {}};
  for (size_t i = 0; i < bits.size(); ++i) o.f[i] = bitsToFloat(uint32_t(bits[i]) << 16);
  s.outputs.push_back(std::move(o));
  return std::move(s.outputs);
}

// Mixed precision on RMSNorm: a bf16 weight gives the bits of its fp32 values, a bf16 weight gradient the
// fp32 run's rounded once; in Fp32 a bf16 weight or weight gradient is refused naming the op. "" when all
// holds.
QString rmsNormBf16Hold(ms::Backend& be) {
  const std::vector<Output> half = runRmsNormBf16(be, true), wide = runRmsNormBf16(be, false);
  be.setGemmPrecision(ms::GemmPrecision::Fp32);
  if (const QString why = bitDifference(half, wide); !why.isEmpty()) return QStringLiteral("bf16: ") + why;
  Session s(be);
  const int N = 3, C = 8;
  float* x = s.up(Vec(size_t(N) * C, 1.0f));
  float* w = s.up(Vec(size_t(C), 1.0f));
  auto* wHalf = reinterpret_cast<ms::bfloat16*>(s.alloc<uint16_t>(size_t(C)));
  auto* dwHalf = reinterpret_cast<ms::bfloat16*>(s.alloc<uint16_t>(size_t(C)));
  float* out = s.alloc<float>(size_t(N) * C);
  float* rstd = s.up(Vec(size_t(N), 1.0f));
  float* dinp = s.alloc<float>(size_t(N) * C);
  const struct {
    const char* op;
    std::function<void()> call;
  } calls[] = {
      {"rmsNormForward", [&] { be.rmsNormForward(out, rstd, x, wHalf, N, C, 1e-5f); }},
      {"rmsNormBackward", [&] { be.rmsNormBackward(dinp, nullptr, x, x, wHalf, rstd, N, C); }},
      {"rmsNormBackward", [&] { be.rmsNormBackward(dinp, dwHalf, x, x, w, rstd, N, C); }},
  };
  for (const auto& c : calls)
    if (const QString why = throwsDeviceFailure(c.call, c.op); !why.isEmpty())
      return QStringLiteral("%1 with a bf16 weight or gradient in fp32: ").arg(c.op) + why;
  return {};
}

// RoPE shapes the ops cannot compute (H not a positive multiple of KV, an odd head size) are a DeviceFailure
// naming the op and the problem, checked before any memory is touched (null pointers here), whatever the
// batch. "" when all hold, else what failed.
QString badRopeShapesFail(ms::Backend& be) {
  const struct {
    int B, H, KV, hs;
    const char* problem;
  } bad[] = {
      {1, 3, 2, 4, "key/value heads"}, {0, 3, 2, 4, "key/value heads"}, {2, 4, 0, 8, "key/value heads"},
      {1, 2, 4, 8, "key/value heads"}, {1, 4, 2, 5, "must be even"},    {1, 4, 4, 0, "must be even"},
  };
  for (const auto& b : bad) {
    const QString shape = QStringLiteral("B %1 H %2 KV %3 hs %4: ").arg(b.B).arg(b.H).arg(b.KV).arg(b.hs);
    for (const char* mention : {"ropePackQkv", b.problem}) {
      const QString why = throwsDeviceFailure(
          [&] { be.ropePackQkv(nullptr, nullptr, nullptr, nullptr, b.B, 3, b.H, b.KV, b.hs, 1e4f, 0); },
          mention);
      if (!why.isEmpty()) return shape + "ropePackQkv: " + why;
    }
    for (const char* mention : {"ropeUnpackQkv", b.problem}) {
      const QString why = throwsDeviceFailure(
          [&] { be.ropeUnpackQkv(nullptr, nullptr, nullptr, nullptr, b.B, 3, b.H, b.KV, b.hs, 1e4f, 7); },
          mention);
      if (!why.isEmpty()) return shape + "ropeUnpackQkv: " + why;
    }
  }
  return {};
}

// MoE row counts below 0 and row lengths below 1 are a DeviceFailure naming the op and the problem, checked
// before any memory is touched (null pointers here), n = 0 included. "" when all hold, else what failed.
QString badMoeShapesFail(ms::Backend& be) {
  const struct {
    int n, C;
    const char* problem;
  } bad[] = {{-1, 4, "row count"}, {3, 0, "row length"}, {0, 0, "row length"}, {2, -5, "row length"}};
  for (const auto& b : bad) {
    const QString shape = QStringLiteral("n %1 C %2: ").arg(b.n).arg(b.C);
    const struct {
      const char* op;
      std::function<void()> call;
    } calls[] = {
        {"gatherRows", [&] { be.gatherRows(nullptr, nullptr, nullptr, nullptr, b.n, b.C); }},
        {"scatterAddRows", [&] { be.scatterAddRows(nullptr, nullptr, nullptr, nullptr, b.n, b.C); }},
        {"rowDots", [&] { be.rowDots(nullptr, nullptr, nullptr, nullptr, b.n, b.C); }},
    };
    for (const auto& c : calls)
      for (const char* mention : {c.op, b.problem})
        if (const QString why = throwsDeviceFailure(c.call, mention); !why.isEmpty())
          return shape + c.op + ": " + why;
  }
  return {};
}

// ---- Multi-tensor optimizer updates -----------------------------------------------------------------------

// Segments of one buffer (total floats): sizes[i] elements at offsets[i], 3 floats of padding before each
// that no update may touch, weight decays cycling through 0, 0.1 and 0.02.
struct SegmentLayout {
  std::vector<size_t> offsets, sizes;
  std::vector<float> decays;
  size_t total = 0;
};

SegmentLayout segmentLayout(const std::vector<size_t>& sizes) {
  const float decays[] = {0.0f, 0.1f, 0.02f};
  SegmentLayout l;
  size_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    at += 3;
    l.offsets.push_back(at);
    l.sizes.push_back(sizes[i]);
    l.decays.push_back(decays[i % 3]);
    at += sizes[i];
  }
  l.total = at + 3;
  return l;
}

enum class SegmentOptimizer { AdamW, SgdPlain, SgdMomentum, SgdNesterov };
const char* const kSegmentOptimizers[] = {"adamw", "sgd without momentum", "sgd momentum", "sgd nesterov"};

// Two updates of every segment of l on be from fixed-seed data, a first step and a second at another
// learning rate: with the multi-tensor form (one call per step) when multi, else with the single form
// segment by segment. The host segment array is cleared after every call (the caller may reuse it at once).
// Outputs the whole buffers, padding included: params, and m (AdamW's first moment or SGD's momentum buffer)
// and v where the optimizer keeps them. SGD without momentum gives null m.
std::vector<Output> runSegments(ms::Backend& be, const SegmentLayout& l, SegmentOptimizer opt, bool multi) {
  Session s(be);
  std::mt19937 rng(kSeed + 12);
  const size_t n = l.total;
  float* grads = s.up(rnd(rng, n));
  float* p = s.up(rnd(rng, n));
  float* m = s.up(rnd(rng, n, -0.1f, 0.1f));
  float* v = s.up(rnd(rng, n, 0.0f, 0.01f));
  const bool adamw = opt == SegmentOptimizer::AdamW;
  const float momentum = opt == SegmentOptimizer::SgdPlain ? 0.0f : 0.9f;
  const bool nesterov = opt == SegmentOptimizer::SgdNesterov;
  const bool keepsM = adamw || momentum != 0.0f;
  std::vector<ms::OptimizerSegment> segs;
  for (int step = 0; step < 2; ++step) {
    segs.clear();
    for (size_t i = 0; i < l.sizes.size(); ++i) {
      const size_t at = l.offsets[i];
      segs.push_back(
          {p + at, grads + at, keepsM ? m + at : nullptr, adamw ? v + at : nullptr, l.sizes[i], l.decays[i]});
    }
    const float lr = adamw ? (step == 0 ? 1e-3f : 3e-3f) : (step == 0 ? 0.1f : 0.05f);
    const int t = step + 1;
    const bool first = step == 0;
    if (multi) {
      if (adamw)
        be.adamwUpdateSegments(segs.data(), segs.size(), lr, 0.9f, 0.95f, 1e-8f, t, 0.5f);
      else
        be.sgdUpdateSegments(segs.data(), segs.size(), lr, momentum, nesterov, first, 0.5f);
      segs.assign(segs.size(), ms::OptimizerSegment{});
    } else {
      for (const ms::OptimizerSegment& g : segs) {
        if (adamw)
          be.adamwUpdate(g.params, g.grads.f32(), g.m, g.v, g.n, lr, 0.9f, 0.95f, 1e-8f, g.weightDecay, t,
                         0.5f);
        else
          be.sgdUpdate(g.params, g.grads.f32(), g.m, g.n, lr, momentum, g.weightDecay, nesterov, first, 0.5f);
      }
    }
  }
  s.out("params", p, n);
  if (keepsM) s.out(adamw ? "m" : "buf", m, n);
  if (adamw) s.out("v", v, n);
  return std::move(s.outputs);
}

// The CPU suite's layout: 1, an empty segment, sizes past the GPU's 4096-element chunk, odd offsets.
const std::vector<size_t> kCpuSegmentSizes = {1, 0, 7, 33, 4097, 257, 3, 12289, 2, 0, 5};

// The GPU suite's layouts. "37 odd": one segment past 1M elements, one of 1, one empty, sizes around the
// chunk (4096) and fixed-seed odd sizes. "300 small": more segments than the table's first capacity (64).
std::vector<size_t> gpuSegmentSizes(int layout) {
  std::mt19937 rng(kSeed + 13);
  std::vector<size_t> sizes;
  if (layout == 0) {
    sizes = {1, (size_t(1) << 20) + 4099, 0, 4095, 4096, 4097, 8191, 8193, 3, 769};
    std::uniform_int_distribution<int> dist(1, 20000);
    while (sizes.size() < 37) sizes.push_back(size_t(dist(rng)) | 1u);
  } else {
    std::uniform_int_distribution<int> dist(1, 50);
    for (int i = 0; i < 300; ++i) sizes.push_back(size_t(dist(rng)));
  }
  return sizes;
}

// ---- Ring attention (context parallelism) -----------------------------------------------------------------

// The layout of tst_kernels' ringAttention: rank r of cp holds chunks r and 2cp-1-r (chunk rows each) of a
// sequence of T = 2 cp chunk rows; every rank merges the blocks of all ranks (its own first, then ranks
// r-1, r-2, ... mod cp) and runs the backward of every (rank, block) pair from its final out and lse. The
// blocks hold KV key/value heads (grouped-query attention; KV = H is plain multi-head attention).
struct RingShape {
  int B, C, H, KV, cp, chunk;
  bool causal;
  int T() const { return 2 * cp * chunk; }
  int Tl() const { return 2 * chunk; }
  int Ckv() const { return KV * (C / H); }  // a kv row's key heads (then as many value heads)
  int row(int r, int t) const { return t < chunk ? r * chunk + t : (2 * cp - 1 - r) * chunk + (t - chunk); }
  ms::SeqPositions positions(int r) const { return {r * chunk, chunk, (2 * cp - 1 - r) * chunk}; }
  int owner(int r, int step) const { return (r - step + cp) % cp; }
};

// One rank's inputs: its rows of qkv (B, Tl, 3C), kv (B, Tl, 2 Ckv) and dout (B, Tl, C).
struct RingRankData {
  Vec qkv, kv, dout;
};

// kv (B, T, 2 Ckv): with KV = H (kv empty) the k | v columns of qkv.
std::vector<RingRankData> ringRanks(const RingShape& r, const Vec& qkv, const Vec& kv, const Vec& dout) {
  const int C = r.C, T = r.T(), Tl = r.Tl(), C2 = 2 * r.Ckv();
  std::vector<RingRankData> ranks(r.cp);
  for (int k = 0; k < r.cp; ++k) {
    RingRankData& d = ranks[k];
    d.qkv.resize(size_t(r.B) * Tl * 3 * C);
    d.kv.resize(size_t(r.B) * Tl * C2);
    d.dout.resize(size_t(r.B) * Tl * C);
    for (int b = 0; b < r.B; ++b)
      for (int t = 0; t < Tl; ++t) {
        const size_t full = size_t(b) * T + r.row(k, t), local = size_t(b) * Tl + t;
        std::copy_n(qkv.data() + full * 3 * C, 3 * C, d.qkv.data() + local * 3 * C);
        if (kv.empty())
          std::copy_n(qkv.data() + full * 3 * C + C, 2 * C, d.kv.data() + local * 2 * C);
        else
          std::copy_n(kv.data() + full * C2, C2, d.kv.data() + local * C2);
        std::copy_n(dout.data() + full * C, C, d.dout.data() + local * C);
      }
  }
  return ranks;
}

// One rank's results: out (B, Tl, C), lse (B, H, Tl), dqkv (B, Tl, 3C: q part; k and v parts start at 7 and
// must stay so) and the dkv (B, Tl, 2 Ckv) the ranks accumulated into its keys and values.
struct RingRankResult {
  Vec out, lse, dqkv, dkv;
};

// Outputs "out" (B, T, C), "lse" (B, H, T) and "dqkv" (B, T, C + 2 Ckv: dq | dk | dv) at the full
// positions, and "kv untouched" (1 when the k and v parts of every rank's dqkv still hold their 7s).
std::vector<Output> ringAssemble(const RingShape& r, const std::vector<RingRankResult>& res) {
  const int C = r.C, T = r.T(), Tl = r.Tl(), C2 = 2 * r.Ckv(), W = C + C2;
  Vec out(size_t(r.B) * T * C), lse(size_t(r.B) * r.H * T), dqkv(size_t(r.B) * T * W);
  bool untouched = true;
  for (int k = 0; k < r.cp; ++k) {
    const RingRankResult& x = res[k];
    for (int b = 0; b < r.B; ++b)
      for (int t = 0; t < Tl; ++t) {
        const size_t full = size_t(b) * T + r.row(k, t), local = size_t(b) * Tl + t;
        std::copy_n(x.out.data() + local * C, C, out.data() + full * C);
        std::copy_n(x.dqkv.data() + local * 3 * C, C, dqkv.data() + full * W);
        std::copy_n(x.dkv.data() + local * C2, C2, dqkv.data() + full * W + C);
        for (int c = C; c < 3 * C; ++c) untouched = untouched && x.dqkv[local * 3 * C + c] == 7.0f;
        for (int h = 0; h < r.H; ++h)
          lse[(size_t(b) * r.H + h) * T + r.row(k, t)] = x.lse[(size_t(b) * r.H + h) * Tl + t];
      }
  }
  return {Output{"out", out, {}, {}}, Output{"lse", lse, {}, {}}, Output{"dqkv", dqkv, {}, {}},
          Output{"kv untouched", {}, {}, {untouched ? 1.0 : 0.0}}};
}

// dqkv's start: 0 in the q part, 7 in the k and v parts.
Vec ringDqkvStart(const RingShape& r) {
  Vec d(size_t(r.B) * r.Tl() * 3 * r.C, 7.0f);
  for (size_t row = 0; row < size_t(r.B) * r.Tl(); ++row) std::fill_n(d.data() + row * 3 * r.C, r.C, 0.0f);
  return d;
}

// See TestBackendCpu::ringAttention.
constexpr double kBf16RingAtol = 2e-2;

// The ring with ms::cpu's block ops called directly. roundOut: backward reads each rank's out rounded to bf16
// (what a bf16 out gives).
std::vector<Output> ringCpu(const RingShape& r, const Vec& qkv, const Vec& kv, const Vec& dout,
                            bool roundOut = false) {
  const std::vector<RingRankData> in = ringRanks(r, qkv, kv, dout);
  const int Tl = r.Tl();
  std::vector<RingRankResult> res(r.cp);
  for (RingRankResult& x : res) {
    x.out.assign(size_t(r.B) * Tl * r.C, std::numeric_limits<float>::quiet_NaN());
    x.lse.assign(size_t(r.B) * r.H * Tl, std::numeric_limits<float>::quiet_NaN());
    x.dqkv = ringDqkvStart(r);
    x.dkv.assign(size_t(r.B) * Tl * 2 * r.Ckv(), 0.0f);
  }
  for (int k = 0; k < r.cp; ++k)
    for (int step = 0; step < r.cp; ++step) {
      const int o = r.owner(k, step);
      ms::cpu::attentionBlockForward(res[k].out.data(), res[k].lse.data(), in[k].qkv.data(), in[o].kv.data(),
                                     r.B, Tl, Tl, r.C, r.H, r.KV, r.positions(k), r.positions(o), r.causal,
                                     step == 0);
    }
  for (int k = 0; k < r.cp; ++k) {
    const Vec o32 = roundOut ? roundedHost(res[k].out, 16) : res[k].out;
    for (int step = 0; step < r.cp; ++step) {
      const int o = r.owner(k, step);
      ms::cpu::attentionBlockBackward(res[k].dqkv.data(), res[o].dkv.data(), in[k].dout.data(),
                                      in[k].qkv.data(), in[o].kv.data(), o32.data(), res[k].lse.data(), r.B,
                                      Tl, Tl, r.C, r.H, r.KV, r.positions(k), r.positions(o), r.causal);
    }
  }
  return ringAssemble(r, res);
}

// The ring through a backend's block ops (inputs uploaded per rank, results downloaded). bf16Out: backward
// reads each rank's out as a bf16 copy (toBf16).
std::vector<Output> ringBackend(ms::Backend& be, const RingShape& r, const Vec& qkv, const Vec& kvFull,
                                const Vec& dout, bool bf16Out = false) {
  const std::vector<RingRankData> in = ringRanks(r, qkv, kvFull, dout);
  const int Tl = r.Tl();
  const size_t nOut = size_t(r.B) * Tl * r.C, nLse = size_t(r.B) * r.H * Tl;
  Session s(be);
  std::vector<float*> q(r.cp), kv(r.cp), g(r.cp), out(r.cp), lse(r.cp), dqkv(r.cp), dkv(r.cp);
  for (int k = 0; k < r.cp; ++k) {
    q[k] = s.up(in[k].qkv);
    kv[k] = s.up(in[k].kv);
    g[k] = s.up(in[k].dout);
    out[k] = s.up(Vec(nOut, std::numeric_limits<float>::quiet_NaN()));
    lse[k] = s.up(Vec(nLse, std::numeric_limits<float>::quiet_NaN()));
    dqkv[k] = s.up(ringDqkvStart(r));
    dkv[k] = s.alloc<float>(size_t(r.B) * Tl * 2 * r.Ckv());
  }
  for (int k = 0; k < r.cp; ++k)
    for (int step = 0; step < r.cp; ++step) {
      const int o = r.owner(k, step);
      be.attentionBlockForward(out[k], lse[k], q[k], kv[o], r.B, Tl, Tl, r.C, r.H, r.KV, r.positions(k),
                               r.positions(o), r.causal, step == 0);
    }
  for (int k = 0; k < r.cp; ++k) {
    ms::TensorIn o32 = out[k];
    if (bf16Out) {
      auto* kept = reinterpret_cast<ms::bfloat16*>(s.alloc<float>((nOut + 1) / 2));
      be.toBf16(kept, out[k], nOut);
      o32 = kept;
    }
    for (int step = 0; step < r.cp; ++step) {
      const int o = r.owner(k, step);
      be.attentionBlockBackward(dqkv[k], dkv[o], g[k], q[k], kv[o], o32, lse[k], r.B, Tl, Tl, r.C, r.H, r.KV,
                                r.positions(k), r.positions(o), r.causal);
    }
  }
  std::vector<RingRankResult> res(r.cp);
  for (int k = 0; k < r.cp; ++k) {
    RingRankResult& x = res[k];
    x.out.resize(nOut);
    x.lse.resize(nLse);
    x.dqkv.resize(size_t(r.B) * Tl * 3 * r.C);
    x.dkv.resize(size_t(r.B) * Tl * 2 * r.Ckv());
    be.download(x.out.data(), out[k], nOut * sizeof(float));
    be.download(x.lse.data(), lse[k], nLse * sizeof(float));
    be.download(x.dqkv.data(), dqkv[k], x.dqkv.size() * sizeof(float));
    be.download(x.dkv.data(), dkv[k], x.dkv.size() * sizeof(float));
  }
  return ringAssemble(r, res);
}

}  // namespace

// ---- The CPU backend and its emulated device
// ----------------------------------------------------------------

class TestBackendCpu : public QObject {
  Q_OBJECT

 private slots:
  void info() {
    const auto plain = ms::makeCpuBackend(false);
    const auto emu = ms::makeCpuBackend(true);
    QCOMPARE(plain->kind(), ms::DeviceKind::Cpu);
    QVERIFY(!plain->deviceMemory());
    QVERIFY(!plain->info().emulated);
    QVERIFY(emu->deviceMemory());
    QVERIFY(emu->info().emulated);
    QVERIFY(!emu->info().name.empty());
    QCOMPARE(emu->memoryInfo().freeBytes, int64_t(0));
    QVERIFY(plain->allocate(0) == nullptr);
    QVERIFY(emu->allocate(0) == nullptr);
    emu->deallocate(nullptr, 0);
    QCOMPARE(emu->attentionSavedFloats(2, 5, 48, 3), size_t(2 * 3 * 5 * 5));
    QCOMPARE(emu->attentionScratchFloats(2, 5, 48, 3), size_t(2 * 3 * 5 * 5));
#ifdef MESHSTUDIO_HAVE_CUDA
    QVERIFY(ms::computeStream(*emu) == nullptr);  // not a CUDA backend
#endif
  }

  // Every op: the plain CPU backend and the emulated device give the same bits.
  void emulatedMatchesPlain_data() {
    addCaseRows();
  }
  void emulatedMatchesPlain() {
    QFETCH(int, caseIndex);
    QFETCH(int, shapeIndex);
    const auto plain = ms::makeCpuBackend(false);
    const auto emu = ms::makeCpuBackend(true);
    const std::vector<Output> ref = runCase(*plain, caseIndex, shapeIndex);
    const std::vector<Output> got = runCase(*emu, caseIndex, shapeIndex);
    QVERIFY(!ref.empty());
    const QString why = bitDifference(got, ref);
    QVERIFY2(why.isEmpty(), qPrintable(why));
  }

  // Convolution: the plain CPU backend and the emulated device give the same bits, and the plain backend
  // those of ms::cpu's kernels called directly (in Fp32 the backend adds nothing but the pointer checks).
  void convEmulatedMatchesPlain_data() {
    addConvRows(std::vector<ms::Conv2dShape>(std::begin(kConvShapes), std::end(kConvShapes)));
  }
  void convEmulatedMatchesPlain() {
    const ConvCase c = fetchConvCase();
    const ConvData d = convData(c.s);
    const auto plain = ms::makeCpuBackend(false);
    const auto emu = ms::makeCpuBackend(true);
    const std::vector<Output> ref = runConv(*plain, c, d);
    QVERIFY(!ref.empty());
    QString why = bitDifference(runConv(*emu, c, d), ref);
    QVERIFY2(why.isEmpty(), qPrintable(QStringLiteral("emulated: ") + why));
    why = bitDifference(ref, runConvDirect(c, d));
    QVERIFY2(why.isEmpty(), qPrintable(QStringLiteral("against ms::cpu directly: ") + why));
  }

  // Batch norm's parts: plain and emulated give the same bits (doubles included), and the chain those of
  // ms::cpu's kernels called directly.
  void batchNormEmulatedMatchesPlain_data() {
    addBnRows(std::vector<BnShape>(std::begin(kBnShapes), std::end(kBnShapes)));
  }
  void batchNormEmulatedMatchesPlain() {
    QFETCH(int, B);
    QFETCH(int, C);
    QFETCH(int, S);
    const BnShape b{B, C, S};
    const BnData d = bnData(b);
    const auto plain = ms::makeCpuBackend(false);
    const auto emu = ms::makeCpuBackend(true);
    const std::vector<Output> ref = runBatchNorm(*plain, b, d);
    QVERIFY(!ref.empty());
    QString why = bitDifference(runBatchNorm(*emu, b, d), ref);
    QVERIFY2(why.isEmpty(), qPrintable(QStringLiteral("emulated: ") + why));
    const std::vector<Output> direct = runBatchNormDirect(b, d);
    why = bitDifference(firstOutputs(ref, direct.size()), direct);
    QVERIFY2(why.isEmpty(), qPrintable(QStringLiteral("against ms::cpu directly: ") + why));
    // The parts on the host's inputs agree with the host's double sums (a different order: 1e-9).
    const QString close = closeDifference(
        {ref[8], ref[9]}, {Output{"sum", {}, {}, d.sum}, Output{"sumSq", {}, {}, d.sumSq}}, 0, 0);
    QVERIFY2(close.isEmpty(), qPrintable(close));
  }

  // Convolution in Bf16 and Tf32: the Fp32 convolution of the input, weight and dout rounded on the host,
  // bit for bit, the bias gradient from the unrounded dout (no GEMM); and different from the unrounded one.
  void convPrecisionEmulated_data() {
    QTest::addColumn<int>("precision");
    QTest::addColumn<int>("shape");
    for (const ms::GemmPrecision p : {ms::GemmPrecision::Bf16, ms::GemmPrecision::Tf32})
      for (const int sh : {0, 4, 6})
        QTest::addRow("%s %s", ms::toString(p), convName(kConvShapes[sh]).c_str()) << int(p) << sh;
  }
  void convPrecisionEmulated() {
    QFETCH(int, precision);
    QFETCH(int, shape);
    const auto p = ms::GemmPrecision(precision);
    const ConvCase c{"conv", kConvShapes[shape], true};
    const ConvData d = convData(c.s);
    ConvData rounded = d;
    rounded.x = roundedHost(d.x, droppedBits(p));
    rounded.w = roundedHost(d.w, droppedBits(p));
    rounded.dout = roundedHost(d.dout, droppedBits(p));
    const auto fp32 = ms::makeCpuBackend(false);
    const std::vector<Output> ref = runConv(*fp32, c, rounded, &d.dout);
    for (const bool emulate : {false, true}) {
      const auto be = ms::makeCpuBackend(emulate);
      be->setGemmPrecision(p);
      const QString why = bitDifference(runConv(*be, c, d), ref);
      QVERIFY2(why.isEmpty(), qPrintable((emulate ? QStringLiteral("emulated: ") : QString()) + why));
    }
    const std::vector<Output> unrounded = runConv(*fp32, c, d);
    QVERIFY(!bitDifference({ref[0]}, {unrounded[0]}).isEmpty());  // forward
    QVERIFY(bitDifference({ref[3]}, {unrounded[3]}).isEmpty());   // dbias
  }

  // bf16 parameters, inputs and gradients of the convolution and batch-norm ops (convBatchNormBf16Hold).
  void convBatchNormBf16() {
    for (const bool emulate : {false, true}) {
      const auto be = ms::makeCpuBackend(emulate);
      const QString why = convBatchNormBf16Hold(*be);
      QVERIFY2(why.isEmpty(), qPrintable((emulate ? QStringLiteral("emulated: ") : QString()) + why));
    }
  }

  // Shapes the ops cannot compute throw DeviceFailure naming the op (badConvBatchNormShapesFail).
  void convBatchNormBadShapes() {
    for (const bool emulate : {false, true}) {
      const auto be = ms::makeCpuBackend(emulate);
      const QString why = badConvBatchNormShapesFail(*be);
      QVERIFY2(why.isEmpty(), qPrintable((emulate ? QStringLiteral("emulated: ") : QString()) + why));
    }
  }

  // The multi-tensor optimizer forms give the single forms' bits segment by segment, on the plain backend
  // and on the emulated device (kCpuSegmentSizes: sizes 1 and 0, odd sizes and offsets, padding left
  // untouched, weight decays 0, 0.1 and 0.02), for AdamW and SGD without momentum, with momentum and
  // Nesterov, over a first step and a second.
  void segmentsMatchSingleForm_data() {
    QTest::addColumn<int>("optimizer");
    QTest::addColumn<bool>("emulate");
    for (int o = 0; o < int(std::size(kSegmentOptimizers)); ++o)
      for (const bool emulate : {false, true})
        QTest::addRow("%s %s", kSegmentOptimizers[o], emulate ? "emulated device" : "plain backend")
            << o << emulate;
  }
  void segmentsMatchSingleForm() {
    QFETCH(int, optimizer);
    QFETCH(bool, emulate);
    const auto be = ms::makeCpuBackend(emulate);
    const SegmentLayout l = segmentLayout(kCpuSegmentSizes);
    const auto opt = SegmentOptimizer(optimizer);
    const std::vector<Output> ref = runSegments(*be, l, opt, false);
    const std::vector<Output> got = runSegments(*be, l, opt, true);
    QCOMPARE(ref.size(), size_t(opt == SegmentOptimizer::AdamW      ? 3
                                : opt == SegmentOptimizer::SgdPlain ? 1
                                                                    : 2));
    // The reference updated every segment and left the padding alone (got is compared with it below).
    std::mt19937 rng(kSeed + 12);
    (void)rnd(rng, l.total);           // runSegments' gradients
    const Vec p0 = rnd(rng, l.total);  // its params before the updates
    for (size_t i = 0; i < l.sizes.size(); ++i) {
      for (size_t j = l.offsets[i] - 3; j < l.offsets[i]; ++j) QCOMPARE(ref[0].f[j], p0[j]);
      size_t moved = 0;
      for (size_t j = l.offsets[i]; j < l.offsets[i] + l.sizes[i]; ++j) moved += ref[0].f[j] != p0[j];
      QVERIFY2(l.sizes[i] == 0 || moved > 0, qPrintable(QStringLiteral("segment %1 not updated").arg(i)));
    }
    const QString why = bitDifference(got, ref);
    QVERIFY2(why.isEmpty(), qPrintable(why));
  }

  // The CUDA multi-tensor launch's plan (host code, so it runs here without a device): every block of the
  // grid lands in the segment the kernel's search gives it (the last with firstBlock <= b) inside that
  // segment's elements, every element is covered once, empty segments take no block, each entry carries
  // its AdamW decay, and a huge total grows the chunk to keep the grid under 2^31 - 1 blocks.
  void cudaSegmentPlan() {
#ifndef MESHSTUDIO_HAVE_CUDA
    QSKIP("built without CUDA");
#else
    const float lr = 3e-3f;
    std::vector<ms::cuda::OptimizerSegmentEntry> e(7);
    const size_t sizes[] = {0, 1, 4096, 0, 4097, 12289, 0};
    for (size_t i = 0; i < e.size(); ++i) {
      e[i].n = sizes[i];
      e[i].weightDecay = i % 2 ? 0.1f : 0.0f;
    }
    const ms::cuda::OptimizerSegmentLaunch launch = ms::cuda::planOptimizerSegments(e.data(), e.size(), lr);
    QCOMPARE(launch.chunk, size_t(4096));
    QCOMPARE(launch.blocks, 1u + 1u + 2u + 4u);
    std::vector<size_t> covered(e.size());
    for (size_t b = 0; b < launch.blocks; ++b) {
      size_t k = 0;
      for (size_t i = 0; i < e.size(); ++i)
        if (e[i].firstBlock <= b) k = i;
      const size_t begin = (b - e[k].firstBlock) * launch.chunk;
      QVERIFY2(begin < e[k].n, qPrintable(QStringLiteral("block %1 starts past segment %2").arg(b).arg(k)));
      covered[k] += std::min(e[k].n - begin, launch.chunk);
    }
    for (size_t i = 0; i < e.size(); ++i) {
      QCOMPARE(covered[i], sizes[i]);
      QCOMPARE(floatToBits(e[i].decay),
               floatToBits(float(1.0 - double(lr) * double(e[i].weightDecay))));  // adamwScalars' decay
    }
    // Nothing to do: no blocks.
    std::vector<ms::cuda::OptimizerSegmentEntry> empty(3);
    QCOMPARE(ms::cuda::planOptimizerSegments(empty.data(), empty.size(), lr).blocks, 0u);
    // 2^44 elements in two segments: the chunk grows.
    std::vector<ms::cuda::OptimizerSegmentEntry> huge(2);
    huge[0].n = size_t(1) << 43;
    huge[1].n = (size_t(1) << 43) + 1;
    const ms::cuda::OptimizerSegmentLaunch big = ms::cuda::planOptimizerSegments(huge.data(), 2, lr);
    QVERIFY(big.chunk > size_t(4096));
    QVERIFY(size_t(big.blocks) < (size_t(1) << 31) - 1);
    QCOMPARE(huge[1].firstBlock, (huge[0].n + big.chunk - 1) / big.chunk);
    QVERIFY(size_t(big.blocks) * big.chunk >= huge[0].n + huge[1].n);
#endif
  }

  // The emulated device refuses host memory where device memory belongs, and device memory as host memory.
  void emulationCatchesMisuse() {
    const auto emu = ms::makeCpuBackend(true);
    Vec host(8, 1.0f);
    float* dev = static_cast<float*>(emu->allocate(8 * sizeof(float)));
    float* dev2 = static_cast<float*>(emu->allocate(8 * sizeof(float)));
    VERIFY_THROWS_DEVICE_FAILURE(emu->reluForward(dev, host.data(), 8), "host pointer");
    VERIFY_THROWS_DEVICE_FAILURE(emu->reluForward(host.data(), dev, 8), "host pointer");
    VERIFY_THROWS_DEVICE_FAILURE(emu->linearForward(dev, dev, host.data(), nullptr, 2, 2, 2), "host pointer");
    VERIFY_THROWS_DEVICE_FAILURE(emu->upload(dev, dev2, 8 * sizeof(float)), "upload");
    VERIFY_THROWS_DEVICE_FAILURE(emu->download(dev2, dev, 8 * sizeof(float)), "download");
    VERIFY_THROWS_DEVICE_FAILURE(emu->upload(host.data(), host.data(), 8 * sizeof(float)), "upload");
    VERIFY_THROWS_DEVICE_FAILURE(emu->copy(host.data(), dev, 8 * sizeof(float)), "copy");
    VERIFY_THROWS_DEVICE_FAILURE(emu->zero(host.data(), 8 * sizeof(float)), "zero");
    const ms::TensorIn ptrs[] = {host.data()};
    const size_t sizes[] = {8};
    VERIFY_THROWS_DEVICE_FAILURE(emu->sumSquares(ptrs, sizes, 1), "host pointer");
    // Correct use goes through, and the plain backend takes host memory everywhere.
    emu->upload(dev, host.data(), 8 * sizeof(float));
    emu->reluForward(dev2, dev, 8);
    Vec back(8);
    emu->download(back.data(), dev2, 8 * sizeof(float));
    QCOMPARE(back, host);
    // The multi-tensor optimizer forms check every segment's pointers, and the segment array itself, before
    // updating any segment.
    float* dev3 = static_cast<float*>(emu->allocate(8 * sizeof(float)));
    const ms::OptimizerSegment good{dev, dev2, dev3, dev3, 8, 0.1f};
    const ms::OptimizerSegment hostV[] = {good, {dev, dev2, dev3, host.data(), 8, 0.0f}};
    VERIFY_THROWS_DEVICE_FAILURE(emu->adamwUpdateSegments(hostV, 2, 1e-3f, 0.9f, 0.95f, 1e-8f, 1, 1.0f),
                                 "host pointer");
    const ms::OptimizerSegment hostParams[] = {good, {host.data(), dev2, dev3, nullptr, 8, 0.0f}};
    VERIFY_THROWS_DEVICE_FAILURE(emu->sgdUpdateSegments(hostParams, 2, 0.1f, 0.9f, false, true, 1.0f),
                                 "host pointer");
    emu->download(back.data(), dev, 8 * sizeof(float));
    QCOMPARE(back, host);  // the good first segment was not updated either
    VERIFY_THROWS_DEVICE_FAILURE(emu->sgdUpdateSegments(reinterpret_cast<const ms::OptimizerSegment*>(dev), 1,
                                                        0.1f, 0.0f, false, true, 1.0f),
                                 "device memory was passed as host memory");
    const auto plain = ms::makeCpuBackend(false);
    Vec out(8);
    plain->reluForward(out.data(), host.data(), 8);
    QCOMPARE(out, host);
    emu->deallocate(dev, 8 * sizeof(float));
    emu->deallocate(dev2, 8 * sizeof(float));
    emu->deallocate(dev3, 8 * sizeof(float));
  }

  // The test's own rounding (the reference below) against hand-worked values and the definition.
  void hostRoundingIsNearestEven() {
    const float one = 1.0f;
    // bf16 keeps 7 mantissa bits: the unit at 1 is 2^-7, so 1 + 2^-8 is a tie.
    QCOMPARE(roundHost(one + std::ldexp(1.0f, -8), 16), one);  // tie, to even (down)
    QCOMPARE(roundHost(one + 3 * std::ldexp(1.0f, -8), 16), one + std::ldexp(1.0f, -6));  // tie, to even (up)
    QCOMPARE(roundHost(one + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20), 16), one + std::ldexp(1.0f, -7));
    QCOMPARE(roundHost(-(one + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 16),
             -(one + std::ldexp(1.0f, -7)));
    QCOMPARE(roundHost(one + std::ldexp(1.0f, -9), 16), one);
    // TF32 keeps 10: the unit at 1 is 2^-10.
    QCOMPARE(roundHost(one + std::ldexp(1.0f, -11), 13), one);
    QCOMPARE(roundHost(one + 3 * std::ldexp(1.0f, -11), 13), one + std::ldexp(1.0f, -9));
    // Carry into the exponent, overflow to infinity, specials, subnormals.
    QCOMPARE(floatToBits(roundHost(bitsToFloat(0x3fffffffu), 16)), 0x40000000u);
    QVERIFY(std::isinf(roundHost(std::numeric_limits<float>::max(), 16)));
    QVERIFY(std::isinf(roundHost(std::numeric_limits<float>::infinity(), 16)));
    QVERIFY(std::isnan(roundHost(std::numeric_limits<float>::quiet_NaN(), 16)));
    QCOMPARE(floatToBits(roundHost(-0.0f, 16)), 0x80000000u);
    QCOMPARE(floatToBits(roundHost(bitsToFloat(0x00008000u), 16)), 0x00000000u);  // subnormal tie to even
    QCOMPARE(floatToBits(roundHost(bitsToFloat(0x00018000u), 16)), 0x00020000u);
    QCOMPARE(floatToBits(roundHost(bitsToFloat(0x00008001u), 16)), 0x00010000u);
    // Random normal floats: the result has the dropped bits clear, is within half a unit, and a tie went to
    // the even neighbour.
    std::mt19937 rng(kSeed);
    std::uniform_int_distribution<uint32_t> bits(0x00800000u, 0x7f7fffffu);
    for (const int drop : {16, 13}) {
      for (int i = 0; i < 100000; ++i) {
        const float x = bitsToFloat(bits(rng) | (i % 2 ? 0x80000000u : 0u));
        const float r = roundHost(x, drop);
        const uint32_t rb = floatToBits(r);
        if (std::isinf(r)) continue;  // rounded past the largest float
        QVERIFY((rb & ((uint32_t(1) << drop) - 1)) == 0);
        const double unit = std::ldexp(1.0, std::ilogb(x) - 23 + drop);
        const double err = std::fabs(double(r) - double(x));
        QVERIFY2(err <= unit / 2,
                 qPrintable(QStringLiteral("%1 -> %2").arg(double(x), 0, 'g', 9).arg(double(r))));
        if (err == unit / 2) QVERIFY(((rb >> drop) & 1u) == 0);
      }
    }
  }

  // Tf32 and Bf16 on the CPU backend (plain and emulated device): exactly the Fp32 ops on operands rounded on
  // the host (the bias gradient, no GEMM, from the unrounded dout), and not the unrounded Fp32 result.
  // The plan's memory model predicts fused attention for the head sizes the CUDA kernel takes.
  void fusedAttentionRuleAgrees() {
#ifdef MESHSTUDIO_HAVE_CUDA
    QCOMPARE(ms::kFusedAttentionMaxHeadSize, ms::cuda::kFlashAttentionMaxHeadSize);
#else
    QSKIP("built without CUDA");
#endif
  }

  // The fused bf16 GELU on the plain and the emulated CPU backend (fusedGeluMatchesSequence).
  void fusedGelu() {
    for (const bool emulate : {false, true}) {
      const auto be = ms::makeCpuBackend(emulate);
      const QString why = fusedGeluMatchesSequence(*be);
      QVERIFY2(why.isEmpty(), qPrintable((emulate ? QStringLiteral("emulated: ") : QString()) + why));
    }
  }

  // Kept bf16 inputs on the plain and the emulated CPU backend (keptBf16InputsHold).
  void keptBf16Inputs() {
    for (const bool emulate : {false, true}) {
      const auto be = ms::makeCpuBackend(emulate);
      const QString why = keptBf16InputsHold(*be);
      QVERIFY2(why.isEmpty(), qPrintable((emulate ? QStringLiteral("emulated: ") : QString()) + why));
    }
  }

  // A bf16 weight (the parameters' working copy) on the plain and the emulated CPU backend
  // (bf16WeightsHold).
  void bf16Weights() {
    for (const bool emulate : {false, true}) {
      const auto be = ms::makeCpuBackend(emulate);
      const QString why = bf16WeightsHold(*be);
      QVERIFY2(why.isEmpty(), qPrintable((emulate ? QStringLiteral("emulated: ") : QString()) + why));
    }
  }

  // Mixed precision's bf16 parameters read by every op (bf16ParametersHold), plain and emulated.
  void bf16Parameters() {
    for (const bool emulate : {false, true}) {
      const auto be = ms::makeCpuBackend(emulate);
      const QString why = bf16ParametersHold(*be);
      QVERIFY2(why.isEmpty(), qPrintable((emulate ? QStringLiteral("emulated: ") : QString()) + why));
    }
  }

  // bf16 gradients accumulated, read by the norm and the optimizer (bf16GradientsHold), plain and emulated.
  void bf16Gradients() {
    for (const bool emulate : {false, true}) {
      const auto be = ms::makeCpuBackend(emulate);
      const QString why = bf16GradientsHold(*be);
      QVERIFY2(why.isEmpty(), qPrintable((emulate ? QStringLiteral("emulated: ") : QString()) + why));
    }
  }

  // RMSNorm with a bf16 weight and weight gradient in Bf16: the emulated device gives the plain backend's
  // bits, and both hold rmsNormBf16Hold (the bits of the fp32 values; refused in Fp32). The six ops in fp32
  // are in emulatedMatchesPlain (the "llama" case).
  void llamaBf16EmulatedMatchesPlain() {
    const auto plain = ms::makeCpuBackend(false);
    const auto emu = ms::makeCpuBackend(true);
    const std::vector<Output> ref = runRmsNormBf16(*plain, true);
    QVERIFY(!ref.empty());
    const QString why = bitDifference(runRmsNormBf16(*emu, true), ref);
    QVERIFY2(why.isEmpty(), qPrintable(why));
    for (ms::Backend* be : {plain.get(), emu.get()}) {
      const QString hold = rmsNormBf16Hold(*be);
      QVERIFY2(hold.isEmpty(),
               qPrintable((be == emu.get() ? QStringLiteral("emulated: ") : QString()) + hold));
    }
  }

  // Bad RoPE shapes throw DeviceFailure naming the op (badRopeShapesFail), plain and emulated.
  void llamaBadRopeShapes() {
    for (const bool emulate : {false, true}) {
      const auto be = ms::makeCpuBackend(emulate);
      const QString why = badRopeShapesFail(*be);
      QVERIFY2(why.isEmpty(), qPrintable((emulate ? QStringLiteral("emulated: ") : QString()) + why));
    }
  }

  // The CPU backends refuse bad MoE shapes as the CUDA one does (badMoeShapesFail).
  void moeBadShapes() {
    for (const bool emulate : {false, true}) {
      const auto be = ms::makeCpuBackend(emulate);
      const QString why = badMoeShapesFail(*be);
      QVERIFY2(why.isEmpty(), qPrintable((emulate ? QStringLiteral("emulated: ") : QString()) + why));
    }
  }

  void gemmPrecisionEmulated_data() {
    QTest::addColumn<int>("precision");
    QTest::addColumn<int>("op");
    QTest::addColumn<int>("shapeIndex");
    for (const ms::GemmPrecision p : {ms::GemmPrecision::Bf16, ms::GemmPrecision::Tf32})
      for (int op = 0; op < int(std::size(kPrecisionOps)); ++op)
        for (int sh = 0; sh < int(std::size(kShapes)); ++sh)
          QTest::addRow("%s %s %s", ms::toString(p), kPrecisionOps[op], kShapes[sh].name)
              << int(p) << op << sh;
  }
  void gemmPrecisionEmulated() {
    QFETCH(int, precision);
    QFETCH(int, op);
    QFETCH(int, shapeIndex);
    const auto p = ms::GemmPrecision(precision);
    const int drop = droppedBits(p);
    const Shape& sh = kShapes[shapeIndex];
    const LinearData ld = linearData(sh);
    const AttentionData ad = attentionData(sh);
    LinearData ldRounded = ld;
    ldRounded.inp = roundedHost(ld.inp, drop);
    ldRounded.w = roundedHost(ld.w, drop);
    ldRounded.dout = roundedHost(ld.dout, drop);
    AttentionData adRounded = ad;
    adRounded.qkv = roundedHost(ad.qkv, drop);
    adRounded.dout = roundedHost(ad.dout, drop);

    const auto fp32 = ms::makeCpuBackend(false);
    QCOMPARE(fp32->gemmPrecision(), ms::GemmPrecision::Fp32);
    const std::vector<Output> ref = runPrecisionOp(*fp32, op, sh, ldRounded, adRounded, &ld.dout);
    const std::vector<Output> unrounded = runPrecisionOp(*fp32, op, sh, ld, ad);
    QVERIFY(!ref.empty());

    for (const bool emulate : {false, true}) {
      const auto be = ms::makeCpuBackend(emulate);
      be->setGemmPrecision(p);
      QCOMPARE(be->gemmPrecision(), p);
      const std::vector<Output> got = runPrecisionOp(*be, op, sh, ld, ad);
      const QString why = bitDifference(got, ref);
      QVERIFY2(why.isEmpty(), qPrintable((emulate ? QStringLiteral("emulated: ") : QString()) + why));
    }

    // Rounding the operands changes every GEMM result; what is no GEMM (the bias gradient) stays fp32. With
    // T = 1 the probabilities are exactly 1 whatever the scores.
    std::vector<std::string> changed, same;
    if (op < 2) {
      changed = {"forward", "dinp", "dweight"};
      same = {"dbias"};
    } else {
      changed = {"out", "dqkv"};
      (sh.T > 1 ? changed : same).push_back("att");
    }
    for (const std::string& name : changed) {
      const Output* r = findOutput(ref, name);
      const Output* u = findOutput(unrounded, name);
      QVERIFY(r && u);
      QVERIFY2(!bitDifference({*r}, {*u}).isEmpty(),
               qPrintable(QStringLiteral("%1: the same as with unrounded operands").arg(name.c_str())));
    }
    for (const std::string& name : same) {
      const Output* r = findOutput(ref, name);
      const Output* u = findOutput(unrounded, name);
      QVERIFY(r && u);
      const QString why = bitDifference({*r}, {*u});
      QVERIFY2(why.isEmpty(), qPrintable(why));
    }
  }

  // Ring attention's block ops (context parallelism) assembled as cp ranks run them (ringCpu, ringBackend):
  // in Fp32 the plain and the emulated CPU backend give the bits of ms::cpu's functions called directly. In
  // Bf16 they give the bits of those functions on q, k, v and dout rounded on the host (and, from a bf16 out,
  // on the out rounded on the host too), and stay within kBf16RingAtol * max(1, max |ref|) of each fp32
  // output (closeDifference). The bound: bf16 rounding moves each operand by at most u = 2^-9 of itself. With
  // q, k, v in [-2, 2] and hs 8 a score q.k / sqrt(hs) moves by at most delta = 2u sqrt(hs) max|q| max|k| =
  // 0.044, which bounds the lse's move by delta and each probability's relative move by exp(2 delta) - 1 =
  // 0.09; out then moves by at most max|v| (0.09 + u) = 0.19. That worst case needs every rounding error of
  // a score to have one sign; they are independent (rms u / sqrt(3) each), so a score moves by about
  // sqrt(2/3) u rms(q_d k_d) = 0.002 rms (rms(q_d k_d) = 4/3; under 0.01 over these < 10^4 scores), and out,
  // lse and the gradients by a few times that: measured at most 0.0069 (out), 0.0075 (lse), 0.0061 (dqkv)
  // absolute, 0.0048 scaled. 2e-2 scaled is four times that, and far below the order-1 differences of a wrong
  // operand, position or merge. The KV = 2 rows (grouped-query attention: 4 query heads over 2 key/value
  // heads, kv drawn on its own in [-2, 2]) have the same hs and operand ranges, so the same bound; each dk
  // and dv sums two query heads' gradients: measured at most 0.0081 (out), 0.0079 (lse), 0.0081 (dqkv)
  // absolute, 0.0042 scaled. A bf16 out in Fp32 is refused naming the op, and so is a KV that does not divide
  // H.
  void ringAttention_data() {
    QTest::addColumn<int>("cp");
    QTest::addColumn<int>("KV");
    QTest::addColumn<bool>("causal");
    for (const int KV : {4, 2})
      for (const int cp : {2, 3})
        for (const bool causal : {true, false})
          QTest::addRow("cp=%d KV=%d %s", cp, KV, causal ? "causal" : "bidirectional") << cp << KV << causal;
  }
  void ringAttention() {
    QFETCH(int, cp);
    QFETCH(int, KV);
    QFETCH(bool, causal);
    const RingShape r{2, 32, 4, KV, cp, 5, causal};
    std::mt19937 rng(kSeed + 80);
    const Vec qkv = rnd(rng, size_t(r.B) * r.T() * 3 * r.C, -2.0f, 2.0f);
    const Vec dout = rnd(rng, size_t(r.B) * r.T() * r.C);
    // KV = H: the k | v columns of qkv (kv empty); else its own KV heads.
    const Vec kv = KV == r.H ? Vec() : rnd(rng, size_t(r.B) * r.T() * 2 * r.Ckv(), -2.0f, 2.0f);
    const Vec kvRounded = roundedHost(kv, 16);
    const std::vector<Output> ref = ringCpu(r, qkv, kv, dout);
    QCOMPARE(ref.back().d.front(), 1.0);  // the k and v parts of every rank's dqkv untouched
    const std::vector<Output> refRounded = ringCpu(r, roundedHost(qkv, 16), kvRounded, roundedHost(dout, 16));
    const std::vector<Output> refRoundedOut =
        ringCpu(r, roundedHost(qkv, 16), kvRounded, roundedHost(dout, 16), true);
    QVERIFY(!bitDifference(refRounded, ref).isEmpty());  // rounding changes the result
    for (const bool emulate : {false, true}) {
      const QString who = emulate ? QStringLiteral("emulated: ") : QString();
      const auto be = ms::makeCpuBackend(emulate);
      QString why = bitDifference(ringBackend(*be, r, qkv, kv, dout), ref);
      QVERIFY2(why.isEmpty(), qPrintable(who + "fp32: " + why));
      {
        Session s(*be);
        auto* kept = reinterpret_cast<ms::bfloat16*>(s.alloc<float>(8));
        float* buf = s.alloc<float>(16);
        VERIFY_THROWS_DEVICE_FAILURE(
            be->attentionBlockBackward(buf, buf, buf, buf, buf, kept, buf, 1, 1, 1, 8, 2, 2, {}, {}, causal),
            "attentionBlockBackward");
        VERIFY_THROWS_DEVICE_FAILURE(
            be->attentionBlockForward(buf, buf, buf, buf, 1, 1, 1, 8, 2, 3, {}, {}, causal, true),
            "the query heads (2) must be a positive multiple of the key/value heads (3)");
        VERIFY_THROWS_DEVICE_FAILURE(
            be->attentionBlockBackward(buf, buf, buf, buf, buf, buf, buf, 1, 1, 1, 8, 2, 0, {}, {}, causal),
            "the query heads (2) must be a positive multiple of the key/value heads (0)");
      }
      be->setGemmPrecision(ms::GemmPrecision::Bf16);
      const std::vector<Output> got = ringBackend(*be, r, qkv, kv, dout);
      why = bitDifference(got, refRounded);
      QVERIFY2(why.isEmpty(), qPrintable(who + "bf16: " + why));
      why = bitDifference(ringBackend(*be, r, qkv, kv, dout, true), refRoundedOut);
      QVERIFY2(why.isEmpty(), qPrintable(who + "bf16 out: " + why));
      why = closeDifference(got, ref, 0.0, kBf16RingAtol);
      QVERIFY2(why.isEmpty(), qPrintable(who + "bf16 against fp32: " + why));
    }
  }

  void marksIncrease() {
    for (const bool emulate : {false, true}) {
      const auto be = ms::makeCpuBackend(emulate);
      const auto epoch = std::chrono::steady_clock::now();
      be->setEpoch(epoch);
      be->clearMarks();
      const int m0 = be->mark();
      QCOMPARE(m0, 0);
      Vec x(1 << 16, 0.5f), y(x.size());
      float* d = static_cast<float*>(be->allocate(x.size() * sizeof(float)));
      be->upload(d, x.data(), x.size() * sizeof(float));
      be->geluForward(d, d, x.size());
      const int m1 = be->mark();
      const int m2 = be->mark();
      QCOMPARE(m1, 1);
      QCOMPARE(m2, 2);
      const double t0 = be->markTime(m0), t1 = be->markTime(m1), t2 = be->markTime(m2);
      QVERIFY(t0 >= 0.0);
      QVERIFY2(t0 <= t1 && t1 <= t2, qPrintable(QStringLiteral("%1 %2 %3").arg(t0).arg(t1).arg(t2)));
      QVERIFY(t2 <= hostSeconds(epoch));
      VERIFY_THROWS_DEVICE_FAILURE(be->markTime(3), "markTime");
      be->clearMarks();
      QCOMPARE(be->mark(), 0);
      be->deallocate(d, x.size() * sizeof(float));
    }
  }
};

// ---- The CUDA backend against the CPU backend
// --------------------------------------------------------------

namespace {

// Sets the GEMM precision of some backends for one scope and restores Fp32 after it (also when a check
// fails and returns early). The CUDA precision is process-wide.
struct PrecisionScope {
  PrecisionScope(ms::GemmPrecision p, std::vector<ms::Backend*> backends) : m_backends(std::move(backends)) {
    for (ms::Backend* b : m_backends) b->setGemmPrecision(p);
  }
  ~PrecisionScope() {
    for (ms::Backend* b : m_backends) b->setGemmPrecision(ms::GemmPrecision::Fp32);
  }
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  std::vector<ms::Backend*> m_backends;
};

// See bf16MatchesCpu.
constexpr double kBf16AttentionAtol = 1e-2;

// The rows of the cases with GEMMs (linear, attention) on every shape.
void addGemmCaseRows() {
  QTest::addColumn<int>("caseIndex");
  QTest::addColumn<int>("shapeIndex");
  for (int c = 0; c < int(std::size(kCases)); ++c) {
    const std::string name = kCases[c].name;
    if (name != "linear" && name != "attention") continue;
    for (int sh = 0; sh < int(std::size(kShapes)); ++sh)
      QTest::addRow("%s %s", kCases[c].name, kShapes[sh].name) << c << sh;
  }
}

}  // namespace

class TestBackendCuda : public QObject {
  Q_OBJECT

 private:
  std::unique_ptr<ms::Backend> m_cuda;
  std::unique_ptr<ms::Backend> m_cpu = ms::makeCpuBackend(false);

 private slots:
  void initTestCase() {
#ifndef MESHSTUDIO_HAVE_CUDA
    QSKIP("no CUDA device: built without CUDA");
#else
    if (ms::cuda::deviceCount() == 0)
      QSKIP(qPrintable(
          QStringLiteral("no CUDA device: %1").arg(QString::fromStdString(ms::cuda::unavailableReason()))));
    ms::cuda::setGemmMode(ms::cuda::GemmMode::Fp32);
    auto made = ms::makeCudaBackend(0);
    QVERIFY2(made.isOk(), made.isOk() ? "" : made.message().c_str());
    m_cuda = std::move(*made);
    qInfo("device 0: %s", m_cuda->info().name.c_str());
#endif
  }

  void cleanupTestCase() {
    m_cuda.reset();
  }

  void info() {
#ifdef MESHSTUDIO_HAVE_CUDA
    const ms::DeviceInfo& i = m_cuda->info();
    QCOMPARE(i.kind, ms::DeviceKind::Cuda);
    QCOMPARE(i.index, 0);
    QVERIFY(!i.name.empty());
    QVERIFY(i.totalBytes > 0);
    QVERIFY2(i.peakFlopsFp32 > 1e12, qPrintable(QString::number(i.peakFlopsFp32)));  // any GPU of the catalog
    QVERIFY(!i.emulated);
    QVERIFY(m_cuda->deviceMemory());
    QVERIFY(ms::computeStream(*m_cuda) != nullptr);
    // The fused kernel up to head size 128 saves (B, H, T); larger heads materialise (B, H, T, T).
    QCOMPARE(m_cuda->attentionSavedFloats(2, 5, 48, 3), size_t(2 * 3 * 5));
    QCOMPARE(m_cuda->attentionScratchFloats(2, 5, 48, 3), size_t(2 * 3 * 5));
    QCOMPARE(m_cuda->attentionSavedFloats(2, 5, 3 * 128, 3), size_t(2 * 3 * 5));
    QCOMPARE(m_cuda->attentionSavedFloats(2, 5, 3 * 129, 3), size_t(2 * 3 * 5 * 5));
    QCOMPARE(m_cuda->attentionScratchFloats(2, 5, 3 * 129, 3), size_t(2 * 3 * 5 * 5));
    {  // bf16: the fused backward's scratch also holds an fp32 copy of a kept bf16 out (B, T, C)
      PrecisionScope bf16(ms::GemmPrecision::Bf16, {m_cuda.get()});
      QCOMPARE(m_cuda->attentionScratchFloats(2, 5, 48, 3), size_t(2 * 3 * 5 + 2 * 5 * 48));
    }
#endif
    {
      PrecisionScope bf16(ms::GemmPrecision::Bf16, {m_cuda.get()});
      QCOMPARE(m_cuda->gemmPrecision(), ms::GemmPrecision::Bf16);
#ifdef MESHSTUDIO_HAVE_CUDA
      QCOMPARE(ms::cuda::gemmMode(), ms::cuda::GemmMode::Bf16);
#endif
    }
    QCOMPARE(m_cuda->gemmPrecision(), ms::GemmPrecision::Fp32);
  }

  // The multi-tensor optimizer forms (one launch over a table uploaded through the pinned buffer) against
  // the CPU's single forms segment by segment, on both gpuSegmentSizes layouts (37 odd sizes with one past
  // 1M elements, one of 1 and an empty one; 300 small ones, which grow the table), padding untouched: within
  // 1e-6 relative, 1e-7 absolute near zero (the GPU may fuse multiply-adds the CPU rounds twice); and
  // against the CUDA single forms segment by segment, bit for bit.
  void segmentsMatchCpu_data() {
    QTest::addColumn<int>("optimizer");
    QTest::addColumn<int>("layout");
    for (int layout = 0; layout < 2; ++layout)
      for (int o = 0; o < int(std::size(kSegmentOptimizers)); ++o)
        QTest::addRow("%s %s", kSegmentOptimizers[o], layout == 0 ? "37 odd" : "300 small") << o << layout;
  }
  void segmentsMatchCpu() {
    QFETCH(int, optimizer);
    QFETCH(int, layout);
    const SegmentLayout l = segmentLayout(gpuSegmentSizes(layout));
    const auto opt = SegmentOptimizer(optimizer);
    const std::vector<Output> ref = runSegments(*m_cpu, l, opt, false);
    const std::vector<Output> got = runSegments(*m_cuda, l, opt, true);
    QVERIFY(!ref.empty());
    const QString why = closeDifference(got, ref, 1e-6, 1e-7);
    QVERIFY2(why.isEmpty(), qPrintable(why));
    // And the CUDA single forms' bits (the same element math and scalars, backend.h's promise).
    const std::vector<Output> single = runSegments(*m_cuda, l, opt, false);
    const QString bits = bitDifference(got, single);
    QVERIFY2(bits.isEmpty(), qPrintable(QStringLiteral("against the CUDA single form: ") + bits));
  }

  void matchesCpu_data() {
    addCaseRows();
  }
  void matchesCpu() {
    QFETCH(int, caseIndex);
    QFETCH(int, shapeIndex);
    const std::vector<Output> ref = runCase(*m_cpu, caseIndex, shapeIndex);
    const std::vector<Output> got = runCase(*m_cuda, caseIndex, shapeIndex);
    // Attention runs the fused kernel here (head sizes <= 128): other sums, and D from dout . out.
    const bool attention = std::string(kCases[caseIndex].name) == "attention";
    const QString why = closeDifference(got, ref, 1e-4, attention ? 1e-4 : 1e-5);
    QVERIFY2(why.isEmpty(), qPrintable(why));
  }

  // Convolution against the CPU backend, fp32 GEMMs (within 1e-4 relative and 1e-5 of the output's scale):
  // the shapes of the CPU suite, plus larger ones: a 3x3 layer of ResNet's second stage over 10 samples
  // (more columns than one im2col pass holds: two chunks), a wider one and the 224x224 stem.
  void convMatchesCpu_data() {
    std::vector<ms::Conv2dShape> shapes(std::begin(kConvShapes), std::end(kConvShapes));
    shapes.push_back({10, 64, 56, 56, 16, 3, 3, 1, 1});
    shapes.push_back({4, 32, 32, 32, 64, 3, 3, 1, 1});
    shapes.push_back({2, 3, 224, 224, 16, 7, 7, 2, 3});
    addConvRows(shapes);
  }
  void convMatchesCpu() {
    const ConvCase c = fetchConvCase();
    const ConvData d = convData(c.s);
    const std::vector<Output> ref = runConv(*m_cpu, c, d);
    const std::vector<Output> got = runConv(*m_cuda, c, d);
    const QString why = closeDifference(got, ref, 1e-4, 1e-5);
    QVERIFY2(why.isEmpty(), qPrintable(why));
  }

  // Convolution in Bf16 against the CPU's emulation (identical bf16 operands, exact products, fp32 sums in
  // another order: the fp32 tolerance), and different from the GPU's fp32 result.
  void convBf16MatchesCpu_data() {
    addConvRows(std::vector<ms::Conv2dShape>(std::begin(kConvShapes), std::end(kConvShapes)));
  }
  void convBf16MatchesCpu() {
    const ConvCase c = fetchConvCase();
    const ConvData d = convData(c.s);
    const std::vector<Output> fp32 = runConv(*m_cuda, c, d);
    PrecisionScope bf16(ms::GemmPrecision::Bf16, {m_cuda.get(), m_cpu.get()});
    const std::vector<Output> ref = runConv(*m_cpu, c, d);
    const std::vector<Output> got = runConv(*m_cuda, c, d);
    const QString why = closeDifference(got, ref, 1e-4, 1e-4);
    QVERIFY2(why.isEmpty(), qPrintable(why));
    QVERIFY(maxScaledDifference({got[0]}, {fp32[0]}) > 1e-5);  // the forward did round
  }

  // Batch norm's parts against the CPU backend: floats within 1e-4 relative and 1e-5 of the scale, the
  // per-channel double sums within 1e-9 relative (other summation orders); plus larger shapes (a ResNet
  // stage's 64 channels of 16 x 56 x 56).
  void batchNormMatchesCpu_data() {
    std::vector<BnShape> shapes(std::begin(kBnShapes), std::end(kBnShapes));
    shapes.push_back({16, 64, 3136});
    shapes.push_back({5, 7, 100003});
    addBnRows(shapes);
  }
  void batchNormMatchesCpu() {
    QFETCH(int, B);
    QFETCH(int, C);
    QFETCH(int, S);
    const BnShape b{B, C, S};
    const BnData d = bnData(b);
    const std::vector<Output> ref = runBatchNorm(*m_cpu, b, d);
    const std::vector<Output> got = runBatchNorm(*m_cuda, b, d);
    const QString why = closeDifference(got, ref, 1e-4, 1e-5);
    QVERIFY2(why.isEmpty(), qPrintable(why));
    // Deterministic: a second run gives the same bits.
    const QString again = bitDifference(runBatchNorm(*m_cuda, b, d), got);
    QVERIFY2(again.isEmpty(), qPrintable(QStringLiteral("second run: ") + again));
  }

  // bf16 parameters, inputs and gradients on the GPU (convBatchNormBf16Hold).
  void convBatchNormBf16() {
    const QString why = convBatchNormBf16Hold(*m_cuda);
    m_cuda->setGemmPrecision(ms::GemmPrecision::Fp32);
    QVERIFY2(why.isEmpty(), qPrintable(why));
  }

  // Bad shapes fail naming the op, and the backend goes on working.
  void convBatchNormBadShapes() {
    const QString why = badConvBatchNormShapesFail(*m_cuda);
    QVERIFY2(why.isEmpty(), qPrintable(why));
    const ConvCase c{"conv", kConvShapes[3], true};
    const QString after =
        closeDifference(runConv(*m_cuda, c, convData(c.s)), runConv(*m_cpu, c, convData(c.s)), 1e-4, 1e-5);
    QVERIFY2(after.isEmpty(), qPrintable(after));
  }

  // Attention on the shapes that matter to the fused kernel (odd T: 5 inside one tile, 67 over three; head
  // sizes 16, 64 and 128; causal and bidirectional; fp32 and bf16) and on a head size of 129, which takes the
  // materialised path: out and dqkv against the CPU backend in the same precision.
  void attentionMatchesCpu_data() {
    QTest::addColumn<int>("B");
    QTest::addColumn<int>("T");
    QTest::addColumn<int>("C");
    QTest::addColumn<int>("H");
    QTest::addColumn<bool>("causal");
    QTest::addColumn<bool>("bf16");
    const int shapes[][4] = {{2, 5, 48, 3},   {2, 67, 48, 3},  {2, 5, 192, 3},
                             {1, 67, 192, 3}, {1, 67, 384, 3}, {1, 37, 387, 3}};
    for (const bool bf16 : {false, true})
      for (const bool causal : {true, false})
        for (const auto& sh : shapes)
          QTest::addRow("%s%s B%d T%d C%d H%d hs%d", bf16 ? "bf16 " : "", causal ? "causal" : "full", sh[0],
                        sh[1], sh[2], sh[3], sh[2] / sh[3])
              << sh[0] << sh[1] << sh[2] << sh[3] << causal << bf16;
  }
  void attentionMatchesCpu() {
    QFETCH(int, B);
    QFETCH(int, T);
    QFETCH(int, C);
    QFETCH(int, H);
    QFETCH(bool, causal);
    QFETCH(bool, bf16);
    const Shape sh{"attention", B, T, C, H, 2, 1, 2, 1};
    const AttentionData d = attentionData(sh);
    const ms::GemmPrecision p = bf16 ? ms::GemmPrecision::Bf16 : ms::GemmPrecision::Fp32;
    PrecisionScope scope(p, {m_cuda.get(), m_cpu.get()});
    const std::vector<Output> ref = runAttention(*m_cpu, sh, causal, d, false);
    const std::vector<Output> got = runAttention(*m_cuda, sh, causal, d, false);
    const QString why = closeDifference(got, ref, 1e-4, bf16 ? kBf16AttentionAtol : 1e-4);
    QVERIFY2(why.isEmpty(), qPrintable(why));
  }

  // Bf16 GEMMs: the CUDA backend against the CPU backend's emulation, both in Bf16 on the cases of matchesCpu
  // that multiply (linear, attention). Linear layers multiply identical bf16 operands (exact products in
  // fp32) and differ only in the order of the fp32 sums: the fp32 tolerance. Attention on the GPU also
  // rounds the probabilities and the pre-softmax gradient to bf16 before their products, which the CPU's
  // emulation does not: each such term moves by at most 2^-8 of itself, which bounds the difference of out
  // by 2^-8 max|v| (v in [-2, 2]: 0.8% of the output scale) and keeps that of dqkv far below (random signs);
  // kBf16AttentionAtol allows for that, a hundred times below what a wrong operand or stride gives.
  void bf16MatchesCpu_data() {
    addGemmCaseRows();
  }
  void bf16MatchesCpu() {
    QFETCH(int, caseIndex);
    QFETCH(int, shapeIndex);
    PrecisionScope bf16(ms::GemmPrecision::Bf16, {m_cuda.get(), m_cpu.get()});
    const std::vector<Output> ref = runCase(*m_cpu, caseIndex, shapeIndex);
    const std::vector<Output> got = runCase(*m_cuda, caseIndex, shapeIndex);
    const bool attention = std::string(kCases[caseIndex].name) == "attention";
    const QString why = closeDifference(got, ref, 1e-4, attention ? kBf16AttentionAtol : 1e-4);
    QVERIFY2(why.isEmpty(), qPrintable(why));
  }

  // The fused bf16 GELU kernels against the kernels of the sequence (fusedGeluMatchesSequence).
  void fusedGelu() {
    const QString why = fusedGeluMatchesSequence(*m_cuda);
    QVERIFY2(why.isEmpty(), qPrintable(why));
  }

  // Kept bf16 inputs on the GPU (keptBf16InputsHold): cuBLAS multiplies the kept copy as it is.
  void keptBf16Inputs() {
    const QString why = keptBf16InputsHold(*m_cuda);
    m_cuda->setGemmPrecision(ms::GemmPrecision::Fp32);
    QVERIFY2(why.isEmpty(), qPrintable(why));
  }

  // Mixed precision's bf16 parameters on the GPU (bf16ParametersHold): the bf16 embedding kernels and the
  // widened parameter vectors give the bits of the fp32 path.
  void bf16Parameters() {
    const QString why = bf16ParametersHold(*m_cuda);
    QVERIFY2(why.isEmpty(), qPrintable(why));
  }

  // bf16 gradients on the GPU (bf16GradientsHold): widened into scratch, accumulated, rounded back; the
  // optimizer's segment kernel and the norm read bf16.
  void bf16Gradients() {
    const QString why = bf16GradientsHold(*m_cuda);
    QVERIFY2(why.isEmpty(), qPrintable(why));
  }

  // A bf16 weight on the GPU (bf16WeightsHold): cuBLAS multiplies the working copy as it is, the same bf16
  // values the per-call conversion of the fp32 weight gives, so the same bits.
  void bf16Weights() {
    const QString why = bf16WeightsHold(*m_cuda);
    m_cuda->setGemmPrecision(ms::GemmPrecision::Fp32);
    QVERIFY2(why.isEmpty(), qPrintable(why));
  }

  // The Llama ops against the CPU backend beyond matchesCpu's shapes (within 1e-4 relative and 1e-5 of the
  // output's scale): Llama-like heads (hs 64 and 128, GQA and MQA) at positions past 4000, where the angles
  // must be formed as on the CPU; RMSNorm over more rows than one slice of the weight-gradient reduction and
  // over a wide row. A second run gives the same bits (no atomics).
  void llamaMatchesCpu_data() {
    QTest::addColumn<int>("B");
    QTest::addColumn<int>("T");
    QTest::addColumn<int>("C");
    QTest::addColumn<int>("H");
    QTest::addColumn<int>("KV");
    QTest::addColumn<int>("hs");
    QTest::addColumn<int>("posStart");
    const int rows[][7] = {{4, 64, 512, 8, 2, 64, 0},
                           {2, 33, 96, 6, 1, 128, 4000},
                           {1, 4099, 33, 4, 4, 8, 0},
                           {3, 5, 4099, 4, 2, 80, 17},
                           {2, 7, 1, 1, 1, 2, 8190}};
    for (const auto& r : rows)
      QTest::addRow("B%d T%d C%d H%d KV%d hs%d pos%d", r[0], r[1], r[2], r[3], r[4], r[5], r[6])
          << r[0] << r[1] << r[2] << r[3] << r[4] << r[5] << r[6];
  }
  void llamaMatchesCpu() {
    QFETCH(int, B);
    QFETCH(int, T);
    QFETCH(int, C);
    QFETCH(int, H);
    QFETCH(int, KV);
    QFETCH(int, hs);
    QFETCH(int, posStart);
    const LlamaShape l{B, T, C, H, KV, hs, posStart};
    auto run = [&](ms::Backend& be) {
      Session s(be);
      llamaOps(s, l, "", kSeed + 67);
      return std::move(s.outputs);
    };
    const std::vector<Output> ref = run(*m_cpu);
    const std::vector<Output> got = run(*m_cuda);
    const QString why = closeDifference(got, ref, 1e-4, 1e-5);
    QVERIFY2(why.isEmpty(), qPrintable(why));
    const QString again = bitDifference(run(*m_cuda), got);
    QVERIFY2(again.isEmpty(), qPrintable(QStringLiteral("second run: ") + again));
  }

  // RMSNorm's bf16 weight and weight gradient on the GPU (rmsNormBf16Hold): widened exactly, accumulated in
  // fp32, rounded once.
  void llamaBf16() {
    const QString why = rmsNormBf16Hold(*m_cuda);
    m_cuda->setGemmPrecision(ms::GemmPrecision::Fp32);
    QVERIFY2(why.isEmpty(), qPrintable(why));
  }

  // Bad RoPE shapes fail naming the op (badRopeShapesFail), and the backend goes on working.
  void llamaBadRopeShapes() {
    const QString why = badRopeShapesFail(*m_cuda);
    QVERIFY2(why.isEmpty(), qPrintable(why));
    auto run = [&](ms::Backend& be) {
      Session s(be);
      llamaCase(s, kShapes[2]);
      return std::move(s.outputs);
    };
    const QString after = closeDifference(run(*m_cuda), run(*m_cpu), 1e-4, 1e-5);
    QVERIFY2(after.isEmpty(), qPrintable(after));
  }

  // The MoE ops against the CPU backend beyond matchesCpu's shapes (within 1e-4 relative and 1e-5 of the
  // output's scale): many tokens on a narrow row, wide rows (C past 4096 and 65536: rowDots' lanes and tail),
  // and more gathered rows than the row loop's grid (grid-stride). A second run gives the same bits.
  void moeMatchesCpu_data() {
    QTest::addColumn<int>("N");
    QTest::addColumn<int>("C");
    const int rows[][2] = {{4099, 33}, {64, 4099}, {3, 65537}, {70000, 8}, {1, 1}};
    for (const auto& r : rows) QTest::addRow("N%d C%d", r[0], r[1]) << r[0] << r[1];
  }
  void moeMatchesCpu() {
    QFETCH(int, N);
    QFETCH(int, C);
    auto run = [&](ms::Backend& be) {
      Session s(be);
      moeOps(s, N, C, "", kSeed + 71);
      return std::move(s.outputs);
    };
    const std::vector<Output> ref = run(*m_cpu);
    const std::vector<Output> got = run(*m_cuda);
    const QString why = closeDifference(got, ref, 1e-4, 1e-5);
    QVERIFY2(why.isEmpty(), qPrintable(why));
    const QString again = bitDifference(run(*m_cuda), got);
    QVERIFY2(again.isEmpty(), qPrintable(QStringLiteral("second run: ") + again));
  }

  // Bad MoE shapes fail naming the op (badMoeShapesFail), and the backend goes on working.
  void moeBadShapes() {
    const QString why = badMoeShapesFail(*m_cuda);
    QVERIFY2(why.isEmpty(), qPrintable(why));
    auto run = [&](ms::Backend& be) {
      Session s(be);
      moeCase(s, kShapes[2]);
      return std::move(s.outputs);
    };
    const QString after = closeDifference(run(*m_cuda), run(*m_cpu), 1e-4, 1e-5);
    QVERIFY2(after.isEmpty(), qPrintable(after));
  }

  // Ring attention's block ops have no CUDA kernel: both throw DeviceFailure naming the op and the CPU
  // backend as the way to run context parallelism.
  // Ring attention's blocks run on the device (kernels/cuda/cuda_ring_attention.cu; tst_cuda_kernels
  // attentionBlock compares them with the CPU's); grouped-query heads that do not divide the query heads are
  // refused by name, as on the CPU.
  void ringAttentionRejectsHeads() {
    Session s(*m_cuda);
    float* buf = s.alloc<float>(256);
    VERIFY_THROWS_DEVICE_FAILURE(
        m_cuda->attentionBlockForward(buf, buf, buf, buf, 1, 2, 2, 12, 3, 2, {}, {}, true, true),
        "attentionBlockForward: the query heads (3) must be a positive multiple of the key/value heads (2)");
    VERIFY_THROWS_DEVICE_FAILURE(
        m_cuda->attentionBlockBackward(buf, buf, buf, buf, buf, buf, buf, 1, 2, 2, 12, 3, 2, {}, {}, true),
        "attentionBlockBackward: the query heads (3) must be a positive multiple of the key/value heads (2)");
  }

  // The mode is applied: Bf16 results differ from Fp32 ones on the same device by the size of bf16 rounding
  // (about 1e-3 of the output scale for these inputs), far beyond the run-to-run noise of fp32 (none: the
  // same cuBLAS kernels are deterministic).
  void bf16DiffersFromFp32_data() {
    addGemmCaseRows();
  }
  void bf16DiffersFromFp32() {
    QFETCH(int, caseIndex);
    QFETCH(int, shapeIndex);
    const std::vector<Output> fp32 = runCase(*m_cuda, caseIndex, shapeIndex);
    std::vector<Output> bf16;
    {
      PrecisionScope scope(ms::GemmPrecision::Bf16, {m_cuda.get()});
      bf16 = runCase(*m_cuda, caseIndex, shapeIndex);
    }
    const double diff = maxScaledDifference(bf16, fp32);
    QVERIFY2(diff > 1e-4, qPrintable(QStringLiteral("bf16 vs fp32: %1 of the output scale").arg(diff)));
  }

  // Allocations are zero-filled and 256-byte aligned, also when the caching allocator hands back memory that
  // was written and freed; memoryInfo sees the device and the pool.
  void memory() {
    const size_t n = (size_t(1) << 20) + 7;
    const Vec ones(n, 1.0f);
    for (int round = 0; round < 3; ++round) {
      float* p = static_cast<float*>(m_cuda->allocate(n * sizeof(float)));
      QVERIFY(reinterpret_cast<uintptr_t>(p) % 256 == 0);
      Vec back(n, 5.0f);
      m_cuda->download(back.data(), p, n * sizeof(float));
      QVERIFY2(std::all_of(back.begin(), back.end(), [](float v) { return v == 0.0f; }),
               qPrintable(QStringLiteral("round %1: not zero-filled").arg(round)));
      m_cuda->upload(p, ones.data(), n * sizeof(float));  // dirty it before it goes back to the pool
      m_cuda->deallocate(p, n * sizeof(float));
    }
    for (size_t bytes : {size_t(1), size_t(3), size_t(257), size_t(4099)}) {
      void* p = m_cuda->allocate(bytes);
      QVERIFY(reinterpret_cast<uintptr_t>(p) % 256 == 0);
      m_cuda->deallocate(p, bytes);
    }
    void* held = m_cuda->allocate(size_t(64) << 20);
    const ms::DeviceMemoryInfo mi = m_cuda->memoryInfo();
    QVERIFY(mi.totalBytes > 0);
    QVERIFY(mi.freeBytes > 0 && mi.freeBytes <= mi.totalBytes);
    QVERIFY2(mi.reservedBytes >= int64_t(64) << 20, qPrintable(QString::number(mi.reservedBytes)));
    m_cuda->deallocate(held, size_t(64) << 20);
    m_cuda->synchronize();
  }

  // Out of memory is a DeviceFailure that says how much was asked and how much is free; the backend goes on.
  void outOfMemory() {
    const size_t tooMuch = size_t(m_cuda->info().totalBytes) * 2;
    VERIFY_THROWS_DEVICE_FAILURE(m_cuda->allocate(tooMuch), std::to_string(tooMuch).c_str());
    VERIFY_THROWS_DEVICE_FAILURE(m_cuda->allocate(tooMuch), "free");
    const Vec x = {1.0f, -2.0f, 3.0f};
    float* p = static_cast<float*>(m_cuda->allocate(x.size() * sizeof(float)));
    m_cuda->upload(p, x.data(), x.size() * sizeof(float));
    Vec back(x.size());
    m_cuda->download(back.data(), p, x.size() * sizeof(float));
    QCOMPARE(back, x);
    m_cuda->deallocate(p, x.size() * sizeof(float));
  }

  // Marks are events on the stream: their times follow their order, the work between them takes time, and
  // they sit inside the host's view of the same interval.
  void marks() {
    const int D = 1024;
    const size_t dd = size_t(D) * D;
    float* a = static_cast<float*>(m_cuda->allocate(dd * sizeof(float)));
    float* b = static_cast<float*>(m_cuda->allocate(dd * sizeof(float)));
    for (int round = 0; round < 2; ++round) {  // the second round reuses the events
      const auto epoch = std::chrono::steady_clock::now();
      m_cuda->setEpoch(epoch);
      m_cuda->clearMarks();
      const double before = hostSeconds(epoch);
      std::vector<int> marks{m_cuda->mark()};
      for (int k = 0; k < 4; ++k) {
        for (int g = 0; g < 10; ++g) m_cuda->linearForward(b, a, a, nullptr, D, D, D);  // 2 GFLOP each
        marks.push_back(m_cuda->mark());
      }
      m_cuda->synchronize();
      const double after = hostSeconds(epoch);
      for (size_t k = 0; k < marks.size(); ++k) QCOMPARE(marks[k], int(k));
      std::vector<double> t;
      for (int m : marks) t.push_back(m_cuda->markTime(m));
      QVERIFY2(t.front() >= before - 1e-3, qPrintable(QStringLiteral("%1 < %2").arg(t.front()).arg(before)));
      QVERIFY2(t.back() <= after + 1e-3, qPrintable(QStringLiteral("%1 > %2").arg(t.back()).arg(after)));
      for (size_t k = 1; k < t.size(); ++k)
        QVERIFY2(t[k] > t[k - 1], qPrintable(QStringLiteral("mark %1 at %2 s, mark %3 at %4 s")
                                                 .arg(k - 1)
                                                 .arg(t[k - 1], 0, 'g', 12)
                                                 .arg(k)
                                                 .arg(t[k], 0, 'g', 12)));
      VERIFY_THROWS_DEVICE_FAILURE(m_cuda->markTime(int(marks.size())), "markTime");
    }
    m_cuda->deallocate(a, dd * sizeof(float));
    m_cuda->deallocate(b, dd * sizeof(float));
  }
};

// "tst_backend" runs the CPU suite; "tst_backend gpu [Qt Test arguments]" runs the CUDA suite.
int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  const bool gpu = argc > 1 && std::strcmp(argv[1], "gpu") == 0;
  if (gpu) {
    args.erase(args.begin() + 1);
    TestBackendCuda suite;
    return QTest::qExec(&suite, int(args.size()), args.data());
  }
  TestBackendCpu suite;
  return QTest::qExec(&suite, int(args.size()), args.data());
}

#include "tst_backend.moc"
