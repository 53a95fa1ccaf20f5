// Partitions of the model's layers into chunks and stages; see partition.h.
#include "plan/partition.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace ms {

std::vector<int> Partition::chunksOfStage(int stage) const {
  std::vector<int> out;
  for (int k = 0; k < static_cast<int>(stageOf.size()); ++k)
    if (stageOf[k] == stage) out.push_back(k);
  return out;
}

std::vector<int> Partition::layersOfStage(int stage) const {
  std::vector<int> out;
  for (int k : chunksOfStage(stage)) out.insert(out.end(), chunks[k].begin(), chunks[k].end());
  return out;
}

namespace {

// Chunks from cut points: chunk k holds layers [cuts[k], cuts[k+1]).
Partition fromCuts(const std::vector<int>& cuts, int stages, int chunksPerStage) {
  Partition p;
  p.stages = stages;
  p.chunksPerStage = chunksPerStage;
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    std::vector<int> layers(cuts[k + 1] - cuts[k]);
    std::iota(layers.begin(), layers.end(), cuts[k]);
    p.chunks.push_back(std::move(layers));
    p.stageOf.push_back(static_cast<int>(k) % stages);
  }
  return p;
}

}  // namespace

Partition evenPartition(const ModelSpec& model, int stages, int chunksPerStage) {
  const int L = static_cast<int>(model.layers.size());
  const int K = stages * chunksPerStage;
  std::vector<int> cuts{0};
  for (int k = 0; k < K; ++k) cuts.push_back(cuts.back() + L / K + (k < L % K ? 1 : 0));
  return fromCuts(cuts, stages, chunksPerStage);
}

// Optimal contiguous split of costs into K non-empty parts minimising the largest part (the linear partition
// problem; dynamic programming over prefix sums, O(K * L^2), which is instant for the few hundred layers a
// model has). For V > 1 the chunks are balanced individually, which balances the stages' sums of V chunks to
// within one chunk's imbalance; an exact per-stage optimum over interleaved chunk sums is not attempted.
Partition balancedPartition(const ModelSpec& model, int stages, int chunksPerStage,
                            const std::vector<double>& layerCost) {
  const int L = static_cast<int>(model.layers.size());
  const int K = stages * chunksPerStage;
  if (K >= L || static_cast<int>(layerCost.size()) != L) return evenPartition(model, stages, chunksPerStage);
  std::vector<double> prefix(L + 1, 0.0);
  for (int i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + layerCost[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][i]: the smallest bottleneck splitting layers [0, i) into k parts; from[k][i] the last cut.
  std::vector<std::vector<double>> best(K + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> from(K + 1, std::vector<int>(L + 1, 0));
  best[0][0] = 0.0;
  for (int k = 1; k <= K; ++k) {
    for (int i = k; i <= L - (K - k); ++i) {
      for (int j = k - 1; j < i; ++j) {
        const double v = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        // Ties go to the later cut so that earlier chunks stay small: the first stage also holds the
        // most in-flight activations under 1F1B.
        if (v <= best[k][i]) {
          best[k][i] = v;
          from[k][i] = j;
        }
      }
    }
  }
  std::vector<int> cuts(K + 1);
  cuts[K] = L;
  for (int k = K; k > 0; --k) cuts[k - 1] = from[k][cuts[k]];
  return fromCuts(cuts, stages, chunksPerStage);
}

Expected<Partition> partitionFromConfig(const ParallelConfig& parallel, const ModelSpec& model) {
  if (parallel.placement.empty()) {
    const int L = static_cast<int>(model.layers.size());
    if (L < parallel.pp * parallel.virtualChunks)
      return Status::error("/parallel/pp: " + std::to_string(parallel.pp * parallel.virtualChunks) +
                           " chunks need at least as many layers; the model has " + std::to_string(L));
    return evenPartition(model, parallel.pp, parallel.virtualChunks);
  }
  Partition p;
  p.stages = parallel.pp;
  p.chunksPerStage = parallel.virtualChunks;
  int expected = 0;
  for (size_t c = 0; c < parallel.placement.size(); ++c) {
    const ChunkPlacement& chunk = parallel.placement[c];
    std::vector<int> layers;
    for (const std::string& name : chunk.layers) {
      const int index = model.layerIndex(name);
      if (index != expected)
        return Status::error("/parallel/placement/" + std::to_string(c) + "/layers: \"" + name +
                             "\" is not the next layer in model order");
      layers.push_back(index);
      ++expected;
    }
    if (layers.empty()) return Status::error("/parallel/placement/" + std::to_string(c) + "/layers: empty chunk");
    p.chunks.push_back(std::move(layers));
    p.stageOf.push_back(chunk.stage);
  }
  if (expected != static_cast<int>(model.layers.size()))
    return Status::error("/parallel/placement: layer \"" + model.layers[expected].name + "\" is placed nowhere");
  return p;
}

std::vector<ChunkPlacement> toPlacement(const Partition& partition, const ModelSpec& model) {
  std::vector<ChunkPlacement> out;
  for (size_t k = 0; k < partition.chunks.size(); ++k) {
    ChunkPlacement c;
    c.stage = partition.stageOf[k];
    for (int l : partition.chunks[k]) c.layers.push_back(model.layers[l].name);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace ms
