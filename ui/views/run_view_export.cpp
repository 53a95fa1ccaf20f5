// RunView's exports: the plots one by one and the whole dashboard as it is on screen (PDF and SVG as vectors,
// PNG at a dpi). See run_view.h.
#include <qcustomplot.h>

#include <QDir>
#include <QPdfWriter>
#include <QSvgGenerator>
#include <QTabWidget>
#include <cmath>

#include "ui/views/memory_view.h"
#include "ui/views/run_view.h"
#include "ui/views/timeline_view.h"

namespace ms {

namespace {
const QSize kUnshownSize(1600, 900);  // the layout an export of a never-shown dashboard uses
}  // namespace

bool RunView::savePlots(const QString& dir, const QString& format, double dpi) {
  const QString f = format.toLower();
  if (f != QLatin1String("png") && f != QLatin1String("pdf")) return false;
  if (!QDir().mkpath(dir)) return false;
  refresh();
  bool ok = true;
  const std::pair<const char*, QCustomPlot*> plots[] = {{"loss", m_loss},
                                                        {"throughput", m_throughput},
                                                        {"step_time", m_stepTime},
                                                        {"memory", m_memory->plot()}};
  const double scale = dpi > 0 ? dpi / 96.0 : 1.0;
  for (const auto& [name, plot] : plots) {
    // A hidden view has no laid-out size: export at a fixed one.
    const bool sized = plot->isVisible() && plot->width() >= 200 && plot->height() >= 150;
    const int w = sized ? plot->width() : 800, h = sized ? plot->height() : 500;
    const QString file = QDir(dir).filePath(QString::fromLatin1(name) + QLatin1Char('.') + f);
    if (!sized) fitTicks(plot);
    ok &= f == QLatin1String("png")
              ? plot->savePng(file, w, h, scale, -1, dpi > 0 ? int(dpi) : -1, QCP::ruDotsPerInch)
              : plot->savePdf(file, w, h);
  }
  return ok;
}

void RunView::paintDashboard(QCPPainter& p, bool vector) {
  // Everything as the widgets draw themselves, then the plots and the timelines again on top through their
  // own painters: vectors for PDF and SVG, and at the painter's resolution for PNG (a widget's own paint of a
  // QCustomPlot is its screen-resolution pixmap).
  render(&p, QPoint(), QRegion(), QWidget::DrawChildren);
  const auto placed = [&](QWidget* w) {
    return w->isVisible() || !isVisible() ? QRect(w->mapTo(this, QPoint(0, 0)), w->size()) : QRect();
  };
  std::vector<QCustomPlot*> plots{m_loss, m_throughput, m_stepTime};
  if (m_side->currentWidget() == m_memory) plots.push_back(m_memory->plot());
  for (QCustomPlot* plot : plots) {
    const QRect r = placed(plot);
    if (r.isEmpty()) continue;
    p.save();
    p.fillRect(r, Qt::white);
    p.translate(r.topLeft());
    p.setMode(QCPPainter::pmVectorized, vector);
    p.setMode(QCPPainter::pmNoCaching, true);
    plot->toPainter(&p, r.width(), r.height());
    p.restore();
  }
  for (TimelineView* t : {m_measured, m_predicted}) {
    const QRect r = placed(t);
    if (r.isEmpty()) continue;
    p.save();
    p.translate(r.topLeft());
    p.setClipRect(QRect(QPoint(0, 0), r.size()));
    t->paintTo(p, r.size());
    p.restore();
  }
}

bool RunView::exportDashboard(const QString& path, const QString& format, double dpi) {
  m_error.clear();
  const QString f = format.toLower();
  if (f != QLatin1String("pdf") && f != QLatin1String("svg") && f != QLatin1String("png")) {
    m_error = tr("%1: unknown format \"%2\" (pdf, svg or png)").arg(path, format);
    return false;
  }
  if (!isVisible()) {
    // Never shown: lay it out at a typical window's size so the panels have their on-screen proportions.
    resize(kUnshownSize);
    ensurePolished();
    layout()->activate();
  }
  refresh();
  for (QCustomPlot* plot : {m_loss, m_throughput, m_stepTime, m_memory->plot()}) fitTicks(plot);
  const QSize size = this->size();
  bool ok = false;
  if (f == QLatin1String("png")) {
    const double scale = dpi > 0 ? dpi / 96.0 : 1.0;
    QImage image((QSizeF(size) * scale).toSize(), QImage::Format_ARGB32_Premultiplied);
    image.fill(Qt::white);
    image.setDotsPerMeterX(int(std::lround(dpi / 0.0254)));
    image.setDotsPerMeterY(int(std::lround(dpi / 0.0254)));
    QCPPainter p(&image);
    p.setRenderHint(QPainter::Antialiasing);
    p.scale(scale, scale);
    paintDashboard(p, false);
    p.end();
    ok = image.save(path, "PNG");
  } else if (f == QLatin1String("pdf")) {
    QPdfWriter writer(path);
    writer.setResolution(96);  // one PDF unit per screen pixel: the layout keeps its proportions
    writer.setPageMargins(QMarginsF(0, 0, 0, 0));
    writer.setPageSize(QPageSize(QSizeF(size.width() * 72.0 / 96.0, size.height() * 72.0 / 96.0),
                                 QPageSize::Point, QString(), QPageSize::ExactMatch));
    writer.setCreator(QStringLiteral("MeshStudio"));
    QCPPainter p;
    if (p.begin(&writer)) {
      paintDashboard(p, true);
      ok = p.end();
    }
  } else {
    QSvgGenerator svg;
    svg.setFileName(path);
    svg.setSize(size);
    svg.setViewBox(QRect(QPoint(0, 0), size));
    svg.setTitle(tr("MeshStudio run dashboard"));
    QCPPainter p;
    if (p.begin(&svg)) {
      paintDashboard(p, true);
      ok = p.end();
    }
  }
  if (ok && !QFileInfo(path).isFile()) ok = false;
  if (!ok) m_error = tr("%1: cannot write the file").arg(path);
  return ok;
}

}  // namespace ms
