// The Llama-family pieces: RMSNorm, SwiGLU and rotary embeddings with grouped-query head repetition (see
// cpu_ops.h). RMSNorm's parameter gradient sums over rows as layernorm.cpp does (per-thread partials in
// thread order: bit-reproducible for a given thread count).
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace ms::cpu {
namespace {

// cos and sin of position t's angles, (T, hs / 2) each, computed as Hugging Face's LlamaRotaryEmbedding does
// in fp32: inv_freq_i = 1 / theta^(2i / hs), angle = t * inv_freq_i (one fp32 product), then cos and sin.
void ropeTables(std::vector<float>& cosT, std::vector<float>& sinT, int T, int hs, float theta,
                int posStart) {
  const int half = hs / 2;
  cosT.resize(size_t(T) * half);
  sinT.resize(size_t(T) * half);
  std::vector<float> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    // theta^e in double, rounded once (correctly rounded, where powf may be an ulp off): the CUDA kernels
    // compute it the same way, so both backends' angle tables agree bit for bit.
    const float e = float(2 * i) / float(hs);
    inv[i] = 1.0f / static_cast<float>(std::pow(double(theta), double(e)));
  }
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < half; ++i) {
      const float a = float(posStart + t) * inv[i];
      cosT[size_t(t) * half + i] = static_cast<float>(std::cos(double(a)));
      sinT[size_t(t) * half + i] = static_cast<float>(std::sin(double(a)));
    }
}

// dst (hs) = src rotated (sign +1) or rotated back (sign -1) by the angles c, s (hs / 2).
inline void rotate(float* dst, const float* src, const float* c, const float* s, int half, float sign) {
  for (int i = 0; i < half; ++i) {
    const float x0 = src[i], x1 = src[i + half];
    dst[i] = x0 * c[i] - sign * x1 * s[i];
    dst[i + half] = x1 * c[i] + sign * x0 * s[i];
  }
}

}  // namespace

void rmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps) {
  if (N <= 0 || C <= 0) return;
  const float invC = 1.0f / float(C);
  const bool par = size_t(N) * size_t(C) >= detail::kMinParallelWork;
#pragma omp parallel for schedule(static) if (par)
  for (int n = 0; n < N; n++) {
    const float* x = inp + size_t(n) * C;
    float* y = out + size_t(n) * C;
    const float sq = detail::laneSum(C, [&](ptrdiff_t c) { return x[c] * x[c]; });
    const float s = 1.0f / std::sqrt(sq * invC + eps);
#pragma omp simd
    for (int c = 0; c < C; c++) y[c] = x[c] * s * weight[c];
    rstd[n] = s;
  }
}

void rmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                     const float* rstd, int N, int C) {
  // y = x s w with s = (mean(x^2) + eps)^(-1/2): dx = s (w dy) - x s^3 mean(w dy x); dw = sum_n x s dy.
  if (N <= 0 || C <= 0) return;
  const float invC = 1.0f / float(C);
  const bool par = size_t(N) * size_t(C) >= detail::kMinParallelWork;
  const size_t stride = (size_t(C) + 15) / 16 * 16;
  std::vector<float> storage(dweight ? size_t(par ? detail::maxThreads() : 1) * stride + 16 : 0);
  float* partial =
      storage.data() + (16 - (reinterpret_cast<uintptr_t>(storage.data()) / sizeof(float)) % 16) % 16;
#pragma omp parallel if (par)
  {
    const int nt = omp_get_num_threads();
    const int tid = omp_get_thread_num();
    size_t begin = 0, end = 0;
    detail::splitRange(size_t(N), tid, nt, begin, end);
    float* pw = dweight ? partial + size_t(tid) * stride : nullptr;
    if (pw)
      for (int c = 0; c < C; c++) pw[c] = 0.0f;
    for (size_t n = begin; n < end; n++) {
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      float* dx = dinp + n * C;
      const float s = rstd[n];
      const float dot = detail::laneSum(C, [&](ptrdiff_t c) { return weight[c] * dy[c] * x[c]; }) * invC;
      const float k = s * s * s * dot;
#pragma omp simd
      for (int c = 0; c < C; c++) dx[c] += s * weight[c] * dy[c] - k * x[c];
      if (pw) {
#pragma omp simd
        for (int c = 0; c < C; c++) pw[c] += x[c] * s * dy[c];
      }
    }
    if (dweight) {
#pragma omp barrier
#pragma omp for schedule(static)
      for (int c = 0; c < C; c++) {
        float sw = 0.0f;
        for (int t = 0; t < nt; t++) sw += partial[size_t(t) * stride + c];
        dweight[c] += sw;
      }
    }
  }
}

void swigluForward(float* out, const float* gate, const float* up, size_t n) {
  const ptrdiff_t count = ptrdiff_t(n);
  detail::forEachSimd(count, n >= detail::kMinParallelWork, [=](ptrdiff_t i) {
    const float g = gate[i];
    out[i] = g / (1.0f + detail::vexp(-g)) * up[i];
  });
}

void swigluBackward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                    size_t n) {
  // silu'(g) = s (1 + g (1 - s)), s = sigmoid(g).
  const ptrdiff_t count = ptrdiff_t(n);
  detail::forEachSimd(count, n >= detail::kMinParallelWork, [=](ptrdiff_t i) {
    const float g = gate[i];
    const float s = 1.0f / (1.0f + detail::vexp(-g));
    const float d = dout[i];
    dgate[i] += d * up[i] * s * (1.0f + g * (1.0f - s));
    dup[i] += d * g * s;
  });
}

void ropePackQkv(float* qkv, const float* q, const float* k, const float* v, int B, int T, int H, int KV,
                 int hs, float theta, int posStart) {
  if (B <= 0 || T <= 0 || H <= 0 || KV <= 0 || hs <= 0) return;
  std::vector<float> cosT, sinT;
  ropeTables(cosT, sinT, T, hs, theta, posStart);
  const int half = hs / 2, group = H / KV;
  const size_t Cq = size_t(H) * hs, Ckv = size_t(KV) * hs;
  const int N = B * T;
#pragma omp parallel for schedule(static) if (size_t(N) * Cq >= detail::kMinParallelWork)
  for (int n = 0; n < N; n++) {
    const int t = n % T;
    const float* c = cosT.data() + size_t(t) * half;
    const float* s = sinT.data() + size_t(t) * half;
    float* row = qkv + size_t(n) * 3 * Cq;
    for (int h = 0; h < H; h++) {
      const int j = h / group;
      rotate(row + size_t(h) * hs, q + size_t(n) * Cq + size_t(h) * hs, c, s, half, 1.0f);
      rotate(row + Cq + size_t(h) * hs, k + size_t(n) * Ckv + size_t(j) * hs, c, s, half, 1.0f);
      const float* vs = v + size_t(n) * Ckv + size_t(j) * hs;
      float* vd = row + 2 * Cq + size_t(h) * hs;
      for (int i = 0; i < hs; i++) vd[i] = vs[i];
    }
  }
}

void ropeUnpackQkv(float* dq, float* dk, float* dv, const float* dqkv, int B, int T, int H, int KV, int hs,
                   float theta, int posStart) {
  if (B <= 0 || T <= 0 || H <= 0 || KV <= 0 || hs <= 0) return;
  std::vector<float> cosT, sinT;
  ropeTables(cosT, sinT, T, hs, theta, posStart);
  const int half = hs / 2, group = H / KV;
  const size_t Cq = size_t(H) * hs, Ckv = size_t(KV) * hs;
  const int N = B * T;
#pragma omp parallel if (size_t(N) * Cq >= detail::kMinParallelWork)
  {
    std::vector<float> sum(static_cast<size_t>(hs));
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      const int t = n % T;
      const float* c = cosT.data() + size_t(t) * half;
      const float* s = sinT.data() + size_t(t) * half;
      const float* row = dqkv + size_t(n) * 3 * Cq;
      for (int h = 0; h < H; h++)
        rotate(dq + size_t(n) * Cq + size_t(h) * hs, row + size_t(h) * hs, c, s, half, -1.0f);
      for (int j = 0; j < KV; j++) {
        // The group's key gradients summed (in head order), then rotated back once: the rotation is linear.
        for (int i = 0; i < hs; i++) sum[i] = 0.0f;
        for (int h = j * group; h < (j + 1) * group; h++)
          for (int i = 0; i < hs; i++) sum[i] += row[Cq + size_t(h) * hs + i];
        rotate(dk + size_t(n) * Ckv + size_t(j) * hs, sum.data(), c, s, half, -1.0f);
        float* dvj = dv + size_t(n) * Ckv + size_t(j) * hs;
        for (int i = 0; i < hs; i++) dvj[i] = 0.0f;
        for (int h = j * group; h < (j + 1) * group; h++)
          for (int i = 0; i < hs; i++) dvj[i] += row[2 * Cq + size_t(h) * hs + i];
      }
    }
  }
}

}  // namespace ms::cpu
