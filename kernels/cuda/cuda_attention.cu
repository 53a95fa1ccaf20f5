// Multi-head scaled dot-product attention (Vaswani et al. 2017, section 3.2.1) with the materialised
// softmax, the layout of kernels/cpu/attention.cpp: per batch element, cuBLAS strided-batched GEMMs over the
// H heads read q, k, v in place from qkv (B, T, 3C) (head h at column offset h*hs, row stride 3C), and one
// warp per row computes the softmax (and its backward) over att (B, H, T, T). Causal rows are computed in
// full by the GEMMs and masked by the softmax, which writes exact zeros above the diagonal, so the products
// that follow see zeros there. Simple and O(T^2) in memory; the CUDA backend uses it for head sizes the fused
// kernel (cuda_flash_attention.cu) does not take.
// cuBLAS is column-major: a row-major (R, K) view with row stride ld is, read column-major, its transpose.
// In GemmMode::Bf16 every GEMM reads bf16 copies (detail::gemmOperand): qkv and dout whole, the
// probabilities after the softmax and the pre-softmax gradient after the softmax backward, each converted
// once per call on the stream; the scores, softmax, its backward and every result stay fp32, and the saved
// probabilities (att) are the fp32 ones.
#include <cmath>
#include <string>

#include "kernels/cuda/cuda_common.cuh"

namespace ms::cuda {
namespace {

using detail::gemm;
using detail::kSlotD;
using detail::kSlotW;
using detail::kSlotX;
using detail::kWarpSize;

constexpr int kRowsPerBlock = detail::kBlockSize / kWarpSize;

// att rows (rows, T) hold scores; each becomes softmax over its first len entries, zeros after.
__global__ void softmaxRowsKernel(float* att, size_t rows, int T, bool causal) {
  const int lane = threadIdx.x % kWarpSize;
  const size_t row = size_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // whole warp
  const int len = causal ? int(row % size_t(T)) + 1 : T;
  float* a = att + row * T;
  float maxv = -INFINITY;
  for (int j = lane; j < len; j += kWarpSize) maxv = fmaxf(maxv, a[j]);
  maxv = detail::warpMax(maxv);
  float sum = 0.0f;
  for (int j = lane; j < len; j += kWarpSize) sum += expf(a[j] - maxv);
  const float inv = 1.0f / detail::warpSum(sum);
  for (int j = lane; j < T; j += kWarpSize) a[j] = j < len ? expf(a[j] - maxv) * inv : 0.0f;
}

// Softmax backward in place: d = att * (d - sum_j d * att) over the first len entries, zeros after.
__global__ void softmaxRowsBackwardKernel(float* d, const float* att, size_t rows, int T, bool causal) {
  const int lane = threadIdx.x % kWarpSize;
  const size_t row = size_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;
  const int len = causal ? int(row % size_t(T)) + 1 : T;
  float* dr = d + row * T;
  const float* ar = att + row * T;
  float dot = 0.0f;
  for (int j = lane; j < len; j += kWarpSize) dot += dr[j] * ar[j];
  dot = detail::warpSum(dot);
  for (int j = lane; j < T; j += kWarpSize) dr[j] = j < len ? ar[j] * (dr[j] - dot) : 0.0f;
}

Status checkShape(int C, int H, const char* what) {
  if (C % H == 0) return Status::ok();
  return Status::error(std::string(what) + ": channels " + std::to_string(C) + " not divisible by heads " +
                       std::to_string(H));
}

unsigned rowBlocks(size_t rows) {
  return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

Status attentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int H, bool causal,
                        cudaStream_t stream) {
  // out (B, T, C), att (B, H, T, T), qkv (B, T, 3C)
  if (B <= 0 || T <= 0 || C <= 0 || H <= 0) return Status::ok();
  MS_TRY(checkShape(C, H, "attentionForward"));
  const int hs = C / H;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
  const long long TT = (long long)T * T;
  const size_t rows = size_t(B) * H * T;
  MS_GEMM_OPERAND(x, qkv, size_t(B) * T * C3, kSlotX, stream, "attentionForward: qkv");
  for (int b = 0; b < B; b++) {
    // q, k: (T, hs) per head, row stride 3C, head stride hs
    const detail::GemmOperand q = x.at(size_t(b) * T * C3);
    const detail::GemmOperand k = q.at(C);
    float* a = att + size_t(b) * H * TT;  // (H, T, T)
    // scores (T, T) = scale * q @ k^T  <=>  scores^T = scale * k (T, hs) @ q^T (hs, T)
    MS_TRY(gemm(stream, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, k, C3, hs, q, C3, hs, 0.0f, a, T, TT, H,
                "attentionForward: q @ k^T"));
  }
  softmaxRowsKernel<<<rowBlocks(rows), detail::kBlockSize, 0, stream>>>(att, rows, T, causal);
  MS_TRY(checkLaunch("attentionForward: softmax"));
  MS_GEMM_OPERAND(p, att, rows * T, kSlotD, stream, "attentionForward: att");
  for (int b = 0; b < B; b++) {
    const detail::GemmOperand v = x.at(size_t(b) * T * C3 + 2 * C);
    const detail::GemmOperand a = p.at(size_t(b) * H * TT);
    float* o = out + size_t(b) * T * C;  // (T, hs) per head, row stride C
    // out = att @ v  <=>  out^T (hs, T) = v^T (hs, T) @ att^T (T, T)
    MS_TRY(gemm(stream, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, v, C3, hs, a, T, TT, 0.0f, o, C, hs, H,
                "attentionForward: att @ v"));
  }
  return Status::ok();
}

Status attentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                         int B, int T, int C, int H, bool causal, cudaStream_t stream) {
  // dqkv (B, T, 3C), scratch (B, H, T, T), dout (B, T, C), qkv (B, T, 3C), att (B, H, T, T)
  if (B <= 0 || T <= 0 || C <= 0 || H <= 0) return Status::ok();
  MS_TRY(checkShape(C, H, "attentionBackward"));
  const int hs = C / H;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
  const long long TT = (long long)T * T;
  const size_t rows = size_t(B) * H * T;
  MS_GEMM_OPERAND(x, qkv, size_t(B) * T * C3, kSlotX, stream, "attentionBackward: qkv");
  MS_GEMM_OPERAND(dy, dout, size_t(B) * T * C, kSlotW, stream, "attentionBackward: dout");
  {
    MS_GEMM_OPERAND(p, att, rows * T, kSlotD, stream, "attentionBackward: att");
    for (int b = 0; b < B; b++) {
      const detail::GemmOperand v = x.at(size_t(b) * T * C3 + 2 * C);
      float* dv = dqkv + size_t(b) * T * C3 + 2 * C;
      const detail::GemmOperand a = p.at(size_t(b) * H * TT);
      float* d = scratch + size_t(b) * H * TT;
      const detail::GemmOperand dO = dy.at(size_t(b) * T * C);
      // datt (T, T) = dout @ v^T  <=>  datt^T = v (T, hs) @ dout^T (hs, T)
      MS_TRY(gemm(stream, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, v, C3, hs, dO, C, hs, 0.0f, d, T, TT, H,
                  "attentionBackward: dout @ v^T"));
      // dv += att^T @ dout  <=>  dv^T (hs, T) += dout^T (hs, T) @ att (T, T)
      MS_TRY(gemm(stream, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, dO, C, hs, a, T, TT, 1.0f, dv, C3, hs, H,
                  "attentionBackward: dv"));
    }
  }
  softmaxRowsBackwardKernel<<<rowBlocks(rows), detail::kBlockSize, 0, stream>>>(scratch, att, rows, T,
                                                                                causal);
  MS_TRY(checkLaunch("attentionBackward: softmax"));
  // The pre-softmax gradient reuses the probabilities' slot: the dv GEMMs that read those are enqueued
  // before this conversion on the same stream.
  MS_GEMM_OPERAND(dpre, scratch, rows * T, kSlotD, stream, "attentionBackward: dpre");
  for (int b = 0; b < B; b++) {
    const detail::GemmOperand q = x.at(size_t(b) * T * C3);
    const detail::GemmOperand k = q.at(C);
    float* dq = dqkv + size_t(b) * T * C3;
    float* dk = dq + C;
    const detail::GemmOperand d = dpre.at(size_t(b) * H * TT);  // dpre (H, T, T)
    // dq += scale * dpre @ k  <=>  dq^T (hs, T) += scale * k^T (hs, T) @ dpre^T (T, T)
    MS_TRY(gemm(stream, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, scale, k, C3, hs, d, T, TT, 1.0f, dq, C3, hs, H,
                "attentionBackward: dq"));
    // dk += scale * dpre^T @ q  <=>  dk^T (hs, T) += scale * q^T (hs, T) @ dpre (T, T)
    MS_TRY(gemm(stream, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, scale, q, C3, hs, d, T, TT, 1.0f, dk, C3, hs, H,
                "attentionBackward: dk"));
  }
  return Status::ok();
}

}  // namespace ms::cuda
