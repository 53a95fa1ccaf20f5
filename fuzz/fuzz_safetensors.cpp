// Fuzz target: the safetensors reader (runtime/safetensors.h) on a whole file's bytes, through
// parseSafetensors(), what readSafetensors() does once the file is read.
//
// Checked for every input, beyond not crashing: an error names the file; an accepted file gives tensors whose
// element count is the product of their shape, stored in the one vector their dtype selects.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_check.h"
#include "runtime/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  ms::Expected<ms::SafetensorsData> file = ms::parseSafetensors("fuzz.safetensors", bytes);
  if (!file) {
    FUZZ_CHECK(file.message().rfind("fuzz.safetensors: ", 0) == 0, "an error without the file: %s",
               file.message().c_str());
    return fuzz::outcome(false);
  }
  size_t dataBytes = 0;
  for (const auto& [name, tensor] : file->tensors) {
    uint64_t count = 1;
    for (int64_t d : tensor.shape) {
      FUZZ_CHECK(d >= 0, "tensor '%s' has a negative dimension", name.c_str());
      count *= static_cast<uint64_t>(d);
    }
    const bool isInt = tensor.storedAs == ms::DType::I32;
    const size_t held = isInt ? tensor.i32.size() : tensor.f32.size();
    FUZZ_CHECK(held == count, "tensor '%s': shape gives %llu elements, %zu were read", name.c_str(),
               static_cast<unsigned long long>(count), held);
    FUZZ_CHECK((isInt ? tensor.f32.size() : tensor.i32.size()) == 0, "tensor '%s' filled both vectors",
               name.c_str());
    dataBytes += count * static_cast<size_t>(ms::dtypeSize(tensor.storedAs));
  }
  // Tensors do not overlap, so together they fit in the data section.
  FUZZ_CHECK(dataBytes + 8 <= bytes.size(), "tensors hold %zu bytes, the file only %zu", dataBytes,
             bytes.size());
  return fuzz::outcome(true);
}
