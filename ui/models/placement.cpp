// Placement edits; see placement.h.
#include "ui/models/placement.h"

#include <algorithm>

#include "plan/model_spec.h"
#include "plan/partition.h"
#include "plan/plan.h"
#include "ui/models/plan_analysis.h"

namespace ms {

Expected<LayerPlacement> layerPlacement(const RunConfig& config) {
  const ModelSpec spec = buildModelSpec(config.model, config.training.seqLen);
  auto partition = partitionFromConfig(config.parallel, spec);
  if (!partition) return partition.status();
  LayerPlacement out;
  out.stageOfLayer.assign(spec.layers.size(), 0);
  out.chunkOfLayer.assign(spec.layers.size(), 0);
  for (size_t k = 0; k < partition->chunks.size(); ++k)
    for (int layer : partition->chunks[k]) {
      out.stageOfLayer[static_cast<size_t>(layer)] = partition->stageOf[k];
      out.chunkOfLayer[static_cast<size_t>(layer)] = static_cast<int>(k);
    }
  return out;
}

Expected<RunConfig> withStages(const RunConfig& config, const std::vector<int>& stageOfLayer,
                               std::vector<std::string>* changes) {
  const std::vector<std::string> names = modelLayerNames(config.model);
  if (stageOfLayer.size() != names.size())
    return Status::error("the placement names " + std::to_string(stageOfLayer.size()) +
                         " layers, the model has " + std::to_string(names.size()));
  const int pp = config.parallel.pp;
  std::vector<ChunkPlacement> chunks;
  for (size_t i = 0; i < names.size(); ++i) {
    const int s = stageOfLayer[i];
    if (s < 0 || s >= pp)
      return Status::error("stage " + std::to_string(s) + " does not exist: pp is " + std::to_string(pp));
    if (chunks.empty() || chunks.back().stage != s) chunks.push_back(ChunkPlacement{s, {}});
    chunks.back().layers.push_back(names[i]);
  }
  std::vector<int> perStage(static_cast<size_t>(pp), 0);
  for (const ChunkPlacement& c : chunks) ++perStage[static_cast<size_t>(c.stage)];
  for (int s = 0; s < pp; ++s)
    if (perStage[static_cast<size_t>(s)] == 0)
      return Status::error("stage " + std::to_string(s) + " would hold no layer (every stage of pp = " +
                           std::to_string(pp) + " needs at least one)");
  const int v = *std::max_element(perStage.begin(), perStage.end());
  for (int s = 0; s < pp; ++s)
    if (perStage[static_cast<size_t>(s)] != v) {
      const int most =
          static_cast<int>(std::max_element(perStage.begin(), perStage.end()) - perStage.begin());
      return Status::error("stage " + std::to_string(most) + " would hold " + std::to_string(v) +
                           " chunks but stage " + std::to_string(s) + " " +
                           std::to_string(perStage[static_cast<size_t>(s)]) +
                           ": an interleaved placement needs the same number of chunks on every stage");
    }
  RunConfig out = config;
  out.parallel.placement = chunks;
  if (out.parallel.virtualChunks != v) {
    if (changes)
      changes->push_back("virtual_chunks " + std::to_string(out.parallel.virtualChunks) + " -> " +
                         std::to_string(v));
    out.parallel.virtualChunks = v;
  }
  if (v > 1 && out.parallel.schedule != Schedule::Interleaved1F1B) {
    if (changes)
      changes->push_back(std::string("schedule ") + toString(out.parallel.schedule) +
                         " -> interleaved_1f1b (several chunks per stage)");
    out.parallel.schedule = Schedule::Interleaved1F1B;
  }
  const ConfigErrors errors = validateRunConfig(out);
  if (!errors.empty()) return Status::error(errors.front().path + ": " + errors.front().message);
  auto plan = buildPlan(out, allowsDeviceSharing(out));
  if (!plan) return plan.status();
  return out;
}

Expected<RunConfig> placeLayers(const RunConfig& config, int first, int last, int stage,
                                std::vector<std::string>* changes) {
  auto current = layerPlacement(config);
  if (!current) return current.status();
  std::vector<int> stages = current->stageOfLayer;
  const int n = static_cast<int>(stages.size());
  if (first > last) std::swap(first, last);
  if (first < 0 || last >= n)
    return Status::error("layers " + std::to_string(first) + ".." + std::to_string(last) +
                         " are out of range: the model has " + std::to_string(n));
  for (int i = first; i <= last; ++i) stages[static_cast<size_t>(i)] = stage;
  return withStages(config, stages, changes);
}

}  // namespace ms
