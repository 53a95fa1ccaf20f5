// EngineClient and loadRunFolder; see engine_client.h.
#include "ui/run/engine_client.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <QCoreApplication>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QJsonDocument>
#include <QJsonObject>
#include <QStandardPaths>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

namespace ms {

namespace {

constexpr qint64 kReadChunk = 256 * 1024;   // one read() from the stdout pipe, one piece for the parser
constexpr qint64 kReadPerTurn = 1 << 20;    // read per readiness of the pipe (the rest on the next pass)
constexpr int kStderrKeep = 20;             // stderr lines kept for the failure message
constexpr qsizetype kStderrLineMax = 8192;  // a longer stderr "line" is cut (a progress bar without newlines)

QString absoluteAgainst(const QString& base, const std::string& path) {
  const QString p = QString::fromStdString(path);
  if (p.isEmpty() || QDir::isAbsolutePath(p)) return p;
  return QDir::cleanPath(QDir(base).absoluteFilePath(p));
}

// The config as the engine will read it from runDir/config.json: data paths absolute (they were relative to
// the project file, or to the studio's working directory for a project never saved), and the run folder set.
RunConfig configForRunFolder(RunConfig config, const QString& base, const QString& runDir) {
  auto fix = [&](std::vector<std::string>& paths) {
    for (std::string& p : paths) p = absoluteAgainst(base, p).toStdString();
  };
  fix(config.data.files);
  fix(config.data.train);
  fix(config.data.val);
  config.data.dir = absoluteAgainst(base, config.data.dir).toStdString();
  config.training.runDir = runDir.toStdString();
  config.baseDir = base.toStdString();
  return config;
}

QString describeExit(int code, QProcess::ExitStatus status) {
  if (status == QProcess::CrashExit) return QStringLiteral("the engine was killed or crashed");
  return QStringLiteral("the engine exited with code %1").arg(code);
}

// The last line of the run folder's metrics.jsonl when it is a run_end. launch's supervisor appends one there
// (only there, not to stdout) when the run fails or is stopped from outside, with the reason it found.
std::optional<RunEndEvent> runEndInFolder(const QString& runDir) {
  QFile f(QDir(runDir).filePath(QStringLiteral("metrics.jsonl")));
  if (!f.open(QIODevice::ReadOnly)) return std::nullopt;
  const qint64 size = f.size();
  const qint64 from = std::max<qint64>(0, size - 64 * 1024);
  if (!f.seek(from)) return std::nullopt;
  QByteArray tail = f.readAll();
  while (tail.endsWith('\n') || tail.endsWith('\r')) tail.chop(1);
  const QByteArray last = tail.mid(tail.lastIndexOf('\n') + 1);
  MetricsReader reader;
  for (MetricsEvent& e : reader.parseLine(last, 0))
    if (auto* end = std::get_if<RunEndEvent>(&e)) return *end;
  return std::nullopt;
}

// fd moved above the standard streams (kept close-on-exec): the child's stdio is set up by dup2 onto 0..2
// before our own dup2 onto stdout, which must not find its source overwritten.
int aboveStdio(int fd) {
  if (fd > STDERR_FILENO) return fd;
  const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
  ::close(fd);
  return moved;
}

}  // namespace

EngineClient::EngineClient(QObject* parent) : QObject(parent) {
  m_parseThread.setObjectName(QStringLiteral("metrics parser"));
  m_parseContext = new QObject;
  m_parseContext->moveToThread(&m_parseThread);
  connect(&m_parseThread, &QThread::finished, m_parseContext, &QObject::deleteLater);
  m_parseThread.start();
  m_notifyTimer.setSingleShot(true);
  m_notifyTimer.setInterval(kNotifyMs);
  connect(&m_notifyTimer, &QTimer::timeout, this, &EngineClient::dataChanged);
  m_drainTimer.setSingleShot(true);
  m_drainTimer.setInterval(kDrainIdleMs);
  connect(&m_drainTimer, &QTimer::timeout, this, &EngineClient::onDrainIdle);
  m_escalateTimer.setSingleShot(true);
  connect(&m_escalateTimer, &QTimer::timeout, this, [this] {
    if (!m_process) return;
    if (!m_terminated) {
      m_data.appendLog(LogLine::Studio, QStringLiteral("warning"),
                       QStringLiteral("the run did not stop in time; terminating it"));
      m_terminated = true;
      signalProcess(SIGTERM);
      m_escalateTimer.start(kKillGraceMs);
    } else {
      m_data.appendLog(LogLine::Studio, QStringLiteral("warning"), QStringLiteral("killing the engine"));
      m_process->kill();
    }
    scheduleNotify();
  });
}

EngineClient::~EngineClient() {
  stopProcessOnDestruction();
  closeStdout();
  // Parse jobs still queued are dropped with the thread; results already posted die with this object.
  m_parseThread.quit();
  m_parseThread.wait();
}

void EngineClient::stopProcessOnDestruction() {
  if (!m_process) return;
  // No signals from here on: the owner is going away. SIGINT lets the ranks save a checkpoint; SIGTERM makes
  // launch end mpirun and its ranks; SIGKILL (QProcess::kill) reaches only launch, hence last.
  m_process->disconnect(this);
  m_notifyTimer.stop();
  m_escalateTimer.stop();
  interrupt();
  if (!waitDiscardingStdout(3000)) {
    signalProcess(SIGTERM);
    if (!waitDiscardingStdout(3000)) {
      m_process->kill();
      waitDiscardingStdout(1000);
    }
  }
  closeStdout();
}

bool EngineClient::waitDiscardingStdout(int ms) {
  // The ranks finish their step and write their last lines while stopping: a full stdout pipe would hold
  // them in write() (the client no longer reads it: it is going away), so it is emptied meanwhile. Closing it
  // instead would kill the writer with SIGPIPE before its checkpoint.
  QElapsedTimer clock;
  clock.start();
  char discard[64 * 1024];
  for (;;) {
    while (m_stdoutFd >= 0) {
      const ssize_t n = ::read(m_stdoutFd, discard, sizeof discard);
      if (n > 0 || (n < 0 && errno == EINTR)) continue;
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) closeStdout();
      break;
    }
    if (m_process->state() == QProcess::NotRunning) return true;
    const qint64 left = ms - clock.elapsed();
    if (left <= 0) return false;
    if (m_process->waitForFinished(static_cast<int>(std::min<qint64>(left, 50)))) return true;
  }
}

QString EngineClient::enginePath() const {
  if (!m_enginePath.isEmpty()) return m_enginePath;
  const QString env = qEnvironmentVariable("MESHSTUDIO_ENGINE");
  if (!env.isEmpty()) return env;
  QStringList candidates;
  if (QCoreApplication::instance()) {
    const QString app = QCoreApplication::applicationDirPath();
    candidates << app + QStringLiteral("/../engine/meshstudio-engine")
               << app + QStringLiteral("/meshstudio-engine");
  }
#ifdef MS_ENGINE_PATH
  candidates << QStringLiteral(MS_ENGINE_PATH);
#endif
  for (const QString& c : candidates) {
    const QFileInfo info(c);
    if (info.isFile() && info.isExecutable()) return QDir::cleanPath(info.absoluteFilePath());
  }
  const QString onPath = QStandardPaths::findExecutable(QStringLiteral("meshstudio-engine"));
  if (!onPath.isEmpty()) return onPath;
  // Nothing found: name the build's own path, so the failure message says where it was expected.
  return candidates.isEmpty() ? QStringLiteral("meshstudio-engine") : candidates.back();
}

bool EngineClient::start(const RunConfig& config, const QString& runDir, bool resume) {
  if (m_process) return false;
  m_data.clear();
  m_resumed = resume;
  m_folderBytesAtStart = -1;
  if (resume) {
    // The run so far, so the curves carry on; its run_end is the previous attempt's, not this one's.
    loadRunFolder(runDir, m_data);
    m_data.forgetRunEnd();
    m_folderBytesAtStart = QFileInfo(QDir(runDir).filePath(QStringLiteral("metrics.jsonl"))).size();
  }
  ++m_generation;
  m_bytesInFlight = m_bytesInFlightHighWater = 0;
  m_bytesParsed = m_linesParsed = 0;
  m_finishPosted = false;
  m_saidBehind = false;
  m_toApply.clear();
  closeStdout();
  // A fresh reader for this run, set on the parser thread behind any job of an earlier run.
  QMetaObject::invokeMethod(
      m_parseContext, [this] { m_reader = MetricsReader(); }, Qt::QueuedConnection);
  m_stderrTail.clear();
  m_lastStderr.clear();
  m_exited = false;
  m_exitCode = 0;
  m_exitStatus = QProcess::NormalExit;
  m_stopRequests = 0;
  m_terminated = false;
  m_runDir = QDir(runDir).absolutePath();
  m_data.setState(RunState::Starting);

  if (!QDir().mkpath(m_runDir)) {
    fail(QStringLiteral("cannot create the run folder %1").arg(m_runDir));
    return false;
  }
  const QString base = config.baseDir.empty() ? QDir::currentPath()
                                              : QDir(QString::fromStdString(config.baseDir)).absolutePath();
  const QString configPath = m_runDir + QStringLiteral("/config.json");
  const RunConfig runConfig = configForRunFolder(config, base, m_runDir);
  if (Status s = saveRunConfig(runConfig, configPath.toStdString()); !s) {
    fail(QStringLiteral("cannot write the run's config: %1").arg(QString::fromStdString(s.message())));
    return false;
  }

  const QString engine = enginePath();
  QStringList args = {QStringLiteral("launch"),
                      configPath,
                      QStringLiteral("--"),
                      QStringLiteral("--metrics"),
                      QStringLiteral("-"),
                      QStringLiteral("--run-dir"),
                      m_runDir,
                      resume ? QStringLiteral("--resume") : QStringLiteral("--overwrite")};
  args += m_extraArgs;
  m_command = QStringList{engine} + args;
  m_data.appendLog(LogLine::Studio, QStringLiteral("info"),
                   QStringLiteral("starting: ") + m_command.join(' '));

  // The stdout pipe, read by this client (see the header): both ends close-on-exec, only the read end
  // non-blocking (O_NONBLOCK belongs to each end's open file: the engine's writes must block when it is
  // full).
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0 || (fds[0] = aboveStdio(fds[0])) < 0 ||
      (fds[1] = aboveStdio(fds[1])) < 0) {
    fail(QStringLiteral("cannot create a pipe for the engine's output: %1")
             .arg(QString::fromLocal8Bit(std::strerror(errno))));
    return false;
  }
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
#ifdef F_SETPIPE_SZ
  ::fcntl(fds[0], F_SETPIPE_SZ, kPipeBytes);  // best effort: fewer wake-ups; the bound does not depend on it
#endif
  m_stdoutFd = fds[0];
  const int writeEnd = fds[1];
  m_stdoutNotifier = new QSocketNotifier(m_stdoutFd, QSocketNotifier::Read, this);
  connect(m_stdoutNotifier, &QSocketNotifier::activated, this, &EngineClient::readStdout);

  m_process = new QProcess(this);
  m_process->setProcessChannelMode(QProcess::SeparateChannels);
  m_process->setStandardOutputFile(QProcess::nullDevice());
  m_process->setReadChannel(QProcess::StandardError);
  // Runs in the child between fork and exec, after QProcess set up its stdio: async-signal-safe calls only.
  m_process->setChildProcessModifier([writeEnd] {
    if (::dup2(writeEnd, STDOUT_FILENO) < 0) {
      static const char kMessage[] = "meshstudio: cannot connect the engine's stdout to the studio\n";
      (void)!::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
      ::_exit(127);
    }
  });
  m_process->setWorkingDirectory(QFileInfo(base).isDir() ? base : m_runDir);
  connect(m_process, &QProcess::started, this, [this] {
    if (m_data.state() == RunState::Starting) m_data.setState(RunState::Running);
    emit started();
    scheduleNotify();
  });
  connect(m_process, &QProcess::readyReadStandardError, this, &EngineClient::onReadyStderr);
  connect(m_process, &QProcess::finished, this, &EngineClient::onProcessFinished);
  connect(m_process, &QProcess::errorOccurred, this, &EngineClient::onProcessError);
  m_process->start(engine, args, QIODevice::ReadOnly);
  // The child has its copy (or never started: fail() then closed the read end too). Ours must go, or the
  // pipe would never report its end.
  ::close(writeEnd);
  return true;
}

void EngineClient::stop() {
  if (!m_process) return;
  ++m_stopRequests;
  if (m_process->processId() <= 0) {  // not started yet (or already gone): nothing to ask politely
    m_process->kill();
    return;
  }
  if (m_stopRequests == 1) {
    m_data.appendLog(LogLine::Studio, QStringLiteral("info"),
                     QStringLiteral("stop requested: the run ends after its current step"));
    interrupt();
    m_escalateTimer.start(kStopEscalateMs);
  } else if (!m_terminated) {
    m_data.appendLog(LogLine::Studio, QStringLiteral("warning"),
                     QStringLiteral("stop requested again: terminating"));
    m_terminated = true;
    signalProcess(SIGTERM);
    m_escalateTimer.start(kKillGraceMs);
  } else {
    m_process->kill();
  }
  scheduleNotify();
}

void EngineClient::interrupt() {
  // launch turns the first SIGINT into a graceful stop of every rank (SIGUSR1 through mpirun): they finish
  // the step, save the checkpoint and rank 0 writes run_end "interrupted"; launch then exits 130.
  signalProcess(SIGINT);
}

void EngineClient::signalProcess(int sig) {
  if (!m_process) return;
  const qint64 pid = m_process->processId();
  if (pid > 0) ::kill(static_cast<pid_t>(pid), sig);
}

bool EngineClient::readingPaused() const {
  return m_stdoutNotifier && !m_stdoutNotifier->isEnabled();
}

void EngineClient::readStdout() {
  if (m_stdoutFd < 0) return;
  // Read while under the bound (a piece never takes it past); the rest stays in the pipe, and once that is
  // full, the engine waits in write().
  if (m_readBuffer.size() != kReadChunk) m_readBuffer.resize(kReadChunk);
  qint64 read = 0;
  while (m_bytesInFlight < kMaxBytesInFlight && read < kReadPerTurn) {
    const qint64 want = std::min(kReadChunk, kMaxBytesInFlight - m_bytesInFlight);
    const ssize_t n = ::read(m_stdoutFd, m_readBuffer.data(), static_cast<std::size_t>(want));
    if (n > 0) {
      read += n;
      post(QByteArray(m_readBuffer.constData(), n), false);
      m_bytesInFlightHighWater = std::max(m_bytesInFlightHighWater, m_bytesInFlight);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0)
      m_data.appendLog(LogLine::Studio, QStringLiteral("error"),
                       QStringLiteral("reading the engine's output failed: %1")
                           .arg(QString::fromLocal8Bit(std::strerror(errno))));
    closeStdout();  // its end: every writer closed it
    break;
  }
  if (m_stdoutNotifier) {
    const bool behind = m_bytesInFlight >= kMaxBytesInFlight;
    if (behind && !m_saidBehind) {
      m_saidBehind = true;
      m_data.appendLog(LogLine::Studio, QStringLiteral("info"),
                       QStringLiteral("the engine writes metrics faster than the studio takes them in: "
                                      "reading pauses while %1 MB wait, and the engine waits on its writes")
                           .arg(kMaxBytesInFlight >> 20));
      scheduleNotify();
    }
    // Off while behind; applySome() turns it back on once half the bound is applied.
    m_stdoutNotifier->setEnabled(!behind);
  }
  if (read > 0 && m_exited && m_stdoutFd >= 0) m_drainTimer.start();
  finishStreamIfDone();
}

void EngineClient::closeStdout() {
  m_drainTimer.stop();
  if (m_stdoutNotifier) {
    // Possibly inside its own activated(): disabled now, deleted later; before the fd is closed.
    m_stdoutNotifier->setEnabled(false);
    m_stdoutNotifier->deleteLater();
    m_stdoutNotifier = nullptr;
  }
  if (m_stdoutFd >= 0) {
    ::close(m_stdoutFd);
    m_stdoutFd = -1;
  }
}

void EngineClient::onDrainIdle() {
  if (!m_process || m_stdoutFd < 0) return;
  if (readingPaused()) {  // not silent: the studio is behind
    m_drainTimer.start();
    return;
  }
  m_data.appendLog(
      LogLine::Studio, QStringLiteral("warning"),
      QStringLiteral("the engine exited but its output stayed open and silent for %1 s (a process "
                     "it started?); stopped reading it")
          .arg(kDrainIdleMs / 1000.0));
  closeStdout();
  finishStreamIfDone();
}

void EngineClient::finishStreamIfDone() {
  if (!m_process || !m_exited || m_stdoutFd >= 0 || m_finishPosted) return;
  m_finishPosted = true;
  post(QByteArray(), true);  // finalize() runs when its answer is applied: everything before it was
}

void EngineClient::post(QByteArray bytes, bool finish) {
  m_bytesInFlight += bytes.size();
  const quint64 generation = m_generation;
  QMetaObject::invokeMethod(
      m_parseContext,
      [this, bytes = std::move(bytes), finish, generation] {
        std::vector<MetricsEvent> events = finish ? m_reader.finish() : m_reader.feed(bytes);
        const qint64 lines = m_reader.linesRead(), size = bytes.size();
        QMetaObject::invokeMethod(
            this,
            [this, generation, events = std::move(events), size, lines, finish]() mutable {
              onParsed(generation, std::move(events), size, lines, finish);
            },
            Qt::QueuedConnection);
      },
      Qt::QueuedConnection);
}

void EngineClient::onParsed(quint64 generation, std::vector<MetricsEvent> events, qint64 bytes, qint64 lines,
                            bool done) {
  if (generation != m_generation) return;
  // Only queued here: applying is applySome()'s, a slice per pass of the event loop.
  m_toApply.push_back(Parsed{std::move(events), 0, bytes, lines, done});
  scheduleApply();
}

void EngineClient::scheduleApply() {
  if (m_applyPosted) return;
  m_applyPosted = true;
  // A posted call: the event loop delivers what was posted before it first, and timers, input and paint get
  // their turn between two slices.
  QMetaObject::invokeMethod(this, &EngineClient::applySome, Qt::QueuedConnection);
}

void EngineClient::applySome() {
  m_applyPosted = false;
  QElapsedTimer clock;
  clock.start();
  constexpr qint64 kSliceNs = qint64(kApplySliceMs) * 1000000;
  bool applied = false;
  while (!m_toApply.empty()) {
    Parsed& p = m_toApply.front();
    while (p.next < p.events.size()) {
      m_data.apply(std::move(p.events[p.next++]));
      applied = true;
      if (p.next % 16 == 0 && clock.nsecsElapsed() >= kSliceNs) break;
    }
    if (p.next < p.events.size()) break;  // the slice is over
    m_bytesInFlight -= p.bytes;
    m_bytesParsed += p.bytes;
    m_linesParsed = p.lines;
    const bool done = p.done;
    m_toApply.pop_front();
    if (done) {
      finalize();
      return;
    }
    if (clock.nsecsElapsed() >= kSliceNs) break;
  }
  if (!m_toApply.empty()) scheduleApply();
  if (applied) scheduleNotify();
  // Caught up to half the bound: watch the pipe again (what it holds is then read at once).
  if (readingPaused() && m_bytesInFlight <= kMaxBytesInFlight / 2) m_stdoutNotifier->setEnabled(true);
}

void EngineClient::onReadyStderr() {
  if (!m_process) return;
  m_stderrTail += m_process->readAllStandardError();
  qsizetype from = 0;
  for (qsizetype nl; (nl = m_stderrTail.indexOf('\n', from)) >= 0; from = nl + 1) {
    QByteArray line = m_stderrTail.mid(from, nl - from);
    // A progress bar redraws with carriage returns: its last state is the line.
    if (const qsizetype cr = line.lastIndexOf('\r', line.size() - 2); cr >= 0) line = line.mid(cr + 1);
    const QString text = QString::fromUtf8(line).trimmed().left(kStderrLineMax);
    if (text.isEmpty()) continue;
    m_lastStderr << text;
    while (m_lastStderr.size() > kStderrKeep) m_lastStderr.removeFirst();
    m_data.appendLog(LogLine::Stderr, QStringLiteral("stderr"), text);
  }
  m_stderrTail.remove(0, from);
  if (m_stderrTail.size() > kStderrLineMax) m_stderrTail = m_stderrTail.right(kStderrLineMax);
  scheduleNotify();
}

void EngineClient::onProcessFinished(int exitCode, QProcess::ExitStatus status) {
  m_exited = true;
  m_exitCode = exitCode;
  m_exitStatus = status;
  m_escalateTimer.stop();
  onReadyStderr();
  if (!m_stderrTail.isEmpty()) {
    m_stderrTail += '\n';
    onReadyStderr();
  }
  // What stdout still holds is read as the bound allows; the stream ends at the pipe's end (or after
  // kDrainIdleMs of silence while something else holds it open).
  readStdout();
  if (m_stdoutFd >= 0) m_drainTimer.start();
  finishStreamIfDone();  // when stdout had already ended
}

void EngineClient::onProcessError(QProcess::ProcessError error) {
  // Crashes and read errors end in finished(); only a process that never started needs handling here.
  if (error != QProcess::FailedToStart || !m_process) return;
  fail(QStringLiteral("cannot start the engine %1: %2 (set MESHSTUDIO_ENGINE to a built meshstudio-engine)")
           .arg(m_command.value(0), m_process->errorString()));
}

void EngineClient::fail(const QString& message) {
  if (m_process) {
    m_process->disconnect(this);
    m_process->deleteLater();
    m_process = nullptr;
  }
  closeStdout();
  m_toApply.clear();
  m_escalateTimer.stop();
  m_notifyTimer.stop();
  m_data.appendLog(LogLine::Studio, QStringLiteral("error"), message);
  m_data.setState(RunState::Failed, message);
  emit dataChanged();
  emit finished(false, message);
}

void EngineClient::scheduleNotify() {
  if (!m_notifyTimer.isActive()) m_notifyTimer.start();
}

void EngineClient::finalize() {
  if (!m_process) return;
  m_process->disconnect(this);
  m_process->deleteLater();
  m_process = nullptr;
  closeStdout();
  m_toApply.clear();
  m_escalateTimer.stop();
  m_notifyTimer.stop();

  // The end as the engine saw it: rank 0's run_end on stdout, else the one launch appended to the folder.
  std::optional<RunEndEvent> end = m_data.runEnd();
  if (!end) {
    // After a resume the folder ends with the previous attempt's run_end until this one appends its own.
    const qint64 bytes = QFileInfo(QDir(m_runDir).filePath(QStringLiteral("metrics.jsonl"))).size();
    if (!m_resumed || bytes > m_folderBytesAtStart) end = runEndInFolder(m_runDir);
    if (end) m_data.apply(MetricsEvent(*end));
  }
  const bool exitedOk = m_exitStatus == QProcess::NormalExit && m_exitCode == 0;
  const QString endStatus = end ? end->status : QString();
  bool ok = false;
  RunState state = RunState::Failed;
  QString message;
  if (exitedOk && endStatus == QLatin1String("ok")) {
    ok = true;
    state = RunState::Finished;
    message = QStringLiteral("finished after step %1").arg(end->step);
  } else if (endStatus == QLatin1String("interrupted")) {
    // Stopped on request (the engine exits non-zero then, by design). Asked for by this studio's stop(): the
    // run ended as wanted. Stopped by someone else: reported as not ok, with the engine's reason.
    ok = m_stopRequests > 0;
    state = RunState::Interrupted;
    message = end->reason.isEmpty() ? QStringLiteral("stopped after step %1").arg(end->step) : end->reason;
  } else {
    // The engine's own words: the run_end reason and launch's last line on stderr (it names the rank that
    // died and what it was doing; rank 0's reason may only say that another rank failed), else the last
    // stderr lines, else the exit code.
    if (endStatus == QLatin1String("error")) message = end->reason;
    const QLatin1String prefix("meshstudio-engine launch: ");
    QString launchReason;
    for (auto it = m_lastStderr.crbegin(); it != m_lastStderr.crend() && launchReason.isEmpty(); ++it)
      if (it->startsWith(prefix)) launchReason = it->mid(prefix.size());
    if (message.isEmpty())
      message = launchReason;
    else if (!launchReason.isEmpty() && !message.contains(launchReason))
      message += QStringLiteral("; ") + launchReason;
    if (message.isEmpty() && !m_lastStderr.isEmpty())
      message = m_lastStderr.mid(std::max<qsizetype>(0, m_lastStderr.size() - 3)).join('\n');
    const QString exit = describeExit(m_exitCode, m_exitStatus);
    message = message.isEmpty() ? exit : message + QStringLiteral(" (") + exit + QStringLiteral(")");
    if (exitedOk) message = QStringLiteral("the engine ended without finishing the run: ") + message;
    if (m_stopRequests > 0) {
      // Ended some other way after stop() (terminated, or signalled before it had ranks): as asked.
      ok = true;
      state = RunState::Interrupted;
      message = QStringLiteral("%1 at the studio's request after step %2 (%3)")
                    .arg(m_terminated ? QStringLiteral("terminated") : QStringLiteral("stopped"))
                    .arg(m_data.lastStep())
                    .arg(message);
    }
  }
  m_data.setState(state, message);
  m_data.appendLog(LogLine::Studio, ok ? QStringLiteral("info") : QStringLiteral("error"), message);
  emit dataChanged();
  emit finished(ok, message);
}

Status loadRunFolder(const QString& dir, RunData& data) {
  data.clear();
  const QString path = QDir(dir).filePath(QStringLiteral("metrics.jsonl"));
  QFile file(path);
  if (!file.exists()) {
    const QString m =
        QStringLiteral("%1: no such file (not a run folder, or its run never started)").arg(path);
    data.setState(RunState::Failed, m);
    return Status::error(m.toStdString());
  }
  if (!file.open(QIODevice::ReadOnly)) {
    const QString m = QStringLiteral("%1: cannot read: %2").arg(path, file.errorString());
    data.setState(RunState::Failed, m);
    return Status::error(m.toStdString());
  }
  MetricsReader reader;
  QString firstError;
  std::int64_t errors = 0;
  auto take = [&](std::vector<MetricsEvent>& events) {
    for (const MetricsEvent& e : events)
      if (const auto* err = std::get_if<MetricsError>(&e)) {
        if (errors++ == 0) firstError = err->message;
      }
    data.apply(events);
  };
  while (!file.atEnd()) {
    const QByteArray chunk = file.read(1 << 20);
    if (chunk.isEmpty() && file.error() != QFileDevice::NoError) break;
    std::vector<MetricsEvent> events = reader.feed(chunk);
    take(events);
  }
  std::vector<MetricsEvent> tail = reader.finish();
  take(tail);
  if (!data.runEnd())
    data.setState(RunState::Incomplete,
                  QStringLiteral("no run_end: the run is still going, or its engine was killed"));
  if (file.error() != QFileDevice::NoError)
    return Status::error(QStringLiteral("%1: reading failed after %2 bytes: %3")
                             .arg(path)
                             .arg(reader.bytesRead())
                             .arg(file.errorString())
                             .toStdString());
  if (errors > 0)
    return Status::error(QStringLiteral("%1: %2 malformed line(s), the rest was read; the first: %3")
                             .arg(path)
                             .arg(errors)
                             .arg(firstError)
                             .toStdString());
  return Status::ok();
}

}  // namespace ms
