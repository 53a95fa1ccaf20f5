// Plan analysis for the studio: a config turned into everything the plan views draw (the plan, the simulated
// step, the memory per rank, the predicted timeline), computed off the GUI thread. Every edit calls
// PlanAnalyzer::request(); the analyzer runs one analysis at a time on its own thread and, when edits arrive
// faster than analyses finish, skips to the newest config (no queue of stale work).
//
// What always holds: ready() delivers snapshots in request order, each for the config it names; a snapshot
// whose plan failed carries the error (field and reason) and no figures; the analyzer's destructor waits
// for a running analysis, so no callback outlives it. A snapshot of a 16384-rank plan holds hundreds of MB:
// releaseLater() lets the last reference to an old one go on a worker thread, so replacing a large plan
// never stalls the GUI thread on freeing it.
#pragma once

#include <QObject>
#include <QStringList>
#include <QThreadPool>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "plan/cost_model.h"
#include "plan/memory_model.h"
#include "plan/plan.h"
#include "plan/ps_model.h"
#include "plan/run_config.h"
#include "plan/simulator.h"
#include "ui/models/timeline_data.h"

namespace ms {

// Per-layer compute times measured by a run (its spans), per sample, to replace the cost model's analytic
// times: the prediction of a plan then uses what this machine really took. They hold for the model and the
// tensor-parallel width they were measured with (a layer's time changes with tp); other configs keep the
// analytic times and the snapshot says why.
struct Calibration {
  LayerTimes perSample;  // seconds per sample: a microbatch's time / its samples
  ModelConfig model;
  int tp = 1;
  Recompute recompute = Recompute::None;  // a recomputing run's backward spans hold the recomputed forward
  int recomputeLayers = 0;                // (of the blocks its "recompute_layers" named)
  QString source;                         // the run folder, for people
};

struct PlanSnapshot {
  RunConfig config;
  std::optional<Plan> plan;  // empty when the config does not make a plan
  QString error;             // why not (validation errors or buildPlan's message), else empty
  SimResult sim;
  std::vector<MemoryBreakdown> memory;  // per rank
  TimelineData timeline;                // predicted, from sim (parameter-server mode: from ps)
  // Parameter-server mode: its own prediction (plan/ps_model.h); sim then carries its step time and
  // throughput, memory its workers' breakdowns.
  std::optional<PsPrediction> ps;
  double millis = 0;        // time the analysis took
  bool calibrated = false;  // the compute times are a run's measurements
  QString calibrationNote;  // from where, or why a calibration did not apply
  quint64 generation = 0;   // request counter, increasing
  bool ok() const { return plan.has_value(); }
};

// The memory view's bars for a snapshot: one per rank; in parameter-server mode one per worker (group 0,
// "worker w") then one per server (group 1, "server s", its node's host memory as capacity: a server holds
// its shard, gradients and optimizer state in host memory). names and groupNames are empty for collective
// plans (the view then says "rank r" and "stage s").
struct MemoryBars {
  std::vector<MemoryBreakdown> memory;
  QStringList names;       // per bar
  QStringList groupNames;  // per MemoryBreakdown::stage, for grouped bars
};
MemoryBars memoryBars(const PlanSnapshot& snapshot);

// Whether the studio lets ranks share a device for this config (the CPU engine runs several ranks per host).
bool allowsDeviceSharing(const RunConfig& config);

// The phases of an analysis, in order, for a progress display.
enum class AnalysisPhase { Validating, Building, Simulating, Memory, Timeline, NUM_PHASES };
QString phaseText(AnalysisPhase phase, int ranks);  // "simulating one step of 1024 ranks"

// The analysis itself, synchronous (tests and the analyzer's worker call it). `progress`, when set, is
// called at the start of each phase with the plan's rank count (0 before it is known), on the caller's
// thread.
std::shared_ptr<const PlanSnapshot> analyzePlan(
    const RunConfig& config, quint64 generation = 0,
    const std::optional<Calibration>& calibration = std::nullopt,
    const std::function<void(AnalysisPhase, int ranks)>& progress = {});

class PlanAnalyzer : public QObject {
  Q_OBJECT
 public:
  explicit PlanAnalyzer(QObject* parent = nullptr);
  ~PlanAnalyzer() override;
  void request(const RunConfig& config);
  // Later analyses use these measured times (nullopt: the analytic cost model again); re-analyses the newest
  // config.
  void setCalibration(std::optional<Calibration> calibration);
  const std::optional<Calibration>& calibration() const { return m_calibration; }
  // The newest snapshot delivered (null before the first).
  std::shared_ptr<const PlanSnapshot> latest() const { return m_latest; }
  // True while an analysis runs or waits.
  bool busy() const { return m_running || m_pending.has_value(); }
  // Drops this reference to a snapshot on a worker thread (where the last reference frees it).
  void releaseLater(std::shared_ptr<const PlanSnapshot> snapshot);
  // Holds finished analyses (busy() stays true) until unpaused, then delivers them: lets a test see the
  // studio while a re-plan is under way without depending on how long one takes.
  void setPaused(bool paused);

 signals:
  void ready(std::shared_ptr<const ms::PlanSnapshot> snapshot);
  // An analysis of the newest request started (its generation) or moved to a phase.
  void started(quint64 generation);
  void progress(ms::AnalysisPhase phase, int ranks);

 private:
  void startNext();
  void finished(std::shared_ptr<const PlanSnapshot> snapshot);
  QThreadPool m_pool;
  QThreadPool m_reaper;  // frees old snapshots
  std::optional<RunConfig> m_pending;
  std::optional<RunConfig> m_lastRequested;
  std::optional<Calibration> m_calibration;
  bool m_running = false;
  bool m_paused = false;
  std::shared_ptr<const PlanSnapshot> m_held;  // finished while paused
  quint64 m_generation = 0;
  std::shared_ptr<const PlanSnapshot> m_latest;
};

}  // namespace ms

Q_DECLARE_METATYPE(std::shared_ptr<const ms::PlanSnapshot>)
Q_DECLARE_METATYPE(ms::AnalysisPhase)
