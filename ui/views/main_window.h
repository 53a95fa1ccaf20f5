// The studio's main window. In this first version it opens a project (a run config), shows its validation
// errors or its model's layers (the unit of placement) with their parameters, FLOPs and activation memory.
// The mesh canvas, timeline and live run views arrive with the studio issue.
#pragma once

#include <QMainWindow>
#include <QString>

class QTableWidget;
class QLabel;

namespace ms {

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  explicit MainWindow(QWidget* parent = nullptr);
  // Loads a project; on failure shows the errors in the window (never a crash) and returns false.
  bool openProject(const QString& path);
  QString lastError() const { return m_lastError; }
  QTableWidget* layerTable() const { return m_table; }

 private:
  void chooseProject();
  QTableWidget* m_table = nullptr;
  QLabel* m_summary = nullptr;
  QString m_lastError;
};

}  // namespace ms
