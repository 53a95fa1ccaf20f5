// GPT-2's embedding (token + learned position) and head (final LayerNorm, LM head, softmax cross-entropy).
// The LM head reads the token embedding wte (V, C) when tie_embeddings is on (GPT-2's default), else its own
// lm_head.weight (V, C); both are stored (V, C) as in Hugging Face checkpoints, so logits = x @ W^T.
// All tensor work runs through the rank's Backend; the host only sees the losses (downloaded for the loss
// statistics) and the host batch's targets.
#include <vector>

#include "runtime/layer_impl.h"

namespace ms {
namespace {

class GptEmbedding final : public Layer {
 public:
  GptEmbedding(const LayerSpec& spec, const LayerContext& ctx)
      : Layer(spec),
        m_be(ctx.backend),
        m_C(ctx.model.width),
        m_T(ctx.positions),
        m_Vl(ctx.model.vocab / ctx.tp.size),
        m_tp(ctx.tp) {
    m_wte = bindParam(ctx.params, "wte.weight");
    m_wpe = bindParam(ctx.params, "wpe.weight");
  }
  int64_t outputFloats(int B) const override { return int64_t(B) * m_T * m_C; }
  // Under tensor parallelism wte is split by vocabulary (Megatron-LM): each rank looks up the tokens in its
  // range (0 elsewhere), the pieces are all-reduced, then the positions are added.
  void forward(const float*, float* y, const BatchView& batch, const ForwardMode&, int) override {
    if (m_tp.size == 1) {
      m_be.embeddingForward(y, batch.tokens, m_wte.value(), m_wpe.value(), batch.B, m_T, m_C);
      return;
    }
    const int N = batch.B * m_T, v0 = m_tp.rank * m_Vl;
    m_be.embeddingRangeForward(y, batch.tokens, m_wte.value(), v0, m_Vl, N, m_C);
    m_tp.allReduce(y, size_t(N) * m_C);
    m_be.addPositions(y, m_wpe.value(), batch.B, m_T, m_C);
  }
  // No input gradient; the (cheap) weight gradient is done at once, so a split backward's weight part has
  // nothing left to do (it would need dy kept).
  void backward(const float*, const float* dy, float*, const BatchView& batch, int,
                BackwardPart part) override {
    if (part == BackwardPart::Weight) return;
    if (m_tp.size == 1) {
      m_be.embeddingBackward(m_wte.grad(), m_wpe.grad(), dy, batch.tokens, batch.B, m_T, m_C);
      return;
    }
    const int N = batch.B * m_T, v0 = m_tp.rank * m_Vl;
    m_be.embeddingRangeBackward(m_wte.grad(), dy, batch.tokens, v0, m_Vl, N, m_C);
    m_be.embeddingBackward(nullptr, m_wpe.grad(), dy, batch.tokens, batch.B, m_T, m_C);
  }
  void releaseSlot(int) override {}

 private:
  Backend& m_be;
  int m_C, m_T, m_Vl;
  TensorParallel m_tp;
  BoundParam m_wte, m_wpe;
};

class GptHead final : public Layer {
 public:
  GptHead(const LayerSpec& spec, const LayerContext& ctx)
      : Layer(spec),
        m_be(ctx.backend),
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

  void forward(const float* x, float*, const BatchView& batch, const ForwardMode& mode, int slot) override {
    const int N = batch.B * m_T;
    Cache& c = m_caches[slot];
    c.mean.reserve(N);
    c.rstd.reserve(N);
    c.logits.reserve(size_t(N) * m_Vl);  // (B, T, Vl): logits, then (training) their gradient in place
    c.losses.reserve(N);                 // (B, T)
    // lnf (B, T, C) only feeds the LM head's GEMMs: kept in bf16 in bf16 precision, staged in slot 0 (the
    // size backward takes from it anyway).
    float* lnf = c.lnf.target(size_t(N) * m_C, *m_ws, 0);
    m_be.layerNormForward(lnf, c.mean.data(), c.rstd.data(), x, m_lnfw.value(), m_lnfb.value(), N, m_C,
                          m_eps);
    m_be.linearForwardT(c.logits.data(), c.lnf.keep(lnf), m_w.gemm(), nullptr, N, m_C, m_Vl);
    if (m_tp.size == 1)
      m_be.softmaxCrossEntropy(c.losses.data(), mode.training ? c.logits.data() : nullptr, c.logits.data(),
                               batch.targets, N, m_Vl, mode.lossScale);
    else
      vocabParallelCrossEntropy(c, batch, N, mode);
    // The statistics on the host: the losses come down, the targets are the host batch's.
    m_losses.resize(N);
    m_be.download(m_losses.data(), c.losses.data(), size_t(N) * sizeof(float));
    const std::vector<int32_t>& targets = batch.host->targets;
    c.stats = {};
    for (int i = 0; i < N; ++i) {
      if (targets[i] < 0) continue;
      c.stats.lossSum += m_losses[i];
      c.stats.count += 1;
    }
    c.logitsValid = !mode.training;
    m_lastSlot = slot;
  }

  void backward(const float* x, const float*, float* dx, const BatchView& batch, int slot,
                BackwardPart part) override {
    const int N = batch.B * m_T;
    Cache& c = m_caches[slot];
    if (part == BackwardPart::Weight) {
      m_be.linearBackwardT(nullptr, m_w.grad(), nullptr, c.logits.data(), c.lnf.in(), m_w.gemm(), N, m_C,
                           m_Vl);
      return;
    }
    float* dlnf = m_ws->get(0, size_t(N) * m_C, true);  // (B, T, C)
    m_be.linearBackwardT(dlnf, part == BackwardPart::Input ? nullptr : m_w.grad(), nullptr, c.logits.data(),
                         c.lnf.in(), m_w.gemm(), N, m_C, m_Vl);
    m_tp.allReduce(dlnf, size_t(N) * m_C);
    m_be.layerNormBackward(dx, m_lnfw.grad(), m_lnfb.grad(), dlnf, x, m_lnfw.value(), c.mean.data(),
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
        : lnf(t),
          mean(0, MemoryCategory::Activations, t),
          rstd(0, MemoryCategory::Activations, t),
          logits(0, MemoryCategory::Activations, t),
          losses(0, MemoryCategory::Activations, t) {}
    KeptInput lnf;
    Buffer mean, rstd, logits, losses;
    LossStats stats;
    bool logitsValid = false;
  };

  // Cross-entropy over logits split by vocabulary: per row the global max, the sum of exp(logit - max) and
  // the target's logit are all-reduced; the gradient slice is (softmax - onehot) * lossScale.
  void vocabParallelCrossEntropy(Cache& c, const BatchView& batch, int N, const ForwardMode& mode) {
    const int V = m_Vl, v0 = m_tp.rank * m_Vl;
    float* logits = c.logits.data();
    float* row = m_ws->get(1, size_t(3) * N, false);  // max (N) | sum (N) | target logit (N)
    float* mx = row;
    float* sum = row + N;
    float* tgt = row + 2 * N;
    m_be.rowMax(mx, logits, N, V);
    m_tp.allReduceMax(mx, N);
    m_be.crossEntropyPartials(sum, tgt, logits, mx, batch.targets, v0, N, V);
    m_tp.allReduce(sum, size_t(2) * N);  // sums and target logits together
    m_be.crossEntropyFinish(c.losses.data(), mode.training ? logits : nullptr, logits, mx, sum, tgt,
                            batch.targets, v0, N, V, mode.lossScale);
  }

  Backend& m_be;
  int m_C, m_Vl, m_T;
  float m_eps;
  TensorParallel m_tp;
  BoundParam m_lnfw, m_lnfb, m_w;
  SlotCaches<Cache> m_caches;
  Workspace* m_ws;
  int m_lastSlot = 0;
  std::vector<float> m_losses;  // host copy of a forward's losses (N)
};

}  // namespace

std::unique_ptr<Layer> makeGptEmbedding(const LayerSpec& spec, const LayerContext& ctx) {
  return std::make_unique<GptEmbedding>(spec, ctx);
}
std::unique_ptr<Layer> makeGptHead(const LayerSpec& spec, const LayerContext& ctx) {
  return std::make_unique<GptHead>(spec, ctx);
}

}  // namespace ms
