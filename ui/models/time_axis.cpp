// Timeline geometry; see time_axis.h.
#include "ui/models/time_axis.h"

#include <algorithm>
#include <cmath>

namespace ms {

namespace {
bool finite(double v) {
  return std::isfinite(v);
}
}  // namespace

TimeAxis::TimeAxis(double t0, double t1, double x0, double width) {
  setPixels(x0, width);
  setRange(t0, t1);
}

void TimeAxis::setRange(double t0, double t1) {
  if (!finite(t0) || !finite(t1)) return;
  if (t1 < t0) std::swap(t0, t1);
  const double centre = 0.5 * (t0 + t1);
  const double span = std::clamp(t1 - t0, kMinSpan, m_maxSpan);
  if (span != t1 - t0) {
    t0 = centre - 0.5 * span;
    t1 = centre + 0.5 * span;
  }
  m_t0 = t0;
  m_t1 = t1;
}

void TimeAxis::setPixels(double x0, double width) {
  if (!finite(x0) || !finite(width)) return;
  m_x0 = x0;
  m_width = std::max(1.0, width);
}

void TimeAxis::setMaxSpan(double maxSpan) {
  if (!finite(maxSpan)) return;
  m_maxSpan = std::max(kMinSpan, maxSpan);
  setRange(m_t0, m_t1);
}

void TimeAxis::zoomAt(double x, double factor) {
  if (!finite(x) || !finite(factor) || factor <= 0) return;
  const double anchor = t(x);
  const double span = std::clamp(this->span() / factor, kMinSpan, m_maxSpan);
  // The anchor keeps its fraction of the width, so it stays under the same pixel.
  const double fraction = (x - m_x0) / m_width;
  m_t0 = anchor - fraction * span;
  m_t1 = m_t0 + span;
}

void TimeAxis::panBy(double dx) {
  if (!finite(dx)) return;
  const double dt = dx * secondsPerPixel();
  m_t0 -= dt;
  m_t1 -= dt;
}

void TimeAxis::fit(double begin, double end, double margin) {
  if (!finite(begin) || !finite(end) || !finite(margin)) return;
  if (end < begin) std::swap(begin, end);
  const double pad = std::max(0.0, margin) * (end - begin);
  setRange(begin - pad, end + pad);
}

TimeTicks timeTicks(const TimeAxis& axis, double minSpacing) {
  TimeTicks out;
  const double raw = std::max(1.0, minSpacing) * axis.secondsPerPixel();
  const double decade = std::pow(10.0, std::floor(std::log10(raw)));
  out.step = 10 * decade;
  for (double m : {1.0, 2.0, 5.0})
    if (m * decade >= raw * (1 - 1e-12)) {
      out.step = m * decade;
      break;
    }
  // The unit of the step's decade or the one above (0.5 ms rather than 500 us): labels of at most one
  // decimal and three digits before the point for a step at the origin.
  if (out.step >= 0.1 * (1 - 1e-12)) {
    out.unitScale = 1, out.unit = QStringLiteral("s");
  } else if (out.step >= 1e-4 * (1 - 1e-12)) {
    out.unitScale = 1e-3, out.unit = QStringLiteral("ms");
  } else if (out.step >= 1e-7 * (1 - 1e-12)) {
    out.unitScale = 1e-6, out.unit = QStringLiteral("us");
  } else {
    out.unitScale = 1e-9, out.unit = QStringLiteral("ns");
  }
  out.decimals = std::max(0, -static_cast<int>(std::floor(std::log10(out.step / out.unitScale) + 1e-9)));
  // Ticks as k * step (not by repeated addition) so labels do not drift; at most width / spacing + 2 of them.
  const double first = std::ceil(axis.t0() / out.step - 1e-9);
  const double last = std::floor(axis.t1() / out.step + 1e-9);
  for (double k = first; k <= last && out.times.size() < 10000; k += 1) out.times.push_back(k * out.step);
  return out;
}

QString formatTick(double t, const TimeTicks& ticks) {
  if (std::abs(t) < ticks.step * 1e-6) t = 0;  // no "-0.0"
  return QString::number(t / ticks.unitScale, 'f', ticks.decimals) + QLatin1Char(' ') + ticks.unit;
}

QString formatDuration(double seconds) {
  if (!finite(seconds)) return QStringLiteral("?");
  const double a = std::abs(seconds);
  double scale = 1;
  QString unit = QStringLiteral("s");
  if (a < 1e-6) {
    scale = 1e-9, unit = QStringLiteral("ns");
  } else if (a < 1e-3) {
    scale = 1e-6, unit = QStringLiteral("us");
  } else if (a < 1) {
    scale = 1e-3, unit = QStringLiteral("ms");
  }
  const double v = seconds / scale;
  const int decimals = std::abs(v) >= 100 || scale == 1e-9 ? 0 : std::abs(v) >= 10 ? 1 : 2;
  return QString::number(v, 'f', decimals) + QLatin1Char(' ') + unit;
}

RowLayout::RowLayout(int rowCount, int headerHeight, int rowHeight)
    : m_rowCount(std::max(0, rowCount)),
      m_headerHeight(std::max(0, headerHeight)),
      m_rowHeight(std::max(rowHeight, kLanesBottom + 2)) {}

int RowLayout::rowAt(int y) const {
  if (y < m_headerHeight) return -1;
  const int rel = y - m_headerHeight + m_scrollY;
  if (rel < 0) return -1;
  const int row = rel / m_rowHeight;
  return row < m_rowCount ? row : -1;
}

RowLayout::Band RowLayout::lane(int row, int lane) const {
  const int top = yOfRow(row);
  if (lane == 0) return {top + kComputeTop, kComputeHeight};
  return {top + kComputeTop + kComputeHeight + kLaneGap, kCommHeight};
}

int RowLayout::laneAt(int y) const {
  const int row = rowAt(y);
  if (row < 0) return -1;
  if (lane(row, 0).contains(y)) return 0;
  if (lane(row, 1).contains(y)) return 1;
  return -1;
}

int RowLayout::maxScroll(int viewportHeight) const {
  return std::max(0, contentHeight() - std::max(0, viewportHeight - m_headerHeight));
}

void RowLayout::scrollTo(int scrollY, int viewportHeight) {
  m_scrollY = std::clamp(scrollY, 0, maxScroll(viewportHeight));
}

int RowLayout::firstVisibleRow() const {
  return std::max(0, m_scrollY / m_rowHeight);
}

int RowLayout::lastVisibleRow(int viewportHeight) const {
  const int visible = viewportHeight - m_headerHeight;
  if (visible <= 0 || m_rowCount == 0) return firstVisibleRow() - 1;
  return std::min(m_rowCount - 1, (m_scrollY + visible - 1) / m_rowHeight);
}

}  // namespace ms
