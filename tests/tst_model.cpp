// Whole-model gradient checks: for every model type and variant, the analytic gradient of the loss along a
// random direction u matches the central finite difference (L(p + eps u) - L(p - eps u)) / (2 eps); and
// microbatching (gradient accumulation) gives the same gradient as one big batch.
#include <QtTest>

#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "runtime/checkpoint.h"
#include "runtime/model.h"
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
