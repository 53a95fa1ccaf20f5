// Hugging Face config.json import (plan/hf_import.h): published configs (tests/data/hf, as the checkpoints on
// the Hugging Face Hub ship them) give the published parameter counts, approximations are said, and what
// cannot map is an error naming the file, the field and the reason.
#include <QtTest>

#include <fstream>

#include "plan/hf_import.h"
#include "plan/model_spec.h"

using namespace ms;
using nlohmann::json;

namespace {

json readHf(const char* name) {
  std::ifstream in(std::string(MS_SOURCE_DIR "/tests/data/hf/") + name);
  return json::parse(in);
}

bool mentions(const std::vector<std::string>& warnings, const std::string& what) {
  for (const std::string& w : warnings)
    if (w.find(what) != std::string::npos) return true;
  return false;
}

}  // namespace

class TestHfImport : public QObject {
  Q_OBJECT
 private slots:
  // Meta-Llama-3-8B: 8,030,261,248 parameters; Mistral-7B-v0.1: 7,241,732,096; gpt2: 124,439,808.
  void publishedCounts_data() {
    QTest::addColumn<QString>("file");
    QTest::addColumn<qint64>("params");
    QTest::addColumn<int>("type");
    QTest::newRow("llama3-8b") << "llama3-8b.json" << qint64(8030261248) << int(ModelType::Llama);
    QTest::newRow("mistral-7b") << "mistral-7b.json" << qint64(7241732096) << int(ModelType::Llama);
    QTest::newRow("gpt2") << "gpt2.json" << qint64(124439808) << int(ModelType::Gpt);
    // Mixtral-8x7B-v0.1: 46,702,792,704 (8 experts a block, 2 a token).
    QTest::newRow("mixtral-8x7b") << "mixtral-8x7b.json" << qint64(46702792704) << int(ModelType::Llama);
  }
  void publishedCounts() {
    QFETCH(QString, file);
    QFETCH(qint64, params);
    QFETCH(int, type);
    auto imported = importHfConfig(readHf(qPrintable(file)), file.toStdString());
    QVERIFY2(imported.isOk(), imported.message().c_str());
    QVERIFY(int(imported->model.type) == type);
    QCOMPARE(buildModelSpec(imported->model, 1024).paramCount(), int64_t(params));
  }

  void llamaFields() {
    auto imported = importHfConfig(readHf("llama3-8b.json"), "llama3-8b.json");
    QVERIFY(imported.isOk());
    const ModelConfig& m = imported->model;
    QCOMPARE(m.layers, 32);
    QCOMPARE(m.kvHeads, 8);
    QCOMPARE(m.ffnHidden, 14336);
    QCOMPARE(m.ropeTheta, 500000.0);
    QCOMPARE(m.layerNormEps, 1e-5);
    QCOMPARE(m.context, 8192);
    QVERIFY(!m.tieEmbeddings);
    QVERIFY(imported->warnings.empty());
  }

  // Qwen2 has q/k/v biases and a (disabled) sliding window; Mistral's window is on: said, not silently lost.
  void approximationsAreSaid() {
    auto qwen = importHfConfig(readHf("qwen2-7b.json"), "qwen2-7b.json");
    QVERIFY(qwen.isOk());
    QCOMPARE(qwen->model.kvHeads, 4);
    QCOMPARE(qwen->model.width / qwen->model.heads, 128);
    QVERIFY(mentions(qwen->warnings, "biases are not modelled (4608 parameters a layer)"));
    QVERIFY(!mentions(qwen->warnings, "sliding_window"));
    auto mistral = importHfConfig(readHf("mistral-7b.json"), "mistral-7b.json");
    QVERIFY(mistral.isOk());
    QVERIFY(mentions(mistral->warnings, "sliding_window 4096"));
  }

  void errorsNameTheField_data() {
    QTest::addColumn<QString>("change");  // a JSON object merged into the Llama 3 8B config
    QTest::addColumn<QString>("expected");
    QTest::newRow("moe") << R"({"model_type": "deepseek_v3", "n_routed_experts": 256})"
                         << "cfg.json: /model_type: \"deepseek_v3\" is a mixture-of-experts model";
    QTest::newRow("mixtral top-k")
        << R"({"model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 3})"
        << "cfg.json: /num_experts_per_tok: exceeds num_local_experts (2)";
    QTest::newRow("unknown type") << R"({"model_type": "bert"})"
                                  << "cfg.json: /model_type: \"bert\" is not one MeshStudio imports";
    QTest::newRow("missing layers") << R"({"num_hidden_layers": null})"
                                    << "cfg.json: /num_hidden_layers: is missing";
    QTest::newRow("bad heads") << R"({"num_attention_heads": "32"})"
                               << "cfg.json: /num_attention_heads: must be an integer";
    QTest::newRow("kv heads") << R"({"num_key_value_heads": 5})"
                              << "cfg.json: /num_key_value_heads: 5 does not divide num_attention_heads (32)";
    QTest::newRow("head_dim") << R"({"head_dim": 64})"
                              << "cfg.json: /head_dim: a head size of 64 differs";
    QTest::newRow("activation") << R"({"hidden_act": "gelu"})"
                                << "cfg.json: /hidden_act: the llama MLP is SwiGLU";
    QTest::newRow("theta") << R"({"rope_theta": -1})"
                           << "cfg.json: /rope_theta: must be a positive number";
  }
  void errorsNameTheField() {
    QFETCH(QString, change);
    QFETCH(QString, expected);
    json hf = readHf("llama3-8b.json");
    hf.merge_patch(json::parse(change.toStdString()));
    // merge_patch removes null members: "missing" then means absent.
    auto imported = importHfConfig(hf, "cfg.json");
    QVERIFY(!imported.isOk());
    QVERIFY2(imported.message().find(expected.toStdString()) == 0, imported.message().c_str());
  }

  void mixtralFields() {
    auto imported = importHfConfig(readHf("mixtral-8x7b.json"), "mixtral-8x7b.json");
    QVERIFY2(imported.isOk(), imported.message().c_str());
    QCOMPARE(imported->model.experts, 8);
    QCOMPARE(imported->model.expertsPerToken, 2);
    QCOMPARE(imported->model.auxLossCoef, 0.02);
    QCOMPARE(imported->model.expertHidden(), int64_t(14336));
    QVERIFY(mentions(imported->warnings, "checkpoint names"));
  }

  // A GPT-2 whose MLP is not a multiple of the width cannot be a gpt (mlp_ratio is an integer).
  void gpt2InnerWidth() {
    json hf = readHf("gpt2.json");
    hf["n_inner"] = 1000;
    auto imported = importHfConfig(hf, "g.json");
    QVERIFY(!imported.isOk());
    QVERIFY(imported.message().find(
                "g.json: /n_inner: the MLP width 1000 is not a multiple of n_embd (768)") == 0);
    hf["n_inner"] = 1536;
    imported = importHfConfig(hf, "g.json");
    QVERIFY(imported.isOk());
    QCOMPARE(imported->model.mlpRatio, 2);
  }
};

QTEST_APPLESS_MAIN(TestHfImport)
#include "tst_hf_import.moc"
