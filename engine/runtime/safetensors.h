// The safetensors format (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
// {string: string}} padded with spaces to a multiple of 8, then the raw little-endian tensor data, with
// offsets relative to the start of the data section. Checkpoints and exported weights use it, so Hugging
// Face and PyTorch tools can read them.
//
// What always holds: writeSafetensors() writes atomically (a reader sees the old file or the new one) and
// lays tensors out sorted by name, back to back; readSafetensors() returns only fully validated files
// (every entry's dtype known, shape product * dtype size == end - begin, offsets inside the data section,
// no two tensors overlapping) and otherwise an error naming the file and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace ms {

enum class DType { F32, I32, BF16, F16 };

// "F32", "I32", "BF16", "F16": the names in the safetensors header.
const char* toString(DType dtype);
// Bytes per element.
int dtypeSize(DType dtype);

// A tensor to write. `data` points to shape-product elements of `dtype`: float for F32, int32_t for I32,
// uint16_t bit patterns for BF16 and F16 (see floatToBf16/floatToF16). It must outlive the write.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::F32;
  const void* data = nullptr;
};

// A tensor read back: BF16, F16 and F32 are converted to float in `f32`; I32 goes to `i32`.
struct LoadedTensor {
  std::vector<int64_t> shape;
  DType storedAs = DType::F32;
  std::vector<float> f32;
  std::vector<int32_t> i32;
};

struct SafetensorsData {
  std::map<std::string, LoadedTensor> tensors;
  std::map<std::string, std::string> metadata;
  // The tensor of that name, or nullptr.
  const LoadedTensor* find(const std::string& name) const;
};

// Writes `tensors` (unique, non-empty names other than "__metadata__"; non-negative dimensions) and
// `metadata` to path atomically: "<path>.tmp", fsync, rename over path, fsync of the directory.
Status writeSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                        const std::map<std::string, std::string>& metadata = {});
// Reads and validates a whole file.
Expected<SafetensorsData> readSafetensors(const std::string& path);
// Validates and converts a whole file's bytes, already read; `name` stands for the file in messages.
Expected<SafetensorsData> parseSafetensors(const std::string& name, const std::string& bytes);

// IEEE half and bfloat16 conversions, round to nearest even; NaN stays NaN, overflow becomes infinity.
uint16_t floatToBf16(float value);
float bf16ToFloat(uint16_t bits);
uint16_t floatToF16(float value);
float f16ToFloat(uint16_t bits);

}  // namespace ms
