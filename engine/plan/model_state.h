// Model states: where a rank keeps each parameter's values, gradient and optimizer state, and how many bytes
// per parameter element that costs after ZeRO sharding. The one place this arithmetic lives: the memory model
// (plan/memory_model.h), the auto-planner's screen (plan/autoplanner.cpp) and the engine's parameter store
// (runtime/parameters.h, which allocates by modelStateLayout) all read it, so the figures the studio shows
// are the bytes the engine allocates.
//
// Two precisions, as the field defines them:
// - fp32: the parameters are the values the optimizer updates; 4 (values) + 4 (gradients) + 8 (AdamW moments)
//   or 4 (SGD momentum) bytes per element.
// - bf16 mixed precision (Micikevicius et al. 2018, "Mixed Precision Training"; ZeRO, Rajbhandari et al.
//   2020, section 3.1; Megatron Core's distributed optimizer): the WORKING parameters every layer reads are
//   bf16 (2 bytes); the fp32 MASTER weights (4) belong to the optimizer state with the moments (K = 12 bytes
//   for AdamW); gradients are fp32 (4, Megatron's default main gradients) or bf16 (2, ZeRO's fp16 gradients),
//   "grad_precision".
//
// ZeRO over a data-parallel group of d ranks (Rajbhandari et al. 2020, sections 5.1-5.3): stage 1 shards the
// optimizer state (the master weights included), stage 2 also the gradients, stage 3 also the working
// parameters. In bf16 with AdamW that gives, per parameter element:
//   grads bf16 (ZeRO paper, Figure 1, K = 12): 16 | 4 + 12/d | 2 + 14/d | 16/d   (ZeRO 0 | 1 | 2 | 3)
//   grads fp32 (Megatron Core distributed-optimizer table): 18 | 6 + 12/d | 2 + 16/d | 18/d
// fp32 keeps its own figures: 16 | 8 + 8/d | 4 + 12/d | 16/d.
//
// Offload (bf16 only, "offload"): "optimizer" (ZeRO-Offload, Ren et al. 2021, "ZeRO-Offload: Democratizing
// Billion-Scale Model Training", section 3) keeps the optimizer state (fp32 master + moments, 12 B / d from
// ZeRO-1 on) in HOST memory with an fp32 copy of the rank's owned gradients (4 B, / d from ZeRO-1 on) that
// the host's optimizer step reads; the device keeps the working parameters and the gradients. "parameters"
// (ZeRO-3 only; FSDP's CPU offload, ZeRO-Infinity's offload_param) also keeps the working-parameter and
// gradient shards on the host between uses (2 + g + 12 B / d there, where the optimizer reads the gradient
// shard in place, widened as it reads); the device holds only gathered layers and transient full gradients
// (the memory model's "other"). With AdamW, bf16 gradients, dp d:
//   optimizer offload, device | host:  4 | 12 + 4   (ZeRO 0)   4 | (12 + 4)/d (1)   2 + 2/d | 16/d (2)
//                                      2/d + 2/d | 16/d (3);   parameters offload (3): 0 | 16/d
//
// What always holds: every figure is >= 0; total() = parameters + gradients + optimizer; ZeRO stage s + 1
// never costs more than stage s; modelStateLayout and modelStateBytes agree (bytes = element bytes / d where
// the layout says sharded).
#pragma once

#include <string>

#include "plan/run_config.h"

namespace ms {

// How a rank keeps its model states (what the parameter store allocates).
struct ModelStateLayout {
  bool mixed = false;         // bf16 working parameters with separate fp32 master weights
  double workingBytes = 4;    // per element of the working parameters the layers read (4 fp32, 2 bf16)
  double gradientBytes = 4;   // per element of the gradients (4 fp32, 2 bf16)
  double masterBytes = 0;     // per element of the fp32 master weights (4 in mixed precision, else 0)
  double momentBytes = 0;     // per element of the optimizer's moments (AdamW 8, SGD with momentum 4, else 0)
  bool shardWorking = false;  // ZeRO 3: each rank keeps 1/d of the working parameters, gathers them per use
  bool shardGradients = false;     // ZeRO >= 2: each rank keeps the reduced gradients of its 1/d
  bool shardOptimizer = false;     // ZeRO >= 1: each rank keeps master weights and moments of its 1/d
  bool offloadOptimizer = false;   // master, moments and an fp32 copy of the owned gradients on the host
  bool offloadParameters = false;  // (ZeRO-3) the working-parameter and gradient shards on the host too
};
ModelStateLayout modelStateLayout(Precision precision, GradPrecision gradPrecision,
                                  const OptimizerConfig& optimizer, int zero,
                                  Offload offload = Offload::None);
ModelStateLayout modelStateLayout(const ParallelConfig& parallel, const OptimizerConfig& optimizer);

// Bytes per parameter element of a rank's model states, after ZeRO sharding over dp ranks (dp >= 1).
struct ModelStateBytes {
  // On the device.
  double parameters = 0;  // the working parameters
  double gradients = 0;
  double optimizer = 0;  // master weights (mixed precision) and moments
  // In host memory (offload; all 0 without).
  double hostParameters = 0;  // the working-parameter shard ("parameters")
  double hostGradients = 0;   // the gradient shard ("parameters"), or the owned gradients' fp32 copy
  double hostOptimizer = 0;   // master weights and moments
  double total() const { return parameters + gradients + optimizer; }
  double hostTotal() const { return hostParameters + hostGradients + hostOptimizer; }
};
ModelStateBytes modelStateBytes(const ModelStateLayout& layout, int dp);
ModelStateBytes modelStateBytes(const ParallelConfig& parallel, const OptimizerConfig& optimizer);

// The arithmetic of one category as text, for tooltips: "2 B bf16 / 64 ranks (ZeRO-3)".
struct ModelStateText {
  std::string parameters, gradients, optimizer;
  std::string host;  // offload: what the host keeps, "" without
};
ModelStateText modelStateText(const ParallelConfig& parallel, const OptimizerConfig& optimizer);

}  // namespace ms
