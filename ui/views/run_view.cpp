// RunView; see run_view.h.
#include "ui/views/run_view.h"

#include <qcustomplot.h>

#include <QDir>
#include <QEvent>
#include <QHeaderView>
#include <QLabel>
#include <QPlainTextEdit>
#include <QSplitter>
#include <QTabWidget>
#include <QTableWidget>
#include <QVBoxLayout>
#include <cmath>
#include <map>

#include "ui/models/plan_analysis.h"
#include "ui/models/units.h"
#include "ui/run/engine_client.h"
#include "ui/run/run_data.h"
#include "ui/views/memory_view.h"
#include "ui/views/ps_panel.h"
#include "ui/views/timeline_view.h"

namespace ms {

namespace {

constexpr int kTickSpacingX = 110;  // pixels between x tick labels at least ("100 k" needs ~40)
constexpr int kTickSpacingY = 55;

// Tick labels with one SI prefix per axis (chosen by the range) and as many decimals as the tick step needs,
// so labels are short and alike ("20 k", "40 k"; "4.5", "5.0"; "0.025", "0.050").
class SiTicker : public QCPAxisTicker {
 protected:
  double getTickStep(const QCPRange& range) override {
    m_step = QCPAxisTicker::getTickStep(range);
    m_magnitude = std::max(std::abs(range.lower), std::abs(range.upper));
    return m_step;
  }
  QString getTickLabel(double tick, const QLocale&, QChar, int) override {
    static const char* prefixes[] = {"", " k", " M", " G", " T"};
    int p = 0;
    double scale = 1;
    while (p < 4 && m_magnitude / scale >= 1000) scale *= 1000, ++p;
    const double step = m_step / scale;
    int decimals = 0;
    while (decimals < 6 && step > 0 &&
           std::abs(step * std::pow(10.0, decimals) - std::round(step * std::pow(10.0, decimals))) > 1e-6)
      ++decimals;
    if (std::abs(tick) < m_step * 1e-6) return QStringLiteral("0");
    return QString::number(tick / scale, 'f', decimals) + QString::fromLatin1(prefixes[p]);
  }

 private:
  double m_step = 1, m_magnitude = 1;
};

QCustomPlot* makePlot(QWidget* parent, const QString& title, const QString& yLabel, const QString& measured,
                      const QString& second, bool secondIsPoints) {
  auto* plot = new QCustomPlot(parent);
  plot->setMinimumSize(240, 180);
  plot->plotLayout()->insertRow(0);
  plot->plotLayout()->addElement(
      0, 0,
      new QCPTextElement(plot, title,
                         QFont(plot->font().family(), plot->font().pointSize() + 1, QFont::Bold)));
  // The legend in a row of its own under the title: it never covers a curve.
  plot->plotLayout()->insertRow(1);
  plot->axisRect()->insetLayout()->take(plot->legend);
  plot->plotLayout()->addElement(1, 0, plot->legend);
  plot->plotLayout()->setRowStretchFactor(1, 0.001);
  plot->legend->setVisible(true);
  plot->legend->setFillOrder(QCPLayoutGrid::foColumnsFirst);
  plot->legend->setBorderPen(Qt::NoPen);
  plot->legend->setMargins(QMargins(4, 0, 4, 0));
  plot->xAxis->setLabel(QObject::tr("step"));
  plot->yAxis->setLabel(yLabel);
  for (QCPAxis* axis : {plot->xAxis, plot->yAxis}) axis->setTicker(QSharedPointer<SiTicker>::create());
  plot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
  // Solid curves as one polyline instead of stroke by stroke: a noisy curve of tens of thousands of points
  // (RunData's min/max pairs) cost 30 ms a replot without this hint and 1 ms with it (measured once on the
  // 400 px wide loss plot after tst_ui_run's flood, 28k rows); the joins are a little coarser.
  plot->setPlottingHint(QCP::phFastPolylines, true);
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
    g1->setPen(QPen(QColor(255, 127, 14), 1.5, Qt::DashLine));
  }
  return plot;
}

QString percent(double fraction) {
  return fraction >= 0 && std::isfinite(fraction) ? formatPercent(fraction) : QStringLiteral("–");
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

// As many ticks as the plot's size leaves room for.
void RunView::fitTicks(QCustomPlot* plot) {
  const QRect r = plot->axisRect()->rect();
  plot->xAxis->ticker()->setTickCount(std::max(2, r.width() / kTickSpacingX));
  plot->yAxis->ticker()->setTickCount(std::max(2, r.height() / kTickSpacingY));
}

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
  m_status = new QLabel(tr("no run"), this);
  m_status->setObjectName(QStringLiteral("runStatus"));
  m_status->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_status->setWordWrap(true);
  QFont statusFont = m_status->font();
  statusFont.setPointSizeF(statusFont.pointSizeF() * 1.1);
  m_status->setFont(statusFont);
  m_loss = makePlot(this, tr("Loss"), tr("loss"), tr("train"), tr("eval"), true);
  // A mixture of experts' load-balancing loss (the step lines' "aux_loss"), in the legend once a run has one.
  QCPGraph* aux = m_loss->addGraph();
  aux->setName(tr("load balancing"));
  aux->setPen(QPen(QColor(44, 160, 44), 1.5, Qt::DotLine));
  aux->removeFromLegend();
  m_throughput = makePlot(this, tr("Throughput"), tr("tokens/s"), tr("measured"), tr("predicted"), false);
  m_stepTime = makePlot(this, tr("Step time"), tr("seconds"), tr("measured"), tr("predicted"), false);
  for (QCustomPlot* p : {m_loss, m_throughput, m_stepTime}) p->installEventFilter(this);

  m_measured = new TimelineView(this);
  m_measured->setTitle(tr("Measured step (latest)"));
  m_predicted = new TimelineView(this);
  m_predicted->setTitle(tr("Predicted step"));
  for (TimelineView* v : {m_measured, m_predicted}) {
    connect(v, &TimelineView::preferredHeaderWidthChanged, this, &RunView::alignTimelines);
    // Zooming or panning one moves the other: the two are read against each other.
    connect(v, &TimelineView::viewRangeChanged, this, [this, v](double t0, double t1) {
      if (m_aligning) return;
      TimelineView* other = v == m_measured ? m_predicted : m_measured;
      if (v->followsData()) {
        // A fit (new data, or Fit asked for): both fit the union of their steps again.
        m_aligning = true;
        other->fitAll();
        m_aligning = false;
        alignTimelines();
        return;
      }
      m_aligning = true;
      other->setViewRange(t0, t1);
      m_aligning = false;
    });
  }

  m_memory = new MemoryView(this);
  m_memory->setTitle(tr("Peak memory, predicted and measured"));
  m_table = new QTableWidget(0, NUM_COLUMNS, this);
  m_table->verticalHeader()->setVisible(false);
  m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
  m_table->setWordWrap(false);
  QHeaderView* header = m_table->horizontalHeader();
  header->setSectionResizeMode(QHeaderView::Stretch);
  header->setSectionResizeMode(ColRank, QHeaderView::ResizeToContents);
  header->setSectionResizeMode(ColStage, QHeaderView::ResizeToContents);
  m_table->setToolTip(tr(
      "Predicted: the plan's memory model and simulated step. Measured: the largest per-step peak the engine "
      "counted, and the bubble averaged over the last steps received (1 - F/B/W time over the pipeline "
      "window)."));
  m_log = new QPlainTextEdit(this);
  m_log->setReadOnly(true);
  m_log->setMaximumBlockCount(static_cast<int>(RunData::kMaxLogLines));
  m_log->setLineWrapMode(QPlainTextEdit::NoWrap);
  m_log->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
  m_side = new QTabWidget(this);
  m_side->addTab(m_memory, tr("Memory"));
  m_side->addTab(m_table, tr("Per rank"));
  m_side->addTab(m_log, tr("Log"));
  m_ps = new PsPanel(this);
  m_side->addTab(m_ps, tr("Parameter server"));
  m_side->setTabVisible(PsTab, false);

  auto* plots = new QWidget(this);
  auto* plotRow = new QHBoxLayout(plots);
  plotRow->setContentsMargins(0, 0, 0, 0);
  plotRow->setSpacing(4);
  for (QCustomPlot* p : {m_loss, m_throughput, m_stepTime}) plotRow->addWidget(p, 1);
  auto* timelines = new QSplitter(Qt::Vertical, this);
  timelines->addWidget(m_measured);
  timelines->addWidget(m_predicted);
  auto* bottom = new QSplitter(Qt::Horizontal, this);
  bottom->addWidget(timelines);
  bottom->addWidget(m_side);
  bottom->setStretchFactor(0, 3);
  bottom->setStretchFactor(1, 2);
  bottom->setSizes({3000, 2000});  // proportions: the timelines get the width
  auto* split = new QSplitter(Qt::Vertical, this);
  split->addWidget(plots);
  split->addWidget(bottom);
  split->setStretchFactor(0, 9);
  split->setStretchFactor(1, 11);
  split->setSizes({900, 1100});
  split->setChildrenCollapsible(false);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
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

void RunView::setPlan(std::shared_ptr<const PlanSnapshot> plan) {
  m_plan = plan && plan->ok() ? std::move(plan) : nullptr;
  m_predicted->setData(m_plan ? std::shared_ptr<const TimelineData>(m_plan, &m_plan->timeline) : nullptr);
  m_memory->setModelStates(m_plan && m_plan->plan
                               ? modelStateText(m_plan->plan->config.parallel, m_plan->plan->config.optimizer)
                               : ModelStateText{});
  const MemoryBars bars = m_plan ? memoryBars(*m_plan) : MemoryBars{};
  m_memory->setPredicted(bars.memory, bars.names, bars.groupNames);
  updateMemory();
  updateTable();
  alignTimelines();
}

void RunView::forgetShown() {
  m_shownRevision = ~std::uint64_t(0);
  m_shownEpoch = ~std::uint64_t(0);
  m_shownGeneration = ~std::uint64_t(0);
  m_shownTimelineRevision = ~std::uint64_t(0);
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
  updateMemory();
  updateStatus();
  updateLog();
  // Parameter-server runs: their tab, shown only for them.
  const bool ps = d && d->info().psWorkers > 0;
  if (m_side->isTabVisible(PsTab) != ps) m_side->setTabVisible(PsTab, ps);
  if (ps) {
    m_ps->setPredictedStaleness(d->info().predictedMeanStaleness);
    m_ps->update(*d);
  }
  // The measured timeline: replaced when a new step's spans arrived.
  const std::uint64_t timelineRevision = d ? std::uint64_t(d->timelineStep()) ^ (generation << 32) : 0;
  if (timelineRevision != m_shownTimelineRevision) {
    m_shownTimelineRevision = timelineRevision;
    m_measured->setData(d && !d->timeline().rows.empty() ? std::make_shared<const TimelineData>(d->timeline())
                                                         : nullptr);
    alignTimelines();
  }
  replotAll();
}

void RunView::alignTimelines() {
  if (m_aligning) return;
  m_aligning = true;
  const int width = std::max(m_measured->preferredHeaderWidth(), m_predicted->preferredHeaderWidth());
  m_measured->setHeaderWidth(width);
  m_predicted->setHeaderWidth(width);
  // While neither was zoomed by hand, both show the union of their steps, so equal times line up.
  if (m_measured->followsData() && m_predicted->followsData()) {
    double end = 0;
    for (TimelineView* v : {m_measured, m_predicted})
      if (v->data()) end = std::max(end, v->data()->end);
    if (end > 0)
      for (TimelineView* v : {m_measured, m_predicted}) v->fitRange(0, end);
  }
  m_aligning = false;
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
  m_loss->graph(2)->removeFromLegend();  // back once the series shows a load-balancing loss
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
    m_loss->graph(2)->addData(keys, s.auxLoss.mid(from), true);
    m_throughput->graph(0)->addData(keys, s.throughput.mid(from), true);
    m_stepTime->graph(0)->addData(keys, s.stepTime.mid(from), true);
    for (int i = from; i < s.size(); ++i) {
      m_stepRange.add(s.step[i]);
      m_lossRange.add(s.loss[i]);
      if (std::isfinite(s.auxLoss[i])) {
        m_lossRange.add(s.auxLoss[i]);
        if (!m_loss->legend->hasItemWithPlottable(m_loss->graph(2))) m_loss->graph(2)->addToLegend();
      }
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
  const QString unit = s.throughputIsTokens ? tr("tokens/s") : tr("samples/s");
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

void RunView::updateMemory() {
  const RunData* d = data();
  std::vector<double> peaks;
  if (d && m_memory->rankCount() > 0 && !d->memory().empty()) {
    peaks.assign(static_cast<size_t>(m_memory->rankCount()), -1.0);
    for (const MeasuredMemory& m : d->memory())
      if (m.rank >= 0 && m.rank < static_cast<int>(peaks.size()))
        peaks[static_cast<size_t>(m.rank)] = m.peak.total;
    // A rank without a memory line yet is drawn without a measured bar.
    for (double& p : peaks) p = std::max(p, 0.0);
  }
  m_memory->setMeasured(peaks);
}

void RunView::updateTable() {
  const RunData* d = data();
  struct Row {
    int stage = -1;
    int ranks = 0;
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
    const int stageWidth = std::max(1, info.dp * info.cp * info.tp);
    for (auto& [rank, r] : rows)
      if (r.stage < 0) r.stage = rank / stageWidth;
  }
  // Many ranks: one row per stage with its largest figures (the memory view groups the same way), so the
  // table stays readable without scrolling.
  const bool grouped = static_cast<int>(rows.size()) > kGroupRanksAbove;
  if (grouped) {
    std::map<int, Row> stages;
    const auto maxNan = [](double a, double b) {
      return std::isnan(a) ? b : std::isnan(b) ? a : std::max(a, b);
    };
    for (const auto& [rank, r] : rows) {
      Row& s = stages[r.stage];
      s.stage = r.stage;
      ++s.ranks;
      s.predictedBytes = maxNan(s.predictedBytes, r.predictedBytes);
      s.measuredBytes = maxNan(s.measuredBytes, r.measuredBytes);
      s.predictedBubble = maxNan(s.predictedBubble, r.predictedBubble);
      s.measuredBubble = maxNan(s.measuredBubble, r.measuredBubble);
    }
    rows = std::move(stages);
  }
  double largest = 0;
  for (const auto& [key, r] : rows)
    for (double b : {r.predictedBytes, r.measuredBytes})
      if (std::isfinite(b)) largest = std::max(largest, b);
  const ByteUnit unit = byteUnitFor(largest);
  m_table->setHorizontalHeaderLabels({grouped ? tr("stage (ranks)") : tr("rank"), tr("stage"),
                                      tr("predicted %1").arg(unit.name), tr("measured %1").arg(unit.name),
                                      tr("predicted bubble"), tr("measured bubble")});
  m_table->setColumnHidden(ColStage, grouped);
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
  for (const auto& [key, r] : rows) {
    set(i, ColRank, grouped ? tr("%1 (%2)").arg(key).arg(r.ranks) : QString::number(key));
    set(i, ColStage, QString::number(r.stage));
    set(i, ColPredictedMemory, formatBytesIn(r.predictedBytes, unit));
    set(i, ColMeasuredMemory, formatBytesIn(r.measuredBytes, unit));
    set(i, ColPredictedBubble, percent(r.predictedBubble));
    set(i, ColMeasuredBubble, percent(r.measuredBubble));
    ++i;
  }
  m_table->setUpdatesEnabled(true);
}

void RunView::updateStatus() {
  const RunData* d = data();
  QString text;
  if (!d) {
    text = tr("no run");
  } else {
    const RunInfo& info = d->info();
    const StepSeries& s = d->steps();
    // The latest lines, exact (the series' last rows are not the latest values once decimated).
    const std::optional<StepEvent>& last = d->lastStepLine();
    const QString name = info.name.isEmpty() ? QString() : info.name + QStringLiteral(": ");
    const QString lastLoss = last ? compact(last->loss) : QString();
    const QString unit = s.throughputIsTokens ? tr("tokens/s") : tr("samples/s");
    switch (d->state()) {
      case RunState::Idle:
        text = tr("no run");
        break;
      case RunState::Starting:
        text = tr("starting the engine…");
        break;
      case RunState::Running:
        text = name + tr("running · step %1 of %2").arg(d->lastStep()).arg(info.steps);
        if (last) {
          const double throughput = s.throughputIsTokens ? last->tokensPerS : last->samplesPerS;
          text += tr(" · loss %1 · %2 %3").arg(lastLoss, formatSi(throughput), unit);
          const double predicted = info.predictedThroughput();
          if (std::isfinite(predicted) && predicted > 0)
            text += tr(" (predicted %1)").arg(formatSi(predicted));
          if (std::isfinite(last->stepTime)) text += tr(" · %1 per step").arg(formatSeconds(last->stepTime));
        }
        break;
      case RunState::Finished:
        text = name + tr("finished ok · %1 steps").arg(d->lastStep());
        if (last) text += tr(" · final loss ") + lastLoss;
        if (d->lastEvalLine()) text += tr(" · eval loss ") + compact(d->lastEvalLine()->loss);
        break;
      case RunState::Interrupted:
        text = name + tr("stopped: ") + d->stateMessage();
        break;
      case RunState::Failed:
        text = name + tr("failed: ") + d->stateMessage();
        break;
      case RunState::Incomplete:
        text = name + tr("incomplete: ") + d->stateMessage();
        break;
    }
    if (d->errorTotal() > 0) text += tr(" · %1 malformed metrics line(s), see the log").arg(d->errorTotal());
  }
  if (m_status->text() != text) m_status->setText(text);
}

void RunView::updateLog() {
  const RunData* d = data();
  if (!d) {
    m_log->clear();
    m_shownLog = 0;
    m_side->setTabText(LogTab, tr("Log"));
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
  // The log keeps the newest lines only: the tab says so once lines were dropped.
  const QString title =
      d->logDropped() > 0 ? tr("Log (newest %1 of %2 lines)").arg(log.size()).arg(d->logTotal()) : tr("Log");
  if (m_side->tabText(LogTab) != title) m_side->setTabText(LogTab, title);
}

void RunView::showLog() {
  m_side->setCurrentIndex(LogTab);
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

bool RunView::eventFilter(QObject* watched, QEvent* event) {
  if (event->type() == QEvent::Resize)
    if (auto* plot = qobject_cast<QCustomPlot*>(watched)) {
      plot->plotLayout()->update(QCPLayoutElement::upLayout);
      fitTicks(plot);
    }
  return QWidget::eventFilter(watched, event);
}

QString RunView::statusText() const {
  return m_status->text();
}

QString RunView::logText() const {
  return m_log->toPlainText();
}

}  // namespace ms
