// RunData; see run_data.h.
#include "ui/run/run_data.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>

namespace ms {

namespace {

template <typename T>
void pushBounded(std::deque<T>& q, T value, std::size_t cap) {
  q.push_back(std::move(value));
  while (q.size() > cap) q.pop_front();
}

bool isPipelineWork(SpanKind k) {
  return k == SpanKind::Forward || k == SpanKind::Backward || k == SpanKind::BackwardWeight;
}

// A series' columns for its SeriesDecimator, the step first.
std::array<QVector<double>*, 9> columnsOf(StepSeries& s) {
  return {&s.step, &s.loss, &s.lr, &s.gradNorm, &s.stepTime, &s.throughput, &s.accuracy, &s.time, &s.auxLoss};
}
std::array<QVector<double>*, 4> columnsOf(EvalSeries& s) {
  return {&s.step, &s.loss, &s.accuracy, &s.samples};
}

}  // namespace

void SeriesDecimator::Bucket::add(double step, std::span<const double> values, std::int64_t weight) {
  if (points == 0) {
    first = step;
    extremes.assign(values.size(), Extreme{});
  }
  last = step;
  points += weight;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    if (std::isnan(v)) continue;
    Extreme& e = extremes[i];
    // Strict comparisons: on a tie the earlier point stays the extreme.
    if (std::isnan(e.lo) || v < e.lo) e.lo = v, e.loAt = step;
    if (std::isnan(e.hi) || v > e.hi) e.hi = v, e.hiAt = step;
  }
}

void SeriesDecimator::Bucket::add(const Bucket& later) {
  if (later.points == 0) return;
  if (points == 0) {
    *this = later;
    return;
  }
  last = later.last;
  points += later.points;
  for (std::size_t i = 0; i < extremes.size(); ++i) {
    Extreme& e = extremes[i];
    const Extreme& l = later.extremes[i];
    if (!std::isnan(l.lo) && (std::isnan(e.lo) || l.lo < e.lo)) e.lo = l.lo, e.loAt = l.loAt;
    if (!std::isnan(l.hi) && (std::isnan(e.hi) || l.hi > e.hi)) e.hi = l.hi, e.hiAt = l.hiAt;
  }
}

// A bucket as its pair of rows: in each column the smallest and the largest value in the order they came
// (both NaN when the column had none).
void SeriesDecimator::pushPair(std::span<QVector<double>* const> columns, const Bucket& b) {
  columns[0]->push_back(b.first);
  columns[0]->push_back(b.last);
  for (std::size_t i = 1; i < columns.size(); ++i) {
    const Extreme& e = b.extremes[i - 1];
    const bool lowFirst = e.loAt <= e.hiAt;
    columns[i]->push_back(lowFirst ? e.lo : e.hi);
    columns[i]->push_back(lowFirst ? e.hi : e.lo);
  }
}

void SeriesDecimator::halve(std::span<QVector<double>* const> columns) {
  // Every 4 rows (4 points, or 2 pairs) become one pair; what is left over (fewer than 4 points, or one
  // pair) goes back to the waiting points, ahead of those already waiting.
  const qsizetype rows = columns[0]->size();
  const qsizetype groups = rows / 4;
  const std::int64_t weight = m_decimation == 1 ? 1 : m_decimation / 2;  // points per row
  std::vector<double> values(columns.size() - 1);
  auto rowValues = [&](qsizetype r) {
    for (std::size_t i = 1; i < columns.size(); ++i) values[i - 1] = (*columns[i])[r];
    return std::span<const double>(values);
  };
  std::vector<QVector<double>> pairs(columns.size());
  for (auto& c : pairs) c.reserve(2 * groups);
  std::vector<QVector<double>*> pairColumns;
  for (auto& c : pairs) pairColumns.push_back(&c);
  for (qsizetype g = 0; g < groups; ++g) {
    Bucket b;
    for (qsizetype r = 4 * g; r < 4 * g + 4; ++r) b.add((*columns[0])[r], rowValues(r), weight);
    pushPair(pairColumns, b);
  }
  Bucket left;
  for (qsizetype r = 4 * groups; r < rows; ++r) left.add((*columns[0])[r], rowValues(r), weight);
  left.add(m_pending);
  m_pending = std::move(left);
  for (std::size_t i = 0; i < columns.size(); ++i) *columns[i] = std::move(pairs[i]);
  m_decimation = m_decimation == 1 ? 4 : 2 * m_decimation;
}

bool SeriesDecimator::append(std::span<QVector<double>* const> columns, std::span<const double> point) {
  if (m_decimation == 1) {
    for (std::size_t i = 0; i < columns.size(); ++i) columns[i]->push_back(point[i]);
  } else {
    m_pending.add(point[0], point.subspan(1), 1);
    if (m_pending.points < m_decimation) return false;
    pushPair(columns, m_pending);
    m_pending = Bucket{};
  }
  if (columns[0]->size() < RunData::kMaxSeriesPoints) return false;
  halve(columns);
  return true;
}

bool SeriesDecimator::dropFrom(std::span<QVector<double>* const> columns, double step) {
  bool dropped = false;
  // The waiting points come after the rows; a pair cannot be split, so one the cut falls in goes whole.
  if (m_pending.points > 0 && m_pending.last >= step) {
    m_pending = Bucket{};
    dropped = true;
  }
  QVector<double>& steps = *columns[0];
  qsizetype keep = std::lower_bound(steps.begin(), steps.end(), step) - steps.begin();
  if (m_decimation > 1) keep &= ~qsizetype(1);
  if (keep < steps.size()) {
    for (QVector<double>* c : columns) c->resize(std::min(c->size(), keep));
    dropped = true;
  }
  return dropped;
}

const char* toString(RunState state) {
  switch (state) {
    case RunState::Idle:
      return "idle";
    case RunState::Starting:
      return "starting";
    case RunState::Running:
      return "running";
    case RunState::Finished:
      return "finished";
    case RunState::Interrupted:
      return "interrupted";
    case RunState::Failed:
      return "failed";
    case RunState::Incomplete:
      return "incomplete";
  }
  return "idle";
}

double RunInfo::predictedThroughput() const {
  if (modelType.isEmpty() || modelType == QLatin1String("gpt") || modelType == QLatin1String("llama"))
    return predictedTokensPerS;
  if (batchSize > 0 && predictedStepTime > 0) return batchSize / predictedStepTime;
  return kNaN;
}

const PredictedRank* RunInfo::predicted(int rank) const {
  auto it = std::lower_bound(predictedRanks.begin(), predictedRanks.end(), rank,
                             [](const PredictedRank& p, int r) { return p.rank < r; });
  return it != predictedRanks.end() && it->rank == rank ? &*it : nullptr;
}

void computeMeasuredBubbles(TimelineData& timeline, int dp, int tp) {
  dp = std::max(1, dp);
  tp = std::max(1, tp);
  auto replicaOf = [&](int rank) { return (rank / tp) % dp; };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> first(static_cast<std::size_t>(dp), kInf), last(static_cast<std::size_t>(dp), -kInf);
  for (const TimelineRow& row : timeline.rows) {
    const auto r = static_cast<std::size_t>(replicaOf(row.rank));
    for (const TimelineSpan& s : row.spans) {
      if (!isPipelineWork(s.kind)) continue;
      if (s.kind == SpanKind::Forward) first[r] = std::min(first[r], s.start);
      last[r] = std::max(last[r], s.end);
    }
  }
  for (TimelineRow& row : timeline.rows) {
    const auto r = static_cast<std::size_t>(replicaOf(row.rank));
    double busy = 0;
    bool any = false;
    for (const TimelineSpan& s : row.spans)
      if (isPipelineWork(s.kind)) {
        busy += s.end - s.start;
        any = true;
      }
    const double window = last[r] - first[r];
    row.bubbleFraction =
        any && std::isfinite(window) && window > 0 ? std::max(0.0, 1.0 - busy / window) : -1.0;
  }
}

void RunData::clear() {
  const std::uint64_t revision = m_revision, epoch = m_seriesEpoch, generation = m_generation;
  *this = RunData();
  m_revision = revision + 1;
  m_seriesEpoch = epoch + 1;
  m_generation = generation + 1;
}

void RunData::apply(std::vector<MetricsEvent>& events) {
  for (MetricsEvent& e : events) apply(std::move(e));
}

void RunData::apply(MetricsEvent event) {
  ++m_revision;
  std::visit(
      [this](auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, RunStartEvent>) {
          onRunStart(e);
        } else if constexpr (std::is_same_v<T, StepEvent>) {
          onStep(e);
        } else if constexpr (std::is_same_v<T, SpansEvent>) {
          onSpans(e);
        } else if constexpr (std::is_same_v<T, MemoryEvent>) {
          onMemory(e);
        } else if constexpr (std::is_same_v<T, EvalEvent>) {
          onEval(e);
        } else if constexpr (std::is_same_v<T, CheckpointEvent>) {
          pushBounded(m_checkpoints, CheckpointRecord{e.step, e.path}, kMaxRecords);
          appendLog(LogLine::Stream, QStringLiteral("info"),
                    QStringLiteral("checkpoint at step %1: %2").arg(e.step).arg(e.path));
        } else if constexpr (std::is_same_v<T, LogEvent>) {
          appendLog(LogLine::Stream, e.level, e.message);
        } else if constexpr (std::is_same_v<T, RunEndEvent>) {
          m_runEnd = e;
          const RunState s = e.status == QLatin1String("ok")            ? RunState::Finished
                             : e.status == QLatin1String("interrupted") ? RunState::Interrupted
                                                                        : RunState::Failed;
          setState(s, e.reason);
        } else if constexpr (std::is_same_v<T, PsEvent>) {
          onPs(e);
        } else if constexpr (std::is_same_v<T, MetricsError>) {
          addError(e.message);
        }
      },
      event);
}

void RunData::onRunStart(RunStartEvent& e) {
  // A second run_start in one stream is a resumed run appending to its folder's metrics.jsonl: the series
  // carry on (onStep drops points a resume from an earlier checkpoint repeats).
  static_cast<RunStartEvent&>(m_info) = std::move(e);
  m_info.known = true;
  std::sort(m_info.predictedRanks.begin(), m_info.predictedRanks.end(),
            [](const PredictedRank& a, const PredictedRank& b) { return a.rank < b.rank; });
  // Model order first, so layer indices follow the model whatever order spans name them in.
  for (const QString& l : m_info.layers) internLayer(l.toStdString());
  m_runEnd.reset();
  setState(RunState::Running);
}

void RunData::dropSeriesFrom(double step) {
  m_stepDecimator.dropFrom(columnsOf(m_steps), step);
  m_evalDecimator.dropFrom(columnsOf(m_evals), step);
  if (m_lastEval && double(m_lastEval->step) >= step) m_lastEval.reset();
  ++m_seriesEpoch;
}

void RunData::onStep(const StepEvent& e) {
  const double step = static_cast<double>(e.step);
  if (m_lastStep && e.step <= m_lastStep->step) dropSeriesFrom(step);
  if (m_steps.logged == 0) m_steps.throughputIsTokens = !std::isnan(e.tokensPerS);
  m_lastStep = e;
  ++m_steps.logged;
  const double point[] = {step,       e.loss,     e.lr,
                          e.gradNorm, e.stepTime, m_steps.throughputIsTokens ? e.tokensPerS : e.samplesPerS,
                          e.accuracy, e.t,        e.auxLoss};
  if (m_stepDecimator.append(columnsOf(m_steps), point)) ++m_seriesEpoch;
  m_steps.decimation = m_stepDecimator.decimation();
}

void RunData::onPs(const PsEvent& e) {
  std::int64_t count = 0, weighted = 0;
  for (std::size_t s = 0; s < e.staleness.size(); ++s) {
    count += e.staleness[s];
    weighted += static_cast<std::int64_t>(s) * e.staleness[s];
  }
  if (count > 0 && !e.final) {
    if (m_psSteps.size() >= kMaxSeriesPoints) {
      QVector<double> steps, means;
      for (qsizetype i = 0; i < m_psSteps.size(); i += 2) {
        steps.push_back(m_psSteps[i]);
        means.push_back(m_psMeanStaleness[i]);
      }
      m_psSteps = std::move(steps);
      m_psMeanStaleness = std::move(means);
    }
    m_psSteps.push_back(double(e.step));
    m_psMeanStaleness.push_back(double(weighted) / double(count));
  }
  m_lastPs = e;
}

void RunData::onEval(const EvalEvent& e) {
  const double step = static_cast<double>(e.step);
  if (m_lastEval && e.step < m_lastEval->step) {
    m_evalDecimator.dropFrom(columnsOf(m_evals), step);
    ++m_seriesEpoch;
  }
  m_lastEval = e;
  ++m_evals.logged;
  const double point[] = {step, e.loss, e.accuracy, static_cast<double>(e.samples)};
  if (m_evalDecimator.append(columnsOf(m_evals), point)) ++m_seriesEpoch;
  m_evals.decimation = m_evalDecimator.decimation();
}

int RunData::internLayer(const std::string& name) {
  if (name.empty()) return -1;
  auto it = m_layerIndex.find(name);
  if (it != m_layerIndex.end()) return it->second;
  if (m_layerNames.size() >= kMaxLayerNames) return -1;
  const int index = static_cast<int>(m_layerNames.size());
  m_layerNames << QString::fromStdString(name);
  m_layerIndex.emplace(name, index);
  return index;
}

void RunData::onSpans(SpansEvent& e) {
  std::stable_sort(e.ranks.begin(), e.ranks.end(),
                   [](const RankSpans& a, const RankSpans& b) { return a.rank < b.rank; });
  double origin = std::numeric_limits<double>::infinity();
  for (const RankSpans& r : e.ranks)
    for (const MeasuredSpan& s : r.spans)
      if (std::isfinite(s.start)) origin = std::min(origin, s.start);
  if (!std::isfinite(origin)) origin = 0;

  MeasuredStep m;
  m.step = e.step;
  m.origin = origin;
  TimelineData& t = m.timeline;
  bool psLanes = false;
  const int stageWidth = std::max(1, m_info.dp * m_info.cp * m_info.tp);
  for (RankSpans& r : e.ranks) {
    if (r.rank >= kMaxRanks) {
      addError(QStringLiteral("spans of step %1: rank %2 is beyond the %3 ranks the studio shows; skipped")
                   .arg(e.step)
                   .arg(r.rank)
                   .arg(kMaxRanks));
      continue;
    }
    const bool lane = !r.lane.empty();  // parameter-server mode: a worker's or a server's lane
    psLanes = psLanes || lane;
    if (t.rows.empty() || t.rows.back().rank != r.rank) {
      TimelineRow row;
      row.rank = r.rank;
      const PredictedRank* p = m_info.predicted(r.rank);
      // A lane is its own group (the lanes are not replicas), as in the predicted timeline.
      row.stage = lane ? r.rank : p && p->stage >= 0 ? p->stage : r.rank / stageWidth;
      row.label = lane ? QString::fromStdString(r.lane)
                       : QStringLiteral("rank %1 · stage %2").arg(r.rank).arg(row.stage);
      t.rows.push_back(std::move(row));
    }
    std::vector<TimelineSpan>& spans = t.rows.back().spans;
    spans.reserve(spans.size() + r.spans.size());
    for (const MeasuredSpan& s : r.spans) {
      if (!std::isfinite(s.start) || !std::isfinite(s.end)) continue;
      TimelineSpan ts;
      ts.start = s.start - origin;
      ts.end = std::max(s.end, s.start) - origin;
      ts.kind = lane ? spanKindFromPsCode(s.action) : spanKindFromCode(s.action);
      ts.microbatch = s.microbatch;
      ts.chunk = s.chunk;
      ts.layer = internLayer(s.layer);
      spans.push_back(ts);
    }
  }
  for (TimelineRow& row : t.rows)
    std::stable_sort(row.spans.begin(), row.spans.end(),
                     [](const TimelineSpan& a, const TimelineSpan& b) { return a.start < b.start; });
  t.layerNames = m_layerNames;  // implicitly shared: a copy of the pointer while the list does not change
  t.updateExtent();
  if (!psLanes)
    computeMeasuredBubbles(t, m_info.dp * m_info.cp,
                           m_info.tp);  // pipeline bubbles: no pipeline in the PS mode
  pushBounded(m_history, std::move(m), kSpanHistory);
}

void RunData::onMemory(const MemoryEvent& e) {
  for (const RankMemory& r : e.ranks) {
    if (r.rank >= kMaxRanks) continue;
    auto it = std::lower_bound(m_memory.begin(), m_memory.end(), r.rank,
                               [](const MeasuredMemory& m, int rank) { return m.rank < rank; });
    if (it == m_memory.end() || it->rank != r.rank) {
      MeasuredMemory fresh;
      fresh.rank = r.rank;
      it = m_memory.insert(it, fresh);
    }
    it->current = r.current;
    MemoryFigures& p = it->peak;
    const MemoryFigures& q = r.peak;
    p.parameters = std::max(p.parameters, q.parameters);
    p.gradients = std::max(p.gradients, q.gradients);
    p.optimizer = std::max(p.optimizer, q.optimizer);
    p.activations = std::max(p.activations, q.activations);
    p.communication = std::max(p.communication, q.communication);
    p.workspace = std::max(p.workspace, q.workspace);
    p.other = std::max(p.other, q.other);
    p.total = std::max(p.total, q.total);
  }
}

void RunData::addError(const QString& message) {
  ++m_errorTotal;
  pushBounded(m_errors, message, kMaxRecords);
  appendLog(LogLine::Studio, QStringLiteral("warning"), QStringLiteral("metrics stream: ") + message);
}

void RunData::appendLog(LogLine::Source source, const QString& level, const QString& message) {
  ++m_revision;
  ++m_logTotal;
  pushBounded(m_log, LogLine{source, level, message}, kMaxLogLines);
}

void RunData::setState(RunState state, const QString& message) {
  ++m_revision;
  m_state = state;
  m_stateMessage = message;
}

const TimelineData& RunData::timeline() const {
  return m_history.empty() ? m_emptyTimeline : m_history.back().timeline;
}

std::int64_t RunData::timelineStep() const {
  return m_history.empty() ? 0 : m_history.back().step;
}

std::int64_t RunData::lastStep() const {
  return m_lastStep ? m_lastStep->step : 0;
}

std::vector<std::pair<int, double>> RunData::meanMeasuredBubble() const {
  std::map<int, std::pair<double, int>> sums;
  for (const MeasuredStep& m : m_history)
    for (const TimelineRow& row : m.timeline.rows) {
      auto& [sum, n] = sums[row.rank];
      if (row.bubbleFraction >= 0) {
        sum += row.bubbleFraction;
        ++n;
      }
    }
  std::vector<std::pair<int, double>> out;
  out.reserve(sums.size());
  for (const auto& [rank, sn] : sums) out.emplace_back(rank, sn.second ? sn.first / sn.second : kNaN);
  return out;
}

}  // namespace ms
