// GPT-2's embedding (token + learned position) and head (final LayerNorm, LM head fused with the softmax
// cross-entropy in training), and llama's: the token embedding alone (rotary embeddings act in attention)
// and the head with a final RMSNorm; Hugging Face's names for each.
// The LM head reads the token embedding wte (V, C) when tie_embeddings is on (GPT-2's default), else its own
// lm_head.weight (V, C); both are stored (V, C) as in Hugging Face checkpoints, so logits = x @ W^T.
// All tensor work runs through the rank's Backend; the host only sees the losses (downloaded for the loss
// statistics) and the host batch's targets.
#include <algorithm>
#include <stdexcept>
#include <string>
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
        m_tp(ctx.tp),
        m_cp(ctx.cp),
        m_ws(ctx.workspace) {
    if (ctx.model.type == ModelType::Llama) {
      m_wte = bindParam(ctx.params, "model.embed_tokens.weight");
      return;
    }
    m_wte = bindParam(ctx.params, "wte.weight");
    m_wpe = bindParam(ctx.params, "wpe.weight");
  }
  int64_t outputFloats(int B) const override { return int64_t(B) * m_T * m_C; }
  // Under tensor parallelism wte is split by vocabulary (Megatron-LM): each rank looks up the tokens in its
  // range (0 elsewhere), the pieces are all-reduced, then the positions are added. In bf16 the all-reduce
  // moves bf16, and loses nothing: each value has one non-zero term, a bf16 working weight.
  void forward(const float*, float* y, const BatchView& batch, const ForwardMode&, int) override {
    if (!m_wpe.store) {  // llama: the tokens' rows (this rank's vocabulary range under TP, all-reduced)
      const int N = batch.B * m_T;
      m_be.embeddingRangeForward(y, batch.tokens, m_wte.value(), m_tp.rank * m_Vl, m_Vl, N, m_C);
      if (m_tp.size > 1) allReduceActivations(m_tp, m_be, *m_ws, y, size_t(N) * m_C);
      return;
    }
    const TensorIn wpe = m_cp.size > 1 ? positionRows() : m_wpe.value();
    if (m_tp.size == 1) {
      m_be.embeddingForward(y, batch.tokens, m_wte.value(), wpe, batch.B, m_T, m_C);
      return;
    }
    const int N = batch.B * m_T, v0 = m_tp.rank * m_Vl;
    m_be.embeddingRangeForward(y, batch.tokens, m_wte.value(), v0, m_Vl, N, m_C);
    allReduceActivations(m_tp, m_be, *m_ws, y, size_t(N) * m_C);
    m_be.addPositions(y, wpe, batch.B, m_T, m_C);
  }
  // No input gradient; the (cheap) weight gradient is done at once, so a split backward's weight part has
  // nothing left to do (it would need dy kept).
  void backward(const float*, const float* dy, float*, const BatchView& batch, int,
                BackwardPart part) override {
    if (part == BackwardPart::Weight) return;
    if (!m_wpe.store)
      return m_be.embeddingRangeBackward(m_wte.grad(), dy, batch.tokens, m_tp.rank * m_Vl, m_Vl,
                                         batch.B * m_T, m_C);
    const GradOut dwpe = m_cp.size > 1 ? positionRowsGrad() : m_wpe.grad();
    if (m_tp.size == 1) {
      m_be.embeddingBackward(m_wte.grad(), dwpe, dy, batch.tokens, batch.B, m_T, m_C, m_Vl);
    } else {
      const int N = batch.B * m_T, v0 = m_tp.rank * m_Vl;
      m_be.embeddingRangeBackward(m_wte.grad(), dy, batch.tokens, v0, m_Vl, N, m_C);
      m_be.embeddingBackward(nullptr, dwpe, dy, batch.tokens, batch.B, m_T, m_C, m_Vl);
    }
    if (m_cp.size > 1) addPositionRowsGrad(dwpe);
  }
  void releaseSlot(int) override {}

 private:
  // Context parallelism: this rank's T positions are two chunks of the sequence (ContextParallel::
  // positionsOf), so its learned positions are wpe's rows of those chunks, gathered contiguous (T, C) in the
  // working precision into workspace slot 0 for the ops that read rows 0 .. T-1; their gradient is taken in
  // slot 1 in the gradients' precision and added to the two chunks' rows of wpe's gradient (the replicas'
  // sum over the dp x cp group then holds every position's).
  static constexpr int kPositionRowsSlot = 0, kPositionGradSlot = 1;
  template <typename Fn>
  void forEachChunk(Fn fn) const {
    const SeqPositions p = m_cp.positionsOf(m_cp.rank, m_T);
    fn(size_t(0), size_t(p.start0), size_t(p.split));
    fn(size_t(p.split), size_t(p.start1), size_t(m_T - p.split));
  }
  TensorIn positionRows() {
    const TensorIn w = m_wpe.value();
    const size_t elem = w.bf16 ? 2 : 4, n = size_t(m_T) * m_C;
    char* rows = reinterpret_cast<char*>(m_ws->get(kPositionRowsSlot, (n * elem + 3) / 4, false));
    const char* src = static_cast<const char*>(w.data);
    forEachChunk([&](size_t row, size_t position, size_t count) {
      m_be.copy(rows + row * m_C * elem, src + position * m_C * elem, count * m_C * elem);
    });
    return w.bf16 ? TensorIn(reinterpret_cast<const bfloat16*>(rows))
                  : TensorIn(reinterpret_cast<float*>(rows));
  }
  GradOut positionRowsGrad() {
    const bool bf16 = m_wpe.grad().bf16;
    const size_t elem = bf16 ? 2 : 4, n = size_t(m_T) * m_C;
    float* rows = m_ws->get(kPositionGradSlot, (n * elem + 3) / 4, false);
    m_be.zero(rows, n * elem);
    return bf16 ? GradOut(reinterpret_cast<bfloat16*>(rows)) : GradOut(rows);
  }
  void addPositionRowsGrad(GradOut rows) {
    const GradOut dwpe = m_wpe.grad();
    const TensorIn in = rows.bf16 ? TensorIn(rows.b16()) : TensorIn(rows.f32());
    forEachChunk([&](size_t row, size_t position, size_t count) {
      m_be.accumulateGrad(dwpe.at(position * m_C), in.at(row * m_C), count * m_C);
    });
  }

  Backend& m_be;
  int m_C, m_T, m_Vl;
  TensorParallel m_tp;
  ContextParallel m_cp;
  Workspace* m_ws;
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
        m_ws(ctx.workspace),
        m_chunkRows(ctx.headChunkRows) {
    if (ctx.model.type == ModelType::Llama) {
      m_lnfw = bindParam(ctx.params, "model.norm.weight");
      m_w = bindParam(ctx.params, ctx.model.tieEmbeddings ? "model.embed_tokens.weight" : "lm_head.weight");
      return;
    }
    m_lnfw = bindParam(ctx.params, "ln_f.weight");
    m_lnfb = bindParam(ctx.params, "ln_f.bias");
    m_w = bindParam(ctx.params, ctx.model.tieEmbeddings ? "wte.weight" : "lm_head.weight");
  }
  int64_t outputFloats(int) const override { return 0; }
  // Training forward runs the LM head's backward (fused with the loss), so it writes the weight gradient.
  bool gradientsInForward() const override { return true; }

  void forward(const float* x, float*, const BatchView& batch, const ForwardMode& mode, int slot) override {
    const int N = batch.B * m_T;
    Cache& c = m_caches[slot];
    if (m_lnfb.store) c.mean.reserve(N);
    c.rstd.reserve(N);
    c.losses.reserve(N);  // (B, T)
    // lnf (B, T, C) is read only within this call: workspace slot 0.
    float* lnf = m_ws->get(0, size_t(N) * m_C, false);
    if (m_lnfb.store)
      m_be.layerNormForward(lnf, c.mean.data(), c.rstd.data(), x, m_lnfw.value(), m_lnfb.value(), N, m_C,
                            m_eps);
    else  // llama's RMSNorm
      m_be.rmsNormForward(lnf, c.rstd.data(), x, m_lnfw.value(), N, m_C, m_eps);
    if (mode.keepLogits && !mode.training) {
      c.logits.reserve(size_t(N) * m_Vl);  // (B, T, Vl), kept for logits()
      m_be.linearForwardT(c.logits.data(), lnf, m_w.gemm(), nullptr, N, m_C, m_Vl);
      crossEntropy(c.logits.data(), c.losses.data(), nullptr, batch.targets, N, 1.0f);
    } else {
      c.logits.clear();  // a kept evaluation's logits
      chunkedHeadLoss(c, lnf, batch, N, mode);
    }
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
    c.logitsValid = mode.keepLogits && !mode.training;
    m_lastSlot = slot;
  }

  // The LM head's gradients were computed in forward: the input part all-reduces the (vocabulary-parallel)
  // partial input gradients (in bf16 in bf16 precision) and runs ln_f's backward; the weight part has nothing
  // left.
  void backward(const float* x, const float*, float* dx, const BatchView& batch, int slot,
                BackwardPart part) override {
    if (part == BackwardPart::Weight) return;
    const int N = batch.B * m_T;
    Cache& c = m_caches[slot];
    float* dlnf = c.dlnf.data();  // (B, T, C)
    allReduceActivations(m_tp, m_be, *m_ws, dlnf, size_t(N) * m_C);
    if (!m_lnfb.store)
      return m_be.rmsNormBackward(dx, m_lnfw.grad(), dlnf, x, m_lnfw.value(), c.rstd.data(), N, m_C);
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
        : mean(0, MemoryCategory::Activations, t),
          rstd(0, MemoryCategory::Activations, t),
          dlnf(0, MemoryCategory::Activations, t),
          logits(0, MemoryCategory::Activations, t),
          losses(0, MemoryCategory::Activations, t) {}
    Buffer mean, rstd, dlnf, logits, losses;
    LossStats stats;
    bool logitsValid = false;
  };

  // The LM head fused with the loss (as Liger-Kernel's fused linear cross-entropy and Wijmans et al. 2024,
  // "Cut Your Losses in Large-Vocabulary Language Models", avoid materialising the logits): per chunk of
  // token rows, logits = lnf W^T into the workspace, loss and (training) (softmax - onehot) * lossScale in
  // place, then dlnf rows = dlogits W and dW += dlogits^T lnf rows. Training forward keeps dlnf (N, C)
  // instead of the logits (N, V): at GPT-2's V = 50304, C = 768 that is 65 times less, and the workspace
  // holds one chunk. The products are those of the unfused head up to the order of dW's fp32 sums over rows.
  // An evaluation computes only the losses, chunk by chunk.
  void chunkedHeadLoss(Cache& c, const float* lnf, const BatchView& batch, int N, const ForwardMode& mode) {
    if (mode.training) {
      c.dlnf.reserve(size_t(N) * m_C);
      m_be.zero(c.dlnf.data(), size_t(N) * m_C * sizeof(float));  // the backward GEMMs accumulate
    }
    const int rows = static_cast<int>(headChunkRows(N, m_Vl, m_chunkRows));
    float* logits = m_ws->get(1, size_t(rows) * m_Vl, false);  // (rows, Vl)
    const GradOut dw = mode.training ? m_w.grad() : GradOut();
    const TensorIn w = m_w.gemm();  // the bf16 working copy in bf16 precision
    for (int r0 = 0; r0 < N; r0 += rows) {
      const int n = std::min(rows, N - r0);
      const float* in = lnf + size_t(r0) * m_C;
      m_be.linearForwardT(logits, in, w, nullptr, n, m_C, m_Vl);
      crossEntropy(logits, c.losses.data() + r0, mode.training ? logits : nullptr, batch.targets + r0, n,
                   mode.lossScale);
      if (!mode.training) continue;
      m_be.linearBackwardT(c.dlnf.data() + size_t(r0) * m_C, dw, nullptr, logits, in, w, n, m_C, m_Vl);
    }
  }

  // Softmax cross-entropy of N rows of (vocabulary-parallel) logits; dlogits (nullable, may alias logits)
  // overwritten with (softmax - onehot) * gradScale.
  void crossEntropy(const float* logits, float* losses, float* dlogits, const int32_t* targets, int N,
                    float gradScale) {
    if (m_tp.size == 1) {
      m_be.softmaxCrossEntropy(losses, dlogits, logits, targets, N, m_Vl, gradScale);
      return;
    }
    // Split by vocabulary (Megatron-LM): per row the global max, the sum of exp(logit - max) and the
    // target's logit are all-reduced; the gradient slice is (softmax - onehot) * gradScale.
    const int v0 = m_tp.rank * m_Vl;
    float* row = m_ws->get(2, size_t(3) * N, false);  // max (N) | sum (N) | target logit (N)
    float* mx = row;
    float* sum = row + N;
    float* tgt = row + 2 * N;
    m_be.rowMax(mx, logits, N, m_Vl);
    m_tp.allReduceMax(mx, N);
    m_be.crossEntropyPartials(sum, tgt, logits, mx, targets, v0, N, m_Vl);
    m_tp.allReduce(sum, size_t(2) * N);  // sums and target logits together
    m_be.crossEntropyFinish(losses, dlogits, logits, mx, sum, tgt, targets, v0, N, m_Vl, gradScale);
  }

  Backend& m_be;
  int m_C, m_Vl, m_T;
  float m_eps;
  TensorParallel m_tp;
  BoundParam m_lnfw, m_lnfb, m_w;
  SlotCaches<Cache> m_caches;
  Workspace* m_ws;
  int64_t m_chunkRows;  // training.head_chunk_rows, 0 = automatic
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
