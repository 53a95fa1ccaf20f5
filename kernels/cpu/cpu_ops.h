// CPU kernels: forward and backward of every op the models use, in fp32. GEMMs go through OpenBLAS; the
// other ops are plain loops parallelised with OpenMP where it pays.
//
// Conventions that always hold:
// - Row-major, contiguous buffers. Shape comments use B batch, T sequence, C channels, H heads,
//   N = rows (usually B*T), V vocabulary / classes, OC output channels.
// - Linear weights are stored (C, OC) ("Conv1D" layout, as Hugging Face GPT-2 checkpoints store them):
//   out = inp @ weight + bias.
// - Every backward ACCUMULATES (+=) into every gradient it writes, inputs and parameters alike; callers zero
//   gradient buffers when they need a fresh sum. This makes gradient accumulation over microbatches and
//   residual branches free.
// - Any gradient pointer documented as nullable may be nullptr to skip that gradient.
// - The thread count is set once with setThreads() (the engine divides the cores between the ranks on a
// node).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "kernels/conv_shape.h"

namespace ms {
struct SeqPositions;  // kernels/backend.h: the positions of a sequence slice's rows (ring attention below)
}  // namespace ms

namespace ms::cpu {

// Threads used by OpenMP loops and by OpenBLAS. n <= 0 means "all cores".
void setThreads(int n);
// Whether n threads can run at once in this process (setThreads(n) starts them; when OpenMP cannot, libgomp
// ends the process with a message of its own). The error says how many could start and the user's limit.
Status checkThreads(int n);
int threads();

// ---- Linear --------------------------------------------------------------------------------------------
// (The Backend's forms take inp and weight as TensorIn: in GemmPrecision::Bf16 either may be bf16, a kept
// input or the parameters' bf16 working copy, which the CPU backend widens to fp32 in scratch before calling
// these; an fp32 one it rounds there instead, to the same values. See kernels/backend.h.)
// out (N, OC) = inp (N, C) @ weight (C, OC) + bias (OC). bias nullable.
void linearForward(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                   int OC);
// dinp (N, C) += dout (N, OC) @ weight^T; dweight (C, OC) += inp^T @ dout; dbias (OC) += sum_n dout.
// dinp, dweight, dbias nullable.
void linearBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int N, int C, int OC);

// Same with the weight stored transposed, (OC, C) (nn.Linear / embedding-table layout; the GPT LM head reads
// the token embedding wte (V, C) this way): out (N, OC) = inp (N, C) @ weight^T + bias.
void linearForwardT(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                    int OC);
// dinp (N, C) += dout @ weight; dweight (OC, C) += dout^T @ inp; dbias (OC) += sum_n dout. All nullable.
void linearBackwardT(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);

// ---- Convolution, NCHW (conv.cpp) -----------------------------------------------------------------------
// The shape (input (B, C, H, W), weight (OC, C, KH, KW), output (B, OC, outH(), outW()), zero padding pad on
// every side, the same stride both ways) is ms::Conv2dShape (kernels/conv_shape.h), shared with the Backend.
// The kernels expect a valid shape (Conv2dShape::problem() empty; the backends check it).
using ms::Conv2dShape;
// out = conv(inp, weight) + bias (OC, broadcast over positions; nullable).
void conv2dForward(float* out, const float* inp, const float* weight, const float* bias,
                   const Conv2dShape& s);
// dinp +=, dweight (OC, C, KH, KW) +=, dbias (OC) +=; each nullable.
void conv2dBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, const Conv2dShape& s);

// ---- Batch norm over (B, C, S) per channel c (S: the positions of a sample, H * W) -----------------------
// In parts, so that synchronised batch norm can all-reduce the per-channel sums between them.
// sum[c], sumSq[c] (C doubles each) = sums of x and x^2 over this rank's B * S elements of channel c.
void batchNormStats(double* sum, double* sumSq, const float* x, int B, int C, int S);
// mean, rstd = 1 / sqrt(var + eps) from sums over count elements per channel (var biased, the batch's own);
// var (C doubles, nullable) gets the biased variance for the running statistics.
void batchNormMoments(float* mean, float* rstd, double* var, const double* sum, const double* sumSq,
                      double count, int C, float eps);
// running = (1 - momentum) running + momentum batch (PyTorch's convention), the variance unbiased
// (var * count / (count - 1)).
void batchNormUpdateRunning(float* runningMean, float* runningVar, const float* mean, const double* var,
                            double count, int C, float momentum);
// out = (x - mean) rstd weight + bias, per channel; weight, bias nullable (1 and 0). Evaluation passes the
// running mean and 1 / sqrt(running var + eps).
void batchNormApply(float* out, const float* x, const float* mean, const float* rstd, const float* weight,
                    const float* bias, int B, int C, int S);
// sumDy[c], sumDyXhat[c] over this rank's elements, xhat = (x - mean) rstd.
void batchNormGradStats(double* sumDy, double* sumDyXhat, const float* dout, const float* x,
                        const float* mean, const float* rstd, int B, int C, int S);
// dinp += weight rstd / count (count dout - sumDy - xhat sumDyXhat) with the sums over the batch of count
// elements a channel (all ranks' under synchronised batch norm); dweight += localSumDyXhat, dbias +=
// localSumDy (this rank's). dinp, dweight, dbias nullable.
void batchNormBackwardApply(float* dinp, float* dweight, float* dbias, const float* dout, const float* x,
                            const float* mean, const float* rstd, const float* weight, const double* sumDy,
                            const double* sumDyXhat, const double* localSumDy, const double* localSumDyXhat,
                            double count, int B, int C, int S);

// ---- LayerNorm over the last dimension -------------------------------------------------------------------
// out (N, C) = (inp - mean) * rstd * weight + bias; saves mean (N) and rstd (N) for backward.
void layerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C, float eps);
// dinp (N, C) +=, dweight (C) +=, dbias (C) +=. dweight, dbias nullable.
void layerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, const float* mean, const float* rstd, int N, int C);

// ---- Llama-family pieces (kernels/cpu/llama.cpp)
// ------------------------------------------------------------ RMSNorm over the last dimension (Zhang &
// Sennrich 2019, "Root Mean Square Layer Normalization", eq. 4): out (N, C) = inp * rstd * weight, rstd (N) =
// 1 / sqrt(mean(inp^2) + eps), saved for backward.
void rmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps);
// dinp (N, C) +=, dweight (C) += (nullable).
void rmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                     const float* rstd, int N, int C);
// SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer", eq. 6 without the projections):
// out = silu(gate) * up, silu(x) = x sigmoid(x). out may alias gate or up.
void swigluForward(float* out, const float* gate, const float* up, size_t n);
// dgate += dout * up * silu'(gate), dup += dout * silu(gate).
void swigluBackward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                    size_t n);
// Rotary position embeddings (Su et al. 2021, "RoFormer", eq. 34) in the half-split pairing Hugging Face's
// Llama uses (element i of a head pairs with element i + hs/2; rotate_half), angle t * theta^(-2i/hs) at
// position t of the sequence, with grouped-query attention's key/value heads repeated (Ainslie et al. 2023,
// "GQA": q head h reads kv head h / (H / KV)). From q (B, T, H hs), k and v (B, T, KV hs) it writes the
// fused layout attentionForward reads, qkv (B, T, 3 H hs): q and k rotated, k and v heads repeated.
// Positions are posStart + t (t < T).
void ropePackQkv(float* qkv, const float* q, const float* k, const float* v, int B, int T, int H, int KV,
                 int hs, float theta, int posStart);
// The transpose: dq (B, T, H hs), dk, dv (B, T, KV hs) OVERWRITTEN from dqkv (B, T, 3 H hs): the repeated
// heads' gradients summed per kv head, q and k rotated back.
void ropeUnpackQkv(float* dq, float* dk, float* dv, const float* dqkv, int B, int T, int H, int KV, int hs,
                   float theta, int posStart);

// ---- Mixture of experts (kernels/cpu/moe.cpp): rows moved by index lists --------------------------------
// dst (n, C) = scale[r] * src[idx[r]] (scale nullable: 1).
void gatherRows(float* dst, const float* src, const int32_t* idx, const float* scale, int n, int C);
// dst[idx[r]] += scale[r] * src[r] (scale nullable: 1); idx entries distinct.
void scatterAddRows(float* dst, const float* src, const int32_t* idx, const float* scale, int n, int C);
// out[r] = <a[idx[r]], b[r]> over C (OVERWRITTEN).
void rowDots(float* out, const float* a, const int32_t* idx, const float* b, int n, int C);

// ---- Pointwise -------------------------------------------------------------------------------------------
// GELU, tanh approximation (Hendrycks & Gimpel 2016, eq. in section 2; as GPT-2 uses it).
void geluForward(float* out, const float* inp, size_t n);
void geluBackward(float* dinp, const float* dout, const float* inp, size_t n);  // dinp +=
void reluForward(float* out, const float* inp, size_t n);
void reluBackward(float* dinp, const float* dout, const float* inp, size_t n);  // dinp +=
void tanhForward(float* out, const float* inp, size_t n);
void tanhBackward(float* dinp, const float* dout, const float* out, size_t n);  // uses the OUTPUT; dinp +=
// out = a + b (out may alias a or b).
void add(float* out, const float* a, const float* b, size_t n);
// y += x
void accumulate(float* y, const float* x, size_t n);
// y *= s
void scale(float* y, float s, size_t n);

// ---- Attention -------------------------------------------------------------------------------------------
// Multi-head scaled dot-product attention (Vaswani et al. 2017, section 3.2.1).
// qkv (B, T, 3C): each position holds [q (C) | k (C) | v (C)], head h owns channels [h*hs, (h+1)*hs),
// hs = C / H. out (B, T, C): heads concatenated. att (B, H, T, T): the softmax probabilities, saved for
// backward (with causal, entries above the diagonal are 0).
void attentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int H, bool causal);
// dqkv (B, T, 3C) +=. scratch: at least B*H*T*T floats, contents undefined on return.
void attentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                       int B, int T, int C, int H, bool causal);

// ---- Ring attention (context parallelism; kernels/cpu/ring_attention.cpp) --------------------------------
// The two ops of Backend::attentionBlockForward / attentionBlockBackward (kernels/backend.h, where
// SeqPositions is defined; include it to call these). kv holds KV key/value heads of hs = C/H floats
// (grouped-query attention: query head h reads kv head h / (H/KV); KV divides H, KV == H is plain
// multi-head attention). Forward runs one (b, h) pair per OpenMP iteration, backward one (b, kv head) pair
// with the group's query heads inside it (so no dkv element is written by two threads); per query row only
// the visible keys are visited (causal: the keys at positions <= the query's).
// out (B, Tq, C) and lse (B, H, Tq) merged with the block of qkv's queries (B, Tq, 3C; the q part read)
// against kv (B, Tk, 2 KV hs: the KV key heads | the KV value heads); with first they are overwritten (out 0,
// lse -inf where no key is visible), else combined by the online softmax (a row with no visible key in the
// block is left as it is).
void attentionBlockForward(float* out, float* lse, const float* qkv, const float* kv, int B, int Tq, int Tk,
                           int C, int H, int KV, SeqPositions qpos, SeqPositions kpos, bool causal,
                           bool first);
// From the final out (B, Tq, C) and lse (B, H, Tq) of the forward: the q part of dqkv (B, Tq, 3C) +=, dkv
// (B, Tk, 2 KV hs) += (each kv head's gradient summed over its group's query heads); the k and v parts of
// dqkv are not touched. Rows whose lse is -inf (no key visible in any block) contribute nothing.
void attentionBlockBackward(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv,
                            const float* out, const float* lse, int B, int Tq, int Tk, int C, int H, int KV,
                            SeqPositions qpos, SeqPositions kpos, bool causal);

// ---- Embeddings ------------------------------------------------------------------------------------------
// out (B, T, C) = wte[tokens[b, t]] + wpe[t]. wte (V, C), wpe (maxT, C). Tokens must be in [0, V).
void embeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                      int C);
// dwte (V, C) +=, dwpe (maxT, C) +=. Either nullable.
void embeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                       int C);

// ---- Loss ------------------------------------------------------------------------------------------------
// Fused softmax + cross-entropy over rows of logits (N, V). losses (N) = -log softmax(logits)[target].
// If dlogits is non-null it is OVERWRITTEN with gradScale * (softmax - onehot(target)) (the gradient of
// gradScale * sum(losses)); dlogits may alias logits. A target < 0 is ignored: loss 0, gradient row 0.
// Targets >= V are a caller bug (checked upstream by the data loaders).
void softmaxCrossEntropy(float* losses, float* dlogits, const float* logits, const int32_t* targets, int N,
                         int V, float gradScale);
// argmax of each row of x (N, V) into out (N).
void argmaxRows(int32_t* out, const float* x, int N, int V);

// ---- Vision transformer pieces --------------------------------------------------------------------------
// images (B, S, S) single channel, S = image side; patches (B, NP, P*P) with NP = (S/P)^2, patches in
// row-major order, pixels inside a patch row-major. S must be divisible by P.
void patchify(float* patches, const float* images, int B, int S, int P);
// Builds the token sequence of a ViT: out (B, T, C) with T = NP + (cls ? 1 : 0). With cls, out[b, 0] =
// clsToken (C) + pos[0] and out[b, 1 + i] = x[b, i] + pos[1 + i]; without, out[b, i] = x[b, i] + pos[i].
// x (B, NP, C), pos (T, C). clsToken nullable when cls is false.
void tokensForward(float* out, const float* x, const float* clsToken, const float* pos, int B, int NP, int C,
                   bool cls);
// dx (B, NP, C) +=, dcls (C) +=, dpos (T, C) +=. dx, dcls, dpos nullable.
void tokensBackward(float* dx, float* dcls, float* dpos, const float* dout, int B, int NP, int C, bool cls);
// out (B, C) = inp[:, 0, :] when useFirst (class-token pooling), else mean over T.
void poolForward(float* out, const float* inp, int B, int T, int C, bool useFirst);
void poolBackward(float* dinp, const float* dout, int B, int T, int C, bool useFirst);  // dinp (B, T, C) +=

// ---- Pieces of the tensor-parallel layers (kernels/cpu/tp_ops.cpp) ----------------------------------------
// x (rows, C): every row += row (C).
void addRows(float* x, const float* row, size_t rows, int C);
// y (B, T, C): y[b, t] += wpe[t].
void addPositions(float* y, const float* wpe, int B, int T, int C);
// Vocabulary-parallel embedding (Megatron-LM): wte holds rows [vocabStart, vocabStart + vocabCount).
// out (N, C) = wte[tokens[n] - vocabStart] for tokens in the range, 0 elsewhere.
void embeddingRangeForward(float* out, const int32_t* tokens, const float* wte, int vocabStart,
                           int vocabCount, int N, int C);
// dwte[tokens[n] - vocabStart] += dout[n] for tokens in the range (positions in order: deterministic).
void embeddingRangeBackward(float* dwte, const float* dout, const int32_t* tokens, int vocabStart,
                            int vocabCount, int N, int C);
// Vocabulary-parallel cross-entropy over logits (N, V) holding columns [vocabStart, vocabStart + V); the
// caller all-reduces between the steps. 1: mx (N) = row maxima (all-reduce max).
void rowMax(float* mx, const float* logits, int N, int V);
// 2: sumExp (N) = sum_j exp(logits - mx); targetLogit (N) = logits[target - vocabStart] when the target is
// in the range, else 0 (all-reduce sum of both).
void crossEntropyPartials(float* sumExp, float* targetLogit, const float* logits, const float* mx,
                          const int32_t* targets, int vocabStart, int N, int V);
// 3: losses (N) = log(sumExp) - (targetLogit - mx), 0 where target < 0; dlogits (nullable, may alias logits)
// OVERWRITTEN with gradScale * (softmax - onehot(target)) over the rank's columns, 0 rows where target < 0.
void crossEntropyFinish(float* losses, float* dlogits, const float* logits, const float* mx,
                        const float* sumExp, const float* targetLogit, const int32_t* targets, int vocabStart,
                        int N, int V, float gradScale);

// ---- Optimizers and reductions over flat buffers --------------------------------------------------------
// AdamW (Loshchilov & Hutter 2019, algorithm 2) on n values; t is the 1-based step for bias correction.
// The gradient used is grads * gradScale (gradScale folds in clipping and accumulation averaging).
void adamwUpdate(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                 float beta2, float eps, float weightDecay, int t, float gradScale);
// SGD with momentum as PyTorch defines it: g = grads*gradScale + weightDecay*p; buf = momentum*buf + g
// (buf = g on the first step, firstStep true); p -= lr * (nesterov ? g + momentum*buf : buf).
void sgdUpdate(float* params, const float* grads, float* buf, size_t n, float lr, float momentum,
               float weightDecay, bool nesterov, bool firstStep, float gradScale);
// sum of x^2 in double precision.
double sumSquares(const float* x, size_t n);

}  // namespace ms::cpu
