// The studio's main window: the wiring of the project document, the plan analysis and every view. The Plan
// tab holds the mesh canvas, the predicted timeline and the memory bars; the Run tab the live plots, the
// measured timeline beside the predicted one and the engine's log; the layer palette and the inspector are
// docks. Every edit goes through the ProjectDocument (undo/redo), every change of the config is re-analysed
// off the GUI thread and the plan views redraw from the newest snapshot.
//
// What always holds: nothing the person does here crashes the studio: a project that fails to load, a config
// that fails validation, a refused drop, a malformed metrics line and an engine that dies are each shown as a
// message, and what was there before (the open project, the received metrics) stays.
#pragma once

#include <QMainWindow>
#include <QMessageBox>
#include <QString>
#include <functional>
#include <memory>
#include <optional>

#include "ui/models/plan_analysis.h"

class QLabel;
class QMenu;
class QTabWidget;

namespace ms {

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
  bool saveProject();                       // Save As when the project has no file yet
  bool saveProjectAs(const QString& path);  // no dialog
  // Replays a finished (or crashed) run from its folder's metrics.jsonl.
  bool openRunFolder(const QString& dir);
  // Starts the current plan on this machine; runDir empty = a new folder beside the project.
  bool startRun(const QString& runDir = QString());
  // Continues a run from its newest checkpoint with the current config (e.g. more steps): the given folder,
  // else the last run started or reopened here.
  bool resumeRun(const QString& runDir = QString());
  void stopRun();
  // The plan's predictions use the compute times the last (or the reopened) run measured, until cleared.
  bool calibrateFromRun();
  void clearCalibration();
  // File > Export: config, launch.sh, slurm.sbatch (and hostfile) into a folder.
  bool exportLaunchFiles(const QString& dir);
  // The measured (or, without a run, the predicted) timeline as a Chrome trace JSON file.
  bool exportTrace(const QString& path, bool measured);
  bool exportPlots(const QString& dir, const QString& format);

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
  TimelineView* runPredictedTimeline() const { return m_runPredicted; }
  TimelineView* measuredTimeline() const { return m_measured; }
  MemoryView* memoryView() const { return m_memory; }
  RunView* runView() const { return m_runView; }
  QTabWidget* tabs() const { return m_tabs; }
  QString summaryText() const;
  QStringList recentFiles() const;

  // How unsaved changes are resolved before New/Open/close: by default a dialog; tests set an answer.
  void setUnsavedChangesHandler(std::function<QMessageBox::StandardButton()> handler) {
    m_unsavedHandler = std::move(handler);
  }

 protected:
  void closeEvent(QCloseEvent* event) override;

 private:
  void buildMenus();
  void onConfigChanged();
  void onSnapshot(std::shared_ptr<const PlanSnapshot> snapshot);
  void onRunData();
  void onRunFinished(bool ok, const QString& message);
  void updateTitle();
  void updateRecentMenu();
  void addRecent(const QString& path);
  void showError(const QString& title, const QString& message);
  bool maybeSave();
  bool chooseSaveAs();
  QString defaultRunDir() const;
  bool launch(const QString& runDir, bool resume);

  ProjectDocument* m_doc = nullptr;
  PlanAnalyzer* m_analyzer = nullptr;
  std::shared_ptr<const PlanSnapshot> m_snapshot;
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
  TimelineView* m_runPredicted = nullptr;
  TimelineView* m_measured = nullptr;
  MemoryView* m_memory = nullptr;
  RunView* m_runView = nullptr;
  QMenu* m_recentMenu = nullptr;
  QAction* m_runAction = nullptr;
  QAction* m_stopAction = nullptr;
  QAction* m_resumeAction = nullptr;
  QString m_lastRunDir;  // the folder of the last run started or reopened (Resume continues it)
  std::optional<RunConfig> m_lastRunConfig;  // the config that run used (calibration needs its microbatch)
  QString m_lastError;
  quint64 m_measuredRevision = 0;
  std::function<QMessageBox::StandardButton()> m_unsavedHandler;
};

}  // namespace ms
