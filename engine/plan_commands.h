// The plan and autoplan commands of meshstudio-engine (see plan_commands.cpp).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/memory_model.h"
#include "plan/plan.h"
#include "plan/run_config.h"
#include "plan/simulator.h"

namespace ms {

// The documented JSON of `plan --json`: {"devices": [{"rank", "node", "device", "stage", "layers",
// "memory_bytes": {...}, "capacity_bytes", "bubble_fraction"}], "layers": [{"name", "stage", "forward_s",
// "backward_s", "kernels": [{"what", "flops", "seconds", "fraction_of_peak"}]}], "step_time_s",
// "tokens_per_s", "mfu", "fits"}. A layer's times are per microbatch on its stage's device (the cost model's
// compute, without in-layer communication); its kernels are the forward's, where the device times them by
// shape (cost_model.h layerForwardKernels), else empty.
nlohmann::json planJson(const Plan& plan, const std::vector<MemoryBreakdown>& memory, const SimResult& sim,
                        const CostModel& cost);

// Exit codes as main's: 0 ok, 1 failed, 2 invalid config.
// balance: replace the placement by the balanced partition first; writePath: save the config that was planned.
int runPlanCommand(const RunConfig& config, bool json, bool balance, const std::string& writePath);
int runAutoplanCommand(const RunConfig& config, int top, bool json, const std::string& writePath);
// `fidelity RUN_DIR`: the run's measurements against its plan's prediction (plan/fidelity.h), worst first;
// top rows of each table (the JSON has them all). configOverride: plan with this config instead of the run's
// own.
int runFidelityCommand(const std::string& runDir, const std::string& configOverride, bool json, int top);

}  // namespace ms
