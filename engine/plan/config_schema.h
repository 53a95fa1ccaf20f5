// The field table of the run config (internal to the plan library): every JSON key with its type, range or
// allowed values, the model types and data kinds it applies to, a one-line description and accessors into
// RunConfig. Parsing, validateRunConfig(), toJson(), runConfigSchema() and runConfigMarkdown() all walk this
// one table, so a range or a description is written exactly once.
//
// What always holds: a field's default is what its accessor reads from a default-constructed RunConfig (the
// initialisers in run_config.h), so the table never repeats a default; a field's children (parent == its
// path) come after it, in the documented key order that toJson() writes; the children of a list of objects
// have the parent "<list path>/*" and their accessors take the item index.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "plan/run_config.h"

namespace ms {

enum class FieldKind {
  Object,      // a section: its children follow in the table
  ObjectList,  // an array of objects whose fields have the parent "<path>/*"
  Integer,     // int
  Unsigned,    // unsigned 64-bit integer (seed)
  Number,      // double, always finite
  Boolean,
  String,
  Enum,         // a string from `allowed`, stored as a C++ enum
  StringList,   // a string or an array of strings (a string means an array of one)
  StringArray,  // an array of strings
  IntList,      // an array of integers, each within `range`
  NumberPair,   // an array of exactly two numbers, each within `range`
};

// Bit masks of the model types and data kinds a field applies to.
constexpr unsigned modelBit(ModelType t) {
  return 1u << static_cast<unsigned>(t);
}
constexpr unsigned dataBit(DataKind k) {
  return 1u << static_cast<unsigned>(k);
}
inline constexpr unsigned kAllModels = modelBit(ModelType::Gpt) | modelBit(ModelType::Vit) |
                                       modelBit(ModelType::Mlp) | modelBit(ModelType::Cnn) |
                                       modelBit(ModelType::Llama);
inline constexpr unsigned kAllDataKinds =
    dataBit(DataKind::Text) | dataBit(DataKind::Tokens) | dataBit(DataKind::FashionMnist);

// JSON names of the enums, in declaration order; toString() and the field table read them.
template <typename E>
struct EnumName {
  E value;
  const char* name;
};
inline constexpr EnumName<ModelType> kModelTypeNames[] = {{ModelType::Gpt, "gpt"},
                                                          {ModelType::Vit, "vit"},
                                                          {ModelType::Mlp, "mlp"},
                                                          {ModelType::Cnn, "cnn"},
                                                          {ModelType::Llama, "llama"}};
inline constexpr EnumName<BatchNormMode> kBatchNormModeNames[] = {{BatchNormMode::Local, "local"},
                                                                  {BatchNormMode::Sync, "sync"}};
inline constexpr EnumName<ParallelMode> kParallelModeNames[] = {
    {ParallelMode::Collective, "collective"}, {ParallelMode::ParameterServer, "parameter_server"}};
inline constexpr EnumName<Consistency> kConsistencyNames[] = {
    {Consistency::Sync, "sync"}, {Consistency::Async, "async"}, {Consistency::Bounded, "bounded"}};
inline constexpr EnumName<Activation> kActivationNames[] = {
    {Activation::Relu, "relu"}, {Activation::Gelu, "gelu"}, {Activation::Tanh, "tanh"}};
inline constexpr EnumName<Pooling> kPoolingNames[] = {{Pooling::Cls, "cls"}, {Pooling::Mean, "mean"}};
inline constexpr EnumName<DataKind> kDataKindNames[] = {
    {DataKind::Text, "text"}, {DataKind::Tokens, "tokens"}, {DataKind::FashionMnist, "fashion_mnist"}};
inline constexpr EnumName<Schedule> kScheduleNames[] = {{Schedule::GPipe, "gpipe"},
                                                        {Schedule::OneFOneB, "1f1b"},
                                                        {Schedule::Interleaved1F1B, "interleaved_1f1b"},
                                                        {Schedule::ZbH1, "zb_h1"}};
inline constexpr EnumName<Recompute> kRecomputeNames[] = {
    {Recompute::None, "none"}, {Recompute::Selective, "selective"}, {Recompute::Full, "full"}};
inline constexpr EnumName<Precision> kPrecisionNames[] = {{Precision::Fp32, "fp32"},
                                                          {Precision::Bf16, "bf16"}};
inline constexpr EnumName<GradPrecision> kGradPrecisionNames[] = {{GradPrecision::Fp32, "fp32"},
                                                                  {GradPrecision::Bf16, "bf16"}};
inline constexpr EnumName<Offload> kOffloadNames[] = {
    {Offload::None, "none"}, {Offload::Optimizer, "optimizer"}, {Offload::Parameters, "parameters"}};
inline constexpr EnumName<OptimizerType> kOptimizerTypeNames[] = {{OptimizerType::AdamW, "adamw"},
                                                                  {OptimizerType::Sgd, "sgd"}};
inline constexpr EnumName<LrSchedule> kLrScheduleNames[] = {
    {LrSchedule::Constant, "constant"}, {LrSchedule::Cosine, "cosine"}, {LrSchedule::Linear, "linear"}};
inline constexpr EnumName<DeviceChoice> kDeviceChoiceNames[] = {
    {DeviceChoice::Auto, "auto"}, {DeviceChoice::Cpu, "cpu"}, {DeviceChoice::Cuda, "cuda"}};

template <typename E, size_t N>
const char* enumName(const EnumName<E> (&names)[N], E value) {
  for (const auto& n : names)
    if (n.value == value) return n.name;
  return "unknown";
}

// An interval of allowed numbers; an absent bound is open-ended.
struct NumberRange {
  std::optional<double> min;
  bool minExclusive = false;
  std::optional<double> max;
  bool maxExclusive = false;
  bool contains(double v) const;
  // ">= 1", "> 0", "[0, 1)", "0 .. 3", "1"; empty when unbounded.
  std::string describe(bool integral) const;
};

struct Field {
  using Getter = std::function<nlohmann::ordered_json(const RunConfig&, size_t item)>;
  // Receives a value already checked for its kind: integers as int64/uint64, numbers as double, enums as one
  // of `allowed`, string lists as arrays.
  using Setter = std::function<void(RunConfig&, size_t item, const nlohmann::json&)>;

  std::string parent;  // JSON pointer of the enclosing object: "", "/model", "/mesh/nodes/*"
  std::string key;
  FieldKind kind = FieldKind::Integer;
  std::string description;
  NumberRange range;                 // numbers, and the entries of IntList and NumberPair
  std::vector<std::string> allowed;  // Enum: its names; String: the allowed values when not empty
  // String: the built-in values (the hardware catalog's names), offered to editors as the schema's
  // "examples"; the config adds its own in the list named by `extendedBy` ("mesh.device_types"), so the
  // name is checked across fields (config_checks.cpp), not by this row.
  std::vector<std::string> builtIn;
  std::string extendedBy;
  bool required = false;
  bool nonEmpty = false;   // String, and the entries of string lists
  bool nameChars = false;  // String: only [A-Za-z0-9._-]
  size_t minItems = 0;     // lists
  unsigned models = kAllModels;
  unsigned dataKinds = kAllDataKinds;
  std::vector<std::string> aliases;  // spellings from other tools, only used for did-you-mean
  Getter get;
  Setter set;
  std::function<size_t(const RunConfig&)> count;   // ObjectList
  std::function<void(RunConfig&, size_t)> resize;  // ObjectList

  std::string path() const { return parent + "/" + key; }
  std::string itemParent() const { return path() + "/*"; }
  bool isContainer() const { return kind == FieldKind::Object || kind == FieldKind::ObjectList; }
  bool appliesTo(ModelType model, DataKind data) const;
  // The model and data kinds, and the parallel mode (the parameter-server fields are written and checked in
  // that mode only).
  bool appliesTo(const RunConfig& config) const;
  bool parameterServerOnly = false;
  Field& forParameterServer() {
    parameterServerOnly = true;
    return *this;
  }
  // Builder helpers for the table.
  Field& forModels(unsigned mask) {
    models = mask;
    return *this;
  }
  Field& forData(unsigned mask) {
    dataKinds = mask;
    return *this;
  }
  Field& aka(std::vector<std::string> names) {
    aliases = std::move(names);
    return *this;
  }
  Field& isRequired() {
    required = true;
    return *this;
  }
};

// The table, parents before their children, in documented key order.
std::vector<Field> runConfigFields();
// The fields whose parent is `parent`, in table order.
std::vector<const Field*> childFields(const std::vector<Field>& fields, const std::string& parent);
const Field* findField(const std::vector<Field>& fields, const std::string& parent, const std::string& key);
// The field's JSON pointer with "*" replaced by the item index: "/mesh/nodes/*/count" ->
// "/mesh/nodes/1/count".
std::string concretePath(const Field& field, size_t item);
// Escapes a key for a JSON pointer (RFC 6901): "~" -> "~0", "/" -> "~1".
std::string escapePointer(const std::string& key);
// The children of `parent` that apply to the config, written as an object (the body of toJson()).
nlohmann::ordered_json fieldsToJson(const std::vector<Field>& fields, const std::string& parent,
                                    const RunConfig& config, size_t item);
// A field's default: its value in a default-constructed RunConfig (list items: in a default item).
// Null for sections and required keys.
nlohmann::ordered_json fieldDefault(const std::vector<Field>& fields, const Field& field);
// The index of the candidate closest to `word` by edit distance (case-insensitive, "-" same as "_",
// transpositions count 1), or -1 when none is close enough: distance <= 1 for candidates up to 4 characters
// (of one or two characters: only for words of the same length), 2 up to 8, 3 beyond; a candidate that
// starts with a word of 3 or more characters also counts. Ties go to the earlier candidate.
int closestIndex(const std::string& word, const std::vector<std::string>& candidates);
// The closest candidate itself, or "".
std::string closestName(const std::string& word, const std::vector<std::string>& candidates);
// `"bert" is not one of "gpt", "vit", "mlp"`, with `; did you mean "gpt"?` when one is close.
std::string notOneOfMessage(const std::string& value, const std::vector<std::string>& allowed);

// A problem found by validateRunConfig() with the JSON paths of the fields it depends on (its own path
// included). parseRunConfig() drops a finding when one of those fields already failed to parse: a default
// stood in for the bad value, so the finding would be about a value the user never wrote.
struct ConfigFinding {
  ConfigError error;
  std::vector<std::string> involves;
};
// The field-table checks (ranges, allowed strings, list sizes) of the fields that apply to the config's
// model type and data kind, then the cross-field checks. In config_checks.cpp.
std::vector<ConfigFinding> checkRunConfig(const RunConfig& config);

}  // namespace ms
