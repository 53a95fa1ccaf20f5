// Runs side by side; see compare_view.h.
#include "ui/views/compare_view.h"

#include <qcustomplot.h>

#include <QFileDialog>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QTableWidget>
#include <QVBoxLayout>
#include <cmath>

#include "ui/run/engine_client.h"
#include "ui/run/run_data.h"

namespace ms {

namespace {

QCustomPlot* makePlot(QWidget* parent, const QString& title, const QString& x, const QString& y) {
  auto* p = new QCustomPlot(parent);
  p->plotLayout()->insertRow(0);
  p->plotLayout()->addElement(0, 0, new QCPTextElement(p, title, QFont(QString(), 10, QFont::Bold)));
  p->xAxis->setLabel(x);
  p->yAxis->setLabel(y);
  p->legend->setVisible(true);
  p->legend->setFont(QFont(QString(), 8));
  p->setMinimumSize(280, 220);
  return p;
}

QColor runColor(int i) {
  static const QColor kColors[] = {QColor(31, 119, 180),  QColor(214, 39, 40),  QColor(44, 160, 44),
                                   QColor(148, 103, 189), QColor(255, 127, 14), QColor(140, 86, 75)};
  return kColors[i % 6];
}

}  // namespace

CompareView::CompareView(QWidget* parent) : QWidget(parent) {
  setWindowTitle(tr("Compare runs"));
  auto* layout = new QVBoxLayout(this);
  auto* tools = new QHBoxLayout;
  auto* add = new QPushButton(tr("Add Run Folder..."), this);
  auto* clearButton = new QPushButton(tr("Clear"), this);
  m_message = new QLabel(this);
  tools->addWidget(add);
  tools->addWidget(clearButton);
  tools->addWidget(m_message, 1);
  layout->addLayout(tools);
  connect(add, &QPushButton::clicked, this, [this] {
    const QString dir = QFileDialog::getExistingDirectory(this, tr("Add a run folder"), m_lastDir);
    if (dir.isEmpty()) return;
    m_lastDir = dir;
    const Status s = addRunFolder(dir);
    m_message->setText(s ? QString() : QString::fromStdString(s.message()));
  });
  connect(clearButton, &QPushButton::clicked, this, &CompareView::clear);
  auto* row = new QHBoxLayout;
  m_byStep = makePlot(this, tr("Loss against steps"), tr("step"), tr("loss"));
  m_byTime = makePlot(this, tr("Loss against wall time"), tr("seconds"), tr("loss"));
  m_staleness = makePlot(this, tr("Staleness of the updates"), tr("staleness (server versions)"),
                         tr("fraction of updates"));
  for (QCustomPlot* p : {m_byStep, m_byTime, m_staleness}) row->addWidget(p, 1);
  m_group = new QCPBarsGroup(m_staleness);
  layout->addLayout(row, 3);
  m_table = new QTableWidget(0, NUM_COLUMNS, this);
  m_table->setHorizontalHeaderLabels({tr("run"), tr("consistency"), tr("steps"), tr("eval loss"),
                                      tr("accuracy"), tr("wall s"), tr("mean staleness")});
  m_table->verticalHeader()->setVisible(false);
  m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
  m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
  layout->addWidget(m_table, 1);
  resize(1200, 600);
}

CompareView::~CompareView() = default;

Status CompareView::addRunFolder(const QString& dir) {
  auto data = std::make_shared<RunData>();
  MS_TRY(loadRunFolder(dir, *data));
  if (data->steps().size() == 0) return Status::error(dir.toStdString() + ": the run has no step lines");
  m_lastDir = dir;
  const QString name = data->info().name.isEmpty() ? dir : data->info().name;
  addRun(name, std::move(data));
  return Status::ok();
}

void CompareView::addRun(const QString& label, std::shared_ptr<const RunData> data) {
  m_runs.push_back({label, std::move(data)});
  rebuild();
}

void CompareView::clear() {
  m_runs.clear();
  rebuild();
}

void CompareView::rebuild() {
  for (QCustomPlot* p : {m_byStep, m_byTime, m_staleness}) {
    p->clearGraphs();
    p->clearPlottables();
  }
  m_table->setRowCount(static_cast<int>(m_runs.size()));
  int withStaleness = 0;
  for (size_t i = 0; i < m_runs.size(); ++i) {
    const Run& r = m_runs[i];
    const RunData& d = *r.data;
    const StepSeries& s = d.steps();
    const QPen pen(runColor(static_cast<int>(i)), 1.5);
    QCPGraph* byStep = m_byStep->addGraph();
    byStep->setName(r.label);
    byStep->setPen(pen);
    byStep->setData(s.step, s.loss, true);
    // Wall time: the step lines' clock (a restarted server 0 starts a new clock: such points are left out).
    QVector<double> t, loss;
    double last = -1;
    for (int k = 0; k < s.size(); ++k)
      if (std::isfinite(s.time[k]) && s.time[k] >= last) {
        t.push_back(s.time[k]);
        loss.push_back(s.loss[k]);
        last = s.time[k];
      }
    QCPGraph* byTime = m_byTime->addGraph();
    byTime->setName(r.label);
    byTime->setPen(pen);
    byTime->setData(t, loss, true);
    // Staleness, as fractions of the run's updates.
    double mean = kNaN;
    if (d.lastPs() && !d.lastPs()->stalenessTotal.empty()) {
      const auto& h = d.lastPs()->stalenessTotal;
      double total = 0, weighted = 0;
      for (size_t k = 0; k < h.size(); ++k) {
        total += double(h[k]);
        weighted += double(k) * double(h[k]);
      }
      QVector<double> keys, values;
      for (size_t k = 0; k < h.size(); ++k) {
        keys.push_back(double(k));
        values.push_back(total > 0 ? double(h[k]) / total : 0.0);
      }
      auto* bars = new QCPBars(m_staleness->xAxis, m_staleness->yAxis);
      bars->setName(r.label);
      bars->setBrush(runColor(static_cast<int>(i)));
      bars->setPen(Qt::NoPen);
      bars->setWidth(0.8 / std::max<size_t>(1, m_runs.size()));
      bars->setData(keys, values, true);
      bars->setBarsGroup(m_group);
      mean = total > 0 ? weighted / total : kNaN;
      ++withStaleness;
    }
    const auto& eval = d.lastEvalLine();
    const double wall = t.isEmpty() ? kNaN : t.back();
    const QString cells[NUM_COLUMNS] = {
        r.label,
        d.info().consistency.isEmpty() ? tr("collective") : d.info().consistency,
        QString::number(s.size() ? s.step.back() : 0),
        eval ? QString::number(eval->loss, 'f', 4) : QStringLiteral("–"),
        eval && std::isfinite(eval->accuracy)
            ? QString::number(100 * eval->accuracy, 'f', 2) + QStringLiteral("%")
            : QStringLiteral("–"),
        std::isfinite(wall) ? QString::number(wall, 'f', 1) : QStringLiteral("–"),
        std::isfinite(mean) ? QString::number(mean, 'f', 2) : QStringLiteral("–")};
    for (int c = 0; c < NUM_COLUMNS; ++c)
      m_table->setItem(static_cast<int>(i), c, new QTableWidgetItem(cells[c]));
  }
  (void)withStaleness;
  for (QCustomPlot* p : {m_byStep, m_byTime, m_staleness}) {
    p->rescaleAxes();
    p->replot();
  }
}

}  // namespace ms
