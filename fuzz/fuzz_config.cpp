// Fuzz target: the run config's text -> RunConfig path (JSON syntax, the field table's keys, types and
// ranges, the cross-field checks), through parseRunConfigText(), what loadRunConfig() does once the file is
// read.
//
// Checked for every input, beyond not crashing: a refused config reports at least one error, and its message
// names the file on every line; an accepted one passes validateRunConfig() and survives the documented round
// trip parseRunConfig(toJson(c)) == c (plan/run_config.h).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_check.h"
#include "plan/run_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ms::ConfigErrors errors;
  ms::Expected<ms::RunConfig> config = ms::parseRunConfigText(text, "fuzz.json", &errors);
  if (!config) {
    FUZZ_CHECK(!errors.empty(), "refused without an error: %s", config.message().c_str());
    const std::string& message = config.message();
    for (size_t start = 0; start < message.size();) {
      const size_t end = std::min(message.find('\n', start), message.size());
      FUZZ_CHECK(message.compare(start, 11, "fuzz.json: ") == 0, "an error line without the file: %s",
                 message.substr(start, end - start).c_str());
      start = end + 1;
    }
    return fuzz::outcome(false);
  }
  FUZZ_CHECK(errors.empty(), "accepted with %zu errors", errors.size());
  const ms::ConfigErrors findings = ms::validateRunConfig(*config);
  FUZZ_CHECK(findings.empty(), "accepted but validateRunConfig() finds %s: %s", findings[0].path.c_str(),
             findings[0].message.c_str());
  const nlohmann::json written = ms::toJson(*config);
  ms::Expected<ms::RunConfig> again = ms::parseRunConfig(written);
  FUZZ_CHECK(again, "toJson() of an accepted config is refused: %s\n%s", again.message().c_str(),
             written.dump(2).c_str());
  FUZZ_CHECK(*again == *config, "parseRunConfig(toJson(c)) != c:\n%s", written.dump(2).c_str());
  return fuzz::outcome(true);
}
