// A run against its prediction; see fidelity_view.h.
#include "ui/views/fidelity_view.h"

#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QTableWidget>
#include <QVBoxLayout>
#include <cmath>

namespace ms {

namespace {

bool fidelityIsTime(FidelityItem item) {
  return item != FidelityItem::Memory && item != FidelityItem::Bubble;
}

// Green within the target, amber within 2.5x it, red past it.
QColor fidelityColor(double error, double target) {
  const double e = std::fabs(error);
  if (e <= target) return QColor(200, 235, 200);
  if (e <= 2.5 * target) return QColor(250, 230, 180);
  return QColor(245, 190, 190);
}

QString fidelityValue(const FidelityRow& r, double v) {
  if (r.item == FidelityItem::Memory) return QString::number(v / double(1 << 20), 'f', 3) + " MiB";
  if (r.item == FidelityItem::Bubble) return QString::number(100 * v, 'f', 1) + "%";
  return QString::number(1e3 * v, 'f', 3) + " ms";
}

QString fidelityPercent(double e) {
  return (e >= 0 ? "+" : "") + QString::number(100 * e, 'f', 1) + "%";
}

}  // namespace

FidelityView::FidelityView(QWidget* parent) : QWidget(parent) {
  setWindowTitle(tr("Fidelity: predicted against measured"));
  auto* layout = new QVBoxLayout(this);
  m_summary = new QLabel(tr("No run shown. Run > Fidelity of Last Run, or of a run folder."), this);
  m_summary->setWordWrap(true);
  layout->addWidget(m_summary);
  auto* tools = new QHBoxLayout;
  tools->addWidget(new QLabel(tr("Show:"), this));
  m_filter = new QComboBox(this);
  m_filter->addItem(tr("Everything, worst first"), "all");
  m_filter->addItem(tr("Forward (F)"), "F");
  m_filter->addItem(tr("Backward (B)"), "B");
  m_filter->addItem(tr("Weight gradients (W)"), "W");
  m_filter->addItem(tr("Waits for messages (r, R)"), "waits");
  m_filter->addItem(tr("Gradient finish (G)"), "G");
  m_filter->addItem(tr("Optimizer (O)"), "O");
  m_filter->addItem(tr("Bubble"), "bubble");
  m_filter->addItem(tr("Peak memory"), "memory");
  tools->addWidget(m_filter);
  tools->addStretch(1);
  layout->addLayout(tools);
  connect(m_filter, &QComboBox::currentIndexChanged, this, [this] { rebuild(); });
  m_table = new QTableWidget(0, NUM_COLUMNS, this);
  m_table->setHorizontalHeaderLabels({tr("item"), tr("rank"), tr("stage"), tr("layer / category"),
                                      tr("predicted"), tr("measured"), tr("error"), tr("gap / step")});
  m_table->verticalHeader()->setVisible(false);
  m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
  m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
  m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  m_table->horizontalHeader()->setSectionResizeMode(ColWhat, QHeaderView::Stretch);
  layout->addWidget(m_table, 1);
  m_notes = new QLabel(this);
  m_notes->setWordWrap(true);
  layout->addWidget(m_notes);
  resize(900, 600);
}

Status FidelityView::showRunFolder(const QString& dir) {
  auto report = fidelityOfRunFolder(dir.toStdString());
  if (!report) return report.status();
  showReport(*report, dir);
  return Status::ok();
}

void FidelityView::showReport(const FidelityReport& report, const QString& dir) {
  m_report = report;
  m_dir = dir;
  const double error = report.measuredStep > 0 ? report.predictedStep / report.measuredStep - 1 : 0.0;
  m_summary->setText(
      tr("<b>%1</b>: %2, %3 compared. Step predicted %4 ms, measured %5 ms (<b>%6</b>), "
         "predicted on \"%7\" (%8).")
          .arg(QString::fromStdString(report.run).toHtmlEscaped())
          .arg(report.ranks == 1 ? tr("1 rank") : tr("%1 ranks").arg(report.ranks))
          .arg(report.stepsUsed == 1 ? tr("1 step") : tr("%1 steps").arg(report.stepsUsed))
          .arg(1e3 * report.predictedStep, 0, 'f', 2)
          .arg(1e3 * report.measuredStep, 0, 'f', 2)
          .arg(report.measuredStep > 0 ? fidelityPercent(error) : tr("no step time"))
          .arg(QString::fromStdString(report.device).toHtmlEscaped())
          .arg(report.profiled ? tr("a profile measured on a machine") : tr("a catalog datasheet")));
  QStringList notes;
  for (const std::string& n : report.notes) notes << QString::fromStdString(n);
  m_notes->setText(notes.join('\n'));
  m_notes->setVisible(!notes.isEmpty());
  rebuild();
}

void FidelityView::setFilter(const QString& filter) {
  const int i = m_filter->findData(filter);
  if (i >= 0) m_filter->setCurrentIndex(i);
}

void FidelityView::rebuild() {
  const QString filter = m_filter->currentData().toString();
  std::vector<const FidelityRow*> rows;
  const auto keep = [&](const FidelityRow& r) {
    const QString item = toString(r.item);
    if (filter == "all") return true;
    if (filter == "waits") return r.item == FidelityItem::RecvActivation || r.item == FidelityItem::RecvGrad;
    return item == filter;
  };
  // Everything: times worst first, then memory worst first, then the bubbles (the report's order per list).
  for (const FidelityRow& r : m_report.times)
    if (r.item != FidelityItem::Bubble && keep(r)) rows.push_back(&r);
  for (const FidelityRow& r : m_report.memory)
    if (keep(r)) rows.push_back(&r);
  for (const FidelityRow& r : m_report.times)
    if (r.item == FidelityItem::Bubble && keep(r)) rows.push_back(&r);
  m_table->setRowCount(0);
  m_table->setRowCount(static_cast<int>(rows.size()));
  for (int i = 0; i < static_cast<int>(rows.size()); ++i) {
    const FidelityRow& r = *rows[size_t(i)];
    const auto set = [&](int col, const QString& text,
                         Qt::Alignment align = Qt::AlignRight | Qt::AlignVCenter) {
      auto* cell = new QTableWidgetItem(text);
      cell->setTextAlignment(align);
      m_table->setItem(i, col, cell);
      return cell;
    };
    set(ColItem, toString(r.item), Qt::AlignLeft | Qt::AlignVCenter);
    set(ColRank, QString::number(r.rank));
    set(ColStage, QString::number(r.stage));
    set(ColWhat, QString::fromStdString(r.what), Qt::AlignLeft | Qt::AlignVCenter);
    set(ColPredicted, fidelityValue(r, r.predicted));
    set(ColMeasured, fidelityValue(r, r.measured));
    QTableWidgetItem* e = nullptr;
    if (r.item == FidelityItem::Bubble) {
      e = set(ColError, QString::number(100 * (r.predicted - r.measured), 'f', 1) + " pt");
      e->setBackground(fidelityColor(r.predicted - r.measured, 0.05));
    } else {
      e = set(ColError, fidelityPercent(r.error()));
      e->setBackground(fidelityColor(r.error(), r.item == FidelityItem::Memory ? 0.02 : 0.10));
    }
    set(ColGap, fidelityIsTime(r.item) && m_report.measuredStep > 0
                    ? QString::number(100 * r.gap() / m_report.measuredStep, 'f', 1) + "%"
                    : QString());
  }
}

}  // namespace ms
