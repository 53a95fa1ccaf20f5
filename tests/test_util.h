// Small helpers shared by the test suites: whole-file byte I/O and the location of the real Fashion-MNIST.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <iterator>
#include <string>

namespace ms::test {

inline const char* const kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

inline void writeBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A small gpt (width 64, 4 heads, vocab 256, context 64) for planning on one node of 8 H100s with NVLink; its
// token shards are never read.
inline nlohmann::json smallGpuPlanConfig(const std::string& name, int layers, int batch) {
  using nlohmann::json;
  return json{
      {"version", 1},
      {"name", name},
      {"model",
       {{"type", "gpt"}, {"layers", layers}, {"width", 64}, {"heads", 4}, {"vocab", 256}, {"context", 64}}},
      {"data", {{"kind", "tokens"}, {"train", json::array({"train.bin"})}, {"val", json::array({"val.bin"})}}},
      {"mesh",
       {{"nodes", json::array({{{"name", "n0"}, {"device", "h100-sxm-80gb"}, {"count", 8}}})},
        {"intra_link", "nvlink"},
        {"inter_link", "infiniband"}}},
      {"training", {{"batch_size", batch}, {"seq_len", 64}}}};
}

// The catalog's H100 as a config's own device type: the same datasheet figures, but costed by one achievable
// fraction (0.5) of the peak for every FLOP instead of the catalog's kernel model (plan/gpu_kernel_model.h),
// for the tests whose expected times are written in FLOPs.
inline void useFlatH100(nlohmann::json& config) {
  using nlohmann::json;
  config["mesh"]["device_types"] = json::array({{{"name", "h100-flat"},
                                                 {"peak_tflops_fp32", 66.9},
                                                 {"peak_tflops_bf16", 989.4},
                                                 {"memory_gb", 85.017493504},
                                                 {"memory_bandwidth_gbs", 3350},
                                                 {"achievable_fraction", 0.5},
                                                 {"host_link_gbs", 64},
                                                 {"host_memory_gb", 250},
                                                 {"host_memory_bandwidth_gbs", 76.8}}});
  for (json& node : config["mesh"]["nodes"]) node["device"] = "h100-flat";
}

}  // namespace ms::test
