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

constexpr double kTextLod = 0.45;  // below this zoom tile labels would be unreadable: not drawn
constexpr double kHeaderLod = 0.3;
const QColor kAcceptColor(25, 118, 210);

}  // namespace

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

void NodeItem::paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) {
  const MeshGeometry& g = m_canvas->meshGeometry();
  const QRectF box = g.nodeRect(m_node);
  const qreal lod = option->levelOfDetailFromTransform(p->worldTransform());
  const bool nodeSelected = m_canvas->selectedNode() == m_node;
  p->setPen(QPen(nodeSelected ? kAcceptColor : QColor(110, 110, 110), nodeSelected ? 2.5 : 1.2));
  p->setBrush(QColor(247, 247, 247));
  p->drawRoundedRect(box, 6, 6);
  if (lod > kHeaderLod) {
    QFont f = p->font();
    f.setPointSizeF(8);
    f.setBold(true);
    p->setFont(f);
    p->setPen(Qt::black);
    const QRectF header = g.headerRect(m_node).adjusted(8, 2, -8, 0);
    const QString text = m_canvas->nodeHeader(m_node);
    p->drawText(header, Qt::AlignLeft | Qt::AlignVCenter,
                p->fontMetrics().elidedText(text, Qt::ElideRight, int(header.width())));
  }
  // Tensor-parallel groups: a plate under their tiles, outlined after the tiles are drawn.
  p->setPen(Qt::NoPen);
  p->setBrush(QColor(40, 40, 40, 60));
  for (const QPainterPath& path : outlines()) p->drawPath(path);
  QFont small = p->font();
  small.setBold(false);
  small.setPointSizeF(7);
  p->setFont(small);
  const int first = g.firstDeviceOf(m_node);
  const int count = g.devicesInNode(m_node);
  for (int d = first; d < first + count; ++d) {
    const QRectF r = g.tileRect(d);
    const bool fits = m_canvas->deviceFits(d);
    p->setPen(QPen(fits ? QColor(80, 80, 80) : kRefuseColor, fits ? 0.8 : 2.5));
    p->setBrush(m_canvas->tileColor(d));
    p->drawRoundedRect(r, 4, 4);
    if (lod > kTextLod) {
      p->setPen(Qt::black);
      const QRectF inner = r.adjusted(5, 3, -5, -3);
      const QStringList lines = m_canvas->tileLabel(d).split('\n');
      const double lineHeight = inner.height() / std::max<qsizetype>(3, lines.size());
      for (int i = 0; i < lines.size(); ++i)
        p->drawText(QRectF(inner.left(), inner.top() + i * lineHeight, inner.width(), lineHeight),
                    Qt::AlignLeft | Qt::AlignVCenter,
                    p->fontMetrics().elidedText(lines[i], Qt::ElideRight, int(inner.width())));
    }
  }
  p->setBrush(Qt::NoBrush);
  p->setPen(QPen(QColor(30, 30, 30), 1.2, Qt::DashLine));
  for (const QPainterPath& path : outlines()) p->drawPath(path);
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

void OverlayItem::setText(const QString& text, const QColor& border, const QColor& fill,
                          std::vector<Swatch> swatches) {
  prepareGeometryChange();
  m_text = text;
  m_border = border;
  m_fill = fill;
  m_swatches = std::move(swatches);
  const QFontMetricsF fm(m_font);
  m_textRect = fm.boundingRect(QRectF(0, 0, kWidth, 10000), Qt::TextWordWrap, m_text);
  m_textRect.moveTopLeft(QPointF(kPad, kPad));
  // Swatches flow in rows under the text.
  m_swatchRects.clear();
  double x = kPad, y = m_textRect.bottom() + 4, right = m_textRect.right();
  for (const Swatch& s : m_swatches) {
    const double w = fm.height() + 4 + fm.horizontalAdvance(s.label) + 12;
    if (x > kPad && x + w > kPad + kWidth) {
      x = kPad;
      y += fm.height() + 4;
    }
    m_swatchRects.push_back(QRectF(x, y, w, fm.height()));
    x += w;
    right = std::max(right, x);
  }
  const double bottom = m_swatchRects.empty() ? m_textRect.bottom() : m_swatchRects.back().bottom();
  m_rect = QRectF(0, 0, right + kPad, bottom + kPad);
}

void OverlayItem::paint(QPainter* p, const QStyleOptionGraphicsItem*, QWidget*) {
  p->setPen(QPen(m_border, 1.5));
  p->setBrush(m_fill);
  p->drawRoundedRect(m_rect, 5, 5);
  p->setFont(m_font);
  p->setPen(Qt::black);
  p->drawText(m_textRect, Qt::TextWordWrap, m_text);
  for (size_t i = 0; i < m_swatches.size(); ++i) {
    const QRectF r = m_swatchRects[i];
    p->setPen(QColor(80, 80, 80));
    p->setBrush(m_swatches[i].color);
    p->drawRect(QRectF(r.left(), r.top() + 1, r.height() - 2, r.height() - 2));
    p->setPen(Qt::black);
    p->drawText(r.adjusted(r.height() + 2, 0, 0, 0), Qt::AlignLeft | Qt::AlignVCenter, m_swatches[i].label);
  }
}

QString linkText(const MeshConfig& mesh, const std::string& name) {
  std::optional<LinkSpec> spec;
  for (const LinkTypeConfig& t : mesh.linkTypes)
    if (t.name == name) spec = toLinkSpec(t);
  if (!spec) spec = findLink(name);
  const QString n = QString::fromStdString(name);
  if (!spec) return QObject::tr("%1 (unknown link type)").arg(n);
  return QStringLiteral("%1 · %2 GB/s · %3 µs")
      .arg(n)
      .arg(spec->bandwidth / 1e9, 0, 'g', 4)
      .arg(spec->latency * 1e6, 0, 'g', 3);
}

}  // namespace ms::canvas_detail
