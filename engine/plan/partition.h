// The partition: which layers form each model chunk, and which pipeline stage runs each chunk. It comes from
// the config's placement when there is one, else from an even split; a balanced split minimises the slowest
// stage's compute time under the cost model (embedding and head included).
//
// What always holds: chunks cover every layer of the model exactly once, in model order, each chunk a
// non-empty contiguous run of layers; stageOf has one entry per chunk with values in [0, stages); every stage
// holds exactly chunksPerStage chunks.
#pragma once

#include <vector>

#include "common/status.h"
#include "plan/model_spec.h"
#include "plan/run_config.h"

namespace ms {

struct Partition {
  int stages = 1;                        // P
  int chunksPerStage = 1;                // V
  std::vector<std::vector<int>> chunks;  // (K): layer indices of each model chunk, in model order
  std::vector<int> stageOf;              // (K): stage of each chunk
  // The chunks of a stage, in order (its virtual chunks 0..V-1).
  std::vector<int> chunksOfStage(int stage) const;
  // The layers of a stage, over all its chunks.
  std::vector<int> layersOfStage(int stage) const;
};

// The placement from the config (validated there), or an even split into pp * virtual_chunks chunks with
// chunk k on stage k % pp.
Expected<Partition> partitionFromConfig(const ParallelConfig& parallel, const ModelSpec& model);

// Contiguous split of the layers (the embedding and the head count as layers) into P*V chunks whose layer
// counts differ by at most one, the first chunks taking the extra layers; chunk k on stage k % P.
Partition evenPartition(const ModelSpec& model, int stages, int chunksPerStage);

// Contiguous split into P*V chunks minimising the largest per-stage sum of layerCost (a stage's cost is the
// sum over its V chunks), by binary search over the bottleneck for V == 1 and by the same search with chunk
// k on stage k % P for V > 1. layerCost has one entry per model layer (seconds or FLOPs).
Partition balancedPartition(const ModelSpec& model, int stages, int chunksPerStage,
                            const std::vector<double>& layerCost);

// The placement written back as config chunks (layer names), for saving a balanced or auto-planned layout.
std::vector<ChunkPlacement> toPlacement(const Partition& partition, const ModelSpec& model);

}  // namespace ms
