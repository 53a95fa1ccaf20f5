// Internal helpers shared by the .cu files of kernels/cuda: launch sizing, warp and block reductions, and
// the cuBLAS handle and GEMM wrappers. Not part of the public API (cuda_ops.h); included by .cu files only.
// Reductions assume blockDim.x is a multiple of 32 and at most 1024.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/cuda_ops.h"

namespace ms::cuda::detail {

constexpr int kWarpSize = 32;
constexpr int kBlockSize = 256;
// Grid-stride loops cover any n with at most this many blocks (enough to fill an H100 many times over).
constexpr size_t kMaxBlocks = 65535;

inline unsigned gridFor(size_t n, int block = kBlockSize) {
  const size_t blocks = (n + size_t(block) - 1) / size_t(block);
  return unsigned(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__device__ inline float warpSum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ inline double warpSum(double v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ inline float warpMax(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the whole block, returned to every thread. shared: at least 32 elements; the function syncs
// before reusing it, so back-to-back calls with the same buffer are safe.
template <typename F>
__device__ inline F blockSum(F v, F* shared) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warpSum(v);
  __syncthreads();  // a previous call may still be reading shared
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : F(0);
  return warpSum(v);
}

__device__ inline float blockMax(float v, float* shared) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warpMax(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  return warpMax(v);
}

// ---- cuBLAS
// ------------------------------------------------------------------------------------------------
Status cublasStatus(cublasStatus_t status, const char* what);

// The calling thread's cuBLAS handle for the current device, created on first use and bound to stream.
// cuBLAS handles are not safe to share between threads that use them concurrently, hence one per thread.
Expected<cublasHandle_t> cublasHandleFor(cudaStream_t stream);

// Column-major C = alpha * op(A) @ op(B) + beta * C in fp32 storage, batched with element strides, using the
// process GemmMode. batch 1 is a plain GEMM. Callers translate row-major products (see cuda_linear.cu).
Status gemm(cudaStream_t stream, cublasOperation_t opA, cublasOperation_t opB, int m, int n, int k,
            float alpha, const float* A, int lda, long long strideA, const float* B, int ldb,
            long long strideB, float beta, float* C, int ldc, long long strideC, int batch, const char* what);

// sum over rows of x (N, OC) into out (OC), out += (deterministic: one block column per output, no atomics).
Status columnSumAccumulate(float* out, const float* x, int N, int OC, cudaStream_t stream, const char* what);

}  // namespace ms::cuda::detail

#define MS_CUBLAS_CHECK(expr) MS_TRY(::ms::cuda::detail::cublasStatus((expr), #expr))
