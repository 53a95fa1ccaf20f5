// Model-state bytes per parameter; see model_state.h for the rules and their sources.
#include "plan/model_state.h"

#include <algorithm>
#include <cstdio>

namespace ms {

ModelStateLayout modelStateLayout(Precision precision, GradPrecision gradPrecision,
                                  const OptimizerConfig& optimizer, int zero, Offload offload) {
  ModelStateLayout l;
  l.mixed = precision == Precision::Bf16;
  l.workingBytes = l.mixed ? 2.0 : 4.0;
  l.gradientBytes = l.mixed && gradPrecision == GradPrecision::Bf16 ? 2.0 : 4.0;
  l.masterBytes = l.mixed ? 4.0 : 0.0;
  // AdamW: the two moments (exp_avg, exp_avg_sq); SGD: the momentum buffer, none without momentum.
  l.momentBytes = optimizer.type == OptimizerType::AdamW ? 8.0 : (optimizer.momentum > 0 ? 4.0 : 0.0);
  l.shardOptimizer = zero >= 1;
  l.shardGradients = zero >= 2;
  l.shardWorking = zero >= 3;
  // Offload moves the master weights, which only mixed precision keeps apart (config_checks refuses it
  // otherwise); "parameters" moves shards, which only ZeRO-3 has.
  l.offloadOptimizer = l.mixed && offload != Offload::None;
  l.offloadParameters = l.offloadOptimizer && offload == Offload::Parameters && l.shardWorking;
  return l;
}

ModelStateLayout modelStateLayout(const ParallelConfig& p, const OptimizerConfig& optimizer) {
  return modelStateLayout(p.precision, p.gradPrecision, optimizer, p.zero, p.offload);
}

ModelStateBytes modelStateBytes(const ModelStateLayout& l, int dp) {
  const double d = std::max(1, dp);
  ModelStateBytes b;
  b.parameters = l.workingBytes / (l.shardWorking ? d : 1.0);
  b.gradients = l.gradientBytes / (l.shardGradients ? d : 1.0);
  b.optimizer = (l.masterBytes + l.momentBytes) / (l.shardOptimizer ? d : 1.0);
  if (l.offloadOptimizer) {
    b.hostOptimizer = b.optimizer;
    b.optimizer = 0;
    if (l.offloadParameters) {
      b.hostParameters = b.parameters;
      b.hostGradients = b.gradients;  // the shard, read in place by the host's step
      b.parameters = b.gradients = 0;
    } else {
      b.hostGradients = 4.0 / (l.shardOptimizer ? d : 1.0);  // the owned gradients, widened to fp32
    }
  }
  return b;
}

ModelStateBytes modelStateBytes(const ParallelConfig& p, const OptimizerConfig& optimizer) {
  return modelStateBytes(modelStateLayout(p, optimizer), p.dataReplicas());
}

namespace {

std::string part(double bytes, const char* what, bool sharded, int dp, const char* zeroFrom) {
  char buf[160];
  if (bytes <= 0) return "0 B";
  if (sharded && dp > 1)
    std::snprintf(buf, sizeof buf, "%g B %s / %d ranks (ZeRO-%s) = %.4g B", bytes, what, dp, zeroFrom,
                  bytes / dp);
  else
    std::snprintf(buf, sizeof buf, "%g B %s", bytes, what);
  return buf;
}

}  // namespace

ModelStateText modelStateText(const ParallelConfig& p, const OptimizerConfig& optimizer) {
  const ModelStateLayout l = modelStateLayout(p, optimizer);
  ModelStateText t;
  t.parameters = part(l.workingBytes, l.mixed ? "bf16 working parameters" : "fp32 parameters", l.shardWorking,
                      p.dataReplicas(), "3");
  t.gradients = part(l.gradientBytes, l.gradientBytes == 2 ? "bf16 gradients" : "fp32 gradients",
                     l.shardGradients, p.dataReplicas(), "2");
  std::string what = l.mixed ? "fp32 master" : "";
  if (l.momentBytes > 0)
    what += std::string(what.empty() ? "" : " + ") +
            (optimizer.type == OptimizerType::AdamW ? "AdamW moments" : "SGD momentum");
  t.optimizer = part(l.masterBytes + l.momentBytes, what.c_str(), l.shardOptimizer, p.dataReplicas(), "1");
  if (l.offloadOptimizer) {
    const ModelStateBytes b = modelStateBytes(l, p.dataReplicas());
    char buf[200];
    std::snprintf(buf, sizeof buf, "host: %.4g B optimizer state + %.4g B gradients%s = %.4g B per parameter",
                  b.hostOptimizer, b.hostGradients,
                  l.offloadParameters ? "" : " (fp32 copy of the owned ones)", b.hostTotal());
    if (l.offloadParameters)
      std::snprintf(buf, sizeof buf,
                    "host: %.4g B parameter shard + %.4g B gradient shard + %.4g B optimizer "
                    "state = %.4g B per parameter",
                    b.hostParameters, b.hostGradients, b.hostOptimizer, b.hostTotal());
    t.host = buf;
    t.optimizer += " (on the host)";
    if (l.offloadParameters) {
      t.parameters += " (shard on the host)";
      t.gradients += " (shard on the host)";
    }
  }
  return t;
}

}  // namespace ms
