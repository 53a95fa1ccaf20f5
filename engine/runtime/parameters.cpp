// ParameterStore; see parameters.h.
#include "runtime/parameters.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "kernels/cpu/cpu_ops.h"
#include "runtime/random.h"
#include "runtime/safetensors.h"

namespace ms {

namespace {

size_t roundUp(size_t n, size_t m) {
  return (n + m - 1) / m * m;
}

// A buffer of n elements of `bytes` bytes each, in floats (bf16 pairs share a float; n is a multiple of 16).
size_t floatsOf(size_t n, double bytes) {
  return bytes == 2.0 ? n / 2 : n;
}

// Walks the full tensor's elements of piece tpRank: calls f(localIndex, fullIndex) for each.
template <typename F>
void forEachShardElement(const std::vector<int64_t>& shape, const ShardSpec& shard, int tp, int tpRank, F f) {
  int64_t total = 1;
  for (int64_t d : shape) total *= d;
  if (!shard.sharded() || tp == 1) {
    for (int64_t i = 0; i < total; ++i) f(i, i);
    return;
  }
  // View the tensor as (outer, dimSize, inner); dimSize = parts * tp * piece.
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < shard.dim; ++d) outer *= shape[d];
  for (size_t d = shard.dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t dimSize = shape[shard.dim];
  const int64_t part = dimSize / shard.parts, piece = part / tp;
  const int64_t localDim = piece * shard.parts;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t p = 0; p < shard.parts; ++p)
      for (int64_t j = 0; j < piece; ++j) {
        const int64_t fullRow = p * part + tpRank * piece + j;
        const int64_t localRow = p * piece + j;
        const int64_t fb = (o * dimSize + fullRow) * inner, lb = (o * localDim + localRow) * inner;
        for (int64_t i = 0; i < inner; ++i) f(lb + i, fb + i);
      }
}

}  // namespace

std::vector<int64_t> localShape(const std::vector<int64_t>& full, const ShardSpec& shard, int tp) {
  std::vector<int64_t> s = full;
  if (shard.sharded()) s[shard.dim] /= tp;
  return s;
}

void extractShard(const float* full, float* local, const std::vector<int64_t>& shape, const ShardSpec& shard,
                  int tp, int tpRank) {
  forEachShardElement(shape, shard, tp, tpRank, [&](int64_t l, int64_t f) { local[l] = full[f]; });
}

void insertShard(const float* local, float* full, const std::vector<int64_t>& shape, const ShardSpec& shard,
                 int tp, int tpRank) {
  forEachShardElement(shape, shard, tp, tpRank, [&](int64_t l, int64_t f) { full[f] = local[l]; });
}

// Per-unit storage that ZeRO moves around.
struct ParameterStore::UnitStorage {
  Buffer fullValues;   // ZeRO-3, while gathered: fp32, or bf16 working parameters in mixed precision
  Buffer shardValues;  // ZeRO-3: the owned slice of the values (fp32), or of the bf16 working parameters
  Buffer
      fullGrads;  // ZeRO >= 2: this microbatch's full gradients, from the unit's backward to their reduction
  Buffer shardGrads;  // ZeRO >= 2: the owned slice of the reduced gradients (the step's sum)
  Buffer staging;     // ZeRO >= 2: a later microbatch's reduced shard, added to shardGrads when it lands
                      // (offload "parameters": every reduction lands here on the device, then goes down);
                      // ZeRO-1: the step's reduced shard, copied into the owned slice when it lands
  Buffer upload;      // offload "parameters": the host shard, uploaded for the gather in flight
  CommRequestPtr pending;
  // ZeRO-3: the prefetch's all-gather into fullValues, in flight until gather() waits for it. Declared after
  // the buffers so that it is finished (its destructor waits) before they are freed.
  CommRequestPtr gathering;
  // ZeRO 1-2 with overlapParamGather: the all-gather of the updated working parameters into the flat values,
  // started by finishUpdate, in flight until the unit is next used (awaitParamGather).
  CommRequestPtr paramGather;
  bool started = false;
  bool reduced = false;  // ZeRO >= 2: shardGrads holds this step's sum so far (else it is to be written)
};

ParameterStore::ParameterStore(const ModelSpec& spec, ModelType type, bool tied, MemoryTracker* tracker,
                               GradPrecision gradPrecision)
    : m_tracker(tracker) {
  for (size_t i = 0; i < spec.layers.size(); ++i) m_layout.layers.push_back(static_cast<int>(i));
  m_layout.holdsEmbedding = true;
  m_layout.gradPrecision = gradPrecision;
  build(spec, type, tied);
}

ParameterStore::ParameterStore(const ModelSpec& spec, ModelType type, bool tied, const StoreLayout& layout,
                               Communicator* dpComm, MemoryTracker* tracker, MemoryTracker* hostTracker)
    : m_layout(layout), m_dp(dpComm), m_tracker(tracker), m_hostTracker(hostTracker) {
  if (layout.zero > 0 && layout.dp > 1 && !dpComm)
    throw std::logic_error("ParameterStore: ZeRO needs the data-parallel communicator");
  if (layout.ep > 1 && (layout.dp % layout.ep || layout.dpRank % layout.ep != layout.epRank))
    throw std::logic_error(
        "ParameterStore: expert parallelism needs ep to divide dp and dpRank % ep == epRank");
  build(spec, type, tied);
}

void ParameterStore::setExpertDataParallel(Communicator* edp) {
  const int ep = std::max(1, m_layout.ep), size = m_layout.dp / ep, rank = m_layout.dpRank / ep;
  if (edp && (edp->size() != size || edp->rank() != rank))
    throw std::logic_error("ParameterStore: the expert-data-parallel group has " +
                           std::to_string(edp->size()) + " ranks (this one " + std::to_string(edp->rank()) +
                           "), the layout says " + std::to_string(size) + " (" + std::to_string(rank) + ")");
  m_edp = edp;
}

Communicator* ParameterStore::groupOf(int u) const {
  if (m_units[u].shards == 1) return nullptr;
  Communicator* group = m_units[u].experts ? m_edp : m_dp;
  if (!group)
    throw std::logic_error("ParameterStore: unit " + m_units[u].name + " is sharded over " +
                           std::to_string(m_units[u].shards) + " ranks but has no communicator");
  return group;
}

ParameterStore::~ParameterStore() = default;

int expertOfParam(const std::string& name) {
  static const std::string key = ".mlp.experts.";
  const size_t at = name.find(key);
  if (at == std::string::npos) return -1;
  size_t i = at + key.size();
  int e = 0;
  bool digits = false;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i, digits = true)
    e = e * 10 + (name[i] - '0');
  return digits && i < name.size() && name[i] == '.' ? e : -1;
}

StorePlan planStore(const ModelSpec& spec, ModelType type, bool tied, const StoreLayout& L) {
  StorePlan out;
  auto addParam = [&](const ParamSpec& ps, int unit, bool tiedCopy) {
    Parameter p;
    p.spec = ps;
    p.shard = shardSpecOf(ps, type);
    p.shape = localShape(ps.shape, p.shard, L.tp);
    p.numel = 1;
    for (int64_t d : p.shape) p.numel *= static_cast<size_t>(d);
    p.unit = unit;
    p.tiedCopy = tiedCopy;
    p.countInNorm = !tiedCopy && (p.shard.sharded() || L.tpRank == 0);
    out.units[unit].params.push_back(static_cast<int>(out.params.size()));
    out.params.push_back(p);
  };
  bool holdsHead = false;
  for (int li : L.layers) holdsHead |= spec.layers[li].kind == LayerKind::Head;
  // The tied token embedding is its own unit, held by the embedding's rank and (as a copy) the head's.
  const ParamSpec* wte = nullptr;
  if (isLanguageModel(type) && tied) {
    for (const ParamSpec& ps : spec.layers.front().params)
      if (ps.name == tokenEmbeddingName(type)) wte = &ps;
  }
  if (wte && (L.holdsEmbedding || holdsHead)) {
    out.tiedUnit = 0;
    out.units.push_back({"wte", -1, {}, 0, 0});
    addParam(*wte, 0, !L.holdsEmbedding);
  }
  // Expert parallelism: the rank's experts of a block, [first, first + perRank).
  int experts = 0;
  for (const LayerSpec& l : spec.layers)
    for (const ParamSpec& ps : l.params) experts = std::max(experts, expertOfParam(ps.name) + 1);
  const int perRank = L.ep > 1 ? experts / L.ep : experts, first = L.ep > 1 ? L.epRank * perRank : 0;
  for (int li : L.layers) {
    const int u = static_cast<int>(out.units.size());
    out.units.push_back({spec.layers[li].name, li, {}, 0, 0});
    int expertUnit = -1;
    for (const ParamSpec& ps : spec.layers[li].params) {
      if (wte && ps.name == wte->name) continue;
      const int e = L.ep > 1 ? expertOfParam(ps.name) : -1;
      if (e < 0) {
        addParam(ps, u, false);
        continue;
      }
      if (e < first || e >= first + perRank) continue;  // another expert-parallel rank's
      if (expertUnit < 0) {
        expertUnit = static_cast<int>(out.units.size());
        out.units.push_back({spec.layers[li].name + ".experts", li, {}, 0, 0, true});
      }
      addParam(ps, expertUnit, false);
    }
  }
  // Lay the units out: parameters 16-float aligned, each unit padded so the slices of the group ZeRO shards
  // it over (the DP group; an expert unit's expert-data-parallel group) are 16-float aligned.
  const int ep = std::max(1, L.ep);
  size_t at = 0, owned = 0;
  for (Unit& u : out.units) {
    u.shards = u.experts ? L.dp / ep : L.dp;
    u.shardRank = u.experts ? L.dpRank / ep : L.dpRank;
    u.begin = at;
    size_t inUnit = 0;
    for (int pi : u.params) {
      out.params[pi].offset = at + inUnit;
      inUnit += roundUp(out.params[pi].numel, 16);
    }
    u.size = roundUp(std::max<size_t>(inUnit, 1), size_t(16) * u.shards);
    u.ownedAt = owned;
    at += u.size;
    owned += L.zero >= 1 ? u.size / u.shards : u.size;
  }
  out.total = at;
  return out;
}

void ParameterStore::build(const ModelSpec& spec, ModelType type, bool tied) {
  const StoreLayout& L = m_layout;
  StorePlan plan = planStore(spec, type, tied, L);
  m_params = std::move(plan.params);
  m_units = std::move(plan.units);
  m_tiedUnit = plan.tiedUnit;
  m_unitOfLayer.assign(spec.layers.size(), -1);
  m_expertUnitOfLayer.assign(spec.layers.size(), -1);
  for (size_t u = 0; u < m_units.size(); ++u)
    if (m_units[u].layer >= 0)
      (m_units[u].experts ? m_expertUnitOfLayer : m_unitOfLayer)[m_units[u].layer] = static_cast<int>(u);
  for (size_t i = 0; i < m_params.size(); ++i) m_index[m_params[i].spec.name] = static_cast<int>(i);
  m_total = plan.total;
  // What to keep where: plan/model_state.h, which the memory model predicts from. The moments are the
  // Optimizer's.
  const Precision precision =
      backend().gemmPrecision() == GemmPrecision::Bf16 ? Precision::Bf16 : Precision::Fp32;
  if (L.gradPrecision == GradPrecision::Bf16 && precision != Precision::Bf16)
    throw std::invalid_argument("ParameterStore: bf16 gradients need bf16 mixed precision");
  m_state = modelStateLayout(precision, L.gradPrecision, OptimizerConfig{}, L.zero, L.offload);
  if (L.offload != Offload::None && !m_state.offloadOptimizer)
    throw std::invalid_argument("ParameterStore: offload needs bf16 mixed precision");
  if (L.offload == Offload::Parameters && !m_state.offloadParameters)
    throw std::invalid_argument("ParameterStore: offload \"parameters\" needs ZeRO-3");
  if (m_state.offloadOptimizer && !m_hostTracker)
    throw std::invalid_argument("ParameterStore: offload needs a host memory tracker");
  m_storage.clear();
  for (size_t i = 0; i < m_units.size(); ++i) m_storage.push_back(std::make_unique<UnitStorage>());
  if (!m_state.shardWorking) {
    m_values = Buffer(floatsOf(m_total, m_state.workingBytes), MemoryCategory::Parameters, m_tracker);
  } else {
    // Offload "parameters" keeps the shards in host memory between uses (FSDP's CPU offload).
    for (size_t u = 0; u < m_units.size(); ++u)
      m_storage[u]->shardValues = Buffer(floatsOf(m_units[u].size / m_units[u].shards, m_state.workingBytes),
                                         MemoryCategory::Parameters, shardTracker());
  }
  size_t owned = 0;  // the owned slices, unit after unit (Unit::ownedAt)
  for (size_t u = 0; u < m_units.size(); ++u) owned += ownedSize(static_cast<int>(u));
  if (m_state.mixed) m_master = Buffer(owned, MemoryCategory::Optimizer, stateTracker());
  if (m_state.offloadOptimizer) {
    size_t largest = 0;
    for (size_t u = 0; u < m_units.size(); ++u) largest = std::max(largest, ownedSize(static_cast<int>(u)));
    if (m_state.offloadParameters) {
      // The optimizer reads the host's gradient shard in place; a later microbatch's reduced shard lands
      // in the staging before it is added.
      m_hostStage =
          Buffer(floatsOf(largest, m_state.gradientBytes), MemoryCategory::Communication, m_hostTracker);
    } else {
      m_hostGrads = Buffer(owned, MemoryCategory::Gradients, m_hostTracker);
      m_hostStage = Buffer(floatsOf(largest, 2.0), MemoryCategory::Communication, m_hostTracker);
    }
  }
  if (!m_state.shardGradients) {
    m_grads = Buffer(floatsOf(m_total, m_state.gradientBytes), MemoryCategory::Gradients, m_tracker);
  } else {
    for (size_t u = 0; u < m_units.size(); ++u)
      m_storage[u]->shardGrads = Buffer(floatsOf(m_units[u].size / m_units[u].shards, m_state.gradientBytes),
                                        MemoryCategory::Gradients, shardTracker());
  }
}

void ParameterStore::initialize(uint64_t seed) {
  std::vector<float> full, unit;
  for (size_t u = 0; u < m_units.size(); ++u) {
    unit.assign(m_units[u].size, 0.0f);
    for (int pi : m_units[u].params) {
      const Parameter& p = m_params[pi];
      const size_t n = static_cast<size_t>(p.spec.numel());
      full.resize(n);
      const uint64_t key = hashCombine(seed, hashString(p.spec.name), 0);
      switch (p.spec.init) {
        case ParamSpec::Init::Zeros:
          std::fill(full.begin(), full.end(), 0.0f);
          break;
        case ParamSpec::Init::Ones:
          std::fill(full.begin(), full.end(), 1.0f);
          break;
        case ParamSpec::Init::Normal: {
          // normalAt is a pure function of (key, index): the threads' split cannot change a value, and a
          // billions-of-parameters model initialises on every core, not one.
          float* out = full.data();
          const double std = p.spec.std;
#pragma omp parallel for schedule(static)
          for (int64_t i = 0; i < static_cast<int64_t>(n); ++i)
            out[i] = static_cast<float>(std * normalAt(key, static_cast<uint64_t>(i)));
          break;
        }
      }
      extractShard(full.data(), unit.data() + (p.offset - m_units[u].begin), p.spec.shape, p.shard,
                   m_layout.tp, m_layout.tpRank);
    }
    setUnitValues(static_cast<int>(u), unit.data());
  }
}

int ParameterStore::indexOf(const std::string& name) const {
  auto it = m_index.find(name);
  return it == m_index.end() ? -1 : it->second;
}

const Parameter* ParameterStore::find(const std::string& name) const {
  const int i = indexOf(name);
  return i < 0 ? nullptr : &m_params[i];
}

int ParameterStore::unitOfLayer(int layer) const {
  return layer >= 0 && layer < static_cast<int>(m_unitOfLayer.size()) ? m_unitOfLayer[layer] : -1;
}

int ParameterStore::expertUnitOfLayer(int layer) const {
  return layer >= 0 && layer < static_cast<int>(m_expertUnitOfLayer.size()) ? m_expertUnitOfLayer[layer] : -1;
}

float* ParameterStore::unitValuePtr(int u) {
  if (m_state.mixed) return nullptr;
  if (m_layout.zero < 3) return m_values.data() + m_units[u].begin;
  return m_storage[u]->gathering ? nullptr : m_storage[u]->fullValues.data();  // not while in flight
}

const float* ParameterStore::unitValuePtr(int u) const {
  return const_cast<ParameterStore*>(this)->unitValuePtr(u);
}

bfloat16* ParameterStore::unitWorkPtr(int u) const {
  // The float buffers hold the bf16 elements two by two (the bytes are only ever read as bf16).
  const Buffer& b = m_state.shardWorking ? m_storage[u]->fullValues : m_values;
  if (!b.data() || (m_state.shardWorking && m_storage[u]->gathering)) return nullptr;
  bfloat16* base = reinterpret_cast<bfloat16*>(const_cast<float*>(b.data()));
  return m_state.shardWorking ? base : base + m_units[u].begin;
}

Backend& ParameterStore::stateBackend() const {
  return m_state.offloadOptimizer ? m_hostTracker->backend() : backend();
}

MemoryTracker* ParameterStore::shardTracker() const {
  return m_state.offloadParameters ? m_hostTracker : m_tracker;
}

void ParameterStore::stageOptimizerGrads() {
  if (!m_state.offloadOptimizer || m_state.offloadParameters) return;  // "parameters": already there
  const bool bf16 = m_state.gradientBytes == 2.0;
  for (size_t ui = 0; ui < m_units.size(); ++ui) {
    const int u = static_cast<int>(ui);
    const size_t n = ownedSize(u);
    float* dst = m_hostGrads.data() + m_units[u].ownedAt;
    const TensorIn g = ownedGrads(u);
    if (!bf16) {
      backend().download(dst, g.f32(), n * sizeof(float));
      continue;
    }
    // bf16 crosses the link as 2 bytes; widened in place from the back (element i's 4 bytes cover bf16
    // elements 2i and 2i + 1, read before them).
    backend().download(dst, g.b16(), n * sizeof(uint16_t));
    const uint16_t* bits = reinterpret_cast<const uint16_t*>(dst);
    for (size_t i = n; i-- > 0;) dst[i] = bf16ToFloat(bits[i]);
  }
}

TensorIn ParameterStore::optimizerGrads(int u) const {
  if (!m_state.offloadOptimizer || m_state.offloadParameters) return ownedGrads(u);
  return TensorIn(m_hostGrads.data() + m_units[u].ownedAt);
}

Status ParameterStore::gatherOwnedState(int u, const float* owned, float* full) {
  const size_t n = m_units[u].size, shard = ownedSize(u);
  Backend& be = backend();
  Communicator* group = shard == n ? nullptr : groupOf(u);
  if (!group) {
    stateBackend().download(full, owned, shard * sizeof(float));
    return Status::ok();
  }
  // The collective runs on device memory: offloaded state goes up first.
  Buffer gathered(n, MemoryCategory::Communication, m_tracker);
  if (m_state.offloadOptimizer) {
    Buffer up(shard, MemoryCategory::Communication, m_tracker);
    be.upload(up.data(), owned, shard * sizeof(float));
    MS_TRY(group->allGather(up.data(), gathered.data(), shard, CommType::F32));
  } else {
    MS_TRY(group->allGather(owned, gathered.data(), shard, CommType::F32));
  }
  be.download(full, gathered.data(), n * sizeof(float));
  return Status::ok();
}

float* ParameterStore::masterOwned(int u) {
  return m_master.data() + m_units[u].ownedAt;
}

GradOut ParameterStore::unitGrad(int u) {
  float* base = m_layout.zero < 2 ? m_grads.data() : m_storage[u]->fullGrads.data();
  if (!base) return {};
  const GradOut g = m_state.gradientBytes == 2.0 ? GradOut(reinterpret_cast<bfloat16*>(base)) : GradOut(base);
  return m_layout.zero < 2 ? g.at(m_units[u].begin) : g;
}

TensorIn ParameterStore::weight(int i) const {
  const Parameter& p = m_params[i];
  if (!m_state.mixed) return TensorIn(readValue(i));
  const bfloat16* base = unitWorkPtr(p.unit);
  return base ? TensorIn(base + (p.offset - m_units[p.unit].begin)) : TensorIn();
}

float* ParameterStore::value(int i) {
  const Parameter& p = m_params[i];
  float* base = unitValuePtr(p.unit);
  return base ? base + (p.offset - m_units[p.unit].begin) : nullptr;
}

const float* ParameterStore::readValue(int i) const {
  const Parameter& p = m_params[i];
  const float* base = unitValuePtr(p.unit);
  return base ? base + (p.offset - m_units[p.unit].begin) : nullptr;
}

GradOut ParameterStore::gradOut(int i) {
  const Parameter& p = m_params[i];
  return unitGrad(p.unit).at(p.offset - m_units[p.unit].begin);
}

float* ParameterStore::grad(int i) {
  return gradOut(i).f32();
}

float* ParameterStore::value(const std::string& name) {
  const int i = indexOf(name);
  return i < 0 ? nullptr : value(i);
}

float* ParameterStore::grad(const std::string& name) {
  const int i = indexOf(name);
  return i < 0 ? nullptr : grad(i);
}

float* ParameterStore::values() {
  return m_layout.zero < 3 && !m_state.mixed ? m_values.data() : nullptr;
}
float* ParameterStore::grads() {
  return m_layout.zero < 2 && m_state.gradientBytes == 4.0 ? m_grads.data() : nullptr;
}
const float* ParameterStore::values() const {
  return m_layout.zero < 3 && !m_state.mixed ? m_values.data() : nullptr;
}
const float* ParameterStore::grads() const {
  return m_layout.zero < 2 && m_state.gradientBytes == 4.0 ? m_grads.data() : nullptr;
}

void ParameterStore::zeroGrads() {
  if (m_layout.zero < 2) {
    m_grads.zero();
    return;
  }
  for (auto& s : m_storage) {
    s->fullGrads = Buffer();
    s->staging = Buffer();
    s->reduced = false;
  }
}

Status ParameterStore::ensureGrads(int u) {
  if (m_layout.zero < 2) return Status::ok();
  if (m_pendingUnit == u) MS_TRY(finishPending());
  UnitStorage& s = *m_storage[u];
  if (!s.fullGrads.data())
    s.fullGrads =
        Buffer(floatsOf(m_units[u].size, m_state.gradientBytes), MemoryCategory::Communication, m_tracker);
  return Status::ok();
}

Status ParameterStore::finishPending() {
  if (m_pendingUnit < 0) return Status::ok();
  const int u = std::exchange(m_pendingUnit, -1);
  UnitStorage& s = *m_storage[u];
  Status st = s.pending ? s.pending->wait() : Status::ok();
  s.pending.reset();
  if (st && s.staging.data() && m_state.offloadParameters) {
    // The reduced shard goes down: into the host's shard the first time in the step, else through the
    // host staging and added there (the same addition as on the device).
    const size_t n = m_units[u].size / m_units[u].shards;
    const size_t bytes = n * static_cast<size_t>(m_state.gradientBytes);
    Backend& host = stateBackend();
    if (!s.reduced) {
      backend().download(s.shardGrads.data(), s.staging.data(), bytes);
    } else {
      backend().download(m_hostStage.data(), s.staging.data(), bytes);
      if (m_state.gradientBytes == 2.0) {
        // accumulateGrad's bf16 semantics (widen, add in fp32, round to nearest even once), on host memory.
        auto* y = reinterpret_cast<uint16_t*>(s.shardGrads.data());
        const auto* x = reinterpret_cast<const uint16_t*>(m_hostStage.data());
        for (size_t i = 0; i < n; ++i) y[i] = floatToBf16(bf16ToFloat(y[i]) + bf16ToFloat(x[i]));
      } else {
        host.accumulateGrad(s.shardGrads.data(), m_hostStage.data(), n);
      }
    }
  } else if (st && s.staging.data()) {
    const size_t n = m_units[u].size / m_units[u].shards;
    if (m_state.gradientBytes == 2.0)
      backend().accumulateGrad(reinterpret_cast<bfloat16*>(s.shardGrads.data()),
                               reinterpret_cast<const bfloat16*>(s.staging.data()), n);
    else
      backend().accumulateGrad(s.shardGrads.data(), s.staging.data(), n);
  }
  s.staging = Buffer();
  s.fullGrads = Buffer();
  s.reduced = true;
  return st;
}

Status ParameterStore::reduceGrads(int u) {
  if (m_layout.zero < 2) return Status::ok();
  MS_TRY(finishPending());
  UnitStorage& s = *m_storage[u];
  if (!s.fullGrads.data()) return Status::ok();  // nothing since its last reduction
  const size_t n = m_units[u].size, shard = n / m_units[u].shards;
  const CommType type = gradType();
  Communicator* group = groupOf(u);
  // The first reduction of the step lands in the shard itself (so one microbatch is exactly the plain
  // reduce-scatter); later ones in staging, added when they land.
  float* recv = s.shardGrads.data();
  if (s.reduced || m_state.offloadParameters) {  // the host's shard cannot take a collective
    s.staging = Buffer(floatsOf(shard, m_state.gradientBytes), MemoryCategory::Communication, m_tracker);
    recv = s.staging.data();
  }
  if (!group) {
    backend().copy(recv, s.fullGrads.data(), n * commTypeSize(type));
  } else {
    auto r = group->ireduceScatter(s.fullGrads.data(), recv, shard, type, ReduceOp::Sum);
    if (!r) return r.status();
    s.pending = std::move(*r);
  }
  m_pendingUnit = u;
  return Status::ok();
}

Status ParameterStore::awaitParamGather(int u) {
  UnitStorage& s = *m_storage[u];
  if (!s.paramGather) return Status::ok();
  Status st = s.paramGather->wait();
  s.paramGather.reset();
  return st;
}

Status ParameterStore::settleParamGathers() {
  Status first = Status::ok();
  for (size_t u = 0; u < m_units.size(); ++u) {
    Status st = awaitParamGather(static_cast<int>(u));
    if (!st && first) first = st;
  }
  return first;
}

Status ParameterStore::gather(int u) {
  if (m_layout.zero < 3) return awaitParamGather(u);
  UnitStorage& s = *m_storage[u];
  if (s.gathering) {  // prefetched: wait for it
    Status st = s.gathering->wait();
    s.gathering.reset();
    s.upload = Buffer();
    if (!st) s.fullValues = Buffer();
    return st;
  }
  if (s.fullValues.data()) return Status::ok();
  MS_TRY(startGather(u, false));
  return Status::ok();
}

Status ParameterStore::prefetch(int u) {
  if (m_layout.zero < 3) return Status::ok();
  UnitStorage& s = *m_storage[u];
  if (s.fullValues.data()) return Status::ok();  // gathered, or already on its way
  return startGather(u, true);
}

Status ParameterStore::startGather(int u, bool nonBlocking) {
  UnitStorage& s = *m_storage[u];
  // In floats: bf16 working parameters move as pairs of bf16 (a shard is a multiple of 16 elements).
  const size_t unitFloats = m_state.mixed ? m_units[u].size / 2 : m_units[u].size;
  const size_t shard = unitFloats / m_units[u].shards;
  Communicator* group = groupOf(u);
  // The gathered layer is a transient communication buffer (the memory model's zero3Gathered, under
  // "other"); the parameters are the shard.
  s.fullValues = Buffer(unitFloats, MemoryCategory::Communication, m_tracker);
  const float* mine = s.shardValues.data();
  if (m_state.offloadParameters) {
    // The shard comes up from the host first (FSDP's CPU offload), straight into place when nothing is
    // gathered.
    if (!group) {
      backend().upload(s.fullValues.data(), mine, shard * sizeof(float));
      return Status::ok();
    }
    s.upload = Buffer(shard, MemoryCategory::Communication, m_tracker);
    backend().upload(s.upload.data(), mine, shard * sizeof(float));
    mine = s.upload.data();
  }
  if (!group) {
    backend().copy(s.fullValues.data(), mine, shard * sizeof(float));
    return Status::ok();
  }
  if (!nonBlocking) {
    Status st = group->allGather(mine, s.fullValues.data(), shard, CommType::F32);
    s.upload = Buffer();
    if (!st) s.fullValues = Buffer();
    return st;
  }
  auto r = group->iallGather(mine, s.fullValues.data(), shard, CommType::F32);
  if (!r) {
    s.fullValues = Buffer();
    s.upload = Buffer();
    return r.status();
  }
  s.gathering = std::move(*r);
  return Status::ok();
}

void ParameterStore::release(int u) {
  if (m_layout.zero < 3) return;
  UnitStorage& s = *m_storage[u];
  if (s.gathering) {
    (void)s.gathering->wait();  // never free a buffer a collective is still writing
    s.gathering.reset();
  }
  s.upload = Buffer();
  s.fullValues = Buffer();
}

bool ParameterStore::gathered(int u) const {
  return m_layout.zero < 3 || (m_storage[u]->fullValues.data() != nullptr && !m_storage[u]->gathering);
}

size_t ParameterStore::ownedBegin(int u) const {
  return m_layout.zero >= 1 ? m_units[u].size / m_units[u].shards * m_units[u].shardRank : 0;
}

size_t ParameterStore::ownedSize(int u) const {
  return m_layout.zero >= 1 ? m_units[u].size / m_units[u].shards : m_units[u].size;
}

Status ParameterStore::startSync(int u) {
  UnitStorage& s = *m_storage[u];
  if (s.started) return Status::ok();
  s.started = true;
  if (m_layout.zero >= 2) {
    // The last microbatch's reduction; a unit that got no gradient this step has a zero shard.
    if (!s.fullGrads.data() && !s.reduced && m_pendingUnit != u) MS_TRY(ensureGrads(u));
    return reduceGrads(u);
  }
  // In elements of the gradient type (bf16 gradients reduce in bf16).
  const size_t n = m_units[u].size;
  void* g = unitGrad(u).data;
  Communicator* group = groupOf(u);  // the model's replicas, or an expert's
  if (!group) return Status::ok();
  if (m_layout.zero == 1) {
    // ZeRO-1 updates only the owned slice, so it needs only that slice summed: a reduce-scatter, half an
    // all-reduce's traffic (Rajbhandari et al. 2020, section 5.1; Megatron-LM's distributed optimizer), into
    // a shard of staging copied into the owned slice when it lands (finishSync). The rest of the rank's
    // gradient buffer keeps its own microbatches' sum, which nothing reads.
    const size_t shard = n / m_units[u].shards;
    s.staging = Buffer(floatsOf(shard, m_state.gradientBytes), MemoryCategory::Communication, m_tracker);
    auto r = group->ireduceScatter(g, s.staging.data(), shard, gradType(), ReduceOp::Sum);
    if (!r) return r.status();
    s.pending = std::move(*r);
    return Status::ok();
  }
  auto r = group->iallReduce(g, g, n, gradType(), ReduceOp::Sum);
  if (!r) return r.status();
  s.pending = std::move(*r);
  return Status::ok();
}

bool ParameterStore::syncStarted(int u) const {
  return m_storage[u]->started;
}

Status ParameterStore::finishSync() {
  Status first = Status::ok();
  for (size_t u = 0; u < m_units.size(); ++u) {
    UnitStorage& s = *m_storage[u];
    if (!s.started) {
      Status st = startSync(static_cast<int>(u));
      if (!st && first) first = st;
    }
    if (m_layout.zero >= 2) {
      Status st = finishPending();
      if (!st && first) first = st;
    } else if (s.pending) {
      Status st = s.pending->wait();
      if (!st && first) first = st;
      s.pending.reset();
      if (st && s.staging.data()) {  // ZeRO-1: the summed shard into the owned slice
        const size_t bytes = ownedSize(static_cast<int>(u)) * static_cast<size_t>(m_state.gradientBytes);
        backend().copy(static_cast<char*>(unitGrad(static_cast<int>(u)).data) +
                           ownedBegin(static_cast<int>(u)) * static_cast<size_t>(m_state.gradientBytes),
                       s.staging.data(), bytes);
      }
      s.staging = Buffer();
    }
    s.started = false;
  }
  // The optimizer writes the owned slices next: no parameter all-gather may still be writing them (every
  // unit's layer ran, so none is left in a training step).
  Status gathered = settleParamGathers();
  return first ? gathered : first;
}

float* ParameterStore::ownedValues(int u) {
  if (m_state.mixed) return masterOwned(u);
  if (m_layout.zero >= 3) return m_storage[u]->shardValues.data();
  return m_values.data() + m_units[u].begin + ownedBegin(u);
}

TensorIn ParameterStore::ownedGrads(int u) const {
  const bool bf16 = m_state.gradientBytes == 2.0;
  const float* base = m_layout.zero >= 2 ? m_storage[u]->shardGrads.data() : m_grads.data();
  const size_t at = m_layout.zero >= 2 ? 0 : m_units[u].begin + ownedBegin(u);
  if (bf16) return TensorIn(reinterpret_cast<const bfloat16*>(base) + at);
  return TensorIn(base + at);
}

double ParameterStore::ownedGradSquares() const {
  // ZeRO 0: replicas hold the same sums; the model's units count on DP rank 0, the experts' on
  // expert-data-parallel rank 0 (DP ranks [0, ep): every expert once).
  const bool countModel = m_layout.zero > 0 || m_layout.dpRank == 0;
  const bool countExperts = m_layout.zero > 0 || m_layout.dpRank < m_layout.ep;
  if (!countModel && !countExperts) return 0.0;
  std::vector<TensorIn> ptrs;
  std::vector<size_t> sizes;
  for (size_t u = 0; u < m_units.size(); ++u) {
    if (!(m_units[u].experts ? countExperts : countModel)) continue;
    const size_t lo = ownedBegin(static_cast<int>(u)), hi = lo + ownedSize(static_cast<int>(u));
    const TensorIn g = ownedGrads(static_cast<int>(u));
    for (int pi : m_units[u].params) {
      const Parameter& p = m_params[pi];
      if (!p.countInNorm) continue;
      const size_t a = std::max(lo, p.offset - m_units[u].begin);
      const size_t b = std::min(hi, p.offset - m_units[u].begin + p.numel);
      if (a < b) {
        ptrs.push_back(g.at(a - lo));
        sizes.push_back(b - a);
      }
    }
  }
  // Where the owned gradients live: the host's shard under offload "parameters".
  Backend& be = m_state.offloadParameters ? stateBackend() : backend();
  return be.sumSquares(ptrs.data(), sizes.data(), ptrs.size());
}

Status ParameterStore::finishUpdate() {
  const bool gatherSlices = m_layout.zero >= 1 && m_layout.zero < 3;
  MS_TRY(settleParamGathers());  // a unit no layer read since the last step (none in a training step)
  for (size_t ui = 0; ui < m_units.size(); ++ui) {
    const int u = static_cast<int>(ui);
    const size_t n = ownedSize(u);
    float* full;   // the unit's working parameters, in floats
    size_t shard;  // the owned slice, in floats
    if (m_state.mixed) {
      // Round the updated master slice into the working parameters (the slice's place in the flat buffer,
      // or the ZeRO-3 shard).
      bfloat16* work = m_state.shardWorking ? reinterpret_cast<bfloat16*>(m_storage[u]->shardValues.data())
                                            : unitWorkPtr(u) + ownedBegin(u);
      if (m_state.offloadParameters) {
        stateBackend().toBf16(work, masterOwned(u), n);  // the shard stays on the host
      } else if (m_state.offloadOptimizer) {
        // Rounded on the host, uploaded as bf16 (ZeRO-Offload's fp16 parameter copy: half the traffic).
        bfloat16* stage = reinterpret_cast<bfloat16*>(m_hostStage.data());
        stateBackend().toBf16(stage, masterOwned(u), n);
        backend().upload(work, stage, n * sizeof(uint16_t));
      } else {
        backend().toBf16(work, masterOwned(u), n);
      }
      full = m_state.shardWorking ? nullptr : reinterpret_cast<float*>(unitWorkPtr(u));
      shard = n / 2;
    } else {
      full = m_layout.zero < 3 ? m_values.data() + m_units[u].begin : nullptr;
      shard = n;
    }
    Communicator* group = gatherSlices ? groupOf(u) : nullptr;
    if (!group) continue;
    float* mine = full + shard * m_units[u].shardRank;
    if (!m_layout.overlapParamGather) {
      MS_TRY(group->allGather(mine, full, shard, CommType::F32));
      continue;
    }
    // In place: the owned slice is both what this rank sends and where its part lands.
    auto r = group->iallGather(mine, full, shard, CommType::F32);
    if (!r) return r.status();
    m_storage[u]->paramGather = std::move(*r);
  }
  return Status::ok();
}

Status ParameterStore::unitValues(int u, std::vector<float>& out) {
  MS_TRY(awaitParamGather(u));
  const size_t n = m_units[u].size;
  out.resize(n);
  Backend& be = backend();
  if (m_state.mixed) return gatherOwnedState(u, masterOwned(u), out.data());
  // What holds the fp32 values: the flat values, the ZeRO-3 shard, or in mixed precision the master.
  const bool sharded = m_state.mixed ? m_state.shardOptimizer : m_layout.zero >= 3;
  const float* owned = m_state.mixed        ? masterOwned(u)
                       : m_layout.zero >= 3 ? m_storage[u]->shardValues.data()
                                            : m_values.data() + m_units[u].begin;
  if (!sharded) {
    be.download(out.data(), owned, n * sizeof(float));
    return Status::ok();
  }
  const size_t shard = n / m_units[u].shards;
  Communicator* group = groupOf(u);
  if (!group) {
    be.download(out.data(), owned, shard * sizeof(float));
    return Status::ok();
  }
  Buffer full(n, MemoryCategory::Communication, m_tracker);
  MS_TRY(group->allGather(owned, full.data(), shard, CommType::F32));
  be.download(out.data(), full.data(), n * sizeof(float));
  return Status::ok();
}

void ParameterStore::setUnitValues(int u, const float* full) {
  // An all-gather in flight must not land on the values set here. Its result is overwritten, so its status
  // is not needed; a broken group fails the next collective, which reports it.
  (void)awaitParamGather(u);
  const size_t n = m_units[u].size;
  Backend& be = backend();
  UnitStorage& s = *m_storage[u];
  if (!m_state.mixed) {
    if (m_layout.zero < 3) {
      be.upload(m_values.data() + m_units[u].begin, full, n * sizeof(float));
      return;
    }
    const size_t shard = n / m_units[u].shards;
    be.upload(s.shardValues.data(), full + shard * m_units[u].shardRank, shard * sizeof(float));
    if (s.fullValues.data()) be.upload(s.fullValues.data(), full, n * sizeof(float));
    return;
  }
  // Mixed precision: the master's owned slice, and the working parameters rounded as finishUpdate rounds.
  stateBackend().upload(masterOwned(u), full + ownedBegin(u), ownedSize(u) * sizeof(float));
  std::vector<uint16_t> work(n);
  for (size_t i = 0; i < n; ++i) work[i] = floatToBf16(full[i]);
  if (!m_state.shardWorking) {
    be.upload(unitWorkPtr(u), work.data(), n * sizeof(uint16_t));
    return;
  }
  const size_t shard = n / m_units[u].shards;
  Backend& shardBe = m_state.offloadParameters ? stateBackend() : be;
  shardBe.upload(s.shardValues.data(), work.data() + shard * m_units[u].shardRank, shard * sizeof(uint16_t));
  if (s.fullValues.data()) be.upload(s.fullValues.data(), work.data(), n * sizeof(uint16_t));
}

}  // namespace ms
