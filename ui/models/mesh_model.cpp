// MeshModel, the mesh edits and MeshRanks; see mesh_model.h.
#include "ui/models/mesh_model.h"

#include <algorithm>
#include <cctype>

#include "plan/hardware.h"
#include "ui/models/plan_analysis.h"
#include "ui/models/project_document.h"

namespace ms {

namespace {

bool hasNode(const MeshConfig& mesh, const std::string& name) {
  return std::any_of(mesh.nodes.begin(), mesh.nodes.end(),
                     [&](const NodeConfig& n) { return n.name == name; });
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

Status checkNode(const MeshConfig& mesh, int node) {
  if (node < 0 || node >= static_cast<int>(mesh.nodes.size()))
    return Status::error("node " + std::to_string(node) + " does not exist: the mesh has " +
                         std::to_string(mesh.nodes.size()) + " nodes");
  return Status::ok();
}

// The characters the config allows in a type name (config_schema.cpp: nameChars).
Status checkTypeName(const std::string& name, const std::vector<std::string>& taken, const char* kind) {
  if (name.empty()) return Status::error(std::string("a ") + kind + " type needs a name");
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-')
      return Status::error(std::string("the ") + kind + " type name \"" + name +
                           "\" may only hold letters, digits, '.', '_' and '-'");
  if (contains(taken, name))
    return Status::error(std::string("there is already a ") + kind + " type named \"" + name + "\"");
  return Status::ok();
}

Status checkPositive(const std::string& what, double v) {
  if (!(v > 0)) return Status::error(what + " must be > 0, got " + std::to_string(v));
  return Status::ok();
}

}  // namespace

std::string uniqueNodeName(const MeshConfig& mesh, const std::string& like) {
  // "node007" -> prefix "node", 3 digits; numbering continues after the node count.
  size_t digits = 0;
  while (digits < like.size() && std::isdigit(static_cast<unsigned char>(like[like.size() - 1 - digits])))
    ++digits;
  const std::string prefix = like.empty() ? "node" : like.substr(0, like.size() - digits);
  const bool numbered = digits > 0 || like.empty();
  for (size_t n = numbered ? mesh.nodes.size() : 1;; ++n) {
    std::string number = std::to_string(n);
    if (number.size() < digits) number.insert(0, digits - number.size(), '0');
    const std::string candidate = numbered ? prefix + number : prefix + "-" + number;
    if (!hasNode(mesh, candidate)) return candidate;
  }
}

Status addNode(MeshConfig& mesh, int like) {
  if (mesh.nodes.empty()) {
    mesh.nodes.push_back(NodeConfig{"node0", "cpu", 1});
    return Status::ok();
  }
  if (like < 0) like = static_cast<int>(mesh.nodes.size()) - 1;
  MS_TRY(checkNode(mesh, like));
  NodeConfig node = mesh.nodes[static_cast<size_t>(like)];
  node.name = uniqueNodeName(mesh, node.name);
  node.count = std::max(node.count, 1);
  mesh.nodes.push_back(node);
  return Status::ok();
}

Status duplicateNode(MeshConfig& mesh, int node) {
  MS_TRY(checkNode(mesh, node));
  NodeConfig copy = mesh.nodes[static_cast<size_t>(node)];
  copy.name = uniqueNodeName(mesh, copy.name);
  mesh.nodes.insert(mesh.nodes.begin() + node + 1, copy);
  return Status::ok();
}

Status removeNode(MeshConfig& mesh, int node) {
  MS_TRY(checkNode(mesh, node));
  if (mesh.nodes.size() == 1) return Status::error("the mesh needs at least one node");
  mesh.nodes.erase(mesh.nodes.begin() + node);
  return Status::ok();
}

Status addDevice(MeshConfig& mesh, int node) {
  MS_TRY(checkNode(mesh, node));
  NodeConfig& n = mesh.nodes[static_cast<size_t>(node)];
  if (n.count >= kMaxDevicesPerNode)
    return Status::error("node " + n.name + " already holds " + std::to_string(n.count) + " devices");
  n.count = std::max(n.count, 0) + 1;
  return Status::ok();
}

Status removeDevice(MeshConfig& mesh, int device) {
  int first = 0;
  for (size_t i = 0; i < mesh.nodes.size(); ++i) {
    const int count = std::max(mesh.nodes[i].count, 0);
    if (device >= first && device < first + count) {
      if (count > 1) {
        --mesh.nodes[i].count;
        return Status::ok();
      }
      if (mesh.nodes.size() == 1) return Status::error("the mesh needs at least one device");
      mesh.nodes.erase(mesh.nodes.begin() + static_cast<long>(i));
      return Status::ok();
    }
    first += count;
  }
  return Status::error("device " + std::to_string(device) + " does not exist: the mesh has " +
                       std::to_string(first) + " devices");
}

Status setNodeDeviceType(MeshConfig& mesh, int node, const std::string& type) {
  MS_TRY(checkNode(mesh, node));
  const std::vector<std::string> names = deviceTypeNames(mesh);
  if (!contains(names, type))
    return Status::error("\"" + type + "\" is not a device type of the catalog or the mesh");
  mesh.nodes[static_cast<size_t>(node)].device = type;
  return Status::ok();
}

Status setNodeCount(MeshConfig& mesh, int node, int count) {
  MS_TRY(checkNode(mesh, node));
  if (count < 1 || count > kMaxDevicesPerNode)
    return Status::error("a node holds 1 to " + std::to_string(kMaxDevicesPerNode) + " devices, got " +
                         std::to_string(count));
  mesh.nodes[static_cast<size_t>(node)].count = count;
  return Status::ok();
}

Status renameNode(MeshConfig& mesh, int node, const std::string& name) {
  MS_TRY(checkNode(mesh, node));
  if (name.empty()) return Status::error("a node needs a name");
  if (mesh.nodes[static_cast<size_t>(node)].name == name) return Status::ok();
  if (hasNode(mesh, name)) return Status::error("there is already a node named \"" + name + "\"");
  mesh.nodes[static_cast<size_t>(node)].name = name;
  return Status::ok();
}

Status addDeviceType(MeshConfig& mesh, const DeviceTypeConfig& type) {
  MS_TRY(checkTypeName(type.name, deviceTypeNames(mesh), "device"));
  MS_TRY(checkPositive("peak fp32 TFLOP/s", type.peakTflopsFp32));
  MS_TRY(checkPositive("peak bf16 TFLOP/s", type.peakTflopsBf16));
  MS_TRY(checkPositive("memory GB", type.memoryGb));
  MS_TRY(checkPositive("memory bandwidth GB/s", type.memoryBandwidthGbs));
  if (!(type.achievableFraction > 0 && type.achievableFraction <= 1))
    return Status::error("the achievable fraction must be in (0, 1]");
  mesh.deviceTypes.push_back(type);
  return Status::ok();
}

Status addLinkType(MeshConfig& mesh, const LinkTypeConfig& type) {
  MS_TRY(checkTypeName(type.name, linkTypeNames(mesh), "link"));
  MS_TRY(checkPositive("bandwidth GB/s", type.bandwidthGbs));
  if (!(type.latencyUs >= 0)) return Status::error("latency must be >= 0 us");
  mesh.linkTypes.push_back(type);
  return Status::ok();
}

Status setLink(MeshConfig& mesh, bool intra, const std::string& name) {
  if (!contains(linkTypeNames(mesh), name))
    return Status::error("\"" + name + "\" is not a link type of the catalog or the mesh");
  (intra ? mesh.intraLink : mesh.interLink) = name;
  return Status::ok();
}

int MeshRanks::firstRank(int device) const {
  if (device < 0 || device >= static_cast<int>(ranksOnDevice.size())) return -1;
  const auto& ranks = ranksOnDevice[static_cast<size_t>(device)];
  return ranks.empty() ? -1 : ranks.front();
}

MeshRanks MeshRanks::compute(const RunConfig& config) {
  MeshRanks out;
  auto mesh = buildMesh(config.mesh);
  if (!mesh) {
    out.error = QString::fromStdString(mesh.message());
    return out;
  }
  // No sharing: the config's validation refuses more ranks than devices, so a mapping of several ranks to one
  // device would show a layout no plan has.
  // Parameter-server mode: the workers are the replicas, one per device (as the launcher and the prediction
  // place them); the servers are host processes, not on the devices.
  ParallelConfig parallel = config.parallel;
  if (parallel.mode == ParallelMode::ParameterServer) {
    parallel = {};
    parallel.dp = std::max(1, config.parallel.workers);
  }
  auto layout = layoutRanks(parallel, *mesh, /*allowSharing=*/false);
  if (!layout) {
    out.error = QString::fromStdString(layout.message());
    return out;
  }
  out.layout = layout->layout;
  out.ranksOnDevice.resize(static_cast<size_t>(mesh->deviceCount()));
  for (int r = 0; r < out.layout.world(); ++r)
    out.ranksOnDevice[static_cast<size_t>(out.layout.deviceOf[static_cast<size_t>(r)])].push_back(r);
  return out;
}

// --- MeshModel ---

MeshModel::MeshModel(ProjectDocument* doc, QObject* parent) : QAbstractItemModel(parent), m_doc(doc) {
  connect(doc, &ProjectDocument::configChanged, this, &MeshModel::configChanged);
  configChanged();
}

void MeshModel::configChanged() {
  const RunConfig& config = m_doc->config();
  std::vector<int> counts;
  for (const NodeConfig& n : config.mesh.nodes) counts.push_back(std::max(n.count, 0));
  const bool structural = counts != m_counts;
  if (structural) beginResetModel();
  m_counts = std::move(counts);
  m_first.assign(1, 0);
  for (int c : m_counts) m_first.push_back(m_first.back() + c);
  m_ranks = MeshRanks::compute(config);
  if (structural) {
    endResetModel();
    return;
  }
  // Same rows: only names, types and ranks may have changed. Views keep their expansion and selection.
  const int nodes = static_cast<int>(m_counts.size());
  if (nodes == 0) return;
  emit dataChanged(index(0, 0), index(nodes - 1, NUM_COLUMNS - 1));
  for (int n = 0; n < nodes; ++n)
    if (m_counts[static_cast<size_t>(n)] > 0) {
      const QModelIndex parent = index(n, 0);
      emit dataChanged(index(0, 0, parent),
                       index(m_counts[static_cast<size_t>(n)] - 1, NUM_COLUMNS - 1, parent));
    }
}

int MeshModel::deviceIndex(int node, int local) const {
  return m_first[static_cast<size_t>(node)] + local;
}

QModelIndex MeshModel::index(int row, int column, const QModelIndex& parent) const {
  if (!hasIndex(row, column, parent)) return {};
  // internalId: 0 for node rows, node + 1 for device rows.
  if (!parent.isValid()) return createIndex(row, column, quintptr(0));
  return createIndex(row, column, quintptr(parent.row() + 1));
}

QModelIndex MeshModel::parent(const QModelIndex& child) const {
  if (!child.isValid() || child.internalId() == 0) return {};
  return createIndex(static_cast<int>(child.internalId() - 1), 0, quintptr(0));
}

int MeshModel::rowCount(const QModelIndex& parent) const {
  if (!parent.isValid()) return static_cast<int>(m_counts.size());
  if (parent.internalId() != 0 || parent.column() != 0) return 0;  // devices have no children
  return m_counts[static_cast<size_t>(parent.row())];
}

int MeshModel::columnCount(const QModelIndex&) const {
  return NUM_COLUMNS;
}

QVariant MeshModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid)) return {};
  const RunConfig& config = m_doc->config();
  const bool isNode = index.internalId() == 0;
  const int node = isNode ? index.row() : static_cast<int>(index.internalId() - 1);
  if (node >= static_cast<int>(config.mesh.nodes.size())) return {};
  const NodeConfig& n = config.mesh.nodes[static_cast<size_t>(node)];
  if (role == NodeIndexRole) return node;
  if (isNode) {
    if (role == DeviceIndexRole || role == StageRole) return -1;
    if (role != Qt::DisplayRole && role != Qt::EditRole) return {};
    switch (index.column()) {
      case Name:
        return QString::fromStdString(n.name);
      case DeviceType:
        return QString::fromStdString(n.device);
      case Devices:
        return n.count;
    }
    return {};
  }
  const int device = deviceIndex(node, index.row());
  const int rank = m_ranks.firstRank(device);
  if (role == DeviceIndexRole) return device;
  if (role == StageRole) return rank < 0 ? -1 : m_ranks.layout.coord(rank).pp;
  if (role != Qt::DisplayRole) return {};
  switch (index.column()) {
    case DeviceName:
      return tr("device %1 (#%2 of %3)").arg(device).arg(index.row()).arg(QString::fromStdString(n.name));
    case Rank: {
      if (rank < 0) return m_ranks.ok() ? tr("idle") : QString();
      QStringList ranks;
      for (int r : m_ranks.ranksOnDevice[static_cast<size_t>(device)]) ranks << QString::number(r);
      return ranks.join(QStringLiteral(", "));
    }
    case Coordinates: {
      if (rank < 0) return m_ranks.ok() ? QString() : m_ranks.error;
      const RankCoord c = m_ranks.layout.coord(rank);
      return tr("stage %1 · tp %2 · dp %3").arg(c.pp).arg(c.tp).arg(c.dp);
    }
  }
  return {};
}

bool MeshModel::setData(const QModelIndex& index, const QVariant& value, int role) {
  if (role != Qt::EditRole || !checkIndex(index, CheckIndexOption::IndexIsValid) || index.internalId() != 0)
    return false;
  const int node = index.row();
  MeshConfig mesh = m_doc->config().mesh;
  Status status;
  QString text;
  switch (index.column()) {
    case Name:
      status = renameNode(mesh, node, value.toString().trimmed().toStdString());
      text = tr("Rename node");
      break;
    case DeviceType:
      status = setNodeDeviceType(mesh, node, value.toString().toStdString());
      text =
          tr("Set device type of %1").arg(QString::fromStdString(mesh.nodes[static_cast<size_t>(node)].name));
      break;
    case Devices: {
      bool ok = false;
      const int count = value.toInt(&ok);
      status =
          ok ? setNodeCount(mesh, node, count) : Status::error("the device count must be a whole number");
      text = tr("Set devices of %1").arg(QString::fromStdString(mesh.nodes[static_cast<size_t>(node)].name));
      break;
    }
    default:
      return false;
  }
  if (!status) {
    m_lastError = QString::fromStdString(status.message());
    return false;
  }
  m_lastError.clear();
  m_doc->edit(text, [&mesh](RunConfig& c) { c.mesh = mesh; });
  return true;
}

QVariant MeshModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
  switch (section) {
    case Name:
      return tr("Node / device");
    case DeviceType:
      return tr("Device type / rank");
    case Devices:
      return tr("Devices / stage, tp, dp");
  }
  return {};
}

Qt::ItemFlags MeshModel::flags(const QModelIndex& index) const {
  if (!index.isValid()) return Qt::NoItemFlags;
  Qt::ItemFlags f = Qt::ItemIsEnabled | Qt::ItemIsSelectable;
  if (index.internalId() == 0) return f | Qt::ItemIsEditable;
  return f | Qt::ItemNeverHasChildren;
}

}  // namespace ms
