// Placement edits, the rules behind dragging layers onto devices. A drop of layers [first, last] on a device
// puts them on that device's pipeline stage; the config's placement is then the maximal runs of consecutive
// layers on one stage, in model order (so a second range dropped on a stage that already holds layers
// elsewhere becomes its second chunk: an interleaved placement). Qt-free apart from the strings.
//
// What always holds: placeLayers() returns either a config that passes validateRunConfig() and buildPlan()
// or the reason the drop is refused (which stage would be empty, which stages hold unequal chunk counts, or
// the plan's own error); it never returns an invalid config.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "plan/run_config.h"

namespace ms {

struct LayerPlacement {
  std::vector<int> stageOfLayer;  // (L) pipeline stage of each model layer
  std::vector<int> chunkOfLayer;  // (L) model chunk of each layer (index into the placement, model order)
};

// Where the config puts every layer (its placement, or the even split when it has none). An error when the
// config's parallel section cannot be partitioned (pp or virtual_chunks out of range).
Expected<LayerPlacement> layerPlacement(const RunConfig& config);

// The config's placement rebuilt from a stage per layer: maximal runs of equal stage become chunks;
// virtual_chunks becomes the chunks per stage, and a placement with more than one chunk per stage switches
// the schedule to interleaved_1f1b (the only schedule that runs several chunks per stage). `changes`, when
// given, receives a sentence per such implied change. Refused when a stage holds no layer or the stages
// hold different numbers of chunks, and when the result fails validation or planning.
Expected<RunConfig> withStages(const RunConfig& config, const std::vector<int>& stageOfLayer,
                               std::vector<std::string>* changes = nullptr);

// Drops model layers [first, last] on `stage`.
Expected<RunConfig> placeLayers(const RunConfig& config, int first, int last, int stage,
                                std::vector<std::string>* changes = nullptr);

}  // namespace ms
