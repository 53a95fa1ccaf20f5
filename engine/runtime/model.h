// A model instance on one rank: its parameters, its layers in order, and the activations between them.
// forwardBackward() runs one microbatch through every layer and back, accumulating parameter gradients; the
// caller zeroes gradients once per optimizer step (so microbatches accumulate).
//
// What always holds: the layers are exactly ModelSpec's, in order; the input of layer i is the output of
// layer i-1 (layer 0 reads the batch); every layer's forward and backward is recorded as a span when a span
// sink is set.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "plan/model_spec.h"
#include "plan/run_config.h"
#include "runtime/layers.h"
#include "runtime/memory.h"
#include "runtime/parameters.h"

namespace ms {

// One timed action of a step, on the rank's clock (seconds since the run's epoch).
struct Span {
  char action = 'F';  // 'F' forward, 'B' backward, 'O' optimizer step, 'E' evaluation
  int layer = -1;     // index in the ModelSpec, -1 for whole-model actions
  int microbatch = 0;
  double start = 0;
  double end = 0;
};

class Model {
 public:
  // The whole model on one rank. mlpInputs: flattened input size for mlp models (784 for Fashion-MNIST).
  Model(const RunConfig& config, MemoryTracker* tracker, int mlpInputs = 784);

  const ModelSpec& spec() const { return m_spec; }
  ParameterStore& params() { return *m_params; }
  const ParameterStore& params() const { return *m_params; }
  int numLayers() const { return static_cast<int>(m_layers.size()); }
  Layer& layer(int i) { return *m_layers[i]; }

  // Training: forward and backward of one microbatch; lossScale = 1 / targets in the whole optimizer step.
  LossStats forwardBackward(const Batch& batch, float lossScale, int microbatch = 0);
  // Evaluation: forward only; the head keeps its logits (head().logits()).
  LossStats forward(const Batch& batch);
  Layer& head() { return *m_layers.back(); }

  // Spans go to sink (nullptr: not recorded). clockZero is the run's epoch.
  void setSpanSink(std::vector<Span>* sink, std::chrono::steady_clock::time_point clockZero) {
    m_spans = sink;
    m_clockZero = clockZero;
  }

 private:
  void ensureActivations(int B);
  const float* layerInput(int i, const Batch& batch) const;
  double now() const;

  ModelSpec m_spec;
  std::unique_ptr<ParameterStore> m_params;
  std::vector<std::unique_ptr<Layer>> m_layers;
  std::vector<Buffer> m_acts;  // output of layer i (activations)
  Workspace m_workspace;  // layer scratch (slots below kLayerScratchSlots) and the two activation-gradient
                          // buffers the backward pass alternates between (the slots above)
  MemoryTracker* m_tracker;
  std::vector<Span>* m_spans = nullptr;
  std::chrono::steady_clock::time_point m_clockZero;
};

}  // namespace ms
