// libms_kernel_profile.so: a per-kernel profile of any CUDA program, for machines without Nsight Systems (the
// lent GPU machines have none, and Nsight Compute replays every kernel: two GPT-2 steps took over 120 s).
// It is a CUDA injection library: the driver loads it into the program when CUDA_INJECTION64_PATH names it,
// and calls InitializeInjection, which turns on CUPTI's activity records for kernels, copies and memsets
// (timestamps taken by the GPU, a few percent of overhead). At exit the records are summed per kernel name.
//
//   CUDA_INJECTION64_PATH=.../libms_kernel_profile.so MS_KPROF_OUT=profile.txt
//   MS_KPROF_STEP_MARKER=adamw MS_KPROF_SKIP_STEPS=2 meshstudio-engine train CONFIG
//
// MS_KPROF_STEP_MARKER (optional): a substring of the name of the kernel that ends a training step (the
// optimizer's). The timeline is cut after each of its launches; the first MS_KPROF_SKIP_STEPS steps (default
// 1: cuBLAS's heuristics, first-touch allocations) and everything after the last marker are left out, and
// the report gives per-step figures: each kernel's time, its share, its launches, and how much of the step's
// wall span (first kernel start to last kernel end) the GPU was busy (the union of all activity intervals):
// the rest is launch overhead and host work the GPU waited for. Without a marker the whole run is summed.
// MS_KPROF_OUT: the report's file (default stderr). MS_KPROF_TOP: rows (default 40).
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Span {
  uint64_t start = 0;
  uint64_t end = 0;
  int name = 0;  // index into names()
};

std::mutex& lock() {
  static std::mutex m;
  return m;
}
std::vector<Span>& spans() {
  static std::vector<Span> s;
  return s;
}
std::vector<std::string>& names() {
  static std::vector<std::string> n;
  return n;
}
std::map<std::string, int>& nameIndex() {
  static std::map<std::string, int> m;
  return m;
}
size_t& dropped() {
  static size_t d = 0;
  return d;
}

int internName(const std::string& name) {
  auto [it, fresh] = nameIndex().emplace(name, int(names().size()));
  if (fresh) names().push_back(name);
  return it->second;
}

// "void ms::cuda::detail::(anonymous namespace)::foo<64>(float*, int)" -> "ms::cuda::detail::foo<64>": the
// parameters and anonymous namespaces carry no information for a profile and make rows unreadable.
std::string readable(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = (status == 0 && d != nullptr) ? std::string(d) : std::string(mangled);
  std::free(d);
  for (const char* anon : {"(anonymous namespace)::"}) {
    for (size_t p; (p = s.find(anon)) != std::string::npos;) s.erase(p, std::strlen(anon));
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  // Cut the parameter list: the last '(' whose ')' closes the string, at template depth 0.
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s[i] == '(' && depth == 0 && i > 0) {
      s.erase(i);
      break;
    }
  }
  return s;
}

constexpr size_t kBufferBytes = 8u << 20;

void CUPTIAPI bufferRequested(uint8_t** buffer, size_t* size, size_t* maxRecords) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *maxRecords = 0;
}

void CUPTIAPI bufferCompleted(CUcontext, uint32_t streamId, uint8_t* buffer, size_t, size_t validSize) {
  (void)streamId;
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> guard(lock());
  while (cuptiActivityGetNextRecord(buffer, validSize, &record) == CUPTI_SUCCESS) {
    Span span;
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(record);
        span = {k->start, k->end, internName(readable(k->name))};
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(record);
        static const char* kinds[] = {"?",    "HtoD", "DtoH", "HtoA", "AtoH", "AtoA",
                                      "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"};
        const unsigned kind = m->copyKind < 11 ? m->copyKind : 0;
        span = {m->start, m->end, internName(std::string("[memcpy ") + kinds[kind] + "]")};
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(record);
        span = {m->start, m->end, internName("[memset]")};
        break;
      }
      default:
        continue;
    }
    if (span.end > span.start) spans().push_back(span);
  }
  size_t lost = 0;
  if (cuptiActivityGetNumDroppedRecords(nullptr, streamId, &lost) == CUPTI_SUCCESS) dropped() += lost;
  std::free(buffer);
}

// Busy time of [from, to): the union of the spans' intervals inside it (spans sorted by start).
uint64_t busyTime(const std::vector<Span>& sorted, size_t first, size_t last) {
  uint64_t busy = 0, coveredTo = 0;
  for (size_t i = first; i < last; ++i) {
    const uint64_t s = std::max(sorted[i].start, coveredTo);
    if (sorted[i].end > s) {
      busy += sorted[i].end - s;
      coveredTo = sorted[i].end;
    }
  }
  return busy;
}

void report() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> guard(lock());
  if (spans().empty()) return;  // a process that ran no kernels (a launcher) leaves the report to its child
  std::vector<Span> all = spans();
  std::sort(all.begin(), all.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  const char* outPath = std::getenv("MS_KPROF_OUT");
  FILE* out = outPath != nullptr ? std::fopen(outPath, "w") : stderr;
  if (out == nullptr) {
    std::fprintf(stderr, "kernel_profile: cannot write MS_KPROF_OUT=%s\n", outPath);
    out = stderr;
  }
  const char* marker = std::getenv("MS_KPROF_STEP_MARKER");
  const int skip = std::getenv("MS_KPROF_SKIP_STEPS") ? std::atoi(std::getenv("MS_KPROF_SKIP_STEPS")) : 1;
  const int top = std::getenv("MS_KPROF_TOP") ? std::atoi(std::getenv("MS_KPROF_TOP")) : 40;

  // The window [first, last) of spans that is summed, and how many steps it holds.
  size_t first = 0, last = all.size();
  int steps = 1;
  if (marker != nullptr && *marker != '\0') {
    auto lower = [](std::string s) {
      for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
      return s;
    };
    const std::string needle = lower(marker);
    std::vector<bool> isMarker(names().size());
    for (size_t n = 0; n < names().size(); ++n)
      isMarker[n] = lower(names()[n]).find(needle) != std::string::npos;
    std::vector<size_t> ends;  // index one past each marker launch (case-insensitive substring)
    for (size_t i = 0; i < all.size(); ++i) {
      if (isMarker[all[i].name]) ends.push_back(i + 1);
    }
    // A step's optimizer may launch the marker several times (one per parameter group): a step ends at the
    // last marker launch before a non-marker kernel that follows it. Merge runs of adjacent markers.
    std::vector<size_t> stepEnds;
    for (size_t k = 0; k < ends.size(); ++k) {
      if (k + 1 < ends.size() && ends[k + 1] == ends[k] + 1) continue;
      stepEnds.push_back(ends[k]);
    }
    if (int(stepEnds.size()) <= skip) {
      std::fprintf(out,
                   "kernel_profile: %zu steps found by the marker \"%s\", %d to skip: nothing to report\n",
                   stepEnds.size(), marker, skip);
      if (out != stderr) std::fclose(out);
      return;
    }
    first = skip > 0 ? stepEnds[skip - 1] : 0;
    last = stepEnds.back();
    steps = int(stepEnds.size()) - skip;
  }
  if (first >= last) {
    std::fprintf(out, "kernel_profile: no GPU activity recorded\n");
    if (out != stderr) std::fclose(out);
    return;
  }
  struct Row {
    uint64_t ns = 0;
    uint64_t launches = 0;
  };
  std::vector<Row> rows(names().size());
  uint64_t total = 0, endMax = 0;
  for (size_t i = first; i < last; ++i) {
    rows[all[i].name].ns += all[i].end - all[i].start;
    rows[all[i].name].launches += 1;
    total += all[i].end - all[i].start;
    endMax = std::max(endMax, all[i].end);
  }
  const uint64_t span = endMax - all[first].start;
  const uint64_t busy = busyTime(all, first, last);
  std::vector<int> order;
  for (int i = 0; i < int(rows.size()); ++i) {
    if (rows[i].launches > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](int a, int b) { return rows[a].ns > rows[b].ns; });
  std::fprintf(out,
               "kernel_profile: %d step(s)%s; per step: wall span %.3f ms, GPU busy %.3f ms (%.1f%%), "
               "kernel+copy time %.3f ms, %.0f launches%s\n",
               steps, marker ? " (cut after each launch of the marker kernel)" : " (the whole run)",
               span / 1e6 / steps, busy / 1e6 / steps, 100.0 * busy / std::max<uint64_t>(span, 1),
               total / 1e6 / steps, double(last - first) / steps,
               dropped() ? (", " + std::to_string(dropped()) + " records DROPPED").c_str() : "");
  std::fprintf(out, "%10s %6s %8s %9s  %s\n", "ms/step", "share", "launches", "us/launch", "kernel");
  for (int k = 0; k < int(order.size()) && k < top; ++k) {
    const Row& r = rows[order[k]];
    std::fprintf(out, "%10.3f %5.1f%% %8.1f %9.1f  %s\n", r.ns / 1e6 / steps,
                 100.0 * r.ns / std::max<uint64_t>(total, 1), double(r.launches) / steps,
                 r.ns / 1e3 / r.launches, names()[order[k]].substr(0, 150).c_str());
  }
  if (int(order.size()) > top) {
    uint64_t rest = 0;
    for (int k = top; k < int(order.size()); ++k) rest += rows[order[k]].ns;
    std::fprintf(out, "%10.3f %5.1f%%  (%zu more kernels)\n", rest / 1e6 / steps,
                 100.0 * rest / std::max<uint64_t>(total, 1), order.size() - top);
  }
  if (out != stderr) std::fclose(out);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  if (cuptiActivityRegisterCallbacks(bufferRequested, bufferCompleted) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_profile: cuptiActivityRegisterCallbacks failed; no profile\n");
    return 1;
  }
  bool ok = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) == CUPTI_SUCCESS;
  ok = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) == CUPTI_SUCCESS && ok;
  ok = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) == CUPTI_SUCCESS && ok;
  if (!ok)
    std::fprintf(stderr, "kernel_profile: an activity kind could not be enabled; the profile is partial\n");
  std::atexit(report);
  return 1;
}
