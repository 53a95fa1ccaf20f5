// The layers a rank runs, over its ParameterStore: the whole model on one process, or under a plan the chunks
// of the rank's pipeline stage with its tensor-parallel slice of each layer. Work is done per CHUNK and per
// SLOT: forwardChunk / backwardChunk run one microbatch through the layers of one chunk, keeping what
// backward needs in the slot (a pipeline stage has several microbatches in flight). Under activation
// recomputation (plan/recompute.h) fully recomputed transformer blocks drop their saved activations after
// forward and recompute them before backward (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
// Cost"; per layer, as Megatron-LM's full recompute, all blocks or the first recompute_layers of each chunk);
// under selective recompute every block drops only its attention matrix and re-makes it in backward
// (Korthikanti et al. 2022, section 5; runtime/transformer.cpp).
//
// What always holds: the layers are exactly ModelSpec's, in order, each chunk a contiguous run; the input of
// a layer is the previous layer's output in the same slot (the chunk's first layer gets it from the caller);
// parameters of a layer are gathered (ZeRO-3) before and released after each use; every layer's forward and
// backward is recorded as a span when a span sink is set.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "plan/model_spec.h"
#include "plan/recompute.h"
#include "plan/run_config.h"
#include "runtime/layers.h"
#include "runtime/memory.h"
#include "runtime/parameters.h"

namespace ms {

// One timed action of a step, on the rank's clock (seconds since the run's epoch).
struct Span {
  char action = 'F';  // 'F' forward, 'B' backward, 'W' weight gradient, 'O' optimizer step, 'E' evaluation,
                      // 'r'/'R' waiting for an activation/gradient, 'G' gradient sync wait
  int layer = -1;     // index in the ModelSpec, -1 for whole-model actions
  int microbatch = 0;
  int chunk = 0;
  double start = 0;
  double end = 0;
  // Backend marks (Backend::mark) while the step runs; Model::resolveSpans() turns them into start/end.
  int startMark = -1;
  int endMark = -1;
};

// Which part of the model a rank runs and how (see StoreLayout for the parameter side).
struct ModelShard {
  std::vector<std::vector<int>> chunks;  // layer indices of each chunk the rank runs (its virtual chunks)
  std::vector<int> chunkIds;             // global chunk index of each
  StoreLayout store;
  TensorParallel tp;
  Communicator* dp = nullptr;   // data-parallel group (ZeRO), spanning the context-parallel ranks
  ContextParallel cp;           // context-parallel group (ring attention)
  ExpertParallel ep;            // expert-parallel group (MoE all-to-all)
  Communicator* edp = nullptr;  // expert-data-parallel group (the experts' gradient sums; null: 1 replica)
  RecomputePolicy recompute;    // the plan's "recompute" and "recompute_layers"
};

class Model {
 public:
  // The whole model on one rank (recomputing as config.parallel says). mlpInputs: flattened input size for
  // mlp models (784 for Fashion-MNIST).
  Model(const RunConfig& config, MemoryTracker* tracker, int mlpInputs = 784);
  // A rank's share under a plan.
  // hostTracker: host memory for offloaded model states ("offload"; may be null without).
  Model(const RunConfig& config, const ModelShard& shard, MemoryTracker* tracker, int mlpInputs = 784,
        MemoryTracker* hostTracker = nullptr);

  const ModelSpec& spec() const { return m_spec; }
  ParameterStore& params() { return *m_params; }
  const ParameterStore& params() const { return *m_params; }
  int numLayers() const { return static_cast<int>(m_spec.layers.size()); }
  bool holds(int layer) const { return m_layers[layer] != nullptr; }
  Layer& layer(int i) { return *m_layers[i]; }
  const ModelShard& shard() const { return m_shard; }
  MemoryTracker* tracker() const { return m_tracker; }
  int localChunks() const { return static_cast<int>(m_shard.chunks.size()); }
  // Floats of the activation a chunk hands on (its last layer's output) for a microbatch of B samples.
  int64_t chunkOutputFloats(int localChunk, int B) const;
  // Floats of the gradient a chunk hands back (the size of its input).
  int64_t chunkInputFloats(int localChunk, int B) const;
  // How layer outputs, and so a chunk's output and input (the pipeline's activation messages), are stored:
  // bf16 under "precision": "bf16" (every layer's output rounded to bf16, as Megatron-LM keeps the residual
  // stream; plan/model_spec.h activationElementBytes), else fp32. Storage floats for n elements.
  CommType activationType() const { return m_bf16Outputs ? CommType::BF16 : CommType::F32; }
  size_t activationStorageFloats(size_t n) const { return m_bf16Outputs ? (n + 1) / 2 : n; }

  // ---- chunk-level work (the pipeline executor) ----
  // Forward of one chunk for the microbatch kept in `slot`. input: the previous chunk's output (ignored for
  // the model's first chunk, which reads the batch), stored as activationType() says. Returns the chunk's
  // output (nullptr for the head's chunk), stored the same way (a bf16 one behind the float pointer), valid
  // until the slot's backward. lossScale as in forwardBackward. Throws CommFailure.
  const float* forwardChunk(int localChunk, int slot, const float* input, const Batch& batch,
                            const ForwardMode& mode, int microbatch);
  // Backward of one chunk: dOut the gradient of its output (ignored for the head's chunk), dIn (nullable)
  // ACCUMULATES the gradient of its input; both stored as activationType() says (under bf16 dOut is read as
  // bf16 and dIn is written, rounded: every layer's input gradient is rounded to bf16, as the activations).
  // finalUse: this is the chunk's last backward (or weight part) of the step, so each layer's gradient bucket
  // starts syncing as soon as the layer is done. Throws CommFailure.
  void backwardChunk(int localChunk, int slot, const float* input, const float* dOut, float* dIn,
                     const Batch& batch, BackwardPart part, int microbatch, bool finalUse);
  // Drops what the slot keeps in every layer of the chunk.
  void releaseSlot(int localChunk, int slot);
  // The loss statistics of the head's last forward in the slot (zero when the rank has no head).
  LossStats headStats(int slot) const;
  // Mixture of experts: the load-balancing losses of the layers that ran forward in training since the last
  // call (a recompute's re-run not counted), and starts the sum again.
  double takeAuxLoss() { return std::exchange(m_forwardAux, 0.0); }
  bool holdsHead() const { return holds(numLayers() - 1); }

  // ---- whole model on one rank (tests, tools) ----
  // Training: forward and backward of one microbatch; lossScale = 1 / targets in the whole optimizer step.
  LossStats forwardBackward(const Batch& batch, float lossScale, int microbatch = 0);
  // Evaluation: forward only; with keepLogits the head keeps its logits (head().logits()).
  LossStats forward(const Batch& batch, bool keepLogits = false);
  Layer& head() { return *m_layers.back(); }
  // The buffers (LayerSpec::buffers: the cnn's BatchNorm running statistics) of the layers this rank holds,
  // in model order.
  std::vector<LayerBuffer> buffers();

  // Spans go to sink (nullptr: not recorded). clockZero is the run's epoch.
  void setSpanSink(std::vector<Span>* sink, std::chrono::steady_clock::time_point clockZero) {
    m_spans = sink;
    m_clockZero = clockZero;
    m_backend.setEpoch(clockZero);
  }
  // A backend mark when spans are recorded (the point the device reaches after the work issued so far),
  // else -1.
  int mark() { return m_spans ? m_backend.mark() : -1; }
  // Records a span (when a sink is set) from startMark to now.
  void addSpan(char action, int layer, int microbatch, int chunk, int startMark) {
    if (m_spans) m_spans->push_back({action, layer, microbatch, chunk, 0, 0, startMark, m_backend.mark()});
  }
  // Start of a step's spans: the sink is cleared and the backend's marks dropped.
  void beginSpans() {
    if (m_spans) m_spans->clear();
    m_backend.clearMarks();
  }
  // Turns the sink's marks into times on the run's clock (waits for the device's work of the step).
  void resolveSpans();
  Backend& backend() { return m_backend; }
  // Stops (and resumes) recording, e.g. during evaluation.
  std::vector<Span>* pauseSpans() { return std::exchange(m_spans, nullptr); }
  void resumeSpans(std::vector<Span>* sink) { m_spans = sink; }

 private:
  void build(const RunConfig& config, int mlpInputs);
  // The microbatch as the layers of a local chunk see it in a slot (uploaded there on a device backend).
  BatchView view(const Batch& batch, int localChunk, int slot, bool upload);
  // The layer's output buffer in the slot as stored (activationType()).
  float* output(int layer, int slot, int B);
  // Elements of the layer's input (the previous layer's output; layer >= 1).
  size_t inputFloats(int layer, int B) const;
  // The fp32 input of a layer: the batch's images for layer 0, else the previous layer's output (or the
  // chunk's input), widened into workspace slot kInputStaging when stored in bf16.
  const float* layerInput(int layer, int firstOfChunk, int slot, const float* chunkInput,
                          const BatchView& batch);
  // Where a layer writes its output: the stored buffer, or under bf16 the fp32 staging slot kOutputStaging
  // that storeOutput() then rounds into it.
  float* outputTarget(int layer, float* stored, int B);
  void storeOutput(int layer, float* stored, const float* written, int B);
  // ZeRO-3 gather / release of the units a layer reads (its own and the tied embedding).
  void acquire(int layer);
  // overlap_param_gather (ZeRO 1-2): waits for the all-gathers of the units a layer reads that the last
  // optimizer step left in flight, before the layer's span starts: the wait is a gap on the timeline, as the
  // simulator draws it, not part of the layer's forward (acquire would wait inside the span).
  void awaitParamGathers(int layer);
  // ZeRO-3: starts gathering the layer's parameters (and the tied embedding it reads) while the current
  // layer computes; acquire() finishes the gather.
  void prefetch(int layer);
  bool readsTied(int layer) const;  // the embedding and the LM head read the tied wte (its own unit)
  void releaseParams(int layer);
  void ensureGrads(int layer);
  void startSync(int layer);
  bool recomputes(int layer) const;
  void reduceGrads(int layer);  // ZeRO >= 2: this microbatch's gradients of the layer are complete

  // Workspace slots (above the two activation-gradient buffers) of the bf16 outputs' fp32 staging: a
  // layer's widened input and the output it writes before the model rounds it.
  static constexpr int kInputStaging = kLayerScratchSlots + 2;
  static constexpr int kOutputStaging = kLayerScratchSlots + 3;

  RunConfig m_config;
  bool m_bf16Outputs = false;  // "precision": "bf16": layer outputs stored as bf16
  ModelSpec m_spec;
  ModelShard m_shard;
  std::unique_ptr<ParameterStore> m_params;
  std::vector<std::unique_ptr<Layer>> m_layers;  // (layers): null where not held
  std::vector<std::vector<Buffer>> m_acts;       // (layers, slots): output of each layer
  std::vector<bool> m_fullyRecomputed;           // (layers): plan/recompute.h fullyRecomputed
  double m_forwardAux = 0;                       // takeAuxLoss
  Workspace m_workspace;  // layer scratch (slots below kLayerScratchSlots) and the two activation-gradient
                          // buffers the backward pass alternates between (the slots above)
  MemoryTracker* m_tracker;
  Backend& m_backend;
  struct BatchCopy {
    explicit BatchCopy(MemoryTracker* t)
        : tokens(0, MemoryCategory::Activations, t),
          targets(0, MemoryCategory::Activations, t),
          images(0, MemoryCategory::Activations, t) {}
    Buffer tokens, targets, images;  // int32 tokens and targets kept in float-sized elements
  };
  std::vector<std::vector<std::unique_ptr<BatchCopy>>> m_batchCopies;  // (local chunks, slots)
  std::vector<Span>* m_spans = nullptr;
  std::chrono::steady_clock::time_point m_clockZero;
};

}  // namespace ms
