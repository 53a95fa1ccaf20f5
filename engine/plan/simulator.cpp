// The step simulator; see simulator.h for the machine it models. Messages are matched by schedule.h's
// transfer convention: a send and a receive are one message iff they have the same kind, microbatch and
// chunk.
#include "plan/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

namespace ms {

bool onComputeLane(ActionType type) {
  switch (type) {
    case ActionType::Forward:
    case ActionType::Backward:
    case ActionType::BackwardWeight:
    case ActionType::RecvActivation:
    case ActionType::RecvGrad:
    case ActionType::OptimizerStep:
      return true;
    case ActionType::SendActivation:
    case ActionType::SendGrad:
    case ActionType::GradSync:
      return false;
  }
  return false;
}

namespace {

bool isPipelineWork(ActionType type) {
  return type == ActionType::Forward || type == ActionType::Backward || type == ActionType::BackwardWeight;
}

using MessageKey = std::tuple<bool, int, int>;  // (gradient?, microbatch, producing chunk)

MessageKey messageKey(const Action& a) {
  const bool gradient = a.type == ActionType::SendGrad || a.type == ActionType::RecvGrad;
  return {gradient, a.microbatch, a.chunk};
}

// The state of one stage while its list is walked.
struct Lanes {
  size_t next = 0;           // index of the next action
  double compute = 0;        // when the compute lane is free
  double communication = 0;  // when the communication lane is free
  std::vector<SimSpan> spans;
  std::vector<SimHostTransfer> transfers;
  // overlap_param_gather: when each layer's parameter all-gather ends, per chunk of the stage (in its order).
  std::map<int, std::vector<double>> gathered;
  std::vector<SimParamGather> gathers;  // the same, a span per chunk
};

// Offload's host-link transfers inside a compute action's span (CostModel::hostTransfers).
void addHostTransfers(const SimSpan& span, const CostModel::HostTransfers& t,
                      std::vector<SimHostTransfer>& out) {
  auto add = [&](bool toHost, double start, double end) {
    if (end > start) out.push_back({0, span.type, span.microbatch, span.chunk, toHost, start, end});
  };
  add(false, span.start, span.start + t.uploadFirst);
  add(true, span.start, span.start + t.downloadFirst);
  add(true, span.end - t.downloadLast, span.end);
  add(false, span.end - t.uploadLast, span.end);
}

// Runs stage s's list as far as its receives allow; returns whether any action ran.
bool advance(const std::vector<Action>& actions, int s, const CostModel& costs,
             std::map<MessageKey, double>& arrivals, Lanes& lanes) {
  bool ran = false;
  while (lanes.next < actions.size()) {
    const Action& a = actions[lanes.next];
    SimSpan span{0, a.type, a.microbatch, a.chunk, 0, 0};
    switch (a.type) {
      case ActionType::Forward: {
        const auto g = lanes.gathered.find(a.chunk);
        const double d = costs.actionTime(a, s);
        if (g == lanes.gathered.end() || g->second.empty() || g->second.back() <= lanes.compute) {
          span.start = lanes.compute;
          span.end = lanes.compute = span.start + d;
          break;
        }
        // Each layer waits for its parameters' all-gather (CostModel::paramGatherPieces).
        const std::vector<double> shares = costs.forwardShares(a.chunk);
        double t = span.start = std::max(lanes.compute, g->second.front());
        for (size_t i = 0; i < shares.size() && i < g->second.size(); ++i)
          t = std::max(t, g->second[i]) + d * shares[i];
        span.end = lanes.compute = t;
        break;
      }
      case ActionType::Backward:
      case ActionType::BackwardWeight:
        span.start = lanes.compute;
        span.end = lanes.compute = span.start + costs.actionTime(a, s);
        break;
      case ActionType::SendActivation:
      case ActionType::SendGrad:
        span.start = lanes.compute;
        span.end = span.start + costs.actionTime(a, s);
        arrivals[messageKey(a)] = span.end;
        break;
      case ActionType::RecvActivation:
      case ActionType::RecvGrad: {
        const auto it = arrivals.find(messageKey(a));
        if (it == arrivals.end()) return ran;  // blocked until the sender gets there
        span.start = lanes.compute;
        span.end = lanes.compute = std::max(lanes.compute, it->second);
        break;
      }
      case ActionType::GradSync: {
        // Each layer's part starts once that layer's gradients are final inside the chunk's last backward
        // work (CostModel::gradSyncPieces), one after another on the communication lane.
        const ActionType last = costs.splitBackward() ? ActionType::BackwardWeight : ActionType::Backward;
        if (!costs.collectivesOverlapCompute(s)) {
          // A CPU rank: the sync runs when the rank waits for it, its compute held (CostModel).
          span.start = std::max(lanes.compute, lanes.communication);
          span.end = lanes.communication = lanes.compute = span.start + costs.actionTime(a, s);
          break;
        }
        const SimSpan* work = nullptr;
        for (auto it = lanes.spans.rbegin(); it != lanes.spans.rend() && !work; ++it)
          if (it->type == last && it->chunk == a.chunk) work = &*it;
        if (!work || costs.communication() == Communication::Free) {
          span.start = std::max(lanes.compute, lanes.communication);
          span.end = lanes.communication = span.start + costs.actionTime(a, s);
          break;
        }
        const std::vector<CostModel::SyncPiece> pieces = costs.gradSyncPieces(a.chunk);
        double t = lanes.communication, first = -1;
        for (size_t i = pieces.size(); i-- > 0;) {
          const double ready = work->start + pieces[i].readyFraction * (work->end - work->start);
          const double start = std::max(t, ready);
          if (first < 0) first = start;
          t = start + pieces[i].seconds;
        }
        span.start = first < 0 ? std::max(lanes.compute, lanes.communication) : first;
        span.end = lanes.communication = std::max(t, span.start);
        break;
      }
      case ActionType::OptimizerStep:
        span.start = std::max(lanes.compute, lanes.communication);  // after every GradSync of the stage
        span.end = lanes.compute = span.start + costs.actionTime(a, s);
        break;
    }
    if (onComputeLane(a.type) && a.type != ActionType::RecvActivation && a.type != ActionType::RecvGrad)
      addHostTransfers(span, costs.hostTransfers(a, s), lanes.transfers);
    lanes.spans.push_back(span);
    ++lanes.next;
    ran = true;
  }
  return ran;
}

}  // namespace

SimResult simulate(const Plan& plan, const CostModel& costs, bool spansPerRank) {
  const PipelineSchedule& schedule = plan.schedule;
  const int P = static_cast<int>(schedule.actions.size());
  std::vector<Lanes> lanes(static_cast<size_t>(P));
  // overlap_param_gather: each stage's gathers run one after another from the step's start, chunk by chunk.
  for (int s = 0; s < P && s < plan.partition.stages; ++s) {
    Lanes& l = lanes[static_cast<size_t>(s)];
    for (int k : plan.partition.chunksOfStage(s)) {
      const std::vector<double> pieces = costs.paramGatherPieces(k);
      if (pieces.empty()) continue;
      std::vector<double>& ends = l.gathered[k];
      const double start = l.communication;
      for (double piece : pieces) ends.push_back(l.communication += piece);
      l.gathers.push_back({0, k, start, l.communication});
    }
  }
  std::map<MessageKey, double> arrivals;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s)
      progress = advance(schedule.actions[static_cast<size_t>(s)], s, costs, arrivals,
                         lanes[static_cast<size_t>(s)]) ||
                 progress;
  }

  SimResult result;
  for (int s = 0; s < P && result.error.empty(); ++s) {
    const auto& actions = schedule.actions[static_cast<size_t>(s)];
    const size_t at = lanes[static_cast<size_t>(s)].next;
    if (at < actions.size())
      result.error = "stage " + std::to_string(s) + " waits forever at action " + std::to_string(at) + ", " +
                     describe(actions[at]) + ": its message is never sent";
  }

  // Per stage: busy pipeline work, the pipeline span over all stages, the step time.
  double firstForward = std::numeric_limits<double>::infinity(), lastWork = 0;
  std::vector<double> busy(static_cast<size_t>(P), 0.0);
  for (int s = 0; s < P; ++s)
    for (const SimSpan& span : lanes[static_cast<size_t>(s)].spans) {
      result.stepTime = std::max(result.stepTime, span.end);
      if (!isPipelineWork(span.type)) continue;
      busy[static_cast<size_t>(s)] += span.end - span.start;
      lastWork = std::max(lastWork, span.end);
      if (span.type == ActionType::Forward) firstForward = std::min(firstForward, span.start);
    }
  result.pipelineSpan = std::isfinite(firstForward) ? lastWork - firstForward : 0.0;

  // Every rank gets its stage's spans (TP and DP peers run the same list at the same times).
  const int world = plan.layout.world();
  if (spansPerRank) {
    result.spansByRank.resize(static_cast<size_t>(world));
    result.hostTransfersByRank.resize(static_cast<size_t>(world));
    result.paramGathersByRank.resize(static_cast<size_t>(world));
  }
  result.bubbleFraction.assign(static_cast<size_t>(world), 0.0);
  double peakSum = 0;
  bool allPublished = true;
  for (int r = 0; r < world; ++r) {
    const int s = plan.stageOfRank(r);
    if (s < 0 || s >= P) continue;
    if (spansPerRank) {
      auto& spans = result.spansByRank[static_cast<size_t>(r)];
      spans = lanes[static_cast<size_t>(s)].spans;
      for (SimSpan& span : spans) span.rank = r;
      auto& transfers = result.hostTransfersByRank[static_cast<size_t>(r)];
      transfers = lanes[static_cast<size_t>(s)].transfers;
      for (SimHostTransfer& t : transfers) t.rank = r;
      auto& gathers = result.paramGathersByRank[static_cast<size_t>(r)];
      gathers = lanes[static_cast<size_t>(s)].gathers;
      for (SimParamGather& g : gathers) g.rank = r;
    }
    result.bubbleFraction[static_cast<size_t>(r)] =
        result.pipelineSpan > 0 ? 1.0 - busy[static_cast<size_t>(s)] / result.pipelineSpan : 0.0;
    const DeviceSpec& device = r < static_cast<int>(plan.layout.deviceOf.size())
                                   ? plan.mesh.devices[static_cast<size_t>(plan.layout.deviceOf[r])].spec
                                   : stageDevice(plan, s);
    peakSum += device.peakFlops(plan.config.parallel.precision);
    allPublished = allPublished && device.publishedPeak;
  }

  double forwardFlopsPerSample = 0;
  for (const auto& layer : plan.model.layers) forwardFlopsPerSample += layer.forwardFlopsPerSample;
  // Under context parallelism the spec is one rank's slice of a sample (model_spec.h): cp slices each.
  const double samples = plan.config.training.batchSize, slices = std::max(1, plan.model.contextParallel);
  result.modelFlopsPerStep = 3.0 * forwardFlopsPerSample * samples * slices;
  if (result.stepTime > 0) {
    result.tokensPerSecond = samples * slices * plan.model.samplePositions / result.stepTime;
    if (peakSum > 0) result.mfu = result.modelFlopsPerStep / (result.stepTime * peakSum);
  }
  result.mfuDefined = allPublished && peakSum > 0 && result.stepTime > 0;
  return result;
}

}  // namespace ms
