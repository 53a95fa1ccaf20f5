// bench/attention: the fused attention's kernels (the scalar one and the two tensor-core ones, mma.sync and
// wmma, of kernels/cuda/cuda_flash_attention*.cu) and the materialised cuBLAS path (cuda_attention.cu),
// forward and backward, on GPT-2 124M's attention: B 8, T 1024, C 768, H 12 (head size 64), causal,
// GemmMode::Bf16. cudaEvent timing, the median of --iters calls after 3 warm-up calls; ratios against the
// scalar kernel measured in the same run. The tensor-core results (out, lse, dqkv) are checked against the
// scalar kernel's outside the timed region with tst_cuda_kernels' bf16 attention tolerance; a mismatch makes
// the exit status 1. Without a CUDA device it says so and exits 0.
//
// usage: bench_attention [--iters N] [--batch B] [--seq T]
// Columns: median ms per forward, per backward, their sum, the sum's speed-up over the scalar kernel (> 1:
// faster), and the nominal rate: causal attention's useful FLOPs (forward 2 GEMMs of 2 T^2 hs per head,
// halved by the mask; backward 2.5 times that, as Dao 2023 counts) over the summed time.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/blas_core.h"
#include "kernels/cuda/cuda_info.h"
#include "kernels/cuda/cuda_ops.h"

namespace cuda = ms::cuda;

namespace {

using Vec = std::vector<float>;
template <typename T>
using DBuf = cuda::DeviceBuffer<T>;

struct Shape {
  int B = 8, T = 1024, C = 768, H = 12;
  bool causal = true;
};

struct Timing {
  double forwardMs = 0, backwardMs = 0;
};

// Everything one run needs on the device: inputs, the flash buffers, the materialised path's (B, H, T, T)
// probabilities and scratch.
struct Buffers {
  DBuf<float> qkv, dout, out, lse, dqkv, scratch, att, attScratch;
};

ms::Status allocate(Buffers& b, const Shape& s) {
  const size_t btc = size_t(s.B) * s.T * s.C, bht = size_t(s.B) * s.H * s.T, att = bht * s.T;
  const std::pair<DBuf<float>*, size_t> all[] = {{&b.qkv, 3 * btc}, {&b.dout, btc},      {&b.out, btc},
                                                 {&b.lse, bht},     {&b.dqkv, 3 * btc},  {&b.scratch, bht},
                                                 {&b.att, att},     {&b.attScratch, att}};
  for (const auto& [buf, n] : all) {
    ms::Expected<DBuf<float>> created = DBuf<float>::create(n);
    if (!created) return created.status();
    *buf = std::move(*created);
  }
  return ms::Status::ok();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Median ms of forward and of backward over iters calls, after 3 untimed ones.
ms::Expected<Timing> timeCalls(const std::function<ms::Status()>& forward,
                               const std::function<ms::Status()>& backward, int iters, cudaStream_t stream) {
  cudaEvent_t e0 = nullptr, e1 = nullptr, e2 = nullptr;
  MS_TRY(cuda::cudaStatus(cudaEventCreate(&e0), "cudaEventCreate"));
  MS_TRY(cuda::cudaStatus(cudaEventCreate(&e1), "cudaEventCreate"));
  MS_TRY(cuda::cudaStatus(cudaEventCreate(&e2), "cudaEventCreate"));
  std::vector<double> fwd, bwd;
  ms::Status status;
  for (int it = -3; it < iters && status.isOk(); ++it) {
    status = cuda::cudaStatus(cudaEventRecord(e0, stream), "cudaEventRecord");
    if (status.isOk()) status = forward();
    if (status.isOk()) status = cuda::cudaStatus(cudaEventRecord(e1, stream), "cudaEventRecord");
    if (status.isOk()) status = backward();
    if (status.isOk()) status = cuda::cudaStatus(cudaEventRecord(e2, stream), "cudaEventRecord");
    if (status.isOk()) status = cuda::cudaStatus(cudaEventSynchronize(e2), "cudaEventSynchronize");
    float f = 0, b = 0;
    if (status.isOk()) status = cuda::cudaStatus(cudaEventElapsedTime(&f, e0, e1), "cudaEventElapsedTime");
    if (status.isOk()) status = cuda::cudaStatus(cudaEventElapsedTime(&b, e1, e2), "cudaEventElapsedTime");
    if (status.isOk() && it >= 0) {
      fwd.push_back(f);
      bwd.push_back(b);
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaEventDestroy(e2);
  if (!status.isOk()) return status;
  return Timing{median(fwd), median(bwd)};
}

// The largest violation of |got - ref| <= atol + rtol |ref| as "index: got vs ref", or "" when none.
std::string worst(const Vec& got, const Vec& ref, double atol, double rtol, double& maxDiff) {
  maxDiff = 0;
  std::string bad;
  double worstExcess = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    maxDiff = std::max(maxDiff, std::isnan(d) ? INFINITY : d);
    const double excess = d - (atol + rtol * std::fabs(double(ref[i])));
    if (!(excess <= worstExcess)) {  // also NaN
      worstExcess = std::isnan(excess) ? INFINITY : excess;
      bad = std::to_string(i) + ": " + std::to_string(got[i]) + " vs " + std::to_string(ref[i]);
    }
  }
  return bad;
}

ms::Status download(Vec& dst, const DBuf<float>& src, cudaStream_t stream) {
  dst.resize(src.size());
  return cuda::copyToHost(dst.data(), src.data(), src.bytes(), stream);
}

// Runs forward + backward once with `kernel` from dqkv = 0 and downloads out, lse and dqkv.
ms::Status flashOnce(cuda::FlashAttentionKernel kernel, Buffers& b, const Shape& s, cudaStream_t stream,
                     Vec& out, Vec& lse, Vec& dqkv) {
  MS_TRY(cuda::fillZero(b.dqkv.data(), b.dqkv.bytes(), stream));
  MS_TRY(cuda::flashAttentionForwardWith(kernel, b.out.data(), b.lse.data(), b.qkv.data(), s.B, s.T, s.C, s.H,
                                         s.causal, stream));
  MS_TRY(cuda::flashAttentionBackwardWith(kernel, b.dqkv.data(), b.scratch.data(), b.dout.data(),
                                          b.qkv.data(), b.out.data(), b.lse.data(), s.B, s.T, s.C, s.H,
                                          s.causal, stream));
  MS_TRY(download(out, b.out, stream));
  MS_TRY(download(lse, b.lse, stream));
  return download(dqkv, b.dqkv, stream);
}

int run(const Shape& s, int iters) {
  cudaStream_t stream = nullptr;
  auto fail = [&](const ms::Status& st) {
    std::fprintf(stderr, "bench_attention: %s\n", st.message().c_str());
    if (stream) cudaStreamDestroy(stream);
    return 1;
  };
  ms::Status st = cuda::cudaStatus(cudaStreamCreate(&stream), "cudaStreamCreate");
  if (!st.isOk()) return fail(st);
  cuda::setGemmMode(cuda::GemmMode::Bf16);
  st = cuda::prepareGemm(stream);
  if (!st.isOk()) return fail(st);
  Buffers b;
  st = allocate(b, s);
  if (!st.isOk()) return fail(st);
  {
    std::mt19937 rng(20240612);
    std::uniform_real_distribution<float> wide(-2.0f, 2.0f), unit(-1.0f, 1.0f);
    Vec qkv(b.qkv.size()), dout(b.dout.size());
    for (float& x : qkv) x = wide(rng);
    for (float& x : dout) x = unit(rng);
    st = cuda::copyToDevice(b.qkv.data(), qkv.data(), b.qkv.bytes(), stream);
    if (st.isOk()) st = cuda::copyToDevice(b.dout.data(), dout.data(), b.dout.bytes(), stream);
    if (!st.isOk()) return fail(st);
  }

  // Correctness first, outside any timed region: each tensor-core kernel against the scalar kernel.
  const cuda::FlashAttentionKernel checked[] = {cuda::FlashAttentionKernel::Scalar,
                                                cuda::FlashAttentionKernel::TensorCore,
                                                cuda::FlashAttentionKernel::TensorCoreWmma};
  Vec out[3], lse[3], dqkv[3];
  for (int k = 0; k < 3; ++k) {
    st = flashOnce(checked[k], b, s, stream, out[k], lse[k], dqkv[k]);
    if (!st.isOk()) return fail(st);
  }
  struct Check {
    double out = 0, lse = 0, dqkv = 0;
    std::string bad;
  } checks[3];
  for (int k = 1; k < 3; ++k) {
    const std::string badOut = worst(out[k], out[0], 2e-2, 1e-2, checks[k].out);
    const std::string badLse = worst(lse[k], lse[0], 1e-4, 1e-4, checks[k].lse);
    const std::string badDqkv = worst(dqkv[k], dqkv[0], 2e-2, 1e-2, checks[k].dqkv);
    for (const auto& [what, bad] : {std::pair{"out", badOut}, {"lse", badLse}, {"dqkv", badDqkv}})
      if (!bad.empty()) checks[k].bad += std::string("  ") + what + " " + bad + "\n";
  }
  const bool ok = checks[1].bad.empty() && checks[2].bad.empty();

  struct Path {
    const char* name;
    std::function<ms::Status()> forward, backward;
  };
  auto flashPath = [&](const char* name, cuda::FlashAttentionKernel k) {
    return Path{name,
                [&, k] {
                  return cuda::flashAttentionForwardWith(k, b.out.data(), b.lse.data(), b.qkv.data(), s.B,
                                                         s.T, s.C, s.H, s.causal, stream);
                },
                [&, k] {
                  return cuda::flashAttentionBackwardWith(k, b.dqkv.data(), b.scratch.data(), b.dout.data(),
                                                          b.qkv.data(), b.out.data(), b.lse.data(), s.B, s.T,
                                                          s.C, s.H, s.causal, stream);
                }};
  };
  const Path paths[] = {
      flashPath("flash scalar", cuda::FlashAttentionKernel::Scalar),
      flashPath("flash tensor-core", cuda::FlashAttentionKernel::TensorCore),
      flashPath("flash tc (wmma)", cuda::FlashAttentionKernel::TensorCoreWmma),
      {"materialised",
       [&] {
         return cuda::attentionForward(b.out.data(), b.att.data(), b.qkv.data(), s.B, s.T, s.C, s.H, s.causal,
                                       stream);
       },
       [&] {
         return cuda::attentionBackward(b.dqkv.data(), b.attScratch.data(), b.dout.data(), b.qkv.data(),
                                        b.att.data(), s.B, s.T, s.C, s.H, s.causal, stream);
       }},
  };

  const double hs = double(s.C) / s.H;
  const double forwardFlops = 4.0 * s.B * s.H * double(s.T) * s.T * hs * (s.causal ? 0.5 : 1.0);
  const double totalFlops = 3.5 * forwardFlops;
  std::printf("bench_attention: B %d T %d C %d H %d (head size %g) %s, bf16, %s, median of %d calls\n", s.B,
              s.T, s.C, s.H, hs, s.causal ? "causal" : "bidirectional", cuda::deviceName(0).c_str(), iters);
  std::printf("%-18s %12s %12s %12s %10s %10s\n", "kernel", "forward ms", "backward ms", "total ms",
              "vs scalar", "TFLOP/s");
  double scalarTotal = 0;
  for (const Path& p : paths) {
    ms::Expected<Timing> t = timeCalls(p.forward, p.backward, iters, stream);
    if (!t) return fail(t.status().withContext(p.name));
    const double total = t->forwardMs + t->backwardMs;
    if (scalarTotal == 0) scalarTotal = total;
    std::printf("%-18s %12.3f %12.3f %12.3f %10.2f %10.1f\n", p.name, t->forwardMs, t->backwardMs, total,
                scalarTotal / total, totalFlops / (total * 1e-3) / 1e12);
  }
  for (int k = 1; k < 3; ++k) {
    std::printf("check, %s vs scalar: max |diff| out %.3g, lse %.3g, dqkv %.3g: %s\n",
                k == 1 ? "tensor-core (mma)" : "tensor-core (wmma)", checks[k].out, checks[k].lse,
                checks[k].dqkv, checks[k].bad.empty() ? "ok" : "MISMATCH");
    std::printf("%s", checks[k].bad.c_str());
  }
  cudaStreamDestroy(stream);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  ms::cpu::selectBlasCore(argv);  // the kernels the engine runs (kernels/cpu/blas_core.h)
  Shape shape;
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool hasValue = i + 1 < argc;
    if (a == "--iters" && hasValue) {
      iters = std::atoi(argv[++i]);
    } else if (a == "--batch" && hasValue) {
      shape.B = std::atoi(argv[++i]);
    } else if (a == "--seq" && hasValue) {
      shape.T = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_attention [--iters N] [--batch B] [--seq T]\n");
      return 2;
    }
  }
  if (iters <= 0 || shape.B <= 0 || shape.T <= 0) {
    std::fprintf(stderr, "bench_attention: --iters, --batch and --seq must be positive\n");
    return 2;
  }
  if (cuda::deviceCount() == 0) {
    std::printf("bench_attention: no CUDA device (%s): nothing timed\n", cuda::unavailableReason().c_str());
    return 0;
  }
  return run(shape, iters);
}
