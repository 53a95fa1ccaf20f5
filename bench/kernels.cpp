// bench/kernels: each CPU kernel (kernels/cpu/cpu_ops.h) timed against a plain single-threaded reference
// measured in the same run (llm.c-style loops, float), on the shapes of the GPT that bench/cpu_vs_torch.py
// trains (B 16, T 128, C 256, H 4, V 256, F 4C) or, with --large, of GPT-2 small (B 4, T 512, C 768, H 12,
// V 50257). The results are compared outside the timed region; a wrong result makes the exit status 1.
//
// usage: bench_kernels [--threads N] [--large]
// Columns: best time per call of the kernel and of the reference, their ratio (> 1: the kernel is faster),
// and the kernel's memory traffic (GB/s, minimum bytes read + written) or arithmetic rate (GFLOP/s).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/cpu_ops.h"

namespace cpu = ms::cpu;

namespace {

using Vec = std::vector<float>;

// ---- Plain references (float, one thread) ---------------------------------------------------------------

void refLinear(float* out, const float* inp, const float* w, const float* b, int N, int C, int OC) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      float s = b ? b[o] : 0.0f;
      for (int c = 0; c < C; c++) s += inp[size_t(n) * C + c] * w[size_t(c) * OC + o];
      out[size_t(n) * OC + o] = s;
    }
}

void refLayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float* x = inp + size_t(n) * C;
    float m = 0.0f;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    float v = 0.0f;
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    const float s = 1.0f / std::sqrt(v / C + 1e-5f);
    for (int c = 0; c < C; c++) out[size_t(n) * C + c] = (x[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void refLayerNormBackward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float* x = inp + size_t(n) * C;
    const float* dy = dout + size_t(n) * C;
    float dm = 0.0f, dnm = 0.0f;
    for (int c = 0; c < C; c++) {
      const float norm = (x[c] - mean[n]) * rstd[n];
      dm += w[c] * dy[c];
      dnm += w[c] * dy[c] * norm;
    }
    dm /= C;
    dnm /= C;
    for (int c = 0; c < C; c++) {
      const float norm = (x[c] - mean[n]) * rstd[n];
      db[c] += dy[c];
      dw[c] += norm * dy[c];
      dinp[size_t(n) * C + c] += (w[c] * dy[c] - dm - norm * dnm) * rstd[n];
    }
  }
}

constexpr float kGeluScale = 0.7978845608f;

void refGeluForward(float* out, const float* x, size_t n) {
  for (size_t i = 0; i < n; i++)
    out[i] = 0.5f * x[i] * (1.0f + std::tanh(kGeluScale * (x[i] + 0.044715f * x[i] * x[i] * x[i])));
}

void refGeluBackward(float* dinp, const float* dout, const float* x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const float u = kGeluScale * (x[i] + 0.044715f * x[i] * x[i] * x[i]);
    const float t = std::tanh(u), ch = std::cosh(u);
    const float local =
        0.5f * (1.0f + t) + x[i] * 0.5f / (ch * ch) * kGeluScale * (1.0f + 3.0f * 0.044715f * x[i] * x[i]);
    dinp[i] += local * dout[i];
  }
}

// llm.c attention_forward / attention_backward (causal), float loops.
void refAttentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int H) {
  const int hs = C / H;
  const float scale = 1.0f / std::sqrt(float(hs));
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < H; h++) {
        const float* q = qkv + (size_t(b) * T + t) * 3 * C + h * hs;
        float* a = att + ((size_t(b) * H + h) * T + t) * T;
        float maxv = -1e30f;
        for (int j = 0; j <= t; j++) {
          const float* k = qkv + (size_t(b) * T + j) * 3 * C + C + h * hs;
          float s = 0.0f;
          for (int d = 0; d < hs; d++) s += q[d] * k[d];
          a[j] = s * scale;
          maxv = std::max(maxv, a[j]);
        }
        float sum = 0.0f;
        for (int j = 0; j <= t; j++) sum += (a[j] = std::exp(a[j] - maxv));
        for (int j = 0; j < T; j++) a[j] = j <= t ? a[j] / sum : 0.0f;
        float* o = out + (size_t(b) * T + t) * C + h * hs;
        for (int d = 0; d < hs; d++) o[d] = 0.0f;
        for (int j = 0; j <= t; j++) {
          const float* v = qkv + (size_t(b) * T + j) * 3 * C + 2 * C + h * hs;
          for (int d = 0; d < hs; d++) o[d] += a[j] * v[d];
        }
      }
}

void refAttentionBackward(float* dqkv, float* datt, float* dpre, const float* dout, const float* qkv,
                          const float* att, int B, int T, int C, int H) {
  const int hs = C / H;
  const float scale = 1.0f / std::sqrt(float(hs));
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < H; h++) {
        const size_t row = ((size_t(b) * H + h) * T + t) * T;
        const float* a = att + row;
        float* da = datt + row;
        float* dp = dpre + row;
        const float* g = dout + (size_t(b) * T + t) * C + h * hs;
        const size_t qi = (size_t(b) * T + t) * 3 * C + h * hs;
        for (int j = 0; j <= t; j++) {
          const size_t vj = (size_t(b) * T + j) * 3 * C + 2 * C + h * hs;
          da[j] = 0.0f;
          for (int d = 0; d < hs; d++) {
            da[j] += qkv[vj + d] * g[d];
            dqkv[vj + d] += a[j] * g[d];
          }
        }
        float dot = 0.0f;
        for (int j = 0; j <= t; j++) dot += a[j] * da[j];
        for (int j = 0; j <= t; j++) dp[j] = a[j] * (da[j] - dot);
        for (int j = 0; j <= t; j++) {
          const size_t kj = (size_t(b) * T + j) * 3 * C + C + h * hs;
          for (int d = 0; d < hs; d++) {
            dqkv[qi + d] += qkv[kj + d] * dp[j] * scale;
            dqkv[kj + d] += qkv[qi + d] * dp[j] * scale;
          }
        }
      }
}

void refCrossEntropy(float* losses, float* dlogits, const float* logits, const int32_t* targets, int N,
                     int V) {
  for (int n = 0; n < N; n++) {
    const float* x = logits + size_t(n) * V;
    float m = x[0];
    for (int j = 1; j < V; j++) m = std::max(m, x[j]);
    float s = 0.0f;
    for (int j = 0; j < V; j++) s += std::exp(x[j] - m);
    losses[n] = std::log(s) + m - x[targets[n]];
    for (int j = 0; j < V; j++)
      dlogits[size_t(n) * V + j] = std::exp(x[j] - m) / s - (j == targets[n] ? 1.0f : 0.0f);
  }
}

void refEmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                          int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float* g = dout + (size_t(b) * T + t) * C;
      float* dt = dwte + size_t(tokens[size_t(b) * T + t]) * C;
      float* dp = dwpe + size_t(t) * C;
      for (int c = 0; c < C; c++) {
        dt[c] += g[c];
        dp[c] += g[c];
      }
    }
}

void refAdamw(float* p, const float* g, float* m, float* v, size_t n, int t) {
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  for (size_t i = 0; i < n; i++) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    const float mh = m[i] / (1 - std::pow(b1, float(t))), vh = v[i] / (1 - std::pow(b2, float(t)));
    p[i] -= lr * (mh / (std::sqrt(vh) + eps) + wd * p[i]);
  }
}

// ---- Harness ----------------------------------------------------------------------------------------------

// Seconds now: this thread's CPU time with one thread (immune to other processes taking the core, which on a
// shared build machine changes wall times twofold), wall time otherwise.
double now(bool cpuTime) {
  if (!cpuTime)
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Best seconds per call over repeated calls, after one warm-up call, for at least ~0.3 s.
double bestTime(const std::function<void()>& f, bool cpuTime) {
  f();
  double best = 1e30, total = 0.0;
  for (int i = 0; i < 200 && (i < 3 || total < 0.3); i++) {
    const double t0 = now(cpuTime);
    f();
    const double s = now(cpuTime) - t0;
    best = std::min(best, s);
    total += s;
  }
  return best;
}

// Largest |a - b| / (atol + rtol |b|); <= 1 passes.
double worstError(const Vec& a, const Vec& b, double atol, double rtol) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); i++) {
    const double e = std::fabs(double(a[i]) - double(b[i])) / (atol + rtol * std::fabs(double(b[i])));
    worst = std::isnan(e) ? 1e30 : std::max(worst, e);
  }
  return worst;
}

struct Case {
  std::string name, shape;
  double bytes = 0.0, flops = 0.0;  // per kernel call
  std::function<void()> kernel, reference;
  std::function<double()> check;  // runs both from the same state, returns worstError
};

Vec randomVec(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  ms::cpu::selectBlasCore(argv);  // the kernels the engine runs (kernels/cpu/blas_core.h)
  int threads = 0;
  bool large = false;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--large"))
      large = true;
    else {
      std::fprintf(stderr, "usage: %s [--threads N] [--large]\n", argv[0]);
      return 2;
    }
  }
  cpu::setThreads(threads);
  const int B = large ? 4 : 16, T = large ? 512 : 128, C = large ? 768 : 256, H = large ? 12 : 4;
  const int V = large ? 50257 : 256, F = 4 * C, N = B * T;
  const int NV =
      large ? 256 : N;  // cross-entropy rows (GPT-2's vocabulary makes B*T rows too big to keep twice)
  std::mt19937 rng(1234);
  const size_t NC = size_t(N) * C;

  const Vec x = randomVec(rng, NC), w = randomVec(rng, C, 0.5f, 1.5f), bC = randomVec(rng, C),
            dy = randomVec(rng, NC);
  Vec out(NC), mean(N), rstd(N), dx(NC), dw(C), db(C);
  const Vec h = randomVec(rng, size_t(N) * F, -4.0f, 4.0f), dh = randomVec(rng, size_t(N) * F);
  Vec hOut(h.size()), hGrad(h.size());
  const Vec qkv = randomVec(rng, 3 * NC), dAtt = randomVec(rng, NC);
  const size_t attSize = size_t(B) * H * T * T;
  Vec att(attSize), scratch(attSize), scratch2(attSize), aOut(NC), dqkv(3 * NC);
  const Vec W = randomVec(rng, size_t(C) * F, -0.1f, 0.1f), bF = randomVec(rng, F);
  const int Nsmall = 64;  // rows for the naive GEMM reference, which is slow
  Vec lin(size_t(N) * F);
  Vec logits = randomVec(rng, size_t(NV) * V, -5.0f, 5.0f), dlogits(logits.size()), losses(NV);
  std::vector<int32_t> targets(NV), tokens(N);
  for (auto& t : targets) t = int32_t(rng() % V);
  for (auto& t : tokens) t = int32_t(rng() % V);
  Vec dwte(size_t(V) * C), dwpe(size_t(T) * C);
  const size_t P = large ? 124000000 / 4 : 3300000;  // parameters for the optimizer
  const Vec grads = randomVec(rng, P);
  Vec params = randomVec(rng, P), m(P), v(P);

  char shape[96];
  std::vector<Case> cases;
  std::snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
  cases.push_back(
      {"layerNormForward", shape, 2.0 * NC * 4, 0.0,
       [&] {
         cpu::layerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), bC.data(), N, C,
                               1e-5f);
       },
       [&] {
         refLayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), bC.data(), N, C);
       },
       [&] {
         Vec o2(NC), m2(N), r2(N);
         cpu::layerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), bC.data(), N, C,
                               1e-5f);
         refLayerNormForward(o2.data(), m2.data(), r2.data(), x.data(), w.data(), bC.data(), N, C);
         return worstError(out, o2, 1e-5, 1e-4);
       }});
  cases.push_back({"layerNormBackward", shape, 4.0 * NC * 4, 0.0,
                   [&] {
                     cpu::layerNormBackward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                                            mean.data(), rstd.data(), N, C);
                   },
                   [&] {
                     refLayerNormBackward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                                          mean.data(), rstd.data(), N, C);
                   },
                   [&] {
                     Vec dx2(NC, 0.0f), dw2(C, 0.0f), db2(C, 0.0f);
                     std::fill(dx.begin(), dx.end(), 0.0f), std::fill(dw.begin(), dw.end(), 0.0f),
                         std::fill(db.begin(), db.end(), 0.0f);
                     cpu::layerNormBackward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                                            mean.data(), rstd.data(), N, C);
                     refLayerNormBackward(dx2.data(), dw2.data(), db2.data(), dy.data(), x.data(), w.data(),
                                          mean.data(), rstd.data(), N, C);
                     return std::max({worstError(dx, dx2, 1e-4, 1e-3), worstError(dw, dw2, 1e-3, 1e-3),
                                      worstError(db, db2, 1e-3, 1e-3)});
                   }});
  std::snprintf(shape, sizeof shape, "n=%zu", h.size());
  cases.push_back({"geluForward", shape, 2.0 * h.size() * 4, 0.0,
                   [&] { cpu::geluForward(hOut.data(), h.data(), h.size()); },
                   [&] { refGeluForward(hOut.data(), h.data(), h.size()); },
                   [&] {
                     Vec r(h.size());
                     cpu::geluForward(hOut.data(), h.data(), h.size());
                     refGeluForward(r.data(), h.data(), h.size());
                     return worstError(hOut, r, 1e-6, 1e-5);
                   }});
  cases.push_back({"geluBackward", shape, 4.0 * h.size() * 4, 0.0,
                   [&] { cpu::geluBackward(hGrad.data(), dh.data(), h.data(), h.size()); },
                   [&] { refGeluBackward(hGrad.data(), dh.data(), h.data(), h.size()); },
                   [&] {
                     Vec r(h.size(), 0.0f);
                     std::fill(hGrad.begin(), hGrad.end(), 0.0f);
                     cpu::geluBackward(hGrad.data(), dh.data(), h.data(), h.size());
                     refGeluBackward(r.data(), dh.data(), h.data(), h.size());
                     return worstError(hGrad, r, 1e-5, 1e-4);
                   }});
  std::snprintf(shape, sizeof shape, "N=%d C=%d OC=%d", N, C, F);
  cases.push_back({"linearForward", shape, 0.0, 2.0 * N * C * F,
                   [&] { cpu::linearForward(lin.data(), x.data(), W.data(), bF.data(), N, C, F); },
                   [&] { refLinear(lin.data(), x.data(), W.data(), bF.data(), Nsmall, C, F); },
                   [&] {
                     Vec r(size_t(Nsmall) * F);
                     cpu::linearForward(lin.data(), x.data(), W.data(), bF.data(), N, C, F);
                     refLinear(r.data(), x.data(), W.data(), bF.data(), Nsmall, C, F);
                     return worstError(Vec(lin.begin(), lin.begin() + r.size()), r, 1e-4, 1e-4);
                   }});
  cases.back().name += "*";  // the reference does Nsmall rows; its time is scaled below
  std::snprintf(shape, sizeof shape, "B=%d T=%d C=%d H=%d", B, T, C, H);
  const double attFlops = 2.0 * 2.0 * B * H * double(T) * (T + 1) / 2 * (C / H);  // causal q.k and att.v
  cases.push_back({"attentionForward", shape, 0.0, attFlops,
                   [&] { cpu::attentionForward(aOut.data(), att.data(), qkv.data(), B, T, C, H, true); },
                   [&] { refAttentionForward(aOut.data(), att.data(), qkv.data(), B, T, C, H); },
                   [&] {
                     Vec o2(NC), a2(attSize);
                     cpu::attentionForward(aOut.data(), att.data(), qkv.data(), B, T, C, H, true);
                     refAttentionForward(o2.data(), a2.data(), qkv.data(), B, T, C, H);
                     return std::max(worstError(aOut, o2, 1e-5, 1e-4), worstError(att, a2, 1e-6, 1e-4));
                   }});
  cases.push_back({"attentionBackward", shape, 0.0, 2.0 * attFlops,
                   [&] {
                     cpu::attentionBackward(dqkv.data(), scratch.data(), dAtt.data(), qkv.data(), att.data(),
                                            B, T, C, H, true);
                   },
                   [&] {
                     refAttentionBackward(dqkv.data(), scratch.data(), scratch2.data(), dAtt.data(),
                                          qkv.data(), att.data(), B, T, C, H);
                   },
                   [&] {
                     Vec d2(3 * NC, 0.0f);
                     std::fill(dqkv.begin(), dqkv.end(), 0.0f);
                     cpu::attentionBackward(dqkv.data(), scratch.data(), dAtt.data(), qkv.data(), att.data(),
                                            B, T, C, H, true);
                     refAttentionBackward(d2.data(), scratch.data(), scratch2.data(), dAtt.data(), qkv.data(),
                                          att.data(), B, T, C, H);
                     return worstError(dqkv, d2, 1e-4, 1e-3);
                   }});
  std::snprintf(shape, sizeof shape, "N=%d V=%d", NV, V);
  cases.push_back(
      {"softmaxCrossEntropy", shape, 2.0 * NV * V * 4, 0.0,
       [&] {
         cpu::softmaxCrossEntropy(losses.data(), dlogits.data(), logits.data(), targets.data(), NV, V, 1.0f);
       },
       [&] { refCrossEntropy(losses.data(), dlogits.data(), logits.data(), targets.data(), NV, V); },
       [&] {
         Vec l2(NV), d2(dlogits.size());
         cpu::softmaxCrossEntropy(losses.data(), dlogits.data(), logits.data(), targets.data(), NV, V, 1.0f);
         refCrossEntropy(l2.data(), d2.data(), logits.data(), targets.data(), NV, V);
         return std::max(worstError(losses, l2, 1e-5, 1e-4), worstError(dlogits, d2, 1e-6, 1e-4));
       }});
  std::snprintf(shape, sizeof shape, "B=%d T=%d C=%d V=%d", B, T, C, V);
  cases.push_back(
      {"embeddingBackward", shape, 3.0 * NC * 4, 0.0,
       [&] { cpu::embeddingBackward(dwte.data(), dwpe.data(), dy.data(), tokens.data(), B, T, C); },
       [&] { refEmbeddingBackward(dwte.data(), dwpe.data(), dy.data(), tokens.data(), B, T, C); },
       [&] {
         Vec t2(dwte.size(), 0.0f), p2(dwpe.size(), 0.0f);
         std::fill(dwte.begin(), dwte.end(), 0.0f), std::fill(dwpe.begin(), dwpe.end(), 0.0f);
         cpu::embeddingBackward(dwte.data(), dwpe.data(), dy.data(), tokens.data(), B, T, C);
         refEmbeddingBackward(t2.data(), p2.data(), dy.data(), tokens.data(), B, T, C);
         return std::max(worstError(dwte, t2, 1e-5, 1e-5), worstError(dwpe, p2, 1e-5, 1e-5));
       }});
  std::snprintf(shape, sizeof shape, "n=%zu", P);
  cases.push_back({"adamwUpdate", shape, 7.0 * P * 4, 0.0,
                   [&] {
                     cpu::adamwUpdate(params.data(), grads.data(), m.data(), v.data(), P, 1e-3f, 0.9f, 0.95f,
                                      1e-8f, 0.1f, 3, 1.0f);
                   },
                   [&] { refAdamw(params.data(), grads.data(), m.data(), v.data(), P, 3); },
                   [&] {
                     Vec p2 = params, m2 = m, v2 = v;
                     cpu::adamwUpdate(params.data(), grads.data(), m.data(), v.data(), P, 1e-3f, 0.9f, 0.95f,
                                      1e-8f, 0.1f, 3, 1.0f);
                     refAdamw(p2.data(), grads.data(), m2.data(), v2.data(), P, 3);
                     return worstError(params, p2, 1e-6, 1e-5);
                   }});

  const bool cpuTime = cpu::threads() == 1;
  std::printf("threads %d, %s, %s\n", cpu::threads(), cpuTime ? "thread CPU time" : "wall time",
              large ? "GPT-2 small shapes" : "bench/cpu_vs_torch.py GPT shapes");
  std::printf("%-20s %-26s %11s %11s %9s %12s  %s\n", "op", "shape", "kernel ms", "ref ms", "speedup", "rate",
              "check");
  bool ok = true;
  for (Case& c : cases) {
    const double err = c.check();
    const bool pass = err <= 1.0;
    ok = ok && pass;
    const double tk = bestTime(c.kernel, cpuTime);
    double tr = bestTime(c.reference, cpuTime);
    if (c.name == "linearForward*") tr *= double(N) / Nsmall;
    char rate[32];
    if (c.bytes > 0)
      std::snprintf(rate, sizeof rate, "%7.1f GB/s", c.bytes / tk / 1e9);
    else
      std::snprintf(rate, sizeof rate, "%5.1f GFLOP/s", c.flops / tk / 1e9);
    std::printf("%-20s %-26s %11.3f %11.3f %8.1fx %12s  %s\n", c.name.c_str(), c.shape.c_str(), tk * 1e3,
                tr * 1e3, tr / tk, rate, pass ? "ok" : "WRONG");
  }
  std::printf("* reference run on %d rows and scaled\n", Nsmall);
  return ok ? 0 : 1;
}
