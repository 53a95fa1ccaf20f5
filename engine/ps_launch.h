// `meshstudio-engine launch` for parameter-server mode (runtime/ps.h): starts the servers and the workers as
// processes of their own (not one MPI job: a worker's death must not end the run) and supervises them.
//   - a worker that dies or fails is reported and left dead: the servers drop it and go on with the rest;
//   - a server that dies is restarted from its newest checkpoint (at most 3 times), and the workers carry on
//     against it;
//   - the run ends when server 0 ends (its exit code is the run's); the other servers are then asked to
//     stop (SIGTERM: they checkpoint) and anything left after a grace period is killed;
//   - SIGINT or SIGTERM to the launcher stops every process the same way (run_end "interrupted").
// All processes run on this machine today (endpoints on 127.0.0.1); starting them on the mesh's other nodes
// needs a remote starter (ssh or a resource manager) that this launcher does not have yet.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "plan/run_config.h"

namespace ms {

struct PsLaunchOptions {
  std::string exe;          // this engine binary
  std::string configPath;   // passed on to every process
  std::string runDir;       // the run folder (servers/, metrics.jsonl)
  std::string metricsSink;  // server 0's --metrics
  bool resume = false;      // servers continue from their newest checkpoints
  bool overwrite = false;   // remove an earlier run's server checkpoints first
  bool emulateDevice = false;
  int killWorker = -1, killWorkerStep = 0;  // test hook: worker W dies (SIGKILL) at its step STEP
  int killServer = -1, killServerStep = 0;  // test hook: server S dies at global step STEP (then restarts)
  bool dryRun = false;                      // print the commands only
};

// Runs the whole parameter-server job to its end. Ok when server 0 ended the run with "ok".
// interrupted: set when a stop was asked for (the servers checkpointed).
Status launchParameterServer(const RunConfig& config, const PsLaunchOptions& options, bool* interrupted);

}  // namespace ms
