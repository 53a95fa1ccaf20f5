// The parameter-server side tab; see ps_panel.h.
#include "ui/views/ps_panel.h"

#include <qcustomplot.h>

#include <QHeaderView>
#include <QLabel>
#include <QTableWidget>
#include <QVBoxLayout>
#include <cmath>

#include "ui/run/run_data.h"

namespace ms {

PsPanel::PsPanel(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(2, 2, 2, 2);
  m_summary = new QLabel(this);
  m_summary->setWordWrap(true);
  layout->addWidget(m_summary);

  m_histogram = new QCustomPlot(this);
  m_histogram->plotLayout()->insertRow(0);
  m_histogram->plotLayout()->addElement(0, 0,
                                        new QCPTextElement(m_histogram, tr("Staleness of every update")));
  m_histogram->xAxis->setLabel(tr("staleness (server versions)"));
  m_histogram->yAxis->setLabel(tr("updates"));
  auto* bars = new QCPBars(m_histogram->xAxis, m_histogram->yAxis);
  bars->setWidth(0.8);
  bars->setBrush(QColor(70, 130, 180));
  bars->setPen(Qt::NoPen);
  m_histogram->setMinimumHeight(150);
  layout->addWidget(m_histogram, 1);

  m_staleness = new QCustomPlot(this);
  m_staleness->plotLayout()->insertRow(0);
  m_staleness->plotLayout()->addElement(0, 0, new QCPTextElement(m_staleness, tr("Mean staleness")));
  m_staleness->xAxis->setLabel(tr("step"));
  m_staleness->yAxis->setLabel(tr("versions"));
  m_staleness->addGraph()->setName(tr("measured"));
  QCPGraph* predicted = m_staleness->addGraph();
  predicted->setName(tr("predicted"));
  predicted->setPen(QPen(Qt::gray, 1.5, Qt::DashLine));
  m_staleness->setMinimumHeight(120);
  layout->addWidget(m_staleness, 1);

  m_table = new QTableWidget(0, NUM_COLUMNS, this);
  m_table->setHorizontalHeaderLabels(
      {tr("worker"), tr("state"), tr("pushes"), tr("samples/s"), tr("step s")});
  m_table->verticalHeader()->setVisible(false);
  m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
  m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
  m_table->setToolTip(
      tr("Each worker as server 0 sees it: live, or dropped after worker_timeout_s of silence; its "
         "pushes applied; its samples/s and step time since the previous report."));
  layout->addWidget(m_table, 1);
}

void PsPanel::setPredictedStaleness(double mean) {
  const bool has = std::isfinite(mean);
  if (has == m_hasPrediction && (!has || mean == m_predicted)) return;
  m_hasPrediction = has;
  m_predicted = mean;
  m_shown = ~std::uint64_t(0);
}

QString PsPanel::summary() const {
  return m_summary->text();
}

void PsPanel::update(const RunData& data) {
  if (data.revision() == m_shown) return;
  m_shown = data.revision();
  const RunInfo& info = data.info();
  const std::optional<PsEvent>& ps = data.lastPs();
  // Histogram of the run's updates.
  auto* bars = qobject_cast<QCPBars*>(m_histogram->plottable(0));
  QVector<double> keys, values;
  std::int64_t updates = 0, weighted = 0, most = 0;
  if (ps) {
    for (std::size_t s = 0; s < ps->stalenessTotal.size(); ++s) {
      keys.push_back(double(s));
      values.push_back(double(ps->stalenessTotal[s]));
      updates += ps->stalenessTotal[s];
      weighted += static_cast<std::int64_t>(s) * ps->stalenessTotal[s];
      if (ps->stalenessTotal[s] > 0) most = static_cast<std::int64_t>(s);
    }
  }
  bars->setData(keys, values, true);
  m_histogram->xAxis->setRange(-0.6, std::max<double>(keys.size(), 1) - 0.4);
  double top = 1;
  for (double v : values) top = std::max(top, v);
  m_histogram->yAxis->setRange(0, top * 1.1);
  // Mean staleness against the step.
  const QVector<double>& steps = data.psSteps();
  m_staleness->graph(0)->setData(steps, data.psMeanStaleness(), true);
  if (m_hasPrediction && !steps.isEmpty())
    m_staleness->graph(1)->setData({steps.front(), steps.back()}, {m_predicted, m_predicted}, true);
  else
    m_staleness->graph(1)->data()->clear();
  m_staleness->rescaleAxes();
  if (m_staleness->yAxis->range().lower > 0) m_staleness->yAxis->setRangeLower(0);
  // Workers.
  const int rows = ps ? static_cast<int>(ps->workers.size()) : 0;
  m_table->setRowCount(rows);
  int live = 0;
  for (int r = 0; r < rows; ++r) {
    const PsWorkerState& w = ps->workers[static_cast<size_t>(r)];
    live += w.live ? 1 : 0;
    const QString cells[NUM_COLUMNS] = {
        QString::number(w.worker), w.live ? tr("live") : (ps->final ? tr("finished") : tr("dropped")),
        QString::number(w.steps),
        std::isfinite(w.samplesPerS) ? QString::number(w.samplesPerS, 'f', 0) : QStringLiteral("–"),
        std::isfinite(w.stepTime) ? QString::number(w.stepTime, 'g', 3) : QStringLiteral("–")};
    for (int c = 0; c < NUM_COLUMNS; ++c) {
      QTableWidgetItem* item = m_table->item(r, c);
      if (!item) m_table->setItem(r, c, item = new QTableWidgetItem);
      if (item->text() != cells[c]) item->setText(cells[c]);
    }
  }
  QString text =
      tr("%1 server(s), %2 worker(s), %3").arg(info.psServers).arg(info.psWorkers).arg(info.consistency);
  if (ps) {
    text += tr(" — %1 updates applied, mean staleness %2, largest %3")
                .arg(updates)
                .arg(updates ? double(weighted) / double(updates) : 0.0, 0, 'f', 2)
                .arg(most);
    if (m_hasPrediction) text += tr(" (predicted mean %1)").arg(m_predicted, 0, 'f', 2);
    if (!ps->final) text += tr("; %1 of %2 workers live").arg(live).arg(rows);
    if (ps->discarded > 0) text += tr("; %1 stale pushes discarded").arg(ps->discarded);
  }
  m_summary->setText(text);
  for (QCustomPlot* p : {m_histogram, m_staleness}) p->replot(QCustomPlot::rpQueuedReplot);
}

}  // namespace ms
