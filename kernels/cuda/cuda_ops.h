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
// - GEMMs (linear layers and the products inside attention) go through cuBLAS in fp32, TF32 or bf16, chosen
//   by setGemmMode(). TF32 rounds the GEMM inputs to a 10-bit mantissa, bf16 to a 7-bit one: expect relative
//   errors near 1e-3 and 1e-2 against fp32.
// - Accumulating gradients with atomics (embeddingBackward, embeddingRangeBackward, sumSquares) is not
//   bitwise deterministic run to run; every other op is.
// - Elementwise kernels are grid-stride loops over size_t indices (any element count); row kernels give a
//   row to a block or a warp.
// This header compiles in plain C++ translation units (it needs only the CUDA runtime API header).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "common/status.h"
#include "kernels/backend.h"

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
// to TF32, fp32 accumulation). Bf16: every GEMM operand is converted to __nv_bfloat16 (round to nearest
// even, roundToBf16 below) and multiplied by cuBLAS with CUDA_R_16BF inputs, CUDA_R_32F results and
// CUBLAS_COMPUTE_32F (fp32 accumulation); accumulating GEMMs keep beta = 1 on the fp32 result, biases,
// softmax and everything else stay fp32 (mixed precision as torch.autocast runs matmuls). Process-wide,
// like ms::cpu::setThreads(); default Fp32. Set it once at start up, before any GEMM is enqueued.
//
// Bf16 scratch: the bf16 copies live in grow-only device buffers, a few operand slots per calling thread
// and device (cudaMalloc'd; growing frees the old buffer with cudaFree, which waits for the device, so
// growth is safe whatever is still queued). Each op converts into its slots and the GEMMs that read them are
// enqueued right after on the same stream, so the next op's conversion (a later call) cannot overwrite a
// copy still being read: REUSE IS SAFE BY STREAM ORDER ONLY WHEN A THREAD ENQUEUES ALL ITS GEMM OPS ON ONE
// STREAM, which the CUDA backend guarantees (its one compute stream). As a safety net, a GEMM op issued on a
// different stream than the previous one of the same thread and device synchronises the device before
// reusing the scratch. The buffers are freed when the thread ends. Weights are converted on every call;
// caching their bf16 copies once per optimizer step is a possible optimisation.
enum class GemmMode { Fp32, Tf32, Bf16 };
void setGemmMode(GemmMode mode);
GemmMode gemmMode();
// dst (n bf16 bit patterns) = src (n floats) rounded to bf16, round to nearest even (__float2bfloat16_rn;
// NaN stays NaN, overflow rounds to infinity). Asynchronous. The conversion every Bf16 GEMM operand takes.
Status roundToBf16(uint16_t* dst, const float* src, size_t n, cudaStream_t stream);
// dst (n floats) = src (n bf16 bit patterns), exactly (cuda_convert.cu). Asynchronous.
Status widenBf16(float* dst, const uint16_t* src, size_t n, cudaStream_t stream);
// Creates the calling thread's cuBLAS handle for the current device now (cublasCreate allocates and
// synchronises, which is better done at start up than inside the first step) and binds it to stream. Every
// GEMM binds the handle to its own stream argument anyway.
Status prepareGemm(cudaStream_t stream);

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
// inp and weight are fp32 or, in GemmMode::Bf16 only, bf16 already rounded (ms::TensorIn; used as it is, no
// conversion: the parameter store's bf16 working copy of a weight, a layer's kept input). A bf16 one in
// another mode fails naming the op and the operand, whether or not the call reads it.
// out (N, OC) = inp (N, C) @ weight (C, OC) + bias (OC). bias nullable.
Status linearForward(float* out, TensorIn inp, TensorIn weight, const float* bias, int N, int C, int OC,
                     cudaStream_t stream);
// dinp (N, C) += dout @ weight^T; dweight (C, OC) += inp^T @ dout; dbias (OC) += sum_n dout. All nullable.
Status linearBackward(float* dinp, float* dweight, float* dbias, const float* dout, TensorIn inp,
                      TensorIn weight, int N, int C, int OC, cudaStream_t stream);
// weight stored (OC, C): out (N, OC) = inp (N, C) @ weight^T + bias. bias nullable.
Status linearForwardT(float* out, TensorIn inp, TensorIn weight, const float* bias, int N, int C, int OC,
                      cudaStream_t stream);
// dinp (N, C) += dout @ weight; dweight (OC, C) += dout^T @ inp; dbias (OC) += sum_n dout. All nullable.
Status linearBackwardT(float* dinp, float* dweight, float* dbias, const float* dout, TensorIn inp,
                       TensorIn weight, int N, int C, int OC, cudaStream_t stream);

// ---- LayerNorm over the last dimension (cuda_layernorm.cu) ----------------------------------------------
// out (N, C) = (inp - mean) * rstd * weight + bias; saves mean (N) and rstd (N).
Status layerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int N, int C, float eps, cudaStream_t stream);
// dinp (N, C) +=, dweight (C) +=, dbias (C) +=. dweight, dbias nullable.
Status layerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                         const float* weight, const float* mean, const float* rstd, int N, int C,
                         cudaStream_t stream);

// ---- Llama-family pieces (cuda_llama.cu): the ops of kernels/cpu/llama.cpp -----------------------------
// RMSNorm (Zhang & Sennrich 2019): out (N, C) = inp * rstd * weight, rstd (N) = 1 / sqrt(mean(inp^2) + eps).
Status rmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps,
                      cudaStream_t stream);
// dinp (N, C) +=, dweight (C) += (nullable; layerNormBackward's deterministic two-stage column sum).
Status rmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                       const float* rstd, int N, int C, cudaStream_t stream);
// SwiGLU (Shazeer 2020): out = silu(gate) * up (out may alias gate or up); backward dgate +=, dup +=.
Status swigluForward(float* out, const float* gate, const float* up, size_t n, cudaStream_t stream);
Status swigluBackward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                      size_t n, cudaStream_t stream);
// Rotary embeddings (Su et al. 2021; Hugging Face Llama's half-split pairs) with grouped-query key/value
// heads repeated (Ainslie et al. 2023): qkv (B, T, 3 H hs) from q (B, T, H hs), k, v (B, T, KV hs), positions
// posStart + t, the angles formed as the CPU forms them. The transpose OVERWRITES dq, dk and dv, a key/value
// head's repeated gradients summed in head order (the CPU's fp32 sums) and rotated back. A shape
// ropeShapeProblem rejects (H not a positive multiple of KV, hs odd), or hs above 8192 (the angle tables live
// in shared memory), fails naming the op. Deterministic.
Status ropePackQkv(float* qkv, const float* q, const float* k, const float* v, int B, int T, int H, int KV,
                   int hs, float theta, int posStart, cudaStream_t stream);
Status ropeUnpackQkv(float* dq, float* dk, float* dv, const float* dqkv, int B, int T, int H, int KV, int hs,
                     float theta, int posStart, cudaStream_t stream);

// ---- Mixture of experts (cuda_moe.cu): the ops of kernels/cpu/moe.cpp, rows moved by index lists ----------
// idx (and scale, nullable: 1) are n int32 (float) DEVICE values; n may be 0 (nothing is launched). n < 0 or
// C < 1 fails naming the op, whatever n is. Indices are not checked (they live on the device). Deterministic.
// dst (n, C) = scale[r] * src[idx[r]] (an index may repeat).
Status gatherRows(float* dst, const float* src, const int32_t* idx, const float* scale, int n, int C,
                  cudaStream_t stream);
// dst[idx[r]] += scale[r] * src[r]; the idx entries of one call are distinct (no atomics).
Status scatterAddRows(float* dst, const float* src, const int32_t* idx, const float* scale, int n, int C,
                      cudaStream_t stream);
// out[r] = sum_c a[idx[r], c] * b[r, c], OVERWRITTEN: a warp per row summing in the CPU's laneSum order.
Status rowDots(float* out, const float* a, const int32_t* idx, const float* b, int n, int C,
               cudaStream_t stream);

// ---- Convolution and batch norm, NCHW (cuda_conv.cu) ----------------------------------------------------
// ms::cpu's conv2dForward / conv2dBackward and batch-norm parts (kernels/cpu/cpu_ops.h, Conv2dShape in
// kernels/conv_shape.h). A shape Conv2dShape::problem() (or batchNormShapeProblem) rejects, or count <= 0,
// fails naming the op. Deterministic: no atomics anywhere.
// Convolution: an im2col kernel unfolds up to conv2dChunk(s) samples at a time into the caller's workspace
// `cols` (conv2dColumnsFloats(s) floats, device memory, contents undefined on return) and cuBLAS multiplies
// them with the weight (strided-batched over the samples) in the process GemmMode, as the linear layers
// (inp and weight may be bf16 in GemmMode::Bf16 and are then used as they are; the unfolded columns of a
// bf16 input are bf16). Backward: dweight += dout_b @ cols_b^T sample by sample (in order), the columns'
// gradient weight^T @ dout_b folded back by col2im as a gather (each input element sums its kernel offsets
// in order: no atomics), and dbias the per-channel sum of dout in double (like batchNormStats).
int conv2dChunk(const Conv2dShape& s);             // samples per im2col pass (1 to B)
size_t conv2dColumnsFloats(const Conv2dShape& s);  // conv2dChunk(s) * K * P
// out = conv(inp, weight) + bias (nullable).
Status conv2dForward(float* out, TensorIn inp, TensorIn weight, const float* bias, const Conv2dShape& s,
                     float* cols, cudaStream_t stream);
// dinp +=, dweight +=, dbias +=; each nullable.
Status conv2dBackward(float* dinp, float* dweight, float* dbias, const float* dout, TensorIn inp,
                      TensorIn weight, const Conv2dShape& s, float* cols, cudaStream_t stream);
// Batch norm (Ioffe & Szegedy 2015). The per-channel sums are C doubles in device memory; each is a block
// per (channel, slice of the channel's B * S elements) summing in double into scratch, and a second kernel
// adding the slices in order (the cut depends on the shape alone).
Status batchNormStats(double* sum, double* sumSq, const float* x, int B, int C, int S, cudaStream_t stream);
Status batchNormMoments(float* mean, float* rstd, double* var, const double* sum, const double* sumSq,
                        double count, int C, float eps, cudaStream_t stream);
Status batchNormUpdateRunning(float* runningMean, float* runningVar, const float* mean, const double* var,
                              double count, int C, float momentum, cudaStream_t stream);
// weight, bias nullable.
Status batchNormApply(float* out, const float* x, const float* mean, const float* rstd, const float* weight,
                      const float* bias, int B, int C, int S, cudaStream_t stream);
Status batchNormGradStats(double* sumDy, double* sumDyXhat, const float* dout, const float* x,
                          const float* mean, const float* rstd, int B, int C, int S, cudaStream_t stream);
// weight nullable; dinp, dweight, dbias nullable.
Status batchNormBackwardApply(float* dinp, float* dweight, float* dbias, const float* dout, const float* x,
                              const float* mean, const float* rstd, const float* weight, const double* sumDy,
                              const double* sumDyXhat, const double* localSumDy, const double* localSumDyXhat,
                              double count, int B, int C, int S, cudaStream_t stream);

// ---- Pointwise (cuda_pointwise.cu) ----------------------------------------------------------------------
Status geluForward(float* out, const float* inp, size_t n, cudaStream_t stream);  // tanh approximation
Status geluBackward(float* dinp, const float* dout, const float* inp, size_t n, cudaStream_t stream);  // +=
// kept (n bf16) = bf16(inp), out (n bf16) = bf16(gelu(kept)): toBf16, fromBf16, geluForward and toBf16 in
// one kernel, bit for bit (Backend::geluForwardBf16).
Status geluForwardBf16(uint16_t* kept, uint16_t* out, const float* inp, size_t n, cudaStream_t stream);
// dinp += gelu'(kept) * dout with kept (n bf16) widened in registers: geluBackward's bits.
Status geluBackwardBf16(float* dinp, const float* dout, const uint16_t* kept, size_t n, cudaStream_t stream);
Status reluForward(float* out, const float* inp, size_t n, cudaStream_t stream);
Status reluBackward(float* dinp, const float* dout, const float* inp, size_t n, cudaStream_t stream);  // +=
Status tanhForward(float* out, const float* inp, size_t n, cudaStream_t stream);
// Uses the OUTPUT of tanhForward; dinp +=.
Status tanhBackward(float* dinp, const float* dout, const float* out, size_t n, cudaStream_t stream);
Status add(float* out, const float* a, const float* b, size_t n, cudaStream_t stream);  // out may alias a, b
Status accumulate(float* y, const float* x, size_t n, cudaStream_t stream);             // y += x
Status scale(float* y, float s, size_t n, cudaStream_t stream);                         // y *= s

// x (rows, C): every row += row (C).
Status addRows(float* x, const float* row, size_t rows, int C, cudaStream_t stream);

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

// ---- Fused attention (cuda_flash_attention.cu, cuda_flash_attention_tc.cu) ------------------------------
// The same attention without the (B, H, T, T) matrices, FlashAttention-style (Dao et al. 2022): the forward
// keeps an online softmax per query row and saves only the row's log-sum-exp; the backward recomputes the
// probabilities from q, k and it. Head sizes up to kFlashAttentionMaxHeadSize; the materialised path's bf16
// operand rounding in GemmMode::Bf16 (q, k, v, dout, the probabilities and dS rounded, fp32 sums), fp32
// otherwise. Deterministic (no atomics). Two kernels:
// - Scalar: fp32 arithmetic, a warp per row; any head size, every GemmMode.
// - TensorCore: bf16 MMAs with fp32 accumulation (FlashAttention-2 tiling, mma.sync with the scores in
//   registers); bf16 operands ALWAYS, whatever the GemmMode; head sizes 16, 32, 64, 96 and 128, compute
//   capability 8.0 or newer, and qkv, out, dout and dqkv 16-byte aligned (cudaMalloc's are).
// - TensorCoreWmma: the same through nvcuda::wmma (the first tensor-core kernel, its scores staged in shared
//   memory), the same conditions; kept to compare against (tests, bench/attention.cpp), never chosen.
// flashAttentionForward/Backward run TensorCore in GemmMode::Bf16 when it applies, Scalar otherwise. The
// environment variable MESHSTUDIO_FLASH_TC=0 forces Scalar (to compare the two); it is read once per process,
// and a value other than 0 or 1 makes every call fail with a message naming it.
constexpr int kFlashAttentionMaxHeadSize = 128;
constexpr const char* kFlashTensorCoreEnv = "MESHSTUDIO_FLASH_TC";
enum class FlashAttentionKernel { Scalar, TensorCore, TensorCoreWmma };
// out (B, T, C); lse (B, H, T) = log sum_j exp(score_ij) over the keys row i sees.
Status flashAttentionForward(float* out, float* lse, const float* qkv, int B, int T, int C, int H,
                             bool causal, cudaStream_t stream);
// dqkv (B, T, 3C) +=, from the forward's out and lse. scratch: at least B*H*T floats, contents undefined on
// return.
Status flashAttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                              const float* out, const float* lse, int B, int T, int C, int H, bool causal,
                              cudaStream_t stream);
// The same with the kernel named by the caller (tests, bench/attention.cpp): an error when TensorCore does
// not apply (head size, device, alignment). Pair a backward with the forward of the same kernel (each
// recomputes the probabilities its own forward formed; the other's lse differs by rounding only).
Status flashAttentionForwardWith(FlashAttentionKernel kernel, float* out, float* lse, const float* qkv, int B,
                                 int T, int C, int H, bool causal, cudaStream_t stream);
Status flashAttentionBackwardWith(FlashAttentionKernel kernel, float* dqkv, float* scratch, const float* dout,
                                  const float* qkv, const float* out, const float* lse, int B, int T, int C,
                                  int H, bool causal, cudaStream_t stream);
// MESHSTUDIO_FLASH_TC's value (nullptr: unset) as a switch: unset or "1" allow the tensor-core kernel, "0"
// forbids it, anything else is an error naming the variable.
Expected<bool> parseFlashTensorCoreSwitch(const char* value);

// ---- Ring attention's blocks (cuda_ring_attention.cu): context parallelism ------------------------------
// Backend::attentionBlockForward / attentionBlockBackward (kernels/backend.h has the contract, ms::cpu's
// forms in kernels/cpu/ring_attention.cpp are the reference): the queries of qkv (B, Tq, 3C) against one
// block of KV key/value heads kv (B, Tk, 2 KV hs), masked by the rows' positions (SeqPositions), merged into
// out (B, Tq, C) and lse (B, H, Tq) through the online softmax; the backward from the final out and lse
// adds into the q part of dqkv and into dkv. fp32 scalar kernels after the fused attention's, no atomics
// (deterministic); in GemmMode::Bf16 q, k, v and dout are rounded to bf16 where loaded (the probabilities are
// not), Tf32 computes in fp32 like the fused attention. Head sizes up to kRingAttentionMaxHeadSize. A head
// count KV that does not divide H (checked first, whatever the other sizes), C not divisible by H, a larger
// head or a block too long for the grid fails naming the op; so does a bf16 out outside GemmMode::Bf16.
// The backward's D = rowsum(dout * out) (B, H, Tq) lives in the calling thread's reduction scratch
// (cuda_common.cuh), under that scratch's one-stream rule.
constexpr int kRingAttentionMaxHeadSize = 256;
Status attentionBlockForward(float* out, float* lse, const float* qkv, const float* kv, int B, int Tq, int Tk,
                             int C, int H, int KV, SeqPositions qpos, SeqPositions kpos, bool causal,
                             bool first, cudaStream_t stream);
// out: the forward's final output, fp32 or (GemmMode::Bf16 only) bf16, widened exactly.
Status attentionBlockBackward(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv,
                              TensorIn out, const float* lse, int B, int Tq, int Tk, int C, int H, int KV,
                              SeqPositions qpos, SeqPositions kpos, bool causal, cudaStream_t stream);

// ---- Embeddings (cuda_embedding.cu) ---------------------------------------------------------------------
// out (B, T, C) = wte[tokens[b, t]] + wpe[t]. tokens is a device array (B, T), each in [0, V).
Status embeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                        int C, cudaStream_t stream);
// dwte (V, C) +=, dwpe (maxT, C) +=, either nullable. Atomic adds: not bitwise deterministic.
Status embeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                         int C, cudaStream_t stream);

// ---- Tensor-parallel pieces (cuda_tp.cu): the ops of kernels/cpu/tp_ops.cpp ---------------------------
// y (B, T, C): y[b, t] += wpe[t].
Status addPositions(float* y, const float* wpe, int B, int T, int C, cudaStream_t stream);
// The same with a bf16 table (mixed precision's working parameters), widened exactly.
Status addPositions(float* y, const uint16_t* wpe, int B, int T, int C, cudaStream_t stream);
// Vocabulary-parallel embedding: wte holds rows [vocabStart, vocabStart + vocabCount). out (N, C) =
// wte[tokens[n] - vocabStart] for tokens in the range, 0 elsewhere.
Status embeddingRangeForward(float* out, const int32_t* tokens, const float* wte, int vocabStart,
                             int vocabCount, int N, int C, cudaStream_t stream);
Status embeddingRangeForward(float* out, const int32_t* tokens, const uint16_t* wte, int vocabStart,
                             int vocabCount, int N, int C, cudaStream_t stream);
// dwte[tokens[n] - vocabStart] += dout[n] for tokens in the range. Atomic adds: not bitwise deterministic
// (the CPU's position order is).
Status embeddingRangeBackward(float* dwte, const float* dout, const int32_t* tokens, int vocabStart,
                              int vocabCount, int N, int C, cudaStream_t stream);
// Vocabulary-parallel cross-entropy over logits (N, V) holding columns [vocabStart, vocabStart + V); the
// caller all-reduces between the steps. 1: mx (N) = row maxima.
Status rowMax(float* mx, const float* logits, int N, int V, cudaStream_t stream);
// 2: sumExp (N) = sum_j exp(logits - mx); targetLogit (N) = logits[target - vocabStart] when the target is
// in the range, else 0.
Status crossEntropyPartials(float* sumExp, float* targetLogit, const float* logits, const float* mx,
                            const int32_t* targets, int vocabStart, int N, int V, cudaStream_t stream);
// 3: losses (N) = log(sumExp) - (targetLogit - mx), 0 where target < 0; dlogits (nullable, may alias logits)
// OVERWRITTEN with gradScale * (softmax - onehot(target)) over the rank's columns, 0 rows where target < 0.
Status crossEntropyFinish(float* losses, float* dlogits, const float* logits, const float* mx,
                          const float* sumExp, const float* targetLogit, const int32_t* targets,
                          int vocabStart, int N, int V, float gradScale, cudaStream_t stream);

// ---- Vision transformer pieces (cuda_vit.cu): the ops of kernels/cpu/vit.cpp ---------------------------
// images (B, S, S) -> patches (B, NP, P*P), NP = (S/P)^2, S divisible by P.
Status patchify(float* patches, const float* images, int B, int S, int P, cudaStream_t stream);
// out (B, T, C), T = NP + cls: [clsToken +] x + pos. clsToken nullable when cls is false.
Status tokensForward(float* out, const float* x, const float* clsToken, const float* pos, int B, int NP,
                     int C, bool cls, cudaStream_t stream);
// dx (B, NP, C) +=, dcls (C) +=, dpos (T, C) +=, each nullable. dcls and dpos sum over the batch in batch
// order, one thread per output element: deterministic, the CPU's order.
Status tokensBackward(float* dx, float* dcls, float* dpos, const float* dout, int B, int NP, int C, bool cls,
                      cudaStream_t stream);
// out (B, C) = inp[:, 0, :] when useFirst, else the mean over T of inp (B, T, C).
Status poolForward(float* out, const float* inp, int B, int T, int C, bool useFirst, cudaStream_t stream);
// dinp (B, T, C) +=.
Status poolBackward(float* dinp, const float* dout, int B, int T, int C, bool useFirst, cudaStream_t stream);

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
// Multi-tensor forms (the backend's adamwUpdateSegments / sgdUpdateSegments): many tensors in ONE launch.
// The segments are a table in DEVICE memory, each entry a tensor's buffers (device pointers), its size and
// weight decay, plus what planOptimizerSegments fills in on the host: the AdamW decay 1 - lr * weightDecay
// (computed as optim::adamwScalars does, so every element sees the single form's scalars) and the first block
// of the launch that works on it. Block b of the launch updates elements [(b - firstBlock) * chunk, + chunk)
// of the entry with the last firstBlock <= b (a binary search over the table), its threads striding through
// the chunk; so every block has one segment and the grid covers every element once.
struct OptimizerSegmentEntry {
  float* params = nullptr;
  const float* grads = nullptr;         // fp32 gradients, or
  const uint16_t* gradsBf16 = nullptr;  // bf16 ones ("grad_precision": "bf16"), widened exactly as read
  float* m = nullptr;  // AdamW first moment, or SGD momentum buffer (null when the momentum is 0)
  float* v = nullptr;  // AdamW second moment (unused by SGD)
  size_t n = 0;        // 0 is fine (no blocks)
  float weightDecay = 0;
  float decay = 1;        // filled by planOptimizerSegments
  size_t firstBlock = 0;  // filled by planOptimizerSegments
};
// The launch over a table: `blocks` blocks, each over `chunk` elements (or a segment's last, shorter part).
struct OptimizerSegmentLaunch {
  unsigned blocks = 0;  // 0: nothing to do
  size_t chunk = 0;
};
// Fills decay and firstBlock of entries[0, count) (host memory) for learning rate lr, before the table is
// copied to the device; the chunk is 4096 elements, more when the grid would pass 2^31 - 1 blocks.
OptimizerSegmentLaunch planOptimizerSegments(OptimizerSegmentEntry* entries, size_t count, float lr);
// AdamW over the table (DEVICE memory, count entries planned with the same lr), as adamwUpdate per entry.
Status adamwUpdateSegments(const OptimizerSegmentEntry* table, size_t count, OptimizerSegmentLaunch launch,
                           float lr, float beta1, float beta2, float eps, int t, float gradScale,
                           cudaStream_t stream);
// SGD over the table, as sgdUpdate per entry (each with its weightDecay; m unused when momentum is 0).
Status sgdUpdateSegments(const OptimizerSegmentEntry* table, size_t count, OptimizerSegmentLaunch launch,
                         float lr, float momentum, bool nesterov, bool firstStep, float gradScale,
                         cudaStream_t stream);
// *result (ONE double in DEVICE memory) = sum of x^2, accumulated in double. The result stays on the device
// so that a norm over many buffers needs one copy; it is overwritten, not accumulated.
Status sumSquares(double* result, const float* x, size_t n, cudaStream_t stream);
// *result += sum of x^2 (the same reduction, accumulated): a norm over many buffers zeroes the double once,
// accumulates each buffer, then copies one value back.
Status sumSquaresAccumulate(double* result, const float* x, size_t n, cudaStream_t stream);
// The same over bf16 values (bf16 gradients), widened exactly.
Status sumSquaresAccumulate(double* result, const uint16_t* x, size_t n, cudaStream_t stream);

}  // namespace ms::cuda

// Returns early from a function returning Status (or Expected<T>) when a CUDA runtime call fails.
#define MS_CUDA_CHECK(expr) MS_TRY(::ms::cuda::cudaStatus((expr), #expr))
