// FidelityView: a finished run's measurements against its plan's prediction (plan/fidelity.h), the studio's
// face of `meshstudio-engine fidelity`: a summary line (step time predicted, measured, error; the device the
// prediction costs on), one table of every compared item worst first (F, B, W per layer and rank, the waits
// for messages, the exposed gradient finish, the optimizer, bubble, peak memory per category), a filter by
// item, and the report's notes. Errors are coloured against the targets: a time within 10% and a
// memory figure within 2% green, within 2.5x that amber, past it red.
//
// What always holds: a run folder is read once, when shown (showRunFolder), never modified; one that does not
// give a report is refused with its reason and leaves the view as it was.
#pragma once

#include <QString>
#include <QWidget>

#include "common/status.h"
#include "plan/fidelity.h"

class QComboBox;
class QLabel;
class QTableWidget;

namespace ms {

class FidelityView : public QWidget {
  Q_OBJECT
 public:
  enum Columns {
    ColItem,
    ColRank,
    ColStage,
    ColWhat,
    ColPredicted,
    ColMeasured,
    ColError,
    ColGap,
    NUM_COLUMNS
  };
  explicit FidelityView(QWidget* parent = nullptr);

  // The report of a run folder (its config.json and metrics.jsonl).
  Status showRunFolder(const QString& dir);
  void showReport(const FidelityReport& report, const QString& dir);
  // "all", or an item's name (toString(FidelityItem): "F", "memory", ...) or "waits" (r and R).
  void setFilter(const QString& filter);

  const FidelityReport& report() const { return m_report; }
  QString runFolder() const { return m_dir; }
  QTableWidget* table() const { return m_table; }
  QLabel* summary() const { return m_summary; }
  QComboBox* filter() const { return m_filter; }

 private:
  void rebuild();
  FidelityReport m_report;
  QString m_dir;
  QLabel* m_summary = nullptr;
  QLabel* m_notes = nullptr;
  QComboBox* m_filter = nullptr;
  QTableWidget* m_table = nullptr;
};

}  // namespace ms
