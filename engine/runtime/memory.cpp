// MemoryTracker and Buffer; see memory.h.
#include "runtime/memory.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "common/metrics_schema.h"

namespace ms {

const char* toString(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::Parameters:
      return metrics::category::kParameters;
    case MemoryCategory::Gradients:
      return metrics::category::kGradients;
    case MemoryCategory::Optimizer:
      return metrics::category::kOptimizer;
    case MemoryCategory::Activations:
      return metrics::category::kActivations;
    case MemoryCategory::Communication:
      return metrics::category::kCommunication;
    case MemoryCategory::Workspace:
      return metrics::category::kWorkspace;
    case MemoryCategory::Count:
      break;
  }
  return "?";
}

void MemoryTracker::add(MemoryCategory c, int64_t bytes) {
  m_current[idx(c)] += bytes;
  if (m_current[idx(c)] > m_peak[idx(c)]) m_peak[idx(c)] = m_current[idx(c)];
  const int64_t total = currentTotal();
  if (total > m_peakTotal) m_peakTotal = total;
}

int64_t MemoryTracker::currentTotal() const {
  int64_t t = 0;
  for (int64_t v : m_current) t += v;
  return t;
}

void MemoryTracker::resetPeak() {
  m_peak = m_current;
  m_peakTotal = currentTotal();
}

Backend& hostBackend() {
  static const std::unique_ptr<Backend> backend = makeCpuBackend(false);
  return *backend;
}

Buffer::Buffer(size_t count, MemoryCategory category, MemoryTracker* tracker)
    : m_category(category), m_tracker(tracker), m_backend(tracker ? &tracker->backend() : &hostBackend()) {
  reserve(count);
}

Buffer::~Buffer() {
  release();
}

Buffer::Buffer(Buffer&& o) noexcept {
  *this = std::move(o);
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    m_data = std::exchange(o.m_data, nullptr);
    m_size = std::exchange(o.m_size, 0);
    m_category = o.m_category;
    m_tracker = o.m_tracker;
    m_backend = o.m_backend;
  }
  return *this;
}

void Buffer::release() {
  if (m_data) {
    m_backend->deallocate(m_data, m_size * sizeof(float));
    if (m_tracker) m_tracker->add(m_category, -static_cast<int64_t>(m_size * sizeof(float)));
  }
  m_data = nullptr;
  m_size = 0;
}

void Buffer::zero() {
  if (m_data) m_backend->zero(m_data, m_size * sizeof(float));
}

void Buffer::reserve(size_t count) {
  if (count <= m_size) return;
  const MemoryCategory category = m_category;
  MemoryTracker* tracker = m_tracker;
  release();
  m_category = category;
  m_tracker = tracker;
  m_data = static_cast<float*>(m_backend->allocate(count * sizeof(float)));
  m_size = count;
  if (m_tracker) m_tracker->add(m_category, static_cast<int64_t>(m_size * sizeof(float)));
}

float* Workspace::get(int slot, size_t count, bool zero) {
  while (static_cast<int>(m_slots.size()) <= slot)
    m_slots.emplace_back(0, MemoryCategory::Workspace, m_tracker);
  Buffer& b = m_slots[slot];
  b.reserve(count);
  if (zero) b.backend().zero(b.data(), count * sizeof(float));
  return b.data();
}

}  // namespace ms
