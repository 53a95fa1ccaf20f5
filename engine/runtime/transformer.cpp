// The pre-norm transformer block shared by gpt (causal) and vit (bidirectional):
//   y = r + MLP(LN2(r)),  r = x + Attn(LN1(x))          (Radford et al. 2019, GPT-2, section 2.3)
// Shapes: x, y (B, T, C); F = mlp_ratio * C; hs = C / H.
// llama's block (Touvron et al. 2023, section 2.2) is the same skeleton with other parts, each behind one
// helper below: RMSNorm for the LayerNorms (rstd only), q, k and v as three nn.Linear (out, in) GEMMs
// without biases whose outputs ropePackQkv rotates (RoPE) and lays out for attention with each key/value
// head repeated for its group of query heads (GQA), an o projection without bias, and a SwiGLU MLP
// (down(silu(gate(h)) * up(h)), F = ffn_hidden) whose gate and up outputs are kept side by side in one
// (B, T, 2Fl) tensor. Tensor parallelism splits q heads and kv heads alike (KVl = KV/tp per rank).
// Tensor parallel over tp ranks (Shoeybi et al. 2019, "Megatron-LM", section 3, figure 3): the q|k|v
// projection and the MLP's first linear are column-parallel (each rank computes H/tp heads and F/tp hidden
// units), the attention output projection and the MLP's second linear row-parallel (each rank's partial sums
// are all-reduced; their biases are added once); LayerNorms run replicated. Local widths: Cl = C/tp, Fl =
// F/tp. Split backward (zero-bubble schedules): the input part computes every input gradient (and the
// LayerNorm parameter gradients, which are tiny) and keeps the four linears' output gradients; the weight
// part turns them into the linears' weight and bias gradients. Sequence parallel (Korthikanti et al. 2022,
// section 4.2.2): inside the block the LayerNorms, the residual additions and the row-parallel biases work on
// this rank's piece of the sequence (Ts = T/tp positions of every sample); an all-gather over the sequence
// feeds each column-parallel linear and a reduce-scatter replaces the row-parallel all-reduce; the LayerNorm
// outputs are kept as this rank's pieces and gathered again for the weight gradients. Between two blocks
// the activation stays in pieces, as in Megatron-LM (LayerSpec::inputPieces and outputPieces: kept, stored
// and sent to the next stage as the rank's (B, Ts, C)); the first block takes its piece of the embedding's
// whole output, and the last one gathers its output whole for the head. So backward gathers the MLP output's
// gradient dy where the output is a piece (Megatron's all-gather in the backward of the MLP's reduce-scatter)
// and the input's gradient where the input is whole. Every op, copy (the sequence shards are strided copy2Ds)
// and zeroing runs through the rank's Backend; the host never touches a tensor.
// Selective recompute (Korthikanti et al. 2022, section 5; plan/recompute.h): the block keeps everything but
// attention's saved (B, Hl, T, T) probabilities; forward writes them to a workspace slot of their own and
// backward re-runs attentionForward from the kept q|k|v into it just before attentionBackward (the same op
// on the same input: the same bits, so losses and gradients are a non-recomputing run's). A backend whose
// attention is fused keeps only each row's log-sum-exp, and there selective changes nothing.
// Context parallelism (ring attention; Liu et al. 2023, "Ring Attention with Blockwise Transformers for
// Near-Infinite Context"): each of the cp ranks of a ring holds T = seq_len / cp positions of every sample,
// chunks r and 2cp-1-r of 2cp (the causal load balance of Megatron-Core's context parallelism), and runs
// everything but attention on them as on any sequence; rotary embeddings take each chunk's positions. For
// attention its keys and values (B, T, 2 KVl hs: the grouped-query heads, bf16 in bf16 precision) travel
// around the ring: at step s a rank computes its queries against the block of rank r - s
// (Backend::attentionBlockForward, merging partial results through each row's log-sum-exp, as FlashAttention
// does) while that block goes on to rank r + 1 and the next one comes from rank r - 1 (isend/irecv overlapped
// with the block's compute). It keeps only the (B, Hl, T) fp32
// log-sum-exps. Backward passes the blocks around again, each with its dK|dV accumulator, which follows its
// block one step after the block's gradient is added (attentionBlockBackward) and is home after cp steps.
// bf16 precision keeps every saved tensor in bf16 but the LayerNorm statistics (and fused attention's fp32
// row log-sum-exps), as Megatron-LM does (Korthikanti et al. 2022, section 4.1): sbh(32 + 2as/h) bytes per
// layer with the block's input, the paper's count without dropout (plan/model_spec.h).
#include <algorithm>
#include <string>
#include <utility>

#include "plan/recompute.h"
#include "plan/tp_overlap.h"
#include "runtime/layer_impl.h"
#include "runtime/moe.h"

namespace ms {
namespace {

class TransformerBlock final : public Layer {
 public:
  TransformerBlock(const LayerSpec& spec, const LayerContext& ctx, bool causal)
      : Layer(spec),
        m_be(ctx.backend),
        m_C(ctx.model.width),
        m_H(ctx.model.heads / ctx.tp.size),
        m_Cl(ctx.model.width / ctx.tp.size),
        m_F(static_cast<int>(ctx.model.mlpHidden() / ctx.tp.size)),
        m_llama(ctx.model.type == ModelType::Llama),
        m_KVl(ctx.model.kvHeadCount() / ctx.tp.size),
        m_hs(ctx.model.width / ctx.model.heads),
        m_theta(static_cast<float>(ctx.model.ropeTheta)),
        m_T(ctx.positions),
        m_eps(static_cast<float>(ctx.model.layerNormEps)),
        m_causal(causal),
        m_tp(ctx.tp),
        m_sp(ctx.tp.sequence && ctx.tp.size > 1),
        m_overlap(m_sp && ctx.tp.overlap),
        m_inPieces(m_sp && spec.inputPieces > 1),
        m_outPieces(m_sp && spec.outputPieces > 1),
        m_cp(ctx.cp),
        m_ring(ctx.cp.size > 1),
        m_caches(ctx.tracker),
        m_ws(ctx.workspace) {
    // The backend materialises the softmax when it saves (H, T, T) per sample (kernels/backend.h).
    m_fused = m_be.attentionSavedFloats(1, m_T, m_Cl, m_H) != size_t(m_H) * m_T * m_T;
    const RecomputePolicy policy{ctx.selectiveRecompute ? Recompute::Selective : Recompute::None, 0};
    // Ring attention keeps no matrix, so selective recompute has nothing to drop.
    m_recomputeAttention = !m_ring && recomputesAttention(policy, ctx.model.type, spec.kind, m_T, m_fused);
    const std::string index = spec.name.substr(spec.name.find('.') + 1);
    if (m_llama) {
      const std::string p = "model.layers." + index + ".";
      m_ln1w = bindParam(ctx.params, p + "input_layernorm.weight");
      m_qkvw = bindParam(ctx.params, p + "self_attn.q_proj.weight");
      m_kw = bindParam(ctx.params, p + "self_attn.k_proj.weight");
      m_vw = bindParam(ctx.params, p + "self_attn.v_proj.weight");
      m_projw = bindParam(ctx.params, p + "self_attn.o_proj.weight");
      m_ln2w = bindParam(ctx.params, p + "post_attention_layernorm.weight");
      std::string mlp = p + "mlp.";
      if (ctx.model.moeBlock(std::stoi(index))) {
        // A mixture of experts: the routed experts in m_moe, the shared ones (if any) as the dense SwiGLU.
        m_moe = std::make_unique<MoeMlp>(ctx, p);
        m_F = static_cast<int>(ctx.model.sharedExperts * ctx.model.expertHidden() / ctx.tp.size);
        m_hasDenseMlp = m_F > 0;
        mlp = p + "mlp.shared_experts.";
      }
      if (!m_hasDenseMlp) return;
      m_fcw = bindParam(ctx.params, mlp + "gate_proj.weight");
      m_upw = bindParam(ctx.params, mlp + "up_proj.weight");
      m_fcprojw = bindParam(ctx.params, mlp + "down_proj.weight");
      return;
    }
    const std::string p = "h." + index + ".";
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

  int64_t outputFloats(int B) const override {
    return int64_t(B) * m_T * m_C / (m_outPieces ? m_tp.size : 1);
  }

  void forward(const float* x, float* y, const BatchView& batch, const ForwardMode& mode, int slot) override {
    const int B = batch.B, T = m_T, C = m_C, Cl = m_Cl;
    const int N = B * T;
    // The mixture of experts' load-balancing loss weighs as much as the microbatch's tokens in the objective.
    m_slot = slot;
    m_auxScale = mode.lossScale * float(N);
    Cache& c = m_caches[slot];
    c.ensure(B, T, m_sp ? m_tp.size : 1, m_llama);
    if (m_sp) return forwardSequenceParallel(x, y, B, c);
    // A row-parallel linear's bias is added by one rank only, so the all-reduced sum holds it once.
    const bool addsBias = m_tp.rank == 0;
    float* ln1 = c.ln1.target(size_t(N) * C, *m_ws, kKeptStaging);
    norm(ln1, c.ln1Mean, c.ln1Rstd, x, m_ln1w, m_ln1b, N);
    float* qkv = c.qkv.target(size_t(N) * 3 * Cl, *m_ws, kQkvSlot);
    qkvForward(qkv, c.ln1.keep(ln1), B);
    c.qkv.keep(qkv);
    float* atty = attentionForward(c, B, qkv);
    float* res1 = c.res1.target(size_t(N) * C, *m_ws, kRes1Slot);
    linear(res1, c.atty.keep(atty), m_projw, addsBias ? bias(m_projb) : nullptr, N, Cl, C);
    allReduceActivations(res1, size_t(N) * C);
    m_be.add(res1, res1, x, size_t(N) * C);
    c.res1.keep(res1);
    float* ln2 = c.ln2.target(size_t(N) * C, *m_ws, kKeptStaging);
    norm(ln2, c.ln2Mean, c.ln2Rstd, res1, m_ln2w, m_ln2b, N);
    mlpForward(c, N, c.ln2.keep(ln2), y, addsBias ? bias(m_fcprojb) : nullptr);
    allReduceActivations(y, size_t(N) * C);
    m_be.add(y, y, res1, size_t(N) * C);
  }

  void backward(const float* x, const float* dy, float* dx, const BatchView& batch, int slot,
                BackwardPart part) override {
    const int B = batch.B, T = m_T, C = m_C, Cl = m_Cl, F = m_F, H = m_H;
    const int N = B * T;
    const size_t NC = size_t(N) * C, NCl = size_t(N) * Cl, NF = size_t(N) * F;
    Cache& c = m_caches[slot];
    if (part == BackwardPart::Weight) {
      // The four linears' weight gradients from the output gradients the input part kept (under sequence
      // parallelism with the LayerNorm outputs gathered again, into workspace slot 6).
      auto whole = [&](const KeptInput& ln) {
        return m_sp ? gatheredLayerNorm(ln.in(), m_ws->get(6, NC, false), B) : ln.in();
      };
      if (m_hasDenseMlp) {
        linearBack(nullptr, m_fcprojw.grad(), biasGrad(m_fcprojb), c.gOut.data(), c.gelu.in(), m_fcprojw, N,
                   F, C);
        mlpInputBackward(nullptr, c.gFc.data(), whole(c.ln2), N, true);
      }
      linearBack(nullptr, m_projw.grad(), biasGrad(m_projb), c.gProj.data(), c.atty.in(), m_projw, N, Cl, C);
      qkvInputBackward(nullptr, c.gQkv.data(), whole(c.ln1), N, true);
      for (Buffer* b : {&c.gOut, &c.gFc, &c.gProj, &c.gQkv}) b->clear();
      return;
    }
    const bool deferWeights = part == BackwardPart::Input;
    m_slot = slot;
    if (m_sp) return backwardSequenceParallel(x, dy, dx, B, c, deferWeights);
    auto wgrad = [&](const BoundParam& p) { return deferWeights ? nullptr : p.grad(); };
    // Scratch from the shared workspace (slots 0-5), zeroed where a backward accumulates into it.
    float* dres1 = m_ws->get(0, NC, false);       // (B, T, C)
    float* dC = m_ws->get(1, NC, true);           // (B, T, C), or (B, T, Cl)
    float* dF1 = m_ws->get(2, NF, true);          // (B, T, Fl)
    float* dF2 = slot3(N, NF * mlpInputParts());  // (B, T, Fl), llama (B, T, 2Fl)
    float* dqkv = m_ws->get(4, 3 * NCl, true);    // (B, T, 3Cl)
    float* scratch = m_ring ? nullptr : m_ws->get(5, m_be.attentionScratchFloats(B, T, Cl, H), false);
    // MLP branch: y = r + fcproj(gelu(fc(ln2(r)))).
    m_be.copy(dres1, dy, NC * sizeof(float));
    if (m_hasDenseMlp) {
      linearBack(dF1, wgrad(m_fcprojw), deferWeights ? nullptr : biasGrad(m_fcprojb), dy, c.gelu.in(),
                 m_fcprojw, N, F, C);
      activationBackward(c, dF2, dF1, NF);
      mlpInputBackward(dC, dF2, c.ln2.in(), N, !deferWeights);
    }
    if (m_moe) m_moe->backward(slot, moeInput(c.ln2.in(), N), dy, dC, N, m_tp.rank == 0);
    allReduceActivations(dC, NC);
    normBack(dres1, dC, c.res1.read(*m_ws), m_ln2w, m_ln2b, c.ln2Mean, c.ln2Rstd, N);
    if (deferWeights) {
      keep(c.gOut, dy, NC);
      keep(c.gFc, dF2, NF * mlpInputParts());
      keep(c.gProj, dres1, NC);
    }
    // Attention branch: r = x + proj(attn(qkv(ln1(x)))).
    m_be.zero(dC, NCl * sizeof(float));
    linearBack(dC, wgrad(m_projw), deferWeights ? nullptr : biasGrad(m_projb), dres1, c.atty.in(), m_projw, N,
               Cl, C);
    attentionBackward(dqkv, scratch, dC, c, B);
    m_be.zero(dC, NC * sizeof(float));
    const float* dproj = qkvGradients(dqkv, B);
    qkvInputBackward(dC, dproj, c.ln1.in(), N, !deferWeights);
    allReduceActivations(dC, NC);
    if (deferWeights) keep(c.gQkv, dproj, qkvProjectionFloats(N));
    if (dx) {
      m_be.accumulate(dx, dres1, NC);
      normBack(dx, dC, x, m_ln1w, m_ln1b, c.ln1Mean, c.ln1Rstd, N);
    } else {
      // First layer of the model: only the parameter gradients of LN1 are wanted.
      normBack(dres1, dC, x, m_ln1w, m_ln1b, c.ln1Mean, c.ln1Rstd, N);
    }
  }

  double auxLoss(int slot) const override { return m_moe ? m_moe->auxLoss(slot) : 0.0; }
  void releaseSlot(int slot) override {
    m_caches.release(slot);
    if (m_moe) m_moe->release(slot);
  }

  void finalizeGrads() override {
    if (!m_sp) return;
    for (const BoundParam* p : {&m_ln1w, &m_ln1b, &m_ln2w, &m_ln2b})
      if (p->store) m_tp.allReduce(p->grad(), p->info().numel);
  }

 private:
  struct Cache;
  // The workspace slot that stages a kept GEMM input in bf16 (KeptInput::target): backward's dF1 (N * Fl), so
  // it is there anyway.
  static constexpr int kKeptStaging = 2;
  // Selective recompute's attention matrix, (B, Hl, T, T), and after it the (B, T, Cl) output its re-run in
  // backward writes and nobody reads: a slot no other use overlaps (the memory model's workspace counts it).
  static constexpr int kAttentionSlot = 8;
  // In bf16, where the KeptTensors stage their fp32 values in forward and widen them in backward: q|k|v
  // (B, T, 3Cl), the attention state, the residual (B, T, C) or (B, Ts, C), the GELU's input (B, T, Fl).
  static constexpr int kQkvSlot = 9, kAttSlot = 10, kRes1Slot = 11, kFcSlot = 12;
  // llama's q, k and v projections in forward (slot 7 is used only by the sequence-parallel backward).
  static constexpr int kQkvProjectionSlot = 7;
  // A mixture of experts' input (slot 14; runtime/moe.cpp takes 15-20).
  static constexpr int kMoeInputSlot = 14;
  // The bf16 staging of the activation collectives (allReduceActivations).
  static constexpr int kCommSlot = kActivationCommSlot;
  // Sequence parallelism, a block whose output stays in pieces: backward's gathered output gradient (B, T,
  // C).
  static constexpr int kOutputGradSlot = 31;
  static_assert(kOutputGradSlot < kLayerScratchSlots);

  // Attention over the q|k|v forward computed: returns its output's staging (KeptInput atty), and saves the
  // state backward needs in the cache (KeptTensor: bf16 probabilities in bf16 where the softmax is
  // materialised, the fp32 row log-sum-exps where it is fused), or under selective recompute in a workspace
  // slot dropped as soon as forward is done with it. Forward's product with V uses the probabilities before
  // they are rounded for keeping (a GEMM's operand is rounded anyway; backward and a selective re-run read
  // the rounded ones).
  float* attentionForward(Cache& c, int B, const float* qkv) {
    const size_t NCl = size_t(B) * m_T * m_Cl, saved = m_be.attentionSavedFloats(B, m_T, m_Cl, m_H);
    float* atty = c.atty.target(NCl, *m_ws, kKeptStaging);
    if (m_ring) {
      float* lse = c.att.target(size_t(B) * m_H * m_T, *m_ws, kAttSlot, /*allowBf16=*/false);
      ringForward(atty, lse, qkv, B);
      return atty;
    }
    // Sized for backward's use too, so the slot is allocated once.
    float* state = m_recomputeAttention ? m_ws->get(kAttentionSlot, saved + NCl, false)
                                        : c.att.target(saved, *m_ws, kAttSlot, !m_fused);
    m_be.attentionForward(atty, state, qkv, B, m_T, m_Cl, m_H, m_causal);
    if (!m_recomputeAttention) c.att.keep(state, false);
    return atty;
  }
  // dqkv (B, T, 3Cl; zeroed by the caller) = attention's input gradient from its output's, dout.
  void attentionBackward(float* dqkv, float* scratch, const float* dout, Cache& c, int B) {
    const float* qkv = c.qkv.read(*m_ws);
    if (m_ring) return ringBackward(dqkv, dout, qkv, c.atty.in(), c.att.read(*m_ws), B);
    m_be.attentionBackward(dqkv, scratch, dout, qkv, attentionState(c, B, qkv), c.atty.in(), B, m_T, m_Cl,
                           m_H, m_causal);
  }

  // ---- ring attention (context parallelism) ----
  // The block that travels: this rank's rotated key and value heads, (B, T, 2 KVl hs) (grouped-query
  // attention's KVl heads, not the H/KV repeated copies q|k|v holds), in bf16 precision as bf16 (the values
  // attention reads are bf16-rounded anyway, so the results are those of an fp32 wire). Workspace slots no
  // other use of the block overlaps: the block in hand and the one arriving, fp32 or bf16; in bf16 the
  // fp32 copy attention reads; in backward the two dK|dV accumulators (fp32). The memory model counts four
  // blocks' fp32 size either way.
  static constexpr int kRingKv = 24, kRingKvNext = 25, kRingDkv = 26, kRingDkvNext = 27, kRingKvWide = 28;
  static constexpr int kRingTagKv = 1, kRingTagDkv = 2;
  size_t ringBlockFloats(int B) const { return size_t(B) * m_T * 2 * m_KVl * m_hs; }
  bool ringBf16() const { return m_be.gemmPrecision() == GemmPrecision::Bf16; }
  int ringNext() const { return (m_cp.rank + 1) % m_cp.size; }
  int ringPrev() const { return (m_cp.rank + m_cp.size - 1) % m_cp.size; }
  // The rank whose block a rank holds at ring step s.
  int ringSource(int s) const { return (m_cp.rank - s + m_cp.size) % m_cp.size; }
  // Starts sending `send` to the next rank and receiving the previous rank's into `recv` (n elements each).
  std::pair<CommRequestPtr, CommRequestPtr> ringShift(const void* send, void* recv, size_t n, CommType type,
                                                      int tag) const {
    auto r = m_cp.comm->irecv(recv, n, type, ringPrev(), tag);
    if (!r) throw CommFailure("ring attention: " + r.status().message());
    auto s = m_cp.comm->isend(send, n, type, ringNext(), tag);
    if (!s) throw CommFailure("ring attention: " + s.status().message());
    return {std::move(*s), std::move(*r)};
  }
  static void ringWait(std::pair<CommRequestPtr, CommRequestPtr>& reqs) {
    for (CommRequestPtr* q : {&reqs.first, &reqs.second}) {
      if (!*q) continue;
      Status s = (*q)->wait();
      q->reset();
      if (!s) throw CommFailure("ring attention: " + s.message());
    }
  }
  // Copies head g * (H / KVl) of each group of q|k|v's k and v parts (the repeated copies are equal) into
  // kv (B, T, 2 KVl hs), or with `back` the other way, into the first head of each group (the rest stay as
  // they are: zero in the gradient, whose repeated heads ropeUnpackQkv sums).
  void ringHeads(float* kv, float* qkv, int B, bool back) const {
    const size_t f = sizeof(float), hs = size_t(m_hs), kvw = size_t(m_KVl) * hs, rows = size_t(B) * m_T;
    const size_t rep = size_t(m_H / m_KVl);
    for (size_t part = 0; part < 2; ++part)
      for (size_t g = 0; g < size_t(m_KVl); ++g) {
        float* blockCol = kv + part * kvw + g * hs;
        float* qkvCol = qkv + size_t(m_Cl) * (1 + part) + g * rep * hs;
        if (back)
          m_be.copy2D(qkvCol, 3 * size_t(m_Cl) * f, blockCol, 2 * kvw * f, hs * f, rows);
        else
          m_be.copy2D(blockCol, 2 * kvw * f, qkvCol, 3 * size_t(m_Cl) * f, hs * f, rows);
      }
  }
  // The two buffers a block travels in (fp32, or bf16 staged in the same slots) and the fp32 block attention
  // reads at step s: the one in hand, or in bf16 its widened copy.
  struct RingBlocks {
    void* wire[2];
    float* wide;
  };
  RingBlocks ringBlocks(int B, const float* qkv) {
    const size_t n = ringBlockFloats(B);
    const size_t floats = ringBf16() ? (n + 1) / 2 : n;
    RingBlocks r{{m_ws->get(kRingKv, floats, false), m_ws->get(kRingKvNext, floats, false)}, nullptr};
    r.wide = ringBf16() ? m_ws->get(kRingKvWide, n, false) : static_cast<float*>(r.wire[0]);
    ringHeads(r.wide, const_cast<float*>(qkv), B, false);
    if (ringBf16()) m_be.toBf16(static_cast<bfloat16*>(r.wire[0]), r.wide, n);
    return r;
  }
  const float* ringHeld(RingBlocks& r, int s, int B) {
    if (!ringBf16()) return static_cast<const float*>(r.wire[s % 2]);
    if (s > 0) m_be.fromBf16(r.wide, static_cast<const bfloat16*>(r.wire[s % 2]), ringBlockFloats(B));
    return r.wide;
  }
  std::pair<CommRequestPtr, CommRequestPtr> ringPass(RingBlocks& r, int s, int B) {
    if (s + 1 >= m_cp.size) return {};
    return ringShift(r.wire[s % 2], r.wire[(s + 1) % 2], ringBlockFloats(B),
                     ringBf16() ? CommType::BF16 : CommType::F32, kRingTagKv);
  }
  // out (B, T, Cl) and lse (B, Hl, T) from this rank's q|k|v and every rank's keys and values.
  void ringForward(float* out, float* lse, const float* qkv, int B) {
    RingBlocks blocks = ringBlocks(B, qkv);
    const SeqPositions mine = m_cp.positionsOf(m_cp.rank, m_T);
    for (int s = 0; s < m_cp.size; ++s) {
      const float* held = ringHeld(blocks, s, B);
      auto shift = ringPass(blocks, s, B);
      m_be.attentionBlockForward(out, lse, qkv, held, B, m_T, m_T, m_Cl, m_H, m_KVl, mine,
                                 m_cp.positionsOf(ringSource(s), m_T), m_causal, s == 0);
      ringWait(shift);
    }
  }
  // dqkv (zeroed) = the q|k|v gradient from dout, with out and lse as forward left them.
  void ringBackward(float* dqkv, const float* dout, const float* qkv, TensorIn out, const float* lse, int B) {
    const size_t n = ringBlockFloats(B);
    RingBlocks blocks = ringBlocks(B, qkv);
    float* dkv[2] = {m_ws->get(kRingDkv, n, true), m_ws->get(kRingDkvNext, n, false)};
    const SeqPositions mine = m_cp.positionsOf(m_cp.rank, m_T);
    for (int s = 0; s < m_cp.size; ++s) {
      const float* held = ringHeld(blocks, s, B);
      float* acc = dkv[s % 2];
      auto shift = ringPass(blocks, s, B);
      m_be.attentionBlockBackward(dqkv, acc, dout, qkv, held, out, lse, B, m_T, m_T, m_Cl, m_H, m_KVl, mine,
                                  m_cp.positionsOf(ringSource(s), m_T), m_causal);
      ringWait(shift);
      // The accumulator follows its block; after the last step it is this rank's own, home.
      auto back = ringShift(acc, dkv[(s + 1) % 2], n, CommType::F32, kRingTagDkv);
      ringWait(back);
    }
    ringHeads(dkv[m_cp.size % 2], dqkv, B, true);
  }
  // The positions of row chunk h (0 or 1) of this rank's sequence and the rows it starts at: the whole
  // sequence (one chunk at 0) without context parallelism.
  int ropeChunks() const { return m_ring ? 2 : 1; }
  int ropeChunkRows() const { return m_T / ropeChunks(); }
  int ropeChunkStart(int h) const {
    if (!m_ring) return 0;
    const SeqPositions p = m_cp.positionsOf(m_cp.rank, m_T);
    return h == 0 ? p.start0 : p.start1;
  }

  // The attention state backward reads: the cache's, or under selective recompute the matrix re-made from
  // the kept q|k|v by the very op forward ran (and in bf16 rounded as the cache keeps it), so bit for bit
  // what a run without recompute reads.
  const float* attentionState(Cache& c, int B, const float* qkv) {
    if (!m_recomputeAttention) return c.att.read(*m_ws);
    const size_t NCl = size_t(B) * m_T * m_Cl, saved = m_be.attentionSavedFloats(B, m_T, m_Cl, m_H);
    float* att = m_ws->get(kAttentionSlot, saved + NCl, false);
    m_be.attentionForward(att + saved, att, qkv, B, m_T, m_Cl, m_H, m_causal);
    if (m_be.gemmPrecision() == GemmPrecision::Bf16) {
      // The slot that stages the kept probabilities without recompute, unused here.
      auto* rounded = reinterpret_cast<bfloat16*>(m_ws->get(kAttSlot, (saved + 1) / 2, false));
      m_be.toBf16(rounded, att, saved);
      m_be.fromBf16(att, rounded, saved);
    }
    return att;
  }
  // The MLP from ln_2's output (N, C): fc, GELU and fcproj into out (partial sums under TP; the bias added
  // when given), keeping the GELU's input and output. out may hold ln2 (fc has read it before fcproj writes).
  // llama: gate and up side by side into the kept fc (N, 2Fl), SwiGLU into the kept "gelu" (N, Fl), down.
  void mlpForward(Cache& c, int N, TensorIn ln2, float* out, TensorIn fcprojBias) {
    if (!m_moe) return denseMlpForward(c, N, ln2, out, fcprojBias);
    // A mixture of experts: the shared experts (the dense path) write out, the routed ones add to it. The
    // experts read ln2 from a copy of their own (out may hold ln2).
    const float* x = moeInput(ln2, N);
    if (m_hasDenseMlp)
      denseMlpForward(c, N, ln2, out, fcprojBias);
    else
      m_be.zero(out, size_t(N) * m_C * sizeof(float));
    m_moe->forward(m_slot, x, out, N, m_auxScale);
  }
  // ln2 (N, C) as fp32 values in workspace slot kMoeInputSlot (widened where kept in bf16).
  const float* moeInput(TensorIn ln2, int N) {
    const size_t n = size_t(N) * m_C;
    float* x = m_ws->get(kMoeInputSlot, n, false);
    if (ln2.bf16)
      m_be.fromBf16(x, ln2.b16(), n);
    else
      m_be.copy(x, ln2.f32(), n * sizeof(float));
    return x;
  }
  void denseMlpForward(Cache& c, int N, TensorIn ln2, float* out, TensorIn fcprojBias) {
    const size_t NF = size_t(N) * m_F;
    if (m_llama) {
      float* gu = c.fc.target(2 * NF, *m_ws, kFcSlot);
      m_be.linearForwardT(gu, ln2, m_fcw.gemm(), nullptr, N, m_C, m_F);
      m_be.linearForwardT(gu + NF, ln2, m_upw.gemm(), nullptr, N, m_C, m_F);
      c.fc.keep(gu);  // in bf16 the product below reads the rounded gate and up, as backward will
      float* h = c.gelu.target(NF, *m_ws, kKeptStaging);
      m_be.swigluForward(h, gu, gu + NF, NF);
      m_be.linearForwardT(out, c.gelu.keep(h), m_fcprojw.gemm(), nullptr, N, m_F, m_C);
      return;
    }
    float* fc = c.fc.target(NF, *m_ws, kFcSlot);
    m_be.linearForward(fc, ln2, m_fcw.gemm(), m_fcb.value(), N, m_C, m_F);
    float* gelu = c.gelu.target(NF, *m_ws, kKeptStaging);
    if (c.fc.bf16() && c.gelu.bf16()) {
      // Both kept in bf16: one pass rounds fc into its storage and writes the GELU of the rounded values
      // rounded into the GELU's, bit for bit the unfused sequence below (Backend::geluForwardBf16).
      m_be.geluForwardBf16(c.fc.storage(), c.gelu.storage(), fc, NF);
      m_be.linearForward(out, c.gelu.in(), m_fcprojw.gemm(), fcprojBias, N, m_F, m_C);
      return;
    }
    c.fc.keep(fc);
    m_be.geluForward(gelu, fc, NF);
    m_be.linearForward(out, c.gelu.keep(gelu), m_fcprojw.gemm(), fcprojBias, N, m_F, m_C);
  }
  // tp_comm_overlap: the dense MLP of a sequence-parallel block from ln_2's output shard (B, Ts, C), gathered
  // into `whole` (N * C floats of room) chunk by chunk beside the first GEMM's rows, the output projection's
  // rows reduce-scattered into ys (B, Ts, C) chunk by chunk: denseMlpForward's values.
  void denseMlpForwardOverlapped(Cache& c, int B, TensorIn ln2, float* whole, float* ys) {
    const int N = B * m_T;
    const size_t NF = size_t(N) * m_F;
    const TensorIn in = wholeOf(ln2, whole);
    TensorIn h;  // the output projection's input
    if (m_llama) {
      float* gu = c.fc.target(2 * NF, *m_ws, kFcSlot);
      gatherOverlapped(whole, ln2, B, false, [&](int row0, int n) {
        const size_t r0 = size_t(row0);
        m_be.linearForwardT(gu + r0 * m_F, in.at(r0 * m_C), m_fcw.gemm(), nullptr, n, m_C, m_F);
        m_be.linearForwardT(gu + NF + r0 * m_F, in.at(r0 * m_C), m_upw.gemm(), nullptr, n, m_C, m_F);
      });
      c.fc.keep(gu);
      float* act = c.gelu.target(NF, *m_ws, kKeptStaging);
      m_be.swigluForward(act, gu, gu + NF, NF);
      h = c.gelu.keep(act);
    } else {
      float* fc = c.fc.target(NF, *m_ws, kFcSlot);
      gatherOverlapped(whole, ln2, B, false, [&](int row0, int n) {
        const size_t r0 = size_t(row0);
        m_be.linearForward(fc + r0 * m_F, in.at(r0 * m_C), m_fcw.gemm(), m_fcb.value(), n, m_C, m_F);
      });
      float* gelu = c.gelu.target(NF, *m_ws, kKeptStaging);
      if (c.fc.bf16() && c.gelu.bf16()) {
        m_be.geluForwardBf16(c.fc.storage(), c.gelu.storage(), fc, NF);
        h = c.gelu.in();
      } else {
        c.fc.keep(fc);
        m_be.geluForward(gelu, fc, NF);
        h = c.gelu.keep(gelu);
      }
    }
    reduceScatterOverlapped(ys, B, [&](int row0, int n, float* out) {
      linear(out, h.at(size_t(row0) * m_F), m_fcprojw, nullptr, n, m_F, m_C);
    });
  }
  // The gathered whole of a kept shard as a GEMM input: `into` read as the shard's element type.
  static TensorIn wholeOf(TensorIn shard, const float* into) {
    return shard.bf16 ? TensorIn(reinterpret_cast<const bfloat16*>(into)) : TensorIn(into);
  }
  // dF2 += gelu'(fc) * dF1, reading the kept GELU input where it is (bf16 without widening it first);
  // llama: dF2 (N, 2Fl) += the SwiGLU's gate and up gradients.
  void activationBackward(Cache& c, float* dF2, const float* dF1, size_t NF) {
    if (m_llama) {
      const float* gu = c.fc.read(*m_ws);
      return m_be.swigluBackward(dF2, dF2 + NF, dF1, gu, gu + NF, NF);
    }
    if (c.fc.bf16()) return m_be.geluBackwardBf16(dF2, dF1, c.fc.storage(), NF);
    m_be.geluBackward(dF2, dF1, c.fc.read(*m_ws), NF);
  }
  // The MLP's input-side GEMMs backward from their output gradients dF2 ((N, Fl); llama's gate and up
  // (N, 2Fl)): dln2 (N, C, nullable) +=, and with `weights` the weight (and bias) gradients from ln2.
  size_t mlpInputParts() const { return m_llama ? 2 : 1; }
  void mlpInputBackward(float* dln2, const float* dF2, TensorIn ln2, int N, bool weights) {
    if (!m_llama)
      return m_be.linearBackward(dln2, weights ? m_fcw.grad() : nullptr, weights ? m_fcb.grad() : nullptr,
                                 dF2, ln2, m_fcw.gemm(), N, m_C, m_F);
    const size_t NF = size_t(N) * m_F;
    m_be.linearBackwardT(dln2, weights ? m_fcw.grad() : nullptr, nullptr, dF2, ln2, m_fcw.gemm(), N, m_C,
                         m_F);
    m_be.linearBackwardT(dln2, weights ? m_upw.grad() : nullptr, nullptr, dF2 + NF, ln2, m_upw.gemm(), N, m_C,
                         m_F);
  }

  // The input gradient alone of rows row0 .. row0 + n (of N) from dF2: out (n, C) += (tp_comm_overlap).
  void mlpInputRows(float* out, const float* dF2, int N, int row0, int n) {
    const size_t r0 = size_t(row0) * m_F;
    if (!m_llama)
      return m_be.linearBackward(out, nullptr, nullptr, dF2 + r0, TensorIn(), m_fcw.gemm(), n, m_C, m_F);
    m_be.linearBackwardT(out, nullptr, nullptr, dF2 + r0, TensorIn(), m_fcw.gemm(), n, m_C, m_F);
    m_be.linearBackwardT(out, nullptr, nullptr, dF2 + size_t(N) * m_F + r0, TensorIn(), m_upw.gemm(), n, m_C,
                         m_F);
  }

  // ---- the parts gpt and llama do differently ----
  // out (N, OC) = in W + bias: gpt's Conv1D (C, OC) weights, llama's nn.Linear (OC, C).
  void linear(float* out, TensorIn in, const BoundParam& w, TensorIn bias, int N, int C, int OC) {
    if (m_llama) return m_be.linearForwardT(out, in, w.gemm(), bias, N, C, OC);
    m_be.linearForward(out, in, w.gemm(), bias, N, C, OC);
  }
  void linearBack(float* din, GradOut dw, GradOut db, const float* dout, TensorIn in, const BoundParam& w,
                  int N, int C, int OC) {
    if (m_llama) return m_be.linearBackwardT(din, dw, db, dout, in, w.gemm(), N, C, OC);
    m_be.linearBackward(din, dw, db, dout, in, w.gemm(), N, C, OC);
  }
  // llama has no biases: unbound parameters read as none.
  static TensorIn bias(const BoundParam& b) { return b.store ? b.value() : TensorIn(); }
  static GradOut biasGrad(const BoundParam& b) { return b.store ? b.grad() : GradOut(); }
  // LayerNorm (mean and rstd kept) or RMSNorm (rstd kept) over rows of C.
  void norm(float* out, Buffer& mean, Buffer& rstd, const float* x, const BoundParam& w, const BoundParam& b,
            int N) {
    if (m_llama) return m_be.rmsNormForward(out, rstd.data(), x, w.value(), N, m_C, m_eps);
    m_be.layerNormForward(out, mean.data(), rstd.data(), x, w.value(), b.value(), N, m_C, m_eps);
  }
  // din += the norm's input gradient from dout; the weight (and bias) gradients +=.
  void normBack(float* din, const float* dout, const float* x, const BoundParam& w, const BoundParam& b,
                const Buffer& mean, const Buffer& rstd, int N) {
    if (m_llama) return m_be.rmsNormBackward(din, w.grad(), dout, x, w.value(), rstd.data(), N, m_C);
    m_be.layerNormBackward(din, w.grad(), b.grad(), dout, x, w.value(), mean.data(), rstd.data(), N, m_C);
  }
  // The q|k|v attention reads, (B, T, 3Cl), from the first norm's output (N, C): gpt's one GEMM; llama's
  // three (q (N, Hl hs), k and v (N, KVl hs) side by side in workspace slot 7, free in forward) rotated and
  // head-repeated by ropePackQkv.
  size_t qkvProjectionFloats(int N) const {
    return size_t(N) * (m_llama ? size_t(m_H + 2 * m_KVl) * m_hs : 3 * size_t(m_Cl));
  }
  void qkvForward(float* qkv, TensorIn ln1, int B) {
    qkvProject(qkv, ln1, B * m_T, 0, B * m_T);
    if (m_llama) qkvPack(qkv, B);
  }
  // The projections of ln1's rows row0 .. row0 + n (of N): into qkv for gpt, for llama into q, k and v
  // (workspace slot kQkvProjectionSlot, which qkvPack then rotates into qkv).
  void qkvProject(float* qkv, TensorIn ln1, int N, int row0, int n) {
    const size_t r0 = size_t(row0);
    if (!m_llama)
      return m_be.linearForward(qkv + r0 * 3 * m_Cl, ln1.at(r0 * m_C), m_qkvw.gemm(), m_qkvb.value(), n, m_C,
                                3 * m_Cl);
    const size_t kvw = size_t(m_KVl) * m_hs;
    float* q = m_ws->get(kQkvProjectionSlot, qkvProjectionFloats(N), false);
    float* k = q + size_t(N) * m_Cl;
    float* v = k + size_t(N) * kvw;
    const TensorIn in = ln1.at(r0 * m_C);
    m_be.linearForwardT(q + r0 * m_Cl, in, m_qkvw.gemm(), nullptr, n, m_C, m_Cl);
    m_be.linearForwardT(k + r0 * kvw, in, m_kw.gemm(), nullptr, n, m_C, int(kvw));
    m_be.linearForwardT(v + r0 * kvw, in, m_vw.gemm(), nullptr, n, m_C, int(kvw));
  }
  // llama: q, k and v (qkvProject's) rotated by their positions and packed as attention reads them.
  void qkvPack(float* qkv, int B) {
    const int N = B * m_T;
    float* q = m_ws->get(kQkvProjectionSlot, qkvProjectionFloats(N), false);
    float* k = q + size_t(N) * m_Cl;
    float* v = k + size_t(N) * m_KVl * m_hs;
    if (!m_ring) return m_be.ropePackQkv(qkv, q, k, v, B, m_T, m_H, m_KVl, m_hs, m_theta, 0);
    // Context parallelism: each sample's two chunks rotate by their own positions, a (1, T/2) slice at a
    // time.
    const size_t kvw = size_t(m_KVl) * m_hs, rows = size_t(ropeChunkRows());
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < ropeChunks(); ++h) {
        const size_t r0 = size_t(b) * m_T + size_t(h) * rows;
        m_be.ropePackQkv(qkv + r0 * 3 * m_Cl, q + r0 * m_Cl, k + r0 * kvw, v + r0 * kvw, 1, int(rows), m_H,
                         m_KVl, m_hs, m_theta, ropeChunkStart(h));
      }
  }
  // The gradients of the q|k|v projections' outputs from attention's dqkv: dqkv itself for gpt; llama's
  // dq|dk|dv (rotated back, the repeated heads summed) in workspace slot 3, whose MLP gradients are done
  // with by now.
  const float* qkvGradients(const float* dqkv, int B) {
    if (!m_llama) return dqkv;
    const int N = B * m_T;
    float* dq = slot3(N, 0);
    float* dk = dq + size_t(N) * m_Cl;
    float* dv = dk + size_t(N) * m_KVl * m_hs;
    if (!m_ring) {
      m_be.ropeUnpackQkv(dq, dk, dv, dqkv, B, m_T, m_H, m_KVl, m_hs, m_theta, 0);
      return dq;
    }
    const size_t kvw = size_t(m_KVl) * m_hs, rows = size_t(ropeChunkRows());
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < ropeChunks(); ++h) {
        const size_t r0 = size_t(b) * m_T + size_t(h) * rows;
        m_be.ropeUnpackQkv(dq + r0 * m_Cl, dk + r0 * kvw, dv + r0 * kvw, dqkv + r0 * 3 * m_Cl, 1, int(rows),
                           m_H, m_KVl, m_hs, m_theta, ropeChunkStart(h));
      }
    return dq;
  }
  // Workspace slot 3 sized once per backward for both its uses (so the second get() never moves it): the
  // MLP's input-side gradients dF2, its first `zeroed` floats zeroed, and for llama then qkvGradients'.
  float* slot3(int N, size_t zeroed) {
    const size_t n = std::max(size_t(N) * m_F * mlpInputParts(), m_llama ? qkvProjectionFloats(N) : 0);
    float* p = m_ws->get(3, n, false);
    if (zeroed) m_be.zero(p, zeroed * sizeof(float));
    return p;
  }
  // The q|k|v projections backward from their output gradients dproj (qkvGradients): dln1 (nullable) +=,
  // and with `weights` their weight (and bias) gradients from ln1.
  void qkvInputBackward(float* dln1, const float* dproj, TensorIn ln1, int N, bool weights) {
    if (!m_llama)
      return m_be.linearBackward(dln1, weights ? m_qkvw.grad() : nullptr, weights ? m_qkvb.grad() : nullptr,
                                 dproj, ln1, m_qkvw.gemm(), N, m_C, 3 * m_Cl);
    const int kvw = m_KVl * m_hs;
    const float* dk = dproj + size_t(N) * m_Cl;
    const float* dv = dk + size_t(N) * kvw;
    m_be.linearBackwardT(dln1, weights ? m_qkvw.grad() : nullptr, nullptr, dproj, ln1, m_qkvw.gemm(), N, m_C,
                         m_Cl);
    m_be.linearBackwardT(dln1, weights ? m_kw.grad() : nullptr, nullptr, dk, ln1, m_kw.gemm(), N, m_C, kvw);
    m_be.linearBackwardT(dln1, weights ? m_vw.grad() : nullptr, nullptr, dv, ln1, m_vw.gemm(), N, m_C, kvw);
  }
  // The input gradient alone of rows row0 .. row0 + n (of N) from dproj: out (n, C) += (tp_comm_overlap).
  void qkvInputRows(float* out, const float* dproj, int N, int row0, int n) {
    const size_t r0 = size_t(row0);
    if (!m_llama)
      return m_be.linearBackward(out, nullptr, nullptr, dproj + r0 * 3 * m_Cl, TensorIn(), m_qkvw.gemm(), n,
                                 m_C, 3 * m_Cl);
    const int kvw = m_KVl * m_hs;
    const float* dk = dproj + size_t(N) * m_Cl;
    const float* dv = dk + size_t(N) * kvw;
    m_be.linearBackwardT(out, nullptr, nullptr, dproj + r0 * m_Cl, TensorIn(), m_qkvw.gemm(), n, m_C, m_Cl);
    m_be.linearBackwardT(out, nullptr, nullptr, dk + r0 * kvw, TensorIn(), m_kw.gemm(), n, m_C, kvw);
    m_be.linearBackwardT(out, nullptr, nullptr, dv + r0 * kvw, TensorIn(), m_vw.gemm(), n, m_C, kvw);
  }

  // ---- activation collectives: in bf16 precision the TP all-reduces, reduce-scatters and all-gathers of
  // activations and their gradients move bf16, as Megatron-LM's do on its bf16 tensors: the fp32 values are
  // rounded into workspace slot kCommSlot, reduced there (each sum in fp32, rounded: CommType::BF16) and
  // widened back. Half the bytes of fp32; the rounding of each rank's partial sum is the price.
  bool bf16Collectives() const { return m_be.gemmPrecision() == GemmPrecision::Bf16 && m_tp.size > 1; }
  bfloat16* commStaging(size_t n) const {
    return reinterpret_cast<bfloat16*>(m_ws->get(kCommSlot, (n + 1) / 2, false));
  }
  void allReduceActivations(float* x, size_t n) const { ms::allReduceActivations(m_tp, m_be, *m_ws, x, n); }

  // ---- sequence parallelism: (B, T, C) <-> this rank's (B, Ts, C) ----
  // A sample's piece of the sequence is one row of Ts * C floats; the whole tensor's rows are T * C apart.
  void takeShard(float* dst, const float* full, int B) const {
    const int Ts = m_T / m_tp.size;
    const size_t row = size_t(Ts) * m_C * sizeof(float), fullRow = size_t(m_T) * m_C * sizeof(float);
    m_be.copy2D(dst, row, full + size_t(m_tp.rank) * Ts * m_C, fullRow, row, B);
  }
  // dst (B, T, C) = the pieces of every rank, fp32 or bf16 elements as shard is (workspace slot 5 as the
  // rank-major staging area).
  void gatherSequence(void* dst, TensorIn shard, int B) const {
    const size_t element = shard.bf16 ? sizeof(bfloat16) : sizeof(float);
    const size_t piece = size_t(B) * (m_T / m_tp.size) * m_C;
    auto* tmp = reinterpret_cast<char*>(m_ws->get(
        5, (piece * m_tp.size * element + sizeof(float) - 1) / sizeof(float), false));  // (tp, B, Ts, C)
    m_tp.allGather(shard, tmp, piece);
    placeSequence(dst, tmp, element, B);
  }
  // dst (B, T, C) = the rank-major pieces (tp, B, Ts, C) of `staging`, elements of `element` bytes.
  void placeSequence(void* dst, const void* staging, size_t element, int B) const {
    const size_t row = size_t(m_T / m_tp.size) * m_C, piece = size_t(B) * row;
    const size_t rowBytes = row * element, fullRow = size_t(m_T) * m_C * element;
    for (int r = 0; r < m_tp.size; ++r)
      m_be.copy2D(static_cast<char*>(dst) + r * rowBytes, fullRow,
                  static_cast<const char*>(staging) + r * piece * element, rowBytes, rowBytes, B);
  }
  // tp_comm_overlap: a kept LayerNorm piece's re-gather for the weight gradients started now, into workspace
  // slot kOutputGradSlot (rank-major), to travel beside the input gradient's rows and reduce-scatters
  // (Megatron-LM's bulk overlap of this all-gather with the input-gradient GEMM); finished by
  // finishLayerNormGather.
  struct PendingGather {
    CommRequestPtr request;
    TensorIn shard;
    const void* staging = nullptr;
  };
  PendingGather startLayerNormGather(TensorIn shard, int B) const {
    const size_t element = shard.bf16 ? sizeof(bfloat16) : sizeof(float);
    const size_t piece = size_t(B) * (m_T / m_tp.size) * m_C;
    void* staging =
        m_ws->get(kOutputGradSlot, (piece * m_tp.size * element + sizeof(float) - 1) / sizeof(float), false);
    return {m_tp.iallGather(shard, staging, piece), shard, staging};
  }
  // The whole (B, T, C) LayerNorm output in `into` once the gather started above has arrived.
  TensorIn finishLayerNormGather(PendingGather& g, float* into, int B) const {
    TensorParallel::finish(g.request, "all-gather");
    placeSequence(into, g.staging, g.shard.bf16 ? sizeof(bfloat16) : sizeof(float), B);
    return wholeOf(g.shard, into);
  }
  // A LayerNorm output kept as this rank's (B, Ts, C) piece, gathered whole into `into` (N * C floats of
  // room) for a column-parallel GEMM (Korthikanti et al. 2022, section 4.2.2: all-gathered before the GEMM in
  // forward and again in backward), bf16 in bf16 precision.
  TensorIn gatheredLayerNorm(TensorIn shard, float* into, int B) const {
    gatherSequence(into, shard, B);
    return shard.bf16 ? TensorIn(reinterpret_cast<const bfloat16*>(into)) : TensorIn(into);
  }
  // dst (B, Ts, C) = this rank's piece of the sum over ranks of full (B, T, C).
  void reduceScatterSequence(float* dst, const float* full, int B) const {
    const int Ts = m_T / m_tp.size;
    const size_t row = size_t(Ts) * m_C, piece = size_t(B) * row;
    const size_t rowBytes = row * sizeof(float), fullRow = size_t(m_T) * m_C * sizeof(float);
    float* tmp = m_ws->get(5, piece * m_tp.size, false);
    for (int r = 0; r < m_tp.size; ++r)
      m_be.copy2D(tmp + r * piece, rowBytes, full + size_t(r) * Ts * m_C, fullRow, rowBytes, B);
    if (!bf16Collectives()) return m_tp.reduceScatter(tmp, dst, piece);
    const size_t whole = piece * m_tp.size;
    bfloat16* s = commStaging(whole + piece);  // the rank-major whole, then this rank's sum
    m_be.toBf16(s, tmp, whole);
    m_tp.reduceScatter(TensorIn(s), s + whole, piece);
    m_be.fromBf16(dst, s + whole, piece);
  }
  // dst (B, T, C) = every rank's (B, Ts, C) activation piece, through bf16 in bf16 precision.
  void gatherActivations(float* dst, const float* shard, int B) const {
    if (!bf16Collectives()) return gatherSequence(dst, shard, B);
    const size_t piece = size_t(B) * (m_T / m_tp.size) * m_C, whole = piece * m_tp.size;
    bfloat16* s = commStaging(piece + whole);  // this rank's piece, then the gathered whole
    m_be.toBf16(s, shard, piece);
    gatherSequence(s + piece, TensorIn(s), B);
    m_be.fromBf16(dst, s + piece, whole);
  }
  void addBias(float* x, TensorIn bias, size_t rows) const { m_be.addRows(x, bias, rows, m_C); }

  // ---- tp_comm_overlap (plan/tp_overlap.h): the sequence-parallel collectives in chunks ----
  // Chunk c of a microbatch is rows c Tk .. (c + 1) Tk of every rank's (B Ts) rows; in the (B, T) rows of the
  // whole tensor, rank r's part of it starts at wholeRow(c, r).
  struct OverlapChunks {
    int count = 1;  // B * splits
    int rows = 1;   // Tk
    int splits = 1;
  };
  OverlapChunks overlapChunks(int B) const {
    const int Ts = m_T / m_tp.size, k = tpOverlapSplits(B, Ts);
    return {B * k, Ts / k, k};
  }
  int wholeRow(const OverlapChunks& o, int c, int r) const {
    const int Ts = m_T / m_tp.size;
    return (c / o.splits) * m_T + r * Ts + (c % o.splits) * o.rows;
  }
  // into (B, T, C) = every rank's shard (B, Ts, C), chunk by chunk: every chunk's all-gather is started at
  // once (into workspace slot 5, rank-major per chunk), and as each arrives its rank parts are placed and
  // rows(row0, n) runs on each, while the later chunks travel. Elements as shard is (fp32 or bf16), or with
  // `widen` a bf16 shard lands widened into an fp32 `into`.
  template <typename Rows>
  void gatherOverlapped(void* into, TensorIn shard, int B, bool widen, Rows&& rows) const {
    const OverlapChunks o = overlapChunks(B);
    const size_t e = shard.bf16 ? sizeof(bfloat16) : sizeof(float), outE = widen ? sizeof(float) : e;
    const size_t part = size_t(o.rows) * m_C, perChunk = part * m_tp.size;  // elements
    auto* staging = reinterpret_cast<char*>(
        m_ws->get(5, (perChunk * o.count * e + sizeof(float) - 1) / sizeof(float), false));
    std::vector<CommRequestPtr> pending(static_cast<size_t>(o.count));
    for (int c = 0; c < o.count; ++c)
      pending[size_t(c)] =
          m_tp.iallGather(shard.at(size_t(c) * part), staging + size_t(c) * perChunk * e, part);
    for (int c = 0; c < o.count; ++c) {
      TensorParallel::finish(pending[size_t(c)], "all-gather");
      for (int r = 0; r < m_tp.size; ++r) {
        const char* src = staging + (size_t(c) * m_tp.size + r) * part * e;
        const int row0 = wholeRow(o, c, r);
        char* dst = static_cast<char*>(into) + size_t(row0) * m_C * outE;
        if (widen)
          m_be.fromBf16(reinterpret_cast<float*>(dst), reinterpret_cast<const bfloat16*>(src), part);
        else
          m_be.copy(dst, src, part * e);
        rows(row0, o.rows);
      }
    }
  }
  // dst (B, Ts, C) = this rank's piece of the sum over ranks of the (B, T, C) rows that rows(row0, n, out)
  // writes (n rows of C into out), chunk by chunk: each chunk's rank parts are computed into workspace slot 5
  // (rank-major) and its reduce-scatter started, travelling while the next chunk is computed; then every
  // chunk is waited for. In bf16 precision a chunk travels as bf16 (kCommSlot), as reduceScatterSequence's.
  template <typename Rows>
  void reduceScatterOverlapped(float* dst, int B, Rows&& rows) const {
    const OverlapChunks o = overlapChunks(B);
    const size_t part = size_t(o.rows) * m_C, perChunk = part * m_tp.size;
    const size_t whole = perChunk * o.count, piece = part * o.count;
    float* staging = m_ws->get(5, whole, false);
    const bool bf16 = bf16Collectives();
    bfloat16* s = bf16 ? commStaging(whole + piece) : nullptr;  // every chunk's parts, then its sums
    std::vector<CommRequestPtr> pending(static_cast<size_t>(o.count));
    for (int c = 0; c < o.count; ++c) {
      float* send = staging + size_t(c) * perChunk;
      for (int r = 0; r < m_tp.size; ++r) rows(wholeRow(o, c, r), o.rows, send + size_t(r) * part);
      if (!bf16) {
        pending[size_t(c)] = m_tp.ireduceScatter(TensorIn(send), dst + size_t(c) * part, part);
        continue;
      }
      m_be.toBf16(s + size_t(c) * perChunk, send, perChunk);
      pending[size_t(c)] =
          m_tp.ireduceScatter(TensorIn(s + size_t(c) * perChunk), s + whole + size_t(c) * part, part);
    }
    for (int c = 0; c < o.count; ++c) {
      TensorParallel::finish(pending[size_t(c)], "reduce-scatter");
      if (bf16) m_be.fromBf16(dst + size_t(c) * part, s + whole + size_t(c) * part, part);
    }
  }

  // Cache under sequence parallelism: ln1 and ln2 (the column-parallel linears' inputs, gathered whole per
  // use), their statistics and res1 for this rank's Ts positions only.
  void forwardSequenceParallel(const float* x, float* y, int B, Cache& c) {
    const int T = m_T, C = m_C, Cl = m_Cl;
    const int N = B * T, Ns = N / m_tp.size;
    const size_t NsC = size_t(Ns) * C;
    // This rank's piece of the input: the input itself between two blocks, else taken from the whole.
    const float* xs = x;
    if (!m_inPieces) {
      float* taken = m_ws->get(6, NsC, false);
      takeShard(taken, x, B);
      xs = taken;
    }
    float* full =
        m_ws->get(4, size_t(N) * C, false);  // the gathered LayerNorm outputs, then the projections'
    float* ln1 = c.ln1.target(NsC, *m_ws, kKeptStaging);
    norm(ln1, c.ln1Mean, c.ln1Rstd, xs, m_ln1w, m_ln1b, Ns);
    float* qkv = c.qkv.target(size_t(N) * 3 * Cl, *m_ws, kQkvSlot);
    if (m_overlap) {  // the projections of each chunk's rows as the chunk arrives
      const TensorIn shard = c.ln1.keep(ln1), whole = wholeOf(shard, full);
      gatherOverlapped(full, shard, B, false, [&](int row0, int n) { qkvProject(qkv, whole, N, row0, n); });
      if (m_llama) qkvPack(qkv, B);
    } else {
      qkvForward(qkv, gatheredLayerNorm(c.ln1.keep(ln1), full, B), B);
    }
    c.qkv.keep(qkv);
    float* atty = attentionForward(c, B, qkv);
    const TensorIn attyIn = c.atty.keep(atty);
    float* res1 = c.res1.target(NsC, *m_ws, kRes1Slot);
    if (m_overlap) {
      reduceScatterOverlapped(res1, B, [&](int row0, int n, float* out) {
        linear(out, attyIn.at(size_t(row0) * Cl), m_projw, nullptr, n, Cl, C);
      });
    } else {
      linear(full, attyIn, m_projw, nullptr, N, Cl, C);
      reduceScatterSequence(res1, full, B);  // res1s = reduce-scatter(partial) + bias + xs
    }
    if (m_projb.store) addBias(res1, m_projb.value(), Ns);
    m_be.accumulate(res1, xs, NsC);
    c.res1.keep(res1);
    float* ln2 = c.ln2.target(NsC, *m_ws, kKeptStaging);
    norm(ln2, c.ln2Mean, c.ln2Rstd, res1, m_ln2w, m_ln2b, Ns);
    // The output's piece: y itself when it stays in pieces, else slot 6 (xs is done with: read by the
    // residual above) gathered into y below.
    float* ys = m_outPieces ? y : m_ws->get(6, NsC, false);
    if (m_overlap && !m_moe) {
      denseMlpForwardOverlapped(c, B, c.ln2.keep(ln2), full, ys);
    } else {
      mlpForward(c, N, gatheredLayerNorm(c.ln2.keep(ln2), full, B), full, nullptr);
      reduceScatterSequence(ys, full, B);
    }
    if (m_fcprojb.store) addBias(ys, m_fcprojb.value(), Ns);
    m_be.accumulate(ys, res1, NsC);
    if (!m_outPieces) gatherActivations(y, ys, B);
  }

  void backwardSequenceParallel(const float* x, const float* dy, float* dx, int B, Cache& c,
                                bool deferWeights) {
    const int T = m_T, C = m_C, Cl = m_Cl, F = m_F, H = m_H;
    const int N = B * T, Ns = N / m_tp.size;
    const size_t NC = size_t(N) * C, NsC = size_t(Ns) * C, NCl = size_t(N) * Cl, NF = size_t(N) * F;
    auto wgrad = [&](const BoundParam& p) { return deferWeights ? nullptr : p.grad(); };
    float* dres1s = m_ws->get(0, NsC, false);     // (B, Ts, C)
    float* dC = m_ws->get(1, NC, true);           // (B, T, C) or (B, T, Cl)
    float* dF1 = m_ws->get(2, NF, true);          // (B, T, Fl)
    float* dF2 = slot3(N, NF * mlpInputParts());  // (B, T, Fl), llama (B, T, 2Fl)
    float* dqkv = m_ws->get(4, 3 * NCl, true);    // (B, T, 3Cl)
    float* dfull = m_ws->get(6, NC, false);       // (B, T, C)
    float* dshard = m_ws->get(7, NsC, false);     // (B, Ts, C)
    const bool overlapMlp = m_overlap && !m_moe;
    // The gradient of ys, this rank's output piece, is dres1s; the fcproj output's gradient is the whole of
    // it, dyWhole. A whole output was gathered from every rank's ys and is used whole downstream on every
    // rank alike: dy is that whole, its piece dres1s. An output in pieces has dy as its piece: gathered whole
    // (workspace slot kOutputGradSlot), under tp_comm_overlap chunk by chunk beside fcproj's input-gradient
    // rows.
    const float* dyWhole = dy;
    bool fcprojInputDone = false;
    if (m_outPieces) {
      m_be.copy(dres1s, dy, NsC * sizeof(float));
      float* gathered = m_ws->get(kOutputGradSlot, NC, false);
      if (overlapMlp && m_hasDenseMlp) {
        gatherOverlapped(gathered, sendable(dy, NsC), B, bf16Collectives(), [&](int row0, int n) {
          const size_t r0 = size_t(row0);
          linearBack(dF1 + r0 * F, nullptr, nullptr, gathered + r0 * C, TensorIn(), m_fcprojw, n, F, C);
        });
        fcprojInputDone = true;
      } else {
        gatherActivations(gathered, dy, B);
      }
      dyWhole = gathered;
    } else {
      takeShard(dres1s, dy, B);
    }
    if (m_hasDenseMlp) {
      if (fcprojInputDone) {
        if (!deferWeights)
          linearBack(nullptr, wgrad(m_fcprojw), biasGrad(m_fcprojb), dyWhole, c.gelu.in(), m_fcprojw, N, F,
                     C);
      } else {
        linearBack(dF1, wgrad(m_fcprojw), deferWeights ? nullptr : biasGrad(m_fcprojb), dyWhole, c.gelu.in(),
                   m_fcprojw, N, F, C);
      }
      activationBackward(c, dF2, dF1, NF);
      if (overlapMlp) {  // the input gradient's rows chunk by chunk beside their reduce-scatters
        // ln_2's re-gather for the weight gradients travels beside them (the gathered dy in slot
        // kOutputGradSlot is done with: fcproj's weight gradients are computed above).
        PendingGather ln2 = deferWeights ? PendingGather{} : startLayerNormGather(c.ln2.in(), B);
        reduceScatterOverlapped(dshard, B, [&](int row0, int n, float* out) {
          m_be.zero(out, size_t(n) * C * sizeof(float));
          mlpInputRows(out, dF2, N, row0, n);
        });
        if (!deferWeights) mlpInputBackward(nullptr, dF2, finishLayerNormGather(ln2, dfull, B), N, true);
      } else {
        // The weight gradients need ln_2's output whole: gathered again (into dfull, free until below) unless
        // they are deferred to the weight part.
        mlpInputBackward(dC, dF2, deferWeights ? TensorIn(nullptr) : gatheredLayerNorm(c.ln2.in(), dfull, B),
                         N, !deferWeights);
      }
    }
    if (m_moe)  // the experts read ln_2's output whole (copied out of dfull, which is reused below)
      m_moe->backward(m_slot, moeInput(gatheredLayerNorm(c.ln2.in(), dfull, B), N), dyWhole, dC, N,
                      m_tp.rank == 0);
    if (!overlapMlp) reduceScatterSequence(dshard, dC, B);
    normBack(dres1s, dshard, c.res1.read(*m_ws), m_ln2w, m_ln2b, c.ln2Mean, c.ln2Rstd, Ns);
    m_be.zero(dC, NCl * sizeof(float));
    if (m_overlap) {
      // The proj output's gradient gathered whole chunk by chunk, its input gradient's rows computed as each
      // chunk arrives; the weight gradients from the whole after.
      gatherOverlapped(dfull, sendable(dres1s, NsC), B, bf16Collectives(), [&](int row0, int n) {
        const size_t r0 = size_t(row0);
        linearBack(dC + r0 * Cl, nullptr, nullptr, dfull + r0 * C, TensorIn(), m_projw, n, Cl, C);
      });
    } else {
      gatherActivations(dfull, dres1s, B);  // the proj output's gradient, whole
    }
    if (deferWeights) {
      keep(c.gOut, dyWhole, NC);
      keep(c.gFc, dF2, NF * mlpInputParts());
      keep(c.gProj, dfull, NC);
    }
    if (m_overlap) {
      if (!deferWeights)
        linearBack(nullptr, wgrad(m_projw), biasGrad(m_projb), dfull, c.atty.in(), m_projw, N, Cl, C);
    } else {
      linearBack(dC, wgrad(m_projw), deferWeights ? nullptr : biasGrad(m_projb), dfull, c.atty.in(), m_projw,
                 N, Cl, C);
    }
    float* scratch = m_ring ? nullptr : m_ws->get(5, m_be.attentionScratchFloats(B, T, Cl, H), false);
    attentionBackward(dqkv, scratch, dC, c, B);
    m_be.zero(dC, NC * sizeof(float));
    const float* dproj = qkvGradients(dqkv, B);
    if (m_overlap) {  // the input gradient's rows chunk by chunk beside their reduce-scatters
      // ln_1's re-gather for the weight gradients travels beside them (dfull and kOutputGradSlot are free).
      PendingGather ln1 = deferWeights ? PendingGather{} : startLayerNormGather(c.ln1.in(), B);
      reduceScatterOverlapped(dshard, B, [&](int row0, int n, float* out) {
        m_be.zero(out, size_t(n) * C * sizeof(float));
        qkvInputRows(out, dproj, N, row0, n);
      });
      if (!deferWeights) qkvInputBackward(nullptr, dproj, finishLayerNormGather(ln1, dfull, B), N, true);
    } else {
      qkvInputBackward(dC, dproj, deferWeights ? TensorIn(nullptr) : gatheredLayerNorm(c.ln1.in(), dfull, B),
                       N, !deferWeights);
    }
    if (deferWeights) keep(c.gQkv, dproj, qkvProjectionFloats(N));
    if (!m_overlap) reduceScatterSequence(dshard, dC, B);
    const float* xs = x;
    if (!m_inPieces) {
      float* taken = dF1;  // dF1 is done with and large enough (N * Fl >= Ns * C)
      takeShard(taken, x, B);
      xs = taken;
    }
    // The input's gradient: into dx itself where the input is a piece (dx comes zeroed), else into a piece
    // gathered whole into dx.
    float* dxs = m_inPieces && dx ? dx : dF2;
    if (dxs == dx)
      m_be.accumulate(dxs, dres1s, NsC);
    else
      m_be.copy(dxs, dres1s, NsC * sizeof(float));
    normBack(dxs, dshard, xs, m_ln1w, m_ln1b, c.ln1Mean, c.ln1Rstd, Ns);
    if (dx && !m_inPieces) {
      gatherActivations(dfull, dxs, B);
      m_be.accumulate(dx, dfull, NC);
    }
  }
  // A (B, Ts, C) fp32 piece as an all-gather sends it: itself, or in bf16 precision rounded into kCommSlot.
  TensorIn sendable(const float* piece, size_t n) const {
    if (!bf16Collectives()) return piece;
    bfloat16* s16 = commStaging(n);
    m_be.toBf16(s16, piece, n);
    return TensorIn(s16);
  }

  // Saved by forward for backward (activations), and by a split backward's input part for its weight part.
  // ln1, atty, ln2 and gelu only feed GEMMs in backward (KeptInput); qkv, the attention state, res1 and fc
  // are read by other ops (KeptTensor); both kinds are bf16 in bf16 precision, the LayerNorm statistics fp32.
  struct Cache {
    explicit Cache(MemoryTracker* t)
        : ln1Mean(0, MemoryCategory::Activations, t),
          ln1Rstd(0, MemoryCategory::Activations, t),
          ln2Mean(0, MemoryCategory::Activations, t),
          ln2Rstd(0, MemoryCategory::Activations, t),
          qkv(t),
          att(t),
          res1(t),
          fc(t),
          ln1(t),
          atty(t),
          ln2(t),
          gelu(t),
          gOut(0, MemoryCategory::Activations, t),
          gFc(0, MemoryCategory::Activations, t),
          gProj(0, MemoryCategory::Activations, t),
          gQkv(0, MemoryCategory::Activations, t) {}
    // seqSplit: the TP size under sequence parallelism (the LayerNorm statistics then cover this rank's piece
    // of the sequence only), else 1. The kept tensors are sized by forward (target()).
    void ensure(int B, int T, int seqSplit, bool rmsNorm) {
      const size_t Ns = size_t(B) * T / size_t(seqSplit);
      for (Buffer* b : {&ln1Rstd, &ln2Rstd}) b->reserve(Ns);  // (B, T) or (B, Ts)
      if (!rmsNorm)
        for (Buffer* b : {&ln1Mean, &ln2Mean}) b->reserve(Ns);
    }
    Buffer ln1Mean, ln1Rstd, ln2Mean, ln2Rstd;
    // qkv (B, T, 3Cl); att: the backend's attention state ((B, Hl, T, T) when it keeps the softmax); res1
    // (B, T, C) or (B, Ts, C); fc (B, T, Fl).
    KeptTensor qkv, att, res1, fc;
    KeptInput ln1, atty, ln2, gelu;  // (B, T, C), (B, T, Cl), (B, T, C), (B, T, Fl)
    Buffer gOut, gFc, gProj, gQkv;   // split backward: output gradients of fcproj, fc, proj, qkv
  };
  void keep(Buffer& dst, const float* src, size_t n) {
    dst.reserve(n);
    m_be.copy(dst.data(), src, n * sizeof(float));
  }

  Backend& m_be;
  int m_C, m_H, m_Cl, m_F;
  bool m_llama;
  int m_KVl, m_hs;
  float m_theta;
  int m_T;
  float m_eps;
  bool m_causal;
  TensorParallel m_tp;
  bool m_sp;
  bool m_overlap;  // tp_comm_overlap: the sequence-parallel collectives in chunks beside the GEMMs
  bool m_inPieces,
      m_outPieces;  // sequence parallelism: this rank's (B, Ts, C) piece in, out (block to block)
  ContextParallel m_cp;
  bool m_ring;                        // context parallelism: attention as ring attention
  bool m_fused = false;               // the backend saves row log-sum-exps, not the softmax
  bool m_recomputeAttention = false;  // selective recompute on a backend that materialises the softmax
  // llama binds m_qkvw to q_proj, m_fcw to gate_proj, m_fcprojw to down_proj, m_projw to o_proj and the
  // norms' weights, plus m_kw, m_vw and m_upw; its biases (and the norms') stay unbound.
  BoundParam m_ln1w, m_ln1b, m_qkvw, m_qkvb, m_projw, m_projb, m_ln2w, m_ln2b, m_fcw, m_fcb, m_fcprojw,
      m_fcprojb, m_kw, m_vw, m_upw;
  // A mixture-of-experts block's routed experts; the dense MLP (m_fcw ...) is then its shared experts, absent
  // (m_hasDenseMlp false) without them.
  std::unique_ptr<MoeMlp> m_moe;
  bool m_hasDenseMlp = true;
  int m_slot = 0;
  float m_auxScale = 0;
  SlotCaches<Cache> m_caches;
  Workspace* m_ws;
};

}  // namespace

std::unique_ptr<Layer> makeTransformerBlock(const LayerSpec& spec, const LayerContext& ctx, bool causal) {
  return std::make_unique<TransformerBlock>(spec, ctx, causal);
}

}  // namespace ms
