// Ranks and their groups. A run has world = dp * cp * tp * pp ranks; rank order puts tensor-parallel peers
// closest, then context-parallel, then data-parallel (expert-parallel inside it), then pipeline: Megatron-
// Core's default order "tp-cp-ep-dp-pp", rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i. The groups
// that move the most bytes per step sit on the fastest links: tp's all-reduces of every block's activations
// inside a node first, cp's ring exchange of keys and values (once per block, overlapped with attention)
// next, then the gradient all-reduce of dp and the small point-to-point messages of pp across nodes. Every
// rank derives its groups from this arithmetic alone, so all ranks agree without talking.
//
// What always holds: coord(rank(c)) == c; each TP group has tp members with consecutive ranks; each rank's
// groups list their members in increasing rank order; deviceOf maps every rank to one mesh device, and no two
// ranks to the same device unless the layout was built with sharing allowed (the CPU engine runs more ranks
// than it has cores that way).
#pragma once

#include <vector>

#include "common/status.h"
#include "plan/hardware.h"
#include "plan/run_config.h"

namespace ms {

struct RankCoord {
  int dp = 0;
  int tp = 0;
  int pp = 0;
  int cp = 0;
  bool operator==(const RankCoord&) const = default;
};

class RankLayout {
 public:
  RankLayout() = default;
  // cp: context-parallel ways; the cp ranks of one replica hold the slices of the same samples, so for the
  // parameters they are data-parallel ranks too (dpCpGroup: the gradient all-reduce and ZeRO's sharding
  // group, Megatron-Core's data-parallel group "with context parallelism").
  // ep: expert-parallel ways, dividing dp x cp (Megatron-Core carves expert parallelism out of those ranks:
  // an expert layer's ranks are tp x ep x edp with ep x edp = dp x cp; a mixture of experts sees a slice's
  // tokens like any others). ep is the inner part of the dp x cp index (dpCpRank), as in Megatron-Core's
  // default order tp-cp-ep-dp-pp: the ranks that exchange tokens are the nearest ones (index d is
  // expert-parallel rank d % ep of expert-data-parallel rank d / ep); with cp 1 that is the dp index.
  RankLayout(int dp, int tp, int pp, int ep = 1, int cp = 1);
  int dp() const { return m_dp; }
  int ep() const { return m_ep; }
  int edp() const { return m_dp * m_cp / m_ep; }  // replicas of each expert
  int epRank(const RankCoord& c) const { return dpCpRank(c) % m_ep; }
  int edpRank(const RankCoord& c) const { return dpCpRank(c) / m_ep; }
  int tp() const { return m_tp; }
  int pp() const { return m_pp; }
  int cp() const { return m_cp; }
  int world() const { return m_dp * m_cp * m_tp * m_pp; }
  int rank(const RankCoord& c) const { return ((c.pp * m_dp + c.dp) * m_cp + c.cp) * m_tp + c.tp; }
  // A rank's index in its dpCpGroup (dp-major): the data-parallel rank of its parameter store.
  int dpCpRank(const RankCoord& c) const { return c.dp * m_cp + c.cp; }
  RankCoord coord(int rank) const;
  std::vector<int> tpGroup(int rank) const;    // same dp, cp and pp
  std::vector<int> dpGroup(int rank) const;    // same tp, cp and pp: the replicas of one sequence slice
  std::vector<int> cpGroup(int rank) const;    // same dp, tp and pp: ring attention's ring, cp order
  std::vector<int> dpCpGroup(int rank) const;  // same tp and pp: every replica of the parameters
  std::vector<int> ppGroup(int rank) const;    // same dp, cp and tp: the pipeline, stage order
  std::vector<int> epGroup(int rank) const;    // same tp, pp and edp rank: the experts' all-to-all
  std::vector<int> edpGroup(int rank) const;   // same tp, pp and ep rank: one expert's replicas
  // Pipeline neighbours of a rank (-1 at the ends).
  int prevStageRank(int rank) const;
  int nextStageRank(int rank) const;
  // Mesh device of each rank (filled by layoutRanks).
  std::vector<int> deviceOf;

 private:
  int m_dp = 1, m_tp = 1, m_pp = 1, m_ep = 1, m_cp = 1;
};

// Lays the ranks of the config's parallel layout onto the mesh's devices: rank r goes to device r in
// node-major order, which keeps each TP group inside one node whenever tp divides the devices per node (the
// placement says so in warnings otherwise). More ranks than devices is an error naming /parallel and both
// numbers, unless allowSharing (CPU runs), in which case ranks wrap around the devices.
struct LayoutResult {
  RankLayout layout;
  std::vector<std::string> warnings;  // e.g. "TP group 3 spans nodes node0 and node1"
};
Expected<LayoutResult> layoutRanks(const ParallelConfig& parallel, const Mesh& mesh,
                                   bool allowSharing = false);

}  // namespace ms
