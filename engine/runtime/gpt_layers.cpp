// GPT-2's embedding (token + learned position) and head (final LayerNorm, LM head, softmax cross-entropy).
// The LM head reads the token embedding wte (V, C) when tie_embeddings is on (GPT-2's default), else its own
// lm_head.weight (V, C); both are stored (V, C) as in Hugging Face checkpoints, so logits = x @ W^T.
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "runtime/layer_impl.h"

namespace ms {
namespace {

class GptEmbedding final : public Layer {
 public:
  GptEmbedding(const LayerSpec& spec, const LayerContext& ctx)
      : Layer(spec), m_C(ctx.model.width), m_T(ctx.positions) {
    m_wte = bindParam(ctx.params, "wte.weight");
    m_wpe = bindParam(ctx.params, "wpe.weight");
  }
  int64_t outputFloats(int B) const override { return int64_t(B) * m_T * m_C; }
  void forward(const float*, float* y, const Batch& batch, const ForwardMode&) override {
    cpu::embeddingForward(y, batch.tokens.data(), m_wte.value, m_wpe.value, batch.B, m_T, m_C);
  }
  void backward(const float*, const float* dy, float*, const Batch& batch) override {
    cpu::embeddingBackward(m_wte.grad, m_wpe.grad, dy, batch.tokens.data(), batch.B, m_T, m_C);
  }

 private:
  int m_C, m_T;
  BoundParam m_wte, m_wpe;
};

class GptHead final : public Layer {
 public:
  GptHead(const LayerSpec& spec, const LayerContext& ctx)
      : Layer(spec),
        m_C(ctx.model.width),
        m_V(ctx.model.vocab),
        m_T(ctx.positions),
        m_eps(static_cast<float>(ctx.model.layerNormEps)),
        m_lnf(0, MemoryCategory::Activations, ctx.tracker),
        m_mean(0, MemoryCategory::Activations, ctx.tracker),
        m_rstd(0, MemoryCategory::Activations, ctx.tracker),
        m_logits(0, MemoryCategory::Activations, ctx.tracker),
        m_losses(0, MemoryCategory::Activations, ctx.tracker),
        m_ws(ctx.workspace) {
    m_lnfw = bindParam(ctx.params, "ln_f.weight");
    m_lnfb = bindParam(ctx.params, "ln_f.bias");
    m_w = bindParam(ctx.params, ctx.model.tieEmbeddings ? "wte.weight" : "lm_head.weight");
  }
  int64_t outputFloats(int) const override { return 0; }

  void forward(const float* x, float*, const Batch& batch, const ForwardMode& mode) override {
    const int N = batch.B * m_T;
    m_lnf.reserve(size_t(N) * m_C);  // (B, T, C)
    m_mean.reserve(N);
    m_rstd.reserve(N);
    m_logits.reserve(size_t(N) * m_V);  // (B, T, V): logits, then (training) their gradient in place
    m_losses.reserve(N);                // (B, T)
    cpu::layerNormForward(m_lnf.data(), m_mean.data(), m_rstd.data(), x, m_lnfw.value, m_lnfb.value, N, m_C,
                          m_eps);
    cpu::linearForwardT(m_logits.data(), m_lnf.data(), m_w.value, nullptr, N, m_C, m_V);
    cpu::softmaxCrossEntropy(m_losses.data(), mode.training ? m_logits.data() : nullptr, m_logits.data(),
                             batch.targets.data(), N, m_V, mode.lossScale);
    m_stats = {};
    for (int i = 0; i < N; ++i) {
      if (batch.targets[i] < 0) continue;
      m_stats.lossSum += m_losses[i];
      m_stats.count += 1;
    }
    m_logitsValid = !mode.training;
  }

  void backward(const float* x, const float*, float* dx, const Batch& batch) override {
    const int N = batch.B * m_T;
    float* dlnf = m_ws->get(0, size_t(N) * m_C, true);  // (B, T, C)
    cpu::linearBackwardT(dlnf, m_w.grad, nullptr, m_logits.data(), m_lnf.data(), m_w.value, N, m_C, m_V);
    cpu::layerNormBackward(dx, m_lnfw.grad, m_lnfb.grad, dlnf, x, m_lnfw.value, m_mean.data(), m_rstd.data(),
                           N, m_C);
  }

  LossStats lossStats() const override { return m_stats; }
  const float* logits() const override { return m_logitsValid ? m_logits.data() : nullptr; }

 private:
  int m_C, m_V, m_T;
  float m_eps;
  BoundParam m_lnfw, m_lnfb, m_w;
  Buffer m_lnf, m_mean, m_rstd, m_logits, m_losses;
  Workspace* m_ws;
  LossStats m_stats;
  bool m_logitsValid = false;
};

}  // namespace

std::unique_ptr<Layer> makeGptEmbedding(const LayerSpec& spec, const LayerContext& ctx) {
  return std::make_unique<GptEmbedding>(spec, ctx);
}
std::unique_ptr<Layer> makeGptHead(const LayerSpec& spec, const LayerContext& ctx) {
  return std::make_unique<GptHead>(spec, ctx);
}

}  // namespace ms
