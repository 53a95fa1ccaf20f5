// Token + position embeddings (GPT-2). Backward scatters rows of dout into dwte by token; two positions can
// share a token, so threads never split the (b, t) loop: each thread owns a slice of the channels and walks
// every position in order. Each dwte and dwpe element is then summed in the same order whatever the thread
// count, with no atomics.
#include <omp.h>

#include <cstddef>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace ms::cpu {

void embeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                      int C) {
  // out (B, T, C), tokens (B, T), wte (V, C), wpe (maxT, C)
  const int N = B * T;
  const bool par = size_t(N) * size_t(C) >= detail::kMinParallelWork;
#pragma omp parallel for schedule(static) if (par)
  for (int n = 0; n < N; n++) {
    const float* te = wte + size_t(tokens[n]) * C;
    const float* pe = wpe + size_t(n % T) * C;
    float* o = out + size_t(n) * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = te[c] + pe[c];
  }
}

void embeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                       int C) {
  // dwte (V, C), dwpe (maxT, C), dout (B, T, C), tokens (B, T)
  if (B <= 0 || T <= 0 || C <= 0 || (!dwte && !dwpe)) return;
  const bool par = size_t(B) * size_t(T) * size_t(C) >= detail::kMinParallelWork;
#pragma omp parallel if (par)
  {
    // One pass over dout feeds both gradients. The channel split is per destination row, on cache lines.
    const detail::LineAlignedSplit split(C, omp_get_thread_num(), omp_get_num_threads());
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T; t++) {
        const size_t n = size_t(b) * T + t;
        const float* src = dout + n * C;
        int c0 = 0, c1 = 0;
        if (dwte) {
          float* dst = dwte + size_t(tokens[n]) * C;
          split.range(dst, c0, c1);
#pragma omp simd
          for (int c = c0; c < c1; c++) dst[c] += src[c];
        }
        if (dwpe) {
          float* dst = dwpe + size_t(t) * C;
          split.range(dst, c0, c1);
#pragma omp simd
          for (int c = c0; c < c1; c++) dst[c] += src[c];
        }
      }
    }
  }
}

}  // namespace ms::cpu
