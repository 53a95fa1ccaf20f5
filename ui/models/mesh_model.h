// The device mesh as a tree: top-level rows are the config's nodes (name, device type, device count; all
// three editable), their children the node's devices (device, the rank on it, that rank's stage/tp/dp
// coordinates). Beside the model, the mesh edits the canvas and the model share (add, duplicate and remove
// nodes and devices, define device and link types) as checked functions on a MeshConfig, and MeshRanks, which
// says which ranks sit on which device.
//
// What always holds: the model mirrors ProjectDocument::config() after every configChanged() (a structural
// change resets it, a renamed node or a new layout only changes data); every edit goes through
// ProjectDocument, so it is undoable; setData() refuses (returns false, changes nothing) an empty or
// duplicate node name, a device type that deviceTypeNames() does not list and a count below 1. The edit
// functions either apply the whole edit or return the reason and leave the mesh unchanged.
#pragma once

#include <QAbstractItemModel>
#include <QString>
#include <string>
#include <vector>

#include "common/status.h"
#include "plan/layout.h"
#include "plan/run_config.h"

namespace ms {

class ProjectDocument;

// --- Mesh edits (the mesh is unchanged when they fail). ---

inline constexpr int kMaxDevicesPerNode =
    1024;  // a guard against a slip of the keyboard, not a hardware limit

// A node name not yet in the mesh, in the style of `like` ("node007" -> "node128", "gpu" -> "gpu-1").
std::string uniqueNodeName(const MeshConfig& mesh, const std::string& like);
// Appends a node with the device type and count of node `like` (the last node when -1).
Status addNode(MeshConfig& mesh, int like = -1);
// Inserts a copy of the node right after it, under a new name.
Status duplicateNode(MeshConfig& mesh, int node);
// Refuses to remove the only node (a mesh needs one).
Status removeNode(MeshConfig& mesh, int node);
Status addDevice(MeshConfig& mesh, int node);
// Removes a device (a global, node-major index): its node holds one device fewer; a node's only device
// takes the node with it (unless it is the only node).
Status removeDevice(MeshConfig& mesh, int device);
Status setNodeDeviceType(MeshConfig& mesh, int node, const std::string& type);
Status setNodeCount(MeshConfig& mesh, int node, int count);
Status renameNode(MeshConfig& mesh, int node, const std::string& name);
// Adds a user-defined type: refused when the name is empty, holds characters other than [A-Za-z0-9._-],
// is already a catalog or config type, or a figure is not positive.
Status addDeviceType(MeshConfig& mesh, const DeviceTypeConfig& type);
Status addLinkType(MeshConfig& mesh, const LinkTypeConfig& type);
// Sets the intra-node (intra = true) or inter-node link to a name linkTypeNames() lists.
Status setLink(MeshConfig& mesh, bool intra, const std::string& name);

// Which ranks run on which device of the config's mesh (RankLayout::deviceOf inverted); empty, with the
// reason, when the mesh or the parallel layout does not resolve. In parameter-server mode rank w is worker w
// (a replica of the whole model on device w).
struct MeshRanks {
  RankLayout layout;                            // valid when ok()
  std::vector<std::vector<int>> ranksOnDevice;  // per device, increasing; empty = idle
  QString error;
  bool ok() const { return error.isEmpty(); }
  int firstRank(int device) const;  // -1 when idle or unknown
  static MeshRanks compute(const RunConfig& config);
};

class MeshModel : public QAbstractItemModel {
  Q_OBJECT
 public:
  // Node rows: Name, DeviceType, Devices; device rows: Device, Rank, Coordinates (same column numbers).
  enum Column { Name, DeviceType, Devices, NUM_COLUMNS };
  enum DeviceColumn { DeviceName = Name, Rank = DeviceType, Coordinates = Devices };
  enum Role {
    NodeIndexRole = Qt::UserRole,  // int: the node of the row
    DeviceIndexRole,               // int: the global device index of a device row, -1 on node rows
    StageRole,                     // int: the pipeline stage of a device row's (first) rank, -1 when idle
  };

  explicit MeshModel(ProjectDocument* doc, QObject* parent = nullptr);

  QModelIndex index(int row, int column, const QModelIndex& parent = {}) const override;
  QModelIndex parent(const QModelIndex& child) const override;
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  bool setData(const QModelIndex& index, const QVariant& value, int role = Qt::EditRole) override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;
  Qt::ItemFlags flags(const QModelIndex& index) const override;

  QModelIndex nodeIndex(int node, int column = 0) const { return index(node, column); }
  // Why the last setData() was refused (empty after one that succeeded).
  QString lastError() const { return m_lastError; }

 private:
  void configChanged();
  int deviceIndex(int node, int local) const;
  ProjectDocument* m_doc;
  std::vector<int> m_counts;  // devices per node as the model shows them (rows of each node)
  std::vector<int> m_first;   // global index of each node's first device
  MeshRanks m_ranks;
  QString m_lastError;
};

}  // namespace ms
