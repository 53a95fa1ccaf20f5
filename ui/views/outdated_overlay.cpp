// OutdatedOverlay; see outdated_overlay.h.
#include "ui/views/outdated_overlay.h"

#include <QEvent>
#include <QPainter>

namespace ms {

OutdatedOverlay::OutdatedOverlay(QWidget* parent) : QWidget(parent) {
  setAttribute(Qt::WA_TransparentForMouseEvents);
  setAttribute(Qt::WA_NoSystemBackground);
  parent->installEventFilter(this);
  setGeometry(parent->rect());
  hide();
}

void OutdatedOverlay::setReason(const QString& reason) {
  m_reason = reason;
  setToolTip(reason);
  setVisible(!reason.isEmpty());
  if (!reason.isEmpty()) {
    raise();
    update();
  }
}

bool OutdatedOverlay::eventFilter(QObject* watched, QEvent* event) {
  if (watched == parent() && event->type() == QEvent::Resize) setGeometry(parentWidget()->rect());
  return QWidget::eventFilter(watched, event);
}

void OutdatedOverlay::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), QColor(255, 255, 255, 150));
  const QFontMetrics fm(font());
  const QRect band(0, 0, width(), fm.height() + 8);
  p.fillRect(band, QColor(254, 243, 199));
  p.setPen(QColor(146, 64, 14));
  p.drawText(band.adjusted(8, 0, -8, 0), Qt::AlignVCenter | Qt::AlignLeft,
             fm.elidedText(tr("Outdated: %1").arg(m_reason), Qt::ElideRight, band.width() - 16));
}

}  // namespace ms
