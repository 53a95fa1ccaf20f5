// Fidelity (plan/fidelity.h, `meshstudio-engine fidelity`): real runs under mpirun on a device profile that
// `calibrate --quick` measured, read back against their plan's prediction.
// - The report's measured figures are the stream's own (recomputed here from metrics.jsonl: medians of the
//   kept steps, per-layer sums over microbatches), its predictions are `plan --json`'s, every layer shows up
//   on the ranks of its stage only, and the rows come worst first.
// - Peak memory per category within the 2% of the memory model on each rank (parameters, gradients
//   and optimizer state exactly), for a 1F1B and a zero-bubble plan (the latter with W rows).
// - The prediction read back as a measurement (the simulator's spans cut into layers) gives zero error on
//   every row and the predicted bubble; slowing one layer in it puts that layer first.
// - Bad input: a missing folder, a config of another plan or model, a stream of another version: exit 2,
//   the message names the file and the reason.
#include <QtTest>

#include <QDir>
#include <QTemporaryDir>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "mpi_test_util.h"
#include "plan/cost_model.h"
#include "plan/fidelity.h"
#include "plan/plan.h"
#include "plan/run_config.h"
#include "plan/simulator.h"

using namespace ms;
using namespace ms::test;

namespace {

const QString kEngine = QStringLiteral(MS_ENGINE_EXE);

struct Out {
  int code = -1;
  std::string out, err;
};

Out engineOut(const QStringList& args) {
  const ms::test::ProcessResult r = ms::test::runProcess(kEngine, args, 60000);
  return {r.code, r.out.toStdString(), r.err.toStdString()};
}

double medianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

nlohmann::json configJson(const std::string& name, const std::string& schedule, const std::string& profile,
                          const std::string& text) {
  return {{"version", 1},
          {"name", name},
          {"seed", 3},
          {"model",
           {{"type", "gpt"}, {"layers", 4}, {"width", 32}, {"heads", 2}, {"vocab", 256}, {"context", 32}}},
          {"data", {{"kind", "text"}, {"files", {text}}}},
          {"mesh",
           {{"nodes", {{{"name", "n0"}, {"device", "here"}, {"count", 2}}}},
            {"intra_link", "here.shm"},
            {"inter_link", "here.shm"},
            {"profiles", {{{"name", "here"}, {"file", profile}}}}}},
          {"parallel", {{"pp", 2}, {"microbatches", 4}, {"schedule", schedule}}},
          {"training",
           {{"steps", 4},
            {"batch_size", 8},
            {"seq_len", 32},
            {"threads", 1},
            {"eval_batches", 1},
            {"log_every", 1}}}};
}

const nlohmann::json* findRow(const nlohmann::json& rows, const std::string& item, int rank,
                              const std::string& what) {
  for (const nlohmann::json& r : rows)
    if (r["item"] == item && r["rank"] == rank && r["what"] == what) return &r;
  return nullptr;
}

}  // namespace

class TestFidelity : public QObject {
  Q_OBJECT

  QTemporaryDir m_dir;
  QString m_profile;
  std::map<std::string, QString> m_runs;  // schedule -> run folder

 private slots:
  void initTestCase() {
    QVERIFY(m_dir.isValid());
    m_profile = m_dir.path() + "/profile.json";
    const Out cal =
        engineOut({"calibrate", "--quick", "--threads", "1", "--links", "shm", "--out", m_profile});
    QVERIFY2(cal.code == 0, cal.err.c_str());
    const std::string text = m_dir.path().toStdString() + "/text.txt";
    {
      std::ofstream t(text);
      for (int i = 0; i < 400; ++i) t << "a plan predicted is a plan to be measured, line " << i << "\n";
    }
    for (const std::string schedule : {"1f1b", "zb_h1"}) {
      const QString dir = m_dir.path() + "/" + QString::fromStdString(schedule);
      QVERIFY(QDir().mkpath(dir));
      std::ofstream(dir.toStdString() + "/project.json")
          << configJson("fid-" + schedule, schedule, m_profile.toStdString(), text).dump(1);
      const ProcessResult run = runMpi(
          MS_MPIEXEC, kEngine, 2, {"train", dir + "/project.json", "--run-dir", dir + "/run", "--quiet"});
      QVERIFY2(run.code == 0, qPrintable(run.err));
      m_runs[schedule] = dir + "/run";
    }
  }

  // The report against the stream it was read from and the plan command's prediction.
  void reportHoldsTheStreamAndThePlan() {
    const QString run = m_runs["1f1b"];
    const Out out = engineOut({"fidelity", run, "--json"});
    QVERIFY2(out.code == 0, out.err.c_str());
    const nlohmann::json report = nlohmann::json::parse(out.out);
    QCOMPARE(report["ranks"].get<int>(), 2);
    QCOMPARE(report["profiled"].get<bool>(), true);
    QCOMPARE(report["device"].get<std::string>(), std::string("here"));
    QCOMPARE(report["steps_used"].get<int>(), 3);  // step 1 left out

    // Measured, recomputed here: step time median of steps 2-4, and each rank's per-step sums.
    std::vector<double> stepTimes;
    std::map<std::tuple<int, std::string, std::string>, std::vector<double>> sums;  // (rank, action, layer)
    std::ifstream in((run + "/metrics.jsonl").toStdString());
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      if (j["type"] == "step" && j["step"].get<int>() > 1)
        stepTimes.push_back(j["step_time_s"].get<double>());
      if (j["type"] != "spans" || j["step"].get<int>() == 1) continue;
      std::map<std::tuple<int, std::string, std::string>, double> step;
      for (const auto& r : j["ranks"])
        for (const auto& s : r["spans"])
          step[{r["rank"].get<int>(), s["action"].get<std::string>(), s.value("layer", "")}] +=
              s["end"].get<double>() - s["start"].get<double>();
      for (const auto& [k, v] : step) sums[k].push_back(v);
    }
    QCOMPARE(stepTimes.size(), size_t(3));
    QCOMPARE(report["step"]["measured_s"].get<double>(), medianOf(stepTimes));
    const Out plan = engineOut({"plan", run + "/config.json", "--json"});
    QVERIFY2(plan.code == 0, plan.err.c_str());
    QCOMPARE(report["step"]["predicted_s"].get<double>(),
             nlohmann::json::parse(plan.out)["step_time_s"].get<double>());

    // Layers: stage 0 runs embedding, block.0, block.1; stage 1 block.2, block.3, head (the even split).
    const std::map<std::string, int> stageOf = {{"embedding", 0}, {"block.0", 0}, {"block.1", 0},
                                                {"block.2", 1},   {"block.3", 1}, {"head", 1}};
    for (const auto& [layer, stage] : stageOf)
      for (int rank = 0; rank < 2; ++rank) {
        const nlohmann::json* f = findRow(report["times"], "F", rank, layer);
        if (rank != stage) {
          QVERIFY2(!f, (layer + " on the other stage's rank").c_str());
          continue;
        }
        QVERIFY2(f, layer.c_str());
        QCOMPARE((*f)["stage"].get<int>(), stage);
        QVERIFY((*f)["predicted"].get<double>() > 0);
        QCOMPARE((*f)["measured"].get<double>(), medianOf(sums[{rank, "F", layer}]));
      }
    // Blocks have a backward on their rank; the receive waits and the optimizer match the stream too.
    for (int b = 0; b < 4; ++b) {
      const int rank = b / 2;
      const nlohmann::json* row = findRow(report["times"], "B", rank, "block." + std::to_string(b));
      QVERIFY(row);
      QCOMPARE((*row)["measured"].get<double>(), medianOf(sums[{rank, "B", "block." + std::to_string(b)}]));
      QVERIFY((*row)["predicted"].get<double>() > 0);
    }
    for (int rank = 0; rank < 2; ++rank) {
      const nlohmann::json* o = findRow(report["times"], "O", rank, "");
      QVERIFY(o);
      QCOMPARE((*o)["measured"].get<double>(), medianOf(sums[{rank, "O", ""}]));
    }
    QVERIFY(!findRow(report["times"], "W", 0, "block.0"));  // 1F1B: no split backward
    // Worst first: the time rows (bubbles after them) and the memory rows, by |predicted - measured|.
    double last = INFINITY;
    for (const auto& r : report["times"]) {
      if (r["item"] == "bubble") break;
      const double gap = std::abs(r["predicted"].get<double>() - r["measured"].get<double>());
      QVERIFY(gap <= last);
      last = gap;
    }
    last = INFINITY;
    for (const auto& r : report["memory"]) {
      const double gap = std::abs(r["predicted"].get<double>() - r["measured"].get<double>());
      QVERIFY(gap <= last);
      last = gap;
    }
    // Bubble rows: one per rank, fractions.
    int bubbles = 0;
    for (const auto& r : report["times"])
      if (r["item"] == "bubble") {
        ++bubbles;
        QVERIFY(r["measured"].get<double>() >= 0 && r["measured"].get<double>() < 1);
        QVERIFY(r["predicted"].get<double>() > 0 && r["predicted"].get<double>() < 1);
      }
    QCOMPARE(bubbles, 2);
    // The text table names the run and the step.
    const Out table = engineOut({"fidelity", run, "--top", "3"});
    QVERIFY2(table.code == 0, table.err.c_str());
    QVERIFY(table.out.find("run fid-1f1b: 2 ranks, 3 steps compared") != std::string::npos);
  }

  // The memory target, per rank and category, on both schedules.
  void peakMemoryWithinTwoPercent_data() {
    QTest::addColumn<QString>("schedule");
    QTest::newRow("1f1b") << "1f1b";
    QTest::newRow("zb_h1") << "zb_h1";
  }
  void peakMemoryWithinTwoPercent() {
    QFETCH(QString, schedule);
    auto report = fidelityOfRunFolder(m_runs[schedule.toStdString()].toStdString());
    QVERIFY2(report, report.message().c_str());
    std::map<std::pair<int, std::string>, const FidelityRow*> rows;
    for (const FidelityRow& r : report->memory) rows[{r.rank, r.what}] = &r;
    for (int rank = 0; rank < 2; ++rank) {
      for (const char* exact : {"parameters", "gradients", "optimizer"}) {
        const FidelityRow* r = rows[{rank, exact}];
        QVERIFY2(r, exact);
        QVERIFY(r->measured > 0);
        QCOMPARE(r->predicted, r->measured);
      }
      for (const char* close : {"activations", "total"}) {
        const FidelityRow* r = rows[{rank, close}];
        QVERIFY2(r, close);
        QVERIFY2(std::abs(r->error()) <= 0.02, qPrintable(QString("rank %1 %2: predicted %3, measured %4")
                                                              .arg(rank)
                                                              .arg(close)
                                                              .arg(r->predicted)
                                                              .arg(r->measured)));
      }
    }
    if (schedule == "zb_h1") {  // a split backward: W rows for the blocks, on their stage
      bool w = false;
      for (const FidelityRow& r : report->times)
        if (r.item == FidelityItem::Weight && r.what == "block.3")
          w = r.rank == 1 && r.measured > 0 && r.predicted > 0;
      QVERIFY(w);
    }
  }

  // The simulator's own spans, cut into layers by the cost model's times, read back as a run: every row's
  // error is 0 and the bubble is the predicted one; one layer twice as slow comes first.
  void predictionReadBackIsExact() {
    auto config = loadRunConfig(m_runs["zb_h1"].toStdString() + "/config.json");
    QVERIFY2(config, config.message().c_str());
    auto plan = buildPlan(*config, true);
    QVERIFY2(plan, plan.message().c_str());
    const CostModel cost(*plan);
    const SimResult sim = simulate(*plan, cost);
    const LayerTimes& lt = cost.layerTimes();
    MeasuredRun run;
    run.name = "read-back";
    run.ranks = 2;
    int mismatches = 0;  // chunks whose layers do not add up to the simulator's span
    const auto makeStep = [&](int64_t step, const std::string& slow) -> LoggedStep {
      LoggedStep s;
      s.step = step;
      s.stepTime = sim.stepTime;
      s.spans.resize(2);
      for (int r = 0; r < 2; ++r)
        for (const SimSpan& sp : sim.spansByRank[size_t(r)]) {
          const char code = sp.type == ActionType::Forward          ? 'F'
                            : sp.type == ActionType::Backward       ? 'B'
                            : sp.type == ActionType::BackwardWeight ? 'W'
                            : sp.type == ActionType::RecvActivation ? 'r'
                            : sp.type == ActionType::RecvGrad       ? 'R'
                            : sp.type == ActionType::OptimizerStep  ? 'O'
                                                                    : 0;
          if (!code) continue;
          if (code != 'F' && code != 'B' && code != 'W') {
            s.spans[size_t(r)].push_back({code, "", sp.microbatch, sp.chunk, sp.start, sp.end});
            continue;
          }
          // The chunk's layers one after another, each its cost-model time (one node, no in-layer comm).
          double t = sp.start;
          for (int l : plan->partition.chunks[size_t(sp.chunk)]) {
            double d = code == 'F'   ? lt.forward[size_t(l)]
                       : code == 'B' ? lt.backwardInput[size_t(l)]
                                     : lt.backwardWeight[size_t(l)];
            const std::string& name = plan->model.layers[size_t(l)].name;
            if (name == slow) d *= 2;
            s.spans[size_t(r)].push_back({code, name, sp.microbatch, sp.chunk, t, t + d});
            t += d;
          }
          if (slow.empty() && std::abs(t - sp.end) > 1e-12 + 1e-9 * sp.end) ++mismatches;
        }
      // The exposed gradient finish: from the last compute to the optimizer step.
      for (int r = 0; r < 2; ++r) {
        double lastCompute = 0, optStart = -1;
        for (const SimSpan& sp : sim.spansByRank[size_t(r)])
          if (sp.type == ActionType::OptimizerStep)
            optStart = sp.start;
          else if (onComputeLane(sp.type))
            lastCompute = std::max(lastCompute, sp.end);
        if (optStart > lastCompute) s.spans[size_t(r)].push_back({'G', "", 0, -1, lastCompute, optStart});
      }
      return s;
    };
    run.steps = {makeStep(1, ""), makeStep(2, ""), makeStep(3, "")};
    QCOMPARE(mismatches, 0);
    auto report = fidelityReport(*config, run);
    QVERIFY2(report, report.message().c_str());
    QCOMPARE(report->stepsUsed, 2);
    QVERIFY(!report->times.empty());
    for (const FidelityRow& r : report->times)
      QVERIFY2(std::abs(r.predicted - r.measured) <= 1e-9 * std::max(1e-6, r.measured),
               qPrintable(QString("%1 rank %2 %3: %4 vs %5")
                              .arg(toString(r.item))
                              .arg(r.rank)
                              .arg(QString::fromStdString(r.what))
                              .arg(r.predicted)
                              .arg(r.measured)));
    QVERIFY(std::abs(report->measuredStep - report->predictedStep) <= 1e-12);

    run.steps = {makeStep(1, ""), makeStep(2, "block.1"), makeStep(3, "block.1")};
    report = fidelityReport(*config, run);
    QVERIFY2(report, report.message().c_str());
    const FidelityRow& worst = report->times.front();
    QCOMPARE(worst.what, std::string("block.1"));
    QCOMPARE(worst.rank, 0);
    QVERIFY(std::abs(worst.error() + 0.5) < 1e-9);  // predicted half the measured
  }

  void badInputIsRefused() {
    // No such folder.
    Out out = engineOut({"fidelity", m_dir.path() + "/nowhere"});
    QCOMPARE(out.code, 2);
    QVERIFY2(out.err.find("nowhere/config.json") != std::string::npos, out.err.c_str());
    // Usage.
    QCOMPARE(engineOut({"fidelity"}).code, 2);
    QCOMPARE(engineOut({"fidelity", m_runs["1f1b"], "--top", "0"}).code, 2);
    // A config of another plan: one stage on one rank.
    nlohmann::json other =
        nlohmann::json::parse(std::ifstream(m_runs["1f1b"].toStdString() + "/config.json"));
    other["parallel"]["pp"] = 1;
    other["mesh"]["nodes"][0]["count"] = 1;
    const std::string otherPath = m_dir.path().toStdString() + "/other.json";
    std::ofstream(otherPath) << other.dump();
    out = engineOut({"fidelity", m_runs["1f1b"], "--config", QString::fromStdString(otherPath)});
    QCOMPARE(out.code, 2);
    QVERIFY2(out.err.find("the run has 2 ranks, the config's plan 1") != std::string::npos, out.err.c_str());
    // Another model: 3 layers (block.3 is not in it).
    other = nlohmann::json::parse(std::ifstream(m_runs["1f1b"].toStdString() + "/config.json"));
    other["model"]["layers"] = 2;
    std::ofstream(otherPath) << other.dump();
    out = engineOut({"fidelity", m_runs["1f1b"], "--config", QString::fromStdString(otherPath)});
    QCOMPARE(out.code, 2);
    QVERIFY2(out.err.find("which the config's model does not") != std::string::npos, out.err.c_str());
    // A stream of another version, in a copy of the run.
    const QString copy = m_dir.path() + "/copy";
    QVERIFY(QDir().mkpath(copy));
    QVERIFY(QFile::copy(m_runs["1f1b"] + "/config.json", copy + "/config.json"));
    {
      std::ifstream in((m_runs["1f1b"] + "/metrics.jsonl").toStdString());
      std::ofstream o((copy + "/metrics.jsonl").toStdString());
      std::string l;
      int n = 0;
      while (std::getline(in, l)) {
        if (++n == 3) {
          auto j = nlohmann::json::parse(l);
          j["v"] = 99;
          l = j.dump();
        }
        o << l << "\n";
      }
    }
    out = engineOut({"fidelity", copy});
    QCOMPARE(out.code, 2);
    QVERIFY2(out.err.find("metrics.jsonl:3: metrics version 99") != std::string::npos, out.err.c_str());
  }
};

QTEST_GUILESS_MAIN(TestFidelity)
#include "tst_fidelity.moc"
