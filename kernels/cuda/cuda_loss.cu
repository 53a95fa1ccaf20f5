// Fused softmax + cross-entropy and row argmax, one block per row (rows are long: V reaches 50257). The loss
// is log-sum-exp with the row maximum subtracted, as in kernels/cpu/loss.cpp; the maximum and the sum come
// from one pass (online softmax), so a row is read twice, not three times (its sum is rounded in another
// order than the CPU's: agreement to float rounding, not bits). dlogits may alias logits: the only value
// read at another thread's index (the target logit) is read before the block barriers of the reduction, and
// every other element is read and then written by the same thread.
#include "kernels/cuda/cuda_common.cuh"

namespace ms::cuda {
namespace {

constexpr int kRowBlock = 512;

// The online softmax's running (maximum, sum of exp(x - maximum)) of a set of values, and the merge of two
// (Milakov and Gimelshein 2018, "Online normalizer calculation for softmax"). -inf values add nothing.
struct MaxSum {
  float m = -INFINITY;
  float s = 0.0f;
  __device__ void add(float x) {
    if (x == -INFINITY) return;
    if (x > m) {
      s *= expf(m - x);  // 0 while m is -inf (s is 0 then too)
      m = x;
    }
    s += expf(x - m);
  }
  __device__ void merge(float om, float os) {
    const float M = fmaxf(m, om);
    if (M == -INFINITY) return;  // both empty
    s = (m == -INFINITY ? 0.0f : s * expf(m - M)) + (om == -INFINITY ? 0.0f : os * expf(om - M));
    m = M;
  }
};

__device__ MaxSum blockMaxSum(MaxSum v, float* sharedM, float* sharedS) {
  const int lane = threadIdx.x % detail::kWarpSize;
  const int warp = threadIdx.x / detail::kWarpSize;
  const int warps = blockDim.x / detail::kWarpSize;
  for (int offset = detail::kWarpSize / 2; offset > 0; offset /= 2) {
    const float om = __shfl_xor_sync(0xffffffffu, v.m, offset);
    const float os = __shfl_xor_sync(0xffffffffu, v.s, offset);
    v.merge(om, os);
  }
  if (lane == 0) {
    sharedM[warp] = v.m;
    sharedS[warp] = v.s;
  }
  __syncthreads();
  MaxSum r;
  if (lane < warps) {
    r.m = sharedM[lane];
    r.s = sharedS[lane];
  }
  for (int offset = detail::kWarpSize / 2; offset > 0; offset /= 2) {
    const float om = __shfl_xor_sync(0xffffffffu, r.m, offset);
    const float os = __shfl_xor_sync(0xffffffffu, r.s, offset);
    r.merge(om, os);
  }
  return r;  // every thread holds the block's
}

// One block per row: one pass for the maximum and the sum together (online softmax), a second for the
// gradient; float4 accesses when V is a multiple of 4 and the rows 16-byte aligned (vec).
__global__ void softmaxCrossEntropyKernel(float* losses, float* dlogits, const float* logits,
                                          const int32_t* targets, int V, float gradScale, bool vec) {
  __shared__ float sharedM[detail::kWarpSize];
  __shared__ float sharedS[detail::kWarpSize];
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
  const float xt = x[target];  // read before any thread writes d (which may alias x)
  MaxSum ms;
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int j = threadIdx.x; j < V / 4; j += blockDim.x) {
      const float4 v = x4[j];
      ms.add(v.x);
      ms.add(v.y);
      ms.add(v.z);
      ms.add(v.w);
    }
  } else {
    for (int j = threadIdx.x; j < V; j += blockDim.x) ms.add(x[j]);
  }
  const MaxSum row = blockMaxSum(ms, sharedM, sharedS);
  const float maxv = row.m;
  const float sum = row.s;
  if (threadIdx.x == 0) losses[n] = logf(sum) - (xt - maxv);
  if (d) {
    const float s = gradScale / sum;
    if (vec) {
      const float4* x4 = reinterpret_cast<const float4*>(x);
      float4* d4 = reinterpret_cast<float4*>(d);
      for (int j = threadIdx.x; j < V / 4; j += blockDim.x) {
        const float4 v = x4[j];
        float4 g = make_float4(expf(v.x - maxv) * s, expf(v.y - maxv) * s, expf(v.z - maxv) * s,
                               expf(v.w - maxv) * s);
        const int t = target - 4 * j;
        if (t == 0) g.x -= gradScale;
        if (t == 1) g.y -= gradScale;
        if (t == 2) g.z -= gradScale;
        if (t == 3) g.w -= gradScale;
        d4[j] = g;
      }
    } else {
      for (int j = threadIdx.x; j < V; j += blockDim.x) {
        const float g = expf(x[j] - maxv) * s;
        d[j] = j == target ? g - gradScale : g;
      }
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
  const bool vec = V % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0 &&
                   (!dlogits || reinterpret_cast<uintptr_t>(dlogits) % 16 == 0);
  softmaxCrossEntropyKernel<<<unsigned(N), kRowBlock, 0, stream>>>(losses, dlogits, logits, targets, V,
                                                                   gradScale, vec);
  return checkLaunch("softmaxCrossEntropy");
}

Status argmaxRows(int32_t* out, const float* x, int N, int V, cudaStream_t stream) {
  // out (N), x (N, V)
  if (N <= 0 || V <= 0) return Status::ok();
  argmaxRowsKernel<<<unsigned(N), kRowBlock, 0, stream>>>(out, x, V);
  return checkLaunch("argmaxRows");
}

}  // namespace ms::cuda
