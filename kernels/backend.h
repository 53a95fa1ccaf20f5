// The backend: the one interface through which the runtime allocates tensor memory, moves it, runs every op
// and times its work, so a layer is written once and runs on the CPU (kernels/cpu) or a GPU (kernels/cuda).
// A rank has one backend for its life.
//
// What always holds:
// - Every pointer an op or a memory call takes is BACKEND memory (from allocate()), except the explicit host
//   side of upload() and download(). With deviceMemory() true (a GPU, or the CPU's emulated device used by
//   tests) the host must never read or write backend memory directly; with it false backend memory is
//   ordinary host memory.
// - Work is ordered: each call's work happens after the work of every earlier call on the same backend (a
//   GPU enqueues it on one stream). Calls that hand data to the host (download, sumSquares, markTime) wait
//   for the work they depend on; the others may return before the work is done.
// - Op semantics are those of kernels/cpu/cpu_ops.h (row-major; Conv1D linear weights; every backward
//   ACCUMULATES into the gradients it writes; documented-nullable gradients may be nullptr), the reference
//   every backend is tested against. Ops added here (the *Range embedding, the vocabulary-parallel
//   cross-entropy pieces, addRows, addPositions, convolution and the batch-norm parts) are documented below
//   and in cpu_ops.h.
// - A failure (out of memory, a CUDA error) throws DeviceFailure naming the call and the reason; a GPU
//   context is unusable after most CUDA errors, so the rank treats it as fatal.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "kernels/conv_shape.h"

namespace ms {

enum class DeviceKind { Cpu, Cuda };

struct DeviceFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The precision of the GEMM operands (the linear layers' and attention's matrix products). Fp32: fp32 in,
// fp32 accumulate. Tf32 / Bf16: each operand rounded to TF32 (10-bit mantissa) or bf16 (7-bit mantissa, round
// to nearest even) before the product, fp32 accumulation and fp32 results, as tensor cores compute them
// (NVIDIA H100 architecture whitepaper, "Fourth-generation tensor cores"); everything outside the GEMMs stays
// fp32. Bf16 is the engine's mixed precision ("precision": "bf16"): every op reads the parameter store's bf16
// working parameters (TensorIn; runtime/parameters.h), the optimizer updates fp32 master weights, gradients
// are fp32 as Megatron-LM keeps them or bf16 ("grad_precision": "bf16", GradOut); the activations kept for
// backward that only feed GEMMs are stored in bf16 (TensorIn), the others in fp32.
enum class GemmPrecision { Fp32, Tf32, Bf16 };
const char* toString(GemmPrecision p);

// A bf16 value as stored (the top 16 bits of the fp32 bit pattern, rounded to nearest even by toBf16).
struct bfloat16 {
  uint16_t bits;
};

// A read-only tensor an op consumes as a GEMM operand (a linear layer's input and weight, attention's output
// in its backward): fp32, or bf16 rounded by toBf16. Layers in GemmPrecision::Bf16 keep such inputs in bf16
// between forward and backward, and read their weights from the parameter store's bf16 working copy, since
// the GEMMs round them to bf16 anyway: the products are the same, the memory is half and the per-call
// conversion is gone. Only a backend in GemmPrecision::Bf16 accepts a bf16 one (DeviceFailure naming the op
// otherwise). Implicit from either pointer type, so fp32 call sites read as before. Every PARAMETER an op
// reads (weights, biases, LayerNorm weights, embedding tables, positions) is a TensorIn too: in mixed
// precision the parameter store's working parameters are bf16 (runtime/parameters.h), and the op widens
// them exactly (bf16 -> fp32 is exact) and computes in fp32 as before.
struct TensorIn {
  const void* data = nullptr;
  bool bf16 = false;
  TensorIn() = default;
  TensorIn(std::nullptr_t) {}                                   // NOLINT: implicit on purpose
  TensorIn(const float* p) : data(p) {}                         // NOLINT
  TensorIn(const bfloat16* p) : data(p), bf16(p != nullptr) {}  // NOLINT
  const float* f32() const { return bf16 ? nullptr : static_cast<const float*>(data); }
  const bfloat16* b16() const { return bf16 ? static_cast<const bfloat16*>(data) : nullptr; }
  // The tensor from element i on (bf16 or fp32 elements).
  TensorIn at(size_t i) const {
    if (!data) return {};
    return bf16 ? TensorIn(b16() + i) : TensorIn(f32() + i);
  }
};

// A parameter GRADIENT an op accumulates into (+=): fp32, or bf16 when gradients are kept in bf16
// ("grad_precision": "bf16", only in GemmPrecision::Bf16, DeviceFailure naming the op otherwise). A bf16 one
// gets the op's contribution computed in fp32, added to its widened value and rounded once to nearest even,
// as a GEMM with a bf16 output and beta = 1 does (cublasGemmEx's fp32 compute type). Implicit from either
// pointer type, so fp32 call sites read as before; empty (nullptr) means the op computes no such gradient.
struct GradOut {
  void* data = nullptr;
  bool bf16 = false;
  GradOut() = default;
  GradOut(std::nullptr_t) {}                             // NOLINT: implicit on purpose
  GradOut(float* p) : data(p) {}                         // NOLINT
  GradOut(bfloat16* p) : data(p), bf16(p != nullptr) {}  // NOLINT
  explicit operator bool() const { return data != nullptr; }
  float* f32() const { return bf16 ? nullptr : static_cast<float*>(data); }
  bfloat16* b16() const { return bf16 ? static_cast<bfloat16*>(data) : nullptr; }
  // The gradient at element offset i (bf16 or fp32 elements).
  GradOut at(size_t i) const {
    if (!data) return {};
    return bf16 ? GradOut(b16() + i) : GradOut(f32() + i);
  }
};

// What the device is, for run_start and the MFU figures.
struct DeviceInfo {
  DeviceKind kind = DeviceKind::Cpu;
  std::string name;          // "NVIDIA H100 80GB HBM3", or "cpu (16 threads)"
  int index = -1;            // CUDA device ordinal (-1 on the CPU)
  int64_t totalBytes = 0;    // device memory (0 on the CPU: not the backend's to say)
  double peakFlopsFp32 = 0;  // dense, per second (0 when unknown)
  double peakFlopsBf16 = 0;  // dense tensor-core bf16, per second (0 when unknown or none)
  bool emulated = false;     // the CPU's emulated device (tests)
};

// The device's memory as the device sees it (all 0 on the CPU).
struct DeviceMemoryInfo {
  int64_t freeBytes = 0;      // cudaMemGetInfo
  int64_t totalBytes = 0;     // cudaMemGetInfo
  int64_t reservedBytes = 0;  // held by the backend's caching allocator (in use or cached for reuse)
};

// One tensor of a multi-tensor optimizer update (Backend::adamwUpdateSegments, sgdUpdateSegments): n
// elements of each buffer, all backend memory, updated with the segment's own weight decay (parameters
// differ: biases and LayerNorm weights take none). m is AdamW's first moment or SGD's momentum buffer
// (nullable when the momentum is 0); v is AdamW's second moment (unused, and nullable, for SGD).
struct OptimizerSegment {
  float* params = nullptr;
  TensorIn grads;  // fp32, or bf16 gradients ("grad_precision": "bf16"), widened exactly as they are read
  float* m = nullptr;
  float* v = nullptr;
  size_t n = 0;
  float weightDecay = 0;
};

// Positions of the rows of a sequence slice (context parallelism, Backend::attentionBlockForward): rows
// [0, split) hold positions start0 + t, rows [split, T) hold start1 + (t - split). The default is positions
// 0, 1, ... (split 0 and start1 0 means every row is start1 + t; so a plain slice is {0, 0, 0}). A rank of
// cp holding chunks r and 2cp-1-r of `chunk` tokens each has {r * chunk, chunk, (2cp-1-r) * chunk}.
struct SeqPositions {
  int start0 = 0;
  int split = 0;
  int start1 = 0;
  int at(int t) const { return t < split ? start0 + t : start1 + (t - split); }
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const DeviceInfo& info() const = 0;
  DeviceKind kind() const { return info().kind; }
  // True when the host must not touch backend memory (see above).
  virtual bool deviceMemory() const = 0;

  // ---- memory ------------------------------------------------------------------------------------------
  // bytes of zero-filled backend memory, 256-byte aligned (nullptr for 0 bytes). Throws DeviceFailure.
  virtual void* allocate(size_t bytes) = 0;
  // Gives back what allocate() returned (with the same size); nullptr is fine. Ordered after earlier work.
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  // Host -> backend and backend -> host; both return once the data has arrived (host memory may be reused).
  virtual void upload(void* dst, const void* hostSrc, size_t bytes) = 0;
  virtual void download(void* hostDst, const void* src, size_t bytes) = 0;
  // Backend -> backend (regions must not overlap).
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // rows rows of widthBytes bytes each, row r from src + r * srcPitch to dst + r * dstPitch.
  virtual void copy2D(void* dst, size_t dstPitch, const void* src, size_t srcPitch, size_t widthBytes,
                      size_t rows) = 0;
  virtual void zero(void* dst, size_t bytes) = 0;
  // Waits for all work issued so far.
  virtual void synchronize() = 0;
  virtual DeviceMemoryInfo memoryInfo() = 0;

  // ---- timing ------------------------------------------------------------------------------------------
  // Spans are timed by MARKS taken in work order (a GPU records an event on its stream, so a mark is when
  // the device reached that point, not when the host issued it); markTime() gives a mark's time in seconds
  // on the run's clock (since the epoch), waiting for the device if needed. Marks are numbered from 0 after
  // clearMarks(); a mark is valid until the next clearMarks().
  virtual void setEpoch(std::chrono::steady_clock::time_point epoch) = 0;
  virtual int mark() = 0;
  virtual double markTime(int mark) = 0;
  virtual void clearMarks() = 0;

  // ---- GEMM precision -----------------------------------------------------------------------------------
  // Set before the first op (default Fp32). The CPU rounds the operands into scratch copies and multiplies
  // in fp32, which gives the tensor cores' products up to the order of the fp32 sums.
  virtual void setGemmPrecision(GemmPrecision p) = 0;
  virtual GemmPrecision gemmPrecision() const = 0;

  // ---- linear -------------------------------------------------------------------------------------------
  // inp and weight may be bf16 (TensorIn) in GemmPrecision::Bf16; a bf16 one in another precision throws
  // DeviceFailure naming the op, whether or not the call reads it. A bf16 operand is used as it is, an fp32
  // one is rounded per call (the results are the same when the bf16 one is toBf16 of the fp32 one).
  virtual void linearForward(float* out, TensorIn inp, TensorIn weight, TensorIn bias, int N, int C,
                             int OC) = 0;
  virtual void linearBackward(float* dinp, GradOut dweight, GradOut dbias, const float* dout, TensorIn inp,
                              TensorIn weight, int N, int C, int OC) = 0;
  virtual void linearForwardT(float* out, TensorIn inp, TensorIn weight, TensorIn bias, int N, int C,
                              int OC) = 0;
  virtual void linearBackwardT(float* dinp, GradOut dweight, GradOut dbias, const float* dout, TensorIn inp,
                               TensorIn weight, int N, int C, int OC) = 0;
  // dst (n bf16) = src (n floats) rounded to nearest even, for a tensor kept as a bf16 TensorIn (a kept
  // input, the parameters' bf16 working copy).
  virtual void toBf16(bfloat16* dst, const float* src, size_t n) = 0;
  // dst (n floats) = src (n bf16) widened exactly (bf16 -> fp32 appends zero mantissa bits): a layer output
  // kept in bf16 (runtime Model, "precision": "bf16") read back as the next layer's fp32 input.
  virtual void fromBf16(float* dst, const bfloat16* src, size_t n) = 0;

  // ---- layer norm ---------------------------------------------------------------------------------------
  virtual void layerNormForward(float* out, float* mean, float* rstd, const float* inp, TensorIn weight,
                                TensorIn bias, int N, int C, float eps) = 0;
  virtual void layerNormBackward(float* dinp, GradOut dweight, GradOut dbias, const float* dout,
                                 const float* inp, TensorIn weight, const float* mean, const float* rstd,
                                 int N, int C) = 0;

  // ---- Llama-family pieces (cpu_ops.h: rmsNorm*, swiglu*, rope*Qkv) --------------------------------------
  // RMSNorm: out (N, C) = inp * rstd * weight, rstd (N) saved; weight a parameter (TensorIn).
  virtual void rmsNormForward(float* out, float* rstd, const float* inp, TensorIn weight, int N, int C,
                              float eps) = 0;
  // dinp (N, C) +=, dweight (C) += (nullable).
  virtual void rmsNormBackward(float* dinp, GradOut dweight, const float* dout, const float* inp,
                               TensorIn weight, const float* rstd, int N, int C) = 0;
  // out = silu(gate) * up; backward dgate +=, dup += (fp32 element-wise in every precision).
  virtual void swigluForward(float* out, const float* gate, const float* up, size_t n) = 0;
  virtual void swigluBackward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                              size_t n) = 0;
  // Rotary embeddings and grouped-query head repetition into attention's fused q|k|v layout, and the
  // transpose (dq, dk, dv OVERWRITTEN); positions posStart + t. H must be a multiple of KV, hs even.
  virtual void ropePackQkv(float* qkv, const float* q, const float* k, const float* v, int B, int T, int H,
                           int KV, int hs, float theta, int posStart) = 0;
  virtual void ropeUnpackQkv(float* dq, float* dk, float* dv, const float* dqkv, int B, int T, int H, int KV,
                             int hs, float theta, int posStart) = 0;

  // ---- mixture of experts: rows moved by index lists (the routing is chosen on the host and uploaded)
  // ------ dst (n, C) = scale[r] * src[idx[r]] for r < n (scale nullable: 1). idx: n int32 backend values.
  virtual void gatherRows(float* dst, const float* src, const int32_t* idx, const float* scale, int n,
                          int C) = 0;
  // dst[idx[r]] += scale[r] * src[r] for r < n (scale nullable: 1); the idx entries of one call are distinct.
  virtual void scatterAddRows(float* dst, const float* src, const int32_t* idx, const float* scale, int n,
                              int C) = 0;
  // out[r] = sum_c a[idx[r], c] * b[r, c] for r < n (OVERWRITTEN; fp32 sums in every precision).
  virtual void rowDots(float* out, const float* a, const int32_t* idx, const float* b, int n, int C) = 0;

  // ---- convolution, NCHW --------------------------------------------------------------------------------
  // ms::cpu::conv2dForward / conv2dBackward: input (B, C, H, W), weight (OC, C, KH, KW), bias (OC), output
  // (B, OC, outH, outW) as Conv2dShape (kernels/conv_shape.h) says. An im2col GEMM: the GEMM operands (the
  // input, the weight and, in backward, dout) are rounded to the GemmPrecision as the linear layers' are,
  // and inp and weight may be bf16 (TensorIn) in GemmPrecision::Bf16 (a bf16 one in another precision throws
  // DeviceFailure naming the op, whether or not the call reads it); the bias and the bias gradient are fp32
  // sums of the unrounded values. A shape Conv2dShape::problem() rejects (sizes < 1, a kernel larger than the
  // padded input, ...) throws DeviceFailure naming the op and the shape.
  // out = conv(inp, weight) + bias (broadcast over positions; nullable). out is overwritten.
  virtual void conv2dForward(float* out, TensorIn inp, TensorIn weight, TensorIn bias,
                             const Conv2dShape& s) = 0;
  // dinp (B, C, H, W) +=, dweight (OC, C, KH, KW) +=, dbias (OC) +=; each nullable (inp is read only for
  // dweight, weight only for dinp).
  virtual void conv2dBackward(float* dinp, GradOut dweight, GradOut dbias, const float* dout, TensorIn inp,
                              TensorIn weight, const Conv2dShape& s) = 0;

  // ---- batch norm over (B, C, S) per channel c (S: a sample's positions, H * W) ---------------------------
  // ms::cpu's batch-norm parts (Ioffe & Szegedy 2015, algorithm 1 and the backward of section 3), split so
  // that synchronised batch norm can all-reduce the per-channel sums between them. Every per-channel sum
  // (sum, sumSq, var, sumDy, sumDyXhat, localSumDy, localSumDyXhat) is a plain backend buffer of C DOUBLES,
  // which the runtime can all-reduce (sum) across ranks as it is. mean and rstd are C floats, the running
  // statistics C floats; weight and bias are parameters (TensorIn: fp32, or bf16 in GemmPrecision::Bf16,
  // widened exactly), their gradients GradOut. Element-wise work and sums are fp32 / double in every
  // GemmPrecision (no GEMM here). Sizes < 1 (or count <= 0) throw DeviceFailure naming the op.
  // sum[c], sumSq[c] = sums of x and x^2 over this rank's B * S elements of channel c (OVERWRITTEN).
  virtual void batchNormStats(double* sum, double* sumSq, const float* x, int B, int C, int S) = 0;
  // mean, rstd = 1 / sqrt(var + eps) from sums over count elements a channel (var biased, the batch's own;
  // count is every rank's B * S under synchronised batch norm); var (nullable) gets the biased variance.
  virtual void batchNormMoments(float* mean, float* rstd, double* var, const double* sum, const double* sumSq,
                                double count, int C, float eps) = 0;
  // running = (1 - momentum) running + momentum batch (PyTorch's convention), the variance unbiased
  // (var * count / (count - 1); count 1 leaves it biased).
  virtual void batchNormUpdateRunning(float* runningMean, float* runningVar, const float* mean,
                                      const double* var, double count, int C, float momentum) = 0;
  // out = (x - mean) rstd weight + bias per channel; weight, bias nullable (1 and 0). Evaluation passes the
  // running mean and 1 / sqrt(running var + eps). out may alias x.
  virtual void batchNormApply(float* out, const float* x, const float* mean, const float* rstd,
                              TensorIn weight, TensorIn bias, int B, int C, int S) = 0;
  // sumDy[c], sumDyXhat[c] (OVERWRITTEN) over this rank's elements, xhat = (x - mean) rstd.
  virtual void batchNormGradStats(double* sumDy, double* sumDyXhat, const float* dout, const float* x,
                                  const float* mean, const float* rstd, int B, int C, int S) = 0;
  // dinp += weight rstd / count (count dout - sumDy - xhat sumDyXhat) with the sums over the batch of count
  // elements a channel (all ranks' under synchronised batch norm); dweight += localSumDyXhat, dbias +=
  // localSumDy (this rank's, as rounded to float). weight nullable (1); dinp, dweight, dbias nullable.
  virtual void batchNormBackwardApply(float* dinp, GradOut dweight, GradOut dbias, const float* dout,
                                      const float* x, const float* mean, const float* rstd, TensorIn weight,
                                      const double* sumDy, const double* sumDyXhat, const double* localSumDy,
                                      const double* localSumDyXhat, double count, int B, int C, int S) = 0;

  // ---- pointwise ----------------------------------------------------------------------------------------
  virtual void geluForward(float* out, const float* inp, size_t n) = 0;
  virtual void geluBackward(float* dinp, const float* dout, const float* inp, size_t n) = 0;
  // The bf16 MLP's GELU in one pass: kept = toBf16(inp) (the GELU input as a bf16 KeptTensor stores it), out
  // = toBf16(gelu(fromBf16(kept))) (the next GEMM's bf16 operand): bit for bit what toBf16, fromBf16,
  // geluForward and toBf16 give in sequence, without their fp32 intermediates.
  virtual void geluForwardBf16(bfloat16* kept, bfloat16* out, const float* inp, size_t n) = 0;
  // dinp += gelu'(fromBf16(kept)) * dout: geluBackward over the widened bf16 input, without widening it into
  // a buffer first (bit for bit the same).
  virtual void geluBackwardBf16(float* dinp, const float* dout, const bfloat16* kept, size_t n) = 0;
  virtual void reluForward(float* out, const float* inp, size_t n) = 0;
  virtual void reluBackward(float* dinp, const float* dout, const float* inp, size_t n) = 0;
  virtual void tanhForward(float* out, const float* inp, size_t n) = 0;
  virtual void tanhBackward(float* dinp, const float* dout, const float* out, size_t n) = 0;
  virtual void add(float* out, const float* a, const float* b, size_t n) = 0;
  virtual void accumulate(float* y, const float* x, size_t n) = 0;
  // Gradients: y += x elementwise, both fp32 or both bf16 (bf16: each sum exact in fp32, rounded once; only
  // in GemmPrecision::Bf16). ZeRO-2/3 add a microbatch's reduced gradient shard to the step's.
  virtual void accumulateGrad(GradOut y, TensorIn x, size_t n) = 0;
  virtual void scale(float* y, float s, size_t n) = 0;
  // x (rows, C): every row += row (C).
  virtual void addRows(float* x, TensorIn row, size_t rows, int C) = 0;

  // ---- attention ----------------------------------------------------------------------------------------
  // What forward saves for backward (att) and backward's scratch, in floats, for the shapes attentionForward
  // and attentionBackward will get (C channels, H heads): (B, H, T, T) for a backend that materialises the
  // softmax; a fused (flash) backend needs far less, (B, H, T) each (the CUDA backend for head sizes up to
  // 128), and backward then reads the forward's output `out`.
  virtual size_t attentionSavedFloats(int B, int T, int C, int H) const = 0;
  virtual size_t attentionScratchFloats(int B, int T, int C, int H) const = 0;
  virtual void attentionForward(float* out, float* saved, const float* qkv, int B, int T, int C, int H,
                                bool causal) = 0;
  // out (the forward's output) may be bf16 in GemmPrecision::Bf16.
  virtual void attentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                 const float* saved, TensorIn out, int B, int T, int C, int H,
                                 bool causal) = 0;
  // Ring attention (context parallelism; Liu et al. 2023, "Ring Attention with Blockwise Transformers"): a
  // rank's queries meet the key/value blocks of every rank one block at a time, and the partial results are
  // merged with the online softmax of FlashAttention (Dao et al. 2022, section 3.1). ms::cpu's forms
  // (kernels/cpu/ring_attention.cpp) are the reference.
  // One block of ring attention: the queries of qkv (B, Tq, 3C: q is the first C floats of each row, H heads
  // of hs = C/H) against the keys and values of kv (B, Tk, 2 KV hs: the KV key heads, then the KV value heads
  // of each row), scaled by 1/sqrt(hs); causal masks every key whose position (kpos) is greater than the
  // query's (qpos). Grouped-query attention (Ainslie et al. 2023): KV divides H (else DeviceFailure) and
  // query head h reads key/value head h / (H/KV), so a block carries H/KV times fewer floats than the H
  // heads' copies; KV == H is plain multi-head attention (kv then the k | v columns of qkv).
  // Merges into out (B, Tq, C) and lse (B, H, Tq), the running log-sum-exp of each query row's scaled scores:
  // with first, overwrites them (a row with no visible key gets out 0 and lse -inf); otherwise combines the
  // block's partial result with what they hold (out = out*exp(lse-lse') + outBlk*exp(lseBlk-lse'), lse' =
  // logaddexp(lse, lseBlk); a block with no visible key for a row leaves that row unchanged).
  // In GemmPrecision::Tf32 / Bf16 q, k and v are rounded as attentionForward rounds qkv.
  virtual void attentionBlockForward(float* out, float* lse, const float* qkv, const float* kv, int B, int Tq,
                                     int Tk, int C, int H, int KV, SeqPositions qpos, SeqPositions kpos,
                                     bool causal, bool first) = 0;
  // Backward of one block, given the FINAL out and lse of the forward (after every block was merged) and
  // dout (B, Tq, C): the q part of dqkv (the first C floats of each (B, Tq, 3C) row) +=, and dkv
  // (B, Tk, 2 KV hs: dk heads then dv heads, as kv) +=, each key/value head's gradient summed over the H/KV
  // query heads of its group. With P = exp(S*scale - lse) and D = rowsum(dout * out) per (b, h, query row):
  // dV += P^T dout, dS = P * (dout V^T - D), dQ += scale * dS K, dK += scale * dS^T Q (Dao et al. 2022,
  // appendix B.2). out may be bf16 (TensorIn; only in GemmPrecision::Bf16). In Tf32 / Bf16 q, k, v
  // and dout are rounded as attentionBackward rounds them; out and lse are read as they are.
  // The k and v parts of dqkv are not touched.
  virtual void attentionBlockBackward(float* dqkv, float* dkv, const float* dout, const float* qkv,
                                      const float* kv, TensorIn out, const float* lse, int B, int Tq, int Tk,
                                      int C, int H, int KV, SeqPositions qpos, SeqPositions kpos,
                                      bool causal) = 0;

  // ---- embeddings ---------------------------------------------------------------------------------------
  virtual void embeddingForward(float* out, const int32_t* tokens, TensorIn wte, TensorIn wpe, int B, int T,
                                int C) = 0;
  // dwte has V rows (tokens < V).
  virtual void embeddingBackward(GradOut dwte, GradOut dwpe, const float* dout, const int32_t* tokens, int B,
                                 int T, int C, int V) = 0;
  // Vocabulary-parallel pieces (Megatron-LM): wte holds rows [vocabStart, vocabStart + vocabCount).
  // out (N, C) = wte[tokens[n] - vocabStart] for tokens in the range, 0 elsewhere.
  virtual void embeddingRangeForward(float* out, const int32_t* tokens, TensorIn wte, int vocabStart,
                                     int vocabCount, int N, int C) = 0;
  // dwte[tokens[n] - vocabStart] += dout[n] for tokens in the range.
  virtual void embeddingRangeBackward(GradOut dwte, const float* dout, const int32_t* tokens, int vocabStart,
                                      int vocabCount, int N, int C) = 0;
  // y (B, T, C): y[b, t] += wpe[t].
  virtual void addPositions(float* y, TensorIn wpe, int B, int T, int C) = 0;

  // ---- loss ---------------------------------------------------------------------------------------------
  virtual void softmaxCrossEntropy(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                   int N, int V, float gradScale) = 0;
  virtual void argmaxRows(int32_t* out, const float* x, int N, int V) = 0;
  // Cross-entropy over logits split by vocabulary (this rank holds columns [vocabStart, vocabStart + V) of
  // every row); the caller all-reduces between the steps. 1: mx (N) = row maxima (then all-reduce max).
  virtual void rowMax(float* mx, const float* logits, int N, int V) = 0;
  // 2: sumExp (N) = sum_j exp(logits - mx); targetLogit (N) = logits[target - vocabStart] when the target is
  // in this rank's range, else 0 (then all-reduce sum of both).
  virtual void crossEntropyPartials(float* sumExp, float* targetLogit, const float* logits, const float* mx,
                                    const int32_t* targets, int vocabStart, int N, int V) = 0;
  // 3: losses (N) = log(sumExp) - (targetLogit - mx) (0 where target < 0); dlogits (nullable, may alias
  // logits) OVERWRITTEN with gradScale * (softmax - onehot) over this rank's columns, 0 rows where
  // target < 0.
  virtual void crossEntropyFinish(float* losses, float* dlogits, const float* logits, const float* mx,
                                  const float* sumExp, const float* targetLogit, const int32_t* targets,
                                  int vocabStart, int N, int V, float gradScale) = 0;

  // ---- vision transformer pieces ------------------------------------------------------------------------
  virtual void patchify(float* patches, const float* images, int B, int S, int P) = 0;
  virtual void tokensForward(float* out, const float* x, TensorIn clsToken, TensorIn pos, int B, int NP,
                             int C, bool cls) = 0;
  virtual void tokensBackward(float* dx, GradOut dcls, GradOut dpos, const float* dout, int B, int NP, int C,
                              bool cls) = 0;
  virtual void poolForward(float* out, const float* inp, int B, int T, int C, bool useFirst) = 0;
  virtual void poolBackward(float* dinp, const float* dout, int B, int T, int C, bool useFirst) = 0;

  // ---- optimizers and reductions ------------------------------------------------------------------------
  virtual void adamwUpdate(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                           float beta1, float beta2, float eps, float weightDecay, int t,
                           float gradScale) = 0;
  virtual void sgdUpdate(float* params, const float* grads, float* buf, size_t n, float lr, float momentum,
                         float weightDecay, bool nesterov, bool firstStep, float gradScale) = 0;
  // Multi-tensor forms: one update of every segment of segments[0, count) (a HOST array, free to reuse once
  // the call returns; the buffers it points to are backend memory), with the same per-element math as the
  // single forms (kernels/optimizer_math.h) and results identical to calling the single form on each segment
  // with its weight decay: the CPU loops over them; a GPU updates them all in one launch or a few, which is
  // what makes an optimizer step over many parameters cheap. Segments of 0 elements are skipped; segments
  // must not overlap one another.
  virtual void adamwUpdateSegments(const OptimizerSegment* segments, size_t count, float lr, float beta1,
                                   float beta2, float eps, int t, float gradScale) = 0;
  virtual void sgdUpdateSegments(const OptimizerSegment* segments, size_t count, float lr, float momentum,
                                 bool nesterov, bool firstStep, float gradScale) = 0;
  // Sum of squares of each of count buffers (ptrs[i], sizes[i]; fp32, or bf16 gradients widened exactly),
  // added up in double; waits for the result.
  virtual double sumSquares(const TensorIn* ptrs, const size_t* sizes, size_t count) = 0;
};

// The CPU backend (kernels/cpu, OpenBLAS + OpenMP). With emulateDevice, backend memory is tagged so that any
// host access to it faults, and every call checks its pointers: a CPU-only machine then runs the runtime's
// device code path (uploads, downloads, host staging of messages) exactly as a GPU would, which the tests
// use. Results are bit-identical to the plain CPU backend.
std::unique_ptr<Backend> makeCpuBackend(bool emulateDevice = false);

}  // namespace ms
