// `meshstudio-engine calibrate`: measures this machine through the engine's own paths (the CPU backend's
// kernels, the MPI communicator) and writes a device profile, the JSON documented in docs/calibration.md
// ("The profile file"), which the planner reads.
//
// What always holds: every number in a profile is finite and > 0 (a measurement that is not is an error, not
// an entry); a profile is written whole or not at all (FILE.tmp, then a rename); the link measurements run as
// separate mpirun jobs (`calibrate-links`, one per transport) under a bounded wait, so a transport that fails
// or hangs is reported with its reason and never hangs calibrate; progress goes to stderr, one line per
// measurement, "calibrate: [i/N] what".
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/communicator.h"

namespace ms {

inline constexpr const char* kDeviceProfileFormat = "meshstudio-device-profile";
inline constexpr int kDeviceProfileVersion = 1;

// The transports `--links` names: "shm" (Open MPI's shared-memory btl) and "tcp" (its TCP btl, over this
// machine's loopback); and the link `--hosts A,B` measures between two hosts, "net" (the TCP btl from one
// host to the other, over the interfaces Open MPI picks or its environment names), the link type a mesh
// names `<profile>.net` between its nodes.
inline constexpr const char* kLinkShm = "shm";
inline constexpr const char* kLinkTcp = "tcp";
inline constexpr const char* kLinkNet = "net";

struct CalibrateOptions {
  std::string out;                 // the profile's file; "" writes it to stdout
  bool quick = false;              // the small grids (tests)
  std::vector<int> threads;        // thread counts for compute; empty: defaultCalibrationThreads(cores)
  std::vector<std::string> links;  // kLinkShm / kLinkTcp, in order; empty: no links
  std::vector<std::string> hosts;  // two hosts: also measure kLinkNet, one rank on each; empty: not
  std::string exe;                 // the engine started under mpirun for the links; "": this binary
  std::string command;             // the command line, recorded as machine.command
  double linkTimeoutS = 120;       // one transport's mpirun job, start to end
};

// 1, then the powers of 2 below cores, then cores: {1, 2} on 2 cores, {1, 2, 4, 6} on 6.
std::vector<int> defaultCalibrationThreads(int cores);

// "a,b,,c" -> {"a", "b", "", "c"}; "" -> {""}.
std::vector<std::string> splitCommaList(const std::string& text);

// The --threads value: integers from 1 to 4096 separated by commas, each once. The error names --threads.
Expected<std::vector<int>> parseThreadList(const std::string& text);

// The --links value: "none" (no links), or kLinkShm / kLinkTcp separated by commas, each once. The error
// names --links and what it takes.
Expected<std::vector<std::string>> parseLinkList(const std::string& text);

// The --hosts value: exactly two different host names ("A,B"; letters, digits, '.', '_' and '-'), the
// hosts of the two ranks of the kLinkNet measurement. The error names --hosts and what it takes.
Expected<std::vector<std::string>> parseHostList(const std::string& text);

// Measures (links first, so a broken MPI fails in seconds) and writes the profile. The error says what
// failed: the output file (checked before measuring), a transport, a kernel.
Status runCalibrate(const CalibrateOptions& options);

// One rank of `calibrate-links` (what runCalibrate starts under mpirun): point-to-point and collective
// bandwidth and latency between the 2 ranks of world over message sizes; rank 0 writes the link's profile
// entry ({"name", "transport", "ranks", "measurements"}) to out and prints progress as measurement
// progressBase + 1, ... of progressTotal.
struct LinkRankOptions {
  std::string transport;  // kLinkShm, kLinkTcp or kLinkNet
  std::string out;
  bool quick = false;
  int progressBase = 0;
  int progressTotal = 0;
};
Status runCalibrateLinks(Communicator& world, const LinkRankOptions& options);

// nccl-tests' bus-bandwidth factor of a link op over `ranks` ranks (doc/PERFORMANCE.md): busbw = algbw *
// factor. 0 for an op it does not know.
double busBandwidthFactor(const std::string& op, int ranks);

}  // namespace ms
