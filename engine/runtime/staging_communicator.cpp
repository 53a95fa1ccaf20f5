// StagingCommunicator; see staging_communicator.h.
#include "runtime/staging_communicator.h"

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
                size_t uploadOffset, size_t uploadBytes)
      : m_backend(backend),
        m_host(std::move(host)),
        m_inner(std::move(inner)),
        m_dst(uploadTo),
        m_offset(uploadOffset),
        m_bytes(uploadBytes) {}
  ~StagedRequest() override { (void)wait(); }
  // The first wait (or ready() finding it done) gives the result; later waits return ok, as the
  // Communicator contract says.
  Status wait() override {
    if (m_done) return std::exchange(m_result, Status::ok());
    m_done = true;
    Status s = m_inner->wait();
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

Status StagingCommunicator::allReduce(const void* send, void* recv, size_t count, CommType type,
                                      ReduceOp op) {
  return guarded("allReduce", [&]() -> Status {
    const size_t bytes = count * commTypeSize(type);
    Bytes h(bytes);
    m_backend.download(h.data(), send, bytes);
    MS_TRY(m_host->allReduce(h.data(), h.data(), count, type, op));
    m_backend.upload(recv, h.data(), bytes);
    return Status::ok();
  });
}

Status StagingCommunicator::reduceScatter(const void* send, void* recv, size_t recvCount, CommType type,
                                          ReduceOp op) {
  return guarded("reduceScatter", [&]() -> Status {
    const size_t bytes = recvCount * commTypeSize(type);
    Bytes hs(bytes * size_t(size())), hr(bytes);
    m_backend.download(hs.data(), send, hs.size());
    MS_TRY(m_host->reduceScatter(hs.data(), hr.data(), recvCount, type, op));
    m_backend.upload(recv, hr.data(), bytes);
    return Status::ok();
  });
}

Status StagingCommunicator::allGather(const void* send, void* recv, size_t sendCount, CommType type) {
  return guarded("allGather", [&]() -> Status {
    const size_t bytes = sendCount * commTypeSize(type);
    Bytes hs(bytes), hr(bytes * size_t(size()));
    m_backend.download(hs.data(), send, bytes);
    MS_TRY(m_host->allGather(hs.data(), hr.data(), sendCount, type));
    m_backend.upload(recv, hr.data(), hr.size());
    return Status::ok();
  });
}

Status StagingCommunicator::broadcast(void* data, size_t count, CommType type, int root) {
  return guarded("broadcast", [&]() -> Status {
    const size_t bytes = count * commTypeSize(type);
    Bytes h(bytes);
    if (rank() == root) m_backend.download(h.data(), data, bytes);
    MS_TRY(m_host->broadcast(h.data(), count, type, root));
    if (rank() != root) m_backend.upload(data, h.data(), bytes);
    return Status::ok();
  });
}

Status StagingCommunicator::send(const void* data, size_t count, CommType type, int peer, int tag) {
  return guarded("send", [&]() -> Status {
    Bytes h(count * commTypeSize(type));
    m_backend.download(h.data(), data, h.size());
    return m_host->send(h.data(), count, type, peer, tag);
  });
}

Status StagingCommunicator::recv(void* data, size_t count, CommType type, int peer, int tag) {
  return guarded("recv", [&]() -> Status {
    Bytes h(count * commTypeSize(type));
    MS_TRY(m_host->recv(h.data(), count, type, peer, tag));
    m_backend.upload(data, h.data(), h.size());
    return Status::ok();
  });
}

Expected<CommRequestPtr> StagingCommunicator::iallReduce(const void* send, void* recv, size_t count,
                                                         CommType type, ReduceOp op) {
  try {
    const size_t bytes = count * commTypeSize(type);
    auto h = std::make_unique<Bytes>(bytes);
    m_backend.download(h->data(), send, bytes);
    auto r = m_host->iallReduce(h->data(), h->data(), count, type, op);
    if (!r) return r.status();
    return CommRequestPtr(new StagedRequest(m_backend, std::move(h), std::move(*r), recv, 0, bytes));
  } catch (const DeviceFailure& e) {
    return Status::error(std::string("iallReduce: staging through host memory: ") + e.what());
  }
}

Expected<CommRequestPtr> StagingCommunicator::ireduceScatter(const void* send, void* recv, size_t recvCount,
                                                             CommType type, ReduceOp op) {
  try {
    const size_t bytes = recvCount * commTypeSize(type);
    // One host buffer: the send blocks, then the received block after them.
    auto h = std::make_unique<Bytes>(bytes * (size_t(size()) + 1));
    m_backend.download(h->data(), send, bytes * size_t(size()));
    unsigned char* hr = h->data() + bytes * size_t(size());
    auto r = m_host->ireduceScatter(h->data(), hr, recvCount, type, op);
    if (!r) return r.status();
    return CommRequestPtr(
        new StagedRequest(m_backend, std::move(h), std::move(*r), recv, bytes * size_t(size()), bytes));
  } catch (const DeviceFailure& e) {
    return Status::error(std::string("ireduceScatter: staging through host memory: ") + e.what());
  }
}

Expected<CommRequestPtr> StagingCommunicator::iallGather(const void* send, void* recv, size_t sendCount,
                                                         CommType type) {
  try {
    const size_t bytes = sendCount * commTypeSize(type);
    // One host buffer: every rank's block; this rank's is sent in place.
    auto h = std::make_unique<Bytes>(bytes * size_t(size()));
    unsigned char* mine = h->data() + bytes * size_t(rank());
    m_backend.download(mine, send, bytes);
    auto r = m_host->iallGather(mine, h->data(), sendCount, type);
    if (!r) return r.status();
    const size_t total = h->size();
    return CommRequestPtr(new StagedRequest(m_backend, std::move(h), std::move(*r), recv, 0, total));
  } catch (const DeviceFailure& e) {
    return Status::error(std::string("iallGather: staging through host memory: ") + e.what());
  }
}

Expected<CommRequestPtr> StagingCommunicator::ibroadcast(void* data, size_t count, CommType type, int root) {
  try {
    const size_t bytes = count * commTypeSize(type);
    auto h = std::make_unique<Bytes>(bytes);
    const bool isRoot = rank() == root;
    if (isRoot) m_backend.download(h->data(), data, bytes);
    auto r = m_host->ibroadcast(h->data(), count, type, root);
    if (!r) return r.status();
    return CommRequestPtr(
        new StagedRequest(m_backend, std::move(h), std::move(*r), isRoot ? nullptr : data, 0, bytes));
  } catch (const DeviceFailure& e) {
    return Status::error(std::string("ibroadcast: staging through host memory: ") + e.what());
  }
}

Expected<CommRequestPtr> StagingCommunicator::isend(const void* data, size_t count, CommType type, int peer,
                                                    int tag) {
  try {
    auto h = std::make_unique<Bytes>(count * commTypeSize(type));
    m_backend.download(h->data(), data, h->size());
    auto r = m_host->isend(h->data(), count, type, peer, tag);
    if (!r) return r.status();
    return CommRequestPtr(new StagedRequest(m_backend, std::move(h), std::move(*r), nullptr, 0, 0));
  } catch (const DeviceFailure& e) {
    return Status::error(std::string("isend: staging through host memory: ") + e.what());
  }
}

Expected<CommRequestPtr> StagingCommunicator::irecv(void* data, size_t count, CommType type, int peer,
                                                    int tag) {
  try {
    auto h = std::make_unique<Bytes>(count * commTypeSize(type));
    auto r = m_host->irecv(h->data(), count, type, peer, tag);
    if (!r) return r.status();
    const size_t bytes = h->size();
    return CommRequestPtr(new StagedRequest(m_backend, std::move(h), std::move(*r), data, 0, bytes));
  } catch (const DeviceFailure& e) {
    return Status::error(std::string("irecv: staging through host memory: ") + e.what());
  }
}

Expected<std::unique_ptr<Communicator>> StagingCommunicator::split(int color, int key) {
  auto inner = m_host->split(color, key);
  if (!inner) return inner.status();
  if (!*inner) return std::unique_ptr<Communicator>();
  return std::unique_ptr<Communicator>(new StagingCommunicator(std::move(*inner), m_backend));
}

}  // namespace ms
