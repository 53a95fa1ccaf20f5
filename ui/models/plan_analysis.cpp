// Plan analysis; see plan_analysis.h.
#include "ui/models/plan_analysis.h"

#include <QElapsedTimer>

#include "plan/cost_model.h"

namespace ms {

bool allowsDeviceSharing(const RunConfig& config) {
  if (config.device == DeviceChoice::Cpu) return true;
  for (const NodeConfig& n : config.mesh.nodes)
    if (n.device != "cpu") return false;
  return true;
}

std::shared_ptr<const PlanSnapshot> analyzePlan(const RunConfig& config, quint64 generation,
                                                const std::optional<Calibration>& calibration) {
  QElapsedTimer timer;
  timer.start();
  auto out = std::make_shared<PlanSnapshot>();
  out->config = config;
  out->generation = generation;
  const ConfigErrors errors = validateRunConfig(config);
  if (!errors.empty()) {
    out->error = QString::fromStdString(formatConfigErrors(errors, config.name));
  } else {
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
        else if (calibration->recompute != config.parallel.recompute)
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
      out->sim = simulate(*out->plan, costs);
      out->memory = estimateMemory(*out->plan);
      out->timeline = timelineFromSimulation(*out->plan, out->sim);
    }
  }
  out->millis = double(timer.nsecsElapsed()) / 1e6;
  return out;
}

PlanAnalyzer::PlanAnalyzer(QObject* parent) : QObject(parent) {
  qRegisterMetaType<std::shared_ptr<const PlanSnapshot>>();
  m_pool.setMaxThreadCount(1);
}

PlanAnalyzer::~PlanAnalyzer() {
  m_pool.waitForDone();
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
  m_pool.start([this, config = std::move(config), generation, calibration = m_calibration] {
    auto snapshot = analyzePlan(config, generation, calibration);
    // Back to the analyzer's thread. `this` is alive here: the destructor waits for the pool first; an event
    // still queued when the analyzer is destroyed is discarded by Qt with it.
    QMetaObject::invokeMethod(
        this, [this, snapshot] { finished(snapshot); }, Qt::QueuedConnection);
  });
}

void PlanAnalyzer::finished(std::shared_ptr<const PlanSnapshot> snapshot) {
  m_running = false;
  m_latest = snapshot;
  emit ready(snapshot);
  startNext();
}

}  // namespace ms
