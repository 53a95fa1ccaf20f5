// Parameter-server placement; see parameter_server.h.
#include "plan/parameter_server.h"

#include <algorithm>
#include <numeric>
#include <string>

namespace ms {

Expected<ServerShards> assignServers(const ModelSpec& spec, const RunConfig& config) {
  const int S = std::max(1, config.parallel.servers);
  const int L = static_cast<int>(spec.layers.size());
  std::vector<int> order(L);
  std::iota(order.begin(), order.end(), 0);
  int withParams = 0;
  for (const LayerSpec& l : spec.layers) withParams += l.paramCount() > 0 ? 1 : 0;
  if (S > withParams)
    return Status::error("/parallel/servers: " + std::to_string(S) + " servers, but only " +
                         std::to_string(withParams) +
                         " layers of the model hold parameters and a layer stays whole on one server; use at "
                         "most " +
                         std::to_string(withParams));
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return spec.layers[a].paramCount() > spec.layers[b].paramCount(); });
  ServerShards out;
  out.layers.assign(S, {});
  out.params.assign(S, 0);
  const bool tiedHead = config.model.tiedHead() && L > 1;
  for (int layer : order) {
    if (tiedHead && layer == L - 1) continue;
    const int s =
        static_cast<int>(std::min_element(out.params.begin(), out.params.end()) - out.params.begin());
    out.layers[s].push_back(layer);
    out.params[s] += spec.layers[layer].paramCount();
  }
  if (tiedHead)
    for (int s = 0; s < S; ++s)
      if (std::find(out.layers[s].begin(), out.layers[s].end(), 0) != out.layers[s].end()) {
        out.layers[s].push_back(L - 1);
        out.params[s] += spec.layers[L - 1].paramCount();
      }
  for (auto& l : out.layers) std::sort(l.begin(), l.end());
  return out;
}

int serverNode(const RunConfig& config, int server) {
  const auto& nodes = config.mesh.nodes;
  if (nodes.empty()) return 0;
  const auto& names = config.parallel.serverNodes;
  if (server >= 0 && server < static_cast<int>(names.size()))
    for (size_t n = 0; n < nodes.size(); ++n)
      if (nodes[n].name == names[static_cast<size_t>(server)]) return static_cast<int>(n);
  return server % static_cast<int>(nodes.size());
}

int workerNode(const RunConfig& config, int worker) {
  const auto& nodes = config.mesh.nodes;
  int devices = 0;
  for (const NodeConfig& n : nodes) devices += std::max(0, n.count);
  if (nodes.empty() || devices == 0) return 0;
  int w = worker % devices;
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (w < nodes[n].count) return static_cast<int>(n);
    w -= std::max(0, nodes[n].count);
  }
  return 0;
}

}  // namespace ms
