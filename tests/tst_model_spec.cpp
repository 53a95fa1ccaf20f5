// The model spec: parameter counts against published figures, Hugging Face names and layouts, layer names,
// FLOPs and activation bytes per sample.
#include <QtTest>

#include "plan/model_spec.h"

using namespace ms;

class TestModelSpec : public QObject {
  Q_OBJECT
 private slots:
  // GPT-2 small (Radford et al. 2019): 12 layers, width 768, 12 heads, context 1024, vocab 50257, tied head:
  // 124,439,808 parameters, the count of the Hugging Face "gpt2" checkpoint.
  void gpt2SmallParameterCount() {
    ModelConfig m;
    m.layers = 12;
    m.width = 768;
    m.heads = 12;
    m.context = 1024;
    m.vocab = 50257;
    const ModelSpec spec = buildModelSpec(m, 1024);
    QCOMPARE(spec.paramCount(), int64_t(124439808));
    QCOMPARE(static_cast<int>(spec.layers.size()), 14);
    QCOMPARE(spec.layers.front().name, std::string("embedding"));
    QCOMPARE(spec.layers[5].name, std::string("block.4"));
    QCOMPARE(spec.layers.back().name, std::string("head"));
    // Hugging Face layout: c_attn.weight is (C, 3C) Conv1D.
    const ParamSpec& qkv = spec.layers[1].params[2];
    QCOMPARE(qkv.name, std::string("h.0.attn.c_attn.weight"));
    QCOMPARE(qkv.shape, (std::vector<int64_t>{768, 2304}));
    QVERIFY(qkv.decay);
    QVERIFY(!spec.layers[1].params[0].decay);  // ln_1.weight
    // Untied adds the (V, C) LM head.
    m.tieEmbeddings = false;
    QCOMPARE(buildModelSpec(m, 1024).paramCount(), int64_t(124439808) + int64_t(50257) * 768);
  }

  // Forward FLOPs of a block: 2 * 12 C^2 per position for the GEMMs (Kaplan et al. 2020, table 1: 2N per token
  // with N = 12 C^2 per layer) plus attention's 2 * 2 * T * C per position, halved when causal.
  void blockFlops() {
    ModelConfig m;
    m.width = 64;
    m.heads = 4;
    const int T = 32;
    const ModelSpec spec = buildModelSpec(m, T);
    const double gemm = 2.0 * T * 12 * 64 * 64;
    const double attn = 2.0 * 2.0 * T * T * 64 * 0.5;
    QCOMPARE(spec.layers[1].forwardFlopsPerSample, gemm + attn);
    m.type = ModelType::Vit;
    const ModelSpec vit = buildModelSpec(m, T);
    QCOMPARE(vit.samplePositions, 17);  // 16 patches of 7x7 + class token
    QCOMPARE(vit.layers[1].forwardFlopsPerSample, 2.0 * 17 * 12 * 64 * 64 + 2.0 * 2.0 * 17 * 17 * 64);
  }

  void vitAndMlpLayers() {
    ModelConfig m;
    m.type = ModelType::Vit;
    m.layers = 2;
    m.width = 32;
    m.pool = Pooling::Mean;
    const ModelSpec vit = buildModelSpec(m, 0);
    QCOMPARE(vit.samplePositions, 16);
    QCOMPARE(vit.layerNames(), modelLayerNames(m));
    QVERIFY(vit.layers[0].params.size() == 3);  // no class token with mean pooling
    m.type = ModelType::Mlp;
    m.hidden = {100, 50};
    const ModelSpec mlp = buildModelSpec(m, 0, 784);
    QCOMPARE(mlp.layerNames(), (std::vector<std::string>{"block.0", "block.1", "head"}));
    QCOMPARE(mlp.paramCount(), int64_t(784 * 100 + 100 + 100 * 50 + 50 + 50 * 10 + 10));
    QCOMPARE(mlp.layerIndex("head"), 2);
    QCOMPARE(mlp.layerIndex("embedding"), -1);
  }
};

QTEST_APPLESS_MAIN(TestModelSpec)
#include "tst_model_spec.moc"
