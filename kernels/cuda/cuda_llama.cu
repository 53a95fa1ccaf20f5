// The Llama-family pieces on the GPU: the ops of kernels/cpu/llama.cpp (its reference). RMSNorm (Zhang &
// Sennrich 2019, "Root Mean Square Layer Normalization", eq. 4), SwiGLU (Shazeer 2020, "GLU Variants Improve
// Transformer", eq. 6) and rotary position embeddings (Su et al. 2021, "RoFormer", eq. 34, in Hugging Face
// Llama's half-split pairing) with grouped-query attention's key/value heads repeated (Ainslie et al. 2023,
// "GQA").
// - RMSNorm gives a warp to each row as cuda_layernorm.cu does. Its weight gradient is the layer norm's
//   deterministic two-stage reduction: blocks of 32 columns sum slices of the rows into scratch, a last
//   kernel adds the slices in order (the cut depends on the shape alone: the same bits on every GPU, no
//   atomics).
// - SwiGLU is a grid-stride element-wise kernel each way.
// - RoPE gives each position (b, t) to a block (a grid-stride loop over them): the block forms the position's
//   cos and sin in shared memory (its inverse frequencies once, for all its positions), then its threads
//   rotate the row's element pairs. The transpose sums a key/value head's repeated gradients in head order,
//   as the CPU does (the same fp32 sums), then rotates back once; it overwrites dq, dk and dv.
#include <string>

#include "kernels/cuda/cuda_common.cuh"

namespace ms::cuda {
namespace {

using detail::kWarpSize;
using detail::warpSum;

constexpr int kRowsPerBlock = detail::kBlockSize / kWarpSize;
constexpr int kParamRows = 8;  // blockDim.y of the weight-gradient pass
// RoPE: blocks of the grid-stride loop over positions (enough to fill an H100 with 256-thread blocks; each
// block computes its inverse frequencies once), and the largest head size whose three tables (inverse
// frequency, cos, sin: 3 hs / 2 floats) fit the 48 KiB of shared memory a launch gets without opting in.
constexpr int kRopeMaxBlocks = 1024;
constexpr int kRopeMaxHeadSize = 8192;

#define MS_GRID_STRIDE(i, n) \
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

// ---- RMSNorm ---------------------------------------------------------------------------------------------

__global__ void rmsNormForwardKernel(float* out, float* rstd, const float* inp, const float* weight, int N,
                                     int C, float eps) {
  const int lane = threadIdx.x % kWarpSize;
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (n >= N) return;  // whole warp
  const float* x = inp + size_t(n) * C;
  float* y = out + size_t(n) * C;
  float sq = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) sq += x[c] * x[c];
  // mean(x^2) as the CPU forms it: the sum times 1/C.
  const float s = 1.0f / sqrtf(warpSum(sq) * (1.0f / float(C)) + eps);
  for (int c = lane; c < C; c += kWarpSize) y[c] = x[c] * s * weight[c];
  if (lane == 0) rstd[n] = s;
}

// y = x s w with s = (mean(x^2) + eps)^(-1/2): dx = s (w dy) - x s^3 mean(w dy x).
__global__ void rmsNormBackwardInputKernel(float* dinp, const float* dout, const float* inp,
                                           const float* weight, const float* rstd, int N, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (n >= N) return;
  const float* x = inp + size_t(n) * C;
  const float* dy = dout + size_t(n) * C;
  float* dx = dinp + size_t(n) * C;
  const float s = rstd[n];
  float dot = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) dot += weight[c] * dy[c] * x[c];
  const float k = s * s * s * (warpSum(dot) * (1.0f / float(C)));
  for (int c = lane; c < C; c += kWarpSize) dx[c] += s * weight[c] * dy[c] - k * x[c];
}

// dweight = sum_n x s dy in two deterministic stages (cuda_layernorm.cu's cut): block (bx, sl) sums rows
// [sl * rows, (sl + 1) * rows) of its 32 columns into partial[sl * C + c]; blockDim (32, kParamRows).
__global__ void rmsNormWeightPartialKernel(float* partial, const float* dout, const float* inp,
                                           const float* rstd, int N, int C, int rows) {
  __shared__ float pw[kParamRows][kWarpSize + 1];
  const int c = blockIdx.x * kWarpSize + threadIdx.x;
  const int first = blockIdx.y * rows;
  const int last = min(N, first + rows);
  float sw = 0.0f;
  if (c < C) {
    for (int n = first + threadIdx.y; n < last; n += kParamRows) {
      const size_t i = size_t(n) * C + c;
      sw += inp[i] * rstd[n] * dout[i];
    }
  }
  pw[threadIdx.y][threadIdx.x] = sw;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = 0.0f;
    for (int r = 0; r < kParamRows; r++) t += pw[r][threadIdx.x];
    partial[size_t(blockIdx.y) * C + c] = t;
  }
}

// Stage 2: dweight[c] += the slices' sums, in slice order.
__global__ void rmsNormWeightFinishKernel(float* dweight, const float* partial, int C, int slices) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float t = 0.0f;
  for (int sl = 0; sl < slices; ++sl) t += partial[size_t(sl) * C + c];
  dweight[c] += t;
}

unsigned rowBlocks(int N) {
  return unsigned((N + kRowsPerBlock - 1) / kRowsPerBlock);
}

// ---- SwiGLU ----------------------------------------------------------------------------------------------

// exp(-g), its argument clamped as the CPU's vexp clamps it (at 88.3): below g of about -88.7 expf(-g) would
// overflow to infinity; sigmoid(g) is ~0 either way, clamped it is the CPU's ~0, and never a NaN.
__device__ __forceinline__ float expNeg(float g) {
  return expf(fminf(-g, 88.3f));
}

// out may alias gate or up: each element is read before it is written, by the same thread.
__global__ void swigluForwardKernel(float* out, const float* gate, const float* up, size_t n) {
  MS_GRID_STRIDE(i, n) {
    const float g = gate[i];
    out[i] = g / (1.0f + expNeg(g)) * up[i];
  }
}

// silu'(g) = s (1 + g (1 - s)), s = sigmoid(g).
__global__ void swigluBackwardKernel(float* dgate, float* dup, const float* dout, const float* gate,
                                     const float* up, size_t n) {
  MS_GRID_STRIDE(i, n) {
    const float g = gate[i];
    const float s = 1.0f / (1.0f + expNeg(g));
    const float d = dout[i];
    dgate[i] += d * up[i] * s * (1.0f + g * (1.0f - s));
    dup[i] += d * g * s;
  }
}

// ---- Rotary embeddings -----------------------------------------------------------------------------------

// The inverse frequencies inv[i] = 1 / theta^(2i / hs), i < hs / 2, as kernels/cpu/llama.cpp's ropeTables
// forms them in fp32 (Hugging Face's LlamaRotaryEmbedding): the exponent one fp32 division, the power rounded
// to fp32, its reciprocal one fp32 division. The CPU's power is glibc's powf (within 0.82 ulp); here it is
// computed in double and rounded once (the correctly rounded value; CUDA's own powf is several ulps off). The
// two agree on head sizes 64, 80, 96, 128 and 256 at theta 1e4, 5e5 and 1e6, and on every even head size
// below 150 at theta 1e4 (checked on the host); elsewhere an inverse frequency may differ by an ulp, which
// moves an angle by about 1e-7 of itself. The explicit _rn intrinsics keep every step one IEEE operation
// whatever the compiler flags.
__device__ void ropeInverseFrequencies(float* inv, int half, int hs, float theta) {
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float e = __fdiv_rn(float(2 * i), float(hs));
    inv[i] = __fdiv_rn(1.0f, __double2float_rn(pow(double(theta), double(e))));
  }
}

// cos and sin of position pos's angles (pos * inv[i], one fp32 product) into the shared tables: in double,
// rounded to fp32, as the CPU computes them. Syncs before (a previous row may still read the tables) and
// after.
__device__ void ropeAngles(float* cosT, float* sinT, const float* inv, int half, int pos) {
  __syncthreads();
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float a = __fmul_rn(float(pos), inv[i]);
    double s = 0.0, c = 0.0;
    sincos(double(a), &s, &c);
    cosT[i] = float(c);
    sinT[i] = float(s);
  }
  __syncthreads();
}

// Pair i of a head (elements i and i + half) rotated by angle (c, s) (sign +1) or back (sign -1), as the
// CPU's rotate().
__device__ __forceinline__ void rotatePair(float* dst, float x0, float x1, int i, int half, float c, float s,
                                           float sign) {
  dst[i] = x0 * c - sign * x1 * s;
  dst[i + half] = x1 * c + sign * x0 * s;
}

// qkv (N, 3 H hs) from q (N, H hs), k, v (N, KV hs); dynamic shared memory: 3 hs / 2 floats.
__global__ void ropePackKernel(float* qkv, const float* q, const float* k, const float* v, int N, int T,
                               int H, int KV, int hs, float theta, int posStart) {
  extern __shared__ float tables[];
  const int half = hs / 2, group = H / KV;
  float* inv = tables;
  float* cosT = tables + half;
  float* sinT = tables + 2 * half;
  ropeInverseFrequencies(inv, half, hs, theta);
  const size_t Cq = size_t(H) * hs, Ckv = size_t(KV) * hs;
  for (int n = blockIdx.x; n < N; n += gridDim.x) {
    ropeAngles(cosT, sinT, inv, half, posStart + n % T);
    float* row = qkv + size_t(n) * 3 * Cq;
    const float* qn = q + size_t(n) * Cq;
    const float* kn = k + size_t(n) * Ckv;
    const float* vn = v + size_t(n) * Ckv;
    for (int idx = threadIdx.x; idx < H * half; idx += blockDim.x) {
      const int h = idx / half, i = idx % half, j = h / group;
      const float c = cosT[i], s = sinT[i];
      const float* qh = qn + size_t(h) * hs;
      const float* kj = kn + size_t(j) * hs;
      rotatePair(row + size_t(h) * hs, qh[i], qh[i + half], i, half, c, s, 1.0f);
      rotatePair(row + Cq + size_t(h) * hs, kj[i], kj[i + half], i, half, c, s, 1.0f);
    }
    for (int idx = threadIdx.x; idx < H * hs; idx += blockDim.x) {
      const int h = idx / hs, d = idx % hs;
      row[2 * Cq + idx] = vn[size_t(h / group) * hs + d];
    }
  }
}

// dq (N, H hs), dk, dv (N, KV hs) OVERWRITTEN from dqkv (N, 3 H hs); dynamic shared memory: 3 hs / 2 floats.
__global__ void ropeUnpackKernel(float* dq, float* dk, float* dv, const float* dqkv, int N, int T, int H,
                                 int KV, int hs, float theta, int posStart) {
  extern __shared__ float tables[];
  const int half = hs / 2, group = H / KV;
  float* inv = tables;
  float* cosT = tables + half;
  float* sinT = tables + 2 * half;
  ropeInverseFrequencies(inv, half, hs, theta);
  const size_t Cq = size_t(H) * hs, Ckv = size_t(KV) * hs;
  for (int n = blockIdx.x; n < N; n += gridDim.x) {
    ropeAngles(cosT, sinT, inv, half, posStart + n % T);
    const float* row = dqkv + size_t(n) * 3 * Cq;
    float* dqn = dq + size_t(n) * Cq;
    float* dkn = dk + size_t(n) * Ckv;
    float* dvn = dv + size_t(n) * Ckv;
    for (int idx = threadIdx.x; idx < H * half; idx += blockDim.x) {
      const int h = idx / half, i = idx % half;
      const float* g = row + size_t(h) * hs;
      rotatePair(dqn + size_t(h) * hs, g[i], g[i + half], i, half, cosT[i], sinT[i], -1.0f);
    }
    // A key head's gradient: its group's repeated gradients summed in head order from 0 (the CPU's sums, bit
    // for bit), rotated back once (the rotation is linear).
    for (int idx = threadIdx.x; idx < KV * half; idx += blockDim.x) {
      const int j = idx / half, i = idx % half;
      float x0 = 0.0f, x1 = 0.0f;
      for (int h = j * group; h < (j + 1) * group; h++) {
        const float* g = row + Cq + size_t(h) * hs;
        x0 += g[i];
        x1 += g[i + half];
      }
      rotatePair(dkn + size_t(j) * hs, x0, x1, i, half, cosT[i], sinT[i], -1.0f);
    }
    for (int idx = threadIdx.x; idx < KV * hs; idx += blockDim.x) {
      const int j = idx / hs, d = idx % hs;
      float sum = 0.0f;
      for (int h = j * group; h < (j + 1) * group; h++) sum += row[2 * Cq + size_t(h) * hs + d];
      dvn[idx] = sum;
    }
  }
}

#undef MS_GRID_STRIDE

// The RoPE shape (ropeShapeProblem, shared with the CPU), and the head size the shared tables allow.
Status ropeStatus(int H, int KV, int hs, const char* what) {
  if (const std::string p = ropeShapeProblem(H, KV, hs); !p.empty())
    return Status::error(std::string(what) + ": " + p);
  if (hs > kRopeMaxHeadSize)
    return Status::error(std::string(what) + ": head size " + std::to_string(hs) + " above " +
                         std::to_string(kRopeMaxHeadSize));
  return Status::ok();
}

unsigned ropeBlocks(int N) {
  return unsigned(N < kRopeMaxBlocks ? N : kRopeMaxBlocks);
}

size_t ropeSharedBytes(int hs) {
  return size_t(3) * size_t(hs / 2) * sizeof(float);
}

}  // namespace

Status rmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps,
                      cudaStream_t stream) {
  // out (N, C), rstd (N), inp (N, C), weight (C)
  if (N <= 0 || C <= 0) return Status::ok();
  rmsNormForwardKernel<<<rowBlocks(N), detail::kBlockSize, 0, stream>>>(out, rstd, inp, weight, N, C, eps);
  return checkLaunch("rmsNormForward");
}

Status rmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                       const float* rstd, int N, int C, cudaStream_t stream) {
  // dinp (N, C), dweight (C), dout (N, C), inp (N, C), weight (C), rstd (N)
  if (N <= 0 || C <= 0) return Status::ok();
  rmsNormBackwardInputKernel<<<rowBlocks(N), detail::kBlockSize, 0, stream>>>(dinp, dout, inp, weight, rstd,
                                                                              N, C);
  MS_TRY(checkLaunch("rmsNormBackward: dinp"));
  if (!dweight) return Status::ok();
  const char* what = "rmsNormBackward: dweight";
  const int slices = detail::columnSlices(N, C);
  const int rows = (N + slices - 1) / slices;
  const Expected<float*> partial = detail::reductionScratch(size_t(slices) * C, stream, what);
  if (!partial) return partial.status();
  const dim3 block(kWarpSize, kParamRows);
  const dim3 grid(unsigned((C + kWarpSize - 1) / kWarpSize), unsigned(slices));
  rmsNormWeightPartialKernel<<<grid, block, 0, stream>>>(*partial, dout, inp, rstd, N, C, rows);
  MS_TRY(checkLaunch(what));
  rmsNormWeightFinishKernel<<<detail::gridFor(size_t(C)), detail::kBlockSize, 0, stream>>>(dweight, *partial,
                                                                                           C, slices);
  return checkLaunch(what);
}

Status swigluForward(float* out, const float* gate, const float* up, size_t n, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  swigluForwardKernel<<<detail::gridFor(n), detail::kBlockSize, 0, stream>>>(out, gate, up, n);
  return checkLaunch("swigluForward");
}

Status swigluBackward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                      size_t n, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  swigluBackwardKernel<<<detail::gridFor(n), detail::kBlockSize, 0, stream>>>(dgate, dup, dout, gate, up, n);
  return checkLaunch("swigluBackward");
}

Status ropePackQkv(float* qkv, const float* q, const float* k, const float* v, int B, int T, int H, int KV,
                   int hs, float theta, int posStart, cudaStream_t stream) {
  // qkv (B, T, 3 H hs), q (B, T, H hs), k (B, T, KV hs), v (B, T, KV hs)
  MS_TRY(ropeStatus(H, KV, hs, "ropePackQkv"));
  if (B <= 0 || T <= 0) return Status::ok();
  const int N = B * T;
  ropePackKernel<<<ropeBlocks(N), detail::kBlockSize, ropeSharedBytes(hs), stream>>>(qkv, q, k, v, N, T, H,
                                                                                     KV, hs, theta, posStart);
  return checkLaunch("ropePackQkv");
}

Status ropeUnpackQkv(float* dq, float* dk, float* dv, const float* dqkv, int B, int T, int H, int KV, int hs,
                     float theta, int posStart, cudaStream_t stream) {
  // dq (B, T, H hs), dk (B, T, KV hs), dv (B, T, KV hs), dqkv (B, T, 3 H hs)
  MS_TRY(ropeStatus(H, KV, hs, "ropeUnpackQkv"));
  if (B <= 0 || T <= 0) return Status::ok();
  const int N = B * T;
  ropeUnpackKernel<<<ropeBlocks(N), detail::kBlockSize, ropeSharedBytes(hs), stream>>>(
      dq, dk, dv, dqkv, N, T, H, KV, hs, theta, posStart);
  return checkLaunch("ropeUnpackQkv");
}

}  // namespace ms::cuda
