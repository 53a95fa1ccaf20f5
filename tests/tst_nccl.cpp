// The NCCL communicator (engine/runtime/cuda/nccl_communicator.h) under real mpirun at 2 ranks, with buffers
// in GPU memory: all-reduce, reduce-scatter, all-gather, broadcast, a send/receive ring and the non-blocking
// forms, each checked element by element on the host against values every rank computes itself. With one GPU
// for both ranks NCCL cannot run; the test then checks that ranksShareDevice() says so on every rank (the
// engine's cue to keep the MPI communicator). Without a CUDA device it exits 77, which CTest reports as
// skipped. Not a Qt Test: an MPI program whose ranks agree on the verdict.
#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/cuda/nccl_communicator.h"

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

float value(int rank, size_t i) {
  return float((i % 13 + 3 * size_t(rank)) % 29 + 1);
}

struct DeviceFloats {
  float* p = nullptr;
  size_t n = 0;
  explicit DeviceFloats(size_t count) : n(count) { cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(float)); }
  ~DeviceFloats() { cudaFree(p); }
  void upload(const std::vector<float>& h) {
    cudaMemcpy(p, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
  }
  std::vector<float> download() const {
    std::vector<float> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost);
    return h;
  }
};

void collectives(ms::NcclCommunicator& c) {
  const int R = c.rank(), W = c.size();
  for (size_t n : {size_t(1), size_t(7), size_t(1000003)}) {
    const std::string at = " (count " + std::to_string(n) + ")";
    std::vector<float> mine(n);
    for (size_t i = 0; i < n; ++i) mine[i] = value(R, i);
    DeviceFloats send(n), recv(n);
    send.upload(mine);
    expect(c.allReduce(send.p, recv.p, n, ms::CommType::F32, ms::ReduceOp::Sum).isOk(), "allReduce" + at);
    auto sum = recv.download();
    bool ok = true;
    for (size_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < W; ++r) want += value(r, i);
      ok &= sum[i] == want;
    }
    expect(ok, "allReduce sum" + at);
    // Non-blocking max, waited on.
    auto req = c.iallReduce(send.p, recv.p, n, ms::CommType::F32, ms::ReduceOp::Max);
    expect(req.isOk() && (*req)->wait().isOk(), "iallReduce" + at);
    auto most = recv.download();
    ok = true;
    for (size_t i = 0; i < n; ++i) {
      float want = value(0, i);
      for (int r = 1; r < W; ++r) want = std::max(want, value(r, i));
      ok &= most[i] == want;
    }
    expect(ok, "iallReduce max" + at);
    // All-gather of each rank's n values, then reduce-scatter back to this rank's share of the sum.
    DeviceFloats gathered(n * W);
    expect(c.allGather(send.p, gathered.p, n, ms::CommType::F32).isOk(), "allGather" + at);
    auto g = gathered.download();
    ok = true;
    for (int r = 0; r < W; ++r)
      for (size_t i = 0; i < n; ++i) ok &= g[r * n + i] == value(r, i);
    expect(ok, "allGather values" + at);
    DeviceFloats share(n);
    expect(c.reduceScatter(gathered.p, share.p, n, ms::CommType::F32, ms::ReduceOp::Sum).isOk(),
           "reduceScatter" + at);
    auto s = share.download();
    ok = true;
    for (size_t i = 0; i < n; ++i) ok &= s[i] == float(W) * value(R, i);
    expect(ok, "reduceScatter values" + at);
    // In place: the result lands in the FIRST block on every rank (communicator.h), not at this rank's.
    expect(c.reduceScatter(gathered.p, gathered.p, n, ms::CommType::F32, ms::ReduceOp::Sum).isOk(),
           "in-place reduceScatter" + at);
    auto sp = gathered.download();
    ok = true;
    for (size_t i = 0; i < n; ++i) ok &= sp[i] == float(W) * value(R, i);
    expect(ok, "in-place reduceScatter values" + at);
    // Broadcast from the last rank; a ring of sends.
    DeviceFloats b(n);
    b.upload(mine);
    expect(c.broadcast(b.p, n, ms::CommType::F32, W - 1).isOk(), "broadcast" + at);
    auto bv = b.download();
    ok = true;
    for (size_t i = 0; i < n; ++i) ok &= bv[i] == value(W - 1, i);
    expect(ok, "broadcast values" + at);
    if (W < 2) continue;  // a ring needs two ranks (one GPU hosts one NCCL rank: scripts/gpu_check.sh runs 1)
    DeviceFloats in(n);
    auto rr = c.irecv(in.p, n, ms::CommType::F32, (R + W - 1) % W, 5);
    auto sr = c.isend(send.p, n, ms::CommType::F32, (R + 1) % W, 5);
    expect(rr.isOk() && sr.isOk() && (*sr)->wait().isOk() && (*rr)->wait().isOk(), "send/recv ring" + at);
    auto iv = in.download();
    ok = true;
    for (size_t i = 0; i < n; ++i) ok &= iv[i] == value((R + W - 1) % W, i);
    expect(ok, "ring values" + at);
  }
}

// allToAllV (expert parallelism's token dispatch): rank r sends (r + 2d) % 5 + (d == r ? 3 : 0) elements to
// rank d (zero for some pairs at 2 ranks and more; the self block always non-empty, a device copy), from
// blocks laid out with gaps; the receive buffer's gaps keep their sentinel. At one rank only the self block.
void allToAll(ms::NcclCommunicator& c) {
  const int R = c.rank(), W = c.size();
  auto count = [](int from, int to) { return size_t((from + 2 * to) % 5 + (from == to ? 3 : 0)); };
  std::vector<size_t> sc(W), so(W), rc(W), ro(W);
  size_t sn = 1, rn = 2;  // a leading gap on both sides
  for (int d = 0; d < W; ++d) {
    sc[d] = count(R, d);
    so[d] = sn;
    sn += sc[d] + 1;
    rc[d] = count(d, R);
    ro[d] = rn;
    rn += rc[d] + 2;
  }
  std::vector<float> mine(sn, -1.0f);
  for (int d = 0; d < W; ++d)
    for (size_t i = 0; i < sc[d]; ++i) mine[so[d] + i] = float(1000 * R + 10 * d) + float(i);
  DeviceFloats send(sn), recv(rn);
  send.upload(mine);
  recv.upload(std::vector<float>(rn, -7.0f));
  expect(c.allToAllV(send.p, sc.data(), so.data(), recv.p, rc.data(), ro.data(), ms::CommType::F32).isOk(),
         "allToAllV");
  const auto got = recv.download();
  std::vector<float> want(rn, -7.0f);
  for (int s = 0; s < W; ++s)
    for (size_t i = 0; i < rc[s]; ++i) want[ro[s] + i] = float(1000 * s + 10 * R) + float(i);
  expect(got == want, "allToAllV values and untouched gaps");
}

// The pipeline's pattern (runtime/pipeline.cpp: sends are isend, receives blocking) between ranks 0 and 1 as
// 1F1B runs it on two stages: rank 0 sends activations a0, a1, a2 and then receives gradient g0 while its
// isends may still be pending; rank 1 receives a0, sends g0, then receives a1 and a2. On one NCCL
// communicator the a1 send would sit before the g0 receive and wait for rank 1's a1 receive, which sits after
// its g0 send: a hang. Large messages, so that no send can finish into NCCL's buffers alone.
void pipelinePattern(ms::NcclCommunicator& c) {
  const int R = c.rank();
  if (R > 1 || c.size() < 2) return;
  const size_t n = size_t(1) << 22;  // 16 MiB
  std::vector<float> host(n);
  DeviceFloats a0(n), a1(n), a2(n), g0(n);  // DeviceFloats owns raw memory: no copies, no vector
  DeviceFloats* act[3] = {&a0, &a1, &a2};
  bool ok = true;
  if (R == 0) {
    std::vector<ms::CommRequestPtr> sends;
    for (int m = 0; m < 3; ++m) {
      for (size_t i = 0; i < n; ++i) host[i] = value(m, i);
      act[m]->upload(host);
      auto r = c.isend(act[m]->p, n, ms::CommType::F32, 1, m);
      ok &= r.isOk();
      if (r.isOk()) sends.push_back(std::move(*r));
    }
    ok &= c.recv(g0.p, n, ms::CommType::F32, 1, 100).isOk();
    for (auto& r : sends) ok &= r->wait().isOk();
    auto g = g0.download();
    for (size_t i = 0; i < n; ++i) ok &= g[i] == value(7, i);
  } else {
    ok &= c.recv(a0.p, n, ms::CommType::F32, 0, 0).isOk();
    for (size_t i = 0; i < n; ++i) host[i] = value(7, i);
    g0.upload(host);
    auto r = c.isend(g0.p, n, ms::CommType::F32, 0, 100);
    ok &= r.isOk();
    ok &= c.recv(a1.p, n, ms::CommType::F32, 0, 1).isOk();
    ok &= c.recv(a2.p, n, ms::CommType::F32, 0, 2).isOk();
    if (r.isOk()) ok &= (*r)->wait().isOk();
    for (int m = 0; m < 3; ++m) {
      auto a = act[m]->download();
      for (size_t i = 0; i < n; ++i) ok &= a[i] == value(m, i);
    }
  }
  expect(ok, "pipeline pattern (isend activations, blocking receive of the gradient)");
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1, devices = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  int least = devices;
  MPI_Allreduce(&devices, &least, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (least == 0) {
    if (rank == 0) std::printf("SKIP: no CUDA device: the NCCL communicator test needs one\n");
    MPI_Finalize();
    return 77;
  }
  const int device = rank % devices;
  auto shared = ms::ranksShareDevice(MPI_COMM_WORLD, device);
  expect(shared.isOk(), "ranksShareDevice");
  const bool expectShared = devices < size;  // one host: ranks wrap around the devices
  expect(shared.isOk() && *shared == expectShared,
         "ranksShareDevice says " + std::string(*shared ? "shared" : "not shared"));
  if (shared.isOk() && !*shared) {
    auto c = ms::NcclCommunicator::create(MPI_COMM_WORLD, device, "world");
    expect(c.isOk(), c.isOk() ? "" : c.message());
    if (c.isOk()) {
      collectives(**c);
      allToAll(**c);
      pipelinePattern(**c);
      auto half = (*c)->split(rank % 2, rank);
      expect(half.isOk(), "split");
      if (half.isOk()) expect((*half)->size() == (size + 1 - rank % 2) / 2, "split size");
      // A negative color joins no group (every rank outside the tied-embedding group does this).
      auto some = (*c)->split(rank == 0 ? -1 : 0, rank);
      expect(some.isOk(), "split with a negative color");
      if (some.isOk()) expect(rank == 0 ? !*some : (*some && (*some)->size() == size - 1), "split -1 result");
    }
  } else if (rank == 0) {
    std::printf("%d ranks share %d GPU(s): NCCL cannot run them; the engine keeps the MPI communicator\n",
                size, devices);
  }
  int all = failures;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) std::printf("%s: %d failed check(s) over %d ranks\n", all ? "FAIL" : "PASS", all, size);
  MPI_Finalize();
  return all ? 1 : 0;
}
