// Hugging Face config.json -> model config; see hf_import.h. Field names are those transformers documents
// for each configuration class; defaults are those classes' defaults where a config may omit a field.
#include "plan/hf_import.h"

#include <algorithm>
#include <cmath>

namespace ms {
namespace {

using nlohmann::json;

// Reads the integer field `key` (the first of `keys` present), or `fallback` when absent and fallback >= 0.
class Reader {
 public:
  Reader(const json& hf, std::string file) : m_hf(hf), m_file(std::move(file)) {}

  Status integer(std::initializer_list<const char*> keys, int& out, int fallback = -1, int min = 1) const {
    for (const char* k : keys) {
      if (!m_hf.contains(k) || m_hf[k].is_null()) continue;
      const json& v = m_hf[k];
      if (!v.is_number_integer() || v.get<int64_t>() < min || v.get<int64_t>() > (int64_t(1) << 30))
        return error(k, "must be an integer of at least " + std::to_string(min) + ", got " + v.dump());
      out = v.get<int>();
      return Status::ok();
    }
    if (fallback >= 0) {
      out = fallback;
      return Status::ok();
    }
    return error(*keys.begin(), "is missing");
  }
  Status number(const char* key, double& out, double fallback) const {
    if (!m_hf.contains(key) || m_hf[key].is_null()) {
      out = fallback;
      return Status::ok();
    }
    const json& v = m_hf[key];
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
      return error(key, "must be a positive number, got " + v.dump());
    out = v.get<double>();
    return Status::ok();
  }
  Status boolean(const char* key, bool& out, bool fallback) const {
    if (!m_hf.contains(key) || m_hf[key].is_null()) {
      out = fallback;
      return Status::ok();
    }
    if (!m_hf[key].is_boolean()) return error(key, "must be true or false, got " + m_hf[key].dump());
    out = m_hf[key].get<bool>();
    return Status::ok();
  }
  bool has(const char* key) const { return m_hf.contains(key) && !m_hf[key].is_null(); }
  const json& at(const char* key) const { return m_hf[key]; }
  Status error(const std::string& key, const std::string& why) const {
    return Status::error(m_file + ": /" + key + ": " + why);
  }

 private:
  const json& m_hf;
  std::string m_file;
};

Status gpt2(const Reader& r, HfImport& out) {
  ModelConfig& m = out.model;
  m.type = ModelType::Gpt;
  MS_TRY(r.integer({"n_layer", "num_hidden_layers"}, m.layers));
  MS_TRY(r.integer({"n_embd", "hidden_size"}, m.width));
  MS_TRY(r.integer({"n_head", "num_attention_heads"}, m.heads));
  MS_TRY(r.integer({"vocab_size"}, m.vocab, 50257, 2));
  MS_TRY(r.integer({"n_positions", "max_position_embeddings"}, m.context, 1024));
  int inner = 0;
  MS_TRY(r.integer({"n_inner"}, inner, 4 * m.width));
  if (inner % m.width != 0)
    return r.error("n_inner", "the MLP width " + std::to_string(inner) + " is not a multiple of n_embd (" +
                                  std::to_string(m.width) + "); gpt's MLP is mlp_ratio * width");
  m.mlpRatio = inner / m.width;
  MS_TRY(r.number("layer_norm_epsilon", m.layerNormEps, 1e-5));
  MS_TRY(r.number("initializer_range", m.initStd, 0.02));
  MS_TRY(r.boolean("tie_word_embeddings", m.tieEmbeddings, true));
  if (r.has("activation_function") && r.at("activation_function") != "gelu_new")
    out.warnings.push_back("activation_function " + r.at("activation_function").dump() +
                           ": gpt uses the tanh GELU (\"gelu_new\")");
  out.maxPositions = m.context;
  return Status::ok();
}

Status llama(const Reader& r, const std::string& type, HfImport& out) {
  ModelConfig& m = out.model;
  m.type = ModelType::Llama;
  MS_TRY(r.integer({"num_hidden_layers"}, m.layers));
  MS_TRY(r.integer({"hidden_size"}, m.width));
  MS_TRY(r.integer({"num_attention_heads"}, m.heads));
  MS_TRY(r.integer({"num_key_value_heads"}, m.kvHeads, m.heads));
  int ffn = 0;
  MS_TRY(r.integer({"intermediate_size"}, ffn));
  m.ffnHidden = ffn;
  MS_TRY(r.integer({"vocab_size"}, m.vocab, 32000, 2));
  MS_TRY(r.integer({"max_position_embeddings"}, m.context, 2048));
  MS_TRY(r.number("rope_theta", m.ropeTheta, 10000.0));
  MS_TRY(r.number("rms_norm_eps", m.layerNormEps, 1e-6));
  MS_TRY(r.number("initializer_range", m.initStd, 0.02));
  MS_TRY(r.boolean("tie_word_embeddings", m.tieEmbeddings, false));
  if (m.width % m.heads != 0)
    return r.error("num_attention_heads", "hidden_size (" + std::to_string(m.width) +
                                              ") is not a multiple of the heads (" + std::to_string(m.heads) +
                                              ")");
  int headDim = m.width / m.heads;
  MS_TRY(r.integer({"head_dim"}, headDim, headDim));
  if (headDim != m.width / m.heads)
    return r.error("head_dim", "a head size of " + std::to_string(headDim) + " differs from hidden_size / " +
                                   "num_attention_heads (" + std::to_string(m.width / m.heads) +
                                   "), which the llama model assumes");
  if (m.heads % m.kvHeads != 0)
    return r.error(
        "num_key_value_heads",
        std::to_string(m.kvHeads) + " does not divide num_attention_heads (" + std::to_string(m.heads) + ")");
  if (m.kvHeads == m.heads) m.kvHeads = 0;  // multi-head attention: the config's default
  if (r.has("hidden_act") && r.at("hidden_act") != "silu")
    return r.error("hidden_act", "the llama MLP is SwiGLU (silu), got " + r.at("hidden_act").dump());
  if (r.has("rope_scaling"))
    out.warnings.push_back("rope_scaling " + r.at("rope_scaling").dump() +
                           " is not modelled: rotary angles are unscaled (the costs do not depend on it)");
  bool bias = type == "qwen2";
  if (r.has("attention_bias") && r.at("attention_bias").is_boolean())
    bias = r.at("attention_bias").get<bool>();
  if (bias)
    out.warnings.push_back(
        "the q, k and v projections' biases are not modelled (" +
        std::to_string(int64_t(m.width) + 2 * int64_t(m.kvHeadCount()) * (m.width / m.heads)) +
        " parameters a layer)");
  if (r.has("mlp_bias") && r.at("mlp_bias") == true)
    out.warnings.push_back("the MLP biases are not modelled");
  if (r.has("sliding_window") && !r.at("sliding_window").is_null() &&
      !(r.has("use_sliding_window") && r.at("use_sliding_window") == false))
    out.warnings.push_back("sliding_window " + r.at("sliding_window").dump() +
                           ": attention is costed and run over the whole sequence");
  out.maxPositions = m.context;
  return Status::ok();
}

}  // namespace

Expected<HfImport> importHfConfig(const nlohmann::json& hf, const std::string& file) {
  if (!hf.is_object()) return Status::error(file + ": a Hugging Face config must be a JSON object");
  const Reader r(hf, file);
  if (!hf.contains("model_type") || !hf["model_type"].is_string())
    return r.error("model_type", "is missing (a Hugging Face config.json names its model_type)");
  const std::string type = hf["model_type"].get<std::string>();
  HfImport out;
  if (type == "gpt2") {
    MS_TRY(gpt2(r, out));
  } else if (type == "llama" || type == "mistral" || type == "qwen2") {
    MS_TRY(llama(r, type, out));
  } else if (type == "mixtral") {
    // Mixtral (Jiang et al. 2024): Mistral's blocks with every MLP a mixture of num_local_experts SwiGLU
    // experts of intermediate_size, top num_experts_per_tok routing, no shared experts.
    MS_TRY(llama(r, type, out));
    ModelConfig& m = out.model;
    MS_TRY(r.integer({"num_local_experts"}, m.experts));
    MS_TRY(r.integer({"num_experts_per_tok"}, m.expertsPerToken, 2));
    if (m.expertsPerToken > m.experts)
      return r.error("num_experts_per_tok", "exceeds num_local_experts (" + std::to_string(m.experts) + ")");
    MS_TRY(r.number("router_aux_loss_coef", m.auxLossCoef, 0.001));
    out.warnings.push_back(
        "the experts' checkpoint names are DeepSeek-V3's (mlp.experts.E.gate_proj), not "
        "Mixtral's (block_sparse_moe.experts.E.w1)");
  } else if (type == "qwen2_moe" || type == "qwen3_moe" || type == "deepseek_v3" || type == "deepseek_v2" ||
             hf.contains("num_local_experts") || hf.contains("n_routed_experts")) {
    return r.error("model_type",
                   "\"" + type +
                       "\" is a mixture-of-experts model MeshStudio does not import yet (of those, "
                       "only mixtral)");
  } else {
    return r.error("model_type",
                   "\"" + type + "\" is not one MeshStudio imports (gpt2, llama, mistral, qwen2, mixtral)");
  }
  return out;
}

Expected<RunConfig> runConfigFromHf(const HfImport& imported, RunConfig base, const std::string& name) {
  base.model = imported.model;
  base.training.seqLen = std::min(base.training.seqLen, std::max(1, imported.maxPositions));
  if (!name.empty()) base.name = name;
  // Text data is bytes: a model of another vocabulary needs token shards (the config check says so too).
  return parseRunConfig(toJson(base));
}

}  // namespace ms
