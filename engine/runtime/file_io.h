// Durable file I/O for checkpoints and run artefacts: atomic writes (temporary file, fsync, rename, fsync
// of the directory), whole-file reads, mkdir -p, and the directory swap checkpoints use.
//
// What always holds: after a crash at any point, a path written with writeFileAtomic() or AtomicFileWriter
// holds either its complete old content or its complete new content, never a mix; a directory replaced
// with replaceDirectory() exists completely as `dir` or (between the two renames) as `dir + ".old"`. Every
// error names the path and the reason (strerror).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace ms {

// Streams a file to "<path>.tmp" and, on commit(), fsyncs it, renames it over `path` and fsyncs the
// directory. Destroyed without a successful commit(), it removes the temporary file.
class AtomicFileWriter {
 public:
  AtomicFileWriter() = default;
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  Status open(const std::string& path);
  Status append(const void* data, size_t bytes);
  Status commit();

 private:
  void abandon();
  std::string m_path;
  std::string m_tmpPath;
  int m_fd = -1;
};

// Writes `bytes` to path atomically (tmp + fsync + rename + directory fsync).
Status writeFileAtomic(const std::string& path, const std::string& bytes);
// The whole content of a file; the error names the file.
Expected<std::string> readFile(const std::string& path);
// A file's size and SHA-256 (FIPS 180-4, through OpenSSL's EVP interface), read in 1 MiB blocks; the error
// names the file.
struct FileDigest {
  uint64_t bytes = 0;
  std::string sha256;  // 64 lower-case hex digits
};
Expected<FileDigest> fileDigest(const std::string& path);
// One owner for a run folder: an exclusive flock(2) on "<dir>/.lock", held until the object is destroyed or
// the process ends (the kernel drops it with the process, so a killed run leaves no stale lock behind; the
// file stays, naming its last owner). The file holds the owner's pid, host and start time, which the refusal
// quotes. A process started by a holder that passes kRunLockHeldEnv (= the folder) in its environment
// (launch's ranks) shares the holder's lock instead of taking its own.
inline constexpr const char* kRunLockHeldEnv = "MESHSTUDIO_RUN_LOCK_HELD";
class RunFolderLock {
 public:
  RunFolderLock() = default;
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;
  ~RunFolderLock();
  // Takes the lock (creating dir), or says who holds it: "<dir>: in use by another run (pid P on host H,
  // since T); wait for it to end or choose another --run-dir".
  Status acquire(const std::string& dir);
  bool held() const { return m_fd >= 0 || m_shared; }

 private:
  int m_fd = -1;
  bool m_shared = false;
};

// mkdir -p; the error names the path.
Status makeDirs(const std::string& path);
// fsync of a directory, so that renames and new entries in it survive a crash.
Status syncDirectory(const std::string& dir);
// Replaces directory `dir` by the complete directory `staging`: rename dir to dir + ".old" if it exists,
// rename staging to dir, remove dir.old recursively. A crash at any point leaves either the old or the new
// checkpoint complete (as dir, or as dir.old with dir missing; a later call first restores such a dir.old
// to dir, and drops a stale dir.old left beside a complete dir).
Status replaceDirectory(const std::string& staging, const std::string& dir);

}  // namespace ms
