// The main() of a fuzz target in a build without libFuzzer: runs every file named on the command line, or
// found (recursively, in sorted order) in a directory named there, through LLVMFuzzerTestOneInput once. CTest
// runs it over the target's seed corpus (fuzz_<x>_seeds), so the seeds, the inputs that once crashed a
// reader among them, are replayed by every ordinary build. A target checks its own invariants and aborts
// when one breaks; this exits non-zero when a file cannot be read or no file was found at all (a missing
// corpus must not pass as an empty one), or when a seed named ok-* was refused or one named bad-* accepted.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIRECTORY...\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg(argv[i]);
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      std::vector<fs::path> found;
      for (auto it = fs::recursive_directory_iterator(arg, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (it->is_regular_file(ec)) found.push_back(it->path());
      }
      if (ec) {
        std::fprintf(stderr, "%s: cannot list: %s\n", argv[i], ec.message().c_str());
        return 1;
      }
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::exists(arg, ec)) {
      files.push_back(arg);
    } else {
      std::fprintf(stderr, "%s: no such file or directory\n", argv[i]);
      return 1;
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "no input files found\n");
    return 1;
  }
  int failures = 0;
  for (const fs::path& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "%s: cannot open\n", path.c_str());
      return 1;
    }
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) {
      std::fprintf(stderr, "%s: read error\n", path.c_str());
      return 1;
    }
    std::printf("%s (%zu bytes): ", path.c_str(), bytes.size());
    std::fflush(stdout);  // a crash below leaves the file's name behind
    fuzz::lastOutcome = fuzz::Outcome::None;
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    const std::string name = path.filename().string();
    const char* got = fuzz::lastOutcome == fuzz::Outcome::Accepted  ? "accepted"
                      : fuzz::lastOutcome == fuzz::Outcome::Refused ? "refused"
                                                                    : "no outcome";
    const bool wrong = (name.rfind("ok-", 0) == 0 && fuzz::lastOutcome != fuzz::Outcome::Accepted) ||
                       (name.rfind("bad-", 0) == 0 && fuzz::lastOutcome != fuzz::Outcome::Refused);
    std::printf("%s%s\n", got, wrong ? ", which its name says it should not be" : "");
    std::fflush(stdout);
    failures += wrong;
  }
  std::printf("%zu inputs replayed, %d with the wrong outcome\n", files.size(), failures);
  return failures == 0 ? 0 : 1;
}
