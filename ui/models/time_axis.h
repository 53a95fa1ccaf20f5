// The geometry of a timeline, kept out of the widget so it can be tested without one: TimeAxis maps time
// (seconds) to x (pixels), RowLayout maps rows and their lanes to y. The timeline view paints, hit-tests and
// zooms through these two values only, so what is drawn and what is hit always agree.
//
// What always holds for a TimeAxis: the visible range is never inverted and never narrower than kMinSpan nor
// wider than maxSpan(); width() >= 1; x(t(px)) == px up to rounding; zoomAt(px, f) keeps t(px) where it was;
// non-finite arguments leave the axis unchanged. For a RowLayout: rows are rowHeight apart below a header of
// headerHeight; the compute lane and the communication lane lie inside their row, one above the other;
// scrollY() stays in [0, maxScroll(viewport height)] whenever the view clamps it.
#pragma once

#include <QString>
#include <vector>

namespace ms {

class TimeAxis {
 public:
  static constexpr double kMinSpan = 1e-9;        // one nanosecond: below the resolution of any span we show
  static constexpr double kDefaultMaxSpan = 1e6;  // about 11 days
  TimeAxis() = default;
  // Shows [t0, t1] on pixels [x0, x0 + width].
  TimeAxis(double t0, double t1, double x0, double width);

  double t0() const { return m_t0; }
  double t1() const { return m_t1; }
  double span() const { return m_t1 - m_t0; }
  double x0() const { return m_x0; }
  double width() const { return m_width; }
  double secondsPerPixel() const { return span() / m_width; }
  double maxSpan() const { return m_maxSpan; }

  double x(double t) const { return m_x0 + (t - m_t0) * (m_width / span()); }
  double t(double x) const { return m_t0 + (x - m_x0) * (span() / m_width); }

  // The visible time range; swapped when inverted, widened about its centre to kMinSpan, narrowed about its
  // centre to maxSpan().
  void setRange(double t0, double t1);
  // Moves the pixels the range is shown on, keeping the range (a resize keeps what is visible).
  void setPixels(double x0, double width);
  // The widest range zooming out may show (>= kMinSpan); the current range is clamped to it.
  void setMaxSpan(double maxSpan);
  // factor > 1 zooms in (the span shrinks by factor), < 1 zooms out; the time under pixel x stays under x
  // unless a clamp had to move it. factor <= 0 is ignored.
  void zoomAt(double x, double factor);
  // Drags the content dx pixels to the right (the visible range moves to earlier times).
  void panBy(double dx);
  // Shows [begin, end] with margin * (end - begin) of space on each side.
  void fit(double begin, double end, double margin = 0);

  bool operator==(const TimeAxis&) const = default;

 private:
  double m_t0 = 0;
  double m_t1 = 1e-3;
  double m_x0 = 0;
  double m_width = 100;
  double m_maxSpan = kDefaultMaxSpan;
};

// Tick marks for a time axis: a step of 1, 2 or 5 times a power of ten seconds, at least minSpacing pixels
// apart, with the unit (s, ms, us, ns) chosen by the step so labels stay short: the step is 0.1 to 500 units.
struct TimeTicks {
  double step = 0;            // seconds between ticks
  double unitScale = 1;       // seconds per unit: 1, 1e-3, 1e-6, 1e-9
  QString unit;               // "s", "ms", "us", "ns"
  int decimals = 0;           // digits after the point that the step needs in that unit
  std::vector<double> times;  // every tick inside [t0, t1], in seconds
};
TimeTicks timeTicks(const TimeAxis& axis, double minSpacing);
// "1.5 ms", with the ticks' unit and decimals.
QString formatTick(double t, const TimeTicks& ticks);
// A duration or time for tooltips with a unit chosen by its own magnitude: "850 ns", "12.3 us", "4.56 ms",
// "1.23 s".
QString formatDuration(double seconds);

// Vertical geometry: a header band (the time axis) on top, then one row per device, each holding a compute
// lane and, under it, a thinner communication lane. Coordinates are widget pixels; scrollY() is how far the
// rows are scrolled up.
class RowLayout {
 public:
  struct Band {
    int top = 0;
    int height = 0;
    bool contains(int y) const { return y >= top && y < top + height; }
    bool operator==(const Band&) const = default;
  };
  RowLayout() = default;
  // rowHeight must leave room for both lanes: it is raised to the lanes' height when smaller.
  RowLayout(int rowCount, int headerHeight, int rowHeight);

  int rowCount() const { return m_rowCount; }
  int headerHeight() const { return m_headerHeight; }
  int rowHeight() const { return m_rowHeight; }
  int scrollY() const { return m_scrollY; }
  void setRowCount(int rows) { m_rowCount = rows < 0 ? 0 : rows; }

  // Top of a row in widget pixels (rows scrolled above the header have a top above it).
  int yOfRow(int row) const { return m_headerHeight + row * m_rowHeight - m_scrollY; }
  // The row under y, or -1 in the header, above the first or below the last row.
  int rowAt(int y) const;
  // Lane 0 (compute) or 1 (communication) of a row.
  Band lane(int row, int lane) const;
  // The lane under y (0 or 1), or -1 between lanes, in the header or outside the rows.
  int laneAt(int y) const;

  int contentHeight() const { return m_rowCount * m_rowHeight; }
  int maxScroll(int viewportHeight) const;
  // Sets the scroll, clamped to [0, maxScroll(viewportHeight)].
  void scrollTo(int scrollY, int viewportHeight);
  // The rows at least partly visible in a viewport of that height: [first, last], empty when last < first.
  int firstVisibleRow() const;
  int lastVisibleRow(int viewportHeight) const;

  bool operator==(const RowLayout&) const = default;

  // Lane geometry inside a row, in pixels from the row's top.
  static constexpr int kComputeTop = 4;
  static constexpr int kComputeHeight = 16;
  static constexpr int kLaneGap = 1;
  static constexpr int kCommHeight = 6;
  static constexpr int kLanesBottom = kComputeTop + kComputeHeight + kLaneGap + kCommHeight;

 private:
  int m_rowCount = 0;
  int m_headerHeight = 28;
  int m_rowHeight = 30;
  int m_scrollY = 0;
};

}  // namespace ms
