// The pre-LayerNorm transformer block shared by gpt (causal) and vit (bidirectional):
//   y = r + MLP(LN2(r)),  r = x + Attn(LN1(x))          (Radford et al. 2019, GPT-2, section 2.3)
// Shapes: x, y (B, T, C); F = mlp_ratio * C; hs = C / H.
#include <string>

#include "kernels/cpu/cpu_ops.h"
#include "runtime/layer_impl.h"

namespace ms {
namespace {

class TransformerBlock final : public Layer {
 public:
  TransformerBlock(const LayerSpec& spec, const LayerContext& ctx, bool causal)
      : Layer(spec),
        m_C(ctx.model.width),
        m_H(ctx.model.heads),
        m_F(ctx.model.mlpRatio * ctx.model.width),
        m_T(ctx.positions),
        m_eps(static_cast<float>(ctx.model.layerNormEps)),
        m_causal(causal),
        m_cache(ctx.tracker),
        m_ws(ctx.workspace) {
    const std::string p = "h." + spec.name.substr(spec.name.find('.') + 1) + ".";
    m_ln1w = bindParam(ctx.params, p + "ln_1.weight");
    m_ln1b = bindParam(ctx.params, p + "ln_1.bias");
    m_qkvw = bindParam(ctx.params, p + "attn.c_attn.weight");
    m_qkvb = bindParam(ctx.params, p + "attn.c_attn.bias");
    m_projw = bindParam(ctx.params, p + "attn.c_proj.weight");
    m_projb = bindParam(ctx.params, p + "attn.c_proj.bias");
    m_ln2w = bindParam(ctx.params, p + "ln_2.weight");
    m_ln2b = bindParam(ctx.params, p + "ln_2.bias");
    m_fcw = bindParam(ctx.params, p + "mlp.c_fc.weight");
    m_fcb = bindParam(ctx.params, p + "mlp.c_fc.bias");
    m_fcprojw = bindParam(ctx.params, p + "mlp.c_proj.weight");
    m_fcprojb = bindParam(ctx.params, p + "mlp.c_proj.bias");
  }

  int64_t outputFloats(int B) const override { return int64_t(B) * m_T * m_C; }

  void forward(const float* x, float* y, const Batch& batch, const ForwardMode&) override {
    const int B = batch.B, T = m_T, C = m_C, F = m_F, H = m_H;
    const int N = B * T;
    m_cache.ensure(B, T, C, F, H);
    Cache& c = m_cache;
    cpu::layerNormForward(c.ln1.data(), c.ln1Mean.data(), c.ln1Rstd.data(), x, m_ln1w.value, m_ln1b.value, N,
                          C, m_eps);
    cpu::linearForward(c.qkv.data(), c.ln1.data(), m_qkvw.value, m_qkvb.value, N, C, 3 * C);
    cpu::attentionForward(c.atty.data(), c.att.data(), c.qkv.data(), B, T, C, H, m_causal);
    cpu::linearForward(c.res1.data(), c.atty.data(), m_projw.value, m_projb.value, N, C, C);
    cpu::add(c.res1.data(), c.res1.data(), x, size_t(N) * C);
    cpu::layerNormForward(c.ln2.data(), c.ln2Mean.data(), c.ln2Rstd.data(), c.res1.data(), m_ln2w.value,
                          m_ln2b.value, N, C, m_eps);
    cpu::linearForward(c.fc.data(), c.ln2.data(), m_fcw.value, m_fcb.value, N, C, F);
    cpu::geluForward(c.gelu.data(), c.fc.data(), size_t(N) * F);
    cpu::linearForward(y, c.gelu.data(), m_fcprojw.value, m_fcprojb.value, N, F, C);
    cpu::add(y, y, c.res1.data(), size_t(N) * C);
  }

  void backward(const float* x, const float* dy, float* dx, const Batch& batch) override {
    const int B = batch.B, T = m_T, C = m_C, F = m_F, H = m_H;
    const int N = B * T;
    const size_t NC = size_t(N) * C, NF = size_t(N) * F;
    Cache& c = m_cache;
    // Scratch from the shared workspace (slots 0-5), zeroed where a backward accumulates into it.
    float* dres1 = m_ws->get(0, NC, false);                       // (B, T, C)
    float* dC = m_ws->get(1, NC, true);                           // (B, T, C)
    float* dF1 = m_ws->get(2, NF, true);                          // (B, T, F)
    float* dF2 = m_ws->get(3, NF, true);                          // (B, T, F)
    float* dqkv = m_ws->get(4, 3 * NC, true);                     // (B, T, 3C)
    float* scratch = m_ws->get(5, size_t(B) * H * T * T, false);  // (B, H, T, T)
    // MLP branch: y = r + fcproj(gelu(fc(ln2(r)))).
    std::copy(dy, dy + NC, dres1);
    cpu::linearBackward(dF1, m_fcprojw.grad, m_fcprojb.grad, dy, c.gelu.data(), m_fcprojw.value, N, F, C);
    cpu::geluBackward(dF2, dF1, c.fc.data(), NF);
    cpu::linearBackward(dC, m_fcw.grad, m_fcb.grad, dF2, c.ln2.data(), m_fcw.value, N, C, F);
    cpu::layerNormBackward(dres1, m_ln2w.grad, m_ln2b.grad, dC, c.res1.data(), m_ln2w.value, c.ln2Mean.data(),
                           c.ln2Rstd.data(), N, C);
    // Attention branch: r = x + proj(attn(qkv(ln1(x)))).
    std::fill(dC, dC + NC, 0.0f);
    cpu::linearBackward(dC, m_projw.grad, m_projb.grad, dres1, c.atty.data(), m_projw.value, N, C, C);
    cpu::attentionBackward(dqkv, scratch, dC, c.qkv.data(), c.att.data(), B, T, C, H, m_causal);
    std::fill(dC, dC + NC, 0.0f);
    cpu::linearBackward(dC, m_qkvw.grad, m_qkvb.grad, dqkv, c.ln1.data(), m_qkvw.value, N, C, 3 * C);
    if (dx) {
      cpu::accumulate(dx, dres1, NC);
      cpu::layerNormBackward(dx, m_ln1w.grad, m_ln1b.grad, dC, x, m_ln1w.value, c.ln1Mean.data(),
                             c.ln1Rstd.data(), N, C);
    } else {
      // First layer of the model: only the parameter gradients of LN1 are wanted.
      cpu::layerNormBackward(dres1, m_ln1w.grad, m_ln1b.grad, dC, x, m_ln1w.value, c.ln1Mean.data(),
                             c.ln1Rstd.data(), N, C);
    }
  }

 private:
  // Saved by forward for backward (activations).
  struct Cache {
    explicit Cache(MemoryTracker* t)
        : ln1(0, MemoryCategory::Activations, t),
          ln1Mean(0, MemoryCategory::Activations, t),
          ln1Rstd(0, MemoryCategory::Activations, t),
          qkv(0, MemoryCategory::Activations, t),
          att(0, MemoryCategory::Activations, t),
          atty(0, MemoryCategory::Activations, t),
          res1(0, MemoryCategory::Activations, t),
          ln2(0, MemoryCategory::Activations, t),
          ln2Mean(0, MemoryCategory::Activations, t),
          ln2Rstd(0, MemoryCategory::Activations, t),
          fc(0, MemoryCategory::Activations, t),
          gelu(0, MemoryCategory::Activations, t) {}
    void ensure(int B, int T, int C, int F, int H) {
      const size_t N = size_t(B) * T;
      ln1.reserve(N * C);                  // (B, T, C)
      ln1Mean.reserve(N);                  // (B, T)
      ln1Rstd.reserve(N);                  // (B, T)
      qkv.reserve(N * 3 * C);              // (B, T, 3C)
      att.reserve(size_t(B) * H * T * T);  // (B, H, T, T)
      atty.reserve(N * C);                 // (B, T, C)
      res1.reserve(N * C);                 // (B, T, C)
      ln2.reserve(N * C);                  // (B, T, C)
      ln2Mean.reserve(N);
      ln2Rstd.reserve(N);
      fc.reserve(N * F);    // (B, T, F)
      gelu.reserve(N * F);  // (B, T, F)
    }
    Buffer ln1, ln1Mean, ln1Rstd, qkv, att, atty, res1, ln2, ln2Mean, ln2Rstd, fc, gelu;
  };
  int m_C, m_H, m_F, m_T;
  float m_eps;
  bool m_causal;
  BoundParam m_ln1w, m_ln1b, m_qkvw, m_qkvb, m_projw, m_projb, m_ln2w, m_ln2b, m_fcw, m_fcb, m_fcprojw,
      m_fcprojb;
  Cache m_cache;
  Workspace* m_ws;
};

}  // namespace

std::unique_ptr<Layer> makeTransformerBlock(const LayerSpec& spec, const LayerContext& ctx, bool causal) {
  return std::make_unique<TransformerBlock>(spec, ctx, causal);
}

}  // namespace ms
