// The equivalence suite: plans over several ranks (data, tensor (with and without sequence parallelism) and
// pipeline parallelism alone and combined up to 8 ranks; every schedule; ZeRO 0-3; uneven and interleaved
// placements; gradient accumulation; activation recomputation, full, partial and selective; gpt and vit)
// must train exactly like one process: every step's loss of 10 steps within 1e-5 relative, the same
// evaluation, and final parameters equal to float rounding. The runs are real: mpirun starts the engine with
// the plan's rank count. Also: a run resumed under a different plan continues with the uninterrupted run's
// losses, and every rank's spans and memory reach the stream.
#include <QtTest>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "mpi_test_util.h"
#include "runtime/checkpoint.h"

using namespace ms::test;

namespace {

const QString kEngine = QStringLiteral(MS_ENGINE_EXE);
const QString kMpiexec = QStringLiteral(MS_MPIEXEC);
constexpr int kSteps = 10;

struct Reference {
  QString dir;            // run folder of the single-process run
  nlohmann::json memory;  // its last memory line
};

// Empty when the run in dir has kSteps steps, each loss within `relative` (1e-5) of the reference run's;
// else which step differs.
QString stepLossMismatch(const QString& refDir, const QString& dir, double relative = 1e-5) {
  const auto single = metricLosses(refDir + "/metrics.jsonl", "step");
  const auto multi = metricLosses(dir + "/metrics.jsonl", "step");
  if (multi.size() != size_t(kSteps)) return QString("%1 steps, expected %2").arg(multi.size()).arg(kSteps);
  for (const auto& [step, loss] : single)
    if (!(std::abs(multi.at(step) - loss) <= relative * std::abs(loss)))
      return QString("step %1: %2 vs %3").arg(step).arg(loss, 0, 'g', 9).arg(multi.at(step), 0, 'g', 9);
  return {};
}

// Each rank's predicted "memory_bytes", from the run_start line.
std::map<int, nlohmann::json> predictedMemory(const nlohmann::json& start) {
  std::map<int, nlohmann::json> predicted;
  for (const auto& rank : start["predicted"]["ranks"])
    predicted[rank["rank"].get<int>()] = rank["memory_bytes"];
  return predicted;
}

// Empty when every rank's measured model states (the "current" bytes at the end of the last step) are the
// predicted ones: parameters, gradients and optimizer state (plan/model_state.h). The prediction counts
// parameter elements; the store pads each parameter to 16 floats and each unit to 16 * dp (parameters.h), a
// few percent on these small models, so the measured bytes lie in [predicted, 1.06 * predicted]. The PEAK
// too: no step holds more parameters or gradients than that (ZeRO-2/3 reduce-scatter and free each layer's
// full gradients every microbatch, and the gathered ZeRO-3 layer, like them, is a communication buffer).
QString modelStateMismatch(const nlohmann::json& start, const nlohmann::json& memory) {
  const std::map<int, nlohmann::json> predicted = predictedMemory(start);
  for (const auto& rank : memory["ranks"]) {
    const int r = rank["rank"].get<int>();
    for (const char* when : {"current", "peak"})
      for (const char* k : {"parameters", "gradients", "optimizer"}) {
        const double p = predicted.at(r)[k].get<double>(), m = rank[when][k].get<double>();
        if (!(m >= p && m <= 1.06 * p))
          return QString("rank %1: %2 predicted %3, measured %4 (%5)")
              .arg(r)
              .arg(k)
              .arg(p, 0, 'f', 0)
              .arg(m, 0, 'f', 0)
              .arg(when);
      }
  }
  return {};
}

// Empty when every rank's peak activations are the plan's prediction to 0.5%: every schedule (split
// backwards, interleaved slots), TP with and without sequence parallelism, full, partial and selective
// recompute, ZeRO, fp32 and bf16. `above`: how far above the prediction the peak may be (expert parallelism:
// the plan assumes balanced routing, and a rank's experts receive more rows than the average in some steps).
QString activationMismatch(const nlohmann::json& start, const nlohmann::json& memory, double above = 0.005) {
  std::map<int, double> predicted;
  for (const auto& rank : start["predicted"]["ranks"])
    predicted[rank["rank"].get<int>()] = rank["memory_bytes"]["activations"].get<double>();
  for (const auto& rank : memory["ranks"]) {
    const double measured = rank["peak"]["activations"].get<double>();
    const double p = predicted.at(rank["rank"].get<int>());
    if (!(measured >= p * 0.995 && measured <= p * (1.0 + above)))
      return QString("rank %1: predicted activations %2, measured %3")
          .arg(rank["rank"].get<int>())
          .arg(p, 0, 'f', 0)
          .arg(measured, 0, 'f', 0);
  }
  return {};
}

// Empty when every rank's peak workspace and communication buffers are the plan's (memory_model.h
// otherBreakdown, "other_parts" of the predicted memory). The workspace is exact (0.5%): slots as large as
// their largest use, the activation-gradient buffers of the backward, the cnn's BatchNorm sums; except under
// mixture of experts (`routed`), whose scratch holds the rows each expert received, which the plan takes as
// balanced: up to 30% above it measured here (26% at most, untrained routers over 4 experts). The
// communication buffers' prediction is their peak followed over the stage's actions (pipeline messages, ZeRO
// buckets and staging, the gathered ZeRO-3 layers: memory_model.cpp concurrentStageBytes), an upper bound
// (0.5%) that the run need not reach: a gradient sent by rendezvous is counted held until the peer posts its
// receive, which depends on timing (measured down to 0.64 of the bound).
QString otherMismatch(const nlohmann::json& start, const nlohmann::json& memory, bool routed) {
  const std::map<int, nlohmann::json> predicted = predictedMemory(start);
  for (const auto& rank : memory["ranks"]) {
    const int r = rank["rank"].get<int>();
    const nlohmann::json& p = predicted.at(r);
    const nlohmann::json parts = p.value("other_parts", nlohmann::json::object());
    const double ws = parts.value("workspace", 0.0), comm = parts.value("communication", 0.0);
    const double mws = rank["peak"]["workspace"].get<double>(),
                 mcomm = rank["peak"]["communication"].get<double>();
    if (!(mws >= ws * 0.995 && mws <= ws * (routed ? 1.3 : 1.005)))
      return QString("rank %1: predicted workspace %2, measured %3")
          .arg(r)
          .arg(ws, 0, 'f', 0)
          .arg(mws, 0, 'f', 0);
    if (!(mcomm <= comm * 1.005 + 256 && mcomm >= comm * 0.6))
      return QString("rank %1: predicted communication buffers %2, measured %3")
          .arg(r)
          .arg(comm, 0, 'f', 0)
          .arg(mcomm, 0, 'f', 0);
  }
  return {};
}

// Empty when every rank's peak total is within the plan's "total", the most held at once (the categories'
// peaks less memory_model.h MemoryBreakdown::notAtOnce): never above it (0.5%), and below it by no more than
// the communication buffers' own slack (their timing-dependent part, above) and 2% (measured: at most 1.7%,
// the split backward's buckets on ZB-H1 with ZeRO-2). Not under mixture of experts, whose routed rows the
// plan takes as balanced (the activation and workspace checks bound those).
QString totalMismatch(const nlohmann::json& start, const nlohmann::json& memory) {
  const std::map<int, nlohmann::json> predicted = predictedMemory(start);
  for (const auto& rank : memory["ranks"]) {
    const int r = rank["rank"].get<int>();
    const nlohmann::json& p = predicted.at(r);
    const double total = p["total"].get<double>(), measured = rank["peak"]["total"].get<double>();
    const double comm = p.value("other_parts", nlohmann::json::object()).value("communication", 0.0);
    const double slack = std::max(0.0, comm - rank["peak"]["communication"].get<double>());
    if (!(measured <= total * 1.005 + 256 && measured >= (total - slack) * 0.98 - 256))
      return QString("rank %1: predicted peak total %2 (categories %3 apart), measured %4")
          .arg(r)
          .arg(total, 0, 'f', 0)
          .arg(p.value("not_at_once", 0.0), 0, 'f', 0)
          .arg(measured, 0, 'f', 0);
  }
  return {};
}

// Mixture of experts: empty when every rank's peak total lies between the plan's balanced "total" (less the
// communication buffers' slack, 10% for the ranks sent fewer rows than the average) and its
// "uneven_routing_total", the most the routing can send a rank (memory_model.h Routing::Uneven), which no
// run can pass (0.5%).
QString unevenRoutingMismatch(const nlohmann::json& start, const nlohmann::json& memory) {
  const std::map<int, nlohmann::json> predicted = predictedMemory(start);
  for (const auto& rank : memory["ranks"]) {
    const int r = rank["rank"].get<int>();
    const nlohmann::json& p = predicted.at(r);
    const double total = p["total"].get<double>(), measured = rank["peak"]["total"].get<double>();
    const double bound = p.value("uneven_routing_total", 0.0);
    const double comm = p.value("other_parts", nlohmann::json::object()).value("communication", 0.0);
    const double slack = std::max(0.0, comm - rank["peak"]["communication"].get<double>());
    if (!(bound >= total && measured <= bound * 1.005 + 256 && measured >= (total - slack) * 0.9 - 256))
      return QString("rank %1: predicted peak total %2 balanced, %3 at the most uneven routing, measured %4")
          .arg(r)
          .arg(total, 0, 'f', 0)
          .arg(bound, 0, 'f', 0)
          .arg(measured, 0, 'f', 0);
  }
  return {};
}

}  // namespace

class TestEquivalence : public QObject {
  Q_OBJECT

  QTemporaryDir m_tmp;
  std::map<QString, Reference> m_refs;

  // The config body (everything but name, seed and mesh) of a reference model.
  std::string body(const QString& ref) const {
    const std::string text = (m_tmp.path() + "/text.txt").toStdString();
    const std::string training =
        ", \"training\": {\"steps\": 10, \"batch_size\": 8, \"seq_len\": 32, \"warmup_steps\": 2, "
        "\"eval_batches\": 2, \"threads\": 1, \"grad_clip\": 1.0, \"checkpoint_every\": 5}";
    const std::string adam = ", \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.003, \"weight_decay\": 0.1}";
    const std::string gptData = ", \"data\": {\"kind\": \"text\", \"files\": [\"" + text + "\"]}";
    if (ref == "gpt")
      return "\"model\": {\"type\": \"gpt\", \"layers\": 4, \"width\": 32, \"heads\": 4, \"context\": 32}" +
             gptData + adam + training;
    if (ref == "gpt-untied")
      return "\"model\": {\"type\": \"gpt\", \"layers\": 4, \"width\": 32, \"heads\": 4, \"context\": 32, "
             "\"tie_embeddings\": false}" +
             gptData + adam + training;
    // llama: grouped-query attention (2 query heads a key/value head), SwiGLU, rotary embeddings, RMSNorm;
    // "llama-tied" shares the embedding with the head (the embedding group then sums two stages' copies).
    const std::string llama =
        "\"model\": {\"type\": \"llama\", \"layers\": 4, \"width\": 32, \"heads\": 4, \"kv_heads\": 2, "
        "\"ffn_hidden\": 48, \"rope_theta\": 1000, \"context\": 32, \"tie_embeddings\": ";
    if (ref == "llama") return llama + "false}" + gptData + adam + training;
    // Mixture of experts: block 0 dense, then 4 experts (2 a token) and a shared one, dropless. The
    // load-balancing loss is a microbatch's (as Megatron-LM computes it), so a plan that splits the batch
    // otherwise (data parallelism, microbatches) optimises a slightly different objective: "llama-moe-noaux"
    // weighs it 0 for those; tensor parallelism keeps the microbatch and is compared with it on.
    const std::string moe =
        "false, \"experts\": 4, \"experts_per_token\": 2, \"expert_ffn_hidden\": 32, "
        "\"shared_experts\": 1, \"dense_layers\": 1, \"aux_loss_coef\": ";
    if (ref == "llama-moe") return llama + moe + "0.05}" + gptData + adam + training;
    if (ref == "llama-moe-noaux") return llama + moe + "0}" + gptData + adam + training;
    if (ref == "llama-tied") return llama + "true}" + gptData + adam + training;
    if (ref == "gpt-sgd")
      return "\"model\": {\"type\": \"gpt\", \"layers\": 4, \"width\": 32, \"heads\": 4, \"context\": 32}" +
             gptData + ", \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}" + training;
    // cnn on Fashion-MNIST (channel counts that the store's 16-float padding leaves unpadded)
    if (ref == "cnn")
      return "\"model\": {\"type\": \"cnn\", \"channels\": [16, 32], \"blocks\": 1}, \"data\": {\"kind\": "
             "\"fashion_mnist\"}" +
             adam +
             ", \"training\": {\"steps\": 10, \"batch_size\": 16, \"eval_batches\": 2, \"threads\": 1, "
             "\"checkpoint_every\": 5}";
    // vit on Fashion-MNIST
    return "\"model\": {\"type\": \"vit\", \"layers\": 3, \"width\": 16, \"heads\": 2, \"patch\": 7}, "
           "\"data\": "
           "{\"kind\": \"fashion_mnist\"}" +
           adam +
           ", \"training\": {\"steps\": 10, \"batch_size\": 16, \"eval_batches\": 2, \"threads\": 1, "
           "\"checkpoint_every\": 5}";
  }

  // The single-process run of a reference (run once, then reused); precision "fp32" or "bf16", gradients
  // "fp32" or (in bf16) "bf16".
  const Reference* reference(const QString& ref, const QString& precision = QStringLiteral("fp32"),
                             const QString& grads = QStringLiteral("fp32")) {
    const QString key = ref + "-" + precision + (grads == "fp32" ? "" : "-grads-" + grads);
    auto it = m_refs.find(key);
    if (it != m_refs.end()) return &it->second;
    const std::string parallel = ", \"parallel\": {\"precision\": \"" + precision.toStdString() +
                                 "\", \"grad_precision\": \"" + grads.toStdString() + "\"}";
    const QString config = writeCpuConfig(m_tmp.path(), "ref-" + key, body(ref) + parallel, 1);
    const QString dir = m_tmp.path() + "/ref-" + key;
    ProcessResult r = runProcess(kEngine, {"train", config, "--run-dir", dir, "--quiet"});
    if (r.code != 0) {
      qWarning("%s", qPrintable(r.err));
      return nullptr;
    }
    Reference out{dir, lastLine(dir + "/metrics.jsonl", "memory")};
    return &(m_refs[key] = out);
  }

  static int ranksOf(const nlohmann::json& p) {
    return p.value("dp", 1) * p.value("cp", 1) * p.value("tp", 1) * p.value("pp", 1);
  }

 private slots:
  void initTestCase() {
    QVERIFY(m_tmp.isValid());
    std::ofstream out((m_tmp.path() + "/text.txt").toStdString());
    for (int i = 0; i < 300; ++i)
      out << "Line " << i << " of a text for the equivalence suite, more or less.\n";
  }

  void planMatchesOneProcess_data() {
    QTest::addColumn<QString>("ref");
    QTest::addColumn<QString>("parallel");
    const QString uneven =
        R"("placement": [{"stage": 0, "layers": ["embedding"]}, {"stage": 1, "layers": ["block.0", "block.1",
        "block.2", "block.3", "head"]}])";
    const QString unevenVit =
        R"("placement": [{"stage": 0, "layers": ["embedding", "block.0", "block.1", "block.2"]},
        {"stage": 1, "layers": ["head"]}])";
    // The fused LM head and loss in chunks of 5 rows (of 8 * 32 per microbatch): vocabulary-parallel, and
    // with its weight gradient computed in forward under a split backward and ZeRO-2.
    QTest::newRow("gpt tp2 head chunks") << "gpt"
                                         << R"({"tp": 2, "head_chunk_rows": 5})";
    QTest::newRow("gpt dp2 pp2 zb-h1 zero2 head chunks")
        << "gpt"
        << R"({"dp": 2, "pp": 2, "microbatches": 2, "schedule": "zb_h1", "zero": 2, "head_chunk_rows": 7})";
    // Data parallel and ZeRO.
    QTest::newRow("gpt dp2") << "gpt"
                             << R"({"dp": 2})";
    QTest::newRow("gpt dp2 zero1") << "gpt"
                                   << R"({"dp": 2, "zero": 1})";
    QTest::newRow("gpt dp2 zero2 accumulation") << "gpt"
                                                << R"({"dp": 2, "zero": 2, "microbatches": 2})";
    // The parameter all-gathers left in flight after the step, each waited for by its layer's forward.
    QTest::newRow("gpt dp2 pp2 zero1 overlap gather")
        << "gpt"
        << R"({"dp": 2, "pp": 2, "zero": 1, "microbatches": 2, "overlap_param_gather": true})";
    // Every microbatch's gradients reduce-scattered and summed in the shard (4 of them, with a pipeline).
    QTest::newRow("gpt dp2 pp2 zero2 m4") << "gpt"
                                          << R"({"dp": 2, "pp": 2, "zero": 2, "microbatches": 4})";
    QTest::newRow("gpt dp4 zero3") << "gpt"
                                   << R"({"dp": 4, "zero": 3})";
    // Tensor parallel.
    QTest::newRow("gpt tp2") << "gpt"
                             << R"({"tp": 2})";
    QTest::newRow("gpt tp4") << "gpt"
                             << R"({"tp": 4})";
    QTest::newRow("gpt tp2 sgd") << "gpt-sgd"
                                 << R"({"tp": 2})";
    QTest::newRow("gpt tp2 sequence parallel") << "gpt"
                                               << R"({"tp": 2, "sequence_parallel": true})";
    // tp_comm_overlap: the sequence-parallel all-gathers and reduce-scatters in chunks beside the GEMM rows
    // (plan/tp_overlap.h): 8 samples a microbatch, one chunk each; with a split backward (the weight
    // gradients deferred) and a recomputed block at 2 samples a microbatch (two chunks a sample).
    QTest::newRow("gpt tp2 sequence parallel overlap")
        << "gpt"
        << R"({"tp": 2, "sequence_parallel": true, "tp_comm_overlap": true})";
    QTest::newRow("gpt tp2 pp2 sequence parallel overlap zb-h1 recompute 1 of 2 blocks")
        << "gpt"
        << R"({"tp": 2, "pp": 2, "microbatches": 4, "schedule": "zb_h1", "sequence_parallel": true,
              "tp_comm_overlap": true, "recompute": "full", "recompute_layers": 1})";
    // Pipeline schedules and placements.
    QTest::newRow("gpt pp2 1f1b") << "gpt"
                                  << R"({"pp": 2, "microbatches": 4})";
    QTest::newRow("gpt pp2 gpipe") << "gpt"
                                   << R"({"pp": 2, "microbatches": 4, "schedule": "gpipe"})";
    QTest::newRow("gpt pp4 1f1b") << "gpt"
                                  << R"({"pp": 4, "microbatches": 4})";
    QTest::newRow("gpt pp2 interleaved v2")
        << "gpt"
        << R"({"pp": 2, "microbatches": 4, "schedule": "interleaved_1f1b", "virtual_chunks": 2})";
    QTest::newRow("gpt pp2 interleaved v3")
        << "gpt"
        << R"({"pp": 2, "microbatches": 2, "schedule": "interleaved_1f1b", "virtual_chunks": 3})";
    QTest::newRow("gpt pp2 zb-h1") << "gpt"
                                   << R"({"pp": 2, "microbatches": 4, "schedule": "zb_h1"})";
    QTest::newRow("gpt pp2 uneven") << "gpt" << QString(R"({"pp": 2, "microbatches": 2, %1})").arg(uneven);
    QTest::newRow("gpt pp3 recompute") << "gpt"
                                       << R"({"pp": 3, "microbatches": 4, "recompute": "full"})";
    QTest::newRow("gpt untied tp2 pp2") << "gpt-untied"
                                        << R"({"tp": 2, "pp": 2, "microbatches": 2})";
    // Combined.
    QTest::newRow("gpt dp2 tp2 pp2") << "gpt"
                                     << R"({"dp": 2, "tp": 2, "pp": 2, "microbatches": 2})";
    QTest::newRow("gpt tp2 pp2 zb-h1") << "gpt"
                                       << R"({"tp": 2, "pp": 2, "microbatches": 4, "schedule": "zb_h1"})";
    QTest::newRow("gpt dp2 pp2 zero3") << "gpt"
                                       << R"({"dp": 2, "pp": 2, "zero": 3, "microbatches": 2})";
    QTest::newRow("gpt tp4 pp2 sequence parallel zb-h1")
        << "gpt"
        << R"({"tp": 4, "pp": 2, "sequence_parallel": true, "microbatches": 4, "schedule": "zb_h1"})";
    QTest::newRow("gpt dp2 tp2 sequence parallel recompute zero1")
        << "gpt"
        << R"({"dp": 2, "tp": 2, "sequence_parallel": true, "recompute": "full", "zero": 1,
                        "microbatches": 2})";
    QTest::newRow("gpt dp2 tp2 zero2 recompute") << "gpt"
                                                 << R"({"dp": 2, "tp": 2, "zero": 2, "recompute": "full"})";
    QTest::newRow("gpt dp2 pp2 interleaved zero1 recompute")
        << "gpt"
        << R"({"dp": 2, "pp": 2, "microbatches": 4, "schedule": "interleaved_1f1b", "virtual_chunks": 2,
              "zero": 1, "recompute": "full"})";
    // vit.
    // Selective recompute (the attention matrix re-made in backward) and Megatron's partial full recompute
    // (the first recompute_layers blocks of every chunk).
    QTest::newRow("gpt pp2 selective") << "gpt"
                                       << R"({"pp": 2, "microbatches": 4, "recompute": "selective"})";
    QTest::newRow("gpt dp2 tp2 selective zero1")
        << "gpt"
        << R"({"dp": 2, "tp": 2, "recompute": "selective", "zero": 1})";
    QTest::newRow("gpt tp2 pp2 sequence parallel zb-h1 selective")
        << "gpt"
        << R"({"tp": 2, "pp": 2, "microbatches": 4, "schedule": "zb_h1", "sequence_parallel": true,
              "recompute": "selective"})";
    QTest::newRow("gpt pp2 recompute 1 of 2 blocks")
        << "gpt"
        << R"({"pp": 2, "microbatches": 4, "recompute": "full", "recompute_layers": 1})";
    QTest::newRow("gpt tp2 pp2 zb-h1 recompute 1 of 2 blocks")
        << "gpt"
        << R"({"tp": 2, "pp": 2, "microbatches": 4, "schedule": "zb_h1", "recompute": "full",
              "recompute_layers": 1})";
    // llama under every kind of split: q and kv heads over TP (one kv head a rank at tp 2), its sequence
    // parallelism, ZeRO, the zero-bubble split backward of its three q/k/v and two gate/up GEMMs, recompute.
    QTest::newRow("llama tp2") << "llama"
                               << R"({"tp": 2})";
    QTest::newRow("llama dp2 tp2 pp2 tied") << "llama-tied"
                                            << R"({"dp": 2, "tp": 2, "pp": 2, "microbatches": 2})";
    QTest::newRow("llama dp2 zero3 accumulation") << "llama"
                                                  << R"({"dp": 2, "zero": 3, "microbatches": 2})";
    QTest::newRow("llama tp2 pp2 sequence parallel zb-h1")
        << "llama"
        << R"({"tp": 2, "pp": 2, "microbatches": 4, "sequence_parallel": true, "schedule": "zb_h1"})";
    QTest::newRow("llama pp2 interleaved selective")
        << "llama"
        << R"({"pp": 2, "microbatches": 4, "schedule": "interleaved_1f1b", "virtual_chunks": 2,
              "recompute": "selective"})";
    QTest::newRow("llama dp2 tp2 recompute zero2") << "llama"
                                                   << R"({"dp": 2, "tp": 2, "zero": 2, "recompute": "full"})";
    QTest::newRow("llama-moe tp2") << "llama-moe"
                                   << R"({"tp": 2})";
    QTest::newRow("llama-moe tp2 sequence parallel") << "llama-moe"
                                                     << R"({"tp": 2, "sequence_parallel": true})";
    // tp_comm_overlap with grouped-query attention at one sample a microbatch (four chunks of the sample's
    // piece), and with experts (the attention's collectives overlapped, the experts' MLP as without).
    QTest::newRow("llama tp2 sequence parallel overlap m8")
        << "llama"
        << R"({"tp": 2, "sequence_parallel": true, "tp_comm_overlap": true, "microbatches": 8})";
    QTest::newRow("llama-moe tp2 sequence parallel overlap")
        << "llama-moe"
        << R"({"tp": 2, "sequence_parallel": true, "tp_comm_overlap": true})";
    QTest::newRow("llama-moe dp2 pp2 zero1") << "llama-moe-noaux"
                                             << R"({"dp": 2, "pp": 2, "zero": 1, "microbatches": 2})";
    QTest::newRow("llama-moe pp2 zb-h1 recompute")
        << "llama-moe-noaux"
        << R"({"pp": 2, "microbatches": 4, "schedule": "zb_h1", "recompute": "full"})";
    // Expert parallelism: the 4 experts over 2 replicas (all-to-all dispatch), alone, with 2 replicas of each
    // expert (expert-data-parallel groups of 2), with tp and sequence parallelism, and over a pipeline.
    QTest::newRow("llama-moe dp2 ep2") << "llama-moe-noaux"
                                       << R"({"dp": 2, "ep": 2})";
    QTest::newRow("llama-moe dp4 ep2") << "llama-moe-noaux"
                                       << R"({"dp": 4, "ep": 2})";
    QTest::newRow("llama-moe dp2 ep2 tp2 sequence parallel")
        << "llama-moe-noaux"
        << R"({"dp": 2, "ep": 2, "tp": 2, "sequence_parallel": true})";
    QTest::newRow("llama-moe dp2 ep2 pp2 1f1b") << "llama-moe-noaux"
                                                << R"({"dp": 2, "ep": 2, "pp": 2, "microbatches": 2})";
    // ZeRO with expert parallelism (Megatron-Core's distributed optimizer with experts): the dense units
    // sharded over dp, each rank's experts over their dp / ep replicas (one replica at dp2 ep2: whole;
    // two at dp4 ep2), reduce-scattered every microbatch (ZeRO-2) and gathered per use (ZeRO-3).
    QTest::newRow("llama-moe dp2 ep2 zero1") << "llama-moe-noaux"
                                             << R"({"dp": 2, "ep": 2, "zero": 1})";
    QTest::newRow("llama-moe dp4 ep2 zero2 accumulation")
        << "llama-moe-noaux"
        << R"({"dp": 4, "ep": 2, "zero": 2, "microbatches": 2})";
    QTest::newRow("llama-moe dp4 ep2 pp2 zero3")
        << "llama-moe-noaux"
        << R"({"dp": 4, "ep": 2, "pp": 2, "zero": 3, "microbatches": 2})";
    // Context parallelism: ring attention over 2 and 4 ranks (each holding two opposite chunks of every
    // sequence), with data parallelism and ZeRO over the dp x cp ranks, tp with sequence parallelism, a
    // zero-bubble pipeline with full recompute, and selective recompute (nothing for it to drop).
    QTest::newRow("llama cp2") << "llama"
                               << R"({"cp": 2})";
    QTest::newRow("llama cp4 selective") << "llama"
                                         << R"({"cp": 4, "recompute": "selective"})";
    QTest::newRow("llama dp2 cp2 zero2 accumulation")
        << "llama"
        << R"({"dp": 2, "cp": 2, "zero": 2, "microbatches": 2})";
    QTest::newRow("llama cp2 tp2 sequence parallel") << "llama"
                                                     << R"({"cp": 2, "tp": 2, "sequence_parallel": true})";
    // The auto-planner's kind of plan at 405B: context parallelism under sequence parallelism with its
    // collectives in chunks, the sequence pieces (of each rank's cp slice) sent between two stages.
    QTest::newRow("llama cp2 tp2 pp2 sequence parallel overlap")
        << "llama"
        << R"({"cp": 2, "tp": 2, "pp": 2, "microbatches": 2, "sequence_parallel": true,
               "tp_comm_overlap": true})";
    // gpt's learned positions under context parallelism: each rank adds its two chunks' rows of wpe, their
    // gradients summed over the dp x cp group; with tp (vocabulary-parallel embedding) and a pipeline.
    QTest::newRow("gpt cp2") << "gpt"
                             << R"({"cp": 2})";
    QTest::newRow("gpt cp2 tp2 pp2") << "gpt"
                                     << R"({"cp": 2, "tp": 2, "pp": 2, "microbatches": 2})";
    QTest::newRow("gpt dp2 cp2 zero1") << "gpt"
                                       << R"({"dp": 2, "cp": 2, "zero": 1})";
    QTest::newRow("llama cp2 pp2 zb-h1 recompute")
        << "llama"
        << R"({"cp": 2, "pp": 2, "microbatches": 4, "schedule": "zb_h1", "recompute": "full"})";
    // Context with expert parallelism: ep is carved out of the dp x cp ranks (Megatron-Core's layout): the
    // experts' all-to-all within a replica's ring, alone and with two replicas of each expert (the replicas
    // then sum over dp). (dp2 cp2 ep4, one expert a rank, trains as one process does too, but its busiest
    // rank's routed rows peak 12.5% above the balanced prediction, past the rows' 12% bound.)
    QTest::newRow("llama-moe cp2 ep2") << "llama-moe-noaux"
                                       << R"({"cp": 2, "ep": 2})";
    QTest::newRow("llama-moe dp2 cp2 ep2") << "llama-moe-noaux"
                                           << R"({"dp": 2, "cp": 2, "ep": 2})";
    QTest::newRow("llama-moe dp2 cp2 ep2 zero1") << "llama-moe-noaux"
                                                 << R"({"dp": 2, "cp": 2, "ep": 2, "zero": 1})";
    QTest::newRow("vit pp2 selective") << "vit"
                                       << R"({"pp": 2, "microbatches": 2, "recompute": "selective"})";
    QTest::newRow("vit dp2 tp2 zero2") << "vit"
                                       << R"({"dp": 2, "tp": 2, "zero": 2})";
    QTest::newRow("vit pp2 zb-h1") << "vit"
                                   << R"({"pp": 2, "microbatches": 2, "schedule": "zb_h1"})";
    QTest::newRow("vit pp2 interleaved")
        << "vit"
        << R"({"pp": 2, "microbatches": 2, "schedule": "interleaved_1f1b", "virtual_chunks": 2})";
    // cnn with synchronised BatchNorm: every replica normalises with the whole batch's statistics (the sums
    // all-reduced over the data-parallel group), so any data-parallel split trains as one process does; one
    // microbatch per replica, as the reference (BatchNorm's statistics are a microbatch's).
    QTest::newRow("cnn dp4 sync batchnorm") << "cnn"
                                            << R"({"dp": 4, "batchnorm": "sync"})";
    QTest::newRow("cnn dp2 pp2 sync batchnorm zero1")
        << "cnn"
        << R"({"dp": 2, "pp": 2, "batchnorm": "sync", "zero": 1})";
    QTest::newRow("vit tp2 pp2 uneven recompute")
        << "vit"
        << QString(R"({"tp": 2, "pp": 2, "microbatches": 2, "recompute": "full", %1})").arg(unevenVit);
  }

  void planMatchesOneProcess() {
    QFETCH(QString, ref);
    QFETCH(QString, parallel);
    if ((ref == "vit" || ref == "cnn") &&
        !QFile::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
      QSKIP("dataset-fashion-mnist is not installed");
    const Reference* one = reference(ref);
    QVERIFY(one);
    auto plan = nlohmann::json::parse(parallel.toStdString());
    // Test rows may carry "head_chunk_rows" (not a config key): the run's MESHSTUDIO_HEAD_CHUNK_ROWS, so the
    // gpt head's fused LM head and loss runs in many chunks (the reference runs in one).
    const int chunkRows = plan.value("head_chunk_rows", 0);
    plan.erase("head_chunk_rows");
    const int ranks = ranksOf(plan);
    const QString name = QString("run%1").arg(++m_runs);
    const QString config =
        writeCpuConfig(m_tmp.path(), name, body(ref) + ", \"parallel\": " + plan.dump(), ranks);
    const QString dir = m_tmp.path() + "/" + name;
    QStringList mpiArgs{"--oversubscribe", "-np", QString::number(ranks)};
    if (chunkRows > 0) {
      qputenv("MESHSTUDIO_HEAD_CHUNK_ROWS", QByteArray::number(chunkRows));
      mpiArgs << "-x"
              << "MESHSTUDIO_HEAD_CHUNK_ROWS";
    }
    ProcessResult r =
        runProcess(kMpiexec, mpiArgs + QStringList{kEngine, "train", config, "--run-dir", dir, "--quiet"});
    qunsetenv("MESHSTUDIO_HEAD_CHUNK_ROWS");
    QVERIFY2(r.code == 0, qPrintable(r.err));
    // bench/fidelity.py reads every plan's run back against its prediction: MS_EQUIVALENCE_KEEP=DIR keeps a
    // copy of each run folder (its config and metrics stream) as DIR/<row name>.
    if (const QByteArray keep = qgetenv("MS_EQUIVALENCE_KEEP"); !keep.isEmpty()) {
      const std::filesystem::path to = std::filesystem::path(keep.toStdString()) /
                                       QString(QTest::currentDataTag()).replace(' ', '_').toStdString();
      std::error_code ec;
      std::filesystem::create_directories(to, ec);
      for (const char* file : {"config.json", "metrics.jsonl"})
        std::filesystem::copy_file(std::filesystem::path(dir.toStdString()) / file, to / file,
                                   std::filesystem::copy_options::overwrite_existing, ec);
      QVERIFY2(!ec, ec.message().c_str());
    }

    // Every step's loss and the evaluation.
    const QString mismatch = stepLossMismatch(one->dir, dir);
    QVERIFY2(mismatch.isEmpty(), qPrintable(mismatch));
    const auto e1 = metricLosses(one->dir + "/metrics.jsonl", "eval");
    const auto e2 = metricLosses(dir + "/metrics.jsonl", "eval");
    QVERIFY(std::abs(e1.at(kSteps) - e2.at(kSteps)) <= 1e-5 * std::abs(e1.at(kSteps)));

    // Final parameters (full tensors assembled from every rank's shards). AdamW's normalised update turns a
    // rounding difference in a near-zero gradient into a visible step, so it gets a looser bound than SGD.
    const double worst =
        worstRelativeL2(ms::checkpointDirName(one->dir.toStdString(), kSteps) + "/model.safetensors",
                        ms::checkpointDirName(dir.toStdString(), kSteps) + "/model.safetensors");
    QVERIFY2(worst >= 0, "a checkpoint is unreadable or lacks a tensor");
    QVERIFY2(worst < (ref == "gpt-sgd" ? 1e-6 : 5e-4), qPrintable(QString::number(worst)));

    // Every rank's spans on one clock: each layer's forward runs once per microbatch on every replica,
    // context- parallel and TP rank, and a rank's spans never overlap.
    const auto spans = lastLine(dir + "/metrics.jsonl", "spans");
    QCOMPARE(static_cast<int>(spans["ranks"].size()), ranks);
    const int layers = ref == "vit" ? 5 : ref == "cnn" ? 4 : 6;
    const int microbatches = plan.value("microbatches", 1);
    int forwards = 0, weights = 0;
    for (const auto& rank : spans["ranks"]) {
      const auto& list = rank["spans"];
      for (size_t i = 0; i < list.size(); ++i) {
        forwards += list[i]["action"] == "F";
        weights += list[i]["action"] == "W";
        if (i > 0) QVERIFY(list[i]["start"].get<double>() >= list[i - 1]["end"].get<double>() - 1e-9);
      }
    }
    QCOMPARE(forwards,
             plan.value("dp", 1) * plan.value("cp", 1) * plan.value("tp", 1) * microbatches * layers);
    if (plan.value("schedule", "") == "zb_h1") QCOMPARE(weights, forwards);  // every backward split in two

    // Every rank's memory; ZeRO shards what it says it shards.
    const auto memory = lastLine(dir + "/metrics.jsonl", "memory");
    QCOMPARE(static_cast<int>(memory["ranks"].size()), ranks);
    const int zero = plan.value("zero", 0);
    const int dp = plan.value("dp", 1);
    if (zero >= 1 && plan.value("tp", 1) == 1 && plan.value("pp", 1) == 1) {
      const double ref1 = one->memory["ranks"][0]["current"]["optimizer"].get<double>();
      const double opt = memory["ranks"][0]["current"]["optimizer"].get<double>();
      QVERIFY2(opt < ref1 / dp * 1.2,
               qPrintable(QString("optimizer %1 vs %2 / %3").arg(opt).arg(ref1).arg(dp)));
      if (zero == 3) {
        const double p1 = one->memory["ranks"][0]["current"]["parameters"].get<double>();
        const double p = memory["ranks"][0]["current"]["parameters"].get<double>();
        QVERIFY2(p < p1 / dp * 1.2, qPrintable(QString("parameters %1 vs %2 / %3").arg(p).arg(p1).arg(dp)));
      }
    }
    const auto start = lastLine(dir + "/metrics.jsonl", "run_start");
    QCOMPARE(static_cast<int>(start["predicted"]["ranks"].size()), ranks);
    const QString states = modelStateMismatch(start, memory);
    QVERIFY2(states.isEmpty(), qPrintable(states));

    // The plan's activation memory is the engine's, rank by rank, to rounding. Under expert parallelism the
    // rows a rank's experts receive vary from step to step around the balanced share the plan counts (its
    // term: tst_memory_model expertParallelMemory): the busiest rank's peak measured 8.7-9.9% above it in
    // these rows (dropless routing of 16-32 tokens a rank and microbatch over 4 experts; the routing is
    // deterministic, so are these figures); the bound is 12%.
    const QString activations = activationMismatch(start, memory, plan.value("ep", 1) > 1 ? 0.12 : 0.005);
    QVERIFY2(activations.isEmpty(), qPrintable(activations));
    const QString other = otherMismatch(start, memory, ref.startsWith("llama-moe"));
    QVERIFY2(other.isEmpty(), qPrintable(other));
    const QString total =
        ref.startsWith("llama-moe") ? unevenRoutingMismatch(start, memory) : totalMismatch(start, memory);
    QVERIFY2(total.isEmpty(), qPrintable(total));
  }

  // bf16 mixed precision over several ranks (runtime/parameters.h): bf16 working parameters on every replica,
  // fp32 master weights sharded with the moments from ZeRO-1 on, the updated slices rounded and all-gathered
  // in bf16 (ZeRO 1-2) or kept as bf16 shards gathered per use (ZeRO-3). The bound is 1e-4 relative, ten
  // times the fp32 suite's, and why: gradients are reduced in fp32, so the replicas' (and microbatches')
  // sums differ from one process's by fp32 rounding (about 1e-7), as in fp32; but every parameter the
  // layers read is then rounded to bf16 (a step of 2^-8 relative), and a master weight that the two runs
  // put on opposite sides of a rounding boundary makes its working weight differ by that whole step. Those
  // few flips move the loss by more than fp32 noise does: measured at most 1.1e-5 relative over these rows
  // (two microbatches, step 6). A working copy that misses the all-gather is off by 1.5e-2 at step 2
  // (measured with the all-gather skipped), 150 times the bound. Model states are the predicted ones on
  // every rank.
  //
  // With "grad_precision": "bf16" the reference is one process keeping bf16 gradients too. Each op then
  // rounds the gradient it accumulates into (2^-9 relative), and the data-parallel reduction adds the
  // replicas' bf16 gradients rounding each sum, so the two runs' gradients differ by bf16 roundings, not fp32
  // ones; Adam's normalisation keeps what reaches the weights small: measured at most 2.9e-5 relative over
  // these rows, under the same 1e-4 bound (a replica that skips the bf16 all-reduce is off by 2.2e-3, 22
  // times the bound). The gradient norm catches what Adam hides (a reduction off by a factor): within 5e-3
  // of the reference's every step (measured at most 7.6e-4).
  //
  // Tensor parallelism in bf16 also moves its activation collectives in bf16 (runtime allReduceActivations):
  // each rank's partial sum of a row-parallel GEMM, and of an input gradient, is rounded to bf16 before the
  // sum, one rounding (2^-9 relative) more than one process makes on values it rounds at the layer's output
  // anyway. Measured on this suite's model, 10 steps: tp2 4.0e-5, tp2 sequence parallel 4.6e-5, tp4 3.8e-5,
  // tp2 pp2 3.3e-5 relative loss difference, under the same bound; the saved activations are bf16 too
  // (q|k|v, softmax, residual, GELU input), rounded where forward computes them, so both runs differentiate
  // at the values they computed with.
  void bf16MatchesOneProcess_data() {
    QTest::addColumn<QString>("parallel");
    QTest::newRow("gpt dp2") << R"({"dp": 2, "precision": "bf16"})";
    QTest::newRow("gpt dp2 zero1") << R"({"dp": 2, "zero": 1, "precision": "bf16"})";
    QTest::newRow("gpt dp2 zero2 overlap gather")
        << R"({"dp": 2, "zero": 2, "precision": "bf16", "overlap_param_gather": true})";
    QTest::newRow("gpt dp2 zero2 accumulation")
        << R"({"dp": 2, "zero": 2, "microbatches": 2, "precision": "bf16"})";
    QTest::newRow("gpt dp2 zero3") << R"({"dp": 2, "zero": 3, "precision": "bf16"})";
    QTest::newRow("gpt dp2 pp2 zero1")
        << R"({"dp": 2, "pp": 2, "zero": 1, "microbatches": 2, "precision": "bf16"})";
    // bf16 gradients: all-reduced (ZeRO 0-1), reduce-scattered (2, 3), summed over the tied embedding's
    // group (pp) and, under sequence parallelism, the LayerNorm gradients over the TP group, all in bf16.
    QTest::newRow("gpt dp2 bf16 grads") << R"({"dp": 2, "precision": "bf16", "grad_precision": "bf16"})";
    QTest::newRow("gpt dp2 zero2 accumulation bf16 grads")
        << R"({"dp": 2, "zero": 2, "microbatches": 2, "precision": "bf16", "grad_precision": "bf16"})";
    QTest::newRow("gpt dp2 zero3 bf16 grads")
        << R"({"dp": 2, "zero": 3, "precision": "bf16", "grad_precision": "bf16"})";
    QTest::newRow("gpt dp2 pp2 zero1 bf16 grads")
        << R"({"dp": 2, "pp": 2, "zero": 1, "microbatches": 2, "precision": "bf16",
              "grad_precision": "bf16"})";
    QTest::newRow("gpt tp2") << R"({"tp": 2, "precision": "bf16"})";
    QTest::newRow("gpt tp2 sequence parallel bf16 grads")
        << R"({"tp": 2, "sequence_parallel": true, "precision": "bf16", "grad_precision": "bf16"})";
    QTest::newRow("gpt dp2 pp2 selective")
        << R"({"dp": 2, "pp": 2, "microbatches": 2, "recompute": "selective", "precision": "bf16"})";
    QTest::newRow("gpt tp2 pp2 recompute 1 of 2 blocks")
        << R"({"tp": 2, "pp": 2, "microbatches": 2, "recompute": "full", "recompute_layers": 1,
              "precision": "bf16"})";
    // llama in bf16: the kept gate|up pair and SwiGLU output, the rotated q|k|v, bf16 TP collectives.
    QTest::newRow("llama dp2 tp2 zero1")
        << R"({"model": "llama", "dp": 2, "tp": 2, "zero": 1, "precision": "bf16"})";
    QTest::newRow("llama-moe tp2") << R"({"model": "llama-moe", "tp": 2, "precision": "bf16"})";
    // Expert parallelism in bf16: the kept received rows in bf16, the all-to-alls carry bf16 rows.
    QTest::newRow("llama-moe dp2 ep2")
        << R"({"model": "llama-moe-noaux", "dp": 2, "ep": 2, "precision": "bf16"})";
    // The distributed optimizer with experts: fp32 master weights and moments of the experts sharded over
    // their two replicas.
    QTest::newRow("llama-moe dp4 ep2 zero1")
        << R"({"model": "llama-moe-noaux", "dp": 4, "ep": 2, "zero": 1, "precision": "bf16"})";
    QTest::newRow("llama tp2 pp2 sequence parallel bf16 grads")
        << R"({"model": "llama", "tp": 2, "pp": 2, "microbatches": 2, "sequence_parallel": true,
              "precision": "bf16", "grad_precision": "bf16"})";
    // tp_comm_overlap in bf16: each chunk's partial sums rounded to bf16 before its reduce-scatter, as the
    // whole tensor's are without the overlap; the kept LayerNorm outputs gathered as bf16.
    QTest::newRow("gpt tp2 sequence parallel overlap")
        << R"({"tp": 2, "sequence_parallel": true, "tp_comm_overlap": true, "microbatches": 4,
              "precision": "bf16"})";
    QTest::newRow("llama tp2 sequence parallel overlap bf16 grads")
        << R"({"model": "llama", "tp": 2, "sequence_parallel": true, "tp_comm_overlap": true,
              "microbatches": 2, "precision": "bf16", "grad_precision": "bf16"})";
    // Context parallelism in bf16: ring attention computes in fp32 on the bf16-rounded q, k and v, as the
    // one process's attention does, so only the order of the softmax sums differs.
    QTest::newRow("gpt cp2 bf16 grads") << R"({"cp": 2, "precision": "bf16", "grad_precision": "bf16"})";
    QTest::newRow("llama cp2 pp2") << R"({"model": "llama", "cp": 2, "pp": 2, "microbatches": 2,
                                          "precision": "bf16"})";
  }
  void bf16MatchesOneProcess() {
    QFETCH(QString, parallel);
    auto plan = nlohmann::json::parse(parallel.toStdString());
    // Rows may name the reference model ("model", not a config key); gpt otherwise.
    const QString model = QString::fromStdString(plan.value("model", std::string("gpt")));
    plan.erase("model");
    const QString grads = QString::fromStdString(plan.value("grad_precision", std::string("fp32")));
    const Reference* one = reference(model, "bf16", grads);
    QVERIFY(one);
    const Reference* fp32 = reference(model);
    QVERIFY(fp32);
    const int ranks = ranksOf(plan);
    const QString name = QString("bf16-%1").arg(++m_runs);
    const QString config =
        writeCpuConfig(m_tmp.path(), name, body(model) + ", \"parallel\": " + plan.dump(), ranks);
    const QString dir = m_tmp.path() + "/" + name;
    ProcessResult r = runMpi(kMpiexec, kEngine, ranks, {"train", config, "--run-dir", dir, "--quiet"});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    const QString mismatch = stepLossMismatch(one->dir, dir, 1e-4);
    QVERIFY2(mismatch.isEmpty(), qPrintable(mismatch));
    // bf16 differs from fp32 (the rounding is applied), so matching the bf16 run above is no accident.
    const auto f32 = metricLosses(fp32->dir + "/metrics.jsonl", "step");
    QVERIFY(f32.at(kSteps) != metricLosses(one->dir + "/metrics.jsonl", "step").at(kSteps));
    if (grads == "bf16") {
      // bf16 gradients are not the fp32 ones either.
      const Reference* fp32Grads = reference(model, "bf16");
      QVERIFY(fp32Grads);
      QVERIFY(metricLosses(fp32Grads->dir + "/metrics.jsonl", "step") !=
              metricLosses(one->dir + "/metrics.jsonl", "step"));
      const auto norms = [](const QString& d) {
        std::map<int, double> out;
        std::ifstream in((d + "/metrics.jsonl").toStdString());
        std::string line;
        while (std::getline(in, line)) {
          const auto j = nlohmann::json::parse(line);
          if (j["type"] == "step") out[j["step"].get<int>()] = j["grad_norm"].get<double>();
        }
        return out;
      };
      const auto want = norms(one->dir), got = norms(dir);
      QCOMPARE(got.size(), want.size());
      for (const auto& [step, n] : want)
        QVERIFY2(
            std::abs(got.at(step) - n) <= 5e-3 * n,
            qPrintable(
                QString("step %1: gradient norm %2, one process %3").arg(step).arg(got.at(step)).arg(n)));
    }
    const auto memory = lastLine(dir + "/metrics.jsonl", "memory");
    const auto start = lastLine(dir + "/metrics.jsonl", "run_start");
    const QString states = modelStateMismatch(start, memory);
    QVERIFY2(states.isEmpty(), qPrintable(states));
    const QString activations = activationMismatch(start, memory, plan.value("ep", 1) > 1 ? 0.12 : 0.005);
    QVERIFY2(activations.isEmpty(), qPrintable(activations));
    // ZeRO-1 and up shard the master weights with the moments: 12 bytes per element / dp against the fp32
    // one process's 8 (moments only, its values being what it updates).
    // (Without tensor or pipeline parallelism, which split the optimizer state further.)
    if (plan.value("zero", 0) >= 1 && plan.value("pp", 1) == 1 && plan.value("tp", 1) == 1) {
      const double fp32Optimizer = fp32->memory["ranks"][0]["current"]["optimizer"].get<double>();
      const double dp = plan.value("dp", 1);
      for (const auto& rank : memory["ranks"]) {
        const double o = rank["current"]["optimizer"].get<double>();
        QVERIFY2(o >= 1.5 * fp32Optimizer / dp && o <= 1.5 * fp32Optimizer / dp * 1.02,
                 qPrintable(QString("optimizer %1, fp32 one process %2").arg(o).arg(fp32Optimizer)));
      }
    }
  }

  // The device code path, run on the CPU's emulated device (kernels/backend.h: backend memory the host cannot
  // touch, every tensor message staged through host memory as on a GPU without NCCL), trains bit for bit
  // like the plain CPU path: the same kernels on the same data, so any difference is a host/device mix-up
  // (a missed upload, a stale download, a message staged from the wrong buffer), and a host access to device
  // memory crashes the rank.
  void emulatedDeviceMatchesCpu_data() {
    QTest::addColumn<QString>("ref");
    QTest::addColumn<QString>("parallel");
    QTest::newRow("gpt 1 rank") << "gpt"
                                << "{}";
    QTest::newRow("vit 1 rank") << "vit"
                                << "{}";
    QTest::newRow("gpt dp2 zero3 accumulation") << "gpt"
                                                << R"({"dp": 2, "zero": 3, "microbatches": 2})";
    QTest::newRow("gpt dp2 zero1") << "gpt"
                                   << R"({"dp": 2, "zero": 1})";
    // The staged gathers land in device memory only when waited for: a layer that ran before waiting for its
    // parameters would read the last step's.
    QTest::newRow("gpt dp2 zero1 overlap gather") << "gpt"
                                                  << R"({"dp": 2, "zero": 1, "overlap_param_gather": true})";
    QTest::newRow("gpt tp2 sequence parallel") << "gpt"
                                               << R"({"tp": 2, "sequence_parallel": true})";
    // The chunks' staged collectives land in device memory only when waited for: GEMM rows that ran before
    // their chunk arrived would read what the slot held before.
    QTest::newRow("gpt tp2 sequence parallel overlap")
        << "gpt"
        << R"({"tp": 2, "sequence_parallel": true, "tp_comm_overlap": true, "microbatches": 2})";
    QTest::newRow("gpt untied tp2 pp2 zb-h1")
        << "gpt-untied"
        << R"({"tp": 2, "pp": 2, "microbatches": 4, "schedule": "zb_h1"})";
    QTest::newRow("gpt pp2 interleaved recompute")
        << "gpt"
        << R"({"pp": 2, "microbatches": 4, "schedule": "interleaved_1f1b", "virtual_chunks": 2,
              "recompute": "full"})";
    QTest::newRow("gpt tp2 selective") << "gpt"
                                       << R"({"tp": 2, "recompute": "selective"})";
    QTest::newRow("vit dp2 tp2 zero2") << "vit"
                                       << R"({"dp": 2, "tp": 2, "zero": 2})";
    // Expert parallelism: the all-to-alls staged through host memory, as ranks sharing a GPU run them.
    QTest::newRow("llama-moe dp2 ep2 tp2") << "llama-moe-noaux"
                                           << R"({"dp": 2, "ep": 2, "tp": 2})";
    // Context parallelism: ring attention's key/value blocks and their gradients staged through host memory.
    QTest::newRow("llama cp2 tp2") << "llama"
                                   << R"({"cp": 2, "tp": 2})";
    // gpt's learned positions: its two chunks' rows of wpe copied on the device, in bf16 with bf16 gradients.
    QTest::newRow("gpt cp2 bf16 grads") << "gpt"
                                        << R"({"cp": 2, "precision": "bf16", "grad_precision": "bf16"})";
    // bf16: the working parameters are rounded from the master on the device, all-gathered (ZeRO-1) or
    // gathered per use (ZeRO-3) and read by every op.
    QTest::newRow("gpt dp2 zero1 bf16") << "gpt"
                                        << R"({"dp": 2, "zero": 1, "precision": "bf16"})";
    QTest::newRow("gpt dp2 zero3 bf16") << "gpt"
                                        << R"({"dp": 2, "zero": 3, "precision": "bf16"})";
    // bf16 gradients: widened into scratch and rounded back by each op, reduce-scattered through the host
    // staging as 2-byte elements.
    QTest::newRow("gpt dp2 zero2 bf16 grads")
        << "gpt"
        << R"({"dp": 2, "zero": 2, "microbatches": 2, "precision": "bf16", "grad_precision": "bf16"})";
  }

  void emulatedDeviceMatchesCpu() {
    QFETCH(QString, ref);
    QFETCH(QString, parallel);
    if (ref == "vit" && !QFile::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
      QSKIP("dataset-fashion-mnist is not installed");
    const auto plan = nlohmann::json::parse(parallel.toStdString());
    const int ranks = ranksOf(plan);
    const QString name = QString("emu%1").arg(++m_runs);
    const QString config =
        writeCpuConfig(m_tmp.path(), name, body(ref) + ", \"parallel\": " + parallel.toStdString(), ranks);
    const QString plain = m_tmp.path() + "/" + name + "-cpu", emulated = m_tmp.path() + "/" + name + "-emu";
    ProcessResult a = runMpi(kMpiexec, kEngine, ranks, {"train", config, "--run-dir", plain, "--quiet"});
    QVERIFY2(a.code == 0, qPrintable(a.err));
    ProcessResult b = runMpi(kMpiexec, kEngine, ranks,
                             {"train", config, "--run-dir", emulated, "--quiet", "--emulate-device"});
    QVERIFY2(b.code == 0, qPrintable(b.err));
    QVERIFY2(b.err.contains("emulated device"), qPrintable(b.err));
    const auto l1 = metricLosses(plain + "/metrics.jsonl", "step");
    const auto l2 = metricLosses(emulated + "/metrics.jsonl", "step");
    QCOMPARE(l2.size(), size_t(kSteps));
    for (const auto& [step, loss] : l1) QCOMPARE(l2.at(step), loss);  // exactly
    QCOMPARE(metricLosses(emulated + "/metrics.jsonl", "eval"),
             metricLosses(plain + "/metrics.jsonl", "eval"));
    QCOMPARE(worstRelativeL2(ms::checkpointDirName(plain.toStdString(), kSteps) + "/model.safetensors",
                             ms::checkpointDirName(emulated.toStdString(), kSteps) + "/model.safetensors"),
             0.0);
    // The emulated device says so in run_start, and every rank's spans and memory still arrive.
    const auto start = lastLine(emulated + "/metrics.jsonl", "run_start");
    QCOMPARE(start["device"]["emulated"].get<bool>(), true);
    QCOMPARE(static_cast<int>(lastLine(emulated + "/metrics.jsonl", "spans")["ranks"].size()), ranks);
    const auto m1 = lastLine(plain + "/metrics.jsonl", "memory"),
               m2 = lastLine(emulated + "/metrics.jsonl", "memory");
    QCOMPARE(m2["ranks"][0]["current"]["parameters"], m1["ranks"][0]["current"]["parameters"]);
    QCOMPARE(m2["ranks"][0]["current"]["optimizer"], m1["ranks"][0]["current"]["optimizer"]);
  }

  // Offload (plan/model_state.h) moves the optimizer state and step to the host without changing a bit: the
  // same plan with "offload": "optimizer" (or "parameters", which also keeps the ZeRO-3 parameter and
  // gradient shards there, uploading a shard before each gather), run on the emulated device (the host/device
  // split of a GPU; the host's step runs the CPU backend's optimizer), gives the losses, evaluation, final
  // parameters and optimizer state of the plain run exactly. The device holds no optimizer state; the host
  // holds what the plan predicts, category by category, on every rank (the store pads parameters as in
  // modelStateMismatch).
  void offloadTrainsBitForBit_data() {
    QTest::addColumn<QString>("parallel");
    QTest::addColumn<QString>("offload");
    QTest::newRow("dp2 zero0 bf16 grads") << R"({"dp": 2, "precision": "bf16", "grad_precision": "bf16"})"
                                          << "optimizer";
    QTest::newRow("dp2 zero1") << R"({"dp": 2, "zero": 1, "precision": "bf16"})"
                               << "optimizer";
    // The auto-planner pairs offload with ZeRO-1's parameter all-gather beside the next forward.
    QTest::newRow("dp2 zero1 overlap gather")
        << R"({"dp": 2, "zero": 1, "precision": "bf16", "overlap_param_gather": true})"
        << "optimizer";
    QTest::newRow("dp2 zero3 accumulation")
        << R"({"dp": 2, "zero": 3, "microbatches": 2, "precision": "bf16", "grad_precision": "bf16"})"
        << "optimizer";
    QTest::newRow("tp2 pp2 zero0") << R"({"tp": 2, "pp": 2, "microbatches": 2, "precision": "bf16"})"
                                   << "optimizer";
    // Expert parallelism: the experts' state, sharded over their two replicas, goes to the host too.
    QTest::newRow("llama-moe dp4 ep2 zero1")
        << R"({"model": "llama-moe-noaux", "dp": 4, "ep": 2, "zero": 1, "precision": "bf16"})"
        << "optimizer";
    QTest::newRow("parameters dp2 zero3 accumulation")
        << R"({"dp": 2, "zero": 3, "microbatches": 2, "precision": "bf16", "grad_precision": "bf16"})"
        << "parameters";
    QTest::newRow("parameters dp2 pp2 zero3") << R"({"dp": 2, "pp": 2, "zero": 3, "microbatches": 2,
                                                    "precision": "bf16"})"
                                              << "parameters";
  }
  void offloadTrainsBitForBit() {
    QFETCH(QString, parallel);
    QFETCH(QString, offload);
    auto plan = nlohmann::json::parse(parallel.toStdString());
    // Rows may name the model ("model", not a config key); gpt otherwise.
    const std::string model = plan.value("model", std::string("gpt"));
    plan.erase("model");
    const int ranks = ranksOf(plan);
    const QString name = QString("offload%1").arg(++m_runs);
    const QString config = writeCpuConfig(
        m_tmp.path(), name, body(QString::fromStdString(model)) + ", \"parallel\": " + plan.dump(), ranks);
    plan["offload"] = offload.toStdString();
    const QString offConfig =
        writeCpuConfig(m_tmp.path(), name + "-off",
                       body(QString::fromStdString(model)) + ", \"parallel\": " + plan.dump(), ranks);
    const QString plain = m_tmp.path() + "/" + name, off = m_tmp.path() + "/" + name + "-off";
    ProcessResult a = runMpi(kMpiexec, kEngine, ranks, {"train", config, "--run-dir", plain, "--quiet"});
    QVERIFY2(a.code == 0, qPrintable(a.err));
    ProcessResult b = runMpi(kMpiexec, kEngine, ranks,
                             {"train", offConfig, "--run-dir", off, "--quiet", "--emulate-device"});
    QVERIFY2(b.code == 0, qPrintable(b.err));
    const auto l1 = metricLosses(plain + "/metrics.jsonl", "step");
    const auto l2 = metricLosses(off + "/metrics.jsonl", "step");
    QCOMPARE(l2.size(), size_t(kSteps));
    for (const auto& [step, loss] : l1) QCOMPARE(l2.at(step), loss);  // exactly
    QCOMPARE(metricLosses(off + "/metrics.jsonl", "eval"), metricLosses(plain + "/metrics.jsonl", "eval"));
    // The plain run's checkpoint loads into the offloaded store (master, moments and, for "parameters", the
    // shards go to the host) and the run continues with the plain run's losses, exactly.
    const QString resumed = off + "-resumed";
    const QString ckpt = QString::fromStdString(ms::checkpointDirName(plain.toStdString(), 5));
    ProcessResult c =
        runMpi(kMpiexec, kEngine, ranks,
               {"train", offConfig, "--run-dir", resumed, "--resume", ckpt, "--quiet", "--emulate-device"});
    QVERIFY2(c.code == 0, qPrintable(c.err));
    const auto l3 = metricLosses(resumed + "/metrics.jsonl", "step");
    QCOMPARE(l3.size(), size_t(kSteps - 5));
    for (const auto& [step, loss] : l3) QCOMPARE(loss, l1.at(step));
    for (const char* file : {"/model.safetensors", "/optimizer.safetensors"})
      QCOMPARE(worstRelativeL2(ms::checkpointDirName(plain.toStdString(), kSteps) + file,
                               ms::checkpointDirName(off.toStdString(), kSteps) + file),
               0.0);
    const auto start = lastLine(off + "/metrics.jsonl", "run_start");
    const auto memory = lastLine(off + "/metrics.jsonl", "memory");
    const QString states = modelStateMismatch(start, memory);
    QVERIFY2(states.isEmpty(), qPrintable(states));
    std::map<int, nlohmann::json> predicted;
    for (const auto& rank : start["predicted"]["ranks"])
      predicted[rank["rank"].get<int>()] = rank["memory_bytes"]["host"];
    for (const auto& rank : memory["ranks"]) {
      const nlohmann::json& p = predicted.at(rank["rank"].get<int>());
      QVERIFY2(p.is_object(), "no predicted host memory");
      QVERIFY2(rank.contains("host"), "no measured host memory");
      QCOMPARE(rank["peak"]["optimizer"].get<double>(), 0.0);
      const std::pair<const char*, const char*> pairs[] = {{"parameters", "parameters"},
                                                           {"optimizer", "optimizer"},
                                                           {"gradients", "gradients"},
                                                           {"staging", "communication"}};
      for (const auto& [pk, mk] : pairs) {
        const double want = p[pk].get<double>(), got = rank["host"]["peak"][mk].get<double>();
        QVERIFY2(got >= want && got <= 1.06 * want,
                 qPrintable(QString("rank %1 host %2: predicted %3, measured %4")
                                .arg(rank["rank"].get<int>())
                                .arg(pk)
                                .arg(want)
                                .arg(got)));
      }
    }
  }

  // Recomputation re-makes what forward made, bit for bit (plan/recompute.h): one process recomputing
  // selectively, fully or the first two blocks only trains with exactly the losses, evaluation and final
  // parameters of the one process that keeps everything, and its activations are the predicted ones.
  void recomputeTrainsBitForBit_data() {
    QTest::addColumn<QString>("parallel");
    QTest::newRow("selective") << R"({"recompute": "selective"})";
    QTest::newRow("full") << R"({"recompute": "full"})";
    QTest::newRow("full 2 of 4 blocks") << R"({"recompute": "full", "recompute_layers": 2})";
  }
  void recomputeTrainsBitForBit() {
    QFETCH(QString, parallel);
    const Reference* one = reference("gpt");
    QVERIFY(one);
    const QString name = QString("recompute-%1").arg(++m_runs);
    const QString config =
        writeCpuConfig(m_tmp.path(), name, body("gpt") + ", \"parallel\": " + parallel.toStdString(), 1);
    const QString dir = m_tmp.path() + "/" + name;
    ProcessResult r = runProcess(kEngine, {"train", config, "--run-dir", dir, "--quiet"});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    const auto l1 = metricLosses(one->dir + "/metrics.jsonl", "step");
    const auto l2 = metricLosses(dir + "/metrics.jsonl", "step");
    QCOMPARE(l2.size(), size_t(kSteps));
    for (const auto& [step, loss] : l1) QCOMPARE(l2.at(step), loss);  // exactly
    QCOMPARE(metricLosses(dir + "/metrics.jsonl", "eval"), metricLosses(one->dir + "/metrics.jsonl", "eval"));
    QCOMPARE(worstRelativeL2(ms::checkpointDirName(one->dir.toStdString(), kSteps) + "/model.safetensors",
                             ms::checkpointDirName(dir.toStdString(), kSteps) + "/model.safetensors"),
             0.0);
    const auto memory = lastLine(dir + "/metrics.jsonl", "memory");
    const auto start = lastLine(dir + "/metrics.jsonl", "run_start");
    const QString activations = activationMismatch(start, memory);
    QVERIFY2(activations.isEmpty(), qPrintable(activations));
    // And it keeps less than the run that keeps everything (one block's worth is re-made at a time, so a
    // single recomputed block of one microbatch in flight would only break even).
    QVERIFY(memory["ranks"][0]["peak"]["activations"].get<double>() <
            one->memory["ranks"][0]["peak"]["activations"].get<double>());
  }

  // A checkpoint of one plan resumes under another and continues with the uninterrupted run's losses.
  // Local BatchNorm under data parallelism normalises each replica's quarter of the batch with that quarter's
  // own statistics: measurably not one process's training, where synchronised BatchNorm is
  // (planMatchesOneProcess's cnn rows). The first step's loss already differs (before any update: only the
  // normalisation differs): measured 5.6e-3 relative; the threshold, 1e-3, is a fifth of that and a hundred
  // times the 1e-5 the synchronised runs stay within.
  void localBatchNormDiffers() {
    if (!QFile::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
      QSKIP("dataset-fashion-mnist is not installed");
    const Reference* one = reference("cnn");
    QVERIFY(one);
    const QString name = QString("run%1").arg(++m_runs);
    const QString config = writeCpuConfig(
        m_tmp.path(), name, body("cnn") + R"(, "parallel": {"dp": 4, "batchnorm": "local"})", 4);
    const QString dir = m_tmp.path() + "/" + name;
    ProcessResult r = runProcess(
        kMpiexec, {"--oversubscribe", "-np", "4", kEngine, "train", config, "--run-dir", dir, "--quiet"});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    const auto single = metricLosses(one->dir + "/metrics.jsonl", "step");
    const auto local = metricLosses(dir + "/metrics.jsonl", "step");
    QCOMPARE(local.size(), single.size());
    const double first = std::abs(local.at(1) - single.at(1)) / std::abs(single.at(1));
    qInfo("cnn dp4 local BatchNorm against one process: step 1 loss %.9g vs %.9g, relative %.3g", local.at(1),
          single.at(1), first);
    QVERIFY2(first > 1e-3, qPrintable(QString::number(first)));
  }

  // A checkpoint holds full tensors whatever the plan that wrote it, so a run resumes under another plan with
  // the one process's losses: dp x tp with ZeRO-1 resumed as a ZB-H1 pipeline; and a mixture of experts
  // written under expert parallelism (each rank half the experts, tp 2) resumed under ep 4 (one expert a
  // rank), the checkpoint holding every expert whole.
  void resumeUnderAnotherPlan_data() {
    QTest::addColumn<QString>("ref");
    QTest::addColumn<QString>("planA");
    QTest::addColumn<int>("ranksA");
    QTest::addColumn<QString>("planB");
    QTest::addColumn<int>("ranksB");
    QTest::newRow("gpt dp2 tp2 zero1 -> pp2 zb-h1")
        << "gpt"
        << R"({"dp": 2, "tp": 2, "zero": 1})" << 4
        << R"({"pp": 2, "microbatches": 2, "zero": 0, "schedule": "zb_h1"})" << 2;
    QTest::newRow("llama-moe dp2 ep2 tp2 -> dp4 ep4")
        << "llama-moe-noaux"
        << R"({"dp": 2, "ep": 2, "tp": 2})" << 4 << R"({"dp": 4, "ep": 4})" << 4;
    // ZeRO with experts: the experts' states sharded over their replicas are gathered whole, and sharded
    // again over the next plan's.
    QTest::newRow("llama-moe dp4 ep2 zero2 -> dp2 ep2 zero3")
        << "llama-moe-noaux"
        << R"({"dp": 4, "ep": 2, "zero": 2})" << 4 << R"({"dp": 2, "ep": 2, "zero": 3})" << 2;
    // ZeRO-1 shards over the dp x cp ranks; the checkpoint is whole, and resumes under cp 4.
    QTest::newRow("llama dp2 cp2 zero1 -> cp4")
        << "llama"
        << R"({"dp": 2, "cp": 2, "zero": 1})" << 4 << R"({"cp": 4})" << 4;
  }
  void resumeUnderAnotherPlan() {
    QFETCH(QString, ref);
    QFETCH(QString, planA);
    QFETCH(int, ranksA);
    QFETCH(QString, planB);
    QFETCH(int, ranksB);
    const Reference* one = reference(ref);
    QVERIFY(one);
    const QString name = QString("resume%1").arg(++m_runs);
    const QString a = writeCpuConfig(m_tmp.path(), name + "-a",
                                     body(ref) + ", \"parallel\": " + planA.toStdString(), ranksA);
    const QString b = writeCpuConfig(m_tmp.path(), name + "-b",
                                     body(ref) + ", \"parallel\": " + planB.toStdString(), ranksB);
    const QString dirA = m_tmp.path() + "/" + name + "-a", dirB = m_tmp.path() + "/" + name + "-b";
    ProcessResult r = runMpi(kMpiexec, kEngine, ranksA, {"train", a, "--run-dir", dirA, "--quiet"});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    const QString ckpt = QString::fromStdString(ms::checkpointDirName(dirA.toStdString(), 5));
    r = runMpi(kMpiexec, kEngine, ranksB, {"train", b, "--run-dir", dirB, "--resume", ckpt, "--quiet"});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    const auto single = metricLosses(one->dir + "/metrics.jsonl", "step");
    const auto resumed = metricLosses(dirB + "/metrics.jsonl", "step");
    QCOMPARE(resumed.size(), size_t(kSteps - 5));
    for (const auto& [step, loss] : resumed)
      QVERIFY2(
          std::abs(single.at(step) - loss) <= 1e-5 * std::abs(loss),
          qPrintable(
              QString("step %1: %2 vs %3").arg(step).arg(single.at(step), 0, 'g', 9).arg(loss, 0, 'g', 9)));
    const double worst =
        worstRelativeL2(ms::checkpointDirName(one->dir.toStdString(), kSteps) + "/model.safetensors",
                        ms::checkpointDirName(dirB.toStdString(), kSteps) + "/model.safetensors");
    QVERIFY2(worst >= 0 && worst < 5e-4, qPrintable(QString::number(worst)));
  }

 private:
  int m_runs = 0;
};

QTEST_APPLESS_MAIN(TestEquivalence)
#include "tst_equivalence.moc"
