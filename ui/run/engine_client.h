// EngineClient: runs a config for real from the studio. It writes the config into the run folder, starts
// `meshstudio-engine launch <runDir>/config.json -- --metrics - --run-dir <runDir> --overwrite` with QProcess
// (launch runs mpirun with one rank per planned device and supervises it, engine/supervisor.h), reads the
// metrics stream from its stdout through a MetricsReader into a RunData, and its stderr into the log.
//
// What always holds: the JSON is parsed on the client's own parser thread, never on the GUI thread (a spans
// line of a many-rank run is megabytes: about 20 ms per MB, measured by bench/ui_stream); the GUI thread only
// moves bytes to the parser and applies the parsed events to the RunData, in stream order. At most
// kMaxBytesInFlight bytes are handed to the parser at a time (the rest waits in QProcess's buffer, which
// grows when the engine writes faster than one parser thread parses, about 45 MB/s: a log warning says so);
// dataChanged() is emitted at most once per kNotifyMs, never per line; finished() is emitted exactly once per
// start(), after everything the engine wrote was read, with ok = the run finished or ended by stop(), and
// otherwise the engine's own reason (rank 0's run_end, else the one launch appended to the run folder's
// metrics.jsonl, with launch's last word on stderr; else the last stderr lines; else the exit code); the
// engine is not left running when the client is destroyed (SIGINT, then SIGTERM, then SIGKILL, a few seconds
// apart).
#pragma once

#include <QElapsedTimer>
#include <QObject>
#include <QProcess>
#include <QString>
#include <QStringList>
#include <QThread>
#include <QTimer>

#include "common/status.h"
#include "plan/run_config.h"
#include "ui/run/metrics_reader.h"
#include "ui/run/run_data.h"

namespace ms {

class EngineClient : public QObject {
  Q_OBJECT
 public:
  static constexpr int kNotifyMs = 50;                    // dataChanged() at most this often
  static constexpr qint64 kMaxBytesInFlight = 32 << 20;   // read but not yet parsed
  static constexpr qint64 kBacklogWarnBytes = 256 << 20;  // buffered by QProcess: one warning in the log
  static constexpr int kStopEscalateMs = 20000;  // after stop(): SIGTERM when the run has not ended by then
  static constexpr int kKillGraceMs = 5000;      // after SIGTERM: SIGKILL

  explicit EngineClient(QObject* parent = nullptr);
  ~EngineClient() override;

  // The engine executable: the one set here, else $MESHSTUDIO_ENGINE, else meshstudio-engine beside the
  // application (<app dir>/../engine/ in the build tree, <app dir>/ when installed), else the build's own
  // (MS_ENGINE_PATH), else meshstudio-engine on PATH.
  void setEnginePath(const QString& path) { m_enginePath = path; }
  QString enginePath() const;
  // Extra train options after the client's own (e.g. {"--steps", "10"}).
  void setExtraTrainArguments(const QStringList& args) { m_extraArgs = args; }

  // Starts a run of config in runDir (created when missing; config.json there is overwritten, and so are the
  // folder's checkpoints). Relative data paths are made absolute against config.baseDir (else the studio's
  // working directory), because the engine reads the copy in runDir. False when a run is already going (no
  // signal), or, with finished(false, reason), when the config cannot be written; a failure to start the
  // process is reported by finished() too.
  bool start(const RunConfig& config, const QString& runDir) { return start(config, runDir, false); }
  // resume: continue the run in runDir from its newest checkpoint (`train --resume`) instead of starting
  // afresh; what the folder's metrics.jsonl holds is loaded first, so the curves carry on.
  bool start(const RunConfig& config, const QString& runDir, bool resume);
  bool resumed() const { return m_resumed; }
  // Asks the run to stop after its current step: SIGINT to launch, which asks every rank (SIGUSR1 through
  // mpirun) to finish its step and save a checkpoint; run_end then says "interrupted". A second stop(), or
  // the run still going kStopEscalateMs later, terminates it (SIGTERM to launch, which ends
  // mpirun and its ranks, then SIGKILL).
  void stop();
  bool isRunning() const { return m_process != nullptr; }

  const RunData& data() const { return m_data; }
  // Bytes and lines of the metrics stream read so far in this run.
  qint64 bytesReceived() const { return m_bytesParsed; }
  qint64 linesReceived() const { return m_linesParsed; }
  QString runDir() const { return m_runDir; }
  // The command line of the current (or last) run, for the log and for people.
  QStringList commandLine() const { return m_command; }

 signals:
  void started();
  void dataChanged();
  void finished(bool ok, const QString& message);

 private:
  void onReadyStdout();
  void onReadyStderr();
  void onProcessFinished(int exitCode, QProcess::ExitStatus status);
  void onProcessError(QProcess::ProcessError error);
  void pump();
  void scheduleNotify();
  void finalize();
  void signalProcess(int sig);
  // SIGINT to launch: a graceful stop after the current step.
  void interrupt();
  void fail(const QString& message);
  void stopProcessOnDestruction();

  QString m_enginePath;
  QStringList m_extraArgs;
  QStringList m_command;
  QString m_runDir;
  QProcess* m_process = nullptr;  // non-null while a run is going (until finished() is emitted)
  // The parser thread: a context object living there runs feed() and finish() on m_reader (touched only on
  // that thread) in posting order and posts the events back to this object.
  void post(QByteArray bytes, bool finish);
  void onParsed(quint64 generation, std::vector<MetricsEvent> events, qint64 bytes, qint64 lines, bool done);
  QThread m_parseThread;
  QObject* m_parseContext = nullptr;
  MetricsReader m_reader;
  quint64 m_generation = 0;    // one per start(); results of an earlier run are dropped
  qint64 m_bytesInFlight = 0;  // posted to the parser, not yet back
  qint64 m_bytesParsed = 0, m_linesParsed = 0;
  bool m_finishPosted = false;
  bool m_warnedBacklog = false;
  RunData m_data;
  QByteArray m_stderrTail;   // an unfinished stderr line
  QStringList m_lastStderr;  // the last few stderr lines, for the failure message
  QTimer m_notifyTimer;      // single shot: coalesces dataChanged()
  QTimer m_escalateTimer;    // single shot: stop() did not end the run
  bool m_exited = false;
  int m_exitCode = 0;
  QProcess::ExitStatus m_exitStatus = QProcess::NormalExit;
  int m_stopRequests = 0;
  bool m_terminated = false;
  bool m_resumed = false;
  qint64 m_folderBytesAtStart = -1;
};

// Replays a finished (or running) run from its folder: reads dir/metrics.jsonl with the same reader into data
// (cleared first). An error names the file when it is missing or unreadable, and counts the malformed lines
// (the first is quoted); whatever parsed is kept in data either way.
Status loadRunFolder(const QString& dir, RunData& data);

}  // namespace ms
