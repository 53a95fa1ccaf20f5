// The model as the plan sees it: an ordered list of named layers (the unit of placement: "embedding" (gpt,
// vit) or "stem" (cnn), "block.0" .. "block.N-1", "head"), each with its parameter tensors (names, shapes,
// initialisation) and its cost (forward FLOPs and saved activation bytes per sample). The runtime builds its
// tensors from this list, so a parameter's shape is written in exactly one place.
//
// What always holds: layer names are unique; parameter names are unique across the model and, for gpt,
// are the Hugging Face GPT-2 checkpoint names (linear weights in (in, out) "Conv1D" layout), for llama the
// Hugging Face Llama names (nn.Linear (out, in) weights), for cnn
// torchvision's ResNet names; a tied LM head owns no parameter (it reads wte.weight of the embedding layer).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "plan/run_config.h"

namespace ms {

enum class LayerKind { Embedding, Block, Head };

struct ParamSpec {
  enum class Init { Normal, Zeros, Ones };
  std::string name;
  std::vector<int64_t> shape;
  Init init = Init::Normal;
  double std = 0.0;    // for Init::Normal
  bool decay = false;  // weight decay applies (matrices and embeddings, not biases or norms)
  int64_t numel() const;
};

// Which dimension of a parameter is split over the TP group (Megatron-LM, Shoeybi et al. 2019, section 3):
// dim < 0 replicated. The dimension consists of `parts` equal parts (3 for the fused q|k|v projection), each
// split into tp equal pieces; rank t keeps piece t of every part, in part order.
struct ShardSpec {
  int dim = -1;
  int parts = 1;
  bool sharded() const { return dim >= 0; }
};
// The TP sharding of a parameter of the model (by its name and the model type): column-parallel q|k|v and
// MLP fc (weights and biases), row-parallel projections (weights; their biases stay whole), vocab-parallel
// gpt wte and lm_head; llama's q, k, v, gate and up split by rows (output features), o and down by columns,
// embed_tokens and lm_head by vocabulary; everything else (LayerNorms, positions, row-parallel biases, vit's
// patch embedding and head) replicated.
ShardSpec shardSpecOf(const ParamSpec& param, ModelType type);

// One GEMM of a layer's forward for one sample, as the backend's linear layers run it: a (rows x k) input
// times a (k x n) weight. Its backward runs two: the input gradient, (rows x n) times (n x k), and the weight
// gradient, (k x rows) times (rows x n). A cost model with a measured device (plan/device_profile.h) times
// each by its shape; FLOPs stay in forwardFlopsPerSample (tst_model_spec checks the two agree).
struct GemmShape {
  double rows = 0;  // per sample
  int64_t n = 0, k = 0;
  // Tensor parallelism divides n (column-parallel: output features) or k (row-parallel: input features).
  enum class Split { None, Output, Input } split = Split::None;
  // A routed expert's GEMM: `rows` are the sample's routed rows (positions x experts per token), spread over
  // the layer's experts (LayerSpec::experts), each rank running its local experts' share (balanced routing).
  bool expert = false;
  // Whether backward computes the input's gradient (false for a GEMM on the data, as vit's patches).
  bool inputGradient = true;
  // The gpt and llama LM head's GEMMs: run in chunks of headChunkRows() rows, forward and both gradients in
  // the training forward (the fused head).
  bool chunked = false;
  // The weight is kept (n x k), output features by input features, as Hugging Face's Llama linears and the
  // LM heads keep it: the backend's linearForwardT / linearBackwardT, whose three GEMMs transpose otherwise
  // (the forward inp @ W^T, the input gradient dout @ W, the weight gradient dout^T @ inp). A BLAS runs them
  // by other kernels than the (k x n) layout's, which a measured CPU profile tells apart (cost_model.cpp).
  bool transposedWeight = false;
};

// An elementwise kernel that a measured CPU profile times by name (plan/device_profile.h VectorKernel), as it
// is not bound by memory bandwidth there: the norms' per-row reductions over narrow rows, GELU's tanh and
// SwiGLU's exp per element, RoPE's rotation (and its copy of q, k and v into attention's layout). Each is
// also one of its layer's elementwisePasses, its bytes within elementwiseBytesPerSample
// (splitElementwiseBytesPerSample when split), so a catalog GPU, where they are bandwidth-bound, prices them
// as passes like the others. The kernels (a measured profile's names: plan/device_profile.h
// vectorKernelName).
enum class VectorKernel { LayerNorm, Gelu, RmsNorm, Swiglu, Rope };
struct VectorKernelUse {
  using Kind = VectorKernel;
  Kind kind = Kind::LayerNorm;
  double rowsPerSample = 0;
  double width = 0;    // a row's elements; GELU and SwiGLU are elementwise, their rows x width the elements
  bool split = false;  // the width divided by tensor parallelism (the MLP's activation)
  // fp32 bytes read and written per element of the rows: 8 (read one, write one; RoPE: the q and k heads,
  // width (H + KV) hs), SwiGLU 12 (gate and up read, the product written).
  double bytesPerElement() const { return kind == Kind::Swiglu ? 12.0 : 8.0; }
  double bytesPerSample() const { return bytesPerElement() * rowsPerSample * width; }
};

struct LayerSpec {
  std::string name;
  LayerKind kind = LayerKind::Block;
  std::vector<ParamSpec> params;
  // Non-trainable state kept, synchronised and checkpointed with the parameters but never optimised: the
  // BatchNorm running statistics of cnn ("<bn>.running_mean" zeros, "<bn>.running_var" ones, fp32, not split
  // by tensor parallelism). Empty for the other models.
  std::vector<ParamSpec> buffers;
  int64_t bufferCount() const;
  double forwardFlopsPerSample = 0;  // multiply-adds count as 2 FLOPs; backward is about 2x forward
  // What the forward's FLOPs are made of, for a measured device's cost model: its GEMMs, its attention core
  // (attentionFlopsPerSample, over attentionKeys keys per query, causal or not) and the bytes its elementwise
  // kernels (norms, activations, residual adds, the loss's softmax) read and write per sample, those split by
  // tensor parallelism (the MLP's activation, the vocabulary-parallel softmax) and those every TP rank runs
  // whole (norms, residuals). Backward is costed as the GEMMs' two gradients, attention's measured backward
  // and twice the elementwise passes. The cnn's convolutions are listed as the GEMMs im2col makes of them.
  std::vector<GemmShape> gemms;
  double attentionKeys = 0;
  double attentionHeadSize = 0;  // per head: a measured device's attention rate depends on it
  bool attentionCausal = true;
  double splitElementwiseBytesPerSample = 0;
  double elementwiseBytesPerSample = 0;
  // The forward's elementwise kernels (each a pass over its share of those bytes, each paying the fixed cost
  // of a kernel: a parallel region's start on the CPU, a launch on a GPU).
  int elementwisePasses = 1;
  // Which of those passes a measured profile times by name (VectorKernelUse).
  std::vector<VectorKernelUse> vectorKernels;
  int experts = 0;  // routed experts of a mixture-of-experts block (0: a dense layer)
  int64_t activationBytesPerSample =
      0;                             // fp32 bytes this layer keeps from forward for backward (all of them)
  int64_t outputBytesPerSample = 0;  // fp32 bytes of the activation it hands to the next layer
  // The same as the engine stores and sends it (activationElementBytes): the one place the output's
  // precision enters the memory and cost models (output buffers, pipeline messages).
  double outputBytesPerSampleIn(Precision precision) const;
  // Sequence parallelism (tp > 1, seqShards of buildModelSpec): between two transformer blocks each TP rank
  // holds only its T / tp positions of every sample, Megatron-LM's layout (Korthikanti et al. 2022, section
  // 4.2.2: the pieces stay split from one block's last reduce-scatter to the next block's first all-gather).
  // A block followed by a block hands on one of outputPieces pieces of its output (kept, stored, sent to the
  // next stage), a block after a block takes one of inputPieces; 1 elsewhere (the embedding's output and the
  // last block's stay whole). outputBytesPerSample stays the whole tensor's (the collectives move it).
  int inputPieces = 1;
  int outputPieces = 1;
  // What one rank holds of its output: the output buffer, the pipeline message, the gradient handed back.
  int64_t heldOutputBytesPerSample() const { return outputBytesPerSample / outputPieces; }
  double heldOutputBytesPerSampleIn(Precision precision) const;
  // Parts of activationBytesPerSample the runtime keeps otherwise: the tensors kept in bf16 under
  // "precision": "bf16" (runtime/layer_impl.h KeptInput and KeptTensor: everything a block keeps but the
  // LayerNorm row statistics and the attention matrix, counted apart), and attention's (H, T, T) softmax,
  // kept in bf16 too, which a device with fused attention replaces by its fp32 (H, T) row log-sum-exps
  // (attentionRowBytesPerSample). Without dropout these give Korthikanti et al. 2022's per-layer
  // sbh(34 + 5as/h) less the dropout masks and outputs (2sbh and 3as^2b): sbh(32 + 2as/h) with the block's
  // input, which the engine counts as the previous layer's output.
  int64_t bf16BytesPerSample = 0;
  int64_t attentionMatrixBytesPerSample = 0;  // fp32
  // What a mixture-of-experts block keeps whole on every tensor-parallel rank beyond the norm outputs and the
  // residual (memory_model.cpp): its experts' outputs (bf16 in bf16 precision) and routing (fp32), floats.
  int64_t tpWholeFloatsPerSample = 0;
  int64_t tpWholeStatFloatsPerSample = 0;
  int64_t attentionRowBytesPerSample = 0;
  // Context parallelism (cp > 1): attention runs as ring attention, which keeps only each row's fp32
  // log-sum-exp on every backend; attentionMatrixBytesPerSample then holds those (H, T/cp) floats, in every
  // precision, and nothing is left for selective recompute to drop.
  bool ringAttention = false;
  // The attention matrix as kept in this precision (bf16: half).
  double attentionMatrixBytesPerSampleIn(Precision precision) const;
  // Forward FLOPs of the attention core alone (Q K^T and the probabilities times V; part of
  // forwardFlopsPerSample): what selective recomputation repeats in backward (plan/recompute.h).
  double attentionFlopsPerSample = 0;
  int64_t paramCount() const;
  // Elements of the parameters tensor parallelism splits (shardSpecOf; set by buildModelSpec).
  int64_t splitParamCount = 0;
  // Elements of the routed experts' parameters (mixture of experts; all of them split by tensor parallelism).
  int64_t expertParamCount = 0;
  // The elements one rank of a TP group of tp holds: split parameters / tp, replicated ones whole; under
  // expert parallelism of ep ways, 1/ep of the routed experts.
  int64_t localParamCount(int tp, int ep = 1) const;
  // Of which the routed experts' (their own unit in the runtime's store under ep > 1).
  int64_t localExpertParamCount(int tp, int ep) const {
    return expertParamCount / std::max(1, tp) / std::max(1, ep);
  }
  // The bytes kept per sample for this precision and attention implementation.
  double keptBytesPerSample(Precision precision, bool fusedAttention) const;
};

// Bytes of one element of a layer's output as the engine keeps it and hands it on (runtime Model's output
// buffers, pipeline messages and their receive buffers): 2 under "precision": "bf16", where every layer
// output is rounded to bf16 (Megatron-LM keeps the residual stream and the p2p tensors in bf16), else 4. The
// input gradients coming back are kept and sent the same way (runtime Model::backwardChunk rounds each).
inline constexpr int activationElementBytes(Precision precision) {
  return precision == Precision::Bf16 ? 2 : 4;
}

// The CUDA backend fuses attention (FlashAttention-style, saving only each row's log-sum-exp) for head sizes
// up to this (kernels/cuda/cuda_ops.h kFlashAttentionMaxHeadSize; tst_backend checks they agree); the CPU
// backend always materialises the softmax.
inline constexpr int kFusedAttentionMaxHeadSize = 128;

// The GPT head fuses the LM head with the softmax cross-entropy in training (runtime/gpt_layers.cpp): it
// computes logits, loss, the logits' gradient and from it the head's input and weight gradients chunk by
// chunk of token rows, so the (N, V) logits never exist whole and what forward keeps for backward is the
// input gradient (N, C). The chunk holds about kHeadChunkFloats fp32 logits (256 MiB), in rows rounded down
// to a multiple of 64 (tensor-core friendly GEMM shapes) where that leaves at least 64; the memory model
// budgets the same workspace. Measured on an H200 (GPT-2 124M bf16, batch 8 x 1024, bench/gpu_vs_torch.py
// with MESHSTUDIO_HEAD_CHUNK_ROWS): 320-row chunks (64 MiB) 189k tokens/s, 1280 (256 MiB) 201k, 4096 and
// 8192 205k: the head's three GEMMs of a 320-row chunk run far below the tensor cores' rate.
inline constexpr int64_t kHeadChunkFloats = int64_t(1) << 26;
// `configured` (training.head_chunk_rows) > 0 sets the rows instead, at most `rows`.
int64_t headChunkRows(int64_t rows, int64_t vocabLocal, int64_t configured = 0);

// Under context parallelism of cp ways (buildModelSpec's cp) the spec describes what ONE rank of the ring
// computes and keeps for each sample: samplePositions is seq_len / cp, the GEMMs' FLOPs and the kept
// activations are its positions', attention's FLOPs are its queries against the whole sequence (the
// load-balanced chunks give every rank the same causal share, T (T + 1) / (2 cp) query-key pairs). The memory
// and cost models then see a rank's slice like any sample; totals over the model (the simulator's FLOPs per
// step and tokens/s) multiply by contextParallel.
struct ModelSpec {
  std::vector<LayerSpec> layers;
  int samplePositions = 1;  // T for gpt (training.seq_len), tokens for vit, 1 for mlp; / cp under cp
  int contextParallel = 1;  // cp: each sample is cp slices of samplePositions positions
  int64_t paramCount() const;
  // Index of the layer with this name, or -1.
  int layerIndex(const std::string& name) const;
  std::vector<std::string> layerNames() const;
};

// The cnn's image side after the stem and each stage: S, then halved (rounded up) by every stage after the
// first (3x3 convolutions with padding 1 and stride 2: (S + 1) / 2). Entry i is stage i's output side.
std::vector<int> cnnStageSides(const ModelConfig& model);

// The token embedding's parameter name (which a tied LM head reads): gpt's "wte.weight", llama's
// "model.embed_tokens.weight"; "" for the other models.
const char* tokenEmbeddingName(ModelType type);

// Builds the spec from the model config; seqLen is training.seq_len (used by gpt only). The config is assumed
// structurally valid (positive sizes); inputs is the flattened input size of an mlp (784 for Fashion-MNIST).
// cp > 1 (llama only; config_checks): the spec of one context-parallel rank's slice, seqLen / cp positions.
// seqShards > 1: tp under sequence parallelism, which splits what passes between two transformer blocks
// (LayerSpec::outputPieces); 1 for the whole tensors.
ModelSpec buildModelSpec(const ModelConfig& model, int seqLen, int mlpInputs = 784, int cp = 1,
                         int seqShards = 1);

// Layer names without building shapes (cheap; used by config validation).
std::vector<std::string> modelLayerNames(const ModelConfig& model);

}  // namespace ms
