// Export of a timeline (predicted or measured) to the Trace Event Format that chrome://tracing and Perfetto
// (ui.perfetto.dev) open, so a plan's step can be studied with those tools beside other traces.
//
// What always holds: one complete event ("ph": "X") per span, in row order then span order, with ts and dur
// in microseconds, pid = the row's rank, tid = the span's lane (0 compute, 1 communication); one
// process_name ("rank N (stage S)") and process_sort_index per row and one thread_name per lane
// ("compute", "communication") as metadata events ("ph": "M"); the output is valid JSON for any input
// (names are escaped, non-finite times are written as 0).
#pragma once

#include <QByteArray>
#include <QString>

#include "ui/models/timeline_data.h"

namespace ms {

// The event name of a span: its kind ("F", "B", "W", "send", "recv wait", "grad sync", "optimizer",
// "other"), then " mbM" when it belongs to a microbatch, " cK" (the model chunk) when withChunk (the export
// sets it for rows that run several chunks: interleaved schedules) and the layer's name when known:
// "F mb3 block.2".
QString chromeTraceEventName(const TimelineSpan& span, const QStringList& layerNames, bool withChunk = false);

// The whole trace as a JSON object {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}};
// name goes to otherData.name.
QByteArray chromeTraceJson(const TimelineData& data, const QString& name);

// Writes chromeTraceJson to path; false with *error set (naming the path) when it cannot be written.
bool saveChromeTrace(const TimelineData& data, const QString& name, const QString& path, QString* error);

}  // namespace ms
