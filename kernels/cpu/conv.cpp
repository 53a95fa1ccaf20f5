// Convolution and batch normalisation for the convolutional models (issue 19), NCHW.
//
// conv2d: each sample's input is unfolded (im2col: one column per output position, C * KH * KW rows) and
// multiplied by the weight viewed as (OC, C * KH * KW) on OpenBLAS, the formulation of Chellapilla et al.
// 2006, "High Performance Convolutional Neural Networks for Document Processing", and of Caffe. Backward:
// dweight += dout_b @ cols^T, and the columns' gradient weight^T @ dout_b folded back (col2im, summing the
// positions that overlap).
//
// Batch norm (Ioffe and Szegedy 2015, "Batch Normalization", algorithm 1 and the backward in section 3):
// split into the per-channel reductions and the element-wise parts so that synchronised batch norm can
// all-reduce the reductions between them (as PyTorch's SyncBatchNorm all-reduces sums in forward and the two
// gradient sums in backward). Sums are accumulated in double.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace ms::cpu {
namespace {

// cols (C * KH * KW, OH * OW) from one sample's x (C, H, W); positions outside the image are 0.
void im2col(float* cols, const float* x, const Conv2dShape& s) {
  const int OH = s.outH(), OW = s.outW(), P = OH * OW;
#pragma omp parallel for schedule(static) if (s.C * s.KH * s.KW * P >= (1 << 16))
  for (int r = 0; r < s.C * s.KH * s.KW; ++r) {
    const int c = r / (s.KH * s.KW), kh = (r / s.KW) % s.KH, kw = r % s.KW;
    float* row = cols + size_t(r) * P;
    for (int oh = 0; oh < OH; ++oh) {
      const int h = oh * s.stride - s.pad + kh;
      for (int ow = 0; ow < OW; ++ow) {
        const int w = ow * s.stride - s.pad + kw;
        row[oh * OW + ow] =
            (h >= 0 && h < s.H && w >= 0 && w < s.W) ? x[(size_t(c) * s.H + h) * s.W + w] : 0.0f;
      }
    }
  }
}

// dx (C, H, W) += the columns' gradient folded back. Parallel over channels: each channel's rows write only
// that channel's plane.
void col2imAdd(float* dx, const float* dcols, const Conv2dShape& s) {
  const int OH = s.outH(), OW = s.outW(), P = OH * OW;
#pragma omp parallel for schedule(static) if (s.C * s.KH * s.KW * P >= (1 << 16))
  for (int c = 0; c < s.C; ++c)
    for (int kh = 0; kh < s.KH; ++kh)
      for (int kw = 0; kw < s.KW; ++kw) {
        const float* row = dcols + (size_t(c) * s.KH * s.KW + size_t(kh) * s.KW + kw) * P;
        for (int oh = 0; oh < OH; ++oh) {
          const int h = oh * s.stride - s.pad + kh;
          if (h < 0 || h >= s.H) continue;
          for (int ow = 0; ow < OW; ++ow) {
            const int w = ow * s.stride - s.pad + kw;
            if (w >= 0 && w < s.W) dx[(size_t(c) * s.H + h) * s.W + w] += row[oh * OW + ow];
          }
        }
      }
}

}  // namespace

void conv2dForward(float* out, const float* inp, const float* weight, const float* bias,
                   const Conv2dShape& s) {
  const int OH = s.outH(), OW = s.outW(), P = OH * OW, K = s.C * s.KH * s.KW;
  std::vector<float> cols(size_t(K) * P);
  for (int b = 0; b < s.B; ++b) {
    im2col(cols.data(), inp + size_t(b) * s.C * s.H * s.W, s);
    float* o = out + size_t(b) * s.OC * P;
    // o (OC, P) = weight (OC, K) @ cols (K, P) [+ bias broadcast over P]
    if (bias)
      for (int oc = 0; oc < s.OC; ++oc) std::fill(o + size_t(oc) * P, o + size_t(oc + 1) * P, bias[oc]);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.OC, P, K, 1.0f, weight, K, cols.data(), P,
                bias ? 1.0f : 0.0f, o, P);
  }
}

void conv2dBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, const Conv2dShape& s) {
  const int OH = s.outH(), OW = s.outW(), P = OH * OW, K = s.C * s.KH * s.KW;
  std::vector<float> cols(dweight ? size_t(K) * P : 0), dcols(dinp ? size_t(K) * P : 0);
  for (int b = 0; b < s.B; ++b) {
    const float* g = dout + size_t(b) * s.OC * P;
    if (dweight) {
      im2col(cols.data(), inp + size_t(b) * s.C * s.H * s.W, s);
      // dweight (OC, K) += g (OC, P) @ cols^T (P, K)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.OC, K, P, 1.0f, g, P, cols.data(), P, 1.0f,
                  dweight, K);
    }
    if (dinp) {
      // dcols (K, P) = weight^T (K, OC) @ g (OC, P)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, P, s.OC, 1.0f, weight, K, g, P, 0.0f,
                  dcols.data(), P);
      col2imAdd(dinp + size_t(b) * s.C * s.H * s.W, dcols.data(), s);
    }
    if (dbias)
      for (int oc = 0; oc < s.OC; ++oc) {
        double sum = 0;
        for (int p = 0; p < P; ++p) sum += g[size_t(oc) * P + p];
        dbias[oc] += float(sum);
      }
  }
}

// ---- batch norm ------------------------------------------------------------------------------------------

void batchNormStats(double* sum, double* sumSq, const float* x, int B, int C, int S) {
#pragma omp parallel for schedule(static) if (size_t(B) * C * S >= (size_t(1) << 16))
  for (int c = 0; c < C; ++c) {
    double s1 = 0, s2 = 0;
    for (int b = 0; b < B; ++b) {
      const float* p = x + (size_t(b) * C + c) * S;
      for (int i = 0; i < S; ++i) {
        s1 += p[i];
        s2 += double(p[i]) * p[i];
      }
    }
    sum[c] = s1;
    sumSq[c] = s2;
  }
}

void batchNormMoments(float* mean, float* rstd, double* var, const double* sum, const double* sumSq,
                      double count, int C, float eps) {
  for (int c = 0; c < C; ++c) {
    const double m = sum[c] / count;
    const double v = std::max(0.0, sumSq[c] / count - m * m);  // biased: the batch's own variance
    mean[c] = float(m);
    rstd[c] = float(1.0 / std::sqrt(v + double(eps)));
    if (var) var[c] = v;
  }
}

void batchNormUpdateRunning(float* runningMean, float* runningVar, const float* mean, const double* var,
                            double count, int C, float momentum) {
  // PyTorch's convention: running = (1 - momentum) running + momentum batch, the variance unbiased.
  const double unbias = count > 1 ? count / (count - 1) : 1.0;
  for (int c = 0; c < C; ++c) {
    runningMean[c] = float((1.0 - momentum) * runningMean[c] + double(momentum) * mean[c]);
    runningVar[c] = float((1.0 - momentum) * runningVar[c] + double(momentum) * var[c] * unbias);
  }
}

void batchNormApply(float* out, const float* x, const float* mean, const float* rstd, const float* weight,
                    const float* bias, int B, int C, int S) {
#pragma omp parallel for collapse(2) schedule(static) if (size_t(B) * C * S >= (size_t(1) << 16))
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c) {
      const float scale = rstd[c] * (weight ? weight[c] : 1.0f), shift = bias ? bias[c] : 0.0f, m = mean[c];
      const float* p = x + (size_t(b) * C + c) * S;
      float* o = out + (size_t(b) * C + c) * S;
      for (int i = 0; i < S; ++i) o[i] = (p[i] - m) * scale + shift;
    }
}

void batchNormGradStats(double* sumDy, double* sumDyXhat, const float* dout, const float* x,
                        const float* mean, const float* rstd, int B, int C, int S) {
#pragma omp parallel for schedule(static) if (size_t(B) * C * S >= (size_t(1) << 16))
  for (int c = 0; c < C; ++c) {
    double s1 = 0, s2 = 0;
    for (int b = 0; b < B; ++b) {
      const float* g = dout + (size_t(b) * C + c) * S;
      const float* p = x + (size_t(b) * C + c) * S;
      for (int i = 0; i < S; ++i) {
        s1 += g[i];
        s2 += double(g[i]) * (double(p[i]) - mean[c]) * rstd[c];
      }
    }
    sumDy[c] = s1;
    sumDyXhat[c] = s2;
  }
}

void batchNormBackwardApply(float* dinp, float* dweight, float* dbias, const float* dout, const float* x,
                            const float* mean, const float* rstd, const float* weight, const double* sumDy,
                            const double* sumDyXhat, const double* localSumDy, const double* localSumDyXhat,
                            double count, int B, int C, int S) {
  // dx = gamma rstd / n (n dy - sum dy - xhat sum(dy xhat)), the sums over the (global) batch of count
  // elements per channel; dgamma += sum(dy xhat), dbeta += sum(dy) over this rank's elements (the parameter
  // gradients are all-reduced with the others by data parallelism).
  if (dweight)
    for (int c = 0; c < C; ++c) dweight[c] += float(localSumDyXhat[c]);
  if (dbias)
    for (int c = 0; c < C; ++c) dbias[c] += float(localSumDy[c]);
  if (!dinp) return;
#pragma omp parallel for collapse(2) schedule(static) if (size_t(B) * C * S >= (size_t(1) << 16))
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c) {
      const double k = double(rstd[c]) * (weight ? weight[c] : 1.0) / count;
      const double a = sumDy[c], q = sumDyXhat[c];
      const float* g = dout + (size_t(b) * C + c) * S;
      const float* p = x + (size_t(b) * C + c) * S;
      float* d = dinp + (size_t(b) * C + c) * S;
      for (int i = 0; i < S; ++i) {
        const double xhat = (double(p[i]) - mean[c]) * rstd[c];
        d[i] += float(k * (count * g[i] - a - xhat * q));
      }
    }
}

}  // namespace ms::cpu
