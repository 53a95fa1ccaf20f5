// The auto-planner; see autoplanner.h for the search and why it screens before it simulates.
#include "plan/autoplanner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "plan/cost_model.h"
#include "plan/hardware.h"
#include "plan/memory_model.h"
#include "plan/model_spec.h"
#include "plan/model_state.h"
#include "plan/partition.h"
#include "plan/plan.h"
#include "plan/recompute.h"
#include "plan/simulator.h"

namespace ms {
namespace {

struct Screened {
  ParallelConfig parallel;
  double time = 0;
  double memory = 0;
};

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// Per-stage figures of the balanced partition (by forward FLOPs, which is what the cost model's times are
// proportional to on one device type), cached per (pp, V): the heaviest stage's forward FLOPs, parameters and
// saved activation bytes per sample, and its transformer block count.
struct StageFigures {
  double flops = 0;
  double params = 0;
  // Saved activation bytes per sample, as the memory model counts them (memory_model.h): wholeBytes stay
  // whole on every TP rank (layer outputs, embedding and head), blockBytes are the blocks' saved tensors
  // (split by TP but for their replicated parts); recompute keeps only wholeBytes and re-makes one block.
  double wholeBytes = 0;
  // Of wholeBytes, the outputs of blocks followed by a block: sequence pieces under sequence parallelism
  // (LayerSpec::outputPieces), / tp.
  double pieceBytes = 0;
  double blockBytes = 0;
  double largestLayerActivation = 0;
  int blocks = 0;
  int blocksPerChunk = 0;  // the most transformer blocks any chunk holds ("recompute_layers" up to this)
  // For recomputation (plan/recompute.h): the blocks' forward FLOPs, their attention cores' forward FLOPs
  // (what selective repeats) and the attention matrices they keep (what selective drops), per sample.
  double blockFlops = 0;
  double attentionFlops = 0;
  double matrixBytes = 0;
  // Mixture of experts: the routed experts' parameters and the blocks that hold them (expert parallelism).
  double expertParams = 0;
  int moeBlocks = 0;
};

std::vector<double> layerFlops(const ModelSpec& spec) {
  std::vector<double> flops;
  for (const LayerSpec& l : spec.layers) flops.push_back(l.forwardFlopsPerSample);
  return flops;
}

StageFigures stageFigures(const ModelSpec& spec, int pp, int V, Precision precision, bool fused) {
  const Partition p = balancedPartition(spec, pp, V, layerFlops(spec));
  StageFigures worst;
  for (int s = 0; s < pp; ++s) {
    StageFigures f;
    for (int k : p.chunksOfStage(s)) {
      worst.blocksPerChunk = std::max(worst.blocksPerChunk, blocksInChunk(spec, p.chunks[k]));
      for (int l : p.chunks[k]) {
        const LayerSpec& layer = spec.layers[l];
        f.flops += layer.forwardFlopsPerSample;
        f.params += double(layer.paramCount());
        f.expertParams += double(layer.expertParamCount);
        f.moeBlocks += layer.expertParamCount > 0 ? 1 : 0;
        // Each layer's output buffer stays per microbatch (memory_model.h chunkActivationBytes).
        const double output = layer.kind == LayerKind::Head ? 0.0 : layer.outputBytesPerSampleIn(precision);
        const double kept = layer.keptBytesPerSample(precision, fused);
        f.wholeBytes += layer.kind == LayerKind::Block ? output : kept + output;
        if (layer.kind == LayerKind::Block && size_t(l) + 1 < spec.layers.size() &&
            spec.layers[size_t(l) + 1].kind == LayerKind::Block)
          f.pieceBytes += output;
        if (layer.kind == LayerKind::Block) f.blockBytes += kept;
        if (layer.kind == LayerKind::Block)
          f.largestLayerActivation = std::max(f.largestLayerActivation, kept);
        f.blocks += layer.kind == LayerKind::Block ? 1 : 0;
        if (layer.kind == LayerKind::Block) {
          f.blockFlops += layer.forwardFlopsPerSample;
          f.attentionFlops += layer.attentionFlopsPerSample;
          if (!fused && !layer.ringAttention)
            f.matrixBytes += layer.attentionMatrixBytesPerSampleIn(precision);
        }
      }
    }
    worst.flops = std::max(worst.flops, f.flops);
    worst.params = std::max(worst.params, f.params);
    worst.expertParams = std::max(worst.expertParams, f.expertParams);
    worst.moeBlocks = std::max(worst.moeBlocks, f.moeBlocks);
    if (f.wholeBytes > worst.wholeBytes) {
      worst.wholeBytes = f.wholeBytes;
      worst.pieceBytes = f.pieceBytes;
    }
    worst.blockBytes = std::max(worst.blockBytes, f.blockBytes);
    worst.largestLayerActivation = std::max(worst.largestLayerActivation, f.largestLayerActivation);
    worst.blocks = std::max(worst.blocks, f.blocks);
    worst.blockFlops = std::max(worst.blockFlops, f.blockFlops);
    worst.attentionFlops = std::max(worst.attentionFlops, f.attentionFlops);
    worst.matrixBytes = std::max(worst.matrixBytes, f.matrixBytes);
  }
  return worst;
}

// Microbatches (in whole-stage units) the first stage holds at its peak under each schedule: GPipe all M;
// 1F1B and ZB-H1 min(P, M) (Narayanan et al. 2021, section 2.2.1; Qi et al. 2024, ZB-H1 keeps 1F1B's memory);
// interleaved 1F1B warms up 2(P-1) + (V-1)P chunk-forwards before its first backward (Megatron-Core's
// get_forward_backward_func warm-up count), i.e. that many plus one chunks of 1/V of the stage each.
double inFlight(Schedule s, int P, int V, int M) {
  switch (s) {
    case Schedule::GPipe:
      return M;
    case Schedule::OneFOneB:
    case Schedule::ZbH1:
      return std::min(P, M);
    case Schedule::Interleaved1F1B:
      return std::min<double>(double(M) * V, 2.0 * (P - 1) + double(V - 1) * P + 1.0) / V;
  }
  return M;
}

// Pipeline length in microbatch-times: M plus the bubble of the schedule (textbook forms: (P-1) for GPipe and
// 1F1B, (P-1)/V interleaved, about (P-1)/3 for ZB-H1 with equal F, B and W).
double pipelineFactor(Schedule s, int P, int V, int M) {
  switch (s) {
    case Schedule::GPipe:
    case Schedule::OneFOneB:
      return M + P - 1.0;
    case Schedule::Interleaved1F1B:
      return M + (P - 1.0) / V;
    case Schedule::ZbH1:
      return M + (P - 1.0) / 3.0;
  }
  return M + P - 1.0;
}

}  // namespace

Expected<AutoPlanResult> autoPlan(const RunConfig& base, const AutoPlanOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  auto mesh = buildMesh(base.mesh);
  if (!mesh) return mesh.status();
  if (mesh->devices.empty()) return Status::error("/mesh/nodes: the mesh has no devices");
  const ModelConfig& model = base.model;
  const ModelSpec spec = buildModelSpec(model, base.training.seqLen);
  const int L = static_cast<int>(spec.layers.size());
  // Context parallelism (llama; gpt plans run with cp too, but the search leaves it to the user: GPT-2/3
  // sequences are short, and at 2048 tokens the model prefers cp 2 over dp by about 1%, a margin below its
  // error): cp ways that split the sequence into 2 cp equal chunks, each rank keeping at
  // least kMinContextPositions positions; below that a ring step's attention is too short to hide the
  // transfer of its key/value block, which is why Megatron-Core documents context parallelism for long
  // sequences. One spec per cp (model_spec.h: a rank's slice).
  constexpr int kMinContextPositions = 512;
  std::map<int, ModelSpec> specs;
  specs.emplace(1, spec);
  auto contextWays = [&](int n) {
    std::vector<int> ways = {1};
    if (model.type != ModelType::Llama) return ways;
    for (int cp : divisors(n))
      if (cp > 1 && base.training.seqLen % (2 * cp) == 0 &&
          base.training.seqLen / cp >= kMinContextPositions) {
        ways.push_back(cp);
        if (!specs.count(cp)) specs.emplace(cp, buildModelSpec(model, base.training.seqLen, 784, cp));
      }
    return ways;
  };
  const int B = base.training.batchSize;
  // The slowest device sets the pace; devices per node from the first node (TP stays inside a node).
  const MeshDevice* slowest = &mesh->devices.front();
  double smallestMemory = slowest->spec.memoryBytes;
  int perNode = 0;
  for (const MeshDevice& d : mesh->devices) {
    if (d.spec.peakFlops(base.parallel.precision) < slowest->spec.peakFlops(base.parallel.precision))
      slowest = &d;
    smallestMemory = std::min(smallestMemory, d.spec.memoryBytes);
    perNode += d.node == 0 ? 1 : 0;
  }
  const DeviceSpec& device = slowest->spec;
  const double flatRate = device.peakFlops(base.parallel.precision) * device.achievableFraction;
  // The screen's compute rate for a microbatch of `rows` positions on tp ranks: on a catalog GPU the rate its
  // kernel model gives the MLP's first GEMM at that shape (rows x F / tp x width: wave and tile quantisation
  // of small microbatches and wide tp included), else the device's one fraction of its peak. The simulated
  // plans are costed layer by layer (cost_model.cpp); this only ranks the candidates to simulate.
  auto screenRate = [&](double rows, int tp) {
    if (!device.kernels || model.width <= 0) return flatRate;
    const double n = std::max(1.0, double(model.mlpHidden()) / tp), k = double(model.width);
    const double elementBytes = base.parallel.precision == Precision::Bf16 ? 2.0 : 4.0;
    const double t = device.kernels->gemmSeconds(device.peakFlops(base.parallel.precision),
                                                 device.memoryBandwidth, elementBytes, rows, n, k);
    return t > 0 ? 2.0 * rows * n * k / t : flatRate;
  };
  const double elem = 4.0;  // activations and parameters move in fp32 in both precisions
  // Attention runs fused on GPUs for head sizes the kernel takes (memory_model.h fusedAttention).
  const bool fused = isGpuDevice(device) && isTransformer(model.type) && model.heads > 0 &&
                     model.width % model.heads == 0 &&
                     model.width / model.heads <= kFusedAttentionMaxHeadSize;
  const int64_t F = model.mlpHidden();
  const int KV = model.kvHeadCount();

  std::vector<int> worlds;
  const int devices = mesh->deviceCount();
  worlds.push_back(devices);
  if (!options.useAllDevices)
    for (int w = 1; w < devices; w *= 2) worlds.push_back(w);

  AutoPlanResult result;
  std::vector<Screened> fits;
  double leastMemory = std::numeric_limits<double>::infinity();
  std::map<std::tuple<int, int, int>, StageFigures> figures;  // by (pp, V, cp)
  for (int world : worlds) {
    for (int tp : divisors(world)) {
      if (tp > std::max(perNode, 1)) continue;
      if (isTransformer(model.type) && (model.heads % tp || F % tp || KV % tp)) continue;
      if (isLanguageModel(model.type) && model.vocab % tp) continue;
      if (!isTransformer(model.type) && tp > 1) continue;
      std::vector<std::pair<int, int>> ppCp;  // (pp, cp)
      for (int pp : divisors(world / tp))
        if (pp <= L)
          for (int cp : contextWays(world / (tp * pp))) ppCp.push_back({pp, cp});
      for (const std::pair<int, int>& split : ppCp) {
        const int pp = split.first, cp = split.second;
        const ModelSpec& cpSpec = specs.at(cp);
        const int positions = cpSpec.samplePositions;
        // dp: data-parallel replicas (the batch splits over them); the parameters' gradients are summed, and
        // ZeRO shards them, over the dp x cp ranks (replicas).
        const int dp = world / (tp * pp * cp), replicas = dp * cp;
        for (int mbs = 1; mbs <= B; mbs *= 2) {
          if (B % (dp * mbs)) continue;
          const int M = B / (dp * mbs);
          const double rate = screenRate(double(mbs) * positions, tp);
          std::vector<std::pair<Schedule, int>> schedules = {{Schedule::OneFOneB, 1}};
          if (pp > 1) {
            schedules.push_back({Schedule::GPipe, 1});
            schedules.push_back({Schedule::ZbH1, 1});
            for (int V : {2, 3, 4})
              if (M % pp == 0 && pp * V <= L) schedules.push_back({Schedule::Interleaved1F1B, V});
          }
          for (const auto& entry : schedules) {
            // Named variables, not a structured binding: the lambdas below capture them, which clang 14
            // refuses for bindings (allowed from C++20, implemented in clang 16).
            const Schedule schedule = entry.first;
            const int V = entry.second;
            const auto key = std::make_tuple(pp, V, cp);
            if (!figures.count(key))
              figures[key] = stageFigures(cpSpec, pp, V, base.parallel.precision, fused);
            const StageFigures& st = figures[key];
            // Offload only where the host side is known (hardware.h) and master weights exist (bf16).
            std::vector<Offload> offloads = {Offload::None};
            if (base.parallel.precision == Precision::Bf16 && device.hostLinkBandwidth > 0 &&
                device.hostMemoryBytes > 0 && device.hostMemoryBandwidth > 0)
              offloads.push_back(Offload::Optimizer);
            // Expert parallelism (mixture of experts): ep over divisors of the dp x cp replicas that divide
            // the experts, with every ZeRO stage (the experts shard over their dp x cp / ep replicas).
            std::vector<int> eps = {1};
            if (model.type == ModelType::Llama && model.experts > 0)
              for (int e : divisors(replicas))
                if (e > 1 && model.experts % e == 0) eps.push_back(e);
            std::vector<std::pair<int, int>> layouts;  // (ep, zero)
            for (int ep : eps)
              for (int zero = 0; zero <= (replicas > 1 ? 3 : 0); ++zero) layouts.push_back({ep, zero});
            for (const std::pair<int, int>& layout : layouts) {
              const int ep = layout.first, zero = layout.second;
              // The least screened memory of each recompute choice with less offloaded (none, then the
              // optimizer): offloading more only adds time (the step crosses the host link and runs at host
              // DRAM bandwidth; "parameters" also moves each shard up before every gather), so a level is
              // searched only where the same plan at every lower level does not fit.
              std::map<std::tuple<int, int, bool>, double> lessOffloaded;
              std::vector<Offload> levels = offloads;
              if (zero == 3 && offloads.size() > 1) levels.push_back(Offload::Parameters);  // FSDP's
              for (Offload offload : levels) {
                // Shared by every recompute choice: compute, TP communication, DP sync, model states.
                const double tF = st.flops * mbs / (rate * tp);
                // TP all-reduces (Megatron: two forward and two backward per block).
                const double tpComm =
                    tp > 1 ? 4.0 * st.blocks *
                                 ringAllReduceTime(double(mbs) * positions * model.width * elem, tp,
                                                   mesh->intraLink)
                           : 0.0;
                const double tpCommPerBlock = st.blocks > 0 ? tpComm / (4.0 * st.blocks) : 0.0;
                const ModelStateLayout states = modelStateLayout(
                    base.parallel.precision, base.parallel.gradPrecision, base.optimizer, zero, offload);
                // Under ep a rank holds 1/ep of the routed experts, whose gradients are summed over their
                // dp / ep replicas only; each mixture-of-experts block sends its k T rows a sample out and
                // back in forward and in backward (cost_model.cpp).
                const double localParams = st.params - st.expertParams * (1.0 - 1.0 / ep);
                const int expertReplicas = replicas / ep;
                const double expertLocal = ep > 1 ? st.expertParams / ep / tp : 0.0;  // of localParams / tp
                const double expertGrads = expertLocal * states.gradientBytes;
                const double grads = localParams / tp * states.gradientBytes - expertGrads;
                // A ring crossing nodes over g members per node runs at their ports' sum (ringLink):
                // members `stride` ranks apart (rank order tp-cp-ep-dp-pp) fill a node g = perNode / stride.
                const auto ring = [&](int stride, int members) {
                  return stride * members > perNode
                             ? railLink(mesh->interLink, mesh->intraLink, std::max(1, perNode / stride))
                             : mesh->intraLink;
                };
                const LinkSpec dpLink = ring(tp, replicas);
                // ZeRO >= 2 reduce-scatters every microbatch's gradients (cost_model.cpp).
                double sync = zero >= 2 ? M * ringReduceScatterTime(grads, replicas, dpLink)
                                        : ringAllReduceTime(grads, replicas, dpLink);
                const double routedRows = double(positions) * model.expertsPerToken * mbs;
                double epComm = 0, epBytes = 0;
                if (ep > 1) {
                  const LinkSpec& epLink = tp * ep > perNode ? mesh->interLink : mesh->intraLink;
                  const LinkSpec edpLink = ring(tp * ep, expertReplicas);
                  sync += zero >= 2 ? M * ringReduceScatterTime(expertGrads, expertReplicas, edpLink)
                                    : ringAllReduceTime(expertGrads, expertReplicas, edpLink);
                  epComm =
                      4.0 * st.moeBlocks *
                      allToAllTime(routedRows * model.width * activationElementBytes(base.parallel.precision),
                                   ep, epLink);
                  epBytes = st.moeBlocks * routedRows / mbs *
                            (model.width * (base.parallel.precision == Precision::Bf16 ? 2.0 : 4.0) + 8.0);
                }
                // ZeRO-3 gathers the stage's parameters before every forward and backward.
                if (zero == 3)
                  sync += 2.0 * M *
                          (ringAllGatherTime((localParams / tp - expertLocal) * states.workingBytes, replicas,
                                             dpLink) +
                           (ep > 1 ? ringAllGatherTime(expertLocal * states.workingBytes, expertReplicas,
                                                       ring(tp * ep, expertReplicas))
                                   : 0.0));
                // Ring attention (cost_model.cpp): per block cp - 1 key/value transfers beside a 1/cp share
                // of its attention in forward, again beside twice that in backward, plus cp dK|dV transfers.
                double cpComm = 0;
                if (cp > 1) {
                  const LinkSpec& cpLink = tp * cp > perNode ? mesh->interLink : mesh->intraLink;
                  const double values =
                      double(mbs) * positions * 2.0 * KV * (double(model.width) / model.heads) / tp;
                  const double transfer =
                      p2pTime(values * activationElementBytes(base.parallel.precision), cpLink);
                  const double gradients = p2pTime(values * 4.0, cpLink);
                  const double step =
                      st.blocks > 0 ? st.attentionFlops / st.blocks * mbs / (rate * tp * cp) : 0.0;
                  cpComm =
                      st.blocks *
                      ((cp - 1) * (std::max(0.0, transfer - step) + std::max(0.0, transfer - 2.0 * step)) +
                       cp * gradients);
                }
                const double factor = pipelineFactor(schedule, pp, V, M);
                // Memory: the memory model's bytes per parameter, sharded by ZeRO stage over dp.
                // (the local experts' over their dp x cp / ep replicas).
                const double n = localParams / tp, dense = n - expertLocal;
                const ModelStateBytes perParam = modelStateBytes(states, replicas);
                const ModelStateBytes perExpertParam = modelStateBytes(states, std::max(1, expertReplicas));
                const double stateBytes = dense * perParam.total() + expertLocal * perExpertParam.total();
                const double hostBytes =
                    dense * perParam.hostTotal() + expertLocal * perExpertParam.hostTotal();
                // Offload: the host's share must hold its part, and the step crosses the link and runs on
                // the host (cost_model.cpp); the device-side step is not in the screen's time either way.
                if (hostBytes > device.hostMemoryBytes && hostBytes > 0) continue;
                if (states.offloadOptimizer) {
                  const double shard =
                      zero >= 1 ? dense / replicas + expertLocal / std::max(1, expertReplicas) : n;
                  sync += shard *
                          (4.0 + 2.0 * states.masterBytes + 2.0 * states.momentBytes + states.workingBytes) /
                          device.hostMemoryBandwidth;
                  // "optimizer": the owned gradients down and the updated slice up once per step;
                  // "parameters": the shard up before each of the 2M gathers, each microbatch's reduced
                  // gradient shard down (cost_model.cpp).
                  sync +=
                      states.offloadParameters
                          ? M * shard * (2.0 * states.workingBytes + states.gradientBytes) /
                                device.hostLinkBandwidth
                          : shard * (states.gradientBytes + states.workingBytes) / device.hostLinkBandwidth;
                }
                // Sequence parallelism, where tp splits every rank's positions, is searched both ways
                // (Megatron's layout: less activation memory, two more all-gathers a block in backward),
                // with its collectives beside the GEMMs (tp_comm_overlap, never slower in the plan).
                std::vector<bool> spWays = {false};
                if (tp > 1 && isTransformer(model.type) && positions % tp == 0) spWays.push_back(true);
                for (const bool sp : spWays) {
                  // A block's replicated part under TP (memory_model.cpp layerActivationBytes): the two
                  // LayerNorm outputs, and without sequence parallelism the residual and the LayerNorm
                  // statistics; the rest is split.
                  const double lnBytes = base.parallel.precision == Precision::Bf16 ? 2.0 : 4.0;
                  const double T = positions, C = model.width;
                  const double replicated =
                      tp == 1 ? 0.0 : 2.0 * T * C * lnBytes + (sp ? 0.0 : (T * C + 4.0 * T) * 4.0);
                  // Between blocks a sequence piece under sequence parallelism.
                  const double wholeBytes = st.wholeBytes - (sp ? st.pieceBytes * (1.0 - 1.0 / tp) : 0.0);
                  // The TP collectives left exposed: under sequence parallelism in chunks beside about three
                  // quarters of the blocks' compute (cost_model.cpp exposedBeside with four chunks), plus the
                  // two LayerNorm re-gathers a block in backward (each half an all-reduce's time), counted
                  // whole here though the plan sends them beside the input gradients: a pessimistic screen
                  // for sequence parallelism, which the simulation of the best candidates corrects.
                  const double tpExposed = sp ? std::max(tpComm / 4.0, tpComm - 0.75 * 3.0 * tF) +
                                                    2.0 * st.blocks * tpCommPerBlock / 2.0
                                              : tpComm;
                  auto blockPart = [&](double kept) {
                    const double whole = std::min(kept, replicated * st.blocks);
                    return whole + (kept - whole) / tp;
                  };
                  const double blockBytes = blockPart(st.blockBytes);
                  const double held = inFlight(schedule, pp, V, M);
                  // recomputedBlocks: fully recomputed blocks of the stage ("recompute_layers" per chunk
                  // times its V chunks); attention: selective recompute's re-run attention cores.
                  auto screen = [&](Recompute rc, int layers, int recomputedBlocks, bool attention) {
                    const std::tuple<int, int, bool> choice{static_cast<int>(rc), layers, sp};
                    if (offload != Offload::None && lessOffloaded.count(choice) &&
                        lessOffloaded[choice] <= smallestMemory)
                      return;  // dominated: the same plan fits with less offloaded, and is faster
                    ++result.considered;
                    const double perBlock = st.blocks > 0 ? 1.0 / st.blocks : 0.0;
                    const double again = recomputedBlocks * perBlock * st.blockFlops * mbs / (rate * tp) +
                                         (attention ? st.attentionFlops * mbs / (rate * tp) : 0.0);
                    const double tB = 2.0 * tF + again;
                    const double comm = tpExposed + 2.0 * recomputedBlocks * tpCommPerBlock + epComm + cpComm;
                    const double time = factor * (tF + tB + comm) + sync;
                    const double kept = attention ? blockPart(st.blockBytes - st.matrixBytes)
                                                  : blockBytes * (1.0 - recomputedBlocks * perBlock);
                    const double act = held * mbs * (wholeBytes + kept + epBytes) +
                                       (recomputedBlocks > 0 ? st.largestLayerActivation * mbs / tp : 0.0);
                    const double memory = stateBytes + act;
                    lessOffloaded[choice] =
                        lessOffloaded.count(choice) ? std::min(lessOffloaded[choice], memory) : memory;
                    leastMemory = std::min(leastMemory, memory);
                    if (memory > 1.1 * smallestMemory) return;
                    ParallelConfig par = base.parallel;
                    par.dp = dp;
                    par.tp = tp;
                    par.pp = pp;
                    par.ep = ep;
                    par.cp = cp;
                    par.schedule = schedule;
                    par.virtualChunks = V;
                    par.microbatches = M;
                    par.zero = zero;
                    // ZeRO 1-2's parameter all-gather beside the next forward (Megatron's
                    // --overlap-param-gather; never slower in the plan), and sequence parallelism with its
                    // collectives in chunks (--sequence-parallel --tp-comm-overlap).
                    par.overlapParamGather = zero == 1 || zero == 2;
                    par.sequenceParallel = sp;
                    par.tpCommOverlap = sp;
                    par.offload = offload;
                    par.recompute = rc;
                    par.recomputeLayers = layers;
                    par.placement.clear();
                    fits.push_back({par, time, memory});
                  };
                  screen(Recompute::None, 0, 0, false);
                  // Selective only where it drops something: attention not fused (recompute.h).
                  if (st.matrixBytes > 0 && positions > 1) screen(Recompute::Selective, 0, 0, true);
                  screen(Recompute::Full, 0, st.blocks, false);
                  // Megatron's partial recompute: the fewest blocks per chunk that bring the estimate under
                  // the smallest device's memory (time grows with each recomputed block, so fewer is faster),
                  // and one more for the estimate's error; the real memory model decides after.
                  const double savedPerChunkBlock = held * mbs * blockBytes / std::max(1, st.blocks) * V;
                  const double over = stateBytes + held * mbs * (wholeBytes + blockBytes) +
                                      st.largestLayerActivation * mbs / tp - smallestMemory;
                  if (over > 0 && savedPerChunkBlock > 0) {
                    const int fewest = static_cast<int>(std::ceil(over / savedPerChunkBlock));
                    for (int N = std::max(1, fewest); N <= fewest + 1 && N < st.blocksPerChunk; ++N)
                      screen(Recompute::Full, N, std::min(st.blocks, N * V), false);
                  }
                }  // sp
              }
            }
          }
        }
      }
    }
  }
  result.screenedFit = static_cast<int>(fits.size());
  std::sort(fits.begin(), fits.end(), [](const Screened& a, const Screened& b) {
    return a.time != b.time ? a.time < b.time : a.memory < b.memory;
  });
  // The screen is an estimate: candidates the memory model then refuses do not count, up to a bound on
  // the memory checks.
  const int toSimulate = std::max(options.simulate, options.top);
  int checked = 0;
  for (const Screened& s : fits) {
    if (result.simulated >= toSimulate || checked >= 20 * toSimulate) break;
    RunConfig config = base;
    config.parallel = s.parallel;
    config.parallel.placement =
        toPlacement(balancedPartition(specs.at(s.parallel.cp), s.parallel.pp, s.parallel.virtualChunks,
                                      layerFlops(specs.at(s.parallel.cp))),
                    spec);
    if (!validateRunConfig(config).empty()) continue;
    auto plan = buildPlan(config);
    if (!plan) continue;
    ++checked;
    const std::vector<MemoryBreakdown> memory = estimateMemory(*plan);
    bool allFit = true;
    PlanCandidate c;
    for (const MemoryBreakdown& m : memory) {
      allFit = allFit && m.fits();
      if (m.total() > c.peakMemoryBytes) {
        c.peakMemoryBytes = m.total();
        c.capacityBytes = m.capacity;
      }
    }
    for (const NodeHostMemory& h : hostMemoryPerNode(*plan, memory)) allFit = allFit && h.fits();
    if (!allFit) continue;
    ++result.simulated;
    const CostModel cost(*plan);
    const SimResult sim = simulate(*plan, cost, /*spansPerRank=*/false);
    c.config = std::move(config);
    c.estimatedStepTime = s.time;
    c.stepTime = sim.stepTime;
    c.tokensPerSecond = sim.tokensPerSecond;
    c.mfu = sim.mfu;
    c.mfuDefined = sim.mfuDefined;
    for (double b : sim.bubbleFraction) c.bubbleFraction = std::max(c.bubbleFraction, b);
    result.best.push_back(std::move(c));
  }
  std::sort(result.best.begin(), result.best.end(),
            [](const PlanCandidate& a, const PlanCandidate& b) { return a.stepTime < b.stepTime; });
  if (static_cast<int>(result.best.size()) > options.top) result.best.resize(options.top);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (result.best.empty()) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "no plan fits: the least memory any candidate needs is %.1f GiB per device, "
                  "the smallest device has %.1f GiB",
                  leastMemory / double(1 << 30), smallestMemory / double(1 << 30));
    return Status::error(buf);
  }
  return result;
}

}  // namespace ms
