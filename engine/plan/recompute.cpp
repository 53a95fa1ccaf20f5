// Activation recomputation's rule; see recompute.h.
#include "plan/recompute.h"

namespace ms {

int blocksInChunk(const ModelSpec& spec, const std::vector<int>& chunk) {
  int n = 0;
  for (int l : chunk) n += spec.layers[static_cast<size_t>(l)].kind == LayerKind::Block ? 1 : 0;
  return n;
}

bool fullyRecomputed(const RecomputePolicy& policy, const ModelSpec& spec, const std::vector<int>& chunk,
                     int layer) {
  if (policy.mode != Recompute::Full) return false;
  if (spec.layers[static_cast<size_t>(layer)].kind != LayerKind::Block) return false;
  if (policy.layers <= 0) return true;
  // The block's position among the chunk's blocks (Megatron: the first N layers of the chunk).
  int ordinal = 0;
  for (int l : chunk) {
    if (l == layer) return ordinal < policy.layers;
    ordinal += spec.layers[static_cast<size_t>(l)].kind == LayerKind::Block ? 1 : 0;
  }
  return false;
}

bool recomputesAttention(const RecomputePolicy& policy, ModelType type, LayerKind kind, int positions,
                         bool fusedAttention) {
  return policy.mode == Recompute::Selective && kind == LayerKind::Block && isTransformer(type) &&
         !fusedAttention && positions > 1;
}

}  // namespace ms
