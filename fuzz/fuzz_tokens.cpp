// Fuzz target: the llm.c token shard reader (runtime/data_tokens.cpp). The input is one shard file; it is
// written to a private temporary folder and opened through openTokenData() as both the training and the
// validation split (the reader only takes paths), with seq_len 4 and GPT-2's vocabulary of 50257.
//
// Checked for every input, beyond not crashing: an error names the shard; an accepted shard gives batches
// whose every token is below the vocabulary and whose targets are the next tokens of the stream.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "runtime/data.h"

namespace {

constexpr int kSeqLen = 4;
constexpr int kVocab = 50257;

void checkBatch(const ms::Batch& batch, int count, const char* what) {
  FUZZ_CHECK(batch.B == count && batch.T == kSeqLen, "%s batch is %dx%d, expected %dx%d", what, batch.B,
             batch.T, count, kSeqLen);
  FUZZ_CHECK(batch.tokens.size() == static_cast<size_t>(count) * kSeqLen &&
                 batch.targets.size() == batch.tokens.size(),
             "%s batch holds %zu tokens and %zu targets", what, batch.tokens.size(), batch.targets.size());
  for (size_t i = 0; i < batch.tokens.size(); ++i) {
    FUZZ_CHECK(batch.tokens[i] >= 0 && batch.tokens[i] < kVocab, "%s token %d out of the vocabulary", what,
               batch.tokens[i]);
    FUZZ_CHECK(batch.targets[i] >= 0 && batch.targets[i] < kVocab, "%s target %d out of the vocabulary", what,
               batch.targets[i]);
    // Within a sample, the target of position t is the input of position t + 1.
    if ((i + 1) % kSeqLen != 0)
      FUZZ_CHECK(batch.targets[i] == batch.tokens[i + 1], "%s target %zu is not the next token", what, i);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::TempDir dir;
  const std::string shard =
      dir.write("shard.bin", std::string_view(reinterpret_cast<const char*>(data), size));
  auto source = ms::openTokenData({shard}, {shard}, kSeqLen, kVocab, /*seed=*/7);
  if (!source) {
    FUZZ_CHECK(fuzz::contains(source.message(), shard), "an error without the shard: %s",
               source.message().c_str());
    return fuzz::outcome(false);
  }
  // The shard passed: it holds (size - 1024) / 2 tokens, at least seq_len + 1 of them.
  const int64_t tokens = (static_cast<int64_t>(size) - 1024) / 2;
  FUZZ_CHECK(tokens >= kSeqLen + 1, "accepted a shard of %lld tokens", static_cast<long long>(tokens));
  FUZZ_CHECK((*source)->evalSamples() == (tokens - 1) / kSeqLen, "evalSamples() is %lld for %lld tokens",
             static_cast<long long>((*source)->evalSamples()), static_cast<long long>(tokens));
  ms::Batch batch;
  for (int64_t step : {0, 1, 1000003}) {
    (*source)->trainBatch(step, 3, 0, 3, batch);
    checkBatch(batch, 3, "training");
  }
  const int evalCount = static_cast<int>(std::min<int64_t>((*source)->evalSamples(), 3));
  (*source)->evalBatch(0, evalCount, batch);
  checkBatch(batch, evalCount, "evaluation");
  // The last evaluation window ends on the stream's last token.
  (*source)->evalBatch((*source)->evalSamples() - 1, 1, batch);
  checkBatch(batch, 1, "last evaluation");
  return fuzz::outcome(true);
}
