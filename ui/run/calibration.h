// Calibration from a run: the per-layer compute times a run measured (its spans), turned into the cost
// model's per-sample LayerTimes, so the studio's predictions use what this machine really took (Run >
// Calibrate Plan from Run). The run's config says the microbatch size the spans were timed at.
//
// What always holds: every time is the median over the recorded steps (the run's first step, with its one-off
// allocations, is left out when later ones exist) and over the ranks, of one layer's F, B or W spans; W is 0
// for a layer that ran no separate weight pass (its B is the whole backward); every time is finite and > 0
// for F and B, else the result is an error naming the layer.
#pragma once

#include <QString>

#include "common/status.h"
#include "plan/run_config.h"
#include "ui/models/plan_analysis.h"
#include "ui/run/run_data.h"

namespace ms {

Expected<Calibration> calibrationFromRun(const RunData& data, const RunConfig& runConfig,
                                         const QString& source);

}  // namespace ms
