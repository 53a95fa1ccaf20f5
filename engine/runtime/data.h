// Data loaders: text bytes, llm.c token shards and Fashion-MNIST, behind one DataSource interface.
//
// What always holds: every sample is a pure function of (seed, step, sample index) for training and of the
// sample index for evaluation. There is no cursor, so resuming at a step, re-running a step, or splitting one
// global batch among data-parallel ranks gives exactly the same samples. A DataSource is immutable after
// openDataSource() returns (apart from a mutex-guarded cache that never changes results), so its const
// methods may be called from several threads. Every token id is < config.model.vocab and every label < 10.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "plan/run_config.h"
#include "runtime/random.h"

namespace ms {

// The sample hash and generator (splitmix64, hashCombine, SplitMix64) live in runtime/random.h, shared with
// parameter initialisation: training window offsets are hashCombine(seed, step, sample).

// The permutation of 0..n-1 used for training epoch `epoch`: a Fisher-Yates shuffle driven by
// SplitMix64(hashCombine(seed, epoch, n)).
std::vector<int32_t> epochPermutation(uint64_t seed, int64_t epoch, int32_t n);

// One batch of samples. gpt: tokens and targets (B, T), targets are the next tokens. vit/mlp: images
// (B, S*S) normalised floats and targets (B) class labels.
struct Batch {
  int B = 0;                     // samples
  int T = 0;                     // positions per sample (gpt), 1 for images
  std::vector<int32_t> tokens;   // (B, T)
  std::vector<int32_t> targets;  // (B, T) or (B)
  std::vector<float> images;     // (B, S*S)
};

class DataSource {
 public:
  virtual ~DataSource() = default;
  // Samples in the evaluation split.
  virtual int64_t evalSamples() const = 0;
  // Fills out with samples [first, first+count) of the global training batch number `step` (batchSize
  // samples). A pure function of (seed, step, sample index).
  virtual void trainBatch(int64_t step, int batchSize, int first, int count, Batch& out) const = 0;
  // Fills out with evaluation samples [first, first+count); requires first+count <= evalSamples().
  virtual void evalBatch(int64_t first, int count, Batch& out) const = 0;
};

// Context parallelism: keeps rank `rank`'s slice of every sample's tokens and targets, its two chunks of the
// 2 * cp equal chunks of the sequence (chunk rank, then chunk 2 cp - 1 - rank: each rank of the ring gets the
// same share of causal attention's work; Megatron-Core's load-balanced layout), so T becomes T / cp. T must
// be divisible by 2 * cp (config_checks); cp 1 leaves the batch as it is.
void takeContextSlice(Batch& batch, int cp, int rank);

// Opens the data described by config.data for a model: seqLen = config.training.seqLen (token data),
// vocab = config.model.vocab (every token id must be < vocab). Paths resolve with config.resolvePath();
// globs (*, ?, [..]) expand with glob(3), sorted; a pattern matching nothing is an error naming it.
Expected<std::unique_ptr<DataSource>> openDataSource(const RunConfig& config);

// The pieces openDataSource() is built from (data.cpp, data_text.cpp, data_tokens.cpp, data_mnist.cpp).
// Paths passed to them are already resolved.

// Expands each pattern that holds a glob character (*, ?, [) with glob(3), sorted bytewise; a plain path is
// kept as is (so a missing file is reported by whoever opens it). `what` names the list in messages
// ("data.train"). Errors: an empty list, a pattern that matches nothing.
Expected<std::vector<std::string>> expandPatterns(const std::vector<std::string>& patterns,
                                                  const std::string& what);

// One split of a token stream and where it came from (file names, for messages).
struct TokenSplit {
  std::vector<uint16_t> tokens;
  std::string source;
};
// A DataSource over a training and a validation token stream (text and tokens kinds share it). Errors: a
// split shorter than seqLen + 1 tokens; `unit` ("bytes" or "tokens") words the message.
Expected<std::unique_ptr<DataSource>> makeTokenStreamSource(TokenSplit train, TokenSplit val, int seqLen,
                                                            uint64_t seed, const char* unit);
// "a.bin" or "a.bin, b.bin" or "a.bin, b.bin and 3 more": file lists in messages.
std::string describeFiles(const std::vector<std::string>& files);
Expected<std::unique_ptr<DataSource>> openTextData(const std::vector<std::string>& files, double valFraction,
                                                   int seqLen, int vocab, uint64_t seed);
Expected<std::unique_ptr<DataSource>> openTokenData(const std::vector<std::string>& trainFiles,
                                                    const std::vector<std::string>& valFiles, int seqLen,
                                                    int vocab, uint64_t seed);
Expected<std::unique_ptr<DataSource>> openFashionMnist(const std::string& dir, uint64_t seed);

// Fashion-MNIST normalisation (mean and std of the training pixels in [0, 1]).
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;
inline constexpr int kFashionMnistSide = 28;
inline constexpr int kFashionMnistClasses = 10;

}  // namespace ms
