// The pieces the tensor-parallel layers compose with collectives (kernels/cpu/tp_ops.cpp on the GPU):
// position embeddings, the vocabulary-parallel embedding and the three steps of the vocabulary-parallel
// cross-entropy (Shoeybi et al. 2019, "Megatron-LM", section 3). Elementwise work is one grid-stride kernel
// over size_t indices (any size); row reductions give each row one block, blocks striding over rows. The
// embedding backward scatters with atomicAdd (tokens repeat), so its summation order varies run to run.
#include "kernels/cuda/cuda_common.cuh"

namespace ms::cuda {
namespace {

constexpr int kRowBlock = 256;  // threads per row in the row reductions
// Rows per launch before blocks start striding (grid.x itself allows 2^31 - 1; this keeps grids modest).
constexpr int kMaxRowBlocks = 65535;

#define MS_GRID_STRIDE(i, n) \
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

unsigned rowGrid(int N) {
  return unsigned(N < kMaxRowBlocks ? N : kMaxRowBlocks);
}

// A table element as fp32: as it is, or a bf16 one (mixed precision's working parameters) widened exactly.
__device__ inline float widen(float x) {
  return x;
}
__device__ inline float widen(uint16_t b) {
  return __uint_as_float(uint32_t(b) << 16);
}

// y (B*T, C) += wpe[(bt % T)]; n = B*T*C
template <typename E>
__global__ void addPositionsKernel(float* y, const E* wpe, int T, int C, size_t n) {
  MS_GRID_STRIDE(i, n) {
    const size_t bt = i / size_t(C);
    const size_t c = i % size_t(C);
    y[i] += widen(wpe[(bt % size_t(T)) * size_t(C) + c]);
  }
}

// out (N, C) = wte[tokens[n] - vocabStart] in range, else 0; n = N*C
template <typename E>
__global__ void embeddingRangeForwardKernel(float* out, const int32_t* tokens, const E* wte, int vocabStart,
                                            int vocabCount, int C, size_t n) {
  MS_GRID_STRIDE(i, n) {
    const size_t row = i / size_t(C);
    const size_t c = i % size_t(C);
    const int local = tokens[row] - vocabStart;
    out[i] = local >= 0 && local < vocabCount ? widen(wte[size_t(local) * size_t(C) + c]) : 0.0f;
  }
}

// dwte[tokens[n] - vocabStart] += dout[n] in range; n = N*C
__global__ void embeddingRangeBackwardKernel(float* dwte, const float* dout, const int32_t* tokens,
                                             int vocabStart, int vocabCount, int C, size_t n) {
  MS_GRID_STRIDE(i, n) {
    const size_t row = i / size_t(C);
    const int local = tokens[row] - vocabStart;
    if (local >= 0 && local < vocabCount)
      atomicAdd(dwte + size_t(local) * size_t(C) + i % size_t(C), dout[i]);
  }
}

// mx (N) = max of each row of logits (N, V); one block per row.
__global__ void rowMaxKernel(float* mx, const float* logits, int N, int V) {
  __shared__ float shared[detail::kWarpSize];
  for (int n = blockIdx.x; n < N; n += gridDim.x) {  // block-uniform: the reductions' barriers are safe
    const float* x = logits + size_t(n) * size_t(V);
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, x[j]);
    m = detail::blockMax(m, shared);
    if (threadIdx.x == 0) mx[n] = m;
  }
}

// sumExp (N) = sum_j exp(x - mx); targetLogit (N) = x[target - vocabStart] in range, else 0.
__global__ void crossEntropyPartialsKernel(float* sumExp, float* targetLogit, const float* logits,
                                           const float* mx, const int32_t* targets, int vocabStart, int N,
                                           int V) {
  __shared__ float shared[detail::kWarpSize];
  for (int n = blockIdx.x; n < N; n += gridDim.x) {
    const float* x = logits + size_t(n) * size_t(V);
    const float m = mx[n];
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(x[j] - m);
    s = detail::blockSum(s, shared);
    if (threadIdx.x == 0) {
      sumExp[n] = s;
      const int t = targets[n] - vocabStart;
      targetLogit[n] = targets[n] >= 0 && t >= 0 && t < V ? x[t] : 0.0f;
    }
  }
}

// losses (N) = log(sumExp) - (targetLogit - mx), 0 where target < 0.
__global__ void crossEntropyLossKernel(float* losses, const float* mx, const float* sumExp,
                                       const float* targetLogit, const int32_t* targets, size_t n) {
  MS_GRID_STRIDE(i, n) losses[i] = targets[i] < 0 ? 0.0f : logf(sumExp[i]) - (targetLogit[i] - mx[i]);
}

// dlogits (N, V) = gradScale * (softmax - onehot), 0 rows where target < 0; n = N*V. Each element is read and
// written by one thread, so dlogits may alias logits.
__global__ void crossEntropyGradKernel(float* dlogits, const float* logits, const float* mx,
                                       const float* sumExp, const int32_t* targets, int vocabStart, int V,
                                       float gradScale, size_t n) {
  MS_GRID_STRIDE(i, n) {
    const size_t row = i / size_t(V);
    const int j = int(i % size_t(V));
    const int target = targets[row];
    if (target < 0) {
      dlogits[i] = 0.0f;
      continue;
    }
    const float g = expf(logits[i] - mx[row]) * (gradScale / sumExp[row]);
    dlogits[i] = target - vocabStart == j ? g - gradScale : g;
  }
}

#undef MS_GRID_STRIDE

}  // namespace

template <typename E>
Status addPositionsOf(float* y, const E* wpe, int B, int T, int C, cudaStream_t stream) {
  // y (B, T, C), wpe (maxT, C)
  if (B <= 0 || T <= 0 || C <= 0) return Status::ok();
  const size_t n = size_t(B) * size_t(T) * size_t(C);
  addPositionsKernel<<<detail::gridFor(n), detail::kBlockSize, 0, stream>>>(y, wpe, T, C, n);
  return checkLaunch("addPositions");
}

Status addPositions(float* y, const float* wpe, int B, int T, int C, cudaStream_t stream) {
  return addPositionsOf(y, wpe, B, T, C, stream);
}
Status addPositions(float* y, const uint16_t* wpe, int B, int T, int C, cudaStream_t stream) {
  return addPositionsOf(y, wpe, B, T, C, stream);
}

template <typename E>
Status embeddingRangeForwardOf(float* out, const int32_t* tokens, const E* wte, int vocabStart,
                               int vocabCount, int N, int C, cudaStream_t stream) {
  // out (N, C), tokens (N), wte (vocabCount, C)
  if (N <= 0 || C <= 0) return Status::ok();
  const size_t n = size_t(N) * size_t(C);
  embeddingRangeForwardKernel<<<detail::gridFor(n), detail::kBlockSize, 0, stream>>>(
      out, tokens, wte, vocabStart, vocabCount, C, n);
  return checkLaunch("embeddingRangeForward");
}

Status embeddingRangeForward(float* out, const int32_t* tokens, const float* wte, int vocabStart,
                             int vocabCount, int N, int C, cudaStream_t stream) {
  return embeddingRangeForwardOf(out, tokens, wte, vocabStart, vocabCount, N, C, stream);
}
Status embeddingRangeForward(float* out, const int32_t* tokens, const uint16_t* wte, int vocabStart,
                             int vocabCount, int N, int C, cudaStream_t stream) {
  return embeddingRangeForwardOf(out, tokens, wte, vocabStart, vocabCount, N, C, stream);
}

Status embeddingRangeBackward(float* dwte, const float* dout, const int32_t* tokens, int vocabStart,
                              int vocabCount, int N, int C, cudaStream_t stream) {
  // dwte (vocabCount, C), dout (N, C), tokens (N)
  if (N <= 0 || C <= 0 || vocabCount <= 0 || !dwte) return Status::ok();
  const size_t n = size_t(N) * size_t(C);
  embeddingRangeBackwardKernel<<<detail::gridFor(n), detail::kBlockSize, 0, stream>>>(
      dwte, dout, tokens, vocabStart, vocabCount, C, n);
  return checkLaunch("embeddingRangeBackward");
}

Status rowMax(float* mx, const float* logits, int N, int V, cudaStream_t stream) {
  // mx (N), logits (N, V)
  if (N <= 0 || V <= 0) return Status::ok();
  rowMaxKernel<<<rowGrid(N), kRowBlock, 0, stream>>>(mx, logits, N, V);
  return checkLaunch("rowMax");
}

Status crossEntropyPartials(float* sumExp, float* targetLogit, const float* logits, const float* mx,
                            const int32_t* targets, int vocabStart, int N, int V, cudaStream_t stream) {
  // sumExp (N), targetLogit (N), logits (N, V), mx (N), targets (N)
  if (N <= 0 || V <= 0) return Status::ok();
  crossEntropyPartialsKernel<<<rowGrid(N), kRowBlock, 0, stream>>>(sumExp, targetLogit, logits, mx, targets,
                                                                   vocabStart, N, V);
  return checkLaunch("crossEntropyPartials");
}

Status crossEntropyFinish(float* losses, float* dlogits, const float* logits, const float* mx,
                          const float* sumExp, const float* targetLogit, const int32_t* targets,
                          int vocabStart, int N, int V, float gradScale, cudaStream_t stream) {
  // losses (N), dlogits (N, V) nullable, logits (N, V), mx, sumExp, targetLogit, targets (N)
  if (N <= 0) return Status::ok();
  crossEntropyLossKernel<<<detail::gridFor(size_t(N)), detail::kBlockSize, 0, stream>>>(
      losses, mx, sumExp, targetLogit, targets, size_t(N));
  MS_TRY(checkLaunch("crossEntropyFinish"));
  if (!dlogits || V <= 0) return Status::ok();
  const size_t n = size_t(N) * size_t(V);
  crossEntropyGradKernel<<<detail::gridFor(n), detail::kBlockSize, 0, stream>>>(
      dlogits, logits, mx, sumExp, targets, vocabStart, V, gradScale, n);
  return checkLaunch("crossEntropyFinish");
}

}  // namespace ms::cuda
