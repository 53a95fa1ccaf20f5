// The metrics stream's schema, defined once: the record types and their keys, used by the engine's writers
// (engine/runtime/metrics.h and trainer.cpp, the supervisor's run_end, main's startup run_end) and by the
// studio's reader (ui/run/metrics_reader.cpp). A key written or read anywhere else by its literal spelling is
// a defect: name it here.
//
// The stream is JSON Lines: one object per line, each with "v" (kVersion) and "type" (one of the record types
// below), "t" (seconds since the run's clock zero, the clock the spans use, where the writer has one) and
// "time" (Unix time in seconds, the writer's wall clock). Versioning: adding a record type or a field keeps
// the version (readers ignore what they do not know); renaming or removing a field, or changing its meaning
// or unit, raises kVersion, and readers read every older version they know of.
//
// Records (required fields marked *, the rest optional):
//   run_start   name*, config (the run config, as `meshstudio-engine config` writes it), ranks*,
//               threads_per_rank, device {kind, name, index, memory_bytes, peak_flops_bf16, peak_flops_fp32,
//               catalog, emulated, gemm_precision}, params, layers [{name, params}], start_step, steps,
//               run_dir, resumed_from, start_unix (the clock zero as Unix time), predicted {step_time_s,
//               tokens_per_s, mfu, ranks [{rank*, stage, memory_bytes {memory categories}, bubble_fraction}]}
//   step        step*, loss*, lr, grad_norm, step_time_s, samples_per_s, tokens_per_s (GPT), accuracy
//               (classifiers)
//   spans       step*, ranks* [{rank*, spans* [{action* (one letter), layer, mb, chunk, start*, end*}]}]
//   memory      step*, ranks* [{rank*, current {categories}, peak {categories}, device {used, reserved,
//               total}, host {current {categories}, peak {categories}}}]
//   eval        step*, loss*, samples, accuracy, time_s
//   checkpoint  step*, path
//   log         level ("info", "warning", "error"; default info), message*
//   run_end     status* ("ok", "interrupted", "error"), reason, step
//   ps          (parameter-server mode, with each step line and at the end) step*, version (updates applied
//               by server 0), staleness [updates applied with staleness 0, 1, ... since the last ps line],
//               staleness_total [the same over the run], discarded (sync pushes of an older version),
//               worker_states [{worker*, live*, steps (pushes applied), step_time_s, samples_per_s (since the
//               last ps line)}], final
// Parameter-server runs add to run_start: servers, workers, consistency, and predicted {step_time_s,
// tokens_per_s (samples/s for classifiers), mean_staleness}; to step: version; to eval: worker (the worker
// that evaluated).
// Memory categories: parameters, gradients, optimizer, activations, communication, workspace, other, total
// (bytes); "host" objects (offloaded model states) have parameters, gradients, optimizer, staging, total.
#pragma once

namespace ms::metrics {

inline constexpr int kVersion = 1;

// Record types.
namespace type {
inline constexpr char kRunStart[] = "run_start";
inline constexpr char kStep[] = "step";
inline constexpr char kSpans[] = "spans";
inline constexpr char kMemory[] = "memory";
inline constexpr char kEval[] = "eval";
inline constexpr char kCheckpoint[] = "checkpoint";
inline constexpr char kLog[] = "log";
inline constexpr char kRunEnd[] = "run_end";
inline constexpr char kPs[] = "ps";
}  // namespace type

// run_end statuses.
namespace status {
inline constexpr char kOk[] = "ok";
inline constexpr char kInterrupted[] = "interrupted";
inline constexpr char kError[] = "error";
}  // namespace status

// Keys. One list for all records: a key means the same thing wherever it appears.
namespace key {
// Every line.
inline constexpr char kVersion[] = "v";
inline constexpr char kType[] = "type";
inline constexpr char kT[] = "t";
inline constexpr char kTime[] = "time";
// Shared by several records.
inline constexpr char kStep[] = "step";
inline constexpr char kRank[] = "rank";
inline constexpr char kRanks[] = "ranks";
inline constexpr char kName[] = "name";
inline constexpr char kParams[] = "params";
inline constexpr char kLoss[] = "loss";
inline constexpr char kAccuracy[] = "accuracy";
inline constexpr char kSamples[] = "samples";
inline constexpr char kPath[] = "path";
inline constexpr char kMemoryBytes[] = "memory_bytes";
// run_start.
inline constexpr char kConfig[] = "config";
inline constexpr char kThreadsPerRank[] = "threads_per_rank";
inline constexpr char kDevice[] = "device";
inline constexpr char kLayers[] = "layers";
inline constexpr char kStartStep[] = "start_step";
inline constexpr char kSteps[] = "steps";
inline constexpr char kRunDir[] = "run_dir";
inline constexpr char kResumedFrom[] = "resumed_from";
inline constexpr char kStartUnix[] = "start_unix";
inline constexpr char kPredicted[] = "predicted";
inline constexpr char kStage[] = "stage";
inline constexpr char kBubbleFraction[] = "bubble_fraction";
inline constexpr char kMfu[] = "mfu";
// device (in run_start).
inline constexpr char kKind[] = "kind";
inline constexpr char kIndex[] = "index";
inline constexpr char kPeakFlopsBf16[] = "peak_flops_bf16";
inline constexpr char kPeakFlopsFp32[] = "peak_flops_fp32";
inline constexpr char kCatalog[] = "catalog";
inline constexpr char kEmulated[] = "emulated";
inline constexpr char kGemmPrecision[] = "gemm_precision";
// step (and predicted).
inline constexpr char kLr[] = "lr";
inline constexpr char kGradNorm[] = "grad_norm";
inline constexpr char kStepTimeS[] = "step_time_s";
inline constexpr char kSamplesPerS[] = "samples_per_s";
inline constexpr char kTokensPerS[] = "tokens_per_s";
// Mixture of experts: the load-balancing loss (aux_loss_coef included), summed over the MoE layers and
// averaged over the step's microbatches and data-parallel replicas (not part of "loss").
inline constexpr char kAuxLoss[] = "aux_loss";
// spans.
inline constexpr char kSpans[] = "spans";
inline constexpr char kAction[] = "action";
inline constexpr char kLayer[] = "layer";
inline constexpr char kMicrobatch[] = "mb";
inline constexpr char kChunk[] = "chunk";
inline constexpr char kStart[] = "start";
inline constexpr char kEnd[] = "end";
// memory.
inline constexpr char kCurrent[] = "current";
inline constexpr char kPeak[] = "peak";
inline constexpr char kUsed[] = "used";
inline constexpr char kReserved[] = "reserved";
inline constexpr char kTotal[] = "total";
inline constexpr char kHost[] = "host";
inline constexpr char kOtherParts[] = "other_parts";
// Predicted memory: how far the categories' peaks summed are above the peak of their sum.
inline constexpr char kNotAtOnce[] = "not_at_once";
// Predicted memory of a mixture of experts: the total under the most uneven routing (plan/memory_model.h).
inline constexpr char kUnevenRoutingTotal[] = "uneven_routing_total";
// eval.
inline constexpr char kTimeS[] = "time_s";
// log.
inline constexpr char kLevel[] = "level";
inline constexpr char kMessage[] = "message";
// run_end.
inline constexpr char kStatus[] = "status";
inline constexpr char kReason[] = "reason";
// parameter-server mode (run_start, step, eval, ps).
inline constexpr char kPsServers[] = "servers";
inline constexpr char kPsWorkers[] = "workers";
inline constexpr char kConsistency[] = "consistency";
inline constexpr char kPsWorker[] = "worker";
inline constexpr char kPsVersion[] = "version";
inline constexpr char kPsLive[] = "live";
inline constexpr char kPsStaleness[] = "staleness";
inline constexpr char kPsStalenessTotal[] = "staleness_total";
inline constexpr char kPsDiscarded[] = "discarded";
inline constexpr char kPsFinal[] = "final";
inline constexpr char kPsWorkerStates[] = "worker_states";
inline constexpr char kPsMeanStaleness[] = "mean_staleness";  // run_start's predicted
inline constexpr char kPsLane[] = "lane";  // spans: a ranks entry's lane ("worker 2", "server 0")
}  // namespace key

// Memory category keys: the engine's MemoryCategory names (engine/runtime/memory.h) and the memory model's
// (engine/plan/memory_model.h); the total is key::kTotal.
namespace category {
inline constexpr char kParameters[] = "parameters";
inline constexpr char kGradients[] = "gradients";
inline constexpr char kOptimizer[] = "optimizer";
inline constexpr char kActivations[] = "activations";
inline constexpr char kCommunication[] = "communication";
inline constexpr char kWorkspace[] = "workspace";
inline constexpr char kOther[] = "other";
inline constexpr char kStaging[] = "staging";  // host memory only (offload's pinned staging buffers)
}  // namespace category

}  // namespace ms::metrics
