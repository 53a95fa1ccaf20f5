// Reading and writing the run config: the JSON walk of parseRunConfig(), loadRunConfig() with file, line and
// column in its errors, toJson() and the atomic saveRunConfig(). Keys, types and ranges come from the field
// table (config_schema.cpp); the typed checks are validateRunConfig() (config_checks.cpp).
//
// What always holds: parsing never stops at the first problem, every error carries the JSON pointer of the
// value to fix, and nothing here throws: nlohmann exceptions are caught and turned into ConfigErrors.
// toJson() writes only the fields that apply to the model type and data kind, so parse(toJson(c)) == c
// holds for every config that came out of parseRunConfig().
#include "plan/run_config.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>

#include "plan/config_schema.h"
#include "plan/device_profile.h"

namespace ms {

int64_t llamaFfnHidden(int64_t width) {
  const int64_t multiple = 256, hidden = 2 * (4 * width) / 3;
  return (hidden + multiple - 1) / multiple * multiple;
}

int64_t ModelConfig::mlpHidden() const {
  if (type == ModelType::Llama) return ffnHidden > 0 ? ffnHidden : llamaFfnHidden(width);
  return int64_t(mlpRatio) * width;
}

const char* toString(ModelType v) {
  return enumName(kModelTypeNames, v);
}
const char* toString(BatchNormMode v) {
  return enumName(kBatchNormModeNames, v);
}
const char* toString(ParallelMode v) {
  return enumName(kParallelModeNames, v);
}
const char* toString(Consistency v) {
  return enumName(kConsistencyNames, v);
}
const char* toString(Activation v) {
  return enumName(kActivationNames, v);
}
const char* toString(Pooling v) {
  return enumName(kPoolingNames, v);
}
const char* toString(DataKind v) {
  return enumName(kDataKindNames, v);
}
const char* toString(Schedule v) {
  return enumName(kScheduleNames, v);
}
const char* toString(Recompute v) {
  return enumName(kRecomputeNames, v);
}
const char* toString(Precision v) {
  return enumName(kPrecisionNames, v);
}
const char* toString(GradPrecision v) {
  return enumName(kGradPrecisionNames, v);
}
const char* toString(Offload v) {
  return enumName(kOffloadNames, v);
}
const char* toString(OptimizerType v) {
  return enumName(kOptimizerTypeNames, v);
}
const char* toString(LrSchedule v) {
  return enumName(kLrScheduleNames, v);
}
const char* toString(DeviceChoice v) {
  return enumName(kDeviceChoiceNames, v);
}

std::string RunConfig::resolvePath(const std::string& path) const {
  if (path.empty() || baseDir.empty() || std::filesystem::path(path).is_absolute()) return path;
  return (std::filesystem::path(baseDir) / path).lexically_normal().string();
}

namespace {

// One error a line: a control character a message quotes from the config (a name or key holding "\n", found
// by fuzz_config) is written as its JSON escape.
std::string oneLine(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      out += c;
      continue;
    }
    char escaped[8];
    std::snprintf(escaped, sizeof escaped, "\\u%04x", u);
    out += escaped;
  }
  return out;
}

}  // namespace

std::string formatConfigErrors(const ConfigErrors& errors, const std::string& file) {
  std::string out;
  for (const auto& e : errors) {
    if (!out.empty()) out += '\n';
    out += oneLine(file + ": " + (e.path.empty() ? "" : e.path + ": ") + e.message);
  }
  return out;
}

namespace {

using json = nlohmann::json;

std::string inQuotes(const std::string& s) {
  return "\"" + s + "\"";
}

// "string \"abc\"", "3.5", "boolean true", "array", "object", "null".
std::string describeValue(const json& v) {
  switch (v.type()) {
    case json::value_t::string: {
      std::string s = v.get<std::string>();
      if (s.size() > 40) s = s.substr(0, 37) + "...";
      return "string " + inQuotes(s);
    }
    case json::value_t::boolean:
      return std::string("boolean ") + (v.get<bool>() ? "true" : "false");
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return v.dump();
    default:
      return v.type_name();
  }
}

const char* expectedText(FieldKind kind) {
  switch (kind) {
    case FieldKind::Object:
      return "an object";
    case FieldKind::ObjectList:
      return "an array of objects";
    case FieldKind::Integer:
      return "an integer";
    case FieldKind::Unsigned:
      return "a non-negative integer";
    case FieldKind::Number:
      return "a number";
    case FieldKind::Boolean:
      return "a boolean";
    case FieldKind::String:
    case FieldKind::Enum:
      return "a string";
    case FieldKind::StringList:
      return "a string or an array of strings";
    case FieldKind::StringArray:
      return "an array of strings";
    case FieldKind::IntList:
      return "an array of integers";
    case FieldKind::NumberPair:
      return "an array of two numbers";
  }
  return "a value";
}

// The JSON walk of one document: types, integrality, enum names, unknown keys, required keys and fields
// that do not apply to the model type or data kind. Values that pass are written into the config.
class ConfigReader {
 public:
  ConfigReader(RunConfig& config, ConfigErrors& errors) : m_config(config), m_errors(errors) {}

  void read(const json& doc) {
    m_model = knownEnum(doc, "model", "type", kModelTypeNames);
    m_data = knownEnum(doc, "data", "kind", kDataKindNames);
    readObject("", "", doc, 0);
  }

 private:
  template <typename E, size_t N>
  static std::optional<E> knownEnum(const json& doc, const char* section, const char* key,
                                    const EnumName<E> (&names)[N]) {
    const auto s = doc.find(section);
    if (s == doc.end() || !s->is_object()) return std::nullopt;
    const auto v = s->find(key);
    if (v == s->end() || !v->is_string()) return std::nullopt;
    for (const auto& n : names)
      if (*v == n.name) return n.value;
    return std::nullopt;
  }

  void error(std::string path, std::string message) {
    m_errors.push_back(ConfigError{std::move(path), std::move(message)});
  }
  void typeError(const std::string& path, FieldKind kind, const json& v) {
    error(path, std::string("expected ") + expectedText(kind) + ", got " + describeValue(v));
  }

  bool applies(const Field& f) const {
    return (!m_model || (f.models & modelBit(*m_model))) && (!m_data || (f.dataKinds & dataBit(*m_data)));
  }

  // tableParent names the rows ("/mesh/nodes/*"), at the value's pointer ("/mesh/nodes/1").
  void readObject(const std::string& tableParent, const std::string& at, const json& obj, size_t item) {
    for (const auto& [key, value] : obj.items()) {
      const std::string path = at + "/" + escapePointer(key);
      const Field* f = findField(m_fields, tableParent, key);
      if (!f) {
        error(path, unknownKeyMessage(tableParent, key));
      } else if (!applies(*f)) {
        if (!(f->models & modelBit(*m_model)))
          error(path, inQuotes(key) + " is not used by model type " + inQuotes(toString(*m_model)));
        else
          error(path, inQuotes(key) + " is not used by data kind " + inQuotes(toString(*m_data)));
      } else {
        readValue(*f, path, value, item);
      }
    }
    for (const Field* f : childFields(m_fields, tableParent))
      if (f->required && !obj.contains(f->key))
        error(at + "/" + f->key, "missing required key " + inQuotes(f->key));
  }

  std::string unknownKeyMessage(const std::string& tableParent, const std::string& key) const {
    std::vector<std::string> names;
    std::vector<const Field*> owners;
    for (const Field* f : childFields(m_fields, tableParent)) {
      if (!applies(*f)) continue;
      names.push_back(f->key);
      owners.push_back(f);
      for (const auto& alias : f->aliases) {
        names.push_back(alias);
        owners.push_back(f);
      }
    }
    const std::string message = "unknown key " + inQuotes(key);
    const int close = closestIndex(key, names);
    if (close >= 0)
      return message + "; did you mean " + inQuotes(owners[static_cast<size_t>(close)]->key) + "?";
    // A key of another section, or one of its aliases, written in the wrong place: "lr" under "training".
    for (const auto& f : m_fields) {
      if (f.parent == tableParent || f.parent.find('*') != std::string::npos || f.isContainer()) continue;
      std::vector<std::string> spellings = f.aliases;
      spellings.push_back(f.key);
      for (const auto& s : spellings)
        if (s == key) return message + "; did you mean " + inQuotes(f.path()) + "?";
    }
    return message;
  }

  // An integer that fits [lo, hi]; JSON numbers like 4.0 count, 3.5 does not.
  std::optional<int64_t> integer(const std::string& path, FieldKind kind, const json& v, int64_t lo,
                                 int64_t hi) {
    double d = 0;
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u <= uint64_t(hi)) return int64_t(u);
      d = double(u);
    } else if (v.is_number_integer()) {
      const int64_t i = v.get<int64_t>();
      if (i >= lo && i <= hi) return i;
      d = double(i);
    } else if (v.is_number_float()) {
      d = v.get<double>();
      if (!std::isfinite(d) || std::floor(d) != d) {
        typeError(path, kind, v);
        return std::nullopt;
      }
      if (d >= double(lo) && d <= double(hi)) return int64_t(d);
    } else {
      typeError(path, kind, v);
      return std::nullopt;
    }
    if (d < 0 && lo == 0)
      typeError(path, kind, v);
    else
      error(path, "integer " + v.dump() + " is out of range (" + std::to_string(lo) + " .. " +
                      std::to_string(hi) + ")");
    return std::nullopt;
  }

  std::optional<json> integerValue(const std::string& path, const json& v) {
    const auto i = integer(path, FieldKind::Integer, v, std::numeric_limits<int>::min(),
                           std::numeric_limits<int>::max());
    return i ? std::optional<json>(json(*i)) : std::nullopt;
  }

  // The value checked and normalised for its kind (a lone string becomes a list), or nullopt after an error.
  std::optional<json> checked(const Field& f, const std::string& path, const json& v) {
    switch (f.kind) {
      case FieldKind::Integer:
        return integerValue(path, v);
      case FieldKind::Unsigned: {
        if (v.is_number_unsigned()) return v;
        if (v.is_number_float() && v.get<double>() >= 18446744073709551616.0) {
          error(path, "integer " + v.dump() + " is out of range (0 .. 18446744073709551615)");
          return std::nullopt;
        }
        const auto i = integer(path, f.kind, v, 0, std::numeric_limits<int64_t>::max());
        return i ? std::optional<json>(json(uint64_t(*i))) : std::nullopt;
      }
      case FieldKind::Number:
        if (v.is_number()) return json(v.get<double>());
        break;
      case FieldKind::Boolean:
        if (v.is_boolean()) return v;
        break;
      case FieldKind::String:
        if (v.is_string()) return v;
        break;
      case FieldKind::Enum:
        if (!v.is_string()) break;
        if (std::find(f.allowed.begin(), f.allowed.end(), v.get<std::string>()) != f.allowed.end()) return v;
        error(path, notOneOfMessage(v.get<std::string>(), f.allowed));
        return std::nullopt;
      case FieldKind::StringList:
        if (v.is_string()) return json::array({v});
        [[fallthrough]];
      case FieldKind::StringArray:
      case FieldKind::IntList:
      case FieldKind::NumberPair:
        if (v.is_array()) return checkedArray(f, path, v);
        break;
      case FieldKind::Object:
      case FieldKind::ObjectList:
        break;
    }
    typeError(path, f.kind, v);
    return std::nullopt;
  }

  std::optional<json> checkedArray(const Field& f, const std::string& path, const json& v) {
    if (f.kind == FieldKind::NumberPair && v.size() != 2) {
      error(path, "expected an array of two numbers, got " + std::to_string(v.size()) +
                      (v.size() == 1 ? " entry" : " entries"));
      return std::nullopt;
    }
    json out = json::array();
    bool ok = true;
    for (size_t j = 0; j < v.size(); ++j) {
      const std::string itemPath = path + "/" + std::to_string(j);
      const json& e = v[j];
      if (f.kind == FieldKind::IntList) {
        const auto i = integerValue(itemPath, e);
        if (i) out.push_back(*i);
        ok = ok && i.has_value();
      } else if (f.kind == FieldKind::NumberPair ? e.is_number() : e.is_string()) {
        out.push_back(f.kind == FieldKind::NumberPair ? json(e.get<double>()) : e);
      } else {
        error(itemPath, std::string("expected ") +
                            (f.kind == FieldKind::NumberPair ? "a number" : "a string") + ", got " +
                            describeValue(e));
        ok = false;
      }
    }
    return ok ? std::optional<json>(std::move(out)) : std::nullopt;
  }

  void readValue(const Field& f, const std::string& path, const json& v, size_t item) {
    if (f.kind == FieldKind::Object) {
      if (v.is_object())
        readObject(f.path(), path, v, 0);
      else
        typeError(path, f.kind, v);
    } else if (f.kind == FieldKind::ObjectList) {
      if (!v.is_array()) {
        typeError(path, f.kind, v);
        return;
      }
      f.resize(m_config, 0);
      f.resize(m_config, v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        const std::string itemPath = path + "/" + std::to_string(i);
        if (v[i].is_object())
          readObject(f.itemParent(), itemPath, v[i], i);
        else
          error(itemPath, "expected an object, got " + describeValue(v[i]));
      }
    } else if (const auto value = checked(f, path, v)) {
      f.set(m_config, item, *value);
    }
  }

  const std::vector<Field> m_fields = runConfigFields();
  RunConfig& m_config;
  ConfigErrors& m_errors;
  std::optional<ModelType> m_model;  // known when /model/type is valid; applicability is checked only then
  std::optional<DataKind> m_data;
};

// Whether one JSON pointer is the other or lies inside it.
bool overlaps(const std::string& a, const std::string& b) {
  const auto inside = [](const std::string& x, const std::string& y) {
    return x.size() > y.size() && x.compare(0, y.size(), y) == 0 && x[y.size()] == '/';
  };
  return a == b || inside(a, b) || inside(b, a);
}

// "line L, column C" of a parse error. nlohmann reports the count of bytes read, so the offending byte is
// byte - 1; when the unexpected token is a string or number literal that is its last byte, and the start of
// the token is where a person looks (the missing comma goes just before it).
std::string errorPosition(const std::string& text, size_t byte, const std::string& reason) {
  size_t index = std::min(byte > 0 ? byte - 1 : 0, text.size());
  if (reason.find("unexpected string literal") != std::string::npos && index < text.size() &&
      text[index] == '"') {
    size_t open = index;
    while (open > 0) {
      --open;
      size_t backslashes = 0;
      while (open >= backslashes + 1 && text[open - backslashes - 1] == '\\') ++backslashes;
      if (text[open] == '"' && backslashes % 2 == 0) break;
    }
    index = open;
  } else if (reason.find("unexpected number literal") != std::string::npos) {
    while (index > 0 && std::strchr("0123456789+-.eE", text[index - 1]) != nullptr) --index;
  }
  size_t line = 1, lineStart = 0;
  for (size_t i = 0; i < index; ++i)
    if (text[i] == '\n') ++line, lineStart = i + 1;
  return "line " + std::to_string(line) + ", column " + std::to_string(index - lineStart + 1);
}

// nlohmann's reason without its "[json.exception.parse_error.101] parse error at line 1, column 2: " prefix.
std::string parseReason(const std::string& what) {
  const size_t at = what.find("parse error");
  const size_t colon = at == std::string::npos ? std::string::npos : what.find(": ", at);
  return colon == std::string::npos ? what : what.substr(colon + 2);
}

// A run config nests a few levels (its deepest fields are 4 below the top); a document nested deeper than
// this is refused as soon as the parse gets there, and one larger than kMaxConfigBytes before it starts, so
// reading costs memory linear in the file (the parse keeps one small frame per open level and builds a
// path only to report one).
constexpr size_t kMaxConfigDepth = 64;
constexpr size_t kMaxConfigBytes = size_t(64) << 20;
struct TooDeep {
  std::string path;
};

// Parses text, recording keys that appear twice in one object (nlohmann silently keeps the last one).
json parseDocument(const std::string& text, ConfigErrors& duplicates) {
  struct Frame {
    bool isObject;
    std::set<std::string> keys;
    std::string key;
    size_t index = 0;
  };
  std::vector<Frame> stack;
  // The JSON pointer of the value being read: each open level's key or index.
  const auto childPath = [&stack]() -> std::string {
    std::string path;
    for (const Frame& f : stack) path += "/" + (f.isObject ? escapePointer(f.key) : std::to_string(f.index));
    return path;
  };
  const auto elementDone = [&stack]() {
    if (!stack.empty() && !stack.back().isObject) ++stack.back().index;
  };
  json::parser_callback_t callback = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (stack.size() >= kMaxConfigDepth) throw TooDeep{childPath()};
        stack.push_back(Frame{event == json::parse_event_t::object_start, {}, {}, 0});
        break;
      case json::parse_event_t::key: {
        Frame& top = stack.back();
        top.key = parsed.get<std::string>();
        if (!top.keys.insert(top.key).second)
          duplicates.push_back(
              {childPath(), "duplicate key " + inQuotes(top.key) + "; only the last one would count"});
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        stack.pop_back();
        elementDone();
        break;
      case json::parse_event_t::value:
        elementDone();
        break;
    }
    return true;
  };
  return json::parse(text, callback);
}

Status failed(ConfigErrors errors, const std::string& file, ConfigErrors* errorsOut) {
  Status s = Status::error(formatConfigErrors(errors, file));
  if (errorsOut) *errorsOut = std::move(errors);
  return s;
}

std::string systemError(int code) {
  return std::strerror(code);
}

}  // namespace

Expected<RunConfig> parseRunConfig(const nlohmann::json& doc, ConfigErrors* errorsOut) {
  ConfigErrors errors;
  RunConfig config;
  if (!doc.is_object()) {
    errors.push_back({"", std::string("the config must be a JSON object, got ") + doc.type_name()});
    return failed(std::move(errors), "config", errorsOut);
  }
  try {
    ConfigReader(config, errors).read(doc);
  } catch (const nlohmann::json::exception& e) {  // not expected: values are type-checked before get<>()
    errors.push_back({"", std::string("internal error while reading: ") + e.what()});
  }
  const ConfigErrors readErrors = errors;
  for (auto& finding : checkRunConfig(config)) {
    bool stale = false;
    for (const auto& e : readErrors)
      for (const auto& p : finding.involves) stale = stale || overlaps(e.path, p);
    if (!stale) errors.push_back(std::move(finding.error));
  }
  if (!errors.empty()) return failed(std::move(errors), "config", errorsOut);
  if (errorsOut) errorsOut->clear();
  return config;
}

Expected<RunConfig> loadRunConfig(const std::string& path, ConfigErrors* errorsOut) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec))
    return failed({{"", "cannot open: " + systemError(EISDIR)}}, path, errorsOut);
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) return failed({{"", "cannot open: " + systemError(errno)}}, path, errorsOut);
  std::string text;
  char buffer[65536];
  size_t n = 0;
  while (text.size() <= kMaxConfigBytes && (n = std::fread(buffer, 1, sizeof buffer, file)) > 0)
    text.append(buffer, n);
  const bool readFailed = std::ferror(file) != 0;
  const int readErrno = errno;
  std::fclose(file);
  if (readFailed) return failed({{"", "cannot read: " + systemError(readErrno)}}, path, errorsOut);
  Expected<RunConfig> config = parseRunConfigText(text, path, errorsOut);
  if (!config) return config;
  config->baseDir = fs::absolute(fs::path(path), ec).parent_path().lexically_normal().string();
  if (Status s = loadProfiles(*config); !s) {
    const std::string message = s.message();
    const size_t colon = message.find(": ");
    return failed({{message.substr(0, colon), message.substr(colon + 2)}}, path, errorsOut);
  }
  return config;
}

Expected<RunConfig> parseRunConfigText(const std::string& text, const std::string& path,
                                       ConfigErrors* errorsOut) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    return failed({{"", "the file is empty; expected a JSON object"}}, path, errorsOut);
  if (text.size() > kMaxConfigBytes)
    return failed({{"", "the file is over " + std::to_string(kMaxConfigBytes >> 20) +
                            " MiB (not read further); a run config is a few KiB"}},
                  path, errorsOut);

  ConfigErrors errors;
  json doc;
  try {
    doc = parseDocument(text, errors);
  } catch (const TooDeep& e) {
    return failed({{e.path.substr(0, 200) + (e.path.size() > 200 ? "..." : ""),
                    "nested deeper than " + std::to_string(kMaxConfigDepth) +
                        " levels; a run config nests a few (not read further)"}},
                  path, errorsOut);
  } catch (const json::parse_error& e) {
    const std::string reason = parseReason(e.what());
    return failed({{"", errorPosition(text, e.byte, reason) + ": " + reason}}, path, errorsOut);
  } catch (const json::out_of_range& e) {
    // A number beyond double ("lr": 1e400): nlohmann names the token but not where it is; its first
    // occurrence as a whole token is (a token inside a string would be no number).
    const std::string what = e.what();
    const size_t q0 = what.find('\''), q1 = what.rfind('\'');
    std::string where;
    if (q0 != std::string::npos && q1 > q0 + 1) {
      const std::string token = what.substr(q0 + 1, q1 - q0 - 1);
      for (size_t at = text.find(token); at != std::string::npos && where.empty();
           at = text.find(token, at + 1)) {
        const bool starts = at == 0 || std::strchr(" \t\r\n:,[", text[at - 1]);
        const size_t end = at + token.size();
        const bool ends = end >= text.size() || std::strchr(" \t\r\n,]}", text[end]);
        if (starts && ends) where = errorPosition(text, at + 1, "") + ": ";
      }
      return failed({{"", where + "the number " + token + " is out of range (beyond a double)"}}, path,
                    errorsOut);
    }
    return failed({{"", std::string("cannot parse: ") + what}}, path, errorsOut);
  } catch (const json::exception& e) {
    return failed({{"", std::string("cannot parse: ") + e.what()}}, path, errorsOut);
  }
  ConfigErrors parseErrors;
  Expected<RunConfig> config = parseRunConfig(doc, &parseErrors);
  errors.insert(errors.end(), parseErrors.begin(), parseErrors.end());
  if (!errors.empty()) return failed(std::move(errors), path, errorsOut);
  if (errorsOut) errorsOut->clear();
  return config;
}

nlohmann::json toJson(const RunConfig& config) {
  return nlohmann::json(fieldsToJson(runConfigFields(), "", config, 0));
}

Status saveRunConfig(const RunConfig& config, const std::string& path) {
  const std::string text =
      fieldsToJson(runConfigFields(), "", config, 0).dump(2, ' ', false, json::error_handler_t::replace) +
      "\n";
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::error(path + ": cannot create " + tmp + ": " + systemError(errno));
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t w = ::write(fd, text.data() + written, text.size() - written);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int code = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return Status::error(path + ": cannot write " + tmp + ": " + systemError(code));
    }
    written += static_cast<size_t>(w);
  }
  const int synced = ::fsync(fd) == 0 ? 0 : errno;
  const int closed = ::close(fd) == 0 ? 0 : errno;
  if (synced != 0 || closed != 0) {
    const int code = synced != 0 ? synced : closed;
    ::unlink(tmp.c_str());
    return Status::error(path + ": cannot flush " + tmp + ": " + systemError(code));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int code = errno;
    ::unlink(tmp.c_str());
    return Status::error(path + ": cannot rename " + tmp + " into place: " + systemError(code));
  }
  // Make the rename itself durable; a failure here leaves a complete file, so it is not an error.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dirFd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirFd >= 0) {
    ::fsync(dirFd);
    ::close(dirFd);
  }
  return Status::ok();
}

}  // namespace ms
