// A parameter-server worker; see ps.h.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <map>
#include <optional>
#include <thread>

#include "kernels/cpu/cpu_ops.h"
#include "plan/parameter_server.h"
#include "runtime/data.h"
#include "runtime/device.h"
#include "runtime/heartbeat.h"
#include "runtime/model.h"
#include "runtime/parameters.h"
#include "runtime/ps.h"
#include "runtime/ps_wire.h"
#include "runtime/trainer.h"

namespace ms {

using Clock = std::chrono::steady_clock;

namespace {

// One server as this worker sees it: its socket, which of the worker's units it holds (in the server's flat
// order), and what the last pull said.
struct ServerLink {
  std::string endpoint;
  zmq::socket_t socket;
  std::vector<int> units;     // worker-store unit indices, in the server store's unit order
  std::vector<size_t> begin;  // each unit's begin in the server's flat layout
  size_t size = 0;            // the server's flat size
  int64_t version = 0;        // of the parameters last pulled
  int64_t incarnation = 0;
  int64_t minVersion = 0;  // sync: the version after the one last pushed
  nlohmann::json reply;    // the last pull's header
};

class Worker {
 public:
  Worker(const RunConfig& config, const PsWorkerOptions& options)
      : m_config(config), m_options(options), m_id(options.index), m_W(config.parallel.workers) {}

  ~Worker() {
    m_beating = false;
    if (m_beat.joinable()) m_beat.join();
  }

  Status prepare() {
    if (m_id < 0 || m_id >= m_W)
      return Status::error("--index: worker " + std::to_string(m_id) + " does not exist (workers are 0 .. " +
                           std::to_string(m_W - 1) + ")");
    if (static_cast<int>(m_options.servers.size()) != m_config.parallel.servers)
      return Status::error("--servers: " + std::to_string(m_options.servers.size()) +
                           " endpoints given, the config has " + std::to_string(m_config.parallel.servers) +
                           " servers");
    const int threads = threadsPerRank(m_config);
    MS_TRY(cpu::checkThreads(threads));
    cpu::setThreads(threads);
    auto device = openDevice(m_config.device, m_id, m_options.emulateDevice);
    if (!device) return device.status();
    m_device = std::move(*device);
    m_device.backend->setGemmPrecision(m_config.parallel.precision == Precision::Bf16 ? GemmPrecision::Bf16
                                                                                      : GemmPrecision::Fp32);
    m_tracker.emplace(m_device.backend.get());
    auto data = openDataSource(m_config);
    if (!data) return data.status();
    m_data = std::move(*data);
    m_model.emplace(m_config, &*m_tracker);
    MS_TRY(linkServers());
    const int64_t B = m_config.training.batchSize;
    m_share = static_cast<int>(B / m_W);
    m_mbs = microbatchSize(m_config);
    // sync: collective data parallelism's scale (1 / the whole batch's targets), the servers sum the pushes;
    // async, bounded: each push is an update of its own, the mean over this worker's share.
    const int64_t perSample = isLanguageModel(m_config.model.type) ? m_config.training.seqLen : 1;
    const int64_t targets = (m_config.parallel.consistency == Consistency::Sync ? B : m_share) * perSample;
    m_lossScale = 1.0f / static_cast<float>(targets);
    for (const Straggler& s : m_config.parallel.stragglers)
      if (s.worker == m_id) m_slowdown = s.slowdown;
    m_beating = true;
    m_beat = std::thread([this] { beatLoop(); });
    return Status::ok();
  }

  Status run() {
    int64_t localStep = 0;
    for (;;) {
      if (m_options.stopRequested && m_options.stopRequested->load()) {
        bye(false);
        return Status::error("worker " + std::to_string(m_id) + ": stopped by request");
      }
      setActivity("worker " + std::to_string(m_id) + ": pull");
      const double pullStart = ps::wallSeconds();
      MS_TRY(pullAll());
      m_spans = nlohmann::json::array({nlohmann::json::array({"P", pullStart, ps::wallSeconds()})});
      const nlohmann::json& lead = m_links[0].reply;
      const bool done = lead.value("done", false);
      if (lead.value("evaluate", false)) evaluateNow(lead.value("eval_step", int64_t(0)));
      if (done) {
        bye(true);
        std::fprintf(stderr, "worker %d: done after %lld steps of its own\n", m_id,
                     static_cast<long long>(localStep));
        return Status::ok();
      }
      ++localStep;
      m_progress = localStep;
      if (m_options.dieAtStep > 0 && localStep == m_options.dieAtStep) {
        std::fprintf(stderr, "worker %d: killed at its step %lld as asked (--kill-worker)\n", m_id,
                     static_cast<long long>(localStep));
        std::fflush(stderr);
        std::raise(SIGKILL);
      }
      setActivity("worker " + std::to_string(m_id) + ": step " + std::to_string(localStep));
      const auto t0 = Clock::now();
      const double computeStart = ps::wallSeconds();
      LossStats stats = computeGradients(lead.value("batch", int64_t(0)), lead.value("slot", 0));
      m_device.backend->synchronize();
      const double compute = ps::secondsSince(t0);
      if (m_slowdown > 1)
        std::this_thread::sleep_for(std::chrono::duration<double>(compute * (m_slowdown - 1)));
      m_spans.push_back(nlohmann::json::array({"C", computeStart, ps::wallSeconds()}));
      const double pushStart = ps::wallSeconds();
      pushAll(stats, ps::secondsSince(t0));
      m_lastPush = {pushStart, ps::wallSeconds()};
    }
  }

 private:
  Status linkServers() {
    const ModelSpec& spec = m_model->spec();
    auto shards = assignServers(spec, m_config);
    if (!shards) return shards.status();
    ParameterStore& mine = m_model->params();
    std::map<std::string, int> unitByName;
    for (size_t u = 0; u < mine.units().size(); ++u) unitByName[mine.units()[u].name] = static_cast<int>(u);
    m_links.resize(m_options.servers.size());
    for (size_t s = 0; s < m_links.size(); ++s) {
      ServerLink& link = m_links[s];
      link.endpoint = m_options.servers[s];
      StoreLayout layout;
      layout.layers = shards->layers[s];
      layout.holdsEmbedding = std::find(layout.layers.begin(), layout.layers.end(), 0) != layout.layers.end();
      const StorePlan plan = planStore(spec, m_config.model.type, m_config.model.tieEmbeddings, layout);
      for (const Unit& u : plan.units) {
        auto it = unitByName.find(u.name);
        if (it == unitByName.end() || mine.units()[it->second].size != u.size)
          return Status::error("server " + std::to_string(s) + "'s unit " + u.name +
                               " does not match the worker's");
        link.units.push_back(it->second);
        link.begin.push_back(u.begin);
      }
      link.size = plan.total;
      try {
        link.socket = zmq::socket_t(m_context, zmq::socket_type::dealer);
        link.socket.set(zmq::sockopt::linger, 0);
        link.socket.connect(link.endpoint);
      } catch (const zmq::error_t& e) {
        return Status::error("--servers: cannot connect to " + link.endpoint + ": " + e.what());
      }
    }
    return Status::ok();
  }

  void sendPull(ServerLink& link, int64_t req) {
    ps::send(link.socket, {{"type", ps::msg::kPull},
                           {"worker", m_id},
                           {"req", req},
                           {"min_version", link.minVersion},
                           {"incarnation", link.incarnation}});
  }

  // Pulls every server's shard into the model. A server that does not answer within a second gets the
  // request again (it may have been restarted: ZeroMQ reconnects, the request in flight is lost); a sync or
  // bounded wait is answered when the server allows it, so the resends go on until serverTimeoutS of
  // silence from that server.
  Status pullAll() {
    const int64_t req = ++m_req;
    std::vector<bool> got(m_links.size(), false);
    std::vector<Clock::time_point> sent(m_links.size(), Clock::now());
    const auto asked = Clock::now();
    for (ServerLink& link : m_links) sendPull(link, req);
    size_t remaining = m_links.size();
    std::vector<zmq::pollitem_t> items(m_links.size());
    while (remaining > 0) {
      for (size_t s = 0; s < m_links.size(); ++s)
        items[s] = {static_cast<void*>(m_links[s].socket), 0, static_cast<short>(got[s] ? 0 : ZMQ_POLLIN), 0};
      try {
        zmq::poll(items.data(), items.size(), std::chrono::milliseconds(100));
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) return Status::error(std::string("worker: poll: ") + e.what());
      }
      if (m_options.stopRequested && m_options.stopRequested->load())
        return Status::error("worker " + std::to_string(m_id) + ": stopped by request");
      for (size_t s = 0; s < m_links.size(); ++s) {
        ServerLink& link = m_links[s];
        if (got[s]) continue;
        while (auto m = ps::receive(link.socket, /*withPeer=*/false)) {
          if (m->header.value("type", "") != ps::msg::kParams || m->header.value("req", int64_t(-1)) != req)
            continue;
          if (m->payload.size() != link.size)
            return Status::error("server " + std::to_string(s) + " sent " +
                                 std::to_string(m->payload.size()) + " values, its shard has " +
                                 std::to_string(link.size));
          link.reply = m->header;
          // Worker 0 relays the other servers' update spans to server 0, which writes the stream.
          if (const auto u = m->header.find("updates");
              m_id == 0 && s > 0 && u != m->header.end() && u->is_array())
            for (const nlohmann::json& span : *u)
              if (m_relay.size() < kMaxRelayedSpans && span.is_array() && span.size() == 2)
                m_relay.push_back(nlohmann::json::array({static_cast<int>(s), span[0], span[1]}));
          link.version = m->header.value("version", int64_t(0));
          link.incarnation = m->header.value("incarnation", int64_t(0));
          ParameterStore& store = m_model->params();
          for (size_t i = 0; i < link.units.size(); ++i)
            store.setUnitValues(link.units[i], m->payload.data() + link.begin[i]);
          got[s] = true;
          --remaining;
          break;
        }
        if (got[s]) continue;
        if (ps::secondsSince(sent[s]) > 1.0) {
          sendPull(link, req);
          sent[s] = Clock::now();
        }
        if (ps::secondsSince(asked) > m_options.serverTimeoutS && !waitingAllowed(s))
          return Status::error("worker " + std::to_string(m_id) + ": server " + std::to_string(s) + " (" +
                               link.endpoint + ") has not answered for " +
                               std::to_string(static_cast<int>(m_options.serverTimeoutS)) + " s");
      }
    }
    return m_model->params().finishUpdate();
  }

  // A sync or bounded pull may wait as long as the slowest worker takes; only async answers at once.
  bool waitingAllowed(size_t) const { return m_config.parallel.consistency != Consistency::Async; }

  LossStats computeGradients(int64_t batch, int slot) {
    ParameterStore& store = m_model->params();
    store.zeroGrads();
    LossStats stats;
    Batch b;
    const int M = std::max(1, m_config.parallel.microbatches);
    for (int m = 0; m < M; ++m) {
      m_data->trainBatch(batch, m_config.training.batchSize, slot * m_share + m * m_mbs, m_mbs, b);
      stats += m_model->forwardBackward(b, m_lossScale, m);
    }
    return stats;
  }

  void pushAll(const LossStats& stats, double computeS) {
    ParameterStore& store = m_model->params();
    const float* grads = store.grads();
    std::vector<float> payload;
    for (size_t s = 0; s < m_links.size(); ++s) {
      ServerLink& link = m_links[s];
      payload.assign(link.size, 0.0f);
      for (size_t i = 0; i < link.units.size(); ++i) {
        const Unit& u = store.units()[link.units[i]];
        std::copy(grads + u.begin, grads + u.begin + u.size, payload.begin() + link.begin[i]);
      }
      nlohmann::json h = {{"type", ps::msg::kPush},
                          {"worker", m_id},
                          {"req", m_req},
                          {"version", link.version},
                          {"incarnation", link.incarnation},
                          {"compute_s", computeS},
                          {"samples", m_share}};
      if (s == 0) {
        h["loss_sum"] = stats.lossSum;
        h["count"] = stats.count;
        h["correct"] = stats.correct;
        // This step's pull and compute and the previous step's push, for the measured timeline.
        nlohmann::json spans = m_spans;
        if (m_lastPush.first > 0)
          spans.push_back(nlohmann::json::array({"S", m_lastPush.first, m_lastPush.second}));
        h["spans"] = std::move(spans);
        if (!m_relay.empty()) {
          h["server_spans"] = std::move(m_relay);
          m_relay = nlohmann::json::array();
        }
      }
      ps::send(link.socket, h, payload.data(), payload.size());
      link.minVersion = link.version + 1;
    }
  }

  void evaluateNow(int64_t step) {
    setActivity("worker " + std::to_string(m_id) + ": evaluation at step " + std::to_string(step), true);
    const auto t0 = Clock::now();
    const EvalResult r = evaluate(*m_model, *m_data, m_config, m_config.training.evalBatches);
    nlohmann::json h = {{"type", ps::msg::kEval}, {"worker", m_id},       {"step", step},
                        {"loss", r.loss},         {"samples", r.samples}, {"time_s", ps::secondsSince(t0)}};
    if (r.hasAccuracy) h["accuracy"] = r.accuracy;
    ps::send(m_links[0].socket, h);
    if (r.hasAccuracy)
      std::fprintf(stderr, "worker %d: step %lld: eval loss %.4f, accuracy %.2f%%\n", m_id,
                   static_cast<long long>(step), r.loss, 100 * r.accuracy);
  }

  void bye(bool complete) {
    for (ServerLink& link : m_links)
      ps::send(link.socket, {{"type", ps::msg::kBye}, {"worker", m_id}, {"complete", complete}});
    // Give ZeroMQ's I/O thread a moment to hand the last messages over before the sockets close.
    for (ServerLink& link : m_links) link.socket.set(zmq::sockopt::linger, 2000);
  }

  // Heartbeats on sockets of their own (ZeroMQ sockets are not shared between threads), every 0.5 s.
  void beatLoop() {
    std::vector<zmq::socket_t> sockets;
    try {
      for (const std::string& e : m_options.servers) {
        sockets.emplace_back(m_context, zmq::socket_type::dealer);
        sockets.back().set(zmq::sockopt::linger, 0);
        sockets.back().connect(e);
      }
    } catch (const zmq::error_t&) {
      return;
    }
    while (m_beating) {
      for (zmq::socket_t& s : sockets)
        ps::send(s, {{"type", ps::msg::kBeat}, {"worker", m_id}, {"progress", m_progress.load()}});
      for (int i = 0; i < 5 && m_beating; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  const RunConfig& m_config;
  const PsWorkerOptions& m_options;
  const int m_id, m_W;
  OpenedDevice m_device;
  std::optional<MemoryTracker> m_tracker;
  std::unique_ptr<DataSource> m_data;
  std::optional<Model> m_model;
  zmq::context_t m_context{1};
  std::vector<ServerLink> m_links;
  int m_share = 0, m_mbs = 0;
  float m_lossScale = 1;
  double m_slowdown = 1;
  int64_t m_req = 0;
  // The measured timeline (sent with the push to server 0): this step's spans ["P"|"C"|"S", start, end] in
  // wall-clock seconds, the last push's, and (worker 0) the other servers' update spans [server, start, end].
  static constexpr size_t kMaxRelayedSpans = 512;
  nlohmann::json m_spans = nlohmann::json::array();
  std::pair<double, double> m_lastPush{-1, -1};
  nlohmann::json m_relay = nlohmann::json::array();
  std::atomic<int64_t> m_progress{0};
  std::atomic<bool> m_beating{false};
  std::thread m_beat;
};

}  // namespace

Status runPsWorker(const RunConfig& config, const PsWorkerOptions& options) {
  try {
    Worker worker(config, options);
    MS_TRY(worker.prepare());
    return worker.run();
  } catch (const DeviceFailure& e) {
    return Status::error("worker " + std::to_string(options.index) + ": device: " + e.what());
  }
}

}  // namespace ms
