// The runtime's layers: one object per LayerSpec (embedding, transformer block, head, ...), executing forward
// and backward of one microbatch through the kernels. A layer reads its parameters and accumulates its
// gradients in a ParameterStore by name; it keeps what backward needs in its own cache buffers.
//
// What always holds: backward(x, dy, dx) must follow forward(x, ...) of the same microbatch with the same x;
// backward ACCUMULATES into dx and into parameter gradients (dx may be nullptr for the first layer). A head's
// forward computes the loss and, when training, the loss gradient (scaled by lossScale) for its backward.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "plan/model_spec.h"
#include "runtime/data.h"
#include "runtime/memory.h"
#include "runtime/parameters.h"

namespace ms {

struct ForwardMode {
  bool training = true;    // heads compute the loss gradient
  float lossScale = 1.0f;  // d(total loss)/d(per-target loss): 1 / targets in the optimizer step
};

struct LossStats {
  double lossSum = 0;   // sum of per-target losses
  int64_t count = 0;    // targets
  int64_t correct = 0;  // classifier heads: argmax == target
  LossStats& operator+=(const LossStats& o) {
    lossSum += o.lossSum;
    count += o.count;
    correct += o.correct;
    return *this;
  }
};

class Layer {
 public:
  explicit Layer(const LayerSpec& spec) : m_spec(spec) {}
  virtual ~Layer() = default;
  const LayerSpec& spec() const { return m_spec; }
  // Floats of the output activation for a microbatch of B samples (0 for heads).
  virtual int64_t outputFloats(int B) const = 0;
  // x: the previous layer's output, or for the first layer the batch's images (nullptr for token inputs).
  virtual void forward(const float* x, float* y, const Batch& batch, const ForwardMode& mode) = 0;
  virtual void backward(const float* x, const float* dy, float* dx, const Batch& batch) = 0;
  // Heads: the loss of the last forward.
  virtual LossStats lossStats() const { return {}; }
  // Heads: the logits of the last forward when it was not training (training overwrites them with their
  // gradient), else nullptr. (B, T, V) for gpt, (B, classes) for classifiers.
  virtual const float* logits() const { return nullptr; }

 protected:
  LayerSpec m_spec;
};

// Everything a layer needs to bind to its parameters, account its memory and borrow scratch space.
struct LayerContext {
  const ModelConfig& model;
  ParameterStore& params;
  MemoryTracker* tracker;
  Workspace* workspace;  // shared by all layers; a layer uses slots [0, kLayerScratchSlots)
  int positions;         // T of the activations (ModelSpec::samplePositions)
};

// Workspace slots a layer may use; the model keeps its activation-gradient buffers above them.
inline constexpr int kLayerScratchSlots = 6;

// Builds the runtime layer for spec (the layer's parameters, and a tied head's wte, must be in ctx.params).
std::unique_ptr<Layer> makeLayer(const LayerSpec& spec, LayerContext ctx);

}  // namespace ms
