// A wash over a view whose content is not the current state (a re-plan under way, an edit that does not
// plan), with the reason on a band at its top: the content stays readable, and plainly marked. It covers its
// parent, follows its size, and lets every mouse event through to the view under it.
//
// What always holds: visible exactly while reason() is not empty.
#pragma once

#include <QString>
#include <QWidget>

namespace ms {

class OutdatedOverlay : public QWidget {
  Q_OBJECT
 public:
  explicit OutdatedOverlay(QWidget* parent);
  void setReason(const QString& reason);  // empty: hidden
  QString reason() const { return m_reason; }

 protected:
  void paintEvent(QPaintEvent* event) override;
  bool eventFilter(QObject* watched, QEvent* event) override;

 private:
  QString m_reason;
};

}  // namespace ms
