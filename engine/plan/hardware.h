// The hardware catalog and the device mesh. A DeviceSpec gives what the cost model needs of one accelerator
// (peak dense FLOP/s per precision, memory capacity and bandwidth); a LinkSpec gives a link's bandwidth and
// latency. A Mesh is the config's nodes resolved against the catalog (and any user-defined types in the
// config): a flat list of devices, each knowing its node, plus the intra- and inter-node links.
//
// What always holds: catalog figures are vendor datasheet numbers (dense, no sparsity), cited beside each
// entry; a Mesh's device index is global and node-major (all devices of node 0, then node 1, ...); the link
// between two devices is the intra-node link when they share a node, else the inter-node link.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "plan/device_profile.h"
#include "plan/gpu_kernel_model.h"
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
  // Fraction of peak a well-fed training step reaches on this device: the cost model's efficiency for a
  // device without a kernel model or a profile (a config's own types), and for a layer without kernel shapes;
  // calibration replaces it with measured per-layer times.
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
  // A measured device (mesh.profiles): the cost model then times GEMMs, attention, elementwise passes and
  // the optimizer step from the profile's curves, and the figures above are the profile's best measured
  // rates (publishedPeak false). Null for catalog and user-described types.
  std::shared_ptr<const DeviceProfile> profile;
  // A catalog GPU's kernels by shape (plan/gpu_kernel_model.h): GEMMs by wave and tile quantisation of the
  // published achievable matmul rate, attention, elementwise passes and the optimizer step at measured
  // fractions of the peak and of the memory bandwidth. Null for the cpu entry and for a config's own types.
  std::shared_ptr<const GpuKernelModel> kernels;
};

struct LinkSpec {
  std::string name;      // "nvlink", "pcie", "infiniband", "ethernet", "shm"
  double bandwidth = 0;  // bytes/s per direction of one port (a device's own under perDevice)
  double latency = 0;    // seconds per message
  // A measured link (a profile's "<profile>.<link>"): the communication formulas of plan/cost_model.h then
  // read its curves (LinkProfile::seconds); bandwidth and latency above are its largest all-reduce's bus
  // bandwidth and its smallest message's one-way time, for display. Null otherwise.
  std::shared_ptr<const LinkProfile> profile;
  // Every device has its own port of this link ("rails": DGX H100's one InfiniBand NIC per GPU), so a ring
  // collective over several devices of each node crosses nodes through all their ports at once (ringLink,
  // plan/cost_model.h); false: the node's devices share one port, whose bandwidth is the figure above.
  bool perDevice = false;
};

// The built-in catalog.
const std::vector<DeviceSpec>& deviceCatalog();
const std::vector<LinkSpec>& linkCatalog();
std::optional<DeviceSpec> findDevice(const std::string& name);
std::optional<LinkSpec> findLink(const std::string& name);

// The type names a mesh config may use: the catalog's, then the config's own, in order.
std::vector<std::string> deviceTypeNames(const MeshConfig& mesh);
std::vector<std::string> linkTypeNames(const MeshConfig& mesh);
// A config's own type in the catalog's units (TFLOP/s -> FLOP/s, GB -> bytes, us -> s).
DeviceSpec toDeviceSpec(const DeviceTypeConfig& type);
LinkSpec toLinkSpec(const LinkTypeConfig& type);
// A loaded profile's device type (named `name`) and its link `link` (named "<name>.<link>"); nullopt when the
// profile measured no such link.
DeviceSpec toDeviceSpec(const std::string& name, const std::shared_ptr<const DeviceProfile>& profile);
std::optional<LinkSpec> toLinkSpec(const std::string& name,
                                   const std::shared_ptr<const DeviceProfile>& profile,
                                   const std::string& link);

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
