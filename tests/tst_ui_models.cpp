// The studio's plan-editing models without widgets: LayerModel and MeshModel under QAbstractItemModelTester
// (on example projects, through edits and undo), the mesh canvas geometry (tile rectangles and hit tests
// on centres, corners, gaps and outside), the mesh edit functions, and placeLayers() (a boundary layer
// moved, a second range making interleaved chunks, refusals).
#include <QtTest>

#include <QAbstractItemModelTester>
#include <QMimeData>

#include "plan/model_spec.h"
#include "plan/run_config.h"
#include "test_util.h"
#include "ui/models/layer_model.h"
#include "ui/models/mesh_geometry.h"
#include "ui/models/mesh_model.h"
#include "ui/models/placement.h"
#include "ui/models/project_document.h"
#include "ui/models/units.h"

using ms::LayerModel;
using ms::MeshGeometry;
using ms::MeshModel;
using ms::ProjectDocument;
using ms::RunConfig;

Q_DECLARE_METATYPE(std::vector<int>)

namespace {

// gpt with 4 blocks (6 layers: embedding, block.0-3, head) on one node of 8 H100s; pp = 2, tp = 2.
RunConfig smallConfig() {
  nlohmann::json j = ms::test::smallGpuPlanConfig("ui-models", 4, 16);
  j["parallel"] = {{"dp", 1}, {"tp", 2}, {"pp", 2}, {"microbatches", 4}};
  auto c = ms::parseRunConfig(j);
  if (!c) qFatal("%s", c.message().c_str());
  return *c;
}

RunConfig example(const char* name) {
  auto c = ms::loadRunConfig(std::string(MS_SOURCE_DIR "/resources/examples/") + name);
  if (!c) qFatal("%s", c.message().c_str());
  return *c;
}

ms::MeshGeometryParams testParams(int nodeColumns = 0) {
  ms::MeshGeometryParams p;
  p.tile = QSizeF(100, 50);
  p.tileGap = 10;
  p.nodePadding = 5;
  p.nodeHeader = 20;
  p.nodeGap = 30;
  p.nodeColumns = nodeColumns;
  return p;
}

}  // namespace

class TestUiModels : public QObject {
  Q_OBJECT
 private slots:
  void layerModelOnExample() {
    ProjectDocument doc;
    doc.reset(example("gpt-fortunes.json"));
    LayerModel model(&doc);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    const ms::ModelSpec spec = ms::buildModelSpec(doc.config().model, doc.config().training.seqLen);
    QCOMPARE(model.rowCount(), 6);
    QCOMPARE(model.columnCount(), int(LayerModel::NUM_COLUMNS));
    QCOMPARE(model.index(0, LayerModel::Layer).data().toString(), QString("embedding"));
    QCOMPARE(model.index(5, LayerModel::Layer).data().toString(), QString("head"));
    QCOMPARE(model.index(2, 0).data(LayerModel::ParamCountRole).toLongLong(), spec.layers[2].paramCount());
    QCOMPARE(model.index(1, LayerModel::ForwardGflop).data().toString().toDouble(),
             std::round(spec.layers[1].forwardFlopsPerSample / 1e9 * 1e4) / 1e4);
    // One stage: every layer on stage 0, chunk 0.
    for (int r = 0; r < model.rowCount(); ++r) QCOMPARE(model.index(r, LayerModel::Stage).data().toInt(), 0);
    QVERIFY(model.flags(model.index(0, 0)) & Qt::ItemIsDragEnabled);
    QCOMPARE(model.mimeTypes(), QStringList{"application/x-meshstudio-layers"});
  }

  void layerModelFollowsEditsAndUndo() {
    ProjectDocument doc;
    doc.reset(smallConfig());
    LayerModel model(&doc);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QSignalSpy resets(&model, &QAbstractItemModel::modelReset);
    const auto stages = [&] {
      std::vector<int> s;
      for (int r = 0; r < model.rowCount(); ++r)
        s.push_back(model.index(r, LayerModel::Stage).data().toInt());
      return s;
    };
    QCOMPARE(stages(), (std::vector<int>{0, 0, 0, 1, 1, 1}));
    doc.edit("pp 3", [](RunConfig& c) { c.parallel.pp = 3; });
    QCOMPARE(resets.count(), 1);
    QCOMPARE(stages(), (std::vector<int>{0, 0, 1, 1, 2, 2}));
    auto placed = ms::placeLayers(doc.config(), 2, 2, 0);
    QVERIFY2(placed.isOk(), placed.message().c_str());
    doc.setConfig("place", *placed);
    QCOMPARE(stages(), (std::vector<int>{0, 0, 0, 1, 2, 2}));
    doc.undoStack()->undo();
    QCOMPARE(stages(), (std::vector<int>{0, 0, 1, 1, 2, 2}));
    doc.undoStack()->undo();
    QCOMPARE(stages(), (std::vector<int>{0, 0, 0, 1, 1, 1}));
    // pp larger than the layers: no partition, so no stages, and the model says why.
    doc.edit("pp 7", [](RunConfig& c) { c.parallel.pp = 7; });
    QCOMPARE(model.rowCount(), 6);
    QVERIFY(!model.index(0, LayerModel::Stage).data().isValid());
    QCOMPARE(model.index(0, 0).data(LayerModel::StageRole).toInt(), -1);
    QVERIFY2(model.status().contains("pp"), qPrintable(model.status()));
  }

  void layerModelInvalidModelHasNoRows() {
    ProjectDocument doc;
    doc.reset(smallConfig());
    LayerModel model(&doc);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    doc.edit("no layers", [](RunConfig& c) { c.model.layers = 0; });
    QCOMPARE(model.rowCount(), 0);
    QVERIFY2(model.status().contains("/model/layers"), qPrintable(model.status()));
    doc.undoStack()->undo();
    QCOMPARE(model.rowCount(), 6);
  }

  void layerMime_data() {
    QTest::addColumn<QList<int>>("rows");
    QTest::addColumn<int>("first");
    QTest::addColumn<int>("last");
    QTest::newRow("one") << QList<int>{3} << 3 << 3;
    QTest::newRow("range") << QList<int>{1, 2, 3} << 1 << 3;
    QTest::newRow("reversed selection") << QList<int>{4, 2, 3} << 2 << 4;
    QTest::newRow("non-contiguous: min..max") << QList<int>{5, 1} << 1 << 5;
  }

  void layerMime() {
    QFETCH(QList<int>, rows);
    QFETCH(int, first);
    QFETCH(int, last);
    ProjectDocument doc;
    doc.reset(smallConfig());
    LayerModel model(&doc);
    QModelIndexList indexes;
    for (int r : rows)
      for (int c = 0; c < model.columnCount(); ++c) indexes << model.index(r, c);
    std::unique_ptr<QMimeData> mime(model.mimeData(indexes));
    QVERIFY(mime);
    QVERIFY(mime->hasFormat(LayerModel::mimeType()));
    const auto range = LayerModel::decodeLayerRange(mime->data(LayerModel::mimeType()));
    QVERIFY(range.has_value());
    QCOMPARE(range->first, first);
    QCOMPARE(range->second, last);
  }

  void layerMimeRejectsGarbage() {
    QVERIFY(!LayerModel::decodeLayerRange(QByteArray()).has_value());
    QVERIFY(!LayerModel::decodeLayerRange(QByteArray("hello, world")).has_value());
    QVERIFY(!LayerModel::decodeLayerRange(LayerModel::encodeLayerRange(3, 1)).has_value());
    QVERIFY(!LayerModel::decodeLayerRange(LayerModel::encodeLayerRange(-1, 2)).has_value());
    QVERIFY(!LayerModel::decodeLayerRange(LayerModel::encodeLayerRange(1, 2) + "x").has_value());
    const auto ok = LayerModel::decodeLayerRange(LayerModel::encodeLayerRange(0, 97));
    QVERIFY(ok.has_value());
    QCOMPARE(ok->second, 97);
  }

  void shortLayerNames_data() {
    QTest::addColumn<QStringList>("names");
    QTest::addColumn<QString>("expected");
    QTest::newRow("emb and blocks") << QStringList{"embedding", "block.0", "block.1", "block.2", "block.3"}
                                    << "emb, b0-b3";
    QTest::newRow("one block and head") << QStringList{"block.7", "head"} << "b7, head";
    QTest::newRow("gap") << QStringList{"block.1", "block.2", "block.5"} << "b1-b2, b5";
    QTest::newRow("empty") << QStringList{} << "";
  }

  void shortLayerNames() {
    QFETCH(QStringList, names);
    QFETCH(QString, expected);
    std::vector<std::string> v;
    for (const QString& n : names) v.push_back(n.toStdString());
    QCOMPARE(ms::shortLayerNames(v), expected);
  }

  void meshModelOnExamples_data() {
    QTest::addColumn<QString>("file");
    QTest::addColumn<int>("nodes");
    QTest::addColumn<int>("devicesOfFirst");
    QTest::newRow("gpt-fortunes") << "gpt-fortunes.json" << 1 << 1;
    QTest::newRow("gpt3-175b") << "gpt3-175b-plan.json" << 128 << 8;
  }

  void meshModelOnExamples() {
    QFETCH(QString, file);
    QFETCH(int, nodes);
    QFETCH(int, devicesOfFirst);
    ProjectDocument doc;
    doc.reset(example(file.toLatin1().constData()));
    MeshModel model(&doc);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QCOMPARE(model.rowCount(), nodes);
    const QModelIndex first = model.index(0, 0);
    QCOMPARE(model.rowCount(first), devicesOfFirst);
    QCOMPARE(model.index(0, MeshModel::Devices).data().toInt(), devicesOfFirst);
    // The last device of the last node: global index nodes * devices - 1, rank the same (world = devices).
    const QModelIndex lastNode = model.index(nodes - 1, 0);
    const QModelIndex lastDevice = model.index(model.rowCount(lastNode) - 1, MeshModel::Rank, lastNode);
    QCOMPARE(lastDevice.data(MeshModel::DeviceIndexRole).toInt(), nodes * devicesOfFirst - 1);
    QCOMPARE(lastDevice.data().toString(), QString::number(nodes * devicesOfFirst - 1));
    QCOMPARE(lastDevice.parent(), lastNode);
    if (nodes == 128) {  // gpt3: dp 16, tp 8, pp 8: rank 1023 is stage 7, tp 7, dp 15
      QCOMPARE(model.index(7, MeshModel::Coordinates, lastNode).data().toString(),
               QString("stage 7 · tp 7 · dp 15"));
      QCOMPARE(model.index(0, 0, model.index(16, 0)).data(MeshModel::StageRole).toInt(), 1);  // rank 128
    }
  }

  void meshModelEditsAndUndo() {
    ProjectDocument doc;
    doc.reset(smallConfig());  // one node "n0" of 8 H100s; 4 ranks, devices 4-7 idle
    MeshModel model(&doc);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    const QModelIndex n0 = model.index(0, 0);
    QCOMPARE(model.index(5, MeshModel::Rank, n0).data().toString(), QString("idle"));
    QCOMPARE(model.index(3, MeshModel::Coordinates, n0).data().toString(), QString("stage 1 · tp 1 · dp 0"));

    // Add a node (structural: reset), then change tp (same rows: data only).
    MeshModel* m = &model;
    QSignalSpy resets(m, &QAbstractItemModel::modelReset);
    QSignalSpy changes(m, &QAbstractItemModel::dataChanged);
    ms::MeshConfig mesh = doc.config().mesh;
    QVERIFY(ms::addNode(mesh).isOk());
    doc.edit("add node", [&](RunConfig& c) { c.mesh = mesh; });
    QCOMPARE(model.rowCount(), 2);
    QCOMPARE(model.index(1, MeshModel::Name).data().toString(), QString("n1"));
    QCOMPARE(model.rowCount(model.index(1, 0)), 8);
    QCOMPARE(resets.count(), 1);
    doc.edit("tp 4", [](RunConfig& c) { c.parallel.tp = 4; });
    QCOMPARE(resets.count(), 1);
    QVERIFY(changes.count() > 0);
    QCOMPARE(model.index(5, MeshModel::Coordinates, model.index(0, 0)).data().toString(),
             QString("stage 1 · tp 1 · dp 0"));
    doc.undoStack()->undo();
    doc.undoStack()->undo();
    QCOMPARE(model.rowCount(), 1);
    QCOMPARE(doc.config(), smallConfig());

    // setData: through the document (undoable), refusing bad values.
    QVERIFY(model.setData(model.index(0, MeshModel::Name), "gpu-box"));
    QCOMPARE(doc.config().mesh.nodes[0].name, std::string("gpu-box"));
    QVERIFY(model.setData(model.index(0, MeshModel::DeviceType), "a100-80gb"));
    QCOMPARE(doc.config().mesh.nodes[0].device, std::string("a100-80gb"));
    QVERIFY(model.setData(model.index(0, MeshModel::Devices), 4));
    QCOMPARE(model.rowCount(model.index(0, 0)), 4);
    const int steps = doc.undoStack()->count();
    QVERIFY(!model.setData(model.index(0, MeshModel::Name), ""));
    QVERIFY(!model.setData(model.index(0, MeshModel::DeviceType), "tpu-v9"));
    QVERIFY2(model.lastError().contains("tpu-v9"), qPrintable(model.lastError()));
    QVERIFY(!model.setData(model.index(0, MeshModel::Devices), 0));
    QVERIFY(!model.setData(model.index(0, MeshModel::Devices), "many"));
    QVERIFY(!model.setData(model.index(0, 0, model.index(0, 0)), "device rows are not editable"));
    QCOMPARE(doc.undoStack()->count(), steps);
    QCOMPARE(doc.config().mesh.nodes[0].count, 4);
    doc.undoStack()->undo();
    doc.undoStack()->undo();
    doc.undoStack()->undo();
    QCOMPARE(doc.config(), smallConfig());
  }

  void meshEditFunctions() {
    ms::MeshConfig mesh;
    mesh.nodes = {{"node000", "h100-sxm-80gb", 8}, {"node001", "h100-sxm-80gb", 8}};
    QCOMPARE(ms::uniqueNodeName(mesh, "node001"), std::string("node002"));
    QCOMPARE(ms::uniqueNodeName(mesh, "gpu"), std::string("gpu-1"));
    QVERIFY(ms::duplicateNode(mesh, 0).isOk());
    QCOMPARE(mesh.nodes.size(), size_t(3));
    QCOMPARE(mesh.nodes[1].name, std::string("node002"));  // inserted right after node000
    QCOMPARE(mesh.nodes[1].count, 8);
    QVERIFY(ms::removeDevice(mesh, 9).isOk());  // device 9 is in node002 (devices 8-15)
    QCOMPARE(mesh.nodes[1].count, 7);
    QVERIFY(!ms::removeDevice(mesh, 23).isOk());  // 8 + 7 + 8 = 23 devices: 0..22
    QVERIFY(!ms::removeNode(mesh, 5).isOk());
    QVERIFY(!ms::setNodeCount(mesh, 0, 0).isOk());
    QVERIFY(!ms::renameNode(mesh, 0, "node001").isOk());
    ms::DeviceTypeConfig t{"my-gpu", "", 50, 400, 96, 3000, 0.5};
    QVERIFY(ms::addDeviceType(mesh, t).isOk());
    QVERIFY(!ms::addDeviceType(mesh, t).isOk());  // duplicate
    t.name = "a100-80gb";
    QVERIFY(!ms::addDeviceType(mesh, t).isOk());  // a catalog name
    t.name = "bad name";
    QVERIFY(!ms::addDeviceType(mesh, t).isOk());
    t.name = "zero";
    t.memoryGb = 0;
    QVERIFY(!ms::addDeviceType(mesh, t).isOk());
    QVERIFY(ms::setNodeDeviceType(mesh, 2, "my-gpu").isOk());
    QVERIFY(ms::addLinkType(mesh, {"roce", 25, 8}).isOk());
    QVERIFY(ms::setLink(mesh, false, "roce").isOk());
    QVERIFY(!ms::setLink(mesh, true, "carrier-pigeon").isOk());
    QCOMPARE(mesh.interLink, std::string("roce"));
    // The result is a mesh the plan library accepts.
    auto built = ms::buildMesh(mesh);
    QVERIFY2(built.isOk(), built.message().c_str());
    QCOMPARE(built->deviceCount(), 23);
    QCOMPARE(built->devices[22].spec.name, std::string("my-gpu"));
    // A single node cannot lose its last device or itself.
    ms::MeshConfig one;
    one.nodes = {{"solo", "cpu", 1}};
    QVERIFY(!ms::removeDevice(one, 0).isOk());
    QVERIFY(!ms::removeNode(one, 0).isOk());
  }

  // One convention for every figure: memory in binary units with three significant digits, counts with
  // SI prefixes, durations in s, ms or µs; unknown figures as a dash, never "nan".
  void unitsFormat_data() {
    QTest::addColumn<QString>("kind");
    QTest::addColumn<double>("value");
    QTest::addColumn<QString>("text");
    constexpr double kKiB = 1024, kMiB = 1024 * kKiB, kGiB = 1024 * kMiB;
    QTest::newRow("bytes: 80 GB datasheet") << "bytes" << 80e9 << "74.5 GiB";
    QTest::newRow("bytes: 24 GiB") << "bytes" << 24 * kGiB << "24.0 GiB";
    QTest::newRow("bytes: 114 MiB") << "bytes" << 114.2 * kMiB << "114 MiB";
    QTest::newRow("bytes: 1023.9 MiB rounds up a unit") << "bytes" << 1023.9 * kMiB << "1.00 GiB";
    QTest::newRow("bytes: 2.9 TiB") << "bytes" << 2.9 * 1024 * kGiB << "2.90 TiB";
    QTest::newRow("bytes: under a KiB") << "bytes" << 512.0 << "0.50 KiB";
    QTest::newRow("bytes: nan") << "bytes" << std::nan("") << "–";
    QTest::newRow("bytes: negative") << "bytes" << -1.0 << "–";
    QTest::newRow("si: tokens/s") << "si" << 234340.0 << "234 k";
    QTest::newRow("si: millions") << "si" << 2926926.0 << "2.93 M";
    QTest::newRow("si: small integer") << "si" << 812.0 << "812";
    QTest::newRow("si: fraction") << "si" << 0.25 << "0.25";
    QTest::newRow("si: rounds into the next prefix") << "si" << 999600.0 << "1.00 M";
    QTest::newRow("seconds: step") << "seconds" << 13.4238 << "13.4 s";
    QTest::newRow("seconds: ms") << "seconds" << 0.156 << "156 ms";
    QTest::newRow("seconds: µs") << "seconds" << 35e-6 << "35.0 µs";
    QTest::newRow("percent") << "percent" << 0.246 << "24.6%";
  }

  void unitsFormat() {
    QFETCH(QString, kind);
    QFETCH(double, value);
    QFETCH(QString, text);
    const QString got = kind == "bytes"     ? ms::formatBytes(value)
                        : kind == "si"      ? ms::formatSi(value)
                        : kind == "seconds" ? ms::formatSeconds(value)
                                            : ms::formatPercent(value);
    QCOMPARE(got, text);
  }

  void byteUnitChoice() {
    QCOMPARE(ms::byteUnitFor(500).name, QString("KiB"));
    QCOMPARE(ms::byteUnitFor(3.0 * 1024 * 1024).name, QString("MiB"));
    QCOMPARE(ms::byteUnitFor(80e9).name, QString("GiB"));
    QCOMPARE(ms::byteUnitFor(80e9).bytes, 1024.0 * 1024 * 1024);
    QCOMPARE(ms::formatBytesIn(1.5 * 1024 * 1024 * 1024, ms::byteUnitFor(80e9), 2), QString("1.50"));
  }

  void meshGeometryTiles_data() {
    QTest::addColumn<std::vector<int>>("counts");
    QTest::addColumn<int>("nodeColumns");
    QTest::addColumn<int>("device");
    QTest::addColumn<QRectF>("tile");
    QTest::addColumn<QRectF>("node");
    // 3 nodes of 4: 2 node columns (ceil sqrt 3), 4 tiles in a row; node box 440 x 80.
    QTest::newRow("first") << std::vector<int>{4, 4, 4} << 0 << 0 << QRectF(5, 25, 100, 50)
                           << QRectF(0, 0, 440, 80);
    QTest::newRow("node 1, local 1") << std::vector<int>{4, 4, 4} << 0 << 5 << QRectF(585, 25, 100, 50)
                                     << QRectF(470, 0, 440, 80);
    QTest::newRow("second row of nodes")
        << std::vector<int>{4, 4, 4} << 0 << 9 << QRectF(115, 135, 100, 50) << QRectF(0, 110, 440, 80);
    // 8 devices: 4 x 2 tiles; node box 440 x 140.
    QTest::newRow("8 per node, second tile row")
        << std::vector<int>{8} << 0 << 6 << QRectF(225, 85, 100, 50) << QRectF(0, 0, 440, 140);
    // A set width of 3 node columns: node 4 is row 1, column 1 (boxes of a 1-device mesh are minNodeWidth
    // wide, so the header fits: 300 x 80, the tile at the box's left).
    QTest::newRow("set width") << std::vector<int>{1, 1, 1, 1, 1} << 3 << 4 << QRectF(335, 135, 100, 50)
                               << QRectF(330, 110, 300, 80);
    // Uneven nodes: every box has room for the largest (8: 4 x 2).
    QTest::newRow("uneven") << std::vector<int>{8, 3} << 0 << 10 << QRectF(695, 25, 100, 50)
                            << QRectF(470, 0, 440, 140);
  }

  void meshGeometryTiles() {
    QFETCH(std::vector<int>, counts);
    QFETCH(int, nodeColumns);
    QFETCH(int, device);
    QFETCH(QRectF, tile);
    QFETCH(QRectF, node);
    const MeshGeometry g(counts, testParams(nodeColumns));
    QCOMPARE(g.tileRect(device), tile);
    QCOMPARE(g.nodeRect(g.nodeOfDevice(device)), node);
    QVERIFY(node.contains(tile));
    QCOMPARE(g.deviceAt(tile.center()), device);
    QCOMPARE(g.nodeAt(tile.center()), g.nodeOfDevice(device));
    QVERIFY(g.sceneRect().contains(node));
  }

  void meshGeometryHits_data() {
    QTest::addColumn<std::vector<int>>("counts");
    QTest::addColumn<QPointF>("point");
    QTest::addColumn<int>("device");
    QTest::addColumn<int>("node");
    const std::vector<int> three{4, 4, 4};
    QTest::newRow("centre of device 1") << three << QPointF(165, 50) << 1 << 0;
    QTest::newRow("top-left corner of device 1") << three << QPointF(115, 25) << 1 << 0;
    QTest::newRow("bottom-right corner of device 1") << three << QPointF(215, 75) << 1 << 0;
    QTest::newRow("gap between devices 1 and 2") << three << QPointF(220, 50) << -1 << 0;
    QTest::newRow("node header") << three << QPointF(50, 10) << -1 << 0;
    QTest::newRow("node padding below tiles") << three << QPointF(50, 78) << -1 << 0;
    QTest::newRow("gap between nodes") << three << QPointF(455, 40) << -1 << -1;
    QTest::newRow("gap between node rows") << three << QPointF(50, 95) << -1 << -1;
    QTest::newRow("device 8, node 2") << three << QPointF(10, 140) << 8 << 2;
    QTest::newRow("empty cell of the node grid") << three << QPointF(600, 150) << -1 << -1;
    QTest::newRow("left of the scene") << three << QPointF(-5, 40) << -1 << -1;
    QTest::newRow("above the scene") << three << QPointF(50, -1) << -1 << -1;
    QTest::newRow("right of the scene") << three << QPointF(2000, 40) << -1 << -1;
    QTest::newRow("below the scene") << three << QPointF(50, 5000) << -1 << -1;
    // Node 1 holds 3 of 8 slots: its fourth slot (first row) and its second row are empty.
    QTest::newRow("unused slot") << std::vector<int>{8, 3} << QPointF(850, 50) << -1 << 1;
    QTest::newRow("used slot of the small node") << std::vector<int>{8, 3} << QPointF(740, 50) << 10 << 1;
    QTest::newRow("empty second row") << std::vector<int>{8, 3} << QPointF(520, 110) << -1 << 1;
    QTest::newRow("no nodes") << std::vector<int>{} << QPointF(10, 10) << -1 << -1;
  }

  void meshGeometryHits() {
    QFETCH(std::vector<int>, counts);
    QFETCH(QPointF, point);
    QFETCH(int, device);
    QFETCH(int, node);
    const MeshGeometry g(counts, testParams());
    QCOMPARE(g.deviceAt(point), device);
    QCOMPARE(g.nodeAt(point), node);
  }

  void meshGeometryInvariants() {
    // Every tile of a 128 x 8 mesh is hit at its centre and corners and lies in its node box; nothing
    // overlaps (the hit test finds exactly one device per tile).
    const MeshGeometry g(std::vector<int>(128, 8));
    QCOMPARE(g.deviceCount(), 1024);
    QCOMPARE(g.nodeColumns(), 12);
    QCOMPARE(g.tileColumns(), 4);
    for (int d = 0; d < g.deviceCount(); ++d) {
      const QRectF t = g.tileRect(d);
      QCOMPARE(g.deviceAt(t.center()), d);
      QCOMPARE(g.deviceAt(t.topLeft()), d);
      QCOMPARE(g.deviceAt(t.bottomRight()), d);
      QCOMPARE(g.nodeOfDevice(d), d / 8);
      QCOMPARE(g.localIndex(d), d % 8);
      QVERIFY(g.nodeRect(d / 8).contains(t));
    }
    QCOMPARE(g.tileRect(1024), QRectF());
    QCOMPARE(g.nodeOfDevice(-1), -1);
    // A count below 1 (a config mid-edit) counts as no devices.
    const MeshGeometry odd({2, -3, 1});
    QCOMPARE(odd.deviceCount(), 3);
    QCOMPARE(odd.nodeOfDevice(2), 2);
    QCOMPARE(odd.devicesInNode(1), 0);
  }

  void placeLayers_data() {
    QTest::addColumn<int>("pp");
    QTest::addColumn<int>("first");
    QTest::addColumn<int>("last");
    QTest::addColumn<int>("stage");
    QTest::addColumn<std::vector<int>>("stages");  // expected stage of each layer; empty = refused
    QTest::addColumn<int>("chunksPerStage");
    QTest::addColumn<QString>("schedule");
    QTest::addColumn<QString>("reason");  // a substring of the refusal
    // Layers: embedding, block.0-3, head. Even split with pp = 2: {0,0,0,1,1,1}.
    QTest::newRow("boundary layer down a stage")
        << 2 << 3 << 3 << 0 << std::vector<int>{0, 0, 0, 0, 1, 1} << 1 << "1f1b"
        << "";
    QTest::newRow("boundary layer up a stage")
        << 2 << 2 << 2 << 1 << std::vector<int>{0, 0, 1, 1, 1, 1} << 1 << "1f1b"
        << "";
    QTest::newRow("second range: interleaved")
        << 2 << 1 << 1 << 1 << std::vector<int>{0, 1, 0, 1, 1, 1} << 2 << "interleaved_1f1b"
        << "";
    QTest::newRow("reversed range") << 2 << 3 << 2 << 1 << std::vector<int>{0, 0, 1, 1, 1, 1} << 1 << "1f1b"
                                    << "";
    QTest::newRow("no change") << 2 << 0 << 1 << 0 << std::vector<int>{0, 0, 0, 1, 1, 1} << 1 << "1f1b"
                               << "";
    QTest::newRow("three stages") << 3 << 4 << 4 << 1 << std::vector<int>{0, 0, 1, 1, 1, 2} << 1 << "1f1b"
                                  << "";
    QTest::newRow("refused: empties a stage") << 2 << 3 << 5 << 0 << std::vector<int>{} << 0 << ""
                                              << "stage 1 would hold no layer";
    QTest::newRow("refused: unequal chunk counts") << 2 << 5 << 5 << 0 << std::vector<int>{} << 0 << ""
                                                   << "same number of chunks";
    QTest::newRow("refused: no such stage") << 2 << 0 << 0 << 2 << std::vector<int>{} << 0 << ""
                                            << "stage 2 does not exist";
    QTest::newRow("refused: out of range") << 2 << 4 << 6 << 0 << std::vector<int>{} << 0 << ""
                                           << "out of range";
  }

  void placeLayers() {
    QFETCH(int, pp);
    QFETCH(int, first);
    QFETCH(int, last);
    QFETCH(int, stage);
    QFETCH(std::vector<int>, stages);
    QFETCH(int, chunksPerStage);
    QFETCH(QString, schedule);
    QFETCH(QString, reason);
    RunConfig config = smallConfig();
    config.parallel.pp = pp;
    config.parallel.tp = 1;
    const auto placed = ms::placeLayers(config, first, last, stage);
    if (stages.empty()) {
      QVERIFY(!placed.isOk());
      QVERIFY2(QString::fromStdString(placed.message()).contains(reason), placed.message().c_str());
      return;
    }
    QVERIFY2(placed.isOk(), placed.message().c_str());
    QVERIFY(ms::validateRunConfig(*placed).empty());
    const auto placement = ms::layerPlacement(*placed);
    QVERIFY(placement.isOk());
    QCOMPARE(placement->stageOfLayer, stages);
    QCOMPARE(placed->parallel.virtualChunks, chunksPerStage);
    QCOMPARE(QString(ms::toString(placed->parallel.schedule)), schedule);
  }
};

QTEST_MAIN(TestUiModels)
#include "tst_ui_models.moc"
