// Bounded waits for communication; see comm_watchdog.h.
//
// What always holds: the timeout, the abandoned flag and the fault counter are the only process-wide state
// here (atomics: the communicators' waits may run on several threads).
#include "runtime/comm_watchdog.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "runtime/heartbeat.h"

namespace ms {

namespace {

std::atomic<double> g_timeoutS{kDefaultCommTimeoutS};
std::atomic<bool> g_abandoned{false};
std::atomic<long long> g_operations{0};

struct InjectedCommFault {
  enum Kind { None, Hang, Error } kind = None;
  int rank = -1;
  long long operation = -1;
};

const InjectedCommFault& injected() {
  static const InjectedCommFault fault = [] {
    InjectedCommFault f;
    const char* v = std::getenv("MESHSTUDIO_FAULT");
    int r = -1;
    long long n = -1;
    if (v && std::sscanf(v, "comm-hang:%d:%lld", &r, &n) == 2)
      f.kind = InjectedCommFault::Hang;
    else if (v && std::sscanf(v, "comm-error:%d:%lld", &r, &n) == 2)
      f.kind = InjectedCommFault::Error;
    f.rank = r;
    f.operation = n;
    return f;
  }();
  return fault;
}

}  // namespace

void setCommTimeout(double seconds) {
  g_timeoutS.store(seconds);
}

double commTimeout() {
  return g_timeoutS.load();
}

bool communicationAbandoned() {
  return g_abandoned.load();
}

Status waitBounded(const std::string& what, const std::function<Expected<bool>()>& poll,
                   const std::function<void()>& abort) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const double timeout = commTimeout();
  for (long long polls = 0;; ++polls) {
    Expected<bool> done = poll();
    if (!done) {
      g_abandoned.store(true);
      if (abort) abort();
      return Status::error(what + ": " + done.message() + "; the communicator was aborted");
    }
    if (*done) return Status::ok();
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (timeout > 0 && waited > timeout) {
      g_abandoned.store(true);
      if (abort) abort();
      char text[160];
      std::snprintf(text, sizeof text,
                    ": no progress for %.0f s (training.comm_timeout_s): a peer stopped taking part (hung, "
                    "dead or cut off); the communicator was aborted",
                    waited);
      return Status::error(what + text);
    }
    // Spin (yielding) for the first millisecond: most collectives end within it, and a sleeping host would
    // see them late. Then sleep a fiftieth of the time waited so far (20 us to 1 ms): a wait ends at most 2%
    // later than its operation, and a long one costs no CPU.
    if (polls < 16 || waited < 1e-3) {
      std::this_thread::yield();
      continue;
    }
    const auto share = std::chrono::microseconds(static_cast<long long>(waited * 1e6 / 50));
    std::this_thread::sleep_for(
        std::clamp(share, std::chrono::microseconds(20), std::chrono::microseconds(1000)));
  }
}

Status injectedCommFault() {
  const InjectedCommFault& f = injected();
  if (f.kind == InjectedCommFault::None) return Status::ok();
  static const int rank = [] {
    const char* v = std::getenv("OMPI_COMM_WORLD_RANK");
    if (!v) v = std::getenv("PMI_RANK");
    return v ? std::atoi(v) : 0;
  }();
  if (f.rank != rank) return Status::ok();
  if (++g_operations != f.operation) return Status::ok();
  if (f.kind == InjectedCommFault::Error)
    return Status::error("asynchronous error: unhandled system error (injected by MESHSTUDIO_FAULT)");
  setActivity("communication hung by MESHSTUDIO_FAULT");
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace ms
