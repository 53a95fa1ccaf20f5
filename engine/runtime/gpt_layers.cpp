// GPT-2's embedding (token + learned position) and head (final LayerNorm, LM head, softmax cross-entropy).
// The LM head reads the token embedding wte (V, C) when tie_embeddings is on (GPT-2's default), else its own
// lm_head.weight (V, C); both are stored (V, C) as in Hugging Face checkpoints, so logits = x @ W^T.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "runtime/layer_impl.h"

namespace ms {
namespace {

class GptEmbedding final : public Layer {
 public:
  GptEmbedding(const LayerSpec& spec, const LayerContext& ctx)
      : Layer(spec),
        m_C(ctx.model.width),
        m_T(ctx.positions),
        m_Vl(ctx.model.vocab / ctx.tp.size),
        m_tp(ctx.tp) {
    m_wte = bindParam(ctx.params, "wte.weight");
    m_wpe = bindParam(ctx.params, "wpe.weight");
  }
  int64_t outputFloats(int B) const override { return int64_t(B) * m_T * m_C; }
  void forward(const float*, float* y, const Batch& batch, const ForwardMode&, int) override {
    if (m_tp.size == 1) {
      cpu::embeddingForward(y, batch.tokens.data(), m_wte.value(), m_wpe.value(), batch.B, m_T, m_C);
      return;
    }
    const int N = batch.B * m_T, v0 = m_tp.rank * m_Vl;
    const float* wte = m_wte.value();
    const float* wpe = m_wpe.value();
    for (int n = 0; n < N; ++n) {
      float* out = y + size_t(n) * m_C;
      const int local = batch.tokens[n] - v0;
      if (local >= 0 && local < m_Vl)
        std::copy(wte + size_t(local) * m_C, wte + size_t(local + 1) * m_C, out);
      else
        std::fill(out, out + m_C, 0.0f);
    }
    m_tp.allReduce(y, size_t(N) * m_C);
    for (int n = 0; n < N; ++n) cpu::accumulate(y + size_t(n) * m_C, wpe + size_t(n % m_T) * m_C, m_C);
  }
  // No input gradient; the (cheap) weight gradient is done at once, so a split backward's weight part has
  // nothing left to do (it would need dy kept).
  void backward(const float*, const float* dy, float*, const Batch& batch, int, BackwardPart part) override {
    if (part == BackwardPart::Weight) return;
    if (m_tp.size == 1) {
      cpu::embeddingBackward(m_wte.grad(), m_wpe.grad(), dy, batch.tokens.data(), batch.B, m_T, m_C);
      return;
    }
    const int N = batch.B * m_T, v0 = m_tp.rank * m_Vl;
    float* dwte = m_wte.grad();
    for (int n = 0; n < N; ++n) {
      const int local = batch.tokens[n] - v0;
      if (local >= 0 && local < m_Vl) cpu::accumulate(dwte + size_t(local) * m_C, dy + size_t(n) * m_C, m_C);
    }
    cpu::embeddingBackward(nullptr, m_wpe.grad(), dy, batch.tokens.data(), batch.B, m_T, m_C);
  }
  void releaseSlot(int) override {}

 private:
  int m_C, m_T, m_Vl;
  TensorParallel m_tp;
  BoundParam m_wte, m_wpe;
};

class GptHead final : public Layer {
 public:
  GptHead(const LayerSpec& spec, const LayerContext& ctx)
      : Layer(spec),
        m_C(ctx.model.width),
        m_Vl(ctx.model.vocab / ctx.tp.size),
        m_T(ctx.positions),
        m_eps(static_cast<float>(ctx.model.layerNormEps)),
        m_tp(ctx.tp),
        m_caches(ctx.tracker),
        m_ws(ctx.workspace) {
    m_lnfw = bindParam(ctx.params, "ln_f.weight");
    m_lnfb = bindParam(ctx.params, "ln_f.bias");
    m_w = bindParam(ctx.params, ctx.model.tieEmbeddings ? "wte.weight" : "lm_head.weight");
  }
  int64_t outputFloats(int) const override { return 0; }

  void forward(const float* x, float*, const Batch& batch, const ForwardMode& mode, int slot) override {
    const int N = batch.B * m_T;
    Cache& c = m_caches[slot];
    c.lnf.reserve(size_t(N) * m_C);  // (B, T, C)
    c.mean.reserve(N);
    c.rstd.reserve(N);
    c.logits.reserve(size_t(N) * m_Vl);  // (B, T, Vl): logits, then (training) their gradient in place
    c.losses.reserve(N);                 // (B, T)
    cpu::layerNormForward(c.lnf.data(), c.mean.data(), c.rstd.data(), x, m_lnfw.value(), m_lnfb.value(), N,
                          m_C, m_eps);
    cpu::linearForwardT(c.logits.data(), c.lnf.data(), m_w.value(), nullptr, N, m_C, m_Vl);
    if (m_tp.size == 1)
      cpu::softmaxCrossEntropy(c.losses.data(), mode.training ? c.logits.data() : nullptr, c.logits.data(),
                               batch.targets.data(), N, m_Vl, mode.lossScale);
    else
      vocabParallelCrossEntropy(c, batch, N, mode);
    c.stats = {};
    for (int i = 0; i < N; ++i) {
      if (batch.targets[i] < 0) continue;
      c.stats.lossSum += c.losses[i];
      c.stats.count += 1;
    }
    c.logitsValid = !mode.training;
    m_lastSlot = slot;
  }

  void backward(const float* x, const float*, float* dx, const Batch& batch, int slot,
                BackwardPart part) override {
    const int N = batch.B * m_T;
    Cache& c = m_caches[slot];
    if (part == BackwardPart::Weight) {
      cpu::linearBackwardT(nullptr, m_w.grad(), nullptr, c.logits.data(), c.lnf.data(), m_w.value(), N, m_C,
                           m_Vl);
      return;
    }
    float* dlnf = m_ws->get(0, size_t(N) * m_C, true);  // (B, T, C)
    cpu::linearBackwardT(dlnf, part == BackwardPart::Input ? nullptr : m_w.grad(), nullptr, c.logits.data(),
                         c.lnf.data(), m_w.value(), N, m_C, m_Vl);
    m_tp.allReduce(dlnf, size_t(N) * m_C);
    cpu::layerNormBackward(dx, m_lnfw.grad(), m_lnfb.grad(), dlnf, x, m_lnfw.value(), c.mean.data(),
                           c.rstd.data(), N, m_C);
  }

  void releaseSlot(int slot) override { m_caches.release(slot); }
  LossStats lossStats(int slot) const override {
    const Cache* c = m_caches.find(slot);
    return c ? c->stats : LossStats{};
  }
  const float* logits() const override {
    const Cache* c = m_caches.find(m_lastSlot);
    return c && c->logitsValid && m_tp.size == 1 ? c->logits.data() : nullptr;
  }

 private:
  struct Cache {
    explicit Cache(MemoryTracker* t)
        : lnf(0, MemoryCategory::Activations, t),
          mean(0, MemoryCategory::Activations, t),
          rstd(0, MemoryCategory::Activations, t),
          logits(0, MemoryCategory::Activations, t),
          losses(0, MemoryCategory::Activations, t) {}
    Buffer lnf, mean, rstd, logits, losses;
    LossStats stats;
    bool logitsValid = false;
  };

  // Cross-entropy over logits split by vocabulary: per row the global max, the sum of exp(logit - max) and
  // the target's logit are all-reduced; the gradient slice is (softmax - onehot) * lossScale.
  void vocabParallelCrossEntropy(Cache& c, const Batch& batch, int N, const ForwardMode& mode) {
    const int V = m_Vl, v0 = m_tp.rank * m_Vl;
    float* logits = c.logits.data();
    float* row = m_ws->get(1, size_t(3) * N, false);  // max (N) | sum (N) | target logit (N)
    float* mx = row;
    float* sum = row + N;
    float* tgt = row + 2 * N;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      const float* x = logits + size_t(n) * V;
      float m = x[0];
      for (int j = 1; j < V; ++j) m = std::max(m, x[j]);
      mx[n] = m;
    }
    m_tp.allReduceMax(mx, N);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      float* x = logits + size_t(n) * V;
      const int t = batch.targets[n] - v0;
      tgt[n] = batch.targets[n] >= 0 && t >= 0 && t < V ? x[t] : 0.0f;
      float s = 0.0f;
      for (int j = 0; j < V; ++j) s += std::exp(x[j] - mx[n]);
      sum[n] = s;
    }
    m_tp.allReduce(sum, size_t(2) * N);  // sums and target logits together
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      float* x = logits + size_t(n) * V;
      if (batch.targets[n] < 0) {
        c.losses[n] = 0.0f;
        if (mode.training) std::fill(x, x + V, 0.0f);
        continue;
      }
      c.losses[n] = std::log(sum[n]) - (tgt[n] - mx[n]);
      if (!mode.training) continue;
      const float s = mode.lossScale / sum[n];
      for (int j = 0; j < V; ++j) x[j] = std::exp(x[j] - mx[n]) * s;
      const int t = batch.targets[n] - v0;
      if (t >= 0 && t < V) x[t] -= mode.lossScale;
    }
  }

  int m_C, m_Vl, m_T;
  float m_eps;
  TensorParallel m_tp;
  BoundParam m_lnfw, m_lnfb, m_w;
  SlotCaches<Cache> m_caches;
  Workspace* m_ws;
  int m_lastSlot = 0;
};

}  // namespace

std::unique_ptr<Layer> makeGptEmbedding(const LayerSpec& spec, const LayerContext& ctx) {
  return std::make_unique<GptEmbedding>(spec, ctx);
}
std::unique_ptr<Layer> makeGptHead(const LayerSpec& spec, const LayerContext& ctx) {
  return std::make_unique<GptHead>(spec, ctx);
}

}  // namespace ms
