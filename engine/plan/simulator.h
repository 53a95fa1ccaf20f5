// The step simulator: times one training step by walking every stage's action list with the cost model's
// durations, the prediction the studio draws beside the engine's measured spans (the same action lists,
// read twice: once here, once by the executor).
//
// The machine it models: one pipeline replica (pp ranks: dp index 0, tp index 0); all DP replicas and TP
// peers run the same lists at the same times, so their spans are copies. Each stage has two lanes:
// - the compute lane runs F, B, W and the optimizer step one after another in list order; a receive blocks
//   it until its message has arrived;
// - the communication lane runs the stage's GradSyncs one after another, each starting when the list reaches
//   it (so it overlaps the compute that follows); the optimizer step waits for all of them.
// Sends never block: a message leaves when the list reaches the send and arrives p2pTime later (the link is
// full-duplex and point-to-point traffic is assumed not to contend with the gradient sync or with other
// messages). Because no lane's timing depends on the order stages are visited, walking the stages round-robin
// until every list is done gives the same times as an event queue.
//
// What always holds: on every rank the compute-lane spans (F, B, W, O and the waits of receives) do not
// overlap and appear in list order; every span has end >= start >= 0; stepTime is the latest end of any span.
#pragma once

#include <string>
#include <vector>

#include "plan/cost_model.h"
#include "plan/plan.h"
#include "plan/schedule.h"

namespace ms {

struct SimSpan {
  int rank = 0;
  ActionType type = ActionType::Forward;
  int microbatch = -1;
  int chunk = -1;
  double start = 0;  // seconds from the start of the step
  double end = 0;
};

// A device<->host transfer over the host link under offload (CostModel::hostTransfers), drawn on the
// communication lane inside the action that makes it (`within`, with its microbatch and chunk): at the
// action's start or end, as long as the cost model counts it (the engine moves a "parameters" shard layer by
// layer; the simulator puts a chunk's at the action's start, its gradient shards at the end).
struct SimHostTransfer {
  int rank = 0;
  ActionType within = ActionType::Forward;
  int microbatch = -1;
  int chunk = -1;
  bool toHost = false;  // device -> host (gradients), else host -> device (parameters)
  double start = 0;
  double end = 0;
};

// overlap_param_gather (ZeRO 1-2): a chunk's parameter all-gather on the communication lane, from the step's
// start (the previous step's optimizer has just ended), its layers' parts one after another
// (CostModel::paramGatherPieces); the chunk's forward layers wait for their parts.
struct SimParamGather {
  int rank = 0;
  int chunk = -1;
  double start = 0;
  double end = 0;
};

// Whether a span of this type sits on the compute lane. Receives are shown there as the time the lane waits
// (zero length when the message was already in); sends are drawn as the message in flight, from the send to
// its arrival, and GradSyncs on the communication lane.
bool onComputeLane(ActionType type);

struct SimResult {
  std::vector<std::vector<SimSpan>> spansByRank;                  // (R): each rank's spans in its list order
  std::vector<std::vector<SimHostTransfer>> hostTransfersByRank;  // (R): offload's, in list order
  std::vector<std::vector<SimParamGather>> paramGathersByRank;    // (R): overlap_param_gather's, chunk order
  // Per rank: 1 - (busy time of F, B and W on its compute lane) / (the pipeline span: earliest F start to
  // latest B or W end over all stages). The optimizer step and any gradient-sync tail are outside the span.
  std::vector<double> bubbleFraction;  // (R)
  double pipelineSpan = 0;             // seconds, the denominator above
  double stepTime = 0;                 // seconds, the latest end of any action on any rank
  double tokensPerSecond = 0;          // batch_size * samplePositions / stepTime (samples/s for mlp)
  // Model FLOPs per step / (stepTime * sum over ranks of the device's peak in the run's precision), model
  // FLOPs = 3 * (sum of the layers' forwardFlopsPerSample) * batch_size: forward plus a 2x backward,
  // attention included, recomputation not counted (the MFU of Chowdhery et al. 2022, PaLM, appendix B).
  double mfu = 0;
  // True when every rank's device has a published peak (DeviceSpec::publishedPeak): only then is mfu an
  // MFU a person can compare with published runs, and only then do the studio and `plan` print it.
  bool mfuDefined = false;
  double modelFlopsPerStep = 0;
  // Empty when every list ran to its end; else which stage is blocked on which action (a hand-edited schedule
  // that deadlocks; buildPlan's schedules never do). The figures then cover the part that ran.
  std::string error;
};

// spansPerRank false leaves spansByRank, hostTransfersByRank and paramGathersByRank empty (every other figure
// is the same): the auto-planner's simulations of 16384-rank plans with hundreds of microbatches would
// otherwise copy each stage's spans to every one of its ranks (gigabytes).
SimResult simulate(const Plan& plan, const CostModel& costs, bool spansPerRank = true);

}  // namespace ms
