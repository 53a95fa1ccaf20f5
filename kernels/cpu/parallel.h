// Private to kernels/cpu: how the kernels split work between OpenMP threads. Every split here is a pure
// function of the sizes, the thread count and (for LineAlignedSplit) an address, so a given thread count
// always gives the same partition and so the same floating-point summation order.
#pragma once

#include <omp.h>

#include <cstddef>
#include <cstdint>

namespace ms::cpu::detail {

// Below this many elements of work a parallel region costs more than it saves.
inline constexpr size_t kMinParallelWork = 1 << 14;

inline int maxThreads() {
  return omp_get_max_threads();
}

// Rows [begin, end) of `count` owned by thread `tid` of `nthreads` under an even static split.
inline void splitRange(size_t count, int tid, int nthreads, size_t& begin, size_t& end) {
  const size_t base = count / size_t(nthreads);
  const size_t extra = count % size_t(nthreads);
  const size_t t = size_t(tid);
  begin = t * base + (t < extra ? t : extra);
  end = begin + base + (t < extra ? 1 : 0);
}

// Channel ranges of rows of C floats for thread `tid` of `nthreads`: an even split whose inner boundaries are
// moved forward to the next 64-byte line of memory in each row, so that two threads never write the same
// cache line (false sharing on a row's boundary line costs more than the row's arithmetic). Ownership depends
// only on the address, C and the thread count: each element has one owner and is summed in a fixed order.
// Construct once per thread; range() costs a few integer operations per row.
class LineAlignedSplit {
 public:
  LineAlignedSplit(int C, int tid, int nthreads)
      : m_C(C),
        m_lo(tid <= 0 ? 0 : size_t(C) * size_t(tid) / size_t(nthreads)),
        m_hi(tid + 1 >= nthreads ? size_t(C) : size_t(C) * size_t(tid + 1) / size_t(nthreads)),
        m_first(tid <= 0),
        m_last(tid + 1 >= nthreads) {}

  // [c0, c1) of the row starting at `row`.
  void range(const float* row, int& c0, int& c1) const {
    const size_t off = (reinterpret_cast<uintptr_t>(row) / sizeof(float)) % kLine;
    c0 = m_first ? 0 : align(off, m_lo);
    c1 = m_last ? m_C : align(off, m_hi);
  }

 private:
  static constexpr size_t kLine = 16;  // floats per 64-byte line

  int align(size_t off, size_t nominal) const {
    const size_t aligned = (off + nominal + kLine - 1) / kLine * kLine - off;
    return aligned < size_t(m_C) ? int(aligned) : m_C;
  }

  int m_C;
  size_t m_lo, m_hi;
  bool m_first, m_last;
};

}  // namespace ms::cpu::detail
