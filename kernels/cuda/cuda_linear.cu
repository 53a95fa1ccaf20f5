// Linear layers on cuBLAS. cuBLAS is column-major: a row-major (R, K) buffer is, read column-major, its
// transpose (K, R) with leading dimension K. So every row-major product Y = X @ W is computed as the
// column-major Y^T = W^T @ X^T on the same pointers, and the comment above each call gives the row-major
// formula it implements. Bias forward is added in the GEMM's epilogue (cuBLASLt, detail::gemmWithBias) or,
// where that declines, by a separate broadcast add; bias gradients are a deterministic column
// sum (cuda_blas.cu). In GemmMode::Bf16 every fp32 operand a call multiplies (inp, weight, dout) is first
// converted to bf16 into its own scratch slot (detail::gemmOperand; fp32 modes use the buffers as they are),
// on the same stream as the GEMMs that read it; results, accumulation (beta = 1 for the gradients) and the
// bias stay fp32. A bf16 operand (TensorIn: an input the layer keeps in bf16, a weight from the parameter
// store's bf16 working parameters, rounded from the master once per optimizer step) is read as it is, which
// saves the full pass over every weight that converting it would cost twice per microbatch (forward and
// input gradient).
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_common.cuh"

namespace ms::cuda {
namespace {

using detail::gemm;
using detail::kSlotD;
using detail::kSlotW;
using detail::kSlotX;

// out (N, OC) += bias (OC) broadcast over rows: block (x, y) adds the bias to rows y, y + gridDim.y, ... of
// its kBlockSize columns (no division per element).
__global__ void addBiasKernel(float* out, const float* bias, int N, int OC) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  const float b = bias[c];
  for (int r = blockIdx.y; r < N; r += gridDim.y) out[size_t(r) * OC + c] += b;
}

// Where the bias was not added in the GEMM's epilogue (detail::gemmWithBias declined).
Status addBias(float* out, const float* bias, int N, int OC, cudaStream_t stream, const char* what) {
  if (!bias || N <= 0 || OC <= 0) return Status::ok();
  const unsigned columns = unsigned((OC + detail::kBlockSize - 1) / detail::kBlockSize);
  const unsigned rows = unsigned(std::min<size_t>(size_t(N), std::max<size_t>(1, 4096 / columns)));
  addBiasKernel<<<dim3(columns, rows), detail::kBlockSize, 0, stream>>>(out, bias, N, OC);
  return checkLaunch(what);
}

// A bf16 TensorIn is valid only in GemmMode::Bf16 (what names the op and the operand). Checked at the top
// of every op whether or not the call reads the operand, as the CPU backend does.
Status checkBf16(TensorIn in, const char* what) {
  if (in.bf16 && gemmMode() != GemmMode::Bf16)
    return Status::error(std::string(what) + " is bf16, which needs the bf16 GEMM precision");
  return Status::ok();
}

// The GEMM operand of a linear layer's input or weight: an fp32 one as gemmOperand (into `slot`); a bf16 one
// (GemmMode::Bf16 only) as it is.
Expected<detail::GemmOperand> tensorOperand(TensorIn in, size_t n, detail::GemmSlot slot, cudaStream_t stream,
                                            const char* what) {
  if (!in.bf16) return detail::gemmOperand(in.f32(), n, slot, stream, what);
  MS_TRY(checkBf16(in, what));
  return detail::GemmOperand::bf16Copy(static_cast<const __nv_bfloat16*>(in.data));
}

#define MS_TENSOR_OPERAND(var, ...)                                                          \
  ::ms::cuda::detail::GemmOperand var;                                                       \
  do {                                                                                       \
    ::ms::Expected<::ms::cuda::detail::GemmOperand> ms_tensor_ = tensorOperand(__VA_ARGS__); \
    if (!ms_tensor_) return ms_tensor_.status();                                             \
    var = *ms_tensor_;                                                                       \
  } while (0)

// out (N, OC) = bias, or 0, for C = 0 (an empty sum, as on the CPU): cuBLAS rejects a leading dimension of 0.
Status emptyProduct(float* out, const float* bias, int N, int OC, cudaStream_t stream, const char* what) {
  MS_TRY(fillZero(out, size_t(N) * OC * sizeof(float), stream));
  return addBias(out, bias, N, OC, stream, what);
}

}  // namespace

Status linearForward(float* out, TensorIn inp, TensorIn weight, const float* bias, int N, int C, int OC,
                     cudaStream_t stream) {
  // out (N, OC), inp (N, C), weight (C, OC), bias (OC)
  MS_TRY(checkBf16(weight, "linearForward: weight"));
  if (N <= 0 || OC <= 0) return Status::ok();
  if (C <= 0) return emptyProduct(out, bias, N, OC, stream, "linearForward");
  MS_TENSOR_OPERAND(w, weight, size_t(C) * OC, kSlotW, stream, "linearForward: weight");
  MS_TENSOR_OPERAND(x, inp, size_t(N) * C, kSlotX, stream, "linearForward: inp");
  // out = inp @ weight  <=>  out^T (OC, N) = weight^T (OC, C) @ inp^T (C, N)
  const Expected<bool> fused = detail::gemmWithBias(stream, CUBLAS_OP_N, CUBLAS_OP_N, OC, N, C, w, OC, x, C,
                                                    bias, out, OC, "linearForward");
  if (!fused) return fused.status();
  if (*fused) return Status::ok();
  MS_TRY(gemm(stream, CUBLAS_OP_N, CUBLAS_OP_N, OC, N, C, 1.0f, w, OC, 0, x, C, 0, 0.0f, out, OC, 0, 1,
              "linearForward"));
  return addBias(out, bias, N, OC, stream, "linearForward: bias");
}

Status linearBackward(float* dinp, float* dweight, float* dbias, const float* dout, TensorIn inp,
                      TensorIn weight, int N, int C, int OC, cudaStream_t stream) {
  // dinp (N, C), dweight (C, OC), dbias (OC), dout (N, OC), inp (N, C), weight (C, OC)
  MS_TRY(checkBf16(weight, "linearBackward: weight"));
  if (N <= 0 || C <= 0 || OC <= 0) return Status::ok();
  if (dinp || dweight) {
    MS_GEMM_OPERAND(dy, dout, size_t(N) * OC, kSlotD, stream, "linearBackward: dout");
    if (dinp) {
      MS_TENSOR_OPERAND(w, weight, size_t(C) * OC, kSlotW, stream, "linearBackward: weight");
      // dinp += dout @ weight^T  <=>  dinp^T (C, N) += weight (C, OC) @ dout^T (OC, N)
      MS_TRY(gemm(stream, CUBLAS_OP_T, CUBLAS_OP_N, C, N, OC, 1.0f, w, OC, 0, dy, OC, 0, 1.0f, dinp, C, 0, 1,
                  "linearBackward: dinp"));
    }
    if (dweight) {
      MS_TENSOR_OPERAND(x, inp, size_t(N) * C, kSlotX, stream, "linearBackward: inp");
      // dweight += inp^T @ dout  <=>  dweight^T (OC, C) += dout^T (OC, N) @ inp (N, C)
      MS_TRY(gemm(stream, CUBLAS_OP_N, CUBLAS_OP_T, OC, C, N, 1.0f, dy, OC, 0, x, C, 0, 1.0f, dweight, OC, 0,
                  1, "linearBackward: dweight"));
    }
  }
  if (dbias) MS_TRY(detail::columnSumAccumulate(dbias, dout, N, OC, stream, "linearBackward: dbias"));
  return Status::ok();
}

Status linearForwardT(float* out, TensorIn inp, TensorIn weight, const float* bias, int N, int C, int OC,
                      cudaStream_t stream) {
  // out (N, OC), inp (N, C), weight (OC, C), bias (OC)
  MS_TRY(checkBf16(weight, "linearForwardT: weight"));
  if (N <= 0 || OC <= 0) return Status::ok();
  if (C <= 0) return emptyProduct(out, bias, N, OC, stream, "linearForwardT");
  MS_TENSOR_OPERAND(w, weight, size_t(OC) * C, kSlotW, stream, "linearForwardT: weight");
  MS_TENSOR_OPERAND(x, inp, size_t(N) * C, kSlotX, stream, "linearForwardT: inp");
  // out = inp @ weight^T  <=>  out^T (OC, N) = weight (OC, C) @ inp^T (C, N)
  const Expected<bool> fused = detail::gemmWithBias(stream, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, w, C, x, C,
                                                    bias, out, OC, "linearForwardT");
  if (!fused) return fused.status();
  if (*fused) return Status::ok();
  MS_TRY(gemm(stream, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, 1.0f, w, C, 0, x, C, 0, 0.0f, out, OC, 0, 1,
              "linearForwardT"));
  return addBias(out, bias, N, OC, stream, "linearForwardT: bias");
}

Status linearBackwardT(float* dinp, float* dweight, float* dbias, const float* dout, TensorIn inp,
                       TensorIn weight, int N, int C, int OC, cudaStream_t stream) {
  // dinp (N, C), dweight (OC, C), dbias (OC), dout (N, OC), inp (N, C), weight (OC, C)
  MS_TRY(checkBf16(weight, "linearBackwardT: weight"));
  if (N <= 0 || C <= 0 || OC <= 0) return Status::ok();
  if (dinp || dweight) {
    MS_GEMM_OPERAND(dy, dout, size_t(N) * OC, kSlotD, stream, "linearBackwardT: dout");
    if (dinp) {
      MS_TENSOR_OPERAND(w, weight, size_t(OC) * C, kSlotW, stream, "linearBackwardT: weight");
      // dinp += dout @ weight  <=>  dinp^T (C, N) += weight^T (C, OC) @ dout^T (OC, N)
      MS_TRY(gemm(stream, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, 1.0f, w, C, 0, dy, OC, 0, 1.0f, dinp, C, 0, 1,
                  "linearBackwardT: dinp"));
    }
    if (dweight) {
      MS_TENSOR_OPERAND(x, inp, size_t(N) * C, kSlotX, stream, "linearBackwardT: inp");
      // dweight += dout^T @ inp  <=>  dweight^T (C, OC) += inp^T (C, N) @ dout (N, OC)
      MS_TRY(gemm(stream, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, 1.0f, x, C, 0, dy, OC, 0, 1.0f, dweight, C, 0,
                  1, "linearBackwardT: dweight"));
    }
  }
  if (dbias) MS_TRY(detail::columnSumAccumulate(dbias, dout, N, OC, stream, "linearBackwardT: dbias"));
  return Status::ok();
}

}  // namespace ms::cuda
