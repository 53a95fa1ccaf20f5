// The CUDA backend; see cuda_backend.h. Plain C++ over the CUDA runtime API: every op forwards to its
// ms::cuda function (cuda_ops.h) with the backend's compute stream, and a failed Status becomes a thrown
// DeviceFailure.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_ops.h"

namespace ms {
namespace {

constexpr size_t kAlignment = 256;  // backend.h promises 256-byte aligned allocations

// FP32 lanes per SM by compute capability (the CUDA C Programming Guide's arithmetic-instruction throughput
// table: 64 results per clock per SM for fp32 add/multiply/fma on 6.0, 7.x and 8.0, 128 on 5.x, 6.1/6.2,
// 8.6/8.7/8.9, 9.0 and Blackwell). 0 for an architecture this table does not know (peak then stays 0).
int fp32LanesPerSm(int major, int minor) {
  switch (major) {
    case 5:
      return 128;
    case 6:
      return minor == 0 ? 64 : 128;
    case 7:
      return 64;
    case 8:
      return minor == 0 ? 64 : 128;
    case 9:
    case 10:
    case 11:
    case 12:
      return 128;
    default:
      return 0;
  }
}

std::string cudaText(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : m_device(device) {}

  // Process-wide (ms::cuda::setGemmMode): every CUDA backend of the process computes in the last precision
  // set. Bf16 converts the operands into scratch reused call after call, which is safe because every op of
  // this backend runs on its one compute stream (cuda_ops.h).
  void setGemmPrecision(GemmPrecision p) override {
    switch (p) {
      case GemmPrecision::Fp32:
        cuda::setGemmMode(cuda::GemmMode::Fp32);
        break;
      case GemmPrecision::Tf32:
        cuda::setGemmMode(cuda::GemmMode::Tf32);
        break;
      case GemmPrecision::Bf16:
        cuda::setGemmMode(cuda::GemmMode::Bf16);
        break;
    }
    m_gemm = p;
  }
  GemmPrecision gemmPrecision() const override { return m_gemm; }

  // Everything that can fail at creation; on failure the destructor releases what was made.
  Status init() {
    int count = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
      cudaGetLastError();
      return Status::error("no usable CUDA device: " + cudaText(e));
    }
    if (m_device < 0 || m_device >= count)
      return Status::error("no CUDA device " + std::to_string(m_device) + " (" + std::to_string(count) +
                           " present)");
    MS_CUDA_CHECK(cudaSetDevice(m_device));
    int pools = 0;
    MS_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, m_device));
    if (!pools)
      return Status::error("the device does not support stream-ordered allocation (cudaMallocAsync)");
    MS_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&m_pool, m_device));
    // Keep freed memory cached in the pool for reuse instead of returning it at every synchronisation.
    uint64_t threshold = UINT64_MAX;
    MS_CUDA_CHECK(cudaMemPoolSetAttribute(m_pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    MS_CUDA_CHECK(cudaStreamCreateWithFlags(&m_stream, cudaStreamNonBlocking));
    MS_CUDA_CHECK(cudaEventCreate(&m_anchor));
    MS_CUDA_CHECK(cudaEventCreateWithFlags(&m_tableCopied, cudaEventDisableTiming));
    MS_CUDA_CHECK(
        cudaMallocFromPoolAsync(reinterpret_cast<void**>(&m_sum), sizeof(double), m_pool, m_stream));
    MS_TRY(cuda::prepareGemm(m_stream));
    MS_CUDA_CHECK(cudaStreamSynchronize(m_stream));

    cudaDeviceProp prop{};
    MS_CUDA_CHECK(cudaGetDeviceProperties(&prop, m_device));
    int clockKhz = 0;  // cudaDeviceProp::clockRate is gone from recent CUDA; the attribute stays
    MS_CUDA_CHECK(cudaDeviceGetAttribute(&clockKhz, cudaDevAttrClockRate, m_device));
    int maxPitch = 0;
    MS_CUDA_CHECK(cudaDeviceGetAttribute(&maxPitch, cudaDevAttrMaxPitch, m_device));
    m_maxPitch = size_t(maxPitch);
    m_info.kind = DeviceKind::Cuda;
    m_info.name = prop.name;
    m_info.index = m_device;
    m_info.totalBytes = int64_t(prop.totalGlobalMem);
    m_info.peakFlopsFp32 =
        2.0 * prop.multiProcessorCount * fp32LanesPerSm(prop.major, prop.minor) * double(clockKhz) * 1e3;
    m_info.peakFlopsBf16 = 0;  // the runtime maps device names to the hardware catalog
    m_where = "CUDA device " + std::to_string(m_device) + " (" + m_info.name + ")";
    return Status::ok();
  }

  ~CudaBackend() override {
    // Errors here have nobody to report to (and the context may already be broken).
    if (cudaSetDevice(m_device) != cudaSuccess) return;
    if (m_stream) {
      cudaStreamSynchronize(m_stream);
      if (m_sum) cudaFreeAsync(m_sum, m_stream);
      if (m_tableDevice) cudaFreeAsync(m_tableDevice, m_stream);
      for (float* p : m_paramScratch)
        if (p) cudaFreeAsync(p, m_stream);
      cudaStreamSynchronize(m_stream);
    }
    if (m_tableHost) cudaFreeHost(m_tableHost);
    if (m_tableCopied) cudaEventDestroy(m_tableCopied);
    for (cudaEvent_t e : m_events) cudaEventDestroy(e);
    if (m_anchor) cudaEventDestroy(m_anchor);
    if (m_stream) cudaStreamDestroy(m_stream);
    if (m_pool) cudaMemPoolTrimTo(m_pool, 0);  // give the cached memory back
    cudaGetLastError();
  }

  cudaStream_t stream() const { return m_stream; }

  const DeviceInfo& info() const override { return m_info; }
  bool deviceMemory() const override { return true; }

  // ---- memory ------------------------------------------------------------------------------------------
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    current();
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = nullptr;
    cudaError_t e = cudaMallocFromPoolAsync(&p, rounded, m_pool, m_stream);
    if (e == cudaErrorMemoryAllocation) {
      // The pool's cached blocks may be free but too small or fragmented: return them to the device (after
      // the pending frees have happened) and try once more.
      cudaGetLastError();  // an allocation failure is not sticky; clear it
      check(cudaStreamSynchronize(m_stream), "allocate: cudaStreamSynchronize");
      check(cudaMemPoolTrimTo(m_pool, 0), "allocate: cudaMemPoolTrimTo");
      p = nullptr;
      e = cudaMallocFromPoolAsync(&p, rounded, m_pool, m_stream);
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        size_t freeBytes = 0, totalBytes = 0;
        cudaMemGetInfo(&freeBytes, &totalBytes);
        throw DeviceFailure(m_where + ": allocate: out of device memory: asked for " + std::to_string(bytes) +
                            " bytes, " + std::to_string(freeBytes) + " bytes free of " +
                            std::to_string(totalBytes) + " (" + std::to_string(reservedBytes()) +
                            " bytes held by the caching allocator)");
      }
    }
    check(e, ("allocate: cudaMallocFromPoolAsync of " + std::to_string(bytes) + " bytes").c_str());
    if (reinterpret_cast<uintptr_t>(p) % kAlignment != 0) {
      cudaFreeAsync(p, m_stream);
      throw DeviceFailure(m_where + ": allocate: cudaMallocFromPoolAsync returned a pointer not aligned to " +
                          std::to_string(kAlignment) + " bytes");
    }
    check(cudaMemsetAsync(p, 0, rounded, m_stream), "allocate: cudaMemsetAsync");
    return p;
  }

  // Never throws: it runs in destructors, also while a DeviceFailure unwinds; a failure here is a broken
  // context, which the next checked call reports.
  void deallocate(void* ptr, size_t) override {
    if (!ptr) return;
    if (cudaSetDevice(m_device) != cudaSuccess || cudaFreeAsync(ptr, m_stream) != cudaSuccess)
      cudaGetLastError();  // not left for the next op's launch check to report as its own
  }

  void upload(void* dst, const void* hostSrc, size_t bytes) override {
    if (bytes == 0) return;
    current();
    run("upload", cuda::copyToDevice(dst, hostSrc, bytes, m_stream));
  }
  void download(void* hostDst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    current();
    run("download", cuda::copyToHost(hostDst, src, bytes, m_stream));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    current();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, m_stream), "copy: cudaMemcpyAsync");
  }
  void copy2D(void* dst, size_t dstPitch, const void* src, size_t srcPitch, size_t widthBytes,
              size_t rows) override {
    if (rows == 0 || widthBytes == 0) return;
    current();
    if (rows == 1 || (dstPitch == widthBytes && srcPitch == widthBytes)) {
      check(cudaMemcpyAsync(dst, src, widthBytes * rows, cudaMemcpyDeviceToDevice, m_stream),
            "copy2D: cudaMemcpyAsync");
      return;
    }
    // cudaMemcpy2D wants pitches of at least the width and at most the device's maximum pitch; any other
    // layout (a source pitch of 0 repeats one row) is copied row by row.
    const auto fits = [&](size_t pitch) { return pitch >= widthBytes && pitch <= m_maxPitch; };
    if (fits(dstPitch) && fits(srcPitch)) {
      check(cudaMemcpy2DAsync(dst, dstPitch, src, srcPitch, widthBytes, rows, cudaMemcpyDeviceToDevice,
                              m_stream),
            "copy2D: cudaMemcpy2DAsync");
      return;
    }
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    for (size_t r = 0; r < rows; ++r)
      check(
          cudaMemcpyAsync(d + r * dstPitch, s + r * srcPitch, widthBytes, cudaMemcpyDeviceToDevice, m_stream),
          "copy2D: cudaMemcpyAsync");
  }
  void zero(void* dst, size_t bytes) override {
    if (bytes == 0) return;
    current();
    check(cudaMemsetAsync(dst, 0, bytes, m_stream), "zero: cudaMemsetAsync");
  }
  void synchronize() override {
    current();
    check(cudaStreamSynchronize(m_stream), "synchronize: cudaStreamSynchronize");
  }
  DeviceMemoryInfo memoryInfo() override {
    current();
    size_t freeBytes = 0, totalBytes = 0;
    check(cudaMemGetInfo(&freeBytes, &totalBytes), "memoryInfo: cudaMemGetInfo");
    DeviceMemoryInfo m;
    m.freeBytes = int64_t(freeBytes);
    m.totalBytes = int64_t(totalBytes);
    m.reservedBytes = reservedBytes();
    return m;
  }

  // ---- timing ------------------------------------------------------------------------------------------
  void setEpoch(std::chrono::steady_clock::time_point epoch) override { m_epoch = epoch; }
  int mark() override {
    current();
    if (!m_anchored) {
      // An idle stream, then the anchor: its GPU time lies between the host times before recording it and
      // after waiting for it; the midpoint is off by at most half of that (microseconds).
      check(cudaStreamSynchronize(m_stream), "mark: cudaStreamSynchronize");
      const double before = hostSeconds();
      check(cudaEventRecord(m_anchor, m_stream), "mark: cudaEventRecord");
      check(cudaEventSynchronize(m_anchor), "mark: cudaEventSynchronize");
      m_anchorHost = 0.5 * (before + hostSeconds());
      m_anchored = true;
    }
    if (m_marks == m_events.size()) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreate(&e), "mark: cudaEventCreate");
      m_events.push_back(e);
    }
    check(cudaEventRecord(m_events[m_marks], m_stream), "mark: cudaEventRecord");
    return int(m_marks++);
  }
  double markTime(int mark) override {
    if (mark < 0 || size_t(mark) >= m_marks)
      throw DeviceFailure(m_where + ": markTime: no mark " + std::to_string(mark));
    current();
    check(cudaEventSynchronize(m_events[size_t(mark)]), "markTime: cudaEventSynchronize");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, m_anchor, m_events[size_t(mark)]), "markTime: cudaEventElapsedTime");
    return m_anchorHost + double(ms) * 1e-3;
  }
  void clearMarks() override {
    m_marks = 0;  // the events stay for reuse
    m_anchored = false;
  }

  // ---- linear -------------------------------------------------------------------------------------------
  void linearForward(float* out, TensorIn inp, TensorIn weight, TensorIn bias, int N, int C,
                     int OC) override {
    op("linearForward", cuda::linearForward, out, inp, weight, pv(bias, size_t(OC), 0, "linearForward"), N, C,
       OC);
  }
  void linearBackward(float* dinp, GradOut dweight, GradOut dbias, const float* dout, TensorIn inp,
                      TensorIn weight, int N, int C, int OC) override {
    const size_t nw = size_t(C) * OC;
    float* dw = gw(dweight, nw, 0, "linearBackward");
    float* db = gw(dbias, size_t(OC), 1, "linearBackward");
    op("linearBackward", cuda::linearBackward, dinp, dw, db, dout, inp, weight, N, C, OC);
    gradDone(dweight, nw, 0, "linearBackward");
    gradDone(dbias, size_t(OC), 1, "linearBackward");
  }
  void linearForwardT(float* out, TensorIn inp, TensorIn weight, TensorIn bias, int N, int C,
                      int OC) override {
    op("linearForwardT", cuda::linearForwardT, out, inp, weight, pv(bias, size_t(OC), 0, "linearForwardT"), N,
       C, OC);
  }
  void linearBackwardT(float* dinp, GradOut dweight, GradOut dbias, const float* dout, TensorIn inp,
                       TensorIn weight, int N, int C, int OC) override {
    const size_t nw = size_t(OC) * C;
    float* dw = gw(dweight, nw, 0, "linearBackwardT");
    float* db = gw(dbias, size_t(OC), 1, "linearBackwardT");
    op("linearBackwardT", cuda::linearBackwardT, dinp, dw, db, dout, inp, weight, N, C, OC);
    gradDone(dweight, nw, 0, "linearBackwardT");
    gradDone(dbias, size_t(OC), 1, "linearBackwardT");
  }
  void toBf16(bfloat16* dst, const float* src, size_t n) override {
    op("toBf16", cuda::roundToBf16, reinterpret_cast<uint16_t*>(dst), src, n);
  }
  void fromBf16(float* dst, const bfloat16* src, size_t n) override {
    op("fromBf16", cuda::widenBf16, dst, reinterpret_cast<const uint16_t*>(src), n);
  }

  // ---- layer norm ---------------------------------------------------------------------------------------
  void layerNormForward(float* out, float* mean, float* rstd, const float* inp, TensorIn weight,
                        TensorIn bias, int N, int C, float eps) override {
    op("layerNormForward", cuda::layerNormForward, out, mean, rstd, inp,
       pv(weight, size_t(C), 0, "layerNormForward"), pv(bias, size_t(C), 1, "layerNormForward"), N, C, eps);
  }
  void layerNormBackward(float* dinp, GradOut dweight, GradOut dbias, const float* dout, const float* inp,
                         TensorIn weight, const float* mean, const float* rstd, int N, int C) override {
    float* dw = gw(dweight, size_t(C), 0, "layerNormBackward");
    float* db = gw(dbias, size_t(C), 1, "layerNormBackward");
    op("layerNormBackward", cuda::layerNormBackward, dinp, dw, db, dout, inp,
       pv(weight, size_t(C), 0, "layerNormBackward"), mean, rstd, N, C);
    gradDone(dweight, size_t(C), 0, "layerNormBackward");
    gradDone(dbias, size_t(C), 1, "layerNormBackward");
  }

  // ---- Llama-family pieces --------------------------------------------------------------------------------
  // RMSNorm's weight widened like the layer norm's (pv), its gradient through gw/gradDone; the RoPE shape
  // checked here as on the CPU (the kernels check again).
  void rmsNormForward(float* out, float* rstd, const float* inp, TensorIn weight, int N, int C,
                      float eps) override {
    op("rmsNormForward", cuda::rmsNormForward, out, rstd, inp, pv(weight, size_t(C), 0, "rmsNormForward"), N,
       C, eps);
  }
  void rmsNormBackward(float* dinp, GradOut dweight, const float* dout, const float* inp, TensorIn weight,
                       const float* rstd, int N, int C) override {
    float* dw = gw(dweight, size_t(C), 0, "rmsNormBackward");
    op("rmsNormBackward", cuda::rmsNormBackward, dinp, dw, dout, inp,
       pv(weight, size_t(C), 0, "rmsNormBackward"), rstd, N, C);
    gradDone(dweight, size_t(C), 0, "rmsNormBackward");
  }
  void swigluForward(float* out, const float* gate, const float* up, size_t n) override {
    op("swigluForward", cuda::swigluForward, out, gate, up, n);
  }
  void swigluBackward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                      size_t n) override {
    op("swigluBackward", cuda::swigluBackward, dgate, dup, dout, gate, up, n);
  }
  void ropePackQkv(float* qkv, const float* q, const float* k, const float* v, int B, int T, int H, int KV,
                   int hs, float theta, int posStart) override {
    checkHeads(H, KV, hs, "ropePackQkv");
    op("ropePackQkv", cuda::ropePackQkv, qkv, q, k, v, B, T, H, KV, hs, theta, posStart);
  }
  void ropeUnpackQkv(float* dq, float* dk, float* dv, const float* dqkv, int B, int T, int H, int KV, int hs,
                     float theta, int posStart) override {
    checkHeads(H, KV, hs, "ropeUnpackQkv");
    op("ropeUnpackQkv", cuda::ropeUnpackQkv, dq, dk, dv, dqkv, B, T, H, KV, hs, theta, posStart);
  }

  // ---- mixture of experts ---------------------------------------------------------------------------------
  // idx and scale are device memory like every other operand; the kernels check n and C.
  void gatherRows(float* dst, const float* src, const int32_t* idx, const float* scale, int n,
                  int C) override {
    op("gatherRows", cuda::gatherRows, dst, src, idx, scale, n, C);
  }
  void scatterAddRows(float* dst, const float* src, const int32_t* idx, const float* scale, int n,
                      int C) override {
    op("scatterAddRows", cuda::scatterAddRows, dst, src, idx, scale, n, C);
  }
  void rowDots(float* out, const float* a, const int32_t* idx, const float* b, int n, int C) override {
    op("rowDots", cuda::rowDots, out, a, idx, b, n, C);
  }

  // ---- convolution and batch norm -------------------------------------------------------------------------
  // The im2col columns live in scratch slot 4 (cuda::conv2dColumnsFloats: a chunk of samples, at most about
  // 64 MiB unless one sample needs more), grown in stream order like the others. inp and weight go to the
  // kernels as TensorIn (cuBLAS multiplies a bf16 one as it is, as in linearForward).
  void conv2dForward(float* out, TensorIn inp, TensorIn weight, TensorIn bias,
                     const Conv2dShape& s) override {
    checkConv(s, "conv2dForward");
    checkBf16(inp, "conv2dForward");
    checkBf16(weight, "conv2dForward");
    const float* b = pv(bias, size_t(s.OC), 0, "conv2dForward");
    float* cols = scratch(4, cuda::conv2dColumnsFloats(s));
    op("conv2dForward", cuda::conv2dForward, out, inp, weight, b, s, cols);
  }
  void conv2dBackward(float* dinp, GradOut dweight, GradOut dbias, const float* dout, TensorIn inp,
                      TensorIn weight, const Conv2dShape& s) override {
    checkConv(s, "conv2dBackward");
    checkBf16(inp, "conv2dBackward");
    checkBf16(weight, "conv2dBackward");
    const size_t nw = size_t(s.OC) * s.K();
    float* dw = gw(dweight, nw, 0, "conv2dBackward");
    float* db = gw(dbias, size_t(s.OC), 1, "conv2dBackward");
    float* cols = (dinp || dw) ? scratch(4, cuda::conv2dColumnsFloats(s)) : nullptr;
    op("conv2dBackward", cuda::conv2dBackward, dinp, dw, db, dout, inp, weight, s, cols);
    gradDone(dweight, nw, 0, "conv2dBackward");
    gradDone(dbias, size_t(s.OC), 1, "conv2dBackward");
  }
  void batchNormStats(double* sum, double* sumSq, const float* x, int B, int C, int S) override {
    op("batchNormStats", cuda::batchNormStats, sum, sumSq, x, B, C, S);
  }
  void batchNormMoments(float* mean, float* rstd, double* var, const double* sum, const double* sumSq,
                        double count, int C, float eps) override {
    op("batchNormMoments", cuda::batchNormMoments, mean, rstd, var, sum, sumSq, count, C, eps);
  }
  void batchNormUpdateRunning(float* runningMean, float* runningVar, const float* mean, const double* var,
                              double count, int C, float momentum) override {
    op("batchNormUpdateRunning", cuda::batchNormUpdateRunning, runningMean, runningVar, mean, var, count, C,
       momentum);
  }
  void batchNormApply(float* out, const float* x, const float* mean, const float* rstd, TensorIn weight,
                      TensorIn bias, int B, int C, int S) override {
    checkBatchNorm(B, C, S, "batchNormApply");
    op("batchNormApply", cuda::batchNormApply, out, x, mean, rstd, pv(weight, size_t(C), 0, "batchNormApply"),
       pv(bias, size_t(C), 1, "batchNormApply"), B, C, S);
  }
  void batchNormGradStats(double* sumDy, double* sumDyXhat, const float* dout, const float* x,
                          const float* mean, const float* rstd, int B, int C, int S) override {
    op("batchNormGradStats", cuda::batchNormGradStats, sumDy, sumDyXhat, dout, x, mean, rstd, B, C, S);
  }
  void batchNormBackwardApply(float* dinp, GradOut dweight, GradOut dbias, const float* dout, const float* x,
                              const float* mean, const float* rstd, TensorIn weight, const double* sumDy,
                              const double* sumDyXhat, const double* localSumDy, const double* localSumDyXhat,
                              double count, int B, int C, int S) override {
    checkBatchNorm(B, C, S, "batchNormBackwardApply");
    const float* w = pv(weight, size_t(C), 0, "batchNormBackwardApply");
    float* dw = gw(dweight, size_t(C), 0, "batchNormBackwardApply");
    float* db = gw(dbias, size_t(C), 1, "batchNormBackwardApply");
    op("batchNormBackwardApply", cuda::batchNormBackwardApply, dinp, dw, db, dout, x, mean, rstd, w, sumDy,
       sumDyXhat, localSumDy, localSumDyXhat, count, B, C, S);
    gradDone(dweight, size_t(C), 0, "batchNormBackwardApply");
    gradDone(dbias, size_t(C), 1, "batchNormBackwardApply");
  }

  // ---- pointwise ----------------------------------------------------------------------------------------
  void geluForward(float* out, const float* inp, size_t n) override {
    op("geluForward", cuda::geluForward, out, inp, n);
  }
  void geluBackward(float* dinp, const float* dout, const float* inp, size_t n) override {
    op("geluBackward", cuda::geluBackward, dinp, dout, inp, n);
  }
  void geluForwardBf16(bfloat16* kept, bfloat16* out, const float* inp, size_t n) override {
    op("geluForwardBf16", cuda::geluForwardBf16, reinterpret_cast<uint16_t*>(kept),
       reinterpret_cast<uint16_t*>(out), inp, n);
  }
  void geluBackwardBf16(float* dinp, const float* dout, const bfloat16* kept, size_t n) override {
    op("geluBackwardBf16", cuda::geluBackwardBf16, dinp, dout, reinterpret_cast<const uint16_t*>(kept), n);
  }
  void reluForward(float* out, const float* inp, size_t n) override {
    op("reluForward", cuda::reluForward, out, inp, n);
  }
  void reluBackward(float* dinp, const float* dout, const float* inp, size_t n) override {
    op("reluBackward", cuda::reluBackward, dinp, dout, inp, n);
  }
  void tanhForward(float* out, const float* inp, size_t n) override {
    op("tanhForward", cuda::tanhForward, out, inp, n);
  }
  void tanhBackward(float* dinp, const float* dout, const float* out, size_t n) override {
    op("tanhBackward", cuda::tanhBackward, dinp, dout, out, n);
  }
  void add(float* out, const float* a, const float* b, size_t n) override {
    op("add", cuda::add, out, a, b, n);
  }
  void accumulate(float* y, const float* x, size_t n) override {
    op("accumulate", cuda::accumulate, y, x, n);
  }
  void accumulateGrad(GradOut y, TensorIn x, size_t n) override {
    if (y.bf16 != x.bf16) fail("accumulateGrad", "the two gradients differ in precision");
    if (!y.bf16) return accumulate(y.f32(), x.f32(), n);
    float* acc = gw(y, n, 0, "accumulateGrad");
    float* wide = scratch(3, n);
    run("accumulateGrad", cuda::widenBf16(wide, reinterpret_cast<const uint16_t*>(x.data), n, m_stream));
    accumulate(acc, wide, n);
    gradDone(y, n, 0, "accumulateGrad");
  }
  void scale(float* y, float s, size_t n) override { op("scale", cuda::scale, y, s, n); }
  void addRows(float* x, TensorIn row, size_t rows, int C) override {
    op("addRows", cuda::addRows, x, pv(row, size_t(C), 0, "addRows"), rows, C);
  }

  // ---- attention ----------------------------------------------------------------------------------------
  // Head sizes up to cuda::kFlashAttentionMaxHeadSize take the fused kernel: saved is the rows' log-sum-exp
  // and backward's scratch their rowsum(dout * out), (B, H, T) each, plus in bf16 an fp32 copy of a bf16 out
  // (B, T, C). Larger heads (and shapes the kernels reject, which then fail with their error) take the
  // materialised softmax: (B, H, T, T) each.
  static bool fusedAttention(int C, int H) {
    return H > 0 && C > 0 && C % H == 0 && C / H <= cuda::kFlashAttentionMaxHeadSize;
  }
  size_t attentionSavedFloats(int B, int T, int C, int H) const override {
    return fusedAttention(C, H) ? size_t(B) * H * T : size_t(B) * H * T * T;
  }
  size_t attentionScratchFloats(int B, int T, int C, int H) const override {
    if (!fusedAttention(C, H)) return size_t(B) * H * T * T;
    return size_t(B) * H * T + (m_gemm == GemmPrecision::Bf16 ? size_t(B) * T * C : 0);
  }
  void attentionForward(float* out, float* saved, const float* qkv, int B, int T, int C, int H,
                        bool causal) override {
    if (fusedAttention(C, H))
      op("attentionForward", cuda::flashAttentionForward, out, saved, qkv, B, T, C, H, causal);
    else
      op("attentionForward", cuda::attentionForward, out, saved, qkv, B, T, C, H, causal);
  }
  void attentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* saved,
                         TensorIn out, int B, int T, int C, int H, bool causal) override {
    if (out.bf16 && m_gemm != GemmPrecision::Bf16)
      throw DeviceFailure("attentionBackward: a bf16 out needs the bf16 GEMM precision");
    if (fusedAttention(C, H)) {
      const float* out32 = out.f32();
      if (out.bf16) {  // the kernel reads fp32: widen into the scratch past its (B, H, T) part
        float* wide = scratch + size_t(B) * H * T;
        op("attentionBackward: widen out", cuda::widenBf16, wide, reinterpret_cast<const uint16_t*>(out.data),
           size_t(B) * T * C);
        out32 = wide;
      }
      op("attentionBackward", cuda::flashAttentionBackward, dqkv, scratch, dout, qkv, out32, saved, B, T, C,
         H, causal);
    } else
      op("attentionBackward", cuda::attentionBackward, dqkv, scratch, dout, qkv, saved, B, T, C, H, causal);
  }
  // Ring attention's blocks (context parallelism; cuda_ring_attention.cu): fp32 kernels over q, k, v and dout
  // rounded in bf16 as the CPU backend rounds them. The kernels check the head counts first (KV must divide
  // H) and that a bf16 out comes with the bf16 precision, and widen a bf16 out themselves (no scratch here).
  void attentionBlockForward(float* out, float* lse, const float* qkv, const float* kv, int B, int Tq, int Tk,
                             int C, int H, int KV, SeqPositions qpos, SeqPositions kpos, bool causal,
                             bool first) override {
    op("attentionBlockForward", cuda::attentionBlockForward, out, lse, qkv, kv, B, Tq, Tk, C, H, KV, qpos,
       kpos, causal, first);
  }
  void attentionBlockBackward(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv,
                              TensorIn out, const float* lse, int B, int Tq, int Tk, int C, int H, int KV,
                              SeqPositions qpos, SeqPositions kpos, bool causal) override {
    op("attentionBlockBackward", cuda::attentionBlockBackward, dqkv, dkv, dout, qkv, kv, out, lse, B, Tq, Tk,
       C, H, KV, qpos, kpos, causal);
  }

  // ---- embeddings ---------------------------------------------------------------------------------------
  void embeddingForward(float* out, const int32_t* tokens, TensorIn wte, TensorIn wpe, int B, int T,
                        int C) override {
    if (!wte.bf16 && !wpe.bf16) {
      op("embeddingForward", cuda::embeddingForward, out, tokens, wte.f32(), wpe.f32(), B, T, C);
      return;
    }
    // Mixed precision: the token rows (the whole vocabulary as one range), then the positions; out = wte +
    // wpe rounds once either way. Checked here first, so that a refusal names this op.
    checkBf16(wte, "embeddingForward");
    checkBf16(wpe, "embeddingForward");
    embeddingRangeForward(out, tokens, wte, 0, std::numeric_limits<int>::max(), B * T, C);
    addPositions(out, wpe, B, T, C);
  }
  void embeddingBackward(GradOut dwte, GradOut dwpe, const float* dout, const int32_t* tokens, int B, int T,
                         int C, int V) override {
    const size_t nte = size_t(V) * C, npe = size_t(T) * C;
    float* dte = gw(dwte, nte, 0, "embeddingBackward");
    float* dpe = gw(dwpe, npe, 1, "embeddingBackward");
    op("embeddingBackward", cuda::embeddingBackward, dte, dpe, dout, tokens, B, T, C);
    gradDone(dwte, nte, 0, "embeddingBackward");
    gradDone(dwpe, npe, 1, "embeddingBackward");
  }
  void embeddingRangeForward(float* out, const int32_t* tokens, TensorIn wte, int vocabStart, int vocabCount,
                             int N, int C) override {
    checkBf16(wte, "embeddingRangeForward");
    if (wte.bf16)
      op("embeddingRangeForward",
         static_cast<Status (*)(float*, const int32_t*, const uint16_t*, int, int, int, int, cudaStream_t)>(
             cuda::embeddingRangeForward),
         out, tokens, reinterpret_cast<const uint16_t*>(wte.data), vocabStart, vocabCount, N, C);
    else
      op("embeddingRangeForward",
         static_cast<Status (*)(float*, const int32_t*, const float*, int, int, int, int, cudaStream_t)>(
             cuda::embeddingRangeForward),
         out, tokens, wte.f32(), vocabStart, vocabCount, N, C);
  }
  void embeddingRangeBackward(GradOut dwte, const float* dout, const int32_t* tokens, int vocabStart,
                              int vocabCount, int N, int C) override {
    const size_t n = size_t(vocabCount) * C;
    float* d = gw(dwte, n, 0, "embeddingRangeBackward");
    op("embeddingRangeBackward", cuda::embeddingRangeBackward, d, dout, tokens, vocabStart, vocabCount, N, C);
    gradDone(dwte, n, 0, "embeddingRangeBackward");
  }
  void addPositions(float* y, TensorIn wpe, int B, int T, int C) override {
    checkBf16(wpe, "addPositions");
    if (wpe.bf16)
      op("addPositions",
         static_cast<Status (*)(float*, const uint16_t*, int, int, int, cudaStream_t)>(cuda::addPositions), y,
         reinterpret_cast<const uint16_t*>(wpe.data), B, T, C);
    else
      op("addPositions",
         static_cast<Status (*)(float*, const float*, int, int, int, cudaStream_t)>(cuda::addPositions), y,
         wpe.f32(), B, T, C);
  }

  // ---- loss ---------------------------------------------------------------------------------------------
  void softmaxCrossEntropy(float* losses, float* dlogits, const float* logits, const int32_t* targets, int N,
                           int V, float gradScale) override {
    op("softmaxCrossEntropy", cuda::softmaxCrossEntropy, losses, dlogits, logits, targets, N, V, gradScale);
  }
  void argmaxRows(int32_t* out, const float* x, int N, int V) override {
    op("argmaxRows", cuda::argmaxRows, out, x, N, V);
  }
  void rowMax(float* mx, const float* logits, int N, int V) override {
    op("rowMax", cuda::rowMax, mx, logits, N, V);
  }
  void crossEntropyPartials(float* sumExp, float* targetLogit, const float* logits, const float* mx,
                            const int32_t* targets, int vocabStart, int N, int V) override {
    op("crossEntropyPartials", cuda::crossEntropyPartials, sumExp, targetLogit, logits, mx, targets,
       vocabStart, N, V);
  }
  void crossEntropyFinish(float* losses, float* dlogits, const float* logits, const float* mx,
                          const float* sumExp, const float* targetLogit, const int32_t* targets,
                          int vocabStart, int N, int V, float gradScale) override {
    op("crossEntropyFinish", cuda::crossEntropyFinish, losses, dlogits, logits, mx, sumExp, targetLogit,
       targets, vocabStart, N, V, gradScale);
  }

  // ---- vision transformer pieces ------------------------------------------------------------------------
  void patchify(float* patches, const float* images, int B, int S, int P) override {
    op("patchify", cuda::patchify, patches, images, B, S, P);
  }
  void tokensForward(float* out, const float* x, TensorIn clsToken, TensorIn pos, int B, int NP, int C,
                     bool cls) override {
    op("tokensForward", cuda::tokensForward, out, x, pv(clsToken, size_t(C), 0, "tokensForward"),
       pv(pos, size_t(NP + (cls ? 1 : 0)) * C, 1, "tokensForward"), B, NP, C, cls);
  }
  void tokensBackward(float* dx, GradOut dcls, GradOut dpos, const float* dout, int B, int NP, int C,
                      bool cls) override {
    const size_t npos = size_t(NP + (cls ? 1 : 0)) * C;
    float* dc = gw(dcls, size_t(C), 0, "tokensBackward");
    float* dp = gw(dpos, npos, 1, "tokensBackward");
    op("tokensBackward", cuda::tokensBackward, dx, dc, dp, dout, B, NP, C, cls);
    gradDone(dcls, size_t(C), 0, "tokensBackward");
    gradDone(dpos, npos, 1, "tokensBackward");
  }
  void poolForward(float* out, const float* inp, int B, int T, int C, bool useFirst) override {
    op("poolForward", cuda::poolForward, out, inp, B, T, C, useFirst);
  }
  void poolBackward(float* dinp, const float* dout, int B, int T, int C, bool useFirst) override {
    op("poolBackward", cuda::poolBackward, dinp, dout, B, T, C, useFirst);
  }

  // ---- optimizers and reductions ------------------------------------------------------------------------
  void adamwUpdate(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                   float beta2, float eps, float weightDecay, int t, float gradScale) override {
    op("adamwUpdate", cuda::adamwUpdate, params, grads, m, v, n, lr, beta1, beta2, eps, weightDecay, t,
       gradScale);
  }
  void sgdUpdate(float* params, const float* grads, float* buf, size_t n, float lr, float momentum,
                 float weightDecay, bool nesterov, bool firstStep, float gradScale) override {
    op("sgdUpdate", cuda::sgdUpdate, params, grads, buf, n, lr, momentum, weightDecay, nesterov, firstStep,
       gradScale);
  }
  // One launch over all the segments; the table goes up through the pinned buffer (stageSegments).
  void adamwUpdateSegments(const OptimizerSegment* segments, size_t count, float lr, float beta1, float beta2,
                           float eps, int t, float gradScale) override {
    if (count == 0) return;
    current();
    const cuda::OptimizerSegmentLaunch launch = stageSegments("adamwUpdateSegments", segments, count, lr);
    run("adamwUpdateSegments", cuda::adamwUpdateSegments(m_tableDevice, count, launch, lr, beta1, beta2, eps,
                                                         t, gradScale, m_stream));
  }
  void sgdUpdateSegments(const OptimizerSegment* segments, size_t count, float lr, float momentum,
                         bool nesterov, bool firstStep, float gradScale) override {
    if (count == 0) return;
    current();
    const cuda::OptimizerSegmentLaunch launch = stageSegments("sgdUpdateSegments", segments, count, lr);
    run("sgdUpdateSegments", cuda::sgdUpdateSegments(m_tableDevice, count, launch, lr, momentum, nesterov,
                                                     firstStep, gradScale, m_stream));
  }
  double sumSquares(const TensorIn* ptrs, const size_t* sizes, size_t count) override {
    current();
    check(cudaMemsetAsync(m_sum, 0, sizeof(double), m_stream), "sumSquares: cudaMemsetAsync");
    for (size_t i = 0; i < count; ++i) {
      checkBf16(ptrs[i], "sumSquares");
      if (ptrs[i].bf16)
        run("sumSquares", cuda::sumSquaresAccumulate(m_sum, reinterpret_cast<const uint16_t*>(ptrs[i].data),
                                                     sizes[i], m_stream));
      else
        run("sumSquares", cuda::sumSquaresAccumulate(m_sum, ptrs[i].f32(), sizes[i], m_stream));
    }
    double result = 0.0;
    run("sumSquares", cuda::copyToHost(&result, m_sum, sizeof result, m_stream));
    return result;
  }

 private:
  // Makes the backend's device current on the calling thread (cheap when it already is).
  void current() {
    int device = -1;
    if (cudaGetDevice(&device) != cudaSuccess || device != m_device)
      check(cudaSetDevice(m_device), "cudaSetDevice");
  }
  [[noreturn]] void fail(const char* what, const std::string& message) const {
    // ms::cuda messages usually start with the op's name already; do not say it twice.
    const std::string op(what);
    const bool named = message.compare(0, op.size(), op) == 0;
    throw DeviceFailure(m_where + ": " + (named ? message : op + ": " + message));
  }
  void run(const char* what, const Status& s) const {
    if (!s.isOk()) fail(what, s.message());
  }
  void check(cudaError_t e, const char* what) const {
    if (e != cudaSuccess) fail(what, cudaText(e));
  }
  // Shapes checked before any scratch is sized from them (the kernels check again, naming the op too).
  void checkConv(const Conv2dShape& s, const char* what) const {
    if (const std::string p = s.problem(); !p.empty()) fail(what, p);
  }
  void checkBatchNorm(int B, int C, int S, const char* what) const {
    if (const std::string p = batchNormShapeProblem(B, C, S); !p.empty()) fail(what, p);
  }
  void checkHeads(int H, int KV, int hs, const char* what) const {
    if (const std::string p = ropeShapeProblem(H, KV, hs); !p.empty()) fail(what, p);
  }
  // A bf16 TensorIn is only valid in GemmPrecision::Bf16 (as on the CPU).
  void checkBf16(TensorIn in, const char* what) const {
    if (in.bf16 && m_gemm != GemmPrecision::Bf16)
      fail(what, std::string("a bf16 operand needs the bf16 GEMM precision (it is ") +
                     (m_gemm == GemmPrecision::Tf32 ? "tf32" : "fp32") + ")");
  }
  // A parameter vector an op reads (a bias, LayerNorm weights, a row, ViT tokens): an fp32 one as it is; a
  // bf16 one (mixed precision's working parameters) widened exactly into device scratch `slot`, which grows
  // to the largest vector asked for (a few rows of C floats: small beside the model's buffers). Embedding
  // tables are read as bf16 by their kernels instead, never widened whole.
  const float* pv(TensorIn in, size_t n, int slot, const char* what) {
    checkBf16(in, what);
    if (!in.bf16) return in.f32();
    float* wide = scratch(slot, n);
    run(what, cuda::widenBf16(wide, reinterpret_cast<const uint16_t*>(in.data), n, m_stream));
    return wide;
  }
  // A gradient an op accumulates into: an fp32 one as it is; a bf16 one ("grad_precision": "bf16", only in
  // GemmPrecision::Bf16) widened exactly into scratch slot 2 + slot, where the op accumulates in fp32 before
  // gradDone() rounds it back (once per op, as a GEMM with a bf16 output and beta = 1). The scratch is the
  // size of the largest gradient asked for, a transient the memory model does not count yet (a GEMM writing
  // bf16 directly, cublasGemmEx with CUDA_R_16BF C, would need none).
  float* gw(GradOut out, size_t n, int slot, const char* what) {
    if (!out) return nullptr;
    if (!out.bf16) return out.f32();
    checkBf16(TensorIn(out.b16()), what);
    float* wide = scratch(2 + slot, n);
    run(what, cuda::widenBf16(wide, reinterpret_cast<const uint16_t*>(out.data), n, m_stream));
    return wide;
  }
  void gradDone(GradOut out, size_t n, int slot, const char* what) {
    if (!out.bf16) return;
    run(what,
        cuda::roundToBf16(reinterpret_cast<uint16_t*>(out.data), m_paramScratch[2 + slot], n, m_stream));
  }
  // Device scratch `slot` of at least n floats (grown in stream order, never shrunk).
  float* scratch(int slot, size_t n) {
    current();
    if (n > m_paramCapacity[slot]) {
      if (m_paramScratch[slot])
        check(cudaFreeAsync(std::exchange(m_paramScratch[slot], nullptr), m_stream),
              "parameter scratch: cudaFreeAsync");
      m_paramCapacity[slot] = 0;
      void* p = nullptr;
      check(cudaMallocFromPoolAsync(&p, n * sizeof(float), m_pool, m_stream),
            "parameter scratch: cudaMallocFromPoolAsync");
      m_paramScratch[slot] = static_cast<float*>(p);
      m_paramCapacity[slot] = n;
    }
    return m_paramScratch[slot];
  }
  // One op: the device made current, fn(args..., stream), a failure thrown.
  template <typename Fn, typename... Args>
  void op(const char* what, Fn fn, Args... args) {
    current();
    run(what, fn(args..., m_stream));
  }
  // Writes the segments into the pinned table, planned for lr, and enqueues its copy to the device table:
  // waits first for the previous call's copy out of the pinned buffer (m_tableCopied, recorded after it),
  // grows both tables when count exceeds their capacity (the old device table freed in stream order, after
  // the kernels that read it), and records m_tableCopied after the new copy. Nothing is copied when every
  // segment is empty (the launch then has no blocks).
  cuda::OptimizerSegmentLaunch stageSegments(const char* what, const OptimizerSegment* segments, size_t count,
                                             float lr) {
    const std::string op(what);
    check(cudaEventSynchronize(m_tableCopied), (op + ": cudaEventSynchronize").c_str());
    if (count > m_tableCapacity) {
      const size_t capacity = std::max({count, 2 * m_tableCapacity, size_t(64)});
      const size_t bytes = capacity * sizeof(cuda::OptimizerSegmentEntry);
      if (m_tableHost)
        check(cudaFreeHost(std::exchange(m_tableHost, nullptr)), (op + ": cudaFreeHost").c_str());
      if (m_tableDevice)
        check(cudaFreeAsync(std::exchange(m_tableDevice, nullptr), m_stream),
              (op + ": cudaFreeAsync").c_str());
      m_tableCapacity = 0;
      void* host = nullptr;
      check(cudaMallocHost(&host, bytes),
            (op + ": cudaMallocHost of " + std::to_string(bytes) + " bytes").c_str());
      m_tableHost = static_cast<cuda::OptimizerSegmentEntry*>(host);
      void* device = nullptr;
      check(cudaMallocFromPoolAsync(&device, bytes, m_pool, m_stream),
            (op + ": cudaMallocFromPoolAsync of " + std::to_string(bytes) + " bytes").c_str());
      m_tableDevice = static_cast<cuda::OptimizerSegmentEntry*>(device);
      m_tableCapacity = capacity;
    }
    for (size_t i = 0; i < count; ++i) {
      cuda::OptimizerSegmentEntry& e = m_tableHost[i];
      e = cuda::OptimizerSegmentEntry{};
      e.params = segments[i].params;
      if (segments[i].grads.bf16 && m_gemm != GemmPrecision::Bf16)
        fail(what, "bf16 gradients need the bf16 GEMM precision");
      e.grads = segments[i].grads.f32();
      e.gradsBf16 = reinterpret_cast<const uint16_t*>(segments[i].grads.b16());
      e.m = segments[i].m;
      e.v = segments[i].v;
      e.n = segments[i].n;
      e.weightDecay = segments[i].weightDecay;
    }
    const cuda::OptimizerSegmentLaunch launch = cuda::planOptimizerSegments(m_tableHost, count, lr);
    if (launch.blocks == 0) return launch;
    check(cudaMemcpyAsync(m_tableDevice, m_tableHost, count * sizeof(cuda::OptimizerSegmentEntry),
                          cudaMemcpyHostToDevice, m_stream),
          (op + ": cudaMemcpyAsync").c_str());
    check(cudaEventRecord(m_tableCopied, m_stream), (op + ": cudaEventRecord").c_str());
    return launch;
  }
  int64_t reservedBytes() const {
    uint64_t reserved = 0;
    if (cudaMemPoolGetAttribute(m_pool, cudaMemPoolAttrReservedMemCurrent, &reserved) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return int64_t(reserved);
  }
  double hostSeconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - m_epoch).count();
  }

  GemmPrecision m_gemm = GemmPrecision::Fp32;
  int m_device;
  std::string m_where = "CUDA device";
  DeviceInfo m_info;
  cudaStream_t m_stream = nullptr;
  cudaMemPool_t m_pool = nullptr;
  size_t m_maxPitch = 0;
  double* m_sum = nullptr;  // sumSquares' device accumulator
  // pv()'s widened parameter vectors (slots 0, 1), gw()'s widened bf16 gradients (2, 3) and the
  // convolutions' im2col columns (4).
  float* m_paramScratch[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
  size_t m_paramCapacity[5] = {0, 0, 0, 0, 0};
  // The multi-tensor optimizer's segment table (stageSegments): m_tableCapacity entries in pinned host memory
  // and as many in device memory; m_tableCopied is recorded after each copy out of the pinned buffer.
  cuda::OptimizerSegmentEntry* m_tableHost = nullptr;
  cuda::OptimizerSegmentEntry* m_tableDevice = nullptr;
  size_t m_tableCapacity = 0;
  cudaEvent_t m_tableCopied = nullptr;
  // Timing marks: m_events[0, m_marks) are this round's marks; the pool only grows.
  std::chrono::steady_clock::time_point m_epoch = std::chrono::steady_clock::now();
  cudaEvent_t m_anchor = nullptr;
  bool m_anchored = false;
  double m_anchorHost = 0.0;
  std::vector<cudaEvent_t> m_events;
  size_t m_marks = 0;
};

}  // namespace

Expected<std::unique_ptr<Backend>> makeCudaBackend(int device) {
  auto backend = std::make_unique<CudaBackend>(device);
  if (const Status s = backend->init(); !s.isOk())
    return s.withContext("creating the CUDA backend on device " + std::to_string(device));
  return std::unique_ptr<Backend>(std::move(backend));
}

cudaStream_t computeStream(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  return cuda ? cuda->stream() : nullptr;
}

}  // namespace ms
