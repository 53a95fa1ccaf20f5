// The memory view: a plan's predicted peak memory per rank as stacked bars (parameters, gradients, optimizer
// state, activations, other) against each rank's device capacity, with measured peaks beside them once a run
// reports them. With offload (plan/model_state.h) a hatched bar left of each stack shows what the rank keeps
// in HOST memory (not part of the device's total or its capacity line). A rank that does not fit is drawn in
// red (outline, tick label, "does not fit") so the reason a plan is refused is visible at a glance.
//
// What always holds: bar heights are the MemoryBreakdown categories divided by unitBytes() (the binary unit
// byteUnitFor() picks for the largest figure, named in the axis label); with more than kGroupAbove ranks
// there is one bar per pipeline stage
// ("stage s (N ranks)": ranks of a stage differ only by device, so the bar shows the stage's largest figures
// and its smallest capacity, and overflows when any of its ranks does); rankShownAsOverflow(r) is exactly
// "rank r's bar is drawn red", which holds exactly for the ranks whose stage bar contains a rank that does
// not fit (without grouping: the rank itself).
#pragma once

#include <QString>
#include <QStringList>
#include <QWidget>
#include <array>
#include <vector>

#include "plan/memory_model.h"
#include "plan/model_state.h"

class QCustomPlot;
class QCPBars;
class QCPGraph;

namespace ms {

class OutdatedOverlay;

class MemoryView : public QWidget {
  Q_OBJECT
 public:
  enum Category { Parameters, Gradients, Optimizer, Activations, Other, NUM_CATEGORIES };
  static constexpr int kGroupAbove = 64;

  explicit MemoryView(QWidget* parent = nullptr);

  // The plan's figures, one per rank in rank order (empty: clears the view and says there is no plan).
  // Measured peaks already set stay while the number of ranks is the same.
  // names: one per entry in place of "rank r" (parameter-server mode's "worker w", "server s"); groupNames:
  // per MemoryBreakdown::stage, in place of "stage s" for grouped bars. A capacity that is not finite is
  // not known: no capacity line for that bar.
  void setPredicted(const std::vector<MemoryBreakdown>& memory, const QStringList& names = {},
                    const QStringList& groupNames = {});
  // Measured peak bytes per rank, drawn beside the predicted bars; empty clears them. False (and nothing
  // drawn) when the count does not match the predicted ranks: message() says why.
  bool setMeasured(const std::vector<double>& peakBytesPerRank);

  QCustomPlot* plot() const { return m_plot; }
  QCPBars* bars(Category category) const { return m_bars[category]; }
  QCPBars* measuredBars() const { return m_measured; }
  // Host memory per bar (offload), in unitBytes(); no data without offload.
  QCPBars* hostBars() const { return m_host; }
  QCPGraph* capacityGraph() const { return m_capacity; }

  int rankCount() const { return static_cast<int>(m_memory.size()); }
  bool grouped() const { return m_grouped; }
  int barCount() const { return static_cast<int>(m_barData.size()); }
  int barOfRank(int rank) const;
  QString barLabel(int bar) const;
  // "MiB" or "GiB" and the bytes in one of them.
  QString unitName() const { return m_unitName; }
  double unitBytes() const { return m_unitBytes; }
  bool rankShownAsOverflow(int rank) const;
  // The text a tooltip shows for a bar: every category (the model states with their bytes-per-parameter
  // arithmetic, once setModelStates gave it), the total, the capacity and the measured peak.
  QString barToolTip(int bar) const;
  // The plan's bytes per parameter of each model-state category (plan/model_state.h modelStateText), for the
  // tooltips: "2 B bf16 working parameters", "4 B fp32 master + 8 B AdamW moments / 64 ranks (ZeRO-1)...".
  void setModelStates(const ModelStateText& text);
  // A note shown above the plot (a capacity off the scale, a measured count that does not match), or empty.
  QString message() const { return m_message; }
  static QString categoryName(Category category);
  // The chart's title (empty: "Predicted peak memory", or "Peak memory, predicted and measured" once
  // measured peaks are set), followed by "per rank" or "per stage".
  void setTitle(const QString& title);
  // Marks the figures as not the current plan's (a reason over the chart), or current (empty).
  void setOutdated(const QString& reason);
  QString outdatedReason() const;

  // The chart as a PNG: the layout of a width x height window (0: the view's own size), at dpi (0: one image
  // pixel per screen pixel; 300: print resolution).
  bool savePng(const QString& path, int width = 0, int height = 0, double dpi = 0);
  bool savePdf(const QString& path, int width = 0, int height = 0);

 protected:
  bool eventFilter(QObject* watched, QEvent* event) override;

 private:
  // One bar: the figures it shows (a rank's, or a stage's largest with its smallest capacity).
  struct Bar {
    std::vector<int> ranks;
    MemoryBreakdown figures;
    bool overflow = false;
    double measured = -1;  // bytes, < 0 when none
  };
  void rebuild();
  void buildBars();
  int barAtPixel(QPoint pos) const;

  QCustomPlot* m_plot = nullptr;
  std::array<QCPBars*, NUM_CATEGORIES> m_bars{};
  QCPBars* m_measured = nullptr;
  QCPBars* m_host = nullptr;
  QCPGraph* m_capacity = nullptr;
  std::vector<MemoryBreakdown> m_memory;
  QStringList m_names, m_groupNames;  // setPredicted
  std::vector<double> m_measuredPeaks;
  std::vector<Bar> m_barData;
  std::vector<int> m_barOfRank;
  bool m_grouped = false;
  QString m_unitName = QStringLiteral("MiB");
  double m_unitBytes = 1024.0 * 1024.0;
  QString m_message;
  ModelStateText m_states;
  QString m_title;
  OutdatedOverlay* m_overlay = nullptr;
};

}  // namespace ms
