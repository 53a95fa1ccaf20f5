// Which rows a timeline shows: a plan of thousands of ranks has only a handful of pipeline stages, and the
// ranks of one stage run the same schedule, so the view shows one row per stage (a group) and lists a stage's
// ranks only when the person expands it, as Perfetto groups a process's threads under one track. A group row
// draws the spans of its representative: the rank that finishes last (on a predicted timeline all of a
// stage's ranks are alike; on a measured one that rank is the stage's critical path).
//
// What always holds: every data row belongs to exactly one group (its stage); groups are in stage order and
// their rows in data order; a group of one row is shown as that row alone (no header); a collapsed group is
// one display row, an expanded group of n rows is n + 1 (its header, then its rows); the display rows are a
// pure function of the data and the set of expanded stages.
#pragma once

#include <set>
#include <vector>

#include "ui/models/timeline_data.h"

namespace ms {

struct TimelineGroup {
  int stage = 0;
  std::vector<int> rows;                  // data rows of this stage, in data order
  int representative = -1;                // the data row whose spans the group row draws
  double bubbleMin = -1, bubbleMax = -1;  // over the rows with a known bubble; < 0 when none
};

struct TimelineDisplayRow {
  int dataRow = -1;     // the row whose spans this display row draws
  int group = -1;       // index into TimelineGroups::groups()
  bool header = false;  // the summary row of a group of several rows
  bool member = false;  // a row listed under an expanded group's header
};

class TimelineGroups {
 public:
  TimelineGroups() = default;
  // Groups the data's rows by stage; `expandedStages` lists the stages whose rows are listed.
  TimelineGroups(const TimelineData& data, const std::set<int>& expandedStages);

  const std::vector<TimelineGroup>& groups() const { return m_groups; }
  const std::vector<TimelineDisplayRow>& displayRows() const { return m_display; }
  int displayRowCount() const { return static_cast<int>(m_display.size()); }
  // The first display row that draws data row r (its group's header while collapsed), -1 when none.
  int displayRowOf(int dataRow) const;
  // True when some group has several rows (the view then has something to expand).
  bool grouping() const { return m_grouping; }

 private:
  std::vector<TimelineGroup> m_groups;
  std::vector<TimelineDisplayRow> m_display;
  std::vector<int> m_groupOfRow;  // per data row
  bool m_grouping = false;
};

}  // namespace ms
