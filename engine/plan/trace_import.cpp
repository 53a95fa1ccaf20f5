// Reading Chrome trace JSON from PyTorch's profilers and Nsight Systems conversions; see trace_import.h for
// the rules and docs/calibration.md for what the names mean.
//
// The Trace Event Format is Google's "Trace Event Format" document (ts and dur in microseconds; "X" complete
// events; "B"/"E" pairs per thread, an "E" closing the thread's latest open "B"; "M" metadata such as
// process_name). Kineto's additions (pytorch/kineto, libkineto/src/output_json.cpp): "cat" "kernel",
// "gpu_memcpy", "gpu_memset", "cuda_runtime", "cpu_op", "user_annotation", "gpu_user_annotation"; args
// "External id" (shared by an op and the kernels it launched), "correlation" (a kernel and its launch),
// "Input Dims" / "Input type" with record_shapes; top-level "distributedInfo" (torch/profiler/profiler.py,
// _get_distributed_info) and "baseTimeNanoseconds" (ts relative to it in newer versions); and PyTorch's
// record_param_comms args "Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype"
// (torch/csrc/distributed/c10d/ParamCommsUtils.hpp) that Kineto copies onto NCCL kernels.
#include "plan/trace_import.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>

namespace ms {

namespace {

using nlohmann::json;

std::string traceLower(const std::string& s) {
  std::string out = s;
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Letters and digits only, lower case: "ncclDevKernel_AllReduce_Sum_f32" -> "nccldevkernelallreducesumf32".
std::string traceWords(const std::string& s) {
  std::string out;
  for (char c : s)
    if (std::isalnum(static_cast<unsigned char>(c)))
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool traceStarts(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}
bool traceHas(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

// nccl-tests' name of a collective from the words of an event or "Collective name" arg.
std::string traceCollectiveFromWords(const std::string& words) {
  if (traceHas(words, "reducescatter")) return "reduce_scatter";
  if (traceHas(words, "allreduce")) return "all_reduce";
  if (traceHas(words, "allgather")) return "all_gather";
  if (traceHas(words, "alltoall")) return "all_to_all";
  if (traceHas(words, "broadcast") || traceHas(words, "bcast")) return "broadcast";
  if (traceHas(words, "sendrecv") || traceHas(words, "send") || traceHas(words, "recv")) return "sendrecv";
  if (traceHas(words, "barrier")) return "barrier";
  if (traceHas(words, "reduce")) return "reduce";
  return "collective";
}

// A finite number, or a string holding one (some converters quote ts).
bool traceNumber(const json* v, double& out) {
  if (!v) return false;
  if (v->is_number()) {
    out = v->get<double>();
    return std::isfinite(out);
  }
  if (v->is_string()) {
    const std::string& s = v->get_ref<const std::string&>();
    if (s.empty()) return false;
    errno = 0;
    char* end = nullptr;
    out = std::strtod(s.c_str(), &end);
    return errno == 0 && end && *end == '\0' && std::isfinite(out);
  }
  return false;
}

const json* traceMember(const json& o, const char* key) {
  if (!o.is_object()) return nullptr;
  const auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}

bool traceInteger(const json* v, std::int64_t& out) {
  double d = 0;
  if (!traceNumber(v, d) || d != std::floor(d) || std::fabs(d) > 9.0e15) return false;
  out = static_cast<std::int64_t>(d);
  return true;
}

// pid and tid are integers in Kineto, strings in the legacy export ("CPU functions"), anything elsewhere.
std::string traceIdKey(const json* v) {
  if (!v) return {};
  if (v->is_string()) return "s:" + v->get<std::string>();
  return v->dump();
}

// "rank 3 (stage 1)", "Rank_12", "[rank: 0]" -> the number; -1 when the text names no rank.
int traceRankInName(const std::string& text) {
  const std::string lower = traceLower(text);
  for (std::size_t at = lower.find("rank"); at != std::string::npos; at = lower.find("rank", at + 4)) {
    std::size_t i = at + 4;
    while (i < lower.size() && (lower[i] == ' ' || lower[i] == '_' || lower[i] == ':' || lower[i] == '#' ||
                                lower[i] == '-' || lower[i] == '='))
      ++i;
    std::size_t j = i;
    while (j < lower.size() && std::isdigit(static_cast<unsigned char>(lower[j])) && j - i < 9) ++j;
    if (j > i) return std::stoi(lower.substr(i, j - i));
  }
  return -1;
}

bool traceIsRuntimeCategory(const std::string& lowerCat) {
  return lowerCat == "cuda_runtime" || lowerCat == "cuda_driver" || lowerCat == "runtime" ||
         lowerCat == "driver" || lowerCat == "hip_runtime";
}

// The dims of "Input Dims" that are lists of integers (a tensor each), in order; others (scalars, tensor
// lists that the profiler shows as []) give an empty entry so positions still match the op's inputs.
std::vector<std::vector<std::int64_t>> traceInputDims(const json* args) {
  std::vector<std::vector<std::int64_t>> out;
  const json* dims = args ? traceMember(*args, "Input Dims") : nullptr;
  if (!dims || !dims->is_array()) return out;
  for (const json& d : *dims) {
    std::vector<std::int64_t> shape;
    if (d.is_array())
      for (const json& x : d) {
        std::int64_t v = 0;
        if (!traceInteger(&x, v) || v < 0) {
          shape.clear();
          break;
        }
        shape.push_back(v);
      }
    out.push_back(std::move(shape));
  }
  return out;
}

std::int64_t traceNumel(const std::vector<std::int64_t>& shape) {
  if (shape.empty()) return 0;
  std::int64_t n = 1;
  for (std::int64_t d : shape) n = d > 0 && n <= (std::int64_t(1) << 52) / d ? n * d : 0;
  return n;
}

// m, n, k (and batch) of a GEMM op from its input shapes (record_shapes): aten::mm (m,k) @ (k,n); addmm
// (bias, (m,k), (k,n)); bmm (b,m,k) @ (b,k,n); baddbmm (bias, (b,m,k), (b,k,n)); matmul (..., m, k) @
// (..., k, n) with the leading dims as the batch, or a 2-D right operand folding them into m; linear
// (..., k) @ weight (n, k)^T; _scaled_mm as mm.
bool traceGemmShape(const std::string& name, const std::vector<std::vector<std::int64_t>>& dims,
                    TraceSpan& span) {
  const auto at = [&](std::size_t i) -> const std::vector<std::int64_t>& {
    static const std::vector<std::int64_t> kNone;
    return i < dims.size() ? dims[i] : kNone;
  };
  std::int64_t m = 0, n = 0, k = 0, b = 1;
  if (name == "aten::mm" || name == "aten::_scaled_mm" || name == "aten::addmm") {
    const std::size_t first = name == "aten::addmm" ? 1 : 0;
    const auto &a = at(first), &w = at(first + 1);
    if (a.size() != 2 || w.size() != 2) return false;
    m = a[0], k = a[1], n = w[1];
  } else if (name == "aten::bmm" || name == "aten::baddbmm") {
    const std::size_t first = name == "aten::baddbmm" ? 1 : 0;
    const auto &a = at(first), &w = at(first + 1);
    if (a.size() != 3 || w.size() != 3) return false;
    b = a[0], m = a[1], k = a[2], n = w[2];
  } else if (name == "aten::matmul") {
    const auto &a = at(0), &w = at(1);
    if (a.size() < 2 || w.empty()) return false;
    k = a.back();
    if (w.size() == 1) {
      m = traceNumel({a.begin(), a.end() - 1}), n = 1;
    } else if (w.size() == 2) {
      m = traceNumel({a.begin(), a.end() - 1}), n = w[1];
    } else {
      m = a[a.size() - 2], n = w.back();
      b = std::max(a.size() > 2 ? traceNumel({a.begin(), a.end() - 2}) : 1,
                   traceNumel({w.begin(), w.end() - 2}));
    }
  } else if (name == "aten::linear") {
    const auto &a = at(0), &w = at(1);
    if (a.empty() || w.size() != 2) return false;
    m = a.size() == 1 ? 1 : traceNumel({a.begin(), a.end() - 1}), k = a.back(), n = w[0];
  } else {
    return false;
  }
  if (m <= 0 || n <= 0 || k <= 0 || b <= 0) return false;
  span.m = m, span.n = n, span.k = k, span.batch = b;
  return true;
}

// The element size named in an NCCL kernel's name ("..._Sum_f32_RING_LL", "..._bfloat16", "int8_t").
int traceElementBytesInName(const std::string& name) {
  std::string token;
  int found = 0;
  const auto check = [&] {
    if (!token.empty() && !found) found = traceElementBytes(token);
    token.clear();
  };
  for (char c : name) {
    if (c == '_' || c == ' ' || c == '(' || c == ')' || c == '<' || c == '>' || c == ',') {
      check();
    } else {
      token += c;
    }
  }
  check();
  return found;
}

// A collective's size and group from its args (or its op's), by nccl-tests' definition of "size".
struct TraceCommArgs {
  double inElems = -1, outElems = -1;
  int groupSize = 0;
  int elementBytes = 0;
  std::string collective;  // "Collective name"
  bool any() const { return inElems >= 0 || outElems >= 0; }
};

TraceCommArgs traceCommArgs(const json* args) {
  TraceCommArgs c;
  if (!args || !args->is_object()) return c;
  double v = 0;
  // Element counts beyond 2^53 are not counts (and would not round to bytes).
  if (traceNumber(traceMember(*args, "In msg nelems"), v) && v >= 0 && v < 9.0e15) c.inElems = v;
  if (traceNumber(traceMember(*args, "Out msg nelems"), v) && v >= 0 && v < 9.0e15) c.outElems = v;
  std::int64_t g = 0;
  if (traceInteger(traceMember(*args, "Group size"), g) && g > 0 && g < (1 << 24)) c.groupSize = int(g);
  if (const json* d = traceMember(*args, "dtype"); d && d->is_string())
    c.elementBytes = traceElementBytes(*d);
  if (const json* n = traceMember(*args, "Collective name");
      n && n->is_string() && !n->get<std::string>().empty())
    c.collective = traceCollectiveFromWords(traceWords(n->get<std::string>()));
  if (!c.any()) {  // record_shapes: the tensors' elements as the input
    const auto dims = traceInputDims(args);
    std::int64_t total = 0;
    for (const auto& d : dims) total = std::min(total + traceNumel(d), std::int64_t(1) << 52);
    if (total > 0) c.inElems = double(total);
  }
  if (!c.elementBytes)
    if (const json* types = traceMember(*args, "Input type"); types && types->is_array())
      for (const json& t : *types)
        if (t.is_string() && (c.elementBytes = traceElementBytes(t.get<std::string>()))) break;
  return c;
}

void traceApplyComm(const TraceCommArgs& c, const std::string& eventName, TraceSpan& span) {
  if (!c.collective.empty() && (span.collective == "collective" || span.collective.empty()))
    span.collective = c.collective;
  if (c.groupSize > 0) span.groupSize = c.groupSize;
  if (!c.any()) return;
  int elem = c.elementBytes ? c.elementBytes : traceElementBytesInName(eventName);
  if (!elem) {
    elem = 4;
    span.elementBytesAssumed = true;
  }
  const double in = c.inElems, out = c.outElems;
  const int g = span.groupSize;
  double elems = -1;
  const std::string& op = span.collective;
  if (op == "all_gather")
    elems = out > 0 ? out : (in > 0 && g > 0 ? in * g : -1);
  else if (op == "reduce_scatter")
    elems = in > 0 && (out <= 0 || in >= out) ? in : (out > 0 && g > 0 ? out * g : in);
  else
    elems = in > 0 ? in : out;
  if (elems > 0) span.bytes = elems * elem;
}

struct TraceRaw {
  std::uint32_t name = 0;
  std::string cat;  // lower case
  std::string pid, tid;
  double start = 0, end = 0;  // microseconds, with the file's base time
  const json* args = nullptr;
  TraceEventClass cls;
};

struct TraceDoc {
  std::string file;
  json doc;
  const json* events = nullptr;
  double baseUs = 0;
  int rank = -1;  // distributedInfo's, else the file's implicit rank
  bool explicitRank = false;
  std::string backend;
  int worldSize = 0;
  std::map<std::string, int> pidRanks;  // process_name "rank N"
};

Status traceOpen(const TraceText& in, TraceDoc& d) {
  d.file = in.file;
  try {
    d.doc = json::parse(in.text);
  } catch (const json::exception& e) {
    // The format lets an array trace end without its ']' (a process that died while writing it).
    std::string t = in.text;
    while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
    if (!t.empty() && t.back() == ',') t.pop_back();
    std::size_t first = t.find_first_not_of(" \t\r\n");
    bool repaired = false;
    if (first != std::string::npos && t[first] == '[') {
      try {
        d.doc = json::parse(t + "]");
        repaired = true;
      } catch (const json::exception&) {
      }
    }
    if (!repaired) return Status::error(in.file + ": not JSON: " + e.what());
  }
  if (d.doc.is_array()) {
    d.events = &d.doc;
  } else if (d.doc.is_object()) {
    const json* ev = traceMember(d.doc, "traceEvents");
    if (!ev) {
      std::string keys;
      int shown = 0;
      for (auto it = d.doc.begin(); it != d.doc.end() && shown < 5; ++it, ++shown)
        keys += (keys.empty() ? "" : ", ") + it.key();
      return Status::error(in.file +
                           ": not a Chrome trace: expected an array of events or an object with a "
                           "\"traceEvents\" array; the object has " +
                           (keys.empty() ? std::string("no keys") : "the keys " + keys));
    }
    if (!ev->is_array())
      return Status::error(in.file + ": /traceEvents must be an array of events, got " +
                           std::string(ev->type_name()));
    d.events = ev;
    double base = 0;
    if (traceNumber(traceMember(d.doc, "baseTimeNanoseconds"), base)) d.baseUs = base / 1000.0;
    if (const json* info = traceMember(d.doc, "distributedInfo"); info && info->is_object()) {
      std::int64_t r = 0, w = 0;
      if (traceInteger(traceMember(*info, "rank"), r) && r >= 0 && r < (1 << 24)) {
        d.rank = int(r);
        d.explicitRank = true;
      }
      if (traceInteger(traceMember(*info, "world_size"), w) && w > 0 && w < (1 << 24)) d.worldSize = int(w);
      if (const json* b = traceMember(*info, "backend"); b && b->is_string())
        d.backend = b->get<std::string>();
    }
  } else {
    return Status::error(in.file +
                         ": not a Chrome trace: expected an array of events or an object with a "
                         "\"traceEvents\" array, got " +
                         std::string(d.doc.type_name()));
  }
  if (!d.explicitRank)
    for (const json& e : *d.events) {
      const json* ph = traceMember(e, "ph");
      const json* name = traceMember(e, "name");
      if (!ph || !ph->is_string() || ph->get<std::string>() != "M" || !name || !name->is_string() ||
          name->get<std::string>() != "process_name")
        continue;
      const json* args = traceMember(e, "args");
      const json* label = args ? traceMember(*args, "name") : nullptr;
      if (!label || !label->is_string()) continue;
      const int r = traceRankInName(label->get<std::string>());
      if (r >= 0) d.pidRanks[traceIdKey(traceMember(e, "pid"))] = r;
    }
  return Status::ok();
}

std::int64_t traceStepNumber(const std::string& name, std::int64_t fallback) {
  const std::size_t hash = name.find('#');
  if (hash == std::string::npos) return fallback;
  std::int64_t v = 0;
  std::size_t i = hash + 1;
  if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return fallback;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])) && v < (std::int64_t(1) << 50);
       ++i)
    v = v * 10 + (name[i] - '0');
  return v;
}

constexpr double kTraceNestingSlackUs = 1.0;
constexpr double kTraceNoLaunch = std::numeric_limits<double>::quiet_NaN();

struct TraceBuilder {
  TraceImport& out;
  std::unordered_map<std::string, std::uint32_t> nameIndex;
  std::int64_t assumedElementBytes = 0;

  std::uint32_t intern(const std::string& name) {
    const auto it = nameIndex.find(name);
    if (it != nameIndex.end()) return it->second;
    const auto id = static_cast<std::uint32_t>(out.names.size());
    out.names.push_back(name);
    nameIndex.emplace(name, id);
    return id;
  }
  void skip(const std::string& reason) { ++out.skipped[reason]; }

  // The duration events of one file, by rank.
  void readEvents(const TraceDoc& d, std::map<int, std::vector<TraceRaw>>& byRank) {
    std::map<std::pair<std::string, std::string>, std::vector<TraceRaw>> open;  // B events per thread
    for (const json& e : *d.events) {
      if (!e.is_object()) {
        skip("an event that is not an object");
        continue;
      }
      const json* ph = traceMember(e, "ph");
      if (!ph || !ph->is_string()) {
        skip("an event without a \"ph\" string");
        continue;
      }
      const std::string& phase = ph->get_ref<const std::string&>();
      if (phase != "X" && phase != "B" && phase != "E") continue;  // metadata, instants, counters, flows
      TraceRaw r;
      r.pid = traceIdKey(traceMember(e, "pid"));
      r.tid = traceIdKey(traceMember(e, "tid"));
      double ts = 0;
      if (!traceNumber(traceMember(e, "ts"), ts)) {
        skip(phase + " event without a numeric ts");
        continue;
      }
      if (phase == "E") {
        auto& stack = open[{r.pid, r.tid}];
        if (stack.empty()) {
          skip("E event without an open B on its thread");
          continue;
        }
        TraceRaw b = std::move(stack.back());
        stack.pop_back();
        if (d.baseUs + ts < b.start) {
          skip("E event before its B");
          continue;
        }
        b.end = d.baseUs + ts;
        place(d, std::move(b), byRank);
        continue;
      }
      const json* name = traceMember(e, "name");
      const std::string nameText =
          name && name->is_string() ? name->get<std::string>() : std::string("(unnamed)");
      const json* cat = traceMember(e, "cat");
      const std::string catText = cat && cat->is_string() ? cat->get<std::string>() : std::string();
      r.name = intern(nameText);
      r.cat = traceLower(catText);
      r.cls = classifyTraceEvent(nameText, catText);
      const json* args = traceMember(e, "args");
      r.args = args && args->is_object() ? args : nullptr;
      r.start = d.baseUs + ts;
      if (phase == "B") {
        open[{r.pid, r.tid}].push_back(std::move(r));
        continue;
      }
      double dur = 0;
      if (!traceNumber(traceMember(e, "dur"), dur)) {
        skip("X event without a numeric dur");
        continue;
      }
      if (dur < 0) {
        skip("X event with a negative dur");
        continue;
      }
      r.end = r.start + dur;
      place(d, std::move(r), byRank);
    }
    for (const auto& [thread, stack] : open)
      for (std::size_t i = 0; i < stack.size(); ++i) skip("B event never ended");
  }

  void place(const TraceDoc& d, TraceRaw r, std::map<int, std::vector<TraceRaw>>& byRank) {
    int rank = d.rank;
    if (!d.explicitRank && !d.pidRanks.empty()) {
      const auto it = d.pidRanks.find(r.pid);
      if (it == d.pidRanks.end()) {
        skip("event of a process whose process_name names no rank");
        return;
      }
      rank = it->second;
    }
    ++out.events;
    byRank[rank].push_back(std::move(r));
  }

  TraceRank buildRank(int rank, const TraceDoc& d, std::vector<TraceRaw>& raws);
};

// Intervals' union length; sorts its argument.
double traceUnion(std::vector<std::pair<double, double>>& iv) {
  std::sort(iv.begin(), iv.end());
  double total = 0, lo = 0, hi = 0;
  bool any = false;
  for (const auto& [a, b] : iv) {
    if (!any || a > hi) {
      if (any) total += hi - lo;
      lo = a, hi = b, any = true;
    } else {
      hi = std::max(hi, b);
    }
  }
  if (any) total += hi - lo;
  return total;
}

TraceRank TraceBuilder::buildRank(int rank, const TraceDoc& d, std::vector<TraceRaw>& raws) {
  TraceRank tr;
  tr.rank = rank;
  tr.file = d.file;
  tr.backend = d.backend;
  tr.worldSize = d.worldSize;

  std::vector<const TraceRaw*> cpuMarkers, gpuMarkers, device, cpu;
  std::unordered_map<std::int64_t, const TraceRaw*>
      launchOf;  // correlation -> the runtime call that launched it
  bool backendComms = false;
  for (const TraceRaw& r : raws) {
    const bool gpuAnnotation = r.cat == "gpu_user_annotation";
    if (r.cls.stepMarker) {
      (gpuAnnotation ? gpuMarkers : cpuMarkers).push_back(&r);
    } else if (gpuAnnotation || r.cat == "ac2g" || r.cat == "flow" || r.cat == "trace") {
      continue;
    } else if (isDeviceTraceEvent(r.cat)) {
      device.push_back(&r);
      backendComms = backendComms || r.cls.backendComms;
    } else {
      if (traceIsRuntimeCategory(r.cat)) {
        std::int64_t c = 0;
        if (r.args && traceInteger(traceMember(*r.args, "correlation"), c)) launchOf.emplace(c, &r);
      }
      cpu.push_back(&r);
      backendComms = backendComms || r.cls.backendComms;
    }
  }
  tr.deviceTimeline = !device.empty();

  // The effective kind of a CPU op: a c10d op or record_param_comms is the launch of a collective when the
  // backend's own events are there (they carry the time), else it is the collective.
  const auto effective = [&](const TraceRaw& r) {
    TraceEventClass c = r.cls;
    if (c.kind == TraceSpanKind::Collective && !c.backendComms && backendComms) c.kind = TraceSpanKind::Other;
    return c;
  };
  const auto makeSpan = [&](const TraceRaw& r, const TraceEventClass& c) {
    TraceSpan s;
    s.start = r.start;
    s.end = r.end;
    s.kind = c.kind;
    s.name = r.name;
    std::int64_t ext = -1;
    if (r.args && traceInteger(traceMember(*r.args, "External id"), ext)) s.link = ext;
    if (c.kind == TraceSpanKind::Collective) {
      s.collective = c.collective;
      traceApplyComm(traceCommArgs(r.args), out.names[r.name], s);
    } else if (c.kind == TraceSpanKind::Gemm) {
      traceGemmShape(out.names[r.name], traceInputDims(r.args), s);
    }
    return s;
  };

  std::vector<TraceSpan> spans;
  std::vector<double> launch;  // per device span, when its launch started (NaN: unknown)
  if (tr.deviceTimeline) {
    // What a kernel's own args lack comes from the op that launched it: the ops with its External id (or its
    // launch's: older Kineto gives the kernel the correlation as its id), else the GEMM or collective ops
    // around its launch on the launching thread, innermost first (an NCCL SendRecv kernel inside
    // "nccl:all_to_all" is an all_to_all: NCCL runs all-to-all as grouped sends and receives).
    std::unordered_multimap<std::int64_t, const TraceRaw*> byLink;
    std::map<std::pair<std::string, std::string>, std::vector<const TraceRaw*>>
        enclosing;  // by thread, start
    for (const TraceRaw* r : cpu) {
      std::int64_t ext = -1;
      if (r->args && traceInteger(traceMember(*r->args, "External id"), ext)) byLink.emplace(ext, r);
      if (r->cls.kind == TraceSpanKind::Gemm || r->cls.kind == TraceSpanKind::Collective)
        enclosing[{r->pid, r->tid}].push_back(r);
    }
    for (auto& [thread, ops] : enclosing)
      std::stable_sort(ops.begin(), ops.end(),
                       [](const TraceRaw* a, const TraceRaw* b) { return a->start < b->start; });
    out.hostOpsNotShown += static_cast<std::int64_t>(cpu.size());
    const auto needs = [](const TraceSpan& s) {
      return (s.kind == TraceSpanKind::Gemm && !s.m) ||
             (s.kind == TraceSpanKind::Collective &&
              (!s.bytes || !s.groupSize || s.collective == "collective" || s.collective == "sendrecv"));
    };
    const auto fill = [&](TraceSpan& s, const TraceRaw& kernel, const TraceRaw& op) {
      if (s.kind == TraceSpanKind::Gemm && op.cls.kind == TraceSpanKind::Gemm && !s.m) {
        traceGemmShape(out.names[op.name], traceInputDims(op.args), s);
      } else if (s.kind == TraceSpanKind::Collective && op.cls.kind == TraceSpanKind::Collective) {
        TraceSpan tmp = s;
        tmp.collective = op.cls.collective;
        tmp.bytes = 0;
        tmp.elementBytesAssumed = false;
        traceApplyComm(traceCommArgs(op.args), out.names[kernel.name], tmp);
        // The op the program called names the collective when the kernel's name does not: NCCL runs
        // all_to_all (and, in some builds, every collective) as SendRecv kernels.
        if (s.collective == "collective" ||
            (s.collective == "sendrecv" && tmp.collective != "sendrecv" && tmp.collective != "collective"))
          s.collective = tmp.collective;
        if (!s.bytes && tmp.bytes > 0) s.bytes = tmp.bytes, s.elementBytesAssumed = tmp.elementBytesAssumed;
        if (!s.groupSize) s.groupSize = tmp.groupSize;
      }
    };
    for (const TraceRaw* r : device) {
      TraceSpan s = makeSpan(*r, r->cls);
      std::int64_t corr = 0;
      const auto at = r->args && traceInteger(traceMember(*r->args, "correlation"), corr)
                          ? launchOf.find(corr)
                          : launchOf.end();
      const TraceRaw* launcher = at != launchOf.end() ? at->second : nullptr;
      std::vector<std::int64_t> links;
      if (s.link >= 0) links.push_back(s.link);
      std::int64_t ext = -1;
      if (launcher && launcher->args && traceInteger(traceMember(*launcher->args, "External id"), ext) &&
          ext != s.link)
        links.push_back(ext);
      for (const std::int64_t link : links) {
        const auto [lo, hi] = byLink.equal_range(link);
        for (auto it = lo; it != hi && needs(s); ++it) fill(s, *r, *it->second);
      }
      if (launcher && needs(s)) {
        const auto th = enclosing.find({launcher->pid, launcher->tid});
        if (th != enclosing.end()) {
          const auto& ops = th->second;
          auto it = std::upper_bound(ops.begin(), ops.end(), launcher->start,
                                     [](double t, const TraceRaw* op) { return t < op->start; });
          // The innermost first; nesting is shallow, so a few steps back reach the outermost.
          for (int steps = 0; it != ops.begin() && steps < 64 && needs(s); ++steps) {
            --it;
            if ((*it)->end >= launcher->start) fill(s, *r, **it);
          }
        }
      }
      ++out.eventsByKind[s.kind];
      launch.push_back(launcher ? launcher->start : kTraceNoLaunch);
      spans.push_back(std::move(s));
    }
  } else {
    // CPU ops: per thread, the outermost recognized ops, and each top-level other op split around the
    // recognized ones inside it.
    std::map<std::pair<std::string, std::string>, std::vector<const TraceRaw*>> threads;
    for (const TraceRaw* r : cpu) threads[{r->pid, r->tid}].push_back(r);
    for (auto& [thread, ops] : threads) {
      std::stable_sort(ops.begin(), ops.end(), [](const TraceRaw* a, const TraceRaw* b) {
        return a->start != b->start ? a->start < b->start : a->end > b->end;
      });
      struct Open {
        const TraceRaw* op;
        bool recognizedHere;  // it or an ancestor is recognized
        std::size_t root;     // index into roots
      };
      struct Root {
        const TraceRaw* op;
        bool other;
        std::vector<std::pair<double, double>> inside;
      };
      std::vector<Root> roots;
      std::vector<Open> stack;
      for (const TraceRaw* r : ops) {
        // Nested: starts inside the parent and ends by its end, give or take the exporters' resolution of a
        // microsecond (torch's legacy profiler rounds start and duration apart: a child may end 1 us late).
        while (!stack.empty() && !(stack.back().op->start <= r->start && r->start < stack.back().op->end &&
                                   r->end <= stack.back().op->end + kTraceNestingSlackUs))
          stack.pop_back();
        const TraceEventClass c = effective(*r);
        const bool recognized = c.kind != TraceSpanKind::Other;
        if (stack.empty()) {
          roots.push_back(Root{r, !recognized, {}});
          stack.push_back(Open{r, recognized, roots.size() - 1});
          if (recognized) {
            ++out.eventsByKind[c.kind];
            spans.push_back(makeSpan(*r, c));
          } else {
            ++out.eventsByKind[TraceSpanKind::Other];
          }
          continue;
        }
        const Open parent = stack.back();
        if (recognized && !parent.recognizedHere) {
          ++out.eventsByKind[c.kind];
          spans.push_back(makeSpan(*r, c));
          roots[parent.root].inside.emplace_back(r->start, r->end);
        } else {
          ++out.nested;
        }
        stack.push_back(Open{r, parent.recognizedHere || recognized, parent.root});
      }
      for (Root& root : roots) {
        if (!root.other) continue;
        std::sort(root.inside.begin(), root.inside.end());
        double at = root.op->start;
        const auto piece = [&](double a, double b) {
          if (b <= a) return;
          TraceSpan s;
          s.start = a, s.end = b, s.kind = TraceSpanKind::Other, s.name = root.op->name;
          spans.push_back(s);
        };
        for (const auto& [a, b] : root.inside) {
          piece(at, std::min(a, root.op->end));
          at = std::max(at, b);
        }
        piece(at, root.op->end);
      }
    }
  }

  // Steps.
  std::sort(cpuMarkers.begin(), cpuMarkers.end(), [](auto* a, auto* b) { return a->start < b->start; });
  std::sort(gpuMarkers.begin(), gpuMarkers.end(), [](auto* a, auto* b) { return a->start < b->start; });
  launch.resize(spans.size(), kTraceNoLaunch);
  {  // by start, launch times along
    std::vector<std::size_t> order(spans.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return spans[a].start < spans[b].start; });
    std::vector<TraceSpan> sorted;
    std::vector<double> launches;
    for (std::size_t i : order) {
      sorted.push_back(std::move(spans[i]));
      launches.push_back(launch[i]);
    }
    spans = std::move(sorted);
    launch = std::move(launches);
  }
  const bool useGpuMarkers = tr.deviceTimeline && !gpuMarkers.empty();
  const std::vector<const TraceRaw*>& markers = useGpuMarkers ? gpuMarkers : cpuMarkers;
  if (markers.empty()) {
    TraceStep step;
    if (!spans.empty()) {
      step.start = spans.front().start;
      step.end = step.start;
      for (const TraceSpan& s : spans) step.end = std::max(step.end, s.end);
    }
    step.spans = std::move(spans);
    if (!step.spans.empty()) tr.steps.push_back(std::move(step));
    return tr;
  }
  std::vector<TraceStep> steps(markers.size());
  for (std::size_t i = 0; i < markers.size(); ++i) {
    steps[i].number = traceStepNumber(out.names[markers[i]->name], std::int64_t(i));
    steps[i].start = markers[i]->start;
    steps[i].end = markers[i]->end;
  }
  const bool byLaunch = tr.deviceTimeline && !useGpuMarkers;  // kernels go with the step that launched them
  for (std::size_t i = 0; i < spans.size(); ++i) {
    TraceSpan& s = spans[i];
    const bool launched = byLaunch && !std::isnan(launch[i]);
    const double t = launched ? launch[i] : s.start;
    const auto it = std::upper_bound(steps.begin(), steps.end(), t,
                                     [](double v, const TraceStep& st) { return v < st.start; });
    // A kernel whose launch is unknown may run after its step's marker ended on the CPU (which runs ahead):
    // it stays with the latest step that started before it.
    if (it == steps.begin() || (t > (it - 1)->end && !(byLaunch && !launched))) {
      ++out.outsideSteps;
      continue;
    }
    (it - 1)->spans.push_back(s);
  }
  // Windows: a CPU step is its marker (stretched over its spans); a GPU step without GPU markers runs from
  // its first kernel to the next step's first kernel (the idle time between steps is the device's).
  for (std::size_t i = 0; i < steps.size(); ++i) {
    TraceStep& st = steps[i];
    if (st.spans.empty()) continue;
    double lo = st.spans.front().start, hi = lo;
    for (const TraceSpan& s : st.spans) hi = std::max(hi, s.end);
    if (byLaunch) {
      st.start = lo;
      st.end = hi;
      for (std::size_t j = i + 1; j < steps.size(); ++j)
        if (!steps[j].spans.empty()) {
          st.end = std::max(hi, steps[j].spans.front().start);
          break;
        }
    } else {
      st.start = std::min(st.start, lo);
      st.end = std::max(st.end, hi);
    }
  }
  for (TraceStep& st : steps)
    if (!st.spans.empty() || !tr.deviceTimeline) tr.steps.push_back(std::move(st));
  return tr;
}

}  // namespace

const char* toString(TraceSpanKind kind) {
  switch (kind) {
    case TraceSpanKind::Gemm:
      return "gemm";
    case TraceSpanKind::Attention:
      return "attention";
    case TraceSpanKind::Optimizer:
      return "optimizer";
    case TraceSpanKind::Collective:
      return "collective";
    case TraceSpanKind::Other:
      return "other";
  }
  return "other";
}

bool isDeviceTraceEvent(const std::string& category) {
  const std::string c = traceLower(category);
  if (c == "gpu_user_annotation") return false;
  return traceHas(c, "kernel") || traceStarts(c, "gpu_") || c == "memcpy" || c == "memset";
}

int traceElementBytes(const std::string& dtype) {
  std::string t = traceLower(dtype);
  for (const char* prefix : {"c10::", "torch.", "at::"})
    if (traceStarts(t, prefix)) t = t.substr(std::strlen(prefix));
  static const std::pair<const char*, int> kTypes[] = {
      {"float", 4},         {"f32", 4},           {"float32", 4},     {"fp32", 4},   {"int", 4},
      {"int32", 4},         {"i32", 4},           {"u32", 4},         {"uint32", 4}, {"int32_t", 4},
      {"uint32_t", 4},      {"unsigned int", 4},  {"bfloat16", 2},    {"bf16", 2},   {"half", 2},
      {"f16", 2},           {"fp16", 2},          {"float16", 2},     {"short", 2},  {"int16", 2},
      {"double", 8},        {"f64", 8},           {"float64", 8},     {"long", 8},   {"long int", 8},
      {"int64", 8},         {"i64", 8},           {"u64", 8},         {"uint64", 8}, {"int64_t", 8},
      {"uint64_t", 8},      {"long long", 8},     {"byte", 1},        {"char", 1},   {"bool", 1},
      {"int8", 1},          {"uint8", 1},         {"i8", 1},          {"u8", 1},     {"int8_t", 1},
      {"uint8_t", 1},       {"unsigned char", 1}, {"signed char", 1}, {"f8e4m3", 1}, {"f8e5m2", 1},
      {"float8_e4m3fn", 1}, {"float8_e5m2", 1},   {"fp8", 1}};
  for (const auto& [name, bytes] : kTypes)
    if (t == name) return bytes;
  return 0;
}

TraceEventClass classifyTraceEvent(const std::string& name, const std::string& category) {
  TraceEventClass c;
  const std::string lower = traceLower(name);
  const std::string cat = traceLower(category);
  if (traceStarts(lower, "profilerstep")) {
    c.stepMarker = true;
    return c;
  }
  if (cat == "python_function" || cat == "python") return c;  // Python frames enclose everything
  const bool backend = traceStarts(lower, "nccl:") || traceStarts(lower, "gloo:") ||
                       traceStarts(lower, "mpi:") || traceStarts(lower, "ucc:") ||
                       traceHas(lower, "ncclkernel") || traceHas(lower, "nccldevkernel");
  if (backend || traceStarts(lower, "c10d::") || lower == "record_param_comms" || traceHas(lower, "nccl")) {
    c.kind = TraceSpanKind::Collective;
    c.backendComms = backend || traceHas(lower, "nccl");
    c.collective = lower == "record_param_comms" ? "collective" : traceCollectiveFromWords(traceWords(name));
    return c;
  }
  if (traceHas(lower, "flash") || traceHas(lower, "fmha") || traceHas(lower, "sdpa") ||
      traceHas(lower, "scaled_dot_product") || traceHas(lower, "attention")) {
    c.kind = TraceSpanKind::Attention;
    return c;
  }
  static const char* const kGemmOps[] = {"aten::mm",     "aten::addmm",  "aten::bmm",    "aten::baddbmm",
                                         "aten::matmul", "aten::linear", "aten::addbmm", "aten::_scaled_mm"};
  // fbgemm_gpu's kernels are embedding lookups and permutations, not GEMMs.
  std::string gemmName = lower;
  for (std::size_t at = gemmName.find("fbgemm"); at != std::string::npos; at = gemmName.find("fbgemm"))
    gemmName.erase(at, 6);
  bool gemm = traceHas(gemmName, "gemm") || traceHas(lower, "cutlass") || traceHas(lower, "xmma") ||
              traceHas(lower, "cublas") || traceHas(lower, "nvjet") || traceStarts(lower, "sm90_");
  for (const char* op : kGemmOps) gemm = gemm || lower == op;
  if (gemm) {
    c.kind = TraceSpanKind::Gemm;
    return c;
  }
  if (traceStarts(lower, "optimizer.step") || traceHas(lower, "adam") || traceHas(lower, "adagrad") ||
      traceHas(lower, "multi_tensor_apply") || traceHas(lower, "fused_sgd")) {
    c.kind = TraceSpanKind::Optimizer;
    return c;
  }
  return c;
}

std::int64_t TraceImport::recognized() const {
  std::int64_t n = 0;
  for (const auto& [kind, count] : eventsByKind)
    if (kind != TraceSpanKind::Other) n += count;
  return n;
}

std::vector<std::pair<std::string, double>> traceTopNames(const TraceImport& trace, TraceSpanKind kind,
                                                          std::size_t n) {
  std::map<std::uint32_t, double> seconds;
  for (const TraceRank& r : trace.ranks)
    for (const TraceStep& st : r.steps)
      for (const TraceSpan& s : st.spans)
        if (s.kind == kind) seconds[s.name] += s.end - s.start;
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, t] : seconds) out.emplace_back(trace.names[name], t);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  if (out.size() > n) out.resize(n);
  return out;
}

Expected<TraceImport> importTraceTexts(const std::vector<TraceText>& inputs) {
  if (inputs.empty()) return Status::error("no trace files given");
  std::vector<TraceDoc> docs(inputs.size());
  std::set<int> claimed;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    MS_TRY(traceOpen(inputs[i], docs[i]));
    if (docs[i].explicitRank) {
      for (std::size_t j = 0; j < i; ++j)
        if (docs[j].explicitRank && docs[j].rank == docs[i].rank)
          return Status::error(docs[i].file + ": holds rank " + std::to_string(docs[i].rank) +
                               " (distributedInfo), as " + docs[j].file + " does");
      claimed.insert(docs[i].rank);
    }
  }
  int next = 0;
  for (TraceDoc& d : docs)
    if (!d.explicitRank && d.pidRanks.empty()) {
      while (claimed.count(next)) ++next;
      d.rank = next;
      claimed.insert(next);
    }

  TraceImport out;
  TraceBuilder b{out, {}, 0};
  std::map<int, std::string> owner;
  for (TraceDoc& d : docs) {
    out.files.push_back(d.file);
    std::map<int, std::vector<TraceRaw>> byRank;
    b.readEvents(d, byRank);
    if (byRank.empty())
      return Status::error(d.file +
                           ": no duration events (\"ph\" \"X\", or \"B\" and \"E\") with a numeric ts" +
                           (out.skipped.empty() ? std::string() : " (some were skipped as malformed)"));
    for (auto& [rank, raws] : byRank) {
      if (owner.count(rank))
        return Status::error(d.file + ": holds rank " + std::to_string(rank) + ", as " + owner[rank] +
                             " does");
      owner[rank] = d.file;
      out.ranks.push_back(b.buildRank(rank, d, raws));
    }
    d.doc = json();  // its events are spans now
  }
  std::sort(out.ranks.begin(), out.ranks.end(),
            [](const TraceRank& a, const TraceRank& c) { return a.rank < c.rank; });

  // Seconds from the earliest kept event; the group size of collectives that did not say.
  double origin = std::numeric_limits<double>::infinity();
  for (const TraceRank& r : out.ranks)
    for (const TraceStep& st : r.steps) {
      origin = std::min(origin, st.start);
      for (const TraceSpan& s : st.spans) origin = std::min(origin, s.start);
    }
  if (!std::isfinite(origin)) origin = 0;
  std::int64_t assumedBytes = 0, assumedGroup = 0, unknownBytes = 0;
  const int imported = static_cast<int>(out.ranks.size());
  for (TraceRank& r : out.ranks)
    for (TraceStep& st : r.steps) {
      st.start = (st.start - origin) * 1e-6;
      st.end = (st.end - origin) * 1e-6;
      for (TraceSpan& s : st.spans) {
        s.start = std::max(st.start, (s.start - origin) * 1e-6);
        s.end = std::min(std::max(s.start, (s.end - origin) * 1e-6), std::max(st.end, s.start));
        if (s.kind != TraceSpanKind::Collective) continue;
        if (!s.groupSize && s.collective != "barrier") {
          const int g = r.worldSize > 0 ? r.worldSize : imported >= 2 ? imported : 0;
          if (g) {
            s.groupSize = g;
            ++assumedGroup;
          }
        }
        if (s.elementBytesAssumed) ++assumedBytes;
        if (!s.bytes && s.collective != "barrier") ++unknownBytes;
      }
      st.end = std::max(st.end, st.start);
    }
  if (assumedGroup)
    out.notes.push_back(std::to_string(assumedGroup) +
                        " collectives did not say their group size: taken as the world size "
                        "(distributedInfo), else the number of ranks imported");
  if (assumedBytes)
    out.notes.push_back(
        std::to_string(assumedBytes) +
        " collectives did not say their element type: 4-byte elements assumed for their bytes");
  if (unknownBytes)
    out.notes.push_back(std::to_string(unknownBytes) +
                        " collectives have no size in the trace (no \"In msg nelems\" or \"Input Dims\"): "
                        "their time is counted, their bandwidth is not");
  if (out.outsideSteps)
    out.notes.push_back(std::to_string(out.outsideSteps) +
                        " events lie outside every ProfilerStep and are left out");
  return out;
}

Expected<TraceImport> importTraces(const std::vector<std::string>& paths) {
  std::vector<TraceText> inputs;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec))
      return Status::error(p + ": cannot read: " + std::strerror(EISDIR));
    std::ifstream in(p, std::ios::binary);
    if (!in) return Status::error(p + ": cannot read: " + std::strerror(errno));
    std::stringstream text;
    text << in.rdbuf();
    inputs.push_back(TraceText{p, text.str()});
  }
  return importTraceTexts(inputs);
}

// --- Calibration ---

bool traceCollectiveOp(const std::string& name, CollectiveOp& op) {
  static const std::pair<const char*, CollectiveOp> kOps[] = {
      {"sendrecv", CollectiveOp::SendRecv},    {"all_reduce", CollectiveOp::AllReduce},
      {"all_gather", CollectiveOp::AllGather}, {"reduce_scatter", CollectiveOp::ReduceScatter},
      {"all_to_all", CollectiveOp::AllToAll},  {"broadcast", CollectiveOp::Broadcast}};
  for (const auto& [n, o] : kOps)
    if (name == n) {
      op = o;
      return true;
    }
  return false;
}

TraceSummary summarizeTrace(const TraceImport& trace) {
  TraceSummary out;
  // (group size, op, bytes) -> per rank, the durations in call order.
  std::map<std::tuple<int, int, double>, std::map<int, std::vector<double>>> calls;
  for (const TraceRank& r : trace.ranks)
    for (const TraceStep& st : r.steps) {
      TraceStepSummary s;
      s.rank = r.rank;
      s.step = st.number;
      s.window = st.end - st.start;
      std::map<TraceSpanKind, std::vector<std::pair<double, double>>> byKind;
      std::vector<std::pair<double, double>> all, compute;
      std::map<std::pair<std::string, int>, TraceCollectiveSummary> coll;
      std::set<std::int64_t> countedLinks;
      for (const TraceSpan& sp : st.spans) {
        byKind[sp.kind].emplace_back(sp.start, sp.end);
        all.emplace_back(sp.start, sp.end);
        if (sp.kind != TraceSpanKind::Collective) compute.emplace_back(sp.start, sp.end);
        const double dur = sp.end - sp.start;
        if (sp.kind == TraceSpanKind::Gemm && sp.flops() > 0) {
          s.gemmShapedSeconds += dur;
          if (sp.link < 0 || countedLinks.insert(sp.link).second) s.gemmFlops += sp.flops();
        }
        if (sp.kind == TraceSpanKind::Collective) {
          TraceCollectiveSummary& c = coll[{sp.collective, sp.groupSize}];
          c.op = sp.collective;
          c.groupSize = sp.groupSize;
          ++c.count;
          c.seconds += dur;
          if (sp.bytes > 0) {
            ++c.sized;
            c.bytes += sp.bytes;
            c.sizedSeconds += dur;
          }
          CollectiveOp op{};
          if (sp.bytes > 0 && sp.groupSize >= 2 && dur > 0 && traceCollectiveOp(sp.collective, op))
            calls[{sp.groupSize, static_cast<int>(op), sp.bytes}][r.rank].push_back(dur);
        }
      }
      s.gemm = traceUnion(byKind[TraceSpanKind::Gemm]);
      s.attention = traceUnion(byKind[TraceSpanKind::Attention]);
      s.optimizer = traceUnion(byKind[TraceSpanKind::Optimizer]);
      s.other = traceUnion(byKind[TraceSpanKind::Other]);
      s.communication = traceUnion(byKind[TraceSpanKind::Collective]);
      s.busy = traceUnion(all);
      s.exposedCommunication = std::max(0.0, s.busy - traceUnion(compute));
      s.idleFraction = s.window > 0 ? std::clamp(1.0 - s.busy / s.window, 0.0, 1.0) : 0.0;
      s.achievedFlops = s.gemmShapedSeconds > 0 ? s.gemmFlops / s.gemmShapedSeconds : 0.0;
      for (auto& [key, c] : coll) {
        c.algbw = c.sizedSeconds > 0 ? c.bytes / c.sizedSeconds : 0.0;
        CollectiveOp op{};
        c.busbw = c.algbw > 0 && c.groupSize > 0 && traceCollectiveOp(c.op, op)
                      ? c.algbw * busBandwidthFactor(op, c.groupSize)
                      : 0.0;
        s.collectives.push_back(c);
      }
      out.steps.push_back(std::move(s));
    }
  for (const auto& [key, perRank] : calls) {
    const auto& [g, op, bytes] = key;
    std::size_t n = 0;
    for (const auto& [rank, durs] : perRank) n = std::max(n, durs.size());
    std::vector<double> best;
    for (std::size_t k = 0; k < n; ++k) {
      double m = std::numeric_limits<double>::infinity();
      for (const auto& [rank, durs] : perRank)
        if (k < durs.size()) m = std::min(m, durs[k]);
      best.push_back(m);
    }
    std::sort(best.begin(), best.end());
    const double median =
        best.size() % 2 ? best[best.size() / 2] : 0.5 * (best[best.size() / 2 - 1] + best[best.size() / 2]);
    out.links.push_back(TraceLinkPoint{static_cast<CollectiveOp>(op), g, bytes, median, int(best.size())});
  }
  return out;
}

nlohmann::json traceSummaryJson(const TraceImport& trace, const TraceSummary& summary) {
  json ranks = json::array();
  for (const TraceRank& r : trace.ranks) {
    json steps = json::array();
    for (const TraceStepSummary& s : summary.steps) {
      if (s.rank != r.rank) continue;
      json coll = json::array();
      for (const TraceCollectiveSummary& c : s.collectives)
        coll.push_back({{"op", c.op},
                        {"group_size", c.groupSize},
                        {"count", c.count},
                        {"sized", c.sized},
                        {"bytes", c.bytes},
                        {"seconds", c.seconds},
                        {"algbw", c.algbw},
                        {"busbw", c.busbw}});
      steps.push_back({{"step", s.step},
                       {"window_s", s.window},
                       {"busy_s", s.busy},
                       {"idle_fraction", s.idleFraction},
                       {"gemm_s", s.gemm},
                       {"gemm_flops", s.gemmFlops},
                       {"gemm_shaped_s", s.gemmShapedSeconds},
                       {"gemm_flops_per_s", s.achievedFlops},
                       {"attention_s", s.attention},
                       {"optimizer_s", s.optimizer},
                       {"communication_s", s.communication},
                       {"exposed_communication_s", s.exposedCommunication},
                       {"other_s", s.other},
                       {"collectives", coll}});
    }
    ranks.push_back({{"rank", r.rank},
                     {"file", r.file},
                     {"timeline", r.deviceTimeline ? "gpu kernels" : "cpu ops"},
                     {"backend", r.backend},
                     {"world_size", r.worldSize},
                     {"steps", steps}});
  }
  json links = json::array();
  for (const TraceLinkPoint& p : summary.links)
    links.push_back({{"op", collectiveOpName(p.op)},
                     {"group_size", p.groupSize},
                     {"bytes", p.bytes},
                     {"seconds", p.seconds},
                     {"algbw", p.bytes / p.seconds},
                     {"busbw", p.bytes / p.seconds * busBandwidthFactor(p.op, p.groupSize)},
                     {"calls", p.calls}});
  json kinds = json::object();
  for (const TraceSpanKind k : {TraceSpanKind::Gemm, TraceSpanKind::Attention, TraceSpanKind::Optimizer,
                                TraceSpanKind::Collective, TraceSpanKind::Other}) {
    const auto it = trace.eventsByKind.find(k);
    kinds[toString(k)] = it == trace.eventsByKind.end() ? 0 : it->second;
  }
  json skipped = json::object();
  for (const auto& [reason, n] : trace.skipped) skipped[reason] = n;
  return {{"files", trace.files},
          {"ranks", ranks},
          {"links", links},
          {"events",
           {{"read", trace.events},
            {"shown", kinds},
            {"nested", trace.nested},
            {"host_ops_not_shown", trace.hostOpsNotShown},
            {"outside_steps", trace.outsideSteps},
            {"skipped", skipped}}},
          {"notes", trace.notes}};
}

std::vector<nlohmann::json> traceLinkEntries(const TraceImport& trace, const TraceSummary& summary,
                                             const std::string& name) {
  std::set<int> groups;
  for (const TraceLinkPoint& p : summary.links) groups.insert(p.groupSize);
  std::string files, backend;
  for (const std::string& f : trace.files)
    files += (files.empty() ? "" : ", ") + std::filesystem::path(f).filename().string();
  for (const TraceRank& r : trace.ranks)
    if (!r.backend.empty()) backend = r.backend;
  std::vector<json> out;
  for (const int g : groups) {
    json measurements = json::array();
    for (const CollectiveOp op :
         {CollectiveOp::SendRecv, CollectiveOp::AllReduce, CollectiveOp::AllGather,
          CollectiveOp::ReduceScatter, CollectiveOp::AllToAll, CollectiveOp::Broadcast})
      for (const TraceLinkPoint& p : summary.links)
        if (p.groupSize == g && p.op == op) {
          const double algbw = p.bytes / p.seconds;
          measurements.push_back({{"op", collectiveOpName(op)},
                                  {"bytes", static_cast<std::int64_t>(std::llround(p.bytes))},
                                  {"seconds", p.seconds},
                                  {"algbw", algbw},
                                  {"busbw", algbw * busBandwidthFactor(op, g)},
                                  {"calls", p.calls}});
        }
    out.push_back(
        {{"name", groups.size() == 1 ? name : name + "-n" + std::to_string(g)},
         {"transport", "measured in a trace: " + files + (backend.empty() ? "" : " (" + backend + ")")},
         {"ranks", g},
         {"measurements", measurements}});
  }
  return out;
}

}  // namespace ms
