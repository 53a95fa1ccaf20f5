// Communicator: the one interface through which ranks exchange tensors (docs/architecture.md,
// "Communication"). Backends (MPI today, NCCL later) sit behind it; schedules and parallel layers talk to a
// Communicator, never to MPI or NCCL directly. This header is Qt-free and MPI-free. What must always hold:
// every collective is called by every rank of the communicator in the same order with matching counts and
// types; errors come back as Status values naming the operation, the communicator and the rank, never as an
// abort; a CommRequest that is destroyed unfinished waits for its operation first (no pending operation is
// leaked).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace ms {

// Element types on the wire. Not safetensors' DType (engine/runtime/safetensors.h): that one describes
// stored tensors (BF16, F16) and lacks F64 and I64.
// BF16: bf16 values (the top half of an fp32's bits; gradients with "grad_precision": "bf16"); a reduction
// adds each pair exactly in fp32 and rounds the sum to nearest even, as NCCL's bf16 reductions do.
enum class CommType { F32, F64, I32, I64, U8, BF16 };
enum class ReduceOp { Sum, Max, Min };

size_t commTypeSize(CommType type);
const char* toString(CommType type);
const char* toString(ReduceOp op);

template <typename T>
constexpr CommType commTypeOf();
template <>
constexpr CommType commTypeOf<float>() {
  return CommType::F32;
}
template <>
constexpr CommType commTypeOf<double>() {
  return CommType::F64;
}
template <>
constexpr CommType commTypeOf<int32_t>() {
  return CommType::I32;
}
template <>
constexpr CommType commTypeOf<int64_t>() {
  return CommType::I64;
}
template <>
constexpr CommType commTypeOf<uint8_t>() {
  return CommType::U8;
}

// A pending non-blocking operation. Its buffers must stay alive and untouched until wait() returns (or
// ready() has returned true). The destructor of an unfinished request waits and drops its status.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  // Blocks until the operation has finished; returns its error, if any. Waiting again returns ok.
  virtual Status wait() = 0;
  // True once the operation has finished (then wait() returns at once with its result).
  virtual bool ready() = 0;
};

using CommRequestPtr = std::unique_ptr<CommRequest>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  // The backend ("mpi") and this group's label ("world", "world/split(1)") for messages.
  virtual const char* name() const = 0;
  virtual const std::string& label() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Element-wise reduction of `count` elements over all ranks into every rank's recv; in place when
  // send == recv.
  virtual Status allReduce(const void* send, void* recv, size_t count, CommType type, ReduceOp op) = 0;
  // send holds size() blocks of recvCount elements (R, recvCount); rank r receives the reduction of block
  // r. In place when send == recv (the result lands in the first block).
  virtual Status reduceScatter(const void* send, void* recv, size_t recvCount, CommType type,
                               ReduceOp op) = 0;
  // recv (R, sendCount) receives every rank's send in rank order. In place when send points at this
  // rank's block of recv.
  virtual Status allGather(const void* send, void* recv, size_t sendCount, CommType type) = 0;
  virtual Status broadcast(void* data, size_t count, CommType type, int root) = 0;
  // Point to point. A receive must match the sent count exactly (a shorter message is an error).
  virtual Status send(const void* data, size_t count, CommType type, int peer, int tag) = 0;
  virtual Status recv(void* data, size_t count, CommType type, int peer, int tag) = 0;
  virtual Status barrier() = 0;
  // All-to-all with per-peer counts (MPI_Alltoallv): this rank sends sendCounts[r] elements starting at
  // element sendOffsets[r] of send to rank r, and receives recvCounts[r] elements from rank r at element
  // recvOffsets[r] of recv (the arrays have size() entries; counts and offsets in elements of `type`). Every
  // rank's sendCounts[r] must equal rank r's recvCounts[this rank]. Zero counts are allowed (no message); the
  // blocks to and from this rank itself are copied. send and recv must not overlap. Blocking.
  virtual Status allToAllV(const void* send, const size_t* sendCounts, const size_t* sendOffsets, void* recv,
                           const size_t* recvCounts, const size_t* recvOffsets, CommType type) = 0;

  // Non-blocking forms: the same contracts, finished by the returned request.
  virtual Expected<CommRequestPtr> iallReduce(const void* send, void* recv, size_t count, CommType type,
                                              ReduceOp op) = 0;
  virtual Expected<CommRequestPtr> ireduceScatter(const void* send, void* recv, size_t recvCount,
                                                  CommType type, ReduceOp op) = 0;
  virtual Expected<CommRequestPtr> iallGather(const void* send, void* recv, size_t sendCount,
                                              CommType type) = 0;
  virtual Expected<CommRequestPtr> ibroadcast(void* data, size_t count, CommType type, int root) = 0;
  virtual Expected<CommRequestPtr> isend(const void* data, size_t count, CommType type, int peer,
                                         int tag) = 0;
  virtual Expected<CommRequestPtr> irecv(void* data, size_t count, CommType type, int peer, int tag) = 0;

  // Collective: ranks with the same color form a new group, ordered by key (then by rank). A negative
  // color joins no group: that rank gets a null pointer. Groups must be destroyed before their backend's
  // context (for MPI: before MpiContext).
  virtual Expected<std::unique_ptr<Communicator>> split(int color, int key) = 0;
};

}  // namespace ms
