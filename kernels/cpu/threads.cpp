// Thread count shared by our OpenMP loops and OpenBLAS. The count lives in the OpenMP runtime (nthreads-var)
// and in OpenBLAS, never in a variable of ours. With the OpenMP build of OpenBLAS, BLAS reads
// omp_get_max_threads() on each call and runs single-threaded inside our parallel regions.
//
// setThreads() also switches every thread of the pool to flush-to-zero / denormals-are-zero. Training drives
// some values (Adam's second moments of rarely used embedding rows, far tails of softmax) into the denormal
// range, where x86 arithmetic takes microcode assists ~100x slower than normal; measured here, a byte-level
// GPT slowed from 0.17 to 1.4 s/step after a few dozen steps without it. Flushing changes results only below
// 1.2e-38 and is deterministic.
#include <omp.h>

#if defined(__SSE2__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#endif

#include "kernels/cpu/cpu_ops.h"

extern "C" void openblas_set_num_threads(int);

namespace ms::cpu {

namespace {
void flushDenormalsOnThisThread() {
#if defined(__SSE2__)
  _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
  _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
#endif
}
}  // namespace

void setThreads(int n) {
  if (n <= 0) n = omp_get_num_procs();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
  flushDenormalsOnThisThread();
  // The pool's threads persist between parallel regions, so setting their MXCSR once holds for later regions.
#pragma omp parallel num_threads(n)
  flushDenormalsOnThisThread();
}

int threads() {
  return omp_get_max_threads();
}

}  // namespace ms::cpu
