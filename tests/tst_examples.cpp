// Every example a person can train on this machine trains smoothly over its first steps: the engine runs the
// example as it ships (model, data, optimizer, its learning-rate schedule: `train --stop-after` keeps the
// config's schedule and stops early), and the loss must fall without a spike.
//
// A spike is a step whose loss is more than kMaxRise above the lowest loss of the steps before it.
// Batch-to-batch noise, measured as that rise over the first 60 steps with seeds 1-5 (seed 1 ships):
// gpt-fortunes 0.12-0.23, vit-fashion 0.11-0.25, mlp-fashion 0.27-0.60 (momentum SGD is bumpy around steps
// 30-45; 0.34 with seed 1). Another seed stands for another machine (a different thread count sums in another
// order), so kMaxRise clears them all. The default project's spike that this test was written against
// rose 2.19 (5.88 at step 19 after 3.69, warm-up 30 steps): PyTorch on the same weights and batches spikes
// identically (tests/reference/train_reference.py), and so does bench/torch_gpt.py's model with PyTorch's own
// initialisation and batches, so the cure was the example's warm-up (30 -> 100 steps), not the engine.
#include <QtTest>

#include <QProcess>
#include <QTemporaryDir>
#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

namespace {

const QString kEngine = QStringLiteral(MS_ENGINE_EXE);
constexpr double kMaxRise = 0.75;  // nats; see above
constexpr int kSteps = 60;

struct Step {
  int step = 0;
  double loss = 0;
};

std::vector<Step> readSteps(const QString& path) {
  std::vector<Step> out;
  std::ifstream in(path.toStdString());
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("type", "") == "step")
      out.push_back({j.value("step", 0), j.value("loss", 0.0)});
  }
  return out;
}

}  // namespace

class TestExamples : public QObject {
  Q_OBJECT
 private slots:
  void trainsSmoothly_data() {
    QTest::addColumn<QString>("example");
    QTest::newRow("gpt-fortunes (the default project)") << "gpt-fortunes.json";
    QTest::newRow("llama-fortunes") << "llama-fortunes.json";
    QTest::newRow("mlp-fashion") << "mlp-fashion.json";
    QTest::newRow("vit-fashion") << "vit-fashion.json";
    QTest::newRow("cnn-fashion") << "cnn-fashion.json";
  }

  void trainsSmoothly() {
    QFETCH(QString, example);
    QTemporaryDir dir;
    const QString metrics = dir.filePath("metrics.jsonl");
    QProcess p;
    p.start(kEngine,
            {"train", QStringLiteral(MS_SOURCE_DIR "/resources/examples/") + example, "--stop-after",
             QString::number(kSteps), "--metrics", metrics, "--run-dir", dir.filePath("run"), "--quiet"});
    QVERIFY2(p.waitForFinished(300000), "the engine did not finish in 5 minutes");
    QVERIFY2(p.exitStatus() == QProcess::NormalExit && p.exitCode() == 0,
             p.readAllStandardError().constData());
    const std::vector<Step> steps = readSteps(metrics);
    QCOMPARE(int(steps.size()), kSteps);
    double best = steps.front().loss, worstRise = 0;
    int worstAt = 0;
    for (size_t i = 1; i < steps.size(); ++i) {
      const double rise = steps[i].loss - best;
      QVERIFY2(rise <= kMaxRise,
               qPrintable(QString("%1: step %2's loss %3 is %4 above the lowest before it (%5); "
                                  "batch noise stays under %6")
                              .arg(example)
                              .arg(steps[i].step)
                              .arg(steps[i].loss)
                              .arg(rise)
                              .arg(best)
                              .arg(kMaxRise)));
      if (rise > worstRise) worstRise = rise, worstAt = steps[i].step;
      best = std::min(best, steps[i].loss);
    }
    // And it learns: the loss falls by at least a fifth over the first steps.
    QVERIFY2(
        best < 0.8 * steps.front().loss,
        qPrintable(QString("%1: from %2 only down to %3").arg(example).arg(steps.front().loss).arg(best)));
    qInfo("%s: loss %.3f -> %.3f, worst rise %.3f at step %d", qPrintable(example), steps.front().loss, best,
          worstRise, worstAt);
  }
};

QTEST_MAIN(TestExamples)
#include "tst_examples.moc"
