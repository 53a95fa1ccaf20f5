// Tests of the run config: every broken file in tests/data/broken is refused with the path and reason listed
// in expected.txt; valid configs (built here and resources/examples/*.json) load; defaults are the ones
// run_config.h documents; toJson/parse and save/load give back equal configs; did-you-mean suggestions and
// multiple errors are reported; resources/run-config.schema.json and docs/config.md match the field table.
//
// The two generated files are rewritten from the code when the test runs with MS_UPDATE_GOLDEN=1
// (docs/config.md keeps everything above its "generated" marker line).
#include <QDir>
#include <QFile>
#include <QTemporaryDir>
#include <QtTest>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "plan/run_config.h"

using nlohmann::json;

namespace {

const char* const kMarkdownMarker = "<!-- generated: runConfigMarkdown() -->";

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void writeText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string describe(const ms::ConfigErrors& errors) {
  return ms::formatConfigErrors(errors, "config");
}

bool hasError(const ms::ConfigErrors& errors, const std::string& path, const std::string& substring) {
  for (const auto& e : errors)
    if (e.path == path && e.message.find(substring) != std::string::npos) return true;
  return false;
}

// The example of the brief: gpt on text, a few fields set.
json gptText() {
  json doc = json::parse(R"({"version":1,"name":"gpt-fortunes","seed":1,
    "model":{"type":"gpt","layers":4,"width":128,"heads":4,"vocab":256,"context":128},
    "data":{"kind":"text","val_fraction":0.05},
    "optimizer":{"type":"adamw","lr":0.001,"betas":[0.9,0.95],"weight_decay":0.1},
    "training":{"steps":500,"batch_size":16,"seq_len":128,"warmup_steps":20,"eval_every":100}})");
  // Not inside the raw string: moc reads a slash followed by a star there as the start of a comment.
  doc["data"]["files"] =
      json::array({"/usr/share/games/fortunes/"
                   "*.u8"});
  return doc;
}

// Every field set to something other than its default: gpt on token shards, 3D parallel, interleaved.
json gptTokensEverything() {
  return json::parse(R"({"version":1,"name":"full.run-1","seed":18446744073709551615,"device":"cuda",
    "model":{"type":"gpt","layers":6,"width":192,"heads":6,"mlp_ratio":2,"layer_norm_eps":1e-6,"vocab":50304,
             "context":1024,"tie_embeddings":false,"init_std":0.015},
    "data":{"kind":"tokens","train":["a_*.bin","b.bin"],"val":"val.bin"},
    "mesh":{"nodes":[{"name":"a","device":"h100-sxm-80gb","count":8},{"name":"b","device":"h200-141gb","count":4},
                     {"name":"c","device":"npu-1","count":2}],
            "intra_link":"nvlink","inter_link":"ib-2x",
            "device_types":[{"name":"npu-1","label":"An NPU","peak_tflops_fp32":40.5,"peak_tflops_bf16":320,
                             "memory_gb":64,"memory_bandwidth_gbs":1800,"achievable_fraction":0.45,
                             "host_link_gbs":32,"host_memory_gb":128,"host_memory_bandwidth_gbs":40}],
            "link_types":[{"name":"ib-2x","bandwidth_gbs":100,"latency_us":4.5}]},
    "parallel":{"dp":2,"tp":2,"pp":2,"schedule":"interleaved_1f1b","microbatches":4,"virtual_chunks":2,"zero":2,
                "recompute":"full","recompute_layers":1,"precision":"bf16","sequence_parallel":true,
                "offload":"optimizer","overlap_param_gather":true,
                "placement":[{"stage":0,"layers":["embedding","block.0"]},{"stage":1,"layers":["block.1","block.2"]},
                             {"stage":0,"layers":["block.3","block.4"]},{"stage":1,"layers":["block.5","head"]}]},
    "optimizer":{"type":"sgd","lr":0.1,"betas":[0.8,0.99],"eps":1e-6,"weight_decay":0.01,"momentum":0.5,
                 "nesterov":true},
    "training":{"steps":1000,"batch_size":64,"seq_len":512,"warmup_steps":100,"lr_schedule":"linear",
                "min_lr_ratio":0.0,"grad_clip":0.5,"eval_every":50,"eval_batches":10,"checkpoint_every":200,
                "log_every":10,"run_dir":"runs/custom","threads":4,"head_chunk_rows":320,"comm_timeout_s":90}})");
}

json vitMnist() {
  return json::parse(R"({"name":"vit","device":"cpu",
    "model":{"type":"vit","layers":3,"width":96,"heads":3,"mlp_ratio":2,"image_size":28,"patch":4,"pool":"mean",
             "classes":10,"init_std":0.01,"layer_norm_eps":1e-6},
    "data":{"kind":"fashion_mnist","dir":"mnist"},
    "mesh":{"nodes":[{"name":"n","device":"cpu","count":4}]},
    "parallel":{"dp":2,"pp":2,"schedule":"gpipe","microbatches":2},
    "training":{"batch_size":64,"lr_schedule":"constant"}})");
}

json mlpMnist() {
  return json::parse(R"({"name":"mlp",
    "model":{"type":"mlp","hidden":[512,256,128],"activation":"gelu","classes":10},
    "data":{"kind":"fashion_mnist"},
    "mesh":{"nodes":[{"name":"n","device":"rtx4090","count":2}],"intra_link":"pcie"},
    "parallel":{"tp":2,"zero":1},
    "optimizer":{"type":"sgd","momentum":0.9,"nesterov":true},
    "training":{"batch_size":32,"steps":0}})");
}

json cnnMnist() {
  return json::parse(R"({"name":"cnn",
    "model":{"type":"cnn","channels":[16,32,64],"blocks":2,"bn_momentum":0.1,"classes":10},
    "data":{"kind":"fashion_mnist"},
    "mesh":{"nodes":[{"name":"n","device":"cpu","count":4}]},
    "parallel":{"dp":2,"pp":2,"batchnorm":"sync","schedule":"gpipe","microbatches":2},
    "optimizer":{"type":"sgd","momentum":0.9},
    "training":{"batch_size":64,"steps":0}})");
}

// gptText() as a typed config, for the checks the studio runs on the struct.
ms::RunConfig typedGpt() {
  auto c = ms::parseRunConfig(gptText());
  return *c;
}

struct TypedCase {
  const char* name;
  std::function<void(ms::RunConfig&)> change;
  const char* path;
  const char* substring;
};

// The typed gpt made a llama (for the llama cases): 4 heads of 32, 2 key/value heads.
ms::RunConfig& asLlama(ms::RunConfig& c) {
  c.model.type = ms::ModelType::Llama;
  c.model.kvHeads = 2;
  return c;
}

// The typed gpt made a cnn on Fashion-MNIST (for the cnn cases).
ms::RunConfig& asCnn(ms::RunConfig& c) {
  c.model.type = ms::ModelType::Cnn;
  c.data.kind = ms::DataKind::FashionMnist;
  return c;
}

std::vector<TypedCase> typedCases() {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  return {
      {"layers 0", [](auto& c) { c.model.layers = 0; }, "/model/layers", "must be >= 1, got 0"},
      {"heads 3", [](auto& c) { c.model.heads = 3; }, "/model/heads", "heads (3) must divide width (128)"},
      {"lr nan", [=](auto& c) { c.optimizer.lr = nan; }, "/optimizer/lr", "must be > 0, got nan"},
      {"lr inf", [=](auto& c) { c.optimizer.lr = inf; }, "/optimizer/lr", "must be > 0, got inf"},
      {"eps 0", [](auto& c) { c.optimizer.eps = 0; }, "/optimizer/eps", "must be > 0"},
      {"beta2 1", [](auto& c) { c.optimizer.beta2 = 1.0; }, "/optimizer/betas/1", "must be in [0, 1)"},
      {"min_lr_ratio 1.5", [](auto& c) { c.training.minLrRatio = 1.5; }, "/training/min_lr_ratio",
       "must be in [0, 1], got 1.5"},
      {"zero -1", [](auto& c) { c.parallel.zero = -1; }, "/parallel/zero", "must be in 0 .. 3, got -1"},
      {"cnn tp 2", [](auto& c) { asCnn(c).parallel.tp = 2; }, "/parallel/tp",
       "a cnn model has no tensor-parallel layers, so tp must be 1, got 2"},
      {"cnn no stages", [](auto& c) { asCnn(c).model.channels = {}; }, "/model/channels",
       "a cnn needs at least one stage"},
      {"cnn channel 0",
       [](auto& c) {
         asCnn(c).model.channels = {16, 0};
       },
       "/model/channels/1", "must be >= 1, got 0"},
      {"cnn blocks 0", [](auto& c) { asCnn(c).model.blocks = 0; }, "/model/blocks", "must be >= 1, got 0"},
      {"cnn image 32", [](auto& c) { asCnn(c).model.imageSize = 32; }, "/model/image_size",
       "fashion_mnist images are 28x28, so image_size must be 28, got 32"},
      {"cnn selective", [](auto& c) { asCnn(c).parallel.recompute = ms::Recompute::Selective; },
       "/parallel/recompute", "a cnn model has no attention"},
      {"cnn bn momentum 1", [](auto& c) { asCnn(c).model.bnMomentum = 1.0; }, "/model/bn_momentum",
       "must be in (0, 1), got 1"},
      {"cnn text data", [](auto& c) { c.model.type = ms::ModelType::Cnn; }, "/data/kind",
       "model type \"cnn\" needs data kind \"fashion_mnist\", got \"text\""},
      {"cnn full recompute", [](auto& c) { asCnn(c).parallel.recompute = ms::Recompute::Full; },
       "/parallel/recompute", "updating its running statistics twice"},
      {"gpt sync batchnorm", [](auto& c) { c.parallel.batchNorm = ms::BatchNormMode::Sync; },
       "/parallel/batchnorm", "only a cnn model has BatchNorm"},
      {"collective servers 2", [](auto& c) { c.parallel.servers = 2; }, "/parallel/servers",
       "need \"mode\": \"parameter_server\""},
      {"ps dp 2",
       [](auto& c) {
         c.parallel.mode = ms::ParallelMode::ParameterServer;
         c.parallel.dp = 2;
       },
       "/parallel/dp", "the workers are the replicas"},
      {"ps batch over workers",
       [](auto& c) {
         c.parallel.mode = ms::ParallelMode::ParameterServer;
         c.parallel.workers = 3;
       },
       "/training/batch_size", "divisible by workers * microbatches = 3"},
      {"ps clip over servers",
       [](auto& c) {
         c.parallel.mode = ms::ParallelMode::ParameterServer;
         c.parallel.servers = 2;
         c.training.gradClip = 1;
       },
       "/training/grad_clip", "no server knows the global gradient norm"},
      {"ps straggler slowdown",
       [](auto& c) {
         c.parallel.mode = ms::ParallelMode::ParameterServer;
         c.parallel.stragglers = {{0, 0.5}};
       },
       "/parallel/stragglers/0/slowdown", "must be >= 1, got 0.5"},
      {"ps server nodes count",
       [](auto& c) {
         c.parallel.mode = ms::ParallelMode::ParameterServer;
         c.parallel.servers = 2;
         c.training.gradClip = 0;
         c.parallel.serverNodes = {c.mesh.nodes[0].name};
       },
       "/parallel/server_nodes", "names 1 node(s) for 2 servers"},
      {"ps server node unknown",
       [](auto& c) {
         c.parallel.mode = ms::ParallelMode::ParameterServer;
         c.parallel.serverNodes = {"nowhere"};
       },
       "/parallel/server_nodes/0", "\"nowhere\" is not a node of the mesh"},
      {"ps zero 1",
       [](auto& c) {
         c.parallel.mode = ms::ParallelMode::ParameterServer;
         c.parallel.zero = 1;
       },
       "/parallel/zero", "zero must be 0"},
      {"version 2", [](auto& c) { c.version = 2; }, "/version", "must be 1, got 2"},
      {"empty name", [](auto& c) { c.name = ""; }, "/name", "must not be empty"},
      {"empty file", [](auto& c) { c.data.files = {""}; }, "/data/files/0", "must not be empty"},
      {"device tpu", [](auto& c) { c.mesh.nodes[0].device = "tpu"; }, "/mesh/nodes/0/device",
       "\"tpu\" is not one of"},
      {"link bogus", [](auto& c) { c.mesh.intraLink = "bogus"; }, "/mesh/intra_link", "is not one of"},
      {"own device shadows",
       [](auto& c) {
         c.mesh.deviceTypes = {{"cpu", "", 1, 1, 1, 1}};
       },
       "/mesh/device_types/0/name", "device type \"cpu\" is already in the hardware catalog"},
      {"own device bad fraction",
       [](auto& c) {
         c.mesh.deviceTypes = {{"npu", "", 1, 1, 1, 1, 0}};
       },
       "/mesh/device_types/0/achievable_fraction", "must be in (0, 1], got 0"},
      {"own link negative latency",
       [](auto& c) {
         c.mesh.linkTypes = {{"l", 1, -2}};
       },
       "/mesh/link_types/0/latency_us", "must be >= 0, got -2"},
      {"own device named by a node",
       [](auto& c) {
         c.mesh.deviceTypes = {{"npu", "", 1, 1, 1, 1}};
         c.mesh.nodes[0].device = "npv";
       },
       "/mesh/nodes/0/device", "did you mean \"npu\"?"},
      {"no nodes", [](auto& c) { c.mesh.nodes.clear(); }, "/mesh/nodes", "needs at least 1 entry"},
      {"no devices", [](auto& c) { c.mesh.nodes.clear(); }, "/parallel",
       "= 1 rank, but the mesh has only 0 devices"},
      {"vocab 300 on text", [](auto& c) { c.model.vocab = 300; }, "/model/vocab", "vocab must be 256"},
      {"tp 8 vocab",
       [](auto& c) {
         c.parallel.tp = 8;
         c.model.vocab = 300;
         c.model.heads = 8;
         c.mesh.nodes[0].count = 8;
       },
       "/parallel/tp", "tp (8) must divide model.vocab (300)"},
      {"llama kv_heads 3", [](auto& c) { asLlama(c).model.kvHeads = 3; }, "/model/kv_heads",
       "kv_heads (3) must divide heads (4)"},
      {"llama tp 4 over 2 kv heads",
       [](auto& c) {
         asLlama(c).parallel.tp = 4;
         c.mesh.nodes[0].count = 4;
       },
       "/parallel/tp", "tp (4) must divide the key/value heads (kv_heads: 2)"},
      {"llama odd head size",
       [](auto& c) {
         asLlama(c).model.width = 20;
         c.model.kvHeads = 4;
       },
       "/model/heads", "the head size width / heads (5) must be even"},
      {"llama tp 3 ffn",
       [](auto& c) {
         asLlama(c).model.heads = 6;
         c.model.width = 96;
         c.model.kvHeads = 3;
         c.model.ffnHidden = 100;
         c.parallel.tp = 3;
         c.model.vocab = 256;
         c.mesh.nodes[0].count = 3;
       },
       "/parallel/tp", "tp (3) must divide the MLP hidden width (ffn_hidden: 100)"},
      {"llama on fashion_mnist", [](auto& c) { asLlama(c).data.kind = ms::DataKind::FashionMnist; },
       "/data/kind", "model type \"llama\" needs data kind \"text\" or \"tokens\""},
      {"llama top-k over experts",
       [](auto& c) {
         asLlama(c).model.experts = 2;
         c.model.expertsPerToken = 3;
       },
       "/model/experts_per_token", "experts_per_token (3) must be at most experts (2)"},
      {"llama tp over the experts' width",
       [](auto& c) {
         asLlama(c).model.experts = 4;
         c.model.expertFfnHidden = 65;
         c.parallel.tp = 2;
         c.mesh.nodes[0].count = 2;
       },
       "/parallel/tp", "tp (2) must divide the experts' hidden width (65)"},
      {"ep without experts",
       [](auto& c) {
         asLlama(c).parallel.dp = 2;
         c.parallel.ep = 2;
         c.mesh.nodes[0].count = 2;
       },
       "/parallel/ep", "ep (2) splits a mixture of experts, but model.experts is 0"},
      {"ep not dividing the experts",
       [](auto& c) {
         asLlama(c).model.experts = 6;
         c.parallel.dp = 4;
         c.parallel.ep = 4;
         c.mesh.nodes[0].count = 4;
       },
       "/parallel/ep", "ep (4) must divide model.experts (6)"},
      {"ep not dividing dp",
       [](auto& c) {
         asLlama(c).model.experts = 4;
         c.parallel.dp = 3;
         c.parallel.ep = 2;
         c.mesh.nodes[0].count = 3;
         c.training.batchSize = 12;
       },
       "/parallel/ep", "ep (2) must divide dp (3)"},
      {"ep on a gpt",
       [](auto& c) {
         c.parallel.dp = 2;
         c.parallel.ep = 2;
         c.mesh.nodes[0].count = 2;
       },
       "/parallel/ep", "ep (2) splits mixture-of-experts blocks, which only llama models have"},
      {"cp on a vit",
       [](auto& c) {
         c.model.type = ms::ModelType::Vit;
         c.parallel.cp = 2;
         c.mesh.nodes[0].count = 2;
       },
       "/parallel/cp", "cp (2) splits the sequence of a language model (gpt or llama"},
      {"cp not dividing the sequence",
       [](auto& c) {
         asLlama(c).parallel.cp = 3;
         c.mesh.nodes[0].count = 3;
       },
       "/training/seq_len", "seq_len (128) must be divisible by 2 * cp = 6"},
      {"ep not dividing dp * cp",
       [](auto& c) {
         asLlama(c).model.experts = 8;
         c.parallel.ep = 8;
         c.parallel.dp = 2;
         c.parallel.cp = 2;
         c.mesh.nodes[0].count = 4;
       },
       "/parallel/ep", "ep (8) must divide dp * cp (4)"},
      {"cp over the mesh",
       [](auto& c) {
         asLlama(c).parallel.cp = 2;
         c.mesh.nodes[0].count = 1;
       },
       "/parallel", "dp * cp * tp * pp = 2 ranks, but the mesh has only 1 device"},
      {"zb_h1 chunks",
       [](auto& c) {
         c.parallel.schedule = ms::Schedule::ZbH1;
         c.parallel.virtualChunks = 2;
       },
       "/parallel/virtual_chunks", "virtual_chunks must be 1 with schedule \"zb_h1\""},
      {"interleaved pp 1",
       [](auto& c) {
         c.parallel.schedule = ms::Schedule::Interleaved1F1B;
         c.parallel.virtualChunks = 2;
       },
       "/parallel/pp", "needs pp >= 2, got 1"},
  };
}

}  // namespace

class TestConfig : public QObject {
  Q_OBJECT

 private slots:
  void brokenFiles_data() {
    QTest::addColumn<QString>("file");
    QTest::addColumn<QString>("path");
    QTest::addColumn<QString>("substring");
    std::istringstream lines(readText(MS_TEST_DATA_DIR "/broken/expected.txt"));
    std::string line;
    int rows = 0;
    while (std::getline(lines, line)) {
      if (line.empty() || line[0] == '#') continue;
      const QStringList parts = QString::fromStdString(line).split('\t');
      QCOMPARE(parts.size(), 3);
      QTest::newRow(qPrintable(parts[0])) << parts[0] << (parts[1] == "-" ? QString() : parts[1]) << parts[2];
      ++rows;
    }
    QVERIFY(rows >= 20);
  }

  void brokenFiles() {
    QFETCH(QString, file);
    QFETCH(QString, path);
    QFETCH(QString, substring);
    const std::string full = std::string(MS_TEST_DATA_DIR "/broken/") + file.toStdString();
    ms::ConfigErrors errors;
    const auto result = ms::loadRunConfig(full, &errors);
    QVERIFY(!result.isOk());
    QVERIFY2(hasError(errors, path.toStdString(), substring.toStdString()), describe(errors).c_str());
    QCOMPARE(result.message(), ms::formatConfigErrors(errors, full));
    for (const QString& l : QString::fromStdString(result.message()).split('\n'))
      QVERIFY2(l.startsWith(QString::fromStdString(full + ": ")), qPrintable(l));
  }

  void everyBrokenFileIsListed() {
    const std::string expected = readText(MS_TEST_DATA_DIR "/broken/expected.txt");
    const QStringList files = QDir(MS_TEST_DATA_DIR "/broken").entryList({"*.json"}, QDir::Files);
    QVERIFY(files.size() >= 20);
    for (const QString& f : files) {
      std::string line = "\n";  // appended, not "\n" + s: GCC 12 gives a false -Wrestrict for the latter
      line += f.toStdString();
      line += '\t';
      QVERIFY2(expected.find(line) != std::string::npos, qPrintable(f));
    }
  }

  void validConfigs_data() {
    QTest::addColumn<QByteArray>("document");
    QTest::addColumn<QString>("file");
    QTest::newRow("gpt text") << QByteArray::fromStdString(gptText().dump()) << QString();
    QTest::newRow("gpt tokens everything")
        << QByteArray::fromStdString(gptTokensEverything().dump()) << QString();
    QTest::newRow("vit") << QByteArray::fromStdString(vitMnist().dump()) << QString();
    QTest::newRow("mlp") << QByteArray::fromStdString(mlpMnist().dump()) << QString();
    QTest::newRow("cnn") << QByteArray::fromStdString(cnnMnist().dump()) << QString();
    json llama = gptText();
    llama["model"] = {
        {"type", "llama"}, {"layers", 2},       {"width", 64},  {"heads", 4},     {"kv_heads", 1},
        {"ffn_hidden", 0}, {"rope_theta", 5e5}, {"vocab", 256}, {"context", 128}, {"tie_embeddings", false}};
    QTest::newRow("llama") << QByteArray::fromStdString(llama.dump()) << QString();
    const QDir examples(MS_SOURCE_DIR "/resources/examples");
    for (const QString& f : examples.entryList({"*.json"}, QDir::Files))
      QTest::newRow(qPrintable("example " + f)) << QByteArray() << examples.absoluteFilePath(f);
  }

  void validConfigs() {
    QFETCH(QByteArray, document);
    QFETCH(QString, file);
    ms::ConfigErrors errors{{"/stale", "left from before"}};
    const auto config = file.isEmpty() ? ms::parseRunConfig(json::parse(document.toStdString()), &errors)
                                       : ms::loadRunConfig(file.toStdString(), &errors);
    QVERIFY2(config.isOk(), config.message().c_str());
    QVERIFY(errors.empty());
    QVERIFY2(ms::validateRunConfig(*config).empty(), describe(ms::validateRunConfig(*config)).c_str());
  }

  void defaults() {
    const auto c =
        ms::parseRunConfig(json::parse(R"({"model":{"type":"gpt"},"data":{"kind":"text","files":"a"}})"));
    QVERIFY2(c.isOk(), c.message().c_str());
    QCOMPARE(c->version, 1);
    QCOMPARE(c->name, std::string("run"));
    QCOMPARE(c->seed, 1ull);
    QCOMPARE(c->device, ms::DeviceChoice::Auto);
    QCOMPARE(c->model.layers, 4);
    QCOMPARE(c->model.width, 256);
    QCOMPARE(c->model.heads, 4);
    QCOMPARE(c->model.mlpRatio, 4);
    QCOMPARE(c->model.layerNormEps, 1e-5);
    QCOMPARE(c->model.vocab, 256);
    QCOMPARE(c->model.context, 128);
    QCOMPARE(c->model.tieEmbeddings, true);
    QCOMPARE(c->model.initStd, 0.02);
    QCOMPARE(c->data.files, std::vector<std::string>{"a"});
    QCOMPARE(c->data.valFraction, 0.1);
    QCOMPARE(c->mesh.nodes.size(), size_t(1));
    QCOMPARE(c->mesh.nodes[0].name, std::string("node0"));
    QCOMPARE(c->mesh.nodes[0].device, std::string("cpu"));
    QCOMPARE(c->mesh.nodes[0].count, 1);
    QCOMPARE(c->mesh.intraLink, std::string("shm"));
    QCOMPARE(c->mesh.interLink, std::string("ethernet"));
    QCOMPARE(c->parallel.dp * c->parallel.tp * c->parallel.pp, 1);
    QCOMPARE(c->parallel.schedule, ms::Schedule::OneFOneB);
    QCOMPARE(c->parallel.microbatches, 1);
    QCOMPARE(c->parallel.virtualChunks, 1);
    QCOMPARE(c->parallel.zero, 0);
    QCOMPARE(c->parallel.recompute, ms::Recompute::None);
    QCOMPARE(c->parallel.precision, ms::Precision::Fp32);
    QVERIFY(!c->parallel.sequenceParallel);
    QVERIFY(c->parallel.placement.empty());
    QCOMPARE(c->optimizer.type, ms::OptimizerType::AdamW);
    QCOMPARE(c->optimizer.lr, 3e-4);
    QCOMPARE(c->optimizer.beta1, 0.9);
    QCOMPARE(c->optimizer.beta2, 0.95);
    QCOMPARE(c->optimizer.eps, 1e-8);
    QCOMPARE(c->optimizer.weightDecay, 0.0);
    QCOMPARE(c->training.steps, 100);
    QCOMPARE(c->training.batchSize, 16);
    QCOMPARE(c->training.seqLen, 128);
    QCOMPARE(c->training.lrSchedule, ms::LrSchedule::Cosine);
    QCOMPARE(c->training.minLrRatio, 0.1);
    QCOMPARE(c->training.gradClip, 1.0);
    QCOMPARE(c->training.logEvery, 1);
    QCOMPARE(c->training.runDir, std::string());
    QCOMPARE(c->training.threads, 0);
    ms::RunConfig expected;
    expected.data.files = {"a"};
    QVERIFY(*c == expected);
    // toJson writes the defaults too.
    const json j = ms::toJson(*c);
    QCOMPARE(j["training"]["log_every"].get<int>(), 1);
    QCOMPARE(j["optimizer"]["betas"], json::array({0.9, 0.95}));
    QCOMPARE(j["mesh"]["nodes"][0]["name"].get<std::string>(), std::string("node0"));
  }

  void roundTrip_data() {
    QTest::addColumn<QByteArray>("document");
    QTest::newRow("gpt text") << QByteArray::fromStdString(gptText().dump());
    QTest::newRow("gpt tokens everything") << QByteArray::fromStdString(gptTokensEverything().dump());
    QTest::newRow("vit") << QByteArray::fromStdString(vitMnist().dump());
    QTest::newRow("mlp") << QByteArray::fromStdString(mlpMnist().dump());
  }

  void roundTrip() {
    QFETCH(QByteArray, document);
    const auto first = ms::parseRunConfig(json::parse(document.toStdString()));
    QVERIFY2(first.isOk(), first.message().c_str());
    const json written = ms::toJson(*first);
    const auto second = ms::parseRunConfig(written);
    QVERIFY2(second.isOk(), second.message().c_str());
    QVERIFY(*second == *first);
    QCOMPARE(ms::toJson(*second), written);
    // Every key the document set is written back with the same value (lists of one string widen).
    const json original = json::parse(document.toStdString());
    const json leaves = original.flatten();
    for (const auto& item : leaves.items()) {
      const json::json_pointer p(item.key());
      QVERIFY2(written.contains(p), item.key().c_str());
      const json& w = written.at(p);
      if (item.value().is_number())
        QCOMPARE(w.get<double>(), item.value().get<double>());
      else if (item.value().is_string() && w.is_array())
        QCOMPARE(w, json::array({item.value()}));
      else
        QCOMPARE(w, item.value());
    }
  }

  // Parameter-server mode's fields are written (and round-trip) in that mode, and left out of others.
  void parameterServerFields() {
    json j = mlpMnist();
    j["mesh"] = {{"nodes", json::array({{{"name", "n0"}, {"count", 4}}})}};
    j["parallel"] = {{"mode", "parameter_server"},
                     {"servers", 2},
                     {"workers", 4},
                     {"consistency", "bounded"},
                     {"staleness", 3},
                     {"worker_timeout_s", 2.5},
                     {"stragglers", json::array({{{"worker", 1}, {"slowdown", 4}}})}};
    j["training"]["grad_clip"] = 0;
    const auto c = ms::parseRunConfig(j);
    QVERIFY2(c.isOk(), c.message().c_str());
    QCOMPARE(c->parallel.consistency, ms::Consistency::Bounded);
    QCOMPARE(c->parallel.stragglers.size(), size_t(1));
    QCOMPARE(c->parallel.stragglers[0].slowdown, 4.0);
    QVERIFY2(ms::validateRunConfig(*c).empty(), describe(ms::validateRunConfig(*c)).c_str());
    const json written = ms::toJson(*c);
    QCOMPARE(written["parallel"]["servers"].get<int>(), 2);
    QCOMPARE(written["parallel"]["worker_timeout_s"].get<double>(), 2.5);
    const auto again = ms::parseRunConfig(json::parse(written.dump()));
    QVERIFY(again.isOk());
    QVERIFY(*again == *c);
    ms::RunConfig collective = *c;
    collective.parallel = {};
    const json plain = ms::toJson(collective);
    QVERIFY(!plain["parallel"].contains("servers"));
    QVERIFY(!plain["parallel"].contains("stragglers"));
    QCOMPARE(plain["parallel"]["mode"].get<std::string>(), std::string("collective"));
  }

  void everyFieldIsWritten() {
    const auto c = ms::parseRunConfig(gptTokensEverything());
    QVERIFY2(c.isOk(), c.message().c_str());
    const json j = ms::toJson(*c);
    QCOMPARE(j.size(), size_t(10));
    QCOMPARE(j["model"].size(), size_t(10));  // the gpt fields only
    QCOMPARE(j["data"].size(), size_t(3));    // kind, train, val
    QCOMPARE(j["mesh"].size(), size_t(6));    // nodes, links, and the (empty) lists of own types and profiles
    QCOMPARE(j["parallel"].size(), size_t(19));  // mode; the parameter-server fields only in that mode
    QCOMPARE(j["optimizer"].size(), size_t(7));
    QCOMPARE(j["training"].size(), size_t(16));
    QCOMPARE(j["data"]["val"], json::array({"val.bin"}));
    QCOMPARE(j["seed"].get<unsigned long long>(), std::numeric_limits<unsigned long long>::max());
    QVERIFY(!j["model"].contains("patch"));
    QVERIFY(!j["model"].contains("hidden"));
    QVERIFY(!j["data"].contains("files"));
    const json v = ms::toJson(*ms::parseRunConfig(vitMnist()));
    QVERIFY(v["model"].contains("patch") && v["model"].contains("classes"));
    QVERIFY(!v["model"].contains("vocab") && !v["model"].contains("hidden"));
    QVERIFY(v["data"].contains("dir") && !v["data"].contains("val_fraction"));
  }

  void saveAndLoad() {
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const std::string path = dir.filePath("run.json").toStdString();
    auto config = *ms::parseRunConfig(gptTokensEverything());
    QVERIFY2(ms::saveRunConfig(config, path).isOk(), path.c_str());
    QVERIFY(!QFile::exists(QString::fromStdString(path + ".tmp")));
    const std::string text = readText(path);
    QVERIFY(text.rfind("{\n  \"version\": 1,\n  \"name\": \"full.run-1\",\n  \"seed\": ", 0) == 0);
    QCOMPARE(text.back(), '\n');
    // The documented order, not nlohmann's alphabetical one.
    size_t last = 0;
    for (const char* key : {"\"device\"", "\"model\"", "\"data\"", "\"mesh\"", "\"parallel\"",
                            "\"optimizer\"", "\"training\""}) {
      const size_t at = text.find(key);
      QVERIFY2(at != std::string::npos && at > last, key);
      last = at;
    }
    QVERIFY(text.find("\"type\": \"gpt\",\n    \"layers\": 6") != std::string::npos);

    auto loaded = ms::loadRunConfig(path);
    QVERIFY2(loaded.isOk(), loaded.message().c_str());
    QVERIFY(*loaded == config);
    const std::string base = std::filesystem::absolute(dir.path().toStdString()).lexically_normal().string();
    QCOMPARE(loaded->baseDir, base);
    QCOMPARE(loaded->resolvePath("data/x.bin"), base + "/data/x.bin");
    QCOMPARE(loaded->resolvePath("../y.bin"), std::filesystem::path(base).parent_path().string() + "/y.bin");
    QCOMPARE(loaded->resolvePath("/abs/z.bin"), std::string("/abs/z.bin"));

    config.training.steps = 7;  // overwriting replaces the file
    QVERIFY(ms::saveRunConfig(config, path).isOk());
    QCOMPARE(ms::loadRunConfig(path)->training.steps, 7);
  }

  void saveReportsTheFile() {
    const std::string path = "/nonexistent-meshstudio-dir/run.json";
    const ms::Status s = ms::saveRunConfig(ms::RunConfig{}, path);
    QVERIFY(!s.isOk());
    QVERIFY2(s.message().find(path) == 0, s.message().c_str());
    QVERIFY2(s.message().find("No such file or directory") != std::string::npos, s.message().c_str());
  }

  void loadReportsTheFile() {
    const std::string path = "/nonexistent-meshstudio-dir/run.json";
    ms::ConfigErrors errors;
    const auto r = ms::loadRunConfig(path, &errors);
    QVERIFY(!r.isOk());
    QCOMPARE(r.message(), path + ": cannot open: No such file or directory");
    QCOMPARE(errors.size(), size_t(1));
    QCOMPARE(errors[0].path, std::string());
  }

  // Reading is bounded (issue 18): a file nested deeper than 64 levels is refused where the parse reaches
  // the 65th, with the path of that level (before, depth 100000 took gigabytes: every level copied its whole
  // path), and a file over 64 MiB is refused without reading the rest. 63 levels of arrays still parse (and
  // are then refused as a bad value of /model, not as nesting).
  void boundedReading() {
    QTemporaryDir tmp;
    auto write = [&](const QString& name, const std::string& text) {
      const std::string path = (tmp.path() + "/" + name).toStdString();
      std::ofstream(path, std::ios::binary) << text;
      return path;
    };
    const std::string deep = write("deep.json", "{\"version\": 1, \"model\": " + std::string(100000, '[') +
                                                    std::string(100000, ']') + "}");
    ms::ConfigErrors errors;
    auto r = ms::loadRunConfig(deep, &errors);
    QVERIFY(!r.isOk());
    QCOMPARE(errors.size(), size_t(1));
    QVERIFY2(QString::fromStdString(errors[0].message).contains("nested deeper than 64 levels"),
             errors[0].message.c_str());
    std::string at = "/model";
    for (int i = 0; i < 63; ++i) at += "/0";
    QCOMPARE(errors[0].path, at);
    const std::string objects = write(
        "objects.json", "{\"version\": 1, \"x\": " + [] {
          std::string t;
          for (int i = 0; i < 50000; ++i) t += "{\"a\": ";
          return t + "1" + std::string(50000, '}');
        }() + "}");
    r = ms::loadRunConfig(objects, &errors);
    QVERIFY(!r.isOk());
    QVERIFY2(QString::fromStdString(errors[0].message).contains("nested deeper than 64 levels"),
             errors[0].message.c_str());
    const std::string shallow = write(
        "shallow.json", "{\"version\": 1, \"model\": " + std::string(63, '[') + std::string(63, ']') + "}");
    r = ms::loadRunConfig(shallow, &errors);
    QVERIFY(!r.isOk());
    QVERIFY2(!QString::fromStdString(r.message()).contains("nested"), r.message().c_str());
    QVERIFY2(QString::fromStdString(r.message()).contains("/model"), r.message().c_str());

    // A number beyond double is refused with its place (nlohmann's message named only the token).
    const std::string huge = write("huge.json", "{\"version\": 1,\n \"optimizer\": {\"lr\": 1e400}}");
    r = ms::loadRunConfig(huge, &errors);
    QVERIFY(!r.isOk());
    QVERIFY2(r.message() == huge + ": line 2, column 22: the number 1e400 is out of range (beyond a double)",
             r.message().c_str());
    const std::string big =
        write("big.json", "{\"version\": 1, \"name\": \"" + std::string((65u << 20), 'x') + "\"}");
    r = ms::loadRunConfig(big, &errors);
    QVERIFY(!r.isOk());
    QVERIFY2(QString::fromStdString(r.message()).contains("over 64 MiB"), r.message().c_str());
  }

  void parseWithoutFileSaysConfig() {
    const auto r = ms::parseRunConfig(json::array());
    QVERIFY(!r.isOk());
    QCOMPARE(r.message(), std::string("config: the config must be a JSON object, got array"));
  }

  void resolvePathWithoutBaseDir() {
    ms::RunConfig c;
    QCOMPARE(c.resolvePath("a/b.txt"), std::string("a/b.txt"));
    c.baseDir = "/work/x";
    QCOMPARE(c.resolvePath("./a/b.txt"), std::string("/work/x/a/b.txt"));
    QCOMPARE(c.resolvePath("data/*.u8"), std::string("/work/x/data/*.u8"));
    QCOMPARE(c.resolvePath(""), std::string());
  }

  void didYouMean_data() {
    QTest::addColumn<QByteArray>("patch");  // merged into gptText()
    QTest::addColumn<QString>("path");
    QTest::addColumn<QString>("expected");
    QTest::newRow("typo") << QByteArray(R"({"optimizer":{"lerning_rate":0.1}})") << "/optimizer/lerning_rate"
                          << "unknown key \"lerning_rate\"; did you mean \"lr\"?";
    QTest::newRow("missing underscore")
        << QByteArray(R"({"training":{"batchsize":8}})") << "/training/batchsize"
        << "did you mean \"batch_size\"?";
    QTest::newRow("transposition") << QByteArray(R"({"model":{"laeyrs":2}})") << "/model/laeyrs"
                                   << "did you mean \"layers\"?";
    QTest::newRow("nanoGPT name") << QByteArray(R"({"model":{"n_head":2}})") << "/model/n_head"
                                  << "did you mean \"heads\"?";
    QTest::newRow("camelCase") << QByteArray(R"({"training":{"warmupSteps":2}})") << "/training/warmupSteps"
                               << "did you mean \"warmup_steps\"?";
    QTest::newRow("section") << QByteArray(R"({"trainng":{}})") << "/trainng"
                             << "did you mean \"training\"?";
    QTest::newRow("other section") << QByteArray(R"({"training":{"weight_decay":0.1}})")
                                   << "/training/weight_decay"
                                   << "did you mean \"/optimizer/weight_decay\"?";
    QTest::newRow("enum") << QByteArray(R"({"training":{"lr_schedule":"cosin"}})") << "/training/lr_schedule"
                          << "did you mean \"cosine\"?";
    QTest::newRow("layer") << QByteArray(
                                  R"({"parallel":{"placement":[{"stage":0,"layers":["embedding","block.0",
        "block.1","block.2","block3","head"]}]}})")
                           << "/parallel/placement/0/layers/4"
                           << "did you mean \"block.3\"?";
  }

  void didYouMean() {
    QFETCH(QByteArray, patch);
    QFETCH(QString, path);
    QFETCH(QString, expected);
    json doc = gptText();
    doc.merge_patch(json::parse(patch.toStdString()));
    ms::ConfigErrors errors;
    QVERIFY(!ms::parseRunConfig(doc, &errors).isOk());
    QVERIFY2(hasError(errors, path.toStdString(), expected.toStdString()), describe(errors).c_str());
  }

  void noSuggestionWhenNothingIsClose() {
    json doc = gptText();
    doc["model"]["xyzzy"] = 1;
    ms::ConfigErrors errors;
    QVERIFY(!ms::parseRunConfig(doc, &errors).isOk());
    QCOMPARE(errors.size(), size_t(1));
    QCOMPARE(errors[0].message, std::string("unknown key \"xyzzy\""));
  }

  void reportsEveryError() {
    json doc = gptText();
    doc["optimizer"]["lerning_rate"] = 0.1;
    doc["model"]["width"] = "wide";
    doc["parallel"] = {{"schedule", "pipedream"}};
    doc["training"]["seq_len"] = 512;
    doc["mesh"] = json::parse(R"({"nodes":[{"name":"a","count":0}]})");
    ms::ConfigErrors errors;
    const auto r = ms::parseRunConfig(doc, &errors);
    QVERIFY(!r.isOk());
    QVERIFY2(errors.size() == 5, describe(errors).c_str());
    QVERIFY(hasError(errors, "/optimizer/lerning_rate", "did you mean \"lr\"?"));
    QVERIFY(hasError(errors, "/model/width", "expected an integer, got string \"wide\""));
    QVERIFY(hasError(errors, "/parallel/schedule", "\"pipedream\" is not one of"));
    QVERIFY(hasError(errors, "/training/seq_len", "must be at most model.context (128)"));
    QVERIFY(hasError(errors, "/mesh/nodes/0/count", "must be >= 1, got 0"));
    QCOMPARE(QString::fromStdString(r.message()).split('\n').size(), 5);
  }

  // A value that failed to parse is not checked again through the default that stood in for it.
  void badValuesDoNotCascade_data() {
    QTest::addColumn<QByteArray>("patch");
    QTest::addColumn<QString>("path");
    QTest::newRow("heads") << QByteArray(R"({"model":{"heads":"four","width":100}})") << "/model/heads";
    QTest::newRow("hidden item") << QByteArray(
                                        R"({"model":{"type":"mlp","layers":null,"width":null,"heads":null,
        "vocab":null,"context":null,"hidden":[128,"x"]},"data":{"kind":"fashion_mnist","files":null,
        "val_fraction":null},"parallel":{"tp":3},"mesh":{"nodes":[{"name":"a","count":3}]}})")
                                 << "/model/hidden/1";
    QTest::newRow("model type") << QByteArray(R"({"model":{"type":"bert"}})") << "/model/type";
    QTest::newRow("node count") << QByteArray(
                                       R"({"parallel":{"dp":2},"mesh":{"nodes":[{"name":"a","count":"2"}]}})")
                                << "/mesh/nodes/0/count";
    QTest::newRow("placement item") << QByteArray(R"({"parallel":{"placement":[7]}})")
                                    << "/parallel/placement/0";
    QTest::newRow("own device type") << QByteArray(
                                            R"({"mesh":{"nodes":[{"name":"a","device":"npu"}],"device_types":[
        {"name":5,"peak_tflops_fp32":1,"peak_tflops_bf16":1,"memory_gb":1,"memory_bandwidth_gbs":1}]}})")
                                     << "/mesh/device_types/0/name";
  }

  void badValuesDoNotCascade() {
    QFETCH(QByteArray, patch);
    QFETCH(QString, path);
    json doc = gptText();
    doc.merge_patch(json::parse(patch.toStdString()));  // null removes a key
    ms::ConfigErrors errors;
    QVERIFY(!ms::parseRunConfig(doc, &errors).isOk());
    QVERIFY2(errors.size() == 1 && errors[0].path == path.toStdString(), describe(errors).c_str());
  }

  // The config's own device and link types: used by nodes and links, refused when they shadow the catalog,
  // repeat a name or hold figures that are not positive.
  void hardwareTypes_data() {
    QTest::addColumn<QByteArray>("patch");  // merged into gptText(); the mesh below is the base
    QTest::addColumn<QString>("path");      // empty: the config is valid
    QTest::addColumn<QString>("expected");
    QTest::newRow("own types used") << QByteArray("{}") << QString() << QString();
    QTest::newRow("catalog names still work")
        << QByteArray(R"({"mesh":{"nodes":[{"name":"a","device":"l40s","count":1}],"intra_link":"pcie"}})")
        << QString() << QString();
    QTest::newRow("unknown device")
        << QByteArray(R"({"mesh":{"nodes":[{"name":"a","device":"a100","count":1}]}})")
        << "/mesh/nodes/0/device"
        << "\"a100\" is not one of \"cpu\", \"h100-sxm-80gb\", \"h200-141gb\", \"a100-40gb\", \"a100-80gb\", "
           "\"l40s\", \"rtx4090\", \"my-npu\"; did you mean \"a100-40gb\"?";
    QTest::newRow("unknown own device")
        << QByteArray(R"({"mesh":{"nodes":[{"name":"a","device":"my-npuu","count":1}]}})")
        << "/mesh/nodes/0/device"
        << "did you mean \"my-npu\"?";
    QTest::newRow("unknown own link")
        << QByteArray(R"({"mesh":{"inter_link":"fabrik"}})") << "/mesh/inter_link"
        << "did you mean \"fabric\"?";
    QTest::newRow("device shadows catalog")
        << QByteArray(R"({"mesh":{"nodes":[{"name":"a","device":"h100-sxm-80gb","count":1}],
            "device_types":[{"name":"h100-sxm-80gb","peak_tflops_fp32":1,"peak_tflops_bf16":1,"memory_gb":1,
            "memory_bandwidth_gbs":1}]}})")
        << "/mesh/device_types/0/name"
        << "device type \"h100-sxm-80gb\" is already in the hardware catalog; give yours another name";
    QTest::newRow("link shadows catalog") << QByteArray(R"({"mesh":{"intra_link":"nvlink",
            "link_types":[{"name":"nvlink","bandwidth_gbs":1,"latency_us":1}]}})")
                                          << "/mesh/link_types/0/name"
                                          << "link type \"nvlink\" is already in the hardware catalog";
    QTest::newRow("duplicate device type")
        << QByteArray(R"({"mesh":{"device_types":[{"name":"my-npu","peak_tflops_fp32":1,"peak_tflops_bf16":1,
            "memory_gb":1,"memory_bandwidth_gbs":1},{"name":"my-npu","peak_tflops_fp32":2,"peak_tflops_bf16":2,
            "memory_gb":2,"memory_bandwidth_gbs":2}]}})")
        << "/mesh/device_types/1/name"
        << "duplicate device type \"my-npu\" (also at /mesh/device_types/0)";
    QTest::newRow("duplicate link type")
        << QByteArray(R"({"mesh":{"link_types":[{"name":"fabric","bandwidth_gbs":1,"latency_us":1},
            {"name":"fabric","bandwidth_gbs":2,"latency_us":2}]}})")
        << "/mesh/link_types/1/name"
        << "duplicate link type \"fabric\" (also at /mesh/link_types/0)";
    QTest::newRow("zero peak") << QByteArray(
                                      R"({"mesh":{"device_types":[{"name":"my-npu","peak_tflops_fp32":0,
            "peak_tflops_bf16":1,"memory_gb":1,"memory_bandwidth_gbs":1}]}})")
                               << "/mesh/device_types/0/peak_tflops_fp32"
                               << "must be > 0, got 0";
    QTest::newRow("negative memory") << QByteArray(
                                            R"({"mesh":{"device_types":[{"name":"my-npu","peak_tflops_fp32":1,
            "peak_tflops_bf16":1,"memory_gb":-8,"memory_bandwidth_gbs":1}]}})")
                                     << "/mesh/device_types/0/memory_gb"
                                     << "must be > 0, got -8";
    QTest::newRow("fraction above 1")
        << QByteArray(R"({"mesh":{"device_types":[{"name":"my-npu","peak_tflops_fp32":1,"peak_tflops_bf16":1,
            "memory_gb":1,"memory_bandwidth_gbs":1,"achievable_fraction":1.5}]}})")
        << "/mesh/device_types/0/achievable_fraction"
        << "must be in (0, 1], got 1.5";
    QTest::newRow("bandwidth not a number")
        << QByteArray(R"({"mesh":{"link_types":[{"name":"fabric","bandwidth_gbs":"fast","latency_us":1}]}})")
        << "/mesh/link_types/0/bandwidth_gbs"
        << "expected a number, got string \"fast\"";
    QTest::newRow("negative latency")
        << QByteArray(R"({"mesh":{"link_types":[{"name":"fabric","bandwidth_gbs":1,"latency_us":-1}]}})")
        << "/mesh/link_types/0/latency_us"
        << "must be >= 0, got -1";
    QTest::newRow("missing figure")
        << QByteArray(R"({"mesh":{"device_types":[{"name":"my-npu","peak_tflops_fp32":1,"peak_tflops_bf16":1,
            "memory_bandwidth_gbs":1}]}})")
        << "/mesh/device_types/0/memory_gb"
        << "missing required key \"memory_gb\"";
    QTest::newRow("name with a space")
        << QByteArray(R"({"mesh":{"nodes":[{"name":"a","device":"cpu","count":1}],
            "device_types":[{"name":"my npu","peak_tflops_fp32":1,"peak_tflops_bf16":1,"memory_gb":1,
            "memory_bandwidth_gbs":1}]}})")
        << "/mesh/device_types/0/name"
        << "may only hold letters, digits";
    QTest::newRow("unknown key") << QByteArray(R"({"mesh":{"device_types":[{"name":"my-npu","tflops":1,
            "peak_tflops_fp32":1,"peak_tflops_bf16":1,"memory_gb":1,"memory_bandwidth_gbs":1}]}})")
                                 << "/mesh/device_types/0/tflops"
                                 << "did you mean \"peak_tflops_fp32\"?";
  }

  void hardwareTypes() {
    QFETCH(QByteArray, patch);
    QFETCH(QString, path);
    QFETCH(QString, expected);
    json doc = gptText();
    doc["mesh"] = json::parse(R"({"nodes":[{"name":"a","device":"my-npu","count":1}],
      "intra_link":"fabric","inter_link":"ethernet",
      "device_types":[{"name":"my-npu","peak_tflops_fp32":30,"peak_tflops_bf16":240,"memory_gb":32,
                       "memory_bandwidth_gbs":900}],
      "link_types":[{"name":"fabric","bandwidth_gbs":100,"latency_us":2}]})");
    doc.merge_patch(json::parse(patch.toStdString()));
    ms::ConfigErrors errors;
    const auto c = ms::parseRunConfig(doc, &errors);
    if (path.isEmpty()) {
      QVERIFY2(c.isOk(), c.message().c_str());
      const auto again = ms::parseRunConfig(ms::toJson(*c));
      QVERIFY2(again.isOk(), again.message().c_str());
      QVERIFY(*again == *c);
      return;
    }
    QVERIFY(!c.isOk());
    QVERIFY2(errors.size() == 1, describe(errors).c_str());  // one problem, one error
    QVERIFY2(hasError(errors, path.toStdString(), expected.toStdString()), describe(errors).c_str());
  }

  void ownTypesAreRead() {
    const auto c = ms::parseRunConfig(gptTokensEverything());
    QVERIFY2(c.isOk(), c.message().c_str());
    QCOMPARE(c->mesh.deviceTypes.size(), size_t(1));
    const ms::DeviceTypeConfig& t = c->mesh.deviceTypes[0];
    QCOMPARE(t.name, std::string("npu-1"));
    QCOMPARE(t.label, std::string("An NPU"));
    QCOMPARE(t.peakTflopsFp32, 40.5);
    QCOMPARE(t.peakTflopsBf16, 320.0);
    QCOMPARE(t.memoryGb, 64.0);
    QCOMPARE(t.memoryBandwidthGbs, 1800.0);
    QCOMPARE(t.achievableFraction, 0.45);
    QCOMPARE(c->mesh.linkTypes.size(), size_t(1));
    QCOMPARE(c->mesh.linkTypes[0].name, std::string("ib-2x"));
    QCOMPARE(c->mesh.linkTypes[0].bandwidthGbs, 100.0);
    QCOMPARE(c->mesh.linkTypes[0].latencyUs, 4.5);
    // Defaults: no own types; an own type's label and achievable fraction.
    const ms::MeshConfig mesh;
    QVERIFY(mesh.deviceTypes.empty() && mesh.linkTypes.empty());
    const ms::DeviceTypeConfig own;
    QCOMPARE(own.achievableFraction, 0.5);
    QVERIFY(own.label.empty());
  }

  void lenientWhereTheFormatSaysSo() {
    json doc = gptText();
    doc["data"]["files"] = "one.txt";  // a string is a list of one
    doc["training"]["steps"] = 40.0;   // an integral number is an integer
    doc["seed"] = 1e3;
    doc["parallel"] = {{"zero", 3}};  // ZeRO without data parallelism is a no-op, not an error
    const auto c = ms::parseRunConfig(doc);
    QVERIFY2(c.isOk(), c.message().c_str());
    QCOMPARE(c->data.files, std::vector<std::string>{"one.txt"});
    QCOMPARE(c->training.steps, 40);
    QCOMPARE(c->seed, 1000ull);
  }

  void validateTypedConfig_data() {
    QTest::addColumn<int>("index");
    const auto cases = typedCases();
    for (size_t i = 0; i < cases.size(); ++i) QTest::newRow(cases[i].name) << int(i);
  }

  void validateTypedConfig() {
    QFETCH(int, index);
    const TypedCase tc = typedCases()[size_t(index)];
    ms::RunConfig c = typedGpt();
    QVERIFY(ms::validateRunConfig(c).empty());
    tc.change(c);
    const ms::ConfigErrors errors = ms::validateRunConfig(c);
    QVERIFY2(hasError(errors, tc.path, tc.substring), describe(errors).c_str());
  }

  void fieldsOfOtherModelTypesAreNotChecked() {
    ms::RunConfig c = typedGpt();
    c.model.patch = 0;  // a vit field
    c.model.hidden = {0};
    c.data.dir = "";  // a fashion_mnist field
    QVERIFY2(ms::validateRunConfig(c).empty(), describe(ms::validateRunConfig(c)).c_str());
  }

  void enumNames() {
    QCOMPARE(std::string(ms::toString(ms::ModelType::Vit)), std::string("vit"));
    QCOMPARE(std::string(ms::toString(ms::Activation::Gelu)), std::string("gelu"));
    QCOMPARE(std::string(ms::toString(ms::Pooling::Mean)), std::string("mean"));
    QCOMPARE(std::string(ms::toString(ms::DataKind::FashionMnist)), std::string("fashion_mnist"));
    QCOMPARE(std::string(ms::toString(ms::Schedule::Interleaved1F1B)), std::string("interleaved_1f1b"));
    QCOMPARE(std::string(ms::toString(ms::Schedule::ZbH1)), std::string("zb_h1"));
    QCOMPARE(std::string(ms::toString(ms::Recompute::Full)), std::string("full"));
    QCOMPARE(std::string(ms::toString(ms::Precision::Bf16)), std::string("bf16"));
    QCOMPARE(std::string(ms::toString(ms::OptimizerType::AdamW)), std::string("adamw"));
    QCOMPARE(std::string(ms::toString(ms::LrSchedule::Linear)), std::string("linear"));
    QCOMPARE(std::string(ms::toString(ms::DeviceChoice::Cuda)), std::string("cuda"));
  }

  void formatsErrors() {
    const ms::ConfigErrors errors = {{"/parallel/tp", "tp (3) must divide model.heads (4)"},
                                     {"", "whole file"}};
    QCOMPARE(ms::formatConfigErrors(errors, "a.json"),
             std::string("a.json: /parallel/tp: tp (3) must divide model.heads (4)\na.json: whole file"));
    QCOMPARE(ms::formatConfigErrors({}, "a.json"), std::string());
    // A control character quoted from the config stays on its error's line, escaped (found by fuzz_config:
    // a name holding "\n" split its error in two, the second line naming no file).
    QCOMPARE(ms::formatConfigErrors({{"/name", "got \"a\nb\t\""}}, "a.json"),
             std::string("a.json: /name: got \"a\\u000ab\\u0009\""));
    ms::ConfigErrors parsed;
    const auto config = ms::parseRunConfigText(
        R"({"model": {"type": "mlp"}, "data": {"kind": "fashion_mnist"}, "name": "two\nlines", "sed": 1})",
        "n.json", &parsed);
    QVERIFY(!config);
    QCOMPARE(parsed.size(), std::size_t(2));  // the name, and the unknown key "sed"
    QCOMPARE(std::count(config.message().begin(), config.message().end(), '\n'), std::ptrdiff_t(1));
    QVERIFY2(config.message().find("two\\u000alines") != std::string::npos, config.message().c_str());
  }

  void schemaFileMatches() {
    const std::string path = MS_SOURCE_DIR "/resources/run-config.schema.json";
    const std::string generated = ms::runConfigSchema().dump(2) + "\n";
    if (qEnvironmentVariableIsSet("MS_UPDATE_GOLDEN")) writeText(path, generated);
    QVERIFY2(readText(path) == generated,
             "resources/run-config.schema.json is stale; run with MS_UPDATE_GOLDEN=1");
  }

  void schemaIsStrict() {
    const json s = ms::runConfigSchema();
    QCOMPARE(s["$schema"].get<std::string>(), std::string("https://json-schema.org/draft/2020-12/schema"));
    QCOMPARE(s["required"], json::array({"model", "data"}));
    int objects = 0;
    std::function<void(const json&)> visit = [&](const json& node) {
      if (node.is_object()) {
        if (node.contains("type") && node["type"] == "object") {
          ++objects;
          QCOMPARE(node["additionalProperties"], json(false));
        }
        for (const auto& [k, v] : node.items()) visit(v);
      } else if (node.is_array()) {
        for (const auto& v : node) visit(v);
      }
    };
    visit(s);
    // Top level, six sections, mesh node, device type, link type, profile, placement chunk, straggler.
    QCOMPARE(objects, 13);
    const json& model = s["properties"]["model"];
    QCOMPARE(model["properties"]["layers"]["minimum"], json(1));
    QCOMPARE(model["properties"]["layers"]["default"], json(4));
    QCOMPARE(model["properties"]["type"]["enum"], json::array({"gpt", "vit", "mlp", "cnn", "llama"}));
    const json& p = s["properties"]["parallel"]["properties"];
    QCOMPARE(p["zero"]["maximum"], json(3));
    QCOMPARE(p["schedule"]["default"], json("1f1b"));
    QCOMPARE(s["properties"]["optimizer"]["properties"]["lr"]["exclusiveMinimum"].get<double>(), 0.0);
    QCOMPARE(s["properties"]["optimizer"]["properties"]["betas"]["items"]["exclusiveMaximum"].get<double>(),
             1.0);
    const json& device = s["properties"]["mesh"]["properties"]["nodes"]["items"]["properties"]["device"];
    // Catalog names are examples, not an enum: a config may name its own device types.
    QVERIFY(!device.contains("enum"));
    QVERIFY(device["examples"].size() == 7 && device["examples"][1] == "h100-sxm-80gb");
    const json& mesh = s["properties"]["mesh"]["properties"];
    QCOMPARE(mesh["inter_link"]["examples"][0], json("shm"));
    QCOMPARE(
        mesh["device_types"]["items"]["required"],
        json::array({"name", "peak_tflops_fp32", "peak_tflops_bf16", "memory_gb", "memory_bandwidth_gbs"}));
    QCOMPARE(
        mesh["device_types"]["items"]["properties"]["achievable_fraction"]["exclusiveMinimum"].get<double>(),
        0.0);
    QCOMPARE(mesh["link_types"]["items"]["properties"]["latency_us"]["minimum"].get<double>(), 0.0);
    // The gpt branch forbids the vit and mlp keys.
    bool gptRule = false;
    for (const auto& rule : model["allOf"])
      if (rule["if"]["properties"]["type"]["const"] == "gpt")
        gptRule = rule["then"]["properties"]["patch"] == json(false) &&
                  !rule["then"]["properties"].contains("vocab");
    QVERIFY(gptRule);
  }

  void markdownDocMatches() {
    const std::string path = MS_SOURCE_DIR "/docs/config.md";
    const std::string md = ms::runConfigMarkdown();
    std::string text = readText(path);
    if (qEnvironmentVariableIsSet("MS_UPDATE_GOLDEN")) {
      const size_t marker = text.find(kMarkdownMarker);
      QVERIFY2(marker != std::string::npos, "docs/config.md needs the generated marker line");
      text = text.substr(0, marker) + kMarkdownMarker + "\n\n" + md + "\n";
      writeText(path, text);
    }
    QVERIFY2(text.find(md) != std::string::npos, "docs/config.md is stale; run with MS_UPDATE_GOLDEN=1");
  }

  void markdownListsEveryKey() {
    const std::string md = ms::runConfigMarkdown();
    std::function<void(const json&)> visit = [&](const json& schema) {
      if (!schema.contains("properties")) return;
      for (const auto& [key, sub] : schema["properties"].items()) {
        QVERIFY2(md.find("| `" + key + "` |") != std::string::npos, key.c_str());
        visit(sub);
        if (sub.contains("items")) visit(sub["items"]);
      }
    };
    visit(ms::runConfigSchema());
    QVERIFY(md.find("## `mesh.nodes[]`") != std::string::npos);
    QVERIFY(md.find("| `lr` | number | `0.0003` | > 0 | Peak learning rate. |") != std::string::npos);
  }
};

QTEST_APPLESS_MAIN(TestConfig)

#include "tst_config.moc"
