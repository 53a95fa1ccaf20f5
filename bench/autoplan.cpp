// bench/autoplan: wall time of the auto-planner on GPT-3 175B over 1024 H100s (resources/examples/
// gpt3-175b-plan.json), the target being "a couple of seconds". Prints each run, the median, and the
// ratio of the median to 2 s (below 1 meets the target); also the time of building, estimating and simulating
// the example's own plan, the per-candidate unit of work, measured in the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "plan/autoplanner.h"
#include "plan/cost_model.h"
#include "plan/memory_model.h"
#include "plan/plan.h"
#include "plan/simulator.h"

int main(int argc, char** argv) {
  using Clock = std::chrono::steady_clock;
  const char* path = argc > 1 ? argv[1] : MS_SOURCE_DIR "/resources/examples/gpt3-175b-plan.json";
  auto config = ms::loadRunConfig(path);
  if (!config) {
    std::fprintf(stderr, "%s\n", config.message().c_str());
    return 2;
  }
  auto seconds = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  auto t0 = Clock::now();
  auto plan = ms::buildPlan(*config);
  if (!plan) {
    std::fprintf(stderr, "%s\n", plan.message().c_str());
    return 1;
  }
  const auto memory = ms::estimateMemory(*plan);
  const auto sim = ms::simulate(*plan, ms::CostModel(*plan));
  const double onePlan = seconds(t0);
  std::vector<double> runs;
  int simulated = 0, considered = 0;
  for (int i = 0; i < 5; ++i) {
    t0 = Clock::now();
    auto result = ms::autoPlan(*config);
    runs.push_back(seconds(t0));
    if (!result) {
      std::fprintf(stderr, "%s\n", result.message().c_str());
      return 1;
    }
    simulated = result->simulated;
    considered = result->considered;
  }
  std::sort(runs.begin(), runs.end());
  std::printf("%-40s %10s\n", "measurement", "seconds");
  std::printf("%-40s %10.3f\n", "one plan: build + memory + simulate", onePlan);
  for (double r : runs) std::printf("%-40s %10.3f\n", "autoplan (175B, 1024 GPUs)", r);
  std::printf("candidates considered %d, simulated %d; step of the example plan %.3f s (%zu ranks)\n", considered,
              simulated, sim.stepTime, memory.size());
  std::printf("median autoplan / 2 s target: %.2fx\n", runs[runs.size() / 2] / 2.0);
  return 0;
}
