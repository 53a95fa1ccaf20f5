// Convolution and batch normalisation on the GPU, NCHW: the ops of kernels/cpu/conv.cpp (its reference).
//
// conv2d as im2col + GEMM (Chellapilla et al. 2006, "High Performance Convolutional Neural Networks for
// Document Processing"): a kernel unfolds a chunk of samples into the caller's workspace, one column per
// output position and C * KH * KW rows, and cuBLAS multiplies the weight, viewed as (OC, C * KH * KW), with
// every sample's columns in one strided-batched GEMM (the weight's stride 0). Backward: dweight += dout_b @
// cols_b^T one sample after the other (beta = 1, so the order of the sums is fixed), the columns' gradient
// weight^T @ dout_b for a chunk in one batched GEMM, folded back by col2im as a GATHER (each input element
// adds the kernel offsets that read it, in (kh, kw) order, the order conv.cpp adds them in: no atomics),
// and dbias the per-channel sum of dout. The GEMMs run in the process GemmMode like the linear layers'.
//
// Batch norm (Ioffe and Szegedy 2015, "Batch Normalization", algorithm 1 and the backward of section 3),
// in the parts of conv.cpp so that synchronised batch norm can all-reduce the per-channel sums between them.
// A per-channel sum over (B, C, S) is two deterministic passes: block (c, slice) sums a slice of channel c's
// B * S elements in double (a fixed block reduction) into scratch, and a second kernel adds the slices in
// order; the slices depend on the shape alone, so the bits are the same on every GPU and run.
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <string>

#include "kernels/cuda/cuda_common.cuh"

namespace ms::cuda {
namespace {

using detail::gemm;
using detail::GemmOperand;
using detail::kBlockSize;
using detail::kSlotD;
using detail::kSlotW;
using detail::kSlotX;

// Floats of im2col columns unfolded per pass (64 MiB): at least one sample, up to the whole batch.
constexpr size_t kColumnsBudget = size_t(16) << 20;
// Element counts up to which a kernel indexes with 32-bit unsigned integers (half their range, so that a
// grid-stride step or a slice's end past the last element cannot wrap around); 64-bit beyond.
constexpr size_t kMax32 = UINT_MAX / 2;

Status convShapeStatus(const Conv2dShape& s, const char* what) {
  const std::string p = s.problem();
  return p.empty() ? Status::ok() : Status::error(std::string(what) + ": " + p);
}

Status batchNormStatus(int B, int C, int S, const char* what) {
  const std::string p = batchNormShapeProblem(B, C, S);
  return p.empty() ? Status::ok() : Status::error(std::string(what) + ": " + p);
}

Status countStatus(double count, const char* what) {
  if (count > 0) return Status::ok();
  return Status::error(std::string(what) + ": the element count must be positive (got " +
                       std::to_string(count) + ")");
}

// A bf16 TensorIn is valid only in GemmMode::Bf16 (as cuda_linear.cu checks it, whether or not the call
// reads the operand).
Status checkBf16(TensorIn in, const char* what) {
  if (in.bf16 && gemmMode() != GemmMode::Bf16)
    return Status::error(std::string(what) + " is bf16, which needs the bf16 GEMM precision");
  return Status::ok();
}

// ---- convolution
// -------------------------------------------------------------------------------------------

__device__ inline float zeroOf(const float*) {
  return 0.0f;
}
__device__ inline __nv_bfloat16 zeroOf(const __nv_bfloat16*) {
  return __ushort_as_bfloat16(0);
}

// cols (nb, K, P) from x (nb, C, H, W), K = C * KH * KW rows (c, kh, kw) of P = OH * OW positions; positions
// that fall in the padding are 0. total = nb * K * P.
template <typename T, typename Index>
__global__ void im2colKernel(T* cols, const T* x, int C, int H, int W, int KH, int KW, int stride, int pad,
                             int OW, Index P, Index K, Index total) {
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const Index p = i % P, row = i / P;
    const int r = int(row % K), b = int(row / K);
    const int oh = int(p) / OW, ow = int(p) % OW;
    const int kw = r % KW, kh = (r / KW) % KH, c = r / (KW * KH);
    const int h = oh * stride - pad + kh, w = ow * stride - pad + kw;
    cols[i] = (h >= 0 && h < H && w >= 0 && w < W) ? x[((size_t(b) * C + c) * H + h) * W + w] : zeroOf(x);
  }
}

// dx (nb, C, H, W) += dcols (nb, K, P) folded back: each thread owns input elements and adds, kernel row by
// kernel row and column by column, the output positions that read them. total = nb * C * H * W.
template <typename Index>
__global__ void col2imKernel(float* dx, const float* dcols, int C, int H, int W, int KH, int KW, int stride,
                             int pad, int OH, int OW, Index total) {
  const Index step = Index(gridDim.x) * blockDim.x;
  const size_t P = size_t(OH) * OW, K = size_t(C) * KH * KW;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int w = int(i % Index(W));
    const Index plane = i / Index(W);
    const int h = int(plane % Index(H));
    const Index bc = plane / Index(H);
    const int c = int(bc % Index(C));
    const size_t b = size_t(bc / Index(C));
    const float* base = dcols + b * K * P + size_t(c) * KH * KW * P;
    float acc = dx[i];
    for (int kh = 0; kh < KH; ++kh) {
      const int th = h + pad - kh;  // = oh * stride when output row oh reads input row h at kernel row kh
      if (th < 0) break;            // th only falls as kh grows
      if (th % stride != 0 || th / stride >= OH) continue;
      const int oh = th / stride;
      for (int kw = 0; kw < KW; ++kw) {
        const int tw = w + pad - kw;
        if (tw < 0) break;
        if (tw % stride != 0 || tw / stride >= OW) continue;
        acc += base[(size_t(kh) * KW + kw) * P + size_t(oh) * OW + tw / stride];
      }
    }
    dx[i] = acc;
  }
}

// out (B, OC, P) += bias[oc]. total = B * OC * P.
template <typename Index>
__global__ void addChannelBiasKernel(float* out, const float* bias, Index P, Index OC, Index total) {
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step)
    out[i] += bias[(i / P) % OC];
}

// The GEMM operand of the unfolded samples [b0, b0 + nb) of inp: an fp32 input unfolded into cols (fp32)
// and taken by gemmOperand (slot X: a bf16 copy in GemmMode::Bf16); a bf16 input (GemmMode::Bf16 only)
// unfolded as bf16 into the same workspace and used as it is.
Expected<GemmOperand> unfold(float* cols, TensorIn inp, const Conv2dShape& s, int b0, int nb,
                             cudaStream_t stream, const char* what) {
  const size_t K = size_t(s.K()), P = size_t(s.P()), total = size_t(nb) * K * P;
  const size_t offset = size_t(b0) * s.C * s.H * s.W;
  const unsigned grid = detail::gridFor(total);
  // total <= max(kColumnsBudget, K * P) < 2^31 (Conv2dShape::problem): 32-bit indices.
  if (inp.bf16) {
    auto* c16 = reinterpret_cast<__nv_bfloat16*>(cols);
    const auto* x = static_cast<const __nv_bfloat16*>(inp.data) + offset;
    im2colKernel<__nv_bfloat16, unsigned>
        <<<grid, kBlockSize, 0, stream>>>(c16, x, s.C, s.H, s.W, s.KH, s.KW, s.stride, s.pad, s.outW(),
                                          unsigned(P), unsigned(K), unsigned(total));
    MS_TRY(checkLaunch(what));
    return GemmOperand::bf16Copy(c16);
  }
  im2colKernel<float, unsigned><<<grid, kBlockSize, 0, stream>>>(cols, inp.f32() + offset, s.C, s.H, s.W,
                                                                 s.KH, s.KW, s.stride, s.pad, s.outW(),
                                                                 unsigned(P), unsigned(K), unsigned(total));
  MS_TRY(checkLaunch(what));
  return detail::gemmOperand(cols, total, kSlotX, stream, what);
}

Status col2im(float* dx, const float* dcols, const Conv2dShape& s, int nb, cudaStream_t stream,
              const char* what) {
  const size_t total = size_t(nb) * s.C * s.H * s.W;
  const unsigned grid = detail::gridFor(total);
  if (total <= kMax32)
    col2imKernel<unsigned><<<grid, kBlockSize, 0, stream>>>(dx, dcols, s.C, s.H, s.W, s.KH, s.KW, s.stride,
                                                            s.pad, s.outH(), s.outW(), unsigned(total));
  else
    col2imKernel<unsigned long long><<<grid, kBlockSize, 0, stream>>>(
        dx, dcols, s.C, s.H, s.W, s.KH, s.KW, s.stride, s.pad, s.outH(), s.outW(), total);
  return checkLaunch(what);
}

// The GEMM operand of a weight: an fp32 one through gemmOperand (slot W), a bf16 one as it is.
Expected<GemmOperand> weightOperand(TensorIn weight, size_t n, cudaStream_t stream, const char* what) {
  if (!weight.bf16) return detail::gemmOperand(weight.f32(), n, kSlotW, stream, what);
  return GemmOperand::bf16Copy(static_cast<const __nv_bfloat16*>(weight.data));
}

// ---- per-channel sums over (B, C, S) ----------------------------------------------------------------------

enum class SumKind {
  Stats,      // x, x^2 (batchNormStats)
  GradStats,  // dout, dout * xhat (batchNormGradStats)
  Plain,      // dout only (a convolution's bias gradient)
};

// Block (c, slice) sums elements [slice * perSlice, ...) of channel c's n = B * S (element m is sample
// m / S, position m % S) into partial[(slice * C + c) * 2 + {0, 1}], in double.
template <SumKind kind, typename Index>
__global__ void channelSumsPartialKernel(double* partial, const float* a, const float* x, const float* mean,
                                         const float* rstd, Index S, Index C, Index n, Index perSlice) {
  __shared__ double shared[detail::kWarpSize];
  const Index c = blockIdx.x;
  const Index first = Index(blockIdx.y) * perSlice;
  const Index last = first + perSlice < n ? first + perSlice : n;
  double s1 = 0.0, s2 = 0.0;
  for (Index i = first + threadIdx.x; i < last; i += blockDim.x) {
    const Index b = i / S;
    const size_t at = (size_t(b) * C + c) * S + (i - b * S);
    const double v = a[at];
    s1 += v;
    if constexpr (kind == SumKind::Stats) s2 += v * v;
    if constexpr (kind == SumKind::GradStats) s2 += v * (double(x[at]) - mean[c]) * rstd[c];
  }
  s1 = detail::blockSum(s1, shared);
  if constexpr (kind != SumKind::Plain) s2 = detail::blockSum(s2, shared);
  if (threadIdx.x == 0) {
    partial[(size_t(blockIdx.y) * C + c) * 2] = s1;
    partial[(size_t(blockIdx.y) * C + c) * 2 + 1] = s2;
  }
}

// The slices added in order: out1[c] = first sums and out2[c] = second sums (each nullable), acc[c] +=
// float(first sum) (nullable).
__global__ void channelSumsFinishKernel(double* out1, double* out2, float* acc, const double* partial, int C,
                                        int slices) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
    double t1 = 0.0, t2 = 0.0;
    for (int s = 0; s < slices; ++s) {
      t1 += partial[(size_t(s) * C + c) * 2];
      t2 += partial[(size_t(s) * C + c) * 2 + 1];
    }
    if (out1) out1[c] = t1;
    if (out2) out2[c] = t2;
    if (acc) acc[c] += float(t1);
  }
}

// Slices per channel: about 1024 blocks in all, none under 2048 elements (8 per thread); from the shape
// alone.
int channelSlices(size_t n, int C) {
  const size_t wanted = (size_t(1024) + size_t(C) - 1) / size_t(C);
  const size_t most = (n + 2047) / 2048;
  return int(std::max<size_t>(1, std::min(wanted, most)));
}

template <SumKind kind>
Status channelSums(double* out1, double* out2, float* acc, const float* a, const float* x, const float* mean,
                   const float* rstd, int B, int C, int S, cudaStream_t stream, const char* what) {
  const size_t n = size_t(B) * S;
  const int slices = channelSlices(n, C);
  const size_t perSlice = (n + size_t(slices) - 1) / size_t(slices);
  // reductionScratch counts floats: 2 doubles per (slice, channel) are 4 floats.
  const Expected<float*> scratch = detail::reductionScratch(size_t(4) * slices * C, stream, what);
  if (!scratch) return scratch.status();
  double* partial = reinterpret_cast<double*>(*scratch);
  const dim3 grid(static_cast<unsigned>(C), static_cast<unsigned>(slices));
  if (size_t(B) * C * S <= kMax32)
    channelSumsPartialKernel<kind, unsigned><<<grid, kBlockSize, 0, stream>>>(
        partial, a, x, mean, rstd, unsigned(S), unsigned(C), unsigned(n), unsigned(perSlice));
  else
    channelSumsPartialKernel<kind, unsigned long long>
        <<<grid, kBlockSize, 0, stream>>>(partial, a, x, mean, rstd, S, C, n, perSlice);
  MS_TRY(checkLaunch(what));
  channelSumsFinishKernel<<<detail::gridFor(size_t(C)), kBlockSize, 0, stream>>>(out1, out2, acc, partial, C,
                                                                                 slices);
  return checkLaunch(what);
}

// ---- batch norm, per channel and element-wise
// ---------------------------------------------------------------

// conv.cpp's batchNormMoments, per channel.
__global__ void batchNormMomentsKernel(float* mean, float* rstd, double* var, const double* sum,
                                       const double* sumSq, double count, int C, float eps) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
    const double m = sum[c] / count;
    const double v = fmax(0.0, sumSq[c] / count - m * m);  // biased: the batch's own variance
    mean[c] = float(m);
    rstd[c] = float(1.0 / sqrt(v + double(eps)));
    if (var) var[c] = v;
  }
}

// conv.cpp's batchNormUpdateRunning (PyTorch's convention, the variance unbiased).
__global__ void batchNormUpdateRunningKernel(float* runningMean, float* runningVar, const float* mean,
                                             const double* var, double count, int C, float momentum) {
  const double unbias = count > 1 ? count / (count - 1) : 1.0;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
    runningMean[c] = float((1.0 - momentum) * runningMean[c] + double(momentum) * mean[c]);
    runningVar[c] = float((1.0 - momentum) * runningVar[c] + double(momentum) * var[c] * unbias);
  }
}

// out = (x - mean) rstd weight + bias over (B, C, S); total = B * C * S.
template <typename Index>
__global__ void batchNormApplyKernel(float* out, const float* x, const float* mean, const float* rstd,
                                     const float* weight, const float* bias, Index S, Index C, Index total) {
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const Index c = (i / S) % C;
    const float scale = rstd[c] * (weight ? weight[c] : 1.0f), shift = bias ? bias[c] : 0.0f;
    out[i] = (x[i] - mean[c]) * scale + shift;
  }
}

// dinp += weight rstd / count (count dout - sumDy - xhat sumDyXhat), in double as conv.cpp computes it.
template <typename Index>
__global__ void batchNormBackwardInputKernel(float* dinp, const float* dout, const float* x,
                                             const float* mean, const float* rstd, const float* weight,
                                             const double* sumDy, const double* sumDyXhat, double count,
                                             Index S, Index C, Index total) {
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const Index c = (i / S) % C;
    const double k = double(rstd[c]) * (weight ? weight[c] : 1.0) / count;
    const double xhat = (double(x[i]) - mean[c]) * rstd[c];
    dinp[i] += float(k * (count * dout[i] - sumDy[c] - xhat * sumDyXhat[c]));
  }
}

// dweight += float(localSumDyXhat), dbias += float(localSumDy); either nullable.
__global__ void batchNormParamGradsKernel(float* dweight, float* dbias, const double* localSumDy,
                                          const double* localSumDyXhat, int C) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
    if (dweight) dweight[c] += float(localSumDyXhat[c]);
    if (dbias) dbias[c] += float(localSumDy[c]);
  }
}

}  // namespace

// ---- convolution
// -------------------------------------------------------------------------------------------

int conv2dChunk(const Conv2dShape& s) {
  if (!s.problem().empty()) return 1;
  const size_t perSample = size_t(s.K()) * size_t(s.P());
  return int(std::clamp<size_t>(kColumnsBudget / perSample, 1, size_t(s.B)));
}

size_t conv2dColumnsFloats(const Conv2dShape& s) {
  if (!s.problem().empty()) return 0;
  return size_t(conv2dChunk(s)) * size_t(s.K()) * size_t(s.P());
}

Status conv2dForward(float* out, TensorIn inp, TensorIn weight, const float* bias, const Conv2dShape& s,
                     float* cols, cudaStream_t stream) {
  const char* what = "conv2dForward";
  MS_TRY(convShapeStatus(s, what));
  MS_TRY(checkBf16(inp, "conv2dForward: inp"));
  MS_TRY(checkBf16(weight, "conv2dForward: weight"));
  if (!cols) return Status::error("conv2dForward: no im2col workspace");
  const int K = s.K(), P = s.P(), OC = s.OC, chunk = conv2dChunk(s);
  const Expected<GemmOperand> w = weightOperand(weight, size_t(OC) * K, stream, "conv2dForward: weight");
  if (!w) return w.status();
  for (int b0 = 0; b0 < s.B; b0 += chunk) {
    const int nb = std::min(chunk, s.B - b0);
    const Expected<GemmOperand> x = unfold(cols, inp, s, b0, nb, stream, "conv2dForward: im2col");
    if (!x) return x.status();
    // out_b (OC, P) = weight (OC, K) @ cols_b (K, P)  <=>  out_b^T (P, OC) = cols_b^T (P, K) @ weight^T (K,
    // OC)
    MS_TRY(gemm(stream, CUBLAS_OP_N, CUBLAS_OP_N, P, OC, K, 1.0f, *x, P, (long long)K * P, *w, K, 0, 0.0f,
                out + size_t(b0) * OC * P, P, (long long)OC * P, nb, what));
  }
  if (!bias) return Status::ok();
  const size_t total = size_t(s.B) * OC * P;
  const unsigned grid = detail::gridFor(total);
  if (total <= kMax32)
    addChannelBiasKernel<unsigned>
        <<<grid, kBlockSize, 0, stream>>>(out, bias, unsigned(P), unsigned(OC), unsigned(total));
  else
    addChannelBiasKernel<unsigned long long><<<grid, kBlockSize, 0, stream>>>(out, bias, P, OC, total);
  return checkLaunch("conv2dForward: bias");
}

Status conv2dBackward(float* dinp, float* dweight, float* dbias, const float* dout, TensorIn inp,
                      TensorIn weight, const Conv2dShape& s, float* cols, cudaStream_t stream) {
  const char* what = "conv2dBackward";
  MS_TRY(convShapeStatus(s, what));
  MS_TRY(checkBf16(inp, "conv2dBackward: inp"));
  MS_TRY(checkBf16(weight, "conv2dBackward: weight"));
  const int K = s.K(), P = s.P(), OC = s.OC, chunk = conv2dChunk(s);
  if (dinp || dweight) {
    if (!cols) return Status::error("conv2dBackward: no im2col workspace");
    GemmOperand w;
    if (dinp) {
      const Expected<GemmOperand> converted =
          weightOperand(weight, size_t(OC) * K, stream, "conv2dBackward: weight");
      if (!converted) return converted.status();
      w = *converted;
    }
    for (int b0 = 0; b0 < s.B; b0 += chunk) {
      const int nb = std::min(chunk, s.B - b0);
      const float* dy32 = dout + size_t(b0) * OC * P;
      MS_GEMM_OPERAND(dy, dy32, size_t(nb) * OC * P, kSlotD, stream, "conv2dBackward: dout");
      if (dweight) {
        const Expected<GemmOperand> x = unfold(cols, inp, s, b0, nb, stream, "conv2dBackward: im2col");
        if (!x) return x.status();
        // dweight (OC, K) += dout_b (OC, P) @ cols_b^T (P, K)  <=>  dweight^T (K, OC) += cols_b (K, P) @
        // dout_b^T (P, OC); sample after sample, so the sums keep one order.
        for (int b = 0; b < nb; ++b)
          MS_TRY(gemm(stream, CUBLAS_OP_T, CUBLAS_OP_N, K, OC, P, 1.0f, x->at(size_t(b) * K * P), P, 0,
                      dy.at(size_t(b) * OC * P), P, 0, 1.0f, dweight, K, 0, 1, "conv2dBackward: dweight"));
      }
      if (dinp) {
        // dcols_b (K, P) = weight^T (K, OC) @ dout_b (OC, P)  <=>  dcols_b^T (P, K) = dout_b^T (P, OC) @
        // weight (OC, K), into the workspace (after the dweight products that read it, in stream order).
        MS_TRY(gemm(stream, CUBLAS_OP_N, CUBLAS_OP_T, P, K, OC, 1.0f, dy, P, (long long)OC * P, w, K, 0, 0.0f,
                    cols, P, (long long)K * P, nb, "conv2dBackward: dcols"));
        MS_TRY(col2im(dinp + size_t(b0) * s.C * s.H * s.W, cols, s, nb, stream, "conv2dBackward: col2im"));
      }
    }
  }
  if (dbias)
    MS_TRY(channelSums<SumKind::Plain>(nullptr, nullptr, dbias, dout, nullptr, nullptr, nullptr, s.B, OC, P,
                                       stream, "conv2dBackward: dbias"));
  return Status::ok();
}

// ---- batch norm
// --------------------------------------------------------------------------------------------

Status batchNormStats(double* sum, double* sumSq, const float* x, int B, int C, int S, cudaStream_t stream) {
  MS_TRY(batchNormStatus(B, C, S, "batchNormStats"));
  return channelSums<SumKind::Stats>(sum, sumSq, nullptr, x, nullptr, nullptr, nullptr, B, C, S, stream,
                                     "batchNormStats");
}

Status batchNormMoments(float* mean, float* rstd, double* var, const double* sum, const double* sumSq,
                        double count, int C, float eps, cudaStream_t stream) {
  MS_TRY(batchNormStatus(1, C, 1, "batchNormMoments"));
  MS_TRY(countStatus(count, "batchNormMoments"));
  batchNormMomentsKernel<<<detail::gridFor(size_t(C)), kBlockSize, 0, stream>>>(mean, rstd, var, sum, sumSq,
                                                                                count, C, eps);
  return checkLaunch("batchNormMoments");
}

Status batchNormUpdateRunning(float* runningMean, float* runningVar, const float* mean, const double* var,
                              double count, int C, float momentum, cudaStream_t stream) {
  MS_TRY(batchNormStatus(1, C, 1, "batchNormUpdateRunning"));
  MS_TRY(countStatus(count, "batchNormUpdateRunning"));
  batchNormUpdateRunningKernel<<<detail::gridFor(size_t(C)), kBlockSize, 0, stream>>>(
      runningMean, runningVar, mean, var, count, C, momentum);
  return checkLaunch("batchNormUpdateRunning");
}

Status batchNormApply(float* out, const float* x, const float* mean, const float* rstd, const float* weight,
                      const float* bias, int B, int C, int S, cudaStream_t stream) {
  MS_TRY(batchNormStatus(B, C, S, "batchNormApply"));
  const size_t total = size_t(B) * C * S;
  const unsigned grid = detail::gridFor(total);
  if (total <= kMax32)
    batchNormApplyKernel<unsigned><<<grid, kBlockSize, 0, stream>>>(
        out, x, mean, rstd, weight, bias, unsigned(S), unsigned(C), unsigned(total));
  else
    batchNormApplyKernel<unsigned long long>
        <<<grid, kBlockSize, 0, stream>>>(out, x, mean, rstd, weight, bias, S, C, total);
  return checkLaunch("batchNormApply");
}

Status batchNormGradStats(double* sumDy, double* sumDyXhat, const float* dout, const float* x,
                          const float* mean, const float* rstd, int B, int C, int S, cudaStream_t stream) {
  MS_TRY(batchNormStatus(B, C, S, "batchNormGradStats"));
  return channelSums<SumKind::GradStats>(sumDy, sumDyXhat, nullptr, dout, x, mean, rstd, B, C, S, stream,
                                         "batchNormGradStats");
}

Status batchNormBackwardApply(float* dinp, float* dweight, float* dbias, const float* dout, const float* x,
                              const float* mean, const float* rstd, const float* weight, const double* sumDy,
                              const double* sumDyXhat, const double* localSumDy, const double* localSumDyXhat,
                              double count, int B, int C, int S, cudaStream_t stream) {
  const char* what = "batchNormBackwardApply";
  MS_TRY(batchNormStatus(B, C, S, what));
  MS_TRY(countStatus(count, what));
  if (dweight || dbias) {
    batchNormParamGradsKernel<<<detail::gridFor(size_t(C)), kBlockSize, 0, stream>>>(
        dweight, dbias, localSumDy, localSumDyXhat, C);
    MS_TRY(checkLaunch("batchNormBackwardApply: dweight, dbias"));
  }
  if (!dinp) return Status::ok();
  const size_t total = size_t(B) * C * S;
  const unsigned grid = detail::gridFor(total);
  if (total <= kMax32)
    batchNormBackwardInputKernel<unsigned>
        <<<grid, kBlockSize, 0, stream>>>(dinp, dout, x, mean, rstd, weight, sumDy, sumDyXhat, count,
                                          unsigned(S), unsigned(C), unsigned(total));
  else
    batchNormBackwardInputKernel<unsigned long long><<<grid, kBlockSize, 0, stream>>>(
        dinp, dout, x, mean, rstd, weight, sumDy, sumDyXhat, count, S, C, total);
  return checkLaunch("batchNormBackwardApply: dinp");
}

}  // namespace ms::cuda
