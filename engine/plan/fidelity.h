// Fidelity: a finished run's measurements against what the plan predicted for it, item by item, so a user
// sees where the cost and memory models miss and by how much (`meshstudio-engine fidelity RUN_DIR` and the
// studio's Run > Fidelity). The prediction is recomputed from the run's config (its device profiles
// included), with the same plan, cost model, simulator and memory model as `plan`; nothing is fitted to the
// run (Calibrate Plan from Run is the correction that does that).
//
// What is compared, per rank, as per-step figures (each the median over the run's kept steps: the first step,
// with its one-off allocations, is left out when later ones were logged):
//   step       the step's wall time (the "step" lines' step_time_s) against the simulator's stepTime; one row
//              for the whole run (rank -1);
//   F, B, W    each layer's forward, backward and weight-gradient spans summed over the step's microbatches,
//              against (the cost model's time of the layer + the layer's share of its chunk's in-layer
//              communication, by its share of the chunk's compute) x the schedule's actions of that chunk; a
//              schedule without a split backward has no W and its B holds the whole backward;
//   r, R       the time the compute lane waited for activations (r) and for gradients (R), against the
//              simulator's receive waits of that rank;
//   G          the exposed gradient finish (sends drained, tied-embedding and data-parallel syncs waited for:
//              the engine's G span), against the simulator's gap between the rank's last compute action and
//              its optimizer step (the part of the syncs that compute did not hide);
//   O          the optimizer step;
//   bubble     1 - (the rank's F, B and W time) / (the window from the earliest F start to the latest B or W
//   end
//              over the ranks of its pipeline replica), the definition of docs/plan-model.md "Simulator",
//              against the simulator's bubbleFraction;
//   memory     each category's peak (the largest of the kept steps' per-step peaks) against the memory model;
//              the engine's communication and workspace buffers count as "other", as the memory model counts
//              them, and "total" is the peak of the sum (not the sum of the peaks).
// Worst first: time rows by |predicted - measured| in seconds per step (what moves the step most), memory
// rows by |predicted - measured| in bytes.
//
// What always holds: every row has finite predicted and measured values >= 0; rows of a rank exist only for
// what the rank ran or was predicted to run; a run whose ranks, layers or mode the config does not describe
// is an error naming what differs, never a partial report.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "plan/run_config.h"

namespace ms {

// The parts of a run's metrics stream (metrics.jsonl, common/metrics_schema.h) that fidelity reads.
struct LoggedSpan {
  char action = 'F';  // F B W r R G O
  std::string layer;  // "" when the span is not a layer's
  int microbatch = -1;
  int chunk = -1;
  double start = 0;  // seconds on the run's clock
  double end = 0;
};

struct LoggedStep {
  int64_t step = 0;
  double stepTime = -1;                                   // s; < 0 when the stream has no step line for it
  std::vector<std::vector<LoggedSpan>> spans;             // (W): each rank's spans of the step
  std::vector<std::map<std::string, double>> peakMemory;  // (W): category -> bytes; empty when not logged
};

struct MeasuredRun {
  std::string name;
  int ranks = 0;
  std::string endStatus;            // run_end's status ("" when the stream has none: a run still going)
  std::vector<LoggedStep> steps;    // in step order, the steps with a spans line
};

// Reads metrics.jsonl. Errors name the file and the line; a stream of another version, or of a
// parameter-server run, is refused with its reason.
Expected<MeasuredRun> readMeasuredRun(const std::string& metricsPath);

enum class FidelityItem {
  Forward,
  Backward,
  Weight,
  RecvActivation,
  RecvGrad,
  GradFinish,
  Optimizer,
  Bubble,
  Memory
};
const char* toString(FidelityItem item);

struct FidelityRow {
  FidelityItem item = FidelityItem::Forward;
  int rank = 0;
  int stage = -1;
  std::string what;      // the layer's name, the memory category, or ""
  double predicted = 0;  // seconds per step, a fraction (bubble) or bytes (memory)
  double measured = 0;
  // predicted / measured - 1; 0 when both are 0, +inf-free: a measured 0 against a predicted > 0 gives 1.
  double error() const;
  double gap() const;  // |predicted - measured|, the sort key
};

struct FidelityReport {
  std::string run;        // the run's name
  std::string device;     // the device the prediction costs rank 0 on ("here", "h100-sxm", ...)
  bool profiled = false;  // rank 0's device is a measured profile (not a catalog datasheet)
  int stepsUsed = 0;      // the steps the medians are over
  int ranks = 0;
  double predictedStep = 0;         // s
  double measuredStep = 0;          // s
  std::vector<FidelityRow> times;   // F B W r R G O and bubble rows, worst first (bubble rows last)
  std::vector<FidelityRow> memory;  // worst first
  std::vector<std::string> notes;   // what the report could not compare, and why
};

// The report of a measured run under a config (the run's own, or another describing the same plan: another
// profile). Errors name what does not match.
Expected<FidelityReport> fidelityReport(const RunConfig& config, const MeasuredRun& run);

// The run folder's config.json (or `configOverride` when not empty) and metrics.jsonl.
Expected<FidelityReport> fidelityOfRunFolder(const std::string& dir, const std::string& configOverride = "");

// {"run", "device", "profiled", "steps_used", "ranks", "step": {"predicted_s", "measured_s", "error"},
//  "times": [{"item", "rank", "stage", "what", "predicted", "measured", "error"}], "memory": [...], "notes"}.
nlohmann::json fidelityJson(const FidelityReport& report);

}  // namespace ms
