// Layer and parameter lists of the gpt, llama, vit, mlp and cnn models; see model_spec.h.
#include "plan/model_spec.h"

#include <algorithm>
#include <cmath>

namespace ms {

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t LayerSpec::paramCount() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel();
  return n;
}

int64_t LayerSpec::bufferCount() const {
  int64_t n = 0;
  for (const auto& b : buffers) n += b.numel();
  return n;
}

int64_t LayerSpec::localParamCount(int tp, int ep) const {
  const int64_t all = paramCount() - splitParamCount + splitParamCount / std::max(1, tp);
  return all - expertParamCount / std::max(1, tp) + localExpertParamCount(tp, ep);
}

namespace {
bool endsWith(const std::string& s, const char* suffix) {
  const size_t n = std::char_traits<char>::length(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}
}  // namespace

ShardSpec shardSpecOf(const ParamSpec& p, ModelType type) {
  if (!isTransformer(type)) return {};
  const std::string& n = p.name;
  if (n.rfind("h.", 0) == 0) {
    // Column-parallel (output features split): q|k|v projection (three parts) and the MLP's first linear.
    if (endsWith(n, ".attn.c_attn.weight")) return {1, 3};
    if (endsWith(n, ".attn.c_attn.bias")) return {0, 3};
    if (endsWith(n, ".mlp.c_fc.weight")) return {1, 1};
    if (endsWith(n, ".mlp.c_fc.bias")) return {0, 1};
    // Row-parallel (input features split); their biases stay whole.
    if (endsWith(n, ".attn.c_proj.weight") || endsWith(n, ".mlp.c_proj.weight")) return {0, 1};
    return {};
  }
  if (type == ModelType::Llama && n.rfind("model.layers.", 0) == 0) {
    // nn.Linear (out, in) weights, no biases: column-parallel q, k, v, gate and up split their rows,
    // row-parallel o and down their columns.
    // The dense MLP's, each expert's and the shared experts' gate, up and down alike; the router
    // (mlp.gate.weight) is replicated.
    if (endsWith(n, ".self_attn.q_proj.weight") || endsWith(n, ".self_attn.k_proj.weight") ||
        endsWith(n, ".self_attn.v_proj.weight") || endsWith(n, ".gate_proj.weight") ||
        endsWith(n, ".up_proj.weight"))
      return {0, 1};
    if (endsWith(n, ".self_attn.o_proj.weight") || endsWith(n, ".down_proj.weight")) return {1, 1};
    return {};
  }
  // Vocab-parallel embedding and LM head (rows are vocabulary entries).
  if (type == ModelType::Gpt && (n == "wte.weight" || n == "lm_head.weight")) return {0, 1};
  if (type == ModelType::Llama && (n == "model.embed_tokens.weight" || n == "lm_head.weight")) return {0, 1};
  return {};
}

double LayerSpec::attentionMatrixBytesPerSampleIn(Precision precision) const {
  if (ringAttention) return double(attentionMatrixBytesPerSample);  // fp32 row log-sum-exps
  return double(attentionMatrixBytesPerSample) * (precision == Precision::Bf16 ? 0.5 : 1.0);
}

double LayerSpec::keptBytesPerSample(Precision precision, bool fusedAttention) const {
  double bytes = double(activationBytesPerSample) - double(attentionMatrixBytesPerSample);
  if (precision == Precision::Bf16) bytes -= 0.5 * double(bf16BytesPerSample);
  return bytes +
         (fusedAttention ? double(attentionRowBytesPerSample) : attentionMatrixBytesPerSampleIn(precision));
}

double LayerSpec::outputBytesPerSampleIn(Precision precision) const {
  return double(outputBytesPerSample) / 4.0 * activationElementBytes(precision);
}

double LayerSpec::heldOutputBytesPerSampleIn(Precision precision) const {
  return double(heldOutputBytesPerSample()) / 4.0 * activationElementBytes(precision);
}

int64_t headChunkRows(int64_t rows, int64_t vocabLocal, int64_t configured) {
  if (rows <= 0) return 0;
  if (configured > 0) return std::min(configured, rows);
  int64_t chunk = kHeadChunkFloats / std::max<int64_t>(1, vocabLocal);
  if (chunk >= 64) chunk -= chunk % 64;
  return std::clamp<int64_t>(chunk, 1, rows);
}

int64_t ModelSpec::paramCount() const {
  int64_t n = 0;
  for (const auto& l : layers) n += l.paramCount();
  return n;
}

int ModelSpec::layerIndex(const std::string& name) const {
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i].name == name) return static_cast<int>(i);
  return -1;
}

std::vector<std::string> ModelSpec::layerNames() const {
  std::vector<std::string> names;
  for (const auto& l : layers) names.push_back(l.name);
  return names;
}

namespace {

using Init = ParamSpec::Init;

ParamSpec weight(std::string name, std::vector<int64_t> shape, double std) {
  return ParamSpec{std::move(name), std::move(shape), Init::Normal, std, true};
}
ParamSpec zeros(std::string name, std::vector<int64_t> shape) {
  return ParamSpec{std::move(name), std::move(shape), Init::Zeros, 0.0, false};
}
ParamSpec ones(std::string name, std::vector<int64_t> shape) {
  return ParamSpec{std::move(name), std::move(shape), Init::Ones, 0.0, false};
}

// The activation figures of a transformer block that keeps `kept` floats a sample (bf16 in bf16 precision),
// `stats` fp32 norm statistics and the (H, T, T) attention matrix, and hands on a (T, C) output.
// Ring attention (runtime/transformer.cpp) keeps each query row's fp32 log-sum-exp, never the matrix.
void markRingAttention(LayerSpec& l) {
  l.ringAttention = true;
  l.activationBytesPerSample += l.attentionRowBytesPerSample - l.attentionMatrixBytesPerSample;
  l.attentionMatrixBytesPerSample = l.attentionRowBytesPerSample;
}

void setBlockActivations(LayerSpec& l, int64_t kept, int64_t stats, int64_t H, int64_t T, int64_t C) {
  l.activationBytesPerSample = (kept + H * T * T + stats) * 4;
  l.bf16BytesPerSample = kept * 4;
  l.attentionMatrixBytesPerSample = H * T * T * 4;
  l.attentionRowBytesPerSample = H * T * 4;
  l.outputBytesPerSample = T * C * 4;
}

// A pre-LayerNorm transformer block (GPT-2, Radford et al. 2019, section 2.3), parameters named as in the
// Hugging Face GPT-2 checkpoints. The output projections of attention and MLP are scaled by 1/sqrt(2L), the
// GPT-2 paper's "scale the weights of residual layers at initialization by 1/sqrt(N)".
// cp > 1: one context-parallel rank's slice of Tfull / cp positions, attention as ring attention (as
// llamaBlock's).
LayerSpec transformerBlock(const ModelConfig& m, int i, int Tfull, bool causal, int cp = 1) {
  const int T = Tfull / cp;
  const int64_t C = m.width, F = int64_t(m.mlpRatio) * m.width, H = m.heads;
  const double projStd = m.initStd / std::sqrt(2.0 * m.layers);
  const std::string p = "h." + std::to_string(i) + ".";
  LayerSpec l;
  l.name = "block." + std::to_string(i);
  l.kind = LayerKind::Block;
  l.params = {ones(p + "ln_1.weight", {C}),
              zeros(p + "ln_1.bias", {C}),
              weight(p + "attn.c_attn.weight", {C, 3 * C}, m.initStd),
              zeros(p + "attn.c_attn.bias", {3 * C}),
              weight(p + "attn.c_proj.weight", {C, C}, projStd),
              zeros(p + "attn.c_proj.bias", {C}),
              ones(p + "ln_2.weight", {C}),
              zeros(p + "ln_2.bias", {C}),
              weight(p + "mlp.c_fc.weight", {C, F}, m.initStd),
              zeros(p + "mlp.c_fc.bias", {F}),
              weight(p + "mlp.c_proj.weight", {F, C}, projStd),
              zeros(p + "mlp.c_proj.bias", {C})};
  // Forward FLOPs: the four GEMMs (2 * in * out per position) and attention's two products of the T queries
  // with the whole sequence's keys.
  const double gemm = 2.0 * T * (C * 3 * C + C * C + C * F + F * C);
  const double attn = 2.0 * 2.0 * double(T) * Tfull * C * (causal ? 0.5 : 1.0);
  l.forwardFlopsPerSample = gemm + attn;
  l.attentionFlopsPerSample = attn;
  using Split = GemmShape::Split;
  l.gemms = {{double(T), 3 * C, C, Split::Output},
             {double(T), C, C, Split::Input},
             {double(T), F, C, Split::Output},
             {double(T), C, F, Split::Input}};
  l.attentionKeys = Tfull;
  l.attentionHeadSize = double(C) / double(H);
  l.attentionCausal = causal;
  // Elementwise traffic per position, fp32 bytes: two LayerNorms (read C, write C), two residual adds (read
  // 2C, write C) whole on every TP rank; GELU (read F, write F) split.
  l.elementwiseBytesPerSample = 4.0 * T * (2 * 2 * C + 2 * 3 * C);
  l.splitElementwiseBytesPerSample = 4.0 * T * 2 * F;
  l.elementwisePasses = 5;
  using VK = VectorKernelUse::Kind;
  l.vectorKernels = {{VK::LayerNorm, double(T), double(C), false},
                     {VK::LayerNorm, double(T), double(C), false},
                     {VK::Gelu, double(T), double(F), true}};
  // Saved for backward (see runtime/transformer.cpp): ln_1 out, qkv, attention probabilities, attention out,
  // residual 1, ln_2 out, fc out, gelu out, plus per-row LayerNorm statistics; all but the statistics bf16 in
  // bf16 precision.
  setBlockActivations(l, T * (C + 3 * C + C + C + C + F + F), 4 * int64_t(T), H, T, C);
  if (cp > 1) markRingAttention(l);
  return l;
}

// GPT-2 under context parallelism (cp > 1): each rank embeds, runs and scores its slice of Tfull / cp
// positions, the learned positions of its two chunks added (runtime/gpt_layers.cpp).
ModelSpec gptSpec(const ModelConfig& m, int Tfull, int cp) {
  const int64_t C = m.width, V = m.vocab;
  const int T = Tfull / cp;
  ModelSpec spec;
  spec.samplePositions = T;
  spec.contextParallel = cp;
  LayerSpec emb;
  emb.name = "embedding";
  emb.kind = LayerKind::Embedding;
  emb.params = {weight("wte.weight", {V, C}, m.initStd),
                weight("wpe.weight", {int64_t(m.context), C}, m.initStd)};
  emb.forwardFlopsPerSample = double(T) * C;
  // The token rows gathered (read C, write C) and the positions added (read 2C, write C).
  emb.elementwiseBytesPerSample = 4.0 * T * 5 * C;
  emb.elementwisePasses = 2;
  emb.activationBytesPerSample = 0;
  emb.outputBytesPerSample = int64_t(T) * C * 4;
  spec.layers.push_back(emb);
  for (int i = 0; i < m.layers; ++i) spec.layers.push_back(transformerBlock(m, i, Tfull, true, cp));
  LayerSpec head;
  head.name = "head";
  head.kind = LayerKind::Head;
  head.params = {ones("ln_f.weight", {C}), zeros("ln_f.bias", {C})};
  if (!m.tieEmbeddings) head.params.push_back(weight("lm_head.weight", {V, C}, m.initStd));
  head.forwardFlopsPerSample = 2.0 * T * C * V;
  head.gemms = {{double(T), V, C, GemmShape::Split::Output, false, true, true, /*transposedWeight=*/true}};
  // ln_f (read C, write C) whole; the loss's softmax and its gradient over the logits (read V, write V,
  // twice) split with the vocabulary.
  head.elementwiseBytesPerSample = 4.0 * T * 2 * C;
  head.splitElementwiseBytesPerSample = 4.0 * T * 4 * V;
  head.elementwisePasses = 3;
  head.vectorKernels = {{VectorKernelUse::Kind::LayerNorm, double(T), double(C), false}};
  // Training fuses the LM head with the loss (headChunkRows): forward keeps ln_f's input gradient (T, C),
  // its row statistics and the losses; the logits live one chunk at a time in the workspace.
  head.activationBytesPerSample = (int64_t(T) * C + 3 * int64_t(T)) * 4;
  head.outputBytesPerSample = int64_t(T) * 4;
  spec.layers.push_back(head);
  return spec;
}

// A Llama block (Touvron et al. 2023, "LLaMA", section 2.2: pre-normalisation with RMSNorm, SwiGLU, rotary
// embeddings; Llama 2's grouped-query attention, Ainslie et al. 2023), parameters named and laid out as in
// the Hugging Face Llama checkpoints (nn.Linear (out, in) weights, no biases). The residual outputs (o_proj,
// down_proj) start scaled by 1/sqrt(2L) as gpt's do.
// cp > 1: one context-parallel rank's slice of T / cp positions (ModelSpec).
LayerSpec llamaBlock(const ModelConfig& m, int i, int Tfull, int cp) {
  const int T = Tfull / cp;
  const int64_t C = m.width, F = m.mlpHidden(), H = m.heads, KV = m.kvHeadCount(), hs = C / H;
  const double projStd = m.initStd / std::sqrt(2.0 * m.layers);
  const std::string p = "model.layers." + std::to_string(i) + ".";
  LayerSpec l;
  l.name = "block." + std::to_string(i);
  l.kind = LayerKind::Block;
  l.params = {ones(p + "input_layernorm.weight", {C}),
              weight(p + "self_attn.q_proj.weight", {H * hs, C}, m.initStd),
              weight(p + "self_attn.k_proj.weight", {KV * hs, C}, m.initStd),
              weight(p + "self_attn.v_proj.weight", {KV * hs, C}, m.initStd),
              weight(p + "self_attn.o_proj.weight", {C, H * hs}, projStd),
              ones(p + "post_attention_layernorm.weight", {C})};
  const bool moe = m.moeBlock(i);
  // A mixture-of-experts block (DeepSeek-V3's Hugging Face names): the router, the routed experts and the
  // shared experts as one SwiGLU of shared_experts times an expert's width; a token passes through k routed
  // experts and the shared ones. A dense block: one SwiGLU of ffn_hidden.
  const int64_t Fe = moe ? m.expertHidden() : F, k = moe ? m.expertsPerToken : 0;
  const int64_t Fs = moe ? m.sharedExperts * Fe : F;  // the always-on SwiGLU's width (0: none)
  if (moe) {
    l.params.push_back(weight(p + "mlp.gate.weight", {int64_t(m.experts), C}, m.initStd));
    for (int j = 0; j < m.experts; ++j) {
      const std::string e = p + "mlp.experts." + std::to_string(j) + ".";
      l.params.push_back(weight(e + "gate_proj.weight", {Fe, C}, m.initStd));
      l.params.push_back(weight(e + "up_proj.weight", {Fe, C}, m.initStd));
      l.params.push_back(weight(e + "down_proj.weight", {C, Fe}, projStd));
    }
    l.expertParamCount = int64_t(m.experts) * 3 * C * Fe;
  }
  if (Fs > 0) {
    const std::string s = p + (moe ? "mlp.shared_experts." : "mlp.");
    l.params.push_back(weight(s + "gate_proj.weight", {Fs, C}, m.initStd));
    l.params.push_back(weight(s + "up_proj.weight", {Fs, C}, m.initStd));
    l.params.push_back(weight(s + "down_proj.weight", {C, Fs}, projStd));
  }
  // Forward FLOPs: q, k, v, o and the MLP GEMMs (2 * in * out per position: three for each SwiGLU a token
  // passes through, and the router's C x E), and causal attention's two T x T products over all H query heads
  // (grouped-query attention shares K and V, not the products).
  const double mlp = 3.0 * C * (Fs + k * Fe) + (moe ? double(C) * m.experts : 0.0);
  const double gemm = 2.0 * T * (C * (H + 2 * KV) * hs + H * hs * C + mlp);
  const double attn = 2.0 * 2.0 * double(T) * Tfull * H * hs * 0.5;
  l.forwardFlopsPerSample = gemm + attn;
  l.attentionFlopsPerSample = attn;
  using Split = GemmShape::Split;
  l.gemms = {{double(T), H * hs, C, Split::Output},
             {double(T), KV * hs, C, Split::Output},
             {double(T), KV * hs, C, Split::Output},
             {double(T), C, H * hs, Split::Input}};
  if (Fs > 0) {
    l.gemms.push_back({double(T), Fs, C, Split::Output});
    l.gemms.push_back({double(T), Fs, C, Split::Output});
    l.gemms.push_back({double(T), C, Fs, Split::Input});
  }
  if (moe) {
    l.experts = m.experts;
    l.gemms.push_back({double(T), int64_t(m.experts), C, Split::None});  // the router
    const double routed = double(T) * k;
    l.gemms.push_back({routed, Fe, C, Split::Output, true});
    l.gemms.push_back({routed, Fe, C, Split::Output, true});
    l.gemms.push_back({routed, C, Fe, Split::Input, true});
  }
  for (GemmShape& g : l.gemms) g.transposedWeight = true;  // (out, in) weights, the router's and experts' too
  l.attentionKeys = Tfull;
  l.attentionHeadSize = double(hs);
  // Elementwise traffic per position, fp32 bytes: two RMSNorms (read C, write C) and two residual adds (read
  // 2C, write C) whole; the rotary embedding of q and k (read and write (H + KV) hs) and SwiGLU (read 2F,
  // write F, for the dense or shared MLP and each routed expert) split; a routed token's rows gathered to its
  // experts and their outputs scattered back (read and write C each, k times) whole.
  l.elementwiseBytesPerSample = 4.0 * T * (2 * 2 * C + 2 * 3 * C + 4 * k * C);
  l.splitElementwiseBytesPerSample = 4.0 * T * (2 * (H + KV) * hs + 3 * (Fs + k * Fe));
  l.elementwisePasses = moe ? 8 : 6;  // two norms, two residual adds, the rotation, SwiGLU; gather, scatter
  using VK = VectorKernelUse::Kind;
  l.vectorKernels = {{VK::RmsNorm, double(T), double(C), false}, {VK::RmsNorm, double(T), double(C), false}};
  if (Fs > 0) l.vectorKernels.push_back({VK::Swiglu, double(T), double(Fs), true});
  if (moe) l.vectorKernels.push_back({VK::Swiglu, double(T) * k, double(Fe), true});
  l.vectorKernels.push_back({VK::Rope, double(T), double((H + KV) * hs), true});
  // Saved for backward (runtime/transformer.cpp): the first RMSNorm's output, the rotated q|k|v with the
  // key/value heads repeated as attention reads them, the attention probabilities, attention's output, the
  // first residual, the second RMSNorm's output, the gate and up projections and the SwiGLU output, plus
  // each RMSNorm's per-row rstd; all but the rstds bf16 in bf16 precision.
  // A mixture-of-experts block keeps for each of a token's k routed experts (dropless: every token's) its
  // gate and up outputs and SwiGLU output (split by tensor parallelism) and its output (whole: a partial sum
  // under TP, read for the gate's gradient), plus the routing (the token index and the gate, fp32) of each.
  setBlockActivations(l, T * (C + 3 * H * hs + H * hs + C + C + 3 * Fs + k * (3 * Fe + C)), T * (2 + 2 * k),
                      H, T, C);
  l.tpWholeFloatsPerSample = T * k * C;
  l.tpWholeStatFloatsPerSample = T * 2 * k;
  if (cp > 1) markRingAttention(l);
  return l;
}

// Llama: a token embedding without positions (rotary embeddings act inside attention), the blocks, a final
// RMSNorm and the LM head (lm_head.weight, or the embedding when tied), Hugging Face's names.
ModelSpec llamaSpec(const ModelConfig& m, int Tfull, int cp) {
  const int64_t C = m.width, V = m.vocab;
  const int T = Tfull / cp;
  ModelSpec spec;
  spec.samplePositions = T;
  spec.contextParallel = cp;
  LayerSpec emb;
  emb.name = "embedding";
  emb.kind = LayerKind::Embedding;
  emb.params = {weight("model.embed_tokens.weight", {V, C}, m.initStd)};
  emb.forwardFlopsPerSample = 0;
  emb.elementwiseBytesPerSample = 4.0 * T * 2 * C;  // the token rows gathered (read C, write C)
  emb.activationBytesPerSample = 0;
  emb.outputBytesPerSample = int64_t(T) * C * 4;
  spec.layers.push_back(emb);
  for (int i = 0; i < m.layers; ++i) spec.layers.push_back(llamaBlock(m, i, Tfull, cp));
  LayerSpec head;
  head.name = "head";
  head.kind = LayerKind::Head;
  head.params = {ones("model.norm.weight", {C})};
  if (!m.tieEmbeddings) head.params.push_back(weight("lm_head.weight", {V, C}, m.initStd));
  head.forwardFlopsPerSample = 2.0 * T * C * V;
  head.gemms = {{double(T), V, C, GemmShape::Split::Output, false, true, true, /*transposedWeight=*/true}};
  head.elementwiseBytesPerSample = 4.0 * T * 2 * C;       // the final RMSNorm
  head.splitElementwiseBytesPerSample = 4.0 * T * 4 * V;  // the loss's softmax and its gradient (as gpt's)
  head.elementwisePasses = 3;
  head.vectorKernels = {{VectorKernelUse::Kind::RmsNorm, double(T), double(C), false}};
  // As gpt's fused head: the norm's input gradient (T, C), its rstd and the losses.
  head.activationBytesPerSample = (int64_t(T) * C + 2 * int64_t(T)) * 4;
  head.outputBytesPerSample = int64_t(T) * 4;
  spec.layers.push_back(head);
  return spec;
}

ModelSpec vitSpec(const ModelConfig& m) {
  const int64_t C = m.width, P = m.patch, NP = int64_t(m.imageSize / m.patch) * (m.imageSize / m.patch);
  const int T = static_cast<int>(NP + (m.pool == Pooling::Cls ? 1 : 0));
  ModelSpec spec;
  spec.samplePositions = T;
  LayerSpec emb;
  emb.name = "embedding";
  emb.kind = LayerKind::Embedding;
  emb.params = {weight("patch_embed.weight", {P * P, C}, m.initStd), zeros("patch_embed.bias", {C})};
  if (m.pool == Pooling::Cls) emb.params.push_back(weight("cls_token", {C}, m.initStd));
  emb.params.push_back(weight("pos_embed", {int64_t(T), C}, m.initStd));
  emb.forwardFlopsPerSample = 2.0 * NP * P * P * C;
  emb.gemms = {{double(NP), C, P * P, GemmShape::Split::None, false, /*inputGradient=*/false}};
  emb.elementwiseBytesPerSample = 4.0 * T * 3 * C;  // the positions added (read 2C, write C)
  emb.activationBytesPerSample = NP * P * P * 4;
  emb.outputBytesPerSample = int64_t(T) * C * 4;
  spec.layers.push_back(emb);
  for (int i = 0; i < m.layers; ++i) spec.layers.push_back(transformerBlock(m, i, T, false));
  LayerSpec head;
  head.name = "head";
  head.kind = LayerKind::Head;
  head.params = {ones("ln_f.weight", {C}), zeros("ln_f.bias", {C}),
                 weight("head.weight", {C, m.classes}, m.initStd), zeros("head.bias", {int64_t(m.classes)})};
  head.forwardFlopsPerSample = 2.0 * C * m.classes + 5.0 * T * C;
  head.gemms = {{1.0, int64_t(m.classes), C}};
  head.elementwiseBytesPerSample = 4.0 * T * 3 * C;  // ln_f (read C, write C) and the pooling's read
  head.elementwisePasses = 2;
  head.vectorKernels = {{VectorKernelUse::Kind::LayerNorm, double(T), double(C), false}};
  head.activationBytesPerSample = (int64_t(T) * C + C + m.classes + 2 * int64_t(T)) * 4;
  head.outputBytesPerSample = 4;
  spec.layers.push_back(head);
  return spec;
}

ModelSpec mlpSpec(const ModelConfig& m, int inputs) {
  ModelSpec spec;
  spec.samplePositions = 1;
  int64_t in = inputs;
  for (size_t i = 0; i < m.hidden.size(); ++i) {
    const int64_t out = m.hidden[i];
    LayerSpec l;
    l.name = "block." + std::to_string(i);
    l.kind = LayerKind::Block;
    const std::string p = "fc." + std::to_string(i) + ".";
    l.params = {weight(p + "weight", {in, out}, m.initStd), zeros(p + "bias", {out})};
    l.forwardFlopsPerSample = 2.0 * in * out;
    l.gemms = {{1.0, out, in, GemmShape::Split::None, false, /*inputGradient=*/i > 0}};
    l.elementwiseBytesPerSample = 4.0 * 2 * out;  // the activation (read out, write out)
    l.activationBytesPerSample = (in + out) * 4;
    l.outputBytesPerSample = out * 4;
    spec.layers.push_back(l);
    in = out;
  }
  LayerSpec head;
  head.name = "head";
  head.kind = LayerKind::Head;
  head.params = {weight("head.weight", {in, int64_t(m.classes)}, m.initStd),
                 zeros("head.bias", {int64_t(m.classes)})};
  head.forwardFlopsPerSample = 2.0 * in * m.classes;
  head.gemms = {
      {1.0, int64_t(m.classes), in, GemmShape::Split::None, false, /*inputGradient=*/!m.hidden.empty()}};
  head.activationBytesPerSample = (in + m.classes) * 4;
  head.outputBytesPerSample = 4;
  spec.layers.push_back(head);
  return spec;
}

// The cnn: a ResNet of basic blocks for small images (He et al. 2016, "Deep Residual Learning for Image
// Recognition", section 4.2's CIFAR networks: a 3x3 stem, stages of 3x3 basic blocks whose first block
// halves the side with stride 2, global average pooling and one linear layer), with a 1x1 convolution and
// BatchNorm as the shortcut where the shape changes (their option B). Parameter names are torchvision's
// ResNet names (conv1, bn1, layer{s}.{i}.conv1 ... downsample.0/1), weights in PyTorch's (OC, IC, KH, KW)
// layout, no convolution biases (BatchNorm follows each); the classifier is "head.weight" (in, out) as the
// vit's and mlp's heads. Convolution weights are initialised N(0, 2 / fan_out), fan_out = OC KH KW (He et al.
// 2015, "Delving Deep into Rectifiers", as torchvision's ResNet), BatchNorm weights 1 and biases 0.
//
// What a layer keeps for backward (activationBytesPerSample; runtime/cnn_layers.cpp keeps exactly these, in
// fp32 under either precision): the stem the convolution's output (BatchNorm's input) and its output (the
// ReLU's mask); a block conv1's output, the ReLU'd BatchNorm of it (conv2's input and that ReLU's mask),
// conv2's output, the shortcut convolution's output where there is one, and its output (the last ReLU's
// mask); the head the pooled features and the logits. A layer's input is the previous layer's output (or the
// batch's images), which the model keeps already. The per-channel batch statistics (2 C floats per BatchNorm
// and microbatch) are not counted; the running statistics (LayerSpec::buffers) count as parameter memory
// (memory_model.cpp).
ParamSpec convWeight(std::string name, int64_t oc, int64_t ic, int64_t k) {
  return ParamSpec{std::move(name), {oc, ic, k, k}, Init::Normal, std::sqrt(2.0 / double(oc * k * k)), true};
}

void addBatchNorm(LayerSpec& l, const std::string& name, int64_t c) {
  l.params.push_back(ones(name + ".weight", {c}));
  l.params.push_back(zeros(name + ".bias", {c}));
  l.buffers.push_back(zeros(name + ".running_mean", {c}));
  l.buffers.push_back(ones(name + ".running_var", {c}));
}

ModelSpec cnnSpec(const ModelConfig& m) {
  const std::vector<int> sides = cnnStageSides(m);
  const int64_t S = m.imageSize, c0 = m.channels.front();
  ModelSpec spec;
  spec.samplePositions = 1;
  LayerSpec stem;
  stem.name = "stem";
  stem.kind = LayerKind::Embedding;
  stem.params = {convWeight("conv1.weight", c0, 1, 3)};
  addBatchNorm(stem, "bn1", c0);
  stem.forwardFlopsPerSample = 2.0 * c0 * S * S * 9;
  // As the backend runs a convolution (kernels/cpu/conv.cpp): each sample's input unfolded into K = C KH KW
  // rows of one column per output position (im2col), then one GEMM of the positions by K by the output
  // channels; costed here as one GEMM over the microbatch's positions. The elementwise passes, fp32 bytes:
  // im2col (reads the input, writes the columns), each BatchNorm (a statistics pass reading its input, then
  // normalising it: read and write), each ReLU and the residual add (two reads, a write).
  const auto im2colBytes = [](double K, double positions, double inputElements) {
    return 4.0 * (K * positions + inputElements);
  };
  stem.gemms = {{double(S * S), c0, 9, GemmShape::Split::None}};
  stem.gemms[0].inputGradient = false;  // the images need no gradient
  stem.elementwiseBytesPerSample = im2colBytes(9, double(S * S), double(S * S)) + 4.0 * 5 * c0 * S * S;
  stem.elementwisePasses = 4;  // im2col, the statistics, normalising, ReLU
  stem.activationBytesPerSample = 2 * c0 * S * S * 4;
  stem.outputBytesPerSample = c0 * S * S * 4;
  spec.layers.push_back(stem);
  int64_t cin = c0, side = S;
  int index = 0;
  for (size_t s = 0; s < m.channels.size(); ++s) {
    const int64_t c = m.channels[s], out = sides[s];
    for (int i = 0; i < m.blocks; ++i) {
      const bool projection = i == 0 && (cin != c || side != out);
      const std::string p = "layer" + std::to_string(s + 1) + "." + std::to_string(i) + ".";
      LayerSpec l;
      l.name = "block." + std::to_string(index++);
      l.kind = LayerKind::Block;
      l.params.push_back(convWeight(p + "conv1.weight", c, cin, 3));
      addBatchNorm(l, p + "bn1", c);
      l.params.push_back(convWeight(p + "conv2.weight", c, c, 3));
      addBatchNorm(l, p + "bn2", c);
      if (projection) {
        l.params.push_back(convWeight(p + "downsample.0.weight", c, cin, 1));
        addBatchNorm(l, p + "downsample.1", c);
      }
      const double positions = double(out * out);
      l.forwardFlopsPerSample = 2.0 * positions * c * (cin * 9 + c * 9 + (projection ? cin : 0));
      l.gemms = {{positions, c, cin * 9, GemmShape::Split::None},
                 {positions, c, c * 9, GemmShape::Split::None}};
      const double plane = double(c) * positions;  // one output channel map of the block
      // conv1's im2col, bn1 (statistics, normalising), ReLU; conv2's im2col, bn2, the residual add, ReLU.
      l.elementwiseBytesPerSample = im2colBytes(cin * 9.0, positions, double(cin * side * side)) +
                                    im2colBytes(c * 9.0, positions, plane) +
                                    4.0 * (3 + 2 + 3 + 3 + 2) * plane;
      l.elementwisePasses = 9;
      if (projection) {  // the shortcut: a 1x1 convolution (stride 2 where the side halves) and its BatchNorm
        l.gemms.push_back({positions, c, cin, GemmShape::Split::None});
        l.elementwiseBytesPerSample +=
            im2colBytes(double(cin), positions, double(cin * side * side)) + 4.0 * 3 * plane;
        l.elementwisePasses += 3;
      }
      l.activationBytesPerSample = (projection ? 5 : 4) * c * out * out * 4;
      l.outputBytesPerSample = c * out * out * 4;
      spec.layers.push_back(l);
      cin = c;
      side = out;
    }
  }
  LayerSpec head;
  head.name = "head";
  head.kind = LayerKind::Head;
  head.params = {weight("head.weight", {cin, int64_t(m.classes)}, m.initStd),
                 zeros("head.bias", {int64_t(m.classes)})};
  head.forwardFlopsPerSample = 2.0 * cin * m.classes + double(cin * side * side);  // + the pooling's adds
  head.gemms = {{1.0, int64_t(m.classes), cin, GemmShape::Split::None}};
  head.elementwiseBytesPerSample = 4.0 * (cin * side * side + cin);  // global average pooling
  head.elementwisePasses = 1;
  head.activationBytesPerSample = (cin + m.classes) * 4;
  head.outputBytesPerSample = 4;
  spec.layers.push_back(head);
  return spec;
}

}  // namespace

std::vector<int> cnnStageSides(const ModelConfig& model) {
  std::vector<int> sides;
  int side = model.imageSize;
  for (size_t s = 0; s < model.channels.size(); ++s) {
    if (s > 0) side = (side + 1) / 2;
    sides.push_back(side);
  }
  return sides;
}

const char* tokenEmbeddingName(ModelType type) {
  if (type == ModelType::Gpt) return "wte.weight";
  if (type == ModelType::Llama) return "model.embed_tokens.weight";
  return "";
}

ModelSpec buildModelSpec(const ModelConfig& model, int seqLen, int mlpInputs, int cp, int seqShards) {
  ModelSpec spec;
  switch (model.type) {
    case ModelType::Gpt:
      spec = gptSpec(model, seqLen, std::max(1, cp));
      break;
    case ModelType::Vit:
      spec = vitSpec(model);
      break;
    case ModelType::Mlp:
      spec = mlpSpec(model, mlpInputs);
      break;
    case ModelType::Cnn:
      spec = cnnSpec(model);
      break;
    case ModelType::Llama:
      spec = llamaSpec(model, seqLen, std::max(1, cp));
      break;
  }
  // Which elements tensor parallelism splits, once (the memory and cost models ask per plan and stage).
  for (LayerSpec& layer : spec.layers) {
    layer.splitParamCount = 0;
    for (const ParamSpec& p : layer.params)
      if (shardSpecOf(p, model.type).sharded()) layer.splitParamCount += p.numel();
  }
  // Sequence parallelism: block to block, each TP rank holds its piece of the sequence (config_checks makes
  // the positions divisible by tp).
  if (seqShards > 1 && isTransformer(model.type) && spec.samplePositions % seqShards == 0)
    for (size_t l = 0; l + 1 < spec.layers.size(); ++l)
      if (spec.layers[l].kind == LayerKind::Block && spec.layers[l + 1].kind == LayerKind::Block) {
        spec.layers[l].outputPieces = seqShards;
        spec.layers[l + 1].inputPieces = seqShards;
      }
  return spec;
}

std::vector<std::string> modelLayerNames(const ModelConfig& model) {
  std::vector<std::string> names;
  int blocks = model.layers;
  if (model.type == ModelType::Mlp) blocks = static_cast<int>(model.hidden.size());
  if (model.type == ModelType::Cnn) blocks = static_cast<int>(model.channels.size()) * model.blocks;
  if (isTransformer(model.type)) names.push_back("embedding");
  if (model.type == ModelType::Cnn) names.push_back("stem");
  for (int i = 0; i < blocks; ++i) names.push_back("block." + std::to_string(i));
  names.push_back("head");
  return names;
}

}  // namespace ms
