// CUDA kernels: the ops of kernels/cpu/cpu_ops.h on the GPU, with the same names, argument order and
// semantics (row-major buffers, Conv1D linear weights, every backward ACCUMULATES (+=) into the gradients it
// writes, nullable gradients may be nullptr), so that ms::cpu is their reference. Differences that always
// hold:
// - Every buffer argument is a DEVICE pointer; the stream is the LAST argument and all work is enqueued on it
//   (asynchronous with respect to the host unless the function says otherwise).
// - Errors travel as values: every function returns an ms::Status naming the op and the CUDA or cuBLAS error
//   string. A failed launch is reported by the op that launched it; an error raised while a kernel RUNS
//   (an illegal address, say) is asynchronous and surfaces at the next checked call, usually synchronize().
//   Such errors are sticky in CUDA: the context is unusable afterwards, so treat any failure as fatal for the
//   rank. Nothing here throws, exits or aborts.
// - GEMMs (linear layers and the products inside attention) go through cuBLAS in fp32 or TF32, chosen by
//   setGemmMode(). TF32 rounds the GEMM inputs to a 10-bit mantissa: expect relative errors near 1e-3.
// - Accumulating gradients with atomics (embeddingBackward, sumSquares) is not bitwise deterministic run to
//   run; every other op is.
// This header compiles in plain C++ translation units (it needs only the CUDA runtime API header).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "engine/plan/status.h"

namespace ms::cuda {

// ---- Errors
// ------------------------------------------------------------------------------------------------ ok for
// cudaSuccess, else an error "<what>: <cudaGetErrorName>: <cudaGetErrorString>".
Status cudaStatus(cudaError_t err, const char* what);
// Checks the launch just made (cudaGetLastError, which also clears a non-sticky error): call after every
// <<<...>>>. what names the op.
Status checkLaunch(const char* what);

// ---- GEMM precision --------------------------------------------------------------------------------------
// Fp32: CUBLAS_COMPUTE_32F, no tensor-core shortcuts. Tf32: CUBLAS_COMPUTE_32F_FAST_TF32 (inputs rounded
// to TF32, fp32 accumulation). Process-wide, like ms::cpu::setThreads(); default Fp32. Set it once at start
// up, before any GEMM is enqueued.
enum class GemmMode { Fp32, Tf32 };
void setGemmMode(GemmMode mode);
GemmMode gemmMode();

// ---- Memory helpers --------------------------------------------------------------------------------------
Status deviceAlloc(void** ptr, size_t bytes);  // *ptr = nullptr when bytes == 0
Status deviceFree(void* ptr);                  // nullptr is fine
// Copies that return once the data has arrived (they synchronise the stream), so host buffers may be
// pageable and reused at once.
Status copyToDevice(void* dst, const void* src, size_t bytes, cudaStream_t stream);
Status copyToHost(void* dst, const void* src, size_t bytes, cudaStream_t stream);
Status fillZero(void* dst, size_t bytes, cudaStream_t stream);  // asynchronous
Status synchronize(cudaStream_t stream);

// A device array of n T's, freed on destruction. Move-only. create() reports allocation failure as a Status.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static Expected<DeviceBuffer> create(size_t n) {
    DeviceBuffer b;
    void* p = nullptr;
    Status s = deviceAlloc(&p, n * sizeof(T));
    if (!s.isOk()) return s;
    b.m_data = static_cast<T*>(p);
    b.m_size = n;
    return b;
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : m_data(std::exchange(o.m_data, nullptr)), m_size(std::exchange(o.m_size, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      (void)deviceFree(m_data);
      m_data = std::exchange(o.m_data, nullptr);
      m_size = std::exchange(o.m_size, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { (void)deviceFree(m_data); }

  T* data() const { return m_data; }
  size_t size() const { return m_size; }
  size_t bytes() const { return m_size * sizeof(T); }

 private:
  T* m_data = nullptr;
  size_t m_size = 0;
};

// ---- Linear (cuda_linear.cu, cuBLAS) -------------------------------------------------------------------
// out (N, OC) = inp (N, C) @ weight (C, OC) + bias (OC). bias nullable.
Status linearForward(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                     int OC, cudaStream_t stream);
// dinp (N, C) += dout @ weight^T; dweight (C, OC) += inp^T @ dout; dbias (OC) += sum_n dout. All nullable.
Status linearBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                      const float* weight, int N, int C, int OC, cudaStream_t stream);
// weight stored (OC, C): out (N, OC) = inp (N, C) @ weight^T + bias. bias nullable.
Status linearForwardT(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                      int OC, cudaStream_t stream);
// dinp (N, C) += dout @ weight; dweight (OC, C) += dout^T @ inp; dbias (OC) += sum_n dout. All nullable.
Status linearBackwardT(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int N, int C, int OC, cudaStream_t stream);

// ---- LayerNorm over the last dimension (cuda_layernorm.cu) ----------------------------------------------
// out (N, C) = (inp - mean) * rstd * weight + bias; saves mean (N) and rstd (N).
Status layerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int N, int C, float eps, cudaStream_t stream);
// dinp (N, C) +=, dweight (C) +=, dbias (C) +=. dweight, dbias nullable.
Status layerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                         const float* weight, const float* mean, const float* rstd, int N, int C,
                         cudaStream_t stream);

// ---- Pointwise (cuda_pointwise.cu) ----------------------------------------------------------------------
Status geluForward(float* out, const float* inp, size_t n, cudaStream_t stream);  // tanh approximation
Status geluBackward(float* dinp, const float* dout, const float* inp, size_t n, cudaStream_t stream);  // +=
Status reluForward(float* out, const float* inp, size_t n, cudaStream_t stream);
Status reluBackward(float* dinp, const float* dout, const float* inp, size_t n, cudaStream_t stream);  // +=
Status tanhForward(float* out, const float* inp, size_t n, cudaStream_t stream);
// Uses the OUTPUT of tanhForward; dinp +=.
Status tanhBackward(float* dinp, const float* dout, const float* out, size_t n, cudaStream_t stream);
Status add(float* out, const float* a, const float* b, size_t n, cudaStream_t stream);  // out may alias a, b
Status accumulate(float* y, const float* x, size_t n, cudaStream_t stream);             // y += x
Status scale(float* y, float s, size_t n, cudaStream_t stream);                         // y *= s

// ---- Attention (cuda_attention.cu) ----------------------------------------------------------------------
// Same layout as ms::cpu: qkv (B, T, 3C) with [q | k | v] per position, head h owns channels [h*hs,
// (h+1)*hs), out (B, T, C), att (B, H, T, T) softmax probabilities (0 above the diagonal when causal). A
// plain materialised-softmax implementation (cuBLAS strided-batched GEMMs + a softmax kernel), not a fused
// one.
Status attentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int H, bool causal,
                        cudaStream_t stream);
// dqkv (B, T, 3C) +=. scratch: at least B*H*T*T floats, contents undefined on return.
Status attentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                         int B, int T, int C, int H, bool causal, cudaStream_t stream);

// ---- Embeddings (cuda_embedding.cu) ---------------------------------------------------------------------
// out (B, T, C) = wte[tokens[b, t]] + wpe[t]. tokens is a device array (B, T), each in [0, V).
Status embeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                        int C, cudaStream_t stream);
// dwte (V, C) +=, dwpe (maxT, C) +=, either nullable. Atomic adds: not bitwise deterministic.
Status embeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                         int C, cudaStream_t stream);

// ---- Loss (cuda_loss.cu) ---------------------------------------------------------------------------------
// losses (N) = -log softmax(logits (N, V))[target]. dlogits nullable; if set it is OVERWRITTEN with
// gradScale * (softmax - onehot(target)) and may alias logits. target < 0: loss 0, gradient row 0.
Status softmaxCrossEntropy(float* losses, float* dlogits, const float* logits, const int32_t* targets, int N,
                           int V, float gradScale, cudaStream_t stream);
// out (N) = argmax of each row of x (N, V); ties go to the lowest index.
Status argmaxRows(int32_t* out, const float* x, int N, int V, cudaStream_t stream);

// ---- Optimizers and reductions (cuda_optimizer.cu) ------------------------------------------------------
// AdamW as ms::cpu::adamwUpdate (torch.optim.AdamW's operation order); t is the 1-based step.
Status adamwUpdate(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                   float beta2, float eps, float weightDecay, int t, float gradScale, cudaStream_t stream);
// SGD with momentum as ms::cpu::sgdUpdate (PyTorch's definition). buf may be null when momentum is 0.
Status sgdUpdate(float* params, const float* grads, float* buf, size_t n, float lr, float momentum,
                 float weightDecay, bool nesterov, bool firstStep, float gradScale, cudaStream_t stream);
// *result (ONE double in DEVICE memory) = sum of x^2, accumulated in double. The result stays on the device
// so that a norm over many buffers needs one copy; it is overwritten, not accumulated.
Status sumSquares(double* result, const float* x, size_t n, cudaStream_t stream);

}  // namespace ms::cuda

// Returns early from a function returning Status (or Expected<T>) when a CUDA runtime call fails.
#define MS_CUDA_CHECK(expr) MS_TRY(::ms::cuda::cudaStatus((expr), #expr))
