// Plans as the frameworks' launch files; see frameworks.h. One function per target builds the names and
// values it writes from the plan (the built Plan: its partition is the placement as the engine runs it), and
// lists what the target cannot say.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "plan/framework_text.h"
#include "plan/frameworks.h"
#include "plan/launch_script.h"
#include "plan/plan.h"

namespace ms {

std::optional<Framework> frameworkFromName(std::string_view name) {
  if (name == "megatron" || name == "megatron-lm") return Framework::Megatron;
  if (name == "torchtitan") return Framework::Torchtitan;
  if (name == "deepspeed") return Framework::DeepSpeed;
  return std::nullopt;
}
const char* frameworkName(Framework f) {
  switch (f) {
    case Framework::Megatron:
      return "megatron";
    case Framework::Torchtitan:
      return "torchtitan";
    case Framework::DeepSpeed:
      return "deepspeed";
  }
  return "";
}
const char* frameworkDisplay(Framework f) {
  switch (f) {
    case Framework::Megatron:
      return "Megatron-LM";
    case Framework::Torchtitan:
      return "torchtitan";
    case Framework::DeepSpeed:
      return "DeepSpeed";
  }
  return "";
}

namespace {

// A number as a flag value: integers bare, others in the shortest form that reads back exactly.
std::string fwNumber(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  return shortestNumber(v);
}

// The mesh as torchrun sees it: nodes of equal device counts. Anything else is listed.
struct FwNodes {
  int nodes = 1, perNode = 1;
  std::string device;
};
FwNodes fwNodes(const RunConfig& c, Framework target, std::vector<std::string>& notCarried) {
  FwNodes n;
  const auto& nodes = c.mesh.nodes;
  n.nodes = std::max<int>(1, static_cast<int>(nodes.size()));
  n.perNode = nodes.empty() ? 1 : nodes[0].count;
  n.device = nodes.empty() ? std::string("cpu") : nodes[0].device;
  bool uneven = false, mixed = false;
  for (const NodeConfig& node : nodes) {
    uneven = uneven || node.count != n.perNode;
    mixed = mixed || node.device != n.device;
  }
  const int ranks = c.parallel.dp * c.parallel.cp * c.parallel.tp * c.parallel.pp;
  if (uneven || n.nodes * n.perNode != ranks) {
    // torchrun starts the same number of processes on every node: as many nodes as the ranks need.
    n.perNode = std::min(ranks, std::max(1, n.perNode));
    n.nodes = (ranks + n.perNode - 1) / n.perNode;
    notCarried.push_back(
        std::string(frameworkDisplay(target)) +
        " starts the same number of ranks on every node; the mesh's nodes differ or hold more "
        "devices than the plan's " +
        std::to_string(ranks) + " ranks, so the script runs " + std::to_string(n.nodes) + " nodes of " +
        std::to_string(n.perNode) + " ranks");
  }
  if (mixed)
    notCarried.push_back(
        "the mesh mixes device types; the frameworks place ranks without knowing them (the script "
        "runs every rank alike)");
  if (n.device == "cpu" || n.device.rfind("here", 0) == 0)
    notCarried.push_back(std::string(frameworkDisplay(target)) +
                         " trains on NVIDIA GPUs; the plan's devices are \"" + n.device +
                         "\" (the script is written for one GPU a rank)");
  return n;
}

// --- Megatron-LM
// ---------------------------------------------------------------------------------------------

// A group of flags, written as one bash array.
struct FwGroup {
  std::string name;                                        // "MODEL_ARGS"
  std::vector<std::pair<std::string, std::string>> flags;  // flag, value ("" for a switch)
  void add(const std::string& flag, const std::string& value = {}) { flags.emplace_back(flag, value); }
};

// The Megatron layout string of a partition: stages split by '|' in virtual-stage order (virtual stage v of
// pipeline rank r at index v * pp + r), E the embedding, t a transformer layer, L the head and loss
// (megatron/core/transformer/pipeline_parallel_layer_layout.py). Runs of t are written "t*N".
std::string megatronLayout(const Partition& partition, const ModelSpec& spec) {
  const int P = partition.stages, V = partition.chunksPerStage;
  std::string out;
  for (int v = 0; v < V; ++v) {
    for (int r = 0; r < P; ++r) {
      const std::vector<int> chunks = partition.chunksOfStage(r);
      std::string stage;
      int run = 0;
      const auto flush = [&] {
        if (run > 0) stage += run == 1 ? "t" : "t*" + std::to_string(run);
        run = 0;
      };
      for (int layer : partition.chunks[static_cast<size_t>(chunks[static_cast<size_t>(v)])]) {
        const std::string& name = spec.layers[static_cast<size_t>(layer)].name;
        if (name == "embedding") {
          flush();
          stage += "E";
        } else if (name == "head") {
          flush();
          stage += "L";
        } else {
          ++run;
        }
      }
      flush();
      out += (out.empty() && v == 0 && r == 0 ? "" : "|") + stage;
    }
  }
  return out;
}

Expected<FrameworkExport> exportMegatron(const RunConfig& c) {
  FrameworkExport ex;
  ex.target = Framework::Megatron;
  auto& notCarried = ex.notCarried;
  if (c.model.type != ModelType::Gpt && c.model.type != ModelType::Llama)
    return Status::error(
        "/model/type: Megatron-LM's pretrain_gpt.py trains gpt and llama models, not this one");
  Expected<Plan> built = buildPlan(c, true);
  if (!built) return built.status();
  const Plan& plan = *built;
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const TrainingConfig& t = c.training;
  const OptimizerConfig& o = c.optimizer;
  const FwNodes nodes = fwNodes(c, Framework::Megatron, notCarried);

  FwGroup model{"MODEL_ARGS", {}};
  model.add("--num-layers", std::to_string(m.layers));
  model.add("--hidden-size", std::to_string(m.width));
  model.add("--num-attention-heads", std::to_string(m.heads));
  model.add("--seq-length", std::to_string(t.seqLen));
  model.add("--max-position-embeddings", std::to_string(m.context));
  model.add("--init-method-std", fwNumber(m.initStd));
  model.add("--norm-epsilon", fwNumber(m.layerNormEps));
  // The engine's models have no dropout; Megatron-LM's default is 0.1 for both.
  model.add("--attention-dropout", "0");
  model.add("--hidden-dropout", "0");
  if (!m.tieEmbeddings) model.add("--untie-embeddings-and-output-weights");
  if (m.type == ModelType::Gpt) {
    model.add("--ffn-hidden-size", std::to_string(m.mlpRatio * m.width));
    model.add("--position-embedding-type", "learned_absolute");
    // GPT-2's tanh approximation of GELU, which the engine computes (kernels/cpu/pointwise.cpp).
    model.add("--openai-gelu");
  } else {
    model.add("--normalization", "RMSNorm");
    model.add("--swiglu");
    model.add("--disable-bias-linear");
    model.add("--position-embedding-type", "rope");
    model.add("--rotary-base", fwNumber(m.ropeTheta));
    model.add("--ffn-hidden-size", std::to_string(m.ffnHidden > 0 ? m.ffnHidden : llamaFfnHidden(m.width)));
    if (m.kvHeadCount() != m.heads) {
      model.add("--group-query-attention");
      model.add("--num-query-groups", std::to_string(m.kvHeadCount()));
    }
    if (m.experts > 0) {
      const int expertFfn = m.expertFfnHidden > 0
                                ? m.expertFfnHidden
                                : (m.ffnHidden > 0 ? m.ffnHidden : int(llamaFfnHidden(m.width)));
      model.add("--num-experts", std::to_string(m.experts));
      model.add("--moe-router-topk", std::to_string(m.expertsPerToken));
      model.add("--moe-ffn-hidden-size", std::to_string(expertFfn));
      if (m.sharedExperts > 0)
        model.add("--moe-shared-expert-intermediate-size", std::to_string(m.sharedExperts * expertFfn));
      model.add("--moe-router-load-balancing-type", "aux_loss");
      model.add("--moe-aux-loss-coeff", fwNumber(m.auxLossCoef));
      if (m.capacityFactor > 0) model.add("--moe-expert-capacity-factor", fwNumber(m.capacityFactor));
      if (m.denseLayers > 0)
        model.add("--moe-layer-freq", "([0]*" + std::to_string(m.denseLayers) + "+[1]*" +
                                          std::to_string(m.layers - m.denseLayers) + ")");
      model.add("--moe-token-dispatcher-type", "alltoall");
    }
  }
  model.add("--vocab-size", std::to_string(m.vocab));
  // The vocabulary as the plan has it: Megatron pads it to a multiple of this times the tensor-parallel size.
  model.add("--make-vocab-size-divisible-by", "1");
  if (m.vocab % p.tp != 0)
    notCarried.push_back("Megatron-LM pads the vocabulary (" + std::to_string(m.vocab) +
                         ") to a multiple of the tensor-parallel size (" + std::to_string(p.tp) + ")");

  FwGroup parallel{"PARALLEL_ARGS", {}};
  parallel.add("--tensor-model-parallel-size", std::to_string(p.tp));
  parallel.add("--pipeline-model-parallel-size", std::to_string(p.pp));
  if (p.cp > 1) parallel.add("--context-parallel-size", std::to_string(p.cp));
  if (p.ep > 1) parallel.add("--expert-model-parallel-size", std::to_string(p.ep));
  if (p.sequenceParallel && p.tp > 1) parallel.add("--sequence-parallel");
  // Transformer Engine's userbuffers overlap of the sequence-parallel collectives with the GEMMs.
  if (p.tpCommOverlap && p.sequenceParallel && p.tp > 1) parallel.add("--tp-comm-overlap");
  if (p.pp > 1 || p.virtualChunks > 1) {
    // Megatron's own split: every stage (and virtual stage) the same number of blocks, the embedding with the
    // first and the head with the last. Anything else is the explicit layout.
    const Partition& part = plan.partition;
    const int V = part.chunksPerStage, K = p.pp * V;
    bool megatronDefault = m.layers % K == 0;
    for (int k = 0; megatronDefault && k < K; ++k) {
      int blocks = 0;
      for (int layer : part.chunks[static_cast<size_t>(k)]) {
        const std::string& name = plan.model.layers[static_cast<size_t>(layer)].name;
        blocks += name != "embedding" && name != "head";
      }
      megatronDefault = blocks == m.layers / K && part.stageOf[static_cast<size_t>(k)] == k % p.pp;
    }
    // Megatron runs virtual stage v of pipeline rank r as the model's (v * pp + r)-th chunk.
    bool roundRobin = true;
    for (int k = 0; k < K; ++k) roundRobin = roundRobin && part.stageOf[static_cast<size_t>(k)] == k % p.pp;
    if (megatronDefault) {
      if (V > 1) parallel.add("--num-virtual-stages-per-pipeline-rank", std::to_string(V));
    } else if (roundRobin) {
      parallel.add("--pipeline-model-parallel-layout", megatronLayout(part, plan.model));
    } else {
      if (V > 1) parallel.add("--num-virtual-stages-per-pipeline-rank", std::to_string(V));
      notCarried.push_back(
          "the placement puts chunks on stages out of turn (chunk k on a stage other than k mod pp), "
          "which Megatron-LM's layouts cannot say: the script splits the blocks evenly");
    }
  }
  if (p.pp > 1 && p.schedule == Schedule::GPipe)
    notCarried.push_back(
        "Megatron-LM has no GPipe schedule: the script runs 1F1B, with the same bubble and fewer "
        "microbatches' activations held at once");
  if (p.pp > 1 && p.schedule == Schedule::ZbH1)
    notCarried.push_back(
        "Megatron-LM has no zero-bubble (ZB-H1) schedule: the script runs 1F1B, whose bubble is "
        "larger");
  if (p.zero == 1) parallel.add("--use-distributed-optimizer");
  if (p.zero >= 2) {
    parallel.add("--use-megatron-fsdp");
    parallel.add("--data-parallel-sharding-strategy", p.zero == 2 ? "optim_grads" : "optim_grads_params");
  }
  if (p.overlapParamGather && (p.zero == 1 || p.zero == 2)) {
    // Megatron-LM asserts --overlap-grad-reduce with it (megatron/training/arguments.py); the plan's
    // gradient sync overlaps the backward already (runtime/model.cpp startSync).
    parallel.add("--overlap-grad-reduce");
    parallel.add("--overlap-param-gather");
  }
  if (p.recompute == Recompute::Selective) parallel.add("--recompute-granularity", "selective");
  if (p.recompute == Recompute::Full) {
    parallel.add("--recompute-granularity", "full");
    if (p.recomputeLayers > 0) {
      parallel.add("--recompute-method", "block");
      parallel.add("--recompute-num-layers", std::to_string(p.recomputeLayers));
    } else {
      parallel.add("--recompute-method", "uniform");
      parallel.add("--recompute-num-layers", "1");
    }
  }
  if (p.precision == Precision::Bf16) parallel.add("--bf16");
  if (p.gradPrecision == GradPrecision::Bf16) parallel.add("--grad-reduce-in-bf16");
  if (p.offload == Offload::Optimizer) parallel.add("--optimizer-cpu-offload");
  if (p.offload == Offload::Parameters)
    notCarried.push_back(
        "Megatron-LM cannot offload parameters to host memory: the script offloads the optimizer "
        "state only (--optimizer-cpu-offload)");
  if (p.offload == Offload::Parameters) parallel.add("--optimizer-cpu-offload");

  FwGroup training{"TRAINING_ARGS", {}};
  training.add("--micro-batch-size", std::to_string(microbatchSize(c)));
  training.add("--global-batch-size", std::to_string(t.batchSize));
  training.add("--train-iters", std::to_string(t.steps));
  training.add("--seed", std::to_string(c.seed));
  if (o.type == OptimizerType::AdamW) {
    training.add("--optimizer", "adam");  // Megatron's adam decouples the weight decay (AdamW)
    training.add("--adam-beta1", fwNumber(o.beta1));
    training.add("--adam-beta2", fwNumber(o.beta2));
    training.add("--adam-eps", fwNumber(o.eps));
  } else {
    training.add("--optimizer", "sgd");
    training.add("--sgd-momentum", fwNumber(o.momentum));
    if (o.nesterov)
      notCarried.push_back("Megatron-LM's SGD has no Nesterov momentum: the script runs plain momentum");
  }
  training.add("--lr", fwNumber(o.lr));
  training.add("--min-lr", fwNumber(o.lr * t.minLrRatio));
  training.add("--lr-decay-style", t.lrSchedule == LrSchedule::Cosine   ? "cosine"
                                   : t.lrSchedule == LrSchedule::Linear ? "linear"
                                                                        : "constant");
  training.add("--lr-warmup-iters", std::to_string(t.warmupSteps));
  training.add("--lr-decay-iters", std::to_string(t.steps));
  training.add("--weight-decay", fwNumber(o.weightDecay));
  training.add("--clip-grad", fwNumber(t.gradClip));
  training.add("--log-interval", std::to_string(std::max(1, t.logEvery)));
  training.add("--eval-interval", std::to_string(t.evalEvery > 0 ? t.evalEvery : t.steps));
  if (t.evalBatches > 0) {
    training.add("--eval-iters", std::to_string(t.evalBatches));
  } else {
    notCarried.push_back(
        "evaluation over the whole split (eval_batches 0): Megatron-LM evaluates a fixed number of "
        "batches (--eval-iters, default 100)");
  }
  training.add("--save-interval", std::to_string(t.checkpointEvery > 0 ? t.checkpointEvery : t.steps));

  FwGroup data{"DATA_ARGS", {}};
  data.add("--data-path", "$DATA_PATH");
  data.add("--tokenizer-type", "NullTokenizer");
  data.add("--save", "$CHECKPOINT_PATH");
  data.add("--load", "$CHECKPOINT_PATH");

  const FrameworkVocabulary& vocab = frameworkVocabulary(Framework::Megatron);
  std::string s;
  s += "#!/bin/bash\n";
  s += "# " + c.name + ": a MeshStudio plan for Megatron-LM's pretrain_gpt.py (flags as documented at " +
       vocab.version + ", commit " + vocab.commit.substr(0, 10) +
       "; resources/frameworks/megatron-lm.json).\n";
  s += "# " + std::to_string(nodes.nodes) + " node(s) of " + std::to_string(nodes.perNode) + " " +
       nodes.device + "; dp " + std::to_string(p.dp) + " x cp " + std::to_string(p.cp) + " x tp " +
       std::to_string(p.tp) + " x pp " + std::to_string(p.pp) +
       (p.ep > 1 ? " (ep " + std::to_string(p.ep) + ")" : "") + ".\n";
  if (notCarried.empty()) {
    s += "# Everything in the plan is carried over.\n";
  } else {
    s += "# What the plan says that Megatron-LM cannot, and what this script does instead:\n";
    for (const std::string& n : notCarried) s += "#   - " + n + "\n";
  }
  s += "#\n# Run it on every node, with NODE_RANK and MASTER_ADDR set; DATA_PATH names a Megatron indexed\n"
       "# dataset (tools/preprocess_data.py) and MEGATRON the Megatron-LM checkout.\n";
  s += "set -euo pipefail\n\n";
  s += "MEGATRON=${MEGATRON:-$PWD/Megatron-LM}\n";
  s += "DATA_PATH=${DATA_PATH:?set DATA_PATH to a Megatron indexed dataset prefix}\n";
  s += "CHECKPOINT_PATH=${CHECKPOINT_PATH:-checkpoints/" + shellQuote(c.name) + "}\n";
  s += "GPUS_PER_NODE=" + std::to_string(nodes.perNode) + "\n";
  s += "NUM_NODES=" + std::to_string(nodes.nodes) + "\n";
  s += "export CUDA_DEVICE_MAX_CONNECTIONS=1\n\n";
  s += "DISTRIBUTED_ARGS=(\n    --nproc_per_node $GPUS_PER_NODE\n    --nnodes $NUM_NODES\n"
       "    --node_rank ${NODE_RANK:-0}\n    --master_addr ${MASTER_ADDR:-localhost}\n"
       "    --master_port ${MASTER_PORT:-6000}\n)\n\n";
  for (const FwGroup* g : {&model, &parallel, &training, &data}) {
    s += g->name + "=(\n";
    for (const auto& [flag, value] : g->flags) {
      ex.namesWritten.push_back(flag);
      s += "    " + flag;
      if (!value.empty()) s += " " + (value[0] == '$' ? "\"" + value + "\"" : shellQuote(value));
      s += "\n";
    }
    s += ")\n\n";
  }
  s += "torchrun \"${DISTRIBUTED_ARGS[@]}\" \"$MEGATRON/pretrain_gpt.py\" \\\n"
       "    \"${MODEL_ARGS[@]}\" \\\n    \"${PARALLEL_ARGS[@]}\" \\\n    \"${TRAINING_ARGS[@]}\" \\\n"
       "    \"${DATA_ARGS[@]}\" \"$@\"\n";
  ex.files.push_back({"megatron/pretrain_gpt.sh", s, true});
  return ex;
}

// --- torchtitan
// -----------------------------------------------------------------------------------------------

// The Llama rule for the SwiGLU width of a torchtitan flavor (torchtitan/models/llama3/model: 4 dim, two
// thirds, times ffn_dim_multiplier, rounded up to multiple_of).
int64_t fwTitanFfn(int64_t dim, double multiplier, int64_t multipleOf) {
  int64_t hidden = 4 * dim;
  hidden = 2 * hidden / 3;
  if (multiplier > 0) hidden = static_cast<int64_t>(multiplier * double(hidden));
  return multipleOf * ((hidden + multipleOf - 1) / multipleOf);
}

}  // namespace

// A torchtitan llama3 flavor as a model config (its vocabulary is the flavor's vocab_size, which a tokenizer
// of another size overrides at run time). Defined here, used by the importer too.
std::optional<ModelConfig> torchtitanFlavor(const std::string& modelName, const std::string& flavor) {
  const nlohmann::json& flavors =
      frameworkVocabulary(Framework::Torchtitan).document.value("model_flavors", nlohmann::json::object());
  if (!flavors.contains(modelName) || !flavors[modelName].contains(flavor)) return std::nullopt;
  const nlohmann::json& f = flavors[modelName][flavor];
  ModelConfig m;
  m.type = ModelType::Llama;
  m.width = f.value("dim", 4096);
  m.layers = f.value("n_layers", 32);
  m.heads = f.value("n_heads", 32);
  m.kvHeads = f.contains("n_kv_heads") && f["n_kv_heads"].is_number() ? f["n_kv_heads"].get<int>() : 0;
  if (m.kvHeads == m.heads) m.kvHeads = 0;
  m.vocab = f.value("vocab_size", 128256);
  const double multiplier = f.contains("ffn_dim_multiplier") && f["ffn_dim_multiplier"].is_number()
                                ? f["ffn_dim_multiplier"].get<double>()
                                : 0;
  m.ffnHidden = static_cast<int>(fwTitanFfn(m.width, multiplier, f.value("multiple_of", 256)));
  if (m.ffnHidden == llamaFfnHidden(m.width)) m.ffnHidden = 0;
  m.ropeTheta = f.value("rope_theta", 10000.0);
  m.layerNormEps = f.value("norm_eps", 1e-5);
  m.tieEmbeddings = false;
  m.context = f.value("max_seq_len", 131072);
  return m;
}

namespace {

// The shape fields a flavor fixes (context and vocabulary aside).
bool fwSameShape(const ModelConfig& a, const ModelConfig& b) {
  return a.type == b.type && a.width == b.width && a.layers == b.layers && a.heads == b.heads &&
         a.kvHeadCount() == b.kvHeadCount() &&
         (a.ffnHidden > 0 ? a.ffnHidden : llamaFfnHidden(a.width)) ==
             (b.ffnHidden > 0 ? b.ffnHidden : llamaFfnHidden(b.width)) &&
         a.ropeTheta == b.ropeTheta && a.layerNormEps == b.layerNormEps &&
         a.tieEmbeddings == b.tieEmbeddings && a.experts == b.experts;
}

// torchtitan's module names of a layer: tok_embeddings, layers.N, norm + output.
std::vector<std::string> fwTitanModules(const std::string& layer) {
  if (layer == "embedding") return {"tok_embeddings"};
  if (layer == "head") return {"norm", "output"};
  return {"layers." + layer.substr(layer.find('.') + 1)};
}

Expected<FrameworkExport> exportTorchtitan(const RunConfig& c) {
  FrameworkExport ex;
  ex.target = Framework::Torchtitan;
  auto& notCarried = ex.notCarried;
  if (c.model.type != ModelType::Llama)
    return Status::error(
        "/model/type: torchtitan trains Llama-family models (its llama3 flavors), not this one");
  Expected<Plan> built = buildPlan(c, true);
  if (!built) return built.status();
  const Plan& plan = *built;
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const TrainingConfig& t = c.training;
  const OptimizerConfig& o = c.optimizer;
  const FwNodes nodes = fwNodes(c, Framework::Torchtitan, notCarried);
  const FrameworkVocabulary& vocab = frameworkVocabulary(Framework::Torchtitan);

  // The flavor: the one whose shape is the model's.
  std::string flavor;
  const nlohmann::json flavors = vocab.document.value("model_flavors", nlohmann::json::object());
  if (flavors.contains("llama3"))
    for (const auto& [name, value] : flavors["llama3"].items()) {
      (void)value;
      const std::optional<ModelConfig> f = torchtitanFlavor("llama3", name);
      if (f && fwSameShape(*f, m) && name.find('_') == std::string::npos) {
        flavor = name;
        break;
      }
    }
  if (m.experts > 0)
    notCarried.push_back(
        "torchtitan's llama3 model has no experts (its MoE models are llama4, deepseek_v3 and "
        "qwen3, with their own shapes): the file names a dense flavor");
  if (flavor.empty()) {
    flavor = "8B";
    notCarried.push_back(
        "torchtitan takes the model from a named flavor, and no llama3 flavor has this shape (width " +
        std::to_string(m.width) + ", " + std::to_string(m.layers) + " layers, " + std::to_string(m.heads) +
        " heads, " + std::to_string(m.kvHeadCount()) +
        " key/value heads): the file names \"8B\"; add a flavor with these dimensions to "
        "torchtitan/models/llama3/__init__.py to run this plan's model");
  }
  if (const std::optional<ModelConfig> f = torchtitanFlavor("llama3", flavor); f && f->vocab != m.vocab)
    notCarried.push_back("the vocabulary (" + std::to_string(m.vocab) + ") comes from the tokenizer in " +
                         "model.hf_assets_path at run time (the flavor's is " + std::to_string(f->vocab) +
                         ")");

  nlohmann::json toml = nlohmann::json::object();
  toml["job"] = {{"dump_folder", "./outputs/" + c.name}, {"description", c.name + ": a MeshStudio plan"}};
  toml["model"] = {{"name", "llama3"}, {"flavor", flavor}, {"hf_assets_path", "./assets/hf/" + c.name}};
  toml["optimizer"] = {{"name", "AdamW"},  {"lr", o.lr},      {"eps", o.eps}, {"weight_decay", o.weightDecay},
                       {"beta1", o.beta1}, {"beta2", o.beta2}};
  if (o.type != OptimizerType::AdamW)
    notCarried.push_back("torchtitan's optimizers are Adam and AdamW: the file runs AdamW in place of SGD");
  nlohmann::json sched = {{"warmup_steps", t.warmupSteps}, {"min_lr_factor", t.minLrRatio}};
  if (t.lrSchedule == LrSchedule::Constant) {
    sched["decay_ratio"] = 0.0;
  } else {
    sched["decay_type"] = t.lrSchedule == LrSchedule::Cosine ? "cosine" : "linear";
  }
  toml["lr_scheduler"] = sched;
  const int mbs = microbatchSize(c);
  // torchtitan's local batch is one data-parallel rank's samples a step (the pipeline's microbatches
  // included); global_batch_size above local x dp accumulates gradients.
  const int local = p.pp > 1 ? mbs * p.microbatches : mbs;
  nlohmann::json training = {
      {"local_batch_size", local},
      {"global_batch_size", t.batchSize},
      {"seq_len", t.seqLen},
      {"max_norm", t.gradClip},
      {"steps", t.steps},
      {"mixed_precision_param", p.precision == Precision::Bf16 ? "bfloat16" : "float32"},
      {"mixed_precision_reduce", "float32"}};
  if (p.gradPrecision == GradPrecision::Bf16)
    notCarried.push_back(
        "torchtitan reduces gradients in fp32 only (training.mixed_precision_reduce): the file "
        "reduces them in fp32");
  if (p.offload != Offload::None) training["enable_cpu_offload"] = true;
  if (p.offload == Offload::Optimizer)
    notCarried.push_back(
        "torchtitan's CPU offload (FSDP's) moves parameters, gradients and optimizer state: the "
        "file offloads all three where the plan offloads the optimizer state");
  if (p.precision == Precision::Bf16 && p.zero == 0 && p.dp > 1)
    notCarried.push_back(
        "torchtitan applies bf16 mixed precision through FSDP: with ZeRO 0 (data_parallel_shard_"
        "degree 1) its replicas train in training.dtype");
  toml["training"] = training;

  nlohmann::json par = nlohmann::json::object();
  // ZeRO over the data-parallel ranks as FSDP2: stage 3 reshards the parameters after the forward, stage 2
  // keeps them (reshard_after_forward never); stage 0 replicates (DDP). Stage 1 has no FSDP counterpart.
  if (p.zero == 0) {
    par["data_parallel_replicate_degree"] = p.dp;
    par["data_parallel_shard_degree"] = 1;
  } else {
    par["data_parallel_replicate_degree"] = 1;
    par["data_parallel_shard_degree"] = p.dp;
    par["fsdp_reshard_after_forward"] = p.zero == 3 ? "always" : "never";
    if (p.zero == 1)
      notCarried.push_back(
          "torchtitan's FSDP shards parameters and gradients with the optimizer state: ZeRO-1 "
          "becomes ZeRO-2 (reshard_after_forward never), less memory than the plan says");
  }
  par["tensor_parallel_degree"] = p.tp;
  if (p.tp > 1 && !p.sequenceParallel)
    notCarried.push_back(
        "torchtitan's tensor parallelism always shards the sequence between the blocks "
        "(sequence parallelism): the file runs it with");
  // Async tensor parallelism (micro-pipelined all-gather + GEMM and GEMM + reduce-scatter), which torchtitan
  // runs only under torch.compile: compile.enable below.
  const bool asyncTp = p.tpCommOverlap && p.tp > 1;
  if (asyncTp) par["enable_async_tensor_parallel"] = true;
  par["pipeline_parallel_degree"] = p.pp;
  par["context_parallel_degree"] = p.cp;
  par["expert_parallel_degree"] = p.ep;
  if (p.pp > 1) {
    const char* schedule = p.schedule == Schedule::GPipe             ? "GPipe"
                           : p.schedule == Schedule::Interleaved1F1B ? "Interleaved1F1B"
                           : p.schedule == Schedule::ZbH1            ? "InterleavedZeroBubble"
                                                                     : "1F1B";
    if (p.schedule == Schedule::ZbH1)
      notCarried.push_back(
          "torchtitan's zero-bubble schedules are InterleavedZeroBubble and ZBVZeroBubble, "
          "not ZB-H1: the file names InterleavedZeroBubble");
    par["pipeline_parallel_schedule"] = schedule;
    par["pipeline_parallel_microbatch_size"] = mbs;
    // The placement as torchtitan's model parts: part k is the k-th chunk in model order, on stage k mod pp
    // (its looped schedules' assignment).
    const Partition& part = plan.partition;
    bool looped = true;
    for (size_t k = 0; k < part.stageOf.size(); ++k) looped = looped && part.stageOf[k] == int(k) % p.pp;
    if (!looped)
      notCarried.push_back(
          "the placement puts chunks on stages out of turn, which torchtitan's model parts "
          "cannot say: the file lists the chunks in model order, part k on stage k mod pp");
    nlohmann::json parts = nlohmann::json::array();
    for (const std::vector<int>& chunk : part.chunks) {
      nlohmann::json names = nlohmann::json::array();
      for (int layer : chunk)
        for (const std::string& n : fwTitanModules(plan.model.layers[static_cast<size_t>(layer)].name))
          names.push_back(n);
      parts.push_back(names);
    }
    par["module_fqns_per_model_part"] = parts;
  }
  toml["parallelism"] = par;
  if (asyncTp) toml["compile"] = {{"enable", true}};
  nlohmann::json ac = nlohmann::json::object();
  ac["mode"] = p.recompute == Recompute::None   ? "none"
               : p.recompute == Recompute::Full ? "full"
                                                : "selective";
  if (p.recompute == Recompute::Selective) ac["selective_ac_option"] = "op";
  if (p.recompute == Recompute::Full && p.recomputeLayers > 0)
    notCarried.push_back(
        "torchtitan recomputes every block or every Nth (selective_ac_option N), not the first " +
        std::to_string(p.recomputeLayers) + " of each chunk: the file recomputes every block");
  toml["activation_checkpoint"] = ac;
  toml["checkpoint"] = {{"enable", true},
                        {"folder", "checkpoint"},
                        {"interval", t.checkpointEvery > 0 ? t.checkpointEvery : t.steps}};
  toml["metrics"] = {{"log_freq", std::max(1, t.logEvery)}};
  if (t.evalEvery > 0 || t.evalBatches > 0)
    toml["validation"] = {{"enable", true},
                          {"freq", t.evalEvery > 0 ? t.evalEvery : t.steps},
                          {"steps", t.evalBatches > 0 ? t.evalBatches : -1}};
  toml["debug"] = {{"seed", static_cast<long long>(c.seed)}};

  std::string s = "# " + c.name + ": a MeshStudio plan as a torchtitan job (keys as documented at " +
                  vocab.version + ", commit " + vocab.commit.substr(0, 10) +
                  ", the last release read from TOML; resources/" + "frameworks/torchtitan.json).\n";
  s += "# " + std::to_string(nodes.nodes) + " node(s) of " + std::to_string(nodes.perNode) + " " +
       nodes.device + "; run with run.sh beside it.\n";
  if (notCarried.empty()) {
    s += "# Everything in the plan is carried over.\n";
  } else {
    s += "# What the plan says that torchtitan cannot, and what this file does instead:\n";
    for (const std::string& n : notCarried) s += "#   - " + n + "\n";
  }
  static const char* const kOrder[] = {"job",        "model",       "optimizer",  "lr_scheduler",
                                       "training",   "parallelism", "compile",    "activation_checkpoint",
                                       "checkpoint", "metrics",     "validation", "debug"};
  for (const char* section : kOrder) {
    if (!toml.contains(section)) continue;
    s += "\n[" + std::string(section) + "]\n";
    for (const auto& [key, value] : toml[section].items()) {
      s += tomlKey(key) + " = " + tomlValue(value) + "\n";
      ex.namesWritten.push_back(std::string(section) + "." + key);
    }
  }
  ex.files.push_back({"torchtitan/train.toml", s, false});
  std::string run = "#!/bin/bash\n# " + c.name +
                    ": torchtitan's trainer on train.toml, on every node (NODE_RANK, " +
                    "MASTER_ADDR set); TORCHTITAN names the checkout.\nset -euo pipefail\n";
  run += "cd \"${TORCHTITAN:-$PWD/torchtitan}\"\n";
  run += "torchrun --nnodes " + std::to_string(nodes.nodes) + " --nproc_per_node " +
         std::to_string(nodes.perNode) +
         " --node_rank ${NODE_RANK:-0} --rdzv_backend c10d --rdzv_endpoint "
         "\"${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}\" \\\n"
         "    -m torchtitan.train --job.config_file \"$(dirname \"$(readlink -f \"$0\")\")/train.toml\" "
         "\"$@\"\n";
  ex.files.push_back({"torchtitan/run.sh", run, true});
  return ex;
}

// --- DeepSpeed
// -------------------------------------------------------------------------------------------------

Expected<FrameworkExport> exportDeepSpeed(const RunConfig& c) {
  FrameworkExport ex;
  ex.target = Framework::DeepSpeed;
  auto& notCarried = ex.notCarried;
  if (c.model.type != ModelType::Gpt && c.model.type != ModelType::Llama)
    return Status::error(
        "/model/type: the DeepSpeed export launches Megatron-DeepSpeed's pretrain_gpt.py, which "
        "trains gpt and llama models, not this one");
  // The model and the launch: Megatron's flags (Megatron-DeepSpeed keeps them), the ZeRO part in the JSON.
  RunConfig dense = c;
  dense.parallel.zero = 0;
  dense.parallel.offload = Offload::None;
  dense.parallel.precision = Precision::Fp32;
  dense.parallel.gradPrecision = GradPrecision::Fp32;
  dense.parallel.overlapParamGather = false;
  dense.parallel.tpCommOverlap = false;
  if (c.parallel.tpCommOverlap && c.parallel.tp > 1)
    notCarried.push_back(
        "tp_comm_overlap: Megatron-DeepSpeed has no overlap of the tensor-parallel collectives with the "
        "GEMMs; "
        "they run whole");
  if (c.parallel.overlapParamGather)
    notCarried.push_back(
        "overlap_param_gather: DeepSpeed's ZeRO 1-2 all-gather the updated parameters inside the optimizer "
        "step");
  Expected<FrameworkExport> megatron = exportMegatron(dense);
  if (!megatron) return megatron.status();
  const ParallelConfig& p = c.parallel;
  const TrainingConfig& t = c.training;
  const OptimizerConfig& o = c.optimizer;
  // DeepSpeed's config sets data parallelism and ZeRO; tensor, pipeline, context and expert parallelism are
  // the model code's, passed as Megatron-DeepSpeed's flags in launch.sh.
  nlohmann::json ds = nlohmann::json::object();
  ds["train_batch_size"] = t.batchSize;
  ds["train_micro_batch_size_per_gpu"] = microbatchSize(c);
  ds["gradient_accumulation_steps"] = p.microbatches;
  ds["gradient_clipping"] = t.gradClip;
  ds["steps_per_print"] = std::max(1, t.logEvery);
  ds["bf16"] = {{"enabled", p.precision == Precision::Bf16}};
  nlohmann::json zero = {{"stage", p.zero}};
  if (p.offload == Offload::Optimizer || p.offload == Offload::Parameters)
    zero["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (p.offload == Offload::Parameters) {
    zero["offload_param"] = {{"device", "cpu"}, {"pin_memory", true}};
    if (p.zero != 3)
      notCarried.push_back("DeepSpeed offloads parameters under ZeRO-3 only: with ZeRO-" +
                           std::to_string(p.zero) + " the file offloads the optimizer state alone");
    if (p.zero != 3) zero.erase("offload_param");
  }
  if (p.offload != Offload::None && p.zero == 0)
    notCarried.push_back("DeepSpeed's offload needs ZeRO 1 or more: the plan's ZeRO 0 is written as it is");
  ds["zero_optimization"] = zero;
  if (p.gradPrecision == GradPrecision::Bf16) ds["communication_data_type"] = "bf16";
  if (o.type == OptimizerType::AdamW) {
    ds["optimizer"] = {
        {"type", "AdamW"},
        {"params",
         {{"lr", o.lr}, {"betas", {o.beta1, o.beta2}}, {"eps", o.eps}, {"weight_decay", o.weightDecay}}}};
  } else {
    ds["optimizer"] = {{"type", "SGD"},
                       {"params", {{"lr", o.lr}, {"momentum", o.momentum}, {"weight_decay", o.weightDecay}}}};
    if (o.nesterov)
      notCarried.push_back(
          "Nesterov momentum: DeepSpeed documents no such SGD parameter; the config runs plain momentum");
  }
  if (t.lrSchedule == LrSchedule::Cosine) {
    ds["scheduler"] = {{"type", "WarmupCosineLR"},
                       {"params",
                        {{"total_num_steps", t.steps},
                         {"warmup_num_steps", t.warmupSteps},
                         {"warmup_min_ratio", 0.0},
                         {"cos_min_ratio", t.minLrRatio}}}};
  } else if (t.lrSchedule == LrSchedule::Linear) {
    ds["scheduler"] = {{"type", "WarmupDecayLR"},
                       {"params",
                        {{"total_num_steps", t.steps},
                         {"warmup_num_steps", t.warmupSteps},
                         {"warmup_min_lr", 0.0},
                         {"warmup_max_lr", o.lr}}}};
    if (t.minLrRatio != 0)
      notCarried.push_back("DeepSpeed's WarmupDecayLR decays linearly to 0, not to min_lr_ratio " +
                           fwNumber(t.minLrRatio) + " of the peak");
  } else {
    ds["scheduler"] = {
        {"type", "WarmupLR"},
        {"params", {{"warmup_num_steps", t.warmupSteps}, {"warmup_min_lr", 0.0}, {"warmup_max_lr", o.lr}}}};
  }
  if (p.recompute != Recompute::None)
    ds["activation_checkpointing"] = {{"partition_activations", p.tp > 1},
                                      {"contiguous_memory_optimization", false}};
  // Every key path written, for the vocabulary check.
  std::function<void(const nlohmann::json&, const std::string&)> walk = [&](const nlohmann::json& j,
                                                                            const std::string& prefix) {
    for (const auto& [key, value] : j.items()) {
      const std::string path = prefix.empty() ? key : prefix + "." + key;
      const bool params = key == "params" && (prefix == "optimizer" || prefix == "scheduler");
      if (value.is_object() && !params) {
        walk(value, path);
      } else {
        ex.namesWritten.push_back(path);
        if (params)
          for (const auto& [pk, pv] : value.items()) {
            (void)pv;
            ex.namesWritten.push_back(path + "." + pk);
          }
      }
    }
  };
  walk(ds, "");
  ex.files.push_back({"deepspeed/ds_config.json", ds.dump(2) + "\n", false});
  // The launch: the Megatron script's flags, under the deepspeed launcher.
  const FwNodes nodes = fwNodes(c, Framework::DeepSpeed, notCarried);
  std::string s = megatron->files[0].text;
  const size_t at = s.find("torchrun \"${DISTRIBUTED_ARGS[@]}\"");
  if (at != std::string::npos)
    s = s.substr(0, at) + "deepspeed --num_nodes " + std::to_string(nodes.nodes) + " --num_gpus " +
        std::to_string(nodes.perNode) +
        " ${HOSTFILE:+--hostfile \"$HOSTFILE\"} \"$MEGATRON/pretrain_gpt.py\" \\\n"
        "    \"${MODEL_ARGS[@]}\" \\\n    \"${PARALLEL_ARGS[@]}\" \\\n    \"${TRAINING_ARGS[@]}\" \\\n"
        "    \"${DATA_ARGS[@]}\" \\\n    --deepspeed --deepspeed_config \"$(dirname \"$(readlink -f "
        "\"$0\")\")/ds_config.json\" \"$@\"\n";
  // Say it is the DeepSpeed launch, and what the JSON cannot carry.
  s = "#!/bin/bash\n# " + c.name + ": a MeshStudio plan for DeepSpeed (ds_config.json beside this script; keys as " +
      "documented at DeepSpeed " + frameworkVocabulary(Framework::DeepSpeed).version + "), launched as " +
      "Megatron-DeepSpeed's pretrain_gpt.py with the model's flags.\n" +
      (notCarried.empty() ? std::string("# Everything in the plan is carried over.\n")
                          : [&] {
                              std::string n = "# What the plan says that DeepSpeed cannot, and what these files do instead:\n";
                              for (const std::string& x : notCarried) n += "#   - " + x + "\n";
                              return n;
                            }()) +
      s.substr(s.find('\n') + 1);
  ex.files.push_back({"deepspeed/launch.sh", s, true});
  return ex;
}

}  // namespace

Expected<FrameworkExport> exportForFramework(const RunConfig& config, Framework target) {
  if (config.parallel.mode == ParallelMode::ParameterServer)
    return Status::error(std::string("/parallel/mode: ") + frameworkDisplay(target) +
                         " has no parameter servers; only collective plans can be exported to it");
  switch (target) {
    case Framework::Megatron:
      return exportMegatron(config);
    case Framework::Torchtitan:
      return exportTorchtitan(config);
    case Framework::DeepSpeed:
      return exportDeepSpeed(config);
  }
  return Status::error("unknown export target");
}

Status writeFrameworkExport(const FrameworkExport& exported, const std::string& dir) {
  for (const FrameworkFile& f : exported.files) {
    const std::filesystem::path path = std::filesystem::path(dir) / f.name;
    std::error_code ec;
    std::filesystem::create_directories(path.parent_path(), ec);
    if (ec)
      return Status::error(path.parent_path().string() + ": cannot create the folder (" + ec.message() + ")");
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << f.text;
    out.close();
    if (!out) return Status::error(path.string() + ": cannot write the file");
    if (f.executable && ::chmod(path.c_str(), 0755) != 0)
      return Status::error(path.string() + ": cannot make it executable");
  }
  return Status::ok();
}

}  // namespace ms
