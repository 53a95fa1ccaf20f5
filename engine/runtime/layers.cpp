// makeLayer(): picks the runtime layer for a LayerSpec; see layers.h and layer_impl.h.
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "runtime/layer_impl.h"

namespace ms {

Expected<int64_t> headChunkRowsOverride() {
  const char* v = std::getenv("MESHSTUDIO_HEAD_CHUNK_ROWS");
  if (!v || !*v) return int64_t(0);
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*end || n <= 0)
    return Status::error(std::string("environment variable MESHSTUDIO_HEAD_CHUNK_ROWS: expected a positive "
                                     "integer, got '") +
                         v + "'");
  return int64_t(n);
}

BoundParam bindParam(ParameterStore& params, const std::string& name) {
  const int i = params.indexOf(name);
  if (i < 0) throw std::logic_error("layer parameter not in the store: " + name);
  return BoundParam{&params, i};
}

void TensorParallel::allReduce(float* x, size_t n) const {
  if (!comm || size == 1) return;
  Status s = comm->allReduce(x, x, n, CommType::F32, ReduceOp::Sum);
  if (!s) throw CommFailure("tensor-parallel all-reduce: " + s.message());
}

void TensorParallel::allReduce(GradOut g, size_t n) const {
  if (!comm || size == 1 || !g) return;
  Status s = comm->allReduce(g.data, g.data, n, g.bf16 ? CommType::BF16 : CommType::F32, ReduceOp::Sum);
  if (!s) throw CommFailure("tensor-parallel all-reduce of a gradient: " + s.message());
}

void TensorParallel::allGather(TensorIn send, void* recv, size_t n) const {
  Status s = comm->allGather(send.data, recv, n, send.bf16 ? CommType::BF16 : CommType::F32);
  if (!s) throw CommFailure("tensor-parallel all-gather: " + s.message());
}

void TensorParallel::allReduce(bfloat16* x, size_t n) const {
  if (!comm || size == 1) return;
  Status s = comm->allReduce(x, x, n, CommType::BF16, ReduceOp::Sum);
  if (!s) throw CommFailure("tensor-parallel all-reduce (bf16): " + s.message());
}

void allReduceActivations(const TensorParallel& tp, Backend& be, Workspace& ws, float* x, size_t n) {
  if (be.gemmPrecision() != GemmPrecision::Bf16 || tp.size == 1) return tp.allReduce(x, n);
  auto* s = reinterpret_cast<bfloat16*>(ws.get(kActivationCommSlot, (n + 1) / 2, false));
  be.toBf16(s, x, n);
  tp.allReduce(s, n);
  be.fromBf16(x, s, n);
}

void TensorParallel::reduceScatter(TensorIn send, void* recv, size_t n) const {
  Status s =
      comm->reduceScatter(send.data, recv, n, send.bf16 ? CommType::BF16 : CommType::F32, ReduceOp::Sum);
  if (!s) throw CommFailure("tensor-parallel reduce-scatter: " + s.message());
}

CommRequestPtr TensorParallel::iallGather(TensorIn send, void* recv, size_t n) const {
  Expected<CommRequestPtr> r =
      comm->iallGather(send.data, recv, n, send.bf16 ? CommType::BF16 : CommType::F32);
  if (!r) throw CommFailure("tensor-parallel all-gather (overlapped): " + r.message());
  return std::move(*r);
}

CommRequestPtr TensorParallel::ireduceScatter(TensorIn send, void* recv, size_t n) const {
  Expected<CommRequestPtr> r =
      comm->ireduceScatter(send.data, recv, n, send.bf16 ? CommType::BF16 : CommType::F32, ReduceOp::Sum);
  if (!r) throw CommFailure("tensor-parallel reduce-scatter (overlapped): " + r.message());
  return std::move(*r);
}

void TensorParallel::finish(CommRequestPtr& request, const char* what) {
  if (!request) return;
  Status s = request->wait();
  request.reset();
  if (!s) throw CommFailure(std::string("tensor-parallel ") + what + " (overlapped): " + s.message());
}

void TensorParallel::allReduceMax(float* x, size_t n) const {
  if (!comm || size == 1) return;
  Status s = comm->allReduce(x, x, n, CommType::F32, ReduceOp::Max);
  if (!s) throw CommFailure("tensor-parallel all-reduce (max): " + s.message());
}

std::unique_ptr<Layer> makeLayer(const LayerSpec& spec, LayerContext ctx) {
  const ModelType type = ctx.model.type;
  if (type == ModelType::Cnn) {
    switch (spec.kind) {
      case LayerKind::Embedding:
        return makeCnnStem(spec, ctx);
      case LayerKind::Block:
        return makeCnnBlock(spec, ctx);
      case LayerKind::Head:
        return makeCnnHead(spec, ctx);
    }
  }
  switch (spec.kind) {
    case LayerKind::Embedding:
      return isLanguageModel(type) ? makeGptEmbedding(spec, ctx) : makeVitEmbedding(spec, ctx);
    case LayerKind::Block:
      if (type == ModelType::Mlp) return makeMlpBlock(spec, ctx, std::stoi(spec.name.substr(6)));
      return makeTransformerBlock(spec, ctx, isLanguageModel(type));
    case LayerKind::Head:
      if (isLanguageModel(type)) return makeGptHead(spec, ctx);
      return type == ModelType::Vit ? makeVitHead(spec, ctx) : makeMlpHead(spec, ctx);
  }
  return nullptr;
}

}  // namespace ms
