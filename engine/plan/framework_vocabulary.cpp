// The frameworks' documented flags and keys (resources/frameworks/*.json), built into the library by
// engine/plan/CMakeLists.txt as framework_data.inc; see frameworks.h.
#include <algorithm>
#include <map>
#include <mutex>

#include "plan/frameworks.h"

namespace ms {

namespace {

struct FwDataFile {
  const char* name;
  const char* text;
};
const FwDataFile kFrameworkData[] = {
#include "framework_data.inc"
};

FrameworkVocabulary loadVocabulary(Framework f) {
  const std::string file = f == Framework::Megatron ? "megatron-lm" : frameworkName(f);
  FrameworkVocabulary v;
  for (const FwDataFile& d : kFrameworkData) {
    if (file != d.name) continue;
    v.document = nlohmann::json::parse(d.text, nullptr, false);
  }
  if (!v.document.is_object()) return v;  // a build without the file: knows nothing (tests catch it)
  v.framework = v.document.value("framework", "");
  v.version = v.document.value("version", "");
  v.commit = v.document.value("commit", "");
  v.commitDate = v.document.value("commit_date", "");
  const char* list = v.document.contains("flags") ? "flags" : "keys";
  for (const auto& entry : v.document.value(list, nlohmann::json::array()))
    if (entry.is_object() && entry.contains("name")) v.names.push_back(entry["name"].get<std::string>());
  std::sort(v.names.begin(), v.names.end());
  return v;
}

}  // namespace

bool FrameworkVocabulary::knows(const std::string& name) const {
  return std::binary_search(names.begin(), names.end(), name);
}

bool FrameworkVocabulary::takesValue(const std::string& name) const {
  for (const auto& entry : document.value("flags", nlohmann::json::array()))
    if (entry.value("name", "") == name) return entry.value("value", true);
  return true;
}

const FrameworkVocabulary& frameworkVocabulary(Framework f) {
  static std::mutex mutex;
  static std::map<Framework, FrameworkVocabulary> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = loaded.find(f);
  if (it == loaded.end()) it = loaded.emplace(f, loadVocabulary(f)).first;
  return it->second;
}

}  // namespace ms
