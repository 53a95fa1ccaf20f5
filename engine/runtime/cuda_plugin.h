// The CUDA half of the engine as a plugin (libmeshstudio_cuda.so, entry in
// engine/runtime/cuda/plugin_entry.cpp), opened with dlopen the first time a rank asks for a GPU
// (runtime/device.cpp).
//
// Why a plugin: CUDA's libraries are large and costly to load. Linked in, they made every engine process
// 0.43 s slower to start (bench/startup.py: `validate` 23 ms against 454 ms, most of it cuBLASLt's static
// initialisers by perf), paid by every CPU rank and every `validate` and `plan` the studio runs, though only
// GPU ranks use them. Linked normally, the loader cannot skip them; opened on demand, CPU processes never
// load them.
//
// How the two halves meet: the plugin holds the CUDA kernels and backend (kernels/cuda) and the NCCL
// communicator (runtime/cuda); everything else it uses (the Backend and Communicator bases, the
// communication watchdog's process-wide timeout and fault injection, ...) it takes from the executable that
// opens it, which exports its symbols (CMake ENABLE_EXPORTS), so there is one copy of every process-wide
// setting. The table below is the whole interface; both halves are built together, so C++ types cross it.
//
// Where it is looked for: $MESHSTUDIO_CUDA_PLUGIN, else libmeshstudio_cuda.so beside the executable
// (/proc/self/exe), else where this build wrote it. A build without CUDA has no plugin, and says so.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "common/status.h"
#include "kernels/backend.h"
#include "runtime/communicator.h"

namespace ms {

inline constexpr int kCudaPluginVersion = 1;

struct CudaPlugin {
  int version = kCudaPluginVersion;
  // Why no GPU can be used ("" when one can): no driver, no device.
  std::string (*unavailableReason)() = nullptr;
  int (*deviceCount)() = nullptr;
  // The CUDA backend on device `device`.
  Expected<std::unique_ptr<Backend>> (*makeBackend)(int device) = nullptr;
  // The world communicator for tensors in `backend`'s memory, collective over `world`: NCCL, or null with
  // `note` saying why not (two ranks share a GPU, which NCCL refuses). Null when built without NCCL.
  Expected<std::unique_ptr<Communicator>> (*openNcclWorld)(MPI_Comm world, Backend& backend,
                                                           std::string& note) = nullptr;
};

// The plugin, opened once per process (thread-safe); null with `why` set when it cannot be (a build
// without CUDA, a missing file, an unresolved symbol: dlerror's words).
const CudaPlugin* cudaPlugin(std::string* why);

}  // namespace ms

// The plugin's one exported symbol.
extern "C" const ms::CudaPlugin* meshstudio_cuda_plugin();
