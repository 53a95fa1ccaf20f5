// Chrome trace export; see chrome_trace.h. The format is Google's "Trace Event Format" document (complete
// events "X" with ts and dur in microseconds, metadata events "M" for process and thread names).
#include "ui/models/chrome_trace.h"

#include <QSaveFile>
#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

namespace ms {

namespace {

const char* shortName(SpanKind kind) {
  switch (kind) {
    case SpanKind::Forward:
      return "F";
    case SpanKind::Backward:
      return "B";
    case SpanKind::BackwardWeight:
      return "W";
    case SpanKind::Send:
      return "send";
    case SpanKind::Recv:
      return "recv wait";
    case SpanKind::GradSync:
      return "grad sync";
    case SpanKind::Optimizer:
      return "optimizer";
    case SpanKind::Other:
      return "other";
    case SpanKind::HostToDevice:
      return "H2D";
    case SpanKind::DeviceToHost:
      return "D2H";
    case SpanKind::ParamGather:
      return "param gather";
  }
  return "other";
}

bool runsChunk(SpanKind kind) {
  return kind == SpanKind::Forward || kind == SpanKind::Backward || kind == SpanKind::BackwardWeight;
}

double micros(double seconds) {
  return std::isfinite(seconds) ? seconds * 1e6 : 0.0;
}

QString layerName(const TimelineSpan& span, const QStringList& layerNames) {
  if (span.layer < 0) return {};
  if (span.layer < layerNames.size()) return layerNames[span.layer];
  return QStringLiteral("layer %1").arg(span.layer);
}

}  // namespace

QString chromeTraceEventName(const TimelineSpan& span, const QStringList& layerNames, bool withChunk) {
  QString name = QString::fromLatin1(shortName(span.kind));
  if (span.microbatch >= 0) name += QStringLiteral(" mb%1").arg(span.microbatch);
  if (withChunk && span.chunk >= 0) name += QStringLiteral(" c%1").arg(span.chunk);
  const QString layer = layerName(span, layerNames);
  if (!layer.isEmpty()) name += QLatin1Char(' ') + layer;
  return name;
}

QByteArray chromeTraceJson(const TimelineData& data, const QString& name) {
  using nlohmann::json;
  json events = json::array();
  for (const TimelineRow& row : data.rows) {
    const std::string process =
        QStringLiteral("rank %1 (stage %2)").arg(row.rank).arg(row.stage).toStdString();
    events.push_back(
        {{"ph", "M"}, {"name", "process_name"}, {"pid", row.rank}, {"args", {{"name", process}}}});
    events.push_back({{"ph", "M"},
                      {"name", "process_sort_index"},
                      {"pid", row.rank},
                      {"args", {{"sort_index", row.rank}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", row.rank},
                      {"tid", 0},
                      {"args", {{"name", "compute"}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", row.rank},
                      {"tid", 1},
                      {"args", {{"name", "communication"}}}});
  }
  for (const TimelineRow& row : data.rows) {
    int firstChunk = -1;
    bool multiChunk = false;
    for (const TimelineSpan& s : row.spans) {
      // Only F, B and W: a transfer's chunk is its producer's, on the neighbouring stage.
      if (!runsChunk(s.kind) || s.chunk < 0) continue;
      if (firstChunk < 0) firstChunk = s.chunk;
      multiChunk = multiChunk || s.chunk != firstChunk;
    }
    for (const TimelineSpan& s : row.spans) {
      json args = {{"kind", toString(s.kind)}, {"microbatch", s.microbatch}, {"chunk", s.chunk}};
      const QString layer = layerName(s, data.layerNames);
      args["layer"] = layer.isEmpty() ? json(nullptr) : json(layer.toStdString());
      events.push_back({{"ph", "X"},
                        {"name", chromeTraceEventName(s, data.layerNames, multiChunk).toStdString()},
                        {"cat", toString(s.kind)},
                        {"pid", row.rank},
                        {"tid", laneOf(s.kind)},
                        {"ts", micros(s.start)},
                        {"dur", std::max(0.0, micros(s.end) - micros(s.start))},
                        {"args", std::move(args)}});
    }
  }
  json doc = {{"traceEvents", std::move(events)},
              {"displayTimeUnit", "ms"},
              {"otherData", {{"name", name.toStdString()}, {"generator", "MeshStudio"}}}};
  // Replace invalid UTF-8 (a hand-written layer name) instead of throwing: the export must not fail on text.
  const std::string text = doc.dump(-1, ' ', false, json::error_handler_t::replace);
  return QByteArray(text.data(), static_cast<qsizetype>(text.size()));
}

bool saveChromeTrace(const TimelineData& data, const QString& name, const QString& path, QString* error) {
  QSaveFile file(path);
  if (!file.open(QIODevice::WriteOnly)) {
    if (error) *error = QStringLiteral("cannot write %1: %2").arg(path, file.errorString());
    return false;
  }
  file.write(chromeTraceJson(data, name));
  if (!file.commit()) {
    if (error) *error = QStringLiteral("cannot write %1: %2").arg(path, file.errorString());
    return false;
  }
  return true;
}

}  // namespace ms
