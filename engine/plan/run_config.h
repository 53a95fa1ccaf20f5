// The run config: one JSON document describes a run completely (model, data, mesh, parallel layout,
// optimizer, training). It is the studio's project file, the engine's input and the exported artefact.
//
// What always holds: a RunConfig returned by loadRunConfig()/parseRunConfig() has passed every check in
// validateRunConfig(); every field has a documented default (the field table in config_schema.cpp is the one
// place defaults, ranges and descriptions live; the JSON Schema and docs/config.md are generated from it);
// toJson() followed by parseRunConfig() gives back an equal RunConfig.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace ms {

inline constexpr int kRunConfigVersion = 1;

enum class ModelType { Gpt, Vit, Mlp, Cnn, Llama };
// Whether the model's blocks are transformer blocks (attention + MLP): gpt, llama and vit. Tensor and
// sequence parallelism, selective recompute and the attention memory terms apply to these only.
constexpr bool isTransformer(ModelType t) {
  return t == ModelType::Gpt || t == ModelType::Vit || t == ModelType::Llama;
}
// Whether the model is a decoder-only language model (token data, a vocabulary, an LM head, causal
// attention): gpt and llama.
constexpr bool isLanguageModel(ModelType t) {
  return t == ModelType::Gpt || t == ModelType::Llama;
}
enum class BatchNormMode { Local, Sync };
// How replicas combine gradients: collectives inside one job (all-reduce, reduce-scatter), or parameter
// servers that workers pull from and push to (engine/runtime/ps/).
enum class ParallelMode { Collective, ParameterServer };
// When a parameter server applies pushes: after every live worker's push of a version (sync), each push as it
// arrives (async), or as it arrives while no worker is more than `staleness` steps ahead of the slowest
// (bounded: stale-synchronous parallel, Ho et al. 2013).
enum class Consistency { Sync, Async, Bounded };
enum class Activation { Gelu, Relu, Tanh };
enum class Pooling { Cls, Mean };
enum class DataKind { Text, Tokens, FashionMnist };
enum class Schedule { GPipe, OneFOneB, Interleaved1F1B, ZbH1 };
enum class Recompute { None, Selective, Full };
enum class Precision { Fp32, Bf16 };
// The precision gradients are kept and reduced in under bf16 mixed precision (fp32 runs keep fp32).
enum class GradPrecision { Fp32, Bf16 };
// Where model states live between uses (plan/model_state.h): all on the device; the optimizer state (fp32
// master weights and moments) and its step on the host (ZeRO-Offload, Ren et al. 2021); also the parameter
// and gradient shards on the host between uses (FSDP's CPU offload, ZeRO-Infinity's offload_param).
enum class Offload { None, Optimizer, Parameters };
enum class OptimizerType { AdamW, Sgd };
enum class LrSchedule { Constant, Cosine, Linear };
enum class DeviceChoice { Auto, Cpu, Cuda };

struct ModelConfig {
  ModelType type = ModelType::Gpt;
  // gpt and vit
  int layers = 4;              // "layers": transformer blocks
  int width = 256;             // "width": C, channels of the residual stream
  int heads = 4;               // "heads": H, must divide width
  int mlpRatio = 4;            // "mlp_ratio": MLP hidden = mlp_ratio * width
  double layerNormEps = 1e-5;  // "layer_norm_eps"
  // gpt and llama
  int vocab = 256;            // "vocab": V
  int context = 128;          // "context": maximum sequence length (rows of gpt's position table)
  bool tieEmbeddings = true;  // "tie_embeddings": LM head shares the token embedding (GPT-2 default)
  // llama (Touvron et al. 2023, "Llama 2", section 2.2; Llama 3 (Grattafiori et al. 2024), table 3)
  int kvHeads = 0;             // "kv_heads": key/value heads (grouped-query attention); 0 = heads
  int ffnHidden = 0;           // "ffn_hidden": SwiGLU hidden width; 0 = Llama's rule (llamaFfnHidden)
  double ropeTheta = 10000.0;  // "rope_theta": base of the rotary embedding angles
  // llama mixture of experts (Shazeer et al. 2017; top-k routing as Mixtral, Jiang et al. 2024; shared
  // experts as DeepSeekMoE, Dai et al. 2024): the MLP of every block from the dense_layers-th on is `experts`
  // SwiGLU experts of expert_ffn_hidden, each token sent to experts_per_token of them by a softmax router
  // (the chosen probabilities renormalised to sum to 1), plus shared_experts always-on experts.
  int experts = 0;              // "experts": routed experts a block; 0 = dense
  int expertsPerToken = 2;      // "experts_per_token": k of the top-k routing
  int expertFfnHidden = 0;      // "expert_ffn_hidden": an expert's SwiGLU width; 0 = the dense MLP's
  int sharedExperts = 0;        // "shared_experts": experts every token passes through
  double capacityFactor = 0.0;  // "capacity_factor": expert capacity / (tokens * k / experts); 0 = dropless
  double auxLossCoef = 0.01;    // "aux_loss_coef": weight of the load-balancing loss (Fedus et al. 2022)
  int denseLayers = 0;          // "dense_layers": the first blocks keep a dense MLP (DeepSeek-V3 keeps 3)
  // vit and cnn
  int imageSize = 28;  // "image_size": S, square single-channel images
  // vit
  int patch = 7;                // "patch": P, must divide image_size
  Pooling pool = Pooling::Cls;  // "pool": "cls" (class token) | "mean"
  // vit, mlp and cnn
  int classes = 10;  // "classes"
  // cnn (a ResNet of basic blocks, He et al. 2016): a stem convolution, then one stage per entry of
  // channels, each of `blocks` residual blocks; every stage after the first halves the image side.
  std::vector<int> channels = {16, 32, 64};  // "channels": output channels of the stem and each stage
  int blocks = 1;                            // "blocks": residual blocks per stage
  double bnEps = 1e-5;                       // "bn_eps": epsilon of every BatchNorm
  double bnMomentum = 0.1;                   // "bn_momentum": running statistics' update (PyTorch's)
  // mlp
  std::vector<int> hidden = {256};           // "hidden": widths of the hidden layers
  Activation activation = Activation::Relu;  // "activation": "relu" | "gelu" | "tanh"
  // all
  double initStd = 0.02;  // "init_std": std of the normal init of weight matrices
  bool operator==(const ModelConfig&) const = default;
  // Key/value heads: kv_heads, or heads where it is 0 (or the model is not a llama: gpt and vit attention
  // is multi-head).
  int kvHeadCount() const { return type == ModelType::Llama && kvHeads > 0 ? kvHeads : heads; }
  // The MLP's hidden width: mlp_ratio * width for gpt and vit; for llama ffn_hidden, or where it is 0
  // Meta's rule (llamaFfnHidden).
  int64_t mlpHidden() const;
  // Whether block i's MLP is a mixture of experts.
  bool moeBlock(int i) const { return type == ModelType::Llama && experts > 0 && i >= denseLayers; }
  int64_t expertHidden() const { return expertFfnHidden > 0 ? expertFfnHidden : mlpHidden(); }
  // Whether the LM head reads the token embedding (a language model with tie_embeddings).
  bool tiedHead() const { return isLanguageModel(type) && tieEmbeddings; }
};
// Llama's default SwiGLU width for a model of `width` (Meta's llama reference, model.py FeedForward: 2/3 of
// 4 width, rounded up to a multiple of 256, so the three matrices hold as many parameters as a 4x GELU MLP's
// two): 11008 for width 4096 (Llama 2 7B).
int64_t llamaFfnHidden(int64_t width);

struct DataConfig {
  DataKind kind = DataKind::Text;  // "kind": "text" | "tokens" | "fashion_mnist"
  // text: files read as bytes (vocab 256), concatenated in the given order; globs allowed.
  std::vector<std::string> files;  // "files"
  double valFraction = 0.1;        // "val_fraction": the last fraction of the bytes is the validation split
  // tokens: llm.c .bin shards (globs allowed)
  std::vector<std::string> train;  // "train"
  std::vector<std::string> val;    // "val"
  // fashion_mnist: the directory holding the four IDX .gz files
  std::string dir = "/usr/share/datasets/fashion-mnist";  // "dir"
  bool operator==(const DataConfig&) const = default;
};

struct NodeConfig {
  std::string name;            // "name"
  std::string device = "cpu";  // "device": a device type from the hardware catalog or mesh.device_types
  int count = 1;               // "count": devices of that type in the node
  bool operator==(const NodeConfig&) const = default;
};

// A device type the hardware catalog lacks, described in the config. Units are the datasheets': 1 TFLOP/s =
// 1e12 FLOP/s, 1 GB = 1e9 bytes.
struct DeviceTypeConfig {
  std::string name;                   // "name": used by nodes' "device"; must not shadow a catalog name
  std::string label;                  // "label": for people; empty = the name
  double peakTflopsFp32 = 0;          // "peak_tflops_fp32": dense fp32 peak
  double peakTflopsBf16 = 0;          // "peak_tflops_bf16": dense bf16 peak
  double memoryGb = 0;                // "memory_gb": capacity
  double memoryBandwidthGbs = 0;      // "memory_bandwidth_gbs": GB/s
  double achievableFraction = 0.5;    // "achievable_fraction": fraction of peak a training step reaches
  double hostLinkGbs = 0;             // "host_link_gbs": device<->host GB/s each way (0: not known)
  double hostMemoryGb = 0;            // "host_memory_gb": the device's share of its node's host memory
  double hostMemoryBandwidthGbs = 0;  // "host_memory_bandwidth_gbs": its share of the host's DRAM GB/s
  bool operator==(const DeviceTypeConfig&) const = default;
};

// A link type the catalog lacks. Bandwidth per direction and per device, like the catalog's.
struct LinkTypeConfig {
  std::string name;         // "name": used by "intra_link"/"inter_link"; must not shadow a catalog name
  double bandwidthGbs = 0;  // "bandwidth_gbs": GB/s
  double latencyUs = 0;     // "latency_us": microseconds per message
  bool perDevice = false;   // "per_device": every device has its own port (LinkSpec::perDevice)
  bool operator==(const LinkTypeConfig&) const = default;
};

struct DeviceProfile;  // plan/device_profile.h
// A machine measured by `meshstudio-engine calibrate` (docs/calibration.md). Its device type is called `name`
// and each link it measured `name.<link>` ("here.shm", "here.tcp"), for nodes, intra_link and inter_link to
// name like a catalog type.
struct ProfileConfig {
  std::string name;  // "name"
  std::string file;  // "file": the profile JSON; a relative path resolves against the config's folder
  // Not part of the JSON: the file's contents, read by loadProfiles() (plan/device_profile.h) when the config
  // is loaded; two entries are equal when they name the same file.
  std::shared_ptr<const DeviceProfile> data;
  bool operator==(const ProfileConfig& o) const { return name == o.name && file == o.file; }
};

struct MeshConfig {
  std::vector<NodeConfig> nodes = {NodeConfig{"node0", "cpu", 1}};  // "nodes"
  std::string intraLink = "shm";              // "intra_link": link type between devices of one node
  std::string interLink = "ethernet";         // "inter_link": link type between nodes
  std::vector<DeviceTypeConfig> deviceTypes;  // "device_types": user-defined device types
  std::vector<LinkTypeConfig> linkTypes;      // "link_types": user-defined link types
  std::vector<ProfileConfig> profiles;        // "profiles": measured machines
  bool operator==(const MeshConfig&) const = default;
};

// One contiguous run of layers placed on a pipeline stage. The placement lists chunks in model order; a
// stage that appears several times holds several chunks (interleaved schedules), numbered in order.
struct ChunkPlacement {
  int stage = 0;                    // "stage"
  std::vector<std::string> layers;  // "layers": layer names, in model order
  bool operator==(const ChunkPlacement&) const = default;
};

// A worker slowed down on purpose (parameter-server mode): its steps take `slowdown` times as long.
struct Straggler {
  int worker = 0;       // "worker"
  double slowdown = 2;  // "slowdown": >= 1
  bool operator==(const Straggler&) const = default;
};

struct ParallelConfig {
  int dp = 1;  // "dp": data-parallel replicas
  int tp = 1;  // "tp": tensor-parallel ways, must divide heads
  int pp = 1;  // "pp": pipeline stages
  int ep = 1;  // "ep": expert-parallel ways (MoE): the experts split over ep of the dp replicas
  int cp = 1;  // "cp": context-parallel ways: each sample's sequence split over cp ranks (ring attention)
  Schedule schedule = Schedule::OneFOneB;  // "schedule": "gpipe" | "1f1b" | "interleaved_1f1b" | "zb_h1"
  int microbatches = 1;   // "microbatches": a replica's batch is split into this many, run one after another
                          // with gradients summed (this is also gradient accumulation on one rank)
  int virtualChunks = 1;  // "virtual_chunks": chunks per stage for interleaved_1f1b
  int zero = 0;           // "zero": ZeRO stage 0-3 over the DP group
  Recompute recompute = Recompute::None;  // "recompute": "none" | "selective" | "full" (plan/recompute.h)
  int recomputeLayers = 0;  // "recompute_layers": with "full", blocks recomputed per chunk (0: all of them)
  Precision precision = Precision::Fp32;              // "precision": "fp32" | "bf16"
  GradPrecision gradPrecision = GradPrecision::Fp32;  // "grad_precision": "fp32" | "bf16" (bf16 runs only)
  bool sequenceParallel = false;                      // "sequence_parallel"
  // "overlap_param_gather": ZeRO 1-2's all-gather of the updated parameters runs beside the next step's
  // forward, each layer waiting for its own, instead of inside the optimizer step (Megatron-LM's
  // --overlap-param-gather with its distributed optimizer).
  bool overlapParamGather = false;
  // "tp_comm_overlap": under sequence parallelism, each all-gather before a column-parallel GEMM and each
  // reduce-scatter after a row-parallel one goes in chunks, every chunk's collective beside the GEMM rows of
  // another (Megatron-LM's --tp-comm-overlap; plan/cost_model.h tpOverlapSplits).
  bool tpCommOverlap = false;
  Offload offload = Offload::None;                 // "offload": "none" | "optimizer" | "parameters"
  BatchNormMode batchNorm = BatchNormMode::Local;  // "batchnorm": "local" | "sync" (cnn)
  std::vector<ChunkPlacement> placement;           // "placement": empty = even split over pp stages
  // Parameter-server mode ("mode": "parameter_server"; dp, tp and pp stay 1, the workers are the replicas).
  ParallelMode mode = ParallelMode::Collective;  // "mode": "collective" | "parameter_server"
  int servers = 1;                               // "servers": processes holding the parameter shards
  int workers = 1;                               // "workers": processes computing gradients
  Consistency consistency = Consistency::Sync;   // "consistency": "sync" | "async" | "bounded"
  int staleness = 2;                             // "staleness": bounded's most steps ahead of the slowest
  double workerTimeoutS = 10;            // "worker_timeout_s": silence after which a worker is dropped
  std::vector<Straggler> stragglers;     // "stragglers": workers slowed on purpose
  std::vector<std::string> serverNodes;  // "server_nodes": each server's node by name; empty: s mod nodes
  bool operator==(const ParallelConfig&) const = default;
  // The ranks of the collective layout, dp * cp * tp * pp, and how messages name that product ("dp*tp*pp",
  // or "dp*cp*tp*pp" when cp > 1).
  long long ranks() const { return static_cast<long long>(dp) * cp * tp * pp; }
  // The ranks each parameter is replicated over (the gradient all-reduce and ZeRO's sharding group): the dp
  // replicas times the cp slices of each (RankLayout::dpCpGroup).
  int dataReplicas() const { return dp * cp; }
  std::string ranksText() const { return cp > 1 ? "dp*cp*tp*pp" : "dp*tp*pp"; }
};

struct OptimizerConfig {
  OptimizerType type = OptimizerType::AdamW;  // "type": "adamw" | "sgd"
  double lr = 3e-4;                           // "lr": peak learning rate
  double beta1 = 0.9;                         // "betas"[0] (adamw)
  double beta2 = 0.95;                        // "betas"[1] (adamw)
  double eps = 1e-8;                          // "eps" (adamw)
  double weightDecay = 0.0;  // "weight_decay": applied to weight matrices and embeddings only
  double momentum = 0.9;     // "momentum" (sgd)
  bool nesterov = false;     // "nesterov" (sgd)
  bool operator==(const OptimizerConfig&) const = default;
};

struct TrainingConfig {
  int steps = 100;                             // "steps": optimizer steps
  int batchSize = 16;                          // "batch_size": samples per optimizer step (all replicas)
  int seqLen = 128;                            // "seq_len": tokens per sample (gpt), <= model.context
  int warmupSteps = 0;                         // "warmup_steps": linear warm-up from 0
  LrSchedule lrSchedule = LrSchedule::Cosine;  // "lr_schedule": "constant" | "cosine" | "linear"
  double minLrRatio = 0.1;                     // "min_lr_ratio": final lr = lr * min_lr_ratio
  double gradClip = 1.0;                       // "grad_clip": max global grad norm, 0 disables
  int evalEvery = 0;                           // "eval_every": steps between evaluations, 0 = only at the end
  int evalBatches = 0;                         // "eval_batches": batches per evaluation, 0 = the whole split
  int checkpointEvery = 0;  // "checkpoint_every": steps between checkpoints, 0 = only at the end
  int keepCheckpoints = 0;  // "keep_checkpoints": the newest N checkpoints are kept, 0 = all
  int logEvery = 1;         // "log_every": steps between step lines in the metrics stream
  std::string runDir;       // "run_dir": run folder, default "runs/<name>"
  int threads = 0;          // "threads": threads per rank, 0 = cores / local ranks
  // "head_chunk_rows": token rows per chunk of the gpt and llama fused LM head and loss (model_spec.h
  // headChunkRows), 0 = automatic; MESHSTUDIO_HEAD_CHUNK_ROWS in the environment sets it for a command.
  int headChunkRows = 0;
  double commTimeoutS =
      600;  // "comm_timeout_s": longest wait for one communication (runtime/comm_watchdog.h)
  bool operator==(const TrainingConfig&) const = default;
};

struct RunConfig {
  int version = kRunConfigVersion;           // "version"
  std::string name = "run";                  // "name"
  unsigned long long seed = 1;               // "seed"
  DeviceChoice device = DeviceChoice::Auto;  // "device": "auto" | "cpu" | "cuda"
  ModelConfig model;
  DataConfig data;
  MeshConfig mesh;
  ParallelConfig parallel;
  OptimizerConfig optimizer;
  TrainingConfig training;
  // Not part of the JSON: the directory of the file it was loaded from; relative paths resolve against it.
  std::string baseDir;
  bool operator==(const RunConfig& o) const {
    return version == o.version && name == o.name && seed == o.seed && device == o.device &&
           model == o.model && data == o.data && mesh == o.mesh && parallel == o.parallel &&
           optimizer == o.optimizer && training == o.training;
  }
  // A path from the config resolved against baseDir (absolute paths are returned unchanged).
  std::string resolvePath(const std::string& path) const;
};

// Samples per microbatch on one DP replica: batch_size / (dp * microbatches) (validation makes it exact). The
// one place this is computed: the plan, the engine's pipeline and evaluation, and the studio's calibration.
// In parameter-server mode the replicas are the workers: batch_size / (workers * microbatches).
inline int microbatchSize(const RunConfig& c) {
  const int replicas = c.parallel.mode == ParallelMode::ParameterServer ? std::max(1, c.parallel.workers)
                                                                        : std::max(1, c.parallel.dp);
  return c.training.batchSize / (replicas * std::max(1, c.parallel.microbatches));
}

// One problem found in a config: the JSON path of the field ("/parallel/tp", "/model/heads") and the reason.
struct ConfigError {
  std::string path;
  std::string message;
};

// All problems of a config, in document order. Empty = valid.
using ConfigErrors = std::vector<ConfigError>;

// Formats errors as "<file>: <path>: <message>" lines, one an error (control characters written as \u00XX).
std::string formatConfigErrors(const ConfigErrors& errors, const std::string& file);

// Parses and validates. On failure the Status message holds every error, one per line, each naming the
// JSON path and the reason (unknown keys come with a did-you-mean suggestion when one is close).
Expected<RunConfig> parseRunConfig(const nlohmann::json& doc, ConfigErrors* errorsOut = nullptr);
// Reads the file (a missing file, unreadable file or JSON syntax error names the file, line and column),
// then parseRunConfig(). Sets baseDir to the file's directory.
Expected<RunConfig> loadRunConfig(const std::string& path, ConfigErrors* errorsOut = nullptr);
// The text of a config file, already read: what loadRunConfig() does after reading, `name` standing for the
// file in messages. baseDir stays empty (relative paths resolve against the working directory).
Expected<RunConfig> parseRunConfigText(const std::string& text, const std::string& name,
                                       ConfigErrors* errorsOut = nullptr);
// Cross-field checks on an already typed config (tp divides heads, placement covers every layer once, ...).
ConfigErrors validateRunConfig(const RunConfig& config);
// The complete config, every field written (defaults included), in the documented key order.
nlohmann::json toJson(const RunConfig& config);
// Writes toJson() atomically (temporary file + rename), pretty-printed with 2-space indent.
Status saveRunConfig(const RunConfig& config, const std::string& path);

// The JSON Schema (draft 2020-12) of the run config, generated from the same field table as the validator.
nlohmann::json runConfigSchema();
// Markdown reference of every field: path, type, default, allowed values, description.
std::string runConfigMarkdown();

// Names used in the JSON for the enums.
const char* toString(ModelType v);
const char* toString(BatchNormMode v);
const char* toString(ParallelMode v);
const char* toString(Consistency v);
const char* toString(Activation v);
const char* toString(Pooling v);
const char* toString(DataKind v);
const char* toString(Schedule v);
const char* toString(Recompute v);
const char* toString(Precision v);
const char* toString(GradPrecision v);
const char* toString(Offload v);
const char* toString(OptimizerType v);
const char* toString(LrSchedule v);
const char* toString(DeviceChoice v);

}  // namespace ms
