// Run > Fidelity; see main_window.h (showFidelity) and fidelity_view.h.
#include "ui/views/fidelity_view.h"
#include "ui/views/main_window.h"

#include <QStatusBar>

namespace ms {

FidelityView* MainWindow::showFidelity(const QString& dir) {
  const QString folder = dir.isEmpty() ? m_lastRunDir : dir;
  if (folder.isEmpty()) {
    showError(tr("Fidelity"), tr("no run yet: run the plan (Run > Run) or open a run folder"));
    return nullptr;
  }
  if (!m_fidelity) {
    m_fidelity = new FidelityView(this);
    m_fidelity->setWindowFlag(Qt::Window);
  }
  if (Status s = m_fidelity->showRunFolder(folder); !s) {
    showError(tr("Fidelity"), QString::fromStdString(s.message()));
    return nullptr;
  }
  m_fidelity->show();
  m_fidelity->raise();
  statusBar()->showMessage(tr("Fidelity of %1").arg(folder), 5000);
  return m_fidelity;
}

}  // namespace ms
