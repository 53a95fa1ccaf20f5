// The timeline view: a step's spans on a shared time axis, predicted (from the simulator) or measured (from
// the engine's spans), so the pipeline bubbles show as the empty background between spans. Rows are grouped
// by pipeline stage (TimelineGroups): one row per stage, drawing the stage's last rank to finish, with its
// rank count and bubble range; clicking a stage's header lists its ranks under it (and hides them again). The
// compute lane holds F, B and W coloured by microbatch (F light, B dark, W a muted shade, hatched when wide),
// receive waits (grey, hatched) and the optimizer step (dark slate); a thinner communication lane under it
// holds sends (teal) and gradient syncs (orange). The wheel zooms around the cursor, dragging pans (and
// scrolls rows), Shift+wheel scrolls rows; hovering a span shows its kind, layer, microbatch, chunk, start
// and duration.
//
// What always holds: painting and hit testing read the same TimeAxis and RowLayout, so spanAt() returns what
// is drawn under the point; a frame costs O(rows visible * (width + spans visible)) whatever the zoom: each
// lane binary-searches its first visible span (a running maximum of span ends keeps long spans that start
// before the view) and its spans are accumulated into one coverage-weighted colour per pixel column, drawn
// with a single image per lane (many spans in one column become one merged column, never thousands of
// rectangles); a pixel inside one span has exactly that span's colour, a pixel in no span the background.
// The view follows the data's extent (fits on every setData) until the user zooms or pans; fitAll() resumes
// following. The expanded stages survive setData (a measured timeline is replaced every step). The labels
// column is as wide as the labels need (between kMinHeaderWidth and kMaxHeaderWidth) unless setHeaderWidth()
// fixes it, so two views shown one above the other can share one time axis. setOutdated() washes the view
// out and says why (a re-plan under way, an invalid edit): what it shows is not the current plan.
#pragma once

#include <QColor>
#include <QImage>
#include <QStaticText>
#include <QString>
#include <QWidget>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "ui/models/time_axis.h"
#include "ui/models/timeline_data.h"
#include "ui/models/timeline_groups.h"

namespace ms {

class TimelineView : public QWidget {
  Q_OBJECT
 public:
  struct Hit {
    int row = -1;         // the data row whose span it is
    int displayRow = -1;  // the display row it was hit on
    int lane = -1;
    std::size_t index = 0;  // into data()->rows[row].spans
    TimelineSpan span;
  };

  static constexpr int kMinHeaderWidth = 110;  // the labels column left of the time area, at least
  static constexpr int kMaxHeaderWidth = 260;  // and at most (labels are elided to it)
  static constexpr int kRightPad = 10;
  static constexpr int kAxisHeight = 28;
  static constexpr int kRowHeight = 30;
  // Spans at least this wide (pixels) get decorations of their own (hatching, a darker left edge from 4 px,
  // a label from 40 px); all spans are drawn through the per-column coverage line.
  static constexpr double kMergeBelowPx = 3.0;

  explicit TimelineView(QWidget* parent = nullptr);

  // Shows a timeline (null or empty: an explanatory message). Keeps the zoom once the user has zoomed.
  void setData(std::shared_ptr<const TimelineData> data);
  std::shared_ptr<const TimelineData> data() const { return m_data; }
  void setTitle(const QString& title);
  QString title() const { return m_title; }

  // The geometry used for the current widget size (what paintEvent and spanAt use).
  TimeAxis timeAxis() const { return axisFor(width()); }
  RowLayout rowLayout() const { return m_layout; }

  // The span under a widget point (within 2 pixels horizontally of a span, the containing one preferred),
  // or none over a gap, a header or between lanes. Zero-length spans are never hit (they are not drawn).
  std::optional<Hit> spanAt(QPoint pos) const;
  QString toolTipText(const Hit& hit) const;
  // "rank 2 · stage 1 · dev 2 — bubble 23%": the text drawn at the row's header.
  QString rowHeaderText(int row) const;

  // Grouping: the display rows (one per stage, plus the listed ranks of expanded stages).
  const TimelineGroups& groups() const { return m_groups; }
  int displayRowCount() const { return m_groups.displayRowCount(); }
  // "stage 1 · 4 ranks — bubble 9-12%" for a group header, else the row's rowHeaderText().
  QString displayRowText(int displayRow) const;
  bool isStageExpanded(int stage) const { return m_expandedStages.count(stage) > 0; }
  void setStageExpanded(int stage, bool expanded);
  void setAllExpanded(bool expanded);

  // The labels column: its width now, the width its labels ask for, and a fixed width (0: its own).
  int headerWidth() const;
  int preferredHeaderWidth() const { return m_preferredHeaderWidth; }
  void setHeaderWidth(int pixels);

  // Marks what is shown as not the current state (a reason, drawn over the view), or current (empty).
  void setOutdated(const QString& reason);
  QString outdatedReason() const { return m_outdated; }

  // The view drawn into an image of that size (the same range of time, the same scroll).
  QImage render(QSize size) const;
  // The view drawn by any painter (a PDF, an SVG, an image) into (0, 0, size): the export of a dashboard.
  void paintTo(QPainter& p, QSize size) const;
  // True while the view follows its data's extent (no zoom or pan by hand since the last fit).
  bool followsData() const { return m_followData; }
  // Shows [begin, end] with fitAll()'s margin and keeps following (a pair of views fitted to their union).
  void fitRange(double begin, double end);
  using QWidget::render;

  static QColor spanColor(const TimelineSpan& span);
  static QColor backgroundColor() { return QColor(255, 255, 255); }

  QSize sizeHint() const override;

 public slots:
  void fitAll();
  void zoomIn();
  void zoomOut();
  // Shows [t0, t1] (stops following the data's extent). Lets a predicted and a measured view stay aligned.
  void setViewRange(double t0, double t1);
  void scrollToRow(int row);

 signals:
  // The visible time range changed (zoom, pan, fit, resize keeps it and does not emit).
  void viewRangeChanged(double t0, double t1);
  void preferredHeaderWidthChanged(int pixels);

 protected:
  void paintEvent(QPaintEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;
  void wheelEvent(QWheelEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void keyPressEvent(QKeyEvent* event) override;
  void contextMenuEvent(QContextMenuEvent* event) override;
  bool event(QEvent* event) override;
  void changeEvent(QEvent* event) override;

 private:
  // One lane's spans in start order with the running maximum of their ends, so the first span that can
  // reach the visible range is a binary search away even when long spans overlap later ones.
  struct LaneIndex {
    std::vector<std::uint32_t> spans;  // indices into the row's spans, by start
    std::vector<double> maxEnd;        // maxEnd[i] = max end of spans[0..i]
    std::size_t firstReaching(double t) const;
  };
  struct RowIndex {
    LaneIndex lanes[2];
    bool multiChunk = false;  // the row runs several model chunks (interleaved): labels name the chunk
    bool built = false;
  };
  const RowIndex& rowIndex(int row) const;  // builds the row's index on first use

  static QColor kindColour(const TimelineSpan& span);
  // spanColor from a table built by setData (the HSL conversion per span cost more than the drawing).
  QRgb colourOf(const TimelineSpan& span) const;
  TimeAxis axisFor(int widgetWidth) const;
  RowLayout layoutFor(int widgetHeight) const;
  void paint(QPainter& p, QSize size, const TimeAxis& axis, const RowLayout& layout) const;
  void paintLane(QPainter& p, const TimelineRow& row, const LaneIndex& lane, bool multiChunk,
                 const TimeAxis& axis, RowLayout::Band band, std::vector<float>& acc) const;
  // A row's header (label elided to fit beside "bubble N%"), laid out once per data and font.
  struct RowHeaderText {
    bool ready = false;
    QStaticText label;
    QStaticText bubble;
    int bubbleWidth = 0;
    int labelWidth = 0;  // the whole label's, before eliding
  };
  const RowHeaderText& rowHeader(int displayRow) const;
  void rebuildGroups();
  // The label drawn inside a wide span ("F3", "B12 c5"), laid out once per font.
  const QStaticText& spanLabelText(const TimelineSpan& span, bool withChunk) const;
  void paintAxis(QPainter& p, QSize size, const TimeAxis& axis) const;
  void applyAxis(const TimeAxis& axis);  // stores a user-changed range, stops following, emits
  void rebuildIndex();
  double dataMaxSpan() const;

  std::shared_ptr<const TimelineData> m_data;
  mutable std::vector<RowIndex> m_index;          // per row, built lazily (rowIndex)
  mutable std::vector<QRgb> m_microbatchColours;  // (M, 3): F, B, W of each microbatch indexed so far
  // Laid-out labels by (kind, microbatch, chunk); a cache, cleared when the data or the font changes.
  mutable std::unordered_map<std::uint64_t, QStaticText> m_labelCache;
  mutable std::vector<RowHeaderText> m_rowHeaders;  // the same kind of cache, per display row
  TimelineGroups m_groups;
  std::set<int> m_expandedStages;
  int m_preferredHeaderWidth = kMinHeaderWidth;
  int m_fixedHeaderWidth = 0;
  QString m_outdated;
  QString m_title;
  TimeAxis m_axis;  // the range; its pixels are set from the widget's width when used
  RowLayout m_layout{0, kAxisHeight, kRowHeight};
  bool m_followData = true;
  bool m_dragging = false;
  QPoint m_lastDragPos;
};

}  // namespace ms
