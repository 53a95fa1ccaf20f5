// Single-rank training and evaluation: the loop that turns a RunConfig into optimizer steps, evaluations,
// checkpoints and the metrics stream.
//
// What always holds: given the same config the losses are bit-identical run to run (same thread count); a run
// resumed from its checkpoint at step k produces the same losses after k as the uninterrupted run; every
// run ends with a run_end line saying "ok", "interrupted" or "error" and the reason.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "plan/run_config.h"
#include "runtime/communicator.h"
#include "runtime/data.h"
#include "runtime/model.h"

namespace ms {

struct TrainOptions {
  std::string metricsSink;  // "-" stdout, a file, or "" (the run folder's metrics.jsonl is always written)
  std::string runDir;       // overrides training.run_dir
  std::string resume;       // "" none, "latest" the run folder's newest checkpoint, or a checkpoint dir
  bool overwrite = false;   // allow starting afresh in a run folder that already holds checkpoints
  bool progress = false;    // draw a progress bar on stderr
  const std::atomic<bool>* stopRequested = nullptr;  // set (e.g. by SIGINT) to stop after the current step
  // > 0: stop after this step as a requested stop does (checkpoint, run_end "interrupted"), the learning-rate
  // schedule staying the config's (training.steps long): the first steps of a long run, as they will be.
  int64_t stopAfter = 0;
  // The run's ranks (nullptr: one process). With dp > 1 every rank runs train() with its own world; rank 0
  // alone writes the run folder, the metrics and the checkpoints.
  Communicator* world = nullptr;
  // With "device": "cpu": run the device code path on the CPU's emulated device (kernels/backend.h), every
  // tensor transfer staged through host memory as on a GPU without NCCL. For tests.
  bool emulateDevice = false;
  // Skip the check that refuses, before anything is allocated, a rank whose predicted memory is above what
  // its device (or host) has free: the allocator's own out-of-memory error then ends a run that does not fit.
  // For measuring where that limit really is (bench/gpu_largest_fit.py).
  bool skipMemoryCheck = false;
  // Save no checkpoint, not even the last step's or a stop's (measuring runs, whose model states would
  // take longer to write than the run takes).
  bool noCheckpoint = false;
  // Set when rank 0 wrote the run's run_end line to the metrics stream (the caller adds one for failures
  // before the stream began, so that every failure reaches it).
  bool* streamEnded = nullptr;
};

struct EvalResult {
  double loss = 0;
  double accuracy = 0;  // classifiers only
  bool hasAccuracy = false;
  int64_t samples = 0;
};

// Refuses what this engine cannot execute
// and a process count that does not match the plan (worldSize = the processes started), with the field's
// path.
Status checkRunnable(const RunConfig& config, int worldSize = 1);

// Threads per rank: training.threads, or the cores divided by the ranks on this node (Open MPI's
// OMPI_COMM_WORLD_LOCAL_SIZE), at least 1.
int threadsPerRank(const RunConfig& config);

Status train(const RunConfig& config, const TrainOptions& options);

// Mean loss (and accuracy) over maxBatches micro-batch-sized batches of the evaluation split (0 = all of it).
// With a world of several ranks, rank r evaluates batches r, r + W, ... and the sums are all-reduced.
EvalResult evaluate(Model& model, const DataSource& data, const RunConfig& config, int maxBatches,
                    Communicator* world = nullptr);

// The run folder of a config: options.runDir, else training.run_dir, else "runs/<name>".
std::string runDirectory(const RunConfig& config, const std::string& overrideDir);

}  // namespace ms
