// LayerNorm over the last dimension (Ba, Kiros & Hinton 2016), the formulas of kernels/cpu/layernorm.cpp.
// Forward and the input gradient give one warp to each row (lane-strided, so any C works); the variance is
// the centred second sweep over the row, as on the CPU. The weight and bias gradients are a second,
// deterministic pass: one block per 32 columns sums over all rows (no atomics), then adds into dweight/dbias.
#include "kernels/cuda/cuda_common.cuh"

namespace ms::cuda {
namespace {

using detail::kWarpSize;
using detail::warpSum;

constexpr int kRowsPerBlock = detail::kBlockSize / kWarpSize;
constexpr int kParamRows = 8;  // blockDim.y of the parameter-gradient pass

__global__ void layerNormForwardKernel(float* out, float* mean, float* rstd, const float* inp,
                                       const float* weight, const float* bias, int N, int C, float eps) {
  const int lane = threadIdx.x % kWarpSize;
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (n >= N) return;  // whole warp
  const float* x = inp + size_t(n) * C;
  float* y = out + size_t(n) * C;
  float sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) sum += x[c];
  const float m = warpSum(sum) / float(C);
  float sq = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float d = x[c] - m;
    sq += d * d;
  }
  const float s = 1.0f / sqrtf(warpSum(sq) / float(C) + eps);
  for (int c = lane; c < C; c += kWarpSize) y[c] = (x[c] - m) * s * weight[c] + bias[c];
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = s;
  }
}

__global__ void layerNormBackwardInputKernel(float* dinp, const float* dout, const float* inp,
                                             const float* weight, const float* mean, const float* rstd, int N,
                                             int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (n >= N) return;
  const float* x = inp + size_t(n) * C;
  const float* dy = dout + size_t(n) * C;
  float* dx = dinp + size_t(n) * C;
  const float m = mean[n];
  const float s = rstd[n];
  // dnorm = weight * dout; its mean and its projection on norm are what the normalisation removes.
  float a = 0.0f, b = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float dn = weight[c] * dy[c];
    a += dn;
    b += dn * ((x[c] - m) * s);
  }
  const float dnormMean = warpSum(a) / float(C);
  const float dnormNormMean = warpSum(b) / float(C);
  for (int c = lane; c < C; c += kWarpSize) {
    const float norm = (x[c] - m) * s;
    dx[c] += (weight[c] * dy[c] - dnormMean - norm * dnormNormMean) * s;
  }
}

// dweight[c] += sum_n norm[n, c] * dout[n, c]; dbias[c] += sum_n dout[n, c]. blockDim (32, kParamRows).
__global__ void layerNormBackwardParamsKernel(float* dweight, float* dbias, const float* dout,
                                              const float* inp, const float* mean, const float* rstd, int N,
                                              int C) {
  __shared__ float pw[kParamRows][kWarpSize + 1];
  __shared__ float pb[kParamRows][kWarpSize + 1];
  const int c = blockIdx.x * kWarpSize + threadIdx.x;
  float sw = 0.0f, sb = 0.0f;
  if (c < C) {
    for (int n = threadIdx.y; n < N; n += kParamRows) {
      const size_t i = size_t(n) * C + c;
      const float dy = dout[i];
      sw += (inp[i] - mean[n]) * rstd[n] * dy;
      sb += dy;
    }
  }
  pw[threadIdx.y][threadIdx.x] = sw;
  pb[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tw = 0.0f, tb = 0.0f;
    for (int r = 0; r < kParamRows; r++) {
      tw += pw[r][threadIdx.x];
      tb += pb[r][threadIdx.x];
    }
    if (dweight) dweight[c] += tw;
    if (dbias) dbias[c] += tb;
  }
}

unsigned rowBlocks(int N) {
  return unsigned((N + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

Status layerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int N, int C, float eps, cudaStream_t stream) {
  // out (N, C), mean (N), rstd (N), inp (N, C), weight (C), bias (C)
  if (N <= 0 || C <= 0) return Status::ok();
  layerNormForwardKernel<<<rowBlocks(N), detail::kBlockSize, 0, stream>>>(out, mean, rstd, inp, weight, bias,
                                                                          N, C, eps);
  return checkLaunch("layerNormForward");
}

Status layerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                         const float* weight, const float* mean, const float* rstd, int N, int C,
                         cudaStream_t stream) {
  // dinp (N, C), dweight (C), dbias (C), dout (N, C), inp (N, C), weight (C), mean (N), rstd (N)
  if (N <= 0 || C <= 0) return Status::ok();
  layerNormBackwardInputKernel<<<rowBlocks(N), detail::kBlockSize, 0, stream>>>(dinp, dout, inp, weight, mean,
                                                                                rstd, N, C);
  MS_TRY(checkLaunch("layerNormBackward: dinp"));
  if (!dweight && !dbias) return Status::ok();
  const dim3 block(kWarpSize, kParamRows);
  const unsigned grid = unsigned((C + kWarpSize - 1) / kWarpSize);
  layerNormBackwardParamsKernel<<<grid, block, 0, stream>>>(dweight, dbias, dout, inp, mean, rstd, N, C);
  return checkLaunch("layerNormBackward: dweight, dbias");
}

}  // namespace ms::cuda
