// The metrics stream: one JSON object per line (JSON Lines), each with "v" (protocol version) and "type"
// (run_start, step, spans, memory, eval, checkpoint, log, run_end; see ARCHITECTURE.md). Lines go to the
// sink the user chose ("-" for stdout, a file, or none) and always to the run folder's metrics.jsonl, so a
// finished run can be replayed. Readers ignore unknown types and fields.
//
// What always holds: every line is complete and flushed before write() returns (a reader tailing the file
// never sees half a line from us); a write error is remembered and reported once by status().
#pragma once

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace ms {

inline constexpr int kMetricsVersion = 1;

class MetricsWriter {
 public:
  MetricsWriter() = default;
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // sink: "-" (stdout), a file path, or "" (none). runFile: the run folder's metrics.jsonl ("" for none).
  // append: keep what runFile holds (resume) instead of truncating it.
  Status open(const std::string& sink, const std::string& runFile, bool append);
  // Adds "v" and "type" and writes the line to every destination.
  void write(const std::string& type, nlohmann::json fields);
  Status status() const { return m_status; }

 private:
  void writeTo(std::FILE* f, const std::string& line, const std::string& what);
  std::FILE* m_sink = nullptr;
  bool m_sinkIsStdout = false;
  std::FILE* m_run = nullptr;
  std::string m_sinkPath, m_runPath;  // for error messages
  Status m_status;
};

}  // namespace ms
