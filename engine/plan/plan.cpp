// buildPlan(): a run config to a consistent Plan; see plan.h.
#include "plan/plan.h"

#include <algorithm>
#include <string>

#include "plan/cost_model.h"
#include "plan/recompute.h"

namespace ms {

int replicaRank(const Plan& plan, int stage) {
  return plan.layout.rank(RankCoord{0, 0, stage});
}

const DeviceSpec& stageDevice(const Plan& plan, int stage) {
  const int rank = replicaRank(plan, stage);
  const auto& deviceOf = plan.layout.deviceOf;
  if (rank < static_cast<int>(deviceOf.size()))
    return plan.mesh.devices[static_cast<size_t>(deviceOf[rank])].spec;
  return plan.mesh.devices.front().spec;
}

namespace {
// Each chunk's last layer's output elements as one rank holds and sends them (a sequence piece between two
// blocks under sequence parallelism: runtime/pipeline.cpp chunkOutFloats) * microbatch size, times
// bytesPerElement.
std::vector<double> chunkMessageElements(const Plan& plan, double bytesPerElement) {
  const double scale = plan.microbatchSize();
  std::vector<double> bytes;
  for (const auto& chunk : plan.partition.chunks)
    bytes.push_back(
        chunk.empty()
            ? 0.0
            : double(plan.model.layers[static_cast<size_t>(chunk.back())].heldOutputBytesPerSample()) / 4.0 *
                  bytesPerElement * scale);
  return bytes;
}
}  // namespace

std::vector<double> chunkMessageBytes(const Plan& plan) {
  // Activations travel as the engine stores them (model_spec.h activationElementBytes).
  return chunkMessageElements(plan, activationElementBytes(plan.config.parallel.precision));
}

Expected<Plan> buildPlan(const RunConfig& config, bool allowSharing) {
  Plan plan;
  plan.config = config;
  plan.model = buildModelSpec(config.model, config.training.seqLen, 784, config.parallel.cp,
                              config.parallel.sequenceParallel ? std::max(1, config.parallel.tp) : 1);
  auto mesh = buildMesh(config.mesh);
  if (!mesh) return mesh.status();
  plan.mesh = std::move(*mesh);
  if (config.parallel.offload != Offload::None)
    for (const MeshDevice& d : plan.mesh.devices)
      if (!(d.spec.hostLinkBandwidth > 0 && d.spec.hostMemoryBytes > 0 && d.spec.hostMemoryBandwidth > 0))
        return Status::error("/parallel/offload: offload " + std::string("\"") +
                             toString(config.parallel.offload) + "\" needs the host side of device type \"" +
                             d.spec.name +
                             "\" (host_link_gbs, host_memory_gb and host_memory_bandwidth_gbs), which is not "
                             "known; describe it in /mesh/device_types");
  auto layout = layoutRanks(config.parallel, plan.mesh, allowSharing);
  if (!layout) return layout.status();
  plan.layout = std::move(layout->layout);
  plan.warnings = std::move(layout->warnings);
  auto partition = partitionFromConfig(config.parallel, plan.model);
  if (!partition) return partition.status();
  plan.partition = std::move(*partition);
  const ParallelConfig& par = config.parallel;
  if (par.recompute == Recompute::Full && par.recomputeLayers > 0) {
    // Megatron's --recompute-num-layers: at most the blocks of a chunk (more would mean "all", which is 0).
    int most = 0;
    for (const auto& chunk : plan.partition.chunks) most = std::max(most, blocksInChunk(plan.model, chunk));
    if (par.recomputeLayers > most)
      return Status::error("/parallel/recompute_layers: " + std::to_string(par.recomputeLayers) +
                           " blocks recomputed per chunk, but no chunk holds more than " +
                           std::to_string(most) + " transformer blocks (0 recomputes all of them)");
  }
  auto schedule =
      generateSchedule(par.schedule, par.pp, par.virtualChunks, par.microbatches, plan.partition.stageOf);
  if (!schedule) return schedule.status().withContext("/parallel/schedule");
  plan.schedule = std::move(*schedule);
  if (Status s = checkSchedule(plan.schedule); !s)
    return s.withContext("internal error: the generated " + std::string(toString(par.schedule)) +
                         " schedule is inconsistent");
  return plan;
}

Expected<RunConfig> withBalancedPlacement(const RunConfig& config, bool allowSharing) {
  auto plan = buildPlan(config, allowSharing);
  if (!plan) return plan.status();
  const CostModel cost(*plan);
  const LayerTimes& t = cost.layerTimes();
  std::vector<double> perLayer(t.forward.size());
  for (size_t i = 0; i < perLayer.size(); ++i)
    perLayer[i] = t.forward[i] + t.backwardInput[i] + t.backwardWeight[i];
  const Partition balanced =
      balancedPartition(plan->model, config.parallel.pp, config.parallel.virtualChunks, perLayer);
  RunConfig out = config;
  out.parallel.placement = toPlacement(balanced, plan->model);
  return out;
}

}  // namespace ms
