// Hugging Face model configs (a checkpoint's config.json) as MeshStudio model configs: GPT-2 ("gpt2") as gpt,
// Llama, Mistral and Qwen2 ("llama", "mistral", "qwen2") as llama, by the fields those configs document
// (transformers' GPT2Config, LlamaConfig, MistralConfig, Qwen2Config). What maps approximately is said in
// warnings (Qwen2's q/k/v biases, Mistral's sliding window, RoPE scaling); what cannot map is an error naming
// the field: an unknown model_type, a head size other than width / heads, a GPT-2 MLP width that is not a
// multiple of the width, and the mixture-of-experts configs other than Mixtral's (Qwen2-MoE, DeepSeek-V3:
// their shared experts, first dense blocks and expert widths are not read yet).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "plan/run_config.h"

namespace ms {

struct HfImport {
  ModelConfig model;
  int maxPositions = 0;               // max_position_embeddings / n_positions (the model's context)
  std::vector<std::string> warnings;  // what the import approximates, one sentence each
};

// The model section for a Hugging Face config. `file` names the config in errors ("config.json: /num_..."):
// each error names the file, the field (a JSON path) and the reason.
Expected<HfImport> importHfConfig(const nlohmann::json& hf, const std::string& file);

// A whole run config around an imported model: `base` (a project or template) with its model replaced, its
// seq_len capped at the model's context, and its name (when `name` is not empty) set.
Expected<RunConfig> runConfigFromHf(const HfImport& imported, RunConfig base, const std::string& name);

}  // namespace ms
