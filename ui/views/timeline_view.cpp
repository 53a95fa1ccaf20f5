// The timeline view; see timeline_view.h.
#include "ui/views/timeline_view.h"

#include <QContextMenuEvent>
#include <QFontMetrics>
#include <QHelpEvent>
#include <QKeyEvent>
#include <QMenu>
#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <QWheelEvent>
#include <algorithm>
#include <cmath>

namespace ms {

namespace {

constexpr double kHitTolerancePx = 2.0;
const QColor kHeaderBackground(243, 244, 246);
const QColor kGridLine(229, 231, 235);
const QColor kAxisText(55, 65, 81);
const QColor kGroupBackground(229, 231, 235);
const QColor kOutdatedBackground(254, 243, 199);
const QColor kOutdatedText(146, 64, 14);

// F, B and W take their microbatch's hue; the other kinds have one colour each.
bool runsMicrobatchWork(SpanKind kind) {
  return kind == SpanKind::Forward || kind == SpanKind::Backward || kind == SpanKind::BackwardWeight;
}

QRgb fixedColour(SpanKind kind) {
  switch (kind) {
    case SpanKind::Send:
      return qRgb(14, 154, 167);
    case SpanKind::GradSync:
      return qRgb(242, 142, 43);
    case SpanKind::Recv:
      return qRgb(210, 210, 210);
    case SpanKind::Optimizer:
      return qRgb(38, 50, 56);
    case SpanKind::HostToDevice:
      return qRgb(124, 77, 255);
    case SpanKind::DeviceToHost:
      return qRgb(194, 24, 91);
    case SpanKind::ParamGather:
      return qRgb(46, 125, 50);
    default:
      return qRgb(150, 150, 150);
  }
}

// Hatched kinds are drawn with a pattern over their fill when wide enough to show it.
bool hatched(SpanKind kind) {
  return kind == SpanKind::BackwardWeight || kind == SpanKind::Recv;
}

QString spanLabel(const TimelineSpan& s, bool withChunk) {
  QString letter;
  switch (s.kind) {
    case SpanKind::Forward:
      letter = QStringLiteral("F");
      break;
    case SpanKind::Backward:
      letter = QStringLiteral("B");
      break;
    case SpanKind::BackwardWeight:
      letter = QStringLiteral("W");
      break;
    case SpanKind::Optimizer:
      return QStringLiteral("opt");
    case SpanKind::Recv:
      return QStringLiteral("wait");
    default:
      return {};
  }
  QString out = letter + (s.microbatch >= 0 ? QString::number(s.microbatch) : QString());
  if (withChunk && s.chunk >= 0) out += QStringLiteral(" c%1").arg(s.chunk);
  return out;
}

}  // namespace

std::size_t TimelineView::LaneIndex::firstReaching(double t) const {
  return static_cast<std::size_t>(std::lower_bound(maxEnd.begin(), maxEnd.end(), t) - maxEnd.begin());
}

TimelineView::TimelineView(QWidget* parent) : QWidget(parent) {
  setMouseTracking(true);
  setFocusPolicy(Qt::WheelFocus);
  setAttribute(Qt::WA_OpaquePaintEvent);
  m_axis.fit(0, 1e-3);
}

QColor TimelineView::spanColor(const TimelineSpan& span) {
  // Through QRgb: an 8-bit RGB colour compares equal to the pixels it paints.
  return QColor(kindColour(span).rgb());
}

QColor TimelineView::kindColour(const TimelineSpan& span) {
  if (!runsMicrobatchWork(span.kind)) return QColor(fixedColour(span.kind));
  // Microbatches take hues a golden angle apart, so neighbours differ and the palette never runs out; the
  // kind sets the lightness (F light, B dark, W muted between them).
  const bool hasMb = span.microbatch >= 0;
  const int hue = hasMb ? static_cast<int>(std::fmod(span.microbatch * 137.508, 360.0)) : 0;
  const int sat = hasMb ? 170 : 0;
  if (span.kind == SpanKind::Forward) return QColor::fromHsl(hue, sat, 185);
  if (span.kind == SpanKind::Backward) return QColor::fromHsl(hue, sat, 100);
  return QColor::fromHsl(hue, hasMb ? 70 : 0, 145);
}

QRgb TimelineView::colourOf(const TimelineSpan& span) const {
  if (!runsMicrobatchWork(span.kind)) return fixedColour(span.kind);
  const int k = span.kind == SpanKind::Forward ? 0 : span.kind == SpanKind::Backward ? 1 : 2;
  const std::size_t i = static_cast<std::size_t>(span.microbatch) * 3 + static_cast<std::size_t>(k);
  if (span.microbatch >= 0 && i < m_microbatchColours.size()) return m_microbatchColours[i];
  return spanColor(span).rgb();
}

void TimelineView::setData(std::shared_ptr<const TimelineData> data) {
  const bool first = !m_data;
  m_data = std::move(data);
  m_labelCache.clear();
  rebuildIndex();
  rebuildGroups();
  m_axis.setMaxSpan(dataMaxSpan());
  if (first || m_followData) {
    fitAll();
  } else {
    update();
  }
}

void TimelineView::rebuildGroups() {
  m_groups = m_data ? TimelineGroups(*m_data, m_expandedStages) : TimelineGroups();
  m_rowHeaders.clear();
  m_layout.setRowCount(m_groups.displayRowCount());
  m_layout.scrollTo(m_layout.scrollY(), height());
  // The labels column fits its widest label with its bubble (the first rows stand for the rest: a stage's
  // ranks are labelled alike, and measuring 16384 labels would cost more than it tells).
  const QFontMetrics fm(font());
  int widest = fm.horizontalAdvance(m_title) + 12;
  const int n = std::min(displayRowCount(), 512);
  for (int i = 0; i < n; ++i) {
    const RowHeaderText& h = rowHeader(i);
    widest = std::max(widest, h.labelWidth + (h.bubbleWidth > 0 ? h.bubbleWidth + 10 : 0) + 16);
  }
  const int w = std::clamp(widest, kMinHeaderWidth, kMaxHeaderWidth);
  m_rowHeaders.clear();  // laid out again at the width the column gets
  if (w != m_preferredHeaderWidth) {
    m_preferredHeaderWidth = w;
    emit preferredHeaderWidthChanged(w);
  }
  update();
}

void TimelineView::setStageExpanded(int stage, bool expanded) {
  if (expanded == isStageExpanded(stage)) return;
  if (expanded)
    m_expandedStages.insert(stage);
  else
    m_expandedStages.erase(stage);
  rebuildGroups();
}

void TimelineView::setAllExpanded(bool expanded) {
  m_expandedStages.clear();
  if (expanded)
    for (const TimelineGroup& g : m_groups.groups()) m_expandedStages.insert(g.stage);
  rebuildGroups();
}

int TimelineView::headerWidth() const {
  return m_fixedHeaderWidth > 0 ? m_fixedHeaderWidth : m_preferredHeaderWidth;
}

void TimelineView::setHeaderWidth(int pixels) {
  pixels = pixels > 0 ? std::max(pixels, kMinHeaderWidth) : 0;
  if (pixels == m_fixedHeaderWidth) return;
  m_fixedHeaderWidth = pixels;
  m_rowHeaders.clear();
  update();
}

void TimelineView::setOutdated(const QString& reason) {
  if (reason == m_outdated) return;
  m_outdated = reason;
  update();
}

void TimelineView::setTitle(const QString& title) {
  m_title = title;
  update();
}

double TimelineView::dataMaxSpan() const {
  // Zooming out past ten times the step shows nothing new.
  const double extent = m_data ? m_data->end - m_data->begin : 0;
  return std::max(1e-3, 10 * extent);
}

void TimelineView::rebuildIndex() {
  // Rows are indexed when first painted or hit-tested (rowIndex): a 1024-rank plan has a million spans, of
  // which one screen shows a few dozen rows, and a view on a hidden tab shows none.
  m_index.assign(m_data ? m_data->rows.size() : 0, RowIndex{});
  m_microbatchColours.clear();
}

const TimelineView::RowIndex& TimelineView::rowIndex(int r) const {
  RowIndex& index = m_index[static_cast<std::size_t>(r)];
  if (index.built) return index;
  index.built = true;
  const std::vector<TimelineSpan>& spans = m_data->rows[static_cast<std::size_t>(r)].spans;
  for (LaneIndex& lane : index.lanes) {
    lane.spans.reserve(spans.size());
    lane.maxEnd.reserve(spans.size());
  }
  int firstChunk = -1, microbatches = 0;
  for (std::uint32_t i = 0; i < spans.size(); ++i) {
    LaneIndex& lane = index.lanes[laneOf(spans[i].kind)];
    const double prev = lane.maxEnd.empty() ? spans[i].end : lane.maxEnd.back();
    lane.spans.push_back(i);
    lane.maxEnd.push_back(std::max(prev, spans[i].end));
    microbatches = std::max(microbatches, spans[i].microbatch + 1);
    // Only F, B and W: a transfer's chunk is its producer's, on the neighbouring stage.
    if (spans[i].chunk < 0 || !runsMicrobatchWork(spans[i].kind)) continue;
    if (firstChunk < 0) firstChunk = spans[i].chunk;
    if (spans[i].chunk != firstChunk) index.multiChunk = true;
  }
  // The colour table covers every microbatch of the rows indexed so far.
  for (int mb = static_cast<int>(m_microbatchColours.size() / 3); mb < microbatches; ++mb)
    for (SpanKind k : {SpanKind::Forward, SpanKind::Backward, SpanKind::BackwardWeight}) {
      TimelineSpan s;
      s.kind = k;
      s.microbatch = static_cast<std::int16_t>(mb);
      m_microbatchColours.push_back(spanColor(s).rgb());
    }
  return index;
}

TimeAxis TimelineView::axisFor(int widgetWidth) const {
  TimeAxis a = m_axis;
  a.setPixels(headerWidth(), widgetWidth - headerWidth() - kRightPad);
  return a;
}

RowLayout TimelineView::layoutFor(int widgetHeight) const {
  RowLayout l = m_layout;
  l.scrollTo(l.scrollY(), widgetHeight);
  return l;
}

void TimelineView::applyAxis(const TimeAxis& axis) {
  const bool changed = axis.t0() != m_axis.t0() || axis.t1() != m_axis.t1();
  m_axis = axis;
  m_followData = false;
  update();
  if (changed) emit viewRangeChanged(m_axis.t0(), m_axis.t1());
}

void TimelineView::fitAll() {
  if (m_data && m_data->end > m_data->begin)
    fitRange(m_data->begin, m_data->end);
  else
    fitRange(0, 0);
}

void TimelineView::fitRange(double begin, double end) {
  TimeAxis a = m_axis;
  if (end > begin)
    a.fit(begin, end, 0.02);
  else
    a.fit(0, 1e-3);
  const bool changed = a.t0() != m_axis.t0() || a.t1() != m_axis.t1();
  m_axis = a;
  m_followData = true;
  update();
  if (changed) emit viewRangeChanged(m_axis.t0(), m_axis.t1());
}

void TimelineView::zoomIn() {
  TimeAxis a = timeAxis();
  a.zoomAt(a.x0() + a.width() / 2, 2.0);
  applyAxis(a);
}

void TimelineView::zoomOut() {
  TimeAxis a = timeAxis();
  a.zoomAt(a.x0() + a.width() / 2, 0.5);
  applyAxis(a);
}

void TimelineView::setViewRange(double t0, double t1) {
  TimeAxis a = m_axis;
  a.setRange(t0, t1);
  applyAxis(a);
}

void TimelineView::scrollToRow(int row) {
  m_layout.scrollTo(row * m_layout.rowHeight(), height());
  update();
}

QSize TimelineView::sizeHint() const {
  return {900, std::min(600, kAxisHeight + std::max(2, m_layout.rowCount()) * kRowHeight + 2)};
}

std::optional<TimelineView::Hit> TimelineView::spanAt(QPoint pos) const {
  if (!m_data) return std::nullopt;
  const TimeAxis axis = timeAxis();
  const RowLayout layout = layoutFor(height());
  if (pos.x() < axis.x0() || pos.x() > axis.x0() + axis.width()) return std::nullopt;
  const int displayRow = layout.rowAt(pos.y());
  const int lane = layout.laneAt(pos.y());
  if (displayRow < 0 || lane < 0 || displayRow >= displayRowCount()) return std::nullopt;
  const int row = m_groups.displayRows()[static_cast<std::size_t>(displayRow)].dataRow;
  if (row < 0 || row >= static_cast<int>(m_index.size())) return std::nullopt;
  const std::vector<TimelineSpan>& spans = m_data->rows[row].spans;
  const LaneIndex& index = rowIndex(row).lanes[lane];
  // Pixel centres: the pixel column x covers [x, x + 1).
  const double t = axis.t(pos.x() + 0.5);
  const double tol = kHitTolerancePx * axis.secondsPerPixel();
  std::optional<std::size_t> best;
  double bestDistance = tol;
  for (std::size_t i = index.firstReaching(t - tol); i < index.spans.size(); ++i) {
    const TimelineSpan& s = spans[index.spans[i]];
    if (s.start > t + tol) break;
    if (!(s.end > s.start)) continue;
    const double distance = t < s.start ? s.start - t : t > s.end ? t - s.end : 0.0;
    // Ties (overlapping spans of the communication lane) go to the later one: it is drawn on top.
    if (distance <= bestDistance) {
      bestDistance = distance;
      best = index.spans[i];
    }
  }
  if (!best) return std::nullopt;
  return Hit{row, displayRow, lane, *best, spans[*best]};
}

QString TimelineView::toolTipText(const Hit& hit) const {
  const TimelineSpan& s = hit.span;
  QString text = QString::fromLatin1(toString(s.kind));
  if (m_data && s.layer >= 0)
    text += QStringLiteral(" — ") + (s.layer < m_data->layerNames.size()
                                         ? m_data->layerNames[s.layer]
                                         : QStringLiteral("layer %1").arg(s.layer));
  QStringList parts;
  if (s.microbatch >= 0) parts << QStringLiteral("microbatch %1").arg(s.microbatch);
  if (s.chunk >= 0) parts << QStringLiteral("chunk %1").arg(s.chunk);
  if (!parts.isEmpty()) text += QLatin1Char('\n') + parts.join(QStringLiteral(" · "));
  text += QStringLiteral("\nstart %1 · duration %2")
              .arg(formatDuration(s.start), formatDuration(s.end - s.start));
  if (m_data && hit.row >= 0 && hit.row < static_cast<int>(m_data->rows.size()))
    text += QLatin1Char('\n') + m_data->rows[hit.row].label;
  if (hit.displayRow >= 0 && hit.displayRow < displayRowCount()) {
    const TimelineDisplayRow& d = m_groups.displayRows()[static_cast<std::size_t>(hit.displayRow)];
    if (d.header)
      text += tr("\n(the last of stage %1's %2 ranks to finish; click the stage to list them all)")
                  .arg(m_groups.groups()[static_cast<std::size_t>(d.group)].stage)
                  .arg(m_groups.groups()[static_cast<std::size_t>(d.group)].rows.size());
  }
  return text;
}

QString TimelineView::displayRowText(int displayRow) const {
  if (displayRow < 0 || displayRow >= displayRowCount()) return {};
  const TimelineDisplayRow& d = m_groups.displayRows()[static_cast<std::size_t>(displayRow)];
  if (!d.header) return rowHeaderText(d.dataRow);
  const TimelineGroup& g = m_groups.groups()[static_cast<std::size_t>(d.group)];
  QString text = tr("stage %1 · %2 ranks").arg(g.stage).arg(g.rows.size());
  if (g.bubbleMax >= 0) {
    const int lo = qRound(100 * g.bubbleMin), hi = qRound(100 * g.bubbleMax);
    text += lo == hi ? tr(" — bubble %1%").arg(lo) : tr(" — bubble %1-%2%").arg(lo).arg(hi);
  }
  return text;
}

QString TimelineView::rowHeaderText(int row) const {
  if (!m_data || row < 0 || row >= static_cast<int>(m_data->rows.size())) return {};
  const TimelineRow& r = m_data->rows[row];
  QString text = r.label.isEmpty() ? QStringLiteral("rank %1").arg(r.rank) : r.label;
  if (r.bubbleFraction >= 0) text += QStringLiteral(" — bubble %1%").arg(qRound(100 * r.bubbleFraction));
  return text;
}

QImage TimelineView::render(QSize size) const {
  QImage image(size.expandedTo(QSize(1, 1)), QImage::Format_ARGB32_Premultiplied);
  QPainter p(&image);
  p.setFont(font());
  paint(p, image.size(), axisFor(image.width()), layoutFor(image.height()));
  return image;
}

void TimelineView::paintTo(QPainter& p, QSize size) const {
  p.save();
  p.setFont(font());
  paint(p, size, axisFor(size.width()), layoutFor(size.height()));
  p.restore();
}

void TimelineView::paintEvent(QPaintEvent*) {
  QPainter p(this);
  paint(p, size(), timeAxis(), layoutFor(height()));
}

void TimelineView::paint(QPainter& p, QSize size, const TimeAxis& axis, const RowLayout& layout) const {
  p.fillRect(QRect(QPoint(0, 0), size), backgroundColor());
  const int headerW = headerWidth();
  p.fillRect(QRect(0, 0, headerW, size.height()), kHeaderBackground);
  if (!m_data || m_data->rows.empty()) {
    p.setPen(kAxisText);
    p.drawText(
        QRect(QPoint(0, 0), size), Qt::AlignCenter,
        m_data ? tr("The timeline has no rows.") : tr("No timeline yet: the plan has not been simulated."));
    paintAxis(p, size, axis);
    return;
  }
  const int first = layout.firstVisibleRow();
  const int last = layout.lastVisibleRow(size.height());
  const QRect timeArea(static_cast<int>(axis.x0()), layout.headerHeight(), static_cast<int>(axis.width()),
                       size.height() - layout.headerHeight());
  const QFontMetrics fm(p.font());
  std::vector<float> acc;  // scratch for paintLane, reused by every lane
  for (int r = first; r <= last && r < displayRowCount(); ++r) {
    const int top = layout.yOfRow(r);
    const TimelineDisplayRow& d = m_groups.displayRows()[static_cast<std::size_t>(r)];
    // Row header: the label (elided) on the left, the bubble on the right where it is always whole.
    p.setClipRect(QRect(0, layout.headerHeight(), headerW, size.height()));
    if (d.header) p.fillRect(QRect(0, top, headerW, layout.rowHeight()), kGroupBackground);
    const TimelineRow& row = m_data->rows[static_cast<std::size_t>(d.dataRow)];
    const RowHeaderText& header = rowHeader(r);
    const double textTop = top + (layout.rowHeight() - fm.height()) / 2.0;
    p.setPen(kAxisText);
    p.drawStaticText(QPointF(d.member ? 18 : 6, textTop), header.label);
    if (header.bubbleWidth > 0) {
      const double worst =
          d.header ? m_groups.groups()[static_cast<std::size_t>(d.group)].bubbleMax : row.bubbleFraction;
      p.setPen(worst >= 0.25 ? QColor(180, 83, 9) : kAxisText);
      p.drawStaticText(QPointF(headerW - 8 - header.bubbleWidth, textTop), header.bubble);
    }
    p.setClipRect(QRect(0, layout.headerHeight(), size.width(), size.height()));
    p.fillRect(QRect(0, top + layout.rowHeight() - 1, size.width(), 1), kGridLine);
    p.setClipRect(timeArea);
    const RowIndex& index = rowIndex(d.dataRow);
    for (int lane = 0; lane < 2; ++lane)
      paintLane(p, row, index.lanes[lane], index.multiChunk, axis, layout.lane(r, lane), acc);
  }
  p.setClipping(false);
  if (!m_outdated.isEmpty()) {
    // Washed out, with the reason on a band over the rows: still readable, plainly not the current plan.
    p.fillRect(QRect(0, layout.headerHeight(), size.width(), size.height() - layout.headerHeight()),
               QColor(255, 255, 255, 150));
    const QString text = tr("Outdated: %1").arg(m_outdated);
    const QRect band(0, layout.headerHeight(), size.width(), fm.height() + 8);
    p.fillRect(band, kOutdatedBackground);
    p.setPen(kOutdatedText);
    p.drawText(band.adjusted(8, 0, -8, 0), Qt::AlignVCenter | Qt::AlignLeft,
               fm.elidedText(text, Qt::ElideRight, band.width() - 16));
  }
  // A scroll indicator when the rows do not all fit.
  const int viewport = size.height() - layout.headerHeight();
  if (layout.contentHeight() > viewport && viewport > 0) {
    const double f = double(viewport) / layout.contentHeight();
    const int h = std::max(12, int(viewport * f));
    const int y = layout.headerHeight() + int((viewport - h) * double(layout.scrollY()) /
                                              std::max(1, layout.maxScroll(size.height())));
    p.fillRect(QRect(size.width() - 6, y, 4, h), QColor(160, 160, 160));
  }
  paintAxis(p, size, axis);
}

void TimelineView::paintLane(QPainter& p, const TimelineRow& row, const LaneIndex& lane, bool multiChunk,
                             const TimeAxis& axis, RowLayout::Band band, std::vector<float>& acc) const {
  if (lane.spans.empty()) return;
  const int width = static_cast<int>(std::ceil(axis.width()));
  const int x0 = static_cast<int>(axis.x0());
  // Every span adds colour * coverage to the pixel columns it covers; the columns become one image line
  // stretched to the lane's height: one draw call per lane whatever the zoom, a column shared by several
  // spans blended as a person would see it from afar, a column inside one span exactly its colour. Only
  // decorations of wide spans (hatching, labels, a darker left edge) are drawn one by one.
  acc.assign(static_cast<std::size_t>(width) * 4, 0.0f);
  struct Edge {
    int column;
    QRgb rgb;
  };
  std::vector<Edge> edges;
  std::vector<std::pair<QRect, const TimelineSpan*>> decorated;
  int touchedLo = width, touchedHi = -1;
  const double t0 = axis.t0(), t1 = axis.t1();
  for (std::size_t i = lane.firstReaching(t0); i < lane.spans.size(); ++i) {
    const TimelineSpan& s = row.spans[lane.spans[i]];
    if (s.start > t1) break;
    if (s.end < t0 || !(s.end > s.start)) continue;
    const double xa = std::max(-2.0, axis.x(s.start) - x0);
    const double xb = std::min(width + 2.0, axis.x(s.end) - x0);
    const QRgb rgb = colourOf(s);
    const int lo = std::max(0, static_cast<int>(std::floor(xa)));
    const int hi = std::min(width - 1, static_cast<int>(std::ceil(xb)) - 1);
    const float r = float(qRed(rgb)), g = float(qGreen(rgb)), b = float(qBlue(rgb));
    for (int c = lo; c <= hi; ++c) {
      const float cover = static_cast<float>(std::min<double>(xb, c + 1) - std::max<double>(xa, c));
      if (cover <= 0) continue;
      float* a = &acc[static_cast<std::size_t>(c) * 4];
      a[0] += cover * r;
      a[1] += cover * g;
      a[2] += cover * b;
      a[3] += cover;
    }
    if (lo <= hi) touchedLo = std::min(touchedLo, lo), touchedHi = std::max(touchedHi, hi);
    if (xb - xa >= kMergeBelowPx) {
      const int left = static_cast<int>(std::lround(xa)), right = static_cast<int>(std::lround(xb));
      if (right - left >= 4 && left >= 0 && left < width)
        edges.push_back({left, qRgb(qRed(rgb) * 4 / 5, qGreen(rgb) * 4 / 5, qBlue(rgb) * 4 / 5)});
      if (hatched(s.kind) || (right - left >= 40 && band.height >= 12))
        decorated.push_back({QRect(x0 + left, band.top, std::max(1, right - left), band.height), &s});
    }
  }
  if (touchedHi < touchedLo) return;
  const int n = touchedHi - touchedLo + 1;
  QImage line(n, 1, QImage::Format_ARGB32_Premultiplied);
  QRgb* px = reinterpret_cast<QRgb*>(line.scanLine(0));
  for (int c = 0; c < n; ++c) {
    const float* a = &acc[static_cast<std::size_t>(touchedLo + c) * 4];
    if (a[3] <= 0) {
      px[c] = 0;
      continue;
    }
    // Premultiplied: the mean colour scaled by the covered fraction of the pixel.
    const float alpha = std::min(1.0f, a[3]);
    const float k = alpha / a[3];
    px[c] = qRgba(int(a[0] * k + 0.5f), int(a[1] * k + 0.5f), int(a[2] * k + 0.5f), int(alpha * 255 + 0.5f));
  }
  for (const Edge& e : edges) px[e.column - touchedLo] = e.rgb;
  p.drawImage(QRect(x0 + touchedLo, band.top, n, band.height), line);

  for (const auto& [rect, s] : decorated) {
    const QColor colour(colourOf(*s));
    if (hatched(s->kind)) p.fillRect(rect, QBrush(colour.darker(135), Qt::BDiagPattern));
    // A label where it fits in the left half, so it never covers the span's middle.
    if (rect.width() < 40 || band.height < 12) continue;
    const QStaticText& label = spanLabelText(*s, multiChunk);
    const QSizeF size = label.size();
    if (size.width() <= 0 || size.width() + 4 > rect.width() / 2 - 2) continue;
    p.setPen(colour.lightness() > 140 ? QColor(20, 20, 20) : QColor(250, 250, 250));
    p.drawStaticText(QPointF(rect.left() + 4, rect.top() + (rect.height() - size.height()) / 2), label);
  }
}

const TimelineView::RowHeaderText& TimelineView::rowHeader(int displayRow) const {
  if (m_rowHeaders.size() != m_groups.displayRows().size())
    m_rowHeaders.assign(m_groups.displayRows().size(), {});
  RowHeaderText& h = m_rowHeaders[static_cast<std::size_t>(displayRow)];
  if (h.ready) return h;
  const TimelineDisplayRow& d = m_groups.displayRows()[static_cast<std::size_t>(displayRow)];
  const TimelineRow& row = m_data->rows[static_cast<std::size_t>(d.dataRow)];
  const QFontMetrics fm(font());
  QString label, bubble;
  if (d.header) {
    const TimelineGroup& g = m_groups.groups()[static_cast<std::size_t>(d.group)];
    label = QStringLiteral("%1 ").arg(isStageExpanded(g.stage) ? QChar(0x25BE) : QChar(0x25B8)) +
            tr("stage %1 · %2 ranks").arg(g.stage).arg(g.rows.size());
    if (g.bubbleMax >= 0) {
      const int lo = qRound(100 * g.bubbleMin), hi = qRound(100 * g.bubbleMax);
      bubble = lo == hi ? tr("bubble %1%").arg(lo) : tr("bubble %1-%2%").arg(lo).arg(hi);
    }
  } else {
    label = row.label.isEmpty() ? tr("rank %1").arg(row.rank) : row.label;
    if (row.bubbleFraction >= 0) bubble = tr("bubble %1%").arg(qRound(100 * row.bubbleFraction));
  }
  h.bubbleWidth = bubble.isEmpty() ? 0 : fm.horizontalAdvance(bubble);
  h.labelWidth = fm.horizontalAdvance(label) + (d.member ? 12 : 0);
  const int room = headerWidth() - 14 - (d.member ? 12 : 0) - (h.bubbleWidth > 0 ? h.bubbleWidth + 8 : 0);
  h.label.setText(fm.elidedText(label, Qt::ElideRight, std::max(room, 10)));
  h.bubble.setText(bubble);
  for (QStaticText* t : {&h.label, &h.bubble}) {
    t->setTextFormat(Qt::PlainText);
    t->prepare(QTransform(), font());
  }
  h.ready = true;
  return h;
}

const QStaticText& TimelineView::spanLabelText(const TimelineSpan& s, bool withChunk) const {
  const std::uint64_t key = std::uint64_t(s.kind) | std::uint64_t(std::uint16_t(s.microbatch)) << 8 |
                            std::uint64_t(std::uint16_t(s.chunk)) << 24 | std::uint64_t(withChunk) << 40;
  auto it = m_labelCache.find(key);
  if (it == m_labelCache.end()) {
    QStaticText text(spanLabel(s, withChunk));
    text.setTextFormat(Qt::PlainText);
    text.prepare(QTransform(), font());
    it = m_labelCache.emplace(key, std::move(text)).first;
  }
  return it->second;
}

void TimelineView::paintAxis(QPainter& p, QSize size, const TimeAxis& axis) const {
  p.fillRect(QRect(0, 0, size.width(), kAxisHeight), kHeaderBackground);
  p.fillRect(QRect(0, kAxisHeight - 1, size.width(), 1), kGridLine.darker(115));
  p.setPen(kAxisText);
  const QFontMetrics fm(p.font());
  if (!m_title.isEmpty())
    p.drawText(QRect(6, 0, headerWidth() - 10, kAxisHeight), Qt::AlignVCenter | Qt::AlignLeft,
               fm.elidedText(m_title, Qt::ElideRight, headerWidth() - 10));
  const TimeTicks ticks = timeTicks(axis, 90);
  p.setClipRect(QRect(static_cast<int>(axis.x0()) - 40, 0, static_cast<int>(axis.width()) + 40 + kRightPad,
                      kAxisHeight));
  for (double t : ticks.times) {
    const int x = static_cast<int>(std::lround(axis.x(t)));
    p.fillRect(QRect(x, kAxisHeight - 7, 1, 6), kAxisText);
    const QString label = formatTick(t, ticks);
    const int w = fm.horizontalAdvance(label);
    p.drawText(QRect(x - w / 2 - 2, 2, w + 4, kAxisHeight - 10), Qt::AlignCenter, label);
  }
  p.setClipping(false);
}

void TimelineView::resizeEvent(QResizeEvent* event) {
  m_layout.scrollTo(m_layout.scrollY(), height());
  QWidget::resizeEvent(event);
}

void TimelineView::changeEvent(QEvent* event) {
  if (event->type() == QEvent::FontChange) {
    m_labelCache.clear();
    rebuildGroups();
  }
  QWidget::changeEvent(event);
}

}  // namespace ms
