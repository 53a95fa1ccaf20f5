// A llama block's mixture-of-experts MLP (runtime/transformer.cpp calls it where model.moeBlock(i)): a
// softmax router over the experts, each token sent to its top-k (ties to the lower index), the chosen
// probabilities renormalised to sum to 1 as Mixtral's (Jiang et al. 2024), an expert's capacity capped by
// capacity_factor (GShard, Lepikhin et al. 2020: a microbatch's later tokens dropped) or dropless, and the
// load-balancing loss aux_loss_coef * E * sum_e f_e P_e (Switch Transformer, Fedus et al. 2022, eq. 4; f_e
// the share of tokens routed to e, P_e its mean router probability) added to the objective.
//
// The routing is decided on the host from the downloaded router logits (a device-to-host copy of N x E
// floats a layer and microbatch): deterministic (token order, fixed tie-break), the same on every rank that
// holds the same tokens (TP ranks do), and what sizes each expert's GEMMs. Each expert's tokens are gathered
// into a batch of rows, run through its SwiGLU, and added back scaled by their gates (Backend gatherRows,
// scatterAddRows, rowDots). Under tensor parallelism every expert is split as the dense MLP is (its gate and
// up by rows, down by columns), the router is replicated, the outputs are partial sums the block all-reduces,
// and the gates' gradients (row dot products with the partial outputs) are all-reduced before the router's
// backward. The experts' and the router's weight gradients are computed in the input part of a split
// backward (not deferred to W).
//
// Expert parallelism (ep > 1; Lepikhin et al. 2020, GShard, section 2.2; Megatron-Core's all-to-all token
// dispatcher): rank j of an expert-parallel group holds experts [j E/ep, (j+1) E/ep). Each rank routes its
// own tokens, sends each routed row (the token's input; bf16 in bf16 runs) to its expert's rank with one
// all-to-all, runs its experts over the rows it received from every rank (put in expert order by a gather),
// and returns the outputs with a second all-to-all; the gates are applied at the source, as without ep.
// Backward sends the gated output gradients the same way and returns the input gradients. The received rows
// are kept for the experts' weight gradients (the routed activations the memory model counts).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/layer_impl.h"

namespace ms {

class MoeMlp {
 public:
  // prefix: the block's parameter prefix ("model.layers.3.").
  MoeMlp(const LayerContext& ctx, const std::string& prefix);
  ~MoeMlp();
  // out (N, C) += each token's gated expert outputs of x (N, C, fp32: the second norm's output as the GEMMs
  // read it). auxScale: d(objective) / d(this microbatch's load-balancing loss).
  void forward(int slot, const float* x, float* out, int N, float auxScale);
  // dx (N, C) += the MLP input's gradient from dout (N, C): the experts' part, and the router's where
  // routerInput (one rank of a TP group: the block sums dx over the group); weight gradients +=.
  void backward(int slot, const float* x, const float* dout, float* dx, int N, bool routerInput);
  void release(int slot);
  // The load-balancing loss of the slot's last forward (its unweighted value times aux_loss_coef).
  double auxLoss(int slot) const;

 private:
  struct Routing;
  struct Cache;
  // Expert parallelism: the routed rows' trip to and from the experts' ranks (see moe.cpp).
  // Expert parallelism: agrees the row counts with the group, builds the expert-order permutation.
  void planExchange(Cache& c);
  // Sends rows (row order: by destination rank, its experts in order) to the experts' ranks and receives
  // theirs (source order), or back (back: received rows return to their sources).
  void exchange(const Routing& r, const float* send, float* recv, bool back);
  // The routed rows of src (scaled by scale, nullable) gathered into the send staging and exchanged: the
  // staging buffers, the received rows in recv (source order).
  struct Staging {
    float* send;
    float* recv;
  };
  Staging dispatch(const Cache& c, const float* src, const float* scale);
  void forwardParallel(Cache& c, const float* x, float* out);
  void backwardParallel(Cache& c, const float* dout, float* dx);
  Backend& m_be;
  TensorParallel m_tp;
  ExpertParallel m_ep;
  Workspace* m_ws;
  int m_C, m_E, m_k, m_Fl;
  int m_El = 0, m_first = 0;  // this rank's experts: [m_first, m_first + m_El) (all of them without ep)
  double m_capacityFactor, m_auxCoef;
  BoundParam m_router;
  std::vector<BoundParam> m_gate, m_up, m_down;
  std::unique_ptr<SlotCaches<Cache>> m_caches;  // Cache is moe.cpp's: the destructor lives there
  MemoryTracker* m_tracker;
};

}  // namespace ms
