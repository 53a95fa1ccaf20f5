// The MPI backend of Communicator (communicator.h): host memory, works everywhere, the CPU backend and the
// fallback when ranks share a GPU. What must always hold: every MPI communicator we own has
// MPI_ERRORS_RETURN set, so MPI errors come back as Status values, never as an abort; MpiContext is the only
// owner of MPI_Init_thread / MPI_Finalize and outlives every MpiCommunicator and pending request.
//
// Counts above INT_MAX (MPI 3's int counts; Open MPI 4.1 has no large-count calls): all-reduce, broadcast,
// send and receive are chunked into calls of at most maxCountPerCall() elements (disjoint slices, issued in
// order, so chunks match pairwise); reduce-scatter and all-gather return an error instead (their blocks are
// strided, and MPI's predefined reductions take only predefined types). allToAllV is MPI_Alltoallv while
// every rank's counts and offsets fit maxCountPerCall(); otherwise (the ranks agree on it first, with one
// small all-reduce) MPI_Alltoallw with one derived datatype per block, whose displacement is an MPI_Aint and
// whose elements come in whole chunks of maxCountPerCall() plus a remainder, so nothing passes through an
// int.
#pragma once

#include <mpi.h>

#include <climits>
#include <memory>
#include <string>

#include "runtime/communicator.h"

namespace ms {

class MpiCommunicator final : public Communicator {
 public:
  static constexpr size_t kMaxCountPerCall = INT_MAX;

  // Takes ownership of comm (freed by the destructor) and sets MPI_ERRORS_RETURN on it.
  static Expected<std::unique_ptr<MpiCommunicator>> adopt(MPI_Comm comm, std::string label,
                                                          size_t maxCountPerCall = kMaxCountPerCall);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  // Collective: a duplicate (MPI_Comm_dup, its own message space) whose calls carry at most
  // maxCountPerCall elements; tests use a small value to exercise chunking without 8 GiB buffers.
  Expected<std::unique_ptr<MpiCommunicator>> duplicate(size_t maxCountPerCall) const;

  MPI_Comm comm() const { return m_comm; }
  size_t maxCountPerCall() const { return m_maxCount; }

  const char* name() const override { return "mpi"; }
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
  MpiCommunicator(MPI_Comm comm, std::string label, size_t maxCountPerCall, int rank, int size);
  // "allReduce on mpi communicator 'world' (rank 1 of 4): <what>"
  std::string where(const char* op) const;
  Status fail(const char* op, int mpiError) const;
  Status checkRank(const char* op, const char* what, int value) const;
  Status checkBlockCount(const char* op, size_t count) const;

  MPI_Comm m_comm;
  std::string m_label;
  size_t m_maxCount;
  int m_rank;
  int m_size;
};

// RAII around MPI_Init_thread(MPI_THREAD_FUNNELED) / MPI_Finalize: one per process, made by main(), which
// keeps it alive until every communicator and request is gone. Only the thread that made it calls MPI.
class MpiContext {
 public:
  static Expected<std::unique_ptr<MpiContext>> create(int* argc, char*** argv);
  ~MpiContext();
  MpiContext(const MpiContext&) = delete;
  MpiContext& operator=(const MpiContext&) = delete;

  // A duplicate of MPI_COMM_WORLD labelled "world" (raw MPI_COMM_WORLD traffic cannot match ours).
  MpiCommunicator& world() { return *m_world; }

 private:
  MpiContext() = default;
  std::unique_ptr<MpiCommunicator> m_world;
};

// "MPI_ERR_ROOT: invalid root" for an MPI error code.
std::string mpiErrorString(int mpiError);

}  // namespace ms
