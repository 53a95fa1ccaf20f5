// The metrics stream's writer: one JSON object per line (JSON Lines), each with "v" (protocol version),
// "type", "time" (Unix seconds) and, once the run's clock has started, "t" (seconds on the run's clock, the
// one the spans use). The record types and keys are defined once in common/metrics_schema.h, which the
// studio's reader uses too. Lines go to the sink the user chose ("-" for stdout, a file, or none) and always
// to the run folder's metrics.jsonl, so a finished run can be replayed. Readers ignore unknown types and
// fields.
//
// What always holds: every line is complete and flushed before write() returns (a reader tailing the file
// never sees half a line from us); a write error is remembered and reported once by status().
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "common/metrics_schema.h"
#include "common/status.h"

namespace ms {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // sink: "-" (stdout), a file path, or "" (none). runFile: the run folder's metrics.jsonl ("" for none).
  // append: keep what runFile holds (resume) instead of truncating it.
  Status open(const std::string& sink, const std::string& runFile, bool append);
  // Starts the run's clock: every later line carries "t", seconds since zero.
  void startClock(std::chrono::steady_clock::time_point zero) {
    m_zero = zero;
    m_clockStarted = true;
  }
  // Adds "v", "type", "time" and "t" (when the clock runs; fields may bring their own "t") and writes the
  // line to every destination.
  void write(const char* type, nlohmann::json fields);
  Status status() const { return m_status; }

 private:
  void writeTo(std::FILE* f, const std::string& line, const std::string& what);
  std::FILE* m_sink = nullptr;
  bool m_sinkIsStdout = false;
  std::FILE* m_run = nullptr;
  std::string m_sinkPath, m_runPath;  // for error messages
  Status m_status;
  std::chrono::steady_clock::time_point m_zero{};
  bool m_clockStarted = false;
};

}  // namespace ms
