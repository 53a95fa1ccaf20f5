// Vision-transformer plumbing (kernels/cpu/vit.cpp on the GPU): patch extraction, class token + position
// embedding, pooling. Each kernel is a grid-stride loop over its OUTPUT elements (size_t indices, any size);
// the sums over the batch or the sequence (dpos, dcls, mean pooling) are owned by one thread per output
// element and run in the CPU's order, so no atomics and deterministic results.
#include <string>

#include "kernels/cuda/cuda_common.cuh"

namespace ms::cuda {
namespace {

#define MS_GRID_STRIDE(i, n) \
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

// patches (B, NP, P*P) from images (B, S, S); n = B * NP * P * P
__global__ void patchifyKernel(float* patches, const float* images, int S, int P, size_t n) {
  const size_t G = size_t(S / P);  // patches per side
  const size_t PP = size_t(P) * size_t(P);
  const size_t perImage = G * G * PP;
  MS_GRID_STRIDE(i, n) {
    const size_t b = i / perImage;
    const size_t rem = i % perImage;
    const size_t p = rem / PP;
    const size_t within = rem % PP;
    const size_t row = (p / G) * size_t(P) + within / size_t(P);
    const size_t col = (p % G) * size_t(P) + within % size_t(P);
    patches[i] = images[b * size_t(S) * size_t(S) + row * size_t(S) + col];
  }
}

// out (B, T, C) = [clsToken | x] + pos, T = NP + off; n = B * T * C
__global__ void tokensForwardKernel(float* out, const float* x, const float* clsToken, const float* pos,
                                    int NP, int C, int off, size_t n) {
  const size_t T = size_t(NP + off);
  MS_GRID_STRIDE(i, n) {
    const size_t c = i % size_t(C);
    const size_t bt = i / size_t(C);
    const size_t t = bt % T;
    const size_t b = bt / T;
    const float src = t < size_t(off) ? clsToken[c] : x[(b * size_t(NP) + (t - size_t(off))) * size_t(C) + c];
    out[i] = src + pos[t * size_t(C) + c];
  }
}

// dx (B, NP, C) += dout[:, off:, :]; n = B * NP * C
__global__ void tokensBackwardXKernel(float* dx, const float* dout, int NP, int C, int off, size_t n) {
  const size_t T = size_t(NP + off);
  MS_GRID_STRIDE(i, n) {
    const size_t c = i % size_t(C);
    const size_t bi = i / size_t(C);
    const size_t b = bi / size_t(NP);
    const size_t np = bi % size_t(NP);
    dx[i] += dout[(b * T + size_t(off) + np) * size_t(C) + c];
  }
}

// sums[i] += sum over b of dout[b * stride + i] (batch order); n outputs. dpos: stride T*C, n = T*C;
// dcls: stride T*C, n = C (the first row of every batch element).
__global__ void batchSumKernel(float* sums, const float* dout, int B, size_t stride, size_t n) {
  MS_GRID_STRIDE(i, n) {
    float acc = sums[i];
    for (int b = 0; b < B; b++) acc += dout[size_t(b) * stride + i];
    sums[i] = acc;
  }
}

// out (B, C) = inp[:, 0, :] or the mean over T; n = B * C
__global__ void poolForwardKernel(float* out, const float* inp, int T, int C, bool useFirst, size_t n) {
  const float invT = 1.0f / float(T);
  MS_GRID_STRIDE(i, n) {
    const size_t b = i / size_t(C);
    const size_t c = i % size_t(C);
    const float* src = inp + b * size_t(T) * size_t(C) + c;
    if (useFirst) {
      out[i] = src[0];
      continue;
    }
    float acc = 0.0f;
    for (int t = 0; t < T; t++) acc += src[size_t(t) * size_t(C)];
    out[i] = acc * invT;
  }
}

// dinp (B, T, C) += dout (B, C) / T over every t (mean); n = B * T * C
__global__ void poolBackwardMeanKernel(float* dinp, const float* dout, int T, int C, size_t n) {
  const float invT = 1.0f / float(T);
  MS_GRID_STRIDE(i, n) {
    const size_t c = i % size_t(C);
    const size_t b = i / (size_t(T) * size_t(C));
    dinp[i] += dout[b * size_t(C) + c] * invT;
  }
}

// dinp[:, 0, :] += dout (B, C) (class-token pooling); n = B * C
__global__ void poolBackwardFirstKernel(float* dinp, const float* dout, int T, int C, size_t n) {
  MS_GRID_STRIDE(i, n) {
    const size_t b = i / size_t(C);
    const size_t c = i % size_t(C);
    dinp[b * size_t(T) * size_t(C) + c] += dout[i];
  }
}

#undef MS_GRID_STRIDE

}  // namespace

Status patchify(float* patches, const float* images, int B, int S, int P, cudaStream_t stream) {
  // patches (B, NP, P*P), images (B, S, S)
  if (B <= 0 || S <= 0 || P <= 0) return Status::ok();
  if (S % P != 0)
    return Status::error("patchify: image side " + std::to_string(S) + " not divisible by patch side " +
                         std::to_string(P));
  const size_t n = size_t(B) * size_t(S) * size_t(S);  // = B * NP * P * P
  patchifyKernel<<<detail::gridFor(n), detail::kBlockSize, 0, stream>>>(patches, images, S, P, n);
  return checkLaunch("patchify");
}

Status tokensForward(float* out, const float* x, const float* clsToken, const float* pos, int B, int NP,
                     int C, bool cls, cudaStream_t stream) {
  // out (B, T, C), x (B, NP, C), clsToken (C), pos (T, C); T = NP + cls
  const int off = cls ? 1 : 0;
  if (B <= 0 || C <= 0 || NP + off <= 0) return Status::ok();
  const size_t n = size_t(B) * size_t(NP + off) * size_t(C);
  tokensForwardKernel<<<detail::gridFor(n), detail::kBlockSize, 0, stream>>>(out, x, clsToken, pos, NP, C,
                                                                             off, n);
  return checkLaunch("tokensForward");
}

Status tokensBackward(float* dx, float* dcls, float* dpos, const float* dout, int B, int NP, int C, bool cls,
                      cudaStream_t stream) {
  // dx (B, NP, C), dcls (C), dpos (T, C), dout (B, T, C); T = NP + cls
  const int off = cls ? 1 : 0;
  const int T = NP + off;
  if (B <= 0 || C <= 0 || T <= 0) return Status::ok();
  const size_t stride = size_t(T) * size_t(C);
  if (dx && NP > 0) {
    const size_t n = size_t(B) * size_t(NP) * size_t(C);
    tokensBackwardXKernel<<<detail::gridFor(n), detail::kBlockSize, 0, stream>>>(dx, dout, NP, C, off, n);
    MS_TRY(checkLaunch("tokensBackward"));
  }
  if (dpos) {
    batchSumKernel<<<detail::gridFor(stride), detail::kBlockSize, 0, stream>>>(dpos, dout, B, stride, stride);
    MS_TRY(checkLaunch("tokensBackward"));
  }
  if (cls && dcls) {
    batchSumKernel<<<detail::gridFor(size_t(C)), detail::kBlockSize, 0, stream>>>(dcls, dout, B, stride,
                                                                                  size_t(C));
    MS_TRY(checkLaunch("tokensBackward"));
  }
  return Status::ok();
}

Status poolForward(float* out, const float* inp, int B, int T, int C, bool useFirst, cudaStream_t stream) {
  // out (B, C), inp (B, T, C)
  if (B <= 0 || T <= 0 || C <= 0) return Status::ok();
  const size_t n = size_t(B) * size_t(C);
  poolForwardKernel<<<detail::gridFor(n), detail::kBlockSize, 0, stream>>>(out, inp, T, C, useFirst, n);
  return checkLaunch("poolForward");
}

Status poolBackward(float* dinp, const float* dout, int B, int T, int C, bool useFirst, cudaStream_t stream) {
  // dinp (B, T, C), dout (B, C)
  if (B <= 0 || T <= 0 || C <= 0) return Status::ok();
  if (useFirst) {
    const size_t n = size_t(B) * size_t(C);
    poolBackwardFirstKernel<<<detail::gridFor(n), detail::kBlockSize, 0, stream>>>(dinp, dout, T, C, n);
  } else {
    const size_t n = size_t(B) * size_t(T) * size_t(C);
    poolBackwardMeanKernel<<<detail::gridFor(n), detail::kBlockSize, 0, stream>>>(dinp, dout, T, C, n);
  }
  return checkLaunch("poolBackward");
}

}  // namespace ms::cuda
