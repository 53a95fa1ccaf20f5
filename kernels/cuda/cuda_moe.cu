// Mixture-of-experts row movement on the GPU: the ops of kernels/cpu/moe.cpp (its reference). A token's row
// gathered into its expert's batch (scaled or not), the expert's output added back scaled by the token's
// gate, and the gates' gradients as row dot products. The index lists are int32 device memory, chosen on the
// host.
// - gatherRows and scatterAddRows give each row to a block (a grid-stride loop over the rows), its threads
//   striding over the columns: coalesced reads and writes of whole rows. scatterAddRows' destinations are
//   distinct within a call (the caller's promise), so no two blocks write one row: no atomics.
// - rowDots gives each row to a warp and sums it in the CPU's order (kernels/cpu/vec_math.h, laneSum): lane l
//   accumulates columns l, l + 32, ... of the row's whole 32-column chunks, the columns past the last whole
//   chunk are summed first, then the 32 lanes' sums are added to them in lane order. The order depends on C
//   alone (deterministic, no atomics), and the sums are the CPU's wherever both sides fuse the same
//   multiply-adds.
#include <string>

#include "kernels/cuda/cuda_common.cuh"

namespace ms::cuda {
namespace {

using detail::kWarpSize;

constexpr int kRowsPerBlock = detail::kBlockSize / kWarpSize;

// Rows of the grid-stride loop over rows: n up to the grid's cap.
unsigned rowLoopBlocks(int n) {
  return unsigned(size_t(n) < detail::kMaxBlocks ? size_t(n) : detail::kMaxBlocks);
}

// Threads of a block over a row of C columns: whole warps, at most a block's worth (short rows do not leave
// most of a 256-thread block idle).
int rowThreads(int C) {
  const int warps = (C + kWarpSize - 1) / kWarpSize;
  return warps * kWarpSize < detail::kBlockSize ? warps * kWarpSize : detail::kBlockSize;
}

// dst (n, C) = k * src[idx[r]], k = scale[r] (scale nullable: 1, which multiplies exactly).
__global__ void gatherRowsKernel(float* dst, const float* src, const int32_t* idx, const float* scale, int n,
                                 int C) {
  for (int r = blockIdx.x; r < n; r += gridDim.x) {
    const float* s = src + size_t(idx[r]) * C;
    float* d = dst + size_t(r) * C;
    const float k = scale ? scale[r] : 1.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) d[c] = k * s[c];
  }
}

// dst[idx[r]] += k * src[r]: the rows idx[r] of one call are distinct, so each is one block's alone.
__global__ void scatterAddRowsKernel(float* dst, const float* src, const int32_t* idx, const float* scale,
                                     int n, int C) {
  for (int r = blockIdx.x; r < n; r += gridDim.x) {
    const float* s = src + size_t(r) * C;
    float* d = dst + size_t(idx[r]) * C;
    const float k = scale ? scale[r] : 1.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) d[c] += k * s[c];
  }
}

// out[r] = <a[idx[r]], b[r]>, a warp per row, in laneSum's order (see the top of the file).
__global__ void rowDotsKernel(float* out, const float* a, const int32_t* idx, const float* b, int n, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int r = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (r >= n) return;  // whole warp
  const float* x = a + size_t(idx[r]) * C;
  const float* y = b + size_t(r) * C;
  const int whole = C - C % kWarpSize;
  float acc = 0.0f;
  for (int c = lane; c < whole; c += kWarpSize) acc += x[c] * y[c];
  // Every lane forms the same sum (the tail's loads are broadcasts); lane 0 writes it.
  float s = 0.0f;
  for (int c = whole; c < C; c++) s += x[c] * y[c];
  for (int l = 0; l < kWarpSize; l++) s += __shfl_sync(0xffffffffu, acc, l);
  if (lane == 0) out[r] = s;
}

// n rows (n >= 0; 0 is a no-op) of C columns (C >= 1), checked whatever n is.
Status rowsStatus(int n, int C, const char* what) {
  if (n < 0)
    return Status::error(std::string(what) + ": the row count must not be negative (got " +
                         std::to_string(n) + ")");
  if (C < 1)
    return Status::error(std::string(what) + ": the row length must be positive (got " + std::to_string(C) +
                         ")");
  return Status::ok();
}

}  // namespace

Status gatherRows(float* dst, const float* src, const int32_t* idx, const float* scale, int n, int C,
                  cudaStream_t stream) {
  // dst (n, C), src (rows, C), idx (n), scale (n) or nullptr
  MS_TRY(rowsStatus(n, C, "gatherRows"));
  if (n == 0) return Status::ok();
  gatherRowsKernel<<<rowLoopBlocks(n), rowThreads(C), 0, stream>>>(dst, src, idx, scale, n, C);
  return checkLaunch("gatherRows");
}

Status scatterAddRows(float* dst, const float* src, const int32_t* idx, const float* scale, int n, int C,
                      cudaStream_t stream) {
  // dst (rows, C), src (n, C), idx (n, distinct), scale (n) or nullptr
  MS_TRY(rowsStatus(n, C, "scatterAddRows"));
  if (n == 0) return Status::ok();
  scatterAddRowsKernel<<<rowLoopBlocks(n), rowThreads(C), 0, stream>>>(dst, src, idx, scale, n, C);
  return checkLaunch("scatterAddRows");
}

Status rowDots(float* out, const float* a, const int32_t* idx, const float* b, int n, int C,
               cudaStream_t stream) {
  // out (n), a (rows, C), idx (n), b (n, C)
  MS_TRY(rowsStatus(n, C, "rowDots"));
  if (n == 0) return Status::ok();
  const unsigned blocks = unsigned((size_t(n) + kRowsPerBlock - 1) / kRowsPerBlock);
  rowDotsKernel<<<blocks, detail::kBlockSize, 0, stream>>>(out, a, idx, b, n, C);
  return checkLaunch("rowDots");
}

}  // namespace ms::cuda
