// Screenshots; see screenshots.h.
#include "screenshots.h"

#include <QApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QTabWidget>
#include <QTemporaryDir>
#include <cstdio>

#include "ui/models/placement.h"
#include "ui/models/project_document.h"
#include "ui/run/engine_client.h"
#include "ui/views/main_window.h"
#include "ui/views/memory_view.h"
#include "ui/views/timeline_view.h"

namespace ms {

namespace {

// Runs the event loop until `done` or the timeout; false on timeout.
template <typename F>
bool waitFor(F done, int timeoutMs) {
  QElapsedTimer t;
  t.start();
  while (!done()) {
    if (t.elapsed() > timeoutMs) return false;
    QApplication::processEvents(QEventLoop::AllEvents, 50);
  }
  return true;
}

void settle(int ms) {
  QElapsedTimer t;
  t.start();
  while (t.elapsed() < ms) QApplication::processEvents(QEventLoop::AllEvents, 20);
}

bool save(QWidget* w, const QString& path) {
  const bool ok = w->grab().save(path);
  std::fprintf(stderr, "%s %s\n", ok ? "wrote" : "FAILED to write", qPrintable(path));
  return ok;
}

bool planReady(MainWindow& w) {
  return w.snapshot() && !w.analyzer()->busy() && w.snapshot()->config == w.document()->config();
}

}  // namespace

int takeScreenshots(const QString& dir, const QString& sourceDir) {
  if (!QDir().mkpath(dir)) {
    std::fprintf(stderr, "meshstudio --screenshots: cannot create %s\n", qPrintable(dir));
    return 1;
  }
  MainWindow w;
  w.setUnsavedChangesHandler([] { return QMessageBox::Discard; });
  w.resize(1600, 1000);
  w.show();
  if (!w.openProject(sourceDir + "/resources/examples/gpt-1b-8xa100.json")) {
    std::fprintf(stderr, "meshstudio --screenshots: %s\n", qPrintable(w.lastError()));
    return 1;
  }
  // What a drop of block.11 on a stage-1 GPU does: stage 0 also holds the embedding, so it gives a block
  // away.
  auto placed = placeLayers(w.document()->config(), 12, 12, 1);
  if (!placed) {
    std::fprintf(stderr, "meshstudio --screenshots: %s\n", placed.message().c_str());
    return 1;
  }
  w.document()->setConfig(QStringLiteral("Place block.11 on stage 1"), *placed);
  if (!waitFor([&] { return planReady(w); }, 20000)) return 1;
  w.tabs()->setCurrentIndex(0);
  settle(500);
  bool ok = save(&w, dir + "/plan.png");
  ok = save(w.predictedTimeline(), dir + "/timeline.png") && ok;
  ok = save(w.memoryView(), dir + "/memory.png") && ok;

  // A cluster: GPT-3 175B on 16384 H100s, stage 1 listed rank by rank in the timeline.
  if (!w.newProject(QStringLiteral("gpt3-16k")) || !waitFor([&] { return planReady(w); }, 120000)) return 1;
  w.predictedTimeline()->setStageExpanded(1, true);
  settle(500);
  ok = save(&w, dir + "/plan-16k.png") && ok;

  // A live run: 2 pipeline stages on this machine's CPUs.
  QTemporaryDir work;
  RunConfig run;
  run.name = "fortunes-pp2";
  run.device = DeviceChoice::Cpu;
  run.model.layers = 4;
  run.model.width = 64;
  run.model.heads = 4;
  run.model.context = 64;
  run.data.files = {"/usr/share/games/fortunes/*.u8"};
  run.mesh.nodes = {NodeConfig{"node0", "cpu", 2}};
  run.parallel.pp = 2;
  run.parallel.microbatches = 4;
  run.optimizer.lr = 2e-3;
  run.training.steps = 120;
  run.training.batchSize = 16;
  run.training.seqLen = 64;
  run.training.warmupSteps = 60;  // as the examples: no early loss spike (tst_examples)
  run.training.evalEvery = 20;
  run.training.evalBatches = 8;
  run.training.checkpointEvery = 0;
  run.training.threads = 1;
  const QString project = work.path() + "/fortunes-pp2.json";
  if (Status s = saveRunConfig(run, project.toStdString()); !s || !w.openProject(project)) {
    std::fprintf(stderr, "meshstudio --screenshots: cannot open the run project\n");
    return 1;
  }
  if (!waitFor([&] { return planReady(w); }, 20000)) return 1;
  bool finished = false;
  QObject::connect(w.engineClient(), &EngineClient::finished, &w, [&finished] { finished = true; });
  if (!w.startRun(work.path() + "/run")) {
    std::fprintf(stderr, "meshstudio --screenshots: %s\n", qPrintable(w.lastError()));
    return 1;
  }
  if (!waitFor([&] { return finished; }, 300000)) {
    std::fprintf(stderr, "meshstudio --screenshots: the run did not finish in 5 minutes\n");
    return 1;
  }
  settle(600);  // the run view redraws on its timer
  w.tabs()->setCurrentIndex(1);
  settle(300);
  ok = save(&w, dir + "/run.png") && ok;
  // The dashboard exported as it is on screen (File > Export > Run Dashboard): vector PDF.
  const bool pdf = w.exportDashboard(dir + "/run-dashboard.pdf", QStringLiteral("pdf"));
  std::fprintf(stderr, "%s %s\n", pdf ? "wrote" : "FAILED to write", qPrintable(dir + "/run-dashboard.pdf"));
  return ok && pdf ? 0 : 1;
}

}  // namespace ms
