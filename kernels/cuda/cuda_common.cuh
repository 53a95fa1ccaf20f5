// Internal helpers shared by the .cu files of kernels/cuda: launch sizing, warp and block reductions, and
// the cuBLAS handle and GEMM wrappers. Not part of the public API (cuda_ops.h); included by .cu files only.
// Reductions assume blockDim.x is a multiple of 32 and at most 1024.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
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

// A GEMM input in device memory: fp32 (the caller's buffer) or bf16 (a converted copy in scratch, see
// gemmOperand). Implicitly made from an fp32 pointer.
struct GemmOperand {
  const void* data = nullptr;
  bool bf16 = false;

  GemmOperand() = default;
  GemmOperand(const float* p) : data(p) {}  // NOLINT: implicit on purpose (fp32 call sites)
  static GemmOperand bf16Copy(const __nv_bfloat16* p) {
    GemmOperand o;
    o.data = p;
    o.bf16 = true;
    return o;
  }
  // The same operand `offset` ELEMENTS further on (a head's columns, a batch element), in its own type.
  GemmOperand at(size_t offset) const {
    GemmOperand o = *this;
    o.data = bf16 ? static_cast<const void*>(static_cast<const __nv_bfloat16*>(data) + offset)
                  : static_cast<const void*>(static_cast<const float*>(data) + offset);
    return o;
  }
};

// The bf16 scratch slots of gemmOperand: one per operand an op converts at a time. An op must not give two
// live operands the same slot.
enum GemmSlot : int { kSlotX = 0, kSlotW = 1, kSlotD = 2, kGemmSlots = 3 };

// src (n floats, the whole buffer every strided view of the GEMMs will read) as a GEMM operand in the
// process GemmMode: src itself for Fp32 and Tf32; for Bf16 a copy rounded to nearest even, written into the
// calling thread's scratch `slot` for the current device by a kernel enqueued on stream. The copy is valid
// for work enqueued on stream until the next gemmOperand call with the same slot (see the stream rule in
// cuda_ops.h). Fails (a Status naming what) when the scratch cannot grow or the launch fails.
Expected<GemmOperand> gemmOperand(const float* src, size_t n, GemmSlot slot, cudaStream_t stream,
                                  const char* what);

// Column-major C = alpha * op(A) @ op(B) + beta * C with fp32 C, batched with element strides (in elements
// of each operand's type). batch 1 is a plain GEMM. fp32 A and B: CUBLAS_COMPUTE_32F, or
// CUBLAS_COMPUTE_32F_FAST_TF32 in GemmMode::Tf32; bf16 A and B (from gemmOperand): CUDA_R_16BF inputs with
// CUBLAS_COMPUTE_32F (fp32 accumulation). Mixed input types are an error. Callers translate row-major
// products (see cuda_linear.cu).
Status gemm(cudaStream_t stream, cublasOperation_t opA, cublasOperation_t opB, int m, int n, int k,
            float alpha, GemmOperand A, int lda, long long strideA, GemmOperand B, int ldb, long long strideB,
            float beta, float* C, int ldc, long long strideC, int batch, const char* what);

// Column-major C (m x n) = op(A) @ op(B) + bias (m, broadcast over the n columns), the bias added in the
// GEMM's epilogue by cuBLASLt (one pass over C instead of two), with gemm()'s types and precision. true when
// done; false when it was not attempted or cuBLASLt has no algorithm for it (then C is untouched and the
// caller does the GEMM and the add): the bias not 16-byte aligned, MESHSTUDIO_GEMM_EPILOGUE=0, an empty
// shape. An error Status only for a failure of the call itself.
Expected<bool> gemmWithBias(cudaStream_t stream, cublasOperation_t opA, cublasOperation_t opB, int m, int n,
                            int k, GemmOperand A, int lda, GemmOperand B, int ldb, const float* bias,
                            float* C, int ldc, const char* what);

// sum over rows of x (N, OC) into out (OC), out += . Deterministic, no atomics: the rows are cut into
// columnSlices(N, OC) slices, each block sums one slice of 32 columns into scratch, and a second kernel adds
// the slices in order (the cut depends on the shape alone, so the bits are the same on every GPU).
Status columnSumAccumulate(float* out, const float* x, int N, int OC, cudaStream_t stream, const char* what);

// The number of row slices of a column reduction over N rows and `columns` columns (about 1024 blocks of
// 32 columns, at least 64 rows a slice).
int columnSlices(int N, int columns);

// The calling thread's fp32 scratch for column reductions' partial sums on the current device, at least
// `floats` long, under gemmOperand's stream rule (a use on another stream than the last one synchronises
// the device first). Valid for work enqueued on stream until the next call.
Expected<float*> reductionScratch(size_t floats, cudaStream_t stream, const char* what);

}  // namespace ms::cuda::detail

#define MS_CUBLAS_CHECK(expr) MS_TRY(::ms::cuda::detail::cublasStatus((expr), #expr))

// Declares `GemmOperand var` = gemmOperand(args...), returning the Status from the enclosing function on
// failure.
#define MS_GEMM_OPERAND(var, ...)                                 \
  ::ms::cuda::detail::GemmOperand var;                            \
  do {                                                            \
    ::ms::Expected<::ms::cuda::detail::GemmOperand> ms_operand_ = \
        ::ms::cuda::detail::gemmOperand(__VA_ARGS__);             \
    if (!ms_operand_) return ms_operand_.status();                \
    var = *ms_operand_;                                           \
  } while (0)
