// bench/ui_timeline: frame time of the timeline view on about 100k spans (a simulated ZB-H1 plan: 64 ranks,
// dp 8 x pp 8, 228 microbatches, ~1600 spans per rank) rendered at 1600x900 into a QImage, at three zoom
// levels (the whole step, 10x and 100x around its middle). Prints the median and worst ms per frame, the
// ratio of the median to the 16 ms frame budget (below 1 meets it), and the ratio against a naive reference
// measured in the same run: every span of every row drawn as its own rectangle, no culling of rows or time,
// no merging of narrow spans. Runs offscreen (QT_QPA_PLATFORM=offscreen unless set); --png DIR saves one
// frame per zoom level; --large uses 2280 microbatches (about 950k spans).
#include <QApplication>
#include <QElapsedTimer>
#include <QPainter>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "ui/models/plan_analysis.h"
#include "ui/views/timeline_view.h"

namespace {

constexpr int kWarmup = 3;
constexpr int kFrames = 25;
constexpr double kBudgetMs = 16.0;
const QSize kFrame(1600, 900);

nlohmann::json benchConfig(int microbatches) {
  using nlohmann::json;
  json nodes = json::array();
  for (int n = 0; n < 8; ++n)
    nodes.push_back({{"name", "n" + std::to_string(n)}, {"device", "h100-sxm-80gb"}, {"count", 8}});
  return json{
      {"version", 1},
      {"name", "bench-ui-timeline"},
      {"device", "cuda"},
      {"model",
       {{"type", "gpt"},
        {"layers", 16},
        {"width", 1024},
        {"heads", 16},
        {"vocab", 32000},
        {"context", 1024}}},
      {"data",
       {{"kind", "tokens"}, {"train", json::array({"train.bin"})}, {"val", json::array({"val.bin"})}}},
      {"mesh", {{"nodes", nodes}, {"intra_link", "nvlink"}, {"inter_link", "infiniband"}}},
      {"parallel", {{"dp", 8}, {"tp", 1}, {"pp", 8}, {"schedule", "zb_h1"}, {"microbatches", microbatches}}},
      {"training", {{"batch_size", 8 * microbatches}, {"seq_len", 1024}}}};
}

struct Stats {
  double median = 0;
  double worst = 0;
};

template <typename Draw>
Stats timeFrames(Draw draw) {
  for (int i = 0; i < kWarmup; ++i) draw();
  std::vector<double> ms;
  for (int i = 0; i < kFrames; ++i) {
    QElapsedTimer t;
    t.start();
    draw();
    ms.push_back(double(t.nsecsElapsed()) / 1e6);
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.back()};
}

// Colours of the reference looked up in a table (as the view does), so the comparison is about drawing.
struct Palette {
  std::vector<QColor> byMicrobatch;  // (M, 3)
  QColor of(const ms::TimelineSpan& s) const {
    const int k = s.kind == ms::SpanKind::Forward          ? 0
                  : s.kind == ms::SpanKind::Backward       ? 1
                  : s.kind == ms::SpanKind::BackwardWeight ? 2
                                                           : -1;
    if (k >= 0 && s.microbatch >= 0 && std::size_t(s.microbatch) * 3 + k < byMicrobatch.size())
      return byMicrobatch[std::size_t(s.microbatch) * 3 + k];
    return ms::TimelineView::spanColor(s);
  }
};

Palette makePalette(int microbatches) {
  Palette p;
  for (int mb = 0; mb < microbatches; ++mb)
    for (ms::SpanKind k : {ms::SpanKind::Forward, ms::SpanKind::Backward, ms::SpanKind::BackwardWeight}) {
      ms::TimelineSpan s;
      s.kind = k;
      s.microbatch = static_cast<std::int16_t>(mb);
      p.byMicrobatch.push_back(ms::TimelineView::spanColor(s));
    }
  return p;
}

// The reference: what a first version would do, every span its own filled rectangle.
QImage naiveRender(const ms::TimelineData& data, const Palette& palette, const ms::TimeAxis& axis,
                   const ms::RowLayout& layout) {
  QImage image(kFrame, QImage::Format_ARGB32_Premultiplied);
  QPainter p(&image);
  p.fillRect(image.rect(), ms::TimelineView::backgroundColor());
  p.setClipRect(QRect(int(axis.x0()), layout.headerHeight(), int(axis.width()), kFrame.height()));
  const double pxPerSecond = axis.width() / axis.span();
  for (std::size_t r = 0; r < data.rows.size(); ++r)
    for (const ms::TimelineSpan& s : data.rows[r].spans) {
      const ms::RowLayout::Band band = layout.lane(int(r), ms::laneOf(s.kind));
      p.fillRect(QRectF(axis.x(s.start), band.top, (s.end - s.start) * pxPerSecond, band.height),
                 palette.of(s));
    }
  return image;
}

}  // namespace

int main(int argc, char** argv) {
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  QApplication app(argc, argv);
  // --png DIR: also save one frame per zoom level (to look at what was timed).
  QString pngDir;
  const QStringList args = app.arguments();
  if (const qsizetype i = args.indexOf("--png"); i >= 0 && i + 1 < args.size()) pngDir = args[i + 1];
  // --large: ten times the microbatches (about 950k spans), where drawing every span stops being cheap.
  const bool large = args.contains("--large");
  auto config = ms::parseRunConfig(benchConfig(large ? 2280 : 228));
  if (!config) {
    std::fprintf(stderr, "bench config: %s\n", config.message().c_str());
    return 2;
  }
  const auto snapshot = ms::analyzePlan(*config);
  if (!snapshot->ok()) {
    std::fprintf(stderr, "plan: %s\n", qPrintable(snapshot->error));
    return 1;
  }
  auto data = std::make_shared<ms::TimelineData>(snapshot->timeline);
  std::printf("timeline: %zu rows, %zu spans, step %.3f ms; frame %dx%d, %d frames after %d warm-up\n",
              data->rows.size(), data->spanCount(), (data->end - data->begin) * 1e3, kFrame.width(),
              kFrame.height(), kFrames, kWarmup);

  const Palette palette = makePalette(config->parallel.microbatches);
  ms::TimelineView view;
  view.resize(kFrame);
  view.setData(data);
  view.fitAll();
  const double full = view.timeAxis().span();
  const double mid = 0.5 * (view.timeAxis().t0() + view.timeAxis().t1());

  std::printf("%-10s %12s %12s %12s %12s %12s %10s\n", "zoom", "median ms", "worst ms", "x 16 ms",
              "naive med", "naive worst", "speedup");
  bool ok = true;
  std::size_t sink = 0;  // keeps the images' work observable
  for (double zoom : {1.0, 10.0, 100.0}) {
    view.setViewRange(mid - full / zoom / 2, mid + full / zoom / 2);
    const Stats fast = timeFrames([&] { sink += view.render(kFrame).pixel(800, 450); });
    if (!pngDir.isEmpty()) view.render(kFrame).save(QString("%1/timeline_%2x.png").arg(pngDir).arg(zoom));
    const ms::TimeAxis axis = view.timeAxis();
    const ms::RowLayout layout = view.rowLayout();
    const Stats naive =
        timeFrames([&] { sink += naiveRender(*data, palette, axis, layout).pixel(800, 450); });
    std::printf("%-10s %12.2f %12.2f %12.2f %12.2f %12.2f %9.1fx\n",
                qPrintable(zoom == 1 ? QString("fit-all") : QString("%1x").arg(zoom)), fast.median,
                fast.worst, fast.median / kBudgetMs, naive.median, naive.worst, naive.median / fast.median);
    ok = ok && fast.median > 0;
  }
  // What a frame costs without spans: the image, the headers, the axis (the floor under the rows above).
  ms::TimelineView empty;
  auto rowsOnly = std::make_shared<ms::TimelineData>(*data);
  for (ms::TimelineRow& row : rowsOnly->rows) row.spans.clear();
  rowsOnly->begin = data->begin, rowsOnly->end = data->end;
  empty.resize(kFrame);
  empty.setData(rowsOnly);
  const Stats floor = timeFrames([&] { sink += empty.render(kFrame).pixel(800, 450); });
  const Stats image = timeFrames([&] {
    QImage i(kFrame, QImage::Format_ARGB32_Premultiplied);
    i.fill(Qt::white);
    sink += i.pixel(800, 450);
  });
  std::printf("%-10s %12.2f %12.2f   (64 row headers and the axis, no spans; a bare filled image: %.2f ms)\n",
              "no spans", floor.median, floor.worst, image.median);
  std::printf("(sink %zu)\n", sink % 7);
  return ok ? 0 : 1;
}
