// A measured trace (plan/trace_import.h: a PyTorch profiler or Nsight trace, one file per rank or merged) as
// a TimelineData, so that the Run dashboard's measured timeline shows it above the plan's predicted step, the
// way it shows a run's measured step.
//
// What always holds: one row per rank of the trace, in rank order, each its own group (stage = rank: a trace
// does not say which pipeline stage a rank ran), labelled "rank N · GPU kernels" or "rank N · CPU ops"; the
// spans are the chosen step's, in seconds from the earliest start of that step over the ranks (so the
// timeline starts at 0 like a predicted step and the ranks keep their offsets); GEMMs, attention and other
// kernels are Other spans on the compute lane and the optimizer an Optimizer span (a trace does not say
// forward or backward), collectives GradSync spans on the communication lane (point-to-point ones Send);
// each span's layer names what it was ("GEMM 1024x4096x4096: sm90_xmma_gemm_...", "all_reduce 4 MiB over
// 2: ncclDevKernel_AllReduce_..."); a row's bubble is the step's idle fraction (summarizeTrace).
#pragma once

#include <QString>
#include <cstdint>
#include <limits>

#include "plan/trace_import.h"
#include "ui/models/timeline_data.h"

namespace ms {

// timelineFromTrace's default step: the last step number every rank has (else the last of any rank).
constexpr std::int64_t kLastCommonTraceStep = std::numeric_limits<std::int64_t>::min();

struct TraceTimeline {
  TimelineData timeline;
  std::int64_t step = -1;  // the step shown (-1: the whole trace, which had no ProfilerStep markers)
  int steps = 0;           // how many steps the trace has (the most of any rank)
};

TraceTimeline timelineFromTrace(const TraceImport& trace, std::int64_t step = kLastCommonTraceStep);

// One line for the status bar: what was read and recognized and what was left as "other" (with the names
// that took the most time), e.g. "2 ranks, 104 events: 24 recognized (4 GEMM, 4 attention, 12 collectives,
// 4 optimizer), 8 other (top: Memcpy DtoH ...); 68 CPU ops not shown".
QString traceImportSummary(const TraceImport& trace);

}  // namespace ms
