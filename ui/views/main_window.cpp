// MainWindow; see main_window.h.
#include "ui/views/main_window.h"

#include <QAbstractSpinBox>
#include <QAction>
#include <QApplication>
#include <QCloseEvent>
#include <QComboBox>
#include <QDir>
#include <QDockWidget>
#include <QFileDialog>
#include <QFileInfo>
#include <QInputDialog>
#include <QKeyEvent>
#include <QLabel>
#include <QLineEdit>
#include <QMenuBar>
#include <QProgressBar>
#include <QScreen>
#include <QSplitter>
#include <QStatusBar>
#include <QTabWidget>
#include <QTimer>
#include <QToolBar>
#include <QVBoxLayout>

#include "ui/models/project_document.h"
#include "ui/models/units.h"
#include "ui/run/calibrate_job.h"
#include "ui/run/engine_client.h"
#include "ui/run/run_data.h"
#include "ui/views/compare_view.h"
#include "ui/views/inspector.h"
#include "ui/views/layer_palette.h"
#include "ui/views/memory_view.h"
#include "ui/views/mesh_canvas.h"
#include "ui/views/mesh_panel.h"
#include "ui/views/run_view.h"
#include "ui/views/timeline_view.h"

namespace ms {

namespace {

constexpr int kProgressTickMs = 250;
// Pixels: the starting widths of the Layers dock (its table scrolls sideways) and of the Inspector (label
// and editor of its longest row).
constexpr int kLayersDockWidth = 210, kInspectorDockWidth = 260;

// A widget that edits text of its own (and so has an undo of its own for Ctrl+Z).
bool editsText(QObject* o) {
  return qobject_cast<QLineEdit*>(o) || qobject_cast<QAbstractSpinBox*>(o) || qobject_cast<QComboBox*>(o) ||
         (o && qobject_cast<QAbstractSpinBox*>(o->parent()));
}

}  // namespace

MainWindow::MainWindow(QWidget* parent) : QMainWindow(parent) {
  setObjectName(QStringLiteral("MainWindow"));
  m_doc = new ProjectDocument(this);
  m_analyzer = new PlanAnalyzer(this);
  m_runAnalyzer = new PlanAnalyzer(this);
  m_client = new EngineClient(this);
  m_calibrateJob = new CalibrateJob(this);

  // Plan tab: summary line, the mesh (toolbar, canvas, legend) above, predicted timeline and memory bars
  // below.
  auto* planTab = new QWidget;
  auto* planLayout = new QVBoxLayout(planTab);
  planLayout->setContentsMargins(4, 4, 4, 4);
  m_summary = new QLabel(tr("No project open"));
  m_summary->setObjectName(QStringLiteral("planSummary"));
  m_summary->setWordWrap(true);
  m_summary->setTextInteractionFlags(Qt::TextSelectableByMouse);
  auto* meshPanel = new MeshPanel(m_doc);
  m_canvas = meshPanel->canvas();
  m_predicted = new TimelineView;
  m_predicted->setTitle(tr("Predicted step"));
  m_memory = new MemoryView;
  // Three rows sharing the full width: the timeline needs it more than anything else.
  auto* planSplit = new QSplitter(Qt::Vertical);
  planSplit->addWidget(meshPanel);
  planSplit->addWidget(m_predicted);
  planSplit->addWidget(m_memory);
  planSplit->setSizes({330, 300, 300});
  planLayout->addWidget(m_summary);
  planLayout->addWidget(planSplit, 1);

  // Run tab: status banner and the Run dashboard.
  auto* runTab = new QWidget;
  auto* runLayout = new QVBoxLayout(runTab);
  runLayout->setContentsMargins(4, 4, 4, 4);
  m_runBanner = new QLabel(tr("No run yet: Run > Run starts the plan on this machine."));
  m_runBanner->setObjectName(QStringLiteral("runBanner"));
  m_runBanner->setWordWrap(true);
  m_runBanner->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_runView = new RunView(nullptr);
  m_runView->setClient(m_client);
  runLayout->addWidget(m_runBanner);
  runLayout->addWidget(m_runView, 1);

  m_tabs = new QTabWidget;
  m_tabs->addTab(planTab, tr("Plan"));
  m_tabs->addTab(runTab, tr("Run"));
  setCentralWidget(m_tabs);

  m_palette = new LayerPalette(m_doc);
  m_paletteDock = new QDockWidget(tr("Layers"), this);
  m_paletteDock->setObjectName(QStringLiteral("layersDock"));
  m_paletteDock->setWidget(m_palette);
  addDockWidget(Qt::LeftDockWidgetArea, m_paletteDock);
  m_inspector = new Inspector(m_doc);
  m_inspectorDock = new QDockWidget(tr("Inspector"), this);
  m_inspectorDock->setObjectName(QStringLiteral("inspectorDock"));
  m_inspectorDock->setWidget(m_inspector);
  addDockWidget(Qt::RightDockWidgetArea, m_inspectorDock);
  // The side panels start narrow and the mesh takes the width (on a 1366-pixel laptop screen a cluster's
  // tiles keep two lines of text); the person drags them wider, and the layout is remembered as they leave
  // it.
  resizeDocks({m_paletteDock, m_inspectorDock}, {kLayersDockWidth, kInspectorDockWidth}, Qt::Horizontal);

  // The analysis' progress, shown when a re-plan takes long enough to be noticed.
  m_progressLabel = new QLabel;
  m_progressLabel->setObjectName(QStringLiteral("planProgress"));
  m_progressBar = new QProgressBar;
  m_progressBar->setRange(0, static_cast<int>(AnalysisPhase::NUM_PHASES));
  m_progressBar->setMaximumWidth(160);
  m_progressBar->setTextVisible(false);
  statusBar()->addPermanentWidget(m_progressLabel);
  statusBar()->addPermanentWidget(m_progressBar);
  m_progressLabel->hide();
  m_progressBar->hide();
  m_outdatedTimer = new QTimer(this);
  m_outdatedTimer->setSingleShot(true);
  m_outdatedTimer->setInterval(kOutdatedAfterMs);
  connect(m_outdatedTimer, &QTimer::timeout, this, [this] {
    if (!m_analyzer->busy()) return;
    if (m_outdatedReason.isEmpty()) setPlanOutdated(tr("re-planning after the last change…"));
    m_progressLabel->show();
    m_progressBar->show();
    m_progressTimer->start();
    updatePlanProgress();
  });
  m_progressTimer = new QTimer(this);
  m_progressTimer->setInterval(kProgressTickMs);
  connect(m_progressTimer, &QTimer::timeout, this, &MainWindow::updatePlanProgress);
  connect(m_analyzer, &PlanAnalyzer::progress, this, [this](AnalysisPhase phase, int ranks) {
    m_phase = phase;
    m_phaseRanks = ranks;
    if (m_progressLabel->isVisible()) updatePlanProgress();
  });

  connect(m_doc, &ProjectDocument::configChanged, this, &MainWindow::onConfigChanged);
  connect(m_doc, &ProjectDocument::fileChanged, this, &MainWindow::updateTitle);
  connect(m_analyzer, &PlanAnalyzer::ready, this, &MainWindow::onSnapshot);
  connect(m_runAnalyzer, &PlanAnalyzer::ready, this,
          [this](std::shared_ptr<const PlanSnapshot> snapshot) { m_runView->setPlan(std::move(snapshot)); });
  connect(m_canvas, &MeshCanvas::dropRefused, this, [this](const QString& reason) {
    statusBar()->showMessage(tr("Drop refused: %1").arg(reason), 10000);
  });
  connect(m_client, &EngineClient::finished, this, &MainWindow::onRunFinished);
  connect(m_client, &EngineClient::started, this, [this] {
    m_runBanner->setText(tr("Running: %1").arg(m_client->runDir()));
    m_runBanner->setStyleSheet(QString());
  });
  connect(m_tabs, &QTabWidget::currentChanged, this, &MainWindow::onTabChanged);
  // Ctrl+Z and Ctrl+Shift+Z undo and redo project edits wherever the focus is (see eventFilter).
  qApp->installEventFilter(this);

  buildMenus();
  // A default size that fits the screen it opens on (1366 x 768 laptops included).
  QSize size(1500, 950);
  if (const QScreen* screen = QGuiApplication::primaryScreen())
    size = size.boundedTo(screen->availableSize() * 0.95);
  resize(size);
  m_doc->reset(RunConfig{});  // a valid empty project until one is opened
  updateTitle();
}

MainWindow::~MainWindow() {
  // The engine client stops its run in its own destructor; the analyzer waits for its worker.
  qApp->removeEventFilter(this);
  disconnect(m_client, nullptr, this, nullptr);
  disconnect(m_calibrateJob, nullptr, this, nullptr);  // its destructor ends a calibration still going
}

TimelineView* MainWindow::runPredictedTimeline() const {
  return m_runView->predictedTimeline();
}

TimelineView* MainWindow::measuredTimeline() const {
  return m_runView->measuredTimeline();
}

bool MainWindow::eventFilter(QObject* watched, QEvent* event) {
  // A focused field would take Ctrl+Z for its own text. The fields write every change to the document as it
  // is typed (the field has committed), so the project's undo is what the person means: let the shortcut
  // reach the Edit menu's action instead.
  if (event->type() == QEvent::ShortcutOverride && editsText(watched)) {
    auto* key = static_cast<QKeyEvent*>(event);
    auto* widget = qobject_cast<QWidget*>(watched);
    if (widget && widget->window() == this &&
        (key->matches(QKeySequence::Undo) || key->matches(QKeySequence::Redo))) {
      event->ignore();
      return true;
    }
  }
  return QMainWindow::eventFilter(watched, event);
}

void MainWindow::onTabChanged(int index) {
  // The Run tab wants the width: the docks fold away while it is shown and come back on the Plan tab as they
  // were.
  if (index == 1) {
    m_planDockState = saveState();
    m_paletteDock->hide();
    m_inspectorDock->hide();
  } else if (!m_planDockState.isEmpty()) {
    restoreState(m_planDockState);
    m_planDockState.clear();
  }
}

void MainWindow::buildMenus() {
  QMenu* file = menuBar()->addMenu(tr("&File"));
  QMenu* newMenu = file->addMenu(tr("&New"));
  for (const ProjectTemplate& t : projectTemplates()) {
    QAction* a = newMenu->addAction(t.title, this, [this, key = t.key] { newProject(key); });
    a->setStatusTip(t.description);
    if (t.key == QLatin1String("gpt")) a->setShortcut(QKeySequence::New);
  }
  newMenu->addSeparator();
  newMenu
      ->addAction(tr("From a &Hugging Face config.json..."), this,
                  [this] {
                    const QString path = QFileDialog::getOpenFileName(
                        this, tr("Hugging Face model config"), dialogFolder(), tr("Model configs (*.json)"));
                    if (!path.isEmpty()) newProjectFromHfConfig(path);
                  })
      ->setStatusTip(
          tr("The model of a Hugging Face config.json (GPT-2, Llama, Mistral, Qwen2) on this project's "
             "mesh and settings"));
  file->addAction(tr("&Open..."), QKeySequence::Open, this, [this] {
    const QString path =
        QFileDialog::getOpenFileName(this, tr("Open project"), dialogFolder(), tr("Run configs (*.json)"));
    if (!path.isEmpty()) openProject(path);
  });
  m_recentMenu = file->addMenu(tr("Open &Recent"));
  updateRecentMenu();
  file->addAction(tr("&Save"), QKeySequence::Save, this, [this] { saveProject(); });
  file->addAction(tr("Save &As..."), QKeySequence::SaveAs, this, [this] { chooseSaveAs(); });
  file->addSeparator();
  file->addAction(tr("Open Run &Folder..."), QKeySequence(tr("Ctrl+Shift+O")), this, [this] {
    const QString dir = QFileDialog::getExistingDirectory(
        this, tr("Open run folder"), m_lastRunDir.isEmpty() ? dialogFolder() : m_lastRunDir);
    if (!dir.isEmpty()) openRunFolder(dir);
  });
  addTraceImportAction(file);
  QMenu* exportMenu = file->addMenu(tr("&Export"));
  exportMenu->addAction(
      tr("Launch Files (config, mpirun, Slurm)..."), QKeySequence(tr("Ctrl+E")), this, [this] {
        const QString dir = QFileDialog::getExistingDirectory(this, tr("Export into folder"), dialogFolder());
        if (!dir.isEmpty()) exportLaunchFiles(dir);
      });
  exportMenu->addAction(tr("Run &Dashboard (PDF, SVG, PNG)..."), this, &MainWindow::chooseDashboardExport);
  exportMenu->addAction(tr("Measured Timeline as Chrome Trace..."), this, [this] {
    const QString path = QFileDialog::getSaveFileName(
        this, tr("Chrome trace"), dialogFolder() + QStringLiteral("/trace.json"), tr("Trace JSON (*.json)"));
    if (!path.isEmpty()) exportTrace(path, true);
  });
  exportMenu->addAction(tr("Predicted Timeline as Chrome Trace..."), this, [this] {
    const QString path = QFileDialog::getSaveFileName(this, tr("Chrome trace"),
                                                      dialogFolder() + QStringLiteral("/predicted.json"),
                                                      tr("Trace JSON (*.json)"));
    if (!path.isEmpty()) exportTrace(path, false);
  });
  exportMenu->addAction(tr("Plots as PNG..."), this, [this] {
    bool ok = false;
    const int dpi = QInputDialog::getInt(this, tr("Plots as PNG"), tr("Resolution (dots per inch):"), 300, 72,
                                         1200, 1, &ok);
    if (!ok) return;
    const QString dir = QFileDialog::getExistingDirectory(this, tr("Save plots into folder"), dialogFolder());
    if (!dir.isEmpty()) exportPlots(dir, QStringLiteral("png"), dpi);
  });
  exportMenu->addAction(tr("Plots as PDF..."), this, [this] {
    const QString dir = QFileDialog::getExistingDirectory(this, tr("Save plots into folder"), dialogFolder());
    if (!dir.isEmpty()) exportPlots(dir, QStringLiteral("pdf"));
  });
  addFrameworkActions(file, exportMenu);
  file->addSeparator();
  file->addAction(tr("&Quit"), QKeySequence::Quit, this, &QWidget::close);

  QMenu* edit = menuBar()->addMenu(tr("&Edit"));
  QAction* undo = m_doc->undoStack()->createUndoAction(this, tr("&Undo"));
  undo->setShortcut(QKeySequence::Undo);
  QAction* redo = m_doc->undoStack()->createRedoAction(this, tr("&Redo"));
  redo->setShortcut(QKeySequence::Redo);
  edit->addAction(undo);
  edit->addAction(redo);

  QMenu* view = menuBar()->addMenu(tr("&View"));
  view->addAction(tr("Zoom &In"), QKeySequence::ZoomIn, this, [this] {
    if (m_tabs->currentIndex() == 0) m_canvas->zoomIn();
  });
  view->addAction(tr("Zoom &Out"), QKeySequence::ZoomOut, this, [this] {
    if (m_tabs->currentIndex() == 0) m_canvas->zoomOut();
  });
  view->addAction(tr("&Fit All"), QKeySequence(tr("Ctrl+0")), this, [this] {
    m_canvas->fitAll();
    m_predicted->fitAll();
    measuredTimeline()->fitAll();
    runPredictedTimeline()->fitAll();
  });
  view->addAction(tr("&Plan"), QKeySequence(tr("Ctrl+1")), this, [this] { m_tabs->setCurrentIndex(0); });
  view->addAction(tr("&Run"), QKeySequence(tr("Ctrl+2")), this, [this] { m_tabs->setCurrentIndex(1); });
  view->addSeparator();
  view->addAction(m_paletteDock->toggleViewAction());
  view->addAction(m_inspectorDock->toggleViewAction());

  QMenu* run = menuBar()->addMenu(tr("&Run"));
  m_runAction = run->addAction(tr("&Run"), QKeySequence(tr("Ctrl+R")), this, [this] { startRun(); });
  m_resumeAction =
      run->addAction(tr("R&esume Last Run"), QKeySequence(tr("Ctrl+Shift+R")), this, [this] { resumeRun(); });
  m_resumeAction->setStatusTip(
      tr("Continue the last run from its newest checkpoint with the current settings"));
  m_stopAction = run->addAction(tr("&Stop"), QKeySequence(tr("Ctrl+.")), this, &MainWindow::stopRun);
  run->addSeparator();
  run->addAction(tr("&Calibrate Plan from Run"), this, [this] { calibrateFromRun(); })
      ->setStatusTip(tr("Predict with the per-layer compute times the last run measured on this machine"));
  run->addAction(tr("Use &Analytic Costs"), this, &MainWindow::clearCalibration);
  run->addAction(tr("&Fidelity of Last Run"), this, [this] { showFidelity(); })
      ->setStatusTip(
          tr("The last run's measured times and memory against the plan's prediction, worst first"));
  run->addAction(tr("Fidelity of a Run &Folder..."), this, [this] {
    const QString dir = QFileDialog::getExistingDirectory(this, tr("Open a run folder"), dialogFolder());
    if (!dir.isEmpty()) showFidelity(dir);
  });
  run->addSeparator();
  run->addAction(tr("C&ompare Runs..."), this,
                 [this] { compareRuns(m_lastRunDir.isEmpty() ? QStringList() : QStringList{m_lastRunDir}); })
      ->setStatusTip(tr("Loss against steps and wall time, and staleness, of finished runs side by side"));
  m_stopAction->setEnabled(false);
  buildToolsMenu();

  QToolBar* bar = addToolBar(tr("Main"));
  bar->setObjectName(QStringLiteral("mainToolBar"));
  bar->addAction(undo);
  bar->addAction(redo);
  bar->addSeparator();
  bar->addAction(m_runAction);
  bar->addAction(m_stopAction);
}

CompareView* MainWindow::compareRuns(const QStringList& dirs) {
  if (!m_compare) {
    m_compare = new CompareView(this);
    m_compare->setWindowFlag(Qt::Window);
  }
  QStringList problems;
  for (const QString& dir : dirs)
    if (Status s = m_compare->addRunFolder(dir); !s) problems << QString::fromStdString(s.message());
  if (!problems.isEmpty()) showError(tr("Compare runs"), problems.join('\n'));
  m_compare->show();
  m_compare->raise();
  return m_compare;
}

void MainWindow::showError(const QString& title, const QString& message) {
  m_lastError = message;
  statusBar()->showMessage(title + QStringLiteral(": ") + message.section('\n', 0, 0), 15000);
}

void MainWindow::closeEvent(QCloseEvent* event) {
  if (!maybeSave()) {
    event->ignore();
    return;
  }
  if (m_client->isRunning()) m_client->stop();
  event->accept();
}

void MainWindow::updateTitle() {
  setWindowTitle(tr("MeshStudio - %1[*]").arg(m_doc->displayName()));
  setWindowModified(m_doc->isModified());
}

void MainWindow::onConfigChanged() {
  updateTitle();
  m_analyzer->request(m_doc->config());
  m_planClock.restart();
  m_phase = AnalysisPhase::Validating;
  m_phaseRanks = 0;
  if (!m_outdatedTimer->isActive() && !m_progressLabel->isVisible()) m_outdatedTimer->start();
}

QString MainWindow::summaryText() const {
  return m_summary->text();
}

QString MainWindow::planProgressText() const {
  return m_progressLabel->isVisible() ? m_progressLabel->text() : QString();
}

void MainWindow::updatePlanProgress() {
  m_progressLabel->setText(tr("Planning: %1 · %2")
                               .arg(phaseText(m_phase, m_phaseRanks))
                               .arg(formatSeconds(double(m_planClock.elapsed()) / 1e3)));
  m_progressBar->setValue(static_cast<int>(m_phase) + 1);
}

void MainWindow::setPlanOutdated(const QString& reason) {
  m_outdatedReason = reason;
  m_predicted->setOutdated(reason);
  m_memory->setOutdated(reason);
}

void MainWindow::onSnapshot(std::shared_ptr<const PlanSnapshot> snap) {
  const bool current = snap->config == m_doc->config();
  if (current) {
    // The analysis of the settings on screen: no progress to show any more.
    m_outdatedTimer->stop();
    m_progressTimer->stop();
    m_progressLabel->hide();
    m_progressBar->hide();
  }
  m_snapshot = snap;
  m_canvas->setSnapshot(snap);
  m_palette->setSnapshot(snap);
  if (!snap->ok()) {
    m_summary->setText(tr("The plan does not build: %1").arg(snap->error));
    m_summary->setStyleSheet(QStringLiteral("color: #b00020"));
    // The views keep the last plan that built, marked as such.
    if (current)
      setPlanOutdated(m_shownPlan ? tr("the current settings do not make a plan (the reason is above); this "
                                       "is the last plan that did")
                                  : tr("the current settings do not make a plan (the reason is above)"));
    return;
  }
  std::shared_ptr<const PlanSnapshot> previous = std::exchange(m_shownPlan, snap);
  const SimResult& sim = snap->sim;
  double worstBubble = 0;
  const MemoryBreakdown* fullest = nullptr;
  int overflowing = 0;
  for (double b : sim.bubbleFraction) worstBubble = std::max(worstBubble, b);
  for (const MemoryBreakdown& m : snap->memory) {
    const double fill = m.capacity > 0 ? m.total() / m.capacity : 0.0;
    if (!fullest || fill > (fullest->capacity > 0 ? fullest->total() / fullest->capacity : 0.0)) fullest = &m;
    overflowing += m.fits() ? 0 : 1;
  }
  const RunConfig& c = snap->config;
  QString text;
  if (snap->ps) {
    // Parameter-server mode (plan/ps_model.h).
    double serverBytes = 0;
    for (const PsServerPrediction& s : snap->ps->servers) serverBytes = std::max(serverBytes, s.total());
    text =
        tr("%1: parameter servers, %2 workers and %3 servers, %4. Predicted step %5, %6 %7, mean staleness "
           "%8 updates, largest server %9 of host memory")
            .arg(QString::fromStdString(c.name))
            .arg(c.parallel.workers)
            .arg(c.parallel.servers)
            .arg(QString::fromLatin1(toString(c.parallel.consistency)))
            .arg(formatSeconds(sim.stepTime))
            .arg(formatSi(sim.tokensPerSecond))
            .arg(isTransformer(c.model.type) ? tr("tokens/s") : tr("samples/s"))
            .arg(snap->ps->meanStaleness, 0, 'f', 1)
            .arg(formatBytes(serverBytes));
  } else {
    text = tr("%1: dp %2 x tp %3 x pp %4 (%5 ranks), %6, %7 microbatches. Predicted step %8, %9 %10")
               .arg(QString::fromStdString(c.name))
               .arg(c.parallel.dp)
               .arg(c.parallel.tp)
               .arg(c.parallel.pp)
               .arg(snap->plan->layout.world())
               .arg(QString::fromLatin1(toString(c.parallel.schedule)))
               .arg(c.parallel.microbatches)
               .arg(formatSeconds(sim.stepTime))
               .arg(formatSi(sim.tokensPerSecond))
               .arg(isTransformer(c.model.type) ? tr("tokens/s") : tr("samples/s"));
    // MFU is a fraction of a published peak: a device without one (this machine's CPU) has none to state.
    if (sim.mfuDefined) text += tr(", MFU %1").arg(formatPercent(sim.mfu));
    text += tr(", worst bubble %1").arg(formatPercent(worstBubble));
  }
  if (fullest) {
    // Enough decimals that a small model on a large device does not read as "0%".
    const double fill = fullest->capacity > 0 ? fullest->total() / fullest->capacity : 0.0;
    text += tr(", fullest device %1 of %2 (%3)")
                .arg(formatBytes(fullest->total()), formatBytes(fullest->capacity),
                     formatPercent(fill, fill < 0.01  ? 2
                                         : fill < 0.1 ? 1
                                                      : 0));
  }
  text += QLatin1Char('.');
  if (overflowing) text += tr(" %n rank(s) do not fit in memory.", nullptr, overflowing);
  if (!snap->calibrationNote.isEmpty())
    text += QStringLiteral(" (") + snap->calibrationNote + QStringLiteral(")");
  for (const std::string& w : snap->plan->warnings) text += QStringLiteral("\n") + QString::fromStdString(w);
  m_summary->setText(text);
  m_summary->setStyleSheet(overflowing ? QStringLiteral("color: #b00020") : QString());
  const std::shared_ptr<const TimelineData> timeline(snap, &snap->timeline);
  m_predicted->setData(timeline);
  m_memory->setModelStates(modelStateText(snap->plan->config.parallel, snap->plan->config.optimizer));
  const MemoryBars bars = memoryBars(*snap);
  m_memory->setPredicted(bars.memory, bars.names, bars.groupNames);
  setPlanOutdated(current ? QString() : tr("re-planning after the last change…"));
  // The views hold the new snapshot now; the old one is freed off the GUI thread (hundreds of MB at 16384
  // ranks).
  m_analyzer->releaseLater(std::move(previous));
}

}  // namespace ms
