// The cost model: how long each action of a plan's schedule takes on its devices. Compute comes from the
// model spec's FLOPs and the device's peak times its achievable fraction, or from measured per-layer times
// (calibration); communication comes from the links of the mesh with the ring-collective formulas below.
// The step simulator walks the schedule with these durations; the auto-planner screens with them.
//
// What always holds: every duration is finite and >= 0; with Communication::Free every transfer, collective
// and in-layer communication costs 0 (compute and the optimizer step keep their cost); measured times, once
// set, are used as they are (they are the executor's span durations, so they already hold whatever ran
// inside the layer: tensor-parallel collectives, recomputation, ZeRO-3 gathers) and nothing modelled is
// added to them.
//
// Costs are per microbatch and per model chunk, timed on the ranks of pipeline replica 0 with tp index 0
// (rank layout.rank({0, 0, stage})): all data-parallel replicas and tensor-parallel peers run the same list
// and are assumed to take the same time.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "plan/hardware.h"
#include "plan/plan.h"
#include "plan/schedule.h"

namespace ms {

// Measured (or explicit) compute times, seconds per microbatch, one entry per model layer: (L) each.
// backwardInput + backwardWeight is the layer's whole backward; a schedule without a split backward runs them
// as one B action.
struct LayerTimes {
  std::vector<double> forward;         // (L)
  std::vector<double> backwardInput;   // (L)
  std::vector<double> backwardWeight;  // (L)
};

enum class Communication {
  Modelled,  // links of the mesh, formulas below
  Free,      // every transfer and collective takes no time (textbook pipeline figures, tests)
};

// --- Communication primitives (seconds). `bytes` is the full buffer on each rank; n the group size. ---

// One point-to-point message: latency + bytes / bandwidth.
double p2pTime(double bytes, const LinkSpec& link);
// Ring all-reduce: 2(n-1)/n * bytes / bw + 2(n-1) * latency (Patarasuk & Yuan 2009, "Bandwidth optimal
// all-reduce algorithms for clusters of workstations"; nccl-tests doc/PERFORMANCE.md: busbw = algbw *
// 2(n-1)/n). 0 for n <= 1.
double ringAllReduceTime(double bytes, int n, const LinkSpec& link);
// A latency-bound all-reduce of a small message (synchronised BatchNorm's per-channel sums): the faster of
// the ring and a tree, reduce up and broadcast down a binary tree, 2 ceil(log2 n) latencies plus the bytes
// twice, as NCCL switches to its (double binary) trees for small messages (Sanders, Speck and Traff 2009,
// "Two-tree algorithms for full bandwidth broadcast, reduction and scan"; NCCL 2.4).
double smallAllReduceTime(double bytes, int n, const LinkSpec& link);
// Ring reduce-scatter and all-gather, half an all-reduce each: (n-1)/n * bytes / bw + (n-1) * latency
// (nccl-tests: busbw = algbw * (n-1)/n). `bytes` is the unsharded buffer. 0 for n <= 1.
double ringReduceScatterTime(double bytes, int n, const LinkSpec& link);
double ringAllGatherTime(double bytes, int n, const LinkSpec& link);

// All-to-all (each rank sends bytes / n to every other member): (n-1)/n * bytes / bw + (n-1) * latency, the
// pairwise exchange NCCL and Open MPI run for large messages (nccl-tests doc/PERFORMANCE.md: alltoall busbw =
// algbw * (n-1)/n). `bytes` is what one rank sends in all, its own share included. 0 for n <= 1.
double allToAllTime(double bytes, int n, const LinkSpec& link);

// One kernel of a layer's forward as the cost model times it, per microbatch on one rank of the layer's
// stage.
struct KernelCost {
  std::string what;    // "GEMM 4096 x 2304 x 768", "2 x GEMM ..." (experts, head chunks), "attention", ...
  double flops = 0;    // 0 for the elementwise passes
  double seconds = 0;  // with its repeats
  double fractionOfPeak = 0;  // flops / seconds / the device's dense peak at the plan's precision (0: none)
};
// The forward of model layer `layer`, kernel by kernel, where its stage's device times kernels by shape (a
// catalog GPU's kernel model, a measured profile: its GEMMs, the attention core, the elementwise passes);
// empty where the layer is costed from FLOPs (a config's own device type, the cnn) or the index is out of
// range. Their sum is the layer's analytic forward (without in-layer communication; for the fused LM head,
// without the gradients' GEMMs it also runs in forward).
std::vector<KernelCost> layerForwardKernels(const Plan& plan, int layer);

// The link a ring over these ranks is limited by: the inter-node link as soon as two members sit on different
// nodes, else the intra-node link (also when the layout has no devices yet).
const LinkSpec& groupLink(const Plan& plan, const std::vector<int>& ranks);

// The link a ring collective (all-reduce, reduce-scatter, all-gather) over these ranks runs at. Inside a node
// the intra-node link; across nodes the inter-node link, and where every device has a port of it of its own
// (LinkSpec::perDevice) and the group has g members on each node (the fewest on any), NCCL lays g rings that
// each leave a node through a different member's port (one ring per NIC, "rails"), each carrying 1/g of the
// data. Per member, 1/g of the ring's traffic then crosses nodes through its own port and (g - 1)/g stays on
// the intra-node link, so the bus bandwidth is min(g B_inter, g / (g - 1) B_intra): the ring formulas of
// this file (Patarasuk and Yuan 2009; nccl-tests' busbw) with the g ports' sum for one port. The same holds
// for a port per device pair: nccl-tests issue 119's 24 A100s on 3 nodes of 4 HDR ports (25 GB/s each)
// reached ~96 GB/s of bus bandwidth, the four ports together. A measured link keeps its own curves.
// All-to-alls and point-to-point transfers (each member's own bytes) use groupLink.
LinkSpec ringLink(const Plan& plan, const std::vector<int>& ranks);
// The same for g members per node of a group that crosses nodes (the auto-planner's estimate).
LinkSpec railLink(const LinkSpec& inter, const LinkSpec& intra, int membersPerNode);

class CostModel {
 public:
  // Analytic: per-layer times from FLOPs, communication from the mesh.
  explicit CostModel(const Plan& plan, Communication communication = Communication::Modelled);
  // Explicit per-layer times (calibration, or equal stages for textbook figures); sizes must match the model
  // (a mismatch keeps the analytic times: see setMeasuredTimes for the checked form).
  CostModel(const Plan& plan, LayerTimes measured, Communication communication = Communication::Modelled);

  // Replaces the per-layer compute times; an error (naming the vector and both sizes) when a vector's size
  // is not the model's layer count, or a time is negative or not finite.
  Status setMeasuredTimes(LayerTimes measured);
  bool calibrated() const { return m_calibrated; }
  Communication communication() const { return m_communication; }
  bool splitBackward() const { return m_split; }  // the schedule runs B (input) and W (weights) apart
  // The analytic or measured per-layer compute times in use (without the communication inside layers).
  const LayerTimes& layerTimes() const { return m_layers; }

  // Durations of the compute actions of chunk k for one microbatch (the split follows the plan's schedule):
  double forwardTime(int chunk) const;   // F
  double backwardTime(int chunk) const;  // B: input and weight gradients, or input only when split
  double weightTime(int chunk) const;    // W: weight gradients when split, else 0
  // A message of chunk k: its output activation (to chunk k+1), or its input gradient (to chunk k-1).
  double activationTransferTime(int chunk) const;
  double gradientTransferTime(int chunk) const;
  double activationMessageBytes(int chunk) const;  // chunk k's output, per microbatch, as sent
  // The data-parallel gradient sync of chunk k (once per step), on the stage's communication lane.
  double gradSyncTime(int chunk) const;
  // How that sync overlaps the chunk's last backward work: the engine starts each layer's sync as soon as the
  // layer's gradients are final (runtime/model.cpp startSync, PyTorch DDP's and Megatron-LM's
  // --overlap-grad-reduce buckets), and the backward visits the chunk's layers last to first. Per layer of
  // the chunk, in model order: the fraction of the last backward action (B, or W under a split backward)
  // done when that layer's gradients are final counted from the action's start, each layer's share of the
  // action by its compute time (its share of the in-layer communication with it); and the layer's part of
  // gradSyncTime, by its share of the chunk's parameters (the chunk's whole sync is kept as one figure: the
  // engine's per-layer collectives pay latency per layer, which that split does not add).
  struct SyncPiece {
    double readyFraction = 0;  // in [0, 1]: 1 for the chunk's first layer (its gradients come last)
    double seconds = 0;
  };
  std::vector<SyncPiece> gradSyncPieces(int chunk) const;
  // Whether stage s's collectives run beside its compute: the gradient sync as gradSyncPieces lays it out,
  // tp_comm_overlap's and ZeRO-3's prefetched gathers beside the GEMMs and layers they travel with. On a GPU
  // (NCCL runs on its own stream). Not on a CPU (the catalog's "cpu", a profile of backend "cpu"): the
  // engine's collectives there are Open MPI's non-blocking ones, which move data only inside MPI calls (Open
  // MPI runs no progress thread by default, and libnbc's schedules advance in MPI_Test / MPI_Wait), so each
  // completes when the rank waits for it: the simulator runs a CPU stage's sync on its compute lane after its
  // last backward (one collective per layer), and the in-layer ones are exposed whole. Measured on the Intel
  // VM (2026-11-29): the suite's gpt dp2 waited 0.21-0.23 ms a step for its sync after the backward, where
  // the overlapped layout exposed 0.025 ms.
  bool collectivesOverlapCompute(int stage) const { return m_overlaps[static_cast<size_t>(stage)]; }
  // The stage's optimizer step (a memory-bound pass over its parameter shard, plus ZeRO-1/2's parameter
  // all-gather unless overlap_param_gather moves it beside the next forward).
  double optimizerTime(int stage) const;
  // With overlap_param_gather (ZeRO 1-2): chunk k's part of its stage's parameter all-gather, per layer of
  // the chunk in model order (by its share of the chunk's parameters; the engine gathers a unit per layer).
  // The stage's gathers start as the step starts (the previous step's optimizer has just ended) on its
  // communication lane, in chunk order, and a layer's forward waits for its own (Megatron-LM's
  // --overlap-param-gather). Empty without the overlap or when communication is free.
  std::vector<double> paramGatherPieces(int chunk) const;
  // Each layer's share of chunk k's forward, by compute time (sums to 1).
  std::vector<double> forwardShares(int chunk) const;
  // Of which the device<->host transfers under offload (0 without): gradients down, parameters up.
  double optimizerTransferTime(int stage) const;
  // The device<->host transfers over the host link (PCIe) inside an action under offload
  // (plan/model_state.h), seconds, part of its duration: "parameters" uploads a chunk's bf16 shard before the
  // gathers of F, B and W and downloads each microbatch's reduced gradient shard at the end of B; "optimizer"
  // downloads the owned gradients at the start of the step and uploads the updated bf16 slice at its end. All
  // 0 without offload, and for F, B and W when the times are calibrated (measured times include them) or
  // communication is Free.
  struct HostTransfers {
    double uploadFirst = 0;    // host -> device, at the action's start
    double downloadFirst = 0;  // device -> host, at the action's start
    double downloadLast = 0;   // device -> host, at the action's end
    double uploadLast = 0;     // host -> device, at the action's end
  };
  HostTransfers hostTransfers(const Action& action, int stage) const;
  // The duration of a compute-lane action, or the transit time of a send; 0 for a receive (it waits for a
  // message instead). `stage` is the stage running the action.
  double actionTime(const Action& action, int stage) const;

  int chunkCount() const { return static_cast<int>(m_chunkForwardComm.size()); }

 private:
  double chunkSum(const std::vector<double>& perLayer, int chunk) const;

  Communication m_communication = Communication::Modelled;
  bool m_calibrated = false;
  bool m_split = false;
  std::vector<std::vector<int>> m_chunks;  // (K): layers of each chunk
  LayerTimes m_layers;                     // in use
  LayerTimes m_analytic;                   // from FLOPs, kept to validate sizes and restore
  // Modelled communication inside compute actions (0 when Free): TP collectives and ZeRO-3 gathers.
  std::vector<double> m_chunkForwardComm;          // (K)
  std::vector<double> m_chunkBackwardComm;         // (K): in B (the input-gradient part)
  std::vector<double> m_chunkWeightComm;           // (K): in W (a split backward's ZeRO-3 re-gathers)
  std::vector<double> m_activationTransfer;        // (K): chunk k's output to chunk k+1's stage
  std::vector<double> m_gradientTransfer;          // (K): chunk k's input gradient to chunk k-1's stage
  std::vector<double> m_activationBytes;           // (K)
  std::vector<double> m_gradSync;                  // (K)
  std::vector<std::vector<double>> m_layerParams;  // (K): each layer's parameters as one TP rank holds them
  std::vector<double> m_optimizer;                 // (P)
  std::vector<bool> m_overlaps;                    // (P): collectivesOverlapCompute
  std::vector<double> m_paramGather;               // (K): overlap_param_gather's part of each chunk, else 0
  // Offload's host-link transfers (hostTransfers).
  std::vector<double> m_chunkHostUpload;    // (K): a chunk's shard up, before F's, B's and W's gathers
  std::vector<double> m_chunkHostDownload;  // (K): a microbatch's reduced gradient shard down, in B
  std::vector<double> m_optimizerDownload;  // (P): the owned gradients down
  std::vector<double> m_optimizerUpload;    // (P): the updated bf16 slice up
};

}  // namespace ms
