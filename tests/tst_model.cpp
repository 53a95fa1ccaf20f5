// Whole-model gradient checks: for every model type and variant, the analytic gradient of the loss along a
// random direction u matches the central finite difference (L(p + eps u) - L(p - eps u)) / (2 eps); and
// microbatching (gradient accumulation) gives the same gradient as one big batch.
#include <QtTest>

#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "runtime/checkpoint.h"
#include "runtime/model.h"
#include "runtime/optimizer.h"
#include "runtime/random.h"
#include "runtime/safetensors.h"

using namespace ms;

namespace {

RunConfig tinyConfig(const QString& variant) {
  RunConfig c;
  c.seed = 7;
  c.model.layers = 2;
  c.model.width = 16;
  c.model.heads = 2;
  c.model.initStd = 0.2;  // larger weights make a gradient error visible
  if (variant.startsWith("gpt")) {
    c.model.type = ModelType::Gpt;
    c.model.vocab = 11;
    c.model.context = 8;
    c.model.tieEmbeddings = variant != "gpt-untied";
    c.training.seqLen = 6;
  } else if (variant.startsWith("vit")) {
    c.model.type = ModelType::Vit;
    c.model.imageSize = 8;
    c.model.patch = 4;
    c.model.classes = 5;
    c.model.pool = variant == "vit-mean" ? Pooling::Mean : Pooling::Cls;
  } else {
    c.model.type = ModelType::Mlp;
    c.model.hidden = {12, 9};
    c.model.classes = 5;
    c.model.activation = variant == "mlp-gelu"   ? Activation::Gelu
                         : variant == "mlp-tanh" ? Activation::Tanh
                                                 : Activation::Relu;
  }
  return c;
}

Batch tinyBatch(const RunConfig& c, int B, int inputs, uint64_t seed) {
  SplitMix64 rng(seed);
  Batch b;
  b.B = B;
  if (c.model.type == ModelType::Gpt) {
    b.T = c.training.seqLen;
    for (int i = 0; i < B * b.T; ++i) {
      b.tokens.push_back(static_cast<int32_t>(rng.below(c.model.vocab)));
      b.targets.push_back(static_cast<int32_t>(rng.below(c.model.vocab)));
    }
  } else {
    b.T = 1;
    for (int i = 0; i < B * inputs; ++i)
      b.images.push_back(static_cast<float>(uniform01(rng.next()) * 2 - 1));
    for (int i = 0; i < B; ++i) b.targets.push_back(static_cast<int32_t>(rng.below(c.model.classes)));
  }
  return b;
}

int inputsOf(const RunConfig& c) {
  return c.model.type == ModelType::Vit ? c.model.imageSize * c.model.imageSize : 20;
}

double lossOf(Model& m, const Batch& b) {
  const LossStats s = m.forward(b);
  return s.lossSum / double(s.count);
}

int64_t targetsOf(const Batch& b) {
  return static_cast<int64_t>(b.targets.size());
}

}  // namespace

class TestModel : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() { cpu::setThreads(1); }

  void directionalDerivative_data() {
    QTest::addColumn<QString>("variant");
    for (const char* v :
         {"gpt-tied", "gpt-untied", "vit-cls", "vit-mean", "mlp-relu", "mlp-gelu", "mlp-tanh"})
      QTest::newRow(v) << QString(v);
  }
  void directionalDerivative() {
    QFETCH(QString, variant);
    const RunConfig c = tinyConfig(variant);
    Model m(c, nullptr, 20);
    const Batch b = tinyBatch(c, 3, inputsOf(c), 11);
    ParameterStore& p = m.params();
    p.zeroGrads();
    m.forwardBackward(b, 1.0f / static_cast<float>(targetsOf(b)));
    // A random unit direction over all parameters (padding entries stay 0).
    std::vector<double> u(p.size(), 0.0);
    double norm = 0;
    for (const Parameter& prm : p.params())
      for (size_t i = 0; i < prm.numel; ++i) {
        u[prm.offset + i] = normalAt(99, prm.offset + i);
        norm += u[prm.offset + i] * u[prm.offset + i];
      }
    double analytic = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      u[i] /= std::sqrt(norm);
      analytic += u[i] * p.grads()[i];
    }
    const std::vector<float> saved(p.values(), p.values() + p.size());
    const double eps = 1e-2;
    for (size_t i = 0; i < p.size(); ++i) p.values()[i] = static_cast<float>(saved[i] + eps * u[i]);
    const double plus = lossOf(m, b);
    for (size_t i = 0; i < p.size(); ++i) p.values()[i] = static_cast<float>(saved[i] - eps * u[i]);
    const double minus = lossOf(m, b);
    const double numeric = (plus - minus) / (2 * eps);
    QVERIFY2(std::abs(analytic) > 1e-3, "direction too weak to test");
    QVERIFY2(std::abs(analytic - numeric) <= 2e-3 + 2e-2 * std::abs(numeric),
             qPrintable(QString("analytic %1 numeric %2").arg(analytic, 0, 'g', 8).arg(numeric, 0, 'g', 8)));
  }

  // Two microbatches of 2 with loss scale 1/total give the gradient of one batch of 4.
  void microbatchesAccumulate_data() { directionalDerivative_data(); }
  void microbatchesAccumulate() {
    QFETCH(QString, variant);
    const RunConfig c = tinyConfig(variant);
    Model m(c, nullptr, 20);
    const Batch whole = tinyBatch(c, 4, inputsOf(c), 5);
    const int per = static_cast<int>(whole.targets.size()) / 4;
    auto half = [&](int first) {
      Batch h;
      h.B = 2;
      h.T = whole.T;
      const int inputs = inputsOf(c);
      if (!whole.tokens.empty())
        h.tokens.assign(whole.tokens.begin() + first * per, whole.tokens.begin() + (first + 2) * per);
      if (!whole.images.empty())
        h.images.assign(whole.images.begin() + first * inputs, whole.images.begin() + (first + 2) * inputs);
      h.targets.assign(whole.targets.begin() + first * per, whole.targets.begin() + (first + 2) * per);
      return h;
    };
    ParameterStore& p = m.params();
    const float scale = 1.0f / static_cast<float>(whole.targets.size());
    p.zeroGrads();
    const LossStats a = m.forwardBackward(whole, scale);
    const std::vector<float> g1(p.grads(), p.grads() + p.size());
    p.zeroGrads();
    LossStats b = m.forwardBackward(half(0), scale, 0);
    b += m.forwardBackward(half(2), scale, 1);
    QVERIFY(std::abs(a.lossSum - b.lossSum) <= 1e-5 * std::abs(a.lossSum));
    for (size_t i = 0; i < p.size(); ++i)
      QVERIFY2(std::abs(g1[i] - p.grads()[i]) <= 1e-6f + 1e-4f * std::abs(g1[i]),
               qPrintable(QString::number(i)));
  }

  // The initial loss of a classifier with small weights is about log(classes); of a gpt, about log(vocab).
  void initialLossNearUniform() {
    RunConfig c = tinyConfig("gpt-tied");
    c.model.initStd = 0.02;
    Model m(c, nullptr);
    const Batch b = tinyBatch(c, 2, 0, 3);
    QVERIFY(std::abs(lossOf(m, b) - std::log(11.0)) < 0.05);
  }

  // Initialisation depends only on (seed, name): the same seed gives the same parameters, another seed not.
  void initialisationIsKeyedBySeed() {
    RunConfig c = tinyConfig("gpt-tied");
    Model a(c, nullptr), b(c, nullptr);
    c.seed = 8;
    Model d(c, nullptr);
    const float* wa = a.params().value("h.0.attn.c_attn.weight");
    QCOMPARE(std::memcmp(wa, b.params().value("h.0.attn.c_attn.weight"), 16 * 48 * sizeof(float)), 0);
    QVERIFY(std::memcmp(wa, d.params().value("h.0.attn.c_attn.weight"), 16 * 48 * sizeof(float)) != 0);
    // GPT-2's scaled init of residual projections: std 0.2 / sqrt(2 * layers) = 0.1.
    const float* proj = a.params().value("h.1.mlp.c_proj.weight");
    double sq = 0;
    for (int i = 0; i < 64 * 16; ++i) sq += double(proj[i]) * proj[i];
    QVERIFY(std::abs(std::sqrt(sq / (64 * 16)) - 0.1) < 0.01);
  }

  // Activation recomputation re-runs the same ops on the same inputs (plan/recompute.h): selective (every
  // block's attention matrix dropped after forward and re-made before its backward, Korthikanti et al.
  // 2022, section 5), full and full for the first block only ("recompute_layers": 1) give bit for bit the
  // losses and gradients of a model that keeps everything, over steps with changing weights, in fp32 and in
  // bf16 GEMM precision; and they keep less (the tracker's peak activations).
  void recomputeIsBitIdentical_data() {
    QTest::addColumn<QString>("variant");
    QTest::addColumn<QString>("recompute");
    QTest::addColumn<int>("layers");
    QTest::addColumn<bool>("bf16");
    for (const char* v : {"gpt-tied", "vit-cls"})
      for (bool bf16 : {false, true}) {
        const QString tag = QString("%1%2 ").arg(v, bf16 ? " bf16" : "");
        QTest::newRow(qPrintable(tag + "selective")) << QString(v) << "selective" << 0 << bf16;
        QTest::newRow(qPrintable(tag + "full")) << QString(v) << "full" << 0 << bf16;
        QTest::newRow(qPrintable(tag + "full 1 block")) << QString(v) << "full" << 1 << bf16;
      }
  }
  void recomputeIsBitIdentical() {
    QFETCH(QString, variant);
    QFETCH(QString, recompute);
    QFETCH(int, layers);
    QFETCH(bool, bf16);
    RunConfig keep = tinyConfig(variant);
    keep.model.layers = 3;
    RunConfig again = keep;
    again.parallel.recompute = recompute == "selective" ? Recompute::Selective : Recompute::Full;
    again.parallel.recomputeLayers = layers;
    auto beA = makeCpuBackend(), beB = makeCpuBackend();
    for (Backend* be : {beA.get(), beB.get()})
      be->setGemmPrecision(bf16 ? GemmPrecision::Bf16 : GemmPrecision::Fp32);
    MemoryTracker ta(beA.get()), tb(beB.get());
    Model a(keep, &ta, 20), b(again, &tb, 20);
    ParameterStore& pa = a.params();
    ParameterStore& pb = b.params();
    std::vector<float> values;
    for (int step = 0; step < 3; ++step) {
      // Both models take the same (changing) weights: a's, moved a little each step.
      for (size_t u = 0; u < pa.units().size(); ++u) {
        QVERIFY(pa.unitValues(static_cast<int>(u), values).isOk());
        for (size_t i = 0; i < values.size(); ++i) values[i] += 0.01f * static_cast<float>(normalAt(step, i));
        pa.setUnitValues(static_cast<int>(u), values.data());
        pb.setUnitValues(static_cast<int>(u), values.data());
      }
      const Batch batch = tinyBatch(keep, 3, inputsOf(keep), 40 + step);
      const float scale = 1.0f / static_cast<float>(targetsOf(batch));
      pa.zeroGrads();
      pb.zeroGrads();
      const LossStats la = a.forwardBackward(batch, scale), lb = b.forwardBackward(batch, scale);
      QVERIFY2(la.lossSum == lb.lossSum, qPrintable(QString("step %1: loss sum %2 kept, %3 recomputed")
                                                        .arg(step)
                                                        .arg(la.lossSum, 0, 'g', 17)
                                                        .arg(lb.lossSum, 0, 'g', 17)));
      QVERIFY(pa.finishSync().isOk() && pb.finishSync().isOk());
      const std::vector<float> ga(pa.grads(), pa.grads() + pa.size()), gb(pb.grads(), pb.grads() + pb.size());
      QVERIFY2(ga == gb, qPrintable(QString("step %1: gradients differ").arg(step)));
    }
    // One microbatch in flight: recomputing one block of three saves its activations and then holds them
    // again while it is re-run, so only the peak's bound holds there.
    const int64_t kept = ta.peak(MemoryCategory::Activations),
                  recomputed = tb.peak(MemoryCategory::Activations);
    QVERIFY2(layers == 1 ? recomputed <= kept : recomputed < kept,
             qPrintable(QString("peak activations %1 recomputed, %2 kept").arg(recomputed).arg(kept)));
  }

  // Mixed precision's model states (parameters.h, plan/model_state.h), on the emulated device (host access to
  // backend memory faults, so every check goes through download as on a GPU):
  // - a store built in Bf16 keeps bf16 working parameters (2 bytes per element, Parameters) and fp32 master
  //   weights (4, Optimizer); one built in Fp32 keeps fp32 values only;
  // - initialised alike, the master equals the fp32 store's values and the working parameters are their
  //   toBf16;
  // - every op reads the working parameters (GEMM weights, biases, LayerNorm weights, embedding tables,
  //   positions): a forward-backward gives bit for bit the losses and gradients of the fp32 store holding
  //   the same bf16-rounded values in the same GEMM precision;
  // - after every optimizer step (finishUpdate) and a checkpoint load (setUnitValues) the working parameters
  //   are toBf16 of the master.
  void mixedPrecisionStore_data() {
    QTest::addColumn<QString>("variant");
    for (const char* v : {"gpt-tied", "gpt-untied", "vit-cls", "mlp-gelu"}) QTest::newRow(v) << QString(v);
  }
  void mixedPrecisionStore() {
    QFETCH(QString, variant);
    const RunConfig c = tinyConfig(variant);
    auto mixedBe = makeCpuBackend(true), fp32Be = makeCpuBackend(true);
    mixedBe->setGemmPrecision(GemmPrecision::Bf16);
    MemoryTracker mixedTracker(mixedBe.get()), fp32Tracker(fp32Be.get());
    Model a(c, &mixedTracker, 20), b(c, &fp32Tracker, 20);
    fp32Be->setGemmPrecision(GemmPrecision::Bf16);  // after construction: b keeps fp32 values
    ParameterStore& pa = a.params();
    ParameterStore& pb = b.params();
    QVERIFY(pa.mixed() && !pb.mixed());
    QVERIFY(!pa.values() && pb.values());
    const int64_t n = static_cast<int64_t>(pa.size());
    QCOMPARE(mixedTracker.current(MemoryCategory::Parameters), 2 * n);
    QCOMPARE(mixedTracker.current(MemoryCategory::Optimizer), 4 * n);
    QCOMPARE(fp32Tracker.current(MemoryCategory::Parameters), 4 * n);
    QCOMPARE(fp32Tracker.current(MemoryCategory::Optimizer), int64_t(0));

    // Every unit's master (unitValues) against the working parameters (weight()), element by element.
    auto workingMatchesMaster = [&]() -> QString {
      std::vector<float> master;
      for (size_t u = 0; u < pa.units().size(); ++u) {
        const Unit& U = pa.units()[u];
        if (!pa.unitValues(static_cast<int>(u), master).isOk()) return "unitValues failed";
        for (int pi : U.params) {
          const Parameter& p = pa.params()[pi];
          const TensorIn w = pa.weight(pi);
          if (!w.bf16) return QString("%1 is not bf16").arg(QString::fromStdString(p.spec.name));
          std::vector<uint16_t> work(p.numel);
          mixedBe->download(work.data(), w.data, p.numel * sizeof(uint16_t));
          for (size_t i = 0; i < p.numel; ++i) {
            const float m = master[p.offset - U.begin + i];
            if (work[i] != floatToBf16(m))
              return QString("%1[%2]: working 0x%3, toBf16(%4) = 0x%5")
                  .arg(QString::fromStdString(p.spec.name))
                  .arg(i)
                  .arg(work[i], 0, 16)
                  .arg(m)
                  .arg(floatToBf16(m), 0, 16);
          }
        }
      }
      return {};
    };
    // Initialised alike: the master is the fp32 store's values.
    std::vector<float> ua, ub;
    for (size_t u = 0; u < pa.units().size(); ++u) {
      QVERIFY(pa.unitValues(static_cast<int>(u), ua).isOk() && pb.unitValues(static_cast<int>(u), ub).isOk());
      QVERIFY(ua == ub);
    }
    QVERIFY2(workingMatchesMaster().isEmpty(), qPrintable("after initialize: " + workingMatchesMaster()));

    OptimizerConfig oc;
    oc.lr = 0.05;  // large steps: every weight's bf16 rounding changes between steps
    oc.weightDecay = 0.1;
    Optimizer oa(oc, pa, &mixedTracker);
    std::vector<float> unit, gradsA(pa.size()), gradsB(pb.size());
    for (int step = 0; step < 4; ++step) {
      // The fp32 store takes the rounded master values: then every op must read the same numbers.
      for (size_t u = 0; u < pa.units().size(); ++u) {
        QVERIFY(pa.unitValues(static_cast<int>(u), unit).isOk());
        for (float& x : unit) x = bf16ToFloat(floatToBf16(x));
        pb.setUnitValues(static_cast<int>(u), unit.data());
      }
      const Batch batch = tinyBatch(c, 3, inputsOf(c), 100 + step);
      const float scale = 1.0f / static_cast<float>(targetsOf(batch));
      pa.zeroGrads();
      pb.zeroGrads();
      const LossStats la = a.forwardBackward(batch, scale), lb = b.forwardBackward(batch, scale);
      QVERIFY2(la.lossSum == lb.lossSum, qPrintable(QString("step %1: loss sum %2 mixed, %3 fp32 rounded")
                                                        .arg(step)
                                                        .arg(la.lossSum, 0, 'g', 17)
                                                        .arg(lb.lossSum, 0, 'g', 17)));
      QVERIFY(pa.finishSync().isOk() && pb.finishSync().isOk());
      mixedBe->download(gradsA.data(), pa.grads(), gradsA.size() * sizeof(float));
      fp32Be->download(gradsB.data(), pb.grads(), gradsB.size() * sizeof(float));
      QVERIFY2(gradsA == gradsB, qPrintable(QString("step %1: gradients differ").arg(step)));
      oa.step(static_cast<float>(oc.lr), 1.0f);
      QVERIFY(pa.finishUpdate().isOk());
      const QString why = workingMatchesMaster();
      QVERIFY2(why.isEmpty(), qPrintable(QString("after optimizer step %1: ").arg(step) + why));
    }

    // setUnitValues (checkpoint load): master and working parameters of unit 0.
    const Unit& first = pa.units().front();
    std::vector<float> values(first.size);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(normalAt(5, i));
    pa.setUnitValues(0, values.data());
    QVERIFY(pa.unitValues(0, unit).isOk());
    QVERIFY(unit == values);
    QVERIFY2(workingMatchesMaster().isEmpty(), qPrintable("after setUnitValues: " + workingMatchesMaster()));
  }

  // ZeRO-3 in mixed precision keeps a bf16 shard of the working parameters (2 bytes per element / dp) and
  // gathers a unit's bf16 working parameters whole for its use (2 bytes per element until release()).
  void mixedPrecisionZero3GathersBf16() {
    const RunConfig c = tinyConfig("gpt-tied");
    auto be = makeCpuBackend(true);
    be->setGemmPrecision(GemmPrecision::Bf16);
    MemoryTracker tracker(be.get());
    const ModelSpec spec = buildModelSpec(c.model, c.training.seqLen, 20);
    std::vector<int> all(spec.layers.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    StoreLayout layout;
    layout.layers = all;
    layout.holdsEmbedding = true;
    layout.zero = 3;
    ParameterStore store(spec, c.model.type, c.model.tieEmbeddings, layout, nullptr, &tracker);
    store.initialize(7);
    QVERIFY(store.mixed());
    const int64_t n = static_cast<int64_t>(store.size());
    QCOMPARE(tracker.current(MemoryCategory::Parameters), 2 * n);
    QCOMPARE(tracker.current(MemoryCategory::Optimizer), 4 * n);
    QVERIFY(!store.weight(0).data);  // not gathered
    QVERIFY(store.gather(0).isOk());
    const TensorIn op = store.weight(0);
    QVERIFY(op.bf16 && op.data);
    // The gathered layer is a communication buffer (the memory model's zero3Gathered); the shard stays.
    QCOMPARE(tracker.current(MemoryCategory::Parameters), 2 * n);
    QCOMPARE(tracker.current(MemoryCategory::Communication), 2 * static_cast<int64_t>(store.units()[0].size));
    std::vector<float> master;
    QVERIFY(store.unitValues(0, master).isOk());
    const Parameter& p = store.params()[0];
    std::vector<uint16_t> work(p.numel);
    be->download(work.data(), op.data, p.numel * sizeof(uint16_t));
    for (size_t i = 0; i < p.numel; ++i) QCOMPARE(work[i], floatToBf16(master[p.offset + i]));
    // The next unit's prefetch: both are held (the memory model's two neighbours), and gather() hands the
    // same bf16 values a blocking gather gives.
    QVERIFY(store.prefetch(1).isOk());
    QVERIFY(store.prefetch(1).isOk());  // once
    const int64_t both = 2 * static_cast<int64_t>(store.units()[0].size + store.units()[1].size);
    QCOMPARE(tracker.current(MemoryCategory::Communication), both);
    QVERIFY(store.gather(1).isOk());
    QCOMPARE(tracker.current(MemoryCategory::Communication), both);
    const Parameter& p1 = store.params()[store.units()[1].params.front()];
    std::vector<uint16_t> prefetched(p1.numel);
    be->download(prefetched.data(), store.weight(store.units()[1].params.front()).data,
                 p1.numel * sizeof(uint16_t));
    QVERIFY(store.unitValues(1, master).isOk());
    for (size_t i = 0; i < p1.numel; ++i)
      QCOMPARE(prefetched[i], floatToBf16(master[p1.offset - store.units()[1].begin + i]));
    store.release(0);
    store.release(1);
    QCOMPARE(tracker.current(MemoryCategory::Communication), int64_t(0));
    QCOMPARE(tracker.current(MemoryCategory::Parameters), 2 * n);
  }

  // A file laid out like a Hugging Face GPT-2 checkpoint loads: "transformer." prefixes, the attention mask
  // buffers and a tied lm_head.weight are accepted; c_attn is (C, 3C) Conv1D layout. Missing tensors and
  // wrong shapes are refused by name.
  void loadsHuggingFaceLayout() {
    RunConfig c = tinyConfig("gpt-tied");
    Model source(c, nullptr);
    c.seed = 123;
    Model target(c, nullptr);
    QTemporaryDir tmp;
    std::vector<NamedTensor> tensors;
    std::vector<std::string> names;
    for (const Parameter& p : source.params().params()) names.push_back("transformer." + p.spec.name);
    for (size_t i = 0; i < names.size(); ++i) {
      const Parameter& p = source.params().params()[i];
      tensors.push_back({names[i], p.spec.shape, DType::F32, source.params().values() + p.offset});
    }
    QCOMPARE(source.params().find("h.0.attn.c_attn.weight")->spec.shape, (std::vector<int64_t>{16, 48}));
    std::vector<float> mask(8 * 8, 1.0f);
    tensors.push_back({"transformer.h.0.attn.bias", {1, 1, 8, 8}, DType::F32, mask.data()});
    tensors.push_back({"lm_head.weight", {11, 16}, DType::F32, source.params().value("wte.weight")});
    const std::string file = (tmp.path() + "/model.safetensors").toStdString();
    QVERIFY(writeSafetensors(file, tensors).isOk());
    QVERIFY2(loadWeights(file, target.params()).isOk(), "HF layout refused");
    QCOMPARE(std::memcmp(source.params().values(), target.params().values(), source.params().size() * 4), 0);

    RunConfig wider = tinyConfig("gpt-tied");
    wider.model.width = 32;
    Model other(wider, nullptr);
    Status shape = loadWeights(file, other.params());
    QVERIFY(!shape.isOk());
    QVERIFY2(QString::fromStdString(shape.message()).contains("has shape"), shape.message().c_str());

    tensors.erase(tensors.begin() + 3);  // drop one parameter
    QVERIFY(writeSafetensors(file, tensors).isOk());
    Status missing = loadWeights(file, target.params());
    QVERIFY(!missing.isOk());
    QVERIFY2(missing.message().find("no tensor \"" + names[3].substr(12) + "\"") != std::string::npos,
             missing.message().c_str());
  }
};

QTEST_APPLESS_MAIN(TestModel)
#include "tst_model.moc"
