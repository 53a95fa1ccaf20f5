// Pointwise ops over flat buffers: one grid-stride kernel each, the formulas of kernels/cpu/pointwise.cpp
// (GELU in its sigmoid form, which has no cancellation for negative x). Backward kernels accumulate.
#include "kernels/cuda/cuda_common.cuh"

namespace ms::cuda {
namespace {

// GELU, tanh approximation (Hendrycks & Gimpel 2016, section 2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
// x^3))).
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

#define MS_GRID_STRIDE(i, n) \
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

// gelu(x) and its derivative, shared by the fp32 kernels and the fused bf16 ones so that both compile to
// the same instructions (the same contractions into multiply-adds) and give the same bits.
__device__ __forceinline__ float geluOf(float x) {
  // 0.5 (1 + tanh u) = sigmoid(2u)
  const float u = kGeluScale * (x + kGeluCube * x * x * x);
  return x / (1.0f + expf(-2.0f * u));
}

__device__ __forceinline__ float geluSlope(float x) {
  // d/dx = s + 2 x s (1 - s) du/dx with s = sigmoid(2u), 1 - s = e s, e = exp(-2u).
  const float u = kGeluScale * (x + kGeluCube * x * x * x);
  // Clamped as the CPU's vexp clamps: below x ~ -10, exp(-2u) overflows to inf and e * s = inf * 0 would
  // be NaN; with e finite, s underflows to ~0 and the derivative comes out as the exact ~0.
  const float e = expf(fminf(-2.0f * u, 88.3f));
  const float s = 1.0f / (1.0f + e);
  return s + 2.0f * x * s * (e * s) * kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
}

__global__ void geluForwardKernel(float* out, const float* inp, size_t n) {
  MS_GRID_STRIDE(i, n) out[i] = geluOf(inp[i]);
}

__global__ void geluBackwardKernel(float* dinp, const float* dout, const float* inp, size_t n) {
  MS_GRID_STRIDE(i, n) dinp[i] += geluSlope(inp[i]) * dout[i];
}

// Rounding as cuda_blas.cu's toBf16Kernel rounds (nearest even, __float2bfloat16_rn); widening exact.
__global__ void geluForwardBf16Kernel(__nv_bfloat16* kept, __nv_bfloat16* out, const float* inp, size_t n) {
  MS_GRID_STRIDE(i, n) {
    const __nv_bfloat16 k = __float2bfloat16_rn(inp[i]);
    kept[i] = k;
    out[i] = __float2bfloat16_rn(geluOf(__bfloat162float(k)));
  }
}

__global__ void geluBackwardBf16Kernel(float* dinp, const float* dout, const __nv_bfloat16* kept, size_t n) {
  MS_GRID_STRIDE(i, n) dinp[i] += geluSlope(__bfloat162float(kept[i])) * dout[i];
}

__global__ void reluForwardKernel(float* out, const float* inp, size_t n) {
  MS_GRID_STRIDE(i, n) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

__global__ void reluBackwardKernel(float* dinp, const float* dout, const float* inp, size_t n) {
  MS_GRID_STRIDE(i, n) dinp[i] += inp[i] > 0.0f ? dout[i] : 0.0f;
}

__global__ void tanhForwardKernel(float* out, const float* inp, size_t n) {
  MS_GRID_STRIDE(i, n) out[i] = tanhf(inp[i]);
}

__global__ void tanhBackwardKernel(float* dinp, const float* dout, const float* out, size_t n) {
  MS_GRID_STRIDE(i, n) dinp[i] += dout[i] * (1.0f - out[i] * out[i]);
}

// out may alias a or b: each element is read before it is written, by the same thread.
__global__ void addKernel(float* out, const float* a, const float* b, size_t n) {
  MS_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void accumulateKernel(float* y, const float* x, size_t n) {
  MS_GRID_STRIDE(i, n) y[i] += x[i];
}

__global__ void scaleKernel(float* y, float s, size_t n) {
  MS_GRID_STRIDE(i, n) y[i] *= s;
}

// x (rows, C) += row (C) broadcast over rows; n = rows * C.
__global__ void addRowsKernel(float* x, const float* row, int C, size_t n) {
  MS_GRID_STRIDE(i, n) x[i] += row[i % size_t(C)];
}

#undef MS_GRID_STRIDE

// Launches kernel over n elements on stream and checks the launch; n == 0 launches nothing.
template <typename... KArgs, typename... Args>
Status launchPointwise(void (*kernel)(KArgs...), size_t n, cudaStream_t stream, const char* what,
                       Args... args) {
  if (n == 0) return Status::ok();
  kernel<<<detail::gridFor(n), detail::kBlockSize, 0, stream>>>(args..., n);
  return checkLaunch(what);
}

}  // namespace

Status geluForward(float* out, const float* inp, size_t n, cudaStream_t stream) {
  return launchPointwise(geluForwardKernel, n, stream, "geluForward", out, inp);
}
Status geluForwardBf16(uint16_t* kept, uint16_t* out, const float* inp, size_t n, cudaStream_t stream) {
  return launchPointwise(geluForwardBf16Kernel, n, stream, "geluForwardBf16",
                         reinterpret_cast<__nv_bfloat16*>(kept), reinterpret_cast<__nv_bfloat16*>(out), inp);
}
Status geluBackwardBf16(float* dinp, const float* dout, const uint16_t* kept, size_t n, cudaStream_t stream) {
  return launchPointwise(geluBackwardBf16Kernel, n, stream, "geluBackwardBf16", dinp, dout,
                         reinterpret_cast<const __nv_bfloat16*>(kept));
}
Status geluBackward(float* dinp, const float* dout, const float* inp, size_t n, cudaStream_t stream) {
  return launchPointwise(geluBackwardKernel, n, stream, "geluBackward", dinp, dout, inp);
}
Status reluForward(float* out, const float* inp, size_t n, cudaStream_t stream) {
  return launchPointwise(reluForwardKernel, n, stream, "reluForward", out, inp);
}
Status reluBackward(float* dinp, const float* dout, const float* inp, size_t n, cudaStream_t stream) {
  return launchPointwise(reluBackwardKernel, n, stream, "reluBackward", dinp, dout, inp);
}
Status tanhForward(float* out, const float* inp, size_t n, cudaStream_t stream) {
  return launchPointwise(tanhForwardKernel, n, stream, "tanhForward", out, inp);
}
Status tanhBackward(float* dinp, const float* dout, const float* out, size_t n, cudaStream_t stream) {
  return launchPointwise(tanhBackwardKernel, n, stream, "tanhBackward", dinp, dout, out);
}
Status add(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  return launchPointwise(addKernel, n, stream, "add", out, a, b);
}
Status accumulate(float* y, const float* x, size_t n, cudaStream_t stream) {
  return launchPointwise(accumulateKernel, n, stream, "accumulate", y, x);
}
Status scale(float* y, float s, size_t n, cudaStream_t stream) {
  return launchPointwise(scaleKernel, n, stream, "scale", y, s);
}
Status addRows(float* x, const float* row, size_t rows, int C, cudaStream_t stream) {
  // x (rows, C), row (C)
  if (C <= 0) return Status::ok();
  return launchPointwise(addRowsKernel, rows * size_t(C), stream, "addRows", x, row, C);
}

}  // namespace ms::cuda
