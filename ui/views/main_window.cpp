// MainWindow; see main_window.h.
#include "ui/views/main_window.h"

#include <QFileDialog>
#include <QFileInfo>
#include <QHeaderView>
#include <QLabel>
#include <QMenuBar>
#include <QStatusBar>
#include <QTableWidget>
#include <QVBoxLayout>

#include "plan/model_spec.h"
#include "plan/run_config.h"

namespace ms {

MainWindow::MainWindow(QWidget* parent) : QMainWindow(parent) {
  setWindowTitle(QStringLiteral("MeshStudio"));
  auto* central = new QWidget(this);
  auto* layout = new QVBoxLayout(central);
  m_summary = new QLabel(tr("No project open"), central);
  m_summary->setWordWrap(true);
  m_summary->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_table = new QTableWidget(0, 4, central);
  m_table->setHorizontalHeaderLabels(
      {tr("Layer"), tr("Parameters"), tr("Forward GFLOP / sample"), tr("Activations MiB / sample")});
  m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
  m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
  layout->addWidget(m_summary);
  layout->addWidget(m_table);
  setCentralWidget(central);
  QMenu* file = menuBar()->addMenu(tr("&File"));
  file->addAction(tr("&Open..."), QKeySequence::Open, this, &MainWindow::chooseProject);
  file->addAction(tr("&Quit"), QKeySequence::Quit, this, &QWidget::close);
  resize(900, 600);
}

void MainWindow::chooseProject() {
  const QString path =
      QFileDialog::getOpenFileName(this, tr("Open project"), QString(), tr("Run configs (*.json)"));
  if (!path.isEmpty()) openProject(path);
}

bool MainWindow::openProject(const QString& path) {
  auto config = loadRunConfig(path.toStdString());
  m_table->setRowCount(0);
  if (!config) {
    m_lastError = QString::fromStdString(config.message());
    m_summary->setText(tr("Cannot open %1:\n%2").arg(QFileInfo(path).fileName(), m_lastError));
    statusBar()->showMessage(tr("Project failed validation"));
    return false;
  }
  m_lastError.clear();
  const ModelSpec spec = buildModelSpec(config->model, config->training.seqLen);
  m_table->setRowCount(static_cast<int>(spec.layers.size()));
  for (int i = 0; i < static_cast<int>(spec.layers.size()); ++i) {
    const LayerSpec& l = spec.layers[i];
    m_table->setItem(i, 0, new QTableWidgetItem(QString::fromStdString(l.name)));
    m_table->setItem(i, 1, new QTableWidgetItem(QString::number(l.paramCount())));
    m_table->setItem(i, 2, new QTableWidgetItem(QString::number(l.forwardFlopsPerSample / 1e9, 'f', 4)));
    m_table->setItem(
        i, 3, new QTableWidgetItem(QString::number(double(l.activationBytesPerSample) / (1 << 20), 'f', 2)));
  }
  m_summary->setText(
      tr("%1: %2 model, %3 parameters, %4 layers")
          .arg(QString::fromStdString(config->name), QString::fromLatin1(toString(config->model.type)))
          .arg(spec.paramCount())
          .arg(spec.layers.size()));
  setWindowTitle(tr("MeshStudio - %1").arg(QFileInfo(path).fileName()));
  statusBar()->showMessage(tr("Opened %1").arg(path));
  return true;
}

}  // namespace ms
