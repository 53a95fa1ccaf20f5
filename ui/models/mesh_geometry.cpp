// MeshGeometry; see mesh_geometry.h. Hit tests are arithmetic (cell by division, then a containment check)
// rather than a search over tiles, so a 1024-device mesh answers as fast as an 8-device one.
#include "ui/models/mesh_geometry.h"

#include <algorithm>
#include <cmath>

namespace ms {

MeshGeometry::MeshGeometry(std::vector<int> devicesPerNode, const MeshGeometryParams& params)
    : m_params(params), m_counts(std::move(devicesPerNode)) {
  m_first.reserve(m_counts.size() + 1);
  m_first.push_back(0);
  int largest = 0;
  for (int& c : m_counts) {
    c = std::max(c, 0);
    largest = std::max(largest, c);
    m_total += c;
    m_first.push_back(m_total);
  }
  const int nodes = nodeCount();
  m_nodeColumns = params.nodeColumns > 0
                      ? params.nodeColumns
                      : std::max(1, static_cast<int>(std::ceil(std::sqrt(static_cast<double>(nodes)))));
  m_tileColumns = params.tileColumns > 0 ? params.tileColumns : tileColumnsFor(largest);
  m_tileRows = std::max(1, (largest + m_tileColumns - 1) / m_tileColumns);
}

MeshGeometry MeshGeometry::fromMesh(const MeshConfig& mesh, const MeshGeometryParams& params) {
  std::vector<int> counts;
  counts.reserve(mesh.nodes.size());
  for (const NodeConfig& n : mesh.nodes) counts.push_back(n.count);
  return MeshGeometry(std::move(counts), params);
}

int MeshGeometry::tileColumnsFor(int devices) {
  if (devices <= 4) return std::max(1, devices);
  return static_cast<int>(std::ceil(std::sqrt(2.0 * devices)));
}

int MeshGeometry::devicesInNode(int node) const {
  return node >= 0 && node < nodeCount() ? m_counts[static_cast<size_t>(node)] : 0;
}

int MeshGeometry::firstDeviceOf(int node) const {
  return node >= 0 && node <= nodeCount() ? m_first[static_cast<size_t>(node)] : -1;
}

int MeshGeometry::nodeOfDevice(int device) const {
  if (device < 0 || device >= m_total) return -1;
  // The last node whose first device is <= device (nodes with no device share a first index; skip them).
  const auto it = std::upper_bound(m_first.begin(), m_first.end(), device);
  return static_cast<int>(it - m_first.begin()) - 1;
}

int MeshGeometry::localIndex(int device) const {
  const int node = nodeOfDevice(device);
  return node < 0 ? -1 : device - m_first[static_cast<size_t>(node)];
}

QSizeF MeshGeometry::nodeSize() const {
  const MeshGeometryParams& p = m_params;
  const double w = std::max(
      p.minNodeWidth, 2 * p.nodePadding + m_tileColumns * p.tile.width() + (m_tileColumns - 1) * p.tileGap);
  const double h =
      p.nodeHeader + 2 * p.nodePadding + m_tileRows * p.tile.height() + (m_tileRows - 1) * p.tileGap;
  return {w, h};
}

QRectF MeshGeometry::nodeRect(int node) const {
  if (node < 0 || node >= nodeCount()) return {};
  const QSizeF size = nodeSize();
  const int row = node / m_nodeColumns;
  const int col = node % m_nodeColumns;
  return {QPointF(col * (size.width() + m_params.nodeGap), row * (size.height() + m_params.nodeGap)), size};
}

QRectF MeshGeometry::headerRect(int node) const {
  const QRectF box = nodeRect(node);
  if (box.isEmpty()) return {};
  return {box.topLeft(), QSizeF(box.width(), m_params.nodeHeader)};
}

QRectF MeshGeometry::tileRect(int device) const {
  const int node = nodeOfDevice(device);
  if (node < 0) return {};
  const int local = device - m_first[static_cast<size_t>(node)];
  const QRectF box = nodeRect(node);
  const MeshGeometryParams& p = m_params;
  const int row = local / m_tileColumns;
  const int col = local % m_tileColumns;
  const double x = box.left() + p.nodePadding + col * (p.tile.width() + p.tileGap);
  const double y = box.top() + p.nodeHeader + p.nodePadding + row * (p.tile.height() + p.tileGap);
  return {QPointF(x, y), p.tile};
}

int MeshGeometry::nodeAt(const QPointF& pos) const {
  if (nodeCount() == 0 || pos.x() < 0 || pos.y() < 0) return -1;
  const QSizeF size = nodeSize();
  const int col = static_cast<int>(pos.x() / (size.width() + m_params.nodeGap));
  const int row = static_cast<int>(pos.y() / (size.height() + m_params.nodeGap));
  if (col >= m_nodeColumns) return -1;
  const int node = row * m_nodeColumns + col;
  if (node >= nodeCount()) return -1;
  return nodeRect(node).contains(pos) ? node : -1;
}

int MeshGeometry::deviceAt(const QPointF& pos) const {
  const int node = nodeAt(pos);
  if (node < 0) return -1;
  const QRectF box = nodeRect(node);
  const MeshGeometryParams& p = m_params;
  const double x = pos.x() - box.left() - p.nodePadding;
  const double y = pos.y() - box.top() - p.nodeHeader - p.nodePadding;
  if (x < 0 || y < 0) return -1;
  const int col = static_cast<int>(x / (p.tile.width() + p.tileGap));
  const int row = static_cast<int>(y / (p.tile.height() + p.tileGap));
  if (col >= m_tileColumns || row >= m_tileRows) return -1;
  const int local = row * m_tileColumns + col;
  if (local >= m_counts[static_cast<size_t>(node)]) return -1;
  const int device = m_first[static_cast<size_t>(node)] + local;
  // The cell includes the gap after the tile; only the tile itself counts.
  return tileRect(device).contains(pos) ? device : -1;
}

QRectF MeshGeometry::sceneRect() const {
  if (nodeCount() == 0) return {};
  const QSizeF size = nodeSize();
  const int cols = std::min(m_nodeColumns, nodeCount());
  const int rows = (nodeCount() + m_nodeColumns - 1) / m_nodeColumns;
  return {0, 0, cols * size.width() + (cols - 1) * m_params.nodeGap,
          rows * size.height() + (rows - 1) * m_params.nodeGap};
}

}  // namespace ms
