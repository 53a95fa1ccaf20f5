// The schedule checker: proves, for any PipelineSchedule (generated or edited by hand), the properties listed
// in schedule.h, and otherwise says which stage, which action and what is wrong. It re-derives the transfers
// the chunk placement needs from the dependency rules alone (F(m, k) needs F(m, k-1), B(m, k) needs B(m,
// k+1)), so it does not trust the generator. Checks run from the simplest to the most global: shape, each
// action on its own, completeness, order within a stage, order of the messages between each pair of stages,
// and finally an execution with non-blocking sends and blocking receives that must finish.
#include <algorithm>
#include <string>
#include <vector>

#include "plan/schedule.h"

namespace ms {
namespace {

bool isCompute(ActionType t) {
  return t == ActionType::Forward || t == ActionType::Backward || t == ActionType::BackwardWeight;
}
bool isGradMessage(ActionType t) {
  return t == ActionType::SendGrad || t == ActionType::RecvGrad;
}

std::string str(int v) {
  return std::to_string(v);
}

class ScheduleChecker {
 public:
  explicit ScheduleChecker(const PipelineSchedule& s)
      : m_s(s), m_P(s.stages), m_M(s.microbatches), m_K(s.chunkCount()) {}

  Status run() {
    MS_TRY(checkShape());
    m_f.assign(cells(), -1);
    m_b.assign(cells(), -1);
    m_w.assign(cells(), -1);
    for (auto* v : {&m_send[0], &m_send[1], &m_recv[0], &m_recv[1]}) v->assign(cells(), -1);
    m_gradSync.assign(static_cast<size_t>(m_K), -1);
    m_optimizer.assign(static_cast<size_t>(m_P), -1);
    for (int s = 0; s < m_P; ++s)
      for (int i = 0; i < static_cast<int>(list(s).size()); ++i) MS_TRY(indexAction(s, i));
    MS_TRY(checkComplete());
    MS_TRY(checkLocalOrder());
    MS_TRY(checkPairOrder());
    return checkDeadlock();
  }

 private:
  size_t cells() const { return static_cast<size_t>(m_M) * static_cast<size_t>(m_K); }
  size_t cell(int m, int k) const {
    return static_cast<size_t>(m) * static_cast<size_t>(m_K) + static_cast<size_t>(k);
  }
  const std::vector<Action>& list(int s) const { return m_s.actions[static_cast<size_t>(s)]; }
  int stageOf(int k) const { return m_s.stageOf[static_cast<size_t>(k)]; }
  static std::string at(int s) { return "stage " + str(s) + ": "; }
  // The chunk that consumes a transfer's data: the next chunk for an activation, the previous for a gradient.
  static int consumerOf(const Action& a) { return isGradMessage(a.type) ? a.chunk - 1 : a.chunk + 1; }
  // The position table of a compute or transfer action.
  std::vector<int>& table(ActionType t) {
    switch (t) {
      case ActionType::Forward:
        return m_f;
      case ActionType::Backward:
        return m_b;
      case ActionType::BackwardWeight:
        return m_w;
      case ActionType::SendActivation:
        return m_send[0];
      case ActionType::SendGrad:
        return m_send[1];
      case ActionType::RecvActivation:
        return m_recv[0];
      default:
        return m_recv[1];
    }
  }

  Status checkShape() const {
    const PipelineSchedule& s = m_s;
    if (s.stages < 1)
      return Status::error("the schedule has " + str(s.stages) + " stages (P must be at least 1)");
    if (s.chunksPerStage < 1)
      return Status::error("the schedule has V=" + str(s.chunksPerStage) + " (at least 1)");
    if (s.microbatches < 1)
      return Status::error("the schedule has M=" + str(s.microbatches) + " (at least 1)");
    if (static_cast<long long>(s.microbatches) * s.stages * s.chunksPerStage > 100'000'000LL)
      return Status::error("the schedule has more than 100000000 (microbatch, chunk) pairs");
    if (m_K != s.stages * s.chunksPerStage)
      return Status::error("stageOf has " + str(m_K) +
                           " chunks, expected P*V = " + str(s.stages * s.chunksPerStage));
    for (int k = 0; k < m_K; ++k)
      if (stageOf(k) < 0 || stageOf(k) >= m_P)
        return Status::error("stageOf[" + str(k) + "] = " + str(stageOf(k)) +
                             " is not a stage (P=" + str(m_P) + ")");
    if (static_cast<int>(s.actions.size()) != m_P)
      return Status::error("the schedule lists actions for " + str(static_cast<int>(s.actions.size())) +
                           " of its " + str(m_P) + " stages");
    return Status::ok();
  }

  // Fields in range, the action on the stage that must run it, no duplicate; records its position.
  Status indexAction(int s, int i) {
    const Action& a = list(s)[static_cast<size_t>(i)];
    if (a.type < ActionType::Forward || a.type > ActionType::OptimizerStep)
      return Status::error(at(s) + "action " + str(i) + " has an unknown type " +
                           str(static_cast<int>(a.type)));
    // The action's name for a message, built only when there is one (this runs for every action of every
    // candidate plan the auto-planner builds).
    const auto here = [&] { return at(s) + describe(a); };
    if (a.type == ActionType::OptimizerStep) {
      if (m_optimizer[static_cast<size_t>(s)] >= 0) return Status::error(here() + " appears twice");
      m_optimizer[static_cast<size_t>(s)] = i;
      if (i != static_cast<int>(list(s).size()) - 1)
        return Status::error(here() + " must be the last action (it is at position " + str(i) + " of " +
                             str(static_cast<int>(list(s).size())) + ")");
      return Status::ok();
    }
    if (a.chunk < 0 || a.chunk >= m_K)
      return Status::error(here() + " names chunk " + str(a.chunk) + ", outside 0.." + str(m_K - 1));
    if (a.type == ActionType::GradSync) {
      if (stageOf(a.chunk) != s)
        return Status::error(here() + " syncs a chunk of stage " + str(stageOf(a.chunk)));
      int& pos = m_gradSync[static_cast<size_t>(a.chunk)];
      if (pos >= 0) return Status::error(here() + " appears twice");
      pos = i;
      return Status::ok();
    }
    if (a.microbatch < 0 || a.microbatch >= m_M)
      return Status::error(here() + " names microbatch " + str(a.microbatch) + ", outside 0.." +
                           str(m_M - 1));
    if (isCompute(a.type)) {
      if (a.type == ActionType::BackwardWeight && !m_s.splitBackward)
        return Status::error(here() +
                             " is a weight-gradient pass, but the schedule does not split the backward");
      if (stageOf(a.chunk) != s)
        return Status::error(here() + " runs chunk " + str(a.chunk) + ", which is on stage " +
                             str(stageOf(a.chunk)));
    } else {
      MS_TRY(checkTransferPlace(s, a));
    }
    int& pos = table(a.type)[cell(a.microbatch, a.chunk)];
    if (pos >= 0)
      return Status::error(here() + " appears twice (positions " + str(pos) + " and " + str(i) + ")");
    pos = i;
    return Status::ok();
  }

  Status checkTransferPlace(int s, const Action& a) const {
    const auto here = [&] { return at(s) + describe(a); };
    const int consumer = consumerOf(a);
    if (consumer < 0 || consumer >= m_K)
      return Status::error(here() + " has no consumer: chunk " + str(a.chunk) + " is the " +
                           (consumer < 0 ? "first" : "last") + " chunk");
    const int from = stageOf(a.chunk), to = stageOf(consumer);
    if (from == to)
      return Status::error(here() + " is not needed: chunks " + str(a.chunk) + " and " + str(consumer) +
                           " both run on stage " + str(from));
    const bool send = isSend(a.type);
    const int mine = send ? from : to, theirs = send ? to : from;
    if (s != mine)
      return Status::error(here() + " is on the wrong stage: chunk " + str(send ? a.chunk : consumer) +
                           ", which " + (send ? "produces" : "consumes") + " the data, runs on stage " +
                           str(mine));
    if (a.peer != theirs)
      return Status::error(here() + " names the wrong peer: chunk " + str(send ? consumer : a.chunk) +
                           ", which " + (send ? "consumes" : "produces") + " the data, runs on stage " +
                           str(theirs));
    return Status::ok();
  }

  Status missing(int s, Action a) const { return Status::error(at(s) + describe(a) + " is missing"); }

  Status checkComplete() const {
    for (int k = 0; k < m_K; ++k) {
      const int s = stageOf(k);
      for (int m = 0; m < m_M; ++m) {
        const size_t c = cell(m, k);
        if (m_f[c] < 0) return missing(s, {ActionType::Forward, m, k, -1});
        if (m_b[c] < 0) return missing(s, {ActionType::Backward, m, k, -1});
        if (m_s.splitBackward && m_w[c] < 0) return missing(s, {ActionType::BackwardWeight, m, k, -1});
        if (k + 1 < m_K && stageOf(k + 1) != s) {
          if (m_send[0][c] < 0) return missing(s, {ActionType::SendActivation, m, k, stageOf(k + 1)});
          if (m_recv[0][c] < 0) return missing(stageOf(k + 1), {ActionType::RecvActivation, m, k, s});
        }
        if (k > 0 && stageOf(k - 1) != s) {
          if (m_send[1][c] < 0) return missing(s, {ActionType::SendGrad, m, k, stageOf(k - 1)});
          if (m_recv[1][c] < 0) return missing(stageOf(k - 1), {ActionType::RecvGrad, m, k, s});
        }
      }
      if (m_gradSync[static_cast<size_t>(k)] < 0) return missing(s, {ActionType::GradSync, -1, k, -1});
    }
    for (int s = 0; s < m_P; ++s)
      if (m_optimizer[static_cast<size_t>(s)] < 0)
        return Status::error("stage " + str(s) + " has no OptimizerStep");
    return Status::ok();
  }

  // `later` at position laterPos must come after `earlier` at earlierPos on stage s.
  static Status ordered(int s, int earlierPos, const Action& earlier, int laterPos, const Action& later,
                        const char* why) {
    if (earlierPos < laterPos) return Status::ok();
    return Status::error(at(s) + describe(later) + " comes before " + describe(earlier) + why);
  }

  Status checkLocalOrder() const {
    using T = ActionType;
    for (int k = 0; k < m_K; ++k) {
      const int s = stageOf(k);
      int lastWorkPos = -1, lastWorkMb = 0;
      for (int m = 0; m < m_M; ++m) {
        const size_t c = cell(m, k);
        const Action F{T::Forward, m, k, -1}, B{T::Backward, m, k, -1}, W{T::BackwardWeight, m, k, -1};
        MS_TRY(ordered(s, m_f[c], F, m_b[c], B, ""));
        if (m_s.splitBackward) MS_TRY(ordered(s, m_b[c], B, m_w[c], W, ""));
        // Consecutive chunks on one stage (interleaved with P == 1) depend on each other without a transfer.
        if (k > 0 && stageOf(k - 1) == s)
          MS_TRY(ordered(s, m_f[cell(m, k - 1)], {T::Forward, m, k - 1, -1}, m_f[c], F,
                         ", whose output it needs"));
        if (k + 1 < m_K && stageOf(k + 1) == s)
          MS_TRY(ordered(s, m_b[cell(m, k + 1)], {T::Backward, m, k + 1, -1}, m_b[c], B,
                         ", whose input gradient it needs"));
        if (k + 1 < m_K && stageOf(k + 1) != s) {
          const int to = stageOf(k + 1);
          MS_TRY(ordered(s, m_f[c], F, m_send[0][c], {T::SendActivation, m, k, to}, ", which produces it"));
          const Action recv{T::RecvActivation, m, k, s};
          if (m_recv[0][c] > m_f[cell(m, k + 1)])
            return Status::error(at(to) + describe(recv) + " comes after " +
                                 describe({T::Forward, m, k + 1, -1}) + ", which consumes it");
        }
        if (k > 0 && stageOf(k - 1) != s) {
          const int to = stageOf(k - 1);
          MS_TRY(ordered(s, m_b[c], B, m_send[1][c], {T::SendGrad, m, k, to}, ", which produces it"));
          const Action recv{T::RecvGrad, m, k, s};
          if (m_recv[1][c] > m_b[cell(m, k - 1)])
            return Status::error(at(to) + describe(recv) + " comes after " +
                                 describe({T::Backward, m, k - 1, -1}) + ", which consumes it");
        }
        const int work = m_s.splitBackward ? m_w[c] : m_b[c];
        if (work > lastWorkPos) lastWorkPos = work, lastWorkMb = m;
      }
      const Action lastWork{m_s.splitBackward ? T::BackwardWeight : T::Backward, lastWorkMb, k, -1};
      MS_TRY(ordered(s, lastWorkPos, lastWork, m_gradSync[static_cast<size_t>(k)], {T::GradSync, -1, k, -1},
                     "; the sync needs every gradient of the chunk"));
    }
    return Status::ok();
  }

  // Two stages list the messages between them in the same order: executors may match sends and receives by
  // order alone (one channel per pair of stages).
  Status checkPairOrder() const {
    auto key = [](const Action& a) {
      return std::pair<bool, std::pair<int, int>>{isGradMessage(a.type), {a.microbatch, a.chunk}};
    };
    // Each stage's sends and receives by peer, in list order: one pass over the actions, not one per pair of
    // stages (P^2 passes at the auto-planner's 96 stages). Peers were checked by indexAction.
    std::vector<std::vector<std::vector<const Action*>>> sends(static_cast<size_t>(m_P)),
        recvs(static_cast<size_t>(m_P));
    for (int s = 0; s < m_P; ++s) {
      sends[static_cast<size_t>(s)].resize(static_cast<size_t>(m_P));
      recvs[static_cast<size_t>(s)].resize(static_cast<size_t>(m_P));
      for (const Action& x : list(s)) {
        if (isSend(x.type)) sends[static_cast<size_t>(s)][static_cast<size_t>(x.peer)].push_back(&x);
        if (isRecv(x.type)) recvs[static_cast<size_t>(s)][static_cast<size_t>(x.peer)].push_back(&x);
      }
    }
    for (int a = 0; a < m_P; ++a) {
      for (int b = 0; b < m_P; ++b) {
        if (a == b) continue;
        const std::vector<const Action*>& out = sends[static_cast<size_t>(a)][static_cast<size_t>(b)];
        const std::vector<const Action*>& in = recvs[static_cast<size_t>(b)][static_cast<size_t>(a)];
        const size_t n = std::min(out.size(), in.size());
        for (size_t i = 0; i < n; ++i) {
          if (key(*out[i]) == key(*in[i])) continue;
          return Status::error("stages " + str(a) + " -> " + str(b) + ": message " +
                               str(static_cast<int>(i) + 1) + " is sent as " + describe(*out[i]) +
                               " on stage " + str(a) + " but received as " + describe(*in[i]) + " on stage " +
                               str(b) + "; both sides must list their messages in the same order");
        }
        if (out.size() != in.size())
          return Status::error("stages " + str(a) + " -> " + str(b) + ": " +
                               str(static_cast<int>(out.size())) + " sends but " +
                               str(static_cast<int>(in.size())) + " receives");
      }
    }
    return Status::ok();
  }

  // Executes the lists round robin: sends never block, a receive waits until its message was sent, compute
  // runs once reached (its same-stage inputs come earlier, checked above). Every stage must reach its end.
  Status checkDeadlock() const {
    std::vector<char> sent[2] = {std::vector<char>(cells(), 0), std::vector<char>(cells(), 0)};
    std::vector<size_t> next(static_cast<size_t>(m_P), 0);
    bool progress = true;
    while (progress) {
      progress = false;
      for (int s = 0; s < m_P; ++s) {
        const std::vector<Action>& l = list(s);
        size_t& i = next[static_cast<size_t>(s)];
        while (i < l.size()) {
          const Action& a = l[i];
          const int channel = isGradMessage(a.type) ? 1 : 0;
          if (isRecv(a.type) && !sent[channel][cell(a.microbatch, a.chunk)]) break;
          if (isSend(a.type)) sent[channel][cell(a.microbatch, a.chunk)] = 1;
          ++i;
          progress = true;
        }
      }
    }
    std::string waits;
    for (int s = 0; s < m_P; ++s) {
      const size_t i = next[static_cast<size_t>(s)];
      if (i == list(s).size()) continue;
      waits += (waits.empty() ? "" : "; ") + ("stage " + str(s) + " waits at " + describe(list(s)[i]));
    }
    if (waits.empty()) return Status::ok();
    return Status::error("deadlock: " + waits);
  }

  const PipelineSchedule& m_s;
  const int m_P, m_M, m_K;
  // Position of each action in its stage's list, -1 when absent. (M, K) tables indexed by cell(m, k);
  // transfers by channel: 0 activations, 1 gradients.
  std::vector<int> m_f, m_b, m_w;
  std::vector<int> m_send[2], m_recv[2];
  std::vector<int> m_gradSync;   // (K)
  std::vector<int> m_optimizer;  // (P)
};

}  // namespace

Status checkSchedule(const PipelineSchedule& schedule) {
  return ScheduleChecker(schedule).run();
}

}  // namespace ms
