// Token + position embeddings (GPT-2). Backward scatters rows of dout into dwte by token; two positions can
// share a token, so threads never split the (b, t) loop: each thread owns a slice of the channels and walks
// every position in order. Each dwte element is then summed in the same order whatever the thread count,
// with no atomics.
#include <omp.h>

#include <algorithm>
#include <cstddef>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec_math.h"

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

void embeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) {
  // dwte (V, C), dwpe (maxT, C), dout (B, T, C), tokens (B, T)
  if (B <= 0 || T <= 0 || C <= 0) return;
  const size_t N = size_t(B) * size_t(T);
  const bool par = N * size_t(C) >= detail::kMinParallelWork;
#pragma omp parallel if (par)
  {
    if (dwte) {
      // Channel slices rounded to 16 floats (a 64-byte line) so two threads never write the same line.
      const int nt = omp_get_num_threads();
      const int tid = omp_get_thread_num();
      const int slice = ((C + nt - 1) / nt + 15) / 16 * 16;
      const int c0 = std::min(C, tid * slice);
      const int c1 = std::min(C, c0 + slice);
      for (size_t n = 0; n < N && c0 < c1; n++) {
        float* dst = dwte + size_t(tokens[n]) * C;
        const float* src = dout + n * C;
#pragma omp simd
        for (int c = c0; c < c1; c++) dst[c] += src[c];
      }
    }
    if (dwpe) {
      // dwpe[t] is owned by one thread and summed over b in order.
#pragma omp for schedule(static)
      for (int t = 0; t < T; t++) {
        float* dst = dwpe + size_t(t) * C;
        for (int b = 0; b < B; b++) {
          const float* src = dout + (size_t(b) * T + t) * C;
#pragma omp simd
          for (int c = 0; c < C; c++) dst[c] += src[c];
        }
      }
    }
  }
}

}  // namespace ms::cpu
