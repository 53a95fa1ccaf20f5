// LayerPalette; see layer_palette.h.
#include "ui/views/layer_palette.h"

#include <QAbstractItemView>
#include <QDialog>
#include <QDialogButtonBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QTableView>
#include <QTableWidget>
#include <QVBoxLayout>

#include "plan/plan.h"
#include "ui/models/layer_model.h"
#include "ui/models/placement.h"
#include "ui/models/plan_analysis.h"
#include "ui/models/project_document.h"
#include "ui/models/units.h"

namespace ms {

LayerPalette::LayerPalette(ProjectDocument* doc, QWidget* parent)
    : QWidget(parent), m_doc(doc), m_model(new LayerModel(doc, this)) {
  m_pool.setMaxThreadCount(1);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  m_view = new QTableView(this);
  m_view->setModel(m_model);
  m_view->setSelectionMode(QAbstractItemView::ExtendedSelection);
  m_view->setSelectionBehavior(QAbstractItemView::SelectRows);
  m_view->setDragEnabled(true);
  m_view->setDragDropMode(QAbstractItemView::DragOnly);
  m_view->setDefaultDropAction(Qt::CopyAction);
  m_view->verticalHeader()->setVisible(false);
  m_view->verticalHeader()->setDefaultSectionSize(m_view->fontMetrics().height() + 6);
  m_view->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  m_view->horizontalHeader()->setStretchLastSection(true);
  m_view->setToolTip(tr("Select layers and drag them onto a device of the mesh to put them on its stage"));
  layout->addWidget(m_view, 1);
  auto* buttons = new QHBoxLayout;
  m_balance = new QPushButton(tr("Balance"), this);
  m_balance->setToolTip(
      tr("Split the layers over the current stages so that the slowest stage is as fast "
         "as it can be"));
  m_autoPlan = new QPushButton(tr("Auto-plan..."), this);
  m_autoPlan->setToolTip(
      tr("Search dp, tp, pp, schedule, microbatches, ZeRO and recompute for the fastest "
         "plans that fit in memory"));
  buttons->addWidget(m_balance);
  buttons->addWidget(m_autoPlan);
  buttons->addStretch(1);
  layout->addLayout(buttons);
  m_message = new QLabel(this);
  m_message->setWordWrap(true);
  m_message->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_message->setVisible(false);
  layout->addWidget(m_message);
  connect(m_balance, &QPushButton::clicked, this, [this] { balance(); });
  connect(m_autoPlan, &QPushButton::clicked, this, &LayerPalette::startAutoPlan);
  connect(doc, &ProjectDocument::configChanged, this, [this] {
    ++m_generation;
    // The model says why it has no rows or no stages. Otherwise a message about a result (a balance, an
    // applied auto-plan) holds only for the project state it described: an undo, another edit or another
    // project clears it.
    if (!m_model->status().isEmpty())
      setMessage(m_model->status(), true);
    else if (m_showsStatus || m_messageRevision != m_doc->revision())
      setMessage(QString(), false);
    m_showsStatus = !m_model->status().isEmpty();
  });
}

LayerPalette::~LayerPalette() {
  m_pool.waitForDone();
}

QString LayerPalette::message() const {
  return m_message->text();
}

void LayerPalette::setMessage(const QString& text, bool error) {
  m_messageRevision = m_doc->revision();
  m_message->setText(text);
  m_message->setStyleSheet(error ? QStringLiteral("color: #d32f2f") : QString());
  m_message->setVisible(!text.isEmpty());
}

void LayerPalette::setSnapshot(std::shared_ptr<const PlanSnapshot> snapshot) {
  m_model->setSnapshot(std::move(snapshot));
}

bool LayerPalette::balance() {
  const RunConfig& config = m_doc->config();
  // The plan library balances whatever it can build a plan of; an invalid config would stay invalid.
  if (!m_doc->errors().empty()) {
    const ConfigError& e = m_doc->errors().front();
    setMessage(
        tr("Cannot balance: %1: %2").arg(QString::fromStdString(e.path), QString::fromStdString(e.message)),
        true);
    return false;
  }
  const auto balanced = withBalancedPlacement(config, allowsDeviceSharing(config));
  if (!balanced) {
    setMessage(tr("Cannot balance: %1").arg(QString::fromStdString(balanced.message())), true);
    return false;
  }
  // An even split written out as a placement is no change: compare where the layers go, not the spelling.
  const auto before = layerPlacement(config);
  const auto after = layerPlacement(*balanced);
  if (before && after && before->stageOfLayer == after->stageOfLayer &&
      before->chunkOfLayer == after->chunkOfLayer) {
    setMessage(tr("The stages are already balanced"), false);
    return true;
  }
  m_doc->setConfig(tr("Balance stages"), *balanced);
  setMessage(tr("Balanced %1 stages").arg(config.parallel.pp), false);
  return true;
}

bool LayerPalette::computeAutoPlan() {
  m_candidates.clear();
  m_candidatesBase = m_doc->config();
  const auto result = autoPlan(m_candidatesBase);
  finishAutoPlan(result, m_generation);
  return !m_candidates.empty();
}

void LayerPalette::startAutoPlan() {
  if (m_pool.activeThreadCount() > 0) return;  // one search at a time; the button says so
  m_autoPlan->setEnabled(false);
  m_autoPlan->setText(tr("Planning..."));
  setMessage(tr("Searching plans..."), false);
  const RunConfig base = m_doc->config();
  const quint64 generation = m_generation;
  m_candidatesBase = base;
  m_pool.start([this, base, generation] {
    auto result = autoPlan(base);
    // `this` outlives the job: the destructor waits for the pool; the queued call is dropped with it.
    QMetaObject::invokeMethod(
        this,
        [this, result, generation] {
          m_autoPlan->setEnabled(true);
          m_autoPlan->setText(tr("Auto-plan..."));
          finishAutoPlan(result, generation);
          if (!m_candidates.empty()) showCandidates();
        },
        Qt::QueuedConnection);
  });
}

void LayerPalette::finishAutoPlan(Expected<AutoPlanResult> result, quint64 generation) {
  m_candidates.clear();
  if (generation != m_generation) {
    setMessage(tr("The project changed while the auto-planner ran: run it again"), true);
    emit autoPlanFinished(false);
    return;
  }
  if (!result) {
    setMessage(tr("Auto-plan found nothing: %1").arg(QString::fromStdString(result.message())), true);
    emit autoPlanFinished(false);
    return;
  }
  m_candidates = result->best;
  setMessage(tr("Auto-plan: %1 layouts considered, %2 simulated in %3 s; %4 best kept")
                 .arg(result->considered)
                 .arg(result->simulated)
                 .arg(result->seconds, 0, 'f', 2)
                 .arg(m_candidates.size()),
             false);
  emit autoPlanFinished(!m_candidates.empty());
}

bool LayerPalette::applyCandidate(int i) {
  if (i < 0 || i >= static_cast<int>(m_candidates.size())) {
    setMessage(tr("There is no candidate %1").arg(i + 1), true);
    return false;
  }
  if (!(m_candidatesBase == m_doc->config())) {
    setMessage(tr("The project changed since the auto-plan: run it again"), true);
    return false;
  }
  const PlanCandidate& c = m_candidates[static_cast<size_t>(i)];
  const ParallelConfig& p = c.config.parallel;
  m_doc->setConfig(tr("Auto-plan: dp %1, tp %2, pp %3").arg(p.dp).arg(p.tp).arg(p.pp), c.config);
  m_candidatesBase = m_doc->config();  // a second apply from the same list stays possible
  setMessage(tr("Applied dp %1, tp %2, pp %3, %4, %5 microbatches: %6 per step predicted")
                 .arg(p.dp)
                 .arg(p.tp)
                 .arg(p.pp)
                 .arg(QString::fromLatin1(toString(p.schedule)))
                 .arg(p.microbatches)
                 .arg(formatSeconds(c.stepTime)),
             false);
  return true;
}

QStringList LayerPalette::candidateHeaders() {
  return {tr("dp"),       tr("tp"),           tr("pp"),     tr("cp"),         tr("ep"),      tr("sequence"),
          tr("schedule"), tr("microbatches"), tr("ZeRO"),   tr("recompute"),  tr("offload"), tr("step"),
          tr("tokens/s"), tr("MFU"),          tr("bubble"), tr("peak memory")};
}

QStringList LayerPalette::candidateRow(const PlanCandidate& c) {
  const ParallelConfig& p = c.config.parallel;
  QString schedule = QString::fromLatin1(toString(p.schedule));
  if (p.virtualChunks > 1) schedule += QStringLiteral(" (v=%1)").arg(p.virtualChunks);
  return {QString::number(p.dp), QString::number(p.tp), QString::number(p.pp), QString::number(p.cp),
          QString::number(p.ep),
          // Sequence parallelism, and its collectives beside the GEMMs (tp_comm_overlap).
          !p.sequenceParallel ? tr("whole")
          : p.tpCommOverlap   ? tr("parallel, overlapped")
                              : tr("parallel"),
          schedule, QString::number(p.microbatches), QString::number(p.zero),
          p.recomputeLayers > 0
              ? tr("%1 (%2 per chunk)").arg(QString::fromLatin1(toString(p.recompute))).arg(p.recomputeLayers)
              : QString::fromLatin1(toString(p.recompute)),
          QString::fromLatin1(toString(p.offload)), formatSeconds(c.stepTime), formatSi(c.tokensPerSecond),
          c.mfuDefined ? formatPercent(c.mfu) : tr("n/a"), formatPercent(c.bubbleFraction),
          tr("%1 of %2").arg(formatBytes(c.peakMemoryBytes), formatBytes(c.capacityBytes))};
}

void LayerPalette::showCandidates() {
  QDialog dialog(this);
  dialog.setWindowTitle(tr("Auto-plan: the fastest layouts that fit"));
  auto* layout = new QVBoxLayout(&dialog);
  auto* table = new QTableWidget(static_cast<int>(m_candidates.size()), candidateHeaders().size(), &dialog);
  table->setHorizontalHeaderLabels(candidateHeaders());
  table->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table->setSelectionBehavior(QAbstractItemView::SelectRows);
  table->setSelectionMode(QAbstractItemView::SingleSelection);
  for (int r = 0; r < table->rowCount(); ++r) {
    const QStringList row = candidateRow(m_candidates[static_cast<size_t>(r)]);
    for (int c = 0; c < row.size(); ++c) table->setItem(r, c, new QTableWidgetItem(row[c]));
  }
  table->resizeColumnsToContents();
  table->selectRow(0);
  layout->addWidget(
      new QLabel(tr("Fastest first (simulated step). Pick one to apply it; Undo takes it back."), &dialog));
  layout->addWidget(table);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, &dialog);
  buttons->button(QDialogButtonBox::Ok)->setText(tr("Apply"));
  layout->addWidget(buttons);
  connect(buttons, &QDialogButtonBox::accepted, &dialog, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, &dialog, &QDialog::reject);
  connect(table, &QTableWidget::cellDoubleClicked, &dialog, &QDialog::accept);
  dialog.resize(900, 320);
  if (dialog.exec() == QDialog::Accepted && table->currentRow() >= 0) applyCandidate(table->currentRow());
}

}  // namespace ms
