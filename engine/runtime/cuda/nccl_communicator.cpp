// NcclCommunicator; see nccl_communicator.h.
#include "runtime/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "runtime/comm_watchdog.h"

namespace ms {

namespace {

ncclDataType_t ncclType(CommType t) {
  switch (t) {
    case CommType::F32:
      return ncclFloat32;
    case CommType::F64:
      return ncclFloat64;
    case CommType::I32:
      return ncclInt32;
    case CommType::I64:
      return ncclInt64;
    case CommType::U8:
      return ncclUint8;
    case CommType::BF16:
      return ncclBfloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  return ncclSum;
}

std::string cudaText(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

// A pending operation: an event recorded on the communicator's stream after it was enqueued.
// The wait of an operation on a stream or behind an event, bounded (comm_watchdog.h): polls the CUDA query
// and the communicator's asynchronous errors; aborts the communicator on an error or the timeout.
template <typename Query>
Status boundedWait(const std::string& what, Query query, const std::function<Status()>& health,
                   const std::function<void()>& abort) {
  return waitBounded(
      what,
      [&]() -> Expected<bool> {
        const cudaError_t e = query();
        if (e == cudaSuccess) return true;
        if (e != cudaErrorNotReady) return Status::error(cudaText(e));
        MS_TRY(health());
        return false;
      },
      abort);
}

class NcclRequest final : public CommRequest {
 public:
  NcclRequest(cudaEvent_t event, std::string what, std::function<Status()> health,
              std::function<void()> abort)
      : m_event(event), m_what(std::move(what)), m_health(std::move(health)), m_abort(std::move(abort)) {}
  ~NcclRequest() override { (void)wait(); }
  Status wait() override {
    if (!m_event) return Status::ok();
    const Status s = boundedWait(
        m_what, [this] { return cudaEventQuery(m_event); }, m_health, m_abort);
    cudaEventDestroy(m_event);
    m_event = nullptr;
    return s;
  }
  // Done (or failed: wait() then says how) once the event is no longer pending.
  bool ready() override { return !m_event || cudaEventQuery(m_event) != cudaErrorNotReady; }

 private:
  cudaEvent_t m_event = nullptr;
  std::string m_what;
  std::function<Status()> m_health;
  std::function<void()> m_abort;
};

}  // namespace

Expected<bool> ranksShareDevice(MPI_Comm comm, int device) {
  // Each rank's host name and device PCI bus id; two equal pairs share a GPU.
  constexpr int kLen = 256;
  char mine[kLen] = {};
  char host[128] = {};
  gethostname(host, sizeof host - 1);
  char bus[64] = "unknown";
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess) {
    cudaGetLastError();
    std::snprintf(bus, sizeof bus, "device-%d", device);
  }
  std::snprintf(mine, kLen, "%s/%s", host, bus);
  int size = 1;
  MPI_Comm_size(comm, &size);
  std::vector<char> all(static_cast<size_t>(kLen) * size);
  if (MPI_Allgather(mine, kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, comm) != MPI_SUCCESS)
    return Status::error("checking which ranks share a GPU: MPI_Allgather failed");
  std::vector<std::string> ids;
  for (int r = 0; r < size; ++r) ids.emplace_back(&all[static_cast<size_t>(r) * kLen]);
  std::sort(ids.begin(), ids.end());
  return std::adjacent_find(ids.begin(), ids.end()) != ids.end();
}

Expected<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create(MPI_Comm comm, int device,
                                                                     std::string label) {
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator());
  c->m_label = std::move(label);
  c->m_device = device;
  if (MPI_Comm_dup(comm, &c->m_mpi) != MPI_SUCCESS)
    return Status::error("nccl communicator " + c->m_label + ": MPI_Comm_dup failed");
  MPI_Comm_rank(c->m_mpi, &c->m_rank);
  MPI_Comm_size(c->m_mpi, &c->m_size);
  const std::string where = "nccl communicator " + c->m_label + " (rank " + std::to_string(c->m_rank) + ")";
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
    return Status::error(where + ": cudaSetDevice(" + std::to_string(device) + "): " + cudaText(e));
  if (const cudaError_t e = cudaStreamCreateWithFlags(&c->m_stream, cudaStreamNonBlocking); e != cudaSuccess)
    return Status::error(where + ": creating its stream: " + cudaText(e));
  if (const cudaError_t e = cudaEventCreateWithFlags(&c->m_computeDone, cudaEventDisableTiming);
      e != cudaSuccess)
    return Status::error(where + ": creating its event: " + cudaText(e));
  // Every rank learns the outcome of rank 0's ncclGetUniqueId, so no rank waits in ncclCommInitRank alone.
  ncclUniqueId id{};
  int made = 1;
  if (c->m_rank == 0) made = ncclGetUniqueId(&id) == ncclSuccess ? 1 : 0;
  if (MPI_Bcast(&made, 1, MPI_INT, 0, c->m_mpi) != MPI_SUCCESS || !made)
    return Status::error(where + ": rank 0 could not make an NCCL unique id");
  if (MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, c->m_mpi) != MPI_SUCCESS)
    return Status::error(where + ": MPI_Bcast of the NCCL unique id failed");
  MS_TRY(c->check(ncclCommInitRank(&c->m_comm, c->m_size, id, c->m_rank), "ncclCommInitRank"));
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  // Aborted communicators (abortAll) are gone already; their streams end once NCCL has ended their kernels.
  for (auto& [peer, links] : m_peers) {
    for (CUstream_st* stream : {links.outStream, links.inStream})
      if (stream) cudaStreamSynchronize(stream);
    for (ncclComm* comm : {links.out, links.in})
      if (comm) ncclCommDestroy(comm);
    for (CUstream_st* stream : {links.outStream, links.inStream})
      if (stream) cudaStreamDestroy(stream);
  }
  if (m_stream) cudaStreamSynchronize(m_stream);
  if (m_comm) ncclCommDestroy(m_comm);
  if (m_computeDone) cudaEventDestroy(m_computeDone);
  if (m_stream) cudaStreamDestroy(m_stream);
  if (m_mpi != MPI_COMM_NULL && !communicationAbandoned()) MPI_Comm_free(&m_mpi);
}

Status NcclCommunicator::health() const {
  auto asyncError = [&](ncclComm* comm, const std::string& which) -> Status {
    if (!comm) return Status::ok();
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &async);
    if (r != ncclSuccess)
      return Status::error("ncclCommGetAsyncError" + which + ": " + ncclGetErrorString(r));
    if (async == ncclSuccess || async == ncclInProgress) return Status::ok();
    std::string text = "asynchronous error" + which + ": " + ncclGetErrorString(async);
    if (const char* last = ncclGetLastError(comm); last && *last) text += std::string(" (") + last + ")";
    return Status::error(text);
  };
  MS_TRY(asyncError(m_comm, ""));
  for (const auto& [peer, links] : m_peers) {
    MS_TRY(asyncError(links.out, " (link to rank " + std::to_string(peer) + ")"));
    MS_TRY(asyncError(links.in, " (link from rank " + std::to_string(peer) + ")"));
  }
  return Status::ok();
}

void NcclCommunicator::abortAll() {
  // ncclCommAbort ends the communicator's kernels in flight, so the streams waiting on them finish.
  for (auto& [peer, links] : m_peers)
    for (ncclComm** comm : {&links.out, &links.in})
      if (*comm) {
        ncclCommAbort(*comm);
        *comm = nullptr;
      }
  if (m_comm) {
    ncclCommAbort(m_comm);
    m_comm = nullptr;
  }
  m_aborted = true;
}

Status NcclCommunicator::check(int result, const char* what) const {
  if (result == ncclSuccess) return Status::ok();
  const auto r = static_cast<ncclResult_t>(result);
  std::string text = std::string(what) + " on nccl communicator " + m_label + " (rank " +
                     std::to_string(m_rank) + " of " + std::to_string(m_size) + "): " + ncclGetErrorString(r);
  if (m_comm) {
    if (const char* last = ncclGetLastError(m_comm); last && *last) text += std::string(" (") + last + ")";
  }
  return Status::error(text);
}

std::string NcclCommunicator::where(const char* what) const {
  return std::string(what) + " on nccl communicator " + m_label + " (rank " + std::to_string(m_rank) +
         " of " + std::to_string(m_size) + ")";
}

Status NcclCommunicator::wait(cudaStream_t stream, const char* what) {
  return boundedWait(
      where(what), [stream] { return cudaStreamQuery(stream); }, [this] { return health(); },
      [this] { abortAll(); });
}

Status NcclCommunicator::afterCompute(cudaStream_t stream, const char* what) {
  if (m_aborted)
    return Status::error(where(what) + ": the communicator was aborted after an earlier failure");
  if (!m_compute) return Status::ok();
  // cudaStreamWaitEvent waits for the event's most recent record at the time of the call, so one event
  // serves every operation: re-recording it later does not move an earlier wait.
  if (const cudaError_t e = cudaEventRecord(m_computeDone, m_compute); e != cudaSuccess)
    return Status::error(std::string(what) + " on nccl communicator " + m_label +
                         ": recording an event on the compute stream: " + cudaText(e));
  if (const cudaError_t e = cudaStreamWaitEvent(stream, m_computeDone, 0); e != cudaSuccess)
    return Status::error(std::string(what) + " on nccl communicator " + m_label +
                         ": waiting for the compute stream: " + cudaText(e));
  return Status::ok();
}

Expected<CommRequestPtr> NcclCommunicator::request(cudaStream_t stream, const char* what) {
  cudaEvent_t event = nullptr;
  if (const cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming); e != cudaSuccess)
    return Status::error(std::string(what) + ": creating an event: " + cudaText(e));
  if (const cudaError_t e = cudaEventRecord(event, stream); e != cudaSuccess) {
    cudaEventDestroy(event);
    return Status::error(std::string(what) + ": recording an event: " + cudaText(e));
  }
  return CommRequestPtr(new NcclRequest(
      event, where(what), [this] { return health(); }, [this] { abortAll(); }));
}

Expected<CommRequestPtr> NcclCommunicator::iallReduce(const void* send, void* recv, size_t count,
                                                      CommType type, ReduceOp op) {
  MS_TRY(afterCompute("all-reduce"));
  MS_TRY(check(ncclAllReduce(send, recv, count, ncclType(type), ncclOp(op), m_comm, m_stream), "all-reduce"));
  return request("all-reduce");
}

Status NcclCommunicator::enqueueReduceScatter(const void* send, void* recv, size_t recvCount, CommType type,
                                              ReduceOp op) {
  MS_TRY(afterCompute("reduce-scatter"));
  if (send != recv)
    return check(ncclReduceScatter(send, recv, recvCount, ncclType(type), ncclOp(op), m_comm, m_stream),
                 "reduce-scatter");
  // In place. NCCL's in-place form writes this rank's result over its own block (recv == send + rank *
  // recvCount; any other overlap is a race); communicator.h wants it in the first block.
  const size_t bytes = recvCount * commTypeSize(type);
  char* own = static_cast<char*>(recv) + size_t(m_rank) * bytes;
  MS_TRY(check(ncclReduceScatter(send, own, recvCount, ncclType(type), ncclOp(op), m_comm, m_stream),
               "reduce-scatter"));
  if (m_rank == 0 || bytes == 0) return Status::ok();
  if (const cudaError_t e = cudaMemcpyAsync(recv, own, bytes, cudaMemcpyDeviceToDevice, m_stream);
      e != cudaSuccess)
    return Status::error("reduce-scatter on nccl communicator " + m_label +
                         ": moving the result: " + cudaText(e));
  return Status::ok();
}

Expected<CommRequestPtr> NcclCommunicator::ireduceScatter(const void* send, void* recv, size_t recvCount,
                                                          CommType type, ReduceOp op) {
  MS_TRY(enqueueReduceScatter(send, recv, recvCount, type, op));
  return request("reduce-scatter");
}

Expected<CommRequestPtr> NcclCommunicator::iallGather(const void* send, void* recv, size_t sendCount,
                                                      CommType type) {
  MS_TRY(afterCompute("all-gather"));
  MS_TRY(check(ncclAllGather(send, recv, sendCount, ncclType(type), m_comm, m_stream), "all-gather"));
  return request("all-gather");
}

Expected<CommRequestPtr> NcclCommunicator::ibroadcast(void* data, size_t count, CommType type, int root) {
  MS_TRY(afterCompute("broadcast"));
  MS_TRY(check(ncclBroadcast(data, data, count, ncclType(type), root, m_comm, m_stream), "broadcast"));
  return request("broadcast");
}

Expected<NcclCommunicator::PeerLinks*> NcclCommunicator::peerLinks(int peer, const char* what) {
  if (auto it = m_peers.find(peer); it != m_peers.end()) return &it->second;
  const std::string where = std::string(what) + " on nccl communicator " + m_label + " (rank " +
                            std::to_string(m_rank) + ", peer " + std::to_string(peer) + ")";
  if (peer < 0 || peer >= m_size || peer == m_rank)
    return Status::error(where + ": no such peer (messages to the rank itself are not supported)");
  // The lower rank makes both unique ids (lower -> higher, then higher -> lower) and sends them; both ranks
  // then initialise the two communicators in that order, the sender of each as its rank 0.
  constexpr int kLinkTag = 7101;
  struct {
    int ok = 0;
    ncclUniqueId ids[2];
  } hello{};
  const bool lower = m_rank < peer;
  if (lower) {
    hello.ok = ncclGetUniqueId(&hello.ids[0]) == ncclSuccess && ncclGetUniqueId(&hello.ids[1]) == ncclSuccess;
    if (MPI_Send(&hello, sizeof hello, MPI_BYTE, peer, kLinkTag, m_mpi) != MPI_SUCCESS)
      return Status::error(where + ": MPI_Send of the NCCL unique ids failed");
  } else if (MPI_Recv(&hello, sizeof hello, MPI_BYTE, peer, kLinkTag, m_mpi, MPI_STATUS_IGNORE) !=
             MPI_SUCCESS) {
    return Status::error(where + ": MPI_Recv of the NCCL unique ids failed");
  }
  if (!hello.ok) return Status::error(where + ": the lower rank could not make NCCL unique ids");
  if (const cudaError_t e = cudaSetDevice(m_device); e != cudaSuccess)
    return Status::error(where + ": cudaSetDevice: " + cudaText(e));
  PeerLinks& links = m_peers[peer];  // filled as far as it gets; the destructor frees what was made
  ncclComm* up = nullptr;            // lower -> higher
  ncclComm* down = nullptr;          // higher -> lower
  MS_TRY(check(ncclCommInitRank(&up, 2, hello.ids[0], lower ? 0 : 1), "ncclCommInitRank (point to point)"));
  (lower ? links.out : links.in) = up;
  MS_TRY(check(ncclCommInitRank(&down, 2, hello.ids[1], lower ? 1 : 0), "ncclCommInitRank (point to point)"));
  (lower ? links.in : links.out) = down;
  for (CUstream_st** stream : {&links.outStream, &links.inStream})
    if (const cudaError_t e = cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking); e != cudaSuccess)
      return Status::error(where + ": creating a stream: " + cudaText(e));
  return &links;
}

Status NcclCommunicator::enqueueSend(const void* data, size_t count, CommType type, int peer,
                                     cudaStream_t* stream) {
  Expected<PeerLinks*> links = peerLinks(peer, "send");
  if (!links) return links.status();
  if (!(*links)->out || !(*links)->outStream)
    return Status::error("send on nccl communicator " + m_label + ": the link to rank " +
                         std::to_string(peer) + " failed earlier");
  *stream = (*links)->outStream;
  MS_TRY(afterCompute(*stream, "send"));
  return check(ncclSend(data, count, ncclType(type), 1, (*links)->out, *stream), "send");
}

Status NcclCommunicator::enqueueRecv(void* data, size_t count, CommType type, int peer,
                                     cudaStream_t* stream) {
  Expected<PeerLinks*> links = peerLinks(peer, "receive");
  if (!links) return links.status();
  if (!(*links)->in || !(*links)->inStream)
    return Status::error("receive on nccl communicator " + m_label + ": the link from rank " +
                         std::to_string(peer) + " failed earlier");
  *stream = (*links)->inStream;
  MS_TRY(afterCompute(*stream, "receive"));
  return check(ncclRecv(data, count, ncclType(type), 0, (*links)->in, *stream), "receive");
}

Expected<CommRequestPtr> NcclCommunicator::isend(const void* data, size_t count, CommType type, int peer,
                                                 int tag) {
  cudaStream_t stream = nullptr;
  MS_TRY(enqueueSend(data, count, type, peer, &stream));
  return request(stream, ("send (tag " + std::to_string(tag) + ")").c_str());
}

Expected<CommRequestPtr> NcclCommunicator::irecv(void* data, size_t count, CommType type, int peer, int tag) {
  cudaStream_t stream = nullptr;
  MS_TRY(enqueueRecv(data, count, type, peer, &stream));
  return request(stream, ("receive (tag " + std::to_string(tag) + ")").c_str());
}

Status NcclCommunicator::allReduce(const void* send, void* recv, size_t count, CommType type, ReduceOp op) {
  MS_TRY(afterCompute("all-reduce"));
  MS_TRY(check(ncclAllReduce(send, recv, count, ncclType(type), ncclOp(op), m_comm, m_stream), "all-reduce"));
  return wait("all-reduce");
}

Status NcclCommunicator::reduceScatter(const void* send, void* recv, size_t recvCount, CommType type,
                                       ReduceOp op) {
  MS_TRY(enqueueReduceScatter(send, recv, recvCount, type, op));
  return wait("reduce-scatter");
}

Status NcclCommunicator::allGather(const void* send, void* recv, size_t sendCount, CommType type) {
  MS_TRY(afterCompute("all-gather"));
  MS_TRY(check(ncclAllGather(send, recv, sendCount, ncclType(type), m_comm, m_stream), "all-gather"));
  return wait("all-gather");
}

Status NcclCommunicator::broadcast(void* data, size_t count, CommType type, int root) {
  MS_TRY(afterCompute("broadcast"));
  MS_TRY(check(ncclBroadcast(data, data, count, ncclType(type), root, m_comm, m_stream), "broadcast"));
  return wait("broadcast");
}

Status NcclCommunicator::send(const void* data, size_t count, CommType type, int peer, int tag) {
  cudaStream_t stream = nullptr;
  MS_TRY(enqueueSend(data, count, type, peer, &stream));
  return wait(stream, ("send (tag " + std::to_string(tag) + ")").c_str());
}

Status NcclCommunicator::recv(void* data, size_t count, CommType type, int peer, int tag) {
  cudaStream_t stream = nullptr;
  MS_TRY(enqueueRecv(data, count, type, peer, &stream));
  return wait(stream, ("receive (tag " + std::to_string(tag) + ")").c_str());
}

Status NcclCommunicator::allToAllV(const void* send, const size_t* sendCounts, const size_t* sendOffsets,
                                   void* recv, const size_t* recvCounts, const size_t* recvOffsets,
                                   CommType type) {
  MS_TRY(afterCompute("all-to-all"));
  const size_t es = commTypeSize(type);
  const ncclDataType_t t = ncclType(type);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  // The block to this rank itself is a copy on the same stream, so it is ordered like the messages.
  if (const size_t bytes = sendCounts[m_rank] * es; bytes > 0)
    if (const cudaError_t e = cudaMemcpyAsync(out + recvOffsets[m_rank] * es, in + sendOffsets[m_rank] * es,
                                              bytes, cudaMemcpyDeviceToDevice, m_stream);
        e != cudaSuccess)
      return Status::error(where("all-to-all") + ": copying the block to this rank: " + cudaText(e));
  // One group on the collective communicator: NCCL runs its sends and receives together, so no pair waits for
  // another (unlike messages posted one by one, see the header), and the whole exchange is ordered with the
  // other collectives. Empty blocks post nothing, on both sides alike (the counts match pairwise).
  MS_TRY(check(ncclGroupStart(), "all-to-all (ncclGroupStart)"));
  Status posted = Status::ok();
  for (int r = 0; r < m_size && posted; ++r) {
    if (r == m_rank) continue;
    if (sendCounts[r] > 0)
      posted = check(ncclSend(in + sendOffsets[r] * es, sendCounts[r], t, r, m_comm, m_stream),
                     "all-to-all (send)");
    if (posted && recvCounts[r] > 0)
      posted = check(ncclRecv(out + recvOffsets[r] * es, recvCounts[r], t, r, m_comm, m_stream),
                     "all-to-all (receive)");
  }
  // The group is closed even after a failed post: an open group would swallow the next operation.
  const Status ended = check(ncclGroupEnd(), "all-to-all (ncclGroupEnd)");
  MS_TRY(posted);
  MS_TRY(ended);
  return wait("all-to-all");
}

Status NcclCommunicator::barrier() {
  MS_TRY(wait("barrier"));
  if (MPI_Barrier(m_mpi) != MPI_SUCCESS) return Status::error("barrier on nccl communicator " + m_label);
  return Status::ok();
}

Expected<std::unique_ptr<Communicator>> NcclCommunicator::split(int color, int key) {
  MPI_Comm part = MPI_COMM_NULL;
  // A negative color joins no group (communicator.h); MPI takes only MPI_UNDEFINED for that.
  if (MPI_Comm_split(m_mpi, color < 0 ? MPI_UNDEFINED : color, key, &part) != MPI_SUCCESS)
    return Status::error("split of nccl communicator " + m_label + ": MPI_Comm_split failed");
  if (part == MPI_COMM_NULL) return std::unique_ptr<Communicator>();
  auto made = create(part, m_device, m_label + "/" + std::to_string(color));
  MPI_Comm_free(&part);  // create() keeps its own duplicate
  if (!made) return made.status();
  (*made)->setComputeStream(m_compute);
  return std::unique_ptr<Communicator>(std::move(*made));
}

}  // namespace ms
