// The activity slot and the heartbeat thread; see heartbeat.h.
//
// What always holds: the activity slot is the one piece of process-wide mutable state here, by design (any
// code may say what the process is doing, and the thread reports it); it is only touched under its mutex.
#include "runtime/heartbeat.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

namespace ms {

namespace {

struct ActivitySlot {
  std::mutex mutex;
  char text[kMaxActivityChars + 1] = "starting";
  size_t length = 8;
  double since = unixTimeS();
  uint64_t progress = 0;
  bool longPhase = true;  // "starting"
  bool waiting = false;
};

ActivitySlot g_activity;

// The process's running heartbeat, for beatNow(); guarded by g_beatingMutex (taken only for long phases and
// when a heartbeat starts or stops).
std::mutex g_beatingMutex;
Heartbeat::State* g_beating = nullptr;

// Writes `text` to path + ".tmp" and renames it over path. Not fsynced: a heartbeat must be whole when read,
// not durable.
bool replaceFile(const std::string& path, const std::string& text, std::string& error) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) {
    error = tmp + ": cannot create: " + std::strerror(errno);
    return false;
  }
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) {
    error = tmp + ": write failed: " + std::strerror(errno);
    std::remove(tmp.c_str());
    return false;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    error = path + ": cannot rename into place: " + std::strerror(errno);
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace

double unixTimeS() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

void setActivity(const char* what, bool longPhase, bool waiting) {
  const size_t n = strnlen(what, kMaxActivityChars);
  const double now = unixTimeS();
  bool wasLong = false;
  {
    std::lock_guard<std::mutex> lock(g_activity.mutex);
    wasLong = g_activity.longPhase;
    std::memcpy(g_activity.text, what, n);
    g_activity.text[n] = '\0';
    g_activity.length = n;
    g_activity.since = now;
    ++g_activity.progress;
    g_activity.longPhase = longPhase;
    g_activity.waiting = waiting;
  }
  // A long phase (a checkpoint write, an evaluation) is written through at once, and so is its end, so that a
  // rank that dies in it is reported in it and one that dies after it is not (the periodic beat would show
  // either up to a period late: many steps of a small model). Two small file writes, next to a phase that
  // lasts long anyway.
  if (longPhase || wasLong) beatNow();
}

void setActivity(const std::string& what, bool longPhase, bool waiting) {
  setActivity(what.c_str(), longPhase, waiting);
}

Activity currentActivity() {
  std::lock_guard<std::mutex> lock(g_activity.mutex);
  return {std::string(g_activity.text, g_activity.length), g_activity.since, g_activity.progress,
          g_activity.longPhase, g_activity.waiting};
}

struct Heartbeat::State {
  std::mutex writeMutex;  // one beat written at a time (the thread's and beatNow()'s)
  std::string path;
  int rank = 0;
  long pid = 0;
  std::string host;
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  bool reported = false;  // a write error was printed already
  std::thread thread;

  void beat(bool finished) {
    std::lock_guard<std::mutex> writing(writeMutex);
    const Activity a = currentActivity();
    const nlohmann::json j = {{"rank", rank},           {"pid", pid},
                              {"host", host},           {"alive", unixTimeS()},
                              {"activity", a.text},     {"activity_since", a.since},
                              {"progress", a.progress}, {"long_phase", a.longPhase},
                              {"waiting", a.waiting},   {"finished", finished}};
    std::string error;
    if (!replaceFile(path, j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", error) &&
        !reported) {
      reported = true;
      std::fprintf(stderr, "meshstudio-engine: rank %d: heartbeat: %s\n", rank, error.c_str());
    }
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop) {
      wake.wait_for(lock, std::chrono::duration<double>(kHeartbeatPeriodS), [this] { return stop; });
      if (stop) break;
      lock.unlock();
      beat(false);
      lock.lock();
    }
  }
};

std::unique_ptr<Heartbeat> Heartbeat::startFromEnvironment(int rank) {
  const char* dir = std::getenv(kHeartbeatDirEnv);
  if (!dir || !*dir) return nullptr;
  return std::make_unique<Heartbeat>(dir, rank);
}

Heartbeat::Heartbeat(std::string dir, int rank) : m_state(std::make_unique<State>()) {
  m_state->path = std::move(dir) + "/rank-" + std::to_string(rank) + ".json";
  m_state->rank = rank;
  m_state->pid = static_cast<long>(::getpid());
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) m_state->host = host;
  m_state->beat(false);
  m_state->thread = std::thread([s = m_state.get()] { s->run(); });
  std::lock_guard<std::mutex> lock(g_beatingMutex);
  g_beating = m_state.get();
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(g_beatingMutex);
    if (g_beating == m_state.get()) g_beating = nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(m_state->mutex);
    m_state->stop = true;
  }
  m_state->wake.notify_all();
  m_state->thread.join();
  m_state->beat(true);
}

void beatNow() {
  std::lock_guard<std::mutex> lock(g_beatingMutex);
  if (g_beating) g_beating->beat(false);
}

const std::string& Heartbeat::path() const {
  return m_state->path;
}

}  // namespace ms
