#include "kernels/cpu/blas_core.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// Weak: a BLAS other than OpenBLAS leaves it null.
extern "C" char* openblas_get_corename(void) __attribute__((weak));

namespace ms::cpu {

namespace {
bool sameName(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}
}  // namespace

CpuVectorIsa hostVectorIsa() {
  CpuVectorIsa isa;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  isa.avx = __builtin_cpu_supports("avx");
  isa.avx2 = __builtin_cpu_supports("avx2");
  isa.fma = __builtin_cpu_supports("fma");
  isa.avx512f = __builtin_cpu_supports("avx512f");
  isa.avx512bw = __builtin_cpu_supports("avx512bw");
  isa.avx512vl = __builtin_cpu_supports("avx512vl");
  isa.avx512dq = __builtin_cpu_supports("avx512dq");
  isa.avx512cd = __builtin_cpu_supports("avx512cd");
#endif
  return isa;
}

std::string blasCoreName() {
  const char* name = openblas_get_corename ? openblas_get_corename() : nullptr;
  return name ? std::string(name) : std::string();
}

std::string betterBlasCore(std::string_view detected, const CpuVectorIsa& isa) {
  // OpenBLAS 0.3.21's x86-64 cores without AVX kernels (driver/others/dynamic.c's corename table).
  static constexpr std::array<std::string_view, 15> kSseCores = {
      "Katmai",     "Coppermine", "Northwood", "Prescott", "Banias",       "Atom",      "Core2", "Penryn",
      "Dunnington", "Nehalem",    "Athlon",    "Opteron",  "Opteron_SSE3", "Barcelona", "Nano"};
  const bool sseOnly = std::any_of(kSseCores.begin(), kSseCores.end(),
                                   [&](std::string_view c) { return sameName(c, detected); });
  if (!sseOnly) return {};
  if (isa.avx512f && isa.avx512cd && isa.avx512bw && isa.avx512dq && isa.avx512vl) return "SkylakeX";
  if (isa.avx2 && isa.fma) return "Haswell";
  if (isa.avx) return "Sandybridge";
  return {};
}

void selectBlasCore(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const std::string detected = blasCoreName();
  const std::string better = betterBlasCore(detected, hostVectorIsa());
  if (better.empty() || argv == nullptr || argv[0] == nullptr) return;
  if (::setenv("OPENBLAS_CORETYPE", better.c_str(), 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  // Only reached when the exec failed; the variable stays set for any child process, which is harmless.
  std::fprintf(stderr,
               "note: OpenBLAS chose its %s kernels on a CPU that runs %s; re-executing with "
               "OPENBLAS_CORETYPE=%s failed (%s), so BLAS runs the slower kernels\n",
               detected.c_str(), better.c_str(), better.c_str(), std::strerror(errno));
}

}  // namespace ms::cpu
