// The studio end to end under QT_QPA_PLATFORM=offscreen, through the real main window: opening projects (and
// failing to, with the message shown and the open project kept), templates, undo/redo and the unsaved-changes
// prompt, save/load round trips and recent files, the plan views following an edit, the launch-file and
// Chrome-trace exports, and a real run started from the studio (mpirun, 2 ranks) whose live metrics reach the
// plots and the measured timeline, then replayed from its run folder.
#include <QAction>
#include <QDialog>
#include <QPlainTextEdit>
#include <QStatusBar>
#include <QtTest>

#include <qcustomplot.h>
#include <QDockWidget>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QRandomGenerator>
#include <QRegularExpression>
#include <QSpinBox>
#include <QStandardPaths>
#include <QTabWidget>
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "plan/run_config.h"
#include "ui/models/layer_model.h"
#include "ui/models/project_document.h"
#include "ui/run/engine_client.h"
#include "ui/run/run_data.h"
#include "ui/views/inspector.h"
#include "ui/views/layer_palette.h"
#include "ui/views/main_window.h"
#include "ui/views/memory_view.h"
#include "ui/views/mesh_canvas.h"
#include "ui/views/run_view.h"
#include "ui/views/timeline_view.h"
#include "ui_test_util.h"

namespace {

using ms::test::waitForSnapshot;

// A GPT small enough to train a few steps in seconds with 2 pipeline stages on this machine's CPUs.
ms::RunConfig tinyPipeline(int steps) {
  ms::RunConfig c;
  c.name = "studio-tiny";
  c.device = ms::DeviceChoice::Cpu;
  c.model.layers = 2;
  c.model.width = 32;
  c.model.heads = 2;
  c.model.vocab = 256;
  c.model.context = 32;
  c.data.kind = ms::DataKind::Text;
  c.data.files = {"/usr/share/games/fortunes/*.u8"};
  c.mesh.nodes = {ms::NodeConfig{"node0", "cpu", 2}};
  c.parallel.pp = 2;
  c.parallel.microbatches = 2;
  c.training.steps = steps;
  c.training.batchSize = 4;
  c.training.seqLen = 32;
  c.training.evalEvery = 2;
  c.training.evalBatches = 2;
  c.training.threads = 1;
  return c;
}

QString writeConfig(const QString& dir, const ms::RunConfig& c) {
  const QString path = dir + "/" + QString::fromStdString(c.name) + ".json";
  const ms::Status s = ms::saveRunConfig(c, path.toStdString());
  return s ? path : QString();
}

}  // namespace

class TestStudio : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    QStandardPaths::setTestModeEnabled(true);  // recent files go to a test settings file
    QCoreApplication::setOrganizationName("MeshStudioTests");
    QCoreApplication::setApplicationName("tst_studio");
  }

  void opensExampleAndShowsPlan() {
    ms::MainWindow w;
    w.show();
    const QString path = MS_SOURCE_DIR "/resources/examples/gpt-1b-8xa100.json";
    QVERIFY2(w.openProject(path), qPrintable(w.lastError()));
    QVERIFY(waitForSnapshot(w));
    QVERIFY(w.snapshot()->ok());
    QVERIFY(w.windowTitle().contains("gpt-1b-8xa100.json"));
    QVERIFY2(w.summaryText().contains("dp 2 x tp 2 x pp 2 (8 ranks)"), qPrintable(w.summaryText()));
    QVERIFY(w.recentFiles().contains(QFileInfo(path).absoluteFilePath()));
    // The predicted timeline has a row per rank with the simulator's bubbles.
    QVERIFY(w.predictedTimeline()->data());
    QCOMPARE(int(w.predictedTimeline()->data()->rows.size()), 8);
    QCOMPARE(w.predictedTimeline()->data()->rows[0].bubbleFraction, w.snapshot()->sim.bubbleFraction[0]);
  }

  void failedOpenKeepsProject() {
    ms::MainWindow w;
    w.show();
    QVERIFY(w.openProject(MS_SOURCE_DIR "/resources/examples/gpt-fortunes.json"));
    const ms::RunConfig before = w.document()->config();
    QVERIFY(!w.openProject(MS_TEST_DATA_DIR "/broken/tp_not_dividing_heads.json"));
    QVERIFY2(w.lastError().contains("/parallel/tp"), qPrintable(w.lastError()));
    QVERIFY(w.summaryText().contains("/parallel/tp"));
    QVERIFY(w.document()->config() == before);  // nothing lost
    QVERIFY(!w.openProject("/nonexistent/project.json"));
    QVERIFY(w.lastError().contains("/nonexistent/project.json"));
    QVERIFY(w.document()->config() == before);
  }

  // Edits re-plan; undo and redo walk them back and forth; an invalid edit shows the error and the plan
  // views keep working; the unsaved-changes prompt can cancel an Open.
  void undoRedoAndUnsavedPrompt() {
    ms::MainWindow w;
    w.show();
    QVERIFY(w.openProject(MS_SOURCE_DIR "/resources/examples/gpt-1b-8xa100.json"));
    QVERIFY(waitForSnapshot(w));
    const double oneF1B = w.snapshot()->sim.stepTime;
    w.document()->edit("microbatches 16", [](ms::RunConfig& c) { c.parallel.microbatches = 16; });
    QVERIFY(w.document()->isModified());
    QVERIFY(w.isWindowModified());
    QVERIFY(waitForSnapshot(w));
    QCOMPARE(w.snapshot()->config.parallel.microbatches, 16);
    QVERIFY(w.snapshot()->sim.stepTime != oneF1B);
    w.document()->edit("tp 3", [](ms::RunConfig& c) { c.parallel.tp = 3; });
    QVERIFY(waitForSnapshot(w));
    QVERIFY(!w.snapshot()->ok());
    QVERIFY2(w.summaryText().contains("/parallel/tp"), qPrintable(w.summaryText()));
    w.document()->undoStack()->undo();
    w.document()->undoStack()->undo();
    QVERIFY(!w.document()->isModified());
    QVERIFY(!w.isWindowModified());
    QVERIFY(waitForSnapshot(w));
    QCOMPARE(w.snapshot()->sim.stepTime, oneF1B);
    w.document()->undoStack()->redo();
    QCOMPARE(w.document()->config().parallel.microbatches, 16);

    int asked = 0;
    w.setUnsavedChangesHandler([&] {
      ++asked;
      return QMessageBox::Cancel;
    });
    QVERIFY(!w.openProject(MS_SOURCE_DIR "/resources/examples/vit-fashion.json"));
    QCOMPARE(asked, 1);
    QCOMPARE(w.document()->config().parallel.microbatches, 16);  // still the edited project
    w.setUnsavedChangesHandler([&] {
      ++asked;
      return QMessageBox::Discard;
    });
    QVERIFY(w.openProject(MS_SOURCE_DIR "/resources/examples/vit-fashion.json"));
    QCOMPARE(asked, 2);
    QCOMPARE(w.document()->config().model.type, ms::ModelType::Vit);
  }

  void templatesAndSaveRoundTrip() {
    QTemporaryDir dir;
    ms::MainWindow w;
    w.show();
    for (const ms::ProjectTemplate& t : ms::projectTemplates()) {
      QVERIFY2(w.newProject(t.key), qPrintable(t.key + ": " + w.lastError()));
      QVERIFY2(w.document()->errors().empty(), qPrintable(t.key));
      QVERIFY(waitForSnapshot(w));
      QVERIFY2(w.snapshot()->ok(), qPrintable(t.key + ": " + w.snapshot()->error));
    }
    QVERIFY(w.newProject("gpt"));
    w.document()->edit("lr", [](ms::RunConfig& c) { c.optimizer.lr = 1.5e-3; });
    const QString path = dir.path() + "/edited.json";
    QVERIFY2(w.saveProjectAs(path), qPrintable(w.lastError()));
    QVERIFY(!w.document()->isModified());
    ms::MainWindow other;
    QVERIFY(other.openProject(path));
    QVERIFY(other.document()->config() == w.document()->config());
    QCOMPARE(other.document()->config().optimizer.lr, 1.5e-3);
    QVERIFY(!w.saveProjectAs("/proc/cannot/write.json"));
    QVERIFY(w.lastError().contains("/proc/cannot/write.json"));
  }

  // File > New > From a Hugging Face config.json: the open project's mesh and settings around the imported
  // model, its approximations noted; a refused config keeps the open project.
  void newProjectFromHfConfig() {
    ms::MainWindow w;
    w.show();
    QVERIFY(w.newProject("llama3-8b"));
    QVERIFY2(w.newProjectFromHfConfig(MS_SOURCE_DIR "/tests/data/hf/qwen2-7b.json"),
             qPrintable(w.lastError()));
    const ms::RunConfig& c = w.document()->config();
    QVERIFY(c.model.type == ms::ModelType::Llama);
    QCOMPARE(c.model.width, 3584);
    QCOMPARE(c.model.kvHeads, 4);
    QCOMPARE(c.name, std::string("qwen2-7b"));
    QCOMPARE(c.parallel.dp, 8);
    QVERIFY(w.lastImportNotes().join(" ").contains("biases are not modelled"));
    QVERIFY(waitForSnapshot(w));
    QVERIFY2(w.snapshot()->ok(), qPrintable(w.snapshot()->error));
    // Qwen2's vocabulary on the fortunes' bytes: refused, the open project kept.
    QVERIFY(w.newProject("gpt"));
    QVERIFY(!w.newProjectFromHfConfig(MS_SOURCE_DIR "/tests/data/hf/qwen2-7b.json"));
    QVERIFY2(w.lastError().contains("vocab must be 256"), qPrintable(w.lastError()));
    QCOMPARE(w.document()->config().name, std::string("gpt-fortunes"));
  }

  void exportsLaunchFilesAndPredictedTrace() {
    QTemporaryDir dir;
    ms::MainWindow w;
    QVERIFY(w.openProject(MS_SOURCE_DIR "/resources/examples/gpt-1b-8xa100.json"));
    QVERIFY(waitForSnapshot(w));
    QVERIFY(w.exportLaunchFiles(dir.path() + "/export"));
    QVERIFY(QFileInfo(dir.path() + "/export/launch.sh").isExecutable());
    QVERIFY(QFile::exists(dir.path() + "/export/slurm.sbatch"));
    QVERIFY(QFile::exists(dir.path() + "/export/hostfile"));
    QVERIFY(w.exportTrace(dir.path() + "/predicted.json", false));
    QFile f(dir.path() + "/predicted.json");
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QJsonArray events = QJsonDocument::fromJson(f.readAll()).object()["traceEvents"].toArray();
    int complete = 0;
    for (const QJsonValue& e : events) complete += e.toObject()["ph"].toString() == "X";
    QCOMPARE(size_t(complete), w.snapshot()->timeline.spanCount());
    QVERIFY(!w.exportTrace(dir.path() + "/measured.json", true));  // no run yet: refused with a reason
    QVERIFY(w.lastError().contains("no measured spans"));
  }

  // File > Export > Megatron-LM / torchtitan / DeepSpeed Launch: the preview shows the files and what the
  // framework cannot express; the written files import back (File > Import Framework Launch) as the same
  // plan.
  void exportsAndImportsFrameworkLaunches() {
    QTemporaryDir dir;
    ms::MainWindow w;
    w.show();
    QVERIFY(w.openProject(MS_SOURCE_DIR "/resources/examples/llama3-70b-64xh100.json"));
    QVERIFY(waitForSnapshot(w));
    const double step = w.snapshot()->sim.stepTime;
    QVERIFY(step > 0);
    QVERIFY(w.findChild<QAction*>("export-megatron"));
    QVERIFY(w.findChild<QAction*>("import-framework"));
    auto exported = w.frameworkExport(ms::Framework::Torchtitan);
    QVERIFY2(exported.isOk(), exported.message().c_str());
    QDialog* preview = w.makeFrameworkPreview(*exported);
    auto* tabs = preview->findChild<QTabWidget*>("files");
    QVERIFY(tabs);
    QCOMPARE(tabs->count(), 2);
    QCOMPARE(tabs->tabText(0), QString("torchtitan/train.toml"));
    QVERIFY(qobject_cast<QPlainTextEdit*>(tabs->widget(0))->toPlainText().contains("flavor = \"70B\""));
    QVERIFY(
        preview->findChild<QLabel*>("notCarried")->text().contains("Everything in the plan is carried over"));
    delete preview;
    for (ms::Framework f : {ms::Framework::Megatron, ms::Framework::Torchtitan, ms::Framework::DeepSpeed})
      QVERIFY2(w.exportForFrameworkTo(f, dir.path(), false), qPrintable(w.lastError()));
    // The project evaluates over its whole split, which Megatron-LM cannot: said in the status bar.
    QVERIFY2(w.statusBar()->currentMessage().contains("deepspeed/ds_config.json"),
             qPrintable(w.statusBar()->currentMessage()));
    QVERIFY(w.exportForFrameworkTo(ms::Framework::Megatron, dir.path(), false));
    QVERIFY2(w.statusBar()->currentMessage().contains("not carried over: evaluation over the whole split"),
             qPrintable(w.statusBar()->currentMessage()));
    const QStringList launches = {dir.path() + "/megatron/pretrain_gpt.sh",
                                  dir.path() + "/torchtitan/train.toml",
                                  dir.path() + "/deepspeed/ds_config.json"};
    for (const QString& launch : launches) {
      QVERIFY2(w.importFrameworkLaunch(launch), qPrintable(launch + ": " + w.lastError()));
      QVERIFY(w.statusBar()->currentMessage().startsWith("Imported " + QFileInfo(launch).fileName()));
      QVERIFY(waitForSnapshot(w));
      QVERIFY2(w.snapshot()->ok(), qPrintable(w.snapshot()->error));
      QCOMPARE(w.snapshot()->sim.stepTime, step);
      QCOMPARE(w.document()->config().parallel.tp, 8);
    }
    // A gpt project cannot go to torchtitan: refused with the reason, nothing written.
    QVERIFY(w.newProject("gpt"));
    QVERIFY(!w.exportForFrameworkTo(ms::Framework::Torchtitan, dir.path() + "/gpt", false));
    QVERIFY2(w.lastError().contains("torchtitan trains Llama-family models"), qPrintable(w.lastError()));
    QVERIFY(!QFileInfo::exists(dir.path() + "/gpt"));
    QVERIFY(!w.importFrameworkLaunch(dir.path() + "/missing.sh"));
    QVERIFY(w.lastError().contains("missing.sh: cannot read the file"));
    QCOMPARE(w.document()->config().name, std::string("gpt-fortunes"));
  }

  // Run: the studio starts the plan through mpirun, live steps reach the plots and the measured timeline,
  // the run's folder replays to the same curves.
  void runLiveThenReplay() {
    QTemporaryDir dir;
    const QString project = writeConfig(dir.path(), tinyPipeline(6));
    QVERIFY(!project.isEmpty());
    ms::MainWindow w;
    w.show();
    QVERIFY(w.openProject(project));
    QVERIFY(waitForSnapshot(w));
    QSignalSpy finished(w.engineClient(), &ms::EngineClient::finished);
    const QString runDir = dir.path() + "/run";
    QVERIFY2(w.startRun(runDir), qPrintable(w.lastError()));
    QVERIFY(w.engineClient()->isRunning());
    QVERIFY(!w.startRun(runDir));  // one run at a time
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, 120000);
    QVERIFY2(finished[0][0].toBool(), qPrintable(finished[0][1].toString()));
    const ms::RunData* data = w.runData();
    QCOMPARE(int(data->steps().size()), 6);
    for (double loss : data->steps().loss) QVERIFY(std::isfinite(loss) && loss > 0);
    QVERIFY(data->evals().size() >= 3);
    // The plots hold every step once the view has redrawn.
    QTRY_COMPARE_WITH_TIMEOUT(w.runView()->lossPlot()->graph(0)->dataCount(), 6, 5000);
    QTRY_VERIFY_WITH_TIMEOUT(w.runView()->throughputPlot()->graph(0)->dataCount() == 6, 5000);
    // The measured timeline: both ranks, forwards and backwards of both microbatches.
    QVERIFY(w.measuredTimeline()->data());
    const ms::TimelineData& measured = *w.measuredTimeline()->data();
    QCOMPARE(int(measured.rows.size()), 2);
    for (const ms::TimelineRow& row : measured.rows) {
      int forwards = 0, backwards = 0;
      for (const ms::TimelineSpan& s : row.spans) {
        forwards += s.kind == ms::SpanKind::Forward;
        backwards += s.kind == ms::SpanKind::Backward;
      }
      QVERIFY2(forwards >= 2 && backwards >= 2, qPrintable(row.label));
    }
    QVERIFY(w.exportTrace(dir.path() + "/measured.json", true));
    QVERIFY(w.exportPlots(dir.path() + "/plots", "png", 192));
    QVERIFY(QFileInfo(dir.path() + "/plots/memory.png").size() > 1000);
    // The run's memory chart is the prediction against the measured peaks, on one scale.
    QTRY_COMPARE_WITH_TIMEOUT(w.runView()->memoryView()->measuredBars()->dataCount(), 2, 5000);
    QCOMPARE(w.runView()->memoryView()->rankCount(), 2);
    // The dashboard as it is on screen, in one file: PNG at 192 dpi is twice the screen's pixels.
    w.tabs()->setCurrentIndex(1);
    QTRY_VERIFY_WITH_TIMEOUT(w.runView()->isVisible(), 5000);
    const QString png = dir.path() + "/dashboard.png";
    QVERIFY2(w.exportDashboard(png, "png", 192), qPrintable(w.lastError()));
    const QImage image(png);
    QCOMPARE(image.size(), w.runView()->size() * 2);
    QVERIFY(std::abs(image.dotsPerMeterX() - 192 / 0.0254) < 2);
    // The train loss curve's blue is in it, where the loss plot is on screen.
    const QRect loss(w.runView()->lossPlot()->mapTo(w.runView(), QPoint(0, 0)) * 2,
                     w.runView()->lossPlot()->size() * 2);
    int blue = 0;
    for (int y = loss.top(); y < loss.bottom(); y += 2)
      for (int x = loss.left(); x < loss.right(); x += 2)
        blue += QColor(image.pixel(x, y)) == QColor(31, 119, 180);
    QVERIFY2(blue > 10, qPrintable(QString("%1 curve pixels").arg(blue)));
    const QString pdf = dir.path() + "/dashboard.pdf", svg = dir.path() + "/dashboard.svg";
    QVERIFY(w.exportDashboard(pdf, "pdf"));
    QVERIFY(w.exportDashboard(svg, "svg"));
    QFile pdfFile(pdf), svgFile(svg);
    QVERIFY(pdfFile.open(QIODevice::ReadOnly) && svgFile.open(QIODevice::ReadOnly));
    QVERIFY(pdfFile.read(5) == "%PDF-");
    const QByteArray svgText = svgFile.readAll();
    QVERIFY(svgText.contains("<svg") && svgText.contains("<path"));  // vector, not one embedded image
    QVERIFY2(svgText.contains("Loss") && svgText.contains("Measured step"), "the panels' text is text");
    QVERIFY(!w.exportDashboard(dir.path() + "/dashboard.bmp", "bmp"));
    QVERIFY(w.lastError().contains("unknown format"));

    // Replay in a fresh window: the same steps, the same measured timeline shape.
    ms::MainWindow replay;
    QVERIFY2(replay.openRunFolder(runDir), qPrintable(replay.lastError()));
    QCOMPARE(int(replay.runData()->steps().size()), 6);
    QCOMPARE(replay.runData()->steps().loss.back(), data->steps().loss.back());
    QCOMPARE(int(replay.measuredTimeline()->data()->rows.size()), 2);
    QVERIFY(!replay.openRunFolder(dir.path() + "/no-such-run"));
    QVERIFY(replay.lastError().contains("no-such-run"));
  }

  // Resume: a finished 4-step run continued to 8 steps from its checkpoint. The curves carry on (steps 1-4
  // from the folder, 5-8 live), the first four losses are the first run's, the run ends ok; Resume with no
  // run is refused with a reason.
  void resumeContinuesTheLastRun() {
    QTemporaryDir dir;
    ms::RunConfig c = tinyPipeline(4);
    c.training.evalEvery = 0;
    const QString project = writeConfig(dir.path(), c);
    ms::MainWindow w;
    w.show();
    QVERIFY(!w.resumeRun());
    QVERIFY2(w.lastError().contains("no run to resume"), qPrintable(w.lastError()));
    QVERIFY(w.openProject(project));
    QSignalSpy finished(w.engineClient(), &ms::EngineClient::finished);
    const QString runDir = dir.path() + "/run";
    QVERIFY2(w.startRun(runDir), qPrintable(w.lastError()));
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, 120000);
    QVERIFY2(finished[0][0].toBool(), qPrintable(finished[0][1].toString()));
    const QVector<double> first = w.runData()->steps().loss;
    QCOMPARE(first.size(), 4);
    w.document()->edit("steps 8", [](ms::RunConfig& cfg) { cfg.training.steps = 8; });
    QVERIFY2(w.resumeRun(), qPrintable(w.lastError()));
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 2, 120000);
    QVERIFY2(finished[1][0].toBool(), qPrintable(finished[1][1].toString()));
    const ms::RunData* data = w.runData();
    QCOMPARE(data->info().startStep, 4);  // the engine resumed from the step-4 checkpoint
    QCOMPARE(data->steps().size(), 8);
    QCOMPARE(data->steps().step.back(), 8.0);
    for (int i = 0; i < 4; ++i) QCOMPARE(data->steps().loss[i], first[i]);
    QVERIFY(data->runEnd() && data->runEnd()->status == "ok" && data->runEnd()->step == 8);
    QTRY_COMPARE_WITH_TIMEOUT(w.runView()->lossPlot()->graph(0)->dataCount(), 8, 5000);
  }

  // Calibration: after a run, the plan's predicted step uses the per-layer times the run measured. Its step
  // time comes much closer to the measured one than the analytic model's (whose CPU figures are
  // placeholders); a config the calibration does not fit (recompute on) keeps the analytic times and says
  // why.
  void calibrationFromRunPredictsThisMachine() {
    QTemporaryDir dir;
    ms::RunConfig c = tinyPipeline(12);
    c.training.evalEvery = 0;
    c.parallel.microbatches = 4;
    c.training.batchSize = 16;
    const QString project = writeConfig(dir.path(), c);
    ms::MainWindow w;
    w.show();
    QVERIFY(!w.calibrateFromRun());  // no run yet
    QVERIFY(w.openProject(project));
    QVERIFY(waitForSnapshot(w));
    const double analytic = w.snapshot()->sim.stepTime;
    QSignalSpy finished(w.engineClient(), &ms::EngineClient::finished);
    QVERIFY2(w.startRun(dir.path() + "/run"), qPrintable(w.lastError()));
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, 120000);
    QVERIFY2(finished[0][0].toBool(), qPrintable(finished[0][1].toString()));
    std::vector<double> steps(w.runData()->steps().stepTime.begin() + 2, w.runData()->steps().stepTime.end());
    std::sort(steps.begin(), steps.end());
    const double measured = steps[steps.size() / 2];
    QVERIFY2(w.calibrateFromRun(), qPrintable(w.lastError()));
    QTRY_VERIFY_WITH_TIMEOUT(w.snapshot()->calibrated && !w.analyzer()->busy(), 10000);
    const double calibrated = w.snapshot()->sim.stepTime;
    const double before = std::abs(analytic - measured) / measured,
                 after = std::abs(calibrated - measured) / measured;
    qInfo("measured step %.4f s; predicted: analytic %.4f s (off %.0f%%), calibrated %.4f s (off %.0f%%)",
          measured, analytic, 100 * before, calibrated, 100 * after);
    QVERIFY2(after < before, qPrintable(QString("calibrated %1 vs analytic %2").arg(after).arg(before)));
    QVERIFY2(w.summaryText().contains("measured by"), qPrintable(w.summaryText()));
    // Another microbatch size still calibrates (times scale with samples); recompute does not.
    w.document()->edit("microbatches 2", [](ms::RunConfig& cfg) { cfg.parallel.microbatches = 2; });
    QVERIFY(waitForSnapshot(w));
    QVERIFY(w.snapshot()->calibrated);
    w.document()->edit("recompute", [](ms::RunConfig& cfg) { cfg.parallel.recompute = ms::Recompute::Full; });
    QVERIFY(waitForSnapshot(w));
    QVERIFY(!w.snapshot()->calibrated);
    QVERIFY2(w.snapshot()->calibrationNote.contains("recompute differs"),
             qPrintable(w.snapshot()->calibrationNote));
    w.document()->undoStack()->undo();
    w.clearCalibration();
    QTRY_VERIFY_WITH_TIMEOUT(!w.snapshot()->calibrated && !w.analyzer()->busy(), 10000);
  }

  // Many random edits, valid and invalid (layouts, schedules, mesh sizes, placements, batch shapes), then
  // undo of all of them: the studio never crashes, every snapshot either plans or names its error, and
  // undoing everything gives back the opened project.
  void randomEditsNeverBreakTheStudio() {
    ms::MainWindow w;
    w.show();
    QVERIFY(w.openProject(MS_SOURCE_DIR "/resources/examples/gpt-1b-8xa100.json"));
    const ms::RunConfig original = w.document()->config();
    QRandomGenerator rng(7);
    const ms::Schedule schedules[] = {ms::Schedule::GPipe, ms::Schedule::OneFOneB,
                                      ms::Schedule::Interleaved1F1B, ms::Schedule::ZbH1};
    int planned = 0, refused = 0;
    for (int i = 0; i < 150; ++i) {
      const int what = rng.bounded(8);
      w.document()->edit(QString("random edit %1").arg(i), [&](ms::RunConfig& c) {
        switch (what) {
          case 0:
            c.parallel.dp = 1 + rng.bounded(4);
            break;
          case 1:
            c.parallel.tp = 1 + rng.bounded(5);
            break;
          case 2:
            c.parallel.pp = 1 + rng.bounded(4);
            c.parallel.placement.clear();
            break;
          case 3:
            c.parallel.schedule = schedules[rng.bounded(4)];
            break;
          case 4:
            c.parallel.microbatches = 1 + rng.bounded(16);
            break;
          case 5:
            c.mesh.nodes.back().count = rng.bounded(10);
            break;  // 0 is invalid on purpose
          case 6:
            c.parallel.zero = rng.bounded(5);
            break;  // 4 is invalid on purpose
          case 7:
            c.training.batchSize = 8 * (1 + rng.bounded(32));
            break;
        }
      });
      if (i % 10 == 0) {
        QVERIFY(waitForSnapshot(w));
        const auto snap = w.snapshot();
        QVERIFY(snap->ok() || !snap->error.isEmpty());
        (snap->ok() ? planned : refused)++;
        if (snap->ok()) QCOMPARE(int(w.predictedTimeline()->data()->rows.size()), snap->plan->layout.world());
      }
    }
    QVERIFY2(planned > 0 && refused > 0,
             qPrintable(QString("%1 planned, %2 refused").arg(planned).arg(refused)));
    while (w.document()->undoStack()->canUndo()) w.document()->undoStack()->undo();
    QVERIFY(w.document()->config() == original);
    QVERIFY(!w.document()->isModified());
    QVERIFY(waitForSnapshot(w));
    QVERIFY(w.snapshot()->ok());
  }

  // While a re-plan is under way (held here, so no timing is involved) the plan views say they show the
  // previous plan and the status bar shows the analysis' phase; an edit that does not plan keeps the last
  // plan that did, marked; both clear when the current plan arrives.
  void planViewsMarkedOutdated() {
    ms::MainWindow w;
    w.show();
    QVERIFY(w.openProject(MS_SOURCE_DIR "/resources/examples/gpt-1b-8xa100.json"));
    QVERIFY(waitForSnapshot(w));
    QVERIFY(w.planOutdatedReason().isEmpty());
    w.analyzer()->setPaused(true);
    w.document()->edit("microbatches 16", [](ms::RunConfig& c) { c.parallel.microbatches = 16; });
    QTRY_VERIFY_WITH_TIMEOUT(!w.planOutdatedReason().isEmpty(), 10000);
    QVERIFY2(w.planOutdatedReason().contains("re-planning"), qPrintable(w.planOutdatedReason()));
    QCOMPARE(w.predictedTimeline()->outdatedReason(), w.planOutdatedReason());
    QCOMPARE(w.memoryView()->outdatedReason(), w.planOutdatedReason());
    QVERIFY2(w.planProgressText().startsWith("Planning: "), qPrintable(w.planProgressText()));
    w.analyzer()->setPaused(false);
    QVERIFY(waitForSnapshot(w));
    QVERIFY(w.planOutdatedReason().isEmpty());
    QVERIFY(w.predictedTimeline()->outdatedReason().isEmpty());
    QVERIFY(w.memoryView()->outdatedReason().isEmpty());
    QVERIFY(w.planProgressText().isEmpty());
    QCOMPARE(w.snapshot()->config.parallel.microbatches, 16);

    w.document()->edit("tp 3", [](ms::RunConfig& c) { c.parallel.tp = 3; });
    QVERIFY(waitForSnapshot(w));
    QVERIFY(!w.snapshot()->ok());
    QVERIFY2(w.planOutdatedReason().contains("do not make a plan"), qPrintable(w.planOutdatedReason()));
    QCOMPARE(int(w.predictedTimeline()->data()->rows.size()), 8);  // the last plan that built, marked
    QCOMPARE(w.predictedTimeline()->outdatedReason(), w.planOutdatedReason());
    w.document()->undoStack()->undo();
    QVERIFY(waitForSnapshot(w));
    QVERIFY(w.planOutdatedReason().isEmpty());
  }

  // Messages about an edit (a drop placed, an auto-plan applied) hold for the state they describe: undo and
  // a new project take them away.
  void transientMessagesExpire() {
    ms::MainWindow w;
    w.show();
    QVERIFY(w.openProject(MS_SOURCE_DIR "/resources/examples/gpt-1b-8xa100.json"));
    QVERIFY(waitForSnapshot(w));
    ms::MeshCanvas* canvas = w.meshCanvas();
    // block.3 (layer 4) onto stage 1 (rank 4's device).
    QVERIFY(canvas->dropLayers(4, 4, 4));
    QVERIFY(canvas->messageVisible());
    QVERIFY2(canvas->messageText().startsWith("Place layers block.3 on stage 1"),
             qPrintable(canvas->messageText()));
    w.document()->undoStack()->undo();
    QVERIFY(!canvas->messageVisible());

    QVERIFY(w.layerPalette()->computeAutoPlan());
    QVERIFY(w.layerPalette()->applyCandidate(0));
    QVERIFY2(w.layerPalette()->message().startsWith("Applied dp"), qPrintable(w.layerPalette()->message()));
    w.document()->undoStack()->undo();
    QVERIFY2(w.layerPalette()->message().isEmpty(), qPrintable(w.layerPalette()->message()));
    w.document()->undoStack()->redo();
    QVERIFY(w.layerPalette()->message().isEmpty());  // the message was about the apply, not about its redo

    QVERIFY(canvas->dropLayers(4, 4, 4));
    QVERIFY(canvas->messageVisible());
    w.setUnsavedChangesHandler([] { return QMessageBox::Discard; });
    QVERIFY(w.newProject("gpt"));
    QVERIFY(!canvas->messageVisible());
  }

  // The mesh view names every group a rank talks in on hover, expert parallelism's included: Mixtral 8x7B
  // on 64 H100 as tp 8 x dp 8 with ep 4 (rank = dp * 8 + tp; ep is the inner part of dp).
  void meshGroupsOnHover() {
    QTemporaryDir dir;
    QFile in(MS_SOURCE_DIR "/resources/examples/mixtral-8x7b-64xh100.json");
    QVERIFY(in.open(QIODevice::ReadOnly));
    nlohmann::json c = nlohmann::json::parse(in.readAll().toStdString());
    c["parallel"] = {{"tp", 8}, {"dp", 8}, {"ep", 4}, {"recompute", "full"}, {"precision", "bf16"}};
    const QString path = dir.path() + "/mixtral-ep.json";
    QFile out(path);
    QVERIFY(out.open(QIODevice::WriteOnly));
    out.write(QByteArray::fromStdString(c.dump()));
    out.close();
    ms::MainWindow w;
    QVERIFY2(w.openProject(path), qPrintable(w.lastError()));
    const QString tip = w.meshCanvas()->tileToolTip(9);  // rank 9: tp 1 of dp 1
    QVERIFY2(tip.contains("Rank 9: stage 0, tp 1, dp 1"), qPrintable(tip));
    // How the planner costs the device: the catalog H100's kernel model (792.1 of 989.4 TFLOP/s at its MAMF).
    QVERIFY2(
        tip.contains("costed by shape: GEMMs up to 792.4 TFLOP/s bf16 in waves over 132 SMs (MAMF 792.1"),
        qPrintable(tip));
    QVERIFY2(tip.contains("tensor-parallel group: 8, 9, 10, 11, 12, 13, … (8 ranks)"), qPrintable(tip));
    QVERIFY2(tip.contains("data-parallel group: 1, 9, 17, 25, 33, 41, … (8 ranks)"), qPrintable(tip));
    QVERIFY2(tip.contains("expert-parallel group (all-to-all): 1, 9, 17, 25; experts 2-3 of 8"),
             qPrintable(tip));
    QVERIFY2(tip.contains("the same experts' replicas: 9, 41"), qPrintable(tip));
    QVERIFY2(!tip.contains("pipeline:"), qPrintable(tip));
    // Context parallelism on the 405B template (16384 H100, seq 8192 here set to 32768): tp 8, cp 4, dp
    // 32, pp 16. Rank 13 = ((0 * 32 + 0) * 4 + 1) * 8 + 5: tp 5 of cp rank 1, which holds chunks 1 and 6
    // of 8 (4096 positions each).
    QFile big(MS_SOURCE_DIR "/resources/examples/llama3-405b-16k.json");
    QVERIFY(big.open(QIODevice::ReadOnly));
    nlohmann::json l = nlohmann::json::parse(big.readAll().toStdString());
    l["training"]["seq_len"] = 32768;
    l["model"]["context"] = 32768;
    l["parallel"] = {{"tp", 8},
                     {"cp", 4},
                     {"dp", 32},
                     {"pp", 16},
                     {"microbatches", 32},
                     {"zero", 1},
                     {"precision", "bf16"},
                     {"recompute", "full"}};
    const QString longPath = dir.path() + "/llama-cp.json";
    QFile longOut(longPath);
    QVERIFY(longOut.open(QIODevice::WriteOnly));
    longOut.write(QByteArray::fromStdString(l.dump()));
    longOut.close();
    QVERIFY2(w.openProject(longPath), qPrintable(w.lastError()));
    const QString cpTip = w.meshCanvas()->tileToolTip(13);
    QVERIFY2(cpTip.contains("Rank 13: stage 0, tp 5, dp 0, cp 1"), qPrintable(cpTip));
    QVERIFY2(
        cpTip.contains("context-parallel ring: 5, 13, 21, 29; positions 4096-8191 and 24576-28671 of 32768"),
        qPrintable(cpTip));
    QVERIFY2(cpTip.contains("data-parallel group: 13, 45, 77, 109, 141, 173, … (32 ranks)"),
             qPrintable(cpTip));
    QVERIFY2(cpTip.contains("gradient group (dp x cp): 5, 13, 21, 29, 37, 45, … (128 ranks)"),
             qPrintable(cpTip));
  }

  // Memory is in binary units everywhere (never decimal GB or MB), with the unit in the text or its label;
  // MFU is stated only where the devices have a published peak.
  void oneUnitConvention() {
    // A figure in decimal units ("80.0 GB"); names such as "A100 80GB" and link speeds ("50 GB/s") are not.
    static const QRegularExpression decimal(QStringLiteral("\\d\\s(GB|MB|KB|kB|TB)\\b(?!/s)"));
    ms::MainWindow w;
    w.show();
    QVERIFY(w.openProject(MS_SOURCE_DIR "/resources/examples/gpt-1b-8xa100.json"));
    QVERIFY(waitForSnapshot(w));
    QStringList texts{w.summaryText(), w.memoryView()->plot()->yAxis->label()};
    for (int d = 0; d < 8; ++d) texts << w.meshCanvas()->tileToolTip(d);
    QVERIFY(w.layerPalette()->computeAutoPlan());
    for (const ms::PlanCandidate& c : w.layerPalette()->autoPlanCandidates())
      texts << ms::LayerPalette::candidateRow(c).join(" ");
    for (const QString& t : texts) QVERIFY2(!decimal.match(t).hasMatch(), qPrintable(t));
    QVERIFY2(w.summaryText().contains(QRegularExpression("\\d GiB of 74.5 GiB")),
             qPrintable(w.summaryText()));
    QVERIFY2(w.meshCanvas()->tileToolTip(0).contains("of 74.5 GiB"),
             qPrintable(w.meshCanvas()->tileToolTip(0)));
    QCOMPARE(w.memoryView()->plot()->yAxis->label(), QString("memory (GiB)"));
    QVERIFY2(w.summaryText().contains("MFU "), qPrintable(w.summaryText()));  // A100s: a datasheet peak
    // A layer's forward FLOPs cell tells its predicted time kernel by kernel (the A100's kernel model).
    const QString kernels =
        w.layerPalette()->model()->index(2, ms::LayerModel::ForwardGflop).data(Qt::ToolTipRole).toString();
    QVERIFY2(
        kernels.contains(QRegularExpression("forward by kernel:\n  GEMM \\d+ x \\d+ x \\d+: [0-9.e-]+ ms, "
                                            "\\d+% of peak")),
        qPrintable(kernels));
    QVERIFY2(kernels.contains("attention: ") && kernels.contains("elementwise passes: "),
             qPrintable(kernels));

    QVERIFY(w.openProject(MS_SOURCE_DIR "/resources/examples/gpt-fortunes.json"));
    QVERIFY(waitForSnapshot(w));
    QVERIFY2(!w.summaryText().contains("MFU"), qPrintable(w.summaryText()));  // the CPU has no published peak
    QVERIFY2(
        w.summaryText().contains(QRegularExpression("fullest device \\d+ MiB of 24.0 GiB \\(0.\\d\\d%\\)")),
        qPrintable(w.summaryText()));
  }

  // The mesh shows exactly the ranks the plan has: pp 2 on a one-device mesh does not plan, so no tile claims
  // a rank (it used to read "ranks 0,1 · stage 0" beside a legend listing stage 1) and the legend says why.
  void meshShowsOnlyTheRanksThePlanHas() {
    ms::RunConfig c = tinyPipeline(2);
    c.mesh.nodes = {ms::NodeConfig{"node0", "cpu", 1}};
    ms::MainWindow w;
    w.show();
    w.document()->reset(c);
    QVERIFY(waitForSnapshot(w));
    QVERIFY(!w.snapshot()->ok());
    QVERIFY2(w.meshCanvas()->tileLabel(0).contains("no layout"), qPrintable(w.meshCanvas()->tileLabel(0)));
    QVERIFY(w.meshCanvas()->stagesOfDevice(0).empty());
    QVERIFY2(w.meshCanvas()->legendText().contains("No rank layout"),
             qPrintable(w.meshCanvas()->legendText()));
    QVERIFY(!w.meshCanvas()->legendText().contains("stage 1"));
    // One device more and both stages are there, a rank each.
    w.document()->edit("a second device", [](ms::RunConfig& cfg) { cfg.mesh.nodes[0].count = 2; });
    QVERIFY(waitForSnapshot(w));
    QVERIFY(w.snapshot()->ok());
    QVERIFY2(w.meshCanvas()->tileLabel(1).startsWith("rank 1 · stage 1"),
             qPrintable(w.meshCanvas()->tileLabel(1)));
    QVERIFY(w.meshCanvas()->legendText().contains("stage 1: b1, head"));
  }

  // Ctrl+Z with the focus in an inspector field undoes the project edit (the field wrote it as it was typed),
  // not only the field's text; Ctrl+Shift+Z redoes it.
  void undoFromAFocusedField() {
    ms::MainWindow w;
    w.show();
    QVERIFY(QTest::qWaitForWindowActive(&w));
    QVERIFY(w.openProject(MS_SOURCE_DIR "/resources/examples/gpt-1b-8xa100.json"));
    auto* spin = qobject_cast<QSpinBox*>(w.inspector()->editorFor("/parallel/microbatches"));
    QVERIFY(spin);
    spin->setFocus();
    QTRY_VERIFY(spin->hasFocus());
    spin->selectAll();
    QTest::keyClicks(spin, "12");
    QCOMPARE(w.document()->config().parallel.microbatches, 12);
    QVERIFY(w.document()->isModified());
    QTest::keySequence(&w, QKeySequence::Undo);
    QVERIFY2(w.document()->config().parallel.microbatches == 8,
             qPrintable(QString::number(w.document()->config().parallel.microbatches)));
    QCOMPARE(spin->value(), 8);
    QVERIFY(!w.document()->isModified());
    QTest::keySequence(&w, QKeySequence::Redo);
    QCOMPARE(w.document()->config().parallel.microbatches, 12);
  }

  // Runs of the built-in examples go to the user's data folder, never into the source tree; a project of
  // one's own keeps its runs beside it; file dialogs start in the project's folder.
  void runFoldersAndDialogs() {
    QTemporaryDir dir;
    ms::MainWindow w;
    QVERIFY(w.openProject(MS_SOURCE_DIR "/resources/examples/gpt-fortunes.json"));
    const QString data = QStandardPaths::writableLocation(QStandardPaths::AppDataLocation);
    QVERIFY2(w.defaultRunDir().startsWith(data + "/runs/gpt-fortunes-"), qPrintable(w.defaultRunDir()));
    QVERIFY(!w.defaultRunDir().startsWith(MS_SOURCE_DIR));
    QCOMPARE(w.dialogFolder(), QFileInfo(MS_SOURCE_DIR "/resources/examples").absoluteFilePath());
    QVERIFY(w.saveProjectAs(dir.path() + "/mine.json"));
    QVERIFY2(w.defaultRunDir().startsWith(dir.path() + "/runs/gpt-fortunes-"), qPrintable(w.defaultRunDir()));
    QCOMPARE(w.dialogFolder(), dir.path());
  }

  // The Run tab takes the width: the docks fold away while it is shown and come back as they were.
  void runTabFoldsThePanels() {
    ms::MainWindow w;
    w.show();
    QVERIFY(QTest::qWaitForWindowExposed(&w));
    auto* layers = w.findChild<QDockWidget*>("layersDock");
    auto* inspector = w.findChild<QDockWidget*>("inspectorDock");
    QVERIFY(layers && inspector);
    inspector->hide();  // the person closed one of them
    w.tabs()->setCurrentIndex(1);
    QVERIFY(!layers->isVisible() && !inspector->isVisible());
    w.tabs()->setCurrentIndex(0);
    QVERIFY(layers->isVisible());
    QVERIFY(!inspector->isVisible());  // as it was
  }

  // Tiles are readable at every template's default zoom: text in the UI font (never smaller), as many lines
  // as fit, or none (node names and tooltips then) when a whole cluster is in view.
  void meshTextReadableAtDefaultZoom() {
    ms::MainWindow w;
    w.resize(1366, 768);
    w.show();
    QVERIFY(QTest::qWaitForWindowExposed(&w));
    for (const ms::ProjectTemplate& t : ms::projectTemplates()) {
      QVERIFY(w.newProject(t.key));
      QVERIFY(waitForSnapshot(w));
      QVERIFY2(w.meshCanvas()->fitsView(), qPrintable(t.key));
      const int devices = w.meshCanvas()->meshGeometry().deviceCount();
      const int lines = w.meshCanvas()->tileLinesShown();
      if (devices <= 8) QVERIFY2(lines >= 2, qPrintable(t.key + QString(": %1 lines").arg(lines)));
      if (devices >= 1024) QCOMPARE(lines, 0);
    }
  }

  // The parameter-server example: its workers on the mesh, its predicted worker and server lanes and worker
  // memory, and no layer placement (the servers split the layers).
  void parameterServerProject() {
    ms::MainWindow w;
    w.show();
    QVERIFY2(w.newProject("mlp-ps"), qPrintable(w.lastError()));
    QVERIFY(waitForSnapshot(w));
    const auto snap = w.snapshot();
    QVERIFY2(snap->ok(), qPrintable(snap->error));
    QVERIFY(snap->ps.has_value());
    QCOMPARE(snap->ps->workers.size(), std::size_t(4));
    QCOMPARE(snap->ps->servers.size(), std::size_t(2));
    QCOMPARE(snap->memory.size(), std::size_t(4));
    QCOMPARE(snap->ps->workers[3].slowdown, 3.0);
    // Lanes: four workers, then two servers.
    QCOMPARE(snap->timeline.rows.size(), std::size_t(6));
    QCOMPARE(snap->timeline.rows[3].label, QString("worker 3 · dev 3"));
    QCOMPARE(snap->timeline.rows[4].label, QString("server 0 · node 0"));
    bool updates = false;
    for (const ms::TimelineSpan& sp : snap->timeline.rows[5].spans)
      updates = updates || sp.kind == ms::SpanKind::Optimizer;
    QVERIFY(updates);
    QCOMPARE(snap->sim.stepTime, snap->ps->stepTime);
    // Memory: a bar per worker, then one per server in its node's host memory (its shard, gradients and
    // optimizer state: SGD's momentum, one float a parameter).
    ms::MemoryView* memory = w.memoryView();
    QCOMPARE(memory->barCount(), 6);
    QCOMPARE(memory->barLabel(3), QString("worker 3"));
    QCOMPARE(memory->barLabel(4), QString("server 0 (node0)"));
    const ms::PsServerPrediction& s1 = snap->ps->servers[1];
    QVERIFY(s1.params > 0);
    QCOMPARE(s1.optimizerBytes, 4 * s1.params);
    auto barValue = [&](ms::MemoryView::Category c, int bar) {
      return memory->bars(c)->data()->at(bar)->value * memory->unitBytes();
    };
    QVERIFY(std::abs(barValue(ms::MemoryView::Optimizer, 5) - s1.optimizerBytes) < 1e-6 * s1.optimizerBytes);
    QVERIFY(std::abs(barValue(ms::MemoryView::Parameters, 5) - s1.parameterBytes) < 1e-6 * s1.parameterBytes);
    QCOMPARE(barValue(ms::MemoryView::Activations, 5), 0.0);
    QVERIFY(s1.capacity > 0 && std::isfinite(s1.capacity));
    QVERIFY(!memory->rankShownAsOverflow(5));
    ms::MeshCanvas* mesh = w.meshCanvas();
    QVERIFY2(mesh->tileLabel(2).startsWith("worker 2"), qPrintable(mesh->tileLabel(2)));
    QVERIFY2(mesh->legendText().contains("parameter servers: 4 workers (async)"),
             qPrintable(mesh->legendText()));
    QVERIFY(!mesh->dropLayers(0, 0, 1));
    QVERIFY2(mesh->lastRefusal().contains("whole model"), qPrintable(mesh->lastRefusal()));
    // Servers placed by node, undoably; the placement lands in parallel.server_nodes.
    QVERIFY(mesh->addServer(0));
    QCOMPARE(w.document()->config().parallel.servers, 3);
    QCOMPARE(w.document()->config().parallel.serverNodes,
             (std::vector<std::string>{"node0", "node0", "node0"}));
    QVERIFY(w.document()->errors().empty());
    QVERIFY2(mesh->legendText().contains("servers 0, 1, 2 on node0"), qPrintable(mesh->legendText()));
    w.document()->undoStack()->undo();
    QCOMPARE(w.document()->config().parallel.servers, 2);
    QVERIFY(mesh->removeServer(0));
    QCOMPARE(w.document()->config().parallel.servers, 1);
    QVERIFY(!mesh->removeServer(0));
    QVERIFY2(mesh->lastRefusal().contains("at least one server"), qPrintable(mesh->lastRefusal()));
  }

  // A project that fails validation cannot run; the reason is shown, nothing starts.
  void invalidProjectDoesNotRun() {
    ms::MainWindow w;
    QVERIFY(w.openProject(MS_SOURCE_DIR "/resources/examples/gpt-fortunes.json"));
    w.document()->edit("tp 3", [](ms::RunConfig& c) { c.parallel.tp = 3; });
    QVERIFY(!w.startRun(QDir::tempPath() + "/never"));
    QVERIFY(!w.engineClient()->isRunning());
    QVERIFY2(w.lastError().contains("/parallel/tp"), qPrintable(w.lastError()));
  }
};

QTEST_MAIN(TestStudio)
#include "tst_studio.moc"
