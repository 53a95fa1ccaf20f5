// The hardware catalog and the device mesh. A DeviceSpec gives what the cost model needs of one accelerator
// (peak dense FLOP/s per precision, memory capacity and bandwidth); a LinkSpec gives a link's bandwidth and
// latency. A Mesh is the config's nodes resolved against the catalog (and any user-defined types in the
// config): a flat list of devices, each knowing its node, plus the intra- and inter-node links.
//
// What always holds: catalog figures are vendor datasheet numbers (dense, no sparsity), cited beside each
// entry; a Mesh's device index is global and node-major (all devices of node 0, then node 1, ...); the link
// between two devices is the intra-node link when they share a node, else the inter-node link.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "plan/run_config.h"

namespace ms {

struct DeviceSpec {
  std::string name;            // catalog key, e.g. "h100-sxm-80gb"
  std::string label;           // for people, e.g. "NVIDIA H100 SXM 80GB"
  double peakFlopsFp32 = 0;    // dense FLOP/s, fp32 (non-tensor-core for GPUs)
  double peakFlopsTf32 = 0;    // dense FLOP/s, tf32 tensor cores (0 when none)
  double peakFlopsBf16 = 0;    // dense FLOP/s, bf16 tensor cores
  double memoryBytes = 0;      // capacity
  double memoryBandwidth = 0;  // bytes/s
  // Fraction of peak a well-fed training step reaches on this device (the cost model's default efficiency;
  // calibration replaces it with measured per-layer times).
  double achievableFraction = 0.5;
  // Whether the peaks are published figures (a datasheet, or a user's own type): MFU is a fraction of a
  // published peak, so it is only stated for plans whose devices all have one. The "cpu" entry's figures are
  // placeholders (or a GEMM measured on this machine), not a peak.
  bool publishedPeak = true;
  // The host a device of this type sits in, per device (what offload uses: plan/model_state.h): the
  // device<->host link's bandwidth each way, and the device's share of the node's host memory and of its
  // DRAM bandwidth (the host's optimizer step streams its state at that rate). 0: not known (a plan that
  // offloads on such a device is refused, naming the field).
  double hostLinkBandwidth = 0;    // bytes/s each way
  double hostMemoryBytes = 0;      // bytes
  double hostMemoryBandwidth = 0;  // bytes/s
  double peakFlops(Precision p) const { return p == Precision::Bf16 ? peakFlopsBf16 : peakFlopsFp32; }
};

struct LinkSpec {
  std::string name;      // "nvlink", "pcie", "infiniband", "ethernet", "shm"
  double bandwidth = 0;  // bytes/s per direction, per device
  double latency = 0;    // seconds per message
};

// The built-in catalog.
const std::vector<DeviceSpec>& deviceCatalog();
const std::vector<LinkSpec>& linkCatalog();
std::optional<DeviceSpec> findDevice(const std::string& name);
std::optional<LinkSpec> findLink(const std::string& name);

// The "cpu" entry's figures are placeholders: the runtime measures this machine (a BLAS GEMM on the threads a
// rank uses) and replaces them with this. measuredFlops, the sustained fp32 rate, becomes the fp32 peak and
// scales the other precisions' peaks by the same ratio (their datasheet ratios to fp32 hold); memoryBytes,
// when above 0, replaces the capacity. The achievable fraction is kept: a step does more than GEMMs.
DeviceSpec withCalibration(DeviceSpec base, double measuredFlops, double memoryBytes);

// The type names a mesh config may use: the catalog's, then the config's own, in order.
std::vector<std::string> deviceTypeNames(const MeshConfig& mesh);
std::vector<std::string> linkTypeNames(const MeshConfig& mesh);
// A config's own type in the catalog's units (TFLOP/s -> FLOP/s, GB -> bytes, us -> s).
DeviceSpec toDeviceSpec(const DeviceTypeConfig& type);
LinkSpec toLinkSpec(const LinkTypeConfig& type);

struct MeshDevice {
  int index = 0;  // global, node-major
  int node = 0;   // index into Mesh::nodes
  int local = 0;  // index within its node
  DeviceSpec spec;
};

struct Mesh {
  std::vector<std::string> nodes;  // node names
  std::vector<MeshDevice> devices;
  LinkSpec intraLink;
  LinkSpec interLink;
  int deviceCount() const { return static_cast<int>(devices.size()); }
  // The link a message between two devices crosses.
  const LinkSpec& linkBetween(int a, int b) const {
    return devices[a].node == devices[b].node ? intraLink : interLink;
  }
};

// Resolves the config's mesh: a node's device and the links are looked up among the config's own types
// first, then in the catalog. Errors name the field ("/mesh/nodes/1/device: ...").
Expected<Mesh> buildMesh(const MeshConfig& mesh);

}  // namespace ms
