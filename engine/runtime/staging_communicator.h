// A communicator for tensors in device memory over a host-memory one (MPI): every message is downloaded
// into host memory, sent or reduced there, and the result uploaded (docs/architecture.md, "Communication":
// the fallback when ranks share a GPU, which NCCL refuses, and how the CPU's emulated device exercises the
// device path in tests). Slower than NCCL (every transfer waits for the device and crosses PCIe twice), but
// it runs anywhere MPI does.
//
// What always holds: the contracts of Communicator (communicator.h) with every buffer in the backend's
// memory; a non-blocking receive or reduction uploads its result when it is waited for (or found ready),
// before wait()/ready() return; splits are staged too; every wait is bounded by the communication timeout
// (comm_watchdog.h), the blocking operations being the non-blocking ones waited for. allToAllV, which the
// host has only in blocking form, is staged as non-blocking messages to and from each peer, waited for
// together under one bound.
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.h"
#include "runtime/communicator.h"

namespace ms {

class StagingCommunicator final : public Communicator {
 public:
  // Over `host`, which is not owned (the world) ...
  StagingCommunicator(Communicator& host, Backend& backend);
  // ... or owned (a split).
  StagingCommunicator(std::unique_ptr<Communicator> host, Backend& backend);

  const char* name() const override { return m_name.c_str(); }
  const std::string& label() const override { return m_host->label(); }
  int rank() const override { return m_host->rank(); }
  int size() const override { return m_host->size(); }

  Status allReduce(const void* send, void* recv, size_t count, CommType type, ReduceOp op) override;
  Status reduceScatter(const void* send, void* recv, size_t recvCount, CommType type, ReduceOp op) override;
  Status allGather(const void* send, void* recv, size_t sendCount, CommType type) override;
  Status broadcast(void* data, size_t count, CommType type, int root) override;
  Status send(const void* data, size_t count, CommType type, int peer, int tag) override;
  Status recv(void* data, size_t count, CommType type, int peer, int tag) override;
  Status barrier() override { return m_host->barrier(); }
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
  std::string where(const char* op) const;
  Status starting(const char* op);
  std::unique_ptr<Communicator> m_owned;
  Communicator* m_host;
  // The host group that carries allToAllV's messages, split off the host on the first call (a collective, so
  // every rank makes it at the same point): its own message space, so that a message of the caller's with the
  // same peer and tag can never match one of them. Destroyed before m_owned.
  std::unique_ptr<Communicator> m_allToAllHost;
  Backend& m_backend;
  std::string m_name;
};

}  // namespace ms
