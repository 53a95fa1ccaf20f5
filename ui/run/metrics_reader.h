// MetricsReader: the studio's incremental reader of the engine's metrics stream (JSON Lines, one object per
// line with "v" and "type"; the record types and keys are common/metrics_schema.h, shared with the engine's
// writer, engine/runtime/metrics.h).
// Bytes arrive in arbitrary pieces (a pipe, a file read in chunks); feed() parses every line completed by the
// piece and keeps the partial tail for the next one. Each known line is checked and turned into a typed
// event, so nothing downstream looks at JSON.
//
// What always holds: the reader never throws and never crashes on any input; every complete line yields at
// most one event, in stream order; a malformed line (not JSON, not an object, no "type", a field of the wrong
// type) yields a MetricsError "line N: <reason>: <first 80 chars>" and the next line is read normally; lines
// of unknown types and unknown fields are ignored; a line with a newer "v" is read as far as it is understood
// and the first one yields one warning (a LogEvent); the partial tail is bounded (kMaxLineBytes by default),
// a longer line is reported and skipped up to its end.
#pragma once

#include <QByteArray>
#include <QByteArrayView>
#include <QString>
#include <QStringList>
#include <cstdint>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "common/metrics_schema.h"

namespace ms {

inline constexpr int kKnownMetricsVersion = metrics::kVersion;  // the newest version this studio reads
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Bytes by category. Predicted figures (run_start) fill parameters .. other and total; measured ones (memory
// lines) fill parameters .. workspace and total. Absent categories are 0.
struct MemoryFigures {
  double parameters = 0;
  double gradients = 0;
  double optimizer = 0;
  double activations = 0;
  double communication = 0;
  double workspace = 0;
  double other = 0;
  double total = 0;
};

struct PredictedRank {
  int rank = 0;
  int stage = -1;
  MemoryFigures memory;
  double bubbleFraction = kNaN;
};

struct RunStartEvent {
  QString name;
  QString device;
  QString runDir;
  QString resumedFrom;
  int ranks = 0;
  std::int64_t steps = 0;
  std::int64_t startStep = 0;
  std::int64_t params = 0;
  QStringList layers;  // model order
  // From the "config" object when present (parallel layout and batch), else the defaults of one rank.
  int dp = 1, tp = 1, pp = 1;
  int cp = 1;  // context parallelism: a stage's pipelines are its dp * cp (replica, slice) lanes
  int batchSize = 0;
  QString modelType;
  // "predicted": the plan's simulated step (NaN when absent).
  double predictedStepTime = kNaN;
  double predictedTokensPerS = kNaN;
  double predictedMfu = kNaN;
  std::vector<PredictedRank> predictedRanks;
  // Parameter-server runs: the process counts and the consistency (0 and empty otherwise).
  int psServers = 0, psWorkers = 0;
  QString consistency;
  double predictedMeanStaleness = kNaN;
};

struct StepEvent {
  std::int64_t step = 0;
  double loss = kNaN;
  double lr = kNaN;
  double gradNorm = kNaN;
  double stepTime = kNaN;
  double tokensPerS = kNaN;   // gpt
  double samplesPerS = kNaN;  // every model
  double accuracy = kNaN;     // classifiers
  double t = kNaN;            // the line's time on the run's clock (seconds since its start)
  double auxLoss = kNaN;      // mixture of experts: the load-balancing loss (not part of loss)
};

// One span as the engine measured it: seconds since the run started, on one clock for all ranks.
struct MeasuredSpan {
  char action = '?';  // F B W s r S R G O
  std::int16_t microbatch = -1;
  std::int16_t chunk = -1;
  std::string layer;  // "" when the span is not a layer's
  double start = 0;
  double end = 0;
};

struct RankSpans {
  int rank = 0;
  std::vector<MeasuredSpan> spans;
  std::string lane;  // parameter-server mode: "worker 2", "server 0" (its spans' actions are PsSpan's)
};

struct SpansEvent {
  std::int64_t step = 0;
  std::vector<RankSpans> ranks;
};

struct RankMemory {
  int rank = 0;
  MemoryFigures current;
  MemoryFigures peak;
};

struct MemoryEvent {
  std::int64_t step = 0;
  std::vector<RankMemory> ranks;
};

struct EvalEvent {
  std::int64_t step = 0;
  double loss = kNaN;
  std::int64_t samples = 0;
  double accuracy = kNaN;
  double timeS = kNaN;
};

// Parameter-server mode's state (a "ps" line): server 0's updates, their staleness, every worker's state.
struct PsWorkerState {
  int worker = 0;
  bool live = false;
  std::int64_t steps = 0;     // its pushes applied
  double samplesPerS = kNaN;  // since the previous ps line (NaN when it pushed nothing since)
  double stepTime = kNaN;
};

struct PsEvent {
  std::int64_t step = 0;
  std::int64_t version = 0;
  std::vector<std::int64_t> staleness;       // updates with staleness 0, 1, ... since the previous ps line
  std::vector<std::int64_t> stalenessTotal;  // the same over the run
  std::int64_t discarded = 0;
  std::vector<PsWorkerState> workers;
  bool final = false;
};

struct CheckpointEvent {
  std::int64_t step = 0;
  QString path;
};

struct LogEvent {
  QString level;  // "info", "warning", "error"
  QString message;
};

struct RunEndEvent {
  QString status;  // "ok", "interrupted", "error"
  QString reason;
  std::int64_t step = 0;
};

// A line that could not be read: "line N: <reason>: <first 80 chars of the line>".
struct MetricsError {
  std::int64_t line = 0;
  QString message;
};

using MetricsEvent = std::variant<RunStartEvent, StepEvent, SpansEvent, MemoryEvent, EvalEvent,
                                  CheckpointEvent, LogEvent, RunEndEvent, PsEvent, MetricsError>;

class MetricsReader {
 public:
  // A line longer than this without an end is reported and skipped: it bounds the reader's memory. The
  // engine's largest lines, the spans of every rank, are about 85 bytes a span: 1,000 ranks x 1,000 spans
  // would be 85 MB.
  static constexpr std::size_t kMaxLineBytes = std::size_t(128) << 20;

  explicit MetricsReader(std::size_t maxLineBytes = kMaxLineBytes) : m_maxLineBytes(maxLineBytes) {}

  // Appends bytes and returns the events of every line they complete, in order.
  std::vector<MetricsEvent> feed(QByteArrayView bytes);
  // The stream ended: a non-empty unfinished last line is read when it is a whole JSON object (a file without
  // a final newline), else reported as truncated. The reader can then be fed a new stream.
  std::vector<MetricsEvent> finish();

  // Parses one line (without its newline). Empty when the line is blank or of an unknown type.
  std::vector<MetricsEvent> parseLine(QByteArrayView line, std::int64_t lineNumber);

  std::int64_t linesRead() const { return m_lines; }
  std::int64_t bytesRead() const { return m_bytes; }
  std::int64_t errorCount() const { return m_errors; }
  std::size_t pendingBytes() const { return static_cast<std::size_t>(m_tail.size()); }

 private:
  void takeLine(QByteArrayView line, std::vector<MetricsEvent>& out);
  std::size_t m_maxLineBytes;
  QByteArray m_tail;          // bytes of the unfinished line
  bool m_skipping = false;    // inside an over-long line, discarding up to its end
  std::int64_t m_lines = 0;   // complete lines seen (numbering is 1-based)
  std::int64_t m_bytes = 0;   // bytes fed
  std::int64_t m_errors = 0;  // MetricsError events produced
  bool m_warnedVersion = false;
};

// The name of an event's line type ("step", "spans", ...; "error" for a MetricsError).
const char* eventTypeName(const MetricsEvent& event);

}  // namespace ms
