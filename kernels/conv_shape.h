// The shape of a 2-D convolution (NCHW), and the checks of the convolution and batch-norm shapes, shared by
// the CPU kernels (kernels/cpu/cpu_ops.h), the Backend interface (kernels/backend.h) and the CUDA kernels:
// one definition for all of them. Header-only, standard library only.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ms {

// A 2-D convolution's shape: input (B, C, H, W), weight (OC, C, KH, KW), output (B, OC, outH(), outW()),
// zero padding pad on every side, the same stride both ways.
struct Conv2dShape {
  int B = 1, C = 1, H = 1, W = 1, OC = 1, KH = 1, KW = 1, stride = 1, pad = 0;
  int outH() const { return (H + 2 * pad - KH) / stride + 1; }
  int outW() const { return (W + 2 * pad - KW) / stride + 1; }
  // The unfolded input of one sample (im2col): K = C * KH * KW rows of P = outH() * outW() positions.
  int K() const { return C * KH * KW; }
  int P() const { return outH() * outW(); }
  // "" when the shape can be computed, else what is wrong with it: every size and the stride at least 1,
  // pad at least 0, the kernel no larger than the padded input (else there is no output position; the
  // formula of outH() would round a negative size up to 1), and one sample's input, output and unfolded
  // input each under 2^31 elements (the kernels index a sample with int, as cuBLAS does).
  std::string problem() const {
    const auto shape = [&] {
      return "(B " + std::to_string(B) + ", C " + std::to_string(C) + ", H " + std::to_string(H) + ", W " +
             std::to_string(W) + ", OC " + std::to_string(OC) + ", kernel " + std::to_string(KH) + "x" +
             std::to_string(KW) + ", stride " + std::to_string(stride) + ", pad " + std::to_string(pad) + ")";
    };
    if (B < 1 || C < 1 || H < 1 || W < 1 || OC < 1 || KH < 1 || KW < 1)
      return "every size must be at least 1 " + shape();
    if (stride < 1) return "the stride must be at least 1 " + shape();
    if (pad < 0) return "the padding must not be negative " + shape();
    using I = int64_t;
    if (I(H) + 2 * I(pad) < KH || I(W) + 2 * I(pad) < KW)
      return "the kernel is larger than the padded input, no output positions " + shape();
    // In double: the products of several ints may pass 2^63; below 2^53 every one is exact.
    using D = double;
    const D oh = D((I(H) + 2 * I(pad) - KH) / stride + 1), ow = D((I(W) + 2 * I(pad) - KW) / stride + 1);
    const D k = D(C) * KH * KW, p = oh * ow, most = D(INT_MAX);
    if (D(C) * H * W > most || k > most || p > most || D(OC) * p > most || k * p > most || D(OC) * k > most)
      return "one sample's tensors exceed 2^31 - 1 elements " + shape();
    return {};
  }
};

// "" when batch norm over (B, C, S) can be computed (every size at least 1), else what is wrong.
inline std::string batchNormShapeProblem(int B, int C, int S) {
  if (B < 1 || C < 1 || S < 1)
    return "every size must be at least 1 (B " + std::to_string(B) + ", C " + std::to_string(C) + ", S " +
           std::to_string(S) + ")";
  return {};
}

// "" when rotary embeddings with grouped-query repetition apply to H query heads, KV key/value heads of hs
// elements (KV >= 1 dividing H, hs even), else what is wrong.
inline std::string ropeShapeProblem(int H, int KV, int hs) {
  if (H < 1 || KV < 1 || H % KV != 0)
    return "the query heads (" + std::to_string(H) +
           ") must be a positive multiple of the key/value heads (" + std::to_string(KV) + ")";
  if (hs < 2 || hs % 2 != 0) return "the head size (" + std::to_string(hs) + ") must be even";
  return {};
}

}  // namespace ms
