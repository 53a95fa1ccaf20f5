// What every fuzz target shares: FUZZ_CHECK aborts with a message when a reader breaks a promise of its
// header (libFuzzer then saves the input as a crash; the replay main fails its CTest test), a target records
// whether the reader accepted the input (replay_main.cpp holds seeds named ok-* and bad-* to it), and TempDir
// gives the readers that only take paths a private folder to read the input from.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#define FUZZ_CHECK(cond, ...)                                                       \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                            \
      std::fprintf(stderr, "\n");                                                   \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

namespace fuzz {

// What the reader made of the last input. replay_main.cpp resets it before each file and then requires
// Accepted of a seed named ok-*, Refused of one named bad-* (other names, as libFuzzer saves them, are
// only required not to crash).
enum class Outcome { None, Accepted, Refused };
inline Outcome lastOutcome = Outcome::None;
inline int outcome(bool accepted) {
  lastOutcome = accepted ? Outcome::Accepted : Outcome::Refused;
  return 0;
}

inline bool contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

// A folder under $TMPDIR (or /tmp) made once per process and removed at exit; write() replaces a file in it.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/meshstudio-fuzz-XXXXXX";
    if (!mkdtemp(pattern.data())) {
      std::perror("mkdtemp");
      std::abort();
    }
    m_path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(m_path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return m_path; }

  // Writes bytes to <dir>/<name> and returns that path; aborts when the file cannot be written (no input
  // should be blamed for a full disk).
  std::string write(const std::string& name, std::string_view bytes) const {
    const std::string file = m_path + "/" + name;
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::fprintf(stderr, "%s: cannot write the fuzz input\n", file.c_str());
      std::abort();
    }
    return file;
  }

 private:
  std::string m_path;
};

}  // namespace fuzz
