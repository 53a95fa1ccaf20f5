// The studio in a real window under a real X server (CTest runs it through xvfb-run, QT_QPA_PLATFORM=xcb):
// every template is opened, the window is resized through the sizes people use, the tabs are switched and the
// mesh zoomed, and a freeze detector watches the event loop meanwhile. It fails when the loop stops
// answering: a timer due every kTickMs that fires more than kFreezeMs late, or a resize loop (the mesh canvas
// resized over and over while nothing happens). This is not a speed target (bench/ui_edit_latency measures
// speed); the bounds are far above any healthy figure, so the test cannot fail by chance on a slow machine,
// and every wait in it is bounded.
#include <QtTest>

#include <QElapsedTimer>
#include <QGuiApplication>
#include <QTabWidget>
#include <QTimer>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "ui/models/plan_analysis.h"
#include "ui/models/project_document.h"
#include "ui/views/main_window.h"
#include "ui/views/mesh_canvas.h"
#include "ui/views/timeline_view.h"

namespace {

constexpr int kTickMs = 50;
constexpr double kFreezeMs = 2000;  // the freeze: the event loop late by more than 2 s

// Counts how late a periodic timer fires: the longest the event loop went without answering. A watchdog
// thread ends the test when the loop has not answered for kFreezeMs, naming what the test was doing: a frozen
// loop never returns to the test, and would otherwise be reported only by Qt Test's own timeout minutes
// later.
class FreezeDetector : public QObject {
 public:
  FreezeDetector() {
    m_clock.start();
    m_beat.store(0);
    m_timer.setInterval(kTickMs);
    connect(&m_timer, &QTimer::timeout, this, [this] {
      const double now = double(m_clock.nsecsElapsed()) / 1e6;
      m_worst = std::max(m_worst, now - m_last - kTickMs);
      m_last = now;
      m_beat.store(m_clock.nsecsElapsed());
    });
    m_timer.start();
    m_watchdog = std::thread([this] {
      while (!m_stop.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const double silent = double(m_clock.nsecsElapsed() - m_beat.load()) / 1e6;
        if (silent > kFreezeMs) {
          std::lock_guard<std::mutex> lock(m_mutex);
          std::fprintf(stderr, "FAIL: the event loop has not answered for %.0f ms while %s\n", silent,
                       m_doing.c_str());
          std::fflush(stderr);
          std::_Exit(3);
        }
      }
    });
  }
  ~FreezeDetector() override {
    m_stop.store(true);
    m_watchdog.join();
  }
  void doing(const QString& what) {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_doing = what.toStdString();
  }
  double worstLatenessMs() const { return m_worst; }

 private:
  QTimer m_timer;
  QElapsedTimer m_clock;
  double m_last = 0;
  double m_worst = 0;
  std::atomic<qint64> m_beat;
  std::atomic<bool> m_stop{false};
  std::mutex m_mutex;
  std::string m_doing = "starting";
  std::thread m_watchdog;
};

// Counts the resize events a widget gets.
class ResizeCounter : public QObject {
 public:
  explicit ResizeCounter(QWidget* w) { w->installEventFilter(this); }
  int count = 0;

 protected:
  bool eventFilter(QObject*, QEvent* e) override {
    count += e->type() == QEvent::Resize;
    return false;
  }
};

bool waitForPlan(ms::MainWindow& w) {
  return QTest::qWaitFor(
      [&] { return w.snapshot() && !w.analyzer()->busy() && w.snapshot()->config == w.document()->config(); },
      60000);
}

}  // namespace

class TestStudioX11 : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    QStandardPaths::setTestModeEnabled(true);
    QCoreApplication::setOrganizationName("MeshStudioTests");
    QCoreApplication::setApplicationName("tst_studio_x11");
    // Under CTest this runs on a real X server (xvfb-run); say so when it does not, so a skipped display is
    // visible in the log rather than passed off as one.
    qInfo("platform: %s", qPrintable(QGuiApplication::platformName()));
  }

  void everyTemplateStaysResponsive() {
    ms::MainWindow w;  // its own default size first
    w.show();
    QVERIFY(QTest::qWaitForWindowExposed(&w));
    // Each template is edited below: the next New discards the edit instead of asking in a modal dialog.
    w.setUnsavedChangesHandler([] { return QMessageBox::Discard; });
    FreezeDetector detector;
    ResizeCounter canvasResizes(w.meshCanvas());
    const QList<QSize> sizes{{1366, 768}, {900, 600}, {1920, 1080}, {1600, 1000}};
    for (const ms::ProjectTemplate& t : ms::projectTemplates()) {
      detector.doing(QString("opening the %1 template").arg(t.key));
      QVERIFY2(w.newProject(t.key), qPrintable(t.key + ": " + w.lastError()));
      QVERIFY2(waitForPlan(w), qPrintable(t.key));
      QVERIFY2(w.snapshot()->ok(), qPrintable(t.key + ": " + w.snapshot()->error));
      for (const QSize& size : sizes) {
        detector.doing(QString("showing %1 at %2x%3").arg(t.key).arg(size.width()).arg(size.height()));
        w.resize(size);
        QTest::qWait(250);
      }
      // The fit-to-view / scroll bar loop only starts at some sizes: sweep them (width, then height) for a
      // large and a small mesh. At each size the canvas may be resized a few times, not over and over.
      if (t.key == "gpt3" || t.key == "gpt1b") {
        int most = 0;
        QSize worstSize;
        const auto at = [&](QSize size) {
          detector.doing(QString("sweeping %1 at %2x%3").arg(t.key).arg(size.width()).arg(size.height()));
          const int before = canvasResizes.count;
          w.resize(size);
          QTest::qWait(30);
          if (canvasResizes.count - before > most) most = canvasResizes.count - before, worstSize = size;
        };
        for (int width = 900; width <= 1900; width += 7) at(QSize(width, 950));
        for (int height = 600; height <= 1050; height += 5) at(QSize(1500, height));
        QVERIFY2(most <= 4, qPrintable(QString("%1: the mesh canvas was resized %2 times in 30 ms at %3x%4")
                                           .arg(t.key)
                                           .arg(most)
                                           .arg(worstSize.width())
                                           .arg(worstSize.height())));
        w.resize(1600, 1000);
      }
      detector.doing(QString("zooming and switching tabs on %1").arg(t.key));
      w.meshCanvas()->zoomIn();
      w.meshCanvas()->zoomIn();
      QTest::qWait(100);
      w.meshCanvas()->fitAll();
      w.tabs()->setCurrentIndex(1);
      QTest::qWait(200);
      w.tabs()->setCurrentIndex(0);
      // An edit re-plans while the window keeps answering.
      detector.doing(QString("re-planning %1 after an edit").arg(t.key));
      w.document()->edit("microbatches", [](ms::RunConfig& c) {
        c.parallel.microbatches = c.parallel.microbatches % 2 == 0 ? c.parallel.microbatches / 2 : 2;
      });
      QVERIFY2(waitForPlan(w), qPrintable(t.key));
      // Idle: a resize loop would keep resizing the canvas here.
      detector.doing(QString("idling on %1").arg(t.key));
      const int before = canvasResizes.count;
      QTest::qWait(1000);
      QVERIFY2(canvasResizes.count - before <= 2,
               qPrintable(QString("%1: the mesh canvas was resized %2 times in 1 s of idling")
                              .arg(t.key)
                              .arg(canvasResizes.count - before)));
      qInfo("%s: worst event-loop lateness so far %.0f ms", qPrintable(t.key), detector.worstLatenessMs());
      QVERIFY2(detector.worstLatenessMs() < kFreezeMs,
               qPrintable(QString("%1: the event loop stopped answering for %2 ms")
                              .arg(t.key)
                              .arg(detector.worstLatenessMs())));
    }
  }

  // Opening the large examples from their files (File > Open, or the command line) keeps the window
  // answering, and their plan views show one row per stage.
  void largeExamplesOpenResponsive() {
    ms::MainWindow w;
    w.resize(1600, 1000);
    w.show();
    QVERIFY(QTest::qWaitForWindowExposed(&w));
    FreezeDetector detector;
    w.setUnsavedChangesHandler([] { return QMessageBox::Discard; });
    for (const char* name : {"gpt3-175b-plan.json", "gpt3-175b-16k.json"}) {
      detector.doing(QString("opening %1").arg(name));
      QVERIFY(w.openProject(QStringLiteral(MS_SOURCE_DIR "/resources/examples/") + name));
      QVERIFY2(waitForPlan(w), name);
      QVERIFY(w.snapshot()->ok());
      QCOMPARE(w.predictedTimeline()->displayRowCount(), w.snapshot()->config.parallel.pp);
      QTest::qWait(500);
    }
    QVERIFY2(
        detector.worstLatenessMs() < kFreezeMs,
        qPrintable(QString("the event loop stopped answering for %1 ms").arg(detector.worstLatenessMs())));
  }
};

QTEST_MAIN(TestStudioX11)
#include "tst_studio_x11.moc"
