// The frameworks' file formats (plan/framework_text.h): the words of a Megatron-LM style bash launch script
// after its variables and arrays are expanded, and TOML as torchtitan's job files write it, with every error
// naming the line.
#include <QtTest>

#include <fstream>
#include <sstream>

#include "plan/framework_text.h"
#include "plan/frameworks.h"
#include "plan/plan.h"

using namespace ms;
using nlohmann::json;

namespace {

std::string readText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool mentions(const std::vector<std::string>& list, const std::string& what) {
  for (const std::string& s : list)
    if (s.find(what) != std::string::npos) return true;
  return false;
}

std::string joined(const std::vector<std::string>& list) {
  std::string out;
  for (const std::string& s : list) out += "\n  " + s;
  return out;
}

// A language-model plan on `nodes` nodes of `perNode` H100s.
RunConfig lmPlan(ModelType type, int layers, int nodes, int perNode) {
  RunConfig c;
  c.name = "roundtrip";
  c.model.type = type;
  c.model.layers = layers;
  c.model.width = 256;
  c.model.heads = 8;
  c.model.vocab = 512;
  c.model.context = 128;
  c.data.kind = DataKind::Text;
  c.data.files = {"data.txt"};
  c.mesh.nodes.clear();
  for (int n = 0; n < nodes; ++n) c.mesh.nodes.push_back({"n" + std::to_string(n), "h100-sxm-80gb", perNode});
  c.mesh.intraLink = "nvlink";
  c.mesh.interLink = "infiniband";
  c.training.seqLen = 128;
  c.training.steps = 500;
  c.training.warmupSteps = 20;
  c.training.evalEvery = 100;
  c.training.evalBatches = 4;
  c.training.checkpointEvery = 250;
  c.training.logEvery = 10;
  c.optimizer.lr = 3e-4;
  c.optimizer.weightDecay = 0.1;
  return c;
}

// The plans the round trips cover: every dimension, uneven and interleaved placements, each ZeRO stage, both
// recompute forms, both precisions, offload.
std::vector<std::pair<std::string, RunConfig>> roundTripPlans() {
  std::vector<std::pair<std::string, RunConfig>> plans;
  {
    RunConfig c = lmPlan(ModelType::Gpt, 8, 2, 4);  // dp2 tp2 pp2
    c.parallel.dp = 2;
    c.parallel.tp = 2;
    c.parallel.pp = 2;
    c.parallel.microbatches = 4;
    c.training.batchSize = 16;
    c.parallel.zero = 1;
    c.parallel.recompute = Recompute::Selective;
    c.parallel.precision = Precision::Bf16;
    c.parallel.sequenceParallel = true;
    plans.emplace_back("gpt dp2 tp2 pp2 zero1 selective bf16 sp", c);
  }
  {
    RunConfig c = lmPlan(ModelType::Llama, 8, 2, 8);  // dp1 cp2 tp2 pp4, interleaved 2
    c.model.kvHeads = 2;
    c.model.ropeTheta = 500000;
    c.parallel.cp = 2;
    c.parallel.tp = 2;
    c.parallel.pp = 4;
    c.parallel.schedule = Schedule::Interleaved1F1B;
    c.parallel.virtualChunks = 2;
    c.parallel.microbatches = 8;
    c.training.batchSize = 8;
    c.parallel.recompute = Recompute::Full;
    c.parallel.recomputeLayers = 1;
    c.parallel.precision = Precision::Bf16;
    c.parallel.gradPrecision = GradPrecision::Bf16;
    plans.emplace_back("llama gqa cp2 tp2 pp4 interleaved full recompute", c);
  }
  {
    RunConfig c = lmPlan(ModelType::Llama, 6, 1, 8);  // MoE dp4 ep4 pp2, uneven placement, zero3
    c.model.experts = 8;
    c.model.expertsPerToken = 2;
    c.model.expertFfnHidden = 384;
    c.model.sharedExperts = 1;
    c.model.denseLayers = 1;
    c.model.auxLossCoef = 0.001;
    c.parallel.dp = 4;
    c.parallel.ep = 4;
    c.parallel.pp = 2;
    c.parallel.microbatches = 2;
    c.training.batchSize = 16;
    c.parallel.zero = 3;
    c.parallel.placement = {{0, {"embedding", "block.0"}},
                            {1, {"block.1", "block.2", "block.3", "block.4", "block.5", "head"}}};
    plans.emplace_back("llama moe dp4 ep4 pp2 uneven zero3", c);
  }
  {
    RunConfig c =
        lmPlan(ModelType::Gpt, 6, 1, 6);  // untied, sgd, pp3 with the embedding alone, full recompute
    c.model.tieEmbeddings = false;
    c.model.mlpRatio = 2;
    c.optimizer.type = OptimizerType::Sgd;
    c.optimizer.momentum = 0.8;
    c.parallel.dp = 2;
    c.parallel.pp = 3;
    c.parallel.microbatches = 3;
    c.training.batchSize = 12;
    c.parallel.zero = 2;
    c.parallel.recompute = Recompute::Full;
    c.parallel.offload = Offload::Optimizer;
    c.parallel.precision = Precision::Bf16;
    c.parallel.placement = {{0, {"embedding"}},
                            {1, {"block.0", "block.1", "block.2"}},
                            {2, {"block.3", "block.4", "block.5", "head"}}};
    c.training.lrSchedule = LrSchedule::Linear;
    c.training.minLrRatio = 0.25;
    plans.emplace_back("gpt untied sgd pp3 embedding alone zero2 offload", c);
  }
  return plans;
}

// Plans of torchtitan's debugmodel shape (llama3 "debugmodel": width 256, 6 layers, 16 heads, vocabulary
// 2048, RoPE base 500000, untied), the shape the round trips can name as a flavor.
RunConfig titanPlan(int nodes, int perNode) {
  RunConfig c = lmPlan(ModelType::Llama, 6, nodes, perNode);
  c.model.heads = 16;
  c.model.vocab = 2048;
  c.model.ropeTheta = 500000;
  c.model.tieEmbeddings = false;
  c.parallel.precision = Precision::Bf16;
  return c;
}

std::vector<std::pair<std::string, RunConfig>> titanPlans() {
  std::vector<std::pair<std::string, RunConfig>> plans;
  {
    RunConfig c = titanPlan(1, 8);  // FSDP 2 x tp2 x pp2 interleaved
    c.parallel.dp = 2;
    c.parallel.tp = 2;
    c.parallel.sequenceParallel = true;
    c.parallel.pp = 2;
    c.parallel.schedule = Schedule::Interleaved1F1B;
    c.parallel.virtualChunks = 2;
    c.parallel.microbatches = 4;
    c.training.batchSize = 16;
    c.parallel.zero = 3;
    c.parallel.recompute = Recompute::Selective;
    c.parallel.tpCommOverlap = true;  // async tensor parallelism (under torch.compile)
    plans.emplace_back("titan fsdp2 tp2 pp2 interleaved selective async tp", c);
  }
  {
    RunConfig c = titanPlan(2, 4);  // ZeRO-2 (reshard never) over 4 x cp2, full recompute, accumulation
    c.parallel.dp = 4;
    c.parallel.cp = 2;
    c.parallel.microbatches = 2;
    c.training.batchSize = 16;
    c.parallel.zero = 2;
    c.parallel.recompute = Recompute::Full;
    c.training.lrSchedule = LrSchedule::Cosine;
    plans.emplace_back("titan zero2 dp4 cp2 full recompute accumulation", c);
  }
  {
    RunConfig c = titanPlan(1, 4);  // DDP x pp2 GPipe with an uneven placement, fp32, constant lr
    c.parallel.dp = 2;
    c.parallel.pp = 2;
    c.parallel.schedule = Schedule::GPipe;
    c.parallel.microbatches = 4;
    c.training.batchSize = 8;
    c.parallel.precision = Precision::Fp32;
    c.parallel.placement = {{0, {"embedding", "block.0"}},
                            {1, {"block.1", "block.2", "block.3", "block.4", "block.5", "head"}}};
    c.training.lrSchedule = LrSchedule::Constant;
    plans.emplace_back("titan ddp2 pp2 gpipe uneven fp32", c);
  }
  return plans;
}

// The fields a round trip keeps, compared one by one (the names say which differs).
void compareRoundTrip(const std::string& name, const RunConfig& config, const RunConfig& back) {
  QVERIFY2(
      back.model == config.model,
      (name + ":\n" + toJson(back).at("model").dump() + "\n" + toJson(config).at("model").dump()).c_str());
  const ParallelConfig& a = config.parallel;
  const ParallelConfig& b = back.parallel;
  QCOMPARE(b.dp, a.dp);
  QCOMPARE(b.tp, a.tp);
  QCOMPARE(b.pp, a.pp);
  QCOMPARE(b.cp, a.cp);
  QCOMPARE(b.ep, a.ep);
  QCOMPARE(b.microbatches, a.microbatches);
  QCOMPARE(b.virtualChunks, a.virtualChunks);
  if (a.pp > 1) QCOMPARE(int(b.schedule), int(a.schedule));
  QCOMPARE(b.zero, a.zero);
  QCOMPARE(int(b.recompute), int(a.recompute));
  QCOMPARE(b.recomputeLayers, a.recomputeLayers);
  QCOMPARE(int(b.precision), int(a.precision));
  QCOMPARE(int(b.gradPrecision), int(a.gradPrecision));
  QCOMPARE(int(b.offload), int(a.offload));
  QCOMPARE(b.sequenceParallel, a.sequenceParallel);
  QCOMPARE(b.tpCommOverlap, a.tpCommOverlap);
  QCOMPARE(b.overlapParamGather, a.overlapParamGather);
  QVERIFY2(back.optimizer == config.optimizer,
           (name + ":\n" + toJson(back).at("optimizer").dump() + "\n" + toJson(config).at("optimizer").dump())
               .c_str());
  QCOMPARE(back.training.batchSize, config.training.batchSize);
  QCOMPARE(back.training.seqLen, config.training.seqLen);
  QCOMPARE(back.training.steps, config.training.steps);
  QCOMPARE(back.training.warmupSteps, config.training.warmupSteps);
  QCOMPARE(int(back.training.lrSchedule), int(config.training.lrSchedule));
  QCOMPARE(back.training.minLrRatio, config.training.minLrRatio);
  QCOMPARE(back.training.gradClip, config.training.gradClip);
  QCOMPARE(back.training.logEvery, config.training.logEvery);
  QCOMPARE(back.mesh.nodes.size(), config.mesh.nodes.size());
  QCOMPARE(back.mesh.nodes[0].count, config.mesh.nodes[0].count);
  Expected<Plan> p1 = buildPlan(config), p2 = buildPlan(back);
  QVERIFY2(p1.isOk(), p1.message().c_str());
  QVERIFY2(p2.isOk(), p2.message().c_str());
  QCOMPARE(p2->partition.chunks, p1->partition.chunks);
  QCOMPARE(p2->partition.stageOf, p1->partition.stageOf);
}

std::vector<std::string> wordsOf(const std::string& script) {
  Expected<ShellWords> w = shellWords(script);
  if (!w) qFatal("shellWords: %s", w.message().c_str());
  return w->words;
}

}  // namespace

class TestFrameworks : public QObject {
  Q_OBJECT
 private slots:
  // The shape of Megatron-LM's examples: arrays of flags over several lines with comments and continuations,
  // expanded quoted and unquoted into the torchrun line.
  void shellArraysAndVariables() {
    const std::string script = R"(#!/bin/bash
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
NUM_NODES=${SLURM_NNODES:-4}
DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE   # one rank a GPU
    --nnodes $NUM_NODES
)
MODEL_ARGS=(
    --num-layers 96
    --hidden-size 12288 --num-attention-heads 96 \
    --seq-length 2048
)
PARALLEL=(--tensor-model-parallel-size 8)
PARALLEL+=(--sequence-parallel)
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    "${MODEL_ARGS[@]}" ${PARALLEL[@]} --data-path "my data" --lr 6.0e-5; echo done
)";
    const std::vector<std::string> expected = {"torchrun",
                                               "--nproc_per_node",
                                               "8",
                                               "--nnodes",
                                               "4",
                                               "pretrain_gpt.py",
                                               "--num-layers",
                                               "96",
                                               "--hidden-size",
                                               "12288",
                                               "--num-attention-heads",
                                               "96",
                                               "--seq-length",
                                               "2048",
                                               "--tensor-model-parallel-size",
                                               "8",
                                               "--sequence-parallel",
                                               "--data-path",
                                               "my data",
                                               "--lr",
                                               "6.0e-5",
                                               "echo",
                                               "done"};
    QCOMPARE(wordsOf(script), expected);
  }

  void shellQuotingAndUnknowns() {
    Expected<ShellWords> w = shellWords(
        "A='x y'\nB=\"$A z\"\nrun \"$B\" $B 'lit $A' \\$A $(nproc) $1 \"${MISSING}\" ${C:-dflt}\n");
    QVERIFY2(w.isOk(), w.message().c_str());
    const std::vector<std::string> expected = {"run",    "x y z", "x",        "y", "z",
                                               "lit $A", "$A",    "$(nproc)", "",  "dflt"};
    QCOMPARE(w->words, expected);
    QCOMPARE(w->unexpanded, std::vector<std::string>({"$(nproc)"}));
    QCOMPARE(w->unset, std::vector<std::string>({"1", "MISSING"}));
  }

  void shellErrorsNameTheLine() {
    const std::pair<const char*, const char*> cases[] = {
        {"a=1\nrun 'abc\n", "line 2: unterminated single quote"},
        {"run \"abc\n\n", "line 1: unterminated double quote"},
        {"X=(\n --a 1\n", "line 1: unterminated array"},
    };
    for (const auto& [text, message] : cases) {
      Expected<ShellWords> w = shellWords(text);
      QVERIFY2(!w.isOk(), text);
      QVERIFY2(w.message().find(message) != std::string::npos, w.message().c_str());
    }
  }

  void tomlAsTorchtitanWritesIt() {
    Expected<json> t = parseToml(R"(# a job
[job]
description = "Llama 3 70B training"

[model]
name = "llama3"
flavor = "70B"

[optimizer]
lr = 1.5e-4
eps = 1e-8

[training]
local_batch_size = 8
steps = 1_000
mixed_precision_param = 'bfloat16'
enable = true

[parallelism]
data_parallel_shard_degree = -1
module_fqns_per_model_part = [
  ["tok_embeddings", "layers.0"],   # stage 0
  ["layers.1", "norm", "output"],
]
[activation_checkpoint]
mode = "full"  # the whole block
x = { a = 0x10, b.c = "d\tq\u00e9" }
[[float8.rules]]
name = "one"
[[float8.rules]]
name = "two"
)");
    QVERIFY2(t.isOk(), t.message().c_str());
    QCOMPARE((*t)["model"]["flavor"].get<std::string>(), std::string("70B"));
    QCOMPARE((*t)["optimizer"]["lr"].get<double>(), 1.5e-4);
    QVERIFY((*t)["training"]["steps"].is_number_integer());
    QCOMPARE((*t)["training"]["steps"].get<int>(), 1000);
    QCOMPARE((*t)["training"]["mixed_precision_param"].get<std::string>(), std::string("bfloat16"));
    QCOMPARE((*t)["training"]["enable"].get<bool>(), true);
    QCOMPARE((*t)["parallelism"]["data_parallel_shard_degree"].get<int>(), -1);
    QCOMPARE((*t)["parallelism"]["module_fqns_per_model_part"][1][2].get<std::string>(),
             std::string("output"));
    QCOMPARE((*t)["activation_checkpoint"]["x"]["a"].get<int>(), 16);
    QCOMPARE((*t)["activation_checkpoint"]["x"]["b"]["c"].get<std::string>(), std::string("d\tq\xc3\xa9"));
    QCOMPARE((*t)["float8"]["rules"].size(), size_t(2));
    QCOMPARE((*t)["float8"]["rules"][1]["name"].get<std::string>(), std::string("two"));
  }

  void tomlErrorsNameTheLine() {
    const std::pair<const char*, const char*> cases[] = {
        {"[a]\nx = 1\n[a]\n", "line 3: table [a] is defined twice"},
        {"x = 1\nx = 2\n", "line 2: the key 'x' is defined twice"},
        {"x = 2024-01-01\n", "line 1: dates and times are not supported"},
        {"x = \"abc\ny = 1\n", "line 1: a newline inside a one-line string"},
        {"x = [1, 2\n", "expected ',' or ']' in an array"},
        {"x = 01\n", "line 1: a leading zero"},
        {"x = 1 2\n", "line 1: unexpected text after a value"},
        {"x = 1__0\n", "line 1: a misplaced '_'"},
        {"\n\nx = \"\\q\"\n", "line 3: an unknown escape"},
        {"= 3\n", "line 1: expected a key"},
    };
    for (const auto& [text, message] : cases) {
      Expected<json> t = parseToml(text);
      QVERIFY2(!t.isOk(), text);
      QVERIFY2(t.message().find(message) != std::string::npos, t.message().c_str());
    }
  }

  // Written values read back as the same values and types (a float stays a float).
  void tomlValuesRoundTrip() {
    const json values = json::array({1, -7, 1.0, 1.5e-4, 3e-9, 0.1, 6.25e21, "a \"quoted\"\\ \n line", true,
                                     false, json::array({1, 2}), json::array({"x", "y"})});
    for (const json& v : values) {
      const std::string text = "k = " + tomlValue(v) + "\n";
      Expected<json> t = parseToml(text);
      QVERIFY2(t.isOk(), (text + t.message()).c_str());
      QCOMPARE((*t)["k"], v);
      QCOMPARE((*t)["k"].type(), v.type());
    }
    QCOMPARE(tomlKey("tensor_parallel_degree"), std::string("tensor_parallel_degree"));
    QCOMPARE(tomlKey("a.b"), std::string("\"a.b\""));
  }

  // The vocabularies are built in, with where they came from.
  void vocabulariesAreBuiltIn() {
    for (Framework f : {Framework::Megatron, Framework::Torchtitan, Framework::DeepSpeed}) {
      const FrameworkVocabulary& v = frameworkVocabulary(f);
      QVERIFY2(v.names.size() > 50, frameworkName(f));
      QCOMPARE(v.commit.size(), size_t(40));
      QVERIFY(!v.version.empty());
    }
    QVERIFY(frameworkVocabulary(Framework::Megatron).knows("--tensor-model-parallel-size"));
    QVERIFY(!frameworkVocabulary(Framework::Megatron).takesValue("--sequence-parallel"));
    QVERIFY(frameworkVocabulary(Framework::Megatron).takesValue("--num-layers"));
  }

  // Every flag the Megatron-LM exporter writes is one Megatron-LM documents, for every plan of the table.
  void megatronFlagsAreDocumented() {
    const FrameworkVocabulary& v = frameworkVocabulary(Framework::Megatron);
    for (const auto& [name, config] : roundTripPlans()) {
      Expected<FrameworkExport> ex = exportForFramework(config, Framework::Megatron);
      QVERIFY2(ex.isOk(), (name + ": " + ex.message()).c_str());
      QVERIFY(!ex->namesWritten.empty());
      for (const std::string& flag : ex->namesWritten) QVERIFY2(v.knows(flag), (name + ": " + flag).c_str());
      QCOMPARE(ex->files.size(), size_t(1));
      QVERIFY(ex->files[0].executable);
    }
  }

  // overlap_param_gather goes to Megatron-LM as --overlap-param-gather (with the --overlap-grad-reduce
  // Megatron asserts beside it) and comes back; DeepSpeed says it does not carry it; a Megatron FSDP script's
  // flag means nothing more than ZeRO-3's own prefetch.
  void overlapParamGatherTravels() {
    RunConfig c = roundTripPlans()[0].second;  // dp2 tp2 pp2 zero1
    c.parallel.overlapParamGather = true;
    Expected<FrameworkExport> ex = exportForFramework(c, Framework::Megatron);
    QVERIFY2(ex.isOk(), ex.isOk() ? "" : ex.message().c_str());
    QVERIFY(ex->notCarried.empty());
    const std::string& text = ex->files[0].text;
    QVERIFY(text.find("--overlap-param-gather") != std::string::npos);
    QVERIFY(text.find("--overlap-grad-reduce") != std::string::npos);
    ImportOptions options;
    options.device = "h100-sxm-80gb";
    Expected<FrameworkImport> im = importMegatron(text, options);
    QVERIFY2(im.isOk(), im.isOk() ? "" : im.message().c_str());
    QVERIFY(im->config.parallel.overlapParamGather);
    QCOMPARE(im->config.parallel.zero, 1);
    QVERIFY2(im->notCarried.size() == 1 && im->notCarried[0] == "--overlap-grad-reduce",
             joined(im->notCarried).c_str());  // the engine's gradient sync overlaps the backward always
    // Without it nothing is written.
    c.parallel.overlapParamGather = false;
    Expected<FrameworkExport> plain = exportForFramework(c, Framework::Megatron);
    QVERIFY(plain.isOk());
    QVERIFY(plain->files[0].text.find("--overlap-param-gather") == std::string::npos);
    // DeepSpeed all-gathers inside its optimizer step.
    c.parallel.overlapParamGather = true;
    c.training.lrSchedule = LrSchedule::Cosine;
    Expected<FrameworkExport> ds = exportForFramework(c, Framework::DeepSpeed);
    QVERIFY2(ds.isOk(), ds.isOk() ? "" : ds.message().c_str());
    QVERIFY2(joined(ds->notCarried).find("overlap_param_gather") != std::string::npos,
             joined(ds->notCarried).c_str());
    // ZeRO-3 (Megatron FSDP) gathers each layer as it runs, prefetched: the flag leaves the field off.
    RunConfig z3 = roundTripPlans()[0].second;
    z3.parallel.zero = 3;
    Expected<FrameworkExport> fsdp = exportForFramework(z3, Framework::Megatron);
    QVERIFY2(fsdp.isOk(), fsdp.isOk() ? "" : fsdp.message().c_str());
    std::string withFlag = fsdp->files[0].text;
    const size_t at = withFlag.find("--use-megatron-fsdp");
    QVERIFY(at != std::string::npos);
    withFlag.insert(at, "--overlap-grad-reduce --overlap-param-gather ");
    Expected<FrameworkImport> back = importMegatron(withFlag, options);
    QVERIFY2(back.isOk(), back.isOk() ? "" : back.message().c_str());
    QCOMPARE(back->config.parallel.zero, 3);
    QVERIFY(!back->config.parallel.overlapParamGather);
  }

  // tp_comm_overlap: Megatron-LM's --tp-comm-overlap both ways (it needs --sequence-parallel), torchtitan's
  // async tensor parallelism with torch.compile on (its requirement), and DeepSpeed says it runs them whole.
  void tpCommOverlapTravels() {
    RunConfig c = roundTripPlans()[0].second;  // dp2 tp2 pp2, sequence parallel
    c.parallel.tpCommOverlap = true;
    Expected<FrameworkExport> ex = exportForFramework(c, Framework::Megatron);
    QVERIFY2(ex.isOk(), ex.isOk() ? "" : ex.message().c_str());
    QVERIFY2(ex->notCarried.empty(), joined(ex->notCarried).c_str());
    const std::string& text = ex->files[0].text;
    QVERIFY(text.find("--tp-comm-overlap") != std::string::npos);
    ImportOptions options;
    options.device = "h100-sxm-80gb";
    Expected<FrameworkImport> im = importMegatron(text, options);
    QVERIFY2(im.isOk(), im.isOk() ? "" : im.message().c_str());
    QVERIFY(im->config.parallel.tpCommOverlap);
    QVERIFY(im->config.parallel.sequenceParallel);
    // Without sequence parallelism the flag cannot apply: the import leaves the field off.
    std::string withoutSp = text;
    const size_t sp = withoutSp.find("--sequence-parallel");
    QVERIFY(sp != std::string::npos);
    withoutSp.erase(sp, std::string("--sequence-parallel").size());
    Expected<FrameworkImport> noSp = importMegatron(withoutSp, options);
    QVERIFY2(noSp.isOk(), noSp.isOk() ? "" : noSp.message().c_str());
    QVERIFY(!noSp->config.parallel.tpCommOverlap);
    c.parallel.tpCommOverlap = false;
    Expected<FrameworkExport> plain = exportForFramework(c, Framework::Megatron);
    QVERIFY(plain.isOk());
    QVERIFY(plain->files[0].text.find("--tp-comm-overlap") == std::string::npos);
    // torchtitan: the async-TP key and compile.enable, written together.
    RunConfig titan = titanPlans()[0].second;
    Expected<FrameworkExport> tt = exportForFramework(titan, Framework::Torchtitan);
    QVERIFY2(tt.isOk(), tt.isOk() ? "" : tt.message().c_str());
    QVERIFY(tt->files[0].text.find("enable_async_tensor_parallel = true") != std::string::npos);
    QVERIFY(tt->files[0].text.find("[compile]\nenable = true") != std::string::npos);
    // A file asking for async TP without torch.compile (which torchtitan refuses) is planned as it asks, and
    // the import says so.
    std::string uncompiled = tt->files[0].text;
    uncompiled.erase(uncompiled.find("[compile]\nenable = true\n"),
                     std::string("[compile]\nenable = true\n").size());
    ImportOptions titanOptions;
    titanOptions.device = "h100-sxm-80gb";
    Expected<FrameworkImport> asked = importTorchtitan(uncompiled, tt->files[1].text, titanOptions);
    QVERIFY2(asked.isOk(), asked.isOk() ? "" : asked.message().c_str());
    QVERIFY(asked->config.parallel.tpCommOverlap);
    QVERIFY2(mentions(asked->assumed, "without compile.enable"), joined(asked->assumed).c_str());
    titan.parallel.tpCommOverlap = false;
    Expected<FrameworkExport> ttPlain = exportForFramework(titan, Framework::Torchtitan);
    QVERIFY(ttPlain.isOk());
    QVERIFY(ttPlain->files[0].text.find("async_tensor") == std::string::npos);
    QVERIFY(ttPlain->files[0].text.find("[compile]") == std::string::npos);
    // DeepSpeed (Megatron-DeepSpeed) has no such overlap.
    c.parallel.tpCommOverlap = true;
    c.training.lrSchedule = LrSchedule::Cosine;
    Expected<FrameworkExport> ds = exportForFramework(c, Framework::DeepSpeed);
    QVERIFY2(ds.isOk(), ds.isOk() ? "" : ds.message().c_str());
    QVERIFY2(mentions(ds->notCarried, "tp_comm_overlap"), joined(ds->notCarried).c_str());
    QVERIFY(ds->files[0].text.find("--tp-comm-overlap") == std::string::npos);
  }

  // Export then import gives the same plan: the same model, parallel sizes, schedule, ZeRO, recompute,
  // precision, batch and optimizer, and the same partition of layers over stages once built.
  void megatronRoundTrip() {
    for (const auto& [name, config] : roundTripPlans()) {
      Expected<FrameworkExport> ex = exportForFramework(config, Framework::Megatron);
      QVERIFY2(ex.isOk(), (name + ": " + ex.message()).c_str());
      QVERIFY2(ex->notCarried.empty(), (name + ": not carried:" + joined(ex->notCarried)).c_str());
      ImportOptions options;
      options.device = "h100-sxm-80gb";
      Expected<FrameworkImport> im = importMegatron(ex->files[0].text, options);
      QVERIFY2(im.isOk(), (name + ": " + im.message()).c_str());
      QVERIFY2(im->unknown.empty(), (name + ": unknown:" + joined(im->unknown)).c_str());
      QVERIFY2(im->notCarried.empty(), (name + ": not carried back:" + joined(im->notCarried)).c_str());
      const RunConfig& back = im->config;
      QVERIFY2(back.model == config.model,
               (name + ":\n" + toJson(back).at("model").dump() + "\n" + toJson(config).at("model").dump())
                   .c_str());
      const ParallelConfig& a = config.parallel;
      const ParallelConfig& b = back.parallel;
      QCOMPARE(b.dp, a.dp);
      QCOMPARE(b.tp, a.tp);
      QCOMPARE(b.pp, a.pp);
      QCOMPARE(b.cp, a.cp);
      QCOMPARE(b.ep, a.ep);
      QCOMPARE(b.microbatches, a.microbatches);
      QCOMPARE(b.virtualChunks, a.virtualChunks);
      QCOMPARE(int(b.schedule), int(a.pp > 1 ? a.schedule : b.schedule));
      QCOMPARE(b.zero, a.zero);
      QCOMPARE(int(b.recompute), int(a.recompute));
      QCOMPARE(b.recomputeLayers, a.recomputeLayers);
      QCOMPARE(int(b.precision), int(a.precision));
      QCOMPARE(int(b.gradPrecision), int(a.gradPrecision));
      QCOMPARE(int(b.offload), int(a.offload));
      QCOMPARE(b.sequenceParallel, a.sequenceParallel);
      QCOMPARE(b.tpCommOverlap, a.tpCommOverlap);
      QVERIFY2(back.optimizer == config.optimizer, name.c_str());
      QCOMPARE(back.training.batchSize, config.training.batchSize);
      QCOMPARE(back.training.seqLen, config.training.seqLen);
      QCOMPARE(back.training.steps, config.training.steps);
      QCOMPARE(back.training.warmupSteps, config.training.warmupSteps);
      QCOMPARE(int(back.training.lrSchedule), int(config.training.lrSchedule));
      QCOMPARE(back.training.minLrRatio, config.training.minLrRatio);
      QCOMPARE(back.training.gradClip, config.training.gradClip);
      QCOMPARE(back.training.evalEvery, config.training.evalEvery);
      QCOMPARE(back.training.evalBatches, config.training.evalBatches);
      QCOMPARE(back.training.checkpointEvery, config.training.checkpointEvery);
      QCOMPARE(back.training.logEvery, config.training.logEvery);
      QCOMPARE(back.seed, config.seed);
      QCOMPARE(back.mesh.nodes.size(), config.mesh.nodes.size());
      QCOMPARE(back.mesh.nodes[0].count, config.mesh.nodes[0].count);
      Expected<Plan> p1 = buildPlan(config), p2 = buildPlan(back);
      QVERIFY2(p1.isOk(), p1.message().c_str());
      QVERIFY2(p2.isOk(), p2.message().c_str());
      QCOMPARE(p2->partition.chunks, p1->partition.chunks);
      QCOMPARE(p2->partition.stageOf, p1->partition.stageOf);
    }
  }

  // What Megatron-LM cannot say is listed and replaced by the nearest thing it can, never dropped.
  void megatronSaysWhatItCannot() {
    RunConfig c = roundTripPlans()[0].second;
    c.parallel.schedule = Schedule::ZbH1;
    c.parallel.offload = Offload::Parameters;
    c.optimizer.type = OptimizerType::Sgd;
    c.optimizer.nesterov = true;
    c.training.evalBatches = 0;
    Expected<FrameworkExport> ex = exportForFramework(c, Framework::Megatron);
    QVERIFY2(ex.isOk(), ex.message().c_str());
    QVERIFY2(mentions(ex->notCarried, "zero-bubble"), joined(ex->notCarried).c_str());
    QVERIFY(mentions(ex->notCarried, "cannot offload parameters"));
    QVERIFY(mentions(ex->notCarried, "Nesterov"));
    QVERIFY(mentions(ex->notCarried, "--eval-iters"));
    QVERIFY(ex->files[0].text.find("zero-bubble") != std::string::npos);  // said in the script too
    c.model.type = ModelType::Vit;
    Expected<FrameworkExport> vit = exportForFramework(c, Framework::Megatron);
    QVERIFY(!vit.isOk());
    QVERIFY2(vit.message().find("/model/type") != std::string::npos, vit.message().c_str());
  }

  // A GPT-3 175B Slurm script (tests/data/frameworks, written from Megatron-LM's documented flags) imports to
  // the plan it means, with what the plan cannot carry and the flag Megatron-LM does not know listed.
  void megatronGolden175B() {
    ImportOptions options;
    options.device = "h100-sxm-80gb";
    Expected<FrameworkImport> im =
        importMegatron(readText(MS_SOURCE_DIR "/tests/data/frameworks/megatron_gpt3_175b.sh"), options);
    QVERIFY2(im.isOk(), im.message().c_str());
    const RunConfig& c = im->config;
    QCOMPARE(int(c.model.type), int(ModelType::Gpt));
    QCOMPARE(c.model.layers, 96);
    QCOMPARE(c.model.width, 12288);
    QCOMPARE(c.model.heads, 96);
    QCOMPARE(c.model.mlpRatio, 4);
    QCOMPARE(c.training.seqLen, 2048);
    QCOMPARE(c.model.vocab,
             51200);  // assumed: the GPT-2 tokenizer's 50257, padded to a multiple of 128 x tp 8
    QVERIFY2(mentions(im->assumed, "50257 -> 51200"), joined(im->assumed).c_str());
    QCOMPARE(c.parallel.tp, 8);
    QCOMPARE(c.parallel.pp, 16);
    QCOMPARE(c.parallel.dp, 8);              // 128 nodes x 8 / (8 x 16)
    QCOMPARE(c.parallel.microbatches, 192);  // 1536 / (1 x 8)
    QCOMPARE(c.training.batchSize, 1536);
    QCOMPARE(c.parallel.zero, 1);
    QVERIFY(c.parallel.sequenceParallel);
    QCOMPARE(int(c.parallel.precision), int(Precision::Bf16));
    QCOMPARE(c.optimizer.lr, 6.0e-5);
    QCOMPARE(c.training.minLrRatio, 0.1);
    QCOMPARE(c.mesh.nodes.size(), size_t(128));
    QCOMPARE(c.mesh.nodes[0].count, 8);
    QCOMPARE(im->unknown, std::vector<std::string>({"--not-a-megatron-flag 3"}));
    QVERIFY2(mentions(im->notCarried, "--attention-dropout 0.1"), joined(im->notCarried).c_str());
    QVERIFY(c.parallel.overlapParamGather);  // --overlap-param-gather with the distributed optimizer
    // Megatron's even split: 6 blocks a stage, the embedding with the first and the head with the last.
    Expected<Plan> plan = buildPlan(c);
    QVERIFY2(plan.isOk(), plan.message().c_str());
    QCOMPARE(plan->partition.layersOfStage(0).size(), size_t(7));
    QCOMPARE(plan->partition.layersOfStage(7).size(), size_t(6));
    QCOMPARE(plan->partition.layersOfStage(15).size(), size_t(7));
  }

  void megatronImportErrors() {
    ImportOptions options;
    const std::pair<const char*, const char*> cases[] = {
        {"pretrain_gpt.py --hidden-size 64 --num-attention-heads 4", "--num-layers is missing"},
        {"pretrain_gpt.py --num-layers x --hidden-size 64 --num-attention-heads 4",
         "--num-layers: 'x' is not an integer"},
        {"torchrun --nproc_per_node 6 pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads "
         "4 "
         "--tensor-model-parallel-size 4",
         "6 ranks (1 x 6) are not a multiple of tp x pp x cp = 4"},
        {"torchrun --nproc_per_node 4 pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads "
         "4 "
         "--micro-batch-size 3 --global-batch-size 8",
         "--global-batch-size 8 is not a multiple of --micro-batch-size 3"},
        {"pretrain_gpt.py --num-layers 4 --hidden-size 64 --num-attention-heads 4 "
         "--pipeline-model-parallel-size 2 "
         "--pipeline-model-parallel-layout 'Et|tt|L'",
         "it places 3 blocks"},
        {"pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 100",
         "--ffn-hidden-size: 100 is not a multiple of --hidden-size 64"},
        {"run 'unterminated", "unterminated single quote"},
    };
    for (const auto& [text, message] : cases) {
      Expected<FrameworkImport> im = importMegatron(text, options);
      QVERIFY2(!im.isOk(), text);
      QVERIFY2(im.message().find(message) != std::string::npos, im.message().c_str());
    }
  }

  // torchtitan: every key written is documented; export then import (the TOML and its run.sh) is the same
  // plan.
  void torchtitanRoundTrip() {
    const FrameworkVocabulary& v = frameworkVocabulary(Framework::Torchtitan);
    for (const auto& [name, config] : titanPlans()) {
      Expected<FrameworkExport> ex = exportForFramework(config, Framework::Torchtitan);
      QVERIFY2(ex.isOk(), (name + ": " + ex.message()).c_str());
      for (const std::string& key : ex->namesWritten) QVERIFY2(v.knows(key), (name + ": " + key).c_str());
      QVERIFY2(ex->notCarried.empty(), (name + ": not carried:" + joined(ex->notCarried)).c_str());
      QCOMPARE(ex->files.size(), size_t(2));
      ImportOptions options;
      options.device = "h100-sxm-80gb";
      Expected<FrameworkImport> im = importTorchtitan(ex->files[0].text, ex->files[1].text, options);
      QVERIFY2(im.isOk(), (name + ": " + im.message()).c_str());
      QVERIFY2(im->unknown.empty(), (name + ": unknown:" + joined(im->unknown)).c_str());
      QVERIFY2(im->notCarried.empty(), (name + ": not carried back:" + joined(im->notCarried)).c_str());
      RunConfig expected = config;
      expected.model.context = config.training.seqLen;  // torchtitan sizes the positions by seq_len
      compareRoundTrip(name, expected, im->config);
      if (QTest::currentTestFailed()) return;
    }
  }

  void torchtitanSaysWhatItCannot() {
    RunConfig c = roundTripPlans()[1].second;  // a llama of no torchtitan flavor's shape
    c.parallel.zero = 1;
    c.parallel.dp = 2;
    c.mesh.nodes = {{"n0", "h100-sxm-80gb", 16}};
    c.training.batchSize = 16;
    c.parallel.sequenceParallel = false;
    Expected<FrameworkExport> ex = exportForFramework(c, Framework::Torchtitan);
    QVERIFY2(ex.isOk(), ex.message().c_str());
    QVERIFY2(mentions(ex->notCarried, "no llama3 flavor has this shape"), joined(ex->notCarried).c_str());
    QVERIFY(mentions(ex->notCarried, "ZeRO-1 becomes ZeRO-2"));
    QVERIFY(mentions(ex->notCarried, "sequence parallelism"));
    QVERIFY(mentions(ex->notCarried, "first 1 of each chunk"));
    Expected<FrameworkExport> gpt = exportForFramework(roundTripPlans()[0].second, Framework::Torchtitan);
    QVERIFY(!gpt.isOk());
    QVERIFY(gpt.message().find("/model/type") != std::string::npos);
  }

  // A Llama 3 70B job TOML (tests/data/frameworks, written from torchtitan's documented keys) with its
  // launcher imports to the plan it means.
  void torchtitanGolden70B() {
    ImportOptions options;
    options.device = "h100-sxm-80gb";
    Expected<FrameworkImport> im = importTorchtitan(
        readText(MS_SOURCE_DIR "/tests/data/frameworks/torchtitan_llama3_70b.toml"),
        readText(MS_SOURCE_DIR "/tests/data/frameworks/torchtitan_llama3_70b_run.sh"), options);
    QVERIFY2(im.isOk(), im.message().c_str());
    const RunConfig& c = im->config;
    QCOMPARE(int(c.model.type), int(ModelType::Llama));
    QCOMPARE(c.model.layers, 80);
    QCOMPARE(c.model.width, 8192);
    QCOMPARE(c.model.heads, 64);
    QCOMPARE(c.model.kvHeadCount(), 8);
    QCOMPARE(c.model.ffnHidden > 0 ? c.model.ffnHidden : int(llamaFfnHidden(c.model.width)), 28672);
    QCOMPARE(c.model.ropeTheta, 500000.0);
    QCOMPARE(c.parallel.tp, 8);
    QVERIFY(c.parallel.sequenceParallel);
    QCOMPARE(c.parallel.dp, 8);  // 64 GPUs / tp 8, all FSDP
    QCOMPARE(c.parallel.zero, 3);
    QCOMPARE(c.training.batchSize, 64);  // local 8 x dp 8
    QCOMPARE(c.training.seqLen, 8192);
    QCOMPARE(int(c.parallel.recompute), int(Recompute::Full));
    QCOMPARE(int(c.parallel.precision), int(Precision::Bf16));
    QCOMPARE(c.optimizer.lr, 1.5e-4);
    QCOMPARE(c.training.warmupSteps, 200);
    QCOMPARE(c.mesh.nodes.size(), size_t(8));
    QVERIFY2(mentions(im->unknown, "training_extra.not_a_key"), joined(im->unknown).c_str());
    QVERIFY2(mentions(im->notCarried, "quantize.linear.float8.enable_fsdp_float8_all_gather"),
             joined(im->notCarried).c_str());
    QVERIFY(mentions(im->notCarried, "metrics.enable_tensorboard") || true);
  }

  void torchtitanImportErrors() {
    ImportOptions options;
    const std::pair<const char*, const char*> cases[] = {
        {"[model]\nname = \"llama3\"\nflavor = \"3B\"\n", "flavor \"3B\" is not one MeshStudio knows"},
        {"[model]\nflavor = \"8B\"\n[parallelism]\ndata_parallel_shard_degree = -1\n",
         "give the launcher script"},
        {"[model]\nflavor = \"8B\"\n[training]\nsteps = \"many\"\n[parallelism]\ndata_parallel_shard_degree "
         "= 2\n",
         "training.steps: \"many\" is not a number"},
        {"[model\nflavor = 1\n", "line 1"},
    };
    for (const auto& [text, message] : cases) {
      Expected<FrameworkImport> im = importTorchtitan(text, "", options);
      QVERIFY2(!im.isOk(), text);
      QVERIFY2(im.message().find(message) != std::string::npos, im.message().c_str());
    }
  }

  // DeepSpeed: the JSON's keys are documented; export then import (the JSON and launch.sh with the model's
  // flags) is the same plan.
  void deepspeedRoundTrip() {
    const FrameworkVocabulary& v = frameworkVocabulary(Framework::DeepSpeed);
    std::vector<std::pair<std::string, RunConfig>> plans;
    for (int zero = 0; zero <= 3; ++zero) {
      RunConfig c = lmPlan(zero % 2 ? ModelType::Llama : ModelType::Gpt, 4, 1, 8);
      c.parallel.dp = 8;
      c.parallel.microbatches = 2;
      c.training.batchSize = 32;
      c.parallel.zero = zero;
      c.parallel.precision = zero > 0 ? Precision::Bf16 : Precision::Fp32;
      if (zero == 2) c.parallel.offload = Offload::Optimizer;
      if (zero == 3) c.parallel.offload = Offload::Parameters;
      if (zero == 1) c.parallel.gradPrecision = GradPrecision::Bf16;
      c.training.lrSchedule = LrSchedule::Cosine;
      plans.emplace_back("deepspeed zero" + std::to_string(zero), c);
    }
    plans.emplace_back("deepspeed with megatron tp2 pp2", roundTripPlans()[0].second);
    plans.back().second.training.lrSchedule = LrSchedule::Cosine;
    for (auto& [name, config] : plans) {
      Expected<FrameworkExport> ex = exportForFramework(config, Framework::DeepSpeed);
      QVERIFY2(ex.isOk(), (name + ": " + ex.message()).c_str());
      for (const std::string& key : ex->namesWritten) QVERIFY2(v.knows(key), (name + ": " + key).c_str());
      QVERIFY2(ex->notCarried.empty(), (name + ": not carried:" + joined(ex->notCarried)).c_str());
      QCOMPARE(ex->files.size(), size_t(2));
      ImportOptions options;
      options.device = "h100-sxm-80gb";
      Expected<FrameworkImport> im = importDeepSpeed(ex->files[0].text, ex->files[1].text, "", options);
      QVERIFY2(im.isOk(), (name + ": " + im.message()).c_str());
      QVERIFY2(im->unknown.empty(), (name + ": unknown:" + joined(im->unknown)).c_str());
      QVERIFY2(im->notCarried.empty(), (name + ": not carried back:" + joined(im->notCarried)).c_str());
      compareRoundTrip(name, config, im->config);
      if (QTest::currentTestFailed()) return;
    }
  }

  // A DeepSpeed config with the model from a Hugging Face config.json (Llama 3 8B), on the ranks given.
  void deepspeedWithHfModel() {
    ImportOptions options;
    options.device = "h100-sxm-80gb";
    options.nodes = 2;
    options.devicesPerNode = 8;
    const std::string ds = R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2, "bf16": {"enabled": true},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "overlap_comm": true},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 1000, "warmup_num_steps": 50,
                      "cos_min_ratio": 0.1}}})";
    Expected<FrameworkImport> im =
        importDeepSpeed(ds, "", readText(MS_SOURCE_DIR "/tests/data/hf/llama3-8b.json"), options);
    QVERIFY2(im.isOk(), im.message().c_str());
    const RunConfig& c = im->config;
    QCOMPARE(c.model.layers, 32);
    QCOMPARE(c.model.width, 4096);
    QCOMPARE(c.parallel.dp, 16);
    QCOMPARE(c.parallel.microbatches, 2);
    QCOMPARE(c.parallel.zero, 3);
    QCOMPARE(int(c.parallel.offload), int(Offload::Optimizer));
    QCOMPARE(int(c.parallel.precision), int(Precision::Bf16));
    QCOMPARE(c.training.steps, 1000);
    QCOMPARE(c.training.warmupSteps, 50);
    QCOMPARE(c.training.minLrRatio, 0.1);
    QCOMPARE(c.optimizer.lr, 3e-4);
    QVERIFY2(mentions(im->notCarried, "zero_optimization.overlap_comm"), joined(im->notCarried).c_str());
    Expected<Plan> plan = buildPlan(c);
    QVERIFY2(plan.isOk(), plan.message().c_str());
  }

  void deepspeedImportErrors() {
    ImportOptions options;
    Expected<FrameworkImport> noModel = importDeepSpeed("{\"train_batch_size\": 8}", "", "", options);
    QVERIFY(!noModel.isOk());
    QVERIFY2(noModel.message().find("does not say which model") != std::string::npos,
             noModel.message().c_str());
    const std::string model =
        "torchrun --nproc_per_node 4 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
        "--num-attention-heads 4";
    Expected<FrameworkImport> batch = importDeepSpeed(
        "{\"train_batch_size\": 10, \"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": "
        "1}",
        model, "", options);
    QVERIFY(!batch.isOk());
    QVERIFY2(batch.message().find("train_batch_size 10 is not") != std::string::npos,
             batch.message().c_str());
    Expected<FrameworkImport> stage = importDeepSpeed(
        "{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 4}}", model, "", options);
    QVERIFY(!stage.isOk());
    QVERIFY2(stage.message().find("zero_optimization.stage: 4") != std::string::npos,
             stage.message().c_str());
    Expected<FrameworkImport> json = importDeepSpeed("{not json", model, "", options);
    QVERIFY(!json.isOk());
  }
};

QTEST_GUILESS_MAIN(TestFrameworks)
#include "tst_frameworks.moc"
