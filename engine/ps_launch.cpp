// The parameter-server launcher; see ps_launch.h.
#include "ps_launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "plan/launch_script.h"
#include "plan/parameter_server.h"
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

struct Child {
  std::string role;  // "server", "worker"
  int index = 0;
  std::vector<std::string> args;  // the engine's command line
  std::vector<std::string> env;   // extra NAME=VALUE
  std::string host;               // "" on this machine, else started there through the remote starter
  pid_t pid = -1;
  int stdinFd = -1;  // a remote child's standard input (the launcher's end): closing it stops the process
  bool running = false;
  int status = 0;
  int restarts = 0;
};

// The signal a child died of: its own, or for a remote one the 128 + N its starter passed back.
int signalOf(const Child& c, int status) {
  if (WIFSIGNALED(status)) return WTERMSIG(status);
  if (!c.host.empty() && WIFEXITED(status) && WEXITSTATUS(status) > 128 && WEXITSTATUS(status) < 255)
    return WEXITSTATUS(status) - 128;
  return 0;
}

std::string describeStatus(const Child& c, int status) {
  const std::string where = c.host.empty() ? "" : " on " + c.host;
  if (const int sig = signalOf(c, status))
    return "died (signal " + std::to_string(sig) + ", " + strsignal(sig) + ")" + where;
  if (WIFEXITED(status))
    return "exited with code " + std::to_string(WEXITSTATUS(status)) + where +
           (!c.host.empty() && WEXITSTATUS(status) == 255
                ? " (the remote starter's code for a failed connection)"
                : "");
  return "ended" + where;
}

// The command a remote host runs: the engine in the launcher's folder, beside a watcher that sends it
// SIGTERM when the launcher closes the standard input; the engine's exit status is the command's. (A
// background list's input is /dev/null unless redirected, hence the copy on fd 3.)
std::string remoteCommand(const Child& c) {
  std::string engine;
  for (const std::string& e : c.env) engine += shellQuote(e) + " ";
  if (!c.env.empty()) engine = "env " + engine;
  for (const std::string& a : c.args) engine += shellQuote(a) + " ";
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  return "cd " + shellQuote(cwd) + " && exec 3<&0 && { " + engine +
         "3<&- </dev/null & p=$!; { cat <&3 >/dev/null 2>&1; kill -TERM $p 2>/dev/null; } & w=$!; "
         "exec 3<&-; wait $p; r=$?; kill $w 2>/dev/null; exit $r; }";
}

std::vector<std::string> splitWords(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// What is spawned for a child: the engine, or the remote starter with the host and the command.
std::vector<std::string> spawnArgs(const Child& c, const std::string& rsh) {
  if (c.host.empty()) return c.args;
  std::vector<std::string> argv = splitWords(rsh);
  const bool srun = !argv.empty() && std::filesystem::path(argv[0]).filename() == "srun";
  if (srun) {
    argv.insert(argv.end(),
                {"--nodes=1", "--ntasks=1", "--overlap", "-w", c.host, "sh", "-c", remoteCommand(c)});
  } else {
    argv.push_back(c.host);
    argv.push_back(remoteCommand(c));
  }
  return argv;
}

Status spawnChild(Child& c, const std::string& rsh) {
  std::vector<std::string> args = spawnArgs(c, rsh);
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> envStore;
  for (char** e = environ; *e; ++e) envStore.push_back(*e);
  if (c.host.empty())
    for (const std::string& e : c.env) envStore.push_back(e);
  std::vector<char*> envp;
  for (std::string& s : envStore) envp.push_back(s.data());
  envp.push_back(nullptr);
  // A remote child reads a pipe the launcher holds; close-on-exec, so no other child keeps it open.
  int fds[2] = {-1, -1};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!c.host.empty()) {
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      posix_spawn_file_actions_destroy(&actions);
      return Status::error("starting " + c.role + " " + std::to_string(c.index) +
                           ": pipe: " + std::strerror(errno));
    }
    posix_spawn_file_actions_adddup2(&actions, fds[0], 0);
  }
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (fds[0] >= 0) ::close(fds[0]);
  if (rc != 0) {
    if (fds[1] >= 0) ::close(fds[1]);
    return Status::error("starting " + c.role + " " + std::to_string(c.index) +
                         (c.host.empty() ? "" : " on " + c.host + " with " + args[0]) + ": " +
                         std::strerror(rc));
  }
  c.pid = pid;
  c.stdinFd = fds[1];
  c.running = true;
  return Status::ok();
}

void closeStdin(Child& c) {
  if (c.stdinFd >= 0) ::close(c.stdinFd);
  c.stdinFd = -1;
}

std::string commandLine(const Child& c, const std::string& rsh) {
  const std::vector<std::string> args = spawnArgs(c, rsh);
  std::string line;
  if (c.host.empty())
    for (const std::string& e : c.env) line += e + " ";
  for (const std::string& a : args) line += shellQuote(a) + " ";
  if (!line.empty()) line.pop_back();
  return line;
}

// Whether a host names this machine.
bool isThisMachine(const std::string& host) {
  if (host == "localhost" || host == "127.0.0.1" || host == "::1") return true;
  char self[256] = {};
  if (::gethostname(self, sizeof self - 1) != 0) return false;
  const std::string name = self;
  return host == name || host == name.substr(0, name.find('.'));
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
  // Where each process runs (ps_launch.h): every node's host, "" for this machine.
  const auto& nodes = config.mesh.nodes;
  const bool spread = nodes.size() > 1 || !o.hosts.empty();
  if (!o.hosts.empty() && o.hosts.size() != nodes.size())
    return Status::error("--hostfile: " + std::to_string(o.hosts.size()) + " hosts for a mesh of " +
                         std::to_string(nodes.size()) + " nodes");
  std::vector<std::string> nodeHost(nodes.size()), nodeAddress(nodes.size(), "127.0.0.1");
  for (size_t n = 0; spread && n < nodes.size(); ++n) {
    nodeAddress[n] = o.hosts.empty() ? nodes[n].name : o.hosts[n];
    if (!isThisMachine(nodeAddress[n])) nodeHost[n] = nodeAddress[n];
  }
  auto hostOf = [&](int node) { return nodes.empty() ? std::string() : nodeHost[static_cast<size_t>(node)]; };
  auto addressOf = [&](int node) {
    return nodes.empty() ? std::string("127.0.0.1") : nodeAddress[static_cast<size_t>(node)];
  };
  std::vector<std::string> binds, endpoints;
  for (int s = 0; s < S; ++s) {
    if (spread) {
      const std::string port = std::to_string(o.basePort + s);
      binds.push_back("tcp://*:" + port);
      endpoints.push_back("tcp://" + addressOf(serverNode(config, s)) + ":" + port);
      continue;
    }
    auto port = freePort();
    if (!port) return port.status();
    endpoints.push_back("tcp://127.0.0.1:" + std::to_string(*port));
    binds.push_back(endpoints.back());
  }
  std::string serverList;
  for (const std::string& e : endpoints) serverList += (serverList.empty() ? "" : ",") + e;
  std::vector<Child> children;
  for (int s = 0; s < S; ++s) {
    Child c;
    c.role = "server";
    c.index = s;
    c.host = hostOf(serverNode(config, s));
    c.args = {o.exe,    "ps-server", o.configPath, "--index", std::to_string(s),
              "--bind", binds[s],    "--run-dir",  o.runDir};
    if (s == 0 && !o.metricsSink.empty()) c.args.insert(c.args.end(), {"--metrics", o.metricsSink});
    if (o.resume) c.args.push_back("--resume");
    if (s == o.killServer) c.args.insert(c.args.end(), {"--die-at-step", std::to_string(o.killServerStep)});
    children.push_back(c);
  }
  for (int w = 0; w < W; ++w) {
    Child c;
    c.role = "worker";
    c.index = w;
    c.host = hostOf(workerNode(config, w));
    c.args = {o.exe, "ps-worker", o.configPath, "--index", std::to_string(w), "--servers", serverList};
    if (o.emulateDevice) c.args.push_back("--emulate-device");
    if (w == o.killWorker) c.args.insert(c.args.end(), {"--die-at-step", std::to_string(o.killWorkerStep)});
    children.push_back(c);
  }
  if (o.dryRun) {
    for (const Child& c : children) std::printf("%s &\n", commandLine(c, o.rsh).c_str());
    return Status::ok();
  }
  struct sigaction sa {};
  sa.sa_handler = onStop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  int remote = 0;
  for (const Child& c : children) remote += c.host.empty() ? 0 : 1;
  std::fprintf(
      stderr, "launch: %d server(s) and %d worker(s), consistency %s, %s\n", S, W,
      toString(config.parallel.consistency),
      remote ? (std::to_string(remote) + " of them started through " + o.rsh).c_str() : "on this machine");
  // A remote child whose input pipe breaks must not end the launcher.
  ::signal(SIGPIPE, SIG_IGN);
  for (Child& c : children) {
    if (Status s = spawnChild(c, o.rsh); !s) {
      for (Child& k : children) {
        closeStdin(k);
        if (k.running) ::kill(k.pid, SIGKILL);
      }
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
  // SIGTERM: local processes get it; remote ones get it from their watcher when their input closes.
  // SIGKILL: the local process, or the remote starter (its end of the connection).
  auto stopAll = [&](int sig) {
    for (Child& c : children) {
      if (!c.running) continue;
      if (c.host.empty() || sig == SIGKILL)
        ::kill(c.pid, sig);
      else
        closeStdin(c);
    }
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
    closeStdin(*c);
    const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (c->role == "worker") {
      if (!clean && !stopping)
        std::fprintf(stderr, "launch: worker %d (pid %d) %s; the servers go on without it\n", c->index,
                     static_cast<int>(pid), describeStatus(*c, status).c_str());
      continue;
    }
    // A server.
    if (!clean && !stopping && signalOf(*c, status) && c->restarts < 3) {
      ++c->restarts;
      std::fprintf(stderr, "launch: server %d (pid %d) %s; restarting it from its newest checkpoint\n",
                   c->index, static_cast<int>(pid), describeStatus(*c, status).c_str());
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
      if (Status s = spawnChild(*c, o.rsh); !s) {
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
        result = Status::error("server 0 " + describeStatus(*c, status) +
                               "; see the run's metrics.jsonl for its reason");
      stopping = true;
      stopAt = Clock::now() - std::chrono::seconds(10);  // 10 s for the others to leave on their own
      stopAll(SIGTERM);
    } else if (!clean && !stopping) {
      result = Status::error(
          "server " + std::to_string(c->index) + " " + describeStatus(*c, status) +
          (c->restarts ? " after " + std::to_string(c->restarts) + " restarts" : std::string()));
      stopping = true;
      stopAt = Clock::now();
      stopAll(SIGTERM);
    }
  }
  return result;
}

Expected<std::vector<std::string>> readHostfile(const std::string& path, size_t nodes) {
  std::ifstream in(path);
  if (!in) return Status::error(path + ": cannot read the hostfile");
  std::vector<std::string> hosts;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    const std::vector<std::string> words = splitWords(line);
    if (words.empty()) continue;
    for (size_t i = 1; i < words.size(); ++i)
      if (words[i].rfind("slots=", 0) != 0 && words[i].rfind("max_slots=", 0) != 0)
        return Status::error(path + ":" + std::to_string(number) + ": \"" + words[i] +
                             "\": a hostfile line is HOST [slots=N]");
    hosts.push_back(words[0]);
  }
  if (hosts.size() != nodes)
    return Status::error(path + ": " + std::to_string(hosts.size()) + " hosts for a mesh of " +
                         std::to_string(nodes) + " nodes (one line per node, in the mesh's order)");
  return hosts;
}

}  // namespace ms
