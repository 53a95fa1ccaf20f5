// MainWindow's File > Import Measured Trace: PyTorch profiler or Nsight traces (plan/trace_import.h) on the
// Run tab, as the measured timeline above the open project's predicted step. See main_window.h.
#include <QAction>
#include <QApplication>
#include <QFileDialog>
#include <QFileInfo>
#include <QLabel>
#include <QMenu>
#include <QStatusBar>
#include <QTabWidget>

#include "plan/trace_import.h"
#include "ui/models/trace_timeline.h"
#include "ui/run/engine_client.h"
#include "ui/run/run_data.h"
#include "ui/views/main_window.h"
#include "ui/views/run_view.h"
#include "ui/views/timeline_view.h"

namespace ms {

void MainWindow::addTraceImportAction(QMenu* file) {
  QAction* a = file->addAction(tr("Import Measured &Trace..."), this, [this] {
    const QStringList paths =
        QFileDialog::getOpenFileNames(this, tr("Import measured trace (one file per rank, or merged)"),
                                      dialogFolder(), tr("Chrome trace JSON (*.json);;All files (*)"));
    if (!paths.isEmpty()) importTrace(paths);
  });
  a->setObjectName(QStringLiteral("importTraceAction"));
  a->setStatusTip(tr(
      "A PyTorch profiler (Kineto) or Nsight Systems trace as Chrome trace JSON, shown on the Run tab above "
      "the plan's predicted step"));
}

bool MainWindow::importTrace(const QStringList& paths) {
  if (m_client->isRunning()) {
    showError(tr("Import trace"), tr("stop the current run first: its steps would replace the trace"));
    return false;
  }
  std::vector<std::string> files;
  for (const QString& p : paths) files.push_back(p.toStdString());
  QApplication::setOverrideCursor(Qt::WaitCursor);
  Expected<TraceImport> trace = importTraces(files);
  QApplication::restoreOverrideCursor();
  if (!trace) {
    showError(tr("Import trace"), QString::fromStdString(trace.message()));
    return false;
  }
  TraceTimeline shown = timelineFromTrace(*trace);
  // An empty replay in the run's place: the dashboard's plots are a run's, and no run goes with a trace.
  m_replay = std::make_unique<RunData>();
  m_showingReplay = true;
  m_runView->setData(m_replay.get());
  m_runView->measuredTimeline()->setData(std::make_shared<const TimelineData>(std::move(shown.timeline)));
  m_runView->setPlan(m_shownPlan);  // the open project's prediction, on the trace's time axis
  QStringList names;
  for (const QString& p : paths) names << QFileInfo(p).fileName();
  const QString step =
      shown.step >= 0 ? tr("step %1").arg(shown.step) : tr("the whole trace (no ProfilerStep)");
  m_runBanner->setText(
      tr("Measured trace %1: %2 rank(s), %3 of %4 step(s); the predicted step below is the open "
         "project's plan")
          .arg(names.join(QStringLiteral(", ")))
          .arg(trace->ranks.size())
          .arg(step)
          .arg(shown.steps));
  m_runBanner->setStyleSheet(QString());
  m_lastError.clear();
  statusBar()->showMessage(tr("Imported trace: %1").arg(traceImportSummary(*trace)));
  m_tabs->setCurrentIndex(1);
  return true;
}

}  // namespace ms
