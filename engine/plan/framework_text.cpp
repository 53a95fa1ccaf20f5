// Bash words and TOML; see framework_text.h.
#include "plan/framework_text.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

namespace ms {

// ---- bash
// --------------------------------------------------------------------------------------------------

namespace {

bool shIsNameStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool shIsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}
bool shIsSeparator(char c) {
  return c == ';' || c == '&' || c == '|' || c == '(' || c == ')';
}

// A bash script read word by word. Raw words keep their quotes and $-forms; expand() resolves them against
// the variables assigned so far.
class ShellReader {
 public:
  explicit ShellReader(const std::string& text) : m_text(text) {}

  Status run(ShellWords& out) {
    bool commandStart = true;
    while (true) {
      skipBlanks();
      if (m_pos >= m_text.size()) break;
      const char c = m_text[m_pos];
      if (c == '\n') {
        ++m_pos;
        ++m_line;
        commandStart = true;
        continue;
      }
      if (c == '#') {
        skipComment();
        continue;
      }
      if (shIsSeparator(c)) {
        ++m_pos;
        commandStart = true;
        continue;
      }
      const int line = m_line;
      Expected<std::string> raw = rawWord();
      if (!raw) return raw.status();
      if (commandStart && (*raw == "export" || *raw == "declare" || *raw == "local" || *raw == "readonly")) {
        continue;  // the assignment that follows is still at the command's start
      }
      if (commandStart && (*raw == "-a" || *raw == "-x" || *raw == "-r")) continue;  // declare's options
      std::string name;
      bool append = false;
      if (commandStart && assignmentName(*raw, name, append)) {
        const std::string value = raw->substr(name.size() + (append ? 2 : 1));
        if (value.empty() && m_pos < m_text.size() && m_text[m_pos] == '(') {
          ++m_pos;
          Expected<std::vector<std::string>> items = arrayItems(line);
          if (!items) return items.status();
          std::vector<std::string>& array = m_vars[name];
          if (!append) array.clear();
          array.insert(array.end(), items->begin(), items->end());
        } else {
          std::vector<std::string> fields = expand(value, false, out);
          std::string joined;
          for (size_t i = 0; i < fields.size(); ++i) joined += (i ? " " : "") + fields[i];
          std::vector<std::string>& var = m_vars[name];
          if (append && !var.empty()) {
            var[0] += joined;
          } else {
            var = {joined};
          }
        }
        continue;  // an assignment: the next word may be another assignment or the command
      }
      commandStart = false;
      for (std::string& w : expand(*raw, true, out)) out.words.push_back(std::move(w));
    }
    return Status::ok();
  }

 private:
  void skipBlanks() {
    while (m_pos < m_text.size()) {
      const char c = m_text[m_pos];
      if (c == ' ' || c == '\t' || c == '\r') {
        ++m_pos;
      } else if (c == '\\' && m_pos + 1 < m_text.size() && m_text[m_pos + 1] == '\n') {
        m_pos += 2;
        ++m_line;
      } else {
        break;
      }
    }
  }
  void skipComment() {
    while (m_pos < m_text.size() && m_text[m_pos] != '\n') ++m_pos;
  }
  static bool assignmentName(const std::string& raw, std::string& name, bool& append) {
    if (raw.empty() || !shIsNameStart(raw[0])) return false;
    size_t i = 1;
    while (i < raw.size() && shIsNameChar(raw[i])) ++i;
    if (i < raw.size() && raw[i] == '=') {
      name = raw.substr(0, i);
      append = false;
      return true;
    }
    if (i + 1 < raw.size() && raw[i] == '+' && raw[i + 1] == '=') {
      name = raw.substr(0, i);
      append = true;
      return true;
    }
    return false;
  }
  // Skips a balanced construct starting at m_pos (just after its opener) up to its closer, honouring quotes.
  Status skipBalanced(char open, char close, int line) {
    int depth = 1;
    while (m_pos < m_text.size()) {
      const char c = m_text[m_pos];
      if (c == '\n') ++m_line;
      if (c == '\\') {
        m_pos += 2;
        continue;
      }
      if (c == '\'') {
        const size_t end = m_text.find('\'', m_pos + 1);
        if (end == std::string::npos) break;
        m_line += static_cast<int>(std::count(m_text.begin() + m_pos, m_text.begin() + end, '\n'));
        m_pos = end + 1;
        continue;
      }
      if (c == open) ++depth;
      if (c == close && --depth == 0) {
        ++m_pos;
        return Status::ok();
      }
      ++m_pos;
    }
    return Status::error("line " + std::to_string(line) + ": unterminated '" + std::string(1, open) + "'");
  }
  // One word as written, up to an unquoted blank, newline, separator or comment.
  Expected<std::string> rawWord() {
    const size_t start = m_pos;
    const int line = m_line;
    while (m_pos < m_text.size()) {
      const char c = m_text[m_pos];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || shIsSeparator(c)) break;
      if (c == '\\') {
        if (m_pos + 1 < m_text.size() && m_text[m_pos + 1] == '\n') break;  // a continuation ends the word
        m_pos += 2;
        continue;
      }
      if (c == '\'') {
        const size_t end = m_text.find('\'', m_pos + 1);
        if (end == std::string::npos)
          return Status::error("line " + std::to_string(line) + ": unterminated single quote");
        m_line += static_cast<int>(std::count(m_text.begin() + m_pos, m_text.begin() + end, '\n'));
        m_pos = end + 1;
        continue;
      }
      if (c == '"') {
        ++m_pos;
        bool closed = false;
        while (m_pos < m_text.size()) {
          const char d = m_text[m_pos];
          if (d == '\\') {
            m_pos += 2;
            continue;
          }
          if (d == '\n') ++m_line;
          if (d == '$' && m_pos + 1 < m_text.size() &&
              (m_text[m_pos + 1] == '(' || m_text[m_pos + 1] == '{')) {
            const char open = m_text[m_pos + 1];
            m_pos += 2;
            MS_TRY(skipBalanced(open, open == '(' ? ')' : '}', line));
            continue;
          }
          if (d == '"') {
            closed = true;
            ++m_pos;
            break;
          }
          ++m_pos;
        }
        if (!closed) return Status::error("line " + std::to_string(line) + ": unterminated double quote");
        continue;
      }
      if (c == '$' && m_pos + 1 < m_text.size() && (m_text[m_pos + 1] == '(' || m_text[m_pos + 1] == '{')) {
        const char open = m_text[m_pos + 1];
        m_pos += 2;
        MS_TRY(skipBalanced(open, open == '(' ? ')' : '}', line));
        continue;
      }
      if (c == '`') {
        const size_t end = m_text.find('`', m_pos + 1);
        if (end == std::string::npos)
          return Status::error("line " + std::to_string(line) + ": unterminated '`'");
        m_pos = end + 1;
        continue;
      }
      ++m_pos;
    }
    return m_text.substr(start, m_pos - start);
  }
  // The words of an array assignment's ( ... ), expanded, up to the closing parenthesis.
  Expected<std::vector<std::string>> arrayItems(int line) {
    std::vector<std::string> items;
    ShellWords scratch;
    while (true) {
      skipBlanks();
      if (m_pos >= m_text.size())
        return Status::error("line " + std::to_string(line) + ": unterminated array (no closing ')')");
      const char c = m_text[m_pos];
      if (c == '\n') {
        ++m_pos;
        ++m_line;
        continue;
      }
      if (c == '#') {
        skipComment();
        continue;
      }
      if (c == ')') {
        ++m_pos;
        return items;
      }
      if (shIsSeparator(c))
        return Status::error("line " + std::to_string(m_line) + ": '" + std::string(1, c) +
                             "' inside an array assignment");
      Expected<std::string> raw = rawWord();
      if (!raw) return raw.status();
      for (std::string& w : expand(*raw, true, scratch)) items.push_back(std::move(w));
      m_unset.insert(scratch.unset.begin(), scratch.unset.end());
      m_unexpanded.insert(scratch.unexpanded.begin(), scratch.unexpanded.end());
      scratch = {};
    }
  }

  // The values of ${...} / $NAME: one entry per array element ([@] / [*]), or the variable's one value.
  std::vector<std::string> lookup(const std::string& inner, bool& ok, ShellWords& out) {
    ok = true;
    std::string name = inner, fallback;
    bool hasFallback = false;
    for (const char* op : {":-", "-"}) {
      const size_t at = inner.find(op);
      if (at != std::string::npos && at > 0) {
        name = inner.substr(0, at);
        fallback = inner.substr(at + std::string(op).size());
        hasFallback = true;
        break;
      }
    }
    bool all = false;
    if (name.size() > 3 && (name.ends_with("[@]") || name.ends_with("[*]"))) {
      name = name.substr(0, name.size() - 3);
      all = true;
    }
    if (name.empty() || !shIsNameStart(name[0]) ||
        !std::all_of(name.begin(), name.end(), [](char c) { return shIsNameChar(c); })) {
      ok = false;
      return {};
    }
    const auto it = m_vars.find(name);
    if (it == m_vars.end() || (it->second.size() == 1 && it->second[0].empty() && hasFallback)) {
      if (hasFallback) return {fallback};
      if (std::find(out.unset.begin(), out.unset.end(), name) == out.unset.end()) out.unset.push_back(name);
      return {};
    }
    if (all) return it->second;
    return it->second.empty() ? std::vector<std::string>{} : std::vector<std::string>{it->second[0]};
  }

  // A raw word expanded: quotes removed, $-forms replaced, unquoted expansions split on blanks when `split`.
  std::vector<std::string> expand(const std::string& raw, bool split, ShellWords& out) {
    std::vector<std::string> fields;
    std::string cur;
    bool any = false;  // the word has content (a quoted empty string counts)
    const auto addUnquoted = [&](const std::string& value) {
      if (!split) {
        cur += value;
        any = any || !value.empty();
        return;
      }
      size_t i = 0;
      while (i < value.size()) {
        const bool blank = value[i] == ' ' || value[i] == '\t' || value[i] == '\n';
        if (blank) {
          if (any) fields.push_back(cur);
          cur.clear();
          any = false;
          while (i < value.size() && (value[i] == ' ' || value[i] == '\t' || value[i] == '\n')) ++i;
        } else {
          cur += value[i++];
          any = true;
        }
      }
    };
    // Reads a $-form at raw[i] ('$' there); returns the index after it and appends its values.
    const auto dollar = [&](size_t i, bool quoted) -> size_t {
      if (i + 1 >= raw.size()) {
        cur += '$';
        any = true;
        return i + 1;
      }
      const char n = raw[i + 1];
      if (n == '(' || n == '`') {  // command substitution or arithmetic: kept as written
        int depth = 0;
        size_t j = i + 1;
        for (; j < raw.size(); ++j) {
          if (raw[j] == '(') ++depth;
          if (raw[j] == ')' && --depth == 0) break;
        }
        const std::string text = raw.substr(i, std::min(raw.size(), j + 1) - i);
        out.unexpanded.push_back(text);
        cur += text;
        any = true;
        return j + 1;
      }
      if (n == '{') {
        const size_t end = raw.find('}', i + 2);
        const std::string inner = raw.substr(i + 2, (end == std::string::npos ? raw.size() : end) - i - 2);
        bool ok = false;
        std::vector<std::string> values = lookup(inner, ok, out);
        if (!ok) {
          const std::string text = "${" + inner + "}";
          out.unexpanded.push_back(text);
          cur += text;
          any = true;
        } else if (quoted && inner.ends_with("[@]")) {
          for (size_t v = 0; v < values.size(); ++v) {  // "${A[@]}": one word per element
            if (v > 0) {
              fields.push_back(cur);
              cur.clear();
            }
            cur += values[v];
            any = true;
          }
        } else {
          std::string joined;
          for (size_t v = 0; v < values.size(); ++v) joined += (v ? " " : "") + values[v];
          if (quoted) {
            cur += joined;
            any = true;
          } else {
            addUnquoted(joined);
          }
        }
        return end == std::string::npos ? raw.size() : end + 1;
      }
      if (shIsNameStart(n)) {
        size_t j = i + 1;
        while (j < raw.size() && shIsNameChar(raw[j])) ++j;
        bool ok = false;
        const std::vector<std::string> values = lookup(raw.substr(i + 1, j - i - 1), ok, out);
        const std::string value = values.empty() ? std::string() : values[0];
        if (quoted) {
          cur += value;
          any = true;
        } else {
          addUnquoted(value);
        }
        return j;
      }
      if (std::isdigit(static_cast<unsigned char>(n)) || n == '@' || n == '*' || n == '#' || n == '?') {
        const std::string positional(1, n);  // the script's own arguments: not known here
        if (std::find(out.unset.begin(), out.unset.end(), positional) == out.unset.end())
          out.unset.push_back(positional);
        return i + 2;
      }
      cur += '$';
      any = true;
      return i + 1;
    };
    size_t i = 0;
    while (i < raw.size()) {
      const char c = raw[i];
      if (c == '\'') {
        const size_t end = raw.find('\'', i + 1);
        cur += raw.substr(i + 1, end - i - 1);
        any = true;
        i = end + 1;
      } else if (c == '"') {
        any = true;
        ++i;
        while (i < raw.size() && raw[i] != '"') {
          if (raw[i] == '\\' && i + 1 < raw.size() &&
              (raw[i + 1] == '"' || raw[i + 1] == '\\' || raw[i + 1] == '$' || raw[i + 1] == '`')) {
            cur += raw[i + 1];
            i += 2;
          } else if (raw[i] == '\\' && i + 1 < raw.size() && raw[i + 1] == '\n') {
            i += 2;
          } else if (raw[i] == '$') {
            i = dollar(i, true);
          } else {
            cur += raw[i++];
          }
        }
        ++i;
      } else if (c == '\\') {
        if (i + 1 < raw.size()) {
          cur += raw[i + 1];
          any = true;
        }
        i += 2;
      } else if (c == '$') {
        i = dollar(i, false);
      } else if (c == '`') {
        const size_t end = raw.find('`', i + 1);
        const std::string text = raw.substr(i, end - i + 1);
        out.unexpanded.push_back(text);
        cur += text;
        any = true;
        i = end + 1;
      } else {
        cur += c;
        any = true;
        ++i;
      }
    }
    if (any) fields.push_back(cur);
    return fields;
  }

 public:
  std::set<std::string> m_unset, m_unexpanded;  // from array items, merged by shellWords

 private:
  const std::string& m_text;
  size_t m_pos = 0;
  int m_line = 1;
  std::map<std::string, std::vector<std::string>> m_vars;
};

}  // namespace

Expected<ShellWords> shellWords(const std::string& script) {
  ShellWords out;
  ShellReader reader(script);
  MS_TRY(reader.run(out));
  for (const std::string& name : reader.m_unset)
    if (std::find(out.unset.begin(), out.unset.end(), name) == out.unset.end()) out.unset.push_back(name);
  for (const std::string& text : reader.m_unexpanded)
    if (std::find(out.unexpanded.begin(), out.unexpanded.end(), text) == out.unexpanded.end())
      out.unexpanded.push_back(text);
  return out;
}

// ---- TOML
// --------------------------------------------------------------------------------------------------

namespace {

using Json = nlohmann::json;

class TomlReader {
 public:
  explicit TomlReader(const std::string& text) : m_text(text) {}

  Expected<Json> run() {
    Json root = Json::object();
    Json* table = &root;
    while (true) {
      skipSpaceAndComments(true);
      if (m_pos >= m_text.size()) break;
      if (m_text[m_pos] == '[') {
        const bool arrayOfTables = m_pos + 1 < m_text.size() && m_text[m_pos + 1] == '[';
        m_pos += arrayOfTables ? 2 : 1;
        skipBlanks();
        Expected<std::vector<std::string>> key = dottedKey();
        if (!key) return key.status();
        skipBlanks();
        if (!consume(arrayOfTables ? "]]" : "]"))
          return error(arrayOfTables ? "expected ']]'" : "expected ']'");
        std::string path;
        for (const std::string& part : *key) path += (path.empty() ? "" : ".") + part;
        Json* node = &root;
        for (size_t i = 0; i + 1 < key->size(); ++i) {
          Json& next = (*node)[(*key)[i]];
          if (next.is_null()) next = Json::object();
          if (next.is_array() && !next.empty() && next.back().is_object()) {
            node = &next.back();
            continue;
          }
          if (!next.is_object()) return error("'" + (*key)[i] + "' is already a value, not a table");
          node = &next;
        }
        Json& last = (*node)[key->back()];
        if (arrayOfTables) {
          if (last.is_null()) last = Json::array();
          if (!last.is_array())
            return error("'" + path + "' is already defined as something else than an array");
          last.push_back(Json::object());
          table = &last.back();
        } else {
          if (m_defined.count(path)) return error("table [" + path + "] is defined twice");
          m_defined.insert(path);
          if (last.is_null()) last = Json::object();
          if (!last.is_object()) return error("'" + path + "' is already a value, not a table");
          table = &last;
        }
        MS_TRY(endOfLine());
        continue;
      }
      MS_TRY(keyValue(*table));
      MS_TRY(endOfLine());
    }
    return root;
  }

 private:
  Status error(const std::string& what) const {
    return Status::error("line " + std::to_string(line()) + ": " + what);
  }
  int line() const { return 1 + static_cast<int>(std::count(m_text.begin(), m_text.begin() + m_pos, '\n')); }
  bool consume(const char* s) {
    const std::string t(s);
    if (m_text.compare(m_pos, t.size(), t) != 0) return false;
    m_pos += t.size();
    return true;
  }
  void skipBlanks() {
    while (m_pos < m_text.size() && (m_text[m_pos] == ' ' || m_text[m_pos] == '\t')) ++m_pos;
  }
  void skipSpaceAndComments(bool newlines) {
    while (m_pos < m_text.size()) {
      const char c = m_text[m_pos];
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++m_pos;
      } else if (c == '#') {
        while (m_pos < m_text.size() && m_text[m_pos] != '\n') ++m_pos;
      } else {
        break;
      }
    }
  }
  Status endOfLine() {
    skipSpaceAndComments(false);
    if (m_pos < m_text.size() && m_text[m_pos] != '\n') return error("unexpected text after a value");
    return Status::ok();
  }
  Expected<std::string> simpleKey() {
    if (m_pos < m_text.size() && (m_text[m_pos] == '"' || m_text[m_pos] == '\'')) {
      Expected<Json> s = string();
      if (!s) return s.status();
      return s->get<std::string>();
    }
    const size_t start = m_pos;
    while (m_pos < m_text.size() && (std::isalnum(static_cast<unsigned char>(m_text[m_pos])) ||
                                     m_text[m_pos] == '_' || m_text[m_pos] == '-'))
      ++m_pos;
    if (m_pos == start) return error("expected a key");
    return m_text.substr(start, m_pos - start);
  }
  Expected<std::vector<std::string>> dottedKey() {
    std::vector<std::string> parts;
    while (true) {
      Expected<std::string> part = simpleKey();
      if (!part) return part.status();
      parts.push_back(*part);
      skipBlanks();
      if (m_pos < m_text.size() && m_text[m_pos] == '.') {
        ++m_pos;
        skipBlanks();
        continue;
      }
      return parts;
    }
  }
  Status keyValue(Json& table) {
    Expected<std::vector<std::string>> key = dottedKey();
    if (!key) return key.status();
    skipBlanks();
    if (!consume("=")) return error("expected '=' after the key '" + key->back() + "'");
    skipBlanks();
    Expected<Json> v = value();
    if (!v) return v.status();
    Json* node = &table;
    for (size_t i = 0; i + 1 < key->size(); ++i) {
      Json& next = (*node)[(*key)[i]];
      if (next.is_null()) next = Json::object();
      if (!next.is_object()) return error("'" + (*key)[i] + "' is already a value, not a table");
      node = &next;
    }
    if (node->contains(key->back())) return error("the key '" + key->back() + "' is defined twice");
    (*node)[key->back()] = std::move(*v);
    return Status::ok();
  }
  Expected<Json> value() {
    if (m_pos >= m_text.size()) return error("expected a value");
    const char c = m_text[m_pos];
    if (c == '"' || c == '\'') return string();
    if (c == '[') return array();
    if (c == '{') return inlineTable();
    if (consume("true")) return Json(true);
    if (consume("false")) return Json(false);
    return number();
  }
  Expected<Json> string() {
    const bool literal = m_text[m_pos] == '\'';
    const std::string triple = literal ? "'''" : "\"\"\"";
    const bool multi = m_text.compare(m_pos, 3, triple) == 0;
    m_pos += multi ? 3 : 1;
    if (multi && m_pos < m_text.size() && m_text[m_pos] == '\n') ++m_pos;  // a newline right after opening
    std::string out;
    while (true) {
      if (m_pos >= m_text.size()) return error("unterminated string");
      const char c = m_text[m_pos];
      if (multi ? m_text.compare(m_pos, 3, triple) == 0 : c == (literal ? '\'' : '"')) {
        m_pos += multi ? 3 : 1;
        return Json(out);
      }
      if (!multi && c == '\n') return error("a newline inside a one-line string");
      if (!literal && c == '\\') {
        if (m_pos + 1 >= m_text.size()) return error("unterminated string");
        const char e = m_text[m_pos + 1];
        m_pos += 2;
        switch (e) {
          case 'n':
            out += '\n';
            break;
          case 't':
            out += '\t';
            break;
          case 'r':
            out += '\r';
            break;
          case 'b':
            out += '\b';
            break;
          case 'f':
            out += '\f';
            break;
          case '"':
            out += '"';
            break;
          case '\\':
            out += '\\';
            break;
          case 'u':
          case 'U': {
            const size_t n = e == 'u' ? 4 : 8;
            if (m_pos + n > m_text.size()) return error("a short \\" + std::string(1, e) + " escape");
            const unsigned long code = std::strtoul(m_text.substr(m_pos, n).c_str(), nullptr, 16);
            m_pos += n;
            if (code < 0x80) {
              out += static_cast<char>(code);
            } else if (code < 0x800) {
              out += static_cast<char>(0xC0 | (code >> 6));
              out += static_cast<char>(0x80 | (code & 0x3F));
            } else if (code < 0x10000) {
              out += static_cast<char>(0xE0 | (code >> 12));
              out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
              out += static_cast<char>(0x80 | (code & 0x3F));
            } else {
              out += static_cast<char>(0xF0 | (code >> 18));
              out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
              out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
              out += static_cast<char>(0x80 | (code & 0x3F));
            }
            break;
          }
          case '\n':
          case ' ':
          case '\t':
          case '\r':
            if (!multi) return error("an unknown escape in a string");
            // A line-ending backslash: the newline and the blanks after it are dropped.
            m_pos -= 1;
            while (m_pos < m_text.size() && std::isspace(static_cast<unsigned char>(m_text[m_pos]))) ++m_pos;
            break;
          default:
            return error(std::string("an unknown escape '\\") + e + "' in a string");
        }
        continue;
      }
      out += c;
      ++m_pos;
    }
  }
  Expected<Json> array() {
    ++m_pos;
    Json out = Json::array();
    while (true) {
      skipSpaceAndComments(true);
      if (m_pos >= m_text.size()) return error("unterminated array");
      if (m_text[m_pos] == ']') {
        ++m_pos;
        return out;
      }
      Expected<Json> v = value();
      if (!v) return v.status();
      out.push_back(std::move(*v));
      skipSpaceAndComments(true);
      if (m_pos < m_text.size() && m_text[m_pos] == ',') {
        ++m_pos;
        continue;
      }
      skipSpaceAndComments(true);
      if (m_pos < m_text.size() && m_text[m_pos] == ']') {
        ++m_pos;
        return out;
      }
      return error("expected ',' or ']' in an array");
    }
  }
  Expected<Json> inlineTable() {
    ++m_pos;
    Json out = Json::object();
    skipBlanks();
    if (consume("}")) return out;
    while (true) {
      skipBlanks();
      MS_TRY(keyValue(out));
      skipBlanks();
      if (consume(",")) continue;
      if (consume("}")) return out;
      return error("expected ',' or '}' in an inline table");
    }
  }
  Expected<Json> number() {
    const size_t start = m_pos;
    while (m_pos < m_text.size()) {
      const char c = m_text[m_pos];
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.' || c == '_' ||
          c == ':') {
        ++m_pos;
      } else {
        break;
      }
    }
    std::string t = m_text.substr(start, m_pos - start);
    if (t.empty()) return error("expected a value");
    if (t.find(':') != std::string::npos || (t.size() >= 10 && t[4] == '-' && t[7] == '-'))
      return error("dates and times are not supported ('" + t + "')");
    std::string body = t;
    if (!body.empty() && (body[0] == '+' || body[0] == '-')) body = body.substr(1);
    const bool negative = t[0] == '-';
    if (body == "inf") return Json(negative ? -INFINITY : INFINITY);
    if (body == "nan") return Json(NAN);
    // Underscores only between digits.
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i] != '_') continue;
      if (i == 0 || i + 1 == t.size() || !std::isxdigit(static_cast<unsigned char>(t[i - 1])) ||
          !std::isxdigit(static_cast<unsigned char>(t[i + 1])))
        return error("a misplaced '_' in the number '" + t + "'");
    }
    std::string digits;
    for (char c : t)
      if (c != '_') digits += c;
    char* end = nullptr;
    if (digits.size() > 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'o' || digits[1] == 'b')) {
      const int base = digits[1] == 'x' ? 16 : digits[1] == 'o' ? 8 : 2;
      const long long v = std::strtoll(digits.c_str() + 2, &end, base);
      if (*end) return error("a malformed number '" + t + "'");
      return Json(v);
    }
    const bool isFloat = digits.find_first_of(".eE") != std::string::npos;
    if (isFloat) {
      const double v = std::strtod(digits.c_str(), &end);
      if (*end || digits.back() == '.' || digits.find(".e") != std::string::npos)
        return error("a malformed number '" + t + "'");
      return Json(v);
    }
    if (body.size() > 1 && body[0] == '0') return error("a leading zero in the number '" + t + "'");
    const long long v = std::strtoll(digits.c_str(), &end, 10);
    if (*end) return error("a malformed value '" + t + "'");
    return Json(v);
  }

  const std::string& m_text;
  size_t m_pos = 0;
  std::set<std::string> m_defined;
};

}  // namespace

Expected<nlohmann::json> parseToml(const std::string& text) {
  return TomlReader(text).run();
}

std::string tomlKey(const std::string& key) {
  const bool bare = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
  return bare ? key : tomlValue(nlohmann::json(key));
}

std::string shortestNumber(double v) {
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string tomlValue(const nlohmann::json& value) {
  if (value.is_string()) {
    std::string out = "\"";
    for (char c : value.get<std::string>()) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\r':
          out += "\\r";
          break;
        default:
          out += c;
      }
    }
    return out + "\"";
  }
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  if (value.is_number_integer() || value.is_number_unsigned()) return value.dump();
  if (value.is_number_float()) {
    const double v = value.get<double>();
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    std::string s = shortestNumber(v);
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
    return s;
  }
  if (value.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < value.size(); ++i) out += (i ? ", " : "") + tomlValue(value[i]);
    return out + "]";
  }
  return "\"\"";
}

}  // namespace ms
