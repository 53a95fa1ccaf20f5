// Schedule generators: for each kind, the order of compute actions (F, B, W) on every stage, written as plain
// arithmetic on (stage, step) without tensors (Megatron-Core's habit); then one shared pass adds the
// transfers, the per-chunk gradient syncs and the optimizer step. What always holds: the result passes
// checkSchedule() (tests/tst_schedule.cpp generates every kind over many shapes and checks each).
#include <algorithm>
#include <string>
#include <vector>

#include "plan/schedule.h"

namespace ms {
namespace {

// More (microbatch, chunk) pairs than this is a typo in a config, not a pipeline; refused before allocating.
constexpr long long kMaxChunkMicrobatches = 1'000'000;

struct Compute {
  ActionType type;
  int microbatch;
  int chunk;
};
using ComputeOrder = std::vector<Compute>;  // the compute actions of one stage, in order

std::string shape(int stages, int chunksPerStage, int microbatches) {
  return "(P=" + std::to_string(stages) + ", V=" + std::to_string(chunksPerStage) +
         ", M=" + std::to_string(microbatches) + ")";
}

Status validate(Schedule kind, int P, int V, int M, const std::vector<int>& stageOf) {
  if (P < 1) return Status::error("pipeline stages must be at least 1 (P=" + std::to_string(P) + ")");
  if (V < 1)
    return Status::error("virtual chunks per stage must be at least 1 (V=" + std::to_string(V) + ")");
  if (M < 1) return Status::error("microbatches must be at least 1 (M=" + std::to_string(M) + ")");
  if (static_cast<long long>(P) * V * M > kMaxChunkMicrobatches)
    return Status::error("the schedule " + shape(P, V, M) + " has more than " +
                         std::to_string(kMaxChunkMicrobatches) + " (microbatch, chunk) pairs");
  const std::string name = toString(kind);
  if (kind == Schedule::Interleaved1F1B && V < 2)
    return Status::error("interleaved 1F1B needs at least 2 virtual chunks per stage (V=" +
                         std::to_string(V) + "); use 1f1b for one chunk per stage");
  if (kind != Schedule::Interleaved1F1B && V != 1)
    return Status::error(name + " runs one chunk per stage (V=" + std::to_string(V) +
                         "); virtual chunks need interleaved_1f1b");
  const int K = P * V;
  if (static_cast<int>(stageOf.size()) != K)
    return Status::error("stageOf has " + std::to_string(stageOf.size()) +
                         " entries, expected P*V = " + std::to_string(K) + " chunks " + shape(P, V, M));
  for (int k = 0; k < K; ++k) {
    const int s = stageOf[static_cast<size_t>(k)];
    const std::string at = "stageOf[" + std::to_string(k) + "] = " + std::to_string(s);
    if (s < 0 || s >= P) return Status::error(at + " is not a stage (P=" + std::to_string(P) + ")");
    const int expected = k % P;  // k itself when V == 1
    if (s != expected)
      return Status::error(at + ", but " + name + " places chunk k on stage " +
                           (V == 1 ? std::string("k") : std::string("k % P")) + " (expected " +
                           std::to_string(expected) + ")");
  }
  // Megatron-LM requires it too (schedules.py, forward_backward_pipelining_with_interleaving): the microbatch
  // order below walks microbatches in groups of P per chunk.
  if (kind == Schedule::Interleaved1F1B && M % P != 0)
    return Status::error("interleaved 1F1B needs microbatches to be a multiple of the stages (P=" +
                         std::to_string(P) + ", M=" + std::to_string(M) + ")");
  return Status::ok();
}

// GPipe (Huang et al. 2019): all forwards, then all backwards. Backwards run in forward order 0..M-1, as
// Megatron's "all forward, all backward" does; the reverse order gives the same bubble and peak memory.
ComputeOrder gpipeOrder(int s, int M) {
  ComputeOrder order;
  for (int m = 0; m < M; ++m) order.push_back({ActionType::Forward, m, s});
  for (int m = 0; m < M; ++m) order.push_back({ActionType::Backward, m, s});
  return order;
}

// 1F1B, PipeDream-Flush (Narayanan et al. 2021, section 2.2.1; Megatron-LM
// forward_backward_pipelining_without_interleaving): warmup = min(P - s - 1, M) forwards, then one forward
// and one backward in turn, then the remaining backwards.
ComputeOrder oneFOneBOrder(int s, int P, int M) {
  const int warmup = std::min(P - s - 1, M);
  ComputeOrder order;
  for (int m = 0; m < warmup; ++m) order.push_back({ActionType::Forward, m, s});
  for (int i = 0; i < M - warmup; ++i) {
    order.push_back({ActionType::Forward, warmup + i, s});
    order.push_back({ActionType::Backward, i, s});
  }
  for (int m = M - warmup; m < M; ++m) order.push_back({ActionType::Backward, m, s});
  return order;
}

// Interleaved 1F1B (Narayanan et al. 2021, section 2.2.2), Megatron-LM's order (schedules.py:
// get_model_chunk_id, get_microbatch_id_in_model_chunk). Virtual step i of a stage works on local chunk
// (i / P) % V (reversed for backward) and microbatch (i % P) + P * (i / (P * V)): P microbatches of one
// chunk, then the same P of the next chunk, and so on.
int interleavedLocalChunk(int i, int P, int V, bool forward) {
  const int c = (i / P) % V;
  return forward ? c : V - 1 - c;
}
int interleavedMicrobatch(int i, int P, int V) {
  return i % P + P * (i / (P * V));
}

// Warm-up forwards of stage s: (P - s - 1) * 2 + (V - 1) * P, at most M * V (Megatron-LM,
// forward_backward_pipelining_with_interleaving). Megatron also makes every step warm-up when M == P; the
// capped formula already does so on the first stages, and checkSchedule proves the result deadlock-free
// without it.
int interleavedWarmup(int s, int P, int V, int M) {
  return std::min((P - s - 1) * 2 + (V - 1) * P, M * V);
}

ComputeOrder interleavedOrder(int s, int P, int V, int M) {
  const int total = M * V;
  const int warmup = interleavedWarmup(s, P, V, M);
  auto forward = [&](int i) {
    return Compute{ActionType::Forward, interleavedMicrobatch(i, P, V),
                   interleavedLocalChunk(i, P, V, true) * P + s};
  };
  auto backward = [&](int i) {
    return Compute{ActionType::Backward, interleavedMicrobatch(i, P, V),
                   interleavedLocalChunk(i, P, V, false) * P + s};
  };
  ComputeOrder order;
  for (int i = 0; i < warmup; ++i) order.push_back(forward(i));
  for (int i = 0; i < total - warmup; ++i) {
    order.push_back(forward(warmup + i));
    order.push_back(backward(i));
  }
  for (int i = total - warmup; i < total; ++i) order.push_back(backward(i));
  return order;
}

// ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 3.1 and figure 3; the order of the
// authors' Megatron-DeepSpeed ZeroBubbleH1Pipeline with every backward split). Stage s:
//   P - s - 1 forwards (1F1B's warm-up);
//   s rounds of F, B with the W deferred (the later the stage, the more W it keeps for the end);
//   rounds of F, B, W (W of the oldest microbatch still waiting) while forwards remain;
//   B, W rounds while backwards remain; then the deferred W.
// With equal F, B and W times every stage idles P - 1 units in a step of 3M + P - 1: a third of 1F1B's
// bubble. W frees a microbatch's activations, so each stage holds up to min(P, M) microbatches: later stages
// hold more than in 1F1B, but no stage more than 1F1B's first stage (the paper's "same peak memory as 1F1B").
ComputeOrder zbH1Order(int s, int P, int M) {
  ComputeOrder order;
  int f = 0, b = 0, w = 0;  // next microbatch of each kind
  auto F = [&] { order.push_back({ActionType::Forward, f++, s}); };
  auto B = [&] { order.push_back({ActionType::Backward, b++, s}); };
  auto W = [&] { order.push_back({ActionType::BackwardWeight, w++, s}); };
  for (int i = 0; i < P - s - 1 && f < M; ++i) F();
  for (int i = 0; i < s && f < M; ++i) F(), B();
  while (f < M) F(), B(), W();
  while (b < M) B(), W();
  while (w < M) W();
  return order;
}

// The one place transfers, gradient syncs and the optimizer step are added (see the convention in
// schedule.h): a receive right before the compute that consumes it, a send right after the compute that
// produces it, the GradSync of a chunk right after its last backward work (and that work's send), so the
// simulator and executor can overlap the sync with the compute that remains; the optimizer step last.
std::vector<Action> withCommunication(const ComputeOrder& order, int s, const std::vector<int>& stageOf,
                                      bool splitBackward) {
  const int K = static_cast<int>(stageOf.size());
  const ActionType lastWork = splitBackward ? ActionType::BackwardWeight : ActionType::Backward;
  std::vector<int> lastWorkIndex(static_cast<size_t>(K), -1);  // (K)
  for (int i = 0; i < static_cast<int>(order.size()); ++i)
    if (order[static_cast<size_t>(i)].type == lastWork)
      lastWorkIndex[static_cast<size_t>(order[i].chunk)] = i;

  auto stageOfChunk = [&](int k) { return k >= 0 && k < K ? stageOf[static_cast<size_t>(k)] : s; };
  std::vector<Action> out;
  out.reserve(order.size() * 2 + static_cast<size_t>(K) + 1);
  for (int i = 0; i < static_cast<int>(order.size()); ++i) {
    const Compute& c = order[static_cast<size_t>(i)];
    const int m = c.microbatch, k = c.chunk;
    const int prev = stageOfChunk(k - 1), next = stageOfChunk(k + 1);
    switch (c.type) {
      case ActionType::Forward:
        if (prev != s) out.push_back({ActionType::RecvActivation, m, k - 1, prev});
        out.push_back({ActionType::Forward, m, k, -1});
        if (next != s) out.push_back({ActionType::SendActivation, m, k, next});
        break;
      case ActionType::Backward:
        if (next != s) out.push_back({ActionType::RecvGrad, m, k + 1, next});
        out.push_back({ActionType::Backward, m, k, -1});
        if (prev != s) out.push_back({ActionType::SendGrad, m, k, prev});
        break;
      default:
        out.push_back({c.type, m, k, -1});
        break;
    }
    if (lastWorkIndex[static_cast<size_t>(k)] == i) out.push_back({ActionType::GradSync, -1, k, -1});
  }
  out.push_back({ActionType::OptimizerStep, -1, -1, -1});
  return out;
}

}  // namespace

Expected<PipelineSchedule> generateSchedule(Schedule kind, int stages, int chunksPerStage, int microbatches,
                                            const std::vector<int>& stageOf) {
  const int P = stages, V = chunksPerStage, M = microbatches;
  MS_TRY(validate(kind, P, V, M, stageOf).withContext(std::string("schedule ") + toString(kind)));
  PipelineSchedule schedule;
  schedule.kind = kind;
  schedule.stages = P;
  schedule.chunksPerStage = V;
  schedule.microbatches = M;
  schedule.splitBackward = kind == Schedule::ZbH1;
  schedule.stageOf = stageOf;
  schedule.actions.reserve(static_cast<size_t>(P));
  for (int s = 0; s < P; ++s) {
    ComputeOrder order;
    switch (kind) {
      case Schedule::GPipe:
        order = gpipeOrder(s, M);
        break;
      case Schedule::OneFOneB:
        order = oneFOneBOrder(s, P, M);
        break;
      case Schedule::Interleaved1F1B:
        order = interleavedOrder(s, P, V, M);
        break;
      case Schedule::ZbH1:
        order = zbH1Order(s, P, M);
        break;
    }
    schedule.actions.push_back(withCommunication(order, s, stageOf, schedule.splitBackward));
  }
  return schedule;
}

}  // namespace ms
