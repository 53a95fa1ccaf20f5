// Run > Fidelity in the real main window (offscreen): a real one-rank run of the engine, its report in the
// Fidelity window (every row of the report in the table, worst first, the filter, the colours against the
// targets), and what is refused: no run yet, a folder that is not a run.
#include <QtTest>

#include <QComboBox>
#include <QLabel>
#include <QStandardPaths>
#include <QTableWidget>
#include <QTemporaryDir>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "plan/fidelity.h"
#include "ui/views/fidelity_view.h"
#include "ui/views/main_window.h"

#include "process_util.h"

namespace {

const QString kEngine = QStringLiteral(MS_ENGINE_EXE);

// A 2-layer gpt on this machine's cpu for 3 steps in dir/run: the engine as a real process, bounded.
bool trainSmallRun(const QString& dir, QString* error) {
  {
    std::ofstream t(dir.toStdString() + "/text.txt");
    for (int i = 0; i < 300; ++i) t << "what a plan predicts, a run measures: line " << i << "\n";
  }
  const nlohmann::json config = {
      {"version", 1},
      {"name", "fidelity-ui"},
      {"model",
       {{"type", "gpt"}, {"layers", 2}, {"width", 32}, {"heads", 2}, {"vocab", 256}, {"context", 32}}},
      {"data", {{"kind", "text"}, {"files", {dir.toStdString() + "/text.txt"}}}},
      {"parallel", {{"microbatches", 2}}},
      {"training", {{"steps", 3}, {"batch_size", 4}, {"seq_len", 32}, {"threads", 1}, {"log_every", 1}}}};
  std::ofstream(dir.toStdString() + "/config.json") << config.dump(1);
  const ms::test::ProcessResult r = ms::test::runProcess(
      kEngine, {"train", dir + "/config.json", "--run-dir", dir + "/run", "--quiet"}, 60000);
  *error = r.finished ? r.err : QString("the engine did not finish within 60 s");
  return r.code == 0;
}

}  // namespace

class TestUiFidelity : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;

 private slots:
  void initTestCase() {
    QStandardPaths::setTestModeEnabled(true);
    QCoreApplication::setOrganizationName("MeshStudioTests");
    QCoreApplication::setApplicationName("tst_ui_fidelity");
    QVERIFY(m_dir.isValid());
    QString error;
    QVERIFY2(trainSmallRun(m_dir.path(), &error), qPrintable(error));
  }

  void windowShowsTheReport() {
    ms::MainWindow w;
    w.show();
    ms::FidelityView* view = w.showFidelity(m_dir.path() + "/run");
    QVERIFY2(view, qPrintable(w.lastError()));
    QVERIFY(view->isVisible());
    auto expected = ms::fidelityOfRunFolder((m_dir.path() + "/run").toStdString());
    QVERIFY2(expected, expected.message().c_str());
    const ms::FidelityReport& r = *expected;
    QCOMPARE(view->report().stepsUsed, 2);
    QCOMPARE(view->report().ranks, 1);
    // Every row: times (without the bubble), memory, bubble.
    QTableWidget* t = view->table();
    QCOMPARE(t->rowCount(), static_cast<int>(r.times.size() + r.memory.size()));
    // The first row is the worst time row, with its figures in ms.
    const ms::FidelityRow& worst = r.times.front();
    QCOMPARE(t->item(0, ms::FidelityView::ColItem)->text(), QString(ms::toString(worst.item)));
    QCOMPARE(t->item(0, ms::FidelityView::ColMeasured)->text(),
             QString::number(1e3 * worst.measured, 'f', 3) + " ms");
    QVERIFY(view->summary()->text().contains(QString::number(1e3 * r.measuredStep, 'f', 2) + " ms"));
    QVERIFY(view->summary()->text().contains("fidelity-ui</b>: 1 rank, 2 steps compared"));
    // The memory rows only, each coloured against the 2% target.
    view->setFilter("memory");
    QCOMPARE(t->rowCount(), static_cast<int>(r.memory.size()));
    QVERIFY(t->rowCount() >= 4);
    for (int i = 0; i < t->rowCount(); ++i) {
      QCOMPARE(t->item(i, ms::FidelityView::ColItem)->text(), QString("memory"));
      const ms::FidelityRow& m = r.memory[size_t(i)];
      QCOMPARE(t->item(i, ms::FidelityView::ColWhat)->text(), QString::fromStdString(m.what));
      const QColor c = t->item(i, ms::FidelityView::ColError)->background().color();
      if (std::fabs(m.error()) <= 0.02)
        QCOMPARE(c, QColor(200, 235, 200));
      else
        QVERIFY(c != QColor(200, 235, 200));
    }
    // Forward rows: one per layer of the one rank (embedding, 2 blocks, head).
    view->setFilter("F");
    QCOMPARE(t->rowCount(), 4);
    view->setFilter("all");
    QCOMPARE(t->rowCount(), static_cast<int>(r.times.size() + r.memory.size()));
  }

  void refusals() {
    ms::MainWindow w;
    QVERIFY(!w.showFidelity());  // no run started or opened
    QVERIFY(w.lastError().contains("no run yet"));
    QVERIFY(!w.showFidelity(m_dir.path()));  // a folder with a config but no metrics stream
    QVERIFY2(w.lastError().contains("metrics.jsonl"), qPrintable(w.lastError()));
  }
};

QTEST_MAIN(TestUiFidelity)
#include "tst_ui_fidelity.moc"
