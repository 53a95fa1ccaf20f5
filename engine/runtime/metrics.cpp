// MetricsWriter; see metrics.h.
#include "runtime/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>

#include "runtime/heartbeat.h"

namespace ms {

MetricsWriter::~MetricsWriter() {
  if (m_sink && !m_sinkIsStdout) std::fclose(m_sink);
  if (m_run) std::fclose(m_run);
}

Status MetricsWriter::open(const std::string& sink, const std::string& runFile, bool append) {
  if (sink == "-") {
    m_sink = stdout;
    m_sinkIsStdout = true;
  } else if (!sink.empty()) {
    m_sinkPath = sink;
    m_sink = std::fopen(sink.c_str(), append ? "a" : "w");
    if (!m_sink)
      return Status::error("--metrics " + sink + ": cannot open for writing: " + std::strerror(errno));
  }
  if (!runFile.empty() && runFile != sink) {
    m_runPath = runFile;
    m_run = std::fopen(runFile.c_str(), append ? "a" : "w");
    if (!m_run) return Status::error(runFile + ": cannot open for writing: " + std::strerror(errno));
  }
  return Status::ok();
}

void MetricsWriter::writeTo(std::FILE* f, const std::string& line, const std::string& what) {
  if (!f) return;
  if (std::fwrite(line.data(), 1, line.size(), f) != line.size() || std::fflush(f) != 0) {
    if (m_status.isOk()) m_status = Status::error("writing metrics to " + what + ": " + std::strerror(errno));
  }
}

void MetricsWriter::write(const char* type, nlohmann::json fields) {
  namespace key = metrics::key;
  nlohmann::json line = {{key::kVersion, metrics::kVersion}, {key::kType, type}};
  // Milliseconds are as fine as a reader needs; fewer digits keep the lines short.
  line[key::kTime] = std::round(unixTimeS() * 1e3) / 1e3;
  if (m_clockStarted)
    line[key::kT] =
        std::round(std::chrono::duration<double>(std::chrono::steady_clock::now() - m_zero).count() * 1e6) /
        1e6;
  for (auto& [k, v] : fields.items()) line[k] = std::move(v);
  const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  writeTo(m_sink, text, m_sinkIsStdout ? "stdout" : m_sinkPath);
  writeTo(m_run, text, m_runPath);
}

}  // namespace ms
