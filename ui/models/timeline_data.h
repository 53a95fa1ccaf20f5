// What a timeline view draws: one row per device (rank), each a list of spans sorted by start. The predicted
// timeline comes from the step simulator (timelineFromSimulation), the measured one from the engine's
// "spans" lines (ui/run); both fill the same structure, so the same view shows either and they line up.
//
// What always holds: within a row, spans are sorted by start; end >= start; lane 0 is the compute lane
// (F, B, W, O and receive waits), lane 1 the communication lane (sends in flight, gradient syncs, offload's
// host transfers).
#pragma once

#include <QString>
#include <QStringList>
#include <cstdint>
#include <vector>

#include "plan/plan.h"
#include "plan/simulator.h"

namespace ms {

enum class SpanKind : std::uint8_t {
  Forward,
  Backward,
  BackwardWeight,
  Send,       // a message in flight (activation or gradient)
  Recv,       // time the compute lane waited for a message
  GradSync,   // data-parallel gradient all-reduce / reduce-scatter
  Optimizer,  // the optimizer step
  Other,
  // Offload's transfers over the host link (PCIe), on the communication lane (simulator.h SimHostTransfer).
  HostToDevice,  // parameters up
  DeviceToHost,  // gradients down
  // overlap_param_gather's all-gather of a chunk's updated parameters, on the communication lane
  // (simulator.h SimParamGather).
  ParamGather,
};
const char* toString(SpanKind kind);
// The one-letter codes of the schedule and the metrics stream (F B W s r S R G O) to a kind.
SpanKind spanKindFromCode(char code);
// Parameter-server mode's actions (plan/ps_model.h PsSpan, and the engine's measured spans of that mode):
// 'P' pull (drawn as host to device), 'S' push (device to host), 'U' a server's update, 'C' compute.
SpanKind spanKindFromPsCode(char code);
// Lane of a kind: 0 compute, 1 communication.
int laneOf(SpanKind kind);

struct TimelineSpan {
  double start = 0;  // seconds from the start of the step (or the run, for a measured timeline)
  double end = 0;
  SpanKind kind = SpanKind::Other;
  std::int16_t microbatch = -1;
  std::int16_t chunk = -1;
  std::int32_t layer = -1;  // index into TimelineData::layerNames, -1 when the span is not a layer's
};

struct TimelineRow {
  QString label;  // "rank 3 · stage 1 · gpu 3"
  int rank = 0;
  int stage = 0;
  std::vector<TimelineSpan> spans;  // sorted by start
  double bubbleFraction = -1;       // < 0: unknown
};

struct TimelineData {
  std::vector<TimelineRow> rows;
  QStringList layerNames;
  double begin = 0;  // earliest start of any span
  double end = 0;    // latest end of any span
  std::size_t spanCount() const;
  // Recomputes begin and end from the rows' spans (0, 0 when there are none).
  void updateExtent();
};

// The simulator's spans of every rank (one row per rank, in rank order), with the bubble fractions.
TimelineData timelineFromSimulation(const Plan& plan, const SimResult& sim);

// Parameter-server mode's predicted lanes (plan/ps_model.h): one row per worker shown (pull as
// HostToDevice, its forward and backward as one Forward span, push as DeviceToHost), then one per server
// (its updates as Optimizer spans). Rows are numbered workers first, then servers (rank = workers + s).
struct PsPrediction;
TimelineData timelineFromPsPrediction(const PsPrediction& prediction);

}  // namespace ms
