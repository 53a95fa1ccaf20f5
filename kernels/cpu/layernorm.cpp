// LayerNorm over the last dimension (Ba, Kiros & Hinton 2016), forward and backward as llm.c writes them
// (karpathy/llm.c, train_gpt2.c: layernorm_forward / layernorm_backward). Rows are independent and split
// across threads; each row is read from memory once and revisited from cache.
// The parameter gradients sum over rows: each thread sums its own contiguous block of rows into a private
// partial, then the partials are added in thread order, so a run is bit-reproducible for a given thread count
// (no atomics, static schedule).
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace ms::cpu {

void layerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C, float eps) {
  // out (N, C), mean (N), rstd (N), inp (N, C), weight (C), bias (C)
  if (N <= 0 || C <= 0) return;
  const float invC = 1.0f / float(C);
  const bool par = size_t(N) * size_t(C) >= detail::kMinParallelWork;
#pragma omp parallel for schedule(static) if (par)
  for (int n = 0; n < N; n++) {
    const float* x = inp + size_t(n) * C;
    float* y = out + size_t(n) * C;
    const float m = detail::laneSum(C, [&](ptrdiff_t c) { return x[c]; }) * invC;
    // Second sweep over the cached row: the centred sum of squares, exact where E[x^2] - m^2 would cancel.
    const float sq = detail::laneSum(C, [&](ptrdiff_t c) {
      const float d = x[c] - m;
      return d * d;
    });
    const float s = 1.0f / std::sqrt(sq * invC + eps);
#pragma omp simd
    for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void layerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, const float* mean, const float* rstd, int N, int C) {
  // dinp (N, C), dweight (C), dbias (C), dout (N, C), inp (N, C), weight (C), mean (N), rstd (N)
  if (N <= 0 || C <= 0) return;
  const float invC = 1.0f / float(C);
  const bool params = dweight || dbias;
  const bool par = size_t(N) * size_t(C) >= detail::kMinParallelWork;
  // Per-thread partials of dweight and dbias: (threads, 2, C), each thread's block starting on its own
  // 64-byte line (threads write theirs on every row). One allocation per call, O(threads * C).
  const size_t stride = (2 * size_t(C) + 15) / 16 * 16;
  std::vector<float> storage(params ? size_t(par ? detail::maxThreads() : 1) * stride + 16 : 0);
  float* partial =
      storage.data() + (16 - (reinterpret_cast<uintptr_t>(storage.data()) / sizeof(float)) % 16) % 16;
#pragma omp parallel if (par)
  {
    const int nt = omp_get_num_threads();
    const int tid = omp_get_thread_num();
    size_t begin = 0, end = 0;
    detail::splitRange(size_t(N), tid, nt, begin, end);
    float* pw = params ? partial + size_t(tid) * stride : nullptr;  // (C)
    float* pb = params ? pw + C : nullptr;                          // (C)
    if (params)
      for (int c = 0; c < 2 * C; c++) pw[c] = 0.0f;
    for (size_t n = begin; n < end; n++) {
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      float* dx = dinp + n * C;
      const float m = mean[n];
      const float s = rstd[n];
      // dnorm = weight * dout; the two row means are the projections removed by the normalisation.
      const float dnormMean = detail::laneSum(C, [&](ptrdiff_t c) { return weight[c] * dy[c]; }) * invC;
      const float dnormNormMean =
          detail::laneSum(C, [&](ptrdiff_t c) { return weight[c] * dy[c] * ((x[c] - m) * s); }) * invC;
      if (params) {
#pragma omp simd
        for (int c = 0; c < C; c++) {
          const float norm = (x[c] - m) * s;
          dx[c] += (weight[c] * dy[c] - dnormMean - norm * dnormNormMean) * s;
          pw[c] += norm * dy[c];
          pb[c] += dy[c];
        }
      } else {
#pragma omp simd
        for (int c = 0; c < C; c++) {
          const float norm = (x[c] - m) * s;
          dx[c] += (weight[c] * dy[c] - dnormMean - norm * dnormNormMean) * s;
        }
      }
    }
    if (params) {
#pragma omp barrier
#pragma omp for schedule(static)
      for (int c = 0; c < C; c++) {
        float sw = 0.0f, sb = 0.0f;
        for (int t = 0; t < nt; t++) {
          sw += partial[size_t(t) * stride + c];
          sb += partial[size_t(t) * stride + C + c];
        }
        if (dweight) dweight[c] += sw;
        if (dbias) dbias[c] += sb;
      }
    }
  }
}

}  // namespace ms::cpu
