// The memory view; see memory_view.h.
#include "ui/views/memory_view.h"

#include <QHelpEvent>
#include <QToolTip>
#include <QVBoxLayout>
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "qcustomplot.h"
#include "ui/models/units.h"
#include "ui/views/outdated_overlay.h"

namespace ms {

namespace {

constexpr double kBarWidth = 0.6;
constexpr double kMeasuredOffset = 0.42;  // measured peak bar, right of the predicted stack
constexpr double kMeasuredWidth = 0.2;
constexpr int kMaxLabelledBars = 16;
const QColor kOverflow(214, 39, 40);

const QColor kCategoryColours[MemoryView::NUM_CATEGORIES] = {
    QColor(78, 121, 167),   // parameters
    QColor(242, 142, 43),   // gradients
    QColor(89, 161, 79),    // optimizer
    QColor(176, 122, 161),  // activations
    QColor(156, 156, 156),  // other
};

double category(const MemoryBreakdown& m, int c) {
  switch (c) {
    case MemoryView::Parameters:
      return m.parameters;
    case MemoryView::Gradients:
      return m.gradients;
    case MemoryView::Optimizer:
      return m.optimizer;
    case MemoryView::Activations:
      return m.activations;
    default:
      return m.other;
  }
}

}  // namespace

QString MemoryView::categoryName(Category c) {
  switch (c) {
    case Parameters:
      return tr("parameters");
    case Gradients:
      return tr("gradients");
    case Optimizer:
      return tr("optimizer state");
    case Activations:
      return tr("activations");
    case Other:
      return tr("other");
    case NUM_CATEGORIES:
      break;
  }
  return {};
}

MemoryView::MemoryView(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  m_plot = new QCustomPlot(this);
  layout->addWidget(m_plot);
  m_plot->installEventFilter(this);

  QCPBars* below = nullptr;
  for (int c = 0; c < NUM_CATEGORIES; ++c) {
    auto* bars = new QCPBars(m_plot->xAxis, m_plot->yAxis);
    bars->setName(categoryName(Category(c)));
    bars->setWidth(kBarWidth);
    bars->setBrush(kCategoryColours[c]);
    bars->setPen(QPen(kCategoryColours[c].darker(130)));
    bars->setStackingGap(0);
    if (below) bars->moveAbove(below);
    below = bars;
    m_bars[c] = bars;
  }
  m_capacity = m_plot->addGraph();
  m_capacity->setName(tr("device capacity"));
  m_capacity->setPen(QPen(QColor(20, 20, 20), 2, Qt::DashLine));
  m_measured = new QCPBars(m_plot->xAxis, m_plot->yAxis);
  m_measured->setName(tr("measured peak"));
  m_measured->setWidth(kMeasuredWidth);
  m_measured->setBrush(QColor(70, 70, 70));
  m_measured->setPen(QPen(QColor(20, 20, 20)));
  m_host = new QCPBars(m_plot->xAxis, m_plot->yAxis);
  m_host->setName(tr("host memory (offload)"));
  m_host->setWidth(kMeasuredWidth);
  m_host->setBrush(QBrush(kCategoryColours[Optimizer], Qt::BDiagPattern));
  m_host->setPen(QPen(kCategoryColours[Optimizer].darker(150)));

  // Title row on top, the legend in its own column right of the bars so it never hides one.
  m_plot->plotLayout()->insertRow(0);
  auto* title =
      new QCPTextElement(m_plot, QString(), QFont(font().family(), font().pointSize(), QFont::Bold));
  m_plot->plotLayout()->addElement(0, 0, title);
  // The legend in a row of its own under the bars (filled left to right), so it never hides one.
  m_plot->legend->setVisible(true);
  m_plot->axisRect()->insetLayout()->take(m_plot->legend);
  m_plot->plotLayout()->addElement(2, 0, m_plot->legend);
  m_plot->plotLayout()->setRowStretchFactor(2, 0.001);
  m_plot->legend->setFillOrder(QCPLayoutGrid::foColumnsFirst);
  m_plot->legend->setWrap(4);
  m_plot->legend->setMargins(QMargins(6, 2, 6, 2));
  m_plot->legend->setBorderPen(Qt::NoPen);
  m_plot->yAxis->setRange(0, 1);
  m_plot->xAxis->setTicker(QSharedPointer<QCPAxisTickerText>::create());
  m_plot->xAxis->grid()->setVisible(false);
  m_overlay = new OutdatedOverlay(this);
  rebuild();
}

void MemoryView::setOutdated(const QString& reason) {
  m_overlay->setReason(reason);
}

QString MemoryView::outdatedReason() const {
  return m_overlay->reason();
}

void MemoryView::setTitle(const QString& title) {
  m_title = title;
  rebuild();
}

int MemoryView::barOfRank(int rank) const {
  return rank >= 0 && rank < static_cast<int>(m_barOfRank.size()) ? m_barOfRank[rank] : -1;
}

bool MemoryView::rankShownAsOverflow(int rank) const {
  const int bar = barOfRank(rank);
  return bar >= 0 && m_barData[bar].overflow;
}

QString MemoryView::barLabel(int bar) const {
  if (bar < 0 || bar >= barCount()) return {};
  const Bar& b = m_barData[bar];
  if (m_grouped) {
    if (b.figures.stage >= 0 && b.figures.stage < m_groupNames.size())
      return QStringLiteral("%1 (%2)").arg(m_groupNames[b.figures.stage]).arg(b.ranks.size());
    return tr("stage %1 (%2 ranks)").arg(b.figures.stage).arg(b.ranks.size());
  }
  if (m_names.size() == static_cast<int>(m_memory.size())) return m_names[b.ranks.front()];
  return barCount() <= kMaxLabelledBars ? tr("rank %1").arg(b.figures.rank) : QString::number(b.figures.rank);
}

QString MemoryView::barToolTip(int bar) const {
  if (bar < 0 || bar >= barCount()) return {};
  const Bar& b = m_barData[bar];
  const bool named = m_names.size() == static_cast<int>(m_memory.size());
  QString text =
      m_grouped
          ? (named ? tr("%1 to %2 (largest figures)").arg(m_names[b.ranks.front()], m_names[b.ranks.back()])
                   : tr("stage %1: ranks %2 to %3 (largest figures)")
                         .arg(b.figures.stage)
                         .arg(b.ranks.front())
                         .arg(b.ranks.back()))
      : named ? m_names[b.ranks.front()]
              : tr("rank %1 · stage %2").arg(b.figures.rank).arg(b.figures.stage);
  for (int c = 0; c < NUM_CATEGORIES; ++c) {
    text += QStringLiteral("\n%1: %2").arg(categoryName(Category(c)), formatBytes(category(b.figures, c)));
    const std::string& perParam = c == Parameters  ? m_states.parameters
                                  : c == Gradients ? m_states.gradients
                                  : c == Optimizer ? m_states.optimizer
                                                   : std::string();
    if (!perParam.empty()) text += tr(" (%1 per parameter)").arg(QString::fromStdString(perParam));
  }
  text += std::isfinite(b.figures.capacity)
              ? tr("\ntotal %1 of %2").arg(formatBytes(b.figures.total()), formatBytes(b.figures.capacity))
              : tr("\ntotal %1 (capacity not known)").arg(formatBytes(b.figures.total()));
  if (b.overflow) text += tr(" — does not fit");
  if (b.figures.notAtOnce > 0)
    text += tr("\n(%1 below the categories' sum: they do not all peak at the same moment)")
                .arg(formatBytes(b.figures.notAtOnce));
  if (b.figures.unevenRoutingTotal > 0)
    text += tr("\nup to %1 were routing as uneven as it can be (every expert sent all the rows it can take)")
                .arg(formatBytes(b.figures.unevenRoutingTotal));
  if (b.measured >= 0) text += tr("\nmeasured peak %1").arg(formatBytes(b.measured));
  const HostBytes& h = b.figures.host;
  if (h.total() > 0) {
    text += tr("\nhost memory (offload): %1 — optimizer state %2, gradients %3, parameters %4, staging %5")
                .arg(formatBytes(h.total()), formatBytes(h.optimizer), formatBytes(h.gradients),
                     formatBytes(h.parameters), formatBytes(h.staging));
    if (!m_states.host.empty()) text += QStringLiteral("\n(%1)").arg(QString::fromStdString(m_states.host));
  }
  return text;
}

void MemoryView::setModelStates(const ModelStateText& text) {
  m_states = text;
}

void MemoryView::setPredicted(const std::vector<MemoryBreakdown>& memory, const QStringList& names,
                              const QStringList& groupNames) {
  m_memory = memory;
  m_names = names;
  m_groupNames = groupNames;
  if (m_measuredPeaks.size() != m_memory.size()) m_measuredPeaks.clear();
  rebuild();
}

bool MemoryView::setMeasured(const std::vector<double>& peakBytesPerRank) {
  if (!peakBytesPerRank.empty() && peakBytesPerRank.size() != m_memory.size()) {
    m_measuredPeaks.clear();
    rebuild();
    m_message = tr("Measured peaks for %1 ranks, but the plan has %2: not shown.")
                    .arg(peakBytesPerRank.size())
                    .arg(m_memory.size());
    if (auto* title = qobject_cast<QCPTextElement*>(m_plot->plotLayout()->element(0, 0)))
      title->setText(m_message);
    m_plot->replot();
    return false;
  }
  m_measuredPeaks = peakBytesPerRank;
  rebuild();
  return true;
}

void MemoryView::buildBars() {
  m_barData.clear();
  m_barOfRank.assign(m_memory.size(), -1);
  m_grouped = static_cast<int>(m_memory.size()) > kGroupAbove;
  const bool measured = !m_measuredPeaks.empty() && m_measuredPeaks.size() == m_memory.size();
  std::map<int, int> barOfStage;
  for (std::size_t r = 0; r < m_memory.size(); ++r) {
    const MemoryBreakdown& m = m_memory[r];
    int bar;
    if (m_grouped) {
      auto [it, inserted] = barOfStage.try_emplace(m.stage, static_cast<int>(m_barData.size()));
      if (inserted) {
        m_barData.push_back(Bar{{}, m, false, -1});
        m_barData.back().figures.capacity = std::numeric_limits<double>::infinity();
      }
      bar = it->second;
    } else {
      bar = static_cast<int>(m_barData.size());
      m_barData.push_back(Bar{{}, m, false, -1});
    }
    Bar& b = m_barData[bar];
    b.ranks.push_back(static_cast<int>(r));
    // A stage bar shows its worst case: the largest of each figure, the smallest capacity.
    b.figures.parameters = std::max(b.figures.parameters, m.parameters);
    b.figures.gradients = std::max(b.figures.gradients, m.gradients);
    b.figures.optimizer = std::max(b.figures.optimizer, m.optimizer);
    b.figures.activations = std::max(b.figures.activations, m.activations);
    b.figures.other = std::max(b.figures.other, m.other);
    b.figures.capacity = std::min(b.figures.capacity, m.capacity);
    b.figures.host.parameters = std::max(b.figures.host.parameters, m.host.parameters);
    b.figures.host.gradients = std::max(b.figures.host.gradients, m.host.gradients);
    b.figures.host.optimizer = std::max(b.figures.host.optimizer, m.host.optimizer);
    b.figures.host.staging = std::max(b.figures.host.staging, m.host.staging);
    b.overflow = b.overflow || !m.fits();
    if (measured) b.measured = std::max(b.measured, m_measuredPeaks[r]);
    m_barOfRank[r] = bar;
  }
  if (m_grouped)  // stages in order, whatever the rank order
    std::sort(m_barData.begin(), m_barData.end(),
              [](const Bar& a, const Bar& b) { return a.figures.stage < b.figures.stage; });
  for (std::size_t i = 0; i < m_barData.size(); ++i)
    for (int r : m_barData[i].ranks) m_barOfRank[r] = static_cast<int>(i);
}

void MemoryView::rebuild() {
  buildBars();
  m_plot->clearItems();
  m_message.clear();
  auto* title = qobject_cast<QCPTextElement*>(m_plot->plotLayout()->element(0, 0));
  auto ticker = QSharedPointer<QCPAxisTickerText>::create();
  const int n = barCount();
  if (n == 0) {
    for (QCPBars* b : m_bars) b->data()->clear();
    m_measured->data()->clear();
    m_host->data()->clear();
    m_host->removeFromLegend();
    m_capacity->data()->clear();
    m_message = tr("No plan yet: the memory of every rank appears once the project plans.");
    if (title) title->setText(m_message);
    m_plot->xAxis->setTicker(ticker);
    m_plot->xAxis->setRange(-0.5, 0.5);
    m_plot->replot();
    return;
  }

  // The scale: the largest stack or measured peak; capacities join it unless they would flatten the bars.
  double top = 0, maxCapacity = 0;
  for (const Bar& b : m_barData) {
    top = std::max({top, b.figures.categorySum(), b.measured, b.figures.host.total()});  // the stack's top
    if (std::isfinite(b.figures.capacity)) maxCapacity = std::max(maxCapacity, b.figures.capacity);
  }
  const bool capacityOnScale = maxCapacity <= 8 * top || top <= 0;
  const double scaleTop = std::max(capacityOnScale ? std::max(top, maxCapacity) : top, 1.0);
  const ByteUnit unit = byteUnitFor(scaleTop);
  m_unitBytes = unit.bytes;
  m_unitName = unit.name;

  QVector<double> keys(n);
  for (int i = 0; i < n; ++i) keys[i] = i;
  for (int c = 0; c < NUM_CATEGORIES; ++c) {
    QVector<double> values(n);
    for (int i = 0; i < n; ++i) values[i] = category(m_barData[i].figures, c) / m_unitBytes;
    m_bars[c]->setData(keys, values, true);
  }
  // Capacity: one short segment per bar, NaN between them so the line breaks.
  QVector<double> capKeys, capValues;
  for (int i = 0; i < n; ++i) {
    const double cap = std::isfinite(m_barData[i].figures.capacity)
                           ? m_barData[i].figures.capacity / m_unitBytes
                           : std::numeric_limits<double>::quiet_NaN();
    capKeys << i - 0.45 << i + 0.45 << i + 0.5;
    capValues << cap << cap << std::numeric_limits<double>::quiet_NaN();
  }
  m_capacity->setData(capKeys, capValues, true);
  QVector<double> mKeys, mValues;
  for (int i = 0; i < n; ++i)
    if (m_barData[i].measured >= 0)
      mKeys << i + kMeasuredOffset, mValues << m_barData[i].measured / m_unitBytes;
  m_measured->setData(mKeys, mValues, true);
  QVector<double> hKeys, hValues;
  for (int i = 0; i < n; ++i)
    if (m_barData[i].figures.host.total() > 0)
      hKeys << i - kMeasuredOffset, hValues << m_barData[i].figures.host.total() / m_unitBytes;
  m_host->setData(hKeys, hValues, true);
  m_host->addToLegend();
  if (hKeys.isEmpty()) m_host->removeFromLegend();
  m_measured->addToLegend();
  if (mKeys.isEmpty()) m_measured->removeFromLegend();

  // Tick labels: every bar when few, else every k-th; red ones (drawn as items) for bars that overflow.
  const int every = n <= kMaxLabelledBars ? 1 : (n + kMaxLabelledBars - 1) / kMaxLabelledBars;
  const int labelGap = m_plot->xAxis->tickLengthOut() + m_plot->xAxis->tickLabelPadding() + 1;
  const bool compactTicks = m_grouped && n > 8;
  bool sameRanks = true;
  for (const Bar& b : m_barData) sameRanks = sameRanks && b.ranks.size() == m_barData.front().ranks.size();
  int overflowing = 0;
  for (int i = 0; i < n; ++i) {
    const Bar& b = m_barData[i];
    // Stage labels on two lines so neighbours do not run into each other; many stages: the number alone (the
    // axis label says the rest).
    const QString text = compactTicks ? QString::number(b.figures.stage)
                                      : barLabel(i).replace(QStringLiteral(" ("), QStringLiteral("\n("));
    if (!b.overflow) {
      ticker->addTick(i, i % every == 0 ? text : QString());
      continue;
    }
    overflowing += static_cast<int>(b.ranks.size());
    // QCustomPlot colours all tick labels alike: the axis keeps the label (it reserves the room) and a red
    // copy on a white box is laid over it.
    ticker->addTick(i, text);
    auto* label = new QCPItemText(m_plot);
    label->setClipToAxisRect(false);
    label->setLayer(QStringLiteral("overlay"));  // above the axes layer that draws the tick labels
    label->position->setTypeX(QCPItemPosition::ptPlotCoords);
    label->position->setTypeY(QCPItemPosition::ptAxisRectRatio);
    label->position->setCoords(i, 1.0);
    label->setPositionAlignment(Qt::AlignTop | Qt::AlignHCenter);
    label->setPadding(QMargins(3, labelGap - 1, 3, 1));
    label->setBrush(Qt::white);
    label->setFont(m_plot->xAxis->tickLabelFont());
    label->setText(text);
    label->setColor(kOverflow);
    auto* outline = new QCPItemRect(m_plot);
    outline->topLeft->setCoords(i - kBarWidth / 2,
                                b.figures.categorySum() / m_unitBytes);  // around the stack
    outline->bottomRight->setCoords(i + kBarWidth / 2, 0);
    outline->setPen(QPen(kOverflow, 2));
    outline->setBrush(Qt::NoBrush);
    if (n <= kMaxLabelledBars) {
      auto* note = new QCPItemText(m_plot);
      note->position->setCoords(i, b.figures.categorySum() / m_unitBytes);
      note->setPositionAlignment(Qt::AlignBottom | Qt::AlignHCenter);
      note->setText(tr("does not fit"));
      note->setColor(kOverflow);
      note->setClipToAxisRect(false);
    }
  }
  m_plot->xAxis->setTicker(ticker);
  m_plot->xAxis->setRange(-0.6, n - 1 + 0.7);
  const bool named = m_names.size() == static_cast<int>(m_memory.size());
  m_plot->xAxis->setLabel(named && !m_grouped
                              ? tr("process (workers on their devices, servers in host memory)")
                          : named      ? tr("process group (the largest figures shown)")
                          : !m_grouped ? tr("rank")
                          : sameRanks  ? tr("pipeline stage (%1 ranks each, the largest figures shown)")
                                            .arg(m_barData.front().ranks.size())
                                      : tr("pipeline stage (ranks grouped, the largest figures shown)"));
  m_plot->yAxis->setLabel(tr("memory (%1)").arg(m_unitName));
  m_plot->yAxis->setRange(0, scaleTop / m_unitBytes * 1.12);

  QStringList notes;
  if (overflowing > 0)
    notes << tr("%1 of %2 ranks do not fit their device memory").arg(overflowing).arg(m_memory.size());
  if (!capacityOnScale)
    notes << tr("device capacity up to %1, above the scale").arg(formatBytes(maxCapacity));
  m_message = notes.join(QStringLiteral("; "));
  if (title) {
    const bool measured = m_measured->dataCount() > 0;
    const QString what = !m_title.isEmpty() ? m_title
                         : measured         ? tr("Peak memory, predicted and measured")
                                            : tr("Predicted peak memory");
    QString text = m_grouped ? tr("%1 per stage").arg(what) : tr("%1 per rank").arg(what);
    // The notes on a line of their own: the title is centred and never wraps, and a narrow view (the Run
    // dashboard's memory tab) would cut both ends of one long line.
    if (!m_message.isEmpty()) text += QStringLiteral("\n") + m_message;
    title->setText(text);
    title->setTextColor(overflowing > 0 ? kOverflow : QColor(30, 30, 30));
  }
  m_plot->replot(QCustomPlot::rpQueuedReplot);
}

int MemoryView::barAtPixel(QPoint pos) const {
  if (!m_plot->axisRect()->rect().contains(pos)) return -1;
  const double key = m_plot->xAxis->pixelToCoord(pos.x());
  const int bar = static_cast<int>(std::lround(key));
  if (bar < 0 || bar >= barCount() || std::abs(key - bar) > 0.55) return -1;
  return bar;
}

bool MemoryView::eventFilter(QObject* watched, QEvent* event) {
  if (watched == m_plot && event->type() == QEvent::ToolTip) {
    auto* help = static_cast<QHelpEvent*>(event);
    const int bar = barAtPixel(help->pos());
    if (bar >= 0)
      QToolTip::showText(help->globalPos(), barToolTip(bar), m_plot);
    else
      QToolTip::hideText();
    return true;
  }
  return QWidget::eventFilter(watched, event);
}

bool MemoryView::savePng(const QString& path, int width, int height, double dpi) {
  // A view never shown has no size of its own yet: export at a readable default.
  if (width <= 0) width = m_plot->width() >= 200 ? m_plot->width() : 900;
  if (height <= 0) height = m_plot->height() >= 150 ? m_plot->height() : 500;
  // The layout of a width x height screen at 96 dpi, drawn with dpi / 96 pixels per screen pixel.
  const double scale = dpi > 0 ? dpi / 96.0 : 1.0;
  return m_plot->savePng(path, width, height, scale, -1, dpi > 0 ? int(dpi) : -1, QCP::ruDotsPerInch);
}

bool MemoryView::savePdf(const QString& path, int width, int height) {
  if (width <= 0) width = m_plot->width() >= 200 ? m_plot->width() : 900;
  if (height <= 0) height = m_plot->height() >= 150 ? m_plot->height() : 500;
  return m_plot->savePdf(path, width, height);
}

}  // namespace ms
