// CUDA device discovery: tells the engine (and the GPU tests) whether a usable device exists before it makes
// the CUDA backend (cuda_backend.h). A missing driver
// or device (cudaErrorInsufficientDriver, cudaErrorNoDevice) is normal on CPU machines and reported as 0.
#include "kernels/cuda/cuda_info.h"

#include <cuda_runtime.h>

namespace ms::cuda {

int deviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return n;
}

std::string unavailableReason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  }
  return n > 0 ? std::string() : std::string("no CUDA device found");
}

std::string deviceName(int index) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
    cudaGetLastError();  // else the next kernel's checkLaunch (cudaGetLastError) reports it as its own
    return {};
  }
  return prop.name;
}

}  // namespace ms::cuda
