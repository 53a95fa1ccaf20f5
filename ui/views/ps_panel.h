// PsPanel: a parameter-server run's own figures in the Run dashboard (a side tab that RunView shows only for
// such runs): the staleness histogram of every update applied so far, the mean staleness of each ps line's
// window against the step (with the prediction, dashed), and a table of the workers (live or dropped, pushes
// applied, samples/s and step time since the last line, straggler slowdown from the config).
//
// What always holds: update() reads only RunData (no JSON), redraws only when the data's revision moved, and
// costs the histogram's length plus the new staleness points.
#pragma once

#include <QWidget>
#include <cstdint>

class QCustomPlot;
class QLabel;
class QTableWidget;

namespace ms {

class RunData;

class PsPanel : public QWidget {
  Q_OBJECT
 public:
  enum Columns { ColWorker, ColState, ColSteps, ColSamplesPerS, ColStepTime, NUM_COLUMNS };
  explicit PsPanel(QWidget* parent);
  void update(const RunData& data);
  // The predicted mean staleness (plan/ps_model.h), drawn dashed; NaN: none.
  void setPredictedStaleness(double mean);

  QCustomPlot* histogram() const { return m_histogram; }
  QCustomPlot* stalenessPlot() const { return m_staleness; }
  QTableWidget* workerTable() const { return m_table; }
  QString summary() const;

 private:
  QLabel* m_summary = nullptr;
  QCustomPlot* m_histogram = nullptr;
  QCustomPlot* m_staleness = nullptr;
  QTableWidget* m_table = nullptr;
  double m_predicted = 0;
  bool m_hasPrediction = false;
  std::uint64_t m_shown = ~std::uint64_t(0);
};

}  // namespace ms
