// The auto-planner: searches dp x tp x pp, microbatch size (and so count), virtual chunks, schedule, ZeRO
// stage and recompute for a model on a mesh, keeps the plans that fit in memory and ranks them by simulated
// step time.
//
// How it stays fast (a 175B GPT on 1024 GPUs plans in about a second): every candidate is first screened
// with closed-form estimates (per-stage compute from the cost model's FLOP rates, the textbook pipeline
// bubble of its schedule, the ring-collective times, and the memory model's per-category formulas with the
// schedule's peak in-flight microbatches); only the most promising candidates that fit (by the estimate, with
// a margin) are built as real Plans, checked with the memory model and timed with the step simulator. The
// returned ranking is by simulated step time; the estimate only decides which candidates get simulated.
//
// What always holds: every returned candidate's config passes validateRunConfig(), its plan was built by
// buildPlan(), fits in memory on every rank by the memory model, and candidates are ordered by simulated
// step time (fastest first).
#pragma once

#include <vector>

#include "common/status.h"
#include "plan/run_config.h"

namespace ms {

struct AutoPlanOptions {
  int top = 5;        // candidates returned
  int simulate = 24;  // candidates simulated after screening (at least top)
  bool useAllDevices =
      true;  // world = every device of the mesh; false also tries smaller worlds (powers of 2)
};

struct PlanCandidate {
  RunConfig config;              // the base config with this parallel layout
  double estimatedStepTime = 0;  // closed-form screening estimate, seconds
  double stepTime = 0;           // simulated, seconds
  double tokensPerSecond = 0;
  double mfu = 0;
  bool mfuDefined = false;     // SimResult::mfuDefined: every device has a published peak
  double bubbleFraction = 0;   // the worst rank's
  double peakMemoryBytes = 0;  // the heaviest rank's total
  double capacityBytes = 0;    // that rank's device memory
};

struct AutoPlanResult {
  std::vector<PlanCandidate> best;  // fastest first
  int considered = 0;               // candidates enumerated
  int screenedFit = 0;              // passed the closed-form memory screen
  int simulated = 0;                // built and simulated
  double seconds = 0;               // wall time of the search
};

// Searches around `base` (its model, data, mesh, optimizer and training are kept; its parallel section is
// replaced). An error when no candidate fits, saying what the smallest memory need was.
Expected<AutoPlanResult> autoPlan(const RunConfig& base, const AutoPlanOptions& options = {});

}  // namespace ms
