// Pointwise ops over flat buffers: one parallel, vectorised loop each. GELU and tanh use the vectorisable
// exp and tanh of vec_math.h; glibc's expf and tanhf are scalar (tanhf is about 13x slower here).
#include <cstddef>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace ms::cpu {
namespace {

// GELU, tanh approximation (Hendrycks & Gimpel 2016, section 2):
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

bool parallel(size_t n) {
  return n >= detail::kMinParallelWork;
}

}  // namespace

void geluForward(float* out, const float* inp, size_t n) {
  // 0.5 (1 + tanh u) = sigmoid(2u), so gelu(x) = x / (1 + exp(-2u)): one exp and one division, and no
  // cancellation in 1 + tanh u for negative x.
  const ptrdiff_t count = ptrdiff_t(n);
  detail::forEachSimd(count, parallel(n), [=](ptrdiff_t i) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCube * x * x * x);
    out[i] = x / (1.0f + detail::vexp(-2.0f * u));
  });
}

void geluBackward(float* dinp, const float* dout, const float* inp, size_t n) {
  // d/dx = 0.5 (1 + tanh u) + 0.5 x sech^2(u) du/dx with du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
  // With s = sigmoid(2u) = 1 / (1 + e), e = exp(-2u): 0.5 (1 + tanh u) = s and 0.5 sech^2(u) = 2 s (1 - s),
  // where 1 - s = e s has no cancellation.
  const ptrdiff_t count = ptrdiff_t(n);
  detail::forEachSimd(count, parallel(n), [=](ptrdiff_t i) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCube * x * x * x);
    const float e = detail::vexp(-2.0f * u);
    const float s = 1.0f / (1.0f + e);
    const float local = s + 2.0f * x * s * (e * s) * kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
    dinp[i] += local * dout[i];
  });
}

void reluForward(float* out, const float* inp, size_t n) {
  const ptrdiff_t count = ptrdiff_t(n);
  detail::forEachSimd(count, parallel(n), [=](ptrdiff_t i) { out[i] = inp[i] > 0.0f ? inp[i] : 0.0f; });
}

void reluBackward(float* dinp, const float* dout, const float* inp, size_t n) {
  const ptrdiff_t count = ptrdiff_t(n);
  detail::forEachSimd(count, parallel(n), [=](ptrdiff_t i) { dinp[i] += inp[i] > 0.0f ? dout[i] : 0.0f; });
}

void tanhForward(float* out, const float* inp, size_t n) {
  const ptrdiff_t count = ptrdiff_t(n);
  detail::forEachSimd(count, parallel(n), [=](ptrdiff_t i) { out[i] = detail::vtanh(inp[i]); });
}

void tanhBackward(float* dinp, const float* dout, const float* out, size_t n) {
  const ptrdiff_t count = ptrdiff_t(n);
  detail::forEachSimd(count, parallel(n),
                      [=](ptrdiff_t i) { dinp[i] += dout[i] * (1.0f - out[i] * out[i]); });
}

void add(float* out, const float* a, const float* b, size_t n) {
  // out may alias a or b: each element is read before it is written.
  const ptrdiff_t count = ptrdiff_t(n);
  detail::forEachSimd(count, parallel(n), [=](ptrdiff_t i) { out[i] = a[i] + b[i]; });
}

void accumulate(float* y, const float* x, size_t n) {
  const ptrdiff_t count = ptrdiff_t(n);
  detail::forEachSimd(count, parallel(n), [=](ptrdiff_t i) { y[i] += x[i]; });
}

void scale(float* y, float s, size_t n) {
  const ptrdiff_t count = ptrdiff_t(n);
  detail::forEachSimd(count, parallel(n), [=](ptrdiff_t i) { y[i] *= s; });
}

}  // namespace ms::cpu
