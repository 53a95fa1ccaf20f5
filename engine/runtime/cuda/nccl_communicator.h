// The NCCL communicator: the runtime's Communicator (communicator.h) over NCCL, for buffers in GPU memory.
// Built only with CUDA and NCCL (MESHSTUDIO_HAVE_NCCL). Every operation is enqueued on the communicator's own
// non-blocking CUDA stream, so gradient syncs and pipeline transfers overlap compute on other streams; a
// blocking call waits for its stream; a non-blocking call returns a request holding a CUDA event.
//
// Ordering with compute: given the compute stream (setComputeStream, normally the backend's
// ms::computeStream()), every operation first makes the communicator's stream wait for all the work enqueued
// on the compute stream so far (an event recorded there, cudaStreamWaitEvent here; the host does not block),
// so a collective reads gradients only after the kernels that wrote them. The other direction is the
// caller's: a buffer the communicator writes may be read by compute only after wait() (or the blocking
// call) has returned, and a buffer it uses must not be deallocated before then.
//
// What always holds: the ranks of an NcclCommunicator are those of the MPI communicator it was made from, in
// the same order (the unique id is made by rank 0 and handed out with MPI_Bcast); buffers are device pointers
// on the device given at creation; point-to-point messages between two ranks are matched in the order they
// were posted (NCCL has no tags: the tag is kept only for error messages); errors come back as Status values
// naming the operation, the communicator and the NCCL error, never as an abort. Every wait is bounded
// (comm_watchdog.h): it polls the stream or event and ncclCommGetAsyncError, and on an asynchronous error or
// the communication timeout aborts every NCCL communicator of this one (ncclCommAbort) and returns the
// error; later operations on it are refused.
//
// Point to point: NCCL runs the operations of one communicator one after the other, and a send or a receive
// does not finish before its peer's counterpart runs. On one communicator, a pipeline stage's isend of an
// activation followed by its receive of a gradient, against the next stage's isend of that gradient followed
// by its receive of the activation, would wait for each other for ever. So messages do not use the group's
// communicator: each direction between two ranks has its own two-rank NCCL communicator and stream (made the
// first time the two ranks exchange a message, in either direction: a handshake over MPI that blocks until
// the peer reaches its first message with this rank too), and a send waits only for earlier messages to the
// same peer, as with MPI.
//
// NCCL refuses two ranks on one GPU. ranksShareDevice() tells the engine so before it creates one; it then
// uses the MPI communicator with host staging and says so once (docs/architecture.md, "Communication").
//
// Not yet run on a GPU (the machines of the issue that wrote it had none): compiled, and its test
// (tests/tst_nccl.cpp, label gpu) skips without a device.
#pragma once

#include <mpi.h>

#include <map>
#include <memory>
#include <string>

#include "runtime/communicator.h"

struct CUstream_st;
struct CUevent_st;
struct ncclComm;

namespace ms {

// Collective over `comm`: true when two of its ranks on one host would use the same CUDA device.
Expected<bool> ranksShareDevice(MPI_Comm comm, int device);

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `comm` (not taken over: a duplicate is kept for barriers and splits). `device` is the
  // CUDA device of this rank; it becomes current on the calling thread.
  static Expected<std::unique_ptr<NcclCommunicator>> create(MPI_Comm comm, int device, std::string label);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  CUstream_st* stream() const { return m_stream; }
  int device() const { return m_device; }
  // The stream whose work every later operation waits for (on this communicator's device); nullptr stops
  // the waiting. Communicators made by split() inherit it.
  void setComputeStream(CUstream_st* computeStream) { m_compute = computeStream; }
  CUstream_st* computeStream() const { return m_compute; }

  const char* name() const override { return "nccl"; }
  const std::string& label() const override { return m_label; }
  int rank() const override { return m_rank; }
  int size() const override { return m_size; }

  Status allReduce(const void* send, void* recv, size_t count, CommType type, ReduceOp op) override;
  Status reduceScatter(const void* send, void* recv, size_t recvCount, CommType type, ReduceOp op) override;
  Status allGather(const void* send, void* recv, size_t sendCount, CommType type) override;
  Status broadcast(void* data, size_t count, CommType type, int root) override;
  Status send(const void* data, size_t count, CommType type, int peer, int tag) override;
  Status recv(void* data, size_t count, CommType type, int peer, int tag) override;
  Status barrier() override;
  Status allToAllV(const void* send, const size_t* sendCounts, const size_t* sendOffsets, void* recv,
                   const size_t* recvCounts, const size_t* recvOffsets, CommType type) override;

  Expected<CommRequestPtr> iallReduce(const void* send, void* recv, size_t count, CommType type,
                                      ReduceOp op) override;
  Expected<CommRequestPtr> ireduceScatter(const void* send, void* recv, size_t recvCount, CommType type,
                                          ReduceOp op) override;
  Expected<CommRequestPtr> iallGather(const void* send, void* recv, size_t sendCount, CommType type) override;
  Expected<CommRequestPtr> ibroadcast(void* data, size_t count, CommType type, int root) override;
  Expected<CommRequestPtr> isend(const void* data, size_t count, CommType type, int peer, int tag) override;
  Expected<CommRequestPtr> irecv(void* data, size_t count, CommType type, int peer, int tag) override;

  Expected<std::unique_ptr<Communicator>> split(int color, int key) override;

 private:
  // Point-to-point traffic with one peer: a two-rank NCCL communicator and a stream per direction, the
  // sender being NCCL rank 0 of each (see above).
  struct PeerLinks {
    ncclComm* out = nullptr;  // this rank -> peer
    ncclComm* in = nullptr;   // peer -> this rank
    CUstream_st* outStream = nullptr;
    CUstream_st* inStream = nullptr;
  };

  NcclCommunicator() = default;
  Status check(int ncclResult, const char* what) const;  // ncclResult_t as int: nccl.h stays in the .cpp
  std::string where(const char* what) const;  // "all-reduce on nccl communicator dp0 (rank 1 of 4)"
  // The asynchronous error of any of this communicator's NCCL communicators (ncclCommGetAsyncError).
  Status health() const;
  // ncclCommAbort on every one of them (ending their kernels in flight); later operations are refused.
  void abortAll();
  Status wait(const char* what) { return wait(m_stream, what); }
  Status wait(CUstream_st* stream, const char* what);  // the stream, synchronously
  Status afterCompute(const char* what) { return afterCompute(m_stream, what); }
  Status afterCompute(CUstream_st* stream, const char* what);  // stream waits for the compute stream's work
  Expected<CommRequestPtr> request(const char* what) { return request(m_stream, what); }
  Expected<CommRequestPtr> request(CUstream_st* stream, const char* what);  // an event recorded on stream
  // The links with peer, made on first use (collective with peer only).
  Expected<PeerLinks*> peerLinks(int peer, const char* what);
  // Enqueue one message on its link; *stream is the link's stream.
  Status enqueueSend(const void* data, size_t count, CommType type, int peer, CUstream_st** stream);
  Status enqueueRecv(void* data, size_t count, CommType type, int peer, CUstream_st** stream);
  // Enqueues a reduce-scatter, with communicator.h's in-place layout (result in the first block).
  Status enqueueReduceScatter(const void* send, void* recv, size_t recvCount, CommType type, ReduceOp op);
  std::string m_label;
  MPI_Comm m_mpi = MPI_COMM_NULL;
  ncclComm* m_comm = nullptr;
  CUstream_st* m_stream = nullptr;
  CUstream_st* m_compute = nullptr;     // not owned
  CUevent_st* m_computeDone = nullptr;  // recorded on m_compute before each operation
  std::map<int, PeerLinks> m_peers;     // by peer rank
  int m_device = 0;
  bool m_aborted = false;
  int m_rank = 0;
  int m_size = 1;
};

}  // namespace ms
