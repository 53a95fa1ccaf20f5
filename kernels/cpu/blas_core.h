// Which OpenBLAS kernels this process runs, and the fix when OpenBLAS picks the wrong ones.
//
// Debian 12's OpenBLAS (0.3.21, DYNAMIC_ARCH) chooses its kernels from the CPU's family and model number when
// it is loaded. A CPU newer than the library (measured: an Intel family 6 model 207, Emerald Rapids, in a VM)
// falls through to the Prescott core, SSE3 kernels from 2004: a 256^3 sgemm ran at 14-16 GFLOP/s there
// against 87 with the SkylakeX kernels the CPU supports, and the engine's GPT step took 4x as long. OpenBLAS
// reads OPENBLAS_CORETYPE in its load-time constructor, before main, so the only way to change the choice
// from inside the process is to set the variable and execute the program again.
#pragma once

#include <string>
#include <string_view>

namespace ms::cpu {

// The vector instruction sets this CPU and its operating system support (the compiler's cpuid checks, which
// include the XSAVE state the OS enables).
struct CpuVectorIsa {
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512cd = false;
};
CpuVectorIsa hostVectorIsa();

// The core OpenBLAS chose ("Haswell", "Zen", "SkylakeX", "Prescott", ...), or "" when the BLAS linked is not
// OpenBLAS.
std::string blasCoreName();

// The OpenBLAS core to ask for instead of `detected`, or "" to keep it: only when `detected` is one of
// OpenBLAS's SSE-only cores (the fallback for CPUs it does not know) and the CPU has AVX or better. The best
// core the CPU runs: SkylakeX (AVX-512 F, CD, BW, DQ, VL), Haswell (AVX2 and FMA), Sandybridge (AVX).
std::string betterBlasCore(std::string_view detected, const CpuVectorIsa& isa);

// Call first thing in main, before MPI or any thread starts. When OPENBLAS_CORETYPE is unset and
// betterBlasCore(blasCoreName(), hostVectorIsa()) names a core, sets OPENBLAS_CORETYPE to it and executes
// /proc/self/exe again with the same arguments (same process id, so mpirun's bookkeeping holds); returns
// only when it did not. A variable the user set is always kept (OPENBLAS_CORETYPE=Prescott restores
// OpenBLAS's own choice). If the exec fails, says so on stderr and goes on with the detected core.
void selectBlasCore(char** argv);

}  // namespace ms::cpu
