// Shared by the two tensor-core FlashAttention files (cuda_flash_attention_tc.cu: wmma;
// cuda_flash_attention_mma.cu: mma.sync): staging fp32 activations into bf16 shared-memory tiles, and the
// visibility predicate of the scalar kernel. Device code only; included by .cu files of kernels/cuda only.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>

namespace ms::cuda::detail {

// Rows [r0, r0 + Rows) of one head (row stride `stride` floats, D columns from src) into a (Rows, ld) bf16
// tile, rounded to nearest even; zeros for rows past T. The whole block (Threads threads) calls it. src and
// stride are multiples of 4 floats and 16-byte aligned (host-checked), so rows are read as float4; ld is a
// multiple of 4.
template <int D, int Rows, int Threads>
__device__ inline void loadTileBf16(__nv_bfloat16* tile, int ld, const float* src, size_t stride, int r0,
                                    int T) {
  constexpr int kVec = D / 4;  // float4 per row
  for (int idx = threadIdx.x; idx < Rows * kVec; idx += Threads) {
    const int rr = idx / kVec;
    const int c = (idx - rr * kVec) * 4;
    const int r = r0 + rr;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < T) v = *reinterpret_cast<const float4*>(src + size_t(r) * stride + c);
    __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(tile + rr * ld + c);  // 8-byte aligned
    dst[0] = __floats2bfloat162_rn(v.x, v.y);
    dst[1] = __floats2bfloat162_rn(v.z, v.w);
  }
}

// The scalar kernel's mask: query i sees key j.
__device__ inline bool flashVisible(int i, int j, int T, bool causal) {
  return j < T && (!causal || j <= i);
}

}  // namespace ms::cuda::detail
