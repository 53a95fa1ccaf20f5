// TraceImport -> TimelineData; see trace_timeline.h.
#include "ui/models/trace_timeline.h"

#include <QStringList>
#include <algorithm>
#include <map>
#include <set>

#include "ui/models/units.h"

namespace ms {

namespace {

SpanKind traceSpanKind(const TraceSpan& s) {
  switch (s.kind) {
    case TraceSpanKind::Optimizer:
      return SpanKind::Optimizer;
    case TraceSpanKind::Collective:
      return s.collective == "sendrecv" ? SpanKind::Send : SpanKind::GradSync;
    default:
      return SpanKind::Other;
  }
}

QString traceSpanLabel(const TraceImport& trace, const TraceSpan& s) {
  const QString name = QString::fromStdString(trace.nameOf(s));
  switch (s.kind) {
    case TraceSpanKind::Gemm:
      if (s.m > 0)
        return QStringLiteral("GEMM %1%2x%3x%4: %5")
            .arg(s.batch > 1 ? QStringLiteral("%1 x ").arg(s.batch) : QString())
            .arg(s.m)
            .arg(s.n)
            .arg(s.k)
            .arg(name);
      return QStringLiteral("GEMM: ") + name;
    case TraceSpanKind::Attention:
      return QStringLiteral("attention: ") + name;
    case TraceSpanKind::Optimizer:
      return QStringLiteral("optimizer: ") + name;
    case TraceSpanKind::Collective: {
      QString what = QString::fromStdString(s.collective);
      if (s.bytes > 0) what += QLatin1Char(' ') + formatBytes(s.bytes);
      if (s.groupSize > 0) what += QStringLiteral(" over %1").arg(s.groupSize);
      return what + QStringLiteral(": ") + name;
    }
    case TraceSpanKind::Other:
      break;
  }
  return QStringLiteral("other: ") + name;
}

}  // namespace

TraceTimeline timelineFromTrace(const TraceImport& trace, std::int64_t step) {
  TraceTimeline out;
  if (step == kLastCommonTraceStep) {
    std::map<std::int64_t, std::size_t> seen;
    for (const TraceRank& r : trace.ranks)
      for (const TraceStep& st : r.steps) ++seen[st.number];
    std::int64_t best = -1, any = -1;
    bool found = false, foundAny = false;
    for (const auto& [number, count] : seen) {
      if (count == trace.ranks.size()) best = number, found = true;
      any = number, foundAny = true;
    }
    step = found ? best : foundAny ? any : -1;
  }
  out.step = step;
  const TraceSummary summary = summarizeTrace(trace);
  double origin = 0;
  bool haveOrigin = false;
  for (const TraceRank& r : trace.ranks) {
    out.steps = std::max(out.steps, static_cast<int>(r.steps.size()));
    for (const TraceStep& st : r.steps)
      if (st.number == step) {
        origin = haveOrigin ? std::min(origin, st.start) : st.start;
        haveOrigin = true;
      }
  }
  std::map<QString, std::int32_t> layers;
  TimelineData& t = out.timeline;
  for (const TraceRank& r : trace.ranks) {
    TimelineRow row;
    row.rank = r.rank;
    row.stage = r.rank;
    row.label = QStringLiteral("rank %1 · %2")
                    .arg(r.rank)
                    .arg(r.deviceTimeline ? QStringLiteral("GPU kernels") : QStringLiteral("CPU ops"));
    for (const TraceStepSummary& s : summary.steps)
      if (s.rank == r.rank && s.step == step) row.bubbleFraction = s.idleFraction;
    for (const TraceStep& st : r.steps) {
      if (st.number != step) continue;
      for (const TraceSpan& s : st.spans) {
        TimelineSpan span;
        span.start = s.start - origin;
        span.end = s.end - origin;
        span.kind = traceSpanKind(s);
        const QString label = traceSpanLabel(trace, s);
        auto it = layers.find(label);
        if (it == layers.end()) {
          it = layers.emplace(label, static_cast<std::int32_t>(t.layerNames.size())).first;
          t.layerNames.push_back(label);
        }
        span.layer = it->second;
        row.spans.push_back(span);
      }
    }
    std::stable_sort(row.spans.begin(), row.spans.end(),
                     [](const TimelineSpan& a, const TimelineSpan& b) { return a.start < b.start; });
    t.rows.push_back(std::move(row));
  }
  t.updateExtent();
  return out;
}

QString traceImportSummary(const TraceImport& trace) {
  const auto count = [&](TraceSpanKind k) {
    const auto it = trace.eventsByKind.find(k);
    return static_cast<long long>(it == trace.eventsByKind.end() ? 0 : it->second);
  };
  QStringList parts;
  parts << QStringLiteral("%1 GEMM").arg(count(TraceSpanKind::Gemm))
        << QStringLiteral("%1 attention").arg(count(TraceSpanKind::Attention))
        << QStringLiteral("%1 collectives").arg(count(TraceSpanKind::Collective))
        << QStringLiteral("%1 optimizer").arg(count(TraceSpanKind::Optimizer));
  QString text = QStringLiteral("%1 rank%2, %3 events: %4 recognized (%5), %6 other")
                     .arg(trace.ranks.size())
                     .arg(trace.ranks.size() == 1 ? QString() : QStringLiteral("s"))
                     .arg(trace.events)
                     .arg(trace.recognized())
                     .arg(parts.join(QStringLiteral(", ")))
                     .arg(count(TraceSpanKind::Other));
  QStringList top;
  for (const auto& [name, seconds] : traceTopNames(trace, TraceSpanKind::Other, 3))
    top << QString::fromStdString(name.size() > 40 ? name.substr(0, 37) + "..." : name);
  if (!top.isEmpty()) text += QStringLiteral(" (most time: %1)").arg(top.join(QStringLiteral(", ")));
  if (trace.nested) text += QStringLiteral("; %1 nested in those").arg(trace.nested);
  if (trace.hostOpsNotShown) text += QStringLiteral("; %1 CPU ops not shown").arg(trace.hostOpsNotShown);
  std::int64_t skipped = 0;
  for (const auto& [reason, n] : trace.skipped) skipped += n;
  if (skipped) text += QStringLiteral("; %1 skipped as malformed").arg(skipped);
  if (trace.outsideSteps) text += QStringLiteral("; %1 outside the steps").arg(trace.outsideSteps);
  return text;
}

}  // namespace ms
