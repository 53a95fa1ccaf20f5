// Optimizer, learning-rate schedule and clipping; see optimizer.h.
#include "runtime/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"

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
    : m_config(config), m_params(params) {
  m_m = Buffer(params.size(), MemoryCategory::Optimizer, tracker);
  if (config.type == OptimizerType::AdamW) m_v = Buffer(params.size(), MemoryCategory::Optimizer, tracker);
}

void Optimizer::step(float lr, float gradScale) {
  ++m_t;
  for (const Parameter& p : m_params.params()) {
    float* w = m_params.values() + p.offset;
    const float* g = m_params.grads() + p.offset;
    const float wd = p.spec.decay ? static_cast<float>(m_config.weightDecay) : 0.0f;
    if (m_config.type == OptimizerType::AdamW) {
      cpu::adamwUpdate(w, g, m_m.data() + p.offset, m_v.data() + p.offset, p.numel, lr,
                       static_cast<float>(m_config.beta1), static_cast<float>(m_config.beta2),
                       static_cast<float>(m_config.eps), wd, static_cast<int>(m_t), gradScale);
    } else {
      cpu::sgdUpdate(w, g, m_m.data() + p.offset, p.numel, lr, static_cast<float>(m_config.momentum), wd,
                     m_config.nesterov, m_t == 1, gradScale);
    }
  }
}

std::vector<NamedTensor> Optimizer::stateTensors() const {
  std::vector<NamedTensor> out;
  for (const Parameter& p : m_params.params()) {
    if (m_config.type == OptimizerType::AdamW) {
      out.push_back({p.spec.name + ".exp_avg", p.spec.shape, DType::F32, m_m.data() + p.offset});
      out.push_back({p.spec.name + ".exp_avg_sq", p.spec.shape, DType::F32, m_v.data() + p.offset});
    } else {
      out.push_back({p.spec.name + ".momentum_buffer", p.spec.shape, DType::F32, m_m.data() + p.offset});
    }
  }
  return out;
}

Status Optimizer::loadState(const SafetensorsData& data, int64_t stepsTaken) {
  auto load = [&](const Parameter& p, const std::string& name, Buffer& dst) -> Status {
    const LoadedTensor* t = data.find(name);
    if (!t) return Status::error("optimizer state has no tensor \"" + name + "\"");
    if (t->shape != p.spec.shape || t->f32.size() != p.numel)
      return Status::error("optimizer state tensor \"" + name + "\" has the wrong shape");
    std::memcpy(dst.data() + p.offset, t->f32.data(), p.numel * sizeof(float));
    return Status::ok();
  };
  for (const Parameter& p : m_params.params()) {
    if (m_config.type == OptimizerType::AdamW) {
      MS_TRY(load(p, p.spec.name + ".exp_avg", m_m));
      MS_TRY(load(p, p.spec.name + ".exp_avg_sq", m_v));
    } else {
      MS_TRY(load(p, p.spec.name + ".momentum_buffer", m_m));
    }
  }
  m_t = stepsTaken;
  return Status::ok();
}

}  // namespace ms
