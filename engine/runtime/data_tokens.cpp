// The tokens kind: llm.c .bin shards (karpathy/llm.c, dev/data/data_common.py write_datafile). A shard is a
// header of 256 little-endian int32 (magic 20240520, version 1, token count) followed by that many
// little-endian uint16 tokens. The train shards form one stream, the val shards another.
//
// What always holds: a shard is accepted only when its header is intact, its size matches the token count
// exactly and every token is below model.vocab; anything else is an error naming the shard.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "runtime/data.h"

namespace ms {

namespace {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr size_t kShardHeaderInts = 256;
constexpr size_t kShardHeaderBytes = kShardHeaderInts * 4;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

int32_t readLe32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                              static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}

// Appends the shard's tokens to `out`.
Status readShard(const std::string& path, int vocab, std::vector<uint16_t>& out) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) return Status::error(path + ": cannot open token shard: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fileno(file.get()), &st) != 0)
    return Status::error(path + ": cannot stat: " + std::strerror(errno));
  const auto fileBytes = static_cast<uint64_t>(st.st_size);

  unsigned char header[kShardHeaderBytes];
  const size_t got = std::fread(header, 1, kShardHeaderBytes, file.get());
  if (got < kShardHeaderBytes) {
    return Status::error(path + ": shorter than the " + std::to_string(kShardHeaderBytes) +
                         "-byte llm.c shard header (" + std::to_string(got) + " bytes)");
  }
  const int32_t magic = readLe32(header);
  if (magic != kShardMagic) {
    return Status::error(path + ": bad magic number " + std::to_string(magic) + " (expected " +
                         std::to_string(kShardMagic) + "); not an llm.c token shard");
  }
  const int32_t version = readLe32(header + 4);
  if (version != kShardVersion) {
    return Status::error(path + ": unsupported shard version " + std::to_string(version) +
                         " (only version 1, uint16 tokens, is supported)");
  }
  const int32_t count = readLe32(header + 8);
  const uint64_t dataBytes = fileBytes - kShardHeaderBytes;
  if (count < 0 || dataBytes != static_cast<uint64_t>(count) * 2) {
    return Status::error(path + ": the header says " + std::to_string(count) + " tokens (" +
                         std::to_string(static_cast<int64_t>(count) * 2) + " bytes) but the file holds " +
                         std::to_string(dataBytes) + " bytes of tokens after the header");
  }
  std::vector<unsigned char> raw(static_cast<size_t>(dataBytes));
  if (std::fread(raw.data(), 1, raw.size(), file.get()) != raw.size()) {
    return Status::error(path + ": read error after the header: " + std::strerror(errno));
  }
  const size_t base = out.size();
  out.resize(base + static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) {
    const auto token =
        static_cast<uint16_t>(raw[2 * static_cast<size_t>(i)] | raw[2 * static_cast<size_t>(i) + 1] << 8);
    if (token >= vocab) {
      return Status::error(path + ": token " + std::to_string(token) + " at position " + std::to_string(i) +
                           " is not below model.vocab " + std::to_string(vocab));
    }
    out[base + static_cast<size_t>(i)] = token;
  }
  return Status::ok();
}

Expected<TokenSplit> readShards(const std::vector<std::string>& files, int vocab) {
  TokenSplit split;
  split.source = describeFiles(files);
  for (const std::string& file : files) MS_TRY(readShard(file, vocab, split.tokens));
  return split;
}

}  // namespace

Expected<std::unique_ptr<DataSource>> openTokenData(const std::vector<std::string>& trainFiles,
                                                    const std::vector<std::string>& valFiles, int seqLen,
                                                    int vocab, uint64_t seed) {
  if (trainFiles.empty()) return Status::error("data.train: no files given");
  if (valFiles.empty()) return Status::error("data.val: no files given");
  Expected<TokenSplit> train = readShards(trainFiles, vocab);
  if (!train) return train.status();
  Expected<TokenSplit> val = readShards(valFiles, vocab);
  if (!val) return val.status();
  return makeTokenStreamSource(std::move(*train), std::move(*val), seqLen, seed, "tokens");
}

}  // namespace ms
