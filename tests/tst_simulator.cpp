// Tests of the cost model and the step simulator. The cost model: the ring-collective and point-to-point
// formulas by hand, analytic compute times from FLOPs (recompute, split backward, tensor parallelism),
// measured times checked. The simulator: with equal stages, free communication and B = 2F it reproduces the
// textbook bubbles of GPipe and 1F1B, (P-1)/(M+P-1), to 1e-9; interleaving and ZB-H1 shrink the bubble;
// latency lengthens the step; DP gradient sync overlaps the pipeline drain; tokens/s and MFU follow their
// definitions; every rank's spans follow its action list without overlapping on the compute lane.
#include <QtTest>

#include "test_util.h"

#include <nlohmann/json.hpp>

#include <cmath>

#include "plan/cost_model.h"
#include "plan/memory_model.h"
#include "plan/simulator.h"
#include "plan/tp_overlap.h"

using nlohmann::json;

namespace {

// On an H100 costed by FLOPs (test_util.h useFlatH100): the formulas below are written in FLOPs.
json baseConfig(int layers, int batch) {
  json c = ms::test::smallGpuPlanConfig("sim", layers, batch);
  ms::test::useFlatH100(c);
  return c;
}

ms::Expected<ms::Plan> makePlan(int layers, int batch, const json& patch) {
  json doc = baseConfig(layers, batch);
  doc.merge_patch(patch);
  ms::Expected<ms::RunConfig> config = ms::parseRunConfig(doc);
  if (!config) return config.status();
  return ms::buildPlan(*config);
}

#define MAKE_PLAN(name, layers, batch, patch)                   \
  ms::Expected<ms::Plan> name = makePlan(layers, batch, patch); \
  QVERIFY2(name.isOk(), name.isOk() ? "" : name.message().c_str())

// Equal chunks: the first layer of every chunk carries the chunk's whole time, the others nothing.
ms::LayerTimes chunkTimes(const ms::Plan& plan, double forward, double backwardInput, double backwardWeight) {
  const size_t L = plan.model.layers.size();
  ms::LayerTimes t{std::vector<double>(L, 0.0), std::vector<double>(L, 0.0), std::vector<double>(L, 0.0)};
  for (const auto& chunk : plan.partition.chunks) {
    const auto l = static_cast<size_t>(chunk.front());
    t.forward[l] = forward;
    t.backwardInput[l] = backwardInput;
    t.backwardWeight[l] = backwardWeight;
  }
  return t;
}

double maxOf(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, x);
  return m;
}

double totalFlopsPerSample(const ms::Plan& plan) {
  double f = 0;
  for (const auto& l : plan.model.layers) f += l.forwardFlopsPerSample;
  return f;
}

// Forward FLOPs per sample of the layers of one kind.
double flopsOfKind(const ms::Plan& plan, ms::LayerKind kind) {
  double f = 0;
  for (const auto& l : plan.model.layers)
    if (l.kind == kind) f += l.forwardFlopsPerSample;
  return f;
}

// End of the last F, B or W on any rank.
double lastWorkEnd(const ms::SimResult& r) {
  double end = 0;
  for (const auto& spans : r.spansByRank)
    for (const auto& s : spans)
      if (s.type == ms::ActionType::Forward || s.type == ms::ActionType::Backward ||
          s.type == ms::ActionType::BackwardWeight)
        end = std::max(end, s.end);
  return end;
}

const double kH100Bf16 = 989.4e12, kH100Fp32 = 66.9e12;

}  // namespace

class TestSimulator : public QObject {
  Q_OBJECT

 private slots:
  // --- cost model ---

  void collectiveFormulas() {
    const ms::LinkSpec link{"test", 1e9, 1e-6, nullptr};
    QCOMPARE(ms::p2pTime(2e9, link), 2.0 + 1e-6);
    // Ring all-reduce over 4: 2 * 3/4 * bytes / bw + 2 * 3 * latency.
    QCOMPARE(ms::ringAllReduceTime(1e9, 4, link), 1.5 + 6e-6);
    QCOMPARE(ms::ringReduceScatterTime(1e9, 4, link), 0.75 + 3e-6);
    QCOMPARE(ms::ringAllGatherTime(1e9, 4, link), 0.75 + 3e-6);
    QCOMPARE(ms::ringAllReduceTime(1e9, 1, link), 0.0);
    QCOMPARE(ms::ringReduceScatterTime(1e9, 1, link), 0.0);
  }

  void analyticCompute() {
    MAKE_PLAN(plan, 2, 16, (json{{"parallel", {{"microbatches", 2}}}}));
    const ms::CostModel cost(*plan);
    const double mbs = 8;
    // The gpt head's forward runs its LM head's backward too (fused with the loss): 3x its FLOPs in F,
    // nothing in B or W; every other layer F once, B twice.
    const double total = totalFlopsPerSample(*plan), head = flopsOfKind(*plan, ms::LayerKind::Head);
    const double blocks = flopsOfKind(*plan, ms::LayerKind::Block);
    QVERIFY(head > 0.1 * total);
    const double forward = (total + 2 * head) * mbs / (kH100Fp32 * 0.5);
    const double backward = 2 * (total - head) * mbs / (kH100Fp32 * 0.5);
    QVERIFY(std::abs(cost.forwardTime(0) - forward) <= 1e-12 * forward);
    QVERIFY(std::abs(cost.backwardTime(0) - backward) <= 1e-12 * forward);
    QCOMPARE(cost.weightTime(0), 0.0);
    QVERIFY(!cost.calibrated());

    // bf16 runs at the bf16 peak; recompute adds a forward to the backward.
    MAKE_PLAN(bf16, 2, 16,
              (json{{"parallel", {{"microbatches", 2}, {"precision", "bf16"}, {"recompute", "full"}}}}));
    const ms::CostModel bf(*bf16);
    // (blocks only: the engine recomputes transformer blocks, not the embedding or the head).
    const double forwardBf16 = (total + 2 * head) * mbs / (kH100Bf16 * 0.5);
    const double backwardBf16 = (2 * (total - head) + blocks) * mbs / (kH100Bf16 * 0.5);
    QVERIFY(std::abs(bf.forwardTime(0) - forwardBf16) <= 1e-12 * forwardBf16);
    QVERIFY(std::abs(bf.backwardTime(0) - backwardBf16) <= 1e-12 * forwardBf16);

    // Selective recompute (Korthikanti et al. 2022, section 5) repeats only the attention core's forward in
    // B: 4 T^2 C FLOPs per sample and block, half that causal, with no TP communication. On a model whose
    // head size (256) the H100's fused attention does not take; where attention is fused it repeats nothing.
    const json wide = {{"width", 512}, {"heads", 2}};
    MAKE_PLAN(plain, 2, 16, (json{{"model", wide}, {"parallel", {{"microbatches", 2}, {"tp", 2}}}}));
    MAKE_PLAN(
        selective, 2, 16,
        (json{{"model", wide}, {"parallel", {{"microbatches", 2}, {"tp", 2}, {"recompute", "selective"}}}}));
    const ms::CostModel p0(*plain), p1(*selective);
    const double attention = 2 * 4.0 * 64 * 64 * 512 * 0.5 * mbs / (kH100Fp32 * 0.5) / 2;  // 2 blocks, tp 2
    QVERIFY(std::abs(p1.backwardTime(0) - p0.backwardTime(0) - attention) <= 1e-9 * attention);
    QCOMPARE(p1.forwardTime(0), p0.forwardTime(0));
    MAKE_PLAN(fusedSelective, 2, 16, (json{{"parallel", {{"microbatches", 2}, {"recompute", "selective"}}}}));
    QCOMPARE(ms::CostModel(*fusedSelective).backwardTime(0), cost.backwardTime(0));

    // "recompute_layers": 1 re-runs the first block of each chunk: block.0 and block.2 of [embedding,
    // block.0, block.1] [block.2, block.3, head].
    MAKE_PLAN(partial, 4, 16,
              (json{{"parallel",
                     {{"microbatches", 2}, {"pp", 2}, {"recompute", "full"}, {"recompute_layers", 1}}}}));
    const ms::CostModel pc(*partial, ms::Communication::Free);
    const ms::LayerTimes& lt = pc.layerTimes();
    QCOMPARE(partial->partition.chunks[0], (std::vector<int>{0, 1, 2}));
    for (int l : {1, 3}) QCOMPARE(lt.backwardInput[l], 2 * lt.forward[l]);
    for (int l : {2, 4}) QCOMPARE(lt.backwardInput[l], lt.forward[l]);
    QCOMPARE(lt.backwardInput[0], lt.forward[0]);  // the embedding is never recomputed

    // ZB-H1 splits the backward: B and W one forward each.
    MAKE_PLAN(zb, 2, 16, (json{{"parallel", {{"microbatches", 2}, {"pp", 2}, {"schedule", "zb_h1"}}}}));
    const ms::CostModel z(*zb, ms::Communication::Free);
    QVERIFY(std::abs(z.backwardTime(0) - z.forwardTime(0)) <= 1e-12 * z.forwardTime(0));
    QVERIFY(std::abs(z.weightTime(0) - z.forwardTime(0)) <= 1e-12 * z.forwardTime(0));
    // The head's chunk: B and W each one forward of its other layers; F also holds the head's 3x.
    const double headTime = head * mbs / (kH100Fp32 * 0.5);
    QVERIFY(std::abs(z.backwardTime(1) - z.weightTime(1)) <= 1e-12 * z.forwardTime(1));
    QVERIFY(std::abs(z.forwardTime(1) - z.backwardTime(1) - 3 * headTime) <= 1e-9 * z.forwardTime(1));

    // tp = 2 halves the compute; its all-reduces come on top when communication is modelled.
    MAKE_PLAN(tp2, 2, 16, (json{{"parallel", {{"microbatches", 2}, {"tp", 2}}}}));
    const ms::CostModel free(*tp2, ms::Communication::Free);
    const ms::CostModel modelled(*tp2);
    QVERIFY(std::abs(free.forwardTime(0) - forward / 2) <= 1e-12 * forward);
    // Two blocks * 2 all-reduces + the embedding's 1 in forward, of T * C * 4 * mbs bytes over NVLink.
    const ms::LinkSpec nvlink = tp2->mesh.intraLink;
    const double ar = ms::ringAllReduceTime(64.0 * 64 * 4 * mbs, 2, nvlink);
    QVERIFY(std::abs(modelled.forwardTime(0) - (forward / 2 + 5 * ar)) <= 1e-9 * forward);
    // Backward: 2 per block and the head's 1.
    QVERIFY(std::abs(modelled.backwardTime(0) - (backward / 2 + 5 * ar)) <= 1e-9 * forward);
  }

  // Synchronised BatchNorm (the cnn): each BatchNorm's all-reduce of 2 C doubles over the data-parallel
  // group, once in forward and once in backward, on top of the same plan with local BatchNorm; nothing at dp
  // = 1.
  void syncBatchNormAllReduces() {
    const json cnn = {{"model",
                       {{"type", "cnn"},
                        {"channels", {16, 32}},
                        {"blocks", 1},
                        {"classes", 10},
                        {"layers", nullptr},
                        {"width", nullptr},
                        {"heads", nullptr},
                        {"vocab", nullptr},
                        {"context", nullptr}}},
                      {"data", {{"kind", "fashion_mnist"}, {"train", nullptr}, {"val", nullptr}}},
                      {"training", {{"seq_len", nullptr}}}};
    json local = cnn, sync = cnn;
    local["parallel"] = {{"dp", 4}, {"batchnorm", "local"}};
    sync["parallel"] = {{"dp", 4}, {"batchnorm", "sync"}};
    MAKE_PLAN(l, 2, 64, local);
    MAKE_PLAN(s, 2, 64, sync);
    const ms::CostModel lc(*l), sc(*s);
    const ms::LinkSpec nvlink = s->mesh.intraLink;
    // stem (bn1, 16), block.0 (bn1, bn2: 16 each), block.1 (bn1, bn2, downsample.1: 32 each)
    const double expected = 3 * ms::smallAllReduceTime(2.0 * 8 * 16, 4, nvlink) +
                            3 * ms::smallAllReduceTime(2.0 * 8 * 32, 4, nvlink);
    QVERIFY(expected > 0);
    QVERIFY(std::abs(sc.forwardTime(0) - lc.forwardTime(0) - expected) <= 1e-12 + 1e-9 * expected);
    QVERIFY(std::abs(sc.backwardTime(0) - lc.backwardTime(0) - expected) <= 1e-12 + 1e-9 * expected);
    json one = sync;
    one["parallel"]["dp"] = 1;
    json oneLocal = local;
    oneLocal["parallel"]["dp"] = 1;
    MAKE_PLAN(o, 2, 64, one);
    MAKE_PLAN(ol, 2, 64, oneLocal);
    QCOMPARE(ms::CostModel(*o).forwardTime(0), ms::CostModel(*ol).forwardTime(0));
    // The small all-reduce: a binary tree's 2 ceil(log2 n) latencies and twice the bytes where that beats the
    // ring's 2 (n - 1) latencies (small messages), the ring for large messages.
    const ms::LinkSpec ib = s->mesh.interLink;
    QCOMPARE(ms::smallAllReduceTime(256, 1024, ib), 2.0 * 256 / ib.bandwidth + 20 * ib.latency);
    QVERIFY(ms::smallAllReduceTime(256, 1024, ib) < 0.02 * ms::ringAllReduceTime(256, 1024, ib));
    QVERIFY(ms::smallAllReduceTime(1e9, 8, ib) == ms::ringAllReduceTime(1e9, 8, ib));
  }

  void transfersAndSync() {
    MAKE_PLAN(plan, 2, 16, (json{{"parallel", {{"microbatches", 2}, {"pp", 2}, {"dp", 2}}}}));
    const ms::CostModel cost(*plan);
    const double mbs = 4;
    const double bytes = 64.0 * 64 * 4 * mbs;  // block.0's output
    QCOMPARE(cost.activationMessageBytes(0), bytes);
    const ms::LinkSpec nvlink = plan->mesh.intraLink;
    QCOMPARE(cost.activationTransferTime(0), ms::p2pTime(bytes, nvlink));
    QCOMPARE(cost.gradientTransferTime(1), ms::p2pTime(bytes, nvlink));
    QCOMPARE(cost.activationTransferTime(1), 0.0);  // the last chunk sends nothing
    QCOMPARE(cost.gradientTransferTime(0), 0.0);
    // Stage 0's chunk: all-reduce of its fp32 gradients over dp = 2, plus the tied wte's all-reduce with
    // the last stage.
    const double params0 = double(plan->model.layers[0].paramCount() + plan->model.layers[1].paramCount());
    const double wte = 256.0 * 64;
    QCOMPARE(cost.gradSyncTime(0),
             ms::ringAllReduceTime(params0 * 4, 2, nvlink) + ms::ringAllReduceTime(wte * 4, 2, nvlink));
    MAKE_PLAN(zero2, 2, 16, (json{{"parallel", {{"microbatches", 2}, {"pp", 2}, {"dp", 2}, {"zero", 2}}}}));
    const ms::CostModel z(*zero2);
    // ZeRO-2 reduce-scatters each microbatch's gradients (2 here), but the tied wte's once per step, after
    // its sum across the two stages.
    QCOMPARE(z.gradSyncTime(0), 2 * ms::ringReduceScatterTime((params0 - wte) * 4, 2, nvlink) +
                                    ms::ringReduceScatterTime(wte * 4, 2, nvlink) +
                                    ms::ringAllReduceTime(wte * 4, 2, nvlink));
    // ZeRO-3 gathers each layer before its use, the next one's gather travelling while a layer computes
    // (runtime Model::prefetch): in F the chunk's first layer's gather is exposed and the second's beyond
    // the first's compute; in B the other way round.
    MAKE_PLAN(zero3, 2, 16, (json{{"parallel", {{"microbatches", 2}, {"pp", 2}, {"dp", 2}, {"zero", 3}}}}));
    const ms::CostModel z3(*zero3), z3Free(*zero3, ms::Communication::Free);
    const std::vector<double> g = ms::zero3LayerParams(*zero3);
    QCOMPARE(g[0], params0 - double(plan->model.layers[1].paramCount()));  // wte + wpe
    auto gather = [&](int l) { return ms::ringAllGatherTime(g[static_cast<size_t>(l)] * 4, 2, nvlink); };
    const ms::LayerTimes& t = z3Free.layerTimes();
    QVERIFY(t.forward[0] > 0 && t.backwardInput[1] > 0);
    const double forwardExposed = gather(0) + std::max(0.0, gather(1) - t.forward[0]);
    const double backwardExposed =
        gather(1) + std::max(0.0, gather(0) - t.backwardInput[1] - t.backwardWeight[1]);
    QVERIFY(std::abs(z3.forwardTime(0) - z3Free.forwardTime(0) - forwardExposed) <=
            1e-12 * z3.forwardTime(0));
    QVERIFY(std::abs(z3.backwardTime(0) - z3Free.backwardTime(0) - backwardExposed) <=
            1e-12 * z3.backwardTime(0));
    QVERIFY(forwardExposed < gather(0) + gather(1));  // the prefetch hides part of the second gather
    // A split backward (ZB-H1) gathers every layer again in W, beside the weight parts.
    MAKE_PLAN(zb, 2, 16,
              (json{{"parallel",
                     {{"microbatches", 2}, {"pp", 2}, {"dp", 2}, {"zero", 3}, {"schedule", "zb_h1"}}}}));
    const ms::CostModel w(*zb), wFree(*zb, ms::Communication::Free);
    const ms::LayerTimes& tw = wFree.layerTimes();
    const double weightExposed = gather(1) + std::max(0.0, gather(0) - tw.backwardWeight[1]);
    QVERIFY(weightExposed > 0);
    QVERIFY(std::abs(w.weightTime(0) - wFree.weightTime(0) - weightExposed) <= 1e-12 * w.weightTime(0));
    QCOMPARE(z3.weightTime(0), 0.0);  // not split: W does not exist
    const ms::CostModel free(*plan, ms::Communication::Free);
    QCOMPARE(free.activationTransferTime(0), 0.0);
    QCOMPARE(free.gradSyncTime(0), 0.0);
  }

  // A ring across nodes runs at the sum of its members' own ports of the inter-node link (ringLink): g
  // members per node give min(g B_inter, g / (g - 1) B_intra) of bus bandwidth; one member per node (tp 8
  // filling the node) the port's own; a link the node's devices share (per_device false), a measured one,
  // and all-to-alls and point-to-point messages (groupLink) are not scaled.
  void ringsAcrossNodesUseEveryPort() {
    const ms::LinkSpec ib{"ib", 48e9, 5e-6, nullptr, true}, nv{"nv", 370e9, 3e-6, nullptr, false};
    QCOMPARE(ms::railLink(ib, nv, 1).bandwidth, 48e9);
    QCOMPARE(ms::railLink(ib, nv, 2).bandwidth, 96e9);
    QCOMPARE(ms::railLink(ib, nv, 8).bandwidth, 384e9);                 // 8/7 x 370 = 423 does not bind
    QCOMPARE(ms::railLink(ib, nv, 16).bandwidth, 16.0 / 15.0 * 370e9);  // the intra-node link binds
    QCOMPARE(ms::railLink(ib, nv, 8).latency, 5e-6);
    ms::LinkSpec shared = ib;
    shared.perDevice = false;
    QCOMPARE(ms::railLink(shared, nv, 8).bandwidth, 48e9);

    json twoNodes = {{"mesh",
                      {{"nodes", json::array({{{"name", "n0"}, {"device", "h100-flat"}, {"count", 8}},
                                              {{"name", "n1"}, {"device", "h100-flat"}, {"count", 8}}})}}},
                     {"parallel", {{"dp", 16}}}};
    MAKE_PLAN(dp16, 2, 64, twoNodes);
    const double params = ms::chunkLocalParameterCount(*dp16)[0];
    const ms::LinkSpec rails{"ib", 384e9, 5e-6, nullptr, true};
    QCOMPARE(ms::ringLink(*dp16, dp16->layout.dpGroup(0)).bandwidth, 384e9);
    QVERIFY(std::abs(ms::CostModel(*dp16).gradSyncTime(0) - ms::ringAllReduceTime(params * 4, 16, rails)) <=
            1e-12 * ms::ringAllReduceTime(params * 4, 16, rails));
    // tp 8 fills each node: the two dp replicas' ring crosses through one port each.
    json tp8 = twoNodes;
    tp8["parallel"] = {{"dp", 2}, {"tp", 8}};
    tp8["model"] = {{"heads", 8}};
    MAKE_PLAN(t8, 2, 64, tp8);
    QCOMPARE(ms::ringLink(*t8, t8->layout.dpGroup(0)).bandwidth, 48e9);
    QCOMPARE(ms::ringLink(*t8, t8->layout.tpGroup(0)).bandwidth, 370e9);  // inside a node
    // A link type of the config's own that the node's devices share, and the same one per device.
    json own = twoNodes;
    own["mesh"]["link_types"] =
        json::array({{{"name", "ib-shared"}, {"bandwidth_gbs", 48}, {"latency_us", 5}},
                     {{"name", "ib-rails"}, {"bandwidth_gbs", 48}, {"latency_us", 5}, {"per_device", true}}});
    own["mesh"]["inter_link"] = "ib-shared";
    MAKE_PLAN(sharedPlan, 2, 64, own);
    QCOMPARE(ms::ringLink(*sharedPlan, sharedPlan->layout.dpGroup(0)).bandwidth, 48e9);
    own["mesh"]["inter_link"] = "ib-rails";
    MAKE_PLAN(railsPlan, 2, 64, own);
    QCOMPARE(ms::ringLink(*railsPlan, railsPlan->layout.dpGroup(0)).bandwidth, 384e9);
    // Point-to-point: a pipeline across the two nodes sends through one port.
    QCOMPARE(ms::groupLink(*dp16, dp16->layout.dpGroup(0)).bandwidth, 48e9);
  }

  // Offload's transfers over the host link (CostModel::hostTransfers) are drawn inside the actions whose
  // durations count them: "optimizer" moves the owned bf16 gradients down at the start of O and the updated
  // bf16 slice up at its end (shard * 2 bytes / 64 GB/s each way on the test's H100s); "parameters" (ZeRO-3)
  // uploads a chunk's bf16 shard at the start of every F and B and downloads each microbatch's bf16 gradient
  // shard at the end of B. Nothing is drawn without offload, and nothing in F and B when the times are
  // calibrated (measured times include the transfers).
  void hostTransfersOnTimeline() {
    const json par = {{"precision", "bf16"}, {"grad_precision", "bf16"}, {"dp", 2}, {"microbatches", 2}};
    json opt = par, params = par;
    opt["zero"] = 1;
    opt["offload"] = "optimizer";
    params["zero"] = 3;
    params["offload"] = "parameters";
    MAKE_PLAN(plain, 2, 16, (json{{"parallel", par}}));
    MAKE_PLAN(optimizer, 2, 16, (json{{"parallel", opt}}));
    MAKE_PLAN(parameters, 2, 16, (json{{"parallel", params}}));
    const double link = 64e9;
    const double shard = ms::stageLocalParameterCount(*optimizer, 0) / 2;

    const ms::SimResult none = ms::simulate(*plain, ms::CostModel(*plain));
    for (const auto& t : none.hostTransfersByRank) QVERIFY(t.empty());

    const ms::SimResult o = ms::simulate(*optimizer, ms::CostModel(*optimizer));
    QCOMPARE(o.hostTransfersByRank.size(), size_t(2));
    for (int r = 0; r < 2; ++r) {
      const auto& t = o.hostTransfersByRank[static_cast<size_t>(r)];
      const ms::SimSpan* step = nullptr;
      for (const ms::SimSpan& sp : o.spansByRank[static_cast<size_t>(r)])
        if (sp.type == ms::ActionType::OptimizerStep) step = &sp;
      QVERIFY(step);
      QCOMPARE(t.size(), size_t(2));
      QVERIFY(t[0].toHost && !t[1].toHost);
      QCOMPARE(t[0].within, ms::ActionType::OptimizerStep);
      QCOMPARE(t[0].start, step->start);
      QCOMPARE(t[1].end, step->end);
      QVERIFY(std::abs((t[0].end - t[0].start) - shard * 2 / link) <= 1e-9 * shard * 2 / link);
      QVERIFY(std::abs((t[1].end - t[1].start) - shard * 2 / link) <= 1e-9 * shard * 2 / link);
    }

    const ms::CostModel pc(*parameters);
    const ms::SimResult p = ms::simulate(*parameters, pc);
    const auto& t = p.hostTransfersByRank[0];
    const auto& spans = p.spansByRank[0];
    int forwards = 0, backwards = 0;
    for (const ms::SimSpan& sp : spans) {
      if (sp.type != ms::ActionType::Forward && sp.type != ms::ActionType::Backward) continue;
      (sp.type == ms::ActionType::Forward ? forwards : backwards)++;
      int inside = 0;
      for (const ms::SimHostTransfer& h : t) {
        if (h.within != sp.type || h.microbatch != sp.microbatch || h.chunk != sp.chunk) continue;
        ++inside;
        QVERIFY(h.start >= sp.start && h.end <= sp.end);
        const double expected = 2.0 * shard / link;  // the bf16 shard up, or its bf16 gradients down
        QVERIFY2(std::abs((h.end - h.start) - expected) <= 1e-9 * expected,
                 qPrintable(QString("%1 s, expected %2").arg(h.end - h.start).arg(expected)));
        if (h.toHost) {
          QCOMPARE(h.end, sp.end);
          QCOMPARE(sp.type, ms::ActionType::Backward);
        } else {
          QCOMPARE(h.start, sp.start);
        }
      }
      QCOMPARE(inside, sp.type == ms::ActionType::Forward ? 1 : 2);
    }
    QCOMPARE(forwards, 2);
    QCOMPARE(backwards, 2);
    QCOMPARE(t.size(), size_t(2 + 2 * 2));
    // Calibrated: F and B are measured, their transfers inside them are not drawn apart (and this plan's
    // optimizer step moves nothing: the shards live on the host).
    const ms::CostModel measured(*parameters, pc.layerTimes());
    QVERIFY(measured.calibrated());
    QVERIFY(ms::simulate(*parameters, measured).hostTransfersByRank[0].empty());
  }

  void measuredTimes() {
    MAKE_PLAN(plan, 2, 16, (json{{"parallel", {{"microbatches", 2}}}}));
    ms::CostModel cost(*plan);
    const ms::Status wrongSize = cost.setMeasuredTimes({{1, 2, 3}, {1, 2, 3, 4}, {1, 2, 3, 4}});
    QVERIFY(!wrongSize.isOk());
    QVERIFY2(wrongSize.message().find("forward has 3 entries") != std::string::npos,
             wrongSize.message().c_str());
    const ms::Status negative = cost.setMeasuredTimes({{1, 2, 3, 4}, {1, -2, 3, 4}, {1, 2, 3, 4}});
    QVERIFY(!negative.isOk());
    QVERIFY(negative.message().find("backwardInput[1]") != std::string::npos);
    QVERIFY(!cost.calibrated());
    QVERIFY(cost.setMeasuredTimes({{1, 2, 3, 4}, {1, 2, 3, 4}, {0.5, 0.5, 0.5, 0.5}}).isOk());
    QVERIFY(cost.calibrated());
    QCOMPARE(cost.forwardTime(0), 10.0);
    QCOMPARE(cost.backwardTime(0), 12.0);  // not split: input + weight
  }

  // --- simulator ---

  // Equal stages, free communication, B = 2F: bubble (P-1)/(M+P-1) on every rank (Huang et al. 2019, GPipe;
  // Narayanan et al. 2021, section 2.2.1, 1F1B), and the pipeline span (M+P-1) * (F+B).
  void textbookBubble_data() {
    QTest::addColumn<QString>("schedule");
    QTest::addColumn<int>("P");
    QTest::addColumn<int>("M");
    for (const QString schedule : {"gpipe", "1f1b"})
      for (int P : {2, 4, 8})
        for (int M : {1, 4, 8, 16})
          QTest::newRow(qPrintable(QString("%1 P%2 M%3").arg(schedule).arg(P).arg(M))) << schedule << P << M;
  }
  void textbookBubble() {
    QFETCH(QString, schedule);
    QFETCH(int, P);
    QFETCH(int, M);
    MAKE_PLAN(plan, 2 * P - 2, M,
              (json{{"parallel", {{"pp", P}, {"microbatches", M}, {"schedule", schedule.toStdString()}}}}));
    const ms::CostModel cost(*plan, chunkTimes(*plan, 1.0, 1.0, 1.0), ms::Communication::Free);
    QVERIFY(cost.calibrated());
    const ms::SimResult r = ms::simulate(*plan, cost);
    QVERIFY2(r.error.empty(), r.error.c_str());
    const double expected = double(P - 1) / (M + P - 1);
    QCOMPARE(int(r.bubbleFraction.size()), P);
    for (double b : r.bubbleFraction) QVERIFY2(std::abs(b - expected) < 1e-9, qPrintable(QString::number(b)));
    QVERIFY(std::abs(r.pipelineSpan - 3.0 * (M + P - 1)) < 1e-9);
    QVERIFY(r.stepTime >= r.pipelineSpan);
  }

  // Interleaving V chunks per stage shrinks the bubble towards (P-1)/(V*M+P-1) (Narayanan et al. 2021,
  // section 2.2.2: the bubble time is divided by V).
  void interleavedBubble_data() {
    QTest::addColumn<int>("P");
    QTest::addColumn<int>("V");
    QTest::addColumn<int>("M");
    QTest::newRow("P2 V2 M4") << 2 << 2 << 4;
    QTest::newRow("P2 V4 M8") << 2 << 4 << 8;
    QTest::newRow("P4 V2 M4") << 4 << 2 << 4;
    QTest::newRow("P4 V2 M8") << 4 << 2 << 8;
    QTest::newRow("P4 V2 M16") << 4 << 2 << 16;
    QTest::newRow("P8 V2 M16") << 8 << 2 << 16;
  }
  void interleavedBubble() {
    QFETCH(int, P);
    QFETCH(int, V);
    QFETCH(int, M);
    MAKE_PLAN(
        plan, P * V - 2, M,
        (json{{"parallel",
               {{"pp", P}, {"microbatches", M}, {"schedule", "interleaved_1f1b"}, {"virtual_chunks", V}}}}));
    // Each chunk does 1/V of a stage's work: F = 1/V, B = 2/V.
    const ms::CostModel cost(*plan, chunkTimes(*plan, 1.0 / V, 1.0 / V, 1.0 / V), ms::Communication::Free);
    const ms::SimResult r = ms::simulate(*plan, cost);
    QVERIFY2(r.error.empty(), r.error.c_str());
    const double interleaved = maxOf(r.bubbleFraction);
    const double oneFOneB = double(P - 1) / (M + P - 1);
    const double textbook = double(P - 1) / (V * M + P - 1);
    QVERIFY(interleaved < oneFOneB);
    QVERIFY2(std::abs(interleaved - textbook) < 1e-9, qPrintable(QString::number(interleaved, 'g', 12)));
  }

  // ZB-H1 with F = B = W (Qi et al. 2024, section 3.1): every stage idles P - 1 units in a pipeline of
  // 3M + P - 1, a third of 1F1B's bubble time.
  void zeroBubbleH1_data() {
    QTest::addColumn<int>("P");
    QTest::addColumn<int>("M");
    QTest::newRow("P2 M4") << 2 << 4;
    QTest::newRow("P4 M8") << 4 << 8;
    QTest::newRow("P4 M16") << 4 << 16;
    QTest::newRow("P8 M16") << 8 << 16;
  }
  void zeroBubbleH1() {
    QFETCH(int, P);
    QFETCH(int, M);
    MAKE_PLAN(zb, 2 * P - 2, M,
              (json{{"parallel", {{"pp", P}, {"microbatches", M}, {"schedule", "zb_h1"}}}}));
    MAKE_PLAN(ofob, 2 * P - 2, M,
              (json{{"parallel", {{"pp", P}, {"microbatches", M}, {"schedule", "1f1b"}}}}));
    const ms::SimResult z =
        ms::simulate(*zb, ms::CostModel(*zb, chunkTimes(*zb, 1, 1, 1), ms::Communication::Free));
    const ms::SimResult o =
        ms::simulate(*ofob, ms::CostModel(*ofob, chunkTimes(*ofob, 1, 1, 1), ms::Communication::Free));
    QVERIFY2(z.error.empty(), z.error.c_str());
    QVERIFY(maxOf(z.bubbleFraction) < maxOf(o.bubbleFraction));
    const double expected = double(P - 1) / (3 * M + P - 1);
    for (double b : z.bubbleFraction) QVERIFY2(std::abs(b - expected) < 1e-9, qPrintable(QString::number(b)));
  }

  // Every message on the critical path pays the latency: a slower link makes a slower step.
  void latencyLengthensStep() {
    MAKE_PLAN(plan, 6, 16, (json{{"parallel", {{"pp", 4}, {"microbatches", 8}}}}));
    const ms::SimResult fast = ms::simulate(*plan, ms::CostModel(*plan));
    ms::Plan slow = *plan;
    const double added = 1e-3;
    slow.mesh.intraLink.latency += added;
    const ms::SimResult r = ms::simulate(slow, ms::CostModel(slow));
    // At least the first microbatch's forward and the last one's backward cross all P - 1 links in turn.
    QVERIFY2(r.stepTime >= fast.stepTime + 2 * 3 * added * (1 - 1e-9),
             qPrintable(QString("%1 vs %2").arg(r.stepTime).arg(fast.stepTime)));
    const ms::SimResult free = ms::simulate(*plan, ms::CostModel(*plan, ms::Communication::Free));
    QVERIFY(free.stepTime < fast.stepTime);
  }

  // The last stage's gradient sync runs while the earlier stages drain the pipeline: the step is shorter
  // than the pipeline plus every sync back to back, and that sync starts before the last backward ends.
  void dataParallelSyncOverlaps() {
    // One device per node, so the DP group (ranks 0, 1 of stage 0; 2, 3 of stage 1) crosses Ethernet.
    const json mesh = {{"nodes", json::array({{{"name", "a"}, {"device", "h100-sxm-80gb"}, {"count", 1}},
                                              {{"name", "b"}, {"device", "h100-sxm-80gb"}, {"count", 1}},
                                              {{"name", "c"}, {"device", "h100-sxm-80gb"}, {"count", 1}},
                                              {{"name", "d"}, {"device", "h100-sxm-80gb"}, {"count", 1}}})},
                       {"intra_link", "nvlink"},
                       {"inter_link", "ethernet"}};
    MAKE_PLAN(plan, 4, 64, (json{{"mesh", mesh}, {"parallel", {{"pp", 2}, {"dp", 2}, {"microbatches", 8}}}}));
    const ms::CostModel cost(*plan);
    const ms::SimResult r = ms::simulate(*plan, cost);
    QVERIFY2(r.error.empty(), r.error.c_str());
    double syncs = 0, lastStageSyncStart = -1;
    for (int k = 0; k < plan->schedule.chunkCount(); ++k) syncs += cost.gradSyncTime(k);
    QVERIFY(cost.gradSyncTime(1) > 0);
    const int lastStageRank = plan->layout.rank({0, 0, 1});
    for (const auto& s : r.spansByRank[static_cast<size_t>(lastStageRank)])
      if (s.type == ms::ActionType::GradSync) lastStageSyncStart = s.start;
    const double pipelineEnd = lastWorkEnd(r);
    const double optimizer = std::max(cost.optimizerTime(0), cost.optimizerTime(1));
    QVERIFY(lastStageSyncStart >= 0 && lastStageSyncStart < pipelineEnd);
    QVERIFY(r.stepTime < pipelineEnd + syncs + optimizer);
    // Stage 0's sync: each layer's part starts once the layer's gradients are final in the chunk's last
    // backward (the layers last to first), one after another; the embedding's, final at that backward's end,
    // cannot hide.
    const ms::SimSpan* lastB = nullptr;
    const ms::SimSpan* sync0 = nullptr;
    for (const auto& s : r.spansByRank[0]) {
      if (s.type == ms::ActionType::Backward && s.chunk == 0) lastB = &s;
      if (s.type == ms::ActionType::GradSync) sync0 = &s;
    }
    QVERIFY(lastB && sync0);
    const auto pieces = cost.gradSyncPieces(0);
    QCOMPARE(pieces.size(), size_t(3));  // embedding, block.0, block.1
    QCOMPARE(pieces[0].readyFraction, 1.0);
    double t = 0, sum = 0;
    for (size_t i = pieces.size(); i-- > 0;) {
      t = std::max(t, lastB->start + pieces[i].readyFraction * (lastB->end - lastB->start)) +
          pieces[i].seconds;
      sum += pieces[i].seconds;
    }
    QVERIFY(std::abs(sum - cost.gradSyncTime(0)) <= 1e-12 * sum);
    QVERIFY(pieces[1].readyFraction < 1 && pieces[2].readyFraction < pieces[1].readyFraction);
    QVERIFY(std::abs(sync0->end - t) <= 1e-12 * t);
    QVERIFY(sync0->start < lastB->end);  // it starts inside the last backward
    QVERIFY(r.stepTime >= lastB->end + pieces[0].seconds);
    QVERIFY(r.stepTime < lastB->end + cost.gradSyncTime(0) + optimizer);
  }

  // On CPU devices the sync waits for the compute (CostModel::collectivesOverlapCompute): it starts as the
  // last backward ends, holds the compute lane, and pays a latency per layer (the engine's collective per
  // unit).
  void cpuSyncWaitsForCompute() {
    const auto meshOf = [](const char* device) {
      json nodes = json::array();
      for (const char* name : {"a", "b", "c", "d"})
        nodes.push_back({{"name", name}, {"device", device}, {"count", 1}});
      return json{{"nodes", nodes}, {"intra_link", "shm"}, {"inter_link", "ethernet"}};
    };
    const json parallel = {{"pp", 2}, {"dp", 2}, {"microbatches", 8}};
    MAKE_PLAN(gpu, 4, 64, (json{{"mesh", meshOf("h100-sxm-80gb")}, {"parallel", parallel}}));
    MAKE_PLAN(cpu, 4, 64, (json{{"mesh", meshOf("cpu")}, {"parallel", parallel}}));
    const ms::CostModel gpuCost(*gpu), cpuCost(*cpu);
    QVERIFY(gpuCost.collectivesOverlapCompute(0) && gpuCost.collectivesOverlapCompute(1));
    QVERIFY(!cpuCost.collectivesOverlapCompute(0) && !cpuCost.collectivesOverlapCompute(1));
    // Stage 0's chunk has 3 layers (embedding, block.0, block.1): 3 all-reduces of two ranks, 2 latencies
    // each, against one.
    const double latency = cpu->mesh.interLink.latency;
    QVERIFY(latency > 0);
    QVERIFY2(std::abs(cpuCost.gradSyncTime(0) - gpuCost.gradSyncTime(0) - 4 * latency) <= 1e-9 * latency,
             qPrintable(QString("%1 vs %2").arg(cpuCost.gradSyncTime(0)).arg(gpuCost.gradSyncTime(0))));
    const ms::SimResult r = ms::simulate(*cpu, cpuCost);
    QVERIFY2(r.error.empty(), r.error.c_str());
    for (int rank = 0; rank < 4; ++rank) {
      double lastCompute = 0;
      const ms::SimSpan *sync = nullptr, *optimizer = nullptr;
      for (const auto& s : r.spansByRank[static_cast<size_t>(rank)]) {
        if (s.type == ms::ActionType::Forward || s.type == ms::ActionType::Backward)
          lastCompute = std::max(lastCompute, s.end);
        if (s.type == ms::ActionType::GradSync) sync = &s;
        if (s.type == ms::ActionType::OptimizerStep) optimizer = &s;
      }
      QVERIFY(sync && optimizer);
      QCOMPARE(sync->start, lastCompute);
      QVERIFY(std::abs(sync->end - sync->start - cpuCost.gradSyncTime(0)) <= 1e-12 * sync->end ||
              std::abs(sync->end - sync->start - cpuCost.gradSyncTime(1)) <= 1e-12 * sync->end);
      QCOMPARE(optimizer->start, sync->end);
    }
    // ZeRO-3's prefetched gathers: on a GPU only the chunk's first layer's (its last's in backward) and what
    // outlasts the layer beside it are exposed; on a CPU every layer's gather, forward and backward alike.
    const json zero3 = {{"dp", 4}, {"zero", 3}, {"microbatches", 2}};
    MAKE_PLAN(gpuZ3, 4, 64, (json{{"mesh", meshOf("h100-sxm-80gb")}, {"parallel", zero3}}));
    MAKE_PLAN(cpuZ3, 4, 64, (json{{"mesh", meshOf("cpu")}, {"parallel", zero3}}));
    const auto comm = [](const ms::Plan& plan, const ms::CostModel& cost, bool backward) {
      double compute = 0;
      for (int l : plan.partition.chunks[0])
        compute += backward ? cost.layerTimes().backwardInput[static_cast<size_t>(l)] +
                                  cost.layerTimes().backwardWeight[static_cast<size_t>(l)]
                            : cost.layerTimes().forward[static_cast<size_t>(l)];
      return (backward ? cost.backwardTime(0) : cost.forwardTime(0)) - compute;
    };
    const ms::CostModel gpuZ3Cost(*gpuZ3), cpuZ3Cost(*cpuZ3);
    const double cpuForward = comm(*cpuZ3, cpuZ3Cost, false), gpuForward = comm(*gpuZ3, gpuZ3Cost, false);
    QVERIFY2(cpuForward > 1.5 * gpuForward && gpuForward > 0,
             qPrintable(QString("%1 vs %2").arg(cpuForward).arg(gpuForward)));
    QVERIFY(std::abs(comm(*cpuZ3, cpuZ3Cost, true) - cpuForward) <= 1e-9 * cpuForward);
  }

  void throughputAndMfu() {
    MAKE_PLAN(plan, 4, 32,
              (json{{"parallel", {{"pp", 2}, {"dp", 2}, {"microbatches", 4}, {"precision", "bf16"}}}}));
    const ms::SimResult r = ms::simulate(*plan, ms::CostModel(*plan));
    QVERIFY(r.stepTime > 0);
    QVERIFY(std::abs(r.tokensPerSecond - 32.0 * 64 / r.stepTime) <= 1e-9 * r.tokensPerSecond);
    QVERIFY(std::abs(r.modelFlopsPerStep - 3 * totalFlopsPerSample(*plan) * 32) <=
            1e-9 * r.modelFlopsPerStep);
    QVERIFY(std::abs(r.mfu - r.modelFlopsPerStep / (r.stepTime * 4 * kH100Bf16)) <= 1e-9 * r.mfu);
    QVERIFY(r.mfu > 0 && r.mfu <= 1);
    // One rank, no communication: MFU is the achievable fraction, less the optimizer step's share.
    MAKE_PLAN(single, 4, 32, (json{{"parallel", {{"microbatches", 4}, {"precision", "bf16"}}}}));
    const ms::CostModel cost(*single, ms::Communication::Free);
    const ms::SimResult s = ms::simulate(*single, cost);
    const double compute = s.stepTime - cost.optimizerTime(0);
    QVERIFY(std::abs(s.mfu - 0.5 * compute / s.stepTime) <= 1e-9);
    QVERIFY(s.mfu > r.mfu);  // the small pipeline idles and communicates
  }

  // Each rank's spans are its stage's list in order; compute-lane spans never overlap; DP and TP peers
  // carry the same times.
  // overlap_param_gather: ZeRO-1's parameter all-gather leaves the optimizer step and runs from the step's
  // start beside the forward, each layer of a chunk waiting for its own part (Megatron-LM's
  // --overlap-param-gather). The parts are the ring all-gather of each chunk's parameters.
  // tp_comm_overlap (plan/tp_overlap.h): each of a block's sequence-parallel collectives split into n
  // chunks beside its GEMM rows leaves max(comm / n, comm - gemm (n - 1) / n) exposed. Worked by hand on the
  // flat H100 (GEMMs costed by FLOPs at half the fp32 peak) for gpt, width 64, MLP 256, 64 positions, tp 2,
  // one sample a microbatch (n = 4: a sample's 32 positions a rank in 4 chunks), on a link so slow that
  // every collective outlasts its GEMM rows and on one so fast that only a chunk's transfer shows. Forward:
  // all-gather + q|k|v, proj + reduce-scatter, all-gather + fc, fcproj + reduce-scatter; backward:
  // reduce-scatter beside the fc input gradient, all-gather beside proj's, reduce-scatter beside q|k|v's
  // (each reduce-scatter behind its LayerNorm output's re-gather), and where a block's output is a sequence
  // piece (blocks 0 and 1 of 3) the all-gather of its gradient
  // beside fcproj's input gradient; the first block's input gradient is gathered whole (its input is the
  // embedding's whole output), the last block's output whole in forward. Without the overlap each direction
  // is two all-reduces, plus or minus those whole gathers.
  void tpCommOverlapHidesCollectives_data() {
    QTest::addColumn<double>("gbs");
    QTest::newRow("slow link") << 1e-3;
    QTest::newRow("fast link") << 1e6;
  }
  void tpCommOverlapHidesCollectives() {
    QFETCH(double, gbs);
    QCOMPARE(ms::tpOverlapSplits(1, 32), 4);
    const int blocks = 3;
    json serialPatch = {
        {"parallel", {{"tp", 2}, {"sequence_parallel", true}, {"microbatches", 8}}},
        {"mesh",
         {{"link_types", json::array({{{"name", "test"}, {"bandwidth_gbs", gbs}, {"latency_us", 0}}})},
          {"intra_link", "test"}}}};
    MAKE_PLAN(serial, blocks, 8, serialPatch);
    json overlapPatch = serialPatch;
    overlapPatch["parallel"]["tp_comm_overlap"] = true;
    MAKE_PLAN(plan, blocks, 8, overlapPatch);
    const ms::CostModel a(*serial), b(*plan);
    const ms::LinkSpec link = ms::ringLink(*plan, plan->layout.tpGroup(0));
    const double T = 64, C = 64, F = 256, rate = 66.9e12 * 0.5, n = 4;
    const double bytes = T * C * 4.0;  // one sample's block output, fp32
    const double ag = ms::ringAllGatherTime(bytes, 2, link), rs = ms::ringReduceScatterTime(bytes, 2, link);
    const double ar = ms::ringAllReduceTime(bytes, 2, link);
    const auto gemm = [&](double k, double out) { return 2.0 * T * k * out / rate; };
    const double qkv = gemm(C, 3 * C / 2), proj = gemm(C / 2, C), fc = gemm(C, F / 2),
                 fcproj = gemm(F / 2, C);
    const auto exposed = [&](double comm, double g) { return std::max(comm / n, comm - g * (n - 1) / n); };
    const double forward = exposed(ag, qkv) + exposed(rs, proj) + exposed(ag, fc) + exposed(rs, fcproj);
    // Each LayerNorm output's re-gather for the weight gradients starts just before the reduce-scatters of
    // the input gradient it belongs to and queues ahead of them (the fc and q|k|v input gradients take as
    // long as their forward GEMMs).
    const auto after = [&](double first, double comm, double g) {
      return std::max({comm / n, first + comm - g, comm - g * (n - 1) / n});
    };
    const double core = after(ag, rs, fc) + exposed(ag, proj) + after(ag, rs, qkv);
    // Blocks 0, 1 and 2: outputs in pieces, pieces, whole; inputs whole, pieces, pieces.
    const double backward = (exposed(ag, fcproj) + core + ag) + (exposed(ag, fcproj) + core) + core;
    if (gbs < 1) {  // every collective longer than its rows
      QVERIFY(ag > qkv && rs > fcproj);
      QVERIFY(std::abs(forward - (2 * ag + 2 * rs - 0.75 * (qkv + proj + fc + fcproj))) <= 1e-9 * forward);
    } else {  // a chunk's transfer is all that shows
      QVERIFY(ag < qkv / 4 && rs < proj / 4);
      QVERIFY(std::abs(forward - (ag + rs) / 2) <= 1e-9 * forward);
    }
    // The blocks' share of each chunk's forward and backward: the serial two all-reduces become the above;
    // nothing else (the embedding's and head's collectives) changes.
    const int k = 0;
    const double savedF = a.forwardTime(k) - b.forwardTime(k), savedB = a.backwardTime(k) - b.backwardTime(k);
    QVERIFY2(std::abs(savedF - blocks * (2 * ar - forward)) <= 1e-9 * a.forwardTime(k),
             qPrintable(QString("%1 vs %2").arg(savedF).arg(blocks * (2 * ar - forward))));
    // (The serial plan's backward also holds the two LayerNorm re-gathers a block, whole.)
    QVERIFY2(std::abs(savedB - (blocks * 2 * (ar + ag) - backward)) <= 1e-9 * a.backwardTime(k),
             qPrintable(QString("%1 vs %2").arg(savedB).arg(blocks * 2 * (ar + ag) - backward)));
    QVERIFY(savedF > 0 && savedB > 0);
    // Either way the activation stays in sequence pieces from block to block (Megatron's layout) and only the
    // last block gathers its output whole for the head: one all-gather more in forward than tensor
    // parallelism alone, never overlapped; serial backward gathers as many as it (the first block's input
    // gradient and the two inner outputs' gradients for the last block's, which gathers none).
    json noSpPatch = serialPatch;
    noSpPatch["parallel"]["sequence_parallel"] = false;
    MAKE_PLAN(noSp, blocks, 8, noSpPatch);
    const ms::CostModel tpOnly(*noSp);
    const double gathers = a.forwardTime(k) - tpOnly.forwardTime(k);
    QVERIFY2(std::abs(gathers - ag) <= 1e-9 * a.forwardTime(k),
             qPrintable(QString("%1 vs %2").arg(gathers).arg(ag)));
    // (Backward also gathers the two LayerNorm outputs again for the weight gradients.)
    QVERIFY2(
        std::abs(a.backwardTime(k) - tpOnly.backwardTime(k) - blocks * 2 * ag) <= 1e-9 * a.backwardTime(k),
        qPrintable(QString("%1 vs %2").arg(a.backwardTime(k) - tpOnly.backwardTime(k)).arg(blocks * 2 * ag)));
    // The step is shorter by as much as the one stage's actions are (no pipeline: the sum over microbatches).
    const ms::SimResult ra = ms::simulate(*serial, a), rb = ms::simulate(*plan, b);
    QVERIFY2(rb.error.empty(), rb.error.c_str());
    QVERIFY(std::abs((ra.stepTime - rb.stepTime) - 8 * (savedF + savedB)) <= 1e-9 * ra.stepTime);
  }

  void paramGatherOverlapsTheForward() {
    const json parallel = {{"pp", 2}, {"dp", 4}, {"microbatches", 4}, {"zero", 1}};
    MAKE_PLAN(serial, 6, 32, (json{{"parallel", parallel}}));
    json overlapped = parallel;
    overlapped["overlap_param_gather"] = true;
    MAKE_PLAN(plan, 6, 32, (json{{"parallel", overlapped}}));
    const ms::CostModel a(*serial), b(*plan), free(*plan, ms::Communication::Free);
    const std::vector<double> params = ms::chunkLocalParameterCount(*plan);
    for (int s = 0; s < plan->partition.stages; ++s) {
      double parts = 0;
      for (int k : plan->partition.chunksOfStage(s)) {
        QVERIFY(a.paramGatherPieces(k).empty());
        QVERIFY(free.paramGatherPieces(k).empty());
        const std::vector<double> pieces = b.paramGatherPieces(k);
        QCOMPARE(pieces.size(), plan->partition.chunks[static_cast<size_t>(k)].size());
        double sum = 0;
        for (double p : pieces) sum += p;
        const ms::LinkSpec link = ms::ringLink(*plan, plan->layout.dpCpGroup(plan->layout.rank({0, 0, s})));
        QVERIFY(sum > 0);
        QVERIFY(std::abs(sum - ms::ringAllGatherTime(params[static_cast<size_t>(k)] * 4.0, 4, link)) <=
                1e-12 * sum);
        parts += sum;
      }
      // The optimizer step no longer holds the gather (fp32: 4 bytes a parameter).
      QVERIFY(std::abs(a.optimizerTime(s) - b.optimizerTime(s) - parts) <= 1e-9 * a.optimizerTime(s));
    }
    // Stage 0's first forward starts when its first layer's part has arrived, and each later layer waits
    // for its own part; the step gets shorter.
    const ms::SimResult ra = ms::simulate(*serial, a), rb = ms::simulate(*plan, b);
    QVERIFY2(rb.error.empty(), rb.error.c_str());
    const int k0 = plan->partition.chunksOfStage(0).front();
    const std::vector<double> pieces = b.paramGatherPieces(k0), shares = b.forwardShares(k0);
    const ms::SimSpan& first = rb.spansByRank[0].front();
    QCOMPARE(int(first.type), int(ms::ActionType::Forward));
    QCOMPARE(first.start, pieces[0]);
    double arrived = 0, t = pieces[0];
    for (size_t i = 0; i < pieces.size(); ++i) {
      arrived += pieces[i];
      t = std::max(t, arrived) + b.forwardTime(k0) * shares[i];
    }
    QVERIFY(std::abs(first.end - t) <= 1e-12 * t);
    // The timeline gets each chunk's gather on the communication lane: one chunk on stage 0, from 0.
    const std::vector<ms::SimParamGather>& gathers = rb.paramGathersByRank[0];
    QCOMPARE(gathers.size(), size_t(1));
    QCOMPARE(gathers[0].chunk, k0);
    QCOMPARE(gathers[0].start, 0.0);
    QVERIFY(std::abs(gathers[0].end - arrived) <= 1e-12 * arrived);
    for (const auto& g : ra.paramGathersByRank) QVERIFY(g.empty());
    QVERIFY2(rb.stepTime < ra.stepTime, qPrintable(QString("%1 vs %2").arg(rb.stepTime).arg(ra.stepTime)));
  }

  void spansFollowLists_data() {
    QTest::addColumn<QString>("schedule");
    QTest::addColumn<int>("V");
    QTest::newRow("gpipe") << "gpipe" << 1;
    QTest::newRow("1f1b") << "1f1b" << 1;
    QTest::newRow("interleaved") << "interleaved_1f1b" << 2;
    QTest::newRow("zb_h1") << "zb_h1" << 1;
  }
  void spansFollowLists() {
    QFETCH(QString, schedule);
    QFETCH(int, V);
    MAKE_PLAN(plan, 6, 16,
              (json{{"parallel",
                     {{"pp", 2},
                      {"dp", 2},
                      {"tp", 2},
                      {"microbatches", 4},
                      {"virtual_chunks", V},
                      {"schedule", schedule.toStdString()},
                      {"zero", 1}}}}));
    const ms::SimResult r = ms::simulate(*plan, ms::CostModel(*plan));
    QVERIFY2(r.error.empty(), r.error.c_str());
    QCOMPARE(int(r.spansByRank.size()), 8);
    for (int rank = 0; rank < 8; ++rank) {
      const int stage = plan->stageOfRank(rank);
      const auto& actions = plan->schedule.actions[static_cast<size_t>(stage)];
      const auto& spans = r.spansByRank[static_cast<size_t>(rank)];
      QCOMPARE(spans.size(), actions.size());
      double laneFree = 0;
      for (size_t i = 0; i < spans.size(); ++i) {
        const ms::SimSpan& s = spans[i];
        QCOMPARE(s.rank, rank);
        QVERIFY(s.type == actions[i].type && s.microbatch == actions[i].microbatch &&
                s.chunk == actions[i].chunk);
        QVERIFY(s.start >= 0 && s.end >= s.start);
        QVERIFY(s.end <= r.stepTime);
        if (!ms::onComputeLane(s.type)) continue;
        QVERIFY2(s.start >= laneFree, qPrintable(QString("rank %1 span %2").arg(rank).arg(i)));
        laneFree = s.end;
      }
      const auto& first = r.spansByRank[static_cast<size_t>(plan->layout.rank({0, 0, stage}))];
      for (size_t i = 0; i < spans.size(); ++i) QCOMPARE(spans[i].end, first[i].end);
      QCOMPARE(r.bubbleFraction[static_cast<size_t>(rank)],
               r.bubbleFraction[static_cast<size_t>(plan->layout.rank({0, 0, stage}))]);
    }
  }
};

QTEST_APPLESS_MAIN(TestSimulator)
#include "tst_simulator.moc"
