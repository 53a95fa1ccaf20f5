// The engine against an independent PyTorch model (tests/reference/reference.py, Debian's python3-torch):
// the engine dumps its weights (safetensors, Hugging Face GPT-2 and Llama names), one batch, its logits, loss
// and every parameter gradient; the script rebuilds the model from the config in float64 and compares within
// the tolerances stated in its header. A perturbed checkpoint must make the comparison fail.
#include <QtTest>

#include <QElapsedTimer>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <algorithm>
#include <fstream>

#include "runtime/safetensors.h"

namespace {

const QString kEngine = QStringLiteral(MS_ENGINE_EXE);
const QString kServer = QStringLiteral(MS_SOURCE_DIR "/tests/reference/serve.py");

struct Result {
  int code = -1;
  QString output;
};

Result run(const QString& program, const QStringList& args) {
  QProcess p;
  p.setProcessChannelMode(QProcess::MergedChannels);
  p.start(program, args);
  Result r;
  if (!p.waitForFinished(300000)) {
    r.output = "timed out";
    return r;
  }
  r.output = QString::fromUtf8(p.readAll());
  r.code = p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1;
  return r;
}

// tests/reference/serve.py: reference.py and train_reference.py in one Python process for the whole suite
// (importing torch takes about 2 s, and the suite makes some thirty comparisons). Every wait is bounded.
class ReferenceServer {
 public:
  ~ReferenceServer() {
    if (m_process.state() == QProcess::NotRunning) return;
    m_process.closeWriteChannel();
    if (!m_process.waitForFinished(10000)) m_process.kill(), m_process.waitForFinished(10000);
  }
  // Starts the server; false (with the reason) when python3-torch is missing or the server does not answer.
  bool start(QString* why) {
    m_process.setProcessChannelMode(QProcess::SeparateChannels);
    m_process.start(MS_PYTHON, {kServer});
    const QJsonObject ready = readReply(60000, why);
    if (ready.value("ready").toBool()) return true;
    *why += " " + QString::fromUtf8(m_process.readAllStandardError()).trimmed();
    return false;
  }
  // Runs "reference" (reference.py DUMP) or "train" (train_reference.py DUMP METRICS).
  Result call(const QString& script, const QStringList& args) {
    QJsonObject request{{"script", script}, {"args", QJsonArray::fromStringList(args)}};
    m_process.write(QJsonDocument(request).toJson(QJsonDocument::Compact) + "\n");
    Result r;
    const QJsonObject reply = readReply(300000, &r.output);
    if (!reply.contains("code")) return r;
    r.code = reply.value("code").toInt(-1);
    r.output = reply.value("output").toString();
    return r;
  }

 private:
  QJsonObject readReply(int timeoutMs, QString* why) {
    QElapsedTimer clock;
    clock.start();
    while (!m_process.canReadLine()) {
      const qint64 left = timeoutMs - clock.elapsed();
      if (m_process.state() == QProcess::NotRunning || left <= 0) {
        *why = m_process.state() == QProcess::NotRunning ? "the reference server exited"
                                                         : "the reference server did not answer in time";
        return {};
      }
      m_process.waitForReadyRead(static_cast<int>(std::min<qint64>(left, 1000)));
    }
    QJsonParseError error;
    const QJsonDocument doc = QJsonDocument::fromJson(m_process.readLine(), &error);
    if (error.error != QJsonParseError::NoError || !doc.isObject()) {
      *why = "the reference server's reply is not JSON: " + error.errorString();
      return {};
    }
    return doc.object();
  }
  QProcess m_process;
};

// The "data" section of a test config: the real Fashion-MNIST, or a small text file written into dir.
QString dataSection(const QString& dir, bool images) {
  if (images) return "{\"kind\": \"fashion_mnist\"}";
  const QString text = dir + "/text.txt";
  std::ofstream out(text.toStdString());
  for (int i = 0; i < 300; ++i)
    out << "Reference text line " << i << ": all work and no play, more or less.\n";
  return QString("{\"kind\": \"text\", \"files\": [\"%1\"]}").arg(text);
}

QString writeConfig(const QString& dir, const QString& model, const QString& data, bool tokens) {
  const QString path = dir + "/config.json";
  const char* training =
      tokens ? "{\"batch_size\": 4, \"seq_len\": 24, \"threads\": 1}" : "{\"batch_size\": 4, \"threads\": 1}";
  std::ofstream(path.toStdString()) << "{\"version\": 1, \"name\": \"ref\", \"seed\": 5, \"model\": "
                                    << model.toStdString() << ", \"data\": " << data.toStdString()
                                    << ", \"training\": " << training << "}";
  return path;
}

}  // namespace

class TestReference : public QObject {
  Q_OBJECT
  ReferenceServer m_server;

 private slots:
  void initTestCase() {
    QString why;
    if (!m_server.start(&why))
      QSKIP(qPrintable("python3-torch is not installed or tests/reference/serve.py does not start: " + why));
  }

  void matchesPyTorch_data() {
    QTest::addColumn<QString>("model");
    QTest::addColumn<bool>("images");
    QTest::addColumn<int>("chunkRows");  // MESHSTUDIO_HEAD_CHUNK_ROWS (0: unset)
    const char* gptBase =
        "\"type\": \"gpt\", \"layers\": 2, \"width\": 48, \"heads\": 3, \"vocab\": 256, \"context\": 32";
    QTest::newRow("gpt-tied") << QString("{%1, \"tie_embeddings\": true}").arg(gptBase) << false << 0;
    QTest::newRow("gpt-untied") << QString("{%1, \"tie_embeddings\": false}").arg(gptBase) << false << 0;
    // The fused LM head and loss over 3 * 24 = 72 rows in chunks of 5 and 7 (the last one partial).
    QTest::newRow("gpt-tied-head-chunks")
        << QString("{%1, \"tie_embeddings\": true}").arg(gptBase) << false << 5;
    QTest::newRow("gpt-untied-head-chunks")
        << QString("{%1, \"tie_embeddings\": false}").arg(gptBase) << false << 7;
    // llama: RMSNorm, rotary embeddings (a small base, so the angles vary over 24 positions), SwiGLU and
    // grouped-query attention with groups of 2 and 6 query heads (multi-query), untied and tied heads, and
    // the head in chunks.
    const char* llamaBase =
        "\"type\": \"llama\", \"layers\": 2, \"width\": 48, \"heads\": 6, \"ffn_hidden\": 72, "
        "\"rope_theta\": 500, \"vocab\": 256, \"context\": 32";
    QTest::newRow("llama-gqa-untied")
        << QString("{%1, \"kv_heads\": 3, \"tie_embeddings\": false}").arg(llamaBase) << false << 0;
    QTest::newRow("llama-mqa-tied-head-chunks")
        << QString("{%1, \"kv_heads\": 1, \"tie_embeddings\": true}").arg(llamaBase) << false << 7;
    // Mixture of experts: block 0 dense, block 1 4 experts (2 a token) and a shared one, dropless; then with
    // a capacity factor of 1 (tokens beyond an expert's 36 rows dropped, in token order) and no shared one.
    QTest::newRow("llama-moe-shared")
        << QString(
               "{%1, \"kv_heads\": 3, \"tie_embeddings\": false, \"experts\": 4, \"experts_per_token\": 2, "
               "\"expert_ffn_hidden\": 24, \"shared_experts\": 1, \"dense_layers\": 1, \"aux_loss_coef\": "
               "0.05}")
               .arg(llamaBase)
        << false << 0;
    QTest::newRow("llama-moe-capacity")
        << QString(
               "{%1, \"kv_heads\": 2, \"tie_embeddings\": false, \"experts\": 4, \"experts_per_token\": 2, "
               "\"expert_ffn_hidden\": 24, \"capacity_factor\": 1.0}")
               .arg(llamaBase)
        << false << 0;
    const char* vitBase = "\"type\": \"vit\", \"layers\": 2, \"width\": 32, \"heads\": 4, \"patch\": 7";
    QTest::newRow("vit-cls") << QString("{%1, \"pool\": \"cls\"}").arg(vitBase) << true << 0;
    QTest::newRow("vit-mean") << QString("{%1, \"pool\": \"mean\"}").arg(vitBase) << true << 0;
    QTest::newRow("mlp-gelu") << QString(
                                     "{\"type\": \"mlp\", \"hidden\": [64, 32], \"activation\": \"gelu\"}")
                              << true << 0;
    // The cnn: the evaluation logits (BatchNorm with the running statistics), the training loss and every
    // gradient (BatchNorm with the batch's statistics), and the running statistics that forward updated.
    // Two blocks a stage: identity shortcuts in both stages, a projection with stride 2 into the second.
    QTest::newRow("cnn") << QString(
                                "{\"type\": \"cnn\", \"channels\": [4, 8], \"blocks\": 2, "
                                "\"bn_momentum\": 0.3}")
                         << true << 0;
  }
  void matchesPyTorch() {
    QFETCH(QString, model);
    QFETCH(bool, images);
    QFETCH(int, chunkRows);
    if (images && !QFile::exists("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"))
      QSKIP("dataset-fashion-mnist is not installed");
    QTemporaryDir tmp;
    const QString data = dataSection(tmp.path(), images);
    const QString config = writeConfig(tmp.path(), model, data, !images);
    const QString dump = tmp.path() + "/dump";
    if (chunkRows > 0) qputenv("MESHSTUDIO_HEAD_CHUNK_ROWS", QByteArray::number(chunkRows));
    Result e = run(kEngine, {"dump", config, "--out", dump, "--samples", "3"});
    qunsetenv("MESHSTUDIO_HEAD_CHUNK_ROWS");
    QVERIFY2(e.code == 0, qPrintable(e.output));
    Result r = m_server.call("reference", {dump});
    QVERIFY2(r.code == 0, qPrintable(r.output));
    QVERIFY(r.output.contains("tensors match"));

    // The comparison can fail: nudge one weight of the checkpoint and the gradients no longer match.
    const std::string weights = (dump + "/checkpoint/model.safetensors").toStdString();
    auto loaded = ms::readSafetensors(weights);
    QVERIFY(loaded.isOk());
    std::vector<ms::NamedTensor> tensors;
    for (auto& [name, t] : loaded->tensors) {
      if (&t == &loaded->tensors.begin()->second) t.f32[0] += 0.5f;
      tensors.push_back({name, t.shape, ms::DType::F32, t.f32.data()});
    }
    QVERIFY(ms::writeSafetensors(weights, tensors).isOk());
    Result bad = m_server.call("reference", {dump});
    QCOMPARE(bad.code, 1);
    QVERIFY(bad.output.contains("MISMATCH"));
  }

  // Several optimizer steps: the same batches (the documented sampling rule), the same schedule, clipping and
  // optimizer in PyTorch float64; every step's loss within 1e-4 relative.
  void trainingMatchesPyTorch_data() {
    QTest::addColumn<QString>("config");
    QTest::addColumn<bool>("images");
    QTest::newRow("gpt-adamw-accumulation")
        << QString(
               "\"model\": {\"type\": \"gpt\", \"layers\": 2, \"width\": 32, \"heads\": 2, \"context\": 32},"
               " \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.003, \"weight_decay\": 0.1},"
               " \"parallel\": {\"microbatches\": 2},"
               " \"training\": {\"steps\": 8, \"batch_size\": 4, \"seq_len\": 32, \"warmup_steps\": 2,"
               " \"grad_clip\": 0.5, \"eval_batches\": 1, \"threads\": 1}")
        << false;
    QTest::newRow("llama-adamw")
        << QString(
               "\"model\": {\"type\": \"llama\", \"layers\": 2, \"width\": 32, \"heads\": 4, \"kv_heads\": 2,"
               " \"ffn_hidden\": 64, \"rope_theta\": 1000, \"context\": 32, \"tie_embeddings\": false},"
               " \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.003, \"weight_decay\": 0.1},"
               " \"training\": {\"steps\": 6, \"batch_size\": 4, \"seq_len\": 32, \"warmup_steps\": 2,"
               " \"grad_clip\": 0.5, \"eval_batches\": 1, \"threads\": 1}")
        << false;
    QTest::newRow("llama-moe-adamw")
        << QString(
               "\"model\": {\"type\": \"llama\", \"layers\": 2, \"width\": 32, \"heads\": 4, \"kv_heads\": 2,"
               " \"ffn_hidden\": 64, \"rope_theta\": 1000, \"context\": 32, \"tie_embeddings\": false,"
               " \"experts\": 4, \"experts_per_token\": 2, \"expert_ffn_hidden\": 32, \"aux_loss_coef\": "
               "0.05},"
               " \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.003, \"weight_decay\": 0.1},"
               " \"training\": {\"steps\": 6, \"batch_size\": 4, \"seq_len\": 32, \"warmup_steps\": 2,"
               " \"grad_clip\": 0.5, \"eval_batches\": 1, \"threads\": 1}")
        << false;
    QTest::newRow("vit-adamw")
        << QString(
               "\"model\": {\"type\": \"vit\", \"layers\": 1, \"width\": 16, \"heads\": 2, \"patch\": 7},"
               " \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.003, \"weight_decay\": 0.05},"
               " \"training\": {\"steps\": 5, \"batch_size\": 8, \"lr_schedule\": \"linear\","
               " \"eval_batches\": 1, \"threads\": 1}")
        << true;
    QTest::newRow("mlp-sgd-nesterov")
        << QString(
               "\"model\": {\"type\": \"mlp\", \"hidden\": [32], \"activation\": \"tanh\"},"
               " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1, \"momentum\": 0.9, \"nesterov\": true,"
               " \"weight_decay\": 0.01},"
               " \"training\": {\"steps\": 6, \"batch_size\": 16, \"grad_clip\": 1.0, \"eval_batches\": 1,"
               " \"threads\": 1}")
        << true;
  }
  void trainingMatchesPyTorch() {
    QFETCH(QString, config);
    QFETCH(bool, images);
    if (images && !QFile::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
      QSKIP("dataset-fashion-mnist is not installed");
    QTemporaryDir tmp;
    const QString data = dataSection(tmp.path(), images);
    const QString path = tmp.path() + "/config.json";
    std::ofstream(path.toStdString())
        << "{\"version\": 1, \"name\": \"reftrain\", \"seed\": 9, \"data\": " << data.toStdString() << ", "
        << config.toStdString() << "}";
    const QString metrics = tmp.path() + "/metrics.jsonl";
    Result t =
        run(kEngine, {"train", path, "--run-dir", tmp.path() + "/run", "--metrics", metrics, "--quiet"});
    QVERIFY2(t.code == 0, qPrintable(t.output));
    Result d = run(kEngine, {"dump", path, "--out", tmp.path() + "/dump"});
    QVERIFY2(d.code == 0, qPrintable(d.output));
    Result r = m_server.call("train", {tmp.path() + "/dump", metrics});
    QVERIFY2(r.code == 0, qPrintable(r.output));
    QVERIFY(r.output.contains("worst relative difference"));
    // A mixture of experts' load-balancing loss is compared step by step too.
    if (config.contains("aux_loss_coef")) QVERIFY2(r.output.contains("aux engine"), qPrintable(r.output));
  }
};

QTEST_APPLESS_MAIN(TestReference)
#include "tst_reference.moc"
