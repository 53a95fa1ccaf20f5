// How long a catalog GPU's kernels take, by shape: the model the cost model uses for a catalog GPU's layers
// (plan/cost_model.cpp), so that a small model's GEMMs and a large one's are costed by what the hardware does
// with their shapes instead of one efficiency for every FLOP. A measured device (plan/device_profile.h)
// reads its own curves instead; a config's own device types keep their one achievable fraction.
//
// The figures, for each catalog GPU (hardware.cpp cites each):
//   - GEMM: the published Maximum Achievable Matmul FLOPS (the best rate cuBLAS reached over a search of
//     shapes, Bekman, "Machine Learning Engineering", compute/accelerator, MAMF table) as the rate one SM
//     reaches on a whole output tile, and the SM count (the vendor's architecture whitepaper);
//   - the attention core's rate, and elementwise and optimizer bandwidth as fractions of the datasheet
//     figures, measured on this project's H100 (docs/gpu-logs/2026-11-26b-h100-profile-torch.txt: PyTorch's
//     cuDNN attention, GELU and fused AdamW kernels, per-kernel times from bench/kernel_profile.cpp).
//
// The GEMM (m x k times k x n): the output is cut into tiles (256x128, 128x256 or 128x128, the large tiles
// cuBLAS picks on Hopper and Ampere), the tiles run in waves of one tile per SM, each tile taking
// 2 tm tn k / (MAMF / SMs). So a GEMM whose tiles leave part of the last wave idle, or whose edge tiles are
// mostly padding, is slower per FLOP: wave and tile quantisation (NVIDIA, "Matrix Multiplication Background
// User's Guide", sections on tile and wave quantization). An output of fewer tiles than SMs splits k over up
// to SMs / tiles slices of at least 512 (split-K), its fp32 partials written and read back. A tile's time is
// the longer of that compute and the bytes it must move (both inputs and the output once, and the partials)
// over the elementwise bandwidth; the GEMM takes the tile with the shortest, and at least one short kernel's
// duration. Tested against PyTorch's GEMMs on an H100 (tst_hardware gemmModelMatchesPyTorchOnH100: one
// GPT-2 124M step's 147 GEMMs, 8.91 ms predicted against 8.50 measured).
//
// What always holds: every time is finite, > 0 for positive sizes, and never below minKernelSeconds; a GEMM
// never runs faster than m n k 2 / MAMF.
#pragma once

#include <string>

namespace ms {

struct GpuKernelModel {
  int sms = 0;                       // streaming multiprocessors
  double gemmEfficiency = 0;         // MAMF / dense peak: the rate of whole tiles in full waves
  double attentionShort = 0;         // attention forward's fraction of the peak at <= 1024 keys
  double attentionLong = 0;          // ... at >= 4096 keys (log-linear between)
  double attentionBackward = 0;      // backward time / forward time
  double elementwiseEfficiency = 0;  // of the memory bandwidth, for an elementwise pass
  double optimizerEfficiency = 0;    // of the memory bandwidth, for the fused AdamW step
  double minKernelSeconds = 0;       // the shortest kernel's duration on the GPU
  std::string source;                // what the figures come from, for people (the catalog's comment)

  // One GEMM, seconds: `peakFlops` the device's dense peak at the GEMM's precision, `bandwidth` its memory
  // bandwidth, `elementBytes` the inputs' and output's element size (2 for bf16, 4 for fp32).
  double gemmSeconds(double peakFlops, double bandwidth, double elementBytes, double m, double n,
                     double k) const;
  // The attention core over `keys` keys per query: forward and backward for `flops` forward FLOPs.
  double attentionForwardSeconds(double peakFlops, double flops, double keys) const;
  double attentionBackwardSeconds(double peakFlops, double flops, double keys) const;
  // One elementwise pass moving `bytes` (reads plus writes); the optimizer step moving `bytes`.
  double elementwiseSeconds(double bandwidth, double bytes) const;
  double optimizerSeconds(double bandwidth, double bytes) const;
};

}  // namespace ms
