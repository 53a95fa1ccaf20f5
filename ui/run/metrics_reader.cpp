// MetricsReader; see metrics_reader.h.
#include "ui/run/metrics_reader.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <exception>

namespace ms {

namespace {

using nlohmann::json;
namespace key = metrics::key;
namespace category = metrics::category;

// Reads typed fields of one JSON object, remembering the first problem ("ranks[1].spans[3].start: expected a
// number, got string"). Absent optional fields give their default; every getter is safe after a failure.
class Fields {
 public:
  Fields(const json& object, std::string* error, std::string path = {})
      : m_object(object), m_error(error), m_path(std::move(path)) {}

  bool failed() const { return !m_error->empty(); }

  double number(const char* key, bool required = false) {
    const json* v = find(key, required);
    if (!v) return kNaN;
    if (!v->is_number()) return fail(key, "a number", *v), kNaN;
    return v->get<double>();
  }

  std::int64_t integer(const char* key, bool required, std::int64_t fallback, std::int64_t lo = INT64_MIN,
                       std::int64_t hi = INT64_MAX) {
    const json* v = find(key, required);
    if (!v) return fallback;
    if (!v->is_number_integer()) return fail(key, "an integer", *v), fallback;
    if (v->is_number_unsigned() && v->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
      return failRange(key), fallback;
    const std::int64_t x = v->get<std::int64_t>();
    if (x < lo || x > hi) return failRange(key), fallback;
    return x;
  }

  QString string(const char* key, bool required = false) {
    const json* v = find(key, required);
    if (!v) return {};
    if (!v->is_string()) return fail(key, "a string", *v), QString();
    const auto& s = v->get_ref<const std::string&>();
    return QString::fromUtf8(s.data(), static_cast<qsizetype>(s.size()));
  }

  const std::string* rawString(const char* key, bool required = false) {
    const json* v = find(key, required);
    if (!v) return nullptr;
    if (!v->is_string()) return fail(key, "a string", *v), nullptr;
    return &v->get_ref<const std::string&>();
  }

  // A one-character string (the span actions F, B, W, ...); '?' when absent or wrong.
  char letter(const char* key, bool required = false) {
    const json* v = find(key, required);
    if (!v) return '?';
    if (!v->is_string() || v->get_ref<const std::string&>().size() != 1)
      return fail(key, "one letter", *v), '?';
    return v->get_ref<const std::string&>()[0];
  }

  // The value under key, of any type (nullptr when absent).
  const json* raw(const char* key) { return find(key, false); }
  const json* array(const char* key, bool required = false) {
    const json* v = find(key, required);
    if (v && !v->is_array()) return fail(key, "an array", *v), nullptr;
    return v;
  }

  const json* object(const char* key, bool required = false) {
    const json* v = find(key, required);
    if (v && !v->is_object()) return fail(key, "an object", *v), nullptr;
    return v;
  }

  // A nested object's fields, sharing this reader's error: path "ranks[2]".
  Fields nested(const json& element, const char* key, std::size_t index) const {
    return Fields(element, m_error, m_path + key + "[" + std::to_string(index) + "].");
  }
  Fields nested(const json& element, const char* key) const {
    return Fields(element, m_error, m_path + key + ".");
  }
  // An array element that must be an object.
  bool requireObject(const json& element, const char* key, std::size_t index) {
    if (element.is_object()) return true;
    if (!failed())
      *m_error = "\"" + m_path + key + "[" + std::to_string(index) + "]\": expected an object, got " +
                 element.type_name();
    return false;
  }
  // A list of counts (histograms): integers >= 0; empty (and the line failed) otherwise.
  std::vector<std::int64_t> counts(const char* key) {
    std::vector<std::int64_t> out;
    const json* a = array(key);
    if (!a) return out;
    for (const json& v : *a) {
      if (!v.is_number_integer() || v.get<std::int64_t>() < 0) {
        fail(key, "an array of counts", v);
        return {};
      }
      out.push_back(v.get<std::int64_t>());
    }
    return out;
  }

 private:
  const json* find(const char* key, bool required) {
    if (failed()) return nullptr;
    auto it = m_object.find(key);
    if (it == m_object.end()) {
      if (required) *m_error = "missing \"" + m_path + key + "\"";
      return nullptr;
    }
    return &*it;
  }
  void fail(const char* key, const char* expected, const json& got) {
    if (failed()) return;
    std::string shown = got.type_name();
    if (got.is_string() || got.is_number() || got.is_boolean()) shown += " " + got.dump().substr(0, 40);
    *m_error = "\"" + m_path + key + "\": expected " + expected + ", got " + shown;
  }
  void failRange(const char* key) {
    if (!failed()) *m_error = "\"" + m_path + key + "\": out of range";
  }
  const json& m_object;
  std::string* m_error;
  std::string m_path;
};

MemoryFigures readMemory(Fields f) {
  MemoryFigures m;
  m.parameters = f.number(category::kParameters);
  m.gradients = f.number(category::kGradients);
  m.optimizer = f.number(category::kOptimizer);
  m.activations = f.number(category::kActivations);
  m.communication = f.number(category::kCommunication);
  m.workspace = f.number(category::kWorkspace);
  m.other = f.number(category::kOther);
  m.total = f.number(key::kTotal);
  // Absent categories are 0 (number() gives NaN for an absent field).
  for (double* x : {&m.parameters, &m.gradients, &m.optimizer, &m.activations, &m.communication, &m.workspace,
                    &m.other, &m.total})
    if (*x != *x) *x = 0;
  return m;
}

// The run config inside run_start is read leniently: it is the engine's own toJson(), and the studio needs
// only the layout and the batch from it. A missing or odd field leaves the default.
void readConfigSummary(const json& config, RunStartEvent& e) {
  auto intAt = [&](const char* section, const char* key, int fallback) {
    auto s = config.find(section);
    if (s == config.end() || !s->is_object()) return fallback;
    auto v = s->find(key);
    if (v == s->end() || !v->is_number_integer()) return fallback;
    const std::int64_t x = v->get<std::int64_t>();
    return x >= 1 && x <= (1 << 24) ? static_cast<int>(x) : fallback;
  };
  e.dp = intAt("parallel", "dp", 1);
  e.tp = intAt("parallel", "tp", 1);
  e.pp = intAt("parallel", "pp", 1);
  e.cp = intAt("parallel", "cp", 1);
  e.batchSize = intAt("training", "batch_size", 0);
  auto model = config.find("model");
  if (model != config.end() && model->is_object()) {
    auto type = model->find("type");
    if (type != model->end() && type->is_string())
      e.modelType = QString::fromStdString(type->get<std::string>());
  }
}

constexpr std::int64_t kMaxRank = 1 << 24;

RunStartEvent readRunStart(Fields& f) {
  RunStartEvent e;
  e.name = f.string(key::kName);
  // "device": {"kind", "name", ...} since the GPU backend; a plain string before.
  if (const json* d = f.raw(key::kDevice); d && d->is_object())
    e.device = f.nested(*d, key::kDevice).string(key::kName);
  else
    e.device = f.string(key::kDevice);
  e.runDir = f.string(key::kRunDir);
  e.resumedFrom = f.string(key::kResumedFrom);
  e.ranks = static_cast<int>(f.integer(key::kRanks, false, 0, 0, kMaxRank));
  e.steps = f.integer(key::kSteps, false, 0, 0);
  e.startStep = f.integer(key::kStartStep, false, 0, 0);
  e.params = f.integer(key::kParams, false, 0, 0);
  if (const json* layers = f.array(key::kLayers)) {
    for (std::size_t i = 0; i < layers->size() && !f.failed(); ++i) {
      const json& l = (*layers)[i];
      if (!f.requireObject(l, key::kLayers, i)) break;
      e.layers << f.nested(l, key::kLayers, i).string(key::kName);
    }
  }
  if (const json* config = f.object(key::kConfig)) readConfigSummary(*config, e);
  e.psServers = static_cast<int>(f.integer(key::kPsServers, false, 0, 0, kMaxRank));
  e.psWorkers = static_cast<int>(f.integer(key::kPsWorkers, false, 0, 0, kMaxRank));
  e.consistency = f.string(key::kConsistency);
  if (const json* predicted = f.object(key::kPredicted)) {
    Fields p = f.nested(*predicted, key::kPredicted);
    e.predictedStepTime = p.number(key::kStepTimeS);
    e.predictedTokensPerS = p.number(key::kTokensPerS);
    e.predictedMfu = p.number(key::kMfu);
    e.predictedMeanStaleness = p.number(key::kPsMeanStaleness);
    if (const json* ranks = p.array(key::kRanks)) {
      for (std::size_t i = 0; i < ranks->size() && !f.failed(); ++i) {
        const json& r = (*ranks)[i];
        if (!p.requireObject(r, key::kRanks, i)) break;
        Fields rf = p.nested(r, key::kRanks, i);
        PredictedRank pr;
        pr.rank = static_cast<int>(rf.integer(key::kRank, true, 0, 0, kMaxRank));
        pr.stage = static_cast<int>(rf.integer(key::kStage, false, -1, -1, kMaxRank));
        pr.bubbleFraction = rf.number(key::kBubbleFraction);
        if (const json* m = rf.object(key::kMemoryBytes))
          pr.memory = readMemory(rf.nested(*m, key::kMemoryBytes));
        e.predictedRanks.push_back(pr);
      }
    }
  }
  return e;
}

StepEvent readStep(Fields& f) {
  StepEvent e;
  e.step = f.integer(key::kStep, true, 0, 0);
  e.t = f.number(key::kT);
  e.loss = f.number(key::kLoss, true);
  e.lr = f.number(key::kLr);
  e.gradNorm = f.number(key::kGradNorm);
  e.stepTime = f.number(key::kStepTimeS);
  e.tokensPerS = f.number(key::kTokensPerS);
  e.samplesPerS = f.number(key::kSamplesPerS);
  e.accuracy = f.number(key::kAccuracy);
  e.auxLoss = f.number(key::kAuxLoss);
  return e;
}

SpansEvent readSpans(Fields& f) {
  SpansEvent e;
  e.step = f.integer(key::kStep, true, 0, 0);
  const json* ranks = f.array(key::kRanks, true);
  if (!ranks) return e;
  e.ranks.reserve(ranks->size());
  for (std::size_t i = 0; i < ranks->size() && !f.failed(); ++i) {
    const json& r = (*ranks)[i];
    if (!f.requireObject(r, key::kRanks, i)) break;
    Fields rf = f.nested(r, key::kRanks, i);
    RankSpans rs;
    rs.rank = static_cast<int>(rf.integer(key::kRank, true, 0, 0, kMaxRank));
    if (const std::string* lane = rf.rawString(key::kPsLane)) rs.lane = *lane;
    const json* spans = rf.array(key::kSpans, true);
    if (!spans) break;
    rs.spans.reserve(spans->size());
    for (std::size_t k = 0; k < spans->size() && !f.failed(); ++k) {
      const json& s = (*spans)[k];
      if (!rf.requireObject(s, key::kSpans, k)) break;
      Fields sf = rf.nested(s, key::kSpans, k);
      MeasuredSpan m;
      m.action = sf.letter(key::kAction, true);
      if (const std::string* layer = sf.rawString(key::kLayer)) m.layer = *layer;
      m.microbatch = static_cast<std::int16_t>(sf.integer(key::kMicrobatch, false, -1, -1, INT16_MAX));
      m.chunk = static_cast<std::int16_t>(sf.integer(key::kChunk, false, -1, -1, INT16_MAX));
      m.start = sf.number(key::kStart, true);
      m.end = sf.number(key::kEnd, true);
      rs.spans.push_back(std::move(m));
    }
    e.ranks.push_back(std::move(rs));
  }
  return e;
}

MemoryEvent readMemoryLine(Fields& f) {
  MemoryEvent e;
  e.step = f.integer(key::kStep, true, 0, 0);
  const json* ranks = f.array(key::kRanks, true);
  if (!ranks) return e;
  for (std::size_t i = 0; i < ranks->size() && !f.failed(); ++i) {
    const json& r = (*ranks)[i];
    if (!f.requireObject(r, key::kRanks, i)) break;
    Fields rf = f.nested(r, key::kRanks, i);
    RankMemory m;
    m.rank = static_cast<int>(rf.integer(key::kRank, true, 0, 0, kMaxRank));
    if (const json* c = rf.object(key::kCurrent)) m.current = readMemory(rf.nested(*c, key::kCurrent));
    if (const json* p = rf.object(key::kPeak)) m.peak = readMemory(rf.nested(*p, key::kPeak));
    e.ranks.push_back(m);
  }
  return e;
}

EvalEvent readEval(Fields& f) {
  EvalEvent e;
  e.step = f.integer(key::kStep, true, 0, 0);
  e.loss = f.number(key::kLoss, true);
  e.samples = f.integer(key::kSamples, false, 0, 0);
  e.accuracy = f.number(key::kAccuracy);
  e.timeS = f.number(key::kTimeS);
  return e;
}

PsEvent readPs(Fields& f) {
  PsEvent e;
  e.step = f.integer(key::kStep, true, 0, 0);
  e.version = f.integer(key::kPsVersion, false, 0, 0);
  e.staleness = f.counts(key::kPsStaleness);
  e.stalenessTotal = f.counts(key::kPsStalenessTotal);
  e.discarded = f.integer(key::kPsDiscarded, false, 0, 0);
  if (const json* final = f.raw(key::kPsFinal); final && final->is_boolean()) e.final = final->get<bool>();
  if (const json* workers = f.array(key::kPsWorkerStates)) {
    for (std::size_t i = 0; i < workers->size() && !f.failed(); ++i) {
      const json& w = (*workers)[i];
      if (!f.requireObject(w, key::kPsWorkerStates, i)) break;
      Fields wf = f.nested(w, key::kPsWorkerStates, i);
      PsWorkerState st;
      st.worker = static_cast<int>(wf.integer(key::kPsWorker, true, 0, 0, kMaxRank));
      if (const json* live = wf.raw(key::kPsLive); live && live->is_boolean()) st.live = live->get<bool>();
      st.steps = wf.integer(key::kSteps, false, 0, 0);
      st.samplesPerS = wf.number(key::kSamplesPerS);
      st.stepTime = wf.number(key::kStepTimeS);
      e.workers.push_back(st);
    }
  }
  return e;
}

// "line N: reason: first 80 characters".
QString lineError(std::int64_t lineNumber, const std::string& reason, QByteArrayView line) {
  // Decode a little more than 80 bytes so that 80 characters survive multi-byte UTF-8.
  QString head = QString::fromUtf8(line.first(std::min<qsizetype>(line.size(), 320)));
  const bool cut = head.size() > 80 || line.size() > 320;
  head.truncate(80);
  return QStringLiteral("line %1: %2: %3%4")
      .arg(lineNumber)
      .arg(QString::fromStdString(reason), head, cut ? QStringLiteral("…") : QString());
}

// nlohmann's parse_error::what() is "[json.exception.parse_error.101] parse error at line 1, column 5: syntax
// error while parsing value - invalid literal; last read: 'n'"; a person needs the part after the position.
std::string describeParseError(const nlohmann::json::parse_error& e) {
  const std::string what = e.what();
  const std::string marker = "syntax error while parsing value - ";
  std::size_t at = what.find(marker);
  std::string detail = at != std::string::npos ? what.substr(at + marker.size()) : what;
  if (auto semicolon = detail.find("; last read"); semicolon != std::string::npos) detail.resize(semicolon);
  return "not JSON (byte " + std::to_string(e.byte) + ": " + detail + ")";
}

bool isBlank(QByteArrayView line) {
  for (char c : line)
    if (c != ' ' && c != '\t' && c != '\r') return false;
  return true;
}

}  // namespace

std::vector<MetricsEvent> MetricsReader::parseLine(QByteArrayView line, std::int64_t lineNumber) {
  std::vector<MetricsEvent> out;
  if (!line.isEmpty() && line.back() == '\r') line.chop(1);
  if (isBlank(line)) return out;
  auto error = [&](const std::string& reason) {
    ++m_errors;
    out.push_back(MetricsError{lineNumber, lineError(lineNumber, reason, line)});
    return out;
  };
  json j;
  try {
    j = json::parse(line.begin(), line.end());
  } catch (const json::parse_error& e) {
    return error(describeParseError(e));
  } catch (const std::exception& e) {
    return error(std::string("not JSON (") + e.what() + ")");
  }
  if (!j.is_object()) return error(std::string("not a JSON object (a ") + j.type_name() + ")");
  std::string problem;
  Fields f(j, &problem);
  const std::int64_t version = f.integer(key::kVersion, true, 0, 1);
  const std::string* typePtr = f.rawString(key::kType, true);
  if (f.failed()) return error(problem);
  const std::string& type = *typePtr;
  if (version > metrics::kVersion && !m_warnedVersion) {
    m_warnedVersion = true;
    out.push_back(
        LogEvent{QStringLiteral("warning"),
                 QStringLiteral("line %1: the metrics stream is version %2, newer than this studio's %3; "
                                "what it does not know is ignored")
                     .arg(lineNumber)
                     .arg(version)
                     .arg(metrics::kVersion)});
  }
  MetricsEvent event;
  if (type == metrics::type::kStep) {
    event = readStep(f);
  } else if (type == metrics::type::kSpans) {
    event = readSpans(f);
  } else if (type == metrics::type::kMemory) {
    event = readMemoryLine(f);
  } else if (type == metrics::type::kRunStart) {
    event = readRunStart(f);
  } else if (type == metrics::type::kEval) {
    event = readEval(f);
  } else if (type == metrics::type::kPs) {
    event = readPs(f);
  } else if (type == metrics::type::kCheckpoint) {
    CheckpointEvent e;
    e.step = f.integer(key::kStep, true, 0, 0);
    e.path = f.string(key::kPath);
    event = std::move(e);
  } else if (type == metrics::type::kLog) {
    LogEvent e;
    e.level = f.string(key::kLevel);
    if (e.level.isEmpty()) e.level = QStringLiteral("info");
    e.message = f.string(key::kMessage, true);
    event = std::move(e);
  } else if (type == metrics::type::kRunEnd) {
    RunEndEvent e;
    e.status = f.string(key::kStatus, true);
    e.reason = f.string(key::kReason);
    e.step = f.integer(key::kStep, false, 0, 0);
    event = std::move(e);
  } else {
    return out;  // a type this studio does not know: ignored, as the protocol asks
  }
  if (!problem.empty()) return error(problem);
  out.push_back(std::move(event));
  return out;
}

void MetricsReader::takeLine(QByteArrayView line, std::vector<MetricsEvent>& out) {
  ++m_lines;
  for (MetricsEvent& e : parseLine(line, m_lines)) out.push_back(std::move(e));
}

std::vector<MetricsEvent> MetricsReader::feed(QByteArrayView bytes) {
  std::vector<MetricsEvent> out;
  m_bytes += bytes.size();
  // A line over the limit is reported and skipped, whether it ends in this piece or not.
  auto overLong = [&](QByteArrayView start) {
    ++m_lines;
    ++m_errors;
    out.push_back(MetricsError{
        m_lines, lineError(m_lines, "line longer than " + std::to_string(m_maxLineBytes) + " bytes, skipped",
                           m_tail.isEmpty() ? start : QByteArrayView(m_tail))});
  };
  while (!bytes.isEmpty()) {
    const qsizetype nl = bytes.indexOf('\n');
    if (nl < 0) {
      if (m_skipping) return out;
      if (static_cast<std::size_t>(m_tail.size() + bytes.size()) > m_maxLineBytes) {
        overLong(bytes);
        m_tail.clear();
        m_tail.squeeze();
        m_skipping = true;
        return out;
      }
      m_tail.append(bytes.data(), bytes.size());
      return out;
    }
    const QByteArrayView head = bytes.first(nl);
    bytes = bytes.sliced(nl + 1);
    if (m_skipping) {
      m_skipping = false;  // the over-long line ends here; it was counted and reported already
      continue;
    }
    if (static_cast<std::size_t>(m_tail.size() + head.size()) > m_maxLineBytes) {
      overLong(head);
      m_tail.clear();
      continue;
    }
    if (m_tail.isEmpty()) {
      takeLine(head, out);  // the common case: the whole line is in this piece, no copy
    } else {
      m_tail.append(head.data(), head.size());
      takeLine(m_tail, out);
      // Keep the buffer for the next long line unless it has grown large.
      if (m_tail.capacity() > (4 << 20))
        m_tail.clear();
      else
        m_tail.resize(0);
    }
  }
  return out;
}

std::vector<MetricsEvent> MetricsReader::finish() {
  std::vector<MetricsEvent> out;
  if (m_skipping) {
    m_skipping = false;
    return out;
  }
  if (m_tail.isEmpty() || isBlank(m_tail)) {
    m_tail.clear();
    return out;
  }
  const std::int64_t lineNumber = ++m_lines;
  QByteArray tail;
  tail.swap(m_tail);
  // A whole object without its newline (a hand-written file) is read; anything else was cut off.
  bool whole = false;
  try {
    whole = json::parse(tail.begin(), tail.end()).is_object();
  } catch (const std::exception&) {
    whole = false;
  }
  if (whole) return parseLine(tail, lineNumber);
  ++m_errors;
  out.push_back(
      MetricsError{lineNumber, lineError(lineNumber, "truncated (the stream ended inside this line)", tail)});
  return out;
}

const char* eventTypeName(const MetricsEvent& event) {
  static constexpr const char* kNames[] = {metrics::type::kRunStart, metrics::type::kStep,
                                           metrics::type::kSpans,    metrics::type::kMemory,
                                           metrics::type::kEval,     metrics::type::kCheckpoint,
                                           metrics::type::kLog,      metrics::type::kRunEnd,
                                           metrics::type::kPs,       "error"};
  return kNames[event.index()];
}

}  // namespace ms
