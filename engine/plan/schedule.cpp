// Names and readings of a pipeline schedule that need no generator or checker: action names and codes, the
// printable forms, and the activation memory a stage's order implies. An activation of (m, k) is held from
// F(m, k) until the action that ends the backward of (m, k): W when the backward is split, B otherwise.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "plan/schedule.h"

namespace ms {

const char* toString(ActionType t) {
  switch (t) {
    case ActionType::Forward:
      return "Forward";
    case ActionType::Backward:
      return "Backward";
    case ActionType::BackwardWeight:
      return "BackwardWeight";
    case ActionType::SendActivation:
      return "SendActivation";
    case ActionType::RecvActivation:
      return "RecvActivation";
    case ActionType::SendGrad:
      return "SendGrad";
    case ActionType::RecvGrad:
      return "RecvGrad";
    case ActionType::GradSync:
      return "GradSync";
    case ActionType::OptimizerStep:
      return "OptimizerStep";
  }
  return "?";
}

char actionCode(ActionType t) {
  switch (t) {
    case ActionType::Forward:
      return 'F';
    case ActionType::Backward:
      return 'B';
    case ActionType::BackwardWeight:
      return 'W';
    case ActionType::SendActivation:
      return 's';
    case ActionType::RecvActivation:
      return 'r';
    case ActionType::SendGrad:
      return 'S';
    case ActionType::RecvGrad:
      return 'R';
    case ActionType::GradSync:
      return 'G';
    case ActionType::OptimizerStep:
      return 'O';
  }
  return '?';
}

namespace {


std::string token(const Action& a) {
  std::string s(1, actionCode(a.type));
  switch (a.type) {
    case ActionType::GradSync:
      return s + std::to_string(a.chunk);
    case ActionType::OptimizerStep:
      return s;
    default:
      break;
  }
  s += std::to_string(a.microbatch);
  s += '.';
  s += std::to_string(a.chunk);
  if (isSend(a.type) || isRecv(a.type)) {
    s += isSend(a.type) ? '>' : '<';
    s += std::to_string(a.peer);
  }
  return s;
}

}  // namespace

std::string describe(const std::vector<Action>& actions) {
  std::string out;
  for (const Action& a : actions) {
    if (!out.empty()) out += ' ';
    out += token(a);
  }
  return out;
}

std::string describe(const Action& a) {
  std::string s = toString(a.type);
  switch (a.type) {
    case ActionType::GradSync:
      return s + "(chunk " + std::to_string(a.chunk) + ")";
    case ActionType::OptimizerStep:
      return s;
    default:
      break;
  }
  s += "(mb " + std::to_string(a.microbatch) + ", chunk " + std::to_string(a.chunk);
  if (isSend(a.type)) s += ", to stage " + std::to_string(a.peer);
  if (isRecv(a.type)) s += ", from stage " + std::to_string(a.peer);
  return s + ")";
}

std::vector<double> peakActivationBytes(const PipelineSchedule& schedule,
                                        const std::vector<double>& chunkBytes,
                                        const std::vector<double>& splitBytes) {
  // A chunk without an entry weighs nothing (the caller passes one entry per chunk, or no split bytes).
  auto entry = [](const std::vector<double>& v, int k) {
    return k >= 0 && k < static_cast<int>(v.size()) ? v[static_cast<size_t>(k)] : 0.0;
  };
  auto bytesOf = [&](int k) { return entry(chunkBytes, k); };
  auto splitOf = [&](int k) { return schedule.splitBackward ? entry(splitBytes, k) : 0.0; };
  const ActionType release = schedule.splitBackward ? ActionType::BackwardWeight : ActionType::Backward;
  std::vector<double> peaks;
  peaks.reserve(schedule.actions.size());
  for (const auto& stageActions : schedule.actions) {
    double held = 0.0;
    double peak = 0.0;
    for (const Action& a : stageActions) {
      if (a.type == ActionType::Forward) held += bytesOf(a.chunk);
      if (a.type == ActionType::Backward) held += splitOf(a.chunk);
      if (a.type == release) held -= bytesOf(a.chunk) + splitOf(a.chunk);
      peak = std::max(peak, held);
    }
    peaks.push_back(peak);
  }
  return peaks;
}

std::vector<double> slotActivationBytes(const PipelineSchedule& schedule,
                                        const std::vector<double>& chunkBytes,
                                        const std::vector<double>& splitBytes) {
  auto entry = [](const std::vector<double>& v, int k) {
    return k >= 0 && k < static_cast<int>(v.size()) ? v[static_cast<size_t>(k)] : 0.0;
  };
  const ActionType release = schedule.splitBackward ? ActionType::BackwardWeight : ActionType::Backward;
  std::vector<double> peaks;
  peaks.reserve(schedule.actions.size());
  for (const auto& stageActions : schedule.actions) {
    std::map<int, int> inFlight, most;  // per chunk
    double split = 0.0, slots = 0.0, peak = 0.0;
    for (const Action& a : stageActions) {
      if (a.type == ActionType::Forward && ++inFlight[a.chunk] > most[a.chunk]) {
        most[a.chunk] = inFlight[a.chunk];
        slots += entry(chunkBytes, a.chunk);
      }
      if (schedule.splitBackward && a.type == ActionType::Backward) split += entry(splitBytes, a.chunk);
      if (a.type == release) {
        --inFlight[a.chunk];
        if (schedule.splitBackward) split -= entry(splitBytes, a.chunk);
      }
      peak = std::max(peak, slots + split);
    }
    peaks.push_back(peak);
  }
  return peaks;
}

std::vector<int> peakInFlight(const PipelineSchedule& schedule) {
  std::vector<double> ones(static_cast<size_t>(schedule.chunkCount()), 1.0);
  std::vector<double> peaks = peakActivationBytes(schedule, ones);
  std::vector<int> counts;
  counts.reserve(peaks.size());
  for (double p : peaks) counts.push_back(static_cast<int>(p + 0.5));
  return counts;
}

}  // namespace ms
