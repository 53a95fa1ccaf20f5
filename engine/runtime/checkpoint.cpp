// Checkpoint directories; see checkpoint.h.
#include "runtime/checkpoint.h"

#include <cstdio>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "runtime/file_io.h"
#include "runtime/safetensors.h"

namespace ms {

namespace fs = std::filesystem;

std::string checkpointDirName(const std::string& runDir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return (fs::path(runDir) / "checkpoints" / name).string();
}

Status saveCheckpoint(const std::string& dir, const RunConfig& config, const ParameterStore& params,
                      const Optimizer* optimizer, const CheckpointInfo& info) {
  const std::string staging = dir + ".partial";
  std::error_code ec;
  fs::remove_all(staging, ec);
  MS_TRY(makeDirs(staging));
  std::vector<NamedTensor> tensors;
  for (const Parameter& p : params.params())
    tensors.push_back({p.spec.name, p.spec.shape, DType::F32, params.values() + p.offset});
  MS_TRY(writeSafetensors(staging + "/model.safetensors", tensors,
                          {{"format", "pt"}, {"model", toString(config.model.type)}}));
  if (optimizer) {
    MS_TRY(writeSafetensors(staging + "/optimizer.safetensors", optimizer->stateTensors(),
                            {{"optimizer", toString(config.optimizer.type)}}));
  }
  const nlohmann::json state = {
      {"step", info.step},
      {"optimizer_steps", info.optimizerSteps},
      {"seed", info.seed},
      // Every random draw is a pure function of (seed, step, index), so the generator's position is the step.
      {"rng", {{"kind", "counter"}, {"seed", info.seed}, {"next_step", info.step}}},
      {"optimizer", toString(config.optimizer.type)},
      {"name", config.name}};
  MS_TRY(writeFileAtomic(staging + "/state.json", state.dump(2) + "\n"));
  MS_TRY(writeFileAtomic(staging + "/config.json", toJson(config).dump(2) + "\n"));
  MS_TRY(makeDirs(fs::path(dir).parent_path().string()));
  return replaceDirectory(staging, dir);
}

namespace {

// Hugging Face GPT-2 files may carry these; they are not parameters.
bool isIgnorableExtra(const std::string& name) {
  auto endsWith = [&](const char* s) {
    const size_t n = std::strlen(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  return endsWith(".attn.bias") || endsWith(".attn.masked_bias") || name == "lm_head.weight";
}

std::string stripPrefix(const std::string& name) {
  const std::string prefix = "transformer.";
  return name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
}

std::string shapeString(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

}  // namespace

Status loadWeights(const std::string& dirOrFile, ParameterStore& params) {
  const std::string file =
      fs::is_directory(dirOrFile) ? (fs::path(dirOrFile) / "model.safetensors").string() : dirOrFile;
  auto data = readSafetensors(file);
  if (!data) return data.status();
  std::map<std::string, const LoadedTensor*> byName;
  for (const auto& [name, t] : data->tensors) byName[stripPrefix(name)] = &t;
  for (const Parameter& p : params.params()) {
    auto it = byName.find(p.spec.name);
    if (it == byName.end()) return Status::error(file + ": no tensor \"" + p.spec.name + "\"");
    const LoadedTensor& t = *it->second;
    if (t.shape != p.spec.shape)
      return Status::error(file + ": tensor \"" + p.spec.name + "\" has shape " + shapeString(t.shape) +
                           ", the model needs " + shapeString(p.spec.shape));
    if (t.f32.size() != p.numel)
      return Status::error(file + ": tensor \"" + p.spec.name + "\" is not a float tensor");
    std::memcpy(params.values() + p.offset, t.f32.data(), p.numel * sizeof(float));
  }
  for (const auto& [name, t] : byName) {
    if (!params.find(name) && !isIgnorableExtra(name))
      return Status::error(file + ": tensor \"" + name + "\" is not a parameter of this model");
  }
  return Status::ok();
}

Expected<CheckpointInfo> loadCheckpoint(const std::string& dir, const RunConfig& config,
                                        ParameterStore& params, Optimizer& optimizer) {
  auto stateText = readFile(dir + "/state.json");
  if (!stateText) return stateText.status();
  CheckpointInfo info;
  try {
    const auto state = nlohmann::json::parse(*stateText);
    info.step = state.at("step").get<int64_t>();
    info.optimizerSteps = state.at("optimizer_steps").get<int64_t>();
    info.seed = state.at("seed").get<uint64_t>();
    if (state.at("optimizer").get<std::string>() != toString(config.optimizer.type))
      return Status::error(dir + "/state.json: the checkpoint's optimizer is " +
                           state.at("optimizer").dump() + ", the config asks for \"" +
                           toString(config.optimizer.type) + "\"");
  } catch (const std::exception& e) {
    return Status::error(dir + "/state.json: malformed: " + e.what());
  }
  if (info.seed != config.seed)
    return Status::error(dir + ": checkpoint seed " + std::to_string(info.seed) +
                         " differs from the config's seed " + std::to_string(config.seed) +
                         " (the data order would differ)");
  MS_TRY(loadWeights(dir, params));
  auto opt = readSafetensors(dir + "/optimizer.safetensors");
  if (!opt) return opt.status();
  MS_TRY(optimizer.loadState(*opt, info.optimizerSteps).withContext(dir + "/optimizer.safetensors"));
  return info;
}

Expected<std::string> latestCheckpoint(const std::string& runDir) {
  const fs::path root = fs::path(runDir) / "checkpoints";
  std::error_code ec;
  std::string best;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("step-", 0) != 0 || name.find('.') != std::string::npos) continue;
    if (!fs::exists(entry.path() / "state.json")) continue;
    if (name > best) best = name;
  }
  if (best.empty()) return Status::error(root.string() + ": no checkpoint to resume from");
  return (root / best).string();
}

}  // namespace ms
