// validateRunConfig(): the checks of a typed RunConfig. First every field that applies to the model type and
// data kind is checked against its row of the field table (range, allowed strings, list sizes); then the
// cross-field rules that no single row can state (tp divides heads, the mesh has enough devices, the
// placement covers every layer once, ...).
//
// What always holds: every finding names the JSON path a person has to edit and, in `involves`, every field
// it read, so parseRunConfig() can drop findings about values that never parsed.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "plan/config_schema.h"
#include "plan/hardware.h"
#include "plan/model_spec.h"

namespace ms {

namespace {

using Findings = std::vector<ConfigFinding>;

void add(Findings& out, std::string path, std::string message, std::vector<std::string> involves = {}) {
  involves.push_back(path);
  out.push_back(ConfigFinding{ConfigError{std::move(path), std::move(message)}, std::move(involves)});
}

std::string inQuotes(const std::string& s) {
  return "\"" + s + "\"";
}

std::string numberText(const nlohmann::ordered_json& v) {
  if (v.is_number_float() && !std::isfinite(v.get<double>()))
    return std::isnan(v.get<double>()) ? "nan" : "inf";
  return v.dump();
}

std::string rangeMessage(const Field& f, const nlohmann::ordered_json& value) {
  const bool integral =
      f.kind == FieldKind::Integer || f.kind == FieldKind::Unsigned || f.kind == FieldKind::IntList;
  const std::string d = f.range.describe(integral);
  const bool interval = d.front() == '[' || d.front() == '(' || d.find("..") != std::string::npos;
  return std::string("must be ") + (interval ? "in " : "") + d + ", got " + numberText(value);
}

bool nameCharsOnly(const std::string& s) {
  for (unsigned char ch : s)
    if (!std::isalnum(ch) && ch != '.' && ch != '_' && ch != '-') return false;
  return true;
}

void checkString(const Field& f, const std::string& path, const std::string& s, Findings& out) {
  if (f.nonEmpty && s.empty()) {
    add(out, path, "must not be empty");
  } else if (f.nameChars && !nameCharsOnly(s)) {
    add(out, path, "may only hold letters, digits, \".\", \"_\" and \"-\", got " + inQuotes(s));
  } else if (!f.allowed.empty() && std::find(f.allowed.begin(), f.allowed.end(), s) == f.allowed.end()) {
    add(out, path, notOneOfMessage(s, f.allowed));
  }
}

void checkList(const Field& f, const std::string& path, const nlohmann::ordered_json& list, Findings& out) {
  if (list.size() < f.minItems)
    add(out, path,
        "needs at least " + std::to_string(f.minItems) + (f.minItems == 1 ? " entry" : " entries"));
  for (size_t j = 0; j < list.size(); ++j) {
    const std::string itemPath = path + "/" + std::to_string(j);
    if (list[j].is_string()) {
      if (f.nonEmpty && list[j].get<std::string>().empty()) add(out, itemPath, "must not be empty");
    } else if (!f.range.contains(list[j].get<double>())) {
      add(out, itemPath, rangeMessage(f, list[j]));
    }
  }
}

// The rows of the table under `parent` (item `item` of a list of objects) that apply to the config.
void checkFields(const std::vector<Field>& fields, const std::string& parent, const RunConfig& c, size_t item,
                 Findings& out) {
  for (const Field* f : childFields(fields, parent)) {
    if (!f->appliesTo(c)) continue;
    const std::string path = concretePath(*f, item);
    switch (f->kind) {
      case FieldKind::Object:
        checkFields(fields, f->path(), c, 0, out);
        break;
      case FieldKind::ObjectList: {
        const size_t n = f->count(c);
        if (n < f->minItems)
          add(out, path,
              "needs at least " + std::to_string(f->minItems) + (f->minItems == 1 ? " entry" : " entries"));
        for (size_t i = 0; i < n; ++i) checkFields(fields, f->itemParent(), c, i, out);
        break;
      }
      case FieldKind::Integer:
      case FieldKind::Unsigned:
      case FieldKind::Number: {
        const auto v = f->get(c, item);
        if (!v.is_number() || !f->range.contains(v.get<double>())) add(out, path, rangeMessage(*f, v));
        break;
      }
      case FieldKind::String:
      case FieldKind::Enum:
        checkString(*f, path, f->get(c, item).get<std::string>(), out);
        break;
      case FieldKind::StringList:
      case FieldKind::StringArray:
      case FieldKind::IntList:
      case FieldKind::NumberPair:
        checkList(*f, path, f->get(c, item), out);
        break;
      case FieldKind::Boolean:
        break;
    }
  }
}

bool divides(int64_t d, int64_t n) {
  return d > 0 && n % d == 0;
}

// Context parallelism (Megatron-Core's context_parallel_size): each sample's sequence splits into 2 * cp
// chunks, rank i of the ring holding chunks i and 2cp-1-i (causal load balance), attention as ring
// attention. Rotary embeddings (llama) and the learned position table (gpt) take each chunk's positions;
// vit's bidirectional patches and class token are not wired to it.
void checkContextParallel(const RunConfig& c, Findings& out) {
  const int cp = c.parallel.cp;
  if (cp <= 1) return;
  const std::string cpText = "cp (" + std::to_string(cp) + ")";
  if (c.model.type != ModelType::Llama && c.model.type != ModelType::Gpt) {
    add(out, "/parallel/cp",
        cpText + " splits the sequence of a language model (gpt or llama: causal ring attention); a " +
            std::string(toString(c.model.type)) + " model needs cp 1",
        {"/model/type"});
    return;
  }
  const int T = c.training.seqLen;
  if (T >= 1 && T % (2 * cp) != 0)
    add(out, "/training/seq_len",
        "seq_len (" + std::to_string(T) + ") must be divisible by 2 * cp = " + std::to_string(2 * cp) +
            ": each context-parallel rank holds two chunks of seq_len / (2 * cp) tokens",
        {"/parallel/cp"});
  else if (T >= 1 && c.parallel.sequenceParallel && c.parallel.tp > 1 && (T / cp) % c.parallel.tp != 0)
    add(out, "/parallel/sequence_parallel",
        "each context-parallel rank's seq_len / cp = " + std::to_string(T / cp) +
            " positions must split evenly over tp = " + std::to_string(c.parallel.tp) +
            " for sequence parallelism",
        {"/parallel/cp", "/parallel/tp", "/training/seq_len"});
}

// Divisibility of the model's dimensions by heads and tp, and the model/data pairing.
void checkModel(const RunConfig& c, Findings& out) {
  const ModelConfig& m = c.model;
  const int tp = c.parallel.tp;
  const std::string tpText = "tp (" + std::to_string(tp) + ")";
  const std::string modelName = toString(m.type);
  if (c.parallel.ep > 1 && m.type != ModelType::Llama)
    add(out, "/parallel/ep",
        "ep (" + std::to_string(c.parallel.ep) +
            ") splits mixture-of-experts blocks, which only llama models "
            "have (model.experts); a " +
            modelName + " model needs ep 1",
        {"/model/type"});
  checkContextParallel(c, out);
  if (m.type == ModelType::Cnn) {
    // Convolutions are not split by tensor parallelism here (their channels could be, as Megatron splits
    // linear layers, but the engine has no such layer): data and pipeline parallelism only.
    if (tp > 1)
      add(out, "/parallel/tp",
          "a cnn model has no tensor-parallel layers, so tp must be 1, got " + std::to_string(tp),
          {"/model/type"});
    if (m.channels.empty()) add(out, "/model/channels", "a cnn needs at least one stage", {"/model/type"});
  } else if (isTransformer(m.type)) {
    if (m.heads >= 1 && m.width >= 1 && !divides(m.heads, m.width))
      add(out, "/model/heads",
          "heads (" + std::to_string(m.heads) + ") must divide width (" + std::to_string(m.width) + ")",
          {"/model/type", "/model/width"});
    if (tp >= 1 && m.heads >= 1 && !divides(tp, m.heads))
      add(out, "/parallel/tp", tpText + " must divide model.heads (" + std::to_string(m.heads) + ")",
          {"/model/type", "/model/heads"});
    const int64_t hidden = m.mlpHidden();
    if (tp >= 1 && hidden >= 1 && !divides(tp, hidden)) {
      if (m.type == ModelType::Llama)
        add(out, "/parallel/tp",
            tpText + " must divide the MLP hidden width (ffn_hidden: " + std::to_string(hidden) + ")",
            {"/model/type", "/model/ffn_hidden", "/model/width"});
      else
        add(out, "/parallel/tp",
            tpText + " must divide the MLP hidden width mlp_ratio * width = " + std::to_string(hidden),
            {"/model/type", "/model/mlp_ratio", "/model/width"});
    }
    if (m.type == ModelType::Llama) {
      const int kv = m.kvHeadCount();
      if (m.heads >= 1 && kv >= 1 && !divides(kv, m.heads))
        add(out, "/model/kv_heads",
            "kv_heads (" + std::to_string(kv) + ") must divide heads (" + std::to_string(m.heads) + ")",
            {"/model/type", "/model/heads"});
      else if (m.heads >= 1 && m.width >= 1 && divides(m.heads, m.width) && (m.width / m.heads) % 2 != 0)
        add(out, "/model/heads",
            "rotary embeddings rotate pairs of a head's channels, so the head size width / heads (" +
                std::to_string(m.width / m.heads) + ") must be even",
            {"/model/type", "/model/width"});
      if (m.experts > 0 && m.expertsPerToken > m.experts)
        add(out, "/model/experts_per_token",
            "experts_per_token (" + std::to_string(m.expertsPerToken) + ") must be at most experts (" +
                std::to_string(m.experts) + ")",
            {"/model/type", "/model/experts"});
      if (m.experts > 0 && tp >= 1 && m.expertHidden() >= 1 && !divides(tp, m.expertHidden()))
        add(out, "/parallel/tp",
            tpText + " must divide the experts' hidden width (" + std::to_string(m.expertHidden()) + ")",
            {"/model/type", "/model/expert_ffn_hidden"});
      // Expert parallelism (Megatron-Core's expert_model_parallel_size): the experts of a MoE block split
      // over ep consecutive data-parallel replicas, which exchange tokens by all-to-all.
      const int ep = c.parallel.ep;
      if (ep > 1) {
        if (m.experts == 0)
          add(out, "/parallel/ep",
              "ep (" + std::to_string(ep) + ") splits a mixture of experts, but model.experts is 0",
              {"/model/experts"});
        else if (!divides(ep, m.experts))
          add(out, "/parallel/ep",
              "ep (" + std::to_string(ep) + ") must divide model.experts (" + std::to_string(m.experts) + ")",
              {"/model/experts"});
        if (c.parallel.dp >= 1 && c.parallel.cp >= 1 && !divides(ep, c.parallel.dataReplicas()))
          add(out, "/parallel/ep",
              "ep (" + std::to_string(ep) + ") must divide " +
                  (c.parallel.cp > 1 ? "dp * cp (" + std::to_string(c.parallel.dataReplicas()) + ")"
                                     : "dp (" + std::to_string(c.parallel.dp) + ")") +
                  ": the expert-parallel ranks are data-parallel replicas of the rest of the model",
              c.parallel.cp > 1 ? std::vector<std::string>{"/parallel/dp", "/parallel/cp"}
                                : std::vector<std::string>{"/parallel/dp"});
      }
      // Each rank keeps kv_heads / tp key/value heads, as Megatron-Core does: its Attention divides
      // num_query_groups by the tensor-parallel size (megatron/core/transformer/attention.py,
      // num_query_groups_per_partition = divide(num_query_groups, tp), which asserts divisibility), so
      // neither splits key/value heads it cannot divide. (Inference servers such as vLLM replicate them
      // instead; docs/status.md.)
      if (tp >= 1 && kv >= 1 && !divides(tp, kv))
        add(out, "/parallel/tp",
            tpText + " must divide the key/value heads (kv_heads: " + std::to_string(kv) +
                "), as in Megatron-Core: each rank keeps kv_heads / tp of them",
            {"/model/type", "/model/kv_heads"});
    }
  } else {
    for (size_t j = 0; j < m.hidden.size(); ++j)
      if (tp >= 1 && m.hidden[j] >= 1 && !divides(tp, m.hidden[j]))
        add(out, "/parallel/tp",
            tpText + " must divide model.hidden[" + std::to_string(j) + "] (" + std::to_string(m.hidden[j]) +
                ")",
            {"/model/type", "/model/hidden"});
  }
  if (isLanguageModel(m.type)) {
    if (tp >= 1 && m.vocab >= 1 && !divides(tp, m.vocab))
      add(out, "/parallel/tp", tpText + " must divide model.vocab (" + std::to_string(m.vocab) + ")",
          {"/model/type", "/model/vocab"});
    if (c.training.seqLen > m.context && m.context >= 1)
      add(out, "/training/seq_len",
          "seq_len (" + std::to_string(c.training.seqLen) + ") must be at most model.context (" +
              std::to_string(m.context) + ")",
          {"/model/type", "/model/context"});
  }
  if (m.type == ModelType::Vit && m.patch >= 1 && m.imageSize >= 1 && !divides(m.patch, m.imageSize))
    add(out, "/model/patch",
        "patch (" + std::to_string(m.patch) + ") must divide image_size (" + std::to_string(m.imageSize) +
            ")",
        {"/model/type", "/model/image_size"});

  const DataKind kind = c.data.kind;
  const std::vector<std::string> pair = {"/model/type", "/data/kind"};
  if (isLanguageModel(m.type) && kind == DataKind::FashionMnist) {
    add(out, "/data/kind",
        "model type " + inQuotes(modelName) +
            " needs data kind \"text\" or \"tokens\", got \"fashion_mnist\"",
        pair);
  } else if (!isLanguageModel(m.type) && kind != DataKind::FashionMnist) {
    add(out, "/data/kind",
        "model type " + inQuotes(modelName) + " needs data kind \"fashion_mnist\", got " +
            inQuotes(toString(kind)),
        pair);
  }
  if (isLanguageModel(m.type) && kind == DataKind::Text && m.vocab != 256 && m.vocab >= 2)
    add(out, "/model/vocab",
        "text data is read as bytes, so vocab must be 256, got " + std::to_string(m.vocab), pair);
  if (!isLanguageModel(m.type) && kind == DataKind::FashionMnist) {
    if ((m.type == ModelType::Vit || m.type == ModelType::Cnn) && m.imageSize != 28 && m.imageSize >= 1)
      add(out, "/model/image_size",
          "fashion_mnist images are 28x28, so image_size must be 28, got " + std::to_string(m.imageSize),
          pair);
    if (m.classes < 10 && m.classes >= 2)
      add(out, "/model/classes",
          "fashion_mnist has 10 classes, so classes must be at least 10, got " + std::to_string(m.classes),
          pair);
  }
}

void checkData(const RunConfig& c, Findings& out) {
  const DataConfig& d = c.data;
  if (d.kind == DataKind::Text && d.files.empty())
    add(out, "/data/files", "text data needs at least one file", {"/data/kind"});
  if (d.kind == DataKind::Tokens && d.train.empty())
    add(out, "/data/train", "token data needs at least one training shard", {"/data/kind"});
  if (d.kind == DataKind::Tokens && d.val.empty())
    add(out, "/data/val", "token data needs at least one validation shard", {"/data/kind"});
}

void checkMeshAndLayout(const RunConfig& c, Findings& out) {
  const ParallelConfig& p = c.parallel;
  int64_t devices = 0;
  bool countsValid = true;  // a count below 1 is reported by its row; the total would only repeat it
  std::map<std::string, size_t> firstNode;
  for (size_t i = 0; i < c.mesh.nodes.size(); ++i) {
    const NodeConfig& n = c.mesh.nodes[i];
    devices += n.count;
    countsValid = countsValid && n.count >= 1;
    if (n.name.empty()) continue;
    const auto [it, inserted] = firstNode.emplace(n.name, i);
    if (!inserted)
      add(out, "/mesh/nodes/" + std::to_string(i) + "/name",
          "duplicate node name " + inQuotes(n.name) + " (also at /mesh/nodes/" + std::to_string(it->second) +
              ")",
          {"/mesh/nodes/" + std::to_string(it->second) + "/name"});
  }
  if (countsValid && p.dp >= 1 && p.tp >= 1 && p.pp >= 1 && p.cp >= 1) {
    const int64_t ranks = p.ranks();
    if (ranks > devices)
      add(out, "/parallel",
          std::string(p.cp > 1 ? "dp * cp * tp * pp = " : "dp * tp * pp = ") + std::to_string(ranks) +
              (ranks == 1 ? " rank" : " ranks") + ", but the mesh has only " + std::to_string(devices) +
              (devices == 1 ? " device" : " devices"),
          p.cp > 1 ? std::vector<std::string>{"/parallel/dp", "/parallel/cp", "/parallel/tp", "/parallel/pp",
                                              "/mesh/nodes"}
                   : std::vector<std::string>{"/parallel/dp", "/parallel/tp", "/parallel/pp", "/mesh/nodes"});
  }
  if (p.dp >= 1 && p.microbatches >= 1 && c.training.batchSize >= 1) {
    const int64_t split = int64_t(p.dp) * p.microbatches;
    if (c.training.batchSize % split != 0)
      add(out, "/training/batch_size",
          "batch_size (" + std::to_string(c.training.batchSize) +
              ") must be divisible by dp * microbatches = " + std::to_string(split),
          {"/parallel/dp", "/parallel/microbatches"});
  }
  if (p.gradPrecision == GradPrecision::Bf16 && p.precision != Precision::Bf16)
    add(out, "/parallel/grad_precision",
        "bf16 gradients need \"precision\": \"bf16\" (an fp32 run keeps fp32 gradients), got precision " +
            inQuotes(toString(p.precision)),
        {"/parallel/precision"});
  if (p.offload != Offload::None && p.precision != Precision::Bf16)
    add(out, "/parallel/offload",
        "offload moves the fp32 master weights (kept apart from the working parameters only in mixed "
        "precision) to the host and needs \"precision\": \"bf16\", got precision " +
            inQuotes(toString(p.precision)),
        {"/parallel/precision"});
  if (p.offload == Offload::Parameters && p.zero != 3)
    add(out, "/parallel/offload",
        "offload \"parameters\" keeps each rank's parameter and gradient SHARDS on the host and needs "
        "\"zero\": 3 (FSDP), got zero " +
            std::to_string(p.zero) + " (\"optimizer\" offloads the optimizer state at any stage)",
        {"/parallel/zero"});
  if (p.overlapParamGather && p.zero != 1 && p.zero != 2)
    add(out, "/parallel/overlap_param_gather",
        "overlapping the parameter all-gather with the next forward needs \"zero\": 1 or 2 (ZeRO 0 "
        "gathers nothing, ZeRO-3 gathers each layer when it runs), got zero " +
            std::to_string(p.zero),
        {"/parallel/zero"});
  if (p.tpCommOverlap && !p.sequenceParallel)
    add(out, "/parallel/tp_comm_overlap",
        "overlapping the tensor-parallel collectives with the GEMMs needs \"sequence_parallel\": true (it "
        "splits the sequence-parallel all-gathers and reduce-scatters into chunks; Megatron-LM asserts the "
        "same for --tp-comm-overlap)",
        {"/parallel/sequence_parallel"});
  if (p.recomputeLayers > 0 && p.recompute != Recompute::Full)
    add(out, "/parallel/recompute_layers",
        "recompute_layers counts fully recomputed blocks per chunk and needs \"recompute\": \"full\", got "
        "recompute " +
            inQuotes(toString(p.recompute)),
        {"/parallel/recompute"});
  if (p.recompute == Recompute::Selective && !isTransformer(c.model.type))
    add(out, "/parallel/recompute",
        std::string("selective recompute re-makes the attention matrix, and ") +
            (c.model.type == ModelType::Mlp ? "an mlp" : "a cnn") +
            " model has no attention; use \"full\" or \"none\"",
        {"/model/type"});
  // A recomputed forward would update the BatchNorm running statistics a second time.
  if (p.recompute == Recompute::Full && c.model.type == ModelType::Cnn)
    add(out, "/parallel/recompute",
        "full recompute would run each BatchNorm forward twice, updating its running statistics twice; a cnn "
        "model takes \"none\"",
        {"/model/type"});
  if (p.batchNorm == BatchNormMode::Sync && c.model.type != ModelType::Cnn)
    add(out, "/parallel/batchnorm",
        "batchnorm \"sync\" synchronises BatchNorm statistics, and only a cnn model has BatchNorm",
        {"/model/type"});
  const std::string schedule = inQuotes(toString(p.schedule));
  const std::vector<std::string> bySchedule = {"/parallel/schedule"};
  if (p.schedule == Schedule::Interleaved1F1B) {
    if (p.virtualChunks < 2 && p.virtualChunks >= 1)
      add(out, "/parallel/virtual_chunks",
          "schedule " + schedule + " needs virtual_chunks >= 2, got " + std::to_string(p.virtualChunks),
          bySchedule);
    if (p.pp < 2 && p.pp >= 1)
      add(out, "/parallel/pp", "schedule " + schedule + " needs pp >= 2, got " + std::to_string(p.pp),
          bySchedule);
  } else if (p.virtualChunks > 1) {
    add(out, "/parallel/virtual_chunks",
        "virtual_chunks must be 1 with schedule " + schedule +
            " (only interleaved_1f1b runs several chunks per "
            "stage), got " +
            std::to_string(p.virtualChunks),
        bySchedule);
  }
}

// The config's own device and link types (unique names that do not shadow the catalog), and the type names
// the nodes and links use (a catalog name or one of the config's own).
void checkHardwareTypes(const RunConfig& c, Findings& out) {
  const MeshConfig& mesh = c.mesh;
  // kind: "device" or "link"; list: "device_types"; names: the config's names in order.
  const auto checkOwn = [&](const char* kind, const std::string& list, const std::vector<std::string>& names,
                            bool (*builtIn)(const std::string&)) {
    std::map<std::string, size_t> first;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string& name = names[i];
      if (name.empty()) continue;  // the row reports it
      const std::string path = "/mesh/" + list + "/" + std::to_string(i) + "/name";
      if (builtIn(name)) {
        add(out, path,
            std::string(kind) + " type " + inQuotes(name) +
                " is already in the hardware catalog; give yours another name (the catalog's figures are "
                "not redefined)");
        continue;
      }
      const auto [it, inserted] = first.emplace(name, i);
      if (!inserted)
        add(out, path,
            "duplicate " + std::string(kind) + " type " + inQuotes(name) + " (also at /mesh/" + list + "/" +
                std::to_string(it->second) + ")",
            {"/mesh/" + list + "/" + std::to_string(it->second) + "/name"});
    }
  };
  std::vector<std::string> ownDevices, ownLinks, profiles;
  for (const auto& t : mesh.deviceTypes) ownDevices.push_back(t.name);
  for (const auto& t : mesh.linkTypes) ownLinks.push_back(t.name);
  for (const auto& t : mesh.profiles) profiles.push_back(t.name);
  checkOwn("device", "device_types", ownDevices,
           [](const std::string& n) { return findDevice(n).has_value(); });
  checkOwn("link", "link_types", ownLinks, [](const std::string& n) { return findLink(n).has_value(); });
  checkOwn("device", "profiles", profiles, [](const std::string& n) { return findDevice(n).has_value(); });
  // A profile's name is a device type too: it must not be one of device_types'.
  for (size_t i = 0; i < profiles.size(); ++i) {
    const auto own = std::find(ownDevices.begin(), ownDevices.end(), profiles[i]);
    if (profiles[i].empty() || own == ownDevices.end()) continue;
    const std::string other = "/mesh/device_types/" + std::to_string(own - ownDevices.begin()) + "/name";
    add(out, "/mesh/profiles/" + std::to_string(i) + "/name",
        "duplicate device type " + inQuotes(profiles[i]) + " (also at " + other + ")", {other});
  }
  ownDevices.insert(ownDevices.end(), profiles.begin(), profiles.end());
  // A profile's links are "<profile>.<link>"; which links the file holds is checked when the mesh is built
  // (plan/hardware.cpp buildMesh), once the file is read.
  for (const auto& t : mesh.profiles)
    for (const std::string* use : {&mesh.intraLink, &mesh.interLink})
      if (!t.name.empty() && use->size() > t.name.size() + 1 &&
          use->compare(0, t.name.size() + 1, t.name + ".") == 0)
        ownLinks.push_back(*use);

  // A name that is neither built in nor the config's own. The finding involves the config's list: an entry
  // of it that failed to parse may be the one this name meant.
  const auto checkUse = [&](const std::string& path, const std::string& name,
                            const std::vector<std::string>& own, const std::vector<std::string>& all,
                            const std::string& list, bool builtIn) {
    if (name.empty() || builtIn || std::find(own.begin(), own.end(), name) != own.end()) return;
    add(out, path, notOneOfMessage(name, all), {"/mesh/" + list});
  };
  const std::vector<std::string> devices = deviceTypeNames(mesh), links = linkTypeNames(mesh);
  for (size_t i = 0; i < mesh.nodes.size(); ++i) {
    const std::string& name = mesh.nodes[i].device;
    checkUse("/mesh/nodes/" + std::to_string(i) + "/device", name, ownDevices, devices, "device_types",
             findDevice(name).has_value());
  }
  checkUse("/mesh/intra_link", mesh.intraLink, ownLinks, links, "link_types",
           findLink(mesh.intraLink).has_value());
  checkUse("/mesh/inter_link", mesh.interLink, ownLinks, links, "link_types",
           findLink(mesh.interLink).has_value());
}

// The placement: every layer once, in model order; stages in [0, pp), each holding virtual_chunks chunks.
void checkPlacement(const RunConfig& c, Findings& out) {
  const ParallelConfig& p = c.parallel;
  const ModelConfig& m = c.model;
  if (p.pp < 1 || p.virtualChunks < 1) return;
  if (isTransformer(m.type) && m.layers < 1) return;
  if (m.type == ModelType::Cnn && (m.channels.empty() || m.blocks < 1)) return;
  const std::vector<std::string> names = modelLayerNames(m);
  const std::vector<std::string> modelFields = {"/model/type", "/model/layers", "/model/hidden",
                                                "/parallel/pp", "/parallel/virtual_chunks"};
  const int64_t chunks = int64_t(p.pp) * p.virtualChunks;
  if (p.placement.empty()) {
    if (chunks > int64_t(names.size()))
      add(out, "/parallel/pp",
          "pp * virtual_chunks = " + std::to_string(chunks) + " chunks, but the model has only " +
              std::to_string(names.size()) + " layers",
          modelFields);
    return;
  }
  std::map<std::string, std::string> placedAt;  // layer name -> path of its first placement
  std::vector<std::string> suggested;           // did-you-mean names: "not placed" would repeat the error
  std::vector<int> chunksOfStage(static_cast<size_t>(p.pp), 0);
  int lastIndex = -1;
  for (size_t i = 0; i < p.placement.size(); ++i) {
    const ChunkPlacement& chunk = p.placement[i];
    const std::string at = "/parallel/placement/" + std::to_string(i);
    if (chunk.stage >= p.pp)  // negative stages fail the field table's range already
      add(out, at + "/stage",
          "stage " + std::to_string(chunk.stage) + " is out of range: pp is " + std::to_string(p.pp) +
              ", so stages are 0 .. " + std::to_string(p.pp - 1),
          {"/parallel/pp"});
    else if (chunk.stage >= 0)
      ++chunksOfStage[static_cast<size_t>(chunk.stage)];
    for (size_t j = 0; j < chunk.layers.size(); ++j) {
      const std::string& name = chunk.layers[j];
      const std::string path = at + "/layers/" + std::to_string(j);
      const auto it = std::find(names.begin(), names.end(), name);
      if (it == names.end()) {
        const std::string close = closestName(name, names);
        suggested.push_back(close);
        add(out, path,
            "unknown layer " + inQuotes(name) +
                (close.empty() ? "; the model's layers are " + names.front() + " .. " + names.back()
                               : "; did you mean " + inQuotes(close) + "?"),
            modelFields);
        continue;
      }
      const int index = static_cast<int>(it - names.begin());
      if (placedAt.count(name)) {
        add(out, path, "layer " + inQuotes(name) + " is placed twice (first at " + placedAt[name] + ")");
        continue;
      }
      if (index < lastIndex)
        add(out, path,
            "layer " + inQuotes(name) + " is out of model order: it comes after " +
                inQuotes(names[static_cast<size_t>(lastIndex)]));
      placedAt[name] = path;
      lastIndex = std::max(lastIndex, index);
    }
  }
  std::string missing;
  for (const auto& name : names)
    if (!placedAt.count(name) && std::find(suggested.begin(), suggested.end(), name) == suggested.end())
      missing += (missing.empty() ? "" : ", ") + name;
  if (!missing.empty()) add(out, "/parallel/placement", "layers not placed: " + missing, modelFields);
  for (int s = 0; s < p.pp; ++s) {
    const int n = chunksOfStage[static_cast<size_t>(s)];
    if (n == 0)
      add(out, "/parallel/placement", "stage " + std::to_string(s) + " holds no chunk", modelFields);
    else if (n != p.virtualChunks)
      add(out, "/parallel/placement",
          "stage " + std::to_string(s) + " holds " + std::to_string(n) + (n == 1 ? " chunk" : " chunks") +
              ", but every stage must hold virtual_chunks = " + std::to_string(p.virtualChunks),
          modelFields);
  }
}

}  // namespace

// Parameter-server mode (engine/runtime/ps/): the workers are the replicas, each holding the whole model and
// computing on its share of every batch; what the collective mode splits or shards is not split here.
void checkParameterServer(const RunConfig& c, Findings& out) {
  const ParallelConfig& p = c.parallel;
  if (p.mode != ParallelMode::ParameterServer) {
    const std::vector<std::string> byMode = {"/parallel/mode"};
    if (p.servers != 1)
      add(out, "/parallel/servers",
          "servers are parameter-server processes and need \"mode\": \"parameter_server\"", byMode);
    if (p.workers != 1)
      add(out, "/parallel/workers",
          "workers are parameter-server processes and need \"mode\": \"parameter_server\" (collective data "
          "parallelism has dp)",
          byMode);
    if (!p.stragglers.empty())
      add(out, "/parallel/stragglers",
          "stragglers slow parameter-server workers and need \"mode\": "
          "\"parameter_server\"",
          byMode);
    return;
  }
  const std::vector<std::string> byMode = {"/parallel/mode"};
  const auto one = [&](const char* path, int v, const char* what) {
    if (v != 1)
      add(out, path,
          std::string("parameter_server mode runs whole-model workers: ") + what + " must be 1, got " +
              std::to_string(v),
          byMode);
  };
  one("/parallel/dp", p.dp, "dp (the workers are the replicas; set parallel.workers)");
  one("/parallel/tp", p.tp, "tp");
  one("/parallel/pp", p.pp, "pp");
  one("/parallel/ep", p.ep, "ep");
  one("/parallel/cp", p.cp, "cp");
  if (p.zero != 0)
    add(out, "/parallel/zero",
        "parameter_server mode shards the model states over the servers; zero must be 0", byMode);
  if (p.offload != Offload::None)
    add(out, "/parallel/offload",
        "the servers hold the optimizer state in host memory already; offload must be "
        "\"none\" in parameter_server mode",
        byMode);
  if (p.gradPrecision != GradPrecision::Fp32)
    add(out, "/parallel/grad_precision",
        "parameter_server workers push fp32 gradients; grad_precision must be "
        "\"fp32\"",
        byMode);
  if (p.sequenceParallel)
    add(out, "/parallel/sequence_parallel",
        "sequence parallelism needs tp > 1, which parameter_server mode "
        "does not run",
        byMode);
  if (p.batchNorm == BatchNormMode::Sync)
    add(out, "/parallel/batchnorm",
        "parameter_server workers do not talk to each other, so BatchNorm "
        "statistics cannot be synchronised; use \"local\"",
        byMode);
  if (p.workers >= 1 && p.microbatches >= 1 && c.training.batchSize >= 1 &&
      c.training.batchSize % (int64_t(p.workers) * p.microbatches) != 0)
    add(out, "/training/batch_size",
        "batch_size (" + std::to_string(c.training.batchSize) +
            ") must be divisible by workers * microbatches = " +
            std::to_string(int64_t(p.workers) * p.microbatches),
        {"/parallel/workers", "/parallel/microbatches"});
  if (p.servers > 1 && c.training.gradClip > 0)
    add(out, "/training/grad_clip",
        "with several servers each applies its shard's updates on its own, so no server knows the global "
        "gradient norm; set grad_clip to 0 or use one server",
        {"/parallel/servers"});
  int64_t devices = 0;
  for (const NodeConfig& n : c.mesh.nodes) devices += n.count;
  if (!c.mesh.nodes.empty() && p.workers > devices)
    add(out, "/parallel/workers",
        std::to_string(p.workers) + " workers, but the mesh has only " + std::to_string(devices) + " devices",
        {"/mesh/nodes"});
  if (!p.serverNodes.empty() && static_cast<int>(p.serverNodes.size()) != p.servers)
    add(out, "/parallel/server_nodes",
        "names " + std::to_string(p.serverNodes.size()) + " node(s) for " + std::to_string(p.servers) +
            " servers; give one node per server, or none",
        {"/parallel/servers"});
  for (size_t i = 0; i < p.serverNodes.size(); ++i) {
    bool found = false;
    for (const NodeConfig& n : c.mesh.nodes) found = found || n.name == p.serverNodes[i];
    if (!found)
      add(out, "/parallel/server_nodes/" + std::to_string(i),
          inQuotes(p.serverNodes[i]) + " is not a node of the mesh", {"/mesh/nodes"});
  }
  std::map<int, size_t> seen;
  for (size_t i = 0; i < p.stragglers.size(); ++i) {
    const Straggler& s = p.stragglers[i];
    const std::string at = "/parallel/stragglers/" + std::to_string(i);
    if (s.worker >= p.workers)
      add(out, at + "/worker",
          "worker " + std::to_string(s.worker) + " does not exist (workers are 0 .. " +
              std::to_string(p.workers - 1) + ")",
          {"/parallel/workers"});
    const auto [it, inserted] = seen.emplace(s.worker, i);
    if (!inserted)
      add(out, at + "/worker",
          "worker " + std::to_string(s.worker) + " is already slowed at /parallel/stragglers/" +
              std::to_string(it->second));
  }
}

std::vector<ConfigFinding> checkRunConfig(const RunConfig& config) {
  Findings out;
  checkFields(runConfigFields(), "", config, 0, out);
  checkModel(config, out);
  checkData(config, out);
  checkHardwareTypes(config, out);
  checkMeshAndLayout(config, out);
  checkPlacement(config, out);
  checkParameterServer(config, out);
  return out;
}

ConfigErrors validateRunConfig(const RunConfig& config) {
  ConfigErrors errors;
  for (auto& finding : checkRunConfig(config)) errors.push_back(std::move(finding.error));
  return errors;
}

}  // namespace ms
