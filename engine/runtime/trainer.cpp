// The single-rank training loop; see trainer.h.
#include "runtime/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "kernels/cpu/cpu_ops.h"
#include "plan/cost_model.h"
#include "plan/memory_model.h"
#include "plan/plan.h"
#include "plan/simulator.h"
#include "runtime/checkpoint.h"
#include "runtime/comm_watchdog.h"
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
  if (c.parallel.mode == ParallelMode::ParameterServer)
    return Status::error(
        "/parallel/mode: parameter_server runs as server and worker processes, not as one training job; "
        "start "
        "it with `meshstudio-engine launch CONFIG`");
  const int ranks = static_cast<int>(c.parallel.ranks());
  if (ranks != worldSize)
    return Status::error("/parallel: the plan has " + c.parallel.ranksText() + " = " + std::to_string(ranks) +
                         " ranks but the run was started with " + std::to_string(worldSize) +
                         " process(es); start it as `mpirun -np " + std::to_string(ranks) +
                         " meshstudio-engine train CONFIG`");
  if (c.parallel.sequenceParallel && c.parallel.tp > 1) {
    const int positions =
        buildModelSpec(c.model, c.training.seqLen, 784, std::max(1, c.parallel.cp)).samplePositions;
    if (positions % c.parallel.tp != 0)
      return Status::error(
          "/parallel/sequence_parallel: the sequence of " + std::to_string(positions) +
          " positions does not split evenly over tp = " + std::to_string(c.parallel.tp) +
          " ranks; choose a sequence length (or image patches) divisible by tp, or turn it off");
  }
  if (c.parallel.tp > 1 && !isTransformer(c.model.type))
    return Status::error("/parallel/tp: the " + std::string(toString(c.model.type)) +
                         " model has no tensor-parallel layers; use tp = 1");
  if (c.parallel.tp > 1 && isLanguageModel(c.model.type) && c.model.vocab % c.parallel.tp != 0)
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
  r.hasAccuracy = !isLanguageModel(config.model.type);
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
  namespace key = metrics::key;
  const DevicePeak peak = peakOfDevice(info);
  nlohmann::json j = {{key::kKind, info.kind == DeviceKind::Cuda ? "cuda" : "cpu"}, {key::kName, info.name}};
  if (info.kind == DeviceKind::Cuda) {
    j[key::kIndex] = info.index;
    j[key::kMemoryBytes] = info.totalBytes;
    j[key::kPeakFlopsBf16] = peak.bf16;
    j[key::kPeakFlopsFp32] = peak.fp32;
    j[key::kCatalog] = peak.catalogKey;
  }
  if (info.emulated) j[key::kEmulated] = true;
  j[key::kGemmPrecision] = toString(gemm);
  return j;
}

nlohmann::json predictedJson(const RunConfig& config) {
  namespace key = metrics::key;
  auto plan = buildPlan(config, /*allowSharing=*/true);
  if (!plan) return nlohmann::json::object();
  const std::vector<MemoryBreakdown> memory = estimateMemory(*plan);
  const SimResult sim = simulate(*plan, CostModel(*plan), /*spansPerRank=*/false);
  nlohmann::json ranks = nlohmann::json::array();
  for (const MemoryBreakdown& m : memory)
    ranks.push_back({{key::kRank, m.rank},
                     {key::kStage, m.stage},
                     {key::kMemoryBytes, memoryBytesJson(m)},
                     {key::kBubbleFraction, sim.bubbleFraction[m.rank]}});
  return {{key::kStepTimeS, sim.stepTime},
          {key::kTokensPerS, sim.tokensPerSecond},
          {key::kMfu, sim.mfu},
          {key::kRanks, ranks}};
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
  namespace key = metrics::key;
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
      list.push_back({{key::kAction, std::string(1, static_cast<char>(s[0]))},
                      {key::kLayer, layer >= 0 ? spec.layers[layer].name : std::string()},
                      {key::kMicrobatch, static_cast<int>(s[2])},
                      {key::kChunk, static_cast<int>(s[5])},
                      {key::kStart, s[3]},
                      {key::kEnd, s[4]}});
    }
    out.spans.push_back({{key::kRank, r}, {key::kSpans, list}});
    const double* m = v + 1 + 6 * size_t(most);
    nlohmann::json current, peak;
    for (int c = 0; c < kMemoryCategories; ++c) {
      current[toString(static_cast<MemoryCategory>(c))] = static_cast<int64_t>(m[c]);
      peak[toString(static_cast<MemoryCategory>(c))] = static_cast<int64_t>(m[kMemoryCategories + 1 + c]);
    }
    current[key::kTotal] = static_cast<int64_t>(m[kMemoryCategories]);
    peak[key::kTotal] = static_cast<int64_t>(m[2 * kMemoryCategories + 1]);
    nlohmann::json line = {{key::kRank, r}, {key::kCurrent, current}, {key::kPeak, peak}};
    if (m[2 * kMemoryCategories + 4] > 0)
      line[key::kDevice] = {{key::kUsed, static_cast<int64_t>(m[2 * kMemoryCategories + 2])},
                            {key::kReserved, static_cast<int64_t>(m[2 * kMemoryCategories + 3])},
                            {key::kTotal, static_cast<int64_t>(m[2 * kMemoryCategories + 4])}};
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
      line[key::kHost] = {{key::kCurrent, hc}, {key::kPeak, hp}};
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
  const int threads = threadsPerRank(config);
  // libgomp ends the process with only its own message when it cannot start its pool: ask first.
  Status threadsOk = cpu::checkThreads(threads);
  if (!threadsOk)
    threadsOk = Status::error(
        "/training/threads: rank " + std::to_string(world ? world->rank() : 0) + ": " + threadsOk.message() +
        (config.training.threads > 0 ? "" : " (0 asks for the cores over the local ranks)") +
        "; lower training.threads or raise the limit");
  MS_TRY(agree(threadsOk, world));
  cpu::setThreads(threads);
  setCommTimeout(config.training.commTimeoutS);
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

// Fault injection for the supervisor's tests (tests/tst_failure.cpp), from MESHSTUDIO_FAULT:
//   "freeze:RANK:STEP"      rank RANK's training loop stops for good as step STEP begins, its heartbeat
//   thread
//                           beating on: a main thread stuck but alive, which only the progress counter shows;
//   "die-saving:RANK:STEP"  rank RANK kills itself (SIGKILL) as it starts writing the step-STEP checkpoint.
// Anything else in the variable is ignored (it is not a user setting).
struct InjectedFault {
  enum Kind { None, Freeze, DieSaving } kind = None;
  int rank = -1;
  int64_t step = -1;
};

const InjectedFault& injectedFault() {
  static const InjectedFault fault = [] {
    InjectedFault f;
    const char* v = std::getenv("MESHSTUDIO_FAULT");
    int r = -1;
    long long s = -1;
    if (v && std::sscanf(v, "freeze:%d:%lld", &r, &s) == 2)
      f.kind = InjectedFault::Freeze;
    else if (v && std::sscanf(v, "die-saving:%d:%lld", &r, &s) == 2)
      f.kind = InjectedFault::DieSaving;
    f.rank = r;
    f.step = s;
    return f;
  }();
  return fault;
}

void injectedFreeze(int rank, int64_t step) {
  const InjectedFault& f = injectedFault();
  if (f.kind != InjectedFault::Freeze || f.rank != rank || f.step != step) return;
  setActivity("step " + std::to_string(step) + ": frozen by MESHSTUDIO_FAULT");
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

void injectedDeathWhileSaving(int rank, int64_t step) {
  const InjectedFault& f = injectedFault();
  if (f.kind == InjectedFault::DieSaving && f.rank == rank && f.step == step) std::raise(SIGKILL);
}

// The host's available memory (MemAvailable in /proc/meminfo), bytes; 0 when unknown.
double hostAvailableBytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  double kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %lf kB", &kib) == 1) break;
  std::fclose(f);
  return kib * 1024.0;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(1 << 30));
  return buf;
}

// The plan's predicted memory of this rank (plan/memory_model.h, which tst_equivalence holds equal to what
// the engine allocates) against what this machine can give it, before anything large is allocated: a batch
// or a model that cannot fit says so now, naming what to change, instead of a bare "out of memory" after
// minutes. On a GPU the device's free memory; on the CPU the host's available memory shared by the ranks on
// this node (OMPI_COMM_WORLD_LOCAL_SIZE). Unknown availability checks nothing.
Status checkFits(const Plan& plan, const RunConfig& config, Backend& backend, int rank) {
  const std::vector<MemoryBreakdown> all = estimateMemory(plan);
  if (rank < 0 || rank >= static_cast<int>(all.size())) return Status::ok();
  const MemoryBreakdown& m = all[static_cast<size_t>(rank)];
  double available = 0;
  double needed = m.total();
  std::string where;
  if (backend.info().kind == DeviceKind::Cuda && !backend.info().emulated) {
    // The CUDA context and the handles exist by now and the free memory excludes them: the estimate's
    // allowance for them is not counted a second time.
    available = double(backend.memoryInfo().freeBytes);
    needed -= std::min(needed, cudaContextAllowanceBytes());
    where = "free on " + backend.info().name;
  } else {
    int local = 1;
    if (const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) local = std::max(1, std::atoi(v));
    const double host = hostAvailableBytes();
    available = host / local;
    where = "available to it on this machine (MemAvailable " + gib(host) + " over " + std::to_string(local) +
            " rank(s))";
  }
  if (available <= 0 || needed <= available) return Status::ok();
  const double states = m.parameters + m.gradients + m.optimizer;
  std::string out = "rank " + std::to_string(rank) + " needs an estimated " + gib(needed) + " (activations " +
                    gib(m.activations) + " for microbatches of " + std::to_string(microbatchSize(config)) +
                    " samples, model states " + gib(states) + ", other " + gib(m.other) +
                    "), more than the " + gib(available) + " " + where;
  if (m.activations >= states)
    return Status::error("/training/batch_size: " + out +
                         "; lower training.batch_size, raise parallel.microbatches or recompute activations "
                         "(`meshstudio-engine plan CONFIG` shows every rank's breakdown)");
  return Status::error("/model: " + out +
                       "; shard the model states (parallel.zero), split the model (parallel.tp, parallel.pp) "
                       "or offload them (`meshstudio-engine plan CONFIG` shows every rank's breakdown)");
}

// One rank's run, in the order it happens:
//   prepare()   the run folder (its lock, a checkpoint to resume from or a refusal to mix runs), the data,
//               the plan, the rank's groups, model and optimizer, the checkpoint's state;
//   begin()     the metrics stream, the clock all ranks share, run_start;
//   step()      one optimizer step and what follows it (the step's lines, an evaluation, a checkpoint),
//               called until it says the run ends;
//   finish()    the stop's checkpoint, run_end, the run's outcome.
// Every rank runs the same sequence and agrees on each phase's outcome (agree()), so a failure on one rank
// ends the run on all of them at the same point instead of leaving the others waiting in a collective.
class TrainingRun {
 public:
  TrainingRun(Backend& backend, const std::string& deviceNote, const RunConfig& config,
              const TrainOptions& options)
      : m_backend(backend),
        m_deviceNote(deviceNote),
        m_config(config),
        m_options(options),
        m_world(options.world),
        m_W(m_world ? m_world->size() : 1),
        m_R(m_world ? m_world->rank() : 0),
        m_lead(m_R == 0),
        m_runDir(runDirectory(config, options.runDir)),
        m_tracker(&backend),
        m_bar(options.progress, config.training.steps) {}

  Status prepare() {
    MS_TRY(agree(chooseStart(), m_world));
    auto data = openDataSource(m_config);
    MS_TRY(agree(data ? Status::ok() : data.status(), m_world));
    m_data = std::move(*data);
    // The plan says which layers, which shard of them and which action list this rank runs.
    auto plan = buildPlan(m_config, /*allowSharing=*/true);
    MS_TRY(agree(plan ? Status::ok() : plan.status(), m_world));
    m_plan = std::move(*plan);
    if (!m_options.skipMemoryCheck) MS_TRY(agree(checkFits(*m_plan, m_config, m_backend, m_R), m_world));
    auto tensorWorld = openTensorWorld(m_world, m_backend, m_commNote);
    MS_TRY(agree(tensorWorld ? Status::ok() : tensorWorld.status(), m_world));
    m_tensorWorld = std::move(*tensorWorld);
    auto groups = makeRankGroups(*m_plan, m_world, m_tensorWorld.get());
    if (!groups) return groups.status();
    m_groups = std::move(*groups);
    m_model.emplace(m_config, modelShardOf(*m_plan, *m_groups), &m_tracker, 784, &m_hostTracker);
    m_optimizer.emplace(m_config.optimizer, m_model->params(), &m_tracker);
    m_executor.emplace(*m_plan, *m_groups, *m_model);
    Status loaded = loadStart();
    if (loaded && m_lead) {
      // The run folder's copy names the device profiles by absolute path: it is read from the run folder
      // (the studio's Open Run Folder), where the config's relative paths would not lead to them.
      RunConfig saved = m_config;
      for (ProfileConfig& p : saved.mesh.profiles) p.file = m_config.resolvePath(p.file);
      loaded = saveRunConfig(saved, m_runDir + "/config.json");
    }
    return agree(loaded, m_world);
  }

  Status begin() {
    MS_TRY(agree(
        m_lead ? m_metrics.open(m_options.metricsSink, m_runDir + "/metrics.jsonl", !m_resumeDir.empty())
               : Status::ok(),
        m_world));
    // One clock for all ranks: each starts its clock as it leaves the same barrier (skew: the barrier's exit,
    // microseconds on one node). The stream's "t" is on the same clock.
    if (m_W > 1) MS_TRY(m_world->barrier());
    const auto clockZero = Clock::now();
    const double zeroUnix = unixTimeS();
    m_model->setSpanSink(&m_spans, clockZero);
    m_metrics.startClock(clockZero);
    m_step = m_startStep;
    m_lastCheckpoint = m_resumeDir;
    writeRunStart(zeroUnix);
    // A stream that cannot be written from its first lines on (a full disk) ends the run before it trains.
    if (Status w = agree(m_metrics.status(), m_world); !w) {
      endWith(metrics::status::kError, w.message());
      m_metrics.write(metrics::type::kRunEnd, {{metrics::key::kStatus, metrics::status::kError},
                                               {metrics::key::kReason, w.message()},
                                               {metrics::key::kStep, m_startStep}});
      if (m_lead && m_options.streamEnded) *m_options.streamEnded = true;
      return w;
    }
    return Status::ok();
  }

  // One step; false when the run ends (m_endStatus says how).
  bool step() {
    if (m_step >= m_config.training.steps || stopRequested()) return false;
    const auto t0 = Clock::now();
    LossStats stats;
    double gradNorm = 0, lr = 0;
    if (!runStep(stats, gradNorm, lr)) return false;
    m_backend.synchronize();  // the step's time includes the device's work
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    const double loss = stats.count ? stats.lossSum / double(stats.count) : 0.0;
    if (!std::isfinite(loss) || !std::isfinite(gradNorm))
      return endWith(metrics::status::kError, "the loss became " + std::to_string(loss) + " (gradient norm " +
                                                  std::to_string(gradNorm) + ") at step " +
                                                  std::to_string(m_step + 1) +
                                                  "; lower optimizer.lr or set training.grad_clip");
    const int64_t done = ++m_step;
    m_ema = (done == m_startStep + 1) ? secs : 0.9 * m_ema + 0.1 * secs;
    if (!report(done, stats, loss, gradNorm, lr, secs)) return false;
    const int64_t steps = m_config.training.steps;
    const bool last = done == steps;
    const int evalEvery = m_config.training.evalEvery;
    if ((evalEvery > 0 && done % evalEvery == 0) || last)
      if (Status e = evaluateAt(done); !e) return endWith(metrics::status::kError, e.message());
    const int ckptEvery = m_config.training.checkpointEvery;
    if (!m_options.noCheckpoint && ((ckptEvery > 0 && done % ckptEvery == 0) || last))
      if (Status s = saveAt(done); !s) return endWith(metrics::status::kError, s.message() + whereLastGood());
    return true;
  }

  Status finish() {
    if (m_endStatus == metrics::status::kInterrupted && m_step > m_startStep && !m_options.noCheckpoint) {
      Status s = saveAt(m_step);
      if (!s) m_endReason += "; saving the checkpoint failed: " + s.message() + whereLastGood();
    }
    m_bar.breakLine();
    m_metrics.write(metrics::type::kRunEnd, {{metrics::key::kStatus, m_endStatus},
                                             {metrics::key::kReason, m_endReason},
                                             {metrics::key::kStep, m_step}});
    if (m_lead && m_options.streamEnded) *m_options.streamEnded = true;
    MS_TRY(m_metrics.status());
    if (m_endStatus == metrics::status::kError) return Status::error(m_endReason);
    if (m_endStatus == metrics::status::kInterrupted) std::fprintf(stderr, "%s\n", m_endReason.c_str());
    return Status::ok();
  }

 private:
  // The run folder is this run's (rank 0 holds its lock for the whole run, file_io.h), and where training
  // starts: the checkpoint --resume names, or afresh, refusing to mix a new run with an old run's
  // checkpoints.
  Status chooseStart() {
    if (m_lead) MS_TRY(m_lock.acquire(m_runDir));
    if (m_options.resume == "latest") {
      auto latest = latestCheckpoint(m_runDir);
      if (!latest) return latest.status().withContext("--resume");
      m_resumeDir = *latest;
      return Status::ok();
    }
    if (!m_options.resume.empty()) {
      m_resumeDir = m_options.resume;
      return Status::ok();
    }
    if (!m_lead) return Status::ok();
    const fs::path ckpts = fs::path(m_runDir) / "checkpoints";
    std::error_code ec;
    if (fs::exists(ckpts) && !fs::is_empty(ckpts, ec)) {
      if (!m_options.overwrite)
        return Status::error(m_runDir +
                             ": this run folder already holds checkpoints; pass --resume to continue it, "
                             "--overwrite to start over, or --run-dir for another folder");
      fs::remove_all(ckpts, ec);
    }
    return Status::ok();
  }

  // The checkpoint's parameters, optimizer state and step, when resuming.
  Status loadStart() {
    if (m_resumeDir.empty()) return Status::ok();
    auto info =
        loadCheckpointSharded(m_resumeDir, *m_plan, m_model->params(), *m_optimizer, m_model->buffers());
    if (!info) return info.status().withContext("resuming from " + m_resumeDir);
    m_startStep = info->step;
    // A checkpoint past the run's end has nothing to resume (one at the end has nothing left: fine).
    if (m_startStep > m_config.training.steps)
      return Status::error(m_resumeDir + " is at step " + std::to_string(m_startStep) + ", past the run's " +
                           std::to_string(m_config.training.steps) +
                           " steps (training.steps or --steps): nothing to train; ask for more steps");
    return Status::ok();
  }

  void writeRunStart(double zeroUnix) {
    namespace key = metrics::key;
    const ModelSpec& spec = m_model->spec();
    nlohmann::json layers = nlohmann::json::array();
    for (const LayerSpec& l : spec.layers)
      layers.push_back({{key::kName, l.name}, {key::kParams, l.paramCount()}});
    m_metrics.write(metrics::type::kRunStart,
                    {{key::kName, m_config.name},
                     {key::kConfig, toJson(m_config)},
                     {key::kRanks, m_W},
                     {key::kThreadsPerRank, threadsPerRank(m_config)},
                     {key::kDevice, deviceJson(m_backend.info(), m_backend.gemmPrecision())},
                     {key::kParams, spec.paramCount()},
                     {key::kLayers, layers},
                     {key::kStartStep, m_startStep},
                     {key::kSteps, m_config.training.steps},
                     {key::kRunDir, m_runDir},
                     {key::kResumedFrom, m_resumeDir},
                     {key::kStartUnix, zeroUnix},
                     {key::kPredicted, predictedJson(m_config)}});
    if (!m_resumeDir.empty()) logLine("info", "resumed from " + m_resumeDir);
    // One line saying which device trains (and for "auto" on a CPU machine, why not a GPU), once; one saying
    // how tensors travel when that is slower than it could be.
    for (const std::string& line : {m_deviceNote, m_commNote}) {
      if (line.empty()) continue;
      logLine("info", line);
      if (m_lead) std::fprintf(stderr, "%s\n", line.c_str());
    }
  }

  void logLine(const char* level, const std::string& message) {
    m_metrics.write(metrics::type::kLog, {{metrics::key::kLevel, level}, {metrics::key::kMessage, message}});
  }

  bool endWith(const char* status, std::string reason) {
    m_endStatus = status;
    m_endReason = std::move(reason);
    return false;
  }

  // A stop request (mpirun forwards SIGINT to every rank) takes effect on all ranks at the same step; so does
  // --stop-after, which every rank reaches at the same step without agreeing.
  bool stopRequested() {
    int32_t stop = m_options.stopRequested && m_options.stopRequested->load() ? 1 : 0;
    if (m_W > 1 && !m_world->allReduce(&stop, &stop, 1, CommType::I32, ReduceOp::Max)) stop = 1;
    if (stop)
      return !endWith(metrics::status::kInterrupted,
                      "stopped by request after step " + std::to_string(m_step));
    if (m_options.stopAfter > 0 && m_step >= m_options.stopAfter)
      return !endWith(metrics::status::kInterrupted,
                      "stopped after step " + std::to_string(m_step) + " as asked (--stop-after)");
    return false;
  }

  // The stage's action list (forwards, backwards, transfers, gradient buckets), the gradient norm and the
  // optimizer step. Each replica's gradient is its share of the sum over the global batch (the loss scale is
  // 1 / targets of the whole step), so the data-parallel sum is the full gradient.
  bool runStep(LossStats& stats, double& gradNorm, double& lr) {
    m_model->beginSpans();
    m_tracker.resetPeak();
    m_hostTracker.resetPeak();
    m_model->params().zeroGrads();
    injectedFreeze(m_R, m_step + 1);
    Status ran = m_executor->runStep(m_step, *m_data, lossScale(), stats);
    auto squares = ran ? m_executor->gradSquares() : Expected<double>(ran);
    if (!squares) return endWith(metrics::status::kError, squares.status().message());
    gradNorm = std::sqrt(*squares);
    lr = learningRate(m_config, m_step);
    const int optStart = m_model->mark();
    setActivity("step " + std::to_string(m_step + 1) + ": optimizer step");
    m_optimizer->step(static_cast<float>(lr), clipFactor(gradNorm, m_config.training.gradClip));
    if (Status g = m_model->params().finishUpdate(); !g) return endWith(metrics::status::kError, g.message());
    m_model->addSpan('O', -1, 0, -1, optStart);
    return true;
  }

  bool isGpt() const { return isLanguageModel(m_config.model.type); }
  int64_t targetsPerStep() const {
    return isGpt() ? int64_t(m_config.training.batchSize) * m_config.training.seqLen
                   : m_config.training.batchSize;
  }
  float lossScale() const { return 1.0f / static_cast<float>(targetsPerStep()); }

  // The step's lines (every log_every steps and the last: step, spans of every rank, memory of every rank),
  // the progress bar and the plain progress line.
  bool report(int64_t done, const LossStats& stats, double loss, double gradNorm, double lr, double secs) {
    namespace key = metrics::key;
    const int64_t steps = m_config.training.steps;
    const double tokensPerS = double(isGpt() ? targetsPerStep() : 0) / secs;
    const double samplesPerS = double(m_config.training.batchSize) / secs;
    if (done % m_config.training.logEvery == 0 || done == steps) {
      nlohmann::json line = {{key::kStep, done},      {key::kLoss, loss},
                             {key::kLr, lr},          {key::kGradNorm, gradNorm},
                             {key::kStepTimeS, secs}, {key::kSamplesPerS, samplesPerS}};
      if (m_config.model.experts > 0 && m_config.model.auxLossCoef > 0)
        line[key::kAuxLoss] = stats.auxSum / double(std::max(1, m_config.parallel.microbatches) *
                                                    std::max(1, m_config.parallel.dataReplicas()));
      if (isGpt())
        line[key::kTokensPerS] = tokensPerS;
      else
        line[key::kAccuracy] = stats.count ? double(stats.correct) / double(stats.count) : 0.0;
      m_metrics.write(metrics::type::kStep, line);
      m_model->resolveSpans();
      auto reports = gatherReports(m_spans, m_tracker, m_hostTracker, m_model->spec(), m_world);
      if (!reports) return endWith(metrics::status::kError, reports.message());
      m_metrics.write(metrics::type::kSpans, {{key::kStep, done}, {key::kRanks, reports->spans}});
      m_metrics.write(metrics::type::kMemory, {{key::kStep, done}, {key::kRanks, reports->memory}});
      // A stream that cannot be written (a full disk) ends the run now, on every rank, not at the end.
      if (Status w = agree(m_metrics.status(), m_world); !w)
        return endWith(metrics::status::kError, w.message() + whereLastGood());
    }
    if (m_lead)
      m_bar.update(done, loss, isGpt() ? tokensPerS : samplesPerS, isGpt() ? "tok" : "samples",
                   m_ema * double(steps - done), done == steps);
    if (m_lead && !m_options.progress && (done % std::max<int64_t>(1, steps / 10) == 0 || done == steps))
      std::fprintf(stderr, "step %lld/%lld: loss %.4f, %.3f s/step\n", static_cast<long long>(done),
                   static_cast<long long>(steps), loss, secs);
    return true;
  }

  Status evaluateAt(int64_t done) {
    namespace key = metrics::key;
    const auto t0 = Clock::now();
    auto e = m_executor->evaluate(*m_data, m_config.training.evalBatches);
    if (!e) return e.status();
    const double loss = e->stats.count ? e->stats.lossSum / double(e->stats.count) : 0.0;
    const bool hasAccuracy = !isGpt();
    const double accuracy =
        hasAccuracy && e->stats.count ? double(e->stats.correct) / double(e->stats.count) : 0.0;
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    nlohmann::json line = {
        {key::kStep, done}, {key::kLoss, loss}, {key::kSamples, e->samples}, {key::kTimeS, secs}};
    if (hasAccuracy) line[key::kAccuracy] = accuracy;
    m_metrics.write(metrics::type::kEval, line);
    m_bar.breakLine();
    if (!m_lead) return Status::ok();
    if (hasAccuracy)
      std::fprintf(stderr, "step %lld: eval loss %.4f, accuracy %.2f%% (%lld samples)\n",
                   static_cast<long long>(done), loss, 100.0 * accuracy, static_cast<long long>(e->samples));
    else
      std::fprintf(stderr, "step %lld: eval loss %.4f (%lld samples)\n", static_cast<long long>(done), loss,
                   static_cast<long long>(e->samples));
    return Status::ok();
  }

  // Every rank contributes its shards; rank 0 writes full tensors; everyone agrees on the outcome.
  Status saveAt(int64_t done) {
    const std::string dir = checkpointDirName(m_runDir, done);
    setActivity("saving checkpoint " + dir, /*longPhase=*/true);
    injectedDeathWhileSaving(m_R, done);
    MS_TRY(saveCheckpointSharded(dir, *m_plan, *m_groups, m_model->params(), *m_optimizer,
                                 CheckpointInfo{done, m_optimizer->stepsTaken(), m_config.seed},
                                 m_model->buffers()));
    m_lastCheckpoint = dir;
    m_metrics.write(metrics::type::kCheckpoint, {{metrics::key::kStep, done}, {metrics::key::kPath, dir}});
    if (m_lead && m_config.training.keepCheckpoints > 0)
      if (Status p = pruneCheckpoints(m_runDir, m_config.training.keepCheckpoints); !p)
        logLine("warning", p.message());
    return Status::ok();
  }

  // Where the newest whole checkpoint of this run is, for error messages.
  std::string whereLastGood() const {
    return m_lastCheckpoint.empty() ? std::string("; no checkpoint of this run was written")
                                    : "; the newest complete checkpoint is " + m_lastCheckpoint;
  }

  Backend& m_backend;
  const std::string& m_deviceNote;
  const RunConfig& m_config;
  const TrainOptions& m_options;
  Communicator* m_world;
  const int m_W, m_R;
  const bool m_lead;  // rank 0 owns the run folder, the metrics stream and the checkpoints
  const std::string m_runDir;

  RunFolderLock m_lock;
  std::string m_resumeDir;
  int64_t m_startStep = 0;
  std::unique_ptr<DataSource> m_data;
  std::optional<Plan> m_plan;
  std::string m_commNote;
  std::unique_ptr<Communicator> m_tensorWorld;
  std::optional<RankGroups> m_groups;
  MemoryTracker m_tracker;
  MemoryTracker m_hostTracker;  // offloaded model states, in host memory (plan/model_state.h)
  std::optional<Model> m_model;
  std::optional<Optimizer> m_optimizer;
  std::optional<PipelineExecutor> m_executor;

  MetricsWriter m_metrics;  // rank 0 writes; the other ranks' writer has no destination
  std::vector<Span> m_spans;
  ProgressBar m_bar;
  double m_ema = 0;  // smoothed step time for the ETA
  int64_t m_step = 0;
  std::string m_lastCheckpoint;
  std::string m_endStatus = metrics::status::kOk, m_endReason;
};

Status trainOn(Backend& backend, const std::string& deviceNote, const RunConfig& config,
               const TrainOptions& options) {
  TrainingRun run(backend, deviceNote, config, options);
  MS_TRY(run.prepare());
  MS_TRY(run.begin());
  while (run.step()) {
  }
  return run.finish();
}

}  // namespace

}  // namespace ms
