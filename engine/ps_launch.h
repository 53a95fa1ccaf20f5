// `meshstudio-engine launch` for parameter-server mode (runtime/ps.h): starts the servers and the workers as
// processes of their own (not one MPI job: a worker's death must not end the run) and supervises them.
//   - a worker that dies or fails is reported and left dead: the servers drop it and go on with the rest;
//   - a server that dies is restarted from its newest checkpoint (at most 3 times), and the workers carry on
//     against it;
//   - the run ends when server 0 ends (its exit code is the run's); the other servers are then asked to
//     stop (SIGTERM: they checkpoint) and anything left after a grace period is killed;
//   - SIGINT or SIGTERM to the launcher stops every process the same way (run_end "interrupted").
// Where the processes run:
//   - a mesh of one node, without --hostfile: all on this machine, servers on free loopback ports;
//   - several nodes (or --hostfile): server s on node serverNode(s) (parallel.server_nodes), worker w on the
//     node of device w (plan/parameter_server.h). A node's host is its name, as in the collective launch's
//     hostfile, or the hostfile's line of the same position ("HOST [slots=N]", one line per mesh node, in
//     mesh order). A process whose host is this machine (its name, localhost, 127.0.0.1) is started directly;
//     any other through the remote starter (--rsh, default ssh, called as `RSH HOST COMMAND`, as Open MPI
//     calls its rsh agent; "srun" is called as `srun --nodes=1 --ntasks=1
//     --overlap -w HOST sh -c COMMAND` inside a Slurm allocation). Server s listens on port BASE + s on every
//     interface (--port BASE, default 29600) and workers connect to its host. The engine, the config, the
//     run folder and the data must be at the same paths on every node (a shared file system), as for mpirun.
//   - A remote process ends when the launcher closes its standard input (the command started there runs the
//     engine beside a watcher that sends it SIGTERM at end of input), so stopping the job, or ending the
//     launcher, stops it even though ssh forwards no signals. Its exit status comes back through the
//     starter: 128 + N for a signal N (ssh's 255: the connection failed).
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
  std::vector<std::string> hosts;  // --hostfile: each mesh node's host, in mesh order (empty: see above)
  std::string rsh = "ssh";         // --rsh: the remote starter
  int basePort = 29600;            // --port: server s listens on basePort + s (several nodes)
};

// The hosts of a hostfile ("HOST [slots=N]" a line; '#' comments and blank lines skipped), one per mesh
// node. Errors name the file and line.
Expected<std::vector<std::string>> readHostfile(const std::string& path, size_t nodes);

// Runs the whole parameter-server job to its end. Ok when server 0 ended the run with "ok".
// interrupted: set when a stop was asked for (the servers checkpointed).
Status launchParameterServer(const RunConfig& config, const PsLaunchOptions& options, bool* interrupted);

}  // namespace ms
