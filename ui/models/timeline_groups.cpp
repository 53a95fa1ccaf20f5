// Timeline groups; see timeline_groups.h.
#include "ui/models/timeline_groups.h"

#include <algorithm>
#include <map>

namespace ms {

namespace {

// When a row's work ends: the latest span end (spans are sorted by start, not by end).
double rowEnd(const TimelineRow& row) {
  double end = 0;
  for (const TimelineSpan& s : row.spans) end = std::max(end, s.end);
  return end;
}

}  // namespace

TimelineGroups::TimelineGroups(const TimelineData& data, const std::set<int>& expandedStages) {
  std::map<int, int> groupOfStage;
  m_groupOfRow.assign(data.rows.size(), -1);
  for (int r = 0; r < static_cast<int>(data.rows.size()); ++r) {
    const int stage = data.rows[static_cast<size_t>(r)].stage;
    auto [it, inserted] = groupOfStage.try_emplace(stage, 0);
    if (inserted) {
      it->second = static_cast<int>(m_groups.size());
      m_groups.push_back(TimelineGroup{stage, {}, -1, -1, -1});
    }
    m_groups[static_cast<size_t>(it->second)].rows.push_back(r);
  }
  // Stage order, whatever the data's row order.
  std::sort(m_groups.begin(), m_groups.end(),
            [](const TimelineGroup& a, const TimelineGroup& b) { return a.stage < b.stage; });
  for (int g = 0; g < static_cast<int>(m_groups.size()); ++g) {
    TimelineGroup& group = m_groups[static_cast<size_t>(g)];
    double latest = -1;
    for (int r : group.rows) {
      m_groupOfRow[static_cast<size_t>(r)] = g;
      const TimelineRow& row = data.rows[static_cast<size_t>(r)];
      const double end = rowEnd(row);
      if (end > latest) latest = end, group.representative = r;
      if (row.bubbleFraction >= 0) {
        group.bubbleMin =
            group.bubbleMin < 0 ? row.bubbleFraction : std::min(group.bubbleMin, row.bubbleFraction);
        group.bubbleMax = std::max(group.bubbleMax, row.bubbleFraction);
      }
    }
    if (group.rows.size() == 1) {
      m_display.push_back({group.rows.front(), g, false, false});
      continue;
    }
    m_grouping = true;
    m_display.push_back({group.representative, g, true, false});
    if (expandedStages.count(group.stage))
      for (int r : group.rows) m_display.push_back({r, g, false, true});
  }
}

int TimelineGroups::displayRowOf(int dataRow) const {
  if (dataRow < 0 || dataRow >= static_cast<int>(m_groupOfRow.size())) return -1;
  const int group = m_groupOfRow[static_cast<size_t>(dataRow)];
  int header = -1;
  for (int i = 0; i < displayRowCount(); ++i) {
    const TimelineDisplayRow& d = m_display[static_cast<size_t>(i)];
    if (d.group != group) continue;
    if (d.dataRow == dataRow && !d.header) return i;
    if (d.header && header < 0) header = i;
  }
  return header;
}

}  // namespace ms
