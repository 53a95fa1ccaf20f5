// Rank arithmetic (Megatron-Core's order tp-cp-ep-dp-pp, rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i)
// and layoutRanks(), which puts rank r on mesh device r (node-major) and says in warnings where that
// placement is slow: a TP group whose all-reduces cross nodes, ranks sharing devices, ranks on device types
// of different speeds.
//
// What always holds: groups are computed from a rank's coordinate alone, so every member of a group computes
// the same list; group members are in increasing rank order (the pipeline group is also in stage order,
// since rank grows with pp_i).
#include "plan/layout.h"

#include <algorithm>
#include <cassert>
#include <functional>
#include <set>
#include <utility>

namespace ms {

RankLayout::RankLayout(int dp, int tp, int pp, int ep, int cp)
    : m_dp(dp), m_tp(tp), m_pp(pp), m_ep(ep), m_cp(cp) {
  assert(dp >= 1 && tp >= 1 && pp >= 1 && ep >= 1 && cp >= 1 && dp * cp % ep == 0);
}

RankCoord RankLayout::coord(int rank) const {
  assert(rank >= 0 && rank < world());
  RankCoord c;
  c.tp = rank % m_tp;
  c.cp = (rank / m_tp) % m_cp;
  c.dp = (rank / (m_tp * m_cp)) % m_dp;
  c.pp = rank / (m_tp * m_cp * m_dp);
  return c;
}

std::vector<int> RankLayout::tpGroup(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> group;
  for (c.tp = 0; c.tp < m_tp; ++c.tp) group.push_back(this->rank(c));
  return group;
}

std::vector<int> RankLayout::dpGroup(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> group;
  for (c.dp = 0; c.dp < m_dp; ++c.dp) group.push_back(this->rank(c));
  return group;
}

std::vector<int> RankLayout::cpGroup(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> group;
  for (c.cp = 0; c.cp < m_cp; ++c.cp) group.push_back(this->rank(c));
  return group;
}

std::vector<int> RankLayout::dpCpGroup(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> group;
  for (int i = 0; i < m_dp * m_cp; ++i) {
    c.dp = i / m_cp;
    c.cp = i % m_cp;
    group.push_back(this->rank(c));
  }
  return group;
}

std::vector<int> RankLayout::ppGroup(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> group;
  for (c.pp = 0; c.pp < m_pp; ++c.pp) group.push_back(this->rank(c));
  return group;
}

std::vector<int> RankLayout::epGroup(int rank) const {
  RankCoord c = coord(rank);
  const int first = edpRank(c) * m_ep;
  std::vector<int> group;
  for (int i = first; i < first + m_ep; ++i) {
    c.dp = i / m_cp;
    c.cp = i % m_cp;
    group.push_back(this->rank(c));
  }
  return group;
}

std::vector<int> RankLayout::edpGroup(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> group;
  for (int i = epRank(c); i < m_dp * m_cp; i += m_ep) {
    c.dp = i / m_cp;
    c.cp = i % m_cp;
    group.push_back(this->rank(c));
  }
  return group;
}

int RankLayout::prevStageRank(int rank) const {
  RankCoord c = coord(rank);
  if (c.pp == 0) return -1;
  --c.pp;
  return this->rank(c);
}

int RankLayout::nextStageRank(int rank) const {
  RankCoord c = coord(rank);
  if (c.pp + 1 == m_pp) return -1;
  ++c.pp;
  return this->rank(c);
}

namespace {

// Past this many, the TP groups that span nodes are counted rather than listed one by one.
constexpr int kListedSpanningGroups = 4;
// More ranks than this would not fit the int arithmetic of RankLayout comfortably, nor any real cluster.
constexpr long long kMaxRanks = 1LL << 24;

std::string plural(long long n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// "node0 and node1", "node0, node1 and node2".
std::string nodeList(const Mesh& mesh, const std::set<int>& nodes) {
  std::string out;
  size_t i = 0;
  for (int n : nodes) {
    if (i > 0) out += i + 1 == nodes.size() ? " and " : ", ";
    out += mesh.nodes[static_cast<size_t>(n)];
    ++i;
  }
  return out;
}

// Why TP groups can span nodes: tp does not divide every node's device count (with device r = rank r, a TP
// group of consecutive ranks stays inside a node exactly when every node boundary falls between groups).
std::string spanReason(const Mesh& mesh, int tp) {
  std::vector<int> perNode(mesh.nodes.size(), 0);
  for (const auto& d : mesh.devices) ++perNode[static_cast<size_t>(d.node)];
  const bool uneven =
      std::adjacent_find(perNode.begin(), perNode.end(), std::not_equal_to<>()) != perNode.end();
  if (uneven) return "the nodes have different device counts";
  return "tp (" + std::to_string(tp) + ") does not divide the " +
         plural(perNode.front(), "device", "devices") + " per node";
}

void warnTpGroupsSpanningNodes(const RankLayout& layout, const Mesh& mesh,
                               std::vector<std::string>& warnings) {
  if (layout.tp() < 2) return;
  std::vector<std::string> spanning;
  for (int first = 0; first < layout.world(); first += layout.tp()) {
    std::set<int> nodes;
    for (int r : layout.tpGroup(first))
      nodes.insert(mesh.devices[static_cast<size_t>(layout.deviceOf[r])].node);
    if (nodes.size() > 1)
      spanning.push_back("TP group " + std::to_string(first / layout.tp()) + " (ranks " +
                         std::to_string(first) + ".." + std::to_string(first + layout.tp() - 1) +
                         ") spans nodes " + nodeList(mesh, nodes));
  }
  if (spanning.empty()) return;
  const std::string why = ": its all-reduces cross the inter-node link (" + mesh.interLink.name + ")";
  const size_t listed = std::min(spanning.size(), static_cast<size_t>(kListedSpanningGroups));
  for (size_t i = 0; i < listed; ++i) warnings.push_back(spanning[i] + why);
  if (spanning.size() > listed)
    warnings.push_back(
        "... and " +
        plural(static_cast<long long>(spanning.size() - listed), "more TP group", "more TP groups") +
        " span nodes");
  warnings.push_back("TP groups span nodes because " + spanReason(mesh, layout.tp()) +
                     "; a tp that divides every node's device count keeps each group inside one node");
}

void warnMixedDeviceTypes(const RankLayout& layout, const Mesh& mesh, std::vector<std::string>& warnings) {
  std::vector<std::string> types;  // in order of first use
  for (int device : layout.deviceOf) {
    const std::string& name = mesh.devices[static_cast<size_t>(device)].spec.name;
    if (std::find(types.begin(), types.end(), name) == types.end()) types.push_back(name);
  }
  if (types.size() < 2) return;
  std::string list;
  for (size_t i = 0; i < types.size(); ++i) list += (i ? ", " : "") + types[i];
  warnings.push_back("ranks run on different device types (" + list + "): the slowest sets the pace");
}

}  // namespace

Expected<LayoutResult> layoutRanks(const ParallelConfig& parallel, const Mesh& mesh, bool allowSharing) {
  for (const auto& [key, value] :
       {std::pair{"dp", parallel.dp}, {"tp", parallel.tp}, {"pp", parallel.pp}, {"cp", parallel.cp}})
    if (value < 1)
      return Status::error(std::string("/parallel/") + key + ": must be >= 1, got " + std::to_string(value));
  const long long world = parallel.ranks();
  const int devices = mesh.deviceCount();
  if (devices == 0) return Status::error("/mesh/nodes: the mesh has no devices");
  if (world > devices && !allowSharing)
    return Status::error("/parallel: " + parallel.ranksText() + " = " + plural(world, "rank", "ranks") +
                         " need " + plural(world, "device", "devices") + "; the mesh has " +
                         std::to_string(devices));
  if (world > kMaxRanks)  // only reachable with sharing: a mesh this large cannot be described
    return Status::error("/parallel: " + parallel.ranksText() + " = " + std::to_string(world) +
                         " ranks; at most " + std::to_string(kMaxRanks) + " can be laid out");

  LayoutResult result;
  if (parallel.ep < 1 || parallel.dataReplicas() % parallel.ep != 0)
    return Status::error("/parallel/ep: must be >= 1 and divide dp * cp (" +
                         std::to_string(parallel.dataReplicas()) + "), got " + std::to_string(parallel.ep));
  result.layout = RankLayout(parallel.dp, parallel.tp, parallel.pp, parallel.ep, parallel.cp);
  RankLayout& layout = result.layout;
  layout.deviceOf.resize(static_cast<size_t>(world));
  for (int r = 0; r < layout.world(); ++r) layout.deviceOf[static_cast<size_t>(r)] = r % devices;

  if (world > devices)
    result.warnings.push_back(plural(world, "rank shares", "ranks share") + " " +
                              plural(devices, "device", "devices") + " (up to " +
                              std::to_string((world + devices - 1) / devices) +
                              " per device): they share its compute and memory");
  warnTpGroupsSpanningNodes(layout, mesh, result.warnings);
  warnMixedDeviceTypes(layout, mesh, result.warnings);
  return result;
}

}  // namespace ms
