// Optimizer updates over flat parameter buffers: the per-element math is kernels/optimizer_math.h (shared
// with the CUDA kernels; it follows torch.optim's single-tensor paths), parallelised over the elements here.
#include <omp.h>

#include <cmath>
#include <cstddef>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/optimizer_math.h"

namespace ms::cpu {

void adamwUpdate(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                 float beta2, float eps, float weightDecay, int t, float gradScale) {
  // params, grads, m, v: (n); the update itself is optim::adamwElement (kernels/optimizer_math.h).
  const optim::AdamwScalars s = optim::adamwScalars(lr, beta1, beta2, eps, weightDecay, t);
  const ptrdiff_t count = ptrdiff_t(n);
  detail::forEachSimd(count, n >= detail::kMinParallelWork, [=](ptrdiff_t i) {
    optim::adamwElement(params[i], m[i], v[i], grads[i] * gradScale, s);
  });
}

void sgdUpdate(float* params, const float* grads, float* buf, size_t n, float lr, float momentum,
               float weightDecay, bool nesterov, bool firstStep, float gradScale) {
  // params, grads, buf: (n). With momentum 0 buf is unused (PyTorch keeps none) and may be null.
  const ptrdiff_t count = ptrdiff_t(n);
  float* useBuf = momentum != 0.0f ? buf : nullptr;
  detail::forEachSimd(count, n >= detail::kMinParallelWork, [=](ptrdiff_t i) {
    optim::sgdElement(params[i], useBuf ? useBuf + i : nullptr, grads[i] * gradScale, lr, momentum,
                      weightDecay, nesterov, firstStep);
  });
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
