// The scene items of the mesh canvas (internal to ui/views/mesh_canvas.cpp): NodeItem draws one node (its
// box, header, device tiles and TP-group outlines), OverlayItem a box of text in viewport pixels (the legend
// and the drop message).
//
// What always holds: the items take no mouse buttons (hit tests go through MeshGeometry in the canvas) and
// keep no copy of the mesh or the layout; a NodeItem reads everything from its canvas when it paints, so an
// update() is all a change needs. A NodeItem must not outlive its canvas.
#pragma once

#include <QColor>
#include <QFont>
#include <QGraphicsItem>
#include <QPainterPath>
#include <QRectF>
#include <QString>
#include <string>
#include <vector>

#include "plan/run_config.h"

namespace ms {

class MeshCanvas;

namespace canvas_detail {

// Over-capacity tiles, a drag over a device that holds no stage, and the border of a refusal message.
inline const QColor kRefuseColor(211, 47, 47);

// "nvlink · 450 GB/s · 3 µs", resolved like buildMesh (the config's own types first, then the catalog).
QString linkText(const MeshConfig& mesh, const std::string& name);

// One node: its box, its header (name, device type, intra-node link) and its device tiles with their labels
// and TP-group outlines. Reads everything from the canvas when painting, so an update() is all a change
// needs.
class NodeItem : public QGraphicsItem {
 public:
  NodeItem(const MeshCanvas* canvas, int node) : m_canvas(canvas), m_node(node) {
    setAcceptedMouseButtons(Qt::NoButton);
  }
  QRectF boundingRect() const override;
  void paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) override;

 private:
  const std::vector<QPainterPath>& outlines();
  const MeshCanvas* m_canvas;
  int m_node;
  bool m_outlinesDone = false;
  std::vector<QPainterPath> m_outlines;  // one per TP group with several tiles in this node
};

// Text in a box, drawn in viewport pixels at a corner of the viewport: the legend (with colour swatches
// after its text) and the drop message.
class OverlayItem : public QGraphicsItem {
 public:
  struct Swatch {
    QColor color;
    QString label;
  };
  OverlayItem() {
    setFlag(ItemIgnoresTransformations);
    setAcceptedMouseButtons(Qt::NoButton);
    setZValue(10);
    m_font.setPointSizeF(9);
  }
  void setText(const QString& text, const QColor& border, const QColor& fill,
               std::vector<Swatch> swatches = {});
  QString text() const { return m_text; }
  QRectF boundingRect() const override { return m_rect; }
  void paint(QPainter* p, const QStyleOptionGraphicsItem*, QWidget*) override;

 private:
  static constexpr double kWidth = 560;
  static constexpr double kPad = 8;
  QFont m_font;
  QString m_text;
  QColor m_border, m_fill;
  std::vector<Swatch> m_swatches;
  std::vector<QRectF> m_swatchRects;
  QRectF m_textRect, m_rect;
};

}  // namespace canvas_detail
}  // namespace ms
