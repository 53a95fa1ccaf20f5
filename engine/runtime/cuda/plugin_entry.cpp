// libmeshstudio_cuda.so's entry: the table of runtime/cuda_plugin.h over the CUDA backend
// (kernels/cuda/cuda_backend.h) and the NCCL communicator (nccl_communicator.h).
#include "runtime/cuda_plugin.h"

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_info.h"
#if defined(MESHSTUDIO_HAVE_NCCL)
#include "runtime/cuda/nccl_communicator.h"
#endif

namespace ms {
namespace {

#if defined(MESHSTUDIO_HAVE_NCCL)
Expected<std::unique_ptr<Communicator>> openNcclWorld(MPI_Comm world, Backend& backend, std::string& note) {
  auto shared = ranksShareDevice(world, backend.info().index);
  if (!shared) return shared.status().withContext("checking whether ranks share a GPU");
  if (*shared) {
    note = "ranks share a GPU, which NCCL refuses: tensors travel by MPI through host memory (slower)";
    return std::unique_ptr<Communicator>();
  }
  auto nccl = NcclCommunicator::create(world, backend.info().index, "world");
  if (!nccl) return nccl.status().withContext("creating the NCCL communicator");
  (*nccl)->setComputeStream(computeStream(backend));
  return std::unique_ptr<Communicator>(std::move(*nccl));
}
#endif

CudaPlugin makeTable() {
  CudaPlugin p;
  p.unavailableReason = [] { return cuda::unavailableReason(); };
  p.deviceCount = [] { return cuda::deviceCount(); };
  p.makeBackend = [](int device) { return makeCudaBackend(device); };
#if defined(MESHSTUDIO_HAVE_NCCL)
  p.openNcclWorld = openNcclWorld;
#endif
  return p;
}

}  // namespace
}  // namespace ms

extern "C" __attribute__((visibility("default"))) const ms::CudaPlugin* meshstudio_cuda_plugin() {
  static const ms::CudaPlugin table = ms::makeTable();
  return &table;
}
