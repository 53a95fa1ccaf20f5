// Tests of the trace import (plan/trace_import.h) and of `meshstudio-engine trace` (engine/trace_command.h):
//
// - real traces of PyTorch's profiler (tests/data/traces/torch-cpu-rank*.json, written by
//   scripts/make_kineto_trace.py with Debian's torch 1.13 on the CPU: two gloo ranks training a
//   Linear(16, 32) -> ReLU -> Linear(32, 8) MLP on a batch of 4 with record_shapes, all-reducing their
//   gradients and 1000 floats each step): the steps, the GEMMs with their m, n, k, the all_reduce bytes and
//   the ranks; the same checks on traces the script writes now when /usr/bin/python3 has torch;
// - a hand-written GPU trace (tests/data/traces/gpu-rank*.json; not a real run, see its "_comment": Kineto's
//   layout, cuBLAS, FlashAttention and NCCL kernel names): classification, the GEMM shape through the
//   launching op's External id, kernels put in the step that launched them, busbw against nccl-tests'
//   formula, the link curve and the profile links written;
// - inputs that are not traces, or hold malformed events: an error naming the file, or the events skipped and
//   counted, never a crash.
#include <QtTest>

#include "test_util.h"

#include <QProcess>
#include <QTemporaryDir>

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "plan/device_profile.h"
#include "plan/trace_import.h"

#include "process_util.h"

using nlohmann::json;

namespace {

const std::string kTraces = std::string(MS_TEST_DATA_DIR) + "/traces/";

// The MLP's GEMMs per step, (m, n, k): forward aten::linear (4, 32, 16) and (4, 8, 32) (each holding its
// aten::addmm), backward aten::mm for the second layer's input gradient (4, 8) @ (8, 32) and weight gradient
// (8, 4) @ (4, 32), and the first layer's weight gradient (32, 4) @ (4, 16) (the input needs none).
const std::multiset<std::tuple<std::int64_t, std::int64_t, std::int64_t>> kMlpGemms = {
    {4, 32, 16}, {4, 8, 32}, {4, 32, 8}, {8, 32, 4}, {32, 16, 4}};
// The all_reduces per step: the gradients (16*32, 32, 32*8, 8 floats) and 1000 floats, fp32.
const std::multiset<double> kMlpAllReduceBytes = {2048, 128, 1024, 32, 4000};

using CliResult = ms::test::ProcessResult;

CliResult runEngine(const QStringList& args) {
  return ms::test::runProcess(MS_ENGINE_EXE, args, 60000);
}

int countKind(const ms::TraceStep& step, ms::TraceSpanKind kind) {
  return int(
      std::count_if(step.spans.begin(), step.spans.end(), [&](const auto& s) { return s.kind == kind; }));
}

// The checks on the MLP's traces, with or without shapes (the legacy export has none).
void checkMlpTrace(const ms::TraceImport& t, bool withShapes) {
  QCOMPARE(t.ranks.size(), std::size_t(2));
  for (int r = 0; r < 2; ++r) {
    const ms::TraceRank& rank = t.ranks[std::size_t(r)];
    QCOMPARE(rank.rank, r);
    QVERIFY(!rank.deviceTimeline);
    // schedule(wait=1, warmup=1, active=2): two recorded steps, numbered by the profiler.
    QCOMPARE(rank.steps.size(), std::size_t(2));
    QVERIFY(rank.steps[0].number < rank.steps[1].number);
    QVERIFY(rank.steps[0].number >= 1);
    for (const ms::TraceStep& step : rank.steps) {
      QVERIFY(step.end > step.start);
      std::multiset<std::tuple<std::int64_t, std::int64_t, std::int64_t>> gemms;
      std::multiset<double> bytes;
      for (const ms::TraceSpan& s : step.spans) {
        QVERIFY(s.start >= step.start && s.end <= step.end && s.end >= s.start);
        if (s.kind == ms::TraceSpanKind::Gemm) {
          const std::string& name = t.nameOf(s);
          QVERIFY2(name == "aten::linear" || name == "aten::mm", name.c_str());
          gemms.insert({s.m, s.n, s.k});
        }
        if (s.kind == ms::TraceSpanKind::Collective) {
          QCOMPARE(t.nameOf(s), std::string("gloo:all_reduce"));
          QCOMPARE(s.collective, std::string("all_reduce"));
          QCOMPARE(s.groupSize, 2);
          bytes.insert(s.bytes);
        }
      }
      QCOMPARE(int(gemms.size()), 5);
      QCOMPARE(int(bytes.size()), 5);
      QCOMPARE(countKind(step, ms::TraceSpanKind::Optimizer), 1);  // Optimizer.step#SGD.step
      if (withShapes) {
        QVERIFY(gemms == kMlpGemms);
        QVERIFY(bytes == kMlpAllReduceBytes);
      } else {
        QCOMPARE(*gemms.begin(), std::make_tuple(std::int64_t(0), std::int64_t(0), std::int64_t(0)));
        QCOMPARE(*bytes.rbegin(), 0.0);
      }
    }
  }
}

ms::Expected<ms::TraceImport> importText(const std::string& text, const std::string& file = "t.json") {
  return ms::importTraceTexts({ms::TraceText{file, text}});
}

// A profile that loads: one fp32 GEMM, elementwise and optimizer points, and a link "shm" at 2 ranks.
json minimalProfile() {
  return {{"format", "meshstudio-device-profile"},
          {"version", 1},
          {"machine", {{"hostname", "h"}, {"cores", 2}}},
          {"device",
           {{"backend", "cpu"},
            {"memory_bytes", 1e9},
            {"gemm",
             json::array(
                 {{{"precision", "fp32"}, {"threads", 1}, {"m", 8}, {"n", 8}, {"k", 8}, {"seconds", 1e-6}}})},
            {"elementwise", json::array({{{"threads", 1}, {"bytes", 1200}, {"seconds", 1e-6}}})},
            {"optimizer", json::array({{{"threads", 1}, {"params", 1000}, {"seconds", 1e-6}}})}}},
          {"links",
           json::array(
               {{{"name", "shm"},
                 {"transport", "Open MPI, btl vader (shared memory)"},
                 {"ranks", 2},
                 {"measurements", json::array({{{"op", "sendrecv"}, {"bytes", 8}, {"seconds", 1e-6}},
                                               {{"op", "all_reduce"}, {"bytes", 8}, {"seconds", 2e-6}},
                                               {{"op", "broadcast"}, {"bytes", 8}, {"seconds", 3e-6}}})}}})}};
}

}  // namespace

class TestTraceImport : public QObject {
  Q_OBJECT
 private slots:
  void classifiesByName_data() {
    QTest::addColumn<QString>("name");
    QTest::addColumn<QString>("cat");
    QTest::addColumn<QString>("kind");
    QTest::addColumn<QString>("collective");
    QTest::newRow("cublas sm90") << "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas"
                                 << "kernel"
                                 << "gemm"
                                 << "";
    QTest::newRow("ampere sgemm") << "ampere_sgemm_128x64_tn"
                                  << "kernel"
                                  << "gemm"
                                  << "";
    QTest::newRow("cutlass") << "void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu>(Params)"
                             << "kernel"
                             << "gemm"
                             << "";
    QTest::newRow("cublasLt nvjet") << "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT"
                                    << "kernel"
                                    << "gemm"
                                    << "";
    QTest::newRow("aten::addmm") << "aten::addmm"
                                 << "cpu_op"
                                 << "gemm"
                                 << "";
    QTest::newRow("aten::bmm") << "aten::bmm"
                               << "cpu_op"
                               << "gemm"
                               << "";
    QTest::newRow("flash") << "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, cutlass::half_t>>"
                           << "kernel"
                           << "attention"
                           << "";
    QTest::newRow("fmha") << "fmha_cutlassF_f32_aligned_64x64_rf_sm80"
                          << "kernel"
                          << "attention"
                          << "";
    QTest::newRow("sdpa op") << "aten::scaled_dot_product_attention"
                             << "cpu_op"
                             << "attention"
                             << "";
    QTest::newRow("nccl allreduce") << "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long)"
                                    << "kernel"
                                    << "collective"
                                    << "all_reduce";
    QTest::newRow("nccl old allreduce") << "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
                                        << "kernel"
                                        << "collective"
                                        << "all_reduce";
    QTest::newRow("nccl allgather") << "ncclDevKernel_AllGather_RING_LL"
                                    << "kernel"
                                    << "collective"
                                    << "all_gather";
    QTest::newRow("nccl reducescatter") << "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"
                                        << "kernel"
                                        << "collective"
                                        << "reduce_scatter";
    QTest::newRow("nccl broadcast") << "ncclDevKernel_Broadcast_RING_LL"
                                    << "kernel"
                                    << "collective"
                                    << "broadcast";
    QTest::newRow("nccl sendrecv") << "ncclDevKernel_SendRecv(ncclDevComm*)"
                                   << "kernel"
                                   << "collective"
                                   << "sendrecv";
    QTest::newRow("record function") << "nccl:all_reduce"
                                     << "user_annotation"
                                     << "collective"
                                     << "all_reduce";
    QTest::newRow("gloo") << "gloo:all_reduce"
                          << "user_annotation"
                          << "collective"
                          << "all_reduce";
    QTest::newRow("c10d alltoall") << "c10d::alltoall_base_"
                                   << "cpu_op"
                                   << "collective"
                                   << "all_to_all";
    QTest::newRow("c10d reduce_scatter base") << "c10d::_reduce_scatter_base_"
                                              << "cpu_op"
                                              << "collective"
                                              << "reduce_scatter";
    QTest::newRow("adam kernel") << "multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>"
                                 << "kernel"
                                 << "optimizer"
                                 << "";
    QTest::newRow("optimizer step") << "Optimizer.step#SGD.step"
                                    << "user_annotation"
                                    << "optimizer"
                                    << "";
    QTest::newRow("elementwise") << "void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>"
                                 << "kernel"
                                 << "other"
                                 << "";
    QTest::newRow("python frame") << "nn.Module: MultiheadAttention_0"
                                  << "python_function"
                                  << "other"
                                  << "";
    QTest::newRow("fbgemm is not a GEMM")
        << "void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int const*)"
        << "kernel"
        << "other"
        << "";
    QTest::newRow("lambda is not lamb") << "aten::add_ (lambda)"
                                        << "cpu_op"
                                        << "other"
                                        << "";
  }
  void classifiesByName() {
    QFETCH(QString, name);
    QFETCH(QString, cat);
    QFETCH(QString, kind);
    QFETCH(QString, collective);
    const ms::TraceEventClass c = ms::classifyTraceEvent(name.toStdString(), cat.toStdString());
    QCOMPARE(QString::fromLatin1(ms::toString(c.kind)), kind);
    QCOMPARE(QString::fromStdString(c.collective), collective);
    QVERIFY(!c.stepMarker);
    QVERIFY(ms::classifyTraceEvent("ProfilerStep#12", "user_annotation").stepMarker);
  }

  // The real traces in Kineto's layout: ranks from distributedInfo whatever the order of the files.
  void realTorchTraceKinetoLayout() {
    auto t =
        ms::importTraces({kTraces + "torch-cpu-rank1.kineto.json", kTraces + "torch-cpu-rank0.kineto.json"});
    QVERIFY2(t, t ? "" : t.message().c_str());
    checkMlpTrace(*t, true);
    QCOMPARE(t->ranks[0].backend, std::string("gloo"));
    QCOMPARE(t->ranks[0].worldSize, 2);
    QVERIFY(t->ranks[0].file.find("rank0") != std::string::npos);
    QCOMPARE(t->skipped.size(), std::size_t(0));
    // The c10d::allreduce_ ops on the main thread only enqueue gloo's work: not counted as collectives.
    for (const auto& step : t->ranks[1].steps) QCOMPARE(countKind(step, ms::TraceSpanKind::Collective), 5);
    // The summary: GEMM FLOPs of the five shapes (2 m n k each), all_reduce bytes 7232 per step, busbw =
    // algbw at 2 ranks.
    const ms::TraceSummary s = ms::summarizeTrace(*t);
    QCOMPARE(s.steps.size(), std::size_t(4));
    double flops = 0;
    for (const auto& [m, n, k] : kMlpGemms) flops += 2.0 * m * n * k;
    for (const ms::TraceStepSummary& st : s.steps) {
      QCOMPARE(st.gemmFlops, flops);
      QVERIFY(st.achievedFlops > 0);
      QVERIFY(st.idleFraction >= 0 && st.idleFraction < 1);
      QCOMPARE(st.collectives.size(), std::size_t(1));
      QCOMPARE(st.collectives[0].count, 5);
      QCOMPARE(st.collectives[0].bytes, 7232.0);
      QCOMPARE(st.collectives[0].busbw, st.collectives[0].algbw);
    }
    QCOMPARE(s.links.size(), std::size_t(5));  // one point per size
    for (const ms::TraceLinkPoint& p : s.links) QCOMPARE(p.calls, 2);
  }

  // The same run as torch 1.13 wrote it (the legacy exporter: a bare array, no args, no rank): ranks by the
  // order of the files, the same spans, no shapes or sizes.
  void realTorchTraceLegacyExport() {
    auto t = ms::importTraces({kTraces + "torch-cpu-rank0.json", kTraces + "torch-cpu-rank1.json"});
    QVERIFY2(t, t ? "" : t.message().c_str());
    checkMlpTrace(*t, false);
    QVERIFY(t->ranks[1].file.find("torch-cpu-rank1.json") != std::string::npos);
  }

  // Written now by the script with this machine's torch (skipped without it).
  void realTorchTraceGeneratedNow() {
    QProcess probe;
    probe.start(MS_PYTHON, {"-c", "import torch, torch.distributed as d; assert d.is_gloo_available()"});
    if (!probe.waitForFinished(60000) || probe.exitStatus() != QProcess::NormalExit || probe.exitCode() != 0)
      QSKIP("/usr/bin/python3 has no torch with gloo");
    QTemporaryDir dir;
    QProcess p;
    p.start(MS_PYTHON, {QString(MS_SOURCE_DIR) + "/scripts/make_kineto_trace.py", dir.path()});
    QVERIFY2(p.waitForFinished(120000), "make_kineto_trace.py did not finish within 120 s");
    QVERIFY2(p.exitCode() == 0, p.readAllStandardError().constData());
    const std::string d = dir.path().toStdString() + "/";
    auto t = ms::importTraces({d + "torch-cpu-rank0.kineto.json", d + "torch-cpu-rank1.kineto.json"});
    QVERIFY2(t, t ? "" : t.message().c_str());
    checkMlpTrace(*t, true);
  }

  void gpuFixture() {
    auto t = ms::importTraces({kTraces + "gpu-rank0.json", kTraces + "gpu-rank1.json"});
    QVERIFY2(t, t ? "" : t.message().c_str());
    QCOMPARE(t->ranks.size(), std::size_t(2));
    QCOMPARE(t->eventsByKind[ms::TraceSpanKind::Gemm], 4);
    QCOMPARE(t->eventsByKind[ms::TraceSpanKind::Attention], 4);
    QCOMPARE(t->eventsByKind[ms::TraceSpanKind::Collective], 12);
    QCOMPARE(t->eventsByKind[ms::TraceSpanKind::Optimizer], 4);
    QCOMPARE(t->eventsByKind[ms::TraceSpanKind::Other], 8);  // gelu and the memcpy
    QCOMPARE(t->recognized(), std::int64_t(24));
    QCOMPARE(t->outsideSteps, std::int64_t(0));
    for (const ms::TraceRank& r : t->ranks) {
      QVERIFY(r.deviceTimeline);
      QCOMPARE(r.backend, std::string("nccl"));
      QCOMPARE(r.steps.size(), std::size_t(2));
      QCOMPARE(r.steps[0].number, std::int64_t(5));
      QCOMPARE(r.steps[1].number, std::int64_t(6));
      for (const ms::TraceStep& st : r.steps) {
        // Eight kernels each: the memcpy that ran after the next ProfilerStep began belongs to the step that
        // launched it (cudaMemcpyAsync's correlation).
        QCOMPARE(st.spans.size(), std::size_t(8));
        QVERIFY(t->nameOf(st.spans.back()).rfind("Memcpy DtoH", 0) == 0);
        const auto gemm = std::find_if(st.spans.begin(), st.spans.end(),
                                       [](const auto& s) { return s.kind == ms::TraceSpanKind::Gemm; });
        QVERIFY(gemm != st.spans.end());
        // The kernel has no shapes; aten::mm with the same External id has them.
        QCOMPARE(gemm->m, std::int64_t(1024));
        QCOMPARE(gemm->n, std::int64_t(4096));
        QCOMPARE(gemm->k, std::int64_t(4096));
        for (const ms::TraceSpan& s : st.spans)
          if (s.collective == "sendrecv") {
            QCOMPARE(s.bytes, 65536.0 * 2);  // from record_param_comms: "send", 65536 BFloat16
            QCOMPARE(s.groupSize, 2);
          } else if (s.collective == "all_gather") {
            QCOMPARE(s.bytes, 524288.0 * 2);  // nccl-tests' size of all_gather: the gathered output
          } else if (s.collective == "all_reduce") {
            QCOMPARE(s.bytes, 1048576.0 * 4);
          }
      }
    }
    // The fixture's times (microseconds after each step's first kernel): gemm 0-100, flash 120-320, gelu
    // 340-440, all_reduce 400-900 on rank 0 (overlapping gelu by 40), all_gather 1000-1300, sendrecv
    // 1400-1500, adam 2650-2770, memcpy 2800-2830; step 5 runs to step 6's first kernel 3000 us later.
    const ms::TraceSummary s = ms::summarizeTrace(*t);
    QCOMPARE(s.steps.size(), std::size_t(4));
    const ms::TraceStepSummary& r0 = s.steps[0];
    QCOMPARE(r0.rank, 0);
    QCOMPARE(r0.step, std::int64_t(5));
    const auto near = [](double a, double b) { return std::fabs(a - b) <= 1e-9 + 1e-6 * std::fabs(b); };
    QVERIFY2(near(r0.window, 3000e-6), qPrintable(QString::number(r0.window)));
    QVERIFY(near(r0.busy, 1410e-6));
    QVERIFY(near(r0.idleFraction, 1 - 1410.0 / 3000));
    QVERIFY(near(r0.gemm, 100e-6));
    QVERIFY(near(r0.attention, 200e-6));
    QVERIFY(near(r0.optimizer, 120e-6));
    QVERIFY(near(r0.communication, 900e-6));
    QVERIFY(near(r0.exposedCommunication, 860e-6));
    QCOMPARE(r0.gemmFlops, 2.0 * 1024 * 4096 * 4096);
    QVERIFY(near(r0.achievedFlops, 2.0 * 1024 * 4096 * 4096 / 100e-6));
    // busbw = algbw x nccl-tests' factor (doc/PERFORMANCE.md): all_gather (n-1)/n, all_reduce 2(n-1)/n.
    for (const ms::TraceCollectiveSummary& c : r0.collectives) {
      QCOMPARE(c.groupSize, 2);
      if (c.op == "all_gather") {
        QVERIFY(near(c.algbw, 1048576 / 300e-6));
        QVERIFY(near(c.busbw, 1048576 / 300e-6 * (2 - 1) / 2.0));
      } else if (c.op == "all_reduce") {
        QVERIFY(near(c.busbw, 4194304 / 500e-6 * 2 * (2 - 1) / 2.0));
      }
    }
    // The link curve: per call the fastest rank (rank 1's 400 and 440 us all_reduces), median 420 us.
    QCOMPARE(s.links.size(), std::size_t(3));
    for (const ms::TraceLinkPoint& p : s.links) {
      QCOMPARE(p.groupSize, 2);
      QCOMPARE(p.calls, 2);
      if (p.op == ms::CollectiveOp::AllReduce) QVERIFY(near(p.seconds, 420e-6));
      if (p.op == ms::CollectiveOp::AllGather) QVERIFY(near(p.seconds, 250e-6));
      if (p.op == ms::CollectiveOp::SendRecv) QVERIFY(near(p.seconds, 80e-6));
    }
    const std::vector<json> links = ms::traceLinkEntries(*t, s, "nvlink");
    QCOMPARE(links.size(), std::size_t(1));
    QCOMPARE(links[0]["name"].get<std::string>(), std::string("nvlink"));
    QCOMPARE(links[0]["ranks"].get<int>(), 2);
    QCOMPARE(links[0]["measurements"].size(), std::size_t(3));
    QCOMPARE(links[0]["measurements"][0]["op"].get<std::string>(), std::string("sendrecv"));
    QCOMPARE(links[0]["measurements"][1]["op"].get<std::string>(), std::string("all_reduce"));
    QCOMPARE(links[0]["measurements"][1]["bytes"].get<std::int64_t>(), std::int64_t(4194304));
    QCOMPARE(links[0]["measurements"][2]["busbw"].get<double>(),
             links[0]["measurements"][2]["algbw"].get<double>() * 0.5);
  }

  // nccl-tests' factors at a group size the fixture does not have, from each op's "Group size".
  void busBandwidthAtGroupSize_data() {
    QTest::addColumn<QString>("kernel");
    QTest::addColumn<QString>("op");
    QTest::addColumn<int>("n");
    QTest::addColumn<double>("factor");
    for (int n : {2, 4, 8}) {
      const QByteArray tag = QByteArray::number(n);
      QTest::newRow("all_reduce " + tag) << "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
                                         << "all_reduce" << n << 2.0 * (n - 1) / n;
      QTest::newRow("all_gather " + tag) << "ncclDevKernel_AllGather_RING_LL"
                                         << "all_gather" << n << double(n - 1) / n;
      QTest::newRow("reduce_scatter " + tag) << "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"
                                             << "reduce_scatter" << n << double(n - 1) / n;
      QTest::newRow("broadcast " + tag) << "ncclDevKernel_Broadcast_RING_LL"
                                        << "broadcast" << n << 1.0;
    }
    QTest::newRow("all_to_all 8") << "nccl:all_to_all"
                                  << "all_to_all" << 8 << 7.0 / 8;
  }
  void busBandwidthAtGroupSize() {
    QFETCH(QString, kernel);
    QFETCH(QString, op);
    QFETCH(int, n);
    QFETCH(double, factor);
    // 1000 bf16 elements in and out (an all_gather's output is 1000: its size), 10 us.
    const json trace = {{"traceEvents", json::array({{{"ph", "X"},
                                                      {"cat", "kernel"},
                                                      {"name", kernel.toStdString()},
                                                      {"pid", 0},
                                                      {"tid", 20},
                                                      {"ts", 100},
                                                      {"dur", 10},
                                                      {"args",
                                                       {{"In msg nelems", 1000},
                                                        {"Out msg nelems", 1000},
                                                        {"Group size", n},
                                                        {"dtype", "BFloat16"}}}}})}};
    auto t = importText(trace.dump());
    QVERIFY2(t, t ? "" : t.message().c_str());
    const ms::TraceSummary s = ms::summarizeTrace(*t);
    QCOMPARE(s.steps.size(), std::size_t(1));
    QCOMPARE(s.steps[0].step, std::int64_t(-1));
    QCOMPARE(s.steps[0].collectives.size(), std::size_t(1));
    const ms::TraceCollectiveSummary& c = s.steps[0].collectives[0];
    QCOMPARE(QString::fromStdString(c.op), op);
    QCOMPARE(c.groupSize, n);
    QCOMPARE(c.bytes, 2000.0);
    QVERIFY(std::fabs(c.algbw - 2000 / 10e-6) <= 1e-6 * c.algbw);
    QVERIFY(std::fabs(c.busbw - 2000 / 10e-6 * factor) <= 1e-6 * c.busbw);
  }

  // CPU ops: the outermost recognized op is the span (aten::linear, not its aten::addmm), with the shape of
  // its inputs; an other op is split around the recognized ones inside it; B/E pairs nest like X events.
  void nestingAndBeginEnd() {
    const json trace =
        json::array({{{"ph", "X"},
                      {"name", "aten::linear"},
                      {"pid", 1},
                      {"tid", 1},
                      {"ts", 0},
                      {"dur", 50},
                      {"args", {{"Input Dims", {{2, 3, 16}, {32, 16}, {32}}}}}},
                     {{"ph", "X"}, {"name", "aten::addmm"}, {"pid", 1}, {"tid", 1}, {"ts", 5}, {"dur", 40}},
                     {{"ph", "B"},
                      {"name", "autograd::engine::evaluate_function: AddmmBackward0"},
                      {"pid", 1},
                      {"tid", 1},
                      {"ts", 100}},
                     {{"ph", "X"},
                      {"name", "aten::mm"},
                      {"pid", 1},
                      {"tid", 1},
                      {"ts", 110},
                      {"dur", 20},
                      {"args", {{"Input Dims", {{6, 32}, {32, 16}}}}}},
                     {{"ph", "X"}, {"name", "aten::t"}, {"pid", 1}, {"tid", 1}, {"ts", 135}, {"dur", 5}},
                     {{"ph", "X"},
                      {"name", "aten::bmm"},
                      {"pid", 1},
                      {"tid", 1},
                      {"ts", 150},
                      {"dur", 10},
                      {"args", {{"Input Dims", {{4, 6, 8}, {4, 8, 2}}}}}},
                     {{"ph", "E"}, {"pid", 1}, {"tid", 1}, {"ts", 200}}});
    auto t = importText(trace.dump());
    QVERIFY2(t, t ? "" : t.message().c_str());
    QCOMPARE(t->ranks.size(), std::size_t(1));
    const ms::TraceStep& st = t->ranks[0].steps.at(0);
    std::vector<std::string> names;
    for (const ms::TraceSpan& s : st.spans) names.push_back(t->nameOf(s));
    // linear; other [100, 110); mm; other [130, 150) (aten::t is inside it); bmm; other [160, 200).
    QCOMPARE(st.spans.size(), std::size_t(6));
    QCOMPARE(names[0], std::string("aten::linear"));
    QCOMPARE(st.spans[0].m, std::int64_t(6));  // (2, 3) rows folded
    QCOMPARE(st.spans[0].n, std::int64_t(32));
    QCOMPARE(st.spans[0].k, std::int64_t(16));
    QCOMPARE(names[2], std::string("aten::mm"));
    QCOMPARE(names[4], std::string("aten::bmm"));
    QCOMPARE(st.spans[4].batch, std::int64_t(4));
    QCOMPARE(st.spans[4].flops(), 2.0 * 4 * 6 * 2 * 8);
    for (int i : {1, 3, 5}) QCOMPARE(st.spans[std::size_t(i)].kind, ms::TraceSpanKind::Other);
    QVERIFY(std::fabs(st.spans[3].start - 130e-6) < 1e-12 && std::fabs(st.spans[3].end - 150e-6) < 1e-12);
    QCOMPARE(t->nested, std::int64_t(2));  // aten::addmm, aten::t
    QCOMPARE(t->eventsByKind[ms::TraceSpanKind::Gemm], 3);
    QCOMPARE(t->eventsByKind[ms::TraceSpanKind::Other], 1);
  }

  // Older Kineto (as in HolisticTraceAnalysis' test traces): a kernel without sizes or a usable External id
  // takes them from the ops around its launch on the launching thread; a SendRecv kernel launched inside
  // "nccl:all_to_all" is the all_to_all (NCCL runs it as grouped sends and receives).
  void kernelsTakeTheOpsAroundTheirLaunch() {
    const json trace = {
        {"distributedInfo", {{"backend", "nccl"}, {"rank", 3}, {"world_size", 4}}},
        {"traceEvents", json::array({{{"ph", "X"},
                                      {"cat", "user_annotation"},
                                      {"name", "nccl:all_to_all"},
                                      {"pid", 9},
                                      {"tid", 9},
                                      {"ts", 10},
                                      {"dur", 20},
                                      {"args", {{"Input Dims", {{384}}}, {"Input type", {"long int"}}}}},
                                     {{"ph", "X"},
                                      {"cat", "cuda_runtime"},
                                      {"name", "cudaLaunchKernel"},
                                      {"pid", 9},
                                      {"tid", 9},
                                      {"ts", 15},
                                      {"dur", 2},
                                      {"args", {{"correlation", 7}, {"External id", 70}}}},
                                     {{"ph", "X"},
                                      {"cat", "kernel"},
                                      {"name", "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"},
                                      {"pid", 0},
                                      {"tid", 84},
                                      {"ts", 40},
                                      {"dur", 30},
                                      {"args", {{"correlation", 7}, {"External id", 7}}}},
                                     {{"ph", "X"},
                                      {"cat", "cpu_op"},
                                      {"name", "aten::mm"},
                                      {"pid", 9},
                                      {"tid", 9},
                                      {"ts", 100},
                                      {"dur", 10},
                                      {"args", {{"Input Dims", {{64, 32}, {32, 16}}}}}},
                                     {{"ph", "X"},
                                      {"cat", "cuda_runtime"},
                                      {"name", "cudaLaunchKernel"},
                                      {"pid", 9},
                                      {"tid", 9},
                                      {"ts", 102},
                                      {"dur", 2},
                                      {"args", {{"correlation", 8}}}},
                                     {{"ph", "X"},
                                      {"cat", "kernel"},
                                      {"name", "ampere_sgemm_64x32_nn"},
                                      {"pid", 0},
                                      {"tid", 7},
                                      {"ts", 120},
                                      {"dur", 4},
                                      {"args", {{"correlation", 8}}}}})}};
    auto t = importText(trace.dump());
    QVERIFY2(t, t ? "" : t.message().c_str());
    QCOMPARE(t->ranks.size(), std::size_t(1));
    QCOMPARE(t->ranks[0].rank, 3);
    const auto& spans = t->ranks[0].steps.at(0).spans;
    QCOMPARE(spans.size(), std::size_t(2));
    QCOMPARE(spans[0].collective, std::string("all_to_all"));
    QCOMPARE(spans[0].bytes, 384.0 * 8);
    QVERIFY(!spans[0].elementBytesAssumed);
    QCOMPARE(spans[0].groupSize, 4);  // distributedInfo's world size
    QCOMPARE(spans[1].kind, ms::TraceSpanKind::Gemm);
    QCOMPARE(spans[1].m, std::int64_t(64));
    QCOMPARE(spans[1].n, std::int64_t(16));
    QCOMPARE(spans[1].k, std::int64_t(32));
  }

  // A merged file: processes named "rank N" are ranks; a process without a rank name is left out.
  void mergedFileRanksByProcessName() {
    json events = json::array();
    for (int pid : {10, 11, 12}) {
      if (pid != 12)
        events.push_back({{"ph", "M"},
                          {"name", "process_name"},
                          {"pid", pid},
                          {"args", {{"name", "rank " + std::to_string(pid - 10) + " (stage 0)"}}}});
      events.push_back({{"ph", "X"},
                        {"name", "ncclDevKernel_AllReduce_Sum_RING_LL"},
                        {"cat", "kernel"},
                        {"pid", pid},
                        {"tid", 1},
                        {"ts", 10},
                        {"dur", 5},
                        {"args", {{"In msg nelems", 4}}}});
    }
    auto t = importText(json{{"traceEvents", events}}.dump());
    QVERIFY2(t, t ? "" : t.message().c_str());
    QCOMPARE(t->ranks.size(), std::size_t(2));
    QCOMPARE(t->ranks[1].rank, 1);
    QCOMPARE(t->skipped.at("event of a process whose process_name names no rank"), std::int64_t(1));
    // No dtype: 4-byte elements assumed; no group size: the 2 ranks imported.
    const ms::TraceSpan& s = t->ranks[0].steps.at(0).spans.at(0);
    QCOMPARE(s.bytes, 16.0);
    QVERIFY(s.elementBytesAssumed);
    QCOMPARE(s.groupSize, 2);
    QCOMPARE(t->notes.size(), std::size_t(2));
  }

  void badInputs_data() {
    QTest::addColumn<QString>("text");
    QTest::addColumn<QString>("error");  // empty: imports, with skipped events
    QTest::addColumn<int>("skipped");
    QTest::addColumn<int>("spans");
    QTest::newRow("not json") << "{\"traceEvents\": ["
                              << "bad.json: not JSON" << 0 << 0;
    QTest::newRow("empty file") << ""
                                << "bad.json: not JSON" << 0 << 0;
    QTest::newRow("object without traceEvents")
        << "{\"schemaVersion\": 1, \"foo\": []}"
        << "bad.json: not a Chrome trace: expected an array of events or an "
           "object with a \"traceEvents\" array; the object has the keys foo, "
           "schemaVersion"
        << 0 << 0;
    QTest::newRow("traceEvents not array")
        << "{\"traceEvents\": \"x\"}"
        << "bad.json: /traceEvents must be an array of events, got string" << 0 << 0;
    QTest::newRow("a number") << "42"
                              << "bad.json: not a Chrome trace" << 0 << 0;
    QTest::newRow("no events") << "[]"
                               << "bad.json: no duration events" << 0 << 0;
    QTest::newRow("only metadata") << "[{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": 1}]"
                                   << "bad.json: no duration events" << 0 << 0;
    QTest::newRow("all malformed")
        << "[{\"ph\": \"X\", \"name\": \"a\"}, 3, {\"ph\": 1}]"
        << "bad.json: no duration events (\"ph\" \"X\", or \"B\" and \"E\") with a numeric "
           "ts (some were skipped as malformed)"
        << 0 << 0;
    const QString good = "{\"ph\": \"X\", \"name\": \"aten::mm\", \"ts\": 1, \"dur\": 2}";
    QTest::newRow("missing ts and dur")
        << "[" + good +
               ", {\"ph\": \"X\", \"name\": \"a\", \"dur\": 1}, {\"ph\": \"X\", "
               "\"name\": \"b\", \"ts\": 1}]"
        << "" << 2 << 1;
    QTest::newRow("negative dur") << "[" + good +
                                         ", {\"ph\": \"X\", \"name\": \"a\", \"ts\": 5, \"dur\": -3}]"
                                  << "" << 1 << 1;
    QTest::newRow("wrong types")
        << "[" + good +
               ", {\"ph\": \"X\", \"name\": 7, \"ts\": \"x\", \"dur\": 1}, {\"ph\": \"X\", "
               "\"name\": [1], \"cat\": {}, \"ts\": 9, \"dur\": 1, \"args\": 5, \"pid\": "
               "[], \"tid\": null}, null, \"s\", {\"ph\": [\"X\"]}]"
        << "" << 4 << 2;
    QTest::newRow("E without B, B without E")
        << "[" + good +
               ", {\"ph\": \"E\", \"ts\": 4}, {\"ph\": \"B\", \"name\": "
               "\"x\", \"ts\": 5}]"
        << "" << 2 << 1;
    QTest::newRow("E before its B") << "[" + good +
                                           ", {\"ph\": \"B\", \"name\": \"x\", \"ts\": 9}, {\"ph\": \"E\", "
                                           "\"ts\": 4}]"
                                    << "" << 1 << 1;
    QTest::newRow("a number beyond double")
        << "[" + good + ", {\"ph\": \"X\", \"name\": \"a\", \"ts\": 1e400}]"
        << "bad.json: not JSON" << 0 << 0;
    QTest::newRow("odd args") << "[" + good +
                                     ", {\"ph\": \"X\", \"name\": \"a\", \"ts\": \"12.5\", \"dur\": \"1x\"}, "
                                     "{\"ph\": \"X\", \"name\": \"nccl:all_reduce\", \"ts\": 3, "
                                     "\"dur\": 1, \"args\": {\"In msg nelems\": -5, \"Group size\": "
                                     "1e30, \"dtype\": 3, \"Input Dims\": [[-1, 2], \"x\", [[1]]]}}]"
                              << "" << 1 << 2;
    QTest::newRow("array without its ]") << "[" + good + ","
                                         << "" << 0 << 1;
  }
  void badInputs() {
    QFETCH(QString, text);
    QFETCH(QString, error);
    QFETCH(int, skipped);
    QFETCH(int, spans);
    auto t = importText(text.toStdString(), "bad.json");
    if (!error.isEmpty()) {
      QVERIFY(!t);
      QVERIFY2(QString::fromStdString(t.message()).startsWith(error), t.message().c_str());
      return;
    }
    QVERIFY2(t, t ? "" : t.message().c_str());
    std::int64_t n = 0;
    for (const auto& [reason, count] : t->skipped) n += count;
    QCOMPARE(int(n), skipped);
    std::size_t shown = 0;
    for (const auto& r : t->ranks)
      for (const auto& st : r.steps) shown += st.spans.size();
    QCOMPARE(int(shown), spans);
    ms::summarizeTrace(*t);  // and no crash summarising it
  }

  void refusesTwoFilesOfOneRank() {
    auto t = ms::importTraces({kTraces + "gpu-rank0.json", kTraces + "gpu-rank0.json"});
    QVERIFY(!t);
    QVERIFY2(t.message().find("holds rank 0 (distributedInfo)") != std::string::npos, t.message().c_str());
    auto missing = ms::importTraces({kTraces + "no-such.json"});
    QVERIFY(!missing);
    QVERIFY2(missing.message().find("no-such.json: cannot read") != std::string::npos,
             missing.message().c_str());
  }

  // The command line: the table, --json, exit 2 with the file named for bad input.
  void commandLine() {
    const QString r0 = QString::fromStdString(kTraces + "gpu-rank0.json");
    const QString r1 = QString::fromStdString(kTraces + "gpu-rank1.json");
    CliResult table = runEngine({"trace", r0, r1});
    QCOMPARE(table.code, 0);
    QVERIFY2(table.out.contains("timeline of GPU kernels"), qPrintable(table.out));
    QVERIFY(table.out.contains("all_reduce"));
    CliResult js = runEngine({"trace", r0, r1, "--json"});
    QCOMPARE(js.code, 0);
    const json doc = json::parse(js.out.toStdString());
    QCOMPARE(doc["ranks"].size(), std::size_t(2));
    QCOMPARE(doc["ranks"][0]["timeline"].get<std::string>(), std::string("gpu kernels"));
    QCOMPARE(doc["ranks"][1]["steps"][1]["step"].get<int>(), 6);
    QCOMPARE(doc["links"].size(), std::size_t(3));
    QCOMPARE(doc["events"]["shown"]["gemm"].get<int>(), 4);

    QTemporaryDir dir;
    const QString bad = dir.path() + "/bad.json";
    ms::test::writeBytes(bad.toStdString(), "{\"traceEvents\": [");
    CliResult b = runEngine({"trace", r0, bad});
    QCOMPARE(b.code, 2);
    QVERIFY2(b.err.contains(bad + ": not JSON"), qPrintable(b.err));
    QCOMPARE(runEngine({"trace"}).code, 2);
    QCOMPARE(runEngine({"trace", r0, "--bogus"}).code, 2);
  }

  // --profile-out: the trace's link written into a profile, which then loads with the measured curve; into an
  // existing link of the same rank count the trace's ops replace the file's and the others stay; a link the
  // planner could not use is refused and nothing is written.
  void profileLinks() {
    QTemporaryDir dir;
    const std::string profile = dir.path().toStdString() + "/p.json";
    ms::test::writeBytes(profile, minimalProfile().dump(2));
    const QString r0 = QString::fromStdString(kTraces + "gpu-rank0.json");
    const QString r1 = QString::fromStdString(kTraces + "gpu-rank1.json");
    CliResult w =
        runEngine({"trace", r0, r1, "--profile-out", QString::fromStdString(profile), "--link", "nvlink"});
    QVERIFY2(w.code == 0, qPrintable(w.err));
    auto p = ms::loadDeviceProfile(profile);
    QVERIFY2(p, p ? "" : p.message().c_str());
    const ms::LinkProfile* nvlink = (*p)->link("nvlink");
    QVERIFY(nvlink && (*p)->link("shm"));
    QCOMPARE(nvlink->ranks, 2);
    QCOMPARE(nvlink->seconds(ms::CollectiveOp::AllReduce, 4194304, 2), 420e-6);
    QCOMPARE(nvlink->seconds(ms::CollectiveOp::AllGather, 1048576, 2), 250e-6);
    QCOMPARE(nvlink->seconds(ms::CollectiveOp::SendRecv, 131072, 2), 80e-6);

    // The real gloo trace into "shm": its all_reduce curve replaces shm's, sendrecv and broadcast stay.
    CliResult m = runEngine({"trace", QString::fromStdString(kTraces + "torch-cpu-rank0.kineto.json"),
                             QString::fromStdString(kTraces + "torch-cpu-rank1.kineto.json"), "--profile-out",
                             QString::fromStdString(profile), "--link", "shm"});
    QVERIFY2(m.code == 0, qPrintable(m.err));
    p = ms::loadDeviceProfile(profile);
    QVERIFY2(p, p ? "" : p.message().c_str());
    const ms::LinkProfile* shm = (*p)->link("shm");
    QVERIFY(shm);
    std::multiset<double> sizes;
    for (const auto& [bytes, seconds] : shm->curves.at(ms::CollectiveOp::AllReduce)) sizes.insert(bytes);
    QVERIFY(sizes == kMlpAllReduceBytes);
    QCOMPARE(shm->curves.at(ms::CollectiveOp::SendRecv).size(), std::size_t(1));
    QCOMPARE(shm->curves.at(ms::CollectiveOp::SendRecv)[0].second, 1e-6);
    QCOMPARE(shm->curves.at(ms::CollectiveOp::Broadcast)[0].second, 3e-6);
    QVERIFY((*p)->link("nvlink"));

    // A new link without sendrecv: refused, the file as it was.
    const std::string before = ms::test::readBytes(profile);
    CliResult r = runEngine({"trace", QString::fromStdString(kTraces + "torch-cpu-rank0.kineto.json"),
                             QString::fromStdString(kTraces + "torch-cpu-rank1.kineto.json"), "--profile-out",
                             QString::fromStdString(profile), "--link", "gloo"});
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains("needs \"sendrecv\" measurements"), qPrintable(r.err));
    QCOMPARE(ms::test::readBytes(profile), before);
    // No profile there: refused with the file named.
    CliResult none = runEngine({"trace", r0, r1, "--profile-out", dir.path() + "/none.json"});
    QCOMPARE(none.code, 2);
    QVERIFY2(none.err.contains(dir.path() + "/none.json"), qPrintable(none.err));
    // The legacy export has no sizes: no link to write.
    CliResult sizeless = runEngine({"trace", QString::fromStdString(kTraces + "torch-cpu-rank0.json"),
                                    QString::fromStdString(kTraces + "torch-cpu-rank1.json"), "--profile-out",
                                    QString::fromStdString(profile)});
    QCOMPARE(sizeless.code, 2);
    QVERIFY2(sizeless.err.contains("no link written"), qPrintable(sizeless.err));
  }
};

QTEST_GUILESS_MAIN(TestTraceImport)
#include "tst_trace_import.moc"
