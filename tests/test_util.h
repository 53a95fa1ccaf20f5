// Small helpers shared by the test suites: whole-file byte I/O and the location of the real Fashion-MNIST.
#pragma once

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

}  // namespace ms::test
