// RunView: the Run dashboard, a run as it happens (or replayed), laid out for watching training. On top a
// status line (state, step, loss, throughput against the prediction) and three plots side by side (loss with
// evaluations, throughput and step time, each with the plan's prediction dashed on the same axis); below, the
// measured timeline of the latest step above the predicted one on one shared time axis (same range, same
// labels column, one row per stage unless expanded), and beside them a tab of the run's memory (predicted
// stacks against measured peaks, one scale), a per-rank table (predicted and measured memory and bubble) and
// the engine's log.
//
// The predictions are the run's own plan (setPlan: the analysis of the config the run was started with), not
// whatever the project has been edited to since.
//
// What always holds: the view never redraws per line: a timer (kRefreshMs) looks at RunData::revision() and
// redraws only when it moved; curves get only their new points appended (a full re-read only when the series
// were cut, halved by RunData's decimation, or the data cleared), and the axis ranges are kept as points
// arrive instead of rescanned, so a redraw costs the new points, not the run's length; the status line shows
// the latest step line exactly; the log pane keeps at most RunData::kMaxLogLines lines, and its tab says how
// many of how many once older ones were dropped. Axis labels use SI prefixes and as many ticks as the plot's
// size leaves readable; legends sit in a row of their own, never over a curve. exportDashboard() draws
// exactly the panels on screen, in their on-screen arrangement: plots and timelines as vectors in PDF and
// SVG, and every PNG at the dpi asked for.
#pragma once

#include <QPointer>
#include <QString>
#include <QTimer>
#include <QWidget>
#include <cstdint>
#include <memory>

class QCustomPlot;
class QCPPainter;
class QLabel;
class QPlainTextEdit;
class QTableWidget;
class QTabWidget;

namespace ms {

class EngineClient;
class MemoryView;
class PsPanel;
class RunData;
class TimelineView;
struct PlanSnapshot;

class RunView : public QWidget {
  Q_OBJECT
 public:
  static constexpr int kRefreshMs = 100;
  static constexpr int kGroupRanksAbove = 64;  // the table shows one row per stage above this many ranks
  enum MemoryColumns {
    ColRank,
    ColStage,
    ColPredictedMemory,
    ColMeasuredMemory,
    ColPredictedBubble,
    ColMeasuredBubble,
    NUM_COLUMNS
  };
  enum SideTab { MemoryTab, TableTab, LogTab, PsTab };  // PsTab: parameter-server runs only

  explicit RunView(QWidget* parent);
  // Shows the client's run (live); the client must outlive the view or be destroyed first (it is then
  // dropped).
  void setClient(EngineClient* client);
  // Shows a run's data that someone else fills (a replay); data must outlive the view or be replaced first.
  void setData(const RunData* data);
  // The analysis of the config the run uses: its predicted timeline and memory (null: none known).
  void setPlan(std::shared_ptr<const PlanSnapshot> plan);

  // Redraws now if the data changed since the last redraw (the timer calls this).
  void refresh();

  QCustomPlot* lossPlot() const { return m_loss; }
  QCustomPlot* throughputPlot() const { return m_throughput; }
  QCustomPlot* stepTimePlot() const { return m_stepTime; }
  TimelineView* measuredTimeline() const { return m_measured; }
  TimelineView* predictedTimeline() const { return m_predicted; }
  MemoryView* memoryView() const { return m_memory; }
  QTableWidget* memoryTable() const { return m_table; }
  QTabWidget* sideTabs() const { return m_side; }
  PsPanel* psPanel() const { return m_ps; }
  QString statusText() const;
  QString logText() const;
  void showLog();  // brings the log tab forward (a failed run)

  // Writes loss, throughput, step_time and memory (predicted against measured) as <dir>/<name>.png or .pdf
  // (dir is created), each at its on-screen size (a fixed one when hidden), PNGs at dpi (0: screen pixels).
  // False when the format is neither or a file cannot be written.
  bool savePlots(const QString& dir, const QString& format, double dpi = 0);
  // The whole dashboard as it is on screen, into one file: "pdf" or "svg" (vector: plots and timelines as
  // paths and text) or "png" at dpi (96: screen pixels; 300: print). A view never shown is laid out at
  // 1600 x 900 first. False (and error() says why) when the format is unknown or the file cannot be written.
  bool exportDashboard(const QString& path, const QString& format, double dpi = 300);
  QString error() const { return m_error; }

 protected:
  void showEvent(QShowEvent* event) override;
  bool eventFilter(QObject* watched, QEvent* event) override;

 private:
  struct Range {
    double lo = 0, hi = 0;
    bool any = false;
    void add(double v);
    void reset() { any = false; }
  };
  void resetPlots();
  void forgetShown();  // a different data source: everything is read anew
  void updatePlots();
  void updatePredictedLines();
  void updateTable();
  void updateMemory();
  void updateStatus();
  void updateLog();
  void replotAll();
  void alignTimelines();  // one time range and one labels width for the measured and the predicted view
  void paintDashboard(QCPPainter& p, bool vector);
  static void fitTicks(QCustomPlot* plot);  // as many ticks as the plot's size leaves room for
  const RunData* data() const;

  QPointer<EngineClient> m_client;
  const RunData* m_data = nullptr;
  std::shared_ptr<const PlanSnapshot> m_plan;
  QTimer m_timer;
  std::uint64_t m_shownRevision = ~std::uint64_t(0);
  std::uint64_t m_shownEpoch = ~std::uint64_t(0);
  std::uint64_t m_shownGeneration = ~std::uint64_t(0);
  std::uint64_t m_shownTimelineRevision = ~std::uint64_t(0);
  int m_plottedSteps = 0;
  int m_plottedEvals = 0;
  std::uint64_t m_shownLog = 0;
  Range m_stepRange, m_lossRange, m_throughputRange, m_stepTimeRange;
  QString m_throughputUnit;
  bool m_aligning = false;
  QString m_error;

  QLabel* m_status = nullptr;
  PsPanel* m_ps = nullptr;
  QCustomPlot* m_loss = nullptr;
  QCustomPlot* m_throughput = nullptr;
  QCustomPlot* m_stepTime = nullptr;
  TimelineView* m_measured = nullptr;
  TimelineView* m_predicted = nullptr;
  MemoryView* m_memory = nullptr;
  QTableWidget* m_table = nullptr;
  QPlainTextEdit* m_log = nullptr;
  QTabWidget* m_side = nullptr;
};

}  // namespace ms
