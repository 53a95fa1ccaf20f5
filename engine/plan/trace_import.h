// Import of measured timelines from the frameworks people run: a PyTorch profiler (Kineto) trace, the legacy
// autograd profiler's export, or an Nsight Systems trace converted to Chrome trace JSON (the Trace Event
// Format: an object with "traceEvents" or a bare array; "X" complete events and "B"/"E" pairs, ts and dur in
// microseconds). Each event is classified by its name and category (GEMM, attention, optimizer, a collective
// with its bytes and group size, or other), and every rank's work is cut into steps at its ProfilerStep#N
// markers. summarizeTrace() then says where each rank's step went, and traceLinkEntries() turns the
// collectives into the "links" entries of a device profile (docs/calibration.md, "Importing a PyTorch or
// Nsight trace", has the rules and what a trace cannot tell).
//
// Ranks (per file, first rule that applies):
//   1. a top-level "distributedInfo": {"rank": N} (Kineto writes it under torch.distributed): the file is
//   rank N;
//   2. "process_name" metadata events ("ph": "M") whose name contains "rank N" (as the studio's own Chrome
//      trace export writes them): that process (pid) is rank N, and events of processes without such a name
//      are left out (counted in skipped);
//   3. otherwise the whole file is one rank: the lowest rank number not taken by the files before it, in the
//      order given (so rank0.json rank1.json without rank information become ranks 0 and 1).
// Two files claiming one rank are refused.
//
// What always holds for a TraceImport that importTraces() returned: ranks are sorted by rank and distinct;
// every span has 0 <= start <= end (seconds from the earliest kept event of all files), lies in its step's
// [start, end], and a step's spans are sorted by start; a step's number is its ProfilerStep#N (-1 for a
// trace without markers, then the one step is the whole trace). Malformed input never crashes: a file that
// is not a trace is an error naming the file and what is wrong, and events with missing or wrong-typed
// fields are skipped and counted by reason.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "plan/device_profile.h"

namespace ms {

enum class TraceSpanKind : std::uint8_t { Gemm, Attention, Optimizer, Collective, Other };
const char* toString(TraceSpanKind kind);  // "gemm", "attention", "optimizer", "collective", "other"

// What a name (and category) says an event is. collective: nccl-tests' op name ("all_reduce", "all_gather",
// "reduce_scatter", "all_to_all", "broadcast", "sendrecv"), or "reduce", "barrier", "collective" for the
// ones without a bus-bandwidth factor here; empty unless kind is Collective.
struct TraceEventClass {
  TraceSpanKind kind = TraceSpanKind::Other;
  std::string collective;
  bool stepMarker = false;    // ProfilerStep#N
  bool backendComms = false;  // a backend's own collective ("nccl:...", "gloo:...", an NCCL kernel)
};
TraceEventClass classifyTraceEvent(const std::string& name, const std::string& category);
// True for events a GPU ran (cat "kernel", "gpu_memcpy", "gpu_memset", ...; not "gpu_user_annotation").
bool isDeviceTraceEvent(const std::string& category);
// Bytes of one element of a dtype as PyTorch and NCCL name them ("Float", "c10::BFloat16", "float", "f32",
// "bf16", "half", "int8_t"...); 0 when unknown.
int traceElementBytes(const std::string& dtype);

struct TraceSpan {
  double start = 0, end = 0;  // seconds
  TraceSpanKind kind = TraceSpanKind::Other;
  std::uint32_t name = 0;  // index into TraceImport::names
  // Collectives: nccl-tests' op name, its size in bytes (nccl-tests' "size": the buffer for all_reduce and
  // broadcast, the gathered output for all_gather, the unreduced input for reduce_scatter, what one rank
  // sends for all_to_all, the message for sendrecv; 0: unknown) and the group size (0: unknown).
  std::string collective;
  double bytes = 0;
  int groupSize = 0;
  bool elementBytesAssumed = false;  // the dtype was not in the trace: 4-byte elements were assumed
  // GEMMs, when the shapes are known (record_shapes' "Input Dims" of aten::mm/addmm/bmm/matmul/linear, or of
  // the CPU op that launched a GPU kernel): batch x (m x k) @ (k x n); 0 unknown.
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  std::int64_t link = -1;  // Kineto's "External id" (a kernel and the op that launched it share it), -1 none
  double flops() const { return m > 0 && n > 0 && k > 0 ? 2.0 * double(batch) * m * n * k : 0.0; }
};

struct TraceStep {
  std::int64_t number = -1;  // ProfilerStep#N, -1: the whole trace
  double start = 0, end = 0;
  std::vector<TraceSpan> spans;  // sorted by start
};

struct TraceRank {
  int rank = 0;
  std::string file;
  std::string backend;  // distributedInfo.backend ("nccl", "gloo"), else empty
  int worldSize = 0;    // distributedInfo.world_size, 0 when unknown
  // true: the spans are the GPU's kernels (the trace has some); false: CPU ops (a CPU-only trace).
  bool deviceTimeline = false;
  std::vector<TraceStep> steps;
};

struct TraceImport {
  std::vector<std::string> files;
  std::vector<std::string> names;  // span names, interned
  std::vector<TraceRank> ranks;    // sorted by rank
  // Duration events read, by what became of them: each event the timeline shows by its kind (an "other"
  // op split around the recognized ops inside it counts once), the ones nested inside those (their time is
  // their parent's), the CPU ops of a trace whose timeline is the GPU's, the ones outside every step (before
  // the first marker or after the last), and the skipped ones by reason.
  std::int64_t events = 0;
  std::map<TraceSpanKind, std::int64_t> eventsByKind;
  std::int64_t nested = 0;
  std::int64_t hostOpsNotShown = 0;
  std::int64_t outsideSteps = 0;
  std::map<std::string, std::int64_t> skipped;
  std::vector<std::string> notes;   // what was assumed ("4-byte elements assumed for 12 collectives ...")
  std::int64_t recognized() const;  // events shown that are not Other
  const std::string& nameOf(const TraceSpan& s) const { return names[s.name]; }
};

// The names of the spans of one kind with the most time over all ranks and steps, longest first: (name,
// seconds), at most n.
std::vector<std::pair<std::string, double>> traceTopNames(const TraceImport& trace, TraceSpanKind kind,
                                                          std::size_t n);

// One input: a file's name (for messages) and its text.
struct TraceText {
  std::string file;
  std::string text;
};

Expected<TraceImport> importTraceTexts(const std::vector<TraceText>& inputs);
// Reads the files (one per rank, or merged) and imports them; errors name the file.
Expected<TraceImport> importTraces(const std::vector<std::string>& paths);

// --- Calibration from a trace ---

struct TraceCollectiveSummary {
  std::string op;     // nccl-tests' name
  int groupSize = 0;  // 0: unknown
  int count = 0;
  int sized = 0;            // calls whose bytes are known
  double bytes = 0;         // of the sized calls
  double seconds = 0;       // of all calls
  double sizedSeconds = 0;  // of the sized calls
  double algbw = 0;         // bytes / sizedSeconds (0: unknown)
  double busbw = 0;         // algbw x nccl-tests' factor for groupSize (0: unknown)
};

struct TraceStepSummary {
  int rank = 0;
  std::int64_t step = -1;
  double window = 0;  // the step's length, seconds
  // Seconds of the union of each kind's spans (overlapping streams count once within a kind).
  double gemm = 0, attention = 0, optimizer = 0, other = 0, communication = 0;
  double busy = 0;                  // the union of all spans
  double exposedCommunication = 0;  // communication not overlapped by any compute span
  double idleFraction = 0;          // 1 - busy / window: the bubble, on the device (or CPU) timeline
  // GEMMs with known shapes: their FLOPs (2 b m n k, an op split into several kernels counted once) and the
  // seconds of their spans; achievedFlops = gemmFlops / gemmShapedSeconds (0: no shapes).
  double gemmFlops = 0, gemmShapedSeconds = 0, achievedFlops = 0;
  std::vector<TraceCollectiveSummary> collectives;  // by op, then group size
};

// A collective's measured time at one size, over the ranks and steps of the trace: for each call (the k-th
// call of this op, size and group size on every rank) the shortest duration over the ranks (the last rank
// to arrive waits least, so its kernel is the closest to the transfer alone), then the median over calls.
struct TraceLinkPoint {
  CollectiveOp op = CollectiveOp::AllReduce;
  int groupSize = 0;
  double bytes = 0, seconds = 0;
  int calls = 0;
};

struct TraceSummary {
  std::vector<TraceStepSummary> steps;  // by rank, then step
  std::vector<TraceLinkPoint> links;    // by group size, op (device_profile.h order), bytes
};

TraceSummary summarizeTrace(const TraceImport& trace);
// The device profile's op of an nccl-tests name ("all_reduce" -> CollectiveOp::AllReduce), whose
// busBandwidthFactor gives busbw; false for the ones without a factor ("reduce", "barrier", "collective").
bool traceCollectiveOp(const std::string& name, CollectiveOp& op);

// The summary as JSON: {"files", "ranks": [{"rank", "file", "timeline": "gpu kernels"|"cpu ops", "steps":
// [...]}], "links": [...], "events": {...}, "notes": [...]} (docs/calibration.md has the fields).
nlohmann::json traceSummaryJson(const TraceImport& trace, const TraceSummary& summary);

// The collectives as "links" entries of a device profile (docs/calibration.md, "The profile file"), one per
// group size measured: named `name` when the trace has one group size, else `name`-n<size>; "transport"
// says which trace files and backend; "measurements" hold every (op, bytes) point with op, bytes, seconds,
// algbw, busbw and calls. Only ops with a bus-bandwidth factor, known bytes and a group size >= 2 appear.
std::vector<nlohmann::json> traceLinkEntries(const TraceImport& trace, const TraceSummary& summary,
                                             const std::string& name);

}  // namespace ms
