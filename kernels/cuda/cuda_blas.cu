// cuBLAS plumbing for the CUDA backend: one handle per thread and device, created lazily and bound to the
// caller's stream on every use; the GEMM wrapper every product goes through (fp32, TF32, or bf16 inputs with
// fp32 accumulation); the cuBLASLt GEMM that adds a bias in its epilogue (forward linears); the bf16
// conversion of GEMM operands into per-thread scratch (GemmMode::Bf16, see cuda_ops.h for the stream rule
// that makes its reuse safe); and the deterministic column sum used for bias gradients. The handle and
// scratch caches are thread_local (cuBLAS handles must not be used by two threads at once) and release what
// they hold when the thread ends.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>

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

// ---- cuBLASLt: GEMMs with the bias added in their epilogue (gemmWithBias).

// The largest power of two (at most 256) that divides a pointer: the alignment cuBLASLt's algorithm
// heuristic must assume (its default, 256 bytes, would let it pick kernels our sub-buffer views break).
uint32_t alignmentOf(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

// A GEMM shape as cuBLASLt plans it: the descriptors and the algorithm its heuristic chose, made once per
// shape, types and operand alignments and kept for the thread's life (the heuristic costs tens of
// microseconds, a call a few). supported = false: cuBLASLt offered no algorithm, the caller adds the bias
// itself.
struct LtPlan {
  bool supported = false;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo = {};
};

using LtKey = std::tuple<int, int, int, int, int, int, int, int, int, int, uint32_t, uint32_t, uint32_t>;

struct LtCache {
  cublasLtHandle_t handles[kMaxDevices] = {};
  std::map<LtKey, LtPlan> plans;
  ~LtCache() {  // errors at thread exit have nobody left to report to
    for (auto& [key, plan] : plans) {
      if (plan.op) cublasLtMatmulDescDestroy(plan.op);
      for (cublasLtMatrixLayout_t l : {plan.a, plan.b, plan.c})
        if (l) cublasLtMatrixLayoutDestroy(l);
    }
    for (cublasLtHandle_t h : handles)
      if (h) cublasLtDestroy(h);
  }
};

thread_local LtCache t_lt;

// MESHSTUDIO_GEMM_EPILOGUE=0 turns the fused bias off (every bias a separate kernel, as before it), for
// measuring what it gains.
bool epilogueEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("MESHSTUDIO_GEMM_EPILOGUE");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return enabled;
}

Status ltStatus(cublasStatus_t status, const char* call, const char* what) {
  return cublasStatus(status, (std::string(what) + ": " + call).c_str());
}

// Plans a bias-epilogue GEMM for the key's shape (see LtPlan); an error only for a failure that is not
// "cuBLASLt has no algorithm for this".
Status makeLtPlan(LtPlan& plan, cublasLtHandle_t h, cublasOperation_t opA, cublasOperation_t opB, int m,
                  int n, int k, int lda, int ldb, int ldc, cudaDataType_t inType, cublasComputeType_t compute,
                  uint32_t alignA, uint32_t alignB, uint32_t alignC, const char* what) {
  MS_TRY(ltStatus(cublasLtMatmulDescCreate(&plan.op, compute, CUDA_R_32F), "cublasLtMatmulDescCreate", what));
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  const cudaDataType_t biasType = CUDA_R_32F;
  MS_TRY(ltStatus(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof(opA)),
                  "cublasLtMatmulDescSetAttribute(TRANSA)", what));
  MS_TRY(ltStatus(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof(opB)),
                  "cublasLtMatmulDescSetAttribute(TRANSB)", what));
  MS_TRY(ltStatus(
      cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
      "cublasLtMatmulDescSetAttribute(EPILOGUE)", what));
  MS_TRY(ltStatus(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &biasType,
                                                 sizeof(biasType)),
                  "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)", what));
  // Column-major layouts as stored: A is m x k (k x m transposed), B k x n (n x k transposed), C m x n.
  const bool ta = opA != CUBLAS_OP_N, tb = opB != CUBLAS_OP_N;
  MS_TRY(ltStatus(cublasLtMatrixLayoutCreate(&plan.a, inType, ta ? k : m, ta ? m : k, lda),
                  "cublasLtMatrixLayoutCreate(A)", what));
  MS_TRY(ltStatus(cublasLtMatrixLayoutCreate(&plan.b, inType, tb ? n : k, tb ? k : n, ldb),
                  "cublasLtMatrixLayoutCreate(B)", what));
  MS_TRY(ltStatus(cublasLtMatrixLayoutCreate(&plan.c, CUDA_R_32F, m, n, ldc), "cublasLtMatrixLayoutCreate(C)",
                  what));
  cublasLtMatmulPreference_t pref = nullptr;
  MS_TRY(ltStatus(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", what));
  // No workspace: the bias GEMMs are forward products with large outputs, which need no split reduction,
  // and the memory model's allowance for library memory stays what was measured.
  const size_t workspace = 0;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &workspace, sizeof(workspace));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &alignA,
                                              sizeof(alignA));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &alignB,
                                              sizeof(alignB));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alignC,
                                              sizeof(alignC));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &alignC,
                                              sizeof(alignC));
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(h, plan.op, plan.a, plan.b, plan.c, plan.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0)) return Status::ok();
  MS_TRY(ltStatus(st, "cublasLtMatmulAlgoGetHeuristic", what));
  plan.algo = result.algo;
  plan.supported = true;
  return Status::ok();
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

Expected<bool> gemmWithBias(cudaStream_t stream, cublasOperation_t opA, cublasOperation_t opB, int m, int n,
                            int k, GemmOperand A, int lda, GemmOperand B, int ldb, const float* bias,
                            float* C, int ldc, const char* what) {
  // The bias vector must be 16-byte aligned for the epilogue (a requirement other projects report
  // finding on A100s; cuBLASLt's documentation does not state it).
  if (!epilogueEnabled() || !bias || m <= 0 || n <= 0 || k <= 0 || alignmentOf(bias) < 16) return false;
  if (A.bf16 != B.bf16)
    return Status::error(std::string(what) + ": GEMM inputs of different types (one bf16, one fp32)");
  int device = 0;
  MS_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) return false;
  cublasLtHandle_t& h = t_lt.handles[device];
  if (!h) MS_TRY(ltStatus(cublasLtCreate(&h), "cublasLtCreate", what));
  const cudaDataType_t inType = A.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const bool tf32 = !A.bf16 && gemmMode() == GemmMode::Tf32;
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const uint32_t alignA = alignmentOf(A.data), alignB = alignmentOf(B.data), alignC = alignmentOf(C);
  const LtKey key{device, int(opA), int(opB), m, n, k, lda, ldb, ldc, int(inType) * 16 + int(compute),
                  alignA, alignB,   alignC};
  auto [it, fresh] = t_lt.plans.try_emplace(key);
  LtPlan& plan = it->second;
  if (fresh) {
    if (Status s = makeLtPlan(plan, h, opA, opB, m, n, k, lda, ldb, ldc, inType, compute, alignA, alignB,
                              alignC, what);
        !s) {
      plan.supported = false;
      return s;
    }
  }
  if (!plan.supported) return false;
  MS_TRY(ltStatus(
      cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
      "cublasLtMatmulDescSetAttribute(BIAS_POINTER)", what));
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st = cublasLtMatmul(h, plan.op, &alpha, A.data, plan.a, B.data, plan.b, &beta, C,
                                           plan.c, C, plan.c, &plan.algo, nullptr, 0, stream);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {  // the algorithm refused at run time: never again for this shape
    plan.supported = false;
    return false;
  }
  MS_TRY(ltStatus(st, "cublasLtMatmul", what));
  return true;
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
