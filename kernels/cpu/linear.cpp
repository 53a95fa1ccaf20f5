// Linear layers: the GEMMs go to OpenBLAS (row-major cblas_sgemm); only the bias broadcast and the bias
// gradient (a column sum) are ours. Backward accumulates (beta = 1) into every gradient it writes.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace ms::cpu {
namespace {

// out (N, OC) = bias broadcast over rows.
void broadcastBias(float* out, const float* bias, int N, int OC) {
  const bool par = size_t(N) * size_t(OC) >= detail::kMinParallelWork;
#pragma omp parallel for schedule(static) if (par)
  for (int n = 0; n < N; n++) std::memcpy(out + size_t(n) * OC, bias, sizeof(float) * size_t(OC));
}

// dbias (OC) += sum_n dout (N, OC). Threads own blocks of columns; each column is summed over the rows in
// order into a local accumulator, so the result does not depend on the thread count.
void biasGradient(float* dbias, const float* dout, int N, int OC) {
  constexpr int kBlock = 64;
  const int blocks = (OC + kBlock - 1) / kBlock;
  const bool par = size_t(N) * size_t(OC) >= detail::kMinParallelWork && blocks > 1;
#pragma omp parallel for schedule(static) if (par)
  for (int blk = 0; blk < blocks; blk++) {
    const int o0 = blk * kBlock;
    const int width = std::min(kBlock, OC - o0);
    float acc[kBlock] = {};
    for (int n = 0; n < N; n++) {
      const float* row = dout + size_t(n) * OC + o0;
#pragma omp simd
      for (int j = 0; j < width; j++) acc[j] += row[j];
    }
    for (int j = 0; j < width; j++) dbias[o0 + j] += acc[j];
  }
}

}  // namespace

void linearForward(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                   int OC) {
  // out (N, OC), inp (N, C), weight (C, OC), bias (OC)
  if (N <= 0 || OC <= 0) return;
  if (bias) broadcastBias(out, bias, N, OC);
  if (C <= 0) {  // an empty sum: BLAS rejects a leading dimension of 0
    if (!bias) std::memset(out, 0, sizeof(float) * size_t(N) * size_t(OC));
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, inp, C, weight, OC,
              bias ? 1.0f : 0.0f, out, OC);
}

void linearBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int N, int C, int OC) {
  // dinp (N, C), dweight (C, OC), dbias (OC), dout (N, OC), inp (N, C), weight (C, OC)
  if (N <= 0 || C <= 0 || OC <= 0) return;
  if (dinp)  // dinp += dout @ weight^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC, 1.0f, dout, OC, weight, OC, 1.0f, dinp, C);
  if (dweight)  // dweight += inp^T @ dout
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight, OC);
  if (dbias) biasGradient(dbias, dout, N, OC);
}

void linearForwardT(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                    int OC) {
  // out (N, OC), inp (N, C), weight (OC, C), bias (OC)
  if (N <= 0 || OC <= 0) return;
  if (bias) broadcastBias(out, bias, N, OC);
  if (C <= 0) {  // an empty sum: BLAS rejects a leading dimension of 0
    if (!bias) std::memset(out, 0, sizeof(float) * size_t(N) * size_t(OC));
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, bias ? 1.0f : 0.0f,
              out, OC);
}

void linearBackwardT(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  // dinp (N, C), dweight (OC, C), dbias (OC), dout (N, OC), inp (N, C), weight (OC, C)
  if (N <= 0 || C <= 0 || OC <= 0) return;
  if (dinp)  // dinp += dout @ weight
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp,
                C);
  if (dweight)  // dweight += dout^T @ inp
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias) biasGradient(dbias, dout, N, OC);
}

}  // namespace ms::cpu
