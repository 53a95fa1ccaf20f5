// Choosing a rank's device (the config's "device": "auto" | "cpu" | "cuda") and the communicator its
// tensors travel through (docs/architecture.md, "Communication").
//
// What always holds: "cpu" trains on the CPU; "cuda" trains on a GPU or fails with the reason there is none
// (no driver, no device, a build without CUDA), naming /device; "auto" takes a GPU when one is usable and
// otherwise the CPU, with one line saying why (no driver or device is normal on CPU machines). Ranks of a
// node take GPUs round-robin by their local rank. Tensors in GPU memory travel by NCCL when it is built and
// no two ranks share a GPU; otherwise by MPI through host memory, said once.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "kernels/backend.h"
#include "plan/run_config.h"
#include "runtime/communicator.h"

namespace ms {

struct OpenedDevice {
  std::unique_ptr<Backend> backend;
  std::string
      note;  // a line for the log ("device \"auto\": no usable CUDA device (...); training on the CPU")
};

// localRank: this rank's index on its node (OMPI_COMM_WORLD_LOCAL_RANK). emulate: with "cpu", the CPU's
// emulated device (tests of the device code path).
Expected<OpenedDevice> openDevice(DeviceChoice choice, int localRank, bool emulate);

// This process's rank on its node, from Open MPI's environment (0 outside mpirun).
int localRankFromEnvironment();

// Peak dense FLOP/s of a CUDA device by its name, from the hardware catalog (bf16 tensor-core and fp32;
// 0 when the catalog does not know it), and the catalog key it matched ("" when none).
struct DevicePeak {
  std::string catalogKey;
  double bf16 = 0;
  double fp32 = 0;
};
DevicePeak peakOfDevice(const DeviceInfo& info);

// The world communicator for tensors in the backend's memory, over world (host memory, MPI). On a backend
// without device memory that is world itself (result null). Otherwise an NCCL communicator, or the MPI one
// with host staging; note says which and why (empty when nothing needs saying). Collective over world.
Expected<std::unique_ptr<Communicator>> openTensorWorld(Communicator* world, Backend& backend,
                                                        std::string& note);

}  // namespace ms
