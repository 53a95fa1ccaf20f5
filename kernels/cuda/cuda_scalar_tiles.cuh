// Shared by the scalar FlashAttention kernels (cuda_flash_attention.cu) and ring attention's block kernels
// (cuda_ring_attention.cu): fp32 tiles of kScalarTile rows staged in shared memory, kScalarWarps warps a
// block, a warp per row and a lane per staged row. Device code (and sharedBytes, for the launches) only;
// included by .cu files of kernels/cuda only.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>

#include "kernels/cuda/cuda_common.cuh"

namespace ms::cuda::detail {

inline constexpr int kScalarWarps = 8;         // rows (or keys) per block, one per warp
inline constexpr int kScalarTile = kWarpSize;  // staged rows per tile, one per lane
inline constexpr unsigned kFullWarp = 0xffffffffu;

__device__ inline float roundIf(float x, bool bf16) {
  return bf16 ? __bfloat162float(__float2bfloat16_rn(x)) : x;
}

// Shared-memory row stride of a tile: odd, so that lane r reading element d of row r hits bank (r*ld + d)
// mod 32, a different bank for every lane.
__host__ __device__ inline int tileStride(int hs) {
  return hs | 1;
}

// Shared memory of every kernel using these tiles: two tiles (kScalarTile, ld), two per-warp rows
// (kScalarWarps, hs), two per-tile scalars. 41.5 KB at hs = 128 (under the 48 KB a launch may take without
// opting in), 80.5 KB at hs = 256.
inline size_t sharedBytes(int hs) {
  return (2 * size_t(kScalarTile) * tileStride(hs) + 2 * size_t(kScalarWarps) * hs +
          2 * size_t(kScalarTile)) *
         sizeof(float);
}

// Rows [r0, r0 + kScalarTile) of one head (row stride `stride` floats, hs columns from src) into a
// (kScalarTile, ld) tile, rounded in bf16 mode, zeros for rows at or past rowEnd. The whole block calls it.
__device__ inline void loadTile(float* tile, const float* src, size_t stride, int r0, int rowEnd, int hs,
                                bool bf16) {
  const int ld = tileStride(hs);
  for (int idx = threadIdx.x; idx < kScalarTile * hs; idx += blockDim.x) {
    const int rr = idx / hs;
    const int d = idx - rr * hs;
    const int r = r0 + rr;
    tile[rr * ld + d] = r < rowEnd ? roundIf(src[size_t(r) * stride + d], bf16) : 0.0f;
  }
}

// One row of hs floats into a warp's row of shared memory (rounded in bf16 mode; zeros when inactive).
__device__ inline void loadRow(float* dst, const float* src, int hs, bool active, bool bf16) {
  const int lane = threadIdx.x % kWarpSize;
  for (int d = lane; d < hs; d += kWarpSize) dst[d] = active ? roundIf(src[d], bf16) : 0.0f;
}

__device__ inline float dot(const float* a, const float* b, int hs) {
  float s = 0.0f;
  for (int d = 0; d < hs; ++d) s = fmaf(a[d], b[d], s);
  return s;
}

// acc[r] (head dimension lane + 32 r) += sum over the tile's rows rr of coef(rr) * tile[rr][dimension], coef
// being each lane's own value broadcast from lane rr.
template <int kDims>
__device__ inline void accumulateTile(float (&acc)[kDims], float coef, const float* tile, int hs) {
  const int lane = threadIdx.x % kWarpSize;
  const int ld = tileStride(hs);
  for (int rr = 0; rr < kScalarTile; ++rr) {
    const float c = __shfl_sync(kFullWarp, coef, rr);
    const float* row = tile + rr * ld;
#pragma unroll
    for (int r = 0; r < kDims; ++r) {
      const int d = lane + r * kWarpSize;
      if (d < hs) acc[r] = fmaf(c, row[d], acc[r]);
    }
  }
}

}  // namespace ms::cuda::detail
