// Parameter-server training ("parallel": {"mode": "parameter_server"}; docs/architecture.md, "Parameter
// servers"): S server processes hold the parameters, split by layer (plan/parameter_server.h), with their
// optimizer state; W worker processes each hold the whole model, pull the parameters, compute the gradient of
// their share of a batch and push it. The processes talk over ZeroMQ (ROUTER on the servers, a DEALER per
// server on each worker), not MPI, so that a worker's death costs only its messages.
//
// Consistency (plan/run_config.h Consistency):
//   sync     a server applies, per version, the sum of every live worker's push in worker order, scaled by
//            workers / pushes when some were lost; with every worker alive this is collective data
//            parallelism's step bit for bit (two workers; more sum in another order than MPI's all-reduce);
//   async    each push is applied as it arrives (Dean et al. 2012, Downpour SGD): the worker's gradient is
//   the
//            mean over its own share of the batch, and a step of the schedule is `workers` updates;
//   bounded  async, but a worker's pull waits while it is more than `staleness` steps ahead of the slowest
//            live worker (stale-synchronous parallel, Ho et al. 2013).
// Every applied push records its staleness: the server's version minus the version the gradient was computed
// on.
//
// Lost workers: a worker silent (no pull, push or heartbeat) for worker_timeout_s is dropped; sync goes on
// with the live ones; a worker that pulls is (re)admitted and trains from the current parameters. Servers
// checkpoint their shard and optimizer state (runs/<name>/servers/server-<s>/version-<v>.safetensors); a
// server started with resume loads its newest one, and workers carry on against it.
//
// Data: sync step v of worker w takes samples [w * B/W, (w+1) * B/W) of global batch v (the replica w of
// collective data parallelism); async and bounded hand out the next (batch, slot) pair on each pull from
// server 0, so no sample is used twice whichever workers come and go.
//
// MS_PS_TRACE=1 in a server's environment prints every message it receives and every pull it answers, with
// times (seconds since it started), on stderr.
//
// Server 0 writes the run's metrics stream (run_start, step, ps, eval, checkpoint, log, run_end) and has the
// evaluations done by a worker (the first one pulling after an evaluation is due).
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "common/status.h"
#include "plan/run_config.h"

namespace ms {

struct PsServerOptions {
  int index = 0;
  std::string bind;         // ZeroMQ endpoint, e.g. "tcp://127.0.0.1:5555"
  std::string runDir;       // overrides training.run_dir
  std::string metricsSink;  // server 0: "-" stdout, a file, or ""
  bool resume = false;      // continue from this server's newest checkpoint (none: start afresh)
  const std::atomic<bool>* stopRequested = nullptr;  // SIGTERM/SIGINT: checkpoint, run_end "interrupted"
  // Test hook: SIGKILL this server as it reaches this global step (after that step's checkpoint, if any).
  int64_t dieAtStep = 0;
};

struct PsWorkerOptions {
  int index = 0;
  std::vector<std::string> servers;  // endpoints, server 0 first
  bool emulateDevice = false;
  const std::atomic<bool>* stopRequested = nullptr;
  // Test hook: SIGKILL this worker as it begins its step number dieAtStep (1-based, its own steps).
  int64_t dieAtStep = 0;
  // Longest wait for a server's reply (resending the request every second) before giving up.
  double serverTimeoutS = 60;
};

Status runPsServer(const RunConfig& config, const PsServerOptions& options);
Status runPsWorker(const RunConfig& config, const PsWorkerOptions& options);

}  // namespace ms
