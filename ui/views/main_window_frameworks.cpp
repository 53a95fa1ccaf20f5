// MainWindow's File > Export to Megatron-LM / torchtitan / DeepSpeed (with a preview of the files and of what
// the framework cannot express) and File > Import Framework Launch (plan/frameworks.h). See main_window.h.
#include <QDialog>
#include <QDialogButtonBox>
#include <QDir>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QLabel>
#include <QMenu>
#include <QPlainTextEdit>
#include <QStatusBar>
#include <QTabWidget>
#include <QVBoxLayout>

#include "plan/frameworks.h"
#include "ui/models/project_document.h"
#include "ui/views/main_window.h"

namespace ms {

namespace {

QString fwText(const QStringList& lines) {
  QString out;
  for (const QString& l : lines) out += QStringLiteral("\u2022 ") + l + QLatin1Char('\n');
  return out.trimmed();
}

bool fwReadFile(const QString& path, std::string& out, QString& error) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) {
    error = QObject::tr("%1: cannot read the file (%2)").arg(path, f.errorString());
    return false;
  }
  out = f.readAll().toStdString();
  return true;
}

}  // namespace

QDialog* MainWindow::makeFrameworkPreview(const FrameworkExport& exported) {
  auto* dialog = new QDialog(this);
  dialog->setObjectName(QStringLiteral("frameworkPreview"));
  dialog->setWindowTitle(tr("Export to %1").arg(QString::fromUtf8(frameworkDisplay(exported.target))));
  auto* layout = new QVBoxLayout(dialog);
  QStringList notes;
  for (const std::string& n : exported.notCarried) notes << QString::fromStdString(n);
  auto* summary = new QLabel(
      notes.isEmpty() ? tr("Everything in the plan is carried over.")
                      : tr("What %1 cannot express, and what the files do instead:\n%2")
                            .arg(QString::fromUtf8(frameworkDisplay(exported.target)), fwText(notes)),
      dialog);
  summary->setObjectName(QStringLiteral("notCarried"));
  summary->setWordWrap(true);
  summary->setStyleSheet(notes.isEmpty() ? QString() : QStringLiteral("color: #8a5a00"));
  layout->addWidget(summary);
  auto* tabs = new QTabWidget(dialog);
  tabs->setObjectName(QStringLiteral("files"));
  for (const FrameworkFile& f : exported.files) {
    auto* text = new QPlainTextEdit(QString::fromStdString(f.text), tabs);
    text->setReadOnly(true);
    text->setLineWrapMode(QPlainTextEdit::NoWrap);
    text->setFont(QFont(QStringLiteral("monospace")));
    tabs->addTab(text, QString::fromStdString(f.name));
  }
  layout->addWidget(tabs, 1);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Save | QDialogButtonBox::Cancel, dialog);
  connect(buttons, &QDialogButtonBox::accepted, dialog, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, dialog, &QDialog::reject);
  layout->addWidget(buttons);
  dialog->resize(900, 640);
  return dialog;
}

Expected<FrameworkExport> MainWindow::frameworkExport(Framework target) const {
  if (!m_doc->errors().empty())
    return Status::error(formatConfigErrors(m_doc->errors(), m_doc->config().name));
  return exportForFramework(m_doc->config(), target);
}

bool MainWindow::exportForFrameworkTo(Framework target, const QString& dir, bool preview) {
  const QString title = tr("Export to %1").arg(QString::fromUtf8(frameworkDisplay(target)));
  Expected<FrameworkExport> exported = frameworkExport(target);
  if (!exported) {
    showError(title, QString::fromStdString(exported.message()));
    return false;
  }
  if (preview) {
    QDialog* dialog = makeFrameworkPreview(*exported);
    const bool accepted = dialog->exec() == QDialog::Accepted;
    dialog->deleteLater();
    if (!accepted) return false;
  }
  if (const Status s = writeFrameworkExport(*exported, dir.toStdString()); !s) {
    showError(title, QString::fromStdString(s.message()));
    return false;
  }
  QStringList names;
  for (const FrameworkFile& f : exported->files) names << QString::fromStdString(f.name);
  QStringList notes;
  for (const std::string& n : exported->notCarried) notes << QString::fromStdString(n);
  m_lastImportNotes = notes;
  statusBar()->showMessage(
      notes.isEmpty() ? tr("Exported %1 to %2; everything in the plan is carried over")
                            .arg(names.join(QStringLiteral(", ")), dir)
                      : tr("Exported %1 to %2; not carried over: %3")
                            .arg(names.join(QStringLiteral(", ")), dir, notes.join(QStringLiteral("; "))),
      20000);
  return true;
}

bool MainWindow::importFrameworkLaunch(const QString& path, const QString& companion) {
  const QString title = tr("Import framework launch");
  std::string text, second;
  QString error;
  if (!fwReadFile(path, text, error)) {
    showError(title, error);
    return false;
  }
  Framework from = Framework::Megatron;
  if (path.endsWith(QLatin1String(".toml"))) from = Framework::Torchtitan;
  if (path.endsWith(QLatin1String(".json"))) from = Framework::DeepSpeed;
  // The companion: torchtitan's launcher (run.sh beside the TOML), DeepSpeed's model (launch.sh beside it).
  QString other = companion;
  if (other.isEmpty() && from == Framework::Torchtitan)
    other = QFileInfo(path).dir().filePath(QStringLiteral("run.sh"));
  if (other.isEmpty() && from == Framework::DeepSpeed)
    other = QFileInfo(path).dir().filePath(QStringLiteral("launch.sh"));
  if (!other.isEmpty() && QFileInfo::exists(other) && !fwReadFile(other, second, error)) {
    showError(title, error);
    return false;
  }
  ImportOptions options;
  const RunConfig& open = m_doc->config();
  // The open project's device when it is a GPU; the frameworks' launches do not name one.
  if (!open.mesh.nodes.empty() && open.mesh.nodes[0].device != "cpu" &&
      open.mesh.nodes[0].device.rfind("here", 0) != 0)
    options.device = open.mesh.nodes[0].device;
  else
    options.device = "h100-sxm-80gb";
  options.name = QFileInfo(path).completeBaseName().toStdString();
  Expected<FrameworkImport> imported = Status::error("no importer");
  if (from == Framework::Megatron) {
    imported = importMegatron(text, options);
  } else if (from == Framework::Torchtitan) {
    imported = importTorchtitan(text, second, options);
  } else {
    const bool hf = other.endsWith(QLatin1String(".json"));
    imported = importDeepSpeed(text, hf ? std::string() : second, hf ? second : std::string(), options);
  }
  if (!imported) {
    showError(title,
              tr("%1: %2").arg(QFileInfo(path).fileName(), QString::fromStdString(imported.message())));
    return false;
  }
  if (!maybeSave()) return false;
  m_doc->reset(imported->config);
  m_lastError.clear();
  QStringList notes;
  for (const std::string& u : imported->unknown) notes << tr("unknown: %1").arg(QString::fromStdString(u));
  for (const std::string& n : imported->notCarried)
    notes << tr("not carried: %1").arg(QString::fromStdString(n));
  for (const std::string& a : imported->assumed) notes << tr("assumed: %1").arg(QString::fromStdString(a));
  m_lastImportNotes = notes;
  statusBar()->showMessage(
      tr("Imported %1 (%2): %3 unknown, %4 not carried over, %5 assumed%6")
          .arg(QFileInfo(path).fileName(), QString::fromUtf8(frameworkDisplay(from)))
          .arg(imported->unknown.size())
          .arg(imported->notCarried.size())
          .arg(imported->assumed.size())
          .arg(notes.isEmpty() ? QString() : QStringLiteral(" \u2014 ") + notes.join(QStringLiteral("; "))),
      30000);
  return true;
}

void MainWindow::addFrameworkActions(QMenu* file, QMenu* exportMenu) {
  exportMenu->addSeparator();
  for (Framework f : {Framework::Megatron, Framework::Torchtitan, Framework::DeepSpeed}) {
    const QString name = QString::fromUtf8(frameworkDisplay(f));
    QAction* a = exportMenu->addAction(tr("%1 Launch...").arg(name), this, [this, f, name] {
      const QString dir =
          QFileDialog::getExistingDirectory(this, tr("Export for %1 into folder").arg(name), dialogFolder());
      if (!dir.isEmpty()) exportForFrameworkTo(f, dir, true);
    });
    a->setObjectName(QStringLiteral("export-") + QString::fromUtf8(frameworkName(f)));
  }
  QAction* import = file->addAction(tr("Import Framework &Launch..."), this, [this] {
    const QString path = QFileDialog::getOpenFileName(
        this, tr("Import a Megatron-LM script, torchtitan TOML or DeepSpeed JSON"), dialogFolder(),
        tr("Framework launches (*.sh *.txt *.toml *.json);;All files (*)"));
    if (!path.isEmpty()) importFrameworkLaunch(path);
  });
  import->setObjectName(QStringLiteral("import-framework"));
}

}  // namespace ms
