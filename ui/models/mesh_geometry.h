// Where the mesh canvas draws things: node boxes laid out in a grid, device tiles in a grid inside each node
// box, and the inverse (which device or node a scene point hits). A plain value type computed from the
// device count of each node and a few sizes, so the canvas, its hit tests and the tests share one set of
// arithmetic and no widget is needed to check it.
//
// What always holds: device indices are global and node-major, like Mesh's (node 0's devices, then node 1's);
// every node box has the same size (room for the largest node), so a point maps to its node cell by division;
// tiles never overlap each other or leave their node box; deviceAt(p) is d exactly when tileRect(d) contains
// p, and -1 in the gaps, in a node's header, over a node's unused tile slots and outside every node.
#pragma once

#include <QPointF>
#include <QRectF>
#include <QSizeF>
#include <vector>

#include "plan/run_config.h"

namespace ms {

struct MeshGeometryParams {
  QSizeF tile{136, 66};    // one device tile
  double tileGap = 6;      // between tiles of a node
  double nodePadding = 8;  // inside a node box, around its tiles
  double nodeHeader = 24;  // top band of a node box for its name, device type and intra-node link
  double nodeGap = 24;     // between node boxes
  int nodeColumns = 0;     // node boxes per row; 0 = ceil(sqrt(nodes))
  int tileColumns = 0;     // tiles per row inside a node; 0 = automatic (see tileColumnsFor)
  // A node box is at least this wide, so a one- or two-device node has room for its header ("node0 · cpu × 1
  // · shm · 10 GB/s · 1 µs"); its tiles stay at the left.
  double minNodeWidth = 300;
};

class MeshGeometry {
 public:
  MeshGeometry() = default;
  // devicesPerNode: devices of each node (a negative count counts as 0: the config may be mid-edit).
  explicit MeshGeometry(std::vector<int> devicesPerNode, const MeshGeometryParams& params = {});
  static MeshGeometry fromMesh(const MeshConfig& mesh, const MeshGeometryParams& params = {});
  // The automatic tile columns for a node of n devices: a row for up to 4, else about twice as wide as
  // tall (8 devices: 4 x 2), which suits a landscape window.
  static int tileColumnsFor(int devices);

  int nodeCount() const { return static_cast<int>(m_counts.size()); }
  int deviceCount() const { return m_total; }
  int devicesInNode(int node) const;
  int firstDeviceOf(int node) const;   // global index of the node's first device
  int nodeOfDevice(int device) const;  // -1 when out of range
  int localIndex(int device) const;    // index within its node, -1 when out of range
  int nodeColumns() const { return m_nodeColumns; }
  int tileColumns() const { return m_tileColumns; }
  const MeshGeometryParams& params() const { return m_params; }

  QRectF nodeRect(int node) const;    // empty for an index out of range
  QRectF tileRect(int device) const;  // empty for an index out of range
  QRectF headerRect(int node) const;  // the node box's top band
  int deviceAt(const QPointF& scenePos) const;
  int nodeAt(const QPointF& scenePos) const;  // inside a node box (header and gaps between its tiles too)
  QRectF sceneRect() const;                   // every node box, from (0, 0)

 private:
  QSizeF nodeSize() const;
  MeshGeometryParams m_params;
  std::vector<int> m_counts;  // devices of each node
  std::vector<int> m_first;   // global index of each node's first device (N + 1 entries)
  int m_total = 0;
  int m_nodeColumns = 1;
  int m_tileColumns = 1;
  int m_tileRows = 1;  // rows of the largest node
};

}  // namespace ms
