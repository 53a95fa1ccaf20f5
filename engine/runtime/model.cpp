// Model: a rank's layers over its ParameterStore, run per chunk and slot; see model.h.
#include "runtime/model.h"

#include <numeric>
#include <utility>

namespace ms {

Model::Model(const RunConfig& config, MemoryTracker* tracker, int mlpInputs)
    : m_config(config),
      m_bf16Outputs(config.parallel.precision == Precision::Bf16),
      m_spec(buildModelSpec(config.model, config.training.seqLen, mlpInputs)),
      m_workspace(tracker),
      m_tracker(tracker),
      m_backend(tracker ? tracker->backend() : hostBackend()) {
  std::vector<int> all(m_spec.layers.size());
  std::iota(all.begin(), all.end(), 0);
  m_shard.chunks = {all};
  m_shard.chunkIds = {0};
  m_shard.store.layers = all;
  m_shard.store.holdsEmbedding = true;
  m_shard.store.gradPrecision = config.parallel.gradPrecision;
  m_shard.recompute = RecomputePolicy::of(config.parallel);
  m_params = std::make_unique<ParameterStore>(m_spec, config.model.type, config.model.tieEmbeddings, tracker,
                                              config.parallel.gradPrecision);
  build(config, mlpInputs);
}

Model::Model(const RunConfig& config, const ModelShard& shard, MemoryTracker* tracker, int mlpInputs,
             MemoryTracker* hostTracker)
    : m_config(config),
      m_bf16Outputs(config.parallel.precision == Precision::Bf16),
      m_spec(buildModelSpec(config.model, config.training.seqLen, mlpInputs, std::max(1, shard.cp.size),
                            shard.tp.sequence ? std::max(1, shard.tp.size) : 1)),
      m_shard(shard),
      m_workspace(tracker),
      m_tracker(tracker),
      m_backend(tracker ? tracker->backend() : hostBackend()) {
  m_shard.store.gradPrecision = config.parallel.gradPrecision;
  m_shard.store.offload = config.parallel.offload;
  m_params = std::make_unique<ParameterStore>(m_spec, config.model.type, config.model.tieEmbeddings,
                                              m_shard.store, shard.dp, tracker, hostTracker);
  m_params->setExpertDataParallel(shard.edp);
  build(config, mlpInputs);
}

void Model::build(const RunConfig& config, int) {
  m_params->initialize(config.seed);
  m_batchCopies.resize(m_shard.chunks.size());
  LayerContext ctx{m_backend,    config.model,           *m_params, m_tracker,
                   &m_workspace, m_spec.samplePositions, m_shard.tp};
  ctx.selectiveRecompute = m_shard.recompute.mode == Recompute::Selective;
  ctx.headChunkRows = config.training.headChunkRows;
  ctx.ep = m_shard.ep;
  ctx.cp = m_shard.cp;
  if (config.parallel.batchNorm == BatchNormMode::Sync && m_shard.dp && m_shard.dp->size() > 1) {
    ctx.batchNormGroup = m_shard.dp;
    ctx.batchNormRanks = m_shard.dp->size();
  }
  m_layers.resize(m_spec.layers.size());
  m_acts.resize(m_spec.layers.size());
  m_fullyRecomputed.assign(m_spec.layers.size(), false);
  for (const auto& chunk : m_shard.chunks)
    for (int l : chunk) {
      m_layers[l] = makeLayer(m_spec.layers[l], ctx);
      m_fullyRecomputed[l] = fullyRecomputed(m_shard.recompute, m_spec, chunk, l);
    }
}

std::vector<LayerBuffer> Model::buffers() {
  std::vector<LayerBuffer> all;
  for (auto& layer : m_layers)
    if (layer)
      for (const LayerBuffer& b : layer->buffers()) all.push_back(b);
  return all;
}

void Model::resolveSpans() {
  if (!m_spans) return;
  for (Span& s : *m_spans) {
    if (s.startMark >= 0) s.start = m_backend.markTime(s.startMark);
    if (s.endMark >= 0) s.end = m_backend.markTime(s.endMark);
    s.startMark = s.endMark = -1;
  }
}

BatchView Model::view(const Batch& batch, int c, int slot, bool upload) {
  BatchView v;
  v.B = batch.B;
  v.host = &batch;
  if (!m_backend.deviceMemory()) {
    v.tokens = batch.tokens.empty() ? nullptr : batch.tokens.data();
    v.targets = batch.targets.empty() ? nullptr : batch.targets.data();
    v.images = batch.images.empty() ? nullptr : batch.images.data();
    return v;
  }
  auto& copies = m_batchCopies[c];
  while (static_cast<int>(copies.size()) <= slot) copies.push_back(nullptr);
  if (!copies[slot]) copies[slot] = std::make_unique<BatchCopy>(m_tracker);
  BatchCopy& d = *copies[slot];
  static_assert(sizeof(int32_t) == sizeof(float));
  auto put = [&](Buffer& dst, const void* src, size_t n) {
    if (n == 0) return;
    dst.reserve(n);
    if (upload) m_backend.upload(dst.data(), src, n * sizeof(float));
  };
  put(d.tokens, batch.tokens.data(), batch.tokens.size());
  put(d.targets, batch.targets.data(), batch.targets.size());
  put(d.images, batch.images.data(), batch.images.size());
  v.tokens = batch.tokens.empty() ? nullptr : reinterpret_cast<const int32_t*>(d.tokens.data());
  v.targets = batch.targets.empty() ? nullptr : reinterpret_cast<const int32_t*>(d.targets.data());
  v.images = batch.images.empty() ? nullptr : d.images.data();
  return v;
}

int64_t Model::chunkOutputFloats(int c, int B) const {
  return m_layers[m_shard.chunks[c].back()]->outputFloats(B);
}

int64_t Model::chunkInputFloats(int c, int B) const {
  const int first = m_shard.chunks[c].front();
  if (first == 0) return 0;
  // The previous layer's output as this rank holds it (the spec's: that layer may be on another stage).
  return int64_t(B) * m_spec.layers[first - 1].heldOutputBytesPerSample() / int64_t(sizeof(float));
}

size_t Model::inputFloats(int layer, int B) const {
  // The previous layer's output (it may be on another stage: from the spec).
  return size_t(B) * size_t(m_spec.layers[layer - 1].heldOutputBytesPerSample()) / sizeof(float);
}

float* Model::output(int layer, int slot, int B) {
  auto& v = m_acts[layer];
  while (static_cast<int>(v.size()) <= slot) v.emplace_back(0, MemoryCategory::Activations, m_tracker);
  v[slot].reserve(activationStorageFloats(static_cast<size_t>(m_layers[layer]->outputFloats(B))));
  return v[slot].data();
}

const float* Model::layerInput(int layer, int firstOfChunk, int slot, const float* chunkInput,
                               const BatchView& batch) {
  if (layer == 0) return batch.images;
  const float* stored = layer == firstOfChunk ? chunkInput : m_acts[layer - 1][slot].data();
  if (!m_bf16Outputs) return stored;
  const size_t n = inputFloats(layer, batch.B);
  float* x = m_workspace.get(kInputStaging, n, false);
  m_backend.fromBf16(x, reinterpret_cast<const bfloat16*>(stored), n);
  return x;
}

float* Model::outputTarget(int layer, float* stored, int B) {
  if (!m_bf16Outputs) return stored;
  return m_workspace.get(kOutputStaging, static_cast<size_t>(m_layers[layer]->outputFloats(B)), false);
}

void Model::storeOutput(int layer, float* stored, const float* written, int B) {
  const size_t n = static_cast<size_t>(m_layers[layer]->outputFloats(B));
  if (m_bf16Outputs && n > 0) m_backend.toBf16(reinterpret_cast<bfloat16*>(stored), written, n);
}

bool Model::recomputes(int layer) const {
  return m_fullyRecomputed[static_cast<size_t>(layer)];
}

// A layer's units in the order every rank of a group issues their collectives: its own, its local experts'
// (expert parallelism: sharded over the expert-data-parallel group), the tied embedding's.
void Model::acquire(int layer) {
  const int u = m_params->unitOfLayer(layer), experts = m_params->expertUnitOfLayer(layer);
  Status s = m_params->gather(u);
  if (s && experts >= 0) s = m_params->gather(experts);
  if (s && readsTied(layer)) s = m_params->gather(m_params->tiedUnit());
  if (!s) throw CommFailure("gathering the parameters of " + m_spec.layers[layer].name + ": " + s.message());
}

void Model::awaitParamGathers(int layer) {
  const int u = m_params->unitOfLayer(layer), experts = m_params->expertUnitOfLayer(layer);
  Status s = m_params->awaitParamGather(u);
  if (s && experts >= 0) s = m_params->awaitParamGather(experts);
  if (s && readsTied(layer)) s = m_params->awaitParamGather(m_params->tiedUnit());
  if (!s)
    throw CommFailure("gathering the updated parameters of " + m_spec.layers[layer].name + ": " +
                      s.message());
}

bool Model::readsTied(int layer) const {
  return (layer == 0 || layer == numLayers() - 1) && m_params->tiedUnit() >= 0;
}

void Model::prefetch(int layer) {
  const int experts = m_params->expertUnitOfLayer(layer);
  Status s = m_params->prefetch(m_params->unitOfLayer(layer));
  if (s && experts >= 0) s = m_params->prefetch(experts);
  if (s && readsTied(layer)) s = m_params->prefetch(m_params->tiedUnit());
  if (!s)
    throw CommFailure("prefetching the parameters of " + m_spec.layers[layer].name + ": " + s.message());
}

void Model::releaseParams(int layer) {
  m_params->release(m_params->unitOfLayer(layer));
  if (m_params->expertUnitOfLayer(layer) >= 0) m_params->release(m_params->expertUnitOfLayer(layer));
  if (readsTied(layer)) m_params->release(m_params->tiedUnit());
}

void Model::ensureGrads(int layer) {
  const int experts = m_params->expertUnitOfLayer(layer);
  Status s = m_params->ensureGrads(m_params->unitOfLayer(layer));
  if (s && experts >= 0) s = m_params->ensureGrads(experts);
  if (s && readsTied(layer)) s = m_params->ensureGrads(m_params->tiedUnit());
  if (!s)
    throw CommFailure("finishing the gradient reduction before " + m_spec.layers[layer].name + ": " +
                      s.message());
}

void Model::reduceGrads(int layer) {
  const int experts = m_params->expertUnitOfLayer(layer);
  Status s = m_params->reduceGrads(m_params->unitOfLayer(layer));
  if (s && experts >= 0) s = m_params->reduceGrads(experts);
  if (!s) throw CommFailure("reducing the gradients of " + m_spec.layers[layer].name + ": " + s.message());
}

void Model::startSync(int layer) {
  // The tied embedding unit is synced by the executor at the end of the step (first across its two stages).
  // A layer's local experts (expert parallelism) are a unit of their own, summed over their replicas; every
  // rank starts the two in this order.
  Status s = m_params->startSync(m_params->unitOfLayer(layer));
  const int experts = m_params->expertUnitOfLayer(layer);
  if (s && experts >= 0) s = m_params->startSync(experts);
  if (!s)
    throw CommFailure("starting the gradient sync of " + m_spec.layers[layer].name + ": " + s.message());
}

const float* Model::forwardChunk(int c, int slot, const float* input, const Batch& batch,
                                 const ForwardMode& mode, int microbatch) {
  const auto& layers = m_shard.chunks[c];
  const int first = layers.front();
  const BatchView v = view(batch, c, slot, true);
  for (int l : layers) {
    awaitParamGathers(l);
    const int m0 = mark();
    acquire(l);
    if (l != layers.back()) prefetch(l + 1);  // ZeRO-3: the next layer's gather travels while l computes
    if (mode.training && m_layers[l]->gradientsInForward()) ensureGrads(l);
    float* stored = output(l, slot, batch.B);
    float* y = outputTarget(l, stored, batch.B);
    m_layers[l]->forward(layerInput(l, first, slot, input, v), y, v, mode, slot);
    if (mode.training) m_forwardAux += m_layers[l]->auxLoss(slot);
    storeOutput(l, stored, y, batch.B);
    releaseParams(l);
    // What a layer keeps for backward: dropped now where backward recomputes it, and in evaluation, which
    // has no backward, for every layer but the head (its loss statistics and logits are read afterwards).
    // (Evaluation kept every layer's activations of its microbatch: with full recompute that is more than
    // training ever holds, and the largest model that trained on an H100 ran out of memory in its final
    // evaluation.)
    if ((mode.training && recomputes(l)) || (!mode.training && l != numLayers() - 1))
      m_layers[l]->releaseSlot(slot);
    addSpan('F', l, microbatch, m_shard.chunkIds[c], m0);
  }
  const int last = layers.back();
  return m_layers[last]->outputFloats(batch.B) > 0 ? m_acts[last][slot].data() : nullptr;
}

void Model::backwardChunk(int c, int slot, const float* input, const float* dOut, float* dIn,
                          const Batch& batch, BackwardPart part, int microbatch, bool finalUse) {
  const auto& layers = m_shard.chunks[c];
  const int first = layers.front(), last = layers.back();
  const ForwardMode recomputeMode{true, 1.0f};
  const BatchView v = view(batch, c, slot, false);
  // The gradient of layer j's output lives in workspace slot kLayerScratchSlots + j % 2 inside a chunk. Under
  // bf16 the chunk's output gradient comes in bf16 (a message, or the next local chunk's dIn): widened there.
  const float* dOutWide = dOut;
  if (m_bf16Outputs && dOut && part != BackwardPart::Weight) {
    const size_t n = static_cast<size_t>(m_layers[last]->outputFloats(batch.B));
    float* w = m_workspace.get(kLayerScratchSlots + last % 2, n, false);
    m_backend.fromBf16(w, reinterpret_cast<const bfloat16*>(dOut), n);
    dOutWide = w;
  }
  for (int l = last; l >= first; --l) {
    const int m0 = mark();
    const float* x = layerInput(l, first, slot, input, v);
    acquire(l);
    if (l > first) prefetch(l - 1);  // ZeRO-3: backward prefetch of the layer before
    ensureGrads(l);
    if (part == BackwardPart::Weight) {
      m_layers[l]->backward(x, nullptr, nullptr, v, slot, part);
    } else {
      // The re-run writes the output it wrote in forward (the same op on the same input): the kept one
      // stands, a bf16 one is not rounded again.
      if (recomputes(l))
        m_layers[l]->forward(x, outputTarget(l, output(l, slot, batch.B), batch.B), v, recomputeMode, slot);
      // The input's gradient: the other scratch slot, or the chunk's dIn (in bf16: staged in that slot).
      const size_t inFloats = l > 0 ? inputFloats(l, batch.B) : 0;
      float* dx = nullptr;
      if (l > first || (dIn && m_bf16Outputs))
        dx = m_workspace.get(kLayerScratchSlots + (l + 1) % 2, inFloats, true);
      else if (l == first)
        dx = dIn;
      const float* dy = l == last
                            ? dOutWide
                            : m_workspace.get(kLayerScratchSlots + l % 2,
                                              static_cast<size_t>(m_layers[l]->outputFloats(batch.B)), false);
      m_layers[l]->backward(x, dy, dx, v, slot, part);
      // bf16: every layer's input gradient is rounded to bf16 (Megatron-LM's activation gradients are bf16
      // tensors), so a pipeline message of it, which travels as bf16, loses nothing.
      if (m_bf16Outputs && dx && inFloats > 0) {
        if (l == first) {
          m_backend.toBf16(reinterpret_cast<bfloat16*>(dIn), dx, inFloats);
        } else {
          auto* t = reinterpret_cast<bfloat16*>(m_workspace.get(kOutputStaging, (inFloats + 1) / 2, false));
          m_backend.toBf16(t, dx, inFloats);
          m_backend.fromBf16(dx, t, inFloats);
        }
      }
    }
    releaseParams(l);
    if (recomputes(l) && part != BackwardPart::Input) m_layers[l]->releaseSlot(slot);
    if (part != BackwardPart::Input) {
      // The layer's gradients of this microbatch are complete: the step's last use syncs them; under
      // ZeRO >= 2 every microbatch's are reduce-scattered at once (ParameterStore::reduceGrads), so
      // sequence parallelism's LayerNorm sums come first each time.
      if (finalUse) {
        m_layers[l]->finalizeGrads();
        startSync(l);
      } else if (m_shard.store.zero >= 2) {
        m_layers[l]->finalizeGrads();
        reduceGrads(l);
      }
    }
    addSpan(part == BackwardPart::Weight ? 'W' : 'B', l, microbatch, m_shard.chunkIds[c], m0);
  }
}

void Model::releaseSlot(int c, int slot) {
  for (int l : m_shard.chunks[c]) m_layers[l]->releaseSlot(slot);
}

LossStats Model::headStats(int slot) const {
  return holdsHead() ? m_layers.back()->lossStats(slot) : LossStats{};
}

LossStats Model::forwardBackward(const Batch& batch, float lossScale, int microbatch) {
  const ForwardMode mode{true, lossScale};
  forwardChunk(0, 0, nullptr, batch, mode, microbatch);
  backwardChunk(0, 0, nullptr, nullptr, nullptr, batch, BackwardPart::All, microbatch, false);
  return headStats(0);
}

LossStats Model::forward(const Batch& batch, bool keepLogits) {
  const ForwardMode mode{false, 1.0f, keepLogits};
  std::vector<Span>* sink = std::exchange(m_spans, nullptr);  // evaluation is not part of a step's spans
  forwardChunk(0, 0, nullptr, batch, mode, 0);
  m_spans = sink;
  return headStats(0);
}

}  // namespace ms
