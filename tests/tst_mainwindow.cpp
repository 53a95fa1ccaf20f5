// The studio's main window under QT_QPA_PLATFORM=offscreen: an example project lists its model's layers; a
// project that fails validation is shown as a message naming the field, and the window stays usable.
#include <QtTest>

#include <QLabel>
#include <QTableWidget>

#include "plan/model_spec.h"
#include "plan/run_config.h"
#include "ui/views/main_window.h"

class TestMainWindow : public QObject {
  Q_OBJECT
 private slots:
  void opensExample() {
    ms::MainWindow w;
    w.show();
    const QString path = MS_SOURCE_DIR "/resources/examples/gpt-fortunes.json";
    QVERIFY2(w.openProject(path), qPrintable(w.lastError()));
    auto config = ms::loadRunConfig(path.toStdString());
    QVERIFY(config.isOk());
    const ms::ModelSpec spec = ms::buildModelSpec(config->model, config->training.seqLen);
    QCOMPARE(w.layerTable()->rowCount(), static_cast<int>(spec.layers.size()));
    QCOMPARE(w.layerTable()->item(0, 0)->text(), QString("embedding"));
    QCOMPARE(w.layerTable()->item(1, 1)->text().toLongLong(), spec.layers[1].paramCount());
    QVERIFY(w.windowTitle().contains("gpt-fortunes.json"));
  }

  void showsValidationErrors() {
    ms::MainWindow w;
    w.show();
    QVERIFY(!w.openProject(MS_TEST_DATA_DIR "/broken/tp_not_dividing_heads.json"));
    QVERIFY2(w.lastError().contains("/parallel/tp"), qPrintable(w.lastError()));
    QCOMPARE(w.layerTable()->rowCount(), 0);
    QVERIFY(!w.openProject("/nonexistent/project.json"));
    QVERIFY(w.lastError().contains("/nonexistent/project.json"));
    QCOMPARE(w.layerTable()->rowCount(), 0);
    const auto labels = w.findChildren<QLabel*>();
    bool shown = false;
    for (QLabel* l : labels) shown |= l->text().contains("project.json");
    QVERIFY(shown);
  }
};

QTEST_MAIN(TestMainWindow)
#include "tst_mainwindow.moc"
