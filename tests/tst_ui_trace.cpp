// File > Import Measured Trace in the real studio window under QT_QPA_PLATFORM=offscreen: the hand-written
// GPU trace of two ranks (tests/data/traces/gpu-rank*.json, see tst_trace_import.cpp) imported through the
// function the menu calls (no file dialog), shown on the Run tab as the measured timeline (one row per rank,
// the last step both ranks have, its kernels on the compute lane and its NCCL collectives on the
// communication lane) above the open project's predicted step, with the status bar's account of what was
// recognized; a file that is not a trace is reported, and what was shown stays.
#include <QtTest>

#include <QAction>
#include <QStatusBar>
#include <QTabWidget>
#include <QTemporaryDir>
#include <cmath>

#include "plan/run_config.h"
#include "plan/trace_import.h"
#include "ui/models/project_document.h"
#include "ui/models/trace_timeline.h"
#include "ui/views/main_window.h"
#include "ui/views/run_view.h"
#include "ui/views/timeline_view.h"
#include "ui_test_util.h"

namespace {

using ms::test::waitForSnapshot;

const QString kTraces = QStringLiteral(MS_TEST_DATA_DIR "/traces/");

// A GPT small enough to plan in a moment: data parallel over two cpu devices of one node.
ms::RunConfig twoRanks() {
  ms::RunConfig c;
  c.name = "trace-tiny";
  c.device = ms::DeviceChoice::Cpu;
  c.model.layers = 2;
  c.model.width = 32;
  c.model.heads = 2;
  c.model.vocab = 256;
  c.model.context = 32;
  c.data.kind = ms::DataKind::Text;
  c.data.files = {"/usr/share/games/fortunes/*.u8"};
  c.mesh.nodes = {ms::NodeConfig{"n0", "cpu", 2}};
  c.parallel.dp = 2;
  c.training.steps = 2;
  c.training.batchSize = 4;
  c.training.seqLen = 32;
  c.training.threads = 1;
  return c;
}

}  // namespace

class TestUiTrace : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    QStandardPaths::setTestModeEnabled(true);
    QCoreApplication::setOrganizationName("MeshStudioTests");
    QCoreApplication::setApplicationName("tst_ui_trace");
  }

  void importsBesideThePrediction() {
    ms::MainWindow w;
    w.show();
    w.document()->reset(twoRanks());
    QVERIFY(waitForSnapshot(w));
    QVERIFY2(w.snapshot()->ok(), qPrintable(w.snapshot()->error));
    QAction* action = w.findChild<QAction*>(QStringLiteral("importTraceAction"));
    QVERIFY(action);
    QVERIFY(action->isEnabled());

    const QStringList files = {kTraces + "gpu-rank0.json", kTraces + "gpu-rank1.json"};
    QVERIFY2(w.importTrace(files), qPrintable(w.lastError()));
    QCOMPARE(w.tabs()->currentIndex(), 1);
    ms::TimelineView* measured = w.measuredTimeline();
    auto data = measured->data();
    QVERIFY(data);
    // One row per rank, each its own display row; step 6 (the last both ranks have): 8 spans each, five
    // kernels on the compute lane (GEMM, attention, gelu, Adam, the memcpy) and three NCCL collectives.
    QCOMPARE(data->rows.size(), std::size_t(2));
    QCOMPARE(measured->displayRowCount(), 2);
    QCOMPARE(data->begin, 0.0);
    for (int r = 0; r < 2; ++r) {
      const ms::TimelineRow& row = data->rows[std::size_t(r)];
      QCOMPARE(row.rank, r);
      QCOMPARE(row.label, QStringLiteral("rank %1 · GPU kernels").arg(r));
      QCOMPARE(row.spans.size(), std::size_t(8));
      int compute = 0, comm = 0, gradSync = 0;
      for (const ms::TimelineSpan& s : row.spans) {
        (ms::laneOf(s.kind) == 0 ? compute : comm)++;
        gradSync += s.kind == ms::SpanKind::GradSync;
        QVERIFY(s.layer >= 0 && s.layer < data->layerNames.size());
      }
      QCOMPARE(compute, 5);
      QCOMPARE(comm, 3);
      QCOMPARE(gradSync, 2);  // all_reduce and all_gather; the sendrecv is a Send
      QVERIFY(data->layerNames[row.spans[0].layer].startsWith("GEMM 1024x4096x4096: sm90_xmma_gemm_"));
    }
    // The bubble shown is the step's idle fraction: rank 0's step 6 is busy 1430 of its 2830 us.
    QVERIFY(std::fabs(data->rows[0].bubbleFraction - (1 - 1430.0 / 2830)) < 1e-6);
    // The open project's prediction below it, and the status bar's account.
    QVERIFY(w.runPredictedTimeline()->data());
    QVERIFY(!w.runPredictedTimeline()->data()->rows.empty());
    const QString status = w.statusBar()->currentMessage();
    QVERIFY2(status.contains("2 ranks, 104 events: 24 recognized (4 GEMM, 4 attention, 12 collectives, "
                             "4 optimizer), 8 other"),
             qPrintable(status));
    QVERIFY2(status.contains("Memcpy DtoH"), qPrintable(status));
    // The dashboard's refresh timer leaves the trace in place.
    QTest::qWait(3 * ms::RunView::kRefreshMs);
    QCOMPARE(measured->data(), data);

    // Not a trace: reported with the file, and the trace stays.
    QTemporaryDir dir;
    const QString bad = dir.path() + "/bad.json";
    QFile f(bad);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("{\"foo\": 1}");
    f.close();
    QVERIFY(!w.importTrace({bad}));
    QVERIFY2(w.lastError().startsWith(bad + ": not a Chrome trace"), qPrintable(w.lastError()));
    QCOMPARE(measured->data(), data);

    // The real CPU traces of the gloo run: CPU ops, ranks from distributedInfo.
    QVERIFY2(
        w.importTrace({kTraces + "torch-cpu-rank0.kineto.json", kTraces + "torch-cpu-rank1.kineto.json"}),
        qPrintable(w.lastError()));
    QVERIFY(measured->data() != data);
    QCOMPARE(measured->data()->rows.size(), std::size_t(2));
    QCOMPARE(measured->data()->rows[1].label, QStringLiteral("rank 1 · CPU ops"));
  }
};

QTEST_MAIN(TestUiTrace)
#include "tst_ui_trace.moc"
