// Mixture-of-experts row movement (see cpu_ops.h): a token's row gathered into its expert's batch, the
// expert's output added back scaled by the token's gate, and the gates' gradients as row dot products. Rows
// are independent (scatterAddRows' destinations distinct), so each loop is parallel over rows and exact.
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace ms::cpu {

void gatherRows(float* dst, const float* src, const int32_t* idx, const float* scale, int n, int C) {
#pragma omp parallel for schedule(static) if (size_t(n) * size_t(C) >= detail::kMinParallelWork)
  for (int r = 0; r < n; r++) {
    const float* s = src + size_t(idx[r]) * C;
    float* d = dst + size_t(r) * C;
    const float k = scale ? scale[r] : 1.0f;
#pragma omp simd
    for (int c = 0; c < C; c++) d[c] = k * s[c];
  }
}

void scatterAddRows(float* dst, const float* src, const int32_t* idx, const float* scale, int n, int C) {
#pragma omp parallel for schedule(static) if (size_t(n) * size_t(C) >= detail::kMinParallelWork)
  for (int r = 0; r < n; r++) {
    const float* s = src + size_t(r) * C;
    float* d = dst + size_t(idx[r]) * C;
    const float k = scale ? scale[r] : 1.0f;
#pragma omp simd
    for (int c = 0; c < C; c++) d[c] += k * s[c];
  }
}

void rowDots(float* out, const float* a, const int32_t* idx, const float* b, int n, int C) {
#pragma omp parallel for schedule(static) if (size_t(n) * size_t(C) >= detail::kMinParallelWork)
  for (int r = 0; r < n; r++) {
    const float* x = a + size_t(idx[r]) * C;
    const float* y = b + size_t(r) * C;
    out[r] = detail::laneSum(C, [&](ptrdiff_t c) { return x[c] * y[c]; });
  }
}

}  // namespace ms::cpu
