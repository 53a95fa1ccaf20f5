// Tests of the CUDA kernels (kernels/cuda/cuda_ops.h) against the CPU kernels (kernels/cpu/cpu_ops.h), which
// tst_kernels checks against double-precision loops. Every case runs both on the same fixed-seed data, on
// shapes that are multiples of no block (1, 7, 33, 37, 50257, heads 3), and compares with atol + rtol * |ref|
// (fp32 tolerances, wider ones for TF32 GEMMs). Gradient buffers start from non-zero values so that the
// "+=" convention is checked, not only the fresh result. Without a CUDA device the whole suite is skipped.
#include <QtTest/QtTest>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_info.h"
#include "kernels/cuda/cuda_ops.h"

namespace cuda = ms::cuda;
namespace cpu = ms::cpu;

namespace {

using Vec = std::vector<float>;
using Ints = std::vector<int32_t>;
template <typename T>
using DBuf = cuda::DeviceBuffer<T>;

constexpr unsigned kSeed = 20240612;
// fp32 kernels against fp32 CPU kernels: both round differently (summation order, exp), nothing more.
constexpr double kAtol = 1e-5, kRtol = 1e-4;
// GEMM-based results: sums of up to a few thousand products in a different order.
constexpr double kGemmAtol = 1e-4, kGemmRtol = 1e-4;
// TF32 rounds GEMM inputs to 10 mantissa bits (relative 2^-11 each).
constexpr double kTf32Atol = 3e-2, kTf32Rtol = 1e-2;
// Bf16 GEMMs against the CPU kernels on operands rounded to bf16 on the host: the same exact products, summed
// in fp32 in another order, so the GEMM tolerance holds. Attention on the GPU also rounds the probabilities
// and the pre-softmax gradient (the CPU reference does not), each term by at most 2^-8 of itself: out moves
// by at most 2^-8 max|v| (v in [-2, 2]) and dqkv by less in practice (a double-precision simulation of both
// on these shapes stays below 8e-3).
constexpr double kBf16AttentionAtol = 2e-2, kBf16AttentionRtol = 1e-2;
// Bf16 linear layers against the same rounded operands. Tensor cores sum bf16 products in fp32 but may
// truncate instead of rounding inside an MMA (Fasi et al. 2021, "Numerical behavior of NVIDIA tensor cores"),
// which drifts by up to about 2^-24 of the partial sum per 16 products: 2e-4 relative over the lm-head's
// 50257-term sums. Wider than the fp32 GEMM tolerance, so the test also checks that the forward output is
// far closer to the rounded-operand reference than to the unrounded one (bf16 rounding moves it ~1e-3).
constexpr double kBf16LinearAtol = 1e-3, kBf16LinearRtol = 1e-3;

// RoPE: the GPU forms the same fp32 angles and the same cos and sin as the CPU (ropeTables), so the rotated
// values differ only where one side fuses a multiply-add the other rounds twice (an ulp or two of values up
// to 2); the repeated heads' value gradients are the same fp32 sums in the same order: exact.
constexpr double kRopeAtol = 1e-6, kRopeRtol = 1e-5;

// The GEMM precisions of the linear and attention tests (GemmModeScope's argument).
const char* modeName(cuda::GemmMode m) {
  return m == cuda::GemmMode::Bf16 ? "bf16" : m == cuda::GemmMode::Tf32 ? "tf32" : "fp32";
}

// x rounded to bf16 (8 significant bits), to nearest with ties to even, from the bit pattern; infinities
// and NaN unchanged. Independent of the kernels' conversion (__float2bfloat16_rn), which it checks.
float roundBf16Host(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  if (((u >> 23) & 0xffu) == 0xffu) return x;
  const uint32_t rest = u & 0xffffu;
  uint32_t r = u - rest;
  if (rest > 0x8000u || (rest == 0x8000u && (r & 0x10000u) != 0)) r += 0x10000u;
  std::memcpy(&x, &r, sizeof x);
  return x;
}

Vec roundBf16Host(const Vec& v) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = roundBf16Host(v[i]);
  return r;
}

Vec randomVec(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Ints randomTokens(std::mt19937& rng, size_t n, int V) {
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  Ints v(n);
  for (int32_t& x : v) x = dist(rng);
  return v;
}

// n distinct rows of [0, R) (n <= R) in random order: a shuffled prefix of 0, ..., R - 1.
// n distinct rows of R (n <= R: scatterAddRows' destinations must be distinct, or its blocks race).
Ints distinctRows(std::mt19937& rng, int n, int R) {
  if (n > R) qFatal("distinctRows: %d distinct rows asked of %d", n, R);
  Ints v(static_cast<size_t>(R));
  std::iota(v.begin(), v.end(), 0);
  std::shuffle(v.begin(), v.end(), rng);
  v.resize(static_cast<size_t>(n));
  return v;
}

// got against ref within atol + rtol * |ref|; infinities (ring attention's -inf log-sum-exps) must be equal.
template <typename T>
QString mismatch(const std::vector<T>& got, const std::vector<T>& ref, double atol, double rtol) {
  if (got.size() != ref.size()) return QStringLiteral("size %1, expected %2").arg(got.size()).arg(ref.size());
  for (size_t i = 0; i < got.size(); i++) {
    if (std::isinf(double(ref[i])) || std::isinf(double(got[i]))) {
      if (double(got[i]) != double(ref[i]))
        return QStringLiteral("index %1 of %2: got %3, expected %4")
            .arg(i)
            .arg(got.size())
            .arg(double(got[i]))
            .arg(double(ref[i]));
      continue;
    }
    const double r = double(ref[i]);
    const double err = std::fabs(double(got[i]) - r);
    if (!(err <= atol + rtol * std::fabs(r)))
      return QStringLiteral("index %1 of %2: got %3, expected %4 (|diff| %5 > %6)")
          .arg(i)
          .arg(got.size())
          .arg(double(got[i]), 0, 'g', 9)
          .arg(r, 0, 'g', 9)
          .arg(err, 0, 'g', 3)
          .arg(atol + rtol * std::fabs(r), 0, 'g', 3);
  }
  return {};
}

#define VERIFY_CLOSE(got, ref, atol, rtol)                                  \
  do {                                                                      \
    const QString msg_ = mismatch((got), (ref), (atol), (rtol));            \
    QVERIFY2(msg_.isEmpty(), qPrintable(QStringLiteral(#got ": ") + msg_)); \
  } while (false)

#define CUDA_OK(expr)                                                                                   \
  do {                                                                                                  \
    const ms::Status s_ = (expr);                                                                       \
    QVERIFY2(s_.isOk(), qPrintable(QStringLiteral(#expr ": ") + QString::fromStdString(s_.message()))); \
  } while (false)

// Sets the process GEMM mode for one scope and restores fp32 after it.
struct GemmModeScope {
  explicit GemmModeScope(cuda::GemmMode mode) { cuda::setGemmMode(mode); }
  ~GemmModeScope() { cuda::setGemmMode(cuda::GemmMode::Fp32); }
};

// ---- Ring attention's blocks (cuda_ring_attention.cu) ----------------------------------------------------
// fp32 against fp32 on the same operands: the kernels and ms::cpu differ only in the order of their fp32 sums
// (an online softmax over 32-key tiles against one pass over the row, the scale applied to the dot product
// or to q) and in expf against the CPU's vexp: a few ulps of each score and probability. out and lse:
// 1e-5 absolute plus 1e-5 relative (out is a weighted mean of v in [-2, 2], lse of order 1 to 5). The
// gradients sum up to H/KV * Tq (dk, dv) or Tk (dq) terms in fp32 and can reach 15 where a few keys are seen
// by hundreds of rows, so their absolute part scales with the buffer: 1e-5 of its largest magnitude plus 1e-5
// relative. Measured on the host, ms::cpu's own fp32 results stay within 0.13 (out, lse) and 0.1
// (gradients) of these bounds against a double computation of the same cases, and the GPU's sums round
// alike. A wrong mask, a missed tile or a wrong merge moves results by 1e-2 or more. In bf16 both sides
// round q, k, v and dout to the same bf16 values (and read the same bf16 out) and the probabilities stay fp32
// on both, so the same tolerances hold.
constexpr double kRingAtol = 1e-5, kRingRtol = 1e-5;
constexpr double kRingGradScale = 1e-5, kRingGradRtol = 1e-5;  // atol = kRingGradScale * max |ref|

// A gradient's absolute tolerance: kRingGradScale of its largest magnitude.
double ringGradAtol(const Vec& ref) {
  double m = 0.0;
  for (float x : ref) m = std::max(m, double(std::fabs(x)));
  return kRingGradScale * m;
}

// The precisions of a ring case: fp32; tf32 (the kernels compute in fp32, like the fused attention); bf16
// (q, k, v, dout rounded); bf16 with the backward reading a bf16 out.
enum RingMode : int { kRingFp32 = 0, kRingTf32 = 1, kRingBf16 = 2, kRingBf16Out = 3 };

const char* ringModeName(int mode) {
  switch (mode) {
    case kRingTf32:
      return "tf32";
    case kRingBf16:
      return "bf16";
    case kRingBf16Out:
      return "bf16 out";
    default:
      return "fp32";
  }
}

// One case: queries (B, Tq) at qpos meet a first block of Tk keys at kposA (first = true), then a second at
// kposB merged into it; the backward runs both blocks from the merged out and lse.
struct RingCase {
  const char* name;
  int B, Tq, Tk, hs, H, KV;
  ms::SeqPositions qpos, kposA, kposB;
};

// Rank r of cp holding chunks r and 2cp-1-r of `chunk` rows each (the engine's load-balanced layout).
ms::SeqPositions cpRank(int cp, int chunk, int r) {
  return {r * chunk, chunk, (2 * cp - 1 - r) * chunk};
}

// Tq and Tk from 1 to 130 (multiples of neither the 8-row blocks nor the 32-key tiles, and one case of
// both), head sizes 8 to 256, 1, 2 and 4 query heads per key/value head. Causal blocks where rows see no key:
// the first blocks of "cp2 rank0: rank1's first", "cp4 rank2" and "Tq130 Tk7" (those rows get out 0 and lse
// -inf, which the second block overwrites, or not: "Tq130 Tk7"'s first three rows see no key at all and have
// no gradient), and the second blocks of all cases but "cp2 rank0: rank1's first", "cp2 rank1", "cp4 rank2"
// and "one block twice" (those rows are left unchanged). The last case has splits outside [0, T] (the
// queries' read as SeqPositions::at reads them, the keys' clamped to [0, Tk] as the CPU clamps them).
const std::vector<RingCase>& ringCases() {
  static const std::vector<RingCase> cases = {
      {"one row", 1, 1, 1, 8, 2, 2, {5, 0, 5}, {5, 0, 5}, {6, 0, 6}},
      {"cp2 rank0: own, then rank1's", 2, 10, 10, 32, 4, 2, cpRank(2, 5, 0), cpRank(2, 5, 0),
       cpRank(2, 5, 1)},
      {"cp2 rank0: rank1's first, then own", 1, 10, 10, 8, 4, 1, cpRank(2, 5, 0), cpRank(2, 5, 1),
       cpRank(2, 5, 0)},
      {"cp3 rank1: own, then rank2's", 2, 66, 66, 64, 2, 1, cpRank(3, 33, 1), cpRank(3, 33, 1),
       cpRank(3, 33, 2)},
      {"cp2 rank1: rank0's, then own", 1, 130, 130, 128, 2, 2, cpRank(2, 65, 1), cpRank(2, 65, 0),
       cpRank(2, 65, 1)},
      {"cp4 rank2: rank3's, then rank0's", 2, 32, 32, 32, 4, 1, cpRank(4, 16, 2), cpRank(4, 16, 3),
       cpRank(4, 16, 0)},
      {"Tq37 Tk130 two runs each", 2, 37, 130, 32, 4, 4, {0, 20, 100}, {0, 65, 70}, {40, 100, 200}},
      {"Tq130 Tk7", 1, 130, 7, 64, 4, 1, {0, 0, 0}, {3, 3, 120}, {130, 0, 130}},
      {"Tq33 Tk100 group of 4", 2, 33, 100, 8, 8, 2, {50, 10, 90}, {0, 50, 60}, {60, 40, 95}},
      {"head size 256", 1, 20, 45, 256, 2, 1, {0, 10, 70}, {0, 20, 60}, {20, 25, 45}},
      {"one block twice T129", 1, 129, 129, 128, 4, 4, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}},
      {"splits outside the rows", 1, 17, 23, 8, 1, 1, {10, 200, 0}, {0, -3, 10}, {30, 50, 0}},
  };
  return cases;
}

// The bf16 bit patterns of values already rounded to bf16 (roundBf16Host): their top 16 bits.
std::vector<uint16_t> bf16Bits(const Vec& rounded) {
  std::vector<uint16_t> bits(rounded.size());
  for (size_t i = 0; i < rounded.size(); ++i) {
    uint32_t u = 0;
    std::memcpy(&u, &rounded[i], sizeof u);
    bits[i] = uint16_t(u >> 16);
  }
  return bits;
}

// The message of the DeviceFailure f() throws, or "" when it throws none.
template <class F>
std::string deviceFailureOf(F&& f) {
  try {
    f();
  } catch (const ms::DeviceFailure& e) {
    return e.what();
  }
  return {};
}

}  // namespace

class TestCudaKernels : public QObject {
  Q_OBJECT

 private:
  cudaStream_t m_stream = nullptr;
  std::unique_ptr<ms::Backend> m_backend;  // made on first use (backend()); the ring tests' wiring checks

  // The CUDA backend on device 0, made once (nullptr, with the reason logged, when it cannot be).
  ms::Backend* backend() {
    if (!m_backend) {
      ms::Expected<std::unique_ptr<ms::Backend>> made = ms::makeCudaBackend(0);
      if (!made) {
        qWarning("makeCudaBackend(0): %s", made.message().c_str());
        return nullptr;
      }
      m_backend = std::move(*made);
    }
    return m_backend.get();
  }

  template <typename T>
  ms::Status upload(DBuf<T>& dst, const std::vector<T>& src) {
    ms::Expected<DBuf<T>> b = DBuf<T>::create(src.size());
    if (!b) return b.status();
    dst = std::move(*b);
    return cuda::copyToDevice(dst.data(), src.data(), dst.bytes(), m_stream);
  }
  template <typename T>
  ms::Status download(std::vector<T>& dst, const DBuf<T>& src) {
    dst.resize(src.size());
    return cuda::copyToHost(dst.data(), src.data(), src.bytes(), m_stream);
  }

  // The fused attention against the CPU's materialised attention: out and dqkv (accumulated onto non-zero
  // values), and the saved log-sum-exp against a double-precision host computation. kernel: the one to name,
  // or nullopt for the plain entry points' choice. bf16: GemmMode::Bf16 and a CPU reference on bf16-rounded
  // operands.
  void flashAgainstCpu(int B, int T, int C, int H, bool causal, bool bf16,
                       std::optional<cuda::FlashAttentionKernel> kernel) {
    GemmModeScope scope(bf16 ? cuda::GemmMode::Bf16 : cuda::GemmMode::Fp32);
    const double atol = bf16 ? kBf16AttentionAtol : kGemmAtol;
    const double rtol = bf16 ? kBf16AttentionRtol : kGemmRtol;
    const int hs = C / H;
    std::mt19937 rng(kSeed + 11);
    const Vec qkv = randomVec(rng, size_t(B) * T * 3 * C, -2.0f, 2.0f);  // (B, T, 3C)
    const Vec dout = randomVec(rng, size_t(B) * T * C);                  // (B, T, C)
    const Vec dqkv0 = randomVec(rng, qkv.size());
    const Vec qkvG = bf16 ? roundBf16Host(qkv) : qkv;
    const Vec doutG = bf16 ? roundBf16Host(dout) : dout;
    const size_t attSize = size_t(B) * H * T * T;
    Vec out(dout.size()), att(attSize), scratch(attSize), dqkv = dqkv0;
    cpu::attentionForward(out.data(), att.data(), qkvG.data(), B, T, C, H, causal);
    cpu::attentionBackward(dqkv.data(), scratch.data(), doutG.data(), qkvG.data(), att.data(), B, T, C, H,
                           causal);
    // lse (B, H, T) in double from the operands the kernel multiplies.
    Vec lse(size_t(B) * H * T);
    const double scale = 1.0 / std::sqrt(double(hs));
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < T; ++i) {
          const int len = causal ? i + 1 : T;
          std::vector<double> sc(static_cast<size_t>(len));
          double mx = -INFINITY;
          for (int j = 0; j < len; ++j) {
            double dotp = 0.0;
            for (int d = 0; d < hs; ++d)
              dotp += double(qkvG[(size_t(b) * T + i) * 3 * C + size_t(h) * hs + d]) *
                      double(qkvG[(size_t(b) * T + j) * 3 * C + C + size_t(h) * hs + d]);
            sc[size_t(j)] = dotp * scale;
            mx = std::max(mx, sc[size_t(j)]);
          }
          double sum = 0.0;
          for (double v : sc) sum += std::exp(v - mx);
          lse[(size_t(b) * H + h) * T + i] = float(mx + std::log(sum));
        }

    DBuf<float> dQkv, dOut, dLse, dScratch, dDout, dDqkv;
    CUDA_OK(upload(dQkv, qkv));
    CUDA_OK(upload(dOut, Vec(out.size(), 5.0f)));  // overwritten
    CUDA_OK(upload(dLse, Vec(lse.size(), 5.0f)));
    CUDA_OK(upload(dScratch, Vec(lse.size(), 5.0f)));  // (B, H, T) is all the backward needs
    CUDA_OK(upload(dDout, dout));
    CUDA_OK(upload(dDqkv, dqkv0));
    if (kernel) {
      CUDA_OK(cuda::flashAttentionForwardWith(*kernel, dOut.data(), dLse.data(), dQkv.data(), B, T, C, H,
                                              causal, m_stream));
      CUDA_OK(cuda::flashAttentionBackwardWith(*kernel, dDqkv.data(), dScratch.data(), dDout.data(),
                                               dQkv.data(), dOut.data(), dLse.data(), B, T, C, H, causal,
                                               m_stream));
    } else {
      CUDA_OK(
          cuda::flashAttentionForward(dOut.data(), dLse.data(), dQkv.data(), B, T, C, H, causal, m_stream));
      CUDA_OK(cuda::flashAttentionBackward(dDqkv.data(), dScratch.data(), dDout.data(), dQkv.data(),
                                           dOut.data(), dLse.data(), B, T, C, H, causal, m_stream));
    }
    CUDA_OK(cuda::synchronize(m_stream));
    Vec got;
    CUDA_OK(download(got, dLse));
    VERIFY_CLOSE(got, lse, kGemmAtol, kGemmRtol);
    CUDA_OK(download(got, dOut));
    VERIFY_CLOSE(got, out, atol, rtol);
    CUDA_OK(download(got, dDqkv));
    VERIFY_CLOSE(got, dqkv, atol, rtol);
  }

  // One ring case (see ringCases) against ms::cpu: the first block's out and lse (overwriting NaNs), the
  // second block's merge, then the backward of both blocks from the CPU's final out and lse (so both sides
  // differentiate the same values): the q part of dqkv and each block's dkv accumulated onto random values,
  // the k and v parts of dqkv left as they were (bit for bit), and the same bits again from the same start
  // (no atomics). viaBackend: through the CUDA backend's overrides (its own stream, synchronised before each
  // download) instead of the ms::cuda functions.
  void ringAgainstCpu(const RingCase& rc, bool causal, int mode, bool viaBackend) {
    const cuda::GemmMode gemm = mode == kRingTf32   ? cuda::GemmMode::Tf32
                                : mode >= kRingBf16 ? cuda::GemmMode::Bf16
                                                    : cuda::GemmMode::Fp32;
    GemmModeScope scope(gemm);
    ms::Backend* be = nullptr;
    if (viaBackend) {
      be = backend();
      QVERIFY(be != nullptr);
      be->setGemmPrecision(mode == kRingTf32   ? ms::GemmPrecision::Tf32
                           : mode >= kRingBf16 ? ms::GemmPrecision::Bf16
                                               : ms::GemmPrecision::Fp32);
    }
    struct PrecisionReset {  // the backend back to fp32 (GemmModeScope resets the process mode after it)
      ms::Backend* be;
      ~PrecisionReset() {
        if (be) be->setGemmPrecision(ms::GemmPrecision::Fp32);
      }
    } reset{be};
    const int B = rc.B, Tq = rc.Tq, Tk = rc.Tk, H = rc.H, KV = rc.KV, C = H * rc.hs, Ckv = KV * rc.hs;
    const size_t n = size_t(B) * Tq * C, nLse = size_t(B) * H * Tq, nKv = size_t(B) * Tk * 2 * Ckv;
    std::mt19937 rng(kSeed + 50);
    const Vec qkv = randomVec(rng, size_t(B) * Tq * 3 * C, -2.0f, 2.0f);  // (B, Tq, 3C)
    const Vec kvA = randomVec(rng, nKv, -2.0f, 2.0f);                     // (B, Tk, 2 Ckv)
    const Vec kvB = randomVec(rng, nKv, -2.0f, 2.0f);
    const Vec dout = randomVec(rng, n);  // (B, Tq, C)
    const Vec dqkv0 = randomVec(rng, qkv.size());
    const Vec dkvA0 = randomVec(rng, nKv), dkvB0 = randomVec(rng, nKv);
    const bool rounded = mode >= kRingBf16;  // the CPU reference on the operands the kernels round
    const Vec qkvG = rounded ? roundBf16Host(qkv) : qkv;
    const Vec kvAG = rounded ? roundBf16Host(kvA) : kvA;
    const Vec kvBG = rounded ? roundBf16Host(kvB) : kvB;
    const Vec doutG = rounded ? roundBf16Host(dout) : dout;

    // ---- forward: the first block, then the second merged into it
    const float nan = std::numeric_limits<float>::quiet_NaN();
    Vec out(n, nan), lse(nLse, nan);
    cpu::attentionBlockForward(out.data(), lse.data(), qkvG.data(), kvAG.data(), B, Tq, Tk, C, H, KV, rc.qpos,
                               rc.kposA, causal, true);
    const Vec out1 = out, lse1 = lse;
    cpu::attentionBlockForward(out.data(), lse.data(), qkvG.data(), kvBG.data(), B, Tq, Tk, C, H, KV, rc.qpos,
                               rc.kposB, causal, false);

    DBuf<float> dQkv, dKvA, dKvB, dOut, dLse, dDout;
    CUDA_OK(upload(dQkv, qkv));
    CUDA_OK(upload(dKvA, kvA));
    CUDA_OK(upload(dKvB, kvB));
    CUDA_OK(upload(dDout, dout));
    CUDA_OK(upload(dOut, Vec(n, nan)));  // first overwrites every row
    CUDA_OK(upload(dLse, Vec(nLse, nan)));
    auto forward = [&](const DBuf<float>& kv, ms::SeqPositions kpos, bool first) -> ms::Status {
      if (!be)
        return cuda::attentionBlockForward(dOut.data(), dLse.data(), dQkv.data(), kv.data(), B, Tq, Tk, C, H,
                                           KV, rc.qpos, kpos, causal, first, m_stream);
      const std::string failure = deviceFailureOf([&] {
        be->attentionBlockForward(dOut.data(), dLse.data(), dQkv.data(), kv.data(), B, Tq, Tk, C, H, KV,
                                  rc.qpos, kpos, causal, first);
        be->synchronize();
      });
      return failure.empty() ? ms::Status::ok() : ms::Status::error(failure);
    };
    Vec got;
    CUDA_OK(forward(dKvA, rc.kposA, true));
    CUDA_OK(download(got, dOut));
    VERIFY_CLOSE(got, out1, kRingAtol, kRingRtol);
    CUDA_OK(download(got, dLse));
    VERIFY_CLOSE(got, lse1, kRingAtol, kRingRtol);
    CUDA_OK(forward(dKvB, rc.kposB, false));
    CUDA_OK(download(got, dOut));
    VERIFY_CLOSE(got, out, kRingAtol, kRingRtol);
    CUDA_OK(download(got, dLse));
    VERIFY_CLOSE(got, lse, kRingAtol, kRingRtol);

    // ---- backward of both blocks from the CPU's final out (bf16 in kRingBf16Out) and lse
    const bool bf16Out = mode == kRingBf16Out;
    const Vec outIn = bf16Out ? roundBf16Host(out) : out;  // what the kernels read, widened
    Vec dqkv = dqkv0, dkvA = dkvA0, dkvB = dkvB0;
    cpu::attentionBlockBackward(dqkv.data(), dkvA.data(), doutG.data(), qkvG.data(), kvAG.data(),
                                outIn.data(), lse.data(), B, Tq, Tk, C, H, KV, rc.qpos, rc.kposA, causal);
    cpu::attentionBlockBackward(dqkv.data(), dkvB.data(), doutG.data(), qkvG.data(), kvBG.data(),
                                outIn.data(), lse.data(), B, Tq, Tk, C, H, KV, rc.qpos, rc.kposB, causal);
    DBuf<float> dOutIn, dDqkv, dDkvA, dDkvB;
    DBuf<uint16_t> dOut16;
    CUDA_OK(upload(dLse, lse));
    CUDA_OK(upload(dOutIn, out));
    CUDA_OK(upload(dOut16, bf16Bits(outIn)));
    const ms::TensorIn outArg = bf16Out ? ms::TensorIn(reinterpret_cast<const ms::bfloat16*>(dOut16.data()))
                                        : ms::TensorIn(static_cast<const float*>(dOutIn.data()));
    auto backward = [&](const DBuf<float>& kv, DBuf<float>& dkv, ms::SeqPositions kpos) -> ms::Status {
      if (!be)
        return cuda::attentionBlockBackward(dDqkv.data(), dkv.data(), dDout.data(), dQkv.data(), kv.data(),
                                            outArg, dLse.data(), B, Tq, Tk, C, H, KV, rc.qpos, kpos, causal,
                                            m_stream);
      const std::string failure = deviceFailureOf([&] {
        be->attentionBlockBackward(dDqkv.data(), dkv.data(), dDout.data(), dQkv.data(), kv.data(), outArg,
                                   dLse.data(), B, Tq, Tk, C, H, KV, rc.qpos, kpos, causal);
        be->synchronize();
      });
      return failure.empty() ? ms::Status::ok() : ms::Status::error(failure);
    };
    Vec gotDqkv, gotDkvA, gotDkvB;
    for (int rep = 0; rep < 2; ++rep) {  // the second time from the same start: the same bits
      CUDA_OK(upload(dDqkv, dqkv0));
      CUDA_OK(upload(dDkvA, dkvA0));
      CUDA_OK(upload(dDkvB, dkvB0));
      CUDA_OK(backward(dKvA, dDkvA, rc.kposA));
      CUDA_OK(backward(dKvB, dDkvB, rc.kposB));
      Vec a, b, c;
      CUDA_OK(download(a, dDqkv));
      CUDA_OK(download(b, dDkvA));
      CUDA_OK(download(c, dDkvB));
      if (rep == 0) {
        gotDqkv = std::move(a);
        gotDkvA = std::move(b);
        gotDkvB = std::move(c);
        continue;
      }
      QVERIFY2(a.size() == gotDqkv.size() &&
                   std::memcmp(a.data(), gotDqkv.data(), a.size() * sizeof(float)) == 0 &&
                   std::memcmp(b.data(), gotDkvA.data(), b.size() * sizeof(float)) == 0 &&
                   std::memcmp(c.data(), gotDkvB.data(), c.size() * sizeof(float)) == 0,
               "the ring attention backward is not bitwise reproducible");
    }
    // dqkv: its q part against the CPU's, its k and v parts exactly as they started.
    Vec gotQ, refQ, gotKvPart, startKvPart;
    for (size_t row = 0; row < size_t(B) * Tq; ++row) {
      const size_t at = row * 3 * C;
      gotQ.insert(gotQ.end(), gotDqkv.begin() + at, gotDqkv.begin() + at + C);
      refQ.insert(refQ.end(), dqkv.begin() + at, dqkv.begin() + at + C);
      gotKvPart.insert(gotKvPart.end(), gotDqkv.begin() + at + C, gotDqkv.begin() + at + 3 * C);
      startKvPart.insert(startKvPart.end(), dqkv0.begin() + at + C, dqkv0.begin() + at + 3 * C);
    }
    VERIFY_CLOSE(gotQ, refQ, ringGradAtol(refQ), kRingGradRtol);
    QVERIFY2(std::memcmp(gotKvPart.data(), startKvPart.data(), gotKvPart.size() * sizeof(float)) == 0,
             "the k and v parts of dqkv were touched");
    VERIFY_CLOSE(gotDkvA, dkvA, ringGradAtol(dkvA), kRingGradRtol);
    VERIFY_CLOSE(gotDkvB, dkvB, ringGradAtol(dkvB), kRingGradRtol);
  }

 private slots:
  void initTestCase() {
    if (cuda::deviceCount() == 0) QSKIP("no CUDA device: GPU kernel tests skipped");
    qInfo("device 0: %s", cuda::deviceName(0).c_str());
    CUDA_OK(cuda::cudaStatus(cudaStreamCreate(&m_stream), "cudaStreamCreate"));
  }

  void cleanupTestCase() {
    m_backend.reset();
    if (m_stream) CUDA_OK(cuda::cudaStatus(cudaStreamDestroy(m_stream), "cudaStreamDestroy"));
  }

  // The error path: a Status that names the op and the CUDA error.
  void errorsNameTheOp() {
    const ms::Status s = cuda::cudaStatus(cudaErrorInvalidValue, "myOp");
    QVERIFY(!s.isOk());
    QVERIFY2(s.message().find("myOp") != std::string::npos, s.message().c_str());
    QVERIFY2(s.message().find("cudaErrorInvalidValue") != std::string::npos, s.message().c_str());
    QVERIFY(cuda::cudaStatus(cudaSuccess, "myOp").isOk());
    const ms::Status bad = cuda::attentionForward(nullptr, nullptr, nullptr, 1, 1, 7, 3, true, m_stream);
    QVERIFY2(!bad.isOk() && bad.message().find("attentionForward") != std::string::npos,
             bad.message().c_str());
  }

  // The conversion of every Bf16 GEMM operand: bit for bit the host's round to nearest even, on specials,
  // ties, subnormals, overflow and random floats, at aligned and unaligned addresses (the kernel has a
  // four-at-a-time path for 16-byte aligned sources).
  void roundToBf16() {
    std::vector<uint32_t> bits = {0x00000000u,
                                  0x80000000u,
                                  0x3f800000u,
                                  0x3f808000u /* tie, to even: down */,
                                  0x3f818000u /* tie, to even: up */,
                                  0x3f808001u,
                                  0x3f807fffu,
                                  0x3fffffffu /* carry to 2 */,
                                  0x7f7fffffu /* max float: to infinity */,
                                  0xff7fffffu,
                                  0x7f800000u,
                                  0xff800000u,
                                  0x00000001u,
                                  0x00008000u,
                                  0x00018000u,
                                  0x00008001u,
                                  0x007fffffu,
                                  0x00800000u,
                                  0x7f7f7fffu,
                                  0x7fc00000u /* NaN */,
                                  0xffc00001u /* NaN */};
    std::mt19937 rng(kSeed + 9);
    std::uniform_int_distribution<uint32_t> any;
    for (int i = 0; i < 100003; ++i) bits.push_back(any(rng));
    Vec x(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) std::memcpy(&x[i], &bits[i], sizeof(float));
    DBuf<float> dX;
    CUDA_OK(upload(dX, x));
    ms::Expected<DBuf<uint16_t>> dY = DBuf<uint16_t>::create(x.size());
    QVERIFY(dY.isOk());
    for (const size_t offset : {size_t(0), size_t(1), size_t(3)}) {
      const size_t n = x.size() - offset;
      CUDA_OK(cuda::roundToBf16(dY->data(), dX.data() + offset, n, m_stream));
      std::vector<uint16_t> got(n);
      CUDA_OK(cuda::copyToHost(got.data(), dY->data(), n * sizeof(uint16_t), m_stream));
      for (size_t i = 0; i < n; ++i) {
        const float in = x[offset + i];
        const uint32_t gotBits = uint32_t(got[i]) << 16;
        float g = 0.0f;
        std::memcpy(&g, &gotBits, sizeof g);
        if (std::isnan(in)) {
          QVERIFY2(std::isnan(g), qPrintable(QStringLiteral("NaN input %1 -> %2").arg(i).arg(got[i], 4, 16)));
          continue;
        }
        const float want = roundBf16Host(in);
        uint32_t wantBits = 0;
        std::memcpy(&wantBits, &want, sizeof wantBits);
        QVERIFY2(gotBits == wantBits, qPrintable(QStringLiteral("offset %1, %2: 0x%3 -> 0x%4, expected 0x%5")
                                                     .arg(offset)
                                                     .arg(i)
                                                     .arg(bits[offset + i], 8, 16, QChar('0'))
                                                     .arg(gotBits, 8, 16, QChar('0'))
                                                     .arg(wantBits, 8, 16, QChar('0'))));
      }
    }
    CUDA_OK(cuda::roundToBf16(dY->data(), dX.data(), 0, m_stream));  // nothing to do
  }

  void linear_data() {
    QTest::addColumn<int>("N");
    QTest::addColumn<int>("C");
    QTest::addColumn<int>("OC");
    QTest::addColumn<bool>("transposed");
    QTest::addColumn<int>("mode");
    for (const cuda::GemmMode mode : {cuda::GemmMode::Fp32, cuda::GemmMode::Tf32, cuda::GemmMode::Bf16}) {
      const char* m = modeName(mode);
      const int md = int(mode);
      QTest::addRow("%s N1 C7 OC5", m) << 1 << 7 << 5 << false << md;
      QTest::addRow("%s N37 C33 OC97", m) << 37 << 33 << 97 << false << md;
      QTest::addRow("%s N128 C256 OC768", m) << 128 << 256 << 768 << false << md;
      QTest::addRow("%s T N1 C7 OC5", m) << 1 << 7 << 5 << true << md;
      QTest::addRow("%s T N37 C7 OC3", m) << 37 << 7 << 3 << true << md;
      QTest::addRow("%s T lm-head N8 C64 V50257", m) << 8 << 64 << 50257 << true << md;
    }
    // The bias gradient's column sum over many row slices (cuda::detail::columnSlices), a short last one.
    QTest::addRow("fp32 N1000 C64 OC100") << 1000 << 64 << 100 << false << int(cuda::GemmMode::Fp32);
    QTest::addRow("fp32 T N4099 C16 OC33") << 4099 << 16 << 33 << true << int(cuda::GemmMode::Fp32);
    // An empty sum (C = 0): out = bias, as on the CPU (cuBLAS rejects its leading dimension of 0).
    QTest::addRow("fp32 N5 C0 OC3") << 5 << 0 << 3 << false << int(cuda::GemmMode::Fp32);
    QTest::addRow("fp32 T N5 C0 OC3") << 5 << 0 << 3 << true << int(cuda::GemmMode::Fp32);
  }

  void linear() {
    QFETCH(int, N);
    QFETCH(int, C);
    QFETCH(int, OC);
    QFETCH(bool, transposed);
    QFETCH(int, mode);
    const auto gemmMode = cuda::GemmMode(mode);
    const bool tf32 = gemmMode == cuda::GemmMode::Tf32;
    const bool bf16 = gemmMode == cuda::GemmMode::Bf16;
    GemmModeScope scope(gemmMode);
    const double atol = tf32 ? kTf32Atol : bf16 ? kBf16LinearAtol : kGemmAtol;
    const double rtol = tf32 ? kTf32Rtol : bf16 ? kBf16LinearRtol : kGemmRtol;
    std::mt19937 rng(kSeed);
    const Vec inp = randomVec(rng, size_t(N) * C);      // (N, C)
    const Vec weight = randomVec(rng, size_t(C) * OC);  // (C, OC) or (OC, C)
    const Vec bias = randomVec(rng, size_t(OC));        // (OC)
    const Vec dout = randomVec(rng, size_t(N) * OC);    // (N, OC)
    const Vec dinp0 = randomVec(rng, inp.size());       // non-zero starting gradients
    const Vec dweight0 = randomVec(rng, weight.size());
    const Vec dbias0 = randomVec(rng, bias.size());
    // The reference multiplies the operands the GPU multiplies: rounded to bf16 in Bf16 mode. The bias and
    // its gradient (a column sum of the fp32 dout) are no GEMM and stay fp32.
    const Vec inpG = bf16 ? roundBf16Host(inp) : inp;
    const Vec weightG = bf16 ? roundBf16Host(weight) : weight;
    const Vec doutG = bf16 ? roundBf16Host(dout) : dout;

    Vec out(size_t(N) * OC), dinp = dinp0, dweight = dweight0, dbias = dbias0;
    (transposed ? cpu::linearForwardT : cpu::linearForward)(out.data(), inpG.data(), weightG.data(),
                                                            bias.data(), N, C, OC);
    (transposed ? cpu::linearBackwardT : cpu::linearBackward)(
        dinp.data(), dweight.data(), nullptr, doutG.data(), inpG.data(), weightG.data(), N, C, OC);
    (transposed ? cpu::linearBackwardT : cpu::linearBackward)(nullptr, nullptr, dbias.data(), dout.data(),
                                                              nullptr, nullptr, N, C, OC);

    DBuf<float> dInp, dWeight, dBias, dOut, dDout, dDinp, dDweight, dDbias;
    CUDA_OK(upload(dInp, inp));
    CUDA_OK(upload(dWeight, weight));
    CUDA_OK(upload(dBias, bias));
    CUDA_OK(upload(dOut, Vec(out.size(), 7.0f)));  // forward overwrites
    CUDA_OK(upload(dDout, dout));
    CUDA_OK(upload(dDinp, dinp0));
    CUDA_OK(upload(dDweight, dweight0));
    CUDA_OK(upload(dDbias, dbias0));
    CUDA_OK((transposed ? cuda::linearForwardT : cuda::linearForward)(
        dOut.data(), dInp.data(), dWeight.data(), dBias.data(), N, C, OC, m_stream));
    CUDA_OK((transposed ? cuda::linearBackwardT : cuda::linearBackward)(
        dDinp.data(), dDweight.data(), dDbias.data(), dDout.data(), dInp.data(), dWeight.data(), N, C, OC,
        m_stream));
    CUDA_OK(cuda::synchronize(m_stream));
    Vec got;
    CUDA_OK(download(got, dOut));
    VERIFY_CLOSE(got, out, atol, rtol);
    if (bf16) {
      // The operands really were rounded: the unrounded product is much further away.
      Vec unrounded(out.size());
      (transposed ? cpu::linearForwardT : cpu::linearForward)(unrounded.data(), inp.data(), weight.data(),
                                                              bias.data(), N, C, OC);
      double toRounded = 0.0, toUnrounded = 0.0;
      for (size_t i = 0; i < got.size(); ++i) {
        toRounded = std::max(toRounded, std::fabs(double(got[i]) - double(out[i])));
        toUnrounded = std::max(toUnrounded, std::fabs(double(got[i]) - double(unrounded[i])));
      }
      QVERIFY2(toUnrounded > 8 * toRounded,
               qPrintable(QStringLiteral("max |diff| %1 to the bf16 reference, %2 to the fp32 one")
                              .arg(toRounded)
                              .arg(toUnrounded)));
    }
    CUDA_OK(download(got, dDinp));
    VERIFY_CLOSE(got, dinp, atol, rtol);
    CUDA_OK(download(got, dDweight));
    VERIFY_CLOSE(got, dweight, atol, rtol);
    CUDA_OK(download(got, dDbias));
    VERIFY_CLOSE(got, dbias, kAtol, kRtol);  // a column sum, never TF32

    // Nullable: no bias forward, only dweight backward (dinp and dbias must stay untouched).
    Vec outNoBias(out.size());
    (transposed ? cpu::linearForwardT : cpu::linearForward)(outNoBias.data(), inpG.data(), weightG.data(),
                                                            nullptr, N, C, OC);
    CUDA_OK((transposed ? cuda::linearForwardT : cuda::linearForward)(
        dOut.data(), dInp.data(), dWeight.data(), nullptr, N, C, OC, m_stream));
    CUDA_OK((transposed ? cuda::linearBackwardT : cuda::linearBackward)(
        nullptr, dDweight.data(), nullptr, dDout.data(), dInp.data(), dWeight.data(), N, C, OC, m_stream));
    CUDA_OK(download(got, dOut));
    VERIFY_CLOSE(got, outNoBias, atol, rtol);
    CUDA_OK(download(got, dDinp));
    VERIFY_CLOSE(got, dinp, atol, rtol);
    CUDA_OK(download(got, dDbias));
    VERIFY_CLOSE(got, dbias, kAtol, kRtol);
    Vec dweight2 = dweight;
    (transposed ? cpu::linearBackwardT : cpu::linearBackward)(nullptr, dweight2.data(), nullptr, doutG.data(),
                                                              inpG.data(), weightG.data(), N, C, OC);
    CUDA_OK(download(got, dDweight));
    VERIFY_CLOSE(got, dweight2, atol, rtol);
  }

  // The forward's bias is added in the GEMM's epilogue (cuBLASLt) where the bias is 16-byte aligned and by a
  // separate kernel where not; cuBLASLt must be told how far each operand is from its default 256-byte
  // alignment. Every combination of an input, a bias and an output one float off their allocation's start
  // gives the CPU's result, in both layouts and precisions.
  void linearEpilogueAlignments_data() {
    QTest::addColumn<int>("mode");
    QTest::addColumn<bool>("transposed");
    for (const cuda::GemmMode mode : {cuda::GemmMode::Fp32, cuda::GemmMode::Bf16})
      for (const bool transposed : {false, true})
        QTest::addRow("%s%s", modeName(mode), transposed ? " T" : "") << int(mode) << transposed;
  }

  void linearEpilogueAlignments() {
    QFETCH(int, mode);
    QFETCH(bool, transposed);
    const auto gemmMode = cuda::GemmMode(mode);
    const bool bf16 = gemmMode == cuda::GemmMode::Bf16;
    GemmModeScope scope(gemmMode);
    const double atol = bf16 ? kBf16LinearAtol : kGemmAtol, rtol = bf16 ? kBf16LinearRtol : kGemmRtol;
    for (const auto& [N, C, OC] : {std::tuple{37, 33, 97}, std::tuple{128, 256, 768}}) {
      std::mt19937 rng(kSeed);
      const Vec inp = randomVec(rng, size_t(N) * C + 1), weight = randomVec(rng, size_t(C) * OC);
      const Vec bias = randomVec(rng, size_t(OC) + 1);
      const Vec inpG = bf16 ? roundBf16Host(inp) : inp, weightG = bf16 ? roundBf16Host(weight) : weight;
      DBuf<float> dInp, dWeight, dBias, dOut;
      CUDA_OK(upload(dInp, inp));
      CUDA_OK(upload(dWeight, weight));
      CUDA_OK(upload(dBias, bias));
      CUDA_OK(upload(dOut, Vec(size_t(N) * OC + 1, 7.0f)));
      for (int in = 0; in < 2; ++in)
        for (int b = 0; b < 2; ++b)
          for (int o = 0; o < 2; ++o) {
            Vec want(size_t(N) * OC);
            (transposed ? cpu::linearForwardT : cpu::linearForward)(
                want.data(), inpG.data() + in, weightG.data(), bias.data() + b, N, C, OC);
            CUDA_OK((transposed ? cuda::linearForwardT : cuda::linearForward)(
                dOut.data() + o, dInp.data() + in, dWeight.data(), dBias.data() + b, N, C, OC, m_stream));
            Vec got;
            CUDA_OK(download(got, dOut));
            got.erase(got.begin(), got.begin() + o);
            got.resize(want.size());
            VERIFY_CLOSE(got, want, atol, rtol);
          }
    }
  }

  // A bf16 weight (the parameter store's working copy, ms::TensorIn) is multiplied as it is: every linear op
  // gives the same bits from roundToBf16(weight) as from the fp32 weight it converts per call (the same bf16
  // operands reach the same cuBLAS GEMM), in both layouts and for input-only and weight-only backward calls.
  // In fp32 mode a bf16 weight is refused naming the op and the operand, even by a call that does not read
  // it.
  void linearBf16Weight_data() {
    QTest::addColumn<int>("N");
    QTest::addColumn<int>("C");
    QTest::addColumn<int>("OC");
    QTest::addColumn<bool>("transposed");
    QTest::newRow("N37 C33 OC97") << 37 << 33 << 97 << false;
    QTest::newRow("N128 C256 OC768") << 128 << 256 << 768 << false;
    QTest::newRow("T N37 C7 OC3") << 37 << 7 << 3 << true;
    QTest::newRow("T lm-head N8 C64 V50257") << 8 << 64 << 50257 << true;
  }

  void linearBf16Weight() {
    QFETCH(int, N);
    QFETCH(int, C);
    QFETCH(int, OC);
    QFETCH(bool, transposed);
    std::mt19937 rng(kSeed + 21);
    const Vec inp = randomVec(rng, size_t(N) * C);      // (N, C)
    const Vec weight = randomVec(rng, size_t(C) * OC);  // (C, OC) or (OC, C)
    const Vec bias = randomVec(rng, size_t(OC));        // (OC)
    const Vec dout = randomVec(rng, size_t(N) * OC);    // (N, OC)
    const Vec dinp0 = randomVec(rng, inp.size());
    const Vec dweight0 = randomVec(rng, weight.size());
    DBuf<float> dInp, dWeight, dBias, dDout;
    CUDA_OK(upload(dInp, inp));
    CUDA_OK(upload(dWeight, weight));
    CUDA_OK(upload(dBias, bias));
    CUDA_OK(upload(dDout, dout));
    ms::Expected<DBuf<uint16_t>> dW16 = DBuf<uint16_t>::create(weight.size());
    QVERIFY(dW16.isOk());
    CUDA_OK(cuda::roundToBf16(dW16->data(), dWeight.data(), weight.size(), m_stream));
    const ms::TensorIn w16(reinterpret_cast<const ms::bfloat16*>(dW16->data()));
    const auto forward = transposed ? cuda::linearForwardT : cuda::linearForward;
    const auto backward = transposed ? cuda::linearBackwardT : cuda::linearBackward;

    // forward, a full backward, then an input-only and a weight-only one accumulating on top.
    auto run = [&](ms::TensorIn w, Vec& out, Vec& dinp, Vec& dweight) -> ms::Status {
      DBuf<float> dOut, dDinp, dDweight, dDbias;
      MS_TRY(upload(dOut, Vec(size_t(N) * OC, 7.0f)));
      MS_TRY(upload(dDinp, dinp0));
      MS_TRY(upload(dDweight, dweight0));
      MS_TRY(upload(dDbias, Vec(size_t(OC), 0.0f)));
      MS_TRY(forward(dOut.data(), dInp.data(), w, dBias.data(), N, C, OC, m_stream));
      MS_TRY(backward(dDinp.data(), dDweight.data(), dDbias.data(), dDout.data(), dInp.data(), w, N, C, OC,
                      m_stream));
      MS_TRY(backward(dDinp.data(), nullptr, nullptr, dDout.data(), dInp.data(), w, N, C, OC, m_stream));
      MS_TRY(backward(nullptr, dDweight.data(), nullptr, dDout.data(), dInp.data(), w, N, C, OC, m_stream));
      MS_TRY(cuda::synchronize(m_stream));
      MS_TRY(download(out, dOut));
      MS_TRY(download(dinp, dDinp));
      return download(dweight, dDweight);
    };
    {
      GemmModeScope scope(cuda::GemmMode::Bf16);
      Vec out32, dinp32, dw32, out16, dinp16, dw16;
      CUDA_OK(run(dWeight.data(), out32, dinp32, dw32));
      CUDA_OK(run(w16, out16, dinp16, dw16));
      QCOMPARE(out32.size(), out16.size());
      QVERIFY2(std::memcmp(out16.data(), out32.data(), out32.size() * sizeof(float)) == 0, "forward differs");
      QVERIFY2(std::memcmp(dinp16.data(), dinp32.data(), dinp32.size() * sizeof(float)) == 0, "dinp differs");
      QVERIFY2(std::memcmp(dw16.data(), dw32.data(), dw32.size() * sizeof(float)) == 0, "dweight differs");
    }
    // fp32 mode: refused, naming the op and the operand.
    DBuf<float> dOut, dDweight;
    CUDA_OK(upload(dOut, Vec(size_t(N) * OC, 0.0f)));
    CUDA_OK(upload(dDweight, dweight0));
    const char* name = transposed ? "linearForwardT: weight" : "linearForward: weight";
    const ms::Status f = forward(dOut.data(), dInp.data(), w16, nullptr, N, C, OC, m_stream);
    QVERIFY2(!f.isOk() && f.message().find(name) != std::string::npos, f.message().c_str());
    const char* bname = transposed ? "linearBackwardT: weight" : "linearBackward: weight";
    const ms::Status b =
        backward(nullptr, dDweight.data(), nullptr, dDout.data(), dInp.data(), w16, N, C, OC, m_stream);
    QVERIFY2(!b.isOk() && b.message().find(bname) != std::string::npos, b.message().c_str());
  }

  void layerNorm_data() {
    QTest::addColumn<int>("N");
    QTest::addColumn<int>("C");
    QTest::newRow("N1 C7") << 1 << 7;
    QTest::newRow("N3 C1") << 3 << 1;
    QTest::newRow("N37 C33") << 37 << 33;
    QTest::newRow("N64 C768") << 64 << 768;
    QTest::newRow("N9 C4099") << 9 << 4099;
    // Many row slices in the weight and bias gradients (cuda::detail::columnSlices), a short last one.
    QTest::newRow("N4099 C33") << 4099 << 33;
    QTest::newRow("N777 C768") << 777 << 768;
  }

  void layerNorm() {
    QFETCH(int, N);
    QFETCH(int, C);
    std::mt19937 rng(kSeed + 1);
    const Vec inp = randomVec(rng, size_t(N) * C, -2.0f, 3.0f);  // (N, C), mean away from 0
    const Vec weight = randomVec(rng, size_t(C));
    const Vec bias = randomVec(rng, size_t(C));
    const Vec dout = randomVec(rng, inp.size());
    const Vec dinp0 = randomVec(rng, inp.size());
    const Vec dweight0 = randomVec(rng, size_t(C));
    const Vec dbias0 = randomVec(rng, size_t(C));
    const float eps = 1e-5f;
    Vec out(inp.size()), mean(N), rstd(N), dinp = dinp0, dweight = dweight0, dbias = dbias0;
    cpu::layerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C,
                          eps);
    cpu::layerNormBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(),
                           mean.data(), rstd.data(), N, C);

    DBuf<float> dInp, dW, dB, dOut, dMean, dRstd, dDout, dDinp, dDw, dDb;
    CUDA_OK(upload(dInp, inp));
    CUDA_OK(upload(dW, weight));
    CUDA_OK(upload(dB, bias));
    CUDA_OK(upload(dOut, Vec(out.size())));
    CUDA_OK(upload(dMean, Vec(N)));
    CUDA_OK(upload(dRstd, Vec(N)));
    CUDA_OK(upload(dDout, dout));
    CUDA_OK(upload(dDinp, dinp0));
    CUDA_OK(upload(dDw, dweight0));
    CUDA_OK(upload(dDb, dbias0));
    CUDA_OK(cuda::layerNormForward(dOut.data(), dMean.data(), dRstd.data(), dInp.data(), dW.data(), dB.data(),
                                   N, C, eps, m_stream));
    CUDA_OK(cuda::layerNormBackward(dDinp.data(), dDw.data(), dDb.data(), dDout.data(), dInp.data(),
                                    dW.data(), dMean.data(), dRstd.data(), N, C, m_stream));
    Vec got;
    CUDA_OK(download(got, dOut));
    VERIFY_CLOSE(got, out, kAtol, kRtol);
    CUDA_OK(download(got, dMean));
    VERIFY_CLOSE(got, mean, kAtol, kRtol);
    CUDA_OK(download(got, dRstd));
    VERIFY_CLOSE(got, rstd, kAtol, kRtol);
    CUDA_OK(download(got, dDinp));
    VERIFY_CLOSE(got, dinp, 1e-4, 1e-4);
    CUDA_OK(download(got, dDw));
    VERIFY_CLOSE(got, dweight, 1e-4, 1e-4);
    CUDA_OK(download(got, dDb));
    VERIFY_CLOSE(got, dbias, 1e-4, 1e-4);

    // Nullable parameter gradients: dinp accumulates a second time, dweight/dbias stay.
    cpu::layerNormBackward(dinp.data(), nullptr, nullptr, dout.data(), inp.data(), weight.data(), mean.data(),
                           rstd.data(), N, C);
    CUDA_OK(cuda::layerNormBackward(dDinp.data(), nullptr, nullptr, dDout.data(), dInp.data(), dW.data(),
                                    dMean.data(), dRstd.data(), N, C, m_stream));
    CUDA_OK(download(got, dDinp));
    VERIFY_CLOSE(got, dinp, 1e-4, 1e-4);
    CUDA_OK(download(got, dDw));
    VERIFY_CLOSE(got, dweight, 1e-4, 1e-4);
  }

  // RMSNorm (cuda_llama.cu) against ms::cpu: out, rstd, and the gradients accumulated onto non-zero values
  // (the weight gradient's two-stage reduction over one slice and many, a short last one); a second backward
  // without the weight gradient; and the same bits again on a second run (no atomics).
  void rmsNorm_data() {
    QTest::addColumn<int>("N");
    QTest::addColumn<int>("C");
    QTest::newRow("N1 C7") << 1 << 7;
    QTest::newRow("N3 C1") << 3 << 1;
    QTest::newRow("N37 C33") << 37 << 33;
    QTest::newRow("N64 C768") << 64 << 768;
    QTest::newRow("N9 C4099") << 9 << 4099;
    QTest::newRow("N4099 C33") << 4099 << 33;
    QTest::newRow("N777 C4096") << 777 << 4096;
  }

  void rmsNorm() {
    QFETCH(int, N);
    QFETCH(int, C);
    std::mt19937 rng(kSeed + 20);
    const Vec inp = randomVec(rng, size_t(N) * C, -2.0f, 3.0f);  // (N, C)
    const Vec weight = randomVec(rng, size_t(C), 0.5f, 1.5f);
    const Vec dout = randomVec(rng, inp.size());
    const Vec dinp0 = randomVec(rng, inp.size());
    const Vec dweight0 = randomVec(rng, size_t(C));
    const float eps = 1e-5f;
    Vec out(inp.size()), rstd(N), dinp = dinp0, dweight = dweight0;
    cpu::rmsNormForward(out.data(), rstd.data(), inp.data(), weight.data(), N, C, eps);
    cpu::rmsNormBackward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rstd.data(), N,
                         C);

    DBuf<float> dInp, dW, dOut, dRstd, dDout, dDinp, dDw;
    CUDA_OK(upload(dInp, inp));
    CUDA_OK(upload(dW, weight));
    CUDA_OK(upload(dOut, Vec(out.size(), 7.0f)));
    CUDA_OK(upload(dRstd, Vec(N, 7.0f)));
    CUDA_OK(upload(dDout, dout));
    CUDA_OK(upload(dDinp, dinp0));
    CUDA_OK(upload(dDw, dweight0));
    CUDA_OK(cuda::rmsNormForward(dOut.data(), dRstd.data(), dInp.data(), dW.data(), N, C, eps, m_stream));
    CUDA_OK(cuda::rmsNormBackward(dDinp.data(), dDw.data(), dDout.data(), dInp.data(), dW.data(),
                                  dRstd.data(), N, C, m_stream));
    Vec got;
    CUDA_OK(download(got, dOut));
    VERIFY_CLOSE(got, out, kAtol, kRtol);
    CUDA_OK(download(got, dRstd));
    VERIFY_CLOSE(got, rstd, kAtol, kRtol);
    CUDA_OK(download(got, dDinp));
    VERIFY_CLOSE(got, dinp, 1e-4, 1e-4);
    Vec gotDw;
    CUDA_OK(download(gotDw, dDw));
    VERIFY_CLOSE(gotDw, dweight, 1e-4, 1e-4);

    // Deterministic: the same call on the same inputs gives the same bits.
    CUDA_OK(upload(dDinp, dinp0));
    CUDA_OK(upload(dDw, dweight0));
    CUDA_OK(cuda::rmsNormBackward(dDinp.data(), dDw.data(), dDout.data(), dInp.data(), dW.data(),
                                  dRstd.data(), N, C, m_stream));
    Vec again;
    CUDA_OK(download(again, dDw));
    VERIFY_CLOSE(again, gotDw, 0.0, 0.0);
    CUDA_OK(download(again, dDinp));
    VERIFY_CLOSE(again, got, 0.0, 0.0);

    // No weight gradient: dinp accumulates a second time, dweight stays.
    cpu::rmsNormBackward(dinp.data(), nullptr, dout.data(), inp.data(), weight.data(), rstd.data(), N, C);
    CUDA_OK(cuda::rmsNormBackward(dDinp.data(), nullptr, dDout.data(), dInp.data(), dW.data(), dRstd.data(),
                                  N, C, m_stream));
    CUDA_OK(download(got, dDinp));
    VERIFY_CLOSE(got, dinp, 1e-4, 1e-4);
    CUDA_OK(download(got, dDw));
    VERIFY_CLOSE(got, gotDw, 0.0, 0.0);
  }

  // SwiGLU (cuda_llama.cu) against ms::cpu, the tails included (exp(-g) clamped as the CPU's vexp clamps it:
  // no NaN, the same ~0), out aliasing gate or up, the gradients accumulated onto non-zero values.
  void swiglu_data() {
    QTest::addColumn<qulonglong>("n");
    QTest::newRow("n1") << qulonglong(1);
    QTest::newRow("n1000") << qulonglong(1000);
    QTest::newRow("n2^20+3") << qulonglong((1u << 20) + 3);
    QTest::newRow("n2^24+5") << qulonglong((1u << 24) + 5);  // more than the grid-stride launch's threads
  }

  void swiglu() {
    QFETCH(qulonglong, n);
    std::mt19937 rng(kSeed + 21);
    Vec gate = randomVec(rng, n, -6.0f, 6.0f);
    if (n >= 8) {
      const float tails[] = {-1000.0f, -100.0f, -89.0f, -30.0f, 0.0f, 30.0f, 100.0f, 1000.0f};
      std::copy(std::begin(tails), std::end(tails), gate.begin());
    }
    const Vec up = randomVec(rng, n, -2.0f, 2.0f);
    const Vec dout = randomVec(rng, n);
    const Vec dgate0 = randomVec(rng, n), dup0 = randomVec(rng, n);
    Vec out(n), dgate = dgate0, dup = dup0;
    cpu::swigluForward(out.data(), gate.data(), up.data(), n);
    cpu::swigluBackward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n);

    DBuf<float> dGate, dUp, dOut, dDout, dDgate, dDup;
    CUDA_OK(upload(dGate, gate));
    CUDA_OK(upload(dUp, up));
    CUDA_OK(upload(dOut, Vec(n, 7.0f)));
    CUDA_OK(upload(dDout, dout));
    CUDA_OK(upload(dDgate, dgate0));
    CUDA_OK(upload(dDup, dup0));
    CUDA_OK(cuda::swigluForward(dOut.data(), dGate.data(), dUp.data(), n, m_stream));
    CUDA_OK(cuda::swigluBackward(dDgate.data(), dDup.data(), dDout.data(), dGate.data(), dUp.data(), n,
                                 m_stream));
    Vec got, gotOut;
    CUDA_OK(download(gotOut, dOut));
    VERIFY_CLOSE(gotOut, out, kAtol, kRtol);
    CUDA_OK(download(got, dDgate));
    for (size_t i = 0; i < got.size(); ++i)
      QVERIFY2(std::isfinite(got[i]), qPrintable(QStringLiteral("dgate at gate %1").arg(gate[i])));
    VERIFY_CLOSE(got, dgate, kAtol, kRtol);
    CUDA_OK(download(got, dDup));
    VERIFY_CLOSE(got, dup, kAtol, kRtol);
    // out aliasing gate, then up: the same bits as the separate output.
    CUDA_OK(cuda::swigluForward(dGate.data(), dGate.data(), dUp.data(), n, m_stream));
    CUDA_OK(download(got, dGate));
    VERIFY_CLOSE(got, gotOut, 0.0, 0.0);
    CUDA_OK(upload(dGate, gate));
    CUDA_OK(cuda::swigluForward(dUp.data(), dGate.data(), dUp.data(), n, m_stream));
    CUDA_OK(download(got, dUp));
    VERIFY_CLOSE(got, gotOut, 0.0, 0.0);
  }

  // RoPE with grouped-query heads (cuda_llama.cu) against ms::cpu: the pack (into a buffer of 7s) within
  // kRopeAtol, and its transpose OVERWRITING dq, dk, dv (they start at 7), dv's sums exact; MHA, GQA and MQA,
  // positions from 0 and past 4000 (the angles formed alike), Llama head sizes and the largest one allowed.
  void rope_data() {
    QTest::addColumn<int>("B");
    QTest::addColumn<int>("T");
    QTest::addColumn<int>("H");
    QTest::addColumn<int>("KV");
    QTest::addColumn<int>("hs");
    QTest::addColumn<float>("theta");
    QTest::addColumn<int>("posStart");
    const struct {
      int B, T, H, KV, hs;
      float theta;
      int posStart;
    } rows[] = {
        {1, 1, 1, 1, 2, 1e4f, 0},     {2, 5, 4, 2, 8, 1e4f, 3},     {2, 5, 4, 1, 8, 1e4f, 3},
        {3, 7, 3, 3, 10, 5e5f, 100},  {4, 64, 32, 8, 128, 5e5f, 0}, {2, 33, 8, 1, 64, 1e4f, 4000},
        {1, 1100, 4, 2, 96, 1e6f, 7}, {1, 3, 2, 2, 8192, 1e4f, 0},
    };
    for (const auto& r : rows)
      QTest::addRow("B%d T%d H%d KV%d hs%d theta %g pos %d", r.B, r.T, r.H, r.KV, r.hs, double(r.theta),
                    r.posStart)
          << r.B << r.T << r.H << r.KV << r.hs << r.theta << r.posStart;
  }

  void rope() {
    QFETCH(int, B);
    QFETCH(int, T);
    QFETCH(int, H);
    QFETCH(int, KV);
    QFETCH(int, hs);
    QFETCH(float, theta);
    QFETCH(int, posStart);
    const size_t nq = size_t(B) * T * H * hs, nkv = size_t(B) * T * KV * hs;
    std::mt19937 rng(kSeed + 22);
    const Vec q = randomVec(rng, nq), k = randomVec(rng, nkv), v = randomVec(rng, nkv);
    const Vec dqkv = randomVec(rng, 3 * nq);
    Vec qkv(3 * nq), dq(nq), dk(nkv), dv(nkv);
    cpu::ropePackQkv(qkv.data(), q.data(), k.data(), v.data(), B, T, H, KV, hs, theta, posStart);
    cpu::ropeUnpackQkv(dq.data(), dk.data(), dv.data(), dqkv.data(), B, T, H, KV, hs, theta, posStart);

    DBuf<float> dQ, dK, dV, dQkv, dDqkv, dDq, dDk, dDv;
    CUDA_OK(upload(dQ, q));
    CUDA_OK(upload(dK, k));
    CUDA_OK(upload(dV, v));
    CUDA_OK(upload(dQkv, Vec(3 * nq, 7.0f)));
    CUDA_OK(upload(dDqkv, dqkv));
    CUDA_OK(upload(dDq, Vec(nq, 7.0f)));
    CUDA_OK(upload(dDk, Vec(nkv, 7.0f)));
    CUDA_OK(upload(dDv, Vec(nkv, 7.0f)));
    CUDA_OK(cuda::ropePackQkv(dQkv.data(), dQ.data(), dK.data(), dV.data(), B, T, H, KV, hs, theta, posStart,
                              m_stream));
    CUDA_OK(cuda::ropeUnpackQkv(dDq.data(), dDk.data(), dDv.data(), dDqkv.data(), B, T, H, KV, hs, theta,
                                posStart, m_stream));
    Vec got;
    CUDA_OK(download(got, dQkv));
    VERIFY_CLOSE(got, qkv, kRopeAtol, kRopeRtol);
    CUDA_OK(download(got, dDq));
    VERIFY_CLOSE(got, dq, kRopeAtol, kRopeRtol);
    CUDA_OK(download(got, dDk));
    VERIFY_CLOSE(got, dk, kRopeAtol * (H / KV), kRopeRtol);
    CUDA_OK(download(got, dDv));
    VERIFY_CLOSE(got, dv, 0.0, 0.0);
  }

  // Shapes RoPE cannot compute fail naming the op and the problem, before any launch (null pointers).
  void ropeRejects() {
    const struct {
      int H, KV, hs;
      const char* problem;
    } bad[] = {
        {3, 2, 8, "key/value heads"}, {4, 0, 8, "key/value heads"}, {4, 2, 5, "even"}, {2, 2, 8194, "8192"}};
    for (const auto& b : bad) {
      const ms::Status pack =
          cuda::ropePackQkv(nullptr, nullptr, nullptr, nullptr, 1, 2, b.H, b.KV, b.hs, 1e4f, 0, m_stream);
      QVERIFY2(!pack.isOk() && pack.message().find("ropePackQkv") != std::string::npos &&
                   pack.message().find(b.problem) != std::string::npos,
               pack.message().c_str());
      const ms::Status unpack =
          cuda::ropeUnpackQkv(nullptr, nullptr, nullptr, nullptr, 1, 2, b.H, b.KV, b.hs, 1e4f, 0, m_stream);
      QVERIFY2(!unpack.isOk() && unpack.message().find("ropeUnpackQkv") != std::string::npos &&
                   unpack.message().find(b.problem) != std::string::npos,
               unpack.message().c_str());
    }
    CUDA_OK(cuda::synchronize(m_stream));  // nothing was launched: no error left behind
  }

  // The MoE row ops (cuda_moe.cu) against ms::cpu: gatherRows from R source rows (R < n: repeats) with and
  // without a scale, one fp32 product an element: the same bits; scatterAddRows into distinct rows of R onto
  // non-zero values, twice (unscaled one fp32 sum an element: the same bits; scaled, a fused multiply-add on
  // either side or not); rowDots within a few ulps of sum |a b| (the CPU's order of sums, fused or not
  // alike), OVERWRITING a buffer of 7s, the same bits on a second run. C on both sides of 32, wide rows, and
  // more rows than the row loop's grid (65535 blocks).
  void moeRows_data() {
    QTest::addColumn<int>("n");
    QTest::addColumn<int>("C");
    QTest::addColumn<int>("R");
    const int rows[][3] = {{1, 1, 1},        {7, 33, 9},     {33, 31, 40},  {33, 97, 40},
                           {4099, 33, 4099}, {64, 4099, 64}, {3, 65537, 3}, {70000, 8, 70001}};
    for (const auto& r : rows) QTest::addRow("n%d C%d R%d", r[0], r[1], r[2]) << r[0] << r[1] << r[2];
  }

  void moeRows() {
    QFETCH(int, n);
    QFETCH(int, C);
    QFETCH(int, R);
    std::mt19937 rng(kSeed + 30);
    const Vec src = randomVec(rng, size_t(R) * C);   // (R, C): gathered from, scattered into, dotted with
    const Vec rows = randomVec(rng, size_t(n) * C);  // (n, C)
    const Vec scale = randomVec(rng, size_t(n), -2.0f, 2.0f);
    Ints gatherIdx = randomTokens(rng, size_t(n), std::min(R, std::max(1, n / 2)));  // repeats
    const Ints scatterIdx = distinctRows(rng, n, R);

    DBuf<float> dSrc, dRows, dScale, dDst, dOut;
    DBuf<int32_t> dGatherIdx, dScatterIdx;
    CUDA_OK(upload(dSrc, src));
    CUDA_OK(upload(dRows, rows));
    CUDA_OK(upload(dScale, scale));
    CUDA_OK(upload(dGatherIdx, gatherIdx));
    CUDA_OK(upload(dScatterIdx, scatterIdx));
    Vec got;
    for (const bool scaled : {true, false}) {
      const char* what = scaled ? "scaled" : "unscaled";
      const float* k = scaled ? scale.data() : nullptr;
      const float* dK = scaled ? dScale.data() : nullptr;
      Vec gathered(rows.size());
      cpu::gatherRows(gathered.data(), src.data(), gatherIdx.data(), k, n, C);
      CUDA_OK(upload(dDst, Vec(rows.size(), 7.0f)));
      CUDA_OK(cuda::gatherRows(dDst.data(), dSrc.data(), dGatherIdx.data(), dK, n, C, m_stream));
      CUDA_OK(download(got, dDst));
      QVERIFY2(mismatch(got, gathered, 0.0, 0.0).isEmpty(),
               qPrintable(QStringLiteral("gatherRows %1: ").arg(what) + mismatch(got, gathered, 0.0, 0.0)));

      Vec sum = src;
      for (int rep = 0; rep < 2; ++rep)
        cpu::scatterAddRows(sum.data(), rows.data(), scatterIdx.data(), k, n, C);
      CUDA_OK(upload(dDst, src));
      for (int rep = 0; rep < 2; ++rep)
        CUDA_OK(cuda::scatterAddRows(dDst.data(), dRows.data(), dScatterIdx.data(), dK, n, C, m_stream));
      CUDA_OK(download(got, dDst));
      const double tol = scaled ? 1e-6 : 0.0;
      QVERIFY2(mismatch(got, sum, tol, tol).isEmpty(),
               qPrintable(QStringLiteral("scatterAddRows %1: ").arg(what) + mismatch(got, sum, tol, tol)));
    }

    Vec dots(static_cast<size_t>(n));
    cpu::rowDots(dots.data(), src.data(), gatherIdx.data(), rows.data(), n, C);
    CUDA_OK(upload(dOut, Vec(size_t(n), 7.0f)));
    CUDA_OK(cuda::rowDots(dOut.data(), dSrc.data(), dGatherIdx.data(), dRows.data(), n, C, m_stream));
    CUDA_OK(download(got, dOut));
    for (int r = 0; r < n; ++r) {
      double scaleSum = 0.0;
      for (int c = 0; c < C; ++c)
        scaleSum += std::fabs(double(src[size_t(gatherIdx[r]) * C + c]) * double(rows[size_t(r) * C + c]));
      const double err = std::fabs(double(got[r]) - double(dots[r]));
      QVERIFY2(err <= 1e-6 * scaleSum,
               qPrintable(QStringLiteral("rowDots row %1: got %2, CPU %3 (sum |ab| %4)")
                              .arg(r)
                              .arg(double(got[r]), 0, 'g', 9)
                              .arg(double(dots[r]), 0, 'g', 9)
                              .arg(scaleSum, 0, 'g', 3)));
    }
    // Deterministic and overwritten: a second call onto the first one's results gives the same bits.
    CUDA_OK(cuda::rowDots(dOut.data(), dSrc.data(), dGatherIdx.data(), dRows.data(), n, C, m_stream));
    Vec again;
    CUDA_OK(download(again, dOut));
    VERIFY_CLOSE(again, got, 0.0, 0.0);
  }

  // n = 0 launches nothing (null pointers are fine); n < 0 or C < 1 fails naming the op and the problem,
  // whatever n is, before any launch.
  void moeRejects() {
    CUDA_OK(cuda::gatherRows(nullptr, nullptr, nullptr, nullptr, 0, 5, m_stream));
    CUDA_OK(cuda::scatterAddRows(nullptr, nullptr, nullptr, nullptr, 0, 5, m_stream));
    CUDA_OK(cuda::rowDots(nullptr, nullptr, nullptr, nullptr, 0, 5, m_stream));
    const struct {
      int n, C;
      const char* problem;
    } bad[] = {{-1, 4, "row count"}, {3, 0, "row length"}, {0, 0, "row length"}, {2, -5, "row length"}};
    for (const auto& b : bad) {
      const ms::Status statuses[] = {
          cuda::gatherRows(nullptr, nullptr, nullptr, nullptr, b.n, b.C, m_stream),
          cuda::scatterAddRows(nullptr, nullptr, nullptr, nullptr, b.n, b.C, m_stream),
          cuda::rowDots(nullptr, nullptr, nullptr, nullptr, b.n, b.C, m_stream),
      };
      const char* ops[] = {"gatherRows", "scatterAddRows", "rowDots"};
      for (int i = 0; i < 3; ++i)
        QVERIFY2(!statuses[i].isOk() && statuses[i].message().find(ops[i]) != std::string::npos &&
                     statuses[i].message().find(b.problem) != std::string::npos,
                 statuses[i].message().c_str());
    }
    CUDA_OK(cuda::synchronize(m_stream));  // nothing was launched: no error left behind
  }

  void pointwise_data() {
    QTest::addColumn<qulonglong>("n");
    QTest::newRow("n1") << qulonglong(1);
    QTest::newRow("n1000") << qulonglong(1000);
    QTest::newRow("n2^20+3") << qulonglong((1u << 20) + 3);
    // More elements than the grid-stride launch has threads (65535 blocks of 256).
    QTest::newRow("n2^24+5") << qulonglong((1u << 24) + 5);
  }

  void pointwise() {
    QFETCH(qulonglong, n);
    std::mt19937 rng(kSeed + 2);
    const Vec x = randomVec(rng, n, -4.0f, 4.0f);
    const Vec y = randomVec(rng, n);
    const Vec g0 = randomVec(rng, n);  // starting gradient for the "+=" ops
    DBuf<float> dX, dY, dOut, dG;
    CUDA_OK(upload(dX, x));
    CUDA_OK(upload(dY, y));
    CUDA_OK(upload(dOut, Vec(n)));
    Vec ref(n), got;

    using Fwd = void (*)(float*, const float*, size_t);
    using CudaFwd = ms::Status (*)(float*, const float*, size_t, cudaStream_t);
    using Bwd = void (*)(float*, const float*, const float*, size_t);
    using CudaBwd = ms::Status (*)(float*, const float*, const float*, size_t, cudaStream_t);
    const struct {
      const char* name;
      Fwd fwd;
      CudaFwd cudaFwd;
      Bwd bwd;
      CudaBwd cudaBwd;
      bool bwdUsesOutput;
    } ops[] = {
        {"gelu", cpu::geluForward, cuda::geluForward, cpu::geluBackward, cuda::geluBackward, false},
        {"relu", cpu::reluForward, cuda::reluForward, cpu::reluBackward, cuda::reluBackward, false},
        {"tanh", cpu::tanhForward, cuda::tanhForward, cpu::tanhBackward, cuda::tanhBackward, true},
    };
    for (const auto& op : ops) {
      op.fwd(ref.data(), x.data(), n);
      CUDA_OK(op.cudaFwd(dOut.data(), dX.data(), n, m_stream));
      CUDA_OK(download(got, dOut));
      QVERIFY2(mismatch(got, ref, kAtol, kRtol).isEmpty(), op.name);
      Vec gref = g0;
      op.bwd(gref.data(), y.data(), op.bwdUsesOutput ? ref.data() : x.data(), n);
      CUDA_OK(upload(dG, g0));
      CUDA_OK(op.cudaBwd(dG.data(), dY.data(), op.bwdUsesOutput ? dOut.data() : dX.data(), n, m_stream));
      CUDA_OK(download(got, dG));
      const QString msg = mismatch(got, gref, kAtol, kRtol);
      QVERIFY2(msg.isEmpty(), qPrintable(QStringLiteral("%1 backward: %2").arg(op.name, msg)));
    }

    // add with out aliasing a, then accumulate, then scale.
    Vec r = x;
    cpu::add(r.data(), r.data(), y.data(), n);
    cpu::accumulate(r.data(), y.data(), n);
    cpu::scale(r.data(), -0.37f, n);
    CUDA_OK(upload(dOut, x));
    CUDA_OK(cuda::add(dOut.data(), dOut.data(), dY.data(), n, m_stream));
    CUDA_OK(cuda::accumulate(dOut.data(), dY.data(), n, m_stream));
    CUDA_OK(cuda::scale(dOut.data(), -0.37f, n, m_stream));
    CUDA_OK(download(got, dOut));
    VERIFY_CLOSE(got, r, 0.0, 0.0);  // the same float operations in the same order: exact
  }

  // GELU backward far into the negative tail, where exp(-2u) overflows in fp32 (x below about -10): the
  // derivative is ~0 there, never NaN (inf * 0), as on the CPU. The random inputs above stay in [-4, 4].
  void geluTail() {
    const Vec x = {-1000.0f, -100.0f, -20.0f, -10.5f, -10.0f, -9.0f,
                   -3.0f,    0.0f,    3.0f,   10.0f,  100.0f, 1000.0f};
    const size_t n = x.size();
    const Vec dy(n, 1.0f), g0(n, 0.5f);
    DBuf<float> dX, dY, dOut, dG;
    CUDA_OK(upload(dX, x));
    CUDA_OK(upload(dY, dy));
    CUDA_OK(upload(dOut, Vec(n)));
    CUDA_OK(upload(dG, g0));
    Vec ref(n), gref = g0, got;
    cpu::geluForward(ref.data(), x.data(), n);
    cpu::geluBackward(gref.data(), dy.data(), x.data(), n);
    CUDA_OK(cuda::geluForward(dOut.data(), dX.data(), n, m_stream));
    CUDA_OK(download(got, dOut));
    VERIFY_CLOSE(got, ref, kAtol, kRtol);
    CUDA_OK(cuda::geluBackward(dG.data(), dY.data(), dX.data(), n, m_stream));
    CUDA_OK(download(got, dG));
    for (size_t i = 0; i < n; ++i) QVERIFY2(std::isfinite(got[i]), qPrintable(QString("x = %1").arg(x[i])));
    VERIFY_CLOSE(got, gref, kAtol, kRtol);
  }

  void attention_data() {
    QTest::addColumn<int>("B");
    QTest::addColumn<int>("T");
    QTest::addColumn<int>("C");
    QTest::addColumn<int>("H");
    QTest::addColumn<bool>("causal");
    QTest::addColumn<bool>("bf16");
    for (bool bf16 : {false, true}) {
      for (bool causal : {true, false}) {
        const char* m = causal ? "causal" : "full";
        const char* p = bf16 ? "bf16 " : "";
        QTest::addRow("%s%s B1 T1 C6 H3", p, m) << 1 << 1 << 6 << 3 << causal << bf16;
        QTest::addRow("%s%s B2 T37 C48 H3", p, m) << 2 << 37 << 48 << 3 << causal << bf16;
        QTest::addRow("%s%s B3 T17 C21 H3", p, m) << 3 << 17 << 21 << 3 << causal << bf16;  // head size 7
        QTest::addRow("%s%s B1 T64 C64 H1", p, m) << 1 << 64 << 64 << 1 << causal << bf16;
        QTest::addRow("%s%s B2 T129 C128 H4", p, m) << 2 << 129 << 128 << 4 << causal << bf16;
      }
    }
  }

  void attention() {
    QFETCH(int, B);
    QFETCH(int, T);
    QFETCH(int, C);
    QFETCH(int, H);
    QFETCH(bool, causal);
    QFETCH(bool, bf16);
    GemmModeScope scope(bf16 ? cuda::GemmMode::Bf16 : cuda::GemmMode::Fp32);
    // Bf16: the saved probabilities are fp32 softmax outputs of bf16 scores (exact products, fp32 sums):
    // the GEMM tolerance; out and dqkv also see the GPU's rounding of the probabilities (see above).
    const double atol = bf16 ? kBf16AttentionAtol : kGemmAtol;
    const double rtol = bf16 ? kBf16AttentionRtol : kGemmRtol;
    std::mt19937 rng(kSeed + 3);
    const Vec qkv = randomVec(rng, size_t(B) * T * 3 * C, -2.0f, 2.0f);  // (B, T, 3C)
    const Vec dout = randomVec(rng, size_t(B) * T * C);                  // (B, T, C)
    const Vec dqkv0 = randomVec(rng, qkv.size());
    const size_t attSize = size_t(B) * H * T * T;  // (B, H, T, T)
    const Vec qkvG = bf16 ? roundBf16Host(qkv) : qkv;
    const Vec doutG = bf16 ? roundBf16Host(dout) : dout;
    Vec out(dout.size()), att(attSize), scratch(attSize), dqkv = dqkv0;
    cpu::attentionForward(out.data(), att.data(), qkvG.data(), B, T, C, H, causal);
    cpu::attentionBackward(dqkv.data(), scratch.data(), doutG.data(), qkvG.data(), att.data(), B, T, C, H,
                           causal);

    DBuf<float> dQkv, dOut, dAtt, dScratch, dDout, dDqkv;
    CUDA_OK(upload(dQkv, qkv));
    CUDA_OK(upload(dOut, Vec(out.size(), 5.0f)));
    CUDA_OK(upload(dAtt, Vec(attSize, 5.0f)));  // masked entries must come back 0
    CUDA_OK(upload(dScratch, Vec(attSize, 5.0f)));
    CUDA_OK(upload(dDout, dout));
    CUDA_OK(upload(dDqkv, dqkv0));
    CUDA_OK(cuda::attentionForward(dOut.data(), dAtt.data(), dQkv.data(), B, T, C, H, causal, m_stream));
    CUDA_OK(cuda::attentionBackward(dDqkv.data(), dScratch.data(), dDout.data(), dQkv.data(), dAtt.data(), B,
                                    T, C, H, causal, m_stream));
    Vec got;
    CUDA_OK(download(got, dAtt));
    VERIFY_CLOSE(got, att, kGemmAtol, kGemmRtol);
    if (causal)
      for (int bh = 0; bh < B * H; bh++)
        for (int i = 0; i < T; i++)
          for (int j = i + 1; j < T; j++) QCOMPARE(got[(size_t(bh) * T + i) * T + j], 0.0f);
    CUDA_OK(download(got, dOut));
    VERIFY_CLOSE(got, out, atol, rtol);
    CUDA_OK(download(got, dDqkv));
    VERIFY_CLOSE(got, dqkv, atol, rtol);
  }

  // The fused attention through its plain entry points against the CPU's materialised attention (see
  // flashAgainstCpu). Odd T (inside one 32-key tile, over several, and 8-row blocks that end past T), head
  // sizes 2 to 128, causal and bidirectional, fp32 and bf16 operands; in bf16 the head sizes 16, 32, 64, 96
  // and 128 take the tensor-core kernels (unless MESHSTUDIO_FLASH_TC=0), the others the scalar one.
  void flashAttention_data() {
    QTest::addColumn<int>("B");
    QTest::addColumn<int>("T");
    QTest::addColumn<int>("C");
    QTest::addColumn<int>("H");
    QTest::addColumn<bool>("causal");
    QTest::addColumn<bool>("bf16");
    const int shapes[][4] = {{1, 1, 6, 3},    {2, 5, 48, 3},    {3, 17, 21, 3},
                             {2, 37, 48, 3},  {1, 64, 64, 1},   {2, 67, 192, 3},
                             {1, 67, 384, 3}, {2, 129, 128, 4}, {1, 200, 96, 1}};
    for (const bool bf16 : {false, true})
      for (const bool causal : {true, false})
        for (const auto& sh : shapes)
          QTest::addRow("%s%s B%d T%d C%d H%d", bf16 ? "bf16 " : "", causal ? "causal" : "full", sh[0], sh[1],
                        sh[2], sh[3])
              << sh[0] << sh[1] << sh[2] << sh[3] << causal << bf16;
  }

  void flashAttention() {
    QFETCH(int, B);
    QFETCH(int, T);
    QFETCH(int, C);
    QFETCH(int, H);
    QFETCH(bool, causal);
    QFETCH(bool, bf16);
    flashAgainstCpu(B, T, C, H, causal, bf16, std::nullopt);
  }

  // Each kernel named explicitly, in bf16 mode, against the same CPU reference: the tensor-core ones
  // (mma.sync and wmma; head sizes 16 to 128; T of one row, inside one 64-row tile, over several with a
  // partial last one, and exact multiples; several (batch, head) pairs) and the scalar one on the same
  // shapes.
  void flashAttentionKernels_data() {
    QTest::addColumn<int>("B");
    QTest::addColumn<int>("T");
    QTest::addColumn<int>("C");
    QTest::addColumn<int>("H");
    QTest::addColumn<bool>("causal");
    QTest::addColumn<int>("kernel");  // cuda::FlashAttentionKernel
    const int shapes[][4] = {{2, 1, 128, 2},   {2, 37, 192, 3}, {1, 100, 256, 2}, {2, 257, 128, 2},
                             {1, 257, 256, 2}, {3, 65, 96, 3},  {1, 130, 192, 2}, {2, 64, 64, 4},
                             {1, 128, 384, 3}, {2, 17, 256, 2}, {1, 31, 32, 2},   {2, 95, 64, 1}};
    const std::pair<cuda::FlashAttentionKernel, const char*> kernels[] = {
        {cuda::FlashAttentionKernel::TensorCore, "tc"},
        {cuda::FlashAttentionKernel::TensorCoreWmma, "wmma"},
        {cuda::FlashAttentionKernel::Scalar, "scalar"}};
    for (const auto& [kernel, name] : kernels)
      for (const bool causal : {true, false})
        for (const auto& sh : shapes)
          QTest::addRow("%s %s B%d T%d C%d H%d", name, causal ? "causal" : "full", sh[0], sh[1], sh[2], sh[3])
              << sh[0] << sh[1] << sh[2] << sh[3] << causal << int(kernel);
  }

  void flashAttentionKernels() {
    QFETCH(int, B);
    QFETCH(int, T);
    QFETCH(int, C);
    QFETCH(int, H);
    QFETCH(bool, causal);
    QFETCH(int, kernel);
    flashAgainstCpu(B, T, C, H, causal, true, static_cast<cuda::FlashAttentionKernel>(kernel));
  }

  // The tensor-core kernels (mma.sync and wmma) against the scalar ones (all bf16) on the GPT-2 124M
  // attention with the batch cut to 2 (T 1024, C 768, H 12, causal), from the same non-zero dqkv; then the
  // tensor-core backward run a second time must give the same bits (no atomics). Tolerances: both multiply
  // the same bf16 operands and sum in fp32, so the scores agree to about 1e-6 relative and the log-sum-exp
  // (formed from unrounded probabilities) to the fp32 GEMM tolerance. out and dqkv differ mainly because each
  // kernel rounds its probabilities to bf16 relative to a different running maximum (32-key tiles against
  // 64-key ones, then rescaled) and because a probability that moves by 1e-6 can cross a bf16 rounding
  // boundary: every term of P V, P^T dO and dS K, dS^T Q can differ by 2^-8 of itself, the errors of distinct
  // terms independent. Summed over a row's terms (weights adding to 1, v and dout in [-2, 2] and [-1, 1])
  // that is at most 2^-8 * 2 = 8e-3 and in practice far less; the bf16 attention tolerance holds with room,
  // and a wrong mask, a missing rescale or a lost tile moves outputs by O(0.1) or more.
  void flashAttentionTensorCoresMatchScalar() {
    const int B = 2, T = 1024, C = 768, H = 12;
    const bool causal = true;
    GemmModeScope scope(cuda::GemmMode::Bf16);
    std::mt19937 rng(kSeed + 12);
    const Vec qkv = randomVec(rng, size_t(B) * T * 3 * C, -2.0f, 2.0f);  // (B, T, 3C)
    const Vec dout = randomVec(rng, size_t(B) * T * C);                  // (B, T, C)
    const Vec dqkv0 = randomVec(rng, qkv.size());
    const size_t lseSize = size_t(B) * H * T;  // (B, H, T)
    DBuf<float> dQkv, dDout, dScratch;
    CUDA_OK(upload(dQkv, qkv));
    CUDA_OK(upload(dDout, dout));
    CUDA_OK(upload(dScratch, Vec(lseSize, 5.0f)));
    const cuda::FlashAttentionKernel kernels[] = {cuda::FlashAttentionKernel::Scalar,
                                                  cuda::FlashAttentionKernel::TensorCore,
                                                  cuda::FlashAttentionKernel::TensorCoreWmma};
    Vec out[3], lse[3], dqkv[3];
    for (const int tc : {0, 1, 2}) {
      const cuda::FlashAttentionKernel kernel = kernels[tc];
      DBuf<float> dOut, dLse, dDqkv;
      CUDA_OK(upload(dOut, Vec(dout.size(), 5.0f)));
      CUDA_OK(upload(dLse, Vec(lseSize, 5.0f)));
      CUDA_OK(upload(dDqkv, dqkv0));
      CUDA_OK(cuda::flashAttentionForwardWith(kernel, dOut.data(), dLse.data(), dQkv.data(), B, T, C, H,
                                              causal, m_stream));
      CUDA_OK(cuda::flashAttentionBackwardWith(kernel, dDqkv.data(), dScratch.data(), dDout.data(),
                                               dQkv.data(), dOut.data(), dLse.data(), B, T, C, H, causal,
                                               m_stream));
      CUDA_OK(download(out[tc], dOut));
      CUDA_OK(download(lse[tc], dLse));
      CUDA_OK(download(dqkv[tc], dDqkv));
      if (tc) {  // determinism: the same backward again from the same start
        CUDA_OK(cuda::copyToDevice(dDqkv.data(), dqkv0.data(), dDqkv.bytes(), m_stream));
        CUDA_OK(cuda::flashAttentionBackwardWith(kernel, dDqkv.data(), dScratch.data(), dDout.data(),
                                                 dQkv.data(), dOut.data(), dLse.data(), B, T, C, H, causal,
                                                 m_stream));
        Vec again;
        CUDA_OK(download(again, dDqkv));
        QVERIFY(again.size() == dqkv[tc].size());
        QVERIFY2(std::memcmp(again.data(), dqkv[tc].data(), again.size() * sizeof(float)) == 0,
                 "the tensor-core backward is not bitwise reproducible");
      }
    }
    for (const int tc : {1, 2}) {
      VERIFY_CLOSE(lse[tc], lse[0], kGemmAtol, kGemmRtol);
      VERIFY_CLOSE(out[tc], out[0], kBf16AttentionAtol, kBf16AttentionRtol);
      VERIFY_CLOSE(dqkv[tc], dqkv[0], kBf16AttentionAtol, kBf16AttentionRtol);
    }
  }

  // MESHSTUDIO_FLASH_TC: unset or 1 allow the tensor-core kernels, 0 forbids them, anything else is an error
  // that names the variable.
  void flashTensorCoreSwitch() {
    const ms::Expected<bool> unset = cuda::parseFlashTensorCoreSwitch(nullptr);
    QVERIFY(unset.isOk() && *unset);
    const ms::Expected<bool> on = cuda::parseFlashTensorCoreSwitch("1");
    QVERIFY(on.isOk() && *on);
    const ms::Expected<bool> off = cuda::parseFlashTensorCoreSwitch("0");
    QVERIFY(off.isOk() && !*off);
    for (const char* bad : {"", "yes", "01", "true", "1 "}) {
      const ms::Expected<bool> e = cuda::parseFlashTensorCoreSwitch(bad);
      QVERIFY2(!e.isOk(), bad);
      QVERIFY2(e.message().find("MESHSTUDIO_FLASH_TC") != std::string::npos, e.message().c_str());
    }
  }

  // The tensor-core kernels named where they do not apply: errors that say why, nothing launched.
  void flashAttentionTensorCoreRejects() {
    const auto tc = cuda::FlashAttentionKernel::TensorCore;
    const ms::Status odd =
        cuda::flashAttentionForwardWith(tc, nullptr, nullptr, nullptr, 1, 4, 21, 3, true, m_stream);  // hs 7
    QVERIFY2(!odd.isOk() && odd.message().find("head size 7") != std::string::npos, odd.message().c_str());
    DBuf<float> dBuf;
    CUDA_OK(upload(dBuf, Vec(64, 0.0f)));
    const ms::Status unaligned =
        cuda::flashAttentionBackwardWith(tc, dBuf.data() + 1, dBuf.data(), dBuf.data(), dBuf.data(),
                                         dBuf.data(), dBuf.data(), 1, 1, 16, 1, true, m_stream);
    QVERIFY2(!unaligned.isOk() && unaligned.message().find("aligned") != std::string::npos,
             unaligned.message().c_str());
  }

  // Head sizes above the fused kernel's limit and shapes that do not split into heads are errors that name
  // the op.
  void flashAttentionRejects() {
    const ms::Status big = cuda::flashAttentionForward(
        nullptr, nullptr, nullptr, 1, 4, 3 * (cuda::kFlashAttentionMaxHeadSize + 1), 3, true, m_stream);
    QVERIFY2(!big.isOk() && big.message().find("head size") != std::string::npos, big.message().c_str());
    const ms::Status odd = cuda::flashAttentionBackward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                        1, 4, 7, 3, true, m_stream);
    QVERIFY2(!odd.isOk() && odd.message().find("flashAttentionBackward") != std::string::npos,
             odd.message().c_str());
  }

  // Ring attention's block ops (context parallelism, cuda_ring_attention.cu) against ms::cpu's on every case
  // of ringCases, causal and bidirectional, in fp32 (see ringAgainstCpu); some cases again in tf32 (computed
  // in fp32, so against the unrounded reference), bf16 (q, k, v, dout rounded on both sides) and bf16 with a
  // bf16 out read by the backward; and a few through the CUDA backend's overrides. Tolerances: kRingAtol /
  // kRingRtol for out and lse (1e-5 absolute plus 1e-5 relative), ringGradAtol / kRingGradRtol for the
  // gradients (1e-5 of the buffer's largest magnitude plus 1e-5 relative).
  void attentionBlock_data() {
    QTest::addColumn<int>("index");  // into ringCases()
    QTest::addColumn<bool>("causal");
    QTest::addColumn<int>("mode");  // RingMode
    QTest::addColumn<bool>("viaBackend");
    const std::vector<RingCase>& cases = ringCases();
    auto add = [&](int index, bool causal, int mode, bool viaBackend) {
      const RingCase& c = cases[size_t(index)];
      QTest::addRow("%s%s %s %s: B%d Tq%d Tk%d hs%d H%d KV%d", viaBackend ? "backend " : "",
                    ringModeName(mode), causal ? "causal" : "full", c.name, c.B, c.Tq, c.Tk, c.hs, c.H, c.KV)
          << index << causal << mode << viaBackend;
    };
    for (int index = 0; index < int(cases.size()); ++index)
      for (const bool causal : {true, false}) add(index, causal, kRingFp32, false);
    for (const int index : {2, 5}) add(index, true, kRingTf32, false);
    for (const int index : {1, 4, 8, 9}) add(index, true, kRingBf16, false);
    for (const int index : {3, 6}) add(index, true, kRingBf16Out, false);
    add(1, true, kRingFp32, true);
    add(6, false, kRingFp32, true);
    add(8, true, kRingBf16Out, true);
  }

  void attentionBlock() {
    QFETCH(int, index);
    QFETCH(bool, causal);
    QFETCH(int, mode);
    QFETCH(bool, viaBackend);
    ringAgainstCpu(ringCases()[size_t(index)], causal, mode, viaBackend);
  }

  // Shapes the ring kernels cannot compute fail naming the op, before any launch (null pointers): a KV that
  // is not a positive divisor of H (checked first, also for an empty block, worded as the CPU backend's
  // checkKvHeads), a head above kRingAttentionMaxHeadSize, and a bf16 out outside the bf16 precision. Through
  // the CUDA backend the head counts throw DeviceFailure naming the op.
  void attentionBlockRejects() {
    const struct {
      int B, C, H, KV;
    } bad[] = {{1, 8, 2, 3}, {1, 12, 3, 2}, {1, 8, 2, 0}, {0, 8, 2, 3}, {1, 8, 0, 1}};
    for (const auto& b : bad) {
      const std::string problem = "the query heads (" + std::to_string(b.H) +
                                  ") must be a positive multiple of the key/value heads (" +
                                  std::to_string(b.KV) + ")";
      const ms::Status fwd = cuda::attentionBlockForward(nullptr, nullptr, nullptr, nullptr, b.B, 2, 2, b.C,
                                                         b.H, b.KV, {}, {}, true, true, m_stream);
      QVERIFY2(!fwd.isOk() && fwd.message().find("attentionBlockForward") != std::string::npos &&
                   fwd.message().find(problem) != std::string::npos,
               fwd.message().c_str());
      const ms::Status bwd =
          cuda::attentionBlockBackward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, b.B, 2,
                                       2, b.C, b.H, b.KV, {}, {}, true, m_stream);
      QVERIFY2(!bwd.isOk() && bwd.message().find("attentionBlockBackward") != std::string::npos &&
                   bwd.message().find(problem) != std::string::npos,
               bwd.message().c_str());
    }
    const int big = cuda::kRingAttentionMaxHeadSize + 1;
    const ms::Status head = cuda::attentionBlockForward(nullptr, nullptr, nullptr, nullptr, 1, 2, 2, 2 * big,
                                                        2, 1, {}, {}, false, true, m_stream);
    QVERIFY2(!head.isOk() && head.message().find("attentionBlockForward") != std::string::npos &&
                 head.message().find("head size " + std::to_string(big)) != std::string::npos,
             head.message().c_str());
    const ms::TensorIn bf16Out(reinterpret_cast<const ms::bfloat16*>(&big));  // never read
    const ms::Status out = cuda::attentionBlockBackward(nullptr, nullptr, nullptr, nullptr, nullptr, bf16Out,
                                                        nullptr, 1, 2, 2, 8, 2, 1, {}, {}, true, m_stream);
    QVERIFY2(!out.isOk() && out.message().find("attentionBlockBackward") != std::string::npos &&
                 out.message().find("bf16") != std::string::npos,
             out.message().c_str());
    CUDA_OK(cuda::synchronize(m_stream));  // nothing was launched: no error left behind

    ms::Backend* be = backend();
    QVERIFY(be != nullptr);
    const size_t bytes = 64 * sizeof(float);
    float* buf = static_cast<float*>(be->allocate(bytes));
    const std::string fwd = deviceFailureOf(
        [&] { be->attentionBlockForward(buf, buf, buf, buf, 1, 2, 2, 8, 2, 3, {}, {}, true, true); });
    const std::string bwd = deviceFailureOf([&] {
      be->attentionBlockBackward(buf, buf, buf, buf, buf, buf, buf, 1, 2, 2, 8, 2, 3, {}, {}, true);
    });
    be->deallocate(buf, bytes);
    const std::string problem = "the query heads (2) must be a positive multiple of the key/value heads (3)";
    QVERIFY2(fwd.find("attentionBlockForward") != std::string::npos && fwd.find(problem) != std::string::npos,
             fwd.empty() ? "attentionBlockForward threw no DeviceFailure" : fwd.c_str());
    QVERIFY2(
        bwd.find("attentionBlockBackward") != std::string::npos && bwd.find(problem) != std::string::npos,
        bwd.empty() ? "attentionBlockBackward threw no DeviceFailure" : bwd.c_str());
    be->synchronize();  // the backend goes on working
  }

  void embedding_data() {
    QTest::addColumn<int>("B");
    QTest::addColumn<int>("T");
    QTest::addColumn<int>("C");
    QTest::addColumn<int>("V");
    QTest::newRow("B1 T1 C7 V5") << 1 << 1 << 7 << 5;
    QTest::newRow("B2 T37 C33 V3 (repeats)") << 2 << 37 << 33 << 3;
    QTest::newRow("B4 T64 C768 V50257") << 4 << 64 << 768 << 50257;
  }

  void embedding() {
    QFETCH(int, B);
    QFETCH(int, T);
    QFETCH(int, C);
    QFETCH(int, V);
    const int maxT = T + 3;
    std::mt19937 rng(kSeed + 4);
    const Ints tokens = randomTokens(rng, size_t(B) * T, V);  // (B, T)
    const Vec wte = randomVec(rng, size_t(V) * C);            // (V, C)
    const Vec wpe = randomVec(rng, size_t(maxT) * C);         // (maxT, C)
    const Vec dout = randomVec(rng, size_t(B) * T * C);       // (B, T, C)
    const Vec dwte0 = randomVec(rng, wte.size());
    const Vec dwpe0 = randomVec(rng, wpe.size());
    Vec out(dout.size()), dwte = dwte0, dwpe = dwpe0;
    cpu::embeddingForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    cpu::embeddingBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);

    DBuf<int32_t> dTokens;
    DBuf<float> dWte, dWpe, dOut, dDout, dDwte, dDwpe;
    CUDA_OK(upload(dTokens, tokens));
    CUDA_OK(upload(dWte, wte));
    CUDA_OK(upload(dWpe, wpe));
    CUDA_OK(upload(dOut, Vec(out.size())));
    CUDA_OK(upload(dDout, dout));
    CUDA_OK(upload(dDwte, dwte0));
    CUDA_OK(upload(dDwpe, dwpe0));
    CUDA_OK(cuda::embeddingForward(dOut.data(), dTokens.data(), dWte.data(), dWpe.data(), B, T, C, m_stream));
    CUDA_OK(
        cuda::embeddingBackward(dDwte.data(), dDwpe.data(), dDout.data(), dTokens.data(), B, T, C, m_stream));
    Vec got;
    CUDA_OK(download(got, dOut));
    VERIFY_CLOSE(got, out, 0.0, 0.0);  // one addition: exact
    CUDA_OK(download(got, dDwte));
    VERIFY_CLOSE(got, dwte, kAtol, kRtol);
    CUDA_OK(download(got, dDwpe));
    VERIFY_CLOSE(got, dwpe, kAtol, kRtol);

    // Nullable dwte: only dwpe accumulates again.
    cpu::embeddingBackward(nullptr, dwpe.data(), dout.data(), tokens.data(), B, T, C);
    CUDA_OK(cuda::embeddingBackward(nullptr, dDwpe.data(), dDout.data(), dTokens.data(), B, T, C, m_stream));
    CUDA_OK(download(got, dDwpe));
    VERIFY_CLOSE(got, dwpe, kAtol, kRtol);
    CUDA_OK(download(got, dDwte));
    VERIFY_CLOSE(got, dwte, kAtol, kRtol);
  }

  void crossEntropy_data() {
    QTest::addColumn<int>("N");
    QTest::addColumn<int>("V");
    QTest::newRow("N1 V7") << 1 << 7;
    QTest::newRow("N64 V33") << 64 << 33;
    QTest::newRow("N37 V50257") << 37 << 50257;
    // float4 rows (V a multiple of 4): GPT-2's padded vocabulary, and a row shorter than a block.
    QTest::newRow("N37 V50304") << 37 << 50304;
    QTest::newRow("N9 V8") << 9 << 8;
  }

  void crossEntropy() {
    QFETCH(int, N);
    QFETCH(int, V);
    std::mt19937 rng(kSeed + 5);
    const Vec logits = randomVec(rng, size_t(N) * V, -8.0f, 8.0f);  // (N, V)
    Ints targets = randomTokens(rng, size_t(N), V);                 // (N)
    for (int n = 2; n < N; n += 5) targets[size_t(n)] = -1;         // ignored rows
    const float gradScale = 1.0f / float(N);
    Vec losses(N), dlogits(logits.size());
    cpu::softmaxCrossEntropy(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V, gradScale);

    DBuf<float> dLogits, dLosses, dDlogits;
    DBuf<int32_t> dTargets;
    CUDA_OK(upload(dLogits, logits));
    CUDA_OK(upload(dTargets, targets));
    CUDA_OK(upload(dLosses, Vec(N, 3.0f)));
    CUDA_OK(upload(dDlogits, Vec(logits.size(), 3.0f)));  // overwritten, ignored rows included
    Vec got;
    // Separate dlogits.
    CUDA_OK(cuda::softmaxCrossEntropy(dLosses.data(), dDlogits.data(), dLogits.data(), dTargets.data(), N, V,
                                      gradScale, m_stream));
    CUDA_OK(download(got, dLosses));
    VERIFY_CLOSE(got, losses, kAtol, kRtol);
    CUDA_OK(download(got, dDlogits));
    VERIFY_CLOSE(got, dlogits, 1e-6 * gradScale, kRtol);
    // No dlogits.
    CUDA_OK(upload(dLosses, Vec(N, 3.0f)));
    CUDA_OK(cuda::softmaxCrossEntropy(dLosses.data(), nullptr, dLogits.data(), dTargets.data(), N, V,
                                      gradScale, m_stream));
    CUDA_OK(download(got, dLosses));
    VERIFY_CLOSE(got, losses, kAtol, kRtol);
    // dlogits aliasing logits.
    CUDA_OK(cuda::softmaxCrossEntropy(dLosses.data(), dLogits.data(), dLogits.data(), dTargets.data(), N, V,
                                      gradScale, m_stream));
    CUDA_OK(download(got, dLosses));
    VERIFY_CLOSE(got, losses, kAtol, kRtol);
    CUDA_OK(download(got, dLogits));
    VERIFY_CLOSE(got, dlogits, 1e-6 * gradScale, kRtol);
  }

  void argmaxRows_data() {
    QTest::addColumn<int>("N");
    QTest::addColumn<int>("V");
    QTest::newRow("N1 V1") << 1 << 1;
    QTest::newRow("N1 V7") << 1 << 7;
    QTest::newRow("N5 V33") << 5 << 33;
    QTest::newRow("N37 V50257") << 37 << 50257;
    // float4 rows (V a multiple of 4): GPT-2's padded vocabulary, and a row shorter than a block.
    QTest::newRow("N37 V50304") << 37 << 50304;
    QTest::newRow("N9 V8") << 9 << 8;
  }

  void argmaxRows() {
    QFETCH(int, N);
    QFETCH(int, V);
    std::mt19937 rng(kSeed + 6);
    Vec x = randomVec(rng, size_t(N) * V);
    for (float& v : x) v = std::round(v * 4.0f);  // nine levels: ties everywhere, lowest index must win
    Ints ref(N);
    cpu::argmaxRows(ref.data(), x.data(), N, V);
    DBuf<float> dX;
    DBuf<int32_t> dOut;
    CUDA_OK(upload(dX, x));
    CUDA_OK(upload(dOut, Ints(N, -5)));
    CUDA_OK(cuda::argmaxRows(dOut.data(), dX.data(), N, V, m_stream));
    Ints got;
    CUDA_OK(download(got, dOut));
    QCOMPARE(got, ref);
  }

  void optimizers_data() {
    QTest::addColumn<qulonglong>("n");
    QTest::newRow("n1") << qulonglong(1);
    QTest::newRow("n1000003") << qulonglong(1000003);
  }

  void optimizers() {
    QFETCH(qulonglong, n);
    std::mt19937 rng(kSeed + 7);
    const Vec params0 = randomVec(rng, n);
    const Vec grads = randomVec(rng, n);
    const Vec m0 = randomVec(rng, n, -0.1f, 0.1f);
    const Vec v0 = randomVec(rng, n, 0.0f, 0.01f);
    DBuf<float> dP, dG, dM, dV;
    CUDA_OK(upload(dG, grads));
    Vec got;

    // AdamW, three steps from non-zero moments.
    Vec p = params0, m = m0, v = v0;
    CUDA_OK(upload(dP, params0));
    CUDA_OK(upload(dM, m0));
    CUDA_OK(upload(dV, v0));
    for (int t = 1; t <= 3; t++) {
      cpu::adamwUpdate(p.data(), grads.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t,
                       0.5f);
      CUDA_OK(cuda::adamwUpdate(dP.data(), dG.data(), dM.data(), dV.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                                0.1f, t, 0.5f, m_stream));
    }
    CUDA_OK(download(got, dP));
    VERIFY_CLOSE(got, p, 1e-6, 1e-5);
    CUDA_OK(download(got, dM));
    VERIFY_CLOSE(got, m, 1e-7, 1e-5);
    CUDA_OK(download(got, dV));
    VERIFY_CLOSE(got, v, 1e-9, 1e-5);

    // SGD: plain, momentum, Nesterov; two steps each (the first initialises the buffer).
    for (const auto& [momentum, nesterov] :
         {std::pair{0.0f, false}, std::pair{0.9f, false}, std::pair{0.9f, true}}) {
      Vec ps = params0, buf(n, 0.0f);
      CUDA_OK(upload(dP, params0));
      CUDA_OK(upload(dM, buf));
      for (int step = 0; step < 2; step++) {
        cpu::sgdUpdate(ps.data(), grads.data(), buf.data(), n, 0.1f, momentum, 0.01f, nesterov, step == 0,
                       0.5f);
        CUDA_OK(cuda::sgdUpdate(dP.data(), dG.data(), dM.data(), n, 0.1f, momentum, 0.01f, nesterov,
                                step == 0, 0.5f, m_stream));
      }
      CUDA_OK(download(got, dP));
      VERIFY_CLOSE(got, ps, 1e-6, 1e-5);
      CUDA_OK(download(got, dM));
      VERIFY_CLOSE(got, buf, 1e-6, 1e-5);
    }
  }

  void sumSquares_data() {
    QTest::addColumn<qulonglong>("n");
    QTest::newRow("n0") << qulonglong(0);
    QTest::newRow("n1") << qulonglong(1);
    QTest::newRow("n1000003") << qulonglong(1000003);
    QTest::newRow("n2^25+7") << qulonglong((1u << 25) + 7);
  }

  void sumSquares() {
    QFETCH(qulonglong, n);
    std::mt19937 rng(kSeed + 8);
    const Vec x = randomVec(rng, n, -3.0f, 3.0f);
    const double ref = cpu::sumSquares(x.data(), n);
    DBuf<float> dX;
    DBuf<double> dResult;
    CUDA_OK(upload(dX, x));
    CUDA_OK(upload(dResult, std::vector<double>{123.0}));  // overwritten, not accumulated
    CUDA_OK(cuda::sumSquares(dResult.data(), dX.data(), n, m_stream));
    std::vector<double> got;
    CUDA_OK(download(got, dResult));
    // Double sums in another order: far below float precision, not bitwise equal.
    QVERIFY2(std::fabs(got[0] - ref) <= 1e-10 * std::fabs(ref) + 1e-12,
             qPrintable(QStringLiteral("got %1, expected %2").arg(got[0], 0, 'g', 17).arg(ref, 0, 'g', 17)));
    // The accumulating form adds to what is there: a norm over several buffers.
    CUDA_OK(upload(dResult, std::vector<double>{123.0}));
    CUDA_OK(cuda::sumSquaresAccumulate(dResult.data(), dX.data(), n, m_stream));
    CUDA_OK(cuda::sumSquaresAccumulate(dResult.data(), dX.data(), n, m_stream));
    CUDA_OK(download(got, dResult));
    const double want = 123.0 + 2.0 * ref;
    QVERIFY2(std::fabs(got[0] - want) <= 1e-10 * std::fabs(want) + 1e-12,
             qPrintable(QStringLiteral("accumulated: got %1, expected %2")
                            .arg(got[0], 0, 'g', 17)
                            .arg(want, 0, 'g', 17)));
  }

  // The tensor-parallel pieces (kernels/cpu/tp_ops.cpp): bias rows, positions, the vocabulary-parallel
  // embedding and the three cross-entropy steps; the last row is larger than one grid-stride pass.
  void tpOps_data() {
    QTest::addColumn<int>("B");
    QTest::addColumn<int>("T");
    QTest::addColumn<int>("C");
    QTest::addColumn<int>("V");
    QTest::newRow("B1 T1 C7 V5") << 1 << 1 << 7 << 5;
    QTest::newRow("B3 T5 C33 V50") << 3 << 5 << 33 << 50;
    QTest::newRow("B4 T64 C768 V50257") << 4 << 64 << 768 << 50257;
    QTest::newRow("B20 T1000 C1000 V3 (2e7 elements)") << 20 << 1000 << 1000 << 3;
  }

  void tpOps() {
    QFETCH(int, B);
    QFETCH(int, T);
    QFETCH(int, C);
    QFETCH(int, V);
    const int N = B * T;
    const size_t nc = size_t(N) * C;
    std::mt19937 rng(kSeed + 9);
    const Vec x = randomVec(rng, nc);
    const Vec row = randomVec(rng, size_t(C));
    const Vec wpe = randomVec(rng, size_t(T) * C);
    const Ints tokens = randomTokens(rng, size_t(N), V);
    const int vs = V / 3, vc = std::max(1, V / 2);
    const Vec wte = randomVec(rng, size_t(vc) * C);
    const Vec dwte0 = randomVec(rng, wte.size());
    DBuf<float> dX, dRow, dWpe, dWte, dDwte, dOut;
    DBuf<int32_t> dTokens;
    CUDA_OK(upload(dX, x));
    CUDA_OK(upload(dRow, row));
    CUDA_OK(upload(dWpe, wpe));
    CUDA_OK(upload(dWte, wte));
    CUDA_OK(upload(dDwte, dwte0));
    CUDA_OK(upload(dTokens, tokens));
    CUDA_OK(upload(dOut, Vec(nc, 9.0f)));
    Vec ref = x, got;
    cpu::addRows(ref.data(), row.data(), size_t(N), C);
    CUDA_OK(cuda::addRows(dX.data(), dRow.data(), size_t(N), C, m_stream));
    CUDA_OK(download(got, dX));
    VERIFY_CLOSE(got, ref, 0.0, 0.0);  // one addition: exact
    cpu::addPositions(ref.data(), wpe.data(), B, T, C);
    CUDA_OK(cuda::addPositions(dX.data(), dWpe.data(), B, T, C, m_stream));
    CUDA_OK(download(got, dX));
    VERIFY_CLOSE(got, ref, 0.0, 0.0);
    Vec out(nc), dwte = dwte0;
    cpu::embeddingRangeForward(out.data(), tokens.data(), wte.data(), vs, vc, N, C);
    cpu::embeddingRangeBackward(dwte.data(), x.data(), tokens.data(), vs, vc, N, C);
    CUDA_OK(upload(dX, x));
    CUDA_OK(cuda::embeddingRangeForward(dOut.data(), dTokens.data(), dWte.data(), vs, vc, N, C, m_stream));
    CUDA_OK(cuda::embeddingRangeBackward(dDwte.data(), dX.data(), dTokens.data(), vs, vc, N, C, m_stream));
    CUDA_OK(download(got, dOut));
    VERIFY_CLOSE(got, out, 0.0, 0.0);
    CUDA_OK(download(got, dDwte));
    // Atomics: another summation order, whose rounding grows with the rows summed into one entry.
    VERIFY_CLOSE(got, dwte, kAtol + 1e-6 * N, kRtol);

    // Vocabulary-parallel cross-entropy over this rank's vl columns [vs, vs + vl); N rows of the same data.
    if (nc > (size_t(1) << 22)) return;  // the loss rows need no second pass over the largest case
    const int vl = std::max(1, V / 2);
    const Vec logits = randomVec(rng, size_t(N) * vl, -8.0f, 8.0f);
    Ints targets = randomTokens(rng, size_t(N), V);
    for (int n = 1; n < N; n += 4) targets[size_t(n)] = -1;
    Vec mx(N), sumExp(N), targetLogit(N), losses(N), dlogits(logits.size());
    cpu::rowMax(mx.data(), logits.data(), N, vl);
    cpu::crossEntropyPartials(sumExp.data(), targetLogit.data(), logits.data(), mx.data(), targets.data(), vs,
                              N, vl);
    cpu::crossEntropyFinish(losses.data(), dlogits.data(), logits.data(), mx.data(), sumExp.data(),
                            targetLogit.data(), targets.data(), vs, N, vl, 0.25f);
    DBuf<float> dLogits, dMx, dSum, dTarget, dLosses, dDlogits;
    DBuf<int32_t> dTargets;
    CUDA_OK(upload(dLogits, logits));
    CUDA_OK(upload(dTargets, targets));
    CUDA_OK(upload(dMx, Vec(N, 3.0f)));
    CUDA_OK(upload(dSum, Vec(N, 3.0f)));
    CUDA_OK(upload(dTarget, Vec(N, 3.0f)));
    CUDA_OK(upload(dLosses, Vec(N, 3.0f)));
    CUDA_OK(upload(dDlogits, Vec(logits.size(), 3.0f)));
    CUDA_OK(cuda::rowMax(dMx.data(), dLogits.data(), N, vl, m_stream));
    CUDA_OK(cuda::crossEntropyPartials(dSum.data(), dTarget.data(), dLogits.data(), dMx.data(),
                                       dTargets.data(), vs, N, vl, m_stream));
    CUDA_OK(cuda::crossEntropyFinish(dLosses.data(), dDlogits.data(), dLogits.data(), dMx.data(), dSum.data(),
                                     dTarget.data(), dTargets.data(), vs, N, vl, 0.25f, m_stream));
    CUDA_OK(download(got, dMx));
    VERIFY_CLOSE(got, mx, 0.0, 0.0);
    CUDA_OK(download(got, dSum));
    VERIFY_CLOSE(got, sumExp, kAtol, kRtol);
    CUDA_OK(download(got, dTarget));
    VERIFY_CLOSE(got, targetLogit, 0.0, 0.0);
    CUDA_OK(download(got, dLosses));
    VERIFY_CLOSE(got, losses, kAtol, kRtol);
    CUDA_OK(download(got, dDlogits));
    VERIFY_CLOSE(got, dlogits, 1e-7, kRtol);
    // dlogits aliasing logits.
    CUDA_OK(cuda::crossEntropyFinish(dLosses.data(), dLogits.data(), dLogits.data(), dMx.data(), dSum.data(),
                                     dTarget.data(), dTargets.data(), vs, N, vl, 0.25f, m_stream));
    CUDA_OK(download(got, dLogits));
    VERIFY_CLOSE(got, dlogits, 1e-7, kRtol);
  }

  // The vision-transformer pieces (kernels/cpu/vit.cpp).
  void vitOps_data() {
    QTest::addColumn<int>("B");
    QTest::addColumn<int>("S");
    QTest::addColumn<int>("P");
    QTest::addColumn<int>("C");
    QTest::newRow("B1 S2 P1 C3") << 1 << 2 << 1 << 3;
    QTest::newRow("B3 S10 P5 C33") << 3 << 10 << 5 << 33;
    QTest::newRow("B64 S28 P7 C192") << 64 << 28 << 7 << 192;
  }

  void vitOps() {
    QFETCH(int, B);
    QFETCH(int, S);
    QFETCH(int, P);
    QFETCH(int, C);
    const int NP = (S / P) * (S / P);
    std::mt19937 rng(kSeed + 10);
    const Vec images = randomVec(rng, size_t(B) * S * S);
    Vec patches(images.size()), got;
    cpu::patchify(patches.data(), images.data(), B, S, P);
    DBuf<float> dImages, dPatches;
    CUDA_OK(upload(dImages, images));
    CUDA_OK(upload(dPatches, Vec(images.size())));
    CUDA_OK(cuda::patchify(dPatches.data(), dImages.data(), B, S, P, m_stream));
    CUDA_OK(download(got, dPatches));
    VERIFY_CLOSE(got, patches, 0.0, 0.0);
    const Vec x = randomVec(rng, size_t(B) * NP * C);
    const Vec cls = randomVec(rng, size_t(C));
    const Vec pos = randomVec(rng, size_t(NP + 1) * C);
    for (const bool withCls : {true, false}) {
      const int T = NP + (withCls ? 1 : 0);
      const size_t n = size_t(B) * T * C;
      const Vec dout = randomVec(rng, n);
      const Vec dx0 = randomVec(rng, x.size()), dcls0 = randomVec(rng, cls.size());
      const Vec dpos0 = randomVec(rng, size_t(T) * C);
      Vec out(n), dx = dx0, dcls = dcls0, dpos = dpos0;
      cpu::tokensForward(out.data(), x.data(), cls.data(), pos.data(), B, NP, C, withCls);
      cpu::tokensBackward(dx.data(), dcls.data(), dpos.data(), dout.data(), B, NP, C, withCls);
      DBuf<float> dX, dCls, dPos, dOut, dDout, dDx, dDcls, dDpos;
      CUDA_OK(upload(dX, x));
      CUDA_OK(upload(dCls, cls));
      CUDA_OK(upload(dPos, pos));
      CUDA_OK(upload(dOut, Vec(n)));
      CUDA_OK(upload(dDout, dout));
      CUDA_OK(upload(dDx, dx0));
      CUDA_OK(upload(dDcls, dcls0));
      CUDA_OK(upload(dDpos, dpos0));
      CUDA_OK(
          cuda::tokensForward(dOut.data(), dX.data(), dCls.data(), dPos.data(), B, NP, C, withCls, m_stream));
      CUDA_OK(cuda::tokensBackward(dDx.data(), dDcls.data(), dDpos.data(), dDout.data(), B, NP, C, withCls,
                                   m_stream));
      CUDA_OK(download(got, dOut));
      VERIFY_CLOSE(got, out, 0.0, 0.0);
      CUDA_OK(download(got, dDx));
      VERIFY_CLOSE(got, dx, 0.0, 0.0);
      CUDA_OK(download(got, dDcls));
      VERIFY_CLOSE(got, dcls, 0.0, 0.0);  // batch order, as on the CPU
      CUDA_OK(download(got, dDpos));
      VERIFY_CLOSE(got, dpos, 0.0, 0.0);
      for (const bool useFirst : {true, false}) {
        const Vec pdout = randomVec(rng, size_t(B) * C);
        const Vec dinp0 = randomVec(rng, n);
        Vec pooled(size_t(B) * C), dinp = dinp0;
        cpu::poolForward(pooled.data(), out.data(), B, T, C, useFirst);
        cpu::poolBackward(dinp.data(), pdout.data(), B, T, C, useFirst);
        DBuf<float> dPooled, dPdout, dDinp;
        CUDA_OK(upload(dPooled, Vec(pooled.size(), 4.0f)));
        CUDA_OK(upload(dPdout, pdout));
        CUDA_OK(upload(dDinp, dinp0));
        CUDA_OK(cuda::poolForward(dPooled.data(), dOut.data(), B, T, C, useFirst, m_stream));
        CUDA_OK(cuda::poolBackward(dDinp.data(), dPdout.data(), B, T, C, useFirst, m_stream));
        CUDA_OK(download(got, dPooled));
        VERIFY_CLOSE(got, pooled, kAtol, kRtol);
        CUDA_OK(download(got, dDinp));
        VERIFY_CLOSE(got, dinp, kAtol, kRtol);
      }
    }
  }
};

QTEST_APPLESS_MAIN(TestCudaKernels)
#include "tst_cuda_kernels.moc"
