// The memory model; see memory_model.h for the rules and their sources.
#include "plan/memory_model.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "common/metrics_schema.h"
#include "plan/model_state.h"
#include "plan/recompute.h"

namespace ms {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
// The CUDA context, cuBLAS/NCCL handles and their workspaces on a GPU, outside the engine's tracked buffers:
// measured on an H200 (CUDA 13.0, driver 580; bench/gpu_memory.py, GPT-2 124M and 350M in fp32): the device's
// used bytes less the caching allocator's pool came to 599 MiB (bf16 runs 30-46 MiB more: the GEMM operands'
// bf16 scratch). 600 MiB is the allowance.
constexpr double kCudaContextBytes = 600 * kMiB;

std::vector<int> chunkOfLayers(const Plan& plan) {
  std::vector<int> chunkOf(plan.model.layers.size(), 0);
  for (size_t k = 0; k < plan.partition.chunks.size(); ++k)
    for (int l : plan.partition.chunks[k]) chunkOf[static_cast<size_t>(l)] = static_cast<int>(k);
  return chunkOf;
}

// The chunk of a tied LM head that needs its own copy of wte (on another stage than the embedding), if any.
struct TiedHead {
  int headChunk = -1;
  double copyParams = 0;  // wte elements held by the head's chunk, 0 when none
};
TiedHead tiedHead(const Plan& plan) {
  TiedHead t;
  const ModelConfig& m = plan.config.model;
  const int head = plan.model.layerIndex("head");
  const int embedding = plan.model.layerIndex("embedding");
  if (!m.tiedHead() || head < 0 || embedding < 0) return t;
  const std::vector<int> chunkOf = chunkOfLayers(plan);
  const int hc = chunkOf[static_cast<size_t>(head)], ec = chunkOf[static_cast<size_t>(embedding)];
  if (plan.partition.stageOf[static_cast<size_t>(hc)] == plan.partition.stageOf[static_cast<size_t>(ec)])
    return t;
  t.headChunk = hc;
  t.copyParams = double(m.vocab) * m.width;
  return t;
}

// The layer's output buffer, kept per microbatch in flight (runtime Model: every layer's output stays until
// the microbatch's backward, with or without recompute), as one rank holds it: whole on every TP rank, but a
// sequence piece from a block to the next under sequence parallelism (LayerSpec::outputPieces), bf16 under
// "precision": "bf16". Heads hand nothing on.
double layerOutputBytes(const Plan& plan, int l) {
  const LayerSpec& layer = plan.model.layers[static_cast<size_t>(l)];
  return layer.kind == LayerKind::Head
             ? 0.0
             : layer.heldOutputBytesPerSampleIn(plan.config.parallel.precision) * plan.microbatchSize();
}

// One microbatch's saved activations of a layer without recompute, on one rank (see chunkActivationBytes):
// what the layer keeps for its backward and its output buffer.
double layerActivationBytesWithoutEp(const Plan& plan, int l, bool fused);

// A mixture-of-experts block's routed rows per sample on one rank (Routing, memory_model.h): `received`, the
// rows its local experts are sent (under ep, from the ep ranks of its group; R = k T balanced), and `widest`,
// its busiest expert's (R / E balanced, R / (E / ep) under ep). A capacity is per microbatch, rounded up.
struct RoutedRows {
  double received = 0, widest = 0;
};
RoutedRows routedRowsPerSample(const Plan& plan, Routing routing) {
  const ModelConfig& m = plan.config.model;
  const double T = plan.model.samplePositions, E = std::max(1, m.experts), k = m.expertsPerToken;
  const double ep = std::max(1, plan.config.parallel.ep), local = E / ep, R = T * k,
               mbs = plan.microbatchSize();
  if (routing == Routing::Balanced) return {R, R / local};
  const double perExpert =
      m.capacityFactor > 0 ? std::min(T, std::ceil(m.capacityFactor * mbs * R / E) / mbs) : T;
  return {ep * std::min(T * std::min(k, local), local * perExpert), ep * perExpert};
}

// Expert parallelism: a mixture-of-experts block also keeps the rows its experts received (runtime/moe.h),
// whole on every TP rank: with balanced routing a token's k rows, C values each (bf16 in bf16 precision),
// and their place in the expert order and back (2 int32 each). Dropless routing is balanced only on
// average: a block's peak over steps is above this by the imbalance of its busiest rank.
double expertParallelBytes(const Plan& plan, int l, Routing routing) {
  const ParallelConfig& p = plan.config.parallel;
  const ModelConfig& m = plan.config.model;
  const LayerSpec& layer = plan.model.layers[static_cast<size_t>(l)];
  if (p.ep <= 1 || layer.kind != LayerKind::Block || m.type != ModelType::Llama || m.experts == 0 ||
      layer.expertParamCount == 0)
    return 0.0;
  const double kept = p.precision == Precision::Bf16 ? 2.0 : 4.0;
  const RoutedRows routed = routedRowsPerSample(plan, routing);
  const double mbs = plan.microbatchSize(), R = double(plan.model.samplePositions) * m.expertsPerToken;
  // The local experts also keep their gate|up and SwiGLU outputs (3 Fe / tp) of the rows they receive
  // (moe.cpp forwardParallel), which the block's kept tensors count as its own R (model_spec.cpp): the
  // difference, 0 when routing is balanced.
  const double expertOutputs = 3.0 * double(m.expertHidden()) / std::max(1, p.tp) * kept;
  return routed.received * mbs * (double(m.width) * kept + 2.0 * 4.0) +
         (routed.received - R) * mbs * expertOutputs;
}

double layerActivationBytes(const Plan& plan, int l, bool fused, Routing routing) {
  return layerActivationBytesWithoutEp(plan, l, fused) + expertParallelBytes(plan, l, routing);
}

double layerActivationBytesWithoutEp(const Plan& plan, int l, bool fused) {
  const ParallelConfig& p = plan.config.parallel;
  const LayerSpec& layer = plan.model.layers[static_cast<size_t>(l)];
  const double tp = std::max(1, p.tp);
  double full = layer.keptBytesPerSample(p.precision, fused) * plan.microbatchSize();
  // Selective recompute drops the attention matrix, a tensor-parallel (split by heads) part (recompute.h).
  if (recomputesAttention(RecomputePolicy::of(p), plan.config.model.type, layer.kind,
                          plan.model.samplePositions, fused || layer.ringAttention))
    full -= layer.attentionMatrixBytesPerSampleIn(p.precision) * plan.microbatchSize();
  const double output = layerOutputBytes(plan, l);
  const bool transformerBlock = layer.kind == LayerKind::Block && isTransformer(plan.config.model.type);
  // Embeddings and heads keep whole tensors on every TP rank (the gpt head its partial input gradient before
  // the all-reduce, row statistics and losses; vit's patches and head inputs are replicated).
  if (!transformerBlock) return full + output;
  if (tp == 1) return full + output;
  // What stays whole on every TP rank (runtime/transformer.cpp). Without sequence parallelism, as in
  // Korthikanti et al. 2022, Table 2, "tensor parallel" row: the two LayerNorm outputs, the residual (3 * T *
  // C values, bf16 in bf16 precision) and the per-row LayerNorm statistics (4 * T, fp32). With it nothing
  // (the LayerNorm outputs are kept as sequence pieces and gathered per use, as in the paper's "tensor +
  // sequence parallel" row); the block's output (a piece but for the last block's) is counted above.
  if (p.sequenceParallel) {
    // (A mixture-of-experts block's expert outputs and routing stay whole.)
    const double moeWhole =
        (double(layer.tpWholeFloatsPerSample) * (p.precision == Precision::Bf16 ? 2.0 : 4.0) +
         double(layer.tpWholeStatFloatsPerSample) * 4.0) *
        plan.microbatchSize();
    return moeWhole + (full - moeWhole) / tp + output;
  }
  const double T = plan.model.samplePositions, C = plan.config.model.width;
  const double kept = p.precision == Precision::Bf16 ? 2.0 : 4.0;
  // (llama's RMSNorms keep only rstd: 2 * T statistics.)
  const double stats = plan.config.model.type == ModelType::Llama ? 2.0 : 4.0;
  const double whole = 3.0 * T * C * kept + stats * T * 4.0 + double(layer.tpWholeFloatsPerSample) * kept +
                       double(layer.tpWholeStatFloatsPerSample) * 4.0;
  const double replicated = std::min(full, whole * plan.microbatchSize());
  return replicated + (full - replicated) / tp + output;
}

// Whether layer l of chunk k is fully recomputed (plan/recompute.h, as runtime Model::recomputes); the
// embedding and the head keep what they keep.
bool recomputed(const Plan& plan, int k, int l) {
  return fullyRecomputed(RecomputePolicy::of(plan.config.parallel), plan.model,
                         plan.partition.chunks[static_cast<size_t>(k)], l);
}

// With recompute: what stays of layer l between its forward and its re-run, its output buffer (the next
// layer's input, from which that one is re-run; the chunk's input is the received message or the batch).
double layerCheckpointBytes(const Plan& plan, int l) {
  return layerOutputBytes(plan, l);
}

// The sum of per-chunk figures over the chunks a stage holds.
double sumOverStage(const Plan& plan, int stage, const std::vector<double>& perChunk) {
  double n = 0;
  for (int k : plan.partition.chunksOfStage(stage)) n += perChunk[static_cast<size_t>(k)];
  return n;
}

// The largest owned slice of a parameter unit of the stage as one TP rank holds it: the runtime's store keeps
// one unit per layer, the tied wte as a unit of its own (runtime/parameters.h), held by the embedding's stage
// and by a tied head's, and under expert parallelism a layer's local experts as another; sharded (ZeRO >= 1)
// the slice is the unit / dp x cp, an expert unit's / (dp x cp / ep).
double largestOwnedSlice(const Plan& plan, int stage, bool sharded) {
  const int tp = std::max(1, plan.config.parallel.tp), ep = std::max(1, plan.config.parallel.ep);
  const int replicas = sharded ? std::max(1, plan.config.parallel.dataReplicas()) : 1;
  const int expertReplicas = std::max(1, replicas / ep);
  const ModelConfig& m = plan.config.model;
  const bool tied = m.tiedHead();
  const double wteLocal = tied ? double(m.vocab) / tp * m.width : 0.0;
  double largest = 0;
  for (int l : plan.partition.layersOfStage(stage)) {
    const LayerSpec& layer = plan.model.layers[static_cast<size_t>(l)];
    double n = double(layer.localParamCount(tp, ep));
    if (ep > 1) {  // the local experts are a unit of their own
      const double experts = double(layer.localExpertParamCount(tp, ep));
      largest = std::max(largest, experts / expertReplicas);
      n -= experts;
    }
    if (tied && layer.kind == LayerKind::Embedding) n -= wteLocal;
    if (tied && (layer.kind == LayerKind::Embedding || layer.kind == LayerKind::Head))
      largest = std::max(largest, wteLocal / replicas);
    largest = std::max(largest, n / replicas);
  }
  return largest;
}

}  // namespace

std::vector<double> chunkParameterCount(const Plan& plan) {
  std::vector<double> counts;
  for (const auto& chunk : plan.partition.chunks) {
    double n = 0;
    for (int l : chunk) n += double(plan.model.layers[static_cast<size_t>(l)].paramCount());
    counts.push_back(n);
  }
  const TiedHead tied = tiedHead(plan);
  if (tied.headChunk >= 0) counts[static_cast<size_t>(tied.headChunk)] += tied.copyParams;
  return counts;
}

std::vector<double> chunkLocalParameterCount(const Plan& plan) {
  const int tp = std::max(1, plan.config.parallel.tp), ep = std::max(1, plan.config.parallel.ep);
  std::vector<double> counts;
  for (const auto& chunk : plan.partition.chunks) {
    double n = 0;
    for (int l : chunk) n += double(plan.model.layers[static_cast<size_t>(l)].localParamCount(tp, ep));
    counts.push_back(n);
  }
  const TiedHead tied = tiedHead(plan);  // wte is vocabulary-parallel
  if (tied.headChunk >= 0) counts[static_cast<size_t>(tied.headChunk)] += tied.copyParams / tp;
  return counts;
}

std::vector<double> chunkLocalExpertParameterCount(const Plan& plan) {
  const int tp = std::max(1, plan.config.parallel.tp), ep = std::max(1, plan.config.parallel.ep);
  std::vector<double> counts;
  for (const auto& chunk : plan.partition.chunks) {
    double n = 0;
    if (ep > 1)
      for (int l : chunk)
        n += double(plan.model.layers[static_cast<size_t>(l)].localExpertParamCount(tp, ep));
    counts.push_back(n);
  }
  return counts;
}

double stageLocalExpertParameterCount(const Plan& plan, int stage) {
  return sumOverStage(plan, stage, chunkLocalExpertParameterCount(plan));
}

double stageOwnedParameterCount(const Plan& plan, int stage) {
  return ownedParameterCount(plan, stageLocalParameterCount(plan, stage),
                             stageLocalExpertParameterCount(plan, stage));
}

double ownedParameterCount(const Plan& plan, double local, double experts) {
  const ParallelConfig& p = plan.config.parallel;
  if (p.zero < 1) return local;
  const int replicas = std::max(1, p.dataReplicas()), ep = std::max(1, p.ep);
  return (local - experts) / replicas + experts / std::max(1, replicas / ep);
}

std::vector<double> zero3LayerParams(const Plan& plan) {
  const int tp = std::max(1, plan.config.parallel.tp), ep = std::max(1, plan.config.parallel.ep);
  const ModelConfig& m = plan.config.model;
  const bool tied = m.tiedHead();
  std::vector<double> g;
  for (const LayerSpec& layer : plan.model.layers) {
    double n = double(layer.localParamCount(tp, ep));  // the embedding's includes wte; 1/ep of the experts
    if (tied && layer.kind == LayerKind::Head) n += double(m.vocab) / tp * m.width;
    g.push_back(n);
  }
  return g;
}

double zero3GatheredParams(const Plan& plan, int stage) {
  const std::vector<double> g = zero3LayerParams(plan);
  double most = 0;
  for (int k : plan.partition.chunksOfStage(stage)) {
    const auto& chunk = plan.partition.chunks[static_cast<size_t>(k)];
    for (size_t i = 0; i < chunk.size(); ++i) {
      double n = g[static_cast<size_t>(chunk[i])];
      if (i + 1 < chunk.size()) n += g[static_cast<size_t>(chunk[i + 1])];
      most = std::max(most, n);
    }
  }
  return most;
}

double stageLocalParameterCount(const Plan& plan, int stage) {
  return sumOverStage(plan, stage, chunkLocalParameterCount(plan));
}

double stageParameterCount(const Plan& plan, int stage) {
  return sumOverStage(plan, stage, chunkParameterCount(plan));
}

bool fusedAttention(const Plan& plan, int stage) {
  const ModelConfig& m = plan.config.model;
  if (!isTransformer(m.type) || m.heads <= 0 || m.width % m.heads) return false;
  return isGpuDevice(stageDevice(plan, stage)) && m.width / m.heads <= kFusedAttentionMaxHeadSize;
}

std::vector<double> chunkActivationBytes(const Plan& plan, Routing routing) {
  std::vector<double> bytes;
  for (size_t k = 0; k < plan.partition.chunks.size(); ++k) {
    const bool fused = fusedAttention(plan, plan.partition.stageOf[k]);
    double b = 0;
    for (int l : plan.partition.chunks[k])
      b += recomputed(plan, static_cast<int>(k), l) ? layerCheckpointBytes(plan, l)
                                                    : layerActivationBytes(plan, l, fused, routing);
    bytes.push_back(b);
  }
  return bytes;
}

std::vector<double> chunkSplitBackwardBytes(const Plan& plan, Routing routing) {
  std::vector<double> bytes(plan.partition.chunks.size(), 0.0);
  if (!plan.schedule.splitBackward) return bytes;
  const ParallelConfig& p = plan.config.parallel;
  const ModelConfig& m = plan.config.model;
  const double tp = std::max(1, p.tp), T = plan.model.samplePositions, C = m.width, F = double(m.mlpHidden());
  for (size_t k = 0; k < plan.partition.chunks.size(); ++k) {
    const bool fused = fusedAttention(plan, plan.partition.stageOf[k]);
    for (int l : plan.partition.chunks[k]) {
      if (plan.model.layers[static_cast<size_t>(l)].kind != LayerKind::Block || !isTransformer(m.type))
        continue;
      // runtime/transformer.cpp, split backward: the output gradients of the MLP's and attention's output
      // projections (T * C each, whole) and of the fc and qkv projections (T * F / tp, T * 3C / tp), fp32;
      // llama's gate and up (T * 2F / tp) and q, k and v (T * (H + 2 KV) hs / tp).
      const bool llama = m.type == ModelType::Llama;
      // A mixture-of-experts block defers only its shared experts' weights (runtime/moe.h).
      const std::string& name = plan.model.layers[static_cast<size_t>(l)].name;
      const bool moe = llama && m.moeBlock(std::stoi(name.substr(name.find('.') + 1)));
      const double mlpIn = moe ? 2.0 * m.sharedExperts * m.expertHidden() : llama ? 2.0 * F : F;
      const double qkvOut = llama ? double(m.heads + 2 * m.kvHeadCount()) * (C / m.heads) : 3.0 * C;
      double b = (2.0 * C + (mlpIn + qkvOut) / tp) * T * 4.0 * plan.microbatchSize();
      // A recomputed block's activations, re-made in B, stay until W.
      if (recomputed(plan, static_cast<int>(k), l))
        b += layerActivationBytes(plan, l, fused, routing) - layerOutputBytes(plan, l);
      bytes[k] += b;
    }
  }
  return bytes;
}

double recomputeWorkspaceBytes(const Plan& plan, int stage, Routing routing) {
  if (plan.config.parallel.recompute != Recompute::Full) return 0.0;
  // With a split backward the re-made activations are held until W (chunkSplitBackwardBytes).
  if (plan.schedule.splitBackward) return 0.0;
  const bool fused = fusedAttention(plan, stage);
  double largest = 0;
  for (int k : plan.partition.chunksOfStage(stage))
    for (int l : plan.partition.chunks[static_cast<size_t>(k)])
      if (recomputed(plan, k, l))
        largest =
            std::max(largest, layerActivationBytes(plan, l, fused, routing) - layerOutputBytes(plan, l));
  return largest;
}

namespace {

double pipelineBufferBytes(const Plan& plan, int stage) {
  // The pipeline executor's message buffers (runtime/pipeline.cpp), followed over the stage's action order:
  // a received activation (m, k) is held until the backward of (m, k + 1) is done (its W under a split
  // backward); a received gradient (m, k) until B(m, k - 1) is done; a backward B(m, k), k > 0, writes its
  // input gradient into a buffer of chunk k - 1's output size, freed, when chunk k - 1 is local, once
  // B(m, k - 1) is done, and otherwise once its send has completed. A send above the transport's eager size
  // completes only when the peer has posted the receive, which can come after this stage has gone on (by
  // timing: two TP ranks of one stage were measured holding two and three such buffers): it is counted held
  // until this stage completes a receive from that peer which the peer sends after posting it, the latest it
  // can be freed. Activations are sent from the layers' own output buffers. The stage's peak of the sum (in
  // bf16 under "precision": "bf16", as chunkMessageBytes sizes them).
  const PipelineSchedule& schedule = plan.schedule;
  const int P = static_cast<int>(schedule.actions.size());
  if (stage < 0 || stage >= P) return 0.0;
  const std::vector<Action>& actions = schedule.actions[static_cast<size_t>(stage)];
  const std::vector<double> messages = chunkMessageBytes(plan);
  const int K = static_cast<int>(messages.size());
  const int M = schedule.microbatches;
  if (M <= 0 || K == 0) return 0.0;
  const auto bytes = [&](int k) { return k >= 0 && k < K ? messages[size_t(k)] : 0.0; };
  const auto key = [&](int m, int k) { return int64_t(m) * (K + 1) + (k + 1); };
  // Held bytes keyed (m, k) as the executor keys them: received activations, written input gradients,
  // received gradients; few are in flight at once, so flat lists.
  using Held = std::vector<std::pair<int64_t, double>>;
  Held activations, gradients, received;
  double live = 0, peak = 0;
  const auto hold = [&](Held& held, int m, int k, double n) {
    held.emplace_back(key(m, k), n);
    live += n;
  };
  const auto drop = [&](Held& held, int m, int k) {
    const int64_t id = key(m, k);
    for (auto it = held.begin(); it != held.end(); ++it)
      if (it->first == id) {
        const double n = it->second;
        live -= n;
        held.erase(it);
        return n;
      }
    return 0.0;
  };
  // Where in each neighbouring stage's actions its sends and gradient receives are, by (type, m, k), built on
  // first use (the schedules of large runs have thousands of actions a stage).
  std::vector<std::unordered_map<int64_t, int>> positions(static_cast<size_t>(P));
  std::vector<char> indexed(static_cast<size_t>(P), 0);
  const auto position = [&](int peer, ActionType type, int m, int k) {
    const auto code = [&](ActionType t, int mb, int c) { return key(mb, c) * 16 + int(t); };
    if (!indexed[size_t(peer)]) {
      indexed[size_t(peer)] = 1;
      const std::vector<Action>& list = schedule.actions[size_t(peer)];
      for (size_t i = 0; i < list.size(); ++i)
        if (list[i].type == ActionType::SendActivation || list[i].type == ActionType::SendGrad ||
            list[i].type == ActionType::RecvGrad)
          positions[size_t(peer)].emplace(code(list[i].type, list[i].microbatch, list[i].chunk), int(i));
    }
    const auto& map = positions[size_t(peer)];
    const auto it = map.find(code(type, m, k));
    return it == map.end() ? -1 : it->second;
  };
  // Sent gradients not yet known complete: the peer, where in its actions it receives them, the bytes.
  struct Pending {
    int peer = 0, peerRecv = 0;
    double bytes = 0;
  };
  std::vector<Pending> pending;
  for (const Action& a : actions) {
    const int m = a.microbatch, k = a.chunk;
    const bool peerKnown = a.peer >= 0 && a.peer < P;
    switch (a.type) {
      case ActionType::RecvActivation:
      case ActionType::RecvGrad: {
        const bool activation = a.type == ActionType::RecvActivation;
        hold(activation ? activations : received, m, k, activation ? bytes(k) : bytes(k - 1));
        peak = std::max(peak, live);
        // The peer sent this after everything before its send: its receives of our earlier sends too.
        if (peerKnown && !pending.empty()) {
          const int sent =
              position(a.peer, activation ? ActionType::SendActivation : ActionType::SendGrad, m, k);
          for (auto it = pending.begin(); it != pending.end();)
            if (it->peer == a.peer && sent > it->peerRecv) {
              live -= it->bytes;
              it = pending.erase(it);
            } else {
              ++it;
            }
        }
        break;
      }
      case ActionType::Backward:
        if (k > 0) hold(gradients, m, k, bytes(k - 1));
        peak = std::max(peak, live);
        drop(received, m, k + 1);
        drop(gradients, m, k + 1);
        if (!schedule.splitBackward) drop(activations, m, k - 1);
        break;
      case ActionType::BackwardWeight:
        drop(activations, m, k - 1);
        break;
      case ActionType::SendGrad: {
        const double n = drop(gradients, m, k);
        if (n <= 0) break;
        const int peerRecv = peerKnown ? position(a.peer, ActionType::RecvGrad, m, k) : -1;
        pending.push_back({a.peer, peerRecv, n});
        live += n;
        break;
      }
      default:
        break;
    }
    peak = std::max(peak, live);
  }
  return peak;
}

// A layer's owned gradient shard, in elements: what ZeRO-1 and ZeRO >= 2 reduce-scatter it into
// (runtime/parameters.cpp startSync, reduceGrads): its dense part over the dp x cp replicas, its local
// experts' over their dp x cp / ep replicas (none when they have no replica). `excluded` elements (a tied
// embedding's wte, reduced whole under ZeRO >= 2) are left out.
double ownedGradientShard(const Plan& plan, int l, double excluded) {
  const ParallelConfig& p = plan.config.parallel;
  const int tp = std::max(1, p.tp), ep = std::max(1, p.ep), replicas = std::max(1, p.dataReplicas()),
            expertReplicas = std::max(1, replicas / ep);
  const LayerSpec& layer = plan.model.layers[static_cast<size_t>(l)];
  const double n = double(layer.localParamCount(tp, ep)) - excluded;
  const double experts = ep > 1 ? double(layer.localExpertParamCount(tp, ep)) : 0.0;
  return (n - experts) / replicas + (expertReplicas > 1 ? experts / expertReplicas : 0.0);
}

// A stage's parts that change over a step, followed together over its actions in the runtime's order,
// layer by layer inside a forward or backward (runtime/model.cpp forwardChunk, backwardChunk;
// runtime/parameters.cpp):
// - the activation slots (grow-only, as slotActivationBytes) and a split backward's buffers;
// - a fully recomputed layer's re-made activations (recomputeWorkspaceBytes), held during its backward only;
// - the pipeline message buffers, at their peak (pipelineBufferBytes; below);
// - ZeRO-1's reduce-scatter staging: each layer's owned shard from its step's last backward (after its
//   re-made activations and gathered parameters are released: startSync) to the optimizer step;
// - ZeRO >= 2's gradient buckets: a layer's full gradients from its backward (ensureGrads; under a split
//   backward from B to W) until reduced, at most one reduction in flight (reduceGrads finishes the one before
//   it starts the next), a shard of staging for each reduction after the step's first of that layer, and a
//   tied embedding's whole gradients from its first backward to the end of the step;
// - ZeRO-3's gathered parameters: the layer computed and the one prefetched (acquire(l), prefetch(l -/+ 1)).
// Everything else (model states, workspace, the CUDA context) is held the whole step. `chunkBytes` and
// `splitBytes` are chunkActivationBytes and chunkSplitBackwardBytes, `messages` the stage's
// pipelineBufferBytes (estimateMemory has them already). Returns the most these parts hold at once.
double concurrentStageBytes(const Plan& plan, int stage, const std::vector<double>& chunkBytes,
                            const std::vector<double>& splitBytes, double messages, Routing routing) {
  double out = 0;
  const PipelineSchedule& schedule = plan.schedule;
  if (stage < 0 || stage >= static_cast<int>(schedule.actions.size())) return out;
  const std::vector<Action>& actions = schedule.actions[static_cast<size_t>(stage)];
  const ParallelConfig& p = plan.config.parallel;
  const ModelConfig& model = plan.config.model;
  const ModelStateLayout state = modelStateLayout(p, plan.config.optimizer);
  const int K = static_cast<int>(plan.partition.chunks.size());
  const auto entry = [](const std::vector<double>& v, int k) {
    return k >= 0 && k < static_cast<int>(v.size()) ? v[static_cast<size_t>(k)] : 0.0;
  };
  // The pipeline's message buffers are taken at their peak throughout: the executor frees a sent message
  // only once it sees it complete (runtime/pipeline.cpp waitSends, after each action and at the step's end),
  // which timing decides; the suite's pipelined ZeRO plans were measured holding their busiest messages
  // beside the whole ZeRO-1 staging (the cnn pp2's last stage) and above the action order's count beside the
  // ZeRO-2 buckets (gpt ZB-H1: two ranks of one stage 8 and 16 KiB apart).
  const bool split = schedule.splitBackward;
  const bool fused = fusedAttention(plan, stage);
  const int replicas = std::max(1, p.dataReplicas()), ep = std::max(1, p.ep), tp = std::max(1, p.tp);
  const bool zero1 = p.zero == 1 && replicas > 1, buckets = p.zero >= 2, zero3 = p.zero == 3 && replicas > 1;
  const std::vector<double> gathered = zero3 ? zero3LayerParams(plan) : std::vector<double>{};
  const auto params = [&](const std::vector<int>& chunk, int i) {  // ZeRO-3: layer i of the chunk, in bytes
    return i >= 0 && i < static_cast<int>(chunk.size())
               ? gathered[static_cast<size_t>(chunk[static_cast<size_t>(i)])] * state.workingBytes
               : 0.0;
  };
  const bool tied = model.tiedHead();
  const double wteBytes = tied ? double(model.vocab) / tp * model.width * state.gradientBytes : 0.0;
  // Layer l's full gradients (a tied embedding's wte apart) and its owned shard, as otherBreakdown's
  // dpBucket.
  const auto full = [&](int l) {
    const LayerSpec& layer = plan.model.layers[static_cast<size_t>(l)];
    double n = double(layer.localParamCount(tp, ep)) * state.gradientBytes;
    if (tied && layer.kind == LayerKind::Embedding) n -= wteBytes;
    return n;
  };
  const auto shard = [&](int l) {
    const bool wte =
        buckets && tied && plan.model.layers[static_cast<size_t>(l)].kind == LayerKind::Embedding;
    return ownedGradientShard(plan, l, wte ? wteBytes / state.gradientBytes : 0.0) * state.gradientBytes;
  };
  // A fully recomputed layer's re-made activations, held during its own backward (not a split one's: those
  // are the split buffers).
  std::vector<double> remade(plan.model.layers.size(), 0.0);
  if (!split)
    for (int k : plan.partition.chunksOfStage(stage))
      for (int l : plan.partition.chunks[static_cast<size_t>(k)])
        if (recomputed(plan, k, l))
          remade[size_t(l)] = layerActivationBytes(plan, l, fused, routing) - layerOutputBytes(plan, l);
  const auto touchesWte = [&](int l) {
    const LayerKind kind = plan.model.layers[static_cast<size_t>(l)].kind;
    return tied && (kind == LayerKind::Embedding || kind == LayerKind::Head);
  };
  // The action of each chunk's last backward (its W when split): its layers' gradients are then final.
  const ActionType finishing = split ? ActionType::BackwardWeight : ActionType::Backward;
  std::vector<int> finalUse(static_cast<size_t>(K), -1);
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].type == finishing && actions[i].chunk >= 0 && actions[i].chunk < K)
      finalUse[static_cast<size_t>(actions[i].chunk)] = static_cast<int>(i);
  // A forward's most for a moment per chunk (gathered parameters): its layers need not be walked.
  std::vector<double> forwardMost(static_cast<size_t>(K), 0.0);
  for (int k : plan.partition.chunksOfStage(stage)) {
    const std::vector<int>& chunk = plan.partition.chunks[static_cast<size_t>(k)];
    for (int i = 0; i < static_cast<int>(chunk.size()); ++i)
      forwardMost[size_t(k)] =
          std::max(forwardMost[size_t(k)], zero3 ? params(chunk, i) + params(chunk, i + 1) : 0.0);
  }
  std::vector<int> inFlight(static_cast<size_t>(K), 0), most(static_cast<size_t>(K), 0);
  std::vector<char> reducedOnce(plan.model.layers.size(), 0);
  // Buckets: the full gradients held under a split backward (from B to W) per layer, the reduction in
  // flight (its full gradients and staging), the tied wte.
  std::vector<double> splitFull(plan.model.layers.size(), 0.0);
  double slots = 0, splitHeld = 0, staging = 0, pendingBytes = 0, splitFullHeld = 0, wteHeld = 0;
  const auto sample = [&](double message, double transientActivations, double transientCommunication) {
    const double communication =
        message + staging + pendingBytes + splitFullHeld + wteHeld + transientCommunication;
    out = std::max(out, slots + splitHeld + transientActivations + communication);
  };
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const int k = a.chunk;
    const bool known = k >= 0 && k < K;
    if (!known || (a.type != ActionType::Forward && a.type != ActionType::Backward &&
                   a.type != ActionType::BackwardWeight)) {
      sample(messages, 0.0, 0.0);
      continue;
    }
    const std::vector<int>& chunk = plan.partition.chunks[static_cast<size_t>(k)];
    if (a.type == ActionType::Forward) {
      if (++inFlight[size_t(k)] > most[size_t(k)]) {
        most[size_t(k)] = inFlight[size_t(k)];
        slots += entry(chunkBytes, k);
      }
      sample(messages, 0.0, forwardMost[size_t(k)]);
      continue;
    }
    const bool weight = a.type == ActionType::BackwardWeight;
    const bool last = finalUse[size_t(k)] == static_cast<int>(i);
    if (split && !weight) splitHeld += entry(splitBytes, k);
    // Layer by layer from the chunk's last.
    for (int j = static_cast<int>(chunk.size()) - 1; j >= 0; --j) {
      const int l = chunk[static_cast<size_t>(j)];
      double current = 0;  // this layer's full gradients, made for its backward
      if (buckets) {
        if (touchesWte(l)) wteHeld = wteBytes;
        if (split && !weight) {
          if (splitFull[size_t(l)] == 0.0) {
            splitFull[size_t(l)] = full(l);
            splitFullHeld += full(l);
          }
        } else if (!split) {
          current = full(l);
        }
      }
      sample(messages, weight ? 0.0 : remade[size_t(l)],
             current + (zero3 ? params(chunk, j) + params(chunk, j - 1) : 0.0));
      if (split && !weight) continue;  // B of a split backward: the gradients wait for W
      if (zero1 && last) staging += shard(l);
      if (buckets) {
        // reduceGrads: the reduction in flight finishes, this layer's starts (into staging after its first).
        if (split) {
          current = splitFull[size_t(l)];
          splitFullHeld -= current;
          splitFull[size_t(l)] = 0.0;
        }
        pendingBytes = current + (reducedOnce[size_t(l)] ? shard(l) : 0.0);
        reducedOnce[size_t(l)] = 1;
      }
    }
    if (weight || !split) --inFlight[size_t(k)];
    if (weight) splitHeld -= entry(splitBytes, k);
  }
  return out;
}

}  // namespace

OtherBytes otherBreakdown(const Plan& plan, int stage, bool gpu, Routing routing) {
  const ParallelConfig& p = plan.config.parallel;
  const double tp = std::max(1, p.tp);
  const double mbs = plan.microbatchSize();
  const int K = static_cast<int>(plan.partition.chunks.size());
  const ModelStateLayout state = modelStateLayout(p, plan.config.optimizer);
  OtherBytes o;

  o.p2pBuffers = pipelineBufferBytes(plan, stage);

  // Gradient buckets (runtime/parameters.h). ZeRO 0 all-reduces the rank's flat gradient buffer in place:
  // none (PyTorch DDP's 25 MiB buckets exist because its gradients are separate tensors). ZeRO >= 2 reduce-
  // scatter each layer's gradients once per microbatch (DeepSpeed's ZeRO-2 under accumulation): the full
  // gradients of the layer being computed and of the one being reduced (the stage's two largest layer units;
  // all of them under a split backward, whose input parts come before the weight parts), a shard of staging
  // when microbatches accumulate, and a tied embedding's full gradients, summed once per step (across its
  // two stages) and kept whole until then.
  // ZeRO-1 reduce-scatters each unit's gradients once a step into a shard of staging, every unit's in flight
  // from its last backward to the optimizer step (runtime/parameters.cpp startSync): the stage's owned
  // gradient shards, dense over dp x cp, the local experts' over their dp x cp / ep replicas.
  if (p.zero == 1 && p.dataReplicas() > 1) {
    double shards = 0;
    for (int l : plan.partition.layersOfStage(stage)) shards += ownedGradientShard(plan, l, 0.0);
    o.dpBucket = shards * state.gradientBytes;
  }
  if (p.zero >= 2) {
    const ModelConfig& m = plan.config.model;
    const bool tied = m.tiedHead();
    const double wteLocal = tied ? double(m.vocab) / tp * m.width : 0.0;
    // Under expert parallelism a layer's full gradients are its unit's and its local experts' unit's, the
    // latter reduce-scattered over the dp x cp / ep expert-data-parallel ranks.
    const int ep = std::max(1, p.ep), replicas = std::max(1, p.dataReplicas());
    std::vector<double> units;
    double largestShard = 0;
    bool holdsTied = false;
    for (int l : plan.partition.layersOfStage(stage)) {
      const LayerSpec& layer = plan.model.layers[static_cast<size_t>(l)];
      double n = double(layer.localParamCount(static_cast<int>(tp), ep));
      const double experts = ep > 1 ? double(layer.localExpertParamCount(static_cast<int>(tp), ep)) : 0.0;
      if (tied && layer.kind == LayerKind::Embedding) n -= wteLocal;
      if (tied && (layer.kind == LayerKind::Embedding || layer.kind == LayerKind::Head)) holdsTied = true;
      units.push_back(n);
      largestShard = std::max({largestShard, (n - experts) / replicas, experts / std::max(1, replicas / ep)});
    }
    std::sort(units.begin(), units.end(), std::greater<double>());
    double full = 0;
    for (size_t i = 0; i < units.size() && (plan.schedule.splitBackward || i < 2); ++i) full += units[i];
    if (holdsTied) full += wteLocal;
    const double staging = p.microbatches > 1 && !units.empty() ? largestShard : 0.0;
    o.dpBucket = (full + staging) * state.gradientBytes;
  }

  // Backward workspace: the output gradient and the input gradient of the stage's largest layer output for
  // one microbatch; the stage with a gpt head also holds a chunk of its logits (below).
  const double seqSplit = p.sequenceParallel ? tp : 1.0;
  const bool fused = fusedAttention(plan, stage);
  // Under "precision": "bf16" the runtime Model also widens a layer's bf16 input and stages its fp32
  // output before rounding it (two fp32 buffers: the largest input and the largest output, as held).
  double staging = 0;
  if (p.precision == Precision::Bf16) {
    double input = 0, output = 0;
    for (int l : plan.partition.layersOfStage(stage)) {
      output = std::max(output, double(plan.model.layers[static_cast<size_t>(l)].heldOutputBytesPerSample()));
      if (l > 0)
        input =
            std::max(input, double(plan.model.layers[static_cast<size_t>(l - 1)].heldOutputBytesPerSample()));
    }
    staging = (input + output) * mbs;
  }
  double blockWorkspace = 0, blockRowsC = 0, headLogits = 0, headRowsC = 0;  // bytes, floats
  // The largest fp32 output gradient and fp32 input a GEMM of the stage converts to bf16 (floats): the
  // blocks' inputs are kept in bf16 already (runtime/layer_impl.h KeptInput) and the weights have bf16
  // working copies, so what is converted is the blocks' output gradients and the head's logits gradient
  // chunk and ln_f output rows.
  double doutFloats = 0, inputFloats = 0;
  // The two activation-gradient buffers the backward alternates between (runtime/model.cpp backwardChunk):
  // the gradient of layer l's output sits in buffer l % 2 unless l ends its chunk (that one arrives as the
  // chunk's dOut: a message, or the next chunk's dIn), and layer l's input gradient is written to buffer
  // (l + 1) % 2 unless l begins its chunk (that one goes to the chunk's dIn). Each buffer is as large as its
  // largest use. Under bf16 a chunk's dOut is widened in buffer last % 2, and its dIn is staged in buffer
  // (first + 1) % 2. A stage holding one embedding alone has none (measured: 0 bytes).
  const auto outBytes = [&](int l) {
    return double(plan.model.layers[static_cast<size_t>(l)].heldOutputBytesPerSample()) * mbs;
  };
  double gradientBuffers[2] = {0.0, 0.0};
  for (int k : plan.partition.chunksOfStage(stage)) {
    const std::vector<int>& chunk = plan.partition.chunks[static_cast<size_t>(k)];
    if (chunk.empty()) continue;
    const int first = chunk.front(), last = chunk.back();
    for (int l : chunk) {
      if (l != last) gradientBuffers[l % 2] = std::max(gradientBuffers[l % 2], outBytes(l));
      if (l > first) gradientBuffers[(l + 1) % 2] = std::max(gradientBuffers[(l + 1) % 2], outBytes(l - 1));
    }
    if (p.precision == Precision::Bf16) {
      if (k + 1 < K) gradientBuffers[last % 2] = std::max(gradientBuffers[last % 2], outBytes(last));
      if (first > 0)
        gradientBuffers[(first + 1) % 2] = std::max(gradientBuffers[(first + 1) % 2], outBytes(first - 1));
    }
  }
  const double gradientBufferBytes = gradientBuffers[0] + gradientBuffers[1];
  o.workspace = gradientBufferBytes;
  // The cnn's layers (runtime/cnn_layers.cpp) keep their backward's element-wise gradients in layer scratch
  // slots of the microbatch's output size: the stem slots 0 and 1, a residual block 0 to 3; and every
  // BatchNorm holds 6 C doubles of sums (its forward and backward sums and their local copies).
  if (plan.config.model.type == ModelType::Cnn) {
    double slots01 = 0, slots23 = 0, bnChannels = 0;
    for (int l : plan.partition.layersOfStage(stage)) {
      const LayerSpec& layer = plan.model.layers[static_cast<size_t>(l)];
      if (layer.kind != LayerKind::Head) slots01 = std::max(slots01, outBytes(l));
      if (layer.kind == LayerKind::Block) slots23 = std::max(slots23, outBytes(l));
      for (const ParamSpec& b : layer.buffers)
        if (b.name.size() > 13 && b.name.compare(b.name.size() - 13, 13, ".running_mean") == 0)
          bnChannels += double(b.numel());
    }
    o.workspace += 2.0 * (slots01 + slots23) + 12.0 * 4.0 * bnChannels;
    // The head: its pooled features' gradient (B, C) in slot 0, and the column of ones it pools with.
    for (int l : plan.partition.layersOfStage(stage)) {
      const LayerSpec& layer = plan.model.layers[static_cast<size_t>(l)];
      if (layer.kind != LayerKind::Head) continue;
      const double side = double(cnnStageSides(plan.config.model).back());
      const double pooled = mbs * double(plan.config.model.channels.back()) * 4.0;
      o.workspace += std::max(0.0, pooled - slots01) + side * side * 4.0;
    }
  }
  // The vit's head (runtime/classifier_layers.cpp): the pooled features' gradient (B, C) in slot 0 and ln_f's
  // (B, T, C) in slot 1, within a block's slots where the stage has blocks.
  if (plan.config.model.type == ModelType::Vit) {
    bool head = false, blocks = false;
    for (int l : plan.partition.layersOfStage(stage)) {
      head = head || plan.model.layers[static_cast<size_t>(l)].kind == LayerKind::Head;
      blocks = blocks || plan.model.layers[static_cast<size_t>(l)].kind == LayerKind::Block;
    }
    const double C = plan.config.model.width, T = plan.model.samplePositions;
    if (head && !blocks) o.workspace += mbs * (C + T * C) * 4.0;
  }
  for (int l : plan.partition.layersOfStage(stage)) {
    const LayerSpec& layer = plan.model.layers[static_cast<size_t>(l)];
    // A gpt embedding's TP all-reduce of its lookup, staged in bf16 (runtime allReduceActivations; a
    // block's staging, counted below, is at least as large, and so is the head's).
    if (p.precision == Precision::Bf16 && tp > 1 && isLanguageModel(plan.config.model.type) &&
        layer.kind == LayerKind::Embedding)
      o.workspace = std::max(o.workspace, gradientBufferBytes + 2.0 * mbs * plan.model.samplePositions *
                                                                    plan.config.model.width);
    if (layer.kind == LayerKind::Block && isTransformer(plan.config.model.type)) {
      // A transformer block's scratch in the runtime (engine/runtime/transformer.cpp, one shared workspace of
      // slots), per sample in floats, beside the model's two activation-gradient buffers (as held): slot 0
      // the residual's gradient (T, C), a (T/tp, C) piece under sequence parallelism; 1 the LayerNorm input's
      // gradient (T, C); 2 and 3 the MLP's two (T, F/tp) gradients (2 also stages the kept GEMM inputs in
      // bf16, at most a LayerNorm output); 4 the q|k|v gradient (T, 3C/tp), or the sequence-parallel
      // forward's gathered (T, C); 5 attention's scratch / tp (the scores' gradient (H, T, T) where the
      // softmax is materialised, the rows' (H, T) dot products where it is fused, plus in bf16 an fp32 copy
      // of the kept output), or the (T, C) staging of a sequence gather or reduce-scatter; under sequence
      // parallelism 6 a gathered (T, C) gradient and 7 a (T/tp, C) piece, and 31 (below).
      const ModelConfig& m = plan.config.model;
      const bool bf16 = p.precision == Precision::Bf16, sp = p.sequenceParallel && tp > 1;
      const double T = plan.model.samplePositions, C = m.width, F = double(m.mlpHidden());
      const double Cs = C / seqSplit, spC = sp ? C : 0.0;
      // Ring attention (context parallelism) asks for no scratch of slot 5; its key|value blocks of the
      // grouped-query heads, (T, 2 KV hs / tp) each, take slots 24-28: the one in hand and the one arriving,
      // and in backward their dK|dV accumulators, in fp32 four of them; in bf16 the two travelling ones are
      // bf16 and attention reads a widened copy, four again.
      const bool ring = layer.ringAttention;
      const double attention = ring    ? 0.0
                               : fused ? double(m.heads) * T + (bf16 ? T * C : 0.0)
                                       : double(m.heads) * T * T;
      // llama: slot 3 holds the gate and up gradients (2F / tp) and then the q, k, v projections' gradients
      // ((H + 2 KV) hs / tp); slot 7 the q, k, v projections in forward.
      const bool llama = m.type == ModelType::Llama;
      const double qkvProjections = llama ? double(m.heads + 2 * m.kvHeadCount()) * (C / m.heads) / tp : 0.0;
      const double slot3 = llama ? std::max(2.0 * F / tp, qkvProjections) : F / tp;
      const double slot7 = std::max(sp ? C / tp : 0.0, qkvProjections);
      double floats = T * (Cs + C + std::max(F / tp, bf16 ? Cs : 0.0) + slot3 + std::max(3.0 * C / tp, spC)) +
                      std::max(attention / tp, T * spC) + T * ((sp ? C : 0.0) + slot7);
      // Selective recompute (recompute.h) re-makes the attention matrix in slot 8, with the attention output
      // the re-run writes and nobody reads: (H, T, T) + (T, C) per sample, / tp.
      const bool selective =
          recomputesAttention(RecomputePolicy::of(p), m.type, layer.kind, static_cast<int>(T), fused || ring);
      if (selective) floats += (double(m.heads) * T * T + T * C) / tp;
      // Slot 31: the gathered output gradient (T, C) where the output is a piece; under tp_comm_overlap,
      // unless the backward is split, also the rank-major staging of the LayerNorm re-gathers (T, C in the
      // kept precision).
      double slot31 = sp && layer.outputPieces > 1 ? T * C : 0.0;
      if (sp && p.tpCommOverlap && !plan.schedule.splitBackward)
        slot31 = std::max(slot31, T * C * (bf16 ? 0.5 : 1.0));
      floats += slot31;
      if (ring) floats += 4.0 * T * 2.0 * m.kvHeadCount() * (C / m.heads) / tp;
      // A mixture-of-experts block (runtime/moe.cpp, slots 14-23), per sample of T positions (whole under
      // sequence parallelism: the experts read the gathered LayerNorm output), with R = k T routed rows and
      // balanced routing (each expert takes R / E rows; dropless routing's busiest expert takes more, 2.3x
      // the average with an untrained router in the fortunes MoE): slot 14 the experts' fp32 copy of their
      // input (T, C); 15 the router's logits and their gradient (T, E), or the gates' gradients (R); without
      // ep, one expert's gathered rows and their gradient (2 R/E C) and its scratch (R/E (3 Fe/tp + C)), in
      // bf16 the fp32 staging of the kept gate|up (2 Fe/tp), SwiGLU output (Fe/tp) and expert output (C) of
      // every row (slots 18-20); with ep the rank's experts' received rows (Rr = R, balanced) in expert
      // order (16) and their gradient (23), the widest local expert's scratch (Rr / (E/ep) 3 Fe/tp), the
      // all-to-all's send and receive staging (21, 22: R C each), in bf16 the same staging of Rr rows and
      // the rows as they travel in bf16 (29, 30: R C / 2 each).
      if (m.experts > 0 && layer.expertParamCount > 0) {
        const double E = m.experts, R = T * m.expertsPerToken, Fe = double(m.expertHidden()) / tp;
        const int ep = std::max(1, p.ep);
        const RoutedRows routed = routedRowsPerSample(plan, routing);
        double moe = T * C + std::max(T * E, R);
        if (ep == 1) {
          const double most = routed.widest;
          moe += 2.0 * most * C + most * (3.0 * Fe + C);
          if (bf16) moe += R * (3.0 * Fe + C);
        } else {
          const double Rr = routed.received, widest = routed.widest;
          moe += 2.0 * Rr * C + widest * 3.0 * Fe + (R + Rr) * C;
          if (bf16) moe += Rr * 3.0 * Fe + R * C + (R + Rr) * C / 2.0;
        }
        floats += moe;
      }
      // In bf16 the kept q|k|v, attention matrix, residual and GELU input (llama's gate and up) (layer_impl.h
      // KeptTensor) are staged in fp32 in slots 9-12 in forward and widened there in backward; under
      // selective recompute the matrix's slot holds the re-made matrix's bf16 rounding, half the size.
      if (bf16) {
        const double matrix = fused || ring ? 0.0 : double(m.heads) * T * T * (selective ? 0.5 : 1.0);
        floats += ((3.0 * C + (llama ? 2.0 * F : F)) * T + matrix) / tp + T * Cs;
        // Slot 13, the TP collectives' bf16 staging: a (T, C) all-reduce, or under sequence parallelism a
        // reduce-scatter's (T, C) whole and (T / tp, C) piece.
        if (tp > 1) floats += T * C * (sp ? 1.0 + 1.0 / tp : 1.0) / 2.0;
      }
      doutFloats = std::max(doutFloats, mbs * T * std::max({C, F / tp, 3.0 * C / tp}));
      blockWorkspace = std::max(blockWorkspace, floats * 4.0 * mbs + gradientBufferBytes);
      o.workspace = std::max(o.workspace, blockWorkspace);
      blockRowsC = std::max(blockRowsC, mbs * T * C);
    }
    if (layer.kind == LayerKind::Head && isLanguageModel(plan.config.model.type)) {
      // The fused LM head and loss (runtime/gpt_layers.cpp): ln_f's output and one chunk of logits (plus
      // three floats a row for the vocabulary-parallel loss), beside the input gradient it hands back.
      const double rows = mbs * plan.model.samplePositions, C = plan.config.model.width;
      const double vocabLocal = std::floor(double(plan.config.model.vocab) / tp);
      const double chunk = double(headChunkRows(static_cast<int64_t>(rows), static_cast<int64_t>(vocabLocal),
                                                plan.config.training.headChunkRows));
      // In bf16 its TP all-reduce of the input gradient is staged in bf16 (rows * C / 2 floats).
      const double comm = p.precision == Precision::Bf16 && tp > 1 ? rows * C / 2.0 : 0.0;
      // A head that begins its chunk writes its input gradient straight into the chunk's dIn, a message
      // buffer (pipelineBufferBytes), not here.
      bool beginsChunk = false;
      for (int k : plan.partition.chunksOfStage(stage))
        beginsChunk = beginsChunk || plan.partition.chunks[static_cast<size_t>(k)].front() == l;
      const double floats =
          (beginsChunk ? 1.0 : 2.0) * rows * C + chunk * vocabLocal + (tp > 1 ? 3.0 * chunk : 0.0) + comm;
      o.workspace = std::max(o.workspace, floats * 4.0);
      headLogits = chunk * vocabLocal;
      headRowsC = rows * C;
      doutFloats = std::max(doutFloats, chunk * vocabLocal);
      inputFloats = std::max(inputFloats, chunk * C);
    }
  }
  // The runtime's workspace is slots, each as large as its largest use (runtime/memory.h Workspace), so a
  // stage with blocks and the head holds the blocks' workspace plus whatever the head's uses of the same
  // slots need beyond the blocks': the chunk of logits in slot 1, where a block's backward keeps a (T, C)
  // gradient per sample, and ln_f's whole output in slot 0, where a sequence-parallel block keeps a (T/tp,
  // C) piece. Seen on an H200 (bench/gpu_memory.py, GPT-2 124M and 350M): 45-49 MiB of workspace measured
  // above the larger of the two alone, the logits chunk less a block's slot 1.
  if (blockWorkspace > 0 && headLogits > 0) {
    const double slot0 = p.sequenceParallel ? headRowsC - headRowsC / seqSplit : 0.0;
    const double slot1 = std::max(0.0, headLogits - blockRowsC);
    o.workspace = std::max(o.workspace, blockWorkspace + 4.0 * (slot0 + slot1));
  }
  o.workspace += staging;

  if (p.zero == 3 && p.dataReplicas() > 1)
    o.zero3Gathered = zero3GatheredParams(plan, stage) * state.workingBytes;
  if (gpu) o.context = kCudaContextBytes;
  // Seen on an H100 (bench/gpu_memory.py, GPT-2 124M and 350M): bf16 runs used 124 and 126 MiB more outside
  // the tracked buffers than fp32 runs; the head's 1280-row chunk of 50304 logits gradients alone is 123 MiB
  // in bf16.
  if (gpu && p.precision == Precision::Bf16) o.gemmScratch = 2.0 * (doutFloats + inputFloats);
  return o;
}

nlohmann::json memoryBytesJson(const MemoryBreakdown& m) {
  namespace category = metrics::category;
  namespace key = metrics::key;
  nlohmann::json j = {{category::kParameters, m.parameters}, {category::kGradients, m.gradients},
                      {category::kOptimizer, m.optimizer},   {category::kActivations, m.activations},
                      {category::kOther, m.other},           {key::kTotal, m.total()}};
  if (m.notAtOnce > 0) j[key::kNotAtOnce] = m.notAtOnce;
  if (m.unevenRoutingTotal > 0) j[key::kUnevenRoutingTotal] = m.unevenRoutingTotal;
  if (m.other > 0)
    j[key::kOtherParts] = {{category::kWorkspace, m.otherWorkspace},
                           {category::kCommunication, m.otherCommunication}};
  if (m.host.total() > 0)
    j[key::kHost] = {{category::kParameters, m.host.parameters},
                     {category::kGradients, m.host.gradients},
                     {category::kOptimizer, m.host.optimizer},
                     {category::kStaging, m.host.staging},
                     {key::kTotal, m.host.total()}};
  return j;
}

std::vector<NodeHostMemory> hostMemoryPerNode(const Plan& plan, const std::vector<MemoryBreakdown>& ranks) {
  std::vector<NodeHostMemory> nodes(plan.mesh.nodes.size());
  for (size_t n = 0; n < nodes.size(); ++n) nodes[n].node = plan.mesh.nodes[n];
  for (const MeshDevice& d : plan.mesh.devices)
    nodes[static_cast<size_t>(d.node)].capacity += d.spec.hostMemoryBytes;
  for (const MemoryBreakdown& m : ranks)
    if (m.rank < static_cast<int>(plan.layout.deviceOf.size()))
      nodes[static_cast<size_t>(plan.mesh.devices[static_cast<size_t>(plan.layout.deviceOf[m.rank])].node)]
          .bytes += m.host.total();
  return nodes;
}

bool isGpuDevice(const DeviceSpec& device) {
  // A measured profile says which backend it measured (calibrate measures the CPU backend).
  if (device.profile) return device.profile->backend != "cpu";
  return device.name != "cpu";
}

double cudaContextAllowanceBytes() {
  return kCudaContextBytes;
}

std::vector<MemoryBreakdown> estimateMemory(const Plan& plan, Routing routing) {
  const ParallelConfig& p = plan.config.parallel;
  const int P = plan.partition.stages;
  const ModelStateLayout layout = modelStateLayout(p, plan.config.optimizer);
  const ModelStateBytes state = modelStateBytes(layout, p.dataReplicas());
  // Expert parallelism: the local experts' states are sharded over their dp x cp / ep replicas.
  const std::vector<double> chunkLocal = chunkLocalParameterCount(plan),
                            chunkExperts = chunkLocalExpertParameterCount(plan);
  const ModelStateBytes expertState =
      modelStateBytes(layout, std::max(1, p.dataReplicas() / std::max(1, p.ep)));
  const std::vector<double> chunkBytes = chunkActivationBytes(plan, routing),
                            splitBytes = chunkSplitBackwardBytes(plan, routing);
  const std::vector<double> peaks = slotActivationBytes(plan.schedule, chunkBytes, splitBytes);

  // Per stage, everything but the device-dependent parts.
  std::vector<MemoryBreakdown> stages(static_cast<size_t>(P));
  for (int s = 0; s < P; ++s) {
    MemoryBreakdown& m = stages[static_cast<size_t>(s)];
    const double experts = sumOverStage(plan, s, chunkExperts);
    const double dense = sumOverStage(plan, s, chunkLocal) - experts;
    auto states = [&](double ModelStateBytes::*part) {
      return dense * state.*part + experts * expertState.*part;
    };
    m.stage = s;
    m.parameters = states(&ModelStateBytes::parameters);
    // The layers' buffers (the cnn's BatchNorm running statistics): fp32, whole on every rank that holds the
    // layer, never sharded or offloaded.
    for (int l : plan.partition.layersOfStage(s))
      m.parameters += 4.0 * double(plan.model.layers[static_cast<size_t>(l)].bufferCount());
    m.gradients = states(&ModelStateBytes::gradients);
    m.optimizer = states(&ModelStateBytes::optimizer);
    m.host.parameters = states(&ModelStateBytes::hostParameters);
    m.host.gradients = states(&ModelStateBytes::hostGradients);
    m.host.optimizer = states(&ModelStateBytes::hostOptimizer);
    // Offload's host staging, the size of the stage's largest unit's owned slice: "optimizer" rounds each
    // unit's updated master slice to bf16 there before uploading it; "parameters" lands a reduced gradient
    // shard there before adding it to the shard it keeps (a later microbatch's).
    const double largestSlice = largestOwnedSlice(plan, s, layout.shardOptimizer);
    if (layout.offloadParameters)
      m.host.staging = largestSlice * layout.gradientBytes;
    else if (layout.offloadOptimizer)
      m.host.staging = largestSlice * 2.0;
    m.activations = (s < static_cast<int>(peaks.size()) ? peaks[static_cast<size_t>(s)] : 0.0) +
                    recomputeWorkspaceBytes(plan, s, routing);
  }

  // "other" depends on the stage and on whether the device is a GPU: computed once per stage and kind.
  // (Only the kinds the mesh has: the auto-planner estimates thousands of plans.)
  const int world = plan.layout.world();
  const auto deviceOfRank = [&](int r) -> const DeviceSpec& {
    return r < static_cast<int>(plan.layout.deviceOf.size())
               ? plan.mesh.devices[static_cast<size_t>(plan.layout.deviceOf[r])].spec
               : stageDevice(plan, plan.stageOfRank(r));
  };
  std::vector<char> gpuStage(static_cast<size_t>(P), 0), cpuStage(static_cast<size_t>(P), 0);
  for (int r = 0; r < world; ++r)
    (isGpuDevice(deviceOfRank(r)) ? gpuStage : cpuStage)[static_cast<size_t>(plan.stageOfRank(r))] = 1;
  std::vector<OtherBytes> otherOnCpu(static_cast<size_t>(P)), otherOnGpu(static_cast<size_t>(P));
  for (int s = 0; s < P; ++s) {
    if (cpuStage[static_cast<size_t>(s)])
      otherOnCpu[static_cast<size_t>(s)] = otherBreakdown(plan, s, false, routing);
    if (gpuStage[static_cast<size_t>(s)])
      otherOnGpu[static_cast<size_t>(s)] = otherBreakdown(plan, s, true, routing);
  }

  // The parts held for part of the step, followed together (concurrentStageBytes): how far the stage's peak
  // is below the sum of its categories' peaks.
  std::vector<double> concurrent(static_cast<size_t>(P), 0.0);
  for (int s = 0; s < P; ++s) {
    const size_t i = static_cast<size_t>(s);
    if (cpuStage[i] || gpuStage[i])
      concurrent[i] = concurrentStageBytes(plan, s, chunkBytes, splitBytes,
                                           (gpuStage[i] ? otherOnGpu : otherOnCpu)[i].p2pBuffers, routing);
  }

  std::vector<MemoryBreakdown> ranks;
  for (int r = 0; r < world; ++r) {
    MemoryBreakdown m = stages[static_cast<size_t>(plan.stageOfRank(r))];
    m.rank = r;
    const DeviceSpec& device = deviceOfRank(r);
    const OtherBytes& o = (isGpuDevice(device) ? otherOnGpu : otherOnCpu)[static_cast<size_t>(m.stage)];
    // The communication category stays the sum of its kinds' peaks, an upper bound: which messages a rank
    // still holds beside its buckets depends on timing (two ranks of one stage measured 8 KiB apart). The
    // total is the walk's peak of everything (concurrentStageBytes).
    m.other = o.total();
    m.otherWorkspace = o.workspace;
    m.otherCommunication = o.p2pBuffers + o.dpBucket + o.zero3Gathered;
    m.notAtOnce =
        std::max(0.0, m.activations + m.otherCommunication - concurrent[static_cast<size_t>(m.stage)]);
    m.capacity = device.memoryBytes;
    ranks.push_back(m);
  }
  // Routed experts: the same plan under the most uneven routing, the bound of a dropless run's peak.
  const bool routedExperts = std::any_of(plan.model.layers.begin(), plan.model.layers.end(),
                                         [](const LayerSpec& layer) { return layer.expertParamCount > 0; });
  if (routing == Routing::Balanced && routedExperts) {
    const std::vector<MemoryBreakdown> uneven = estimateMemory(plan, Routing::Uneven);
    for (size_t r = 0; r < ranks.size() && r < uneven.size(); ++r)
      ranks[r].unevenRoutingTotal = uneven[r].total();
  }
  return ranks;
}

}  // namespace ms
