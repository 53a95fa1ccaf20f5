// The parameters a rank holds, with their gradients, organised in UNITS (one per layer the rank holds, plus
// the tied token embedding as its own unit). A unit is the granule of everything distributed about
// parameters: its gradients are synced as one bucket (started as soon as its last backward of the step is
// done), ZeRO shards each unit over the data-parallel group, ZeRO-3 gathers one unit before its layer runs
// and frees it after.
//
// Tensor parallelism: a parameter may be sharded over the TP group (Megatron-LM, Shoeybi et al. 2019, section
// 3): the rank keeps piece tpRank of every part of one dimension (ShardSpec). The local tensor is what the
// layer computes with; checkpoints hold the full tensor (extractShard / insertShard convert).
//
// Layout: units lie one after another in a flat local index space (each unit padded to a multiple of 16 * dp
// floats, each parameter 16-float aligned); with ZeRO < 3 the full values live in one flat buffer over that
// space, with ZeRO < 2 the gradients too. Under ZeRO >= 1 data-parallel rank r OWNS the slice
// [r * size / dp, (r + 1) * size / dp) of every unit: the optimizer updates only that slice and keeps state
// only for it.
//
// What always holds: initialisation of a parameter element depends only on (seed, parameter name, element
// index in the FULL tensor), so any placement and sharding initialises the same model; layers read values and
// gradients through BoundParam each time (ZeRO-3 moves them), never keep raw pointers across calls.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "plan/model_spec.h"
#include "plan/status.h"
#include "runtime/communicator.h"
#include "runtime/memory.h"

namespace ms {

// Which dimension of a parameter is split over the TP group: dim < 0 replicated. The dimension consists of
// `parts` equal parts (3 for the fused q|k|v projection), each split into tp equal pieces; rank t keeps piece
// t of every part, in part order.
struct ShardSpec {
  int dim = -1;
  int parts = 1;
  bool sharded() const { return dim >= 0; }
};

// The TP sharding of a parameter of the model (by its name and the model type).
ShardSpec shardSpecOf(const ParamSpec& param, ModelType type);
// Shape of the local piece.
std::vector<int64_t> localShape(const std::vector<int64_t>& full, const ShardSpec& shard, int tp);
// Copies piece tpRank of full into local (local has the local shape's size), or back.
void extractShard(const float* full, float* local, const std::vector<int64_t>& shape, const ShardSpec& shard,
                  int tp, int tpRank);
void insertShard(const float* local, float* full, const std::vector<int64_t>& shape, const ShardSpec& shard,
                 int tp, int tpRank);

struct Parameter {
  ParamSpec spec;              // the FULL tensor (name, shape, init)
  ShardSpec shard;             // TP sharding
  std::vector<int64_t> shape;  // the local shape
  size_t numel = 0;            // local elements
  size_t offset = 0;           // in the flat local index space
  int unit = 0;                // the unit holding it
  bool countInNorm = true;     // counted once in the global gradient norm (not a TP replica's copy,
                               // not the tied embedding's copy on the head's stage)
  bool tiedCopy = false;       // the head stage's copy of the tied wte
};

struct Unit {
  std::string name;         // the layer name ("block.3"), or "wte" for the tied embedding
  int layer = -1;           // model layer index (-1 for the tied wte unit)
  std::vector<int> params;  // indices into params()
  size_t begin = 0;         // in the flat local index space
  size_t size = 0;          // padded to a multiple of 16 * dp
};

// Which parameters a rank holds and how they are split.
struct StoreLayout {
  std::vector<int> layers;  // model layer indices held (in model order)
  int tp = 1, tpRank = 0;
  int dp = 1, dpRank = 0;
  int zero = 0;
  bool holdsEmbedding = false;  // (tied gpt) the embedding layer is held: this rank's wte is the original
};

// The parameters and units a rank with this layout holds, with their places in its flat local index space
// (what ParameterStore allocates; checkpoints use it to map any rank's local tensors to full ones).
struct StorePlan {
  std::vector<Parameter> params;
  std::vector<Unit> units;
  int tiedUnit = -1;
  size_t total = 0;
};
StorePlan planStore(const ModelSpec& spec, ModelType type, bool tied, const StoreLayout& layout);

class ParameterStore {
 public:
  // Everything on one rank, no sharding (single-process runs and tools).
  ParameterStore(const ModelSpec& spec, ModelType type, bool tied, MemoryTracker* tracker);
  // A rank's share. dpComm: the data-parallel group (needed for ZeRO >= 1; may be null when dp == 1).
  ParameterStore(const ModelSpec& spec, ModelType type, bool tied, const StoreLayout& layout,
                 Communicator* dpComm, MemoryTracker* tracker);
  ~ParameterStore();

  void initialize(uint64_t seed);

  const StoreLayout& layout() const { return m_layout; }
  const std::vector<Parameter>& params() const { return m_params; }
  const std::vector<Unit>& units() const { return m_units; }
  // Index into params(), or -1.
  int indexOf(const std::string& name) const;
  const Parameter* find(const std::string& name) const;
  // Unit of a model layer (-1 when not held); the tied wte unit (-1 if none).
  int unitOfLayer(int layer) const;
  int tiedUnit() const { return m_tiedUnit; }
  size_t size() const { return m_total; }

  // Current pointers, in backend memory (valid until the unit is released or its gradients freed).
  float* value(int param);
  float* grad(int param);
  float* value(const std::string& name);
  float* grad(const std::string& name);

  // The flat buffers (ZeRO < 3 for values, ZeRO < 2 for gradients; nullptr otherwise).
  float* values();
  float* grads();
  const float* values() const;
  const float* grads() const;

  // ---- step life cycle ----
  // Zeroes the gradients (ZeRO >= 2: drops the full gradient buffers; they are created zeroed on first use).
  void zeroGrads();
  // Makes the unit's full gradients exist (ZeRO >= 2 allocates them zeroed); called before a backward.
  void ensureGrads(int unit);
  // ZeRO-3: gathers the unit's full values from the DP group (blocking); no-op otherwise.
  Status gather(int unit);
  // ZeRO-3: frees the unit's full values; no-op otherwise.
  void release(int unit);
  bool gathered(int unit) const;

  // Gradient sync of one unit over the DP group, non-blocking: all-reduce (ZeRO 0, 1) or reduce-scatter into
  // the owned gradient shard (ZeRO 2, 3). finishSync waits for all started syncs (and frees the full
  // gradients under ZeRO >= 2).
  Status startSync(int unit);
  bool syncStarted(int unit) const;
  Status finishSync();

  // ---- what the optimizer sees: the owned slice of each unit ----
  size_t ownedBegin(int unit) const;  // relative to the unit's begin
  size_t ownedSize(int unit) const;
  float* ownedValues(int unit);             // the owned slice of the values (the shard under ZeRO-3)
  const float* ownedGrads(int unit) const;  // after finishSync: the owned slice of the synced gradients
  // Sum of squares of the owned gradients of parameters counted in the norm (ZeRO 0: only DP rank 0 counts,
  // all replicas hold the same sums).
  double ownedGradSquares() const;
  // ZeRO 1, 2: all-gathers the updated owned slices so every replica holds the full values (blocking).
  Status allGatherValues();

  // The backend the values and gradients live in (the tracker's).
  Backend& backend() const { return m_tracker ? m_tracker->backend() : hostBackend(); }
  MemoryTracker* tracker() const { return m_tracker; }

  // Full-unit copy of the values, on the host (ZeRO-3: gathered over DP; collective over the DP group then).
  Status unitValues(int unit, std::vector<float>& out);
  // Sets the unit's values from a full-unit host array (every DP rank passes the same array).
  void setUnitValues(int unit, const float* full);

 private:
  struct UnitStorage;
  void build(const ModelSpec& spec, ModelType type, bool tied);
  float* unitValuePtr(int unit);
  float* unitGradPtr(int unit);

  StoreLayout m_layout;
  Communicator* m_dp = nullptr;
  MemoryTracker* m_tracker = nullptr;
  std::vector<Parameter> m_params;
  std::vector<Unit> m_units;
  std::map<std::string, int> m_index;
  std::vector<int> m_unitOfLayer;
  int m_tiedUnit = -1;
  size_t m_total = 0;
  Buffer m_values;  // flat (ZeRO < 3)
  Buffer m_grads;   // flat (ZeRO < 2)
  std::vector<std::unique_ptr<UnitStorage>> m_storage;
};

}  // namespace ms
