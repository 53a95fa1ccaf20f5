// The per-element optimizer updates and their per-step scalars, shared by the CPU loops
// (kernels/cpu/optimizer.cpp) and the CUDA kernels (kernels/cuda/cuda_optimizer.cu), so the two backends
// cannot drift apart. Both follow torch.optim's single-tensor paths operation for operation (AdamW:
// torch/optim/adam.py _single_tensor_adam with decoupled weight decay; SGD: torch/optim/sgd.py), so results
// agree with PyTorch to float rounding; the scalars PyTorch computes in Python are computed in double here.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define MS_HOST_DEVICE __host__ __device__
#else
#define MS_HOST_DEVICE
#endif

namespace ms::optim {

// AdamW (Loshchilov & Hutter 2019, algorithm 2) as torch.optim.AdamW orders it:
//   p *= 1 - lr*wd;  m = lerp(m, g, 1 - b1);  v = b2*v + (1 - b2)*g*g;
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
struct AdamwScalars {
  float stepSize = 0;  // lr / (1 - beta1^t)
  float bc2Sqrt = 1;   // sqrt(1 - beta2^t)
  float decay = 1;     // 1 - lr * weight_decay
  float w1 = 0;        // 1 - beta1
  float w2 = 0;        // 1 - beta2
  float beta2 = 0;
  float eps = 0;
};

// The decoupled weight decay factor 1 - lr * weight_decay (a tensor's own; the other scalars are per step).
inline float adamwDecay(float lr, float weightDecay) {
  return float(1.0 - double(lr) * double(weightDecay));
}

inline AdamwScalars adamwScalars(float lr, float beta1, float beta2, float eps, float weightDecay, int t) {
  AdamwScalars s;
  s.stepSize = float(double(lr) / (1.0 - std::pow(double(beta1), double(t))));
  s.bc2Sqrt = float(std::sqrt(1.0 - std::pow(double(beta2), double(t))));
  s.decay = adamwDecay(lr, weightDecay);
  s.w1 = 1.0f - beta1;
  s.w2 = 1.0f - beta2;
  s.beta2 = beta2;
  s.eps = eps;
  return s;
}

// One element: g is the gradient already scaled (clipping, accumulation averaging).
MS_HOST_DEVICE inline void adamwElement(float& p, float& m, float& v, float g, const AdamwScalars& s) {
  const float pd = p * s.decay;
  const float mi = m + s.w1 * (g - m);
  const float vi = v * s.beta2 + s.w2 * g * g;
  m = mi;
  v = vi;
  p = pd - s.stepSize * (mi / (std::sqrt(vi) / s.bc2Sqrt + s.eps));
}

// SGD with momentum as PyTorch defines it: g = grad + weightDecay*p; buf = momentum*buf + g (buf = g on the
// first step); p -= lr * (nesterov ? g + momentum*buf : buf). buf null: plain SGD (momentum 0 keeps none).
MS_HOST_DEVICE inline void sgdElement(float& p, float* buf, float grad, float lr, float momentum,
                                      float weightDecay, bool nesterov, bool firstStep) {
  const float g = grad + weightDecay * p;
  float step = g;
  if (buf) {
    const float b = firstStep ? g : momentum * *buf + g;
    *buf = b;
    step = nesterov ? g + momentum * b : b;
  }
  p -= lr * step;
}

}  // namespace ms::optim
