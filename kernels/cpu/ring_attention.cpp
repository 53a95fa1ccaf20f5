// The two block ops of ring attention (context parallelism; Liu et al. 2023, "Ring Attention with Blockwise
// Transformers for Near-Infinite Context"): a rank's queries against one key/value block at a time, merged
// with the online softmax of FlashAttention (Dao et al. 2022, "FlashAttention", section 3.1: a block's row
// maximum m and sum l = sum_j exp(s_j - m) are kept as lse = m + log l, and two partial results combine as
// out' = out exp(lse - lse') + outBlk exp(lseBlk - lse'), lse' = logaddexp(lse, lseBlk)). The backward
// recomputes the probabilities from the final lse, P = exp(s - lse), and uses D = rowsum(dout * out) in
// place of rowsum(P * dP) (Dao et al. 2022, appendix B.2): dV += P^T dout, dS = P (dout V^T - D),
// dQ += scale dS K, dK += scale dS^T Q.
//
// The key/value blocks hold KV heads (grouped-query attention; Ainslie et al. 2023, "GQA"): query head h
// reads key/value head h / (H / KV), and the gradient of a key/value head sums those of its group's query
// heads. KV == H is plain multi-head attention.
//
// Forward runs one (batch, query head) pair per OpenMP iteration (the pairs write disjoint columns of out
// and lse); backward one (batch, key/value head) pair, with the group's query heads in order inside it, so
// each dkv element is written by one thread (and dq's heads of different pairs are disjoint). One query row
// at a time inside a head. Each of the two runs of the key positions (SeqPositions) is contiguous and
// increasing, so the keys a causal query at position p sees in a run starting at s with n keys are its first
// clamp(p - s + 1, 0, n): masked keys are never visited. The block's keys (and in backward its values) are
// transposed once per pair to (hs, Tk), so a row's scores q.k_j (and dout.v_j) are hs `omp simd` passes
// over contiguous keys with no horizontal sums (a per-key dot product of 16 to 64 floats does not vectorise
// well); the updates of the head-size rows (out, dq, dk, dv) are `omp simd` loops over the head, the
// exponentials detail::vexp. Every sum runs in a fixed order, so the results depend on the sizes only, not on
// the thread count.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace ms::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The keys of a block in its two runs: rows [0, split) at positions start0 + j, rows [split, Tk) at
// start1 + (j - split).
struct KeyRuns {
  int split = 0;  // kpos.split clamped to [0, Tk]
  int Tk = 0;
  long long start0 = 0, start1 = 0;

  KeyRuns(SeqPositions kpos, int tk)
      : split(std::clamp(kpos.split, 0, tk)), Tk(tk), start0(kpos.start0), start1(kpos.start1) {}

  static int count(long long c, int n) { return int(std::clamp<long long>(c, 0, n)); }
  // The visible keys of a query at position p: [0, n0) and [split, split + n1).
  void visible(long long p, bool causal, int& n0, int& n1) const {
    n0 = causal ? count(p - start0 + 1, split) : split;
    n1 = causal ? count(p - start1 + 1, Tk - split) : Tk - split;
  }
};

// y += a * x over n floats.
inline void axpy(float* y, float a, const float* x, int n) {
#pragma omp simd
  for (int d = 0; d < n; d++) y[d] += a * x[d];
}

// t (hs, n) = the head's hs columns of n rows of stride `stride`, transposed: t[d n + j] = x[j stride + d].
void transpose(float* t, const float* x, int n, int hs, int stride) {
  for (int j = 0; j < n; j++)
    for (int d = 0; d < hs; d++) t[size_t(d) * n + j] = x[size_t(j) * stride + d];
}

// s[0, n0 + n1) = sum_d a[d] * xt[d, j] over the visible columns j of xt (hs, Tk): [0, n0), then
// [split, split + n1). Vectorised over the keys (contiguous in xt), with no horizontal sums.
void rowTimesColumns(float* s, const float* a, const float* xt, int Tk, int hs, int n0, int split, int n1) {
  std::fill(s, s + n0 + n1, 0.0f);
  for (int d = 0; d < hs; d++) {
    const float ad = a[d];
    const float* x0 = xt + size_t(d) * Tk;
    const float* x1 = x0 + split;
    float* s1 = s + n0;
#pragma omp simd
    for (int j = 0; j < n0; j++) s[j] += ad * x0[j];
#pragma omp simd
    for (int j = 0; j < n1; j++) s1[j] += ad * x1[j];
  }
}

// Whether to run the B * heads (batch, head) pairs of a block on OpenMP threads.
bool parallelOverHeads(int B, int Tq, int Tk, int C, int heads) {
  return B * heads > 1 && size_t(B) * size_t(Tq) * size_t(Tk) * size_t(C) >= detail::kMinParallelWork;
}

}  // namespace

void attentionBlockForward(float* out, float* lse, const float* qkv, const float* kv, int B, int Tq, int Tk,
                           int C, int H, int KV, SeqPositions qpos, SeqPositions kpos, bool causal,
                           bool first) {
  // out (B, Tq, C), lse (B, H, Tq), qkv (B, Tq, 3C), kv (B, Tk, 2 KV hs)
  if (B <= 0 || Tq <= 0 || C <= 0 || H <= 0 || KV <= 0 || H % KV != 0) return;
  Tk = std::max(Tk, 0);
  const int hs = C / H;
  const int group = H / KV;  // query heads per key/value head
  const int Ckv = KV * hs;   // a kv row's key heads, then as many value heads
  const int C3 = 3 * C;
  const int C2 = 2 * Ckv;
  const float scale = 1.0f / std::sqrt(float(hs));
  const KeyRuns runs(kpos, Tk);
#pragma omp parallel for collapse(2) schedule(static) if (parallelOverHeads(B, Tq, Tk, C, H))
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < H; h++) {
      const int g = h / group;                                      // its key/value head
      const float* q = qkv + size_t(b) * Tq * C3 + size_t(h) * hs;  // (Tq, hs), row stride 3C
      const float* k = kv + size_t(b) * Tk * C2 + size_t(g) * hs;   // (Tk, hs), row stride 2 Ckv
      const float* v = k + Ckv;                                     // (Tk, hs), row stride 2 Ckv
      float* o = out + size_t(b) * Tq * C + size_t(h) * hs;         // (Tq, hs), row stride C
      float* l = lse + (size_t(b) * H + h) * Tq;                    // (Tq)
      std::vector<float> kt(size_t(hs) * Tk);                       // k transposed (hs, Tk)
      std::vector<float> p(size_t(Tk) + 1);                         // a row's visible scores, then exps
      std::vector<float> qs(static_cast<size_t>(hs));               // scale * q_i
      std::vector<float> acc(static_cast<size_t>(hs));              // sum_j exp(s_j - m) v_j
      transpose(kt.data(), k, Tk, hs, C2);
      for (int i = 0; i < Tq; i++) {
        int n0 = 0, n1 = 0;
        runs.visible(qpos.at(i), causal, n0, n1);
        const int n = n0 + n1;
        float* oi = o + size_t(i) * C;
        if (n == 0) {  // no visible key: first writes the empty row, a merge leaves the row as it is
          if (first) {
            std::fill(oi, oi + hs, 0.0f);
            l[i] = kNegInf;
          }
          continue;
        }
        const float* qi = q + size_t(i) * C3;
        for (int d = 0; d < hs; d++) qs[d] = scale * qi[d];
        rowTimesColumns(p.data(), qs.data(), kt.data(), Tk, hs, n0, runs.split, n1);
        const float m = detail::rowMax(p.data(), n);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < n; j++) {
          const float e = detail::vexp(p[j] - m);
          p[j] = e;
          sum += e;
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        const float* v1 = v + size_t(runs.split) * C2;  // the second run's first value
        for (int j = 0; j < n0; j++) axpy(acc.data(), p[j], v + size_t(j) * C2, hs);
        for (int j = 0; j < n1; j++) axpy(acc.data(), p[n0 + j], v1 + size_t(j) * C2, hs);
        const float lseBlk = m + std::log(sum);
        const float old = l[i];
        if (first || old == kNegInf) {  // nothing to merge with: outBlk = acc / sum
          const float inv = 1.0f / sum;
#pragma omp simd
          for (int d = 0; d < hs; d++) oi[d] = acc[d] * inv;
          l[i] = lseBlk;
        } else {
          // lse' = logaddexp(old, lseBlk); outBlk exp(lseBlk - lse') = acc exp(m - lse') since
          // outBlk = acc / sum and lseBlk = m + log(sum).
          const float merged = std::max(old, lseBlk) + std::log1p(std::exp(-std::fabs(old - lseBlk)));
          const float wOld = std::exp(old - merged);
          const float wBlk = std::exp(m - merged);
#pragma omp simd
          for (int d = 0; d < hs; d++) oi[d] = oi[d] * wOld + acc[d] * wBlk;
          l[i] = merged;
        }
      }
    }
  }
}

void attentionBlockBackward(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv,
                            const float* out, const float* lse, int B, int Tq, int Tk, int C, int H, int KV,
                            SeqPositions qpos, SeqPositions kpos, bool causal) {
  // dqkv (B, Tq, 3C; q part), dkv (B, Tk, 2 KV hs), dout and out (B, Tq, C), qkv (B, Tq, 3C),
  // kv (B, Tk, 2 KV hs), lse (B, H, Tq)
  if (B <= 0 || Tq <= 0 || Tk <= 0 || C <= 0 || H <= 0 || KV <= 0 || H % KV != 0) return;
  const int hs = C / H;
  const int group = H / KV;  // query heads per key/value head
  const int Ckv = KV * hs;   // a kv row's key heads, then as many value heads
  const int C3 = 3 * C;
  const int C2 = 2 * Ckv;
  const float scale = 1.0f / std::sqrt(float(hs));
  const KeyRuns runs(kpos, Tk);
#pragma omp parallel for collapse(2) schedule(static) if (parallelOverHeads(B, Tq, Tk, C, KV))
  for (int b = 0; b < B; b++) {
    for (int g = 0; g < KV; g++) {
      const size_t kOff = size_t(b) * Tk * C2 + size_t(g) * hs;
      const float* k = kv + kOff;                                   // (Tk, hs), row stride 2 Ckv; v at +Ckv
      float* dk = dkv + kOff;                                       // dv at +Ckv
      std::vector<float> kt(size_t(hs) * Tk), vt(size_t(hs) * Tk);  // k and v transposed (hs, Tk)
      std::vector<float> p(size_t(Tk) + 1), ds(size_t(Tk) + 1);     // a row's P and dS over its visible keys
      std::vector<float> qs(static_cast<size_t>(hs)), dqi(static_cast<size_t>(hs));
      transpose(kt.data(), k, Tk, hs, C2);
      transpose(vt.data(), k + Ckv, Tk, hs, C2);
      for (int h = g * group; h < (g + 1) * group; h++) {  // the group's query heads, in order
        const size_t qOff = size_t(b) * Tq * C3 + size_t(h) * hs;
        const size_t oOff = size_t(b) * Tq * C + size_t(h) * hs;
        const float* q = qkv + qOff;  // (Tq, hs), row stride 3C
        float* dq = dqkv + qOff;
        const float* dO = dout + oOff;  // (Tq, hs), row stride C
        const float* O = out + oOff;
        const float* l = lse + (size_t(b) * H + h) * Tq;
        for (int i = 0; i < Tq; i++) {
          const float li = l[i];
          if (li == kNegInf) continue;  // no key visible in any block: out is 0 and has no gradient
          int n0 = 0, n1 = 0;
          runs.visible(qpos.at(i), causal, n0, n1);
          const int n = n0 + n1;
          if (n == 0) continue;
          const float* qi = q + size_t(i) * C3;
          const float* doi = dO + size_t(i) * C;
          const float* oi = O + size_t(i) * C;
          float D = 0.0f;  // = sum_j P_j dP_j over every block's keys
          for (int d = 0; d < hs; d++) {
            D += doi[d] * oi[d];
            qs[d] = scale * qi[d];
          }
          rowTimesColumns(p.data(), qs.data(), kt.data(), Tk, hs, n0, runs.split, n1);  // scores
          rowTimesColumns(ds.data(), doi, vt.data(), Tk, hs, n0, runs.split, n1);       // dP = dout_i . v_j
#pragma omp simd
          for (int j = 0; j < n; j++) {
            p[j] = detail::vexp(p[j] - li);      // P
            ds[j] = scale * p[j] * (ds[j] - D);  // scale * dS
          }
          std::fill(dqi.begin(), dqi.end(), 0.0f);
          // dv_j += P_j dout_i, dk_j += scale dS_j q_i, dq_i += scale dS_j k_j for the count keys from
          // firstKey, whose P and scale dS sit at p[at], ds[at] on.
          auto keys = [&](int firstKey, int count, int at) {
            for (int j = 0; j < count; j++) {
              const size_t kj = size_t(firstKey + j) * C2;
              axpy(dk + kj + Ckv, p[at + j], doi, hs);
              axpy(dk + kj, ds[at + j], qi, hs);
              axpy(dqi.data(), ds[at + j], k + kj, hs);
            }
          };
          keys(0, n0, 0);
          keys(runs.split, n1, n0);
          float* dqr = dq + size_t(i) * C3;
#pragma omp simd
          for (int d = 0; d < hs; d++) dqr[d] += dqi[d];
        }
      }
    }
  }
}

}  // namespace ms::cpu
