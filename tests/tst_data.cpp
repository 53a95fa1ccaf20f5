// Tests of the data loaders (engine/runtime/data.h): text windows and next-token targets, determinism and
// batch splitting, llm.c shard round trips, every documented error, synthetic and real Fashion-MNIST.
#include <QTemporaryDir>
#include <QtTest>

#include "test_util.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "runtime/data.h"

using namespace ms;

namespace {

const char* const kRealMnistDir = ms::test::kFashionMnistDir;

using ms::test::readBytes;
using ms::test::writeBytes;

void appendLe32(std::string& s, int32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(static_cast<uint32_t>(v) >> (8 * i)));
}

void appendBe32(std::string& s, uint32_t v) {
  for (int i = 3; i >= 0; --i) s.push_back(static_cast<char>(v >> (8 * i)));
}

// An llm.c shard (dev/data/data_common.py write_datafile); the overrides make broken ones.
std::string shardBytes(const std::vector<uint16_t>& tokens, int32_t magic = 20240520, int32_t version = 1,
                       int32_t headerCount = -1) {
  std::string s;
  appendLe32(s, magic);
  appendLe32(s, version);
  appendLe32(s, headerCount >= 0 ? headerCount : static_cast<int32_t>(tokens.size()));
  s.resize(1024, '\0');
  for (uint16_t t : tokens) {
    s.push_back(static_cast<char>(t & 0xff));
    s.push_back(static_cast<char>(t >> 8));
  }
  return s;
}

std::vector<uint16_t> randomTokens(size_t n, uint64_t seed, int vocab) {
  std::vector<uint16_t> out(n);
  SplitMix64 rng(seed);
  for (auto& t : out) t = static_cast<uint16_t>(rng.below(static_cast<uint64_t>(vocab)));
  return out;
}

void writeGzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  QVERIFY(f != nullptr);
  QCOMPARE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  QCOMPARE(gzclose(f), Z_OK);
}

std::string idxImages(uint32_t count, uint32_t rows, uint32_t cols, uint32_t magic = 0x00000803) {
  std::string s;
  appendBe32(s, magic);
  appendBe32(s, count);
  appendBe32(s, rows);
  appendBe32(s, cols);
  for (uint32_t i = 0; i < count * rows * cols; ++i) s.push_back(static_cast<char>((i * 7 + i / 784) % 256));
  return s;
}

// Label i is i % 10, so a label identifies an image of a small synthetic split.
std::string idxLabels(uint32_t count, uint32_t magic = 0x00000801) {
  std::string s;
  appendBe32(s, magic);
  appendBe32(s, count);
  for (uint32_t i = 0; i < count; ++i) s.push_back(static_cast<char>(i % 10));
  return s;
}

// A valid miniature Fashion-MNIST directory: 7 training images with labels 0..6, 3 test images.
void writeMiniMnist(const std::string& dir) {
  writeGzip(dir + "/train-images-idx3-ubyte.gz", idxImages(7, 28, 28));
  writeGzip(dir + "/train-labels-idx1-ubyte.gz", idxLabels(7));
  writeGzip(dir + "/t10k-images-idx3-ubyte.gz", idxImages(3, 28, 28));
  writeGzip(dir + "/t10k-labels-idx1-ubyte.gz", idxLabels(3));
}

RunConfig textConfig(const std::string& baseDir, std::vector<std::string> files, int seqLen,
                     double valFraction) {
  RunConfig c;
  c.baseDir = baseDir;
  c.seed = 42;
  c.model.vocab = 256;
  c.training.seqLen = seqLen;
  c.data.kind = DataKind::Text;
  c.data.files = std::move(files);
  c.data.valFraction = valFraction;
  return c;
}

RunConfig tokenConfig(const std::string& baseDir, std::vector<std::string> train,
                      std::vector<std::string> val, int seqLen, int vocab) {
  RunConfig c;
  c.baseDir = baseDir;
  c.seed = 7;
  c.model.vocab = vocab;
  c.training.seqLen = seqLen;
  c.data.kind = DataKind::Tokens;
  c.data.train = std::move(train);
  c.data.val = std::move(val);
  return c;
}

bool batchesEqual(const Batch& a, const Batch& b) {
  return a.B == b.B && a.T == b.T && a.tokens == b.tokens && a.targets == b.targets && a.images == b.images;
}

// The documented training window: start = hashCombine(seed, step, sample) mod (trainTokens - seqLen).
void checkTrainWindows(const Batch& batch, const std::vector<uint16_t>& train, uint64_t seed, int64_t step,
                       int first, int seqLen) {
  QCOMPARE(batch.T, seqLen);
  QCOMPARE(batch.tokens.size(), size_t(batch.B) * seqLen);
  QCOMPARE(batch.targets.size(), size_t(batch.B) * seqLen);
  for (int b = 0; b < batch.B; ++b) {
    const uint64_t start = hashCombine(seed, uint64_t(step), uint64_t(first + b)) % (train.size() - seqLen);
    for (int t = 0; t < seqLen; ++t) {
      QCOMPARE(batch.tokens[size_t(b) * seqLen + t], int32_t(train[start + t]));
      QCOMPARE(batch.targets[size_t(b) * seqLen + t], int32_t(train[start + t + 1]));
    }
  }
}

}  // namespace

class TestData : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir m_tmp;
  std::unique_ptr<DataSource> m_realMnist;  // opened once, on first use

  std::string path(const std::string& name) const { return (m_tmp.path() + "/").toStdString() + name; }
  const DataSource* realMnist() {
    if (!m_realMnist && std::filesystem::exists(std::string(kRealMnistDir) + "/t10k-labels-idx1-ubyte.gz")) {
      Expected<std::unique_ptr<DataSource>> source = openFashionMnist(kRealMnistDir, 1234);
      if (!source) qWarning("%s", source.message().c_str());
      if (source) m_realMnist = std::move(*source);
    }
    return m_realMnist.get();
  }

 private slots:
  void initTestCase() { QVERIFY(m_tmp.isValid()); }

  void splitmixReferenceValues() {
    // First outputs of splitmix64.c seeded with 0 (https://prng.di.unimi.it/splitmix64.c).
    SplitMix64 rng(0);
    QCOMPARE(rng.next(), 0xe220a8397b1dcdafull);
    QCOMPARE(rng.next(), 0x6e789e6aa1b965f4ull);
    QCOMPARE(splitmix64(0), 0xe220a8397b1dcdafull);
    QVERIFY(hashCombine(1, 2, 3) != hashCombine(1, 3, 2));
  }

  void textWindowsAndTargets() {
    const std::vector<uint16_t> bytes = randomTokens(1000, 99, 256);
    writeBytes(path("corpus.txt"), std::string(bytes.begin(), bytes.end()));
    const int seqLen = 8;
    Expected<std::unique_ptr<DataSource>> source =
        openDataSource(textConfig(m_tmp.path().toStdString(), {"corpus.txt"}, seqLen, 0.1));
    QVERIFY2(source, source.message().c_str());
    const std::vector<uint16_t> train(bytes.begin(), bytes.begin() + 900);
    const std::vector<uint16_t> val(bytes.begin() + 900, bytes.end());
    QCOMPARE((*source)->evalSamples(), int64_t((100 - 1) / seqLen));

    Batch batch;
    (*source)->trainBatch(3, 16, 0, 16, batch);
    QCOMPARE(batch.B, 16);
    QVERIFY(batch.images.empty());
    checkTrainWindows(batch, train, 42, 3, 0, seqLen);

    (*source)->evalBatch(0, int((*source)->evalSamples()), batch);
    QCOMPARE(batch.B, 12);
    for (int j = 0; j < batch.B; ++j) {
      for (int t = 0; t < seqLen; ++t) {
        QCOMPARE(batch.tokens[size_t(j) * seqLen + t], int32_t(val[size_t(j) * seqLen + t]));
        QCOMPARE(batch.targets[size_t(j) * seqLen + t], int32_t(val[size_t(j) * seqLen + t + 1]));
      }
    }
    Batch tail;
    (*source)->evalBatch(10, 2, tail);
    QCOMPARE(tail.B, 2);
    QVERIFY(std::equal(tail.tokens.begin(), tail.tokens.end(), batch.tokens.begin() + 10 * seqLen));
  }

  void textFilesConcatenateInOrder() {
    writeBytes(path("part_b.txt"), std::string(500, 'b'));
    writeBytes(path("part_a.txt"), std::string(500, 'a'));
    // The glob sorts: part_a then part_b, so the training split (first 900 bytes) starts with 'a'.
    Expected<std::unique_ptr<DataSource>> source =
        openDataSource(textConfig(m_tmp.path().toStdString(), {path("part_?.txt")}, 4, 0.1));
    QVERIFY2(source, source.message().c_str());
    Batch batch;
    (*source)->evalBatch(0, 1, batch);
    QCOMPARE(batch.tokens[0], int32_t('b'));
    bool sawA = false;
    for (int s = 0; s < 20; ++s) {
      (*source)->trainBatch(s, 4, 0, 4, batch);
      sawA = sawA || std::count(batch.tokens.begin(), batch.tokens.end(), int32_t('a')) > 0;
    }
    QVERIFY(sawA);
  }

  void determinismAndSteps() {
    const std::vector<uint16_t> bytes = randomTokens(5000, 5, 256);
    writeBytes(path("det.txt"), std::string(bytes.begin(), bytes.end()));
    RunConfig config = textConfig(m_tmp.path().toStdString(), {"det.txt"}, 16, 0.2);
    Expected<std::unique_ptr<DataSource>> a = openDataSource(config);
    Expected<std::unique_ptr<DataSource>> b = openDataSource(config);
    QVERIFY2(a && b, a.message().c_str());
    Batch x, y;
    (*a)->trainBatch(10, 8, 0, 8, x);
    (*b)->trainBatch(10, 8, 0, 8, y);
    QVERIFY(batchesEqual(x, y));
    (*a)->trainBatch(10, 8, 0, 8, y);  // no hidden cursor: asking again gives the same batch
    QVERIFY(batchesEqual(x, y));
    (*a)->trainBatch(11, 8, 0, 8, y);
    QVERIFY(x.tokens != y.tokens);
    config.seed = 43;
    Expected<std::unique_ptr<DataSource>> c = openDataSource(config);
    QVERIFY(c);
    (*c)->trainBatch(10, 8, 0, 8, y);
    QVERIFY(x.tokens != y.tokens);
  }

  void splitGlobalBatch() {
    const std::vector<uint16_t> bytes = randomTokens(3000, 6, 256);
    writeBytes(path("split.txt"), std::string(bytes.begin(), bytes.end()));
    Expected<std::unique_ptr<DataSource>> source =
        openDataSource(textConfig(m_tmp.path().toStdString(), {"split.txt"}, 12, 0.1));
    QVERIFY2(source, source.message().c_str());
    const int B = 10;
    Batch whole, lo, hi;
    (*source)->trainBatch(5, B, 0, B, whole);
    (*source)->trainBatch(5, B, 0, B / 2, lo);
    (*source)->trainBatch(5, B, B / 2, B - B / 2, hi);
    QCOMPARE(lo.B + hi.B, whole.B);
    std::vector<int32_t> tokens = lo.tokens, targets = lo.targets;
    tokens.insert(tokens.end(), hi.tokens.begin(), hi.tokens.end());
    targets.insert(targets.end(), hi.targets.begin(), hi.targets.end());
    QCOMPARE(tokens, whole.tokens);
    QCOMPARE(targets, whole.targets);
  }

  void tokenShardsRoundTrip() {
    const int vocab = 50257;
    const std::vector<uint16_t> t0 = randomTokens(300, 1, vocab), t1 = randomTokens(200, 2, vocab);
    const std::vector<uint16_t> v0 = randomTokens(129, 3, vocab);
    writeBytes(path("shard_train_000.bin"), shardBytes(t0));
    writeBytes(path("shard_train_001.bin"), shardBytes(t1));
    writeBytes(path("shard_val_000.bin"), shardBytes(v0));
    const int seqLen = 16;
    // Relative patterns resolve against baseDir.
    Expected<std::unique_ptr<DataSource>> source = openDataSource(
        tokenConfig(m_tmp.path().toStdString(), {"shard_train_*.bin"}, {"shard_val_000.bin"}, seqLen, vocab));
    QVERIFY2(source, source.message().c_str());
    std::vector<uint16_t> train = t0;
    train.insert(train.end(), t1.begin(), t1.end());
    Batch batch;
    for (int64_t step : {0, 1, 77}) {
      (*source)->trainBatch(step, 32, 0, 32, batch);
      checkTrainWindows(batch, train, 7, step, 0, seqLen);
    }
    QCOMPARE((*source)->evalSamples(), int64_t((129 - 1) / seqLen));
    (*source)->evalBatch(7, 1, batch);
    for (int t = 0; t < seqLen; ++t) {
      QCOMPARE(batch.tokens[t], int32_t(v0[7 * seqLen + t]));
      QCOMPARE(batch.targets[t], int32_t(v0[7 * seqLen + t + 1]));
    }
    // A window that straddles the two train shards exists: the stream is one concatenation.
    bool straddles = false;
    for (int64_t step = 0; step < 50 && !straddles; ++step) {
      for (int i = 0; i < 32; ++i) {
        const uint64_t start = hashCombine(7, uint64_t(step), uint64_t(i)) % (train.size() - seqLen);
        straddles = straddles || (start < 300 && start + seqLen >= 300);
      }
    }
    QVERIFY(straddles);
  }

  void errors_data() {
    QTest::addColumn<int>("scenario");
    QTest::addColumn<QString>("file");
    QTest::addColumn<QString>("reason");
    QTest::newRow("truncated header") << 0 << "err_short.bin"
                                      << "shorter than the 1024-byte";
    QTest::newRow("bad magic") << 1 << "err_magic.bin"
                               << "bad magic number 12345 (expected 20240520)";
    QTest::newRow("bad version") << 2 << "err_version.bin"
                                 << "unsupported shard version 2";
    QTest::newRow("count mismatch") << 3 << "err_count.bin"
                                    << "header says 100 tokens (200 bytes) but the file holds 80 bytes";
    QTest::newRow("token >= vocab") << 4 << "err_vocab.bin"
                                    << "token 300 at position 5 is not below model.vocab 256";
    QTest::newRow("missing file") << 5 << "err_missing.bin"
                                  << "cannot open";
    QTest::newRow("glob matches nothing") << 6 << "nothing_here_*.bin"
                                          << "matches no file";
    QTest::newRow("text too short") << 7 << "err_short.txt"
                                    << "holds 9 bytes but seq_len 16 needs at least 17";
    QTest::newRow("text empty") << 8 << "err_empty.txt"
                                << "empty file";
    QTest::newRow("text byte >= vocab") << 9 << "err_byte.txt"
                                        << "byte value 200 at position 3";
    QTest::newRow("val split too short") << 10 << "err_val.bin"
                                         << "validation split holds 10 tokens";
  }

  void errors() {
    QFETCH(int, scenario);
    QFETCH(QString, file);
    QFETCH(QString, reason);
    const std::string name = file.toStdString();
    const std::string dir = m_tmp.path().toStdString();
    writeBytes(path("ok_train.bin"), shardBytes(randomTokens(100, 11, 256)));
    writeBytes(path("ok_val.bin"), shardBytes(randomTokens(100, 12, 256)));
    std::vector<uint16_t> bad = randomTokens(100, 13, 256);
    bad[5] = 300;
    RunConfig config = tokenConfig(dir, {name}, {"ok_val.bin"}, 16, 256);
    switch (scenario) {
      case 0:
        writeBytes(path(name), shardBytes({}).substr(0, 100));
        break;
      case 1:
        writeBytes(path(name), shardBytes(bad, 12345));
        break;
      case 2:
        writeBytes(path(name), shardBytes(bad, 20240520, 2));
        break;
      case 3:
        writeBytes(path(name), shardBytes(randomTokens(40, 1, 256), 20240520, 1, 100));
        break;
      case 4:
        writeBytes(path(name), shardBytes(bad));
        break;
      case 5:
        break;
      case 6:
        break;
      case 7:
      case 8:
      case 9: {
        std::string text = scenario == 7   ? std::string(10, 'x')
                           : scenario == 8 ? ""
                                           : "abc\xc8zzzzzzzzzzzzzzzzzzzzzzzzzz";
        writeBytes(path(name), text);
        config = textConfig(dir, {name}, 16, 0.1);
        if (scenario == 9) config.model.vocab = 128;
        break;
      }
      case 10:
        writeBytes(path(name), shardBytes(randomTokens(10, 1, 256)));
        config = tokenConfig(dir, {"ok_train.bin"}, {name}, 16, 256);
        break;
    }
    Expected<std::unique_ptr<DataSource>> source = openDataSource(config);
    QVERIFY(!source);
    const QString message = QString::fromStdString(source.message());
    QVERIFY2(message.contains(file), qPrintable("no file name in: " + message));
    QVERIFY2(message.contains(reason), qPrintable("no '" + reason + "' in: " + message));
  }

  void epochPermutationCoversEachIndexOnce() {
    for (int32_t n : {0, 1, 2, 7, 60000}) {
      std::vector<int32_t> perm = epochPermutation(1, 3, n);
      QCOMPARE(int32_t(perm.size()), n);
      std::vector<int32_t> sorted = perm;
      std::sort(sorted.begin(), sorted.end());
      for (int32_t i = 0; i < n; ++i) QCOMPARE(sorted[size_t(i)], i);
    }
    QCOMPARE(epochPermutation(1, 3, 60000), epochPermutation(1, 3, 60000));
    QVERIFY(epochPermutation(1, 3, 60000) != epochPermutation(1, 4, 60000));
    QVERIFY(epochPermutation(1, 3, 60000) != epochPermutation(2, 3, 60000));
    const std::vector<int32_t> perm = epochPermutation(1, 3, 60000);
    int fixedPoints = 0;
    for (int32_t i = 0; i < 60000; ++i) fixedPoints += perm[size_t(i)] == i;
    QVERIFY(fixedPoints < 10);  // a shuffle, not the identity (expected about 1)
  }

  void miniMnistEpochsAndSplits() {
    const std::string dir = path("mini_mnist");
    std::filesystem::create_directories(dir);
    writeMiniMnist(dir);
    RunConfig config;
    config.baseDir = m_tmp.path().toStdString();
    config.seed = 5;
    config.data.kind = DataKind::FashionMnist;
    config.data.dir = "mini_mnist";
    Expected<std::unique_ptr<DataSource>> source = openDataSource(config);
    QVERIFY2(source, source.message().c_str());
    QCOMPARE((*source)->evalSamples(), int64_t(3));
    Batch batch;
    (*source)->evalBatch(0, 3, batch);
    QCOMPARE(batch.B, 3);
    QCOMPARE(batch.T, 1);
    QVERIFY(batch.tokens.empty());
    QCOMPARE(batch.images.size(), size_t(3 * 784));
    QCOMPARE(batch.targets, (std::vector<int32_t>{0, 1, 2}));
    QCOMPARE(batch.images[0], (0.0f / 255.0f - kFashionMnistMean) / kFashionMnistStd);
    QCOMPARE(batch.images[1], (7.0f / 255.0f - kFashionMnistMean) / kFashionMnistStd);

    // Batch size 3 over 7 images: global samples 0..6 are epoch 0, 7..13 epoch 1, each a permutation
    // (label i identifies image i), in the order epochPermutation documents.
    std::vector<int32_t> labels;
    for (int64_t step = 0; step < 5; ++step) {
      (*source)->trainBatch(step, 3, 0, 3, batch);
      labels.insert(labels.end(), batch.targets.begin(), batch.targets.end());
    }
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::vector<int32_t> got(labels.begin() + 7 * epoch, labels.begin() + 7 * epoch + 7);
      QCOMPARE(got, epochPermutation(5, epoch, 7));
    }
    // Halves of a batch that straddles the epoch boundary equal the whole; threads agree with sequential.
    Batch whole, lo, hi;
    (*source)->trainBatch(2, 3, 0, 3, whole);
    (*source)->trainBatch(2, 3, 0, 1, lo);
    (*source)->trainBatch(2, 3, 1, 2, hi);
    QCOMPARE(lo.targets[0], whole.targets[0]);
    QCOMPARE(hi.targets[1], whole.targets[2]);
    QVERIFY(std::equal(hi.images.begin(), hi.images.end(), whole.images.begin() + 784));
    std::vector<Batch> threaded(8);
    std::vector<std::thread> threads;
    for (int k = 0; k < 8; ++k) {
      threads.emplace_back([&, k] { (*source)->trainBatch(k * 3, 3, 0, 3, threaded[size_t(k)]); });
    }
    for (auto& t : threads) t.join();
    for (int k = 0; k < 8; ++k) {
      (*source)->trainBatch(k * 3, 3, 0, 3, batch);
      QVERIFY(batchesEqual(batch, threaded[size_t(k)]));
    }
  }

  void mnistErrors_data() {
    QTest::addColumn<int>("scenario");
    QTest::addColumn<QString>("file");
    QTest::addColumn<QString>("reason");
    QTest::newRow("missing") << 0 << "t10k-labels-idx1-ubyte.gz"
                             << "cannot open";
    QTest::newRow("not gzip") << 1 << "train-images-idx3-ubyte.gz"
                              << "not a gzip file";
    QTest::newRow("corrupt gzip") << 2 << "train-labels-idx1-ubyte.gz"
                                  << "corrupt or truncated gzip data";
    QTest::newRow("wrong magic") << 3 << "train-images-idx3-ubyte.gz"
                                 << "wrong IDX magic 0x00000802 (expected 0x00000803";
    QTest::newRow("truncated data") << 4 << "train-images-idx3-ubyte.gz"
                                    << "truncated: expected 5488 bytes of data, got 5000";
    QTest::newRow("count mismatch") << 5 << "train-labels-idx1-ubyte.gz"
                                    << "holds 6 labels but";
    QTest::newRow("label >= 10") << 6 << "t10k-labels-idx1-ubyte.gz"
                                 << "label 12 at position 2 is not below 10";
    QTest::newRow("not 28x28") << 7 << "t10k-images-idx3-ubyte.gz"
                               << "images are 32x28, expected 28x28";
    QTest::newRow("truncated header") << 8 << "train-labels-idx1-ubyte.gz"
                                      << "truncated IDX header";
  }

  void mnistErrors() {
    QFETCH(int, scenario);
    QFETCH(QString, file);
    QFETCH(QString, reason);
    const std::string dir = path("bad_mnist_" + std::to_string(scenario));
    std::filesystem::create_directories(dir);
    writeMiniMnist(dir);
    const std::string target = dir + "/" + file.toStdString();
    switch (scenario) {
      case 0:
        std::filesystem::remove(target);
        break;
      case 1:
        writeBytes(target, idxImages(7, 28, 28));
        break;
      case 2: {
        const std::string gz = readBytes(target);
        writeBytes(target, gz.substr(0, gz.size() / 2));
        break;
      }
      case 3:
        writeGzip(target, idxImages(7, 28, 28, 0x00000802));
        break;
      case 4:
        writeGzip(target, idxImages(7, 28, 28).substr(0, 16 + 5000));
        break;
      case 5:
        writeGzip(target, idxLabels(6));
        break;
      case 6: {
        std::string labels = idxLabels(3);
        labels[8 + 2] = 12;
        writeGzip(target, labels);
        break;
      }
      case 7:
        writeGzip(target, idxImages(3, 32, 28));
        break;
      case 8:
        writeGzip(target, idxLabels(7).substr(0, 6));
        break;
    }
    Expected<std::unique_ptr<DataSource>> source = openFashionMnist(dir, 1);
    QVERIFY(!source);
    const QString message = QString::fromStdString(source.message());
    QVERIFY2(message.contains(QString::fromStdString(target)), qPrintable("no file name in: " + message));
    QVERIFY2(message.contains(reason), qPrintable("no '" + reason + "' in: " + message));
  }

  void realMnistTruncatedCopy() {
    const std::string real = std::string(kRealMnistDir) + "/t10k-labels-idx1-ubyte.gz";
    if (!std::filesystem::exists(real))
      QSKIP("Fashion-MNIST is not installed (Debian: dataset-fashion-mnist)");
    const std::string dir = path("truncated_real");
    std::filesystem::create_directories(dir);
    for (const char* name :
         {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz"}) {
      std::filesystem::copy_file(std::string(kRealMnistDir) + "/" + name, dir + "/" + name);
    }
    const std::string bytes = readBytes(real);
    writeBytes(dir + "/t10k-labels-idx1-ubyte.gz", bytes.substr(0, bytes.size() - 100));
    Expected<std::unique_ptr<DataSource>> source = openFashionMnist(dir, 1);
    QVERIFY(!source);
    QVERIFY2(source.message().find(dir + "/t10k-labels-idx1-ubyte.gz: corrupt or truncated gzip data") !=
                 std::string::npos,
             source.message().c_str());
  }

  void realMnistCountsAndLabels() {
    const DataSource* source = realMnist();
    if (!source) QSKIP("Fashion-MNIST is not installed (Debian: dataset-fashion-mnist)");
    QCOMPARE(source->evalSamples(), int64_t(10000));
    Batch batch;
    source->evalBatch(0, 10000, batch);
    QCOMPARE(batch.B, 10000);
    QCOMPARE(batch.targets.front(), 9);  // the first t10k image is an ankle boot
    std::map<int32_t, int> histogram;
    for (int32_t label : batch.targets) histogram[label]++;
    QCOMPARE(int(histogram.size()), 10);
    QCOMPARE(histogram.begin()->first, 0);
    QCOMPARE(histogram.rbegin()->first, 9);
    for (const auto& [label, count] : histogram) QCOMPARE(count, 1000);

    // One training epoch (60000 samples in batches of 6000) holds each class exactly 6000 times, and the
    // next epoch holds the same images in another order.
    std::map<int32_t, int> trainHistogram;
    std::vector<uint64_t> epoch0, epoch1;
    for (int64_t step = 0; step < 20; ++step) {
      source->trainBatch(step, 6000, 0, 6000, batch);
      for (int b = 0; b < batch.B; ++b) {
        if (step < 10) trainHistogram[batch.targets[size_t(b)]]++;
        uint64_t h = uint64_t(batch.targets[size_t(b)]);
        for (int p = 0; p < 784; ++p)
          h = hashCombine(h, uint64_t(std::lround(batch.images[size_t(b) * 784 + p] * 1000)), p);
        (step < 10 ? epoch0 : epoch1).push_back(h);
      }
    }
    for (const auto& [label, count] : trainHistogram) QCOMPARE(count, 6000);
    QCOMPARE(int(trainHistogram.size()), 10);
    QVERIFY(epoch0 != epoch1);
    std::sort(epoch0.begin(), epoch0.end());
    std::sort(epoch1.begin(), epoch1.end());
    QVERIFY(epoch0 == epoch1);
  }

  void realMnistNormalisation() {
    const DataSource* source = realMnist();
    if (!source) QSKIP("Fashion-MNIST is not installed (Debian: dataset-fashion-mnist)");
    Batch batch;
    source->trainBatch(0, 1000, 0, 1000, batch);
    QCOMPARE(batch.images.size(), size_t(1000 * 784));
    double sum = 0, sumSq = 0;
    for (float v : batch.images) {
      sum += v;
      sumSq += double(v) * v;
    }
    const double n = double(batch.images.size());
    const double mean = sum / n, stddev = std::sqrt(sumSq / n - mean * mean);
    QVERIFY2(std::abs(mean) < 0.1, qPrintable(QString::number(mean)));
    QVERIFY2(std::abs(stddev - 1.0) < 0.1, qPrintable(QString::number(stddev)));
    const auto [lo, hi] = std::minmax_element(batch.images.begin(), batch.images.end());
    QCOMPARE(*lo, (0.0f - kFashionMnistMean) / kFashionMnistStd);
    QCOMPARE(*hi, (1.0f - kFashionMnistMean) / kFashionMnistStd);

    // Splitting a batch that crosses the epoch boundary (samples 56000..62999) changes nothing.
    Batch whole, lo2, hi2;
    source->trainBatch(8, 7000, 0, 7000, whole);
    source->trainBatch(8, 7000, 0, 3500, lo2);
    source->trainBatch(8, 7000, 3500, 3500, hi2);
    QVERIFY(std::equal(lo2.images.begin(), lo2.images.end(), whole.images.begin()));
    QVERIFY(std::equal(hi2.images.begin(), hi2.images.end(), whole.images.begin() + 3500 * 784));
    QVERIFY(std::equal(hi2.targets.begin(), hi2.targets.end(), whole.targets.begin() + 3500));
  }
};

QTEST_APPLESS_MAIN(TestData)
#include "tst_data.moc"
