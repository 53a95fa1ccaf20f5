// Parameter-server mode's placement of the parameters: which layers each server holds. Shared by the engine's
// servers and workers (engine/runtime/ps_*.cpp), which must agree on it, and by the studio's predictions.
//
// What always holds: every layer is on exactly one server, whole (a layer's parameters are one unit of the
// ParameterStore, runtime/parameters.h, so a server's shard is a ParameterStore over its layers); the
// assignment depends only on the model spec and the server count.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "plan/model_spec.h"
#include "plan/run_config.h"

namespace ms {

struct ServerShards {
  std::vector<std::vector<int>> layers;  // (servers): model layer indices, ascending
  std::vector<int64_t> params;           // (servers): parameters held
};

// Greedy by bytes, heaviest layer first onto the server holding the fewest parameters so far (Graham's
// longest-processing-time rule, 1969: within 4/3 of the best balance), ties to the lower index. A tied GPT's
// LM head (no parameters of its own: it reads wte.weight) goes with the embedding. Refuses more servers than
// layers with parameters, naming /parallel/servers.
Expected<ServerShards> assignServers(const ModelSpec& spec, const RunConfig& config);

// The mesh node (index into mesh.nodes) of server s: parallel.server_nodes[s] when given, else s mod nodes.
int serverNode(const RunConfig& config, int server);

// The mesh node of worker w: the node of device w, devices numbered node by node in mesh order (as the plan
// lays out ranks, plan/layout.h). Workers beyond the mesh's devices (refused by the config checks) wrap.
int workerNode(const RunConfig& config, int worker);

}  // namespace ms
