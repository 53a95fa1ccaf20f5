// Internal to the layer implementations (transformer.cpp, gpt_layers.cpp, classifier_layers.cpp): parameter
// binding and the per-kind factories that makeLayer() dispatches to. Every layer keeps ctx.backend and runs
// all its tensor work (ops, copies, zeroing) through it; parameter values and gradients are backend memory.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/layers.h"

namespace ms {

// A parameter of a layer: resolved to its current value and gradient pointers at each use (ZeRO-3 gathers and
// frees a unit's values; ZeRO-2 creates its gradients per step). A layer only reads the working value
// (ParameterStore::weight: fp32, or bf16 in mixed precision), which every op takes as a TensorIn; value()
// and gemm() name the same thing at the call sites of non-GEMM and GEMM uses.
struct BoundParam {
  ParameterStore* store = nullptr;
  int index = -1;
  TensorIn value() const { return store->weight(index); }
  TensorIn gemm() const { return store->weight(index); }
  GradOut grad() const { return store->gradOut(index); }  // fp32 or bf16 ("grad_precision")
  const Parameter& info() const { return store->params()[index]; }
};
// The store must hold the parameter (the ModelSpec and the layers are built from the same names; a miss is a
// programming error and throws std::logic_error naming the parameter).
BoundParam bindParam(ParameterStore& params, const std::string& name);

// Per-slot storage of a layer: a vector of caches grown on demand.
template <typename Cache>
class SlotCaches {
 public:
  explicit SlotCaches(MemoryTracker* tracker) : m_tracker(tracker) {}
  Cache& operator[](int slot) {
    if (slot >= static_cast<int>(m_caches.size())) m_caches.resize(slot + 1);
    if (!m_caches[slot]) m_caches[slot] = std::make_unique<Cache>(m_tracker);
    return *m_caches[slot];
  }
  const Cache* find(int slot) const {
    return slot < static_cast<int>(m_caches.size()) ? m_caches[slot].get() : nullptr;
  }
  void release(int slot) {
    if (slot < static_cast<int>(m_caches.size())) m_caches[slot].reset();
  }

 private:
  MemoryTracker* m_tracker;
  std::vector<std::unique_ptr<Cache>> m_caches;
};

// A tensor forward keeps for backward that backward only multiplies (a linear layer's input, attention's
// output): in GemmPrecision::Bf16 it is kept in bf16, since the GEMMs round it to bf16 anyway (the products
// are unchanged, the memory half; torch.autocast likewise saves a matmul's input in the matmul's precision),
// else in fp32. Forward writes the values into target() (the buffer itself in fp32, a workspace slot in bf16)
// and then calls keep(); backward reads in().
class KeptInput {
 public:
  explicit KeptInput(MemoryTracker* tracker) : m_buf(0, MemoryCategory::Activations, tracker) {}
  // Where forward writes the n values: the buffer itself in fp32; in bf16 workspace slot `slot` (n floats,
  // taken only then), the fp32 staging keep() converts from.
  float* target(size_t n, Workspace& ws, int slot) {
    m_bf16 = m_buf.backend().gemmPrecision() == GemmPrecision::Bf16;
    m_n = n;
    m_buf.reserve(m_bf16 ? (n + 1) / 2 : n);
    return m_bf16 ? ws.get(slot, n, false) : m_buf.data();
  }
  // Stores what target() received (converting it in bf16) and returns it as a GEMM input.
  TensorIn keep(const float* written) {
    if (m_bf16) m_buf.backend().toBf16(bf16Data(), written, m_n);
    return in();
  }
  TensorIn in() const { return m_bf16 ? TensorIn(bf16Data()) : TensorIn(m_buf.data()); }
  // After target() in bf16: the bf16 storage itself, for an op that writes the kept values directly (in()
  // then returns them; keep() is not called).
  bool bf16() const { return m_bf16; }
  bfloat16* storage() const { return m_bf16 ? bf16Data() : nullptr; }

 private:
  bfloat16* bf16Data() const { return reinterpret_cast<bfloat16*>(const_cast<float*>(m_buf.data())); }
  Buffer m_buf;
  bool m_bf16 = false;
  size_t m_n = 0;
};

// A tensor forward keeps for backward that other ops than GEMMs read again (a transformer block's q|k|v,
// softmax probabilities, residual and GELU input): fp32, or in GemmPrecision::Bf16 kept in bf16, as
// Megatron-LM keeps every activation but the LayerNorm and softmax row statistics (Korthikanti et al. 2022,
// section 4.1, counts them at 2 bytes each). Forward writes the values into target() (the buffer in fp32, the
// workspace slot `slot` in bf16) and calls keep(), which in bf16 rounds them in place by default, so forward
// goes on with exactly the values backward reads; backward's read() widens them into the same slot (exact).
class KeptTensor {
 public:
  explicit KeptTensor(MemoryTracker* tracker) : m_buf(0, MemoryCategory::Activations, tracker) {}
  // bf16 only where the backend computes in bf16 and `allowBf16` (row statistics pass false).
  float* target(size_t n, Workspace& ws, int slot, bool allowBf16 = true) {
    m_bf16 = allowBf16 && m_buf.backend().gemmPrecision() == GemmPrecision::Bf16;
    m_n = n;
    m_slot = slot;
    m_buf.reserve(m_bf16 ? (n + 1) / 2 : n);
    return m_bf16 ? ws.get(slot, n, false) : m_buf.data();
  }
  // Stores what target() received. round: in bf16, also replace the written values by the stored ones.
  void keep(float* written, bool round = true) {
    if (!m_bf16) return;
    m_buf.backend().toBf16(bf16Data(), written, m_n);
    if (round) m_buf.backend().fromBf16(written, bf16Data(), m_n);
  }
  // The kept values as fp32: the buffer, or widened into the target's workspace slot (valid until that slot's
  // next use).
  const float* read(Workspace& ws) {
    if (!m_bf16) return m_buf.data();
    float* w = ws.get(m_slot, m_n, false);
    m_buf.backend().fromBf16(w, bf16Data(), m_n);
    return w;
  }
  // After target() in bf16: the bf16 storage, for ops that write the kept values (instead of keep()) or read
  // them without widening (instead of read()).
  bool bf16() const { return m_bf16; }
  bfloat16* storage() { return m_bf16 ? bf16Data() : nullptr; }

 private:
  bfloat16* bf16Data() { return reinterpret_cast<bfloat16*>(m_buf.data()); }
  Buffer m_buf;
  bool m_bf16 = false;
  size_t m_n = 0;
  int m_slot = 0;
};

// The workspace slot that stages activation collectives in bf16 (allReduceActivations; the transformer
// block's sequence-parallel ones too).
inline constexpr int kActivationCommSlot = 13;
static_assert(kActivationCommSlot < kLayerScratchSlots);

// Sums x (n fp32 activations or activation gradients) over the TP group in place: in fp32, or where the
// backend computes in bf16 in bf16, as Megatron-LM's collectives of its bf16 tensors do: rounded into
// workspace slot kActivationCommSlot, summed there (each sum in fp32, rounded: CommType::BF16) and widened
// back. Half the bytes; each rank's partial sum is rounded.
void allReduceActivations(const TensorParallel& tp, Backend& be, Workspace& ws, float* x, size_t n);

std::unique_ptr<Layer> makeTransformerBlock(const LayerSpec& spec, const LayerContext& ctx, bool causal);
std::unique_ptr<Layer> makeGptEmbedding(const LayerSpec& spec, const LayerContext& ctx);
std::unique_ptr<Layer> makeGptHead(const LayerSpec& spec, const LayerContext& ctx);
std::unique_ptr<Layer> makeVitEmbedding(const LayerSpec& spec, const LayerContext& ctx);
std::unique_ptr<Layer> makeVitHead(const LayerSpec& spec, const LayerContext& ctx);
std::unique_ptr<Layer> makeMlpBlock(const LayerSpec& spec, const LayerContext& ctx, int index);
std::unique_ptr<Layer> makeMlpHead(const LayerSpec& spec, const LayerContext& ctx);
std::unique_ptr<Layer> makeCnnStem(const LayerSpec& spec, const LayerContext& ctx);
std::unique_ptr<Layer> makeCnnBlock(const LayerSpec& spec, const LayerContext& ctx);
std::unique_ptr<Layer> makeCnnHead(const LayerSpec& spec, const LayerContext& ctx);

}  // namespace ms
