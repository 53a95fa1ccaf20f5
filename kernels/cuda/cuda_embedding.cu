// Token + position embeddings. Forward is one thread per output element. Backward scatters each (b, t) row
// of dout into the rows of dwte its token names, so rows collide whenever a token repeats: atomicAdd makes
// that correct, at the price of a summation order that changes from run to run (not bitwise deterministic).
#include "kernels/cuda/cuda_common.cuh"

namespace ms::cuda {
namespace {

// out (B*T, C) = wte[tokens[bt]] + wpe[bt % T]
__global__ void embeddingForwardKernel(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                                       size_t BT, int T, int C) {
  const size_t total = BT * size_t(C);
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t bt = i / size_t(C);
    const int c = int(i % size_t(C));
    const int t = int(bt % size_t(T));
    out[i] = wte[size_t(tokens[bt]) * C + c] + wpe[size_t(t) * C + c];
  }
}

__global__ void embeddingBackwardKernel(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                                        size_t BT, int T, int C) {
  const size_t total = BT * size_t(C);
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t bt = i / size_t(C);
    const int c = int(i % size_t(C));
    const float g = dout[i];
    if (dwte) atomicAdd(dwte + size_t(tokens[bt]) * C + c, g);
    if (dwpe) atomicAdd(dwpe + (bt % size_t(T)) * C + c, g);
  }
}

}  // namespace

Status embeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                        int C, cudaStream_t stream) {
  // out (B, T, C), tokens (B, T), wte (V, C), wpe (maxT, C)
  if (B <= 0 || T <= 0 || C <= 0) return Status::ok();
  const size_t BT = size_t(B) * T;
  embeddingForwardKernel<<<detail::gridFor(BT * C), detail::kBlockSize, 0, stream>>>(out, tokens, wte, wpe,
                                                                                     BT, T, C);
  return checkLaunch("embeddingForward");
}

Status embeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                         int C, cudaStream_t stream) {
  // dwte (V, C), dwpe (maxT, C), dout (B, T, C), tokens (B, T)
  if (B <= 0 || T <= 0 || C <= 0 || (!dwte && !dwpe)) return Status::ok();
  const size_t BT = size_t(B) * T;
  embeddingBackwardKernel<<<detail::gridFor(BT * C), detail::kBlockSize, 0, stream>>>(dwte, dwpe, dout,
                                                                                      tokens, BT, T, C);
  return checkLaunch("embeddingBackward");
}

}  // namespace ms::cuda
