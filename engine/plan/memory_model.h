// The memory model: the bytes every rank of a plan holds at its peak, by category (parameters, gradients,
// optimizer state, activations, other), against its device's capacity. The studio draws these as memory
// bars; the auto-planner drops plans that do not fit; the engine's tracking allocator reports the same
// categories, so prediction and measurement line up.
//
// What always holds: every figure is >= 0 and finite; total() is the sum of the five categories; ranks of
// one stage differ only by their device (capacity); the per-parameter state bytes follow ZeRO's accounting
// (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
// section 3.1 and Figure 1) as the engine keeps it (stateBytesPerParam).
//
// The rules, and where they are approximations:
// - Parameters of a rank: the parameters of its stage's layers / tp. Every tensor is counted as split by tp
//   (column/row-parallel matrices and vocab-parallel embedding and head are; LayerNorm weights and the
//   row-parallel biases are really replicated, a few C per block: under 0.1% for C >= 256). A tied LM head
//   on another stage than the embedding holds its own copy of wte (Megatron's embedding group).
// - Bytes per parameter: parameter 4 (fp32 values; the master weights in bf16), gradient 4 (fp32 in both
//   precisions), AdamW 8 (two moments), SGD 4 (momentum; 0 without); bf16 adds 2 for the parameters' bf16
//   working copy the GEMMs read (runtime/parameters.h), except under ZeRO-3, which keeps none.
// - ZeRO over the DP group of size d: stage 1 divides optimizer state by d, stage 2 also gradients, stage 3
//   also the fp32 parameters (and adds the gathered working set, the stage's largest layer unsharded, to
//   other). The bf16 working copy is never divided: every replica multiplies the whole of it.
// - Activations: slotActivationBytes(schedule, chunkBytes, splitBytes) (schedule.h: each chunk holds the
//   buffers of the most microbatches it ever had in flight) with chunkActivationBytes() and
//   chunkSplitBackwardBytes().
// - Other: p2p buffers, the DP bucket, backward workspace, the CUDA context (see otherBreakdown()).
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "plan/plan.h"

namespace ms {

// Bytes each parameter element costs, before ZeRO sharding.
struct StateBytes {
  double parameter = 0;  // the fp32 values (in bf16 the master weights); what ZeRO-3 shards and gathers
  double bf16Copy = 0;   // bf16: the working copy the GEMMs read (ZeRO < 3 only; never sharded)
  double gradient = 0;
  double optimizer = 0;
  // A rank's parameter bytes per element before ZeRO-3 divides the fp32 values: under ZeRO-3 the engine
  // keeps no bf16 working copy (a unit's full values exist only while gathered; see runtime/parameters.h).
  double parameterBytes(int zero) const { return parameter + (zero >= 3 ? 0.0 : bf16Copy); }
};
StateBytes stateBytesPerParam(Precision precision, const OptimizerConfig& optimizer);

// Parameter elements of each chunk (K), unsplit by tp, a tied head's copy of wte included (see above).
std::vector<double> chunkParameterCount(const Plan& plan);
// Parameter elements of a stage (sum over its chunks), unsplit by tp.
double stageParameterCount(const Plan& plan, int stage);

// One microbatch's saved activations of each chunk (K), in bytes on one rank, as held between its F and the
// end of its backward, as the engine keeps them:
// - every layer's output buffer (outputBytesPerSample, whole on every TP rank; heads have none);
// - without recompute, beside it: the layer's keptBytesPerSample (model_spec.h: bf16 GEMM inputs under bf16,
//   the fused attention's rows on GPUs) * microbatch size, split by tensor parallelism: without
//   sequence_parallel a transformer block keeps its LayerNorm outputs and the residual (3*T*C values) and the
//   LayerNorm statistics whole and the rest / tp (Korthikanti et al. 2022, "Reducing Activation
//   Recomputation in Large Transformer Models", Table 2, their 10 + 24/t split); with sequence_parallel
//   only the two LayerNorm outputs stay whole (the engine gathers them once in forward), the rest / tp;
//   embeddings and heads keep theirs whole (the gpt head: its (T, C) input gradient and row figures);
// - with recompute "full", transformer blocks keep only the output buffer (the next layer's input, from
//   which it is re-run; Megatron's full recompute checkpoints every transformer layer) and the re-run
//   block's activations are a transient added once per stage (recomputeWorkspaceBytes); the embedding and
//   the head are not recomputed.
std::vector<double> chunkActivationBytes(const Plan& plan);
// With a split backward (zero-bubble schedules), what each chunk (K) holds for one microbatch from its B to
// its W besides its saved activations: every transformer block's four linear output gradients, and under
// recompute the block's re-made activations; all 0 otherwise.
std::vector<double> chunkSplitBackwardBytes(const Plan& plan);
// Whether the ranks of a stage run attention fused: a GPU device and a head size the fused kernel takes.
bool fusedAttention(const Plan& plan, int stage);
// With recompute "full": the largest kept activations of one transformer block of the stage for one
// microbatch (held while that block's backward runs); 0 without recompute.
double recomputeWorkspaceBytes(const Plan& plan, int stage);

// The parts of "other" for a stage (bytes), each explained where it is computed.
struct OtherBytes {
  double p2pBuffers = 0;     // a send and a receive buffer of the stage's largest message
  double dpBucket = 0;       // one gradient bucket for DP sync (PyTorch DDP's 25 MiB), 0 for dp == 1
  double workspace = 0;      // backward gradient buffers of the largest layer, the gpt head's logits chunk
  double zero3Gathered = 0;  // ZeRO-3: the largest layer's parameters, gathered whole
  double context = 0;        // the CUDA context and library handles on GPUs (500 MiB), 0 on CPUs
  double total() const { return p2pBuffers + dpBucket + workspace + zero3Gathered + context; }
};
OtherBytes otherBreakdown(const Plan& plan, int stage, bool gpu);

struct MemoryBreakdown {
  int rank = 0;
  int stage = 0;
  double parameters = 0;
  double gradients = 0;
  double optimizer = 0;
  double activations = 0;
  double other = 0;
  double capacity = 0;  // the rank's device memory
  double total() const { return parameters + gradients + optimizer + activations + other; }
  bool fits() const { return total() <= capacity; }
};

// One entry per rank, in rank order.
std::vector<MemoryBreakdown> estimateMemory(const Plan& plan);

// {"parameters", "gradients", "optimizer", "activations", "other", "total"} in bytes: the "memory_bytes"
// object of `plan --json` and of the stream's predicted figures.
nlohmann::json memoryBytesJson(const MemoryBreakdown& m);

// A device type counts as a GPU (CUDA context allowance) unless it is the host CPU.
bool isGpuDevice(const DeviceSpec& device);

}  // namespace ms
