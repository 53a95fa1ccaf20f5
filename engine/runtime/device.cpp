// Device choice and the tensor communicator; see device.h.
#include "runtime/device.h"

#include <cstdlib>

#include "plan/hardware.h"
#include "runtime/staging_communicator.h"
#if defined(MESHSTUDIO_HAVE_CUDA)
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_info.h"
#endif
#if defined(MESHSTUDIO_HAVE_NCCL)
#include "runtime/cuda/nccl_communicator.h"
#include "runtime/mpi_communicator.h"
#endif

namespace ms {

int localRankFromEnvironment() {
  const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  return s ? std::max(0, std::atoi(s)) : 0;
}

namespace {

// Why no GPU can be used, or "" when one can.
std::string cudaUnavailable() {
#if defined(MESHSTUDIO_HAVE_CUDA)
  return cuda::unavailableReason();
#else
  return "this engine was built without CUDA";
#endif
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
#if defined(MESHSTUDIO_HAVE_CUDA)
  const int count = cuda::deviceCount();
  const int index = localRank % count;
  auto backend = makeCudaBackend(index);
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
#else
  return Status::error("/device: unreachable without CUDA");
#endif
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
#if defined(MESHSTUDIO_HAVE_NCCL)
  if (backend.kind() == DeviceKind::Cuda) {
    auto* mpi = dynamic_cast<MpiCommunicator*>(world);
    if (mpi) {
      auto shared = ranksShareDevice(mpi->comm(), backend.info().index);
      if (!shared) return shared.status().withContext("checking whether ranks share a GPU");
      if (!*shared) {
        auto nccl = NcclCommunicator::create(mpi->comm(), backend.info().index, "world");
        if (!nccl) return nccl.status().withContext("creating the NCCL communicator");
        (*nccl)->setComputeStream(computeStream(backend));
        return std::unique_ptr<Communicator>(std::move(*nccl));
      }
      note = "ranks share a GPU, which NCCL refuses: tensors travel by MPI through host memory (slower)";
    }
  }
#endif
  if (backend.kind() == DeviceKind::Cuda && note.empty())
    note = "this engine was built without NCCL: tensors travel by MPI through host memory (slower)";
  return std::unique_ptr<Communicator>(new StagingCommunicator(*world, backend));
}

}  // namespace ms
