// cuBLAS plumbing for the CUDA backend: one handle per thread and device, created lazily and bound to the
// caller's stream on every use; the GEMM wrapper every product goes through (fp32, TF32, or bf16 inputs with
// fp32 accumulation); the bf16 conversion of GEMM operands into per-thread scratch (GemmMode::Bf16, see
// cuda_ops.h for the stream rule that makes its reuse safe); and the deterministic column sum used for bias
// gradients. The handle and scratch caches are thread_local (cuBLAS handles must not be used by two threads
// at once) and release what they hold when the thread ends.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_common.cuh"

namespace ms::cuda::detail {
namespace {

constexpr int kMaxDevices = 64;

struct HandleCache {
  cublasHandle_t handles[kMaxDevices] = {};
  ~HandleCache() {
    for (cublasHandle_t h : handles)
      if (h) cublasDestroy(h);  // errors at thread exit have nobody left to report to
  }
};

thread_local HandleCache t_handles;

// The bf16 copies of GEMM operands: grow-only buffers, kGemmSlots per device, plus the stream the last GEMM
// op of this thread used on each device (a different stream synchronises the device before reuse).
struct ScratchCache {
  struct Buffer {
    __nv_bfloat16* data = nullptr;
    size_t elems = 0;
  };
  Buffer buffers[kMaxDevices][kGemmSlots];
  Buffer reduce[kMaxDevices];  // the column reductions' partial sums (fp32, held as twice the bf16 elements)
  cudaStream_t lastStream[kMaxDevices] = {};
  bool used[kMaxDevices] = {};
  ~ScratchCache() {
    // Errors at thread exit have nobody left to report to; cudaFree waits for the work still reading them.
    for (int d = 0; d < kMaxDevices; ++d) {
      for (Buffer& b : buffers[d])
        if (b.data && cudaSetDevice(d) == cudaSuccess) cudaFree(b.data);
      if (reduce[d].data && cudaSetDevice(d) == cudaSuccess) cudaFree(reduce[d].data);
    }
    cudaGetLastError();
  }
};

thread_local ScratchCache t_scratch;

// dst[i] = src[i] rounded to bf16 (nearest even). With vec, src is 16-byte and dst 8-byte aligned: four
// elements per load, then the tail one by one.
__global__ void toBf16Kernel(__nv_bfloat16* dst, const float* src, size_t n, bool vec) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {
    const size_t n4 = n / 4;
    const float4* s4 = reinterpret_cast<const float4*>(src);
    __nv_bfloat162* d2 = reinterpret_cast<__nv_bfloat162*>(dst);
    for (size_t i = first; i < n4; i += stride) {
      const float4 v = s4[i];
      d2[2 * i] = __floats2bfloat162_rn(v.x, v.y);
      d2[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
    }
    first += 4 * n4;
  }
  for (size_t i = first; i < n; i += stride) dst[i] = __float2bfloat16_rn(src[i]);
}

Status launchToBf16(__nv_bfloat16* dst, const float* src, size_t n, cudaStream_t stream, const char* what) {
  if (n == 0) return Status::ok();
  const bool vec = reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 8 == 0;
  toBf16Kernel<<<gridFor(vec ? n / 4 + 1 : n), kBlockSize, 0, stream>>>(dst, src, n, vec);
  return checkLaunch(what);
}

// Makes `b` hold at least n elements (grow-only, 1.5x at a time). The old buffer was last read on `stream`
// (gemmOperand synchronised the device if the previous op used another one): waiting for that stream before
// freeing it makes sure no queued GEMM still reads it (cudaFree would also wait, implicitly). On out of
// memory the stream-ordered pool of the device (the CUDA backend's allocator, which keeps freed memory
// cached) gives its unused memory back and the allocation is retried once at the exact size. Growth happens
// during the first steps only, so these synchronisations do not recur.
Status growScratch(ScratchCache::Buffer& b, size_t n, int device, cudaStream_t stream, const char* what) {
  if (b.elems >= n) return Status::ok();
  const size_t want = std::max(n, b.elems + b.elems / 2);
  if (b.data) {
    MS_TRY(cudaStatus(cudaStreamSynchronize(stream),
                      (std::string(what) + ": bf16 GEMM scratch: cudaStreamSynchronize").c_str()));
    const cudaError_t e = cudaFree(b.data);
    b.data = nullptr;
    b.elems = 0;
    MS_TRY(cudaStatus(e, (std::string(what) + ": bf16 GEMM scratch: cudaFree").c_str()));
  }
  void* p = nullptr;
  size_t got = want;
  cudaError_t e = cudaMalloc(&p, got * sizeof(__nv_bfloat16));
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it
    cudaMemPool_t pool = nullptr;
    if (cudaDeviceGetMemPool(&pool, device) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess)
      cudaMemPoolTrimTo(pool, 0);
    cudaGetLastError();
    got = n;
    p = nullptr;
    e = cudaMalloc(&p, got * sizeof(__nv_bfloat16));
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cudaStatus(e, (std::string(what) + ": bf16 GEMM scratch: cudaMalloc of " +
                          std::to_string(got * sizeof(__nv_bfloat16)) + " bytes")
                             .c_str());
  }
  b.data = static_cast<__nv_bfloat16*>(p);
  b.elems = got;
  return Status::ok();
}

// Rows per block in the column sum: blockDim (32, kSumRows), each thread strides over rows.
constexpr int kSumRows = 8;

// Stage 1 of the column sum: block (bx, s) sums rows [s * rows, (s + 1) * rows) of its 32 columns into
// partial[s * OC + c]. x (N, OC). Each thread keeps two sums (two loads in flight), added in a fixed order.
__global__ void columnSumPartialKernel(float* partial, const float* x, int N, int OC, int rows) {
  __shared__ float shared[kSumRows][kWarpSize + 1];
  const int c = blockIdx.x * kWarpSize + threadIdx.x;
  const int first = blockIdx.y * rows;
  const int last = min(N, first + rows);
  float a = 0.0f, b = 0.0f;
  if (c < OC) {
    int n = first + threadIdx.y;
    for (; n + kSumRows < last; n += 2 * kSumRows) {
      a += x[size_t(n) * OC + c];
      b += x[size_t(n + kSumRows) * OC + c];
    }
    if (n < last) a += x[size_t(n) * OC + c];
  }
  shared[threadIdx.y][threadIdx.x] = a + b;
  __syncthreads();
  if (threadIdx.y == 0 && c < OC) {
    float total = 0.0f;
    for (int r = 0; r < kSumRows; r++) total += shared[r][threadIdx.x];
    partial[size_t(blockIdx.y) * OC + c] = total;
  }
}

// Stage 2: out[c] += the slices' partial sums, in slice order.
__global__ void columnSumFinishKernel(float* out, const float* partial, int OC, int slices) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  float total = 0.0f;
  for (int s = 0; s < slices; ++s) total += partial[size_t(s) * OC + c];
  out[c] += total;
}

}  // namespace

Status cublasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return Status::error(std::string(what) + ": " + cublasGetStatusName(status) + ": " +
                       cublasGetStatusString(status));
}

Expected<cublasHandle_t> cublasHandleFor(cudaStream_t stream) {
  int device = 0;
  MS_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices)
    return Status::error("cuBLAS handle: device index " + std::to_string(device) + " out of range");
  cublasHandle_t& h = t_handles.handles[device];
  if (!h) MS_CUBLAS_CHECK(cublasCreate(&h));
  MS_CUBLAS_CHECK(cublasSetStream(h, stream));
  return h;
}

// The current device for a scratch use on stream: synchronises the device first when the previous use of
// this thread's scratch on it was on another stream (its kernels may still read the scratch, cuda_ops.h).
Expected<int> scratchDevice(cudaStream_t stream, const char* what) {
  int device = 0;
  MS_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices)
    return Status::error(std::string(what) + ": scratch: device index " + std::to_string(device) +
                         " out of range");
  if (t_scratch.used[device] && t_scratch.lastStream[device] != stream) {
    MS_TRY(cudaStatus(cudaDeviceSynchronize(),
                      (std::string(what) + ": scratch: cudaDeviceSynchronize").c_str()));
  }
  t_scratch.used[device] = true;
  t_scratch.lastStream[device] = stream;
  return device;
}

Expected<GemmOperand> gemmOperand(const float* src, size_t n, GemmSlot slot, cudaStream_t stream,
                                  const char* what) {
  if (gemmMode() != GemmMode::Bf16) return GemmOperand(src);
  if (slot < 0 || slot >= kGemmSlots) return Status::error(std::string(what) + ": no GEMM scratch slot");
  const Expected<int> device = scratchDevice(stream, what);
  if (!device) return device.status();
  ScratchCache::Buffer& b = t_scratch.buffers[*device][slot];
  MS_TRY(growScratch(b, n, *device, stream, what));
  MS_TRY(launchToBf16(b.data, src, n, stream, what));
  return GemmOperand::bf16Copy(b.data);
}

Expected<float*> reductionScratch(size_t floats, cudaStream_t stream, const char* what) {
  const Expected<int> device = scratchDevice(stream, what);
  if (!device) return device.status();
  ScratchCache::Buffer& b = t_scratch.reduce[*device];
  MS_TRY(growScratch(b, 2 * floats, *device, stream, what));
  return reinterpret_cast<float*>(b.data);
}

int columnSlices(int N, int columns) {
  // About 1024 blocks of 32 columns, no slice under 64 rows; from the shape alone, so that the summation
  // order (and so every bit of the result) is the same on every GPU.
  const int columnBlocks = (columns + kWarpSize - 1) / kWarpSize;
  const int wanted = (1024 + columnBlocks - 1) / columnBlocks;
  const int most = (N + 63) / 64;
  return std::max(1, std::min(wanted, most));
}

Status gemm(cudaStream_t stream, cublasOperation_t opA, cublasOperation_t opB, int m, int n, int k,
            float alpha, GemmOperand A, int lda, long long strideA, GemmOperand B, int ldb, long long strideB,
            float beta, float* C, int ldc, long long strideC, int batch, const char* what) {
  if (m <= 0 || n <= 0 || batch <= 0) return Status::ok();
  if (A.bf16 != B.bf16)
    return Status::error(std::string(what) + ": GEMM inputs of different types (one bf16, one fp32)");
  Expected<cublasHandle_t> handle = cublasHandleFor(stream);
  if (!handle) return handle.status().withContext(what);
  cublasHandle_t h = *handle;
  // bf16 inputs: fp32 accumulation (CUBLAS_COMPUTE_32F) on the tensor cores, which the default math mode
  // allows for 16-bit inputs. fp32 inputs: TF32 only in GemmMode::Tf32.
  const cudaDataType_t inType = A.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const bool tf32 = !A.bf16 && gemmMode() == GemmMode::Tf32;
  // The compute type alone decides the precision; the math mode is set to match so that neither depends on
  // what another caller left on this handle.
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  Status s = cublasStatus(cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
                          "cublasSetMathMode");
  if (!s) return s.withContext(what);
  if (batch == 1) {
    s = cublasStatus(cublasGemmEx(h, opA, opB, m, n, k, &alpha, A.data, inType, lda, B.data, inType, ldb,
                                  &beta, C, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx");
  } else {
    s = cublasStatus(cublasGemmStridedBatchedEx(h, opA, opB, m, n, k, &alpha, A.data, inType, lda, strideA,
                                                B.data, inType, ldb, strideB, &beta, C, CUDA_R_32F, ldc,
                                                strideC, batch, compute, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmStridedBatchedEx");
  }
  return s.withContext(what);
}

Status columnSumAccumulate(float* out, const float* x, int N, int OC, cudaStream_t stream, const char* what) {
  if (N <= 0 || OC <= 0) return Status::ok();
  const int slices = columnSlices(N, OC);
  const int rows = (N + slices - 1) / slices;
  const Expected<float*> partial = reductionScratch(size_t(slices) * OC, stream, what);
  if (!partial) return partial.status();
  const dim3 block(kWarpSize, kSumRows);
  const dim3 grid(unsigned((OC + kWarpSize - 1) / kWarpSize), unsigned(slices));
  columnSumPartialKernel<<<grid, block, 0, stream>>>(*partial, x, N, OC, rows);
  MS_TRY(checkLaunch(what));
  columnSumFinishKernel<<<gridFor(size_t(OC)), kBlockSize, 0, stream>>>(out, *partial, OC, slices);
  return checkLaunch(what);
}

}  // namespace ms::cuda::detail

namespace ms::cuda {

Status prepareGemm(cudaStream_t stream) {
  const Expected<cublasHandle_t> handle = detail::cublasHandleFor(stream);
  return handle ? Status::ok() : handle.status().withContext("prepareGemm");
}

Status roundToBf16(uint16_t* dst, const float* src, size_t n, cudaStream_t stream) {
  static_assert(sizeof(__nv_bfloat16) == sizeof(uint16_t), "bf16 is 16 bits");
  return detail::launchToBf16(reinterpret_cast<__nv_bfloat16*>(dst), src, n, stream, "roundToBf16");
}

}  // namespace ms::cuda
