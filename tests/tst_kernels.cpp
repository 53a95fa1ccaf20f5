// Tests of the CPU kernels (kernels/cpu/cpu_ops.h). Every op is checked against a plain reference written
// here in double precision (loops only, no BLAS), on shapes that include sizes that are multiples of no block
// (1, 3, 7, 17, 33, 97, ...). Backward passes are checked against central finite differences of the double
// reference (the gradient of sum(out * R) for random R) on small shapes, and against the naive analytic
// backward on larger ones. Tolerances are atol + rtol * |ref|. Data come from a fixed-seed std::mt19937.
#include <QtTest/QtTest>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/cpu_ops.h"

extern "C" int openblas_get_parallel();

namespace cpu = ms::cpu;

namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

constexpr unsigned kSeed = 20240611;

Vec randomVec(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<int32_t> randomTokens(std::mt19937& rng, size_t n, int V) {
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(rng);
  return v;
}

DVec toDouble(const Vec& v) {
  return DVec(v.begin(), v.end());
}

double dot(const DVec& a, const DVec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

// First element where |got - ref| > atol + rtol * |ref| (NaN fails too), as a message; empty when all pass.
template <class Ref>
QString mismatch(const float* got, const Ref* ref, size_t n, double atol, double rtol) {
  for (size_t i = 0; i < n; i++) {
    const double r = double(ref[i]);
    const double err = std::fabs(double(got[i]) - r);
    if (!(err <= atol + rtol * std::fabs(r)))
      return QStringLiteral("index %1 of %2: got %3, expected %4 (|diff| %5 > %6)")
          .arg(i)
          .arg(n)
          .arg(double(got[i]), 0, 'g', 9)
          .arg(r, 0, 'g', 9)
          .arg(err, 0, 'g', 3)
          .arg(atol + rtol * std::fabs(r), 0, 'g', 3);
  }
  return {};
}

#define VERIFY_CLOSE(got, ref, n, atol, rtol)                               \
  do {                                                                      \
    const QString msg_ = mismatch((got), (ref), size_t(n), (atol), (rtol)); \
    QVERIFY2(msg_.isEmpty(), qPrintable(QStringLiteral(#got ": ") + msg_)); \
  } while (false)

#define VERIFY_BITWISE(a, b)                                                                       \
  do {                                                                                             \
    QCOMPARE((a).size(), (b).size());                                                              \
    QVERIFY2((a).empty() || std::memcmp((a).data(), (b).data(), sizeof((a)[0]) * (a).size()) == 0, \
             #a " != " #b);                                                                        \
  } while (false)

// Gradient of sum(forward() * weights) with respect to x by central differences; forward() reads x.
template <class Forward>
DVec finiteDifference(DVec& x, const DVec& weights, Forward&& forward) {
  constexpr double h = 1e-6;
  DVec grad(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = dot(forward(), weights);
    x[i] = saved - h;
    const double down = dot(forward(), weights);
    x[i] = saved;
    grad[i] = (up - down) / (2.0 * h);
  }
  return grad;
}

// init + k * ref, the expected content of a gradient buffer that started at init after k backward calls.
DVec plusTimes(const Vec& init, const DVec& ref, double k) {
  DVec r(ref.size());
  for (size_t i = 0; i < r.size(); i++) r[i] = double(init[i]) + k * ref[i];
  return r;
}

// ---- Plain references, double precision ---------------------------------------------------------------

// out (N, OC) = inp (N, C) @ W + b; W is (C, OC), or (OC, C) when transposed.
DVec refLinear(const DVec& inp, const DVec& w, const DVec* b, int N, int C, int OC, bool transposed) {
  DVec out(size_t(N) * OC);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double s = b ? (*b)[o] : 0.0;
      for (int c = 0; c < C; c++)
        s += inp[size_t(n) * C + c] * (transposed ? w[size_t(o) * C + c] : w[size_t(c) * OC + o]);
      out[size_t(n) * OC + o] = s;
    }
  return out;
}

struct LayerNormRef {
  DVec out, mean, rstd;
};

LayerNormRef refLayerNorm(const DVec& inp, const DVec& w, const DVec& b, int N, int C, double eps) {
  LayerNormRef r{DVec(size_t(N) * C), DVec(N), DVec(N)};
  for (int n = 0; n < N; n++) {
    const double* x = inp.data() + size_t(n) * C;
    double m = 0.0;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    double var = 0.0;
    for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
    var /= C;
    const double s = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < C; c++) r.out[size_t(n) * C + c] = (x[c] - m) * s * w[c] + b[c];
    r.mean[n] = m;
    r.rstd[n] = s;
  }
  return r;
}

// llm.c layernorm_backward in double: dinp, dweight, dbias (fresh, not accumulated).
void refLayerNormBackward(DVec& dinp, DVec& dw, DVec& db, const DVec& dout, const DVec& inp, const DVec& w,
                          int N, int C, double eps) {
  const LayerNormRef f = refLayerNorm(inp, w, DVec(C, 0.0), N, C, eps);
  dinp.assign(size_t(N) * C, 0.0);
  dw.assign(C, 0.0);
  db.assign(C, 0.0);
  for (int n = 0; n < N; n++) {
    const double m = f.mean[n], s = f.rstd[n];
    double dm = 0.0, dnm = 0.0;
    for (int c = 0; c < C; c++) {
      const double norm = (inp[size_t(n) * C + c] - m) * s;
      const double dn = w[c] * dout[size_t(n) * C + c];
      dm += dn;
      dnm += dn * norm;
    }
    dm /= C;
    dnm /= C;
    for (int c = 0; c < C; c++) {
      const double norm = (inp[size_t(n) * C + c] - m) * s;
      const double dy = dout[size_t(n) * C + c];
      dinp[size_t(n) * C + c] = (w[c] * dy - dm - norm * dnm) * s;
      dw[c] += norm * dy;
      db[c] += dy;
    }
  }
}

double refGelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

// ---- Llama-family references (double) --------------------------------------------------------------------

struct RmsNormRef {
  DVec out, rstd;
};

// RMSNorm (Zhang & Sennrich 2019, eq. 4): out = x / sqrt(mean(x^2) + eps) * w.
RmsNormRef refRmsNorm(const DVec& inp, const DVec& w, int N, int C, double eps) {
  RmsNormRef r{DVec(size_t(N) * C), DVec(N)};
  for (int n = 0; n < N; n++) {
    const double* x = inp.data() + size_t(n) * C;
    double sq = 0.0;
    for (int c = 0; c < C; c++) sq += x[c] * x[c];
    const double s = 1.0 / std::sqrt(sq / C + eps);
    for (int c = 0; c < C; c++) r.out[size_t(n) * C + c] = x[c] * s * w[c];
    r.rstd[n] = s;
  }
  return r;
}

// The analytic backward in double (fresh): dx = s w dy - x s^3 mean(w dy x), dw = sum_n x s dy.
void refRmsNormBackward(DVec& dinp, DVec& dw, const DVec& dout, const DVec& inp, const DVec& w, int N, int C,
                        double eps) {
  const RmsNormRef f = refRmsNorm(inp, w, N, C, eps);
  dinp.assign(size_t(N) * C, 0.0);
  dw.assign(C, 0.0);
  for (int n = 0; n < N; n++) {
    const double s = f.rstd[n];
    const double* x = inp.data() + size_t(n) * C;
    const double* dy = dout.data() + size_t(n) * C;
    double dot = 0.0;
    for (int c = 0; c < C; c++) dot += w[c] * dy[c] * x[c];
    dot /= C;
    for (int c = 0; c < C; c++) {
      dinp[size_t(n) * C + c] = s * w[c] * dy[c] - x[c] * s * s * s * dot;
      dw[c] += x[c] * s * dy[c];
    }
  }
}

// SwiGLU (Shazeer 2020, eq. 6): silu(g) u, silu(g) = g sigmoid(g).
double refSwiglu(double g, double u) {
  return g / (1.0 + std::exp(-g)) * u;
}

// A RoPE configuration: q (B, T, H hs), k and v (B, T, KV hs), positions posStart + t.
struct RopeShape {
  int B, T, H, KV, hs;
  float theta;
  int posStart;
  size_t qSize() const { return size_t(B) * T * H * hs; }
  size_t kvSize() const { return size_t(B) * T * KV * hs; }
  size_t qkvSize() const { return 3 * qSize(); }
};

// The angle of pair i at position pos, in double from the formula (Su et al. 2021, eq. 34: theta_i =
// theta^(-2i / hs)); the kernels form it in fp32 (Hugging Face's inv_freq), within a few fp32 ulps of it.
double refRopeAngle(const RopeShape& r, int pos, int i) {
  return double(pos) * std::pow(double(r.theta), -2.0 * i / r.hs);
}

// qkv (B, T, 3 H hs): [q rotated | k rotated, head h from kv head h / (H / KV) | v repeated likewise],
// element i of a head paired with element i + hs / 2 (Hugging Face's rotate_half).
DVec refRopePack(const DVec& q, const DVec& k, const DVec& v, const RopeShape& r) {
  const int half = r.hs / 2, group = r.H / r.KV;
  const size_t Cq = size_t(r.H) * r.hs, Ckv = size_t(r.KV) * r.hs;
  DVec qkv(r.qkvSize());
  for (int b = 0; b < r.B; b++)
    for (int t = 0; t < r.T; t++) {
      const size_t n = size_t(b) * r.T + t;
      for (int h = 0; h < r.H; h++) {
        const size_t qh = n * Cq + size_t(h) * r.hs, kh = n * Ckv + size_t(h / group) * r.hs;
        const size_t oq = n * 3 * Cq + size_t(h) * r.hs, ok = oq + Cq, ov = oq + 2 * Cq;
        for (int i = 0; i < half; i++) {
          const double a = refRopeAngle(r, r.posStart + t, i), c = std::cos(a), s = std::sin(a);
          qkv[oq + i] = q[qh + i] * c - q[qh + i + half] * s;
          qkv[oq + i + half] = q[qh + i + half] * c + q[qh + i] * s;
          qkv[ok + i] = k[kh + i] * c - k[kh + i + half] * s;
          qkv[ok + i + half] = k[kh + i + half] * c + k[kh + i] * s;
        }
        for (int d = 0; d < r.hs; d++) qkv[ov + d] = v[kh + d];
      }
    }
  return qkv;
}

// The transpose of refRopePack: dq, dk, dv from dqkv (each head rotated back by -angle, a kv head's repeated
// heads summed).
void refRopeUnpack(DVec& dq, DVec& dk, DVec& dv, const DVec& dqkv, const RopeShape& r) {
  const int half = r.hs / 2, group = r.H / r.KV;
  const size_t Cq = size_t(r.H) * r.hs, Ckv = size_t(r.KV) * r.hs;
  dq.assign(r.qSize(), 0.0);
  dk.assign(r.kvSize(), 0.0);
  dv.assign(r.kvSize(), 0.0);
  for (int b = 0; b < r.B; b++)
    for (int t = 0; t < r.T; t++) {
      const size_t n = size_t(b) * r.T + t;
      for (int h = 0; h < r.H; h++) {
        const size_t qh = n * Cq + size_t(h) * r.hs, kh = n * Ckv + size_t(h / group) * r.hs;
        const size_t gq = n * 3 * Cq + size_t(h) * r.hs, gk = gq + Cq, gv = gq + 2 * Cq;
        for (int i = 0; i < half; i++) {
          const double a = refRopeAngle(r, r.posStart + t, i), c = std::cos(a), s = std::sin(a);
          dq[qh + i] = dqkv[gq + i] * c + dqkv[gq + i + half] * s;
          dq[qh + i + half] = dqkv[gq + i + half] * c - dqkv[gq + i] * s;
          dk[kh + i] += dqkv[gk + i] * c + dqkv[gk + i + half] * s;
          dk[kh + i + half] += dqkv[gk + i + half] * c - dqkv[gk + i] * s;
        }
        for (int d = 0; d < r.hs; d++) dv[kh + d] += dqkv[gv + d];
      }
    }
}

struct AttentionRef {
  DVec out, att;
};

AttentionRef refAttention(const DVec& qkv, int B, int T, int C, int H, bool causal) {
  const int hs = C / H;
  const double scale = 1.0 / std::sqrt(double(hs));
  AttentionRef r{DVec(size_t(B) * T * C, 0.0), DVec(size_t(B) * H * T * T, 0.0)};
  DVec scores(T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < T; i++) {
        const double* q = qkv.data() + (size_t(b) * T + i) * 3 * C + h * hs;
        const int L = causal ? i + 1 : T;
        double maxv = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < L; j++) {
          const double* k = qkv.data() + (size_t(b) * T + j) * 3 * C + C + h * hs;
          double s = 0.0;
          for (int d = 0; d < hs; d++) s += q[d] * k[d];
          scores[j] = s * scale;
          maxv = std::max(maxv, scores[j]);
        }
        double sum = 0.0;
        for (int j = 0; j < L; j++) sum += std::exp(scores[j] - maxv);
        double* a = r.att.data() + ((size_t(b) * H + h) * T + i) * T;
        for (int j = 0; j < L; j++) a[j] = std::exp(scores[j] - maxv) / sum;
        double* o = r.out.data() + (size_t(b) * T + i) * C + h * hs;
        for (int j = 0; j < L; j++) {
          const double* v = qkv.data() + (size_t(b) * T + j) * 3 * C + 2 * C + h * hs;
          for (int d = 0; d < hs; d++) o[d] += a[j] * v[d];
        }
      }
  return r;
}

// llm.c attention_backward in double: dqkv (fresh).
DVec refAttentionBackward(const DVec& dout, const DVec& qkv, int B, int T, int C, int H, bool causal) {
  const int hs = C / H;
  const double scale = 1.0 / std::sqrt(double(hs));
  const AttentionRef f = refAttention(qkv, B, T, C, H, causal);
  DVec dqkv(qkv.size(), 0.0);
  DVec datt(T), dpre(T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < T; i++) {
        const double* a = f.att.data() + ((size_t(b) * H + h) * T + i) * T;
        const double* g = dout.data() + (size_t(b) * T + i) * C + h * hs;
        const size_t qi = (size_t(b) * T + i) * 3 * C + h * hs;
        const int L = causal ? i + 1 : T;
        for (int j = 0; j < L; j++) {
          const size_t vj = (size_t(b) * T + j) * 3 * C + 2 * C + h * hs;
          datt[j] = 0.0;
          for (int d = 0; d < hs; d++) {
            datt[j] += g[d] * qkv[vj + d];
            dqkv[vj + d] += a[j] * g[d];
          }
        }
        double rowDot = 0.0;
        for (int j = 0; j < L; j++) rowDot += a[j] * datt[j];
        for (int j = 0; j < L; j++) dpre[j] = a[j] * (datt[j] - rowDot);
        for (int j = 0; j < L; j++) {
          const size_t kj = (size_t(b) * T + j) * 3 * C + C + h * hs;
          for (int d = 0; d < hs; d++) {
            dqkv[qi + d] += dpre[j] * qkv[kj + d] * scale;
            dqkv[kj + d] += dpre[j] * qkv[qi + d] * scale;
          }
        }
      }
  return dqkv;
}

// ---- Ring attention (context parallelism) -----------------------------------------------------------------

// The log-sum-exp (B, H, T) of each query row's scaled scores q.k / sqrt(hs) over its visible keys, in
// double.
DVec refAttentionLse(const DVec& qkv, int B, int T, int C, int H, bool causal) {
  const int hs = C / H;
  const double scale = 1.0 / std::sqrt(double(hs));
  DVec lse(size_t(B) * H * T);
  DVec s(T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < T; i++) {
        const double* q = qkv.data() + (size_t(b) * T + i) * 3 * C + h * hs;
        const int L = causal ? i + 1 : T;
        double m = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < L; j++) {
          const double* k = qkv.data() + (size_t(b) * T + j) * 3 * C + C + h * hs;
          double d = 0.0;
          for (int x = 0; x < hs; x++) d += q[x] * k[x];
          s[j] = d * scale;
          m = std::max(m, s[j]);
        }
        double sum = 0.0;
        for (int j = 0; j < L; j++) sum += std::exp(s[j] - m);
        lse[(size_t(b) * H + h) * T + i] = m + std::log(sum);
      }
  return lse;
}

// Context parallelism's load-balanced layout: rank r of cp holds chunks r and 2cp-1-r (chunk rows each) of a
// sequence of T = 2 cp chunk rows. The full row of the rank's local row t, and the positions of its rows.
int ringRow(int cp, int r, int chunk, int t) {
  return t < chunk ? r * chunk + t : (2 * cp - 1 - r) * chunk + (t - chunk);
}
ms::SeqPositions ringPositions(int cp, int r, int chunk) {
  return {r * chunk, chunk, (2 * cp - 1 - r) * chunk};
}

// The rank's rows (B, 2 chunk, W) of a full (B, T, W) tensor, and back.
Vec ringLocal(const Vec& full, int B, int W, int cp, int r, int chunk) {
  const int T = 2 * cp * chunk, Tl = 2 * chunk;
  Vec local(size_t(B) * Tl * W);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < Tl; t++)
      std::copy_n(full.data() + (size_t(b) * T + ringRow(cp, r, chunk, t)) * W, W,
                  local.data() + (size_t(b) * Tl + t) * W);
  return local;
}
void ringScatter(Vec& full, const Vec& local, int B, int W, int cp, int r, int chunk) {
  const int T = 2 * cp * chunk, Tl = 2 * chunk;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < Tl; t++)
      std::copy_n(local.data() + (size_t(b) * Tl + t) * W, W,
                  full.data() + (size_t(b) * T + ringRow(cp, r, chunk, t)) * W);
}

// kv (B, Tl, 2C): the k | v columns [C, 3C) of each qkv row (B, Tl, 3C).
Vec kvRows(const Vec& qkv, int B, int Tl, int C) {
  Vec kv(size_t(B) * Tl * 2 * C);
  for (size_t row = 0; row < size_t(B) * Tl; row++)
    std::copy_n(qkv.data() + row * 3 * C + C, 2 * C, kv.data() + row * 2 * C);
  return kv;
}

// Grouped-query attention's layouts (H query heads of hs = C/H over KV key/value heads, query head h reading
// kv head h / (H/KV)). qkv (B, T, 3C) with its k and v heads replaced by those of kv (B, T, 2 KV hs: the KV
// key heads | the KV value heads) repeated over each group: full attention on it is grouped-query attention.
Vec withKvHeads(Vec qkv, const Vec& kv, int B, int T, int C, int H, int KV) {
  const int hs = C / H, Ckv = KV * hs, group = H / KV;
  for (size_t row = 0; row < size_t(B) * T; row++)
    for (int h = 0; h < H; h++)
      for (int part = 0; part < 2; part++)  // k, v
        std::copy_n(kv.data() + row * 2 * Ckv + size_t(part) * Ckv + size_t(h / group) * hs, hs,
                    qkv.data() + row * 3 * C + size_t(part + 1) * C + size_t(h) * hs);
  return qkv;
}
// The gradient of such a qkv (B, T, 3C) as dq | dkv (B, T, C + 2 KV hs): the q part as it is, each kv head's
// dk and dv the sum (in double, in head order) over its group's query heads. KV = H: dqkv as it is.
template <class F>
std::vector<F> kvGroupGrad(const std::vector<F>& dqkv, int B, int T, int C, int H, int KV) {
  const int hs = C / H, Ckv = KV * hs, group = H / KV, W = C + 2 * Ckv;
  std::vector<F> out(size_t(B) * T * W);
  for (size_t row = 0; row < size_t(B) * T; row++) {
    const F* x = dqkv.data() + row * 3 * C;
    F* y = out.data() + row * W;
    std::copy_n(x, C, y);
    for (int part = 0; part < 2; part++)
      for (int g = 0; g < KV; g++)
        for (int d = 0; d < hs; d++) {
          double sum = 0.0;
          for (int h = g * group; h < (g + 1) * group; h++) sum += double(x[(part + 1) * C + h * hs + d]);
          y[C + part * Ckv + g * hs + d] = F(sum);
        }
  }
  return out;
}

// Ring attention assembled from the block ops as cp ranks run it: every rank merges the blocks of all ranks,
// its own first (first = true), then ranks r-1, r-2, ... (mod cp), each with the owner's kv rows (of kv,
// (B, T, 2 KV hs)) and positions; backward runs every (rank, block) pair from the final out and lse, dq into
// the rank's dqkv and dk | dv into the owner's dkv. out (B, T, C), lse (B, H, T) and dqkv (B, T, C + 2 KV hs:
// dq | dkv) scattered back to the full positions. kvUntouched: the k and v parts of every rank's dqkv (set
// to 7 before) still hold 7.
struct RingResult {
  Vec out, lse, dqkv;
  bool kvUntouched = true;
};

RingResult cpuRing(const Vec& qkv, const Vec& kvFull, const Vec& dout, int B, int C, int H, int KV, int cp,
                   int chunk, bool causal) {
  const int T = 2 * cp * chunk, Tl = 2 * chunk;
  const int Ckv = KV * (C / H), W = C + 2 * Ckv;
  std::vector<Vec> q(cp), kv(cp), o(cp), l(cp), g(cp), dq(cp), dkv(cp);
  for (int r = 0; r < cp; r++) {
    q[r] = ringLocal(qkv, B, 3 * C, cp, r, chunk);
    kv[r] = ringLocal(kvFull, B, 2 * Ckv, cp, r, chunk);
    g[r] = ringLocal(dout, B, C, cp, r, chunk);
    o[r].assign(size_t(B) * Tl * C, std::numeric_limits<float>::quiet_NaN());  // first overwrites
    l[r].assign(size_t(B) * H * Tl, std::numeric_limits<float>::quiet_NaN());
    dq[r].assign(size_t(B) * Tl * 3 * C, 7.0f);
    for (size_t row = 0; row < size_t(B) * Tl; row++) std::fill_n(dq[r].data() + row * 3 * C, C, 0.0f);
    dkv[r].assign(size_t(B) * Tl * 2 * Ckv, 0.0f);
  }
  for (int r = 0; r < cp; r++)
    for (int step = 0; step < cp; step++) {
      const int owner = (r - step + cp) % cp;
      cpu::attentionBlockForward(o[r].data(), l[r].data(), q[r].data(), kv[owner].data(), B, Tl, Tl, C, H, KV,
                                 ringPositions(cp, r, chunk), ringPositions(cp, owner, chunk), causal,
                                 step == 0);
    }
  for (int r = 0; r < cp; r++)
    for (int step = 0; step < cp; step++) {
      const int owner = (r - step + cp) % cp;
      cpu::attentionBlockBackward(dq[r].data(), dkv[owner].data(), g[r].data(), q[r].data(), kv[owner].data(),
                                  o[r].data(), l[r].data(), B, Tl, Tl, C, H, KV, ringPositions(cp, r, chunk),
                                  ringPositions(cp, owner, chunk), causal);
    }
  RingResult res{Vec(size_t(B) * T * C), Vec(size_t(B) * H * T), Vec(size_t(B) * T * W)};
  for (int r = 0; r < cp; r++) {
    ringScatter(res.out, o[r], B, C, cp, r, chunk);
    // lse (B, H, Tl) is (B * H, Tl, 1): rows of one float.
    for (int bh = 0; bh < B * H; bh++)
      for (int t = 0; t < Tl; t++)
        res.lse[size_t(bh) * T + ringRow(cp, r, chunk, t)] = l[r][size_t(bh) * Tl + t];
    Vec grad(size_t(B) * Tl * W);  // dq from the rank's dqkv, dk | dv from its dkv
    for (size_t row = 0; row < size_t(B) * Tl; row++) {
      std::copy_n(dq[r].data() + row * 3 * C, C, grad.data() + row * W);
      std::copy_n(dkv[r].data() + row * 2 * Ckv, 2 * Ckv, grad.data() + row * W + C);
      for (int c = C; c < 3 * C; c++) res.kvUntouched = res.kvUntouched && dq[r][row * 3 * C + c] == 7.0f;
    }
    ringScatter(res.dqkv, grad, B, W, cp, r, chunk);
  }
  return res;
}

uint32_t floatBits(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// losses (N) of softmax cross-entropy; ignored targets give 0.
DVec refCrossEntropy(const DVec& logits, const std::vector<int32_t>& targets, int N, int V) {
  DVec losses(N, 0.0);
  for (int n = 0; n < N; n++) {
    if (targets[n] < 0) continue;
    const double* x = logits.data() + size_t(n) * V;
    const double m = *std::max_element(x, x + V);
    double s = 0.0;
    for (int j = 0; j < V; j++) s += std::exp(x[j] - m);
    losses[n] = std::log(s) + m - x[targets[n]];
  }
  return losses;
}

// ---- Optimizer references (the formulas, in double) ---------------------------------------------------

// ---- Mixture-of-experts index lists -----------------------------------------------------------------------

// n distinct rows of [0, R) (n <= R) in random order: a shuffled prefix of 0, ..., R - 1.
std::vector<int32_t> distinctRows(std::mt19937& rng, int n, int R) {
  std::vector<int32_t> v(R);
  std::iota(v.begin(), v.end(), 0);
  std::shuffle(v.begin(), v.end(), rng);
  v.resize(n);
  return v;
}

struct AdamParams {
  float lr, beta1, beta2, eps, weightDecay, gradScale;
};

void refAdamw(DVec& p, DVec& m, DVec& v, const Vec& grads, const AdamParams& a, int t) {
  const double b1 = a.beta1, b2 = a.beta2;
  for (size_t i = 0; i < p.size(); i++) {
    const double g = double(grads[i]) * double(a.gradScale);
    p[i] *= 1.0 - double(a.lr) * double(a.weightDecay);
    m[i] = b1 * m[i] + (1.0 - b1) * g;
    v[i] = b2 * v[i] + (1.0 - b2) * g * g;
    const double mhat = m[i] / (1.0 - std::pow(b1, t));
    const double vhat = v[i] / (1.0 - std::pow(b2, t));
    p[i] -= double(a.lr) * mhat / (std::sqrt(vhat) + double(a.eps));
  }
}

}  // namespace

class TestKernels : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void cleanupTestCase();
  void threadCount();
  void blasCoreChoice_data();
  void blasCoreChoice();

  void linear_data();
  void linear();
  void linearFiniteDifference_data();
  void linearFiniteDifference();

  void layerNorm_data();
  void layerNorm();

  void rmsNorm_data();
  void rmsNorm();
  void swiglu_data();
  void swiglu();
  void rope_data();
  void rope();
  void llamaDeterministicThreads();

  void gatherRows_data();
  void gatherRows();
  void scatterAddRows_data();
  void scatterAddRows();
  void rowDots_data();
  void rowDots();
  void moeDeterministicThreads();

  void pointwise_data();
  void pointwise();
  void addAccumulateScale_data();
  void addAccumulateScale();

  void attention_data();
  void attention();
  void attentionCausality();
  void attentionBlock_data();
  void attentionBlock();
  void ringAttention_data();
  void ringAttention();
  void attentionBlockNoVisibleKey_data();
  void attentionBlockNoVisibleKey();

  void embedding_data();
  void embedding();

  void crossEntropy_data();
  void crossEntropy();
  void crossEntropyLargeLogits();
  void argmax_data();
  void argmax();

  void patchify_data();
  void patchify();
  void tokens_data();
  void tokens();
  void pool_data();
  void pool();

  void adamw_data();
  void adamw();
  void sgd_data();
  void sgd();
  void sumSquares_data();
  void sumSquares();

  void deterministicThreads();
};

void TestKernels::initTestCase() {
  // Two threads unless told otherwise, so the parallel paths (and their reductions) run in every test.
  cpu::setThreads(2);
  qInfo("threads %d, OpenBLAS parallel mode %d (2 = OpenMP)", cpu::threads(), openblas_get_parallel());
}

void TestKernels::cleanupTestCase() {
  cpu::setThreads(2);
}

void TestKernels::threadCount() {
  cpu::setThreads(3);
  QCOMPARE(cpu::threads(), 3);
  cpu::setThreads(1);
  QCOMPARE(cpu::threads(), 1);
  cpu::setThreads(0);
  QCOMPARE(cpu::threads(), omp_get_num_procs());
  cpu::setThreads(-1);
  QCOMPARE(cpu::threads(), omp_get_num_procs());
  cpu::setThreads(2);
  QCOMPARE(cpu::threads(), 2);
}

// OpenBLAS's SSE-only fallback cores are replaced by the best core the CPU runs; every other core is kept.
void TestKernels::blasCoreChoice_data() {
  QTest::addColumn<QString>("detected");
  QTest::addColumn<QString>("isa");  // the CpuVectorIsa fields set, by name
  QTest::addColumn<QString>("expected");
  const QString avx512 = "avx avx2 fma avx512f avx512cd avx512bw avx512dq avx512vl";
  QTest::newRow("Prescott on AVX-512") << "Prescott" << avx512 << "SkylakeX";
  QTest::newRow("prescott, any case") << "prescott" << avx512 << "SkylakeX";
  QTest::newRow("Nehalem on AVX-512") << "Nehalem" << avx512 << "SkylakeX";
  QTest::newRow("Prescott, AVX-512 without BW") << "Prescott"
                                                << "avx avx2 fma avx512f avx512cd avx512dq avx512vl"
                                                << "Haswell";
  QTest::newRow("Prescott on AVX2") << "Prescott"
                                    << "avx avx2 fma"
                                    << "Haswell";
  QTest::newRow("Barcelona on AVX2") << "Barcelona"
                                     << "avx avx2 fma"
                                     << "Haswell";
  QTest::newRow("Prescott, AVX2 without FMA") << "Prescott"
                                              << "avx avx2"
                                              << "Sandybridge";
  QTest::newRow("Core2 on AVX") << "Core2"
                                << "avx"
                                << "Sandybridge";
  QTest::newRow("Prescott on SSE only") << "Prescott"
                                        << ""
                                        << "";
  QTest::newRow("Haswell on AVX-512 kept") << "Haswell" << avx512 << "";
  QTest::newRow("Zen kept") << "Zen"
                            << "avx avx2 fma"
                            << "";
  QTest::newRow("SkylakeX kept") << "SkylakeX" << avx512 << "";
  QTest::newRow("not OpenBLAS") << "" << avx512 << "";
}

void TestKernels::blasCoreChoice() {
  QFETCH(QString, detected);
  QFETCH(QString, isa);
  QFETCH(QString, expected);
  cpu::CpuVectorIsa set;
  const QStringList names = isa.split(' ', Qt::SkipEmptyParts);
  set.avx = names.contains("avx");
  set.avx2 = names.contains("avx2");
  set.fma = names.contains("fma");
  set.avx512f = names.contains("avx512f");
  set.avx512cd = names.contains("avx512cd");
  set.avx512bw = names.contains("avx512bw");
  set.avx512dq = names.contains("avx512dq");
  set.avx512vl = names.contains("avx512vl");
  QCOMPARE(QString::fromStdString(cpu::betterBlasCore(detected.toStdString(), set)), expected);
}

// ---- Linear
// ------------------------------------------------------------------------------------------------

void TestKernels::linear_data() {
  QTest::addColumn<int>("N");
  QTest::addColumn<int>("C");
  QTest::addColumn<int>("OC");
  QTest::addColumn<bool>("bias");
  QTest::addColumn<bool>("transposed");
  const int shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 97, 11}, {8, 64, 64}, {130, 33, 257}};
  for (const auto& s : shapes)
    for (bool transposed : {false, true})
      for (bool bias : {true, false})
        QTest::addRow("N=%d C=%d OC=%d %s%s", s[0], s[1], s[2], transposed ? "T" : "", bias ? " bias" : "")
            << s[0] << s[1] << s[2] << bias << transposed;
}

void TestKernels::linear() {
  QFETCH(int, N);
  QFETCH(int, C);
  QFETCH(int, OC);
  QFETCH(bool, bias);
  QFETCH(bool, transposed);
  std::mt19937 rng(kSeed);
  const Vec inp = randomVec(rng, size_t(N) * C);    // (N, C)
  const Vec w = randomVec(rng, size_t(C) * OC);     // (C, OC) or (OC, C)
  const Vec b = randomVec(rng, OC);                 // (OC)
  const Vec dout = randomVec(rng, size_t(N) * OC);  // (N, OC)
  const auto forward = transposed ? cpu::linearForwardT : cpu::linearForward;
  const auto backward = transposed ? cpu::linearBackwardT : cpu::linearBackward;

  Vec out(size_t(N) * OC, std::numeric_limits<float>::quiet_NaN());  // (N, OC); NaN: must be overwritten
  forward(out.data(), inp.data(), w.data(), bias ? b.data() : nullptr, N, C, OC);
  const DVec bd = toDouble(b);
  const DVec ref = refLinear(toDouble(inp), toDouble(w), bias ? &bd : nullptr, N, C, OC, transposed);
  VERIFY_CLOSE(out.data(), ref.data(), out.size(), 1e-5, 1e-4);

  // Naive analytic backward in double.
  DVec rdinp(size_t(N) * C, 0.0), rdw(size_t(C) * OC, 0.0), rdb(OC, 0.0);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      const double g = dout[size_t(n) * OC + o];
      rdb[o] += g;
      for (int c = 0; c < C; c++) {
        const size_t wi = transposed ? size_t(o) * C + c : size_t(c) * OC + o;
        rdinp[size_t(n) * C + c] += g * w[wi];
        rdw[wi] += g * inp[size_t(n) * C + c];
      }
    }
  Vec dinp(inp.size(), 0.0f), dw(w.size(), 0.0f), db(OC, 0.0f);
  backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  VERIFY_CLOSE(dinp.data(), rdinp.data(), dinp.size(), 1e-5, 1e-4);
  VERIFY_CLOSE(dw.data(), rdw.data(), dw.size(), 1e-5, 1e-4);
  VERIFY_CLOSE(db.data(), rdb.data(), db.size(), 1e-5, 1e-4);

  // Accumulation: two calls onto random initial gradients give init + 2 * grad.
  const Vec dinp0 = randomVec(rng, dinp.size()), dw0 = randomVec(rng, dw.size()), db0 = randomVec(rng, OC);
  dinp = dinp0, dw = dw0, db = db0;
  for (int rep = 0; rep < 2; rep++)
    backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  VERIFY_CLOSE(dinp.data(), plusTimes(dinp0, rdinp, 2).data(), dinp.size(), 1e-5, 1e-4);
  VERIFY_CLOSE(dw.data(), plusTimes(dw0, rdw, 2).data(), dw.size(), 1e-5, 1e-4);
  VERIFY_CLOSE(db.data(), plusTimes(db0, rdb, 2).data(), db.size(), 1e-5, 1e-4);

  // Each gradient alone, the others null.
  std::fill(dinp.begin(), dinp.end(), 0.0f);
  backward(dinp.data(), nullptr, nullptr, dout.data(), inp.data(), w.data(), N, C, OC);
  VERIFY_CLOSE(dinp.data(), rdinp.data(), dinp.size(), 1e-5, 1e-4);
  std::fill(dw.begin(), dw.end(), 0.0f);
  backward(nullptr, dw.data(), nullptr, dout.data(), inp.data(), w.data(), N, C, OC);
  VERIFY_CLOSE(dw.data(), rdw.data(), dw.size(), 1e-5, 1e-4);
  std::fill(db.begin(), db.end(), 0.0f);
  backward(nullptr, nullptr, db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  VERIFY_CLOSE(db.data(), rdb.data(), db.size(), 1e-5, 1e-4);
  backward(nullptr, nullptr, nullptr, dout.data(), inp.data(), w.data(), N, C, OC);
}

void TestKernels::linearFiniteDifference_data() {
  QTest::addColumn<bool>("transposed");
  QTest::newRow("C,OC layout") << false;
  QTest::newRow("OC,C layout") << true;
}

void TestKernels::linearFiniteDifference() {
  QFETCH(bool, transposed);
  const int N = 3, C = 5, OC = 4;
  std::mt19937 rng(kSeed + 1);
  const Vec inp = randomVec(rng, size_t(N) * C), w = randomVec(rng, size_t(C) * OC), b = randomVec(rng, OC);
  const DVec R = toDouble(randomVec(rng, size_t(N) * OC));  // (N, OC): weights of the scalar sum(out * R)
  Vec dout(R.begin(), R.end());
  Vec dinp(inp.size(), 0.0f), dw(w.size(), 0.0f), db(OC, 0.0f);
  (transposed ? cpu::linearBackwardT : cpu::linearBackward)(dinp.data(), dw.data(), db.data(), dout.data(),
                                                            inp.data(), w.data(), N, C, OC);
  DVec x = toDouble(inp), wd = toDouble(w), bd = toDouble(b);
  auto f = [&] { return refLinear(x, wd, &bd, N, C, OC, transposed); };
  VERIFY_CLOSE(dinp.data(), finiteDifference(x, R, f).data(), dinp.size(), 1e-5, 1e-4);
  VERIFY_CLOSE(dw.data(), finiteDifference(wd, R, f).data(), dw.size(), 1e-5, 1e-4);
  VERIFY_CLOSE(db.data(), finiteDifference(bd, R, f).data(), db.size(), 1e-5, 1e-4);
}

// ---- LayerNorm
// ---------------------------------------------------------------------------------------------

void TestKernels::layerNorm_data() {
  QTest::addColumn<int>("N");
  QTest::addColumn<int>("C");
  QTest::addColumn<float>("offset");
  const int shapes[][2] = {{1, 1}, {1, 5}, {7, 5}, {33, 64}, {7, 97}, {300, 97}, {64, 768}};
  for (const auto& s : shapes) QTest::addRow("N=%d C=%d", s[0], s[1]) << s[0] << s[1] << 0.0f;
  QTest::addRow("N=33 C=97 mean 10") << 33 << 97 << 10.0f;
}

void TestKernels::layerNorm() {
  QFETCH(int, N);
  QFETCH(int, C);
  QFETCH(float, offset);
  const float eps = 1e-5f;
  std::mt19937 rng(kSeed + 2);
  const Vec inp = randomVec(rng, size_t(N) * C, offset - 1.0f, offset + 1.0f);  // (N, C)
  const Vec w = randomVec(rng, C, 0.5f, 1.5f), b = randomVec(rng, C);           // (C), (C)
  const Vec dout = randomVec(rng, size_t(N) * C);                               // (N, C)

  Vec out(inp.size()), mean(N), rstd(N);
  cpu::layerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C, eps);
  const LayerNormRef ref = refLayerNorm(toDouble(inp), toDouble(w), toDouble(b), N, C, eps);
  // The mean-10 row loses ~1e-6 absolute in x - mean to float rounding of x itself; allow for it.
  const double atol = offset == 0.0f ? 1e-5 : 5e-5;
  VERIFY_CLOSE(out.data(), ref.out.data(), out.size(), atol, 1e-4);
  VERIFY_CLOSE(mean.data(), ref.mean.data(), N, 1e-6, 1e-5);
  VERIFY_CLOSE(rstd.data(), ref.rstd.data(), N, 1e-5, 1e-4);

  DVec rdinp, rdw, rdb;
  refLayerNormBackward(rdinp, rdw, rdb, toDouble(dout), toDouble(inp), toDouble(w), N, C, eps);
  Vec dinp(inp.size(), 0.0f), dw(C, 0.0f), db(C, 0.0f);
  cpu::layerNormBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                         rstd.data(), N, C);
  VERIFY_CLOSE(dinp.data(), rdinp.data(), dinp.size(), 1e-4, 1e-3);
  VERIFY_CLOSE(dw.data(), rdw.data(), C, 1e-4, 1e-4);
  VERIFY_CLOSE(db.data(), rdb.data(), C, 1e-4, 1e-4);

  if (size_t(N) * C <= 500 && offset == 0.0f) {  // the naive backward itself, against finite differences
    DVec x = toDouble(inp), wd = toDouble(w), bd = toDouble(b);
    const DVec R = toDouble(dout);
    auto f = [&] { return refLayerNorm(x, wd, bd, N, C, eps).out; };
    VERIFY_CLOSE(dinp.data(), finiteDifference(x, R, f).data(), dinp.size(), 1e-4, 1e-3);
    VERIFY_CLOSE(dw.data(), finiteDifference(wd, R, f).data(), C, 1e-5, 1e-4);
    VERIFY_CLOSE(db.data(), finiteDifference(bd, R, f).data(), C, 1e-5, 1e-4);
  }

  const Vec dinp0 = randomVec(rng, dinp.size()), dw0 = randomVec(rng, C), db0 = randomVec(rng, C);
  dinp = dinp0, dw = dw0, db = db0;
  for (int rep = 0; rep < 2; rep++)
    cpu::layerNormBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                           rstd.data(), N, C);
  VERIFY_CLOSE(dinp.data(), plusTimes(dinp0, rdinp, 2).data(), dinp.size(), 1e-4, 1e-3);
  VERIFY_CLOSE(dw.data(), plusTimes(dw0, rdw, 2).data(), C, 1e-4, 1e-4);
  VERIFY_CLOSE(db.data(), plusTimes(db0, rdb, 2).data(), C, 1e-4, 1e-4);

  std::fill(dinp.begin(), dinp.end(), 0.0f);
  cpu::layerNormBackward(dinp.data(), nullptr, nullptr, dout.data(), inp.data(), w.data(), mean.data(),
                         rstd.data(), N, C);
  VERIFY_CLOSE(dinp.data(), rdinp.data(), dinp.size(), 1e-4, 1e-3);
  std::fill(dinp.begin(), dinp.end(), 0.0f);
  std::fill(db.begin(), db.end(), 0.0f);
  cpu::layerNormBackward(dinp.data(), nullptr, db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                         rstd.data(), N, C);
  VERIFY_CLOSE(db.data(), rdb.data(), C, 1e-4, 1e-4);
}

// ---- Llama-family pieces
// -------------------------------------------------------------------------------

void TestKernels::rmsNorm_data() {
  QTest::addColumn<int>("N");
  QTest::addColumn<int>("C");
  QTest::addColumn<float>("offset");
  const int shapes[][2] = {{1, 1}, {1, 5}, {7, 5}, {33, 64}, {7, 97}, {300, 97}, {64, 768}};
  for (const auto& s : shapes) QTest::addRow("N=%d C=%d", s[0], s[1]) << s[0] << s[1] << 0.0f;
  QTest::addRow("N=33 C=97 mean 10") << 33 << 97 << 10.0f;
}

void TestKernels::rmsNorm() {
  QFETCH(int, N);
  QFETCH(int, C);
  QFETCH(float, offset);
  const float eps = 1e-5f;
  std::mt19937 rng(kSeed + 20);
  const Vec inp = randomVec(rng, size_t(N) * C, offset - 1.0f, offset + 1.0f);  // (N, C)
  const Vec w = randomVec(rng, C, 0.5f, 1.5f);                                  // (C)
  const Vec dout = randomVec(rng, size_t(N) * C);                               // (N, C)

  const float nan = std::numeric_limits<float>::quiet_NaN();
  Vec out(inp.size(), nan), rstd(N, nan);  // NaN: must be overwritten
  cpu::rmsNormForward(out.data(), rstd.data(), inp.data(), w.data(), N, C, eps);
  const RmsNormRef ref = refRmsNorm(toDouble(inp), toDouble(w), N, C, eps);
  VERIFY_CLOSE(out.data(), ref.out.data(), out.size(), 1e-5, 1e-4);
  VERIFY_CLOSE(rstd.data(), ref.rstd.data(), N, 1e-6, 1e-5);

  DVec rdinp, rdw;
  refRmsNormBackward(rdinp, rdw, toDouble(dout), toDouble(inp), toDouble(w), N, C, eps);
  Vec dinp(inp.size(), 0.0f), dw(C, 0.0f);
  cpu::rmsNormBackward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), N, C);
  // With C = 1 the input gradient is a difference of two nearly equal terms (s w dy (1 - x^2 s^2)): the
  // absolute tolerance carries it.
  VERIFY_CLOSE(dinp.data(), rdinp.data(), dinp.size(), 1e-4, 1e-3);
  VERIFY_CLOSE(dw.data(), rdw.data(), C, 1e-4, 1e-4);

  if (size_t(N) * C <= 500 && offset == 0.0f) {
    // Central differences of the scalar loss sum(out * dout) of the double forward: the kernel's gradients,
    // not only the analytic reference's.
    DVec x = toDouble(inp), wd = toDouble(w);
    const DVec R = toDouble(dout);
    auto f = [&] { return refRmsNorm(x, wd, N, C, eps).out; };
    VERIFY_CLOSE(dinp.data(), finiteDifference(x, R, f).data(), dinp.size(), 1e-4, 1e-3);
    VERIFY_CLOSE(dw.data(), finiteDifference(wd, R, f).data(), C, 1e-5, 1e-4);
  }

  // Accumulation: two calls onto random initial gradients give init + 2 * grad.
  const Vec dinp0 = randomVec(rng, dinp.size()), dw0 = randomVec(rng, C);
  dinp = dinp0, dw = dw0;
  for (int rep = 0; rep < 2; rep++)
    cpu::rmsNormBackward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), N, C);
  VERIFY_CLOSE(dinp.data(), plusTimes(dinp0, rdinp, 2).data(), dinp.size(), 1e-4, 1e-3);
  VERIFY_CLOSE(dw.data(), plusTimes(dw0, rdw, 2).data(), C, 1e-4, 1e-4);

  // No weight gradient: the input gradient alone.
  dinp = dinp0;
  cpu::rmsNormBackward(dinp.data(), nullptr, dout.data(), inp.data(), w.data(), rstd.data(), N, C);
  VERIFY_CLOSE(dinp.data(), plusTimes(dinp0, rdinp, 1).data(), dinp.size(), 1e-4, 1e-3);
}

void TestKernels::swiglu_data() {
  QTest::addColumn<int>("n");
  for (int n : {1, 7, 33, 1000, 100003}) QTest::addRow("n=%d", n) << n;
}

void TestKernels::swiglu() {
  QFETCH(int, n);
  std::mt19937 rng(kSeed + 21);
  Vec gate = randomVec(rng, n, -6.0f, 6.0f);
  if (n >= 7) {  // the tails (exp(-g) saturating on the CPU past 88.3), and around 0
    gate[0] = -30.0f, gate[1] = 30.0f, gate[2] = 1e-4f, gate[3] = -100.0f, gate[4] = 100.0f, gate[5] = 0.0f;
  }
  const Vec up = randomVec(rng, n, -2.0f, 2.0f);
  const Vec dout = randomVec(rng, n);
  const Vec dgate0 = randomVec(rng, n), dup0 = randomVec(rng, n);

  Vec out(n, std::numeric_limits<float>::quiet_NaN());
  cpu::swigluForward(out.data(), gate.data(), up.data(), n);
  DVec ref(n);
  for (int i = 0; i < n; i++) ref[i] = refSwiglu(gate[i], up[i]);
  VERIFY_CLOSE(out.data(), ref.data(), n, 1e-6, 1e-5);
  // out may alias gate or up: the same bits.
  Vec aliasGate = gate, aliasUp = up;
  cpu::swigluForward(aliasGate.data(), aliasGate.data(), up.data(), n);
  cpu::swigluForward(aliasUp.data(), gate.data(), aliasUp.data(), n);
  VERIFY_BITWISE(aliasGate, out);
  VERIFY_BITWISE(aliasUp, out);

  // The gradients of the scalar loss sum(out * dout) by central differences of the double forward: over the
  // whole loss where that is cheap, element by element (the only term that depends on an element) beyond.
  DVec rdgate(n), rdup(n);
  if (n <= 1000) {
    DVec g = toDouble(gate), u = toDouble(up);
    auto f = [&] {
      DVec o(g.size());
      for (size_t i = 0; i < o.size(); i++) o[i] = refSwiglu(g[i], u[i]);
      return o;
    };
    const DVec R = toDouble(dout);
    rdgate = finiteDifference(g, R, f);
    rdup = finiteDifference(u, R, f);
  } else {
    const double h = 1e-6;
    for (int i = 0; i < n; i++) {
      const double g = gate[i], u = up[i], d = dout[i];
      rdgate[i] = d * (refSwiglu(g + h, u) - refSwiglu(g - h, u)) / (2.0 * h);
      rdup[i] = d * (refSwiglu(g, u + h) - refSwiglu(g, u - h)) / (2.0 * h);
    }
  }
  // Backward twice onto random initial values: init + 2 * grad.
  Vec dgate = dgate0, dup = dup0;
  for (int rep = 0; rep < 2; rep++)
    cpu::swigluBackward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n);
  VERIFY_CLOSE(dgate.data(), plusTimes(dgate0, rdgate, 2).data(), n, 1e-5, 1e-4);
  VERIFY_CLOSE(dup.data(), plusTimes(dup0, rdup, 2).data(), n, 1e-5, 1e-4);
}

void TestKernels::rope_data() {
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
      {1, 1, 1, 1, 2, 10000.0f, 0},   {2, 5, 3, 3, 6, 10000.0f, 0},     {2, 5, 4, 2, 8, 10000.0f, 3},
      {2, 5, 4, 1, 8, 10000.0f, 3},   {3, 7, 4, 2, 10, 500000.0f, 100}, {1, 6, 4, 1, 16, 10000.0f, 17},
      {2, 64, 8, 2, 64, 10000.0f, 0},  // the parallel path (B T H hs >= 2^14)
  };
  for (const auto& r : rows)
    QTest::addRow("%s B=%d T=%d H=%d KV=%d hs=%d theta=%g pos=%d",
                  r.KV == r.H ? "MHA"
                  : r.KV == 1 ? "MQA"
                              : "GQA",
                  r.B, r.T, r.H, r.KV, r.hs, double(r.theta), r.posStart)
        << r.B << r.T << r.H << r.KV << r.hs << r.theta << r.posStart;
}

void TestKernels::rope() {
  QFETCH(int, B);
  QFETCH(int, T);
  QFETCH(int, H);
  QFETCH(int, KV);
  QFETCH(int, hs);
  QFETCH(float, theta);
  QFETCH(int, posStart);
  const RopeShape r{B, T, H, KV, hs, theta, posStart};
  const int group = H / KV;
  std::mt19937 rng(kSeed + 22);
  const Vec q = randomVec(rng, r.qSize()), k = randomVec(rng, r.kvSize()), v = randomVec(rng, r.kvSize());
  const Vec dqkv = randomVec(rng, r.qkvSize());
  // The kernels form the angle in fp32 (inverse frequency and product rounded: a relative error of a few
  // 2^-24), the reference in double: a difference growing with the position, bounded by |x0| + |x1| <= 2
  // times the angle's error.
  const double atol = 2e-6 + 5e-7 * double(posStart + T - 1);

  Vec qkv(r.qkvSize(), std::numeric_limits<float>::quiet_NaN());  // every element written
  cpu::ropePackQkv(qkv.data(), q.data(), k.data(), v.data(), B, T, H, KV, hs, theta, posStart);
  const DVec ref = refRopePack(toDouble(q), toDouble(k), toDouble(v), r);
  VERIFY_CLOSE(qkv.data(), ref.data(), qkv.size(), atol, 1e-5);
  // v is copied, never rounded: exactly the reference's (its kv head repeated).
  for (size_t i = 0; i < qkv.size(); i++)
    if ((i / (size_t(H) * hs)) % 3 == 2)
      QVERIFY2(double(qkv[i]) == ref[i],
               qPrintable(QStringLiteral("v at %1: %2 vs %3").arg(i).arg(qkv[i]).arg(ref[i])));

  // The transpose: dq, dk, dv OVERWRITTEN (they start at 7), against the double transpose; dk sums `group`
  // rotated-back gradients, dv `group` copies.
  Vec dq(r.qSize(), 7.0f), dk(r.kvSize(), 7.0f), dv(r.kvSize(), 7.0f);
  cpu::ropeUnpackQkv(dq.data(), dk.data(), dv.data(), dqkv.data(), B, T, H, KV, hs, theta, posStart);
  DVec rdq, rdk, rdv;
  refRopeUnpack(rdq, rdk, rdv, toDouble(dqkv), r);
  VERIFY_CLOSE(dq.data(), rdq.data(), dq.size(), atol, 1e-5);
  VERIFY_CLOSE(dk.data(), rdk.data(), dk.size(), atol * group, 1e-5);
  VERIFY_CLOSE(dv.data(), rdv.data(), dv.size(), 1e-6 * group, 1e-6);

  // Exactly the transpose of the pack: <pack(q, k, v), dqkv> = <(q, k, v), unpack(dqkv)>, both sides summed
  // in double over the kernels' float outputs (1e-5 relative: each output is within a few ulps).
  double lhs = 0.0, rhs = 0.0;
  for (size_t i = 0; i < qkv.size(); i++) lhs += double(qkv[i]) * double(dqkv[i]);
  for (size_t i = 0; i < q.size(); i++) rhs += double(q[i]) * double(dq[i]);
  for (size_t i = 0; i < k.size(); i++) rhs += double(k[i]) * double(dk[i]) + double(v[i]) * double(dv[i]);
  QVERIFY2(std::fabs(lhs - rhs) <= 1e-5 * std::max(std::fabs(lhs), std::fabs(rhs)),
           qPrintable(QStringLiteral("<pack(x), y> = %1, <x, unpack(y)> = %2")
                          .arg(lhs, 0, 'g', 17)
                          .arg(rhs, 0, 'g', 17)));

  // Overwritten, not accumulated: a second call onto the first one's results gives the same bits.
  const Vec dq1 = dq, dk1 = dk, dv1 = dv;
  cpu::ropeUnpackQkv(dq.data(), dk.data(), dv.data(), dqkv.data(), B, T, H, KV, hs, theta, posStart);
  VERIFY_BITWISE(dq, dq1);
  VERIFY_BITWISE(dk, dk1);
  VERIFY_BITWISE(dv, dv1);

  // Position posStart + t: the pack of positions [posStart, posStart + T) equals rows t of a pack from
  // position 0 over posStart + T positions (one batch element), up to the angle's fp32 rounding, which is
  // the same product here: bit for bit.
  if (B == 1 && posStart > 0) {
    const RopeShape full{1, posStart + T, H, KV, hs, theta, 0};
    const Vec fq = randomVec(rng, full.qSize()), fk = randomVec(rng, full.kvSize()),
              fv = randomVec(rng, full.kvSize());
    Vec whole(full.qkvSize()), tail(size_t(T) * 3 * H * hs);
    cpu::ropePackQkv(whole.data(), fq.data(), fk.data(), fv.data(), 1, posStart + T, H, KV, hs, theta, 0);
    cpu::ropePackQkv(tail.data(), fq.data() + size_t(posStart) * H * hs,
                     fk.data() + size_t(posStart) * KV * hs, fv.data() + size_t(posStart) * KV * hs, 1, T, H,
                     KV, hs, theta, posStart);
    const Vec wholeTail(whole.begin() + size_t(posStart) * 3 * H * hs, whole.end());
    VERIFY_BITWISE(tail, wholeTail);
  }
}

// The Llama pieces' parallel paths: the same bits for the same thread count; with another thread count the
// same bits for everything but RMSNorm's weight gradient (per-thread partials summed in thread order) and
// SwiGLU (element-wise, but which elements the vector loop or its remainder computes may move).
void TestKernels::llamaDeterministicThreads() {
  const int N = 512, C = 97, B = 4, T = 64, H = 8, KV = 2, hs = 16;
  const size_t n = 100003;
  std::mt19937 rng(kSeed + 23);
  const Vec inp = randomVec(rng, size_t(N) * C), dout = randomVec(rng, size_t(N) * C);
  const Vec w = randomVec(rng, C, 0.5f, 1.5f);
  const Vec gate = randomVec(rng, n, -6.0f, 6.0f), up = randomVec(rng, n), gdout = randomVec(rng, n);
  const RopeShape r{B, T, H, KV, hs, 10000.0f, 5};
  const Vec q = randomVec(rng, r.qSize()), k = randomVec(rng, r.kvSize()), v = randomVec(rng, r.kvSize());
  const Vec dqkv = randomVec(rng, r.qkvSize());
  struct Results {
    Vec out, rstd, dinp, dw, swiglu, dgate, dup, qkv, dq, dk, dv;
  };
  auto run = [&](int threads) {
    cpu::setThreads(threads);
    Results x;
    x.out.resize(inp.size()), x.rstd.resize(N);
    cpu::rmsNormForward(x.out.data(), x.rstd.data(), inp.data(), w.data(), N, C, 1e-5f);
    x.dinp.assign(inp.size(), 0.0f), x.dw.assign(C, 0.0f);
    cpu::rmsNormBackward(x.dinp.data(), x.dw.data(), dout.data(), inp.data(), w.data(), x.rstd.data(), N, C);
    x.swiglu.resize(n), x.dgate.assign(n, 0.0f), x.dup.assign(n, 0.0f);
    cpu::swigluForward(x.swiglu.data(), gate.data(), up.data(), n);
    cpu::swigluBackward(x.dgate.data(), x.dup.data(), gdout.data(), gate.data(), up.data(), n);
    x.qkv.resize(r.qkvSize()), x.dq.resize(r.qSize()), x.dk.resize(r.kvSize()), x.dv.resize(r.kvSize());
    cpu::ropePackQkv(x.qkv.data(), q.data(), k.data(), v.data(), B, T, H, KV, hs, r.theta, r.posStart);
    cpu::ropeUnpackQkv(x.dq.data(), x.dk.data(), x.dv.data(), dqkv.data(), B, T, H, KV, hs, r.theta,
                       r.posStart);
    return x;
  };
  const Results a = run(2), a2 = run(2), one = run(1);
  cpu::setThreads(2);
  for (auto field : {&Results::out, &Results::rstd, &Results::dinp, &Results::dw, &Results::swiglu,
                     &Results::dgate, &Results::dup, &Results::qkv, &Results::dq, &Results::dk, &Results::dv})
    VERIFY_BITWISE(a.*field, a2.*field);
  for (auto field : {&Results::out, &Results::rstd, &Results::dinp, &Results::qkv, &Results::dq, &Results::dk,
                     &Results::dv})
    VERIFY_BITWISE(a.*field, one.*field);
  VERIFY_CLOSE(a.dw.data(), one.dw.data(), C, 1e-5, 1e-5);
  VERIFY_CLOSE(a.swiglu.data(), one.swiglu.data(), n, 1e-7, 1e-6);
  VERIFY_CLOSE(a.dgate.data(), one.dgate.data(), n, 1e-7, 1e-6);
  VERIFY_CLOSE(a.dup.data(), one.dup.data(), n, 1e-7, 1e-6);
}

// ---- Mixture of experts
// --------------------------------------------------------------------------------

// Rows n gathered from a source of R rows (R < n: sources repeat), with and without a scale; n = 0 included.
void TestKernels::gatherRows_data() {
  QTest::addColumn<int>("n");
  QTest::addColumn<int>("C");
  QTest::addColumn<int>("R");
  QTest::addColumn<bool>("scaled");
  const int rows[][3] = {{0, 5, 3}, {1, 1, 1}, {7, 5, 3}, {33, 33, 40}, {64, 97, 17}, {300, 1000, 50}};
  for (const auto& r : rows)
    for (const bool scaled : {true, false})
      QTest::addRow("n=%d C=%d R=%d %s", r[0], r[1], r[2], scaled ? "scaled" : "unscaled")
          << r[0] << r[1] << r[2] << scaled;
}

void TestKernels::gatherRows() {
  QFETCH(int, n);
  QFETCH(int, C);
  QFETCH(int, R);
  QFETCH(bool, scaled);
  std::mt19937 rng(kSeed + 30);
  const Vec src = randomVec(rng, size_t(R) * C);  // (R, C)
  std::vector<int32_t> idx = randomTokens(rng, size_t(n), R);
  if (n >= 2) idx[1] = idx[0];  // a source row read twice, whatever the draw
  const Vec scale = randomVec(rng, size_t(n), -2.0f, 2.0f);
  // One row more than the op writes: NaN everywhere, the first n rows must be overwritten, the last not.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Vec dst(size_t(n + 1) * C, nan);
  cpu::gatherRows(dst.data(), src.data(), idx.data(), scaled ? scale.data() : nullptr, n, C);
  // Each element is one fp32 product (none unscaled): the exact double product rounded once, bit for bit.
  Vec ref(size_t(n) * C);
  for (int r = 0; r < n; r++)
    for (int c = 0; c < C; c++) {
      const double k = scaled ? double(scale[r]) : 1.0;
      ref[size_t(r) * C + c] = float(k * double(src[size_t(idx[r]) * C + c]));
    }
  const Vec written(dst.begin(), dst.begin() + ptrdiff_t(ref.size()));
  VERIFY_BITWISE(written, ref);
  for (size_t i = ref.size(); i < dst.size(); i++) QVERIFY2(std::isnan(dst[i]), "written past row n");
}

// n rows added into distinct rows of a destination of R rows (n = R: every row), twice onto random values,
// with and without a scale; n = 0 changes nothing.
void TestKernels::scatterAddRows_data() {
  QTest::addColumn<int>("n");
  QTest::addColumn<int>("C");
  QTest::addColumn<int>("R");
  QTest::addColumn<bool>("scaled");
  const int rows[][3] = {{0, 5, 4}, {1, 1, 1}, {7, 5, 7}, {7, 5, 20}, {33, 97, 40}, {300, 1000, 301}};
  for (const auto& r : rows)
    for (const bool scaled : {true, false})
      QTest::addRow("n=%d C=%d R=%d %s", r[0], r[1], r[2], scaled ? "scaled" : "unscaled")
          << r[0] << r[1] << r[2] << scaled;
}

void TestKernels::scatterAddRows() {
  QFETCH(int, n);
  QFETCH(int, C);
  QFETCH(int, R);
  QFETCH(bool, scaled);
  std::mt19937 rng(kSeed + 31);
  const Vec dst0 = randomVec(rng, size_t(R) * C);  // (R, C)
  const Vec src = randomVec(rng, size_t(n) * C);   // (n, C)
  const std::vector<int32_t> idx = distinctRows(rng, n, R);
  const Vec scale = randomVec(rng, size_t(n), -2.0f, 2.0f);
  Vec dst = dst0;
  for (int rep = 0; rep < 2; rep++)
    cpu::scatterAddRows(dst.data(), src.data(), idx.data(), scaled ? scale.data() : nullptr, n, C);
  // Accumulated: dst0 + 2 k src on the rows idx names (in double: each call rounds a product and a sum, or
  // one fused multiply-add); unscaled, exactly the fp32 sums (dst0 + src) + src. Every other row untouched.
  DVec ref = toDouble(dst0);
  Vec exact = dst0;
  std::vector<bool> touched(size_t(R), false);
  for (int r = 0; r < n; r++) {
    touched[size_t(idx[r])] = true;
    const double k = scaled ? double(scale[r]) : 1.0;
    for (int c = 0; c < C; c++) {
      const size_t d = size_t(idx[r]) * C + c, s = size_t(r) * C + c;
      ref[d] += 2.0 * k * double(src[s]);
      exact[d] = (exact[d] + src[s]) + src[s];
    }
  }
  VERIFY_CLOSE(dst.data(), ref.data(), dst.size(), 1e-6, 1e-6);
  if (!scaled) VERIFY_BITWISE(dst, exact);
  for (int row = 0; row < R; row++)
    if (!touched[size_t(row)])
      QVERIFY2(std::memcmp(&dst[size_t(row) * C], &dst0[size_t(row) * C], sizeof(float) * C) == 0,
               qPrintable(QStringLiteral("row %1 is not in idx but changed").arg(row)));
}

// Dot products of n rows of b with rows of a (R rows; sources repeat), C on both sides of 32 (the lane count
// of the sums) and large; n = 0 included.
void TestKernels::rowDots_data() {
  QTest::addColumn<int>("n");
  QTest::addColumn<int>("C");
  QTest::addColumn<int>("R");
  const int rows[][3] = {
      {0, 5, 3},    {1, 1, 1},    {7, 5, 3},     {33, 31, 10}, {33, 32, 10}, {33, 33, 10},
      {64, 97, 17}, {5, 4099, 3}, {3, 65537, 2}, {600, 64, 50}};  // the last: the parallel path (n C >= 2^14)
  for (const auto& r : rows) QTest::addRow("n=%d C=%d R=%d", r[0], r[1], r[2]) << r[0] << r[1] << r[2];
}

void TestKernels::rowDots() {
  QFETCH(int, n);
  QFETCH(int, C);
  QFETCH(int, R);
  std::mt19937 rng(kSeed + 32);
  const Vec a = randomVec(rng, size_t(R) * C);  // (R, C)
  Vec b = randomVec(rng, size_t(n) * C);        // (n, C)
  std::vector<int32_t> idx = randomTokens(rng, size_t(n), R);
  if (n >= 2) {  // rows 0 and 1: the same pair of rows, so the same sum
    idx[1] = idx[0];
    std::copy(b.begin(), b.begin() + C, b.begin() + C);
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Vec out(size_t(n) + 1, nan);  // overwritten, the one past n not
  cpu::rowDots(out.data(), a.data(), idx.data(), b.data(), n, C);
  // Against the double sum: an fp32 sum of C products is within a few ulps of sum |a b| (the terms' scale).
  for (int r = 0; r < n; r++) {
    double ref = 0.0, scale = 0.0;
    for (int c = 0; c < C; c++) {
      const double p = double(a[size_t(idx[r]) * C + c]) * double(b[size_t(r) * C + c]);
      ref += p;
      scale += std::fabs(p);
    }
    const double err = std::fabs(double(out[r]) - ref);
    QVERIFY2(err <= 1e-6 * scale, qPrintable(QStringLiteral("row %1 of %2: got %3, expected %4 (sum |ab| %5)")
                                                 .arg(r)
                                                 .arg(n)
                                                 .arg(double(out[r]), 0, 'g', 9)
                                                 .arg(ref, 0, 'g', 9)
                                                 .arg(scale, 0, 'g', 3)));
  }
  QVERIFY2(std::isnan(out[size_t(n)]), "written past row n");
  if (n >= 2) QCOMPARE(out[1], out[0]);
  // Overwritten, not accumulated: a second call onto the first one's results gives the same bits.
  const Vec first = out;
  cpu::rowDots(out.data(), a.data(), idx.data(), b.data(), n, C);
  QVERIFY(std::memcmp(out.data(), first.data(), sizeof(float) * size_t(n)) == 0);
}

// The three ops are parallel over rows, each row computed alike whoever computes it: the same bits with one
// thread and with two.
void TestKernels::moeDeterministicThreads() {
  const int N = 500, C = 97, n = 1000;  // 1000 x 97 >= 2^14: the parallel paths
  std::mt19937 rng(kSeed + 33);
  const Vec x = randomVec(rng, size_t(N) * C), y = randomVec(rng, size_t(n) * C);
  const Vec sum0 = randomVec(rng, size_t(N) * C), gates = randomVec(rng, size_t(n), 0.0f, 1.0f);
  std::vector<int32_t> idx = distinctRows(rng, N, N), second = distinctRows(rng, N, N);
  idx.insert(idx.end(), second.begin(), second.end());  // every token twice
  struct Results {
    Vec gathered, sum, dots;
  };
  auto run = [&](int threads) {
    cpu::setThreads(threads);
    Results r;
    r.gathered.resize(y.size());
    cpu::gatherRows(r.gathered.data(), x.data(), idx.data(), gates.data(), n, C);
    r.sum = sum0;
    for (int k = 0; k < 2; k++)  // one call a slot: distinct rows within each
      cpu::scatterAddRows(r.sum.data(), y.data() + size_t(k) * N * C, idx.data() + size_t(k) * N,
                          gates.data() + size_t(k) * N, N, C);
    r.dots.resize(size_t(n));
    cpu::rowDots(r.dots.data(), x.data(), idx.data(), y.data(), n, C);
    return r;
  };
  const Results a = run(2), one = run(1);
  cpu::setThreads(2);
  for (auto field : {&Results::gathered, &Results::sum, &Results::dots}) VERIFY_BITWISE(a.*field, one.*field);
}

// ---- Pointwise
// ---------------------------------------------------------------------------------------------

void TestKernels::pointwise_data() {
  QTest::addColumn<QString>("op");
  QTest::addColumn<int>("n");
  for (const QString op : {"gelu", "relu", "tanh"})
    for (int n : {1, 7, 33, 1000, 100003})
      QTest::newRow(qPrintable(QStringLiteral("%1 n=%2").arg(op).arg(n))) << op << n;
}

void TestKernels::pointwise() {
  QFETCH(QString, op);
  QFETCH(int, n);
  std::mt19937 rng(kSeed + 3);
  Vec inp = randomVec(rng, n, -6.0f, 6.0f);
  if (n >= 7) {  // the tails and the region around 0 where the approximations switch branches
    inp[0] = -30.0f, inp[1] = 30.0f, inp[2] = 1e-4f, inp[3] = -0.62f, inp[4] = 0.63f;
  }
  if (op == "relu")  // keep finite differences away from the kink
    for (float& x : inp)
      if (std::fabs(x) < 1e-3f) x = 0.5f;
  const Vec dout = randomVec(rng, n);
  const Vec dinp0 = randomVec(rng, n);

  std::function<double(double)> f;
  if (op == "gelu") f = refGelu;
  if (op == "relu") f = [](double x) { return x > 0.0 ? x : 0.0; };
  if (op == "tanh") f = [](double x) { return std::tanh(x); };

  Vec out(n);
  if (op == "gelu") cpu::geluForward(out.data(), inp.data(), n);
  if (op == "relu") cpu::reluForward(out.data(), inp.data(), n);
  if (op == "tanh") cpu::tanhForward(out.data(), inp.data(), n);
  DVec ref(n), rgrad(n);
  for (int i = 0; i < n; i++) {
    const double x = inp[i], h = 1e-6;
    ref[i] = f(x);
    rgrad[i] = double(dout[i]) * (f(x + h) - f(x - h)) / (2.0 * h);  // finite differences, per element
  }
  VERIFY_CLOSE(out.data(), ref.data(), n, 1e-6, 1e-5);

  // Backward twice onto random initial values: dinp0 + 2 * dout * f'(x).
  Vec dinp = dinp0;
  for (int rep = 0; rep < 2; rep++) {
    if (op == "gelu") cpu::geluBackward(dinp.data(), dout.data(), inp.data(), n);
    if (op == "relu") cpu::reluBackward(dinp.data(), dout.data(), inp.data(), n);
    if (op == "tanh") cpu::tanhBackward(dinp.data(), dout.data(), out.data(), n);  // tanh takes the output
  }
  VERIFY_CLOSE(dinp.data(), plusTimes(dinp0, rgrad, 2).data(), n, 1e-5, 1e-4);
}

void TestKernels::addAccumulateScale_data() {
  QTest::addColumn<int>("n");
  for (int n : {1, 7, 33, 100003}) QTest::addRow("n=%d", n) << n;
}

void TestKernels::addAccumulateScale() {
  QFETCH(int, n);
  std::mt19937 rng(kSeed + 4);
  const Vec a = randomVec(rng, n), b = randomVec(rng, n);
  Vec sum(n), ref(n);
  for (int i = 0; i < n; i++) ref[i] = a[i] + b[i];  // float is exact enough: one rounding either way
  cpu::add(sum.data(), a.data(), b.data(), n);
  VERIFY_CLOSE(sum.data(), ref.data(), n, 0.0, 0.0);
  Vec aliasA = a;  // out == a
  cpu::add(aliasA.data(), aliasA.data(), b.data(), n);
  VERIFY_CLOSE(aliasA.data(), ref.data(), n, 0.0, 0.0);
  Vec aliasB = b;  // out == b
  cpu::add(aliasB.data(), a.data(), aliasB.data(), n);
  VERIFY_CLOSE(aliasB.data(), ref.data(), n, 0.0, 0.0);

  Vec y = a;
  cpu::accumulate(y.data(), b.data(), n);
  cpu::accumulate(y.data(), b.data(), n);
  for (int i = 0; i < n; i++) ref[i] = (a[i] + b[i]) + b[i];
  VERIFY_CLOSE(y.data(), ref.data(), n, 0.0, 0.0);

  y = a;
  cpu::scale(y.data(), -0.37f, n);
  for (int i = 0; i < n; i++) ref[i] = a[i] * -0.37f;
  VERIFY_CLOSE(y.data(), ref.data(), n, 0.0, 0.0);
}

// ---- Attention
// ---------------------------------------------------------------------------------------------

// B, T, C, H of attention's rows (and attentionBlock's). T = 65 and 130 cross the kernel's 64-row causal
// blocks.
constexpr int kAttentionShapes[][4] = {{1, 1, 4, 1},   {2, 3, 6, 3},    {1, 17, 12, 3}, {3, 7, 5, 1},
                                       {2, 65, 24, 3}, {1, 130, 16, 1}, {4, 33, 64, 4}};

void TestKernels::attention_data() {
  QTest::addColumn<int>("B");
  QTest::addColumn<int>("T");
  QTest::addColumn<int>("C");
  QTest::addColumn<int>("H");
  QTest::addColumn<bool>("causal");
  for (const auto& s : kAttentionShapes)
    for (bool causal : {true, false})
      QTest::addRow("B=%d T=%d C=%d H=%d %s", s[0], s[1], s[2], s[3], causal ? "causal" : "bidirectional")
          << s[0] << s[1] << s[2] << s[3] << causal;
}

void TestKernels::attention() {
  QFETCH(int, B);
  QFETCH(int, T);
  QFETCH(int, C);
  QFETCH(int, H);
  QFETCH(bool, causal);
  std::mt19937 rng(kSeed + 5);
  const Vec qkv = randomVec(rng, size_t(B) * T * 3 * C, -2.0f, 2.0f);  // (B, T, 3C)
  const Vec dout = randomVec(rng, size_t(B) * T * C);                  // (B, T, C)
  const size_t attSize = size_t(B) * H * T * T;

  Vec out(size_t(B) * T * C), att(attSize, std::numeric_limits<float>::quiet_NaN());
  cpu::attentionForward(out.data(), att.data(), qkv.data(), B, T, C, H, causal);
  const AttentionRef ref = refAttention(toDouble(qkv), B, T, C, H, causal);
  VERIFY_CLOSE(out.data(), ref.out.data(), out.size(), 1e-5, 1e-4);
  VERIFY_CLOSE(att.data(), ref.att.data(), attSize, 1e-6, 1e-4);
  if (causal) {  // masked entries are exact zeros (att was NaN before the call)
    bool zeros = true;
    for (size_t bh = 0; bh < size_t(B) * H; bh++)
      for (int i = 0; i < T; i++)
        for (int j = i + 1; j < T; j++) zeros = zeros && att[(bh * T + i) * T + j] == 0.0f;
    QVERIFY(zeros);
  }

  const DVec rdqkv = refAttentionBackward(toDouble(dout), toDouble(qkv), B, T, C, H, causal);
  Vec scratch(attSize, std::numeric_limits<float>::quiet_NaN());  // contents on entry must not matter
  Vec dqkv(qkv.size(), 0.0f);
  cpu::attentionBackward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C, H,
                         causal);
  VERIFY_CLOSE(dqkv.data(), rdqkv.data(), dqkv.size(), 1e-5, 1e-4);

  if (qkv.size() * size_t(T) * C <= 200000) {  // the naive backward itself, against finite differences
    DVec x = toDouble(qkv);
    auto f = [&] { return refAttention(x, B, T, C, H, causal).out; };
    VERIFY_CLOSE(dqkv.data(), finiteDifference(x, toDouble(dout), f).data(), dqkv.size(), 1e-5, 1e-4);
  }

  const Vec dqkv0 = randomVec(rng, qkv.size());
  dqkv = dqkv0;
  for (int rep = 0; rep < 2; rep++)
    cpu::attentionBackward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C, H,
                           causal);
  VERIFY_CLOSE(dqkv.data(), plusTimes(dqkv0, rdqkv, 2).data(), dqkv.size(), 1e-5, 1e-4);
}

void TestKernels::attentionCausality() {
  // Changing q, k, v at positions > t must leave out[:, 0..t] bit-identical under the causal mask, and must
  // change it without the mask (so the check can fail).
  const int B = 2, T = 70, C = 12, H = 3, t = 40;
  std::mt19937 rng(kSeed + 6);
  const Vec qkv = randomVec(rng, size_t(B) * T * 3 * C);  // (B, T, 3C)
  Vec changed = qkv;
  for (int b = 0; b < B; b++)
    for (int i = t + 1; i < T; i++)
      for (int c = 0; c < 3 * C; c++) changed[(size_t(b) * T + i) * 3 * C + c] += 0.5f;
  for (bool causal : {true, false}) {
    Vec out1(size_t(B) * T * C), out2(out1.size()), att(size_t(B) * H * T * T);
    cpu::attentionForward(out1.data(), att.data(), qkv.data(), B, T, C, H, causal);
    cpu::attentionForward(out2.data(), att.data(), changed.data(), B, T, C, H, causal);
    bool same = true;
    for (int b = 0; b < B; b++)
      same = same && std::memcmp(out1.data() + size_t(b) * T * C, out2.data() + size_t(b) * T * C,
                                 sizeof(float) * size_t(t + 1) * C) == 0;
    QCOMPARE(same, causal);
  }
}

// ---- Ring attention (context parallelism)
// ---------------------------------------------------------------

void TestKernels::attentionBlock_data() {
  QTest::addColumn<int>("B");
  QTest::addColumn<int>("T");
  QTest::addColumn<int>("C");
  QTest::addColumn<int>("H");
  QTest::addColumn<int>("KV");
  QTest::addColumn<bool>("causal");
  auto add = [](int B, int T, int C, int H, int KV, bool causal) {
    QTest::addRow("B=%d T=%d C=%d H=%d KV=%d %s", B, T, C, H, KV, causal ? "causal" : "bidirectional")
        << B << T << C << H << KV << causal;
  };
  for (const auto& s : kAttentionShapes)  // attention's rows, KV = H
    for (bool causal : {true, false}) add(s[0], s[1], s[2], s[3], s[3], causal);
  // Grouped-query attention: 4 query heads over 1, 2 or 4 key/value heads (hs 8 and 16, T across 64).
  const int gqa[][3] = {{2, 17, 32}, {1, 65, 64}};
  for (const auto& s : gqa)
    for (int KV : {1, 2, 4})
      for (bool causal : {true, false}) add(s[0], s[1], s[2], 4, KV, causal);
}

// One block holding every key, positions 0, 1, ... on both sides: plain attention. The block's kv (B, T,
// 2 KV hs) against the full attention of a q|k|v whose k and v heads are its heads repeated (withKvHeads;
// with KV = H, kv is qkv's own k | v columns). out is attentionForward's, lse the log-sum-exp of the double
// reference, and the backward's dq | dkv attentionBackward's dqkv with the k and v heads of each group summed
// (kvGroupGrad; with KV = H, dqkv as it is).
void TestKernels::attentionBlock() {
  QFETCH(int, B);
  QFETCH(int, T);
  QFETCH(int, C);
  QFETCH(int, H);
  QFETCH(int, KV);
  QFETCH(bool, causal);
  const int Ckv = KV * (C / H);
  std::mt19937 rng(kSeed + 40);
  Vec qkv = randomVec(rng, size_t(B) * T * 3 * C, -2.0f, 2.0f);  // (B, T, 3C)
  const Vec dout = randomVec(rng, size_t(B) * T * C);            // (B, T, C)
  const Vec kv = KV == H ? kvRows(qkv, B, T, C)                  // (B, T, 2 Ckv)
                         : randomVec(rng, size_t(B) * T * 2 * Ckv, -2.0f, 2.0f);
  qkv = withKvHeads(qkv, kv, B, T, C, H, KV);
  const size_t n = size_t(B) * T * C;
  const size_t nKv = size_t(B) * T * 2 * Ckv;
  const ms::SeqPositions plain{0, 0, 0};

  Vec out(n, std::numeric_limits<float>::quiet_NaN()), lse(size_t(B) * H * T, 1e30f);  // first overwrites
  cpu::attentionBlockForward(out.data(), lse.data(), qkv.data(), kv.data(), B, T, T, C, H, KV, plain, plain,
                             causal, true);
  Vec ref(n), att(size_t(B) * H * T * T);
  cpu::attentionForward(ref.data(), att.data(), qkv.data(), B, T, C, H, causal);
  VERIFY_CLOSE(out.data(), ref.data(), n, 1e-5, 1e-5);
  const DVec rlse = refAttentionLse(toDouble(qkv), B, T, C, H, causal);
  VERIFY_CLOSE(lse.data(), rlse.data(), lse.size(), 1e-5, 1e-5);

  Vec dqkv(3 * n, 0.0f), dkv(nKv, 0.0f);
  cpu::attentionBlockBackward(dqkv.data(), dkv.data(), dout.data(), qkv.data(), kv.data(), out.data(),
                              lse.data(), B, T, T, C, H, KV, plain, plain, causal);
  const int W = C + 2 * Ckv;  // dq | dkv
  Vec got(size_t(B) * T * W);
  for (size_t row = 0; row < size_t(B) * T; row++) {
    for (int c = C; c < 3 * C; c++) QCOMPARE(dqkv[row * 3 * C + c], 0.0f);  // k and v parts not touched
    std::copy_n(dqkv.data() + row * 3 * C, C, got.data() + row * W);
    std::copy_n(dkv.data() + row * 2 * Ckv, 2 * Ckv, got.data() + row * W + C);
  }
  Vec rdqkv(3 * n, 0.0f), scratch(att.size());
  cpu::attentionBackward(rdqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C, H,
                         causal);
  const Vec rgot = kvGroupGrad(rdqkv, B, T, C, H, KV);
  VERIFY_CLOSE(got.data(), rgot.data(), got.size(), 1e-4, 1e-4);
  const DVec ddqkv = refAttentionBackward(toDouble(dout), toDouble(qkv), B, T, C, H, causal);
  const DVec dgot = kvGroupGrad(ddqkv, B, T, C, H, KV);
  VERIFY_CLOSE(got.data(), dgot.data(), got.size(), 1e-5, 1e-4);
}

void TestKernels::ringAttention_data() {
  QTest::addColumn<int>("cp");
  QTest::addColumn<int>("chunk");
  QTest::addColumn<int>("KV");
  QTest::addColumn<bool>("causal");
  for (int KV : {4, 2, 1})
    for (int cp : {2, 3})
      for (int chunk : {5, 8})
        for (bool causal : {true, false})
          QTest::addRow("cp=%d chunk=%d KV=%d %s", cp, chunk, KV, causal ? "causal" : "bidirectional")
              << cp << chunk << KV << causal;
}

// The blocks of cp ranks in the load-balanced layout (cpuRing) assemble full attention: out and dqkv as
// attentionForward / attentionBackward give them on the whole sequence, lse as the double reference. With
// KV < H (4 query heads) the ring passes the KV heads of kv and the full attention runs on their repeated
// copies (withKvHeads), its k and v gradients summed per group (kvGroupGrad).
void TestKernels::ringAttention() {
  QFETCH(int, cp);
  QFETCH(int, chunk);
  QFETCH(int, KV);
  QFETCH(bool, causal);
  const int B = 2, C = 32, H = 4, T = 2 * cp * chunk, Ckv = KV * (C / H);
  std::mt19937 rng(kSeed + 41);
  Vec qkv = randomVec(rng, size_t(B) * T * 3 * C, -2.0f, 2.0f);
  const Vec dout = randomVec(rng, size_t(B) * T * C);
  const Vec kv = KV == H ? kvRows(qkv, B, T, C) : randomVec(rng, size_t(B) * T * 2 * Ckv, -2.0f, 2.0f);
  qkv = withKvHeads(qkv, kv, B, T, C, H, KV);
  const RingResult ring = cpuRing(qkv, kv, dout, B, C, H, KV, cp, chunk, causal);

  Vec out(size_t(B) * T * C), att(size_t(B) * H * T * T);
  cpu::attentionForward(out.data(), att.data(), qkv.data(), B, T, C, H, causal);
  VERIFY_CLOSE(ring.out.data(), out.data(), out.size(), 1e-5, 1e-5);
  const DVec rlse = refAttentionLse(toDouble(qkv), B, T, C, H, causal);
  VERIFY_CLOSE(ring.lse.data(), rlse.data(), rlse.size(), 1e-5, 1e-5);
  Vec dqkv(qkv.size(), 0.0f), scratch(att.size());
  cpu::attentionBackward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C, H,
                         causal);
  const Vec rgrad = kvGroupGrad(dqkv, B, T, C, H, KV);
  QCOMPARE(ring.dqkv.size(), rgrad.size());
  VERIFY_CLOSE(ring.dqkv.data(), rgrad.data(), rgrad.size(), 1e-4, 1e-4);
  QVERIFY(ring.kvUntouched);
}

// Rows that see no key of a block under the causal mask: a merge (first = false) leaves their out and lse
// bit for bit, first = true writes out 0 and lse -inf; their backward adds nothing. Rows 0, 1 sit at
// positions 0, 1 and rows 2, 3 at 20, 21; the keys at 10, 11, 12 are visible to rows 2, 3 only.
void TestKernels::attentionBlockNoVisibleKey_data() {
  QTest::addColumn<int>("KV");
  QTest::newRow("KV=2") << 2;  // plain multi-head
  QTest::newRow("KV=1") << 1;  // both query heads on one key/value head
}

void TestKernels::attentionBlockNoVisibleKey() {
  QFETCH(int, KV);
  const int B = 2, Tq = 4, Tk = 3, C = 8, H = 2;
  const ms::SeqPositions qpos{0, 2, 20}, kpos{0, 0, 10}, early{0, 0, 0};
  std::mt19937 rng(kSeed + 42);
  const Vec qkv = randomVec(rng, size_t(B) * Tq * 3 * C, -2.0f, 2.0f);
  const Vec kv = randomVec(rng, size_t(B) * Tk * 2 * KV * (C / H), -2.0f, 2.0f);
  const Vec out0 = randomVec(rng, size_t(B) * Tq * C);
  const Vec lse0 = randomVec(rng, size_t(B) * H * Tq, 0.0f, 3.0f);
  auto rowOf = [&](size_t i, int width) { return int(i / width) % Tq; };  // (B, Tq, width) -> t
  auto lseRow = [&](size_t i) { return int(i % Tq); };                    // (B, H, Tq) -> t

  // Merge: rows 0, 1 unchanged bit for bit, rows 2, 3 changed.
  Vec out = out0, lse = lse0;
  cpu::attentionBlockForward(out.data(), lse.data(), qkv.data(), kv.data(), B, Tq, Tk, C, H, KV, qpos, kpos,
                             true, false);
  for (size_t i = 0; i < out.size(); i++) {
    if (rowOf(i, C) < 2)
      QVERIFY(std::memcmp(&out[i], &out0[i], sizeof(float)) == 0);
    else
      QVERIFY(std::isfinite(out[i]) && out[i] != out0[i]);
  }
  for (size_t i = 0; i < lse.size(); i++) {
    if (lseRow(i) < 2)
      QVERIFY(std::memcmp(&lse[i], &lse0[i], sizeof(float)) == 0);
    else
      QVERIFY(std::isfinite(lse[i]) && lse[i] > lse0[i]);  // logaddexp grows
  }
  // A block no query sees (every key after every query): nothing changes.
  out = out0;
  lse = lse0;
  cpu::attentionBlockForward(out.data(), lse.data(), qkv.data(), kv.data(), B, Tq, Tk, C, H, KV, early, kpos,
                             true, false);
  VERIFY_BITWISE(out, out0);
  VERIFY_BITWISE(lse, lse0);
  // Without the mask every row takes the block.
  cpu::attentionBlockForward(out.data(), lse.data(), qkv.data(), kv.data(), B, Tq, Tk, C, H, KV, qpos, kpos,
                             false, false);
  for (size_t i = 0; i < lse.size(); i++) QVERIFY(lse[i] > lse0[i]);

  // First: rows 0, 1 get out 0 and lse -inf (out was NaN), rows 2, 3 the block's own softmax.
  out.assign(out0.size(), std::numeric_limits<float>::quiet_NaN());
  lse.assign(lse0.size(), std::numeric_limits<float>::quiet_NaN());
  cpu::attentionBlockForward(out.data(), lse.data(), qkv.data(), kv.data(), B, Tq, Tk, C, H, KV, qpos, kpos,
                             true, true);
  for (size_t i = 0; i < out.size(); i++)
    QVERIFY(rowOf(i, C) < 2 ? floatBits(out[i]) == 0u : std::isfinite(out[i]));
  for (size_t i = 0; i < lse.size(); i++)
    QVERIFY(lseRow(i) < 2 ? lse[i] == -std::numeric_limits<float>::infinity() : std::isfinite(lse[i]));

  // Backward from that out and lse: rows 0, 1 (lse -inf) add nothing; dqkv's k and v parts are not touched.
  const Vec dout = randomVec(rng, size_t(B) * Tq * C);
  const Vec dqkv0 = randomVec(rng, qkv.size()), dkv0 = randomVec(rng, kv.size());
  Vec dqkv = dqkv0, dkv = dkv0;
  cpu::attentionBlockBackward(dqkv.data(), dkv.data(), dout.data(), qkv.data(), kv.data(), out.data(),
                              lse.data(), B, Tq, Tk, C, H, KV, qpos, kpos, true);
  for (size_t i = 0; i < dqkv.size(); i++) {
    const bool q = i % (3 * C) < size_t(C);
    if (q && rowOf(i, 3 * C) >= 2)
      QVERIFY(dqkv[i] != dqkv0[i]);
    else
      QVERIFY(std::memcmp(&dqkv[i], &dqkv0[i], sizeof(float)) == 0);
  }
  for (size_t i = 0; i < dkv.size(); i++) QVERIFY(dkv[i] != dkv0[i]);
  // A block no query sees adds nothing, even with finite lse.
  dqkv = dqkv0;
  dkv = dkv0;
  cpu::attentionBlockBackward(dqkv.data(), dkv.data(), dout.data(), qkv.data(), kv.data(), out0.data(),
                              lse0.data(), B, Tq, Tk, C, H, KV, early, kpos, true);
  VERIFY_BITWISE(dqkv, dqkv0);
  VERIFY_BITWISE(dkv, dkv0);
}

// ---- Embeddings
// --------------------------------------------------------------------------------------------

void TestKernels::embedding_data() {
  QTest::addColumn<int>("B");
  QTest::addColumn<int>("T");
  QTest::addColumn<int>("C");
  QTest::addColumn<int>("V");
  // The last shape is large enough for the parallel path (B*T*C >= 2^20).
  const int shapes[][4] = {{1, 1, 1, 2},     {2, 3, 5, 2},    {3, 17, 64, 11},
                           {4, 33, 97, 300}, {8, 64, 97, 11}, {16, 64, 1040, 300}};
  for (const auto& s : shapes)
    QTest::addRow("B=%d T=%d C=%d V=%d", s[0], s[1], s[2], s[3]) << s[0] << s[1] << s[2] << s[3];
}

void TestKernels::embedding() {
  QFETCH(int, B);
  QFETCH(int, T);
  QFETCH(int, C);
  QFETCH(int, V);
  const int maxT = T + 3;
  std::mt19937 rng(kSeed + 7);
  const std::vector<int32_t> tokens = randomTokens(rng, size_t(B) * T, V);  // (B, T); V small: repeats
  const Vec wte = randomVec(rng, size_t(V) * C), wpe = randomVec(rng, size_t(maxT) * C);
  const Vec dout = randomVec(rng, size_t(B) * T * C);  // (B, T, C)

  Vec out(size_t(B) * T * C);
  cpu::embeddingForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  DVec ref(out.size()), rdwte(wte.size(), 0.0), rdwpe(wpe.size(), 0.0);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++) {
        const size_t i = (size_t(b) * T + t) * C + c;
        const size_t tok = size_t(tokens[size_t(b) * T + t]);
        ref[i] = double(wte[tok * C + c]) + double(wpe[size_t(t) * C + c]);
        rdwte[tok * C + c] += dout[i];
        rdwpe[size_t(t) * C + c] += dout[i];
      }
  VERIFY_CLOSE(out.data(), ref.data(), out.size(), 1e-7, 1e-7);

  const Vec dwte0 = randomVec(rng, wte.size()), dwpe0 = randomVec(rng, wpe.size());
  Vec dwte = dwte0, dwpe = dwpe0;
  for (int rep = 0; rep < 2; rep++)
    cpu::embeddingBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  VERIFY_CLOSE(dwte.data(), plusTimes(dwte0, rdwte, 2).data(), dwte.size(), 1e-5, 1e-5);
  VERIFY_CLOSE(dwpe.data(), plusTimes(dwpe0, rdwpe, 2).data(), dwpe.size(), 1e-5, 1e-5);

  std::fill(dwte.begin(), dwte.end(), 0.0f);
  cpu::embeddingBackward(dwte.data(), nullptr, dout.data(), tokens.data(), B, T, C);
  VERIFY_CLOSE(dwte.data(), rdwte.data(), dwte.size(), 1e-5, 1e-5);
  std::fill(dwpe.begin(), dwpe.end(), 0.0f);
  cpu::embeddingBackward(nullptr, dwpe.data(), dout.data(), tokens.data(), B, T, C);
  VERIFY_CLOSE(dwpe.data(), rdwpe.data(), dwpe.size(), 1e-5, 1e-5);
}

// ---- Loss
// --------------------------------------------------------------------------------------------------

void TestKernels::crossEntropy_data() {
  QTest::addColumn<int>("N");
  QTest::addColumn<int>("V");
  QTest::addColumn<bool>("alias");
  const int shapes[][2] = {{1, 1}, {1, 2}, {7, 11}, {33, 300}, {64, 1001}};
  for (const auto& s : shapes)
    for (bool alias : {false, true})
      QTest::addRow("N=%d V=%d%s", s[0], s[1], alias ? " in place" : "") << s[0] << s[1] << alias;
}

void TestKernels::crossEntropy() {
  QFETCH(int, N);
  QFETCH(int, V);
  QFETCH(bool, alias);
  const float gradScale = 0.37f;
  std::mt19937 rng(kSeed + 8);
  const Vec logits = randomVec(rng, size_t(N) * V, -4.0f, 4.0f);  // (N, V)
  std::vector<int32_t> targets = randomTokens(rng, N, V);         // (N)
  for (int n = 3; n < N; n += 4) targets[n] = -1;                 // ignored rows
  if (N >= 7) targets[N - 1] = -100;

  const DVec rloss = refCrossEntropy(toDouble(logits), targets, N, V);
  DVec rgrad(logits.size(), 0.0);  // gradScale * (softmax - onehot), 0 on ignored rows
  for (int n = 0; n < N; n++) {
    if (targets[n] < 0) continue;
    const float* x = logits.data() + size_t(n) * V;
    const double m = *std::max_element(x, x + V);
    double s = 0.0;
    for (int j = 0; j < V; j++) s += std::exp(x[j] - m);
    for (int j = 0; j < V; j++)
      rgrad[size_t(n) * V + j] = gradScale * (std::exp(x[j] - m) / s - (j == targets[n] ? 1.0 : 0.0));
  }

  Vec losses(N, std::numeric_limits<float>::quiet_NaN());
  Vec buffer = logits;  // logits, and dlogits too when aliased
  Vec dlogits(logits.size(), std::numeric_limits<float>::quiet_NaN());
  float* d = alias ? buffer.data() : dlogits.data();
  cpu::softmaxCrossEntropy(losses.data(), d, buffer.data(), targets.data(), N, V, gradScale);
  VERIFY_CLOSE(losses.data(), rloss.data(), N, 1e-5, 1e-5);
  VERIFY_CLOSE(d, rgrad.data(), rgrad.size(), 1e-6, 1e-4);

  if (N * V <= 100) {  // the analytic gradient itself, against finite differences of gradScale * sum(losses)
    DVec x = toDouble(logits);
    auto f = [&] { return refCrossEntropy(x, targets, N, V); };
    const DVec fd = finiteDifference(x, DVec(N, double(gradScale)), f);
    VERIFY_CLOSE(d, fd.data(), fd.size(), 1e-6, 1e-4);
  }

  // No gradient wanted: losses only, logits untouched.
  Vec untouched = logits;
  cpu::softmaxCrossEntropy(losses.data(), nullptr, untouched.data(), targets.data(), N, V, gradScale);
  VERIFY_CLOSE(losses.data(), rloss.data(), N, 1e-5, 1e-5);
  VERIFY_BITWISE(untouched, logits);
}

void TestKernels::crossEntropyLargeLogits() {
  const int N = 3, V = 5;
  Vec logits = {1e4f,  -1e4f, 0.0f,  3.0f,  1e4f,   //
                -1e4f, -1e4f, -1e4f, -1e4f, -1e4f,  //
                2e4f,  0.0f,  0.0f,  0.0f,  0.0f};
  const std::vector<int32_t> targets = {1, 2, 0};
  Vec losses(N), dlogits(logits.size());
  cpu::softmaxCrossEntropy(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V, 1.0f);
  // Row 0: two maxima at 1e4, target at -1e4: loss = 2e4 + log 2. Row 1: uniform, log 5. Row 2: 0.
  const double rloss[] = {2e4 + std::log(2.0), std::log(5.0), 0.0};
  VERIFY_CLOSE(losses.data(), rloss, N, 1e-5, 1e-6);
  const double rgrad[] = {0.5, -1.0, 0.0, 0.0, 0.5, 0.2, 0.2, -0.8, 0.2, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0};
  VERIFY_CLOSE(dlogits.data(), rgrad, dlogits.size(), 1e-6, 1e-5);
}

void TestKernels::argmax_data() {
  QTest::addColumn<int>("N");
  QTest::addColumn<int>("V");
  const int shapes[][2] = {{1, 1}, {7, 2}, {33, 11}, {64, 1001}};
  for (const auto& s : shapes) QTest::addRow("N=%d V=%d", s[0], s[1]) << s[0] << s[1];
}

void TestKernels::argmax() {
  QFETCH(int, N);
  QFETCH(int, V);
  std::mt19937 rng(kSeed + 9);
  Vec x = randomVec(rng, size_t(N) * V);
  for (int n = 0; n < N; n += 2)  // ties: the first maximum wins
    for (int j = 0; j < V; j += 3) x[size_t(n) * V + j] = 2.0f;
  std::vector<int32_t> out(N, -7);
  cpu::argmaxRows(out.data(), x.data(), N, V);
  for (int n = 0; n < N; n++) {
    const float* row = x.data() + size_t(n) * V;
    QCOMPARE(out[n], int32_t(std::max_element(row, row + V) - row));
  }
}

// ---- Vision transformer pieces
// -----------------------------------------------------------------------------

void TestKernels::patchify_data() {
  QTest::addColumn<int>("B");
  QTest::addColumn<int>("S");
  QTest::addColumn<int>("P");
  const int shapes[][3] = {{1, 1, 1}, {2, 6, 3}, {3, 28, 7}, {2, 28, 4}, {1, 15, 15}};
  for (const auto& s : shapes) QTest::addRow("B=%d S=%d P=%d", s[0], s[1], s[2]) << s[0] << s[1] << s[2];
}

void TestKernels::patchify() {
  QFETCH(int, B);
  QFETCH(int, S);
  QFETCH(int, P);
  std::mt19937 rng(kSeed + 10);
  const Vec images = randomVec(rng, size_t(B) * S * S);  // (B, S, S)
  const int G = S / P, NP = G * G;
  Vec patches(size_t(B) * NP * P * P, std::numeric_limits<float>::quiet_NaN());  // (B, NP, P*P)
  cpu::patchify(patches.data(), images.data(), B, S, P);
  Vec ref(patches.size());
  for (int b = 0; b < B; b++)
    for (int y = 0; y < S; y++)
      for (int x = 0; x < S; x++) {
        const int p = (y / P) * G + x / P, i = (y % P) * P + x % P;
        ref[(size_t(b) * NP + p) * P * P + i] = images[(size_t(b) * S + y) * S + x];
      }
  VERIFY_BITWISE(patches, ref);
}

void TestKernels::tokens_data() {
  QTest::addColumn<int>("B");
  QTest::addColumn<int>("NP");
  QTest::addColumn<int>("C");
  QTest::addColumn<bool>("cls");
  const int shapes[][3] = {{1, 1, 1}, {2, 4, 5}, {3, 16, 64}, {8, 49, 97}};
  for (const auto& s : shapes)
    for (bool cls : {true, false})
      QTest::addRow("B=%d NP=%d C=%d%s", s[0], s[1], s[2], cls ? " cls" : "") << s[0] << s[1] << s[2] << cls;
}

void TestKernels::tokens() {
  QFETCH(int, B);
  QFETCH(int, NP);
  QFETCH(int, C);
  QFETCH(bool, cls);
  const int T = NP + (cls ? 1 : 0);
  std::mt19937 rng(kSeed + 11);
  const Vec x = randomVec(rng, size_t(B) * NP * C), clsToken = randomVec(rng, C),
            pos = randomVec(rng, size_t(T) * C);
  const Vec dout = randomVec(rng, size_t(B) * T * C);  // (B, T, C)

  Vec out(size_t(B) * T * C);
  cpu::tokensForward(out.data(), x.data(), cls ? clsToken.data() : nullptr, pos.data(), B, NP, C, cls);
  Vec ref(out.size());
  DVec rdx(x.size(), 0.0), rdcls(C, 0.0), rdpos(pos.size(), 0.0);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++) {
        const bool isCls = cls && t == 0;
        const size_t xi = (size_t(b) * NP + (t - (cls ? 1 : 0))) * C + c;
        const size_t o = (size_t(b) * T + t) * C + c;
        ref[o] = (isCls ? clsToken[c] : x[xi]) + pos[size_t(t) * C + c];
        (isCls ? rdcls[c] : rdx[xi]) += dout[o];
        rdpos[size_t(t) * C + c] += dout[o];
      }
  VERIFY_BITWISE(out, ref);

  const Vec dx0 = randomVec(rng, x.size()), dcls0 = randomVec(rng, C), dpos0 = randomVec(rng, pos.size());
  Vec dx = dx0, dcls = dcls0, dpos = dpos0;
  for (int rep = 0; rep < 2; rep++)
    cpu::tokensBackward(dx.data(), dcls.data(), dpos.data(), dout.data(), B, NP, C, cls);
  VERIFY_CLOSE(dx.data(), plusTimes(dx0, rdx, 2).data(), dx.size(), 1e-5, 1e-5);
  VERIFY_CLOSE(dcls.data(), plusTimes(dcls0, rdcls, 2).data(), C, 1e-5, 1e-5);
  VERIFY_CLOSE(dpos.data(), plusTimes(dpos0, rdpos, 2).data(), dpos.size(), 1e-5, 1e-5);

  std::fill(dx.begin(), dx.end(), 0.0f);
  cpu::tokensBackward(dx.data(), nullptr, nullptr, dout.data(), B, NP, C, cls);
  VERIFY_CLOSE(dx.data(), rdx.data(), dx.size(), 1e-5, 1e-5);
  std::fill(dpos.begin(), dpos.end(), 0.0f);
  cpu::tokensBackward(nullptr, nullptr, dpos.data(), dout.data(), B, NP, C, cls);
  VERIFY_CLOSE(dpos.data(), rdpos.data(), dpos.size(), 1e-5, 1e-5);
}

void TestKernels::pool_data() {
  QTest::addColumn<int>("B");
  QTest::addColumn<int>("T");
  QTest::addColumn<int>("C");
  QTest::addColumn<bool>("useFirst");
  const int shapes[][3] = {{1, 1, 1}, {2, 3, 5}, {7, 17, 64}, {33, 50, 97}};
  for (const auto& s : shapes)
    for (bool first : {true, false})
      QTest::addRow("B=%d T=%d C=%d %s", s[0], s[1], s[2], first ? "first" : "mean")
          << s[0] << s[1] << s[2] << first;
}

void TestKernels::pool() {
  QFETCH(int, B);
  QFETCH(int, T);
  QFETCH(int, C);
  QFETCH(bool, useFirst);
  std::mt19937 rng(kSeed + 12);
  const Vec inp = randomVec(rng, size_t(B) * T * C);  // (B, T, C)
  const Vec dout = randomVec(rng, size_t(B) * C);     // (B, C)
  Vec out(size_t(B) * C);
  cpu::poolForward(out.data(), inp.data(), B, T, C, useFirst);
  DVec ref(out.size(), 0.0), rdinp(inp.size(), 0.0);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < (useFirst ? 1 : T); t++)
      for (int c = 0; c < C; c++) {
        const double w = useFirst ? 1.0 : 1.0 / T;
        ref[size_t(b) * C + c] += w * inp[(size_t(b) * T + t) * C + c];
        rdinp[(size_t(b) * T + t) * C + c] = w * dout[size_t(b) * C + c];
      }
  VERIFY_CLOSE(out.data(), ref.data(), out.size(), 1e-6, 1e-5);

  const Vec dinp0 = randomVec(rng, inp.size());
  Vec dinp = dinp0;
  for (int rep = 0; rep < 2; rep++) cpu::poolBackward(dinp.data(), dout.data(), B, T, C, useFirst);
  VERIFY_CLOSE(dinp.data(), plusTimes(dinp0, rdinp, 2).data(), dinp.size(), 1e-6, 1e-5);

  // Finite differences of sum(out * dout) on the double reference.
  if (inp.size() <= 200) {
    DVec x = toDouble(inp);
    auto f = [&] {
      DVec o(size_t(B) * C, 0.0);
      for (int b = 0; b < B; b++)
        for (int t = 0; t < (useFirst ? 1 : T); t++)
          for (int c = 0; c < C; c++)
            o[size_t(b) * C + c] += (useFirst ? 1.0 : 1.0 / T) * x[(size_t(b) * T + t) * C + c];
      return o;
    };
    const DVec fd = finiteDifference(x, toDouble(dout), f);
    VERIFY_CLOSE(dinp.data(), plusTimes(dinp0, fd, 2).data(), dinp.size(), 1e-6, 1e-5);
  }
}

// ---- Optimizers
// --------------------------------------------------------------------------------------------

void TestKernels::adamw_data() {
  QTest::addColumn<int>("n");
  QTest::addColumn<float>("weightDecay");
  QTest::addColumn<float>("gradScale");
  for (int n : {1, 7, 33, 100003})
    for (float wd : {0.0f, 0.1f})
      QTest::addRow("n=%d wd=%g", n, double(wd)) << n << wd << (n == 7 ? 0.25f : 1.0f);
}

void TestKernels::adamw() {
  QFETCH(int, n);
  QFETCH(float, weightDecay);
  QFETCH(float, gradScale);
  const AdamParams a{1e-2f, 0.9f, 0.95f, 1e-8f, weightDecay, gradScale};
  std::mt19937 rng(kSeed + 13);
  Vec p = randomVec(rng, n), m(n, 0.0f), v(n, 0.0f);
  DVec rp = toDouble(p), rm(n, 0.0), rv(n, 0.0);
  for (int t = 1; t <= 5; t++) {
    const Vec grads = randomVec(rng, n, -2.0f, 2.0f);
    cpu::adamwUpdate(p.data(), grads.data(), m.data(), v.data(), n, a.lr, a.beta1, a.beta2, a.eps,
                     a.weightDecay, t, a.gradScale);
    refAdamw(rp, rm, rv, grads, a, t);
    VERIFY_CLOSE(p.data(), rp.data(), n, 1e-6, 1e-5);
    VERIFY_CLOSE(m.data(), rm.data(), n, 1e-7, 1e-5);
    VERIFY_CLOSE(v.data(), rv.data(), n, 1e-8, 1e-5);
  }
}

void TestKernels::sgd_data() {
  QTest::addColumn<float>("momentum");
  QTest::addColumn<bool>("nesterov");
  QTest::addColumn<float>("weightDecay");
  QTest::addColumn<bool>("withBuffer");
  QTest::newRow("plain, no buffer") << 0.0f << false << 0.0f << false;
  QTest::newRow("plain, weight decay") << 0.0f << false << 0.01f << true;
  QTest::newRow("momentum") << 0.9f << false << 0.0f << true;
  QTest::newRow("momentum, weight decay") << 0.9f << false << 0.01f << true;
  QTest::newRow("nesterov") << 0.9f << true << 0.0f << true;
  QTest::newRow("nesterov, weight decay") << 0.8f << true << 0.05f << true;
}

void TestKernels::sgd() {
  QFETCH(float, momentum);
  QFETCH(bool, nesterov);
  QFETCH(float, weightDecay);
  QFETCH(bool, withBuffer);
  const float lr = 0.05f, gradScale = 0.5f;
  for (int n : {1, 33, 100003}) {
    std::mt19937 rng(kSeed + 14);
    Vec p = randomVec(rng, n), buf(n, 0.0f);
    DVec rp = toDouble(p), rbuf(n, 0.0);
    for (int t = 1; t <= 5; t++) {
      const Vec grads = randomVec(rng, n);
      cpu::sgdUpdate(p.data(), grads.data(), withBuffer ? buf.data() : nullptr, n, lr, momentum, weightDecay,
                     nesterov, t == 1, gradScale);
      // torch.optim.SGD, dampening 0.
      for (int i = 0; i < n; i++) {
        double g = double(grads[i]) * gradScale + double(weightDecay) * rp[i];
        if (momentum != 0.0f) {
          rbuf[i] = t == 1 ? g : double(momentum) * rbuf[i] + g;
          g = nesterov ? g + double(momentum) * rbuf[i] : rbuf[i];
        }
        rp[i] -= double(lr) * g;
      }
      VERIFY_CLOSE(p.data(), rp.data(), n, 1e-6, 1e-5);
      if (momentum != 0.0f) VERIFY_CLOSE(buf.data(), rbuf.data(), n, 1e-6, 1e-5);
    }
  }
}

void TestKernels::sumSquares_data() {
  QTest::addColumn<int>("n");
  for (int n : {0, 1, 7, 33, 100003}) QTest::addRow("n=%d", n) << n;
}

void TestKernels::sumSquares() {
  QFETCH(int, n);
  std::mt19937 rng(kSeed + 15);
  const Vec x = randomVec(rng, n, -3.0f, 3.0f);
  double ref = 0.0;
  for (float v : x) ref += double(v) * double(v);
  const double got = cpu::sumSquares(x.data(), n);
  QVERIFY2(std::fabs(got - ref) <= 1e-12 * (1.0 + ref), qPrintable(QString("%1 vs %2").arg(got).arg(ref)));
}

// ---- Threads
// -----------------------------------------------------------------------------------------------

void TestKernels::deterministicThreads() {
  // Shapes large enough that every op takes its parallel path.
  const int N = 512, C = 97, B = 8, T = 64, V = 301, H = 3, CA = 24, OC = 65;
  std::mt19937 rng(kSeed + 16);
  const Vec inp = randomVec(rng, size_t(N) * C), dout = randomVec(rng, size_t(N) * C);  // (N, C)
  const Vec w = randomVec(rng, C, 0.5f, 1.5f), b = randomVec(rng, C);
  const int EB = 16, ET = 64, EC = 1040, EV = 300;  // embedding: B*T*C >= 2^20 takes its parallel path
  const std::vector<int32_t> tokens = randomTokens(rng, size_t(EB) * ET, EV);  // (B, T), many repeats
  const Vec dtok = randomVec(rng, size_t(EB) * ET * EC);                       // (B, T, C)
  const Vec qkv = randomVec(rng, size_t(B) * T * 3 * CA), dattOut = randomVec(rng, size_t(B) * T * CA);
  const Vec logits = randomVec(rng, size_t(N) * V, -5.0f, 5.0f);
  const std::vector<int32_t> targets = randomTokens(rng, N, V);
  const Vec lw = randomVec(rng, size_t(C) * OC), ldout = randomVec(rng, size_t(N) * OC);

  struct Results {
    Vec lnOut, lnDinp, lnDw, lnDb, dwte, dwpe, attOut, dqkv, losses, dlogits, dbias, dlw;
    double sumSq = 0.0;
  };
  auto run = [&](int threads) {
    cpu::setThreads(threads);
    Results r;
    Vec mean(N), rstd(N);
    r.lnOut.resize(inp.size());
    cpu::layerNormForward(r.lnOut.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C,
                          1e-5f);
    r.lnDinp.assign(inp.size(), 0.0f), r.lnDw.assign(C, 0.0f), r.lnDb.assign(C, 0.0f);
    cpu::layerNormBackward(r.lnDinp.data(), r.lnDw.data(), r.lnDb.data(), dout.data(), inp.data(), w.data(),
                           mean.data(), rstd.data(), N, C);
    r.dwte.assign(size_t(EV) * EC, 0.0f), r.dwpe.assign(size_t(ET) * EC, 0.0f);
    cpu::embeddingBackward(r.dwte.data(), r.dwpe.data(), dtok.data(), tokens.data(), EB, ET, EC);
    r.attOut.resize(size_t(B) * T * CA);
    Vec att(size_t(B) * H * T * T), scratch(att.size());
    cpu::attentionForward(r.attOut.data(), att.data(), qkv.data(), B, T, CA, H, true);
    r.dqkv.assign(qkv.size(), 0.0f);
    cpu::attentionBackward(r.dqkv.data(), scratch.data(), dattOut.data(), qkv.data(), att.data(), B, T, CA, H,
                           true);
    r.losses.resize(N), r.dlogits.resize(logits.size());
    cpu::softmaxCrossEntropy(r.losses.data(), r.dlogits.data(), logits.data(), targets.data(), N, V,
                             1.0f / N);
    r.dbias.assign(OC, 0.0f), r.dlw.assign(size_t(C) * OC, 0.0f);
    cpu::linearBackward(nullptr, r.dlw.data(), r.dbias.data(), ldout.data(), inp.data(), lw.data(), N, C, OC);
    r.sumSq = cpu::sumSquares(logits.data(), logits.size());
    return r;
  };
  const Results a = run(2), a2 = run(2), one = run(1);
  cpu::setThreads(2);
  for (auto field : {&Results::lnOut, &Results::lnDinp, &Results::lnDw, &Results::lnDb, &Results::dwte,
                     &Results::dwpe, &Results::attOut, &Results::dqkv, &Results::losses, &Results::dlogits,
                     &Results::dbias, &Results::dlw})
    VERIFY_BITWISE(a.*field, a2.*field);
  QCOMPARE(a.sumSq, a2.sumSq);
  // 1 vs 2 threads: LayerNorm parameter gradients are summed in another order, so close, not equal; the
  // embedding gradients and the bias column sum do not depend on the thread count at all.
  VERIFY_CLOSE(a.lnDw.data(), one.lnDw.data(), C, 1e-5, 1e-5);
  VERIFY_CLOSE(a.lnDb.data(), one.lnDb.data(), C, 1e-5, 1e-5);
  VERIFY_BITWISE(a.lnDinp, one.lnDinp);
  VERIFY_BITWISE(a.dwte, one.dwte);
  VERIFY_BITWISE(a.dwpe, one.dwpe);
  VERIFY_BITWISE(a.dbias, one.dbias);
  QVERIFY(std::fabs(a.sumSq - one.sumSq) <= 1e-12 * a.sumSq);
}

QTEST_APPLESS_MAIN(TestKernels)
#include "tst_kernels.moc"
