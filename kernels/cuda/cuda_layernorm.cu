// LayerNorm over the last dimension (Ba, Kiros & Hinton 2016), the formulas of kernels/cpu/layernorm.cpp.
// Forward and the input gradient give one warp to each row (lane-strided, so any C works); the variance is
// the centred second sweep over the row, as on the CPU. The weight and bias gradients are a second,
// deterministic pass without atomics: blocks of 32 columns sum slices of the rows into scratch, and a last
// kernel adds the slices in order into dweight/dbias (one block per 32 columns over all rows left most of
// an H200 idle: 235 us a call on GPT-2 124M, 10% of a bf16 step).
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

// The weight and bias gradients in two deterministic stages (columnSumAccumulate's cut, cuda_blas.cu):
// block (bx, s) sums rows [s * rows, (s + 1) * rows) of its 32 columns, norm[n, c] * dout[n, c] into
// partial[s * C + c] and dout[n, c] into partial[(slices + s) * C + c]; blockDim (32, kParamRows).
__global__ void layerNormParamsPartialKernel(float* partial, const float* dout, const float* inp,
                                             const float* mean, const float* rstd, int N, int C, int rows) {
  __shared__ float pw[kParamRows][kWarpSize + 1];
  __shared__ float pb[kParamRows][kWarpSize + 1];
  const int c = blockIdx.x * kWarpSize + threadIdx.x;
  const int first = blockIdx.y * rows;
  const int last = min(N, first + rows);
  float sw = 0.0f, sb = 0.0f;
  if (c < C) {
    for (int n = first + threadIdx.y; n < last; n += kParamRows) {
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
    partial[size_t(blockIdx.y) * C + c] = tw;
    partial[size_t(gridDim.y + blockIdx.y) * C + c] = tb;
  }
}

// Stage 2: dweight[c] += the slices' weight sums, dbias[c] += their bias sums, in slice order.
__global__ void layerNormParamsFinishKernel(float* dweight, float* dbias, const float* partial, int C,
                                            int slices) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float tw = 0.0f, tb = 0.0f;
  for (int s = 0; s < slices; ++s) {
    tw += partial[size_t(s) * C + c];
    tb += partial[size_t(slices + s) * C + c];
  }
  if (dweight) dweight[c] += tw;
  if (dbias) dbias[c] += tb;
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
  const char* what = "layerNormBackward: dweight, dbias";
  const int slices = detail::columnSlices(N, C);
  const int rows = (N + slices - 1) / slices;
  const Expected<float*> partial = detail::reductionScratch(2 * size_t(slices) * C, stream, what);
  if (!partial) return partial.status();
  const dim3 block(kWarpSize, kParamRows);
  const dim3 grid(unsigned((C + kWarpSize - 1) / kWarpSize), unsigned(slices));
  layerNormParamsPartialKernel<<<grid, block, 0, stream>>>(*partial, dout, inp, mean, rstd, N, C, rows);
  MS_TRY(checkLaunch(what));
  layerNormParamsFinishKernel<<<detail::gridFor(size_t(C)), detail::kBlockSize, 0, stream>>>(
      dweight, dbias, *partial, C, slices);
  return checkLaunch(what);
}

}  // namespace ms::cuda
