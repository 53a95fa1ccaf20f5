// The layer palette: the model's layers (LayerModel) in a table whose selected rows are dragged onto the
// mesh canvas, with "Balance" (the balanced placement for the current stages) and "Auto-plan..." (the
// auto-planner's best layouts, one of which the person applies).
//
// What always holds: both buttons change the config only through ProjectDocument::setConfig (one undo step
// each) and only with a config that the plan library produced; a refusal (no plan, nothing fits) changes
// nothing and is shown under the table. The auto-planner runs on a worker thread; its result is used only if
// the config has not changed since it started, and the palette's destructor waits for it.
#pragma once

#include <QStringList>
#include <QThreadPool>
#include <QWidget>
#include <memory>
#include <vector>

#include "plan/autoplanner.h"
#include "ui/models/plan_analysis.h"  // the snapshot slot needs its metatype declaration

class QLabel;
class QPushButton;
class QTableView;

namespace ms {

class LayerModel;
class ProjectDocument;

class LayerPalette : public QWidget {
  Q_OBJECT
 public:
  LayerPalette(ProjectDocument* doc, QWidget* parent = nullptr);
  ~LayerPalette() override;

  QTableView* view() const { return m_view; }
  LayerModel* model() const { return m_model; }
  QString message() const;  // the last refusal or result, as shown under the table
  QPushButton* balanceButton() const { return m_balance; }
  QPushButton* autoPlanButton() const { return m_autoPlan; }

  // Balance: the balanced placement of the current pp and virtual_chunks. False (and a message) when refused.
  bool balance();
  // The auto-planner on the current config, synchronously (the button runs it on a worker thread). False
  // (and a message) when it finds nothing; the candidates are then empty.
  bool computeAutoPlan();
  const std::vector<PlanCandidate>& autoPlanCandidates() const { return m_candidates; }
  // Applies candidate i of the last auto-plan (one undo step). False when i is out of range or the config
  // changed since the candidates were computed.
  bool applyCandidate(int i);
  // One row of the candidates' table: dp, tp, pp, schedule, microbatches, zero, recompute, step time,
  // tokens/s, MFU, bubble, peak memory / capacity.
  static QStringList candidateHeaders();
  static QStringList candidateRow(const PlanCandidate& candidate);

 public slots:
  void setSnapshot(std::shared_ptr<const ms::PlanSnapshot> snapshot);
  // The button: the auto-planner off the GUI thread, then the dialog to pick a candidate.
  void startAutoPlan();

 signals:
  void autoPlanFinished(bool found);

 private:
  void setMessage(const QString& text, bool error);
  void finishAutoPlan(Expected<AutoPlanResult> result, quint64 generation);
  void showCandidates();
  ProjectDocument* m_doc;
  LayerModel* m_model;
  QTableView* m_view;
  QPushButton* m_balance;
  QPushButton* m_autoPlan;
  QLabel* m_message;
  std::vector<PlanCandidate> m_candidates;
  RunConfig m_candidatesBase;     // the config the candidates were computed for
  quint64 m_generation = 0;       // counts config changes: a result for an older one is dropped
  bool m_showsStatus = false;     // the message is the layer model's status
  quint64 m_messageRevision = 0;  // the document revision the message was shown at
  QThreadPool m_pool;
};

}  // namespace ms
