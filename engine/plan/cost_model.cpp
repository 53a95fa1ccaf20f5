// The cost model; see cost_model.h. The formulas, in one place:
//
// Compute (per layer, per microbatch of b samples, on the device of the stage holding the layer): on a
// catalog GPU (plan/gpu_kernel_model.h) or a measured device (plan/device_profile.h), by shape: each of the
// layer's GEMMs (LayerSpec::gemms; n or k / tp) forward and both gradients, the attention core forward and
// backward, and its elementwise passes (bf16 ones half the fp32 bytes on a catalog GPU), backward taking two
// passes per forward one; the LM head's chunked GEMMs all in the forward (profiledLayer below). Otherwise (a
// config's own device type), from FLOPs:
//   forward        = forwardFlopsPerSample * b / (peakFlops(precision) * achievableFraction) / tp
//   backwardInput  = forward (+ forward again for a fully recomputed transformer block: the engine re-runs
//                    the block before its backward; with "recompute_layers" only the first N blocks of
//                    each chunk; embedding and head are not recomputed; + the attention core's forward,
//                    attentionFlopsPerSample, for a block under selective recompute: Korthikanti et al.
//                    2022, section 5, re-runs Q K^T, the softmax and its product with V, 4 b T^2 C FLOPs
//                    (half that causal) per layer; plan/recompute.h)
//   backwardWeight = forward
// except the gpt head, whose training forward runs the LM head's backward fused with the loss
// (runtime/gpt_layers.cpp): forward = 3x its forward FLOPs, backwardInput and backwardWeight = 0 (ln_f's
// backward, a few T*C FLOPs, is not counted, as LayerNorms are not counted elsewhere).
// so a whole backward is 2x forward (the usual 2:1, Narayanan et al. 2021 section 3.5) split evenly between
// input and weight gradients for zero-bubble schedules (Qi et al. 2023, "Zero Bubble Pipeline Parallelism",
// section 2: B and W each about one F). Dividing by tp treats all of a layer's work as split: true for the
// GEMMs, and for attention and its softmax because heads are split; LayerNorm, dropout and the residual are
// really replicated without sequence parallelism (a few percent of a block's FLOPs).
//
// Communication inside compute actions (Modelled only; added to the analytic layer times, never to measured):
//   tensor parallel (tp > 1), all-reduces over the TP group of the layer's output (b * T * C values, bf16
//   under "precision": "bf16" but for an mlp model's), Megatron-LM (Shoeybi et al. 2019, section 3, the f/g
//   operators):
//     transformer block: 2 in forward (after attention and after the MLP), 2 in backward
//     mlp layer: 1 and 1 (a column/row pair needs one all-reduce each way; counted per layer)
//     embedding: 1 in forward (vocab-parallel lookup); head: 1 in backward (the input's gradient)
//   a fully recomputed block repeats its forward ones in backward (selective recompute none: the attention
//   core is local to a TP rank's heads). With sequence parallelism each all-reduce
//   becomes a reduce-scatter plus an all-gather (Korthikanti et al. 2022, section 4.2.2), which costs the
//   same under the ring formulas, so the count stands for a block between two blocks (the activation stays
//   in sequence pieces from one to the next); the last block of the model adds an all-gather of its output
//   in forward and drops one in backward, the first adds one in backward (its input is the embedding's
//   whole output); a block adds the two all-gathers of its LayerNorm outputs (kept as sequence pieces) for
//   its weight gradients, in B or, split, in W.
//   ZeRO-3: an all-gather of each layer's working parameters (/ tp, bf16 in mixed precision) over the DP
//   group before its use in F and in B, issued as the neighbouring layer starts (FSDP's forward and backward
//   prefetch, runtime Model::prefetch): a chunk's first gather is exposed, each later one only where it
//   outlasts the analytic compute of the layer it travels beside. Counted in the compute action; a split
//   backward's W re-gathers every layer (beside the weight parts), counted in W.
//
// Point-to-point: latency + bytes / bandwidth of the link between the two stages' devices; a message is the
// chunk's last layer's output * b (plan.h chunkMessageBytes: bf16 activations under "precision": "bf16",
// whose layer outputs are bf16, fp32 otherwise; the input gradient coming back the same, the engine rounding
// every layer's input gradient to bf16 as Megatron keeps activation gradients; / tp with sequence
// parallelism, where the activation between stages is sequence-split).
//
// Gradient sync of chunk k over the DP group: bytes = params(k) / tp * gradient bytes per element
// (plan/model_state.h: 4 for fp32 gradients, 2 for bf16 ones); one ring all-reduce per step for ZeRO 0 and 1
// (Megatron's), one ring reduce-scatter per microbatch for ZeRO 2 and 3 (DeepSpeed's: the full gradients are
// freed after each; the engine's reduceGrads), all M of them in the chunk's GradSync action (pessimistic:
// M - 1 of them overlap later microbatches' compute in the engine). A tied LM head on another stage than the
// embedding adds an all-reduce of wte's gradient between those two stages to both chunks' syncs (Megatron's
// embedding group).
//
// Optimizer step of a stage: every state byte of its parameter shard read once, (parameter + gradient +
// optimizer bytes per element, and in mixed precision the bf16 working copy written) * params / tp / (dp with
// ZeRO >= 1) / memoryBandwidth (a memory-bound pass; on a catalog GPU at its fused AdamW's measured fraction
// of it, on a measured device from its optimizer curve), plus for ZeRO 1 and 2 the all-gather of the updated
// working parameters (bf16 in mixed precision) over the
// DP group (ZeRO-3 keeps them sharded and gathers before use instead).
// With "offload": "optimizer" (ZeRO-Offload, Ren et al. 2021, section 4: gradients to the host, the step on
// the host's CPU, bf16 parameters back) the step instead moves the owned gradients down (gradient bytes per
// element) and the updated bf16 slice up (2) over the device<->host link (DeviceSpec::hostLinkBandwidth, the
// PCIe figure), and streams the host's state (fp32 gradient copy read, master read and written, moments read
// and written, the bf16 slice written) at the device's share of the host's DRAM bandwidth; no overlap with
// the backward is modelled (ZeRO-Offload's delayed parameter update is not what the engine does).
// "parameters" (ZeRO-3) instead uploads each chunk's bf16 shard before every gather (forward and backward)
// and downloads each microbatch's reduced gradient shard, inside the compute actions like the gathers.
#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

#include "plan/memory_model.h"
#include "plan/model_state.h"
#include "plan/recompute.h"
#include "plan/tp_overlap.h"

namespace ms {

double p2pTime(double bytes, const LinkSpec& link) {
  if (link.profile) return link.profile->seconds(CollectiveOp::SendRecv, std::max(bytes, 1.0), 2);
  return link.latency + (link.bandwidth > 0 ? bytes / link.bandwidth : 0.0);
}

double ringAllReduceTime(double bytes, int n, const LinkSpec& link) {
  if (n <= 1) return 0.0;
  if (link.profile) return link.profile->seconds(CollectiveOp::AllReduce, std::max(bytes, 1.0), n);
  const double factor = 2.0 * (n - 1) / n;  // nccl-tests busbw factor for all-reduce
  return (link.bandwidth > 0 ? factor * bytes / link.bandwidth : 0.0) + 2.0 * (n - 1) * link.latency;
}

double smallAllReduceTime(double bytes, int n, const LinkSpec& link) {
  if (n <= 1) return 0.0;
  if (link.profile) return link.profile->seconds(CollectiveOp::AllReduce, std::max(bytes, 1.0), n);
  const double hops = 2.0 * std::ceil(std::log2(double(n)));
  const double tree = (link.bandwidth > 0 ? 2.0 * bytes / link.bandwidth : 0.0) + hops * link.latency;
  return std::min(tree, ringAllReduceTime(bytes, n, link));
}

double ringReduceScatterTime(double bytes, int n, const LinkSpec& link) {
  if (n <= 1) return 0.0;
  if (link.profile) return link.profile->seconds(CollectiveOp::ReduceScatter, std::max(bytes, 1.0), n);
  const double factor = double(n - 1) / n;  // nccl-tests busbw factor for reduce-scatter and all-gather
  return (link.bandwidth > 0 ? factor * bytes / link.bandwidth : 0.0) + (n - 1) * link.latency;
}

double ringAllGatherTime(double bytes, int n, const LinkSpec& link) {
  if (n > 1 && link.profile) return link.profile->seconds(CollectiveOp::AllGather, std::max(bytes, 1.0), n);
  return ringReduceScatterTime(bytes, n, link);
}

double allToAllTime(double bytes, int n, const LinkSpec& link) {
  if (n <= 1) return 0.0;
  if (link.profile) return link.profile->seconds(CollectiveOp::AllToAll, std::max(bytes, 1.0), n);
  return (link.bandwidth > 0 ? double(n - 1) / n * bytes / link.bandwidth : 0.0) + (n - 1) * link.latency;
}

const LinkSpec& groupLink(const Plan& plan, const std::vector<int>& ranks) {
  const auto& deviceOf = plan.layout.deviceOf;
  const auto nodeOf = [&](int rank) { return plan.mesh.devices[static_cast<size_t>(deviceOf[rank])].node; };
  for (int r : ranks)
    if (r < 0 || r >= static_cast<int>(deviceOf.size())) return plan.mesh.intraLink;
  for (size_t i = 1; i < ranks.size(); ++i)
    if (nodeOf(ranks[i]) != nodeOf(ranks[0])) return plan.mesh.interLink;
  return plan.mesh.intraLink;
}

LinkSpec railLink(const LinkSpec& inter, const LinkSpec& intra, int membersPerNode) {
  LinkSpec link = inter;
  const int g = membersPerNode;
  if (!inter.perDevice || inter.profile || g <= 1) return link;
  link.bandwidth = g * inter.bandwidth;
  if (intra.bandwidth > 0) link.bandwidth = std::min(link.bandwidth, g / (g - 1.0) * intra.bandwidth);
  return link;
}

LinkSpec ringLink(const Plan& plan, const std::vector<int>& ranks) {
  const LinkSpec& link = groupLink(plan, ranks);
  if (&link != &plan.mesh.interLink || !link.perDevice) return link;
  std::map<int, int> perNode;  // node -> members
  for (int r : ranks) ++perNode[plan.mesh.devices[static_cast<size_t>(plan.layout.deviceOf[r])].node];
  int fewest = static_cast<int>(ranks.size());
  for (const auto& [node, members] : perNode) fewest = std::min(fewest, members);
  return railLink(link, plan.mesh.intraLink, fewest);
}

namespace {

// The link between the devices of two stages' representative ranks.
const LinkSpec& stageLink(const Plan& plan, int a, int b) {
  return groupLink(plan, {replicaRank(plan, a), replicaRank(plan, b)});
}

// Tensor-parallel all-reduces of a layer's output per microbatch, forward and backward (see the file
// comment).
struct TpCollectives {
  int forward = 0;
  int backward = 0;
};
TpCollectives tpCollectives(const LayerSpec& layer, ModelType model) {
  switch (layer.kind) {
    case LayerKind::Block:
      return isTransformer(model) ? TpCollectives{2, 2} : TpCollectives{1, 1};
    case LayerKind::Embedding:
      return {1, 0};
    case LayerKind::Head:
      return {0, 1};
  }
  return {};
}

std::vector<int> layerChunks(const Plan& plan) {
  std::vector<int> chunkOf(plan.model.layers.size(), 0);
  for (size_t k = 0; k < plan.partition.chunks.size(); ++k)
    for (int l : plan.partition.chunks[k]) chunkOf[static_cast<size_t>(l)] = static_cast<int>(k);
  return chunkOf;
}

bool validTime(double t) {
  return std::isfinite(t) && t >= 0;
}

// How a rank runs on a measured device: the thread count it gets, as the engine gives it
// (runtime/trainer.h threadsPerRank: training.threads, else the node's cores over its ranks), and how much
// slower it runs when the node's ranks ask for more threads than it has cores (all busy at once, sharing
// the cores evenly).
struct RankShare {
  int threads = 1;
  double slowdown = 1.0;
};
RankShare rankShare(const Plan& plan, int rank, const DeviceProfile& profile) {
  const auto& deviceOf = plan.layout.deviceOf;
  int onNode = 1;
  if (rank >= 0 && rank < static_cast<int>(deviceOf.size())) {
    const int node = plan.mesh.devices[static_cast<size_t>(deviceOf[static_cast<size_t>(rank)])].node;
    onNode = 0;
    for (int d : deviceOf) onNode += plan.mesh.devices[static_cast<size_t>(d)].node == node ? 1 : 0;
  }
  const int cores = std::max(1, profile.cores);
  const int threads =
      plan.config.training.threads > 0 ? plan.config.training.threads : std::max(1, cores / onNode);
  return {threads, std::max(1.0, double(onNode) * threads / cores)};
}

// A repeat count for people: "8", "2.5".
std::string countText(double n) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", n);
  return text;
}

// What a layer's kernels take on a device that times them by shape: a measured profile's curves at the
// rank's thread count, or a catalog GPU's kernel model.
struct KernelTimes {
  virtual ~KernelTimes() = default;
  virtual double gemm(double m, double n, double k) const = 0;
  // A linear layer's backward GEMMs, given the forward's shape (m rows, n outputs, k inputs). By default
  // each is the forward GEMM of its own product's shape (what a GPU's kernel model costs); a measured
  // profile has their own curves (DeviceProfile GemmOp).
  virtual double gemmInputGradient(double m, double n, double k) const { return gemm(m, k, n); }
  virtual double gemmWeightGradient(double m, double n, double k) const { return gemm(k, n, m); }
  // The same three for a weight kept (n x k) (GemmShape::transposedWeight); by default as the (k x n)
  // layout's (a GPU's kernel model does not tell the layouts apart).
  virtual double gemmT(double m, double n, double k) const { return gemm(m, n, k); }
  virtual double gemmTInputGradient(double m, double n, double k) const { return gemmInputGradient(m, n, k); }
  virtual double gemmTWeightGradient(double m, double n, double k) const {
    return gemmWeightGradient(m, n, k);
  }
  virtual double attentionForward(double flops, double keys, double headSize) const = 0;
  virtual double attentionBackward(double flops, double keys, double headSize) const = 0;
  virtual double elementwise(double bytes) const = 0;  // bytes as LayerSpec counts them (fp32 elements)
  // A named elementwise kernel's forward or backward (VectorKernelUse), when the device times it by name
  // (a profile that measured it); otherwise nothing, and it is one of the layer's elementwise passes.
  virtual std::optional<double> vectorKernel(VectorKernel, bool /*backward*/, double /*rows*/,
                                             double /*width*/) const {
    return std::nullopt;
  }
  // Ring attention's block kernels over a context-parallel rank's steps (DeviceProfile::ringAttention), when
  // the device measured them; otherwise nothing, and ring attention is the fused kernel's FLOPs.
  virtual std::optional<double> ringAttention(bool /*backward*/, double /*flops*/, double /*blockKeys*/,
                                              double /*headSize*/) const {
    return std::nullopt;
  }
};

struct ProfileTimes final : KernelTimes {
  ProfileTimes(const DeviceProfile& profile, Precision precision, int threads)
      : profile(profile), precision(precision), threads(threads) {}
  double gemm(double m, double n, double k) const override {
    return profile.gemmSeconds(precision, threads, m, n, k);
  }
  double gemmInputGradient(double m, double n, double k) const override {
    return profile.gemmSeconds(GemmOp::InputGradient, precision, threads, m, n, k);
  }
  double gemmWeightGradient(double m, double n, double k) const override {
    return profile.gemmSeconds(GemmOp::WeightGradient, precision, threads, m, n, k);
  }
  // A (n x k) weight's GEMMs are the measured ops of the layer (m, k, n) (kernels/cpu/linear.cpp): its
  // forward inp @ W^T is that layer's input gradient's product (an NT GEMM), its input gradient dout @ W that
  // layer's forward (NN), its weight gradient dout^T @ inp (TN) that layer's weight gradient with the
  // operands swapped. Measured in the suite's one-rank llama (2026-11-29, the Intel VM): the 256 x 32 x 32
  // forward took 13.7 us as linearForwardT, where the forward curve gave 4.1 us.
  double gemmT(double m, double n, double k) const override {
    return profile.gemmSeconds(GemmOp::InputGradient, precision, threads, m, k, n);
  }
  double gemmTInputGradient(double m, double n, double k) const override {
    return profile.gemmSeconds(GemmOp::Forward, precision, threads, m, k, n);
  }
  double gemmTWeightGradient(double m, double n, double k) const override {
    return profile.gemmSeconds(GemmOp::WeightGradient, precision, threads, m, k, n);
  }
  double attentionForward(double flops, double keys, double headSize) const override {
    return profile.attentionForwardSeconds(precision, threads, flops, keys, headSize);
  }
  double attentionBackward(double flops, double keys, double headSize) const override {
    return profile.attentionBackwardSeconds(precision, threads, flops, keys, headSize);
  }
  double elementwise(double bytes) const override { return profile.elementwiseSeconds(threads, bytes); }
  std::optional<double> vectorKernel(VectorKernel kernel, bool backward, double rows,
                                     double width) const override {
    if (!profile.hasVectorKernel(kernel)) return std::nullopt;
    return profile.vectorKernelSeconds(kernel, backward, threads, rows, width);
  }
  std::optional<double> ringAttention(bool backward, double flops, double blockKeys,
                                      double headSize) const override {
    if (!profile.hasRingAttention()) return std::nullopt;
    return profile.ringAttentionSeconds(backward, precision, threads, flops, blockKeys, headSize);
  }
  const DeviceProfile& profile;
  Precision precision;
  int threads;
};

// A catalog GPU: bf16 runs its GEMMs, attention and elementwise passes on bf16 tensors (2-byte elements, half
// the fp32 bytes LayerSpec counts), fp32 on fp32 ones at the fp32 peak.
struct CatalogTimes final : KernelTimes {
  CatalogTimes(const DeviceSpec& device, Precision precision)
      : model(*device.kernels),
        peak(device.peakFlops(precision)),
        bandwidth(device.memoryBandwidth),
        elementBytes(precision == Precision::Bf16 ? 2.0 : 4.0) {}
  double gemm(double m, double n, double k) const override {
    return model.gemmSeconds(peak, bandwidth, elementBytes, m, n, k);
  }
  double attentionForward(double flops, double keys, double) const override {
    return model.attentionForwardSeconds(peak, flops, keys);
  }
  double attentionBackward(double flops, double keys, double) const override {
    return model.attentionBackwardSeconds(peak, flops, keys);
  }
  double elementwise(double bytes) const override {
    return model.elementwiseSeconds(bandwidth, bytes * elementBytes / 4.0);
  }
  const GpuKernelModel& model;
  double peak, bandwidth, elementBytes;
};

// A layer's compute by shape, per microbatch of mbs samples (LayerSpec::gemms and the fields beside it):
// each GEMM by its shape, attention and the elementwise passes from their curves; `slowdown` stretches all
// of it (a measured CPU's ranks sharing its cores).
struct ProfiledLayer {
  double forward = 0, backwardInput = 0, backwardWeight = 0;
  double attentionForward = 0;  // part of forward: what selective recomputation repeats
};
ProfiledLayer profiledLayer(const LayerSpec& layer, const KernelTimes& times, double slowdown, double mbs,
                            int tp, int ep, int cp, int64_t headChunkRowsSet,
                            std::vector<KernelCost>* record = nullptr) {
  ProfiledLayer t;
  const auto note = [&](std::string what, double flops, double seconds) {
    if (record) record->push_back({std::move(what), flops, seconds * slowdown, 0.0});
  };
  double forward = 0, input = 0, weight = 0, fused = 0;
  for (const GemmShape& g : layer.gemms) {
    double m = g.rows * mbs;
    double n = double(g.n), k = double(g.k);
    if (g.split == GemmShape::Split::Output) n /= tp;
    if (g.split == GemmShape::Split::Input) k /= tp;
    double count = 1;
    if (g.expert && layer.experts > 0) {
      // Balanced routing: each of the rank's E / ep experts gets its share of all ep ranks' rows.
      count = double(layer.experts) / std::max(1, ep);
      m = std::max(1.0, m * ep / layer.experts);
    }
    if (g.chunked) {
      const double rows =
          double(headChunkRows(static_cast<int64_t>(m), static_cast<int64_t>(n), headChunkRowsSet));
      count *= m / rows;
      m = rows;
    }
    const bool t = g.transposedWeight;
    const double f = count * (t ? times.gemmT(m, n, k) : times.gemm(m, n, k));
    {
      char shape[96];
      std::snprintf(shape, sizeof shape, "GEMM %.0f x %.0f x %.0f", m, n, k);
      note(count == 1 ? std::string(shape) : countText(count) + " x " + shape, 2.0 * count * m * n * k, f);
    }
    const double dx = g.inputGradient
                          ? count * (t ? times.gemmTInputGradient(m, n, k) : times.gemmInputGradient(m, n, k))
                          : 0.0;
    const double dw = count * (t ? times.gemmTWeightGradient(m, n, k) : times.gemmWeightGradient(m, n, k));
    if (g.chunked) {
      fused += f + dx + dw;
    } else {
      forward += f;
      input += dx;
      weight += dw;
    }
  }
  if (layer.attentionFlopsPerSample > 0) {
    const double flops = layer.attentionFlopsPerSample * mbs / tp;
    // Context parallelism: the ring's block kernels at a block's keys (a cp-th of the sequence's).
    std::optional<double> ringForward, ringBackward;
    if (layer.ringAttention && cp > 1) {
      ringForward = times.ringAttention(false, flops, layer.attentionKeys / cp, layer.attentionHeadSize);
      ringBackward = times.ringAttention(true, flops, layer.attentionKeys / cp, layer.attentionHeadSize);
    }
    t.attentionForward = ringForward
                             ? *ringForward
                             : times.attentionForward(flops, layer.attentionKeys, layer.attentionHeadSize);
    note(ringForward ? "ring attention" : "attention", flops, t.attentionForward);
    forward += t.attentionForward;
    input += ringBackward ? *ringBackward
                          : times.attentionBackward(flops, layer.attentionKeys, layer.attentionHeadSize);
  }
  double bytes = (layer.elementwiseBytesPerSample + layer.splitElementwiseBytesPerSample / tp) * mbs;
  double passes = std::max(1, layer.elementwisePasses);
  // The kernels the device times by name leave the passes (and their bytes) for their own curves.
  for (const VectorKernelUse& v : layer.vectorKernels) {
    const double rows = v.rowsPerSample * mbs, width = v.split ? v.width / tp : v.width;
    const std::optional<double> f = times.vectorKernel(v.kind, false, rows, width);
    const std::optional<double> b = times.vectorKernel(v.kind, true, rows, width);
    if (!f || !b) continue;
    forward += *f;
    input += *b;
    using Kind = VectorKernel;
    note(v.kind == Kind::Gelu      ? "GELU"
         : v.kind == Kind::RmsNorm ? "RMSNorm"
         : v.kind == Kind::Swiglu  ? "SwiGLU"
         : v.kind == Kind::Rope    ? "RoPE"
                                   : "LayerNorm",
         0.0, *f);
    bytes -= v.bytesPerElement() * rows * width;
    passes -= 1;
  }
  if (bytes > 0 && passes > 0) {
    forward += passes * times.elementwise(bytes / passes);
    note(countText(passes) + " elementwise passes", 0.0, passes * times.elementwise(bytes / passes));
    input += 2.0 * passes * times.elementwise(bytes / passes);
  }
  if (fused > 0) {  // the fused LM head: its whole backward runs in the training forward
    forward += fused + input + weight;
    input = weight = 0;
  }
  t.forward = forward * slowdown;
  t.backwardInput = input * slowdown;
  t.backwardWeight = weight * slowdown;
  t.attentionForward *= slowdown;
  return t;
}

// A layer timed by shape on the stage's device, when the device can (a profile or a kernel model) and the
// layer lists its kernels (every model's layers do); `record` collects its forward's kernels.
std::optional<ProfiledLayer> layerByShape(const Plan& plan, int stage, const LayerSpec& layer, double mbs,
                                          std::vector<KernelCost>* record = nullptr) {
  if (layer.gemms.empty() && layer.elementwiseBytesPerSample <= 0) return std::nullopt;
  const ParallelConfig& p = plan.config.parallel;
  const DeviceSpec& device = stageDevice(plan, stage);
  const int tp = std::max(1, p.tp);
  if (device.profile) {
    const RankShare share = rankShare(plan, replicaRank(plan, stage), *device.profile);
    return profiledLayer(layer, ProfileTimes(*device.profile, p.precision, share.threads), share.slowdown,
                         mbs, tp, p.ep, std::max(1, p.cp), plan.config.training.headChunkRows, record);
  }
  if (device.kernels)
    return profiledLayer(layer, CatalogTimes(device, p.precision), 1.0, mbs, tp, p.ep, std::max(1, p.cp),
                         plan.config.training.headChunkRows, record);
  return std::nullopt;
}

// tp_comm_overlap (plan/tp_overlap.h): a transformer block's GEMM time, per microbatch on the stage's device,
// beside each of its sequence-parallel collectives. Forward: the column-parallel group (q|k|v, the MLP's
// first GEMMs) after each all-gather, the row-parallel GEMM (proj, the MLP's output) before each
// reduce-scatter. Backward: the input gradients of the MLP's first group and of q|k|v before their
// reduce-scatters, of proj after the all-gather of its output's gradient, and of the MLP's output after the
// all-gather of the block output's gradient (where the output is a sequence piece). A mixture-of-experts
// block's MLP runs without the overlap (mlp false), as the engine runs it.
struct OverlapGemms {
  double qkv = 0, proj = 0, fc = 0, fcproj = 0;      // forward
  double dFc = 0, dProj = 0, dQkv = 0, dFcproj = 0;  // backward, input gradients
  bool mlp = false;
};
OverlapGemms overlapGemms(const Plan& plan, int stage, const LayerSpec& layer, double mbs) {
  const ParallelConfig& p = plan.config.parallel;
  const DeviceSpec& device = stageDevice(plan, stage);
  const int tp = std::max(1, p.tp);
  std::optional<RankShare> share;
  if (device.profile) share = rankShare(plan, replicaRank(plan, stage), *device.profile);
  const double rate = device.peakFlops(p.precision) * device.achievableFraction;
  // The forward GEMM (input = false) or the input gradient's, at the forward's shape.
  const auto gemm = [&](double m, double n, double k, bool input = false) {
    if (share) {
      const ProfileTimes times(*device.profile, p.precision, share->threads);
      return (input ? times.gemmInputGradient(m, n, k) : times.gemm(m, n, k)) * share->slowdown;
    }
    if (device.kernels) {
      const CatalogTimes times(device, p.precision);
      return input ? times.gemmInputGradient(m, n, k) : times.gemm(m, n, k);
    }
    return rate > 0 ? 2.0 * m * n * k / rate : 0.0;
  };
  OverlapGemms o;
  o.mlp = layer.experts == 0;
  int group = 0;  // 0 q|k|v, 1 proj, 2 the MLP's first, 3 its output
  for (const GemmShape& g : layer.gemms) {
    if (g.expert || g.split == GemmShape::Split::None) continue;
    if (g.split == GemmShape::Split::Input ? group % 2 == 0 : group % 2 == 1) ++group;
    const double m = g.rows * mbs;
    const double n = g.split == GemmShape::Split::Output ? double(g.n) / tp : double(g.n);
    const double k = g.split == GemmShape::Split::Input ? double(g.k) / tp : double(g.k);
    const double f = gemm(m, n, k), dx = g.inputGradient ? gemm(m, n, k, true) : 0.0;
    switch (group) {
      case 0:
        o.qkv += f, o.dQkv += dx;
        break;
      case 1:
        o.proj += f, o.dProj += dx;
        break;
      case 2:
        o.fc += f, o.dFc += dx;
        break;
      default:
        o.fcproj += f, o.dFcproj += dx;
        break;
    }
  }
  return o;
}

// What a collective of `comm` seconds split into n chunks leaves exposed beside `gemm` seconds of GEMM rows
// split alike: all-gather chunks queue on the link and each chunk's rows wait for it (the last rows end at
// max(comm + gemm / n, comm / n + gemm)); a reduce-scatter's chunks queue behind their rows, symmetrically.
double exposedBeside(double comm, double gemm, int n) {
  n = std::max(1, n);
  return std::max(comm / n, comm - gemm * (n - 1) / n);
}
// The same reduce-scatter with a whole collective of `first` seconds started just before it, on the same
// link: the chunks queue behind it too, so the last one ends at max(first + comm, gemm / n + comm,
// gemm + comm / n), and the GEMM rows end at gemm.
double exposedAfter(double first, double comm, double gemm, int n) {
  n = std::max(1, n);
  return std::max({comm / n, first + comm - gemm, comm - gemm * (n - 1) / n});
}

}  // namespace

std::vector<KernelCost> layerForwardKernels(const Plan& plan, int layer) {
  std::vector<KernelCost> kernels;
  if (layer < 0 || layer >= static_cast<int>(plan.model.layers.size())) return kernels;
  const int stage =
      plan.partition.stageOf[static_cast<size_t>(layerChunks(plan)[static_cast<size_t>(layer)])];
  if (!layerByShape(plan, stage, plan.model.layers[static_cast<size_t>(layer)], plan.microbatchSize(),
                    &kernels))
    return {};
  const double peak = stageDevice(plan, stage).peakFlops(plan.config.parallel.precision);
  for (KernelCost& k : kernels)
    k.fractionOfPeak = k.seconds > 0 && peak > 0 ? k.flops / k.seconds / peak : 0.0;
  return kernels;
}

CostModel::CostModel(const Plan& plan, Communication communication) : m_communication(communication) {
  const ParallelConfig& p = plan.config.parallel;
  const ModelSpec& model = plan.model;
  const size_t L = model.layers.size();
  const int K = static_cast<int>(plan.partition.chunks.size());
  // dp: the parameters' replicas, the context-parallel slices of each included (RankLayout::dpCpGroup).
  const int tp = std::max(1, p.tp), dp = std::max(1, p.dataReplicas());
  const double mbs = plan.microbatchSize();
  const bool modelled = communication == Communication::Modelled;
  m_chunks = plan.partition.chunks;
  m_split = plan.schedule.splitBackward;
  const RecomputePolicy recompute = RecomputePolicy::of(p);

  // Analytic compute per layer, on the device of the stage holding it.
  const std::vector<int> chunkOf = layerChunks(plan);
  m_analytic.forward.assign(L, 0.0);
  m_analytic.backwardInput.assign(L, 0.0);
  m_analytic.backwardWeight.assign(L, 0.0);
  for (size_t l = 0; l < L; ++l) {
    const int stage = plan.partition.stageOf[static_cast<size_t>(chunkOf[l])];
    const DeviceSpec& device = stageDevice(plan, stage);
    const LayerSpec& layer = model.layers[l];
    if (const std::optional<ProfiledLayer> shaped = layerByShape(plan, stage, layer, mbs)) {
      // A measured device or a catalog GPU: by shape.
      const ProfiledLayer& t = *shaped;
      double again = 0.0;
      if (fullyRecomputed(recompute, model, m_chunks[static_cast<size_t>(chunkOf[l])], static_cast<int>(l)))
        again = t.forward;
      else if (recomputesAttention(recompute, plan.config.model.type, layer.kind, model.samplePositions,
                                   fusedAttention(plan, stage) || layer.ringAttention))
        again = t.attentionForward;
      m_analytic.forward[l] = t.forward;
      m_analytic.backwardInput[l] = t.backwardInput + again;
      m_analytic.backwardWeight[l] = t.backwardWeight;
      continue;
    }
    const double rate = device.peakFlops(p.precision) * device.achievableFraction;
    const double f = rate > 0 ? model.layers[l].forwardFlopsPerSample * mbs / rate / tp : 0.0;
    if (layer.kind == LayerKind::Head && isLanguageModel(plan.config.model.type)) {
      m_analytic.forward[l] = 3.0 * f;
      continue;
    }
    m_analytic.forward[l] = f;
    double again = 0.0;  // what backward re-runs of the forward
    if (fullyRecomputed(recompute, model, m_chunks[static_cast<size_t>(chunkOf[l])], static_cast<int>(l)))
      again = f;
    else if (recomputesAttention(recompute, plan.config.model.type, layer.kind, model.samplePositions,
                                 fusedAttention(plan, stage) || layer.ringAttention))
      again = rate > 0 ? layer.attentionFlopsPerSample * mbs / rate / tp : 0.0;
    m_analytic.backwardInput[l] = f + again;
    m_analytic.backwardWeight[l] = f;
  }
  m_layers = m_analytic;

  // Communication inside compute actions, per chunk.
  const std::vector<double> params = chunkLocalParameterCount(plan);  // as one TP rank holds them
  // Expert parallelism: of which the local experts', summed over and ZeRO-sharded over dp / ep replicas.
  const std::vector<double> expertParams = chunkLocalExpertParameterCount(plan);
  const int edp = std::max(1, dp / std::max(1, p.ep));
  const std::vector<double> gathered = p.zero == 3 ? zero3LayerParams(plan) : std::vector<double>{};
  const ModelStateLayout state = modelStateLayout(p, plan.config.optimizer);
  // Whether each stage's collectives progress beside its compute (collectivesOverlapCompute).
  m_overlaps.assign(static_cast<size_t>(plan.partition.stages), true);
  for (int s = 0; s < plan.partition.stages; ++s) {
    const DeviceSpec& device = stageDevice(plan, s);
    m_overlaps[static_cast<size_t>(s)] =
        !(device.name == "cpu" || (device.profile && device.profile->backend == "cpu"));
  }
  m_chunkForwardComm.assign(static_cast<size_t>(K), 0.0);
  m_chunkBackwardComm.assign(static_cast<size_t>(K), 0.0);
  m_chunkWeightComm.assign(static_cast<size_t>(K), 0.0);
  m_chunkHostUpload.assign(static_cast<size_t>(K), 0.0);
  m_chunkHostDownload.assign(static_cast<size_t>(K), 0.0);
  for (int k = 0; k < K && modelled; ++k) {
    const int stage = plan.partition.stageOf[static_cast<size_t>(k)];
    const int rank = replicaRank(plan, stage);
    if (tp > 1) {
      const LinkSpec link = ringLink(plan, plan.layout.tpGroup(rank));
      for (int l : m_chunks[static_cast<size_t>(k)]) {
        const LayerSpec& layer = model.layers[static_cast<size_t>(l)];
        const TpCollectives c = tpCollectives(layer, plan.config.model.type);
        // The head's backward all-reduce is of its input, the previous layer's output; the collectives move
        // activations in their precision (bf16 under "precision": "bf16"), but an mlp model's (fp32).
        const bool mlp = !isTransformer(plan.config.model.type);  // mlp and cnn: fp32 activations
        const bool transformerBlock = layer.kind == LayerKind::Block && !mlp;
        const LayerSpec& moved =
            layer.kind == LayerKind::Head && l > 0 ? model.layers[static_cast<size_t>(l - 1)] : layer;
        const double outBytes =
            mlp ? double(moved.outputBytesPerSample) : moved.outputBytesPerSampleIn(p.precision);
        const double t = ringAllReduceTime(outBytes * mbs, tp, link);
        double forward = c.forward * t, backward = c.backward * t;
        // Under sequence parallelism a block's input and output are sequence pieces where its neighbour is
        // a block (LayerSpec::inputPieces, outputPieces; Megatron's layout). A whole output is gathered at
        // the end of forward; backward gathers the gradient of an output in pieces (for the MLP's output
        // GEMM) and of a whole input (for the layer before). A block between two blocks thus runs two
        // all-gathers and two reduce-scatters each way, the count above.
        const bool sp = p.sequenceParallel && transformerBlock;
        const bool inPieces = sp && layer.inputPieces > 1, outPieces = sp && layer.outputPieces > 1;
        const double ag = sp ? ringAllGatherTime(outBytes * mbs, tp, link) : 0.0;
        if (sp) backward += (outPieces ? ag : 0.0) + (inPieces ? 0.0 : ag) - ag;
        int lnGathersBeside = 0;  // of the two LayerNorm re-gathers below, those costed in `backward`
        if (p.tpCommOverlap && sp && m_overlaps[static_cast<size_t>(stage)]) {
          // tp_comm_overlap (plan/tp_overlap.h, runtime/transformer.cpp): forward's two all-gathers and two
          // reduce-scatters each beside its GEMM group, chunk by chunk; backward's two reduce-scatters and
          // the all-gathers of proj's output gradient and of the block output's gradient likewise, the
          // gather of a whole input's gradient not. A mixture-of-experts block's MLP collectives stay whole.
          const double rs = ringReduceScatterTime(outBytes * mbs, tp, link);
          const OverlapGemms g = overlapGemms(plan, stage, layer, mbs);
          const int mb = std::max(1, static_cast<int>(std::lround(mbs)));
          const int n = mb * tpOverlapSplits(mb, std::max(1, model.samplePositions / tp));
          forward = exposedBeside(ag, g.qkv, n) + exposedBeside(rs, g.proj, n) +
                    (g.mlp ? exposedBeside(ag, g.fc, n) + exposedBeside(rs, g.fcproj, n) : ag + rs);
          // Unless the backward is split, each LayerNorm output's re-gather for the weight gradients is
          // started before the reduce-scatters of the input gradient it belongs to (the MLP's first group's
          // and q|k|v's) and queues ahead of them on the link (Megatron-LM's bulk overlap of it with the
          // input-gradient GEMM).
          const bool bulk = !plan.schedule.splitBackward;
          const auto inputGradient = [&](double gemm) {
            return bulk ? exposedAfter(ag, rs, gemm, n) : exposedBeside(rs, gemm, n);
          };
          backward = (outPieces ? (g.mlp ? exposedBeside(ag, g.dFcproj, n) : ag) : 0.0) +
                     (g.mlp ? inputGradient(g.dFc) : rs) + exposedBeside(ag, g.dProj, n) +
                     inputGradient(g.dQkv) + (inPieces ? 0.0 : ag);
          if (bulk) lnGathersBeside = g.mlp ? 2 : 1;
        }
        if (sp && !outPieces) forward += ag;
        m_chunkForwardComm[static_cast<size_t>(k)] += forward;
        const bool again = fullyRecomputed(recompute, model, m_chunks[static_cast<size_t>(k)], l);
        m_chunkBackwardComm[static_cast<size_t>(k)] += backward + (again ? forward : 0);
        // Sequence parallelism keeps a block's two LayerNorm outputs as sequence pieces and gathers them
        // again for the weight gradients (Korthikanti et al. 2022, section 4.2.2): two all-gathers of T * C
        // per sample in the kept precision, in B, or in W where the backward is split; whole, but for those
        // tp_comm_overlap sends beside the input gradients (above).
        if (p.sequenceParallel && transformerBlock) {
          const double ln = layer.outputBytesPerSampleIn(p.precision) * mbs;
          (plan.schedule.splitBackward ? m_chunkWeightComm : m_chunkBackwardComm)[static_cast<size_t>(k)] +=
              (2.0 - lnGathersBeside) * ringAllGatherTime(ln, tp, link);
        }
      }
    }
    if (p.ep > 1) {
      // Expert parallelism (runtime/moe.h): each mixture-of-experts block sends its routed rows to the
      // experts' ranks and takes the outputs back, two all-to-alls of the k * T rows (C values each, bf16
      // under "precision": "bf16", else fp32) a sample in forward, two more of their gradients in backward
      // (and forward's again where the block is recomputed); balanced routing assumed. Plus the row counts'
      // exchange, one latency each time.
      const LinkSpec& link = groupLink(plan, plan.layout.epGroup(rank));
      const ModelConfig& m = plan.config.model;
      for (int l : m_chunks[static_cast<size_t>(k)]) {
        const LayerSpec& layer = model.layers[static_cast<size_t>(l)];
        if (layer.kind != LayerKind::Block || layer.expertParamCount == 0) continue;
        const double rows = double(model.samplePositions) * m.expertsPerToken * mbs;
        const double pair =
            2.0 * allToAllTime(rows * m.width * activationElementBytes(p.precision), p.ep, link) +
            (p.ep - 1) * link.latency;
        m_chunkForwardComm[static_cast<size_t>(k)] += pair;
        const bool again = fullyRecomputed(recompute, model, m_chunks[static_cast<size_t>(k)], l);
        m_chunkBackwardComm[static_cast<size_t>(k)] += (again ? 2.0 : 1.0) * pair;
      }
    }
    if (p.cp > 1) {
      // Context parallelism (runtime/transformer.cpp, ring attention): in forward each block passes its
      // keys and values, the T/cp positions' grouped-query heads (2 KV hs / tp values each, bf16 under
      // "precision": "bf16"), to the next rank of the ring cp - 1 times, each transfer beside the attention
      // of the block in hand (1/cp of the layer's attention FLOPs: the load-balanced chunks give every step
      // about the same share), so only what a transfer outlasts that compute is exposed (Liu et al. 2023,
      // section 3: "overlapping the communication of key-value blocks with the computation of blockwise
      // attention"). Backward passes the blocks again beside twice that compute, and after each of the cp
      // steps waits for the dK|dV accumulator (fp32, same shape) to reach the next rank: cp exposed
      // transfers.
      const LinkSpec& link = groupLink(plan, plan.layout.cpGroup(rank));
      const int stageHere = plan.partition.stageOf[static_cast<size_t>(k)];
      const DeviceSpec& device = stageDevice(plan, stageHere);
      const double rate = device.peakFlops(p.precision) * device.achievableFraction;
      for (int l : m_chunks[static_cast<size_t>(k)]) {
        const LayerSpec& layer = model.layers[static_cast<size_t>(l)];
        if (!layer.ringAttention) continue;
        const ModelConfig& m = plan.config.model;
        const double values =
            mbs * double(model.samplePositions) * 2.0 * m.kvHeadCount() * (m.width / m.heads) / tp;
        const double flops = layer.attentionFlopsPerSample * mbs / tp / p.cp;
        double step = rate > 0 ? flops / rate : 0.0;
        if (device.kernels)  // a catalog GPU's attention rate at the block's keys (a cp-th of the sequence's)
          step = CatalogTimes(device, p.precision)
                     .attentionForward(flops, layer.attentionKeys / p.cp, layer.attentionHeadSize);
        const double transfer = p2pTime(values * activationElementBytes(p.precision), link);
        const double gradients = p2pTime(values * 4.0, link);
        const double forward = (p.cp - 1) * std::max(0.0, transfer - step);
        const double backward = (p.cp - 1) * std::max(0.0, transfer - 2.0 * step) + p.cp * gradients;
        m_chunkForwardComm[static_cast<size_t>(k)] += forward;
        const bool again = fullyRecomputed(recompute, model, m_chunks[static_cast<size_t>(k)], l);
        m_chunkBackwardComm[static_cast<size_t>(k)] += backward + (again ? forward : 0.0);
      }
    }
    if (p.zero == 3 && dp > 1) {
      // Each layer's gather is issued as its neighbour starts (runtime Model::prefetch): the chunk's first
      // layer's (its last's in backward) is exposed, every other one only beyond the compute of the layer it
      // travels beside. On a CPU stage nothing travels beside (collectivesOverlapCompute): each layer's
      // gather completes when the layer waits for it.
      const double beside = m_overlaps[static_cast<size_t>(stage)] ? 1.0 : 0.0;
      const LinkSpec link = ringLink(plan, plan.layout.dpCpGroup(rank));
      const LinkSpec expertLink = p.ep > 1 ? ringLink(plan, plan.layout.edpGroup(rank)) : link;
      const std::vector<int>& layers = m_chunks[static_cast<size_t>(k)];
      // A layer's local experts (ep > 1) are gathered over their dp / ep replicas after its own unit.
      auto gather = [&](int l) {
        const double experts =
            p.ep > 1 ? double(model.layers[static_cast<size_t>(l)].localExpertParamCount(tp, p.ep)) : 0.0;
        return ringAllGatherTime((gathered[static_cast<size_t>(l)] - experts) * state.workingBytes, dp,
                                 link) +
               (experts > 0 ? ringAllGatherTime(experts * state.workingBytes, edp, expertLink) : 0.0);
      };
      auto backward = [&](int l) {
        return beside *
               (m_analytic.backwardInput[static_cast<size_t>(l)] +
                (plan.schedule.splitBackward ? 0.0 : m_analytic.backwardWeight[static_cast<size_t>(l)]));
      };
      double forwardExposed = gather(layers.front()), backwardExposed = gather(layers.back());
      // A split backward's W walks the chunk again and gathers every layer again, beside the weight parts.
      double weightExposed = plan.schedule.splitBackward ? gather(layers.back()) : 0.0;
      for (size_t i = 1; i < layers.size(); ++i) {
        forwardExposed += std::max(
            0.0, gather(layers[i]) - beside * m_analytic.forward[static_cast<size_t>(layers[i - 1])]);
        backwardExposed += std::max(0.0, gather(layers[i - 1]) - backward(layers[i]));
        if (plan.schedule.splitBackward)
          weightExposed +=
              std::max(0.0, gather(layers[i - 1]) -
                                beside * m_analytic.backwardWeight[static_cast<size_t>(layers[i])]);
      }
      m_chunkForwardComm[static_cast<size_t>(k)] += forwardExposed;
      m_chunkBackwardComm[static_cast<size_t>(k)] += backwardExposed;
      m_chunkWeightComm[static_cast<size_t>(k)] += weightExposed;
    }
    if (state.offloadParameters) {
      // The shard comes up from the host before each gather, and each microbatch's reduced gradient shard
      // goes down (counted with the backward).
      const double hostLink = stageDevice(plan, stage).hostLinkBandwidth;
      const double shard = (params[static_cast<size_t>(k)] - expertParams[static_cast<size_t>(k)]) / dp +
                           expertParams[static_cast<size_t>(k)] / edp;
      if (hostLink > 0) {
        const double up = shard * state.workingBytes / hostLink,
                     down = shard * state.gradientBytes / hostLink;
        m_chunkHostUpload[static_cast<size_t>(k)] = up;
        m_chunkHostDownload[static_cast<size_t>(k)] = down;
        m_chunkForwardComm[static_cast<size_t>(k)] += up;
        m_chunkBackwardComm[static_cast<size_t>(k)] += up + down;
        if (plan.schedule.splitBackward)  // W's gathers upload the shard again
          m_chunkWeightComm[static_cast<size_t>(k)] += up;
      }
    }
    if (p.batchNorm == BatchNormMode::Sync && dp > 1) {
      // Synchronised BatchNorm (runtime/cnn_layers.cpp): every BatchNorm all-reduces its channels' two sums
      // (2 C doubles) over the data-parallel group in forward, and the two gradient sums in backward, on the
      // critical path of the layer (small messages, latency-bound: smallAllReduceTime).
      const LinkSpec& link = groupLink(plan, plan.layout.dpGroup(rank));
      for (int l : m_chunks[static_cast<size_t>(k)]) {
        const LayerSpec& layer = model.layers[static_cast<size_t>(l)];
        for (size_t b = 0; b + 1 < layer.buffers.size(); b += 2) {  // running mean, running var per BatchNorm
          const double t = smallAllReduceTime(2.0 * 8.0 * double(layer.buffers[b].numel()), dp, link);
          m_chunkForwardComm[static_cast<size_t>(k)] += t;
          m_chunkBackwardComm[static_cast<size_t>(k)] += t;
        }
      }
    }
  }

  // Point-to-point messages between the stages of neighbouring chunks.
  m_activationBytes = chunkMessageBytes(plan);
  const std::vector<double>& gradientBytes = m_activationBytes;  // the input gradient: same size
  m_activationTransfer.assign(static_cast<size_t>(K), 0.0);
  m_gradientTransfer.assign(static_cast<size_t>(K), 0.0);
  for (int k = 0; k < K && modelled; ++k) {
    const int stage = plan.partition.stageOf[static_cast<size_t>(k)];
    if (k + 1 < K) {
      const int next = plan.partition.stageOf[static_cast<size_t>(k + 1)];
      if (next != stage)
        m_activationTransfer[static_cast<size_t>(k)] =
            p2pTime(m_activationBytes[static_cast<size_t>(k)], stageLink(plan, stage, next));
    }
    if (k > 0) {
      const int prev = plan.partition.stageOf[static_cast<size_t>(k - 1)];
      if (prev != stage)
        m_gradientTransfer[static_cast<size_t>(k)] =
            p2pTime(gradientBytes[static_cast<size_t>(k - 1)], stageLink(plan, stage, prev));
    }
  }

  // Data-parallel gradient sync per chunk, and the tied embedding's all-reduce between first and last stage.
  m_gradSync.assign(static_cast<size_t>(K), 0.0);
  m_layerParams.assign(static_cast<size_t>(K), {});
  for (int k = 0; k < K; ++k)
    for (int l : m_chunks[static_cast<size_t>(k)])
      m_layerParams[static_cast<size_t>(k)].push_back(double(
          model.layers[static_cast<size_t>(l)].localParamCount(static_cast<int>(tp), std::max(1, p.ep))));
  const int headLayer = model.layers.empty() ? -1 : static_cast<int>(L) - 1;
  const int embeddingLayer = model.layerIndex("embedding");
  const bool tiedApart =
      plan.config.model.tiedHead() && embeddingLayer >= 0 && headLayer >= 0 &&
      plan.partition.stageOf[static_cast<size_t>(chunkOf[static_cast<size_t>(headLayer)])] !=
          plan.partition.stageOf[static_cast<size_t>(chunkOf[static_cast<size_t>(embeddingLayer)])];
  const bool tiedEmbedding = plan.config.model.tiedHead() && embeddingLayer >= 0;
  const double wteLocal = double(plan.config.model.vocab) * plan.config.model.width / tp;
  for (int k = 0; k < K && modelled; ++k) {
    const int stage = plan.partition.stageOf[static_cast<size_t>(k)];
    const int rank = replicaRank(plan, stage);
    const double bytes = params[static_cast<size_t>(k)] * state.gradientBytes;
    const LinkSpec link = ringLink(plan, plan.layout.dpCpGroup(rank));
    // ZeRO 0 all-reduces the step's gradients, ZeRO-1 reduce-scatters them (runtime/parameters.cpp
    // startSync). ZeRO >= 2 reduce-scatters every microbatch's gradients (runtime/parameters.h reduceGrads),
    // all counted in the chunk's one GradSync: the traffic is right, its overlap with the later microbatches
    // is not. A tied wte (its own unit in the engine) is reduce-scattered once per step, after its
    // cross-stage sum.
    const bool holdsTied = tiedEmbedding && (k == chunkOf[static_cast<size_t>(embeddingLayer)] ||
                                             (tiedApart && k == chunkOf[static_cast<size_t>(headLayer)]));
    const double tiedBytes = holdsTied ? wteLocal * state.gradientBytes : 0.0;
    // One step's sync of `b` bytes over a group of n: ZeRO 0 all-reduces, ZeRO-1 reduce-scatters once,
    // ZeRO >= 2 reduce-scatters every microbatch.
    const auto sync = [&](double b, int n, const LinkSpec& l) {
      return p.zero == 0   ? ringAllReduceTime(b, n, l)
             : p.zero == 1 ? ringReduceScatterTime(b, n, l)
                           : std::max(1, p.microbatches) * ringReduceScatterTime(b, n, l);
    };
    // Expert parallelism: the local experts' gradients are summed over their dp / ep replicas only.
    double expertBytes = 0;
    if (p.ep > 1) {
      expertBytes = expertParams[static_cast<size_t>(k)] * state.gradientBytes;
      m_gradSync[static_cast<size_t>(k)] +=
          sync(expertBytes, edp, ringLink(plan, plan.layout.edpGroup(rank)));
    }
    // Under ZeRO >= 2 the tied wte is reduce-scattered once a step, apart from the per-microbatch rest.
    const double tiedOnce = p.zero >= 2 ? tiedBytes : 0.0;
    const double rest = bytes - expertBytes - tiedOnce;
    double restSync = sync(rest, dp, link);
    if (!m_overlaps[static_cast<size_t>(stage)] && params[static_cast<size_t>(k)] > 0) {
      // Waited for after the compute (collectivesOverlapCompute), the engine's collective per layer (its
      // unit) each pays its own latency: the rest split over the chunk's layers by their parameters.
      restSync = 0;
      for (double layer : m_layerParams[static_cast<size_t>(k)])
        if (layer > 0) restSync += sync(rest * layer / params[static_cast<size_t>(k)], dp, link);
    }
    m_gradSync[static_cast<size_t>(k)] +=
        restSync + (tiedOnce > 0 ? ringReduceScatterTime(tiedOnce, dp, link) : 0.0);
    if (tiedApart &&
        (k == chunkOf[static_cast<size_t>(headLayer)] || k == chunkOf[static_cast<size_t>(embeddingLayer)])) {
      const int a = plan.partition.stageOf[static_cast<size_t>(chunkOf[static_cast<size_t>(headLayer)])];
      const int b = plan.partition.stageOf[static_cast<size_t>(chunkOf[static_cast<size_t>(embeddingLayer)])];
      const double wte = double(plan.config.model.vocab) * plan.config.model.width;
      m_gradSync[static_cast<size_t>(k)] +=
          ringAllReduceTime(wte / tp * state.gradientBytes, 2, stageLink(plan, a, b));
    }
  }

  // Optimizer step per stage.
  m_optimizer.assign(static_cast<size_t>(plan.partition.stages), 0.0);
  m_optimizerDownload.assign(static_cast<size_t>(plan.partition.stages), 0.0);
  m_optimizerUpload.assign(static_cast<size_t>(plan.partition.stages), 0.0);
  m_paramGather.assign(static_cast<size_t>(K), 0.0);
  for (int s = 0; s < plan.partition.stages; ++s) {
    // The stage's chunks' counts, computed once above; the local experts' share among them.
    double local = 0, experts = 0;
    for (int k : plan.partition.chunksOfStage(s)) {
      local += params[static_cast<size_t>(k)];
      experts += expertParams[static_cast<size_t>(k)];
    }
    const double shard = ownedParameterCount(plan, local, experts);
    const DeviceSpec& device = stageDevice(plan, s);
    // Read: gradient, master (mixed) or parameter, moments; written: master or parameter, moments, and in
    // mixed precision the bf16 working copy.
    const double bytes = state.gradientBytes +
                         (state.mixed ? state.masterBytes + state.workingBytes : state.workingBytes) +
                         state.momentBytes;
    double t = device.memoryBandwidth > 0 ? shard * bytes / device.memoryBandwidth : 0.0;
    if (device.kernels && device.memoryBandwidth > 0)  // a catalog GPU: its fused AdamW's measured bandwidth
      t = device.kernels->optimizerSeconds(device.memoryBandwidth, shard * bytes);
    if (device.profile && !device.profile->optimizer.empty()) {
      // A measured device: its optimizer step's curve (the engine's AdamW over fp32 parameters).
      const RankShare share = rankShare(plan, replicaRank(plan, s), *device.profile);
      t = device.profile->optimizerSeconds(share.threads, shard) * share.slowdown;
    }
    if (state.offloadOptimizer) {
      const double hostBytes = 4.0 + 2.0 * state.masterBytes + 2.0 * state.momentBytes + state.workingBytes;
      t = device.hostMemoryBandwidth > 0 ? shard * hostBytes / device.hostMemoryBandwidth : 0.0;
      // "parameters" keeps the shards on the host: the step moves nothing (the gathers and reductions do).
      if (device.hostLinkBandwidth > 0 && !state.offloadParameters) {
        m_optimizerDownload[static_cast<size_t>(s)] = shard * state.gradientBytes / device.hostLinkBandwidth;
        m_optimizerUpload[static_cast<size_t>(s)] = shard * state.workingBytes / device.hostLinkBandwidth;
      }
      t += m_optimizerDownload[static_cast<size_t>(s)] + m_optimizerUpload[static_cast<size_t>(s)];
    }
    if (modelled && (p.zero == 1 || p.zero == 2)) {
      // The owned slices' all-gather: the dense parameters over dp x cp, the local experts over dp x cp / ep.
      const int rank = replicaRank(plan, s);
      const auto gather = [&](double dense, double expert) {
        double g =
            ringAllGatherTime(dense * state.workingBytes, dp, ringLink(plan, plan.layout.dpCpGroup(rank)));
        if (expert > 0)
          g +=
              ringAllGatherTime(expert * state.workingBytes, edp, ringLink(plan, plan.layout.edpGroup(rank)));
        return g;
      };
      if (!p.overlapParamGather) {
        t += gather(local - experts, experts);
      } else {
        // Beside the next step's forward instead (runtime/parameters.cpp finishUpdate): each chunk's part.
        for (int k : plan.partition.chunksOfStage(s))
          m_paramGather[static_cast<size_t>(k)] =
              gather(params[static_cast<size_t>(k)] - expertParams[static_cast<size_t>(k)],
                     expertParams[static_cast<size_t>(k)]);
      }
    }
    m_optimizer[static_cast<size_t>(s)] = t;
  }
}

CostModel::CostModel(const Plan& plan, LayerTimes measured, Communication communication)
    : CostModel(plan, communication) {
  (void)setMeasuredTimes(std::move(measured));  // documented: a mismatch keeps the analytic times
}

Status CostModel::setMeasuredTimes(LayerTimes measured) {
  const size_t L = m_analytic.forward.size();
  const std::pair<const char*, const std::vector<double>*> parts[] = {
      {"forward", &measured.forward},
      {"backwardInput", &measured.backwardInput},
      {"backwardWeight", &measured.backwardWeight}};
  for (const auto& [name, v] : parts) {
    if (v->size() != L)
      return Status::error(std::string("measured layer times: ") + name + " has " +
                           std::to_string(v->size()) + " entries, but the model has " + std::to_string(L) +
                           " layers");
    for (size_t l = 0; l < L; ++l)
      if (!validTime((*v)[l]))
        return Status::error(std::string("measured layer times: ") + name + "[" + std::to_string(l) +
                             "] must be finite and >= 0, got " + std::to_string((*v)[l]));
  }
  m_layers = std::move(measured);
  m_calibrated = true;
  return Status::ok();
}

double CostModel::chunkSum(const std::vector<double>& perLayer, int chunk) const {
  double sum = 0.0;
  for (int l : m_chunks[static_cast<size_t>(chunk)]) sum += perLayer[static_cast<size_t>(l)];
  return sum;
}

double CostModel::forwardTime(int chunk) const {
  const double comm = m_calibrated ? 0.0 : m_chunkForwardComm[static_cast<size_t>(chunk)];
  return chunkSum(m_layers.forward, chunk) + comm;
}

double CostModel::backwardTime(int chunk) const {
  const double comm = m_calibrated ? 0.0 : m_chunkBackwardComm[static_cast<size_t>(chunk)];
  const double input = chunkSum(m_layers.backwardInput, chunk);
  return (m_split ? input : input + chunkSum(m_layers.backwardWeight, chunk)) + comm;
}

std::vector<CostModel::SyncPiece> CostModel::gradSyncPieces(int chunk) const {
  const std::vector<int>& layers = m_chunks[static_cast<size_t>(chunk)];
  const size_t n = layers.size();
  std::vector<SyncPiece> out(n);
  if (n == 0) return out;
  // Each layer's share of the last backward action (its whole backward, or its weight pass when split).
  std::vector<double> work(n);
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t l = static_cast<size_t>(layers[i]);
    work[i] = m_split ? m_layers.backwardWeight[l] : m_layers.backwardInput[l] + m_layers.backwardWeight[l];
    total += work[i];
  }
  // Last layer first: a layer is ready once it and every later layer of the chunk are done.
  double done = 0;
  for (size_t i = n; i-- > 0;) {
    done += total > 0 ? work[i] / total : 1.0 / double(n);
    out[i].readyFraction = std::min(1.0, done);
  }
  const std::vector<double>& params = m_layerParams[static_cast<size_t>(chunk)];
  double all = 0;
  for (double v : params) all += v;
  const double sync = m_gradSync[static_cast<size_t>(chunk)];
  for (size_t i = 0; i < n; ++i)
    out[i].seconds = all > 0 ? sync * params[i] / all : (i + 1 == n ? sync : 0.0);
  return out;
}

std::vector<double> CostModel::paramGatherPieces(int chunk) const {
  const double all = m_paramGather[static_cast<size_t>(chunk)];
  if (all <= 0) return {};
  // By each layer's share of the chunk's parameters, as the engine gathers one unit per layer.
  const std::vector<double>& params = m_layerParams[static_cast<size_t>(chunk)];
  double total = 0;
  for (double v : params) total += v;
  std::vector<double> out(params.size(), 0.0);
  for (size_t i = 0; i < params.size(); ++i)
    out[i] = total > 0 ? all * params[i] / total : (i == 0 ? all : 0.0);
  return out;
}

std::vector<double> CostModel::forwardShares(int chunk) const {
  const std::vector<int>& layers = m_chunks[static_cast<size_t>(chunk)];
  std::vector<double> out(layers.size(), layers.empty() ? 0.0 : 1.0 / double(layers.size()));
  const double total = chunkSum(m_layers.forward, chunk);
  if (total > 0)
    for (size_t i = 0; i < layers.size(); ++i)
      out[i] = m_layers.forward[static_cast<size_t>(layers[i])] / total;
  return out;
}

double CostModel::weightTime(int chunk) const {
  if (!m_split) return 0.0;
  const double comm = m_calibrated ? 0.0 : m_chunkWeightComm[static_cast<size_t>(chunk)];
  return chunkSum(m_layers.backwardWeight, chunk) + comm;
}

double CostModel::optimizerTransferTime(int stage) const {
  return m_optimizerDownload[static_cast<size_t>(stage)] + m_optimizerUpload[static_cast<size_t>(stage)];
}

CostModel::HostTransfers CostModel::hostTransfers(const Action& action, int stage) const {
  HostTransfers t;
  const size_t k = static_cast<size_t>(std::max(0, action.chunk));
  const bool inLayers = !m_calibrated && k < m_chunkHostUpload.size();
  switch (action.type) {
    case ActionType::Forward:
      if (inLayers) t.uploadFirst = m_chunkHostUpload[k];
      break;
    case ActionType::Backward:
      if (inLayers) {
        t.uploadFirst = m_chunkHostUpload[k];
        t.downloadLast = m_chunkHostDownload[k];
      }
      break;
    case ActionType::BackwardWeight:
      if (inLayers && m_split) t.uploadFirst = m_chunkHostUpload[k];
      break;
    case ActionType::OptimizerStep:
      t.downloadFirst = m_optimizerDownload[static_cast<size_t>(stage)];
      t.uploadLast = m_optimizerUpload[static_cast<size_t>(stage)];
      break;
    default:
      break;
  }
  return t;
}

double CostModel::activationTransferTime(int chunk) const {
  return m_activationTransfer[static_cast<size_t>(chunk)];
}

double CostModel::gradientTransferTime(int chunk) const {
  return m_gradientTransfer[static_cast<size_t>(chunk)];
}

double CostModel::activationMessageBytes(int chunk) const {
  return m_activationBytes[static_cast<size_t>(chunk)];
}

double CostModel::gradSyncTime(int chunk) const {
  return m_gradSync[static_cast<size_t>(chunk)];
}

double CostModel::optimizerTime(int stage) const {
  return m_optimizer[static_cast<size_t>(stage)];
}

double CostModel::actionTime(const Action& action, int stage) const {
  switch (action.type) {
    case ActionType::Forward:
      return forwardTime(action.chunk);
    case ActionType::Backward:
      return backwardTime(action.chunk);
    case ActionType::BackwardWeight:
      return weightTime(action.chunk);
    case ActionType::SendActivation:
      return activationTransferTime(action.chunk);
    case ActionType::SendGrad:
      return gradientTransferTime(action.chunk);
    case ActionType::RecvActivation:
    case ActionType::RecvGrad:
      return 0.0;
    case ActionType::GradSync:
      return gradSyncTime(action.chunk);
    case ActionType::OptimizerStep:
      return optimizerTime(stage);
  }
  return 0.0;
}

}  // namespace ms
