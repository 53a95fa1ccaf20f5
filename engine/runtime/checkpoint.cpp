// Checkpoint directories; see checkpoint.h.
#include "runtime/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "plan/plan.h"
#include "runtime/file_io.h"
#include "runtime/pipeline.h"
#include "runtime/safetensors.h"

namespace ms {

namespace fs = std::filesystem;

std::string checkpointDirName(const std::string& runDir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return (fs::path(runDir) / "checkpoints" / name).string();
}

namespace {

Status writeStateFiles(const std::string& staging, const RunConfig& config, const CheckpointInfo& info) {
  const nlohmann::json state = {
      {"step", info.step},
      {"optimizer_steps", info.optimizerSteps},
      {"seed", info.seed},
      // Every random draw is a pure function of (seed, step, index), so the generator's position is the step.
      {"rng", {{"kind", "counter"}, {"seed", info.seed}, {"next_step", info.step}}},
      {"optimizer", toString(config.optimizer.type)},
      {"name", config.name}};
  MS_TRY(writeFileAtomic(staging + "/state.json", state.dump(2) + "\n"));
  return writeFileAtomic(staging + "/config.json", toJson(config).dump(2) + "\n");
}

// manifest.json, written last into the staging directory: every other file's size and SHA-256 and the step.
// A checkpoint is whole when its files match it; loading checks that before it reads a byte of them, so a
// file changed, cut or swapped after it was written is refused by name (issue 18).
constexpr const char* kManifest = "manifest.json";
constexpr int kManifestVersion = 1;

Status writeManifest(const std::string& staging, int64_t step) {
  nlohmann::json files = nlohmann::json::object();
  for (const char* name : {"model.safetensors", "optimizer.safetensors", "state.json", "config.json"}) {
    const std::string path = staging + "/" + name;
    std::error_code ec;
    if (!fs::exists(path, ec)) continue;
    auto d = fileDigest(path);
    if (!d) return d.status();
    files[name] = {{"bytes", d->bytes}, {"sha256", d->sha256}};
  }
  const nlohmann::json manifest = {
      {"format", "meshstudio-checkpoint"}, {"version", kManifestVersion}, {"step", step}, {"files", files}};
  return writeFileAtomic(staging + "/" + kManifest, manifest.dump(2) + "\n");
}

// The step a checkpoint directory's name says ("step-00000010" -> 10), or -1 for another name.
int64_t stepOfDirName(const std::string& dir) {
  const std::string name = fs::path(dir).filename().string();
  if (name.size() != 13 || name.rfind("step-", 0) != 0) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

}  // namespace

Status verifyCheckpoint(const std::string& dir, const std::vector<std::string>& required) {
  const std::string manifestPath = dir + "/" + kManifest;
  auto text = readFile(manifestPath);
  if (!text)
    return Status::error(dir + ": no " + kManifest + ": not a complete checkpoint (" + text.message() + ")");
  nlohmann::json manifest;
  int64_t step = -1;
  try {
    manifest = nlohmann::json::parse(*text);
    if (manifest.at("format") != "meshstudio-checkpoint" || manifest.at("version") != kManifestVersion)
      return Status::error(manifestPath + ": not a version " + std::to_string(kManifestVersion) +
                           " meshstudio-checkpoint manifest");
    step = manifest.at("step").get<int64_t>();
    (void)manifest.at("files").items();
  } catch (const std::exception& e) {
    return Status::error(manifestPath + ": malformed: " + e.what());
  }
  const nlohmann::json& files = manifest["files"];
  for (const std::string& name : required)
    if (!files.contains(name))
      return Status::error(manifestPath + ": lists no " + name + ": the checkpoint lacks it");
  for (const auto& [name, entry] : files.items()) {
    const std::string path = dir + "/" + name;
    uint64_t bytes = 0;
    std::string sha;
    try {
      bytes = entry.at("bytes").get<uint64_t>();
      sha = entry.at("sha256").get<std::string>();
    } catch (const std::exception& e) {
      return Status::error(manifestPath + ": malformed entry for " + name + ": " + e.what());
    }
    auto d = fileDigest(path);
    if (!d) return Status::error(path + ": listed in the checkpoint's manifest, but " + d.message());
    if (d->bytes != bytes)
      return Status::error(path + ": damaged: " + std::to_string(d->bytes) + " bytes, the manifest says " +
                           std::to_string(bytes));
    if (d->sha256 != sha)
      return Status::error(path +
                           ": damaged: its SHA-256 differs from the manifest's (changed after it was "
                           "written)");
  }
  const int64_t named = stepOfDirName(dir);
  if (named >= 0 && named != step)
    return Status::error(manifestPath + ": step " + std::to_string(step) + ", but the directory is " +
                         fs::path(dir).filename().string());
  return Status::ok();
}

namespace {

Expected<CheckpointInfo> readState(const std::string& dir, const RunConfig& config) {
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
  return info;
}

}  // namespace

namespace {

Status saveCheckpointTo(const std::string& staging, const std::string& dir, const RunConfig& config,
                        const ParameterStore& params, const Optimizer* optimizer, const CheckpointInfo& info,
                        const std::vector<LayerBuffer>& buffers);

// The buffers' values on the host, one vector each, in order.
std::vector<std::vector<float>> downloadBuffers(Backend& be, const std::vector<LayerBuffer>& buffers) {
  std::vector<std::vector<float>> values;
  for (const LayerBuffer& b : buffers) {
    values.emplace_back(static_cast<size_t>(b.spec->numel()));
    be.download(values.back().data(), b.data, values.back().size() * sizeof(float));
  }
  return values;
}

// Sets each buffer from the tensor of its name in a loaded model.safetensors (file: for the errors).
Status loadBuffers(Backend& be, const std::map<std::string, const LoadedTensor*>& byName,
                   const std::vector<LayerBuffer>& buffers, const std::string& file);

}  // namespace

Status saveCheckpoint(const std::string& dir, const RunConfig& config, const ParameterStore& params,
                      const Optimizer* optimizer, const CheckpointInfo& info,
                      const std::vector<LayerBuffer>& buffers) {
  const std::string staging = dir + ".partial";
  std::error_code ec;
  fs::remove_all(staging, ec);
  Status s = saveCheckpointTo(staging, dir, config, params, optimizer, info, buffers);
  if (!s) fs::remove_all(staging, ec);  // a failed write (a full disk) leaves no half checkpoint behind
  return s;
}

namespace {

Status saveCheckpointTo(const std::string& staging, const std::string& dir, const RunConfig& config,
                        const ParameterStore& params, const Optimizer* optimizer, const CheckpointInfo& info,
                        const std::vector<LayerBuffer>& buffers) {
  MS_TRY(makeDirs(staging));
  // The fp32 values (mixed precision: the master weights), unit by unit (an unsharded store: nothing here is
  // collective).
  std::vector<float> values(params.size()), unit;
  for (size_t u = 0; u < params.units().size(); ++u) {
    MS_TRY(const_cast<ParameterStore&>(params).unitValues(static_cast<int>(u), unit));
    std::copy(unit.begin(), unit.end(), values.begin() + params.units()[u].begin);
  }
  std::vector<NamedTensor> tensors;
  for (const Parameter& p : params.params())
    tensors.push_back({p.spec.name, p.spec.shape, DType::F32, values.data() + p.offset});
  const std::vector<std::vector<float>> bufferValues = downloadBuffers(params.backend(), buffers);
  for (size_t i = 0; i < buffers.size(); ++i)
    tensors.push_back({buffers[i].spec->name, buffers[i].spec->shape, DType::F32, bufferValues[i].data()});
  MS_TRY(writeSafetensors(staging + "/model.safetensors", tensors,
                          {{"format", "pt"}, {"model", toString(config.model.type)}}));
  if (optimizer) {
    std::vector<std::vector<float>> state;
    MS_TRY(writeSafetensors(staging + "/optimizer.safetensors", optimizer->stateTensors(state),
                            {{"optimizer", toString(config.optimizer.type)}}));
  }
  MS_TRY(writeStateFiles(staging, config, info));
  MS_TRY(writeManifest(staging, info.step));
  MS_TRY(makeDirs(fs::path(dir).parent_path().string()));
  return replaceDirectory(staging, dir);
}

}  // namespace

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

namespace {

Status loadBuffers(Backend& be, const std::map<std::string, const LoadedTensor*>& byName,
                   const std::vector<LayerBuffer>& buffers, const std::string& file) {
  for (const LayerBuffer& b : buffers) {
    auto it = byName.find(b.spec->name);
    if (it == byName.end()) return Status::error(file + ": no tensor \"" + b.spec->name + "\"");
    const LoadedTensor& t = *it->second;
    if (t.shape != b.spec->shape || t.f32.size() != static_cast<size_t>(b.spec->numel()))
      return Status::error(file + ": tensor \"" + b.spec->name + "\" is not a float tensor of shape " +
                           shapeString(b.spec->shape));
  }
  for (const LayerBuffer& b : buffers) {
    const LoadedTensor& t = *byName.at(b.spec->name);
    be.upload(b.data, t.f32.data(), t.f32.size() * sizeof(float));
  }
  return Status::ok();
}

bool isBufferName(const std::string& name, const std::vector<LayerBuffer>& buffers) {
  for (const LayerBuffer& b : buffers)
    if (b.spec->name == name) return true;
  return false;
}

}  // namespace

Status loadWeights(const std::string& dirOrFile, ParameterStore& params,
                   const std::vector<LayerBuffer>& buffers) {
  const bool dir = fs::is_directory(dirOrFile);
  const std::string file = dir ? (fs::path(dirOrFile) / "model.safetensors").string() : dirOrFile;
  // A directory with a manifest is a checkpoint: verified first. One without is someone else's weights (a
  // Hugging Face download), read as they are.
  std::error_code ec;
  if (dir && fs::exists(fs::path(dirOrFile) / kManifest, ec))
    MS_TRY(verifyCheckpoint(dirOrFile, {"model.safetensors"}));
  auto data = readSafetensors(file);
  if (!data) return data.status();
  std::map<std::string, const LoadedTensor*> byName;
  for (const auto& [name, t] : data->tensors) byName[stripPrefix(name)] = &t;
  // Checked whole before anything is written; then set unit by unit (mixed precision: master weights and
  // their bf16 working copy).
  std::vector<float> values(params.size(), 0.0f);
  for (const Parameter& p : params.params()) {
    auto it = byName.find(p.spec.name);
    if (it == byName.end()) return Status::error(file + ": no tensor \"" + p.spec.name + "\"");
    const LoadedTensor& t = *it->second;
    if (t.shape != p.spec.shape)
      return Status::error(file + ": tensor \"" + p.spec.name + "\" has shape " + shapeString(t.shape) +
                           ", the model needs " + shapeString(p.spec.shape));
    if (t.f32.size() != p.numel)
      return Status::error(file + ": tensor \"" + p.spec.name + "\" is not a float tensor");
    std::copy(t.f32.begin(), t.f32.end(), values.begin() + p.offset);
  }
  for (const auto& [name, t] : byName) {
    if (!params.find(name) && !isIgnorableExtra(name) && !isBufferName(name, buffers))
      return Status::error(file + ": tensor \"" + name + "\" is not a parameter of this model");
  }
  MS_TRY(loadBuffers(params.backend(), byName, buffers, file));
  for (size_t u = 0; u < params.units().size(); ++u)
    params.setUnitValues(static_cast<int>(u), values.data() + params.units()[u].begin);
  return Status::ok();
}

Expected<CheckpointInfo> loadCheckpoint(const std::string& dir, const RunConfig& config,
                                        ParameterStore& params, Optimizer& optimizer,
                                        const std::vector<LayerBuffer>& buffers) {
  MS_TRY(verifyCheckpoint(dir, kResumeFiles));
  auto state = readState(dir, config);
  if (!state) return state.status();
  const CheckpointInfo info = *state;
  MS_TRY(loadWeights(dir, params, buffers));
  auto opt = readSafetensors(dir + "/optimizer.safetensors");
  if (!opt) return opt.status();
  MS_TRY(optimizer.loadState(*opt, info.optimizerSteps).withContext(dir + "/optimizer.safetensors"));
  return info;
}

namespace {

// A rank's local data as full-unit arrays: values, then each optimizer state, unit after unit (its flat local
// index space, repeated 1 + states times). Collective over the data-parallel group.
Status packRank(ParameterStore& params, Optimizer& optimizer, std::vector<float>& out) {
  const size_t total = params.size();
  const size_t states = optimizer.stateSuffixes().size();
  out.assign(total * (1 + states), 0.0f);
  std::vector<float> unit;
  for (size_t ui = 0; ui < params.units().size(); ++ui) {
    const int u = static_cast<int>(ui);
    const Unit& U = params.units()[ui];
    MS_TRY(params.unitValues(u, unit));
    std::copy(unit.begin(), unit.end(), out.begin() + U.begin);
    for (size_t w = 0; w < states; ++w) {
      float* dst = out.data() + total * (1 + w) + U.begin;
      MS_TRY(params.gatherOwnedState(u, optimizer.ownedState(static_cast<int>(w), u), dst));
    }
  }
  return Status::ok();
}

}  // namespace

Status saveCheckpointSharded(const std::string& dir, const Plan& plan, RankGroups& groups,
                             ParameterStore& params, Optimizer& optimizer, const CheckpointInfo& info,
                             const std::vector<LayerBuffer>& buffers) {
  const RunConfig& config = plan.config;
  Communicator* world = groups.world;
  const int W = world ? world->size() : 1;
  const bool lead = groups.rank == 0;
  std::vector<float> mine;
  Status s = packRank(params, optimizer, mine);
  const auto suffixes = optimizer.stateSuffixes();
  std::map<std::string, std::vector<float>> full;  // rank 0: name -> full tensor
  std::vector<const ParamSpec*> order;             // model order
  const int tag = 77;
  if (s && lead) {
    for (const LayerSpec& l : plan.model.layers)
      for (const ParamSpec& p : l.params) {
        order.push_back(&p);
        full[p.name].assign(static_cast<size_t>(p.numel()), 0.0f);
        for (const std::string& suffix : suffixes)
          full[p.name + suffix].assign(static_cast<size_t>(p.numel()), 0.0f);
      }
  }
  // Every (stage, tp rank) pair's data-parallel rank 0 contributes its pieces to rank 0; under expert
  // parallelism data-parallel ranks 1 .. ep-1 too (indices of the dp x cp ranks, RankLayout::dpCpRank), their
  // experts only (the rest of theirs is rank 0's).
  const int cp = plan.layout.cp();
  for (int stage = 0; stage < plan.layout.pp() && s; ++stage) {
    for (int t = 0; t < plan.layout.tp() * plan.layout.ep() && s; ++t) {
      const int e = t / plan.layout.tp();
      const int src = plan.layout.rank({e / cp, t % plan.layout.tp(), stage, e % cp});
      if (groups.rank != src && !lead) continue;
      const StoreLayout layout = storeLayoutOf(plan, stage, t % plan.layout.tp(), e);
      const StorePlan sp = planStore(plan.model, config.model.type, config.model.tieEmbeddings, layout);
      std::vector<float> theirs;
      if (src == 0) {
        theirs = mine;
      } else if (lead) {
        theirs.resize(sp.total * (1 + suffixes.size()));
        s = world->recv(theirs.data(), theirs.size(), CommType::F32, src, tag);
      } else {
        s = world->send(mine.data(), mine.size(), CommType::F32, 0, tag);
      }
      if (!s || !lead) continue;
      for (const Parameter& p : sp.params) {
        if (p.tiedCopy || (e > 0 && !sp.units[static_cast<size_t>(p.unit)].experts)) continue;
        insertShard(theirs.data() + p.offset, full[p.spec.name].data(), p.spec.shape, p.shard, layout.tp,
                    layout.tpRank);
        for (size_t w = 0; w < suffixes.size(); ++w)
          insertShard(theirs.data() + sp.total * (1 + w) + p.offset, full[p.spec.name + suffixes[w]].data(),
                      p.spec.shape, p.shard, layout.tp, layout.tpRank);
      }
    }
  }
  // The buffers (in model order): each stage's data-parallel rank 0 of TP rank 0 sends its layers' to rank
  // 0 (replicated over TP).
  std::map<std::string, std::vector<float>> bufferValues;  // rank 0: name -> values
  std::vector<const ParamSpec*> bufferOrder;
  for (int stage = 0; stage < plan.layout.pp() && s; ++stage) {
    const int src = plan.layout.rank({0, 0, stage});
    if (groups.rank != src && !lead) continue;
    std::vector<const ParamSpec*> specs;  // the stage's buffers, as the source's Model::buffers() lists them
    for (int l : plan.partition.layersOfStage(stage))
      for (const ParamSpec& b : plan.model.layers[static_cast<size_t>(l)].buffers) specs.push_back(&b);
    size_t n = 0;
    for (const ParamSpec* b : specs) n += static_cast<size_t>(b->numel());
    if (n == 0) continue;
    std::vector<float> flat;
    if (groups.rank == src) {
      for (const std::vector<float>& v : downloadBuffers(params.backend(), buffers))
        flat.insert(flat.end(), v.begin(), v.end());
      if (flat.size() != n)
        s = Status::error("checkpoint: rank " + std::to_string(src) + " holds " +
                          std::to_string(flat.size()) + " buffer floats, its stage " + std::to_string(n));
    }
    if (s && src != 0) {
      if (lead) {
        flat.resize(n);
        s = world->recv(flat.data(), n, CommType::F32, src, tag + 1);
      } else {
        s = world->send(flat.data(), n, CommType::F32, 0, tag + 1);
      }
    }
    if (!s || !lead) continue;
    size_t at = 0;
    for (const ParamSpec* b : specs) {
      bufferOrder.push_back(b);
      bufferValues[b->name].assign(flat.begin() + at, flat.begin() + at + b->numel());
      at += static_cast<size_t>(b->numel());
    }
  }
  if (s && lead) {
    const std::string staging = dir + ".partial";
    std::error_code ec;
    fs::remove_all(staging, ec);
    s = makeDirs(staging);
    std::vector<NamedTensor> model, state;
    for (const ParamSpec* spec : order) {
      const std::string& name = spec->name;
      model.push_back({name, spec->shape, DType::F32, full[name].data()});
      for (const std::string& suffix : suffixes)
        state.push_back({name + suffix, spec->shape, DType::F32, full[name + suffix].data()});
    }
    for (const ParamSpec* spec : bufferOrder)
      model.push_back({spec->name, spec->shape, DType::F32, bufferValues[spec->name].data()});
    if (s)
      s = writeSafetensors(staging + "/model.safetensors", model,
                           {{"format", "pt"}, {"model", toString(config.model.type)}});
    if (s)
      s = writeSafetensors(staging + "/optimizer.safetensors", state,
                           {{"optimizer", toString(config.optimizer.type)}});
    if (s) s = writeStateFiles(staging, config, info);
    if (s) s = writeManifest(staging, info.step);
    if (s) s = makeDirs(fs::path(dir).parent_path().string());
    if (s) s = replaceDirectory(staging, dir);
    if (!s) {  // a failed write (a full disk) leaves no half checkpoint behind
      std::error_code ec;
      fs::remove_all(staging, ec);
    }
  }
  // Everyone learns the outcome.
  if (W > 1) {
    int32_t bad = s ? 0 : 1;
    Status r = world->allReduce(&bad, &bad, 1, CommType::I32, ReduceOp::Max);
    if (!r) return r;
    if (bad && s) return Status::error("saving checkpoint " + dir + " failed on another rank");
  }
  return s;
}

Expected<CheckpointInfo> loadCheckpointSharded(const std::string& dir, const Plan& plan,
                                               ParameterStore& params, Optimizer& optimizer,
                                               const std::vector<LayerBuffer>& buffers) {
  const RunConfig& config = plan.config;
  MS_TRY(verifyCheckpoint(dir, kResumeFiles));
  auto info = readState(dir, config);
  if (!info) return info.status();
  const std::string weightsFile = dir + "/model.safetensors", stateFile = dir + "/optimizer.safetensors";
  auto weights = readSafetensors(weightsFile);
  if (!weights) return weights.status();
  auto opt = readSafetensors(stateFile);
  if (!opt) return opt.status();
  std::map<std::string, const LoadedTensor*> byName;
  for (const auto& [name, t] : weights->tensors) byName[stripPrefix(name)] = &t;
  MS_TRY(loadBuffers(params.backend(), byName, buffers, weightsFile));
  const auto suffixes = optimizer.stateSuffixes();
  const StoreLayout& L = params.layout();
  std::vector<float> unit;
  for (size_t ui = 0; ui < params.units().size(); ++ui) {
    const int u = static_cast<int>(ui);
    const Unit& U = params.units()[ui];
    for (int w = -1; w < static_cast<int>(suffixes.size()); ++w) {
      unit.assign(U.size, 0.0f);
      for (int pi : U.params) {
        const Parameter& p = params.params()[pi];
        const std::string name = w < 0 ? p.spec.name : p.spec.name + suffixes[w];
        const LoadedTensor* t = nullptr;
        if (w < 0) {
          auto it = byName.find(name);
          t = it == byName.end() ? nullptr : it->second;
        } else {
          t = opt->find(name);
        }
        const std::string& file = w < 0 ? weightsFile : stateFile;
        if (!t) return Status::error(file + ": no tensor \"" + name + "\"");
        if (t->shape != p.spec.shape)
          return Status::error(file + ": tensor \"" + name + "\" has shape " + shapeString(t->shape) +
                               ", the model needs " + shapeString(p.spec.shape));
        if (t->f32.size() != static_cast<size_t>(p.spec.numel()))
          return Status::error(file + ": tensor \"" + name + "\" is not a float tensor");
        extractShard(t->f32.data(), unit.data() + (p.offset - U.begin), p.spec.shape, p.shard, L.tp,
                     L.tpRank);
      }
      if (w < 0) {
        params.setUnitValues(u, unit.data());
      } else {
        const size_t b = params.ownedBegin(u), n = params.ownedSize(u);
        params.stateBackend().upload(optimizer.ownedState(w, u), unit.data() + b, n * sizeof(float));
      }
    }
  }
  optimizer.setStepsTaken(info->optimizerSteps);
  return info;
}

Status pruneCheckpoints(const std::string& runDir, int keep) {
  if (keep <= 0) return Status::ok();
  const fs::path root = fs::path(runDir) / "checkpoints";
  std::error_code ec;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(root, ec))
    if (entry.is_directory() && stepOfDirName(entry.path().filename().string()) >= 0)
      names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end(), std::greater<>());
  int kept = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const fs::path dir = root / names[i];
    // Counted as kept: the newest, and any other with its manifest (written last: the write completed).
    if (kept < keep && (i == 0 || fs::exists(dir / kManifest, ec))) {
      ++kept;
      continue;
    }
    if (i == 0) continue;
    fs::remove_all(dir, ec);
    if (ec) return Status::error(dir.string() + ": cannot delete (keep_checkpoints): " + ec.message());
  }
  return Status::ok();
}

Expected<std::string> latestCheckpoint(const std::string& runDir) {
  const fs::path root = fs::path(runDir) / "checkpoints";
  std::error_code ec;
  std::vector<std::string> names;  // step directories (not a ".partial" or ".old" staging)
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && stepOfDirName(name) >= 0) names.push_back(name);
  }
  if (names.empty()) return Status::error(root.string() + ": no checkpoint to resume from");
  std::sort(names.begin(), names.end());
  // The newest one, whole; a damaged newest one is an error naming it (and the newest whole one before it),
  // never a silent step back.
  const std::string newest = (root / names.back()).string();
  Status s = verifyCheckpoint(newest, kResumeFiles);
  if (s) return newest;
  std::string older;
  for (size_t i = names.size() - 1; i-- > 0 && older.empty();)
    if (verifyCheckpoint((root / names[i]).string(), kResumeFiles)) older = (root / names[i]).string();
  return Status::error(s.message() + (older.empty() ? "; no earlier whole checkpoint in " + root.string()
                                                    : "; the newest whole one is " + older +
                                                          " (resume from it with --resume " + older + ")"));
}

}  // namespace ms
