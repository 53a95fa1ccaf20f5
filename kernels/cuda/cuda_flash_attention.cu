// Fused multi-head attention that never materialises the (T, T) scores, after FlashAttention (Dao, Fu, Ermon,
// Rudra, Re 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness", algorithm 1,
// and Dao 2023, "FlashAttention-2", algorithm 1 for the forward and algorithm 2's recomputation for the
// backward); written for this engine, not taken from either code base. Layout as kernels/cpu/attention.cpp:
// qkv (B, T, 3C) with [q | k | v] per position, head h at channels [h*hs, (h+1)*hs), out (B, T, C).
//
// Forward: a block takes kWarps consecutive query rows of one (batch, head), a warp per row, and walks the
// keys in tiles of 32 staged in shared memory (one key per lane). For each tile a lane computes its key's
// score, the warp keeps the running maximum m and sum l of the online softmax (Milakov and Gimelshein 2018)
// and rescales its output accumulator by exp(m_old - m_new) before adding p @ v (each lane owns head
// dimensions lane, lane + 32, ...). m starts at -infinity and a tile that leaves the row's maximum at
// -infinity (nothing visible yet) is skipped, so no exp(-inf - -inf) is ever formed. The row's log-sum-exp
// m + log(l) is saved (B, H, T); a row with no visible key (impossible for causal or bidirectional
// attention with T >= 1, guarded anyway) gets output 0 and log-sum-exp +infinity, which makes every
// recomputed probability 0.
//
// Backward: D = rowsum(dout * out) (B, H, T) first (equal to sum_j dP_ij P_ij, the softmax backward's dot),
// then the probabilities are recomputed from q, k and the log-sum-exp, P = exp(scale q.k - lse), with
// dP = dout . v and dS = P * (dP - D): one kernel gives a warp per KEY and walks the query tiles to sum
// dk += scale dS^T q and dv += P^T dout, another gives a warp per QUERY and walks the key tiles to sum
// dq += scale dS k. Every output element is owned by one thread, so the backward needs no atomics and is
// deterministic (FlashAttention-2 instead adds dq with atomics from the key-parallel loop); the price is
// computing P and dS twice. All gradients ACCUMULATE into dqkv.
//
// Causal masking: a row i sees keys j <= i; tiles wholly beyond a block's last row are not visited and the
// rest are masked per element. T need not be a multiple of anything: out-of-range keys and queries are
// zero-filled in shared memory and masked. Everything is fp32; in GemmMode::Bf16 the operands of what are
// GEMMs in the materialised path (q, k, v, dout, the probabilities before P @ v and P^T @ dout, dS before
// its products) are rounded to bf16 (nearest even) where they are loaded or formed, and every sum stays fp32,
// which gives the materialised bf16 path's products. Head sizes up to kFlashAttentionMaxHeadSize.
//
// Dispatch: in GemmMode::Bf16 the public functions hand head sizes 16, 32, 64, 96 and 128 to the tensor-core
// kernels of cuda_flash_attention_mma.cu (same contract, bf16 mma.sync; the wmma kernels of
// cuda_flash_attention_tc.cu only when named), unless MESHSTUDIO_FLASH_TC=0; the backward's D =
// rowsum(dout * out) comes from flashRowDotKernel below for all of them.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_flash_attention_tc.h"
#include "kernels/cuda/cuda_scalar_tiles.cuh"

namespace ms::cuda {
namespace {

using detail::kWarpSize;

constexpr int kWarps = detail::kScalarWarps;                      // rows per block, one per warp
constexpr int kTile = detail::kScalarTile;                        // tile rows, one per lane
constexpr int kMaxDims = kFlashAttentionMaxHeadSize / kWarpSize;  // head dimensions per lane
constexpr int kThreads = kWarps * kWarpSize;
constexpr unsigned kFull = 0xffffffffu;
constexpr unsigned kMaxGridY = 65535;

static_assert(kFlashAttentionMaxHeadSize % kWarpSize == 0, "head dimensions are dealt out by lane");

// The tiles' helpers (roundIf, tileStride, sharedBytes, loadTile, loadRow, dot, accumulateTile):
// cuda_scalar_tiles.cuh, shared with ring attention's kernels.
using detail::accumulateTile;
using detail::dot;
using detail::loadRow;
using detail::loadTile;
using detail::roundIf;
using detail::sharedBytes;
using detail::tileStride;

// grid (B * H, ceil(T / kWarps)): out (B, T, C), lse (B, H, T).
__global__ void __launch_bounds__(kThreads)
    flashForwardKernel(float* out, float* lse, const float* qkv, int T, int C, int H, int hs, float scale,
                       bool causal, bool bf16) {
  extern __shared__ float smem[];
  const int ld = tileStride(hs);
  float* kS = smem;             // (kTile, ld)
  float* vS = kS + kTile * ld;  // (kTile, ld)
  float* qW = vS + kTile * ld;  // (kWarps, hs)
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int bh = blockIdx.x;
  const int b = bh / H;
  const int h = bh - b * H;
  const size_t C3 = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * C3 + size_t(h) * hs;  // q of (b, position 0, h)
  const int i0 = blockIdx.y * kWarps;
  const int i = i0 + warp;
  const bool active = i < T;  // warp-uniform
  float* q = qW + warp * hs;
  loadRow(q, base + size_t(active ? i : 0) * C3, hs, active, bf16);

  float o[kMaxDims];
#pragma unroll
  for (int r = 0; r < kMaxDims; ++r) o[r] = 0.0f;
  float m = -INFINITY;                                // running maximum of the row's visible scores
  float l = 0.0f;                                     // running sum of exp(score - m)
  const int keys = causal ? min(T, i0 + kWarps) : T;  // block-uniform: every thread runs every barrier
  for (int j0 = 0; j0 < keys; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed (and q is written before its first use)
    loadTile(kS, base + C, C3, j0, T, hs, bf16);
    loadTile(vS, base + 2 * C, C3, j0, T, hs, bf16);
    __syncthreads();
    if (!active) continue;
    const int j = j0 + lane;
    float s = -INFINITY;
    if (j < T && (!causal || j <= i)) s = dot(q, kS + lane * ld, hs) * scale;
    const float mNew = fmaxf(m, detail::warpMax(s));
    if (mNew == -INFINITY) continue;     // nothing visible yet: warp-uniform, l and o stay 0
    const float alpha = expf(m - mNew);  // 0 on the first visible tile (m = -inf, mNew finite)
    const float p = expf(s - mNew);      // 0 where masked
    l = l * alpha + detail::warpSum(p);
#pragma unroll
    for (int r = 0; r < kMaxDims; ++r) o[r] *= alpha;
    accumulateTile(o, roundIf(p, bf16), vS, hs);
    m = mNew;
  }
  if (!active) return;
  const bool any = l > 0.0f;
  const float inv = any ? 1.0f / l : 0.0f;
  float* orow = out + (size_t(b) * T + i) * C + size_t(h) * hs;
#pragma unroll
  for (int r = 0; r < kMaxDims; ++r) {
    const int d = lane + r * kWarpSize;
    if (d < hs) orow[d] = o[r] * inv;
  }
  if (lane == 0) lse[size_t(bh) * T + i] = any ? m + logf(l) : INFINITY;
}

// D (B, H, T) = rowsum(dout * out) per head; a warp per row. dout rounded in bf16 mode (it is the dP GEMM's
// operand there).
__global__ void flashRowDotKernel(float* D, const float* dout, const float* out, size_t rows, int T, int C,
                                  int H, int hs, bool bf16) {
  const int lane = threadIdx.x % kWarpSize;
  const size_t row = size_t(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // whole warp
  const size_t bh = row / size_t(T);
  const size_t i = row - bh * T;
  const size_t b = bh / size_t(H);
  const size_t h = bh - b * H;
  const size_t off = (b * T + i) * C + h * hs;
  float s = 0.0f;
  for (int d = lane; d < hs; d += kWarpSize) s = fmaf(roundIf(dout[off + d], bf16), out[off + d], s);
  s = detail::warpSum(s);
  if (lane == 0) D[row] = s;
}

// grid (B * H, ceil(T / kWarps)), a warp per KEY j: dk_j += scale sum_i dS_ij q_i, dv_j += sum_i P_ij dout_i.
__global__ void __launch_bounds__(kThreads)
    flashBackwardKVKernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* D,
                          int T, int C, int H, int hs, float scale, bool causal, bool bf16) {
  extern __shared__ float smem[];
  const int ld = tileStride(hs);
  float* qS = smem;                // (kTile, ld) queries
  float* gS = qS + kTile * ld;     // (kTile, ld) their output gradients
  float* kW = gS + kTile * ld;     // (kWarps, hs)
  float* vW = kW + kWarps * hs;    // (kWarps, hs)
  float* lseS = vW + kWarps * hs;  // (kTile) the queries' log-sum-exp
  float* dotS = lseS + kTile;      // (kTile) and their D
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int bh = blockIdx.x;
  const int b = bh / H;
  const int h = bh - b * H;
  const size_t C3 = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * C3 + size_t(h) * hs;
  const float* gBase = dout + size_t(b) * T * C + size_t(h) * hs;
  const float* lseRow = lse + size_t(bh) * T;
  const float* dRow = D + size_t(bh) * T;
  const int j0 = blockIdx.y * kWarps;
  const int j = j0 + warp;
  const bool active = j < T;
  const float* kvRow = base + size_t(active ? j : 0) * C3;
  float* k = kW + warp * hs;
  float* v = vW + warp * hs;
  loadRow(k, kvRow + C, hs, active, bf16);
  loadRow(v, kvRow + 2 * C, hs, active, bf16);

  float dk[kMaxDims], dv[kMaxDims];
#pragma unroll
  for (int r = 0; r < kMaxDims; ++r) dk[r] = dv[r] = 0.0f;
  // Causal: only queries i >= j see key j; start at the tile holding the block's first key.
  const int first = causal ? j0 / kTile * kTile : 0;
  for (int i0 = first; i0 < T; i0 += kTile) {
    __syncthreads();
    loadTile(qS, base, C3, i0, T, hs, bf16);
    loadTile(gS, gBase, C, i0, T, hs, bf16);
    if (threadIdx.x < kTile) {
      const int i = i0 + threadIdx.x;
      lseS[threadIdx.x] = i < T ? lseRow[i] : INFINITY;
      dotS[threadIdx.x] = i < T ? dRow[i] : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
    const int i = i0 + lane;
    float p = 0.0f, ds = 0.0f;
    if (i < T && (!causal || j <= i)) {
      p = expf(dot(qS + lane * ld, k, hs) * scale - lseS[lane]);
      const float dp = dot(gS + lane * ld, v, hs);
      ds = p * (dp - dotS[lane]);
    }
    accumulateTile(dv, roundIf(p, bf16), gS, hs);
    accumulateTile(dk, roundIf(ds, bf16), qS, hs);
  }
  if (!active) return;
  float* dkRow = dqkv + (size_t(b) * T + j) * C3 + C + size_t(h) * hs;
  float* dvRow = dkRow + C;
#pragma unroll
  for (int r = 0; r < kMaxDims; ++r) {
    const int d = lane + r * kWarpSize;
    if (d < hs) {
      dkRow[d] += scale * dk[r];
      dvRow[d] += dv[r];
    }
  }
}

// grid (B * H, ceil(T / kWarps)), a warp per QUERY i: dq_i += scale sum_j dS_ij k_j.
__global__ void __launch_bounds__(kThreads)
    flashBackwardQKernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* D,
                         int T, int C, int H, int hs, float scale, bool causal, bool bf16) {
  extern __shared__ float smem[];
  const int ld = tileStride(hs);
  float* kS = smem;              // (kTile, ld)
  float* vS = kS + kTile * ld;   // (kTile, ld)
  float* qW = vS + kTile * ld;   // (kWarps, hs)
  float* gW = qW + kWarps * hs;  // (kWarps, hs)
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int bh = blockIdx.x;
  const int b = bh / H;
  const int h = bh - b * H;
  const size_t C3 = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * C3 + size_t(h) * hs;
  const int i0 = blockIdx.y * kWarps;
  const int i = i0 + warp;
  const bool active = i < T;
  const int ia = active ? i : 0;
  float* q = qW + warp * hs;
  float* g = gW + warp * hs;
  loadRow(q, base + size_t(ia) * C3, hs, active, bf16);
  loadRow(g, dout + (size_t(b) * T + ia) * C + size_t(h) * hs, hs, active, bf16);
  const float rowLse = active ? lse[size_t(bh) * T + i] : INFINITY;
  const float rowD = active ? D[size_t(bh) * T + i] : 0.0f;

  float dq[kMaxDims];
#pragma unroll
  for (int r = 0; r < kMaxDims; ++r) dq[r] = 0.0f;
  const int keys = causal ? min(T, i0 + kWarps) : T;
  for (int j0 = 0; j0 < keys; j0 += kTile) {
    __syncthreads();
    loadTile(kS, base + C, C3, j0, T, hs, bf16);
    loadTile(vS, base + 2 * C, C3, j0, T, hs, bf16);
    __syncthreads();
    if (!active) continue;
    const int j = j0 + lane;
    float ds = 0.0f;
    if (j < T && (!causal || j <= i)) {
      const float p = expf(dot(q, kS + lane * ld, hs) * scale - rowLse);
      const float dp = dot(g, vS + lane * ld, hs);
      ds = p * (dp - rowD);
    }
    accumulateTile(dq, roundIf(ds, bf16), kS, hs);
  }
  if (!active) return;
  float* dqRow = dqkv + (size_t(b) * T + i) * C3 + size_t(h) * hs;
#pragma unroll
  for (int r = 0; r < kMaxDims; ++r) {
    const int d = lane + r * kWarpSize;
    if (d < hs) dqRow[d] += scale * dq[r];
  }
}

Status checkFlashShape(int B, int T, int C, int H, const char* what) {
  if (C % H != 0)
    return Status::error(std::string(what) + ": channels " + std::to_string(C) + " not divisible by heads " +
                         std::to_string(H));
  if (C / H > kFlashAttentionMaxHeadSize)
    return Status::error(std::string(what) + ": head size " + std::to_string(C / H) + " above " +
                         std::to_string(kFlashAttentionMaxHeadSize));
  if ((size_t(T) + kWarps - 1) / kWarps > kMaxGridY)
    return Status::error(std::string(what) + ": sequence length " + std::to_string(T) + " too long");
  if (size_t(B) * H > size_t(INT32_MAX))
    return Status::error(std::string(what) + ": too many (batch, head) pairs");
  return Status::ok();
}

dim3 flashGrid(int B, int T, int H) {
  return dim3(unsigned(B * H), unsigned((T + kWarps - 1) / kWarps));
}

// MESHSTUDIO_FLASH_TC, parsed on first use and constant afterwards: a run's kernels must not change under it.
// (A write-once constant of the process, like its environment, not mutable state.)
const Expected<bool>& tensorCoreSwitch() {
  static const Expected<bool> value = parseFlashTensorCoreSwitch(std::getenv(kFlashTensorCoreEnv));
  return value;
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Why the tensor-core kernel cannot run this call, or "" when it can.
std::string tensorCoreObstacle(int hs, std::initializer_list<const void*> buffers) {
  if (!detail::flashTcHeadSize(hs))
    return "head size " + std::to_string(hs) + " is not one of 16, 32, 64, 96, 128";
  for (const void* p : buffers)
    if (!aligned16(p)) return "a buffer is not 16-byte aligned";
  if (!detail::flashTcDevice()) return "the device is older than compute capability 8.0";
  return {};
}

// The kernel the plain entry points run: TensorCore in GemmMode::Bf16 when it applies and is not switched
// off.
Expected<FlashAttentionKernel> chooseKernel(int hs, std::initializer_list<const void*> buffers) {
  const Expected<bool>& allowed = tensorCoreSwitch();
  if (!allowed) return allowed.status();
  if (*allowed && gemmMode() == GemmMode::Bf16 && tensorCoreObstacle(hs, buffers).empty())
    return FlashAttentionKernel::TensorCore;
  return FlashAttentionKernel::Scalar;
}

}  // namespace

Expected<bool> parseFlashTensorCoreSwitch(const char* value) {
  if (value == nullptr || std::strcmp(value, "1") == 0) return true;
  if (std::strcmp(value, "0") == 0) return false;
  return Status::error(std::string(kFlashTensorCoreEnv) + "=\"" + value +
                       "\": expected 0 (scalar attention kernels only) or 1 (tensor cores in bf16 mode, the "
                       "default when unset)");
}

Status flashAttentionForwardWith(FlashAttentionKernel kernel, float* out, float* lse, const float* qkv, int B,
                                 int T, int C, int H, bool causal, cudaStream_t stream) {
  if (B <= 0 || T <= 0 || C <= 0 || H <= 0) return Status::ok();
  MS_TRY(checkFlashShape(B, T, C, H, "flashAttentionForward"));
  const int hs = C / H;
  if (kernel != FlashAttentionKernel::Scalar) {
    const std::string obstacle = tensorCoreObstacle(hs, {out, qkv});
    if (!obstacle.empty()) return Status::error("flashAttentionForward: no tensor-core kernel: " + obstacle);
    if (kernel == FlashAttentionKernel::TensorCoreWmma)
      return detail::flashTcForward(out, lse, qkv, B, T, C, H, causal, stream);
    return detail::flashMmaForward(out, lse, qkv, B, T, C, H, causal, stream);
  }
  const float scale = 1.0f / std::sqrt(float(hs));
  const bool bf16 = gemmMode() == GemmMode::Bf16;
  flashForwardKernel<<<flashGrid(B, T, H), kThreads, sharedBytes(hs), stream>>>(out, lse, qkv, T, C, H, hs,
                                                                                scale, causal, bf16);
  return checkLaunch("flashAttentionForward");
}

Status flashAttentionBackwardWith(FlashAttentionKernel kernel, float* dqkv, float* scratch, const float* dout,
                                  const float* qkv, const float* out, const float* lse, int B, int T, int C,
                                  int H, bool causal, cudaStream_t stream) {
  if (B <= 0 || T <= 0 || C <= 0 || H <= 0) return Status::ok();
  MS_TRY(checkFlashShape(B, T, C, H, "flashAttentionBackward"));
  const int hs = C / H;
  const bool tensorCores = kernel != FlashAttentionKernel::Scalar;
  if (tensorCores) {
    const std::string obstacle = tensorCoreObstacle(hs, {dqkv, dout, qkv});
    if (!obstacle.empty()) return Status::error("flashAttentionBackward: no tensor-core kernel: " + obstacle);
  }
  const float scale = 1.0f / std::sqrt(float(hs));
  // The tensor-core kernels always take bf16 operands: dout is rounded in D as well.
  const bool bf16 = tensorCores || gemmMode() == GemmMode::Bf16;
  const size_t rows = size_t(B) * H * T;
  float* D = scratch;  // (B, H, T)
  flashRowDotKernel<<<unsigned((rows + kWarps - 1) / kWarps), kThreads, 0, stream>>>(D, dout, out, rows, T, C,
                                                                                     H, hs, bf16);
  MS_TRY(checkLaunch("flashAttentionBackward: rowsum(dout * out)"));
  if (kernel == FlashAttentionKernel::TensorCoreWmma)
    return detail::flashTcBackward(dqkv, dout, qkv, lse, D, B, T, C, H, causal, stream);
  if (tensorCores) return detail::flashMmaBackward(dqkv, dout, qkv, lse, D, B, T, C, H, causal, stream);
  const dim3 grid = flashGrid(B, T, H);
  flashBackwardKVKernel<<<grid, kThreads, sharedBytes(hs), stream>>>(dqkv, dout, qkv, lse, D, T, C, H, hs,
                                                                     scale, causal, bf16);
  MS_TRY(checkLaunch("flashAttentionBackward: dk, dv"));
  flashBackwardQKernel<<<grid, kThreads, sharedBytes(hs), stream>>>(dqkv, dout, qkv, lse, D, T, C, H, hs,
                                                                    scale, causal, bf16);
  return checkLaunch("flashAttentionBackward: dq");
}

Status flashAttentionForward(float* out, float* lse, const float* qkv, int B, int T, int C, int H,
                             bool causal, cudaStream_t stream) {
  if (B <= 0 || T <= 0 || C <= 0 || H <= 0) return Status::ok();
  MS_TRY(checkFlashShape(B, T, C, H, "flashAttentionForward"));
  const Expected<FlashAttentionKernel> kernel = chooseKernel(C / H, {out, qkv});
  if (!kernel) return kernel.status().withContext("flashAttentionForward");
  return flashAttentionForwardWith(*kernel, out, lse, qkv, B, T, C, H, causal, stream);
}

Status flashAttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                              const float* out, const float* lse, int B, int T, int C, int H, bool causal,
                              cudaStream_t stream) {
  if (B <= 0 || T <= 0 || C <= 0 || H <= 0) return Status::ok();
  MS_TRY(checkFlashShape(B, T, C, H, "flashAttentionBackward"));
  const Expected<FlashAttentionKernel> kernel = chooseKernel(C / H, {dqkv, dout, qkv});
  if (!kernel) return kernel.status().withContext("flashAttentionBackward");
  return flashAttentionBackwardWith(*kernel, dqkv, scratch, dout, qkv, out, lse, B, T, C, H, causal, stream);
}

}  // namespace ms::cuda
