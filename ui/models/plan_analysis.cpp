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

std::shared_ptr<const PlanSnapshot> analyzePlan(const RunConfig& config, quint64 generation) {
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
      out->sim = simulate(*out->plan, CostModel(*out->plan));
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

void PlanAnalyzer::request(const RunConfig& config) {
  m_pending = config;
  if (!m_running) startNext();
}

void PlanAnalyzer::startNext() {
  if (!m_pending) return;
  RunConfig config = std::move(*m_pending);
  m_pending.reset();
  m_running = true;
  const quint64 generation = ++m_generation;
  m_pool.start([this, config = std::move(config), generation] {
    auto snapshot = analyzePlan(config, generation);
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
