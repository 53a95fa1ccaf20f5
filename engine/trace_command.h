// meshstudio-engine trace: a measured timeline from PyTorch's profiler or Nsight Systems (Chrome trace
// JSON, one file per rank or merged; plan/trace_import.h) summarised per rank and step, and its collectives
// merged into a device profile's links (docs/calibration.md, "Importing a PyTorch or Nsight trace").
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace ms {

struct TraceCommandOptions {
  std::vector<std::string> files;
  bool json = false;       // the full summary as JSON on stdout instead of the tables
  std::string profileOut;  // a device profile to merge the trace's links into (empty: none)
  std::string linkName = "trace";
};

// Exit codes as main's: 0 done; 1 the profile could not be written; 2 bad input (a trace that does not read,
// a profile that is not one, a trace without the collectives a link needs). Messages name the file.
int runTraceCommand(const TraceCommandOptions& options);
// `meshstudio-engine trace FILE... [--json] [--profile-out PROFILE] [--link NAME]`: argv[first] onwards are
// the command's arguments; bad usage prints the reason and the usage line and returns 2.
int traceMain(int argc, char** argv, int first);

// Merges link entries (plan/trace_import.h traceLinkEntries) into the device profile at path, written
// atomically: a link of the same name measured at the same rank count keeps the ops the trace did not
// measure and takes the trace's measurements of the others; one at another rank count is replaced whole; a
// new name is added. The result must read as a profile (parseDeviceProfile), else nothing is written and the
// error says what is missing (a link needs sendrecv and all_reduce measurements). *writeFailed (when given)
// says whether the error was in writing the file rather than in what was read.
Status mergeTraceLinks(const std::string& path, const std::vector<nlohmann::json>& links,
                       bool* writeFailed = nullptr);

}  // namespace ms
