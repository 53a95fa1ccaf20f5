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
// Mixed precision (GemmPrecision::Bf16) with ZeRO < 3: beside the fp32 values (the master weights the
// optimizer updates) the store keeps a bf16 WORKING COPY of the flat values buffer, which the linear layers
// multiply as it is (gemmValue), as Megatron-LM trains with bf16 model parameters, fp32 main parameters and
// fp32 gradients. See gemmValue() for how the copy stays current.
//
// What always holds: initialisation of a parameter element depends only on (seed, parameter name, element
// index in the FULL tensor), so any placement and sharding initialises the same model; layers read values and
// gradients through BoundParam each time (ZeRO-3 moves them), never keep raw pointers across calls; the bf16
// working copy, when kept, equals toBf16 of the values whenever a layer reads it.
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

  // Current pointers, in backend memory (valid until the unit is released or its gradients freed). The
  // mutable value pointers count as writes: they mark what they expose as changed for the bf16 working copy
  // (see gemmValue), so read through readValue() where nothing is written.
  float* value(int param);
  float* grad(int param);
  float* value(const std::string& name);
  float* grad(const std::string& name);
  const float* readValue(int param) const;

  // The flat buffers (ZeRO < 3 for values, ZeRO < 2 for gradients; nullptr otherwise). The mutable values()
  // marks every unit changed (see gemmValue).
  float* values();
  float* grads();
  const float* values() const;
  const float* grads() const;

  // ---- the GEMM operand of a parameter: the bf16 working copy ----
  // Whether the store keeps a bf16 working copy: decided at construction, from the backend's GEMM precision
  // (the engine sets it before it builds the model, as kernels/backend.h asks: "set before the first op"),
  // so nothing else has to be told and a store built for fp32 or TF32 never allocates one. Kept in
  // GemmPrecision::Bf16 with ZeRO < 3, counted as Parameters (2 bytes per element beside the 4 of the fp32
  // values; plan/memory_model.h predicts the same).
  bool keepsBf16Copy() const { return m_keepCopy; }
  // What a GEMM multiplies for a parameter: its slice of the bf16 working copy when one is kept, else its
  // fp32 value (fp32 and TF32 runs; ZeRO-3, whose full values exist only between gather() and release(), so
  // its GEMMs still convert the weight per call: the remaining gap, which a bf16 copy made at gather time
  // would close).
  // The copy is never stale: every write of the values goes through something that marks its units changed
  // (initialize, setUnitValues, the mutable value()/values()/ownedValues() -- the optimizer step and weight
  // loading --, allGatherValues), and a changed unit is converted (one toBf16 over the unit) when a GEMM
  // next asks for one of its parameters, or at refreshBf16Copy(). So an optimizer step costs one pass over
  // the flat buffer, never one per GEMM. A write through a mutable pointer kept from before the last
  // gemmValue() of its unit is not seen: take the pointer again.
  TensorIn gemmValue(int param);
  // Converts every changed unit now (the trainer calls it after the optimizer step and ZeRO's all-gather, so
  // the conversion is timed with the update rather than inside the next forward).
  void refreshBf16Copy();
  // The flat working copy (backend memory, size() elements; nullptr when none is kept), for checks: element
  // i is toBf16(values()[i]) for every unit not marked changed.
  const bfloat16* bf16Copy() const;

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
  const float* unitValuePtr(int unit) const;
  float* unitGradPtr(int unit);
  bfloat16* bf16CopyData() const;
  void refreshUnit(int unit);
  void markChanged(int unit);
  void markAllChanged();

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
  // The bf16 working copy (see gemmValue): size() bf16 values in a float buffer of size() / 2 (size() is a
  // multiple of 16), element i of the copy at byte 2 * i, so a parameter's copy starts 32-byte aligned.
  bool m_keepCopy = false;
  Buffer m_bf16;
  std::vector<char> m_copyStale;  // per unit: its values changed since its copy was made
  std::vector<std::unique_ptr<UnitStorage>> m_storage;
};

}  // namespace ms
