// The frameworks' launch files read as plans; see frameworks.h. Each importer collects the names and values
// the file sets, maps the ones the plan has a place for, and lists the rest: unknown names apart from
// documented ones the plan does not carry.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "plan/framework_text.h"
#include "plan/frameworks.h"
#include "plan/hardware.h"
#include "plan/hf_import.h"
#include "plan/model_spec.h"

namespace ms {

namespace {

// A flag's values as the file gave them, in order (a repeated flag keeps its last value, as argparse does).
struct FwFlags {
  std::map<std::string, std::string> values;  // flag -> value ("" for a switch)
  std::vector<std::string> order;
  std::set<std::string> used;
  bool has(const std::string& f) const { return values.count(f) > 0; }
  const std::string* get(const std::string& f) {
    auto it = values.find(f);
    if (it == values.end()) return nullptr;
    used.insert(f);
    return &it->second;
  }
  bool flag(const std::string& f) {
    if (!has(f)) return false;
    used.insert(f);
    return true;
  }
};

Expected<long long> fwInt(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end) return Status::error(flag + ": '" + value + "' is not an integer");
  return v;
}

Expected<double> fwReal(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (value.empty() || *end || !std::isfinite(v))
    return Status::error(flag + ": '" + value + "' is not a number");
  return v;
}

// Reads an int flag into `out` when present; errors name the flag.
#define FW_INT(flags, name, out)                        \
  do {                                                  \
    if (const std::string* fw_v_ = (flags).get(name)) { \
      Expected<long long> fw_i_ = fwInt(name, *fw_v_);  \
      if (!fw_i_) return fw_i_.status();                \
      (out) = static_cast<decltype(out)>(*fw_i_);       \
    }                                                   \
  } while (0)
#define FW_REAL(flags, name, out)                       \
  do {                                                  \
    if (const std::string* fw_v_ = (flags).get(name)) { \
      Expected<double> fw_r_ = fwReal(name, *fw_v_);    \
      if (!fw_r_) return fw_r_.status();                \
      (out) = *fw_r_;                                   \
    }                                                   \
  } while (0)

// The default run an import starts from when no base is given: one node of the device, token shards named but
// not present (the plan needs none; a run needs the user's), AdamW.
RunConfig fwDefaultBase(const ImportOptions& options) {
  RunConfig c;
  c.name = options.name.empty() ? "imported" : options.name;
  c.data.kind = DataKind::Tokens;
  c.data.train = {"data/train_*.bin"};
  c.data.val = {"data/val_*.bin"};
  c.mesh.nodes = {NodeConfig{"n0", options.device, 1}};
  c.mesh.intraLink = "nvlink";
  c.mesh.interLink = "infiniband";
  c.training.logEvery = 1;
  return c;
}

// A Megatron layout string as chunks of layer names (stages split by '|', "(..)*n" and "x*n" unrolled, commas
// cosmetic; pipeline_parallel_layer_layout.py parse_str_to_list), chunk i on stage i mod pp.
Expected<std::vector<ChunkPlacement>> fwMegatronLayout(const std::string& text, int pp, int layers) {
  std::string s;
  for (char c : text)
    if (c != ',' && c != ' ') s += c;
  // Unroll "( ... )*n", innermost first, then "x*n".
  const std::regex group(R"(\(([^()]+)\)\*(\d+))"), single(R"((.)\*(\d+))");
  for (std::smatch m; std::regex_search(s, m, group);) {
    std::string rep;
    for (int i = 0, n = std::stoi(m[2]); i < n; ++i) rep += m[1];
    s = m.prefix().str() + rep + m.suffix().str();
  }
  for (std::smatch m; std::regex_search(s, m, single);) {
    std::string rep;
    for (int i = 0, n = std::stoi(m[2]); i < n; ++i) rep += m[1];
    s = m.prefix().str() + rep + m.suffix().str();
  }
  std::vector<ChunkPlacement> out;
  std::string stage;
  int block = 0, embeddings = 0, heads = 0;
  s += '|';
  for (char c : s) {
    if (c != '|') {
      stage += c;
      continue;
    }
    ChunkPlacement chunk;
    chunk.stage = static_cast<int>(out.size()) % std::max(1, pp);
    for (char l : stage) {
      if (l == 'E') {
        chunk.layers.push_back("embedding");
        ++embeddings;
      } else if (l == 't') {
        chunk.layers.push_back("block." + std::to_string(block++));
      } else if (l == 'L') {
        chunk.layers.push_back("head");
        ++heads;
      } else {
        return Status::error(
            "--pipeline-model-parallel-layout: '" + std::string(1, l) +
            "' is not a layer MeshStudio has (E, t and L are; m, multi-token prediction, is not)");
      }
    }
    out.push_back(std::move(chunk));
    stage.clear();
  }
  if (embeddings != 1 || heads != 1 || block != layers)
    return Status::error("--pipeline-model-parallel-layout: it places " + std::to_string(block) +
                         " blocks, " + std::to_string(embeddings) + " embedding(s) and " +
                         std::to_string(heads) + " loss layer(s); the model has " + std::to_string(layers) +
                         " blocks and one of each");
  if (static_cast<int>(out.size()) % std::max(1, pp) != 0)
    return Status::error("--pipeline-model-parallel-layout: " + std::to_string(out.size()) +
                         " stages are not a multiple of the pipeline size " + std::to_string(pp));
  for (const ChunkPlacement& c : out)
    if (c.layers.empty())
      return Status::error(
          "--pipeline-model-parallel-layout: an empty stage, which MeshStudio's placements do not "
          "have (every chunk holds at least one layer)");
  return out;
}

// The Slurm header's node and GPU counts (#SBATCH lines are comments to bash).
void fwSlurmCounts(const std::string& text, int& nodes, int& perNode) {
  static const std::regex nodesRe(R"(^#SBATCH\s+(?:--nodes[= ]|-N\s*)(\d+))"),
      gpusRe(R"(^#SBATCH\s+(?:--gpus-per-node[= ](?:[A-Za-z0-9_]+:)?|--ntasks-per-node[= ])(\d+))");
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    std::smatch m;
    if (std::regex_search(line, m, nodesRe)) nodes = std::stoi(m[1]);
    if (std::regex_search(line, m, gpusRe)) perNode = std::stoi(m[1]);
    start = end + 1;
  }
}

}  // namespace

Expected<FrameworkImport> importMegatron(const std::string& text, const ImportOptions& options) {
  Expected<ShellWords> parsed = shellWords(text);
  if (!parsed) return parsed.status();
  const std::vector<std::string>& words = parsed->words;
  const FrameworkVocabulary& vocab = frameworkVocabulary(Framework::Megatron);
  FrameworkImport out;

  // The launcher's words (before the script) and the script's flags (after it); an arguments file has no
  // script word.
  size_t script = words.size();
  for (size_t i = 0; i < words.size(); ++i)
    if (words[i].size() > 3 && words[i].ends_with(".py")) {
      script = i;
      break;
    }
  const size_t first = script == words.size() ? 0 : script + 1;
  int nodes = 0, perNode = 0;
  fwSlurmCounts(text, nodes, perNode);
  for (size_t i = 0; i + 1 < script && script < words.size(); ++i) {
    const std::string& w = words[i];
    const auto launcherValue = [&](const char* a, const char* b) -> const std::string* {
      if (w == a || w == b) return &words[i + 1];
      return nullptr;
    };
    if (const std::string* v = launcherValue("--nproc_per_node", "--nproc-per-node"))
      perNode = std::atoi(v->c_str());
    if (const std::string* v = launcherValue("--num_gpus", "--num-gpus")) perNode = std::atoi(v->c_str());
    if (const std::string* v = launcherValue("--num_nodes", "--num-nodes")) nodes = std::atoi(v->c_str());
    if (const std::string* v = launcherValue("--nnodes", "--nnodes")) {
      const size_t colon = v->find(':');  // elastic "min:max": the most
      nodes = std::atoi(colon == std::string::npos ? v->c_str() : v->c_str() + colon + 1);
    }
  }

  FwFlags flags;
  for (size_t i = first; i < words.size(); ++i) {
    std::string w = words[i];
    if (w.rfind("--", 0) != 0 || w.size() < 3) continue;        // not a flag (another command's words)
    if (options.ignoreFlags.count(w.substr(0, w.find('=')))) {  // another tool's (the caller reads them)
      if (i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0 && w.find('=') == std::string::npos &&
          options.ignoreFlags.at(w))
        ++i;
      continue;
    }
    std::string value;
    bool inlineValue = false;
    if (const size_t eq = w.find('='); eq != std::string::npos) {
      value = w.substr(eq + 1);
      w = w.substr(0, eq);
      inlineValue = true;
    }
    const bool known = vocab.knows(w);
    const bool takes =
        known ? vocab.takesValue(w) : (i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0);
    if (!inlineValue && takes && i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0) {
      // nargs='+' flags (--data-path a b) take every word up to the next flag.
      value = words[++i];
      while (i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0 && known && w == "--data-path")
        value += " " + words[++i];
    }
    if (!known) {
      out.unknown.push_back(value.empty() ? w : w + " " + value);
      continue;
    }
    if (!flags.has(w)) flags.order.push_back(w);
    flags.values[w] = value;
  }

  RunConfig c = options.base ? *options.base : fwDefaultBase(options);
  if (!options.name.empty()) c.name = options.name;
  ModelConfig& m = c.model;
  ParallelConfig& p = c.parallel;
  TrainingConfig& t = c.training;
  OptimizerConfig& o = c.optimizer;

  // --- the model ---
  const bool rms = flags.has("--normalization") && flags.values["--normalization"] == "RMSNorm";
  const bool swiglu = flags.has("--swiglu");
  const bool rope =
      flags.has("--position-embedding-type") && flags.values["--position-embedding-type"] == "rope";
  for (const char* required : {"--num-layers", "--hidden-size", "--num-attention-heads"})
    if (!flags.has(required))
      return Status::error(std::string(required) + " is missing: the model's shape needs it");
  const bool llama = rms || swiglu || rope;
  if (llama && !(rms && swiglu && rope))
    out.notCarried.push_back(std::string("a model with ") + (rms ? "RMSNorm" : "LayerNorm") + ", " +
                             (swiglu ? "SwiGLU" : "a GELU MLP") + " and " + (rope ? "rotary" : "learned") +
                             " positions is planned as a Llama-family model (RMSNorm, SwiGLU, rotary)");
  flags.get("--normalization");
  flags.flag("--swiglu");
  flags.get("--position-embedding-type");
  m = ModelConfig{};
  m.type = llama ? ModelType::Llama : ModelType::Gpt;
  FW_INT(flags, "--num-layers", m.layers);
  FW_INT(flags, "--hidden-size", m.width);
  FW_INT(flags, "--num-attention-heads", m.heads);
  FW_INT(flags, "--seq-length", t.seqLen);
  m.context = t.seqLen;
  FW_INT(flags, "--max-position-embeddings", m.context);
  FW_REAL(flags, "--init-method-std", m.initStd);
  FW_REAL(flags, "--norm-epsilon", m.layerNormEps);
  m.tieEmbeddings = !flags.flag("--untie-embeddings-and-output-weights");
  if (flags.has("--vocab-size")) {
    FW_INT(flags, "--vocab-size", m.vocab);
  } else {
    m.vocab = options.base ? options.base->model.vocab : 50257;
    out.assumed.push_back("the vocabulary (no --vocab-size; Megatron-LM takes it from the tokenizer): " +
                          std::to_string(m.vocab) + (options.base ? " from the base config" : ", GPT-2's"));
  }
  int ffn = 0;
  FW_INT(flags, "--ffn-hidden-size", ffn);
  if (m.type == ModelType::Gpt) {
    if (ffn == 0) ffn = 4 * m.width;  // Megatron's default
    if (ffn % m.width != 0)
      return Status::error("--ffn-hidden-size: " + std::to_string(ffn) +
                           " is not a multiple of --hidden-size " + std::to_string(m.width) +
                           " (a gpt model's MLP is mlp_ratio x width)");
    m.mlpRatio = ffn / m.width;
    flags.flag("--openai-gelu");
  } else {
    m.ffnHidden = ffn == llamaFfnHidden(m.width) ? 0 : ffn;  // 0: Llama's rule, which gives the same width
    FW_REAL(flags, "--rotary-base", m.ropeTheta);
    if (flags.flag("--group-query-attention")) FW_INT(flags, "--num-query-groups", m.kvHeads);
    if (!flags.flag("--disable-bias-linear"))
      out.notCarried.push_back(
          "the linear layers' biases (Megatron-LM's default without --disable-bias-linear): "
          "Llama-family blocks have none");
    if (flags.has("--num-experts")) {
      FW_INT(flags, "--num-experts", m.experts);
      FW_INT(flags, "--moe-router-topk", m.expertsPerToken);
      FW_INT(flags, "--moe-ffn-hidden-size", m.expertFfnHidden);
      int shared = 0;
      FW_INT(flags, "--moe-shared-expert-intermediate-size", shared);
      const int expertFfn =
          m.expertFfnHidden > 0 ? m.expertFfnHidden : (ffn > 0 ? ffn : int(llamaFfnHidden(m.width)));
      if (shared > 0) {
        if (shared % expertFfn != 0)
          return Status::error("--moe-shared-expert-intermediate-size: " + std::to_string(shared) +
                               " is not a multiple of the expert width " + std::to_string(expertFfn));
        m.sharedExperts = shared / expertFfn;
      }
      FW_REAL(flags, "--moe-aux-loss-coeff", m.auxLossCoef);
      FW_REAL(flags, "--moe-expert-capacity-factor", m.capacityFactor);
      if (const std::string* freq = flags.get("--moe-layer-freq")) {
        static const std::regex pattern(R"(^\(?\[0\]\*(\d+)\+\[1\]\*(\d+)\)?$)");
        std::smatch mm;
        if (std::regex_match(*freq, mm, pattern) && std::stoi(mm[1]) + std::stoi(mm[2]) == m.layers) {
          m.denseLayers = std::stoi(mm[1]);
        } else if (*freq != "1") {
          out.notCarried.push_back(
              "--moe-layer-freq " + *freq +
              ": MeshStudio's MoE models have dense blocks first, then MoE ones; planned with "
              "every block MoE");
        }
      }
    }
  }
  for (const char* dropout : {"--attention-dropout", "--hidden-dropout"})
    if (const std::string* v = flags.get(dropout); v && std::atof(v->c_str()) != 0.0)
      out.notCarried.push_back(std::string(dropout) + " " + *v +
                               ": the engine's models have no dropout (the plan's "
                               "compute and memory leave its masks out)");

  // --- the parallel plan ---
  p = ParallelConfig{};
  FW_INT(flags, "--tensor-model-parallel-size", p.tp);
  {
    // Megatron-LM pads the vocabulary to a multiple of --make-vocab-size-divisible-by (default 128) times the
    // tensor-parallel size (megatron/core/tokenizers/utils/build_tokenizer.py); the embedding has those rows.
    int divisible = 128;
    FW_INT(flags, "--make-vocab-size-divisible-by", divisible);
    const int multiple = std::max(1, divisible) * std::max(1, p.tp);
    const int padded = (m.vocab + multiple - 1) / multiple * multiple;
    if (padded != m.vocab) {
      out.assumed.push_back("the vocabulary padded as Megatron-LM pads it, to a multiple of " +
                            std::to_string(multiple) + ": " + std::to_string(m.vocab) + " -> " +
                            std::to_string(padded));
      m.vocab = padded;
    }
  }
  FW_INT(flags, "--pipeline-model-parallel-size", p.pp);
  FW_INT(flags, "--context-parallel-size", p.cp);
  FW_INT(flags, "--expert-model-parallel-size", p.ep);
  p.sequenceParallel = flags.flag("--sequence-parallel");
  if (nodes <= 0) nodes = options.nodes;
  if (perNode <= 0) perNode = options.devicesPerNode;
  const int modelRanks = p.tp * p.pp * p.cp;
  if (nodes <= 0 && perNode <= 0) {
    nodes = 1;
    perNode = modelRanks;
    out.assumed.push_back(
        "the ranks (no torchrun --nnodes/--nproc_per_node or #SBATCH counts): one node of " +
        std::to_string(perNode) + ", data-parallel size 1");
  } else if (nodes <= 0) {
    nodes = 1;
    out.assumed.push_back("one node (no --nnodes)");
  } else if (perNode <= 0) {
    perNode = 8;
    out.assumed.push_back("8 GPUs a node (no --nproc_per_node)");
  }
  const int world = nodes * perNode;
  if (world % modelRanks != 0)
    return Status::error(std::to_string(world) + " ranks (" + std::to_string(nodes) + " x " +
                         std::to_string(perNode) +
                         ") are not a multiple of tp x pp x cp = " + std::to_string(modelRanks));
  p.dp = world / modelRanks;
  int micro = 1, global = 0;
  FW_INT(flags, "--micro-batch-size", micro);
  FW_INT(flags, "--global-batch-size", global);
  if (global == 0) global = micro * p.dp;  // Megatron's default: one microbatch a step
  if (global % (micro * p.dp) != 0)
    return Status::error("--global-batch-size " + std::to_string(global) +
                         " is not a multiple of --micro-batch-size " + std::to_string(micro) +
                         " x the data-parallel size " + std::to_string(p.dp));
  t.batchSize = global;
  p.microbatches = global / (micro * p.dp);
  int virtualStages = 1;
  FW_INT(flags, "--num-virtual-stages-per-pipeline-rank", virtualStages);
  if (const std::string* perStage = flags.get("--num-layers-per-virtual-pipeline-stage")) {
    Expected<long long> n = fwInt("--num-layers-per-virtual-pipeline-stage", *perStage);
    if (!n) return n.status();
    if (*n <= 0 || m.layers % (p.pp * *n) != 0)
      return Status::error("--num-layers-per-virtual-pipeline-stage " + *perStage + " does not divide " +
                           std::to_string(m.layers) + " layers over " + std::to_string(p.pp) + " stages");
    virtualStages = static_cast<int>(m.layers / (p.pp * *n));
  }
  if (const std::string* layout = flags.get("--pipeline-model-parallel-layout")) {
    Expected<std::vector<ChunkPlacement>> placement = fwMegatronLayout(*layout, p.pp, m.layers);
    if (!placement) return placement.status();
    p.placement = *placement;
    virtualStages = static_cast<int>(placement->size()) / p.pp;
  } else {
    int firstLayers = -1, lastLayers = -1;
    FW_INT(flags, "--decoder-first-pipeline-num-layers", firstLayers);
    FW_INT(flags, "--decoder-last-pipeline-num-layers", lastLayers);
    if (p.pp > 1 && (firstLayers >= 0 || lastLayers >= 0)) {
      // Megatron splits the other blocks evenly over the middle stages.
      const int middleStages = p.pp - (firstLayers >= 0) - (lastLayers >= 0);
      const int rest = m.layers - std::max(0, firstLayers) - std::max(0, lastLayers);
      if (middleStages > 0 && rest % middleStages != 0)
        return Status::error("--decoder-first/last-pipeline-num-layers: the other " + std::to_string(rest) +
                             " blocks do not split evenly over " + std::to_string(middleStages) + " stages");
      int block = 0;
      for (int s = 0; s < p.pp; ++s) {
        int n = middleStages > 0 ? rest / middleStages : 0;
        if (s == 0 && firstLayers >= 0) n = firstLayers;
        if (s == p.pp - 1 && lastLayers >= 0) n = lastLayers;
        ChunkPlacement chunk;
        chunk.stage = s;
        if (s == 0) chunk.layers.push_back("embedding");
        for (int i = 0; i < n; ++i) chunk.layers.push_back("block." + std::to_string(block++));
        if (s == p.pp - 1) chunk.layers.push_back("head");
        p.placement.push_back(std::move(chunk));
      }
    } else if (p.pp > 1 || virtualStages > 1) {
      // Megatron's even split, the embedding with the first blocks and the head with the last, written out
      // (MeshStudio's own even split counts the embedding and the head as layers).
      const int K = p.pp * virtualStages;
      if (m.layers % K != 0)
        return Status::error(std::to_string(m.layers) + " layers do not split evenly over " +
                             std::to_string(K) +
                             " pipeline chunks (Megatron-LM needs that without a layout)");
      int block = 0;
      for (int k = 0; k < K; ++k) {
        ChunkPlacement chunk;
        chunk.stage = k % p.pp;
        if (k == 0) chunk.layers.push_back("embedding");
        for (int i = 0; i < m.layers / K; ++i) chunk.layers.push_back("block." + std::to_string(block++));
        if (k == K - 1) chunk.layers.push_back("head");
        p.placement.push_back(std::move(chunk));
      }
    }
  }
  p.virtualChunks = virtualStages;
  p.schedule = virtualStages > 1 ? Schedule::Interleaved1F1B : Schedule::OneFOneB;
  if (flags.flag("--use-distributed-optimizer")) p.zero = 1;
  if (flags.flag("--use-megatron-fsdp") || flags.flag("--use-torch-fsdp2")) {
    const std::string* strategy = flags.get("--data-parallel-sharding-strategy");
    const std::string s = strategy ? *strategy : "optim_grads_params";
    p.zero = s == "no_shard" ? 0 : s == "optim" ? 1 : s == "optim_grads" ? 2 : 3;
  }
  // ZeRO-3's per-layer gathers are prefetched beside the compute already; ZeRO 1-2's plan field says it.
  if (flags.flag("--overlap-param-gather")) p.overlapParamGather = p.zero == 1 || p.zero == 2;
  // Megatron-LM asserts sequence parallelism with it.
  if (flags.flag("--tp-comm-overlap")) p.tpCommOverlap = p.sequenceParallel;
  if (const std::string* g = flags.get("--recompute-granularity")) {
    if (*g == "selective") {
      p.recompute = Recompute::Selective;
    } else if (*g == "full") {
      p.recompute = Recompute::Full;
      const std::string* method = flags.get("--recompute-method");
      int n = 1;
      FW_INT(flags, "--recompute-num-layers", n);
      if (method && *method == "block") {
        p.recomputeLayers = n;
      } else if (n != 1) {
        out.notCarried.push_back("--recompute-method uniform --recompute-num-layers " + std::to_string(n) +
                                 " (checkpoints every " + std::to_string(n) +
                                 " blocks together): planned as every block recomputed on its own");
      }
    }
  }
  if (flags.flag("--recompute-activations")) p.recompute = Recompute::Selective;
  p.precision = flags.flag("--bf16") ? Precision::Bf16 : Precision::Fp32;
  if (flags.flag("--fp16")) {
    p.precision = Precision::Bf16;
    out.notCarried.push_back("--fp16: planned as bf16 (the same bytes; MeshStudio has no loss scaling)");
  }
  if (flags.flag("--grad-reduce-in-bf16")) p.gradPrecision = GradPrecision::Bf16;
  if (flags.flag("--optimizer-cpu-offload")) p.offload = Offload::Optimizer;

  // --- training ---
  FW_INT(flags, "--train-iters", t.steps);
  if (const std::string* samples = flags.get("--train-samples")) {
    Expected<long long> n = fwInt("--train-samples", *samples);
    if (!n) return n.status();
    t.steps = static_cast<int>(*n / t.batchSize);
  }
  unsigned long long seed = c.seed;
  FW_INT(flags, "--seed", seed);
  c.seed = seed;
  const std::string* opt = flags.get("--optimizer");
  if (!opt || *opt == "adam") {
    o.type = OptimizerType::AdamW;
    FW_REAL(flags, "--adam-beta1", o.beta1);
    FW_REAL(flags, "--adam-beta2", o.beta2);
    FW_REAL(flags, "--adam-eps", o.eps);
  } else if (*opt == "sgd") {
    o.type = OptimizerType::Sgd;
    FW_REAL(flags, "--sgd-momentum", o.momentum);
  } else {
    out.notCarried.push_back("--optimizer " + *opt + ": planned as AdamW (MeshStudio has AdamW and SGD)");
    o.type = OptimizerType::AdamW;
  }
  FW_REAL(flags, "--lr", o.lr);
  FW_REAL(flags, "--weight-decay", o.weightDecay);
  double minLr = 0;
  FW_REAL(flags, "--min-lr", minLr);
  t.minLrRatio = o.lr > 0 ? minLr / o.lr : 0.0;
  if (const std::string* style = flags.get("--lr-decay-style")) {
    if (*style == "cosine") {
      t.lrSchedule = LrSchedule::Cosine;
    } else if (*style == "linear") {
      t.lrSchedule = LrSchedule::Linear;
    } else if (*style == "constant") {
      t.lrSchedule = LrSchedule::Constant;
    } else {
      t.lrSchedule = LrSchedule::Cosine;
      out.notCarried.push_back("--lr-decay-style " + *style +
                               ": planned as cosine (the plan's step time and memory "
                               "do not depend on it)");
    }
  } else {
    t.lrSchedule = LrSchedule::Linear;  // Megatron's default
  }
  FW_INT(flags, "--lr-warmup-iters", t.warmupSteps);
  if (const std::string* fraction = flags.get("--lr-warmup-fraction")) {
    Expected<double> f = fwReal("--lr-warmup-fraction", *fraction);
    if (!f) return f.status();
    t.warmupSteps = static_cast<int>(std::lround(*f * t.steps));
  }
  if (const std::string* decay = flags.get("--lr-decay-iters"); decay && std::atoi(decay->c_str()) != t.steps)
    out.notCarried.push_back("--lr-decay-iters " + *decay + ": MeshStudio decays over all " +
                             std::to_string(t.steps) + " steps");
  FW_REAL(flags, "--clip-grad", t.gradClip);
  FW_INT(flags, "--log-interval", t.logEvery);
  FW_INT(flags, "--eval-interval", t.evalEvery);
  FW_INT(flags, "--eval-iters", t.evalBatches);
  FW_INT(flags, "--save-interval", t.checkpointEvery);

  // --- the mesh ---
  c.mesh.nodes.clear();
  for (int n = 0; n < nodes; ++n)
    c.mesh.nodes.push_back(NodeConfig{"n" + std::to_string(n), options.device, perNode});
  if (!options.base) {
    out.assumed.push_back("the device type: \"" + options.device +
                          "\" (a Megatron-LM launch does not name it)");
    out.assumed.push_back(
        "the data: token shards data/train_*.bin and data/val_*.bin, to be written (Megatron-LM's "
        "--data-path is an indexed dataset MeshStudio does not read)");
  }

  // Flags about where data, checkpoints and logs go, and the tokenizer: a run's, not the plan's.
  static const char* const kRunOnly[] = {"--data-path",
                                         "--split",
                                         "--tokenizer-type",
                                         "--tokenizer-model",
                                         "--vocab-file",
                                         "--merge-file",
                                         "--save",
                                         "--load",
                                         "--make-vocab-size-divisible-by",
                                         "--tensorboard-dir",
                                         "--wandb-project",
                                         "--wandb-exp-name",
                                         "--wandb-save-dir",
                                         "--log-throughput",
                                         "--log-timers-to-tensorboard",
                                         "--log-memory-to-tensorboard",
                                         "--log-validation-ppl-to-tensorboard",
                                         "--timing-log-level",
                                         "--distributed-backend",
                                         "--use-mcore-models",
                                         "--mock-data",
                                         "--num-workers",
                                         "--no-create-attention-mask-in-dataloader",
                                         "--moe-router-load-balancing-type",
                                         "--moe-token-dispatcher-type",
                                         "--lr-decay-iters"};
  for (const char* f : kRunOnly) flags.flag(f);
  // Every documented flag the plan did not read.
  for (const std::string& f : flags.order)
    if (!flags.used.count(f)) {
      const std::string& v = flags.values[f];
      out.notCarried.push_back(v.empty() ? f : f + " " + v);
    }
  for (const std::string& u : parsed->unset)  // the script's own arguments ($1, $@) are the caller's
    if (!std::isdigit(static_cast<unsigned char>(u[0])) && u != "@" && u != "*" && u != "#" && u != "?")
      out.assumed.push_back("the variable $" + u + " is not set in the file (it expanded to nothing)");
  out.config = std::move(c);
  return out;
}

namespace {

// Every leaf of a parsed TOML or JSON document as "a.b.c" -> value (arrays are leaves).
void fwLeaves(const nlohmann::json& j, const std::string& prefix,
              std::map<std::string, nlohmann::json>& out) {
  for (const auto& [key, value] : j.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (value.is_object()) {
      fwLeaves(value, path, out);
    } else {
      out[path] = value;
    }
  }
}

// The keys of a document as an importer reads them: each read marks the key used.
struct FwKeys {
  std::map<std::string, nlohmann::json> values;
  std::set<std::string> used;
  const nlohmann::json* get(const std::string& k) {
    auto it = values.find(k);
    if (it == values.end()) return nullptr;
    used.insert(k);
    return &it->second;
  }
};

template <class T>
Status fwKey(FwKeys& keys, const std::string& k, T& out) {
  const nlohmann::json* v = keys.get(k);
  if (!v) return Status::ok();
  try {
    out = v->get<T>();
  } catch (const std::exception&) {
    return Status::error(k + ": " + v->dump() + " is not a " +
                         (std::is_same_v<T, std::string> ? "string"
                          : std::is_same_v<T, bool>      ? "boolean"
                                                         : "number"));
  }
  return Status::ok();
}

// The leftovers: documented keys not read (not carried) and undocumented ones (unknown).
void fwLeftovers(FwKeys& keys, const FrameworkVocabulary& vocab, FrameworkImport& out,
                 const std::set<std::string>& runOnly) {
  for (const auto& [k, v] : keys.values) {
    if (keys.used.count(k) || runOnly.count(k)) continue;
    // A key inside a documented dict-valued key (optimizer.params.*, scheduler.params.*) is that key's.
    bool known = vocab.knows(k);
    for (size_t dot = k.rfind('.'); !known && dot != std::string::npos && dot > 0;
         dot = k.rfind('.', dot - 1))
      known = vocab.knows(k.substr(0, dot)) && k.substr(0, dot).find("params") != std::string::npos;
    (known ? out.notCarried : out.unknown).push_back(k + " = " + v.dump());
  }
}

}  // namespace

Expected<FrameworkImport> importTorchtitan(const std::string& text, const std::string& launcher,
                                           const ImportOptions& options) {
  Expected<nlohmann::json> doc = parseToml(text);
  if (!doc) return doc.status();
  FwKeys keys;
  fwLeaves(*doc, "", keys.values);
  FrameworkImport out;
  RunConfig c = options.base ? *options.base : fwDefaultBase(options);
  if (!options.name.empty()) c.name = options.name;
  ParallelConfig& p = c.parallel;
  TrainingConfig& t = c.training;
  OptimizerConfig& o = c.optimizer;

  std::string modelName = "llama3", flavor = "debugmodel";
  MS_TRY(fwKey(keys, "model.name", modelName));
  MS_TRY(fwKey(keys, "model.flavor", flavor));
  const std::optional<ModelConfig> model = torchtitanFlavor(modelName, flavor);
  if (!model)
    return Status::error(
        "model: \"" + modelName + "\" flavor \"" + flavor +
        "\" is not one MeshStudio knows (resources/frameworks/torchtitan.json lists the llama3 "
        "flavors of torchtitan " +
        frameworkVocabulary(Framework::Torchtitan).version + ")");
  c.model = *model;
  out.assumed.push_back("the vocabulary: the flavor's " + std::to_string(model->vocab) +
                        " (the tokenizer in model.hf_assets_path sets it at run time)");
  keys.get("model.hf_assets_path");
  keys.get("model.tokenizer_path");

  // The ranks: the launcher's counts, else the degrees.
  int r = 1, s = -1, tp = 1, pp = 1, cp = 1, ep = 1;
  MS_TRY(fwKey(keys, "parallelism.data_parallel_replicate_degree", r));
  MS_TRY(fwKey(keys, "parallelism.data_parallel_shard_degree", s));
  MS_TRY(fwKey(keys, "parallelism.tensor_parallel_degree", tp));
  MS_TRY(fwKey(keys, "parallelism.pipeline_parallel_degree", pp));
  MS_TRY(fwKey(keys, "parallelism.context_parallel_degree", cp));
  MS_TRY(fwKey(keys, "parallelism.expert_parallel_degree", ep));
  for (int* degree : {&r, &tp, &pp, &cp, &ep})
    if (*degree < 1)
      return Status::error("parallelism: every degree but data_parallel_shard_degree must be >= 1");
  int nodes = options.nodes, perNode = options.devicesPerNode;
  if (!launcher.empty()) {
    Expected<ShellWords> w = shellWords(launcher);
    if (!w) return Status::error("the launcher: " + w.message());
    for (size_t i = 0; i + 1 < w->words.size(); ++i) {
      const std::string& x = w->words[i];
      if (x == "--nnodes") nodes = std::atoi(w->words[i + 1].c_str());
      if (x == "--nproc_per_node" || x == "--nproc-per-node") perNode = std::atoi(w->words[i + 1].c_str());
      if (x.rfind("--nproc_per_node=", 0) == 0) perNode = std::atoi(x.c_str() + 17);
      if (x.rfind("--nnodes=", 0) == 0) nodes = std::atoi(x.c_str() + 9);
    }
    static const std::regex ngpu(R"((?:^|\s)NGPU=(\d+))");
    std::smatch m;
    if (perNode <= 0 && std::regex_search(launcher, m, ngpu)) perNode = std::stoi(m[1]);
  }
  const int fixed = r * tp * pp * cp;
  int world = 0;
  if (nodes > 0 || perNode > 0) {
    if (nodes <= 0) nodes = 1;
    if (perNode <= 0) perNode = 8;
    world = nodes * perNode;
  } else if (s > 0) {
    world = fixed * s;
    perNode = std::min(world, 8);
    nodes = (world + perNode - 1) / perNode;
    out.assumed.push_back("the ranks: the degrees' product, " + std::to_string(world) +
                          " (no launcher given)");
  } else {
    return Status::error(
        "parallelism.data_parallel_shard_degree -1 fills the ranks the launcher starts: give the "
        "launcher script (or --nodes and --gpus-per-node)");
  }
  if (s < 0) {
    if (world % fixed != 0)
      return Status::error(
          std::to_string(world) +
          " ranks are not a multiple of replicate x tp x pp x cp = " + std::to_string(fixed));
    s = world / fixed;
  }
  if (fixed * s != world)
    return Status::error("the degrees' product (" + std::to_string(fixed * s) + ") is not the " +
                         std::to_string(world) + " ranks the launcher starts");
  p = ParallelConfig{};
  p.dp = r * s;
  p.tp = tp;
  p.pp = pp;
  p.cp = cp;
  p.ep = ep;
  p.sequenceParallel = tp > 1;
  bool asyncTp = false;
  MS_TRY(fwKey(keys, "parallelism.enable_async_tensor_parallel", asyncTp));
  p.tpCommOverlap = asyncTp && tp > 1;
  bool compiled = false;  // what async TP needs torchtitan to run with; read only then
  if (asyncTp) MS_TRY(fwKey(keys, "compile.enable", compiled));
  if (p.tpCommOverlap && !compiled)
    out.assumed.push_back(
        "parallelism.enable_async_tensor_parallel without compile.enable, which torchtitan refuses to run: "
        "planned with the overlap, as the file asks");
  std::string reshard = "default";
  MS_TRY(fwKey(keys, "parallelism.fsdp_reshard_after_forward", reshard));
  p.zero = s > 1 ? (reshard == "never" ? 2 : 3) : 0;
  if (r > 1 && s > 1)
    out.notCarried.push_back("HSDP (replicate " + std::to_string(r) + " x shard " + std::to_string(s) +
                             "): planned as ZeRO over all " + std::to_string(p.dp) + " data-parallel ranks");

  int local = 8, global = -1, seq = 2048, mbs = 1;
  MS_TRY(fwKey(keys, "training.local_batch_size", local));
  MS_TRY(fwKey(keys, "training.global_batch_size", global));
  MS_TRY(fwKey(keys, "training.seq_len", seq));
  MS_TRY(fwKey(keys, "parallelism.pipeline_parallel_microbatch_size", mbs));
  if (global < 0) global = local * p.dp;
  if (global % (local * p.dp) != 0)
    return Status::error("training.global_batch_size " + std::to_string(global) + " is not a multiple of " +
                         "local_batch_size x the data-parallel size (" + std::to_string(local * p.dp) + ")");
  const int accumulation = global / (local * p.dp);
  if (pp > 1 && local % mbs != 0)
    return Status::error("training.local_batch_size " + std::to_string(local) +
                         " is not a multiple of parallelism.pipeline_parallel_microbatch_size " +
                         std::to_string(mbs));
  p.microbatches = accumulation * (pp > 1 ? local / mbs : 1);
  t.batchSize = global;
  t.seqLen = seq;
  c.model.context = std::max(seq, 1);
  MS_TRY(fwKey(keys, "training.steps", t.steps));
  MS_TRY(fwKey(keys, "training.max_norm", t.gradClip));
  std::string param = "bfloat16";
  MS_TRY(fwKey(keys, "training.mixed_precision_param", param));
  p.precision = param == "bfloat16" ? Precision::Bf16 : Precision::Fp32;
  keys.get("training.mixed_precision_reduce");
  bool offload = false;
  MS_TRY(fwKey(keys, "training.enable_cpu_offload", offload));
  if (offload) p.offload = Offload::Parameters;

  if (pp > 1) {
    std::string schedule = "1F1B";
    MS_TRY(fwKey(keys, "parallelism.pipeline_parallel_schedule", schedule));
    if (schedule == "GPipe") {
      p.schedule = Schedule::GPipe;
    } else if (schedule == "Interleaved1F1B" || schedule == "LoopedBFS") {
      p.schedule = Schedule::Interleaved1F1B;
    } else if (schedule == "InterleavedZeroBubble" || schedule == "ZBVZeroBubble") {
      p.schedule = Schedule::ZbH1;
      out.notCarried.push_back("parallelism.pipeline_parallel_schedule " + schedule +
                               ": planned as ZB-H1 (MeshStudio's zero-bubble schedule)");
    } else {
      p.schedule = Schedule::OneFOneB;
    }
    if (const nlohmann::json* parts = keys.get("parallelism.module_fqns_per_model_part")) {
      if (!parts->is_array() || parts->size() % pp != 0)
        return Status::error(
            "parallelism.module_fqns_per_model_part: a list of model parts, a multiple of "
            "pipeline_parallel_degree long");
      for (size_t k = 0; k < parts->size(); ++k) {
        ChunkPlacement chunk;
        chunk.stage = static_cast<int>(k) % pp;
        for (const auto& name : (*parts)[k]) {
          const std::string n = name.is_string() ? name.get<std::string>() : "";
          if (n == "tok_embeddings") {
            chunk.layers.push_back("embedding");
          } else if (n.rfind("layers.", 0) == 0) {
            chunk.layers.push_back("block." + n.substr(7));
          } else if (n == "output") {
            chunk.layers.push_back("head");
          } else if (n != "norm") {
            return Status::error(
                "parallelism.module_fqns_per_model_part: \"" + n +
                "\" is not a module of torchtitan's llama3 (tok_embeddings, layers.N, norm, output)");
          }
        }
        p.placement.push_back(std::move(chunk));
      }
      p.virtualChunks = static_cast<int>(parts->size()) / pp;
    } else {
      int perStage = 0;
      MS_TRY(fwKey(keys, "parallelism.pipeline_parallel_layers_per_stage", perStage));
      const int chunks = perStage > 0 ? (c.model.layers + 2 + perStage - 1) / perStage : pp;
      p.virtualChunks = std::max(1, chunks / pp);
      out.assumed.push_back(
          "the layers of each pipeline stage: an even split with the embedding and the head "
          "counted as layers, as torchtitan splits without module_fqns_per_model_part");
    }
    if (p.schedule != Schedule::Interleaved1F1B && p.virtualChunks > 1)
      p.schedule = Schedule::Interleaved1F1B;
  }
  std::string mode = "selective", option = "2";
  MS_TRY(fwKey(keys, "activation_checkpoint.mode", mode));
  MS_TRY(fwKey(keys, "activation_checkpoint.selective_ac_option", option));
  if (mode == "full") {
    p.recompute = Recompute::Full;
  } else if (mode == "selective") {
    if (option == "op") {
      p.recompute = Recompute::Selective;
    } else {
      p.recompute = Recompute::Full;
      out.notCarried.push_back("activation_checkpoint selective_ac_option " + option + " (every " + option +
                               "th block recomputed): planned as every block recomputed");
    }
  } else if (mode == "memory_budget") {
    p.recompute = Recompute::Selective;
    out.notCarried.push_back("activation_checkpoint mode memory_budget: planned as selective recomputation");
  }

  std::string optName = "AdamW";
  MS_TRY(fwKey(keys, "optimizer.name", optName));
  o.type = OptimizerType::AdamW;
  if (optName != "AdamW" && optName != "Adam")
    out.notCarried.push_back("optimizer.name " + optName + ": planned as AdamW");
  MS_TRY(fwKey(keys, "optimizer.lr", o.lr));
  MS_TRY(fwKey(keys, "optimizer.eps", o.eps));
  MS_TRY(fwKey(keys, "optimizer.weight_decay", o.weightDecay));
  MS_TRY(fwKey(keys, "optimizer.beta1", o.beta1));
  MS_TRY(fwKey(keys, "optimizer.beta2", o.beta2));
  MS_TRY(fwKey(keys, "lr_scheduler.warmup_steps", t.warmupSteps));
  std::string decay = "linear";
  MS_TRY(fwKey(keys, "lr_scheduler.decay_type", decay));
  t.lrSchedule = decay == "cosine" ? LrSchedule::Cosine : LrSchedule::Linear;
  if (decay == "sqrt") out.notCarried.push_back("lr_scheduler.decay_type sqrt: planned as linear");
  double ratio = -1;
  MS_TRY(fwKey(keys, "lr_scheduler.decay_ratio", ratio));
  if (ratio == 0.0) t.lrSchedule = LrSchedule::Constant;
  if (ratio > 0 && ratio < 1)
    out.notCarried.push_back("lr_scheduler.decay_ratio " + shortestNumber(ratio) +
                             " (a stable phase before the decay): "
                             "MeshStudio decays from the end of the warm-up");
  t.minLrRatio = 0.0;
  MS_TRY(fwKey(keys, "lr_scheduler.min_lr_factor", t.minLrRatio));
  bool checkpoints = false;
  MS_TRY(fwKey(keys, "checkpoint.enable", checkpoints));
  int interval = 0;
  MS_TRY(fwKey(keys, "checkpoint.interval", interval));
  t.checkpointEvery = checkpoints && interval < t.steps ? interval : 0;
  if (checkpoints && interval == t.steps) t.checkpointEvery = t.steps;
  MS_TRY(fwKey(keys, "metrics.log_freq", t.logEvery));
  bool validation = false;
  MS_TRY(fwKey(keys, "validation.enable", validation));
  if (validation) {
    int freq = 10, steps = -1;
    MS_TRY(fwKey(keys, "validation.freq", freq));
    MS_TRY(fwKey(keys, "validation.steps", steps));
    t.evalEvery = freq;
    t.evalBatches = steps > 0 ? steps : 0;
  }
  long long seed = static_cast<long long>(c.seed);
  MS_TRY(fwKey(keys, "debug.seed", seed));
  c.seed = static_cast<unsigned long long>(seed);

  c.mesh.nodes.clear();
  for (int n = 0; n < nodes; ++n)
    c.mesh.nodes.push_back(NodeConfig{"n" + std::to_string(n), options.device, perNode});
  if (!options.base)
    out.assumed.push_back("the device type: \"" + options.device + "\" (a torchtitan job does not name it)");
  static const std::set<std::string> kRunOnly = {"job.dump_folder",         "job.description",
                                                 "checkpoint.folder",       "training.dataset",
                                                 "training.dataset_path",   "validation.dataset",
                                                 "validation.dataset_path", "metrics.enable_tensorboard",
                                                 "metrics.save_tb_folder",  "checkpoint.last_save_model_only",
                                                 "checkpoint.export_dtype", "checkpoint.async_mode"};
  fwLeftovers(keys, frameworkVocabulary(Framework::Torchtitan), out, kRunOnly);
  out.config = std::move(c);
  return out;
}

Expected<FrameworkImport> importDeepSpeed(const std::string& text, const std::string& modelArgs,
                                          const std::string& hfConfig, const ImportOptions& options) {
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object())
    return Status::error("not a JSON object (a DeepSpeed config is one)");
  FrameworkImport out;
  // The model and the launch: Megatron-DeepSpeed's flags, or a Hugging Face config.
  if (!modelArgs.empty()) {
    ImportOptions megatron = options;
    megatron.ignoreFlags = {{"--deepspeed", false},
                            {"--deepspeed_config", true},
                            {"--deepspeed-config", true},
                            {"--zero-stage", true},
                            {"--deepspeed-activation-checkpointing", false}};
    Expected<FrameworkImport> m = importMegatron(modelArgs, megatron);
    if (!m) return Status::error("the model's arguments: " + m.message());
    out = std::move(*m);
  } else if (!hfConfig.empty()) {
    const nlohmann::json hf = nlohmann::json::parse(hfConfig, nullptr, false);
    if (hf.is_discarded()) return Status::error("the model's config.json is not valid JSON");
    Expected<HfImport> m = importHfConfig(hf, "config.json");
    if (!m) return m.status();
    out.config = options.base ? *options.base : fwDefaultBase(options);
    out.config.model = m->model;
    for (const std::string& w : m->warnings) out.notCarried.push_back("config.json: " + w);
    const int perNode = options.devicesPerNode > 0 ? options.devicesPerNode : 8;
    const int nodes = options.nodes > 0 ? options.nodes : 1;
    out.config.mesh.nodes.clear();
    for (int n = 0; n < nodes; ++n)
      out.config.mesh.nodes.push_back(NodeConfig{"n" + std::to_string(n), options.device, perNode});
    out.config.parallel = ParallelConfig{};
    out.config.parallel.dp = nodes * perNode;
    if (options.nodes <= 0 || options.devicesPerNode <= 0)
      out.assumed.push_back("the ranks: " + std::to_string(nodes) + " node(s) of " + std::to_string(perNode) +
                            " (give --nodes and --gpus-per-node)");
  } else {
    return Status::error(
        "a DeepSpeed config does not say which model it trains: give the model's arguments "
        "(a Megatron-DeepSpeed launch script) or its Hugging Face config.json");
  }
  RunConfig& c = out.config;
  ParallelConfig& p = c.parallel;
  TrainingConfig& t = c.training;
  OptimizerConfig& o = c.optimizer;
  FwKeys keys;
  fwLeaves(doc, "", keys.values);
  // optimizer.params and scheduler.params are leaves of documented dict keys.
  int global = 0, micro = 0, accumulation = 0;
  MS_TRY(fwKey(keys, "train_batch_size", global));
  MS_TRY(fwKey(keys, "train_micro_batch_size_per_gpu", micro));
  MS_TRY(fwKey(keys, "gradient_accumulation_steps", accumulation));
  // DeepSpeed's rule: train_batch_size = micro x accumulation x data-parallel size; any two fix the third.
  if (global == 0 && micro > 0) global = micro * std::max(1, accumulation) * p.dp;
  if (micro == 0 && global > 0) micro = global / (std::max(1, accumulation) * p.dp);
  if (accumulation == 0 && micro > 0) accumulation = global / (micro * p.dp);
  if (global <= 0 || micro <= 0 || accumulation <= 0 || micro * accumulation * p.dp != global)
    return Status::error("train_batch_size " + std::to_string(global) +
                         " is not train_micro_batch_size_per_gpu " + std::to_string(micro) +
                         " x gradient_accumulation_steps " + std::to_string(accumulation) +
                         " x the data-parallel size " + std::to_string(p.dp));
  t.batchSize = global;
  if (p.pp > 1) {
    // Megatron-DeepSpeed's pipeline: the accumulation steps are the pipeline's microbatches.
    p.microbatches = accumulation;
  } else {
    p.microbatches = accumulation;
  }
  MS_TRY(fwKey(keys, "gradient_clipping", t.gradClip));
  MS_TRY(fwKey(keys, "steps_per_print", t.logEvery));
  bool bf16 = false, fp16 = false;
  MS_TRY(fwKey(keys, "bf16.enabled", bf16));
  MS_TRY(fwKey(keys, "fp16.enabled", fp16));
  p.precision = bf16 || fp16 ? Precision::Bf16 : Precision::Fp32;
  if (fp16)
    out.notCarried.push_back(
        "fp16.enabled: planned as bf16 (the same bytes; MeshStudio has no loss scaling)");
  std::string comm;
  MS_TRY(fwKey(keys, "communication_data_type", comm));
  p.gradPrecision = comm == "bf16" || comm == "bfp16" ? GradPrecision::Bf16 : GradPrecision::Fp32;
  p.zero = 0;
  MS_TRY(fwKey(keys, "zero_optimization.stage", p.zero));
  if (p.zero < 0 || p.zero > 3)
    return Status::error("zero_optimization.stage: " + std::to_string(p.zero) + " is not 0-3");
  std::string optimDevice = "none", paramDevice = "none";
  MS_TRY(fwKey(keys, "zero_optimization.offload_optimizer.device", optimDevice));
  MS_TRY(fwKey(keys, "zero_optimization.offload_param.device", paramDevice));
  keys.get("zero_optimization.offload_optimizer.pin_memory");
  keys.get("zero_optimization.offload_param.pin_memory");
  p.offload = paramDevice == "cpu"   ? Offload::Parameters
              : optimDevice == "cpu" ? Offload::Optimizer
                                     : Offload::None;
  if (optimDevice == "nvme" || paramDevice == "nvme")
    out.notCarried.push_back("offload to NVMe: planned as offload to host memory");
  if (keys.get("activation_checkpointing.partition_activations") && p.recompute == Recompute::None)
    p.recompute = Recompute::Full;
  keys.get("activation_checkpointing.contiguous_memory_optimization");
  std::string optType = "AdamW";
  MS_TRY(fwKey(keys, "optimizer.type", optType));
  if (optType == "SGD" || optType == "sgd") {
    o.type = OptimizerType::Sgd;
    MS_TRY(fwKey(keys, "optimizer.params.momentum", o.momentum));
    MS_TRY(fwKey(keys, "optimizer.params.nesterov", o.nesterov));
  } else {
    o.type = OptimizerType::AdamW;
    if (optType != "AdamW" && optType != "Adam" && optType != "adamw" && optType != "adam")
      out.notCarried.push_back("optimizer.type " + optType + ": planned as AdamW");
    if (const nlohmann::json* betas = keys.get("optimizer.params.betas");
        betas && betas->is_array() && betas->size() == 2) {
      o.beta1 = (*betas)[0].get<double>();
      o.beta2 = (*betas)[1].get<double>();
    }
    MS_TRY(fwKey(keys, "optimizer.params.eps", o.eps));
  }
  MS_TRY(fwKey(keys, "optimizer.params.lr", o.lr));
  MS_TRY(fwKey(keys, "optimizer.params.weight_decay", o.weightDecay));
  std::string sched;
  MS_TRY(fwKey(keys, "scheduler.type", sched));
  MS_TRY(fwKey(keys, "scheduler.params.warmup_num_steps", t.warmupSteps));
  MS_TRY(fwKey(keys, "scheduler.params.total_num_steps", t.steps));
  keys.get("scheduler.params.warmup_min_ratio");
  keys.get("scheduler.params.warmup_min_lr");
  if (const nlohmann::json* maxLr = keys.get("scheduler.params.warmup_max_lr"); maxLr && maxLr->is_number())
    o.lr = maxLr->get<double>();
  if (sched == "WarmupCosineLR") {
    t.lrSchedule = LrSchedule::Cosine;
    MS_TRY(fwKey(keys, "scheduler.params.cos_min_ratio", t.minLrRatio));
  } else if (sched == "WarmupDecayLR") {
    t.lrSchedule = LrSchedule::Linear;
    t.minLrRatio = 0.0;
  } else if (sched == "WarmupLR" || sched.empty()) {
    t.lrSchedule = LrSchedule::Constant;
  } else {
    out.notCarried.push_back("scheduler.type " + sched + ": planned as cosine");
    t.lrSchedule = LrSchedule::Cosine;
  }
  // The Megatron flags' values for what the JSON now says are the JSON's; drop their notes.
  static const std::set<std::string> kRunOnly = {"wall_clock_breakdown", "zero_allow_untested_optimizer"};
  fwLeftovers(keys, frameworkVocabulary(Framework::DeepSpeed), out, kRunOnly);
  return out;
}

}  // namespace ms
