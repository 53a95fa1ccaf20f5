// RunData: what the studio knows about one run, filled from the metrics stream's events (live, from
// EngineClient, or replayed from a run folder by loadRunFolder). The views read it on their own timer and
// redraw only when revision() moved.
//
// What always holds: revision() increases whenever anything readable here changes; memory is bounded for any
// run length and any stream (a series keeps at most kMaxSeriesPoints rows however long the run), by these
// policies:
// - the step and eval series are kept whole up to kMaxSeriesPoints rows each; past that they are decimated
//   for drawing, min/max-preserving: each pair of rows then stands for `decimation` consecutive points (its
//   steps the first and the last of them; in each column the smallest and the largest value among them, in
//   the order they came), the pairs covering the run evenly; whenever the rows reach kMaxSeriesPoints
//   again, neighbouring pairs are merged (decimation doubles, the rows halve, seriesEpoch() moves). The
//   newest points of a decimated series wait, fewer than `decimation` of them, until they fill a pair;
//   the latest step and eval lines are always kept exact (lastStepLine(), lastEvalLine()), and so are the
//   counts of lines taken (StepSeries::logged);
// - the span history keeps the last kSpanHistory steps; the log the last kMaxLogLines lines (logTotal()
//   counts every line, so logDropped() says how many went); checkpoints and errors their last kMaxRecords;
//   memory one entry per rank (at most kMaxRanks), layer names at most kMaxLayerNames.
// A step number that goes back (a run resumed from an earlier checkpoint into the same stream) drops the
// series points at and after it, so the series stay sorted by step (in a decimated series, the pair the cut
// falls in and the waiting points go too).
#pragma once

#include <QString>
#include <QStringList>
#include <QVector>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "ui/models/timeline_data.h"
#include "ui/run/metrics_reader.h"

namespace ms {

// The run as announced by run_start (the event itself, plus whether one was seen).
struct RunInfo : RunStartEvent {
  bool known = false;  // a run_start was seen; predictedRanks are then sorted by rank
  // The predicted throughput in the unit of the measured series: tokens/s for a gpt, else samples/s
  // (batch / predicted step time; the plan's "tokens_per_s" counts patches for a vit).
  double predictedThroughput() const;
  const PredictedRank* predicted(int rank) const;
};

// Columns of the logged steps, sorted by step. Absent figures are NaN. See RunData for the decimation.
struct StepSeries {
  QVector<double> step, loss, lr, gradNorm, stepTime, throughput, accuracy;
  QVector<double> auxLoss;  // mixture of experts: the load-balancing loss (NaN when the run has none)
  QVector<double> time;  // the step line's "t": seconds since the run's clock started (NaN when absent)
  bool throughputIsTokens = true;  // tokens/s (gpt) or samples/s
  // 1: every logged step is a row. Else each pair of rows (from an even index) stands for this many steps.
  std::int64_t decimation = 1;
  std::int64_t logged = 0;  // step lines taken in since the data was cleared (rows or not)
  int size() const { return static_cast<int>(step.size()); }
};

struct EvalSeries {
  QVector<double> step, loss, accuracy, samples;
  std::int64_t decimation = 1;  // as StepSeries::decimation
  std::int64_t logged = 0;
  int size() const { return static_cast<int>(step.size()); }
};

// The decimation of one series (RunData's policy): columns[0] is the step, the others its values.
class SeriesDecimator {
 public:
  // columns: the step column first. True when rows other than new ones at the end changed (a halving).
  bool append(std::span<QVector<double>* const> columns, std::span<const double> point);
  // Drops the points whose step is >= step; true when any were dropped.
  bool dropFrom(std::span<QVector<double>* const> columns, double step);
  std::int64_t decimation() const { return m_decimation; }
  std::int64_t waiting() const { return m_pending.points; }  // points not yet in a pair of rows

 private:
  struct Extreme {
    double lo = kNaN, hi = kNaN;
    double loAt = 0, hiAt = 0;  // their steps
  };
  struct Bucket {
    double first = 0, last = 0;  // steps
    std::int64_t points = 0;
    std::vector<Extreme> extremes;  // per value column
    void add(double step, std::span<const double> values, std::int64_t weight);
    void add(const Bucket& later);
  };
  void pushPair(std::span<QVector<double>* const> columns, const Bucket& b);
  void halve(std::span<QVector<double>* const> columns);
  std::int64_t m_decimation = 1;
  Bucket m_pending;
};

// One step's measured spans as a timeline. Times are relative to origin, the earliest span's start in seconds
// since the run started, so the timeline starts at 0 like a predicted one.
struct MeasuredStep {
  std::int64_t step = 0;
  double origin = 0;
  TimelineData timeline;
};

struct MeasuredMemory {
  int rank = 0;
  MemoryFigures current;  // the latest memory line's
  MemoryFigures peak;     // the largest peak of every category over the run (total: the largest total)
};

struct LogLine {
  enum Source : std::uint8_t { Stream, Stderr, Studio };
  Source source = Stream;
  QString level;
  QString message;
};

struct CheckpointRecord {
  std::int64_t step = 0;
  QString path;
};

// Where the run stands, as the studio shows it.
enum class RunState { Idle, Starting, Running, Finished, Interrupted, Failed, Incomplete };
const char* toString(RunState state);

class RunData {
 public:
  static constexpr int kMaxSeriesPoints = 1 << 15;  // rows of the step series, and of the eval series
  static constexpr std::size_t kSpanHistory = 20;
  static constexpr std::size_t kMaxLogLines = 5000;
  static constexpr std::size_t kMaxRecords = 1000;  // checkpoints, errors
  static constexpr int kMaxLayerNames = 4096;       // interned layer names; more are shown as no layer
  static constexpr int kMaxRanks = 1 << 16;         // ranks shown; a stream naming more is reported

  // Empties everything (a new run); revision() still increases.
  void clear();
  void apply(MetricsEvent event);
  void apply(std::vector<MetricsEvent>& events);
  // A line from somewhere other than the stream (the engine's stderr, the studio itself).
  void appendLog(LogLine::Source source, const QString& level, const QString& message);
  void setState(RunState state, const QString& message = {});
  // A resumed run continues these series: the previous attempt's run_end no longer describes the run.
  void forgetRunEnd() {
    m_runEnd.reset();
    ++m_revision;
  }

  std::uint64_t revision() const { return m_revision; }
  // Increases with every clear() (a new run): views drop everything they show and read the data anew.
  std::uint64_t generation() const { return m_generation; }
  const RunInfo& info() const { return m_info; }
  const StepSeries& steps() const { return m_steps; }
  const EvalSeries& evals() const { return m_evals; }
  // The latest step and eval lines, exact whatever the decimation (empty before the first).
  const std::optional<StepEvent>& lastStepLine() const { return m_lastStep; }
  const std::optional<EvalEvent>& lastEvalLine() const { return m_lastEval; }
  // Parameter-server runs: the latest ps line (staleness histograms, every worker's state), and the mean
  // staleness of each ps line's window against its step (at most kMaxSeriesPoints rows: every other row
  // is dropped when full).
  const std::optional<PsEvent>& lastPs() const { return m_lastPs; }
  const QVector<double>& psSteps() const { return m_psSteps; }
  const QVector<double>& psMeanStaleness() const { return m_psMeanStaleness; }
  // Increases whenever rows of the series changed other than by new ones at the end (a step number went
  // back, or a decimated series was halved): views re-read them whole instead of appending.
  std::uint64_t seriesEpoch() const { return m_seriesEpoch; }
  // The latest measured timeline (empty before the first spans line).
  const TimelineData& timeline() const;
  std::int64_t timelineStep() const;
  // The last kSpanHistory measured steps, oldest first (trace export).
  const std::deque<MeasuredStep>& spanHistory() const { return m_history; }
  // Per rank (index = position, sorted by rank): the mean measured bubble over the span history, NaN for a
  // rank without compute spans.
  std::vector<std::pair<int, double>> meanMeasuredBubble() const;
  const std::vector<MeasuredMemory>& memory() const { return m_memory; }  // sorted by rank
  const std::deque<LogLine>& log() const { return m_log; }
  // Lines ever appended to the log (the log keeps the last kMaxLogLines): a view appends the ones it lacks.
  std::uint64_t logTotal() const { return m_logTotal; }
  std::uint64_t logDropped() const { return m_logTotal - m_log.size(); }
  const std::deque<CheckpointRecord>& checkpoints() const { return m_checkpoints; }
  const std::deque<QString>& errors() const { return m_errors; }  // malformed lines, newest last
  std::uint64_t errorTotal() const { return m_errorTotal; }
  const std::optional<RunEndEvent>& runEnd() const { return m_runEnd; }
  RunState state() const { return m_state; }
  QString stateMessage() const { return m_stateMessage; }
  // The latest step line's step (0 before any), exact.
  std::int64_t lastStep() const;

 private:
  void onRunStart(RunStartEvent& e);
  void onStep(const StepEvent& e);
  void onSpans(SpansEvent& e);
  void onMemory(const MemoryEvent& e);
  void onEval(const EvalEvent& e);
  void onPs(const PsEvent& e);
  void addError(const QString& message);
  int internLayer(const std::string& name);
  void dropSeriesFrom(double step);

  std::uint64_t m_revision = 0;
  std::uint64_t m_generation = 0;
  RunInfo m_info;
  StepSeries m_steps;
  EvalSeries m_evals;
  SeriesDecimator m_stepDecimator, m_evalDecimator;
  std::optional<StepEvent> m_lastStep;
  std::optional<EvalEvent> m_lastEval;
  std::optional<PsEvent> m_lastPs;
  QVector<double> m_psSteps, m_psMeanStaleness;
  std::uint64_t m_seriesEpoch = 0;
  std::deque<MeasuredStep> m_history;
  std::vector<MeasuredMemory> m_memory;
  std::deque<LogLine> m_log;
  std::uint64_t m_logTotal = 0;
  std::deque<CheckpointRecord> m_checkpoints;
  std::deque<QString> m_errors;
  std::uint64_t m_errorTotal = 0;
  std::optional<RunEndEvent> m_runEnd;
  RunState m_state = RunState::Idle;
  QString m_stateMessage;
  QStringList m_layerNames;
  std::unordered_map<std::string, int> m_layerIndex;
  TimelineData m_emptyTimeline;
};

// The measured bubble of every row of a step's timeline, the simulator's definition (engine/plan/simulator.h)
// applied to measured spans: 1 - (the rank's F, B and W time) / (earliest F start to latest B or W end over
// the ranks of its pipeline replica, i.e. the ranks with its data-parallel index). With dp = 1 the window is
// over all ranks. A rank without F, B or W gets -1 (unknown).
void computeMeasuredBubbles(TimelineData& timeline, int dp, int tp);

}  // namespace ms
