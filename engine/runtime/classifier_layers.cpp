// The layers of the image classifiers: the ViT embedding (patches -> linear -> class token and positions) and
// head (final LayerNorm, class-token or mean pooling, linear, softmax cross-entropy), after Dosovitskiy et
// al. 2021 ("An image is worth 16x16 words", section 3.1); and the mlp's blocks (linear + activation) and
// head. Images are (B, S*S) single-channel; patches (B, NP, P*P); tokens (B, T, C) with T = NP (+1 with cls).
// All tensor work runs through the rank's Backend; the host only sees the downloaded losses and argmax (for
// the loss statistics) and the host batch's labels.
#include <string>
#include <vector>

#include "runtime/layer_impl.h"

namespace ms {
namespace {

// Loss and accuracy of classifier logits (B, K) against labels (B); when training, logits become the loss
// gradient in place (so argmax is taken first). argmax: backend scratch of at least B floats (holds B int32).
// The statistics are counted on the host from the downloaded losses and argmax and the host batch's labels.
LossStats classifyLogits(Backend& be, Buffer& logits, Buffer& losses, float* argmaxScratch,
                         const BatchView& batch, int K, const ForwardMode& mode) {
  const int B = batch.B;
  losses.reserve(B);
  // Buffer and Workspace hold floats; int32 has the same size and alignment, so the scratch holds the labels.
  int32_t* argmax = reinterpret_cast<int32_t*>(argmaxScratch);
  be.argmaxRows(argmax, logits.data(), B, K);
  be.softmaxCrossEntropy(losses.data(), mode.training ? logits.data() : nullptr, logits.data(), batch.targets,
                         B, K, mode.lossScale);
  std::vector<float> hostLosses(B);
  std::vector<int32_t> hostArgmax(B);
  be.download(hostArgmax.data(), argmax, size_t(B) * sizeof(int32_t));
  be.download(hostLosses.data(), losses.data(), size_t(B) * sizeof(float));
  const std::vector<int32_t>& targets = batch.host->targets;
  LossStats s;
  for (int b = 0; b < B; ++b) {
    if (targets[b] < 0) continue;
    s.lossSum += hostLosses[b];
    s.count += 1;
    s.correct += hostArgmax[b] == targets[b] ? 1 : 0;
  }
  return s;
}

// Per-slot activation buffers of the classifier layers.
struct Acts {
  explicit Acts(MemoryTracker* t)
      : a(0, MemoryCategory::Activations, t),
        b(0, MemoryCategory::Activations, t),
        c(0, MemoryCategory::Activations, t),
        d(0, MemoryCategory::Activations, t),
        logits(0, MemoryCategory::Activations, t),
        losses(0, MemoryCategory::Activations, t) {}
  Buffer a, b, c, d, logits, losses;
  LossStats stats;
  bool logitsValid = false;
};

class VitEmbedding final : public Layer {
 public:
  VitEmbedding(const LayerSpec& spec, const LayerContext& ctx)
      : Layer(spec),
        m_be(ctx.backend),
        m_C(ctx.model.width),
        m_S(ctx.model.imageSize),
        m_P(ctx.model.patch),
        m_NP((m_S / m_P) * (m_S / m_P)),
        m_T(ctx.positions),
        m_cls(ctx.model.pool == Pooling::Cls),
        m_caches(ctx.tracker),
        m_ws(ctx.workspace) {
    m_w = bindParam(ctx.params, "patch_embed.weight");
    m_b = bindParam(ctx.params, "patch_embed.bias");
    if (m_cls) m_clsToken = bindParam(ctx.params, "cls_token");
    m_pos = bindParam(ctx.params, "pos_embed");
  }
  int64_t outputFloats(int B) const override { return int64_t(B) * m_T * m_C; }

  void forward(const float*, float* y, const BatchView& batch, const ForwardMode&, int slot) override {
    const int B = batch.B, PP = m_P * m_P;
    Buffer& patches = m_caches[slot].a;
    patches.reserve(size_t(B) * m_NP * PP);                  // (B, NP, P*P)
    float* x = m_ws->get(0, size_t(B) * m_NP * m_C, false);  // (B, NP, C)
    m_be.patchify(patches.data(), batch.images, B, m_S, m_P);
    m_be.linearForward(x, patches.data(), m_w.gemm(), m_b.value(), B * m_NP, PP, m_C);
    m_be.tokensForward(y, x, m_cls ? m_clsToken.value() : nullptr, m_pos.value(), B, m_NP, m_C, m_cls);
  }

  void backward(const float*, const float* dy, float*, const BatchView& batch, int slot,
                BackwardPart part) override {
    if (part == BackwardPart::Weight) return;
    const int B = batch.B, PP = m_P * m_P;
    float* dx = m_ws->get(0, size_t(B) * m_NP * m_C, true);  // (B, NP, C)
    m_be.tokensBackward(dx, m_cls ? m_clsToken.grad() : nullptr, m_pos.grad(), dy, B, m_NP, m_C, m_cls);
    m_be.linearBackward(nullptr, m_w.grad(), m_b.grad(), dx, m_caches[slot].a.data(), m_w.gemm(), B * m_NP,
                        PP, m_C);
  }
  void releaseSlot(int slot) override { m_caches.release(slot); }

 private:
  Backend& m_be;
  int m_C, m_S, m_P, m_NP, m_T;
  bool m_cls;
  BoundParam m_w, m_b, m_clsToken, m_pos;
  SlotCaches<Acts> m_caches;
  Workspace* m_ws;
};

// What the two classifier heads share: per-slot activations holding each microbatch's loss statistics and
// logits, and the accessors over them (the logits of the newest slot, kept by evaluation only).
class ClassifierHead : public Layer {
 public:
  ClassifierHead(const LayerSpec& spec, const LayerContext& ctx)
      : Layer(spec), m_be(ctx.backend), m_ws(ctx.workspace), m_caches(ctx.tracker) {}
  void releaseSlot(int slot) override { m_caches.release(slot); }
  LossStats lossStats(int slot) const override {
    const Acts* c = m_caches.find(slot);
    return c ? c->stats : LossStats{};
  }
  const float* logits() const override {
    const Acts* c = m_caches.find(m_lastSlot);
    return c && c->logitsValid ? c->logits.data() : nullptr;
  }

 protected:
  // The loss statistics of c's logits (argmax in workspace slot 0: a forward uses no other scratch).
  LossStats classify(Acts& c, const BatchView& batch, int K, const ForwardMode& mode) {
    return classifyLogits(m_be, c.logits, c.losses, m_ws->get(0, size_t(batch.B), false), batch, K, mode);
  }
  Backend& m_be;
  Workspace* m_ws;
  SlotCaches<Acts> m_caches;
  int m_lastSlot = 0;
};

class VitHead final : public ClassifierHead {
 public:
  VitHead(const LayerSpec& spec, const LayerContext& ctx)
      : ClassifierHead(spec, ctx),
        m_C(ctx.model.width),
        m_K(ctx.model.classes),
        m_T(ctx.positions),
        m_eps(static_cast<float>(ctx.model.layerNormEps)),
        m_useFirst(ctx.model.pool == Pooling::Cls) {
    m_lnfw = bindParam(ctx.params, "ln_f.weight");
    m_lnfb = bindParam(ctx.params, "ln_f.bias");
    m_w = bindParam(ctx.params, "head.weight");
    m_b = bindParam(ctx.params, "head.bias");
  }
  int64_t outputFloats(int) const override { return 0; }

  // Acts: a = LayerNorm output (B, T, C), b = mean (B, T), c = rstd (B, T), d = pooled (B, C).
  void forward(const float* x, float*, const BatchView& batch, const ForwardMode& mode, int slot) override {
    const int B = batch.B, N = B * m_T;
    Acts& c = m_caches[slot];
    c.a.reserve(size_t(N) * m_C);
    c.b.reserve(N);
    c.c.reserve(N);
    c.d.reserve(size_t(B) * m_C);
    c.logits.reserve(size_t(B) * m_K);  // (B, K)
    m_be.layerNormForward(c.a.data(), c.b.data(), c.c.data(), x, m_lnfw.value(), m_lnfb.value(), N, m_C,
                          m_eps);
    m_be.poolForward(c.d.data(), c.a.data(), B, m_T, m_C, m_useFirst);
    m_be.linearForward(c.logits.data(), c.d.data(), m_w.gemm(), m_b.value(), B, m_C, m_K);
    c.stats = classify(c, batch, m_K, mode);
    c.logitsValid = !mode.training;
    m_lastSlot = slot;
  }

  void backward(const float* x, const float*, float* dx, const BatchView& batch, int slot,
                BackwardPart part) override {
    if (part == BackwardPart::Weight) return;
    const int B = batch.B, N = B * m_T;
    Acts& c = m_caches[slot];
    float* dpooled = m_ws->get(0, size_t(B) * m_C, true);  // (B, C)
    float* dlnf = m_ws->get(1, size_t(N) * m_C, true);     // (B, T, C)
    m_be.linearBackward(dpooled, m_w.grad(), m_b.grad(), c.logits.data(), c.d.data(), m_w.gemm(), B, m_C,
                        m_K);
    m_be.poolBackward(dlnf, dpooled, B, m_T, m_C, m_useFirst);
    m_be.layerNormBackward(dx, m_lnfw.grad(), m_lnfb.grad(), dlnf, x, m_lnfw.value(), c.b.data(), c.c.data(),
                           N, m_C);
  }

 private:
  int m_C, m_K, m_T;
  float m_eps;
  bool m_useFirst;
  BoundParam m_lnfw, m_lnfb, m_w, m_b;
};

class MlpBlock final : public Layer {
 public:
  MlpBlock(const LayerSpec& spec, const LayerContext& ctx, int index)
      : Layer(spec),
        m_be(ctx.backend),
        m_in(static_cast<int>(spec.params[0].shape[0])),
        m_out(static_cast<int>(spec.params[0].shape[1])),
        m_act(ctx.model.activation),
        m_caches(ctx.tracker),
        m_ws(ctx.workspace) {
    const std::string p = "fc." + std::to_string(index) + ".";
    m_w = bindParam(ctx.params, p + "weight");
    m_b = bindParam(ctx.params, p + "bias");
  }
  int64_t outputFloats(int B) const override { return int64_t(B) * m_out; }

  void forward(const float* x, float* y, const BatchView& batch, const ForwardMode&, int slot) override {
    const size_t n = size_t(batch.B) * m_out;
    Buffer& h = m_caches[slot].a;
    h.reserve(n);  // (B, out) pre-activation
    m_be.linearForward(h.data(), x, m_w.gemm(), m_b.value(), batch.B, m_in, m_out);
    switch (m_act) {
      case Activation::Relu:
        m_be.reluForward(y, h.data(), n);
        break;
      case Activation::Gelu:
        m_be.geluForward(y, h.data(), n);
        break;
      case Activation::Tanh:
        m_be.tanhForward(y, h.data(), n);
        break;
    }
  }

  void backward(const float* x, const float* dy, float* dx, const BatchView& batch, int slot,
                BackwardPart part) override {
    if (part == BackwardPart::Weight) return;
    const size_t n = size_t(batch.B) * m_out;
    const Buffer& h = m_caches[slot].a;
    float* dh = m_ws->get(0, n, true);  // (B, out)
    switch (m_act) {
      case Activation::Relu:
        m_be.reluBackward(dh, dy, h.data(), n);
        break;
      case Activation::Gelu:
        m_be.geluBackward(dh, dy, h.data(), n);
        break;
      case Activation::Tanh: {
        // tanhBackward wants the output: recompute it into scratch.
        float* y = m_ws->get(1, n, false);
        m_be.tanhForward(y, h.data(), n);
        m_be.tanhBackward(dh, dy, y, n);
        break;
      }
    }
    m_be.linearBackward(dx, m_w.grad(), m_b.grad(), dh, x, m_w.gemm(), batch.B, m_in, m_out);
  }
  void releaseSlot(int slot) override { m_caches.release(slot); }

 private:
  Backend& m_be;
  int m_in, m_out;
  Activation m_act;
  BoundParam m_w, m_b;
  SlotCaches<Acts> m_caches;
  Workspace* m_ws;
};

class MlpHead final : public ClassifierHead {
 public:
  MlpHead(const LayerSpec& spec, const LayerContext& ctx)
      : ClassifierHead(spec, ctx), m_in(static_cast<int>(spec.params[0].shape[0])), m_K(ctx.model.classes) {
    m_w = bindParam(ctx.params, "head.weight");
    m_b = bindParam(ctx.params, "head.bias");
  }
  int64_t outputFloats(int) const override { return 0; }

  void forward(const float* x, float*, const BatchView& batch, const ForwardMode& mode, int slot) override {
    Acts& c = m_caches[slot];
    c.logits.reserve(size_t(batch.B) * m_K);  // (B, K)
    m_be.linearForward(c.logits.data(), x, m_w.gemm(), m_b.value(), batch.B, m_in, m_K);
    c.stats = classify(c, batch, m_K, mode);
    c.logitsValid = !mode.training;
    m_lastSlot = slot;
  }
  void backward(const float* x, const float*, float* dx, const BatchView& batch, int slot,
                BackwardPart part) override {
    if (part == BackwardPart::Weight) return;
    m_be.linearBackward(dx, m_w.grad(), m_b.grad(), m_caches[slot].logits.data(), x, m_w.gemm(), batch.B,
                        m_in, m_K);
  }

 private:
  int m_in, m_K;
  BoundParam m_w, m_b;
};

// The cnn's head: global average pooling of (B, C, side, side) to (B, C), then the linear classifier.
// The pooling is a GEMM of the (B * C, side^2) rows with a column of ones (exact in every GemmPrecision),
// scaled by 1 / side^2: its backward spreads each gradient over the positions the same way. Keeps the pooled
// features and the logits (the loss gradient after a training forward).
class CnnHead final : public ClassifierHead {
 public:
  CnnHead(const LayerSpec& spec, const LayerContext& ctx)
      : ClassifierHead(spec, ctx),
        m_C(static_cast<int>(spec.params[0].shape[0])),
        m_K(ctx.model.classes),
        m_ones(0, MemoryCategory::Workspace, ctx.tracker) {
    m_w = bindParam(ctx.params, "head.weight");
    m_b = bindParam(ctx.params, "head.bias");
    const std::vector<int> sides = cnnStageSides(ctx.model);
    m_S2 = sides.back() * sides.back();
    m_ones.reserve(size_t(m_S2));
    const std::vector<float> ones(size_t(m_S2), 1.0f);
    m_be.upload(m_ones.data(), ones.data(), ones.size() * sizeof(float));
  }
  int64_t outputFloats(int) const override { return 0; }

  // Acts: a = pooled (B, C).
  void forward(const float* x, float*, const BatchView& batch, const ForwardMode& mode, int slot) override {
    const int B = batch.B;
    Acts& c = m_caches[slot];
    c.a.reserve(size_t(B) * m_C);
    c.logits.reserve(size_t(B) * m_K);
    m_be.linearForward(c.a.data(), x, m_ones.data(), nullptr, B * m_C, m_S2, 1);
    m_be.scale(c.a.data(), 1.0f / float(m_S2), size_t(B) * m_C);
    m_be.linearForward(c.logits.data(), c.a.data(), m_w.gemm(), m_b.value(), B, m_C, m_K);
    c.stats = classify(c, batch, m_K, mode);
    c.logitsValid = !mode.training;
    m_lastSlot = slot;
  }
  void backward(const float* x, const float*, float* dx, const BatchView& batch, int slot,
                BackwardPart part) override {
    if (part == BackwardPart::Weight) return;
    const int B = batch.B;
    Acts& c = m_caches[slot];
    float* dpooled = m_ws->get(0, size_t(B) * m_C, true);
    m_be.linearBackward(dpooled, m_w.grad(), m_b.grad(), c.logits.data(), c.a.data(), m_w.gemm(), B, m_C,
                        m_K);
    m_be.scale(dpooled, 1.0f / float(m_S2), size_t(B) * m_C);
    m_be.linearBackward(dx, nullptr, nullptr, dpooled, x, m_ones.data(), B * m_C, m_S2, 1);
  }

 private:
  int m_C, m_K, m_S2 = 1;
  BoundParam m_w, m_b;
  Buffer m_ones;  // (side^2, 1)
};

}  // namespace

std::unique_ptr<Layer> makeCnnHead(const LayerSpec& spec, const LayerContext& ctx) {
  return std::make_unique<CnnHead>(spec, ctx);
}

std::unique_ptr<Layer> makeVitEmbedding(const LayerSpec& spec, const LayerContext& ctx) {
  return std::make_unique<VitEmbedding>(spec, ctx);
}
std::unique_ptr<Layer> makeVitHead(const LayerSpec& spec, const LayerContext& ctx) {
  return std::make_unique<VitHead>(spec, ctx);
}
std::unique_ptr<Layer> makeMlpBlock(const LayerSpec& spec, const LayerContext& ctx, int index) {
  return std::make_unique<MlpBlock>(spec, ctx, index);
}
std::unique_ptr<Layer> makeMlpHead(const LayerSpec& spec, const LayerContext& ctx) {
  return std::make_unique<MlpHead>(spec, ctx);
}

}  // namespace ms
