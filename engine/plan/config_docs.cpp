// The generated descriptions of the run config: runConfigSchema() (JSON Schema draft 2020-12) and
// runConfigMarkdown() (the reference tables of docs/config.md). Both are walks over the field table, so
// they state the same types, defaults, ranges and descriptions as the validator.
//
// What always holds: every object in the schema has "additionalProperties": false; a key that does not
// apply to a model type or data kind is forbidden for it by an if/then rule, as the parser refuses it.
#include <string>
#include <vector>

#include "plan/config_schema.h"

namespace ms {

namespace {

using json = nlohmann::json;

// Names of the model types or data kinds in a mask, "gpt, vit".
template <typename E, size_t N>
std::string maskNames(unsigned mask, const EnumName<E> (&names)[N], unsigned (*bit)(E)) {
  std::string out;
  for (const auto& n : names)
    if (mask & bit(n.value)) out += (out.empty() ? "" : ", ") + std::string(n.name);
  return out;
}

unsigned modelMask(ModelType t) {
  return modelBit(t);
}
unsigned dataMask(DataKind k) {
  return dataBit(k);
}

// The description with the model types or data kinds it is limited to.
std::string fullDescription(const Field& f) {
  std::string d = f.description;
  if (f.models != kAllModels) d += " Model types: " + maskNames(f.models, kModelTypeNames, modelMask) + ".";
  if (f.dataKinds != kAllDataKinds)
    d += " Data kinds: " + maskNames(f.dataKinds, kDataKindNames, dataMask) + ".";
  if (f.parameterServerOnly) d += " With \"mode\": \"parameter_server\" only.";
  return d;
}

bool integral(FieldKind k) {
  return k == FieldKind::Integer || k == FieldKind::Unsigned || k == FieldKind::IntList;
}

json rangeBound(double v, FieldKind kind) {
  return integral(kind) ? json(static_cast<long long>(v)) : json(v);
}

void addRange(json& s, const Field& f) {
  if (f.range.min)
    s[f.range.minExclusive ? "exclusiveMinimum" : "minimum"] = rangeBound(*f.range.min, f.kind);
  if (f.range.max)
    s[f.range.maxExclusive ? "exclusiveMaximum" : "maximum"] = rangeBound(*f.range.max, f.kind);
}

json stringSchema(const Field& f) {
  json s = {{"type", "string"}};
  if (!f.allowed.empty()) s["enum"] = f.allowed;
  if (!f.builtIn.empty()) s["examples"] = f.builtIn;  // not an enum: the config may add its own names
  if (f.nonEmpty) s["minLength"] = 1;
  if (f.nameChars) s["pattern"] = "^[A-Za-z0-9._-]+$";
  return s;
}

json objectSchema(const std::vector<Field>& fields, const std::string& parent);

json fieldSchema(const std::vector<Field>& fields, const Field& f) {
  json s;
  switch (f.kind) {
    case FieldKind::Object:
      s = objectSchema(fields, f.path());
      break;
    case FieldKind::ObjectList:
      s = {{"type", "array"}, {"items", objectSchema(fields, f.itemParent())}};
      if (f.minItems) s["minItems"] = f.minItems;
      break;
    case FieldKind::Integer:
    case FieldKind::Unsigned:
      s = {{"type", "integer"}};
      addRange(s, f);
      break;
    case FieldKind::Number:
      s = {{"type", "number"}};
      addRange(s, f);
      break;
    case FieldKind::Boolean:
      s = {{"type", "boolean"}};
      break;
    case FieldKind::String:
    case FieldKind::Enum:
      s = stringSchema(f);
      break;
    case FieldKind::StringList:
    case FieldKind::StringArray: {
      json array = {{"type", "array"}, {"items", stringSchema(f)}};
      if (f.minItems) array["minItems"] = f.minItems;
      s = f.kind == FieldKind::StringArray ? array : json{{"anyOf", {stringSchema(f), array}}};
      break;
    }
    case FieldKind::IntList:
    case FieldKind::NumberPair: {
      json item = {{"type", f.kind == FieldKind::IntList ? "integer" : "number"}};
      addRange(item, f);
      s = {{"type", "array"}, {"items", item}};
      if (f.kind == FieldKind::NumberPair) s["minItems"] = s["maxItems"] = 2;
      break;
    }
  }
  s["description"] = fullDescription(f);
  const auto d = fieldDefault(fields, f);
  if (!d.is_null()) s["default"] = json(d);
  return s;
}

// if/then rules forbidding the keys of `parent` that do not apply to a value of its discriminator key.
template <typename E, size_t N>
void addApplicability(json& s, const std::vector<const Field*>& children, const char* discriminator,
                      const EnumName<E> (&names)[N], unsigned (*bit)(E), unsigned Field::*mask) {
  for (const auto& n : names) {
    json forbidden = json::object();
    for (const Field* f : children)
      if (!((*f).*mask & bit(n.value))) forbidden[f->key] = false;
    if (forbidden.empty()) continue;
    s["allOf"].push_back(
        {{"if", {{"properties", {{discriminator, {{"const", n.name}}}}}, {"required", {discriminator}}}},
         {"then", {{"properties", forbidden}}}});
  }
}

json objectSchema(const std::vector<Field>& fields, const std::string& parent) {
  json s = {{"type", "object"}, {"additionalProperties", false}, {"properties", json::object()}};
  const auto children = childFields(fields, parent);
  json required = json::array();
  for (const Field* f : children) {
    s["properties"][f->key] = fieldSchema(fields, *f);
    if (f->required) required.push_back(f->key);
  }
  if (!required.empty()) s["required"] = required;
  if (parent == "/model") addApplicability(s, children, "type", kModelTypeNames, modelMask, &Field::models);
  if (parent == "/data") addApplicability(s, children, "kind", kDataKindNames, dataMask, &Field::dataKinds);
  return s;
}

std::string typeText(FieldKind kind) {
  switch (kind) {
    case FieldKind::Object:
      return "object";
    case FieldKind::ObjectList:
      return "array of objects";
    case FieldKind::Integer:
      return "integer";
    case FieldKind::Unsigned:
      return "integer (64-bit)";
    case FieldKind::Number:
      return "number";
    case FieldKind::Boolean:
      return "boolean";
    case FieldKind::String:
      return "string";
    case FieldKind::Enum:
      return "string (enum)";
    case FieldKind::StringList:
      return "string or array of strings";
    case FieldKind::StringArray:
      return "array of strings";
    case FieldKind::IntList:
      return "array of integers";
    case FieldKind::NumberPair:
      return "array of 2 numbers";
  }
  return "";
}

std::string cell(std::string s) {
  std::string out;
  for (char ch : s) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
  return out;
}

std::string allowedText(const Field& f) {
  std::string out;
  for (const auto& a : f.allowed) out += (out.empty() ? "`" : ", `") + a + "`";
  if (!out.empty()) return out;
  for (const auto& a : f.builtIn) out += (out.empty() ? "`" : ", `") + a + "`";
  if (!out.empty()) return out + " or a name from `" + f.extendedBy + "`";
  const std::string range = f.range.describe(integral(f.kind));
  switch (f.kind) {
    case FieldKind::IntList:
      return range.empty() ? "" : "each " + range;
    case FieldKind::NumberPair:
      return "each in " + range;
    case FieldKind::StringList:
    case FieldKind::StringArray:
      return f.minItems ? "at least 1, non-empty strings" : "non-empty strings";
    case FieldKind::ObjectList:
      return f.minItems ? "at least " + std::to_string(f.minItems) : "";
    case FieldKind::String:
      if (f.nameChars) return "`[A-Za-z0-9._-]+`";
      return f.nonEmpty ? "non-empty" : "";
    default:
      return range;
  }
}

std::string defaultText(const std::vector<Field>& fields, const Field& f) {
  if (f.required) return "required";
  if (f.kind == FieldKind::Object) return "";
  std::string text = "`";  // appended, not "`" + s: GCC 12 gives a false -Wrestrict for the latter
  text += fieldDefault(fields, f).dump();
  text += '`';
  return text;
}

// "model" for "/model", "mesh.nodes[]" for "/mesh/nodes/*".
std::string sectionName(const std::string& parent) {
  std::string out;
  for (size_t i = 1; i < parent.size(); ++i) out += parent[i] == '/' ? '.' : parent[i];
  const size_t star = out.find(".*");
  if (star != std::string::npos) out.replace(star, 2, "[]");
  return out;
}

void addTable(const std::vector<Field>& fields, const std::string& parent, std::string& md) {
  const auto children = childFields(fields, parent);
  md += parent.empty() ? "## Top level\n\n" : "## `" + sectionName(parent) + "`\n\n";
  if (!parent.empty()) {
    for (const auto& f : fields)
      if (f.path() == parent || f.itemParent() == parent) md += fullDescription(f) + "\n\n";
  }
  md += "| Key | Type | Default | Allowed | Description |\n|---|---|---|---|---|\n";
  for (const Field* f : children)
    md += "| `" + f->key + "` | " + typeText(f->kind) + " | " + cell(defaultText(fields, *f)) + " | " +
          cell(allowedText(*f)) + " | " + cell(fullDescription(*f)) + " |\n";
  md += "\n";
  for (const Field* f : children) {
    if (f->kind == FieldKind::Object) addTable(fields, f->path(), md);
    if (f->kind == FieldKind::ObjectList) addTable(fields, f->itemParent(), md);
  }
}

}  // namespace

nlohmann::json runConfigSchema() {
  const std::vector<Field> fields = runConfigFields();
  json s = objectSchema(fields, "");
  s["$schema"] = "https://json-schema.org/draft/2020-12/schema";
  s["title"] = "MeshStudio run config";
  s["description"] =
      "One document describes a training run: model, data, mesh, parallel layout, optimizer and training. "
      "Generated from the field table in engine/plan/config_schema.cpp; the engine also checks rules across "
      "fields (tp divides heads, the placement covers every layer once, ...) that this schema does not "
      "state.";
  return s;
}

std::string runConfigMarkdown() {
  std::string md;
  addTable(runConfigFields(), "", md);
  md.pop_back();  // one trailing newline, not two
  return md;
}

}  // namespace ms
