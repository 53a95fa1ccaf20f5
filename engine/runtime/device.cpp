// Device choice and the tensor communicator; see device.h.
#include "runtime/device.h"

#include <cstdlib>

#include "plan/hardware.h"
#include "runtime/cuda_plugin.h"
#include "runtime/mpi_communicator.h"
#include "runtime/staging_communicator.h"

namespace ms {

int localRankFromEnvironment() {
  const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  return s ? std::max(0, std::atoi(s)) : 0;
}

namespace {

// Why no GPU can be used, or "" when one can. Opens the CUDA plugin (cuda_plugin.h) the first time.
std::string cudaUnavailable() {
  std::string why;
  const CudaPlugin* cuda = cudaPlugin(&why);
  return cuda ? cuda->unavailableReason() : why;
}

}  // namespace

Expected<OpenedDevice> openDevice(DeviceChoice choice, int localRank, bool emulate) {
  OpenedDevice out;
  if (emulate) {
    if (choice == DeviceChoice::Cuda)
      return Status::error(
          "--emulate-device emulates a device on the CPU; it needs \"device\": \"cpu\" or \"auto\"");
    out.backend = makeCpuBackend(true);
    out.note = "device: the emulated device on the CPU (every tensor transfer staged through host memory)";
    return out;
  }
  if (choice == DeviceChoice::Cpu) {
    out.backend = makeCpuBackend(false);
    return out;
  }
  const std::string why = cudaUnavailable();
  if (!why.empty()) {
    if (choice == DeviceChoice::Cuda)
      return Status::error("/device: \"cuda\": no usable CUDA device (" + why +
                           "); use \"cpu\", or \"auto\" to fall back to the CPU");
    out.backend = makeCpuBackend(false);
    out.note = "device \"auto\": no usable CUDA device (" + why + "); training on the CPU";
    return out;
  }
  const CudaPlugin* cuda = cudaPlugin(nullptr);
  const int count = cuda->deviceCount();
  const int index = localRank % count;
  auto backend = cuda->makeBackend(index);
  if (!backend) {
    if (choice == DeviceChoice::Cuda) return backend.status().withContext("/device: \"cuda\"");
    out.backend = makeCpuBackend(false);
    out.note = "device \"auto\": CUDA device " + std::to_string(index) + " could not be opened (" +
               backend.status().message() + "); training on the CPU";
    return out;
  }
  out.backend = std::move(*backend);
  out.note = std::string("device \"") + (choice == DeviceChoice::Auto ? "auto" : "cuda") +
             "\": training on " + out.backend->info().name + " (cuda:" + std::to_string(index) + ")";
  return out;
}

DevicePeak peakOfDevice(const DeviceInfo& info) {
  DevicePeak p;
  if (info.kind != DeviceKind::Cuda) return p;
  const std::string& n = info.name;
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("H200"))
    p.catalogKey = "h200-141gb";
  else if (has("H100") && !has("PCIe") && !has("NVL"))
    p.catalogKey = "h100-sxm-80gb";
  else if (has("A100") && has("80GB"))
    p.catalogKey = "a100-80gb";
  else if (has("A100"))
    p.catalogKey = "a100-40gb";
  else if (has("L40S"))
    p.catalogKey = "l40s";
  else if (has("RTX 4090"))
    p.catalogKey = "rtx4090";
  if (auto d = p.catalogKey.empty() ? std::nullopt : findDevice(p.catalogKey)) {
    p.bf16 = d->peakFlopsBf16;
    p.fp32 = d->peakFlopsFp32;
  } else {
    p.catalogKey.clear();
    p.fp32 = info.peakFlopsFp32;
  }
  return p;
}

Expected<std::unique_ptr<Communicator>> openTensorWorld(Communicator* world, Backend& backend,
                                                        std::string& note) {
  note.clear();
  if (!backend.deviceMemory() || !world) return std::unique_ptr<Communicator>();
  // A CUDA backend came from the plugin, so it is open here.
  const CudaPlugin* cuda = backend.kind() == DeviceKind::Cuda ? cudaPlugin(nullptr) : nullptr;
  if (cuda && cuda->openNcclWorld) {
    if (auto* mpi = dynamic_cast<MpiCommunicator*>(world)) {
      auto nccl = cuda->openNcclWorld(mpi->comm(), backend, note);
      if (!nccl) return nccl.status();
      if (*nccl) return std::move(*nccl);
    }
  }
  if (backend.kind() == DeviceKind::Cuda && note.empty())
    note = "this engine was built without NCCL: tensors travel by MPI through host memory (slower)";
  return std::unique_ptr<Communicator>(new StagingCommunicator(*world, backend));
}

}  // namespace ms
