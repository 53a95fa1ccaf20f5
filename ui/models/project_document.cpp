// ProjectDocument; see project_document.h.
#include "ui/models/project_document.h"

#include <QFile>
#include <QFileInfo>
#include <QUndoCommand>

namespace ms {

namespace {

// One edit: the configs before and after. Merging keeps the first `before` and the newest `after`.
class ConfigCommand : public QUndoCommand {
 public:
  ConfigCommand(ProjectDocument* doc, const QString& text, RunConfig before, RunConfig after, int mergeKey)
      : QUndoCommand(text),
        m_doc(doc),
        m_before(std::move(before)),
        m_after(std::move(after)),
        m_key(mergeKey) {}
  void undo() override { m_doc->applyConfig(m_before); }
  void redo() override { m_doc->applyConfig(m_after); }
  int id() const override { return m_key; }
  bool mergeWith(const QUndoCommand* other) override {
    if (other->id() != id() || m_key < 0) return false;
    m_after = static_cast<const ConfigCommand*>(other)->m_after;
    // Typing a value back to where it started leaves nothing to undo.
    if (m_after == m_before) setObsolete(true);
    return true;
  }

 private:
  ProjectDocument* m_doc;
  RunConfig m_before, m_after;
  int m_key;
};

}  // namespace

ProjectDocument::ProjectDocument(QObject* parent) : QObject(parent) {
  m_errors = validateRunConfig(m_config);
  connect(&m_undo, &QUndoStack::cleanChanged, this, [this](bool clean) {
    emit modifiedChanged(!clean);
    emit fileChanged();
  });
}

ConfigErrors ProjectDocument::errorsAt(const QString& path) const {
  const std::string p = path.toStdString();
  ConfigErrors out;
  for (const ConfigError& e : m_errors)
    if (e.path == p ||
        (e.path.size() > p.size() && e.path.compare(0, p.size(), p) == 0 && e.path[p.size()] == '/'))
      out.push_back(e);
  return out;
}

QString ProjectDocument::displayName() const {
  if (!m_path.isEmpty()) return QFileInfo(m_path).fileName();
  return QString::fromStdString(m_config.name) + QStringLiteral(" (unsaved)");
}

void ProjectDocument::applyConfig(const RunConfig& config) {
  const std::string baseDir = m_config.baseDir;
  m_config = config;
  m_config.baseDir = baseDir;  // where relative paths resolve belongs to the file, not to the edit
  m_errors = validateRunConfig(m_config);
  ++m_revision;
  emit configChanged();
}

void ProjectDocument::edit(const QString& text, const std::function<void(RunConfig&)>& change, int mergeKey) {
  RunConfig after = m_config;
  change(after);
  if (after == m_config) return;
  m_undo.push(new ConfigCommand(this, text, m_config, std::move(after), mergeKey));
}

void ProjectDocument::setConfig(const QString& text, const RunConfig& config) {
  if (config == m_config) return;
  m_undo.push(new ConfigCommand(this, text, m_config, config, -1));
}

Status ProjectDocument::load(const QString& path) {
  auto loaded = loadRunConfig(path.toStdString());
  if (!loaded) return loaded.status();
  reset(*loaded, QFileInfo(path).absoluteFilePath());
  return Status::ok();
}

void ProjectDocument::reset(const RunConfig& config, const QString& path) {
  m_undo.clear();
  m_path = path;
  m_config = config;
  m_errors = validateRunConfig(m_config);
  m_undo.setClean();
  ++m_revision;
  emit configChanged();
  emit fileChanged();
  emit modifiedChanged(false);
}

Status ProjectDocument::save(const QString& path) {
  const QString target = path.isEmpty() ? m_path : QFileInfo(path).absoluteFilePath();
  if (target.isEmpty()) return Status::error("the project has no file yet: choose one with Save As");
  MS_TRY(saveRunConfig(m_config, target.toStdString()));
  const std::string newBase = QFileInfo(target).absolutePath().toStdString();
  m_config.baseDir = newBase;
  const bool moved = target != m_path;
  m_path = target;
  m_undo.setClean();
  if (moved) emit fileChanged();
  return Status::ok();
}

QList<ProjectTemplate> projectTemplates() {
  return {
      {QStringLiteral("gpt"), QObject::tr("GPT on fortunes"),
       QObject::tr("A 4-layer character GPT trained on the fortune files; runs on this machine's CPUs.")},
      {QStringLiteral("llama"), QObject::tr("Llama on fortunes"),
       QObject::tr("A 4-layer character Llama (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention) "
                   "trained on the fortune files; runs on this machine's CPUs.")},
      {QStringLiteral("vit"), QObject::tr("ViT on Fashion-MNIST"),
       QObject::tr("A 4-layer vision transformer classifying Fashion-MNIST; runs on CPUs.")},
      {QStringLiteral("mlp"), QObject::tr("MLP on Fashion-MNIST"),
       QObject::tr("A multilayer perceptron classifying Fashion-MNIST; runs on CPUs in seconds.")},
      {QStringLiteral("cnn"), QObject::tr("ResNet on Fashion-MNIST"),
       QObject::tr("A small ResNet (convolutions, BatchNorm, residual blocks) classifying Fashion-MNIST; "
                   "synchronised BatchNorm under data parallelism; runs on CPUs.")},
      {QStringLiteral("mlp-ps"), QObject::tr("Parameter servers on Fashion-MNIST"),
       QObject::tr(
           "The MLP trained by 4 workers and 2 parameter servers, asynchronously, one worker slowed 3x: "
           "switch consistency to sync or bounded to compare; runs on CPUs.")},
      {QStringLiteral("gpt1b"), QObject::tr("GPT 1.3B on 2 x 4 A100 (planning only)"),
       QObject::tr("A 1.3B GPT with dp 2 x tp 2 x pp 2 on two 4-GPU nodes: plan, predict and export.")},
      {QStringLiteral("gpt3"), QObject::tr("GPT-3 175B (planning only)"),
       QObject::tr(
           "GPT-3 175B on 1024 H100s in 128 nodes: plan, predict and export; too large to run here.")},
      {QStringLiteral("gpt3-16k"), QObject::tr("GPT-3 175B on 16384 H100s (planning only)"),
       QObject::tr(
           "GPT-3 175B on 2048 nodes of 8 H100s (dp 128 x tp 8 x pp 16, interleaved): a cluster-scale "
           "plan to explore; too large to run here.")},
      {QStringLiteral("llama3-8b"), QObject::tr("Llama 3 8B on 8 H100 (planning only)"),
       QObject::tr("Llama 3 8B, 8192-token sequences, sharded over one node of 8 H100s (ZeRO-3).")},
      {QStringLiteral("llama3-70b"), QObject::tr("Llama 3 70B on 64 H100 (planning only)"),
       QObject::tr("Llama 3 70B on 8 nodes of 8 H100s: tp 8 in a node, ZeRO-3 over nodes.")},
      {QStringLiteral("llama3-405b"), QObject::tr("Llama 3 405B on 16384 H100 (planning only)"),
       QObject::tr("Llama 3 405B on 2048 nodes of 8 H100s, the Llama 3 paper's layout (tp 8 x pp 16 x dp "
                   "128, 8192-token sequences).")},
      {QStringLiteral("mixtral"), QObject::tr("Mixtral 8x7B on 64 H100 (planning only)"),
       QObject::tr(
           "Mixtral 8x7B (8 experts a block, 2 a token) on 8 nodes of 8 H100s: tp 8 splits every expert, "
           "ZeRO-1 over nodes.")},
  };
}

Expected<RunConfig> templateConfig(const QString& key) {
  static const QMap<QString, QString> files = {
      {QStringLiteral("gpt"), QStringLiteral(":/examples/gpt-fortunes.json")},
      {QStringLiteral("vit"), QStringLiteral(":/examples/vit-fashion.json")},
      {QStringLiteral("mlp"), QStringLiteral(":/examples/mlp-fashion.json")},
      {QStringLiteral("cnn"), QStringLiteral(":/examples/cnn-fashion.json")},
      {QStringLiteral("mlp-ps"), QStringLiteral(":/examples/mlp-fashion-ps.json")},
      {QStringLiteral("gpt1b"), QStringLiteral(":/examples/gpt-1b-8xa100.json")},
      {QStringLiteral("gpt3"), QStringLiteral(":/examples/gpt3-175b-plan.json")},
      {QStringLiteral("gpt3-16k"), QStringLiteral(":/examples/gpt3-175b-16k.json")},
      {QStringLiteral("llama"), QStringLiteral(":/examples/llama-fortunes.json")},
      {QStringLiteral("llama3-8b"), QStringLiteral(":/examples/llama3-8b-8xh100.json")},
      {QStringLiteral("llama3-70b"), QStringLiteral(":/examples/llama3-70b-64xh100.json")},
      {QStringLiteral("llama3-405b"), QStringLiteral(":/examples/llama3-405b-16k.json")},
      {QStringLiteral("mixtral"), QStringLiteral(":/examples/mixtral-8x7b-64xh100.json")},
  };
  if (!files.contains(key)) return Status::error("unknown project template \"" + key.toStdString() + "\"");
  QFile f(files[key]);
  if (!f.open(QIODevice::ReadOnly))
    return Status::error("template " + files[key].toStdString() + " is missing");
  const QByteArray bytes = f.readAll();
  nlohmann::json doc =
      nlohmann::json::parse(bytes.constData(), bytes.constData() + bytes.size(), nullptr, false);
  if (doc.is_discarded()) return Status::error("template " + files[key].toStdString() + " is not valid JSON");
  return parseRunConfig(doc);
}

}  // namespace ms
