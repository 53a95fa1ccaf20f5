// The runtime's layers: one object per LayerSpec (embedding, transformer block, head, ...), executing forward
// and backward of one microbatch through the kernels. A layer reads its parameters and accumulates its
// gradients in a ParameterStore; what backward needs from forward it keeps in a numbered SLOT, so a pipeline
// stage can hold several microbatches in flight (slot = the microbatch's place in the stage's window).
//
// Every tensor a layer touches (x, y, dy, dx, its parameters, gradients and caches) is in the memory of the
// rank's backend (kernels/backend.h) and every op goes through that backend, so one layer runs on the CPU or
// a GPU; a layer reads nothing from backend memory on the host except through backend.download().
//
// What always holds: backward(x, dy, dx, batch, slot, ...) must follow forward(x, ..., slot) of the same
// microbatch with the same x; backward ACCUMULATES into dx and into parameter gradients (dx may be nullptr
// for the first layer). A head's forward computes the loss and, when training, the loss gradient (scaled by
// lossScale) for its backward. Under tensor parallelism every rank of the TP group calls the same layer
// methods in the same order (the layers run matched collectives inside); a failed collective throws
// CommFailure.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "plan/model_spec.h"
#include "runtime/communicator.h"
#include "runtime/data.h"
#include "runtime/memory.h"
#include "runtime/parameters.h"

namespace ms {

struct ForwardMode {
  bool training = true;     // heads compute the loss gradient
  float lossScale = 1.0f;   // d(total loss)/d(per-target loss): 1 / targets in the optimizer step
  bool keepLogits = false;  // evaluation: the head keeps its logits whole for logits() (dump); else a gpt
                            // head computes the loss chunk by chunk and keeps none
};

struct LossStats {
  double lossSum = 0;   // sum of per-target losses
  int64_t count = 0;    // targets
  int64_t correct = 0;  // classifier heads: argmax == target
  // Mixture of experts, in training: the load-balancing losses (coefficient included) of the MoE layers that
  // ran, summed over layers and microbatches (one TP rank's: the others route the same tokens).
  double auxSum = 0;
  LossStats& operator+=(const LossStats& o) {
    lossSum += o.lossSum;
    count += o.count;
    correct += o.correct;
    auxSum += o.auxSum;
    return *this;
  }
};

// A collective inside a layer failed (the executor turns it into a Status naming the action).
struct CommFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The tensor-parallel group a layer computes in (Megatron-LM, Shoeybi et al. 2019, section 3).
struct TensorParallel {
  Communicator* comm = nullptr;  // null when size == 1
  int size = 1;
  int rank = 0;
  // Sums x over the group in place (the g operator of the paper's figure 3 forward, f's backward).
  void allReduce(float* x, size_t n) const;
  // Sums a parameter gradient over the group in place, in its precision (fp32 or bf16).
  void allReduce(GradOut g, size_t n) const;
  // Sums bf16 values in place (each sum in fp32, rounded to nearest even: CommType::BF16).
  void allReduce(bfloat16* x, size_t n) const;
  void allReduceMax(float* x, size_t n) const;
  // recv (size, n) = every rank's send (n), fp32 or bf16 elements as send is (bf16 kept activations travel
  // as they are kept); recv (n) = the sum of block `rank` of send (size, n).
  void allGather(TensorIn send, void* recv, size_t n) const;
  void reduceScatter(TensorIn send, void* recv, size_t n) const;
  // Sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  // Models"): LayerNorms, residuals and biases of row-parallel linears run on 1/size of the sequence.
  bool sequence = false;
  // parallel.tp_comm_overlap (plan/tp_overlap.h): a block's sequence-parallel all-gathers and reduce-scatters
  // go in chunks beside its GEMM rows, through the non-blocking forms below.
  bool overlap = false;
  // Non-blocking allGather and reduceScatter; finish() waits for one (a failure throws CommFailure either
  // way, naming the collective).
  CommRequestPtr iallGather(TensorIn send, void* recv, size_t n) const;
  CommRequestPtr ireduceScatter(TensorIn send, void* recv, size_t n) const;
  static void finish(CommRequestPtr& request, const char* what);
};

// Expert parallelism (mixture of experts; plan/layout.h): the ranks of one expert-parallel group hold
// disjoint experts and exchange tokens with all-to-all. Size 1: every expert is local.
struct ExpertParallel {
  Communicator* comm = nullptr;  // null when size == 1
  int size = 1;
  int rank = 0;
};

// Context parallelism (plan/layout.h): the cp ranks of a ring each hold two chunks of every sample's
// sequence (chunks rank and 2 cp - 1 - rank of 2 cp) and pass keys and values around the ring for attention.
// Size 1: the whole sequence is local.
struct ContextParallel {
  Communicator* comm = nullptr;  // null when size == 1
  int size = 1;
  int rank = 0;
  // Chunk length for a sequence of `local` = T / size positions held here (two chunks of local / 2).
  // The positions of this rank's rows, and of rank r's (kernels/backend.h SeqPositions).
  SeqPositions positionsOf(int r, int local) const {
    const int chunk = local / 2;
    return SeqPositions{r * chunk, chunk, (2 * size - 1 - r) * chunk};
  }
};

// A microbatch as a layer sees it: its size, the host batch (loss statistics count targets there) and its
// tokens, targets and images in backend memory (the model uploads them once per chunk and slot).
struct BatchView {
  int B = 0;
  const Batch* host = nullptr;
  const int32_t* tokens = nullptr;   // (B, T), or nullptr
  const int32_t* targets = nullptr;  // (B, T) or (B), or nullptr
  const float* images = nullptr;     // (B, S*S), or nullptr
};

// Which part of a backward to run: both, or (zero-bubble schedules, Qi et al. 2024) only the input gradient
// first and the weight gradient later.
enum class BackwardPart { All, Input, Weight };

// Non-trainable state a layer keeps (LayerSpec::buffers: the cnn's BatchNorm running statistics), fp32 in
// backend memory: checkpointed and dumped with the parameters, never optimised.
struct LayerBuffer {
  const ParamSpec* spec = nullptr;
  float* data = nullptr;
};

class Layer {
 public:
  explicit Layer(const LayerSpec& spec) : m_spec(spec) {}
  virtual ~Layer() = default;
  const LayerSpec& spec() const { return m_spec; }
  // Floats of the output activation for a microbatch of B samples (0 for heads).
  virtual int64_t outputFloats(int B) const = 0;
  // x: the previous layer's output, or for the first layer the batch's images (nullptr for token inputs).
  virtual void forward(const float* x, float* y, const BatchView& batch, const ForwardMode& mode,
                       int slot) = 0;
  // part Input: the input gradient (and any small parameter gradients); Weight: the deferred weight gradients
  // (only after Input of the same slot). Layers that do not split do everything in Input and nothing in
  // Weight.
  virtual void backward(const float* x, const float* dy, float* dx, const BatchView& batch, int slot,
                        BackwardPart part) = 0;
  // True when a training forward already writes parameter gradients (the GPT head's LM head fused with the
  // loss): the model makes the gradients exist before such a forward.
  virtual bool gradientsInForward() const { return false; }
  // Frees what the slot keeps (activation recomputation drops it after forward and recomputes it).
  virtual void releaseSlot(int slot) = 0;
  // After the step's last backward of this layer: make the gradients of replicated parameters whole (under
  // sequence parallelism each TP rank holds the part from its piece of the sequence).
  virtual void finalizeGrads() {}
  // Its buffers (spec().buffers, in that order): none but for the cnn's layers.
  virtual std::vector<LayerBuffer> buffers() { return {}; }
  // Heads: the loss of the slot's last forward.
  virtual LossStats lossStats(int /*slot*/) const { return {}; }
  // A mixture-of-experts block: its load-balancing loss (coefficient included) in the forward of `slot`.
  virtual double auxLoss(int /*slot*/) const { return 0.0; }
  // Heads: the logits of the last forward when it was an evaluation (the gpt head: with keepLogits), else
  // nullptr. (B, T, V) for gpt, (B, classes) for classifiers; in backend memory.
  virtual const float* logits() const { return nullptr; }

 protected:
  LayerSpec m_spec;
};

// Everything a layer needs to bind to its parameters, account its memory and borrow scratch space.
struct LayerContext {
  Backend& backend;  // where tensors live and ops run (the tracker's backend)
  const ModelConfig& model;
  ParameterStore& params;
  MemoryTracker* tracker;
  Workspace* workspace;     // shared by all layers; a layer uses slots [0, kLayerScratchSlots)
  int positions;            // T of the activations (ModelSpec::samplePositions)
  TensorParallel tp;        // tensor-parallel group (size 1: none)
  ExpertParallel ep = {};   // expert-parallel group (size 1: none)
  ContextParallel cp = {};  // context-parallel group (size 1: none); positions is then T / cp
  // Recompute "selective" (plan/recompute.h): transformer blocks drop their attention matrix after forward
  // and re-make it in backward.
  bool selectiveRecompute = false;
  // "batchnorm": "sync" (cnn): the group whose BatchNorm statistics are summed (the data-parallel group) and
  // its size; null under "local" or without data parallelism.
  Communicator* batchNormGroup = nullptr;
  int batchNormRanks = 1;
  int headChunkRows = 0;  // training.head_chunk_rows (plan/model_spec.h headChunkRows), 0 = automatic
};

// Workspace slots a layer may use; the model keeps its activation-gradient buffers above them.
inline constexpr int kLayerScratchSlots = 32;

// MESHSTUDIO_HEAD_CHUNK_ROWS, a positive integer: training.head_chunk_rows for one command (the engine sets
// the loaded config's field from it, so the plan's prediction, the run folder's config and the head all see
// the same rows; tests run many chunks on small models with it). 0 when unset; an error naming the variable
// when malformed (the engine's commands check it before they start).
Expected<int64_t> headChunkRowsOverride();

// Builds the runtime layer for spec (the layer's parameters, and a tied head's wte, must be in ctx.params).
std::unique_ptr<Layer> makeLayer(const LayerSpec& spec, LayerContext ctx);

}  // namespace ms
