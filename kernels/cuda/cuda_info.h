// CUDA device discovery; see cuda_info.cu. Only declared when the build has CUDA (MESHSTUDIO_HAVE_CUDA).
#pragma once

#include <string>

namespace ms::cuda {
int deviceCount();
std::string deviceName(int index);
}  // namespace ms::cuda
