// RunView: a run as it happens (or replayed): loss, throughput and step-time curves with the plan's predicted
// figures as dashed lines, a table of predicted against measured peak memory and bubble per rank, a status
// line and the engine's log. The measured timeline is not drawn here: RunData::timeline() feeds the timeline
// view.
//
// What always holds: the view never redraws per line: a timer (kRefreshMs) looks at RunData::revision() and
// redraws only when it moved; curves get only their new points appended (a full re-read only when the series
// were cut or the data cleared), and the axis ranges are kept as points arrive instead of rescanned, so a
// redraw costs the new points, not the run's length; the log pane keeps at most RunData::kMaxLogLines lines.
#pragma once

#include <QPointer>
#include <QString>
#include <QTimer>
#include <QWidget>
#include <cstdint>

class QCustomPlot;
class QLabel;
class QPlainTextEdit;
class QTableWidget;

namespace ms {

class EngineClient;
class RunData;

class RunView : public QWidget {
  Q_OBJECT
 public:
  static constexpr int kRefreshMs = 100;
  enum MemoryColumns {
    ColRank,
    ColStage,
    ColPredictedMiB,
    ColMeasuredMiB,
    ColPredictedBubble,
    ColMeasuredBubble,
    NUM_COLUMNS
  };

  explicit RunView(QWidget* parent);
  // Shows the client's run (live); the client must outlive the view or be destroyed first (it is then
  // dropped).
  void setClient(EngineClient* client);
  // Shows a run's data that someone else fills (a replay); data must outlive the view or be replaced first.
  void setData(const RunData* data);

  // Redraws now if the data changed since the last redraw (the timer calls this).
  void refresh();

  QCustomPlot* lossPlot() const { return m_loss; }
  QCustomPlot* throughputPlot() const { return m_throughput; }
  QCustomPlot* stepTimePlot() const { return m_stepTime; }
  QTableWidget* memoryTable() const { return m_table; }
  QString statusText() const;
  QString logText() const;

  // Writes loss, throughput and step_time as <dir>/<name>.png or .pdf (dir is created). False when the format
  // is neither or a file cannot be written.
  bool savePlots(const QString& dir, const QString& format);

 protected:
  void showEvent(QShowEvent* event) override;

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
  void updateStatus();
  void updateLog();
  void replotAll();
  const RunData* data() const;

  QPointer<EngineClient> m_client;
  const RunData* m_data = nullptr;
  QTimer m_timer;
  std::uint64_t m_shownRevision = ~std::uint64_t(0);
  std::uint64_t m_shownEpoch = ~std::uint64_t(0);
  std::uint64_t m_shownGeneration = ~std::uint64_t(0);
  int m_plottedSteps = 0;
  int m_plottedEvals = 0;
  std::uint64_t m_shownLog = 0;
  Range m_stepRange, m_lossRange, m_throughputRange, m_stepTimeRange;
  QString m_throughputUnit;

  QLabel* m_status = nullptr;
  QCustomPlot* m_loss = nullptr;
  QCustomPlot* m_throughput = nullptr;
  QCustomPlot* m_stepTime = nullptr;
  QTableWidget* m_table = nullptr;
  QPlainTextEdit* m_log = nullptr;
};

}  // namespace ms
