// The scene items of the mesh canvas (internal to ui/views/mesh_canvas.cpp): NodeItem draws one node (its
// box, header, device tiles and TP-group outlines), OverlayItem a box of text in viewport pixels (the drop
// message).
//
// Level of detail (what a NodeItem draws at a zoom): text is always drawn in the UI font at its own pixel
// size, never scaled with the view, and only the lines that fit a tile are drawn (the tooltip has them all);
// tiles too small for a line of text are plain colour, without outlines; nodes too small for their tiles to
// be told apart are drawn as aggregates (one box, its stages as colour bands, its name when it fits).
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
#include <QSizeF>
#include <QString>
#include <string>
#include <vector>

#include "plan/run_config.h"

namespace ms {

class MeshCanvas;

namespace canvas_detail {

// Over-capacity tiles, a drag over a device that holds no stage, and the border of a refusal message.
inline const QColor kRefuseColor(211, 47, 47);
// Tiles narrower than this (pixels) are drawn as parts of their node's aggregate, without text.
inline constexpr double kOutlinedTilePx = 10;
// The tile's text area inside its rectangle (scene units).
inline constexpr double kTileTextMarginX = 4, kTileTextMarginY = 2;

// How many of `available` lines of text in `font` (at its own pixel size) fit a rectangle of `pixels`: 0 when
// not even three characters fit across it.
int linesThatFit(QSizeF pixels, const QFont& font, int available);

// "nvlink · 370 GB/s · 3 µs", resolved like buildMesh (the config's own types first, then the catalog).
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
  // A tile's fill (one band per stage when ranks of several stages share it) and, with the current pen, its
  // outline.
  void fillTile(QPainter* p, int device, const QRectF& r, bool rounded) const;
  const MeshCanvas* m_canvas;
  int m_node;
  bool m_outlinesDone = false;
  std::vector<QPainterPath> m_outlines;  // one per TP group with several tiles in this node
};

// Text in a box, drawn in viewport pixels at a corner of the viewport: the drop message (the legend is a
// panel beside the canvas, so nothing lasting covers the tiles).
class OverlayItem : public QGraphicsItem {
 public:
  OverlayItem() {
    setFlag(ItemIgnoresTransformations);
    setAcceptedMouseButtons(Qt::NoButton);
    setZValue(10);
  }
  void setText(const QString& text, const QColor& border, const QColor& fill, const QFont& font);
  QString text() const { return m_text; }
  QRectF boundingRect() const override { return m_rect; }
  void paint(QPainter* p, const QStyleOptionGraphicsItem*, QWidget*) override;

 private:
  static constexpr double kWidth = 560;
  static constexpr double kPad = 8;
  QFont m_font;
  QString m_text;
  QColor m_border, m_fill;
  QRectF m_textRect, m_rect;
};

}  // namespace canvas_detail
}  // namespace ms
