// POSIX implementation of the durable file I/O in file_io.h.
//
// What always holds: every write goes to "<path>.tmp" first and reaches `path` only by rename(2) after
// fsync(2); failed writes remove their temporary file; every error message starts with the path.
#include "runtime/file_io.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <system_error>
#include <vector>

namespace ms {

namespace fs = std::filesystem;

namespace {

Status errnoError(const std::string& path, const std::string& what) {
  return Status::error(path + ": " + what + ": " + std::strerror(errno));
}

std::string parentDirectory(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace

AtomicFileWriter::~AtomicFileWriter() {
  abandon();
}

void AtomicFileWriter::abandon() {
  if (m_fd >= 0) {
    ::close(m_fd);
    m_fd = -1;
    ::unlink(m_tmpPath.c_str());
  }
}

Status AtomicFileWriter::open(const std::string& path) {
  abandon();
  m_path = path;
  m_tmpPath = path + ".tmp";
  m_fd = ::open(m_tmpPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (m_fd < 0) return errnoError(m_tmpPath, "cannot create");
  return Status::ok();
}

Status AtomicFileWriter::append(const void* data, size_t bytes) {
  if (m_fd < 0) return Status::error(m_path + ": write to a file that is not open");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(m_fd, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = errnoError(m_tmpPath, "write failed");
      abandon();
      return s;
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return Status::ok();
}

Status AtomicFileWriter::commit() {
  if (m_fd < 0) return Status::error(m_path + ": commit of a file that is not open");
  if (::fsync(m_fd) != 0) {
    Status s = errnoError(m_tmpPath, "fsync failed");
    abandon();
    return s;
  }
  const int fd = m_fd;
  m_fd = -1;
  if (::close(fd) != 0) {
    Status s = errnoError(m_tmpPath, "close failed");
    ::unlink(m_tmpPath.c_str());
    return s;
  }
  if (::rename(m_tmpPath.c_str(), m_path.c_str()) != 0) {
    Status s = errnoError(m_path, "cannot rename " + m_tmpPath + " over it");
    ::unlink(m_tmpPath.c_str());
    return s;
  }
  return syncDirectory(parentDirectory(m_path));
}

Status writeFileAtomic(const std::string& path, const std::string& bytes) {
  AtomicFileWriter writer;
  MS_TRY(writer.open(path));
  MS_TRY(writer.append(bytes.data(), bytes.size()));
  return writer.commit();
}

namespace {

// Reads fd to its end in blocks of `block` bytes, handing each to take(data, n); retries EINTR. The caller
// closes fd.
template <typename Take>
Status readToEnd(int fd, const std::string& path, size_t block, Take&& take) {
  std::vector<char> buf(block);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoError(path, "read failed");
    }
    if (n == 0) return Status::ok();
    take(buf.data(), static_cast<size_t>(n));
  }
}

}  // namespace

Expected<FileDigest> fileDigest(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errnoError(path, "cannot open");
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    ::close(fd);
    return Status::error(path + ": cannot start a SHA-256 digest (OpenSSL)");
  }
  FileDigest d;
  Status read = readToEnd(fd, path, size_t(1) << 20, [&](const char* data, size_t n) {
    d.bytes += n;
    EVP_DigestUpdate(ctx.get(), data, n);
  });
  ::close(fd);
  if (!read) return read;
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx.get(), md, &len) != 1) return Status::error(path + ": SHA-256 failed (OpenSSL)");
  static const char* hex = "0123456789abcdef";
  for (unsigned int i = 0; i < len; ++i) {
    d.sha256 += hex[md[i] >> 4];
    d.sha256 += hex[md[i] & 15];
  }
  return d;
}

RunFolderLock::~RunFolderLock() {
  if (m_fd >= 0) ::close(m_fd);  // drops the flock
}

Status RunFolderLock::acquire(const std::string& dir) {
  MS_TRY(makeDirs(dir));
  std::error_code ec;
  const std::string canonical = std::filesystem::weakly_canonical(dir, ec).string();
  if (const char* held = std::getenv(kRunLockHeldEnv); held && canonical == held) {
    m_shared = true;
    return Status::ok();
  }
  const std::string path = dir + "/.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return errnoError(path, "cannot open the run folder's lock");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string owner;
    char buf[256];
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    if (n > 0) owner.assign(buf, static_cast<size_t>(n));
    while (!owner.empty() && (owner.back() == '\n' || owner.back() == ' ')) owner.pop_back();
    ::close(fd);
    if (err != EWOULDBLOCK) return Status::error(path + ": cannot lock: " + std::strerror(err));
    return Status::error(dir + ": in use by another run (" + (owner.empty() ? "owner unknown" : owner) +
                         "); wait for it to end or choose another --run-dir");
  }
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  const std::string owner =
      "pid " + std::to_string(::getpid()) + " on host " + host + ", since " + when + "\n";
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, owner.data(), owner.size(), 0) != static_cast<ssize_t>(owner.size())) {
    Status s = errnoError(path, "cannot write the run folder's lock");
    ::close(fd);
    return s;
  }
  m_fd = fd;
  return Status::ok();
}

Expected<std::string> readFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errnoError(path, "cannot open");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s = errnoError(path, "cannot stat");
    ::close(fd);
    return s;
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return Status::error(path + ": is a directory, expected a file");
  }
  std::string out;
  out.reserve(static_cast<size_t>(st.st_size));
  Status read =
      readToEnd(fd, path, size_t(1) << 16, [&](const char* data, size_t n) { out.append(data, n); });
  ::close(fd);
  if (!read) return read;
  return out;
}

Status makeDirs(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return Status::error(path + ": cannot create directory: " + ec.message());
  if (!fs::is_directory(path, ec)) return Status::error(path + ": exists and is not a directory");
  return Status::ok();
}

Status syncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errnoError(dir, "cannot open directory to fsync");
  const int rc = ::fsync(fd);
  Status s = rc == 0 ? Status::ok() : errnoError(dir, "fsync of the directory failed");
  ::close(fd);
  return s;
}

Status replaceDirectory(const std::string& staging, const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(staging, ec)) return Status::error(staging + ": staging directory does not exist");
  const std::string old = dir + ".old";
  const std::string parent = parentDirectory(dir);
  const bool haveDir = fs::exists(dir, ec);
  const bool haveOld = fs::exists(old, ec);
  if (haveOld && haveDir) {
    // A crash during the final removal of an earlier call: dir is complete, old is garbage.
    fs::remove_all(old, ec);
    if (ec) return Status::error(old + ": cannot remove stale directory: " + ec.message());
  } else if (haveOld) {
    // A crash between the two renames of an earlier call: old is the last complete checkpoint.
    if (::rename(old.c_str(), dir.c_str()) != 0) return errnoError(dir, "cannot restore it from " + old);
  }
  const bool replacing = fs::exists(dir, ec);
  if (replacing) {
    if (::rename(dir.c_str(), old.c_str()) != 0) return errnoError(dir, "cannot rename it to " + old);
    MS_TRY(syncDirectory(parent));
  }
  if (::rename(staging.c_str(), dir.c_str()) != 0) {
    Status s = errnoError(dir, "cannot rename " + staging + " to it");
    if (replacing) ::rename(old.c_str(), dir.c_str());  // put the old checkpoint back
    return s;
  }
  MS_TRY(syncDirectory(parent));
  if (replacing) {
    fs::remove_all(old, ec);
    if (ec) return Status::error(old + ": cannot remove the previous checkpoint: " + ec.message());
  }
  return Status::ok();
}

}  // namespace ms
