// Tests of the MPI communicator (engine/runtime/mpi_communicator.h) under real mpirun (CTest runs this at 2,
// 3 and 4 ranks): every collective, point to point with tags, the non-blocking forms overlapping, chunking
// of large counts, split groups, the barrier, and errors that come back as Status values instead of aborts;
// and the all-to-all with per-peer counts on MPI (both its paths) and on host staging over the CPU's
// emulated device (engine/runtime/staging_communicator.h).
// Every rank checks every element against values it computes itself. A failed check never returns early:
// all ranks must reach the same collectives in the same order, so checks are collected and the ranks agree
// on the verdict at the end of each test (MS_AGREE).
#include <QTemporaryDir>
#include <QtTest>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>
#include <type_traits>
#include <vector>

#include "kernels/backend.h"
#include "runtime/mpi_communicator.h"
#include "runtime/safetensors.h"
#include "runtime/staging_communicator.h"

using namespace ms;

Q_DECLARE_METATYPE(ms::CommType)

namespace {

constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min};
constexpr CommType kTypes[] = {CommType::F32, CommType::F64, CommType::I32, CommType::I64, CommType::U8};
constexpr size_t kCounts[] = {0, 1, 7, 1000003};

// What rank r contributes at element i: small integers, so sums are exact in f32 and fit u8 up to 8 ranks;
// i64 adds 2^33 so the upper 32 bits travel too.
int base(int rank, size_t i) {
  return static_cast<int>((i % 13 + 3 * size_t(rank)) % 29) + 1;
}

template <typename T>
T value(int rank, size_t i) {
  if constexpr (std::is_same_v<T, int64_t>)
    return (int64_t(1) << 33) + base(rank, i);
  else if constexpr (std::is_same_v<T, double>)
    return base(rank, i) * 0.5;
  else
    return static_cast<T>(base(rank, i));
}

template <typename T>
T reduced(ReduceOp op, int size, size_t i) {
  T acc = value<T>(0, i);
  for (int r = 1; r < size; ++r) {
    const T v = value<T>(r, i);
    acc = op == ReduceOp::Sum ? T(acc + v) : op == ReduceOp::Max ? std::max(acc, v) : std::min(acc, v);
  }
  return acc;
}

template <typename T>
struct Tag {
  using type = T;
};

template <typename F>
void withType(CommType type, F&& f) {
  switch (type) {
    case CommType::F32:
      f(Tag<float>{});
      break;
    case CommType::F64:
      f(Tag<double>{});
      break;
    case CommType::I32:
      f(Tag<int32_t>{});
      break;
    case CommType::I64:
      f(Tag<int64_t>{});
      break;
    case CommType::U8:
      f(Tag<uint8_t>{});
      break;
    case CommType::BF16:
      break;  // its own test (bf16Reductions): no arithmetic type stands for it
  }
}

// Failures of one rank in one test; the first one is kept for the message.
class Checks {
 public:
  void expect(bool condition, const std::string& what) {
    if (condition) return;
    if (m_failures++ == 0) m_first = what;
  }
  void ok(const Status& status, const std::string& what) {
    expect(status.isOk(), what + ": " + status.message());
  }
  template <typename T>
  void equal(const std::vector<T>& got, size_t i, T want, const char* what) {
    if (got[i] == want) return;
    expect(false, std::string(what) + ": element " + std::to_string(i) + " is " + std::to_string(+got[i]) +
                      ", expected " + std::to_string(+want));
  }
  // Errors must name the operation; the message is the one a person reads.
  void error(const Status& status, const std::string& mustContain) {
    expect(!status.isOk(), "expected an error containing '" + mustContain + "', got ok");
    expect(status.message().find(mustContain) != std::string::npos,
           "error '" + status.message() + "' lacks '" + mustContain + "'");
  }
  int failures() const { return m_failures; }
  std::string summary(int worst) const {
    if (m_failures) return std::to_string(m_failures) + " failed checks, first: " + m_first;
    return "this rank passed, another rank had " + std::to_string(worst) + " failed checks";
  }

 private:
  int m_failures = 0;
  std::string m_first;
};

// The largest failure count of any rank, through raw MPI so the verdict does not depend on the code under
// test.
int worstRank(int failures) {
  int worst = 0;
  MPI_Allreduce(&failures, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

#define MS_AGREE(checks)                                                                 \
  do {                                                                                   \
    const int worst_ = worstRank((checks).failures());                                   \
    QVERIFY2(worst_ == 0, qPrintable(QString::fromStdString((checks).summary(worst_)))); \
  } while (0)

// Large counts run each op once, in place for Max only (3 of the 6 variants), to keep the suite within ~10 s
// at 4 ranks on 2 cores; small counts run all six.
bool skipVariant(size_t count, ReduceOp op, bool inPlace) {
  return count > 1000 && inPlace != (op == ReduceOp::Max);
}

void addTypeCountRows() {
  QTest::addColumn<CommType>("type");
  QTest::addColumn<qulonglong>("count");
  for (CommType type : kTypes)
    for (size_t count : kCounts)
      QTest::newRow(QByteArray(toString(type)).append(" x").append(QByteArray::number(qulonglong(count))))
          << type << qulonglong(count);
}

// ---- all-to-all with per-peer counts ----------------------------------------------------------------------

// Elements rank s sends rank d (times scale): uneven, and none for about a quarter of the pairs (at 2 ranks,
// 1 -> 0); the block to itself is among the others.
size_t pairCount(int s, int d, size_t scale) {
  if ((s + 2 * d) % 4 == 1) return 0;
  return scale * size_t(1 + (3 * s + 5 * d) % 7);
}

// Element i of the block from s to d: different per pair and below 65521, so f32, i32 and a bf16 bit pattern
// all carry it exactly, and never equal to the sentinel.
template <typename T>
T pairValue(int s, int d, size_t i) {
  return static_cast<T>((size_t(s * 8 + d) * 4099 + i) % 65521);
}

// What gaps and unused space hold before and after the exchange.
template <typename T>
T sentinel() {
  return std::is_same_v<T, uint16_t> ? T(0xFFFF) : T(-1);
}

// Where the blocks of one rank lie, with gaps between them that the exchange must leave alone. Send blocks in
// descending rank order; receive blocks in rotated order (from rank + 1 up, then around), after `lead`
// untouched elements; neither follows rank order, and every offset differs from a prefix sum.
struct AllToAllLayout {
  std::vector<size_t> sendCounts, sendOffsets, recvCounts, recvOffsets;
  size_t sendSize = 0, recvSize = 0;
};

AllToAllLayout allToAllLayout(int me, int R, size_t scale, size_t lead) {
  AllToAllLayout l;
  l.sendCounts.resize(R);
  l.sendOffsets.resize(R);
  l.recvCounts.resize(R);
  l.recvOffsets.resize(R);
  for (int r = R - 1; r >= 0; --r) {
    l.sendSize += 1 + size_t(r);
    l.sendOffsets[r] = l.sendSize;
    l.sendCounts[r] = pairCount(me, r, scale);
    l.sendSize += l.sendCounts[r];
  }
  l.recvSize = lead;
  for (int k = 1; k <= R; ++k) {
    const int r = (me + k) % R;
    l.recvOffsets[r] = l.recvSize;
    l.recvCounts[r] = pairCount(r, me, scale);
    l.recvSize += l.recvCounts[r] + 2 + size_t(r % 3);
  }
  return l;
}

// One exchange on comm, every element of the receive buffer checked: each block against its sender's values,
// everything else still the sentinel. With a device (the emulated one), the buffers live in its memory.
template <typename T>
void checkAllToAllV(Communicator& comm, CommType type, size_t scale, size_t lead, Backend* device,
                    Checks& checks, const std::string& what) {
  const int me = comm.rank(), R = comm.size();
  const AllToAllLayout l = allToAllLayout(me, R, scale, lead);
  std::vector<T> send(l.sendSize, sentinel<T>()), recv(l.recvSize, sentinel<T>()), want(recv);
  for (int r = 0; r < R; ++r) {
    for (size_t i = 0; i < l.sendCounts[r]; ++i) send[l.sendOffsets[r] + i] = pairValue<T>(me, r, i);
    for (size_t i = 0; i < l.recvCounts[r]; ++i) want[l.recvOffsets[r] + i] = pairValue<T>(r, me, i);
  }
  Status status;
  if (device) {
    const size_t sendBytes = send.size() * sizeof(T), recvBytes = recv.size() * sizeof(T);
    void* dSend = device->allocate(sendBytes);
    void* dRecv = device->allocate(recvBytes);
    device->upload(dSend, send.data(), sendBytes);
    device->upload(dRecv, recv.data(), recvBytes);
    status = comm.allToAllV(dSend, l.sendCounts.data(), l.sendOffsets.data(), dRecv, l.recvCounts.data(),
                            l.recvOffsets.data(), type);
    device->download(recv.data(), dRecv, recvBytes);
    device->deallocate(dSend, sendBytes);
    device->deallocate(dRecv, recvBytes);
  } else {
    status = comm.allToAllV(send.data(), l.sendCounts.data(), l.sendOffsets.data(), recv.data(),
                            l.recvCounts.data(), l.recvOffsets.data(), type);
  }
  checks.ok(status, what);
  for (size_t i = 0; i < recv.size(); ++i)
    if (recv[i] != want[i]) {
      checks.equal(recv, i, want[i], (what + (want[i] == sentinel<T>() ? " (a gap)" : " (a block)")).c_str());
      break;  // one message per exchange is enough
    }
}

// The element types of the all-to-all tests; bf16 travels as its bit patterns.
template <typename F>
void withAllToAllType(CommType type, F&& f) {
  switch (type) {
    case CommType::F32:
      f(Tag<float>{});
      break;
    case CommType::I32:
      f(Tag<int32_t>{});
      break;
    case CommType::BF16:
      f(Tag<uint16_t>{});
      break;
    default:
      QFAIL("no all-to-all test for this type");
  }
}

constexpr CommType kAllToAllTypes[] = {CommType::F32, CommType::I32, CommType::BF16};

// Scale 1: blocks of 0 to 7 elements. Scale 100000: up to 700 k elements per block, a few MB per rank.
void addAllToAllRows() {
  QTest::addColumn<CommType>("type");
  QTest::addColumn<qulonglong>("scale");
  for (CommType type : kAllToAllTypes)
    for (size_t scale : {size_t(1), size_t(100000)})
      QTest::newRow(QByteArray(toString(type)).append(" x").append(QByteArray::number(qulonglong(scale))))
          << type << qulonglong(scale);
}

}  // namespace

class TestComm : public QObject {
  Q_OBJECT

 public:
  explicit TestComm(MpiCommunicator& world) : m_world(world) {}

 private slots:
  void identity() {
    Checks checks;
    int rank = -1, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    checks.expect(m_world.rank() == rank && m_world.size() == size, "rank/size differ from MPI_COMM_WORLD");
    checks.expect(std::string(m_world.name()) == "mpi" && m_world.label() == "world", "name or label");
    checks.expect(size >= 2, "run under mpirun with at least 2 ranks");
    MS_AGREE(checks);
  }

  void allReduce_data() { addTypeCountRows(); }
  void allReduce() {
    QFETCH(CommType, type);
    QFETCH(qulonglong, count);
    Checks checks;
    withType(type, [&](auto tag) {
      using T = typename decltype(tag)::type;
      for (ReduceOp op : kOps)
        for (bool inPlace : {false, true}) {
          if (skipVariant(count, op, inPlace)) continue;
          std::vector<T> send(count), recv(count, T(0));
          for (size_t i = 0; i < count; ++i) send[i] = value<T>(rank(), i);
          T* out = inPlace ? send.data() : recv.data();
          checks.ok(m_world.allReduce(send.data(), out, count, type, op), "allReduce");
          const std::vector<T>& result = inPlace ? send : recv;
          for (size_t i = 0; i < count; ++i)
            checks.equal(result, i, reduced<T>(op, size(), i), inPlace ? "in place" : "out of place");
        }
    });
    MS_AGREE(checks);
  }

  void reduceScatter_data() { addTypeCountRows(); }
  void reduceScatter() {
    QFETCH(CommType, type);
    QFETCH(qulonglong, count);  // per rank
    Checks checks;
    withType(type, [&](auto tag) {
      using T = typename decltype(tag)::type;
      for (ReduceOp op : kOps)
        for (bool inPlace : {false, true}) {
          if (skipVariant(count, op, inPlace)) continue;
          std::vector<T> send(size() * count), recv(count, T(0));  // send (R, count)
          for (size_t g = 0; g < send.size(); ++g) send[g] = value<T>(rank(), g);
          checks.ok(m_world.reduceScatter(send.data(), inPlace ? send.data() : recv.data(), count, type, op),
                    "reduceScatter");
          if (inPlace) recv.assign(send.begin(), send.begin() + count);
          for (size_t j = 0; j < count; ++j)
            checks.equal(recv, j, reduced<T>(op, size(), rank() * count + j), "reduceScatter block");
        }
    });
    MS_AGREE(checks);
  }

  void allGather_data() { addTypeCountRows(); }
  void allGather() {
    QFETCH(CommType, type);
    QFETCH(qulonglong, count);  // per rank
    Checks checks;
    withType(type, [&](auto tag) {
      using T = typename decltype(tag)::type;
      for (bool inPlace : {false, true}) {
        std::vector<T> send(count), recv(size() * count, T(0));  // recv (R, count)
        for (size_t j = 0; j < count; ++j) send[j] = value<T>(rank(), j);
        if (inPlace) std::copy(send.begin(), send.end(), recv.begin() + rank() * count);
        const T* in = inPlace ? recv.data() + rank() * count : send.data();
        checks.ok(m_world.allGather(in, recv.data(), count, type), "allGather");
        for (int r = 0; r < size(); ++r)
          for (size_t j = 0; j < count; ++j)
            checks.equal(recv, r * count + j, value<T>(r, j), inPlace ? "in place" : "out of place");
      }
    });
    MS_AGREE(checks);
  }

  void broadcast_data() { addTypeCountRows(); }
  void broadcast() {
    QFETCH(CommType, type);
    QFETCH(qulonglong, count);
    Checks checks;
    withType(type, [&](auto tag) {
      using T = typename decltype(tag)::type;
      for (int root = 0; root < size(); ++root) {
        std::vector<T> data(count, T(99));
        if (rank() == root)
          for (size_t i = 0; i < count; ++i) data[i] = value<T>(root, i);
        checks.ok(m_world.broadcast(data.data(), count, type, root), "broadcast");
        for (size_t i = 0; i < count; ++i) checks.equal(data, i, value<T>(root, i), "broadcast");
      }
    });
    MS_AGREE(checks);
  }

  // bf16 (gradients with "grad_precision": "bf16"): sums of small integers are exact in bf16, so every
  // collective has one right answer whatever the order MPI adds in; one element checks the rounding itself:
  // rank 0 gives 1, rank 1 gives 1.5 * 2^-8 (three quarters of bf16's ulp at 1, 2^-7), the others 0, so the
  // sum must round to nearest, 1 + 2^-7 (truncation would give 1); another gives rank 1 exactly half an ulp,
  // 2^-8, which ties to even, 1. Max and min, reduce-scatter, all-gather, the non-blocking all-reduce and a
  // point-to-point message carry the bits unchanged.
  void bf16Reductions() {
    Checks checks;
    auto bits = [](float f) { return floatToBf16(f); };  // every value used is exact in bf16
    auto wide = [](uint16_t b) { return bf16ToFloat(b); };
    const int R = size(), me = rank();
    const size_t n = 1000;
    std::vector<uint16_t> send(n + 2), recv(n + 2);
    for (size_t i = 0; i < n; ++i) send[i] = bits(float(value<int32_t>(me, i)));
    send[n] = bits(me == 0 ? 1.0f : me == 1 ? 1.5f / 256.0f : 0.0f);
    send[n + 1] = bits(me == 0 ? 1.0f : me == 1 ? 1.0f / 256.0f : 0.0f);
    for (ReduceOp op : kOps) {
      checks.ok(m_world.allReduce(send.data(), recv.data(), n + 2, CommType::BF16, op), "bf16 allReduce");
      for (size_t i = 0; i < n; ++i)
        checks.expect(wide(recv[i]) == float(reduced<int32_t>(op, R, i)),
                      std::string("bf16 allReduce ") + toString(op) + " element " + std::to_string(i));
    }
    checks.ok(m_world.allReduce(send.data(), recv.data(), n + 2, CommType::BF16, ReduceOp::Sum), "allReduce");
    checks.expect(wide(recv[n]) == 1.0f + 1.0f / 128.0f,
                  "1 + 0.75 ulp rounds to 1 + 2^-7, got " + std::to_string(wide(recv[n])));
    checks.expect(wide(recv[n + 1]) == 1.0f,
                  "1 + 0.5 ulp ties to even (1), got " + std::to_string(wide(recv[n + 1])));
    // Non-blocking, in place.
    std::vector<uint16_t> inPlace(send);
    auto req = m_world.iallReduce(inPlace.data(), inPlace.data(), n, CommType::BF16, ReduceOp::Sum);
    checks.ok(req.status(), "bf16 iallReduce");
    if (req) checks.ok((*req)->wait(), "bf16 iallReduce wait");
    for (size_t i = 0; i < n; ++i)
      checks.expect(inPlace[i] == recv[i], "bf16 iallReduce element " + std::to_string(i));
    // Reduce-scatter of R blocks of m elements.
    const size_t m = 37;
    std::vector<uint16_t> blocks(m * R), mine(m);
    for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = bits(float(value<int32_t>(me, i)));
    checks.ok(m_world.reduceScatter(blocks.data(), mine.data(), m, CommType::BF16, ReduceOp::Sum),
              "bf16 reduceScatter");
    for (size_t i = 0; i < m; ++i)
      checks.expect(wide(mine[i]) == float(reduced<int32_t>(ReduceOp::Sum, R, me * m + i)),
                    "bf16 reduceScatter element " + std::to_string(i));
    // All-gather moves the bits.
    std::vector<uint16_t> all(m * R);
    checks.ok(m_world.allGather(mine.data(), all.data(), m, CommType::BF16), "bf16 allGather");
    for (int r = 0; r < R; ++r)
      for (size_t i = 0; i < m; ++i)
        checks.expect(wide(all[r * m + i]) == float(reduced<int32_t>(ReduceOp::Sum, R, r * m + i)),
                      "bf16 allGather element " + std::to_string(r * m + i));
    MS_AGREE(checks);
  }

  void sendRecvRing_data() {
    QTest::addColumn<qulonglong>("count");
    for (size_t count : kCounts) QTest::newRow(QByteArray::number(qulonglong(count))) << qulonglong(count);
  }
  void sendRecvRing() {
    QFETCH(qulonglong, count);
    Checks checks;
    const int next = (rank() + 1) % size(), prev = (rank() + size() - 1) % size();
    std::vector<int64_t> out(count), in(count, -1);
    for (size_t i = 0; i < count; ++i) out[i] = value<int64_t>(rank(), i);
    // Even ranks send first, odd ranks receive first: a blocking ring without deadlock at any size.
    if (rank() % 2 == 0) {
      checks.ok(m_world.send(out.data(), count, CommType::I64, next, 5), "send");
      checks.ok(m_world.recv(in.data(), count, CommType::I64, prev, 5), "recv");
    } else {
      checks.ok(m_world.recv(in.data(), count, CommType::I64, prev, 5), "recv");
      checks.ok(m_world.send(out.data(), count, CommType::I64, next, 5), "send");
    }
    for (size_t i = 0; i < count; ++i) checks.equal(in, i, value<int64_t>(prev, i), "ring");
    MS_AGREE(checks);
  }

  // Two messages to the same peer, sent with tag 11 then tag 7, received into buffers by tag: tags, not
  // arrival order, decide where data lands.
  void tagsMatchByTag() {
    Checks checks;
    const int next = (rank() + 1) % size(), prev = (rank() + size() - 1) % size();
    std::vector<int32_t> a(5, rank() * 100 + 11), b(3, rank() * 100 + 7), gotA(5, -1), gotB(3, -1);
    auto r7 = m_world.irecv(gotB.data(), 3, CommType::I32, prev, 7);
    auto r11 = m_world.irecv(gotA.data(), 5, CommType::I32, prev, 11);
    auto s11 = m_world.isend(a.data(), 5, CommType::I32, next, 11);
    auto s7 = m_world.isend(b.data(), 3, CommType::I32, next, 7);
    for (auto* r : {&r7, &r11, &s11, &s7}) {
      checks.ok(r->status(), "start");
      if (r->isOk()) checks.ok((**r)->wait(), "wait");
    }
    for (size_t i = 0; i < 5; ++i) checks.equal(gotA, i, prev * 100 + 11, "tag 11");
    for (size_t i = 0; i < 3; ++i) checks.equal(gotB, i, prev * 100 + 7, "tag 7");
    MS_AGREE(checks);
  }

  // Several operations in flight at once, waited in reverse order of starting.
  void nonBlockingOverlap_data() { addTypeCountRows(); }
  void nonBlockingOverlap() {
    QFETCH(CommType, type);
    QFETCH(qulonglong, count);
    Checks checks;
    withType(type, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const int root = size() - 1, next = (rank() + 1) % size(), prev = (rank() + size() - 1) % size();
      std::vector<T> arSend(count), arRecv(count), agSend(count), agRecv(size() * count), bc(count, T(99)),
          rsSend(size() * count), rsRecv(count), p2pOut(count), p2pIn(count, T(0));
      for (size_t i = 0; i < count; ++i) {
        arSend[i] = agSend[i] = p2pOut[i] = value<T>(rank(), i);
        if (rank() == root) bc[i] = value<T>(root, i);
      }
      for (size_t g = 0; g < rsSend.size(); ++g) rsSend[g] = value<T>(rank(), g);

      std::vector<Expected<CommRequestPtr>> started;
      started.push_back(m_world.iallReduce(arSend.data(), arRecv.data(), count, type, ReduceOp::Sum));
      started.push_back(m_world.irecv(p2pIn.data(), count, type, prev, 3));
      started.push_back(m_world.iallGather(agSend.data(), agRecv.data(), count, type));
      started.push_back(m_world.isend(p2pOut.data(), count, type, next, 3));
      started.push_back(m_world.ibroadcast(bc.data(), count, type, root));
      started.push_back(m_world.ireduceScatter(rsSend.data(), rsRecv.data(), count, type, ReduceOp::Max));
      for (auto it = started.rbegin(); it != started.rend(); ++it) {
        checks.ok(it->status(), "start");
        if (!it->isOk()) continue;
        checks.ok((**it)->wait(), "wait");
        checks.expect((**it)->ready(), "ready() after wait()");
        checks.ok((**it)->wait(), "second wait");
      }
      for (size_t i = 0; i < count; ++i) {
        checks.equal(arRecv, i, reduced<T>(ReduceOp::Sum, size(), i), "iallReduce");
        checks.equal(bc, i, value<T>(root, i), "ibroadcast");
        checks.equal(p2pIn, i, value<T>(prev, i), "irecv");
        checks.equal(rsRecv, i, reduced<T>(ReduceOp::Max, size(), rank() * count + i), "ireduceScatter");
        for (int r = 0; r < size(); ++r) checks.equal(agRecv, r * count + i, value<T>(r, i), "iallGather");
      }
    });
    MS_AGREE(checks);
  }

  // ready() polling finishes a request; destroying an unfinished request waits instead of leaking it.
  void readyAndDestructor() {
    Checks checks;
    const size_t count = 100003;
    std::vector<float> data(count), sum(count);
    for (size_t i = 0; i < count; ++i) data[i] = value<float>(rank(), i);
    {
      auto request = m_world.iallReduce(data.data(), sum.data(), count, CommType::F32, ReduceOp::Sum);
      checks.ok(request.status(), "iallReduce");
      if (request.isOk())
        while (!(*request)->ready()) std::this_thread::yield();
    }
    for (size_t i = 0; i < count; ++i)
      checks.equal(sum, i, reduced<float>(ReduceOp::Sum, size(), i), "ready");
    std::fill(sum.begin(), sum.end(), 0.0f);
    {
      auto request = m_world.iallReduce(data.data(), sum.data(), count, CommType::F32, ReduceOp::Max);
      checks.ok(request.status(), "iallReduce");
    }  // destroyed unfinished: waits
    for (size_t i = 0; i < count; ++i)
      checks.equal(sum, i, reduced<float>(ReduceOp::Max, size(), i), "after destructor");
    MS_AGREE(checks);
  }

  // A communicator limited to 65536 elements per MPI call splits 1000003 elements into 16 chunks; the
  // strided collectives refuse instead.
  void chunking() {
    Checks checks;
    auto small = m_world.duplicate(65536);
    checks.ok(small.status(), "duplicate");
    if (small.isOk()) {
      MpiCommunicator& comm = **small;
      const size_t count = 1000003;
      const int next = (rank() + 1) % size(), prev = (rank() + size() - 1) % size();
      std::vector<int32_t> data(count), sum(count), bc(count, -1), in(count, -1), in2(count, -1);
      for (size_t i = 0; i < count; ++i) data[i] = value<int32_t>(rank(), i) * 1000 + int32_t(i % 1000);
      if (rank() == 0) bc = data;
      checks.ok(comm.allReduce(data.data(), sum.data(), count, CommType::I32, ReduceOp::Max), "allReduce");
      checks.ok(comm.broadcast(bc.data(), count, CommType::I32, 0), "broadcast");
      auto rin = comm.irecv(in.data(), count, CommType::I32, prev, 1);
      auto sout = comm.isend(data.data(), count, CommType::I32, next, 1);
      checks.ok(rin.status(), "irecv");
      checks.ok(sout.status(), "isend");
      if (rin.isOk() && sout.isOk()) {
        checks.ok((*sout)->wait(), "isend wait");
        checks.ok((*rin)->wait(), "irecv wait");
      }
      if (rank() % 2 == 0) {
        checks.ok(comm.send(data.data(), count, CommType::I32, next, 2), "send");
        checks.ok(comm.recv(in2.data(), count, CommType::I32, prev, 2), "recv");
      } else {
        checks.ok(comm.recv(in2.data(), count, CommType::I32, prev, 2), "recv");
        checks.ok(comm.send(data.data(), count, CommType::I32, next, 2), "send");
      }
      for (size_t i = 0; i < count; ++i) {
        int32_t want = 0;
        for (int r = 0; r < size(); ++r)
          want = std::max(want, value<int32_t>(r, i) * 1000 + int32_t(i % 1000));
        checks.equal(sum, i, want, "chunked allReduce");
        checks.equal(bc, i, value<int32_t>(0, i) * 1000 + int32_t(i % 1000), "chunked broadcast");
        checks.equal(in, i, value<int32_t>(prev, i) * 1000 + int32_t(i % 1000), "chunked isend/irecv");
        checks.equal(in2, i, value<int32_t>(prev, i) * 1000 + int32_t(i % 1000), "chunked send/recv");
      }
      std::vector<int32_t> big(size() * count), out(count);
      checks.error(comm.reduceScatter(big.data(), out.data(), count, CommType::I32, ReduceOp::Sum),
                   "reduceScatter on mpi communicator 'world/dup'");
      checks.error(comm.allGather(out.data(), big.data(), count, CommType::I32), "not chunked");
    }
    MS_AGREE(checks);
  }

  // MPI_Alltoallv: uneven blocks (some empty), the self block, gaps left untouched, offsets out of rank
  // order; then the same exchange twice more on the same communicator (nothing left over from the first).
  void allToAllV_data() { addAllToAllRows(); }
  void allToAllV() {
    QFETCH(CommType, type);
    QFETCH(qulonglong, scale);
    Checks checks;
    withAllToAllType(type, [&](auto tag) {
      using T = typename decltype(tag)::type;
      for (int round = 0; round < (scale == 1 ? 3 : 1); ++round)
        checkAllToAllV<T>(m_world, type, scale, 5, nullptr, checks, "allToAllV");
    });
    MS_AGREE(checks);
  }

  // The large path (MPI_Alltoallw over derived datatypes) without 8 GiB buffers: a communicator limited to 5
  // elements per call carries blocks of up to 7 elements (a whole chunk and a remainder, a remainder only,
  // whole chunks only) at offsets past 5. Then one limited to 64, where only rank 0's receive offsets pass
  // the limit (a lead of 1000): every rank must follow it onto the large path, or the collectives would not
  // match.
  void allToAllVLargePath_data() {
    QTest::addColumn<CommType>("type");
    for (CommType type : kAllToAllTypes) QTest::newRow(toString(type)) << type;
  }
  void allToAllVLargePath() {
    QFETCH(CommType, type);
    Checks checks;
    auto tiny = m_world.duplicate(5);
    auto small = m_world.duplicate(64);
    checks.ok(tiny.status(), "duplicate(5)");
    checks.ok(small.status(), "duplicate(64)");
    if (tiny.isOk() && small.isOk()) {
      withAllToAllType(type, [&](auto tag) {
        using T = typename decltype(tag)::type;
        checkAllToAllV<T>(**tiny, type, 1, 5, nullptr, checks, "allToAllV in chunks of 5");
        checkAllToAllV<T>(**small, type, 1, rank() == 0 ? 1000 : 0, nullptr, checks,
                          "allToAllV with one rank past the limit");
        checkAllToAllV<T>(**small, type, 1, 0, nullptr, checks, "allToAllV after the large path");
      });
    }
    MS_AGREE(checks);
  }

  // Host staging over the CPU's emulated device (what --emulate-device runs, and the fallback when ranks
  // share a GPU): device buffers only, which the emulation enforces (a host access faults).
  void allToAllVStaged_data() { addAllToAllRows(); }
  void allToAllVStaged() {
    QFETCH(CommType, type);
    QFETCH(qulonglong, scale);
    Checks checks;
    const auto device = makeCpuBackend(true);
    StagingCommunicator staged(m_world, *device);
    withAllToAllType(type, [&](auto tag) {
      using T = typename decltype(tag)::type;
      try {
        for (int round = 0; round < 2; ++round)
          checkAllToAllV<T>(staged, type, scale, 5, device.get(), checks, "staged allToAllV");
      } catch (const DeviceFailure& e) {
        checks.expect(false, std::string("staged allToAllV: ") + e.what());
      }
    });
    MS_AGREE(checks);
  }

  // Errors name the operation, the communicator and the rank, on every rank, and leave no rank waiting: a
  // block of 2^32 elements on a communicator limited to 1 element per call is past even the large path (only
  // rank 0 asks for it; no buffer is touched); on host staging, rank 1 expecting 5 elements from rank 0,
  // which sends 3.
  void allToAllVErrors() {
    Checks checks;
    const int R = size(), me = rank();
    auto one = m_world.duplicate(1);
    checks.ok(one.status(), "duplicate(1)");
    if (one.isOk()) {
      std::vector<size_t> counts(R, 0), offsets(R, 0);
      if (me == 0) counts[1] = size_t(1) << 32;
      int32_t none = 0;
      const Status s = (*one)->allToAllV(&none, counts.data(), offsets.data(), &none, offsets.data(),
                                         offsets.data(), CommType::I32);
      const std::string who = "allToAllV on mpi communicator 'world/dup' (rank " + std::to_string(me) +
                              " of " + std::to_string(R) + "): ";
      checks.error(s, who + (me == 0 ? "4294967296 elements to or from rank 1 need more than INT_MAX chunks"
                                     : "another rank's block is too large"));
    }
    const auto device = makeCpuBackend(true);
    StagingCommunicator staged(m_world, *device);
    std::vector<size_t> sendCounts(R, 0), recvCounts(R, 0), offsets(R, 0);
    if (me == 0) sendCounts[1] = 3;
    if (me == 1) recvCounts[0] = 5;
    void* in = device->allocate(5 * sizeof(int32_t));
    void* out = device->allocate(5 * sizeof(int32_t));
    const Status s = staged.allToAllV(in, sendCounts.data(), offsets.data(), out, recvCounts.data(),
                                      offsets.data(), CommType::I32);
    if (me == 1)
      checks.error(s, "all-to-all on mpi+staging communicator world (rank 1 of " + std::to_string(R) +
                          "): irecv on mpi communicator 'world/split(0)' (rank 1 of " + std::to_string(R) +
                          "): received 3 elements, expected 5");
    else
      checks.ok(s, "staged allToAllV beside the short message");
    device->deallocate(in, 5 * sizeof(int32_t));
    device->deallocate(out, 5 * sizeof(int32_t));
    MS_AGREE(checks);
  }

  // Even and odd world ranks form two groups, ordered by descending world rank (key = -rank).
  void splitEvenOdd() {
    Checks checks;
    auto group = m_world.split(rank() % 2, -rank());
    checks.ok(group.status(), "split");
    if (group.isOk() && *group) {
      Communicator& g = **group;
      std::vector<int32_t> members;  // world ranks of this parity, descending
      for (int r = size() - 1; r >= 0; --r)
        if (r % 2 == rank() % 2) members.push_back(r);
      const int expectedRank = int(std::find(members.begin(), members.end(), rank()) - members.begin());
      checks.expect(g.size() == int(members.size()), "group size " + std::to_string(g.size()));
      checks.expect(g.rank() == expectedRank, "group rank " + std::to_string(g.rank()));
      checks.expect(g.label() == "world/split(" + std::to_string(rank() % 2) + ")", "label " + g.label());

      int32_t mine = rank(), total = 0;
      checks.ok(g.allReduce(&mine, &total, 1, CommType::I32, ReduceOp::Sum), "group allReduce");
      int32_t want = 0;
      for (int32_t r : members) want += r;
      checks.expect(total == want,
                    "group sum " + std::to_string(total) + ", expected " + std::to_string(want));

      std::vector<int32_t> gathered(g.size(), -1);
      checks.ok(g.allGather(&mine, gathered.data(), 1, CommType::I32), "group allGather");
      checks.expect(gathered == members, "group allGather order");

      int32_t fromRoot = g.rank() == 0 ? rank() : -1;
      checks.ok(g.broadcast(&fromRoot, 1, CommType::I32, 0), "group broadcast");
      checks.expect(fromRoot == members.front(), "group broadcast from its rank 0");
      checks.ok(g.barrier(), "group barrier");
    } else {
      checks.expect(false, "split gave no group");
    }
    // Rank 0 joins no group; the others form one group of size - 1.
    auto rest = m_world.split(rank() == 0 ? -1 : 0, rank());
    checks.ok(rest.status(), "split with a negative color");
    if (rest.isOk()) {
      checks.expect((*rest == nullptr) == (rank() == 0), "negative color gives no group, others one");
      if (*rest) checks.expect((*rest)->size() == size() - 1 && (*rest)->rank() == rank() - 1, "rest group");
    }
    MS_AGREE(checks);
  }

  // Every rank writes a file (rank 0 last, after a delay) before the barrier; after it every file exists.
  void barrier() {
    Checks checks;
    QTemporaryDir dir;  // rank 0's is used; the others only broadcast-receive its path
    std::string path = rank() == 0 ? dir.path().toStdString() : std::string();
    uint64_t length = path.size();
    checks.ok(m_world.broadcast(&length, 1, CommType::I64, 0), "broadcast length");
    path.resize(length);
    checks.ok(m_world.broadcast(path.data(), length, CommType::U8, 0), "broadcast path");
    if (rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ofstream(path + "/rank" + std::to_string(rank())) << rank();
    checks.ok(m_world.barrier(), "barrier");
    for (int r = 0; r < size(); ++r)
      checks.expect(std::ifstream(path + "/rank" + std::to_string(r)).good(),
                    "rank " + std::to_string(r) + "'s file is missing after the barrier");
    checks.ok(m_world.barrier(), "barrier before removing the directory");
    MS_AGREE(checks);
  }

  // Bad roots and peers, an invalid tag and a truncated message: Status errors naming the operation, the
  // communicator and the rank; the process lives on.
  void errors() {
    Checks checks;
    const std::string who = " on mpi communicator 'world' (rank " + std::to_string(rank()) + " of " +
                            std::to_string(size()) + ")";
    int32_t x[8] = {};
    checks.error(m_world.broadcast(x, 1, CommType::I32, size()),
                 "broadcast" + who + ": root " + std::to_string(size()) + " is not a rank");
    auto ib = m_world.ibroadcast(x, 1, CommType::I32, -1);
    checks.error(ib.status(), "ibroadcast" + who + ": root -1");
    checks.error(m_world.send(x, 1, CommType::I32, size(), 0), "send" + who + ": peer");
    checks.error(m_world.recv(x, 1, CommType::I32, -2, 0), "recv" + who + ": peer -2");
    checks.error(m_world.isend(x, 1, CommType::I32, size() + 3, 0).status(), "isend" + who);
    checks.error(m_world.irecv(x, 1, CommType::I32, -1, 0).status(), "irecv" + who);
    // Left to MPI's own checks: its error string comes through.
    checks.error(m_world.send(x, 1, CommType::I32, 0, -5), "send" + who + ": MPI_ERR_TAG");
    // Rank 0 sends 5 elements to rank 1, which expects 3 (MPI truncates) and then 5 elements sent as 3.
    if (rank() == 0) {
      checks.ok(m_world.send(x, 5, CommType::I32, 1, 9), "send 5");
      checks.ok(m_world.send(x, 3, CommType::I32, 1, 10), "send 3");
    } else if (rank() == 1) {
      checks.error(m_world.recv(x, 3, CommType::I32, 0, 9), "recv" + who + ": MPI_ERR_TRUNCATE");
      checks.error(m_world.recv(x, 5, CommType::I32, 0, 10), "received 3 elements from rank 0, expected 5");
    }
    MS_AGREE(checks);
  }

 private:
  int rank() const { return m_world.rank(); }
  int size() const { return m_world.size(); }

  MpiCommunicator& m_world;
};

// MPI must start before the tests and end after them, so no QTEST_APPLESS_MAIN. Ranks other than 0 run
// with -silent (their failures still print); the exit status is the worst rank's failure count, so every
// rank, and mpirun, agree.
int main(int argc, char** argv) {
  auto context = MpiContext::create(&argc, &argv);
  if (!context) {
    std::fprintf(stderr, "tst_comm: %s\n", context.message().c_str());
    return 1;
  }
  int failures = 0;
  {
    TestComm test((*context)->world());
    QStringList args;
    for (int i = 0; i < argc; ++i) args << QString::fromLocal8Bit(argv[i]);
    if ((*context)->world().rank() != 0 && args.size() == 1) args << "-silent";
    failures = QTest::qExec(&test, args);
  }
  int worst = 0;
  MPI_Allreduce(&failures, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return std::min(worst, 127);
}

#include "tst_comm.moc"
