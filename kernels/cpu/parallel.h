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

// body(i) for every i in [0, count), vectorised, and split over the OpenMP threads when `parallel` (the work
// is worth a parallel region). Use it in place of `parallel for simd if (parallel)`, whose serial fallback
// GCC 12 compiles without the simd: below the threshold the AdamW update ran at 4.3 ns an element against
// 0.8 above it, GELU at 6.9 against 0.8 (one thread, this machine), so every tensor under 16k elements ran
// scalar. The body must capture by value ([=]): a by-reference capture of a local (AdamW's scalars) keeps
// the serial loop scalar the same way.
template <typename Body>
inline void serialSimd(ptrdiff_t count, Body body) {
#pragma omp simd
  for (ptrdiff_t i = 0; i < count; i++) body(i);
}
// The parallel form splits the range itself (splitRange, the partition of schedule(static)) and runs each
// thread's part as its own `omp simd` loop over a copy of the body. `parallel for simd` over the shared body
// compiled scalar with GCC 12 (the outlined function reads the captures through a pointer it cannot prove
// unaliased): GELU forward ran at 9.5 ns an element on one thread of an AMD EPYC (bench_kernels, 2M
// elements).
template <typename Body>
inline void parallelSimd(ptrdiff_t count, const Body& body) {
#pragma omp parallel
  {
    size_t begin = 0, end = 0;
    splitRange(size_t(count), omp_get_thread_num(), omp_get_num_threads(), begin, end);
    const Body local = body;
    const ptrdiff_t first = ptrdiff_t(begin), last = ptrdiff_t(end);
#pragma omp simd
    for (ptrdiff_t i = first; i < last; i++) local(i);
  }
}
template <typename Body>
inline void forEachSimd(ptrdiff_t count, bool parallel, const Body& body) {
  if (parallel)
    parallelSimd(count, body);
  else
    serialSimd(count, body);
}

}  // namespace ms::cpu::detail
