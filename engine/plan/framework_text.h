// The two text formats the frameworks' configs come in, read and written without a dependency: the words of a
// bash launch script (Megatron-LM's `torchrun ... pretrain_gpt.py ${GPT_ARGS[@]}` scripts) and TOML
// (torchtitan's job files). Only what such files use is supported; anything else is an error that names the
// line, never a silent guess.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace ms {

// The words of a bash script after the expansions launch scripts use, in order, every command's words one
// after another (a command's end is not marked: the frameworks' flags are read from the whole text).
// Supported: comments (#), line continuations (\ newline), single and double quotes, backslash escapes,
// assignments `NAME=value`, `export NAME=value`, arrays `NAME=( words ... )` (over several lines), and their
// expansions `$NAME`, `${NAME}`, `${NAME[@]}`, `${NAME[*]}`, `${NAME:-default}`, also inside double quotes.
// Assignments are not words. A variable never assigned expands to nothing and is listed in `unset`; a
// command substitution ($(...) or backticks) or arithmetic ($((...))) is kept as its literal text and listed
// in `unexpanded`. Errors: an unterminated quote or array, naming the line.
struct ShellWords {
  std::vector<std::string> words;
  std::vector<std::string> unset;       // variables used but never assigned ("DATA_PATH")
  std::vector<std::string> unexpanded;  // "$(nproc)" and the like, as written
};
Expected<ShellWords> shellWords(const std::string& script);

// TOML (v1.0) as JSON: tables become objects ([a.b] nests), arrays arrays, strings, integers, floats and
// booleans themselves. Supported: comments, [table] and [[array of tables]] headers (dotted, bare or quoted
// keys), key = value with dotted keys, basic and literal strings (with the usual escapes), multi-line basic
// and literal strings, integers (decimal, with _ separators, 0x/0o/0b), floats (with exponent, inf, nan),
// booleans, arrays (over several lines, trailing comma) and inline tables. Not supported (an error naming the
// line): dates and times. Errors: a duplicate key or table, a malformed value; each names the line.
Expected<nlohmann::json> parseToml(const std::string& text);

// A TOML value written back: strings quoted with escapes, integers, floats always with a '.' or an exponent
// (so they read back as floats), booleans, arrays of those.
std::string tomlValue(const nlohmann::json& value);
// The shortest %g form of v that reads back (strtod) to the same double: what the exporters write for a
// number and the importers quote back in their notes.
std::string shortestNumber(double v);
// A bare key when it can be one, else a quoted key.
std::string tomlKey(const std::string& key);

}  // namespace ms
