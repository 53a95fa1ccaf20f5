// Fused softmax + cross-entropy and row argmax, one block per row (rows are long: V reaches 50257). The loss
// is log-sum-exp with the row maximum subtracted, as in kernels/cpu/loss.cpp. dlogits may alias logits: the
// only value read at another thread's index (the target logit) is read before the block barriers of the
// sum, and every other element is read and then written by the same thread.
#include "kernels/cuda/cuda_common.cuh"

namespace ms::cuda {
namespace {

constexpr int kRowBlock = 512;

__global__ void softmaxCrossEntropyKernel(float* losses, float* dlogits, const float* logits,
                                          const int32_t* targets, int V, float gradScale) {
  __shared__ float shared[detail::kWarpSize];
  const int n = blockIdx.x;
  const float* x = logits + size_t(n) * V;
  float* d = dlogits ? dlogits + size_t(n) * V : nullptr;
  const int target = targets[n];
  if (target < 0) {  // ignored row: block-uniform branch
    if (d)
      for (int j = threadIdx.x; j < V; j += blockDim.x) d[j] = 0.0f;
    if (threadIdx.x == 0) losses[n] = 0.0f;
    return;
  }
  float maxv = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) maxv = fmaxf(maxv, x[j]);
  maxv = detail::blockMax(maxv, shared);
  const float shiftedTarget = x[target] - maxv;
  float sum = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(x[j] - maxv);
  sum = detail::blockSum(sum, shared);
  if (threadIdx.x == 0) losses[n] = logf(sum) - shiftedTarget;
  if (d) {
    const float s = gradScale / sum;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      const float g = expf(x[j] - maxv) * s;
      d[j] = j == target ? g - gradScale : g;
    }
  }
}

// Keeps (v, i) when it beats (bestV, bestI): larger value, or equal value at a lower index.
__device__ inline bool better(float v, int i, float bestV, int bestI) {
  return v > bestV || (v == bestV && i < bestI);
}

__global__ void argmaxRowsKernel(int32_t* out, const float* x, int V) {
  __shared__ float sharedV[detail::kWarpSize];
  __shared__ int sharedI[detail::kWarpSize];
  const float* row = x + size_t(blockIdx.x) * V;
  float bestV = -INFINITY;
  int bestI = V;  // beaten by any real element
  for (int j = threadIdx.x; j < V; j += blockDim.x)
    if (better(row[j], j, bestV, bestI)) {
      bestV = row[j];
      bestI = j;
    }
  const int lane = threadIdx.x % detail::kWarpSize;
  const int warp = threadIdx.x / detail::kWarpSize;
  for (int offset = detail::kWarpSize / 2; offset > 0; offset /= 2) {
    const float v = __shfl_xor_sync(0xffffffffu, bestV, offset);
    const int i = __shfl_xor_sync(0xffffffffu, bestI, offset);
    if (better(v, i, bestV, bestI)) {
      bestV = v;
      bestI = i;
    }
  }
  if (lane == 0) {
    sharedV[warp] = bestV;
    sharedI[warp] = bestI;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x) / detail::kWarpSize; w++)
      if (better(sharedV[w], sharedI[w], bestV, bestI)) {
        bestV = sharedV[w];
        bestI = sharedI[w];
      }
    // A row of NaNs only: index 0, as the CPU loop gives. (A NaN elsewhere is skipped; the CPU skips it too
    // unless it sits at index 0.)
    out[blockIdx.x] = bestI < V ? bestI : 0;
  }
}

}  // namespace

Status softmaxCrossEntropy(float* losses, float* dlogits, const float* logits, const int32_t* targets, int N,
                           int V, float gradScale, cudaStream_t stream) {
  // losses (N), dlogits (N, V), logits (N, V), targets (N)
  if (N <= 0 || V <= 0) return Status::ok();
  softmaxCrossEntropyKernel<<<unsigned(N), kRowBlock, 0, stream>>>(losses, dlogits, logits, targets, V,
                                                                   gradScale);
  return checkLaunch("softmaxCrossEntropy");
}

Status argmaxRows(int32_t* out, const float* x, int N, int V, cudaStream_t stream) {
  // out (N), x (N, V)
  if (N <= 0 || V <= 0) return Status::ok();
  argmaxRowsKernel<<<unsigned(N), kRowBlock, 0, stream>>>(out, x, V);
  return checkLaunch("argmaxRows");
}

}  // namespace ms::cuda
