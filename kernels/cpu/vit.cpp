// Vision-transformer plumbing: patch extraction, class token + position embedding, and pooling. Pure data
// movement and small sums, parallel over rows; reductions over the batch are owned by one thread per output
// row and summed in batch order.
#include <cstddef>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace ms::cpu {

void patchify(float* patches, const float* images, int B, int S, int P) {
  // patches (B, NP, P*P), images (B, S, S)
  const int G = S / P;  // patches per side
  const int NP = G * G;
  const bool par = size_t(B) * size_t(S) * size_t(S) >= detail::kMinParallelWork;
#pragma omp parallel for collapse(2) schedule(static) if (par)
  for (int b = 0; b < B; b++) {
    for (int p = 0; p < NP; p++) {
      const int pr = p / G, pc = p % G;
      float* dst = patches + (size_t(b) * NP + p) * P * P;
      const float* src = images + size_t(b) * S * S + size_t(pr) * P * S + size_t(pc) * P;
      for (int i = 0; i < P; i++)
        std::memcpy(dst + size_t(i) * P, src + size_t(i) * S, sizeof(float) * size_t(P));
    }
  }
}

void tokensForward(float* out, const float* x, const float* clsToken, const float* pos, int B, int NP, int C,
                   bool cls) {
  // out (B, T, C), x (B, NP, C), clsToken (C), pos (T, C); T = NP + cls
  const int off = cls ? 1 : 0;
  const int T = NP + off;
  const bool par = size_t(B) * size_t(T) * size_t(C) >= detail::kMinParallelWork;
#pragma omp parallel for collapse(2) schedule(static) if (par)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      const float* src = t < off ? clsToken : x + (size_t(b) * NP + (t - off)) * C;
      const float* pe = pos + size_t(t) * C;
      float* o = out + (size_t(b) * T + t) * C;
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] = src[c] + pe[c];
    }
  }
}

void tokensBackward(float* dx, float* dcls, float* dpos, const float* dout, int B, int NP, int C, bool cls) {
  // dx (B, NP, C), dcls (C), dpos (T, C), dout (B, T, C); T = NP + cls
  const int off = cls ? 1 : 0;
  const int T = NP + off;
  const bool par = size_t(B) * size_t(T) * size_t(C) >= detail::kMinParallelWork;
#pragma omp parallel if (par)
  {
    if (dx) {
#pragma omp for collapse(2) schedule(static) nowait
      for (int b = 0; b < B; b++) {
        for (int i = 0; i < NP; i++) {
          float* d = dx + (size_t(b) * NP + i) * C;
          const float* g = dout + (size_t(b) * T + off + i) * C;
#pragma omp simd
          for (int c = 0; c < C; c++) d[c] += g[c];
        }
      }
    }
    if (dpos) {
#pragma omp for schedule(static) nowait
      for (int t = 0; t < T; t++) {
        float* d = dpos + size_t(t) * C;
        for (int b = 0; b < B; b++) {
          const float* g = dout + (size_t(b) * T + t) * C;
#pragma omp simd
          for (int c = 0; c < C; c++) d[c] += g[c];
        }
      }
    }
  }
  if (cls && dcls) {
    for (int b = 0; b < B; b++) {
      const float* g = dout + size_t(b) * T * C;
#pragma omp simd
      for (int c = 0; c < C; c++) dcls[c] += g[c];
    }
  }
}

void poolForward(float* out, const float* inp, int B, int T, int C, bool useFirst) {
  // out (B, C), inp (B, T, C)
  const bool par = size_t(B) * size_t(T) * size_t(C) >= detail::kMinParallelWork;
  const float invT = 1.0f / float(T);
#pragma omp parallel for schedule(static) if (par)
  for (int b = 0; b < B; b++) {
    const float* src = inp + size_t(b) * T * C;
    float* o = out + size_t(b) * C;
    if (useFirst) {
      std::memcpy(o, src, sizeof(float) * size_t(C));
      continue;
    }
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = 0.0f;
    for (int t = 0; t < T; t++) {
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] += src[size_t(t) * C + c];
    }
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] *= invT;
  }
}

void poolBackward(float* dinp, const float* dout, int B, int T, int C, bool useFirst) {
  // dinp (B, T, C), dout (B, C)
  const bool par = size_t(B) * size_t(T) * size_t(C) >= detail::kMinParallelWork;
  const float invT = 1.0f / float(T);
#pragma omp parallel for collapse(2) schedule(static) if (par)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      if (useFirst && t > 0) continue;
      const float* g = dout + size_t(b) * C;
      float* d = dinp + (size_t(b) * T + t) * C;
      const float w = useFirst ? 1.0f : invT;
#pragma omp simd
      for (int c = 0; c < C; c++) d[c] += g[c] * w;
    }
  }
}

}  // namespace ms::cpu
