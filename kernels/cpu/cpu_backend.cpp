// The CPU backend: kernels/cpu behind the Backend interface, and its emulated device (see backend.h).
//
// Emulation: backend memory is ordinary host memory whose address is offset by kTag (bit 62), which makes it
// a non-canonical x86-64 / AArch64 address: a host read or write through it faults at once instead of
// silently working, and every call translates (and checks) the pointers it is given. Pointer arithmetic on
// tagged pointers stays consistent (the offset is a constant), so sub-buffers work as on a GPU.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"

namespace ms {
namespace {

constexpr uintptr_t kTag = uintptr_t(1) << 62;

// x rounded to nearest even at `drop` fewer mantissa bits (16: bf16, 13: TF32); NaN and infinity kept.
inline float roundMantissa(float x, int drop) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  const uint32_t half = (uint32_t(1) << (drop - 1)) - 1;
  u += half + ((u >> drop) & 1u);
  u &= ~((uint32_t(1) << drop) - 1);
  std::memcpy(&x, &u, 4);
  return x;
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(bool emulate) : m_emulate(emulate) {
    m_info.kind = DeviceKind::Cpu;
    m_info.emulated = emulate;
    m_info.name =
        "cpu (" + std::to_string(cpu::threads()) + " threads)" + (emulate ? ", emulated device" : "");
  }

  const DeviceInfo& info() const override { return m_info; }
  void setGemmPrecision(GemmPrecision p) override { m_gemm = p; }
  GemmPrecision gemmPrecision() const override { return m_gemm; }
  bool deviceMemory() const override { return m_emulate; }

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t rounded = (bytes + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, rounded);
    if (!p) throw DeviceFailure("allocate: out of host memory for " + std::to_string(bytes) + " bytes");
    std::memset(p, 0, rounded);
    return tag(p);
  }
  void deallocate(void* ptr, size_t) override {
    if (ptr) std::free(h(ptr, "deallocate"));
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(h(dst, "upload"), host(src, "upload"), bytes);
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(host(dst, "download"), h(src, "download"), bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(h(dst, "copy"), h(src, "copy"), bytes);
  }
  void copy2D(void* dst, size_t dstPitch, const void* src, size_t srcPitch, size_t width,
              size_t rows) override {
    if (!rows || !width) return;
    char* d = static_cast<char*>(h(dst, "copy2D"));
    const char* s = static_cast<const char*>(h(src, "copy2D"));
    for (size_t r = 0; r < rows; ++r) std::memcpy(d + r * dstPitch, s + r * srcPitch, width);
  }
  void zero(void* dst, size_t bytes) override {
    if (bytes) std::memset(h(dst, "zero"), 0, bytes);
  }
  void synchronize() override {}
  DeviceMemoryInfo memoryInfo() override { return {}; }

  void setEpoch(std::chrono::steady_clock::time_point epoch) override { m_epoch = epoch; }
  int mark() override {
    m_marks.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - m_epoch).count());
    return static_cast<int>(m_marks.size()) - 1;
  }
  double markTime(int mark) override {
    if (mark < 0 || mark >= static_cast<int>(m_marks.size()))
      throw DeviceFailure("markTime: no mark " + std::to_string(mark));
    return m_marks[mark];
  }
  void clearMarks() override { m_marks.clear(); }

  void linearForward(float* out, TensorIn inp, TensorIn weight, TensorIn bias, int N, int C,
                     int OC) override {
    cpu::linearForward(f(out), g(inp, size_t(N) * C, 0, "linearForward", "input"),
                       g(weight, size_t(C) * OC, 1, "linearForward", "weight"),
                       pv(bias, size_t(OC), 0, "linearForward", "bias"), N, C, OC);
  }
  void linearBackward(float* dinp, GradOut dweight, GradOut dbias, const float* dout, TensorIn inp,
                      TensorIn weight, int N, int C, int OC) override {
    checkBf16(weight, "linearBackward", "weight");
    const size_t nw = size_t(C) * OC;
    float* dw = gw(dweight, nw, 0, "linearBackward", "weight gradient");
    float* db = gw(dbias, size_t(OC), 1, "linearBackward", "bias gradient");
    cpu::linearBackward(f(dinp), dw, nullptr, g(f(dout), size_t(N) * OC, 0),
                        dw ? g(inp, size_t(N) * C, 1, "linearBackward", "input") : nullptr,
                        dinp ? g(weight, nw, 2, "linearBackward", "weight") : nullptr, N, C, OC);
    // The bias gradient is a column sum, not a GEMM: fp32 dout in every precision.
    if (db) cpu::linearBackward(nullptr, nullptr, db, f(dout), nullptr, nullptr, N, C, OC);
    gradDone(dweight, nw, 0, "linearBackward");
    gradDone(dbias, size_t(OC), 1, "linearBackward");
  }
  void linearForwardT(float* out, TensorIn inp, TensorIn weight, TensorIn bias, int N, int C,
                      int OC) override {
    cpu::linearForwardT(f(out), g(inp, size_t(N) * C, 0, "linearForwardT", "input"),
                        g(weight, size_t(OC) * C, 1, "linearForwardT", "weight"),
                        pv(bias, size_t(OC), 0, "linearForwardT", "bias"), N, C, OC);
  }
  void linearBackwardT(float* dinp, GradOut dweight, GradOut dbias, const float* dout, TensorIn inp,
                       TensorIn weight, int N, int C, int OC) override {
    checkBf16(weight, "linearBackwardT", "weight");
    const size_t nw = size_t(OC) * C;
    float* dw = gw(dweight, nw, 0, "linearBackwardT", "weight gradient");
    float* db = gw(dbias, size_t(OC), 1, "linearBackwardT", "bias gradient");
    cpu::linearBackwardT(f(dinp), dw, nullptr, g(f(dout), size_t(N) * OC, 0),
                         dw ? g(inp, size_t(N) * C, 1, "linearBackwardT", "input") : nullptr,
                         dinp ? g(weight, nw, 2, "linearBackwardT", "weight") : nullptr, N, C, OC);
    // The bias gradient is a column sum, not a GEMM: fp32 dout in every precision.
    if (db) cpu::linearBackwardT(nullptr, nullptr, db, f(dout), nullptr, nullptr, N, C, OC);
    gradDone(dweight, nw, 0, "linearBackwardT");
    gradDone(dbias, size_t(OC), 1, "linearBackwardT");
  }
  void toBf16(bfloat16* dst, const float* src, size_t n) override {
    if (n == 0) return;
    roundInto(reinterpret_cast<uint16_t*>(h(dst, "toBf16")), f(src), n);
  }
  void fromBf16(float* dst, const bfloat16* src, size_t n) override {
    if (n == 0) return;
    const uint16_t* s = reinterpret_cast<const uint16_t*>(h(src, "fromBf16"));
    float* d = f(dst);
#pragma omp parallel for schedule(static) if (n >= (size_t(1) << 16))
    for (size_t i = 0; i < n; ++i) {
      const uint32_t u = uint32_t(s[i]) << 16;
      std::memcpy(&d[i], &u, 4);
    }
  }
  void layerNormForward(float* out, float* mean, float* rstd, const float* inp, TensorIn weight,
                        TensorIn bias, int N, int C, float eps) override {
    cpu::layerNormForward(f(out), f(mean), f(rstd), f(inp),
                          pv(weight, size_t(C), 0, "layerNormForward", "weight"),
                          pv(bias, size_t(C), 1, "layerNormForward", "bias"), N, C, eps);
  }
  void layerNormBackward(float* dinp, GradOut dweight, GradOut dbias, const float* dout, const float* inp,
                         TensorIn weight, const float* mean, const float* rstd, int N, int C) override {
    float* dw = gw(dweight, size_t(C), 0, "layerNormBackward", "weight gradient");
    float* db = gw(dbias, size_t(C), 1, "layerNormBackward", "bias gradient");
    cpu::layerNormBackward(f(dinp), dw, db, f(dout), f(inp),
                           pv(weight, size_t(C), 0, "layerNormBackward", "weight"), f(mean), f(rstd), N, C);
    gradDone(dweight, size_t(C), 0, "layerNormBackward");
    gradDone(dbias, size_t(C), 1, "layerNormBackward");
  }
  // Convolution: the GEMM operands (input, weight, dout) as the linear layers' (g: rounded to the GEMM
  // precision, or a bf16 one widened), the bias and the bias gradient fp32 (the bias gradient a second call
  // on the unrounded dout, as linearBackward's).
  void conv2dForward(float* out, TensorIn inp, TensorIn weight, TensorIn bias,
                     const Conv2dShape& s) override {
    checkConv(s, "conv2dForward");
    checkBf16(inp, "conv2dForward", "input");
    checkBf16(weight, "conv2dForward", "weight");
    const size_t nIn = size_t(s.B) * s.C * s.H * s.W, nW = size_t(s.OC) * s.K();
    cpu::conv2dForward(f(out), g(inp, nIn, 0, "conv2dForward", "input"),
                       g(weight, nW, 1, "conv2dForward", "weight"),
                       pv(bias, size_t(s.OC), 0, "conv2dForward", "bias"), s);
  }
  void conv2dBackward(float* dinp, GradOut dweight, GradOut dbias, const float* dout, TensorIn inp,
                      TensorIn weight, const Conv2dShape& s) override {
    checkConv(s, "conv2dBackward");
    checkBf16(inp, "conv2dBackward", "input");
    checkBf16(weight, "conv2dBackward", "weight");
    const size_t nIn = size_t(s.B) * s.C * s.H * s.W, nW = size_t(s.OC) * s.K(),
                 nOut = size_t(s.B) * s.OC * s.P();
    float* dw = gw(dweight, nW, 0, "conv2dBackward", "weight gradient");
    float* db = gw(dbias, size_t(s.OC), 1, "conv2dBackward", "bias gradient");
    if (dinp || dw)
      cpu::conv2dBackward(f(dinp), dw, nullptr, g(f(dout), nOut, 2),
                          dw ? g(inp, nIn, 0, "conv2dBackward", "input") : nullptr,
                          dinp ? g(weight, nW, 1, "conv2dBackward", "weight") : nullptr, s);
    if (db) cpu::conv2dBackward(nullptr, nullptr, db, f(dout), nullptr, nullptr, s);
    gradDone(dweight, nW, 0, "conv2dBackward");
    gradDone(dbias, size_t(s.OC), 1, "conv2dBackward");
  }

  // Batch norm: the parts as they are; the parameters widened (pv), their gradients through gw/gradDone.
  void batchNormStats(double* sum, double* sumSq, const float* x, int B, int C, int S) override {
    checkBatchNorm(B, C, S, "batchNormStats");
    cpu::batchNormStats(f(sum), f(sumSq), f(x), B, C, S);
  }
  void batchNormMoments(float* mean, float* rstd, double* var, const double* sum, const double* sumSq,
                        double count, int C, float eps) override {
    checkBatchNorm(1, C, 1, "batchNormMoments");
    checkCount(count, "batchNormMoments");
    cpu::batchNormMoments(f(mean), f(rstd), f(var), f(sum), f(sumSq), count, C, eps);
  }
  void batchNormUpdateRunning(float* runningMean, float* runningVar, const float* mean, const double* var,
                              double count, int C, float momentum) override {
    checkBatchNorm(1, C, 1, "batchNormUpdateRunning");
    checkCount(count, "batchNormUpdateRunning");
    cpu::batchNormUpdateRunning(f(runningMean), f(runningVar), f(mean), f(var), count, C, momentum);
  }
  void batchNormApply(float* out, const float* x, const float* mean, const float* rstd, TensorIn weight,
                      TensorIn bias, int B, int C, int S) override {
    checkBatchNorm(B, C, S, "batchNormApply");
    cpu::batchNormApply(f(out), f(x), f(mean), f(rstd), pv(weight, size_t(C), 0, "batchNormApply", "weight"),
                        pv(bias, size_t(C), 1, "batchNormApply", "bias"), B, C, S);
  }
  void batchNormGradStats(double* sumDy, double* sumDyXhat, const float* dout, const float* x,
                          const float* mean, const float* rstd, int B, int C, int S) override {
    checkBatchNorm(B, C, S, "batchNormGradStats");
    cpu::batchNormGradStats(f(sumDy), f(sumDyXhat), f(dout), f(x), f(mean), f(rstd), B, C, S);
  }
  void batchNormBackwardApply(float* dinp, GradOut dweight, GradOut dbias, const float* dout, const float* x,
                              const float* mean, const float* rstd, TensorIn weight, const double* sumDy,
                              const double* sumDyXhat, const double* localSumDy, const double* localSumDyXhat,
                              double count, int B, int C, int S) override {
    checkBatchNorm(B, C, S, "batchNormBackwardApply");
    checkCount(count, "batchNormBackwardApply");
    const float* w = pv(weight, size_t(C), 0, "batchNormBackwardApply", "weight");
    float* dw = gw(dweight, size_t(C), 0, "batchNormBackwardApply", "weight gradient");
    float* db = gw(dbias, size_t(C), 1, "batchNormBackwardApply", "bias gradient");
    cpu::batchNormBackwardApply(f(dinp), dw, db, f(dout), f(x), f(mean), f(rstd), w, f(sumDy), f(sumDyXhat),
                                f(localSumDy), f(localSumDyXhat), count, B, C, S);
    gradDone(dweight, size_t(C), 0, "batchNormBackwardApply");
    gradDone(dbias, size_t(C), 1, "batchNormBackwardApply");
  }

  void rmsNormForward(float* out, float* rstd, const float* inp, TensorIn weight, int N, int C,
                      float eps) override {
    cpu::rmsNormForward(f(out), f(rstd), f(inp), pv(weight, size_t(C), 0, "rmsNormForward", "weight"), N, C,
                        eps);
  }
  void rmsNormBackward(float* dinp, GradOut dweight, const float* dout, const float* inp, TensorIn weight,
                       const float* rstd, int N, int C) override {
    float* dw = gw(dweight, size_t(C), 0, "rmsNormBackward", "weight gradient");
    cpu::rmsNormBackward(f(dinp), dw, f(dout), f(inp), pv(weight, size_t(C), 0, "rmsNormBackward", "weight"),
                         f(rstd), N, C);
    gradDone(dweight, size_t(C), 0, "rmsNormBackward");
  }
  void swigluForward(float* out, const float* gate, const float* up, size_t n) override {
    cpu::swigluForward(f(out), f(gate), f(up), n);
  }
  void swigluBackward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                      size_t n) override {
    cpu::swigluBackward(f(dgate), f(dup), f(dout), f(gate), f(up), n);
  }
  void ropePackQkv(float* qkv, const float* q, const float* k, const float* v, int B, int T, int H, int KV,
                   int hs, float theta, int posStart) override {
    checkHeads(H, KV, hs, "ropePackQkv");
    cpu::ropePackQkv(f(qkv), f(q), f(k), f(v), B, T, H, KV, hs, theta, posStart);
  }
  void ropeUnpackQkv(float* dq, float* dk, float* dv, const float* dqkv, int B, int T, int H, int KV, int hs,
                     float theta, int posStart) override {
    checkHeads(H, KV, hs, "ropeUnpackQkv");
    cpu::ropeUnpackQkv(f(dq), f(dk), f(dv), f(dqkv), B, T, H, KV, hs, theta, posStart);
  }

  void gatherRows(float* dst, const float* src, const int32_t* idx, const float* scale, int n,
                  int C) override {
    checkRows(n, C, "gatherRows");
    cpu::gatherRows(f(dst), f(src), f(idx), f(scale), n, C);
  }
  void scatterAddRows(float* dst, const float* src, const int32_t* idx, const float* scale, int n,
                      int C) override {
    checkRows(n, C, "scatterAddRows");
    cpu::scatterAddRows(f(dst), f(src), f(idx), f(scale), n, C);
  }
  void rowDots(float* out, const float* a, const int32_t* idx, const float* b, int n, int C) override {
    checkRows(n, C, "rowDots");
    cpu::rowDots(f(out), f(a), f(idx), f(b), n, C);
  }

  void geluForward(float* out, const float* inp, size_t n) override {
    cpu::geluForward(f(out), f(inp), n);
  }
  // The fused bf16 GELU as the sequence it stands for, a chunk at a time through a staging buffer (the very
  // loops of toBf16, fromBf16 and geluForward, so every bit is theirs).
  void geluForwardBf16(bfloat16* kept, bfloat16* out, const float* inp, size_t n) override {
    if (n == 0) return;
    uint16_t* k = reinterpret_cast<uint16_t*>(h(kept, "geluForwardBf16"));
    uint16_t* o = reinterpret_cast<uint16_t*>(h(out, "geluForwardBf16"));
    const float* x = f(inp);
    for (size_t i0 = 0; i0 < n; i0 += kFusedChunk) {
      const size_t m = std::min(kFusedChunk, n - i0);
      roundInto(k + i0, x + i0, m);
      float* w = widenInto(m_fused, k + i0, m);
      cpu::geluForward(w, w, m);
      roundInto(o + i0, w, m);
    }
  }
  void geluBackwardBf16(float* dinp, const float* dout, const bfloat16* kept, size_t n) override {
    if (n == 0) return;
    const uint16_t* k = reinterpret_cast<const uint16_t*>(h(kept, "geluBackwardBf16"));
    float* d = f(dinp);
    const float* g = f(dout);
    for (size_t i0 = 0; i0 < n; i0 += kFusedChunk) {
      const size_t m = std::min(kFusedChunk, n - i0);
      cpu::geluBackward(d + i0, g + i0, widenInto(m_fused, k + i0, m), m);
    }
  }
  void geluBackward(float* dinp, const float* dout, const float* inp, size_t n) override {
    cpu::geluBackward(f(dinp), f(dout), f(inp), n);
  }
  void reluForward(float* out, const float* inp, size_t n) override {
    cpu::reluForward(f(out), f(inp), n);
  }
  void reluBackward(float* dinp, const float* dout, const float* inp, size_t n) override {
    cpu::reluBackward(f(dinp), f(dout), f(inp), n);
  }
  void tanhForward(float* out, const float* inp, size_t n) override {
    cpu::tanhForward(f(out), f(inp), n);
  }
  void tanhBackward(float* dinp, const float* dout, const float* out, size_t n) override {
    cpu::tanhBackward(f(dinp), f(dout), f(out), n);
  }
  void add(float* out, const float* a, const float* b, size_t n) override {
    cpu::add(f(out), f(a), f(b), n);
  }
  void accumulate(float* y, const float* x, size_t n) override {
    cpu::accumulate(f(y), f(x), n);
  }
  void accumulateGrad(GradOut y, TensorIn x, size_t n) override {
    if (y.bf16 != x.bf16) throw DeviceFailure("accumulateGrad: the two gradients differ in precision");
    if (!y.bf16) return cpu::accumulate(f(y.f32()), f(x.f32()), n);
    float* acc = gw(y, n, 0, "accumulateGrad", "gradient");
    cpu::accumulate(acc, widen(x, n, m_grads[1], "accumulateGrad"), n);
    gradDone(y, n, 0, "accumulateGrad");
  }
  void scale(float* y, float s, size_t n) override {
    cpu::scale(f(y), s, n);
  }
  void addRows(float* x, TensorIn row, size_t rows, int C) override {
    cpu::addRows(f(x), pv(row, size_t(C), 0, "addRows", "row"), rows, C);
  }

  size_t attentionSavedFloats(int B, int T, int, int H) const override {
    return size_t(B) * H * T * T;
  }
  size_t attentionScratchFloats(int B, int T, int, int H) const override {
    return size_t(B) * H * T * T;
  }
  void attentionForward(float* out, float* saved, const float* qkv, int B, int T, int C, int H,
                        bool causal) override {
    // q, k and v rounded; the probabilities multiply v unrounded (a GPU rounds them too).
    cpu::attentionForward(f(out), f(saved), g(f(qkv), size_t(B) * T * 3 * C, 0), B, T, C, H, causal);
  }
  // The materialised backward does not read out (a bf16 one is only checked).
  void attentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* saved,
                         TensorIn out, int B, int T, int C, int H, bool causal) override {
    checkBf16(out, "attentionBackward", "output");
    if (out.bf16) h(out.b16(), "attentionBackward");
    cpu::attentionBackward(f(dqkv), f(scratch), g(f(dout), size_t(B) * T * C, 0),
                           g(f(qkv), size_t(B) * T * 3 * C, 1), f(saved), B, T, C, H, causal);
  }
  // Ring attention's blocks: q, k and v (and dout) rounded as attentionForward / attentionBackward round
  // them; out and lse are no GEMM operands and are read as they are (a bf16 out widened exactly). kv holds KV
  // heads of C / H floats (KV must divide H).
  void attentionBlockForward(float* out, float* lse, const float* qkv, const float* kv, int B, int Tq, int Tk,
                             int C, int H, int KV, SeqPositions qpos, SeqPositions kpos, bool causal,
                             bool first) override {
    checkKvHeads(H, KV, "attentionBlockForward");
    cpu::attentionBlockForward(f(out), f(lse), g(f(qkv), size_t(B) * Tq * 3 * C, 0),
                               g(f(kv), size_t(B) * Tk * 2 * KV * (C / H), 1), B, Tq, Tk, C, H, KV, qpos,
                               kpos, causal, first);
  }
  void attentionBlockBackward(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv,
                              TensorIn out, const float* lse, int B, int Tq, int Tk, int C, int H, int KV,
                              SeqPositions qpos, SeqPositions kpos, bool causal) override {
    checkKvHeads(H, KV, "attentionBlockBackward");
    checkBf16(out, "attentionBlockBackward", "output");
    const size_t n = size_t(B) * Tq * C;
    const float* o = out.bf16 ? widen(out, n, m_widenedOut, "attentionBlockBackward") : f(out.f32());
    cpu::attentionBlockBackward(f(dqkv), f(dkv), g(f(dout), n, 0), g(f(qkv), size_t(B) * Tq * 3 * C, 1),
                                g(f(kv), size_t(B) * Tk * 2 * KV * (C / H), 2), o, f(lse), B, Tq, Tk, C, H,
                                KV, qpos, kpos, causal);
  }

  void embeddingForward(float* out, const int32_t* tokens, TensorIn wte, TensorIn wpe, int B, int T,
                        int C) override {
    // A bf16 table is widened up to the largest token the batch names (the op takes no vocabulary size).
    const int32_t* tok = f(tokens);
    size_t rows = 0;
    if (wte.bf16)
      for (size_t n = 0; n < size_t(B) * size_t(T); ++n) rows = std::max(rows, size_t(tok[n]) + 1);
    cpu::embeddingForward(f(out), tok, pv(wte, rows * size_t(C), 0, "embeddingForward", "wte"),
                          pv(wpe, size_t(T) * C, 1, "embeddingForward", "wpe"), B, T, C);
  }
  void embeddingBackward(GradOut dwte, GradOut dwpe, const float* dout, const int32_t* tokens, int B, int T,
                         int C, int V) override {
    const size_t nte = size_t(V) * C, npe = size_t(T) * C;
    float* dte = gw(dwte, nte, 0, "embeddingBackward", "wte gradient");
    float* dpe = gw(dwpe, npe, 1, "embeddingBackward", "wpe gradient");
    cpu::embeddingBackward(dte, dpe, f(dout), f(tokens), B, T, C);
    gradDone(dwte, nte, 0, "embeddingBackward");
    gradDone(dwpe, npe, 1, "embeddingBackward");
  }
  void embeddingRangeForward(float* out, const int32_t* tokens, TensorIn wte, int vocabStart, int vocabCount,
                             int N, int C) override {
    cpu::embeddingRangeForward(f(out), f(tokens),
                               pv(wte, size_t(vocabCount) * C, 0, "embeddingRangeForward", "wte"), vocabStart,
                               vocabCount, N, C);
  }
  void embeddingRangeBackward(GradOut dwte, const float* dout, const int32_t* tokens, int vocabStart,
                              int vocabCount, int N, int C) override {
    const size_t n = size_t(vocabCount) * C;
    float* d = gw(dwte, n, 0, "embeddingRangeBackward", "wte gradient");
    cpu::embeddingRangeBackward(d, f(dout), f(tokens), vocabStart, vocabCount, N, C);
    gradDone(dwte, n, 0, "embeddingRangeBackward");
  }
  void addPositions(float* y, TensorIn wpe, int B, int T, int C) override {
    cpu::addPositions(f(y), pv(wpe, size_t(T) * C, 0, "addPositions", "wpe"), B, T, C);
  }

  void softmaxCrossEntropy(float* losses, float* dlogits, const float* logits, const int32_t* targets, int N,
                           int V, float gradScale) override {
    cpu::softmaxCrossEntropy(f(losses), f(dlogits), f(logits), f(targets), N, V, gradScale);
  }
  void argmaxRows(int32_t* out, const float* x, int N, int V) override {
    cpu::argmaxRows(f(out), f(x), N, V);
  }
  void rowMax(float* mx, const float* logits, int N, int V) override {
    cpu::rowMax(f(mx), f(logits), N, V);
  }
  void crossEntropyPartials(float* sumExp, float* targetLogit, const float* logits, const float* mx,
                            const int32_t* targets, int vocabStart, int N, int V) override {
    cpu::crossEntropyPartials(f(sumExp), f(targetLogit), f(logits), f(mx), f(targets), vocabStart, N, V);
  }
  void crossEntropyFinish(float* losses, float* dlogits, const float* logits, const float* mx,
                          const float* sumExp, const float* targetLogit, const int32_t* targets,
                          int vocabStart, int N, int V, float gradScale) override {
    cpu::crossEntropyFinish(f(losses), f(dlogits), f(logits), f(mx), f(sumExp), f(targetLogit), f(targets),
                            vocabStart, N, V, gradScale);
  }

  void patchify(float* patches, const float* images, int B, int S, int P) override {
    cpu::patchify(f(patches), f(images), B, S, P);
  }
  void tokensForward(float* out, const float* x, TensorIn clsToken, TensorIn pos, int B, int NP, int C,
                     bool cls) override {
    cpu::tokensForward(f(out), f(x), pv(clsToken, size_t(C), 0, "tokensForward", "cls token"),
                       pv(pos, size_t(NP + (cls ? 1 : 0)) * C, 1, "tokensForward", "positions"), B, NP, C,
                       cls);
  }
  void tokensBackward(float* dx, GradOut dcls, GradOut dpos, const float* dout, int B, int NP, int C,
                      bool cls) override {
    const size_t npos = size_t(NP + (cls ? 1 : 0)) * C;
    float* dc = gw(dcls, size_t(C), 0, "tokensBackward", "cls token gradient");
    float* dp = gw(dpos, npos, 1, "tokensBackward", "positions gradient");
    cpu::tokensBackward(f(dx), dc, dp, f(dout), B, NP, C, cls);
    gradDone(dcls, size_t(C), 0, "tokensBackward");
    gradDone(dpos, npos, 1, "tokensBackward");
  }
  void poolForward(float* out, const float* inp, int B, int T, int C, bool useFirst) override {
    cpu::poolForward(f(out), f(inp), B, T, C, useFirst);
  }
  void poolBackward(float* dinp, const float* dout, int B, int T, int C, bool useFirst) override {
    cpu::poolBackward(f(dinp), f(dout), B, T, C, useFirst);
  }

  void adamwUpdate(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                   float beta2, float eps, float weightDecay, int t, float gradScale) override {
    cpu::adamwUpdate(f(params), f(grads), f(m), f(v), n, lr, beta1, beta2, eps, weightDecay, t, gradScale);
  }
  void sgdUpdate(float* params, const float* grads, float* buf, size_t n, float lr, float momentum,
                 float weightDecay, bool nesterov, bool firstStep, float gradScale) override {
    cpu::sgdUpdate(f(params), f(grads), f(buf), n, lr, momentum, weightDecay, nesterov, firstStep, gradScale);
  }
  // The single forms segment by segment (bit-identical to calling them). The emulation checks every
  // segment's pointers before it updates any, so a misuse leaves all of them untouched.
  void adamwUpdateSegments(const OptimizerSegment* segments, size_t count, float lr, float beta1, float beta2,
                           float eps, int t, float gradScale) override {
    checkSegments(segments, count, "adamwUpdateSegments");
    for (size_t i = 0; i < count; ++i) {
      const OptimizerSegment& s = segments[i];
      cpu::adamwUpdate(f(s.params), gv(s.grads, s.n, "adamwUpdateSegments"), f(s.m), f(s.v), s.n, lr, beta1,
                       beta2, eps, s.weightDecay, t, gradScale);
    }
  }
  void sgdUpdateSegments(const OptimizerSegment* segments, size_t count, float lr, float momentum,
                         bool nesterov, bool firstStep, float gradScale) override {
    checkSegments(segments, count, "sgdUpdateSegments");
    for (size_t i = 0; i < count; ++i) {
      const OptimizerSegment& s = segments[i];
      cpu::sgdUpdate(f(s.params), gv(s.grads, s.n, "sgdUpdateSegments"), f(s.m), s.n, lr, momentum,
                     s.weightDecay, nesterov, firstStep, gradScale);
    }
  }
  double sumSquares(const TensorIn* ptrs, const size_t* sizes, size_t count) override {
    double s = 0;
    for (size_t i = 0; i < count; ++i) s += cpu::sumSquares(gv(ptrs[i], sizes[i], "sumSquares"), sizes[i]);
    return s;
  }

 private:
  void* tag(void* p) const {
    return m_emulate ? reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) + kTag) : p;
  }
  // Backend pointer -> host address (emulation checks that it IS a backend pointer).
  template <typename T>
  T* f(T* p) const {
    if (!m_emulate || !p) return p;
    const uintptr_t u = reinterpret_cast<uintptr_t>(p);
    if (!(u & kTag))
      throw DeviceFailure("emulated device: a host pointer was passed where device memory is required");
    return reinterpret_cast<T*>(u - kTag);
  }
  template <typename T>
  T* h(T* p, const char* what) const {
    try {
      return f(p);
    } catch (const DeviceFailure& e) {
      throw DeviceFailure(std::string(what) + ": " + e.what());
    }
  }
  // The segment table is host memory and every pointer in it backend memory (emulation only).
  void checkSegments(const OptimizerSegment* segments, size_t count, const char* what) const {
    if (!m_emulate || count == 0) return;
    host(segments, what);
    for (size_t i = 0; i < count; ++i) {
      const OptimizerSegment& s = segments[i];
      h(s.params, what);
      h(s.grads.data, what);
      h(s.m, what);
      h(s.v, what);
    }
  }
  // A host pointer (emulation checks that it is NOT a backend pointer).
  template <typename T>
  T* host(T* p, const char* what) const {
    if (m_emulate && (reinterpret_cast<uintptr_t>(p) & kTag))
      throw DeviceFailure(std::string(what) + ": emulated device: device memory was passed as host memory");
    return p;
  }

  // A GEMM operand in the GEMM precision: p itself for Fp32, else a rounded copy in scratch `slot`.
  const float* g(const float* p, size_t n, int slot) {
    if (m_gemm == GemmPrecision::Fp32 || !p) return p;
    const int drop = m_gemm == GemmPrecision::Bf16 ? 16 : 13;
    std::vector<float>& r = m_rounded[slot];
    r.resize(n);
#pragma omp parallel for schedule(static) if (n >= (size_t(1) << 16))
    for (size_t i = 0; i < n; ++i) r[i] = roundMantissa(p[i], drop);
    return r.data();
  }

  static void checkConv(const Conv2dShape& s, const char* what) {
    if (const std::string p = s.problem(); !p.empty()) throw DeviceFailure(std::string(what) + ": " + p);
  }
  static void checkBatchNorm(int B, int C, int S, const char* what) {
    if (const std::string p = batchNormShapeProblem(B, C, S); !p.empty())
      throw DeviceFailure(std::string(what) + ": " + p);
  }
  // The CUDA launchers' checks (kernels/cuda/cuda_moe.cu), so a bad shape fails alike on both.
  static void checkRows(int n, int C, const char* what) {
    if (n < 0) throw DeviceFailure(std::string(what) + ": the row count must not be negative");
    if (C < 1) throw DeviceFailure(std::string(what) + ": the row length must be positive");
  }
  static void checkHeads(int H, int KV, int hs, const char* what) {
    if (const std::string p = ropeShapeProblem(H, KV, hs); !p.empty())
      throw DeviceFailure(std::string(what) + ": " + p);
  }
  // Grouped-query attention's head counts (ring attention's blocks), worded as ropeShapeProblem's.
  static void checkKvHeads(int H, int KV, const char* what) {
    if (H < 1 || KV < 1 || H % KV != 0)
      throw DeviceFailure(std::string(what) + ": the query heads (" + std::to_string(H) +
                          ") must be a positive multiple of the key/value heads (" + std::to_string(KV) +
                          ")");
  }
  static void checkCount(double count, const char* what) {
    if (!(count > 0))
      throw DeviceFailure(std::string(what) + ": the element count must be positive (got " +
                          std::to_string(count) + ")");
  }

  // A bf16 TensorIn is only valid in GemmPrecision::Bf16: in fp32 or TF32 its 8-bit mantissa would silently
  // stand in for the operand the precision promises. Checked whether or not the op reads the operand, so a
  // misuse fails the same way on every backend and for every gradient a caller asks for.
  void checkBf16(TensorIn in, const char* what, const char* operand) const {
    if (in.bf16 && m_gemm != GemmPrecision::Bf16)
      throw DeviceFailure(std::string(what) + ": a bf16 " + operand +
                          " needs the bf16 GEMM precision (it is " + toString(m_gemm) + ")");
  }

  // A TensorIn GEMM operand (a kept input, a parameter's bf16 working copy): an fp32 one as g() above; a bf16
  // one (only in GemmPrecision::Bf16) widened into scratch `slot`, exactly the values g() would have rounded
  // its fp32 original to.
  const float* g(TensorIn in, size_t n, int slot, const char* what, const char* operand) {
    checkBf16(in, what, operand);
    if (!in.bf16) return g(f(in.f32()), n, slot);
    return widen(in, n, m_rounded[slot], what);
  }

  // A parameter an op reads (TensorIn): an fp32 one as it is; a bf16 one (mixed precision's working
  // parameters, only in GemmPrecision::Bf16) widened exactly into parameter scratch `slot`.
  const float* pv(TensorIn in, size_t n, int slot, const char* what, const char* operand) {
    checkBf16(in, what, operand);
    if (!in.bf16) return f(in.f32());
    return widen(in, n, m_params[slot], what);
  }

  // A gradient an op accumulates into: an fp32 one as it is; a bf16 one (only in GemmPrecision::Bf16)
  // widened exactly into gradient scratch `slot`, where the op accumulates in fp32 before gradDone() rounds
  // the n elements back (each element rounded once per op; untouched ones come back unchanged).
  float* gw(GradOut out, size_t n, int slot, const char* what, const char* operand) {
    if (!out) return nullptr;
    if (!out.bf16) return f(out.f32());
    if (m_gemm != GemmPrecision::Bf16)
      throw DeviceFailure(std::string(what) + ": a bf16 " + operand +
                          " needs the bf16 GEMM precision (it is " + toString(m_gemm) + ")");
    widen(TensorIn(out.b16()), n, m_grads[slot], what);
    return m_grads[slot].data();
  }
  void gradDone(GradOut out, size_t n, int slot, const char* what) {
    if (out.bf16) roundInto(reinterpret_cast<uint16_t*>(h(out.b16(), what)), m_grads[slot].data(), n);
  }
  // A gradient an op reads (the optimizer, the norm): fp32 as it is, bf16 widened exactly into scratch.
  const float* gv(TensorIn in, size_t n, const char* what) {
    if (!in.bf16) return f(in.f32());
    return widen(in, n, m_grads[0], what);
  }
  // The fused bf16 ops' fp32 staging: 1M floats at a time (each chunk still spread over the threads).
  static constexpr size_t kFusedChunk = size_t(1) << 20;
  std::vector<float> m_fused;
  // n bf16 bits widened exactly into r (grown to n), returned.
  static float* widenInto(std::vector<float>& r, const uint16_t* s, size_t n) {
    if (r.size() < n) r.resize(n);
    float* d = r.data();
#pragma omp parallel for schedule(static) if (n >= (size_t(1) << 16))
    for (size_t i = 0; i < n; ++i) {
      const uint32_t u = uint32_t(s[i]) << 16;
      std::memcpy(&d[i], &u, 4);
    }
    return d;
  }
  // d (n bf16 bits) = s rounded to nearest even.
  static void roundInto(uint16_t* d, const float* s, size_t n) {
#pragma omp parallel for schedule(static) if (n >= (size_t(1) << 16))
    for (size_t i = 0; i < n; ++i) {
      const float r = roundMantissa(s[i], 16);
      uint32_t u;
      std::memcpy(&u, &r, 4);
      d[i] = uint16_t(u >> 16);
    }
  }

  // n elements of a bf16 TensorIn widened exactly (bf16 -> fp32 appends zero mantissa bits) into r.
  const float* widen(TensorIn in, size_t n, std::vector<float>& r, const char* what) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(h(in.b16(), what));
    r.resize(n);
#pragma omp parallel for schedule(static) if (n >= (size_t(1) << 16))
    for (size_t i = 0; i < n; ++i) {
      const uint32_t u = uint32_t(p[i]) << 16;
      std::memcpy(&r[i], &u, 4);
    }
    return r.data();
  }

  bool m_emulate;
  GemmPrecision m_gemm = GemmPrecision::Fp32;
  std::vector<float> m_rounded[3];
  std::vector<float> m_params[2];
  std::vector<float> m_grads[2];  // bf16 gradients widened (gw, gv)
  std::vector<float> m_widenedOut;  // attentionBlockBackward's bf16 out, widened
  DeviceInfo m_info;
  std::chrono::steady_clock::time_point m_epoch = std::chrono::steady_clock::now();
  std::vector<double> m_marks;
};

}  // namespace

const char* toString(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::Fp32:
      return "fp32";
    case GemmPrecision::Tf32:
      return "tf32";
    case GemmPrecision::Bf16:
      return "bf16";
  }
  return "?";
}

std::unique_ptr<Backend> makeCpuBackend(bool emulateDevice) {
  return std::make_unique<CpuBackend>(emulateDevice);
}

}  // namespace ms
