// Multi-head scaled dot-product attention (Vaswani et al. 2017, section 3.2.1), one (batch, head) pair per
// OpenMP iteration. The products go to cblas_sgemm on strided views of qkv: inside our parallel region the
// OpenMP build of OpenBLAS runs each call on the calling thread, and with a single (b, h) pair there is no
// region and BLAS threads the call itself.
// With causal masking, rows are processed in blocks of kCausalBlock so that each block only multiplies the
// columns it can see (j < end of block); entries above the diagonal inside a block are written as 0 and so
// drop out of the products exactly.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace ms::cpu {
namespace {

constexpr int kCausalBlock = 64;

// Softmax of row[0, len) in place, zeros in row[len, width).
void softmaxRow(float* row, int len, int width) {
  const float maxv = detail::rowMax(row, len);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < len; j++) {
    const float e = detail::vexp(row[j] - maxv);
    row[j] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int j = 0; j < len; j++) row[j] *= inv;
  for (int j = len; j < width; j++) row[j] = 0.0f;
}

bool parallelOverHeads(int B, int T, int C, int H) {
  return B * H > 1 && size_t(B) * size_t(T) * size_t(T) * size_t(C) >= detail::kMinParallelWork;
}

}  // namespace

void attentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int H, bool causal) {
  // out (B, T, C), att (B, H, T, T), qkv (B, T, 3C)
  if (B <= 0 || T <= 0 || C <= 0 || H <= 0) return;
  const int hs = C / H;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
  const int block = causal ? kCausalBlock : T;
  const size_t TT = size_t(T) * size_t(T);
#pragma omp parallel for collapse(2) schedule(static) if (parallelOverHeads(B, T, C, H))
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < H; h++) {
      const float* q = qkv + size_t(b) * T * C3 + size_t(h) * hs;  // (T, hs), row stride 3C
      const float* k = q + C;                                      // (T, hs), row stride 3C
      const float* v = q + 2 * C;                                  // (T, hs), row stride 3C
      float* a = att + (size_t(b) * H + h) * TT;                   // (T, T)
      float* o = out + size_t(b) * T * C + size_t(h) * hs;         // (T, hs), row stride C
      for (int i0 = 0; i0 < T; i0 += block) {
        const int i1 = std::min(T, i0 + block);
        const int rows = i1 - i0;
        const int cols = causal ? i1 : T;
        // scores[i0:i1, 0:cols] = scale * q[i0:i1] @ k[0:cols]^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, scale, q + size_t(i0) * C3, C3,
                    k, C3, 0.0f, a + size_t(i0) * T, T);
        for (int i = i0; i < i1; i++) softmaxRow(a + size_t(i) * T, causal ? i + 1 : T, T);
        // out[i0:i1] = att[i0:i1, 0:cols] @ v[0:cols]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, cols, 1.0f, a + size_t(i0) * T, T, v,
                    C3, 0.0f, o + size_t(i0) * C, C);
      }
    }
  }
}

void attentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                       int B, int T, int C, int H, bool causal) {
  // dqkv (B, T, 3C), scratch (B, H, T, T), dout (B, T, C), qkv (B, T, 3C), att (B, H, T, T)
  if (B <= 0 || T <= 0 || C <= 0 || H <= 0) return;
  const int hs = C / H;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
  const int block = causal ? kCausalBlock : T;
  const size_t TT = size_t(T) * size_t(T);
#pragma omp parallel for collapse(2) schedule(static) if (parallelOverHeads(B, T, C, H))
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < H; h++) {
      const size_t qOff = size_t(b) * T * C3 + size_t(h) * hs;
      const float* q = qkv + qOff;  // (T, hs), row stride 3C; k and v follow at +C and +2C
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + qOff;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* a = att + (size_t(b) * H + h) * TT;              // (T, T)
      float* d = scratch + (size_t(b) * H + h) * TT;                // (T, T): datt, then dpreatt
      const float* dO = dout + size_t(b) * T * C + size_t(h) * hs;  // (T, hs), row stride C
      for (int i0 = 0; i0 < T; i0 += block) {
        const int i1 = std::min(T, i0 + block);
        const int rows = i1 - i0;
        const int cols = causal ? i1 : T;
        // datt[i0:i1, 0:cols] = dout[i0:i1] @ v[0:cols]^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, 1.0f, dO + size_t(i0) * C, C, v,
                    C3, 0.0f, d + size_t(i0) * T, T);
        // dv[0:cols] += att[i0:i1, 0:cols]^T @ dout[i0:i1]
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hs, rows, 1.0f, a + size_t(i0) * T, T,
                    dO + size_t(i0) * C, C, 1.0f, dv, C3);
        // Softmax backward: dpre = att * (datt - sum_j datt * att).
        for (int i = i0; i < i1; i++) {
          const float* ar = a + size_t(i) * T;
          float* dr = d + size_t(i) * T;
          const int len = causal ? i + 1 : T;
          const float dot = detail::laneSum(len, [&](ptrdiff_t j) { return dr[j] * ar[j]; });
#pragma omp simd
          for (int j = 0; j < len; j++) dr[j] = ar[j] * (dr[j] - dot);
          for (int j = len; j < cols; j++) dr[j] = 0.0f;
        }
        // dq[i0:i1] += scale * dpre[i0:i1, 0:cols] @ k[0:cols]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, cols, scale, d + size_t(i0) * T, T,
                    k, C3, 1.0f, dq + size_t(i0) * C3, C3);
        // dk[0:cols] += scale * dpre[i0:i1, 0:cols]^T @ q[i0:i1]
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hs, rows, scale, d + size_t(i0) * T, T,
                    q + size_t(i0) * C3, C3, 1.0f, dk, C3);
      }
    }
  }
}

}  // namespace ms::cpu
