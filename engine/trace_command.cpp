// meshstudio-engine trace; see trace_command.h. The tables follow nccl-tests' habit: fixed columns, one row
// per (rank, step), sizes in bytes and rates in bytes/s or FLOP/s.
#include "trace_command.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "plan/device_profile.h"
#include "plan/trace_import.h"
#include "runtime/file_io.h"

namespace ms {

namespace {

using nlohmann::json;

constexpr int kTraceExitOk = 0;
constexpr int kTraceExitWriteFailed = 1;
constexpr int kTraceExitBadInput = 2;

int traceOpOrder(const std::string& op) {
  static const char* const kOrder[] = {"sendrecv",       "all_reduce", "all_gather",
                                       "reduce_scatter", "all_to_all", "broadcast"};
  for (int i = 0; i < 6; ++i)
    if (op == kOrder[i]) return i;
  return 6;
}

void tracePrintTables(const TraceImport& trace, const TraceSummary& summary) {
  std::int64_t shownOther = 0;
  if (const auto it = trace.eventsByKind.find(TraceSpanKind::Other); it != trace.eventsByKind.end())
    shownOther = it->second;
  const auto count = [&](TraceSpanKind k) {
    const auto it = trace.eventsByKind.find(k);
    return static_cast<long long>(it == trace.eventsByKind.end() ? 0 : it->second);
  };
  std::int64_t skipped = 0;
  for (const auto& [reason, n] : trace.skipped) skipped += n;
  bool device = false;
  for (const TraceRank& r : trace.ranks) device = device || r.deviceTimeline;
  std::printf("trace: %zu file(s), %zu rank(s), timeline of %s\n", trace.files.size(), trace.ranks.size(),
              device ? "GPU kernels" : "CPU ops");
  std::printf(
      "events: %lld read; shown: %lld recognized (gemm %lld, attention %lld, collective %lld, optimizer "
      "%lld), "
      "%lld other; %lld nested in those; %lld CPU ops not shown; %lld outside the steps; %lld skipped\n",
      static_cast<long long>(trace.events), static_cast<long long>(trace.recognized()),
      count(TraceSpanKind::Gemm), count(TraceSpanKind::Attention), count(TraceSpanKind::Collective),
      count(TraceSpanKind::Optimizer), static_cast<long long>(shownOther),
      static_cast<long long>(trace.nested), static_cast<long long>(trace.hostOpsNotShown),
      static_cast<long long>(trace.outsideSteps), static_cast<long long>(skipped));
  std::printf("\n%5s %8s %11s %6s %11s %11s %11s %11s %11s %11s %11s\n", "rank", "step", "window_s", "idle",
              "gemm_s", "gemm_FLOP/s", "attn_s", "comm_s", "exposed_s", "optim_s", "other_s");
  for (const TraceStepSummary& s : summary.steps)
    std::printf("%5d %8lld %11.4e %5.1f%% %11.4e %11.4e %11.4e %11.4e %11.4e %11.4e %11.4e\n", s.rank,
                static_cast<long long>(s.step), s.window, 100.0 * s.idleFraction, s.gemm, s.achievedFlops,
                s.attention, s.communication, s.exposedCommunication, s.optimizer, s.other);
  bool anyColl = false;
  for (const TraceStepSummary& s : summary.steps) anyColl = anyColl || !s.collectives.empty();
  if (anyColl) {
    std::printf("\n%5s %8s %-15s %5s %6s %12s %11s %11s %11s\n", "rank", "step", "collective", "n", "calls",
                "bytes", "seconds", "algbw_B/s", "busbw_B/s");
    for (const TraceStepSummary& s : summary.steps)
      for (const TraceCollectiveSummary& c : s.collectives)
        std::printf("%5d %8lld %-15s %5d %6d %12.0f %11.4e %11.4e %11.4e\n", s.rank,
                    static_cast<long long>(s.step), c.op.c_str(), c.groupSize, c.count, c.bytes, c.seconds,
                    c.algbw, c.busbw);
  }
  if (!summary.links.empty()) {
    std::printf("\nlink curve (per call the shortest over the ranks, then the median over calls):\n");
    std::printf("%-15s %5s %12s %11s %11s %11s %6s\n", "op", "n", "bytes", "seconds", "algbw_B/s",
                "busbw_B/s", "calls");
    for (const TraceLinkPoint& p : summary.links)
      std::printf("%-15s %5d %12.0f %11.4e %11.4e %11.4e %6d\n", collectiveOpName(p.op), p.groupSize, p.bytes,
                  p.seconds, p.bytes / p.seconds, p.bytes / p.seconds * busBandwidthFactor(p.op, p.groupSize),
                  p.calls);
  }
  for (const auto& [reason, n] : trace.skipped)
    std::printf("skipped: %lld %s\n", static_cast<long long>(n), reason.c_str());
  for (const std::string& note : trace.notes) std::printf("note: %s\n", note.c_str());
}

}  // namespace

Status mergeTraceLinks(const std::string& path, const std::vector<json>& links, bool* writeFailed) {
  using ordered = nlohmann::ordered_json;  // the file keeps its keys in the documented order
  if (writeFailed) *writeFailed = false;
  auto text = readFile(path);
  if (!text)
    return Status::error(text.message() +
                         " (--profile-out merges the trace's links into an existing device profile; "
                         "`meshstudio-engine calibrate --out FILE` writes one)");
  ordered doc = ordered::parse(*text, nullptr, false);
  if (doc.is_discarded()) return Status::error(path + ": not JSON");
  if (auto p = parseDeviceProfile(json::parse(doc.dump()), path); !p)
    return Status::error("not a device profile: " + p.message());
  if (!doc.contains("links") || !doc["links"].is_array()) doc["links"] = ordered::array();
  ordered& existing = doc["links"];
  for (const json& entry : links) {
    ordered link;
    for (const char* key : {"name", "transport", "ranks"}) link[key] = ordered::parse(entry[key].dump());
    link["measurements"] = ordered::array();
    for (const json& m : entry["measurements"]) {
      ordered row;
      for (const char* key : {"op", "bytes", "seconds", "algbw", "busbw", "calls"})
        if (m.contains(key)) row[key] = ordered::parse(m[key].dump());
      link["measurements"].push_back(row);
    }
    const std::string name = link["name"].get<std::string>();
    auto it = std::find_if(existing.begin(), existing.end(), [&](const ordered& l) {
      return l.is_object() && l.contains("name") && l["name"] == name;
    });
    if (it == existing.end()) {
      existing.push_back(link);
      continue;
    }
    if (!it->contains("measurements") || !(*it)["measurements"].is_array() ||
        (*it)["ranks"] != link["ranks"]) {
      *it = link;
      continue;
    }
    // Same link, same rank count: the trace's ops replace the file's, the others stay.
    ordered merged = ordered::array();
    for (const ordered& m : (*it)["measurements"]) {
      const bool measured =
          std::any_of(link["measurements"].begin(), link["measurements"].end(),
                      [&](const ordered& t) { return m.is_object() && t["op"] == m.value("op", ""); });
      if (!measured) merged.push_back(m);
    }
    for (const ordered& m : link["measurements"]) merged.push_back(m);
    std::stable_sort(merged.begin(), merged.end(), [](const ordered& a, const ordered& b) {
      const int oa = traceOpOrder(a.is_object() ? a.value("op", "") : ""),
                ob = traceOpOrder(b.is_object() ? b.value("op", "") : "");
      if (oa != ob) return oa < ob;
      return (a.is_object() ? a.value("bytes", 0.0) : 0.0) < (b.is_object() ? b.value("bytes", 0.0) : 0.0);
    });
    (*it)["measurements"] = merged;
    const std::string before = it->contains("transport") && (*it)["transport"].is_string()
                                   ? (*it)["transport"].get<std::string>()
                                   : std::string("unknown");
    (*it)["transport"] = link["transport"].get<std::string>() + "; its other ops: " + before;
  }
  if (auto p = parseDeviceProfile(json::parse(doc.dump()), path); !p)
    return Status::error(
        "the merged profile would not read, nothing written: " + p.message() +
        " (a link needs sendrecv and all_reduce measurements: name an existing link of the same "
        "rank count with --link to keep its other ops)");
  Status written = writeFileAtomic(path, doc.dump(2) + "\n");
  if (!written && writeFailed) *writeFailed = true;
  return written;
}

int runTraceCommand(const TraceCommandOptions& o) {
  auto trace = importTraces(o.files);
  if (!trace) {
    std::fprintf(stderr, "meshstudio-engine trace: %s\n", trace.message().c_str());
    return kTraceExitBadInput;
  }
  const TraceSummary summary = summarizeTrace(*trace);
  if (o.json)
    std::printf("%s\n", traceSummaryJson(*trace, summary).dump(2).c_str());
  else
    tracePrintTables(*trace, summary);
  if (o.profileOut.empty()) return kTraceExitOk;
  const std::vector<json> links = traceLinkEntries(*trace, summary, o.linkName);
  if (links.empty()) {
    std::fprintf(
        stderr,
        "meshstudio-engine trace: %s: no link written: the trace has no collective with a known size "
        "over a group of 2 or more ranks\n",
        o.profileOut.c_str());
    return kTraceExitBadInput;
  }
  bool writeFailed = false;
  if (Status s = mergeTraceLinks(o.profileOut, links, &writeFailed); !s) {
    std::fprintf(stderr, "meshstudio-engine trace: %s\n", s.message().c_str());
    return writeFailed ? kTraceExitWriteFailed : kTraceExitBadInput;
  }
  std::string names;
  for (const json& l : links) names += (names.empty() ? "" : ", ") + l["name"].get<std::string>();
  std::fprintf(stderr, "meshstudio-engine trace: link(s) %s merged into %s\n", names.c_str(),
               o.profileOut.c_str());
  return kTraceExitOk;
}

int traceMain(int argc, char** argv, int first) {
  static const char* kTraceUsage =
      "usage: meshstudio-engine trace FILE... [--json] [--profile-out PROFILE] [--link NAME]\n";
  const auto usage = [](const std::string& why) {
    std::fprintf(stderr, "meshstudio-engine trace: %s\n%s", why.c_str(), kTraceUsage);
    return kTraceExitBadInput;
  };
  TraceCommandOptions o;
  for (int i = first; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json") {
      o.json = true;
    } else if (arg == "--profile-out" || arg == "--link") {
      if (i + 1 >= argc || std::string(argv[i + 1]).empty()) return usage(arg + " needs a value");
      (arg == "--link" ? o.linkName : o.profileOut) = argv[++i];
    } else if (arg.rfind("--", 0) == 0) {
      return usage("unknown option " + arg);
    } else {
      o.files.push_back(arg);
    }
  }
  if (o.files.empty()) return usage("needs at least one trace FILE");
  if (o.linkName.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
      std::string::npos)
    return usage("--link needs a name of letters, digits, '_' and '-', got \"" + o.linkName + "\"");
  return runTraceCommand(o);
}

}  // namespace ms
