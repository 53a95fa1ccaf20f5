// Thread count shared by our OpenMP loops and OpenBLAS. The count lives in the OpenMP runtime (nthreads-var)
// and in OpenBLAS, never in a variable of ours. With the OpenMP build of OpenBLAS, BLAS reads
// omp_get_max_threads() on each call and runs single-threaded inside our parallel regions.
#include <omp.h>

#include "kernels/cpu/cpu_ops.h"

extern "C" void openblas_set_num_threads(int);

namespace ms::cpu {

void setThreads(int n) {
  if (n <= 0) n = omp_get_num_procs();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int threads() {
  return omp_get_max_threads();
}

}  // namespace ms::cpu
