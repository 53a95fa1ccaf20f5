// Plan analysis; see plan_analysis.h.
#include "ui/models/plan_analysis.h"

#include <QElapsedTimer>
#include <limits>
#include <utility>

#include "plan/cost_model.h"

namespace ms {

bool allowsDeviceSharing(const RunConfig& config) {
  if (config.device == DeviceChoice::Cpu) return true;
  for (const NodeConfig& n : config.mesh.nodes)
    if (n.device != "cpu") return false;
  return true;
}

QString phaseText(AnalysisPhase phase, int ranks) {
  switch (phase) {
    case AnalysisPhase::Validating:
      return QObject::tr("checking the settings");
    case AnalysisPhase::Building:
      return QObject::tr("building the plan");
    case AnalysisPhase::Simulating:
      return QObject::tr("simulating one step of %n rank(s)", nullptr, ranks);
    case AnalysisPhase::Memory:
      return QObject::tr("estimating the memory of %n rank(s)", nullptr, ranks);
    case AnalysisPhase::Timeline:
      return QObject::tr("laying out the timeline");
    case AnalysisPhase::NUM_PHASES:
      break;
  }
  return {};
}

std::shared_ptr<const PlanSnapshot> analyzePlan(const RunConfig& config, quint64 generation,
                                                const std::optional<Calibration>& calibration,
                                                const std::function<void(AnalysisPhase, int)>& progress) {
  QElapsedTimer timer;
  timer.start();
  const auto phase = [&](AnalysisPhase p, int ranks) {
    if (progress) progress(p, ranks);
  };
  auto out = std::make_shared<PlanSnapshot>();
  out->config = config;
  out->generation = generation;
  phase(AnalysisPhase::Validating, 0);
  const ConfigErrors errors = validateRunConfig(config);
  if (!errors.empty()) {
    out->error = QString::fromStdString(formatConfigErrors(errors, config.name));
  } else {
    phase(AnalysisPhase::Building, 0);
    auto plan = buildPlan(config, allowsDeviceSharing(config));
    if (!plan) {
      out->error = QString::fromStdString(plan.message());
    } else {
      out->plan = std::move(*plan);
      CostModel costs(*out->plan);
      if (calibration) {
        if (!(calibration->model == config.model))
          out->calibrationNote =
              QObject::tr("calibration from %1 not used: another model").arg(calibration->source);
        else if (calibration->tp != config.parallel.tp)
          out->calibrationNote = QObject::tr("calibration from %1 not used: it was measured at tp %2")
                                     .arg(calibration->source)
                                     .arg(calibration->tp);
        else if (calibration->recompute != config.parallel.recompute ||
                 calibration->recomputeLayers != config.parallel.recomputeLayers)
          out->calibrationNote =
              QObject::tr("calibration from %1 not used: recompute differs").arg(calibration->source);
        else {
          // Per sample times the plan's microbatch size: a layer's time is taken as linear in its samples.
          const double samples = out->plan->microbatchSize();
          LayerTimes t = calibration->perSample;
          for (auto* v : {&t.forward, &t.backwardInput, &t.backwardWeight})
            for (double& x : *v) x *= samples;
          const Status s = costs.setMeasuredTimes(std::move(t));
          out->calibrated = s.isOk();
          out->calibrationNote = s ? QObject::tr("compute times measured by %1").arg(calibration->source)
                                   : QString::fromStdString(s.message());
        }
      }
      const int ranks = out->plan->layout.world();
      phase(AnalysisPhase::Simulating, ranks);
      out->sim = simulate(*out->plan, costs);
      phase(AnalysisPhase::Memory, ranks);
      out->memory = estimateMemory(*out->plan);
      phase(AnalysisPhase::Timeline, ranks);
      out->timeline = timelineFromSimulation(*out->plan, out->sim);
      if (config.parallel.mode == ParallelMode::ParameterServer) {
        // The plan above is one worker's (the whole model at its microbatch); the mode's own prediction
        // replaces its step, throughput, memory and timeline.
        auto ps = predictParameterServer(config);
        if (!ps) {
          out->plan.reset();
          out->error = QString::fromStdString(ps.message());
        } else {
          const double perSample = isLanguageModel(config.model.type) ? config.training.seqLen : 1;
          out->sim.stepTime = ps->stepTime;
          out->sim.tokensPerSecond = ps->samplesPerSecond * perSample;
          out->sim.mfuDefined = false;
          out->memory.clear();
          for (const PsWorkerPrediction& w : ps->workers) {
            MemoryBreakdown m;
            m.rank = w.index;
            m.parameters = w.parameterBytes;
            m.gradients = w.gradientBytes;
            m.optimizer = w.optimizerBytes;
            m.activations = w.activationBytes;
            m.other = w.otherBytes;
            m.capacity = w.capacity;
            out->memory.push_back(m);
          }
          out->timeline = timelineFromPsPrediction(*ps);
          out->ps = std::move(*ps);
        }
      }
    }
  }
  out->millis = double(timer.nsecsElapsed()) / 1e6;
  return out;
}

MemoryBars memoryBars(const PlanSnapshot& snapshot) {
  MemoryBars out;
  out.memory = snapshot.memory;
  if (!snapshot.ps) return out;
  const auto& nodes = snapshot.config.mesh.nodes;
  for (MemoryBreakdown& m : out.memory) {
    m.stage = 0;
    out.names << QObject::tr("worker %1").arg(m.rank);
  }
  for (const PsServerPrediction& s : snapshot.ps->servers) {
    MemoryBreakdown m;
    m.rank = s.index;
    m.stage = 1;
    m.parameters = s.parameterBytes;
    m.gradients = s.gradientBytes;
    m.optimizer = s.optimizerBytes;
    m.other = s.otherBytes;
    // A catalog without host memory for the node: no capacity to hold it against (drawn as fitting).
    m.capacity = s.capacity > 0 ? s.capacity : std::numeric_limits<double>::infinity();
    out.memory.push_back(m);
    const QString node = s.node >= 0 && s.node < static_cast<int>(nodes.size())
                             ? QString::fromStdString(nodes[static_cast<size_t>(s.node)].name)
                             : QString();
    out.names << (node.isEmpty() ? QObject::tr("server %1").arg(s.index)
                                 : QObject::tr("server %1 (%2)").arg(s.index).arg(node));
  }
  out.groupNames << QObject::tr("workers") << QObject::tr("servers");
  return out;
}

PlanAnalyzer::PlanAnalyzer(QObject* parent) : QObject(parent) {
  qRegisterMetaType<std::shared_ptr<const PlanSnapshot>>();
  qRegisterMetaType<AnalysisPhase>();
  m_pool.setMaxThreadCount(1);
  m_reaper.setMaxThreadCount(1);
}

PlanAnalyzer::~PlanAnalyzer() {
  m_pool.waitForDone();
  m_reaper.waitForDone();
}

void PlanAnalyzer::releaseLater(std::shared_ptr<const PlanSnapshot> snapshot) {
  if (!snapshot) return;
  m_reaper.start([snapshot = std::move(snapshot)]() mutable { snapshot.reset(); });
}

void PlanAnalyzer::setCalibration(std::optional<Calibration> calibration) {
  m_calibration = std::move(calibration);
  if (m_lastRequested) request(*m_lastRequested);
}

void PlanAnalyzer::request(const RunConfig& config) {
  m_lastRequested = config;
  m_pending = config;
  if (!m_running) startNext();
}

void PlanAnalyzer::startNext() {
  if (!m_pending) return;
  RunConfig config = std::move(*m_pending);
  m_pending.reset();
  m_running = true;
  const quint64 generation = ++m_generation;
  emit started(generation);
  m_pool.start([this, config = std::move(config), generation, calibration = m_calibration] {
    const auto report = [this](AnalysisPhase phase, int ranks) {
      QMetaObject::invokeMethod(
          this, [this, phase, ranks] { emit progress(phase, ranks); }, Qt::QueuedConnection);
    };
    auto snapshot = analyzePlan(config, generation, calibration, report);
    // Back to the analyzer's thread. `this` is alive here: the destructor waits for the pool first; an event
    // still queued when the analyzer is destroyed is discarded by Qt with it.
    QMetaObject::invokeMethod(
        this, [this, snapshot] { finished(snapshot); }, Qt::QueuedConnection);
  });
}

void PlanAnalyzer::setPaused(bool paused) {
  m_paused = paused;
  if (!paused && m_held) finished(std::exchange(m_held, nullptr));
}

void PlanAnalyzer::finished(std::shared_ptr<const PlanSnapshot> snapshot) {
  if (m_paused) {
    m_held = std::move(snapshot);
    return;
  }
  m_running = false;
  releaseLater(std::exchange(m_latest, snapshot));
  emit ready(snapshot);
  startNext();
}

}  // namespace ms
