// Memory accounting by category. Every buffer the runtime allocates for a training step is a Buffer that
// reports its size to a MemoryTracker under one category, so the engine can stream current and peak bytes per
// category beside the plan's prediction.
//
// Buffers live in the memory of the tracker's backend (kernels/backend.h): host memory on the CPU, device
// memory on a GPU, where the host must not touch them (use the backend's upload/download/copy/zero).
//
// What always holds: a tracker's current bytes per category equal the sum of the live Buffers registered to
// it; peak is the maximum current seen since the last resetPeak(). Buffers are 256-byte aligned and
// zero-filled when allocated. A buffer without a tracker lives in host memory (hostBackend()).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/backend.h"

namespace ms {

enum class MemoryCategory { Parameters, Gradients, Optimizer, Activations, Communication, Workspace, Count };
inline constexpr int kMemoryCategories = static_cast<int>(MemoryCategory::Count);
const char* toString(MemoryCategory c);

// The plain CPU backend every host-memory buffer and op uses (one per process, stateless but for its marks).
Backend& hostBackend();

class MemoryTracker {
 public:
  // backend: where the buffers registered to this tracker live (nullptr: hostBackend()).
  explicit MemoryTracker(Backend* backend = nullptr) : m_backend(backend ? backend : &hostBackend()) {}
  Backend& backend() const { return *m_backend; }
  void add(MemoryCategory c, int64_t bytes);
  int64_t current(MemoryCategory c) const { return m_current[idx(c)]; }
  int64_t peak(MemoryCategory c) const { return m_peak[idx(c)]; }
  int64_t currentTotal() const;
  int64_t peakTotal() const { return m_peakTotal; }
  void resetPeak();

 private:
  static int idx(MemoryCategory c) { return static_cast<int>(c); }
  Backend* m_backend;
  std::array<int64_t, kMemoryCategories> m_current{};
  std::array<int64_t, kMemoryCategories> m_peak{};
  int64_t m_peakTotal = 0;
};

// An owned, aligned, zero-initialised float array in the tracker's backend memory, counted by the tracker
// (tracker may be null: uncounted, in host memory).
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t count, MemoryCategory category, MemoryTracker* tracker);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Backend memory (see above).
  float* data() { return m_data; }
  const float* data() const { return m_data; }
  size_t size() const { return m_size; }
  // Host access: only for buffers in host memory.
  float& operator[](size_t i) { return m_data[i]; }
  float operator[](size_t i) const { return m_data[i]; }
  Backend& backend() const { return *m_backend; }
  void zero();  // through the backend
  // Grows (never shrinks) to at least count floats; contents are undefined after a growth.
  void reserve(size_t count);
  // Frees the memory (the buffer keeps its category and tracker and can grow again).
  void clear() { release(); }

 private:
  void release();
  float* m_data = nullptr;
  size_t m_size = 0;
  MemoryCategory m_category = MemoryCategory::Workspace;
  MemoryTracker* m_tracker = nullptr;
  Backend* m_backend = &hostBackend();
};

// Scratch memory shared by all layers of a rank: layers run one at a time, so one set of numbered slots
// serves them all (a layer's backward scratch is dead once the layer returns). Slots grow to the largest
// request.
class Workspace {
 public:
  explicit Workspace(MemoryTracker* tracker) : m_tracker(tracker) {}
  Backend& backend() const { return m_tracker ? m_tracker->backend() : hostBackend(); }
  // Slot `slot` with at least count floats, its first count floats zeroed when zero is true (else undefined).
  // Valid until the next get() of the same slot.
  float* get(int slot, size_t count, bool zero);

 private:
  std::vector<Buffer> m_slots;
  MemoryTracker* m_tracker;
};

}  // namespace ms
