// A device profile: what `meshstudio-engine calibrate` measured on one machine (docs/calibration.md has the
// file format), read back for the planner. A mesh names a profile in "mesh.profiles" (run_config.h
// ProfileConfig); its device type and its measured link types then cost compute by each GEMM's shape and
// every message by its size, from these curves, instead of a datasheet peak times one efficiency and a link's
// one bandwidth and latency.
//
// What always holds for a profile that loadDeviceProfile() returned: every measured number is finite and
// > 0; each GEMM, attention, elementwise and optimizer table has at least one entry per precision and thread
// count it names; a link has at least one measurement of "sendrecv" and of "all_reduce" at its rank count
// (>= 2). The queries below never return a negative, NaN or infinite time, and at a measured point they
// return the measured time exactly (tests rely on it).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "plan/model_spec.h"
#include "plan/run_config.h"

namespace ms {

// The collectives a link profile holds, with the nccl-tests names ("all_reduce", ...).
enum class CollectiveOp { SendRecv, AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast };
const char* collectiveOpName(CollectiveOp op);

// nccl-tests' bus-bandwidth factor for n ranks (doc/PERFORMANCE.md): busbw = algbw * factor. all_reduce
// 2(n-1)/n; all_gather, reduce_scatter and all_to_all (n-1)/n; broadcast and sendrecv 1.
double busBandwidthFactor(CollectiveOp op, int n);
// The sequential steps of the ring algorithm for n ranks, each paying the link's latency once: all_reduce
// 2(n-1) (a reduce-scatter then an all-gather), all_gather, reduce_scatter, all_to_all and broadcast (as a
// pipelined ring) n-1, sendrecv 1.
double ringSteps(CollectiveOp op, int n);

struct LinkProfile {
  std::string name;       // "shm", "tcp"
  std::string transport;  // for people: "Open MPI, btl vader (shared memory)"
  int ranks = 2;          // the group size every collective was measured at
  // Per op, (bytes, seconds) sorted by bytes, sizes distinct.
  std::map<CollectiveOp, std::vector<std::pair<double, double>>> curves;

  // The time of `op` moving `bytes` (nccl-tests' size: the buffer on each rank for all_reduce, the gathered
  // output for all_gather, ...) over n ranks. At the measured rank count it is the measured curve: exact at
  // measured sizes, log-log interpolation between them, the smallest size's time below them (latency-bound)
  // and the largest's rate beyond (bandwidth-bound). For another n the curve is split into its latency part L
  // (the smallest message's time) and the rest, and each is rescaled: L by ringSteps(n) / ringSteps(ranks),
  // the rest by busBandwidthFactor(n) / busBandwidthFactor(ranks) (the ring's cost, Patarasuk and Yuan
  // 2009); an all-reduce takes the lesser of that and a tree's, 2 ceil(log2 n) latencies and the bytes twice
  // (NCCL's double binary trees for small messages, Sanders, Speck and Traff 2009). An op the profile did not
  // measure falls back to all_reduce's curve rescaled by the factors the same way (and sendrecv's for a
  // broadcast of two ranks). n <= 1 costs 0 (but sendrecv, which always moves its bytes once).
  double seconds(CollectiveOp op, double bytes, int n) const;
  // The one-way time of the smallest message measured (the figure a latency column shows).
  double latency() const;
  // The bus bandwidth of the largest all_reduce measured, bytes/s.
  double peakBusBandwidth() const;
};

// The three GEMMs of a linear layer, as the CPU backend runs them (kernels/cpu/linear.cpp): the forward
// out = inp @ weight, the input gradient dinp += dout @ weight^T and the weight gradient dweight += inp^T @
// dout. A profile measures each at the layer's shape (m rows, k inputs, n outputs), since a BLAS runs the
// three transposes by different kernels: at the small shapes the equivalence suite trains, OpenBLAS's NT and
// TN paths took 1.3-2.6x its NN forward's time (docs/calibration.md).
enum class GemmOp { Forward, InputGradient, WeightGradient };
const char* gemmOpName(GemmOp op);  // "forward", "input_gradient", "weight_gradient"

// The elementwise kernels a profile times by name (plan/model_spec.h VectorKernel, the kinds of
// VectorKernelUse): the CPU backend's layerNorm and rmsNorm forward / backward over rows of a width, gelu and
// swiglu forward / backward over elements, and RoPE (ropePackQkv / ropeUnpackQkv) over rows of the q and k
// heads' width.
const char* vectorKernelName(VectorKernel kernel);  // "layernorm", "gelu", "rmsnorm", "swiglu", "rope"
// Whether the kernel works on rows of a width (the norms, RoPE) or on elements (width 1 in a profile).
bool vectorKernelHasRows(VectorKernel kernel);

struct DeviceProfile {
  std::string file;  // where it was read from (messages)
  // machine: for people, and the cores the cost model divides among a node's ranks.
  std::string hostname, cpu, blas, created, command;
  int cores = 1;
  double memoryBytes = 0;
  std::string backend;  // "cpu"

  struct Gemm {
    int m = 0, n = 0, k = 0;
    double seconds = 0;
  };
  struct Attention {
    int batch = 1, heads = 1, seq = 0, headSize = 0;
    bool causal = true;
    double flops = 0, forwardSeconds = 0, backwardSeconds = 0;
  };
  struct Point {  // elementwise (x: bytes) and optimizer (x: parameters)
    double x = 0, seconds = 0;
  };
  // Keyed by thread count; GEMMs and attention also by precision. `gemm` is the forward's table;
  // gemmInputGradient and gemmWeightGradient the backward's, empty in a profile that did not measure them
  // (profiles written before 2026-11-29).
  std::map<std::pair<Precision, int>, std::vector<Gemm>> gemm;
  std::map<std::pair<Precision, int>, std::vector<Gemm>> gemmInputGradient, gemmWeightGradient;
  std::map<std::pair<Precision, int>, std::vector<Attention>> attention;
  // Ring attention's block kernels (context parallelism; kernels/cpu/ring_attention.cpp), entries of kernel
  // "ring_block": one context-parallel rank of a ring of two, its seq local positions (two load-balanced
  // chunks) against its own block and then its peer's, forward and backward summed over the two steps;
  // `flops` the visible products (half a causal sequence of 2 seq positions' FLOPs) and `seq` the block's
  // keys. Empty in a profile that did not measure them (before 2026-11-30): ring attention is then costed as
  // the fused kernel at the sequence's keys.
  std::map<std::pair<Precision, int>, std::vector<Attention>> ringAttention;
  std::map<int, std::vector<Point>> elementwise;
  struct VectorKernelPoint {
    double rows = 0, width = 0;  // gelu, swiglu: width 1, rows the elements
    double forwardSeconds = 0, backwardSeconds = 0;
  };
  // Keyed by kernel, then threads; empty in a profile that did not measure them (before 2026-11-29).
  std::map<VectorKernel, std::map<int, std::vector<VectorKernelPoint>>> vectorKernels;
  std::map<int, std::vector<Point>> optimizer;
  std::vector<LinkProfile> links;

  // The thread counts measured (ascending), and the one a rank with `threads` threads is costed at: the
  // largest measured count <= threads (the smallest measured when none is).
  std::vector<int> threadCounts() const;
  int measuredThreads(int threads) const;

  // Seconds of one GEMM (m x k times k x n) as the backend runs linear layers: the measured time at a
  // measured shape; between shapes the rate (2mnk / seconds) interpolated trilinearly in log m, log n, log k
  // (a grid corner the calibration skipped as too large takes the best rate measured at or below it in every
  // dimension); beyond the grid the rate at its edge. bf16 falls back to fp32's table when it has none.
  double gemmSeconds(Precision precision, int threads, double m, double n, double k) const;
  // One of a linear layer's three GEMMs at the layer's shape (m rows, n outputs, k inputs), from that op's
  // table as gemmSeconds reads the forward's. A profile without the op's table costs it as the forward GEMM
  // of its own product's shape: the input gradient as (m, k, n), the weight gradient as (k, n, m).
  double gemmSeconds(GemmOp op, Precision precision, int threads, double m, double n, double k) const;
  // The best GEMM rate measured at this precision and thread count, FLOP/s (the "peak" a profile device
  // shows: it is measured, not published).
  double peakGemmRate(Precision precision, int threads) const;
  // Attention's forward and backward, seconds, for `flops` forward FLOPs at sequence length seq (keys) and
  // head size headSize: the measured rate (forward FLOPs / seconds) interpolated in log seq at each measured
  // head size, then in log head size, clamped at the ends (a profile of one head size costs every head size
  // at its rate; headSize <= 0 is taken as 64, the size profiles before the head-size grid measured).
  double attentionForwardSeconds(Precision precision, int threads, double flops, double seq,
                                 double headSize) const;
  double attentionBackwardSeconds(Precision precision, int threads, double flops, double seq,
                                  double headSize) const;
  // Ring attention's forward or backward over all of a rank's ring steps, `flops` forward FLOPs (its visible
  // share), `blockKeys` the keys of one block (the sequence's over cp): the ringAttention table read as
  // attentionForwardSeconds reads `attention`. 0 when the profile has no ring table (hasRingAttention).
  double ringAttentionSeconds(bool backward, Precision precision, int threads, double flops, double blockKeys,
                              double headSize) const;
  bool hasRingAttention() const { return !ringAttention.empty(); }
  // Whether the profile measured `kernel` (at any thread count).
  bool hasVectorKernel(VectorKernel kernel) const;
  // The forward or backward of a named elementwise kernel over `rows` rows of `width` elements (gelu and
  // swiglu: the elements rows x width, whatever the split): at each measured width the time is interpolated
  // log-log in the elements rows x width (the ends as profileCurve: the smallest's time below, the largest's
  // rate beyond), then log-linearly in log width between the two measured widths around it (clamped). 0 when
  // the profile did not measure the kernel.
  double vectorKernelSeconds(VectorKernel kernel, bool backward, int threads, double rows,
                             double width) const;
  // An elementwise pass moving `bytes` (reads plus writes); an optimizer step over `params` parameters.
  double elementwiseSeconds(int threads, double bytes) const;
  double optimizerSeconds(int threads, double params) const;
  // The best elementwise rate measured, bytes/s (the memory bandwidth a profile device shows).
  double peakElementwiseRate(int threads) const;

  const LinkProfile* link(const std::string& name) const;
};

// Reads and checks a profile file. Errors name the file and the JSON path ("p.json: /device/gemm/3/seconds:
// must be a number > 0").
Expected<std::shared_ptr<const DeviceProfile>> loadDeviceProfile(const std::string& path);
Expected<std::shared_ptr<const DeviceProfile>> parseDeviceProfile(const nlohmann::json& doc,
                                                                  const std::string& file);

// Loads every profile a config's mesh names ("mesh.profiles"), resolving relative files against the config's
// folder; errors name the field ("/mesh/profiles/0/file: cannot read ...").
Status loadProfiles(RunConfig& config);

}  // namespace ms
