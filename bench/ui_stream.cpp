// bench/ui_stream: the largest metrics rate the studio absorbs without a GUI stall over 50 ms.
//
// A generator (this program re-executed as the "engine": EngineClient runs `<engine> launch CONFIG -- ...`,
// so argv[1] == "launch" makes it one) writes a realistic stream at RATE steps/s for SECONDS: per step a step
// line, a spans line (RANKS ranks x SPANS spans, 1F1B-like actions and layer names) and a memory line, as the
// engine's trainer writes them. The studio side is the real path: EngineClient (its own stdout pipe, read
// under its back-pressure bound; MetricsReader on its parser thread; RunData) -> a visible RunView under the
// offscreen platform, redrawing on its own timer.
// A 5 ms precise QTimer measures the event loop's lateness (a stall = how late a tick came). The reference,
// measured in the same run for every rate, is the same generator read by a QProcess whose consumer only
// discards the bytes.
//
// Per rate: lines/s and MB/s absorbed (over the time from start to the last byte handled), max and p99 stall,
// the most bytes the client held read but not yet applied (EngineClient::bytesInFlightHighWater), whether it
// kept up (the generator wrote at least 95% of its schedule, so the pipe never held it back for long, and the
// consumer finished within 0.5 s of the generator), and the studio's rate over the reference's.
// usage: bench_ui_stream [--seconds 3] [--rates 10,30,100,300,1000,3000] [--ranks 8] [--spans 200]
#include <sys/resource.h>
#include <unistd.h>

#include <QApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QProcess>
#include <QTimer>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/run_config.h"
#include "ui/run/engine_client.h"
#include "ui/views/run_view.h"

namespace {

struct StreamShape {
  double rate = 10;    // steps per second
  double seconds = 3;  // generator's duration
  int ranks = 8;
  int spans = 200;  // per rank per step
};

// ---- the generator ---------------------------------------------------------------------------------------

std::string spansBody(const StreamShape& shape) {
  // 1F1B-like: per microbatch a receive wait, forward, send, then backward and weight gradient, and the
  // step's gradient sync and optimizer; times on one clock, the step taking about 50 ms.
  static const char kActions[] = {'r', 'F', 's', 'R', 'B', 'W', 'S'};
  std::string out = ",\"ranks\":[";
  for (int r = 0; r < shape.ranks; ++r) {
    if (r) out += ',';
    out += "{\"rank\":" + std::to_string(r) + ",\"spans\":[";
    double t = 0.001 * r;
    for (int i = 0; i < shape.spans; ++i) {
      const bool tail = i >= shape.spans - 2;
      const char action = tail ? (i == shape.spans - 1 ? 'O' : 'G') : kActions[i % 7];
      const double length = action == 'F' || action == 'B' || action == 'W' ? 0.0004 : 0.00005;
      char span[200];
      std::snprintf(
          span, sizeof span,
          "%s{\"action\":\"%c\",\"chunk\":%d,\"end\":%.9f,\"layer\":\"%s\",\"mb\":%d,\"start\":%.9f}",
          i ? "," : "", action, tail ? -1 : 0, t + length,
          action == 'F' || action == 'B' || action == 'W' ? ("block." + std::to_string(i % 12)).c_str() : "",
          (i / 7) % 64, t);
      out += span;
      t += length + 0.00001;
    }
    out += "]}";
  }
  return out + "]}\n";
}

std::string memoryBody(const StreamShape& shape) {
  std::string out = ",\"ranks\":[";
  for (int r = 0; r < shape.ranks; ++r) {
    if (r) out += ',';
    const std::string cats =
        "{\"activations\":313344,\"communication\":8192,\"gradients\":87680,\"optimizer\":175360,"
        "\"parameters\":87680,\"total\":803328,\"workspace\":131072}";
    out += "{\"current\":" + cats + ",\"peak\":" + cats + ",\"rank\":" + std::to_string(r) + "}";
  }
  return out + "]}\n";
}

void writeAll(const std::string& s) {
  const char* p = s.data();
  std::size_t left = s.size();
  while (left > 0) {
    const ssize_t n = ::write(STDOUT_FILENO, p, left);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      std::exit(1);  // the reader went away
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

int generate(const StreamShape& shape) {
  using Clock = std::chrono::steady_clock;
  const std::string spans = spansBody(shape), memory = memoryBody(shape);
  std::string predicted = "{\"step_time_s\":0.05,\"tokens_per_s\":20000,\"mfu\":0.3,\"ranks\":[";
  for (int r = 0; r < shape.ranks; ++r)
    predicted += (r ? "," : "") + std::string("{\"rank\":") + std::to_string(r) +
                 ",\"stage\":" + std::to_string(r) +
                 ",\"bubble_fraction\":0.2,\"memory_bytes\":{\"total\":786944}}";
  predicted += "]}";
  const long long total = std::llround(shape.rate * shape.seconds);
  writeAll("{\"v\":1,\"type\":\"run_start\",\"name\":\"bench\",\"ranks\":" + std::to_string(shape.ranks) +
           ",\"steps\":" + std::to_string(total) +
           ",\"config\":{\"parallel\":{\"dp\":1,\"tp\":1,\"pp\":" + std::to_string(shape.ranks) +
           "},\"training\":{\"batch_size\":32}},\"predicted\":" + predicted + "}\n");
  const auto t0 = Clock::now();
  long long written = 0;
  std::string buffer;
  for (;;) {
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    if (written >= total || t >= shape.seconds) break;
    const long long due = std::min(total, static_cast<long long>(t * shape.rate) + 1);
    if (due <= written) {
      std::this_thread::sleep_for(std::chrono::duration<double>(double(written) / shape.rate - t));
      continue;
    }
    buffer.clear();
    for (long long s = written + 1; s <= due; ++s) {
      const std::string n = std::to_string(s);
      buffer += "{\"v\":1,\"type\":\"step\",\"step\":" + n +
                ",\"loss\":" + std::to_string(5.5 - 1e-4 * double(s)) +
                ",\"lr\":0.0003,\"grad_norm\":1.5,\"step_time_s\":0.05,\"samples_per_s\":640,"
                "\"tokens_per_s\":20480}\n";
      buffer += "{\"v\":1,\"type\":\"spans\",\"step\":" + n + spans;
      buffer += "{\"v\":1,\"type\":\"memory\",\"step\":" + n + memory;
    }
    writeAll(buffer);
    written = due;
  }
  writeAll("{\"v\":1,\"type\":\"run_end\",\"status\":\"ok\",\"reason\":\"\",\"step\":" +
           std::to_string(written) + "}\n");
  return 0;
}

// ---- the consumer side -----------------------------------------------------------------------------------

// How late each tick of a 5 ms timer comes: the event loop's stalls.
class StallMonitor {
 public:
  StallMonitor() {
    m_timer.setTimerType(Qt::PreciseTimer);
    m_timer.setInterval(5);
    QObject::connect(&m_timer, &QTimer::timeout, [this] {
      const qint64 now = m_clock.nsecsElapsed();
      m_lateness.push_back(std::max(0.0, double(now - m_last) / 1e6 - 5.0));
      m_last = now;
    });
  }
  void start() {
    m_lateness.clear();
    m_clock.start();
    m_last = 0;
    m_timer.start();
  }
  void stop() { m_timer.stop(); }
  double maxMs() const {
    return m_lateness.empty() ? 0 : *std::max_element(m_lateness.begin(), m_lateness.end());
  }
  double p99Ms() const {
    if (m_lateness.empty()) return 0;
    std::vector<double> v = m_lateness;
    const std::size_t k = std::min(v.size() - 1, static_cast<std::size_t>(0.99 * double(v.size())));
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    return v[k];
  }

 private:
  QTimer m_timer;
  QElapsedTimer m_clock;
  qint64 m_last = 0;
  std::vector<double> m_lateness;
};

struct Result {
  double seconds = 0;  // start to the last byte handled
  double bytes = 0;
  double lines = 0;
  long long steps = 0;  // steps received
  double maxStall = 0, p99Stall = 0;
  double maxUnappliedMb = 0;  // the studio's most bytes read from the pipe and not yet applied
};

void setShapeEnvironment(const StreamShape& s) {
  qputenv("MS_BENCH_RATE", QByteArray::number(s.rate));
  qputenv("MS_BENCH_SECONDS", QByteArray::number(s.seconds));
  qputenv("MS_BENCH_RANKS", QByteArray::number(s.ranks));
  qputenv("MS_BENCH_SPANS", QByteArray::number(s.spans));
}

void waitUntil(const std::function<bool()>& done) {
  while (!done()) QCoreApplication::processEvents(QEventLoop::WaitForMoreEvents, 50);
}

// The reference: the same stream read and discarded.
Result runReference(const StreamShape& shape, const QString& self) {
  setShapeEnvironment(shape);
  Result r;
  StallMonitor stalls;
  QProcess p;
  QElapsedTimer clock;
  bool finished = false;
  QObject::connect(&p, &QProcess::readyReadStandardOutput, [&] {
    const QByteArray b = p.readAllStandardOutput();
    r.bytes += double(b.size());
    r.lines += double(b.count('\n'));
  });
  QObject::connect(&p, &QProcess::finished, [&] {
    const QByteArray b = p.readAllStandardOutput();
    r.bytes += double(b.size());
    r.lines += double(b.count('\n'));
    finished = true;
  });
  stalls.start();
  clock.start();
  p.start(self, {"launch", "-"});
  waitUntil([&] { return finished; });
  r.seconds = double(clock.nsecsElapsed()) / 1e9;
  stalls.stop();
  r.steps = static_cast<long long>((r.lines - 2) / 3);
  r.maxStall = stalls.maxMs();
  r.p99Stall = stalls.p99Ms();
  return r;
}

// The studio: EngineClient into RunData, a visible RunView redrawing on its timer.
Result runStudio(const StreamShape& shape, const QString& self, const QString& runDir) {
  setShapeEnvironment(shape);
  Result r;
  StallMonitor stalls;
  ms::EngineClient client;
  client.setEnginePath(self);
  ms::RunView view(nullptr);
  view.resize(1400, 900);
  view.setClient(&client);
  view.show();
  QCoreApplication::processEvents();
  bool finished = false;
  QObject::connect(&client, &ms::EngineClient::finished, [&](bool ok, const QString& message) {
    finished = true;
    if (!ok) std::fprintf(stderr, "studio run failed: %s\n", qPrintable(message));
  });
  QElapsedTimer clock;
  ms::RunConfig config;
  config.name = "bench";
  stalls.start();
  clock.start();
  client.start(config, runDir);
  waitUntil([&] { return finished; });
  r.seconds = double(clock.nsecsElapsed()) / 1e9;
  view.refresh();
  QCoreApplication::processEvents();
  stalls.stop();
  r.steps = client.data().steps().size();
  r.lines = double(client.linesReceived());
  r.bytes = double(client.bytesReceived());
  r.maxUnappliedMb = double(client.bytesInFlightHighWater()) / (1 << 20);
  r.maxStall = stalls.maxMs();
  r.p99Stall = stalls.p99Ms();
  return r;
}

// The time one spans line of a given size costs the studio (parse, check and RunData; the parse runs on
// EngineClient's parser thread, the RunData part on the GUI thread), against nlohmann::json::parse of the
// same line alone (the DOM parse under the reader). It bounds the lines per second one parser thread absorbs.
void lineCostTable() {
  using Clock = std::chrono::steady_clock;
  std::printf(
      "\none spans line: parse + check + RunData (parser thread + GUI thread) vs the bare JSON parse\n");
  std::printf("%6s %6s %9s %12s %12s %7s\n", "ranks", "spans", "line KB", "studio ms", "json ms", "ratio");
  const std::pair<int, int> shapes[] = {{2, 24}, {8, 200}, {64, 256}, {256, 256}};
  for (const auto& [ranks, spans] : shapes) {
    StreamShape shape;
    shape.ranks = ranks;
    shape.spans = spans;
    const std::string line = "{\"v\":1,\"type\":\"spans\",\"step\":1" + spansBody(shape);
    const int reps = std::max(3, static_cast<int>(20e6 / double(line.size())));
    double studio = 1e9, bare = 1e9;
    ms::RunData data;
    for (int i = 0; i < reps; ++i) {
      auto t0 = Clock::now();
      ms::MetricsReader reader;
      std::vector<ms::MetricsEvent> events = reader.feed(QByteArrayView(line.data(), qsizetype(line.size())));
      data.apply(events);
      studio = std::min(studio, std::chrono::duration<double>(Clock::now() - t0).count());
      t0 = Clock::now();
      const auto j = nlohmann::json::parse(line.begin(), line.end() - 1);
      bare = std::min(bare, std::chrono::duration<double>(Clock::now() - t0).count());
      if (j.size() != 4 || data.timeline().rows.size() != std::size_t(ranks)) std::exit(1);
    }
    std::printf("%6d %6d %9.0f %12.2f %12.2f %6.2fx\n", ranks, spans, double(line.size()) / 1024,
                studio * 1e3, bare * 1e3, studio / bare);
  }
}

double envNumber(const char* name, double fallback) {
  const QByteArray v = qgetenv(name);
  bool ok = false;
  const double x = v.toDouble(&ok);
  return ok ? x : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "launch") == 0) {
    StreamShape s;
    s.rate = envNumber("MS_BENCH_RATE", 10);
    s.seconds = envNumber("MS_BENCH_SECONDS", 3);
    s.ranks = static_cast<int>(envNumber("MS_BENCH_RANKS", 8));
    s.spans = static_cast<int>(envNumber("MS_BENCH_SPANS", 200));
    return generate(s);
  }
  if (qgetenv("QT_QPA_PLATFORM").isEmpty()) qputenv("QT_QPA_PLATFORM", "offscreen");
  QApplication app(argc, argv);
  StreamShape base;
  std::vector<double> rates = {10, 30, 100, 300, 1000, 3000};
  const QStringList args = app.arguments();
  for (int i = 1; i + 1 < args.size(); i += 2) {
    if (args[i] == "--seconds")
      base.seconds = args[i + 1].toDouble();
    else if (args[i] == "--ranks")
      base.ranks = args[i + 1].toInt();
    else if (args[i] == "--spans")
      base.spans = args[i + 1].toInt();
    else if (args[i] == "--rates") {
      rates.clear();
      for (const QString& r : args[i + 1].split(',')) rates.push_back(r.toDouble());
    } else {
      std::fprintf(stderr,
                   "usage: bench_ui_stream [--seconds S] [--rates R1,R2,...] [--ranks N] [--spans N]\n");
      return 2;
    }
  }
  const QString self = QCoreApplication::applicationFilePath();
  const double stepBytes = double(spansBody(base).size() + memoryBody(base).size() + 200);
  std::printf(
      "bench_ui_stream: %d ranks x %d spans per step (%.0f KB of metrics per step), %.1f s per rate\n",
      base.ranks, base.spans, stepBytes / 1024, base.seconds);
  std::printf("%8s %9s | %9s %8s %5s | %9s %8s %9s %9s %10s %5s | %8s\n", "steps/s", "offer MB/s", "ref MB/s",
              "ref max", "kept", "lines/s", "MB/s", "max stall", "p99 stall", "unapplied", "kept", "vs ref");
  const QString runDir =
      QDir::temp().filePath(QStringLiteral("bench_ui_stream-%1").arg(QCoreApplication::applicationPid()));
  double best = 0, bestLines = 0, bestMb = 0;
  for (double rate : rates) {
    StreamShape s = base;
    s.rate = rate;
    const long long target = std::llround(rate * s.seconds);
    const Result ref = runReference(s, self);
    const Result st = runStudio(s, self, runDir);
    auto keptUp = [&](const Result& r) {
      return r.steps >= 0.95 * double(target) && r.seconds <= s.seconds + 0.5;
    };
    const double stBytes = st.bytes;
    const double stSteps = double(st.steps) / st.seconds, refSteps = double(ref.steps) / ref.seconds;
    const bool ok = keptUp(st);
    std::printf("%8.0f %9.1f | %9.1f %6.1fms %5s | %9.0f %8.1f %7.1fms %7.1fms %8.1fMB %5s | %7.2fx\n", rate,
                rate * stepBytes / 1e6, ref.bytes / ref.seconds / 1e6, ref.maxStall,
                keptUp(ref) ? "yes" : "no", st.lines / st.seconds, stBytes / st.seconds / 1e6, st.maxStall,
                st.p99Stall, st.maxUnappliedMb, ok ? "yes" : "no", stSteps / refSteps);
    std::fflush(stdout);
    if (ok && st.maxStall < 50 && rate > best) {
      best = rate;
      bestLines = st.lines / st.seconds;
      bestMb = stBytes / st.seconds / 1e6;
    }
  }
  QDir(runDir).removeRecursively();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double streamsRss = double(usage.ru_maxrss) / 1024;  // before the line-cost table's large lines
  lineCostTable();
  getrusage(RUSAGE_SELF, &usage);
  if (best > 0)
    std::printf("largest rate kept up with every stall under 50 ms: %.0f steps/s (%.0f lines/s, %.1f MB/s)\n",
                best, bestLines, bestMb);
  else
    std::printf("no rate was kept up with every stall under 50 ms\n");
  std::printf("peak resident memory of the studio process: %.0f MB over the rates, %.0f MB in all\n",
              streamsRss, double(usage.ru_maxrss) / 1024);
  return 0;
}
