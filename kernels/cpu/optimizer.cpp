// Optimizer updates over flat parameter buffers, written to follow PyTorch's single-tensor code paths
// (torch/optim/adam.py _single_tensor_adam with decoupled weight decay, torch/optim/sgd.py
// _single_tensor_sgd) operation for operation, so results agree with torch.optim to float rounding. Scalars
// that PyTorch computes in Python (bias corrections, step size) are computed in double here too.
#include <omp.h>

#include <cmath>
#include <cstddef>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace ms::cpu {

void adamwUpdate(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                 float beta2, float eps, float weightDecay, int t, float gradScale) {
  // params, grads, m, v: (n)
  // AdamW (Loshchilov & Hutter 2019, algorithm 2) as torch.optim.AdamW orders it:
  //   p *= 1 - lr*wd;  m = lerp(m, g, 1 - b1);  v = b2*v + (1 - b2)*g*g;
  //   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
  const double biasCorrection1 = 1.0 - std::pow(double(beta1), double(t));
  const double biasCorrection2 = 1.0 - std::pow(double(beta2), double(t));
  const float stepSize = float(double(lr) / biasCorrection1);
  const float bc2Sqrt = float(std::sqrt(biasCorrection2));
  const float decay = float(1.0 - double(lr) * double(weightDecay));
  const float w1 = 1.0f - beta1;
  const float w2 = 1.0f - beta2;
  const ptrdiff_t count = ptrdiff_t(n);
#pragma omp parallel for simd schedule(static) if (n >= detail::kMinParallelWork)
  for (ptrdiff_t i = 0; i < count; i++) {
    const float g = grads[i] * gradScale;
    const float p = params[i] * decay;
    const float mi = m[i] + w1 * (g - m[i]);
    const float vi = v[i] * beta2 + w2 * g * g;
    m[i] = mi;
    v[i] = vi;
    params[i] = p - stepSize * (mi / (std::sqrt(vi) / bc2Sqrt + eps));
  }
}

void sgdUpdate(float* params, const float* grads, float* buf, size_t n, float lr, float momentum,
               float weightDecay, bool nesterov, bool firstStep, float gradScale) {
  // params, grads, buf: (n). With momentum 0 buf is unused (PyTorch keeps none) and may be null.
  const ptrdiff_t count = ptrdiff_t(n);
  const bool useBuf = buf && momentum != 0.0f;
#pragma omp parallel for simd schedule(static) if (n >= detail::kMinParallelWork)
  for (ptrdiff_t i = 0; i < count; i++) {
    const float g = grads[i] * gradScale + weightDecay * params[i];
    float step = g;
    if (useBuf) {
      const float b = firstStep ? g : momentum * buf[i] + g;
      buf[i] = b;
      step = nesterov ? g + momentum * b : b;
    }
    params[i] -= lr * step;
  }
}

double sumSquares(const float* x, size_t n) {
  // Each thread sums a contiguous block in double; the partials are combined in thread order (an ordered
  // loop, no reduction clause whose combining order is unspecified), so a thread count gives one result.
  double total = 0.0;
#pragma omp parallel if (n >= detail::kMinParallelWork)
  {
    size_t begin = 0, end = 0;
    detail::splitRange(n, omp_get_thread_num(), omp_get_num_threads(), begin, end);
    const float* xs = x + begin;
    const double local = detail::laneSum<double>(ptrdiff_t(end - begin),
                                                 [&](ptrdiff_t i) { return double(xs[i]) * double(xs[i]); });
#pragma omp for ordered schedule(static, 1)
    for (int t = 0; t < omp_get_num_threads(); t++) {
#pragma omp ordered
      total += local;
    }
  }
  return total;
}

}  // namespace ms::cpu
