// Tests of the hardware catalog and buildMesh(): every catalog entry has positive datasheet figures (a few
// checked exactly), lookups of unknown names fail, a mesh numbers its devices node-major and picks the
// intra- or inter-node link, a config's own device and link types resolve with their units converted, and
// every error names the field to fix.
#include <QtTest>

#include <set>

#include "plan/hardware.h"

using nlohmann::json;

namespace {

// A config with the given mesh section (gpt on text, everything else default).
json configWithMesh(const json& mesh) {
  json doc = json::parse(R"({"model":{"type":"gpt","layers":2,"width":64,"heads":2},
    "data":{"kind":"text","files":["a.txt"]}})");
  doc["mesh"] = mesh;
  return doc;
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
    QTest::newRow("nvlink") << "nvlink" << 450e9 << 3e-6;
    QTest::newRow("pcie") << "pcie" << 64e9 << 5e-6;
    QTest::newRow("infiniband") << "infiniband" << 50e9 << 5e-6;
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
    QCOMPARE(mesh->linkBetween(0, 5).bandwidth, 50e9);
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
};

QTEST_APPLESS_MAIN(TestHardware)

#include "tst_hardware.moc"
