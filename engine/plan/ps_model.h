// Predictions for parameter-server mode (runtime/ps.h): each server's and worker's memory, the time of a
// step with its pull, compute, push and update lanes, throughput, and the staleness asynchronous training
// will see. The studio draws these next to what a run measures; `meshstudio-engine plan` prints them.
//
// The model, and where it approximates:
// - Placement: worker w runs on mesh device w (node-major, as ranks fill the mesh); server s on the node
//   parallel.server_nodes names (else node s mod nodes), a process in host memory beside the workers (the
//   launcher runs everything on one machine today; the prediction is for the mesh).
// - Worker memory: the single-rank plan of the whole model at microbatch batch_size / (workers *
//   microbatches) (plan/memory_model.h), without the optimizer's moments, which live on the servers; under
//   bf16 the worker keeps fp32 copies of the parameters it pulls (4 bytes each, as the engine's store does).
// - Server memory (host): its shard's fp32 parameters, gradients and optimizer moments (plan/model_state.h,
//   fp32), the pull reply's copy of the shard, and under sync the pushes it holds until the step's last one
//   arrives (workers * shard).
// - Compute: a worker's forward and backward over its microbatches from the cost model (the plan's chunk
//   times), times its straggler slowdown.
// - Traffic: a pull and a push move the shard's fp32 values of every server (4 bytes per parameter) over the
//   link between the worker's node and the server's (inter_link across nodes; the catalog's "shm" on one
//   node), plus the device<->host link for GPU workers (their gradients and parameters pass through host
//   memory). A server's link carries every worker's pull and push of its shard: with many workers that link,
//   not the workers', bounds the step (Li et al. 2014, "Scaling Distributed Machine Learning with the
//   Parameter Server", section 5).
// - Update: a server's optimizer step streams its shard's state at its node's host memory bandwidth (the
//   device type's host_dram_gbs, or 20 GB/s when unknown), under sync after summing the pushes.
// - sync: the step ends when the slowest worker's push has reached every server and the servers have
//   updated: max over workers of (pull + compute + push), the servers' link time where it is longer, plus
//   the update. async: each worker cycles pull, compute, push on its own; throughput is the sum of the
//   workers' rates (bounded by the servers' update and link rates), a step is `workers` updates. bounded:
//   async, with the fastest worker held to staleness + 1 steps per step of the slowest.
// - Staleness (async): while worker w computes one cycle c_w, the others apply c_w * sum_{u != w} 1 / c_u
//   updates; the mean over all pushes, weighted by each worker's rate (W - 1 for equal workers). Bounded
//   clips it at (staleness + 1) * workers - 1.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "plan/run_config.h"

namespace ms {

struct PsServerPrediction {
  int index = 0;
  int node = 0;
  std::vector<int> layers;
  double params = 0;          // elements
  double parameterBytes = 0;  // fp32 values
  double gradientBytes = 0;   // fp32
  double optimizerBytes = 0;  // moments
  double otherBytes = 0;      // pull reply copy, sync's held pushes
  double updateTime = 0;      // seconds per update (sync: with the sum of the pushes)
  double linkTime = 0;        // seconds its link is busy per step (every worker's pull and push)
  double capacity = 0;        // its node's host memory (a server lives in host memory): its GPUs' shares, or
                              // the memory its CPU devices share; 0 when the catalog has none
  double total() const { return parameterBytes + gradientBytes + optimizerBytes + otherBytes; }
};

struct PsWorkerPrediction {
  int index = 0;
  int device = 0;
  double parameterBytes = 0, gradientBytes = 0, optimizerBytes = 0, activationBytes = 0, otherBytes = 0;
  double capacity = 0;     // its device's memory
  double computeTime = 0;  // forward and backward of its share, slowdown included
  double pullTime = 0;     // every server's shard
  double pushTime = 0;
  double slowdown = 1;
  double cycleTime() const { return pullTime + computeTime + pushTime; }
  double total() const {
    return parameterBytes + gradientBytes + optimizerBytes + activationBytes + otherBytes;
  }
};

// One span of the predicted timeline: lane "worker N" (pull, compute, push) or "server N" (update).
struct PsSpan {
  bool server = false;
  int index = 0;
  char action = 'C';  // 'P' pull, 'C' compute (forward and backward), 'S' push (send), 'U' update
  double start = 0, end = 0;
};

struct PsPrediction {
  Consistency consistency = Consistency::Sync;
  std::vector<PsServerPrediction> servers;
  std::vector<PsWorkerPrediction> workers;
  double stepTime = 0;           // seconds per global step (batch_size samples)
  double samplesPerSecond = 0;   // batch_size / stepTime
  double meanStaleness = 0;      // versions; 0 under sync
  std::vector<PsSpan> timeline;  // two global steps (sync) or the same time span (async, bounded)
};

Expected<PsPrediction> predictParameterServer(const RunConfig& config);

}  // namespace ms
