// FlashAttention on tensor cores through mma.sync (PTX m16n8k16, bf16 operands, fp32 accumulation) and
// ldmatrix: the default bf16 attention kernel. Same contract, layout and numbers saved as the scalar kernel
// (cuda_flash_attention.cu) and the wmma one (cuda_flash_attention_tc.cu): q, k, v, dout, P (before P V and
// P^T dO) and dS (before its products) are rounded to bf16 (nearest even), every sum is fp32, lse (B, H, T)
// is the natural log-sum-exp, gradients ACCUMULATE into dqkv, every output element is written by one thread
// (no atomics: deterministic).
//
// Why a second tensor-core kernel: wmma leaves the place of each accumulator element in the lanes
// unspecified, so the wmma kernel sends every score tile through shared memory to apply the softmax, and
// reads P back for the next product. mma.sync's fragment layout is fixed by PTX (ISA, "Matrix fragments for
// mma.m16n8k16"), so here the scores stay in registers: a lane holds, per 8-column block n of a 16-row strip,
// c0, c1 = (row g, columns 8n + 2t, +1) and c2, c3 = (row g + 8, same columns), g = lane / 4, t = lane % 4,
// which is exactly what the A operand of the next product wants from a 16 x 16 block (a0 = (g, 2t..2t+1),
// a1 = (g + 8, 2t..), a2 = (g, 2t + 8..), a3 = (g + 8, 2t + 8..)): P and dS go from accumulators to operands
// by packing two floats into a bf16x2, with no shared-memory round trip (FlashAttention-2's register reuse,
// Dao 2023, section 3.3). Row statistics (maximum, sum) reduce over the 4 lanes of a row with two shuffles.
// On the H100 (GPT-2 124M attention, B 8, T 1024, H 12, hs 64, causal) the wmma kernels took 0.274 ms forward
// and 0.766 ms backward; see bench_attention for this one.
//
// Algorithm: FlashAttention-2 (Dao 2023, algorithms 1 and 2) with the backward split in two deterministic
// kernels as in the wmma file: dk, dv (a block per 64 keys, walking the query tiles) and dq (a block per 64
// queries, walking the key tiles); D = rowsum(bf16(dout) * out) comes from the scalar file's kernel first.
// The online softmax (Milakov and Gimelshein 2018) runs in base 2: scores are scaled by scale * log2(e) and
// exponentiated with exp2f (one MUFU instruction), the saved lse converted back (lse = m ln 2 + ln l).
//
// Tiling: 4 warps, 64 rows per block (16 per warp: queries in the forward and dq, keys in dk/dv); tiles of 64
// rows of the other side staged in shared memory as bf16 (row stride hs + 8 elements: 16 bytes of padding, so
// the 8 row addresses of an ldmatrix fall in distinct bank groups), converted from the fp32 activations while
// loading (cuda_flash_tiles.cuh). The backward walks each 64-row tile in two 32-row halves to bound the
// registers of S and dP. Operands: A blocks of a warp's own rows with ldmatrix.x4; B = K^T, V^T, Q^T, dO^T
// (stored rows = the product's columns) with ldmatrix.x4, B = V, dO, Q, K (stored rows = the product's
// reduction index) with ldmatrix.x4.trans. Causal blocks of the forward and dq run heaviest first (the last
// query tiles see the most keys), so the grid's tail is short ones.
//
// Synchronisation: __syncthreads only at the top level of a kernel (loop bounds depend on blockIdx only;
// warps without rows in range skip work with `continue`): (a) before loading a tile, (b) after loading it.
// Shared memory (bytes): 3 tiles forward, 4 backward, + 2 x 64 floats in dk/dv; hs 64: 27648, 37376;
// hs 128: 52224, 70144 (above 48 KB: every launch opts in).
#include <cuda_bf16.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_flash_attention_tc.h"
#include "kernels/cuda/cuda_flash_tiles.cuh"

namespace ms::cuda::detail {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kStrip = 16;              // rows per warp
constexpr int kRows = kWarps * kStrip;  // rows a block owns
constexpr int kCols = 64;               // rows of each tile it walks over
constexpr int kHalf = 32;               // the backward's sub-tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
static_assert(kRows == kCols, "causal tile bounds assume square blocks");
static_assert(kThreads >= kCols, "one thread per row loads lse and D");

constexpr size_t align128(size_t bytes) {
  return (bytes + 127) / 128 * 128;
}

template <int D>
struct MmaTile {
  static constexpr int kLd = D + 8;  // bf16 row stride: 16 bytes of padding
  static constexpr size_t kBytes = align128(size_t(kCols) * kLd * sizeof(bf16));
  static constexpr size_t kForwardSmem = 3 * kBytes;                                           // Q, K, V
  static constexpr size_t kBackwardKVSmem = 4 * kBytes + 2 * align128(kCols * sizeof(float));  // + lse, D
  static constexpr size_t kBackwardQSmem = 4 * kBytes;                                         // Q, dO, K, V
  static constexpr int kRowStats = int(align128(kCols * sizeof(float)) / sizeof(float));  // lse to D, floats
};

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define MS_FLASH_MMA_DEVICE 1
#endif

#ifdef MS_FLASH_MMA_DEVICE

constexpr unsigned kFull = 0xffffffffu;

__device__ inline uint32_t sharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 bf16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, r[i] receives its fragment.
__device__ inline void ldmatrix4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(sharedAddress(p)));
}
__device__ inline void ldmatrix4Trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(sharedAddress(p)));
}

// d (16x8, fp32) += a (16x16, bf16, row) b (16x8, bf16, col).
__device__ inline void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a bf16x2 (nearest even), the first in the low half: the lower column of an operand pair.
__device__ inline uint32_t packBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The A operand (16 x 16) at (row0, col0) of a row-major tile.
template <int Ld>
__device__ inline void loadA(uint32_t (&a)[4], const bf16* tile, int row0, int col0, int lane) {
  ldmatrix4(a, tile + (row0 + (lane & 15)) * Ld + col0 + (lane >> 4) * 8);
}

// B operands of two 8-column blocks, B[k][n] = X[n0 + n][k0 + k] for a row-major tile X (its rows are the
// product's columns): b[0], b[1] for columns n0..n0+7, b[2], b[3] for n0+8..n0+15.
template <int Ld>
__device__ inline void loadBRows(uint32_t (&b)[4], const bf16* tile, int n0, int k0, int lane) {
  const int i = lane >> 3;
  ldmatrix4(b, tile + (n0 + (lane & 7) + (i >> 1) * 8) * Ld + k0 + (i & 1) * 8);
}

// B operands of two 8-column blocks, B[k][n] = Y[k0 + k][n0 + n] for a row-major tile Y (its rows are the
// reduction index): transposed on load.
template <int Ld>
__device__ inline void loadBCols(uint32_t (&b)[4], const bf16* tile, int k0, int n0, int lane) {
  const int i = lane >> 3;
  ldmatrix4Trans(b, tile + (k0 + (lane & 7) + (i & 1) * 8) * Ld + n0 + (i >> 1) * 8);
}

// The A operand of a 16 x 16 block from two 8-column accumulator blocks (columns 16c.. and 16c + 8..).
__device__ inline void accToA(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = packBf16(lo[0], lo[1]);
  a[1] = packBf16(lo[2], lo[3]);
  a[2] = packBf16(hi[0], hi[1]);
  a[3] = packBf16(hi[2], hi[3]);
}

// Adds s * acc (rows row0 + g and row0 + g + 8, D columns) to dst's rows (stride `stride` floats), rows past
// T skipped. Each element is one thread's: deterministic.
template <int D>
__device__ inline void addRows(float* dst, size_t stride, const float (&acc)[D / 8][4], float s, int row0,
                               int T, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + g + 8 * half;
    if (row >= T) continue;
    float* p = dst + size_t(row) * stride + 2 * t;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      float2 v = *reinterpret_cast<float2*>(p + 8 * n);
      v.x += s * acc[n][2 * half];
      v.y += s * acc[n][2 * half + 1];
      *reinterpret_cast<float2*>(p + 8 * n) = v;
    }
  }
}

// grid (B * H, ceil(T / 64)), kThreads threads: out (B, T, C), lse (B, H, T).
template <int D>
__global__ void __launch_bounds__(kThreads)
    flashMmaForwardKernel(float* out, float* lse, const float* qkv, int T, int C, int H, float scale,
                          bool causal) {
  constexpr int kLd = MmaTile<D>::kLd;
  constexpr int kK = D / 16;  // 16-wide blocks of the head (reduction of Q K^T, column pairs of P V)
  constexpr int kN = D / 8;   // 8-column accumulator blocks of O
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qS = reinterpret_cast<bf16*>(smem);
  bf16* kS = reinterpret_cast<bf16*>(smem + MmaTile<D>::kBytes);
  bf16* vS = reinterpret_cast<bf16*>(smem + 2 * MmaTile<D>::kBytes);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane >> 2, t = lane & 3;

  const int bh = blockIdx.x;
  const int b = bh / H;
  const int h = bh - b * H;
  const size_t C3 = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * C3 + size_t(h) * D;
  const int tile = causal ? int(gridDim.y) - 1 - int(blockIdx.y) : int(blockIdx.y);  // heaviest first
  const int i0 = tile * kRows;
  const int w0 = i0 + warp * kStrip;
  const bool active = w0 < T;  // warp-uniform
  const int rowA = w0 + g, rowB = w0 + g + 8;

  loadTileBf16<D, kCols, kThreads>(qS, kLd, base, C3, i0, T);
  __syncthreads();
  uint32_t qa[kK][4];
  if (active) {
#pragma unroll
    for (int kk = 0; kk < kK; ++kk) loadA<kLd>(qa[kk], qS, warp * kStrip, kk * 16, lane);
  }
  float o[kN][4];
#pragma unroll
  for (int n = 0; n < kN; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // running maximum of rows g, g + 8 (base 2, scaled)
  float l[2] = {0.0f, 0.0f};            // this lane's part of the running sums
  const float scaleLog2 = scale * kLog2e;

  const int keys = causal ? min(T, i0 + kRows) : T;
  const int warpKeys = causal ? min(T, w0 + kStrip) : T;
  for (int j0 = 0; j0 < keys; j0 += kCols) {
    __syncthreads();  // (a) every warp is done with the previous K, V
    loadTileBf16<D, kCols, kThreads>(kS, kLd, base + C, C3, j0, T);
    loadTileBf16<D, kCols, kThreads>(vS, kLd, base + 2 * C, C3, j0, T);
    __syncthreads();  // (b) K, V visible
    if (!active) continue;
    // 16-key chunks holding a key some row of the warp sees (>= 1); the others are masked for all its rows.
    const int chunks = min(kCols / 16, (warpKeys - j0 + 15) / 16);
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int c = 0; c < kCols / 16; ++c) {
      if (c >= chunks) break;
#pragma unroll
      for (int kk = 0; kk < kK; ++kk) {
        uint32_t kb[4];
        loadBRows<kLd>(kb, kS, c * 16, kk * 16, lane);
        mma16816(s[2 * c], qa[kk], kb[0], kb[1]);
        mma16816(s[2 * c + 1], qa[kk], kb[2], kb[3]);
      }
    }
    // Mask (only where some key is past T or after some row of the warp), scale, row maxima.
    const bool edge = (causal && j0 + kCols - 1 > w0) || j0 + kCols > T;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[n][e] * scaleLog2;
        if (edge && !flashVisible(e < 2 ? rowA : rowB, j0 + 8 * n + 2 * t + (e & 1), T, causal))
          v = -INFINITY;
        s[n][e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    float mUse[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFull, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFull, mx[r], 2));
      const float mNew = fmaxf(m[r], mx[r]);
      // Nothing visible yet (a row past T under a causal mask can see nothing): keep O and l at 0.
      mUse[r] = mNew == -INFINITY ? 0.0f : mNew;
      alpha[r] = mNew == -INFINITY ? 1.0f : exp2f(m[r] - mNew);  // 0 on the first visible tile
      m[r] = mNew;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[n][e] - mUse[e >> 1]);  // masked: exp2(-inf) = 0
        s[n][e] = p;
        l[e >> 1] += p;  // unrounded, as the scalar kernel sums
      }
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
#pragma unroll
    for (int c = 0; c < kCols / 16; ++c) {
      if (c >= chunks) break;  // P is 0 there
      uint32_t pa[4];
      accToA(pa, s[2 * c], s[2 * c + 1]);
#pragma unroll
      for (int dp = 0; dp < kK; ++dp) {
        uint32_t vb[4];
        loadBCols<kLd>(vb, vS, c * 16, dp * 16, lane);
        mma16816(o[2 * dp], pa, vb[0], vb[1]);
        mma16816(o[2 * dp + 1], pa, vb[2], vb[3]);
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(kFull, l[r], 1);
    l[r] += __shfl_xor_sync(kFull, l[r], 2);
  }
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r == 0 ? rowA : rowB;
    const bool any = l[r] > 0.0f;
    inv[r] = any ? 1.0f / l[r] : 0.0f;
    if (t == 0 && row < T) lse[size_t(bh) * T + row] = any ? m[r] * kLn2 + logf(l[r]) : INFINITY;
  }
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    o[n][0] *= inv[0];
    o[n][1] *= inv[0];
    o[n][2] *= inv[1];
    o[n][3] *= inv[1];
  }
  float* outBase = out + size_t(b) * T * C + size_t(h) * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r == 0 ? rowA : rowB;
    if (row >= T) continue;
    float* p = outBase + size_t(row) * C + 2 * t;
#pragma unroll
    for (int n = 0; n < kN; ++n)
      *reinterpret_cast<float2*>(p + 8 * n) = make_float2(o[n][2 * r], o[n][2 * r + 1]);
  }
}

// grid (B * H, ceil(T / 64)), a block per 64 KEYS: dk += scale sum_i dS_ij q_i, dv += sum_i P_ij dout_i.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flashMmaBackwardKVKernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                             const float* Dvec, int T, int C, int H, float scale, bool causal) {
  constexpr int kLd = MmaTile<D>::kLd;
  constexpr int kK = D / 16;
  constexpr int kN = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* kS = reinterpret_cast<bf16*>(smem);
  bf16* vS = reinterpret_cast<bf16*>(smem + MmaTile<D>::kBytes);
  bf16* qS = reinterpret_cast<bf16*>(smem + 2 * MmaTile<D>::kBytes);
  bf16* gS = reinterpret_cast<bf16*>(smem + 3 * MmaTile<D>::kBytes);
  float* lseS = reinterpret_cast<float*>(smem + 4 * MmaTile<D>::kBytes);  // (64) base 2
  float* dotS = lseS + MmaTile<D>::kRowStats;                             // (64)
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane >> 2, t = lane & 3;

  const int bh = blockIdx.x;
  const int b = bh / H;
  const int h = bh - b * H;
  const size_t C3 = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * C3 + size_t(h) * D;
  const float* gBase = dout + size_t(b) * T * C + size_t(h) * D;
  const int j0 = blockIdx.y * kRows;  // the block's first key (causal: the first tiles have the most work)
  const int w0 = j0 + warp * kStrip;  // the warp's first key
  const bool active = w0 < T;
  const float scaleLog2 = scale * kLog2e;

  loadTileBf16<D, kCols, kThreads>(kS, kLd, base + C, C3, j0, T);
  loadTileBf16<D, kCols, kThreads>(vS, kLd, base + 2 * C, C3, j0, T);
  float dk[kN][4], dv[kN][4];
#pragma unroll
  for (int n = 0; n < kN; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;

  const int first = causal ? j0 : 0;  // causal: queries before j0 see none of the block's keys
  for (int iq0 = first; iq0 < T; iq0 += kCols) {
    __syncthreads();  // (a)
    loadTileBf16<D, kCols, kThreads>(qS, kLd, base, C3, iq0, T);
    loadTileBf16<D, kCols, kThreads>(gS, kLd, gBase, C, iq0, T);
    if (threadIdx.x < kCols) {
      const int i = iq0 + threadIdx.x;
      lseS[threadIdx.x] = i < T ? lse[size_t(bh) * T + i] * kLog2e : INFINITY;
      dotS[threadIdx.x] = i < T ? Dvec[size_t(bh) * T + i] : 0.0f;
    }
    __syncthreads();  // (b)
    if (!active) continue;
#pragma unroll
    for (int half = 0; half < kCols / kHalf; ++half) {
      const int q0 = iq0 + half * kHalf;  // the sub-tile's first query
      if (q0 >= T) break;
      if (causal && q0 + kHalf - 1 < w0) continue;  // every query precedes every key of the warp
      // S^T = K_w Q^T and dP^T = V_w dO^T: (16 keys, 32 queries).
      float st[4][4], dpt[4][4];
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kK; ++kk) {
        uint32_t ka[4], va[4];
        loadA<kLd>(ka, kS, warp * kStrip, kk * 16, lane);
        loadA<kLd>(va, vS, warp * kStrip, kk * 16, lane);
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          uint32_t qb[4], gb[4];
          loadBRows<kLd>(qb, qS, half * kHalf + np * 16, kk * 16, lane);
          mma16816(st[2 * np], ka, qb[0], qb[1]);
          mma16816(st[2 * np + 1], ka, qb[2], qb[3]);
          loadBRows<kLd>(gb, gS, half * kHalf + np * 16, kk * 16, lane);
          mma16816(dpt[2 * np], va, gb[0], gb[1]);
          mma16816(dpt[2 * np + 1], va, gb[2], gb[3]);
        }
      }
      // P^T = exp(S^T scale - lse), dS^T = P^T (dP^T - D), per column (query).
      const bool edge = (causal && q0 < w0 + kStrip - 1) || q0 + kHalf > T || w0 + kStrip > T;
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = half * kHalf + 8 * n + 2 * t + (e & 1);  // the query's row in the tile
          const int key = w0 + g + (e >= 2 ? 8 : 0);
          float p = exp2f(st[n][e] * scaleLog2 - lseS[qi]);
          if (edge && !(iq0 + qi < T && flashVisible(iq0 + qi, key, T, causal))) p = 0.0f;
          dpt[n][e] = p * (dpt[n][e] - dotS[qi]);
          st[n][e] = p;
        }
        // dV_w += P^T dO, dK_w += dS^T Q over the sub-tile's 32 queries.
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        uint32_t pa[4], dsa[4];
        accToA(pa, st[2 * c], st[2 * c + 1]);
        accToA(dsa, dpt[2 * c], dpt[2 * c + 1]);
#pragma unroll
        for (int dp = 0; dp < kK; ++dp) {
          uint32_t gb[4], qb[4];
          loadBCols<kLd>(gb, gS, half * kHalf + c * 16, dp * 16, lane);
          mma16816(dv[2 * dp], pa, gb[0], gb[1]);
          mma16816(dv[2 * dp + 1], pa, gb[2], gb[3]);
          loadBCols<kLd>(qb, qS, half * kHalf + c * 16, dp * 16, lane);
          mma16816(dk[2 * dp], dsa, qb[0], qb[1]);
          mma16816(dk[2 * dp + 1], dsa, qb[2], qb[3]);
        }
      }
    }
  }
  if (!active) return;
  float* dkBase = dqkv + size_t(b) * T * C3 + C + size_t(h) * D;
  addRows<D>(dkBase, C3, dk, scale, w0, T, lane);
  addRows<D>(dkBase + C, C3, dv, 1.0f, w0, T, lane);
}

// grid (B * H, ceil(T / 64)), a block per 64 QUERIES: dq_i += scale sum_j dS_ij k_j.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flashMmaBackwardQKernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                            const float* Dvec, int T, int C, int H, float scale, bool causal) {
  constexpr int kLd = MmaTile<D>::kLd;
  constexpr int kK = D / 16;
  constexpr int kN = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qS = reinterpret_cast<bf16*>(smem);
  bf16* gS = reinterpret_cast<bf16*>(smem + MmaTile<D>::kBytes);
  bf16* kS = reinterpret_cast<bf16*>(smem + 2 * MmaTile<D>::kBytes);
  bf16* vS = reinterpret_cast<bf16*>(smem + 3 * MmaTile<D>::kBytes);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane >> 2, t = lane & 3;

  const int bh = blockIdx.x;
  const int b = bh / H;
  const int h = bh - b * H;
  const size_t C3 = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * C3 + size_t(h) * D;
  const float* gBase = dout + size_t(b) * T * C + size_t(h) * D;
  const int tile = causal ? int(gridDim.y) - 1 - int(blockIdx.y) : int(blockIdx.y);  // heaviest first
  const int i0 = tile * kRows;
  const int w0 = i0 + warp * kStrip;
  const bool active = w0 < T;
  const int rowA = w0 + g, rowB = w0 + g + 8;
  const float scaleLog2 = scale * kLog2e;
  // The rows' lse (base 2) and D, in registers: a lane's rows are fixed.
  const float lseA = rowA < T ? lse[size_t(bh) * T + rowA] * kLog2e : INFINITY;
  const float lseB = rowB < T ? lse[size_t(bh) * T + rowB] * kLog2e : INFINITY;
  const float dotA = rowA < T ? Dvec[size_t(bh) * T + rowA] : 0.0f;
  const float dotB = rowB < T ? Dvec[size_t(bh) * T + rowB] : 0.0f;

  loadTileBf16<D, kCols, kThreads>(qS, kLd, base, C3, i0, T);
  loadTileBf16<D, kCols, kThreads>(gS, kLd, gBase, C, i0, T);
  float dq[kN][4];
#pragma unroll
  for (int n = 0; n < kN; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  const int keys = causal ? min(T, i0 + kRows) : T;
  const int warpKeys = causal ? min(T, w0 + kStrip) : T;
  for (int j0 = 0; j0 < keys; j0 += kCols) {
    __syncthreads();  // (a)
    loadTileBf16<D, kCols, kThreads>(kS, kLd, base + C, C3, j0, T);
    loadTileBf16<D, kCols, kThreads>(vS, kLd, base + 2 * C, C3, j0, T);
    __syncthreads();  // (b) K, V (and, the first time, Q, dO) visible
    if (!active) continue;
#pragma unroll
    for (int half = 0; half < kCols / kHalf; ++half) {
      const int k0 = j0 + half * kHalf;  // the sub-tile's first key
      if (k0 >= warpKeys) break;         // no row of the warp sees it or later keys
      float s[4][4], dp[4][4];           // S = Q_w K^T, dP = dO_w V^T: (16 queries, 32 keys)
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kK; ++kk) {
        uint32_t qa[4], ga[4];
        loadA<kLd>(qa, qS, warp * kStrip, kk * 16, lane);
        loadA<kLd>(ga, gS, warp * kStrip, kk * 16, lane);
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          uint32_t kb[4], vb[4];
          loadBRows<kLd>(kb, kS, half * kHalf + np * 16, kk * 16, lane);
          mma16816(s[2 * np], qa, kb[0], kb[1]);
          mma16816(s[2 * np + 1], qa, kb[2], kb[3]);
          loadBRows<kLd>(vb, vS, half * kHalf + np * 16, kk * 16, lane);
          mma16816(dp[2 * np], ga, vb[0], vb[1]);
          mma16816(dp[2 * np + 1], ga, vb[2], vb[3]);
        }
      }
      const bool edge = (causal && k0 + kHalf - 1 > w0) || k0 + kHalf > T;
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool upper = e >= 2;
          float p = exp2f(s[n][e] * scaleLog2 - (upper ? lseB : lseA));
          if (edge && !flashVisible(upper ? rowB : rowA, k0 + 8 * n + 2 * t + (e & 1), T, causal)) p = 0.0f;
          s[n][e] = p * (dp[n][e] - (upper ? dotB : dotA));  // dS
        }
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        uint32_t dsa[4];
        accToA(dsa, s[2 * c], s[2 * c + 1]);
#pragma unroll
        for (int d2 = 0; d2 < kK; ++d2) {
          uint32_t kb[4];
          loadBCols<kLd>(kb, kS, half * kHalf + c * 16, d2 * 16, lane);
          mma16816(dq[2 * d2], dsa, kb[0], kb[1]);
          mma16816(dq[2 * d2 + 1], dsa, kb[2], kb[3]);
        }
      }
    }
  }
  if (!active) return;
  addRows<D>(dqkv + size_t(b) * T * C3 + size_t(h) * D, C3, dq, scale, w0, T, lane);
}

#else  // compute capability below 8.0: never launched (flashTcDevice), present so that the host code links

template <int D>
__global__ void flashMmaForwardKernel(float*, float*, const float*, int, int, int, float, bool) {}
template <int D>
__global__ void flashMmaBackwardKVKernel(float*, const float*, const float*, const float*, const float*, int,
                                         int, int, float, bool) {}
template <int D>
__global__ void flashMmaBackwardQKernel(float*, const float*, const float*, const float*, const float*, int,
                                        int, int, float, bool) {}

#endif  // MS_FLASH_MMA_DEVICE

dim3 mmaGrid(int B, int T, int H) {
  return dim3(unsigned(B * H), unsigned((T + kRows - 1) / kRows));
}

template <typename Kernel, typename... Args>
Status launch(Kernel kernel, size_t smemBytes, dim3 grid, cudaStream_t stream, const char* what,
              Args... args) {
  MS_TRY(cudaStatus(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smemBytes)),
                    what));
  kernel<<<grid, kThreads, smemBytes, stream>>>(args...);
  return checkLaunch(what);
}

template <int D>
Status forwardFor(float* out, float* lse, const float* qkv, int B, int T, int C, int H, bool causal,
                  cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(float(D));  // the scalar kernel's
  return launch(flashMmaForwardKernel<D>, MmaTile<D>::kForwardSmem, mmaGrid(B, T, H), stream,
                "flashAttentionForward (mma)", out, lse, qkv, T, C, H, scale, causal);
}

template <int D>
Status backwardFor(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* Dvec,
                   int B, int T, int C, int H, bool causal, cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(float(D));
  MS_TRY(launch(flashMmaBackwardKVKernel<D>, MmaTile<D>::kBackwardKVSmem, mmaGrid(B, T, H), stream,
                "flashAttentionBackward: dk, dv (mma)", dqkv, dout, qkv, lse, Dvec, T, C, H, scale, causal));
  return launch(flashMmaBackwardQKernel<D>, MmaTile<D>::kBackwardQSmem, mmaGrid(B, T, H), stream,
                "flashAttentionBackward: dq (mma)", dqkv, dout, qkv, lse, Dvec, T, C, H, scale, causal);
}

}  // namespace

#define MS_FLASH_MMA_HEAD_SIZES(X) X(16) X(32) X(64) X(96) X(128)

Status flashMmaForward(float* out, float* lse, const float* qkv, int B, int T, int C, int H, bool causal,
                       cudaStream_t stream) {
  switch (C / H) {
#define MS_CASE(D) \
  case D:          \
    return forwardFor<D>(out, lse, qkv, B, T, C, H, causal, stream);
    MS_FLASH_MMA_HEAD_SIZES(MS_CASE)
#undef MS_CASE
    default:
      return Status::error("flashAttentionForward: no mma kernel for head size " + std::to_string(C / H));
  }
}

Status flashMmaBackward(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* D,
                        int B, int T, int C, int H, bool causal, cudaStream_t stream) {
  switch (C / H) {
#define MS_CASE(HS) \
  case HS:          \
    return backwardFor<HS>(dqkv, dout, qkv, lse, D, B, T, C, H, causal, stream);
    MS_FLASH_MMA_HEAD_SIZES(MS_CASE)
#undef MS_CASE
    default:
      return Status::error("flashAttentionBackward: no mma kernel for head size " + std::to_string(C / H));
  }
}

#undef MS_FLASH_MMA_HEAD_SIZES

}  // namespace ms::cuda::detail
