// The optimizer over a ParameterStore (AdamW or SGD with momentum, PyTorch semantics), the learning-rate
// schedule, and global-norm gradient clipping.
//
// What always holds: step() applies exactly one update to every parameter with the gradient scaled by
// gradScale (which folds in clipping); weight decay touches only parameters whose spec says decay; the state
// tensors round-trip through stateTensors()/loadState() bit for bit, so a resumed run continues identically.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/backend.h"
#include "plan/run_config.h"
#include "runtime/memory.h"
#include "runtime/parameters.h"
#include "runtime/safetensors.h"

namespace ms {

// Learning rate of optimizer step `step` (0-based): linear warm-up to optimizer.lr over warmup_steps, then
// the schedule's decay down to lr * min_lr_ratio at the last step (cosine as in Loshchilov & Hutter 2017,
// "SGDR", eq. 5, without restarts).
double learningRate(const RunConfig& config, int64_t step);

// PyTorch's clip_grad_norm_: the factor min(1, maxNorm / (norm + 1e-6)); 1 when maxNorm is 0 (disabled).
float clipFactor(double gradNorm, double maxNorm);

class Optimizer {
 public:
  // State for the slice of every unit this rank owns (the whole unit without ZeRO, its DP slice with ZeRO).
  Optimizer(const OptimizerConfig& config, ParameterStore& params, MemoryTracker* tracker);

  // One update of the owned slices from the owned synced gradients (ParameterStore::ownedGrads).
  void step(float lr, float gradScale);
  int64_t stepsTaken() const { return m_t; }
  void setStepsTaken(int64_t t) { m_t = t; }

  // The names of the state tensors of a parameter: "<param>.exp_avg" and "<param>.exp_avg_sq" (AdamW) or
  // "<param>.momentum_buffer" (SGD), the names PyTorch's optimizers use for these moments.
  std::vector<std::string> stateSuffixes() const;
  // The owned slice of state tensor `which` (index into stateSuffixes) of a unit.
  float* ownedState(int which, int unit);

  // Single-rank (unsharded, ZeRO 0) helpers: state as named full tensors and its restore.
  // host receives the downloaded state the tensors point into.
  std::vector<NamedTensor> stateTensors(std::vector<std::vector<float>>& host) const;
  Status loadState(const SafetensorsData& data, int64_t stepsTaken);

 private:
  OptimizerConfig m_config;
  ParameterStore& m_params;
  Backend& m_be;
  std::vector<Buffer> m_m;  // per unit: AdamW first moment, or SGD momentum buffer (owned slice)
  std::vector<Buffer> m_v;  // per unit: AdamW second moment
  std::vector<OptimizerSegment> m_segments;  // step()'s segment list, kept for its capacity
  int64_t m_t = 0;
};

}  // namespace ms
