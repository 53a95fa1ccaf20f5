// The plan and autoplan commands of meshstudio-engine: the plan library's predictions for a config, as a
// per-device table or as one JSON object (the shape is part of the command line's contract, see README).
#include "plan_commands.h"

#include <cstdio>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "plan/autoplanner.h"
#include "plan/cost_model.h"
#include "plan/fidelity.h"
#include "plan/memory_model.h"
#include "plan/plan.h"
#include "plan/ps_model.h"
#include "plan/simulator.h"

namespace ms {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// "embedding, block.0-3, head": runs of consecutive blocks folded into a range.
std::string layerSummary(const std::vector<std::string>& names) {
  std::string out;
  auto blockIndex = [](const std::string& n) {
    return n.rfind("block.", 0) == 0 ? std::stoi(n.substr(6)) : -1;
  };
  for (size_t i = 0; i < names.size();) {
    size_t j = i;
    if (blockIndex(names[i]) >= 0)
      while (j + 1 < names.size() && blockIndex(names[j + 1]) == blockIndex(names[j]) + 1) ++j;
    if (!out.empty()) out += ", ";
    out += names[i];
    if (j > i) out += "-" + std::to_string(blockIndex(names[j]));
    i = j + 1;
  }
  return out;
}

std::vector<std::string> stageLayers(const Plan& plan, int stage) {
  std::vector<std::string> names;
  for (int l : plan.partition.layersOfStage(stage)) names.push_back(plan.model.layers[l].name);
  return names;
}

// "24.6%", or "n/a" for an MFU without a published peak.
std::string percentOrNa(double fraction, bool defined) {
  if (!defined) return "n/a";
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", 100.0 * fraction);
  return text;
}

}  // namespace

nlohmann::json planJson(const Plan& plan, const std::vector<MemoryBreakdown>& memory, const SimResult& sim,
                        const CostModel& cost) {
  nlohmann::json devices = nlohmann::json::array();
  bool fits = true;
  for (int r = 0; r < plan.layout.world(); ++r) {
    const MeshDevice& d = plan.mesh.devices[plan.layout.deviceOf[r]];
    const MemoryBreakdown& m = memory[r];
    fits = fits && m.fits();
    const int stage = plan.stageOfRank(r);
    devices.push_back({{"rank", r},
                       {"node", plan.mesh.nodes[d.node]},
                       {"device", d.spec.name},
                       {"stage", stage},
                       {"layers", stageLayers(plan, stage)},
                       {"memory_bytes", memoryBytesJson(m)},
                       {"capacity_bytes", m.capacity},
                       {"bubble_fraction", sim.bubbleFraction[r]}});
  }
  // Host memory per node (offload): what the node's ranks keep there against the node's host memory.
  nlohmann::json nodes = nlohmann::json::array();
  for (const NodeHostMemory& h : hostMemoryPerNode(plan, memory)) {
    fits = fits && h.fits();
    if (h.bytes > 0)
      nodes.push_back({{"node", h.node}, {"host_bytes", h.bytes}, {"host_capacity_bytes", h.capacity}});
  }
  nlohmann::json layers = nlohmann::json::array();
  const LayerTimes& times = cost.layerTimes();
  std::vector<int> stageOfLayer(plan.model.layers.size(), 0);
  for (size_t k = 0; k < plan.partition.chunks.size(); ++k)
    for (int l : plan.partition.chunks[k]) stageOfLayer[static_cast<size_t>(l)] = plan.partition.stageOf[k];
  for (size_t l = 0; l < plan.model.layers.size(); ++l) {
    nlohmann::json kernels = nlohmann::json::array();
    for (const KernelCost& k : layerForwardKernels(plan, static_cast<int>(l)))
      kernels.push_back({{"what", k.what},
                         {"flops", k.flops},
                         {"seconds", k.seconds},
                         {"fraction_of_peak", k.fractionOfPeak}});
    layers.push_back({{"name", plan.model.layers[l].name},
                      {"stage", stageOfLayer[l]},
                      {"forward_s", times.forward[l]},
                      {"backward_s", times.backwardInput[l] + times.backwardWeight[l]},
                      {"kernels", kernels}});
  }
  nlohmann::json j = {{"devices", devices},
                      {"layers", layers},
                      {"step_time_s", sim.stepTime},
                      {"tokens_per_s", sim.tokensPerSecond},
                      {"mfu", sim.mfu},
                      {"mfu_defined", sim.mfuDefined},
                      {"fits", fits}};
  if (!nodes.empty()) j["host_memory"] = nodes;
  return j;
}

// Parameter-server mode: the servers' and workers' memory and times (plan/ps_model.h).
int runPsPlanCommand(const RunConfig& config, bool json) {
  auto pred = predictParameterServer(config);
  if (!pred) {
    std::fprintf(stderr, "meshstudio-engine plan: %s\n", pred.message().c_str());
    return 2;
  }
  const ModelSpec spec = buildModelSpec(config.model, config.training.seqLen);
  nlohmann::json servers = nlohmann::json::array(), workers = nlohmann::json::array(),
                 timeline = nlohmann::json::array();
  for (const PsServerPrediction& s : pred->servers) {
    std::vector<std::string> names;
    for (int l : s.layers) names.push_back(spec.layers[static_cast<size_t>(l)].name);
    servers.push_back({{"server", s.index},
                       {"node", s.node},
                       {"layers", names},
                       {"params", s.params},
                       {"memory_bytes",
                        {{"parameters", s.parameterBytes},
                         {"gradients", s.gradientBytes},
                         {"optimizer", s.optimizerBytes},
                         {"other", s.otherBytes},
                         {"total", s.total()}}},
                       {"capacity_bytes", s.capacity},
                       {"update_time_s", s.updateTime},
                       {"link_time_s", s.linkTime}});
  }
  bool fits = true;
  // Servers of one node share its host memory.
  std::map<int, double> nodeBytes, nodeCapacity;
  for (const PsServerPrediction& s : pred->servers) {
    nodeBytes[s.node] += s.total();
    nodeCapacity[s.node] = s.capacity;
  }
  std::set<int> fullNodes;
  for (const auto& [node, bytes] : nodeBytes)
    if (nodeCapacity[node] > 0 && bytes > nodeCapacity[node]) fullNodes.insert(node);
  fits = fullNodes.empty();
  for (const PsWorkerPrediction& w : pred->workers) {
    fits = fits && w.total() <= w.capacity;
    workers.push_back({{"worker", w.index},
                       {"device", w.device},
                       {"memory_bytes",
                        {{"parameters", w.parameterBytes},
                         {"gradients", w.gradientBytes},
                         {"optimizer", w.optimizerBytes},
                         {"activations", w.activationBytes},
                         {"other", w.otherBytes},
                         {"total", w.total()}}},
                       {"capacity_bytes", w.capacity},
                       {"slowdown", w.slowdown},
                       {"compute_time_s", w.computeTime},
                       {"pull_time_s", w.pullTime},
                       {"push_time_s", w.pushTime}});
  }
  for (const PsSpan& sp : pred->timeline)
    timeline.push_back({{"lane", std::string(sp.server ? "server " : "worker ") + std::to_string(sp.index)},
                        {"action", std::string(1, sp.action)},
                        {"start", sp.start},
                        {"end", sp.end}});
  const nlohmann::json j = {{"mode", "parameter_server"},
                            {"consistency", toString(pred->consistency)},
                            {"step_time_s", pred->stepTime},
                            {"samples_per_s", pred->samplesPerSecond},
                            {"mean_staleness", pred->meanStaleness},
                            {"fits", fits},
                            {"servers", servers},
                            {"workers", workers},
                            {"timeline", timeline}};
  if (json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%-7s %-5s %-28s %12s %8s %8s %8s %8s %9s %9s %10s %10s\n", "server", "node", "layers",
              "params", "params", "grads", "optim", "other", "total GiB", "host GiB", "update ms", "link ms");
  for (const auto& s : servers) {
    const auto& m = s["memory_bytes"];
    std::string layers = layerSummary(s["layers"].get<std::vector<std::string>>());
    if (layers.size() > 28) layers = layers.substr(0, 25) + "...";
    std::printf("%-7d %-5d %-28s %12.0f %8.2f %8.2f %8.2f %8.2f %9.2f %9.2f %10.3f %10.3f%s\n",
                s["server"].get<int>(), s["node"].get<int>(), layers.c_str(), s["params"].get<double>(),
                m["parameters"].get<double>() / kGiB, m["gradients"].get<double>() / kGiB,
                m["optimizer"].get<double>() / kGiB, m["other"].get<double>() / kGiB,
                m["total"].get<double>() / kGiB, s["capacity_bytes"].get<double>() / kGiB,
                1e3 * s["update_time_s"].get<double>(), 1e3 * s["link_time_s"].get<double>(),
                fullNodes.count(s["node"].get<int>()) ? "  NODE'S SERVERS DO NOT FIT" : "");
  }
  std::printf("\n%-7s %-7s %8s %8s %8s %8s %8s %9s %9s %10s %9s %9s %8s\n", "worker", "device", "params",
              "grads", "optim", "activ", "other", "total GiB", "capacity", "compute ms", "pull ms", "push ms",
              "slowdown");
  for (const auto& w : workers) {
    const auto& m = w["memory_bytes"];
    const double total = m["total"].get<double>(), cap = w["capacity_bytes"].get<double>();
    std::printf("%-7d %-7d %8.2f %8.2f %8.2f %8.2f %8.2f %9.2f %9.2f %10.3f %9.3f %9.3f %8.1f%s\n",
                w["worker"].get<int>(), w["device"].get<int>(), m["parameters"].get<double>() / kGiB,
                m["gradients"].get<double>() / kGiB, m["optimizer"].get<double>() / kGiB,
                m["activations"].get<double>() / kGiB, m["other"].get<double>() / kGiB, total / kGiB,
                cap / kGiB, 1e3 * w["compute_time_s"].get<double>(), 1e3 * w["pull_time_s"].get<double>(),
                1e3 * w["push_time_s"].get<double>(), w["slowdown"].get<double>(),
                total > cap ? "  DOES NOT FIT" : "");
  }
  std::printf("\n%s: step %.4f s, %.0f samples/s, mean staleness %.1f updates, %s\n",
              toString(pred->consistency), pred->stepTime, pred->samplesPerSecond, pred->meanStaleness,
              fits ? "fits in memory on every worker and server node"
                   : "DOES NOT FIT on every worker and server node");
  return 0;
}

int runPlanCommand(const RunConfig& input, bool json, bool balance, const std::string& writePath) {
  if (input.parallel.mode == ParallelMode::ParameterServer) {
    if (balance || !writePath.empty()) {
      std::fprintf(stderr,
                   "meshstudio-engine plan: --balance and --write place pipeline stages, which "
                   "parameter_server mode does not have\n");
      return 2;
    }
    return runPsPlanCommand(input, json);
  }
  RunConfig config = input;
  if (balance) {
    auto balanced = withBalancedPlacement(input);
    if (!balanced) {
      std::fprintf(stderr, "meshstudio-engine plan: %s\n", balanced.message().c_str());
      return 2;
    }
    config = std::move(*balanced);
  }
  if (!writePath.empty()) {
    if (Status s = saveRunConfig(config, writePath); !s) {
      std::fprintf(stderr, "meshstudio-engine plan: %s\n", s.message().c_str());
      return 1;
    }
    std::fprintf(stderr, "wrote the plan's config to %s\n", writePath.c_str());
  }
  auto plan = buildPlan(config);
  if (!plan) {
    std::fprintf(stderr, "meshstudio-engine plan: %s\n", plan.message().c_str());
    return 2;
  }
  const std::vector<MemoryBreakdown> memory = estimateMemory(*plan);
  const CostModel cost(*plan);
  const SimResult sim = simulate(*plan, cost, /*spansPerRank=*/false);
  const nlohmann::json j = planJson(*plan, memory, sim, cost);
  for (const std::string& w : plan->warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%-5s %-10s %-14s %-5s %-28s %8s %8s %8s %8s %8s %9s %9s %7s\n", "rank", "node", "device",
              "stage", "layers", "params", "grads", "optim", "activ", "other", "total GiB", "capacity",
              "bubble");
  for (const auto& d : j["devices"]) {
    const auto& m = d["memory_bytes"];
    const double total = m["total"].get<double>(), cap = d["capacity_bytes"].get<double>();
    std::string layers = layerSummary(d["layers"].get<std::vector<std::string>>());
    if (layers.size() > 28) layers = layers.substr(0, 25) + "...";  // the JSON has the full list
    std::printf("%-5d %-10s %-14s %-5d %-28s %8.2f %8.2f %8.2f %8.2f %8.2f %9.2f %9.2f %6.1f%%%s\n",
                d["rank"].get<int>(), d["node"].get<std::string>().c_str(),
                d["device"].get<std::string>().c_str(), d["stage"].get<int>(), layers.c_str(),
                m["parameters"].get<double>() / kGiB, m["gradients"].get<double>() / kGiB,
                m["optimizer"].get<double>() / kGiB, m["activations"].get<double>() / kGiB,
                m["other"].get<double>() / kGiB, total / kGiB, cap / kGiB,
                100.0 * d["bubble_fraction"].get<double>(), total > cap ? "  DOES NOT FIT" : "");
  }
  if (j.contains("host_memory")) {
    // Offload: what each node's host memory holds (the first few nodes; the JSON has them all).
    size_t shown = 0;
    for (const auto& h : j["host_memory"]) {
      if (shown++ == 4) {
        std::printf("host memory: ... %zu nodes in all\n", j["host_memory"].size());
        break;
      }
      const double b = h["host_bytes"].get<double>(), cap = h["host_capacity_bytes"].get<double>();
      std::printf("host memory of %s: %.2f GiB of %.2f GiB%s\n", h["node"].get<std::string>().c_str(),
                  b / kGiB, cap / kGiB, b > cap ? "  DOES NOT FIT" : "");
    }
  }
  // MFU is a fraction of a published peak: a device without one (the cpu placeholder) has none to state.
  // A gpt or vit sample is a sequence of tokens (patches); an mlp or cnn sample is one image.
  std::printf("\nstep %.4f s, %.0f %s, MFU %s, %s\n", sim.stepTime, sim.tokensPerSecond,
              isTransformer(plan->config.model.type) ? "tokens/s" : "samples/s",
              percentOrNa(sim.mfu, sim.mfuDefined).c_str(),
              j["fits"].get<bool>() ? "fits in memory on every device" : "DOES NOT FIT on every device");
  return 0;
}

int runAutoplanCommand(const RunConfig& config, int top, bool json, const std::string& writePath) {
  AutoPlanOptions options;
  options.top = top;
  auto result = autoPlan(config, options);
  if (!result) {
    std::fprintf(stderr, "meshstudio-engine autoplan: %s\n", result.message().c_str());
    return 1;
  }
  nlohmann::json list = nlohmann::json::array();
  for (const PlanCandidate& c : result->best) {
    const ParallelConfig& p = c.config.parallel;
    list.push_back({{"dp", p.dp},
                    {"tp", p.tp},
                    {"pp", p.pp},
                    {"schedule", toString(p.schedule)},
                    {"ep", p.ep},
                    {"cp", p.cp},
                    {"virtual_chunks", p.virtualChunks},
                    {"microbatches", p.microbatches},
                    {"microbatch_size", config.training.batchSize / (p.dp * p.microbatches)},
                    {"zero", p.zero},
                    {"recompute", toString(p.recompute)},
                    {"recompute_layers", p.recomputeLayers},
                    {"offload", toString(p.offload)},
                    {"sequence_parallel", p.sequenceParallel},
                    {"tp_comm_overlap", p.tpCommOverlap},
                    {"overlap_param_gather", p.overlapParamGather},
                    {"step_time_s", c.stepTime},
                    {"tokens_per_s", c.tokensPerSecond},
                    {"mfu", c.mfu},
                    {"mfu_defined", c.mfuDefined},
                    {"bubble_fraction", c.bubbleFraction},
                    {"peak_memory_bytes", c.peakMemoryBytes},
                    {"capacity_bytes", c.capacityBytes}});
  }
  if (json) {
    std::printf("%s\n", nlohmann::json{{"plans", list},
                                       {"considered", result->considered},
                                       {"screened_fit", result->screenedFit},
                                       {"simulated", result->simulated},
                                       {"search_seconds", result->seconds}}
                            .dump(2)
                            .c_str());
  } else {
    // sp: sequence parallelism (with tp_comm_overlap where the plan has it: "sp+o").
    std::printf("%-3s %5s %4s %4s %3s %3s %-4s %-17s %3s %5s %4s %4s %-9s %-10s %10s %12s %6s %7s %12s\n",
                "#", "dp", "tp", "pp", "cp", "ep", "sp", "schedule", "V", "M", "mbs", "zero", "recompute",
                "offload", "step s", "tokens/s", "MFU", "bubble", "memory GiB");
    int i = 1;
    for (const auto& c : list) {
      // "full:N": the first N blocks of every chunk recomputed ("recompute_layers").
      std::string recompute = c["recompute"].get<std::string>();
      if (c["recompute_layers"].get<int>() > 0)
        recompute += ":" + std::to_string(c["recompute_layers"].get<int>());
      const char* sp = !c["sequence_parallel"].get<bool>() ? "-"
                       : c["tp_comm_overlap"].get<bool>()  ? "sp+o"
                                                           : "sp";
      std::printf(
          "%-3d %5d %4d %4d %3d %3d %-4s %-17s %3d %5d %4d %4d %-9s %-10s %10.4f %12.0f %6s %6.1f%% %5.1f / "
          "%-5.1f\n",
          i++, c["dp"].get<int>(), c["tp"].get<int>(), c["pp"].get<int>(), c["cp"].get<int>(),
          c["ep"].get<int>(), sp, c["schedule"].get<std::string>().c_str(), c["virtual_chunks"].get<int>(),
          c["microbatches"].get<int>(), c["microbatch_size"].get<int>(), c["zero"].get<int>(),
          recompute.c_str(), c["offload"].get<std::string>().c_str(), c["step_time_s"].get<double>(),
          c["tokens_per_s"].get<double>(),
          percentOrNa(c["mfu"].get<double>(), c["mfu_defined"].get<bool>()).c_str(),
          100.0 * c["bubble_fraction"].get<double>(), c["peak_memory_bytes"].get<double>() / kGiB,
          c["capacity_bytes"].get<double>() / kGiB);
    }
    std::printf("\n%d candidates considered, %d passed the memory screen, %d simulated, in %.2f s\n",
                result->considered, result->screenedFit, result->simulated, result->seconds);
  }
  if (!writePath.empty()) {
    if (Status s = saveRunConfig(result->best.front().config, writePath); !s) {
      std::fprintf(stderr, "meshstudio-engine autoplan: %s\n", s.message().c_str());
      return 1;
    }
    std::fprintf(stderr, "wrote the best plan to %s\n", writePath.c_str());
  }
  return 0;
}

int runFidelityCommand(const std::string& runDir, const std::string& configOverride, bool json, int top) {
  auto report = fidelityOfRunFolder(runDir, configOverride);
  if (!report) {
    std::fprintf(stderr, "meshstudio-engine fidelity: %s\n", report.message().c_str());
    return 2;
  }
  if (json) {
    std::printf("%s\n", fidelityJson(*report).dump(2).c_str());
    return 0;
  }
  const FidelityReport& r = *report;
  const auto pct = [](double e) {
    return (e >= 0 ? "+" : "") + std::to_string(int(std::lround(100 * e))) + "%";
  };
  std::printf("run %s: %d rank%s, %d step%s compared, predicted on \"%s\" (%s)\n", r.run.c_str(), r.ranks,
              r.ranks == 1 ? "" : "s", r.stepsUsed, r.stepsUsed == 1 ? "" : "s", r.device.c_str(),
              r.profiled ? "a measured profile" : "a catalog datasheet");
  std::printf("step: predicted %.2f ms, measured %.2f ms, error %s\n\n", 1e3 * r.predictedStep,
              1e3 * r.measuredStep,
              r.measuredStep > 0 ? pct(r.predictedStep / r.measuredStep - 1).c_str() : "n/a");
  // Times: worst first by ms per step; the share of the measured step the gap is.
  std::printf("%-7s %-5s %-5s %-22s %12s %12s %8s %10s\n", "time", "rank", "stage", "what", "pred ms/step",
              "meas ms/step", "error", "gap/step");
  int shown = 0;
  for (const FidelityRow& row : r.times) {
    if (row.item == FidelityItem::Bubble) continue;
    if (shown++ == top) break;
    std::printf("%-7s %-5d %-5d %-22s %12.3f %12.3f %8s %9.1f%%\n", toString(row.item), row.rank, row.stage,
                row.what.substr(0, 22).c_str(), 1e3 * row.predicted, 1e3 * row.measured,
                pct(row.error()).c_str(), r.measuredStep > 0 ? 100 * row.gap() / r.measuredStep : 0.0);
  }
  std::printf("\n%-7s %-5s %-5s %12s %12s %12s\n", "bubble", "rank", "stage", "predicted", "measured", "gap");
  shown = 0;
  for (const FidelityRow& row : r.times) {
    if (row.item != FidelityItem::Bubble) continue;
    if (shown++ == top) break;
    std::printf("%-7s %-5d %-5d %11.1f%% %11.1f%% %10.1f pt\n", "", row.rank, row.stage, 100 * row.predicted,
                100 * row.measured, 100 * (row.predicted - row.measured));
  }
  if (!r.memory.empty()) {
    std::printf("\n%-7s %-5s %-5s %-12s %12s %12s %8s\n", "memory", "rank", "stage", "category", "pred MiB",
                "meas MiB", "error");
    shown = 0;
    for (const FidelityRow& row : r.memory) {
      if (shown++ == top) break;
      std::printf("%-7s %-5d %-5d %-12s %12.3f %12.3f %8s\n", "", row.rank, row.stage, row.what.c_str(),
                  row.predicted / (1 << 20), row.measured / (1 << 20), pct(row.error()).c_str());
    }
  }
  for (const std::string& n : r.notes) std::printf("\nnote: %s", n.c_str());
  if (!r.notes.empty()) std::printf("\n");
  return 0;
}

}  // namespace ms
