// Checkpoints: a directory holding model.safetensors (the parameters; for gpt under the Hugging Face GPT-2
// names and layouts), optimizer.safetensors (the optimizer's moments), state.json (step, seed, RNG position,
// optimizer steps), config.json (the run config that produced it) and manifest.json (each file's size and
// SHA-256, and the step; written last).
//
// What always holds: a checkpoint directory is written completely in a staging directory and swapped in with
// replaceDirectory(), so a crash leaves the previous checkpoint intact; loading checks every parameter's name
// and shape and says which one is missing or wrong; extra tensors that Hugging Face GPT-2 files carry (the
// attention mask buffers "h.N.attn.bias" and "h.N.attn.masked_bias", a tied "lm_head.weight") are ignored,
// and a "transformer." prefix is accepted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "plan/run_config.h"
#include "runtime/layers.h"
#include "runtime/optimizer.h"
#include "runtime/parameters.h"

namespace ms {

struct CheckpointInfo {
  int64_t step = 0;            // optimizer steps completed
  int64_t optimizerSteps = 0;  // the optimizer's own step counter (bias correction)
  uint64_t seed = 0;
};

// buffers (every save and load below): the non-trainable state of the layers the rank holds
// (Model::buffers(): the cnn's BatchNorm running statistics), saved into model.safetensors beside the
// parameters under their own names and loaded back from it (a file without them is refused by name). Empty
// for the other models.

// Writes dir (replacing an existing one). optimizer may be nullptr (weights only).
Status saveCheckpoint(const std::string& dir, const RunConfig& config, const ParameterStore& params,
                      const Optimizer* optimizer, const CheckpointInfo& info,
                      const std::vector<LayerBuffer>& buffers = {});

// Loads model.safetensors of dir (or dir itself when it is a .safetensors file) into params.
Status loadWeights(const std::string& dirOrFile, ParameterStore& params,
                   const std::vector<LayerBuffer>& buffers = {});

// Loads weights, optimizer state and state.json. The run config's seed must match the checkpoint's.
Expected<CheckpointInfo> loadCheckpoint(const std::string& dir, const RunConfig& config,
                                        ParameterStore& params, Optimizer& optimizer,
                                        const std::vector<LayerBuffer>& buffers = {});

// Checkpoints of a run under a plan, in the same single-file layout (full tensors), so a run can resume under
// a different plan (dp, tp, pp, ZeRO). Every rank calls these. Save: the ranks' shards (ZeRO slices gathered
// over the data-parallel group, TP pieces and pipeline stages sent to rank 0) are assembled into full tensors
// and rank 0 writes the directory; the returned status is agreed by every rank. Load: every rank reads the
// files and takes its own pieces. groups.world may be null (one process).
struct RankGroups;
struct Plan;
// The buffers of the model come from data-parallel rank 0 of each stage (under "batchnorm": "local" the
// replicas' running statistics differ; under "sync" they are equal).
Status saveCheckpointSharded(const std::string& dir, const Plan& plan, RankGroups& groups,
                             ParameterStore& params, Optimizer& optimizer, const CheckpointInfo& info,
                             const std::vector<LayerBuffer>& buffers = {});
Expected<CheckpointInfo> loadCheckpointSharded(const std::string& dir, const Plan& plan,
                                               ParameterStore& params, Optimizer& optimizer,
                                               const std::vector<LayerBuffer>& buffers = {});

// Checks a checkpoint directory against its manifest.json (written last by the saves above): every file it
// lists has its size and SHA-256, every `required` file is listed, and the step is the directory name's.
// The error names the file and what differs. loadCheckpoint(Sharded) and latestCheckpoint call it; so does
// loadWeights for a directory that has a manifest.
Status verifyCheckpoint(const std::string& dir, const std::vector<std::string>& required);
inline const std::vector<std::string> kResumeFiles = {"model.safetensors", "optimizer.safetensors",
                                                      "state.json", "config.json"};

// The newest checkpoint "<runDir>/checkpoints/step-NNNNNNNN" if it is whole (verifyCheckpoint); an error
// naming it when it is not (and the newest whole one before it, which is never taken silently), or saying
// there is none.
Expected<std::string> latestCheckpoint(const std::string& runDir);
std::string checkpointDirName(const std::string& runDir, int64_t step);
// Deletes all but the newest `keep` whole checkpoints of the run folder ("keep_checkpoints"); a damaged
// one is never counted as kept, and the newest one is never deleted.
Status pruneCheckpoints(const std::string& runDir, int keep);

}  // namespace ms
