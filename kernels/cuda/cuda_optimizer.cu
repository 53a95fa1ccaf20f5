// Optimizer updates and the squared-norm reduction over flat buffers. The per-element math is
// kernels/optimizer_math.h, shared with the CPU loops; its per-step scalars are computed in double on the
// host. sumSquares adds per-block double partials with atomicAdd: its last bits depend on block order.
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/optimizer_math.h"

namespace ms::cuda {
namespace {

__global__ void adamwKernel(float* params, const float* grads, float* m, float* v, size_t n,
                            optim::AdamwScalars s, float gradScale) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    optim::adamwElement(params[i], m[i], v[i], grads[i] * gradScale, s);
}

__global__ void sgdKernel(float* params, const float* grads, float* buf, size_t n, float lr, float momentum,
                          float weightDecay, bool nesterov, bool firstStep, float gradScale) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    optim::sgdElement(params[i], buf ? buf + i : nullptr, grads[i] * gradScale, lr, momentum, weightDecay,
                      nesterov, firstStep);
}

__global__ void sumSquaresKernel(double* result, const float* x, size_t n) {
  __shared__ double shared[detail::kWarpSize];
  double sum = 0.0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    sum += double(x[i]) * double(x[i]);
  sum = detail::blockSum(sum, shared);
  if (threadIdx.x == 0) atomicAdd(result, sum);
}

}  // namespace

Status adamwUpdate(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                   float beta2, float eps, float weightDecay, int t, float gradScale, cudaStream_t stream) {
  // params, grads, m, v: (n)
  if (n == 0) return Status::ok();
  const optim::AdamwScalars s = optim::adamwScalars(lr, beta1, beta2, eps, weightDecay, t);
  adamwKernel<<<detail::gridFor(n), detail::kBlockSize, 0, stream>>>(params, grads, m, v, n, s, gradScale);
  return checkLaunch("adamwUpdate");
}

Status sgdUpdate(float* params, const float* grads, float* buf, size_t n, float lr, float momentum,
                 float weightDecay, bool nesterov, bool firstStep, float gradScale, cudaStream_t stream) {
  // params, grads, buf: (n). With momentum 0 buf is unused (PyTorch keeps none) and may be null.
  if (n == 0) return Status::ok();
  float* useBuf = momentum != 0.0f ? buf : nullptr;
  sgdKernel<<<detail::gridFor(n), detail::kBlockSize, 0, stream>>>(
      params, grads, useBuf, n, lr, momentum, weightDecay, nesterov, firstStep, gradScale);
  return checkLaunch("sgdUpdate");
}

Status sumSquares(double* result, const float* x, size_t n, cudaStream_t stream) {
  // result: one double on the device; x (n)
  MS_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(double), stream));
  return sumSquaresAccumulate(result, x, n, stream);
}

Status sumSquaresAccumulate(double* result, const float* x, size_t n, cudaStream_t stream) {
  // result: one double on the device, added to; x (n)
  if (n == 0) return Status::ok();
  // Fewer blocks than the elementwise kernels: each block ends in one atomic, and 1024 blocks fill the GPU.
  const unsigned grid = detail::gridFor(n) < 1024u ? detail::gridFor(n) : 1024u;
  sumSquaresKernel<<<grid, detail::kBlockSize, 0, stream>>>(result, x, n);
  return checkLaunch("sumSquares");
}

}  // namespace ms::cuda
