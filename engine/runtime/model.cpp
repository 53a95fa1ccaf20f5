// Model: layers in ModelSpec order over one ParameterStore; see model.h.
#include "runtime/model.h"

#include <numeric>

namespace ms {

Model::Model(const RunConfig& config, MemoryTracker* tracker, int mlpInputs)
    : m_spec(buildModelSpec(config.model, config.training.seqLen, mlpInputs)),
      m_workspace(tracker),
      m_tracker(tracker) {
  std::vector<int> all(m_spec.layers.size());
  std::iota(all.begin(), all.end(), 0);
  m_params = std::make_unique<ParameterStore>(m_spec, all, tracker);
  m_params->initialize(config.seed);
  LayerContext ctx{config.model, *m_params, tracker, &m_workspace, m_spec.samplePositions};
  for (const LayerSpec& l : m_spec.layers) m_layers.push_back(makeLayer(l, ctx));
  for (size_t i = 0; i < m_layers.size(); ++i) {
    m_acts.emplace_back(0, MemoryCategory::Activations, tracker);
  }
}

void Model::ensureActivations(int B) {
  for (size_t i = 0; i < m_layers.size(); ++i) {
    const int64_t n = m_layers[i]->outputFloats(B);
    m_acts[i].reserve(n);
  }
}

const float* Model::layerInput(int i, const Batch& batch) const {
  if (i > 0) return m_acts[i - 1].data();
  return batch.images.empty() ? nullptr : batch.images.data();
}

double Model::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - m_clockZero).count();
}

LossStats Model::forwardBackward(const Batch& batch, float lossScale, int microbatch) {
  ensureActivations(batch.B);
  const ForwardMode mode{true, lossScale};
  const int L = numLayers();
  for (int i = 0; i < L; ++i) {
    const double t0 = m_spans ? now() : 0;
    m_layers[i]->forward(layerInput(i, batch), m_acts[i].data(), batch, mode);
    if (m_spans) m_spans->push_back({'F', i, microbatch, t0, now()});
  }
  for (int i = L - 1; i >= 0; --i) {
    const double t0 = m_spans ? now() : 0;
    // The gradient of layer j's output lives in workspace slot kLayerScratchSlots + j % 2: layer i reads its
    // output gradient from one slot and writes its input gradient to the other.
    float* dx = i > 0 ? m_workspace.get(kLayerScratchSlots + (i - 1) % 2,
                                        m_layers[i - 1]->outputFloats(batch.B), true)
                      : nullptr;
    const float* dy =
        i == L - 1 ? nullptr
                   : m_workspace.get(kLayerScratchSlots + i % 2, m_layers[i]->outputFloats(batch.B), false);
    m_layers[i]->backward(layerInput(i, batch), dy, dx, batch);
    if (m_spans) m_spans->push_back({'B', i, microbatch, t0, now()});
  }
  return head().lossStats();
}

LossStats Model::forward(const Batch& batch) {
  ensureActivations(batch.B);
  const ForwardMode mode{false, 1.0f};
  for (int i = 0; i < numLayers(); ++i)
    m_layers[i]->forward(layerInput(i, batch), m_acts[i].data(), batch, mode);
  return head().lossStats();
}

}  // namespace ms
