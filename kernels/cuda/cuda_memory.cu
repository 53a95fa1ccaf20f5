// Error reporting, device memory helpers and the process GEMM mode of the CUDA backend (cuda_ops.h). Every
// CUDA call's result becomes an ms::Status naming the call and the CUDA error; nothing here throws.
#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "kernels/cuda/cuda_ops.h"

namespace ms::cuda {
namespace {

// Process-wide like ms::cpu::setThreads(): set once at start up, read by every GEMM.
std::atomic<GemmMode> g_gemmMode{GemmMode::Fp32};

}  // namespace

Status cudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return Status::error(std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

Status checkLaunch(const char* what) {
  return cudaStatus(cudaGetLastError(), what);
}

void setGemmMode(GemmMode mode) {
  g_gemmMode.store(mode, std::memory_order_relaxed);
}

GemmMode gemmMode() {
  return g_gemmMode.load(std::memory_order_relaxed);
}

Status deviceAlloc(void** ptr, size_t bytes) {
  *ptr = nullptr;
  if (bytes == 0) return Status::ok();
  return cudaStatus(cudaMalloc(ptr, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
}

Status deviceFree(void* ptr) {
  if (!ptr) return Status::ok();
  return cudaStatus(cudaFree(ptr), "cudaFree");
}

Status copyToDevice(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return Status::ok();
  MS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
  return cudaStatus(cudaStreamSynchronize(stream), "copyToDevice: cudaStreamSynchronize");
}

Status copyToHost(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return Status::ok();
  MS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
  return cudaStatus(cudaStreamSynchronize(stream), "copyToHost: cudaStreamSynchronize");
}

Status fillZero(void* dst, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return Status::ok();
  return cudaStatus(cudaMemsetAsync(dst, 0, bytes, stream), "fillZero: cudaMemsetAsync");
}

Status synchronize(cudaStream_t stream) {
  return cudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

}  // namespace ms::cuda
