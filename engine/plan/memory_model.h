// The memory model: the bytes every rank of a plan holds at its peak, by category (parameters, gradients,
// optimizer state, activations, other), against its device's capacity. The studio draws these as memory
// bars; the auto-planner drops plans that do not fit; the engine's tracking allocator reports the same
// categories, so prediction and measurement line up.
//
// What always holds: every figure is >= 0 and finite; total() is the sum of the five categories; ranks of
// one stage differ only by their device (capacity); the per-parameter state bytes follow ZeRO's accounting
// (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
// sections 3.1 and 5.1-5.3) as the engine keeps it (plan/model_state.h).
//
// The rules, and where they are approximations:
// - Parameters of a rank: the parameters of its stage's layers as its TP rank holds them (column/row-parallel
//   matrices and the vocab-parallel embedding and head / tp; LayerNorm weights, row-parallel biases and
//   positions whole). A tied LM head on another stage than the embedding holds its own copy of wte
//   (Megatron's embedding group).
// - Bytes per parameter: plan/model_state.h (modelStateBytes), the one place the engine's parameter store
//   allocates by: fp32 4 + 4 + moments; bf16 mixed precision 2 (working) + 4 or 2 (gradients) + 4 (fp32
//   master) + moments, ZeRO stage 1 sharding the master and moments over dp, 2 also the gradients, 3 also
//   the working parameters (and adding the gathered working set, the stage's largest layer whole, to other).
// - Activations: slotActivationBytes(schedule, chunkBytes, splitBytes) (schedule.h: each chunk holds the
//   buffers of the most microbatches it ever had in flight) with chunkActivationBytes() and
//   chunkSplitBackwardBytes().
// - Other: p2p buffers (bf16 activations under bf16, fp32 gradients), ZeRO-2/3 gradient buckets, backward
//   workspace (under bf16 also the fp32 staging of a layer's input and output), the ZeRO-3 gathered layer,
//   the CUDA context (see otherBreakdown()).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/plan.h"

namespace ms {

// How a mixture-of-experts block's routed rows spread over its experts (runtime/moe.cpp). Balanced: every
// expert takes R / E of the R = k T rows of a sample, which a trained router's auxiliary loss aims at and
// the figures of the studio, `fits` and the auto-planner assume. Uneven: the most a rank can be sent. A token
// sends at most one row to an expert, so of a source's T tokens an expert takes at most T rows (or its
// capacity, c R / E, under a capacity factor), and a rank's E / ep experts together at most min(k, E / ep)
// rows a token from each of the ep ranks that send to it. Dropless routing with an untrained router comes
// close (4 experts, top-2: up to twice the average to one expert, the most it can).
enum class Routing { Balanced, Uneven };

// Parameter elements of each chunk (K), unsplit by tp, a tied head's copy of wte included (see above).
std::vector<double> chunkParameterCount(const Plan& plan);
// Parameter elements of a stage (sum over its chunks), unsplit by tp.
double stageParameterCount(const Plan& plan, int stage);
// The same as one rank of the stage's TP group holds them: split parameters / tp, replicated ones (LayerNorm
// weights, row-parallel biases, positions) whole (model_spec.h shardSpecOf, what the parameter store keeps).
std::vector<double> chunkLocalParameterCount(const Plan& plan);
double stageLocalParameterCount(const Plan& plan, int stage);
// Of which the routed experts' under expert parallelism (1/ep of them, / tp; 0 without ep): their own units
// in the parameter store, summed over and ZeRO-sharded over the expert-data-parallel group of dp x cp / ep
// ranks.
std::vector<double> chunkLocalExpertParameterCount(const Plan& plan);
double stageLocalExpertParameterCount(const Plan& plan, int stage);
// The elements of a stage's owned slices under ZeRO >= 1 (what a rank's optimizer updates): the dense
// parameters / (dp x cp), the local experts / (dp x cp / ep); the whole stage without ZeRO.
double stageOwnedParameterCount(const Plan& plan, int stage);
// The same from a stage's local parameter and local expert counts (callers that hold the chunk figures).
double ownedParameterCount(const Plan& plan, double local, double experts);
// ZeRO-3, per layer (L): the parameter elements one TP rank gathers to run it, its own and, for the embedding
// and a tied LM head, the vocabulary-parallel wte (runtime Model::acquire).
std::vector<double> zero3LayerParams(const Plan& plan);
// ZeRO-3: the most a stage holds gathered at once. A layer's gather is issued as the layer before it (in
// forward) or after it (in backward) starts (runtime Model::prefetch, FSDP's prefetch), so two neighbouring
// layers of a chunk are held together: the largest sum of neighbours (a one-layer chunk: that layer).
double zero3GatheredParams(const Plan& plan, int stage);

// One microbatch's saved activations of each chunk (K), in bytes on one rank, as held between its F and the
// end of its backward, as the engine keeps them:
// - every layer's output buffer (outputBytesPerSampleIn(precision): bf16 under "precision": "bf16", where the
//   engine rounds every layer output to bf16 as Megatron keeps the residual stream; whole on every TP rank;
//   heads have none);
// - without recompute, beside it: the layer's keptBytesPerSample (model_spec.h: bf16 GEMM inputs under bf16,
//   the fused attention's rows on GPUs) * microbatch size, split by tensor parallelism: without
//   sequence_parallel a transformer block keeps its LayerNorm outputs and the residual (3*T*C values) and the
//   LayerNorm statistics whole and the rest / tp (Korthikanti et al. 2022, "Reducing Activation
//   Recomputation in Large Transformer Models", Table 2, their 10 + 24/t split); with sequence_parallel
//   only the two LayerNorm outputs stay whole (the engine gathers them once in forward), the rest / tp;
//   embeddings and heads keep theirs whole (the gpt head: its (T, C) input gradient and row figures);
// - with recompute "full", the fully recomputed transformer blocks (plan/recompute.h: all, or the first
//   recompute_layers of each chunk) keep only the output buffer (the next layer's input, from which it is
//   re-run; Megatron's full recompute checkpoints every transformer layer) and the re-run block's
//   activations are a transient added once per stage (recomputeWorkspaceBytes); the embedding and the head
//   are not recomputed;
// - with recompute "selective", transformer blocks keep all but the attention matrix (attentionMatrixBytes,
//   / tp; Korthikanti et al. 2022, section 5, Table 2's 5as/h term); nothing when attention is fused, which
//   keeps no matrix. The re-made matrix is one block's for one microbatch, in the backward workspace (other).
std::vector<double> chunkActivationBytes(const Plan& plan, Routing routing = Routing::Balanced);
// With a split backward (zero-bubble schedules), what each chunk (K) holds for one microbatch from its B to
// its W besides its saved activations: every transformer block's four linear output gradients, and under
// recompute the block's re-made activations; all 0 otherwise.
std::vector<double> chunkSplitBackwardBytes(const Plan& plan, Routing routing = Routing::Balanced);
// Whether the ranks of a stage run attention fused: a GPU device and a head size the fused kernel takes.
bool fusedAttention(const Plan& plan, int stage);
// With recompute "full": the largest kept activations of one fully recomputed transformer block of the stage
// for one microbatch (held while that block's backward runs); 0 otherwise.
double recomputeWorkspaceBytes(const Plan& plan, int stage, Routing routing = Routing::Balanced);

// The parts of "other" for a stage (bytes), each explained where it is computed.
struct OtherBytes {
  double p2pBuffers = 0;  // the stage's largest activation message and its gradient (a send and a receive)
  double dpBucket = 0;    // ZeRO-1: the owned gradient shards being reduced; ZeRO >= 2: the gradient buckets
                          // (transient full gradients, staging); 0 for ZeRO 0
  double workspace = 0;   // backward gradient buffers of the largest layer, the gpt head's logits chunk
  double zero3Gathered = 0;  // ZeRO-3: two neighbouring layers' working parameters (zero3GatheredParams)
  double context = 0;        // the CUDA context and library handles on GPUs (600 MiB), 0 on CPUs
  // GPUs under "precision": "bf16": the bf16 copies of the fp32 GEMM operands (kernels/cuda/cuda_blas.cu's
  // scratch, one grow-only buffer per operand kind, outside the tracked buffers), 0 on CPUs.
  double gemmScratch = 0;
  double total() const { return p2pBuffers + dpBucket + workspace + zero3Gathered + context + gemmScratch; }
};
OtherBytes otherBreakdown(const Plan& plan, int stage, bool gpu, Routing routing = Routing::Balanced);

// What a rank keeps in HOST memory (offload, plan/model_state.h; all 0 without): the model states the
// layout moves there, and the host's side of the transfers (one unit's working parameters, rounded before
// they are uploaded, under "optimizer"; "parameters" stages nothing on the host).
struct HostBytes {
  double parameters = 0;
  double gradients = 0;
  double optimizer = 0;
  double staging = 0;
  double total() const { return parameters + gradients + optimizer + staging; }
};

struct MemoryBreakdown {
  int rank = 0;
  int stage = 0;
  double parameters = 0;
  double gradients = 0;
  double optimizer = 0;
  double activations = 0;
  double other = 0;
  // Of other, what the engine tracks as its "workspace" and "communication" categories (OtherBytes: the
  // workspace; the message buffers, ZeRO buckets and the gathered ZeRO-3 layers); the rest is outside the
  // tracked buffers (the CUDA context, cuBLAS's bf16 scratch).
  double otherWorkspace = 0, otherCommunication = 0;
  // How far the most held at once is below the sum of the categories' peaks, which do not all come at the
  // same moment (ZeRO-1's staging fills as the last backward drains; memory_model.cpp notAtOnceBytes).
  double notAtOnce = 0;
  // Mixture of experts: the most held at once were routing as uneven as it can be (Routing::Uneven), the
  // bound a dropless run's peak stays under; 0 for a model without routed experts.
  double unevenRoutingTotal = 0;
  double capacity = 0;  // the rank's device memory
  HostBytes host;       // in host memory, beside the device's
  double categorySum() const { return parameters + gradients + optimizer + activations + other; }
  // The most the rank holds at once: what must fit, and what the engine measures as its peak total.
  double total() const { return categorySum() - notAtOnce; }
  bool fits() const { return total() <= capacity; }
};

// One entry per rank, in rank order.
// `routing` sizes the routed experts' rows; under Balanced (what fits and the studio use) a
// mixture-of-experts plan's entries also carry the Uneven total (unevenRoutingTotal).
std::vector<MemoryBreakdown> estimateMemory(const Plan& plan, Routing routing = Routing::Balanced);

// The part of a GPU rank's "other" that is the CUDA context, the cuBLAS/NCCL handles and their workspaces
// (outside the engine's tracked buffers): the allowance estimateMemory adds for every GPU rank.
double cudaContextAllowanceBytes();

// Host memory per node: what the node's ranks keep there (HostBytes) against the node's host memory (the
// sum of its devices' shares, DeviceSpec::hostMemoryBytes; 0 when not known).
struct NodeHostMemory {
  std::string node;
  double bytes = 0;
  double capacity = 0;
  bool fits() const { return bytes <= 0 || capacity <= 0 || bytes <= capacity; }
};
std::vector<NodeHostMemory> hostMemoryPerNode(const Plan& plan, const std::vector<MemoryBreakdown>& ranks);

// {"parameters", "gradients", "optimizer", "activations", "other", "total"} in bytes (each category's peak;
// "total" the peak of their sum, with "not_at_once" the difference where it is not 0, and for routed experts
// "uneven_routing_total", the total under Routing::Uneven), and with offload
// "host": {"parameters", "gradients", "optimizer", "staging", "total"}, and where other > 0 "other_parts":
// {"workspace", "communication"} (the engine's tracked categories within other): the "memory_bytes" object
// of `plan --json` and of the stream's predicted figures.
nlohmann::json memoryBytesJson(const MemoryBreakdown& m);

// A device type counts as a GPU (CUDA context allowance, fused attention, GPUs asked of Slurm) unless it is
// the host CPU: the catalog's "cpu", or a profile (mesh.profiles) that measured the CPU backend.
bool isGpuDevice(const DeviceSpec& device);

}  // namespace ms
