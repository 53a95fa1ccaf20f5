// EngineClient: runs a config for real from the studio. It writes the config into the run folder, starts
// `meshstudio-engine launch <runDir>/config.json -- --metrics - --run-dir <runDir> --overwrite` with QProcess
// (launch runs mpirun with one rank per planned device and supervises it, engine/supervisor.h), reads the
// metrics stream from its stdout through a MetricsReader into a RunData, and its stderr into the log.
//
// What always holds: the JSON is parsed on the client's own parser thread, never on the GUI thread (a spans
// line of a many-rank run is megabytes: about 20 ms per MB, measured by bench/ui_stream); the GUI thread only
// moves bytes to the parser and applies the parsed events to the RunData, in stream order, in slices of at
// most kApplySliceMs (plus the one event under way) per pass of the event loop, so input, paint and timers
// get through during a flood. dataChanged() is emitted at most once per kNotifyMs, never per line.
//
// Back-pressure: the engine's stdout is a pipe the client reads itself (QProcess's own stdout channel
// buffers whatever the pipe holds, without bound; QProcess only sees stdout as /dev/null, and the child's
// stdout is pointed at the client's pipe between fork and exec). The client reads only while the bytes it
// has read but not yet had parsed and applied are under kMaxBytesInFlight (bytesInFlightHighWater() never
// exceeds it); at the bound it stops watching the pipe until they are down to half, so the pipe (kPipeBytes)
// fills and the engine's writes block: a stream faster than the studio slows the engine instead of growing
// the studio's memory. Under launch the writer on that pipe is mpirun relaying rank 0's stdout: blocked in
// that write, it stops relaying and rank 0 blocks in its own write in turn (measured with a reader stalled 8
// s: the run stood still at step 279, about 0.8 MB of metrics, the slack of mpirun's and the pty's buffers);
// it also handles no signal meanwhile, so stop() takes effect once the studio has caught up, and the
// destructor empties the pipe while it waits for the engine to end.
//
// finished() is emitted exactly once per start(), after everything the engine wrote was read (after the
// engine exited, its stdout is read to the end: every process holding it, the ranks too, closed it, or it
// stayed silent kDrainIdleMs, which the log says), with ok = the run finished or ended by stop(), and
// otherwise the engine's own reason (rank 0's run_end, else the one launch appended to the run folder's
// metrics.jsonl, with launch's last word on stderr; else the last stderr lines; else the exit code); the
// engine is not left running when the client is destroyed (SIGINT, then SIGTERM, then SIGKILL, a few seconds
// apart).
#pragma once

#include <QElapsedTimer>
#include <QObject>
#include <QProcess>
#include <QSocketNotifier>
#include <QString>
#include <QStringList>
#include <QThread>
#include <QTimer>
#include <deque>
#include <vector>

#include "common/status.h"
#include "plan/run_config.h"
#include "ui/run/metrics_reader.h"
#include "ui/run/run_data.h"

namespace ms {

class EngineClient : public QObject {
  Q_OBJECT
 public:
  static constexpr int kNotifyMs = 50;                  // dataChanged() at most this often
  static constexpr qint64 kMaxBytesInFlight = 4 << 20;  // read from stdout, not yet parsed and applied
  static constexpr int kPipeBytes = 1 << 20;            // the stdout pipe's capacity asked for (else 64 KB)
  static constexpr int kApplySliceMs = 4;               // GUI-thread time applying events per event-loop pass
  static constexpr int kDrainIdleMs = 2000;  // after the engine exited: stdout held open but silent this long
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
  // Bytes and lines of the metrics stream read, parsed and applied to data() so far in this run.
  qint64 bytesReceived() const { return m_bytesParsed; }
  qint64 linesReceived() const { return m_linesParsed; }
  // Bytes read from the engine's stdout and not yet parsed and applied: now, and the most this run.
  qint64 bytesInFlight() const { return m_bytesInFlight; }
  qint64 bytesInFlightHighWater() const { return m_bytesInFlightHighWater; }
  // Whether the client has stopped reading stdout because bytesInFlight() reached the bound.
  bool readingPaused() const;
  QString runDir() const { return m_runDir; }
  // The command line of the current (or last) run, for the log and for people.
  QStringList commandLine() const { return m_command; }

 signals:
  void started();
  void dataChanged();
  void finished(bool ok, const QString& message);

 private:
  void onReadyStderr();
  void onProcessFinished(int exitCode, QProcess::ExitStatus status);
  void onProcessError(QProcess::ProcessError error);
  // Reads the stdout pipe while under the bound; at its end (or error) closes it.
  void readStdout();
  void closeStdout();
  // The stream is over (the engine exited and its stdout closed): the parser's finish() is posted.
  void finishStreamIfDone();
  void onDrainIdle();
  // Applies parsed events for at most kApplySliceMs, then yields to the event loop (posting itself again).
  void applySome();
  void scheduleApply();
  void scheduleNotify();
  void finalize();
  void signalProcess(int sig);
  // SIGINT to launch: a graceful stop after the current step.
  void interrupt();
  void fail(const QString& message);
  void stopProcessOnDestruction();
  // Waits up to ms for the engine to exit, emptying its stdout meanwhile; true when it exited.
  bool waitDiscardingStdout(int ms);

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
  qint64 m_bytesInFlight = 0;  // read from the pipe, not yet parsed and applied
  qint64 m_bytesInFlightHighWater = 0;
  qint64 m_bytesParsed = 0, m_linesParsed = 0;
  bool m_finishPosted = false;
  bool m_saidBehind = false;  // the log said once that reading paused
  // The parsed pieces not yet applied, in stream order; the front one may be partly applied.
  struct Parsed {
    std::vector<MetricsEvent> events;
    std::size_t next = 0;  // the first event not yet applied
    qint64 bytes = 0;      // the piece's bytes
    qint64 lines = 0;      // the reader's line count after it
    bool done = false;     // the stream's end
  };
  std::deque<Parsed> m_toApply;
  bool m_applyPosted = false;
  int m_stdoutFd = -1;  // the read end of the engine's stdout pipe (non-blocking), -1 once at its end
  QSocketNotifier* m_stdoutNotifier = nullptr;  // disabled while bytesInFlight() is over the bound
  QByteArray m_readBuffer;
  QTimer m_drainTimer;  // single shot: the engine exited and its stdout stayed open and silent
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
