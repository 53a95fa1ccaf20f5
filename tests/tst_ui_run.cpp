// The studio's run path under QT_QPA_PLATFORM=offscreen: the metrics reader on split, malformed, mutated,
// over-long and truncated streams; RunData's timeline, bubbles, bounds and series decimation; RunView
// following its source; a real run of the engine (a 2-stage pipeline on 2 cpu ranks) through EngineClient
// into RunView, replayed from its folder; an engine script that dies, a real rank killed, a missing engine,
// runs stopped by the studio (cleanly, before the ranks start, and an engine that ignores the first stop), a
// client destroyed mid-run, and a flood of 1,000,000 metrics lines from a separate process (back-pressure,
// bounded memory, a window that keeps ticking).
#include <QtTest>
#include <map>
#include <set>

#include <qcustomplot.h>

#include <QElapsedTimer>
#include <QFile>
#include <QJsonDocument>
#include <QJsonObject>
#include <QSignalSpy>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QTimer>
#include <algorithm>
#include <cmath>
#include <csignal>

#include <sys/resource.h>

// Raw strings with an odd number of quotes confuse moc 6.4 (it loses the class), so those few are escaped.

#include "plan/run_config.h"
#include "ui/run/calibration.h"
#include "ui/run/engine_client.h"
#include "ui/run/metrics_reader.h"
#include "ui/run/run_data.h"
#include "ui/views/compare_view.h"
#include "ui/views/ps_panel.h"
#include "ui/views/run_view.h"

using namespace ms;

namespace {

const char* const kStep1 =
    R"({"v":1,"type":"step","step":1,"loss":5.5,"lr":0.0003,"grad_norm":1.8,"step_time_s":0.01,)"
    R"("samples_per_s":400,"tokens_per_s":12800})";
const char* const kStep2 =
    R"({"v":1,"type":"step","step":2,"loss":5.25,"lr":0.0002,"grad_norm":1.7,"step_time_s":0.02,)"
    R"("samples_per_s":200,"tokens_per_s":6400})";
const char* const kRunEnd = R"({"v":1,"type":"run_end","status":"ok","reason":"","step":2})";

template <typename T>
std::vector<T> only(const std::vector<MetricsEvent>& events) {
  std::vector<T> out;
  for (const MetricsEvent& e : events)
    if (const T* t = std::get_if<T>(&e)) out.push_back(*t);
  return out;
}

// The tiny plan of the issue: gpt, 2 layers, width 32, 2 heads, on 2 cpu ranks as a 2-stage pipeline. The
// data path is relative to baseDir on purpose: the client must make it absolute for the run folder's copy.
RunConfig tinyConfig(int steps) {
  const nlohmann::json doc = {
      {"name", "tiny"},
      {"device", "cpu"},
      {"model",
       {{"type", "gpt"}, {"layers", 2}, {"width", 32}, {"heads", 2}, {"vocab", 256}, {"context", 32}}},
      {"data", {{"kind", "text"}, {"files", {"fortunes/*.u8"}}}},
      {"mesh", {{"nodes", {{{"name", "node0"}, {"device", "cpu"}, {"count", 2}}}}}},
      {"parallel", {{"pp", 2}, {"microbatches", 2}}},
      {"training", {{"steps", steps}, {"batch_size", 4}, {"seq_len", 32}, {"eval_batches", 2}}}};
  auto config = parseRunConfig(doc);
  if (!config) qFatal("tiny config: %s", config.message().c_str());
  RunConfig c = *config;
  c.baseDir = "/usr/share/games";
  return c;
}

// Processes whose command line mentions text (the run folder is unique to a test, so this finds its ranks).
int processesMentioning(const QString& text) {
  int n = 0;
  const QDir proc(QStringLiteral("/proc"));
  for (const QString& pid : proc.entryList(QDir::Dirs)) {
    bool numeric = false;
    pid.toInt(&numeric);
    if (!numeric || pid.toLongLong() == QCoreApplication::applicationPid()) continue;
    QFile f(QStringLiteral("/proc/%1/cmdline").arg(pid));
    if (!f.open(QIODevice::ReadOnly)) continue;
    QByteArray cmd = f.readAll();
    cmd.replace('\0', ' ');
    if (cmd.contains(text.toUtf8())) ++n;
  }
  return n;
}

}  // namespace

class TestUiRun : public QObject {
  Q_OBJECT
 private slots:
  void readerByteByByte() {
    const QByteArray stream = QByteArray(kStep1) + "\n" + kStep2 + "\r\n" + kRunEnd + "\n";
    MetricsReader reader;
    std::vector<MetricsEvent> events;
    for (char c : stream) {
      std::vector<MetricsEvent> got = reader.feed(QByteArrayView(&c, 1));
      // A line's event comes with the byte that ends it, never before.
      if (c != '\n') QCOMPARE(got.size(), std::size_t(0));
      for (auto& e : got) events.push_back(std::move(e));
    }
    QVERIFY(reader.finish().empty());
    QCOMPARE(events.size(), std::size_t(3));
    const auto steps = only<StepEvent>(events);
    QCOMPARE(steps.size(), std::size_t(2));
    QCOMPARE(steps[0].step, std::int64_t(1));
    QCOMPARE(steps[0].loss, 5.5);
    QCOMPARE(steps[1].tokensPerS, 6400.0);
    QCOMPARE(steps[1].gradNorm, 1.7);
    QVERIFY(std::isnan(steps[1].accuracy));
    QCOMPARE(only<RunEndEvent>(events).at(0).status, QString("ok"));
    QCOMPARE(reader.linesRead(), std::int64_t(3));
    QCOMPARE(reader.bytesRead(), std::int64_t(stream.size()));
  }

  void readerSeveralLinesInOneChunk() {
    const QByteArray spans =
        R"({"v":1,"type":"spans","step":3,"ranks":[{"rank":1,"spans":[{"action":"F","layer":"head","mb":0,)"
        R"("chunk":1,"start":0.5,"end":0.75}]},{"rank":0,"spans":[]}]})";
    const QByteArray memory =
        R"({"v":1,"type":"memory","step":3,"ranks":[{"rank":0,"current":{"parameters":10,"total":30},)"
        R"("peak":{"parameters":10,"activations":64,"total":90}}]})";
    MetricsReader reader;
    // Two lines and the start of a third in one piece, the rest in another.
    auto events = reader.feed(QByteArray(kStep1) + "\n" + spans + "\n" + memory.left(20));
    QCOMPARE(events.size(), std::size_t(2));
    QCOMPARE(reader.pendingBytes(), std::size_t(20));
    const auto s = std::get<SpansEvent>(events[1]);
    QCOMPARE(s.step, std::int64_t(3));
    QCOMPARE(s.ranks.size(), std::size_t(2));
    QCOMPARE(s.ranks[0].rank, 1);
    QCOMPARE(s.ranks[0].spans.at(0).action, 'F');
    QCOMPARE(s.ranks[0].spans.at(0).layer, std::string("head"));
    QCOMPARE(s.ranks[0].spans.at(0).chunk, std::int16_t(1));
    QCOMPARE(s.ranks[0].spans.at(0).end, 0.75);
    events = reader.feed(memory.mid(20) + "\n");
    QCOMPARE(events.size(), std::size_t(1));
    const auto m = std::get<MemoryEvent>(events[0]);
    QCOMPARE(m.ranks.at(0).peak.activations, 64.0);
    QCOMPARE(m.ranks.at(0).peak.total, 90.0);
    QCOMPARE(m.ranks.at(0).current.total, 30.0);
    QCOMPARE(m.ranks.at(0).peak.workspace, 0.0);  // absent categories are 0
  }

  void readerRejectsMalformedLine_data() {
    QTest::addColumn<QByteArray>("line");
    QTest::addColumn<QString>("reason");
    QTest::newRow("not json") << QByteArray("step 3: loss 5.2") << "not JSON";
    QTest::newRow("cut object") << QByteArray(R"({"v":1,"type":"step","step":)") << "not JSON";
    QTest::newRow("array") << QByteArray("[1,2,3]") << "not a JSON object (a array)";
    QTest::newRow("string") << QByteArray(R"("step")") << "not a JSON object (a string)";
    QTest::newRow("no type") << QByteArray(R"({"v":1,"step":3})") << R"(missing "type")";
    QTest::newRow("no v") << QByteArray(R"({"type":"step","step":3,"loss":1})") << R"(missing "v")";
    QTest::newRow("type not string") << QByteArray(R"({"v":1,"type":7})") << R"("type": expected a string)";
    QTest::newRow("step as string") << QByteArray(R"({"v":1,"type":"step","step":"3","loss":1})")
                                    << R"("step": expected an integer, got string "3")";
    QTest::newRow("loss missing") << QByteArray(R"({"v":1,"type":"step","step":3})") << R"(missing "loss")";
    QTest::newRow("loss null") << QByteArray(R"({"v":1,"type":"step","step":3,"loss":null})")
                               << R"("loss": expected a number, got null)";
    QTest::newRow("negative step") << QByteArray(R"({"v":1,"type":"step","step":-1,"loss":1})")
                                   << R"("step": out of range)";
    QTest::newRow("span start string")
        << QByteArray(
               R"({"v":1,"type":"spans","step":1,"ranks":[{"rank":0,"spans":[{"action":"F","start":"0",)"
               R"("end":1}]}]})")
        << R"("ranks[0].spans[0].start": expected a number)";
    QTest::newRow("span action word")
        << QByteArray(
               R"({"v":1,"type":"spans","step":1,"ranks":[{"rank":0,"spans":[{"action":"FW","start":0,)"
               R"("end":1}]}]})")
        << R"("ranks[0].spans[0].action": expected one letter)";
    QTest::newRow("ranks not array") << QByteArray(R"({"v":1,"type":"memory","step":1,"ranks":{}})")
                                     << R"("ranks": expected an array, got object)";
    QTest::newRow("rank not object") << QByteArray(R"({"v":1,"type":"memory","step":1,"ranks":[3]})")
                                     << R"("ranks[0]": expected an object, got number)";
    QTest::newRow("run_end no status")
        << QByteArray(R"({"v":1,"type":"run_end","reason":""})") << R"(missing "status")";
    QTest::newRow("version zero") << QByteArray(R"({"v":0,"type":"step","step":1,"loss":1})")
                                  << R"("v": out of range)";
    QTest::newRow("ps negative count")
        << QByteArray(R"({"v":1,"type":"ps","step":1,"staleness_total":[3,-1]})")
        << R"("staleness_total": expected an array of counts, got number -1)";
    QTest::newRow("ps worker without index")
        << QByteArray(R"({"v":1,"type":"ps","step":1,"worker_states":[{"live":true}]})")
        << R"(missing "worker_states[0].worker")";
  }

  void readerRejectsMalformedLine() {
    QFETCH(QByteArray, line);
    QFETCH(QString, reason);
    MetricsReader reader;
    // The bad line is line 2, between two good ones that must both still be read.
    auto events = reader.feed(QByteArray(kStep1) + "\n" + line + "\n" + kStep2 + "\n");
    QCOMPARE(events.size(), std::size_t(3));
    QCOMPARE(std::get<StepEvent>(events[0]).step, std::int64_t(1));
    QCOMPARE(std::get<StepEvent>(events[2]).step, std::int64_t(2));
    const auto& error = std::get<MetricsError>(events[1]);
    QCOMPARE(error.line, std::int64_t(2));
    QVERIFY2(error.message.startsWith("line 2: " + reason), qPrintable(error.message));
    // The message quotes the line's start (80 characters at most).
    QVERIFY2(error.message.contains(": " + QString::fromUtf8(line.left(80))), qPrintable(error.message));
    QCOMPARE(reader.errorCount(), std::int64_t(1));
  }

  void readerQuotesOnlyEightyCharacters() {
    MetricsReader reader;
    const QByteArray junk = QByteArray(300, 'x');
    auto events = reader.feed(junk + "\n");
    const QString message = std::get<MetricsError>(events.at(0)).message;
    QVERIFY2(message.endsWith(QString(80, 'x') + QString::fromUtf8("…")), qPrintable(message));
    QVERIFY(!message.contains(QString(81, 'x')));
  }

  void readerReportsTruncatedLastLine() {
    MetricsReader reader;
    auto events = reader.feed(QByteArray(kStep1) + "\n" + "{\"v\":1,\"type\":\"st");
    QCOMPARE(events.size(), std::size_t(1));
    events = reader.finish();
    QCOMPARE(events.size(), std::size_t(1));
    const auto& error = std::get<MetricsError>(events[0]);
    QCOMPARE(error.line, std::int64_t(2));
    QVERIFY2(error.message.startsWith("line 2: truncated"), qPrintable(error.message));
    QVERIFY(error.message.contains("{\"v\":1,\"type\":\"st"));
    // A whole object without a final newline (a hand-written file) is read, not reported.
    MetricsReader second;
    QVERIFY(second.feed(QByteArray(kStep1) + "\n" + kStep2).size() == 1);
    events = second.finish();
    QCOMPARE(events.size(), std::size_t(1));
    QCOMPARE(std::get<StepEvent>(events[0]).step, std::int64_t(2));
  }

  void readerIgnoresUnknownAndWarnsOnceForNewerVersion() {
    MetricsReader reader;
    const QByteArray stream = QByteArray(R"({"v":1,"type":"gpu_temperature","celsius":61})") + "\n\n   \n" +
                              R"({"v":3,"type":"step","step":1,"loss":2.5,"new_field":[1,2]})" + "\n" +
                              R"({"v":3,"type":"step","step":2,"loss":2.25})" + "\n";
    auto events = reader.feed(stream);
    const auto logs = only<LogEvent>(events);
    QCOMPARE(logs.size(), std::size_t(1));
    QCOMPARE(logs[0].level, QString("warning"));
    QVERIFY2(logs[0].message.contains("version 3"), qPrintable(logs[0].message));
    QVERIFY2(logs[0].message.startsWith("line 4:"), qPrintable(logs[0].message));
    const auto steps = only<StepEvent>(events);
    QCOMPARE(steps.size(), std::size_t(2));
    QCOMPARE(steps[1].loss, 2.25);
    QCOMPARE(reader.errorCount(), std::int64_t(0));
  }

  void readerSkipsOverlongLine() {
    MetricsReader reader(64);  // lines of at most 64 bytes, for the test
    QByteArray longLine = "{\"v\":1,\"type\":\"log\",\"message\":\"" + QByteArray(100, 'y') + "\"}";
    std::vector<MetricsEvent> events;
    for (qsizetype at = 0; at < longLine.size(); at += 10)
      for (auto& e : reader.feed(longLine.mid(at, 10))) events.push_back(std::move(e));
    for (auto& e : reader.feed(QByteArray("\n") + kRunEnd + "\n")) events.push_back(std::move(e));
    QCOMPARE(events.size(), std::size_t(2));
    const auto& error = std::get<MetricsError>(events[0]);
    QCOMPARE(error.line, std::int64_t(1));
    QVERIFY2(error.message.contains("longer than 64 bytes"), qPrintable(error.message));
    QCOMPARE(std::get<RunEndEvent>(events[1]).status, QString("ok"));
    QCOMPARE(reader.linesRead(), std::int64_t(2));
    QVERIFY(reader.pendingBytes() == 0);

    // The same line arriving whole, newline included, in one piece is skipped alike (found by fuzz_metrics:
    // it used to be parsed, so the outcome depended on how the stream was cut).
    MetricsReader whole(64);
    const auto wholeEvents = whole.feed(longLine + "\n" + kRunEnd + "\n");
    QCOMPARE(wholeEvents.size(), std::size_t(2));
    const auto& wholeError = std::get<MetricsError>(wholeEvents[0]);
    QCOMPARE(wholeError.line, std::int64_t(1));
    QVERIFY2(wholeError.message.startsWith("line 1: line longer than 64 bytes, skipped: {\"v\":1"),
             qPrintable(wholeError.message));
    QCOMPARE(std::get<RunEndEvent>(wholeEvents[1]).status, QString("ok"));
    QCOMPARE(whole.linesRead(), std::int64_t(2));
  }

  void readerSurvivesMutatedLines() {
    // Every byte of real lines flipped, dropped or duplicated, deterministically: each line gives at most one
    // event (plus the one version warning), an error names line 1, and nothing throws.
    const QByteArray lines[] = {
        kStep1, kRunEnd,
        R"({"v":1,"type":"spans","step":3,"ranks":[{"rank":1,"spans":[{"action":"F","layer":"head","mb":0,)"
        R"("chunk":1,"start":0.5,"end":0.75}]}]})",
        R"({"v":1,"type":"memory","step":3,"ranks":[{"rank":0,"current":{"total":30},"peak":{"total":90}}]})"};
    const char replacements[] = {'"', '{', '}', '[', ']', ':', ',', '9', '-', 'e', '\\', '\0', '\xff', ' '};
    int errors = 0, events = 0;
    for (const QByteArray& line : lines)
      for (qsizetype at = 0; at < line.size(); ++at)
        for (int variant = 0; variant < 16; ++variant) {
          QByteArray m = line;
          if (variant < 14)
            m[at] = replacements[variant];
          else if (variant == 14)
            m.remove(at, 1);
          else
            m.insert(at, m.mid(at, 7));
          MetricsReader reader;
          std::vector<MetricsEvent> got = reader.feed(m + "\n");
          for (MetricsEvent& e : reader.finish()) got.push_back(std::move(e));
          QVERIFY(got.size() <= 2);
          for (const MetricsEvent& e : got) {
            if (const auto* err = std::get_if<MetricsError>(&e)) {
              QVERIFY2(err->message.startsWith("line 1: "), qPrintable(err->message));
              ++errors;
            } else if (!std::holds_alternative<LogEvent>(e)) {
              ++events;
            }
          }
        }
    // Both kinds happen (a digit changed still parses; a brace dropped does not).
    QVERIFY(errors > 1000);
    QVERIFY(events > 100);
  }

  // Calibration from a run's spans: per layer the median over steps (the first step left out) and ranks of
  // its F, B and W durations, divided by the microbatch size; a layer without spans is named in the error.
  void calibrationTakesMediansPerSample() {
    ms::RunConfig config;  // gpt, layers 4 by default: embedding, block.0 .. block.3, head
    config.model.layers = 1;
    config.parallel.microbatches = 2;
    config.training.batchSize = 8;  // microbatch of 4 samples
    // Step s (1..4) times: embedding F 0.4 s, block.0 F 0.8 + 0.04 * s (median over steps 2-4: 0.92),
    // block.0 B 1.2 and W 0.4, head F 0.2 and B 0.6; step 1 (left out) is 10x slower.
    auto spansLine = [](int step) {
      const double k = step == 1 ? 10 : 1;
      auto span = [&](const char* a, const char* layer, double start, double len) {
        return QString(R"({"action":"%1","mb":0,"chunk":0,"layer":"%2","start":%3,"end":%4})")
            .arg(a, layer)
            .arg(start)
            .arg(start + len * k);
      };
      const double f0 = 0.8 + 0.04 * step;
      return QString(R"({"v":1,"type":"spans","step":%1,"ranks":[{"rank":0,"spans":[%2,%3,%4,%5,%6,%7]}]})")
          .arg(step)
          .arg(span("F", "embedding", 0, 0.4), span("F", "block.0", 1, f0), span("F", "head", 3, 0.2),
               span("B", "head", 4, 0.6), span("B", "block.0", 5, 1.2), span("W", "block.0", 7, 0.4))
          .toUtf8();
    };
    MetricsReader reader;
    RunData data;
    QByteArray stream = R"({"v":1,"type":"run_start","name":"c","ranks":1,"steps":4,"layers":[)"
                        R"({"name":"embedding"},{"name":"block.0"},{"name":"head"}]})"
                        "\n";
    for (int step = 1; step <= 4; ++step) stream += spansLine(step) + "\n";
    auto events = reader.feed(stream);
    data.apply(events);
    // The embedding has no backward span here: refused, naming it.
    auto refused = calibrationFromRun(data, config, "run");
    QVERIFY(!refused);
    QVERIFY2(QString::fromStdString(refused.message()).contains("embedding"), refused.message().c_str());
    // With the embedding's B added to every step, the medians come out per sample.
    RunData full;
    MetricsReader again;
    QByteArray all = R"({"v":1,"type":"run_start","name":"c","ranks":1,"steps":4,"layers":[)"
                     R"({"name":"embedding"},{"name":"block.0"},{"name":"head"}]})"
                     "\n";
    for (int step = 1; step <= 4; ++step) {
      QByteArray line = spansLine(step);
      line.replace("]}]}", R"(,{"action":"B","mb":0,"chunk":0,"layer":"embedding","start":8,"end":8.2}]}]})");
      all += line + "\n";
    }
    auto moreEvents = again.feed(all);
    full.apply(moreEvents);
    auto c = calibrationFromRun(full, config, "run");
    QVERIFY2(c.isOk(), c.isOk() ? "" : c.message().c_str());
    QCOMPARE(c->source, QString("run"));
    QCOMPARE(c->perSample.forward.size(), std::size_t(3));
    QVERIFY(qAbs(c->perSample.forward[0] - 0.4 / 4) < 1e-9);
    QVERIFY(qAbs(c->perSample.forward[1] - 0.92 / 4) < 1e-9);
    QVERIFY(qAbs(c->perSample.backwardInput[1] - 1.2 / 4) < 1e-9);
    QVERIFY(qAbs(c->perSample.backwardWeight[1] - 0.4 / 4) < 1e-9);
    QVERIFY(qAbs(c->perSample.backwardInput[2] - 0.6 / 4) < 1e-9);
    QCOMPARE(c->perSample.backwardWeight[2], 0.0);  // no W: its B is the whole backward
    QVERIFY(qAbs(c->perSample.backwardInput[0] - 0.2 / 4) < 1e-9);
  }

  void runDataBuildsTimelineAndBubbles() {
    // Two stages, one microbatch: rank 0 runs F [10, 11] and B [13, 15]; rank 1 waits (r), then F [11, 12],
    // B [12, 13]. Pipeline window: first F start 10 to last B end 15 = 5 s.
    // Bubbles: rank 0 1 - 3/5 = 0.4; rank 1 1 - 2/5 = 0.6.
    const QByteArray line =
        R"({"v":1,"type":"spans","step":7,"ranks":[)"
        R"({"rank":1,"spans":[{"action":"r","mb":0,"chunk":0,"layer":"","start":10.0,"end":11.0},)"
        R"({"action":"F","mb":0,"chunk":1,"layer":"head","start":11.0,"end":12.0},)"
        R"({"action":"B","mb":0,"chunk":1,"layer":"head","start":12.0,"end":13.0}]},)"
        R"({"rank":0,"spans":[{"action":"B","mb":0,"chunk":0,"layer":"block.0","start":13.0,"end":15.0},)"
        R"({"action":"F","mb":0,"chunk":0,"layer":"block.0","start":10.0,"end":11.0},)"
        R"({"action":"O","mb":0,"chunk":-1,"layer":"","start":15.0,"end":15.5}]}]})";
    const QByteArray start =
        R"({"v":1,"type":"run_start","name":"t","ranks":2,"steps":9,"layers":[{"name":"embedding"},)"
        R"({"name":"block.0"},{"name":"head"}],"config":{"parallel":{"dp":1,"tp":1,"pp":2}},)"
        R"("predicted":{"step_time_s":2.5,"tokens_per_s":100,"ranks":[)"
        R"({"rank":1,"stage":1,"bubble_fraction":0.5,"memory_bytes":{"total":2048}},)"
        R"({"rank":0,"stage":0,"bubble_fraction":0.25,"memory_bytes":{"total":1024}}]}})";
    MetricsReader reader;
    RunData data;
    auto events = reader.feed(start + "\n" + line + "\n");
    QCOMPARE(events.size(), std::size_t(2));
    const auto before = data.revision();
    data.apply(events);
    QVERIFY(data.revision() > before);
    QVERIFY(data.info().known);
    QCOMPARE(data.info().predictedRanks.at(0).rank, 0);  // sorted
    QCOMPARE(data.info().predicted(1)->memory.total, 2048.0);
    QCOMPARE(data.state(), RunState::Running);

    const TimelineData& t = data.timeline();
    QCOMPARE(data.timelineStep(), std::int64_t(7));
    QCOMPARE(t.rows.size(), std::size_t(2));
    QCOMPARE(t.rows[0].rank, 0);
    QCOMPARE(t.rows[1].rank, 1);
    QCOMPARE(t.rows[1].stage, 1);
    // Sorted by start, relative to the step's earliest span (10 s).
    QCOMPARE(t.rows[0].spans.size(), std::size_t(3));
    QCOMPARE(t.rows[0].spans[0].kind, SpanKind::Forward);
    QCOMPARE(t.rows[0].spans[0].start, 0.0);
    QCOMPARE(t.rows[0].spans[1].kind, SpanKind::Backward);
    QCOMPARE(t.rows[0].spans[1].start, 3.0);
    QCOMPARE(t.rows[0].spans[2].kind, SpanKind::Optimizer);
    QCOMPARE(t.rows[1].spans[0].kind, SpanKind::Recv);
    QCOMPARE(t.rows[1].spans[0].layer, -1);
    QCOMPARE(t.begin, 0.0);
    QCOMPARE(t.end, 5.5);
    // Layer names interned in model order (from run_start), whatever order spans name them in.
    QCOMPARE(t.layerNames.indexOf("block.0"), 1);
    QCOMPARE(t.rows[0].spans[0].layer, 1);
    QCOMPARE(t.rows[1].spans[1].layer, 2);
    QCOMPARE(t.layerNames.at(t.rows[1].spans[1].layer), QString("head"));
    QCOMPARE(t.rows[0].bubbleFraction, 0.4);
    QCOMPARE(t.rows[1].bubbleFraction, 0.6);
    const auto mean = data.meanMeasuredBubble();
    QCOMPARE(mean.size(), std::size_t(2));
    QCOMPARE(mean[1].first, 1);
    QCOMPARE(mean[1].second, 0.6);
    QCOMPARE(data.spanHistory().back().origin, 10.0);
  }

  void measuredBubblePerReplica() {
    // dp = 2, tp = 1, pp = 2: ranks 0, 1 are stage 0 (replicas 0, 1), ranks 2, 3 stage 1. Replica 1 runs 100
    // s later than replica 0: each replica's window is its own, as the simulator's is one replica's.
    TimelineData t;
    auto row = [&](int rank, double f0, double f1, double b0, double b1) {
      TimelineRow r;
      r.rank = rank;
      r.spans = {{f0, f1, SpanKind::Forward, 0, 0, -1}, {b0, b1, SpanKind::Backward, 0, 0, -1}};
      t.rows.push_back(r);
    };
    row(0, 0, 1, 3, 4);          // busy 2 of window [0, 4]
    row(2, 1, 2, 2, 3);          // busy 2 of window [0, 4]
    row(1, 100, 101, 105, 106);  // busy 2 of window [100, 106]
    row(3, 101, 102, 102, 105);  // busy 4 of window [100, 106]
    computeMeasuredBubbles(t, 2, 1);
    QCOMPARE(t.rows[0].bubbleFraction, 0.5);
    QCOMPARE(t.rows[1].bubbleFraction, 0.5);
    QCOMPARE(t.rows[2].bubbleFraction, 1.0 - 2.0 / 6.0);
    QCOMPARE(t.rows[3].bubbleFraction, 1.0 - 4.0 / 6.0);
    // Over all ranks as one replica the window would be [0, 106].
    computeMeasuredBubbles(t, 1, 1);
    QCOMPARE(t.rows[0].bubbleFraction, 1.0 - 2.0 / 106.0);
  }

  void runDataStaysBounded() {
    RunData data;
    for (int i = 0; i < 6000; ++i) data.apply(LogEvent{"info", QString("line %1").arg(i)});
    QCOMPARE(data.log().size(), RunData::kMaxLogLines);
    QCOMPARE(data.logTotal(), std::uint64_t(6000));
    QCOMPARE(data.log().back().message, QString("line 5999"));
    QCOMPARE(data.log().front().message, QString("line 1000"));
    for (int s = 1; s <= 50; ++s) {
      SpansEvent e;
      e.step = s;
      e.ranks = {RankSpans{0, {MeasuredSpan{'F', 0, 0, "x", double(s), double(s) + 0.5}}, ""}};
      data.apply(e);
      MemoryEvent m;
      m.step = s;
      RankMemory r;
      r.rank = 0;
      r.peak.total = s == 10 ? 5000 : 100 + s;
      r.peak.activations = s;
      r.current.total = s;
      m.ranks = {r};
      data.apply(m);
    }
    QCOMPARE(data.spanHistory().size(), RunData::kSpanHistory);
    QCOMPARE(data.spanHistory().front().step, std::int64_t(31));
    QCOMPARE(data.timelineStep(), std::int64_t(50));
    QCOMPARE(data.timeline().layerNames.size(), 1);
    QCOMPARE(data.memory().size(), std::size_t(1));
    QCOMPARE(data.memory()[0].peak.total, 5000.0);  // the largest peak of the run
    QCOMPARE(data.memory()[0].peak.activations, 50.0);
    QCOMPARE(data.memory()[0].current.total, 50.0);  // the latest
    for (int i = 0; i < 1500; ++i) data.apply(MetricsError{i, "bad"});
    QCOMPARE(data.errors().size(), RunData::kMaxRecords);
    QCOMPARE(data.errorTotal(), std::uint64_t(1500));
  }

  void runDataDropsRepeatedSteps() {
    // A run resumed from step 2's checkpoint into the same stream repeats step 3: the old points go.
    RunData data;
    for (int s = 1; s <= 4; ++s) data.apply(StepEvent{s, 10.0 - s});
    data.apply(EvalEvent{4, 6.5, 100});
    const auto epoch = data.seriesEpoch();
    data.apply(StepEvent{3, 1.0});
    QCOMPARE(data.steps().size(), 3);
    QCOMPARE(data.steps().step.back(), 3.0);
    QCOMPARE(data.steps().loss.back(), 1.0);
    QCOMPARE(data.steps().loss.size(), 3);
    QCOMPARE(data.evals().size(), 0);
    QVERIFY(data.seriesEpoch() > epoch);
  }

  void runDataDecimatesLongSeries() {
    // Whole up to kMaxSeriesPoints rows, then pairs of rows holding each column's min and max over a bucket
    // of steps, in the order they came; the latest line exact.
    const int cap = RunData::kMaxSeriesPoints;
    auto lossAt = [](std::int64_t s) {
      return s == 70001 ? 1000.0 : s == 90001 ? -5.0 : 2.0 + double(s % 1000) / 8;
    };
    auto timeAt = [](std::int64_t s) { return s == 50003 ? 9.0 : 0.01; };
    auto step = [&](std::int64_t s, double loss) { return StepEvent{s, loss, kNaN, kNaN, timeAt(s)}; };
    RunData data;
    for (int s = 1; s < cap; ++s) data.apply(step(s, lossAt(s)));
    QCOMPARE(data.steps().size(), cap - 1);
    QCOMPARE(data.steps().decimation, std::int64_t(1));
    std::uint64_t epoch = data.seriesEpoch();
    data.apply(step(cap, lossAt(cap)));  // the cap-th row: halved into pairs of 4 steps
    QCOMPARE(data.steps().size(), cap / 2);
    QCOMPARE(data.steps().decimation, std::int64_t(4));
    QVERIFY(data.seriesEpoch() > epoch);
    const StepSeries& st = data.steps();
    // Steps 1..4: the loss rises, so min then max; lr never given: NaN.
    QCOMPARE(st.step[0], 1.0);
    QCOMPARE(st.step[1], 4.0);
    QCOMPARE(st.loss[0], lossAt(1));
    QCOMPARE(st.loss[1], lossAt(4));
    QVERIFY(std::isnan(st.lr[0]) && std::isnan(st.lr[1]));
    // Steps 997..1000: 126.625, 126.75, 126.875, then 2: the max (step 999) came before the min (step 1000).
    QCOMPARE(st.step[498], 997.0);
    QCOMPARE(st.step[499], 1000.0);
    QCOMPARE(st.loss[498], 126.875);
    QCOMPARE(st.loss[499], 2.0);

    const std::int64_t last = 200000;
    for (std::int64_t s = cap + 1; s <= last; ++s) data.apply(step(s, lossAt(s)));
    QVERIFY(st.size() <= cap);
    QCOMPARE(st.size() % 2, 0);
    const std::int64_t d = st.decimation;
    QVERIFY2(d >= 8 && (d & (d - 1)) == 0, qPrintable(QString::number(d)));
    // Every logged step is in a pair, except fewer than `decimation` newest ones waiting for theirs.
    QCOMPARE(st.logged, last);
    QVERIFY(std::int64_t(st.size() / 2) * d <= last);
    QVERIFY(std::int64_t(st.size() / 2 + 1) * d > last);
    for (int i = 1; i < st.size(); ++i) QVERIFY(st.step[i - 1] < st.step[i]);
    // Min/max preserved in every column, each at its own step.
    QCOMPARE(*std::max_element(st.loss.begin(), st.loss.end()), 1000.0);
    QCOMPARE(*std::min_element(st.loss.begin(), st.loss.end()), -5.0);
    QCOMPARE(*std::max_element(st.stepTime.begin(), st.stepTime.end()), 9.0);
    const auto spike = std::find(st.loss.begin(), st.loss.end(), 1000.0) - st.loss.begin();
    const qsizetype pair = spike & ~qsizetype(1);
    QVERIFY2(st.step[pair] <= 70001 && 70001 <= st.step[pair + 1],
             qPrintable(QString("%1..%2").arg(st.step[pair]).arg(st.step[pair + 1])));
    // The latest line exact.
    QCOMPARE(data.lastStep(), last);
    QCOMPARE(data.lastStepLine()->loss, lossAt(last));
    QCOMPARE(data.lastStepLine()->stepTime, 0.01);
    // The view draws the rows, and its status line the latest loss.
    data.setState(RunState::Running);
    RunView view(nullptr);
    view.setData(&data);
    QCOMPARE(view.lossPlot()->graph(0)->dataCount(), st.size());
    QVERIFY2(view.statusText().contains("step 200000") && view.statusText().contains("loss 2 "),
             qPrintable(view.statusText()));

    // A resume from an earlier checkpoint into the decimated part: the rows from its step on go.
    epoch = data.seriesEpoch();
    data.apply(step(150000, 7.0));
    QVERIFY(data.seriesEpoch() > epoch);
    QCOMPARE(data.lastStep(), std::int64_t(150000));
    QCOMPARE(data.lastStepLine()->loss, 7.0);
    QVERIFY(st.step.back() < 150000);
    QVERIFY(st.step.back() >= 150000 - 2 * d);
    QCOMPARE(st.size() % 2, 0);
    for (std::int64_t s = 150001; s <= 150000 + 4 * d; ++s) data.apply(step(s, 3.0));
    QVERIFY(st.step.back() > 150000);
    for (int i = 1; i < st.size(); ++i) QVERIFY(st.step[i - 1] < st.step[i]);

    // Evaluations the same way.
    for (int s = 1; s <= cap + 10; ++s) data.apply(EvalEvent{200000 + s, s == 7 ? 0.5 : 4.0, 64});
    QCOMPARE(data.evals().logged, std::int64_t(cap + 10));
    QCOMPARE(data.evals().decimation, std::int64_t(4));
    QVERIFY(data.evals().size() <= cap);
    QCOMPARE(*std::min_element(data.evals().loss.begin(), data.evals().loss.end()), 0.5);
    QCOMPARE(data.lastEvalLine()->step, std::int64_t(200000 + cap + 10));
  }

  // A mixture of experts' step lines carry "aux_loss": read, kept as a series beside the loss, drawn as a
  // third curve of the loss plot, in its legend only while the shown run has one.
  void loadBalancingLossCurve() {
    const QByteArray stream =
        R"({"v":1,"type":"step","step":1,"loss":5.5,"aux_loss":0.21,"lr":0.001,"grad_norm":1.5})"
        "\n"
        R"({"v":1,"type":"step","step":2,"loss":5.25,"aux_loss":0.205,"lr":0.001,"grad_norm":1.5})"
        "\n";
    MetricsReader reader;
    RunData moe;
    for (const MetricsEvent& e : reader.feed(stream)) moe.apply(e);
    QCOMPARE(moe.steps().size(), 2);
    QCOMPARE(moe.steps().auxLoss.at(1), 0.205);
    RunView view(nullptr);
    view.setData(&moe);
    QCustomPlot* plot = view.lossPlot();
    QCOMPARE(plot->graphCount(), 3);
    QCOMPARE(plot->graph(2)->dataCount(), 2);
    QCOMPARE(plot->graph(2)->data()->at(0)->value, 0.21);
    QVERIFY(plot->legend->hasItemWithPlottable(plot->graph(2)));
    // The y axis covers both curves.
    QVERIFY(plot->yAxis->range().lower < 0.205 && plot->yAxis->range().upper > 5.5);
    RunData dense;
    for (int s = 1; s <= 3; ++s) dense.apply(StepEvent{s, 4.0});
    QVERIFY(std::isnan(dense.steps().auxLoss.at(0)));
    view.setData(&dense);
    QVERIFY(!plot->legend->hasItemWithPlottable(plot->graph(2)));
  }

  void viewFollowsItsSource() {
    RunData a, b;
    for (int s = 1; s <= 4; ++s) a.apply(StepEvent{s, 4.0});
    a.apply(LogEvent{"info", "from a"});
    for (int s = 1; s <= 6; ++s) b.apply(StepEvent{s, 6.0});
    b.apply(LogEvent{"info", "from b"});
    RunView view(nullptr);
    view.setData(&a);
    QCOMPARE(view.lossPlot()->graph(0)->dataCount(), 4);
    view.setData(&b);  // more steps than a: must not be appended to a's
    QCOMPARE(view.lossPlot()->graph(0)->dataCount(), 6);
    QCOMPARE(view.lossPlot()->graph(0)->data()->at(0)->value, 6.0);
    QVERIFY(!view.logText().contains("from a"));
    QVERIFY(view.logText().contains("from b"));
    // A new run in the same data (clear) with more log lines than before, seen only after the fact.
    b.clear();
    for (int s = 1; s <= 8; ++s) b.apply(StepEvent{s, 8.0});
    for (int i = 0; i < 5; ++i) b.apply(LogEvent{"info", QString("second run %1").arg(i)});
    view.refresh();
    QCOMPARE(view.lossPlot()->graph(0)->dataCount(), 8);
    QVERIFY(!view.logText().contains("from b"));
    QCOMPARE(view.logText().count("second run"), 5);
    // Classifier runs: samples/s, and the predicted line in samples/s (batch / predicted step time).
    RunData c;
    RunStartEvent start;
    start.modelType = "mlp";
    start.batchSize = 64;
    start.predictedStepTime = 0.5;
    start.predictedTokensPerS = 999;
    c.apply(start);
    c.apply(StepEvent{1, 2.3, kNaN, kNaN, 0.4, kNaN, 160.0, 0.25});
    QCOMPARE(c.info().predictedThroughput(), 128.0);
    view.setData(&c);
    QVERIFY(!c.steps().throughputIsTokens);
    QCOMPARE(view.throughputPlot()->graph(0)->data()->at(0)->value, 160.0);
    QCOMPARE(view.throughputPlot()->graph(1)->data()->at(0)->value, 128.0);
    QCOMPARE(view.throughputPlot()->yAxis->label(), QString("samples/s"));
    QCOMPARE(c.steps().accuracy[0], 0.25);
    // Export works from a view never shown (at a fixed size).
    QTemporaryDir dir;
    QVERIFY(view.savePlots(dir.filePath("hidden"), "png"));
    QImage loss(dir.filePath("hidden/loss.png"));
    QCOMPARE(loss.size(), QSize(800, 500));
  }

  // A parameter-server run through the studio's client: its tab appears, with the staleness of every update
  // and every worker's state; the collective tabs stay as they are.
  void parameterServerRunLive() {
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    RunConfig c = tinyConfig(6);
    c.parallel = {};
    c.parallel.mode = ParallelMode::ParameterServer;
    c.parallel.servers = 2;
    c.parallel.workers = 2;
    c.parallel.consistency = Consistency::Async;
    c.training.gradClip = 0;
    EngineClient client;
    RunView view(nullptr);
    view.resize(1000, 700);
    view.show();
    view.setClient(&client);
    QSignalSpy finished(&client, &EngineClient::finished);
    QVERIFY(client.start(c, dir.filePath("run")));
    QTRY_VERIFY_WITH_TIMEOUT(finished.size() == 1, 60000);
    QVERIFY2(finished[0][0].toBool(), qPrintable(finished[0][1].toString() + "\n" + view.logText()));
    const RunData& d = client.data();
    QCOMPARE(d.info().psServers, 2);
    QCOMPARE(d.info().psWorkers, 2);
    QCOMPARE(d.info().consistency, QString("async"));
    QCOMPARE(d.info().predictedMeanStaleness, 1.0);  // two workers: one other update in flight
    QCOMPARE(d.steps().size(), 6);
    QVERIFY(d.lastPs().has_value());
    const PsEvent& ps = *d.lastPs();
    QVERIFY(ps.final);
    std::int64_t updates = 0, pushes = 0;
    for (std::int64_t n : ps.stalenessTotal) updates += n;
    QCOMPARE(updates, std::int64_t(12));  // 6 steps of 2 updates
    QCOMPARE(ps.workers.size(), std::size_t(2));
    for (const PsWorkerState& w : ps.workers) pushes += w.steps;
    QCOMPARE(pushes, std::int64_t(12));
    view.refresh();
    QVERIFY(view.sideTabs()->isTabVisible(RunView::PsTab));
    PsPanel* panel = view.psPanel();
    QCOMPARE(panel->workerTable()->rowCount(), 2);
    QCOMPARE(panel->workerTable()->item(0, PsPanel::ColState)->text(), QString("finished"));
    QCOMPARE(panel->workerTable()->item(1, PsPanel::ColSteps)->text(), QString::number(ps.workers[1].steps));
    auto* bars = qobject_cast<QCPBars*>(panel->histogram()->plottable(0));
    QVERIFY(bars);
    QCOMPARE(bars->data()->size(), int(ps.stalenessTotal.size()));
    double barSum = 0;
    for (auto it = bars->data()->constBegin(); it != bars->data()->constEnd(); ++it) barSum += it->value;
    QCOMPARE(barSum, 12.0);
    QVERIFY2(panel->summary().contains("12 updates applied"), qPrintable(panel->summary()));
    QVERIFY2(panel->summary().contains("predicted mean 1.00"), qPrintable(panel->summary()));
    // The measured timeline: lanes named as the predicted one names them; a worker pulls (host to device),
    // computes and pushes (device to host); the servers update, server 0 all 12 times. Which lanes a line
    // has depends on which worker pushed in its window (async), so the lines are taken together.
    QVERIFY(!d.spanHistory().empty());
    std::map<QString, std::set<SpanKind>> kinds;
    std::map<QString, int> spanCount;
    for (const MeasuredStep& m : d.spanHistory())
      for (const TimelineRow& row : m.timeline.rows)
        for (const TimelineSpan& sp : row.spans) {
          kinds[row.label].insert(sp.kind);
          ++spanCount[row.label];
        }
    // Async lets a worker run ahead: on a loaded machine (ctest -j2) one worker can make every push before
    // the other's first, and server 1's updates reach the stream only relayed by worker 0's next push. So:
    // server 0's lane always, a lane for every worker that pushed, nothing else.
    QStringList labels, expected = {"server 0"};
    for (const auto& [label, k] : kinds) labels << label;
    for (size_t i = 0; i < ps.workers.size(); ++i)
      if (ps.workers[i].steps > 0) expected << QString("worker %1").arg(i);
    const QString seen = labels.join(", ") +
                         QString(" (worker steps %1, %2)").arg(ps.workers[0].steps).arg(ps.workers[1].steps);
    for (const QString& label : expected)
      QVERIFY2(labels.contains(label), qPrintable(label + " missing: " + seen));
    for (const QString& label : labels)
      QVERIFY2(expected.contains(label) || label == "server 1", qPrintable(label + " unexpected: " + seen));
    for (const QString& label : labels)
      if (label.startsWith("worker"))
        QVERIFY2(kinds[label].count(SpanKind::HostToDevice) && kinds[label].count(SpanKind::Forward),
                 qPrintable(label));
      else
        QVERIFY2(kinds[label] == std::set<SpanKind>{SpanKind::Optimizer}, qPrintable(label));
    QCOMPARE(spanCount["server 0"], 12);
    // Replayed from its folder: the same.
    RunData replay;
    QVERIFY(loadRunFolder(dir.filePath("run"), replay).isOk());
    QVERIFY(replay.lastPs().has_value());
    QCOMPARE(replay.lastPs()->stalenessTotal, ps.stalenessTotal);
    // A collective run hides the tab again.
    view.setData(&replay);
    view.refresh();
    QVERIFY(view.sideTabs()->isTabVisible(RunView::PsTab));
    RunData empty;
    view.setData(&empty);
    view.refresh();
    QVERIFY(!view.sideTabs()->isTabVisible(RunView::PsTab));
  }

  // The same model trained sync and async, side by side: loss against steps and wall time, the staleness of
  // each (all fresh under sync), the table; a folder that is no run is refused and changes nothing.
  void compareSyncAndAsync() {
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    QStringList folders;
    for (const char* consistency : {"sync", "async"}) {
      RunConfig c = tinyConfig(6);
      c.name = std::string("tiny-") + consistency;
      c.parallel = {};
      c.parallel.mode = ParallelMode::ParameterServer;
      c.parallel.workers = 2;
      c.parallel.consistency = std::string(consistency) == "sync" ? Consistency::Sync : Consistency::Async;
      c.training.gradClip = 0;
      EngineClient client;
      QSignalSpy finished(&client, &EngineClient::finished);
      const QString runDir = dir.filePath(QString::fromLatin1(consistency));
      QVERIFY(client.start(c, runDir));
      QTRY_VERIFY_WITH_TIMEOUT(finished.size() == 1, 60000);
      QVERIFY2(finished[0][0].toBool(), qPrintable(finished[0][1].toString()));
      folders << runDir;
    }
    CompareView view;
    for (const QString& f : folders) QVERIFY(view.addRunFolder(f).isOk());
    QCOMPARE(view.runCount(), 2);
    QVERIFY(!view.addRunFolder(dir.filePath("nothing-here")).isOk());
    QCOMPARE(view.runCount(), 2);
    QCOMPARE(view.table()->rowCount(), 2);
    QCOMPARE(view.table()->item(0, CompareView::ColConsistency)->text(), QString("sync"));
    QCOMPARE(view.table()->item(1, CompareView::ColConsistency)->text(), QString("async"));
    QCOMPARE(view.table()->item(0, CompareView::ColSteps)->text(), QString("6"));
    QCOMPARE(view.table()->item(0, CompareView::ColStaleness)->text(), QString("0.00"));
    QCOMPARE(view.lossByStep()->graphCount(), 2);
    QCOMPARE(view.lossByTime()->graphCount(), 2);
    for (int g = 0; g < 2; ++g) {
      QCOMPARE(view.lossByStep()->graph(g)->data()->size(), 6);
      QCOMPARE(view.lossByTime()->graph(g)->data()->size(), 6);
      double last = -1;
      for (auto it = view.lossByTime()->graph(g)->data()->constBegin();
           it != view.lossByTime()->graph(g)->data()->constEnd(); ++it) {
        QVERIFY(it->key > last);  // seconds on the run's clock, increasing
        last = it->key;
      }
    }
    QCOMPARE(view.staleness()->plottableCount(), 2);
    auto* syncBars = qobject_cast<QCPBars*>(view.staleness()->plottable(0));
    QVERIFY(syncBars);
    QCOMPARE(syncBars->data()->size(), 1);
    QCOMPARE(syncBars->data()->constBegin()->value, 1.0);  // every sync update fresh
  }

  void realRunLiveAndReplayed() {
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const QString runDir = dir.filePath("run");
    const int steps = 4;
    EngineClient client;
    RunView view(nullptr);
    view.resize(1000, 700);
    view.show();
    view.setClient(&client);
    QSignalSpy started(&client, &EngineClient::started);
    QSignalSpy finished(&client, &EngineClient::finished);
    QVERIFY(client.start(tinyConfig(steps), runDir));
    QVERIFY(client.isRunning());
    QTRY_VERIFY_WITH_TIMEOUT(finished.size() == 1, 60000);
    QCOMPARE(started.size(), 1);
    const RunData& d = client.data();
    QVERIFY2(finished[0][0].toBool(), qPrintable(finished[0][1].toString() + "\n" + view.logText()));
    QVERIFY(!client.isRunning());

    // Steps: every configured one, finite losses near ln(256) = 5.55 (an untrained byte model).
    QCOMPARE(d.steps().size(), steps);
    for (int i = 0; i < steps; ++i) {
      QCOMPARE(d.steps().step[i], double(i + 1));
      QVERIFY(std::isfinite(d.steps().loss[i]));
      QVERIFY2(std::abs(d.steps().loss[i] - std::log(256.0)) < 0.5,
               qPrintable(QString::number(d.steps().loss[i])));
      QVERIFY(d.steps().throughput[i] > 0);
    }
    QVERIFY(d.steps().throughputIsTokens);
    QCOMPARE(d.evals().size(), 1);
    QVERIFY(std::isfinite(d.evals().loss[0]));
    // Run info and predictions from run_start.
    QVERIFY(d.info().known);
    QCOMPARE(d.info().ranks, 2);
    QCOMPARE(d.info().pp, 2);
    QCOMPARE(d.info().steps, std::int64_t(steps));
    QCOMPARE(d.info().predictedRanks.size(), std::size_t(2));
    QVERIFY(d.info().predictedStepTime > 0);
    QVERIFY(d.info().predictedRanks[1].memory.total > 0);
    // The measured timeline: 2 rows, each with forwards and backwards, on its stage.
    const TimelineData& t = d.timeline();
    QCOMPARE(t.rows.size(), std::size_t(2));
    for (int r = 0; r < 2; ++r) {
      const TimelineRow& row = t.rows[std::size_t(r)];
      QCOMPARE(row.rank, r);
      QCOMPARE(row.stage, r);
      int f = 0, b = 0;
      for (const TimelineSpan& s : row.spans) {
        f += s.kind == SpanKind::Forward;
        b += s.kind == SpanKind::Backward;
        QVERIFY(s.end >= s.start);
        QVERIFY(s.start >= 0);
      }
      QVERIFY2(f >= 2 && b >= 2, qPrintable(QString("rank %1: %2 F, %3 B").arg(r).arg(f).arg(b)));
      QVERIFY(row.bubbleFraction >= 0 && row.bubbleFraction < 1);
      for (std::size_t i = 1; i < row.spans.size(); ++i)
        QVERIFY(row.spans[i - 1].start <= row.spans[i].start);
    }
    QCOMPARE(t.begin, 0.0);
    QVERIFY(t.layerNames.contains("block.1"));
    QCOMPARE(d.spanHistory().size(), std::size_t(steps));
    // Measured memory for both ranks.
    QCOMPARE(d.memory().size(), std::size_t(2));
    for (const MeasuredMemory& m : d.memory()) {
      QVERIFY(m.peak.total > 0);
      QVERIFY(m.peak.parameters > 0);
    }
    QVERIFY(d.runEnd().has_value());
    QCOMPARE(d.runEnd()->status, QString("ok"));
    QCOMPARE(d.state(), RunState::Finished);
    QCOMPARE(d.errorTotal(), std::uint64_t(0));
    QVERIFY(!d.checkpoints().empty());

    // The view, after its next redraw.
    view.refresh();
    QCOMPARE(view.lossPlot()->graph(0)->dataCount(), steps);
    QCOMPARE(view.lossPlot()->graph(1)->dataCount(), 1);
    QCOMPARE(view.throughputPlot()->graph(0)->dataCount(), steps);
    QCOMPARE(view.throughputPlot()->graph(1)->dataCount(), 2);  // the predicted line
    QCOMPARE(view.throughputPlot()->graph(1)->data()->at(0)->value, d.info().predictedTokensPerS);
    QCOMPARE(view.stepTimePlot()->graph(0)->dataCount(), steps);
    QVERIFY2(view.statusText().contains("finished ok"), qPrintable(view.statusText()));
    QVERIFY(view.logText().contains("mpirun"));  // launch's command line, from stderr
    QCOMPARE(view.memoryTable()->rowCount(), 2);
    QVERIFY(view.memoryTable()->item(1, RunView::ColMeasuredMemory)->text().toDouble() > 0);
    QVERIFY(view.memoryTable()->item(0, RunView::ColPredictedBubble)->text().endsWith('%'));
    const QString plots = dir.filePath("plots");
    QVERIFY(view.savePlots(plots, "png"));
    QVERIFY(QFileInfo(plots + "/loss.png").size() > 1000);
    QVERIFY(QFileInfo(plots + "/step_time.png").size() > 1000);
    QVERIFY(view.savePlots(plots, "pdf"));
    QVERIFY(QFileInfo(plots + "/throughput.pdf").size() > 1000);
    QVERIFY(!view.savePlots(plots, "bmpx"));

    // The run folder's copy of the config reads the data by an absolute path.
    auto saved = loadRunConfig((runDir + "/config.json").toStdString());
    QVERIFY(saved.isOk());
    QCOMPARE(saved->data.files.at(0), std::string("/usr/share/games/fortunes/*.u8"));

    // Replay from the folder: the same series.
    RunData replay;
    const Status s = loadRunFolder(runDir, replay);
    QVERIFY2(s.isOk(), s.message().c_str());
    QCOMPARE(replay.steps().step, d.steps().step);
    QCOMPARE(replay.steps().loss, d.steps().loss);
    QCOMPARE(replay.evals().loss, d.evals().loss);
    QCOMPARE(replay.state(), RunState::Finished);
    QCOMPARE(replay.timeline().rows.size(), std::size_t(2));
    RunView replayView(nullptr);
    replayView.setData(&replay);
    QCOMPARE(replayView.lossPlot()->graph(0)->dataCount(), steps);
  }

  void replayReportsProblems() {
    QTemporaryDir dir;
    RunData data;
    Status s = loadRunFolder(dir.path(), data);
    QVERIFY(!s.isOk());
    QVERIFY2(QString::fromStdString(s.message()).contains(dir.path() + "/metrics.jsonl"),
             s.message().c_str());
    QFile f(dir.filePath("metrics.jsonl"));
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(QByteArray(kStep1) + "\n" + "garbage\n" + kStep2 + "\n" + "{\"v\":1,\"type\":\"st");
    f.close();
    s = loadRunFolder(dir.path(), data);
    QVERIFY(!s.isOk());
    const QString message = QString::fromStdString(s.message());
    QVERIFY2(message.contains("2 malformed line(s)") && message.contains("line 2: not JSON"),
             qPrintable(message));
    QCOMPARE(data.steps().size(), 2);  // what parsed is kept
    QCOMPARE(data.state(), RunState::Incomplete);
    QCOMPARE(data.errorTotal(), std::uint64_t(2));
  }

  void engineThatDiesKeepsWhatItSent() {
    QTemporaryDir dir;
    const QString script = dir.filePath("dying-engine.sh");
    QFile f(script);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("#!/bin/sh\n");
    f.write("echo 'launch: starting 2 ranks' >&2\n");
    f.write(QByteArray("printf '%s\\n' '") + kStep1 + "' '" + kStep2 + "'\n");
    f.write("printf '{\"v\":1,\"type\":\"ste'\n");
    f.write("echo 'boom: rank 1 died' >&2\n");
    f.write("exit 3\n");
    f.close();
    QVERIFY(f.setPermissions(f.permissions() | QFileDevice::ExeOwner));
    EngineClient client;
    client.setEnginePath(script);
    QSignalSpy finished(&client, &EngineClient::finished);
    QVERIFY(client.start(tinyConfig(3), dir.filePath("run")));
    QTRY_VERIFY_WITH_TIMEOUT(finished.size() == 1, 20000);
    QCOMPARE(finished[0][0].toBool(), false);
    const QString message = finished[0][1].toString();
    QVERIFY2(message.contains("boom: rank 1 died"), qPrintable(message));
    QVERIFY2(message.contains("code 3"), qPrintable(message));
    const RunData& d = client.data();
    QCOMPARE(d.steps().size(), 2);
    QCOMPARE(d.steps().loss[1], 5.25);
    QCOMPARE(d.errorTotal(), std::uint64_t(1));
    QVERIFY2(d.errors().back().contains("truncated"), qPrintable(d.errors().back()));
    QCOMPARE(d.state(), RunState::Failed);
    RunView view(nullptr);
    view.setClient(&client);
    QVERIFY2(view.statusText().startsWith("tiny: failed: ") || view.statusText().startsWith("failed: "),
             qPrintable(view.statusText()));
    QVERIFY(view.statusText().contains("boom"));
    QVERIFY(view.logText().contains("boom: rank 1 died"));
    QCOMPARE(view.lossPlot()->graph(0)->dataCount(), 2);
  }

  void killedRankIsNamed() {
    // A real rank killed mid-run: the client's message names it (launch's diagnosis), the steps stay.
    QTemporaryDir dir;
    const QString runDir = dir.filePath("killed-rank");
    EngineClient client;
    QSignalSpy finished(&client, &EngineClient::finished);
    QVERIFY(client.start(tinyConfig(100000), runDir));
    QTRY_VERIFY_WITH_TIMEOUT(client.data().steps().size() >= 2 || finished.size() > 0, 60000);
    QFile beat(runDir + "/ranks/rank-1.json");
    QVERIFY(beat.open(QIODevice::ReadOnly));
    const qint64 pid = QJsonDocument::fromJson(beat.readAll()).object().value("pid").toInteger();
    QVERIFY(pid > 0);
    QCOMPARE(::kill(pid_t(pid), SIGKILL), 0);
    QTRY_VERIFY_WITH_TIMEOUT(finished.size() == 1, 30000);
    QCOMPARE(finished[0][0].toBool(), false);
    const QString message = finished[0][1].toString();
    QVERIFY2(message.contains(QString("rank 1 (pid %1)").arg(pid)), qPrintable(message));
    QCOMPARE(client.data().state(), RunState::Failed);
    QVERIFY(client.data().steps().size() >= 2);
    QTRY_COMPARE_WITH_TIMEOUT(processesMentioning(runDir), 0, 10000);
    // The replay says the same: launch appended its run_end to the folder.
    RunData replay;
    loadRunFolder(runDir, replay);
    QCOMPARE(replay.state(), RunState::Failed);
    QVERIFY2(replay.stateMessage().contains("rank 1"), qPrintable(replay.stateMessage()));
  }

  void missingEngineIsReported() {
    QTemporaryDir dir;
    EngineClient client;
    client.setEnginePath("/nonexistent/bin/meshstudio-engine");
    QSignalSpy finished(&client, &EngineClient::finished);
    client.start(tinyConfig(3), dir.filePath("run"));
    QTRY_VERIFY_WITH_TIMEOUT(finished.size() == 1, 10000);
    QCOMPARE(finished[0][0].toBool(), false);
    const QString message = finished[0][1].toString();
    QVERIFY2(message.contains("/nonexistent/bin/meshstudio-engine"), qPrintable(message));
    QVERIFY(!client.isRunning());
    QCOMPARE(client.data().state(), RunState::Failed);
    QTest::qWait(50);
    QCOMPARE(finished.size(), 1);  // exactly once
  }

  void stopEndsRunCleanly() {
    QTemporaryDir dir;
    const QString runDir = dir.filePath("stopped-run");
    EngineClient client;
    QSignalSpy finished(&client, &EngineClient::finished);
    // Far more steps than can run before the stop arrives.
    QVERIFY(client.start(tinyConfig(100000), runDir));
    QTRY_VERIFY_WITH_TIMEOUT(client.data().steps().size() >= 2 || finished.size() > 0, 60000);
    QVERIFY2(finished.isEmpty(), qPrintable(finished.value(0).value(1).toString()));
    client.stop();
    QTRY_VERIFY_WITH_TIMEOUT(finished.size() == 1, 15000);
    const RunData& d = client.data();
    QVERIFY2(finished[0][0].toBool(), qPrintable(finished[0][1].toString()));
    QCOMPARE(d.state(), RunState::Interrupted);
    QVERIFY(d.runEnd().has_value());
    QCOMPARE(d.runEnd()->status, QString("interrupted"));
    QVERIFY(d.lastStep() < 100000);
    QCOMPARE(d.runEnd()->step, d.lastStep());
    // A clean stop: the ranks finished their step and saved it.
    QVERIFY(!d.checkpoints().empty());
    QCOMPARE(d.checkpoints().back().step, d.lastStep());
    QVERIFY2(finished[0][1].toString().contains("stopped"), qPrintable(finished[0][1].toString()));
    QCOMPARE(processesMentioning(runDir), 0);
  }

  void stopBeforeRanksStartIsAnInterruption() {
    // Stopped before the ranks run (they have no stop handler yet, or mpirun has not started them): launch
    // sends the stop again until every rank has beaten, so the job ends (a rank without its handler dies of
    // it) and launch appends its run_end to the run folder; the client reads the reason from there. Before
    // the resend, a stop that reached mpirun before its ranks was lost, and only the client's escalation
    // (kStopEscalateMs, 20 s) ended the run: this test failed about 1 run in 10 on its 20 s bound.
    QTemporaryDir dir;
    const QString runDir = dir.filePath("early-stop");
    EngineClient client;
    QSignalSpy started(&client, &EngineClient::started);
    QSignalSpy finished(&client, &EngineClient::finished);
    QVERIFY(client.start(tinyConfig(100000), runDir));
    QTRY_VERIFY_WITH_TIMEOUT(started.size() == 1, 10000);
    client.stop();
    QTRY_VERIFY_WITH_TIMEOUT(finished.size() == 1, 20000);
    QVERIFY2(finished[0][0].toBool(), qPrintable(finished[0][1].toString()));
    QCOMPARE(client.data().state(), RunState::Interrupted);
    QVERIFY2(finished[0][1].toString().contains("stopped"), qPrintable(finished[0][1].toString()));
    QTRY_COMPARE_WITH_TIMEOUT(processesMentioning(runDir), 0, 10000);
  }

  void secondStopTerminates() {
    // An engine that ignores SIGINT (stuck in a long step, say): the first stop() cannot end it, the second
    // terminates it.
    QTemporaryDir dir;
    const QString script = dir.filePath("stubborn-engine.sh");
    QFile f(script);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("#!/bin/sh\ntrap '' INT\n");
    f.write(QByteArray("printf '%s\\n' '") + kStep1 + "'\n");
    f.write("while :; do sleep 0.05; done\n");
    f.close();
    QVERIFY(f.setPermissions(f.permissions() | QFileDevice::ExeOwner));
    EngineClient client;
    client.setEnginePath(script);
    QSignalSpy finished(&client, &EngineClient::finished);
    QVERIFY(client.start(tinyConfig(3), dir.filePath("run")));
    QTRY_VERIFY_WITH_TIMEOUT(client.data().steps().size() == 1, 10000);
    client.stop();
    QTest::qWait(300);
    QVERIFY(client.isRunning());  // SIGINT was ignored
    QCOMPARE(finished.size(), 0);
    client.stop();
    QTRY_VERIFY_WITH_TIMEOUT(finished.size() == 1, 10000);
    QVERIFY2(finished[0][0].toBool(), qPrintable(finished[0][1].toString()));
    QVERIFY2(finished[0][1].toString().startsWith("terminated at the studio's request after step 1"),
             qPrintable(finished[0][1].toString()));
    QCOMPARE(client.data().state(), RunState::Interrupted);
    QCOMPARE(client.data().steps().size(), 1);
  }

  void floodOfOneMillionLines() {
    // A separate process (tests/data/flood-engine.sh: awk) writes 1,000,000 metrics lines (130 MB) as fast
    // as it can into a client shown in a RunView. The client never holds more than its bound of unapplied
    // bytes, so the writer is held back (when it had written everything, all but the pipe and the bound were
    // already applied); RunData stays within its caps; a 10 ms timer on the GUI thread keeps ticking.
    constexpr qint64 kLines = 1000000;
    std::int64_t steps = 0, evals = 0, logs = 0, spans = 0, lastSpansStep = 0;
    double lastEvalLoss = 0;
    QString lastLog;
    for (qint64 k = 2; k < kLines; ++k) {
      if (k % 1000 == 0) {
        ++spans;
        lastSpansStep = steps;
      } else if (k % 100 == 0) {
        ++logs;
        lastLog = QString("flood %1").arg(k);
      } else if (k % 10 == 0) {
        ++evals;
        lastEvalLoss = 3 + double(k % 77) / 4;
      } else {
        ++steps;
      }
    }
    QCOMPARE(steps, std::int64_t(899999));
    const double lastLoss = 2 + double(steps % 1000) / 8;

    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const QString engine = dir.filePath("flood-engine.sh");
    QVERIFY(QFile::copy(MS_TEST_DATA_DIR "/flood-engine.sh", engine));
    QVERIFY(QFile::setPermissions(engine, QFile::permissions(engine) | QFileDevice::ExeOwner));
    const QString wroteAll = dir.filePath("wrote-all");
    qputenv("MS_FLOOD_DONE", wroteAll.toLocal8Bit());

    EngineClient client;
    client.setEnginePath(engine);
    RunView view(nullptr);
    view.resize(1200, 800);
    view.setClient(&client);
    view.show();
    QSignalSpy finished(&client, &EngineClient::finished);

    QElapsedTimer clock;
    qint64 lastTick = -1, maxGap = 0, ticks = 0, appliedWhenWritten = -1, writtenAtMs = -1;
    bool paused = false;
    QTimer probe;
    probe.setTimerType(Qt::PreciseTimer);
    probe.setInterval(10);
    connect(&probe, &QTimer::timeout, this, [&] {
      const qint64 now = clock.elapsed();
      if (lastTick >= 0) maxGap = std::max(maxGap, now - lastTick);
      lastTick = now;
      ++ticks;
      paused = paused || client.readingPaused();
      if (appliedWhenWritten < 0 && QFileInfo::exists(wroteAll)) {
        appliedWhenWritten = client.bytesReceived();
        writtenAtMs = now;
      }
    });
    // A plain event loop, as the studio's (QTRY_* would sleep 10 ms between its passes), ended by finished()
    // or after 120 s.
    QEventLoop loop;
    connect(&client, &EngineClient::finished, &loop, &QEventLoop::quit);
    QTimer::singleShot(120000, &loop, &QEventLoop::quit);
    clock.start();
    probe.start();
    QVERIFY(client.start(tinyConfig(3), dir.filePath("run")));
    loop.exec();
    const qint64 elapsed = clock.elapsed();
    probe.stop();
    qunsetenv("MS_FLOOD_DONE");
    QCOMPARE(finished.size(), 1);
    QVERIFY2(finished[0][0].toBool(), qPrintable(finished[0][1].toString()));
    QCOMPARE(finished[0][1].toString(), QString("finished after step 899999"));
    QVERIFY(QFileInfo::exists(wroteAll));
    if (appliedWhenWritten < 0) appliedWhenWritten = client.bytesReceived();

    // Every line, and the last values exactly as written.
    QCOMPARE(client.linesReceived(), kLines);
    const RunData& d = client.data();
    QCOMPARE(d.errorTotal(), std::uint64_t(0));
    QCOMPARE(d.lastStep(), steps);
    QCOMPARE(d.lastStepLine()->loss, lastLoss);
    QCOMPARE(d.lastStepLine()->tokensPerS, 12800.0);
    QCOMPARE(d.lastEvalLine()->loss, lastEvalLoss);
    QCOMPARE(d.steps().logged, steps);
    QCOMPARE(d.evals().logged, evals);
    QCOMPARE(d.state(), RunState::Finished);

    // The bound held, and the writer was held to it: when it had written its last byte, everything but the
    // pipe's capacity and the bound had been parsed and applied.
    const qint64 total = client.bytesReceived();
    QCOMPARE(total, qint64(130440601));  // the generator's output, measured with wc -c
    QVERIFY(client.bytesInFlightHighWater() > 0);
    QVERIFY2(client.bytesInFlightHighWater() <= EngineClient::kMaxBytesInFlight,
             qPrintable(QString::number(client.bytesInFlightHighWater())));
    QVERIFY2(
        total - appliedWhenWritten <= EngineClient::kMaxBytesInFlight + EngineClient::kPipeBytes,
        qPrintable(
            QString("%1 of %2 bytes applied when the writer was done").arg(appliedWhenWritten).arg(total)));

    // What RunData keeps, within its caps.
    QVERIFY(d.steps().size() <= RunData::kMaxSeriesPoints);
    QVERIFY(d.steps().size() >= RunData::kMaxSeriesPoints / 4);
    QVERIFY(d.steps().decimation > 1);
    QVERIFY(std::int64_t(d.steps().size() / 2) * d.steps().decimation <= steps);
    QVERIFY(std::int64_t(d.steps().size() / 2 + 1) * d.steps().decimation > steps);
    QCOMPARE(*std::max_element(d.steps().loss.begin(), d.steps().loss.end()), 1000.0);  // the spike
    QCOMPARE(*std::min_element(d.steps().loss.begin(), d.steps().loss.end()), 2.0);
    QVERIFY(d.evals().size() <= RunData::kMaxSeriesPoints);
    QVERIFY(d.evals().decimation > 1);
    QCOMPARE(d.log().size(), RunData::kMaxLogLines);
    QVERIFY(d.logTotal() >= std::uint64_t(logs));
    QCOMPARE(d.logDropped(), d.logTotal() - RunData::kMaxLogLines);
    auto lastStreamLine = std::find_if(d.log().rbegin(), d.log().rend(),
                                       [](const LogLine& l) { return l.source == LogLine::Stream; });
    QVERIFY(lastStreamLine != d.log().rend());
    QCOMPARE(lastStreamLine->message, lastLog);
    QCOMPARE(d.spanHistory().size(), RunData::kSpanHistory);
    QCOMPARE(d.timelineStep(), lastSpansStep);

    // The view shows the decimated rows, and the window kept ticking.
    view.refresh();
    QCOMPARE(view.lossPlot()->graph(0)->dataCount(), d.steps().size());
    QVERIFY2(ticks > 0 && maxGap < 500, qPrintable(QString("largest gap %1 ms").arg(maxGap)));
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    qInfo(
        "%lld lines (%lld bytes) in %lld ms (the writer done at %lld ms); unapplied bytes at most %lld "
        "(bound %lld), reading paused: %s; the GUI timer's largest gap %lld ms over %lld ticks; steps kept "
        "%d rows at decimation %lld; peak RSS of the test process %ld MB",
        kLines, total, elapsed, writtenAtMs, client.bytesInFlightHighWater(), EngineClient::kMaxBytesInFlight,
        paused ? "yes" : "no", maxGap, ticks, d.steps().size(), static_cast<long long>(d.steps().decimation),
        usage.ru_maxrss / 1024);
  }

  void destroyedClientLeavesNoProcess() {
    QTemporaryDir dir;
    const QString runDir = dir.filePath("abandoned-run");
    auto* client = new EngineClient;
    QVERIFY(client->start(tinyConfig(100000), runDir));
    QTRY_VERIFY_WITH_TIMEOUT(client->data().steps().size() >= 1, 60000);
    QVERIFY(processesMentioning(runDir) >= 3);  // launch, mpirun and the ranks
    delete client;
    // The ranks may take a moment to be reaped by their parents after the kill.
    QTRY_COMPARE_WITH_TIMEOUT(processesMentioning(runDir), 0, 10000);
  }
};

QTEST_MAIN(TestUiRun)
#include "tst_ui_run.moc"
