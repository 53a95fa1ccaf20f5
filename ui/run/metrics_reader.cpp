// MetricsReader; see metrics_reader.h.
#include "ui/run/metrics_reader.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <exception>

namespace ms {

namespace {

using nlohmann::json;

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
  m.parameters = f.number("parameters");
  m.gradients = f.number("gradients");
  m.optimizer = f.number("optimizer");
  m.activations = f.number("activations");
  m.communication = f.number("communication");
  m.workspace = f.number("workspace");
  m.other = f.number("other");
  m.total = f.number("total");
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
  e.name = f.string("name");
  // "device": {"kind", "name", ...} since the GPU backend; a plain string before.
  if (const json* d = f.raw("device"); d && d->is_object())
    e.device = f.nested(*d, "device").string("name");
  else
    e.device = f.string("device");
  e.runDir = f.string("run_dir");
  e.resumedFrom = f.string("resumed_from");
  e.ranks = static_cast<int>(f.integer("ranks", false, 0, 0, kMaxRank));
  e.steps = f.integer("steps", false, 0, 0);
  e.startStep = f.integer("start_step", false, 0, 0);
  e.params = f.integer("params", false, 0, 0);
  if (const json* layers = f.array("layers")) {
    for (std::size_t i = 0; i < layers->size() && !f.failed(); ++i) {
      const json& l = (*layers)[i];
      if (!f.requireObject(l, "layers", i)) break;
      e.layers << f.nested(l, "layers", i).string("name");
    }
  }
  if (const json* config = f.object("config")) readConfigSummary(*config, e);
  if (const json* predicted = f.object("predicted")) {
    Fields p = f.nested(*predicted, "predicted");
    e.predictedStepTime = p.number("step_time_s");
    e.predictedTokensPerS = p.number("tokens_per_s");
    e.predictedMfu = p.number("mfu");
    if (const json* ranks = p.array("ranks")) {
      for (std::size_t i = 0; i < ranks->size() && !f.failed(); ++i) {
        const json& r = (*ranks)[i];
        if (!p.requireObject(r, "ranks", i)) break;
        Fields rf = p.nested(r, "ranks", i);
        PredictedRank pr;
        pr.rank = static_cast<int>(rf.integer("rank", true, 0, 0, kMaxRank));
        pr.stage = static_cast<int>(rf.integer("stage", false, -1, -1, kMaxRank));
        pr.bubbleFraction = rf.number("bubble_fraction");
        if (const json* m = rf.object("memory_bytes")) pr.memory = readMemory(rf.nested(*m, "memory_bytes"));
        e.predictedRanks.push_back(pr);
      }
    }
  }
  return e;
}

StepEvent readStep(Fields& f) {
  StepEvent e;
  e.step = f.integer("step", true, 0, 0);
  e.loss = f.number("loss", true);
  e.lr = f.number("lr");
  e.gradNorm = f.number("grad_norm");
  e.stepTime = f.number("step_time_s");
  e.tokensPerS = f.number("tokens_per_s");
  e.samplesPerS = f.number("samples_per_s");
  e.accuracy = f.number("accuracy");
  return e;
}

SpansEvent readSpans(Fields& f) {
  SpansEvent e;
  e.step = f.integer("step", true, 0, 0);
  const json* ranks = f.array("ranks", true);
  if (!ranks) return e;
  e.ranks.reserve(ranks->size());
  for (std::size_t i = 0; i < ranks->size() && !f.failed(); ++i) {
    const json& r = (*ranks)[i];
    if (!f.requireObject(r, "ranks", i)) break;
    Fields rf = f.nested(r, "ranks", i);
    RankSpans rs;
    rs.rank = static_cast<int>(rf.integer("rank", true, 0, 0, kMaxRank));
    const json* spans = rf.array("spans", true);
    if (!spans) break;
    rs.spans.reserve(spans->size());
    for (std::size_t k = 0; k < spans->size() && !f.failed(); ++k) {
      const json& s = (*spans)[k];
      if (!rf.requireObject(s, "spans", k)) break;
      Fields sf = rf.nested(s, "spans", k);
      MeasuredSpan m;
      m.action = sf.letter("action", true);
      if (const std::string* layer = sf.rawString("layer")) m.layer = *layer;
      m.microbatch = static_cast<std::int16_t>(sf.integer("mb", false, -1, -1, INT16_MAX));
      m.chunk = static_cast<std::int16_t>(sf.integer("chunk", false, -1, -1, INT16_MAX));
      m.start = sf.number("start", true);
      m.end = sf.number("end", true);
      rs.spans.push_back(std::move(m));
    }
    e.ranks.push_back(std::move(rs));
  }
  return e;
}

MemoryEvent readMemoryLine(Fields& f) {
  MemoryEvent e;
  e.step = f.integer("step", true, 0, 0);
  const json* ranks = f.array("ranks", true);
  if (!ranks) return e;
  for (std::size_t i = 0; i < ranks->size() && !f.failed(); ++i) {
    const json& r = (*ranks)[i];
    if (!f.requireObject(r, "ranks", i)) break;
    Fields rf = f.nested(r, "ranks", i);
    RankMemory m;
    m.rank = static_cast<int>(rf.integer("rank", true, 0, 0, kMaxRank));
    if (const json* c = rf.object("current")) m.current = readMemory(rf.nested(*c, "current"));
    if (const json* p = rf.object("peak")) m.peak = readMemory(rf.nested(*p, "peak"));
    e.ranks.push_back(m);
  }
  return e;
}

EvalEvent readEval(Fields& f) {
  EvalEvent e;
  e.step = f.integer("step", true, 0, 0);
  e.loss = f.number("loss", true);
  e.samples = f.integer("samples", false, 0, 0);
  e.accuracy = f.number("accuracy");
  e.timeS = f.number("time_s");
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
  const std::int64_t version = f.integer("v", true, 0, 1);
  const std::string* typePtr = f.rawString("type", true);
  if (f.failed()) return error(problem);
  const std::string& type = *typePtr;
  if (version > kKnownMetricsVersion && !m_warnedVersion) {
    m_warnedVersion = true;
    out.push_back(
        LogEvent{QStringLiteral("warning"),
                 QStringLiteral("line %1: the metrics stream is version %2, newer than this studio's %3; "
                                "what it does not know is ignored")
                     .arg(lineNumber)
                     .arg(version)
                     .arg(kKnownMetricsVersion)});
  }
  MetricsEvent event;
  if (type == "step") {
    event = readStep(f);
  } else if (type == "spans") {
    event = readSpans(f);
  } else if (type == "memory") {
    event = readMemoryLine(f);
  } else if (type == "run_start") {
    event = readRunStart(f);
  } else if (type == "eval") {
    event = readEval(f);
  } else if (type == "checkpoint") {
    CheckpointEvent e;
    e.step = f.integer("step", true, 0, 0);
    e.path = f.string("path");
    event = std::move(e);
  } else if (type == "log") {
    LogEvent e;
    e.level = f.string("level");
    if (e.level.isEmpty()) e.level = QStringLiteral("info");
    e.message = f.string("message", true);
    event = std::move(e);
  } else if (type == "run_end") {
    RunEndEvent e;
    e.status = f.string("status", true);
    e.reason = f.string("reason");
    e.step = f.integer("step", false, 0, 0);
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
  static constexpr const char* kNames[] = {"run_start",  "step", "spans",   "memory", "eval",
                                           "checkpoint", "log",  "run_end", "error"};
  return kNames[event.index()];
}

}  // namespace ms
