// Fuzz target: the studio's metrics stream reader (ui/run/metrics_reader.h). The input is a stream; it is fed
// to one reader whole and to another in pieces of 1, 2, 3, 5, 8, 13 and 21 bytes in turn (a pipe delivers
// arbitrary pieces), and to a third with a 64-byte line limit, in the same pieces.
//
// Checked for every input, beyond not crashing: how the bytes are cut into pieces changes nothing (the same
// events, errors and line count); every error reads "line N: ..." with N its line; the reader's tail never
// holds more than its line limit; bytesRead() counts every byte.
#include <QString>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "ui/run/metrics_reader.h"

namespace {

std::string number(double x) {
  return std::isnan(x) ? "nan" : std::to_string(x);
}

// What an event says, as text (enough to tell two event sequences apart).
std::string describe(const ms::MetricsEvent& event) {
  std::string s = ms::eventTypeName(event);
  std::visit(
      [&s](const auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, ms::MetricsError>) {
          // An over-long line's excerpt is what the reader held when it gave up, which depends on the pieces
          // when the limit is under the excerpt's length (320 bytes): the reason is compared, not the
          // excerpt.
          std::string message = e.message.toStdString();
          const size_t overLong = message.find(" bytes, skipped: ");
          if (overLong != std::string::npos) message.resize(overLong + 16);
          s += " " + std::to_string(e.line) + " " + message;
        } else if constexpr (std::is_same_v<T, ms::LogEvent>) {
          s += " " + e.level.toStdString() + " " + e.message.toStdString();
        } else if constexpr (std::is_same_v<T, ms::RunStartEvent>) {
          s += " " + e.name.toStdString() + " " + std::to_string(e.ranks) + " " + std::to_string(e.steps) +
               " " + e.layers.join(',').toStdString();
        } else if constexpr (std::is_same_v<T, ms::StepEvent>) {
          s += " " + std::to_string(e.step) + " " + number(e.loss) + " " + number(e.lr);
        } else if constexpr (std::is_same_v<T, ms::SpansEvent>) {
          s += " " + std::to_string(e.step);
          for (const auto& r : e.ranks)
            s += " " + std::to_string(r.rank) + ":" + std::to_string(r.spans.size());
        } else if constexpr (std::is_same_v<T, ms::MemoryEvent>) {
          s += " " + std::to_string(e.step) + " " + std::to_string(e.ranks.size());
        } else if constexpr (std::is_same_v<T, ms::RunEndEvent>) {
          s += " " + e.status.toStdString() + " " + std::to_string(e.step);
        } else {
          s += " " + std::to_string(e.step);
        }
      },
      event);
  return s;
}

struct Read {
  std::vector<std::string> events;
  int64_t errors = 0;
  int64_t lines = 0;
};

Read readAll(ms::MetricsReader& reader, const char* data, size_t size, bool inPieces) {
  static constexpr size_t kPieces[] = {1, 2, 3, 5, 8, 13, 21};
  Read read;
  auto take = [&](std::vector<ms::MetricsEvent> events) {
    for (const auto& e : events) {
      if (const auto* error = std::get_if<ms::MetricsError>(&e)) {
        ++read.errors;
        const std::string prefix = "line " + std::to_string(error->line) + ": ";
        FUZZ_CHECK(error->message.toStdString().rfind(prefix, 0) == 0, "error of line %lld reads: %s",
                   static_cast<long long>(error->line), error->message.toStdString().c_str());
        FUZZ_CHECK(error->line >= 1 && error->line <= reader.linesRead(),
                   "error of line %lld after %lld lines", static_cast<long long>(error->line),
                   static_cast<long long>(reader.linesRead()));
      }
      read.events.push_back(describe(e));
    }
  };
  size_t at = 0;
  for (size_t i = 0; at < size; ++i) {
    const size_t n = inPieces ? std::min(kPieces[i % 7], size - at) : size - at;
    take(reader.feed(QByteArrayView(data + at, static_cast<qsizetype>(n))));
    at += n;
  }
  take(reader.finish());
  read.lines = reader.linesRead();
  FUZZ_CHECK(reader.bytesRead() == static_cast<int64_t>(size), "bytesRead() %lld of %zu",
             static_cast<long long>(reader.bytesRead()), size);
  FUZZ_CHECK(reader.errorCount() == read.errors, "errorCount() %lld, %lld errors returned",
             static_cast<long long>(reader.errorCount()), static_cast<long long>(read.errors));
  FUZZ_CHECK(reader.pendingBytes() == 0, "%zu bytes pending after finish()", reader.pendingBytes());
  return read;
}

void checkSame(const Read& a, const Read& b, const char* what) {
  FUZZ_CHECK(a.lines == b.lines, "%s: %lld lines against %lld", what, static_cast<long long>(a.lines),
             static_cast<long long>(b.lines));
  FUZZ_CHECK(a.events.size() == b.events.size(), "%s: %zu events against %zu", what, a.events.size(),
             b.events.size());
  for (size_t i = 0; i < a.events.size(); ++i)
    FUZZ_CHECK(a.events[i] == b.events[i], "%s: event %zu differs:\n  %s\n  %s", what, i, a.events[i].c_str(),
               b.events[i].c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  const auto* data = reinterpret_cast<const char*>(bytes);
  ms::MetricsReader whole, pieces;
  const Read full = readAll(whole, data, size, false);
  checkSame(full, readAll(pieces, data, size, true), "whole against pieces");

  // A small line limit: the tail stays within it after every piece, and over-long lines are reported alike
  // however the stream is cut.
  constexpr size_t kLimit = 64;
  ms::MetricsReader smallWhole(kLimit), smallPieces(kLimit);
  const Read a = readAll(smallWhole, data, size, false);
  for (size_t at = 0, i = 0; at < size; ++i) {
    static constexpr size_t kPieces[] = {1, 2, 3, 5, 8, 13, 21};
    const size_t n = std::min(kPieces[i % 7], size - at);
    smallPieces.feed(QByteArrayView(data + at, static_cast<qsizetype>(n)));
    at += n;
    FUZZ_CHECK(smallPieces.pendingBytes() <= kLimit, "%zu bytes pending with a limit of %zu",
               smallPieces.pendingBytes(), kLimit);
  }
  smallPieces.finish();
  ms::MetricsReader smallPieces2(kLimit);
  checkSame(a, readAll(smallPieces2, data, size, true), "whole against pieces, 64-byte lines");
  return fuzz::outcome(full.errors == 0);
}
