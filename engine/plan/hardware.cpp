// The hardware catalog and buildMesh(). Every figure below is a vendor datasheet number for dense math (no
// structured sparsity); the comment beside each entry names the document. Capacities are the vendor's GB
// (1e9 bytes: "80GB" is 80e9 bytes here), bandwidths the vendor's GB/s (1e9 bytes/s).
//
// What always holds: catalog names are unique and every figure is positive (tf32 may be 0: no such units);
// buildMesh() numbers devices node-major and looks a name up among the config's own types before the
// catalog's (validation refuses a config type that shadows a catalog name, so the order only matters for
// meshes that never went through it).
#include "plan/hardware.h"

#include <algorithm>

#include "plan/config_schema.h"

namespace ms {

namespace {

constexpr double kTera = 1e12;  // TFLOP/s -> FLOP/s
constexpr double kGiga = 1e9;   // GB -> bytes, GB/s -> bytes/s
constexpr double kGibi = 1024.0 * 1024.0 * 1024.0;
constexpr double kMicro = 1e-6;  // us -> s

// Fraction of the dense peak a well-fed training step reaches, for a layer without kernel shapes (none of
// the built-in models' layers lacks them since the cnn's convolutions are listed as GEMMs). GPUs: ~50% model
// FLOPs utilisation for transformer training (Narayanan et al. 2021, "Efficient Large-Scale Language Model
// Training on GPU Clusters": 44-52% of A100 peak; Korthikanti et al. 2022, "Reducing Activation Recomputation
// in Large Transformer Models": 54-56%). CPU: its "peak" is a measured GEMM rate, which a step's GEMMs mostly
// reach.
constexpr double kGpuFraction = 0.5;
constexpr double kCpuFraction = 0.7;

DeviceSpec device(const char* name, const char* label, double fp32, double tf32, double bf16, double memoryGb,
                  double bandwidthGbs, double fraction) {
  DeviceSpec d;
  d.name = name;
  d.label = label;
  d.peakFlopsFp32 = fp32 * kTera;
  d.peakFlopsTf32 = tf32 * kTera;
  d.peakFlopsBf16 = bf16 * kTera;
  d.memoryBytes = memoryGb * kGiga;
  d.memoryBandwidth = bandwidthGbs * kGiga;
  d.achievableFraction = fraction;
  return d;
}

// The kernel model of a catalog GPU (plan/gpu_kernel_model.h).
// GEMM: Bekman, "Machine Learning Engineering" (github.com/stas00/ml-engineering), compute/accelerator,
// "Maximum Achievable Matmul FLOPS comparison table" (BF16 matmul, mamf-finder.py): A100 SXM 267.9 of 312
// TFLOPS (85.9%), H100 SXM 792.1 of 989 (80.1%); the table has no L40S or RTX 4090 row, so those two take
// kAssumedGemmEfficiency, an assumption near the measured ones, not a measurement. SMs: NVIDIA H100
// whitepaper (H100 SXM5: 132 SMs; the H200 is the same GH100 configuration), A100 whitepaper (108), Ada
// whitepaper (RTX 4090: 128) and L40S datasheet (18,176 CUDA cores, 128 per SM: 142).
// The rest was measured on an H100 80GB HBM3 with PyTorch's kernels (docs/gpu-logs/
// 2026-11-26b-h100-profile-torch.txt, GPT-2 124M in bf16, batch 8 x 1024) and is applied to every catalog
// GPU (an assumption for the others):
//   attention: cuDNN's flash forward, 12.9 GFLOP (causal, 1024 keys, head size 64) in 46.5 us = 277 TFLOP/s,
//     0.280 of 989.4; its backward 120.4 us, 2.59x the forward. At >= 4096 keys the forward's fraction is
//     0.5, the low end of FlashAttention-2's published 50-73% of peak (Dao 2023, abstract; A100, forward).
//   elementwise: GELU forward over 8192 x 3072 bf16 (100.7 MB read and written) in 34.4 us = 2.93 TB/s, 0.87
//     of 3.35 TB/s;
//   optimizer: fused AdamW over 123.7M fp32 parameters (28 bytes each read or written) in 1.322 ms per step
//     = 2.62 TB/s, 0.78;
//   the shortest kernels: 1.0-3.6 us (memsets, scalar ops, radix-sort passes), taken as 2 us.
constexpr double kAssumedGemmEfficiency = 0.8;
std::shared_ptr<const GpuKernelModel> kernelModel(int sms, double gemmEfficiency, const char* source) {
  auto model = std::make_shared<GpuKernelModel>();
  model->sms = sms;
  model->gemmEfficiency = gemmEfficiency;
  model->attentionShort = 277.1 / 989.4;
  model->attentionLong = 0.5;
  model->attentionBackward = 120.4 / 46.5;
  model->elementwiseEfficiency = 2.926 / 3.35;
  model->optimizerEfficiency = 2.62 / 3.35;
  model->minKernelSeconds = 2e-6;
  model->source = source;
  return model;
}

DeviceSpec withKernels(DeviceSpec d, std::shared_ptr<const GpuKernelModel> kernels) {
  d.kernels = std::move(kernels);
  return d;
}

DeviceSpec unpublished(DeviceSpec d) {
  d.publishedPeak = false;
  return d;
}

// The host side of a catalog device (see DeviceSpec): link GB/s each way, host GB and DRAM GB/s per device.
DeviceSpec withHost(DeviceSpec d, double linkGbs, double hostGb, double hostBandwidthGbs) {
  d.hostLinkBandwidth = linkGbs * kGiga;
  d.hostMemoryBytes = hostGb * kGiga;
  d.hostMemoryBandwidth = hostBandwidthGbs * kGiga;
  return d;
}

std::vector<DeviceSpec> makeDeviceCatalog() {
  return {
      // A CPU, with placeholder figures (a measured machine is a mesh profile instead: `meshstudio-engine
      // calibrate`, docs/calibration.md): 100 GFLOP/s fp32 (a few AVX2 cores), bf16 no faster (no AMX
      // assumed), 24 GiB of RAM, 20 GB/s of DRAM bandwidth.
      // Its "host" is itself: offloaded state shares the same 24 GiB and moves at the DRAM's 20 GB/s.
      withHost(unpublished(device("cpu", "CPU (placeholder figures)", 0.1, 0, 0.1, 24 * kGibi / kGiga, 20,
                                  kCpuFraction)),
               20, 24 * kGibi / kGiga, 20),
      // NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), table 3, H100 SXM5: FP32 66.9 TFLOPS,
      // TF32 tensor 494.7, BF16 tensor 989.4 (dense; 1978.9 with sparsity); NVIDIA H100 datasheet: 80GB
      // HBM3, 3.35TB/s. Memory as measured, not the datasheet's 80e9 bytes: cudaMemGetInfo's total on an
      // H100 80GB HBM3 (driver 580, CUDA 13.0; bench/gpu_memory.py's device.total in
      // docs/gpu-logs/2026-11-26-h100-gpu-memory.json) is 85,017,493,504 bytes, what allocations can reach.
      // Host (NVIDIA DGX H100 user guide): PCIe Gen5 x16 per GPU (64 GB/s each way, as "pcie" below), 2 TB
      // of system memory for 8 GPUs (250 GB each), two Xeon Platinum 8480C with 8 DDR5-4800 channels each
      // (2 x 8 x 38.4 = 614 GB/s, 76.8 GB/s per GPU).
      withKernels(withHost(device("h100-sxm-80gb", "NVIDIA H100 SXM 80GB", 66.9, 494.7, 989.4, 85.017493504,
                                  3350, kGpuFraction),
                           64, 250, 76.8),
                  kernelModel(132, 792.1 / 989.0, "MAMF 792.1 of 989 TFLOP/s (ml-engineering), 132 SMs")),
      // NVIDIA H200 datasheet: the H100 SXM's compute (FP32 67, TF32 989 and BF16 1,979 TFLOPS with
      // sparsity, as H100's), 141GB HBM3e, 4.8TB/s. Memory as measured, not the datasheet's 141e9 bytes:
      // cudaMemGetInfo's total on an H200 (driver 580, CUDA 13.0; bench/gpu_memory.py's device.total in
      // docs/gpu-logs/2026-11-26-h200-gpu-memory.json) is 150,109,880,320 bytes, what allocations can reach.
      withKernels(withHost(device("h200-141gb", "NVIDIA H200 SXM 141GB", 66.9, 494.7, 989.4, 150.10988032,
                                  4800, kGpuFraction),
                           64, 250, 76.8),
                  kernelModel(132, 792.1 / 989.0, "the H100 SXM's MAMF 792.1 of 989 TFLOP/s, 132 SMs")),
      // NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5 TFLOPS, TF32 156, BF16 312 (dense; 312 and 624 with
      // sparsity); A100 40GB: HBM2, 1,555GB/s; A100 80GB SXM: HBM2e, 2,039GB/s.
      // Host (NVIDIA DGX A100 user guide): PCIe Gen4 x16 per GPU (32 GB/s each way), 1 TB of system memory
      // (DGX A100 320GB) or 2 TB (640GB) for 8 GPUs, two AMD EPYC 7742 with 8 DDR4-3200 channels each
      // (2 x 8 x 25.6 = 409.6 GB/s, 51.2 GB/s per GPU).
      withKernels(withHost(device("a100-40gb", "NVIDIA A100 40GB", 19.5, 156, 312, 40, 1555, kGpuFraction),
                           32, 125, 51.2),
                  kernelModel(108, 267.9 / 312.0, "the A100 SXM's MAMF 267.9 of 312 TFLOP/s, 108 SMs")),
      withKernels(
          withHost(device("a100-80gb", "NVIDIA A100 80GB SXM", 19.5, 156, 312, 80, 2039, kGpuFraction), 32,
                   250, 51.2),
          kernelModel(108, 267.9 / 312.0, "MAMF 267.9 of 312 TFLOP/s (ml-engineering), 108 SMs")),
      // NVIDIA L40S datasheet: FP32 91.6 TFLOPS, TF32 183, BF16 362.05 (dense; 366 and 733 with sparsity),
      // 48GB GDDR6, 864GB/s.
      // Host: PCIe Gen4 x16 (the L40S datasheet's 64 GB/s both ways, 32 each way); no reference system
      // fixes the rest, so its host memory and DRAM bandwidth are left unknown (offload is refused).
      withKernels(withHost(device("l40s", "NVIDIA L40S", 91.6, 183, 362.05, 48, 864, kGpuFraction), 32, 0, 0),
                  kernelModel(142, kAssumedGemmEfficiency, "no published MAMF: 0.8 assumed, 142 SMs")),
      // NVIDIA Ada GPU Architecture whitepaper, appendix table (GeForce RTX 4090): FP32 82.6 TFLOPS, TF32
      // 82.6, BF16 with FP32 accumulate 165.2 (dense; 330.4 with sparsity), 24GB GDDR6X, 1,008GB/s.
      // Host: PCIe Gen4 x16 (32 GB/s each way); host memory and DRAM bandwidth unknown, as for the L40S.
      withKernels(
          withHost(device("rtx4090", "NVIDIA GeForce RTX 4090", 82.6, 82.6, 165.2, 24, 1008, kGpuFraction),
                   32, 0, 0),
          kernelModel(128, kAssumedGemmEfficiency, "no published MAMF: 0.8 assumed, 128 SMs")),
  };
}

// Bandwidth per direction and per device; latency is the time of a small message, end to end.
std::vector<LinkSpec> makeLinkCatalog() {
  return {
      // Processes of one host through shared memory (Open MPI vader/sm): a memcpy through a bounce buffer,
      // ~10 GB/s and ~1 us on a current server (a conservative figure; calibration can refine it).
      LinkSpec{"shm", 10 * kGiga, 1e-6, nullptr, false},
      // NVIDIA H100 datasheet and NVLink page: 4th-generation NVLink, 900GB/s per GPU in both directions
      // together, 450 GB/s each way on the wire; NCCL's protocol overhead (~20%) leaves an effective 370
      // GB/s,
      // the bus bandwidth nccl-tests measures for ring collectives on 8 H100s (NCCL's maintainer, NVIDIA/
      // nccl-tests issue 212, 2024; NVLink SHARP all-reduces reach ~480 GB/s of bus bandwidth there, not
      // modelled: every collective is costed as a ring); ~3 us for a small NCCL message.
      LinkSpec{"nvlink", 370 * kGiga, 3e-6, nullptr, false},
      // PCI-SIG PCI Express Base Specification 5.0: 32 GT/s per lane, 128b/130b encoding, x16 = ~63 GB/s
      // each way, rounded to the usual 64 GB/s.
      LinkSpec{"pcie", 64 * kGiga, 5e-6, nullptr, false},
      // NVIDIA ConnectX-7 / Quantum-2 NDR datasheets: 400Gb/s per port, one port per GPU (as in DGX H100), so
      // 50 GB/s each way per device on the wire; nccl-tests all-reduces across nodes reach ~96% of it at the
      // largest sizes (NVIDIA/nccl-tests issue 119: 24 A100s on 3 nodes of 4 HDR ports, a peak bus bandwidth
      // of ~96 GB/s of 100: the node's four ports together, which is why a ring over several GPUs of each
      // node is costed at their ports' sum, ringLink), so 48 GB/s; ~5 us through a switch with GPUDirect
      // RDMA.
      // One port per GPU: perDevice.
      LinkSpec{"infiniband", 48 * kGiga, 5e-6, nullptr, true},
      // IEEE 802.3ba (100 Gigabit Ethernet): 100Gb/s = 12.5 GB/s each way, ~20 us through the TCP stack.
      // One port per node (its devices share it).
      LinkSpec{"ethernet", 12.5 * kGiga, 2e-5, nullptr, false},
  };
}

void addError(std::string& errors, const std::string& path, const std::string& message) {
  if (!errors.empty()) errors += '\n';
  errors += path + ": " + message;
}

std::string numberText(double v) {
  return nlohmann::json(v).dump();
}

// The figures of the config's own types that the cost model divides by: they must be positive.
void checkOwnTypes(const MeshConfig& config, std::string& errors) {
  const auto positive = [&](const std::string& path, double v) {
    if (!(v > 0)) addError(errors, path, "must be > 0, got " + numberText(v));
  };
  for (size_t i = 0; i < config.deviceTypes.size(); ++i) {
    const DeviceTypeConfig& t = config.deviceTypes[i];
    const std::string at = "/mesh/device_types/" + std::to_string(i);
    positive(at + "/peak_tflops_fp32", t.peakTflopsFp32);
    positive(at + "/peak_tflops_bf16", t.peakTflopsBf16);
    positive(at + "/memory_gb", t.memoryGb);
    positive(at + "/memory_bandwidth_gbs", t.memoryBandwidthGbs);
    if (!(t.achievableFraction > 0 && t.achievableFraction <= 1))
      addError(errors, at + "/achievable_fraction",
               "must be in (0, 1], got " + numberText(t.achievableFraction));
  }
  for (size_t i = 0; i < config.linkTypes.size(); ++i) {
    const LinkTypeConfig& t = config.linkTypes[i];
    const std::string at = "/mesh/link_types/" + std::to_string(i);
    positive(at + "/bandwidth_gbs", t.bandwidthGbs);
    if (!(t.latencyUs >= 0))
      addError(errors, at + "/latency_us", "must be >= 0, got " + numberText(t.latencyUs));
  }
}

// A profile named by the mesh but not read (a config parsed without loadProfiles()): the error to give.
std::string profileNotLoaded(size_t index) {
  return "the profile at /mesh/profiles/" + std::to_string(index) +
         " was not read (a config naming profiles is loaded with loadRunConfig())";
}

// The type a name resolves to, or nullopt; `problem` is set when the name is a profile's that cannot serve
// (not read, or no such link), else a nullopt means an unknown name.
std::optional<DeviceSpec> resolveDevice(const MeshConfig& config, const std::string& name,
                                        std::string& problem) {
  for (const auto& t : config.deviceTypes)
    if (t.name == name) return toDeviceSpec(t);
  for (size_t i = 0; i < config.profiles.size(); ++i) {
    const ProfileConfig& p = config.profiles[i];
    if (p.name != name) continue;
    if (!p.data) {
      problem = profileNotLoaded(i);
      return std::nullopt;
    }
    return toDeviceSpec(p.name, p.data);
  }
  return findDevice(name);
}

std::optional<LinkSpec> resolveLink(const MeshConfig& config, const std::string& name, std::string& problem) {
  for (const auto& t : config.linkTypes)
    if (t.name == name) return toLinkSpec(t);
  for (size_t i = 0; i < config.profiles.size(); ++i) {
    const ProfileConfig& p = config.profiles[i];
    if (name.size() <= p.name.size() + 1 || name.compare(0, p.name.size() + 1, p.name + ".") != 0) continue;
    if (!p.data) {
      problem = profileNotLoaded(i);
      return std::nullopt;
    }
    const std::string link = name.substr(p.name.size() + 1);
    if (std::optional<LinkSpec> spec = toLinkSpec(p.name, p.data, link)) return spec;
    std::string measured;
    for (const LinkProfile& l : p.data->links)
      measured += (measured.empty() ? "" : ", ") + p.name + "." + l.name;
    problem = "profile \"" + p.name + "\" (" + p.data->file + ") measured no link \"" + link + "\"; it has " +
              (measured.empty() ? std::string("none") : measured);
    return std::nullopt;
  }
  return findLink(name);
}

}  // namespace

const std::vector<DeviceSpec>& deviceCatalog() {
  static const std::vector<DeviceSpec> catalog = makeDeviceCatalog();  // immutable after first use
  return catalog;
}

const std::vector<LinkSpec>& linkCatalog() {
  static const std::vector<LinkSpec> catalog = makeLinkCatalog();  // immutable after first use
  return catalog;
}

std::optional<DeviceSpec> findDevice(const std::string& name) {
  for (const auto& d : deviceCatalog())
    if (d.name == name) return d;
  return std::nullopt;
}

std::optional<LinkSpec> findLink(const std::string& name) {
  for (const auto& l : linkCatalog())
    if (l.name == name) return l;
  return std::nullopt;
}

std::vector<std::string> deviceTypeNames(const MeshConfig& mesh) {
  std::vector<std::string> names;
  for (const auto& d : deviceCatalog()) names.push_back(d.name);
  for (const auto& t : mesh.deviceTypes) names.push_back(t.name);
  for (const auto& p : mesh.profiles) names.push_back(p.name);
  return names;
}

std::vector<std::string> linkTypeNames(const MeshConfig& mesh) {
  std::vector<std::string> names;
  for (const auto& l : linkCatalog()) names.push_back(l.name);
  for (const auto& t : mesh.linkTypes) names.push_back(t.name);
  for (const auto& p : mesh.profiles)
    if (p.data)
      for (const LinkProfile& l : p.data->links) names.push_back(p.name + "." + l.name);
  return names;
}

DeviceSpec toDeviceSpec(const DeviceTypeConfig& type) {
  // No tf32 figure in the config: fp32 math runs at the fp32 peak (DeviceSpec::peakFlops ignores tf32 too).
  return DeviceSpec{type.name,
                    type.label.empty() ? type.name : type.label,
                    type.peakTflopsFp32 * kTera,
                    0,
                    type.peakTflopsBf16 * kTera,
                    type.memoryGb * kGiga,
                    type.memoryBandwidthGbs * kGiga,
                    type.achievableFraction,
                    /*publishedPeak=*/true,
                    type.hostLinkGbs * kGiga,
                    type.hostMemoryGb * kGiga,
                    type.hostMemoryBandwidthGbs * kGiga,
                    nullptr,
                    nullptr};
}

LinkSpec toLinkSpec(const LinkTypeConfig& type) {
  return LinkSpec{type.name, type.bandwidthGbs * kGiga, type.latencyUs * kMicro, nullptr, type.perDevice};
}

DeviceSpec toDeviceSpec(const std::string& name, const std::shared_ptr<const DeviceProfile>& profile) {
  const int cores = profile->cores;
  DeviceSpec d;
  d.name = name;
  d.label = "Measured " + (profile->cpu.empty() ? profile->backend : profile->cpu) +
            (profile->hostname.empty() ? "" : " (" + profile->hostname + ")");
  d.peakFlopsFp32 = profile->peakGemmRate(Precision::Fp32, cores);
  d.peakFlopsBf16 = profile->peakGemmRate(Precision::Bf16, cores);
  d.memoryBytes = profile->memoryBytes;
  d.memoryBandwidth = profile->peakElementwiseRate(cores);
  // What the cost model still times by FLOPs (layers without GEMM shapes: plan/cost_model.cpp) runs at the
  // catalog CPU's fraction of the best measured GEMM rate.
  d.achievableFraction = kCpuFraction;
  d.publishedPeak = false;
  // A CPU's host is itself, as the catalog's "cpu": offloaded state shares its memory at its bandwidth.
  if (profile->backend == "cpu") {
    d.hostLinkBandwidth = d.memoryBandwidth;
    d.hostMemoryBytes = d.memoryBytes;
    d.hostMemoryBandwidth = d.memoryBandwidth;
  }
  d.profile = profile;
  return d;
}

std::optional<LinkSpec> toLinkSpec(const std::string& name,
                                   const std::shared_ptr<const DeviceProfile>& profile,
                                   const std::string& link) {
  const LinkProfile* measured = profile->link(link);
  if (!measured) return std::nullopt;
  // Shares the profile's lifetime: the link lives inside the profile.
  std::shared_ptr<const LinkProfile> shared(profile, measured);
  return LinkSpec{name + "." + link, measured->peakBusBandwidth(), measured->latency(), shared, false};
}

Expected<Mesh> buildMesh(const MeshConfig& config) {
  std::string errors;
  if (config.nodes.empty()) addError(errors, "/mesh/nodes", "needs at least 1 entry");
  checkOwnTypes(config, errors);
  Mesh mesh;
  for (size_t i = 0; i < config.nodes.size(); ++i) {
    const NodeConfig& node = config.nodes[i];
    const std::string at = "/mesh/nodes/" + std::to_string(i);
    if (node.count < 1) addError(errors, at + "/count", "must be >= 1, got " + std::to_string(node.count));
    std::string problem;
    const std::optional<DeviceSpec> spec = resolveDevice(config, node.device, problem);
    if (!spec)
      addError(errors, at + "/device",
               problem.empty() ? notOneOfMessage(node.device, deviceTypeNames(config)) : problem);
    mesh.nodes.push_back(node.name);
    if (!spec) continue;
    for (int local = 0; local < node.count; ++local)
      mesh.devices.push_back(
          MeshDevice{mesh.deviceCount(), static_cast<int>(mesh.nodes.size()) - 1, local, *spec});
  }
  std::string intraProblem, interProblem;
  const std::optional<LinkSpec> intra = resolveLink(config, config.intraLink, intraProblem);
  const std::optional<LinkSpec> inter = resolveLink(config, config.interLink, interProblem);
  if (!intra)
    addError(errors, "/mesh/intra_link",
             intraProblem.empty() ? notOneOfMessage(config.intraLink, linkTypeNames(config)) : intraProblem);
  if (!inter)
    addError(errors, "/mesh/inter_link",
             interProblem.empty() ? notOneOfMessage(config.interLink, linkTypeNames(config)) : interProblem);
  if (!errors.empty()) return Status::error(errors);
  mesh.intraLink = *intra;
  mesh.interLink = *inter;
  return mesh;
}

}  // namespace ms
