// The studio's entry point: opens the project given on the command line, or the default example.
#include <QApplication>
#include <QFileInfo>

#include "ui/views/main_window.h"

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("MeshStudio"));
  ms::MainWindow window;
  const QString project = argc > 1 ? QString::fromLocal8Bit(argv[1])
                                   : QStringLiteral(MS_SOURCE_DIR "/resources/examples/gpt-fortunes.json");
  window.openProject(QFileInfo(project).absoluteFilePath());
  window.show();
  return app.exec();
}
