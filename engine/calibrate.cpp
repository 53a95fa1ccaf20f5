// `meshstudio-engine calibrate` and its link ranks (calibrate.h); the profile is documented in
// docs/calibration.md. Compute is measured through the Backend interface exactly as training calls it (same
// ops, same GEMM precision switch, same thread setting); links through the MPI communicator training uses.
//
// What always holds: a timed region contains only the op (buffers are allocated, filled and converted
// before it); every link measurement's data is checked after its timed region, and wrong data fails the run;
// both link ranks run the same number of repetitions (derived from the slower rank's probe) and report the
// slower rank's time; every child process is waited for with a deadline and, past it, killed with its
// whole session.
#include "calibrate.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include <nlohmann/json.hpp>

#include "kernels/backend.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/cpu_ops.h"
#include "plan/device_profile.h"
#include "runtime/file_io.h"
#include "supervisor.h"

// OpenBLAS's build description ("OpenBLAS 0.3.21 DYNAMIC_ARCH USE_OPENMP Prescott MAX_THREADS=64"); weak, so
// a BLAS without it leaves it null instead of failing the link. The kernels it chose for this CPU
// ("SkylakeX"; a DYNAMIC_ARCH build's config names only its baseline) come from cpu::blasCoreName().
extern "C" char* openblas_get_config(void) __attribute__((weak));

namespace ms {

namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---- what is measured ------------------------------------------------------------------------------------

// The grids (docs/calibration.md, "What is measured"). The full grid is sized to stay well within 3 minutes
// on a 2-core machine (138 s on 2026-11-29's Intel VM, idle, three passes with the three GEMM ops, ring
// attention and RoPE); --quick within a few seconds.
struct Grids {
  std::vector<int> gemmM, gemmNK;
  std::vector<int> attentionT, attentionHeadSize;
  // Ring attention's block keys (a context-parallel rank's positions, even): smaller than the sequences
  // above, as a rank holds a cp-th of one.
  std::vector<int> ringT;
  std::vector<size_t> elementwiseFloats, optimizerParams;
  // The named elementwise kernels (plan/device_profile.h VectorKernel): LayerNorm and RMSNorm at each width
  // over rows of each element count (rows = elements / width), GELU and SwiGLU over each element count.
  std::vector<int> layerNormWidths;
  std::vector<size_t> vectorKernelFloats;
  std::vector<size_t> linkBytes;
  double computeBudgetS = 0;  // repetitions of one compute measurement in one pass: at least this much time
  // The compute grid is measured this many times over, and each point keeps its fastest pass (below).
  int computePasses = 1;
  double linkBudgetS = 0;  // ... of one link measurement
};

// GEMMs above 2^33 FLOP are left out: on a CPU each call would take a second or more, and the curve has
// flattened long before.
constexpr double kMaxGemmFlops = 8589934592.0;
// Attention as a GPT block runs it: batch 1, 4 heads, over a grid of head sizes: at small heads the
// per-row softmax and the per-head GEMM calls weigh more than the FLOPs (head size 8 ran at a quarter of
// head size 64's rate here), so one head size cannot cost them all.
constexpr int kAttentionHeads = 4;
// RoPE (measureVectorKernels): the head size, and the longest sequence a call's angle table covers.
constexpr int kRopeHeadSize = 16;
constexpr size_t kRopeSeq = 128;
// Every compute measurement is the median of at least this many timed calls.
constexpr int kMinComputeReps = 3;
// Every link measurement averages at least this many operations.
constexpr int kMinLinkReps = 3;
constexpr int kLinkRanks = 2;

Grids grids(bool quick) {
  Grids g;
  if (quick) {
    g.gemmM = {8, 128, 2048};
    g.gemmNK = {32, 512};
    g.attentionT = {64, 256};
    g.attentionHeadSize = {16, 64};
    g.ringT = {16, 128};
    g.elementwiseFloats = {1024, 65536, 4194304};
    g.optimizerParams = {65536, 1048576};
    g.layerNormWidths = {32, 512};
    g.vectorKernelFloats = {4096, 262144};
    g.linkBytes = {8, 4096, 1048576};
    g.computeBudgetS = 0.005;
  } else {
    g.gemmM = {8, 32, 128, 512, 2048, 8192};
    g.gemmNK = {32, 128, 512, 2048};
    g.attentionT = {32, 64, 128, 256, 512, 1024};
    g.attentionHeadSize = {8, 16, 32, 64, 128};
    g.ringT = {16, 64, 256};
    for (size_t n = 1024; n <= 16777216; n *= 4) g.elementwiseFloats.push_back(n);
    g.optimizerParams = {4096, 65536, 1048576, 16777216};
    g.layerNormWidths = {32, 128, 512, 2048};
    g.vectorKernelFloats = {4096, 65536, 1048576, 4194304};
    // 8 B (the latency), then 16 B to 64 MiB by x4: the quick sizes are points of this curve.
    g.linkBytes = {8};
    for (size_t b = 16; b <= (size_t(64) << 20); b *= 4) g.linkBytes.push_back(b);
    // Three passes of 10 ms a point rather than one of 30: a shared VM's speed moves between seconds (on
    // 2026-11-28's AMD EPYC the same one-rank config measured 1.52 to 2.54 ms a step in consecutive runs,
    // every kernel alike; docs/fidelity.md), and a point measured once lands wherever the machine was at that
    // moment. Each pass covers the grid in about a quarter of a minute, so a point's three passes are seconds
    // apart; the fastest is the machine undisturbed, which bench/fidelity.py's fastest run is judged against.
    g.computeBudgetS = 0.010;
    g.computePasses = 3;
  }
  g.linkBudgetS = 0.020;
  return g;
}

struct GemmShape {
  int m, n, k;
};
std::vector<GemmShape> gemmShapes(const Grids& g) {
  std::vector<GemmShape> out;
  for (int m : g.gemmM)
    for (int n : g.gemmNK)
      for (int k : g.gemmNK)
        if (2.0 * m * n * k <= kMaxGemmFlops) out.push_back({m, n, k});
  return out;
}

constexpr GemmPrecision kPrecisions[] = {GemmPrecision::Fp32, GemmPrecision::Bf16};
// A linear layer's three GEMMs, each measured as the backend runs it (plan/device_profile.h GemmOp).
constexpr GemmOp kGemmOps[] = {GemmOp::Forward, GemmOp::InputGradient, GemmOp::WeightGradient};
const char* precisionName(GemmPrecision p) {
  return p == GemmPrecision::Bf16 ? "bf16" : "fp32";
}

int computeMeasurements(const Grids& g, size_t threadCounts) {
  const size_t perThreads =
      gemmShapes(g).size() * std::size(kPrecisions) * std::size(kGemmOps) +
      (g.attentionT.size() + g.ringT.size()) * g.attentionHeadSize.size() * std::size(kPrecisions) +
      g.elementwiseFloats.size() + g.optimizerParams.size() +
      (3 * g.layerNormWidths.size() + 2) * g.vectorKernelFloats.size();
  return static_cast<int>(perThreads * threadCounts) * g.computePasses;
}

// One line per measurement on stderr, "calibrate: [i/N] what" (the studio reads [i/N]).
class Progress {
 public:
  Progress(int done, int total) : m_done(done), m_total(total) {}
  void line(const std::string& what) {
    ++m_done;
    std::fprintf(stderr, "calibrate: [%d/%d] %s\n", m_done, m_total, what.c_str());
    std::fflush(stderr);
  }
  // Measurements another process announced (a link job's ranks print their own lines).
  void skip(int n) { m_done += n; }
  int done() const { return m_done; }

 private:
  int m_done, m_total;
};

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// ---- compute ---------------------------------------------------------------------------------------------

// Backend memory of `bytes` (fp32 or bf16 values), freed with the scope.
class Buffer {
 public:
  Buffer(Backend& be, size_t bytes) : m_be(be), m_bytes(bytes), m_ptr(be.allocate(bytes)) {}
  ~Buffer() { m_be.deallocate(m_ptr, m_bytes); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* f() const { return static_cast<float*>(m_ptr); }
  bfloat16* b() const { return static_cast<bfloat16*>(m_ptr); }

 private:
  Backend& m_be;
  size_t m_bytes;
  void* m_ptr;
};

// n floats of a fixed pattern in [-scale, scale): values that keep softmax and Adam in their normal range
// (never denormal, never all zero).
void fillPattern(Backend& be, float* dst, size_t n, float scale) {
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = scale * (static_cast<float>((i * 7919) % 2003) / 1001.5f - 1.0f);
  be.upload(dst, host.data(), n * sizeof(float));
}

// Seconds of one call: one warm-up call, then timed calls until they add up to budgetS (and at least
// kMinComputeReps), the median (robust to a call that an interrupt or another process stretched).
double medianSeconds(Backend& be, double budgetS, const std::function<void(int)>& op) {
  op(0);
  be.synchronize();
  std::vector<double> times;
  double total = 0;
  while (total < budgetS || static_cast<int>(times.size()) < kMinComputeReps) {
    const Clock::time_point t0 = Clock::now();
    op(static_cast<int>(times.size()) + 1);
    be.synchronize();
    const double t = since(t0);
    times.push_back(t);
    total += t;
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

void measureGemm(Backend& be, const Grids& g, int threads, Json& out, Progress& progress) {
  const std::vector<GemmShape> shapes = gemmShapes(g);
  size_t inpMax = 0, wMax = 0, outMax = 0;
  for (const GemmShape& s : shapes) {
    inpMax = std::max(inpMax, size_t(s.m) * s.k);
    wMax = std::max(wMax, size_t(s.k) * s.n);
    outMax = std::max(outMax, size_t(s.m) * s.n);
  }
  // Every shape reads a prefix of these; the bf16 copies are the rounded fp32 ones (a prefix of a rounded
  // buffer is the rounded prefix), as training keeps a GEMM's bf16 input and the bf16 working weights. The
  // backward's gradients accumulate (beta = 1) into dinp and dweight as training's do; values stay small (a
  // few thousand calls of products of 0.01 and 0.05 patterns).
  Buffer inp(be, inpMax * 4), weight(be, wMax * 4), result(be, outMax * 4);
  Buffer dout(be, outMax * 4), dinp(be, inpMax * 4), dweight(be, wMax * 4);
  Buffer inp16(be, inpMax * 2), weight16(be, wMax * 2);
  fillPattern(be, inp.f(), inpMax, 1.0f);
  fillPattern(be, weight.f(), wMax, 0.05f);
  fillPattern(be, dout.f(), outMax, 0.01f);
  fillPattern(be, dinp.f(), inpMax, 0.01f);
  fillPattern(be, dweight.f(), wMax, 0.01f);
  be.toBf16(inp16.b(), inp.f(), inpMax);
  be.toBf16(weight16.b(), weight.f(), wMax);
  for (GemmPrecision p : kPrecisions) {
    be.setGemmPrecision(p);
    const bool bf16 = p == GemmPrecision::Bf16;
    const TensorIn in = bf16 ? TensorIn(inp16.b()) : TensorIn(inp.f());
    const TensorIn w = bf16 ? TensorIn(weight16.b()) : TensorIn(weight.f());
    for (GemmOp op : kGemmOps) {
      for (const GemmShape& s : shapes) {
        // The layer out (m, n) = inp (m, k) @ weight (k, n): linear's N = m, C = k, OC = n, for every op.
        const double seconds = medianSeconds(be, g.computeBudgetS, [&](int) {
          switch (op) {
            case GemmOp::Forward:
              be.linearForward(result.f(), in, w, nullptr, s.m, s.k, s.n);
              break;
            case GemmOp::InputGradient:
              be.linearBackward(dinp.f(), nullptr, nullptr, dout.f(), in, w, s.m, s.k, s.n);
              break;
            case GemmOp::WeightGradient:
              be.linearBackward(nullptr, dweight.f(), nullptr, dout.f(), in, w, s.m, s.k, s.n);
              break;
          }
        });
        const double flops = 2.0 * s.m * s.n * s.k;
        out.push_back({{"precision", precisionName(p)},
                       {"op", gemmOpName(op)},
                       {"threads", threads},
                       {"m", s.m},
                       {"n", s.n},
                       {"k", s.k},
                       {"seconds", seconds},
                       {"flops_per_s", flops / seconds}});
        progress.line("gemm " + std::string(precisionName(p)) + " " + gemmOpName(op) + " threads " +
                      std::to_string(threads) + " m " + std::to_string(s.m) + " n " + std::to_string(s.n) +
                      " k " + std::to_string(s.k) + ": " + num(flops / seconds) + " FLOP/s");
      }
    }
  }
  be.setGemmPrecision(GemmPrecision::Fp32);
}

// One attention entry of the profile (docs/calibration.md, device.attention[]); `kernel` null for the fused
// kernel's (the field's default).
Json attentionEntry(const char* kernel, GemmPrecision p, int threads, int B, int H, int T, int hs,
                    bool causal, double flops, double forward, double backward) {
  Json e = {{"precision", precisionName(p)},
            {"threads", threads},
            {"batch", B},
            {"heads", H},
            {"seq", T},
            {"head_size", hs},
            {"causal", causal},
            {"flops", flops},
            {"forward_seconds", forward},
            {"backward_seconds", backward}};
  if (kernel) e["kernel"] = kernel;
  return e;
}

void measureAttention(Backend& be, const Grids& g, int threads, Json& out, Progress& progress) {
  constexpr int B = 1, H = kAttentionHeads;
  constexpr bool causal = true;  // as the GPT blocks call it
  const int Tmax = *std::max_element(g.attentionT.begin(), g.attentionT.end());
  const int Cmax = H * *std::max_element(g.attentionHeadSize.begin(), g.attentionHeadSize.end());
  const size_t qkvN = size_t(B) * Tmax * 3 * Cmax, outN = size_t(B) * Tmax * Cmax;
  Buffer qkv(be, qkvN * 4), dqkv(be, qkvN * 4), att(be, outN * 4), dout(be, outN * 4);
  Buffer saved(be, be.attentionSavedFloats(B, Tmax, Cmax, H) * 4);
  Buffer scratch(be, be.attentionScratchFloats(B, Tmax, Cmax, H) * 4);
  fillPattern(be, qkv.f(), qkvN, 1.0f);
  fillPattern(be, dout.f(), outN, 0.01f);
  for (GemmPrecision p : kPrecisions) {
    // The CPU backend rounds q, k and v (and dout) to the GEMM precision, as tensor cores would.
    be.setGemmPrecision(p);
    for (int hs : g.attentionHeadSize) {
      const int C = H * hs;
      for (int T : g.attentionT) {
        const double forward = medianSeconds(be, g.computeBudgetS, [&](int) {
          be.attentionForward(att.f(), saved.f(), qkv.f(), B, T, C, H, causal);
        });
        // Backward reads what the last forward saved (the forward above ran last at this T).
        const double backward = medianSeconds(be, g.computeBudgetS, [&](int) {
          be.attentionBackward(dqkv.f(), scratch.f(), dout.f(), qkv.f(), saved.f(), att.f(), B, T, C, H,
                               causal);
        });
        // The forward's FLOPs: QK^T and PV, 2 T^2 hs each per head; causal halves them (FlashAttention's
        // count, Dao-AILab/flash-attention benchmarks/benchmark_flash_attention.py, flops()).
        const double flops = 4.0 * B * H * double(T) * T * hs / (causal ? 2 : 1);
        out.push_back(attentionEntry(nullptr, p, threads, B, H, T, hs, causal, flops, forward, backward));
        progress.line("attention " + std::string(precisionName(p)) + " threads " + std::to_string(threads) +
                      " head size " + std::to_string(hs) + " seq " + std::to_string(T) + ": forward " +
                      num(forward) + " s, backward " + num(backward) + " s");
      }
    }
  }
  be.setGemmPrecision(GemmPrecision::Fp32);
}

// Ring attention's two block kernels as the engine calls them (runtime/transformer.cpp ringForward and
// ringBackward) on rank 0 of a ring of two: its T positions are the load-balanced chunks 0 and 3 of four
// (layers.h CpGroup::positionsOf), met first with its own keys and values, then with rank 1's (chunks 1 and
// 2). The two steps' times are summed; the FLOPs are the visible products, half of a causal sequence of 2T
// positions' (each rank of the balanced ring computes the same share).
void measureRingAttention(Backend& be, const Grids& g, int threads, Json& out, Progress& progress) {
  constexpr int B = 1, H = kAttentionHeads, KV = kAttentionHeads;
  constexpr bool causal = true;
  const int Tmax = *std::max_element(g.ringT.begin(), g.ringT.end());
  const int Cmax = H * *std::max_element(g.attentionHeadSize.begin(), g.attentionHeadSize.end());
  const size_t qkvN = size_t(B) * Tmax * 3 * Cmax, outN = size_t(B) * Tmax * Cmax;
  const size_t kvN = size_t(B) * Tmax * 2 * Cmax, lseN = size_t(B) * H * Tmax;
  Buffer qkv(be, qkvN * 4), dqkv(be, qkvN * 4), att(be, outN * 4), dout(be, outN * 4), lse(be, lseN * 4);
  Buffer kv(be, kvN * 4), dkv(be, kvN * 4);
  fillPattern(be, qkv.f(), qkvN, 1.0f);
  fillPattern(be, kv.f(), kvN, 1.0f);
  fillPattern(be, dout.f(), outN, 0.01f);
  for (GemmPrecision p : kPrecisions) {
    be.setGemmPrecision(p);
    for (int hs : g.attentionHeadSize) {
      const int C = H * hs;
      for (int T : g.ringT) {
        const int chunk = T / 2;
        const SeqPositions mine{0, chunk, 3 * chunk}, peer{chunk, chunk, 2 * chunk};
        const double forward = medianSeconds(be, g.computeBudgetS, [&](int) {
          be.attentionBlockForward(att.f(), lse.f(), qkv.f(), kv.f(), B, T, T, C, H, KV, mine, mine, causal,
                                   true);
          be.attentionBlockForward(att.f(), lse.f(), qkv.f(), kv.f(), B, T, T, C, H, KV, mine, peer, causal,
                                   false);
        });
        // Backward reads the out and lse the last forward left (at this T and head size).
        const double backward = medianSeconds(be, g.computeBudgetS, [&](int) {
          be.attentionBlockBackward(dqkv.f(), dkv.f(), dout.f(), qkv.f(), kv.f(), TensorIn(att.f()), lse.f(),
                                    B, T, T, C, H, KV, mine, mine, causal);
          be.attentionBlockBackward(dqkv.f(), dkv.f(), dout.f(), qkv.f(), kv.f(), TensorIn(att.f()), lse.f(),
                                    B, T, T, C, H, KV, mine, peer, causal);
        });
        // Half of the 4 (2T)^2 hs H products of a causal sequence of 2T positions.
        const double flops = 4.0 * B * H * double(2 * T) * (2 * T) * hs / 2.0 / 2.0;
        out.push_back(
            attentionEntry("ring_block", p, threads, B, H, T, hs, causal, flops, forward, backward));
        progress.line("ring attention " + std::string(precisionName(p)) + " threads " +
                      std::to_string(threads) + " head size " + std::to_string(hs) + " block " +
                      std::to_string(T) + ": forward " + num(forward) + " s, backward " + num(backward) +
                      " s");
      }
    }
  }
  be.setGemmPrecision(GemmPrecision::Fp32);
}

void measureElementwise(Backend& be, const Grids& g, int threads, Json& out, Progress& progress) {
  const size_t nMax = *std::max_element(g.elementwiseFloats.begin(), g.elementwiseFloats.end());
  Buffer a(be, nMax * 4), b(be, nMax * 4), c(be, nMax * 4);
  fillPattern(be, a.f(), nMax, 1.0f);
  fillPattern(be, b.f(), nMax, 1.0f);
  for (size_t n : g.elementwiseFloats) {
    const double seconds = medianSeconds(be, g.computeBudgetS, [&](int) { be.add(c.f(), a.f(), b.f(), n); });
    const uint64_t bytes = 12 * uint64_t(n);  // two fp32 reads and one fp32 write an element
    const double rate = double(bytes) / seconds;
    out.push_back({{"threads", threads}, {"bytes", bytes}, {"seconds", seconds}, {"bytes_per_s", rate}});
    progress.line("elementwise threads " + std::to_string(threads) + " " + std::to_string(bytes) +
                  " B: " + num(rate) + " B/s");
  }
}

// The elementwise kernels the plan times by name, as the transformer blocks call them: LayerNorm's and
// RMSNorm's forward and backward (weight gradients accumulated) over rows of each width, GELU's and SwiGLU's
// over elements.
void measureVectorKernels(Backend& be, const Grids& g, int threads, Json& out, Progress& progress) {
  const size_t nMax = *std::max_element(g.vectorKernelFloats.begin(), g.vectorKernelFloats.end());
  const int wMax = *std::max_element(g.layerNormWidths.begin(), g.layerNormWidths.end());
  const size_t rowsMax = nMax / size_t(*std::min_element(g.layerNormWidths.begin(), g.layerNormWidths.end()));
  Buffer x(be, nMax * 4), y(be, nMax * 4), dy(be, nMax * 4), dx(be, nMax * 4), up(be, nMax * 4),
      dup(be, nMax * 4);
  Buffer w(be, size_t(wMax) * 4), b(be, size_t(wMax) * 4), dw(be, size_t(wMax) * 4), db(be, size_t(wMax) * 4);
  Buffer mean(be, rowsMax * 4), rstd(be, rowsMax * 4);
  // RoPE: q, k and v (n / 2 floats each at width n / rows) in, attention's q|k|v (3 n / 2) out, and back.
  const size_t ropeN = 3 * nMax / 2 + 3 * size_t(kRopeHeadSize);
  Buffer src(be, ropeN * 4), qkv(be, ropeN * 4), dsrc(be, ropeN * 4);
  fillPattern(be, src.f(), ropeN, 1.0f);
  fillPattern(be, qkv.f(), ropeN, 0.01f);
  fillPattern(be, x.f(), nMax, 1.0f);
  fillPattern(be, dy.f(), nMax, 0.01f);
  fillPattern(be, up.f(), nMax, 0.5f);
  fillPattern(be, dx.f(), nMax, 0.01f);  // the backwards accumulate (+=) into these
  fillPattern(be, dup.f(), nMax, 0.01f);
  fillPattern(be, w.f(), size_t(wMax), 1.0f);
  fillPattern(be, b.f(), size_t(wMax), 0.1f);
  fillPattern(be, dw.f(), size_t(wMax), 0.0f);
  fillPattern(be, db.f(), size_t(wMax), 0.0f);
  const auto record = [&](VectorKernel kernel, size_t rows, int width, double forward, double backward) {
    out.push_back({{"kernel", vectorKernelName(kernel)},
                   {"threads", threads},
                   {"rows", rows},
                   {"width", width},
                   {"forward_seconds", forward},
                   {"backward_seconds", backward}});
    progress.line(std::string(vectorKernelName(kernel)) + " threads " + std::to_string(threads) + " " +
                  std::to_string(rows) + " x " + std::to_string(width) + ": forward " + num(forward) +
                  " s, backward " + num(backward) + " s");
  };
  for (int width : g.layerNormWidths)
    for (size_t n : g.vectorKernelFloats) {
      const size_t rows = std::max<size_t>(1, n / size_t(width));
      const int N = static_cast<int>(rows);
      const double forward = medianSeconds(be, g.computeBudgetS, [&](int) {
        be.layerNormForward(y.f(), mean.f(), rstd.f(), x.f(), w.f(), b.f(), N, width, 1e-5f);
      });
      // Backward reads the statistics the last forward saved.
      const double backward = medianSeconds(be, g.computeBudgetS, [&](int) {
        be.layerNormBackward(dx.f(), dw.f(), db.f(), dy.f(), x.f(), w.f(), mean.f(), rstd.f(), N, width);
      });
      record(VectorKernel::LayerNorm, rows, width, forward, backward);
      const double rmsForward = medianSeconds(be, g.computeBudgetS, [&](int) {
        be.rmsNormForward(y.f(), rstd.f(), x.f(), w.f(), N, width, 1e-5f);
      });
      const double rmsBackward = medianSeconds(be, g.computeBudgetS, [&](int) {
        be.rmsNormBackward(dx.f(), dw.f(), dy.f(), x.f(), w.f(), rstd.f(), N, width);
      });
      record(VectorKernel::RmsNorm, rows, width, rmsForward, rmsBackward);
      // RoPE over rows of width (H + KV) hs, the q and k heads it rotates: head size kRopeHeadSize, as many
      // key/value heads as query heads, sequences of up to kRopeSeq positions (the angle table is made per
      // call for T positions, as the engine calls it per microbatch).
      const int H = std::max(1, width / (2 * kRopeHeadSize));
      const int T = static_cast<int>(std::min<size_t>(rows, kRopeSeq)), B = std::max(1, N / T);
      const size_t qn = size_t(B) * T * H * kRopeHeadSize;
      const double ropeForward = medianSeconds(be, g.computeBudgetS, [&](int) {
        be.ropePackQkv(qkv.f(), src.f(), src.f() + qn, src.f() + 2 * qn, B, T, H, H, kRopeHeadSize, 10000.0f,
                       0);
      });
      const double ropeBackward = medianSeconds(be, g.computeBudgetS, [&](int) {
        be.ropeUnpackQkv(dsrc.f(), dsrc.f() + qn, dsrc.f() + 2 * qn, qkv.f(), B, T, H, H, kRopeHeadSize,
                         10000.0f, 0);
      });
      record(VectorKernel::Rope, rows, width, ropeForward, ropeBackward);
    }
  for (size_t n : g.vectorKernelFloats) {
    const double forward = medianSeconds(be, g.computeBudgetS, [&](int) { be.geluForward(y.f(), x.f(), n); });
    const double backward =
        medianSeconds(be, g.computeBudgetS, [&](int) { be.geluBackward(dx.f(), dy.f(), x.f(), n); });
    record(VectorKernel::Gelu, n, 1, forward, backward);
    const double swigluForward =
        medianSeconds(be, g.computeBudgetS, [&](int) { be.swigluForward(y.f(), x.f(), up.f(), n); });
    const double swigluBackward = medianSeconds(
        be, g.computeBudgetS, [&](int) { be.swigluBackward(dx.f(), dup.f(), dy.f(), x.f(), up.f(), n); });
    record(VectorKernel::Swiglu, n, 1, swigluForward, swigluBackward);
  }
}

void measureOptimizer(Backend& be, const Grids& g, int threads, Json& out, Progress& progress) {
  const size_t nMax = *std::max_element(g.optimizerParams.begin(), g.optimizerParams.end());
  Buffer params(be, nMax * 4), grads(be, nMax * 4), m(be, nMax * 4), v(be, nMax * 4);
  fillPattern(be, params.f(), nMax, 0.02f);
  fillPattern(be, grads.f(), nMax, 0.001f);
  for (size_t n : g.optimizerParams) {
    // The trainer's step (runtime/optimizer.cpp): adamwUpdateSegments, here over one segment with weight
    // decay; t counts up as steps do (its bias correction).
    OptimizerSegment seg;
    seg.params = params.f();
    seg.grads = grads.f();
    seg.m = m.f();
    seg.v = v.f();
    seg.n = n;
    seg.weightDecay = 0.1f;
    const double seconds = medianSeconds(be, g.computeBudgetS, [&](int step) {
      be.adamwUpdateSegments(&seg, 1, 3e-4f, 0.9f, 0.95f, 1e-8f, step + 1, 1.0f);
    });
    out.push_back(
        {{"threads", threads}, {"params", n}, {"seconds", seconds}, {"params_per_s", double(n) / seconds}});
    progress.line("optimizer adamw threads " + std::to_string(threads) + " " + std::to_string(n) +
                  " params: " + num(double(n) / seconds) + " params/s");
  }
}

// Pass `pass` of the compute grid into `best`: each point keeps its fastest pass. The passes list the same
// points in the same order; `keys` are the point's times (attention has two, kept apart) and `rate`, when
// named, the rate field derived from the first of them: what the point moved (`amount`) over its time.
void keepFastest(Json& best, const Json& pass, const std::vector<std::string>& keys,
                 const char* rate = nullptr, const std::function<double(const Json&)>& amount = {}) {
  if (best.empty()) {
    best = pass;
    return;
  }
  for (size_t i = 0; i < best.size() && i < pass.size(); ++i) {
    for (const std::string& key : keys) {
      if (pass[i][key].get<double>() >= best[i][key].get<double>()) continue;
      best[i][key] = pass[i][key];
      if (rate && key == keys.front()) best[i][rate] = amount(best[i]) / best[i][key].get<double>();
    }
  }
}

// ---- links: the op table and the harness -----------------------------------------------------------------

enum class LinkOpKind { SendRecv, AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast };

// nccl-tests' bus bandwidth (NVIDIA/nccl-tests doc/PERFORMANCE.md, "Bus bandwidth"): algbw times the factor
// that makes the figure comparable with the hardware's link bandwidth whatever the rank count. all_reduce,
// all_gather, reduce_scatter and broadcast are that page's; all_to_all's is src/alltoall.cu's and
// sendrecv's src/sendrecv.cu's. `bytes` is nccl-tests' "size" (makeLinkBuffers).
struct LinkOp {
  LinkOpKind kind;
  const char* name;
  double (*busFactor)(int ranks);
};
constexpr LinkOp kLinkOps[] = {
    {LinkOpKind::SendRecv, "sendrecv", [](int) { return 1.0; }},
    {LinkOpKind::AllReduce, "all_reduce", [](int n) { return 2.0 * (n - 1) / n; }},
    {LinkOpKind::AllGather, "all_gather", [](int n) { return double(n - 1) / n; }},
    {LinkOpKind::ReduceScatter, "reduce_scatter", [](int n) { return double(n - 1) / n; }},
    {LinkOpKind::AllToAll, "all_to_all", [](int n) { return double(n - 1) / n; }},
    {LinkOpKind::Broadcast, "broadcast", [](int) { return 1.0; }},
};

int linkMeasurements(const Grids& g) {
  return static_cast<int>(std::size(kLinkOps) * g.linkBytes.size());
}

std::string linkTransport(const std::string& name) {
  if (name == kLinkNet) return "Open MPI, btl tcp (between two hosts)";  // measureLink names the hosts
  return name == kLinkShm ? "Open MPI, btl vader (shared memory)" : "Open MPI, btl tcp (loopback)";
}

// An element's value on a rank: exact in fp32, and so are the sums of a few ranks' values.
float pattern(int rank, size_t i) {
  return static_cast<float>(rank * 1000 + static_cast<int>(i % 251));
}

// The buffers of one op at one size. nccl-tests' size: all_reduce and broadcast the buffer on each rank,
// all_gather the gathered output, reduce_scatter the unreduced input, all_to_all what one rank sends in all,
// sendrecv the message.
struct LinkBuffers {
  std::vector<float> send, recv;
  size_t floats = 0;  // bytes / 4
  size_t block = 0;   // floats / ranks: one rank's share
  std::vector<size_t> counts, offsets;
};

LinkBuffers makeLinkBuffers(LinkOpKind kind, size_t bytes, int ranks) {
  LinkBuffers b;
  b.floats = bytes / sizeof(float);
  b.block = b.floats / ranks;
  const bool gather = kind == LinkOpKind::AllGather, scatter = kind == LinkOpKind::ReduceScatter;
  b.send.resize(kind == LinkOpKind::Broadcast ? 0 : gather ? b.block : b.floats);  // broadcast: recv only
  b.recv.resize(scatter ? b.block : b.floats);
  for (int r = 0; r < ranks; ++r) {
    b.counts.push_back(b.block);
    b.offsets.push_back(size_t(r) * b.block);
  }
  return b;
}

// Fresh inputs: send holds this rank's pattern; recv a value no result has (so a receive that did not land
// shows), except broadcast's buffer, which is the data on the root and this rank's pattern elsewhere.
void fillLinkBuffers(LinkOpKind kind, LinkBuffers& b, int rank) {
  for (size_t i = 0; i < b.send.size(); ++i) b.send[i] = pattern(rank, i);
  const float off = kind == LinkOpKind::Broadcast ? 0.0f : 0.5f;
  for (size_t i = 0; i < b.recv.size(); ++i) b.recv[i] = pattern(rank, i) + off;
}

Status runLinkOp(Communicator& c, LinkOpKind kind, LinkBuffers& b) {
  constexpr int kTag = 7;
  const int rank = c.rank();
  switch (kind) {
    case LinkOpKind::SendRecv:  // ping-pong between ranks 0 and 1
      if (rank == 0) {
        MS_TRY(c.send(b.send.data(), b.floats, CommType::F32, 1, kTag));
        return c.recv(b.recv.data(), b.floats, CommType::F32, 1, kTag);
      }
      if (rank == 1) {
        MS_TRY(c.recv(b.recv.data(), b.floats, CommType::F32, 0, kTag));
        return c.send(b.recv.data(), b.floats, CommType::F32, 0, kTag);
      }
      return Status::ok();
    case LinkOpKind::AllReduce:
      return c.allReduce(b.send.data(), b.recv.data(), b.floats, CommType::F32, ReduceOp::Sum);
    case LinkOpKind::AllGather:
      return c.allGather(b.send.data(), b.recv.data(), b.block, CommType::F32);
    case LinkOpKind::ReduceScatter:
      return c.reduceScatter(b.send.data(), b.recv.data(), b.block, CommType::F32, ReduceOp::Sum);
    case LinkOpKind::AllToAll:
      return c.allToAllV(b.send.data(), b.counts.data(), b.offsets.data(), b.recv.data(), b.counts.data(),
                         b.offsets.data(), CommType::F32);
    case LinkOpKind::Broadcast:
      return c.broadcast(b.recv.data(), b.floats, CommType::F32, 0);
  }
  return Status::error("unknown link op");
}

// Whether recv holds what one op on fresh inputs must leave on rank `rank` of `ranks`.
bool linkResultRight(LinkOpKind kind, const LinkBuffers& b, int rank, int ranks) {
  auto sum = [&](size_t i) {
    float s = 0;
    for (int q = 0; q < ranks; ++q) s += pattern(q, i);
    return s;
  };
  for (size_t i = 0; i < b.recv.size(); ++i) {
    float want = 0;
    switch (kind) {
      case LinkOpKind::SendRecv:
        if (rank > 1) return true;
        want = pattern(0, i);  // rank 1 got rank 0's message and rank 0 got it back
        break;
      case LinkOpKind::AllReduce:
        want = sum(i);
        break;
      case LinkOpKind::AllGather:
        want = pattern(static_cast<int>(i / b.block), i % b.block);
        break;
      case LinkOpKind::ReduceScatter:
        want = sum(size_t(rank) * b.block + i);
        break;
      case LinkOpKind::AllToAll:
        want = pattern(static_cast<int>(i / b.block), size_t(rank) * b.block + i % b.block);
        break;
      case LinkOpKind::Broadcast:
        want = pattern(0, i);
        break;
    }
    if (b.recv[i] != want) return false;
  }
  return true;
}

Expected<double> maxOverRanks(Communicator& c, double v) {
  double out = 0;
  MS_TRY(c.allReduce(&v, &out, 1, CommType::F64, ReduceOp::Max));
  return out;
}

// Seconds of one op at `bytes` (sendrecv: one way, half the round trip), the slower rank's.
Expected<double> timeLinkOp(Communicator& c, const LinkOp& op, size_t bytes, double budgetS) {
  const int rank = c.rank(), ranks = c.size();
  LinkBuffers b = makeLinkBuffers(op.kind, bytes, ranks);
  fillLinkBuffers(op.kind, b, rank);
  MS_TRY(runLinkOp(c, op.kind, b));  // warm-up: connections, registrations, first-touch pages
  // A probe of a few ops sets the repetitions, from the slower rank so both ranks run as many.
  constexpr int kProbe = 3;
  MS_TRY(c.barrier());
  Clock::time_point t0 = Clock::now();
  for (int i = 0; i < kProbe; ++i) MS_TRY(runLinkOp(c, op.kind, b));
  Expected<double> probe = maxOverRanks(c, since(t0) / kProbe);
  if (!probe) return probe.status();
  const double want = std::ceil(budgetS / std::max(*probe, 1e-9));
  const int reps = static_cast<int>(std::clamp(want, double(kMinLinkReps), 1e6));
  MS_TRY(c.barrier());
  t0 = Clock::now();
  for (int i = 0; i < reps; ++i) MS_TRY(runLinkOp(c, op.kind, b));
  Expected<double> perOp = maxOverRanks(c, since(t0) / reps);
  if (!perOp) return perOp.status();
  // Correctness outside the timed region: one op on fresh inputs, every rank's result checked, agreed.
  fillLinkBuffers(op.kind, b, rank);
  MS_TRY(runLinkOp(c, op.kind, b));
  Expected<double> wrong = maxOverRanks(c, linkResultRight(op.kind, b, rank, ranks) ? 0.0 : 1.0);
  if (!wrong) return wrong.status();
  if (*wrong != 0)
    return Status::error(std::string(op.name) + " of " + std::to_string(bytes) +
                         " bytes delivered wrong data (checked on every rank after the timing)");
  return op.kind == LinkOpKind::SendRecv ? *perOp / 2 : *perOp;
}

// ---- child processes with a deadline ---------------------------------------------------------------------

// Runs command in a session of its own (Open MPI gives each rank its own process group, but they stay in
// mpirun's session), its stdout onto our stderr (our stdout may be the profile), and waits at most
// timeoutS; past it, SIGTERM to the session, SIGKILL to what is left 5 s later. Returns the wait status, or
// the reason it did not finish.
Expected<int> runWithDeadline(const std::vector<std::string>& command, double timeoutS) {
  int execErr[2];
  if (::pipe2(execErr, O_CLOEXEC) != 0)
    return Status::error(std::string("cannot create a pipe: ") + std::strerror(errno));
  std::vector<std::string> words = command;
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return Status::error(std::string("cannot fork: ") + std::strerror(errno));
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec.
    ::setsid();
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // calibrate killed: mpirun takes its ranks down with it
    if (::getppid() != parent) ::_exit(127);
    ::dup2(STDERR_FILENO, STDOUT_FILENO);
    const int devNull = ::open("/dev/null", O_RDONLY);
    if (devNull >= 0) ::dup2(devNull, STDIN_FILENO);
    ::execvp(argv[0], argv.data());
    const int e = errno;
    (void)!::write(execErr[1], &e, sizeof e);
    ::_exit(127);
  }
  ::close(execErr[1]);
  int e = 0;
  ssize_t n;
  do n = ::read(execErr[0], &e, sizeof e);
  while (n < 0 && errno == EINTR);
  ::close(execErr[0]);
  if (n == sizeof e) {
    ::waitpid(pid, nullptr, 0);
    return Status::error("cannot run " + command[0] + ": " + std::strerror(e));
  }
  auto waitUntil = [&](Clock::time_point deadline, int& status) {
    for (;;) {
      const pid_t done = ::waitpid(pid, &status, WNOHANG);
      if (done == pid || (done < 0 && errno != EINTR)) return true;
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  int status = 0;
  const Clock::time_point start = Clock::now();
  if (waitUntil(start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeoutS)),
                status))
    return status;
  signalSession(pid, SIGTERM);
  if (!waitUntil(Clock::now() + std::chrono::seconds(5), status)) {
    signalSession(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  signalSession(pid, SIGKILL);  // ranks orphaned by mpirun's end
  return Status::error("no result within " + num(timeoutS) + " s; mpirun and its ranks were stopped");
}

// The link entry that `calibrate-links` measured for one transport, through mpirun.
Expected<Json> measureLink(const CalibrateOptions& o, const std::string& name, Progress& progress,
                           int total) {
  const Grids g = grids(o.quick);
  std::string tmp = (std::filesystem::temp_directory_path() / "meshstudio-calibrate-XXXXXX").string();
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) return Status::error("cannot create a temporary file in " + tmp + ": " + std::strerror(errno));
  ::close(fd);
  struct Remove {
    std::string path;
    ~Remove() { std::remove(path.c_str()); }
  } removeTmp{tmp};
  const bool net = name == kLinkNet;
  std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(kLinkRanks)};
  // Between hosts: one rank on each (--host gives each one slot), started on the other host the way Open
  // MPI starts remote ranks (its rsh agent, ssh unless the environment names another).
  if (net) cmd.insert(cmd.end(), {"--host", o.hosts.at(0) + "," + o.hosts.at(1)});
  if (::geteuid() == 0) cmd.push_back("--allow-run-as-root");
  // pml ob1 makes the btl list the transport (UCX's pml would otherwise pick its own); "vader" is Open MPI
  // 4's shared-memory btl (Open MPI 5 calls it "sm" and keeps "vader" as its alias). TCP between two
  // processes of one machine goes through the kernel's loopback whatever the interface; naming lo keeps a
  // machine with no other interface working. Between two hosts the interfaces are left to Open MPI (its
  // default leaves out loopback) or to its environment (OMPI_MCA_btl_tcp_if_include).
  if (!net) cmd.push_back("--oversubscribe");
  cmd.insert(cmd.end(), {"--bind-to", "none", "--mca", "pml", "ob1", "--mca", "btl"});
  if (name == kLinkShm) {
    cmd.push_back("self,vader");
  } else if (net) {
    cmd.push_back("self,tcp");
  } else {
    cmd.insert(cmd.end(), {"self,tcp", "--mca", "btl_tcp_if_include", "lo"});
  }
  cmd.insert(cmd.end(), {o.exe, "calibrate-links", "--transport", name, "--out", tmp, "--progress-base",
                         std::to_string(progress.done()), "--progress-total", std::to_string(total)});
  if (o.quick) cmd.push_back("--quick");
  const std::string what = "link " + name + ": ";
  Expected<int> status = runWithDeadline(cmd, o.linkTimeoutS);
  if (!status) return status.status().withContext("link " + name);
  if (WIFSIGNALED(*status))
    return Status::error(what + "mpirun died of signal " + std::to_string(WTERMSIG(*status)));
  if (WEXITSTATUS(*status) != 0)
    return Status::error(what + "mpirun exited with code " + std::to_string(WEXITSTATUS(*status)) +
                         " (its messages are above)");
  Expected<std::string> text = readFile(tmp);
  if (!text) return text.status().withContext("link " + name);
  Json entry = Json::parse(*text, nullptr, false);
  const int expected = linkMeasurements(g);
  if (!entry.is_object() || !entry.contains("measurements") || !entry["measurements"].is_array() ||
      static_cast<int>(entry["measurements"].size()) != expected)
    return Status::error(what + "calibrate-links wrote no complete result to " + tmp);
  if (net) entry["transport"] = "Open MPI, btl tcp between hosts " + o.hosts.at(0) + " and " + o.hosts.at(1);
  progress.skip(expected);
  return entry;
}

// ---- the machine -----------------------------------------------------------------------------------------

std::string cpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string v = line.substr(colon + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    if (!v.empty()) return v;
  }
  return "unknown";
}

std::string hostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return "unknown";
  return buf;
}

std::string utcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm = {};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// CPU time at one moment: what the machine spent busy (/proc/stat's first line; steal counts, since a
// hypervisor's other guests take it from us too) and what this process and its waited-for children used.
struct CpuTimes {
  double machineBusyS = -1;  // -1: /proc/stat unreadable
  double selfS = 0;
  Clock::time_point at;
};
CpuTimes cpuTimes() {
  CpuTimes t;
  t.at = Clock::now();
  std::ifstream in("/proc/stat");
  std::string cpu;
  double user, nice, system, idle, iowait, irq, softirq, steal;
  if ((in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) && cpu == "cpu")
    t.machineBusyS = (user + nice + system + irq + softirq + steal) / double(::sysconf(_SC_CLK_TCK));
  auto seconds = [](const timeval& v) { return double(v.tv_sec) + 1e-6 * double(v.tv_usec); };
  for (int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
    rusage u = {};
    if (::getrusage(who, &u) == 0) t.selfS += seconds(u.ru_utime) + seconds(u.ru_stime);
  }
  return t;
}
// The cores other processes kept busy on average between a and b (-1 when unknown).
double otherCores(const CpuTimes& a, const CpuTimes& b) {
  const double wall = std::chrono::duration<double>(b.at - a.at).count();
  if (a.machineBusyS < 0 || b.machineBusyS < 0 || wall <= 0) return -1;
  return std::max(0.0, (b.machineBusyS - a.machineBusyS) - (b.selfS - a.selfS)) / wall;
}
// Measurements on a busy machine are the busy machine's: a thread waiting for a core stretches every
// parallel region it is part of (multi-thread figures fall furthest; seen here: a 2-thread AdamW step of
// 65,536 parameters from 0.03 ms to 8 ms while a compiler ran). Above a quarter of a core, say so.
constexpr double kBusyWarningCores = 0.25;

int coreCount() {
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

int64_t memoryBytes() {
  return int64_t(::sysconf(_SC_PHYS_PAGES)) * int64_t(::sysconf(_SC_PAGESIZE));
}

// Every number of the profile finite and > 0 (calibrate.h's promise); the error names the first that is not.
Status checkNumbers(const Json& j, const std::string& path) {
  if (j.is_number()) {
    const double v = j.get<double>();
    if (!std::isfinite(v) || v <= 0) return Status::error(path + " is " + num(v) + ", not a positive number");
  } else if (j.is_object()) {
    for (const auto& [k, v] : j.items()) MS_TRY(checkNumbers(v, path + "/" + k));
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) MS_TRY(checkNumbers(j[i], path + "/" + std::to_string(i)));
  }
  return Status::ok();
}

}  // namespace

std::vector<int> defaultCalibrationThreads(int cores) {
  std::vector<int> out = {1};
  for (int t = 2; t < cores; t *= 2) out.push_back(t);
  if (cores > 1) out.push_back(cores);
  return out;
}

std::vector<std::string> splitCommaList(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  for (;;) {
    const size_t comma = text.find(',', at);
    out.push_back(text.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

Expected<std::vector<int>> parseThreadList(const std::string& text) {
  std::vector<int> out;
  for (const std::string& item : splitCommaList(text)) {
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || errno == ERANGE || !end || *end || v < 1 || v > 4096)
      return Status::error("--threads needs integers from 1 to 4096 separated by commas, not \"" + text +
                           "\"");
    if (std::find(out.begin(), out.end(), int(v)) != out.end())
      return Status::error("--threads names " + item + " twice");
    out.push_back(static_cast<int>(v));
  }
  return out;
}

Expected<std::vector<std::string>> parseLinkList(const std::string& text) {
  if (text == "none") return std::vector<std::string>{};
  std::vector<std::string> out;
  for (const std::string& item : splitCommaList(text)) {
    if (item != kLinkShm && item != kLinkTcp)
      return Status::error("--links takes shm and/or tcp (comma-separated) or none, not \"" + text + "\"");
    if (std::find(out.begin(), out.end(), item) != out.end())
      return Status::error("--links names " + item + " twice");
    out.push_back(item);
  }
  return out;
}

Expected<std::vector<std::string>> parseHostList(const std::string& text) {
  const std::vector<std::string> out = splitCommaList(text);
  const auto badName = [](const std::string& h) {
    return h.empty() ||
           h.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") !=
               std::string::npos ||
           h[0] == '-';
  };
  if (out.size() != 2 || badName(out[0]) || badName(out[1]))
    return Status::error("--hosts takes two host names separated by a comma (A,B), not \"" + text + "\"");
  if (out[0] == out[1]) return Status::error("--hosts names " + out[0] + " twice");
  return out;
}

double busBandwidthFactor(const std::string& op, int ranks) {
  for (const LinkOp& l : kLinkOps)
    if (op == l.name) return l.busFactor(ranks);
  return 0;
}

Status runCalibrate(const CalibrateOptions& options) {
  const Clock::time_point start = Clock::now();
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE"))
    return Status::error("calibrate starts its own MPI jobs for the links; run it without mpirun");
  // An unwritable output fails now, not after minutes of measuring (AtomicFileWriter removes its FILE.tmp).
  if (!options.out.empty()) {
    AtomicFileWriter probe;
    MS_TRY(probe.open(options.out));
  }
  const int cores = coreCount();
  const std::vector<int> threads =
      options.threads.empty() ? defaultCalibrationThreads(cores) : options.threads;
  const int maxThreads = *std::max_element(threads.begin(), threads.end());
  if (Status s = cpu::checkThreads(maxThreads); !s)
    return Status::error("--threads " + std::to_string(maxThreads) + ": " + s.message());
  // Measurements on a busy machine are the busy machine's: say so (the multi-thread ones suffer most, a
  // thread waiting for a core stretches every parallel region).
  const CpuTimes before = cpuTimes();
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  const CpuTimes runStart = cpuTimes();
  if (const double busy = otherCores(before, runStart); busy > kBusyWarningCores)
    std::fprintf(stderr,
                 "calibrate: warning: other processes keep %.1f of the %d cores busy; the figures measured "
                 "now will be low (run calibrate on an idle machine)\n",
                 busy, cores);
  const Grids g = grids(options.quick);
  if (!options.hosts.empty() && options.hosts.size() != 2)
    return Status::error("--hosts needs two hosts, not " + std::to_string(options.hosts.size()));
  const int linkJobs = static_cast<int>(options.links.size()) + (options.hosts.empty() ? 0 : 1);
  const int total = linkMeasurements(g) * linkJobs + computeMeasurements(g, threads.size());
  Progress progress(0, total);

  CalibrateOptions withExe = options;
  if (withExe.exe.empty()) {
    char self[4096];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
      return Status::error(std::string("cannot find this engine (/proc/self/exe): ") + std::strerror(errno));
    withExe.exe.assign(self, static_cast<size_t>(n));
  }
  Json links = Json::array();
  std::vector<std::string> linkNames = options.links;
  if (!options.hosts.empty()) linkNames.push_back(kLinkNet);
  for (const std::string& name : linkNames) {
    Expected<Json> link = measureLink(withExe, name, progress, total);
    if (!link) return link.status();
    links.push_back(std::move(*link));
  }

  Json gemm = Json::array(), attention = Json::array(), elementwise = Json::array(),
       vectorKernels = Json::array(), optimizer = Json::array();
  try {
    std::unique_ptr<Backend> be = makeCpuBackend(false);
    for (int pass = 0; pass < g.computePasses; ++pass) {
      Json gemmPass = Json::array(), attentionPass = Json::array(), elementwisePass = Json::array(),
           vectorPass = Json::array(), optimizerPass = Json::array();
      for (int t : threads) {
        cpu::setThreads(t);
        measureGemm(*be, g, t, gemmPass, progress);
        measureAttention(*be, g, t, attentionPass, progress);
        measureRingAttention(*be, g, t, attentionPass, progress);
        measureElementwise(*be, g, t, elementwisePass, progress);
        measureVectorKernels(*be, g, t, vectorPass, progress);
        measureOptimizer(*be, g, t, optimizerPass, progress);
      }
      keepFastest(gemm, gemmPass, {"seconds"}, "flops_per_s", [](const Json& p) {
        return 2.0 * p["m"].get<double>() * p["n"].get<double>() * p["k"].get<double>();
      });
      keepFastest(attention, attentionPass, {"forward_seconds", "backward_seconds"});
      keepFastest(elementwise, elementwisePass, {"seconds"}, "bytes_per_s",
                  [](const Json& p) { return p["bytes"].get<double>(); });
      keepFastest(vectorKernels, vectorPass, {"forward_seconds", "backward_seconds"});
      keepFastest(optimizer, optimizerPass, {"seconds"}, "params_per_s",
                  [](const Json& p) { return p["params"].get<double>(); });
    }
  } catch (const DeviceFailure& e) {
    return Status::error(std::string("cpu backend: ") + e.what());
  }

  std::string blas = "unknown (not OpenBLAS)";
  if (const char* config = openblas_get_config ? openblas_get_config() : nullptr; config && *config) {
    blas = config;
    if (const std::string core = cpu::blasCoreName(); !core.empty()) blas += ", core " + core;
  }
  Json profile = {{"format", kDeviceProfileFormat},
                  {"version", kDeviceProfileVersion},
                  {"machine",
                   {{"hostname", hostName()},
                    {"cpu", cpuModel()},
                    {"cores", cores},
                    {"memory_bytes", memoryBytes()},
                    {"blas", blas},
                    {"created", utcNow()},
                    {"command", options.command}}},
                  {"device",
                   {{"backend", "cpu"},
                    {"memory_bytes", memoryBytes()},
                    {"gemm", std::move(gemm)},
                    {"attention", std::move(attention)},
                    {"elementwise", std::move(elementwise)},
                    {"vector_kernels", std::move(vectorKernels)},
                    {"optimizer", std::move(optimizer)}}},
                  {"links", std::move(links)}};
  MS_TRY(checkNumbers(profile, ""));
  const std::string text = profile.dump(2) + "\n";
  if (options.out.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  } else {
    MS_TRY(writeFileAtomic(options.out, text));
  }
  if (const double busy = otherCores(runStart, cpuTimes()); busy > kBusyWarningCores)
    std::fprintf(
        stderr,
        "calibrate: warning: other processes kept %.1f of the %d cores busy on average while calibrate "
        "measured; its figures are low (run it again on an idle machine)\n",
        busy, cores);
  std::fprintf(stderr, "calibrate: %d measurements in %.1f s; profile %s\n", progress.done(), since(start),
               options.out.empty() ? "written to stdout" : ("written to " + options.out).c_str());
  return Status::ok();
}

Status runCalibrateLinks(Communicator& world, const LinkRankOptions& options) {
  if (world.size() != kLinkRanks)
    return Status::error("calibrate-links measures " + std::to_string(kLinkRanks) + " ranks, not " +
                         std::to_string(world.size()));
  const Grids g = grids(options.quick);
  Progress progress(options.progressBase, options.progressTotal);
  Json measurements = Json::array();
  for (const LinkOp& op : kLinkOps) {
    for (size_t bytes : g.linkBytes) {
      Expected<double> seconds = timeLinkOp(world, op, bytes, g.linkBudgetS);
      if (!seconds) return seconds.status().withContext(options.transport + " link");
      const double algbw = double(bytes) / *seconds;
      const double busbw = algbw * op.busFactor(world.size());
      measurements.push_back(
          {{"op", op.name}, {"bytes", bytes}, {"seconds", *seconds}, {"algbw", algbw}, {"busbw", busbw}});
      if (world.rank() == 0)
        progress.line("link " + options.transport + " " + op.name + " " + std::to_string(bytes) +
                      " B: " + num(*seconds) + " s, busbw " + num(busbw) + " B/s");
    }
  }
  if (world.rank() != 0) return Status::ok();
  const Json entry = {{"name", options.transport},
                      {"transport", linkTransport(options.transport)},
                      {"ranks", world.size()},
                      {"measurements", std::move(measurements)}};
  return writeFileAtomic(options.out, entry.dump(1) + "\n");
}

}  // namespace ms
