// RunView; see run_view.h.
#include "ui/views/run_view.h"

#include <qcustomplot.h>

#include <QDir>
#include <QHeaderView>
#include <QLabel>
#include <QPlainTextEdit>
#include <QSplitter>
#include <QTableWidget>
#include <QVBoxLayout>
#include <cmath>
#include <map>

#include "ui/run/engine_client.h"
#include "ui/run/run_data.h"

namespace ms {

namespace {

QCustomPlot* makePlot(QWidget* parent, const QString& title, const QString& yLabel, const QString& measured,
                      const QString& second, bool secondIsPoints) {
  auto* plot = new QCustomPlot(parent);
  plot->setMinimumSize(220, 160);
  plot->plotLayout()->insertRow(0);
  plot->plotLayout()->addElement(
      0, 0, new QCPTextElement(plot, title, QFont(plot->font().family(), 10, QFont::Bold)));
  plot->xAxis->setLabel(QStringLiteral("step"));
  plot->yAxis->setLabel(yLabel);
  plot->legend->setVisible(true);
  plot->legend->setFont(QFont(plot->font().family(), 8));
  plot->axisRect()->insetLayout()->setInsetAlignment(0, Qt::AlignTop | Qt::AlignRight);
  plot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
  QCPGraph* g0 = plot->addGraph();
  g0->setName(measured);
  g0->setPen(QPen(QColor(31, 119, 180), 1.5));
  QCPGraph* g1 = plot->addGraph();
  g1->setName(second);
  if (secondIsPoints) {
    g1->setLineStyle(QCPGraph::lsNone);
    g1->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDisc, QColor(214, 39, 40), 6));
    g1->setPen(QPen(QColor(214, 39, 40)));
  } else {
    QPen dashed(QColor(255, 127, 14), 1.5, Qt::DashLine);
    g1->setPen(dashed);
  }
  return plot;
}

QString mib(double bytes) {
  return bytes > 0 && std::isfinite(bytes) ? QString::number(bytes / (1024.0 * 1024.0), 'f', 2)
                                           : QStringLiteral("–");
}

QString percent(double fraction) {
  return fraction >= 0 && std::isfinite(fraction)
             ? QString::number(100.0 * fraction, 'f', 1) + QLatin1Char('%')
             : QStringLiteral("–");
}

QString compact(double v) {
  if (!std::isfinite(v)) return QStringLiteral("–");
  return QString::number(v, 'g', 4);
}

// Sets a plot's axis to a range with a margin, never empty.
void setAxis(QCPAxis* axis, double lo, double hi, double margin) {
  if (hi <= lo) {
    const double pad = std::abs(lo) > 0 ? std::abs(lo) * 0.1 : 1.0;
    lo -= pad;
    hi += pad;
  } else {
    const double pad = (hi - lo) * margin;
    lo -= pad;
    hi += pad;
  }
  axis->setRange(lo, hi);
}

}  // namespace

void RunView::Range::add(double v) {
  if (!std::isfinite(v)) return;
  if (!any) {
    lo = hi = v;
    any = true;
  } else {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
}

RunView::RunView(QWidget* parent) : QWidget(parent) {
  m_status = new QLabel(QStringLiteral("no run"), this);
  m_status->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_status->setWordWrap(true);
  m_loss = makePlot(this, QStringLiteral("Loss"), QStringLiteral("loss"), QStringLiteral("train"),
                    QStringLiteral("eval"), true);
  m_throughput = makePlot(this, QStringLiteral("Throughput"), QStringLiteral("tokens/s"),
                          QStringLiteral("measured"), QStringLiteral("predicted"), false);
  m_stepTime = makePlot(this, QStringLiteral("Step time"), QStringLiteral("seconds"),
                        QStringLiteral("measured"), QStringLiteral("predicted"), false);
  m_table = new QTableWidget(0, NUM_COLUMNS, this);
  m_table->setHorizontalHeaderLabels({QStringLiteral("rank"), QStringLiteral("stage"),
                                      QStringLiteral("predicted peak MiB"),
                                      QStringLiteral("measured peak MiB"), QStringLiteral("predicted bubble"),
                                      QStringLiteral("measured bubble")});
  m_table->verticalHeader()->setVisible(false);
  m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
  m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  m_table->setToolTip(QStringLiteral(
      "Predicted: the plan's memory model and simulated step. Measured: the largest per-step peak the engine "
      "counted, and the bubble averaged over the last steps received (1 - F/B/W time over the pipeline "
      "window)."));
  m_log = new QPlainTextEdit(this);
  m_log->setReadOnly(true);
  m_log->setMaximumBlockCount(static_cast<int>(RunData::kMaxLogLines));
  m_log->setLineWrapMode(QPlainTextEdit::NoWrap);
  m_log->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));

  auto* charts = new QWidget(this);
  auto* grid = new QGridLayout(charts);
  grid->setContentsMargins(0, 0, 0, 0);
  grid->addWidget(m_loss, 0, 0);
  grid->addWidget(m_throughput, 0, 1);
  grid->addWidget(m_stepTime, 1, 0);
  grid->addWidget(m_table, 1, 1);
  auto* split = new QSplitter(Qt::Vertical, this);
  split->addWidget(charts);
  split->addWidget(m_log);
  split->setStretchFactor(0, 3);
  split->setStretchFactor(1, 1);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(m_status);
  layout->addWidget(split, 1);

  m_timer.setInterval(kRefreshMs);
  connect(&m_timer, &QTimer::timeout, this, &RunView::refresh);
  m_timer.start();
}

void RunView::setClient(EngineClient* client) {
  if (m_client) m_client->disconnect(this);
  m_client = client;
  m_data = nullptr;
  forgetShown();
  if (client) {
    // The end of a run is shown at once, not at the next tick.
    connect(client, &EngineClient::finished, this, &RunView::refresh);
    connect(client, &QObject::destroyed, this, [this] {
      m_client = nullptr;
      refresh();
    });
  }
  refresh();
}

void RunView::setData(const RunData* data) {
  if (m_client) m_client->disconnect(this);
  m_client = nullptr;
  m_data = data;
  forgetShown();
  refresh();
}

void RunView::forgetShown() {
  m_shownRevision = ~std::uint64_t(0);
  m_shownEpoch = ~std::uint64_t(0);
  m_shownGeneration = ~std::uint64_t(0);
}

const RunData* RunView::data() const {
  return m_client ? &m_client->data() : m_data;
}

void RunView::refresh() {
  const RunData* d = data();
  const std::uint64_t revision = d ? d->revision() : 0;
  if (revision == m_shownRevision) return;
  m_shownRevision = revision;
  const std::uint64_t generation = d ? d->generation() : ~std::uint64_t(0);
  if (generation != m_shownGeneration) {  // a new run (or another source): nothing shown still holds
    m_shownGeneration = generation;
    m_shownEpoch = ~std::uint64_t(0);
    m_log->clear();
    m_shownLog = 0;
  }
  updatePlots();
  updateTable();
  updateStatus();
  updateLog();
  replotAll();
}

void RunView::resetPlots() {
  for (QCustomPlot* p : {m_loss, m_throughput, m_stepTime})
    for (int i = 0; i < p->graphCount(); ++i) p->graph(i)->data()->clear();
  m_plottedSteps = 0;
  m_plottedEvals = 0;
  m_stepRange.reset();
  m_lossRange.reset();
  m_throughputRange.reset();
  m_stepTimeRange.reset();
}

void RunView::updatePlots() {
  const RunData* d = data();
  if (!d) {
    resetPlots();
    m_shownEpoch = ~std::uint64_t(0);
    return;
  }
  const StepSeries& s = d->steps();
  const EvalSeries& e = d->evals();
  if (d->seriesEpoch() != m_shownEpoch || s.size() < m_plottedSteps || e.size() < m_plottedEvals) {
    resetPlots();
    m_shownEpoch = d->seriesEpoch();
  }
  // Append only what is new (sorted: the series are sorted by step).
  if (s.size() > m_plottedSteps) {
    const int from = m_plottedSteps;
    const QVector<double> keys = s.step.mid(from);
    m_loss->graph(0)->addData(keys, s.loss.mid(from), true);
    m_throughput->graph(0)->addData(keys, s.throughput.mid(from), true);
    m_stepTime->graph(0)->addData(keys, s.stepTime.mid(from), true);
    for (int i = from; i < s.size(); ++i) {
      m_stepRange.add(s.step[i]);
      m_lossRange.add(s.loss[i]);
      m_throughputRange.add(s.throughput[i]);
      m_stepTimeRange.add(s.stepTime[i]);
    }
    m_plottedSteps = s.size();
  }
  if (e.size() > m_plottedEvals) {
    const int from = m_plottedEvals;
    m_loss->graph(1)->addData(e.step.mid(from), e.loss.mid(from), true);
    for (int i = from; i < e.size(); ++i) {
      m_stepRange.add(e.step[i]);
      m_lossRange.add(e.loss[i]);
    }
    m_plottedEvals = e.size();
  }
  const QString unit = s.throughputIsTokens ? QStringLiteral("tokens/s") : QStringLiteral("samples/s");
  if (unit != m_throughputUnit) {
    m_throughputUnit = unit;
    m_throughput->yAxis->setLabel(unit);
  }
  updatePredictedLines();
}

void RunView::updatePredictedLines() {
  const RunData* d = data();
  const RunInfo& info = d->info();
  // The x axis spans the whole planned run, so the curves show how far it has come.
  double x0 = m_stepRange.any ? m_stepRange.lo : double(info.startStep + 1);
  double x1 = std::max(m_stepRange.any ? m_stepRange.hi : x0, double(info.steps));
  if (info.known) x0 = std::min(x0, double(info.startStep + 1));
  const double predictedThroughput = info.predictedThroughput();
  const double predictedStepTime = info.predictedStepTime;
  auto line = [&](QCPGraph* g, double y) {
    g->data()->clear();
    if (std::isfinite(y) && y > 0) g->addData(QVector<double>{x0, x1}, QVector<double>{y, y}, true);
  };
  line(m_throughput->graph(1), predictedThroughput);
  line(m_stepTime->graph(1), predictedStepTime);

  for (QCustomPlot* p : {m_loss, m_throughput, m_stepTime}) setAxis(p->xAxis, x0, x1, 0.02);
  setAxis(m_loss->yAxis, m_lossRange.any ? m_lossRange.lo : 0, m_lossRange.any ? m_lossRange.hi : 1, 0.05);
  Range t = m_throughputRange;
  t.add(predictedThroughput);
  t.add(0);
  setAxis(m_throughput->yAxis, t.any ? t.lo : 0, t.any ? t.hi : 1, 0.05);
  Range st = m_stepTimeRange;
  st.add(predictedStepTime);
  st.add(0);
  setAxis(m_stepTime->yAxis, st.any ? st.lo : 0, st.any ? st.hi : 1, 0.05);
}

void RunView::updateTable() {
  const RunData* d = data();
  struct Row {
    int stage = -1;
    double predictedBytes = kNaN, measuredBytes = kNaN, predictedBubble = kNaN, measuredBubble = kNaN;
  };
  std::map<int, Row> rows;
  if (d) {
    const RunInfo& info = d->info();
    for (const PredictedRank& p : info.predictedRanks) {
      Row& r = rows[p.rank];
      r.stage = p.stage;
      r.predictedBytes = p.memory.total;
      r.predictedBubble = p.bubbleFraction;
    }
    for (const MeasuredMemory& m : d->memory()) rows[m.rank].measuredBytes = m.peak.total;
    for (const auto& [rank, bubble] : d->meanMeasuredBubble()) rows[rank].measuredBubble = bubble;
    const int stageWidth = std::max(1, info.dp * info.tp);
    for (auto& [rank, r] : rows)
      if (r.stage < 0) r.stage = rank / stageWidth;
  }
  // Filled with the header's resize-to-contents off: in that mode every changed cell re-measures every row
  // (1.8 s for a 256-rank run's table); one measure at the end instead.
  QHeaderView* header = m_table->horizontalHeader();
  header->setSectionResizeMode(QHeaderView::Interactive);
  m_table->setUpdatesEnabled(false);
  m_table->setRowCount(static_cast<int>(rows.size()));
  int i = 0;
  auto set = [&](int row, int col, const QString& text) {
    QTableWidgetItem* item = m_table->item(row, col);
    if (!item) {
      item = new QTableWidgetItem;
      item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
      m_table->setItem(row, col, item);
    }
    if (item->text() != text) item->setText(text);
  };
  for (const auto& [rank, r] : rows) {
    set(i, ColRank, QString::number(rank));
    set(i, ColStage, QString::number(r.stage));
    set(i, ColPredictedMiB, mib(r.predictedBytes));
    set(i, ColMeasuredMiB, mib(r.measuredBytes));
    set(i, ColPredictedBubble, percent(r.predictedBubble));
    set(i, ColMeasuredBubble, percent(r.measuredBubble));
    ++i;
  }
  m_table->setUpdatesEnabled(true);
  header->setSectionResizeMode(QHeaderView::ResizeToContents);
}

void RunView::updateStatus() {
  const RunData* d = data();
  QString text;
  if (!d) {
    text = QStringLiteral("no run");
  } else {
    const RunInfo& info = d->info();
    const StepSeries& s = d->steps();
    const QString name = info.name.isEmpty() ? QString() : info.name + QStringLiteral(": ");
    const QString lastLoss = s.size() ? compact(s.loss.back()) : QString();
    switch (d->state()) {
      case RunState::Idle:
        text = QStringLiteral("no run");
        break;
      case RunState::Starting:
        text = QStringLiteral("starting the engine…");
        break;
      case RunState::Running:
        text = name + QStringLiteral("running · step %1 of %2").arg(d->lastStep()).arg(info.steps);
        if (s.size())
          text += QStringLiteral(" · loss %1 · %2 %3")
                      .arg(lastLoss, compact(s.throughput.back()),
                           s.throughputIsTokens ? QStringLiteral("tokens/s") : QStringLiteral("samples/s"));
        break;
      case RunState::Finished:
        text = name + QStringLiteral("finished ok · %1 steps").arg(d->lastStep());
        if (s.size()) text += QStringLiteral(" · final loss ") + lastLoss;
        if (d->evals().size()) text += QStringLiteral(" · eval loss ") + compact(d->evals().loss.back());
        break;
      case RunState::Interrupted:
        text = name + QStringLiteral("stopped: ") + d->stateMessage();
        break;
      case RunState::Failed:
        text = name + QStringLiteral("failed: ") + d->stateMessage();
        break;
      case RunState::Incomplete:
        text = name + QStringLiteral("incomplete: ") + d->stateMessage();
        break;
    }
    if (d->errorTotal() > 0)
      text += QStringLiteral(" · %1 malformed metrics line(s), see the log").arg(d->errorTotal());
  }
  if (m_status->text() != text) m_status->setText(text);
}

void RunView::updateLog() {
  const RunData* d = data();
  if (!d) {
    m_log->clear();
    m_shownLog = 0;
    return;
  }
  const std::deque<LogLine>& log = d->log();
  const std::uint64_t fresh = std::min<std::uint64_t>(d->logTotal() - m_shownLog, log.size());
  if (fresh == 0) return;
  QString text;
  for (auto it = log.end() - static_cast<std::ptrdiff_t>(fresh); it != log.end(); ++it) {
    if (!text.isEmpty()) text += QLatin1Char('\n');
    switch (it->source) {
      case LogLine::Stream:
        if (it->level != QLatin1String("info")) text += QLatin1Char('[') + it->level + QStringLiteral("] ");
        break;
      case LogLine::Stderr:
        break;
      case LogLine::Studio:
        text += QStringLiteral("[studio] ");
        break;
    }
    text += it->message;
  }
  m_log->appendPlainText(text);
  m_shownLog = d->logTotal();
}

void RunView::replotAll() {
  if (!isVisible()) return;  // showEvent replots
  for (QCustomPlot* p : {m_loss, m_throughput, m_stepTime}) p->replot(QCustomPlot::rpQueuedReplot);
}

void RunView::showEvent(QShowEvent* event) {
  QWidget::showEvent(event);
  refresh();
  for (QCustomPlot* p : {m_loss, m_throughput, m_stepTime}) p->replot(QCustomPlot::rpQueuedReplot);
}

QString RunView::statusText() const {
  return m_status->text();
}

QString RunView::logText() const {
  return m_log->toPlainText();
}

bool RunView::savePlots(const QString& dir, const QString& format) {
  const QString f = format.toLower();
  if (f != QLatin1String("png") && f != QLatin1String("pdf")) return false;
  if (!QDir().mkpath(dir)) return false;
  refresh();
  bool ok = true;
  const std::pair<const char*, QCustomPlot*> plots[] = {
      {"loss", m_loss}, {"throughput", m_throughput}, {"step_time", m_stepTime}};
  for (const auto& [name, plot] : plots) {
    // A hidden view has no laid-out size: export at a fixed one.
    const bool sized = plot->isVisible() && plot->width() >= 200 && plot->height() >= 150;
    const int w = sized ? plot->width() : 800, h = sized ? plot->height() : 500;
    const QString file = QDir(dir).filePath(QString::fromLatin1(name) + QLatin1Char('.') + f);
    ok &= f == QLatin1String("png") ? plot->savePng(file, w, h) : plot->savePdf(file, w, h);
  }
  return ok;
}

}  // namespace ms
