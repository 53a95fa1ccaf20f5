// Token + position embeddings (GPT-2). Backward scatters rows of dout into dwte by token; two positions can
// share a token, so threads never split the (b, t) loop: each thread owns a set of gradient rows and walks
// every position in order. Each dwte and dwpe element is then summed in the same order whatever the thread
// count, with no atomics.
#include <omp.h>

#include <cstddef>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace ms::cpu {
namespace {

// The scatter-add is light work on rows that other positions revisit soon; below about a million elements
// (measured: B 16, T 128, C 256) one thread is faster than two.
constexpr size_t kMinParallelScatter = size_t(1) << 20;

}  // namespace

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
  // Threads own whole gradient rows: row r belongs to thread (r / kRowChunk) % threads. Every thread walks
  // all positions in order and adds only into its own rows, so each row is summed in position order whatever
  // the thread count, and no cache line is written by two threads. Interleaved chunks spread the frequent
  // tokens (which cluster in id ranges) across threads.
  constexpr int kRowChunk = 16;
  const size_t N = size_t(B) * size_t(T);
  const bool par = N * size_t(C) >= kMinParallelScatter;
#pragma omp parallel if (par)
  {
    const int nt = omp_get_num_threads();
    const int tid = omp_get_thread_num();
    auto mine = [&](int row) { return nt == 1 || (row / kRowChunk) % nt == tid; };
    for (size_t n = 0; n < N; n++) {
      const int t = int(n % size_t(T));
      const float* src = dout + n * C;
      if (dwte && mine(tokens[n])) {
        float* dst = dwte + size_t(tokens[n]) * C;
#pragma omp simd
        for (int c = 0; c < C; c++) dst[c] += src[c];
      }
      if (dwpe && mine(t)) {
        float* dst = dwpe + size_t(t) * C;
#pragma omp simd
        for (int c = 0; c < C; c++) dst[c] += src[c];
      }
    }
  }
}

}  // namespace ms::cpu
