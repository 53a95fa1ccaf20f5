// Tests of the hardware catalog and buildMesh(): every catalog entry has positive datasheet figures (a few
// checked exactly), lookups of unknown names fail, a mesh numbers its devices node-major and picks the
// intra- or inter-node link, a config's own device and link types resolve with their units converted, and
// every error names the field to fix.
#include <QtTest>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "plan/cost_model.h"
#include "plan/hardware.h"
#include "plan/plan.h"
#include "plan/run_config.h"
#include "plan/simulator.h"
#include "test_util.h"

using nlohmann::json;

namespace {

// A config with the given mesh section (gpt on text, everything else default).
json configWithMesh(const json& mesh) {
  json doc = json::parse(R"({"model":{"type":"gpt","layers":2,"width":64,"heads":2},
    "data":{"kind":"text","files":["a.txt"]}})");
  doc["mesh"] = mesh;
  return doc;
}

// The catalog H100's kernel model and its bf16 peak.
const ms::GpuKernelModel& h100Kernels() {
  static const std::optional<ms::DeviceSpec> d = ms::findDevice("h100-sxm-80gb");
  return *d->kernels;
}
constexpr double kH100Bf16 = 989.4e12, kH100Bandwidth = 3.35e12;

double h100Gemm(double m, double n, double k) {
  return h100Kernels().gemmSeconds(kH100Bf16, kH100Bandwidth, 2.0, m, n, k);
}

// A gpt (bf16, batch 8 of `seq` tokens, 8 microbatches) on one catalog H100.
ms::Expected<ms::Plan> oneGpuPlan(int layers, int width, int heads, int seq) {
  json doc = {
      {"version", 1},
      {"model",
       {{"type", "gpt"},
        {"layers", layers},
        {"width", width},
        {"heads", heads},
        {"vocab", 50304},
        {"context", seq}}},
      {"data", {{"kind", "tokens"}, {"train", json::array({"t.bin"})}, {"val", json::array({"v.bin"})}}},
      {"mesh",
       {{"nodes", json::array({{{"name", "n"}, {"device", "h100-sxm-80gb"}, {"count", 1}}})},
        {"intra_link", "nvlink"},
        {"inter_link", "infiniband"}}},
      {"parallel", {{"precision", "bf16"}, {"microbatches", 8}}},
      {"training", {{"batch_size", 8}, {"seq_len", seq}}}};
  ms::Expected<ms::RunConfig> config = ms::parseRunConfig(doc);
  if (!config) return config.status();
  return ms::buildPlan(*config);
}

// MFU of that plan's step, links free.
double oneGpuMfu(int layers, int width, int heads, int seq) {
  ms::Expected<ms::Plan> plan = oneGpuPlan(layers, width, heads, seq);
  if (!plan) return -1;
  const ms::CostModel cost(*plan, ms::Communication::Free);
  return ms::simulate(*plan, cost).mfu;
}

}  // namespace

class TestHardware : public QObject {
  Q_OBJECT

 private slots:
  void catalogHasEveryDevice_data() {
    QTest::addColumn<QString>("name");
    for (const char* n : {"cpu", "h100-sxm-80gb", "h200-141gb", "a100-40gb", "a100-80gb", "l40s", "rtx4090"})
      QTest::newRow(n) << QString(n);
  }

  void catalogHasEveryDevice() {
    QFETCH(QString, name);
    const auto d = ms::findDevice(name.toStdString());
    QVERIFY(d.has_value());
    QCOMPARE(d->name, name.toStdString());
    QVERIFY(!d->label.empty());
    QVERIFY(d->peakFlopsFp32 > 0);
    QVERIFY(d->peakFlopsBf16 > 0);
    QVERIFY(d->peakFlopsTf32 >= 0);
    QVERIFY(d->memoryBytes > 0);
    QVERIFY(d->memoryBandwidth > 0);
    QVERIFY(d->achievableFraction > 0 && d->achievableFraction <= 1);
    QCOMPARE(d->peakFlops(ms::Precision::Fp32), d->peakFlopsFp32);
    QCOMPARE(d->peakFlops(ms::Precision::Bf16), d->peakFlopsBf16);
    if (name != "cpu") QVERIFY(d->peakFlopsBf16 > d->peakFlopsFp32);  // tensor cores
  }

  void datasheetFigures_data() {
    QTest::addColumn<QString>("name");
    QTest::addColumn<double>("fp32");
    QTest::addColumn<double>("bf16");
    QTest::addColumn<double>("memory");
    QTest::addColumn<double>("bandwidth");
    QTest::newRow("h100") << "h100-sxm-80gb" << 66.9e12 << 989.4e12 << 85.017493504e9 << 3.35e12;
    QTest::newRow("h200") << "h200-141gb" << 66.9e12 << 989.4e12 << 150.10988032e9 << 4.8e12;
    QTest::newRow("a100-40gb") << "a100-40gb" << 19.5e12 << 312e12 << 40e9 << 1.555e12;
    QTest::newRow("a100-80gb") << "a100-80gb" << 19.5e12 << 312e12 << 80e9 << 2.039e12;
    QTest::newRow("l40s") << "l40s" << 91.6e12 << 362.05e12 << 48e9 << 864e9;
    QTest::newRow("rtx4090") << "rtx4090" << 82.6e12 << 165.2e12 << 24e9 << 1008e9;
  }

  void datasheetFigures() {
    QFETCH(QString, name);
    QFETCH(double, fp32);
    QFETCH(double, bf16);
    QFETCH(double, memory);
    QFETCH(double, bandwidth);
    const auto d = ms::findDevice(name.toStdString());
    QVERIFY(d.has_value());
    QCOMPARE(d->peakFlopsFp32, fp32);
    QCOMPARE(d->peakFlopsBf16, bf16);
    QCOMPARE(d->memoryBytes, memory);
    QCOMPARE(d->memoryBandwidth, bandwidth);
    QCOMPARE(d->achievableFraction, 0.5);
  }

  void h100Bf16Peak() {
    QCOMPARE(ms::findDevice("h100-sxm-80gb")->peakFlopsBf16, 989.4e12);
    QCOMPARE(ms::findDevice("h100-sxm-80gb")->peakFlopsTf32, 494.7e12);
    QCOMPARE(ms::findDevice("cpu")->achievableFraction, 0.7);
  }

  void catalogNamesAreUnique() {
    std::set<std::string> devices, links;
    for (const auto& d : ms::deviceCatalog()) QVERIFY2(devices.insert(d.name).second, d.name.c_str());
    for (const auto& l : ms::linkCatalog()) QVERIFY2(links.insert(l.name).second, l.name.c_str());
    QCOMPARE(devices.size(), size_t(7));
    QCOMPARE(links.size(), size_t(5));
    QCOMPARE(ms::deviceCatalog().front().name, std::string("cpu"));
  }

  void links_data() {
    QTest::addColumn<QString>("name");
    QTest::addColumn<double>("bandwidth");
    QTest::addColumn<double>("latency");
    QTest::newRow("shm") << "shm" << 10e9 << 1e-6;
    QTest::newRow("nvlink") << "nvlink" << 370e9 << 3e-6;
    QTest::newRow("pcie") << "pcie" << 64e9 << 5e-6;
    QTest::newRow("infiniband") << "infiniband" << 48e9 << 5e-6;
    QTest::newRow("ethernet") << "ethernet" << 12.5e9 << 2e-5;
  }

  void links() {
    QFETCH(QString, name);
    QFETCH(double, bandwidth);
    QFETCH(double, latency);
    const auto l = ms::findLink(name.toStdString());
    QVERIFY(l.has_value());
    QCOMPARE(l->name, name.toStdString());
    QCOMPARE(l->bandwidth, bandwidth);
    QCOMPARE(l->latency, latency);
  }

  void unknownNames() {
    QVERIFY(!ms::findDevice("tpu-v5").has_value());
    QVERIFY(!ms::findDevice("").has_value());
    QVERIFY(!ms::findDevice("H100-SXM-80GB").has_value());  // names are exact
    QVERIFY(!ms::findLink("tcp").has_value());
  }

  void meshIsNodeMajor() {
    ms::MeshConfig config;
    config.nodes = {{"a", "h100-sxm-80gb", 3}, {"b", "a100-80gb", 2}, {"c", "h100-sxm-80gb", 1}};
    config.intraLink = "nvlink";
    config.interLink = "infiniband";
    const auto mesh = ms::buildMesh(config);
    QVERIFY2(mesh.isOk(), mesh.message().c_str());
    QCOMPARE(mesh->nodes, (std::vector<std::string>{"a", "b", "c"}));
    QCOMPARE(mesh->deviceCount(), 6);
    const int nodes[] = {0, 0, 0, 1, 1, 2};
    const int locals[] = {0, 1, 2, 0, 1, 0};
    const char* types[] = {"h100-sxm-80gb", "h100-sxm-80gb", "h100-sxm-80gb",
                           "a100-80gb",     "a100-80gb",     "h100-sxm-80gb"};
    for (int i = 0; i < 6; ++i) {
      QCOMPARE(mesh->devices[i].index, i);
      QCOMPARE(mesh->devices[i].node, nodes[i]);
      QCOMPARE(mesh->devices[i].local, locals[i]);
      QCOMPARE(mesh->devices[i].spec.name, std::string(types[i]));
    }
    QCOMPARE(mesh->intraLink.name, std::string("nvlink"));
    QCOMPARE(mesh->interLink.name, std::string("infiniband"));
    QCOMPARE(mesh->linkBetween(0, 2).name, std::string("nvlink"));
    QCOMPARE(mesh->linkBetween(3, 4).name, std::string("nvlink"));
    QCOMPARE(mesh->linkBetween(2, 3).name, std::string("infiniband"));
    QCOMPARE(mesh->linkBetween(0, 5).bandwidth, 48e9);
  }

  void defaultMesh() {
    const auto mesh = ms::buildMesh(ms::MeshConfig{});
    QVERIFY2(mesh.isOk(), mesh.message().c_str());
    QCOMPARE(mesh->deviceCount(), 1);
    QCOMPARE(mesh->devices[0].spec.name, std::string("cpu"));
    QCOMPARE(mesh->intraLink.name, std::string("shm"));
    QCOMPARE(mesh->interLink.name, std::string("ethernet"));
  }

  void userDefinedTypes() {
    const json doc = configWithMesh(json::parse(R"({
      "nodes":[{"name":"x","device":"my-npu","count":2},{"name":"y","device":"l40s","count":2}],
      "intra_link":"fabric","inter_link":"roce",
      "device_types":[{"name":"my-npu","label":"My NPU","peak_tflops_fp32":50,"peak_tflops_bf16":400,
                       "memory_gb":96,"memory_bandwidth_gbs":2500,"achievable_fraction":0.4}],
      "link_types":[{"name":"fabric","bandwidth_gbs":200,"latency_us":2.5},
                    {"name":"roce","bandwidth_gbs":25,"latency_us":8}]})"));
    const auto config = ms::parseRunConfig(doc);
    QVERIFY2(config.isOk(), config.message().c_str());
    QCOMPARE(config->mesh.deviceTypes.size(), size_t(1));
    QCOMPARE(config->mesh.linkTypes.size(), size_t(2));
    const auto mesh = ms::buildMesh(config->mesh);
    QVERIFY2(mesh.isOk(), mesh.message().c_str());
    QCOMPARE(mesh->deviceCount(), 4);
    const ms::DeviceSpec& npu = mesh->devices[1].spec;
    QCOMPARE(npu.name, std::string("my-npu"));
    QCOMPARE(npu.label, std::string("My NPU"));
    QCOMPARE(npu.peakFlopsFp32, 50e12);
    QCOMPARE(npu.peakFlopsBf16, 400e12);
    QCOMPARE(npu.peakFlopsTf32, 0.0);
    QCOMPARE(npu.memoryBytes, 96e9);
    QCOMPARE(npu.memoryBandwidth, 2500e9);
    QCOMPARE(npu.achievableFraction, 0.4);
    QCOMPARE(mesh->devices[2].spec.name, std::string("l40s"));
    QCOMPARE(mesh->intraLink.name, std::string("fabric"));
    QCOMPARE(mesh->intraLink.bandwidth, 200e9);
    QCOMPARE(mesh->intraLink.latency, 2.5e-6);
    QCOMPARE(mesh->linkBetween(1, 2).name, std::string("roce"));
    QCOMPARE(mesh->linkBetween(1, 2).latency, 8e-6);
    QCOMPARE(ms::deviceTypeNames(config->mesh).back(), std::string("my-npu"));
    QCOMPARE(ms::linkTypeNames(config->mesh).size(), size_t(7));
  }

  void userTypeDefaults() {
    ms::DeviceTypeConfig t{"npu", "", 10, 20, 16, 500};
    const ms::DeviceSpec s = ms::toDeviceSpec(t);
    QCOMPARE(s.label, std::string("npu"));  // an empty label shows the name
    QCOMPARE(s.achievableFraction, 0.5);
    QCOMPARE(ms::toLinkSpec({"l", 1.5, 0}).bandwidth, 1.5e9);
    QCOMPARE(ms::toLinkSpec({"l", 1.5, 0}).latency, 0.0);
  }

  // buildMesh() on a MeshConfig that never went through validation (the studio edits structs directly).
  void errorsNameTheField_data() {
    QTest::addColumn<int>("index");
    QTest::addColumn<QString>("expected");
    QTest::newRow("unknown device") << 0 << "/mesh/nodes/1/device: \"h100\" is not one of";
    QTest::newRow("did you mean") << 0 << "did you mean \"h100-sxm-80gb\"?";
    QTest::newRow("unknown intra link") << 1 << "/mesh/intra_link: \"nvlnk\" is not one of";
    QTest::newRow("link did you mean") << 1 << "did you mean \"nvlink\"?";
    QTest::newRow("unknown inter link") << 2 << "/mesh/inter_link: \"tcp\" is not one of \"shm\"";
    QTest::newRow("count") << 3 << "/mesh/nodes/0/count: must be >= 1, got 0";
    QTest::newRow("no nodes") << 4 << "/mesh/nodes: needs at least 1 entry";
    QTest::newRow("own device figure") << 5 << "/mesh/device_types/0/memory_gb: must be > 0, got 0";
    QTest::newRow("own link figure") << 6 << "/mesh/link_types/0/bandwidth_gbs: must be > 0, got -1";
    QTest::newRow("own type offered") << 7
                                      << "\"cpu\", \"h100-sxm-80gb\", \"h200-141gb\", \"a100-40gb\", "
                                         "\"a100-80gb\", \"l40s\", \"rtx4090\", \"npu\"";
  }

  void errorsNameTheField() {
    QFETCH(int, index);
    QFETCH(QString, expected);
    ms::MeshConfig config;
    config.nodes = {{"a", "cpu", 2}, {"b", "cpu", 2}};
    switch (index) {
      case 0:
        config.nodes[1].device = "h100";
        break;
      case 1:
        config.intraLink = "nvlnk";
        break;
      case 2:
        config.interLink = "tcp";
        break;
      case 3:
        config.nodes[0].count = 0;
        break;
      case 4:
        config.nodes.clear();
        break;
      case 5:
        config.deviceTypes = {{"npu", "", 10, 20, 0, 500}};
        break;
      case 6:
        config.linkTypes = {{"l", -1, 0}};
        break;
      case 7:
        config.deviceTypes = {{"npu", "", 10, 20, 16, 500}};
        config.nodes[0].device = "tpu";
        break;
    }
    const auto mesh = ms::buildMesh(config);
    QVERIFY(!mesh.isOk());
    QVERIFY2(mesh.message().find(expected.toStdString()) != std::string::npos, mesh.message().c_str());
  }

  void everyErrorIsReported() {
    ms::MeshConfig config;
    config.nodes = {{"a", "gpu", 1}, {"b", "cpu", 0}};
    config.interLink = "tcp";
    const auto mesh = ms::buildMesh(config);
    QVERIFY(!mesh.isOk());
    const QStringList lines = QString::fromStdString(mesh.message()).split('\n');
    QCOMPARE(lines.size(), 3);
    QVERIFY(lines[0].startsWith("/mesh/nodes/0/device: "));
    QVERIFY(lines[1].startsWith("/mesh/nodes/1/count: "));
    QVERIFY(lines[2].startsWith("/mesh/inter_link: "));
  }

  // --- the catalog GPUs' kernel model (plan/gpu_kernel_model.h) ---

  void everyCatalogGpuHasAKernelModel() {
    for (const ms::DeviceSpec& d : ms::deviceCatalog()) {
      if (d.name == "cpu") {
        QVERIFY(!d.kernels);
        continue;
      }
      QVERIFY2(d.kernels, d.name.c_str());
      QVERIFY(d.kernels->sms >= 100 && d.kernels->gemmEfficiency > 0.5 && d.kernels->gemmEfficiency < 1);
      QVERIFY(d.kernels->attentionShort < d.kernels->attentionLong);
    }
    QCOMPARE(ms::findDevice("h100-sxm-80gb")->kernels->sms, 132);
    QCOMPARE(ms::findDevice("a100-80gb")->kernels->sms, 108);
    QCOMPARE(ms::findDevice("h100-sxm-80gb")->kernels->gemmEfficiency, 792.1 / 989.0);  // the MAMF table's
    // A config's own type keeps its one fraction.
    ms::DeviceTypeConfig own;
    own.name = "npu";
    QVERIFY(!ms::toDeviceSpec(own).kernels);
  }

  void gemmByWavesAndTiles() {
    const double rate = 792.1 / 989.0 * kH100Bf16;
    // 12 x 11 tiles of 256 x 128: one full wave on 132 SMs runs at the achievable rate exactly.
    const double m = 256 * 12, n = 128 * 11, k = 8192;
    const double full = h100Gemm(m, n, k);
    QVERIFY(std::abs(full - 2 * m * n * k / rate) <= 1e-12 * full);
    // One row more: 13 x 11 tiles (or 25 x 6 of 128 x 256) would need a second wave, twice the time; 25 x 11
    // tiles of 128 x 128, each half the work, take three waves: 1.5x the time for 0.03% more work.
    QVERIFY(std::abs(h100Gemm(m + 1, n, k) - 1.5 * full) <= 1e-12 * full);
    // A small output splits k over the idle SMs: 768 x 768 (36 tiles of 128 x 128) over 8192 rows of tokens,
    // 3 slices of 2731 in one wave, far faster than 36 SMs alone but slower than the achievable rate.
    const double dw = h100Gemm(768, 768, 8192);
    QVERIFY(dw < 2 * 128 * 128 * 8192 / (rate / 132) / 2);
    QVERIFY(dw > 2.0 * 768 * 768 * 8192 / rate);
    // Never faster than the achievable rate, never below the shortest kernel, a tiny GEMM at that floor.
    for (double a : {1.0, 77.0, 1000.0, 4096.0, 12288.0})
      for (double b : {1.0, 300.0, 5000.0, 50304.0})
        for (double c : {64.0, 768.0, 16384.0}) {
          const double t = h100Gemm(a, b, c);
          QVERIFY(t >= 2 * a * b * c / rate * (1 - 1e-12));
          QVERIFY(t >= 2e-6 && std::isfinite(t));
        }
    QCOMPARE(h100Gemm(1, 1, 1), 2e-6);
    // Memory-bound: a matrix-vector product moves its matrix at the elementwise bandwidth.
    const double gemv = h100Gemm(1, 16384, 16384);
    QVERIFY(std::abs(gemv - 2.0 * (16384.0 + 16384.0 * 16384 + 16384) / (kH100Bandwidth * 2.926 / 3.35)) <=
            1e-9 * gemv);
  }

  // The model against the GEMMs PyTorch ran on an H100 (docs/gpu-logs/2026-11-26b-h100-profile-torch.txt:
  // GPT-2 124M in bf16, batch 8 x 1024, per-kernel times of one training step): the GEMM kernels' time summed
  // from the log against the model's for the step's 147 GEMMs (12 blocks x 4 x forward and two gradients, and
  // the LM head's three).
  void gemmModelMatchesPyTorchOnH100() {
    std::ifstream log(std::string(MS_SOURCE_DIR) + "/docs/gpu-logs/2026-11-26b-h100-profile-torch.txt");
    QVERIFY(log.good());
    double measuredMs = 0, launches = 0;
    std::string line;
    while (std::getline(log, line)) {
      if (line.find("nvjet") == std::string::npos && line.find("splitKreduce") == std::string::npos) continue;
      std::istringstream fields(line);
      double ms = 0, launchesHere = 0;
      std::string share;
      fields >> ms >> share >> launchesHere;
      measuredMs += ms;
      launches += launchesHere;
    }
    QCOMPARE(launches, 147.0);
    const double M = 8 * 1024, C = 768, F = 4 * C, V = 50304;
    double predicted = 0;
    for (const auto& [n, k] : {std::pair{3 * C, C}, {C, C}, {F, C}, {C, F}})
      predicted += 12 * (h100Gemm(M, n, k) + h100Gemm(M, k, n) + h100Gemm(k, n, M));
    predicted += h100Gemm(M, V, C) + h100Gemm(M, C, V) + h100Gemm(C, V, M);
    const double ratio = predicted * 1e3 / measuredMs;
    qInfo("GEMMs of one step: predicted %.3f ms, PyTorch on an H100 %.3f ms (x%.3f)", predicted * 1e3,
          measuredMs, ratio);
    QVERIFY2(ratio > 0.9 && ratio < 1.1, qPrintable(QString::number(ratio)));
  }

  // Small and large models costed alike, by their shapes: a GPT-3-sized layer runs near the achievable matmul
  // rate, a tiny model's kernels mostly wait on their fixed cost.
  void mfuGrowsWithTheModel() {
    const double large = oneGpuMfu(2, 12288, 96, 2048);
    const double small = oneGpuMfu(2, 256, 4, 256);
    qInfo("MFU on one H100, links free: 2 x 12288 %.3f, 2 x 256 %.3f", large, small);
    QVERIFY2(large > 0.55 && large < 792.1 / 989.0, qPrintable(QString::number(large)));
    QVERIFY2(small > 0 && small < 0.1, qPrintable(QString::number(small)));
  }

  // A layer's forward kernel by kernel (cost_model.h layerForwardKernels): a block's four GEMMs, its
  // attention and its elementwise passes, summing to the cost model's forward; none for a device costed from
  // FLOPs.
  void layerForwardKernelsSumToTheForward() {
    ms::Expected<ms::Plan> plan = oneGpuPlan(2, 4096, 32, 2048);
    QVERIFY2(plan.isOk(), plan.isOk() ? "" : plan.message().c_str());
    const int block = 1;
    QCOMPARE(plan->model.layers[block].name, std::string("block.0"));
    const std::vector<ms::KernelCost> kernels = ms::layerForwardKernels(*plan, block);
    QCOMPARE(kernels.size(), size_t(6));
    QCOMPARE(kernels[0].what, std::string("GEMM 2048 x 12288 x 4096"));  // q|k|v, one sample of 2048 tokens
    QCOMPARE(kernels[4].what, std::string("attention"));
    QCOMPARE(kernels[5].what, std::string("5 elementwise passes"));
    double sum = 0;
    for (const ms::KernelCost& k : kernels) {
      sum += k.seconds;
      QVERIFY(k.fractionOfPeak >= 0 && k.fractionOfPeak <= 792.1 / 989.0 + 1e-12);
    }
    QVERIFY(kernels[0].fractionOfPeak > 0.7);  // 16 x 96 tiles of 128 x 128: 1536 of 1584 slots
    QCOMPARE(kernels[5].flops, 0.0);
    const ms::CostModel cost(*plan, ms::Communication::Free);
    QVERIFY(std::abs(sum - cost.layerTimes().forward[block]) <= 1e-12 * sum);
    QVERIFY(ms::layerForwardKernels(*plan, 99).empty());
    // The same model on a config's own device type: costed from FLOPs, no kernels.
    json doc = {
        {"version", 1},
        {"model", {{"type", "gpt"}, {"layers", 2}, {"width", 64}, {"heads", 4}, {"vocab", 256}}},
        {"data", {{"kind", "tokens"}, {"train", json::array({"t.bin"})}, {"val", json::array({"v.bin"})}}},
        {"mesh",
         {{"nodes", json::array({{{"name", "n"}, {"device", "h100-sxm-80gb"}, {"count", 1}}})},
          {"intra_link", "nvlink"},
          {"inter_link", "infiniband"}}},
        {"training", {{"batch_size", 8}, {"seq_len", 64}}}};
    ms::test::useFlatH100(doc);
    ms::Expected<ms::RunConfig> config = ms::parseRunConfig(doc);
    QVERIFY2(config.isOk(), config.isOk() ? "" : config.message().c_str());
    ms::Expected<ms::Plan> flat = ms::buildPlan(*config);
    QVERIFY2(flat.isOk(), flat.isOk() ? "" : flat.message().c_str());
    QVERIFY(ms::layerForwardKernels(*flat, 1).empty());
  }
};

QTEST_APPLESS_MAIN(TestHardware)

#include "tst_hardware.moc"
