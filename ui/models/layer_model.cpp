// LayerModel; see layer_model.h.
#include "ui/models/layer_model.h"

#include <QDataStream>
#include <QIODevice>
#include <QLocale>
#include <QMimeData>
#include <algorithm>
#include <iterator>
#include <map>
#include <set>

#include "plan/cost_model.h"
#include "plan/model_spec.h"
#include "ui/models/placement.h"
#include "ui/models/plan_analysis.h"
#include "ui/models/project_document.h"

namespace ms {

namespace {

// Guards the payload against a drag from another program that happens to use the same mime type.
constexpr quint32 kLayerRangeMagic = 0x4d534c52;  // "MSLR"

// "embedding" -> "emb", "block.7" -> block 7, "head" -> "head"; -1 for a layer that is not a block.
int blockNumber(const std::string& name) {
  if (name.rfind("block.", 0) != 0) return -1;
  try {
    return std::stoi(name.substr(6));
  } catch (...) {
    return -1;
  }
}

}  // namespace

QString shortLayerNames(const std::vector<std::string>& names) {
  QStringList parts;
  size_t i = 0;
  while (i < names.size()) {
    const int b = blockNumber(names[i]);
    if (b < 0) {
      parts << (names[i] == "embedding" ? QStringLiteral("emb") : QString::fromStdString(names[i]));
      ++i;
      continue;
    }
    size_t j = i;  // extend over consecutive block numbers
    while (j + 1 < names.size() && blockNumber(names[j + 1]) == blockNumber(names[j]) + 1) ++j;
    const int e = blockNumber(names[j]);
    parts << (b == e ? QStringLiteral("b%1").arg(b) : QStringLiteral("b%1-b%2").arg(b).arg(e));
    i = j + 1;
  }
  return parts.join(QStringLiteral(", "));
}

LayerModel::LayerModel(ProjectDocument* doc, QObject* parent) : QAbstractTableModel(parent), m_doc(doc) {
  connect(doc, &ProjectDocument::configChanged, this, &LayerModel::rebuild);
  rebuild();
}

void LayerModel::rebuild() {
  beginResetModel();
  m_rows.clear();
  m_status.clear();
  const RunConfig& config = m_doc->config();
  // Sizes below 1 would make the spec meaningless (or divide by zero): show the reason instead of rows.
  ConfigErrors modelErrors = m_doc->errorsAt(QStringLiteral("/model"));
  for (const ConfigError& e : m_doc->errorsAt(QStringLiteral("/training/seq_len"))) modelErrors.push_back(e);
  if (!modelErrors.empty()) {
    m_status = tr("The model section is invalid: %1: %2")
                   .arg(QString::fromStdString(modelErrors.front().path),
                        QString::fromStdString(modelErrors.front().message));
    endResetModel();
    return;
  }
  const ModelSpec spec = buildModelSpec(config.model, config.training.seqLen);
  const auto placement = layerPlacement(config);
  if (!placement) m_status = tr("No placement: %1").arg(QString::fromStdString(placement.message()));
  m_rows.reserve(spec.layers.size());
  // The placement numbers chunks across the whole model; a stage's chunks are shown as 0, 1, ... within it
  // (Megatron's virtual pipeline rank), which is what a person reads off an interleaved schedule.
  std::map<int, std::set<int>> chunksOfStage;
  if (placement)
    for (size_t i = 0; i < placement->stageOfLayer.size(); ++i)
      chunksOfStage[placement->stageOfLayer[i]].insert(placement->chunkOfLayer[i]);
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& l = spec.layers[i];
    Row row;
    row.name = QString::fromStdString(l.name);
    row.params = l.paramCount();
    row.gflop = l.forwardFlopsPerSample / 1e9;
    row.mib = double(l.activationBytesPerSample) / (1024.0 * 1024.0);
    if (placement) {
      row.stage = placement->stageOfLayer[i];
      const std::set<int>& chunks = chunksOfStage[row.stage];
      row.chunk = static_cast<int>(std::distance(chunks.begin(), chunks.find(placement->chunkOfLayer[i])));
    }
    m_rows.push_back(row);
  }
  endResetModel();
}

void LayerModel::setSnapshot(std::shared_ptr<const PlanSnapshot> snapshot) {
  if (!snapshot || !snapshot->ok() || !(snapshot->config == m_doc->config())) return;
  const CostModel cost(*snapshot->plan);
  const LayerTimes& t = cost.layerTimes();
  if (t.forward.size() != m_rows.size()) return;
  for (size_t i = 0; i < m_rows.size(); ++i) {
    m_rows[i].forwardMs = t.forward[i] * 1e3;
    m_rows[i].backwardMs = (t.backwardInput[i] + t.backwardWeight[i]) * 1e3;
    QString kernels;
    for (const KernelCost& k : layerForwardKernels(*snapshot->plan, static_cast<int>(i))) {
      kernels += tr("\n  %1: %2 ms").arg(QString::fromStdString(k.what)).arg(k.seconds * 1e3, 0, 'g', 3);
      if (k.fractionOfPeak > 0) kernels += tr(", %1% of peak").arg(100 * k.fractionOfPeak, 0, 'f', 0);
    }
    m_rows[i].kernels = kernels;
  }
  if (!m_rows.empty())
    emit dataChanged(index(0, 0), index(rowCount() - 1, NUM_COLUMNS - 1), {Qt::ToolTipRole});
}

int LayerModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(m_rows.size());
}

int LayerModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : NUM_COLUMNS;
}

QVariant LayerModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) return {};
  const Row& row = m_rows[static_cast<size_t>(index.row())];
  switch (role) {
    case Qt::DisplayRole:
      switch (index.column()) {
        case Layer:
          return row.name;
        case Stage:
          return row.stage < 0 ? QVariant() : QVariant(row.stage);
        case Chunk:
          return row.chunk < 0 ? QVariant() : QVariant(row.chunk);
        case Parameters:
          return QLocale().toString(row.params);
        case ForwardGflop:
          return QString::number(row.gflop, 'f', row.gflop < 10 ? 4 : 1);
        case ActivationMib:
          return QString::number(row.mib, 'f', row.mib < 10 ? 3 : 1);
      }
      return {};
    case Qt::TextAlignmentRole:
      return index.column() == Layer ? QVariant(Qt::AlignLeft | Qt::AlignVCenter)
                                     : QVariant(Qt::AlignRight | Qt::AlignVCenter);
    case Qt::ToolTipRole:
      if (index.column() == Stage && row.stage < 0) return m_status;
      if (index.column() == ForwardGflop && row.forwardMs >= 0)
        return tr("forward %1 ms, backward %2 ms per microbatch on its stage's device")
                   .arg(row.forwardMs, 0, 'g', 3)
                   .arg(row.backwardMs, 0, 'g', 3) +
               (row.kernels.isEmpty() ? QString() : tr("\nforward by kernel:") + row.kernels);
      return {};
    case LayerIndexRole:
      return index.row();
    case StageRole:
      return row.stage;
    case ChunkRole:
      return row.chunk;
    case ParamCountRole:
      return QVariant::fromValue<qlonglong>(row.params);
  }
  return {};
}

QVariant LayerModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
  switch (section) {
    case Layer:
      return tr("Layer");
    case Stage:
      return tr("Stage");
    case Chunk:
      return tr("Chunk");
    case Parameters:
      return tr("Parameters");
    case ForwardGflop:
      return tr("Forward GFLOP/sample");
    case ActivationMib:
      return tr("Activations MiB/sample");
  }
  return {};
}

Qt::ItemFlags LayerModel::flags(const QModelIndex& index) const {
  if (!index.isValid()) return Qt::NoItemFlags;
  return Qt::ItemIsEnabled | Qt::ItemIsSelectable | Qt::ItemIsDragEnabled | Qt::ItemNeverHasChildren;
}

QStringList LayerModel::mimeTypes() const {
  return {mimeType()};
}

QMimeData* LayerModel::mimeData(const QModelIndexList& indexes) const {
  int first = -1, last = -1;
  for (const QModelIndex& i : indexes) {
    if (!i.isValid() || i.model() != this) continue;
    first = first < 0 ? i.row() : std::min(first, i.row());
    last = std::max(last, i.row());
  }
  if (first < 0) return nullptr;
  auto* mime = new QMimeData;
  mime->setData(mimeType(), encodeLayerRange(first, last));
  // A readable form for drops outside the studio (a text editor).
  mime->setText(QStringLiteral("%1..%2").arg(m_rows[static_cast<size_t>(first)].name,
                                             m_rows[static_cast<size_t>(last)].name));
  return mime;
}

QByteArray LayerModel::encodeLayerRange(int first, int last) {
  QByteArray out;
  QDataStream s(&out, QIODevice::WriteOnly);
  s << kLayerRangeMagic << qint32(first) << qint32(last);
  return out;
}

std::optional<std::pair<int, int>> LayerModel::decodeLayerRange(const QByteArray& payload) {
  QDataStream s(payload);
  quint32 magic = 0;
  qint32 first = -1, last = -1;
  s >> magic >> first >> last;
  if (s.status() != QDataStream::Ok || !s.atEnd() || magic != kLayerRangeMagic) return std::nullopt;
  if (first < 0 || last < first) return std::nullopt;
  return std::pair<int, int>(first, last);
}

}  // namespace ms
