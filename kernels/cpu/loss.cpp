// Fused softmax + cross-entropy and row argmax, one row per iteration. The loss is log-sum-exp with the row
// maximum subtracted, so logits of any magnitude give finite values. dlogits may alias logits: everything the
// loss needs is read before the row is overwritten with the probabilities.
#include <cmath>
#include <cstddef>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace ms::cpu {

void softmaxCrossEntropy(float* losses, float* dlogits, const float* logits, const int32_t* targets, int N,
                         int V, float gradScale) {
  // losses (N), dlogits (N, V), logits (N, V), targets (N)
  if (N <= 0 || V <= 0) return;
  const bool par = size_t(N) * size_t(V) >= detail::kMinParallelWork;
#pragma omp parallel for schedule(static) if (par)
  for (int n = 0; n < N; n++) {
    const float* x = logits + size_t(n) * V;
    float* d = dlogits ? dlogits + size_t(n) * V : nullptr;
    const int32_t target = targets[n];
    if (target < 0) {
      losses[n] = 0.0f;
      if (d) std::memset(d, 0, sizeof(float) * size_t(V));
      continue;
    }
    const float maxv = detail::rowMax(x, V);
    const float shiftedTarget = x[target] - maxv;
    float sum = 0.0f;
    if (d) {
      // d[j] = exp(x[j] - max): x[j] is read before d[j] is written at the same index.
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; j++) {
        const float e = detail::vexp(x[j] - maxv);
        d[j] = e;
        sum += e;
      }
      const float s = gradScale / sum;
#pragma omp simd
      for (int j = 0; j < V; j++) d[j] *= s;
      d[target] -= gradScale;
    } else {
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; j++) sum += detail::vexp(x[j] - maxv);
    }
    losses[n] = std::log(sum) - shiftedTarget;
  }
}

void argmaxRows(int32_t* out, const float* x, int N, int V) {
  // out (N), x (N, V). Ties go to the lowest index.
  const bool par = size_t(N) * size_t(V) >= detail::kMinParallelWork;
#pragma omp parallel for schedule(static) if (par)
  for (int n = 0; n < N; n++) {
    const float* row = x + size_t(n) * V;
    int best = 0;
    for (int j = 1; j < V; j++)
      if (row[j] > row[best]) best = j;
    out[n] = best;
  }
}

}  // namespace ms::cpu
