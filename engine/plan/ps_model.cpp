// Parameter-server predictions; see ps_model.h.
#include "plan/ps_model.h"

#include <algorithm>
#include <cmath>

#include "plan/cost_model.h"
#include "plan/hardware.h"
#include "plan/memory_model.h"
#include "plan/parameter_server.h"
#include "plan/plan.h"

namespace ms {

namespace {

constexpr double kFallbackHostBandwidth = 20e9;  // bytes/s, a server's share of DRAM bandwidth when unknown

LinkSpec sameNodeLink() {
  if (auto shm = findLink("shm")) return *shm;
  return LinkSpec{"shm", 10e9, 1e-6, nullptr, false};
}

}  // namespace

Expected<PsPrediction> predictParameterServer(const RunConfig& config) {
  if (config.parallel.mode != ParallelMode::ParameterServer)
    return Status::error("/parallel/mode: not \"parameter_server\"");
  auto planned = buildPlan(config, /*allowSharing=*/true);
  if (!planned) return planned.status();
  const Plan& plan = *planned;
  const int S = config.parallel.servers, W = config.parallel.workers;
  const int M = std::max(1, config.parallel.microbatches);
  auto shards = assignServers(plan.model, config);
  if (!shards) return shards.status();
  const CostModel costs(plan);
  const std::vector<MemoryBreakdown> memory = estimateMemory(plan);
  const MemoryBreakdown& single = memory.at(0);
  const bool mixed = config.parallel.precision == Precision::Bf16;
  const double P = double(plan.model.paramCount());
  const LinkSpec local = sameNodeLink();
  PsPrediction out;
  out.consistency = config.parallel.consistency;

  // Servers.
  const bool adam = config.optimizer.type == OptimizerType::AdamW;
  const bool sync = config.parallel.consistency == Consistency::Sync;
  for (int s = 0; s < S; ++s) {
    PsServerPrediction p;
    p.index = s;
    p.node = serverNode(config, s);
    p.layers = shards->layers[s];
    p.params = double(shards->params[s]);
    p.parameterBytes = 4 * p.params;
    p.gradientBytes = 4 * p.params;
    p.optimizerBytes = (adam ? 8 : 4) * p.params;
    p.otherBytes = 4 * p.params * (sync ? W + 1 : 2);
    // Host bandwidth of the server's node: its first device's share. Its host memory: the GPUs' shares
    // summed; CPU devices of a node share one machine's memory (the catalog gives each the whole of it).
    double hostBw = 0, gpuShares = 0, cpuMemory = 0;
    for (const MeshDevice& d : plan.mesh.devices) {
      if (d.node != p.node) continue;
      if (hostBw <= 0) hostBw = d.spec.hostMemoryBandwidth;
      if (isGpuDevice(d.spec))
        gpuShares += d.spec.hostMemoryBytes;
      else
        cpuMemory =
            std::max(cpuMemory, d.spec.hostMemoryBytes > 0 ? d.spec.hostMemoryBytes : d.spec.memoryBytes);
    }
    p.capacity = gpuShares > 0 ? gpuShares : cpuMemory;
    if (hostBw <= 0) hostBw = kFallbackHostBandwidth;
    const double perParam = (adam ? 28.0 : 20.0) + (sync ? 4.0 * W + 4.0 : 0.0);
    p.updateTime = perParam * p.params / hostBw;
    out.servers.push_back(p);
  }

  // Workers.
  double compute1 = 0;  // one worker's forward and backward over its microbatches, unslowed
  for (int k = 0; k < costs.chunkCount(); ++k)
    compute1 += costs.forwardTime(k) + costs.backwardTime(k) + costs.weightTime(k);
  compute1 *= M;
  for (int w = 0; w < W; ++w) {
    PsWorkerPrediction p;
    p.index = w;
    p.device = std::min(w, plan.mesh.deviceCount() - 1);
    const MeshDevice& dev = plan.mesh.devices[static_cast<size_t>(p.device)];
    p.capacity = dev.spec.memoryBytes;
    p.parameterBytes = single.parameters;
    p.gradientBytes = single.gradients;
    p.optimizerBytes = mixed ? 4 * P : 0;
    p.activationBytes = single.activations;
    p.otherBytes = single.other;
    for (const Straggler& st : config.parallel.stragglers)
      if (st.worker == w) p.slowdown = st.slowdown;
    p.computeTime = compute1 * p.slowdown;
    // Every server's shard, over the link to its node; GPU workers also through the host link.
    double localBytes = 0, remoteBytes = 0;
    for (const PsServerPrediction& s : out.servers)
      (s.node == dev.node ? localBytes : remoteBytes) += 4 * s.params;
    double t = std::max(localBytes / local.bandwidth, remoteBytes / plan.mesh.interLink.bandwidth);
    t += remoteBytes > 0 ? plan.mesh.interLink.latency : local.latency;
    if (dev.spec.hostLinkBandwidth > 0 && dev.spec.name != "cpu") t += 4 * P / dev.spec.hostLinkBandwidth;
    p.pullTime = t;
    p.pushTime = t;
    out.workers.push_back(p);
  }
  // A server's link: every worker's pull and push of its shard.
  for (PsServerPrediction& s : out.servers) {
    double t = 0;
    for (const PsWorkerPrediction& w : out.workers) {
      const bool remote = plan.mesh.devices[static_cast<size_t>(w.device)].node != s.node;
      t += 2 * 4 * s.params / (remote ? plan.mesh.interLink.bandwidth : local.bandwidth);
    }
    s.linkTime = t;
  }

  double slowestCycle = 0, linkBound = 0, updateBound = 0;
  for (const PsWorkerPrediction& w : out.workers) slowestCycle = std::max(slowestCycle, w.cycleTime());
  for (const PsServerPrediction& s : out.servers) {
    linkBound = std::max(linkBound, s.linkTime);
    updateBound = std::max(updateBound, s.updateTime);
  }
  const double B = config.training.batchSize;
  const double share = B / W;
  switch (config.parallel.consistency) {
    case Consistency::Sync:
      out.stepTime = std::max(slowestCycle, linkBound) + updateBound;
      out.meanStaleness = 0;
      break;
    case Consistency::Async:
    case Consistency::Bounded: {
      double rate = 0;  // pushes per second
      for (const PsWorkerPrediction& w : out.workers)
        rate += config.parallel.consistency == Consistency::Async ? 1.0 / w.cycleTime() : 1.0 / slowestCycle;
      // Each push is one update on every server and crosses its link twice (pull and push).
      if (updateBound > 0) rate = std::min(rate, 1.0 / updateBound);
      if (linkBound > 0) rate = std::min(rate, double(W) / linkBound);
      out.stepTime = B / (rate * share);
      // Little's law: W gradients are in flight, so a push finds W - 1 others applied since its pull.
      out.meanStaleness = W - 1;
      if (config.parallel.consistency == Consistency::Bounded)
        out.meanStaleness = std::min<double>(out.meanStaleness, (config.parallel.staleness + 1.0) * W - 1);
      break;
    }
  }
  out.samplesPerSecond = B / out.stepTime;

  // Timeline: two steps' span, for the first kTimelineWorkers workers and kTimelineServers servers (a
  // thousand lanes are not read one by one; the tables have them all), at most kTimelineUpdates update spans
  // per server lane.
  constexpr int kTimelineWorkers = 16, kTimelineServers = 8;
  constexpr size_t kTimelineUpdates = 2000;
  const double span = 2 * out.stepTime;
  if (sync) {
    double t0 = 0;
    for (int step = 0; step < 2; ++step) {
      double lastPush = t0;
      for (const PsWorkerPrediction& w : out.workers) {
        const double a = t0, b = a + w.pullTime, c = b + w.computeTime, d = c + w.pushTime;
        if (w.index < kTimelineWorkers) {
          out.timeline.push_back({false, w.index, 'P', a, b});
          out.timeline.push_back({false, w.index, 'C', b, c});
          out.timeline.push_back({false, w.index, 'S', c, d});
        }
        lastPush = std::max(lastPush, d);
      }
      lastPush = std::max(lastPush, t0 + linkBound);
      double end = lastPush;
      for (const PsServerPrediction& s : out.servers) {
        if (s.index < kTimelineServers)
          out.timeline.push_back({true, s.index, 'U', lastPush, lastPush + s.updateTime});
        end = std::max(end, lastPush + s.updateTime);
      }
      t0 = end;
    }
  } else {
    std::vector<double> serverFree(out.servers.size(), 0.0);
    std::vector<std::pair<double, int>> pushes;  // (arrival, worker)
    for (const PsWorkerPrediction& w : out.workers) {
      const double cycle = config.parallel.consistency == Consistency::Bounded ? slowestCycle : w.cycleTime();
      const double idle = cycle - w.cycleTime();  // bounded: waiting for the slowest
      for (double t = 0; t < span;) {
        const double b = t + w.pullTime, c = b + w.computeTime, d = c + w.pushTime;
        if (w.index < kTimelineWorkers) {
          out.timeline.push_back({false, w.index, 'P', t, b});
          out.timeline.push_back({false, w.index, 'C', b, c});
          out.timeline.push_back({false, w.index, 'S', c, d});
        }
        pushes.push_back({d, w.index});
        t = d + idle;
        if (cycle <= 0) break;
      }
    }
    std::sort(pushes.begin(), pushes.end());
    if (pushes.size() > kTimelineUpdates) pushes.resize(kTimelineUpdates);
    for (const auto& [arrival, worker] : pushes)
      for (size_t s = 0; s < std::min<size_t>(out.servers.size(), kTimelineServers); ++s) {
        const double start = std::max(arrival, serverFree[s]);
        out.timeline.push_back({true, out.servers[s].index, 'U', start, start + out.servers[s].updateTime});
        serverFree[s] = start + out.servers[s].updateTime;
      }
  }
  return out;
}

}  // namespace ms
