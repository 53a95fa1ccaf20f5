// The executor of a plan on one rank: it walks the rank's stage's action list (plan/schedule.h) for each
// training step, running forward/backward of its chunks, moving activations and their gradients to the
// neighbouring stages with non-blocking point-to-point messages, and finishing the step's gradients (the tied
// embedding's two copies summed, the data-parallel buckets waited for). The same object evaluates (forward
// only, chunk by chunk through the pipeline).
//
// What always holds: every rank of the run executes exactly its stage's list, in order (the schedule proves
// the lists deadlock-free); a slot holds one microbatch's activations of one chunk from its forward to its
// last backward part and is then reused; the loss statistics returned are the sums over the whole step on
// EVERY rank (all-reduced), and evaluation results likewise.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "plan/plan.h"
#include "runtime/communicator.h"
#include "runtime/data.h"
#include "runtime/model.h"

namespace ms {

// The groups a rank communicates in under a plan. Created collectively by every rank of the world.
struct RankGroups {
  Communicator* world = nullptr;    // null: one process. Host memory (statistics, reports, checkpoints).
  Communicator* tensors = nullptr;  // the world for tensors in backend memory (== world on the CPU; NCCL or
                                    // host staging on a GPU); tp, dp and embedding are split from it
  // dp: the parameters' data-parallel group, which spans the context-parallel ranks (RankLayout::dpCpGroup);
  // cp: ring attention's ring (cp > 1, else null).
  std::unique_ptr<Communicator> tp, dp, embedding, cp;
  std::unique_ptr<Communicator> ep, edp;  // expert parallelism (ep > 1): the all-to-all group, an expert's
                                          // replicas  // embedding: the tied wte's two stages (else null)
  RankCoord coord;
  int rank = 0;
};
// tensorWorld: the communicator over the same ranks for backend memory (nullptr: world itself).
Expected<RankGroups> makeRankGroups(const Plan& plan, Communicator* world,
                                    Communicator* tensorWorld = nullptr);

// Sums a LossStats over the ranks of world (in place); a no-op for a null or one-rank world.
Status reduceStats(LossStats& stats, Communicator* world);

// The parameters a rank of stage `stage` and TP rank `tpRank` holds (its StoreLayout) under the plan; dpRank:
// its index in the parameters' data-parallel group (RankLayout::dpCpRank; the dp index when cp is 1).
StoreLayout storeLayoutOf(const Plan& plan, int stage, int tpRank, int dpRank);

// What a rank runs under the plan (its chunks, its parameter shard) for building its Model.
ModelShard modelShardOf(const Plan& plan, const RankGroups& groups);

class PipelineExecutor {
 public:
  PipelineExecutor(const Plan& plan, RankGroups& groups, Model& model);

  // The forward and backward work of one step (every action but the optimizer step) followed by the gradient
  // finish: tied-embedding sum, data-parallel sync waited for. stats: the step's loss statistics over all
  // ranks. Errors name the rank and the action.
  Status runStep(int64_t step, const DataSource& data, float lossScale, LossStats& stats);

  // The global gradient norm's square over all ranks (after runStep).
  Expected<double> gradSquares();

  // Forward only over evaluation data: maxBatches * batch_size samples (0 = all), in pieces of one training
  // microbatch dealt round-robin to the data-parallel replicas.
  struct Eval {
    LossStats stats;
    int64_t samples = 0;
  };
  Expected<Eval> evaluate(const DataSource& data, int maxBatches);

  // What the rank is doing, for failure messages ("F(mb 3, chunk 1)").
  const std::string& activity() const { return m_activity; }

 private:
  struct Key {
    int m, k;
    bool operator<(const Key& o) const { return m != o.m ? m < o.m : k < o.k; }
  };
  Status execute(const Action& a, int64_t step, const DataSource& data, float lossScale, LossStats& stats);
  const Batch& batchFor(int64_t step, int m, const DataSource& data);
  int localChunk(int k) const { return m_localOf[k]; }
  int peerRank(int stage) const;
  int tag(int kind, int m, int k) const;
  int64_t chunkOutFloats(int k, int B) const;
  int takeSlot(int c);
  void freeSlot(int c, int slot);
  Status waitSends(bool all);

  const Plan& m_plan;
  RankGroups& m_groups;
  Model& m_model;
  MemoryTracker* m_tracker = nullptr;
  int m_stage = 0;
  int m_mbs = 1;
  std::vector<int> m_localOf;                 // (K): local chunk index, -1 when not on this stage
  std::vector<std::vector<int>> m_freeSlots;  // per local chunk
  std::vector<int> m_slotCount;
  // Per step:
  std::map<Key, int> m_slot;              // (m, k) -> slot of local chunk k
  std::map<Key, const float*> m_outputs;  // (m, k) -> output of local chunk k (in the model's slot)
  std::map<Key, Buffer> m_recvAct;        // output of chunk k for mb m, received
  std::map<Key, Buffer> m_recvGrad;       // input gradient of chunk k for mb m, received
  std::map<Key, Buffer> m_gradOut;        // input gradient of local chunk k for mb m (to send / hand on)
  std::map<int, Batch> m_batches;
  int64_t m_batchStep = -1;
  std::vector<int> m_remaining;  // per chunk: backwards (or weight parts) left this step
  struct PendingSend {
    CommRequestPtr request;
    Key key;
    bool grad;
  };
  std::vector<PendingSend> m_sends;
  std::string m_activity;
};

}  // namespace ms
