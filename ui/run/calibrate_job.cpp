// CalibrateJob; see calibrate_job.h.
#include "ui/run/calibrate_job.h"

#include <sys/types.h>
#include <unistd.h>

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QProcessEnvironment>
#include <QRegularExpression>
#include <QStandardPaths>
#include <algorithm>
#include <utility>

namespace ms {

namespace {

// engine/calibrate.cpp Progress: "calibrate: [i/N] what: result".
const QRegularExpression& progressLine() {
  static const QRegularExpression re(QStringLiteral("^calibrate: \\[(\\d+)/(\\d+)\\] (.*)$"));  // immutable
  return re;
}
// engine/main.cpp cmdCalibrate: how the engine words the reason it failed.
constexpr QLatin1String kErrorPrefix("meshstudio-engine calibrate: ");

}  // namespace

CalibrateJob::CalibrateJob(QObject* parent) : QObject(parent) {}

CalibrateJob::~CalibrateJob() {
  if (!m_process) return;
  disconnect(m_process, nullptr, this, nullptr);
  m_process->kill();
  m_process->waitForFinished(kKillWaitMs);
  removeTmp();
}

QString CalibrateJob::enginePath() const {
  if (!m_enginePath.isEmpty()) return m_enginePath;
  const QString onPath = QStandardPaths::findExecutable(QStringLiteral("meshstudio-engine"));
  return onPath.isEmpty() ? QStringLiteral("meshstudio-engine") : onPath;
}

bool CalibrateJob::start(const QString& outFile) {
  if (m_process) return false;
  m_outFile = QFileInfo(outFile).absoluteFilePath();
  m_tail.clear();
  m_lines.clear();
  m_ended = false;
  m_cancelled = false;
  m_exitCode = 0;
  m_exitStatus = QProcess::NormalExit;
  m_startError.clear();
  m_reason.clear();
  m_done = m_total = 0;
  m_current.clear();
  m_summary.clear();

  const QString engine = enginePath();
  const QStringList args =
      QStringList{QStringLiteral("calibrate"), QStringLiteral("--out"), m_outFile} + m_extraArgs;
  m_command = QStringList{engine} + args;

  m_process = new QProcess(this);
  m_process->setProcessChannelMode(QProcess::SeparateChannels);
  m_process->setStandardOutputFile(QProcess::nullDevice());  // the profile goes to --out, not stdout
  m_process->setReadChannel(QProcess::StandardError);
  QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
  if (::geteuid() == 0) {
    // Open MPI refuses root without these; calibrate passes --allow-run-as-root to its own mpirun too.
    env.insert(QStringLiteral("OMPI_ALLOW_RUN_AS_ROOT"), QStringLiteral("1"));
    env.insert(QStringLiteral("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"), QStringLiteral("1"));
  }
  m_process->setProcessEnvironment(env);
  connect(m_process, &QProcess::readyReadStandardError, this, &CalibrateJob::onReadyStderr);
  connect(m_process, &QProcess::finished, this, &CalibrateJob::onProcessFinished);
  connect(m_process, &QProcess::errorOccurred, this, &CalibrateJob::onProcessError);
  m_process->start(engine, args, QIODevice::ReadOnly);
  return true;
}

void CalibrateJob::cancel() {
  if (!m_process || m_ended) return;
  m_cancelled = true;
  m_process->kill();
}

void CalibrateJob::onReadyStderr() {
  takeStderr(false);
  drain();
}

void CalibrateJob::onProcessFinished(int exitCode, QProcess::ExitStatus status) {
  if (m_ended) return;
  m_exitCode = exitCode;
  m_exitStatus = status;
  takeStderr(true);
  m_ended = true;
  drain();
}

void CalibrateJob::onProcessError(QProcess::ProcessError error) {
  // A crash or a kill is reported by finished() as well; only a failed start ends the job here.
  if (error != QProcess::FailedToStart || m_ended) return;
  m_startError = m_process->errorString();
  m_ended = true;
  // Queued: QProcess may say this inside start(), and finished() must come after start() returned.
  QMetaObject::invokeMethod(
      this, [this] { drain(); }, Qt::QueuedConnection);
}

void CalibrateJob::takeStderr(bool atEnd) {
  if (!m_process) return;
  m_tail += m_process->readAllStandardError();
  qsizetype from = 0;
  for (qsizetype nl; (nl = m_tail.indexOf('\n', from)) >= 0; from = nl + 1)
    m_lines.push_back(QString::fromLocal8Bit(m_tail.mid(from, std::min(nl - from, kLineMax))).trimmed());
  m_tail.remove(0, from);
  if (m_tail.size() > kLineMax) {  // a "line" without an end: keep its start, drop the rest
    m_lines.push_back(QString::fromLocal8Bit(m_tail.left(kLineMax)).trimmed());
    m_tail.clear();
  }
  if (atEnd && !m_tail.isEmpty()) {
    m_lines.push_back(QString::fromLocal8Bit(m_tail).trimmed());
    m_tail.clear();
  }
}

void CalibrateJob::drain() {
  // A slot of progress() may run the event loop, which may read more stderr or see the engine end: that
  // nested call only queues, and this loop handles everything in order.
  if (m_draining || !m_process) return;
  m_draining = true;
  while (!m_lines.empty()) {
    const QString line = std::move(m_lines.front());
    m_lines.pop_front();
    handleLine(line);
  }
  m_draining = false;
  if (m_ended) report();
}

void CalibrateJob::handleLine(const QString& line) {
  if (line.isEmpty()) return;
  const QRegularExpressionMatch m = progressLine().match(line);
  if (m.hasMatch()) {
    m_done = m.captured(1).toInt();
    m_total = m.captured(2).toInt();
    m_current = m.captured(3);
    emit progress(m_done, m_total, m_current);
    return;
  }
  if (line.startsWith(QLatin1String("calibrate: ")) && line.contains(QLatin1String(" measurements in ")))
    m_summary = line;
  m_reason.push_back(line);
  while (m_reason.size() > kReasonLines) m_reason.pop_front();
}

void CalibrateJob::report() {
  bool ok = false;
  QString message;
  if (m_cancelled) {
    message = tr("calibration cancelled");
  } else if (!m_startError.isEmpty()) {
    message = tr("cannot run the engine %1: %2").arg(m_command.value(0), m_startError);
  } else if (m_exitStatus == QProcess::NormalExit && m_exitCode == 0) {
    ok = QFileInfo(m_outFile).isFile();
    message = ok ? m_outFile : tr("the engine exited without writing %1").arg(m_outFile);
  } else {
    // The engine's own reason first (the status bar shows the first line), then what it said before it.
    QStringList lines = m_reason;
    for (qsizetype i = lines.size() - 1; i >= 0; --i) {
      if (!lines[i].startsWith(kErrorPrefix)) continue;
      const QString reason = lines.takeAt(i).mid(kErrorPrefix.size());
      lines.prepend(reason);
      break;
    }
    const QString how = m_exitStatus == QProcess::CrashExit
                            ? tr("the engine was killed or crashed")
                            : tr("the engine exited with code %1").arg(m_exitCode);
    message = lines.isEmpty() ? how : lines.join(QLatin1Char('\n')) + QStringLiteral("\n(") + how + ")";
  }
  if (!ok) removeTmp();
  QProcess* process = std::exchange(m_process, nullptr);
  process->disconnect(this);
  process->deleteLater();
  emit finished(ok, message);
}

void CalibrateJob::removeTmp() const {
  const QString tmp = m_outFile + QStringLiteral(".tmp");
  if (QFileInfo(tmp).isFile()) QFile::remove(tmp);
}

}  // namespace ms
