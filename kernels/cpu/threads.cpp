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
#include <sys/resource.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

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

Status checkThreads(int n) {
  if (n <= 1) return Status::ok();
  // n - 1 threads alive at once, as the pool will be, then released and joined.
  std::mutex mutex;
  std::condition_variable released;
  bool release = false;
  std::vector<std::thread> started;
  started.reserve(static_cast<size_t>(n - 1));
  std::string failure;
  for (int i = 1; i < n; ++i) {
    try {
      started.emplace_back([&] {
        std::unique_lock<std::mutex> lock(mutex);
        released.wait(lock, [&] { return release; });
      });
    } catch (const std::system_error& e) {
      failure = e.code().message();
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    release = true;
  }
  released.notify_all();
  const size_t got = started.size() + 1;
  for (std::thread& t : started) t.join();
  if (failure.empty()) return Status::ok();
  std::string limit;
  rlimit r = {};
  if (getrlimit(RLIMIT_NPROC, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    limit = "; this user may run " + std::to_string(static_cast<unsigned long long>(r.rlim_cur)) +
            " processes and threads in all (ulimit -u)";
  return Status::error("cannot start " + std::to_string(n) + " threads: only " + std::to_string(got) +
                       " could be started (" + failure + ")" + limit);
}

int threads() {
  return omp_get_max_threads();
}

}  // namespace ms::cpu
