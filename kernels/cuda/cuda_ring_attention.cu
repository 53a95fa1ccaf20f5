// The two block ops of ring attention on the GPU (context parallelism; Liu et al. 2023, "Ring Attention with
// Blockwise Transformers for Near-Infinite Context"): ms::cpu::attentionBlockForward / attentionBlockBackward
// (kernels/cpu/ring_attention.cpp) are the reference, kernels/backend.h the contract. A rank's queries (qkv
// (B, Tq, 3C), q the first C floats of a row, H heads of hs = C/H) meet one block of keys and values (kv
// (B, Tk, 2 KV hs): the KV key heads, then the KV value heads of each row); query head h reads key/value head
// h / (H/KV) (grouped-query attention; Ainslie et al. 2023, "GQA"). Written for this engine after the fused
// attention of cuda_flash_attention.cu, whose scalar kernels these follow.
//
// Positions, not indices, decide the causal mask: each side's rows form at most two runs of consecutive
// positions (SeqPositions; the queries' split read as SeqPositions::at reads it, the keys' split clamped to
// [0, Tk] as the CPU's KeyRuns clamps it), so the keys a query at position p sees in a run are a prefix of
// it. A block of rows only visits the key tiles of that prefix for its largest position (forward, dQ), and
// the dK|dV kernel only the query tiles from its smallest key position on; the rest is masked per element.
//
// Forward: a block takes kWarps consecutive query rows of one (batch, query head), a warp per row, and walks
// the visible keys of its key/value head in tiles of 32 staged in shared memory (one key per lane), with
// the online softmax of FlashAttention (Dao et al. 2022, "FlashAttention", algorithm 1; Milakov and
// Gimelshein 2018): running maximum m, sum l = sum_j exp(s_j - m) and output accumulator rescaled by
// exp(m_old - m_new). The block's partial result is then merged into out and lse exactly as the contract
// says (Dao et al. 2022, section 3.1): with `first` it overwrites them (a row with no visible key gets out 0
// and lse -inf); otherwise lse' = logaddexp(lse, lseBlk) = max + log1p(exp(-|lse - lseBlk|)) and
// out' = out exp(lse - lse') + acc exp(m - lse') (acc / l being the block's output and lseBlk = m + log l),
// and a row that sees no key of the block is left as it is. Each row's out and lse are read and written by
// the one warp that owns it.
//
// Backward (Dao et al. 2022, appendix B.2, from the FINAL out and lse of the forward): D = rowsum(dout * out)
// per (batch, query head, row) first, into the calling thread's reduction scratch (detail::
// reductionScratch; out may be bf16, widened exactly there and nowhere else: D is its only reader). Then
// P = exp(scale s - lse), dP = dout . v and dS = P (dP - D) are recomputed twice, by two kernels that each
// own what they write:
// - dK|dV: a block per (batch, key/value head, kWarps keys), a warp per key, walks the group's H/KV query
//   heads in order and, in each, the visible query rows in tiles of 32: dv_j += sum P_ij dout_i,
//   dk_j += scale sum dS_ij q_i, the group's heads summed in registers before one += into dkv.
// - dQ: a block per (batch, query head, kWarps query rows), a warp per row, walks the visible key tiles:
//   dq_i += scale sum_j dS_ij k_j, into the q part of dqkv (its k and v parts are never touched).
// Rows whose lse is -inf (no key visible in any block) have no gradient and are skipped. No atomics: every
// element of dqkv and dkv is summed by one thread in a fixed order, so the results are the same bits run
// after run (the engine's equivalence tests compare runs bit for bit).
//
// Precision: fp32 throughout. In GemmMode::Bf16, q, k, v and dout are rounded to bf16 (nearest even) where
// they are loaded, as the CPU backend rounds them before its block ops and as the fused attention rounds
// its operands; every product and sum stays fp32. Unlike the fused attention's bf16 path, the probabilities
// and dS are NOT rounded (the CPU reference does not round them either: the two backends then differ by
// fp32 summation order only). GemmMode::Tf32 computes in fp32, as the fused attention's scalar kernel does
// (TF32 is a mode of cuBLAS's GEMMs; these kernels are none). Head sizes up to kRingAttentionMaxHeadSize: the
// per-lane accumulators hold ceil(hs / 32) rounded up to 1, 2, 4 or 8 values (a template argument), and
// head sizes above 128 ask for more than the default 48 KB of shared memory (cudaFuncSetAttribute).
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_scalar_tiles.cuh"

namespace ms::cuda {
namespace {

using detail::kWarpSize;

constexpr int kWarps = detail::kScalarWarps;  // rows (forward, dQ) or keys (dK|dV) per block, one per warp
constexpr int kTile = detail::kScalarTile;    // staged rows per tile, one per lane
constexpr int kThreads = kWarps * kWarpSize;
constexpr unsigned kFull = 0xffffffffu;
constexpr unsigned kMaxGridY = 65535;
constexpr size_t kDefaultSharedBytes = 48 * 1024;  // what a launch may take without opting in

// The rows of one side of a block in their two runs: rows [0, end[0]) and [end[0], end[1]), the position
// of row t in run r being base[r] + t. Built on the host (queryRuns, keyRuns) and passed by value.
struct Runs {
  int end[2];
  long long base[2];
};

// Queries: rows [0, split) at start0 + t, the others at start1 + (t - split), split as given
// (SeqPositions::at, which the CPU reads the query positions with).
Runs queryRuns(SeqPositions p, int T) {
  const int s = std::clamp(p.split, 0, T);
  return Runs{{s, T}, {p.start0, (long long)p.start1 - p.split}};
}

// Keys: the same with the split clamped to [0, Tk] first (the CPU's KeyRuns).
Runs keyRuns(SeqPositions p, int T) {
  const int s = std::clamp(p.split, 0, T);
  return Runs{{s, T}, {p.start0, (long long)p.start1 - s}};
}

__device__ inline long long minLL(long long a, long long b) {
  return a < b ? a : b;
}
__device__ inline long long maxLL(long long a, long long b) {
  return a < b ? b : a;
}

__device__ inline int runBegin(const Runs& r, int run) {
  return run == 0 ? 0 : r.end[0];
}

__device__ inline long long position(const Runs& r, int t) {
  return t < r.end[0] ? r.base[0] + t : r.base[1] + t;
}

// The end of the keys of run `run` that a query at position p sees (causal): base + j <= p.
__device__ inline int visibleKeyEnd(const Runs& keys, int run, long long p) {
  const long long begin = runBegin(keys, run), end = keys.end[run];
  return int(minLL(end, maxLL(begin, p - keys.base[run] + 1)));
}

// The first query row of run `run` that sees a key at position kp (causal): base + i >= kp.
__device__ inline int visibleQueryBegin(const Runs& queries, int run, long long kp) {
  const long long begin = runBegin(queries, run), end = queries.end[run];
  return int(minLL(end, maxLL(begin, kp - queries.base[run])));
}

// The tiles' helpers (roundIf, tileStride, sharedBytes, loadTile, loadRow, dot, accumulateTile):
// cuda_scalar_tiles.cuh, shared with the scalar FlashAttention kernels.
using detail::accumulateTile;
using detail::dot;
using detail::loadRow;
using detail::loadTile;
using detail::roundIf;
using detail::sharedBytes;
using detail::tileStride;

// grid (B * H, ceil(Tq / kWarps)), a warp per query row: the block's partial result merged into out
// (B, Tq, C) and lse (B, H, Tq).
template <int kDims>
__global__ void __launch_bounds__(kThreads)
    ringForwardKernel(float* out, float* lse, const float* qkv, const float* kv, int Tq, int C, int H,
                      int group, int hs, Runs queries, Runs keys, float scale, bool causal, bool first,
                      bool bf16) {
  extern __shared__ float smem[];
  const int ld = tileStride(hs);
  float* kS = smem;             // (kTile, ld)
  float* vS = kS + kTile * ld;  // (kTile, ld)
  float* qW = vS + kTile * ld;  // (kWarps, hs)
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int bh = blockIdx.x;
  const int b = bh / H;
  const int h = bh - b * H;
  const int Tk = keys.end[1];
  const int Ckv = (H / group) * hs;
  const size_t C3 = size_t(3) * C;
  const size_t C2 = size_t(2) * Ckv;
  const float* k0 = kv + size_t(b) * Tk * C2 + size_t(h / group) * hs;  // key head of (b, key 0)
  const float* v0 = k0 + Ckv;
  const int i0 = blockIdx.y * kWarps;
  const int i = i0 + warp;
  const bool active = i < Tq;  // warp-uniform
  float* q = qW + warp * hs;
  loadRow(q, qkv + (size_t(b) * Tq + (active ? i : 0)) * C3 + size_t(h) * hs, hs, active, bf16);
  const long long p = position(queries, active ? i : 0);
  long long pMax = LLONG_MIN;  // the block's largest query position: block-uniform
  for (int w = 0; w < kWarps && i0 + w < Tq; ++w) pMax = maxLL(pMax, position(queries, i0 + w));

  float o[kDims];
#pragma unroll
  for (int r = 0; r < kDims; ++r) o[r] = 0.0f;
  float m = -INFINITY;  // running maximum of the row's visible scores
  float l = 0.0f;       // running sum of exp(score - m)
#pragma unroll
  for (int run = 0; run < 2; ++run) {
    const int jEnd = causal ? visibleKeyEnd(keys, run, pMax) : keys.end[run];
    for (int j0 = runBegin(keys, run); j0 < jEnd; j0 += kTile) {  // block-uniform: every barrier is met
      __syncthreads();  // the previous tile is consumed (and q is written before its first use)
      loadTile(kS, k0, C2, j0, jEnd, hs, bf16);
      loadTile(vS, v0, C2, j0, jEnd, hs, bf16);
      __syncthreads();
      if (!active) continue;
      const int j = j0 + lane;
      float s = -INFINITY;
      if (j < jEnd && (!causal || keys.base[run] + j <= p)) s = dot(q, kS + lane * ld, hs) * scale;
      const float mNew = fmaxf(m, detail::warpMax(s));
      if (mNew == -INFINITY) continue;     // nothing visible yet: warp-uniform, l and o stay 0
      const float alpha = expf(m - mNew);  // 0 on the first visible tile (m = -inf, mNew finite)
      const float e = expf(s - mNew);      // 0 where masked
      l = l * alpha + detail::warpSum(e);
#pragma unroll
      for (int r = 0; r < kDims; ++r) o[r] *= alpha;
      accumulateTile(o, e, vS, hs);
      m = mNew;
    }
  }
  if (!active) return;
  float* orow = out + (size_t(b) * Tq + i) * C + size_t(h) * hs;
  float* lrow = lse + size_t(bh) * Tq + i;
  if (l == 0.0f) {  // no visible key (warp-uniform): first writes the empty row, a merge leaves it
    if (first) {
#pragma unroll
      for (int r = 0; r < kDims; ++r) {
        const int d = lane + r * kWarpSize;
        if (d < hs) orow[d] = 0.0f;
      }
      if (lane == 0) *lrow = -INFINITY;
    }
    return;
  }
  const float lseBlk = m + logf(l);
  // Lane 0 alone reads and writes the row's lse; the others get it by shuffle.
  const float old = first ? -INFINITY : __shfl_sync(kFull, lane == 0 ? *lrow : 0.0f, 0);
  if (old == -INFINITY) {  // nothing to merge with: out = acc / l
    const float inv = 1.0f / l;
#pragma unroll
    for (int r = 0; r < kDims; ++r) {
      const int d = lane + r * kWarpSize;
      if (d < hs) orow[d] = o[r] * inv;
    }
    if (lane == 0) *lrow = lseBlk;
    return;
  }
  const float merged = fmaxf(old, lseBlk) + log1pf(expf(-fabsf(old - lseBlk)));
  const float wOld = expf(old - merged);
  const float wBlk = expf(m - merged);  // = exp(lseBlk - merged) / l: acc is not yet divided by l
#pragma unroll
  for (int r = 0; r < kDims; ++r) {
    const int d = lane + r * kWarpSize;
    if (d < hs) orow[d] = orow[d] * wOld + o[r] * wBlk;
  }
  if (lane == 0) *lrow = merged;
}

// D (B, H, Tq) = rowsum(dout * out) per head, a warp per row; dout rounded in bf16 mode (the operand the
// other products see), out fp32 or bf16 (out16, widened exactly).
__global__ void ringRowDotKernel(float* D, const float* dout, const float* out32, const uint16_t* out16,
                                 size_t rows, int Tq, int C, int H, int hs, bool bf16) {
  const int lane = threadIdx.x % kWarpSize;
  const size_t row = size_t(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // whole warp
  const size_t bh = row / size_t(Tq);
  const size_t i = row - bh * Tq;
  const size_t b = bh / size_t(H);
  const size_t h = bh - b * H;
  const size_t off = (b * Tq + i) * C + h * hs;
  float s = 0.0f;
  for (int d = lane; d < hs; d += kWarpSize) {
    const float o = out16 ? __uint_as_float(uint32_t(out16[off + d]) << 16) : out32[off + d];
    s = fmaf(roundIf(dout[off + d], bf16), o, s);
  }
  s = detail::warpSum(s);
  if (lane == 0) D[row] = s;
}

// grid (B * KV, ceil(Tk / kWarps)), a warp per KEY j of key/value head g: dk_j += scale sum dS_ij q_i and
// dv_j += sum P_ij dout_i over the visible rows i of the group's query heads, in head order.
template <int kDims>
__global__ void __launch_bounds__(kThreads)
    ringBackwardKVKernel(float* dkv, const float* dout, const float* qkv, const float* kv, const float* lse,
                         const float* D, int Tq, int C, int H, int group, int hs, Runs queries, Runs keys,
                         float scale, bool causal, bool bf16) {
  extern __shared__ float smem[];
  const int ld = tileStride(hs);
  float* qS = smem;                // (kTile, ld) queries
  float* gS = qS + kTile * ld;     // (kTile, ld) their output gradients
  float* kW = gS + kTile * ld;     // (kWarps, hs)
  float* vW = kW + kWarps * hs;    // (kWarps, hs)
  float* lseS = vW + kWarps * hs;  // (kTile) the queries' log-sum-exp
  float* dotS = lseS + kTile;      // (kTile) and their D
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int KV = H / group;
  const int b = blockIdx.x / KV;
  const int g = blockIdx.x - b * KV;
  const int Tk = keys.end[1];
  const int Ckv = KV * hs;
  const size_t C3 = size_t(3) * C;
  const size_t C2 = size_t(2) * Ckv;
  const int j0 = blockIdx.y * kWarps;
  const int j = j0 + warp;
  const bool active = j < Tk;
  const size_t kvOff = (size_t(b) * Tk + (active ? j : 0)) * C2 + size_t(g) * hs;
  float* k = kW + warp * hs;
  float* v = vW + warp * hs;
  loadRow(k, kv + kvOff, hs, active, bf16);
  loadRow(v, kv + kvOff + Ckv, hs, active, bf16);
  const long long kp = position(keys, active ? j : 0);
  long long kMin = LLONG_MAX;  // the block's smallest key position: block-uniform
  for (int w = 0; w < kWarps && j0 + w < Tk; ++w) kMin = minLL(kMin, position(keys, j0 + w));

  float dk[kDims], dv[kDims];
#pragma unroll
  for (int r = 0; r < kDims; ++r) dk[r] = dv[r] = 0.0f;
  for (int h = g * group; h < (g + 1) * group; ++h) {
    const float* qBase = qkv + size_t(b) * Tq * C3 + size_t(h) * hs;
    const float* gBase = dout + size_t(b) * Tq * C + size_t(h) * hs;
    const float* lseRow = lse + (size_t(b) * H + h) * Tq;
    const float* dRow = D + (size_t(b) * H + h) * Tq;
#pragma unroll
    for (int run = 0; run < 2; ++run) {
      const int iEnd = queries.end[run];
      for (int i0 = causal ? visibleQueryBegin(queries, run, kMin) : runBegin(queries, run); i0 < iEnd;
           i0 += kTile) {
        __syncthreads();
        loadTile(qS, qBase, C3, i0, iEnd, hs, bf16);
        loadTile(gS, gBase, C, i0, iEnd, hs, bf16);
        if (threadIdx.x < kTile) {
          const int i = i0 + threadIdx.x;
          lseS[threadIdx.x] = i < iEnd ? lseRow[i] : -INFINITY;  // -inf: no gradient
          dotS[threadIdx.x] = i < iEnd ? dRow[i] : 0.0f;
        }
        __syncthreads();
        if (!active) continue;
        const int i = i0 + lane;
        const float rowLse = lseS[lane];
        float p = 0.0f, ds = 0.0f;
        if (i < iEnd && rowLse != -INFINITY && (!causal || kp <= queries.base[run] + i)) {
          p = expf(dot(qS + lane * ld, k, hs) * scale - rowLse);
          const float dp = dot(gS + lane * ld, v, hs);
          ds = p * (dp - dotS[lane]);
        }
        accumulateTile(dv, p, gS, hs);
        accumulateTile(dk, ds, qS, hs);
      }
    }
  }
  if (!active) return;
  float* dkRow = dkv + kvOff;
  float* dvRow = dkRow + Ckv;
#pragma unroll
  for (int r = 0; r < kDims; ++r) {
    const int d = lane + r * kWarpSize;
    if (d < hs) {
      dkRow[d] += scale * dk[r];
      dvRow[d] += dv[r];
    }
  }
}

// grid (B * H, ceil(Tq / kWarps)), a warp per QUERY row i: dq_i += scale sum_j dS_ij k_j over the block's
// visible keys.
template <int kDims>
__global__ void __launch_bounds__(kThreads)
    ringBackwardQKernel(float* dqkv, const float* dout, const float* qkv, const float* kv, const float* lse,
                        const float* D, int Tq, int C, int H, int group, int hs, Runs queries, Runs keys,
                        float scale, bool causal, bool bf16) {
  extern __shared__ float smem[];
  const int ld = tileStride(hs);
  float* kS = smem;              // (kTile, ld)
  float* vS = kS + kTile * ld;   // (kTile, ld)
  float* qW = vS + kTile * ld;   // (kWarps, hs)
  float* gW = qW + kWarps * hs;  // (kWarps, hs)
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int bh = blockIdx.x;
  const int b = bh / H;
  const int h = bh - b * H;
  const int Tk = keys.end[1];
  const int Ckv = (H / group) * hs;
  const size_t C3 = size_t(3) * C;
  const size_t C2 = size_t(2) * Ckv;
  const float* k0 = kv + size_t(b) * Tk * C2 + size_t(h / group) * hs;
  const float* v0 = k0 + Ckv;
  const int i0 = blockIdx.y * kWarps;
  const int i = i0 + warp;
  const bool active = i < Tq;
  const int ia = active ? i : 0;
  float* q = qW + warp * hs;
  float* g = gW + warp * hs;
  loadRow(q, qkv + (size_t(b) * Tq + ia) * C3 + size_t(h) * hs, hs, active, bf16);
  loadRow(g, dout + (size_t(b) * Tq + ia) * C + size_t(h) * hs, hs, active, bf16);
  const float rowLse = active ? lse[size_t(bh) * Tq + i] : -INFINITY;
  const float rowD = active ? D[size_t(bh) * Tq + i] : 0.0f;
  const bool live = rowLse != -INFINITY;  // warp-uniform; false for inactive rows too
  const long long p = position(queries, ia);
  long long pMax = LLONG_MIN;
  for (int w = 0; w < kWarps && i0 + w < Tq; ++w) pMax = maxLL(pMax, position(queries, i0 + w));

  float dq[kDims];
#pragma unroll
  for (int r = 0; r < kDims; ++r) dq[r] = 0.0f;
#pragma unroll
  for (int run = 0; run < 2; ++run) {
    const int jEnd = causal ? visibleKeyEnd(keys, run, pMax) : keys.end[run];
    for (int j0 = runBegin(keys, run); j0 < jEnd; j0 += kTile) {
      __syncthreads();
      loadTile(kS, k0, C2, j0, jEnd, hs, bf16);
      loadTile(vS, v0, C2, j0, jEnd, hs, bf16);
      __syncthreads();
      if (!live) continue;
      const int j = j0 + lane;
      float ds = 0.0f;
      if (j < jEnd && (!causal || keys.base[run] + j <= p)) {
        const float pr = expf(dot(q, kS + lane * ld, hs) * scale - rowLse);
        const float dp = dot(g, vS + lane * ld, hs);
        ds = pr * (dp - rowD);
      }
      accumulateTile(dq, ds, kS, hs);
    }
  }
  if (!live) return;
  float* dqRow = dqkv + (size_t(b) * Tq + i) * C3 + size_t(h) * hs;
#pragma unroll
  for (int r = 0; r < kDims; ++r) {
    const int d = lane + r * kWarpSize;
    if (d < hs) dqRow[d] += scale * dq[r];
  }
}

// Calls launch(std::integral_constant<int, kDims>) with the accumulator slots per lane for head size hs.
template <typename Launch>
Status withDims(int hs, Launch&& launch) {
  if (hs <= 32) return launch(std::integral_constant<int, 1>{});
  if (hs <= 64) return launch(std::integral_constant<int, 2>{});
  if (hs <= 128) return launch(std::integral_constant<int, 4>{});
  return launch(std::integral_constant<int, 8>{});
}

// Lets `kernel` take `bytes` of dynamic shared memory (head sizes above 128 need more than the default).
template <typename Kernel>
Status allowShared(Kernel* kernel, size_t bytes, const char* what) {
  if (bytes <= kDefaultSharedBytes) return Status::ok();
  return cudaStatus(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
                    what);
}

// The checks both ops make, in the CPU backend's order: the head counts first (whatever the other sizes),
// then, for a non-empty call, the shape. ok and *empty set when there is nothing to compute.
Status checkRingShape(int B, int Tq, int Tk, int C, int H, int KV, const char* what, bool* empty) {
  const std::string op(what);
  if (H < 1 || KV < 1 || H % KV != 0)
    return Status::error(op + ": the query heads (" + std::to_string(H) +
                         ") must be a positive multiple of the key/value heads (" + std::to_string(KV) + ")");
  *empty = B <= 0 || Tq <= 0 || C <= 0;
  if (*empty) return Status::ok();
  if (C % H != 0)
    return Status::error(op + ": channels " + std::to_string(C) + " not divisible by heads " +
                         std::to_string(H));
  if (C / H > kRingAttentionMaxHeadSize)
    return Status::error(op + ": head size " + std::to_string(C / H) + " above " +
                         std::to_string(kRingAttentionMaxHeadSize));
  if ((size_t(Tq) + kWarps - 1) / kWarps > kMaxGridY ||
      (size_t(std::max(Tk, 0)) + kWarps - 1) / kWarps > kMaxGridY)
    return Status::error(op + ": block of " + std::to_string(Tq) + " queries and " + std::to_string(Tk) +
                         " keys too long");
  if (size_t(B) * H > size_t(INT32_MAX)) return Status::error(op + ": too many (batch, head) pairs");
  return Status::ok();
}

}  // namespace

Status attentionBlockForward(float* out, float* lse, const float* qkv, const float* kv, int B, int Tq, int Tk,
                             int C, int H, int KV, SeqPositions qpos, SeqPositions kpos, bool causal,
                             bool first, cudaStream_t stream) {
  const char* what = "attentionBlockForward";
  bool empty = false;
  MS_TRY(checkRingShape(B, Tq, Tk, C, H, KV, what, &empty));
  if (empty) return Status::ok();
  Tk = std::max(Tk, 0);  // no keys: every row sees none (first writes the empty rows)
  const int hs = C / H;
  const float scale = 1.0f / std::sqrt(float(hs));
  const bool bf16 = gemmMode() == GemmMode::Bf16;
  const Runs queries = queryRuns(qpos, Tq), keys = keyRuns(kpos, Tk);
  const size_t shared = sharedBytes(hs);
  const dim3 grid(unsigned(B * H), unsigned((Tq + kWarps - 1) / kWarps));
  return withDims(hs, [&](auto dims) -> Status {
    constexpr int kDims = decltype(dims)::value;
    MS_TRY(allowShared(ringForwardKernel<kDims>, shared, what));
    ringForwardKernel<kDims><<<grid, kThreads, shared, stream>>>(out, lse, qkv, kv, Tq, C, H, H / KV, hs,
                                                                 queries, keys, scale, causal, first, bf16);
    return checkLaunch(what);
  });
}

Status attentionBlockBackward(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv,
                              TensorIn out, const float* lse, int B, int Tq, int Tk, int C, int H, int KV,
                              SeqPositions qpos, SeqPositions kpos, bool causal, cudaStream_t stream) {
  const char* what = "attentionBlockBackward";
  bool empty = false;
  MS_TRY(checkRingShape(B, Tq, Tk, C, H, KV, what, &empty));
  if (out.bf16 && gemmMode() != GemmMode::Bf16)
    return Status::error(std::string(what) + ": a bf16 out needs the bf16 GEMM precision");
  if (empty || Tk <= 0) return Status::ok();
  const int hs = C / H;
  const int group = H / KV;
  const float scale = 1.0f / std::sqrt(float(hs));
  const bool bf16 = gemmMode() == GemmMode::Bf16;
  const Runs queries = queryRuns(qpos, Tq), keys = keyRuns(kpos, Tk);
  const size_t shared = sharedBytes(hs);

  const size_t rows = size_t(B) * H * Tq;
  const Expected<float*> scratch = detail::reductionScratch(rows, stream, "attentionBlockBackward: D");
  if (!scratch) return scratch.status();
  float* D = *scratch;  // (B, H, Tq)
  ringRowDotKernel<<<unsigned((rows + kWarps - 1) / kWarps), kThreads, 0, stream>>>(
      D, dout, out.f32(), reinterpret_cast<const uint16_t*>(out.b16()), rows, Tq, C, H, hs, bf16);
  MS_TRY(checkLaunch("attentionBlockBackward: rowsum(dout * out)"));

  const dim3 kvGrid(unsigned(B * KV), unsigned((Tk + kWarps - 1) / kWarps));
  const dim3 qGrid(unsigned(B * H), unsigned((Tq + kWarps - 1) / kWarps));
  return withDims(hs, [&](auto dims) -> Status {
    constexpr int kDims = decltype(dims)::value;
    MS_TRY(allowShared(ringBackwardKVKernel<kDims>, shared, what));
    MS_TRY(allowShared(ringBackwardQKernel<kDims>, shared, what));
    ringBackwardKVKernel<kDims><<<kvGrid, kThreads, shared, stream>>>(
        dkv, dout, qkv, kv, lse, D, Tq, C, H, group, hs, queries, keys, scale, causal, bf16);
    MS_TRY(checkLaunch("attentionBlockBackward: dk, dv"));
    ringBackwardQKernel<kDims><<<qGrid, kThreads, shared, stream>>>(
        dqkv, dout, qkv, kv, lse, D, Tq, C, H, group, hs, queries, keys, scale, causal, bf16);
    return checkLaunch("attentionBlockBackward: dq");
  });
}

}  // namespace ms::cuda
