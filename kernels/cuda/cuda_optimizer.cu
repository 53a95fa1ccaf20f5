// Optimizer updates and the squared-norm reduction over flat buffers. The per-element math is
// kernels/optimizer_math.h, shared with the CPU loops; its per-step scalars are computed in double on the
// host. The multi-tensor forms update a table of segments in one launch (see cuda_ops.h). sumSquares adds
// per-block double partials with atomicAdd: its last bits depend on block order.
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

// Elements per block of the multi-tensor kernels (16 per thread): few enough blocks, and a small segment
// (a bias) still takes only one.
constexpr size_t kSegmentChunk = size_t(detail::kBlockSize) * 16;
// The grid's x dimension limit.
constexpr size_t kMaxGridX = (size_t(1) << 31) - 1;

// The index of the entry block blockIdx.x works on: the last one whose firstBlock <= blockIdx.x (entries
// are in firstBlock order; empty ones share the next one's firstBlock and are never picked). Thread 0
// searches, the block shares the answer.
__device__ size_t blockSegment(const OptimizerSegmentEntry* table, size_t count) {
  __shared__ size_t found;
  if (threadIdx.x == 0) {
    const size_t b = blockIdx.x;
    // Invariant: table[lo].firstBlock <= b (table[0].firstBlock is 0); entries from hi on start past b.
    size_t lo = 0, hi = count;
    while (hi - lo > 1) {
      const size_t mid = lo + (hi - lo) / 2;
      if (table[mid].firstBlock <= b)
        lo = mid;
      else
        hi = mid;
    }
    found = lo;
  }
  __syncthreads();
  return found;
}

// Element i of a segment's gradient: fp32, or bf16 widened exactly (its bits are the top half of the fp32).
__device__ inline float segmentGrad(const OptimizerSegmentEntry& e, size_t i) {
  return e.gradsBf16 ? __uint_as_float(uint32_t(e.gradsBf16[i]) << 16) : e.grads[i];
}

__global__ void adamwSegmentsKernel(const OptimizerSegmentEntry* table, size_t count, size_t chunk,
                                    optim::AdamwScalars s, float gradScale) {
  const OptimizerSegmentEntry& e = table[blockSegment(table, count)];
  float* params = e.params;
  float* m = e.m;
  float* v = e.v;
  s.decay = e.decay;
  const size_t begin = (size_t(blockIdx.x) - e.firstBlock) * chunk;
  const size_t end = begin + chunk < e.n ? begin + chunk : e.n;
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    optim::adamwElement(params[i], m[i], v[i], segmentGrad(e, i) * gradScale, s);
}

__global__ void sgdSegmentsKernel(const OptimizerSegmentEntry* table, size_t count, size_t chunk, float lr,
                                  float momentum, bool nesterov, bool firstStep, float gradScale) {
  const OptimizerSegmentEntry& e = table[blockSegment(table, count)];
  float* params = e.params;
  float* buf = momentum != 0.0f ? e.m : nullptr;
  const float weightDecay = e.weightDecay;
  const size_t begin = (size_t(blockIdx.x) - e.firstBlock) * chunk;
  const size_t end = begin + chunk < e.n ? begin + chunk : e.n;
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    optim::sgdElement(params[i], buf ? buf + i : nullptr, segmentGrad(e, i) * gradScale, lr, momentum,
                      weightDecay, nesterov, firstStep);
}

__device__ inline float widened(float x) {
  return x;
}
__device__ inline float widened(uint16_t x) {
  return __uint_as_float(uint32_t(x) << 16);
}

template <typename T>
__global__ void sumSquaresKernel(double* result, const T* x, size_t n) {
  __shared__ double shared[detail::kWarpSize];
  double sum = 0.0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const double xi = widened(x[i]);
    sum += xi * xi;
  }
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

OptimizerSegmentLaunch planOptimizerSegments(OptimizerSegmentEntry* entries, size_t count, float lr) {
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) total += entries[i].n;
  if (total == 0) return {};
  // Each segment adds at most one partial block; the chunk doubles until the grid fits.
  size_t chunk = kSegmentChunk;
  while (total / chunk + count >= kMaxGridX) chunk *= 2;
  size_t blocks = 0;
  for (size_t i = 0; i < count; ++i) {
    OptimizerSegmentEntry& e = entries[i];
    e.decay = optim::adamwDecay(lr, e.weightDecay);
    e.firstBlock = blocks;
    blocks += (e.n + chunk - 1) / chunk;
  }
  return {unsigned(blocks), chunk};
}

Status adamwUpdateSegments(const OptimizerSegmentEntry* table, size_t count, OptimizerSegmentLaunch launch,
                           float lr, float beta1, float beta2, float eps, int t, float gradScale,
                           cudaStream_t stream) {
  // table: count entries in device memory, planned with this lr; decay comes from each entry.
  if (count == 0 || launch.blocks == 0) return Status::ok();
  const optim::AdamwScalars s = optim::adamwScalars(lr, beta1, beta2, eps, 0.0f, t);
  adamwSegmentsKernel<<<launch.blocks, detail::kBlockSize, 0, stream>>>(table, count, launch.chunk, s,
                                                                        gradScale);
  return checkLaunch("adamwUpdateSegments");
}

Status sgdUpdateSegments(const OptimizerSegmentEntry* table, size_t count, OptimizerSegmentLaunch launch,
                         float lr, float momentum, bool nesterov, bool firstStep, float gradScale,
                         cudaStream_t stream) {
  // table: count entries in device memory; each entry's m is its momentum buffer (unused when momentum is 0).
  if (count == 0 || launch.blocks == 0) return Status::ok();
  sgdSegmentsKernel<<<launch.blocks, detail::kBlockSize, 0, stream>>>(
      table, count, launch.chunk, lr, momentum, nesterov, firstStep, gradScale);
  return checkLaunch("sgdUpdateSegments");
}

Status sumSquares(double* result, const float* x, size_t n, cudaStream_t stream) {
  // result: one double on the device; x (n)
  MS_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(double), stream));
  return sumSquaresAccumulate(result, x, n, stream);
}

namespace {
template <typename T>
Status sumSquaresOf(double* result, const T* x, size_t n, cudaStream_t stream) {
  // result: one double on the device, added to; x (n)
  if (n == 0) return Status::ok();
  // Fewer blocks than the elementwise kernels: each block ends in one atomic, and 1024 blocks fill the GPU.
  const unsigned grid = detail::gridFor(n) < 1024u ? detail::gridFor(n) : 1024u;
  sumSquaresKernel<T><<<grid, detail::kBlockSize, 0, stream>>>(result, x, n);
  return checkLaunch("sumSquares");
}
}  // namespace

Status sumSquaresAccumulate(double* result, const float* x, size_t n, cudaStream_t stream) {
  return sumSquaresOf(result, x, n, stream);
}
Status sumSquaresAccumulate(double* result, const uint16_t* x, size_t n, cudaStream_t stream) {
  return sumSquaresOf(result, x, n, stream);
}

}  // namespace ms::cuda
