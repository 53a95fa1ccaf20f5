// Activation recomputation: which layers re-make what in backward. The one home of the rule that the memory
// model, the cost model, the auto-planner's screen and the runtime (engine/runtime/model.cpp,
// transformer.cpp) all read, so a prediction and a run cannot disagree about it.
//
// - "full" (Chen et al. 2016; Megatron-LM's --recompute-granularity full): a transformer block keeps only its
//   output between forward and backward and is re-run before its backward. With "recompute_layers": N > 0
//   only the first N blocks of every chunk are (Megatron's --recompute-method block --recompute-num-layers N,
//   per pipeline stage and per virtual chunk); the others keep everything. Embeddings and heads never are.
// - "selective" (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
//   section 5): a transformer block keeps everything but the attention core's softmax probabilities, the
//   (H, T, T) matrix that grows with the sequence; backward re-runs the attention core (QK^T, softmax, the
//   product with V) from the kept q|k|v. A fused attention (FlashAttention-style, the CUDA backend's for
//   head sizes up to 128) keeps no such matrix, only each row's log-sum-exp, and already recomputes the
//   probabilities inside its backward: there selective keeps what "none" keeps and re-runs nothing (the paper
//   notes the same of memory-efficient attention kernels).
//
// What always holds: a recomputation re-runs the same ops on the same inputs, so what it re-makes is bit for
// bit what forward made, and losses and gradients equal those of a run without recomputation.
#pragma once

#include <vector>

#include "plan/model_spec.h"
#include "plan/run_config.h"

namespace ms {

// How a plan or a rank recomputes: "recompute" and "recompute_layers" of the parallel section.
struct RecomputePolicy {
  Recompute mode = Recompute::None;
  int layers = 0;  // with Full: blocks recomputed per chunk, 0 all
  static RecomputePolicy of(const ParallelConfig& p) { return {p.recompute, p.recomputeLayers}; }
};

// Whether `layer` of the chunk `chunk` (its layer indices, in order) is fully recomputed.
bool fullyRecomputed(const RecomputePolicy& policy, const ModelSpec& spec, const std::vector<int>& chunk,
                     int layer);

// Whether a layer drops its attention matrix after forward and re-makes it in backward: recompute
// "selective", a transformer block (of gpt or vit), attention not fused, and T > 1 (where the matrix is
// more than its rows).
bool recomputesAttention(const RecomputePolicy& policy, ModelType type, LayerKind kind, int positions,
                         bool fusedAttention);

// Transformer blocks in a chunk.
int blocksInChunk(const ModelSpec& spec, const std::vector<int>& chunk);

}  // namespace ms
