// A plan handed to the frameworks clusters run, and their launch files read back as plans: Megatron-LM
// (`pretrain_gpt.py` flags in a torchrun script), torchtitan (a v0.2 job TOML) and DeepSpeed (a config JSON).
//
// What each target can say is checked against the flags and keys the framework documents, kept as data with
// the version and source of each (resources/frameworks/*.json, written by scripts/framework_flags.py from the
// frameworks' own sources): an exporter only writes documented names, and an importer lists every name it
// does not know (`unknown`: a typo, or a newer version) apart from documented ones the plan has no place for
// (`notCarried`). Nothing is dropped or changed silently: what the target cannot express is listed, and what
// an import had to assume (the device type, the data) is listed too.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "plan/run_config.h"

namespace ms {

enum class Framework { Megatron, Torchtitan, DeepSpeed };

// "megatron", "torchtitan", "deepspeed" (also "megatron-lm"); nullopt for anything else.
std::optional<Framework> frameworkFromName(std::string_view name);
const char* frameworkName(Framework f);     // "megatron"
const char* frameworkDisplay(Framework f);  // "Megatron-LM"

// The documented flags (Megatron: "--tensor-model-parallel-size") or keys (torchtitan: "parallelism.
// tensor_parallel_degree"; DeepSpeed: "zero_optimization.stage") of a framework, with the version and commit
// they were read at: resources/frameworks/<name>.json, built into the library.
struct FrameworkVocabulary {
  std::string framework, version, commit, commitDate;
  std::vector<std::string> names;  // sorted
  nlohmann::json document;         // the whole file (model flavors, schedules, launcher flags)
  bool knows(const std::string& name) const;
  bool takesValue(const std::string& name) const;  // Megatron flags: false for store_true / store_false
};
const FrameworkVocabulary& frameworkVocabulary(Framework f);

struct FrameworkFile {
  std::string name;  // relative path inside the export folder: "megatron/pretrain_gpt.sh"
  std::string text;
  bool executable = false;
};

struct FrameworkExport {
  Framework target = Framework::Megatron;
  std::vector<FrameworkFile> files;
  // What of the plan the target cannot express, one sentence each, saying what was written instead. Also
  // written as comments at the top of the main file.
  std::vector<std::string> notCarried;
  // Every flag or key written (the names checked against the vocabulary).
  std::vector<std::string> namesWritten;
};

// The plan as the target's launch files. Errors (nothing to write): a plan the target cannot run at all
// (a parameter-server plan; a vit, cnn or mlp model for Megatron-LM and torchtitan, which train language
// models), naming the field.
Expected<FrameworkExport> exportForFramework(const RunConfig& config, Framework target);
// Writes the files into dir (created when missing); errors name the file.
Status writeFrameworkExport(const FrameworkExport& exported, const std::string& dir);

// What an import needs beyond the framework's files: what the files do not say.
struct ImportOptions {
  std::string device = "h100";    // the device type of every node (a catalog name or the base's type)
  int nodes = 0;                  // 0: from the launcher words (torchrun --nnodes, #SBATCH --nodes), else 1
  int devicesPerNode = 0;         // 0: from the launcher words (--nproc_per_node, --gpus-per-node), else 8
  std::optional<RunConfig> base;  // when set: its data, mesh links and run settings fill what the files omit
  std::string name;               // the run's name (default: the file's stem)
  // Flags of another tool in a Megatron-style launch that the caller reads itself (DeepSpeed's), each with
  // whether it takes a value: neither flags of the plan nor unknown.
  std::map<std::string, bool> ignoreFlags;
};

struct FrameworkImport {
  RunConfig config;
  std::vector<std::string> unknown;     // flags or keys the framework does not document (as written)
  std::vector<std::string> notCarried;  // documented ones the plan has no place for, with their values
  std::vector<std::string> assumed;     // what the plan needed and the files did not say, and what was taken
};

// A Megatron-LM launch: a bash script (torchrun/srun/python line with the flags, arrays and variables as the
// examples write them), a plain command line, or an arguments file (one or more flags a line).
Expected<FrameworkImport> importMegatron(const std::string& text, const ImportOptions& options);
// A torchtitan job TOML (v0.2's JobConfig), with an optional launcher script for the node and GPU counts.
Expected<FrameworkImport> importTorchtitan(const std::string& toml, const std::string& launcher,
                                           const ImportOptions& options);
// A DeepSpeed config JSON; the model it trains comes from `modelArgs` (Megatron-style flags, as Megatron-
// DeepSpeed scripts pass them) or from a Hugging Face config.json (`hfConfig`), one of them required.
Expected<FrameworkImport> importDeepSpeed(const std::string& json, const std::string& modelArgs,
                                          const std::string& hfConfig, const ImportOptions& options);

// A torchtitan llama3 flavor ("8B", "70B", ...) as a model config, from the flavors the vocabulary lists
// (resources/frameworks/torchtitan.json); nullopt for an unknown model or flavor.
std::optional<ModelConfig> torchtitanFlavor(const std::string& modelName, const std::string& flavor);

}  // namespace ms
