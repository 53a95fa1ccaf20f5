// The single-rank training loop; see trainer.h.
#include "runtime/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "kernels/cpu/cpu_ops.h"
#include "plan/cost_model.h"
#include "plan/memory_model.h"
#include "plan/plan.h"
#include "plan/simulator.h"
#include "runtime/checkpoint.h"
#include "runtime/device.h"
#include "runtime/file_io.h"
#include "runtime/heartbeat.h"
#include "runtime/metrics.h"
#include "runtime/optimizer.h"
#include "runtime/pipeline.h"

namespace ms {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

Status checkRunnable(const RunConfig& c, int worldSize) {
  const int ranks = c.parallel.dp * c.parallel.tp * c.parallel.pp;
  if (ranks != worldSize)
    return Status::error("/parallel: the plan has dp*tp*pp = " + std::to_string(ranks) +
                         " ranks but the run was started with " + std::to_string(worldSize) +
                         " process(es); start it as `mpirun -np " + std::to_string(ranks) +
                         " meshstudio-engine train CONFIG`");
  if (c.parallel.sequenceParallel && c.parallel.tp > 1) {
    const int positions = buildModelSpec(c.model, c.training.seqLen).samplePositions;
    if (positions % c.parallel.tp != 0)
      return Status::error(
          "/parallel/sequence_parallel: the sequence of " + std::to_string(positions) +
          " positions does not split evenly over tp = " + std::to_string(c.parallel.tp) +
          " ranks; choose a sequence length (or image patches) divisible by tp, or turn it off");
  }
  if (c.parallel.tp > 1 && c.model.type == ModelType::Mlp)
    return Status::error("/parallel/tp: the mlp model has no tensor-parallel layers; use tp = 1");
  if (c.parallel.tp > 1 && c.model.type == ModelType::Gpt && c.model.vocab % c.parallel.tp != 0)
    return Status::error("/model/vocab: " + std::to_string(c.model.vocab) +
                         " is not divisible by tp = " + std::to_string(c.parallel.tp) +
                         " (the vocab-parallel embedding splits the vocabulary evenly)");
  return Status::ok();
}

int threadsPerRank(const RunConfig& config) {
  if (config.training.threads > 0) return config.training.threads;
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (cores <= 0) cores = 1;
  int local = 1;
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) local = std::max(1, std::atoi(s));
  return std::max(1, cores / local);
}

std::string runDirectory(const RunConfig& config, const std::string& overrideDir) {
  if (!overrideDir.empty()) return overrideDir;
  if (!config.training.runDir.empty()) return config.resolvePath(config.training.runDir);
  return "runs/" + config.name;
}

namespace {

// Every rank learns whether any rank failed: returns the local error, "another rank failed" on the ranks that
// did not fail themselves, or ok everywhere. Keeps the ranks from waiting forever in a later collective.
Status agree(const Status& local, Communicator* world) {
  if (!world || world->size() == 1) return local;
  int32_t failed = local.isOk() ? 0 : 1;
  Status s = world->allReduce(&failed, &failed, 1, CommType::I32, ReduceOp::Max);
  if (!s) return s;
  if (!local.isOk()) return local;
  if (failed) return Status::error("rank " + std::to_string(world->rank()) + " stops: another rank failed");
  return Status::ok();
}

}  // namespace

EvalResult evaluate(Model& model, const DataSource& data, const RunConfig& config, int maxBatches,
                    Communicator* world) {
  // An evaluation covers maxBatches * batch_size samples (whatever the parallel layout), in pieces of one
  // training microbatch, dealt round-robin to the ranks.
  const int64_t B = config.training.batchSize;
  const int mbs = microbatchSize(config);
  const int64_t total = data.evalSamples();
  const int64_t S = maxBatches > 0 ? std::min<int64_t>(total, maxBatches * B) : total;
  const int64_t pieces = (S + mbs - 1) / mbs;
  const int W = world ? world->size() : 1, R = world ? world->rank() : 0;
  LossStats sum;
  Batch batch;
  for (int64_t i = R; i < pieces; i += W) {
    const int64_t first = i * mbs;
    const int count = static_cast<int>(std::min<int64_t>(mbs, S - first));
    data.evalBatch(first, count, batch);
    sum += model.forward(batch);
  }
  reduceStats(sum, world);  // a failed reduction leaves this rank's share, which the caller reports as is
  EvalResult r;
  r.samples = S;
  r.loss = sum.count ? sum.lossSum / double(sum.count) : 0.0;
  r.hasAccuracy = config.model.type != ModelType::Gpt;
  r.accuracy = r.hasAccuracy && sum.count ? double(sum.correct) / double(sum.count) : 0.0;
  return r;
}

namespace {

std::string formatDuration(double s) {
  char buf[32];
  const int t = static_cast<int>(s + 0.5);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%dh%02dm", t / 3600, (t / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%dm%02ds", t / 60, t % 60);
  return buf;
}

// A one-line progress bar on stderr, redrawn at most every 100 ms.
class ProgressBar {
 public:
  ProgressBar(bool enabled, int64_t total) : m_enabled(enabled), m_total(total) {}
  void update(int64_t done, double loss, double rate, const char* unit, double eta, bool force = false) {
    if (!m_enabled) return;
    const auto now = Clock::now();
    if (!force && now - m_last < std::chrono::milliseconds(100)) return;
    m_last = now;
    const int width = 30;
    const int filled = m_total ? static_cast<int>(width * done / m_total) : width;
    std::string bar(filled, '#');
    bar += std::string(width - filled, '.');
    std::fprintf(stderr, "\r\033[Kstep %lld/%lld [%s] loss %.4f | %.0f %s/s | eta %s",
                 static_cast<long long>(done), static_cast<long long>(m_total), bar.c_str(), loss, rate, unit,
                 formatDuration(eta).c_str());
    m_drawn = true;
  }
  // Moves off the bar line before a log line.
  void breakLine() {
    if (m_enabled && m_drawn) std::fputc('\n', stderr);
    m_drawn = false;
  }

 private:
  bool m_enabled;
  int64_t m_total;
  bool m_drawn = false;
  Clock::time_point m_last{};
};

// The plan's predictions for this run (the same figures `meshstudio-engine plan` prints), so the stream can
// show predicted and measured side by side. Empty when the config does not make a plan.
// What trains: "kind" (cpu, cuda), the device's name, index and memory, and its peak dense FLOP/s (bf16 and
// fp32, from the hardware catalog by name; 0 when unknown) for MFU figures.
nlohmann::json deviceJson(const DeviceInfo& info, GemmPrecision gemm) {
  const DevicePeak peak = peakOfDevice(info);
  nlohmann::json j = {{"kind", info.kind == DeviceKind::Cuda ? "cuda" : "cpu"}, {"name", info.name}};
  if (info.kind == DeviceKind::Cuda) {
    j["index"] = info.index;
    j["memory_bytes"] = info.totalBytes;
    j["peak_flops_bf16"] = peak.bf16;
    j["peak_flops_fp32"] = peak.fp32;
    j["catalog"] = peak.catalogKey;
  }
  if (info.emulated) j["emulated"] = true;
  j["gemm_precision"] = toString(gemm);
  return j;
}

nlohmann::json predictedJson(const RunConfig& config) {
  auto plan = buildPlan(config, /*allowSharing=*/true);
  if (!plan) return nlohmann::json::object();
  const std::vector<MemoryBreakdown> memory = estimateMemory(*plan);
  const SimResult sim = simulate(*plan, CostModel(*plan));
  nlohmann::json ranks = nlohmann::json::array();
  for (const MemoryBreakdown& m : memory)
    ranks.push_back({{"rank", m.rank},
                     {"stage", m.stage},
                     {"memory_bytes", memoryBytesJson(m)},
                     {"bubble_fraction", sim.bubbleFraction[m.rank]}});
  return {{"step_time_s", sim.stepTime},
          {"tokens_per_s", sim.tokensPerSecond},
          {"mfu", sim.mfu},
          {"ranks", ranks}};
}

// The spans and memory counters of every rank, gathered so rank 0 can write them in one line each. A rank's
// report is packed as doubles: its span count, then (action, layer, microbatch, start, end) per span (padded
// to the largest count; chunk too), then its current and peak bytes per memory category and in total.
struct RankReports {
  nlohmann::json spans = nlohmann::json::array();
  nlohmann::json memory = nlohmann::json::array();
};

Expected<RankReports> gatherReports(const std::vector<Span>& spans, const MemoryTracker& tracker,
                                    const MemoryTracker& host, const ModelSpec& spec, Communicator* world) {
  const int W = world ? world->size() : 1;
  int32_t most = static_cast<int32_t>(spans.size());
  if (W > 1) MS_TRY(world->allReduce(&most, &most, 1, CommType::I32, ReduceOp::Max));
  // Categories (current, total, peak, total), then the device's view: used, reserved by the caching
  // allocator, capacity (all 0 on the CPU).
  // Then the host tracker's (offloaded model states) current and peak per category.
  const size_t memoryValues = 2 * (kMemoryCategories + 1) + 3 + 2 * kMemoryCategories;
  const size_t per = 1 + 6 * size_t(most) + memoryValues;
  std::vector<double> mine(per, 0.0);
  mine[0] = double(spans.size());
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    double* v = &mine[1 + 6 * i];
    v[0] = s.action;
    v[1] = s.layer;
    v[2] = s.microbatch;
    v[3] = s.start;
    v[4] = s.end;
    v[5] = s.chunk;
  }
  double* mem = &mine[1 + 6 * size_t(most)];
  for (int c = 0; c < kMemoryCategories; ++c) {
    mem[c] = double(tracker.current(static_cast<MemoryCategory>(c)));
    mem[kMemoryCategories + 1 + c] = double(tracker.peak(static_cast<MemoryCategory>(c)));
  }
  mem[kMemoryCategories] = double(tracker.currentTotal());
  mem[2 * kMemoryCategories + 1] = double(tracker.peakTotal());
  const DeviceMemoryInfo dev = tracker.backend().memoryInfo();
  mem[2 * kMemoryCategories + 2] = double(dev.totalBytes - dev.freeBytes);
  mem[2 * kMemoryCategories + 3] = double(dev.reservedBytes);
  mem[2 * kMemoryCategories + 4] = double(dev.totalBytes);
  double* hostMem = mem + 2 * (kMemoryCategories + 1) + 3;
  for (int c = 0; c < kMemoryCategories; ++c) {
    hostMem[c] = double(host.current(static_cast<MemoryCategory>(c)));
    hostMem[kMemoryCategories + c] = double(host.peak(static_cast<MemoryCategory>(c)));
  }
  std::vector<double> all = mine;
  if (W > 1) {
    all.resize(per * W);
    MS_TRY(world->allGather(mine.data(), all.data(), per, CommType::F64));
  }
  RankReports out;
  for (int r = 0; r < W; ++r) {
    const double* v = &all[per * r];
    nlohmann::json list = nlohmann::json::array();
    for (int i = 0; i < static_cast<int>(v[0]); ++i) {
      const double* s = v + 1 + 6 * i;
      const int layer = static_cast<int>(s[1]);
      list.push_back({{"action", std::string(1, static_cast<char>(s[0]))},
                      {"layer", layer >= 0 ? spec.layers[layer].name : std::string()},
                      {"mb", static_cast<int>(s[2])},
                      {"chunk", static_cast<int>(s[5])},
                      {"start", s[3]},
                      {"end", s[4]}});
    }
    out.spans.push_back({{"rank", r}, {"spans", list}});
    const double* m = v + 1 + 6 * size_t(most);
    nlohmann::json current, peak;
    for (int c = 0; c < kMemoryCategories; ++c) {
      current[toString(static_cast<MemoryCategory>(c))] = static_cast<int64_t>(m[c]);
      peak[toString(static_cast<MemoryCategory>(c))] = static_cast<int64_t>(m[kMemoryCategories + 1 + c]);
    }
    current["total"] = static_cast<int64_t>(m[kMemoryCategories]);
    peak["total"] = static_cast<int64_t>(m[2 * kMemoryCategories + 1]);
    nlohmann::json line = {{"rank", r}, {"current", current}, {"peak", peak}};
    if (m[2 * kMemoryCategories + 4] > 0)
      line["device"] = {{"used", static_cast<int64_t>(m[2 * kMemoryCategories + 2])},
                        {"reserved", static_cast<int64_t>(m[2 * kMemoryCategories + 3])},
                        {"total", static_cast<int64_t>(m[2 * kMemoryCategories + 4])}};
    // Host memory (offload), only where something lives there.
    const double* h = m + 2 * (kMemoryCategories + 1) + 3;
    double hostPeak = 0;
    for (int c = 0; c < kMemoryCategories; ++c) hostPeak += h[kMemoryCategories + c];
    if (hostPeak > 0) {
      nlohmann::json hc, hp;
      for (int c = 0; c < kMemoryCategories; ++c) {
        hc[toString(static_cast<MemoryCategory>(c))] = static_cast<int64_t>(h[c]);
        hp[toString(static_cast<MemoryCategory>(c))] = static_cast<int64_t>(h[kMemoryCategories + c]);
      }
      line["host"] = {{"current", hc}, {"peak", hp}};
    }
    out.memory.push_back(line);
  }
  return out;
}

Status trainOn(Backend& backend, const std::string& deviceNote, const RunConfig& config,
               const TrainOptions& options);

}  // namespace

Status train(const RunConfig& config, const TrainOptions& options) {
  Communicator* world = options.world;
  const int W = world ? world->size() : 1;
  MS_TRY(checkRunnable(config, W));
  cpu::setThreads(threadsPerRank(config));
  auto device = openDevice(config.device, localRankFromEnvironment(), options.emulateDevice);
  MS_TRY(agree(device ? Status::ok() : device.status(), world));
  try {
    // Mixed precision: bf16 matrix products, fp32 everything else (kernels/backend.h, GemmPrecision).
    device->backend->setGemmPrecision(config.parallel.precision == Precision::Bf16 ? GemmPrecision::Bf16
                                                                                   : GemmPrecision::Fp32);
    return trainOn(*device->backend, device->note, config, options);
  } catch (const DeviceFailure& e) {
    // Outside the executor (which names the action): loading, the optimizer step, checkpoints.
    return Status::error(std::string("rank ") + std::to_string(world ? world->rank() : 0) +
                         ": device: " + e.what());
  }
}

namespace {

// Fault injection for the supervisor's tests (tests/tst_failure.cpp): MESHSTUDIO_FAULT="freeze:RANK:STEP"
// makes rank RANK's training loop stop for good as step STEP begins, its heartbeat thread beating on: a
// main thread stuck but alive, which only the progress counter shows. Anything else in the variable is
// ignored (it is not a user setting).
void injectedFreeze(int rank, int64_t step) {
  static const std::pair<int, int64_t> fault = [] {
    const char* v = std::getenv("MESHSTUDIO_FAULT");
    int r = -1;
    long long s = -1;
    if (v && std::sscanf(v, "freeze:%d:%lld", &r, &s) == 2) return std::pair<int, int64_t>(r, s);
    return std::pair<int, int64_t>(-1, -1);
  }();
  if (fault.first != rank || fault.second != step) return;
  setActivity("step " + std::to_string(step) + ": frozen by MESHSTUDIO_FAULT");
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

Status trainOn(Backend& backend, const std::string& deviceNote, const RunConfig& config,
               const TrainOptions& options) {
  Communicator* world = options.world;
  const int W = world ? world->size() : 1, R = world ? world->rank() : 0;
  const bool lead = R == 0;  // rank 0 owns the run folder, the metrics stream and the checkpoints
  const int threads = threadsPerRank(config);
  const std::string runDir = runDirectory(config, options.runDir);

  // Where to start: a checkpoint, or afresh (refusing to mix a new run with an old run's checkpoints).
  std::string resumeDir;
  Status prepared = Status::ok();
  RunFolderLock lock;  // rank 0 owns the folder for the whole run (file_io.h)
  if (lead) prepared = lock.acquire(runDir);
  if (prepared && options.resume == "latest") {
    auto latest = latestCheckpoint(runDir);
    if (latest)
      resumeDir = *latest;
    else
      prepared = latest.status().withContext("--resume");
  } else if (prepared && !options.resume.empty()) {
    resumeDir = options.resume;
  } else if (prepared && lead) {
    const fs::path ckpts = fs::path(runDir) / "checkpoints";
    std::error_code ec;
    if (fs::exists(ckpts) && !fs::is_empty(ckpts, ec)) {
      if (!options.overwrite)
        prepared = Status::error(runDir +
                                 ": this run folder already holds checkpoints; pass --resume to continue it, "
                                 "--overwrite to start over, or --run-dir for another folder");
      else
        fs::remove_all(ckpts, ec);
    }
  }
  MS_TRY(agree(prepared, world));

  auto data = openDataSource(config);
  MS_TRY(agree(data ? Status::ok() : data.status(), world));
  // The plan says which layers, which shard of them and which action list this rank runs.
  auto plan = buildPlan(config, /*allowSharing=*/true);
  MS_TRY(agree(plan ? Status::ok() : plan.status(), world));
  std::string commNote;
  auto tensorWorld = openTensorWorld(world, backend, commNote);
  MS_TRY(agree(tensorWorld ? Status::ok() : tensorWorld.status(), world));
  auto groups = makeRankGroups(*plan, world, tensorWorld->get());
  if (!groups) return groups.status();
  MemoryTracker tracker(&backend);
  MemoryTracker hostTracker;  // offloaded model states, in host memory (plan/model_state.h)
  Model model(config, modelShardOf(*plan, *groups), &tracker, 784, &hostTracker);
  Optimizer optimizer(config.optimizer, model.params(), &tracker);
  PipelineExecutor executor(*plan, *groups, model);
  int64_t startStep = 0;
  Status loaded = Status::ok();
  if (!resumeDir.empty()) {
    auto info = loadCheckpointSharded(resumeDir, *plan, model.params(), optimizer);
    if (info)
      startStep = info->step;
    else
      loaded = info.status().withContext("resuming from " + resumeDir);
    // A checkpoint past the run's end has nothing to resume (one at the end has nothing left: fine).
    if (loaded && startStep > config.training.steps)
      loaded = Status::error(resumeDir + " is at step " + std::to_string(startStep) + ", past the run's " +
                             std::to_string(config.training.steps) +
                             " steps (training.steps or --steps): nothing to train; ask for more steps");
  }
  if (loaded && lead) loaded = saveRunConfig(config, runDir + "/config.json");
  MS_TRY(agree(loaded, world));

  MetricsWriter metrics;  // rank 0 writes; the other ranks' writer has no destination
  MS_TRY(agree(
      lead ? metrics.open(options.metricsSink, runDir + "/metrics.jsonl", !resumeDir.empty()) : Status::ok(),
      world));
  // One clock for all ranks: each starts its clock as it leaves the same barrier (skew: the barrier's exit,
  // microseconds on one node).
  if (W > 1) MS_TRY(world->barrier());
  const auto clockZero = Clock::now();
  std::vector<Span> spans;
  model.setSpanSink(&spans, clockZero);

  const ModelSpec& spec = model.spec();
  const bool isGpt = config.model.type == ModelType::Gpt;
  const int B = config.training.batchSize;
  const int64_t targetsPerStep = isGpt ? int64_t(B) * config.training.seqLen : B;
  const float lossScale = 1.0f / static_cast<float>(targetsPerStep);
  const int64_t steps = config.training.steps;
  {
    nlohmann::json layers = nlohmann::json::array();
    for (const LayerSpec& l : spec.layers) layers.push_back({{"name", l.name}, {"params", l.paramCount()}});
    metrics.write("run_start", {{"name", config.name},
                                {"config", toJson(config)},
                                {"ranks", W},
                                {"threads_per_rank", threads},
                                {"device", deviceJson(backend.info(), backend.gemmPrecision())},
                                {"params", spec.paramCount()},
                                {"layers", layers},
                                {"start_step", startStep},
                                {"steps", steps},
                                {"run_dir", runDir},
                                {"resumed_from", resumeDir},
                                {"predicted", predictedJson(config)}});
  }
  if (!resumeDir.empty()) metrics.write("log", {{"level", "info"}, {"message", "resumed from " + resumeDir}});
  // One line saying which device trains (and for "auto" on a CPU machine, why not a GPU), once; one saying
  // how tensors travel when that is slower than it could be.
  for (const std::string& line : {deviceNote, commNote}) {
    if (line.empty()) continue;
    metrics.write("log", {{"level", "info"}, {"message", line}});
    if (lead) std::fprintf(stderr, "%s\n", line.c_str());
  }

  // A stream that cannot be written from its first lines on (a full disk) ends the run before it trains.
  if (Status w = agree(metrics.status(), world); !w) {
    metrics.write("run_end", {{"status", "error"}, {"reason", w.message()}, {"step", startStep}});
    if (lead && options.streamEnded) *options.streamEnded = true;
    return w;
  }

  ProgressBar bar(options.progress, steps);
  Batch batch;
  double ema = 0;  // smoothed step time for the ETA
  std::string endStatus = "ok", endReason;
  int64_t step = startStep;
  std::string lastCheckpoint = resumeDir;  // the newest whole checkpoint of this run, for error messages
  auto whereLastGood = [&] {
    return lastCheckpoint.empty() ? std::string("; no checkpoint of this run was written")
                                  : "; the newest complete checkpoint is " + lastCheckpoint;
  };
  auto saveAt = [&](int64_t done) -> Status {
    // Every rank contributes its shards; rank 0 writes full tensors; everyone agrees on the outcome.
    const std::string dir = checkpointDirName(runDir, done);
    setActivity("saving checkpoint " + dir, /*longPhase=*/true);
    MS_TRY(saveCheckpointSharded(dir, *plan, *groups, model.params(), optimizer,
                                 CheckpointInfo{done, optimizer.stepsTaken(), config.seed}));
    lastCheckpoint = dir;
    metrics.write("checkpoint", {{"step", done}, {"path", dir}});
    if (lead && config.training.keepCheckpoints > 0)
      if (Status p = pruneCheckpoints(runDir, config.training.keepCheckpoints); !p)
        metrics.write("log", {{"level", "warning"}, {"message", p.message()}});
    return Status::ok();
  };
  auto evalAt = [&](int64_t done) -> Status {
    const auto t0 = Clock::now();
    auto e = executor.evaluate(**data, config.training.evalBatches);
    if (!e) return e.status();
    EvalResult r;
    r.samples = e->samples;
    r.loss = e->stats.count ? e->stats.lossSum / double(e->stats.count) : 0.0;
    r.hasAccuracy = config.model.type != ModelType::Gpt;
    r.accuracy = r.hasAccuracy && e->stats.count ? double(e->stats.correct) / double(e->stats.count) : 0.0;
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    nlohmann::json line = {{"step", done}, {"loss", r.loss}, {"samples", r.samples}, {"time_s", secs}};
    if (r.hasAccuracy) line["accuracy"] = r.accuracy;
    metrics.write("eval", line);
    bar.breakLine();
    if (!lead) return Status::ok();
    if (r.hasAccuracy)
      std::fprintf(stderr, "step %lld: eval loss %.4f, accuracy %.2f%% (%lld samples)\n",
                   static_cast<long long>(done), r.loss, 100.0 * r.accuracy,
                   static_cast<long long>(r.samples));
    else
      std::fprintf(stderr, "step %lld: eval loss %.4f (%lld samples)\n", static_cast<long long>(done), r.loss,
                   static_cast<long long>(r.samples));
    return Status::ok();
  };

  for (; step < steps; ++step) {
    // A stop request (mpirun forwards SIGINT to every rank) takes effect on all ranks at the same step.
    int32_t stop = options.stopRequested && options.stopRequested->load() ? 1 : 0;
    if (W > 1 && !world->allReduce(&stop, &stop, 1, CommType::I32, ReduceOp::Max)) stop = 1;
    if (stop) {
      endStatus = "interrupted";
      endReason = "stopped by request after step " + std::to_string(step);
      break;
    }
    // Every rank reaches the same step: no agreement needed.
    if (options.stopAfter > 0 && step >= options.stopAfter) {
      endStatus = "interrupted";
      endReason = "stopped after step " + std::to_string(step) + " as asked (--stop-after)";
      break;
    }
    const auto t0 = Clock::now();
    model.beginSpans();
    tracker.resetPeak();
    hostTracker.resetPeak();
    model.params().zeroGrads();
    LossStats stats;
    // The stage's action list: forwards, backwards, transfers, gradient buckets; then the finished gradients.
    // Each replica's gradient is its share of the sum over the global batch (the loss scale is 1 / targets of
    // the whole step), so the data-parallel sum is the full gradient.
    injectedFreeze(R, step + 1);
    Status ran = executor.runStep(step, **data, lossScale, stats);
    auto squares = ran ? executor.gradSquares() : Expected<double>(ran);
    if (!squares) {
      endStatus = "error";
      endReason = squares.status().message();
      break;
    }
    const double gradNorm = std::sqrt(*squares);
    const double lr = learningRate(config, step);
    const int optStart = model.mark();
    setActivity("step " + std::to_string(step + 1) + ": optimizer step");
    optimizer.step(static_cast<float>(lr), clipFactor(gradNorm, config.training.gradClip));
    if (Status g = model.params().finishUpdate(); !g) {
      endStatus = "error";
      endReason = g.message();
      break;
    }
    model.addSpan('O', -1, 0, -1, optStart);
    backend.synchronize();  // the step's time includes the device's work
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    const double loss = stats.count ? stats.lossSum / double(stats.count) : 0.0;
    if (!std::isfinite(loss) || !std::isfinite(gradNorm)) {
      endStatus = "error";
      endReason = "the loss became " + std::to_string(loss) + " (gradient norm " + std::to_string(gradNorm) +
                  ") at step " + std::to_string(step + 1) + "; lower optimizer.lr or set training.grad_clip";
      break;
    }
    const int64_t done = step + 1;
    ema = (step == startStep) ? secs : 0.9 * ema + 0.1 * secs;
    const double tokensPerS = double(isGpt ? targetsPerStep : 0) / secs;
    const double samplesPerS = double(B) / secs;
    if (done % config.training.logEvery == 0 || done == steps) {
      nlohmann::json line = {{"step", done},          {"loss", loss},        {"lr", lr},
                             {"grad_norm", gradNorm}, {"step_time_s", secs}, {"samples_per_s", samplesPerS}};
      if (isGpt)
        line["tokens_per_s"] = tokensPerS;
      else
        line["accuracy"] = stats.count ? double(stats.correct) / double(stats.count) : 0.0;
      metrics.write("step", line);
      model.resolveSpans();
      auto reports = gatherReports(spans, tracker, hostTracker, spec, world);
      if (!reports) {
        endStatus = "error";
        endReason = reports.message();
        break;
      }
      metrics.write("spans", {{"step", done}, {"ranks", reports->spans}});
      metrics.write("memory", {{"step", done}, {"ranks", reports->memory}});
      // A stream that cannot be written (a full disk) ends the run now, on every rank, not at the end.
      if (Status w = agree(metrics.status(), world); !w) {
        endStatus = "error";
        endReason = w.message() + whereLastGood();
        break;
      }
    }
    if (lead)
      bar.update(done, loss, isGpt ? tokensPerS : samplesPerS, isGpt ? "tok" : "samples",
                 ema * double(steps - done), done == steps);
    if (lead && !options.progress && (done % std::max<int64_t>(1, steps / 10) == 0 || done == steps))
      std::fprintf(stderr, "step %lld/%lld: loss %.4f, %.3f s/step\n", static_cast<long long>(done),
                   static_cast<long long>(steps), loss, secs);
    const bool last = done == steps;
    const int evalEvery = config.training.evalEvery;
    if ((evalEvery > 0 && done % evalEvery == 0) || last) {
      if (Status e = evalAt(done); !e) {
        endStatus = "error";
        endReason = e.message();
        break;
      }
    }
    const int ckptEvery = config.training.checkpointEvery;
    if ((ckptEvery > 0 && done % ckptEvery == 0) || last) {
      Status s = saveAt(done);
      if (!s) {
        endStatus = "error";
        endReason = s.message() + whereLastGood();
        ++step;
        break;
      }
    }
  }
  if (endStatus == "interrupted" && step > startStep) {
    Status s = saveAt(step);
    if (!s) endReason += "; saving the checkpoint failed: " + s.message() + whereLastGood();
  }
  bar.breakLine();
  metrics.write("run_end", {{"status", endStatus}, {"reason", endReason}, {"step", step}});
  if (lead && options.streamEnded) *options.streamEnded = true;
  MS_TRY(metrics.status());
  if (endStatus == "error") return Status::error(endReason);
  if (endStatus == "interrupted") std::fprintf(stderr, "%s\n", endReason.c_str());
  return Status::ok();
}

}  // namespace

}  // namespace ms
