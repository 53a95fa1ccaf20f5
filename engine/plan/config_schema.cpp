// The run config's field table (see config_schema.h) and the helpers that walk it. Every JSON key of the
// config is one row below; the parser, the validator, toJson(), the JSON Schema and docs/config.md read
// their types, ranges, allowed values and descriptions from here and nowhere else.
//
// What always holds: a row's accessors read and write exactly the RunConfig member its key names; defaults
// come from the struct initialisers (fieldDefault() reads a default-constructed RunConfig).
#include "plan/config_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "plan/hardware.h"

namespace ms {

namespace {

using ojson = nlohmann::ordered_json;

// The member a row reads and writes; `i` is the item index inside a list of objects.
#define MS_REF(member)                              \
  [](auto& c, [[maybe_unused]] size_t i) -> auto& { \
    return c.member;                                \
  }

Field baseField(std::string parent, std::string key, FieldKind kind, std::string description) {
  Field f;
  f.parent = std::move(parent);
  f.key = std::move(key);
  f.kind = kind;
  f.description = std::move(description);
  return f;
}

NumberRange atLeast(double v) {
  return NumberRange{v, false, std::nullopt, false};
}
NumberRange above(double v) {
  return NumberRange{v, true, std::nullopt, false};
}
NumberRange closed(double a, double b) {
  return NumberRange{a, false, b, false};
}
NumberRange halfOpen(double a, double b) {
  return NumberRange{a, false, b, true};
}
NumberRange open(double a, double b) {
  return NumberRange{a, true, b, true};
}

Field section(std::string parent, std::string key, std::string description) {
  return baseField(std::move(parent), std::move(key), FieldKind::Object, std::move(description));
}

template <typename Ref>
Field intField(std::string parent, std::string key, Ref ref, NumberRange range, std::string description) {
  Field f = baseField(std::move(parent), std::move(key), FieldKind::Integer, std::move(description));
  f.range = range;
  f.get = [ref](const RunConfig& c, size_t i) { return ojson(ref(c, i)); };
  f.set = [ref](RunConfig& c, size_t i, const nlohmann::json& v) {
    ref(c, i) = static_cast<int>(v.get<int64_t>());
  };
  return f;
}

template <typename Ref>
Field unsignedField(std::string parent, std::string key, Ref ref, std::string description) {
  Field f = baseField(std::move(parent), std::move(key), FieldKind::Unsigned, std::move(description));
  f.range = atLeast(0);
  f.get = [ref](const RunConfig& c, size_t i) { return ojson(ref(c, i)); };
  f.set = [ref](RunConfig& c, size_t i, const nlohmann::json& v) { ref(c, i) = v.get<uint64_t>(); };
  return f;
}

template <typename Ref>
Field numberField(std::string parent, std::string key, Ref ref, NumberRange range, std::string description) {
  Field f = baseField(std::move(parent), std::move(key), FieldKind::Number, std::move(description));
  f.range = range;
  f.get = [ref](const RunConfig& c, size_t i) { return ojson(ref(c, i)); };
  f.set = [ref](RunConfig& c, size_t i, const nlohmann::json& v) { ref(c, i) = v.get<double>(); };
  return f;
}

template <typename Ref>
Field boolField(std::string parent, std::string key, Ref ref, std::string description) {
  Field f = baseField(std::move(parent), std::move(key), FieldKind::Boolean, std::move(description));
  f.get = [ref](const RunConfig& c, size_t i) { return ojson(ref(c, i)); };
  f.set = [ref](RunConfig& c, size_t i, const nlohmann::json& v) { ref(c, i) = v.get<bool>(); };
  return f;
}

template <typename Ref>
Field stringField(std::string parent, std::string key, Ref ref, std::string description) {
  Field f = baseField(std::move(parent), std::move(key), FieldKind::String, std::move(description));
  f.get = [ref](const RunConfig& c, size_t i) { return ojson(ref(c, i)); };
  f.set = [ref](RunConfig& c, size_t i, const nlohmann::json& v) { ref(c, i) = v.get<std::string>(); };
  return f;
}

// A type name: one of `builtIn` (the catalog) or of the config's own list `extendedBy`.
template <typename Ref>
Field typeNameField(std::string parent, std::string key, std::vector<std::string> builtIn,
                    std::string extendedBy, Ref ref, std::string description) {
  Field f = stringField(std::move(parent), std::move(key), ref, std::move(description));
  f.nonEmpty = true;
  f.builtIn = std::move(builtIn);
  f.extendedBy = std::move(extendedBy);
  return f;
}

std::vector<std::string> catalogDeviceNames() {
  std::vector<std::string> names;
  for (const auto& d : deviceCatalog()) names.push_back(d.name);
  return names;
}

std::vector<std::string> catalogLinkNames() {
  std::vector<std::string> names;
  for (const auto& l : linkCatalog()) names.push_back(l.name);
  return names;
}

template <typename E, size_t N, typename Ref>
Field enumField(std::string parent, std::string key, const EnumName<E> (&names)[N], Ref ref,
                std::string description) {
  Field f = baseField(std::move(parent), std::move(key), FieldKind::Enum, std::move(description));
  for (const auto& n : names) f.allowed.push_back(n.name);
  f.get = [ref, &names](const RunConfig& c, size_t i) { return ojson(enumName(names, ref(c, i))); };
  f.set = [ref, &names](RunConfig& c, size_t i, const nlohmann::json& v) {
    const std::string s = v.get<std::string>();
    for (const auto& n : names)
      if (s == n.name) ref(c, i) = n.value;
  };
  return f;
}

// kind is StringList (a string is accepted as a list of one) or StringArray.
template <typename Ref>
Field stringListField(std::string parent, std::string key, FieldKind kind, Ref ref, std::string description) {
  Field f = baseField(std::move(parent), std::move(key), kind, std::move(description));
  f.nonEmpty = true;
  f.get = [ref](const RunConfig& c, size_t i) { return ojson(ref(c, i)); };
  f.set = [ref](RunConfig& c, size_t i, const nlohmann::json& v) {
    ref(c, i) = v.get<std::vector<std::string>>();
  };
  return f;
}

template <typename Ref>
Field intListField(std::string parent, std::string key, Ref ref, NumberRange range, std::string description) {
  Field f = baseField(std::move(parent), std::move(key), FieldKind::IntList, std::move(description));
  f.range = range;
  f.get = [ref](const RunConfig& c, size_t i) { return ojson(ref(c, i)); };
  f.set = [ref](RunConfig& c, size_t i, const nlohmann::json& v) {
    auto& out = ref(c, i);
    out.clear();
    for (const auto& e : v) out.push_back(static_cast<int>(e.get<int64_t>()));
  };
  return f;
}

template <typename RefA, typename RefB>
Field numberPairField(std::string parent, std::string key, RefA a, RefB b, NumberRange range,
                      std::string description) {
  Field f = baseField(std::move(parent), std::move(key), FieldKind::NumberPair, std::move(description));
  f.range = range;
  f.minItems = 2;
  f.get = [a, b](const RunConfig& c, size_t i) { return ojson::array({a(c, i), b(c, i)}); };
  f.set = [a, b](RunConfig& c, size_t i, const nlohmann::json& v) {
    a(c, i) = v.at(0).get<double>();
    b(c, i) = v.at(1).get<double>();
  };
  return f;
}

template <typename Ref>
Field objectListField(std::string parent, std::string key, Ref ref, std::string description) {
  Field f = baseField(std::move(parent), std::move(key), FieldKind::ObjectList, std::move(description));
  f.count = [ref](const RunConfig& c) { return ref(c, 0).size(); };
  f.resize = [ref](RunConfig& c, size_t n) { ref(c, 0).resize(n); };
  return f;
}

constexpr unsigned kGpt = modelBit(ModelType::Gpt);
constexpr unsigned kVit = modelBit(ModelType::Vit);
constexpr unsigned kMlp = modelBit(ModelType::Mlp);
constexpr unsigned kCnn = modelBit(ModelType::Cnn);
constexpr unsigned kLlama = modelBit(ModelType::Llama);
constexpr unsigned kLanguage = kGpt | kLlama;
constexpr unsigned kTransformers = kGpt | kVit | kLlama;
constexpr unsigned kText = dataBit(DataKind::Text);
constexpr unsigned kTokens = dataBit(DataKind::Tokens);
constexpr unsigned kMnist = dataBit(DataKind::FashionMnist);

void addTopLevel(std::vector<Field>& t) {
  t.push_back(intField("", "version", MS_REF(version), closed(kRunConfigVersion, kRunConfigVersion),
                       "Format version of the document; this build reads version 1.")
                  .aka({"schema_version", "config_version"}));
  Field name = stringField("", "name", MS_REF(name), "Run name; the default run folder is runs/{name}.");
  name.nonEmpty = name.nameChars = true;
  t.push_back(name.aka({"run_name", "experiment"}));
  t.push_back(unsignedField("", "seed", MS_REF(seed), "Seed of the weight initialisation and the data order.")
                  .aka({"random_seed", "rng_seed"}));
  t.push_back(enumField("", "device", kDeviceChoiceNames, MS_REF(device),
                        "Where ranks compute: auto takes cuda when a GPU is present, else cpu.")
                  .aka({"backend", "accelerator"}));
}

void addModel(std::vector<Field>& t) {
  const std::string m = "/model";
  t.push_back(section("", "model", "The network.").isRequired().aka({"network", "arch"}));
  t.push_back(enumField(m, "type", kModelTypeNames, MS_REF(model.type),
                        "Model family: gpt (decoder-only LM, GPT-2 blocks), llama (decoder-only LM, Llama "
                        "blocks: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention), vit (vision "
                        "transformer), mlp or cnn (a ResNet of basic blocks with BatchNorm).")
                  .isRequired()
                  .aka({"model_type", "arch", "architecture", "kind"}));
  t.push_back(intField(m, "layers", MS_REF(model.layers), atLeast(1), "Transformer blocks (L).")
                  .forModels(kTransformers)
                  .aka({"n_layer", "n_layers", "num_layers", "depth", "num_hidden_layers"}));
  t.push_back(intField(m, "width", MS_REF(model.width), atLeast(1), "Channels of the residual stream (C).")
                  .forModels(kTransformers)
                  .aka({"n_embd", "hidden_size", "d_model", "dim", "embed_dim"}));
  t.push_back(intField(m, "heads", MS_REF(model.heads), atLeast(1), "Attention heads (H); must divide width.")
                  .forModels(kTransformers)
                  .aka({"n_head", "n_heads", "num_heads", "num_attention_heads"}));
  t.push_back(
      intField(m, "mlp_ratio", MS_REF(model.mlpRatio), atLeast(1), "MLP hidden width as a multiple of width.")
          .forModels(kGpt | kVit)
          .aka({"mlp_mult", "ffn_ratio", "expansion"}));
  t.push_back(numberField(m, "layer_norm_eps", MS_REF(model.layerNormEps), above(0),
                          "Epsilon of every LayerNorm (RMSNorm for llama).")
                  .forModels(kTransformers)
                  .aka({"ln_eps", "norm_eps", "layer_norm_epsilon", "rms_norm_eps"}));
  t.push_back(intField(m, "kv_heads", MS_REF(model.kvHeads), atLeast(0),
                       "Key/value heads of grouped-query attention (Ainslie et al. 2023); must divide heads; "
                       "1 is multi-query attention, 0 means heads (multi-head attention).")
                  .forModels(kLlama)
                  .aka({"num_key_value_heads", "n_kv_heads", "num_query_groups", "kv_groups"}));
  t.push_back(intField(m, "ffn_hidden", MS_REF(model.ffnHidden), atLeast(0),
                       "Hidden width of the SwiGLU MLP; 0 means Llama's rule, 2/3 of 4 width rounded up to a "
                       "multiple of 256.")
                  .forModels(kLlama)
                  .aka({"intermediate_size", "ffn_hidden_size", "hidden_dim", "ffn_dim"}));
  t.push_back(numberField(m, "rope_theta", MS_REF(model.ropeTheta), above(0),
                          "Base of the rotary position embedding's angles (10000 in Llama 2, 500000 in Llama "
                          "3).")
                  .forModels(kLlama)
                  .aka({"rope_base", "rotary_base", "rotary_emb_base"}));
  t.push_back(intField(m, "experts", MS_REF(model.experts), atLeast(0),
                       "Routed experts of each mixture-of-experts block; 0 keeps every MLP dense.")
                  .forModels(kLlama)
                  .aka({"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"}));
  t.push_back(intField(m, "experts_per_token", MS_REF(model.expertsPerToken), atLeast(1),
                       "Experts each token is routed to (top-k); their router probabilities are renormalised "
                       "to sum to 1.")
                  .forModels(kLlama)
                  .aka({"num_experts_per_tok", "top_k", "moe_router_topk", "moe_top_k"}));
  t.push_back(intField(m, "expert_ffn_hidden", MS_REF(model.expertFfnHidden), atLeast(0),
                       "Hidden width of an expert's SwiGLU MLP; 0 means ffn_hidden's.")
                  .forModels(kLlama)
                  .aka({"moe_intermediate_size", "moe_ffn_hidden_size", "expert_intermediate_size"}));
  t.push_back(intField(m, "shared_experts", MS_REF(model.sharedExperts), atLeast(0),
                       "Experts every token passes through beside its routed ones (DeepSeekMoE).")
                  .forModels(kLlama)
                  .aka({"n_shared_experts", "num_shared_experts"}));
  t.push_back(
      numberField(m, "capacity_factor", MS_REF(model.capacityFactor), atLeast(0),
                  "An expert takes at most capacity_factor * tokens * experts_per_token / experts of a "
                  "microbatch's tokens (the later ones are dropped, GShard); 0 is dropless.")
          .forModels(kLlama)
          .aka({"moe_expert_capacity_factor", "expert_capacity_factor"}));
  t.push_back(
      numberField(m, "aux_loss_coef", MS_REF(model.auxLossCoef), atLeast(0),
                  "Weight of the load-balancing loss experts * sum_e f_e P_e (Switch Transformer), f_e "
                  "the share of tokens routed to expert e and P_e its mean router probability.")
          .forModels(kLlama)
          .aka({"router_aux_loss_coef", "moe_aux_loss_coeff", "load_balancing_loss_coef"}));
  t.push_back(intField(m, "dense_layers", MS_REF(model.denseLayers), atLeast(0),
                       "The first dense_layers blocks keep a dense MLP (DeepSeek-V3 keeps 3).")
                  .forModels(kLlama)
                  .aka({"first_k_dense_replace", "moe_layer_start"}));
  t.push_back(intField(m, "vocab", MS_REF(model.vocab), atLeast(2), "Vocabulary size (V); 256 for text data.")
                  .forModels(kLanguage)
                  .aka({"vocab_size", "n_vocab"}));
  t.push_back(intField(m, "context", MS_REF(model.context), atLeast(1),
                       "Maximum sequence length (for gpt the rows of the position table).")
                  .forModels(kLanguage)
                  .aka({"block_size", "n_ctx", "n_positions", "max_seq_len", "context_length"}));
  t.push_back(boolField(m, "tie_embeddings", MS_REF(model.tieEmbeddings),
                        "The LM head shares the token embedding matrix (as in GPT-2; Llama 2 and 3 8B+ "
                        "have their own, set false).")
                  .forModels(kLanguage)
                  .aka({"tie_weights", "tie_word_embeddings"}));
  t.push_back(intField(m, "image_size", MS_REF(model.imageSize), atLeast(1),
                       "Side of the square single-channel input images (S).")
                  .forModels(kVit | kCnn)
                  .aka({"img_size", "resolution"}));
  t.push_back(intField(m, "patch", MS_REF(model.patch), atLeast(1),
                       "Side of a square patch (P); must divide image_size.")
                  .forModels(kVit)
                  .aka({"patch_size", "patches"}));
  t.push_back(enumField(m, "pool", kPoolingNames, MS_REF(model.pool),
                        "What the head reads: the class token or the mean of all tokens.")
                  .forModels(kVit)
                  .aka({"pooling", "global_pool"}));
  t.push_back(intField(m, "classes", MS_REF(model.classes), atLeast(2), "Output classes.")
                  .forModels(kVit | kMlp | kCnn)
                  .aka({"num_classes", "n_classes", "num_labels"}));
  t.push_back(intListField(m, "hidden", MS_REF(model.hidden), atLeast(1),
                           "Widths of the hidden layers, one block each.")
                  .forModels(kMlp)
                  .aka({"hidden_sizes", "hidden_dims", "hidden_layers"}));
  t.push_back(enumField(m, "activation", kActivationNames, MS_REF(model.activation),
                        "Nonlinearity after each hidden layer.")
                  .forModels(kMlp)
                  .aka({"act", "activation_fn", "nonlinearity"}));
  t.push_back(intListField(m, "channels", MS_REF(model.channels), atLeast(1),
                           "Channels of each stage of residual blocks (the stem convolution has the first "
                           "stage's); every stage after the first halves the image side (stride 2).")
                  .forModels(kCnn)
                  .aka({"widths", "stage_channels", "filters"}));
  t.push_back(intField(m, "blocks", MS_REF(model.blocks), atLeast(1), "Residual blocks per stage.")
                  .forModels(kCnn)
                  .aka({"blocks_per_stage", "num_blocks", "depth_per_stage"}));
  t.push_back(numberField(m, "bn_eps", MS_REF(model.bnEps), above(0), "Epsilon of every BatchNorm.")
                  .forModels(kCnn)
                  .aka({"batchnorm_eps", "bn_epsilon"}));
  t.push_back(numberField(m, "bn_momentum", MS_REF(model.bnMomentum), open(0, 1),
                          "Update weight of the BatchNorm running statistics (PyTorch's momentum).")
                  .forModels(kCnn)
                  .aka({"batchnorm_momentum", "bn_decay"}));
  t.push_back(numberField(m, "init_std", MS_REF(model.initStd), above(0),
                          "Standard deviation of the normal initialisation of weight matrices.")
                  .aka({"initializer_range", "init_scale", "std"}));
}

void addData(std::vector<Field>& t) {
  const std::string d = "/data";
  t.push_back(section("", "data", "Where the samples come from.").isRequired().aka({"dataset"}));
  t.push_back(
      enumField(d, "kind", kDataKindNames, MS_REF(data.kind),
                "text: raw bytes; tokens: llm.c .bin token shards; fashion_mnist: the IDX image files.")
          .isRequired()
          .aka({"type", "format", "dataset"}));
  t.push_back(
      stringListField(d, "files", FieldKind::StringList, MS_REF(data.files),
                      "Text files read as bytes, concatenated in order; globs allowed, relative paths "
                      "resolve against the config's folder.")
          .forData(kText)
          .aka({"file", "paths", "path", "input"}));
  t.push_back(numberField(d, "val_fraction", MS_REF(data.valFraction), open(0, 1),
                          "Fraction of the bytes, taken from the end, held out for validation.")
                  .forData(kText)
                  .aka({"val_split", "validation_fraction", "val_ratio"}));
  t.push_back(stringListField(d, "train", FieldKind::StringList, MS_REF(data.train),
                              "Training token shards (llm.c .bin); globs allowed.")
                  .forData(kTokens)
                  .aka({"train_files", "train_bin", "training"}));
  t.push_back(stringListField(d, "val", FieldKind::StringList, MS_REF(data.val),
                              "Validation token shards (llm.c .bin); globs allowed.")
                  .forData(kTokens)
                  .aka({"val_files", "valid", "validation"}));
  Field dir = stringField(d, "dir", MS_REF(data.dir), "Folder holding the four Fashion-MNIST IDX .gz files.");
  dir.nonEmpty = true;
  t.push_back(dir.forData(kMnist).aka({"directory", "root", "data_dir", "folder"}));
}

void addMesh(std::vector<Field>& t) {
  const std::string m = "/mesh", n = "/mesh/nodes/*", d = "/mesh/device_types/*", l = "/mesh/link_types/*";
  t.push_back(section("", "mesh", "The machines: nodes of devices and the links between them.")
                  .aka({"cluster", "hardware"}));
  Field nodes =
      objectListField(m, "nodes", MS_REF(mesh.nodes), "Nodes of the cluster; ranks fill them in order.");
  nodes.minItems = 1;
  t.push_back(nodes.aka({"node", "hosts", "machines"}));
  Field name = stringField(n, "name", MS_REF(mesh.nodes[i].name), "Node name, unique in the mesh.");
  name.nonEmpty = name.required = true;
  t.push_back(name.aka({"host", "hostname"}));
  t.push_back(typeNameField(n, "device", catalogDeviceNames(), "mesh.device_types",
                            MS_REF(mesh.nodes[i].device),
                            "Device type: a hardware catalog name or one of mesh.device_types.")
                  .aka({"type", "gpu", "device_type"}));
  t.push_back(
      intField(n, "count", MS_REF(mesh.nodes[i].count), atLeast(1), "Devices of that type in the node.")
          .aka({"devices", "gpus", "num_devices"}));
  t.push_back(typeNameField(m, "intra_link", catalogLinkNames(), "mesh.link_types", MS_REF(mesh.intraLink),
                            "Link between the devices of a node.")
                  .aka({"intra", "intra_node_link", "intranode_link"}));
  t.push_back(typeNameField(m, "inter_link", catalogLinkNames(), "mesh.link_types", MS_REF(mesh.interLink),
                            "Link between nodes.")
                  .aka({"inter", "inter_node_link", "internode_link", "network"}));

  t.push_back(objectListField(m, "device_types", MS_REF(mesh.deviceTypes),
                              "Device types the hardware catalog lacks, for nodes to name in \"device\". "
                              "Units: 1 TFLOP/s = 1e12 FLOP/s, 1 GB = 1e9 bytes.")
                  .aka({"custom_devices", "device_catalog"}));
  Field deviceName = stringField(d, "name", MS_REF(mesh.deviceTypes[i].name),
                                 "Type name, unique; must not be a hardware catalog name.");
  deviceName.nonEmpty = deviceName.nameChars = deviceName.required = true;
  t.push_back(deviceName.aka({"id", "type", "device"}));
  t.push_back(stringField(d, "label", MS_REF(mesh.deviceTypes[i].label), "Name for people; empty = the name.")
                  .aka({"description", "display_name", "title"}));
  t.push_back(numberField(d, "peak_tflops_fp32", MS_REF(mesh.deviceTypes[i].peakTflopsFp32), above(0),
                          "Dense fp32 peak, TFLOP/s.")
                  .isRequired()
                  .aka({"fp32_tflops", "tflops_fp32", "peak_fp32", "fp32"}));
  t.push_back(numberField(d, "peak_tflops_bf16", MS_REF(mesh.deviceTypes[i].peakTflopsBf16), above(0),
                          "Dense bf16 peak (tensor cores, no sparsity), TFLOP/s.")
                  .isRequired()
                  .aka({"bf16_tflops", "tflops_bf16", "peak_bf16", "bf16"}));
  t.push_back(
      numberField(d, "memory_gb", MS_REF(mesh.deviceTypes[i].memoryGb), above(0), "Memory capacity, GB.")
          .isRequired()
          .aka({"memory", "mem_gb", "hbm_gb", "capacity_gb"}));
  t.push_back(numberField(d, "memory_bandwidth_gbs", MS_REF(mesh.deviceTypes[i].memoryBandwidthGbs), above(0),
                          "Memory bandwidth, GB/s.")
                  .isRequired()
                  .aka({"bandwidth_gbs", "mem_bandwidth", "hbm_bandwidth", "bandwidth"}));
  t.push_back(numberField(d, "achievable_fraction", MS_REF(mesh.deviceTypes[i].achievableFraction),
                          NumberRange{0, true, 1, false},
                          "Fraction of the peak a training step reaches (the cost model's efficiency).")
                  .aka({"efficiency", "mfu", "utilization"}));
  t.push_back(numberField(d, "host_link_gbs", MS_REF(mesh.deviceTypes[i].hostLinkGbs), atLeast(0),
                          "Device<->host bandwidth each way, GB/s (offload's transfers); 0: not known.")
                  .aka({"pcie_gbs", "pcie_bandwidth", "host_bandwidth_gbs"}));
  t.push_back(numberField(d, "host_memory_gb", MS_REF(mesh.deviceTypes[i].hostMemoryGb), atLeast(0),
                          "The device's share of its node's host memory, GB (offload); 0: not known.")
                  .aka({"cpu_memory_gb", "host_ram_gb", "system_memory_gb"}));
  t.push_back(numberField(d, "host_memory_bandwidth_gbs", MS_REF(mesh.deviceTypes[i].hostMemoryBandwidthGbs),
                          atLeast(0),
                          "The device's share of the host's DRAM bandwidth, GB/s (the offloaded optimizer "
                          "step); 0: not known.")
                  .aka({"cpu_memory_bandwidth_gbs", "host_dram_gbs"}));

  t.push_back(objectListField(m, "link_types", MS_REF(mesh.linkTypes),
                              "Link types the hardware catalog lacks, for intra_link and inter_link to name.")
                  .aka({"custom_links", "link_catalog", "links"}));
  Field linkName = stringField(l, "name", MS_REF(mesh.linkTypes[i].name),
                               "Type name, unique; must not be a hardware catalog name.");
  linkName.nonEmpty = linkName.nameChars = linkName.required = true;
  t.push_back(linkName.aka({"id", "type", "link"}));
  t.push_back(numberField(l, "bandwidth_gbs", MS_REF(mesh.linkTypes[i].bandwidthGbs), above(0),
                          "Bandwidth per direction of one port, GB/s (each device's own under per_device).")
                  .isRequired()
                  .aka({"bandwidth", "bw_gbs"}));
  t.push_back(numberField(l, "latency_us", MS_REF(mesh.linkTypes[i].latencyUs), atLeast(0),
                          "Latency of one message, microseconds.")
                  .isRequired()
                  .aka({"latency", "lat_us"}));
  t.push_back(
      boolField(l, "per_device", MS_REF(mesh.linkTypes[i].perDevice),
                "Every device has its own port of this link (one NIC per GPU), so a ring collective "
                "over g devices of each node crosses nodes at g times the bandwidth; false: the node's "
                "devices share one port.")
          .aka({"rails", "nic_per_device", "per_gpu"}));

  const std::string f = "/mesh/profiles/*";
  t.push_back(objectListField(m, "profiles", MS_REF(mesh.profiles),
                              "Machines measured by `meshstudio-engine calibrate` (docs/calibration.md). A "
                              "profile's device type is its name and each link it measured is "
                              "<name>.<link> (\"here.shm\", \"here.tcp\"): compute is costed by each GEMM's "
                              "shape and every message by its size from the measured curves.")
                  .aka({"calibration", "calibrations", "device_profiles"}));
  Field profileName = stringField(f, "name", MS_REF(mesh.profiles[i].name),
                                  "Device type name, unique; must not be a hardware catalog name.");
  profileName.nonEmpty = profileName.nameChars = profileName.required = true;
  t.push_back(profileName.aka({"id", "type", "device"}));
  Field profileFile =
      stringField(f, "file", MS_REF(mesh.profiles[i].file),
                  "The profile JSON `calibrate --out` wrote; a relative path resolves against "
                  "the config's folder.");
  profileFile.nonEmpty = profileFile.required = true;
  t.push_back(profileFile.aka({"path", "profile"}));
}

void addParallel(std::vector<Field>& t) {
  const std::string p = "/parallel", c = "/parallel/placement/*";
  t.push_back(section("", "parallel", "How the model and the batch are split over ranks.")
                  .aka({"parallelism", "layout"}));
  t.push_back(intField(p, "dp", MS_REF(parallel.dp), atLeast(1), "Data-parallel replicas.")
                  .aka({"data_parallel", "dp_size"}));
  t.push_back(intField(p, "tp", MS_REF(parallel.tp), atLeast(1),
                       "Tensor-parallel ways; must divide heads, the MLP hidden width and (gpt) vocab.")
                  .aka({"tensor_parallel", "tp_size", "mp"}));
  t.push_back(intField(p, "pp", MS_REF(parallel.pp), atLeast(1), "Pipeline stages.")
                  .aka({"pipeline_parallel", "pp_size", "stages"}));
  t.push_back(
      intField(p, "ep", MS_REF(parallel.ep), atLeast(1),
               "Expert-parallel ways (mixture of experts): each expert lives on one of ep data-parallel "
               "replicas, tokens reach it by all-to-all; must divide dp * cp and experts. ZeRO shards the "
               "experts over their dp * cp / ep replicas.")
          .aka({"expert_parallel", "ep_size", "expert_model_parallel_size"}));
  t.push_back(
      intField(
          p, "cp", MS_REF(parallel.cp), atLeast(1),
          "Context-parallel ways (gpt, llama): each sample's sequence is split over cp ranks, two opposite "
          "chunks each, and attention runs as ring attention; 2 * cp must divide seq_len.")
          .aka({"context_parallel", "cp_size", "context_parallel_size", "context_parallel_degree"}));
  t.push_back(enumField(p, "schedule", kScheduleNames, MS_REF(parallel.schedule), "Pipeline schedule.")
                  .aka({"pipeline_schedule", "pp_schedule"}));
  t.push_back(intField(p, "microbatches", MS_REF(parallel.microbatches), atLeast(1),
                       "Microbatches per replica and step, run in turn with gradients summed.")
                  .aka({"micro_batches", "num_microbatches", "grad_accum", "gradient_accumulation_steps"}));
  t.push_back(intField(p, "virtual_chunks", MS_REF(parallel.virtualChunks), atLeast(1),
                       "Model chunks per stage; more than 1 only with interleaved_1f1b.")
                  .aka({"virtual_stages", "chunks", "virtual_pipeline_size"}));
  t.push_back(intField(p, "zero", MS_REF(parallel.zero), closed(0, 3),
                       "ZeRO stage over the data-parallel group; 0 is off.")
                  .aka({"zero_stage"}));
  t.push_back(
      enumField(p, "recompute", kRecomputeNames, MS_REF(parallel.recompute),
                "Activation recomputation: none keeps activations; selective drops the attention matrix and "
                "recomputes it in backward; full recomputes whole transformer blocks in backward.")
          .aka({"activation_checkpointing", "checkpoint_activations", "recomputation",
                "recompute_granularity"}));
  t.push_back(intField(p, "recompute_layers", MS_REF(parallel.recomputeLayers), atLeast(0),
                       "With recompute full: the first N transformer blocks of every chunk are recomputed, "
                       "the rest keep their activations; 0 recomputes all of them.")
                  .aka({"recompute_num_layers", "checkpoint_num_layers", "num_checkpoint_layers"}));
  t.push_back(enumField(p, "precision", kPrecisionNames, MS_REF(parallel.precision), "Compute precision.")
                  .aka({"dtype", "mixed_precision"}));
  t.push_back(enumField(p, "grad_precision", kGradPrecisionNames, MS_REF(parallel.gradPrecision),
                        "Gradients under bf16: fp32 (Megatron's main gradients) or bf16 (half the memory and "
                        "reduce traffic).")
                  .aka({"gradient_precision", "grad_dtype", "grad_reduce_dtype"}));
  t.push_back(enumField(p, "offload", kOffloadNames, MS_REF(parallel.offload),
                        "Model states in host memory under bf16: optimizer keeps the fp32 master weights and "
                        "moments on the host and steps there (ZeRO-Offload); parameters (ZeRO-3) also keeps "
                        "the parameter and gradient shards there between uses (FSDP CPU offload).")
                  .aka({"offload_optimizer", "cpu_offload", "offload_param", "zero_offload"}));
  t.push_back(enumField(p, "batchnorm", kBatchNormModeNames, MS_REF(parallel.batchNorm),
                        "BatchNorm under data parallelism: local normalises with each replica's own batch; "
                        "sync all-reduces the per-channel sums over the data-parallel group (SyncBatchNorm).")
                  .forModels(kCnn)
                  .aka({"batch_norm", "sync_bn", "bn_mode"}));
  t.push_back(boolField(p, "sequence_parallel", MS_REF(parallel.sequenceParallel),
                        "Shard activations outside the tensor-parallel regions along the sequence.")
                  .aka({"sp", "seq_parallel"}));
  t.push_back(boolField(p, "overlap_param_gather", MS_REF(parallel.overlapParamGather),
                        "With zero 1 or 2: all-gather the updated parameters beside the next step's forward, "
                        "each layer waiting for its own, instead of inside the optimizer step (Megatron-LM's "
                        "--overlap-param-gather).")
                  .aka({"overlap_param_all_gather", "param_gather_overlap"}));
  t.push_back(boolField(p, "tp_comm_overlap", MS_REF(parallel.tpCommOverlap),
                        "With sequence_parallel (and tp > 1): split each block's tensor-parallel all-gathers "
                        "and reduce-scatters into chunks that travel beside the GEMM rows of other chunks "
                        "(Megatron-LM's --tp-comm-overlap).")
                  .aka({"overlap_tp_comm", "tp_overlap"}));
  t.push_back(enumField(p, "mode", kParallelModeNames, MS_REF(parallel.mode),
                        "How replicas combine gradients: collective (all-reduce inside one MPI job) or "
                        "parameter_server (workers pull parameters from and push gradients to server "
                        "processes, which outlive lost workers).")
                  .aka({"parallel_mode", "strategy", "ps"}));
  t.push_back(intField(p, "servers", MS_REF(parallel.servers), atLeast(1),
                       "Parameter-server mode: server processes; the parameters are split over them by "
                       "bytes, each layer whole.")
                  .forParameterServer()
                  .aka({"num_servers", "ps_servers", "num_ps"}));
  t.push_back(intField(p, "workers", MS_REF(parallel.workers), atLeast(1),
                       "Parameter-server mode: worker processes, each training on its own share of every "
                       "batch (the replicas; dp stays 1).")
                  .forParameterServer()
                  .aka({"num_workers", "ps_workers", "replicas"}));
  t.push_back(enumField(p, "consistency", kConsistencyNames, MS_REF(parallel.consistency),
                        "Parameter-server mode: sync applies the sum of every live worker's push of a "
                        "step (equal to collective data parallelism); async applies each push as it "
                        "arrives; bounded does too while no worker is more than staleness steps ahead of "
                        "the slowest (stale-synchronous parallel).")
                  .forParameterServer()
                  .aka({"sync_mode", "synchronization", "ps_mode"}));
  t.push_back(intField(p, "staleness", MS_REF(parallel.staleness), atLeast(0),
                       "Parameter-server mode, bounded: most steps a worker may be ahead of the slowest "
                       "live worker.")
                  .forParameterServer()
                  .aka({"max_staleness", "staleness_bound", "ssp_bound"}));
  t.push_back(numberField(p, "worker_timeout_s", MS_REF(parallel.workerTimeoutS), above(0),
                          "Parameter-server mode: seconds without a message (its heartbeats included) after "
                          "which the servers drop a worker and go on with the rest.")
                  .forParameterServer()
                  .aka({"heartbeat_timeout_s", "worker_timeout"}));
  t.push_back(stringListField(p, "server_nodes", FieldKind::StringArray, MS_REF(parallel.serverNodes),
                              "Parameter-server mode: the mesh node of each server, in server order; empty: "
                              "server s on node s mod nodes.")
                  .forParameterServer()
                  .aka({"ps_nodes", "server_placement"}));
  t.push_back(objectListField(p, "stragglers", MS_REF(parallel.stragglers),
                              "Parameter-server mode: workers slowed down on purpose, to see what "
                              "asynchronous training is for.")
                  .forParameterServer()
                  .aka({"slow_workers", "straggler"}));
  const std::string st = "/parallel/stragglers/*";
  t.push_back(intField(st, "worker", MS_REF(parallel.stragglers[i].worker), atLeast(0),
                       "The slowed worker, in [0, workers).")
                  .isRequired()
                  .aka({"index", "id"}));
  t.push_back(numberField(st, "slowdown", MS_REF(parallel.stragglers[i].slowdown), atLeast(1),
                          "Its steps take this many times as long (it sleeps for the difference).")
                  .isRequired()
                  .aka({"factor", "slow_factor"}));
  t.push_back(objectListField(p, "placement", MS_REF(parallel.placement),
                              "Chunks in model order, each a run of layers on one stage; empty = even split.")
                  .aka({"layer_placement", "stages_layout"}));
  t.push_back(intField(c, "stage", MS_REF(parallel.placement[i].stage), atLeast(0),
                       "Pipeline stage holding the chunk, in [0, pp).")
                  .aka({"rank", "pp_rank"}));
  Field layers = stringListField(c, "layers", FieldKind::StringArray, MS_REF(parallel.placement[i].layers),
                                 "Layer names in model order: embedding, block.0 .. block.N-1, head.");
  layers.minItems = 1;
  t.push_back(layers.isRequired().aka({"layer", "modules"}));
}

void addOptimizer(std::vector<Field>& t) {
  const std::string o = "/optimizer";
  t.push_back(section("", "optimizer", "The update rule.").aka({"optim", "opt"}));
  t.push_back(enumField(o, "type", kOptimizerTypeNames, MS_REF(optimizer.type), "Optimizer.")
                  .aka({"name", "optim", "optimizer", "kind"}));
  t.push_back(numberField(o, "lr", MS_REF(optimizer.lr), above(0), "Peak learning rate.")
                  .aka({"learning_rate", "max_lr", "base_lr"}));
  t.push_back(numberPairField(o, "betas", MS_REF(optimizer.beta1), MS_REF(optimizer.beta2), halfOpen(0, 1),
                              "AdamW decay rates of the first and second moment estimates.")
                  .aka({"beta", "adam_betas"}));
  t.push_back(numberField(o, "eps", MS_REF(optimizer.eps), above(0), "AdamW epsilon.")
                  .aka({"epsilon", "adam_eps", "adam_epsilon"}));
  t.push_back(numberField(o, "weight_decay", MS_REF(optimizer.weightDecay), atLeast(0),
                          "Decoupled weight decay of weight matrices and embeddings (not biases or norms).")
                  .aka({"wd", "decay"}));
  t.push_back(
      numberField(o, "momentum", MS_REF(optimizer.momentum), halfOpen(0, 1), "SGD momentum.").aka({"mom"}));
  t.push_back(boolField(o, "nesterov", MS_REF(optimizer.nesterov), "SGD with Nesterov momentum.")
                  .aka({"use_nesterov"}));
}

void addTraining(std::vector<Field>& t) {
  const std::string r = "/training";
  t.push_back(section("", "training", "The training loop.").aka({"train", "trainer"}));
  t.push_back(intField(r, "steps", MS_REF(training.steps), atLeast(0), "Optimizer steps.")
                  .aka({"max_steps", "iterations", "iters", "num_steps", "total_steps"}));
  t.push_back(intField(r, "batch_size", MS_REF(training.batchSize), atLeast(1),
                       "Samples per optimizer step over all replicas; divisible by dp * microbatches.")
                  .aka({"batch", "bs", "global_batch_size"}));
  t.push_back(intField(r, "seq_len", MS_REF(training.seqLen), atLeast(1),
                       "Tokens per sample (T, gpt); at most model.context.")
                  .aka({"sequence_length", "seq_length", "max_seq_len"}));
  t.push_back(intField(r, "warmup_steps", MS_REF(training.warmupSteps), atLeast(0),
                       "Steps of linear warm-up from 0 to lr.")
                  .aka({"warmup", "warmup_iters"}));
  t.push_back(enumField(r, "lr_schedule", kLrScheduleNames, MS_REF(training.lrSchedule),
                        "Decay after warm-up, down to lr * min_lr_ratio.")
                  .aka({"schedule", "scheduler", "lr_scheduler", "decay"}));
  t.push_back(numberField(r, "min_lr_ratio", MS_REF(training.minLrRatio), closed(0, 1),
                          "Final learning rate as a fraction of lr.")
                  .aka({"min_lr", "final_lr_ratio"}));
  t.push_back(numberField(r, "grad_clip", MS_REF(training.gradClip), atLeast(0),
                          "Maximum global gradient norm; 0 disables clipping.")
                  .aka({"clip", "max_grad_norm", "clip_grad_norm", "grad_norm_clip"}));
  t.push_back(intField(r, "eval_every", MS_REF(training.evalEvery), atLeast(0),
                       "Steps between evaluations; 0 = only at the end.")
                  .aka({"eval_interval", "val_every", "eval_freq"}));
  t.push_back(intField(r, "eval_batches", MS_REF(training.evalBatches), atLeast(0),
                       "Batches per evaluation; 0 = the whole validation split.")
                  .aka({"eval_iters", "val_batches", "eval_steps"}));
  t.push_back(intField(r, "checkpoint_every", MS_REF(training.checkpointEvery), atLeast(0),
                       "Steps between checkpoints; 0 = only at the end.")
                  .aka({"save_every", "checkpoint_interval", "ckpt_every"}));
  t.push_back(intField(r, "keep_checkpoints", MS_REF(training.keepCheckpoints), atLeast(0),
                       "Checkpoints kept in the run folder, the newest ones (older ones are deleted after "
                       "each new one is whole); 0 = all.")
                  .aka({"save_total_limit", "max_checkpoints", "keep_last"}));
  t.push_back(intField(r, "log_every", MS_REF(training.logEvery), atLeast(1),
                       "Steps between step lines in the metrics stream.")
                  .aka({"log_interval", "print_every"}));
  t.push_back(stringField(r, "run_dir", MS_REF(training.runDir), "Run folder; empty = runs/{name}.")
                  .aka({"out_dir", "output_dir", "run_folder"}));
  t.push_back(intField(r, "threads", MS_REF(training.threads), closed(0, 4096),
                       "Threads per rank; 0 = cores / local ranks.")
                  .aka({"num_threads", "omp_threads"}));
  t.push_back(intField(r, "head_chunk_rows", MS_REF(training.headChunkRows), atLeast(0),
                       "Token rows per chunk of the gpt and llama fused LM head and loss (the logits of one "
                       "chunk exist at a time); 0 = automatic, about 256 MiB of fp32 logits a chunk. The "
                       "environment variable MESHSTUDIO_HEAD_CHUNK_ROWS sets it for one command.")
                  .aka({"loss_chunk_rows", "logits_chunk_rows"}));
  t.push_back(
      numberField(r, "comm_timeout_s", MS_REF(training.commTimeoutS), closed(1, 86400),
                  "Longest wait for one collective or message between devices, seconds: past it (or on "
                  "an NCCL asynchronous error) the communicators are aborted and the run ends naming "
                  "the operation.")
          .aka({"nccl_timeout", "dist_timeout", "collective_timeout"}));
}

#undef MS_REF

std::string lowered(const std::string& s) {
  std::string out;
  for (char ch : s) out += ch == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// Optimal string alignment distance (Levenshtein plus adjacent transpositions).
size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::vector<Field> runConfigFields() {
  std::vector<Field> t;
  addTopLevel(t);
  addModel(t);
  addData(t);
  addMesh(t);
  addParallel(t);
  addOptimizer(t);
  addTraining(t);
  return t;
}

bool NumberRange::contains(double v) const {
  if (!std::isfinite(v)) return false;
  if (min && (minExclusive ? v <= *min : v < *min)) return false;
  if (max && (maxExclusive ? v >= *max : v > *max)) return false;
  return true;
}

std::string NumberRange::describe(bool integral) const {
  // Whole bounds print as integers ("> 0", not "> 0.0"), others in nlohmann's shortest round-trip form.
  const auto fmt = [&](double v) {
    if (integral || (std::floor(v) == v && std::fabs(v) < 1e15))
      return std::to_string(static_cast<long long>(v));
    return nlohmann::json(v).dump();
  };
  if (min && max) {
    if (*min == *max && !minExclusive && !maxExclusive) return fmt(*min);
    if (integral && !minExclusive && !maxExclusive) return fmt(*min) + " .. " + fmt(*max);
    return std::string(minExclusive ? "(" : "[") + fmt(*min) + ", " + fmt(*max) + (maxExclusive ? ")" : "]");
  }
  if (min) return std::string(minExclusive ? "> " : ">= ") + fmt(*min);
  if (max) return std::string(maxExclusive ? "< " : "<= ") + fmt(*max);
  return "";
}

bool Field::appliesTo(ModelType model, DataKind data) const {
  return (models & modelBit(model)) != 0 && (dataKinds & dataBit(data)) != 0;
}

bool Field::appliesTo(const RunConfig& c) const {
  return appliesTo(c.model.type, c.data.kind) &&
         (!parameterServerOnly || c.parallel.mode == ParallelMode::ParameterServer);
}

std::vector<const Field*> childFields(const std::vector<Field>& fields, const std::string& parent) {
  std::vector<const Field*> out;
  for (const auto& f : fields)
    if (f.parent == parent) out.push_back(&f);
  return out;
}

const Field* findField(const std::vector<Field>& fields, const std::string& parent, const std::string& key) {
  for (const auto& f : fields)
    if (f.parent == parent && f.key == key) return &f;
  return nullptr;
}

std::string concretePath(const Field& field, size_t item) {
  std::string p = field.path();
  const size_t star = p.find("/*");
  if (star != std::string::npos) p.replace(star + 1, 1, std::to_string(item));
  return p;
}

std::string escapePointer(const std::string& key) {
  std::string out;
  for (char ch : key) {
    if (ch == '~')
      out += "~0";
    else if (ch == '/')
      out += "~1";
    else
      out += ch;
  }
  return out;
}

nlohmann::ordered_json fieldsToJson(const std::vector<Field>& fields, const std::string& parent,
                                    const RunConfig& config, size_t item) {
  ojson obj = ojson::object();
  for (const Field* f : childFields(fields, parent)) {
    if (!f->appliesTo(config)) continue;
    if (f->kind == FieldKind::Object) {
      obj[f->key] = fieldsToJson(fields, f->path(), config, 0);
    } else if (f->kind == FieldKind::ObjectList) {
      ojson items = ojson::array();
      for (size_t i = 0; i < f->count(config); ++i)
        items.push_back(fieldsToJson(fields, f->itemParent(), config, i));
      obj[f->key] = items;
    } else {
      obj[f->key] = f->get(config, item);
    }
  }
  return obj;
}

nlohmann::ordered_json fieldDefault(const std::vector<Field>& fields, const Field& field) {
  if (field.required || field.kind == FieldKind::Object) return nullptr;
  RunConfig defaults;
  if (field.kind == FieldKind::ObjectList) {
    ojson items = ojson::array();
    for (size_t i = 0; i < field.count(defaults); ++i)
      items.push_back(fieldsToJson(fields, field.itemParent(), defaults, i));
    return items;
  }
  // A field inside a list item: its default is that of a default-constructed item.
  for (const auto& list : fields) {
    if (list.kind == FieldKind::ObjectList && list.itemParent() == field.parent) {
      list.resize(defaults, 0);
      list.resize(defaults, 1);
      return field.get(defaults, 0);
    }
  }
  return field.get(defaults, 0);
}

int closestIndex(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string w = lowered(word);
  int best = -1;
  size_t bestDistance = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const std::string c = lowered(candidates[i]);
    // Names of one or two letters ("lr", "tp") are close only to words of their own length.
    if (c.size() <= 2 && w.size() != c.size()) continue;
    const size_t limit = c.size() <= 4 ? 1 : c.size() <= 8 ? 2 : 3;
    size_t d = editDistance(w, c);
    if (d > limit && w.size() >= 3 && c.rfind(w, 0) == 0) d = limit;  // a prefix: "h100" -> "h100-sxm-80gb"
    if (d <= limit && (best < 0 || d < bestDistance)) {
      best = static_cast<int>(i);
      bestDistance = d;
    }
  }
  return best;
}

std::string closestName(const std::string& word, const std::vector<std::string>& candidates) {
  const int i = closestIndex(word, candidates);
  return i < 0 ? std::string() : candidates[static_cast<size_t>(i)];
}

std::string notOneOfMessage(const std::string& value, const std::vector<std::string>& allowed) {
  std::string msg = "\"" + value + "\" is not one of ";
  for (size_t i = 0; i < allowed.size(); ++i) msg += (i ? ", \"" : "\"") + allowed[i] + "\"";
  const std::string close = closestName(value, allowed);
  if (!close.empty()) msg += "; did you mean \"" + close + "\"?";
  return msg;
}

}  // namespace ms
