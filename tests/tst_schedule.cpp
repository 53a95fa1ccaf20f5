// Tests of the pipeline schedules: every kind over many shapes passes checkSchedule; small cases match orders
// written out by hand from the papers (Narayanan et al. 2021, Megatron-LM's interleaved rule, Qi et al.
// 2024); the activations held at the peak follow the warm-up formulas; a unit-cost simulation of the action
// lists gives the textbook bubble fractions; the checker refuses broken schedules with the reason; the
// generator refuses parameters its kind cannot express.
//
// The unit-cost simulation is deliberately separate from the library's simulator: F costs 1, B costs 2 (or 1
// when the backward is split and W costs 1), transfers are free, and a receive waits until its message was
// sent.
#include <QtTest>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "plan/schedule.h"

using ms::Action;
using ms::ActionType;
using ms::PipelineSchedule;
using ms::Schedule;

Q_DECLARE_METATYPE(ms::Schedule)

namespace {

std::vector<int> defaultPlacement(int P, int V) {
  std::vector<int> stageOf(static_cast<size_t>(P * V));
  for (int k = 0; k < P * V; ++k) stageOf[static_cast<size_t>(k)] = k % P;
  return stageOf;
}

ms::Expected<PipelineSchedule> generate(Schedule kind, int P, int V, int M) {
  return ms::generateSchedule(kind, P, V, M, defaultPlacement(P, V));
}

bool isComputeAction(const Action& a) {
  return a.type == ActionType::Forward || a.type == ActionType::Backward ||
         a.type == ActionType::BackwardWeight;
}

// The compute actions of a list in the compact form, transfers and syncs left out.
std::string computeOrder(const std::vector<Action>& actions) {
  std::vector<Action> compute;
  std::copy_if(actions.begin(), actions.end(), std::back_inserter(compute), isComputeAction);
  return ms::describe(compute);
}

struct UnitCostRun {
  bool finished = false;
  double makespan = 0;
  std::vector<double> busy;  // (P): compute time of each stage
  double bubble(int s) const { return (makespan - busy[static_cast<size_t>(s)]) / makespan; }
};

// Times the lists with unit costs (see the file comment). Stages advance round robin while they can.
UnitCostRun simulateUnitCost(const PipelineSchedule& schedule) {
  const int P = schedule.stages;
  std::map<std::tuple<bool, int, int>, double> sentAt;  // (gradient?, m, chunk) -> time
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  std::vector<double> clock(static_cast<size_t>(P), 0.0);
  UnitCostRun run;
  run.busy.assign(static_cast<size_t>(P), 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s) {
      const auto& list = schedule.actions[static_cast<size_t>(s)];
      double& t = clock[static_cast<size_t>(s)];
      for (size_t& i = next[static_cast<size_t>(s)]; i < list.size(); ++i, progress = true) {
        const Action& a = list[i];
        const bool grad = a.type == ActionType::SendGrad || a.type == ActionType::RecvGrad;
        const auto key = std::make_tuple(grad, a.microbatch, a.chunk);
        double cost = 0;
        switch (a.type) {
          case ActionType::Forward:
            cost = 1;
            break;
          case ActionType::Backward:
            cost = schedule.splitBackward ? 1 : 2;
            break;
          case ActionType::BackwardWeight:
            cost = 1;
            break;
          case ActionType::SendActivation:
          case ActionType::SendGrad:
            sentAt[key] = t;
            break;
          case ActionType::RecvActivation:
          case ActionType::RecvGrad: {
            auto it = sentAt.find(key);
            if (it == sentAt.end()) goto blocked;
            t = std::max(t, it->second);
            break;
          }
          default:
            break;
        }
        t += cost;
        run.busy[static_cast<size_t>(s)] += cost;
      }
    blocked:;
    }
  }
  run.finished = true;
  for (int s = 0; s < P; ++s) {
    run.finished =
        run.finished && next[static_cast<size_t>(s)] == schedule.actions[static_cast<size_t>(s)].size();
    run.makespan = std::max(run.makespan, clock[static_cast<size_t>(s)]);
  }
  return run;
}

// The shapes every schedule test runs over: GPipe, 1F1B and ZB-H1 with P in {1,2,3,4,8} and M in
// {1,2,3,4,7,8,16} (M < P included); interleaved with P in {2,4}, V in {2,3}, M in {P, 2P, 4P}, and P = 1.
void addShapeRows() {
  QTest::addColumn<Schedule>("kind");
  QTest::addColumn<int>("P");
  QTest::addColumn<int>("V");
  QTest::addColumn<int>("M");
  for (Schedule kind : {Schedule::GPipe, Schedule::OneFOneB, Schedule::ZbH1})
    for (int P : {1, 2, 3, 4, 8})
      for (int M : {1, 2, 3, 4, 7, 8, 16})
        QTest::addRow("%s P=%d M=%d", ms::toString(kind), P, M) << kind << P << 1 << M;
  for (int P : {2, 4})
    for (int V : {2, 3})
      for (int M : {P, 2 * P, 4 * P})
        QTest::addRow("interleaved P=%d V=%d M=%d", P, V, M) << Schedule::Interleaved1F1B << P << V << M;
  for (int V : {2, 3})
    for (int M : {1, 3})
      QTest::addRow("interleaved P=1 V=%d M=%d", V, M) << Schedule::Interleaved1F1B << 1 << V << M;
}

// Mutations of valid schedules, each with the error the checker must give.
int indexOf(const std::vector<Action>& list, const Action& a) {
  auto it = std::find(list.begin(), list.end(), a);
  return it == list.end() ? -1 : static_cast<int>(it - list.begin());
}
void moveTo(std::vector<Action>& list, const Action& a, int position) {
  const int from = indexOf(list, a);
  QVERIFY2(from >= 0, ms::describe(a).c_str());
  list.erase(list.begin() + from);
  list.insert(list.begin() + position, a);
}
void swapActions(std::vector<Action>& list, const Action& a, const Action& b) {
  const int i = indexOf(list, a), j = indexOf(list, b);
  QVERIFY(i >= 0 && j >= 0);
  std::swap(list[static_cast<size_t>(i)], list[static_cast<size_t>(j)]);
}
void erase(std::vector<Action>& list, const Action& a) {
  const int at = indexOf(list, a);
  QVERIFY2(at >= 0, ms::describe(a).c_str());
  list.erase(list.begin() + at);
}

constexpr ActionType F = ActionType::Forward, B = ActionType::Backward, W = ActionType::BackwardWeight,
                     sA = ActionType::SendActivation, rA = ActionType::RecvActivation,
                     rG = ActionType::RecvGrad;
const Action kGradSync0{ActionType::GradSync, -1, 0, -1};
const Action kOptimizerStep{ActionType::OptimizerStep, -1, -1, -1};

struct Mutation {
  const char* name;
  Schedule kind;
  int P, V, M;
  std::function<void(PipelineSchedule&)> mutate;
  const char* expected;
};

std::vector<Action>& stage(PipelineSchedule& s, int i) {
  return s.actions[static_cast<size_t>(i)];
}

std::vector<Mutation> mutations() {
  return {
      {"drop a forward", Schedule::OneFOneB, 4, 1, 8,
       [](PipelineSchedule& s) {
         erase(stage(s, 0), {F, 3, 0, -1});
       },
       "stage 0: Forward(mb 3, chunk 0) is missing"},
      {"duplicate a forward", Schedule::OneFOneB, 4, 1, 8,
       [](PipelineSchedule& s) {
         stage(s, 0).insert(stage(s, 0).begin() + 2, Action{F, 1, 0, -1});
       },
       "stage 0: Forward(mb 1, chunk 0) appears twice"},
      {"drop a receive", Schedule::GPipe, 2, 1, 2,
       [](PipelineSchedule& s) {
         erase(stage(s, 1), {rA, 0, 0, 0});
       },
       "stage 1: RecvActivation(mb 0, chunk 0, from stage 0) is missing"},
      {"drop a GradSync", Schedule::GPipe, 2, 1, 2,
       [](PipelineSchedule& s) {
         erase(stage(s, 1), {ActionType::GradSync, -1, 1, -1});
       },
       "stage 1: GradSync(chunk 1) is missing"},
      {"drop the optimizer step", Schedule::GPipe, 2, 1, 2,
       [](PipelineSchedule& s) { erase(stage(s, 1), kOptimizerStep); }, "stage 1 has no OptimizerStep"},
      {"optimizer step not last", Schedule::GPipe, 2, 1, 2,
       [](PipelineSchedule& s) { moveTo(stage(s, 0), kOptimizerStep, 0); },
       "stage 0: OptimizerStep must be the last action"},
      {"swap the order of two sends", Schedule::GPipe, 2, 1, 2,
       [](PipelineSchedule& s) {
         moveTo(stage(s, 0), {sA, 0, 0, 1}, indexOf(stage(s, 0), {sA, 1, 0, 1}));
       },
       "stages 0 -> 1: message 1 is sent as SendActivation(mb 1, chunk 0, to stage 1) on stage 0 "
       "but received as RecvActivation(mb 0, chunk 0, from stage 0) on stage 1; "
       "both sides must list their messages in the same order"},
      {"receive after its consumer", Schedule::GPipe, 2, 1, 2,
       [](PipelineSchedule& s) {
         moveTo(stage(s, 1), {rA, 0, 0, 0}, indexOf(stage(s, 1), {F, 0, 1, -1}));
       },
       "stage 1: RecvActivation(mb 0, chunk 0, from stage 0) "
       "comes after Forward(mb 0, chunk 1), which consumes it"},
      {"send before its producer", Schedule::GPipe, 2, 1, 2,
       [](PipelineSchedule& s) {
         moveTo(stage(s, 0), {sA, 0, 0, 1}, 0);
       },
       "stage 0: SendActivation(mb 0, chunk 0, to stage 1) "
       "comes before Forward(mb 0, chunk 0), which produces it"},
      // Stage 0 waits for the gradient of microbatch 0 before sending microbatch 1's activation, while stage
      // 1 (GPipe order) runs both forwards before its first backward: each waits for the other.
      {"backward before the next forward on stage 0 only", Schedule::GPipe, 2, 1, 2,
       [](PipelineSchedule& s) {
         auto& l = stage(s, 0);
         moveTo(l, {F, 1, 0, -1}, indexOf(l, {B, 0, 0, -1}));
         moveTo(l, {sA, 1, 0, 1}, indexOf(l, {F, 1, 0, -1}));  // right after F1.0 again
       },
       "deadlock: stage 0 waits at RecvGrad(mb 0, chunk 1, from stage 1); "
       "stage 1 waits at RecvActivation(mb 1, chunk 0, from stage 0)"},
      {"backward before its forward", Schedule::OneFOneB, 4, 1, 8,
       [](PipelineSchedule& s) {
         swapActions(stage(s, 3), {F, 0, 3, -1}, {B, 0, 3, -1});
       },
       "stage 3: Backward(mb 0, chunk 3) comes before Forward(mb 0, chunk 3)"},
      {"weight pass before its backward", Schedule::ZbH1, 4, 1, 8,
       [](PipelineSchedule& s) {
         swapActions(stage(s, 3), {B, 0, 3, -1}, {W, 0, 3, -1});
       },
       "stage 3: BackwardWeight(mb 0, chunk 3) comes before Backward(mb 0, chunk 3)"},
      {"weight pass without split backward", Schedule::OneFOneB, 2, 1, 2,
       [](PipelineSchedule& s) {
         stage(s, 1).insert(stage(s, 1).end() - 1, Action{W, 0, 1, -1});
       },
       "stage 1: BackwardWeight(mb 0, chunk 1) is a weight-gradient pass, but the schedule does not split"},
      {"forward on the wrong stage", Schedule::OneFOneB, 2, 1, 2,
       [](PipelineSchedule& s) {
         stage(s, 0)[static_cast<size_t>(indexOf(stage(s, 0), {F, 0, 0, -1}))].chunk = 1;
       },
       "stage 0: Forward(mb 0, chunk 1) runs chunk 1, which is on stage 1"},
      {"send to the wrong peer", Schedule::OneFOneB, 4, 1, 4,
       [](PipelineSchedule& s) {
         stage(s, 0)[static_cast<size_t>(indexOf(stage(s, 0), {sA, 0, 0, 1}))].peer = 2;
       },
       "stage 0: SendActivation(mb 0, chunk 0, to stage 2) names the wrong peer: "
       "chunk 1, which consumes the data, runs on stage 1"},
      {"receive on the wrong stage", Schedule::OneFOneB, 4, 1, 4,
       [](PipelineSchedule& s) {
         stage(s, 2).insert(stage(s, 2).begin(), Action{rG, 0, 1, 1});
       },
       "stage 2: RecvGrad(mb 0, chunk 1, from stage 1) is on the wrong stage: "
       "chunk 0, which consumes the data, runs on stage 0"},
      {"GradSync before the last backward", Schedule::GPipe, 2, 1, 2,
       [](PipelineSchedule& s) { moveTo(stage(s, 0), kGradSync0, 0); },
       "stage 0: GradSync(chunk 0) comes before Backward(mb 1, chunk 0); "
       "the sync needs every gradient of the chunk"},
      {"consecutive chunks on one stage out of order", Schedule::Interleaved1F1B, 1, 2, 2,
       [](PipelineSchedule& s) {
         moveTo(stage(s, 0), {F, 0, 0, -1}, indexOf(stage(s, 0), {F, 0, 1, -1}));
       },
       "stage 0: Forward(mb 0, chunk 1) comes before Forward(mb 0, chunk 0), whose output it needs"},
      {"transfer between chunks of one stage", Schedule::Interleaved1F1B, 1, 2, 2,
       [](PipelineSchedule& s) {
         stage(s, 0).insert(stage(s, 0).begin() + 1, Action{sA, 0, 0, 0});
       },
       "stage 0: SendActivation(mb 0, chunk 0, to stage 0) is not needed: "
       "chunks 0 and 1 both run on stage 0"},
      {"actions of a stage missing", Schedule::OneFOneB, 2, 1, 2,
       [](PipelineSchedule& s) { s.actions.pop_back(); }, "the schedule lists actions for 1 of its 2 stages"},
  };
}

}  // namespace

class TestSchedule : public QObject {
  Q_OBJECT

 private slots:
  void actionNames() {
    const std::string codes = "FBWsrSRGO";
    for (int t = 0; t <= static_cast<int>(ActionType::OptimizerStep); ++t)
      QCOMPARE(ms::actionCode(static_cast<ActionType>(t)), codes[static_cast<size_t>(t)]);
    QCOMPARE(std::string(ms::toString(ActionType::RecvGrad)), std::string("RecvGrad"));
    const std::vector<Action> actions = {{rA, 0, 0, 0},
                                         {F, 0, 1, -1},
                                         {sA, 0, 1, 2},
                                         {ActionType::SendGrad, 3, 1, 0},
                                         {rG, 3, 2, 2},
                                         {W, 3, 1, -1},
                                         {ActionType::GradSync, -1, 1, -1},
                                         kOptimizerStep};
    QCOMPARE(ms::describe(actions), std::string("r0.0<0 F0.1 s0.1>2 S3.1>0 R3.2<2 W3.1 G1 O"));
    QCOMPARE(ms::describe(Action{rG, 3, 5, 3}), std::string("RecvGrad(mb 3, chunk 5, from stage 3)"));
    QCOMPARE(ms::describe(Action{sA, 0, 0, 1}), std::string("SendActivation(mb 0, chunk 0, to stage 1)"));
    QCOMPARE(ms::describe(kGradSync0), std::string("GradSync(chunk 0)"));
  }

  void generatedSchedulesPassTheChecker_data() { addShapeRows(); }
  void generatedSchedulesPassTheChecker() {
    QFETCH(Schedule, kind);
    QFETCH(int, P);
    QFETCH(int, V);
    QFETCH(int, M);
    auto schedule = generate(kind, P, V, M);
    QVERIFY2(schedule.isOk(), schedule.message().c_str());
    QVERIFY(schedule->kind == kind);
    QCOMPARE(schedule->splitBackward, kind == Schedule::ZbH1);
    QCOMPARE(static_cast<int>(schedule->actions.size()), P);
    const ms::Status status = ms::checkSchedule(*schedule);
    QVERIFY2(status.isOk(), status.message().c_str());
    // Every stage computes V chunks of M microbatches, 2 or 3 passes each; P == 1 has no transfers.
    for (const auto& list : schedule->actions) {
      const auto compute = std::count_if(list.begin(), list.end(), isComputeAction);
      QCOMPARE(static_cast<int>(compute), V * M * (schedule->splitBackward ? 3 : 2));
      if (P == 1) QCOMPARE(static_cast<int>(list.size()), static_cast<int>(compute) + V + 1);
    }
  }

  // Activations held at the peak, stage s: GPipe M; 1F1B min(P - s, M) (warm-up + 1); ZB-H1 min(P, M) on
  // every stage (W releases, the deferred W keep later stages at 1F1B's stage-0 peak, Qi et al. 2024
  // section 3.1); interleaved min((P - s - 1) * 2 + (V - 1) * P + 1, M * V) (Megatron's warm-up + 1), e.g.
  // P=4 V=2 M=8: 11, 9, 7, 5.
  void peakInFlight_data() { addShapeRows(); }
  void peakInFlight() {
    QFETCH(Schedule, kind);
    QFETCH(int, P);
    QFETCH(int, V);
    QFETCH(int, M);
    auto schedule = generate(kind, P, V, M);
    QVERIFY2(schedule.isOk(), schedule.message().c_str());
    const std::vector<int> peaks = ms::peakInFlight(*schedule);
    QCOMPARE(static_cast<int>(peaks.size()), P);
    for (int s = 0; s < P; ++s) {
      int expected = 0;
      switch (kind) {
        case Schedule::GPipe:
          expected = M;
          break;
        case Schedule::OneFOneB:
          expected = std::min(P - s, M);
          break;
        case Schedule::ZbH1:
          expected = std::min(P, M);
          break;
        case Schedule::Interleaved1F1B:
          expected = std::min((P - s - 1) * 2 + (V - 1) * P + 1, M * V);
          break;
      }
      QCOMPARE(peaks[static_cast<size_t>(s)], expected);
    }
  }

  void peakInFlightExamples() {
    auto interleaved = generate(Schedule::Interleaved1F1B, 4, 2, 8);
    QVERIFY(interleaved.isOk());
    QCOMPARE(ms::peakInFlight(*interleaved), (std::vector<int>{11, 9, 7, 5}));
    auto zb = generate(Schedule::ZbH1, 4, 1, 8);
    QVERIFY(zb.isOk());
    QCOMPARE(ms::peakInFlight(*zb), (std::vector<int>{4, 4, 4, 4}));
  }

  // Chunks weigh what chunkBytes says; W, not B, releases a split backward's activations.
  void peakActivationBytesWeighsChunks() {
    auto interleaved = generate(Schedule::Interleaved1F1B, 2, 2, 4);
    QVERIFY(interleaved.isOk());
    // Stage 0 holds F0.0 F1.0 F0.2 F1.2 F2.0 = 1+1+100+100+1 before its first backward; stage 1 holds one
    // chunk-3 activation and two of chunk 1 at most (see the orders in exactOrders).
    QCOMPARE(ms::peakActivationBytes(*interleaved, {1, 10, 100, 1000}), (std::vector<double>{203, 1020}));
    auto zb = generate(Schedule::ZbH1, 2, 1, 2);
    QVERIFY(zb.isOk());
    QCOMPARE(ms::peakActivationBytes(*zb, {5, 7}), (std::vector<double>{10, 14}));
  }

  // The runtime's slots keep their buffers: each chunk holds its most microbatches ever in flight. Stage 0 of
  // the interleaved example above: chunk 0 reaches 4 in flight (F0.0 .. F3.0 before B0.0), chunk 2 reaches 2,
  // at different times: 4 * 1 + 2 * 100 = 204 against the simultaneous 203; stage 1: chunk 1 reaches 3 (F2.1
  // comes after chunk 3's first two backwards) and chunk 3 one: 3 * 10 + 1000. Independently: the sum over
  // chunks of each chunk's own peak (peakActivationBytes of a one-chunk weight).
  void slotActivationBytesHoldEachChunksMost() {
    auto interleaved = generate(Schedule::Interleaved1F1B, 2, 2, 4);
    QVERIFY(interleaved.isOk());
    const std::vector<double> bytes{1, 10, 100, 1000};
    QCOMPARE(ms::slotActivationBytes(*interleaved, bytes), (std::vector<double>{204, 1030}));
    std::vector<double> sum(2, 0.0);
    for (size_t k = 0; k < bytes.size(); ++k) {
      std::vector<double> one(bytes.size(), 0.0);
      one[k] = bytes[k];
      const auto peaks = ms::peakActivationBytes(*interleaved, one);
      for (size_t s = 0; s < sum.size(); ++s) sum[s] += peaks[s];
    }
    QCOMPARE(ms::slotActivationBytes(*interleaved, bytes), sum);
    // One chunk per stage: the simultaneous peak. A split backward's extra bytes live from B to W.
    auto zb = generate(Schedule::ZbH1, 2, 1, 2);
    QVERIFY(zb.isOk());
    QCOMPARE(ms::slotActivationBytes(*zb, {5, 7}), (std::vector<double>{10, 14}));
    // Stage 0 runs F0 F1 B0 W0 B1 W1: 10 + 100 at B0. Stage 1 runs F0 B0 F1 B1 W0 W1: both B's extras and
    // two slots, 14 + 2000.
    QCOMPARE(ms::slotActivationBytes(*zb, {5, 7}, {100, 1000}), (std::vector<double>{110, 2014}));
  }

  // Bubble = idle / step time of each stage, step = the last stage's end. GPipe and 1F1B: (P-1)/(M+P-1)
  // (Huang et al. 2019; Narayanan et al. 2021 section 2.2.1). Interleaved: (P-1)/(V*M+P-1), the bubble time
  // divided by V (Narayanan et al. 2021 section 2.2.2). ZB-H1 with M >= P: every stage idles P - 1 units in a
  // step of 3M + P - 1, a third of 1F1B's 3(P - 1) (Qi et al. 2024 section 3.1); with M < P it stays below
  // 1F1B.
  void unitCostBubble_data() { addShapeRows(); }
  void unitCostBubble() {
    QFETCH(Schedule, kind);
    QFETCH(int, P);
    QFETCH(int, V);
    QFETCH(int, M);
    auto schedule = generate(kind, P, V, M);
    QVERIFY2(schedule.isOk(), schedule.message().c_str());
    const UnitCostRun run = simulateUnitCost(*schedule);
    QVERIFY(run.finished);
    const double onePipe = double(P - 1) / double(M + P - 1);
    for (int s = 0; s < P; ++s) {
      const double bubble = run.bubble(s);
      switch (kind) {
        case Schedule::GPipe:
        case Schedule::OneFOneB:
          QVERIFY2(std::abs(bubble - onePipe) < 1e-12, qPrintable(QString::number(bubble)));
          break;
        case Schedule::Interleaved1F1B: {
          const double expected = double(P - 1) / double(V * M + P - 1);
          QVERIFY2(std::abs(bubble - expected) < 1e-12, qPrintable(QString::number(bubble)));
          break;
        }
        case Schedule::ZbH1:
          QCOMPARE(run.busy[static_cast<size_t>(s)], 3.0 * M);
          if (M >= P) {
            QCOMPARE(run.makespan - run.busy[static_cast<size_t>(s)], double(P - 1));  // 1F1B idles 3(P-1)
            QVERIFY(std::abs(bubble - double(P - 1) / double(3 * M + P - 1)) < 1e-12);
          } else {
            QVERIFY(P == 1 || bubble < onePipe);
          }
          break;
      }
    }
  }

  void exactOrders_data() {
    QTest::addColumn<Schedule>("kind");
    QTest::addColumn<int>("P");
    QTest::addColumn<int>("V");
    QTest::addColumn<int>("M");
    QTest::addColumn<int>("stage");
    QTest::addColumn<bool>("computeOnly");
    QTest::addColumn<QString>("expected");
    // 1F1B: stage 0 warms up with P - 1 = 3 forwards; the last stage alternates from the start.
    QTest::newRow("1f1b P=4 M=8 stage 0")
        << Schedule::OneFOneB << 4 << 1 << 8 << 0 << true
        << "F0.0 F1.0 F2.0 F3.0 B0.0 F4.0 B1.0 F5.0 B2.0 F6.0 B3.0 F7.0 B4.0 B5.0 B6.0 B7.0";
    QTest::newRow("1f1b P=4 M=8 stage 3")
        << Schedule::OneFOneB << 4 << 1 << 8 << 3 << true
        << "F0.3 B0.3 F1.3 B1.3 F2.3 B2.3 F3.3 B3.3 F4.3 B4.3 F5.3 B5.3 F6.3 B6.3 F7.3 B7.3";
    // Megatron's rule by hand, P=2 V=2 M=4, 8 virtual steps. Forward step i: local chunk (i/2)%2, microbatch
    // i%2 + 2*(i/4): (0,c0) (1,c0) (0,c1) (1,c1) (2,c0) (3,c0) (2,c1) (3,c1); backward steps use chunk
    // 1 - (i/2)%2. Global chunk = local * P + stage. Warm-up: stage 0 (2-0-1)*2 + (2-1)*2 = 4, stage 1 2.
    QTest::newRow("interleaved P=2 V=2 M=4 stage 0")
        << Schedule::Interleaved1F1B << 2 << 2 << 4 << 0 << true
        << "F0.0 F1.0 F0.2 F1.2 F2.0 B0.2 F3.0 B1.2 F2.2 B0.0 F3.2 B1.0 B2.2 B3.2 B2.0 B3.0";
    QTest::newRow("interleaved P=2 V=2 M=4 stage 1")
        << Schedule::Interleaved1F1B << 2 << 2 << 4 << 1 << true
        << "F0.1 F1.1 F0.3 B0.3 F1.3 B1.3 F2.1 B0.1 F3.1 B1.1 F2.3 B2.3 F3.3 B3.3 B2.1 B3.1";
    // One stage, two chunks: no transfers; chunk 1's sync follows its last backward, before chunk 0 finishes.
    QTest::newRow("interleaved P=1 V=2 M=2 full") << Schedule::Interleaved1F1B << 1 << 2 << 2 << 0 << false
                                                  << "F0.0 F0.1 B0.1 F1.0 B0.0 F1.1 B1.1 G1 B1.0 G0 O";
    QTest::newRow("gpipe P=2 M=2 stage 0 full") << Schedule::GPipe << 2 << 1 << 2 << 0 << false
                                                << "F0.0 s0.0>1 F1.0 s1.0>1 R0.1<1 B0.0 R1.1<1 B1.0 G0 O";
    QTest::newRow("gpipe P=2 M=2 stage 1 full") << Schedule::GPipe << 2 << 1 << 2 << 1 << false
                                                << "r0.0<0 F0.1 r1.0<0 F1.1 B0.1 S0.1>0 B1.1 S1.1>0 G1 O";
    QTest::newRow("1f1b P=3 M=2 stage 1 full")
        << Schedule::OneFOneB << 3 << 1 << 2 << 1 << false
        << "r0.0<0 F0.1 s0.1>2 r1.0<0 F1.1 s1.1>2 R0.2<2 B0.1 S0.1>0 R1.2<2 B1.1 S1.1>0 G1 O";
    // ZB-H1 (Qi et al. 2024, figure 3): stage 0 is 1F1B with a W right after each B; the last stage runs
    // P - 1 = 3 rounds of F B, then F B W rounds, and the 3 W it deferred come last.
    QTest::newRow("zb_h1 P=4 M=8 stage 0") << Schedule::ZbH1 << 4 << 1 << 8 << 0 << true
                                           << "F0.0 F1.0 F2.0 F3.0 B0.0 W0.0 F4.0 B1.0 W1.0 F5.0 B2.0 W2.0 "
                                              "F6.0 B3.0 W3.0 F7.0 B4.0 W4.0 B5.0 W5.0 "
                                              "B6.0 W6.0 B7.0 W7.0";
    QTest::newRow("zb_h1 P=4 M=8 stage 3") << Schedule::ZbH1 << 4 << 1 << 8 << 3 << true
                                           << "F0.3 B0.3 F1.3 B1.3 F2.3 B2.3 F3.3 B3.3 W0.3 F4.3 B4.3 W1.3 "
                                              "F5.3 B5.3 W2.3 F6.3 B6.3 W3.3 F7.3 B7.3 "
                                              "W4.3 W5.3 W6.3 W7.3";
    QTest::newRow("zb_h1 P=2 M=2 stage 1 full")
        << Schedule::ZbH1 << 2 << 1 << 2 << 1 << false
        << "r0.0<0 F0.1 B0.1 S0.1>0 r1.0<0 F1.1 B1.1 S1.1>0 W0.1 W1.1 G1 O";
  }
  void exactOrders() {
    QFETCH(Schedule, kind);
    QFETCH(int, P);
    QFETCH(int, V);
    QFETCH(int, M);
    QFETCH(int, stage);
    QFETCH(bool, computeOnly);
    QFETCH(QString, expected);
    auto schedule = generate(kind, P, V, M);
    QVERIFY2(schedule.isOk(), schedule.message().c_str());
    const auto& list = schedule->actions[static_cast<size_t>(stage)];
    QCOMPARE(QString::fromStdString(computeOnly ? computeOrder(list) : ms::describe(list)), expected);
  }

  void checkerCatchesBrokenSchedules_data() {
    QTest::addColumn<int>("index");
    const auto cases = mutations();
    for (int i = 0; i < static_cast<int>(cases.size()); ++i)
      QTest::newRow(cases[static_cast<size_t>(i)].name) << i;
  }
  void checkerCatchesBrokenSchedules() {
    QFETCH(int, index);
    const Mutation m = mutations()[static_cast<size_t>(index)];
    auto schedule = generate(m.kind, m.P, m.V, m.M);
    QVERIFY2(schedule.isOk(), schedule.message().c_str());
    QVERIFY(ms::checkSchedule(*schedule).isOk());
    m.mutate(*schedule);
    if (QTest::currentTestFailed()) return;
    const ms::Status status = ms::checkSchedule(*schedule);
    QVERIFY2(!status.isOk(), "the broken schedule passed the checker");
    QVERIFY2(status.message().find(m.expected) != std::string::npos, status.message().c_str());
  }

  void generatorRefusesBadParameters_data() {
    QTest::addColumn<Schedule>("kind");
    QTest::addColumn<int>("P");
    QTest::addColumn<int>("V");
    QTest::addColumn<int>("M");
    QTest::addColumn<QList<int>>("stageOf");  // empty: k % P for every chunk
    QTest::addColumn<QString>("expected");
    const QList<int> place;
    QTest::newRow("interleaved M not a multiple of P")
        << Schedule::Interleaved1F1B << 4 << 2 << 6 << place
        << "schedule interleaved_1f1b: interleaved 1F1B needs microbatches to be a multiple of the stages "
           "(P=4, M=6)";
    QTest::newRow("interleaved V=1") << Schedule::Interleaved1F1B << 2 << 1 << 4 << place
                                     << "interleaved 1F1B needs at least 2 virtual chunks per stage (V=1)";
    QTest::newRow("1f1b V=2")
        << Schedule::OneFOneB << 2 << 2 << 4 << place
        << "schedule 1f1b: 1f1b runs one chunk per stage (V=2); virtual chunks need interleaved_1f1b";
    QTest::newRow("gpipe V=3") << Schedule::GPipe << 2 << 3 << 4 << place
                               << "gpipe runs one chunk per stage (V=3)";
    QTest::newRow("zb_h1 V=2") << Schedule::ZbH1 << 2 << 2 << 4 << place
                               << "zb_h1 runs one chunk per stage (V=2)";
    QTest::newRow("no stages") << Schedule::OneFOneB << 0 << 1 << 4 << place
                               << "pipeline stages must be at least 1 (P=0)";
    QTest::newRow("no chunks") << Schedule::Interleaved1F1B << 2 << 0 << 4 << place
                               << "virtual chunks per stage must be at least 1 (V=0)";
    QTest::newRow("no microbatches") << Schedule::GPipe << 2 << 1 << 0 << place
                                     << "microbatches must be at least 1 (M=0)";
    QTest::newRow("too many") << Schedule::GPipe << 1000 << 1 << 2000 << place
                              << "has more than 1000000 (microbatch, chunk) pairs";
    QTest::newRow("stageOf too short") << Schedule::OneFOneB << 3 << 1 << 4 << QList<int>{0, 1}
                                       << "stageOf has 2 entries, expected P*V = 3 chunks (P=3, V=1, M=4)";
    QTest::newRow("stageOf out of range")
        << Schedule::OneFOneB << 3 << 1 << 4 << QList<int>{0, 1, 3} << "stageOf[2] = 3 is not a stage (P=3)";
    QTest::newRow("stageOf out of order")
        << Schedule::ZbH1 << 3 << 1 << 4 << QList<int>{0, 2, 1}
        << "stageOf[1] = 2, but zb_h1 places chunk k on stage k (expected 1)";
    QTest::newRow("interleaved blocks")
        << Schedule::Interleaved1F1B << 2 << 2 << 2 << QList<int>{0, 0, 1, 1}
        << "stageOf[1] = 0, but interleaved_1f1b places chunk k on stage k % P "
           "(expected 1)";
  }
  void generatorRefusesBadParameters() {
    QFETCH(Schedule, kind);
    QFETCH(int, P);
    QFETCH(int, V);
    QFETCH(int, M);
    QFETCH(QList<int>, stageOf);
    QFETCH(QString, expected);
    const std::vector<int> placement = stageOf.isEmpty() ? defaultPlacement(std::max(P, 0), std::max(V, 0))
                                                         : std::vector<int>(stageOf.begin(), stageOf.end());
    auto schedule = ms::generateSchedule(kind, P, V, M, placement);
    QVERIFY(!schedule.isOk());
    QVERIFY2(schedule.message().find(expected.toStdString()) != std::string::npos,
             schedule.message().c_str());
  }
};

QTEST_APPLESS_MAIN(TestSchedule)
#include "tst_schedule.moc"
