// The studio's entry point: opens the project given on the command line, or the default example (a GPT that
// trains on this machine's CPUs). `meshstudio --screenshots DIR` renders the README's screenshots instead.
#include <QApplication>
#include <QFileInfo>
#include <cstdio>

#include "screenshots.h"
#include "ui/views/main_window.h"

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  QApplication::setOrganizationName(QStringLiteral("MeshStudio"));
  QApplication::setApplicationName(QStringLiteral("MeshStudio"));
  const QStringList args = QApplication::arguments();
  if (args.size() == 3 && args[1] == QLatin1String("--screenshots"))
    return ms::takeScreenshots(args[2], QStringLiteral(MS_SOURCE_DIR));
  if (args.size() > 2 || (args.size() == 2 && args[1].startsWith(QLatin1String("-")))) {
    std::fprintf(stderr, "usage: meshstudio [PROJECT.json]\n       meshstudio --screenshots DIR\n");
    return 2;
  }
  ms::MainWindow window;
  const QString project =
      args.size() > 1 ? args[1] : QStringLiteral(MS_SOURCE_DIR "/resources/examples/gpt-fortunes.json");
  window.openProject(QFileInfo(project).absoluteFilePath());  // a failure is shown in the window
  window.show();
  return app.exec();
}
