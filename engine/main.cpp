// meshstudio-engine: the command line over the runtime.
//   validate CONFIG...              check configs; path-and-reason errors; exit 2 when any is invalid
//   train CONFIG [options]          train (single rank so far); metrics as JSON Lines
//   eval CONFIG --checkpoint DIR    loss (and accuracy) on the evaluation split
//   dump CONFIG --out DIR [...]     one batch's logits, loss and gradients (for the PyTorch reference tests)
//   plan CONFIG [--json] [--balance] [--write FILE]   predicted per-device memory, bubbles, step time
//   autoplan CONFIG [--top N] [--json] [--write FILE]   the best plans for the model on the mesh
//   launch CONFIG [--hostfile FILE] [--stall-timeout S] [--dry-run] [-- ARGS]   run the plan under mpirun,
//                                   supervised (engine/supervisor.h), or print the mpirun line
//   export CONFIG --out DIR         config, launch.sh, slurm.sbatch (and hostfile) for headless runs;
//                                   --target megatron|torchtitan|deepspeed: the framework's files
//                                   (plan/frameworks.h)
//   import FILE [--from F] ...      a Megatron-LM, torchtitan or DeepSpeed launch as a run config
//   schema [--markdown]             the run config's JSON Schema (or its markdown reference)
//   import-hf HF_CONFIG --base CONFIG [--name N] [--out FILE]   a Hugging Face config.json as the model of
//                                   a run config (plan/hf_import.h)
//   calibrate [--out FILE] [--quick] [--threads N,...] [--links shm,tcp|none] [--hosts A,B]   measure
//                                   this machine (and the link from host A to host B) into a device
//                                   profile (calibrate.h; calibrate-links: a rank of its MPI jobs)
//   trace FILE... [--json] [--profile-out PROFILE] [--link NAME]   a PyTorch or Nsight trace (Chrome
//                                   trace JSON) per rank and step; its collectives into a profile's links
// Exit codes: 0 success, 1 a run failed, 2 bad usage or an invalid config, 130 (kExitInterrupted) train or
// launch stopped on request after saving a checkpoint (a rank that launch stops, by SIGUSR1, exits 0 after
// its checkpoint, so that mpirun has nothing to report; launch then exits 130). This file is the only place
// that turns errors into exit codes.
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "calibrate.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/cpu_ops.h"
#include "plan/frameworks.h"
#include "plan/hf_import.h"
#include "plan/launch_script.h"
#include "plan/run_config.h"
#include "plan_commands.h"
#include "ps_launch.h"
#include "runtime/checkpoint.h"
#include "runtime/data.h"
#include "runtime/device.h"
#include "runtime/file_io.h"
#include "runtime/heartbeat.h"
#include "runtime/layers.h"
#include "runtime/metrics.h"
#include "runtime/model.h"
#include "runtime/mpi_communicator.h"
#include "runtime/ps.h"
#include "runtime/safetensors.h"
#include "runtime/trainer.h"
#include "supervisor.h"
#include "trace_command.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitRunFailed = 1;
constexpr int kExitUsage = 2;

// What a signal handler may touch: the flag train() polls between steps, and which signal set it.
std::atomic<bool> g_stopRequested{false};
std::atomic<int> g_stopSignal{0};

void onSignal(int sig) {
  g_stopSignal.store(sig);
  g_stopRequested.store(true);
}

const char* kUsage =
    "usage: meshstudio-engine <command> [arguments]\n"
    "\n"
    "commands:\n"
    "  validate CONFIG...                 check run configs (exit 2 if any is invalid)\n"
    "  train CONFIG [--metrics FILE|-] [--run-dir DIR] [--resume [CHECKPOINT]] [--overwrite]\n"
    "               [--steps N] [--stop-after STEP] [--quiet] [--skip-memory-check] [--no-checkpoint]\n"
    "                                     train; --resume alone continues from the run folder's newest "
    "checkpoint;\n"
    "                                     --steps N sets training.steps; --stop-after STEP keeps the "
    "config's\n"
    "                                     schedule and stops after STEP with a checkpoint;\n"
    "                                     --skip-memory-check starts even where the plan's memory\n"
    "                                     estimate is above what the device has free; --no-checkpoint\n"
    "                                     saves none, not even the last step's (measuring runs)\n"
    "  eval CONFIG --checkpoint DIR       print the loss (and accuracy) on the evaluation split\n"
    "  dump CONFIG --out DIR [--checkpoint DIR] [--samples N] [--step S] [--emulate-device]\n"
    "                                     write one batch, its logits, loss and gradients (reference "
    "tests),\n"
    "                                     computed on the config's device\n"
    "  plan CONFIG [--json] [--balance] [--write FILE]\n"
    "                                     predicted memory per device, bubbles, step time, tokens/s, MFU;\n"
    "                                     --balance balances the layers over the stages first\n"
    "  autoplan CONFIG [--top N] [--json] [--write FILE]\n"
    "                                     search dp x tp x pp, microbatches, schedule, ZeRO and recompute;\n"
    "                                     --write saves the best plan as a config\n"
    "  launch CONFIG [--hostfile FILE] [--stall-timeout S] [--rsh CMD] [--port P] [--dry-run]\n"
    "         [-- TRAIN-ARGS...]\n"
    "                                     run train under mpirun with one rank per planned device and end\n"
    "                                     the run, with the reason, when a rank dies or stops responding\n"
    "                                     for S seconds (default 10, 0 = never); --dry-run prints the\n"
    "                                     command (and the hostfile it would write)\n"
    "                                     parameter_server mode: starts the servers and workers on the\n"
    "                                     mesh's nodes (other hosts through --rsh CMD, default ssh, or\n"
    "                                     srun; hosts: node names or --hostfile; servers on --port P + s,\n"
    "                                     default 29600) and supervises them (a dead worker is dropped,\n"
    "                                     a dead server restarted from its checkpoint); --kill-worker\n"
    "                                     W:STEP, --kill-server S:STEP kill one mid-run\n"
    "  ps-server CONFIG --index S --bind ENDPOINT [--run-dir DIR] [--metrics FILE|-] [--resume]\n"
    "  ps-worker CONFIG --index W --servers ENDPOINT[,...] [--emulate-device]\n"
    "                                     one parameter server or worker (what launch starts)\n"
    "  export CONFIG --out DIR [--target meshstudio|megatron|torchtitan|deepspeed] [--strict]\n"
    "                                     write DIR/config.json, launch.sh (mpirun), slurm.sbatch and, for\n"
    "                                     several nodes, hostfile: the plan as files for a headless run;\n"
    "                                     --target megatron|...: the framework's launch files instead, what\n"
    "                                     it cannot express listed on stderr (--strict: refused, exit 2)\n"
    "  import FILE [FILE2] [--from megatron|torchtitan|deepspeed] [--base CONFIG] [--device TYPE]\n"
    "         [--nodes N] [--gpus-per-node G] [--model ARGS|HF_CONFIG] [--name NAME] [--out FILE]\n"
    "                                     a framework's launch (Megatron-LM script or arguments, torchtitan\n"
    "                                     TOML [+ its launcher script], DeepSpeed JSON + --model) as a run\n"
    "                                     config to FILE (default stdout); unknown flags, flags the plan\n"
    "                                     does not carry and what was assumed to stderr\n"
    "  schema [--markdown]                print the run config's JSON Schema (or markdown reference)\n"
    "  import-hf HF_CONFIG --base CONFIG [--name NAME] [--out FILE]\n"
    "                                     the model of a Hugging Face config.json (gpt2, llama, mistral,\n"
    "                                     qwen2) in CONFIG's place: its mesh, data, parallel and training\n"
    "                                     settings kept; the run config to FILE (default stdout), what\n"
    "                                     the import approximates to stderr\n"
    "  calibrate [--out FILE] [--quick] [--threads N,N,...] [--links shm,tcp|none] [--hosts A,B]\n"
    "                                     measure this machine (GEMM, attention, memory bandwidth, the\n"
    "                                     optimizer step at each thread count; MPI bandwidth and latency\n"
    "                                     over shared memory and TCP) into a device profile, JSON to FILE\n"
    "                                     (default stdout); --quick: small grids (seconds); default threads\n"
    "                                     1, the powers of 2 below the cores, the cores; default links\n"
    "                                     shm,tcp; --hosts A,B: also the link \"net\" between hosts A and\n"
    "                                     B, one rank on each over TCP (docs/calibration.md)\n"
    "  trace FILE... [--json] [--profile-out PROFILE] [--link NAME]\n"
    "                                     a PyTorch profiler (Kineto) or Nsight trace as Chrome trace JSON,\n"
    "                                     one file per rank or merged: time per rank and step in GEMMs,\n"
    "                                     attention, collectives (algbw, busbw), optimizer, other, idle;\n"
    "                                     --profile-out merges its collectives into PROFILE's link NAME\n"
    "                                     (default \"trace\"; docs/calibration.md)\n";

int usageError(const std::string& message) {
  std::fprintf(stderr, "meshstudio-engine: %s\n\n%s", message.c_str(), kUsage);
  return kExitUsage;
}

// An integer option's value in [min, max]: false for junk, an empty value or one out of the range (beyond
// long long's too: strtoll's ERANGE), so a value never wraps. usageError names the option and the range.
bool integerArg(const std::string& text, long long min, long long max, long long& out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno == ERANGE || !end || *end || v < min || v > max) return false;
  out = v;
  return true;
}
int rangeError(const char* option, long long min, long long max) {
  return usageError(std::string(option) + " needs an integer from " + std::to_string(min) + " to " +
                    std::to_string(max));
}
constexpr long long kIntMax = std::numeric_limits<int>::max();

// Simple argument reader: positional arguments and --flag [value] options.
struct Args {
  std::vector<std::string> positional;
  std::vector<std::pair<std::string, std::string>> options;
  std::string error;
  bool has(const std::string& name) const {
    for (const auto& [k, v] : options)
      if (k == name) return true;
    return false;
  }
  std::string get(const std::string& name) const {
    for (const auto& [k, v] : options)
      if (k == name) return v;
    return {};
  }
};

// valueOptions take a value; optionalValue options take one when the next word is not an option.
Args parseArgs(int argc, char** argv, int first, const std::vector<std::string>& valueOptions,
               const std::vector<std::string>& flagOptions,
               const std::vector<std::string>& optionalValue = {}) {
  Args a;
  auto in = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  for (int i = first; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg == "-") {
      a.positional.push_back(arg);
      continue;
    }
    if (in(valueOptions, arg)) {
      if (i + 1 >= argc) {
        a.error = arg + " needs a value";
        return a;
      }
      a.options.emplace_back(arg, argv[++i]);
    } else if (in(optionalValue, arg)) {
      // The value is optional: the next word is taken only once the config (the first positional) is known,
      // so "train --resume CONFIG" still reads CONFIG as the config.
      const bool next = i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0;
      a.options.emplace_back(arg, next && !a.positional.empty() ? argv[++i] : "");
    } else if (in(flagOptions, arg)) {
      a.options.emplace_back(arg, "");
    } else {
      a.error = "unknown option " + arg;
      return a;
    }
  }
  return a;
}

// The environment's settings of a loaded config (runtime/layers.h headChunkRowsOverride, checked before any
// command runs): set in the config itself, so what the plan predicts and what the engine runs agree.
void applyEnvironment(ms::RunConfig& config) {
  if (ms::Expected<int64_t> rows = ms::headChunkRowsOverride(); rows && *rows > 0)
    config.training.headChunkRows = static_cast<int>(std::min<int64_t>(*rows, 1 << 30));
}

// Loads a config; on failure prints every error and returns false.
bool loadConfig(const std::string& path, ms::RunConfig& out) {
  auto config = ms::loadRunConfig(path);
  if (!config) {
    std::fprintf(stderr, "%s\n", config.message().c_str());
    return false;
  }
  out = std::move(*config);
  applyEnvironment(out);
  return true;
}

int cmdValidate(int argc, char** argv) {
  Args a = parseArgs(argc, argv, 2, {}, {});
  if (!a.error.empty()) return usageError(a.error);
  if (a.positional.empty()) return usageError("validate needs at least one CONFIG");
  bool allOk = true;
  for (const std::string& path : a.positional) {
    ms::RunConfig config;
    if (loadConfig(path, config))
      std::printf("%s: ok\n", path.c_str());
    else
      allOk = false;
  }
  return allOk ? kExitOk : kExitUsage;
}

// A run_end line for a train that failed before its metrics stream began (a bad config or option, a device
// or MPI that would not start, a locked run folder), so that `--metrics` sees every failure: written by the
// first rank only (Open MPI's or PMI's rank variable, MPI may not be up), to stdout for "-" or appended to
// the file, never to the run folder's metrics.jsonl (which may be another run's).
void startupRunEnd(const std::string& sink, const std::string& reason) {
  const char* rankVar = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!rankVar) rankVar = std::getenv("PMI_RANK");
  if (sink.empty() || (rankVar && std::string(rankVar) != "0")) return;
  ms::MetricsWriter writer;
  if (!writer.open(sink, "", /*append=*/true)) return;
  writer.write(ms::metrics::type::kRunEnd, {{ms::metrics::key::kStatus, ms::metrics::status::kError},
                                            {ms::metrics::key::kReason, reason},
                                            {ms::metrics::key::kStep, 0}});
}

int cmdTrain(int argc, char** argv) {
  Args a = parseArgs(argc, argv, 2, {"--metrics", "--run-dir", "--steps", "--stop-after"},
                     {"--quiet", "--overwrite", "--emulate-device", "--skip-memory-check", "--no-checkpoint"},
                     {"--resume"});
  if (!a.error.empty()) return usageError(a.error);
  const std::string sink = a.get("--metrics");
  if (a.positional.size() != 1) {
    startupRunEnd(sink, "train needs exactly one CONFIG");
    return usageError("train needs exactly one CONFIG");
  }
  ms::RunConfig config;
  if (auto loaded = ms::loadRunConfig(a.positional[0]); !loaded) {
    std::fprintf(stderr, "%s\n", loaded.message().c_str());
    startupRunEnd(sink, loaded.message());
    return kExitUsage;
  } else {
    config = std::move(*loaded);
    applyEnvironment(config);
  }
  if (a.has("--steps")) {
    long long steps = 0;
    if (!integerArg(a.get("--steps"), 0, kIntMax, steps)) {
      startupRunEnd(sink, "--steps needs an integer from 0 to " + std::to_string(kIntMax));
      return rangeError("--steps", 0, kIntMax);
    }
    config.training.steps = static_cast<int>(steps);
  }
  ms::TrainOptions options;
  if (a.has("--stop-after")) {
    long long stopAfter = 0;
    if (!integerArg(a.get("--stop-after"), 1, kIntMax, stopAfter)) {
      startupRunEnd(sink, "--stop-after (a step) needs an integer from 1 to " + std::to_string(kIntMax));
      return rangeError("--stop-after (a step)", 1, kIntMax);
    }
    options.stopAfter = stopAfter;
  }
  bool streamEnded = false;
  options.streamEnded = &streamEnded;
  options.metricsSink = a.get("--metrics");
  options.runDir = a.get("--run-dir");
  if (a.has("--resume")) options.resume = a.get("--resume").empty() ? "latest" : a.get("--resume");
  options.overwrite = a.has("--overwrite");
  options.emulateDevice = a.has("--emulate-device");
  options.skipMemoryCheck = a.has("--skip-memory-check");
  options.noCheckpoint = a.has("--no-checkpoint");
  options.progress = !a.has("--quiet") && isatty(STDERR_FILENO);
  options.stopRequested = &g_stopRequested;
  std::signal(SIGINT, onSignal);
  std::signal(SIGTERM, onSignal);
  std::signal(SIGUSR1, onSignal);  // launch's graceful stop, forwarded by mpirun to every rank
  // Under `launch`, the heartbeat tells the supervisor that this rank lives and what it does. Declared before
  // the MPI context so that it outlives MPI_Finalize (a rank hung there is still watched).
  std::unique_ptr<ms::Heartbeat> heartbeat;
  // Started by mpirun (Open MPI sets OMPI_COMM_WORLD_SIZE; other launchers PMI_SIZE): every rank joins MPI
  // and trains its share; the context finalises MPI when this function returns.
  std::unique_ptr<ms::MpiContext> mpi;
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE")) {
    auto context = ms::MpiContext::create(&argc, &argv);
    if (!context) {
      std::fprintf(stderr, "meshstudio-engine train: %s\n", context.message().c_str());
      startupRunEnd(sink, context.message());
      return kExitRunFailed;
    }
    mpi = std::move(*context);
    options.world = &mpi->world();
  }
  const int rank = options.world ? options.world->rank() : 0;
  ms::setActivity("starting", /*longPhase=*/true);
  heartbeat = ms::Heartbeat::startFromEnvironment(rank);
  const std::string who = options.world ? "rank " + std::to_string(rank) + ": " : "";
  if (rank != 0) options.progress = false;
  if (ms::Status s = ms::checkRunnable(config, options.world ? options.world->size() : 1); !s) {
    if (rank == 0) std::fprintf(stderr, "%s: %s\n", a.positional[0].c_str(), s.message().c_str());
    startupRunEnd(sink, a.positional[0] + ": " + s.message());
    return kExitUsage;
  }
  ms::setActivity("training", /*longPhase=*/true);  // setup: plan, data, checkpoint, communicators
  ms::Status s = ms::train(config, options);
  ms::setActivity(s ? "finishing" : "finishing after an error", /*longPhase=*/true);
  if (!s) {
    std::fprintf(stderr, "meshstudio-engine train: %s%s\n", who.c_str(), s.message().c_str());
    if (rank == 0 && !streamEnded) startupRunEnd(sink, s.message());
    return kExitRunFailed;
  }
  // Stopped by launch (SIGUSR1, which mpirun forwards to every rank): the checkpoint is saved and run_end
  // says "interrupted", so the rank ends with 0 and mpirun has no failure to report; launch itself exits with
  // kExitInterrupted. Stopped by a person's Ctrl-C or SIGTERM: kExitInterrupted here.
  if (!g_stopRequested.load()) return kExitOk;
  return g_stopSignal.load() == SIGUSR1 ? kExitOk : ms::kExitInterrupted;
}

int cmdEval(int argc, char** argv) {
  Args a = parseArgs(argc, argv, 2, {"--checkpoint", "--batches"}, {"--json"});
  if (!a.error.empty()) return usageError(a.error);
  if (a.positional.size() != 1) return usageError("eval needs exactly one CONFIG");
  if (!a.has("--checkpoint")) return usageError("eval needs --checkpoint DIR");
  long long batches = 0;
  if (a.has("--batches") && !integerArg(a.get("--batches"), 0, kIntMax, batches))
    return rangeError("--batches", 0, kIntMax);
  ms::RunConfig config;
  if (!loadConfig(a.positional[0], config)) return kExitUsage;
  ms::cpu::setThreads(ms::threadsPerRank(config));
  auto data = ms::openDataSource(config);
  if (!data) {
    std::fprintf(stderr, "meshstudio-engine eval: %s\n", data.message().c_str());
    return kExitRunFailed;
  }
  // On the config's device, like train (one process).
  auto device = ms::openDevice(config.device, 0, false);
  if (!device) {
    std::fprintf(stderr, "meshstudio-engine eval: %s\n", device.message().c_str());
    return kExitRunFailed;
  }
  if (!device->note.empty()) std::fprintf(stderr, "%s\n", device->note.c_str());
  ms::EvalResult r;
  try {
    ms::MemoryTracker tracker(device->backend.get());
    ms::Model model(config, &tracker);
    if (ms::Status s = ms::loadWeights(a.get("--checkpoint"), model.params(), model.buffers()); !s) {
      std::fprintf(stderr, "meshstudio-engine eval: %s\n", s.message().c_str());
      return kExitRunFailed;
    }
    r = ms::evaluate(model, **data, config, static_cast<int>(batches));
  } catch (const ms::DeviceFailure& e) {
    std::fprintf(stderr, "meshstudio-engine eval: device: %s\n", e.what());
    return kExitRunFailed;
  }
  if (a.has("--json")) {
    nlohmann::json j = {{"loss", r.loss}, {"samples", r.samples}};
    if (r.hasAccuracy) j["accuracy"] = r.accuracy;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("eval loss %.6f over %lld samples\n", r.loss, static_cast<long long>(r.samples));
    if (r.hasAccuracy) std::printf("eval accuracy %.4f (%.2f%%)\n", r.accuracy, 100.0 * r.accuracy);
  }
  return kExitOk;
}

// One batch through the model, written out for an independent reference (tests/reference/reference.py).
int cmdDump(int argc, char** argv) {
  Args a = parseArgs(argc, argv, 2, {"--out", "--checkpoint", "--samples", "--step"}, {"--emulate-device"});
  if (!a.error.empty()) return usageError(a.error);
  if (a.positional.size() != 1 || !a.has("--out")) return usageError("dump needs CONFIG and --out DIR");
  long long samples = 4, step = 0;
  if (a.has("--samples") && !integerArg(a.get("--samples"), 1, kIntMax, samples))
    return rangeError("--samples", 1, kIntMax);
  if (a.has("--step") && !integerArg(a.get("--step"), 0, kIntMax, step))
    return rangeError("--step", 0, kIntMax);
  ms::RunConfig config;
  if (!loadConfig(a.positional[0], config)) return kExitUsage;
  ms::cpu::setThreads(ms::threadsPerRank(config));
  auto fail = [](const ms::Status& s) {
    std::fprintf(stderr, "meshstudio-engine dump: %s\n", s.message().c_str());
    return kExitRunFailed;
  };
  auto data = ms::openDataSource(config);
  if (!data) return fail(data.status());
  // On the config's device and GEMM precision, like train (one process), so a GPU's logits and gradients can
  // be compared with the CPU's and PyTorch's.
  auto device = ms::openDevice(config.device, 0, a.has("--emulate-device"));
  if (!device) return fail(device.status());
  if (!device->note.empty()) std::fprintf(stderr, "%s\n", device->note.c_str());
  ms::Backend& be = *device->backend;
  be.setGemmPrecision(config.parallel.precision == ms::Precision::Bf16 ? ms::GemmPrecision::Bf16
                                                                       : ms::GemmPrecision::Fp32);
  try {
    ms::MemoryTracker tracker(&be);
    ms::Model model(config, &tracker);
    if (a.has("--checkpoint")) {
      if (ms::Status s = ms::loadWeights(a.get("--checkpoint"), model.params(), model.buffers()); !s)
        return fail(s);
    }
    // The first `samples` samples of training batch `step` (0-based), as train() would draw them.
    ms::Batch batch;
    (*data)->trainBatch(step, config.training.batchSize, 0,
                        static_cast<int>(std::min<long long>(samples, config.training.batchSize)), batch);
    const std::string out = a.get("--out");
    if (ms::Status s = ms::makeDirs(out); !s) return fail(s);
    // Logits from an evaluation forward (training overwrites them with their gradient).
    model.forward(batch, /*keepLogits=*/true);
    const bool isGpt = ms::isLanguageModel(config.model.type);
    const int64_t rows = isGpt ? int64_t(batch.B) * batch.T : batch.B;
    const int64_t V = isGpt ? config.model.vocab : config.model.classes;
    std::vector<float> logits(size_t(rows * V));
    be.download(logits.data(), model.head().logits(), logits.size() * sizeof(float));
    model.params().zeroGrads();
    const ms::LossStats stats = model.forwardBackward(batch, 1.0f / static_cast<float>(rows));
    const float loss = static_cast<float>(stats.lossSum / double(stats.count));

    std::vector<ms::NamedTensor> batchTensors;
    if (isGpt) {
      batchTensors.push_back({"tokens", {batch.B, batch.T}, ms::DType::I32, batch.tokens.data()});
      batchTensors.push_back({"targets", {batch.B, batch.T}, ms::DType::I32, batch.targets.data()});
    } else {
      const int64_t side = config.model.imageSize;
      batchTensors.push_back({"images", {batch.B, side * side}, ms::DType::F32, batch.images.data()});
      batchTensors.push_back({"targets", {batch.B}, ms::DType::I32, batch.targets.data()});
    }
    std::vector<ms::NamedTensor> outputs;
    outputs.push_back({"logits",
                       isGpt ? std::vector<int64_t>{batch.B, batch.T, V} : std::vector<int64_t>{batch.B, V},
                       ms::DType::F32, logits.data()});
    outputs.push_back({"loss", {1}, ms::DType::F32, &loss});
    const auto& params = model.params().params();
    // The gradients as kept (bf16 ones, "grad_precision": "bf16", widened exactly).
    std::vector<float> grads(model.params().size());
    if (model.params().gradType() == ms::CommType::BF16) {
      std::vector<uint16_t> bits(grads.size());
      be.download(bits.data(), model.params().gradBits(), bits.size() * sizeof(uint16_t));
      for (size_t i = 0; i < bits.size(); ++i) grads[i] = ms::bf16ToFloat(bits[i]);
    } else {
      be.download(grads.data(), model.params().grads(), grads.size() * sizeof(float));
    }
    for (const auto& p : params)
      outputs.push_back({"grad." + p.spec.name, p.spec.shape, ms::DType::F32, grads.data() + p.offset});
    // The buffers after the training forward (the cnn's BatchNorm running statistics, updated by it).
    const std::vector<ms::LayerBuffer> buffers = model.buffers();
    std::vector<std::vector<float>> bufferValues;
    for (const ms::LayerBuffer& b : buffers) {
      bufferValues.emplace_back(size_t(b.spec->numel()));
      be.download(bufferValues.back().data(), b.data, bufferValues.back().size() * sizeof(float));
    }
    for (size_t i = 0; i < buffers.size(); ++i)
      outputs.push_back({"buffer." + buffers[i].spec->name, buffers[i].spec->shape, ms::DType::F32,
                         bufferValues[i].data()});
    ms::Status s = ms::saveCheckpoint(out + "/checkpoint", config, model.params(), nullptr,
                                      {0, 0, config.seed}, buffers);
    if (s) s = ms::writeSafetensors(out + "/batch.safetensors", batchTensors);
    if (s) s = ms::writeSafetensors(out + "/outputs.safetensors", outputs);
    if (!s) return fail(s);
    std::printf("loss %.6f over %lld targets; wrote %s\n", loss, static_cast<long long>(stats.count),
                out.c_str());
  } catch (const ms::DeviceFailure& e) {
    return fail(ms::Status::error(std::string("device: ") + e.what()));
  }
  return kExitOk;
}

int cmdPlan(int argc, char** argv) {
  Args a = parseArgs(argc, argv, 2, {"--write"}, {"--json", "--balance"});
  if (!a.error.empty()) return usageError(a.error);
  if (a.positional.size() != 1) return usageError("plan needs exactly one CONFIG");
  ms::RunConfig config;
  if (!loadConfig(a.positional[0], config)) return kExitUsage;
  return ms::runPlanCommand(config, a.has("--json"), a.has("--balance"), a.get("--write"));
}

int cmdAutoplan(int argc, char** argv) {
  Args a = parseArgs(argc, argv, 2, {"--top", "--write"}, {"--json"});
  if (!a.error.empty()) return usageError(a.error);
  if (a.positional.size() != 1) return usageError("autoplan needs exactly one CONFIG");
  int top = 5;
  if (a.has("--top")) {
    long long v = 0;
    if (!integerArg(a.get("--top"), 1, 100, v)) return rangeError("--top", 1, 100);
    top = static_cast<int>(v);
  }
  ms::RunConfig config;
  if (!loadConfig(a.positional[0], config)) return kExitUsage;
  return ms::runAutoplanCommand(config, top, a.has("--json"), a.get("--write"));
}

// Quotes a word for a POSIX shell when it needs it.
using ms::shellQuote;

// launch CONFIG [--hostfile FILE] [--stall-timeout S] [--dry-run] [-- TRAIN-ARGS...]: the mpirun line that
// runs the config's plan, one rank per device: -np dp*tp*pp, a hostfile written from the mesh when it has
// several nodes (unless given), --oversubscribe when one node runs more ranks than it has cores,
// --allow-run-as-root for root, --bind-to none (threads of a rank spread over cores). Without --dry-run the
// supervisor (supervisor.h) runs it and ends the run, with the reason, when a rank dies or stops responding.
// The engine binary's own path (for the processes it starts).
std::string selfExe(const char* argv0) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  return n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(argv0);
}

// "W:STEP" (a process index and a step from 1).
bool indexAndStep(const std::string& text, int& index, int& step) {
  const size_t colon = text.find(':');
  long long i = 0, s = 0;
  if (colon == std::string::npos || !integerArg(text.substr(0, colon), 0, kIntMax, i) ||
      !integerArg(text.substr(colon + 1), 1, kIntMax, s))
    return false;
  index = static_cast<int>(i);
  step = static_cast<int>(s);
  return true;
}

// launch for "mode": "parameter_server" (engine/ps_launch.h). The arguments after -- are the ones train
// takes that make sense for the whole job: --metrics, --run-dir, --resume, --overwrite, --emulate-device.
int launchParameterServer(const ms::RunConfig& config, const Args& a, int split, int argc, char** argv,
                          const std::string& metricsArg, const std::string& runDirArg) {
  ms::PsLaunchOptions o;
  o.exe = selfExe(argv[0]);
  o.configPath = a.positional[0];
  o.runDir = ms::runDirectory(config, runDirArg);
  o.metricsSink = metricsArg;
  o.dryRun = a.has("--dry-run");
  auto fail = [&](const std::string& message) {
    startupRunEnd(metricsArg, message);
    return usageError(message);
  };
  if (a.has("--hostfile")) {
    auto hosts = ms::readHostfile(a.get("--hostfile"), config.mesh.nodes.size());
    if (!hosts) return fail("--hostfile: " + hosts.status().message());
    o.hosts = std::move(*hosts);
  }
  if (a.has("--rsh")) {
    o.rsh = a.get("--rsh");
    if (o.rsh.find_first_not_of(" \t") == std::string::npos)
      return fail("--rsh needs a command (ssh, \"ssh -p 2222\", srun, ...)");
  }
  if (a.has("--port")) {
    long long port = 0;
    if (!integerArg(a.get("--port"), 1024, 65535 - config.parallel.servers + 1, port))
      return fail("--port needs a port from 1024 to " + std::to_string(65536 - config.parallel.servers) +
                  " (server s listens on PORT + s)");
    o.basePort = static_cast<int>(port);
  }
  if (a.has("--kill-worker") && !indexAndStep(a.get("--kill-worker"), o.killWorker, o.killWorkerStep))
    return fail("--kill-worker needs WORKER:STEP (a worker index and its step, from 1)");
  if (a.has("--kill-server") && !indexAndStep(a.get("--kill-server"), o.killServer, o.killServerStep))
    return fail("--kill-server needs SERVER:STEP (a server index and a global step, from 1)");
  for (int i = split + 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--metrics" || arg == "--run-dir") {
      ++i;
      continue;
    }
    if (arg == "--resume")
      o.resume = true;
    else if (arg == "--overwrite")
      o.overwrite = true;
    else if (arg == "--emulate-device")
      o.emulateDevice = true;
    else if (arg != "--quiet")
      return fail("launch -- " + arg +
                  ": parameter_server mode passes on --metrics, --run-dir, --resume, --overwrite and "
                  "--emulate-device only");
  }
  bool interrupted = false;
  if (ms::Status s = ms::launchParameterServer(config, o, &interrupted); !s) {
    std::fprintf(stderr, "meshstudio-engine launch: %s\n", s.message().c_str());
    if (s.message().find("run folder") != std::string::npos || s.message().find("--kill") == 0) {
      startupRunEnd(metricsArg, s.message());
      return kExitUsage;
    }
    return kExitRunFailed;
  }
  if (interrupted) {
    std::fprintf(stderr,
                 "meshstudio-engine launch: stopped on request; the servers' checkpoints are saved\n");
    return ms::kExitInterrupted;
  }
  return kExitOk;
}

// What ps-server and ps-worker share: the config (in parameter-server mode), the process's --index among
// `count(config)` and --die-at-step. Returns -1 when all is well, else the exit code.
int psProcessArgs(const Args& a, int (*count)(const ms::RunConfig&), ms::RunConfig& config, long long& index,
                  long long& die) {
  if (!loadConfig(a.positional[0], config)) return kExitUsage;
  if (config.parallel.mode != ms::ParallelMode::ParameterServer)
    return usageError(a.positional[0] + ": /parallel/mode is not \"parameter_server\"");
  if (!integerArg(a.get("--index"), 0, count(config) - 1, index))
    return rangeError("--index", 0, count(config) - 1);
  if (a.has("--die-at-step") && !integerArg(a.get("--die-at-step"), 1, kIntMax, die))
    return rangeError("--die-at-step", 1, kIntMax);
  std::signal(SIGINT, onSignal);
  std::signal(SIGTERM, onSignal);
  return -1;
}

// A parameter-server process's end: its error printed, 130 when it was asked to stop.
int psProcessEnd(const ms::Status& s, const char* command, int index) {
  if (s) return kExitOk;
  std::fprintf(stderr, "meshstudio-engine %s %d: %s\n", command, index, s.message().c_str());
  return g_stopRequested.load() ? ms::kExitInterrupted : kExitRunFailed;
}

// ps-server CONFIG --index S --bind ENDPOINT [--run-dir DIR] [--metrics SINK] [--resume] [--die-at-step N]
int cmdPsServer(int argc, char** argv) {
  Args a = parseArgs(argc, argv, 2, {"--index", "--bind", "--run-dir", "--metrics", "--die-at-step"},
                     {"--resume"});
  if (!a.error.empty()) return usageError(a.error);
  if (a.positional.size() != 1 || !a.has("--index") || !a.has("--bind"))
    return usageError("ps-server needs CONFIG, --index S and --bind ENDPOINT");
  ms::RunConfig config;
  long long index = 0, die = 0;
  const auto servers = [](const ms::RunConfig& c) { return c.parallel.servers; };
  if (int code = psProcessArgs(a, servers, config, index, die); code >= 0) return code;
  ms::PsServerOptions o;
  o.index = static_cast<int>(index);
  o.bind = a.get("--bind");
  o.runDir = a.get("--run-dir");
  o.metricsSink = a.get("--metrics");
  o.resume = a.has("--resume");
  o.dieAtStep = die;
  o.stopRequested = &g_stopRequested;
  return psProcessEnd(ms::runPsServer(config, o), "ps-server", o.index);
}

// ps-worker CONFIG --index W --servers ENDPOINT[,ENDPOINT...] [--emulate-device] [--die-at-step N]
int cmdPsWorker(int argc, char** argv) {
  Args a = parseArgs(argc, argv, 2, {"--index", "--servers", "--die-at-step"}, {"--emulate-device"});
  if (!a.error.empty()) return usageError(a.error);
  if (a.positional.size() != 1 || !a.has("--index") || !a.has("--servers"))
    return usageError("ps-worker needs CONFIG, --index W and --servers ENDPOINT[,ENDPOINT...]");
  ms::RunConfig config;
  long long index = 0, die = 0;
  const auto workers = [](const ms::RunConfig& c) { return c.parallel.workers; };
  if (int code = psProcessArgs(a, workers, config, index, die); code >= 0) return code;
  ms::PsWorkerOptions o;
  o.index = static_cast<int>(index);
  const std::string list = a.get("--servers");
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    if (comma > at) o.servers.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  o.emulateDevice = a.has("--emulate-device");
  o.dieAtStep = die;
  o.stopRequested = &g_stopRequested;
  return psProcessEnd(ms::runPsWorker(config, o), "ps-worker", o.index);
}

int cmdLaunch(int argc, char** argv) {
  int split = argc;
  for (int i = 2; i < argc; ++i)
    if (std::string(argv[i]) == "--") {
      split = i;
      break;
    }
  // The train arguments that say where the run writes: its folder (heartbeats, metrics.jsonl) and --metrics,
  // which gets a run_end for launch's own failures too.
  std::string runDirArg, metricsArg;
  for (int i = split + 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--run-dir") runDirArg = argv[i + 1];
    if (std::string(argv[i]) == "--metrics") metricsArg = argv[i + 1];
  }
  auto failUsage = [&](const std::string& message) {
    startupRunEnd(metricsArg, message);
    return usageError(message);
  };
  Args a = parseArgs(split, argv, 2,
                     {"--hostfile", "--stall-timeout", "--kill-worker", "--kill-server", "--rsh", "--port"},
                     {"--dry-run"});
  if (!a.error.empty()) return failUsage(a.error);
  if (a.positional.size() != 1) return failUsage("launch needs exactly one CONFIG");
  double stallTimeout = 10;
  if (a.has("--stall-timeout")) {
    const std::string text = a.get("--stall-timeout");  // kept: `end` points into it
    char* end = nullptr;
    stallTimeout = std::strtod(text.c_str(), &end);
    if (text.empty() || !end || *end || !(stallTimeout >= 0 && stallTimeout <= 86400))
      return failUsage("--stall-timeout needs a number of seconds from 0 (the watch off) to 86400");
  }
  ms::RunConfig config;
  if (auto loaded = ms::loadRunConfig(a.positional[0]); !loaded) {
    std::fprintf(stderr, "%s\n", loaded.message().c_str());
    startupRunEnd(metricsArg, loaded.message());
    return kExitUsage;
  } else {
    config = std::move(*loaded);
  }
  if (config.parallel.mode == ms::ParallelMode::ParameterServer)
    return launchParameterServer(config, a, split, argc, argv, metricsArg, runDirArg);
  if (a.has("--kill-worker") || a.has("--kill-server"))
    return failUsage("--kill-worker and --kill-server are for parameter_server mode");
  if (a.has("--rsh") || a.has("--port"))
    return failUsage(
        "--rsh and --port are for parameter_server mode (mpirun starts a collective job's ranks)");
  const int ranks = static_cast<int>(config.parallel.ranks());
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  const std::string exe = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(argv[0]);
  std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(ranks)};
  std::string hostfile = a.get("--hostfile");
  std::string hostfileText;
  if (hostfile.empty() && config.mesh.nodes.size() > 1) {
    for (const ms::NodeConfig& node : config.mesh.nodes)
      hostfileText += node.name + " slots=" + std::to_string(node.count) + "\n";
    hostfile = ms::runDirectory(config, "") + "/hostfile";
  }
  if (!hostfile.empty()) {
    cmd.push_back("--hostfile");
    cmd.push_back(hostfile);
  } else if (ranks > static_cast<int>(std::thread::hardware_concurrency())) {
    cmd.push_back("--oversubscribe");
  }
  if (geteuid() == 0) cmd.push_back("--allow-run-as-root");
  // A rank runs several threads (training.threads, or cores / local ranks); Open MPI binds each rank of a job
  // of at most 2 ranks to one core, which would run those threads on one core (half speed measured with 2).
  cmd.insert(cmd.end(), {"--bind-to", "none"});
  const std::string runDir = ms::runDirectory(config, runDirArg);
  if (!a.has("--dry-run")) {
    // Remote ranks get the heartbeat folder too (it must then be on a shared file system).
    cmd.push_back("-x");
    cmd.push_back(ms::kHeartbeatDirEnv);
  }
  cmd.insert(cmd.end(), {exe, "train", a.positional[0]});
  for (int i = split + 1; i < argc; ++i) cmd.push_back(argv[i]);
  std::string line;
  for (const std::string& w : cmd) line += (line.empty() ? "" : " ") + shellQuote(w);
  if (a.has("--dry-run")) {
    if (!hostfileText.empty()) std::printf("# %s:\n%s", hostfile.c_str(), hostfileText.c_str());
    std::printf("%s\n", line.c_str());
    return kExitOk;
  }
  if (!hostfileText.empty()) {
    ms::Status s = ms::makeDirs(ms::runDirectory(config, ""));
    if (s) s = ms::writeFileAtomic(hostfile, hostfileText);
    if (!s) {
      std::fprintf(stderr, "meshstudio-engine launch: %s\n", s.message().c_str());
      startupRunEnd(metricsArg, s.message());
      return kExitRunFailed;
    }
  }
  std::fprintf(stderr, "%s\n", line.c_str());
  ms::SupervisorOptions supervision;
  supervision.command = cmd;
  supervision.ranks = ranks;
  supervision.runDir = runDir;
  supervision.heartbeatDir = runDir + "/ranks";
  supervision.metricsFiles = {runDir + "/metrics.jsonl"};
  if (!metricsArg.empty() && metricsArg != "-") supervision.metricsFiles.push_back(metricsArg);
  supervision.metricsToStdout = metricsArg == "-";
  supervision.stallTimeoutS = stallTimeout;
  bool interrupted = false;
  if (ms::Status s = ms::superviseRun(supervision, &interrupted); !s) {
    std::fprintf(stderr, "meshstudio-engine launch: %s\n", s.message().c_str());
    return kExitRunFailed;
  }
  if (interrupted) {
    std::fprintf(stderr, "meshstudio-engine launch: stopped on request; the checkpoint is saved\n");
    return ms::kExitInterrupted;
  }
  return kExitOk;
}

int cmdCalibrate(int argc, char** argv) {
  Args a = parseArgs(argc, argv, 2, {"--out", "--threads", "--links", "--hosts"}, {"--quick"});
  if (!a.error.empty()) return usageError(a.error);
  if (!a.positional.empty()) return usageError("calibrate takes no arguments besides its options");
  ms::CalibrateOptions o;
  o.out = a.get("--out");
  if (a.has("--out") && o.out.empty()) return usageError("--out needs a FILE");
  o.quick = a.has("--quick");
  if (a.has("--threads")) {
    auto threads = ms::parseThreadList(a.get("--threads"));
    if (!threads) return usageError(threads.message());
    o.threads = *threads;
  }
  auto links = ms::parseLinkList(a.has("--links") ? a.get("--links") : "shm,tcp");
  if (!links) return usageError(links.message());
  o.links = *links;
  if (a.has("--hosts")) {
    auto hosts = ms::parseHostList(a.get("--hosts"));
    if (!hosts) return usageError(hosts.message());
    o.hosts = *hosts;
  }
  o.command = "meshstudio-engine";
  for (int i = 1; i < argc; ++i) o.command += " " + shellQuote(argv[i]);
  if (ms::Status s = ms::runCalibrate(o); !s) {
    std::fprintf(stderr, "meshstudio-engine calibrate: %s\n", s.message().c_str());
    return kExitRunFailed;
  }
  return kExitOk;
}

// One rank of calibrate's link jobs (not in the usage: calibrate starts it under mpirun).
int cmdCalibrateLinks(int argc, char** argv) {
  Args a =
      parseArgs(argc, argv, 2, {"--transport", "--out", "--progress-base", "--progress-total"}, {"--quick"});
  if (!a.error.empty()) return usageError(a.error);
  ms::LinkRankOptions o;
  o.transport = a.get("--transport");
  o.out = a.get("--out");
  o.quick = a.has("--quick");
  if ((o.transport != ms::kLinkShm && o.transport != ms::kLinkTcp && o.transport != ms::kLinkNet) ||
      o.out.empty() || !a.positional.empty())
    return usageError("calibrate-links needs --transport shm|tcp|net and --out FILE");
  long long base = 0, total = 0;
  if (a.has("--progress-base") && !integerArg(a.get("--progress-base"), 0, kIntMax, base))
    return rangeError("--progress-base", 0, kIntMax);
  if (a.has("--progress-total") && !integerArg(a.get("--progress-total"), 0, kIntMax, total))
    return rangeError("--progress-total", 0, kIntMax);
  o.progressBase = static_cast<int>(base);
  o.progressTotal = static_cast<int>(total);
  if (!std::getenv("OMPI_COMM_WORLD_SIZE") && !std::getenv("PMI_SIZE"))
    return usageError("calibrate-links runs under mpirun (calibrate starts it)");
  auto mpi = ms::MpiContext::create(&argc, &argv);
  if (!mpi) {
    std::fprintf(stderr, "meshstudio-engine calibrate-links: %s\n", mpi.message().c_str());
    return kExitRunFailed;
  }
  ms::Communicator& world = (*mpi)->world();
  if (ms::Status s = ms::runCalibrateLinks(world, o); !s) {
    std::fprintf(stderr, "meshstudio-engine calibrate-links: rank %d: %s\n", world.rank(),
                 s.message().c_str());
    return kExitRunFailed;
  }
  return kExitOk;
}

int cmdExport(int argc, char** argv) {
  Args a = parseArgs(argc, argv, 2, {"--out", "--target"}, {"--strict"});
  if (!a.error.empty()) return usageError(a.error);
  if (a.positional.size() != 1) return usageError("export needs exactly one CONFIG");
  if (!a.has("--out") || a.get("--out").empty()) return usageError("export needs --out DIR");
  ms::RunConfig config;
  if (!loadConfig(a.positional[0], config)) return kExitUsage;
  const std::string target = a.has("--target") ? a.get("--target") : "meshstudio";
  if (target != "meshstudio") {
    const std::optional<ms::Framework> framework = ms::frameworkFromName(target);
    if (!framework)
      return usageError("--target: '" + target +
                        "' is not one of meshstudio, megatron, torchtitan, deepspeed");
    auto exported = ms::exportForFramework(config, *framework);
    if (!exported) {
      std::fprintf(stderr, "%s: %s\n", a.positional[0].c_str(), exported.message().c_str());
      return kExitUsage;
    }
    for (const std::string& n : exported->notCarried)
      std::fprintf(stderr, "%s: not carried to %s: %s\n", a.positional[0].c_str(),
                   ms::frameworkDisplay(*framework), n.c_str());
    if (a.has("--strict") && !exported->notCarried.empty()) {
      std::fprintf(stderr,
                   "meshstudio-engine export: --strict: %zu part(s) of the plan cannot be expressed; "
                   "nothing written\n",
                   exported->notCarried.size());
      return kExitUsage;
    }
    if (ms::Status s = ms::writeFrameworkExport(*exported, a.get("--out")); !s) {
      std::fprintf(stderr, "meshstudio-engine export: %s\n", s.message().c_str());
      return kExitRunFailed;
    }
    for (const ms::FrameworkFile& f : exported->files)
      std::printf("%s/%s\n", a.get("--out").c_str(), f.name.c_str());
    return kExitOk;
  }
  if (ms::Status s = ms::exportRun(config, a.get("--out")); !s) {
    std::fprintf(stderr, "meshstudio-engine export: %s\n", s.message().c_str());
    return kExitRunFailed;
  }
  std::printf("%s\n", a.get("--out").c_str());
  return kExitOk;
}

std::optional<std::string> readWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "%s: cannot read the file (%s)\n", path.c_str(), std::strerror(errno));
    return std::nullopt;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int cmdImport(int argc, char** argv) {
  Args a = parseArgs(
      argc, argv, 2,
      {"--from", "--base", "--device", "--nodes", "--gpus-per-node", "--model", "--name", "--out"}, {});
  if (!a.error.empty()) return usageError(a.error);
  if (a.positional.empty() || a.positional.size() > 2)
    return usageError("import needs FILE (and, for torchtitan, optionally its launcher script)");
  const std::string file = a.positional[0];
  std::optional<std::string> text = readWholeFile(file);
  if (!text) return kExitUsage;
  std::optional<ms::Framework> from;
  if (a.has("--from")) {
    from = ms::frameworkFromName(a.get("--from"));
    if (!from)
      return usageError("--from: '" + a.get("--from") + "' is not one of megatron, torchtitan, deepspeed");
  } else if (file.ends_with(".toml")) {
    from = ms::Framework::Torchtitan;
  } else if (file.ends_with(".json")) {
    from = ms::Framework::DeepSpeed;
  } else {
    from = ms::Framework::Megatron;
  }
  ms::ImportOptions options;
  if (a.has("--device")) options.device = a.get("--device");
  const auto count = [&](const char* name, int& out) -> bool {
    if (!a.has(name)) return true;
    char* end = nullptr;
    const long v = std::strtol(a.get(name).c_str(), &end, 10);
    if (a.get(name).empty() || *end || v < 1) return false;
    out = static_cast<int>(v);
    return true;
  };
  if (!count("--nodes", options.nodes))
    return usageError("--nodes: '" + a.get("--nodes") + "' is not a count >= 1");
  if (!count("--gpus-per-node", options.devicesPerNode))
    return usageError("--gpus-per-node: '" + a.get("--gpus-per-node") + "' is not a count >= 1");
  options.name = a.has("--name") ? a.get("--name") : std::filesystem::path(file).stem().string();
  if (a.has("--base")) {
    ms::RunConfig base;
    if (!loadConfig(a.get("--base"), base)) return kExitUsage;
    options.base = base;
    if (!a.has("--device") && !base.mesh.nodes.empty()) options.device = base.mesh.nodes[0].device;
  }
  ms::Expected<ms::FrameworkImport> imported = ms::Status::error("no importer");
  if (*from == ms::Framework::Megatron) {
    imported = ms::importMegatron(*text, options);
  } else if (*from == ms::Framework::Torchtitan) {
    std::string launcher;
    if (a.positional.size() == 2) {
      std::optional<std::string> l = readWholeFile(a.positional[1]);
      if (!l) return kExitUsage;
      launcher = *l;
    }
    imported = ms::importTorchtitan(*text, launcher, options);
  } else {
    std::string modelArgs, hf;
    if (a.has("--model")) {
      std::optional<std::string> m = readWholeFile(a.get("--model"));
      if (!m) return kExitUsage;
      (a.get("--model").ends_with(".json") ? hf : modelArgs) = *m;
    }
    imported = ms::importDeepSpeed(*text, modelArgs, hf, options);
  }
  if (!imported) {
    std::fprintf(stderr, "%s: %s\n", file.c_str(), imported.message().c_str());
    return kExitUsage;
  }
  for (const std::string& u : imported->unknown)
    std::fprintf(stderr, "%s: unknown to %s: %s\n", file.c_str(), ms::frameworkDisplay(*from), u.c_str());
  for (const std::string& n : imported->notCarried)
    std::fprintf(stderr, "%s: not carried: %s\n", file.c_str(), n.c_str());
  for (const std::string& n : imported->assumed)
    std::fprintf(stderr, "%s: assumed: %s\n", file.c_str(), n.c_str());
  const ms::ConfigErrors errors = ms::validateRunConfig(imported->config);
  if (!errors.empty()) {
    std::fprintf(stderr, "%s: the imported plan is not valid:\n%s\n", file.c_str(),
                 ms::formatConfigErrors(errors, file).c_str());
    return kExitUsage;
  }
  if (!a.has("--out")) {
    std::printf("%s\n", ms::toJson(imported->config).dump(2).c_str());
    return kExitOk;
  }
  if (ms::Status s = ms::saveRunConfig(imported->config, a.get("--out")); !s) {
    std::fprintf(stderr, "meshstudio-engine import: %s\n", s.message().c_str());
    return kExitUsage;
  }
  std::printf("%s\n", a.get("--out").c_str());
  return kExitOk;
}

int cmdImportHf(int argc, char** argv) {
  Args a = parseArgs(argc, argv, 2, {"--base", "--name", "--out"}, {});
  if (!a.error.empty()) return usageError(a.error);
  if (a.positional.size() != 1) return usageError("import-hf needs exactly one HF_CONFIG");
  if (!a.has("--base"))
    return usageError("import-hf needs --base CONFIG (the project whose model it replaces)");
  const std::string file = a.positional[0];
  std::ifstream in(file);
  if (!in) {
    std::fprintf(stderr, "%s: cannot read the file (%s)\n", file.c_str(), std::strerror(errno));
    return kExitUsage;
  }
  const nlohmann::json hf = nlohmann::json::parse(in, nullptr, false);
  if (hf.is_discarded()) {
    std::fprintf(stderr, "%s: not valid JSON\n", file.c_str());
    return kExitUsage;
  }
  auto imported = ms::importHfConfig(hf, file);
  if (!imported) {
    std::fprintf(stderr, "%s\n", imported.message().c_str());
    return kExitUsage;
  }
  ms::RunConfig base;
  if (!loadConfig(a.get("--base"), base)) return kExitUsage;
  auto config = ms::runConfigFromHf(*imported, base, a.get("--name"));
  if (!config) {
    std::fprintf(stderr, "%s: the imported model does not fit %s's plan:\n%s\n", file.c_str(),
                 a.get("--base").c_str(), config.message().c_str());
    return kExitUsage;
  }
  for (const std::string& w : imported->warnings)
    std::fprintf(stderr, "%s: note: %s\n", file.c_str(), w.c_str());
  if (!a.has("--out")) {
    std::printf("%s\n", ms::toJson(*config).dump(2).c_str());
    return kExitOk;
  }
  if (ms::Status s = ms::saveRunConfig(*config, a.get("--out")); !s) {
    std::fprintf(stderr, "meshstudio-engine import-hf: %s\n", s.message().c_str());
    return kExitUsage;
  }
  std::printf("%s\n", a.get("--out").c_str());
  return kExitOk;
}

int cmdFidelity(int argc, char** argv) {
  Args a = parseArgs(argc, argv, 2, {"--config", "--top"}, {"--json"});
  if (!a.error.empty()) return usageError(a.error);
  if (a.positional.size() != 1)
    return usageError("fidelity takes one RUN_DIR (a train or launch run's folder)");
  long long top = 15;
  if (a.has("--top") && !integerArg(a.get("--top"), 1, kIntMax, top)) return rangeError("--top", 1, kIntMax);
  if (a.has("--config") && a.get("--config").empty()) return usageError("--config needs a FILE");
  return ms::runFidelityCommand(a.positional[0], a.get("--config"), a.has("--json"), static_cast<int>(top));
}

int cmdSchema(int argc, char** argv) {
  Args a = parseArgs(argc, argv, 2, {}, {"--markdown"});
  if (!a.error.empty()) return usageError(a.error);
  if (a.has("--markdown"))
    std::printf("%s", ms::runConfigMarkdown().c_str());
  else
    std::printf("%s\n", ms::runConfigSchema().dump(2).c_str());
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  // Before MPI, threads or BLAS calls: OpenBLAS's own choice of kernels can be 4x slow
  // (kernels/cpu/blas_core.h).
  ms::cpu::selectBlasCore(argv);
  if (argc < 2) return usageError("no command given");
  const std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    std::printf("%s", kUsage);
    return kExitOk;
  }
  // The engine's environment knobs, before a command reads a config or builds a model with them.
  {
    if (ms::Expected<int64_t> rows = ms::headChunkRowsOverride(); !rows) {
      std::fprintf(stderr, "meshstudio-engine %s: %s\n", cmd.c_str(), rows.message().c_str());
      return kExitUsage;
    }
  }
  try {
    if (cmd == "validate") return cmdValidate(argc, argv);
    if (cmd == "train") return cmdTrain(argc, argv);
    if (cmd == "export") return cmdExport(argc, argv);
    if (cmd == "eval") return cmdEval(argc, argv);
    if (cmd == "dump") return cmdDump(argc, argv);
    if (cmd == "plan") return cmdPlan(argc, argv);
    if (cmd == "launch") return cmdLaunch(argc, argv);
    if (cmd == "ps-server") return cmdPsServer(argc, argv);
    if (cmd == "ps-worker") return cmdPsWorker(argc, argv);
    if (cmd == "autoplan") return cmdAutoplan(argc, argv);
    if (cmd == "schema") return cmdSchema(argc, argv);
    if (cmd == "import-hf") return cmdImportHf(argc, argv);
    if (cmd == "import") return cmdImport(argc, argv);
    if (cmd == "calibrate") return cmdCalibrate(argc, argv);
    if (cmd == "calibrate-links") return cmdCalibrateLinks(argc, argv);
    if (cmd == "trace") return ms::traceMain(argc, argv, 2);
    if (cmd == "fidelity") return cmdFidelity(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "meshstudio-engine %s: out of memory\n", cmd.c_str());
    return kExitRunFailed;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshstudio-engine %s: internal error: %s\n", cmd.c_str(), e.what());
    return kExitRunFailed;
  }
  return usageError("unknown command \"" + cmd + "\"");
}
