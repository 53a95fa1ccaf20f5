// Tests of device profiles (plan/device_profile.h) and of the cost model on a measured device. A synthetic
// profile whose rates are power laws of the sizes makes log-space interpolation exact everywhere inside the
// grid, so interpolated times are checked against the closed form, not against a copy of the code. Then:
// the nccl-tests factors, a link curve rescaled to other group sizes (ring and tree), file errors that name
// the file and the field, a config naming a profile (its device and links, relative paths, unknown links),
// and the cost model timing a gpt block by its GEMM shapes, threads per rank and oversubscribed cores.
#include <QtTest>

#include "test_util.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "plan/cost_model.h"
#include "plan/device_profile.h"
#include "plan/hardware.h"
#include "plan/plan.h"

using nlohmann::json;

namespace {

// GEMM rate of the synthetic profile: 1e8 * m^0.5 * (n k)^0.25 FLOP/s, 1.8x at 2 threads.
double synthRate(double m, double n, double k, int threads) {
  return 1e8 * std::pow(m, 0.5) * std::pow(n * k, 0.25) * (threads == 2 ? 1.8 : 1.0);
}
double synthGemm(double m, double n, double k, int threads) {
  return 2.0 * m * n * k / synthRate(m, n, k, threads);
}
// Attention: forward rate 1e7 * seq^0.5; backward 2.5x the forward time.
double attentionFlops(int seq) {
  return 4.0 * 4 * double(seq) * seq * 64 * 0.5;
}
// Elementwise 1e-3 * bytes^0.5 s... a power law (interpolation exact); optimizer 2e8 params/s.
double synthElementwise(double bytes, int threads) {
  return 1e-8 * std::pow(bytes, 0.75) / (threads == 2 ? 1.5 : 1.0);
}
// Links: all_reduce c sqrt(bytes), sendrecv 0.5 c sqrt(bytes); tcp 4x slower.
constexpr double kShm = 1e-7;

const std::vector<int> kMs = {8, 64, 512}, kNks = {16, 128};

json synthProfile() {
  json gemm = json::array();
  for (int threads : {1, 2})
    for (int m : kMs)
      for (int n : kNks)
        for (int k : kNks)
          gemm.push_back({{"precision", "fp32"},
                          {"threads", threads},
                          {"m", m},
                          {"n", n},
                          {"k", k},
                          {"seconds", synthGemm(m, n, k, threads)},
                          {"flops_per_s", synthRate(m, n, k, threads)}});
  json attention = json::array();
  for (int threads : {1, 2})
    for (int seq : {64, 256, 1024}) {
      const double f = attentionFlops(seq), fwd = f / (1e7 * std::sqrt(double(seq))) / threads;
      attention.push_back({{"precision", "fp32"},
                           {"threads", threads},
                           {"batch", 1},
                           {"heads", 4},
                           {"seq", seq},
                           {"head_size", 64},
                           {"causal", true},
                           {"flops", f},
                           {"forward_seconds", fwd},
                           {"backward_seconds", 2.5 * fwd}});
    }
  json elementwise = json::array(), optimizer = json::array();
  for (int threads : {1, 2}) {
    for (double bytes : {1e3, 1e5, 1e7, 1e9})
      elementwise.push_back({{"threads", threads},
                             {"bytes", bytes},
                             {"seconds", synthElementwise(bytes, threads)},
                             {"bytes_per_s", bytes / synthElementwise(bytes, threads)}});
    for (double params : {1e4, 1e6, 1e8})
      optimizer.push_back({{"threads", threads},
                           {"params", params},
                           {"seconds", params / 2e8 / threads},
                           {"params_per_s", 2e8}});
  }
  json links = json::array();
  for (const auto& [name, c] : {std::pair<const char*, double>{"shm", kShm}, {"tcp", 4 * kShm}}) {
    json rows = json::array();
    for (const char* op : {"sendrecv", "all_reduce", "all_gather"})
      for (double bytes : {8.0, 4096.0, 1048576.0, 67108864.0}) {
        const double t = (std::string(op) == "sendrecv" ? 0.5 : 1.0) * c * std::sqrt(bytes);
        rows.push_back(
            {{"op", op}, {"bytes", bytes}, {"seconds", t}, {"algbw", bytes / t}, {"busbw", bytes / t}});
      }
    links.push_back({{"name", name}, {"transport", "synthetic"}, {"ranks", 2}, {"measurements", rows}});
  }
  return {{"format", "meshstudio-device-profile"},
          {"version", 1},
          {"machine", {{"hostname", "testhost"}, {"cpu", "Test CPU"}, {"cores", 2}, {"memory_bytes", 8e9}}},
          {"device",
           {{"backend", "cpu"},
            {"memory_bytes", 8e9},
            {"gemm", gemm},
            {"attention", attention},
            {"elementwise", elementwise},
            {"optimizer", optimizer}}},
          {"links", links}};
}

// The backward's GEMM tables (GemmOp), each at the layer's shape: the input gradient at half the forward's
// rate, the weight gradient at 0.8 of it.
double synthBackward(ms::GemmOp op, double m, double n, double k, int threads) {
  return synthGemm(m, n, k, threads) / (op == ms::GemmOp::InputGradient ? 0.5 : 0.8);
}
json withBackwardGemms(json doc) {
  json& rows = doc["device"]["gemm"];
  const json forward = rows;
  for (const ms::GemmOp op : {ms::GemmOp::InputGradient, ms::GemmOp::WeightGradient})
    for (json row : forward) {
      row["op"] = ms::gemmOpName(op);
      row["seconds"] = synthBackward(op, row["m"].get<double>(), row["n"].get<double>(),
                                     row["k"].get<double>(), row["threads"].get<int>());
      rows.push_back(row);
    }
  return doc;
}

// The named elementwise kernels: LayerNorm's forward 1e-9 * elements * width^-0.5 + 1e-6 s at widths 32
// and 512 (a power law in elements plus a constant is not log-log linear, so only the measured points and the
// width interpolation are checked exactly), backward 2x; GELU 1e-9 s an element, backward 1.5x.
double synthLayerNorm(double rows, double width) {
  return 1e-9 * rows * width / std::sqrt(width) + 1e-6;
}
json withVectorKernels(json doc) {
  json rows = json::array();
  for (int threads : {1, 2}) {
    for (double width : {32.0, 512.0})
      for (double elements : {4096.0, 262144.0})
        rows.push_back({{"kernel", "layernorm"},
                        {"threads", threads},
                        {"rows", elements / width},
                        {"width", width},
                        {"forward_seconds", synthLayerNorm(elements / width, width) / threads},
                        {"backward_seconds", 2 * synthLayerNorm(elements / width, width) / threads}});
    for (double elements : {4096.0, 262144.0})
      rows.push_back({{"kernel", "gelu"},
                      {"threads", threads},
                      {"rows", elements},
                      {"width", 1},
                      {"forward_seconds", 1e-9 * elements / threads},
                      {"backward_seconds", 1.5e-9 * elements / threads}});
  }
  doc["device"]["vector_kernels"] = rows;
  return doc;
}

// Ring attention's blocks (kernel "ring_block"): each fused entry again at a quarter of its keys and 3 times
// its time (forward and backward), so a block of seq / 4 keys runs at a third of the fused rate at seq.
json withRingAttention(json doc) {
  const json fused = doc["device"]["attention"];
  for (json row : fused) {
    row["kernel"] = "ring_block";
    row["seq"] = row["seq"].get<int>() / 4;
    row["forward_seconds"] = 3.0 * row["forward_seconds"].get<double>();
    row["backward_seconds"] = 3.0 * row["backward_seconds"].get<double>();
    doc["device"]["attention"].push_back(row);
  }
  return doc;
}

std::shared_ptr<const ms::DeviceProfile> parsed(const json& doc) {
  auto p = ms::parseDeviceProfile(doc, "synth.json");
  if (!p) qFatal("%s", p.message().c_str());
  return *p;
}

bool near(double a, double b, double rel = 1e-12) {
  return std::abs(a - b) <= rel * std::max(std::abs(a), std::abs(b));
}

#define QNEAR(a, b) QVERIFY2(near((a), (b)), (std::to_string(a) + " vs " + std::to_string(b)).c_str())

void writeFile(const QString& path, const std::string& text) {
  std::ofstream(path.toStdString()) << text;
}

}  // namespace

class TestDeviceProfile : public QObject {
  Q_OBJECT

 private slots:
  void gemmExactAtGridPointsAndBetween() {
    const auto p = parsed(synthProfile());
    // Measured points: exactly the measured time.
    QCOMPARE(p->gemmSeconds(ms::Precision::Fp32, 1, 64, 128, 16), synthGemm(64, 128, 16, 1));
    QCOMPARE(p->gemmSeconds(ms::Precision::Fp32, 2, 512, 16, 128), synthGemm(512, 16, 128, 2));
    // Inside the grid: the power law, which log-space interpolation reproduces.
    QNEAR(p->gemmSeconds(ms::Precision::Fp32, 1, 100, 50, 30), synthGemm(100, 50, 30, 1));
    QNEAR(p->gemmSeconds(ms::Precision::Fp32, 2, 9, 17, 127), synthGemm(9, 17, 127, 2));
    // Beyond the grid: the edge's rate (m = 4096 runs at m = 512's rate, n = 4 at n = 16's).
    QNEAR(p->gemmSeconds(ms::Precision::Fp32, 1, 4096, 4, 100),
          2.0 * 4096 * 4 * 100 / synthRate(512, 16, 100, 1));
    // bf16 was not measured: fp32's table stands in.
    QCOMPARE(p->gemmSeconds(ms::Precision::Bf16, 1, 64, 128, 16), synthGemm(64, 128, 16, 1));
    QNEAR(p->peakGemmRate(ms::Precision::Fp32, 2), synthRate(512, 128, 128, 2));
  }

  void gemmBackwardOpsHaveTheirOwnCurves() {
    using ms::GemmOp;
    const auto p = parsed(withBackwardGemms(synthProfile()));
    for (const GemmOp op : {GemmOp::InputGradient, GemmOp::WeightGradient}) {
      // At a measured shape, the op's measured time; between shapes its own power law; the forward's
      // table is unchanged.
      QCOMPARE(p->gemmSeconds(op, ms::Precision::Fp32, 1, 64, 128, 16), synthBackward(op, 64, 128, 16, 1));
      QNEAR(p->gemmSeconds(op, ms::Precision::Fp32, 2, 100, 50, 30), synthBackward(op, 100, 50, 30, 2));
    }
    QCOMPARE(p->gemmSeconds(GemmOp::Forward, ms::Precision::Fp32, 1, 64, 128, 16), synthGemm(64, 128, 16, 1));
    QCOMPARE(p->gemmSeconds(ms::Precision::Fp32, 1, 64, 128, 16), synthGemm(64, 128, 16, 1));
    // A profile without them (written before they were measured) costs each as the forward GEMM of its
    // product's shape: dinp (m x k) over n, dweight (k x n) over m.
    const auto old = parsed(synthProfile());
    QCOMPARE(old->gemmSeconds(GemmOp::InputGradient, ms::Precision::Fp32, 1, 64, 16, 128),
             synthGemm(64, 128, 16, 1));
    QCOMPARE(old->gemmSeconds(GemmOp::WeightGradient, ms::Precision::Fp32, 1, 128, 16, 64),
             synthGemm(64, 16, 128, 1));
    // An op the engine does not know, and a backward table missing a thread count the forward has.
    json doc = withBackwardGemms(synthProfile());
    doc["device"]["gemm"].back()["op"] = "dgrad";
    auto bad = ms::parseDeviceProfile(doc, "x.json");
    QVERIFY(!bad);
    QCOMPARE(QString::fromStdString(bad.message()),
             QString("x.json: /device/gemm/%1/op: must be \"forward\", \"input_gradient\" or "
                     "\"weight_gradient\", got \"dgrad\"")
                 .arg(doc["device"]["gemm"].size() - 1));
    doc = synthProfile();
    const json forwardRows = doc["device"]["gemm"];
    for (json row : forwardRows)
      if (row["threads"] == 1) {
        row["op"] = "weight_gradient";
        doc["device"]["gemm"].push_back(row);
      }
    const auto partial = ms::parseDeviceProfile(doc, "x.json");
    QVERIFY(!partial);
    QCOMPARE(
        QString::fromStdString(partial.message()),
        "x.json: /device/gemm: has no weight_gradient measurement at fp32 and 2 threads, where the forward "
        "has them (measure every op or none)");
  }

  // Ring attention's block table: read apart from the fused one, exact at its measured points, between
  // them as the fused table is read; the fused queries unchanged; bad kernels and a missing thread count
  // refused with the path.
  void ringAttentionBlocksHaveTheirOwnTable() {
    const auto p = parsed(synthProfile());
    QVERIFY(!p->hasRingAttention());
    QCOMPARE(p->ringAttentionSeconds(false, ms::Precision::Fp32, 1, 1e6, 64, 64), 0.0);
    const auto q = parsed(withRingAttention(synthProfile()));
    QVERIFY(q->hasRingAttention());
    const double f = attentionFlops(256), fwd = f / (1e7 * std::sqrt(256.0));
    QCOMPARE(q->ringAttentionSeconds(false, ms::Precision::Fp32, 1, f, 64, 64), 3 * fwd);
    QCOMPARE(q->ringAttentionSeconds(true, ms::Precision::Fp32, 2, f, 64, 64), 3 * 2.5 * fwd / 2);
    QCOMPARE(q->attentionForwardSeconds(ms::Precision::Fp32, 1, f, 256, 64), fwd);  // fused: as before
    // Halfway in log keys between blocks 16 and 64 (fused seq 64 and 256): the geometric mean of their rates.
    const double r16 = attentionFlops(64) / (3 * attentionFlops(64) / (1e7 * 8.0));
    const double r64 = f / (3 * fwd);
    QNEAR(q->ringAttentionSeconds(false, ms::Precision::Fp32, 1, 1e6, 32, 64), 1e6 / std::sqrt(r16 * r64));
    {
      json doc = withRingAttention(synthProfile());
      doc["device"]["attention"][7]["kernel"] = "flash";
      const auto bad = ms::parseDeviceProfile(doc, "x.json");
      QVERIFY(!bad);
      QCOMPARE(
          QString::fromStdString(bad.message()),
          QString("x.json: /device/attention/7/kernel: must be \"fused\" or \"ring_block\", got \"flash\""));
    }
    {
      json doc = withRingAttention(synthProfile());
      json rows = json::array();
      for (const json& row : doc["device"]["attention"])
        if (row.value("kernel", "fused") == "fused" || row["threads"] == 1) rows.push_back(row);
      doc["device"]["attention"] = rows;
      const auto partial = ms::parseDeviceProfile(doc, "x.json");
      QVERIFY(!partial);
      QCOMPARE(
          QString::fromStdString(partial.message()),
          QString("x.json: /device/attention: has no ring_block measurement at fp32 and 2 threads, where "
                  "the fused kernel has them (measure both or only fused)"));
    }
  }

  void vectorKernelsByNameRowsAndWidth() {
    using ms::VectorKernel;
    const auto p = parsed(withVectorKernels(synthProfile()));
    QVERIFY(p->hasVectorKernel(VectorKernel::LayerNorm) && p->hasVectorKernel(VectorKernel::Gelu));
    // Measured points exactly, forward and backward, at each thread count.
    QCOMPARE(p->vectorKernelSeconds(VectorKernel::LayerNorm, false, 1, 128, 32), synthLayerNorm(128, 32));
    QCOMPARE(p->vectorKernelSeconds(VectorKernel::LayerNorm, true, 2, 512, 512), synthLayerNorm(512, 512));
    // Between the widths, log-linear in log width at the same elements: at width 128 (halfway in log between
    // 32 and 512) the geometric mean of the two widths' times for 4096 elements.
    QNEAR(p->vectorKernelSeconds(VectorKernel::LayerNorm, false, 1, 32, 128),
          std::sqrt(synthLayerNorm(128, 32) * synthLayerNorm(8, 512)));
    // GELU over elements whatever the rows and width; beyond the largest, its rate.
    QCOMPARE(p->vectorKernelSeconds(VectorKernel::Gelu, false, 1, 128, 32), 1e-9 * 4096);
    QNEAR(p->vectorKernelSeconds(VectorKernel::Gelu, true, 1, 1024, 1024), 1.5e-9 * 1048576);
    // A profile without them has none.
    const auto old = parsed(synthProfile());
    QVERIFY(!old->hasVectorKernel(VectorKernel::Gelu));
    QCOMPARE(old->vectorKernelSeconds(VectorKernel::Gelu, false, 1, 128, 32), 0.0);
    // Errors name the entry and the field.
    json doc = withVectorKernels(synthProfile());
    doc["device"]["vector_kernels"][1]["kernel"] = "softmax";
    const auto bad = ms::parseDeviceProfile(doc, "x.json");
    QVERIFY(!bad);
    QCOMPARE(
        QString::fromStdString(bad.message()),
        R"(x.json: /device/vector_kernels/1/kernel: must be "layernorm", "gelu", "rmsnorm", "swiglu" or "rope", got "softmax")");
    // RoPE by rows of the q and k heads' width, as the norms.
    doc = withVectorKernels(synthProfile());
    doc["device"]["vector_kernels"].push_back({{"kernel", "rope"},
                                               {"threads", 1},
                                               {"rows", 256},
                                               {"width", 96},
                                               {"forward_seconds", 2e-6},
                                               {"backward_seconds", 3e-6}});
    const auto rope = parsed(doc);
    QVERIFY(rope->hasVectorKernel(VectorKernel::Rope) && !p->hasVectorKernel(VectorKernel::Rope));
    QVERIFY(ms::vectorKernelHasRows(VectorKernel::Rope));
    QCOMPARE(rope->vectorKernelSeconds(VectorKernel::Rope, true, 1, 256, 96), 3e-6);
    QCOMPARE(rope->vectorKernelSeconds(VectorKernel::Rope, false, 1, 512, 96), 4e-6);  // beyond: its rate
    doc = withVectorKernels(synthProfile());
    doc["device"]["vector_kernels"][0]["backward_seconds"] = 0;
    const auto zero = ms::parseDeviceProfile(doc, "x.json");
    QCOMPARE(QString::fromStdString(zero.message()),
             "x.json: /device/vector_kernels/0/backward_seconds: must be a number > 0, got 0");
  }

  void gemmSkippedCornerTakesTheBestBelowIt() {
    json doc = synthProfile();
    json& rows = doc["device"]["gemm"];
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i]["threads"] == 1 && rows[i]["m"] == 512 && rows[i]["n"] == 128 && rows[i]["k"] == 128) {
        rows.erase(i);
        break;
      }
    const auto p = parsed(doc);
    // The calibration skipped (512, 128, 128) as too large: it runs at the best rate measured at or below it
    // in every dimension, (512, 128, 16)'s (equal to (512, 16, 128)'s).
    QNEAR(p->gemmSeconds(ms::Precision::Fp32, 1, 512, 128, 128),
          2.0 * 512 * 128 * 128 / synthRate(512, 128, 16, 1));
  }

  void threadCounts() {
    const auto p = parsed(synthProfile());
    QCOMPARE(p->threadCounts(), (std::vector<int>{1, 2}));
    QCOMPARE(p->measuredThreads(1), 1);
    QCOMPARE(p->measuredThreads(3), 2);
    QCOMPARE(p->measuredThreads(64), 2);
    QCOMPARE(p->gemmSeconds(ms::Precision::Fp32, 16, 64, 16, 16), synthGemm(64, 16, 16, 2));
  }

  void attentionElementwiseOptimizer() {
    const auto p = parsed(synthProfile());
    const double f = attentionFlops(128);
    const double fwd = f / (1e7 * std::sqrt(128.0));
    QNEAR(p->attentionForwardSeconds(ms::Precision::Fp32, 1, f, 128, 64), fwd);
    QNEAR(p->attentionBackwardSeconds(ms::Precision::Fp32, 1, f, 128, 64), 2.5 * fwd);
    QNEAR(p->attentionForwardSeconds(ms::Precision::Fp32, 2, f, 128, 64), fwd / 2);
    // One head size measured: every head size at its rate.
    QNEAR(p->attentionForwardSeconds(ms::Precision::Fp32, 1, f, 128, 8), fwd);
    {
      // Head size 16 measured at a quarter of 64's rate: 32 lies halfway in log head size (half the rate),
      // 8 below the grid takes 16's.
      json doc = synthProfile();
      json rows = doc["device"]["attention"];
      for (json row : rows) {
        row["head_size"] = 16;
        row["forward_seconds"] = 4.0 * row["forward_seconds"].get<double>();
        row["backward_seconds"] = 4.0 * row["backward_seconds"].get<double>();
        doc["device"]["attention"].push_back(row);
      }
      const auto q = parsed(doc);
      QNEAR(q->attentionForwardSeconds(ms::Precision::Fp32, 1, f, 128, 64), fwd);
      QNEAR(q->attentionForwardSeconds(ms::Precision::Fp32, 1, f, 128, 16), 4 * fwd);
      QNEAR(q->attentionForwardSeconds(ms::Precision::Fp32, 1, f, 128, 32), 2 * fwd);
      QNEAR(q->attentionBackwardSeconds(ms::Precision::Fp32, 1, f, 128, 8), 4 * 2.5 * fwd);
      QNEAR(q->attentionForwardSeconds(ms::Precision::Fp32, 1, f, 128, 256), fwd);
    }
    // Longer than measured: the longest's rate.
    QNEAR(p->attentionForwardSeconds(ms::Precision::Fp32, 1, 1e9, 8192, 64), 1e9 / (1e7 * std::sqrt(1024.0)));
    QNEAR(p->elementwiseSeconds(1, 3e6), synthElementwise(3e6, 1));
    QNEAR(p->elementwiseSeconds(2, 4e4), synthElementwise(4e4, 2));
    QCOMPARE(p->elementwiseSeconds(1, 10), synthElementwise(1e3, 1));    // below: the fixed cost
    QNEAR(p->elementwiseSeconds(1, 4e9), 4 * synthElementwise(1e9, 1));  // beyond: the largest's rate
    QNEAR(p->optimizerSeconds(2, 3e5), 3e5 / 4e8);
  }

  void busBandwidthFactors() {
    // nccl-tests doc/PERFORMANCE.md.
    QCOMPARE(ms::busBandwidthFactor(ms::CollectiveOp::AllReduce, 8), 2.0 * 7 / 8);
    QCOMPARE(ms::busBandwidthFactor(ms::CollectiveOp::AllGather, 4), 0.75);
    QCOMPARE(ms::busBandwidthFactor(ms::CollectiveOp::ReduceScatter, 2), 0.5);
    QCOMPARE(ms::busBandwidthFactor(ms::CollectiveOp::AllToAll, 4), 0.75);
    QCOMPARE(ms::busBandwidthFactor(ms::CollectiveOp::Broadcast, 16), 1.0);
    QCOMPARE(ms::ringSteps(ms::CollectiveOp::AllReduce, 4), 6.0);
    QCOMPARE(ms::ringSteps(ms::CollectiveOp::AllGather, 4), 3.0);
  }

  void linkCurves() {
    const auto p = parsed(synthProfile());
    const ms::LinkProfile* shm = p->link("shm");
    QVERIFY(shm);
    QCOMPARE(shm->ranks, 2);
    using Op = ms::CollectiveOp;
    const auto ar = [](double b) { return kShm * std::sqrt(b); };
    // At the measured group size: the curve, exact at points and (a power law) between them.
    QCOMPARE(shm->seconds(Op::AllReduce, 4096, 2), ar(4096));
    QNEAR(shm->seconds(Op::AllReduce, 1e5, 2), ar(1e5));
    QCOMPARE(shm->seconds(Op::AllReduce, 1, 2), ar(8));                         // below: latency-bound
    QNEAR(shm->seconds(Op::AllReduce, 2 * 67108864.0, 2), 2 * ar(67108864.0));  // beyond: its bandwidth
    QNEAR(shm->seconds(Op::SendRecv, 1e5, 2), 0.5 * ar(1e5));
    QCOMPARE(shm->seconds(Op::AllReduce, 1e5, 1), 0.0);
    // Four ranks: the ring's latency part grows by ringSteps (6 / 2) and the rest by the busbw factor
    // (1.5 / 1); the tree: 2 ceil(log2 4) = 4 hops and the bytes twice. The lesser wins.
    const double L = ar(8), b = 1e5;
    const double ring = L * 3 + ar(1.5 * b) - L, tree = L * 2 + ar(2 * b) - L;
    QNEAR(shm->seconds(Op::AllReduce, b, 4), std::min(ring, tree));
    const double big = 1e7;
    QNEAR(shm->seconds(Op::AllReduce, big, 4), std::min(L * 3 + ar(1.5 * big) - L, L * 2 + ar(2 * big) - L));
    // An all-gather of 8 ranks from its own curve: latency 7x, the rest by (7/8) / (1/2).
    QNEAR(shm->seconds(Op::AllGather, b, 8), L * 7 + ar(b * 1.75) - L);
    // Reduce-scatter was not measured: all_reduce's curve with the factors ((1/2) / 1 of the bytes, 1 / 2 of
    // the steps at two ranks).
    QNEAR(shm->seconds(Op::ReduceScatter, b, 2), L * 0.5 + ar(0.5 * b) - L);
    QCOMPARE(shm->latency(), 0.5 * ar(8));
    QNEAR(shm->peakBusBandwidth(), 67108864.0 / ar(67108864.0));
    // The cost model's formulas read the curve on a measured link.
    const std::optional<ms::LinkSpec> spec = ms::toLinkSpec("here", p, "tcp");
    QVERIFY(spec && spec->profile);
    QCOMPARE(spec->name, std::string("here.tcp"));
    QNEAR(ms::ringAllReduceTime(4096, 2, *spec), 4 * ar(4096));
    QNEAR(ms::p2pTime(1e5, *spec), 2 * ar(1e5));
    QNEAR(ms::ringAllGatherTime(4096, 2, *spec), 4 * ar(4096));
    QVERIFY(!ms::toLinkSpec("here", p, "nvlink"));
  }

  void fileErrorsNameFileAndField_data() {
    QTest::addColumn<QByteArray>("patch");  // a JSON merge patch of the synthetic profile
    QTest::addColumn<QString>("message");
    QTest::newRow("format") << QByteArray(R"({"format":"other"})")
                            << R"(synth.json: /format: must be "meshstudio-device-profile", got "other")";
    QTest::newRow("version") << QByteArray(R"({"version":2})")
                             << "synth.json: /version: this engine reads version 1, got 2";
    QTest::newRow("cores") << QByteArray(R"({"machine":{"cores":0}})")
                           << "synth.json: /machine/cores: must be an integer >= 1, got 0";
    QTest::newRow("no gemm") << QByteArray(R"({"device":{"gemm":[]}})")
                             << "synth.json: /device/gemm: must be a non-empty array";
    QTest::newRow("no optimizer") << QByteArray(R"({"device":{"optimizer":null}})")
                                  << "synth.json: /device/optimizer: missing";
    QTest::newRow("links")
        << QByteArray(R"({"links":[{"name":"shm","ranks":1,"measurements":[]}]})")
        << "synth.json: /links/0/ranks: must be >= 2 (a link is measured between ranks), got 1";
    QTest::newRow("link ops")
        << QByteArray(
               R"({"links":[{"name":"shm","ranks":2,"measurements":[{"op":"all_reduce","bytes":8,"seconds":1e-6}]}]})")
        << R"(synth.json: /links/0/measurements: needs "sendrecv" measurements)";
  }
  void fileErrorsNameFileAndField() {
    QFETCH(QByteArray, patch);
    QFETCH(QString, message);
    json doc = synthProfile();
    doc.merge_patch(json::parse(patch.toStdString()));
    const auto p = ms::parseDeviceProfile(doc, "synth.json");
    QVERIFY(!p);
    QCOMPARE(QString::fromStdString(p.message()), message);
  }

  void badValuesInRows() {
    json doc = synthProfile();
    doc["device"]["gemm"][3]["seconds"] = -1;
    auto p = ms::parseDeviceProfile(doc, "x.json");
    QVERIFY(!p);
    QCOMPARE(QString::fromStdString(p.message()),
             "x.json: /device/gemm/3/seconds: must be a number > 0, got -1");
    doc = synthProfile();
    doc["device"]["gemm"][0]["precision"] = "fp8";
    p = ms::parseDeviceProfile(doc, "x.json");
    QCOMPARE(QString::fromStdString(p.message()),
             R"(x.json: /device/gemm/0/precision: must be "fp32" or "bf16", got "fp8")");
    doc = synthProfile();
    doc["links"][0]["measurements"][1]["bytes"] = 8.0;  // a second sendrecv of 8 bytes
    p = ms::parseDeviceProfile(doc, "x.json");
    QCOMPARE(QString::fromStdString(p.message()),
             "x.json: /links/0/measurements/1/bytes: a second sendrecv measurement of 8.0 bytes");
    const auto missing = ms::loadDeviceProfile("/nonexistent/profile.json");
    QVERIFY(!missing);
    QCOMPARE(QString::fromStdString(missing.message()),
             "/nonexistent/profile.json: cannot read: No such file or directory");
  }

  void configNamesAProfile() {
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    QDir(dir.path()).mkdir("profiles");
    writeFile(dir.filePath("profiles/here.json"), synthProfile().dump());
    json doc = ms::test::smallGpuPlanConfig("prof", 2, 8);
    doc["mesh"] = {{"nodes", json::array({{{"name", "n0"}, {"device", "here"}, {"count", 2}},
                                          {{"name", "n1"}, {"device", "here"}, {"count", 2}}})},
                   {"intra_link", "here.shm"},
                   {"inter_link", "here.tcp"},
                   {"profiles", json::array({{{"name", "here"}, {"file", "profiles/here.json"}}})}};
    doc["parallel"] = {{"dp", 4}};
    writeFile(dir.filePath("config.json"), doc.dump());
    auto config = ms::loadRunConfig(dir.filePath("config.json").toStdString());
    QVERIFY2(config, config ? "" : config.message().c_str());
    QVERIFY(config->mesh.profiles[0].data);
    auto mesh = ms::buildMesh(config->mesh);
    QVERIFY2(mesh, mesh ? "" : mesh.message().c_str());
    QCOMPARE(mesh->deviceCount(), 4);
    QVERIFY(mesh->devices[3].spec.profile);
    QCOMPARE(mesh->devices[0].spec.label, std::string("Measured Test CPU (testhost)"));
    QVERIFY(!mesh->devices[0].spec.publishedPeak);
    QCOMPARE(mesh->devices[0].spec.memoryBytes, 8e9);
    QNEAR(mesh->devices[0].spec.peakFlopsFp32, synthRate(512, 128, 128, 2));
    QCOMPARE(mesh->intraLink.name, std::string("here.shm"));
    QVERIFY(mesh->interLink.profile);
    QCOMPARE(mesh->interLink.latency, 0.5 * 4 * kShm * std::sqrt(8.0));
    // Saved and read back: the same config (the file named, not copied in).
    QVERIFY(ms::toJson(*config)["mesh"]["profiles"][0]["file"] == "profiles/here.json");

    // A link the profile did not measure: named with the ones it has.
    config->mesh.intraLink = "here.nvlink";
    mesh = ms::buildMesh(config->mesh);
    QVERIFY(!mesh);
    QVERIFY2(QString::fromStdString(mesh.message())
                 .contains("/mesh/intra_link: profile \"here\" (" +
                           QString::fromStdString(config->resolvePath("profiles/here.json")) +
                           ") measured no link \"nvlink\"; it has here.shm, here.tcp"),
             mesh.message().c_str());

    // A missing file: the field and the reason.
    doc["mesh"]["profiles"][0]["file"] = "profiles/gone.json";
    writeFile(dir.filePath("config.json"), doc.dump());
    config = ms::loadRunConfig(dir.filePath("config.json").toStdString());
    QVERIFY(!config);
    QVERIFY2(QString::fromStdString(config.message())
                 .contains("/mesh/profiles/0/file: " + dir.filePath("profiles/gone.json") +
                           ": cannot read: No such file or directory"),
             config.message().c_str());

    // A profile named like a catalog device, or like one of device_types.
    doc["mesh"]["profiles"][0] = {{"name", "cpu"}, {"file", "profiles/here.json"}};
    auto parsedConfig = ms::parseRunConfig(doc);
    QVERIFY(!parsedConfig);
    QVERIFY2(QString::fromStdString(parsedConfig.message())
                 .contains("/mesh/profiles/0/name: device type \"cpu\" is already in the hardware catalog"),
             parsedConfig.message().c_str());
    // Parsed without loading: building the mesh says so instead of guessing.
    doc["mesh"]["profiles"][0] = {{"name", "here"}, {"file", "profiles/here.json"}};
    parsedConfig = ms::parseRunConfig(doc);
    QVERIFY2(parsedConfig, parsedConfig ? "" : parsedConfig.message().c_str());
    mesh = ms::buildMesh(parsedConfig->mesh);
    QVERIFY(!mesh);
    QVERIFY2(QString::fromStdString(mesh.message())
                 .contains("/mesh/nodes/0/device: the profile at /mesh/profiles/0 was not read"),
             mesh.message().c_str());
  }

  // The cost model on a measured device: a gpt block's forward is its GEMMs by shape, its attention and its
  // elementwise bytes from the curves; 4 ranks on the 2-core profile get 1 thread each and share the cores
  // (twice as slow); tensor parallelism halves the split GEMM dimension.
  void costModelTimesLayersByShape() {
    QTemporaryDir dir;
    writeFile(dir.filePath("here.json"), synthProfile().dump());
    const auto planFor = [&](int count, const json& parallel, int threads, const json& model = json()) {
      json doc = ms::test::smallGpuPlanConfig("prof", 2, 8);
      if (!model.is_null()) doc["model"] = model;
      doc["mesh"] = {{"nodes", json::array({{{"name", "n0"}, {"device", "here"}, {"count", count}}})},
                     {"intra_link", "here.shm"},
                     {"inter_link", "here.tcp"},
                     {"profiles", json::array({{{"name", "here"}, {"file", "here.json"}}})}};
      doc["parallel"] = parallel;
      doc["training"]["threads"] = threads;
      writeFile(dir.filePath("c.json"), doc.dump());
      auto config = ms::loadRunConfig(dir.filePath("c.json").toStdString());
      if (!config) qFatal("%s", config.message().c_str());
      auto plan = ms::buildPlan(*config);
      if (!plan) qFatal("%s", plan.message().c_str());
      return std::move(*plan);
    };
    const auto p = parsed(synthProfile());
    const int T = 64, C = 64, F = 256;
    // Block 0 (layer 1) of one rank with the whole batch of 8: rows 512.
    const auto blockForward = [&](double mbs, int threads, int tp) {
      const double m = T * mbs;
      double t = p->gemmSeconds(ms::Precision::Fp32, threads, m, 3.0 * C / tp, C) +
                 p->gemmSeconds(ms::Precision::Fp32, threads, m, C, double(C) / tp) +
                 p->gemmSeconds(ms::Precision::Fp32, threads, m, double(F) / tp, C) +
                 p->gemmSeconds(ms::Precision::Fp32, threads, m, C, double(F) / tp);
      t += p->attentionForwardSeconds(ms::Precision::Fp32, threads, 2.0 * T * T * C * mbs / tp, T,
                                      double(C) / 4);
      t += 5 * p->elementwiseSeconds(threads, 4.0 * T * mbs * (10.0 * C + 2.0 * F / tp) / 5);  // 5 kernels
      return t;
    };
    {
      const ms::Plan plan = planFor(1, json{{"dp", 1}}, 0);  // 1 rank on 2 cores: 2 threads
      const ms::CostModel cost(plan);
      QNEAR(cost.layerTimes().forward[1], blockForward(8, 2, 1));
      // The optimizer step: the curve over the stage's parameters.
      QNEAR(cost.optimizerTime(0), p->optimizerSeconds(2, double(plan.model.paramCount())));
    }
    {
      const ms::Plan plan = planFor(4, json{{"dp", 4}}, 0);  // 4 ranks on 2 cores: 1 thread, half a core each
      const ms::CostModel cost(plan);
      QNEAR(cost.layerTimes().forward[1], 2.0 * blockForward(2, 1, 1));
      // The gradients' all-reduce over 4 ranks of the node: the shm curve at 4 ranks.
      QVERIFY(cost.gradSyncTime(0) > 0);
    }
    {
      const ms::Plan plan = planFor(2, json{{"tp", 2}}, 1);  // 2 ranks, 1 thread each, no oversubscription
      const ms::CostModel cost(plan);
      QNEAR(cost.layerTimes().forward[1], blockForward(8, 1, 2));
    }
    // The named kernels: the block's two LayerNorms and its GELU on their own curves, the two residual adds
    // (read 2C, write C each) left as elementwise passes.
    writeFile(dir.filePath("here.json"), withVectorKernels(synthProfile()).dump());
    {
      const ms::Plan plan = planFor(2, json{{"tp", 2}}, 1);
      const ms::CostModel cost(plan);
      const auto v = parsed(withVectorKernels(synthProfile()));
      const double m = T * 8.0;
      double expected = blockForward(8, 1, 2) - 5 * p->elementwiseSeconds(1, 4.0 * m * (10.0 * C + F) / 5);
      expected += 2 * v->elementwiseSeconds(1, 4.0 * m * 3 * C) +
                  2 * v->vectorKernelSeconds(ms::VectorKernel::LayerNorm, false, 1, m, C) +
                  v->vectorKernelSeconds(ms::VectorKernel::Gelu, false, 1, m, double(F) / 2);
      QNEAR(cost.layerTimes().forward[1], expected);
    }
    // Context parallelism: a block's attention on the ring-block curve at a block's keys (T / cp), the rest
    // of the block as without the table.
    {
      const auto plain = [&] {
        writeFile(dir.filePath("here.json"), synthProfile().dump());
        const ms::Plan plan = planFor(2, json{{"cp", 2}}, 1);
        return ms::CostModel(plan).layerTimes();
      }();
      writeFile(dir.filePath("here.json"), withRingAttention(synthProfile()).dump());
      const ms::Plan plan = planFor(2, json{{"cp", 2}}, 1);
      const ms::LayerTimes ring = ms::CostModel(plan).layerTimes();
      const auto q = parsed(withRingAttention(synthProfile()));
      // The rank's visible products: its 32 queries against the 64 keys, causal, 8 samples.
      const double flops = 2.0 * 2.0 * (T / 2) * T * C * 0.5 * 8;
      const double fused = p->attentionForwardSeconds(ms::Precision::Fp32, 1, flops, T, double(C) / 4);
      const double block =
          q->ringAttentionSeconds(false, ms::Precision::Fp32, 1, flops, T / 2, double(C) / 4);
      QVERIFY(block > 2 * fused);
      QNEAR(ring.forward[1] - plain.forward[1], block - fused);
      const double fusedBack = p->attentionBackwardSeconds(ms::Precision::Fp32, 1, flops, T, double(C) / 4);
      const double blockBack =
          q->ringAttentionSeconds(true, ms::Precision::Fp32, 1, flops, T / 2, double(C) / 4);
      QNEAR(ring.backwardInput[1] - plain.backwardInput[1], blockBack - fusedBack);
      QCOMPARE(ring.backwardWeight[1], plain.backwardWeight[1]);
    }
    // Llama's (out, in) weights (GemmShape::transposedWeight): the forward inp @ W^T is an NT GEMM, the input
    // gradient dout @ W an NN one, so on a profile with the backward ops the block's forward GEMMs take the
    // input-gradient curve (twice the forward's time in the synthetic profile) and its input gradients the
    // forward's; a gpt block's keep theirs.
    {
      const json llama = {{"type", "llama"}, {"layers", 2},       {"width", 64},  {"heads", 4},
                          {"kv_heads", 2},   {"ffn_hidden", 160}, {"vocab", 256}, {"context", 64}};
      const auto timesOn = [&](const json& profile, const json& model) {
        writeFile(dir.filePath("here.json"), profile.dump());
        const ms::Plan plan = planFor(1, json{{"dp", 1}}, 1, model);
        return ms::CostModel(plan).layerTimes();
      };
      const ms::LayerTimes plain = timesOn(synthProfile(), llama);
      const ms::LayerTimes ops = timesOn(withBackwardGemms(synthProfile()), llama);
      const double m = T * 8.0;
      double forward = 0;  // the block's forward GEMMs on the forward curve: q, k, v, o, gate, up, down
      for (const auto& [n, k] : std::vector<std::pair<double, double>>{
               {64, 64}, {32, 64}, {32, 64}, {64, 64}, {160, 64}, {160, 64}, {64, 160}})
        forward += p->gemmSeconds(ms::Precision::Fp32, 1, m, n, k);
      QNEAR(ops.forward[1] - plain.forward[1], forward);
      QVERIFY(std::abs(ops.backwardInput[1] - plain.backwardInput[1]) <= 1e-12 * plain.backwardInput[1]);
      const ms::LayerTimes gptPlain = timesOn(synthProfile(), json());
      const ms::LayerTimes gptOps = timesOn(withBackwardGemms(synthProfile()), json());
      QCOMPARE(gptOps.forward[1], gptPlain.forward[1]);
      QVERIFY(gptOps.backwardInput[1] > gptPlain.backwardInput[1]);
    }
    // The backward's GEMMs: each on its own op's curve at the forward's shape when the profile has them.
    writeFile(dir.filePath("here.json"), withBackwardGemms(synthProfile()).dump());
    {
      const ms::Plan plan = planFor(1, json{{"dp", 1}}, 1);
      const ms::CostModel cost(plan);
      const double m = T * 8.0;
      const auto q = parsed(withBackwardGemms(synthProfile()));
      const auto sum = [&](const ms::DeviceProfile& profile, ms::GemmOp op) {
        double t = 0;
        for (const auto& [n, k] :
             std::vector<std::pair<double, double>>{{3.0 * C, C}, {C, C}, {F, C}, {C, F}})
          t += profile.gemmSeconds(op, ms::Precision::Fp32, 1, m, n, k);
        return t;
      };
      // Every grid point of the synthetic weight gradient runs at 0.8 of the forward's rate, so its
      // interpolated (and edge-clamped) time is the forward's over 0.8 at every shape.
      double forward = 0;
      for (const auto& [n, k] : std::vector<std::pair<double, double>>{{3.0 * C, C}, {C, C}, {F, C}, {C, F}})
        forward += p->gemmSeconds(ms::Precision::Fp32, 1, m, n, k);
      QNEAR(sum(*q, ms::GemmOp::WeightGradient), forward / 0.8);
      QVERIFY(std::abs(sum(*q, ms::GemmOp::WeightGradient) / sum(*p, ms::GemmOp::WeightGradient) - 1) > 0.05);
      const double attention =
          p->attentionBackwardSeconds(ms::Precision::Fp32, 1, 2.0 * T * T * C * 8, T, double(C) / 4);
      const double elementwise = 2 * 5 * p->elementwiseSeconds(1, 4.0 * T * 8 * (10.0 * C + 2.0 * F) / 5);
      QNEAR(cost.layerTimes().backwardInput[1], sum(*q, ms::GemmOp::InputGradient) + attention + elementwise);
      QNEAR(cost.layerTimes().backwardWeight[1], sum(*q, ms::GemmOp::WeightGradient));
    }
  }
};

QTEST_GUILESS_MAIN(TestDeviceProfile)
#include "tst_device_profile.moc"
