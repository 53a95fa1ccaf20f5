// CUDA device discovery; see cuda_info.cu. Only declared when the build has CUDA (MESHSTUDIO_HAVE_CUDA).
#pragma once

#include <string>

namespace ms::cuda {
int deviceCount();
std::string deviceName(int index);
// Why no device can be used, in one line ("cudaErrorNoDevice: no CUDA-capable device is detected"), or ""
// when there is one.
std::string unavailableReason();
}  // namespace ms::cuda
