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
#include <cmath>
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

#include "common/metrics_schema.h"
#include "runtime/file_io.h"
#include "runtime/heartbeat.h"
#include "runtime/metrics.h"

namespace ms {

namespace fs = std::filesystem;

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

void signalSession(pid_t sid, int sig) {
  for (pid_t pid : sessionMembers(sid)) kill(pid, sig);
}

namespace {

constexpr size_t kKeptLines = 400;  // of mpirun's stderr, for its failure report
constexpr size_t kMaxLineChars = 4096;
constexpr size_t kMaxReasonChars = 600;  // of a rank's own last words in the reason
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
  bool waiting = false;  // its activity waits for other ranks (heartbeat.h)
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
  w.waiting = j.value("waiting", false);
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

// " while <activity>"; for a rank that has died in a short action, said to be as of its last heartbeat (the
// beats are kHeartbeatPeriodS apart, so it may have moved on since); a long phase and its end are written
// through at once (heartbeat.h), so they need no such note.
std::string whileDoing(const RankWatch& w, bool died = false) {
  if (w.activity.empty()) return "";
  std::string out = " while " + w.activity;
  if (died && !w.longPhase) {
    char note[96];
    std::snprintf(note, sizeof note, " (as of its last heartbeat: it may have gone on for up to %.1f s)",
                  kHeartbeatPeriodS);
    out += note;
  }
  return out;
}

std::string describeExit(int status) {
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + signalName(WTERMSIG(status)) +
           ")";
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

// The first rank that said why it failed, in mpirun's stderr (main.cpp: "meshstudio-engine train: rank N:
// <reason>"): the first failure is the cause, later ones (a peer timing out on it, "another rank failed")
// its effects. rank -1 when none did.
struct OwnWords {
  int rank = -1;
  std::string text;
};
OwnWords firstOwnWords(const std::vector<std::string>& lines) {
  static const std::regex own(R"(^meshstudio-engine train: rank (\d+): (.*)$)");
  for (const std::string& line : lines) {
    std::smatch m;
    if (!std::regex_match(line, m, own)) continue;
    OwnWords w{std::stoi(m[1]), m[2]};
    if (w.text.size() > kMaxReasonChars) w.text = w.text.substr(0, kMaxReasonChars) + "...";
    return w;
  }
  return {};
}

// The reason for a run whose mpirun ended with `status` (not 0), from Open MPI's report, the ranks' own words
// and the heartbeats: "rank 2 (pid 1234) died (signal 9, Killed) while step 12: ...; the run stopped", or,
// when another rank failed first and said why, "rank 1 (pid 99) failed: <its words>; then rank 0 (pid 98)
// called MPI_Abort ...".
std::string failureReason(int status, const std::vector<std::string>& lines,
                          const std::vector<RankWatch>& watches) {
  const supervisor_detail::RankFailure f = supervisor_detail::parseMpirunFailure(lines);
  const OwnWords first = firstOwnWords(lines);
  const int ranks = static_cast<int>(watches.size());
  std::string cause;
  // A rank killed by a signal is the cause whatever the others said (their errors follow from its death).
  if (first.rank >= 0 && first.rank < ranks && first.rank != f.rank && f.signal == 0) {
    const RankWatch& w = watches[static_cast<size_t>(first.rank)];
    cause = nameRank(first.rank, w.pid, w.host) + " failed: " + first.text + "; then ";
  }
  if (f.rank < 0 || f.rank >= ranks) return cause + "mpirun " + describeExit(status) + "; the run stopped";
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
  // The rank's own words, when it was the first to fail and said why: the cause, where Open MPI only saw the
  // effect.
  const std::string said = first.rank == f.rank ? ": " + first.text : "";
  return cause + who + " " + what + whileDoing(w, /*died=*/true) + said + "; the run stopped";
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
  double lastT = -1;     // the run's clock ("t") on the last line that has it
  double lastTime = -1;  // that line's Unix time ("time")
  bool endsWithNewline = true;
};

// Reads backwards from the end in growing chunks until a step line (or the start) is found.
std::optional<StreamTail> readTail(const std::string& path) {
  namespace key = metrics::key;
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
      if (j.value(key::kType, "") == metrics::type::kStep) t.lastStep = j;
      const auto clock = j.find(key::kT);
      const auto time = j.find(key::kTime);
      if (clock != j.end() && clock->is_number() && time != j.end() && time->is_number()) {
        t.lastT = clock->get<double>();
        t.lastTime = time->get<double>();
      }
      t.last = std::move(j);
    }
    if (!t.lastStep.is_null() || from == 0) break;
  }
  return t;
}

}  // namespace

std::string lastRunEndStatus(const std::string& path) {
  namespace key = metrics::key;
  const auto t = readTail(path);
  if (!t || !t->last.is_object() || t->last.value(key::kType, "") != metrics::type::kRunEnd) return {};
  return t->last.value(key::kStatus, "");
}

Expected<nlohmann::json> appendRunEnd(const std::string& path, const std::string& status,
                                      const std::string& reason) {
  namespace key = metrics::key;
  const auto tail = readTail(path);
  if (!tail) return nlohmann::json();
  const nlohmann::json& last = tail->last;
  const nlohmann::json& lastStep = tail->lastStep;
  if (last.is_object() && last.value(key::kType, "") == metrics::type::kRunEnd) {
    const std::string was = last.value(key::kStatus, "");
    // A rank's own "ok" stands; so does any run_end when the run was only interrupted. A rank's "error"
    // or "interrupted" (it was stopped by mpirun's clean-up) is followed by the supervisor's reason.
    if (was == metrics::status::kOk || status == metrics::status::kInterrupted) return nlohmann::json();
  }
  const int64_t step = lastStep.is_object() ? lastStep.value(key::kStep, int64_t(0)) : 0;
  nlohmann::json fields = {{key::kStatus, status}, {key::kReason, reason}, {key::kStep, step}};
  // "t" continues the run's clock: the last line's t plus the wall time since that line was written (both
  // clocks are this machine's when rank 0 ran here; the stream has no "t" before its run_start).
  if (tail->lastT >= 0) fields[key::kT] = tail->lastT + std::max(0.0, unixTimeS() - tail->lastTime);
  // The wall time set here, not by each write: stdout's copy of this line must be the same line (its time
  // once crossed a millisecond between the two writes, and tst_failure compared them unequal).
  fields[key::kTime] = std::round(unixTimeS() * 1e3) / 1e3;
  if (!tail->endsWithNewline) {
    // Rank 0 was killed in the middle of a line: end it, so that ours stands on a line of its own.
    std::FILE* f = std::fopen(path.c_str(), "a");
    if (!f || std::fputc('\n', f) == EOF || std::fclose(f) != 0)
      return Status::error(path + ": cannot append: " + std::strerror(errno));
  }
  MetricsWriter writer;
  MS_TRY(writer.open("", path, /*append=*/true));
  writer.write(metrics::type::kRunEnd, fields);
  MS_TRY(writer.status());
  return fields;
}

}  // namespace supervisor_detail

namespace {

// One supervised run, in the order it happens:
//   claim()    the run folder's lock (shared with the ranks through kRunLockHeldEnv), a clean heartbeat
//              folder, and the child subreaper role (orphaned ranks become ours to reap);
//   start()    mpirun in a session of its own, its stderr into a pipe;
//   watch()    until mpirun ends: copy its stderr, forward the user's signals, reap, and every heartbeat
//              period look for a stopped mpirun or a dead, stopped or stuck rank (check()), stopping the
//              session when one is found;
//   sweep()    nothing of the session outlives mpirun; the rest of its stderr is read;
//   conclude() the outcome: ok, interrupted, or the one-line reason, with a run_end for every stream.
class Supervision {
 public:
  Supervision(const SupervisorOptions& options, bool* interrupted)
      : m_options(options), m_interrupted(interrupted) {}

  Status run() {
    if (Status s = claim(); !s) return notStarted(s);
    SignalForwarding forwarding;
    if (Status s = start(); !s) return notStarted(s);
    watch();
    sweep();
    return conclude();
  }

 private:
  Status claim() {
    m_startUnix = unixTimeS();
    // The run folder is this run's before its heartbeat files are touched (another launch's are not ours
    // to clear); the ranks share the lock through kRunLockHeldEnv.
    if (!m_options.runDir.empty()) {
      MS_TRY(m_lock.acquire(m_options.runDir));
      std::error_code ec;
      setenv(kRunLockHeldEnv, fs::weakly_canonical(m_options.runDir, ec).c_str(), 1);
    }
    MS_TRY(makeDirs(m_options.heartbeatDir));
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(m_options.heartbeatDir, ec))
      if (entry.path().filename().string().rfind("rank-", 0) == 0) fs::remove(entry.path(), ec);
    setenv(kHeartbeatDirEnv, m_options.heartbeatDir.c_str(), 1);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    return Status::ok();
  }

  Status start() {
    auto spawned = spawn(m_options.command);
    if (!spawned) return spawned.status();
    m_child = spawned->first;
    m_errFd = spawned->second;
    m_tee.emplace(m_errFd);
    m_pipeOpen = true;
    m_start = steadyS();
    m_watches.assign(static_cast<size_t>(std::max(m_options.ranks, 0)), RankWatch{});
    m_nextCheck = m_start + kHeartbeatPeriodS;
    return Status::ok();
  }

  void watch() {
    while (!m_childDone) {
      if (m_pipeOpen) {
        pollfd p = {m_errFd, POLLIN, 0};
        poll(&p, 1, static_cast<int>(kPollS * 1000));
        m_pipeOpen = m_tee->pump();
      } else {
        std::this_thread::sleep_for(std::chrono::duration<double>(kPollS));
      }
      forwardSignals();
      reap();
      const double now = steadyS();
      resendStopToLateRanks(now);
      if (m_killAt > 0 && now >= m_killAt) {
        signalSession(m_child, SIGKILL);
        m_killAt = -1;
      }
      if (m_childDone || !m_reason.empty() || m_userSignal || m_options.stallTimeoutS <= 0 ||
          now < m_nextCheck)
        continue;
      m_nextCheck = now + kHeartbeatPeriodS;
      m_reason = check(now);
      if (m_reason.empty()) continue;
      std::fprintf(stderr, "meshstudio-engine launch: %s; stopping every rank\n", m_reason.c_str());
      m_reason += "; the run was stopped";
      signalSession(m_child, SIGTERM);
      signalSession(m_child, SIGCONT);  // a stopped rank acts on SIGTERM only once continued
      m_killAt = now + m_options.killGraceS;
    }
  }

  // The first SIGINT or SIGTERM asks the ranks to stop after their step (checkpoint saved, run_end
  // "interrupted"): mpirun forwards SIGUSR1 to every rank, local or remote, while it answers SIGINT and
  // SIGTERM by killing the job. A second signal, or SIGHUP (the terminal went away), stops hard.
  void forwardSignals() {
    const int sig = g_forwardSignal;
    if (sig == 0) return;
    g_forwardSignal = 0;
    m_userSignal = sig;
    if (++m_userSignals == 1 && sig != SIGHUP)
      kill(m_child, SIGUSR1);
    else
      kill(m_child, sig == SIGHUP ? SIGTERM : sig);
  }

  // A graceful stop asked for before every rank runs would be lost: mpirun forwards SIGUSR1 only to the
  // ranks it has started, and a rank that has not yet installed its handler dies of it (which ends the run
  // too). So until every rank has beaten (its handler is installed before its heartbeat starts), the request
  // is sent again every heartbeat period, and once more when all have: a send while the last rank was still
  // being started was dropped by mpirun (seen once in a CI run when ranks started within 0.1 s, the stop
  // then ending only by the client's 20 s escalation). A rank that has it already only sets its flag again.
  void resendStopToLateRanks(double now) {
    if (m_userSignals != 1 || m_userSignal == SIGHUP || m_childDone || m_stopReachedAll || now < m_nextResend)
      return;
    m_nextResend = now + kHeartbeatPeriodS;
    bool all = true;
    for (size_t r = 0; r < m_watches.size(); ++r) {
      readHeartbeat(m_options.heartbeatDir, static_cast<int>(r), now, m_watches[r]);
      all = all && m_watches[r].seen;
    }
    kill(m_child, SIGUSR1);
    m_stopReachedAll = all;
  }

  void reap() {
    for (;;) {
      int st = 0;
      const pid_t pid = waitpid(-1, &st, WNOHANG);
      if (pid <= 0) return;
      if (pid == m_child) {
        m_childDone = true;
        m_childStatus = st;
      }
    }
  }

  // What stops the run now, "" when nothing does: mpirun stopped, or a rank dead, stopped, stuck or never
  // started, by the heartbeats (supervisor.h says the bounds).
  std::string check(double now) {
    // mpirun itself: stopped (SIGSTOP, a debugger) for the stall timeout, the run cannot go on.
    if (processStopped(m_child)) {
      if (m_mpirunStoppedAt < 0) m_mpirunStoppedAt = now;
      if (now - m_mpirunStoppedAt > m_options.stallTimeoutS)
        return "mpirun (pid " + std::to_string(m_child) + ") has been stopped for " +
               std::to_string(static_cast<long>(now - m_mpirunStoppedAt)) + " s (SIGSTOP or a debugger)";
    } else {
      m_mpirunStoppedAt = -1;
    }
    for (size_t r = 0; r < m_watches.size(); ++r)
      readHeartbeat(m_options.heartbeatDir, static_cast<int>(r), now, m_watches[r]);
    int stuck = stuckLongest(now);
    // A rank whose heartbeats have stopped (a stopped or frozen process) is the cause of any rank stuck
    // waiting on it: while one is silent, its silence is reported when it crosses the timeout (within the
    // timeout from now), not the live rank blocked on it. Seen in tst_failure stoppedRankEndsTheRun: rank 3
    // SIGSTOPped, rank 2 stuck in the gradient sync crossed its bound 0.1 s before rank 3's silence did.
    for (const RankWatch& w : m_watches)
      if (stuck >= 0 && w.seen && !w.finished && now - w.changedAt > 3 * kHeartbeatPeriodS) stuck = -1;
    for (size_t r = 0; r < m_watches.size(); ++r) {
      const RankWatch& w = m_watches[r];
      if (w.finished) continue;
      const std::string who = nameRank(static_cast<int>(r), w.pid, w.host);
      const double silent = now - w.changedAt;
      if (w.seen && silent > m_options.stallTimeoutS && fileSystemFull(m_options.heartbeatDir))
        return "no space left on the file system of " + m_options.heartbeatDir + ": " + who +
               " could not write its heartbeat for " + std::to_string(static_cast<long>(silent)) + " s" +
               whileDoing(w);
      if (w.seen && silent > m_options.stallTimeoutS)
        return who + " stopped responding for " + std::to_string(static_cast<long>(silent)) + " s" +
               whileDoing(w);
      if (static_cast<int>(r) == stuck)
        return who + " made no progress for " + std::to_string(static_cast<long>(now - w.progressAt)) + " s" +
               whileDoing(w) + " (its process is alive: the training loop is stuck)";
      if (!w.seen && now - m_start > m_options.startupGraceS)
        return "rank " + std::to_string(r) + " did not start within " +
               std::to_string(static_cast<long>(m_options.startupGraceS)) + " s (no heartbeat in " +
               m_options.heartbeatDir + ")";
    }
    return {};
  }

  // The rank alive whose training loop has not moved for the bound of its phase, -1 for none; of several,
  // the one stuck longest is the cause (the others block on it later), by the ranks' own times of their last
  // activity (the beats are 0.5 s apart, too coarse to tell a rank from the one that blocked on it a
  // millisecond later).
  int stuckLongest(double now) const {
    bool over = false;  // some rank is past its own bound
    for (const RankWatch& w : m_watches) {
      if (!w.seen || w.finished || w.progress < 0) continue;
      const double bound = w.longPhase ? m_options.stallTimeoutS * kLongPhaseFactor
                                       : std::max(m_options.stallTimeoutS, kSlowActionFactor * w.longestGap);
      over = over || now - w.progressAt > bound;
    }
    if (!over) return -1;
    // The culprit is the rank stuck in its activity the longest, among all that have not moved for the stall
    // timeout, not only those past their own bound: a rank whose bound a slow step once raised (longestGap)
    // may be the one that froze first, while the peers waiting on it cross their lower bounds sooner. A rank
    // whose activity waits for others (a receive, the gradient finish) comes after every one that does not:
    // it may have started waiting before the culprit stopped (data-parallel ranks run unsynchronised
    // between syncs, so a peer can reach the sync before the culprit reaches its frozen point).
    int stuck = -1;
    for (size_t r = 0; r < m_watches.size(); ++r) {
      const RankWatch& w = m_watches[r];
      if (!w.seen || w.finished || w.progress < 0 || now - w.progressAt <= m_options.stallTimeoutS) continue;
      if (stuck < 0) {
        stuck = static_cast<int>(r);
        continue;
      }
      const RankWatch& best = m_watches[static_cast<size_t>(stuck)];
      if (w.waiting != best.waiting ? !w.waiting : w.activitySince < best.activitySince)
        stuck = static_cast<int>(r);
    }
    return stuck;
  }

  // mpirun is gone: nothing of its session may outlive it; what it wrote last is read.
  void sweep() {
    const double sweepEnd = steadyS() + kSweepS;
    for (;;) {
      signalSession(m_child, SIGKILL);
      while (waitpid(-1, nullptr, WNOHANG) > 0) {
      }
      if (sessionMembers(m_child).empty() || steadyS() > sweepEnd) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    for (const double drainEnd = steadyS() + 2; m_pipeOpen && steadyS() < drainEnd;) {
      pollfd p = {m_errFd, POLLIN, 0};
      poll(&p, 1, 100);
      m_pipeOpen = m_tee->pump();
    }
    close(m_errFd);
  }

  Status conclude() {
    const bool succeeded = WIFEXITED(m_childStatus) && WEXITSTATUS(m_childStatus) == 0;
    // Stopped on request and every rank ended cleanly: ranks stopped by our SIGUSR1 save their checkpoint,
    // write run_end "interrupted" and exit 0 (so mpirun reports no failure); a rank stopped by a signal of
    // its own exits with kExitInterrupted. Nothing failed either way; the stream says whether the run was cut
    // short or had just finished when the request came.
    if (m_reason.empty() && m_userSignal && m_userSignals == 1 && WIFEXITED(m_childStatus) &&
        (succeeded || WEXITSTATUS(m_childStatus) == kExitInterrupted)) {
      const bool cut =
          !succeeded || m_options.metricsFiles.empty() ||
          supervisor_detail::lastRunEndStatus(m_options.metricsFiles.front()) != metrics::status::kOk;
      if (m_interrupted) *m_interrupted = cut;
      return Status::ok();
    }
    if (m_reason.empty() && succeeded) return Status::ok();
    std::string endStatus = metrics::status::kError;
    if (m_reason.empty() && m_userSignal) {
      const char* name = m_userSignal == SIGINT ? "SIGINT" : m_userSignal == SIGTERM ? "SIGTERM" : "SIGHUP";
      m_reason = std::string("stopped by ") + name + "; mpirun " + describeExit(m_childStatus);
      endStatus = metrics::status::kInterrupted;
    }
    if (m_reason.empty()) {
      for (size_t r = 0; r < m_watches.size(); ++r)
        readHeartbeat(m_options.heartbeatDir, static_cast<int>(r), steadyS(), m_watches[r]);
      m_reason = failureReason(m_childStatus, m_tee->lines(), m_watches);
    }
    return Status::error(m_reason + writeRunEnds(endStatus));
  }

  // The run did not start (the folder is another run's, mpirun could not be started): a run_end on stdout
  // and in the user's --metrics file, never in the run folder's metrics.jsonl (which may be another run's).
  Status notStarted(const Status& s) {
    const nlohmann::json fields = {{metrics::key::kStatus, metrics::status::kError},
                                   {metrics::key::kReason, s.message()},
                                   {metrics::key::kStep, 0}};
    for (size_t i = 1; i < m_options.metricsFiles.size(); ++i) {
      MetricsWriter out;
      if (out.open(m_options.metricsFiles[i], "", /*append=*/true)) out.write(metrics::type::kRunEnd, fields);
    }
    if (m_options.metricsToStdout) {
      MetricsWriter out;
      if (out.open("-", "", /*append=*/true)) out.write(metrics::type::kRunEnd, fields);
    }
    return s;
  }

  // A run_end for every stream this run wrote (supervisor.h); returns notes on the ones that failed.
  std::string writeRunEnds(const std::string& endStatus) {
    std::string notes;
    nlohmann::json forStdout = {
        {metrics::key::kStatus, endStatus}, {metrics::key::kReason, m_reason}, {metrics::key::kStep, 0}};
    for (size_t i = 0; i < m_options.metricsFiles.size(); ++i) {
      const std::string& path = m_options.metricsFiles[i];
      struct stat st = {};
      if (stat(path.c_str(), &st) != 0) continue;  // no such file: the run stopped before its stream began
      // An earlier run's stream, which this run never opened, is left alone (file times are coarse: 1 s
      // slack).
      if (double(st.st_mtim.tv_sec) + 1e-9 * double(st.st_mtim.tv_nsec) < m_startUnix - 1) continue;
      auto written = supervisor_detail::appendRunEnd(path, endStatus, m_reason);
      if (!written) notes += "; " + written.message();
      // stdout ends as the run folder's stream does: with the same line, or with none where a rank's own
      // run_end stands.
      if (i == 0) forStdout = written ? *written : nlohmann::json();
    }
    if (m_options.metricsToStdout && forStdout.is_object()) {
      MetricsWriter out;
      if (out.open("-", "", /*append=*/true)) out.write(metrics::type::kRunEnd, forStdout);
    }
    return notes;
  }

  const SupervisorOptions& m_options;
  bool* m_interrupted;
  RunFolderLock m_lock;
  double m_startUnix = 0;
  pid_t m_child = -1;
  int m_errFd = -1;
  std::optional<StderrTee> m_tee;
  bool m_pipeOpen = false;
  double m_start = 0;
  std::vector<RankWatch> m_watches;
  double m_nextCheck = 0;
  double m_killAt = -1;  // SIGKILL to the session then
  std::string m_reason;  // the first failure seen
  int m_userSignal = 0;
  int m_userSignals = 0;  // how many: the first stops gracefully, the next ones stop hard
  int m_childStatus = 0;
  bool m_childDone = false;
  double m_mpirunStoppedAt = -1;
  double m_nextResend = 0;        // resendStopToLateRanks
  bool m_stopReachedAll = false;  // resendStopToLateRanks: sent once every rank had beaten
};

}  // namespace

Status superviseRun(const SupervisorOptions& options, bool* interrupted) {
  Supervision supervision(options, interrupted);
  return supervision.run();
}

}  // namespace ms
