// A parameter server; see ps.h.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "common/metrics_schema.h"
#include "kernels/cpu/cpu_ops.h"
#include "plan/parameter_server.h"
#include "plan/ps_model.h"
#include "runtime/file_io.h"
#include "runtime/heartbeat.h"
#include "runtime/metrics.h"
#include "runtime/optimizer.h"
#include "runtime/parameters.h"
#include "runtime/ps.h"
#include "runtime/ps_wire.h"
#include "runtime/trainer.h"

namespace ms {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

namespace key = metrics::key;

struct WorkerState {
  bool known = false;     // has pulled at least once
  bool live = false;      // pulling and pushing, not dropped, not gone
  bool finished = false;  // said bye
  std::string peer;       // its pull socket's routing id (the heartbeat socket has another)
  Clock::time_point lastSeen{};
  int64_t steps = 0;  // its pushes applied
  int64_t clock = 0;  // bounded's step clock: its pushes applied, raised to the slowest's when it (re)joins
  // A pull waiting for the consistency to allow it (one per worker: a resent pull replaces it).
  bool pullPending = false;
  int64_t pullReq = 0;
  int64_t pullMinVersion = 0;
  // Throughput since the last ps line.
  double computeS = 0;
  int64_t samples = 0;
  int64_t windowSteps = 0;
};

struct PendingPush {
  std::vector<float> grads;
};

class Server {
 public:
  Server(const RunConfig& config, const PsServerOptions& options)
      : m_config(config),
        m_options(options),
        m_S(config.parallel.servers),
        m_W(config.parallel.workers),
        m_lead(options.index == 0),
        m_runDir(runDirectory(config, options.runDir)),
        m_dir(m_runDir + "/servers/server-" + std::to_string(options.index)),
        m_spec(buildModelSpec(config.model, config.training.seqLen)),
        m_updatesPerStep(config.parallel.consistency == Consistency::Sync ? 1 : config.parallel.workers),
        m_target(int64_t(config.training.steps) * m_updatesPerStep),
        m_workers(config.parallel.workers) {
    std::random_device rd;
    m_incarnation = (int64_t(rd()) << 20) ^ int64_t(rd());
    if (m_incarnation < 0) m_incarnation = -m_incarnation;
  }

  Status prepare() {
    // One thread: a server's work is memory-bound streaming, and idle OpenMP threads spinning between
    // updates would take cores from the workers on the same machine.
    cpu::setThreads(1);
    auto shards = assignServers(m_spec, m_config);
    if (!shards) return shards.status();
    StoreLayout layout;
    layout.layers = shards->layers[m_options.index];
    layout.holdsEmbedding = std::find(layout.layers.begin(), layout.layers.end(), 0) != layout.layers.end();
    m_params.emplace(m_spec, m_config.model.type, m_config.model.tieEmbeddings, layout, nullptr, &m_tracker);
    m_params->initialize(m_config.seed);
    m_optimizer.emplace(m_config.optimizer, *m_params, &m_tracker);
    MS_TRY(makeDirs(m_dir));
    if (m_options.resume) MS_TRY(loadNewest());
    if (m_lead) {
      MS_TRY(m_metrics.open(m_options.metricsSink, m_runDir + "/metrics.jsonl", m_options.resume));
      m_metrics.startClock(Clock::now());
      writeRunStart();
    }
    try {
      m_socket = zmq::socket_t(m_context, zmq::socket_type::router);
      m_socket.set(zmq::sockopt::linger, 0);
      m_socket.bind(m_options.bind);
    } catch (const zmq::error_t& e) {
      return Status::error("server " + std::to_string(m_options.index) + ": cannot listen on " +
                           m_options.bind + ": " + e.what());
    }
    std::fprintf(stderr, "server %d: %zu layers, %lld parameters, listening on %s%s\n", m_options.index,
                 layoutLayers(), static_cast<long long>(paramCount()), m_options.bind.c_str(),
                 m_resumedFrom.empty() ? "" : (", resumed from " + m_resumedFrom).c_str());
    return Status::ok();
  }

  Status run() {
    m_lastLine = Clock::now();
    m_lastLive = Clock::now();
    for (;;) {
      setActivity("server " + std::to_string(m_options.index) + ": version " + std::to_string(m_version));
      zmq::pollitem_t item{static_cast<void*>(m_socket), 0, ZMQ_POLLIN, 0};
      try {
        zmq::poll(&item, 1, std::chrono::milliseconds(50));
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) return endWith(metrics::status::kError, std::string("poll: ") + e.what());
      }
      while (auto m = ps::receive(m_socket, /*withPeer=*/true)) handle(*m);
      if (Status s = checkLiveness(); !s) return endWith(metrics::status::kError, s.message());
      if (m_config.parallel.consistency == Consistency::Sync) {
        if (Status s = trySyncApply(); !s) return endWith(metrics::status::kError, s.message());
      }
      serveWaitingPulls();
      if (m_options.stopRequested && m_options.stopRequested->load()) {
        saveCheckpoint(/*final=*/true);
        // A server other than 0 stopped after the run ended on server 0 (launch stops it then): a normal end.
        if (!m_lead && (done() || anyFinished())) break;
        return endWith(metrics::status::kInterrupted,
                       "stopped by request at step " + std::to_string(globalStep()));
      }
      if (finished()) break;
      // Nobody to train with: bounded, not a hang.
      const double grace = std::max(60.0, 3 * m_config.parallel.workerTimeoutS);
      if (liveCount() > 0) m_lastLive = Clock::now();
      if (ps::secondsSince(m_lastLive) > grace) {
        saveCheckpoint(/*final=*/true);
        return endWith(metrics::status::kError,
                       "no live worker for " + std::to_string(static_cast<int>(grace)) + " s at step " +
                           std::to_string(globalStep()) + " (" + std::to_string(m_version) +
                           " updates applied); the servers' checkpoints are in " + m_runDir + "/servers");
      }
    }
    saveCheckpoint(/*final=*/true);
    std::string reason;
    if (m_version < m_target)
      reason = "the workers finished with " + std::to_string(m_version) + " of " + std::to_string(m_target) +
               " updates applied on server " + std::to_string(m_options.index);
    if (m_lead && !m_finalEvalDone)
      reason += std::string(reason.empty() ? "" : "; ") +
                "no final evaluation "
                "(the worker evaluating it was lost)";
    return endWith(metrics::status::kOk, reason);
  }

 private:
  size_t layoutLayers() const { return m_params->layout().layers.size(); }
  int64_t paramCount() const {
    int64_t n = 0;
    for (const Parameter& p : m_params->params())
      if (!p.tiedCopy) n += static_cast<int64_t>(p.numel);
    return n;
  }
  int64_t globalStep() const { return m_version / m_updatesPerStep; }
  bool done() const { return m_version >= m_target; }
  int liveCount() const {
    int n = 0;
    for (const WorkerState& w : m_workers) n += w.live ? 1 : 0;
    return n;
  }
  bool anyFinished() const {
    for (const WorkerState& w : m_workers)
      if (w.finished) return true;
    return false;
  }
  // The run is over for this server: nobody left to serve, and done; or (servers other than 0, whose
  // pushes may have been lost) the workers finished the run on server 0 and none has come for
  // worker_timeout_s since (a worker still starting may not have reached this server yet; under launch,
  // server 0's end stops this one anyway).
  bool finished() {
    if (liveCount() > 0) {
      m_idleSince.reset();
      return false;
    }
    if (done()) return true;
    if (!anyFinished()) return false;
    if (!m_idleSince) m_idleSince = Clock::now();
    return ps::secondsSince(*m_idleSince) > m_config.parallel.workerTimeoutS;
  }

  void writeRunStart() {
    nlohmann::json layers = nlohmann::json::array();
    for (const LayerSpec& l : m_spec.layers)
      layers.push_back({{key::kName, l.name}, {key::kParams, l.paramCount()}});
    m_metrics.write(metrics::type::kRunStart, {{key::kName, m_config.name},
                                               {key::kConfig, toJson(m_config)},
                                               {key::kRanks, m_S + m_W},
                                               {key::kParams, m_spec.paramCount()},
                                               {key::kLayers, layers},
                                               {key::kStartStep, globalStep()},
                                               {key::kSteps, m_config.training.steps},
                                               {key::kRunDir, m_runDir},
                                               {key::kResumedFrom, m_resumedFrom},
                                               {key::kStartUnix, unixTimeS()},
                                               {key::kPredicted, predictedJson()},
                                               {key::kPsServers, m_S},
                                               {key::kPsWorkers, m_W},
                                               {key::kConsistency, toString(m_config.parallel.consistency)}});
  }

  // The plan's predictions for this run (plan/ps_model.h), as collective runs' run_start carries theirs.
  nlohmann::json predictedJson() const {
    auto p = predictParameterServer(m_config);
    if (!p) return nlohmann::json::object();
    const double perSample = isLanguageModel(m_config.model.type) ? m_config.training.seqLen : 1;
    return {{key::kStepTimeS, p->stepTime},
            {key::kTokensPerS, p->samplesPerSecond * perSample},
            {key::kPsMeanStaleness, p->meanStaleness}};
  }

  void log(const char* level, const std::string& message) {
    std::fprintf(stderr, "server %d: %s\n", m_options.index, message.c_str());
    if (m_lead) m_metrics.write(metrics::type::kLog, {{key::kLevel, level}, {key::kMessage, message}});
  }

  Status endWith(const char* status, const std::string& reason) {
    if (m_lead) {
      writePsLine(true);
      m_metrics.write(metrics::type::kRunEnd,
                      {{key::kStatus, status}, {key::kReason, reason}, {key::kStep, globalStep()}});
    }
    if (std::string(status) == metrics::status::kError) return Status::error(reason);
    if (!reason.empty()) std::fprintf(stderr, "server %d: %s\n", m_options.index, reason.c_str());
    if (std::string(status) == metrics::status::kInterrupted)
      return Status::error(reason).withContext("interrupted");
    return m_lead ? m_metrics.status() : Status::ok();
  }

  // ---- messages ----

  WorkerState* workerOf(const nlohmann::json& h) {
    const int w = h.value("worker", -1);
    if (w < 0 || w >= m_W) return nullptr;
    return &m_workers[w];
  }

  void handle(ps::Message& m) {
    const std::string type = m.header.value("type", "");
    if (std::getenv("MS_PS_TRACE") && type != "beat")
      std::fprintf(stderr, "%.6f recv %s w%d v%lld\n", ps::secondsSince(m_startTime), type.c_str(),
                   m.header.value("worker", -1), static_cast<long long>(m_version));
    WorkerState* w = workerOf(m.header);
    if (!w) return;
    const int id = static_cast<int>(w - m_workers.data());
    w->lastSeen = Clock::now();
    if (type == ps::msg::kBeat) return;
    if (type == ps::msg::kPull) {
      if (!w->live) {
        w->live = true;
        w->finished = false;
        log("info", "worker " + std::to_string(id) + (w->known ? " rejoined" : " joined") + " at step " +
                        std::to_string(globalStep()));
        w->known = true;
        // Bounded staleness counts steps from here: a (re)joining worker starts level with the slowest.
        w->clock = std::max(w->clock, minLiveClock(id));
      }
      w->peer = m.peer;
      w->pullPending = true;
      w->pullReq = m.header.value("req", int64_t(0));
      w->pullMinVersion = m.header.value("incarnation", int64_t(0)) == m_incarnation
                              ? m.header.value("min_version", int64_t(0))
                              : 0;
      return;
    }
    if (type == ps::msg::kPush) {
      handlePush(id, *w, m);
      return;
    }
    if (type == ps::msg::kEval && m_lead) {
      nlohmann::json line = {{key::kStep, m.header.value("step", int64_t(0))},
                             {key::kLoss, m.header.value("loss", 0.0)},
                             {key::kSamples, m.header.value("samples", int64_t(0))},
                             {key::kTimeS, m.header.value("time_s", 0.0)},
                             {key::kPsWorker, id}};
      if (m.header.contains("accuracy")) line[key::kAccuracy] = m.header.value("accuracy", 0.0);
      m_metrics.write(metrics::type::kEval, line);
      if (m.header.value("step", int64_t(-1)) >= m_config.training.steps) m_finalEvalDone = true;
      return;
    }
    if (type == ps::msg::kBye) {
      w->live = false;
      w->pullPending = false;
      w->finished = m.header.value("complete", false);
      if (!w->finished) log("warning", "worker " + std::to_string(id) + " left before the end");
      m_pending.erase(id);
    }
  }

  int64_t minLiveClock(int except) const {
    int64_t least = -1;
    for (int i = 0; i < m_W; ++i)
      if (i != except && m_workers[i].live && (least < 0 || m_workers[i].clock < least))
        least = m_workers[i].clock;
    return least < 0 ? 0 : least;
  }

  void handlePush(int id, WorkerState& w, ps::Message& m) {
    if (!w.live || done()) return;  // a dropped worker's late push, or one past the end
    if (m.payload.size() != m_params->size()) {
      log("warning", "worker " + std::to_string(id) + " pushed " + std::to_string(m.payload.size()) +
                         " values, the shard has " + std::to_string(m_params->size()) + "; dropped");
      return;
    }
    if (m_lead) takeSpans(id, m.header);
    const int64_t base = m.header.value("version", int64_t(-1));
    const bool sameIncarnation = m.header.value("incarnation", int64_t(0)) == m_incarnation;
    m_window.lossSum += m.header.value("loss_sum", 0.0);
    m_window.count += m.header.value("count", int64_t(0));
    m_window.correct += m.header.value("correct", int64_t(0));
    w.computeS += m.header.value("compute_s", 0.0);
    w.samples += m.header.value("samples", int64_t(0));
    w.windowSteps += 1;
    if (m_config.parallel.consistency == Consistency::Sync) {
      if (!sameIncarnation || base != m_version) {
        ++m_discarded;
        return;
      }
      m_pending[id].grads = std::move(m.payload);
      return;
    }
    // async, bounded: applied now.
    float* g = m_params->grads();
    std::copy(m.payload.begin(), m.payload.end(), g);
    const int64_t staleness =
        sameIncarnation && base >= 0 ? std::max<int64_t>(0, m_version - base) : m_version;
    apply(1.0f);
    recordStaleness(staleness);
    w.steps += 1;
    w.clock += 1;
  }

  // ---- updates ----

  Status trySyncApply() {
    if (m_pending.empty() || done()) return Status::ok();
    for (int i = 0; i < m_W; ++i)
      if (m_workers[i].live && !m_pending.count(i)) return Status::ok();
    // The sum in worker order (std::map): with every worker alive, what the collective all-reduce computes.
    float* g = m_params->grads();
    bool first = true;
    for (auto& [id, push] : m_pending) {
      if (first)
        std::copy(push.grads.begin(), push.grads.end(), g);
      else
        for (size_t i = 0; i < push.grads.size(); ++i) g[i] += push.grads[i];
      first = false;
    }
    const int n = static_cast<int>(m_pending.size());
    // Lost pushes: the loss scale was 1 / the whole batch's targets, so the sum of n pushes is n / W of a
    // mean; rescale to the mean over the samples that arrived.
    const float scale = n == m_W ? 1.0f : float(m_W) / float(n);
    apply(scale);
    for (auto& [id, push] : m_pending) {
      m_workers[id].steps += 1;
      m_workers[id].clock += 1;
      recordStaleness(0);
    }
    m_pending.clear();
    return Status::ok();
  }

  // One optimizer update from the gradients in the store, times scale.
  void apply(float scale) {
    const double start = ps::wallSeconds();
    const int64_t step = m_version / m_updatesPerStep;
    const double lr = learningRate(m_config, step);
    const double norm = std::sqrt(m_params->ownedGradSquares()) * scale;
    m_lastGradNorm = norm;
    m_lastLr = lr;
    m_optimizer->step(static_cast<float>(lr), clipFactor(norm, m_config.training.gradClip) * scale);
    (void)m_params->finishUpdate();
    // The update's span: server 0 keeps its own for the stream; another server hands its spans to worker 0's
    // next pull, which relays them to server 0 with its push.
    const nlohmann::json span = nlohmann::json::array({"U", start, ps::wallSeconds()});
    if (m_lead)
      addSpan(m_W, span);
    else if (m_relayOut.size() < kMaxLaneSpans)
      m_relayOut.push_back(nlohmann::json::array({span[1], span[2]}));
    ++m_version;
    afterUpdate();
  }

  // ---- the measured timeline (server 0) ----

  // Lane l: worker l (l < W) or server l - W.
  void addSpan(int lane, const nlohmann::json& span) {
    nlohmann::json& spans = m_lanes[static_cast<size_t>(lane)];
    if (spans.size() >= kMaxLaneSpans) spans.erase(spans.begin());  // the newest kept
    spans.push_back(span);
  }

  // A push's spans: the worker's own ["P"|"C"|"S", start, end], and from worker 0 the other servers' updates
  // [server, start, end]. Malformed entries are skipped: the stream stays valid whatever a peer sends.
  void takeSpans(int id, const nlohmann::json& header) {
    auto valid = [](const nlohmann::json& a, size_t n) {
      if (!a.is_array() || a.size() != n) return false;
      for (size_t i = 1; i < n; ++i)
        if (!a[i].is_number()) return false;
      return true;
    };
    if (const auto it = header.find("spans"); it != header.end() && it->is_array())
      for (const nlohmann::json& sp : *it)
        if (valid(sp, 3) && sp[0].is_string() && sp[0].get<std::string>().size() == 1) addSpan(id, sp);
    if (const auto it = header.find("server_spans"); id == 0 && it != header.end() && it->is_array())
      for (const nlohmann::json& sp : *it)
        if (valid(sp, 3) && sp[0].is_number_integer() && sp[0].get<int>() > 0 && sp[0].get<int>() < m_S)
          addSpan(m_W + sp[0].get<int>(), nlohmann::json::array({"U", sp[1], sp[2]}));
  }

  // The spans line after a step line: every lane's spans since the last one, times in wall-clock seconds
  // (the studio draws them from the earliest).
  void writeSpansLine(int64_t step) {
    nlohmann::json ranks = nlohmann::json::array();
    for (int lane = 0; lane < m_W + m_S; ++lane) {
      nlohmann::json& spans = m_lanes[static_cast<size_t>(lane)];
      if (spans.empty()) continue;
      nlohmann::json list = nlohmann::json::array();
      for (const nlohmann::json& sp : spans)
        list.push_back({{key::kAction, sp[0]}, {key::kStart, sp[1]}, {key::kEnd, sp[2]}});
      ranks.push_back({{key::kRank, lane},
                       {key::kPsLane, lane < m_W ? "worker " + std::to_string(lane)
                                                 : "server " + std::to_string(lane - m_W)},
                       {key::kSpans, std::move(list)}});
      spans = nlohmann::json::array();
    }
    if (!ranks.empty())
      m_metrics.write(metrics::type::kSpans, {{key::kStep, step}, {key::kRanks, std::move(ranks)}});
  }

  void recordStaleness(int64_t s) {
    if (static_cast<int64_t>(m_staleness.size()) <= s) m_staleness.resize(static_cast<size_t>(s) + 1, 0);
    ++m_staleness[static_cast<size_t>(s)];
    ++m_windowStaleness[s];
  }

  void afterUpdate() {
    if (m_version % m_updatesPerStep != 0) return;
    const int64_t step = globalStep();
    const int64_t steps = m_config.training.steps;
    if (m_lead && (step % m_config.training.logEvery == 0 || step == steps)) writeStepLine(step);
    const int evalEvery = m_config.training.evalEvery;
    if (m_lead && evalEvery > 0 && step % evalEvery == 0 && step < steps) m_evalDue = step;
    if (m_lead && step == steps) m_evalDue = steps;
    const int every = m_config.training.checkpointEvery;
    if (every > 0 && step % every == 0 && step < steps) saveCheckpoint(false);
    if (m_options.dieAtStep > 0 && step == m_options.dieAtStep) {
      std::fprintf(stderr, "server %d: killed at step %lld as asked (--kill-server)\n", m_options.index,
                   static_cast<long long>(step));
      std::raise(SIGKILL);
    }
  }

  void writeStepLine(int64_t step) {
    const double secs = ps::secondsSince(m_lastLine);
    const int64_t stepsSince = std::max<int64_t>(1, step - m_lastLineStep);
    m_lastLine = Clock::now();
    m_lastLineStep = step;
    nlohmann::json line = {
        {key::kStep, step},
        {key::kLoss, m_window.count ? m_window.lossSum / double(m_window.count) : 0.0},
        {key::kLr, m_lastLr},
        {key::kGradNorm, m_lastGradNorm},
        {key::kStepTimeS, secs / double(stepsSince)},
        {key::kSamplesPerS, double(m_window.samplesTotal(m_workers)) / std::max(secs, 1e-9)},
        {key::kPsVersion, m_version}};
    if (isLanguageModel(m_config.model.type))
      line[key::kTokensPerS] =
          double(m_window.samplesTotal(m_workers)) * m_config.training.seqLen / std::max(secs, 1e-9);
    else if (m_window.count)
      line[key::kAccuracy] = double(m_window.correct) / double(m_window.count);
    m_metrics.write(metrics::type::kStep, line);
    writePsLine(false);
    writeSpansLine(step);
    m_window = {};
  }

  // The ps line: the staleness histogram since the last one and in total, and every worker's state.
  void writePsLine(bool final) {
    if (!m_lead) return;
    nlohmann::json workers = nlohmann::json::array();
    for (int i = 0; i < m_W; ++i) {
      WorkerState& w = m_workers[i];
      nlohmann::json j = {{key::kPsWorker, i}, {key::kPsLive, w.live}, {key::kSteps, w.steps}};
      if (w.windowSteps > 0) {
        j[key::kStepTimeS] = w.computeS / double(w.windowSteps);
        j[key::kSamplesPerS] = w.computeS > 0 ? double(w.samples) / w.computeS : 0.0;
      }
      workers.push_back(j);
      w.computeS = 0;
      w.samples = 0;
      w.windowSteps = 0;
    }
    nlohmann::json window = nlohmann::json::array();
    if (!m_windowStaleness.empty()) {
      window = nlohmann::json::array();
      const int64_t most = m_windowStaleness.rbegin()->first;
      for (int64_t s = 0; s <= most; ++s)
        window.push_back(m_windowStaleness.count(s) ? m_windowStaleness[s] : 0);
    }
    m_windowStaleness.clear();
    m_metrics.write(metrics::type::kPs, {{key::kStep, globalStep()},
                                         {key::kPsVersion, m_version},
                                         {key::kPsStaleness, window},
                                         {key::kPsStalenessTotal, m_staleness},
                                         {key::kPsDiscarded, m_discarded},
                                         {key::kPsWorkerStates, workers},
                                         {key::kPsFinal, final}});
  }

  // ---- pulls ----

  bool pullAllowed(int id, const WorkerState& w) const {
    if (done()) return true;
    switch (m_config.parallel.consistency) {
      case Consistency::Sync:
        return m_version >= w.pullMinVersion;
      case Consistency::Bounded:
        return w.clock - minLiveClock(-1) <= m_config.parallel.staleness;
      case Consistency::Async:
        return true;
    }
    (void)id;
    return true;
  }

  // The first step waits for every worker to join (or for worker_timeout_s after the server started, when one
  // never comes): sync would otherwise apply its first versions with whoever connected first.
  bool everyoneArrived() {
    if (m_started) return true;
    int known = 0;
    for (const WorkerState& w : m_workers) known += w.known ? 1 : 0;
    if (known == m_W || ps::secondsSince(m_startTime) > m_config.parallel.workerTimeoutS) m_started = true;
    return m_started;
  }

  void serveWaitingPulls() {
    if (m_config.parallel.consistency != Consistency::Async && !everyoneArrived()) return;
    for (int id = 0; id < m_W; ++id) {
      WorkerState& w = m_workers[id];
      if (!w.pullPending || !pullAllowed(id, w)) continue;
      w.pullPending = false;
      nlohmann::json h = {{"type", ps::msg::kParams},     {"req", w.pullReq}, {"version", m_version},
                          {"incarnation", m_incarnation}, {"done", done()},   {"evaluate", false}};
      if (m_config.parallel.consistency == Consistency::Sync) {
        h["batch"] = m_version;
        h["slot"] = id;
      } else {
        h["batch"] = m_handedOut / m_W;
        h["slot"] = m_handedOut % m_W;
        if (!done()) ++m_handedOut;
      }
      if (m_lead && m_evalDue > 0 && (!done() || m_evalDue == m_config.training.steps)) {
        h["evaluate"] = true;
        h["eval_step"] = m_evalDue;
        m_evalDue = 0;
      }
      if (!gatherValues()) continue;
      if (!m_lead && id == 0 && !m_relayOut.empty()) {
        h["updates"] = std::move(m_relayOut);
        m_relayOut = nlohmann::json::array();
      }
      ps::send(m_socket, h, m_values.data(), m_values.size(), &w.peer);
      if (std::getenv("MS_PS_TRACE"))
        std::fprintf(stderr, "%.6f sent params w%d v%lld\n", ps::secondsSince(m_startTime), id,
                     static_cast<long long>(m_version));
    }
  }

  // The shard's values in the store's flat layout (mixed precision: the fp32 master weights), gathered once
  // per version whatever the pulls.
  bool gatherValues() {
    if (m_valuesVersion == m_version) return true;
    m_valuesVersion = m_version;
    m_values.assign(m_params->size(), 0.0f);
    std::vector<float> unit;
    for (size_t u = 0; u < m_params->units().size(); ++u) {
      const Unit& U = m_params->units()[u];
      if (!m_params->unitValues(static_cast<int>(u), unit)) return false;
      std::copy(unit.begin(), unit.begin() + std::min(unit.size(), U.size), m_values.begin() + U.begin);
    }
    return true;
  }

  // ---- liveness ----

  Status checkLiveness() {
    const double timeout = m_config.parallel.workerTimeoutS;
    for (int id = 0; id < m_W; ++id) {
      WorkerState& w = m_workers[id];
      if (!w.live || ps::secondsSince(w.lastSeen) <= timeout) continue;
      w.live = false;
      w.pullPending = false;
      m_pending.erase(id);
      log("warning", "worker " + std::to_string(id) + " dropped: no message for " + std::to_string(timeout) +
                         " s; going on with " + std::to_string(liveCount()) + " worker(s)");
      if (m_lead && m_evalDue == 0 && !m_finalEvalDone && done()) m_evalDue = m_config.training.steps;
    }
    return Status::ok();
  }

  // ---- checkpoints ----

  std::string checkpointPath(int64_t version) const {
    char name[64];
    std::snprintf(name, sizeof name, "version-%012lld.safetensors", static_cast<long long>(version));
    return m_dir + "/" + name;
  }

  void saveCheckpoint(bool final) {
    if (m_savedVersion == m_version) return;
    std::vector<NamedTensor> tensors;
    std::vector<std::vector<float>> units(m_params->units().size());
    for (size_t u = 0; u < units.size(); ++u) (void)m_params->unitValues(static_cast<int>(u), units[u]);
    for (const Parameter& p : m_params->params()) {
      if (p.tiedCopy) continue;
      tensors.push_back({p.spec.name, p.shape, DType::F32,
                         units[p.unit].data() + (p.offset - m_params->units()[p.unit].begin)});
    }
    std::vector<std::vector<float>> host;
    for (NamedTensor& t : m_optimizer->stateTensors(host)) tensors.push_back(t);
    nlohmann::json meta = {{"version", m_version},
                           {"handed_out", m_handedOut},
                           {"optimizer_steps", m_optimizer->stepsTaken()},
                           {"staleness", m_staleness},
                           {"discarded", m_discarded}};
    const std::string path = checkpointPath(m_version);
    if (Status s = writeSafetensors(path, tensors, {{"meshstudio_ps", meta.dump()}}); !s) {
      log("error", "checkpoint " + path + ": " + s.message());
      return;
    }
    m_savedVersion = m_version;
    if (m_lead) m_metrics.write(metrics::type::kCheckpoint, {{key::kStep, globalStep()}, {key::kPath, path}});
    // Keep the newest keep_checkpoints (default 2): a restart needs one, a write cut short needs the one
    // before it.
    const int keep = m_config.training.keepCheckpoints > 0 ? m_config.training.keepCheckpoints : 2;
    std::vector<std::string> all = listCheckpoints();
    for (size_t i = 0; i + keep < all.size(); ++i) {
      std::error_code ec;
      fs::remove(all[i], ec);
    }
    (void) final;
  }

  std::vector<std::string> listCheckpoints() const {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(m_dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("version-", 0) == 0 && e.path().extension() == ".safetensors")
        out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  Status loadNewest() {
    const std::vector<std::string> all = listCheckpoints();
    if (all.empty()) {
      std::fprintf(stderr, "server %d: no checkpoint in %s; starting afresh\n", m_options.index,
                   m_dir.c_str());
      return Status::ok();
    }
    const std::string path = all.back();
    auto data = readSafetensors(path);
    if (!data) return data.status();
    auto it = data->metadata.find("meshstudio_ps");
    if (it == data->metadata.end()) return Status::error(path + ": not a parameter-server checkpoint");
    const nlohmann::json meta = nlohmann::json::parse(it->second, nullptr, false);
    if (!meta.is_object()) return Status::error(path + ": unreadable meshstudio_ps metadata");
    for (size_t u = 0; u < m_params->units().size(); ++u) {
      const Unit& U = m_params->units()[u];
      std::vector<float> full(U.size, 0.0f);
      for (int pi : U.params) {
        const Parameter& p = m_params->params()[pi];
        const LoadedTensor* t = data->find(p.spec.name);
        if (!t || t->f32.size() != p.numel)
          return Status::error(path + ": no tensor \"" + p.spec.name + "\" of the shard's shape");
        std::copy(t->f32.begin(), t->f32.end(), full.begin() + (p.offset - U.begin));
      }
      m_params->setUnitValues(static_cast<int>(u), full.data());
    }
    MS_TRY(m_optimizer->loadState(*data, meta.value("optimizer_steps", int64_t(0))).withContext(path));
    m_version = meta.value("version", int64_t(0));
    m_handedOut = meta.value("handed_out", int64_t(0));
    m_staleness = meta.value("staleness", std::vector<int64_t>{});
    m_discarded = meta.value("discarded", int64_t(0));
    m_savedVersion = m_version;
    m_resumedFrom = path;
    m_lastLineStep = globalStep();
    return Status::ok();
  }

  struct Window {
    double lossSum = 0;
    int64_t count = 0, correct = 0;
    int64_t samplesTotal(const std::vector<WorkerState>& ws) const {
      int64_t n = 0;
      for (const WorkerState& w : ws) n += w.samples;
      return n;
    }
  };

  const RunConfig& m_config;
  const PsServerOptions& m_options;
  const int m_S, m_W;
  const bool m_lead;
  const std::string m_runDir, m_dir;
  const ModelSpec m_spec;
  const int64_t m_updatesPerStep;  // sync: 1; async, bounded: one per worker and step
  const int64_t m_target;          // updates in the run
  int64_t m_incarnation = 0;       // this process's id: a pull or push naming another predates a restart

  MemoryTracker m_tracker{&hostBackend()};
  std::optional<ParameterStore> m_params;
  std::optional<Optimizer> m_optimizer;
  zmq::context_t m_context{1};
  zmq::socket_t m_socket;
  MetricsWriter m_metrics;

  int64_t m_version = 0;    // updates applied
  int64_t m_handedOut = 0;  // async, bounded: (batch, slot) pairs handed to workers
  int64_t m_savedVersion = -1;
  std::vector<WorkerState> m_workers;
  std::map<int, PendingPush> m_pending;  // sync: this version's pushes, by worker
  std::vector<int64_t> m_staleness;      // histogram over the run
  std::map<int64_t, int64_t> m_windowStaleness;
  int64_t m_discarded = 0;  // sync: pushes of an older version (a dropped worker's, or before a restart)
  Window m_window;
  double m_lastGradNorm = 0, m_lastLr = 0;
  Clock::time_point m_lastLine{}, m_lastLive{};
  int64_t m_lastLineStep = 0;
  int64_t m_evalDue = 0;
  bool m_finalEvalDone = false;
  bool m_started = false;                        // every worker has joined (or the wait for them is over)
  std::optional<Clock::time_point> m_idleSince;  // no live worker since
  Clock::time_point m_startTime = Clock::now();
  std::string m_resumedFrom;
  std::vector<float> m_values;
  int64_t m_valuesVersion = -1;
  // The measured timeline: server 0's lanes (workers, then servers) since the last spans line; another
  // server's update spans not yet handed to worker 0.
  static constexpr size_t kMaxLaneSpans = 512;
  std::vector<nlohmann::json> m_lanes =
      std::vector<nlohmann::json>(static_cast<size_t>(m_W + m_S), nlohmann::json::array());
  nlohmann::json m_relayOut = nlohmann::json::array();
};

}  // namespace

Status runPsServer(const RunConfig& config, const PsServerOptions& options) {
  Server server(config, options);
  MS_TRY(server.prepare());
  return server.run();
}

}  // namespace ms
