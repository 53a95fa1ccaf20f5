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
// Model states (plan/model_state.h, the one place their arithmetic lives: the store allocates by
// modelStateLayout, the memory model predicts by modelStateBytes): in fp32 the values are both what the
// layers read and what the optimizer updates. In MIXED PRECISION (the backend's GEMM precision is Bf16,
// "precision": "bf16") the layers read bf16 WORKING parameters (weight()), and the optimizer updates fp32
// MASTER weights, kept apart as optimizer state (MemoryCategory::Optimizer): whole under ZeRO 0, only the
// owned slice of every unit from ZeRO 1 on (Rajbhandari et al. 2020, section 5.1; Megatron Core's distributed
// optimizer). After the step, finishUpdate() rounds the updated master slice into the working parameters and
// all-gathers them in bf16 (ZeRO 1-2); ZeRO-3 keeps a bf16 shard of the working parameters and gathers it per
// use. Gradients are fp32 (Megatron's main gradients) or, with "grad_precision": "bf16", bf16 (ZeRO's fp16
// gradients): the ops accumulate into them rounding once per op, and the data-parallel reduction (all-reduce
// or reduce-scatter), the tied embedding's sum and sequence parallelism's LayerNorm sums run in bf16, which
// halves their traffic; the optimizer and the gradient norm widen them exactly as they read them.
//
// What always holds: initialisation of a parameter element depends only on (seed, parameter name, element
// index in the FULL tensor), so any placement and sharding initialises the same model; layers read values and
// gradients through BoundParam each time (ZeRO-3 moves them), never keep raw pointers across calls; in mixed
// precision the working parameters are toBf16 of the master weights whenever a layer reads them.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "plan/model_spec.h"
#include "plan/model_state.h"
#include "runtime/communicator.h"
#include "runtime/memory.h"

namespace ms {

// ShardSpec and shardSpecOf (the TP sharding of each parameter) live in plan/model_spec.h.
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
  // Expert parallelism (ep > 1): a MoE block's local experts are a unit of their own, whose gradients are
  // summed over the expert-data-parallel group (the replicas of the same experts) instead of the DP group,
  // and which ZeRO shards over that group (Megatron-Core's distributed optimizer shards expert parameters
  // over the expert-data-parallel group the same way).
  bool experts = false;
  // The group ZeRO shards the unit over: its size (the DP group's dp, or dp / ep for an expert unit; size
  // is a multiple of 16 * shards) and this rank's index in it (what it owns from ZeRO 1 on).
  int shards = 1;
  int shardRank = 0;
  // Where the unit's owned slice starts in the flat owned-state buffers (master weights, offload's host
  // gradients): the sum of the earlier units' owned sizes.
  size_t ownedAt = 0;
};

// The expert index of a routed expert's parameter ("model.layers.3.mlp.experts.12.up_proj.weight": 12), or -1
// (shared experts, routers and every other parameter).
int expertOfParam(const std::string& name);

// Which parameters a rank holds and how they are split.
struct StoreLayout {
  std::vector<int> layers;  // model layer indices held (in model order)
  int tp = 1, tpRank = 0;
  int dp = 1, dpRank = 0;
  int zero = 0;
  // ZeRO 1-2: finishUpdate starts the parameter all-gathers without waiting; each unit's is waited for when
  // its layer first runs (gather), or when anything else reads or writes its values.
  bool overlapParamGather = false;
  GradPrecision gradPrecision = GradPrecision::Fp32;  // bf16 needs the backend's Bf16 GEMM precision
  Offload offload = Offload::None;                    // needs mixed precision and a host tracker
  bool holdsEmbedding = false;  // (tied gpt) the embedding layer is held: this rank's wte is the original
  // Expert parallelism: the rank holds experts [epRank * E / ep, (epRank + 1) * E / ep) of each MoE block;
  // dpRank % ep == epRank (ep is carved out of the dp ranks), and its expert-data-parallel index is
  // dpRank / ep of dp / ep (RankLayout::edpGroup).
  int ep = 1, epRank = 0;
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
  ParameterStore(const ModelSpec& spec, ModelType type, bool tied, MemoryTracker* tracker,
                 GradPrecision gradPrecision = GradPrecision::Fp32);
  // A rank's share. dpComm: the data-parallel group (needed for ZeRO >= 1; may be null when dp == 1).
  // hostTracker: where offloaded state lives (host memory; needed when layout.offload is set).
  ParameterStore(const ModelSpec& spec, ModelType type, bool tied, const StoreLayout& layout,
                 Communicator* dpComm, MemoryTracker* tracker, MemoryTracker* hostTracker = nullptr);
  ~ParameterStore();

  void initialize(uint64_t seed);
  // Expert parallelism: the expert-data-parallel group the expert units' gradients are summed over and ZeRO
  // shards them over (null when each expert has one replica; else its size is dp / ep and this rank's index
  // in it dpRank / ep, or std::logic_error).
  void setExpertDataParallel(Communicator* edp);

  const StoreLayout& layout() const { return m_layout; }
  const std::vector<Parameter>& params() const { return m_params; }
  const std::vector<Unit>& units() const { return m_units; }
  // Index into params(), or -1.
  int indexOf(const std::string& name) const;
  const Parameter* find(const std::string& name) const;
  // Unit of a model layer (-1 when not held); the tied wte unit (-1 if none).
  int unitOfLayer(int layer) const;
  // Expert parallelism: the unit of a layer's local experts (-1 when the layer has none of its own).
  int expertUnitOfLayer(int layer) const;
  int tiedUnit() const { return m_tiedUnit; }
  size_t size() const { return m_total; }

  // How the store keeps its model states (decided at construction from the backend's GEMM precision: the
  // engine sets it before it builds the model, as kernels/backend.h asks).
  const ModelStateLayout& stateLayout() const { return m_state; }
  bool mixed() const { return m_state.mixed; }

  // A parameter's WORKING value, what every layer reads (GEMM operand, bias, LayerNorm weight, embedding
  // table): bf16 in mixed precision, else fp32. Backend memory; under ZeRO-3 valid from gather() to
  // release().
  TensorIn weight(int param) const;

  // fp32 runs only (nullptr in mixed precision, which keeps no fp32 copy of the working parameters): the
  // values, by parameter or flat (ZeRO < 3).
  float* value(int param);
  float* value(const std::string& name);
  const float* readValue(int param) const;
  float* values();
  const float* values() const;

  // A parameter's gradient as the ops accumulate into it: fp32, or bf16 with "grad_precision": "bf16".
  // Backend memory; under ZeRO >= 2 valid from ensureGrads() to the end of the step's sync.
  GradOut gradOut(int param);
  // The element type gradients travel in (F32 or BF16).
  CommType gradType() const { return m_state.gradientBytes == 2.0 ? CommType::BF16 : CommType::F32; }
  // fp32 gradients only (nullptr with bf16 gradients), by parameter or flat (ZeRO < 2; nullptr otherwise).
  float* grad(int param);
  float* grad(const std::string& name);
  float* grads();
  const float* grads() const;
  // The flat gradients as kept (ZeRO < 2; nullptr otherwise): size() elements of gradType().
  const void* gradBits() const { return m_layout.zero < 2 ? m_grads.data() : nullptr; }

  // ---- step life cycle ----
  // Zeroes the gradients (ZeRO >= 2: drops the full gradient buffers; they are created zeroed on first use).
  void zeroGrads();
  // Makes the unit's full gradients exist (ZeRO >= 2 allocates them zeroed, after finishing the unit's
  // reduction if one is in flight); called before a backward.
  Status ensureGrads(int unit);
  // ZeRO >= 2: the unit's gradients of a microbatch are complete (its backward, or weight part, is done and
  // not the step's last: that one is startSync). Reduce-scatters them now and frees the full gradients once
  // reduced, adding the shard to the step's (DeepSpeed's ZeRO-2 under gradient accumulation: a rank holds
  // its gradient shard plus the full gradients of the layer being computed and of the one being reduced,
  // not a whole gradient buffer). At most one reduction is in flight: the previous one is finished first.
  // No-op for ZeRO 0-1 (their gradients are all-reduced once per step).
  Status reduceGrads(int unit);
  // ZeRO-3: gathers the unit's full values from the DP group (blocking; waits for the prefetch's gather if
  // one is in flight). ZeRO 1-2 with overlapParamGather: waits for the unit's all-gather that finishUpdate
  // started. No-op otherwise.
  Status gather(int unit);
  // ZeRO-3: starts the unit's all-gather without waiting for it (the next layer's, issued as a layer starts
  // so that it travels while the layer computes: FSDP's forward and backward prefetch); gather() finishes
  // it. The DP group's ranks issue their gathers and reductions in the same order (they run the same
  // schedule), as non-blocking collectives require. No-op when gathered or not ZeRO-3.
  Status prefetch(int unit);
  // ZeRO-3: frees the unit's full values (after waiting for a prefetch in flight); no-op otherwise.
  void release(int unit);
  bool gathered(int unit) const;

  // Gradient sync of one unit over the DP group, non-blocking: all-reduce (ZeRO 0, 1) or reduce-scatter into
  // the owned gradient shard (ZeRO 2, 3: reduceGrads of the step's last microbatch). finishSync waits for all
  // started syncs (and frees the full gradients under ZeRO >= 2). Under ZeRO >= 2 the full gradients and the
  // reduction's staging are gradient BUCKETS (MemoryCategory::Communication; the memory model's dpBucket),
  // the shard is the gradients.
  Status startSync(int unit);
  bool syncStarted(int unit) const;
  Status finishSync();

  // ---- what the optimizer sees: the owned slice of each unit ----
  size_t ownedBegin(int unit) const;  // relative to the unit's begin
  size_t ownedSize(int unit) const;
  // The owned slice of what the optimizer updates: the fp32 values (the shard under ZeRO-3), or in mixed
  // precision the fp32 master weights.
  float* ownedValues(int unit);
  // After finishSync: the owned slice of the synced gradients (fp32, or bf16).
  TensorIn ownedGrads(int unit) const;
  // Sum of squares of the owned gradients of parameters counted in the norm (ZeRO 0: only DP rank 0 counts,
  // all replicas hold the same sums; the expert units of expert-data-parallel rank 0, every expert once).
  double ownedGradSquares() const;
  // After the optimizer step (blocking): the working parameters follow the update. Mixed precision rounds
  // each owned master slice into the working parameters (toBf16); ZeRO 1 and 2 then all-gather the owned
  // slices (bf16 in mixed precision) so every replica holds the whole working parameters; with
  // overlapParamGather it only starts those all-gathers (in unit order on every rank of a group, as
  // non-blocking collectives require), which gather() finishes before the unit's layer runs.
  Status finishUpdate();
  // Waits for every parameter all-gather finishUpdate left in flight (overlapParamGather); the first error.
  Status settleParamGathers();
  // Waits for the unit's, if one is in flight (gather() does too).
  Status awaitParamGather(int unit);

  // The backend the values and gradients live in (the tracker's).
  Backend& backend() const { return m_tracker ? m_tracker->backend() : hostBackend(); }
  MemoryTracker* tracker() const { return m_tracker; }

  // ---- offload ("offload": "optimizer"; plan/model_state.h) ----
  // Where the optimizer state (master weights, the Optimizer's moments) lives: the host tracker's memory
  // under offload, else the device's.
  bool offloadsOptimizer() const { return m_state.offloadOptimizer; }
  Backend& stateBackend() const;
  MemoryTracker* stateTracker() const { return m_state.offloadOptimizer ? m_hostTracker : m_tracker; }
  // After finishSync, before the optimizer step: under offload, downloads every unit's owned gradients into
  // their fp32 host copy (widening bf16 exactly); no-op otherwise.
  void stageOptimizerGrads();
  // The gradients the optimizer reads: the host copy under offload, else ownedGrads(unit).
  TensorIn optimizerGrads(int unit) const;
  // The owned slice `owned` (stateBackend memory) of a unit's optimizer state, whole on the host in `full`
  // (size units()[unit].size): all-gathered over the DP group when sharded. Collective where sharded.
  Status gatherOwnedState(int unit, const float* owned, float* full);

  // Full-unit copy of the fp32 values (mixed precision: the master weights), on the host. Collective over the
  // DP group where they are sharded (ZeRO-3; ZeRO >= 1 in mixed precision): every DP rank calls it.
  Status unitValues(int unit, std::vector<float>& out);
  // Sets the unit's values (mixed precision: master weights and their bf16 working copy) from a full-unit
  // host array (every DP rank passes the same array).
  void setUnitValues(int unit, const float* full);

 private:
  struct UnitStorage;
  void build(const ModelSpec& spec, ModelType type, bool tied);
  float* unitValuePtr(int unit);
  const float* unitValuePtr(int unit) const;
  GradOut unitGrad(int unit);  // the unit's full gradients (null when not allocated)
  bfloat16* unitWorkPtr(
      int unit) const;                  // mixed: the unit's bf16 working parameters (nullptr if not gathered)
  float* masterOwned(int unit);         // mixed: the owned slice of the unit's master weights
  MemoryTracker* shardTracker() const;  // where the ZeRO shards live: the host under offload "parameters"
  Status startGather(int unit, bool nonBlocking);  // ZeRO-3: allocates the unit's full values, gathers
  Status finishPending();  // ZeRO >= 2: waits for the reduction in flight, adds it in, frees its buffers
  // The group a unit's gradients are summed over and ZeRO shards it over (the DP group, or an expert unit's
  // expert-data-parallel group); null where the unit has one shard.
  Communicator* groupOf(int unit) const;

  StoreLayout m_layout;
  ModelStateLayout m_state;
  Communicator* m_dp = nullptr;
  Communicator* m_edp = nullptr;
  MemoryTracker* m_tracker = nullptr;
  std::vector<Parameter> m_params;
  std::vector<Unit> m_units;
  std::map<std::string, int> m_index;
  std::vector<int> m_unitOfLayer;
  std::vector<int> m_expertUnitOfLayer;
  int m_tiedUnit = -1;
  size_t m_total = 0;
  // The flat values (ZeRO < 3): fp32, or in mixed precision the bf16 working parameters (size() bf16 values
  // in a float buffer of size() / 2; size() is a multiple of 16, so every parameter starts 32-byte aligned).
  Buffer m_values;
  Buffer m_grads;   // flat (ZeRO < 2); bf16 gradients two to a float, as the bf16 values
  Buffer m_master;  // mixed: fp32 master weights, flat over the owned slices (size() / dp from ZeRO 1 on)
  MemoryTracker* m_hostTracker = nullptr;  // offload: host memory
  Buffer m_hostGrads;  // offload "optimizer": fp32 copy of the owned gradients, flat as m_master
  Buffer m_hostStage;  // offload "optimizer": one unit's updated working slice, rounded before its upload
  std::vector<std::unique_ptr<UnitStorage>> m_storage;
  int m_pendingUnit = -1;  // ZeRO >= 2: the unit whose microbatch reduction is in flight
};

}  // namespace ms
