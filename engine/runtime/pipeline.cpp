// PipelineExecutor; see pipeline.h.
#include "runtime/pipeline.h"

#include <algorithm>
#include <cmath>

#include "runtime/heartbeat.h"

namespace ms {

Expected<RankGroups> makeRankGroups(const Plan& plan, Communicator* hostWorld, Communicator* tensorWorld) {
  RankGroups g;
  g.world = hostWorld;
  g.tensors = tensorWorld ? tensorWorld : hostWorld;
  Communicator* world = g.tensors;
  g.rank = world ? world->rank() : 0;
  const RankLayout& L = plan.layout;
  g.coord = L.coord(g.rank);
  if (!world || world->size() == 1) return g;
  const RankCoord c = g.coord;
  // Colors identify the group; keys order members by their rank in the group.
  auto tp = world->split((c.pp * L.dp() + c.dp) * L.cp() + c.cp, c.tp);
  if (!tp) return tp.status().withContext("creating the tensor-parallel groups");
  g.tp = std::move(*tp);
  // The parameters' data-parallel group spans the context-parallel ranks too (RankLayout::dpCpGroup).
  auto dp = world->split(c.pp * L.tp() + c.tp, L.dpCpRank(c));
  if (!dp) return dp.status().withContext("creating the data-parallel groups");
  g.dp = std::move(*dp);
  if (L.cp() > 1) {
    auto cp = world->split((c.pp * L.dp() + c.dp) * L.tp() + c.tp, c.cp);
    if (!cp) return cp.status().withContext("creating the context-parallel groups");
    g.cp = std::move(*cp);
  }
  // The tied token embedding lives on the first and the last stage: their copies' gradients are summed.
  const int last = L.pp() - 1;
  const bool tied = plan.config.model.tiedHead() && last > 0;
  const int color = tied && (c.pp == 0 || c.pp == last) ? L.dpCpRank(c) * L.tp() + c.tp : -1;
  auto emb = world->split(color, c.pp);
  if (!emb) return emb.status().withContext("creating the embedding groups");
  g.embedding = std::move(*emb);
  if (L.ep() > 1) {
    // Colors: the group's (pp, tp) and, for the all-to-all group its expert-data-parallel rank, for the
    // replicas' group its expert-parallel rank; keys order members by their dp x cp index (ep is carved out
    // of the dp x cp ranks, RankLayout).
    const int base = (c.pp * L.tp() + c.tp) * L.dp() * L.cp();
    auto ep = world->split(base + L.edpRank(c), L.dpCpRank(c));
    if (!ep) return ep.status().withContext("creating the expert-parallel groups");
    g.ep = std::move(*ep);
    auto edp = world->split(base + L.epRank(c), L.dpCpRank(c));
    if (!edp) return edp.status().withContext("creating the expert-data-parallel groups");
    g.edp = std::move(*edp);
  }
  return g;
}

Status reduceStats(LossStats& stats, Communicator* world) {
  if (!world || world->size() == 1) return Status::ok();
  double v[4] = {stats.lossSum, double(stats.count), double(stats.correct), stats.auxSum};
  MS_TRY(world->allReduce(v, v, 4, CommType::F64, ReduceOp::Sum));
  stats.lossSum = v[0];
  stats.count = static_cast<int64_t>(v[1]);
  stats.correct = static_cast<int64_t>(v[2]);
  stats.auxSum = v[3];
  return Status::ok();
}

StoreLayout storeLayoutOf(const Plan& plan, int stage, int tpRank, int dpRank) {
  StoreLayout s;
  s.layers = plan.partition.layersOfStage(stage);
  s.tp = plan.layout.tp();
  s.tpRank = tpRank;
  s.dp = plan.layout.dp() * plan.layout.cp();
  s.dpRank = dpRank;
  s.zero = plan.config.parallel.zero;
  s.overlapParamGather = plan.config.parallel.overlapParamGather;
  s.ep = plan.layout.ep();
  s.epRank = dpRank % plan.layout.ep();
  s.holdsEmbedding = std::find(s.layers.begin(), s.layers.end(), 0) != s.layers.end();
  return s;
}

ModelShard modelShardOf(const Plan& plan, const RankGroups& groups) {
  ModelShard s;
  const RankCoord c = groups.coord;
  for (int k : plan.partition.chunksOfStage(c.pp)) {
    s.chunks.push_back(plan.partition.chunks[k]);
    s.chunkIds.push_back(k);
  }
  s.store = storeLayoutOf(plan, c.pp, c.tp, plan.layout.dpCpRank(c));
  s.tp = TensorParallel{groups.tp.get(), plan.layout.tp(), c.tp};
  if (plan.layout.tp() == 1) s.tp.comm = nullptr;
  s.tp.sequence = plan.config.parallel.sequenceParallel && plan.layout.tp() > 1;
  s.tp.overlap = s.tp.sequence && plan.config.parallel.tpCommOverlap;
  s.dp = groups.dp.get();
  if (plan.layout.cp() > 1) s.cp = ContextParallel{groups.cp.get(), plan.layout.cp(), c.cp};
  if (plan.layout.ep() > 1) {
    s.ep = ExpertParallel{groups.ep.get(), plan.layout.ep(), plan.layout.epRank(c)};
    s.edp = plan.layout.edp() > 1 ? groups.edp.get() : nullptr;
  }
  s.recompute = RecomputePolicy::of(plan.config.parallel);
  return s;
}

PipelineExecutor::PipelineExecutor(const Plan& plan, RankGroups& groups, Model& model)
    : m_plan(plan), m_groups(groups), m_model(model), m_tracker(model.tracker()) {
  m_stage = groups.coord.pp;
  m_mbs = plan.microbatchSize();
  const int K = plan.schedule.chunkCount();
  m_localOf.assign(K, -1);
  for (int c = 0; c < model.localChunks(); ++c) m_localOf[model.shard().chunkIds[c]] = c;
  m_freeSlots.resize(model.localChunks());
  m_slotCount.assign(model.localChunks(), 0);
}

int PipelineExecutor::peerRank(int stage) const {
  RankCoord c = m_groups.coord;
  c.pp = stage;
  return m_plan.layout.rank(c);
}

int PipelineExecutor::tag(int kind, int m, int k) const {
  // Both sides list a pair's messages in the same order, so the tag only needs to separate kinds; (m, k) make
  // mismatches loud while they fit under MPI's guaranteed tag bound (32767).
  const int64_t t = 1 + kind + 2 * (int64_t(m) * m_plan.schedule.chunkCount() + k);
  return t < 32767 ? static_cast<int>(t) : 1 + kind;
}

int64_t PipelineExecutor::chunkOutFloats(int k, int B) const {
  const int last = m_plan.partition.chunks[k].back();
  return int64_t(B) * m_plan.model.layers[last].heldOutputBytesPerSample() / int64_t(sizeof(float));
}

int PipelineExecutor::takeSlot(int c) {
  auto& free = m_freeSlots[c];
  if (free.empty()) return m_slotCount[c]++;
  std::sort(free.begin(), free.end(), std::greater<int>());
  const int s = free.back();
  free.pop_back();
  return s;
}

void PipelineExecutor::freeSlot(int c, int slot) {
  m_freeSlots[c].push_back(slot);
}

const Batch& PipelineExecutor::batchFor(int64_t step, int m, const DataSource& data) {
  if (m_batchStep != step) {
    m_batches.clear();
    m_batchStep = step;
  }
  auto it = m_batches.find(m);
  if (it != m_batches.end()) return it->second;
  const int B = m_plan.config.training.batchSize;
  const int perReplica = B / m_plan.layout.dp();
  Batch& b = m_batches[m];
  data.trainBatch(step, B, m_groups.coord.dp * perReplica + m * m_mbs, m_mbs, b);
  takeContextSlice(b, m_plan.layout.cp(), m_groups.coord.cp);
  return b;
}

Status PipelineExecutor::waitSends(bool all) {
  Status first = Status::ok();
  for (auto it = m_sends.begin(); it != m_sends.end();) {
    if (!all && !it->request->ready()) {
      ++it;
      continue;
    }
    Status s = it->request->wait();
    if (!s && first) first = s;
    if (it->grad) m_gradOut.erase(it->key);
    it = m_sends.erase(it);
  }
  return first;
}

Status PipelineExecutor::execute(const Action& a, int64_t step, const DataSource& data, float lossScale,
                                 LossStats& stats) {
  const int K = m_plan.schedule.chunkCount();
  const int m = a.microbatch, k = a.chunk;
  Communicator* world = m_groups.tensors;
  auto inputOf = [&](int mb, int chunk) -> const float* {
    if (chunk == 0) return nullptr;
    if (m_localOf[chunk - 1] >= 0) return m_outputs.at({mb, chunk - 1});
    return m_recvAct.at({mb, chunk - 1}).data();
  };
  switch (a.type) {
    case ActionType::Forward: {
      const int c = localChunk(k);
      const int slot = takeSlot(c);
      m_slot[{m, k}] = slot;
      const Batch& batch = batchFor(step, m, data);
      m_outputs[{m, k}] =
          m_model.forwardChunk(c, slot, inputOf(m, k), batch, ForwardMode{true, lossScale}, m);
      if (k == K - 1) stats += m_model.headStats(slot);
      const double aux = m_model.takeAuxLoss();
      if (m_groups.coord.tp == 0) stats.auxSum += aux;
      return Status::ok();
    }
    case ActionType::SendActivation: {
      auto r = world->isend(m_outputs.at({m, k}), static_cast<size_t>(chunkOutFloats(k, m_mbs)),
                            m_model.activationType(), peerRank(a.peer), tag(0, m, k));
      if (!r) return r.status();
      m_sends.push_back({std::move(*r), {m, k}, false});
      return Status::ok();
    }
    case ActionType::RecvActivation: {
      const int t0 = m_model.mark();
      // As the sender stores it (Model::activationType: bf16 under "precision": "bf16", half the bytes).
      const size_t n = static_cast<size_t>(chunkOutFloats(k, m_mbs));
      Buffer b(m_model.activationStorageFloats(n), MemoryCategory::Communication, m_tracker);
      MS_TRY(world->recv(b.data(), n, m_model.activationType(), peerRank(a.peer), tag(0, m, k)));
      m_recvAct[{m, k}] = std::move(b);
      m_model.addSpan('r', -1, m, k, t0);
      return Status::ok();
    }
    case ActionType::Backward:
    case ActionType::BackwardWeight: {
      const int c = localChunk(k);
      const int slot = m_slot.at({m, k});
      const Batch& batch = batchFor(step, m, data);
      const bool split = m_plan.schedule.splitBackward;
      if (a.type == ActionType::Backward) {
        const float* dOut = nullptr;
        if (k < K - 1)
          dOut = m_localOf[k + 1] >= 0 ? m_gradOut.at({m, k + 1}).data() : m_recvGrad.at({m, k + 1}).data();
        float* dIn = nullptr;
        if (k > 0) {
          // The input gradient, stored as the activations are (bf16 under "precision": "bf16").
          Buffer g(m_model.activationStorageFloats(static_cast<size_t>(chunkOutFloats(k - 1, m_mbs))),
                   MemoryCategory::Communication, m_tracker);
          dIn = g.data();
          m_gradOut[{m, k}] = std::move(g);
        }
        const bool final = !split && --m_remaining[k] == 0;
        m_model.backwardChunk(c, slot, inputOf(m, k), dOut, dIn, batch,
                              split ? BackwardPart::Input : BackwardPart::All, m, final);
        // What this backward consumed is no longer needed.
        m_recvGrad.erase({m, k + 1});
        if (k < K - 1 && m_localOf[k + 1] >= 0) m_gradOut.erase({m, k + 1});
        if (split) return Status::ok();
      } else {
        const bool final = --m_remaining[k] == 0;
        m_model.backwardChunk(c, slot, inputOf(m, k), nullptr, nullptr, batch, BackwardPart::Weight, m,
                              final);
      }
      // The (m, k) activations are dead: the slot returns to the pool, the received input is dropped.
      freeSlot(c, slot);
      m_slot.erase({m, k});
      m_outputs.erase({m, k});
      m_recvAct.erase({m, k - 1});
      return Status::ok();
    }
    case ActionType::SendGrad: {
      auto r = world->isend(m_gradOut.at({m, k}).data(), static_cast<size_t>(chunkOutFloats(k - 1, m_mbs)),
                            m_model.activationType(), peerRank(a.peer), tag(1, m, k));
      if (!r) return r.status();
      m_sends.push_back({std::move(*r), {m, k}, true});
      return Status::ok();
    }
    case ActionType::RecvGrad: {
      const int t0 = m_model.mark();
      const size_t n = static_cast<size_t>(chunkOutFloats(k - 1, m_mbs));
      Buffer b(m_model.activationStorageFloats(n), MemoryCategory::Communication, m_tracker);
      MS_TRY(world->recv(b.data(), n, m_model.activationType(), peerRank(a.peer), tag(1, m, k)));
      m_recvGrad[{m, k}] = std::move(b);
      m_model.addSpan('R', -1, m, k, t0);
      return Status::ok();
    }
    case ActionType::GradSync: {
      // Each layer's bucket started when its last backward finished; make sure none was missed.
      ParameterStore& p = m_model.params();
      for (int l : m_plan.partition.chunks[k]) {
        MS_TRY(p.startSync(p.unitOfLayer(l)));
        if (p.expertUnitOfLayer(l) >= 0) MS_TRY(p.startSync(p.expertUnitOfLayer(l)));
      }
      return Status::ok();
    }
    case ActionType::OptimizerStep:
      return Status::ok();  // the trainer steps once the gradients are finished
  }
  return Status::ok();
}

Status PipelineExecutor::runStep(int64_t step, const DataSource& data, float lossScale, LossStats& stats) {
  stats = {};
  m_remaining.assign(m_plan.schedule.chunkCount(), m_plan.config.parallel.microbatches);
  const auto& actions = m_plan.schedule.actions[m_stage];
  Status failed = Status::ok();
  try {
    for (const Action& a : actions) {
      m_activity = "step " + std::to_string(step + 1) + ": " + describe(a);
      setActivity(m_activity, /*longPhase=*/false, /*waiting=*/isRecv(a.type));
      Status s = execute(a, step, data, lossScale, stats);
      if (!s) {
        failed = s.withContext("rank " + std::to_string(m_groups.rank) + ", " + describe(a));
        break;
      }
      if (!m_sends.empty()) MS_TRY(waitSends(false));
    }
  } catch (const CommFailure& e) {
    failed = Status::error("rank " + std::to_string(m_groups.rank) + ", " + m_activity + ": " + e.what());
  } catch (const DeviceFailure& e) {
    failed =
        Status::error("rank " + std::to_string(m_groups.rank) + ", " + m_activity + ": device: " + e.what());
  } catch (const std::out_of_range&) {
    failed = Status::error("rank " + std::to_string(m_groups.rank) + ", " + m_activity +
                           ": the schedule consumed data that was never produced (executor bug)");
  }
  MS_TRY(failed);
  m_activity =
      "step " + std::to_string(step + 1) + ": finishing gradients (tied embedding, data-parallel sync)";
  setActivity(m_activity, /*longPhase=*/false, /*waiting=*/true);
  const int t0 = m_model.mark();
  MS_TRY(waitSends(true));
  ParameterStore& p = m_model.params();
  // The tied embedding: the first stage's and the last stage's gradients are summed (Megatron-LM's embedding
  // group), then synced over data parallelism like any unit.
  if (m_groups.embedding && p.tiedUnit() >= 0) {
    const int wte = p.indexOf(tokenEmbeddingName(m_plan.config.model.type));
    MS_TRY(p.ensureGrads(p.tiedUnit()));
    void* g = p.gradOut(wte).data;
    MS_TRY(m_groups.embedding->allReduce(g, g, p.params()[wte].numel, p.gradType(), ReduceOp::Sum));
  }
  MS_TRY(p.finishSync());
  m_model.addSpan('G', -1, 0, -1, t0);
  m_outputs.clear();
  m_recvAct.clear();
  m_recvGrad.clear();
  m_gradOut.clear();
  m_slot.clear();
  for (int c = 0; c < m_model.localChunks(); ++c) {
    m_freeSlots[c].clear();
    for (int s = 0; s < m_slotCount[c]; ++s) m_freeSlots[c].push_back(s);
  }
  // Loss statistics come from the head's stage (its first TP rank: the others computed the same); the
  // load-balancing losses from every stage's first TP rank.
  if (!m_model.holdsHead() || m_groups.coord.tp != 0) stats = LossStats{0, 0, 0, stats.auxSum};
  return reduceStats(stats, m_groups.world);
}

Expected<double> PipelineExecutor::gradSquares() {
  double sq = m_model.params().ownedGradSquares();
  if (m_groups.world && m_groups.world->size() > 1)
    MS_TRY(m_groups.world->allReduce(&sq, &sq, 1, CommType::F64, ReduceOp::Sum));
  return sq;
}

Expected<PipelineExecutor::Eval> PipelineExecutor::evaluate(const DataSource& data, int maxBatches) {
  const RunConfig& config = m_plan.config;
  const int64_t B = config.training.batchSize;
  const int64_t total = data.evalSamples();
  const int64_t S = maxBatches > 0 ? std::min<int64_t>(total, maxBatches * B) : total;
  const int64_t pieces = (S + m_mbs - 1) / m_mbs;
  const int dp = m_plan.layout.dp(), r = m_groups.coord.dp;
  const int K = m_plan.schedule.chunkCount();
  Communicator* world = m_groups.tensors;
  std::vector<Span>* sink = m_model.pauseSpans();
  setActivity("evaluating", /*longPhase=*/true);
  Eval out;
  out.samples = S;
  Batch batch;
  Status failed = Status::ok();
  try {
    // Replica r takes pieces r, r + dp, ... Under expert parallelism the replicas of an all-to-all group must
    // run as many forwards as each other: one without a piece of its own in the last round runs piece 0
    // again and counts nothing.
    const int64_t rounds = m_plan.layout.ep() > 1 ? (pieces + dp - 1) / dp : (pieces - r + dp - 1) / dp;
    for (int64_t round = 0; round < rounds && failed; ++round) {
      const int64_t i = r + round * dp;
      const bool padding = i >= pieces;
      const int64_t first = padding ? 0 : i * m_mbs;
      const int count = static_cast<int>(std::min<int64_t>(m_mbs, S - first));
      data.evalBatch(first, count, batch);
      takeContextSlice(batch, m_plan.layout.cp(), m_groups.coord.cp);
      const float* prev = nullptr;
      Buffer received(0, MemoryCategory::Communication, m_tracker);
      for (int k = 0; k < K && failed; ++k) {
        const int c = m_localOf[k];
        if (c < 0) continue;
        const float* in = nullptr;
        if (k > 0) {
          if (m_localOf[k - 1] >= 0) {
            in = prev;
          } else {
            const size_t n = static_cast<size_t>(chunkOutFloats(k - 1, count));
            received.reserve(m_model.activationStorageFloats(n));
            failed = world->recv(received.data(), n, m_model.activationType(),
                                 peerRank(m_plan.partition.stageOf[k - 1]), 90);
            in = received.data();
          }
        }
        if (!failed) break;
        prev = m_model.forwardChunk(c, 0, in, batch, ForwardMode{false, 1.0f}, 0);
        if (k == K - 1) {
          if (m_groups.coord.tp == 0 && !padding) out.stats += m_model.headStats(0);
        } else if (m_localOf[k + 1] < 0) {
          failed = world->send(prev, static_cast<size_t>(chunkOutFloats(k, count)), m_model.activationType(),
                               peerRank(m_plan.partition.stageOf[k + 1]), 90);
        }
      }
    }
  } catch (const CommFailure& e) {
    failed = Status::error(std::string("evaluation: ") + e.what());
  } catch (const DeviceFailure& e) {
    failed = Status::error(std::string("evaluation: device: ") + e.what());
  }
  m_model.resumeSpans(sink);
  MS_TRY(failed);
  MS_TRY(reduceStats(out.stats, m_groups.world));
  return out;
}

}  // namespace ms
