// The studio's main window: the wiring of the project document, the plan analysis and every view. The Plan
// tab holds the mesh (toolbar, canvas, legend), the predicted timeline and the memory bars; the Run tab the
// Run dashboard (RunView); the layer palette and the inspector are docks, folded away while the Run tab is
// shown and back on the Plan tab. Every edit goes through the ProjectDocument (undo/redo, also with Ctrl+Z in
// an inspector field), every change of the config is re-analysed off the GUI thread and the plan views
// redraw from the newest snapshot.
//
// What always holds: nothing the person does here crashes the studio: a project that fails to load, a config
// that fails validation, a refused drop, a malformed metrics line and an engine that dies are each shown as a
// message, and what was there before (the open project, the received metrics) stays. The plan views never
// pass off an old plan as the current one: while a re-plan takes longer than kOutdatedAfterMs, and whenever
// the current settings do not plan, they are marked outdated with the reason, and the status bar shows the
// analysis' phase and time. The window's GUI thread does no planning: a 16384-rank plan is built, simulated
// and freed on worker threads.
#pragma once

#include <QElapsedTimer>
#include <QMainWindow>
#include <QMessageBox>
#include <QString>
#include <functional>
#include <memory>
#include <optional>

#include "plan/frameworks.h"
#include "ui/models/plan_analysis.h"

class QDialog;
class QDockWidget;
class QLabel;
class QMenu;
class QProgressBar;
class QProgressDialog;
class QTabWidget;
class QTimer;

namespace ms {

class CalibrateJob;
class CompareView;
class FidelityView;
class EngineClient;
class Inspector;
class LayerPalette;
class MemoryView;
class MeshCanvas;
class ProjectDocument;
class RunData;
class RunView;
class TimelineView;

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  explicit MainWindow(QWidget* parent = nullptr);
  ~MainWindow() override;

  // Loads a project (asking about unsaved changes first); on failure shows the errors and returns false,
  // keeping the project that was open.
  bool openProject(const QString& path);
  bool newProject(const QString& templateKey);
  // A new project: the open one with its model replaced by a Hugging Face config.json's (plan/hf_import.h);
  // what the import approximates is shown in the status bar and kept in lastImportNotes(). On failure the
  // error is shown and the open project kept.
  bool newProjectFromHfConfig(const QString& hfPath);
  QStringList lastImportNotes() const { return m_lastImportNotes; }
  bool saveProject();                       // Save As when the project has no file yet
  bool saveProjectAs(const QString& path);  // no dialog
  // Replays a finished (or crashed) run from its folder's metrics.jsonl.
  bool openRunFolder(const QString& dir);
  // File > Import Measured Trace: PyTorch profiler (Kineto) or Nsight traces as Chrome trace JSON, one file
  // per rank or merged (plan/trace_import.h), shown on the Run tab as the measured timeline (one row per
  // rank, its last step that every rank has) above the open project's predicted step; the status bar says
  // what was recognized and what was left as other. Read on the GUI thread. On failure showError() names the
  // file and what is shown stays; refused while a run is going (its steps would replace the trace).
  bool importTrace(const QStringList& paths);
  // Opens (or brings forward) the Compare Runs window with these run folders added; the ones that do not load
  // are reported in lastError(). Returns the window.
  CompareView* compareRuns(const QStringList& dirs);
  // Run > Fidelity: opens (or brings forward) the Fidelity window with this run folder's report (the last run
  // started or reopened when dir is empty). Null, with the reason through showError(), when there is no run
  // or its folder gives no report; the window then keeps what it showed.
  FidelityView* showFidelity(const QString& dir = QString());
  // Starts the current plan on this machine; runDir empty = a new folder beside the project.
  bool startRun(const QString& runDir = QString());
  // Continues a run from its newest checkpoint with the current config (e.g. more steps): the given folder,
  // else the last run started or reopened here.
  bool resumeRun(const QString& runDir = QString());
  void stopRun();
  // The plan's predictions use the compute times the last (or the reopened) run measured, until cleared.
  bool calibrateFromRun();
  void clearCalibration();
  // Tools > Calibrate This Machine: `meshstudio-engine calibrate` into thisMachineProfilePath() (the engine
  // is the Run menu's, engineClient()->enginePath()), with a window-modal progress dialog that is shown, not
  // exec()'d; its Cancel stops the engine. The end is in the status bar, a failure through showError(). False
  // when a calibration is already going or the profiles folder cannot be made.
  bool calibrateThisMachine();
  void cancelCalibration();
  // Tools > Use This Machine's Profile: one undoable edit that names the profile in mesh.profiles as
  // kThisMachineProfile (its absolute path, read now) and puts every node on it, with its measured links
  // (kThisMachineProfile + ".shm" inside a node; between nodes ".net", the link calibrate --hosts measured
  // between two hosts, else ".tcp"; a link it did not measure stays as it
  // was, and the status bar says so). A missing or bad file: showError() naming it, nothing changed.
  bool useThisMachineProfile();
  static constexpr const char* kThisMachineProfile = "this-machine";
  // Where profiles go: the user's data folder + "/profiles" unless set (tests set a temporary folder).
  QString profilesFolder() const;
  void setProfilesFolder(const QString& dir);
  // profilesFolder() + "/<host name>.json", the host name reduced to [A-Za-z0-9._-].
  QString thisMachineProfilePath() const;
  // Arguments added after `calibrate --out FILE` (tests: {"--quick"}).
  void setCalibrateArguments(const QStringList& args);
  CalibrateJob* calibrateJob() const { return m_calibrateJob; }
  // The progress dialog of the newest calibration (hidden once it ended; null before the first).
  QProgressDialog* calibrateDialog() const { return m_calibrateDialog; }
  // File > Export: config, launch.sh, slurm.sbatch (and hostfile) into a folder.
  bool exportLaunchFiles(const QString& dir);
  // File > Export > Megatron-LM / torchtitan / DeepSpeed Launch (plan/frameworks.h): the files for the open
  // project, shown first in a preview (the files, and what the framework cannot express) when `preview`; the
  // status bar names what was not carried over (also lastImportNotes()). An invalid project or a plan the
  // framework cannot run: showError(), nothing written.
  Expected<FrameworkExport> frameworkExport(Framework target) const;
  bool exportForFrameworkTo(Framework target, const QString& dir, bool preview);
  // The preview dialog (object names: "frameworkPreview", its "notCarried" label and "files" tabs).
  QDialog* makeFrameworkPreview(const FrameworkExport& exported);
  // File > Import Framework Launch: a Megatron-LM script or arguments, a torchtitan TOML (its run.sh beside
  // it read for the rank counts) or a DeepSpeed JSON (the model from launch.sh beside it, or `companion`) as
  // the open project; the status bar counts the unknown, not carried and assumed items, listed in
  // lastImportNotes(). A file that does not read or map: showError() naming it, the project unchanged.
  bool importFrameworkLaunch(const QString& path, const QString& companion = {});
  // The measured (or, without a run, the predicted) timeline as a Chrome trace JSON file.
  bool exportTrace(const QString& path, bool measured);
  // The Run dashboard's plots (loss, throughput, step time, memory predicted against measured), PNGs at dpi.
  bool exportPlots(const QString& dir, const QString& format, double dpi = 0);
  // The whole Run dashboard in one file: pdf, svg (vector) or png at dpi.
  bool exportDashboard(const QString& path, const QString& format, double dpi = 300);
  // Where File dialogs start: the project's folder, else the user's documents.
  QString dialogFolder() const;
  // Where a new run's folder goes: beside the project, unless the project is one of the built-in examples or
  // its folder is not writable; then under the user's data folder.
  QString defaultRunDir() const;
  static constexpr int kOutdatedAfterMs = 150;  // a re-plan shorter than this is not worth a flicker

  QString lastError() const { return m_lastError; }
  ProjectDocument* document() const { return m_doc; }
  PlanAnalyzer* analyzer() const { return m_analyzer; }
  std::shared_ptr<const PlanSnapshot> snapshot() const { return m_snapshot; }
  EngineClient* engineClient() const { return m_client; }
  const RunData* runData() const;
  MeshCanvas* meshCanvas() const { return m_canvas; }
  LayerPalette* layerPalette() const { return m_palette; }
  Inspector* inspector() const { return m_inspector; }
  TimelineView* predictedTimeline() const { return m_predicted; }
  TimelineView* runPredictedTimeline() const;
  TimelineView* measuredTimeline() const;
  MemoryView* memoryView() const { return m_memory; }
  RunView* runView() const { return m_runView; }
  QTabWidget* tabs() const { return m_tabs; }
  QString summaryText() const;
  // Why the plan views do not show the current settings' plan (empty when they do).
  QString planOutdatedReason() const { return m_outdatedReason; }
  QString planProgressText() const;
  QStringList recentFiles() const;

  // How unsaved changes are resolved before New/Open/close: by default a dialog; tests set an answer.
  void setUnsavedChangesHandler(std::function<QMessageBox::StandardButton()> handler) {
    m_unsavedHandler = std::move(handler);
  }

 protected:
  void closeEvent(QCloseEvent* event) override;
  bool eventFilter(QObject* watched, QEvent* event) override;

 private:
  void buildMenus();
  void buildToolsMenu();
  void addTraceImportAction(QMenu* file);
  void addFrameworkActions(QMenu* file, QMenu* exportMenu);
  void onCalibrateProgress(int done, int total, const QString& what);
  void onCalibrateFinished(bool ok, const QString& message);
  void updateProfileActions();
  void onConfigChanged();
  void onSnapshot(std::shared_ptr<const PlanSnapshot> snapshot);
  void setPlanOutdated(const QString& reason);  // empty: the views show the current plan
  void updatePlanProgress();
  void onTabChanged(int index);
  bool chooseDashboardExport();
  void onRunFinished(bool ok, const QString& message);
  void updateTitle();
  void updateRecentMenu();
  void addRecent(const QString& path);
  void showError(const QString& title, const QString& message);
  bool maybeSave();
  bool chooseSaveAs();
  bool launch(const QString& runDir, bool resume);

  ProjectDocument* m_doc = nullptr;
  PlanAnalyzer* m_analyzer = nullptr;
  PlanAnalyzer* m_runAnalyzer = nullptr;            // the plan of the run shown on the Run tab
  std::shared_ptr<const PlanSnapshot> m_snapshot;   // the newest analysis (it may have failed)
  std::shared_ptr<const PlanSnapshot> m_shownPlan;  // the newest that planned: what the plan views show
  EngineClient* m_client = nullptr;
  std::unique_ptr<RunData> m_replay;  // a reopened run folder (when no live run is shown)
  bool m_showingReplay = false;

  QTabWidget* m_tabs = nullptr;
  QLabel* m_summary = nullptr;
  QLabel* m_runBanner = nullptr;
  MeshCanvas* m_canvas = nullptr;
  LayerPalette* m_palette = nullptr;
  Inspector* m_inspector = nullptr;
  TimelineView* m_predicted = nullptr;
  MemoryView* m_memory = nullptr;
  QDockWidget* m_paletteDock = nullptr;
  QDockWidget* m_inspectorDock = nullptr;
  QByteArray m_planDockState;  // the docks as they were on the Plan tab
  QLabel* m_progressLabel = nullptr;
  QProgressBar* m_progressBar = nullptr;
  QTimer* m_outdatedTimer = nullptr;
  QTimer* m_progressTimer = nullptr;
  QElapsedTimer m_planClock;
  AnalysisPhase m_phase = AnalysisPhase::Validating;
  int m_phaseRanks = 0;
  QString m_outdatedReason;
  RunView* m_runView = nullptr;
  QMenu* m_recentMenu = nullptr;
  QAction* m_runAction = nullptr;
  QAction* m_stopAction = nullptr;
  QAction* m_resumeAction = nullptr;
  CalibrateJob* m_calibrateJob = nullptr;
  QProgressDialog* m_calibrateDialog = nullptr;
  QAction* m_calibrateAction = nullptr;
  QAction* m_useProfileAction = nullptr;
  QString m_profilesFolder;            // empty: the user's data folder's
  QString m_lastRunDir;                // the folder of the last run started or reopened (Resume continues it)
  FidelityView* m_fidelity = nullptr;  // the Fidelity window, once opened (a top-level child)
  CompareView* m_compare = nullptr;    // the Compare Runs window, once opened (a top-level child)
  std::optional<RunConfig> m_lastRunConfig;  // the config that run used (calibration needs its microbatch)
  QString m_lastError;
  QStringList m_lastImportNotes;
  std::function<QMessageBox::StandardButton()> m_unsavedHandler;
};

}  // namespace ms
