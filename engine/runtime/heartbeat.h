// A rank's heartbeat: what this process is doing right now (setActivity, called by the training loop many
// times per step) and, when `meshstudio-engine launch` supervises the run (it sets MESHSTUDIO_HEARTBEAT_DIR),
// a background thread that rewrites "$MESHSTUDIO_HEARTBEAT_DIR/rank-<rank>.json" every 0.5 s:
//   {"rank": 2, "pid": 1234, "host": "node0", "alive": <unix s>, "activity": "step 12: all-reduce of
//    gradients", "activity_since": <unix s>, "progress": 5120, "long_phase": false, "waiting": false,
//    "finished": false}
// "progress" counts setActivity calls: the training loop's own steps, which a frozen main thread or a rank
// blocked in a collective stops advancing while the beating thread goes on. "long_phase" marks activities
// that may last long without a step (startup, evaluation, a checkpoint write): the supervisor gives them a
// longer bound. "waiting" marks activities that wait for other ranks (a receive, the gradient finish): when
// several ranks are stuck, the supervisor names one that is not waiting for the others first. The supervisor
// names a dead, stopped or stuck rank and what it was doing from these files
// (engine/supervisor.h).
//
// What always holds: setActivity is cheap (a copy of at most kMaxActivityChars under an uncontended mutex)
// and thread-safe, whether or not a heartbeat runs; a long-phase activity is in the file before setActivity
// returns, and so is the activity after it (a rank that dies in a checkpoint write is reported in it, one
// that dies after it is not); the file is replaced by rename(2), so a
// reader never sees half of one; a heartbeat destroyed normally writes a last beat with "finished": true, so
// a rank that has ended is not taken for a hung one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace ms {

inline constexpr const char* kHeartbeatDirEnv = "MESHSTUDIO_HEARTBEAT_DIR";
inline constexpr size_t kMaxActivityChars = 160;
inline constexpr double kHeartbeatPeriodS = 0.5;

// Records what this process is doing (truncated to kMaxActivityChars) and the time it started doing it, and
// advances the progress counter. longPhase: the activity may legitimately last long (see above); waiting: it
// waits for other ranks (see above).
void setActivity(const char* what, bool longPhase = false, bool waiting = false);
void setActivity(const std::string& what, bool longPhase = false, bool waiting = false);

struct Activity {
  std::string text;
  double since = 0;  // unix time, seconds
  uint64_t progress = 0;
  bool longPhase = false;
  bool waiting = false;
};
Activity currentActivity();

// Writes the running heartbeat's file now (no-op without one); setActivity does this as a long phase begins
// and as it ends.
void beatNow();

// Unix time in seconds (system clock): the heartbeat files' clock.
double unixTimeS();

class Heartbeat {
 public:
  // Starts one when MESHSTUDIO_HEARTBEAT_DIR is set (nullptr otherwise). The first beat is written before
  // this returns; a file that cannot be written is reported once on stderr and the thread keeps trying.
  static std::unique_ptr<Heartbeat> startFromEnvironment(int rank);

  Heartbeat(std::string dir, int rank);
  ~Heartbeat();  // writes the finished beat, stops and joins the thread
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  const std::string& path() const;

 public:
  struct State;

 private:
  std::unique_ptr<State> m_state;
};

}  // namespace ms
