// Calibration from a run; see calibration.h.
#include "ui/run/calibration.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "plan/model_spec.h"

namespace ms {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

Expected<Calibration> calibrationFromRun(const RunData& data, const RunConfig& runConfig,
                                         const QString& source) {
  const std::vector<std::string> names = modelLayerNames(runConfig.model);
  const int layers = static_cast<int>(names.size());
  const ParallelConfig& p = runConfig.parallel;
  const int microbatch = microbatchSize(runConfig);
  if (microbatch < 1)
    return Status::error("the run's config has no whole microbatch (batch_size / (dp * microbatches))");
  const auto& history = data.spanHistory();
  if (history.empty()) return Status::error("the run has no measured spans yet (no step was logged)");
  // (layer, kind) -> durations; layers by name, since a stream's layer indices follow its own interning.
  std::map<std::pair<int, SpanKind>, std::vector<double>> times;
  const bool skipFirst = history.size() > 1 && history.front().step <= 1;
  for (std::size_t h = skipFirst ? 1 : 0; h < history.size(); ++h) {
    const TimelineData& t = history[h].timeline;
    for (const TimelineRow& row : t.rows)
      for (const TimelineSpan& s : row.spans) {
        if (s.layer < 0 || s.layer >= t.layerNames.size()) continue;
        if (s.kind != SpanKind::Forward && s.kind != SpanKind::Backward && s.kind != SpanKind::BackwardWeight)
          continue;
        const auto it = std::find(names.begin(), names.end(), t.layerNames[s.layer].toStdString());
        if (it == names.end()) continue;
        times[{static_cast<int>(it - names.begin()), s.kind}].push_back(s.end - s.start);
      }
  }
  Calibration c;
  c.model = runConfig.model;
  c.tp = p.tp;
  c.recompute = p.recompute;
  c.recomputeLayers = p.recomputeLayers;
  c.source = source;
  c.perSample.forward.assign(layers, 0);
  c.perSample.backwardInput.assign(layers, 0);
  c.perSample.backwardWeight.assign(layers, 0);
  for (int l = 0; l < layers; ++l) {
    const double f = median(times[{l, SpanKind::Forward}]);
    const double b = median(times[{l, SpanKind::Backward}]);
    const double w = median(times[{l, SpanKind::BackwardWeight}]);
    if (!(f > 0) || !(b > 0) || !std::isfinite(f + b + w))
      return Status::error("layer " + names[l] + " has no measured forward and backward in the run's spans");
    c.perSample.forward[l] = f / microbatch;
    c.perSample.backwardInput[l] = b / microbatch;
    c.perSample.backwardWeight[l] = w / microbatch;
  }
  return c;
}

}  // namespace ms
