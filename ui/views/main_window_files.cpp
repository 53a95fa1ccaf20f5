// MainWindow's project files and exports: New, Open, Save, recent files, the unsaved-changes prompt, the file
// dialogs' folder, and File > Export (launch files, Chrome traces, plots, the Run dashboard). See
// main_window.h.
#include <QDir>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QInputDialog>
#include <QLabel>
#include <QMenu>
#include <QSettings>
#include <QStandardPaths>
#include <QStatusBar>

#include "plan/hf_import.h"
#include "plan/launch_script.h"
#include "ui/models/chrome_trace.h"
#include "ui/models/project_document.h"
#include "ui/run/run_data.h"
#include "ui/views/main_window.h"
#include "ui/views/run_view.h"

namespace ms {

namespace {
constexpr int kMaxRecent = 8;
const char* kRecentKey = "recentFiles";
}  // namespace

QStringList MainWindow::recentFiles() const {
  return QSettings().value(kRecentKey).toStringList();
}

void MainWindow::addRecent(const QString& path) {
  QStringList list = recentFiles();
  list.removeAll(path);
  list.prepend(path);
  while (list.size() > kMaxRecent) list.removeLast();
  QSettings().setValue(kRecentKey, list);
  updateRecentMenu();
}

void MainWindow::updateRecentMenu() {
  m_recentMenu->clear();
  const QStringList list = recentFiles();
  for (const QString& path : list) m_recentMenu->addAction(path, this, [this, path] { openProject(path); });
  m_recentMenu->setEnabled(!list.isEmpty());
}

bool MainWindow::maybeSave() {
  if (!m_doc->isModified()) return true;
  QMessageBox::StandardButton answer;
  if (m_unsavedHandler) {
    answer = m_unsavedHandler();
  } else {
    answer = QMessageBox::question(this, tr("Unsaved changes"),
                                   tr("%1 has unsaved changes. Save them first?").arg(m_doc->displayName()),
                                   QMessageBox::Save | QMessageBox::Discard | QMessageBox::Cancel);
  }
  if (answer == QMessageBox::Save) return saveProject();
  return answer == QMessageBox::Discard;
}

bool MainWindow::openProject(const QString& path) {
  if (!maybeSave()) return false;
  const Status s = m_doc->load(path);
  if (!s) {
    const QString message = QString::fromStdString(s.message());
    m_summary->setText(tr("Cannot open %1:\n%2").arg(QFileInfo(path).fileName(), message));
    m_summary->setStyleSheet(QStringLiteral("color: #b00020"));
    showError(tr("Project failed to open"), message);
    return false;
  }
  m_lastError.clear();
  addRecent(QFileInfo(path).absoluteFilePath());
  statusBar()->showMessage(tr("Opened %1").arg(path), 5000);
  return true;
}

bool MainWindow::newProject(const QString& templateKey) {
  if (!maybeSave()) return false;
  auto config = templateConfig(templateKey);
  if (!config) {
    showError(tr("New project"), QString::fromStdString(config.message()));
    return false;
  }
  m_doc->reset(*config);
  m_lastError.clear();
  // A message about the previous project ("Opened ...") does not describe this one.
  for (const ProjectTemplate& t : projectTemplates())
    if (t.key == templateKey)
      statusBar()->showMessage(tr("New project from the template %1").arg(t.title), 5000);
  return true;
}

bool MainWindow::newProjectFromHfConfig(const QString& hfPath) {
  const std::string file = QFileInfo(hfPath).fileName().toStdString();
  QFile f(hfPath);
  if (!f.open(QIODevice::ReadOnly)) {
    showError(tr("New from Hugging Face config"),
              tr("%1: cannot read the file (%2)").arg(hfPath, f.errorString()));
    return false;
  }
  const QByteArray bytes = f.readAll();
  const nlohmann::json hf =
      nlohmann::json::parse(bytes.constData(), bytes.constData() + bytes.size(), nullptr, false);
  if (hf.is_discarded()) {
    showError(tr("New from Hugging Face config"), tr("%1: not valid JSON").arg(hfPath));
    return false;
  }
  auto imported = importHfConfig(hf, file);
  if (!imported) {
    showError(tr("New from Hugging Face config"), QString::fromStdString(imported.message()));
    return false;
  }
  // The open project's mesh, data, parallel and training settings around the imported model.
  const QString name = QFileInfo(hfPath).dir().dirName();
  auto config = runConfigFromHf(*imported, m_doc->config(),
                                QFileInfo(hfPath).baseName() == QLatin1String("config") && !name.isEmpty()
                                    ? name.toStdString()
                                    : QFileInfo(hfPath).baseName().toStdString());
  if (!config) {
    showError(tr("New from Hugging Face config"), tr("%1 does not fit the open project's plan:\n%2")
                                                      .arg(hfPath, QString::fromStdString(config.message())));
    return false;
  }
  if (!maybeSave()) return false;
  m_doc->reset(*config);
  m_lastError.clear();
  QStringList notes;
  for (const std::string& w : imported->warnings) notes << QString::fromStdString(w);
  m_lastImportNotes = notes;
  statusBar()->showMessage(
      tr("New project: the model of %1 on the previous project's mesh%2")
          .arg(QFileInfo(hfPath).fileName(),
               notes.isEmpty() ? QString() : tr(" (%1)").arg(notes.join(QStringLiteral("; ")))),
      15000);
  return true;
}

bool MainWindow::saveProject() {
  if (m_doc->filePath().isEmpty()) return chooseSaveAs();
  const Status s = m_doc->save();
  if (!s) {
    showError(tr("Save failed"), QString::fromStdString(s.message()));
    QMessageBox::warning(this, tr("Save failed"), QString::fromStdString(s.message()));
    return false;
  }
  statusBar()->showMessage(tr("Saved %1").arg(m_doc->filePath()), 5000);
  return true;
}

bool MainWindow::chooseSaveAs() {
  const QString path =
      QFileDialog::getSaveFileName(this, tr("Save project"),
                                   dialogFolder() + QLatin1Char('/') +
                                       QString::fromStdString(m_doc->config().name) + QStringLiteral(".json"),
                                   tr("Run configs (*.json)"));
  return !path.isEmpty() && saveProjectAs(path);
}

bool MainWindow::saveProjectAs(const QString& path) {
  const Status s = m_doc->save(path);
  if (!s) {
    showError(tr("Save failed"), QString::fromStdString(s.message()));
    return false;
  }
  addRecent(m_doc->filePath());
  statusBar()->showMessage(tr("Saved %1").arg(m_doc->filePath()), 5000);
  return true;
}

QString MainWindow::dialogFolder() const {
  if (!m_doc->filePath().isEmpty()) return QFileInfo(m_doc->filePath()).absolutePath();
  return QStandardPaths::writableLocation(QStandardPaths::DocumentsLocation);
}

bool MainWindow::exportLaunchFiles(const QString& dir) {
  if (!m_doc->errors().empty()) {
    showError(tr("Export"),
              QString::fromStdString(formatConfigErrors(m_doc->errors(), m_doc->config().name)));
    return false;
  }
  const Status s = exportRun(m_doc->config(), dir.toStdString());
  if (!s) {
    showError(tr("Export"), QString::fromStdString(s.message()));
    return false;
  }
  statusBar()->showMessage(tr("Exported config.json, launch.sh and slurm.sbatch to %1").arg(dir), 8000);
  return true;
}

bool MainWindow::exportTrace(const QString& path, bool measured) {
  TimelineData timeline;
  if (measured) {
    const RunData* data = runData();
    if (!data || data->timeline().rows.empty()) {
      showError(tr("Export trace"), tr("no measured spans yet: run the plan or open a run folder"));
      return false;
    }
    timeline = data->timeline();
  } else {
    if (!m_snapshot || !m_snapshot->ok()) {
      showError(tr("Export trace"), tr("the plan does not build, so there is no predicted timeline"));
      return false;
    }
    timeline = m_snapshot->timeline;
  }
  QFile f(path);
  if (!f.open(QIODevice::WriteOnly | QIODevice::Truncate) ||
      f.write(chromeTraceJson(timeline, QString::fromStdString(m_doc->config().name))) < 0) {
    showError(tr("Export trace"), tr("%1: %2").arg(path, f.errorString()));
    return false;
  }
  statusBar()->showMessage(tr("Wrote %1 (open it in ui.perfetto.dev)").arg(path), 8000);
  return true;
}

bool MainWindow::exportPlots(const QString& dir, const QString& format, double dpi) {
  if (!QDir().mkpath(dir)) {
    showError(tr("Export plots"), tr("%1: cannot create the folder").arg(dir));
    return false;
  }
  if (!m_runView->savePlots(dir, format, dpi)) {
    showError(tr("Export plots"), tr("could not write every plot into %1").arg(dir));
    return false;
  }
  statusBar()->showMessage(tr("Plots written to %1").arg(dir), 8000);
  return true;
}

bool MainWindow::exportDashboard(const QString& path, const QString& format, double dpi) {
  if (!m_runView->exportDashboard(path, format, dpi)) {
    showError(tr("Export dashboard"), m_runView->error());
    return false;
  }
  statusBar()->showMessage(tr("Wrote %1").arg(path), 8000);
  return true;
}

bool MainWindow::chooseDashboardExport() {
  QString filter;
  const QString path = QFileDialog::getSaveFileName(
      this, tr("Export the Run dashboard"), dialogFolder() + QStringLiteral("/dashboard.pdf"),
      tr("PDF, vector (*.pdf);;SVG, vector (*.svg);;PNG image (*.png)"), &filter);
  if (path.isEmpty()) return false;
  QString format = QFileInfo(path).suffix().toLower();
  if (format != QLatin1String("pdf") && format != QLatin1String("svg") && format != QLatin1String("png"))
    format = filter.startsWith(QLatin1String("SVG"))   ? QStringLiteral("svg")
             : filter.startsWith(QLatin1String("PNG")) ? QStringLiteral("png")
                                                       : QStringLiteral("pdf");
  double dpi = 300;
  if (format == QLatin1String("png")) {
    bool ok = false;
    dpi = QInputDialog::getInt(this, tr("Dashboard as PNG"), tr("Resolution (dots per inch):"), 300, 72, 1200,
                               1, &ok);
    if (!ok) return false;
  }
  return exportDashboard(path, format, dpi);
}

}  // namespace ms
