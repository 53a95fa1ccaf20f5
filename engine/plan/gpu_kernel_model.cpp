// The catalog GPUs' kernel model; the formulas are in gpu_kernel_model.h.
#include "plan/gpu_kernel_model.h"

#include <algorithm>
#include <cmath>

namespace ms {

namespace {

// The output tiles the model lets cuBLAS pick from (rows x columns of C per thread block).
constexpr double kTiles[][2] = {{256, 128}, {128, 256}, {128, 128}};
// The shortest k slice split-K gives one thread block.
constexpr double kMinSplitK = 512;
// The attention rate's knots: at and below kShortKeys keys attentionShort, at and above kLongKeys
// attentionLong.
constexpr double kShortKeys = 1024, kLongKeys = 4096;

}  // namespace

double GpuKernelModel::gemmSeconds(double peakFlops, double bandwidth, double elementBytes, double m,
                                   double n, double k) const {
  m = std::max(1.0, m);
  n = std::max(1.0, n);
  k = std::max(1.0, k);
  const double smRate = gemmEfficiency * peakFlops / std::max(1, sms);
  const double bytes = elementBytes * (m * k + k * n + m * n);
  double best = HUGE_VAL;
  for (const auto& tile : kTiles) {
    const double tiles = std::ceil(m / tile[0]) * std::ceil(n / tile[1]);
    double split = 1;
    if (tiles < sms) split = std::max(1.0, std::min(std::floor(sms / tiles), std::ceil(k / kMinSplitK)));
    const double waves = std::ceil(tiles * split / sms);
    const double compute = waves * 2.0 * tile[0] * tile[1] * std::ceil(k / split) / smRate;
    const double partials = split > 1 ? split * m * n * 4.0 * 2.0 : 0.0;  // fp32 partials written, read back
    const double memory = (bytes + partials) / (bandwidth * elementwiseEfficiency);
    best = std::min(best, std::max(compute, memory));
  }
  return std::max(best, minKernelSeconds);
}

double GpuKernelModel::attentionForwardSeconds(double peakFlops, double flops, double keys) const {
  const double x =
      std::clamp(std::log2(std::max(keys, 1.0) / kShortKeys) / std::log2(kLongKeys / kShortKeys), 0.0, 1.0);
  const double fraction = attentionShort + x * (attentionLong - attentionShort);
  return std::max(minKernelSeconds, flops / (fraction * peakFlops));
}

double GpuKernelModel::attentionBackwardSeconds(double peakFlops, double flops, double keys) const {
  return attentionBackward * attentionForwardSeconds(peakFlops, flops, keys);
}

double GpuKernelModel::elementwiseSeconds(double bandwidth, double bytes) const {
  return std::max(minKernelSeconds, bytes / (bandwidth * elementwiseEfficiency));
}

double GpuKernelModel::optimizerSeconds(double bandwidth, double bytes) const {
  return std::max(minKernelSeconds, bytes / (bandwidth * optimizerEfficiency));
}

}  // namespace ms
