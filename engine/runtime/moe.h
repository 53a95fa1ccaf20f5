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
// backward (not deferred to W). Expert parallelism is to come (issue 20).
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
  Backend& m_be;
  TensorParallel m_tp;
  Workspace* m_ws;
  int m_C, m_E, m_k, m_Fl;
  double m_capacityFactor, m_auxCoef;
  BoundParam m_router;
  std::vector<BoundParam> m_gate, m_up, m_down;
  SlotCaches<Cache>* m_caches;
  MemoryTracker* m_tracker;
};

}  // namespace ms
