// Optimizer updates and the squared-norm reduction over flat buffers, following kernels/cpu/optimizer.cpp
// operation for operation (which follows torch.optim's single-tensor paths); scalars PyTorch computes in
// Python (bias corrections, step size) are computed in double on the host here too. sumSquares adds
// per-block double partials with atomicAdd: its last bits depend on block order.
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"

namespace ms::cuda {
namespace {

__global__ void adamwKernel(float* params, const float* grads, float* m, float* v, size_t n, float stepSize,
                            float bc2Sqrt, float decay, float beta1, float beta2, float eps,
                            float gradScale) {
  const float w1 = 1.0f - beta1;
  const float w2 = 1.0f - beta2;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float g = grads[i] * gradScale;
    const float p = params[i] * decay;
    const float mi = m[i] + w1 * (g - m[i]);
    const float vi = v[i] * beta2 + w2 * g * g;
    m[i] = mi;
    v[i] = vi;
    params[i] = p - stepSize * (mi / (sqrtf(vi) / bc2Sqrt + eps));
  }
}

__global__ void sgdKernel(float* params, const float* grads, float* buf, size_t n, float lr, float momentum,
                          float weightDecay, bool nesterov, bool firstStep, float gradScale) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float g = grads[i] * gradScale + weightDecay * params[i];
    float step = g;
    if (buf) {
      const float b = firstStep ? g : momentum * buf[i] + g;
      buf[i] = b;
      step = nesterov ? g + momentum * b : b;
    }
    params[i] -= lr * step;
  }
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
  const double biasCorrection1 = 1.0 - std::pow(double(beta1), double(t));
  const double biasCorrection2 = 1.0 - std::pow(double(beta2), double(t));
  const float stepSize = float(double(lr) / biasCorrection1);
  const float bc2Sqrt = float(std::sqrt(biasCorrection2));
  const float decay = float(1.0 - double(lr) * double(weightDecay));
  adamwKernel<<<detail::gridFor(n), detail::kBlockSize, 0, stream>>>(
      params, grads, m, v, n, stepSize, bc2Sqrt, decay, beta1, beta2, eps, gradScale);
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
  if (n == 0) return Status::ok();
  // Fewer blocks than the elementwise kernels: each block ends in one atomic, and 1024 blocks fill the GPU.
  const unsigned grid = detail::gridFor(n) < 1024u ? detail::gridFor(n) : 1024u;
  sumSquaresKernel<<<grid, detail::kBlockSize, 0, stream>>>(result, x, n);
  return checkLaunch("sumSquares");
}

}  // namespace ms::cuda
