// MainWindow's Tools menu: measuring this machine into a device profile (CalibrateJob under a progress
// dialog, docs/calibration.md) and making that profile the project's devices and links. See main_window.h.
#include <QAction>
#include <QDir>
#include <QFileInfo>
#include <QMenu>
#include <QMenuBar>
#include <QProgressDialog>
#include <QStandardPaths>
#include <QStatusBar>
#include <QSysInfo>
#include <algorithm>

#include "plan/device_profile.h"
#include "ui/models/project_document.h"
#include "ui/run/calibrate_job.h"
#include "ui/run/engine_client.h"
#include "ui/views/main_window.h"

namespace ms {

namespace {

constexpr int kDialogWidth = 520;  // pixels: room for the longest measurement's label

// The host name as a file name: [A-Za-z0-9._-] kept, anything else '_', never hidden, never empty.
QString profileFileStem() {
  QString host = QSysInfo::machineHostName();
  for (QChar& c : host) {
    const char16_t u = c.unicode();
    const bool portable = (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') ||
                          u == '.' || u == '_' || u == '-';
    if (!portable) c = QLatin1Char('_');
  }
  if (host.startsWith(QLatin1Char('.'))) host[0] = QLatin1Char('_');
  return host.isEmpty() ? QString::fromLatin1(MainWindow::kThisMachineProfile) : host;
}

}  // namespace

void MainWindow::buildToolsMenu() {
  QMenu* tools = menuBar()->addMenu(tr("&Tools"));
  m_calibrateAction =
      tools->addAction(tr("&Calibrate This Machine..."), this, [this] { calibrateThisMachine(); });
  m_calibrateAction->setObjectName(QStringLiteral("calibrateMachineAction"));
  m_calibrateAction->setStatusTip(
      tr("Measure this machine's compute and links into a device profile (meshstudio-engine calibrate, "
         "about a minute)"));
  m_useProfileAction =
      tools->addAction(tr("&Use This Machine's Profile"), this, [this] { useThisMachineProfile(); });
  m_useProfileAction->setObjectName(QStringLiteral("useMachineProfileAction"));
  m_useProfileAction->setStatusTip(
      tr("Put every node of the project on this machine's measured profile, with its measured links"));
  // The file may come and go behind the studio's back: look again whenever the menu opens.
  connect(tools, &QMenu::aboutToShow, this, &MainWindow::updateProfileActions);
  connect(m_calibrateJob, &CalibrateJob::progress, this, &MainWindow::onCalibrateProgress);
  connect(m_calibrateJob, &CalibrateJob::finished, this, &MainWindow::onCalibrateFinished);
  updateProfileActions();
}

QString MainWindow::profilesFolder() const {
  if (!m_profilesFolder.isEmpty()) return m_profilesFolder;
  return QStandardPaths::writableLocation(QStandardPaths::AppDataLocation) + QStringLiteral("/profiles");
}

void MainWindow::setProfilesFolder(const QString& dir) {
  m_profilesFolder = dir;
  updateProfileActions();
}

QString MainWindow::thisMachineProfilePath() const {
  return QDir(profilesFolder()).absoluteFilePath(profileFileStem() + QStringLiteral(".json"));
}

void MainWindow::setCalibrateArguments(const QStringList& args) {
  m_calibrateJob->setExtraArguments(args);
}

void MainWindow::updateProfileActions() {
  if (!m_calibrateAction) return;
  m_calibrateAction->setEnabled(!m_calibrateJob->isRunning());
  m_useProfileAction->setEnabled(QFileInfo(thisMachineProfilePath()).isFile());
}

bool MainWindow::calibrateThisMachine() {
  const QString title = tr("Calibrate this machine");
  if (m_calibrateJob->isRunning()) {
    showError(title, tr("a calibration is already going"));
    return false;
  }
  const QString folder = profilesFolder();
  if (!QDir().mkpath(folder)) {
    showError(title, tr("cannot create the profiles folder %1").arg(folder));
    return false;
  }
  const QString path = thisMachineProfilePath();
  m_lastError.clear();
  m_calibrateJob->setEnginePath(m_client->enginePath());

  if (m_calibrateDialog) m_calibrateDialog->deleteLater();
  // Window-modal and shown, never exec()'d: the event loop keeps reading the engine, and nothing waits on it.
  m_calibrateDialog = new QProgressDialog(tr("Starting the engine..."), tr("Cancel"), 0, 0, this);
  m_calibrateDialog->setObjectName(QStringLiteral("calibrateDialog"));
  m_calibrateDialog->setWindowTitle(tr("Calibrating This Machine"));
  m_calibrateDialog->setWindowModality(Qt::WindowModal);
  m_calibrateDialog->setAutoClose(false);
  m_calibrateDialog->setAutoReset(false);  // the last value stays, for people and tests
  m_calibrateDialog->setMinimumDuration(0);
  m_calibrateDialog->setMinimumWidth(kDialogWidth);
  connect(m_calibrateDialog, &QProgressDialog::canceled, this, &MainWindow::cancelCalibration);

  if (!m_calibrateJob->start(path)) {  // not reached: isRunning() was checked
    showError(title, tr("a calibration is already going"));
    return false;
  }
  m_calibrateDialog->show();
  updateProfileActions();
  statusBar()->showMessage(tr("Calibrating this machine into %1...").arg(path));
  return true;
}

void MainWindow::cancelCalibration() {
  if (!m_calibrateJob->isRunning()) return;
  m_calibrateJob->cancel();
  statusBar()->showMessage(tr("Cancelling the calibration..."));
}

void MainWindow::onCalibrateProgress(int done, int total, const QString& what) {
  if (!m_calibrateDialog) return;
  if (m_calibrateDialog->maximum() != total) m_calibrateDialog->setRange(0, total);
  m_calibrateDialog->setLabelText(tr("Measurement %1 of %2:\n%3").arg(done).arg(total).arg(what));
  // A modal dialog's setValue() runs the event loop; CalibrateJob holds back what arrives meanwhile.
  m_calibrateDialog->setValue(done);
}

void MainWindow::onCalibrateFinished(bool ok, const QString& message) {
  if (m_calibrateDialog) m_calibrateDialog->hide();
  updateProfileActions();
  if (ok) {
    statusBar()->showMessage(
        tr("This machine's profile is in %1; Tools > Use This Machine's Profile applies it to the project")
            .arg(message));
  } else if (m_calibrateJob->wasCancelled()) {
    statusBar()->showMessage(tr("Calibration cancelled; %1 is as it was").arg(m_calibrateJob->outFile()),
                             15000);
  } else {
    showError(tr("Calibration failed"), message);
  }
}

bool MainWindow::useThisMachineProfile() {
  const QString title = tr("Use this machine's profile");
  const QString path = thisMachineProfilePath();
  if (!QFileInfo(path).isFile()) {
    showError(title, tr("no profile at %1: Tools > Calibrate This Machine measures one").arg(path));
    return false;
  }
  auto loaded = loadDeviceProfile(path.toStdString());
  if (!loaded) {
    const QString reason = QString::fromStdString(loaded.message());
    showError(title, reason.contains(path) ? reason : path + QStringLiteral(": ") + reason);
    return false;
  }
  const std::shared_ptr<const DeviceProfile> profile = *loaded;
  const std::string name = kThisMachineProfile;
  // Between nodes: the link measured between two hosts (calibrate --hosts: "net") when there is one, else
  // TCP on this host.
  const bool shm = profile->link("shm") != nullptr, net = profile->link("net") != nullptr,
             tcp = net || profile->link("tcp") != nullptr;
  const auto change = [&](RunConfig& c) {
    const ProfileConfig entry{name, path.toStdString(), profile};
    const auto it = std::find_if(c.mesh.profiles.begin(), c.mesh.profiles.end(),
                                 [&](const ProfileConfig& p) { return p.name == name; });
    if (it != c.mesh.profiles.end())
      *it = entry;
    else
      c.mesh.profiles.push_back(entry);
    for (NodeConfig& n : c.mesh.nodes) n.device = name;
    if (shm) c.mesh.intraLink = name + ".shm";
    if (tcp) c.mesh.interLink = name + (net ? ".net" : ".tcp");
  };
  const quint64 revision = m_doc->revision();
  m_doc->edit(tr("Use This Machine's Profile"), change);
  if (m_doc->revision() == revision) {
    // The project names this very file already (ProfileConfig compares name and file), so there is nothing
    // to undo; only the measurements in the file may be newer. Take them.
    RunConfig refreshed = m_doc->config();
    change(refreshed);
    m_doc->applyConfig(refreshed);
  }

  QString text = tr("Every node now runs on this machine's profile (%1)").arg(path);
  const RunConfig& c = m_doc->config();
  if (!shm)
    text += tr("; it measured no shm link, so the link inside a node stays %1")
                .arg(QString::fromStdString(c.mesh.intraLink));
  if (!tcp)
    text += tr("; it measured no net or tcp link, so the link between nodes stays %1")
                .arg(QString::fromStdString(c.mesh.interLink));
  statusBar()->showMessage(text, 20000);
  return true;
}

}  // namespace ms
