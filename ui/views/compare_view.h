// CompareView: finished runs side by side, for what users compare: the same model trained synchronously and
// asynchronously (or under any two plans). Loss against steps and against wall time, one curve per run on
// shared axes; for parameter-server runs, each run's staleness histogram (as fractions of its updates, so
// runs of different lengths compare); and a table per run: consistency, steps, final evaluation, wall time,
// mean staleness.
//
// What always holds: runs are loaded from their folders (loadRunFolder) or given as RunData, never modified;
// a folder that does not load is refused with its reason and changes nothing shown.
#pragma once

#include <QString>
#include <QWidget>
#include <memory>
#include <vector>

#include "common/status.h"

class QCustomPlot;
class QCPBarsGroup;
class QLabel;
class QTableWidget;

namespace ms {

class RunData;

class CompareView : public QWidget {
  Q_OBJECT
 public:
  enum Columns {
    ColRun,
    ColConsistency,
    ColSteps,
    ColEvalLoss,
    ColAccuracy,
    ColWallTime,
    ColStaleness,
    NUM_COLUMNS
  };
  explicit CompareView(QWidget* parent = nullptr);
  ~CompareView() override;

  // Loads a run folder (its metrics.jsonl) and adds it; the label is the run's name.
  Status addRunFolder(const QString& dir);
  void addRun(const QString& label, std::shared_ptr<const RunData> data);
  void clear();
  int runCount() const { return static_cast<int>(m_runs.size()); }

  QCustomPlot* lossByStep() const { return m_byStep; }
  QCustomPlot* lossByTime() const { return m_byTime; }
  QCustomPlot* staleness() const { return m_staleness; }
  QTableWidget* table() const { return m_table; }

 private:
  struct Run {
    QString label;
    std::shared_ptr<const RunData> data;
  };
  void rebuild();
  std::vector<Run> m_runs;
  QCustomPlot* m_byStep = nullptr;
  QCustomPlot* m_byTime = nullptr;
  QCustomPlot* m_staleness = nullptr;
  QCPBarsGroup* m_group = nullptr;  // the runs' staleness bars side by side
  QTableWidget* m_table = nullptr;
  QLabel* m_message = nullptr;  // why the last folder asked for did not load
  QString m_lastDir;
};

}  // namespace ms
