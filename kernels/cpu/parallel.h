// Private to kernels/cpu: how the kernels split work between OpenMP threads. Every split here is a pure
// function of the sizes and the thread count, so a given thread count always gives the same partition and so
// the same floating-point summation order.
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

}  // namespace ms::cpu::detail
