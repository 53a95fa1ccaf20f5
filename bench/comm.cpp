// bench/comm: each collective through our Communicator (engine/runtime/mpi_communicator.h) against the raw
// MPI call it wraps, in the same run, nccl-tests style: a small table of collectives (byte count, data,
// bus-bandwidth factor, run) over one shared harness. For each size it warms up, times --iters calls, takes
// the slowest rank's mean (a step is as slow as its slowest rank), alternates ours and raw for three rounds
// and keeps each one's best, and checks the data outside the timed region; wrong data makes the exit status 1.
//
// usage: mpirun --oversubscribe -np 4 build/bench/bench_comm [--max-bytes N] [--iters N] [--warmup N]
// Columns: size (bytes, nccl-tests' convention: the larger of the send and receive buffers of one rank),
// count (elements per call; at least one per rank), type, then for ours and raw: time per call (us), algbw = size / time (GB/s) and
// busbw = algbw * factor (GB/s), and ours/raw (time ratio; ~1.0 means the layer costs nothing).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/mpi_communicator.h"

using ms::CommType;
using ms::Communicator;
using ms::ReduceOp;
using ms::Status;

namespace {

// Small integers: every sum of up to thousands of ranks is exact in f32, so checks compare exactly.
float value(int rank, size_t i) { return float((i % 13 + 3 * size_t(rank)) % 29 + 1); }

// One collective's buffers for one size; count is the count argument of the call.
struct Case {
  int rank = 0, n = 1;
  size_t count = 0;
  std::vector<float> send, recv;
};

int partner(int rank, int n) { return (rank ^ 1) < n ? (rank ^ 1) : -1; }  // pairs (0,1), (2,3), ...

bool allEqual(const std::vector<float>& got, size_t begin, size_t count, float (*want)(const Case&, size_t),
              const Case& c) {
  for (size_t i = 0; i < count; ++i)
    if (got[begin + i] != want(c, i)) return false;
  return true;
}

struct Collective {
  const char* name;
  const char* busFormula;
  double (*busFactor)(int n);  // nccl-tests doc/PERFORMANCE.md, "Bus bandwidth"
  // Buffers for `bytes` (rounded down to whole elements and, where blocks are per rank, whole blocks).
  void (*setup)(Case& c, size_t bytes);
  size_t (*sizeBytes)(const Case& c);
  Status (*ours)(Communicator& comm, Case& c);
  int (*raw)(MPI_Comm comm, Case& c);
  bool (*check)(const Case& c);
};

float sumAt(const Case& c, size_t i) {
  float s = 0;
  for (int r = 0; r < c.n; ++r) s += value(r, i);
  return s;
}

const Collective kCollectives[] = {
    {"all-reduce", "2(n-1)/n", [](int n) { return 2.0 * (n - 1) / n; },
     [](Case& c, size_t bytes) {
       c.count = bytes / 4;
       c.send.resize(c.count);
       c.recv.assign(c.count, 0.0f);
       for (size_t i = 0; i < c.count; ++i) c.send[i] = value(c.rank, i);
     },
     [](const Case& c) { return c.count * 4; },
     [](Communicator& comm, Case& c) {
       return comm.allReduce(c.send.data(), c.recv.data(), c.count, CommType::F32, ReduceOp::Sum);
     },
     [](MPI_Comm comm, Case& c) {
       return MPI_Allreduce(c.send.data(), c.recv.data(), int(c.count), MPI_FLOAT, MPI_SUM, comm);
     },
     [](const Case& c) { return allEqual(c.recv, 0, c.count, sumAt, c); }},

    {"reduce-scatter", "(n-1)/n", [](int n) { return double(n - 1) / n; },
     [](Case& c, size_t bytes) {
       c.count = std::max<size_t>(1, bytes / 4 / c.n);  // per rank; send (R, count)
       c.send.resize(c.n * c.count);
       c.recv.assign(c.count, 0.0f);
       for (size_t g = 0; g < c.send.size(); ++g) c.send[g] = value(c.rank, g);
     },
     [](const Case& c) { return c.n * c.count * 4; },
     [](Communicator& comm, Case& c) {
       return comm.reduceScatter(c.send.data(), c.recv.data(), c.count, CommType::F32, ReduceOp::Sum);
     },
     [](MPI_Comm comm, Case& c) {
       return MPI_Reduce_scatter_block(c.send.data(), c.recv.data(), int(c.count), MPI_FLOAT, MPI_SUM, comm);
     },
     [](const Case& c) {
       for (size_t j = 0; j < c.count; ++j)
         if (c.recv[j] != sumAt(c, c.rank * c.count + j)) return false;
       return true;
     }},

    {"all-gather", "(n-1)/n", [](int n) { return double(n - 1) / n; },
     [](Case& c, size_t bytes) {
       c.count = std::max<size_t>(1, bytes / 4 / c.n);  // per rank; recv (R, count)
       c.send.resize(c.count);
       c.recv.assign(c.n * c.count, 0.0f);
       for (size_t j = 0; j < c.count; ++j) c.send[j] = value(c.rank, j);
     },
     [](const Case& c) { return c.n * c.count * 4; },
     [](Communicator& comm, Case& c) {
       return comm.allGather(c.send.data(), c.recv.data(), c.count, CommType::F32);
     },
     [](MPI_Comm comm, Case& c) {
       return MPI_Allgather(c.send.data(), int(c.count), MPI_FLOAT, c.recv.data(), int(c.count), MPI_FLOAT,
                            comm);
     },
     [](const Case& c) {
       for (int r = 0; r < c.n; ++r)
         for (size_t j = 0; j < c.count; ++j)
           if (c.recv[r * c.count + j] != value(r, j)) return false;
       return true;
     }},

    {"broadcast", "1", [](int) { return 1.0; },
     [](Case& c, size_t bytes) {
       c.count = bytes / 4;  // root 0 broadcasts recv
       c.recv.resize(c.count);
       for (size_t i = 0; i < c.count; ++i) c.recv[i] = c.rank == 0 ? value(0, i) : -1.0f;
     },
     [](const Case& c) { return c.count * 4; },
     [](Communicator& comm, Case& c) { return comm.broadcast(c.recv.data(), c.count, CommType::F32, 0); },
     [](MPI_Comm comm, Case& c) { return MPI_Bcast(c.recv.data(), int(c.count), MPI_FLOAT, 0, comm); },
     [](const Case& c) {
       for (size_t i = 0; i < c.count; ++i)
         if (c.recv[i] != value(0, i)) return false;
       return true;
     }},

    // Ranks (0,1), (2,3), ... exchange count elements both ways at once; an odd last rank sits out.
    {"send/recv", "1", [](int) { return 1.0; },
     [](Case& c, size_t bytes) {
       c.count = bytes / 4;
       c.send.resize(c.count);
       c.recv.assign(c.count, 0.0f);
       for (size_t i = 0; i < c.count; ++i) c.send[i] = value(c.rank, i);
     },
     [](const Case& c) { return c.count * 4; },
     [](Communicator& comm, Case& c) {
       const int peer = partner(c.rank, c.n);
       if (peer < 0) return Status::ok();
       auto in = comm.irecv(c.recv.data(), c.count, CommType::F32, peer, 0);
       if (!in) return in.status();
       auto out = comm.isend(c.send.data(), c.count, CommType::F32, peer, 0);
       if (!out) return out.status();
       MS_TRY((*out)->wait());
       return (*in)->wait();
     },
     [](MPI_Comm comm, Case& c) {
       const int peer = partner(c.rank, c.n);
       if (peer < 0) return int(MPI_SUCCESS);
       // The same sequence as ours (post the receive, send, wait for the send, then the receive), so the
       // ratio shows the layer's cost, not a different waiting strategy.
       MPI_Request in, out;
       MPI_Irecv(c.recv.data(), int(c.count), MPI_FLOAT, peer, 0, comm, &in);
       MPI_Isend(c.send.data(), int(c.count), MPI_FLOAT, peer, 0, comm, &out);
       const int rc = MPI_Wait(&out, MPI_STATUS_IGNORE);
       return rc == MPI_SUCCESS ? MPI_Wait(&in, MPI_STATUS_IGNORE) : rc;
     },
     [](const Case& c) {
       const int peer = partner(c.rank, c.n);
       for (size_t i = 0; peer >= 0 && i < c.count; ++i)
         if (c.recv[i] != value(peer, i)) return false;
       return true;
     }},
};

struct Options {
  size_t maxBytes = size_t(64) << 20;
  int iters = 20;
  int warmup = 5;
  int rounds = 3;
};

// Mean seconds per call of the slowest rank; ok turns false when any call failed on this rank.
template <typename Run>
double timeCalls(Run run, const Options& o, bool& ok) {
  for (int i = 0; i < o.warmup; ++i) ok = run() && ok;
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  for (int i = 0; i < o.iters; ++i) ok = run() && ok;
  double t = (MPI_Wtime() - t0) / o.iters;
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

bool allRanks(bool mine) {
  int v = mine ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return v == 1;
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return false;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(argv[++i], &end, 10);
    const std::string suffix = end;
    const unsigned long long scale = suffix == "K" ? 1024ull : suffix == "M" ? 1ull << 20 : suffix == "G" ? 1ull << 30 : 1;
    if (!(suffix.empty() || scale > 1) || v == 0) return false;
    if (a == "--max-bytes") o.maxBytes = v * scale;
    else if (a == "--iters") o.iters = int(v);
    else if (a == "--warmup") o.warmup = int(v);
    else return false;
  }
  return o.maxBytes >= 8;
}

}  // namespace

int main(int argc, char** argv) {
  auto context = ms::MpiContext::create(&argc, &argv);
  if (!context) {
    std::fprintf(stderr, "bench_comm: %s\n", context.message().c_str());
    return 2;
  }
  Communicator& world = (*context)->world();
  const int rank = world.rank(), n = world.size();
  Options o;
  if (!parse(argc, argv, o)) {
    if (rank == 0)
      std::fprintf(stderr, "usage: mpirun -np R bench_comm [--max-bytes N[K|M|G]] [--iters N] [--warmup N]\n");
    return 2;
  }
  std::vector<size_t> sizes;
  for (size_t b = 8; b <= o.maxBytes; b *= 4) sizes.push_back(b);
  if (sizes.back() != o.maxBytes) sizes.push_back(o.maxBytes);

  if (rank == 0)
    std::printf("# bench_comm: %d ranks, %s, %d iterations after %d warm-up, best of %d rounds alternating ours "
                "and raw MPI; time = slowest rank's mean per call\n",
                n, world.name(), o.iters, o.warmup, o.rounds);
  bool allCorrect = true;
  for (const Collective& coll : kCollectives) {
    if (rank == 0) {
      std::printf("\n# %s: busbw = algbw * %s = %.3f\n", coll.name, coll.busFormula, coll.busFactor(n));
      std::printf("%12s %10s %4s | %10s %9s %9s | %10s %9s %9s | %8s %5s\n", "size(B)", "count", "type",
                  "ours(us)", "algbw", "busbw", "raw(us)", "algbw", "busbw", "ours/raw", "check");
    }
    for (size_t bytes : sizes) {
      Case c;
      c.rank = rank;
      c.n = n;
      coll.setup(c, bytes);
      bool ok = true;
      double ours = 1e30, raw = 1e30;
      for (int round = 0; round < o.rounds; ++round) {
        raw = std::min(raw, timeCalls([&] { return coll.raw(MPI_COMM_WORLD, c) == MPI_SUCCESS; }, o, ok));
        ours = std::min(ours, timeCalls([&] { return coll.ours(world, c).isOk(); }, o, ok));
      }
      // Correctness outside the timed region, from fresh buffers, for both paths.
      coll.setup(c, bytes);
      ok = coll.ours(world, c).isOk() && coll.check(c) && ok;
      coll.setup(c, bytes);
      ok = coll.raw(MPI_COMM_WORLD, c) == MPI_SUCCESS && coll.check(c) && ok;
      ok = allRanks(ok);
      allCorrect = allCorrect && ok;
      if (rank == 0) {
        const double size = double(coll.sizeBytes(c));
        auto gbps = [&](double t) { return t > 0 ? size / t / 1e9 : 0.0; };
        std::printf("%12zu %10zu %4s | %10.2f %9.3f %9.3f | %10.2f %9.3f %9.3f | %8.3f %5s\n", coll.sizeBytes(c),
                    c.count, "f32", ours * 1e6, gbps(ours), gbps(ours) * coll.busFactor(n), raw * 1e6, gbps(raw),
                    gbps(raw) * coll.busFactor(n), raw > 0 ? ours / raw : 0.0, ok ? "ok" : "WRONG");
        std::fflush(stdout);
      }
    }
  }
  if (rank == 0 && !allCorrect) std::fprintf(stderr, "bench_comm: wrong data (see the check column)\n");
  return allCorrect ? 0 : 1;
}
