// The inspector: editors for the run's settings that are not drawn elsewhere: the parallel layout (dp, tp,
// pp, schedule, microbatches, virtual chunks, ZeRO, precision, recompute and its per-chunk block count,
// sequence parallelism), the optimizer, the training loop, the device and the run's name. Each editor is
// addressed by the JSON path of its field ("/parallel/tp"), shows the validation messages of that path under
// itself in red and gets a red frame while it has one. Ranges and tooltips come from the config's JSON Schema
// (one source).
//
// What always holds: an editor writes through ProjectDocument::edit() with a merge key of its own, so typing
// in a field is one undo step; editors are refreshed from the document after every configChanged() with
// their signals blocked, so a refresh never writes back; every validation error is shown somewhere: under
// the field whose path holds it, under its section, or in the list at the top.
#pragma once

#include <nlohmann/json.hpp>

#include <QString>
#include <QStringList>
#include <QWidget>
#include <functional>
#include <vector>

#include "plan/run_config.h"

class QFormLayout;
class QLabel;
class QVBoxLayout;

namespace ms {

class ProjectDocument;

class Inspector : public QWidget {
  Q_OBJECT
 public:
  Inspector(ProjectDocument* doc, QWidget* parent = nullptr);

  // The editor of a field (QSpinBox, QDoubleSpinBox, QComboBox, QCheckBox or QLineEdit), or null.
  QWidget* editorFor(const QString& path) const;
  // The message shown under a field or a section ("/parallel"), empty when none.
  QString messageFor(const QString& path) const;
  bool isMarkedInvalid(const QString& path) const;
  // Errors that no field or section shows (mesh, model, data), as listed at the top.
  QString generalMessage() const;
  QStringList paths() const;

 private:
  struct Field {
    QString path;
    QStringList owns;  // error paths shown here: these and everything below them
    QWidget* editor = nullptr;
    QLabel* message = nullptr;
    std::function<void(const RunConfig&)> load;  // config -> editor (signals blocked by the caller)
    bool invalid = false;
  };
  QFormLayout* addSection(const QString& title, const QString& path);
  QLabel* makeMessageLabel(QWidget* parent);
  Field& addRow(QFormLayout* form, const QString& path, const QString& label, QWidget* editor);
  void addInt(QFormLayout* form, const QString& path, const QString& label,
              std::function<int(const RunConfig&)> get, std::function<void(RunConfig&, int)> set);
  void addDouble(QFormLayout* form, const QString& path, const QString& label, int decimals,
                 std::function<double(const RunConfig&)> get, std::function<void(RunConfig&, double)> set);
  void addNumberText(QFormLayout* form, const QString& path, const QString& label,
                     std::function<double(const RunConfig&)> get,
                     std::function<void(RunConfig&, double)> set);
  void addChoice(QFormLayout* form, const QString& path, const QString& label, const QStringList& names,
                 std::function<QString(const RunConfig&)> get,
                 std::function<void(RunConfig&, const QString&)> set);
  void addBool(QFormLayout* form, const QString& path, const QString& label,
               std::function<bool(const RunConfig&)> get, std::function<void(RunConfig&, bool)> set);
  void addText(QFormLayout* form, const QString& path, const QString& label,
               std::function<QString(const RunConfig&)> get,
               std::function<void(RunConfig&, const QString&)> set);
  void write(const QString& path, const std::function<void(RunConfig&)>& change);
  int mergeKeyOf(const QString& path) const;
  const Field* find(const QString& path) const;
  void refresh();

  ProjectDocument* m_doc;
  nlohmann::json m_schema;  // runConfigSchema(): ranges and descriptions of the fields
  QVBoxLayout* m_sections;
  QLabel* m_general;
  std::vector<Field> m_fields;                             // editors, in display order
  std::vector<Field> m_sectionFields;                      // section-level messages (no editor)
  std::vector<std::pair<QString, QString>> m_localErrors;  // path -> text the editor refused (not a number)
};

}  // namespace ms
