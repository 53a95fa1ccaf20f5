// cuBLAS plumbing for the CUDA backend: one handle per thread and device, created lazily and bound to the
// caller's stream on every use; the fp32/TF32 GEMM wrapper every product goes through; and the
// deterministic column sum used for bias gradients. The handle cache is thread_local (cuBLAS handles must not
// be used by two threads at once) and destroys its handles when the thread ends.
#include <cublas_v2.h>

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

// Rows per block in the column sum: blockDim (32, kSumRows), each thread strides over rows.
constexpr int kSumRows = 8;

// out[c] += sum_n x[n, c] for the 32 columns of this block. x (N, OC), out (OC).
__global__ void columnSumKernel(float* out, const float* x, int N, int OC) {
  __shared__ float partial[kSumRows][kWarpSize + 1];
  const int c = blockIdx.x * kWarpSize + threadIdx.x;
  float sum = 0.0f;
  if (c < OC)
    for (int n = threadIdx.y; n < N; n += kSumRows) sum += x[size_t(n) * OC + c];
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < OC) {
    float total = 0.0f;
    for (int r = 0; r < kSumRows; r++) total += partial[r][threadIdx.x];
    out[c] += total;
  }
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

Status gemm(cudaStream_t stream, cublasOperation_t opA, cublasOperation_t opB, int m, int n, int k,
            float alpha, const float* A, int lda, long long strideA, const float* B, int ldb,
            long long strideB, float beta, float* C, int ldc, long long strideC, int batch,
            const char* what) {
  if (m <= 0 || n <= 0 || batch <= 0) return Status::ok();
  Expected<cublasHandle_t> handle = cublasHandleFor(stream);
  if (!handle) return handle.status().withContext(what);
  cublasHandle_t h = *handle;
  const bool tf32 = gemmMode() == GemmMode::Tf32;
  // The compute type alone decides the precision; the math mode is set to match so that neither depends on
  // what another caller left on this handle.
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  Status s = cublasStatus(cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
                          "cublasSetMathMode");
  if (!s) return s.withContext(what);
  if (batch == 1) {
    s = cublasStatus(cublasGemmEx(h, opA, opB, m, n, k, &alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, &beta,
                                  C, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx");
  } else {
    s = cublasStatus(cublasGemmStridedBatchedEx(h, opA, opB, m, n, k, &alpha, A, CUDA_R_32F, lda, strideA, B,
                                                CUDA_R_32F, ldb, strideB, &beta, C, CUDA_R_32F, ldc, strideC,
                                                batch, compute, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmStridedBatchedEx");
  }
  return s.withContext(what);
}

Status columnSumAccumulate(float* out, const float* x, int N, int OC, cudaStream_t stream, const char* what) {
  if (N <= 0 || OC <= 0) return Status::ok();
  const dim3 block(kWarpSize, kSumRows);
  const unsigned grid = unsigned((OC + kWarpSize - 1) / kWarpSize);
  columnSumKernel<<<grid, block, 0, stream>>>(out, x, N, OC);
  return checkLaunch(what);
}

}  // namespace ms::cuda::detail

namespace ms::cuda {

Status prepareGemm(cudaStream_t stream) {
  const Expected<cublasHandle_t> handle = detail::cublasHandleFor(stream);
  return handle ? Status::ok() : handle.status().withContext("prepareGemm");
}

}  // namespace ms::cuda
