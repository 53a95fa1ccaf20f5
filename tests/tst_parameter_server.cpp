// Parameter-server mode (engine/runtime/ps.h) with real processes: `meshstudio-engine launch` starting
// ps-server and ps-worker processes that talk over ZeroMQ on the loopback interface.
//   - sync equals collective data parallelism (mpirun, the same global batch): bit for bit with two workers,
//     for an mlp on one server and for a tied GPT split over two servers; with four workers (whose sum MPI
//     adds in another order) to rounding;
//   - async and bounded runs train the mlp on Fashion-MNIST, every update's staleness counted, bounded's
//     within its bound;
//   - a worker killed mid-run is dropped and the run finishes with the rest;
//   - a server killed mid-run restarts from its checkpoint and the run finishes;
//   - a worker started later joins the running job;
//   - bad launches are refused with the field or option named.
// Every wait is bounded (QProcess timeouts; the engine's own worker and server timeouts are seconds).
#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

using nlohmann::json;

const QString kEngine = QStringLiteral(MS_ENGINE_EXE);

QProcessEnvironment environment() {
  QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
  env.insert("OMPI_ALLOW_RUN_AS_ROOT", "1");
  env.insert("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  env.insert("OMPI_MCA_rmaps_base_oversubscribe", "1");
  env.remove("MESHSTUDIO_HEARTBEAT_DIR");
  return env;
}

std::vector<json> readLines(const QString& path) {
  std::vector<json> out;
  std::ifstream in(path.toStdString());
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(json::parse(line, nullptr, false));
  return out;
}

std::vector<json> ofType(const std::vector<json>& lines, const std::string& type) {
  std::vector<json> out;
  for (const json& j : lines)
    if (j.is_object() && j.value("type", "") == type) out.push_back(j);
  return out;
}

struct Run {
  int code = -1;
  QString err;
  std::vector<json> lines;
};

// Runs the engine with args to its end (at most timeoutMs); the metrics file is read afterwards.
Run runEngine(const QStringList& args, const QString& metrics, int timeoutMs = 120000) {
  QProcess p;
  p.setProcessEnvironment(environment());
  p.start(kEngine, args);
  Run r;
  if (!p.waitForStarted(10000)) {
    r.err = "could not start " + kEngine + ": " + p.errorString();
    return r;
  }
  if (!p.waitForFinished(timeoutMs)) {
    p.kill();
    p.waitForFinished(5000);
    r.err = "timed out: " + QString::fromUtf8(p.readAllStandardError());
    return r;
  }
  r.code = p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1;
  r.err = QString::fromUtf8(p.readAllStandardError());
  if (!metrics.isEmpty()) r.lines = readLines(metrics);
  return r;
}

// The mlp on Fashion-MNIST (or, with gpt, a tied 2-block GPT on a text file), one thread per process.
json baseConfig(const QString& dir, const std::string& name, bool gpt) {
  json c = {{"version", 1}, {"name", name}, {"seed", 5}, {"device", "cpu"}};
  if (gpt) {
    const QString text = dir + "/t.txt";
    std::ofstream out(text.toStdString());
    for (int i = 0; i < 200; ++i) out << "Line " << i << " of a text that parameter servers learn.\n";
    c["model"] = {{"type", "gpt"}, {"layers", 2}, {"width", 32}, {"heads", 2}, {"context", 16}};
    c["data"] = {{"kind", "text"}, {"files", json::array({text.toStdString()})}};
    c["optimizer"] = {{"type", "adamw"}, {"lr", 3e-3}};
    c["training"] = {{"steps", 12},       {"batch_size", 8}, {"seq_len", 16},
                     {"eval_batches", 2}, {"threads", 1},    {"grad_clip", 0}};
  } else {
    c["model"] = {{"type", "mlp"}, {"hidden", json::array({128, 64})}, {"classes", 10}};
    c["data"] = {{"kind", "fashion_mnist"}};
    c["optimizer"] = {{"type", "sgd"}, {"lr", 0.05}, {"momentum", 0.9}};
    c["training"] = {{"steps", 20},    {"batch_size", 64},  {"eval_batches", 8},      {"threads", 1},
                     {"grad_clip", 0}, {"warmup_steps", 2}, {"lr_schedule", "cosine"}};
  }
  c["mesh"] = {{"nodes", json::array({{{"name", "n0"}, {"device", "cpu"}, {"count", 4}}})}};
  return c;
}

QString write(const QString& dir, const json& c) {
  const QString path = dir + "/" + QString::fromStdString(c.value("name", "c")) + ".json";
  std::ofstream(path.toStdString()) << c.dump(2);
  return path;
}

json psConfig(json c, int servers, int workers, const std::string& consistency) {
  c["name"] = c.value("name", "c") + "-ps";
  c["parallel"] = {{"mode", "parameter_server"},
                   {"servers", servers},
                   {"workers", workers},
                   {"consistency", consistency},
                   {"worker_timeout_s", 3}};
  return c;
}

// launch CONFIG [extra] -- --metrics M --run-dir D --overwrite
Run launch(const QString& dir, const QString& config, const QString& tag, const QStringList& extra = {}) {
  const QString metrics = dir + "/" + tag + ".jsonl";
  QStringList args = {"launch", config};
  args += extra;
  args += {"--", "--metrics", metrics, "--run-dir", dir + "/runs/" + tag, "--overwrite", "--quiet"};
  return runEngine(args, metrics);
}

std::string lastLog(const Run& r) {
  std::string all;
  for (const json& l : ofType(r.lines, "log")) all += l.value("message", "") + "\n";
  return all;
}

int64_t histogramSum(const json& h) {
  int64_t n = 0;
  for (const json& v : h) n += v.get<int64_t>();
  return n;
}

}  // namespace

class TestParameterServer : public QObject {
  Q_OBJECT

 private slots:
  void syncEqualsCollective_data() {
    QTest::addColumn<bool>("gpt");
    QTest::addColumn<int>("servers");
    QTest::addColumn<int>("workers");
    QTest::addColumn<double>("tolerance");
    QTest::newRow("mlp, 1 server, 2 workers: exact") << false << 1 << 2 << 0.0;
    QTest::newRow("tied gpt, 2 servers, 2 workers: exact") << true << 2 << 2 << 0.0;
    // Four pushes are summed in worker order, MPI's all-reduce adds them in its own.
    QTest::newRow("mlp, 2 servers, 4 workers: rounding") << false << 2 << 4 << 1e-6;
  }
  void syncEqualsCollective() {
    QFETCH(bool, gpt);
    QFETCH(int, servers);
    QFETCH(int, workers);
    QFETCH(double, tolerance);
    QTemporaryDir dir;
    json dp = baseConfig(dir.path(), "dp", gpt);
    dp["parallel"] = {{"dp", workers}};
    const Run a = launch(dir.path(), write(dir.path(), dp), "dp");
    QVERIFY2(a.code == 0, qPrintable(a.err));
    const Run b = launch(dir.path(), write(dir.path(), psConfig(dp, servers, workers, "sync")), "ps");
    QVERIFY2(b.code == 0, qPrintable(b.err));
    const auto sa = ofType(a.lines, "step"), sb = ofType(b.lines, "step");
    QCOMPARE(sb.size(), sa.size());
    QCOMPARE(int(sb.size()), dp["training"]["steps"].get<int>());
    for (size_t i = 0; i < sa.size(); ++i) {
      const double x = sa[i]["loss"], y = sb[i]["loss"];
      if (tolerance == 0)
        QVERIFY2(x == y, qPrintable(QString("step %1: collective %2, parameter server %3")
                                        .arg(i + 1)
                                        .arg(x, 0, 'g', 17)
                                        .arg(y, 0, 'g', 17)));
      else
        QVERIFY2(std::abs(x - y) <= tolerance * std::abs(x),
                 qPrintable(QString("step %1: %2 vs %3").arg(i + 1).arg(x).arg(y)));
      QCOMPARE(sb[i]["version"].get<int64_t>(), int64_t(i + 1));
    }
    const auto ea = ofType(a.lines, "eval"), eb = ofType(b.lines, "eval");
    QCOMPARE(eb.size(), size_t(1));
    QCOMPARE(ea.size(), size_t(1));
    if (tolerance == 0) QCOMPARE(eb[0]["loss"].get<double>(), ea[0]["loss"].get<double>());
    // Sync: every update is fresh.
    const auto ps = ofType(b.lines, "ps");
    QVERIFY(!ps.empty());
    const json total = ps.back()["staleness_total"];
    QCOMPARE(total.size(), size_t(1));
    QCOMPARE(total[0].get<int64_t>(), int64_t(workers) * dp["training"]["steps"].get<int>());
    QCOMPARE(ofType(b.lines, "run_end").back()["status"].get<std::string>(), std::string("ok"));
  }

  // Async and bounded train the mlp: the loss falls to under half its start and the final accuracy is
  // five times chance. Asynchrony makes the figures depend on how the OS schedules six processes (a CI
  // run under load once reached 0.55 after 40 steps where 0.66-0.69 is usual), so the run is 60 steps
  // (accuracy 0.68-0.74 and last loss 0.64-0.87 over twelve runs beside two busy loops) and the bounds
  // keep a wide margin; every push is applied once and counted in the staleness histogram; bounded's
  // staleness stays within (k + 1) * workers - 1 versions (a worker at most k steps ahead of the slowest,
  // each step being `workers` updates).
  void asyncAndBoundedTrain_data() {
    QTest::addColumn<QString>("consistency");
    QTest::newRow("async") << "async";
    QTest::newRow("bounded, staleness 1") << "bounded";
  }
  void asyncAndBoundedTrain() {
    QFETCH(QString, consistency);
    QTemporaryDir dir;
    json c = psConfig(baseConfig(dir.path(), "a", false), 2, 4, consistency.toStdString());
    c["parallel"]["staleness"] = 1;
    c["training"]["steps"] = 60;
    c["training"]["eval_batches"] = 16;
    c["optimizer"]["lr"] = 0.02;
    const Run r = launch(dir.path(), write(dir.path(), c), "run");
    QVERIFY2(r.code == 0, qPrintable(r.err));
    const auto steps = ofType(r.lines, "step");
    QCOMPARE(int(steps.size()), 60);
    QCOMPARE(steps.back()["version"].get<int64_t>(), int64_t(240));
    const double first = steps.front()["loss"], last = steps.back()["loss"];
    QVERIFY2(last < 0.5 * first, qPrintable(QString("loss %1 -> %2").arg(first).arg(last)));
    const auto evals = ofType(r.lines, "eval");
    QCOMPARE(evals.size(), size_t(1));
    qInfo("%s: loss %.4f -> %.4f, accuracy %.4f, staleness %s", qPrintable(consistency), first, last,
          evals[0]["accuracy"].get<double>(), ofType(r.lines, "ps").back()["staleness_total"].dump().c_str());
    QVERIFY2(evals[0]["accuracy"].get<double>() > 0.5,
             qPrintable(QString::number(evals[0]["accuracy"].get<double>())));
    const json total = ofType(r.lines, "ps").back()["staleness_total"];
    QCOMPARE(histogramSum(total), int64_t(240));
    if (consistency == "bounded") QVERIFY2(int(total.size()) - 1 <= (1 + 1) * 4 - 1, total.dump().c_str());
    int64_t pushes = 0;
    const json states = ofType(r.lines, "ps").back()["worker_states"];
    for (const json& w : states) pushes += w["steps"].get<int64_t>();
    QCOMPARE(pushes, int64_t(240));
  }

  void killedWorkerIsDropped() {
    QTemporaryDir dir;
    json c = psConfig(baseConfig(dir.path(), "k", false), 1, 3, "sync");
    c["training"]["steps"] = 30;
    c["training"]["batch_size"] = 60;
    const Run r = launch(dir.path(), write(dir.path(), c), "run", {"--kill-worker", "1:4"});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    QVERIFY2(r.err.contains("worker 1") && r.err.contains("Killed"), qPrintable(r.err));
    QVERIFY2(lastLog(r).find("worker 1 dropped") != std::string::npos, lastLog(r).c_str());
    QCOMPARE(int(ofType(r.lines, "step").size()), 30);
    const json end = ofType(r.lines, "run_end").back();
    QCOMPARE(end["status"].get<std::string>(), std::string("ok"));
    QCOMPARE(end["step"].get<int64_t>(), int64_t(30));
    const json states = ofType(r.lines, "ps").back()["worker_states"];
    QCOMPARE(states[1]["steps"].get<int64_t>(), int64_t(3));  // its three steps before the fourth killed it
    QCOMPARE(states[0]["steps"].get<int64_t>(), int64_t(30));
    QVERIFY(!ofType(r.lines, "eval").empty());
  }

  // Server 0 (which writes the stream) dies at step 15; the launcher restarts it from its step-10
  // checkpoint; the run goes on to its end, the stream saying where it resumed.
  void serverRestartsFromCheckpoint() {
    QTemporaryDir dir;
    json c = psConfig(baseConfig(dir.path(), "s", false), 2, 2, "sync");
    c["training"]["steps"] = 30;
    c["training"]["checkpoint_every"] = 10;
    const Run r = launch(dir.path(), write(dir.path(), c), "run", {"--kill-server", "0:15"});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    QVERIFY2(r.err.contains("restarting it from its newest checkpoint"), qPrintable(r.err));
    const auto starts = ofType(r.lines, "run_start");
    QCOMPARE(starts.size(), size_t(2));
    QVERIFY2(starts[1]["resumed_from"].get<std::string>().find("version-000000000010") != std::string::npos,
             starts[1].dump().c_str());
    QCOMPARE(starts[1]["start_step"].get<int64_t>(), int64_t(10));
    const json end = ofType(r.lines, "run_end").back();
    QCOMPARE(end["status"].get<std::string>(), std::string("ok"));
    QCOMPARE(end["step"].get<int64_t>(), int64_t(30));
    // Steps 11 to 15 ran twice: before the death and after the restart.
    QCOMPARE(int(ofType(r.lines, "step").size()), 35);
    QVERIFY(QFile::exists(dir.path() + "/runs/run/servers/server-0/version-000000000030.safetensors"));
  }

  // A worker started by hand while the job runs joins and trains; the job does not wait for it to begin.
  void laterWorkerJoins() {
    QTemporaryDir dir;
    json c = psConfig(baseConfig(dir.path(), "j", false), 1, 2, "async");
    c["training"]["steps"] = 40;
    c["training"]["log_every"] = 1;
    c["parallel"]["worker_timeout_s"] = 1;  // the server starts without worker 1 after a second
    c["parallel"]["stragglers"] = json::array({{{"worker", 0}, {"slowdown", 200}}});
    const QString config = write(dir.path(), c);
    const QString metrics = dir.path() + "/run.jsonl";
    const QString endpoint = "ipc://" + dir.path() + "/server0";
    QProcess server, w0, w1;
    for (QProcess* p : {&server, &w0, &w1}) p->setProcessEnvironment(environment());
    server.start(kEngine, {"ps-server", config, "--index", "0", "--bind", endpoint, "--run-dir",
                           dir.path() + "/runs/j", "--metrics", metrics});
    w0.start(kEngine, {"ps-worker", config, "--index", "0", "--servers", endpoint});
    // Worker 0 alone, a straggler: wait (bounded) for its third step line, then start worker 1.
    bool progressed = false;
    for (int i = 0; i < 300 && !progressed; ++i) {
      QTest::qWait(100);
      progressed = ofType(readLines(metrics), "step").size() >= 3;
    }
    QVERIFY2(progressed, qPrintable(QString::fromUtf8(server.readAllStandardError())));
    w1.start(kEngine, {"ps-worker", config, "--index", "1", "--servers", endpoint});
    for (QProcess* p : {&server, &w0, &w1}) {
      QVERIFY2(p->waitForFinished(120000), "a parameter-server process did not end in 120 s");
      QCOMPARE(p->exitCode(), 0);
    }
    const auto lines = readLines(metrics);
    std::string joined;
    for (const json& l : ofType(lines, "log"))
      if (l.value("message", "").find("worker 1 joined at step") != std::string::npos) joined = l["message"];
    QVERIFY2(!joined.empty(), lastLog(Run{0, {}, lines}).c_str());
    QVERIFY2(joined != "worker 1 joined at step 0", joined.c_str());
    const json states = ofType(lines, "ps").back()["worker_states"];
    QVERIFY(states[1]["steps"].get<int64_t>() > 0);
    QCOMPARE(states[0]["steps"].get<int64_t>() + states[1]["steps"].get<int64_t>(), int64_t(80));
    QCOMPARE(ofType(lines, "run_end").back()["status"].get<std::string>(), std::string("ok"));
  }

  void badLaunchesAreRefused() {
    QTemporaryDir dir;
    json c = psConfig(baseConfig(dir.path(), "b", false), 1, 2, "sync");
    const QString config = write(dir.path(), c);
    Run r = runEngine({"launch", config, "--kill-worker", "7:2", "--", "--run-dir", dir.path() + "/r"}, "");
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains("--kill-worker: worker 7 does not exist"), qPrintable(r.err));
    r = runEngine({"launch", config, "--kill-worker", "1", "--", "--run-dir", dir.path() + "/r"}, "");
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains("--kill-worker needs WORKER:STEP"), qPrintable(r.err));
    r = runEngine({"launch", config, "--", "--steps", "3"}, "");
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains("launch -- --steps"), qPrintable(r.err));
    r = runEngine({"train", config, "--run-dir", dir.path() + "/r"}, "");
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains("/parallel/mode") && r.err.contains("meshstudio-engine launch"),
             qPrintable(r.err));
    r = runEngine({"ps-worker", config, "--index", "2", "--servers", "tcp://127.0.0.1:1"}, "");
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains("--index"), qPrintable(r.err));
    // A finished run's checkpoints are not silently mixed with a new run's.
    const QString runDir = dir.path() + "/runs/twice";
    r = runEngine({"launch", config, "--", "--run-dir", runDir}, "");
    QVERIFY2(r.code == 0, qPrintable(r.err));
    r = runEngine({"launch", config, "--", "--run-dir", runDir}, "");
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains("already holds server checkpoints"), qPrintable(r.err));
    // The mode's own constraints name their fields.
    json bad = c;
    bad["parallel"]["dp"] = 2;
    bad["parallel"]["stragglers"] = json::array({{{"worker", 5}, {"slowdown", 2}}});
    bad["name"] = "bad";
    r = runEngine({"validate", write(dir.path(), bad)}, "");
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains("/parallel/dp") && r.err.contains("/parallel/stragglers/0/worker"),
             qPrintable(r.err));
  }
};

QTEST_GUILESS_MAIN(TestParameterServer)
#include "tst_parameter_server.moc"
