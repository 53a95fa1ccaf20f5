// The fashion_mnist kind: the four gzip-compressed IDX files of Fashion-MNIST (Xiao, Rasul, Vollgraf 2017;
// IDX format from http://yann.lecun.com/exdb/mnist/). Training sample i of step s is the global index
// g = s * batchSize + i; epoch g / N visits the N training images in the order of epochPermutation(seed,
// epoch, N). Evaluation is the t10k split in file order.
//
// What always holds: a returned source holds 28x28 images with matching label counts and labels < 10; the
// permutation cache is guarded by a mutex and only ever holds epochPermutation()'s exact result, so it
// never changes which samples a batch gets.
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>

#include "runtime/data.h"

namespace ms {

namespace {

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // uint8 data, 3 dimensions
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // uint8 data, 1 dimension
constexpr int kPixels = kFashionMnistSide * kFashionMnistSide;

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

uint32_t readBe32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 |
         static_cast<uint32_t>(p[2]) << 8 | static_cast<uint32_t>(p[3]);
}

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzHandle = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

// The whole decompressed content of a .gz file. zlib reads non-gzip files transparently, so the gzip magic
// is checked by hand first.
Expected<std::string> readGzip(const std::string& path) {
  std::FILE* raw = std::fopen(path.c_str(), "rb");
  if (!raw) {
    return Status::error(path + ": cannot open: " + std::strerror(errno) +
                         " (data.dir must hold the four Fashion-MNIST .gz files; on Debian the package "
                         "dataset-fashion-mnist installs them in /usr/share/datasets/fashion-mnist)");
  }
  unsigned char magic[2] = {0, 0};
  const size_t got = std::fread(magic, 1, 2, raw);
  std::fclose(raw);
  if (got < 2 || magic[0] != 0x1f || magic[1] != 0x8b) return Status::error(path + ": not a gzip file");

  GzHandle gz(gzopen(path.c_str(), "rb"));
  if (!gz) return Status::error(path + ": cannot open as gzip: " + std::strerror(errno));
  gzbuffer(gz.get(), 1 << 18);
  std::string out;
  // Chunks from 64 KiB doubling to 1 MiB: a small file (a labels file is 10 KB) is not padded to 1 MiB of
  // zeros first (which made fuzz_idx spend most of its time in memset).
  unsigned chunk = 1 << 16;
  for (;; chunk = std::min(chunk * 2, 1u << 20)) {
    const size_t base = out.size();
    out.resize(base + chunk);
    const int n = gzread(gz.get(), out.data() + base, chunk);
    if (n < 0) {
      int errnum = 0;
      const char* message = gzerror(gz.get(), &errnum);
      return Status::error(path + ": corrupt or truncated gzip data (" + message + ")");
    }
    out.resize(base + static_cast<size_t>(n));
    if (n == 0) break;
  }
  int errnum = Z_OK;
  const char* message = gzerror(gz.get(), &errnum);
  if (errnum != Z_OK && errnum != Z_STREAM_END) {
    return Status::error(path + ": corrupt or truncated gzip data (" + message + ")");
  }
  return out;
}

// An IDX file of uint8 data: its dimensions and the data bytes after the header.
struct Idx {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;
};

Expected<Idx> readIdx(const std::string& path, uint32_t expectedMagic, size_t rank, const char* what) {
  Expected<std::string> bytes = readGzip(path);
  if (!bytes) return bytes.status();
  const size_t headerBytes = 4 + 4 * rank;
  if (bytes->size() < headerBytes) {
    return Status::error(path + ": truncated IDX header (expected " + std::to_string(headerBytes) +
                         " bytes, got " + std::to_string(bytes->size()) + ")");
  }
  const auto* p = reinterpret_cast<const unsigned char*>(bytes->data());
  const uint32_t magic = readBe32(p);
  if (magic != expectedMagic) {
    return Status::error(path + ": wrong IDX magic " + hex32(magic) + " (expected " + hex32(expectedMagic) +
                         " for an IDX " + what + " file)");
  }
  Idx idx;
  uint64_t expected = 1;
  for (size_t d = 0; d < rank; ++d) {
    idx.dims.push_back(readBe32(p + 4 + 4 * d));
    expected *= idx.dims.back();
  }
  const uint64_t dataBytes = bytes->size() - headerBytes;
  if (dataBytes != expected) {
    return Status::error(path + ": " + (dataBytes < expected ? "truncated" : "trailing bytes") +
                         ": expected " + std::to_string(expected) + " bytes of data, got " +
                         std::to_string(dataBytes));
  }
  idx.data.assign(p + headerBytes, p + bytes->size());
  return idx;
}

struct Split {
  std::vector<uint8_t> images;  // (N, 28*28)
  std::vector<uint8_t> labels;  // (N)
  int32_t count = 0;
};

Expected<Split> readSplit(const std::string& imagesPath, const std::string& labelsPath) {
  Expected<Idx> images = readIdx(imagesPath, kIdxImagesMagic, 3, "image");
  if (!images) return images.status();
  const uint32_t rows = images->dims[1], cols = images->dims[2];
  if (rows != kFashionMnistSide || cols != kFashionMnistSide) {
    return Status::error(imagesPath + ": images are " + std::to_string(rows) + "x" + std::to_string(cols) +
                         ", expected 28x28");
  }
  if (images->dims[0] > static_cast<uint32_t>(INT32_MAX / kPixels)) {
    return Status::error(imagesPath + ": implausible image count " + std::to_string(images->dims[0]));
  }
  Expected<Idx> labels = readIdx(labelsPath, kIdxLabelsMagic, 1, "label");
  if (!labels) return labels.status();
  if (labels->dims[0] != images->dims[0]) {
    return Status::error(labelsPath + ": holds " + std::to_string(labels->dims[0]) + " labels but " +
                         imagesPath + " holds " + std::to_string(images->dims[0]) + " images");
  }
  if (images->dims[0] == 0) return Status::error(imagesPath + ": holds no images");
  for (size_t i = 0; i < labels->data.size(); ++i) {
    if (labels->data[i] >= kFashionMnistClasses) {
      return Status::error(labelsPath + ": label " + std::to_string(labels->data[i]) + " at position " +
                           std::to_string(i) + " is not below 10");
    }
  }
  return Split{std::move(images->data), std::move(labels->data), static_cast<int32_t>(images->dims[0])};
}

class FashionMnistSource final : public DataSource {
 public:
  FashionMnistSource(Split train, Split test, uint64_t seed)
      : m_train(std::move(train)), m_test(std::move(test)), m_seed(seed) {
    for (int p = 0; p < 256; ++p) {
      m_normalised[static_cast<size_t>(p)] =
          (static_cast<float>(p) / 255.0f - kFashionMnistMean) / kFashionMnistStd;
    }
  }

  int64_t evalSamples() const override { return m_test.count; }

  void trainBatch(int64_t step, int batchSize, int first, int count, Batch& out) const override {
    assert(first >= 0 && count >= 0 && first + count <= batchSize);
    std::vector<int32_t> indices(static_cast<size_t>(count));
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      const int64_t n = m_train.count;
      for (int b = 0; b < count; ++b) {
        const int64_t g = step * batchSize + first + b;
        indices[static_cast<size_t>(b)] = permutationFor(g / n)[static_cast<size_t>(g % n)];
      }
    }
    fill(m_train, indices, out);
  }

  void evalBatch(int64_t first, int count, Batch& out) const override {
    assert(first >= 0 && count >= 0 && first + count <= evalSamples());
    count = static_cast<int>(std::clamp<int64_t>(evalSamples() - first, 0, count));
    std::vector<int32_t> indices(static_cast<size_t>(count));
    for (int b = 0; b < count; ++b) indices[static_cast<size_t>(b)] = static_cast<int32_t>(first + b);
    fill(m_test, indices, out);
  }

 private:
  void fill(const Split& split, const std::vector<int32_t>& indices, Batch& out) const {
    const int count = static_cast<int>(indices.size());
    out.B = count;
    out.T = 1;
    out.tokens.clear();
    out.targets.resize(static_cast<size_t>(count));           // (B)
    out.images.resize(static_cast<size_t>(count) * kPixels);  // (B, S*S)
    for (int b = 0; b < count; ++b) {
      const auto index = static_cast<size_t>(indices[static_cast<size_t>(b)]);
      const uint8_t* pixels = split.images.data() + index * kPixels;
      float* dst = out.images.data() + static_cast<size_t>(b) * kPixels;
      for (int p = 0; p < kPixels; ++p) dst[p] = m_normalised[pixels[p]];
      out.targets[static_cast<size_t>(b)] = split.labels[index];
    }
  }

  // Called with m_mutex held. Two entries so a batch straddling an epoch boundary does not thrash.
  const std::vector<int32_t>& permutationFor(int64_t epoch) const {
    ++m_clock;
    for (CacheEntry& e : m_cache) {
      if (e.epoch == epoch) {
        e.lastUse = m_clock;
        return e.perm;
      }
    }
    CacheEntry& victim = m_cache[0].lastUse <= m_cache[1].lastUse ? m_cache[0] : m_cache[1];
    victim.epoch = epoch;
    victim.perm = epochPermutation(m_seed, epoch, m_train.count);
    victim.lastUse = m_clock;
    return victim.perm;
  }

  struct CacheEntry {
    int64_t epoch = -1;
    uint64_t lastUse = 0;
    std::vector<int32_t> perm;
  };

  Split m_train;
  Split m_test;
  uint64_t m_seed;
  std::array<float, 256> m_normalised{};  // pixel byte -> normalised float
  mutable std::mutex m_mutex;
  mutable std::array<CacheEntry, 2> m_cache;
  mutable uint64_t m_clock = 0;
};

}  // namespace

Expected<std::unique_ptr<DataSource>> openFashionMnist(const std::string& dir, uint64_t seed) {
  const std::filesystem::path base(dir);
  Expected<Split> train = readSplit((base / "train-images-idx3-ubyte.gz").string(),
                                    (base / "train-labels-idx1-ubyte.gz").string());
  if (!train) return train.status();
  Expected<Split> test =
      readSplit((base / "t10k-images-idx3-ubyte.gz").string(), (base / "t10k-labels-idx1-ubyte.gz").string());
  if (!test) return test.status();
  return std::unique_ptr<DataSource>(
      std::make_unique<FashionMnistSource>(std::move(*train), std::move(*test), seed));
}

}  // namespace ms
