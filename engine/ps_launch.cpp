// The parameter-server launcher; see ps_launch.h.
#include "ps_launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "runtime/file_io.h"

extern char** environ;

namespace ms {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<int> g_signal{0};
void onStop(int sig) {
  g_signal.store(sig);
}

// A free TCP port on the loopback interface (the kernel's choice; another process could take it before the
// server binds it, in which case the server's bind fails and says so).
Expected<int> freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Status::error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const std::string e = std::strerror(errno);
    ::close(fd);
    return Status::error("finding a free port: " + e);
  }
  ::close(fd);
  return static_cast<int>(ntohs(a.sin_port));
}

std::string describeStatus(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "died (signal " + std::to_string(WTERMSIG(status)) + ", " + strsignal(WTERMSIG(status)) + ")";
  return "ended";
}

struct Child {
  std::string role;  // "server", "worker"
  int index = 0;
  std::vector<std::string> args;
  std::vector<std::string> env;  // extra NAME=VALUE
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  int restarts = 0;
};

Status spawnChild(Child& c) {
  std::vector<char*> argv;
  for (std::string& s : c.args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> envStore;
  for (char** e = environ; *e; ++e) envStore.push_back(*e);
  for (const std::string& e : c.env) envStore.push_back(e);
  std::vector<char*> envp;
  for (std::string& s : envStore) envp.push_back(s.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data());
  if (rc != 0)
    return Status::error("starting " + c.role + " " + std::to_string(c.index) + ": " + std::strerror(rc));
  c.pid = pid;
  c.running = true;
  return Status::ok();
}

std::string commandLine(const Child& c) {
  std::string line;
  for (const std::string& e : c.env) line += e + " ";
  for (const std::string& a : c.args) line += (a.find(' ') != std::string::npos ? "'" + a + "'" : a) + " ";
  if (!line.empty()) line.pop_back();
  return line;
}

}  // namespace

Status launchParameterServer(const RunConfig& config, const PsLaunchOptions& o, bool* interrupted) {
  const int S = config.parallel.servers, W = config.parallel.workers;
  if (o.killWorker >= W)
    return Status::error("--kill-worker: worker " + std::to_string(o.killWorker) + " does not exist");
  if (o.killServer >= S)
    return Status::error("--kill-server: server " + std::to_string(o.killServer) + " does not exist");
  RunFolderLock lock;
  if (!o.dryRun) {
    MS_TRY(lock.acquire(o.runDir));
    const fs::path servers = fs::path(o.runDir) / "servers";
    std::error_code ec;
    if (!o.resume && fs::exists(servers) && !fs::is_empty(servers, ec)) {
      if (!o.overwrite)
        return Status::error(o.runDir +
                             ": this run folder already holds server checkpoints; pass --resume to continue "
                             "it, --overwrite to start over, or --run-dir for another folder");
      fs::remove_all(servers, ec);
    }
  }
  std::vector<std::string> endpoints;
  for (int s = 0; s < S; ++s) {
    auto port = freePort();
    if (!port) return port.status();
    endpoints.push_back("tcp://127.0.0.1:" + std::to_string(*port));
  }
  std::string serverList;
  for (const std::string& e : endpoints) serverList += (serverList.empty() ? "" : ",") + e;
  std::vector<Child> children;
  for (int s = 0; s < S; ++s) {
    Child c;
    c.role = "server";
    c.index = s;
    c.args = {o.exe,    "ps-server",  o.configPath, "--index", std::to_string(s),
              "--bind", endpoints[s], "--run-dir",  o.runDir};
    if (s == 0 && !o.metricsSink.empty()) c.args.insert(c.args.end(), {"--metrics", o.metricsSink});
    if (o.resume) c.args.push_back("--resume");
    if (s == o.killServer) c.args.insert(c.args.end(), {"--die-at-step", std::to_string(o.killServerStep)});
    children.push_back(c);
  }
  for (int w = 0; w < W; ++w) {
    Child c;
    c.role = "worker";
    c.index = w;
    c.args = {o.exe, "ps-worker", o.configPath, "--index", std::to_string(w), "--servers", serverList};
    if (o.emulateDevice) c.args.push_back("--emulate-device");
    if (w == o.killWorker) c.args.insert(c.args.end(), {"--die-at-step", std::to_string(o.killWorkerStep)});
    children.push_back(c);
  }
  if (o.dryRun) {
    for (const Child& c : children) std::printf("%s &\n", commandLine(c).c_str());
    return Status::ok();
  }
  struct sigaction sa {};
  sa.sa_handler = onStop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  std::fprintf(stderr, "launch: %d server(s) and %d worker(s), consistency %s, on this machine\n", S, W,
               toString(config.parallel.consistency));
  for (Child& c : children) {
    if (Status s = spawnChild(c); !s) {
      for (Child& k : children)
        if (k.running) ::kill(k.pid, SIGKILL);
      for (Child& k : children)
        if (k.running) ::waitpid(k.pid, nullptr, 0);
      return s;
    }
  }
  auto running = [&](const std::string& role) {
    int n = 0;
    for (const Child& c : children) n += c.running && (role.empty() || c.role == role) ? 1 : 0;
    return n;
  };
  Status result = Status::ok();
  bool stopping = false;
  Clock::time_point stopAt{};
  bool killed = false;
  auto stopAll = [&](int sig) {
    for (Child& c : children)
      if (c.running) ::kill(c.pid, sig);
  };
  while (running("") > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      if (g_signal.load() && !stopping) {
        stopping = true;
        stopAt = Clock::now();
        if (interrupted) *interrupted = true;
        std::fprintf(stderr, "launch: stopping every server and worker (they checkpoint first)\n");
        stopAll(SIGTERM);
      }
      if (stopping && !killed && Clock::now() - stopAt > std::chrono::seconds(20)) {
        std::fprintf(stderr, "launch: processes still running 20 s after the stop; killing them\n");
        stopAll(SIGKILL);
        killed = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    Child* c = nullptr;
    for (Child& k : children)
      if (k.running && k.pid == pid) c = &k;
    if (!c) continue;
    c->running = false;
    c->status = status;
    const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (c->role == "worker") {
      if (!clean && !stopping)
        std::fprintf(stderr, "launch: worker %d (pid %d) %s; the servers go on without it\n", c->index,
                     static_cast<int>(pid), describeStatus(status).c_str());
      continue;
    }
    // A server.
    if (!clean && !stopping && WIFSIGNALED(status) && c->restarts < 3) {
      ++c->restarts;
      std::fprintf(stderr, "launch: server %d (pid %d) %s; restarting it from its newest checkpoint\n",
                   c->index, static_cast<int>(pid), describeStatus(status).c_str());
      // The restarted server resumes, appends to the metrics stream, and is not killed again.
      std::vector<std::string> args;
      for (size_t i = 0; i < c->args.size(); ++i) {
        if (c->args[i] == "--die-at-step") {
          ++i;
          continue;
        }
        if (c->args[i] == "--resume") continue;
        args.push_back(c->args[i]);
      }
      args.push_back("--resume");
      c->args = args;
      if (Status s = spawnChild(*c); !s) {
        result = s;
        stopping = true;
        stopAt = Clock::now();
        stopAll(SIGTERM);
      }
      continue;
    }
    if (c->index == 0 && !stopping) {
      // Server 0 ended the run: the rest stop (other servers checkpoint on SIGTERM; workers have had their
      // "done" and are leaving).
      if (!clean && !(WIFEXITED(status) && WEXITSTATUS(status) == 130))
        result =
            Status::error("server 0 " + describeStatus(status) + "; see the run's metrics.jsonl for its reason");
      stopping = true;
      stopAt = Clock::now() - std::chrono::seconds(10);  // 10 s for the others to leave on their own
      stopAll(SIGTERM);
    } else if (!clean && !stopping) {
      result = Status::error(
          "server " + std::to_string(c->index) + " " + describeStatus(status) +
          (c->restarts ? " after " + std::to_string(c->restarts) + " restarts" : std::string()));
      stopping = true;
      stopAt = Clock::now();
      stopAll(SIGTERM);
    }
  }
  return result;
}

}  // namespace ms
