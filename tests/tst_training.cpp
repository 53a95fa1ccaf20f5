// End-to-end training on one rank through train(): determinism, bit-identical resume, gradient accumulation,
// both optimizers, the metrics stream and the run folder, and a real Fashion-MNIST run.
#include <QtTest>

#include <map>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/checkpoint.h"
#include "runtime/trainer.h"

using namespace ms;

namespace {

// A text with structure a tiny model can learn quickly.
std::string sampleText() {
  std::string s;
  for (int i = 0; i < 400; ++i)
    s += "the quick brown fox jumps over the lazy dog " + std::to_string(i % 7) + ". ";
  return s;
}

RunConfig textConfig(const QString& dir) {
  const std::string file = (dir + "/text.txt").toStdString();
  std::ofstream(file) << sampleText();
  RunConfig c;
  c.name = "t";
  c.seed = 3;
  c.model.type = ModelType::Gpt;
  c.model.layers = 2;
  c.model.width = 32;
  c.model.heads = 2;
  c.model.context = 16;
  c.data.kind = DataKind::Text;
  c.data.files = {file};
  c.data.valFraction = 0.1;
  c.optimizer.lr = 3e-3;
  c.training.steps = 6;
  c.training.batchSize = 4;
  c.training.seqLen = 16;
  c.training.warmupSteps = 2;
  c.training.evalBatches = 2;
  c.training.threads = 1;
  return c;
}

std::vector<nlohmann::json> readLines(const QString& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path.toStdString());
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Losses of the step lines, keyed by step.
std::map<int, double> stepLosses(const QString& metricsFile) {
  std::map<int, double> losses;
  for (const auto& j : readLines(metricsFile))
    if (j["type"] == "step") losses[j["step"].get<int>()] = j["loss"].get<double>();
  return losses;
}

Status runTrain(const RunConfig& c, const QString& runDir, const std::string& resume = {}) {
  TrainOptions o;
  o.runDir = runDir.toStdString();
  o.resume = resume;
  return train(c, o);
}

}  // namespace

class TestTraining : public QObject {
  Q_OBJECT
 private slots:
  void lossFallsAndStreamIsWellFormed() {
    QTemporaryDir tmp;
    RunConfig c = textConfig(tmp.path());
    c.training.steps = 40;
    c.training.evalEvery = 20;
    const QString run = tmp.path() + "/run";
    QVERIFY2(runTrain(c, run).isOk(), "train failed");
    const auto lines = readLines(run + "/metrics.jsonl");
    QVERIFY(lines.size() > 40);
    QCOMPARE(lines.front()["type"].get<std::string>(), std::string("run_start"));
    QCOMPARE(lines.back()["type"].get<std::string>(), std::string("run_end"));
    QCOMPARE(lines.back()["status"].get<std::string>(), std::string("ok"));
    for (const auto& j : lines) QCOMPARE(j["v"].get<int>(), 1);
    const auto losses = stepLosses(run + "/metrics.jsonl");
    QCOMPARE(losses.size(), size_t(40));
    QVERIFY2(losses.at(40) < losses.at(1) - 1.0,
             qPrintable(QString("first %1 last %2").arg(losses.at(1)).arg(losses.at(40))));
    std::vector<double> evals;
    int spans = 0, memory = 0;
    for (const auto& j : lines) {
      if (j["type"] == "eval") evals.push_back(j["loss"].get<double>());
      if (j["type"] == "spans") {
        ++spans;
        // Forward and backward of every layer, the gradient finish and the optimizer step.
        std::map<std::string, int> count;
        for (const auto& sp : j["ranks"][0]["spans"]) ++count[sp["action"].get<std::string>()];
        QCOMPARE(count["F"], 4);
        QCOMPARE(count["B"], 4);
        QCOMPARE(count["G"], 1);
        QCOMPARE(count["O"], 1);
        QCOMPARE(j["ranks"][0]["spans"].size(), size_t(2 * 4 + 2));
      }
      if (j["type"] == "memory") {
        ++memory;
        const auto& peak = j["ranks"][0]["peak"];
        QVERIFY(peak["parameters"].get<int64_t>() > 0);
        QCOMPARE(peak["optimizer"].get<int64_t>(), 2 * peak["parameters"].get<int64_t>());
        QVERIFY(peak["activations"].get<int64_t>() > 0);
      }
    }
    // The run_start line carries the plan's prediction; on this single-rank run the parameter, gradient and
    // optimizer bytes are exact, and the total is within 25% of the measured peak.
    const auto& predicted = lines.front()["predicted"]["ranks"][0]["memory_bytes"];
    int64_t measuredPeak = 0, measuredParams = 0;
    for (const auto& j : lines)
      if (j["type"] == "memory") {
        measuredPeak = std::max(measuredPeak, j["ranks"][0]["peak"]["total"].get<int64_t>());
        measuredParams = j["ranks"][0]["peak"]["parameters"].get<int64_t>();
      }
    QVERIFY(std::abs(predicted["parameters"].get<double>() - double(measuredParams)) <=
            0.01 * measuredParams);
    QCOMPARE(predicted["optimizer"].get<double>(), 2 * predicted["parameters"].get<double>());
    const double ratio = predicted["total"].get<double>() / double(measuredPeak);
    QVERIFY2(ratio > 0.75 && ratio < 1.25, qPrintable(QString::number(ratio)));
    // Activations exactly as the engine keeps them (every layer's output and saved tensors, the fused head's
    // input gradient), to rounding.
    int64_t measuredActivations = 0;
    for (const auto& j : lines)
      if (j["type"] == "memory")
        measuredActivations =
            std::max(measuredActivations, j["ranks"][0]["peak"]["activations"].get<int64_t>());
    QVERIFY2(std::abs(predicted["activations"].get<double>() - double(measuredActivations)) <=
                 0.005 * double(measuredActivations),
             qPrintable(QString("predicted %1, measured %2")
                            .arg(predicted["activations"].get<double>(), 0, 'f', 0)
                            .arg(measuredActivations)));
    QVERIFY(lines.front()["predicted"]["step_time_s"].get<double>() > 0);
    QCOMPARE(spans, 40);
    QCOMPARE(memory, 40);
    QCOMPARE(evals.size(), size_t(2));
    QVERIFY(evals[1] < evals[0]);
    // The run folder holds the config and the final checkpoint.
    QVERIFY(QFile::exists(run + "/config.json"));
    QVERIFY(QFile::exists(run + "/checkpoints/step-00000040/model.safetensors"));
    QVERIFY(QFile::exists(run + "/checkpoints/step-00000040/optimizer.safetensors"));
  }

  void deterministic() {
    QTemporaryDir tmp;
    const RunConfig c = textConfig(tmp.path());
    QVERIFY(runTrain(c, tmp.path() + "/a").isOk());
    QVERIFY(runTrain(c, tmp.path() + "/b").isOk());
    const auto a = stepLosses(tmp.path() + "/a/metrics.jsonl");
    const auto b = stepLosses(tmp.path() + "/b/metrics.jsonl");
    QCOMPARE(a.size(), size_t(6));
    for (const auto& [step, loss] : a) QCOMPARE(b.at(step), loss);  // bit-identical
  }

  void resumeIsBitIdentical_data() {
    QTest::addColumn<int>("optimizer");
    QTest::newRow("adamw") << int(OptimizerType::AdamW);
    QTest::newRow("sgd") << int(OptimizerType::Sgd);
  }
  void resumeIsBitIdentical() {
    QFETCH(int, optimizer);
    QTemporaryDir tmp;
    RunConfig c = textConfig(tmp.path());
    c.optimizer.type = static_cast<OptimizerType>(optimizer);
    if (c.optimizer.type == OptimizerType::Sgd) c.optimizer.lr = 0.1;
    c.training.checkpointEvery = 3;
    QVERIFY(runTrain(c, tmp.path() + "/full").isOk());
    // Resume from the full run's step-3 checkpoint into another folder.
    const std::string ckpt = checkpointDirName((tmp.path() + "/full").toStdString(), 3);
    QVERIFY(runTrain(c, tmp.path() + "/resumed", ckpt).isOk());
    const auto full = stepLosses(tmp.path() + "/full/metrics.jsonl");
    const auto resumed = stepLosses(tmp.path() + "/resumed/metrics.jsonl");
    QCOMPARE(resumed.size(), size_t(3));
    for (int s = 4; s <= 6; ++s) QCOMPARE(resumed.at(s), full.at(s));
    // Resume without a folder picks the newest checkpoint, which is the last one: nothing left to do.
    QVERIFY(runTrain(c, tmp.path() + "/full", "latest").isOk());
  }

  void refusesToMixRuns() {
    QTemporaryDir tmp;
    const RunConfig c = textConfig(tmp.path());
    QVERIFY(runTrain(c, tmp.path() + "/r").isOk());
    const Status again = runTrain(c, tmp.path() + "/r");
    QVERIFY(!again.isOk());
    QVERIFY(QString::fromStdString(again.message()).contains("already holds checkpoints"));
    // Resuming under another seed is refused: the data order would differ.
    RunConfig other = c;
    other.seed = 4;
    const Status s =
        runTrain(other, tmp.path() + "/r2", checkpointDirName((tmp.path() + "/r").toStdString(), 6));
    QVERIFY(!s.isOk());
    QVERIFY(QString::fromStdString(s.message()).contains("seed"));
  }

  // Gradient accumulation: 2 microbatches of 2 follow the same trajectory as 1 batch of 4.
  void microbatchesMatchOneBatch() {
    QTemporaryDir tmp;
    RunConfig c = textConfig(tmp.path());
    QVERIFY(runTrain(c, tmp.path() + "/one").isOk());
    c.parallel.microbatches = 2;
    QVERIFY(runTrain(c, tmp.path() + "/two").isOk());
    const auto a = stepLosses(tmp.path() + "/one/metrics.jsonl");
    const auto b = stepLosses(tmp.path() + "/two/metrics.jsonl");
    for (const auto& [step, loss] : a)
      QVERIFY2(std::abs(b.at(step) - loss) <= 1e-5 * std::abs(loss),
               qPrintable(QString("step %1: %2 vs %3").arg(step).arg(loss).arg(b.at(step))));
  }

  void refusesWhatItCannotRun() {
    RunConfig c;
    c.parallel.dp = 2;
    QVERIFY(QString::fromStdString(checkRunnable(c).message()).contains("/parallel"));
    c.parallel.dp = 1;
    // Sequence parallelism needs the sequence to split evenly: a vit with 16 patches and a class token
    // has 17.
    c.model.type = ModelType::Vit;
    c.model.imageSize = 28;
    c.model.patch = 7;
    c.model.pool = Pooling::Cls;
    c.parallel.tp = 2;
    c.parallel.sequenceParallel = true;
    const QString sp = QString::fromStdString(checkRunnable(c, 2).message());
    QVERIFY2(sp.contains("/parallel/sequence_parallel") && sp.contains("17 positions"), qPrintable(sp));
    c.model.pool = Pooling::Mean;  // 16 positions
    QVERIFY(checkRunnable(c, 2).isOk());
    // The mlp has nothing to split over tensor-parallel ranks.
    c.model.type = ModelType::Mlp;
    c.parallel.sequenceParallel = false;
    QVERIFY(QString::fromStdString(checkRunnable(c, 2).message()).contains("/parallel/tp"));
  }

  // Mixed precision (bf16 matrix products, fp32 master weights, optimizer state and loss; kernels/backend.h):
  // the loss curve tracks the fp32 one closely without being identical (the rounding is really applied), and
  // run_start says which precision the products used. On this machine the CPU rounds the operands as tensor
  // cores would; on a GPU the same test runs cuBLAS's bf16 GEMMs when "device" picks CUDA.
  void bf16TracksFp32() {
    QTemporaryDir tmp;
    RunConfig c = textConfig(tmp.path());
    c.training.steps = 30;
    c.training.evalEvery = 0;
    QVERIFY(runTrain(c, tmp.path() + "/fp32").isOk());
    c.parallel.precision = Precision::Bf16;
    QVERIFY(runTrain(c, tmp.path() + "/bf16").isOk());
    const auto a = stepLosses(tmp.path() + "/fp32/metrics.jsonl");
    const auto b = stepLosses(tmp.path() + "/bf16/metrics.jsonl");
    QCOMPARE(b.size(), size_t(30));
    double worst = 0, differs = 0;
    for (const auto& [step, loss] : a) {
      const double rel = std::abs(b.at(step) - loss) / std::abs(loss);
      worst = std::max(worst, rel);
      differs = std::max(differs, std::abs(b.at(step) - loss));
    }
    // bf16 keeps 8 significant bits: each product is off by up to 2^-8 relative, the sums average it out.
    QVERIFY2(worst < 0.01, qPrintable(QString("worst relative loss difference %1").arg(worst)));
    QVERIFY2(differs > 0, "bf16 gave exactly the fp32 losses: the operands were not rounded");
    QVERIFY(b.at(30) < b.at(1) - 0.5);  // it learns as fp32 does
    for (const auto& j : readLines(tmp.path() + "/bf16/metrics.jsonl"))
      if (j["type"] == "run_start") QCOMPARE(j["device"]["gemm_precision"].get<std::string>(), "bf16");

    // bf16 keeps the activations (layer_impl.h KeptInput, KeptTensor) in bf16: the measured activation peak
    // drops by what the plan predicts (model_spec.cpp bf16BytesPerSample, halved), within 1%. Model
    // states (plan/model_state.h): the working parameters are bf16 (half the fp32 bytes), gradients stay
    // fp32, and the optimizer state gains the fp32 master weights (AdamW: 8 -> 12 bytes per element),
    // measured and predicted alike.
    auto figures = [&](const QString& run) {
      std::map<std::string, double> f;
      for (const auto& j : readLines(run + "/metrics.jsonl")) {
        if (j["type"] == "run_start") {
          f["predicted"] = j["predicted"]["ranks"][0]["memory_bytes"]["activations"].get<double>();
          f["predicted parameters"] = j["predicted"]["ranks"][0]["memory_bytes"]["parameters"].get<double>();
        }
        if (j["type"] == "memory")
          for (const char* k : {"activations", "parameters", "gradients", "optimizer"})
            f[k] = std::max(f[k], j["ranks"][0]["peak"][k].get<double>());
      }
      return f;
    };
    const auto f32 = figures(tmp.path() + "/fp32"), f16 = figures(tmp.path() + "/bf16");
    const double measuredDrop = f32.at("activations") - f16.at("activations");
    const double predictedDrop = f32.at("predicted") - f16.at("predicted");
    QVERIFY2(predictedDrop > 0.1 * f32.at("predicted"), qPrintable(QString::number(predictedDrop)));
    QVERIFY2(
        std::abs(measuredDrop - predictedDrop) <= 0.01 * predictedDrop,
        qPrintable(
            QString("activations drop: measured %1, predicted %2").arg(measuredDrop).arg(predictedDrop)));
    QCOMPARE(f16.at("gradients"), f32.at("gradients"));
    QCOMPARE(f16.at("optimizer"), 1.5 * f32.at("optimizer"));
    // The store's flat buffer (parameters padded to 16 floats) in fp32, and the same at 2 bytes.
    QCOMPARE(f16.at("parameters"), 0.5 * f32.at("parameters"));
    QCOMPARE(f16.at("predicted parameters"), 0.5 * f32.at("predicted parameters"));
    // Measured against predicted: the prediction counts parameter elements, the store pads each parameter
    // to 16 floats and each unit to a multiple of 16 * dp, a few percent on a model this small.
    for (const auto* f : {&f32, &f16}) {
      const double measured = f->at("parameters"), predicted = f->at("predicted parameters");
      QVERIFY2(measured >= predicted && measured <= 1.05 * predicted,
               qPrintable(QString("parameters: measured %1, predicted %2").arg(measured).arg(predicted)));
    }
  }

  // bf16 gradients ("grad_precision": "bf16", ZeRO's fp16 gradients): the loss tracks the fp32-gradient
  // bf16 run without being identical (the gradients are really rounded), the gradient buffer is half the
  // bytes (measured and predicted), nothing else changes, and the ZeRO stages on one rank agree bit for bit
  // (the owned gradient shard is the whole reduced buffer, in bf16 too).
  void bf16GradientsTrack() {
    QTemporaryDir tmp;
    RunConfig c = textConfig(tmp.path());
    c.training.steps = 20;
    c.training.evalEvery = 0;
    c.parallel.precision = Precision::Bf16;
    QVERIFY(runTrain(c, tmp.path() + "/fp32grads").isOk());
    c.parallel.gradPrecision = GradPrecision::Bf16;
    QVERIFY(runTrain(c, tmp.path() + "/bf16grads").isOk());
    const auto a = stepLosses(tmp.path() + "/fp32grads/metrics.jsonl");
    const auto b = stepLosses(tmp.path() + "/bf16grads/metrics.jsonl");
    QCOMPARE(b.size(), size_t(20));
    double worst = 0;
    for (const auto& [step, loss] : a) worst = std::max(worst, std::abs(b.at(step) - loss) / std::abs(loss));
    QVERIFY2(worst < 0.01, qPrintable(QString("worst relative loss difference %1").arg(worst)));
    QVERIFY2(worst > 0, "bf16 gradients gave exactly the fp32-gradient losses: nothing was rounded");
    QVERIFY(b.at(20) < b.at(1) - 0.5);
    auto figures = [&](const QString& run) {
      std::map<std::string, double> f;
      for (const auto& j : readLines(run + "/metrics.jsonl")) {
        if (j["type"] == "run_start")
          for (const char* k : {"parameters", "gradients", "optimizer"})
            f[std::string("predicted ") + k] = j["predicted"]["ranks"][0]["memory_bytes"][k].get<double>();
        if (j["type"] == "memory")
          for (const char* k : {"parameters", "gradients", "optimizer"})
            f[k] = std::max(f[k], j["ranks"][0]["peak"][k].get<double>());
      }
      return f;
    };
    const auto f32 = figures(tmp.path() + "/fp32grads"), f16 = figures(tmp.path() + "/bf16grads");
    QCOMPARE(f16.at("gradients"), 0.5 * f32.at("gradients"));
    QCOMPARE(f16.at("predicted gradients"), 0.5 * f32.at("predicted gradients"));
    QCOMPARE(f16.at("parameters"), f32.at("parameters"));
    QCOMPARE(f16.at("optimizer"), f32.at("optimizer"));
    for (int zero : {2, 3}) {
      c.parallel.zero = zero;
      const QString dir = tmp.path() + QString("/zero%1").arg(zero);
      QVERIFY(runTrain(c, dir).isOk());
      const auto z = stepLosses(dir + "/metrics.jsonl");
      for (const auto& [step, loss] : b)
        QVERIFY2(z.at(step) == loss, qPrintable(QString("ZeRO-%1 step %2: %3 vs %4")
                                                    .arg(zero)
                                                    .arg(step)
                                                    .arg(z.at(step), 0, 'g', 17)
                                                    .arg(loss, 0, 'g', 17)));
    }
  }

  // On one rank the ZeRO stages keep the same numbers in different places (mixed precision: the whole
  // master, its only owned slice, a bf16 shard of the working parameters gathered per use), so every loss
  // must be bit-identical across them. A working copy not refreshed after a step, or gathered stale, would
  // show at once.
  void bf16ZeroStagesAgreeOnOneRank() {
    QTemporaryDir tmp;
    RunConfig c = textConfig(tmp.path());
    c.training.steps = 8;
    c.training.evalEvery = 0;
    c.parallel.precision = Precision::Bf16;
    QVERIFY(runTrain(c, tmp.path() + "/zero0").isOk());
    const auto a = stepLosses(tmp.path() + "/zero0/metrics.jsonl");
    QCOMPARE(a.size(), size_t(8));
    for (int zero : {1, 3}) {
      c.parallel.zero = zero;
      const QString dir = tmp.path() + QString("/zero%1").arg(zero);
      QVERIFY(runTrain(c, dir).isOk());
      const auto b = stepLosses(dir + "/metrics.jsonl");
      for (const auto& [step, loss] : a)
        QVERIFY2(b.at(step) == loss, qPrintable(QString("ZeRO-%1, step %2: %3 vs %4")
                                                    .arg(zero)
                                                    .arg(step)
                                                    .arg(loss, 0, 'g', 17)
                                                    .arg(b.at(step), 0, 'g', 17)));
    }
  }

  void learningRateSchedule() {
    RunConfig c;
    c.optimizer.lr = 1.0;
    c.training.steps = 12;  // step 0 warms up, steps 1..11 decay from the peak to the floor
    c.training.warmupSteps = 1;
    c.training.minLrRatio = 0.1;
    QCOMPARE(learningRate(c, 0), 1.0);
    QVERIFY(std::abs(learningRate(c, 1) - 1.0) < 1e-12);
    QVERIFY(std::abs(learningRate(c, 11) - 0.1) < 1e-12);
    QVERIFY(std::abs(learningRate(c, 6) - 0.55) < 1e-12);  // half way: the mean of peak and floor
    c.training.lrSchedule = LrSchedule::Linear;
    QVERIFY(std::abs(learningRate(c, 3) - (1.0 - 0.9 * 0.2)) < 1e-12);
    QCOMPARE(clipFactor(10.0, 1.0), static_cast<float>(1.0 / (10.0 + 1e-6)));
    QCOMPARE(clipFactor(0.5, 1.0), 1.0f);
    QCOMPARE(clipFactor(10.0, 0.0), 1.0f);
  }

  // A real dataset end to end: an MLP learns Fashion-MNIST well past chance in 150 small steps.
  void fashionMnistMlp() {
    if (!QFile::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
      QSKIP("dataset-fashion-mnist is not installed");
    QTemporaryDir tmp;
    RunConfig c;
    c.name = "mlp";
    c.model.type = ModelType::Mlp;
    c.model.hidden = {64};
    c.model.classes = 10;
    c.data.kind = DataKind::FashionMnist;
    c.optimizer.type = OptimizerType::Sgd;
    c.optimizer.lr = 0.05;
    c.training.steps = 150;
    c.training.batchSize = 64;
    c.training.evalBatches = 16;
    c.training.threads = 1;
    QVERIFY(runTrain(c, tmp.path() + "/run").isOk());
    double accuracy = 0;
    for (const auto& j : readLines(tmp.path() + "/run/metrics.jsonl"))
      if (j["type"] == "eval") accuracy = j["accuracy"].get<double>();
    QVERIFY2(accuracy > 0.70, qPrintable(QString::number(accuracy)));
  }
};

QTEST_APPLESS_MAIN(TestTraining)
#include "tst_training.moc"
