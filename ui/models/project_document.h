// The open project: the run config being edited, the file it came from, and its undo history. Every edit
// goes through edit(), which pushes one QUndoCommand holding the config before and after (snapshots: a config
// is a few kB, and a snapshot cannot get out of step with the edit it undoes). Views never keep their own
// copy of a setting: they read config() and redraw on configChanged().
//
// What always holds: config() may fail validation (a person typing tp = 3 passes through invalid states);
// errors() lists why, and nothing downstream assumes validity. isModified() is false exactly when the
// undo stack is at its clean index (the state last loaded or saved). A failed load changes nothing.
#pragma once

#include <QObject>
#include <QString>
#include <QUndoStack>
#include <functional>

#include "plan/run_config.h"

namespace ms {

class ProjectDocument : public QObject {
  Q_OBJECT
 public:
  explicit ProjectDocument(QObject* parent = nullptr);

  const RunConfig& config() const { return m_config; }
  // Validation errors of config(), each naming the JSON path ("/parallel/tp") and the reason.
  const ConfigErrors& errors() const { return m_errors; }
  // The errors whose path is `path` or below it ("/parallel" matches "/parallel/tp").
  ConfigErrors errorsAt(const QString& path) const;
  QString filePath() const { return m_path; }  // empty for a new, never saved project
  QString displayName() const;                 // file name, or the config's name for a new project
  bool isModified() const { return !m_undo.isClean(); }
  // Counts every change of config() (edit, undo, redo, load, reset): a message about one state of the
  // project (a drop placed, a plan applied) holds while the revision it was shown at is current.
  quint64 revision() const { return m_revision; }
  QUndoStack* undoStack() { return &m_undo; }

  // One undoable edit: `change` is applied to a copy of config(); nothing is pushed when it changes
  // nothing. Edits with the same non-negative mergeKey in a row merge into one undo step (typing in a
  // spin box), the text of the first kept.
  void edit(const QString& text, const std::function<void(RunConfig&)>& change, int mergeKey = -1);
  // Replaces the whole config as one undoable edit (auto-plan, balance, a dropped placement).
  void setConfig(const QString& text, const RunConfig& config);

  // Loads a project file; on failure returns the error (file, path and reason) and changes nothing.
  Status load(const QString& path);
  // Starts a new, unsaved project from a config (a template); clears the history.
  void reset(const RunConfig& config, const QString& path = QString());
  // Saves to `path` (empty: the current file); on success that becomes the file and the state is clean.
  Status save(const QString& path = QString());

  // Applies a config without touching the undo stack (used by the undo commands).
  void applyConfig(const RunConfig& config);

 signals:
  void configChanged();  // after every edit, undo, redo, load and reset
  void fileChanged();    // the file path or the modified flag changed
  void modifiedChanged(bool modified);

 private:
  RunConfig m_config;
  ConfigErrors m_errors;
  QString m_path;
  QUndoStack m_undo;
  quint64 m_revision = 0;
};

// Built-in templates for File > New. Each returns a valid config; "gpt", "vit", "mlp" and "cnn" train on this
// machine's CPUs in a few minutes, "gpt1b", "gpt3" and "gpt3-16k" are planning-only GPTs on 8, 1024 and
// 16384 GPUs.
struct ProjectTemplate {
  QString key;
  QString title;
  QString description;
};
QList<ProjectTemplate> projectTemplates();
Expected<RunConfig> templateConfig(const QString& key);

}  // namespace ms
