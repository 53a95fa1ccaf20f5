// The timeline and memory views under QT_QPA_PLATFORM=offscreen: the time axis and row geometry (data
// tables), hit testing and pixels of the timeline on hand-built spans (also after zoom and pan, also with the
// merged columns of narrow spans and a long span that starts before the view), a real simulated pp=2 plan
// with the simulator's bubbles, the memory bars of a plan that fits and of ones that do not, and the Chrome
// trace export parsed back.
#include <QtTest>

#include <QMouseEvent>
#include <QTemporaryDir>
#include <QToolTip>
#include <QWheelEvent>
#include <cmath>
#include <memory>

#include <nlohmann/json.hpp>

#include "qcustomplot.h"
#include "ui/models/chrome_trace.h"
#include "ui/models/plan_analysis.h"
#include "ui/models/time_axis.h"
#include "ui/models/timeline_groups.h"
#include "ui/models/units.h"
#include "ui/views/memory_view.h"
#include "ui/views/timeline_view.h"

using ms::RowLayout;
using ms::SpanKind;
using ms::TimeAxis;
using ms::TimelineData;
using ms::TimelineSpan;
using ms::TimelineView;

namespace {

constexpr double kMs = 1e-3;

TimelineSpan span(double start, double end, SpanKind kind, int mb, int chunk = 0, int layer = -1) {
  TimelineSpan s;
  s.start = start, s.end = end, s.kind = kind;
  s.microbatch = static_cast<std::int16_t>(mb);
  s.chunk = static_cast<std::int16_t>(chunk);
  s.layer = layer;
  return s;
}

// Two ranks: rank 0 computes F0 [0, 1] ms, a gap, B0 [2, 3] ms, and sends [1, 1.5] ms on lane 1; rank 1
// receives (waits) [0, 1] ms and computes F0 [1, 2] ms.
std::shared_ptr<TimelineData> handBuilt() {
  auto d = std::make_shared<TimelineData>();
  d->layerNames = {"embedding", "block.0", "block.1", "head"};
  d->rows.resize(2);
  d->rows[0].rank = 0, d->rows[0].stage = 0, d->rows[0].label = "rank 0 · stage 0";
  d->rows[0].bubbleFraction = 0.5;
  d->rows[0].spans = {span(0, 1 * kMs, SpanKind::Forward, 0, 0, 1),
                      span(1 * kMs, 1.5 * kMs, SpanKind::Send, 0),
                      span(2 * kMs, 3 * kMs, SpanKind::Backward, 0, 0, 1)};
  d->rows[1].rank = 1, d->rows[1].stage = 1, d->rows[1].label = "rank 1 · stage 1";
  d->rows[1].bubbleFraction = 0.25;
  d->rows[1].spans = {span(0, 1 * kMs, SpanKind::Recv, 0),
                      span(1 * kMs, 2 * kMs, SpanKind::Forward, 0, 0, 2)};
  d->updateExtent();
  return d;
}

// Two stages of four ranks: the ranks of a stage run F then B; rank r's B ends at (3 + r % 4) ms, so the
// last rank of each stage finishes last; bubbles 10%, 20%, 30%, 40% within a stage.
std::shared_ptr<TimelineData> twoStagesOfFour() {
  auto d = std::make_shared<TimelineData>();
  d->rows.resize(8);
  for (int r = 0; r < 8; ++r) {
    ms::TimelineRow& row = d->rows[static_cast<size_t>(r)];
    row.rank = r, row.stage = r / 4, row.bubbleFraction = 0.1 * (1 + r % 4);
    row.label = QString("rank %1 · stage %2").arg(r).arg(r / 4);
    row.spans = {span(0, 1 * kMs, SpanKind::Forward, 0),
                 span(2 * kMs, (3 + r % 4) * kMs, SpanKind::Backward, 0)};
  }
  d->updateExtent();
  return d;
}

// The pixel (centre of a lane) where a view draws time t in a row's lane.
QPoint pointAt(const TimelineView& v, double t, int row, int lane) {
  const RowLayout::Band band = v.rowLayout().lane(row, lane);
  return {static_cast<int>(std::floor(v.timeAxis().x(t))), band.top + band.height / 2};
}

ms::RunConfig exampleConfig(const char* name) {
  auto config = ms::loadRunConfig(std::string(MS_SOURCE_DIR "/resources/examples/") + name);
  if (!config) qFatal("cannot load %s: %s", name, config.message().c_str());
  return *config;
}

std::shared_ptr<const ms::PlanSnapshot> fortunesPp2() {
  ms::RunConfig config = exampleConfig("gpt-fortunes.json");
  config.parallel.pp = 2;
  config.parallel.microbatches = 4;
  config.mesh.nodes[0].count = 2;
  return ms::analyzePlan(config);
}

// The same plan with stage 1 on a device of 2 MB ("tiny", a device type of the config's own).
std::shared_ptr<const ms::PlanSnapshot> fortunesPp2Tiny() {
  ms::RunConfig config = exampleConfig("gpt-fortunes.json");
  config.parallel.pp = 2;
  config.parallel.microbatches = 4;
  ms::DeviceTypeConfig tiny;
  tiny.name = "tiny";
  tiny.peakTflopsFp32 = 1;
  tiny.peakTflopsBf16 = 2;
  tiny.memoryGb = 0.002;
  tiny.memoryBandwidthGbs = 10;
  config.mesh.deviceTypes = {tiny};
  config.mesh.nodes = {ms::NodeConfig{"n0", "cpu", 1}, ms::NodeConfig{"n1", "tiny", 1}};
  return ms::analyzePlan(config);
}

void sendDrag(QWidget* w, QPoint from, QPoint to) {
  QMouseEvent press(QEvent::MouseButtonPress, from, w->mapToGlobal(from), Qt::LeftButton, Qt::LeftButton,
                    Qt::NoModifier);
  QCoreApplication::sendEvent(w, &press);
  QMouseEvent move(QEvent::MouseMove, to, w->mapToGlobal(to), Qt::NoButton, Qt::LeftButton, Qt::NoModifier);
  QCoreApplication::sendEvent(w, &move);
  QMouseEvent release(QEvent::MouseButtonRelease, to, w->mapToGlobal(to), Qt::LeftButton, Qt::NoButton,
                      Qt::NoModifier);
  QCoreApplication::sendEvent(w, &release);
}

}  // namespace

class TestUiTimeline : public QObject {
  Q_OBJECT
 private slots:
  // ---- TimeAxis ----
  void axisMaps_data() {
    QTest::addColumn<double>("t0");
    QTest::addColumn<double>("t1");
    QTest::addColumn<double>("x0");
    QTest::addColumn<double>("width");
    QTest::addColumn<double>("t");
    QTest::addColumn<double>("x");
    QTest::newRow("start") << 0.0 << 1.0 << 0.0 << 100.0 << 0.0 << 0.0;
    QTest::newRow("end") << 0.0 << 1.0 << 0.0 << 100.0 << 1.0 << 100.0;
    QTest::newRow("offset pixels") << 0.0 << 1.0 << 240.0 << 1000.0 << 0.25 << 490.0;
    QTest::newRow("offset time") << 2e-3 << 4e-3 << 10.0 << 200.0 << 3e-3 << 110.0;
    QTest::newRow("left of range") << 1.0 << 2.0 << 0.0 << 100.0 << 0.5 << -50.0;
    QTest::newRow("right of range") << 1.0 << 2.0 << 0.0 << 100.0 << 2.5 << 150.0;
    QTest::newRow("inverted is swapped") << 1.0 << 0.0 << 0.0 << 100.0 << 0.75 << 75.0;
  }
  void axisMaps() {
    QFETCH(double, t0);
    QFETCH(double, t1);
    QFETCH(double, x0);
    QFETCH(double, width);
    QFETCH(double, t);
    QFETCH(double, x);
    const TimeAxis a(t0, t1, x0, width);
    QVERIFY(a.t1() > a.t0());
    QVERIFY(std::abs(a.x(t) - x) < 1e-9);
    QVERIFY(std::abs(a.t(x) - t) < 1e-12);
  }

  void axisZoom_data() {
    QTest::addColumn<double>("x");
    QTest::addColumn<double>("factor");
    QTest::addColumn<double>("t0");  // expected, axis starts as [0, 1] s on [0, 100] px
    QTest::addColumn<double>("t1");
    QTest::newRow("in at centre") << 50.0 << 2.0 << 0.25 << 0.75;
    QTest::newRow("in at left edge") << 0.0 << 4.0 << 0.0 << 0.25;
    QTest::newRow("in at right edge") << 100.0 << 10.0 << 0.9 << 1.0;
    QTest::newRow("in at 20%") << 20.0 << 2.0 << 0.1 << 0.6;
    QTest::newRow("out at centre") << 50.0 << 0.5 << -0.5 << 1.5;
    QTest::newRow("factor 1 keeps") << 37.0 << 1.0 << 0.0 << 1.0;
    QTest::newRow("zero factor ignored") << 50.0 << 0.0 << 0.0 << 1.0;
    QTest::newRow("negative factor ignored") << 50.0 << -2.0 << 0.0 << 1.0;
    QTest::newRow("nan ignored") << std::nan("") << 2.0 << 0.0 << 1.0;
  }
  void axisZoom() {
    QFETCH(double, x);
    QFETCH(double, factor);
    QFETCH(double, t0);
    QFETCH(double, t1);
    TimeAxis a(0, 1, 0, 100);
    const double anchor = a.t(x);
    a.zoomAt(x, factor);
    QVERIFY2(std::abs(a.t0() - t0) < 1e-12, qPrintable(QString::number(a.t0())));
    QVERIFY2(std::abs(a.t1() - t1) < 1e-12, qPrintable(QString::number(a.t1())));
    if (std::isfinite(x)) QVERIFY(std::abs(a.t(x) - anchor) < 1e-12);  // the time under the cursor stays
  }

  void axisClamps_data() {
    QTest::addColumn<QString>("op");
    QTest::addColumn<double>("span");
    QTest::newRow("zoom past the minimum span") << "zoomIn1e12" << TimeAxis::kMinSpan;
    QTest::newRow("zoom out past max span") << "zoomOut1e12" << 100.0;
    QTest::newRow("range narrower than minimum") << "narrow" << TimeAxis::kMinSpan;
    QTest::newRow("empty range") << "empty" << TimeAxis::kMinSpan;
    QTest::newRow("range wider than max") << "wide" << 100.0;
    QTest::newRow("fit of a point") << "fitPoint" << TimeAxis::kMinSpan;
    QTest::newRow("fit with margin") << "fitMargin" << 1.2;
    QTest::newRow("infinite range ignored") << "inf" << 1.0;
  }
  void axisClamps() {
    QFETCH(QString, op);
    QFETCH(double, span);
    TimeAxis a(0, 1, 0, 100);
    a.setMaxSpan(100);
    if (op == "zoomIn1e12") a.zoomAt(30, 1e12);
    if (op == "zoomOut1e12") a.zoomAt(30, 1e-12);
    if (op == "narrow") a.setRange(5, 5 + 1e-12);
    if (op == "empty") a.setRange(5, 5);
    if (op == "wide") a.setRange(-1000, 1000);
    if (op == "fitPoint") a.fit(3, 3);
    if (op == "fitMargin") a.fit(1, 2, 0.1);
    if (op == "inf") a.setRange(0, std::numeric_limits<double>::infinity());
    QVERIFY2(std::abs(a.span() - span) <= span * 1e-4, qPrintable(QString::number(a.span())));
    QVERIFY(a.t1() > a.t0());
    if (op == "fitMargin") QVERIFY(std::abs(a.t0() - 0.9) < 1e-12);
    if (op == "wide") QVERIFY(std::abs(a.t0() + 50) < 1e-9);  // narrowed about its centre
  }

  void axisPanAndPixels() {
    TimeAxis a(0, 1e-3, 240, 1000);  // 1 us per pixel
    a.panBy(100);                    // content moves right: earlier times come into view
    QVERIFY(std::abs(a.t0() + 100e-6) < 1e-15);
    QVERIFY(std::abs(a.span() - 1e-3) < 1e-15);
    a.setPixels(240, 500);  // a resize keeps the range
    QVERIFY(std::abs(a.t0() + 100e-6) < 1e-15);
    QVERIFY(std::abs(a.secondsPerPixel() - 2e-6) < 1e-15);
    a.setPixels(0, 0);
    QCOMPARE(a.width(), 1.0);
  }

  void ticks_data() {
    QTest::addColumn<double>("t0");
    QTest::addColumn<double>("t1");
    QTest::addColumn<double>("step");
    QTest::addColumn<QString>("unit");
    QTest::addColumn<QString>("firstLabel");
    // 1000 px, at least 100 px apart: the step is the first of 1, 2, 5 x 10^k above span / 10.
    QTest::newRow("seconds") << 0.0 << 10.0 << 1.0 << "s"
                             << "0 s";
    QTest::newRow("ms") << 0.0 << 0.05 << 0.005 << "ms"
                        << "0 ms";
    QTest::newRow("ms, 2 steps") << 0.0 << 0.015 << 0.002 << "ms"
                                 << "0 ms";
    QTest::newRow("half ms") << 0.001 << 0.0045 << 0.0005 << "ms"
                             << "1.0 ms";
    QTest::newRow("tenths of a second") << 0.05 << 1.0 << 0.1 << "s"
                                        << "0.1 s";
    QTest::newRow("us offset") << 1.00002 << 1.0001 << 1e-5 << "us"
                               << "1000020 us";
    QTest::newRow("ns") << 0.0 << 3e-7 << 5e-8 << "ns"
                        << "0 ns";
    QTest::newRow("tenths of a us") << 0.0 << 1e-6 << 1e-7 << "us"
                                    << "0.0 us";
    QTest::newRow("step rounds up to the next decade") << 0.0 << 0.0008 << 1e-4 << "ms"
                                                       << "0.0 ms";
  }
  void ticks() {
    QFETCH(double, t0);
    QFETCH(double, t1);
    QFETCH(double, step);
    QFETCH(QString, unit);
    QFETCH(QString, firstLabel);
    const TimeAxis a(t0, t1, 0, 1000);
    const ms::TimeTicks ticks = ms::timeTicks(a, 100);
    QVERIFY2(std::abs(ticks.step - step) < step * 1e-9, qPrintable(QString::number(ticks.step)));
    QCOMPARE(ticks.unit, unit);
    QVERIFY(!ticks.times.empty());
    QCOMPARE(ms::formatTick(ticks.times.front(), ticks), firstLabel);
    for (double t : ticks.times) QVERIFY(t >= a.t0() - 1e-12 && t <= a.t1() + 1e-12);
    QVERIFY(a.x(ticks.times.size() > 1 ? ticks.times[1] : t1) - a.x(ticks.times[0]) >= 100 - 1e-6);
  }

  void formatDuration_data() {
    QTest::addColumn<double>("seconds");
    QTest::addColumn<QString>("text");
    QTest::newRow("ns") << 850e-9 << "850 ns";
    QTest::newRow("us") << 12.34e-6 << "12.3 us";
    QTest::newRow("ms") << 4.567e-3 << "4.57 ms";
    QTest::newRow("s") << 1.234 << "1.23 s";
    QTest::newRow("hundreds of ms") << 0.2502 << "250 ms";
    QTest::newRow("zero") << 0.0 << "0 ns";
  }
  void formatDuration() {
    QFETCH(double, seconds);
    QFETCH(QString, text);
    QCOMPARE(ms::formatDuration(seconds), text);
  }

  // ---- RowLayout ----
  void rowLayout_data() {
    QTest::addColumn<int>("scroll");
    QTest::addColumn<int>("y");
    QTest::addColumn<int>("row");
    QTest::addColumn<int>("lane");
    // 10 rows of 30 px under a 28 px header; lanes at +4 (16 px) and +21 (6 px) of each row.
    QTest::newRow("header") << 0 << 10 << -1 << -1;
    QTest::newRow("row 0 top padding") << 0 << 28 << 0 << -1;
    QTest::newRow("row 0 compute") << 0 << 32 << 0 << 0;
    QTest::newRow("row 0 compute last") << 0 << 47 << 0 << 0;
    QTest::newRow("row 0 lane gap") << 0 << 48 << 0 << -1;
    QTest::newRow("row 0 comm") << 0 << 49 << 0 << 1;
    QTest::newRow("row 0 comm last") << 0 << 54 << 0 << 1;
    QTest::newRow("row 0 bottom padding") << 0 << 55 << 0 << -1;
    QTest::newRow("row 1 compute") << 0 << 62 << 1 << 0;
    QTest::newRow("row 9 comm") << 0 << 28 + 9 * 30 + 22 << 9 << 1;
    QTest::newRow("below last") << 0 << 28 + 10 * 30 << -1 << -1;
    QTest::newRow("scrolled: row 3 at top") << 90 << 32 << 3 << 0;
    QTest::newRow("scrolled: header still header") << 90 << 5 << -1 << -1;
  }
  void rowLayout() {
    QFETCH(int, scroll);
    QFETCH(int, y);
    QFETCH(int, row);
    QFETCH(int, lane);
    RowLayout l(10, 28, 30);
    l.scrollTo(scroll, 100);
    QCOMPARE(l.scrollY(), scroll);
    QCOMPARE(l.rowAt(y), row);
    QCOMPARE(l.laneAt(y), lane);
    if (row >= 0) {
      QVERIFY(y >= l.yOfRow(row) && y < l.yOfRow(row) + l.rowHeight());
      if (lane >= 0) QVERIFY(l.lane(row, lane).contains(y));
    }
  }

  void rowLayoutScroll_data() {
    QTest::addColumn<int>("rows");
    QTest::addColumn<int>("viewport");
    QTest::addColumn<int>("want");
    QTest::addColumn<int>("scroll");
    QTest::addColumn<int>("first");
    QTest::addColumn<int>("last");
    QTest::newRow("all fit") << 3 << 300 << 50 << 0 << 0 << 2;
    QTest::newRow("negative clamped") << 20 << 328 << -40 << 0 << 0 << 9;
    QTest::newRow("middle") << 20 << 328 << 45 << 45 << 1 << 11;
    QTest::newRow("past the end clamped") << 20 << 328 << 10000 << 300 << 10 << 19;
    QTest::newRow("viewport only header") << 20 << 28 << 0 << 0 << 0 << -1;
    QTest::newRow("no rows") << 0 << 300 << 10 << 0 << 0 << -1;
  }
  void rowLayoutScroll() {
    QFETCH(int, rows);
    QFETCH(int, viewport);
    QFETCH(int, want);
    QFETCH(int, scroll);
    QFETCH(int, first);
    QFETCH(int, last);
    RowLayout l(rows, 28, 30);
    l.scrollTo(want, viewport);
    QCOMPARE(l.scrollY(), scroll);
    QCOMPARE(l.firstVisibleRow(), first);
    QCOMPARE(l.lastVisibleRow(viewport), last);
  }

  void rowLayoutRaisesTooSmallRows() {
    const RowLayout l(4, 0, 5);
    QVERIFY(l.rowHeight() >= RowLayout::kLanesBottom);
    QVERIFY(l.lane(0, 1).top + l.lane(0, 1).height <= l.yOfRow(1));
  }

  // ---- TimelineView ----
  // ---- Grouping by stage ----
  void groupsByStage() {
    const auto d = twoStagesOfFour();
    const ms::TimelineGroups collapsed(*d, {});
    QVERIFY(collapsed.grouping());
    QCOMPARE(collapsed.groups().size(), std::size_t(2));
    QCOMPARE(collapsed.displayRowCount(), 2);  // one row per stage
    for (int g = 0; g < 2; ++g) {
      const ms::TimelineGroup& group = collapsed.groups()[static_cast<size_t>(g)];
      QCOMPARE(group.stage, g);
      QCOMPARE(group.rows, (std::vector<int>{4 * g, 4 * g + 1, 4 * g + 2, 4 * g + 3}));
      QCOMPARE(group.representative, 4 * g + 3);  // the last to finish
      QCOMPARE(group.bubbleMin, 0.1);
      QCOMPARE(group.bubbleMax, 0.4);
      QVERIFY(collapsed.displayRows()[static_cast<size_t>(g)].header);
    }
    QCOMPARE(collapsed.displayRowOf(5), 1);  // rank 5 is drawn by stage 1's header while collapsed
    const ms::TimelineGroups expanded(*d, {1});
    QCOMPARE(expanded.displayRowCount(), 2 + 4);  // stage 0's header, stage 1's header and its four ranks
    QVERIFY(expanded.displayRows()[1].header);
    for (int i = 0; i < 4; ++i) {
      QCOMPARE(expanded.displayRows()[static_cast<size_t>(2 + i)].dataRow, 4 + i);
      QVERIFY(expanded.displayRows()[static_cast<size_t>(2 + i)].member);
    }
    QCOMPARE(expanded.displayRowOf(5), 3);
    // One rank per stage: nothing to group, the rows are shown as they are.
    const ms::TimelineGroups plain(*handBuilt(), {});
    QVERIFY(!plain.grouping());
    QCOMPARE(plain.displayRowCount(), 2);
    QCOMPARE(plain.displayRows()[1].dataRow, 1);
    QVERIFY(!plain.displayRows()[1].header);
  }

  void viewExpandsAStageOnClick() {
    TimelineView v;
    v.resize(1000, 400);
    v.setData(twoStagesOfFour());
    QCOMPARE(v.rowLayout().rowCount(), 2);
    QCOMPARE(v.displayRowText(1), QString("stage 1 · 4 ranks — bubble 10-40%"));
    // The header row draws its representative: a hit on its B at 5.5 ms is rank 7's (it alone runs that
    // late).
    const auto hit = v.spanAt(pointAt(v, 5.5 * kMs, 1, 0));
    QVERIFY(hit);
    QCOMPARE(hit->row, 7);
    QCOMPARE(hit->displayRow, 1);
    QVERIFY2(v.toolTipText(*hit).contains("the last of stage 1's 4 ranks"), qPrintable(v.toolTipText(*hit)));
    // A click on stage 1's label lists its ranks; a second click hides them.
    const QPoint header(20, v.rowLayout().yOfRow(1) + v.rowLayout().rowHeight() / 2);
    QTest::mouseClick(&v, Qt::LeftButton, Qt::NoModifier, header);
    QVERIFY(v.isStageExpanded(1));
    QCOMPARE(v.rowLayout().rowCount(), 6);
    QCOMPARE(v.displayRowText(2), QString("rank 4 · stage 1 — bubble 10%"));
    const auto member = v.spanAt(pointAt(v, 2.5 * kMs, 2, 0));
    QVERIFY(member && member->row == 4 && member->span.kind == SpanKind::Backward);
    QTest::mouseClick(&v, Qt::LeftButton, Qt::NoModifier, header);
    QVERIFY(!v.isStageExpanded(1));
    QCOMPARE(v.rowLayout().rowCount(), 2);
    // The expansion survives new data (a measured timeline is replaced every step).
    v.setStageExpanded(0, true);
    v.setData(twoStagesOfFour());
    QCOMPARE(v.rowLayout().rowCount(), 6);
    v.setAllExpanded(false);
    QCOMPARE(v.rowLayout().rowCount(), 2);
  }

  void labelsColumnFitsItsLabels() {
    TimelineView v;
    v.resize(1000, 200);
    v.setData(handBuilt());
    const int own = v.headerWidth();
    QVERIFY(own >= TimelineView::kMinHeaderWidth && own <= TimelineView::kMaxHeaderWidth);
    QCOMPARE(v.timeAxis().x0(), double(own));
    // A width set from outside (a pair of views sharing a time axis) moves the time area with it.
    v.setHeaderWidth(own + 40);
    QCOMPARE(v.headerWidth(), own + 40);
    QCOMPARE(v.timeAxis().x0(), double(own + 40));
    v.setHeaderWidth(0);
    QCOMPARE(v.headerWidth(), own);
  }

  void outdatedIsDrawnAndKept() {
    TimelineView v;
    v.resize(600, 200);
    v.setData(handBuilt());
    const QImage current = v.render(v.size());
    v.setOutdated("re-planning");
    QCOMPARE(v.outdatedReason(), QString("re-planning"));
    const QImage outdated = v.render(v.size());
    // The wash lightens the spans (F0 of rank 0 mid-span) and the band is drawn at the top of the rows.
    const QPoint f0 = pointAt(v, 0.5 * kMs, 0, 0);
    QVERIFY(QColor(outdated.pixel(f0)).lightness() > QColor(current.pixel(f0)).lightness());
    QCOMPARE(QColor(outdated.pixel(v.width() - 20, v.rowLayout().headerHeight() + 2)), QColor(254, 243, 199));
    v.setOutdated(QString());
    QCOMPARE(v.render(v.size()), current);
  }

  void hitTest() {
    TimelineView v;
    v.resize(1000, 200);
    v.setData(handBuilt());
    const auto d = v.data();
    QCOMPARE(v.rowLayout().rowCount(), 2);
    QVERIFY(v.timeAxis().t0() <= 0 && v.timeAxis().t1() >= 3 * kMs);

    auto hit = v.spanAt(pointAt(v, 0.5 * kMs, 0, 0));
    QVERIFY(hit);
    QCOMPARE(hit->row, 0);
    QCOMPARE(hit->lane, 0);
    QCOMPARE(hit->index, std::size_t(0));
    QCOMPARE(hit->span.kind, SpanKind::Forward);
    const QString tip = v.toolTipText(*hit);
    QVERIFY2(tip.contains("forward") && tip.contains("block.0") && tip.contains("microbatch 0") &&
                 tip.contains("duration 1.00 ms") && tip.contains("start 0 ns"),
             qPrintable(tip));

    QVERIFY(!v.spanAt(pointAt(v, 1.5 * kMs, 0, 0)));  // the bubble between F and B
    hit = v.spanAt(pointAt(v, 1.25 * kMs, 0, 1));     // the send on the communication lane
    QVERIFY(hit);
    QCOMPARE(hit->span.kind, SpanKind::Send);
    QCOMPARE(hit->index, std::size_t(1));
    hit = v.spanAt(pointAt(v, 2.5 * kMs, 0, 0));
    QVERIFY(hit && hit->span.kind == SpanKind::Backward);
    hit = v.spanAt(pointAt(v, 0.5 * kMs, 1, 0));
    QVERIFY(hit && hit->span.kind == SpanKind::Recv && hit->row == 1);
    QVERIFY(!v.spanAt(pointAt(v, 2.5 * kMs, 1, 0)));  // rank 1 is idle after its F
    QVERIFY(!v.spanAt(pointAt(v, 0.5 * kMs, 1, 1)));  // nothing on rank 1's communication lane
    // Between the lanes, in the axis header, in the row headers: nothing.
    QPoint p = pointAt(v, 0.5 * kMs, 0, 0);
    QVERIFY(!v.spanAt({p.x(), v.rowLayout().lane(0, 0).top - 1}));
    QVERIFY(!v.spanAt({p.x(), 5}));
    QVERIFY(!v.spanAt({20, p.y()}));
    // Hovering shows the same text as a tooltip; over a gap, none.
    const QPoint f = pointAt(v, 0.5 * kMs, 0, 0);
    QHelpEvent help(QEvent::ToolTip, f, v.mapToGlobal(f));
    QCoreApplication::sendEvent(&v, &help);
    QCOMPARE(QToolTip::text(), tip);
    const QPoint g = pointAt(v, 1.5 * kMs, 0, 0);
    QHelpEvent helpGap(QEvent::ToolTip, g, v.mapToGlobal(g));
    QCoreApplication::sendEvent(&v, &helpGap);
    QTRY_VERIFY_WITH_TIMEOUT(!QToolTip::isVisible(), 3000);  // hidden after its short fade
    QVERIFY(v.rowHeaderText(0).contains("bubble 50%"));
    QVERIFY(v.rowHeaderText(1).contains("bubble 25%"));
  }

  void hitTestAfterZoomAndPan() {
    TimelineView v;
    v.resize(1000, 200);
    v.setData(handBuilt());
    QSignalSpy ranges(&v, &TimelineView::viewRangeChanged);
    // Wheel three notches in over the middle of F: the time under the cursor stays, the span widens.
    const QPoint at = pointAt(v, 0.3 * kMs, 0, 0);
    const double before = v.timeAxis().t(at.x());
    const double spanBefore = v.timeAxis().span();
    QWheelEvent wheel(at, v.mapToGlobal(at), QPoint(), QPoint(0, 360), Qt::NoButton, Qt::NoModifier,
                      Qt::NoScrollPhase, false);
    QCoreApplication::sendEvent(&v, &wheel);
    QVERIFY(std::abs(v.timeAxis().t(at.x()) - before) < 1e-12);
    QVERIFY(std::abs(v.timeAxis().span() - spanBefore / std::pow(1.25, 3)) < 1e-12);
    QCOMPARE(ranges.count(), 1);
    auto hit = v.spanAt(at);
    QVERIFY(hit && hit->span.kind == SpanKind::Forward);
    // F ends 1 ms; after zooming its end is further right than before.
    const QPoint gap = pointAt(v, 1.5 * kMs, 0, 0);
    QVERIFY(!v.spanAt(gap));

    // Drag 150 px to the right: what was under x is now under x + 150.
    const double tUnder = v.timeAxis().t(at.x());
    sendDrag(&v, at, at + QPoint(150, 0));
    QVERIFY(std::abs(v.timeAxis().t(at.x() + 150) - tUnder) < 1e-12);
    hit = v.spanAt(at + QPoint(150, 0));
    QVERIFY(hit && hit->span.kind == SpanKind::Forward);
    QCOMPARE(ranges.count(), 2);

    // A range entirely inside B: B everywhere on rank 0's compute lane, nothing on rank 1's.
    v.setViewRange(2.2 * kMs, 2.8 * kMs);
    hit = v.spanAt(pointAt(v, 2.5 * kMs, 0, 0));
    QVERIFY(hit && hit->span.kind == SpanKind::Backward);
    QVERIFY(v.spanAt({static_cast<int>(v.timeAxis().x0()) + 1, pointAt(v, 2.5 * kMs, 0, 0).y()}));
    QVERIFY(!v.spanAt(pointAt(v, 2.5 * kMs, 1, 0)));

    // New data keeps a user's zoom; fitAll returns to the whole step and follows the data again.
    v.setData(handBuilt());
    QVERIFY(std::abs(v.timeAxis().t0() - 2.2 * kMs) < 1e-12);
    v.fitAll();
    QVERIFY(v.timeAxis().t0() <= 0 && v.timeAxis().t1() >= 3 * kMs);
    v.zoomIn();
    QVERIFY(v.timeAxis().span() < 3 * kMs);
    v.zoomOut();
    v.zoomOut();
    QVERIFY(v.timeAxis().span() > 3 * kMs);
  }

  void renderPixels() {
    TimelineView v;
    v.resize(1000, 200);
    v.setData(handBuilt());
    const QImage img = v.render(v.size());
    QCOMPARE(img.size(), QSize(1000, 200));
    const auto d = v.data();
    const QPoint f = pointAt(v, 0.5 * kMs, 0, 0);
    QCOMPARE(QColor(img.pixel(f)), TimelineView::spanColor(d->rows[0].spans[0]));
    const QPoint b = pointAt(v, 2.5 * kMs, 0, 0);
    QCOMPARE(QColor(img.pixel(b)), TimelineView::spanColor(d->rows[0].spans[2]));
    QVERIFY(TimelineView::spanColor(d->rows[0].spans[0]) != TimelineView::spanColor(d->rows[0].spans[2]));
    const QPoint gap = pointAt(v, 1.5 * kMs, 0, 0);
    QCOMPARE(QColor(img.pixel(gap)), TimelineView::backgroundColor());
    const QPoint send = pointAt(v, 1.25 * kMs, 0, 1);
    QCOMPARE(QColor(img.pixel(send)), TimelineView::spanColor(d->rows[0].spans[1]));
    QCOMPARE(QColor(img.pixel(pointAt(v, 2.5 * kMs, 0, 1))), TimelineView::backgroundColor());
    // Microbatches differ in colour, and F, B and W of one microbatch differ too.
    const QColor f0 = TimelineView::spanColor(span(0, 1, SpanKind::Forward, 0));
    const QColor f1 = TimelineView::spanColor(span(0, 1, SpanKind::Forward, 1));
    const QColor w0 = TimelineView::spanColor(span(0, 1, SpanKind::BackwardWeight, 0));
    QVERIFY(f0 != f1 && w0 != f0 && w0 != TimelineView::spanColor(span(0, 1, SpanKind::Backward, 0)));
  }

  // Narrow spans merged into columns: a column covered by many spans of one colour has that colour; a long
  // span starting before the visible range still shows.
  void renderMergedColumnsAndLongSpans() {
    auto d = std::make_shared<TimelineData>();
    d->rows.resize(1);
    d->rows[0].label = "rank 0";
    // 100000 back-to-back F spans of 10 ns (1 ms in all), plus a gradient sync over the whole of it and
    // short sends every 100 us on the communication lane.
    for (int i = 0; i < 100000; ++i)
      d->rows[0].spans.push_back(span(i * 1e-8, (i + 1) * 1e-8, SpanKind::Forward, 2));
    d->rows[0].spans.insert(d->rows[0].spans.begin(), span(0, 1 * kMs, SpanKind::GradSync, -1));
    for (int k = 0; k < 10; ++k)
      d->rows[0].spans.push_back(span(k * 1e-4, k * 1e-4 + 1e-6, SpanKind::Send, k));
    std::stable_sort(d->rows[0].spans.begin(), d->rows[0].spans.end(),
                     [](const TimelineSpan& a, const TimelineSpan& b) { return a.start < b.start; });
    d->updateExtent();
    TimelineView v;
    v.resize(1000, 120);
    v.setData(d);
    QImage img = v.render(v.size());
    const QColor fColour = TimelineView::spanColor(span(0, 1, SpanKind::Forward, 2));
    const QColor c(img.pixel(pointAt(v, 0.55 * kMs, 0, 0)));
    QVERIFY2(std::abs(c.red() - fColour.red()) <= 1 && std::abs(c.green() - fColour.green()) <= 1 &&
                 std::abs(c.blue() - fColour.blue()) <= 1,
             qPrintable(c.name() + " vs " + fColour.name()));
    // Zoomed between two sends, well after the sync started: the sync is drawn and hit.
    v.setViewRange(0.555 * kMs, 0.5551 * kMs);
    img = v.render(v.size());
    const QPoint sync = pointAt(v, 0.55505 * kMs, 0, 1);
    QCOMPARE(QColor(img.pixel(sync)), TimelineView::spanColor(span(0, 1, SpanKind::GradSync, -1)));
    auto hit = v.spanAt(sync);
    QVERIFY(hit && hit->span.kind == SpanKind::GradSync);
    // Each 10 ns F is now 75 px wide, drawn as its own rectangle and hit one by one.
    hit = v.spanAt(pointAt(v, 0.555 * kMs + 5e-9, 0, 0));
    QVERIFY(hit);
    QCOMPARE(hit->span.start, 55500 * 1e-8);
  }

  void emptyAndNullData() {
    TimelineView v;
    v.resize(600, 200);
    QVERIFY(!v.spanAt({300, 40}));
    QImage img = v.render(v.size());
    QCOMPARE(img.size(), QSize(600, 200));
    v.setData(std::make_shared<TimelineData>());
    QVERIFY(!v.spanAt({300, 40}));
    img = v.render(QSize(0, 0));  // never a crash, even with no room to draw
    QCOMPARE(img.size(), QSize(1, 1));
    v.setData(nullptr);
    QCOMPARE(v.rowLayout().rowCount(), 0);
    QCOMPARE(v.rowHeaderText(3), QString());
  }

  void simulatedPlan() {
    const auto snap = fortunesPp2();
    QVERIFY2(snap->ok(), qPrintable(snap->error));
    TimelineView v;
    v.setTitle("predicted");
    v.resize(1200, 160);
    v.setData(std::make_shared<TimelineData>(snap->timeline));
    QCOMPARE(v.rowLayout().rowCount(), 2);
    QCOMPARE(v.data()->rows.size(), std::size_t(2));
    QCOMPARE(snap->sim.bubbleFraction.size(), std::size_t(2));
    for (int r = 0; r < 2; ++r) {
      QCOMPARE(v.data()->rows[r].bubbleFraction, snap->sim.bubbleFraction[r]);
      const QString expected = QString("bubble %1%").arg(qRound(100 * snap->sim.bubbleFraction[r]));
      QVERIFY2(v.rowHeaderText(r).contains(expected), qPrintable(v.rowHeaderText(r) + " / " + expected));
    }
    QVERIFY(snap->sim.bubbleFraction[0] > 0);  // pp=2 with 4 microbatches has a bubble
    QVERIFY(v.timeAxis().t0() <= snap->timeline.begin && v.timeAxis().t1() >= snap->timeline.end);
    // Every F and B of stage 1 is hit at its centre and drawn in its colour.
    const QImage img = v.render(v.size());
    int checked = 0;
    for (std::size_t i = 0; i < v.data()->rows[1].spans.size(); ++i) {
      const TimelineSpan& s = v.data()->rows[1].spans[i];
      if (s.kind != SpanKind::Forward && s.kind != SpanKind::Backward) continue;
      const QPoint at = pointAt(v, 0.5 * (s.start + s.end), 1, 0);
      const auto hit = v.spanAt(at);
      QVERIFY(hit);
      QCOMPARE(hit->index, i);
      if (v.timeAxis().x(s.end) - v.timeAxis().x(s.start) >= 8)
        QCOMPARE(QColor(img.pixel(at)), TimelineView::spanColor(s));
      ++checked;
    }
    QCOMPARE(checked, 8);  // 4 microbatches, F and B each
  }

  // Offload's PCIe transfers (simulator.h SimHostTransfer) are spans of their own on the communication lane
  // of the predicted timeline: GPT-3 175B with the optimizer offloaded moves each rank's gradients down at
  // the start of its optimizer step and the bf16 parameters up at its end; both are drawn in their colours
  // and hit, and the Chrome trace carries them.
  void simulatedOffloadTransfers() {
    ms::RunConfig config = exampleConfig("gpt3-175b-plan.json");
    config.parallel.precision = ms::Precision::Bf16;
    config.parallel.offload = ms::Offload::Optimizer;
    if (config.parallel.zero < 1) config.parallel.zero = 1;
    const auto snap = ms::analyzePlan(config);
    QVERIFY2(snap->ok(), qPrintable(snap->error));
    const auto& transfers = snap->sim.hostTransfersByRank.at(0);
    QCOMPARE(transfers.size(), std::size_t(2));
    const ms::TimelineRow& row = snap->timeline.rows.at(0);
    std::vector<const TimelineSpan*> host;
    const TimelineSpan* step = nullptr;
    for (const TimelineSpan& sp : row.spans) {
      if (sp.kind == SpanKind::HostToDevice || sp.kind == SpanKind::DeviceToHost) host.push_back(&sp);
      if (sp.kind == SpanKind::Optimizer) step = &sp;
    }
    QVERIFY(step);
    QCOMPARE(host.size(), std::size_t(2));
    QCOMPARE(host[0]->kind, SpanKind::DeviceToHost);
    QCOMPARE(host[0]->start, step->start);
    QCOMPARE(host[1]->kind, SpanKind::HostToDevice);
    QCOMPARE(host[1]->end, step->end);
    QCOMPARE(ms::laneOf(SpanKind::DeviceToHost), 1);
    QCOMPARE(ms::laneOf(SpanKind::HostToDevice), 1);
    QVERIFY(TimelineView::spanColor(*host[0]) != TimelineView::spanColor(*host[1]));

    TimelineView v;
    v.resize(1200, 200);
    v.setData(std::make_shared<TimelineData>(snap->timeline));
    for (const TimelineSpan* h : host) {
      v.setViewRange(h->start, h->end);
      const QImage img = v.render(v.size());
      const QPoint at = pointAt(v, 0.5 * (h->start + h->end), 0, 1);
      QCOMPARE(QColor(img.pixel(at)), TimelineView::spanColor(*h));
      const auto hit = v.spanAt(at);
      QVERIFY(hit && hit->span.kind == h->kind);
      QVERIFY(v.toolTipText(*hit).contains(h->kind == SpanKind::DeviceToHost ? "device to host"
                                                                             : "host to device"));
    }
  }

  // overlap_param_gather's all-gathers (simulator.h SimParamGather) are spans of their own on the
  // communication lane, from the step's start, before the forward that waits for them; drawn, hit and named.
  void simulatedParamGather() {
    ms::RunConfig config = exampleConfig("gpt3-175b-plan.json");
    config.parallel.precision = ms::Precision::Bf16;
    if (config.parallel.zero != 1 && config.parallel.zero != 2) config.parallel.zero = 1;
    config.parallel.overlapParamGather = true;
    const auto snap = ms::analyzePlan(config);
    QVERIFY2(snap->ok(), qPrintable(snap->error));
    const ms::TimelineRow& row = snap->timeline.rows.at(0);
    const TimelineSpan* gather = nullptr;
    const TimelineSpan* forward = nullptr;
    for (const TimelineSpan& sp : row.spans) {
      if (sp.kind == SpanKind::ParamGather && !gather) gather = &sp;
      if (sp.kind == SpanKind::Forward && !forward) forward = &sp;
    }
    QVERIFY(gather && forward);
    QCOMPARE(gather->start, 0.0);
    QVERIFY(gather->end > gather->start);
    QVERIFY(forward->start > 0.0 && forward->start <= gather->end);  // waits for the first layer's part
    QCOMPARE(ms::laneOf(SpanKind::ParamGather), 1);
    TimelineView v;
    v.resize(1200, 200);
    v.setData(std::make_shared<TimelineData>(snap->timeline));
    v.setViewRange(gather->start, gather->end);
    const QImage img = v.render(v.size());
    const QPoint at = pointAt(v, 0.5 * (gather->start + gather->end), 0, 1);
    QCOMPARE(QColor(img.pixel(at)), TimelineView::spanColor(*gather));
    const auto hit = v.spanAt(at);
    QVERIFY(hit && hit->span.kind == SpanKind::ParamGather);
    QVERIFY(v.toolTipText(*hit).contains("parameter all-gather"));
  }

  // ---- MemoryView ----
  void memoryFits() {
    const auto snap = fortunesPp2();
    QVERIFY2(snap->ok(), qPrintable(snap->error));
    ms::MemoryView m;
    m.resize(800, 400);
    m.setPredicted(snap->memory);
    QCOMPARE(m.barCount(), 2);
    QVERIFY(!m.grouped());
    for (int r = 0; r < 2; ++r) {
      QVERIFY(snap->memory[r].fits());
      QVERIFY(!m.rankShownAsOverflow(r));
      const double u = m.unitBytes();
      QCOMPARE(m.bars(ms::MemoryView::Parameters)->data()->at(r)->value, snap->memory[r].parameters / u);
      QCOMPARE(m.bars(ms::MemoryView::Gradients)->data()->at(r)->value, snap->memory[r].gradients / u);
      QCOMPARE(m.bars(ms::MemoryView::Optimizer)->data()->at(r)->value, snap->memory[r].optimizer / u);
      QCOMPARE(m.bars(ms::MemoryView::Activations)->data()->at(r)->value, snap->memory[r].activations / u);
      QCOMPARE(m.bars(ms::MemoryView::Other)->data()->at(r)->value, snap->memory[r].other / u);
      QCOMPARE(m.bars(ms::MemoryView::Parameters)->data()->at(r)->key, double(r));
    }
    // Stacked in category order.
    QCOMPARE(m.bars(ms::MemoryView::Gradients)->barBelow(), m.bars(ms::MemoryView::Parameters));
    QCOMPARE(m.bars(ms::MemoryView::Other)->barBelow(), m.bars(ms::MemoryView::Activations));
    QCOMPARE(m.unitName(), QString("MiB"));  // a 0.8M-parameter model
    QVERIFY(m.barToolTip(1).contains("stage 1"));
    QCOMPARE(m.barLabel(0), QString("rank 0"));
    // The model states' arithmetic (plan/model_state.h), here for bf16 with fp32 gradients, dp 64, ZeRO-1.
    ms::ParallelConfig mixed;
    mixed.precision = ms::Precision::Bf16;
    mixed.dp = 64;
    mixed.zero = 1;
    m.setModelStates(ms::modelStateText(mixed, ms::OptimizerConfig{}));
    const QString tip = m.barToolTip(0);
    QVERIFY2(tip.contains("parameters: ") && tip.contains("(2 B bf16 working parameters per parameter)"),
             qPrintable(tip));
    QVERIFY2(tip.contains("(4 B fp32 gradients per parameter)"), qPrintable(tip));
    QVERIFY2(tip.contains("12 B fp32 master + AdamW moments / 64 ranks (ZeRO-1) = 0.1875 B per parameter"),
             qPrintable(tip));
    QCOMPARE(m.rankShownAsOverflow(7), false);  // out of range: not a crash

    // Measured peaks beside the bars; a wrong count is refused with a message; empty clears.
    QVERIFY(m.setMeasured({100.0 * 1024 * 1024, 50.0 * 1024 * 1024}));
    QCOMPARE(m.measuredBars()->data()->size(), 2);
    QCOMPARE(m.measuredBars()->data()->at(0)->value, 100.0 * 1024 * 1024 / m.unitBytes());
    QVERIFY(std::abs(m.measuredBars()->data()->at(1)->key - 1.42) < 1e-9);
    QVERIFY(!m.setMeasured({1.0, 2.0, 3.0}));
    QVERIFY(m.message().contains("3 ranks"));
    QCOMPARE(m.measuredBars()->data()->size(), 0);
    QVERIFY(m.setMeasured({}));
    QCOMPARE(m.measuredBars()->data()->size(), 0);

    // Stage 1 on a device with too little memory: that rank (only) is drawn red, its capacity marked.
    const auto tiny = fortunesPp2Tiny();
    QVERIFY2(tiny->ok(), qPrintable(tiny->error));
    QVERIFY(tiny->memory[0].fits());
    QVERIFY(!tiny->memory[1].fits());
    m.setPredicted(tiny->memory);
    QVERIFY(!m.rankShownAsOverflow(0));
    QVERIFY(m.rankShownAsOverflow(1));
    QVERIFY2(m.message().contains("1 of 2 ranks do not fit"), qPrintable(m.message()));
    QVERIFY(m.barToolTip(1).contains("does not fit"));
    QVERIFY(!m.barToolTip(0).contains("does not fit"));
    QCOMPARE(m.capacityGraph()->data()->at(3)->value, tiny->memory[1].capacity / m.unitBytes());
    // Categories that do not all peak at once (memory_model.h notAtOnce): the tooltip's total is the peak of
    // their sum and says how far below the stack it is; the scale still holds the whole stack.
    {
      std::vector<ms::MemoryBreakdown> apart = tiny->memory;
      apart[0].notAtOnce = 0.25 * apart[0].activations;
      m.setPredicted(apart);
      const QString tip0 = m.barToolTip(0);
      QVERIFY2(tip0.contains(QString("total %1 of").arg(ms::formatBytes(apart[0].total()))),
               qPrintable(tip0));
      QVERIFY2(
          tip0.contains(QString("%1 below the categories' sum").arg(ms::formatBytes(apart[0].notAtOnce))),
          qPrintable(tip0));
      QVERIFY(!m.barToolTip(1).contains("below the categories' sum"));
      QVERIFY(m.plot()->yAxis->range().upper * m.unitBytes() >= apart[0].categorySum());
      m.setPredicted(tiny->memory);
    }
    // Routed experts (memory_model.h Routing::Uneven): the tooltip adds the bound under the most uneven
    // routing.
    {
      std::vector<ms::MemoryBreakdown> routed = tiny->memory;
      routed[0].unevenRoutingTotal = 1.5 * routed[0].total();
      m.setPredicted(routed);
      const QString tip0 = m.barToolTip(0);
      QVERIFY2(tip0.contains(QString("up to %1 were routing as uneven as it can be")
                                 .arg(ms::formatBytes(routed[0].unevenRoutingTotal))),
               qPrintable(tip0));
      QVERIFY(!m.barToolTip(1).contains("routing"));
      m.setPredicted(tiny->memory);
    }
    QCOMPARE(m.bars(ms::MemoryView::Activations)->data()->at(1)->value,
             tiny->memory[1].activations / m.unitBytes());

    QTemporaryDir dir;
    QVERIFY(m.savePng(dir.filePath("memory.png"), 640, 360));
    QCOMPARE(QImage(dir.filePath("memory.png")).size(), QSize(640, 360));
    QVERIFY(m.savePdf(dir.filePath("memory.pdf")));
    QVERIFY(QFileInfo(dir.filePath("memory.pdf")).size() > 1000);
    QVERIFY(!m.savePng("/nonexistent-dir/memory.png"));

    m.setPredicted({});
    QCOMPARE(m.barCount(), 0);
    QVERIFY(m.message().contains("No plan"));
    QCOMPARE(m.bars(ms::MemoryView::Parameters)->data()->size(), 0);
  }

  // Offload: the device stacks lose the optimizer state, a hatched host bar left of each stack shows what the
  // host keeps (the plan's HostBytes), and the tooltip breaks it down with its bytes per parameter.
  void memoryHostBarsUnderOffload() {
    ms::RunConfig config = exampleConfig("gpt3-175b-plan.json");
    config.parallel.precision = ms::Precision::Bf16;
    config.parallel.offload = ms::Offload::Optimizer;
    if (config.parallel.zero < 1) config.parallel.zero = 1;
    const auto snap = ms::analyzePlan(config);
    QVERIFY2(snap->ok(), qPrintable(snap->error));
    ms::MemoryView m;
    m.resize(800, 400);
    m.setPredicted(snap->memory);
    m.setModelStates(ms::modelStateText(config.parallel, config.optimizer));
    QVERIFY(m.grouped());
    QCOMPARE(m.hostBars()->data()->size(), m.barCount());
    const int r0 = 0;
    const int bar = m.barOfRank(r0);
    double host = 0;  // the bar's figure: its stage's largest host figures
    for (const auto& r : snap->memory)
      if (r.stage == snap->memory[r0].stage) host = std::max(host, r.host.total());
    QVERIFY(host > 0);
    QCOMPARE(snap->memory[r0].optimizer, 0.0);
    QCOMPARE(m.hostBars()->data()->at(bar)->value, host / m.unitBytes());
    QVERIFY(std::abs(m.hostBars()->data()->at(bar)->key - (bar - 0.42)) < 1e-9);
    const QString tip = m.barToolTip(bar);
    QVERIFY2(tip.contains("host memory (offload): ") &&
                 tip.contains("host: 0.75 B optimizer state + 0.25 B gradients"),
             qPrintable(tip));
    QVERIFY2(tip.contains("(on the host)"), qPrintable(tip));
    // Without offload: no host bars, not in the legend.
    config.parallel.offload = ms::Offload::None;
    const auto plain = ms::analyzePlan(config);
    QVERIFY2(plain->ok(), qPrintable(plain->error));
    m.setPredicted(plain->memory);
    QCOMPARE(m.hostBars()->data()->size(), 0);
    QVERIFY(!m.plot()->legend->hasItemWithPlottable(m.hostBars()));
  }

  void memoryDoesNotFitGrouped() {
    ms::RunConfig config = exampleConfig("gpt3-175b-plan.json");
    config.parallel.dp = 1024;
    config.parallel.tp = 1;
    config.parallel.pp = 1;
    config.parallel.schedule = ms::Schedule::OneFOneB;
    config.parallel.virtualChunks = 1;
    config.parallel.microbatches = 1;
    config.parallel.zero = 0;
    config.training.batchSize = 1024;
    const auto snap = ms::analyzePlan(config);
    QVERIFY2(snap->ok(), qPrintable(snap->error));
    QCOMPARE(snap->memory.size(), std::size_t(1024));
    QVERIFY(!snap->memory[0].fits());  // 175B parameters with AdamW state on one 80 GB device
    ms::MemoryView m;
    m.resize(800, 400);
    m.setPredicted(snap->memory);
    QVERIFY(m.grouped());
    QCOMPARE(m.barCount(), 1);
    QCOMPARE(m.barLabel(0), QString("stage 0 (1024 ranks)"));
    for (int r : {0, 1, 511, 1023}) QVERIFY(m.rankShownAsOverflow(r));
    // About 2.9 TiB on one rank (175B parameters at 18 bytes each): the binary unit that keeps the value
    // >= 1.
    QCOMPARE(m.unitName(), QString("TiB"));
    const double u = m.unitBytes();
    QCOMPARE(u, 1024.0 * 1024.0 * 1024.0 * 1024.0);
    QCOMPARE(m.bars(ms::MemoryView::Parameters)->data()->at(0)->value, snap->memory[0].parameters / u);
    QCOMPARE(m.bars(ms::MemoryView::Optimizer)->data()->at(0)->value, snap->memory[0].optimizer / u);
    QCOMPARE(m.bars(ms::MemoryView::Activations)->data()->at(0)->value, snap->memory[0].activations / u);
    QVERIFY2(m.message().contains("1024 of 1024 ranks do not fit"), qPrintable(m.message()));
    // The note goes on a line of its own under the title, so a narrow view (the Run dashboard's tab) shows
    // both whole: neither line is wider than the plot.
    m.resize(480, 300);
    m.setPredicted(snap->memory);
    auto* title = qobject_cast<QCPTextElement*>(m.plot()->plotLayout()->element(0, 0));
    QVERIFY(title);
    const QStringList lines = title->text().split('\n');
    QCOMPARE(lines.size(), 2);
    QCOMPARE(lines[1], m.message());
    const QFontMetrics metrics(title->font());
    for (const QString& line : lines)
      QVERIFY2(metrics.horizontalAdvance(line) <= m.width(), qPrintable(line));
  }

  // A grouped view of a plan that fits: gpt3-175b as shipped (dp 16, tp 8, pp 8: 1024 ranks).
  void memoryGroupedFits() {
    const auto snap = ms::analyzePlan(exampleConfig("gpt3-175b-plan.json"));
    QVERIFY2(snap->ok(), qPrintable(snap->error));
    ms::MemoryView m;
    m.setPredicted(snap->memory);
    QCOMPARE(m.barCount(), 8);
    for (int s = 0; s < 8; ++s) QCOMPARE(m.barLabel(s), QString("stage %1 (128 ranks)").arg(s));
    bool anyOverflow = false;
    for (std::size_t r = 0; r < snap->memory.size(); ++r) {
      anyOverflow |= !snap->memory[r].fits();
      QCOMPARE(m.rankShownAsOverflow(int(r)), m.rankShownAsOverflow(snap->memory[r].stage * 128));
    }
    QCOMPARE(m.rankShownAsOverflow(0), anyOverflow);
    // The bar of stage 3 shows the largest activations of its ranks.
    double act = 0;
    for (const auto& mb : snap->memory)
      if (mb.stage == 3) act = std::max(act, mb.activations);
    QCOMPARE(m.bars(ms::MemoryView::Activations)->data()->at(3)->value, act / m.unitBytes());
  }

  // ---- Chrome trace ----
  void chromeTrace() {
    const auto d = handBuilt();
    const QByteArray bytes = ms::chromeTraceJson(*d, "hand \"built\"");
    const auto doc = nlohmann::json::parse(bytes.toStdString());
    QCOMPARE(QString::fromStdString(doc["otherData"]["name"].get<std::string>()), QString("hand \"built\""));
    std::vector<nlohmann::json> xs;
    int processNames = 0, threadNames = 0;
    for (const auto& e : doc["traceEvents"]) {
      if (e["ph"] == "X") xs.push_back(e);
      if (e["ph"] == "M" && e["name"] == "process_name") {
        ++processNames;
        if (e["pid"] == 1) QCOMPARE(e["args"]["name"].get<std::string>(), std::string("rank 1 (stage 1)"));
      }
      if (e["ph"] == "M" && e["name"] == "thread_name") {
        ++threadNames;
        QCOMPARE(e["args"]["name"].get<std::string>(),
                 std::string(e["tid"] == 0 ? "compute" : "communication"));
      }
    }
    QCOMPARE(processNames, 2);
    QCOMPARE(threadNames, 4);
    QCOMPARE(xs.size(), d->spanCount());
    std::size_t k = 0;
    for (const auto& row : d->rows)
      for (const auto& s : row.spans) {
        const auto& e = xs[k++];
        QCOMPARE(e["pid"].get<int>(), row.rank);
        QCOMPARE(e["tid"].get<int>(), ms::laneOf(s.kind));
        QVERIFY(std::abs(e["ts"].get<double>() - s.start * 1e6) < 1e-6);
        QVERIFY(std::abs(e["dur"].get<double>() - (s.end - s.start) * 1e6) < 1e-6);
      }
    QCOMPARE(xs[0]["name"].get<std::string>(), std::string("F mb0 block.0"));
    QCOMPARE(xs[0]["args"]["layer"].get<std::string>(), std::string("block.0"));
    QCOMPARE(xs[1]["name"].get<std::string>(), std::string("send mb0"));
    QVERIFY(xs[1]["args"]["layer"].is_null());
    TimelineSpan chunked = span(0, 1, SpanKind::Backward, 3, 1, 99);
    QCOMPARE(ms::chromeTraceEventName(chunked, d->layerNames, true), QString("B mb3 c1 layer 99"));
    QCOMPARE(ms::chromeTraceEventName(chunked, d->layerNames), QString("B mb3 layer 99"));

    // A simulated plan: one X event per span, durations in microseconds.
    const auto snap = fortunesPp2();
    QVERIFY(snap->ok());
    const auto sim = nlohmann::json::parse(ms::chromeTraceJson(snap->timeline, "fortunes").toStdString());
    std::size_t xCount = 0;
    double maxEnd = 0;
    for (const auto& e : sim["traceEvents"])
      if (e["ph"] == "X") ++xCount, maxEnd = std::max(maxEnd, e["ts"].get<double>() + e["dur"].get<double>());
    QCOMPARE(xCount, snap->timeline.spanCount());
    QVERIFY(std::abs(maxEnd - snap->timeline.end * 1e6) < 1e-3);

    // Interleaved: a stage runs two model chunks, so names tell them apart; 1F1B above has one per stage.
    QVERIFY(sim.dump().find(" c1") == std::string::npos);
    ms::RunConfig config = exampleConfig("gpt-fortunes.json");
    config.parallel.pp = 2;
    config.parallel.microbatches = 4;
    config.parallel.schedule = ms::Schedule::Interleaved1F1B;
    config.parallel.virtualChunks = 2;
    config.mesh.nodes[0].count = 2;
    const auto interleaved = ms::analyzePlan(config);
    QVERIFY2(interleaved->ok(), qPrintable(interleaved->error));
    const auto inter = nlohmann::json::parse(ms::chromeTraceJson(interleaved->timeline, "i").toStdString());
    int stage1Chunk3 = 0;
    for (const auto& e : inter["traceEvents"])
      if (e["ph"] == "X" && e["name"] == "F mb0 c3") stage1Chunk3 += e["pid"].get<int>() == 1 ? 1 : 100;
    QCOMPARE(stage1Chunk3, 1);  // chunk k runs on stage k % P

    QTemporaryDir dir;
    QString error;
    QVERIFY(ms::saveChromeTrace(*d, "t", dir.filePath("trace.json"), &error));
    QVERIFY(!ms::saveChromeTrace(*d, "t", "/nonexistent-dir/trace.json", &error));
    QVERIFY(error.contains("/nonexistent-dir/trace.json"));
  }
};

QTEST_MAIN(TestUiTimeline)
#include "tst_ui_timeline.moc"
