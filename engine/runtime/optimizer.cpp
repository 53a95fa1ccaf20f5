// Optimizer, learning-rate schedule and clipping; see optimizer.h.
#include "runtime/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ms {

double learningRate(const RunConfig& config, int64_t step) {
  const double peak = config.optimizer.lr;
  const int64_t warmup = config.training.warmupSteps;
  if (step < warmup) return peak * double(step + 1) / double(warmup);
  const double floor = peak * config.training.minLrRatio;
  const int64_t decaySteps = std::max<int64_t>(1, config.training.steps - warmup - 1);
  const double progress = std::clamp(double(step - warmup) / double(decaySteps), 0.0, 1.0);
  switch (config.training.lrSchedule) {
    case LrSchedule::Constant:
      return peak;
    case LrSchedule::Linear:
      return peak - (peak - floor) * progress;
    case LrSchedule::Cosine:
      return floor + 0.5 * (peak - floor) * (1.0 + std::cos(M_PI * progress));
  }
  return peak;
}

float clipFactor(double gradNorm, double maxNorm) {
  if (maxNorm <= 0) return 1.0f;
  const double coef = maxNorm / (gradNorm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

Optimizer::Optimizer(const OptimizerConfig& config, ParameterStore& params, MemoryTracker* tracker)
    : m_config(config), m_params(params), m_be(params.stateBackend()) {
  // Under offload the moments live with the master weights in host memory (ZeRO-Offload).
  if (params.offloadsOptimizer()) tracker = params.stateTracker();
  for (size_t u = 0; u < params.units().size(); ++u) {
    const size_t n = params.ownedSize(static_cast<int>(u));
    m_m.emplace_back(n, MemoryCategory::Optimizer, tracker);
    m_v.emplace_back(config.type == OptimizerType::AdamW ? n : 0, MemoryCategory::Optimizer, tracker);
  }
}

void Optimizer::step(float lr, float gradScale) {
  ++m_t;
  m_params.stageOptimizerGrads();  // offload: the owned gradients cross to the host
  // Every parameter's part inside its unit's owned slice (padding between parameters is skipped), with its
  // own weight decay, as one list: the backend updates them all in one call (one launch on a GPU).
  m_segments.clear();
  const auto& units = m_params.units();
  for (size_t ui = 0; ui < units.size(); ++ui) {
    const int u = static_cast<int>(ui);
    const size_t lo = m_params.ownedBegin(u), hi = lo + m_params.ownedSize(u);
    float* w0 = m_params.ownedValues(u);
    const TensorIn g0 = m_params.optimizerGrads(u);
    for (int pi : units[ui].params) {
      const Parameter& p = m_params.params()[pi];
      const size_t pb = p.offset - units[ui].begin;
      const size_t a = std::max(lo, pb), b = std::min(hi, pb + p.numel);
      if (a >= b) continue;
      const size_t at = a - lo;
      OptimizerSegment seg;
      seg.params = w0 + at;
      seg.grads = g0.at(at);
      seg.m = m_m[ui].data() + at;
      seg.v = m_config.type == OptimizerType::AdamW ? m_v[ui].data() + at : nullptr;
      seg.n = b - a;
      seg.weightDecay = p.spec.decay ? static_cast<float>(m_config.weightDecay) : 0.0f;
      m_segments.push_back(seg);
    }
  }
  if (m_config.type == OptimizerType::AdamW) {
    m_be.adamwUpdateSegments(m_segments.data(), m_segments.size(), lr, static_cast<float>(m_config.beta1),
                             static_cast<float>(m_config.beta2), static_cast<float>(m_config.eps),
                             static_cast<int>(m_t), gradScale);
  } else {
    m_be.sgdUpdateSegments(m_segments.data(), m_segments.size(), lr, static_cast<float>(m_config.momentum),
                           m_config.nesterov, m_t == 1, gradScale);
  }
}

std::vector<std::string> Optimizer::stateSuffixes() const {
  if (m_config.type == OptimizerType::AdamW) return {".exp_avg", ".exp_avg_sq"};
  return {".momentum_buffer"};
}

float* Optimizer::ownedState(int which, int unit) {
  return which == 0 ? m_m[unit].data() : m_v[unit].data();
}

std::vector<NamedTensor> Optimizer::stateTensors(std::vector<std::vector<float>>& host) const {
  // Unsharded stores only: the owned slice is the whole unit and local tensors are full tensors.
  std::vector<NamedTensor> out;
  const auto suffixes = stateSuffixes();
  host.assign(2 * m_m.size(), {});
  for (size_t u = 0; u < m_m.size(); ++u)
    for (size_t w = 0; w < suffixes.size(); ++w) {
      const Buffer& b = w == 0 ? m_m[u] : m_v[u];
      host[2 * u + w].resize(b.size());
      m_be.download(host[2 * u + w].data(), b.data(), b.size() * sizeof(float));
    }
  for (const Parameter& p : m_params.params()) {
    if (p.tiedCopy) continue;
    const size_t at = p.offset - m_params.units()[p.unit].begin;
    for (size_t w = 0; w < suffixes.size(); ++w) {
      out.push_back({p.spec.name + suffixes[w], p.shape, DType::F32, host[2 * p.unit + w].data() + at});
    }
  }
  return out;
}

Status Optimizer::loadState(const SafetensorsData& data, int64_t stepsTaken) {
  const auto suffixes = stateSuffixes();
  for (const Parameter& p : m_params.params()) {
    const size_t at = p.offset - m_params.units()[p.unit].begin;
    for (size_t w = 0; w < suffixes.size(); ++w) {
      const std::string name = p.spec.name + suffixes[w];
      const LoadedTensor* t = data.find(name);
      if (!t) return Status::error("optimizer state has no tensor \"" + name + "\"");
      if (t->shape != p.spec.shape || t->f32.size() != p.numel)
        return Status::error("optimizer state tensor \"" + name + "\" has the wrong shape");
      Buffer& b = w == 0 ? m_m[p.unit] : m_v[p.unit];
      m_be.upload(b.data() + at, t->f32.data(), p.numel * sizeof(float));
    }
  }
  m_t = stepsTaken;
  return Status::ok();
}

}  // namespace ms
