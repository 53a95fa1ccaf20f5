// Plan editing through the real widgets under QT_QPA_PLATFORM=offscreen: rows selected in the layer palette
// are dragged (their mime data delivered as drag-enter, drag-move and drop events) onto a device tile of the
// mesh canvas, and the config's placement changes, or the drop is refused with a reason and nothing changes;
// undo and redo of the drop; inspector edits, undoable, with inline validation messages; mesh edits through
// the canvas's actions; auto-plan and balance from the palette; a save/load round trip of the edited project;
// and the GPT-3 175B example (1024 devices) drawn and edited.
#include <QtTest>

#include <QDoubleSpinBox>

#include <QAction>
#include <QCheckBox>
#include <QComboBox>
#include <QImage>
#include <QItemSelectionModel>
#include <QLineEdit>
#include <QMimeData>
#include <QPushButton>
#include <QSpinBox>
#include <QTableView>
#include <QTemporaryDir>

#include "plan/hardware.h"
#include "plan/plan.h"
#include "test_util.h"
#include "ui/models/layer_model.h"
#include "ui/models/placement.h"
#include "ui/models/project_document.h"
#include "ui/models/units.h"
#include "ui/views/inspector.h"
#include "ui/views/layer_palette.h"
#include "ui/views/mesh_canvas.h"
#include "ui/views/type_dialog.h"

using ms::LayerModel;
using ms::LayerPalette;
using ms::MeshCanvas;
using ms::ProjectDocument;
using ms::RunConfig;

namespace {

// gpt with 4 blocks (layers: embedding, block.0-3, head) on one node of 8 H100s; dp 1, tp 2, pp 2: ranks
// 0-3 on devices 0-3 (stage 0 on devices 0-1, stage 1 on 2-3), devices 4-7 idle.
RunConfig smallConfig() {
  nlohmann::json j = ms::test::smallGpuPlanConfig("ui-editing", 4, 16);
  j["parallel"] = {{"dp", 1}, {"tp", 2}, {"pp", 2}, {"microbatches", 4}};
  auto c = ms::parseRunConfig(j);
  if (!c) qFatal("%s", c.message().c_str());
  return *c;
}

std::vector<int> stagesOf(const RunConfig& config) {
  auto p = ms::layerPlacement(config);
  return p ? p->stageOfLayer : std::vector<int>{};
}

// The palette's selection -> the view's model's mime data, as a drag would carry it.
std::unique_ptr<QMimeData> dragRows(LayerPalette& palette, int first, int last) {
  QTableView* view = palette.view();
  QAbstractItemModel* model = view->model();
  view->selectionModel()->clearSelection();
  view->selectionModel()->select(
      QItemSelection(model->index(first, 0), model->index(last, model->columnCount() - 1)),
      QItemSelectionModel::Select | QItemSelectionModel::Rows);
  return std::unique_ptr<QMimeData>(model->mimeData(view->selectionModel()->selectedIndexes()));
}

struct DropResult {
  bool enterAccepted = false;
  bool dropAccepted = false;
  int highlighted = -1;  // during the move
  bool highlightAcceptable = false;
};

// Delivers drag-enter, drag-move and drop to the canvas's viewport at a viewport position.
DropResult dropAt(MeshCanvas& canvas, const QMimeData* mime, QPoint pos) {
  DropResult r;
  const Qt::DropActions actions = Qt::CopyAction | Qt::MoveAction;
  QDragEnterEvent enter(pos, actions, mime, Qt::LeftButton, Qt::NoModifier);
  QApplication::sendEvent(canvas.viewport(), &enter);
  r.enterAccepted = enter.isAccepted();
  QDragMoveEvent move(pos, actions, mime, Qt::LeftButton, Qt::NoModifier);
  QApplication::sendEvent(canvas.viewport(), &move);
  r.highlighted = canvas.highlightedDevice();
  r.highlightAcceptable = canvas.highlightAcceptable();
  QDropEvent drop(QPointF(pos), actions, mime, Qt::LeftButton, Qt::NoModifier);
  QApplication::sendEvent(canvas.viewport(), &drop);
  r.dropAccepted = drop.isAccepted();
  return r;
}

QPoint tileCentre(const MeshCanvas& canvas, int device) {
  return canvas.mapFromScene(canvas.meshGeometry().tileRect(device).center());
}

}  // namespace

class TestUiEditing : public QObject {
  Q_OBJECT
 private slots:
  void dropMovesLayersAndUndoRestores() {
    ProjectDocument doc;
    doc.reset(smallConfig());
    LayerPalette palette(&doc);
    MeshCanvas canvas(&doc);
    canvas.resize(900, 600);
    canvas.show();
    palette.show();
    QVERIFY(QTest::qWaitForWindowExposed(&canvas));
    QCOMPARE(stagesOf(doc.config()), (std::vector<int>{0, 0, 0, 1, 1, 1}));
    QCOMPARE(canvas.stageOfDevice(1), 0);
    QCOMPARE(canvas.stageOfDevice(3), 1);
    QCOMPARE(canvas.stageOfDevice(5), -1);
    QVERIFY2(canvas.tileLabel(3).contains("rank 3 · stage 1"), qPrintable(canvas.tileLabel(3)));
    QVERIFY2(canvas.tileLabel(3).contains("tp 1 · dp 0"), qPrintable(canvas.tileLabel(3)));
    QVERIFY2(canvas.tileLabel(3).contains("b2-b3, head"), qPrintable(canvas.tileLabel(3)));
    QVERIFY2(canvas.tileLabel(5).contains("idle"), qPrintable(canvas.tileLabel(5)));
    QCOMPARE(canvas.tileColor(5), canvas.tileColor(6));   // idle grey
    QVERIFY(canvas.tileColor(0) != canvas.tileColor(2));  // stages differ
    QSignalSpy placed(&canvas, &MeshCanvas::layersPlaced);

    // block.2 (the first layer of stage 1) onto device 1 (stage 0): the boundary moves.
    auto mime = dragRows(palette, 3, 3);
    QVERIFY(mime);
    const DropResult r = dropAt(canvas, mime.get(), tileCentre(canvas, 1));
    QVERIFY(r.enterAccepted);
    QCOMPARE(r.highlighted, 1);
    QVERIFY(r.highlightAcceptable);
    QVERIFY(r.dropAccepted);
    QCOMPARE(canvas.highlightedDevice(), -1);  // cleared by the drop
    QCOMPARE(placed.count(), 1);
    QCOMPARE(stagesOf(doc.config()), (std::vector<int>{0, 0, 0, 0, 1, 1}));
    QVERIFY2(canvas.tileLabel(0).contains("emb, b0-b2"), qPrintable(canvas.tileLabel(0)));
    QCOMPARE(palette.model()->index(3, LayerModel::Stage).data().toInt(), 0);
    QCOMPARE(doc.undoStack()->count(), 1);
    QVERIFY(doc.undoStack()->undoText().contains("stage 0"));

    doc.undoStack()->undo();
    QCOMPARE(stagesOf(doc.config()), (std::vector<int>{0, 0, 0, 1, 1, 1}));
    QCOMPARE(doc.config(), smallConfig());
    doc.undoStack()->redo();
    QCOMPARE(stagesOf(doc.config()), (std::vector<int>{0, 0, 0, 0, 1, 1}));

    // A second range on stage 1 (block.0) makes two chunks per stage: interleaved.
    auto second = dragRows(palette, 1, 1);
    QVERIFY(dropAt(canvas, second.get(), tileCentre(canvas, 2)).dropAccepted);
    QCOMPARE(stagesOf(doc.config()), (std::vector<int>{0, 1, 0, 0, 1, 1}));
    QCOMPARE(doc.config().parallel.virtualChunks, 2);
    QCOMPARE(doc.config().parallel.schedule, ms::Schedule::Interleaved1F1B);
    QVERIFY2(canvas.tileLabel(2).contains("b0 + b3, head"), qPrintable(canvas.tileLabel(2)));
    doc.undoStack()->undo();
    QCOMPARE(doc.config().parallel.schedule, ms::Schedule::OneFOneB);
    QCOMPARE(doc.config().parallel.virtualChunks, 1);
  }

  void badDropsAreRefused() {
    ProjectDocument doc;
    doc.reset(smallConfig());
    LayerPalette palette(&doc);
    MeshCanvas canvas(&doc);
    canvas.resize(900, 600);
    canvas.show();
    QVERIFY(QTest::qWaitForWindowExposed(&canvas));
    QSignalSpy refused(&canvas, &MeshCanvas::dropRefused);

    // block.2..head onto stage 0 would leave stage 1 empty.
    auto mime = dragRows(palette, 3, 5);
    DropResult r = dropAt(canvas, mime.get(), tileCentre(canvas, 0));
    QVERIFY(!r.dropAccepted);
    QCOMPARE(refused.count(), 1);
    QVERIFY2(canvas.lastRefusal().contains("stage 1 would hold no layer"), qPrintable(canvas.lastRefusal()));
    QCOMPARE(refused.first().first().toString(), canvas.lastRefusal());
    QVERIFY(canvas.messageVisible());
    QCOMPARE(canvas.messageText(), canvas.lastRefusal());
    QCOMPARE(doc.config(), smallConfig());
    QCOMPARE(doc.undoStack()->count(), 0);

    // An idle device: highlighted as a refusal while dragging, refused on drop.
    auto one = dragRows(palette, 2, 2);
    r = dropAt(canvas, one.get(), tileCentre(canvas, 6));
    QCOMPARE(r.highlighted, 6);
    QVERIFY(!r.highlightAcceptable);
    QVERIFY(!r.dropAccepted);
    QVERIFY2(canvas.lastRefusal().contains("idle"), qPrintable(canvas.lastRefusal()));

    // Empty space: between the node box's edge and its first tile.
    const QRectF node = canvas.meshGeometry().nodeRect(0);
    r = dropAt(canvas, one.get(), canvas.mapFromScene(node.topLeft() + QPointF(3, 3)));
    QVERIFY(!r.dropAccepted);
    QCOMPARE(r.highlighted, -1);
    QVERIFY2(canvas.lastRefusal().contains("empty space"), qPrintable(canvas.lastRefusal()));

    // Data that is not a layer range.
    QMimeData junk;
    junk.setData(LayerModel::mimeType(), "junk");
    QVERIFY(!dropAt(canvas, &junk, tileCentre(canvas, 0)).dropAccepted);
    QCOMPARE(refused.count(), 4);
    // Other mime types are not accepted at all.
    QMimeData text;
    text.setText("block.0");
    QVERIFY(!dropAt(canvas, &text, tileCentre(canvas, 0)).enterAccepted);
    QCOMPARE(doc.config(), smallConfig());
    QCOMPARE(doc.undoStack()->count(), 0);
  }

  void inspectorEditsAreUndoableAndValidated() {
    ProjectDocument doc;
    doc.reset(smallConfig());
    ms::Inspector inspector(&doc);
    inspector.show();
    auto* tp = qobject_cast<QSpinBox*>(inspector.editorFor("/parallel/tp"));
    QVERIFY(tp);
    QCOMPARE(tp->value(), 2);
    QCOMPARE(inspector.messageFor("/parallel/tp"), QString());

    // Typing 1 then 4 in the box: one undo step.
    tp->setValue(1);
    tp->setValue(4);
    QCOMPARE(doc.config().parallel.tp, 4);
    QCOMPARE(doc.undoStack()->count(), 1);
    doc.undoStack()->undo();
    QCOMPARE(doc.config().parallel.tp, 2);
    QCOMPARE(tp->value(), 2);  // the editor follows the document

    // tp = 3 does not divide 4 heads: the message under the field names it, the field is marked.
    tp->setValue(3);
    QCOMPARE(doc.config().parallel.tp, 3);
    QVERIFY2(inspector.messageFor("/parallel/tp").contains("tp (3) must divide model.heads (4)"),
             qPrintable(inspector.messageFor("/parallel/tp")));
    QVERIFY(inspector.isMarkedInvalid("/parallel/tp"));
    QVERIFY(!inspector.isMarkedInvalid("/parallel/dp"));
    doc.undoStack()->undo();
    QCOMPARE(inspector.messageFor("/parallel/tp"), QString());
    QVERIFY(!inspector.isMarkedInvalid("/parallel/tp"));

    // dp = 3 with 4 microbatches: batch 16 is not divisible by 12; the batch size field says so.
    auto* dp = qobject_cast<QSpinBox*>(inspector.editorFor("/parallel/dp"));
    dp->setValue(3);
    QVERIFY2(inspector.messageFor("/training/batch_size").contains("divisible by dp * microbatches = 12"),
             qPrintable(inspector.messageFor("/training/batch_size")));
    // dp = 4: 16 ranks on 8 devices, a message of the section.
    dp->setValue(4);
    QVERIFY2(inspector.messageFor("/parallel").contains("16 ranks"),
             qPrintable(inspector.messageFor("/parallel")));
    doc.undoStack()->undo();  // dp back to 1 (the two values merged)
    QCOMPARE(doc.config().parallel.dp, 1);
    QCOMPARE(inspector.messageFor("/parallel"), QString());

    // pp edits drop an explicit placement (it names stages of the old pp).
    auto placed = ms::placeLayers(doc.config(), 3, 3, 0);
    QVERIFY(placed.isOk());
    doc.setConfig("place", *placed);
    QVERIFY(!doc.config().parallel.placement.empty());
    qobject_cast<QSpinBox*>(inspector.editorFor("/parallel/pp"))->setValue(3);
    QVERIFY(doc.config().parallel.placement.empty());
    QVERIFY(doc.errors().empty());
    doc.undoStack()->undo();
    QCOMPARE(doc.config(), *placed);

    // Recompute: selective, and a count of fully recomputed blocks per chunk that needs "full" (the message
    // names the field) and is dropped when recompute leaves "full".
    auto* recompute = qobject_cast<QComboBox*>(inspector.editorFor("/parallel/recompute"));
    auto* recomputeLayers = qobject_cast<QSpinBox*>(inspector.editorFor("/parallel/recompute_layers"));
    QVERIFY(recompute && recomputeLayers);
    QVERIFY(recompute->findText("selective") >= 0);
    recompute->setCurrentText("selective");
    QCOMPARE(doc.config().parallel.recompute, ms::Recompute::Selective);
    recomputeLayers->setValue(1);
    QVERIFY2(inspector.messageFor("/parallel/recompute_layers").contains("needs \"recompute\": \"full\""),
             qPrintable(inspector.messageFor("/parallel/recompute_layers")));
    recompute->setCurrentText("full");
    QCOMPARE(doc.config().parallel.recomputeLayers, 1);
    QCOMPARE(inspector.messageFor("/parallel/recompute_layers"), QString());
    recompute->setCurrentText("none");
    QCOMPARE(doc.config().parallel.recomputeLayers, 0);
    QCOMPARE(recomputeLayers->value(), 0);

    // Offload and gradient precision: offloading an fp32 run is refused, the message naming the field and
    // the reason; bf16 clears it.
    auto* offload = qobject_cast<QComboBox*>(inspector.editorFor("/parallel/offload"));
    auto* precision = qobject_cast<QComboBox*>(inspector.editorFor("/parallel/precision"));
    auto* gradPrecision = qobject_cast<QComboBox*>(inspector.editorFor("/parallel/grad_precision"));
    QVERIFY(offload && precision && gradPrecision);
    precision->setCurrentText("fp32");
    offload->setCurrentText("optimizer");
    QCOMPARE(doc.config().parallel.offload, ms::Offload::Optimizer);
    QVERIFY2(inspector.messageFor("/parallel/offload").contains("needs \"precision\": \"bf16\""),
             qPrintable(inspector.messageFor("/parallel/offload")));
    precision->setCurrentText("bf16");
    QCOMPARE(inspector.messageFor("/parallel/offload"), QString());
    gradPrecision->setCurrentText("bf16");
    QCOMPARE(doc.config().parallel.gradPrecision, ms::GradPrecision::Bf16);
    QVERIFY(doc.errors().empty());
    gradPrecision->setCurrentText("fp32");
    offload->setCurrentText("none");
    precision->setCurrentText("fp32");
    QCOMPARE(doc.config().parallel.offload, ms::Offload::None);

    // The parameter gather's overlap: only ZeRO 1-2 have one, so the box is enabled with them and cleared
    // when the stage leaves them.
    auto* zero = qobject_cast<QSpinBox*>(inspector.editorFor("/parallel/zero"));
    auto* overlap = qobject_cast<QCheckBox*>(inspector.editorFor("/parallel/overlap_param_gather"));
    QVERIFY(zero && overlap);
    QCOMPARE(doc.config().parallel.zero, 0);
    QVERIFY(!overlap->isEnabled());
    zero->setValue(1);
    QVERIFY(overlap->isEnabled());
    overlap->setChecked(true);
    QVERIFY(doc.config().parallel.overlapParamGather);
    QVERIFY(doc.errors().empty());
    zero->setValue(3);
    QVERIFY(!doc.config().parallel.overlapParamGather);
    QVERIFY(!overlap->isChecked());
    QVERIFY(!overlap->isEnabled());
    QVERIFY(doc.errors().empty());
    zero->setValue(0);

    // The overlap of the tensor-parallel collectives splits sequence parallelism's: its box is enabled with
    // sequence parallelism and cleared when that is turned off.
    auto* sequence = qobject_cast<QCheckBox*>(inspector.editorFor("/parallel/sequence_parallel"));
    auto* tpOverlap = qobject_cast<QCheckBox*>(inspector.editorFor("/parallel/tp_comm_overlap"));
    QVERIFY(sequence && tpOverlap);
    QVERIFY(!doc.config().parallel.sequenceParallel);
    QVERIFY(!tpOverlap->isEnabled());
    sequence->setChecked(true);
    QVERIFY(tpOverlap->isEnabled());
    tpOverlap->setChecked(true);
    QVERIFY(doc.config().parallel.tpCommOverlap);
    QVERIFY(doc.errors().empty());
    sequence->setChecked(false);
    QVERIFY(!doc.config().parallel.tpCommOverlap);
    QVERIFY(!tpOverlap->isChecked());
    QVERIFY(!tpOverlap->isEnabled());
    QVERIFY(doc.errors().empty());

    // The BatchNorm mode applies to the cnn only: disabled here (gpt), enabled and undoable for a cnn.
    auto* batchNorm = qobject_cast<QComboBox*>(inspector.editorFor("/parallel/batchnorm"));
    QVERIFY(batchNorm);
    QVERIFY(!batchNorm->isEnabled());
    {
      ProjectDocument cnnDoc;
      ms::RunConfig cnn = smallConfig();
      cnn.model.type = ms::ModelType::Cnn;
      cnn.model.channels = {8, 16};
      cnn.data.kind = ms::DataKind::FashionMnist;
      cnn.parallel.tp = 1;
      cnnDoc.reset(cnn);
      ms::Inspector cnnInspector(&cnnDoc);
      auto* mode = qobject_cast<QComboBox*>(cnnInspector.editorFor("/parallel/batchnorm"));
      QVERIFY(mode && mode->isEnabled());
      QCOMPARE(mode->currentText(), QString("local"));
      mode->setCurrentText("sync");
      QCOMPARE(cnnDoc.config().parallel.batchNorm, ms::BatchNormMode::Sync);
      cnnDoc.undoStack()->undo();
      QCOMPARE(cnnDoc.config().parallel.batchNorm, ms::BatchNormMode::Local);
      QCOMPARE(mode->currentText(), QString("local"));
    }

    // Parameter-server mode: the switch carries dp over to workers and back, the mode's fields are enabled
    // only in it (and the collective layout's only outside it), and it undoes in one step.
    {
      ProjectDocument psDoc;
      ms::RunConfig mlp = smallConfig();
      mlp.model.type = ms::ModelType::Mlp;
      mlp.data.kind = ms::DataKind::FashionMnist;
      mlp.parallel = {};
      mlp.parallel.dp = 2;
      mlp.mesh.nodes = {{"n0", "cpu", 2}};
      psDoc.reset(mlp);
      ms::Inspector psInspector(&psDoc);
      auto* mode = qobject_cast<QComboBox*>(psInspector.editorFor("/parallel/mode"));
      QVERIFY(mode && mode->isEnabled());
      QVERIFY(!psInspector.editorFor("/parallel/workers")->isEnabled());
      mode->setCurrentText("parameter_server");
      const ms::RunConfig& c = psDoc.config();
      QCOMPARE(c.parallel.mode, ms::ParallelMode::ParameterServer);
      QCOMPARE(c.parallel.workers, 2);
      QCOMPARE(c.parallel.dp, 1);
      QVERIFY2(ms::validateRunConfig(c).empty(),
               ms::formatConfigErrors(ms::validateRunConfig(c), "mlp").c_str());
      QVERIFY(psInspector.editorFor("/parallel/workers")->isEnabled());
      QVERIFY(!psInspector.editorFor("/parallel/dp")->isEnabled());
      QVERIFY(!psInspector.editorFor("/parallel/staleness")->isEnabled());
      qobject_cast<QComboBox*>(psInspector.editorFor("/parallel/consistency"))->setCurrentText("bounded");
      QVERIFY(psInspector.editorFor("/parallel/staleness")->isEnabled());
      psDoc.undoStack()->undo();
      psDoc.undoStack()->undo();
      QCOMPARE(psDoc.config().parallel.mode, ms::ParallelMode::Collective);
      QCOMPARE(psDoc.config().parallel.dp, 2);
      QVERIFY(psInspector.editorFor("/parallel/dp")->isEnabled());
    }

    // Other kinds of editor: a combo box, the learning rate as text (a bad number is refused locally).
    auto* schedule = qobject_cast<QComboBox*>(inspector.editorFor("/parallel/schedule"));
    schedule->setCurrentText("gpipe");
    QCOMPARE(doc.config().parallel.schedule, ms::Schedule::GPipe);
    auto* lr = qobject_cast<QLineEdit*>(inspector.editorFor("/optimizer/lr"));
    QVERIFY(lr);
    const int before = doc.undoStack()->count();
    lr->clear();
    QTest::keyClicks(lr, "2e-3");
    QCOMPARE(doc.config().optimizer.lr, 2e-3);
    QCOMPARE(doc.undoStack()->count(), before + 1);  // "2", "2e", "2e-", "2e-3" merged
    QTest::keyClicks(lr, "x");
    QVERIFY2(inspector.messageFor("/optimizer/lr").contains("not a number"),
             qPrintable(inspector.messageFor("/optimizer/lr")));
    QCOMPARE(doc.config().optimizer.lr, 2e-3);
    auto* name = qobject_cast<QLineEdit*>(inspector.editorFor("/name"));
    name->clear();
    QTest::keyClicks(name, "bad name!");
    QVERIFY2(inspector.messageFor("/name").contains("may only hold letters"),
             qPrintable(inspector.messageFor("/name")));
    // The mesh has no editor here: its errors are listed at the top.
    ms::MeshConfig mesh = doc.config().mesh;
    mesh.nodes.push_back(mesh.nodes[0]);
    doc.edit("duplicate name", [&](RunConfig& c) { c.mesh = mesh; });
    QVERIFY2(inspector.generalMessage().contains("/mesh/nodes/1/name"),
             qPrintable(inspector.generalMessage()));
  }

  void meshEditsThroughCanvasActions() {
    ProjectDocument doc;
    doc.reset(smallConfig());
    MeshCanvas canvas(&doc);
    canvas.resize(900, 600);
    canvas.show();
    QVERIFY(QTest::qWaitForWindowExposed(&canvas));
    const RunConfig original = doc.config();

    // Click device 2: it and its node are selected.
    QTest::mouseClick(canvas.viewport(), Qt::LeftButton, Qt::NoModifier, tileCentre(canvas, 2));
    QCOMPARE(canvas.selectedDevice(), 2);
    QCOMPARE(canvas.selectedNode(), 0);

    canvas.addNodeAction()->trigger();
    QCOMPARE(doc.config().mesh.nodes.size(), size_t(2));
    QCOMPARE(doc.config().mesh.nodes[1].name, std::string("n1"));
    QCOMPARE(doc.config().mesh.nodes[1].count, 8);
    QCOMPARE(canvas.meshGeometry().deviceCount(), 16);

    canvas.duplicateNodeAction()->trigger();  // node 0 again, inserted after it
    QCOMPARE(doc.config().mesh.nodes.size(), size_t(3));
    QCOMPARE(doc.config().mesh.nodes[1].name, std::string("n2"));

    QTest::mouseClick(canvas.viewport(), Qt::LeftButton, Qt::NoModifier, tileCentre(canvas, 20));
    QCOMPARE(canvas.selectedDevice(), 20);
    QCOMPARE(canvas.selectedNode(), 2);
    QVERIFY(canvas.removeDeviceAction()->isEnabled());
    canvas.removeDeviceAction()->trigger();
    QCOMPARE(doc.config().mesh.nodes[2].count, 7);
    QCOMPARE(canvas.meshGeometry().deviceCount(), 23);

    canvas.addDeviceAction()->trigger();  // to the selected node (2)
    QCOMPARE(doc.config().mesh.nodes[2].count, 8);
    QVERIFY(canvas.setNodeDeviceType(2, "a100-80gb"));
    QVERIFY(!canvas.setNodeDeviceType(2, "no-such-gpu"));
    QVERIFY(canvas.defineDeviceType({"lab-gpu", "Lab GPU", 30, 250, 48, 1200, 0.5}, 1));
    QCOMPARE(doc.config().mesh.nodes[1].device, std::string("lab-gpu"));
    QVERIFY(canvas.defineLinkType({"roce", 25, 8}, false));
    QCOMPARE(doc.config().mesh.interLink, std::string("roce"));
    QVERIFY2(canvas.interLinkText().contains("25 GB/s"), qPrintable(canvas.interLinkText()));
    QVERIFY(canvas.setLink(true, "pcie"));
    QVERIFY(canvas.nodeHeader(0).contains("pcie"));
    QVERIFY(doc.errors().empty());

    // Each edit was one step; undoing them all gives the original mesh back.
    QCOMPARE(doc.undoStack()->count(), 8);
    while (doc.undoStack()->canUndo()) doc.undoStack()->undo();
    QCOMPARE(doc.config(), original);
    QCOMPARE(canvas.meshGeometry().deviceCount(), 8);

    // The mesh keeps one node: removing it is refused with a reason, nothing changes.
    canvas.selectNode(0);
    QVERIFY(!canvas.removeNode(0));
    QVERIFY2(canvas.lastRefusal().contains("at least one node"), qPrintable(canvas.lastRefusal()));
    QCOMPARE(doc.undoStack()->index(), 0);
  }

  void paletteBalanceAndAutoPlan() {
    ProjectDocument doc;
    RunConfig start = smallConfig();
    auto skewed = ms::placeLayers(start, 1, 4, 1);  // stage 0: embedding only
    QVERIFY(skewed.isOk());
    doc.reset(*skewed);
    LayerPalette palette(&doc);
    palette.show();

    QTest::mouseClick(palette.balanceButton(), Qt::LeftButton);
    auto expected = ms::withBalancedPlacement(*skewed, false);
    QVERIFY(expected.isOk());
    QCOMPARE(doc.config(), *expected);
    QVERIFY(stagesOf(doc.config()) != stagesOf(*skewed));
    QCOMPARE(doc.undoStack()->undoText(), QString("Balance stages"));
    QVERIFY(palette.balance());  // again: nothing to do, no step
    QCOMPARE(doc.undoStack()->count(), 1);
    doc.undoStack()->undo();
    QCOMPARE(doc.config(), *skewed);

    // Balance of an unplannable config is refused with the plan's reason.
    doc.edit("tp 3", [](RunConfig& c) { c.parallel.tp = 3; });
    QVERIFY(!palette.balance());
    QVERIFY2(palette.message().contains("tp"), qPrintable(palette.message()));
    doc.undoStack()->undo();

    QVERIFY2(palette.computeAutoPlan(), qPrintable(palette.message()));
    const auto& candidates = palette.autoPlanCandidates();
    QVERIFY(!candidates.empty());
    for (size_t i = 1; i < candidates.size(); ++i)
      QVERIFY(candidates[i - 1].stepTime <= candidates[i].stepTime);
    const QStringList row = LayerPalette::candidateRow(candidates[0]);
    QCOMPARE(row.size(), LayerPalette::candidateHeaders().size());
    QCOMPARE(row[0].toInt(), candidates[0].config.parallel.dp);
    QCOMPARE(row[LayerPalette::candidateHeaders().indexOf("offload")],
             QString::fromLatin1(ms::toString(candidates[0].config.parallel.offload)));
    const int last = static_cast<int>(candidates.size()) - 1;
    QVERIFY(palette.applyCandidate(last));
    QCOMPARE(doc.config().parallel, candidates[static_cast<size_t>(last)].config.parallel);
    QVERIFY(!palette.applyCandidate(static_cast<int>(candidates.size())));
    doc.undoStack()->undo();
    QCOMPARE(doc.config(), *skewed);
  }

  void autoPlanButtonRunsOffThread() {
    ProjectDocument doc;
    doc.reset(smallConfig());
    LayerPalette palette(&doc);
    QSignalSpy finished(&palette, &LayerPalette::autoPlanFinished);
    // An edit while the search runs: its result is for an older config and is dropped.
    palette.startAutoPlan();
    QVERIFY(!palette.autoPlanButton()->isEnabled());
    doc.edit("steps", [](RunConfig& c) { c.training.steps = 7; });
    QVERIFY(finished.wait(20000));
    QCOMPARE(finished.first().first().toBool(), false);
    QVERIFY(palette.autoPlanCandidates().empty());
    QVERIFY2(palette.message().contains("changed"), qPrintable(palette.message()));
    QVERIFY(palette.autoPlanButton()->isEnabled());
  }

  void saveLoadRoundTrip() {
    ProjectDocument doc;
    doc.reset(smallConfig());
    LayerPalette palette(&doc);
    MeshCanvas canvas(&doc);
    ms::Inspector inspector(&doc);
    canvas.resize(900, 600);
    canvas.show();
    QVERIFY(QTest::qWaitForWindowExposed(&canvas));
    auto mime = dragRows(palette, 2, 2);
    QVERIFY(dropAt(canvas, mime.get(), tileCentre(canvas, 3)).dropAccepted);
    qobject_cast<QSpinBox*>(inspector.editorFor("/parallel/microbatches"))->setValue(8);
    QVERIFY(canvas.addNode());
    QVERIFY(canvas.defineDeviceType({"lab-gpu", "", 30, 250, 48, 1200, 0.5}, 1));
    QVERIFY(doc.errors().empty());
    QVERIFY(doc.isModified());

    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const QString path = dir.filePath("edited.json");
    const ms::Status saved = doc.save(path);
    QVERIFY2(saved.isOk(), saved.message().c_str());
    QVERIFY(!doc.isModified());
    ProjectDocument fresh;
    const ms::Status loaded = fresh.load(path);
    QVERIFY2(loaded.isOk(), loaded.message().c_str());
    QCOMPARE(fresh.config(), doc.config());
    QCOMPARE(stagesOf(fresh.config()), (std::vector<int>{0, 0, 1, 1, 1, 1}));
    QCOMPARE(fresh.config().mesh.deviceTypes.size(), size_t(1));
  }

  // The new-device-type form asks for memory in GiB like every other memory figure in the studio, and stores
  // the config's datasheet unit (memory_gb, 10^9 bytes).
  void deviceTypeFormUsesGiB() {
    ms::MeshConfig mesh;
    mesh.nodes = {{"node0", "cpu", 1}};
    ms::TypeDialog dialog(mesh, true, nullptr);
    const QList<QDoubleSpinBox*> spins = dialog.findChildren<QDoubleSpinBox*>();
    QDoubleSpinBox* memory = nullptr;
    for (QDoubleSpinBox* s : spins)
      if (s->toolTip().contains("GiB")) memory = s;
    QVERIFY(memory);
    QCOMPARE(memory->value(), 74.51);  // 80 GB, the usual datasheet figure, in GiB
    memory->setValue(64);
    QVERIFY(std::abs(dialog.deviceType().memoryGb - 64 * 1.073741824) < 1e-9);
    QCOMPARE(ms::formatBytes(ms::toDeviceSpec(dialog.deviceType()).memoryBytes), QString("64.0 GiB"));
  }

  // The new-link-type form says whether each device has its own port (per_device), unchecked by default,
  // and the type it gives costs rings across nodes by it.
  void linkTypeFormSaysPortPerDevice() {
    ms::MeshConfig mesh;
    mesh.nodes = {{"node0", "cpu", 1}};
    ms::TypeDialog dialog(mesh, false, nullptr);
    const QList<QCheckBox*> boxes = dialog.findChildren<QCheckBox*>();
    QCOMPARE(boxes.size(), qsizetype(1));
    QVERIFY(!boxes[0]->isChecked());
    QVERIFY(!dialog.linkType().perDevice);
    boxes[0]->setChecked(true);
    QVERIFY(dialog.linkType().perDevice);
    QVERIFY(ms::toLinkSpec(dialog.linkType()).perDevice);
    QCOMPARE(ms::toLinkSpec(dialog.linkType()).bandwidth, 100e9);  // the form's default, unscaled
  }

  void gpt3ExampleStaysUsable() {
    auto config = ms::templateConfig("gpt3");
    QVERIFY(config.isOk());
    ProjectDocument doc;
    doc.reset(*config);
    LayerPalette palette(&doc);
    MeshCanvas canvas(&doc);
    canvas.resize(1200, 800);
    canvas.show();
    QVERIFY(QTest::qWaitForWindowExposed(&canvas));
    QCOMPARE(canvas.meshGeometry().deviceCount(), 1024);
    // A node item each and the message; the legend is a panel beside the canvas, not a scene item.
    QCOMPARE(canvas.scene()->items().size(), qsizetype(128 + 1));
    QVERIFY2(canvas.legendText().contains("stage 7: b43-b48 + b91-b95, head"),
             qPrintable(canvas.legendText()));
    // dp 16, tp 8, pp 8: device 1023 holds rank 1023 (stage 7, tp 7, dp 15).
    QVERIFY2(canvas.tileLabel(1023).startsWith("rank 1023 · stage 7\ntp 7 · dp 15"),
             qPrintable(canvas.tileLabel(1023)));
    QCOMPARE(canvas.stageOfDevice(130), 1);
    QVERIFY2(canvas.interLinkText().startsWith("infiniband · 48 GB/s"), qPrintable(canvas.interLinkText()));
    QVERIFY2(canvas.interLinkText().endsWith("· a port per device"), qPrintable(canvas.interLinkText()));
    QVERIFY2(!canvas.nodeHeader(0).contains("port per device"), qPrintable(canvas.nodeHeader(0)));
    QVERIFY2(canvas.nodeHeader(0).contains("nvlink · 370 GB/s"), qPrintable(canvas.nodeHeader(0)));
    // Interleaved: stage 0 holds chunks 0 and 8 of 16.
    QVERIFY2(canvas.stageLayers(0).startsWith("emb, b0-b5 + b"), qPrintable(canvas.stageLayers(0)));
    // Painting the whole mesh (labels dropped at this zoom) and a zoomed-in part (labels drawn).
    const QImage overview = canvas.grab().toImage();
    QVERIFY(!overview.isNull());
    for (int i = 0; i < 12; ++i) canvas.zoomIn();
    canvas.centerOn(canvas.meshGeometry().tileRect(0).center());
    QVERIFY(!canvas.grab().toImage().isNull());
    canvas.fitAll();

    // A drop on the big plan: the first layer of chunk 1 (block.6, layer 7) onto stage 0.
    const std::vector<int> before = stagesOf(doc.config());
    QCOMPARE(before[7], 1);
    auto mime = dragRows(palette, 7, 7);
    canvas.centerOn(canvas.meshGeometry().tileRect(0).center());
    QVERIFY(dropAt(canvas, mime.get(), tileCentre(canvas, 0)).dropAccepted);
    const std::vector<int> after = stagesOf(doc.config());
    QCOMPARE(after[7], 0);
    for (size_t i = 0; i < after.size(); ++i)
      if (i != 7) QCOMPARE(after[i], before[i]);
    doc.undoStack()->undo();
    QCOMPARE(stagesOf(doc.config()), before);
  }
};

QTEST_MAIN(TestUiEditing)
#include "tst_ui_editing.moc"
