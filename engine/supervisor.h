// The launch supervisor: runs mpirun for `meshstudio-engine launch` and turns a rank that dies or hangs into
// a bounded, explained end of the run.
//
// It starts mpirun in a session of its own (Open MPI puts every rank in a process group of its own, but
// they keep the session), with MESHSTUDIO_HEARTBEAT_DIR pointing at the run's heartbeat folder
// (runtime/heartbeat.h), copies mpirun's stderr to its own while keeping the last lines, forwards SIGINT and
// SIGTERM (and SIGHUP, as SIGTERM) to mpirun, and watches:
//   - mpirun ends with 0: success;
//   - mpirun ends otherwise: the failed rank from Open MPI's own report ("mpirun noticed that process rank 2
//     with PID 0 on node vm exited on signal 9 (Killed).", "Process name: [[5,1],1] Exit code: 3", ...),
//     with its pid and last activity from its heartbeat;
//   - a rank whose heartbeat has not beaten for stallTimeoutS (a stopped or frozen process, or none written
//     within startupGraceS), a rank alive whose progress counter has not moved for stallTimeoutS (30 times
//     that in a long phase: startup, evaluation, a checkpoint write; 4 times the longest wait it has shown
//     between actions when that is longer; the rank stuck longest is named), or
//     mpirun itself stopped for stallTimeoutS: SIGTERM (and SIGCONT, for a stopped process) to every process
//     of the session, SIGKILL killGraceS later.
// What always holds: when superviseRun returns, no process of the session is left (the supervisor is the
// child subreaper, so orphaned ranks are reaped too); on any failure the metrics files whose last line is not
// a run_end "ok" get one appended ({"status": "error"|"interrupted", "reason", "step", "t", "time"}), and so
// does stdout when the ranks stream there; nothing in them is rewritten; the returned error is the one-line
// reason, naming the rank and what it was doing. A rank that dies in a long phase (a checkpoint write, an
// evaluation) is named in it (heartbeat.h writes those through at once); in a short action, as of its last
// heartbeat, which the reason dates.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace ms {

struct SupervisorOptions {
  std::vector<std::string> command;       // mpirun and its arguments
  int ranks = 1;                          // processes mpirun starts (rank 0 .. ranks-1)
  std::string runDir;                     // locked for the run (file_io.h RunFolderLock); "" for none
  std::string heartbeatDir;               // created; rank-*.json from an earlier run are removed
  std::vector<std::string> metricsFiles;  // streams that get a run_end line when the run fails; the first
                                          // is the run folder's metrics.jsonl
  bool metricsToStdout = false;           // the ranks' stream goes to stdout (`--metrics -`): it gets the
                                          // run folder's run_end too (or one of its own when the stream
                                          // never began)
  double stallTimeoutS = 10;              // 0: do not watch heartbeats
  double startupGraceS = 60;              // a rank with no heartbeat file after this is taken as hung
  double killGraceS = 3;                  // SIGTERM to SIGKILL
};

// Runs the command to its end. Ok when mpirun exited with 0; otherwise the reason, e.g. "rank 2 (pid 1234)
// died (signal 9, Killed) while step 12: all-reduce of gradients; the run stopped".
// The first SIGINT or SIGTERM to the supervisor asks every rank to stop after its current step (SIGUSR1
// through mpirun); when they all end cleanly it returns ok and sets *interrupted. A second signal stops hard.
Status superviseRun(const SupervisorOptions& options, bool* interrupted = nullptr);

// Every process of session `sid` but this one, and a signal to each (what a run's mpirun and its ranks are:
// Open MPI gives each rank its own process group, but they stay in mpirun's session).
std::vector<pid_t> sessionMembers(pid_t sid);
void signalSession(pid_t sid, int sig);

// The exit code of `train` that stopped on request after saving its checkpoint (128 + SIGINT, as shells
// report an interrupted command).
inline constexpr int kExitInterrupted = 130;

// The parts of the supervisor that need no processes, for the tests.
namespace supervisor_detail {

struct RankFailure {
  int rank = -1;  // -1: Open MPI's output named no rank
  long pid = 0;   // 0 when Open MPI did not say (4.1 prints "PID 0")
  int signal = 0;
  std::string signalName;
  int exitCode = -1;
  bool aborted = false;  // MPI_Abort
};

// Reads Open MPI's report of the first failed process from the last lines of mpirun's stderr.
RankFailure parseMpirunFailure(const std::vector<std::string>& lines);

// Appends {"type": "run_end", "status", "reason", "step", "t", "time"} to a metrics file unless its last line
// is a run_end with status "ok" (or any run_end, for status "interrupted"); step is the last step line's
// "step", t continues the stream's clock. Returns the fields written, null when the file was left alone (a
// file that does not exist is left alone).
Expected<nlohmann::json> appendRunEnd(const std::string& path, const std::string& status,
                                      const std::string& reason);
// The status of the metrics file's last line when it is a run_end ("ok", "interrupted", "error"), else "".
std::string lastRunEndStatus(const std::string& path);

}  // namespace supervisor_detail

}  // namespace ms
