// The shared parts of the data loaders: the epoch permutation, glob expansion, the token-stream source used
// by the text and tokens kinds, and openDataSource(), which picks a loader by config.data.kind.
//
// What always holds: a token-stream sample is read from immutable vectors at an offset that depends only on
// (seed, step, sample index), so trainBatch() and evalBatch() are pure and thread-safe.
#include "runtime/data.h"

#include <glob.h>

#include <algorithm>
#include <cassert>
#include <utility>

namespace ms {

std::vector<int32_t> epochPermutation(uint64_t seed, int64_t epoch, int32_t n) {
  std::vector<int32_t> perm(static_cast<size_t>(std::max<int32_t>(n, 0)));
  for (int32_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = i;
  SplitMix64 rng(hashCombine(seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(n)));
  // Fisher-Yates (Knuth, TAOCP vol. 2, 3.4.2, Algorithm P), from the back.
  for (int32_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int32_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

void takeContextSlice(Batch& batch, int cp, int rank) {
  if (cp <= 1) return;
  const int T = batch.T, chunk = T / (2 * cp), local = 2 * chunk;
  assert(T % (2 * cp) == 0 && rank >= 0 && rank < cp);
  const int starts[2] = {rank * chunk, (2 * cp - 1 - rank) * chunk};
  auto slice = [&](std::vector<int32_t>& v) {
    if (v.size() != size_t(batch.B) * size_t(T)) return;  // image labels: one per sample
    std::vector<int32_t> out(size_t(batch.B) * size_t(local));
    for (int b = 0; b < batch.B; ++b)
      for (int h = 0; h < 2; ++h)
        std::copy_n(v.begin() + std::ptrdiff_t(size_t(b) * T + size_t(starts[h])), chunk,
                    out.begin() + std::ptrdiff_t(size_t(b) * local + size_t(h) * chunk));
    v = std::move(out);
  };
  slice(batch.tokens);
  slice(batch.targets);
  batch.T = local;
}

std::string describeFiles(const std::vector<std::string>& files) {
  if (files.empty()) return "(no files)";
  std::string s = files[0];
  const size_t shown = std::min<size_t>(files.size(), 2);
  for (size_t i = 1; i < shown; ++i) s += ", " + files[i];
  if (files.size() > shown) s += " and " + std::to_string(files.size() - shown) + " more";
  return s;
}

Expected<std::vector<std::string>> expandPatterns(const std::vector<std::string>& patterns,
                                                  const std::string& what) {
  if (patterns.empty()) return Status::error(what + ": no files given");
  std::vector<std::string> files;
  for (const std::string& pattern : patterns) {
    if (pattern.find_first_of("*?[") == std::string::npos) {
      files.push_back(pattern);
      continue;
    }
    glob_t g{};
    const int rc = glob(pattern.c_str(), 0, nullptr, &g);
    std::vector<std::string> matches;
    if (rc == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) matches.emplace_back(g.gl_pathv[i]);
    }
    globfree(&g);
    if (rc == GLOB_NOMATCH || (rc == 0 && matches.empty())) {
      return Status::error(what + ": the pattern '" + pattern + "' matches no file");
    }
    if (rc != 0) return Status::error(what + ": cannot expand the pattern '" + pattern + "' (read error)");
    // glob(3) sorts with strcoll; sort bytewise so the order does not depend on the locale.
    std::sort(matches.begin(), matches.end());
    files.insert(files.end(), matches.begin(), matches.end());
  }
  return files;
}

namespace {

// Windows of seqLen + 1 tokens: training windows start at a hashed offset, evaluation windows tile the
// validation split with stride seqLen (consecutive windows share one token: the last target of one is the
// first input of the next).
class TokenStreamSource final : public DataSource {
 public:
  TokenStreamSource(std::vector<uint16_t> train, std::vector<uint16_t> val, int seqLen, uint64_t seed)
      : m_train(std::move(train)), m_val(std::move(val)), m_seqLen(seqLen), m_seed(seed) {}

  int64_t evalSamples() const override { return (static_cast<int64_t>(m_val.size()) - 1) / m_seqLen; }

  void trainBatch(int64_t step, int batchSize, int first, int count, Batch& out) const override {
    assert(first >= 0 && count >= 0 && first + count <= batchSize);
    const uint64_t starts = m_train.size() - static_cast<uint64_t>(m_seqLen);  // valid window starts
    resize(count, out);
    for (int b = 0; b < count; ++b) {
      const uint64_t sample = static_cast<uint64_t>(first + b);
      const uint64_t offset = hashCombine(m_seed, static_cast<uint64_t>(step), sample) % starts;
      copyWindow(m_train, offset, b, out);
    }
  }

  void evalBatch(int64_t first, int count, Batch& out) const override {
    assert(first >= 0 && count >= 0 && first + count <= evalSamples());
    count = static_cast<int>(std::clamp<int64_t>(evalSamples() - first, 0, count));
    resize(count, out);
    for (int b = 0; b < count; ++b) {
      copyWindow(m_val, static_cast<uint64_t>(first + b) * static_cast<uint64_t>(m_seqLen), b, out);
    }
  }

 private:
  void resize(int count, Batch& out) const {
    out.B = count;
    out.T = m_seqLen;
    out.tokens.resize(static_cast<size_t>(count) * m_seqLen);   // (B, T)
    out.targets.resize(static_cast<size_t>(count) * m_seqLen);  // (B, T)
    out.images.clear();
  }
  void copyWindow(const std::vector<uint16_t>& stream, uint64_t offset, int b, Batch& out) const {
    const uint16_t* window = stream.data() + offset;  // seqLen + 1 tokens
    int32_t* tokens = out.tokens.data() + static_cast<size_t>(b) * m_seqLen;
    int32_t* targets = out.targets.data() + static_cast<size_t>(b) * m_seqLen;
    for (int t = 0; t < m_seqLen; ++t) {
      tokens[t] = window[t];
      targets[t] = window[t + 1];
    }
  }

  std::vector<uint16_t> m_train;
  std::vector<uint16_t> m_val;
  int m_seqLen;
  uint64_t m_seed;
};

Status checkSplit(const TokenSplit& split, const char* name, int seqLen, const char* unit) {
  const uint64_t needed = static_cast<uint64_t>(seqLen) + 1;
  if (split.tokens.size() >= needed) return Status::ok();
  return Status::error(split.source + ": the " + name + " split holds " +
                       std::to_string(split.tokens.size()) + " " + unit + " but seq_len " +
                       std::to_string(seqLen) + " needs at least " + std::to_string(needed));
}

}  // namespace

Expected<std::unique_ptr<DataSource>> makeTokenStreamSource(TokenSplit train, TokenSplit val, int seqLen,
                                                            uint64_t seed, const char* unit) {
  if (seqLen < 1) return Status::error("training.seq_len must be at least 1, got " + std::to_string(seqLen));
  MS_TRY(checkSplit(train, "training", seqLen, unit));
  MS_TRY(checkSplit(val, "validation", seqLen, unit));
  return std::unique_ptr<DataSource>(
      std::make_unique<TokenStreamSource>(std::move(train.tokens), std::move(val.tokens), seqLen, seed));
}

Expected<std::unique_ptr<DataSource>> openDataSource(const RunConfig& config) {
  const DataConfig& data = config.data;
  auto resolveAll = [&](const std::vector<std::string>& paths) {
    std::vector<std::string> out;
    for (const std::string& p : paths) out.push_back(config.resolvePath(p));
    return out;
  };
  const int seqLen = config.training.seqLen;
  const int vocab = config.model.vocab;
  switch (data.kind) {
    case DataKind::Text: {
      Expected<std::vector<std::string>> files = expandPatterns(resolveAll(data.files), "data.files");
      if (!files) return files.status();
      return openTextData(*files, data.valFraction, seqLen, vocab, config.seed);
    }
    case DataKind::Tokens: {
      Expected<std::vector<std::string>> train = expandPatterns(resolveAll(data.train), "data.train");
      if (!train) return train.status();
      Expected<std::vector<std::string>> val = expandPatterns(resolveAll(data.val), "data.val");
      if (!val) return val.status();
      return openTokenData(*train, *val, seqLen, vocab, config.seed);
    }
    case DataKind::FashionMnist:
      return openFashionMnist(config.resolvePath(data.dir), config.seed);
  }
  return Status::error("data.kind: unknown kind " + std::to_string(static_cast<int>(data.kind)));
}

}  // namespace ms
