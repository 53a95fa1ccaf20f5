// How "tp_comm_overlap" splits a block's sequence-parallel collectives, one rule for the engine
// (runtime/transformer.cpp, which runs the chunks) and the cost model (plan/cost_model.cpp, which prices
// them).
//
// Under sequence parallelism a transformer block all-gathers its LayerNorm outputs before the column-parallel
// GEMMs (q|k|v, the MLP's first) and reduce-scatters the row-parallel GEMMs' partial sums (the attention's
// and the MLP's output projections). With the overlap each of those collectives goes in chunks: chunk c of a
// microbatch of B samples is rows c Tk .. (c + 1) Tk of every rank's (B Ts) rows (Ts = T / tp positions a
// rank, Tk = Ts / splits), so one chunk never spans two samples. The GEMM rows of a chunk that has arrived
// run while the next chunk's all-gather travels, and a chunk's reduce-scatter travels while the next chunk's
// rows are computed (Wang et al. 2022, "Overlap Communication with Dependent Computation via Decomposition in
// Large Deep Learning Models", ASPLOS 2023, section 3; Megatron-LM's --tp-comm-overlap does the same with
// Transformer Engine's userbuffers).
//
// What always holds: splits divides Ts, 1 <= splits <= Ts, and B * splits >= min(kTpOverlapChunks, B * Ts)
// when Ts has a divisor that large (else the largest divisor of Ts under the target).
#pragma once

namespace ms {

// Chunks a microbatch aims for: enough that all but one chunk's transfer can hide behind GEMM rows, few
// enough that each GEMM keeps a reasonable height (Megatron-LM's userbuffers default to 4 splits).
inline constexpr int kTpOverlapChunks = 4;

// Sub-chunks per sample: the largest divisor of positionsPerRank (Ts) that is at most
// ceil(kTpOverlapChunks / samples); 1 when samples alone give the chunks.
inline int tpOverlapSplits(int samples, int positionsPerRank) {
  if (samples < 1 || positionsPerRank < 1) return 1;
  const int want = (kTpOverlapChunks + samples - 1) / samples;
  int best = 1;
  for (int d = 1; d <= want && d <= positionsPerRank; ++d)
    if (positionsPerRank % d == 0) best = d;
  return best;
}

}  // namespace ms
