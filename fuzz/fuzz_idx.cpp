// Fuzz target: the Fashion-MNIST IDX reader (runtime/data_mnist.cpp): gzip, the IDX header, the image and
// label files of a split agreeing. The reader takes a folder of four .gz files, so the target keeps a small
// valid set (3 training and 2 test images with labels) in a private temporary folder and replaces one of
// them by the input: its first byte picks which (modulo 4), the rest is the file. A rest that does not start
// with the gzip magic (1f 8b) is gzip-compressed by the target first, so the fuzzer can mutate the IDX
// structure itself; one that does is written as is and exercises the gzip handling.
//
// Checked for every input, beyond not crashing: an error names the file; an accepted set gives batches of
// 28x28 images normalised from bytes and labels below 10.
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "runtime/data.h"

namespace {

constexpr std::array<const char*, 4> kFiles = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                               "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

// An uncompressed IDX file: images (magic 0x803, n x 28 x 28) or labels (magic 0x801, n).
std::string idx(bool images, uint32_t n) {
  std::string s = be32(images ? 0x803 : 0x801) + be32(n);
  if (images) {
    s += be32(28) + be32(28);
    for (uint32_t i = 0; i < n * 28 * 28; ++i) s += static_cast<char>((i * 37) % 256);
  } else {
    for (uint32_t i = 0; i < n; ++i) s += static_cast<char>(i % 10);
  }
  return s;
}

// Writes bytes to path, gzip-compressed unless they already start with the gzip magic.
void writeGz(const fuzz::TempDir& dir, const char* name, std::string_view bytes) {
  if (bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
      static_cast<unsigned char>(bytes[1]) == 0x8b) {
    dir.write(name, bytes);
    return;
  }
  const std::string path = dir.path() + "/" + name;
  gzFile gz = gzopen(path.c_str(), "wb");
  FUZZ_CHECK(gz != nullptr, "cannot create %s", path.c_str());
  const int written = bytes.empty() ? 0 : gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size()));
  FUZZ_CHECK(written == static_cast<int>(bytes.size()), "cannot write %s", path.c_str());
  FUZZ_CHECK(gzclose(gz) == Z_OK, "cannot close %s", path.c_str());
}

struct ValidSet {
  fuzz::TempDir dir;
  std::array<std::string, 4> files = {idx(true, 3), idx(false, 3), idx(true, 2), idx(false, 2)};
  ValidSet() {
    for (size_t i = 0; i < kFiles.size(); ++i) writeGz(dir, kFiles[i], files[i]);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ValidSet set;
  if (size == 0) return fuzz::outcome(false);
  const size_t which = data[0] % 4;
  writeGz(set.dir, kFiles[which], std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  auto source = ms::openFashionMnist(set.dir.path(), /*seed=*/3);
  if (!source) {
    FUZZ_CHECK(fuzz::contains(source.message(), set.dir.path() + "/"), "an error without the file: %s",
               source.message().c_str());
  } else {
    const int64_t eval = (*source)->evalSamples();
    FUZZ_CHECK(eval >= 1, "accepted a test split of %lld images", static_cast<long long>(eval));
    if (which < 2)
      FUZZ_CHECK(eval == 2, "the test split has %lld images, not 2", static_cast<long long>(eval));
    ms::Batch batch;
    const float lo = (0.0f - ms::kFashionMnistMean) / ms::kFashionMnistStd;
    const float hi = (1.0f - ms::kFashionMnistMean) / ms::kFashionMnistStd;
    for (int pass = 0; pass < 2; ++pass) {
      const int count = pass == 0 ? 4 : static_cast<int>(std::min<int64_t>(eval, 4));
      if (pass == 0)
        (*source)->trainBatch(/*step=*/5, 4, 0, 4, batch);
      else
        (*source)->evalBatch(0, count, batch);
      FUZZ_CHECK(batch.B == count && batch.targets.size() == static_cast<size_t>(count) &&
                     batch.images.size() == static_cast<size_t>(count) * 28 * 28,
                 "a batch of %d holds %zu labels and %zu pixels", count, batch.targets.size(),
                 batch.images.size());
      for (int32_t label : batch.targets) FUZZ_CHECK(label >= 0 && label < 10, "label %d", label);
      for (float p : batch.images)
        FUZZ_CHECK(std::isfinite(p) && p >= lo - 1e-5f && p <= hi + 1e-5f, "pixel %g",
                   static_cast<double>(p));
    }
  }
  writeGz(set.dir, kFiles[which], set.files[which]);  // the valid file back for the next input
  return fuzz::outcome(static_cast<bool>(source));
}
