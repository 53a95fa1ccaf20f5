// Reading and writing safetensors files (format in safetensors.h; reference implementation
// huggingface/safetensors, safetensors/src/tensor.rs).
//
// What always holds: the writer emits tensors sorted by name, back to back, after a space-padded header whose
// length is a multiple of 8; the reader checks every header field against the file before it touches data,
// so a corrupt file yields an error and never an out-of-bounds read. nlohmann::json exceptions are caught
// here and turned into errors.
#include "runtime/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "runtime/file_io.h"

namespace ms {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; the raw copies here assume a little-endian host");

const char* toString(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "F32";
    case DType::I32:
      return "I32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
  }
  return "?";
}

int dtypeSize(DType dtype) {
  switch (dtype) {
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::BF16:
    case DType::F16:
      return 2;
  }
  return 0;
}

const LoadedTensor* SafetensorsData::find(const std::string& name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

uint16_t floatToBf16(float value) {
  const auto x = std::bit_cast<uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  const uint32_t roundingBias = 0x7fffu + ((x >> 16) & 1u);                                // ties to even
  return static_cast<uint16_t>((x + roundingBias) >> 16);
}

float bf16ToFloat(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

uint16_t floatToF16(float value) {
  const auto x = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x0200u : 0u));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to infinity
  if (absx < 0x38800000u) {
    // Below 2^-14: a subnormal half holds round(v * 2^24); the product is exact (power-of-two scale) and
    // nearbyint rounds ties to even. 0x400 (rounding up to the smallest normal) is the right encoding too.
    const float scaled = std::bit_cast<float>(absx) * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)));
  }
  const uint32_t mantissa = absx & 0x7fffffu;
  uint32_t half = (((absx >> 23) - 112u) << 10) | (mantissa >> 13);  // rebias exponent 127 -> 15
  const uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // a carry into the exponent is correct
  return static_cast<uint16_t>(sign | half);
}

float f16ToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

namespace {

constexpr const char* kMetadataKey = "__metadata__";

bool parseDType(const std::string& name, DType& out) {
  for (DType d : {DType::F32, DType::I32, DType::BF16, DType::F16}) {
    if (name == toString(d)) {
      out = d;
      return true;
    }
  }
  return false;
}

// Product of the dimensions, or false when it overflows or a dimension is negative.
bool elementCount(const std::vector<int64_t>& shape, uint64_t& count) {
  unsigned __int128 n = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    n *= static_cast<uint64_t>(d);
    if (n > (static_cast<unsigned __int128>(1) << 62)) return false;
  }
  count = static_cast<uint64_t>(n);
  return true;
}

std::string shapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Status writeSafetensorsImpl(const std::string& path, const std::vector<NamedTensor>& tensors,
                            const std::map<std::string, std::string>& metadata) {
  std::vector<const NamedTensor*> order;
  for (const NamedTensor& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const NamedTensor* a, const NamedTensor* b) { return a->name < b->name; });

  nlohmann::json header = nlohmann::json::object();
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const NamedTensor& t = *order[i];
    if (t.name.empty() || t.name == kMetadataKey) {
      return Status::error(path + ": invalid tensor name '" + t.name + "'");
    }
    if (i > 0 && order[i - 1]->name == t.name)
      return Status::error(path + ": tensor '" + t.name + "' given twice");
    uint64_t count = 0;
    if (!elementCount(t.shape, count)) {
      return Status::error(path + ": tensor '" + t.name + "' has an invalid shape " + shapeString(t.shape));
    }
    const uint64_t bytes = count * static_cast<uint64_t>(dtypeSize(t.dtype));
    if (bytes > 0 && t.data == nullptr) return Status::error(path + ": tensor '" + t.name + "' has no data");
    header[t.name] = {
        {"dtype", toString(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    sizes.push_back(bytes);
    offset += bytes;
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;

  std::string headerText = header.dump();
  headerText.append((8 - headerText.size() % 8) % 8, ' ');
  unsigned char lengthBytes[8];
  for (int i = 0; i < 8; ++i) lengthBytes[i] = static_cast<unsigned char>(headerText.size() >> (8 * i));

  AtomicFileWriter writer;
  MS_TRY(writer.open(path));
  MS_TRY(writer.append(lengthBytes, sizeof lengthBytes));
  MS_TRY(writer.append(headerText.data(), headerText.size()));
  for (size_t i = 0; i < order.size(); ++i) {
    if (sizes[i] > 0) MS_TRY(writer.append(order[i]->data, sizes[i]));
  }
  return writer.commit();
}

struct Entry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

Status parseEntry(const std::string& path, const std::string& name, const nlohmann::json& value,
                  uint64_t dataBytes, Entry& entry) {
  const std::string where = path + ": tensor '" + name + "'";
  if (!value.is_object()) return Status::error(where + ": header entry is not a JSON object");
  entry.name = name;
  auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) return Status::error(where + ": missing \"dtype\" string");
  if (!parseDType(dtype->get<std::string>(), entry.dtype)) {
    return Status::error(where + ": unsupported dtype '" + dtype->get<std::string>() +
                         "' (supported: F32, I32, BF16, F16)");
  }
  auto shape = value.find("shape");
  if (shape == value.end() || !shape->is_array()) return Status::error(where + ": missing \"shape\" array");
  for (const nlohmann::json& d : *shape) {
    if (!d.is_number_unsigned())
      return Status::error(where + ": shape " + shape->dump() + " is not a list of sizes");
    entry.shape.push_back(d.get<int64_t>());
  }
  auto offsets = value.find("data_offsets");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return Status::error(where + ": \"data_offsets\" must be [begin, end]");
  }
  entry.begin = (*offsets)[0].get<uint64_t>();
  entry.end = (*offsets)[1].get<uint64_t>();
  if (entry.begin > entry.end) {
    return Status::error(where + ": data_offsets [" + std::to_string(entry.begin) + ", " +
                         std::to_string(entry.end) + "] end before they begin");
  }
  if (entry.end > dataBytes) {
    return Status::error(where + ": data_offsets [" + std::to_string(entry.begin) + ", " +
                         std::to_string(entry.end) + "] lie outside the data section of " +
                         std::to_string(dataBytes) + " bytes");
  }
  uint64_t count = 0;
  if (!elementCount(entry.shape, count))
    return Status::error(where + ": shape " + shapeString(entry.shape) + " is too large");
  const uint64_t expected = count * static_cast<uint64_t>(dtypeSize(entry.dtype));
  if (expected != entry.end - entry.begin) {
    return Status::error(where + ": shape " + shapeString(entry.shape) + " of " + toString(entry.dtype) +
                         " needs " + std::to_string(expected) + " bytes but data_offsets span " +
                         std::to_string(entry.end - entry.begin));
  }
  return Status::ok();
}

LoadedTensor convert(const Entry& e, const unsigned char* data) {
  LoadedTensor t;
  t.shape = e.shape;
  t.storedAs = e.dtype;
  const unsigned char* p = data + e.begin;
  const size_t n = (e.end - e.begin) / static_cast<size_t>(dtypeSize(e.dtype));
  switch (e.dtype) {
    case DType::F32:
      t.f32.resize(n);
      if (n) std::memcpy(t.f32.data(), p, n * 4);
      break;
    case DType::I32:
      t.i32.resize(n);
      if (n) std::memcpy(t.i32.data(), p, n * 4);
      break;
    case DType::BF16:
    case DType::F16:
      t.f32.resize(n);
      for (size_t i = 0; i < n; ++i) {
        const auto bits = static_cast<uint16_t>(p[2 * i] | p[2 * i + 1] << 8);
        t.f32[i] = e.dtype == DType::BF16 ? bf16ToFloat(bits) : f16ToFloat(bits);
      }
      break;
  }
  return t;
}

Expected<SafetensorsData> parseSafetensorsImpl(const std::string& path, const std::string& bytes) {
  if (bytes.size() < 8) {
    return Status::error(path + ": too short for a safetensors file (" + std::to_string(bytes.size()) +
                         " bytes, the header length alone takes 8)");
  }
  uint64_t headerLength = 0;
  for (int i = 0; i < 8; ++i)
    headerLength |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (headerLength > bytes.size() - 8) {
    return Status::error(path + ": header length " + std::to_string(headerLength) +
                         " goes beyond the end of the file (" + std::to_string(bytes.size()) + " bytes)");
  }
  // A header nests three levels (the header, a tensor's entry, its shape). A deeper one is refused as the
  // parse gets there: a header of nested brackets would otherwise take about 37 times its size in memory.
  constexpr int kMaxHeaderDepth = 8;
  struct TooDeep {};
  const nlohmann::json::parser_callback_t depthLimit = [](int depth, nlohmann::json::parse_event_t event,
                                                          nlohmann::json&) {
    if ((event == nlohmann::json::parse_event_t::object_start ||
         event == nlohmann::json::parse_event_t::array_start) &&
        depth >= kMaxHeaderDepth)
      throw TooDeep{};
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(
        bytes.begin() + 8, bytes.begin() + 8 + static_cast<ptrdiff_t>(headerLength), depthLimit, false);
  } catch (const TooDeep&) {
    return Status::error(path + ": the safetensors header nests deeper than " +
                         std::to_string(kMaxHeaderDepth) + " levels (a valid one nests 3)");
  }
  if (header.is_discarded()) return Status::error(path + ": the safetensors header is not valid JSON");
  if (!header.is_object()) return Status::error(path + ": the safetensors header is not a JSON object");

  const uint64_t dataBytes = bytes.size() - 8 - headerLength;
  SafetensorsData result;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == kMetadataKey) {
      if (!it.value().is_object()) return Status::error(path + ": \"__metadata__\" is not a JSON object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) {
          return Status::error(path + ": metadata value of '" + m.key() + "' is not a string");
        }
        result.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    Entry entry;
    MS_TRY(parseEntry(path, it.key(), it.value(), dataBytes, entry));
    entries.push_back(std::move(entry));
  }

  std::vector<const Entry*> byOffset;
  for (const Entry& e : entries) {
    if (e.end > e.begin) byOffset.push_back(&e);  // empty tensors occupy no bytes and overlap nothing
  }
  std::sort(byOffset.begin(), byOffset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < byOffset.size(); ++i) {
    if (byOffset[i]->begin < byOffset[i - 1]->end) {
      return Status::error(path + ": tensors '" + byOffset[i - 1]->name + "' and '" + byOffset[i]->name +
                           "' overlap in the data section");
    }
  }

  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data()) + 8 + headerLength;
  for (const Entry& e : entries) result.tensors.emplace(e.name, convert(e, data));
  return result;
}

}  // namespace

Status writeSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  try {
    return writeSafetensorsImpl(path, tensors, metadata);
  } catch (const std::exception& e) {
    return Status::error(path + ": cannot write safetensors file: " + e.what());
  }
}

Expected<SafetensorsData> parseSafetensors(const std::string& name, const std::string& bytes) {
  try {
    return parseSafetensorsImpl(name, bytes);
  } catch (const std::exception& e) {
    return Status::error(name + ": cannot read safetensors file: " + e.what());
  }
}

Expected<SafetensorsData> readSafetensors(const std::string& path) {
  Expected<std::string> bytes = readFile(path);
  if (!bytes) return bytes.status();
  return parseSafetensors(path, *bytes);
}

}  // namespace ms
