// The README's screenshots, rendered from the real window: `meshstudio --screenshots DIR` (scripts/
// screenshots.sh runs it offscreen). It opens the 8-GPU example, places a layer as a drop would, grabs the
// plan tab, the predicted timeline and the memory bars, then runs a small 2-stage plan on this machine's CPUs
// and grabs the run tab with its live curves. Returns the process exit code (0 ok, 1 with the reason
// printed).
#pragma once

#include <QString>

namespace ms {

int takeScreenshots(const QString& dir, const QString& sourceDir);

}  // namespace ms
