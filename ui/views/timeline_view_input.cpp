// TimelineView's input: the wheel zooms around the cursor (Shift scrolls rows), dragging pans, the keys zoom,
// pan and scroll, a click on a stage's header lists its ranks, the context menu lists or groups them all, and
// a tooltip names the span under the cursor. See timeline_view.h.
#include <QContextMenuEvent>
#include <QHelpEvent>
#include <QKeyEvent>
#include <QMenu>
#include <QMouseEvent>
#include <QToolTip>
#include <QWheelEvent>
#include <cmath>

#include "ui/views/timeline_view.h"

namespace ms {

namespace {
constexpr double kZoomStep = 1.25;  // per wheel notch
}  // namespace

void TimelineView::wheelEvent(QWheelEvent* event) {
  const QPoint delta = event->angleDelta();
  const QPointF pos = event->position();
  if (event->modifiers() & Qt::ShiftModifier) {
    // Some platforms turn Shift+vertical wheel into a horizontal delta: scroll rows by either.
    const int d = delta.y() != 0 ? delta.y() : delta.x();
    m_layout.scrollTo(m_layout.scrollY() - d * m_layout.rowHeight() / 40, height());
    update();
  } else if (delta.y() != 0) {
    TimeAxis a = timeAxis();
    const double x = pos.x() >= a.x0() ? pos.x() : a.x0() + a.width() / 2;
    a.zoomAt(x, std::pow(kZoomStep, delta.y() / 120.0));
    applyAxis(a);
  } else if (delta.x() != 0) {
    TimeAxis a = timeAxis();
    a.panBy(delta.x() / 4.0);
    applyAxis(a);
  }
  event->accept();
}

void TimelineView::mousePressEvent(QMouseEvent* event) {
  // A click on a stage's header lists its ranks, or hides them again.
  const QPoint pos = event->position().toPoint();
  const int displayRow = layoutFor(height()).rowAt(pos.y());
  if (event->button() == Qt::LeftButton && pos.x() < headerWidth() && displayRow >= 0 &&
      displayRow < displayRowCount()) {
    const TimelineDisplayRow& d = m_groups.displayRows()[static_cast<std::size_t>(displayRow)];
    if (d.header) {
      const int stage = m_groups.groups()[static_cast<std::size_t>(d.group)].stage;
      setStageExpanded(stage, !isStageExpanded(stage));
      event->accept();
      return;
    }
  }
  if (event->button() == Qt::LeftButton) {
    m_dragging = true;
    m_lastDragPos = event->position().toPoint();
    setCursor(Qt::ClosedHandCursor);
  }
  QWidget::mousePressEvent(event);
}

void TimelineView::mouseMoveEvent(QMouseEvent* event) {
  if (m_dragging && (event->buttons() & Qt::LeftButton)) {
    const QPoint pos = event->position().toPoint();
    const QPoint d = pos - m_lastDragPos;
    m_lastDragPos = pos;
    m_layout.scrollTo(m_layout.scrollY() - d.y(), height());
    TimeAxis a = timeAxis();
    a.panBy(d.x());
    applyAxis(a);
  }
  QWidget::mouseMoveEvent(event);
}

void TimelineView::mouseReleaseEvent(QMouseEvent* event) {
  if (event->button() == Qt::LeftButton) {
    m_dragging = false;
    unsetCursor();
  }
  QWidget::mouseReleaseEvent(event);
}

void TimelineView::keyPressEvent(QKeyEvent* event) {
  const TimeAxis a = timeAxis();
  switch (event->key()) {
    case Qt::Key_Plus:
    case Qt::Key_Equal:
      zoomIn();
      break;
    case Qt::Key_Minus:
      zoomOut();
      break;
    case Qt::Key_0:
    case Qt::Key_Home:
      fitAll();
      break;
    case Qt::Key_Left:
    case Qt::Key_Right: {
      TimeAxis b = a;
      b.panBy((event->key() == Qt::Key_Left ? 1 : -1) * a.width() / 10);
      applyAxis(b);
      break;
    }
    case Qt::Key_Up:
    case Qt::Key_Down:
      m_layout.scrollTo(m_layout.scrollY() + (event->key() == Qt::Key_Up ? -1 : 1) * m_layout.rowHeight(),
                        height());
      update();
      break;
    default:
      QWidget::keyPressEvent(event);
      return;
  }
  event->accept();
}

void TimelineView::contextMenuEvent(QContextMenuEvent* event) {
  QMenu menu(this);
  if (m_groups.grouping()) {
    menu.addAction(tr("List Every Rank"), this, [this] { setAllExpanded(true); });
    menu.addAction(tr("One Row per Stage"), this, [this] { setAllExpanded(false); });
    menu.addSeparator();
  }
  menu.addAction(tr("Fit Step"), this, &TimelineView::fitAll);
  menu.exec(event->globalPos());
}

bool TimelineView::event(QEvent* event) {
  if (event->type() == QEvent::ToolTip) {
    auto* help = static_cast<QHelpEvent*>(event);
    if (const auto hit = spanAt(help->pos())) {
      QToolTip::showText(help->globalPos(), toolTipText(*hit), this);
    } else {
      QToolTip::hideText();
      event->ignore();
    }
    return true;
  }
  return QWidget::event(event);
}

}  // namespace ms
