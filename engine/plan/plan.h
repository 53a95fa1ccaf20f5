// The plan: the single source of truth that the studio simulates and the engine executes. It ties a run
// config to everything derived from it: the model spec, the mesh, the ranks and their groups, the partition
// of layers into chunks and stages, and the pipeline schedule (per-stage action lists).
//
// What always holds: a Plan returned by buildPlan() is consistent: layout.world() == dp*cp*tp*pp, the
// partition has pp stages, and the schedule was generated for that partition and passed checkSchedule().
#pragma once

#include <string>
#include <vector>

#include "plan/hardware.h"
#include "plan/layout.h"
#include "plan/model_spec.h"
#include "plan/partition.h"
#include "plan/run_config.h"
#include "plan/schedule.h"

namespace ms {

struct Plan {
  RunConfig config;
  ModelSpec model;
  Mesh mesh;
  RankLayout layout;
  Partition partition;
  PipelineSchedule schedule;
  std::vector<std::string> warnings;
  // Samples per microbatch on one DP replica (run_config.h microbatchSize).
  int microbatchSize() const { return ms::microbatchSize(config); }
  int stageOfRank(int rank) const { return layout.coord(rank).pp; }
};

// Facts about a plan that its memory model, cost model and simulator all read (kept here so neither model
// calls into the other for them).
// The rank that stands for a stage: pipeline replica 0, tp index 0.
int replicaRank(const Plan& plan, int stage);
// That rank's device.
const DeviceSpec& stageDevice(const Plan& plan, int stage);
// The point-to-point message of each chunk (K), bytes per microbatch: its last layer's output
// (heldOutputBytesPerSampleIn(precision) * microbatch size, bf16 under "precision": "bf16", / tp between two
// blocks under sequence parallelism). Chunk
// k's activation goes to chunk k+1; chunk k+1's input gradient, the same size and precision (the engine
// rounds every layer's input gradient to bf16 under "precision": "bf16"), comes back.
std::vector<double> chunkMessageBytes(const Plan& plan);

// Builds and checks the plan. allowSharing lets ranks share devices (the CPU engine); errors name the field.
Expected<Plan> buildPlan(const RunConfig& config, bool allowSharing = false);

// The config with its placement replaced by the balanced partition (balancedPartition over the cost model's
// per-layer forward + backward times on the plan's devices, embedding and head included).
Expected<RunConfig> withBalancedPlacement(const RunConfig& config, bool allowSharing = false);

}  // namespace ms
