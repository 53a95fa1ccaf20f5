// The parameter-server placement and predictions (plan/parameter_server.h, plan/ps_model.h): layers split
// over servers by bytes, each server's and worker's memory, the step time under sync, async and bounded with
// a straggler, the servers' link as the bound with many workers, the staleness predicted, the timeline.
#include <QtTest>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "plan/cost_model.h"
#include "plan/hardware.h"
#include "plan/memory_model.h"
#include "plan/parameter_server.h"
#include "plan/plan.h"
#include "plan/ps_model.h"

using nlohmann::json;

namespace {

// A GPT of 4 blocks on W workers (CPU devices unless named, one node unless nodes > 1), S servers.
ms::RunConfig config(int servers, int workers, const std::string& consistency, int nodes = 1,
                     const std::string& device = "cpu") {
  json nodeList = json::array();
  for (int n = 0; n < nodes; ++n)
    nodeList.push_back(
        {{"name", "n" + std::to_string(n)}, {"device", device}, {"count", (workers + nodes - 1) / nodes}});
  const json j = {
      {"name", "ps"},
      {"model",
       {{"type", "gpt"}, {"layers", 4}, {"width", 256}, {"heads", 4}, {"context", 128}, {"vocab", 256}}},
      {"data", {{"kind", "text"}, {"files", json::array({"x.txt"})}}},
      {"mesh", {{"nodes", nodeList}, {"inter_link", "ethernet"}}},
      {"parallel",
       {{"mode", "parameter_server"},
        {"servers", servers},
        {"workers", workers},
        {"consistency", consistency}}},
      {"optimizer", {{"type", "adamw"}}},
      {"training", {{"batch_size", 8 * workers}, {"seq_len", 128}, {"grad_clip", 0}}}};
  auto c = ms::parseRunConfig(j);
  if (!c) qFatal("%s", c.message().c_str());
  return *c;
}

}  // namespace

class TestPsModel : public QObject {
  Q_OBJECT

 private slots:
  void serversSplitTheLayersByBytes() {
    const ms::RunConfig c = config(3, 2, "sync");
    const ms::ModelSpec spec = ms::buildModelSpec(c.model, c.training.seqLen);
    auto shards = ms::assignServers(spec, c);
    QVERIFY2(shards.isOk(), shards.message().c_str());
    std::vector<int> seen(spec.layers.size(), 0);
    int64_t total = 0;
    for (size_t s = 0; s < 3; ++s) {
      for (int l : shards->layers[s]) ++seen[static_cast<size_t>(l)];
      total += shards->params[s];
    }
    QCOMPARE(total, spec.paramCount());
    for (int n : seen) QCOMPARE(n, 1);
    // The tied head goes with the embedding.
    const int L = static_cast<int>(spec.layers.size());
    for (const auto& layers : shards->layers) {
      const bool emb = std::count(layers.begin(), layers.end(), 0) > 0;
      const bool head = std::count(layers.begin(), layers.end(), L - 1) > 0;
      QCOMPARE(head, emb);
    }
    // Greedy by bytes: no server holds more than the lightest plus the largest layer.
    const int64_t most = *std::max_element(shards->params.begin(), shards->params.end());
    const int64_t least = *std::min_element(shards->params.begin(), shards->params.end());
    int64_t largest = 0;
    for (const auto& l : spec.layers) largest = std::max(largest, l.paramCount());
    QVERIFY(most - least <= largest);
    // More servers than layers with parameters: refused, naming the field.
    auto tooMany = ms::assignServers(spec, config(7, 2, "sync"));
    QVERIFY(!tooMany.isOk());
    QVERIFY2(tooMany.message().find("/parallel/servers") == 0, tooMany.message().c_str());
  }

  void memoryOfServersAndWorkers() {
    const ms::RunConfig c = config(2, 4, "sync", 1, "a100-80gb");
    auto p = ms::predictParameterServer(c);
    QVERIFY2(p.isOk(), p.message().c_str());
    double params = 0;
    for (const auto& s : p->servers) {
      params += s.params;
      QCOMPARE(s.parameterBytes, 4 * s.params);
      QCOMPARE(s.gradientBytes, 4 * s.params);
      QCOMPARE(s.optimizerBytes, 8 * s.params);        // AdamW's two moments
      QCOMPARE(s.otherBytes, 4 * s.params * (4 + 1));  // sync holds every worker's push and a reply
    }
    const ms::ModelSpec spec = ms::buildModelSpec(c.model, c.training.seqLen);
    QCOMPARE(params, double(spec.paramCount()));
    // A worker is the single-rank plan at its microbatch, without the moments (fp32: no optimizer state).
    auto plan = ms::buildPlan(c, true);
    QVERIFY(plan.isOk());
    const ms::MemoryBreakdown single = ms::estimateMemory(*plan)[0];
    for (const auto& w : p->workers) {
      QCOMPARE(w.parameterBytes, single.parameters);
      QCOMPARE(w.activationBytes, single.activations);
      QCOMPARE(w.optimizerBytes, 0.0);
      QVERIFY(w.total() < single.total());
    }
    QCOMPARE(ms::microbatchSize(c), 8);  // batch 32 over 4 workers
    // A server lives in its node's host memory: four A100 80GB's shares of a DGX A100 (250 GB each).
    for (const auto& s : p->servers) QCOMPARE(s.capacity, 4 * 250e9);
    // CPU devices of a node share one machine's memory (the catalog's "cpu": 24 GiB in all).
    auto cpu = ms::predictParameterServer(config(2, 4, "sync"));
    QVERIFY(cpu.isOk());
    QCOMPARE(cpu->servers[0].capacity, ms::findDevice("cpu")->hostMemoryBytes);
    QVERIFY(std::abs(cpu->servers[0].capacity - 24.0 * 1024 * 1024 * 1024) < 1e3);
  }

  // A worker three times slower: sync waits for it every step; async keeps the fast ones going; bounded
  // holds everyone to the slowest's pace.
  void stragglerSyncAsyncBounded() {
    auto run = [](const std::string& consistency) {
      ms::RunConfig c = config(1, 4, consistency);
      c.parallel.stragglers = {{1, 3.0}};
      auto p = ms::predictParameterServer(c);
      if (!p) qFatal("%s", p.message().c_str());
      return *p;
    };
    const ms::PsPrediction sync = run("sync"), async = run("async"), bounded = run("bounded");
    const auto& fast = sync.workers[0];
    const auto& slow = sync.workers[1];
    QCOMPARE(slow.computeTime, 3 * fast.computeTime);
    const ms::PsServerPrediction& server = sync.servers[0];
    const double close = 1e-12;
    // sync: the straggler's whole cycle (or the server's link, if longer), then the update.
    QVERIFY(std::abs(sync.stepTime - (std::max(slow.cycleTime(), server.linkTime) + server.updateTime)) <
            close);
    // async: three workers at the fast rate and one at a third of it, each push a quarter of the batch,
    // unless the server's update or link rate is lower.
    const double share = 32.0 / 4;
    // (Its server updates without sync's sum of the pushes: less memory traffic per update.)
    const ms::PsServerPrediction& asyncServer = async.servers[0];
    QVERIFY(asyncServer.updateTime < server.updateTime);
    const double rate = std::min(
        {3 / fast.cycleTime() + 1 / slow.cycleTime(), 1 / asyncServer.updateTime, 4 / asyncServer.linkTime});
    QVERIFY(std::abs(async.samplesPerSecond - rate * share) < 1e-9 * rate * share);
    // bounded: everyone at the slowest's pace, without sync's wait for the update.
    const double slowest =
        std::min({4 / slow.cycleTime(), 1 / asyncServer.updateTime, 4 / asyncServer.linkTime});
    QVERIFY(std::abs(bounded.samplesPerSecond - slowest * share) < 1e-9 * slowest * share);
    QVERIFY(async.samplesPerSecond > bounded.samplesPerSecond);
    QVERIFY(bounded.samplesPerSecond > sync.samplesPerSecond);
    (void)close;
    QCOMPARE(sync.meanStaleness, 0.0);
    QCOMPARE(async.meanStaleness, 3.0);  // Little's law: W - 1
  }

  // Many workers and one server on Ethernet: the server's link carries every pull and push and bounds the
  // step; more servers split that traffic.
  void serverLinkBoundsTheStep() {
    const ms::PsPrediction one = *ms::predictParameterServer(config(1, 32, "sync", 4, "a100-80gb"));
    QVERIFY(one.servers[0].linkTime > one.workers[0].cycleTime());
    QVERIFY(one.stepTime >= one.servers[0].linkTime);
    const ms::PsPrediction four = *ms::predictParameterServer(config(4, 32, "sync", 4, "a100-80gb"));
    QVERIFY2(four.stepTime < 0.5 * one.stepTime,
             qPrintable(QString("%1 vs %2").arg(four.stepTime).arg(one.stepTime)));
  }

  // server_nodes puts a server on another node: its node in the prediction, and its traffic crosses the
  // inter-node link (1 Gb Ethernet here, slower than shared memory), so the workers' pulls take longer.
  void serverNodesPlaceServers() {
    ms::RunConfig local = config(1, 2, "sync", 2);
    local.mesh.linkTypes = {{"gbe", 0.125, 50}};  // 1 Gb Ethernet between the nodes
    local.mesh.interLink = "gbe";
    ms::RunConfig remote = local;
    remote.parallel.serverNodes = {"n1"};
    const ms::PsPrediction a = *ms::predictParameterServer(local), b = *ms::predictParameterServer(remote);
    QCOMPARE(a.servers[0].node, 0);
    QCOMPARE(b.servers[0].node, 1);
    QCOMPARE(ms::serverNode(remote, 0), 1);
    // Worker 0 sits on node 0: its server moved away; worker 1 (node 1) now has it nearby.
    QVERIFY(b.workers[0].pullTime > a.workers[0].pullTime);
    QVERIFY(b.workers[1].pullTime < a.workers[1].pullTime);
  }

  // The sync timeline: each worker's pull, compute and push back to back; the servers update once the last
  // push is in; the second step starts after the update.
  void syncTimeline() {
    const ms::PsPrediction p = *ms::predictParameterServer(config(2, 2, "sync"));
    double lastPush = 0, firstUpdate = -1, secondPull = 1e30;
    for (const ms::PsSpan& s : p.timeline) {
      QVERIFY(s.end >= s.start);
      if (!s.server && s.action == 'S' && s.start < p.stepTime * 0.99) lastPush = std::max(lastPush, s.end);
      if (s.server && firstUpdate < 0) firstUpdate = s.start;
      if (!s.server && s.action == 'P' && s.start > 0) secondPull = std::min(secondPull, s.start);
    }
    QVERIFY(firstUpdate >= lastPush - 1e-15);
    QVERIFY(secondPull >= firstUpdate);
    QVERIFY(std::abs(secondPull - p.stepTime) < 1e-12);
  }
};

QTEST_GUILESS_MAIN(TestPsModel)
#include "tst_ps_model.moc"
