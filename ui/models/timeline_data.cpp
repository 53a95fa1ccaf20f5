// Timeline data; see timeline_data.h.
#include "ui/models/timeline_data.h"

#include "plan/ps_model.h"

#include <algorithm>

namespace ms {

const char* toString(SpanKind kind) {
  switch (kind) {
    case SpanKind::Forward:
      return "forward";
    case SpanKind::Backward:
      return "backward";
    case SpanKind::BackwardWeight:
      return "backward (weights)";
    case SpanKind::Send:
      return "send";
    case SpanKind::Recv:
      return "receive wait";
    case SpanKind::GradSync:
      return "gradient sync";
    case SpanKind::Optimizer:
      return "optimizer step";
    case SpanKind::Other:
      return "other";
    case SpanKind::HostToDevice:
      return "host to device (offload)";
    case SpanKind::DeviceToHost:
      return "device to host (offload)";
    case SpanKind::ParamGather:
      return "parameter all-gather";
  }
  return "other";
}

SpanKind spanKindFromCode(char code) {
  switch (code) {
    case 'F':
      return SpanKind::Forward;
    case 'B':
      return SpanKind::Backward;
    case 'W':
      return SpanKind::BackwardWeight;
    case 's':
    case 'S':
      return SpanKind::Send;
    case 'r':
    case 'R':
      return SpanKind::Recv;
    case 'G':
      return SpanKind::GradSync;
    case 'O':
      return SpanKind::Optimizer;
    default:
      return SpanKind::Other;
  }
}

int laneOf(SpanKind kind) {
  return kind == SpanKind::Send || kind == SpanKind::GradSync || kind == SpanKind::HostToDevice ||
                 kind == SpanKind::DeviceToHost || kind == SpanKind::ParamGather
             ? 1
             : 0;
}

std::size_t TimelineData::spanCount() const {
  std::size_t n = 0;
  for (const TimelineRow& r : rows) n += r.spans.size();
  return n;
}

void TimelineData::updateExtent() {
  bool any = false;
  begin = end = 0;
  for (const TimelineRow& r : rows)
    for (const TimelineSpan& s : r.spans) {
      begin = any ? std::min(begin, s.start) : s.start;
      end = any ? std::max(end, s.end) : s.end;
      any = true;
    }
}

TimelineData timelineFromSimulation(const Plan& plan, const SimResult& sim) {
  TimelineData out;
  for (const LayerSpec& l : plan.model.layers) out.layerNames << QString::fromStdString(l.name);
  const int world = static_cast<int>(sim.spansByRank.size());
  out.rows.resize(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    TimelineRow& row = out.rows[static_cast<std::size_t>(r)];
    const RankCoord c = plan.layout.coord(r);
    row.rank = r;
    row.stage = c.pp;
    const int device = r < static_cast<int>(plan.layout.deviceOf.size()) ? plan.layout.deviceOf[r] : r;
    row.label = QStringLiteral("rank %1 · stage %2 · dev %3").arg(r).arg(c.pp).arg(device);
    if (r < static_cast<int>(sim.bubbleFraction.size())) row.bubbleFraction = sim.bubbleFraction[r];
    row.spans.reserve(sim.spansByRank[r].size());
    for (const SimSpan& s : sim.spansByRank[r]) {
      TimelineSpan t;
      t.start = s.start;
      t.end = s.end;
      t.kind = spanKindFromCode(actionCode(s.type));
      t.microbatch = static_cast<std::int16_t>(s.microbatch);
      t.chunk = static_cast<std::int16_t>(s.chunk);
      row.spans.push_back(t);
    }
    if (r < static_cast<int>(sim.hostTransfersByRank.size()))
      for (const SimHostTransfer& h : sim.hostTransfersByRank[r]) {
        TimelineSpan t;
        t.start = h.start;
        t.end = h.end;
        t.kind = h.toHost ? SpanKind::DeviceToHost : SpanKind::HostToDevice;
        t.microbatch = static_cast<std::int16_t>(h.microbatch);
        t.chunk = static_cast<std::int16_t>(h.chunk);
        row.spans.push_back(t);
      }
    if (r < static_cast<int>(sim.paramGathersByRank.size()))
      for (const SimParamGather& g : sim.paramGathersByRank[r]) {
        TimelineSpan t;
        t.start = g.start;
        t.end = g.end;
        t.kind = SpanKind::ParamGather;
        t.chunk = static_cast<std::int16_t>(g.chunk);
        row.spans.push_back(t);
      }
    std::stable_sort(row.spans.begin(), row.spans.end(),
                     [](const TimelineSpan& a, const TimelineSpan& b) { return a.start < b.start; });
  }
  out.updateExtent();
  return out;
}

SpanKind spanKindFromPsCode(char code) {
  return code == 'P'   ? SpanKind::HostToDevice
         : code == 'S' ? SpanKind::DeviceToHost
         : code == 'U' ? SpanKind::Optimizer
                       : SpanKind::Forward;
}

TimelineData timelineFromPsPrediction(const PsPrediction& p) {
  TimelineData out;
  int workerRows = 0, serverRows = 0;
  for (const PsSpan& s : p.timeline)
    (s.server ? serverRows : workerRows) = std::max(s.server ? serverRows : workerRows, s.index + 1);
  const int W = static_cast<int>(p.workers.size());
  out.rows.resize(static_cast<std::size_t>(workerRows + serverRows));
  for (int w = 0; w < workerRows; ++w) {
    TimelineRow& row = out.rows[static_cast<std::size_t>(w)];
    // Every lane its own group (timeline_groups.h groups rows by stage): the lanes are not replicas.
    row.rank = w;
    row.stage = w;
    row.label =
        QStringLiteral("worker %1 · dev %2").arg(w).arg(p.workers[static_cast<std::size_t>(w)].device);
  }
  for (int s = 0; s < serverRows; ++s) {
    TimelineRow& row = out.rows[static_cast<std::size_t>(workerRows + s)];
    row.rank = W + s;
    row.stage = workerRows + s;
    row.label = QStringLiteral("server %1 · node %2").arg(s).arg(p.servers[static_cast<std::size_t>(s)].node);
  }
  for (const PsSpan& s : p.timeline) {
    TimelineSpan t;
    t.start = s.start;
    t.end = s.end;
    t.kind = spanKindFromPsCode(s.action);
    out.rows[static_cast<std::size_t>(s.server ? workerRows + s.index : s.index)].spans.push_back(t);
  }
  for (TimelineRow& row : out.rows)
    std::stable_sort(row.spans.begin(), row.spans.end(),
                     [](const TimelineSpan& a, const TimelineSpan& b) { return a.start < b.start; });
  out.updateExtent();
  return out;
}

}  // namespace ms
