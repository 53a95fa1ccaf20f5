// Tests of safetensors reading/writing and durable file I/O (engine/runtime/safetensors.h, file_io.h):
// round trips, the on-disk layout, a hand-built file, half-precision conversions, every corruption the reader
// must reject, atomic writes, directory replacement, and interop with PyTorch when it is installed.
#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>

#include "test_util.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/file_io.h"
#include "runtime/safetensors.h"

using namespace ms;
namespace fs = std::filesystem;

namespace {

using ms::test::readBytes;
using ms::test::writeBytes;

std::string le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}

std::string floatBytes(std::initializer_list<float> values) {
  std::string s;
  for (float v : values) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(bits >> (8 * i)));
  }
  return s;
}

// A safetensors file from a header text and data bytes; headerLength overrides the length field.
std::string safetensorsBytes(const std::string& header, const std::string& data, int64_t headerLength = -1) {
  return le64(headerLength >= 0 ? uint64_t(headerLength) : header.size()) + header + data;
}

std::vector<std::string> listDir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

class TestCheckpoint : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir m_tmp;
  std::string path(const std::string& name) const { return (m_tmp.path() + "/").toStdString() + name; }

 private slots:
  void initTestCase() { QVERIFY(m_tmp.isValid()); }

  void roundTripF32I32Metadata() {
    const std::vector<float> w = {0.5f,  -1.25f, 3.0f,  1e-30f, -0.0f, 7.75f,
                                  1e30f, 2.0f,   -3.5f, 0.1f,   0.2f,  0.3f};
    const std::vector<int32_t> ids = {-7, 0, 2147483647};
    const float scalar = 42.5f;
    const std::vector<NamedTensor> tensors = {
        {"wte.weight", {3, 4}, DType::F32, w.data()},
        {"ids", {3}, DType::I32, ids.data()},
        {"scalar", {}, DType::F32, &scalar},
        {"empty", {0, 5}, DType::F32, nullptr},
    };
    const std::map<std::string, std::string> metadata = {
        {"format", "pt"}, {"step", "12"}, {"note", "quote \" ok"}};
    const std::string file = path("round.safetensors");
    Status written = writeSafetensors(file, tensors, metadata);
    QVERIFY2(written.isOk(), written.message().c_str());
    Expected<SafetensorsData> read = readSafetensors(file);
    QVERIFY2(read, read.message().c_str());
    QCOMPARE(read->metadata, metadata);
    QCOMPARE(read->tensors.size(), size_t(4));
    const LoadedTensor* t = read->find("wte.weight");
    QVERIFY(t);
    QCOMPARE(t->shape, (std::vector<int64_t>{3, 4}));
    QCOMPARE(t->storedAs, DType::F32);
    QCOMPARE(t->f32, w);
    QVERIFY(t->i32.empty());
    QVERIFY(std::signbit(t->f32[4]));
    t = read->find("ids");
    QVERIFY(t);
    QCOMPARE(t->storedAs, DType::I32);
    QCOMPARE(t->i32, ids);
    QVERIFY(t->f32.empty());
    t = read->find("scalar");
    QVERIFY(t);
    QVERIFY(t->shape.empty());
    QCOMPARE(t->f32, std::vector<float>{42.5f});
    t = read->find("empty");
    QVERIFY(t);
    QCOMPARE(t->shape, (std::vector<int64_t>{0, 5}));
    QVERIFY(t->f32.empty());
    QVERIFY(read->find("missing") == nullptr);
  }

  void layoutIsAlignedAndPacked() {
    const std::vector<float> a = {1, 2, 3};
    const std::vector<uint16_t> b = {floatToBf16(1.0f)};
    const std::string file = path("layout.safetensors");
    QVERIFY(writeSafetensors(file, {{"z", {3}, DType::F32, a.data()}, {"a", {1}, DType::BF16, b.data()}},
                             {{"k", "v"}})
                .isOk());
    const std::string bytes = readBytes(file);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[size_t(i)])) << (8 * i);
    QCOMPARE(n % 8, uint64_t(0));
    QCOMPARE(bytes.size(), size_t(8 + n + 2 + 12));
    const std::string header = bytes.substr(8, n);
    QCOMPARE(header.front(), '{');
    QVERIFY(header.find_last_not_of(' ') == header.rfind('}'));
    const nlohmann::json j = nlohmann::json::parse(header);
    // Sorted by name, back to back from offset 0.
    QVERIFY(j["a"]["data_offsets"] == nlohmann::json({0, 2}));
    QVERIFY(j["z"]["data_offsets"] == nlohmann::json({2, 14}));
    QVERIFY(j["z"]["dtype"] == "F32");
    QVERIFY(j["z"]["shape"] == nlohmann::json({3}));
    QVERIFY(j["__metadata__"]["k"] == "v");
    QCOMPARE(bytes.substr(8 + n + 2), floatBytes({1, 2, 3}));
  }

  void handBuiltFile() {
    // Built byte by byte, independent of our writer: no padding, keys in arbitrary order.
    const std::string header =
        R"({"b":{"dtype":"I32","shape":[1,1],"data_offsets":[8,12]},)"
        R"("__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    std::string data = floatBytes({1.0f, -2.0f});
    data += std::string("\x07\x00\x00\x00", 4);
    const std::string file = path("hand.safetensors");
    writeBytes(file, safetensorsBytes(header, data));
    Expected<SafetensorsData> read = readSafetensors(file);
    QVERIFY2(read, read.message().c_str());
    QCOMPARE(read->find("a")->f32, (std::vector<float>{1.0f, -2.0f}));
    QCOMPARE(read->find("b")->i32, std::vector<int32_t>{7});
    QCOMPARE(read->find("b")->shape, (std::vector<int64_t>{1, 1}));
    QCOMPARE(read->metadata.at("format"), std::string("pt"));
  }

  void halfPrecisionConversion() {
    QCOMPARE(floatToBf16(1.0f), uint16_t(0x3f80));
    QCOMPARE(floatToBf16(-2.5f), uint16_t(0xc020));
    QCOMPARE(floatToBf16(0.1f), uint16_t(0x3dcd));
    QCOMPARE(floatToF16(1.0f), uint16_t(0x3c00));
    QCOMPARE(floatToF16(-2.5f), uint16_t(0xc100));
    QCOMPARE(floatToF16(0.1f), uint16_t(0x2e66));
    QCOMPARE(floatToF16(65504.0f), uint16_t(0x7bff));
    QCOMPARE(floatToF16(65520.0f), uint16_t(0x7c00));                      // rounds to infinity
    QCOMPARE(floatToF16(std::ldexp(1.0f, -24)), uint16_t(0x0001));         // smallest subnormal
    QCOMPARE(floatToF16(std::ldexp(1.0f, -26)), uint16_t(0x0000));         // below half of it: zero
    QCOMPARE(floatToF16(1.0f + std::ldexp(1.0f, -11)), uint16_t(0x3c00));  // tie to even (down)
    QVERIFY(std::isnan(f16ToFloat(floatToF16(NAN))));
    QVERIFY(std::isnan(bf16ToFloat(floatToBf16(NAN))));
    // Every finite half and bfloat16 survives float and back.
    for (uint32_t bits = 0; bits < 0x10000; ++bits) {
      const auto h = uint16_t(bits);
      if ((h & 0x7c00) != 0x7c00 || (h & 0x3ff) == 0) QCOMPARE(floatToF16(f16ToFloat(h)), h);
      if ((h & 0x7f80) != 0x7f80 || (h & 0x7f) == 0) QCOMPARE(floatToBf16(bf16ToFloat(h)), h);
    }

    const std::vector<float> values = {1.0f, -2.5f, 0.1f};
    std::vector<uint16_t> bf16, f16;
    for (float v : values) {
      bf16.push_back(floatToBf16(v));
      f16.push_back(floatToF16(v));
    }
    const std::string file = path("half.safetensors");
    QVERIFY(
        writeSafetensors(file, {{"bf", {3}, DType::BF16, bf16.data()}, {"hf", {3}, DType::F16, f16.data()}})
            .isOk());
    Expected<SafetensorsData> read = readSafetensors(file);
    QVERIFY2(read, read.message().c_str());
    for (const char* name : {"bf", "hf"}) {
      const LoadedTensor* t = read->find(name);
      QVERIFY(t);
      QCOMPARE(t->storedAs, std::string(name) == "bf" ? DType::BF16 : DType::F16);
      QCOMPARE(t->f32.size(), size_t(3));
      QCOMPARE(t->f32[0], 1.0f);
      QCOMPARE(t->f32[1], -2.5f);
      QVERIFY(std::abs(t->f32[2] - 0.1f) < 0.1f * (std::string(name) == "bf" ? 1.0f / 256 : 1.0f / 2048));
      QVERIFY(t->f32[2] != 0.1f);
    }
  }

  void corruptFiles_data() {
    QTest::addColumn<QByteArray>("bytes");
    QTest::addColumn<QString>("reason");
    const std::string eight = floatBytes({1.0f, 2.0f});
    auto row = [](const char* name, const std::string& bytes, const char* reason) {
      QTest::newRow(name) << QByteArray(bytes.data(), qsizetype(bytes.size())) << QString(reason);
    };
    row("too short", "abc", "too short for a safetensors file (3 bytes");
    row("header length beyond file", safetensorsBytes("{}", eight, 1000),
        "header length 1000 goes beyond the end of the file (18 bytes)");
    row("bad JSON", safetensorsBytes("{\"x\": {", eight), "header is not valid JSON");
    row("not an object", safetensorsBytes("[1,2]", ""), "header is not a JSON object");
    row("nested too deep",
        safetensorsBytes("{\"x\":" + std::string(100000, '[') + std::string(100000, ']') + "}", ""),
        "the safetensors header nests deeper than 8 levels");
    row("unknown dtype", safetensorsBytes(R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", eight),
        "tensor 'x': unsupported dtype 'F64'");
    row("missing shape", safetensorsBytes(R"({"x":{"dtype":"F32","data_offsets":[0,8]}})", eight),
        "tensor 'x': missing \"shape\" array");
    row("negative dim", safetensorsBytes(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
        "tensor 'x': shape [-2] is not a list of sizes");
    row("offsets out of range",
        safetensorsBytes(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight),
        "tensor 'x': data_offsets [0, 16] lie outside the data section of 8 bytes");
    row("offsets reversed",
        safetensorsBytes(R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", eight),
        "tensor 'x': data_offsets [8, 0] end before they begin");
    row("size mismatch", safetensorsBytes(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
        "tensor 'x': shape [3] of F32 needs 12 bytes but data_offsets span 8");
    row("overlapping",
        safetensorsBytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}})",
                         eight),
        "tensors 'a' and 'b' overlap");
    row("metadata not strings", safetensorsBytes(R"({"__metadata__":{"k":1}})", ""),
        "metadata value of 'k' is not a string");
  }

  void corruptFiles() {
    QFETCH(QByteArray, bytes);
    QFETCH(QString, reason);
    const std::string file = path(std::string("corrupt_") + QTest::currentDataTag() + ".safetensors");
    writeBytes(file, bytes.toStdString());
    Expected<SafetensorsData> read = readSafetensors(file);
    QVERIFY(!read);
    const QString message = QString::fromStdString(read.message());
    QVERIFY2(message.startsWith(QString::fromStdString(file) + ": "), qPrintable(message));
    QVERIFY2(message.contains(reason), qPrintable("no '" + reason + "' in: " + message));
  }

  void missingFileAndWriterErrors() {
    Expected<SafetensorsData> read = readSafetensors(path("nope.safetensors"));
    QVERIFY(!read);
    QVERIFY2(read.message().find(path("nope.safetensors") + ": cannot open") != std::string::npos,
             read.message().c_str());
    const float x = 1;
    Status s =
        writeSafetensors(path("dup.safetensors"), {{"a", {1}, DType::F32, &x}, {"a", {1}, DType::F32, &x}});
    QVERIFY(!s.isOk());
    QVERIFY2(s.message().find("dup.safetensors: tensor 'a' given twice") != std::string::npos,
             s.message().c_str());
    s = writeSafetensors(path("neg.safetensors"), {{"a", {-1}, DType::F32, &x}});
    QVERIFY2(s.message().find("neg.safetensors: tensor 'a' has an invalid shape [-1]") != std::string::npos,
             s.message().c_str());
    QVERIFY(!fs::exists(path("dup.safetensors")) && !fs::exists(path("dup.safetensors.tmp")));
    s = writeSafetensors(path("no_such_dir/x.safetensors"), {{"a", {1}, DType::F32, &x}});
    QVERIFY2(s.message().find("no_such_dir/x.safetensors.tmp: cannot create") != std::string::npos,
             s.message().c_str());
  }

  void writeFileAtomicReplaces() {
    const std::string dir = path("atomic");
    QVERIFY(makeDirs(dir + "/deeper/still").isOk());
    QVERIFY(makeDirs(dir + "/deeper/still").isOk());  // existing: fine
    const std::string file = dir + "/deeper/still/state.json";
    QVERIFY(writeFileAtomic(file, "first version, longer than the second").isOk());
    QVERIFY(writeFileAtomic(file, "second").isOk());
    Expected<std::string> content = readFile(file);
    QVERIFY(content);
    QCOMPARE(*content, std::string("second"));
    QCOMPARE(listDir(dir + "/deeper/still"), std::vector<std::string>{"state.json"});
    QVERIFY(writeFileAtomic(file, "").isOk());
    QCOMPARE(*readFile(file), std::string());

    Expected<std::string> missing = readFile(dir + "/absent.txt");
    QVERIFY(!missing);
    QVERIFY2(missing.message().find(dir + "/absent.txt: cannot open") != std::string::npos,
             missing.message().c_str());
    Status notDir = makeDirs(file + "/sub");
    QVERIFY(!notDir.isOk());
    QVERIFY2(notDir.message().find(file + "/sub") != std::string::npos, notDir.message().c_str());
  }

  void replaceDirectoryCases() {
    const std::string dir = path("ckpt/latest");
    const std::string staging = path("ckpt/staging");
    // dir does not exist yet
    QVERIFY(makeDirs(staging).isOk());
    QVERIFY(writeFileAtomic(staging + "/model.safetensors", "v1").isOk());
    Status s = replaceDirectory(staging, dir);
    QVERIFY2(s.isOk(), s.message().c_str());
    QCOMPARE(*readFile(dir + "/model.safetensors"), std::string("v1"));
    QCOMPARE(listDir(path("ckpt")), std::vector<std::string>{"latest"});

    // dir exists: replaced completely (a file only the old one had disappears)
    QVERIFY(writeFileAtomic(dir + "/only_in_old", "x").isOk());
    QVERIFY(makeDirs(staging + "/sub").isOk());
    QVERIFY(writeFileAtomic(staging + "/model.safetensors", "v2").isOk());
    QVERIFY(writeFileAtomic(staging + "/sub/opt.safetensors", "o2").isOk());
    s = replaceDirectory(staging, dir);
    QVERIFY2(s.isOk(), s.message().c_str());
    QCOMPARE(listDir(dir), (std::vector<std::string>{"model.safetensors", "sub"}));
    QCOMPARE(*readFile(dir + "/sub/opt.safetensors"), std::string("o2"));
    QCOMPARE(listDir(path("ckpt")), std::vector<std::string>{"latest"});

    // A crash between the two renames left only latest.old: it is restored, then replaced.
    fs::rename(dir, dir + ".old");
    QVERIFY(makeDirs(staging).isOk());
    QVERIFY(writeFileAtomic(staging + "/model.safetensors", "v3").isOk());
    QVERIFY(replaceDirectory(staging, dir).isOk());
    QCOMPARE(*readFile(dir + "/model.safetensors"), std::string("v3"));
    QCOMPARE(listDir(path("ckpt")), std::vector<std::string>{"latest"});

    // A crash during the final removal left a stale latest.old beside latest: dropped.
    QVERIFY(makeDirs(dir + ".old/junk").isOk());
    QVERIFY(makeDirs(staging).isOk());
    QVERIFY(writeFileAtomic(staging + "/model.safetensors", "v4").isOk());
    QVERIFY(replaceDirectory(staging, dir).isOk());
    QCOMPARE(*readFile(dir + "/model.safetensors"), std::string("v4"));
    QCOMPARE(listDir(path("ckpt")), std::vector<std::string>{"latest"});

    s = replaceDirectory(path("ckpt/no_staging"), dir);
    QVERIFY(!s.isOk());
    QVERIFY2(s.message().find("no_staging") != std::string::npos, s.message().c_str());
    QCOMPARE(*readFile(dir + "/model.safetensors"), std::string("v4"));
  }

  void pythonTorchReadsOurFile() {
    QProcess probe;
    probe.start(MS_PYTHON, {"-c", "import torch"});
    if (!probe.waitForFinished(60000) || probe.exitStatus() != QProcess::NormalExit ||
        probe.exitCode() != 0) {
      QSKIP("python3 with torch is not available");
    }
    const std::vector<float> w = {0.5f, -1.5f, 2.25f, 3.0f, -4.0f, 1e-3f};
    const std::vector<int32_t> ids = {3, -1, 50256};
    const std::vector<uint16_t> bf = {floatToBf16(1.0f), floatToBf16(-2.5f), floatToBf16(0.1f)};
    const std::vector<uint16_t> hf = {floatToF16(1.0f), floatToF16(-2.5f), floatToF16(0.1f)};
    const std::string file = path("interop.safetensors");
    QVERIFY(writeSafetensors(file,
                             {{"h.0.attn.c_attn.weight", {2, 3}, DType::F32, w.data()},
                              {"ids", {3}, DType::I32, ids.data()},
                              {"bf", {3, 1}, DType::BF16, bf.data()},
                              {"hf", {3}, DType::F16, hf.data()}},
                             {{"format", "pt"}})
                .isOk());
    // Only json, struct and torch.frombuffer: Debian's torch has no safetensors package.
    const char* script = R"PY(
import json, struct, sys, torch
raw = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
assert n % 8 == 0
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
types = {'F32': torch.float32, 'I32': torch.int32, 'BF16': torch.bfloat16, 'F16': torch.float16}
out = {'__metadata__': header.pop('__metadata__', {})}
for name, info in header.items():
    b, e = info['data_offsets']
    t = torch.frombuffer(bytearray(data[b:e]), dtype=types[info['dtype']]).reshape(info['shape'])
    out[name] = {'shape': list(t.shape), 'values': t.double().flatten().tolist()}
print(json.dumps(out))
)PY";
    QProcess python;
    python.start(MS_PYTHON, {"-c", script, QString::fromStdString(file)});
    QVERIFY(python.waitForFinished(120000));
    QVERIFY2(python.exitCode() == 0, python.readAllStandardError().constData());
    const nlohmann::json out = nlohmann::json::parse(python.readAllStandardOutput().toStdString());
    QVERIFY(out["__metadata__"]["format"] == "pt");
    const nlohmann::json& wj = out["h.0.attn.c_attn.weight"];
    QVERIFY(wj["shape"] == nlohmann::json({2, 3}));
    for (size_t i = 0; i < w.size(); ++i) QCOMPARE(wj["values"][i].get<double>(), double(w[i]));
    QVERIFY(out["ids"]["values"] == nlohmann::json({3, -1, 50256}));
    QVERIFY(out["bf"]["shape"] == nlohmann::json({3, 1}));
    QCOMPARE(out["bf"]["values"][1].get<double>(), -2.5);
    QCOMPARE(out["bf"]["values"][2].get<double>(), double(bf16ToFloat(floatToBf16(0.1f))));
    QCOMPARE(out["hf"]["values"][0].get<double>(), 1.0);
    QCOMPARE(out["hf"]["values"][2].get<double>(), double(f16ToFloat(floatToF16(0.1f))));
  }
};

QTEST_APPLESS_MAIN(TestCheckpoint)
#include "tst_checkpoint.moc"
