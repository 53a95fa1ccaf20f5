// Bounded waits for the communication of tensors (issue 18). A collective or a message whose peer stopped
// taking part (a hung or dead rank, a lost link, a GPU fault) would otherwise block its rank for ever inside
// cudaStreamSynchronize or MPI_Wait, below anything the training loop could report. The device communicators
// (NCCL, and host staging, which stands in for NCCL under --emulate-device) wait through waitBounded()
// instead, which polls the operation and ends the wait when
//   - it finished: its result is returned;
//   - the backend reports an asynchronous error (NCCL: ncclCommGetAsyncError), or
//   - it has waited longer than the communication timeout (training.comm_timeout_s):
// then the communicator is aborted (NCCL: ncclCommAbort, which also ends its kernels), the error names the
// operation, the communicator, the rank, the time waited and the cause, and the process is marked as having
// abandoned communication, so that it ends with MPI_Abort instead of waiting in MPI_Finalize for peers that
// will not come (mpi_communicator.h). What a timeout cannot do: cancel an MPI collective in flight (MPI has
// no such call), so host staging leaves it unfinished and the process ends with MPI_Abort.
// The timeout bounds one operation, so it must exceed the longest legitimate wait: a pipeline stage waiting
// for its neighbour's first activation while the stages before it compute (the default, 600 s, is far above
// any step of the models this engine trains on CPUs).
//
// Fault injection for the tests (tests/tst_failure.cpp), from MESHSTUDIO_FAULT, counting the device
// communicators' operations of one process from 1 (host staging's; NCCL's are not counted):
//   "comm-hang:RANK:N"   rank RANK's N-th operation never starts (the rank stops taking part, as a hung
//                        peer): its peers time out;
//   "comm-error:RANK:N"  rank RANK's N-th operation reports an asynchronous error, as NCCL would.
#pragma once

#include <functional>
#include <string>

#include "common/status.h"

namespace ms {

inline constexpr double kDefaultCommTimeoutS = 600;

// Process-wide: the longest wait for one communication, seconds (<= 0: for ever). Set by the trainer from the
// config before the communicators are used.
void setCommTimeout(double seconds);
double commTimeout();

// True once a wait was abandoned (timed out or failed asynchronously): MPI peers may be stuck.
bool communicationAbandoned();

// Polls until poll() says done (true) or fails (an error: the asynchronous error, aborted), or the timeout
// passes; abort() runs on failure and timeout. `what` names the operation, the communicator and the rank.
// Spins for the first millisecond, then sleeps a fiftieth of the time waited between polls (at most 1 ms): a
// wait ends at most 2% after its operation, and a long one costs no CPU.
Status waitBounded(const std::string& what, const std::function<Expected<bool>()>& poll,
                   const std::function<void()>& abort);

// Counts one device-communication operation of this process (its MPI world rank from the environment) and
// applies the injected fault, if it is this one's (see above): an error to report, or a hang (never returns).
// Ok otherwise.
Status injectedCommFault();

}  // namespace ms
