// bf16 -> fp32 widening (the inverse of roundToBf16 in cuda_blas.cu, exact): a bf16 bit pattern is the top
// half of the fp32 one.
#include "kernels/cuda/cuda_common.cuh"

namespace ms::cuda {
namespace {

__global__ void widenBf16Kernel(float* dst, const uint16_t* src, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = __uint_as_float(uint32_t(src[i]) << 16);
}

}  // namespace

Status widenBf16(float* dst, const uint16_t* src, size_t n, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  widenBf16Kernel<<<detail::gridFor(n), detail::kBlockSize, 0, stream>>>(dst, src, n);
  return checkLaunch("widenBf16");
}

}  // namespace ms::cuda
