// Helpers for the GUI suites that drive the real MainWindow.
#pragma once

#include <QtTest>

#include "ui/views/main_window.h"

namespace ms::test {

// Waits (at most 10 s) until the window's analysis is current: a snapshot of the document's config, the
// analyzer idle.
inline bool waitForSnapshot(ms::MainWindow& w) {
  return QTest::qWaitFor(
      [&] { return w.snapshot() && !w.analyzer()->busy() && w.snapshot()->config == w.document()->config(); },
      10000);
}

}  // namespace ms::test
