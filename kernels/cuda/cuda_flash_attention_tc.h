// Internal: the tensor-core (bf16 MMA) FlashAttention kernels of cuda_flash_attention_tc.cu (wmma) and
// cuda_flash_attention_mma.cu (mma.sync), launched by
// cuda_flash_attention.cu, which owns the public entry points (cuda_ops.h), validates shapes and picks the
// kernel. Not part of the public API; included by .cu files of kernels/cuda only.
#pragma once

#include <cuda_runtime_api.h>

#include "common/status.h"

namespace ms::cuda::detail {

// Head sizes the tensor-core kernels are instantiated for: 16, 32, 64, 96 and 128 (the code takes any
// multiple of 16 up to 128; each instantiation costs compile time, and these are the ones tested).
bool flashTcHeadSize(int hs);
// Whether the current device can run them (compute capability 8.0 or newer: bf16 MMAs). False when the
// device cannot be queried (the scalar kernel's launch then reports why).
bool flashTcDevice();

// The preconditions, checked by the caller: flashTcHeadSize(C / H), C % H == 0, B, T, C, H > 0, T within
// the scalar kernel's grid limit, and qkv, out, dout, dqkv 16-byte aligned (float4 loads and stores).
// out (B, T, C) and lse (B, H, T) overwritten.
Status flashTcForward(float* out, float* lse, const float* qkv, int B, int T, int C, int H, bool causal,
                      cudaStream_t stream);
// dqkv (B, T, 3C) +=. D (B, H, T) = rowsum(bf16(dout) * out), computed by the caller beforehand.
Status flashTcBackward(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* D,
                       int B, int T, int C, int H, bool causal, cudaStream_t stream);

// The mma.sync kernels of cuda_flash_attention_mma.cu: the same head sizes, preconditions and contract.
Status flashMmaForward(float* out, float* lse, const float* qkv, int B, int T, int C, int H, bool causal,
                       cudaStream_t stream);
Status flashMmaBackward(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* D,
                        int B, int T, int C, int H, bool causal, cudaStream_t stream);

}  // namespace ms::cuda::detail
