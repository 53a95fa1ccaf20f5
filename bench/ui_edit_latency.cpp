// bench_ui_edit_latency: how the studio answers on every template, from 1 to 16384 ranks, through the real
// MainWindow (1600 x 1000, offscreen or a real X server):
//   open:  File > New with the template until the window has painted its plan (first paint);
//   edit:  an edit (microbatches toggled between two valid values) until the window has painted the new plan;
//   stall: the longest the GUI thread was busy in one go meanwhile: the edit call itself (the document, the
//          canvas, the inspector and the layer table react synchronously), each event, each repaint. This is
//          what a person feels: the window answers within a stall.
// Each figure is printed with its ratio to a budget: 100 ms for a stall (the issue's "window answering within
// 100 ms"), and, as the reference measured in the same run, the analysis itself (analyzePlan on the
// analyzer's worker thread, timed there: what open and edit wait for while the window answers).
// Run: QT_QPA_PLATFORM=offscreen build/bench/bench_ui_edit_latency [--edits N] [--only KEY]
#include <QApplication>
#include <QElapsedTimer>
#include <algorithm>
#include <cstdio>
#include <vector>

#include "ui/models/plan_analysis.h"
#include "ui/models/project_document.h"
#include "ui/views/main_window.h"

namespace {

constexpr double kStallBudgetMs = 100;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double worst(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

double elapsedMs(const QElapsedTimer& t) {
  return double(t.nsecsElapsed()) / 1e6;
}

// Runs the event loop in short slices until done() holds; returns the longest slice (a stall).
template <class Done>
double pumpUntil(Done done) {
  double longest = 0;
  while (!done()) {
    QElapsedTimer slice;
    slice.start();
    QApplication::processEvents(QEventLoop::AllEvents, 5);
    longest = std::max(longest, elapsedMs(slice));
  }
  return longest;
}

}  // namespace

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  int edits = 10;
  QString only;
  for (int i = 1; i + 1 < argc; ++i) {
    if (QString(argv[i]) == "--edits") edits = std::max(2, QString(argv[i + 1]).toInt());
    if (QString(argv[i]) == "--only") only = QString(argv[i + 1]);
  }
  std::printf("%-9s %6s %9s | %9s %9s | %9s %9s | %9s %7s | %11s\n", "template", "ranks", "spans", "open ms",
              "edit ms", "worst ms", "paint ms", "stall ms", "/100ms", "analysis ms");
  double worstStallAll = 0;
  for (const ms::ProjectTemplate& t : ms::projectTemplates()) {
    if (!only.isEmpty() && t.key != only) continue;
    ms::MainWindow w;
    w.resize(1600, 1000);
    w.show();
    auto settled = [&] {
      return w.snapshot() && !w.analyzer()->busy() && w.snapshot()->config == w.document()->config();
    };
    QApplication::processEvents();
    // Open: the template's config through File > New, until its plan is painted.
    QElapsedTimer open;
    open.start();
    QElapsedTimer call;
    call.start();
    if (!w.newProject(t.key)) {
      std::fprintf(stderr, "%s: %s\n", qPrintable(t.key), qPrintable(w.lastError()));
      return 1;
    }
    double stall = elapsedMs(call);
    stall = std::max(stall, pumpUntil(settled));
    QElapsedTimer paint;
    paint.start();
    w.repaint();
    stall = std::max(stall, elapsedMs(paint));
    const double openMs = elapsedMs(open);

    const int base = w.document()->config().parallel.microbatches;
    // Two values that are both valid: the base and half of it (or double it when it is odd).
    const int other = base % 2 == 0 ? base / 2 : base * 2;
    std::vector<double> total, paints, reference;
    for (int e = 0; e < edits; ++e) {
      const int value = e % 2 == 0 ? other : base;
      QElapsedTimer edit;
      edit.start();
      QElapsedTimer editCall;
      editCall.start();
      w.document()->edit("microbatches", [value](ms::RunConfig& c) { c.parallel.microbatches = value; });
      stall = std::max(stall, elapsedMs(editCall));
      stall = std::max(stall, pumpUntil(settled));
      QElapsedTimer repaint;
      repaint.start();
      w.repaint();  // the frame that shows the edit, painted synchronously
      paints.push_back(elapsedMs(repaint));
      stall = std::max(stall, paints.back());
      total.push_back(elapsedMs(edit));
      reference.push_back(w.snapshot()->millis);  // the analysis on its worker thread
    }
    const auto snap = w.snapshot();
    worstStallAll = std::max(worstStallAll, stall);
    std::printf("%-9s %6d %9zu | %9.0f %9.0f | %9.0f %9.1f | %9.1f %7.2f | %11.0f\n", qPrintable(t.key),
                snap->plan->layout.world(), snap->timeline.spanCount(), openMs, median(total), worst(total),
                median(paints), stall, stall / kStallBudgetMs, median(reference));
  }
  std::printf(
      "\nopen: File > New until the plan is painted; edit: median edit-to-painted (worst beside it); paint: "
      "the\n"
      "repaint of the whole window showing the edit; stall: the longest the GUI thread was busy in one go\n"
      "(edit calls, events, repaints), /100ms its ratio to the budget; analysis: the median analysis of the\n"
      "edits, timed on the analyzer's worker thread (the reference: what an edit waits for off the GUI thread).\n"
      "worst stall over every template: %.1f ms (%.2f of the budget)\n",
      worstStallAll, worstStallAll / kStallBudgetMs);
  return 0;
}
