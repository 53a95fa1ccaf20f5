// Tests of the memory model against figures computed by hand from the model's shapes: the state bytes per
// parameter (plan/model_state.h, with the ZeRO and Megatron tables written out), what each ZeRO
// stage divides, the tied head's copy of wte on the last stage, the activations a schedule keeps in flight
// (1F1B's first stage holds min(P, M) microbatches, GPipe M), recompute, tensor and sequence parallelism,
// uneven stages, the other category and the fits flag, bf16's kept GEMM inputs and fused attention on GPUs.
#include <QtTest>

#include "test_util.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "plan/cost_model.h"
#include "plan/memory_model.h"
#include "plan/model_state.h"
#include "plan/plan.h"
#include "plan/simulator.h"

using nlohmann::json;

namespace {

// The test model: gpt with C = 64, H = 4, V = 256, context 64, T = 64, mlp_ratio 4, tied embeddings.
constexpr double kC = 64, kV = 256, kContext = 64, kT = 64, kF = 4 * kC, kH = 4;
// Parameters of one block (two LayerNorms 2C each, c_attn C*3C + 3C, c_proj C*C + C, c_fc C*F + F, mlp
// c_proj F*C + C).
constexpr double kBlockParams =
    2 * kC + kC * 3 * kC + 3 * kC + kC * kC + kC + 2 * kC + kC * kF + kF + kF * kC + kC;
constexpr double kEmbeddingParams = kV * kC + kContext * kC;  // wte + wpe
constexpr double kHeadParams = 2 * kC;                        // ln_f; the LM head reads wte
// A block's saved activations per sample (model_spec.cpp) on the test's GPU mesh, where attention is fused
// (head size 16) and keeps its rows' log-sum-exp: T * (7C + 2F) + H * T + 4T floats; a CPU materialises the
// softmax, H * T * T floats instead of H * T.
constexpr double kBlockActivationBytes = (kT * (7 * kC + 2 * kF) + kH * kT + 4 * kT) * 4;
constexpr double kBlockActivationBytesCpu = (kT * (7 * kC + 2 * kF) + kH * kT * kT + 4 * kT) * 4;
// Of those, bf16 keeps all but the LayerNorm statistics and attention's state in bf16: ln_1, qkv, attention
// out, residual, ln_2 (7 T * C together), fc out and gelu out (T * F each).
constexpr double kBlockBf16Bytes = kT * (7 * kC + 2 * kF) * 4;
// Every layer but the head also keeps its output buffer per microbatch in flight (T * C floats per sample).
constexpr double kOutputBytes = kT * kC * 4;
constexpr double kMiB = 1024.0 * 1024.0;

double modelParams(int layers) {
  return kEmbeddingParams + layers * kBlockParams + kHeadParams;
}

// A block as one rank of a TP group of tp holds it (model_spec.h shardSpecOf): the q|k|v and fc weights and
// biases and the two projection weights split; the LayerNorms (4C) and the projections' biases (2C) whole.
double blockLocal(int tp) {
  const double split = kC * 3 * kC + 3 * kC + kC * kC + kC * kF + kF + kF * kC;
  return split / tp + 6 * kC;
}

json baseConfig(int layers) {
  json c = ms::test::smallGpuPlanConfig("memory", layers, 16);
  ms::test::useFlatH100(c);  // the expected compute times below are written in FLOPs
  c["optimizer"] = {{"type", "adamw"}};
  return c;
}

ms::Expected<ms::Plan> makePlan(int layers, const json& patch) {
  json doc = baseConfig(layers);
  doc.merge_patch(patch);
  ms::Expected<ms::RunConfig> config = ms::parseRunConfig(doc);
  if (!config) return config.status();
  return ms::buildPlan(*config);
}

// A llama whose second block is a mixture of 8 experts (2 a token, width 96) with `shared` shared experts.
json moeModel(int shared) {
  json model = {{"type", "llama"},        {"kv_heads", 2},           {"ffn_hidden", 128}, {"experts", 8},
                {"experts_per_token", 2}, {"expert_ffn_hidden", 96}, {"dense_layers", 1}};
  if (shared > 0) model["shared_experts"] = shared;
  return {{"model", model}};
}

#define MAKE_PLAN(name, layers, patch)                   \
  ms::Expected<ms::Plan> name = makePlan(layers, patch); \
  QVERIFY2(name.isOk(), name.isOk() ? "" : name.message().c_str())

// The breakdown of the first rank of a stage.
const ms::MemoryBreakdown& ofStage(const std::vector<ms::MemoryBreakdown>& ranks, int stage) {
  for (const auto& m : ranks)
    if (m.stage == stage) return m;
  return ranks.front();
}

bool near(double a, double b, double rel = 1e-12) {
  return std::abs(a - b) <= rel * std::max(std::abs(a), std::abs(b));
}

}  // namespace

class TestMemoryModel : public QObject {
  Q_OBJECT

 private slots:
  // fp32: parameter 4, gradient 4, AdamW 8, SGD with momentum 4, without 0 bytes per parameter; a stage
  // holds its layers' parameters as its TP rank does (split ones / tp, replicated ones whole: wte is
  // vocabulary-parallel, wpe and the LayerNorms replicated); the last stage holds a copy of the tied wte.
  void fp32States_data() {
    QTest::addColumn<int>("pp");
    QTest::addColumn<int>("tp");
    QTest::addColumn<QString>("optimizer");
    QTest::addColumn<double>("momentum");
    QTest::addColumn<int>("stage");
    QTest::addColumn<double>("params");  // per rank
    QTest::addColumn<double>("optimizerBytesPerParam");
    const double all = modelParams(2);
    QTest::newRow("pp1 adamw") << 1 << 1 << "adamw" << 0.9 << 0 << all << 8.0;
    QTest::newRow("pp1 tp2 adamw") << 1 << 2 << "adamw" << 0.9 << 0
                                   << kV * kC / 2 + kContext * kC + 2 * blockLocal(2) + kHeadParams << 8.0;
    QTest::newRow("pp1 sgd momentum") << 1 << 1 << "sgd" << 0.9 << 0 << all << 4.0;
    QTest::newRow("pp1 sgd plain") << 1 << 1 << "sgd" << 0.0 << 0 << all << 0.0;
    // Four layers in two stages: [embedding, block.0], [block.1, head + wte copy].
    QTest::newRow("pp2 stage0") << 2 << 1 << "adamw" << 0.9 << 0 << kEmbeddingParams + kBlockParams << 8.0;
    QTest::newRow("pp2 stage1") << 2 << 1 << "adamw" << 0.9 << 1 << kBlockParams + kHeadParams + kV * kC
                                << 8.0;
    QTest::newRow("pp2 tp2 stage1") << 2 << 2 << "adamw" << 0.9 << 1
                                    << blockLocal(2) + kHeadParams + kV * kC / 2 << 8.0;
  }
  void fp32States() {
    QFETCH(int, pp);
    QFETCH(int, tp);
    QFETCH(QString, optimizer);
    QFETCH(double, momentum);
    QFETCH(int, stage);
    QFETCH(double, params);
    QFETCH(double, optimizerBytesPerParam);
    MAKE_PLAN(
        plan, 2,
        (json{{"parallel", {{"pp", pp}, {"tp", tp}}},
              {"optimizer", {{"type", optimizer.toStdString()}, {"momentum", momentum}, {"lr", 0.01}}}}));
    const auto ranks = ms::estimateMemory(*plan);
    QCOMPARE(int(ranks.size()), pp * tp);
    const ms::MemoryBreakdown& m = ofStage(ranks, stage);
    QVERIFY2(near(m.parameters, 4 * params), qPrintable(QString::number(m.parameters)));
    QVERIFY(near(m.gradients, 4 * params));
    QVERIFY(near(m.optimizer, optimizerBytesPerParam * params));
  }

  // ZeRO over dp = 4: stage 1 divides the optimizer state, 2 also the gradients, 3 also the parameters (and
  // gathers the largest layer whole into "other").
  void zeroStages_data() {
    QTest::addColumn<int>("zero");
    QTest::addColumn<double>("paramDiv");
    QTest::addColumn<double>("gradDiv");
    QTest::addColumn<double>("optDiv");
    QTest::newRow("zero0") << 0 << 1.0 << 1.0 << 1.0;
    QTest::newRow("zero1") << 1 << 1.0 << 1.0 << 4.0;
    QTest::newRow("zero2") << 2 << 1.0 << 4.0 << 4.0;
    QTest::newRow("zero3") << 3 << 4.0 << 4.0 << 4.0;
  }
  void zeroStages() {
    QFETCH(int, zero);
    QFETCH(double, paramDiv);
    QFETCH(double, gradDiv);
    QFETCH(double, optDiv);
    for (const char* precision : {"fp32", "bf16"}) {
      MAKE_PLAN(
          plan, 2,
          (json{{"parallel", {{"dp", 4}, {"zero", zero}, {"precision", precision}, {"microbatches", 2}}}}));
      const auto ranks = ms::estimateMemory(*plan);
      QCOMPARE(int(ranks.size()), 4);
      const double n = modelParams(2);
      const bool bf16 = std::string(precision) == "bf16";
      // fp32: values 4, gradients 4, moments 8, the values being what the optimizer updates. bf16 (fp32
      // gradients, the default): bf16 working parameters 2, fp32 gradients 4, and the optimizer state is the
      // fp32 master 4 + moments 8 (plan/model_state.h).
      const double p = bf16 ? 2 : 4, g = 4, o = bf16 ? 12 : 8;
      for (const auto& m : ranks) {
        QVERIFY(near(m.parameters, p * n / paramDiv));
        QVERIFY(near(m.gradients, g * n / gradDiv));
        QVERIFY(near(m.optimizer, o * n / optDiv));
      }
      // ZeRO-3 gathers each layer whole before using it, in the working precision, with the next layer's
      // gather already in flight (prefetch): two neighbours at once, here the two blocks (embedding + block
      // and block + ln_f + the tied wte are smaller).
      QVERIFY(kBlockParams > kEmbeddingParams && kBlockParams > kHeadParams + kV * kC);
      const ms::OtherBytes other = ms::otherBreakdown(*plan, 0, true);
      QCOMPARE(other.zero3Gathered, zero == 3 ? 2 * kBlockParams * p : 0.0);
      if (zero == 3) {
        // Split in two stages, each holds one pair: the embedding (wte + wpe) and a block; a block and the
        // head, which gathers ln_f and its copy of wte.
        MAKE_PLAN(
            pp2, 2,
            (json{{"parallel",
                   {{"dp", 4}, {"pp", 2}, {"zero", 3}, {"precision", precision}, {"microbatches", 2}}}}));
        QCOMPARE(ms::otherBreakdown(*pp2, 0, true).zero3Gathered, (kEmbeddingParams + kBlockParams) * p);
        QCOMPARE(ms::otherBreakdown(*pp2, 1, true).zero3Gathered, (kBlockParams + kHeadParams + kV * kC) * p);
      }
      // Gradient buckets (runtime/parameters.h reduceGrads): none for ZeRO 0, which all-reduces the flat
      // gradients in place; ZeRO-1 reduce-scatters every unit once a step into a shard of staging, all in
      // flight until the optimizer step (a quarter of the gradients on 4 replicas); ZeRO >= 2
      // reduce-scatters each layer's gradients every microbatch, holding the full gradients of two layers
      // at once (the two blocks), the tied wte's (summed once per step) and, with 2 microbatches
      // accumulating, a block's shard of staging.
      const double buckets = zero >= 2   ? (2 * kBlockParams + kV * kC + kBlockParams / 4) * g
                             : zero == 1 ? n / 4 * g
                                         : 0.0;
      QVERIFY2(near(other.dpBucket, buckets), qPrintable(QString::number(other.dpBucket)));
    }
  }

  // The published tables, written out, for d = 1, 2, 8, 64 (plan/model_state.h):
  // - ZeRO (Rajbhandari et al. 2020, Figure 1 and sections 5.1-5.3: mixed precision with 2-byte gradients
  //   and K = 12 bytes of optimizer state): 16, 4 + 12/d, 2 + 14/d, 16/d for stages 0-3;
  // - Megatron Core's distributed optimizer (bf16 parameters, fp32 gradients): 18 without it, 6 + 12/d with
  //   it (ZeRO-1's sharding), and 2 + 16/d, 18/d carrying the same rule to stages 2 and 3;
  // - fp32: 16, 8 + 8/d, 4 + 12/d, 16/d.
  void publishedBytesPerParameter_data() {
    QTest::addColumn<int>("dp");
    for (int d : {1, 2, 8, 64}) QTest::newRow(qPrintable(QString("d%1").arg(d))) << d;
  }
  void publishedBytesPerParameter() {
    QFETCH(int, dp);
    const double d = dp;
    const ms::OptimizerConfig adam;
    auto total = [&](ms::Precision precision, ms::GradPrecision grads, int zero) {
      return ms::modelStateBytes(ms::modelStateLayout(precision, grads, adam, zero), dp).total();
    };
    const double zeroPaper[4] = {16, 4 + 12 / d, 2 + 14 / d, 16 / d};
    const double megatron[4] = {18, 6 + 12 / d, 2 + 16 / d, 18 / d};
    const double fp32[4] = {16, 8 + 8 / d, 4 + 12 / d, 16 / d};
    for (int zero = 0; zero <= 3; ++zero) {
      QCOMPARE(total(ms::Precision::Bf16, ms::GradPrecision::Bf16, zero), zeroPaper[zero]);
      QCOMPARE(total(ms::Precision::Bf16, ms::GradPrecision::Fp32, zero), megatron[zero]);
      QCOMPARE(total(ms::Precision::Fp32, ms::GradPrecision::Fp32, zero), fp32[zero]);
    }
    // The categories: bf16 working parameters 2 (sharded by ZeRO-3), gradients 2 or 4 (by ZeRO-2), the fp32
    // master 4 and the moments 8 as optimizer state (by ZeRO-1).
    const ms::ModelStateBytes z1 =
        ms::modelStateBytes(ms::modelStateLayout(ms::Precision::Bf16, ms::GradPrecision::Bf16, adam, 1), dp);
    QCOMPARE(z1.parameters, 2.0);
    QCOMPARE(z1.gradients, 2.0);
    QCOMPARE(z1.optimizer, 12 / d);
    // SGD with momentum: master 4 + momentum 4; without momentum only the master.
    ms::OptimizerConfig sgd{ms::OptimizerType::Sgd};
    sgd.momentum = 0.9;
    QCOMPARE(
        ms::modelStateBytes(ms::modelStateLayout(ms::Precision::Bf16, ms::GradPrecision::Fp32, sgd, 1), dp)
            .optimizer,
        8 / d);
    sgd.momentum = 0;
    QCOMPARE(
        ms::modelStateBytes(ms::modelStateLayout(ms::Precision::Fp32, ms::GradPrecision::Fp32, sgd, 0), dp)
            .optimizer,
        0.0);
  }

  // The memory model applies those figures to the plan's parameter counts: bf16 with fp32 gradients is 18
  // bytes per parameter without ZeRO, fp32 16; grad_precision bf16 needs precision bf16.
  void bf16EighteenBytesPerParam() {
    MAKE_PLAN(plan, 2, (json{{"parallel", {{"precision", "bf16"}}}}));
    const auto m = ms::estimateMemory(*plan).front();
    QVERIFY(near(m.parameters, 2 * modelParams(2)));
    QVERIFY(near(m.optimizer, 12 * modelParams(2)));
    QVERIFY(near(m.parameters + m.gradients + m.optimizer, 18 * modelParams(2)));
    MAKE_PLAN(bf16Grads, 2, (json{{"parallel", {{"precision", "bf16"}, {"grad_precision", "bf16"}}}}));
    const auto g = ms::estimateMemory(*bf16Grads).front();
    QVERIFY(near(g.gradients, 2 * modelParams(2)));
    MAKE_PLAN(fp32, 2, json::object());
    const auto f = ms::estimateMemory(*fp32).front();
    QVERIFY(near(f.parameters + f.gradients + f.optimizer, 16 * modelParams(2)));
    MAKE_PLAN(zero3, 2, (json{{"parallel", {{"precision", "bf16"}, {"dp", 2}, {"zero", 3}}}}));
    QVERIFY(near(ms::estimateMemory(*zero3).front().parameters, 2 * modelParams(2) / 2));

    json bad = baseConfig(2);
    bad["parallel"] = {{"grad_precision", "bf16"}};
    ms::Expected<ms::RunConfig> refused = ms::parseRunConfig(bad);
    QVERIFY(!refused.isOk());
    QVERIFY2(refused.message().find("/parallel/grad_precision") != std::string::npos,
             refused.message().c_str());
  }

  // Offload (model_state.h; ZeRO-Offload, Ren et al. 2021; FSDP's CPU offload): with AdamW, bf16 gradients
  // and dp d, device | host bytes per parameter element:
  //   "optimizer", ZeRO 0: 2 + 2 | 12 + 4 (the master and moments, and the fp32 copy of the gradients the
  //   host's step reads); ZeRO 1: 2 + 2 | (12 + 4)/d; ZeRO 2: 2 + 2/d | 16/d; ZeRO 3: 2/d + 2/d | 16/d;
  //   "parameters" (ZeRO 3): 0 | (2 + 2 + 12)/d, the shards read in place.
  // The sum over both never drops below the unoffloaded figure: offload moves bytes, it does not save them.
  void offloadBytesPerParameter_data() {
    QTest::addColumn<int>("dp");
    for (int d : {1, 2, 64}) QTest::newRow(qPrintable(QString("d%1").arg(d))) << d;
  }
  void offloadBytesPerParameter() {
    QFETCH(int, dp);
    const double d = dp;
    const ms::OptimizerConfig adam;
    auto bytes = [&](int zero, ms::Offload offload) {
      return ms::modelStateBytes(
          ms::modelStateLayout(ms::Precision::Bf16, ms::GradPrecision::Bf16, adam, zero, offload), dp);
    };
    const double device[4] = {4, 4, 2 + 2 / d, 4 / d};
    const double host[4] = {16, 16 / d, 16 / d, 16 / d};
    for (int zero = 0; zero <= 3; ++zero) {
      const ms::ModelStateBytes b = bytes(zero, ms::Offload::Optimizer);
      QCOMPARE(b.total(), device[zero]);
      QCOMPARE(b.hostTotal(), host[zero]);
      QCOMPARE(b.optimizer, 0.0);
      QCOMPARE(b.hostOptimizer, zero >= 1 ? 12 / d : 12.0);
      QVERIFY(b.total() + b.hostTotal() >= bytes(zero, ms::Offload::None).total());
    }
    const ms::ModelStateBytes p = bytes(3, ms::Offload::Parameters);
    QCOMPARE(p.total(), 0.0);
    QCOMPARE(p.hostParameters, 2 / d);
    QCOMPARE(p.hostGradients, 2 / d);
    QCOMPARE(p.hostTotal(), 16 / d);
    // fp32 runs keep no separate master: offload does not apply (config_checks refuses it).
    QCOMPARE(ms::modelStateBytes(ms::modelStateLayout(ms::Precision::Fp32, ms::GradPrecision::Fp32, adam, 1,
                                                      ms::Offload::Optimizer),
                                 dp)
                 .hostTotal(),
             0.0);
  }

  // The plan applies them: device categories lose the optimizer state, the host holds it (with one unit's
  // bf16 staging), per node the host bytes add up over the node's ranks against its devices' host shares
  // (DGX H100: 250 GB per GPU); the cost model's step crosses PCIe. Refusals name the field.
  void offloadPlan() {
    const json par = {{"precision", "bf16"}, {"grad_precision", "bf16"}, {"dp", 8}, {"zero", 1}};
    json off = par;
    off["offload"] = "optimizer";
    MAKE_PLAN(plain, 2, (json{{"parallel", par}}));
    MAKE_PLAN(offload, 2, (json{{"parallel", off}}));
    const auto a = ms::estimateMemory(*plain), b = ms::estimateMemory(*offload);
    const double n = modelParams(2);
    for (size_t r = 0; r < b.size(); ++r) {
      QVERIFY(near(a[r].optimizer, 12 * n / 8));
      QCOMPARE(b[r].optimizer, 0.0);
      QCOMPARE(b[r].parameters, a[r].parameters);
      QCOMPARE(b[r].gradients, a[r].gradients);
      QVERIFY(near(b[r].host.optimizer, 12 * n / 8));
      QVERIFY(near(b[r].host.gradients, 4 * n / 8));
      QVERIFY(b[r].host.staging > 0 && b[r].host.staging < 2 * n / 8);
    }
    const auto nodes = ms::hostMemoryPerNode(*offload, b);
    QCOMPARE(nodes.size(), size_t(1));
    QVERIFY(near(nodes[0].bytes, 8 * b[0].host.total()));
    QVERIFY(near(nodes[0].capacity, 8 * 250e9));
    QVERIFY(nodes[0].fits());
    QCOMPARE(ms::hostMemoryPerNode(*plain, a)[0].bytes, 0.0);
    const auto j = ms::memoryBytesJson(b[0]);
    QVERIFY(near(j["host"]["total"].get<double>(), b[0].host.total()));
    QVERIFY(!ms::memoryBytesJson(a[0]).contains("host"));
    // The step: gradients down (2 B) and bf16 parameters up (2 B) over PCIe Gen5 (64 GB/s), the host's pass
    // over its state at 76.8 GB/s (fp32 gradient 4, master 4 + 4, moments 8 + 8, bf16 out 2 = 30 B).
    const ms::CostModel cost(*offload);
    const double shard = n / 8;
    QVERIFY(near(cost.optimizerTransferTime(0), shard * 4 / 64e9));
    QVERIFY(cost.optimizerTime(0) > shard * 30 / 76.8e9 + shard * 4 / 64e9);
    QCOMPARE(ms::CostModel(*plain).optimizerTransferTime(0), 0.0);

    // Refused: fp32 (no master to move), "parameters" without ZeRO-3, a device type without host figures.
    auto refusal = [&](const json& patch) {
      json doc = baseConfig(2);
      doc.merge_patch(patch);
      ms::Expected<ms::RunConfig> config = ms::parseRunConfig(doc);
      if (!config) return config.message();
      auto plan = ms::buildPlan(*config);
      return plan ? std::string() : plan.message();
    };
    std::string e = refusal(json{{"parallel", {{"offload", "optimizer"}}}});
    QVERIFY2(e.find("/parallel/offload") != std::string::npos && e.find("bf16") != std::string::npos,
             e.c_str());
    e = refusal(
        json{{"parallel", {{"offload", "parameters"}, {"precision", "bf16"}, {"dp", 2}, {"zero", 1}}}});
    QVERIFY2(e.find("/parallel/offload") != std::string::npos && e.find("zero") != std::string::npos,
             e.c_str());
    e = refusal(
        json{{"parallel", {{"offload", "optimizer"}, {"precision", "bf16"}}},
             {"mesh", {{"nodes", json::array({{{"name", "n0"}, {"device", "l40s"}, {"count", 8}}})}}}});
    QVERIFY2(e.find("/parallel/offload") != std::string::npos && e.find("l40s") != std::string::npos &&
                 e.find("host_memory_gb") != std::string::npos,
             e.c_str());
    e = refusal(json{{"parallel", {{"offload", "everything"}, {"precision", "bf16"}}}});
    QVERIFY2(e.find("/parallel/offload") != std::string::npos, e.c_str());
  }

  // bf16 halves exactly the GEMM-only inputs a block keeps and every layer's output buffer (T * C per
  // sample, rounded to bf16 and kept so); the rest stays fp32 (the gpt head keeps no GEMM input: its LM
  // head's gradients are computed in forward, fused with the loss). On a CPU mesh the softmax is
  // materialised (H * T * T per sample), on a GPU mesh attention is fused (H * T).
  void bf16AndFusedAttention() {
    MAKE_PLAN(fp32, 2, (json{{"parallel", {{"microbatches", 2}}}}));
    MAKE_PLAN(bf16, 2, (json{{"parallel", {{"microbatches", 2}, {"precision", "bf16"}}}}));
    const double mbs = 8;
    const double a32 = ms::estimateMemory(*fp32).front().activations;
    const double a16 = ms::estimateMemory(*bf16).front().activations;
    // Two blocks' kept tensors but the statistics and the fused attention's fp32 rows, and three outputs
    // (embedding, block.0, block.1), halved.
    QVERIFY(near(a32 - a16, (2 * kBlockBf16Bytes / 2 + 3 * kOutputBytes / 2) * mbs));
    // Under bf16 the model also stages a layer's input and output in fp32 (2 T * C per sample, workspace,
    // "other"), beside the fused attention's fp32 copy of its kept bf16 output (T * C), and the block stages
    // its kept q|k|v, residual and fc output in fp32 (T * (3C + C + F)).
    QVERIFY(
        near(ms::otherBreakdown(*bf16, 0, false).workspace - ms::otherBreakdown(*fp32, 0, false).workspace,
             ((2 + 1) * kT * kC + kT * (4 * kC + kF)) * 4 * mbs));
    QVERIFY(ms::fusedAttention(*fp32, 0));

    json cpu = baseConfig(2);
    cpu["mesh"]["nodes"][0]["device"] = "cpu";
    cpu["parallel"] = {{"microbatches", 2}};
    ms::Expected<ms::RunConfig> config = ms::parseRunConfig(cpu);
    QVERIFY2(config.isOk(), config.isOk() ? "" : config.message().c_str());
    ms::Expected<ms::Plan> onCpu = ms::buildPlan(*config);
    QVERIFY2(onCpu.isOk(), onCpu.isOk() ? "" : onCpu.message().c_str());
    QVERIFY(!ms::fusedAttention(*onCpu, 0));
    const double aCpu = ms::estimateMemory(*onCpu).front().activations;
    QVERIFY(near(aCpu - a32, 2 * (kBlockActivationBytesCpu - kBlockActivationBytes) * mbs));

    // A head size over the fused kernel's limit materialises the softmax on a GPU too.
    MAKE_PLAN(bigHeads, 2,
              (json{{"model", {{"width", 512}, {"heads", 2}}}, {"parallel", {{"microbatches", 2}}}}));
    QVERIFY(!ms::fusedAttention(*bigHeads, 0));
  }

  // Pipeline messages: an activation is the chunk's last output, T * C per sample, 4 bytes each in fp32 and 2
  // in bf16 (the engine sends the bf16 output it keeps), and the input gradient coming back the same (every
  // layer's input gradient is rounded to bf16). The message buffers follow the stage's 1F1B order
  // (pipelineBufferBytes): the first stage sends activations from its layers' outputs and holds one received
  // gradient at a time; the last holds a received activation, the input gradient its backward writes, and the
  // previous gradient, sent by rendezvous and counted held until a message the first stage sent after
  // posting its receive arrives: 3 messages.
  void bf16PipelineMessages() {
    const double mbs = 4;
    for (const char* precision : {"fp32", "bf16"}) {
      MAKE_PLAN(plan, 4, (json{{"parallel", {{"pp", 2}, {"microbatches", 4}, {"precision", precision}}}}));
      const double element = std::string(precision) == "bf16" ? 2 : 4;
      const std::vector<double> act = ms::chunkMessageBytes(*plan);
      QCOMPARE(act.front(), kT * kC * element * mbs);
      QCOMPARE(ms::otherBreakdown(*plan, 0, false).p2pBuffers, kT * kC * element * mbs);
      QCOMPARE(ms::otherBreakdown(*plan, 1, false).p2pBuffers, 3 * kT * kC * element * mbs);
    }
  }

  // 1F1B's first stage holds min(P, M) microbatches, GPipe's all M: with 8 layers on 4 stages the first
  // stage is [embedding, block.0]: block.0's saved activations and both layers' outputs.
  void scheduleInFlight_data() {
    QTest::addColumn<int>("microbatches");
    QTest::newRow("M2") << 2;
    QTest::newRow("M4") << 4;
    QTest::newRow("M8") << 8;
  }
  void scheduleInFlight() {
    QFETCH(int, microbatches);
    const int P = 4;
    const double mbs = 16.0 / microbatches;
    MAKE_PLAN(gpipe, 6,
              (json{{"parallel", {{"pp", P}, {"microbatches", microbatches}, {"schedule", "gpipe"}}}}));
    MAKE_PLAN(oneFOneB, 6,
              (json{{"parallel", {{"pp", P}, {"microbatches", microbatches}, {"schedule", "1f1b"}}}}));
    const double g = ofStage(ms::estimateMemory(*gpipe), 0).activations;
    const double f = ofStage(ms::estimateMemory(*oneFOneB), 0).activations;
    const double perSample = kBlockActivationBytes + 2 * kOutputBytes;
    QVERIFY(near(g, microbatches * mbs * perSample));
    QVERIFY(near(f, std::min(P, microbatches) * mbs * perSample));
    QVERIFY(near(g / f, double(microbatches) / std::min(P, microbatches)));
  }

  // Recompute keeps each block's output (T * C floats per sample) and re-runs one block at a time.
  void recompute() {
    const json parallel = {{"pp", 4}, {"microbatches", 8}};
    json withRecompute = parallel;
    withRecompute["recompute"] = "full";
    MAKE_PLAN(none, 6, (json{{"parallel", parallel}}));
    MAKE_PLAN(full, 6, (json{{"parallel", withRecompute}}));
    const double mbs = 2;
    // Stage 1 holds [block.1, block.2]; 1F1B keeps P - 1 = 3 microbatches in flight there.
    const double kept = 3 * 2 * (kT * kC * 4) * mbs;
    const double transient = kBlockActivationBytes * mbs;
    const double a = ofStage(ms::estimateMemory(*full), 1).activations;
    const double b = ofStage(ms::estimateMemory(*none), 1).activations;
    QVERIFY2(near(a, kept + transient), qPrintable(QString("%1 vs %2").arg(a).arg(kept + transient)));
    QVERIFY(near(b, 3 * 2 * (kBlockActivationBytes + kOutputBytes) * mbs));
    QVERIFY(a < b / 4);
  }

  // The categories do not all peak at once (memory_model.cpp concurrentStageBytes). One stage, one
  // microbatch, full recompute, ZeRO-1 over dp 2: the backward walks head, block.3 ... block.0, embedding;
  // each block's re-made activations (R) are held during its backward only, and each layer's gradient shard
  // is staged once its backward is done. The most held at once is then max(R + every shard but block.0's
  // and the embedding's, every shard), below the categories' sum (R + every shard) by min(R, those two
  // shards). Without ZeRO nothing is staged: the sum is the peak.
  void layersAtDifferentMoments() {
    const json zero1 = {{"parallel", {{"dp", 2}, {"zero", 1}, {"recompute", "full"}}}};
    MAKE_PLAN(staged, 4, zero1);
    const auto ranks = ms::estimateMemory(*staged);
    QCOMPARE(int(ranks.size()), 2);
    const double remade = kBlockActivationBytes * staged->microbatchSize();
    const double blockShard = kBlockParams / 2 * 4, embeddingShard = kEmbeddingParams / 2 * 4;
    const double expected = std::min(remade, blockShard + embeddingShard);
    for (const auto& m : ranks) {
      QVERIFY2(near(m.notAtOnce, expected, 1e-9),
               qPrintable(QString("not at once %1, expected %2").arg(m.notAtOnce).arg(expected)));
      QVERIFY(near(m.total(), m.categorySum() - expected, 1e-9));
      QCOMPARE(ms::memoryBytesJson(m)["not_at_once"].get<double>(), m.notAtOnce);
      QCOMPARE(ms::memoryBytesJson(m)["total"].get<double>(), m.total());
    }
    // The shards staged over the step are ZeRO-1's whole bucket: the communication buffers' peak.
    QVERIFY(near(ranks[0].otherCommunication, ms::otherBreakdown(*staged, 0, true).dpBucket));
    json plain = zero1;
    plain["parallel"]["zero"] = 0;
    MAKE_PLAN(unstaged, 4, plain);
    for (const auto& m : ms::estimateMemory(*unstaged)) {
      QCOMPARE(m.notAtOnce, 0.0);
      QVERIFY(!ms::memoryBytesJson(m).contains("not_at_once"));
    }
  }

  // Megatron's partial recompute ("recompute_layers": N, --recompute-num-layers): the first N blocks of every
  // chunk keep only their output, the others everything; more than a chunk's blocks is refused, naming the
  // field, and the count needs "full".
  void partialRecompute() {
    const json parallel = {{"pp", 4}, {"microbatches", 8}, {"recompute", "full"}, {"recompute_layers", 1}};
    MAKE_PLAN(partial, 6, (json{{"parallel", parallel}}));
    const double mbs = 2;
    // Stage 1 holds [block.1, block.2] and 3 microbatches in flight: block.1 keeps its output, block.2 its
    // activations and output; one re-made block.1 is the transient.
    const double kept = 3 * (kOutputBytes + kBlockActivationBytes + kOutputBytes) * mbs;
    const double transient = kBlockActivationBytes * mbs;
    const double a = ofStage(ms::estimateMemory(*partial), 1).activations;
    QVERIFY2(near(a, kept + transient), qPrintable(QString("%1 vs %2").arg(a).arg(kept + transient)));
    // As many as a chunk holds is "full" for that chunk.
    json two = parallel;
    two["recompute_layers"] = 2;
    json all = parallel;
    all["recompute_layers"] = 0;
    MAKE_PLAN(twoPlan, 6, (json{{"parallel", two}}));
    MAKE_PLAN(allPlan, 6, (json{{"parallel", all}}));
    QVERIFY(near(ofStage(ms::estimateMemory(*twoPlan), 1).activations,
                 ofStage(ms::estimateMemory(*allPlan), 1).activations));
    // More blocks than any chunk holds.
    json three = parallel;
    three["recompute_layers"] = 3;
    const ms::Expected<ms::Plan> tooMany = makePlan(6, json{{"parallel", three}});
    QVERIFY(!tooMany.isOk());
    QVERIFY2(tooMany.message().find("/parallel/recompute_layers") != std::string::npos,
             tooMany.message().c_str());
    // Without "full".
    json doc = baseConfig(6);
    doc["parallel"] = {{"recompute", "selective"}, {"recompute_layers", 1}};
    ms::Expected<ms::RunConfig> selective = ms::parseRunConfig(doc);
    QVERIFY(!selective.isOk());
    QVERIFY2(selective.message().find("/parallel/recompute_layers") != std::string::npos &&
                 selective.message().find("needs \"recompute\": \"full\"") != std::string::npos,
             selective.message().c_str());
  }

  // Selective recompute (Korthikanti et al. 2022, section 5) drops each block's attention matrix and nothing
  // else. Their Table 2 counts a layer's activations in fp16 with dropout as s b h (34 + 5 a s / h) bytes,
  // s b h 34 with selective recompute: the difference, 5 a s^2 b, is the softmax output (2 a s^2 b), its
  // dropout mask (a s^2 b) and dropout output (2 a s^2 b). Our engine has no attention dropout and keeps the
  // probabilities in fp32 (in bf16 too), so selective saves 2 * 2 a s^2 b bytes per layer: the paper's
  // softmax term at 4 bytes; under tensor parallelism / t, as the paper's 5 a s / (h t). Where attention is
  // fused (a GPU, head size <= 128) no matrix is kept and selective keeps what none keeps. The re-made
  // matrix and the output its re-run writes are backward workspace ("other").
  void selectiveRecompute_data() {
    QTest::addColumn<int>("tp");
    QTest::addColumn<bool>("sequenceParallel");
    QTest::newRow("tp1") << 1 << false;
    QTest::newRow("tp2") << 2 << false;
    QTest::newRow("tp2 sequence parallel") << 2 << true;
    QTest::newRow("tp4 sequence parallel") << 4 << true;
  }
  void selectiveRecompute() {
    QFETCH(int, tp);
    QFETCH(bool, sequenceParallel);
    auto cpuPlan = [&](const std::string& recompute) {
      json doc = baseConfig(2);
      doc["mesh"]["nodes"][0]["device"] = "cpu";
      doc["parallel"] = {
          {"microbatches", 2}, {"tp", tp}, {"sequence_parallel", sequenceParallel}, {"recompute", recompute}};
      ms::Expected<ms::RunConfig> config = ms::parseRunConfig(doc);
      if (!config) return ms::Expected<ms::Plan>(config.status());
      return ms::buildPlan(*config);
    };
    const ms::Expected<ms::Plan> none = cpuPlan("none"), selective = cpuPlan("selective");
    QVERIFY2(none.isOk() && selective.isOk(),
             none.isOk() ? selective.message().c_str() : none.message().c_str());
    const double mbs = 8, layers = 2;
    const double s = kT, b = mbs, a = kH;
    const double paperSoftmaxFp16 = 5 * a * s * s * b - (a * s * s * b + 2 * a * s * s * b);  // less dropout
    const double saved = layers * 2 * paperSoftmaxFp16 / tp;                                  // fp32, / t
    QCOMPARE(saved, layers * kH * kT * kT * 4 * mbs / tp);
    const ms::MemoryBreakdown n = ms::estimateMemory(*none).front(),
                              k = ms::estimateMemory(*selective).front();
    QVERIFY2(near(n.activations - k.activations, saved),
             qPrintable(QString("saved %1, expected %2").arg(n.activations - k.activations).arg(saved)));
    // What a selective block keeps is the paper's 34 s b h structure as our engine keeps it: everything of
    // kBlockActivationBytesCpu but the matrix (tp = 1, where nothing is replicated).
    if (tp == 1) {
      const double head = (kT * kC + 3 * kT) * 4 * mbs, outputs = 3 * kOutputBytes * mbs;
      QVERIFY(
          near(k.activations, layers * (kBlockActivationBytesCpu - a * s * s * 4) * mbs + head + outputs));
    }
    // The re-made matrix and attention output, one block, one microbatch, / tp, in the backward workspace.
    const double workspace = (kH * kT * kT + kT * kC) * 4 * mbs / tp;
    const double dw =
        ms::otherBreakdown(*selective, 0, false).workspace - ms::otherBreakdown(*none, 0, false).workspace;
    QVERIFY2(near(dw, workspace), qPrintable(QString("workspace +%1, expected %2").arg(dw).arg(workspace)));

    // Fused attention on the test's H100s: nothing to drop.
    json gpu = {{"parallel", {{"microbatches", 2}, {"tp", tp}, {"sequence_parallel", sequenceParallel}}}};
    MAKE_PLAN(fusedNone, 2, gpu);
    gpu["parallel"]["recompute"] = "selective";
    MAKE_PLAN(fusedSelective, 2, gpu);
    QVERIFY(ms::fusedAttention(*fusedSelective, 0));
    QCOMPARE(ms::estimateMemory(*fusedSelective).front().activations,
             ms::estimateMemory(*fusedNone).front().activations);
    QCOMPARE(ms::estimateMemory(*fusedSelective).front().other, ms::estimateMemory(*fusedNone).front().other);
  }

  // Tensor parallelism: with sequence parallelism all of a block's activations are split (its LayerNorm
  // outputs kept as sequence pieces); without it a block keeps its LayerNorm outputs, the residual and the
  // LayerNorm statistics whole (Korthikanti et al. 2022, Table 2).
  // Expert parallelism (memory_model.cpp expertParallelBytes, cost_model.cpp): a llama of 2 blocks, block 1
  // a mixture of 8 experts of width 96 (2 a token) and one shared; dp 4, one microbatch of 4 samples a rank.
  // ep 4 keeps 2 experts a rank instead of 8, and adds the received rows of block 1 to the activations (4
  // samples x 64 positions x 2 rows, each C = 64 fp32 values and 2 int32 indices); its forward adds two
  // all-to-alls of those rows over the ep group's NVLink and the counts' exchange.
  void expertParallelMemory() {
    const json moe = moeModel(1);
    json plain = moe, split = moe;
    plain["parallel"] = {{"dp", 4}};
    split["parallel"] = {{"dp", 4}, {"ep", 4}};
    MAKE_PLAN(ep1, 2, plain);
    MAKE_PLAN(ep4, 2, split);
    const auto a = ms::estimateMemory(*ep1).front(), b = ms::estimateMemory(*ep4).front();
    const double expertParams = 8.0 * 3 * kC * 96;  // block 1's routed experts
    // fp32 AdamW, ZeRO 0: 4 bytes of parameters, 4 of gradients, 8 of moments each.
    QVERIFY(near(a.parameters - b.parameters, expertParams * 3 / 4 * 4));
    QVERIFY(near(a.gradients - b.gradients, expertParams * 3 / 4 * 4));
    QVERIFY(near(a.optimizer - b.optimizer, expertParams * 3 / 4 * 8));
    const double rows = 4.0 * kT * 2;
    QVERIFY(near(b.activations - a.activations, rows * (kC * 4 + 8)));
    // The all-to-all: 2 of them per forward, (ep - 1) / ep of the rows' bytes leave the rank, plus (ep - 1)
    // latencies each and the counts' (ep - 1).
    const ms::CostModel c1(*ep1), c4(*ep4);
    const ms::LinkSpec& link = ep4->mesh.intraLink;
    const double expected = 2 * (0.75 * rows * kC * 4 / link.bandwidth + 3 * link.latency) + 3 * link.latency;
    QVERIFY(near(c4.forwardTime(0) - c1.forwardTime(0), expected, 1e-9));
    QVERIFY(near(ms::allToAllTime(rows * kC * 4, 4, link),
                 0.75 * rows * kC * 4 / link.bandwidth + 3 * link.latency));
    QCOMPARE(ms::allToAllTime(1e9, 1, link), 0.0);

    // ZeRO with experts (Megatron-Core's distributed optimizer): on 8 ranks at ep 4 each expert has 2
    // replicas, so ZeRO-1 shards the moments of the rank's 2 experts over 2 ranks and the rest of the model
    // over all 8; ZeRO-3 the parameters too. The gradient sync sums the experts over their 2 replicas only.
    for (int zero : {1, 3}) {
      json sharded = moe, whole = moe;
      sharded["parallel"] = {{"dp", 8}, {"ep", 4}, {"zero", zero}};
      whole["parallel"] = {{"dp", 8}, {"ep", 4}};
      MAKE_PLAN(z, 2, sharded);
      MAKE_PLAN(z0, 2, whole);
      const auto s = ms::estimateMemory(*z).front(), w = ms::estimateMemory(*z0).front();
      const double experts = expertParams / 4, dense = w.parameters / 4 - experts;  // fp32: 4 B each
      QVERIFY(near(s.optimizer, 8 * (dense / 8 + experts / 2)));
      QVERIFY(near(s.parameters, zero == 3 ? 4 * (dense / 8 + experts / 2) : w.parameters));
      QCOMPARE(ms::stageOwnedParameterCount(*z, 0), dense / 8 + experts / 2);
      QCOMPARE(ms::stageLocalExpertParameterCount(*z, 0), experts);
    }
    json zero2 = moe;
    zero2["parallel"] = {{"dp", 8}, {"ep", 4}, {"zero", 2}};
    MAKE_PLAN(z2, 2, zero2);
    const ms::CostModel cz(*z2);
    const double denseGrads = (ms::stageLocalParameterCount(*z2, 0) - expertParams / 4) * 4;
    // The tied wte (its own unit) is reduce-scattered apart from the rest of the dense gradients.
    const double tied = 256.0 * kC * 4;
    QVERIFY(near(cz.gradSyncTime(0),
                 ms::ringReduceScatterTime(denseGrads - tied, 8, link) +
                     ms::ringReduceScatterTime(tied, 8, link) +
                     ms::ringReduceScatterTime(expertParams / 4 * 4, 2, link),
                 1e-9));
  }

  // A mixture-of-experts block's workspace (runtime/moe.cpp, slots 14-23) beside the dense block's, per
  // sample of T positions with R = k T routed rows, balanced: the experts' input copy (T C), the router's
  // logits (T E); without ep one expert's rows and their gradient (2 R/E C) and its scratch (R/E (3 Fe + C)),
  // in bf16 the fp32 staging of every row's gate|up, SwiGLU output and output (R (3 Fe + C)); with ep the
  // received rows and their gradient (2 R C), the widest local expert's scratch (R / (E/ep) 3 Fe), the
  // all-to-all's two staging buffers (2 R C), in bf16 R (3 Fe + C). The same model with both blocks dense
  // has the rest.
  void expertWorkspace() {
    const json moe = moeModel(0);
    const double E = 8, R = 2 * kT, Fe = 96;
    for (int ep : {1, 4})
      for (const char* precision : {"fp32", "bf16"}) {
        json withExperts = moe, dense = moe;
        dense["model"]["dense_layers"] = 2;
        withExperts["parallel"] = dense["parallel"] = {{"dp", 4}, {"ep", ep}, {"precision", precision}};
        dense["parallel"]["ep"] = 1;
        MAKE_PLAN(a, 2, withExperts);
        MAKE_PLAN(b, 2, dense);
        const bool bf16 = std::string(precision) == "bf16";
        double floats = kT * kC + std::max(kT * E, R);
        if (ep == 1)
          floats += 2 * R / E * kC + R / E * (3 * Fe + kC);
        else
          floats += 4 * R * kC + R / (E / ep) * 3 * Fe;
        if (bf16) floats += R * (3 * Fe + kC) + (ep > 1 ? R * kC : 0.0);  // and the bf16 rows on the wire
        const double mbs = a->microbatchSize();
        const double dw =
            ms::otherBreakdown(*a, 0, true).workspace - ms::otherBreakdown(*b, 0, true).workspace;
        QVERIFY2(near(dw, floats * 4 * mbs), qPrintable(QString("ep %1 %2: workspace +%3, expected %4")
                                                            .arg(ep)
                                                            .arg(precision)
                                                            .arg(dw)
                                                            .arg(floats * 4 * mbs)));
      }
  }

  // The most uneven routing (Routing::Uneven, memory_model.h): of a source's T tokens an expert takes at most
  // T rows, a rank's E/ep experts at most min(k, E/ep) rows a token from each of ep sources. Block 1 of the
  // test llama, E 8, k 2, R = 2T: without ep the busiest expert's rows go from R/E = T/4 to T (its gathered
  // rows, their gradient and scratch: 2C + 3Fe + C floats a row); at ep 4 (2 experts a rank) the received
  // rows go from R = 2T to 4 x 2T and the widest expert's from T to 4T: the activations keep the received
  // rows (C fp32 + 2 int32) and the experts' outputs of them (3 Fe), the workspace their copy and gradient
  // and the all-to-all's receive staging (3C a row) and the widest expert's scratch (3Fe). A capacity factor
  // of 1 leaves nothing uneven; plan --json states the bound for routed experts only.
  void unevenRoutingBound() {
    const json moe = moeModel(0);
    const double Fe = 96;
    for (int ep : {1, 4}) {
      json config = moe;
      config["parallel"] = {{"dp", 4}, {"ep", ep}};
      MAKE_PLAN(plan, 2, config);
      const double mbs = plan->microbatchSize();
      const double dw = ms::otherBreakdown(*plan, 0, false, ms::Routing::Uneven).workspace -
                        ms::otherBreakdown(*plan, 0, false).workspace;
      const auto balanced = ms::estimateMemory(*plan).front();
      const auto uneven = ms::estimateMemory(*plan, ms::Routing::Uneven).front();
      const double da = uneven.activations - balanced.activations;
      if (ep == 1) {
        QVERIFY(near(dw, (kT - kT / 4) * (3 * kC + 3 * Fe) * 4 * mbs));
        QCOMPARE(da, 0.0);
      } else {
        QVERIFY(near(dw, ((8 * kT - 2 * kT) * 3 * kC + (4 * kT - kT) * 3 * Fe) * 4 * mbs));
        // and the local experts' kept gate|up and SwiGLU outputs of the extra rows (3 Fe fp32 each).
        QVERIFY(near(da, (8 * kT - 2 * kT) * mbs * (kC * 4 + 8 + 3 * Fe * 4)));
      }
      QVERIFY(dw > 0);
      QCOMPARE(balanced.unevenRoutingTotal, uneven.total());
      QCOMPARE(uneven.unevenRoutingTotal, 0.0);
      QVERIFY(uneven.total() >= balanced.total() + dw);  // the workspace is held the whole step
      QCOMPARE(ms::memoryBytesJson(balanced)["uneven_routing_total"].get<double>(), uneven.total());
    }
    json capped = moe;
    capped["model"]["capacity_factor"] = 1.0;
    capped["parallel"] = {{"dp", 4}};
    MAKE_PLAN(c, 2, capped);
    const auto m = ms::estimateMemory(*c).front();
    QCOMPARE(m.unevenRoutingTotal, m.total());
    json dense = moe;
    dense["model"]["dense_layers"] = 2;
    MAKE_PLAN(d, 2, dense);
    QCOMPARE(ms::estimateMemory(*d).front().unevenRoutingTotal, 0.0);
    QVERIFY(!ms::memoryBytesJson(ms::estimateMemory(*d).front()).contains("uneven_routing_total"));
  }

  // Context parallelism (model_spec.h, memory_model.cpp, cost_model.cpp): a llama of 2 blocks (C 64, H 4,
  // KV 2, F 128) on 2 H100s as cp 2 against dp 2. Each cp rank holds half of every sequence, so its blocks
  // keep T/2 (7C + 3F + 2) floats a sample plus ring attention's fp32 row log-sum-exps (H T/2), on a CPU as
  // on a GPU; its GEMMs do half the FLOPs and its attention half the query-key pairs. Per rank that is what a
  // dp 2 rank does with half the samples of whole sequences (the same tokens, the same causal pairs), and
  // ZeRO-1 shards the moments over the dp x cp ranks as over dp: the same model states. What cp adds is the
  // ring: per block cp - 1 transfers of the key|value heads (KV of them, not H) in forward, each exposed
  // where it outlasts the attention of the block in hand, and in backward the same beside twice that
  // compute plus cp dK|dV transfers.
  void contextParallelMemory() {
    const json llama = {{"model", {{"type", "llama"}, {"kv_heads", 2}, {"ffn_hidden", 128}}}};
    json byDp = llama, byCp = llama;
    byDp["parallel"] = {{"dp", 2}, {"zero", 1}};
    byCp["parallel"] = {{"cp", 2}, {"zero", 1}};
    MAKE_PLAN(dp2, 2, byDp);
    MAKE_PLAN(cp2, 2, byCp);
    QCOMPARE(cp2->model.samplePositions, int(kT / 2));
    QCOMPARE(cp2->model.contextParallel, 2);
    QCOMPARE(cp2->layout.world(), 2);
    const double F = 128, Tl = kT / 2;
    const ms::LayerSpec& block = cp2->model.layers[1];
    QVERIFY(block.ringAttention);
    for (bool fused : {false, true})
      for (ms::Precision precision : {ms::Precision::Fp32, ms::Precision::Bf16}) {
        const double bf16Part = precision == ms::Precision::Bf16 ? 0.5 * Tl * (7 * kC + 3 * F) * 4 : 0.0;
        QVERIFY(near(block.keptBytesPerSample(precision, fused),
                     (Tl * (7 * kC + 3 * F) + 2 * Tl + kH * Tl) * 4 - bf16Part));
      }
    const ms::LayerSpec& whole = dp2->model.layers[1];
    QVERIFY(near(block.attentionFlopsPerSample, whole.attentionFlopsPerSample / 2));
    QVERIFY(near(block.forwardFlopsPerSample, whole.forwardFlopsPerSample / 2));
    const auto a = ms::estimateMemory(*dp2).front(), b = ms::estimateMemory(*cp2).front();
    QVERIFY(near(a.parameters, b.parameters));
    QVERIFY(near(a.optimizer, b.optimizer));
    QVERIFY(near(a.activations, b.activations));
    // The simulator counts the model's FLOPs per step and tokens per second over every slice.
    const ms::CostModel cd(*dp2), cc(*cp2);
    QVERIFY(near(ms::simulate(*dp2, cd).modelFlopsPerStep, ms::simulate(*cp2, cc).modelFlopsPerStep));
    // The ring: 8 samples of whole sequences a dp rank, 16 half sequences a cp rank; the same compute.
    const ms::LinkSpec& link = cp2->mesh.intraLink;
    const ms::DeviceSpec& device = cp2->mesh.devices[0].spec;
    const double rate = device.peakFlops(ms::Precision::Fp32) * device.achievableFraction;
    const double step = block.attentionFlopsPerSample * 16 / rate / 2;
    // The block: the 2 key/value heads of 16 (head size), fp32.
    const double transfer = link.latency + 16 * Tl * 2 * 2 * 16 * 4 / link.bandwidth;
    const double forward = std::max(0.0, transfer - step);
    const double backward = std::max(0.0, transfer - 2 * step) + 2 * transfer;
    QVERIFY(forward > 0);
    QVERIFY(near(cc.forwardTime(0) - cd.forwardTime(0), 2 * forward, 1e-9));
    QVERIFY(near(cc.backwardTime(0) - cd.backwardTime(0), 2 * backward, 1e-9));
  }

  void tensorParallelActivations() {
    MAKE_PLAN(tp1, 2, (json{{"parallel", {{"microbatches", 2}}}}));
    MAKE_PLAN(tp2sp, 2, (json{{"parallel", {{"microbatches", 2}, {"tp", 2}, {"sequence_parallel", true}}}}));
    MAKE_PLAN(tp2, 2, (json{{"parallel", {{"microbatches", 2}, {"tp", 2}}}}));
    const double one = ms::estimateMemory(*tp1).front().activations;
    const double sp = ms::estimateMemory(*tp2sp).front().activations;
    const double plain = ms::estimateMemory(*tp2).front().activations;
    // pp = 1, 1F1B on one stage: one microbatch (8 samples) in flight; two blocks and the head. The head
    // keeps ln_f's input gradient (T * C), its row statistics and the losses (3 * T), whole on every TP rank.
    const double mbs = 8;
    const double replicated = 2 * (3 * kT * kC + 4 * kT) * 4 * mbs;
    const double head = (kT * kC + 3 * kT) * 4 * mbs;
    const double blocks = 2 * kBlockActivationBytes * mbs;
    // Layer outputs (embedding and two blocks) stay whole, but under sequence parallelism the first block's,
    // which the second takes as this rank's piece of the sequence.
    const double outputs = 3 * kOutputBytes * mbs;
    QVERIFY(near(one, blocks + head + outputs));
    QVERIFY(near(sp, blocks / 2 + head + outputs - kOutputBytes * mbs / 2));
    QVERIFY(near(plain, replicated + (blocks - replicated) / 2 + head + outputs));
    QVERIFY(plain > sp && plain < one);
  }

  // One transformer layer's activations in bf16 against Korthikanti et al. 2022 ("Reducing Activation
  // Recomputation in Large Transformer Models", section 4, Table 2): per layer s b h (34 + 5 a s / h) bytes
  // with 16-bit activations, of which the dropout masks (2 s b h) and attention's dropout mask and output (3
  // a s^2 b) do not exist here (no dropout): s b h (32 + 2 a s / h). Under tensor parallelism t the LayerNorm
  // inputs and outputs stay whole, s b h (8 + 24 / t + 2 a s / (h t)); under sequence parallelism everything
  // is split, the layer's output too (the next block's input, kept as this rank's sequence piece), so
  // s b h (32 + 2 a s / h) / t. The LayerNorm statistics (4 fp32 values per row, s b * 16 bytes, / t under
  // sequence parallelism) come on top: the paper leaves them out. One layer is the difference between a
  // 3-block and a 2-block model (a block between two blocks; the last block's output is whole either way); a
  // CPU mesh, where the softmax is materialised.
  void korthikantiLayerBytes_data() {
    QTest::addColumn<int>("tp");
    QTest::addColumn<bool>("sequenceParallel");
    QTest::newRow("t1") << 1 << false;
    QTest::newRow("t2") << 2 << false;
    QTest::newRow("t4") << 4 << false;
    QTest::newRow("t2 sequence parallel") << 2 << true;
    QTest::newRow("t4 sequence parallel") << 4 << true;
  }
  void korthikantiLayerBytes() {
    QFETCH(int, tp);
    QFETCH(bool, sequenceParallel);
    auto chunkBytes = [&](int layers) {
      json doc = baseConfig(layers);
      doc["mesh"]["nodes"][0]["device"] = "cpu";
      doc["parallel"] = {{"tp", tp}, {"sequence_parallel", sequenceParallel}, {"precision", "bf16"}};
      ms::Expected<ms::RunConfig> config = ms::parseRunConfig(doc);
      if (!config) return -1.0;
      ms::Expected<ms::Plan> plan = ms::buildPlan(*config);
      return plan ? ms::chunkActivationBytes(*plan).at(0) : -1.0;
    };
    const double two = chunkBytes(2), three = chunkBytes(3);
    QVERIFY(two > 0 && three > 0);
    const double s = kT, b = 16, h = kC, a = kH, t = tp;  // one microbatch of the whole batch (16)
    const double statistics = s * b * 16 / (sequenceParallel ? t : 1);
    const double paper = sequenceParallel ? s * b * h * (32 + 2 * a * s / h) / t
                                          : s * b * h * (8 + 24 / t + 2 * a * s / (h * t));
    if (tp == 1) QCOMPARE(paper, s * b * h * (34 + 5 * a * s / h) - 2 * s * b * h - 3 * a * s * s * b);
    QVERIFY2(near(three - two, paper + statistics),
             qPrintable(QString("one layer %1 bytes, Korthikanti %2 + statistics %3")
                            .arg(three - two)
                            .arg(paper)
                            .arg(statistics)));
  }

  // A placement with one block on stage 0 and five on stage 1: stage 1 holds more of everything but the
  // embedding-heavy parameters.
  void unevenStages() {
    const json placement = json::array(
        {{{"stage", 0}, {"layers", {"embedding", "block.0"}}},
         {{"stage", 1}, {"layers", {"block.1", "block.2", "block.3", "block.4", "block.5", "head"}}}});
    MAKE_PLAN(plan, 6, (json{{"parallel", {{"pp", 2}, {"microbatches", 4}, {"placement", placement}}}}));
    const auto ranks = ms::estimateMemory(*plan);
    const auto& s0 = ofStage(ranks, 0);
    const auto& s1 = ofStage(ranks, 1);
    QVERIFY(near(s0.parameters, 4 * (kEmbeddingParams + kBlockParams)));
    QVERIFY(near(s1.parameters, 4 * (5 * kBlockParams + kHeadParams + kV * kC)));
    QVERIFY(s1.parameters > s0.parameters);
    // 1F1B: stage 0 keeps 2 microbatches of one block and two outputs, stage 1 one microbatch of five blocks
    // and the head.
    QVERIFY(near(s0.activations, 2 * 4 * (kBlockActivationBytes + 2 * kOutputBytes)));
    QVERIFY(s1.activations > s0.activations);
    QVERIFY(s1.total() > s0.total());
  }

  // Other: p2p buffers (the first stage's one received gradient), the CUDA context on GPUs only; fits
  // compares the total with the device's memory.
  void otherAndFits() {
    MAKE_PLAN(plan, 2, (json{{"parallel", {{"pp", 2}, {"microbatches", 2}}}}));
    const ms::OtherBytes other = ms::otherBreakdown(*plan, 0, true);
    const double message = kT * kC * 4 * 8;  // block.0's output for a microbatch of 8 samples
    QCOMPARE(other.p2pBuffers, message);
    QCOMPARE(other.context, 600 * kMiB);
    QCOMPARE(other.dpBucket, 0.0);
    QCOMPARE(ms::otherBreakdown(*plan, 0, false).context, 0.0);
    // The last stage's workspace is the larger of the fused head's (ln_f's output and the input gradient,
    // 2 T * C, and one chunk of logits: here all 8 * T rows of V, under headChunkRows' 64M floats) and a
    // block's backward scratch ((5C + 2F) T + H T floats per sample with fused attention, F = 4C, H = 4,
    // plus the activation-gradient buffers: block.1's output gradient, which the head writes, is the stage's
    // only one, a T * C buffer; block.1's input gradient goes to the outgoing message).
    const double blockScratch = ((5 * kC + 2 * kF) * kT + kH * kT) * 4 * 8 + 1.0 * kT * kC * 4 * 8;
    const double headScratch = (2 * kT * kC + kT * kV) * 4 * 8;
    // The runtime's workspace is slots (runtime/memory.h): the logits chunk shares slot 1 with a block's
    // (T, C) gradient per sample, so the stage holds the blocks' scratch plus the chunk's excess over it.
    const double slotExcess = std::max(0.0, double(kT * kV - kT * kC)) * 4 * 8;
    QCOMPARE(ms::otherBreakdown(*plan, 1, true).workspace, std::max(headScratch, blockScratch + slotExcess));
    // GPT-2's vocabulary: a chunk of 64M floats is 1334 rows of 50304, rounded down to 1280.
    QCOMPARE(ms::headChunkRows(8192, 50304), int64_t(1280));
    QCOMPARE(ms::headChunkRows(8192, 25152), int64_t(2624));
    QCOMPARE(ms::headChunkRows(512, 256), int64_t(512));
    QCOMPARE(ms::headChunkRows(100, int64_t(1) << 27), int64_t(1));
    QCOMPARE(ms::headChunkRows(100, int64_t(1) << 25), int64_t(2));  // under 64 rows: not rounded
    QCOMPARE(ms::headChunkRows(1000, int64_t(1) << 20), int64_t(64));
    QCOMPARE(ms::headChunkRows(0, 256), int64_t(0));

    auto ranks = ms::estimateMemory(*plan);
    for (const auto& m : ranks) {
      QCOMPARE(m.capacity, 85.017493504e9);  // the H100 as measured (plan/hardware.cpp)
      QVERIFY(m.fits());
      QVERIFY(near(m.categorySum(), m.parameters + m.gradients + m.optimizer + m.activations + m.other));
      QVERIFY(near(m.total(), m.categorySum() - m.notAtOnce));
      QVERIFY(m.notAtOnce >= 0);
      QVERIFY(near(m.other, ms::otherBreakdown(*plan, m.stage, true).total()));
    }
    // fp32 converts no GEMM operand; bf16 on a GPU keeps bf16 copies of the largest fp32 output gradient and
    // fp32 input its GEMMs read (kernels/cuda/cuda_blas.cu's scratch): on the last stage the head's chunk of
    // logits gradients (8 * T rows of V) and of ln_f's output rows (8 * T rows of C), two bytes each; on the
    // first a block's (T, F) output gradient per sample of the microbatch of 8. Not on CPUs.
    QCOMPARE(ms::otherBreakdown(*plan, 1, true).gemmScratch, 0.0);
    MAKE_PLAN(bf16, 2, (json{{"parallel", {{"pp", 2}, {"microbatches", 2}, {"precision", "bf16"}}}}));
    QCOMPARE(ms::otherBreakdown(*bf16, 1, true).gemmScratch, 2.0 * 8 * kT * (kV + kC));
    QCOMPARE(ms::otherBreakdown(*bf16, 0, true).gemmScratch, 2.0 * 8 * kT * kF);
    QCOMPARE(ms::otherBreakdown(*bf16, 1, false).gemmScratch, 0.0);
    QVERIFY(near(ms::estimateMemory(*bf16)[1].other, ms::otherBreakdown(*bf16, 1, true).total()));

    ms::Plan small = *plan;
    for (auto& d : small.mesh.devices) d.spec.memoryBytes = 100 * kMiB;  // under the CUDA context alone
    for (const auto& m : ms::estimateMemory(small)) {
      QCOMPARE(m.capacity, 100 * kMiB);
      QVERIFY(!m.fits());
    }
  }
};

QTEST_APPLESS_MAIN(TestMemoryModel)
#include "tst_memory_model.moc"
