// StagingCommunicator; see staging_communicator.h.
#include "runtime/staging_communicator.h"

#include "runtime/comm_watchdog.h"

#include <string>
#include <utility>
#include <vector>

namespace ms {
namespace {

// Host copy of a message: a byte vector sized for the op.
using Bytes = std::vector<unsigned char>;

// A pending staged operation: the host operation's request, the host buffer it works on, and where (if
// anywhere) the result goes when it is done.
class StagedRequest final : public CommRequest {
 public:
  StagedRequest(Backend& backend, std::unique_ptr<Bytes> host, CommRequestPtr inner, void* uploadTo,
                size_t uploadOffset, size_t uploadBytes, std::string where)
      : m_backend(backend),
        m_host(std::move(host)),
        m_inner(std::move(inner)),
        m_dst(uploadTo),
        m_offset(uploadOffset),
        m_bytes(uploadBytes),
        m_where(std::move(where)) {}
  ~StagedRequest() override {
    if (!m_done && communicationAbandoned()) {
      // Another wait was abandoned: this one may never end either. Let it go (the process is ending).
      (void)m_inner.release();
      (void)m_host.release();
      return;
    }
    (void)wait();
  }
  // The first wait (or ready() finding it done) gives the result; later waits return ok, as the
  // Communicator contract says. The wait is bounded (comm_watchdog.h): abandoned, the host request and its
  // buffer are let go unfinished (MPI may still write into the buffer; the process ends with MPI_Abort).
  Status wait() override {
    if (m_done) return std::exchange(m_result, Status::ok());
    m_done = true;
    Status s = waitBounded(
        m_where, [this]() -> Expected<bool> { return m_inner->ready(); }, nullptr);
    if (!s) {
      (void)m_inner.release();
      (void)m_host.release();
      return s;
    }
    s = m_inner->wait();
    if (s && m_dst) s = upload();
    return s;
  }
  bool ready() override {
    if (m_done) return true;
    if (!m_inner->ready()) return false;
    m_result = wait();
    return true;
  }

 private:
  Status upload() {
    try {
      m_backend.upload(m_dst, m_host->data() + m_offset, m_bytes);
    } catch (const DeviceFailure& e) {
      return Status::error(std::string("uploading a received message: ") + e.what());
    }
    return Status::ok();
  }
  Backend& m_backend;
  std::unique_ptr<Bytes> m_host;
  CommRequestPtr m_inner;
  void* m_dst;
  size_t m_offset, m_bytes;
  std::string m_where;
  bool m_done = false;
  Status m_result = Status::ok();
};

// Runs f, turning a DeviceFailure of the staging copies into a Status.
template <typename F>
auto guarded(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const DeviceFailure& e) {
    return Status::error(std::string(what) + ": staging through host memory: " + e.what());
  }
}

}  // namespace

StagingCommunicator::StagingCommunicator(Communicator& host, Backend& backend)
    : m_host(&host), m_backend(backend), m_name(std::string(host.name()) + "+staging") {}

StagingCommunicator::StagingCommunicator(std::unique_ptr<Communicator> host, Backend& backend)
    : m_owned(std::move(host)),
      m_host(m_owned.get()),
      m_backend(backend),
      m_name(std::string(m_host->name()) + "+staging") {}

// The blocking operations are the non-blocking ones waited for: one staging path, and every wait bounded.
Status StagingCommunicator::allReduce(const void* send, void* recv, size_t count, CommType type,
                                      ReduceOp op) {
  auto r = iallReduce(send, recv, count, type, op);
  return r ? (*r)->wait() : r.status();
}

Status StagingCommunicator::reduceScatter(const void* send, void* recv, size_t recvCount, CommType type,
                                          ReduceOp op) {
  auto r = ireduceScatter(send, recv, recvCount, type, op);
  return r ? (*r)->wait() : r.status();
}

Status StagingCommunicator::allGather(const void* send, void* recv, size_t sendCount, CommType type) {
  auto r = iallGather(send, recv, sendCount, type);
  return r ? (*r)->wait() : r.status();
}

Status StagingCommunicator::broadcast(void* data, size_t count, CommType type, int root) {
  auto r = ibroadcast(data, count, type, root);
  return r ? (*r)->wait() : r.status();
}

Status StagingCommunicator::send(const void* data, size_t count, CommType type, int peer, int tag) {
  auto r = isend(data, count, type, peer, tag);
  return r ? (*r)->wait() : r.status();
}

Status StagingCommunicator::recv(void* data, size_t count, CommType type, int peer, int tag) {
  auto r = irecv(data, count, type, peer, tag);
  return r ? (*r)->wait() : r.status();
}

std::string StagingCommunicator::where(const char* op) const {
  return std::string(op) + " on " + m_name + " communicator " + label() + " (rank " + std::to_string(rank()) +
         " of " + std::to_string(size()) + ")";
}

// An operation about to start: the injected fault of the tests, reported as NCCL's asynchronous errors are
// (comm_watchdog.h).
Status StagingCommunicator::starting(const char* op) {
  Status fault = injectedCommFault();
  if (fault) return fault;
  return waitBounded(
      where(op), [&]() -> Expected<bool> { return fault; }, nullptr);
}

Expected<CommRequestPtr> StagingCommunicator::iallReduce(const void* send, void* recv, size_t count,
                                                         CommType type, ReduceOp op) {
  MS_TRY(starting("all-reduce"));
  try {
    const size_t bytes = count * commTypeSize(type);
    auto h = std::make_unique<Bytes>(bytes);
    m_backend.download(h->data(), send, bytes);
    auto r = m_host->iallReduce(h->data(), h->data(), count, type, op);
    if (!r) return r.status();
    return CommRequestPtr(
        new StagedRequest(m_backend, std::move(h), std::move(*r), recv, 0, bytes, where("all-reduce")));
  } catch (const DeviceFailure& e) {
    return Status::error(std::string("iallReduce: staging through host memory: ") + e.what());
  }
}

Expected<CommRequestPtr> StagingCommunicator::ireduceScatter(const void* send, void* recv, size_t recvCount,
                                                             CommType type, ReduceOp op) {
  MS_TRY(starting("reduce-scatter"));
  try {
    const size_t bytes = recvCount * commTypeSize(type);
    // One host buffer: the send blocks, then the received block after them.
    auto h = std::make_unique<Bytes>(bytes * (size_t(size()) + 1));
    m_backend.download(h->data(), send, bytes * size_t(size()));
    unsigned char* hr = h->data() + bytes * size_t(size());
    auto r = m_host->ireduceScatter(h->data(), hr, recvCount, type, op);
    if (!r) return r.status();
    return CommRequestPtr(new StagedRequest(m_backend, std::move(h), std::move(*r), recv,
                                            bytes * size_t(size()), bytes, where("reduce-scatter")));
  } catch (const DeviceFailure& e) {
    return Status::error(std::string("ireduceScatter: staging through host memory: ") + e.what());
  }
}

Expected<CommRequestPtr> StagingCommunicator::iallGather(const void* send, void* recv, size_t sendCount,
                                                         CommType type) {
  MS_TRY(starting("all-gather"));
  try {
    const size_t bytes = sendCount * commTypeSize(type);
    // One host buffer: every rank's block; this rank's is sent in place.
    auto h = std::make_unique<Bytes>(bytes * size_t(size()));
    unsigned char* mine = h->data() + bytes * size_t(rank());
    m_backend.download(mine, send, bytes);
    auto r = m_host->iallGather(mine, h->data(), sendCount, type);
    if (!r) return r.status();
    const size_t total = h->size();
    return CommRequestPtr(
        new StagedRequest(m_backend, std::move(h), std::move(*r), recv, 0, total, where("all-gather")));
  } catch (const DeviceFailure& e) {
    return Status::error(std::string("iallGather: staging through host memory: ") + e.what());
  }
}

Expected<CommRequestPtr> StagingCommunicator::ibroadcast(void* data, size_t count, CommType type, int root) {
  MS_TRY(starting("broadcast"));
  try {
    const size_t bytes = count * commTypeSize(type);
    auto h = std::make_unique<Bytes>(bytes);
    const bool isRoot = rank() == root;
    if (isRoot) m_backend.download(h->data(), data, bytes);
    auto r = m_host->ibroadcast(h->data(), count, type, root);
    if (!r) return r.status();
    return CommRequestPtr(new StagedRequest(m_backend, std::move(h), std::move(*r), isRoot ? nullptr : data,
                                            0, bytes, where("broadcast")));
  } catch (const DeviceFailure& e) {
    return Status::error(std::string("ibroadcast: staging through host memory: ") + e.what());
  }
}

Expected<CommRequestPtr> StagingCommunicator::isend(const void* data, size_t count, CommType type, int peer,
                                                    int tag) {
  MS_TRY(starting("send"));
  try {
    auto h = std::make_unique<Bytes>(count * commTypeSize(type));
    m_backend.download(h->data(), data, h->size());
    auto r = m_host->isend(h->data(), count, type, peer, tag);
    if (!r) return r.status();
    return CommRequestPtr(
        new StagedRequest(m_backend, std::move(h), std::move(*r), nullptr, 0, 0, where("send")));
  } catch (const DeviceFailure& e) {
    return Status::error(std::string("isend: staging through host memory: ") + e.what());
  }
}

Expected<CommRequestPtr> StagingCommunicator::irecv(void* data, size_t count, CommType type, int peer,
                                                    int tag) {
  MS_TRY(starting("receive"));
  try {
    auto h = std::make_unique<Bytes>(count * commTypeSize(type));
    auto r = m_host->irecv(h->data(), count, type, peer, tag);
    if (!r) return r.status();
    const size_t bytes = h->size();
    return CommRequestPtr(
        new StagedRequest(m_backend, std::move(h), std::move(*r), data, 0, bytes, where("receive")));
  } catch (const DeviceFailure& e) {
    return Status::error(std::string("irecv: staging through host memory: ") + e.what());
  }
}

// The host has allToAllV only in blocking form, which no watchdog could bound; so each block travels as its
// own non-blocking host message, all of them waited for together under one bound, as one operation (one
// starting(), one injected-fault count).
Status StagingCommunicator::allToAllV(const void* send, const size_t* sendCounts, const size_t* sendOffsets,
                                      void* recv, const size_t* recvCounts, const size_t* recvOffsets,
                                      CommType type) {
  MS_TRY(starting("all-to-all"));
  const std::string what = where("all-to-all");
  if (!m_allToAllHost) {
    auto made = m_host->split(0, rank());
    if (!made) return Status::error(what + ": making its host group: " + made.message());
    m_allToAllHost = std::move(*made);
  }
  const size_t es = commTypeSize(type);
  const int me = rank(), n = size();
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);

  // Host copies of the blocks to and from the other ranks, packed in rank order; the block to this rank
  // itself is copied on the device and never leaves it.
  std::vector<size_t> sendAt(n, 0), recvAt(n, 0);
  size_t sendTotal = 0, recvTotal = 0;
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    sendAt[r] = sendTotal;
    sendTotal += sendCounts[r];
    recvAt[r] = recvTotal;
    recvTotal += recvCounts[r];
  }
  auto hostSend = std::make_unique<Bytes>(sendTotal * es);
  auto hostRecv = std::make_unique<Bytes>(recvTotal * es);
  MS_TRY(guarded(what.c_str(), [&]() -> Status {
    for (int r = 0; r < n; ++r)
      if (r != me && sendCounts[r] > 0)
        m_backend.download(hostSend->data() + sendAt[r] * es, in + sendOffsets[r] * es, sendCounts[r] * es);
    if (sendCounts[me] > 0)
      m_backend.copy(out + recvOffsets[me] * es, in + sendOffsets[me] * es, sendCounts[me] * es);
    return Status::ok();
  }));

  // Receives first, then sends; empty blocks post nothing, on both sides alike. A post that fails stops the
  // posting, but what was posted is still waited for (bounded) before the error returns: a request destroyed
  // unfinished would wait without a bound.
  std::vector<CommRequestPtr> pending;
  Status posted = Status::ok();
  for (int r = 0; r < n && posted; ++r) {
    if (r == me || recvCounts[r] == 0) continue;
    auto q = m_allToAllHost->irecv(hostRecv->data() + recvAt[r] * es, recvCounts[r], type, r, 0);
    if (!q) {
      posted = q.status();
      break;
    }
    pending.push_back(std::move(*q));
  }
  for (int r = 0; r < n && posted; ++r) {
    if (r == me || sendCounts[r] == 0) continue;
    auto q = m_allToAllHost->isend(hostSend->data() + sendAt[r] * es, sendCounts[r], type, r, 0);
    if (!q) {
      posted = q.status();
      break;
    }
    pending.push_back(std::move(*q));
  }
  const Status waited = waitBounded(
      what,
      [&]() -> Expected<bool> {
        for (const CommRequestPtr& q : pending)
          if (!q->ready()) return false;
        return true;
      },
      nullptr);
  if (!waited) {
    // Abandoned (the process ends with MPI_Abort): MPI may still write into the host buffers, so they and
    // the requests are let go unfinished.
    for (CommRequestPtr& q : pending) (void)q.release();
    (void)hostSend.release();
    (void)hostRecv.release();
    return waited;
  }
  if (!posted) return Status::error(what + ": " + posted.message());
  for (CommRequestPtr& q : pending)
    if (Status s = q->wait(); !s) return Status::error(what + ": " + s.message());

  return guarded(what.c_str(), [&]() -> Status {
    for (int r = 0; r < n; ++r)
      if (r != me && recvCounts[r] > 0)
        m_backend.upload(out + recvOffsets[r] * es, hostRecv->data() + recvAt[r] * es, recvCounts[r] * es);
    return Status::ok();
  });
}

Expected<std::unique_ptr<Communicator>> StagingCommunicator::split(int color, int key) {
  auto inner = m_host->split(color, key);
  if (!inner) return inner.status();
  if (!*inner) return std::unique_ptr<Communicator>();
  return std::unique_ptr<Communicator>(new StagingCommunicator(std::move(*inner), m_backend));
}

}  // namespace ms
