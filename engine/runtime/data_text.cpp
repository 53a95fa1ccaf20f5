// The text kind: files read as bytes, one token per byte (vocab 256), concatenated in the given order. The
// first (1 - val_fraction) of the bytes is the training split, the rest the validation split.
//
// What always holds: a returned source has both splits at least seq_len + 1 bytes long and every byte is
// below model.vocab (so a model with a smaller vocabulary never sees an out-of-range id).
#include <cmath>
#include <utility>

#include "runtime/data.h"
#include "runtime/file_io.h"

namespace ms {

Expected<std::unique_ptr<DataSource>> openTextData(const std::vector<std::string>& files, double valFraction,
                                                   int seqLen, int vocab, uint64_t seed) {
  if (files.empty()) return Status::error("data.files: no files given");
  if (!(valFraction >= 0.0 && valFraction < 1.0)) {
    return Status::error("data.val_fraction must be in [0, 1), got " + std::to_string(valFraction));
  }
  std::vector<uint16_t> all;
  for (const std::string& file : files) {
    Expected<std::string> bytes = readFile(file);
    if (!bytes) return bytes.status();
    if (bytes->empty()) return Status::error(file + ": empty file (text data needs at least one byte)");
    for (size_t i = 0; i < bytes->size(); ++i) {
      const auto token = static_cast<unsigned char>((*bytes)[i]);
      if (token >= vocab) {
        return Status::error(file + ": byte value " + std::to_string(token) + " at position " +
                             std::to_string(i) + " is not below model.vocab " + std::to_string(vocab));
      }
    }
    all.insert(all.end(), reinterpret_cast<const unsigned char*>(bytes->data()),
               reinterpret_cast<const unsigned char*>(bytes->data()) + bytes->size());
  }
  const auto trainCount =
      static_cast<size_t>(std::floor((1.0 - valFraction) * static_cast<double>(all.size())));
  const std::string source = describeFiles(files);
  TokenSplit train{std::vector<uint16_t>(all.begin(), all.begin() + static_cast<ptrdiff_t>(trainCount)),
                   source};
  TokenSplit val{std::vector<uint16_t>(all.begin() + static_cast<ptrdiff_t>(trainCount), all.end()), source};
  return makeTokenStreamSource(std::move(train), std::move(val), seqLen, seed, "bytes");
}

}  // namespace ms
