// The pieces the tensor-parallel layers compose with collectives: bias rows, position embeddings, the
// vocabulary-parallel embedding and cross-entropy (Shoeybi et al. 2019, "Megatron-LM", section 3). Row loops
// in a fixed order, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace ms::cpu {

void addRows(float* x, const float* row, size_t rows, int C) {
  const bool par = rows * size_t(C) >= detail::kMinParallelWork;
#pragma omp parallel for schedule(static) if (par)
  for (size_t n = 0; n < rows; ++n) {
    float* y = x + n * size_t(C);
#pragma omp simd
    for (int c = 0; c < C; ++c) y[c] += row[c];
  }
}

void addPositions(float* y, const float* wpe, int B, int T, int C) {
  const int N = B * T;
  const bool par = size_t(N) * size_t(C) >= detail::kMinParallelWork;
#pragma omp parallel for schedule(static) if (par)
  for (int n = 0; n < N; ++n) {
    float* o = y + size_t(n) * C;
    const float* p = wpe + size_t(n % T) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] += p[c];
  }
}

void embeddingRangeForward(float* out, const int32_t* tokens, const float* wte, int vocabStart,
                           int vocabCount, int N, int C) {
  const bool par = size_t(N) * size_t(C) >= detail::kMinParallelWork;
#pragma omp parallel for schedule(static) if (par)
  for (int n = 0; n < N; ++n) {
    float* o = out + size_t(n) * C;
    const int local = tokens[n] - vocabStart;
    if (local >= 0 && local < vocabCount)
      std::memcpy(o, wte + size_t(local) * C, sizeof(float) * size_t(C));
    else
      std::memset(o, 0, sizeof(float) * size_t(C));
  }
}

void embeddingRangeBackward(float* dwte, const float* dout, const int32_t* tokens, int vocabStart,
                            int vocabCount, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const int local = tokens[n] - vocabStart;
    if (local < 0 || local >= vocabCount) continue;
    float* d = dwte + size_t(local) * C;
    const float* g = dout + size_t(n) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) d[c] += g[c];
  }
}

void rowMax(float* mx, const float* logits, int N, int V) {
  const bool par = size_t(N) * size_t(V) >= detail::kMinParallelWork;
#pragma omp parallel for schedule(static) if (par)
  for (int n = 0; n < N; ++n) {
    const float* x = logits + size_t(n) * V;
    float m = x[0];
    for (int j = 1; j < V; ++j) m = std::max(m, x[j]);
    mx[n] = m;
  }
}

void crossEntropyPartials(float* sumExp, float* targetLogit, const float* logits, const float* mx,
                          const int32_t* targets, int vocabStart, int N, int V) {
  const bool par = size_t(N) * size_t(V) >= detail::kMinParallelWork;
#pragma omp parallel for schedule(static) if (par)
  for (int n = 0; n < N; ++n) {
    const float* x = logits + size_t(n) * V;
    const int t = targets[n] - vocabStart;
    targetLogit[n] = targets[n] >= 0 && t >= 0 && t < V ? x[t] : 0.0f;
    float s = 0.0f;
    for (int j = 0; j < V; ++j) s += std::exp(x[j] - mx[n]);
    sumExp[n] = s;
  }
}

void crossEntropyFinish(float* losses, float* dlogits, const float* logits, const float* mx,
                        const float* sumExp, const float* targetLogit, const int32_t* targets, int vocabStart,
                        int N, int V, float gradScale) {
  const bool par = size_t(N) * size_t(V) >= detail::kMinParallelWork;
#pragma omp parallel for schedule(static) if (par)
  for (int n = 0; n < N; ++n) {
    const float* x = logits + size_t(n) * V;
    float* d = dlogits ? dlogits + size_t(n) * V : nullptr;
    if (targets[n] < 0) {
      losses[n] = 0.0f;
      if (d) std::memset(d, 0, sizeof(float) * size_t(V));
      continue;
    }
    losses[n] = std::log(sumExp[n]) - (targetLogit[n] - mx[n]);
    if (!d) continue;
    const float s = gradScale / sumExp[n];
    for (int j = 0; j < V; ++j) d[j] = std::exp(x[j] - mx[n]) * s;
    const int t = targets[n] - vocabStart;
    if (t >= 0 && t < V) d[t] -= gradScale;
  }
}

}  // namespace ms::cpu
