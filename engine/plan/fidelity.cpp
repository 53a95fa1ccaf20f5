// Fidelity of a run's prediction; see fidelity.h.
#include "plan/fidelity.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/metrics_schema.h"
#include "plan/cost_model.h"
#include "plan/memory_model.h"
#include "plan/plan.h"
#include "plan/simulator.h"

namespace ms {

namespace {

namespace key = metrics::key;

double fidelityMedian(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A number from a JSON value, or an error naming the field.
Expected<double> fidelityNumber(const nlohmann::json& j, const char* field, const std::string& where) {
  if (!j.contains(field) || !j[field].is_number())
    return Status::error(where + ": \"" + field + "\" is missing or not a number");
  const double v = j[field].get<double>();
  if (!std::isfinite(v)) return Status::error(where + ": \"" + field + "\" is not finite");
  return v;
}

// The measured memory categories, folded into the memory model's: the engine's communication and workspace
// buffers are what the model counts as "other".
std::map<std::string, double> fidelityFoldMemory(const nlohmann::json& peak) {
  std::map<std::string, double> out;
  for (const char* c : {metrics::category::kParameters, metrics::category::kGradients,
                        metrics::category::kOptimizer, metrics::category::kActivations})
    out[c] = peak.value(c, 0.0);
  out[metrics::category::kOther] =
      peak.value(metrics::category::kCommunication, 0.0) + peak.value(metrics::category::kWorkspace, 0.0);
  out[key::kTotal] = peak.value(key::kTotal, 0.0);
  return out;
}

}  // namespace

Expected<MeasuredRun> readMeasuredRun(const std::string& metricsPath) {
  std::ifstream in(metricsPath);
  if (!in) return Status::error(metricsPath + ": cannot read: " + std::strerror(errno));
  MeasuredRun run;
  std::map<int64_t, LoggedStep> steps;
  std::map<int64_t, double> stepTimes;
  std::string line;
  int lineNo = 0;
  bool started = false;
  while (std::getline(in, line)) {
    ++lineNo;
    if (line.empty()) continue;
    const std::string where = metricsPath + ":" + std::to_string(lineNo);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    // A line cut short at the end (a run killed mid-write) is not an error; one in the middle is.
    if (j.is_discarded() || !j.is_object()) {
      if (in.peek() == EOF) break;
      return Status::error(where + ": not a JSON object");
    }
    if (j.value(key::kVersion, 0) != metrics::kVersion)
      return Status::error(where + ": metrics version " + j.value(key::kVersion, nlohmann::json()).dump() +
                           ", this engine reads " + std::to_string(metrics::kVersion));
    const std::string type = j.value(key::kType, "");
    try {
      if (type == metrics::type::kRunStart) {
        if (j.contains(key::kPsServers))
          return Status::error(where +
                               ": a parameter-server run; fidelity compares pipeline plans only (the "
                               "parameter-server prediction is drawn beside the run in the studio)");
        run.name = j.value(key::kName, "");
        run.ranks = j.value(key::kRanks, 0);
        if (run.ranks < 1) return Status::error(where + ": run_start has no \"ranks\" >= 1");
        started = true;
      } else if (type == metrics::type::kStep && started) {
        auto t = fidelityNumber(j, key::kStepTimeS, where);
        if (!t) return t.status();
        stepTimes[j.at(key::kStep).get<int64_t>()] = *t;
      } else if (type == metrics::type::kSpans && started) {
        LoggedStep& s = steps[j.at(key::kStep).get<int64_t>()];
        s.step = j.at(key::kStep).get<int64_t>();
        s.spans.assign(size_t(run.ranks), {});
        for (const auto& r : j.at(key::kRanks)) {
          const int rank = r.at(key::kRank).get<int>();
          if (rank < 0 || rank >= run.ranks)
            return Status::error(where + ": rank " + std::to_string(rank) + " outside the run's " +
                                 std::to_string(run.ranks));
          for (const auto& sp : r.at(key::kSpans)) {
            LoggedSpan m;
            const std::string a = sp.at(key::kAction).get<std::string>();
            if (a.size() != 1) return Status::error(where + ": span action \"" + a + "\" is not one letter");
            m.action = a[0];
            m.layer = sp.value(key::kLayer, "");
            m.microbatch = sp.value(key::kMicrobatch, -1);
            m.chunk = sp.value(key::kChunk, -1);
            m.start = sp.at(key::kStart).get<double>();
            m.end = sp.at(key::kEnd).get<double>();
            if (!std::isfinite(m.start) || !std::isfinite(m.end) || m.end < m.start)
              return Status::error(where + ": rank " + std::to_string(rank) +
                                   " has a span that ends before it starts");
            s.spans[size_t(rank)].push_back(std::move(m));
          }
        }
      } else if (type == metrics::type::kMemory && started) {
        LoggedStep& s = steps[j.at(key::kStep).get<int64_t>()];
        s.step = j.at(key::kStep).get<int64_t>();
        s.peakMemory.assign(size_t(run.ranks), {});
        for (const auto& r : j.at(key::kRanks)) {
          const int rank = r.at(key::kRank).get<int>();
          if (rank < 0 || rank >= run.ranks)
            return Status::error(where + ": rank " + std::to_string(rank) + " outside the run's " +
                                 std::to_string(run.ranks));
          s.peakMemory[size_t(rank)] = fidelityFoldMemory(r.at(key::kPeak));
        }
      } else if (type == metrics::type::kRunEnd) {
        run.endStatus = j.value(key::kStatus, "");
      }
    } catch (const nlohmann::json::exception& e) {
      return Status::error(where + ": a " + type + " line is missing a field or has one of the wrong type (" +
                           e.what() + ")");
    }
  }
  if (!started) return Status::error(metricsPath + ": no run_start line (not a run's metrics stream)");
  for (auto& [step, s] : steps) {
    if (s.spans.empty()) continue;  // a memory line without spans: not a step fidelity can use
    if (const auto t = stepTimes.find(step); t != stepTimes.end()) s.stepTime = t->second;
    run.steps.push_back(std::move(s));
  }
  return run;
}

const char* toString(FidelityItem item) {
  switch (item) {
    case FidelityItem::Forward:
      return "F";
    case FidelityItem::Backward:
      return "B";
    case FidelityItem::Weight:
      return "W";
    case FidelityItem::RecvActivation:
      return "r";
    case FidelityItem::RecvGrad:
      return "R";
    case FidelityItem::GradFinish:
      return "G";
    case FidelityItem::Optimizer:
      return "O";
    case FidelityItem::Bubble:
      return "bubble";
    case FidelityItem::Memory:
      return "memory";
  }
  return "?";
}

double FidelityRow::error() const {
  if (measured > 0) return predicted / measured - 1;
  return predicted > 0 ? 1.0 : 0.0;
}

double FidelityRow::gap() const {
  return std::fabs(predicted - measured);
}

Expected<FidelityReport> fidelityReport(const RunConfig& config, const MeasuredRun& run) {
  if (config.parallel.mode == ParallelMode::ParameterServer)
    return Status::error("the config is a parameter-server plan; fidelity compares pipeline plans only");
  auto built = buildPlan(config, /*allowSharing=*/true);
  if (!built) return Status::error("the run's config does not plan: " + built.message());
  const Plan& plan = *built;
  const int W = plan.layout.world();
  if (run.ranks != W)
    return Status::error("the run has " + std::to_string(run.ranks) + " ranks, the config's plan " +
                         std::to_string(W) + " (dp x cp x tp x pp): not the same plan");
  if (run.steps.empty()) return Status::error("the run logged no step's spans (it stopped before step 1)");
  const CostModel cost(plan);
  const SimResult sim = simulate(plan, cost, /*spansPerRank=*/true);
  if (!sim.error.empty()) return Status::error("the plan's schedule does not run: " + sim.error);
  const std::vector<MemoryBreakdown> memory = estimateMemory(plan);

  FidelityReport report;
  report.run = run.name.empty() ? config.name : run.name;
  const DeviceSpec& dev = stageDevice(plan, 0);
  report.device = dev.name;
  report.profiled = dev.profile != nullptr;
  report.ranks = W;
  report.predictedStep = sim.stepTime;

  // The kept steps: all but the first when later ones were logged.
  std::vector<const LoggedStep*> kept;
  for (const LoggedStep& s : run.steps)
    if (!(run.steps.size() > 1 && &s == &run.steps.front() && s.step <= 1)) kept.push_back(&s);
  report.stepsUsed = static_cast<int>(kept.size());
  {
    std::vector<double> times;
    for (const LoggedStep* s : kept)
      if (s->stepTime >= 0) times.push_back(s->stepTime);
    report.measuredStep = fidelityMedian(times);
    if (times.empty()) report.notes.push_back("the stream has no step_time_s for the kept steps");
  }

  // Layers: names, chunks, and the per-microbatch time of each layer in each action, its share of the
  // chunk's in-layer communication included.
  const int L = static_cast<int>(plan.model.layers.size());
  std::map<std::string, int> layerIndex;
  for (int l = 0; l < L; ++l) layerIndex[plan.model.layers[size_t(l)].name] = l;
  const Partition& part = plan.partition;
  const int K = static_cast<int>(part.chunks.size());
  const LayerTimes& lt = cost.layerTimes();
  const bool split = plan.schedule.splitBackward;
  std::vector<int> chunkOf(size_t(L), -1);
  // perMicrobatch[action][l], action 0 F, 1 B, 2 W.
  std::vector<std::vector<double>> perMicrobatch(3, std::vector<double>(size_t(L), 0.0));
  for (int k = 0; k < K; ++k) {
    const std::vector<int>& layers = part.chunks[size_t(k)];
    const int stage = part.stageOf[size_t(k)];
    for (int l : layers) chunkOf[size_t(l)] = k;
    for (int a = 0; a < 3; ++a) {
      if (a == 2 && !split) continue;
      std::vector<double> own(layers.size());
      double sum = 0;
      for (size_t i = 0; i < layers.size(); ++i) {
        const size_t l = size_t(layers[i]);
        own[i] = a == 0   ? lt.forward[l]
                 : a == 1 ? lt.backwardInput[l] + (split ? 0.0 : lt.backwardWeight[l])
                          : lt.backwardWeight[l];
        sum += own[i];
      }
      const ActionType type = a == 0   ? ActionType::Forward
                              : a == 1 ? ActionType::Backward
                                       : ActionType::BackwardWeight;
      const double whole = cost.actionTime(Action{type, 0, k, -1}, stage);
      const double extra = std::max(0.0, whole - sum);
      for (size_t i = 0; i < layers.size(); ++i) {
        const double share = sum > 0 ? own[i] / sum : 1.0 / double(layers.size());
        perMicrobatch[size_t(a)][size_t(layers[i])] = own[i] + extra * share;
      }
    }
  }
  // Actions of each chunk per step on its stage (M, or what a hand-edited schedule says).
  std::vector<std::array<int, 3>> actionsPerStep(size_t(K), {0, 0, 0});
  for (const auto& list : plan.schedule.actions)
    for (const Action& a : list) {
      if (a.chunk < 0 || a.chunk >= K) continue;
      if (a.type == ActionType::Forward) ++actionsPerStep[size_t(a.chunk)][0];
      if (a.type == ActionType::Backward) ++actionsPerStep[size_t(a.chunk)][1];
      if (a.type == ActionType::BackwardWeight) ++actionsPerStep[size_t(a.chunk)][2];
    }

  // Measured layers that the plan does not have: a different model.
  std::set<std::string> unknown;
  for (const LoggedStep* s : kept)
    for (const auto& spans : s->spans)
      for (const LoggedSpan& m : spans)
        if (!m.layer.empty() && !layerIndex.count(m.layer)) unknown.insert(m.layer);
  if (!unknown.empty())
    return Status::error("the run has layer \"" + *unknown.begin() +
                         "\", which the config's model does not: not the same model");

  const RankLayout& layout = plan.layout;
  std::vector<FidelityRow> bubbles;
  for (int r = 0; r < W; ++r) {
    const int stage = plan.stageOfRank(r);
    const int dpIndex = layout.coord(r).dp;
    // Measured, per kept step: per layer and action, r, R, G, O, bubble.
    std::vector<std::vector<std::vector<double>>> layerSteps(3, std::vector<std::vector<double>>(size_t(L)));
    std::vector<double> recvA, recvG, finish, opt, bubble;
    for (const LoggedStep* s : kept) {
      std::vector<std::vector<double>> sums(3, std::vector<double>(size_t(L), 0.0));
      double ra = 0, rg = 0, g = 0, o = 0, busy = 0;
      for (const LoggedSpan& m : s->spans[size_t(r)]) {
        const double d = m.end - m.start;
        const int a = m.action == 'F' ? 0 : m.action == 'B' ? 1 : m.action == 'W' ? 2 : -1;
        if (a >= 0) {
          busy += d;
          if (!m.layer.empty()) sums[size_t(a)][size_t(layerIndex[m.layer])] += d;
        }
        if (m.action == 'r') ra += d;
        if (m.action == 'R') rg += d;
        if (m.action == 'G') g += d;
        if (m.action == 'O') o += d;
      }
      for (int a = 0; a < 3; ++a)
        for (int l = 0; l < L; ++l) layerSteps[size_t(a)][size_t(l)].push_back(sums[size_t(a)][size_t(l)]);
      recvA.push_back(ra);
      recvG.push_back(rg);
      finish.push_back(g);
      opt.push_back(o);
      // The replica's window (the ranks with this rank's dp index).
      double lo = INFINITY, hi = -INFINITY;
      for (int q = 0; q < W; ++q) {
        if (layout.coord(q).dp != dpIndex) continue;
        for (const LoggedSpan& m : s->spans[size_t(q)]) {
          if (m.action == 'F') lo = std::min(lo, m.start);
          if (m.action == 'B' || m.action == 'W') hi = std::max(hi, m.end);
        }
      }
      if (hi > lo) bubble.push_back(std::max(0.0, 1.0 - busy / (hi - lo)));
    }
    // Predicted from the simulator's spans of this rank.
    double pRa = 0, pRg = 0, pOpt = 0, lastCompute = 0, optStart = -1;
    for (const SimSpan& sp : sim.spansByRank[size_t(r)]) {
      const double d = sp.end - sp.start;
      if (sp.type == ActionType::RecvActivation) pRa += d;
      if (sp.type == ActionType::RecvGrad) pRg += d;
      if (sp.type == ActionType::OptimizerStep) {
        pOpt += d;
        optStart = sp.start;
      } else if (onComputeLane(sp.type)) {
        lastCompute = std::max(lastCompute, sp.end);
      }
    }
    const double pFinish = optStart >= 0 ? std::max(0.0, optStart - lastCompute) : 0.0;

    for (int l = 0; l < L; ++l) {
      const int k = chunkOf[size_t(l)];
      const bool mine = k >= 0 && part.stageOf[size_t(k)] == stage;
      for (int a = 0; a < 3; ++a) {
        if (a == 2 && !split) continue;
        const double measured = fidelityMedian(layerSteps[size_t(a)][size_t(l)]);
        const double predicted =
            mine ? perMicrobatch[size_t(a)][size_t(l)] * actionsPerStep[size_t(k)][size_t(a)] : 0.0;
        if (!mine && measured == 0) continue;
        report.times.push_back({a == 0   ? FidelityItem::Forward
                                : a == 1 ? FidelityItem::Backward
                                         : FidelityItem::Weight,
                                r, stage, plan.model.layers[size_t(l)].name, predicted, measured});
      }
    }
    const auto add = [&](FidelityItem item, double predicted, const std::vector<double>& measured) {
      const double m = fidelityMedian(measured);
      if (predicted == 0 && m == 0) return;
      report.times.push_back({item, r, stage, "", predicted, m});
    };
    add(FidelityItem::RecvActivation, pRa, recvA);
    add(FidelityItem::RecvGrad, pRg, recvG);
    add(FidelityItem::GradFinish, pFinish, finish);
    add(FidelityItem::Optimizer, pOpt, opt);
    if (!bubble.empty() && r < static_cast<int>(sim.bubbleFraction.size()))
      bubbles.push_back(
          {FidelityItem::Bubble, r, stage, "", sim.bubbleFraction[size_t(r)], fidelityMedian(bubble)});

    // Memory: the largest per-step peak of the kept steps, per category.
    std::map<std::string, std::vector<double>> peaks;
    for (const LoggedStep* s : kept)
      if (size_t(r) < s->peakMemory.size())
        for (const auto& [c, b] : s->peakMemory[size_t(r)]) peaks[c].push_back(b);
    if (peaks.empty()) continue;
    const MemoryBreakdown& pm = memory[size_t(r)];
    const std::pair<const char*, double> predicted[] = {
        {metrics::category::kParameters, pm.parameters}, {metrics::category::kGradients, pm.gradients},
        {metrics::category::kOptimizer, pm.optimizer},   {metrics::category::kActivations, pm.activations},
        {metrics::category::kOther, pm.other},           {key::kTotal, pm.total()}};
    for (const auto& [c, p] : predicted) {
      const auto& v = peaks[c];
      const double m = v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
      if (p == 0 && m == 0) continue;
      report.memory.push_back({FidelityItem::Memory, r, stage, c, p, m});
    }
  }
  if (report.memory.empty()) report.notes.push_back("the run logged no memory lines");
  const auto worstFirst = [](const FidelityRow& a, const FidelityRow& b) {
    if (a.gap() != b.gap()) return a.gap() > b.gap();
    return a.rank < b.rank;
  };
  std::stable_sort(report.times.begin(), report.times.end(), worstFirst);
  std::stable_sort(report.memory.begin(), report.memory.end(), worstFirst);
  std::stable_sort(bubbles.begin(), bubbles.end(), worstFirst);
  report.times.insert(report.times.end(), bubbles.begin(), bubbles.end());
  if (!report.profiled)
    report.notes.push_back("rank 0's device \"" + report.device +
                           "\" is a catalog entry, not a profile of the machine that ran: `meshstudio-engine "
                           "calibrate` measures one (docs/calibration.md)");
  if (!run.endStatus.empty() && run.endStatus != metrics::status::kOk)
    report.notes.push_back("the run ended \"" + run.endStatus + "\": the figures cover the steps it logged");
  return report;
}

Expected<FidelityReport> fidelityOfRunFolder(const std::string& dir, const std::string& configOverride) {
  namespace fs = std::filesystem;
  const std::string configPath =
      configOverride.empty() ? (fs::path(dir) / "config.json").string() : configOverride;
  auto config = loadRunConfig(configPath);
  if (!config) return Status::error(config.message());
  auto run = readMeasuredRun((fs::path(dir) / "metrics.jsonl").string());
  if (!run) return run.status();
  auto report = fidelityReport(*config, *run);
  if (!report) return Status::error(dir + ": " + report.message());
  return report;
}

nlohmann::json fidelityJson(const FidelityReport& report) {
  const auto rows = [](const std::vector<FidelityRow>& list) {
    nlohmann::json out = nlohmann::json::array();
    for (const FidelityRow& r : list)
      out.push_back({{"item", toString(r.item)},
                     {"rank", r.rank},
                     {"stage", r.stage},
                     {"what", r.what},
                     {"predicted", r.predicted},
                     {"measured", r.measured},
                     {"error", r.error()}});
    return out;
  };
  const double stepError = report.measuredStep > 0 ? report.predictedStep / report.measuredStep - 1 : 0.0;
  return {
      {"run", report.run},
      {"device", report.device},
      {"profiled", report.profiled},
      {"steps_used", report.stepsUsed},
      {"ranks", report.ranks},
      {"step",
       {{"predicted_s", report.predictedStep}, {"measured_s", report.measuredStep}, {"error", stepError}}},
      {"times", rows(report.times)},
      {"memory", rows(report.memory)},
      {"notes", report.notes}};
}

}  // namespace ms
