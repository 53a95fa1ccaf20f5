// MainWindow's runs: starting and resuming a run of the plan, stopping it, its end, replaying a run folder,
// calibrating the plan from a run, and where a run's folder goes. See main_window.h.
#include <QAction>
#include <QDateTime>
#include <QDir>
#include <QFileInfo>
#include <QLabel>
#include <QStandardPaths>
#include <QStatusBar>
#include <QTabWidget>

#include "ui/models/project_document.h"
#include "ui/run/calibration.h"
#include "ui/run/engine_client.h"
#include "ui/run/run_data.h"
#include "ui/views/main_window.h"
#include "ui/views/run_view.h"

namespace ms {

namespace {

// The built-in examples' folder: their runs go to the user's data folder, not into the source tree.
bool isExampleProject(const QString& path) {
#ifdef MS_EXAMPLES_DIR
  return !path.isEmpty() &&
         QFileInfo(path).absoluteDir() == QDir(QStringLiteral(MS_EXAMPLES_DIR)).absolutePath();
#else
  Q_UNUSED(path);
  return false;
#endif
}

}  // namespace

QString MainWindow::defaultRunDir() const {
  const QString stamp = QDateTime::currentDateTime().toString(QStringLiteral("yyyyMMdd-HHmmss"));
  const QString name = QString::fromStdString(m_doc->config().name) + QStringLiteral("-") + stamp;
  const QString path = m_doc->filePath();
  const QFileInfo folder(QFileInfo(path).absolutePath());
  if (!path.isEmpty() && !isExampleProject(path) && folder.isWritable())
    return folder.absoluteFilePath() + "/runs/" + name;
  return QStandardPaths::writableLocation(QStandardPaths::AppDataLocation) + QStringLiteral("/runs/") + name;
}

bool MainWindow::startRun(const QString& runDir) {
  return launch(runDir.isEmpty() ? defaultRunDir() : runDir, false);
}

bool MainWindow::resumeRun(const QString& runDir) {
  const QString dir = runDir.isEmpty() ? m_lastRunDir : runDir;
  if (dir.isEmpty()) {
    showError(tr("Resume"), tr("no run to resume: start one, or reopen a run folder first"));
    return false;
  }
  return launch(dir, true);
}

bool MainWindow::launch(const QString& dir, bool resume) {
  if (m_client->isRunning()) {
    showError(tr("Run"), tr("a run is already going; stop it first"));
    return false;
  }
  if (!m_doc->errors().empty()) {
    const QString message = QString::fromStdString(formatConfigErrors(m_doc->errors(), m_doc->config().name));
    showError(tr("Cannot run"), message);
    m_runBanner->setText(tr("Cannot run: the project fails validation:\n%1").arg(message));
    m_runBanner->setStyleSheet(QStringLiteral("color: #b00020"));
    return false;
  }
  m_showingReplay = false;
  m_replay.reset();
  m_runView->setClient(m_client);
  m_lastError.clear();
  m_lastRunDir = QDir(dir).absolutePath();
  m_lastRunConfig = m_doc->config();
  // The run's predictions are its own plan's: the current analysis when it is of this config.
  if (m_snapshot && m_snapshot->config == m_doc->config())
    m_runView->setPlan(m_snapshot);
  else
    m_runAnalyzer->request(m_doc->config());
  if (!m_client->start(m_doc->config(), dir, resume)) {
    // The client said why through finished(false, reason) (onRunFinished shows it), unless a run is going.
    if (m_lastError.isEmpty()) showError(tr("Run"), tr("the engine client refused to start a run"));
    return false;
  }
  m_runAction->setEnabled(false);
  m_resumeAction->setEnabled(false);
  m_stopAction->setEnabled(true);
  m_tabs->setCurrentIndex(1);
  return true;
}

bool MainWindow::calibrateFromRun() {
  const RunData* data = runData();
  if (!data || !m_lastRunConfig) {
    showError(tr("Calibrate"), tr("no run to calibrate from: run the plan or reopen a run folder first"));
    return false;
  }
  auto calibration = calibrationFromRun(*data, *m_lastRunConfig, m_lastRunDir);
  if (!calibration) {
    showError(tr("Calibrate"), QString::fromStdString(calibration.message()));
    return false;
  }
  m_analyzer->setCalibration(std::move(*calibration));
  statusBar()->showMessage(tr("Predictions now use the compute times measured by %1").arg(m_lastRunDir),
                           8000);
  return true;
}

void MainWindow::clearCalibration() {
  m_analyzer->setCalibration(std::nullopt);
  statusBar()->showMessage(tr("Predictions use the analytic cost model again"), 5000);
}

void MainWindow::stopRun() {
  if (!m_client->isRunning()) return;
  m_client->stop();
  m_runBanner->setText(tr("Stopping after the current step..."));
}

const RunData* MainWindow::runData() const {
  if (m_showingReplay && m_replay) return m_replay.get();
  return &m_client->data();
}

void MainWindow::onRunFinished(bool ok, const QString& message) {
  m_runView->refresh();
  m_runAction->setEnabled(true);
  m_resumeAction->setEnabled(true);
  m_stopAction->setEnabled(false);
  if (ok) {
    m_runBanner->setText(message.isEmpty() ? tr("Finished: %1").arg(m_client->runDir()) : message);
    m_runBanner->setStyleSheet(QStringLiteral("color: #1b5e20"));
  } else {
    m_runBanner->setText(tr("The run failed: %1\n(what arrived before is kept below)").arg(message));
    m_runBanner->setStyleSheet(QStringLiteral("color: #b00020"));
    m_runView->showLog();
    showError(tr("Run failed"), message);
  }
}

bool MainWindow::openRunFolder(const QString& dir) {
  if (m_client->isRunning()) {
    showError(tr("Open run"), tr("stop the current run first"));
    return false;
  }
  auto data = std::make_unique<RunData>();
  const Status s = loadRunFolder(dir, *data);
  const bool any = data->steps().size() > 0 || data->info().known;
  if (!s && !any) {
    showError(tr("Open run"), QString::fromStdString(s.message()));
    m_runBanner->setText(tr("Cannot replay %1: %2").arg(dir, QString::fromStdString(s.message())));
    m_runBanner->setStyleSheet(QStringLiteral("color: #b00020"));
    return false;
  }
  m_replay = std::move(data);
  m_showingReplay = true;
  m_lastRunDir = QDir(dir).absolutePath();
  m_lastRunConfig.reset();
  m_runView->setPlan(nullptr);
  if (auto runConfig = loadRunConfig(QDir(dir).filePath(QStringLiteral("config.json")).toStdString())) {
    m_lastRunConfig = *runConfig;
    m_runAnalyzer->request(*runConfig);  // the replayed run's own predictions
  }
  m_runView->setData(m_replay.get());
  m_runBanner->setText(
      s ? tr("Replay of %1").arg(dir)
        : tr("Replay of %1 (with problems: %2)").arg(dir, QString::fromStdString(s.message())));
  m_runBanner->setStyleSheet(s ? QString() : QStringLiteral("color: #b00020"));
  m_tabs->setCurrentIndex(1);
  return true;
}

}  // namespace ms
