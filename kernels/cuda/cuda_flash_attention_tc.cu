// Tensor-core FlashAttention for GemmMode::Bf16: the products of cuda_flash_attention.cu's scalar kernels as
// bf16 MMAs with fp32 accumulation (nvcuda::wmma, 16x16x16 fragments), same layout, same numbers saved, same
// numerical contract. The algorithm is FlashAttention-2's (Dao 2023, "FlashAttention-2: Faster Attention with
// Better Parallelism and Work Partitioning", algorithm 1 for the forward, algorithm 2 for the backward, after
// Dao et al. 2022, "FlashAttention", algorithm 1); the code is written for this engine. What must always
// hold: q, k, v, dout, P (before P V and P^T dO) and dS (before its products) are rounded to bf16 (nearest
// even), every sum is fp32, the saved log-sum-exp is the scalar kernel's, gradients ACCUMULATE into dqkv, and
// every output element is written by one thread (no atomics: deterministic).
//
// Head sizes: the code takes any multiple of 16 up to 128 (template parameter D); 16, 32, 64, 96 and 128 are
// instantiated (flashTcHeadSize), each costing compile time. Registers (sm_90, ptxas -v): hs 64 forward 128,
// dk/dv 127, dq 80; hs 128 forward 168, dk/dv 252 (two 16 x 128 fp32 accumulators per warp), dq 128.
//
// Tiling. A block has kWarps = 4 warps and owns kRows = 64 rows of one (batch, head): queries in the forward
// and the dq kernel, keys in the dk/dv kernel; warp w owns the 16-row strip [16w, 16w + 16) of them, so the
// softmax statistics and accumulators of a row live in one warp. The block walks the other side in tiles of
// kCols = 64 rows staged in shared memory as bf16 (converted from the fp32 activations while loading; rows
// past T zero-filled and masked), each warp processing them in 16-wide chunks.
// - Forward (grid B*H x ceil(T/64)): per key tile a warp forms S = Q_w K^T (16 x 64, fp32) and stores it to
//   its shared strip; two lanes per row read it back, mask it (key < T, causal key <= query), update the
//   running maximum m and sum l of the online softmax (Milakov and Gimelshein 2018), write P = exp(scale s -
//   m_new) rounded to bf16 and the row's rescale factor alpha = exp(m_old - m_new); the warp then scales its
//   fp32 output accumulators O_w (16 x hs, in registers) row by row by alpha and adds P V_tile with MMAs. At
//   the end O_w / l goes to out through shared memory and lse = m + log(l) to the (B, H, T) buffer.
// - dk, dv (grid B*H x ceil(T/64), a block per 64 KEYS): K, V of the block staged once; per query tile
//   (Q, dO, lse, D staged) and 16-query chunk a warp forms S^T = K_w Q_c^T and dP^T = V_w dO_c^T, lanes turn
//   them into P^T = exp(scale S^T - lse) and dS^T = P^T (dP^T - D), both rounded to bf16, and the warp adds
//   dV_w += P^T dO_c and dK_w += dS^T Q_c. At the end dk += scale dK, dv += dV.
// - dq (grid B*H x ceil(T/64), a block per 64 QUERIES): Q, dO, lse, D staged once; per key tile and 16-key
//   chunk a warp forms S and dP, lanes make dS, and the warp adds dQ_w += dS K_c; at the end dq += scale dQ.
//   D = rowsum(bf16(dout) * out) comes from the scalar file's kernel, before both.
// Causal: a block never visits tiles wholly above its diagonal; inside the diagonal tile a warp skips the
// 16-wide chunks that no row of its strip can see (warp-uniform tests, no barrier inside), and the remaining
// elements are masked one by one, with the scalar kernel's predicate key < T && (!causal || key <= query).
//
// Row-wise scaling of MMA accumulators. wmma leaves the (row, column) of each accumulator element held by a
// lane unspecified, but it is one fixed mapping per fragment type: load_matrix_sync, mma_sync and
// store_matrix_sync agree on it, or a loaded C could not be added by an MMA or an MMA result stored. So a
// warp loads, once, the 16x16 matrix whose element (r, c) is r into an accumulator fragment `rowOf` of the
// same type: rowOf.x[e] is then the row of element e of ANY accumulator fragment of that type in that lane,
// and `o.x[e] *= alpha[rowOf.x[e]]` scales rows exactly. (The alternative, keeping O in shared memory and
// rescaling it there every tile, costs four extra passes over O per tile.) Everything else that depends on
// the row or column goes through shared memory with explicit indices.
//
// Shared memory (bytes; tiles are 64 x (hs + 8) bf16, rows padded by 16 bytes against bank conflicts, every
// region 128-byte aligned; above the 48 KB default, so every launch opts in with cudaFuncSetAttribute):
//   forward: Q, K, V tiles + score strips 4 x 16 x 68 fp32 (17408) + P strips 4 x 16 x 72 bf16 (9216) +
//            alpha 4 x 16 fp32 (256) + the row table 16 x 16 fp32 (1024): hs 64: 55552, hs 128: 80128.
//   dk, dv:  K, V, Q, dO tiles + lse, D (512) + per warp S^T, dP^T chunks 16 x 20 fp32 and P^T, dS^T chunks
//            16 x 24 bf16 (4096 per warp): hs 64: 53760, hs 128: 86528.
//   dq:      Q, dO, K, V tiles + lse, D (512) + per warp S, dP, dS chunks (3328 per warp): hs 64: 50688,
//            hs 128: 83456.
// After its loop each kernel stages its fp32 results (4 x 16 x (hs + 4) per output) over the bf16 tiles,
// which a __syncthreads has freed, and writes them out with float4 accesses.
//
// Synchronisation. __syncthreads only at the top level of a kernel, where every thread arrives (the loop
// bounds depend on blockIdx only; warps without rows in range skip work with `continue`, never a barrier):
// (a) before loading a tile (every warp is done with the previous one), (b) after loading it (visible to
// all), (c) after the loop (the tiles become the staging area). Inside a warp, __syncwarp orders the phases
// that hand data between lanes through the warp's own strips: MMA results stored -> lanes read them; lanes
// write P, dS, alpha -> MMAs (and the rescale) read them; staging stored -> lanes copy it out. A warp's
// strips are written again only after the next (a)/(b) or after a later __syncwarp of the same warp.
#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>
#include <cstddef>
#include <string>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_flash_attention_tc.h"
#include "kernels/cuda/cuda_flash_tiles.cuh"

namespace ms::cuda::detail {
namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kStrip = 16;              // rows per warp; the wmma tile side
constexpr int kRows = kWarps * kStrip;  // rows a block owns
constexpr int kCols = 64;               // rows of each tile it walks over
constexpr int kFrag = kStrip * kStrip;  // elements of a 16x16 chunk
// Leading dimensions (elements) of the per-warp strips: fp32 ones a multiple of 4, bf16 ones of 8 (wmma's
// ldm rule), each padded by 16 bytes so that consecutive rows start in different banks.
constexpr int kLdS = kCols + 4;    // forward scores, fp32 (16, 64)
constexpr int kLdP = kCols + 8;    // forward probabilities, bf16 (16, 64)
constexpr int kLdC = kStrip + 4;   // backward chunk, fp32 (16, 16)
constexpr int kLdCb = kStrip + 8;  // backward chunk, bf16 (16, 16)

static_assert(kRows == kCols, "causal tile skipping assumes square blocks: tile j0 = i0 is the diagonal one");
static_assert(kThreads >= kRows, "one thread per row loads lse and D");

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;  // B = a stored tile
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;  // B = a tile, transposed
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

constexpr size_t align128(size_t bytes) {
  return (bytes + 127) / 128 * 128;
}

// A (64, hs) bf16 tile, its staging strips, and the shared-memory layouts of the three kernels (byte
// offsets).
template <int D>
struct Tile {
  static constexpr int kLd = D + 8;  // bf16 row stride: 16 bytes of padding
  static constexpr size_t kBytes = align128(size_t(kCols) * kLd * sizeof(bf16));
  static constexpr int kStageLd = D + 4;  // fp32 staging row stride
  static constexpr size_t kStageBytes = size_t(kWarps) * kStrip * kStageLd * sizeof(float);  // (64, hs) fp32
};

template <int D>
struct ForwardSmem {
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + Tile<D>::kBytes;
  static constexpr size_t kV = kK + Tile<D>::kBytes;
  static constexpr size_t kS = kV + Tile<D>::kBytes;
  static constexpr size_t kP = kS + align128(size_t(kWarps) * kStrip * kLdS * sizeof(float));
  static constexpr size_t kAlpha = kP + align128(size_t(kWarps) * kStrip * kLdP * sizeof(bf16));
  static constexpr size_t kRowTable = kAlpha + align128(size_t(kWarps) * kStrip * sizeof(float));
  static constexpr size_t kBytes = kRowTable + align128(size_t(kFrag) * sizeof(float));
  static_assert(2 * Tile<D>::kBytes >= Tile<D>::kStageBytes, "out is staged over the K and V tiles");
};

template <int D>
struct BackwardKVSmem {
  static constexpr size_t kK = 0;  // the four tiles are contiguous: the staging area of dK and dV
  static constexpr size_t kV = kK + Tile<D>::kBytes;
  static constexpr size_t kQ = kV + Tile<D>::kBytes;
  static constexpr size_t kG = kQ + Tile<D>::kBytes;
  static constexpr size_t kLse = kG + Tile<D>::kBytes;
  static constexpr size_t kDot = kLse + align128(size_t(kCols) * sizeof(float));
  static constexpr size_t kS = kDot + align128(size_t(kCols) * sizeof(float));
  static constexpr size_t kDp = kS + align128(size_t(kWarps) * kStrip * kLdC * sizeof(float));
  static constexpr size_t kP = kDp + align128(size_t(kWarps) * kStrip * kLdC * sizeof(float));
  static constexpr size_t kDs = kP + align128(size_t(kWarps) * kStrip * kLdCb * sizeof(bf16));
  static constexpr size_t kBytes = kDs + align128(size_t(kWarps) * kStrip * kLdCb * sizeof(bf16));
  static_assert(4 * Tile<D>::kBytes >= 2 * Tile<D>::kStageBytes, "dK, dV are staged over the four tiles");
};

template <int D>
struct BackwardQSmem {
  static constexpr size_t kQ = 0;
  static constexpr size_t kG = kQ + Tile<D>::kBytes;
  static constexpr size_t kK = kG + Tile<D>::kBytes;  // K, V contiguous: the staging area of dQ
  static constexpr size_t kV = kK + Tile<D>::kBytes;
  static constexpr size_t kLse = kV + Tile<D>::kBytes;
  static constexpr size_t kDot = kLse + align128(size_t(kRows) * sizeof(float));
  static constexpr size_t kS = kDot + align128(size_t(kRows) * sizeof(float));
  static constexpr size_t kDp = kS + align128(size_t(kWarps) * kStrip * kLdC * sizeof(float));
  static constexpr size_t kDs = kDp + align128(size_t(kWarps) * kStrip * kLdC * sizeof(float));
  static constexpr size_t kBytes = kDs + align128(size_t(kWarps) * kStrip * kLdCb * sizeof(bf16));
  static_assert(2 * Tile<D>::kBytes >= Tile<D>::kStageBytes, "dQ is staged over the K and V tiles");
};

// Device code that needs bf16 MMAs is compiled for compute capability 8.0 and newer only (the host never
// launches it on older devices, see flashTcDevice); older targets get empty kernels so that any architecture
// list builds.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define MS_FLASH_TC_DEVICE 1
#endif

#ifdef MS_FLASH_TC_DEVICE

constexpr int kChunks = kCols / kStrip;  // 16-wide chunks per tile
constexpr unsigned kFull = 0xffffffffu;

// The fp32 -> bf16 staging of every kernel (cuda_flash_tiles.cuh) on this file's tiles, and its mask.
template <int D>
__device__ inline void loadTile(bf16* tile, const float* src, size_t stride, int r0, int T) {
  loadTileBf16<D, kCols, kThreads>(tile, Tile<D>::kLd, src, stride, r0, T);
}

__device__ inline bool visible(int i, int j, int T, bool causal) {
  return flashVisible(i, j, T, causal);
}

// Stores a warp's (16, D) accumulators acc[D / 16] into its fp32 staging strip (ld D + 4). The warp calls it.
template <int D>
__device__ inline void stageStrip(float* strip, const Acc (&acc)[D / 16]) {
#pragma unroll
  for (int n = 0; n < D / 16; ++n)
    wmma::store_matrix_sync(strip + n * 16, acc[n], Tile<D>::kStageLd, wmma::mem_row_major);
}

// grid (B * H, ceil(T / kRows)), kThreads threads: out (B, T, C), lse (B, H, T).
template <int D>
__global__ void __launch_bounds__(kThreads)
    flashTcForwardKernel(float* out, float* lse, const float* qkv, int T, int C, int H, float scale,
                         bool causal) {
  using L = ForwardSmem<D>;
  constexpr int kLd = Tile<D>::kLd;
  constexpr int kN = D / 16;  // 16-column blocks of the head
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qS = reinterpret_cast<bf16*>(smem + L::kQ);  // (64, D + 8) the block's queries
  bf16* kS = reinterpret_cast<bf16*>(smem + L::kK);  // (64, D + 8) the key tile
  bf16* vS = reinterpret_cast<bf16*>(smem + L::kV);  // (64, D + 8) its values
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  float* sW = reinterpret_cast<float*>(smem + L::kS) + warp * kStrip * kLdS;   // (16, 64) this warp's scores
  bf16* pW = reinterpret_cast<bf16*>(smem + L::kP) + warp * kStrip * kLdP;     // (16, 64) its probabilities
  float* alphaW = reinterpret_cast<float*>(smem + L::kAlpha) + warp * kStrip;  // (16) its row factors
  float* rowTable = reinterpret_cast<float*>(smem + L::kRowTable);             // (16, 16): element (r, c) = r

  const int bh = blockIdx.x;
  const int b = bh / H;
  const int h = bh - b * H;
  const size_t C3 = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * C3 + size_t(h) * D;  // q of (b, position 0, h)
  const int i0 = blockIdx.y * kRows;                             // the block's first query
  const int w0 = i0 + warp * kStrip;                             // the warp's first query
  const bool warpActive = w0 < T;                                // warp-uniform
  const int r = lane / 2;                                        // the row this lane's pair handles
  const int half = lane % 2;                                     // its columns: half, half + 2, ...
  const int i = w0 + r;

  for (int e = threadIdx.x; e < kFrag; e += kThreads) rowTable[e] = float(e / kStrip);
  loadTile<D>(qS, base, C3, i0, T);
  __syncthreads();  // (a) the row table and Q are visible

  Acc rowOf;
  wmma::load_matrix_sync(rowOf, rowTable, kStrip, wmma::mem_row_major);
  FragA qa[kN];  // the warp's 16 queries, all D columns: constant over the loop
#pragma unroll
  for (int kk = 0; kk < kN; ++kk) wmma::load_matrix_sync(qa[kk], qS + warp * kStrip * kLd + kk * 16, kLd);
  Acc o[kN];
#pragma unroll
  for (int n = 0; n < kN; ++n) wmma::fill_fragment(o[n], 0.0f);
  float m = -INFINITY;  // running maximum of row i's visible scaled scores (both lanes of the pair agree)
  float l = 0.0f;       // running sum of exp(score - m), unrounded

  const int keys = causal ? min(T, i0 + kRows) : T;       // block-uniform: every thread runs every barrier
  const int warpKeys = causal ? min(T, w0 + kStrip) : T;  // keys any row of the warp sees: [0, warpKeys)
  for (int j0 = 0; j0 < keys; j0 += kCols) {
    __syncthreads();  // (a) every warp is done with the previous K, V tile
    loadTile<D>(kS, base + C, C3, j0, T);
    loadTile<D>(vS, base + 2 * C, C3, j0, T);
    __syncthreads();  // (b) K, V visible
    if (!warpActive) continue;
    // 16-key chunks holding a key some row of the warp sees; later chunks are masked for all its rows.
    // j0 <= i0 <= w0 < warpKeys (causal) and j0 < T (either), so at least one.
    const int chunks = min(kChunks, (warpKeys - j0 + kStrip - 1) / kStrip);

    // S = Q_w K^T: (16, 16c) blocks, fp32, to the warp's strip.
    for (int c = 0; c < chunks; ++c) {
      Acc s;
      wmma::fill_fragment(s, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kN; ++kk) {
        FragBCol kb;  // K^T block (dims kk, keys c): column-major view of K's rows
        wmma::load_matrix_sync(kb, kS + c * 16 * kLd + kk * 16, kLd);
        wmma::mma_sync(s, qa[kk], kb, s);
      }
      wmma::store_matrix_sync(sW + c * 16, s, kLdS, wmma::mem_row_major);
    }
    __syncwarp();  // scores visible to the lanes

    // Online softmax of row i over this tile, columns half, half + 2, ..., 62 + half. Columns at or past
    // 16 * chunks are never visible (see above), so unwritten scores are never read.
    const float* sRow = sW + r * kLdS;
    bf16* pRow = pW + r * kLdP;
    float tileMax = -INFINITY;
    for (int col = half; col < kCols; col += 2)
      if (visible(i, j0 + col, T, causal)) tileMax = fmaxf(tileMax, sRow[col] * scale);
    tileMax = fmaxf(tileMax, __shfl_xor_sync(kFull, tileMax, 1));
    const float mNew = fmaxf(m, tileMax);
    float alpha = 1.0f;  // nothing visible yet (impossible for T >= 1, guarded): o and l stay 0, P row 0
    float sum = 0.0f;
    if (mNew == -INFINITY) {
      for (int col = half; col < kCols; col += 2) pRow[col] = __float2bfloat16_rn(0.0f);
    } else {
      alpha = expf(m - mNew);  // 0 on the first visible tile (m = -inf, mNew finite)
      for (int col = half; col < kCols; col += 2) {
        const float p = visible(i, j0 + col, T, causal) ? expf(sRow[col] * scale - mNew) : 0.0f;
        pRow[col] = __float2bfloat16_rn(p);
        sum += p;
      }
    }
    sum += __shfl_xor_sync(kFull, sum, 1);  // a + b in one lane, b + a in the other: the same float
    l = l * alpha + sum;
    m = mNew;
    if (half == 0) alphaW[r] = alpha;
    __syncwarp();  // P and alpha visible to the MMAs and the rescale

    // O_w = diag(alpha) O_w + P V over the visible chunks (P is 0 on the others).
#pragma unroll
    for (int n = 0; n < kN; ++n)
#pragma unroll
      for (int e = 0; e < Acc::num_elements; ++e) o[n].x[e] *= alphaW[int(rowOf.x[e])];
    for (int c = 0; c < chunks; ++c) {
      FragA pa;
      wmma::load_matrix_sync(pa, pW + c * 16, kLdP);
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        FragBRow vb;
        wmma::load_matrix_sync(vb, vS + c * 16 * kLd + n * 16, kLd);
        wmma::mma_sync(o[n], pa, vb, o[n]);
      }
    }
  }
  __syncthreads();  // (c) every warp is done with K and V: their space stages the output
  if (!warpActive) return;
  // alphaW was last read by this warp's rescale, before (c).
  const bool any = l > 0.0f;
  if (half == 0) {
    alphaW[r] = any ? 1.0f / l : 0.0f;
    if (i < T) lse[size_t(bh) * T + i] = any ? m + logf(l) : INFINITY;
  }
  __syncwarp();  // 1 / l visible
#pragma unroll
  for (int n = 0; n < kN; ++n)
#pragma unroll
    for (int e = 0; e < Acc::num_elements; ++e) o[n].x[e] *= alphaW[int(rowOf.x[e])];
  float* stage = reinterpret_cast<float*>(smem + L::kK) + warp * kStrip * Tile<D>::kStageLd;  // (16, D + 4)
  stageStrip<D>(stage, o);
  __syncwarp();  // staged output visible
  for (int idx = lane; idx < kStrip * (D / 4); idx += kWarpSize) {
    const int rr = idx / (D / 4);
    const int c = (idx - rr * (D / 4)) * 4;
    const int row = w0 + rr;
    if (row < T)
      *reinterpret_cast<float4*>(out + (size_t(b) * T + row) * C + size_t(h) * D + c) =
          *reinterpret_cast<const float4*>(stage + rr * Tile<D>::kStageLd + c);
  }
}

// grid (B * H, ceil(T / kRows)), a block per 64 KEYS: dk += scale sum_i dS_ij q_i, dv += sum_i P_ij dout_i.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flashTcBackwardKVKernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                            const float* Dvec, int T, int C, int H, float scale, bool causal) {
  using L = BackwardKVSmem<D>;
  constexpr int kLd = Tile<D>::kLd;
  constexpr int kN = D / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* kS = reinterpret_cast<bf16*>(smem + L::kK);        // (64, D + 8) the block's keys
  bf16* vS = reinterpret_cast<bf16*>(smem + L::kV);        // (64, D + 8) their values
  bf16* qS = reinterpret_cast<bf16*>(smem + L::kQ);        // (64, D + 8) the query tile
  bf16* gS = reinterpret_cast<bf16*>(smem + L::kG);        // (64, D + 8) its output gradients
  float* lseS = reinterpret_cast<float*>(smem + L::kLse);  // (64) the tile's log-sum-exp
  float* dotS = reinterpret_cast<float*>(smem + L::kDot);  // (64) and D
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  float* sW = reinterpret_cast<float*>(smem + L::kS) + warp * kStrip * kLdC;    // (16, 16) S^T chunk
  float* dpW = reinterpret_cast<float*>(smem + L::kDp) + warp * kStrip * kLdC;  // (16, 16) dP^T chunk
  bf16* pW = reinterpret_cast<bf16*>(smem + L::kP) + warp * kStrip * kLdCb;     // (16, 16) P^T, bf16
  bf16* dsW = reinterpret_cast<bf16*>(smem + L::kDs) + warp * kStrip * kLdCb;   // (16, 16) dS^T, bf16

  const int bh = blockIdx.x;
  const int b = bh / H;
  const int h = bh - b * H;
  const size_t C3 = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * C3 + size_t(h) * D;
  const float* gBase = dout + size_t(b) * T * C + size_t(h) * D;
  const int j0 = blockIdx.y * kRows;  // the block's first key
  const int w0 = j0 + warp * kStrip;  // the warp's first key
  const bool warpActive = w0 < T;

  loadTile<D>(kS, base + C, C3, j0, T);
  loadTile<D>(vS, base + 2 * C, C3, j0, T);
  // visible after the first (b) below; the loop runs at least once (first <= j0 < T)

  Acc dk[kN], dv[kN];
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  // Causal: only queries i >= j see key j; the query tile starting at j0 is the first with any.
  const int first = causal ? j0 : 0;
  for (int iq0 = first; iq0 < T; iq0 += kCols) {
    __syncthreads();  // (a) every warp is done with the previous Q, dO, lse, D
    loadTile<D>(qS, base, C3, iq0, T);
    loadTile<D>(gS, gBase, C, iq0, T);
    if (threadIdx.x < kCols) {
      const int i = iq0 + threadIdx.x;
      lseS[threadIdx.x] = i < T ? lse[size_t(bh) * T + i] : INFINITY;
      dotS[threadIdx.x] = i < T ? Dvec[size_t(bh) * T + i] : 0.0f;
    }
    __syncthreads();  // (b) the tile (and, the first time, K and V) visible
    if (!warpActive) continue;
    for (int c = 0; c < kChunks; ++c) {
      const int q0 = iq0 + c * 16;  // the chunk's first query
      if (q0 >= T) break;           // warp-uniform
      if (causal && q0 + kStrip - 1 < w0)
        continue;  // every query of the chunk precedes every key of the warp
      Acc st, dpt;
      wmma::fill_fragment(st, 0.0f);
      wmma::fill_fragment(dpt, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kN; ++kk) {
        FragA ka, va;
        FragBCol qb, gb;  // Q_c^T and dO_c^T blocks: column-major views of the tiles' rows
        wmma::load_matrix_sync(ka, kS + warp * kStrip * kLd + kk * 16, kLd);
        wmma::load_matrix_sync(qb, qS + c * 16 * kLd + kk * 16, kLd);
        wmma::mma_sync(st, ka, qb, st);
        wmma::load_matrix_sync(va, vS + warp * kStrip * kLd + kk * 16, kLd);
        wmma::load_matrix_sync(gb, gS + c * 16 * kLd + kk * 16, kLd);
        wmma::mma_sync(dpt, va, gb, dpt);
      }
      wmma::store_matrix_sync(sW, st, kLdC, wmma::mem_row_major);
      wmma::store_matrix_sync(dpW, dpt, kLdC, wmma::mem_row_major);
      __syncwarp();  // S^T, dP^T visible to the lanes
      for (int e = lane; e < kFrag; e += kWarpSize) {
        const int rr = e / kStrip;  // key w0 + rr
        const int cc = e % kStrip;  // query q0 + cc
        float p = 0.0f, ds = 0.0f;
        if (q0 + cc < T && visible(q0 + cc, w0 + rr, T, causal)) {
          p = expf(sW[rr * kLdC + cc] * scale - lseS[c * 16 + cc]);
          ds = p * (dpW[rr * kLdC + cc] - dotS[c * 16 + cc]);
        }
        pW[rr * kLdCb + cc] = __float2bfloat16_rn(p);
        dsW[rr * kLdCb + cc] = __float2bfloat16_rn(ds);
      }
      __syncwarp();  // P^T, dS^T visible to the MMAs (and S^T, dP^T read before the next chunk's stores)
      FragA pa, dsa;
      wmma::load_matrix_sync(pa, pW, kLdCb);
      wmma::load_matrix_sync(dsa, dsW, kLdCb);
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        FragBRow gb, qb;  // dO_c and Q_c blocks (queries, dims n)
        wmma::load_matrix_sync(gb, gS + c * 16 * kLd + n * 16, kLd);
        wmma::mma_sync(dv[n], pa, gb, dv[n]);
        wmma::load_matrix_sync(qb, qS + c * 16 * kLd + n * 16, kLd);
        wmma::mma_sync(dk[n], dsa, qb, dk[n]);
      }
      // The next chunk writes pW, dsW only after its own first __syncwarp, which follows these loads.
    }
  }
  __syncthreads();  // (c) every warp is done with the four tiles: they stage dK and dV
  if (!warpActive) return;
  float* stageK = reinterpret_cast<float*>(smem + L::kK) + warp * kStrip * Tile<D>::kStageLd;  // (16, D + 4)
  float* stageV = stageK + kWarps * kStrip * Tile<D>::kStageLd;                                // (16, D + 4)
  stageStrip<D>(stageK, dk);
  stageStrip<D>(stageV, dv);
  __syncwarp();  // staged gradients visible
  for (int idx = lane; idx < kStrip * (D / 4); idx += kWarpSize) {
    const int rr = idx / (D / 4);
    const int c = (idx - rr * (D / 4)) * 4;
    const int j = w0 + rr;
    if (j >= T) continue;
    float* dkRow = dqkv + (size_t(b) * T + j) * C3 + C + size_t(h) * D + c;
    float* dvRow = dkRow + C;
    const float4 gk = *reinterpret_cast<const float4*>(stageK + rr * Tile<D>::kStageLd + c);
    const float4 gv = *reinterpret_cast<const float4*>(stageV + rr * Tile<D>::kStageLd + c);
    float4 a = *reinterpret_cast<float4*>(dkRow);
    a.x += scale * gk.x;
    a.y += scale * gk.y;
    a.z += scale * gk.z;
    a.w += scale * gk.w;
    *reinterpret_cast<float4*>(dkRow) = a;
    float4 v = *reinterpret_cast<float4*>(dvRow);
    v.x += gv.x;
    v.y += gv.y;
    v.z += gv.z;
    v.w += gv.w;
    *reinterpret_cast<float4*>(dvRow) = v;
  }
}

// grid (B * H, ceil(T / kRows)), a block per 64 QUERIES: dq_i += scale sum_j dS_ij k_j.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flashTcBackwardQKernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                           const float* Dvec, int T, int C, int H, float scale, bool causal) {
  using L = BackwardQSmem<D>;
  constexpr int kLd = Tile<D>::kLd;
  constexpr int kN = D / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qS = reinterpret_cast<bf16*>(smem + L::kQ);        // (64, D + 8) the block's queries
  bf16* gS = reinterpret_cast<bf16*>(smem + L::kG);        // (64, D + 8) their output gradients
  bf16* kS = reinterpret_cast<bf16*>(smem + L::kK);        // (64, D + 8) the key tile
  bf16* vS = reinterpret_cast<bf16*>(smem + L::kV);        // (64, D + 8) its values
  float* lseS = reinterpret_cast<float*>(smem + L::kLse);  // (64) the block's log-sum-exp
  float* dotS = reinterpret_cast<float*>(smem + L::kDot);  // (64) and D
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  float* sW = reinterpret_cast<float*>(smem + L::kS) + warp * kStrip * kLdC;    // (16, 16) S chunk
  float* dpW = reinterpret_cast<float*>(smem + L::kDp) + warp * kStrip * kLdC;  // (16, 16) dP chunk
  bf16* dsW = reinterpret_cast<bf16*>(smem + L::kDs) + warp * kStrip * kLdCb;   // (16, 16) dS, bf16

  const int bh = blockIdx.x;
  const int b = bh / H;
  const int h = bh - b * H;
  const size_t C3 = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * C3 + size_t(h) * D;
  const float* gBase = dout + size_t(b) * T * C + size_t(h) * D;
  const int i0 = blockIdx.y * kRows;  // the block's first query
  const int w0 = i0 + warp * kStrip;  // the warp's first query
  const bool warpActive = w0 < T;

  loadTile<D>(qS, base, C3, i0, T);
  loadTile<D>(gS, gBase, C, i0, T);
  if (threadIdx.x < kRows) {
    const int i = i0 + threadIdx.x;
    lseS[threadIdx.x] = i < T ? lse[size_t(bh) * T + i] : INFINITY;
    dotS[threadIdx.x] = i < T ? Dvec[size_t(bh) * T + i] : 0.0f;
  }
  // visible after the first (b) below; the loop runs at least once (keys >= 1)

  Acc dq[kN];
#pragma unroll
  for (int n = 0; n < kN; ++n) wmma::fill_fragment(dq[n], 0.0f);
  const int keys = causal ? min(T, i0 + kRows) : T;
  const int warpKeys = causal ? min(T, w0 + kStrip) : T;
  for (int j0 = 0; j0 < keys; j0 += kCols) {
    __syncthreads();  // (a) every warp is done with the previous K, V tile
    loadTile<D>(kS, base + C, C3, j0, T);
    loadTile<D>(vS, base + 2 * C, C3, j0, T);
    __syncthreads();  // (b) K, V (and, the first time, Q, dO, lse, D) visible
    if (!warpActive) continue;
    const int chunks = min(kChunks, (warpKeys - j0 + kStrip - 1) / kStrip);  // >= 1, as in the forward
    for (int c = 0; c < chunks; ++c) {
      const int k0 = j0 + c * 16;  // the chunk's first key
      Acc s, dp;
      wmma::fill_fragment(s, 0.0f);
      wmma::fill_fragment(dp, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kN; ++kk) {
        FragA qa, ga;
        FragBCol kb, vb;  // K_c^T and V_c^T blocks
        wmma::load_matrix_sync(qa, qS + warp * kStrip * kLd + kk * 16, kLd);
        wmma::load_matrix_sync(kb, kS + c * 16 * kLd + kk * 16, kLd);
        wmma::mma_sync(s, qa, kb, s);
        wmma::load_matrix_sync(ga, gS + warp * kStrip * kLd + kk * 16, kLd);
        wmma::load_matrix_sync(vb, vS + c * 16 * kLd + kk * 16, kLd);
        wmma::mma_sync(dp, ga, vb, dp);
      }
      wmma::store_matrix_sync(sW, s, kLdC, wmma::mem_row_major);
      wmma::store_matrix_sync(dpW, dp, kLdC, wmma::mem_row_major);
      __syncwarp();  // S, dP visible to the lanes
      for (int e = lane; e < kFrag; e += kWarpSize) {
        const int rr = e / kStrip;  // query w0 + rr
        const int cc = e % kStrip;  // key k0 + cc
        float ds = 0.0f;
        if (w0 + rr < T && visible(w0 + rr, k0 + cc, T, causal)) {
          const float p = expf(sW[rr * kLdC + cc] * scale - lseS[warp * kStrip + rr]);
          ds = p * (dpW[rr * kLdC + cc] - dotS[warp * kStrip + rr]);
        }
        dsW[rr * kLdCb + cc] = __float2bfloat16_rn(ds);
      }
      __syncwarp();  // dS visible to the MMAs (and S, dP read before the next chunk's stores)
      FragA dsa;
      wmma::load_matrix_sync(dsa, dsW, kLdCb);
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        FragBRow kb;  // K_c block (keys, dims n)
        wmma::load_matrix_sync(kb, kS + c * 16 * kLd + n * 16, kLd);
        wmma::mma_sync(dq[n], dsa, kb, dq[n]);
      }
    }
  }
  __syncthreads();  // (c) every warp is done with K and V: their space stages dQ
  if (!warpActive) return;
  float* stage = reinterpret_cast<float*>(smem + L::kK) + warp * kStrip * Tile<D>::kStageLd;  // (16, D + 4)
  stageStrip<D>(stage, dq);
  __syncwarp();  // staged gradient visible
  for (int idx = lane; idx < kStrip * (D / 4); idx += kWarpSize) {
    const int rr = idx / (D / 4);
    const int c = (idx - rr * (D / 4)) * 4;
    const int i = w0 + rr;
    if (i >= T) continue;
    float* dqRow = dqkv + (size_t(b) * T + i) * C3 + size_t(h) * D + c;
    const float4 g = *reinterpret_cast<const float4*>(stage + rr * Tile<D>::kStageLd + c);
    float4 a = *reinterpret_cast<float4*>(dqRow);
    a.x += scale * g.x;
    a.y += scale * g.y;
    a.z += scale * g.z;
    a.w += scale * g.w;
    *reinterpret_cast<float4*>(dqRow) = a;
  }
}

#else  // compute capability below 8.0: never launched (flashTcDevice), present so that the host code links

template <int D>
__global__ void flashTcForwardKernel(float*, float*, const float*, int, int, int, float, bool) {}
template <int D>
__global__ void flashTcBackwardKVKernel(float*, const float*, const float*, const float*, const float*, int,
                                        int, int, float, bool) {}
template <int D>
__global__ void flashTcBackwardQKernel(float*, const float*, const float*, const float*, const float*, int,
                                       int, int, float, bool) {}

#endif  // MS_FLASH_TC_DEVICE

dim3 tcGrid(int B, int T, int H) {
  return dim3(unsigned(B * H), unsigned((T + kRows - 1) / kRows));
}

// Opts the kernel in to its dynamic shared memory (all of them need more than the 48 KB default) and
// launches it. Setting the attribute every call is a cheap host-side operation and keeps no state here.
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
  return launch(flashTcForwardKernel<D>, ForwardSmem<D>::kBytes, tcGrid(B, T, H), stream,
                "flashAttentionForward (tensor cores)", out, lse, qkv, T, C, H, scale, causal);
}

template <int D>
Status backwardFor(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* Dvec,
                   int B, int T, int C, int H, bool causal, cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(float(D));
  MS_TRY(launch(flashTcBackwardKVKernel<D>, BackwardKVSmem<D>::kBytes, tcGrid(B, T, H), stream,
                "flashAttentionBackward: dk, dv (tensor cores)", dqkv, dout, qkv, lse, Dvec, T, C, H, scale,
                causal));
  return launch(flashTcBackwardQKernel<D>, BackwardQSmem<D>::kBytes, tcGrid(B, T, H), stream,
                "flashAttentionBackward: dq (tensor cores)", dqkv, dout, qkv, lse, Dvec, T, C, H, scale,
                causal);
}

}  // namespace

bool flashTcHeadSize(int hs) {
  return hs == 16 || hs == 32 || hs == 64 || hs == 96 || hs == 128;
}

bool flashTcDevice() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  return major >= 8;
}

// The head size picks the instantiation; flashTcHeadSize lists the same cases.
#define MS_FLASH_TC_HEAD_SIZES(X) X(16) X(32) X(64) X(96) X(128)

Status flashTcForward(float* out, float* lse, const float* qkv, int B, int T, int C, int H, bool causal,
                      cudaStream_t stream) {
  switch (C / H) {
#define MS_CASE(D) \
  case D:          \
    return forwardFor<D>(out, lse, qkv, B, T, C, H, causal, stream);
    MS_FLASH_TC_HEAD_SIZES(MS_CASE)
#undef MS_CASE
    default:
      return Status::error("flashAttentionForward: no tensor-core kernel for head size " +
                           std::to_string(C / H));
  }
}

Status flashTcBackward(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* D,
                       int B, int T, int C, int H, bool causal, cudaStream_t stream) {
  switch (C / H) {
#define MS_CASE(HS) \
  case HS:          \
    return backwardFor<HS>(dqkv, dout, qkv, lse, D, B, T, C, H, causal, stream);
    MS_FLASH_TC_HEAD_SIZES(MS_CASE)
#undef MS_CASE
    default:
      return Status::error("flashAttentionBackward: no tensor-core kernel for head size " +
                           std::to_string(C / H));
  }
}

#undef MS_FLASH_TC_HEAD_SIZES

}  // namespace ms::cuda::detail
