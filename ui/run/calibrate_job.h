// CalibrateJob: measures this machine from the studio (Tools > Calibrate This Machine). It runs
// `meshstudio-engine calibrate --out FILE [extra arguments]` with QProcess (docs/calibration.md), reads the
// engine's stderr as it arrives and turns its `calibrate: [i/N] what: result` lines into progress().
//
// What always holds: nothing here blocks the GUI thread but the destructor of a job still running (it kills
// the engine and waits at most kKillWaitMs). Lines are handled whole and in the order the engine wrote them,
// however its stderr is split across reads, and even when a slot connected to progress() runs the event loop
// (a modal QProgressDialog's setValue() does): a line that arrives meanwhile waits its turn. finished() is
// emitted exactly once per start() that returned true, after every line before the engine's end was reported;
// ok means the engine exited 0 and FILE exists. A failure's message is the engine's own reason (its last
// stderr lines that are not progress), else how it ended. The engine writes FILE.tmp and renames it, so FILE
// is whole or untouched; a FILE.tmp left by a cancelled or failed run is removed.
#pragma once

#include <QObject>
#include <QProcess>
#include <QString>
#include <QStringList>
#include <deque>

namespace ms {

class CalibrateJob : public QObject {
  Q_OBJECT
 public:
  static constexpr int kReasonLines = 6;       // non-progress stderr lines kept for a failure's message
  static constexpr qsizetype kLineMax = 8192;  // a longer stderr "line" is cut
  static constexpr int kKillWaitMs = 3000;     // the destructor's wait for a killed engine

  explicit CalibrateJob(QObject* parent = nullptr);
  ~CalibrateJob() override;

  // The engine executable (the studio passes EngineClient::enginePath(), so a run and a calibration use the
  // same one); empty: meshstudio-engine on PATH.
  void setEnginePath(const QString& path) { m_enginePath = path; }
  QString enginePath() const;
  // Arguments after `calibrate --out FILE` (tests pass {"--quick"}).
  void setExtraArguments(const QStringList& args) { m_extraArgs = args; }
  QStringList extraArguments() const { return m_extraArgs; }

  // Starts measuring into outFile (made absolute). False, with no signal, when a job is already going; every
  // other failure, starting the engine included, comes through finished().
  bool start(const QString& outFile);
  // Stops the engine (SIGKILL; its mpirun job dies with it, engine/calibrate.cpp runWithDeadline);
  // finished(false, ...) follows, saying it was cancelled.
  void cancel();
  bool isRunning() const { return m_process != nullptr; }
  bool wasCancelled() const { return m_cancelled; }

  QString outFile() const { return m_outFile; }
  QStringList commandLine() const { return m_command; }
  // The newest progress: measurements done, the total the engine announced (0 before its first line), what.
  int done() const { return m_done; }
  int total() const { return m_total; }
  QString current() const { return m_current; }
  // The engine's summary line on success ("calibrate: 102 measurements in 2.9 s; profile written to ...").
  QString summary() const { return m_summary; }

 signals:
  void progress(int done, int total, const QString& what);
  void finished(bool ok, const QString& message);

 private:
  void onReadyStderr();
  void onProcessFinished(int exitCode, QProcess::ExitStatus status);
  void onProcessError(QProcess::ProcessError error);
  // Splits what was read into whole lines, queued; the partial last one stays in m_tail.
  void takeStderr(bool atEnd);
  // Handles queued lines in order, then, once the engine has ended, reports it; not re-entered.
  void drain();
  void handleLine(const QString& line);
  void report();
  void removeTmp() const;

  QString m_enginePath;
  QStringList m_extraArgs;
  QStringList m_command;
  QString m_outFile;
  QProcess* m_process = nullptr;  // non-null from start() until finished() is emitted
  QByteArray m_tail;              // an unfinished stderr line
  std::deque<QString> m_lines;    // whole lines not yet handled
  bool m_draining = false;
  bool m_ended = false;  // the engine exited (or never started); report once the lines are handled
  bool m_cancelled = false;
  int m_exitCode = 0;
  QProcess::ExitStatus m_exitStatus = QProcess::NormalExit;
  QString m_startError;  // the engine did not start: why
  QStringList m_reason;  // the last non-progress stderr lines
  int m_done = 0, m_total = 0;
  QString m_current;
  QString m_summary;
};

}  // namespace ms
