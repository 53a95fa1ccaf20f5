// Pipeline schedules as data (Megatron-Core's habit: schedule arithmetic is plain functions without tensors;
// the executor only walks the result). A schedule gives, for every pipeline stage, the ordered actions of one
// training step: compute (forward, backward, or backward split into input- and weight-gradient parts),
// point-to-point transfers of activations and their gradients between stages, and the stage's end-of-step
// work (gradient sync of its parameters, optimizer step). Every rank of a stage (its TP and DP peers) runs
// the same list; the engine executes it and the simulator times it, so a schedule is never written twice.
//
// Terms: P stages; the model is cut into K = P * V model chunks in model order (V virtual chunks per stage);
// chunk k runs on stage stageOf[k]. M microbatches. F(m, k) needs F(m, k-1); B(m, k) needs F(m, k) and
// B(m, k+1); W(m, k) needs B(m, k). A transfer action names the chunk whose output (activation) or input
// gradient crosses, and the peer stage.
//
// Transfer convention (one for both sides): `chunk` is always the PRODUCER of the data. The output of F(m, k)
// travels as SendActivation{m, k} on stageOf[k] and RecvActivation{m, k} on stageOf[k+1] (placed just before
// F(m, k+1)); the input gradient of B(m, k) travels as SendGrad{m, k} on stageOf[k] and RecvGrad{m, k} on
// stageOf[k-1] (placed just before B(m, k-1)). A send and a receive are one message iff they have the same
// kind (activation or gradient), microbatch and chunk. A transfer exists only where the two chunks are on
// different stages; a send directly follows the compute that produces it, a receive directly precedes the
// compute that consumes it (receives block, sends do not).
//
// What always holds for a generated schedule (checkSchedule proves it): every (m, k) has exactly one F and
// one B (and one W when the backward is split) on stageOf[k]; each send has exactly one matching receive and
// both sides list their messages in the same order; executed with non-blocking sends and blocking receives,
// no stage waits forever.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "plan/run_config.h"

namespace ms {

enum class ActionType {
  Forward,         // F(m, k)
  Backward,        // B(m, k): input and weight gradients together (or only the input part when split)
  BackwardWeight,  // W(m, k): the weight-gradient part of a split backward (zero-bubble schedules)
  SendActivation,  // output of F(m, k) to stage `peer` (which runs chunk k+1)
  RecvActivation,  // output of F(m, k) from stage `peer` (which ran chunk k); consumed by F(m, k+1)
  SendGrad,        // input gradient of B(m, k) to stage `peer` (which runs chunk k-1)
  RecvGrad,        // input gradient of B(m, k) from stage `peer` (which ran chunk k); consumed by B(m, k-1)
  GradSync,        // data-parallel sync of the stage's gradients for chunk k (all-reduce or reduce-scatter)
  OptimizerStep,   // the stage's optimizer step (after all its GradSyncs)
};
const char* toString(ActionType t);
// One-letter code used in spans and printouts: F B W s r S R G O (send/recv of activations lower case).
char actionCode(ActionType t);
// A point-to-point send (activation or gradient), or a receive.
inline bool isSend(ActionType t) {
  return t == ActionType::SendActivation || t == ActionType::SendGrad;
}
inline bool isRecv(ActionType t) {
  return t == ActionType::RecvActivation || t == ActionType::RecvGrad;
}

struct Action {
  ActionType type = ActionType::Forward;
  int microbatch = -1;  // -1 for GradSync and OptimizerStep
  int chunk = -1;       // model chunk k; -1 for OptimizerStep
  int peer = -1;        // the other stage of a transfer, else -1
  bool operator==(const Action&) const = default;
};

struct PipelineSchedule {
  Schedule kind = Schedule::OneFOneB;
  int stages = 1;                            // P
  int chunksPerStage = 1;                    // V
  int microbatches = 1;                      // M
  bool splitBackward = false;                // B computes input gradients only and W the weight gradients
  std::vector<int> stageOf;                  // (K): stage of each model chunk
  std::vector<std::vector<Action>> actions;  // (P): the ordered actions of each stage
  int chunkCount() const { return static_cast<int>(stageOf.size()); }
};

// Generates the schedule. stageOf lists the stage of each model chunk in model order (size P*V; for V == 1 it
// must be 0, 1, ..., P-1; for interleaved schedules chunk k must be on stage k % P). Errors (as a Status
// naming the parameter) for combinations the kind cannot express, e.g. interleaved with V < 2 or microbatches
// not a multiple of P for interleaved 1F1B. The orders (with their sources) are in schedule_gen.cpp: GPipe
// runs its backwards in forward order 0..M-1; 1F1B warms up with min(P - s - 1, M) forwards on stage s;
// interleaved 1F1B follows Megatron-LM with min((P - s - 1) * 2 + (V - 1) * P, M * V) warm-up forwards; ZB-H1
// follows Qi et al. 2024 and sets splitBackward. In each stage's list GradSync{chunk k} directly follows
// chunk k's last B (last W when split) and that B's send, so the sync can overlap the compute that remains;
// one OptimizerStep ends it.
Expected<PipelineSchedule> generateSchedule(Schedule kind, int stages, int chunksPerStage, int microbatches,
                                            const std::vector<int>& stageOf);

// Proves the properties in the header comment; the error names the stage, the action and what is wrong.
Status checkSchedule(const PipelineSchedule& schedule);

// Peak, over each stage's action order, of the activation bytes the stage holds: the sum of chunkBytes[k]
// over the (m, k) whose F is done and whose backward is not (W releases them when the backward is split, B
// otherwise). chunkBytes (K) is one microbatch's saved activations of each chunk. With a split backward,
// splitBytes (K, optional) is what a chunk's B adds until its W (the output gradients the weight pass needs).
// Returns one value per stage.
std::vector<double> peakActivationBytes(const PipelineSchedule& schedule,
                                        const std::vector<double>& chunkBytes,
                                        const std::vector<double>& splitBytes = {});
// What a stage's runtime holds (engine/runtime/pipeline.cpp): a chunk's microbatch slots keep their buffers
// when freed and are reused, so each chunk holds chunkBytes[k] times the most microbatches it ever had in
// flight, not only those in flight now; splitBytes are freed at W. The peak over each stage's action order.
// Equal to peakActivationBytes with one chunk per stage; above it for interleaved schedules, whose chunks
// peak at different times.
std::vector<double> slotActivationBytes(const PipelineSchedule& schedule,
                                        const std::vector<double>& chunkBytes,
                                        const std::vector<double>& splitBytes = {});
// The same with every chunk weighing 1: the number of (microbatch, chunk) activations in flight at the peak.
std::vector<int> peakInFlight(const PipelineSchedule& schedule);

// One token per action, separated by spaces, for debugging and tests: compute "F<m>.<k>" (also B, W);
// transfers "s<m>.<k>><peer>" for a send and "r<m>.<k><<peer>" for a receive (S, R for gradients); "G<k>";
// "O". Example: "r0.0<0 F0.1 s0.1>2".
std::string describe(const std::vector<Action>& actions);
// One action in words for messages: "RecvGrad(mb 3, chunk 5, from stage 3)", "GradSync(chunk 1)".
std::string describe(const Action& action);

}  // namespace ms
