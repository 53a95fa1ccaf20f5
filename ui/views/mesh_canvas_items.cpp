// NodeItem and OverlayItem; see mesh_canvas_items.h.
#include "ui/views/mesh_canvas_items.h"

#include <QFontMetricsF>
#include <QPainter>
#include <QStyleOptionGraphicsItem>
#include <algorithm>
#include <map>
#include <utility>

#include "plan/hardware.h"
#include "ui/views/mesh_canvas.h"

namespace ms::canvas_detail {

namespace {

constexpr double kRoundedTilePx = 24;  // from this width tiles get rounded, antialiased outlines
const QColor kAcceptColor(25, 118, 210);
const QColor kNodeFill(247, 247, 247);

// Lines of text in `sceneRect`, in `font` at its own pixel size whatever the view's zoom: as many whole lines
// as fit, each elided to the width. Returns the number of lines drawn.
int drawLines(QPainter* p, const QRectF& sceneRect, const QStringList& lines, const QFont& font,
              Qt::Alignment align = Qt::AlignLeft) {
  const QFontMetricsF fm(font);
  const QRectF r = p->worldTransform().mapRect(sceneRect);
  const double lineHeight = fm.height();
  const int n = linesThatFit(r.size(), font, static_cast<int>(lines.size()));
  if (n <= 0) return 0;
  p->save();
  p->resetTransform();
  p->setFont(font);
  const double top = r.top() + (r.height() - n * lineHeight) / 2;
  for (int i = 0; i < n; ++i)
    p->drawText(QRectF(r.left(), top + i * lineHeight, r.width(), lineHeight), align | Qt::AlignVCenter,
                fm.elidedText(lines[i], Qt::ElideRight, r.width()));
  p->restore();
  return n;
}

}  // namespace

int linesThatFit(QSizeF pixels, const QFont& font, int available) {
  const QFontMetricsF fm(font);
  if (pixels.width() < 3 * fm.averageCharWidth()) return 0;
  return std::clamp(static_cast<int>(pixels.height() / fm.height()), 0, available);
}

QRectF NodeItem::boundingRect() const {
  return m_canvas->meshGeometry().nodeRect(m_node).adjusted(-6, -6, 6, 6);
}

const std::vector<QPainterPath>& NodeItem::outlines() {
  if (m_outlinesDone) return m_outlines;
  m_outlinesDone = true;
  const MeshGeometry& g = m_canvas->meshGeometry();
  const MeshRanks& ranks = m_canvas->ranks();
  if (!ranks.ok() || ranks.layout.tp() < 2) return m_outlines;
  // A group's shape: its tiles grown by kGrow plus the gaps between neighbours of the group, so a group
  // reads as one plate and two neighbouring groups stay apart (kGrow is under half the tile gap).
  constexpr double kGrow = 2;
  const double gap = g.params().tileGap;
  const int cols = g.tileColumns();
  const int first = g.firstDeviceOf(m_node);
  const int count = g.devicesInNode(m_node);
  const auto groupOf = [&](int local) {
    const int rank = local < count ? ranks.firstRank(first + local) : -1;
    return rank < 0 ? -1 : rank / ranks.layout.tp();
  };
  std::map<int, QPainterPath> groups;
  std::map<int, int> members;
  for (int local = 0; local < count; ++local) {
    const int group = groupOf(local);
    if (group < 0) continue;
    const QRectF t = g.tileRect(first + local);
    QPainterPath shape;
    shape.addRect(t.adjusted(-kGrow, -kGrow, kGrow, kGrow));
    const bool right = local % cols + 1 < cols && groupOf(local + 1) == group;
    const bool below = groupOf(local + cols) == group;
    if (right) shape.addRect(QRectF(t.right() - 1, t.top() - kGrow, gap + 2, t.height() + 2 * kGrow));
    if (below) shape.addRect(QRectF(t.left() - kGrow, t.bottom() - 1, t.width() + 2 * kGrow, gap + 2));
    if (right && below && groupOf(local + cols + 1) == group)
      shape.addRect(QRectF(t.right() - 1, t.bottom() - 1, gap + 2, gap + 2));
    shape.setFillRule(Qt::WindingFill);
    groups[group] = groups[group].united(shape);
    ++members[group];
  }
  for (auto& [group, path] : groups)
    if (members[group] > 1) m_outlines.push_back(path.simplified());
  return m_outlines;
}

void NodeItem::fillTile(QPainter* p, int device, const QRectF& r, bool rounded) const {
  // Ranks of several stages on one device (ranks sharing a CPU): one vertical band per stage.
  const std::vector<int> stages = m_canvas->stagesOfDevice(device);
  if (stages.size() <= 1) {
    p->setBrush(m_canvas->tileColor(device));
    if (rounded)
      p->drawRoundedRect(r, 4, 4);
    else
      p->drawRect(r);
    return;
  }
  const QPen pen = p->pen();
  p->setPen(Qt::NoPen);
  const double w = r.width() / static_cast<double>(stages.size());
  for (size_t i = 0; i < stages.size(); ++i) {
    p->setBrush(MeshCanvas::stageColor(stages[i]));
    p->drawRect(QRectF(r.left() + w * static_cast<double>(i), r.top(), w, r.height()));
  }
  p->setPen(pen);
  p->setBrush(Qt::NoBrush);
  if (rounded)
    p->drawRoundedRect(r, 4, 4);
  else
    p->drawRect(r);
}

void NodeItem::paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) {
  const MeshGeometry& g = m_canvas->meshGeometry();
  const QRectF box = g.nodeRect(m_node);
  const qreal lod = option->levelOfDetailFromTransform(p->worldTransform());
  const QSizeF tilePx = g.params().tile * lod;
  const bool nodeSelected = m_canvas->selectedNode() == m_node;
  const int first = g.firstDeviceOf(m_node);
  const int count = g.devicesInNode(m_node);
  const QFont uiFont = m_canvas->font();
  QFont bold = uiFont;
  bold.setBold(true);

  if (tilePx.width() < kOutlinedTilePx) {
    // Aggregate: the node as one box, its devices as adjacent colour cells (stages read as bands), no
    // outlines; its name over the cells when a line of text fits.
    p->setRenderHint(QPainter::Antialiasing, false);
    p->setPen(nodeSelected ? QPen(kAcceptColor, 0) : Qt::NoPen);
    p->setBrush(QColor(150, 150, 150));
    p->drawRect(box);
    p->setPen(Qt::NoPen);
    const double gap = g.params().tileGap / 2;
    for (int d = first; d < first + count; ++d) {
      const QRectF r = g.tileRect(d).adjusted(-gap, -gap, gap, gap);
      if (!m_canvas->deviceFits(d)) {
        p->setBrush(kRefuseColor);
        p->drawRect(r);
        continue;
      }
      fillTile(p, d, r, false);
    }
    p->setPen(Qt::black);
    const QStringList name{m_canvas->nodeShortName(m_node)};
    const QRectF tiles = box.adjusted(0, g.params().nodeHeader, 0, 0);
    const QRectF px = p->worldTransform().mapRect(tiles);
    if (px.height() >= QFontMetricsF(uiFont).height() &&
        px.width() >= 6 * QFontMetricsF(uiFont).averageCharWidth()) {
      const double w = std::min(px.width(), QFontMetricsF(uiFont).horizontalAdvance(name[0]) + 6) / lod;
      const double h = QFontMetricsF(uiFont).height() / lod;
      const QRectF label(tiles.center().x() - w / 2, tiles.center().y() - h / 2, w, h);
      p->setBrush(QColor(255, 255, 255, 200));
      p->setPen(Qt::NoPen);
      p->drawRect(label);
      p->setPen(Qt::black);
      drawLines(p, label, name, uiFont, Qt::AlignHCenter);
    }
  } else {
    p->setRenderHint(QPainter::Antialiasing, tilePx.width() >= kRoundedTilePx);
    p->setPen(QPen(nodeSelected ? kAcceptColor : QColor(110, 110, 110), nodeSelected ? 2.5 : 1.2));
    p->setBrush(kNodeFill);
    p->drawRoundedRect(box, 6, 6);
    p->setPen(Qt::black);
    const QRectF header = g.headerRect(m_node).adjusted(8, 2, -8, 0);
    drawLines(p, header, {m_canvas->nodeHeader(m_node)}, bold);
    // Tensor-parallel groups: a plate under their tiles, outlined after the tiles are drawn.
    const bool detailed = tilePx.width() >= kRoundedTilePx;
    if (detailed) {
      p->setPen(Qt::NoPen);
      p->setBrush(QColor(40, 40, 40, 60));
      for (const QPainterPath& path : outlines()) p->drawPath(path);
    }
    for (int d = first; d < first + count; ++d) {
      const QRectF r = g.tileRect(d);
      const bool fits = m_canvas->deviceFits(d);
      p->setPen(QPen(fits ? QColor(80, 80, 80) : kRefuseColor, fits ? 0.8 : 2.5));
      fillTile(p, d, r, detailed);
      p->setPen(Qt::black);
      drawLines(p, r.adjusted(kTileTextMarginX, kTileTextMarginY, -kTileTextMarginX, -kTileTextMarginY),
                m_canvas->tileLabel(d).split('\n'), uiFont);
    }
    if (detailed) {
      p->setBrush(Qt::NoBrush);
      p->setPen(QPen(QColor(30, 30, 30), 1.2, Qt::DashLine));
      for (const QPainterPath& path : outlines()) p->drawPath(path);
    }
  }
  p->setBrush(Qt::NoBrush);
  const int selected = m_canvas->selectedDevice();
  if (g.nodeOfDevice(selected) == m_node) {
    p->setPen(QPen(kAcceptColor, 2.5, Qt::DotLine));
    p->drawRoundedRect(g.tileRect(selected).adjusted(-1.5, -1.5, 1.5, 1.5), 5, 5);
  }
  const int highlight = m_canvas->highlightedDevice();
  if (g.nodeOfDevice(highlight) == m_node) {
    p->setPen(QPen(m_canvas->highlightAcceptable() ? kAcceptColor : kRefuseColor, 4));
    p->drawRoundedRect(g.tileRect(highlight).adjusted(-2, -2, 2, 2), 5, 5);
  }
}

void OverlayItem::setText(const QString& text, const QColor& border, const QColor& fill, const QFont& font) {
  prepareGeometryChange();
  m_text = text;
  m_border = border;
  m_fill = fill;
  m_font = font;
  const QFontMetricsF fm(m_font);
  m_textRect = fm.boundingRect(QRectF(0, 0, kWidth, 10000), Qt::TextWordWrap, m_text);
  m_textRect.moveTopLeft(QPointF(kPad, kPad));
  m_rect = QRectF(0, 0, m_textRect.right() + kPad, m_textRect.bottom() + kPad);
}

void OverlayItem::paint(QPainter* p, const QStyleOptionGraphicsItem*, QWidget*) {
  p->setPen(QPen(m_border, 1.5));
  p->setBrush(m_fill);
  p->drawRoundedRect(m_rect, 5, 5);
  p->setFont(m_font);
  p->setPen(Qt::black);
  p->drawText(m_textRect, Qt::TextWordWrap, m_text);
}

QString linkText(const MeshConfig& mesh, const std::string& name) {
  std::optional<LinkSpec> spec;
  for (const LinkTypeConfig& t : mesh.linkTypes)
    if (t.name == name) spec = toLinkSpec(t);
  if (!spec) spec = findLink(name);
  const QString n = QString::fromStdString(name);
  if (!spec) return QObject::tr("%1 (unknown link type)").arg(n);
  return QStringLiteral("%1 · %2 GB/s · %3 µs%4")
      .arg(n)
      .arg(spec->bandwidth / 1e9, 0, 'g', 4)
      .arg(spec->latency * 1e6, 0, 'g', 3)
      .arg(spec->perDevice ? QObject::tr(" · a port per device") : QString());
}

}  // namespace ms::canvas_detail
