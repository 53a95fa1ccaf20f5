// The launch supervisor; see supervisor.h. Linux only: it finds the run's processes by session in /proc and
// adopts orphans as the child subreaper (prctl).
//
// What always holds: the only state a signal handler touches is g_forwardSignal (a sig_atomic_t), the one
// global here, as signal handlers need; every wait is bounded (poll with a timeout, SIGKILL killGraceS after
// SIGTERM, at most kSweepS to see the session empty).
#include "supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "runtime/file_io.h"
#include "runtime/heartbeat.h"
#include "runtime/metrics.h"

namespace ms {

namespace fs = std::filesystem;

namespace {

constexpr size_t kKeptLines = 400;  // of mpirun's stderr, for its failure report
constexpr size_t kMaxLineChars = 4096;
constexpr double kPollS = 0.2;
// A phase that may last long without a step (heartbeat.h "long_phase": startup, evaluation, a checkpoint
// write, the end) is allowed this many stall timeouts without progress (300 s at the default 10 s).
constexpr double kLongPhaseFactor = 30;
// An ordinary phase is allowed this many times the longest wait between progress changes the rank has shown
// in ordinary phases, when that exceeds the stall timeout (a model whose single forward takes a minute).
constexpr double kSlowActionFactor = 4;
constexpr double kSweepS = 5;  // at most this long to see every process of the session gone

volatile std::sig_atomic_t g_forwardSignal = 0;

void onForwardedSignal(int sig) {
  g_forwardSignal = sig;
}

double steadyS() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string signalName(int sig) {
  const char* d = strsignal(sig);
  return d ? d : "signal " + std::to_string(sig);
}

// Every process of session `sid` (/proc/<pid>/stat: "pid (comm) state ppid pgrp session ...").
std::vector<pid_t> sessionMembers(pid_t sid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "stat");
    std::string stat;
    if (!std::getline(in, stat)) continue;
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    long ppid = 0, pgrp = 0, session = 0;
    if (!(rest >> state >> ppid >> pgrp >> session)) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (session == sid && pid != getpid()) out.push_back(pid);
  }
  return out;
}

// Whether the file system holding dir has (nearly) no room left: a heartbeat that stopped there may be a
// full disk, not a stuck rank.
bool fileSystemFull(const std::string& dir) {
  struct statvfs st = {};
  return statvfs(dir.c_str(), &st) == 0 && double(st.f_bavail) * double(st.f_frsize) < 64.0 * 1024;
}

// Whether the process is stopped (state T in /proc/PID/stat: SIGSTOP, SIGTSTP or a tracer).
bool processStopped(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() &&
         (stat[paren + 2] == 'T' || stat[paren + 2] == 't');
}

void signalSession(pid_t sid, int sig) {
  for (pid_t pid : sessionMembers(sid)) kill(pid, sig);
}

// One rank's heartbeat as last read, and when (steady clock) it last changed: its beat (the process lives)
// and its progress counter (the training loop moves).
struct RankWatch {
  bool seen = false;
  double alive = -1;
  double changedAt = 0;
  double progress = -1;  // -1: a heartbeat without the counter
  double progressAt = 0;
  double activitySince = 0;  // the rank's own time (unix s) of its last setActivity
  double longestGap = 0;     // seconds between progress changes, the longest seen in ordinary phases
  bool longPhase = false;
  long pid = 0;
  std::string host;
  std::string activity;
  bool finished = false;
};

void readHeartbeat(const std::string& dir, int rank, double now, RankWatch& w) {
  std::ifstream in(dir + "/rank-" + std::to_string(rank) + ".json");
  if (!in) return;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return;
  const double alive = j.value("alive", 0.0);
  if (!w.seen || alive != w.alive) w.changedAt = now;
  const double progress = j.value("progress", -1.0);
  if (!w.seen || progress != w.progress) {
    // The longest wait for progress seen outside long phases: a rank whose single actions are slow (a large
    // model on CPUs) is given kSlowActionFactor of it before it counts as stuck.
    if (w.seen && !w.longPhase) w.longestGap = std::max(w.longestGap, now - w.progressAt);
    w.progressAt = now;
  }
  w.progress = progress;
  w.longPhase = j.value("long_phase", false);
  w.activitySince = j.value("activity_since", 0.0);
  w.seen = true;
  w.alive = alive;
  w.pid = j.value("pid", 0L);
  w.host = j.value("host", std::string());
  w.activity = j.value("activity", std::string());
  w.finished = j.value("finished", false);
}

// "rank 2 (pid 1234)", with " on HOST" when the rank ran on another machine than the supervisor.
std::string nameRank(int rank, long pid, const std::string& host) {
  std::string out = "rank " + std::to_string(rank);
  char self[256] = {};
  const bool remote = !host.empty() && gethostname(self, sizeof self - 1) == 0 && host != self;
  if (pid > 0 || remote) {
    out += " (";
    if (pid > 0) out += "pid " + std::to_string(pid) + (remote ? " " : "");
    if (remote) out += "on " + host;
    out += ")";
  }
  return out;
}

std::string whileDoing(const RankWatch& w) {
  return w.activity.empty() ? "" : " while " + w.activity;
}

std::string describeExit(int status) {
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + signalName(WTERMSIG(status)) +
           ")";
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

// The reason for a run whose mpirun ended with `status` (not 0), from Open MPI's report and the heartbeats.
std::string failureReason(int status, const std::vector<std::string>& lines,
                          const std::vector<RankWatch>& watches) {
  const supervisor_detail::RankFailure f = supervisor_detail::parseMpirunFailure(lines);
  if (f.rank < 0 || f.rank >= static_cast<int>(watches.size()))
    return "mpirun " + describeExit(status) + "; the run stopped";
  const RankWatch& w = watches[static_cast<size_t>(f.rank)];
  const std::string who = nameRank(f.rank, f.pid > 0 ? f.pid : w.pid, w.host);
  std::string what;
  if (f.signal > 0)
    what = "died (signal " + std::to_string(f.signal) + ", " +
           (f.signalName.empty() ? signalName(f.signal) : f.signalName) + ")";
  else if (f.aborted)
    what = "called MPI_Abort (error code " + std::to_string(f.exitCode) + ")";
  else if (f.exitCode >= 0)
    what = "exited with code " + std::to_string(f.exitCode);
  else
    what = "exited without finalizing MPI";
  return who + " " + what + whileDoing(w) + "; the run stopped";
}

// Copies what mpirun wrote to stderr to ours and keeps its last lines.
class StderrTee {
 public:
  explicit StderrTee(int fd) : m_fd(fd) {}
  // Reads what is there (at most 1 MiB, so that a flood of output cannot starve the watch); false at end
  // of file.
  bool pump() {
    char buf[8192];
    for (int reads = 0; reads < 128; ++reads) {
      const ssize_t n = read(m_fd, buf, sizeof buf);
      if (n == 0) return false;
      if (n < 0) return errno == EAGAIN || errno == EINTR;
      for (ssize_t off = 0; off < n;) {
        const ssize_t w = write(STDERR_FILENO, buf + off, static_cast<size_t>(n - off));
        if (w <= 0) break;
        off += w;
      }
      for (ssize_t i = 0; i < n; ++i) {
        if (buf[i] != '\n') {
          if (m_partial.size() < kMaxLineChars) m_partial += buf[i];
          continue;
        }
        m_lines.push_back(std::move(m_partial));
        m_partial.clear();
        if (m_lines.size() > kKeptLines) m_lines.pop_front();
      }
    }
    return true;
  }
  std::vector<std::string> lines() const {
    std::vector<std::string> out(m_lines.begin(), m_lines.end());
    if (!m_partial.empty()) out.push_back(m_partial);
    return out;
  }

 private:
  int m_fd;
  std::deque<std::string> m_lines;
  std::string m_partial;
};

// Installs the forwarding handler for SIGINT, SIGTERM and SIGHUP, ignores SIGPIPE (a closed stderr must not
// kill the supervisor and orphan the run), and puts the old dispositions back when destroyed.
class SignalForwarding {
 public:
  SignalForwarding() {
    g_forwardSignal = 0;
    struct sigaction sa = {};
    sa.sa_handler = onForwardedSignal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < kForwarded.size(); ++i) sigaction(kForwarded[i], &sa, &m_old[i]);
    struct sigaction ignore = {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, &m_oldPipe);
  }
  ~SignalForwarding() {
    for (size_t i = 0; i < kForwarded.size(); ++i) sigaction(kForwarded[i], &m_old[i], nullptr);
    sigaction(SIGPIPE, &m_oldPipe, nullptr);
  }

 private:
  static constexpr std::array<int, 3> kForwarded = {SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> m_old = {};
  struct sigaction m_oldPipe = {};
};

// Starts the command in a new session with stderr into a pipe; returns its pid and the pipe's read end.
Expected<std::pair<pid_t, int>> spawn(const std::vector<std::string>& command) {
  int err[2], execErr[2];
  if (pipe2(err, O_CLOEXEC) != 0 || pipe2(execErr, O_CLOEXEC) != 0)
    return Status::error(std::string("cannot create a pipe: ") + std::strerror(errno));
  std::vector<std::string> words = command;
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return Status::error(std::string("cannot fork: ") + std::strerror(errno));
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec.
    setsid();
    // Should the supervisor itself be killed, mpirun gets SIGTERM and takes the ranks down with it.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    dup2(err[1], STDERR_FILENO);
    const int devNull = open("/dev/null", O_RDONLY);
    if (devNull >= 0) dup2(devNull, STDIN_FILENO);
    signal(SIGPIPE, SIG_DFL);
    execvp(argv[0], argv.data());
    const int e = errno;
    (void)!write(execErr[1], &e, sizeof e);
    _exit(127);
  }
  close(err[1]);
  close(execErr[1]);
  int e = 0;
  ssize_t n;
  do n = read(execErr[0], &e, sizeof e);
  while (n < 0 && errno == EINTR);
  close(execErr[0]);
  if (n == sizeof e) {
    waitpid(pid, nullptr, 0);
    close(err[0]);
    return Status::error("cannot run " + command[0] + ": " + std::strerror(e));
  }
  fcntl(err[0], F_SETFL, fcntl(err[0], F_GETFL) | O_NONBLOCK);
  return std::make_pair(pid, err[0]);
}

}  // namespace

namespace supervisor_detail {

RankFailure parseMpirunFailure(const std::vector<std::string>& lines) {
  // Open MPI wraps its reports over lines; match them on the joined text.
  std::string text;
  for (const std::string& l : lines) text += l + " ";
  RankFailure f;
  std::smatch m;
  const std::regex signalled(
      R"(process rank (\d+) with PID (\d+) on node \S+ exited on signal (\d+)(?: \(([^)]*)\))?)");
  const std::regex exitCode(R"(Process name: \[\[\d+,\d+\],(\d+)\]\s+Exit code:\s+(-?\d+))");
  const std::regex aborted(
      R"(MPI_ABORT was invoked on rank (\d+) in communicator \S+\s+with errorcode (-?\d+))");
  const std::regex improper(R"(process rank (\d+) with PID (\d+) on\s+node \S+ exiting improperly)");
  if (std::regex_search(text, m, signalled)) {
    f.rank = std::stoi(m[1]);
    f.pid = std::stol(m[2]);
    f.signal = std::stoi(m[3]);
    f.signalName = m[4];
  } else if (std::regex_search(text, m, aborted)) {
    f.rank = std::stoi(m[1]);
    f.exitCode = std::stoi(m[2]);
    f.aborted = true;
  } else if (std::regex_search(text, m, exitCode)) {
    f.rank = std::stoi(m[1]);
    f.exitCode = std::stoi(m[2]);
  } else if (std::regex_search(text, m, improper)) {
    f.rank = std::stoi(m[1]);
    f.pid = std::stol(m[2]);
  }
  return f;
}

namespace {

// The end of a metrics stream: its last line and last step line (null when none), its clock.
struct StreamTail {
  nlohmann::json last, lastStep;
  double lastT = -1;  // the stream's clock, when its lines carry one
  bool endsWithNewline = true;
};

// Reads backwards from the end in growing chunks until a step line (or the start) is found.
std::optional<StreamTail> readTail(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  std::string tail;
  StreamTail t;
  for (std::streamoff chunk = 1 << 16;; chunk *= 4) {
    const std::streamoff from = std::max<std::streamoff>(0, size - chunk);
    tail.assign(static_cast<size_t>(size - from), '\0');
    in.seekg(from);
    in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
    t = StreamTail{};
    t.endsWithNewline = tail.empty() || tail.back() == '\n';
    std::istringstream lines(tail);
    std::string line;
    bool first = from > 0;  // the chunk's first line may be cut
    while (std::getline(lines, line)) {
      if (std::exchange(first, false) || line.empty()) continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        t.last = nlohmann::json();
        continue;
      }
      if (j.value("type", "") == "step") t.lastStep = j;
      if (j.contains("t") && j["t"].is_number()) t.lastT = j["t"].get<double>();
      t.last = std::move(j);
    }
    if (!t.lastStep.is_null() || from == 0) break;
  }
  return t;
}

}  // namespace

std::string lastRunEndStatus(const std::string& path) {
  const auto t = readTail(path);
  if (!t || !t->last.is_object() || t->last.value("type", "") != "run_end") return {};
  return t->last.value("status", "");
}

Status appendRunEnd(const std::string& path, const std::string& status, const std::string& reason) {
  const auto tail = readTail(path);
  if (!tail) return Status::ok();
  const nlohmann::json& last = tail->last;
  const nlohmann::json& lastStep = tail->lastStep;
  const double lastT = tail->lastT;
  const bool endsWithNewline = tail->endsWithNewline;
  if (last.is_object() && last.value("type", "") == "run_end") {
    const std::string was = last.value("status", "");
    // A rank's own "ok" stands; so does any run_end when the run was only interrupted. A rank's "error"
    // or "interrupted" (it was stopped by mpirun's clean-up) is followed by the supervisor's reason.
    if (was == "ok" || status == "interrupted") return Status::ok();
  }
  const int64_t step = lastStep.is_object() ? lastStep.value("step", int64_t(0)) : 0;
  // "t" continues the stream's clock when it has one: its last t plus the time since the file last changed.
  double t = 0;
  if (lastT >= 0) {
    std::error_code ec;
    const auto mtime = fs::last_write_time(path, ec);
    const double idle =
        ec ? 0.0 : std::chrono::duration<double>(fs::file_time_type::clock::now() - mtime).count();
    t = lastT + std::max(0.0, idle);
  }
  nlohmann::json fields = {{"t", t}, {"status", status}, {"reason", reason}, {"step", step}};
  if (!endsWithNewline) {
    // Rank 0 was killed in the middle of a line: end it, so that ours stands on a line of its own.
    std::FILE* f = std::fopen(path.c_str(), "a");
    if (!f || std::fputc('\n', f) == EOF || std::fclose(f) != 0)
      return Status::error(path + ": cannot append: " + std::strerror(errno));
  }
  MetricsWriter writer;
  MS_TRY(writer.open("", path, /*append=*/true));
  writer.write("run_end", std::move(fields));
  return writer.status();
}

}  // namespace supervisor_detail

Status superviseRun(const SupervisorOptions& options, bool* interrupted) {
  const double startUnix = unixTimeS();
  // The run folder is this run's before its heartbeat files are touched (another launch's are not ours to
  // clear); the ranks share the lock through kRunLockHeldEnv.
  RunFolderLock lock;
  if (!options.runDir.empty()) {
    MS_TRY(lock.acquire(options.runDir));
    std::error_code ec;
    setenv(kRunLockHeldEnv, fs::weakly_canonical(options.runDir, ec).c_str(), 1);
  }
  MS_TRY(makeDirs(options.heartbeatDir));
  {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(options.heartbeatDir, ec))
      if (entry.path().filename().string().rfind("rank-", 0) == 0) fs::remove(entry.path(), ec);
  }
  setenv(kHeartbeatDirEnv, options.heartbeatDir.c_str(), 1);
  // Orphaned ranks (mpirun gone before them) become our children, so that we can reap them.
  prctl(PR_SET_CHILD_SUBREAPER, 1);

  SignalForwarding forwarding;
  auto spawned = spawn(options.command);
  if (!spawned) return spawned.status();
  const pid_t child = spawned->first;
  const int errFd = spawned->second;
  StderrTee tee(errFd);
  bool pipeOpen = true;

  const double start = steadyS();
  std::vector<RankWatch> watches(static_cast<size_t>(std::max(options.ranks, 0)));
  double nextCheck = start + kHeartbeatPeriodS;
  double killAt = -1;  // SIGKILL to the session then
  std::string reason;  // the first failure seen
  std::string endStatus = "error";
  int userSignal = 0;
  int userSignals = 0;  // how many: the first stops gracefully, the next ones stop hard
  int childStatus = 0;
  bool childDone = false;
  double mpirunStoppedAt = -1;

  while (!childDone) {
    if (pipeOpen) {
      pollfd p = {errFd, POLLIN, 0};
      poll(&p, 1, static_cast<int>(kPollS * 1000));
      pipeOpen = tee.pump();
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(kPollS));
    }
    if (const int sig = g_forwardSignal; sig != 0) {
      g_forwardSignal = 0;
      userSignal = sig;
      // The first SIGINT or SIGTERM asks the ranks to stop after their step (checkpoint saved, run_end
      // "interrupted"): mpirun forwards SIGUSR1 to every rank, local or remote, while it answers SIGINT and
      // SIGTERM by killing the job. A second signal, or SIGHUP (the terminal went away), stops hard.
      if (++userSignals == 1 && sig != SIGHUP)
        kill(child, SIGUSR1);
      else
        kill(child, sig == SIGHUP ? SIGTERM : sig);
    }
    for (;;) {
      int st = 0;
      const pid_t pid = waitpid(-1, &st, WNOHANG);
      if (pid <= 0) break;
      if (pid == child) {
        childDone = true;
        childStatus = st;
      }
    }
    const double now = steadyS();
    if (killAt > 0 && now >= killAt) {
      signalSession(child, SIGKILL);
      killAt = -1;
    }
    if (childDone || !reason.empty() || userSignal || options.stallTimeoutS <= 0 || now < nextCheck) continue;
    nextCheck = now + kHeartbeatPeriodS;
    // mpirun itself: stopped (SIGSTOP, a debugger) for the stall timeout, the run cannot go on.
    if (processStopped(child)) {
      if (mpirunStoppedAt < 0) mpirunStoppedAt = now;
      if (now - mpirunStoppedAt > options.stallTimeoutS)
        reason = "mpirun (pid " + std::to_string(child) + ") has been stopped for " +
                 std::to_string(static_cast<long>(now - mpirunStoppedAt)) +
                 " s (SIGSTOP or a debugger); the run was stopped";
    } else {
      mpirunStoppedAt = -1;
    }
    for (size_t r = 0; r < watches.size(); ++r)
      readHeartbeat(options.heartbeatDir, static_cast<int>(r), now, watches[r]);
    // A rank alive whose training loop has not moved for the bound of its phase: the one stuck longest is the
    // cause (the others block on it later), by the ranks' own times of their last activity (the beats are
    // 0.5 s apart, too coarse to tell a rank from the one that blocked on it a millisecond later).
    int stuck = -1;
    for (size_t r = 0; r < watches.size(); ++r) {
      const RankWatch& w = watches[r];
      if (!w.seen || w.finished || w.progress < 0) continue;
      const double bound = w.longPhase ? options.stallTimeoutS * kLongPhaseFactor
                                       : std::max(options.stallTimeoutS, kSlowActionFactor * w.longestGap);
      if (now - w.progressAt > bound &&
          (stuck < 0 || w.activitySince < watches[static_cast<size_t>(stuck)].activitySince))
        stuck = static_cast<int>(r);
    }
    for (size_t r = 0; r < watches.size() && reason.empty(); ++r) {
      RankWatch& w = watches[r];
      if (w.finished) continue;
      std::string what;
      if (w.seen && now - w.changedAt > options.stallTimeoutS && fileSystemFull(options.heartbeatDir))
        what = "no space left on the file system of " + options.heartbeatDir + ": " +
               nameRank(static_cast<int>(r), w.pid, w.host) + " could not write its heartbeat for " +
               std::to_string(static_cast<long>(now - w.changedAt)) + " s" + whileDoing(w);
      else if (w.seen && now - w.changedAt > options.stallTimeoutS)
        what = nameRank(static_cast<int>(r), w.pid, w.host) + " stopped responding for " +
               std::to_string(static_cast<long>(now - w.changedAt)) + " s" + whileDoing(w);
      else if (static_cast<int>(r) == stuck)
        what = nameRank(static_cast<int>(r), w.pid, w.host) + " made no progress for " +
               std::to_string(static_cast<long>(now - w.progressAt)) + " s" + whileDoing(w) +
               " (its process is alive: the training loop is stuck)";
      else if (!w.seen && now - start > options.startupGraceS)
        what = "rank " + std::to_string(r) + " did not start within " +
               std::to_string(static_cast<long>(options.startupGraceS)) + " s (no heartbeat in " +
               options.heartbeatDir + ")";
      if (what.empty()) continue;
      reason = what + "; the run was stopped";
    }
    if (!reason.empty()) {
      const std::string said = reason.substr(0, reason.size() - std::string("; the run was stopped").size());
      std::fprintf(stderr, "meshstudio-engine launch: %s; stopping every rank\n", said.c_str());
    }
    if (!reason.empty()) {
      signalSession(child, SIGTERM);
      signalSession(child, SIGCONT);  // a stopped rank acts on SIGTERM only once continued
      killAt = now + options.killGraceS;
    }
  }

  // mpirun is gone: nothing of its session may outlive it.
  const double sweepEnd = steadyS() + kSweepS;
  for (;;) {
    signalSession(child, SIGKILL);
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    if (sessionMembers(child).empty() || steadyS() > sweepEnd) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (const double drainEnd = steadyS() + 2; pipeOpen && steadyS() < drainEnd;) {
    pollfd p = {errFd, POLLIN, 0};
    poll(&p, 1, 100);
    pipeOpen = tee.pump();
  }
  close(errFd);

  const bool succeeded = WIFEXITED(childStatus) && WEXITSTATUS(childStatus) == 0;
  // Stopped on request and every rank ended cleanly: ranks stopped by our SIGUSR1 save their checkpoint,
  // write run_end "interrupted" and exit 0 (so mpirun reports no failure); a rank stopped by a signal of its
  // own exits with kExitInterrupted. Nothing failed either way; the stream says whether the run was cut short
  // or had just finished when the request came.
  if (reason.empty() && userSignal && userSignals == 1 && WIFEXITED(childStatus) &&
      (succeeded || WEXITSTATUS(childStatus) == kExitInterrupted)) {
    const bool cut = !succeeded || options.metricsFiles.empty() ||
                     supervisor_detail::lastRunEndStatus(options.metricsFiles.front()) != "ok";
    if (interrupted) *interrupted = cut;
    return Status::ok();
  }
  if (reason.empty() && succeeded) return Status::ok();
  if (reason.empty() && userSignal) {
    const char* name = userSignal == SIGINT ? "SIGINT" : userSignal == SIGTERM ? "SIGTERM" : "SIGHUP";
    reason = std::string("stopped by ") + name + "; mpirun " + describeExit(childStatus);
    endStatus = "interrupted";
  }
  if (reason.empty()) {
    for (size_t r = 0; r < watches.size(); ++r)
      readHeartbeat(options.heartbeatDir, static_cast<int>(r), steadyS(), watches[r]);
    reason = failureReason(childStatus, tee.lines(), watches);
  }
  std::string notes;
  for (const std::string& path : options.metricsFiles) {
    struct stat st = {};
    if (stat(path.c_str(), &st) != 0) continue;  // no such file: the run stopped before its stream began
    // An earlier run's stream, which this run never opened, is left alone (file times are coarse: 1 s slack).
    if (double(st.st_mtim.tv_sec) + 1e-9 * double(st.st_mtim.tv_nsec) < startUnix - 1) continue;
    if (Status s = supervisor_detail::appendRunEnd(path, endStatus, reason); !s) notes += "; " + s.message();
  }
  return Status::error(reason + notes);
}

}  // namespace ms
