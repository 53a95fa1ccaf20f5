// The CUDA backend: kernels/backend.h on one GPU, every op an ms::cuda function (cuda_ops.h) enqueued on ONE
// non-blocking compute stream the backend creates, so work is ordered as backend.h requires and the host
// returns before the GPU has finished (except download, sumSquares, markTime, synchronize and upload, which
// wait). Built only with CUDA (MESHSTUDIO_HAVE_CUDA); compiles in plain C++ translation units.
//
// What always holds:
// - Memory is CUDA's stream-ordered allocator (cudaMallocFromPoolAsync / cudaFreeAsync on the compute stream,
//   from the device's default memory pool with its release threshold at UINT64_MAX): freed memory stays
//   cached in the pool and is reused by later allocations without a device synchronisation (cudaFree would
//   synchronise). Allocations are zero-filled on the stream. Work on ANOTHER stream (the NCCL communicator)
//   that uses a buffer must have finished before the buffer is deallocated: deallocate() orders the free
//   after this backend's work only. deallocate() never throws (it runs in destructors); every allocation
//   must be given back before the backend is destroyed, which returns the pool's cached memory.
// - Out of memory: after returning the pool's cached memory to the device and retrying once, allocate()
//   throws DeviceFailure with the bytes asked for and the bytes free.
// - Timing: a mark is a CUDA event recorded on the compute stream. The first mark after clearMarks()
//   synchronises the stream and records an anchor event whose host time (on the epoch's clock) is noted;
//   markTime(i) is that host time plus the GPU time from the anchor to mark i (cudaEventElapsedTime, about
//   half a microsecond of resolution). Clear marks every step or so: the elapsed times are floats in ms.
// - Every failure throws DeviceFailure naming the device, the op and the CUDA or cuBLAS error. Most CUDA
//   errors leave the context unusable: treat one as fatal for the rank.
// - GEMMs run in the process-wide ms::cuda::gemmMode() (fp32 by default; setGemmPrecision sets it), on the
//   compute stream. Bf16 GEMMs convert their operands into per-thread scratch that is safe to reuse because
//   all of the backend's ops run on that one stream (cuda_ops.h).
// - The multi-tensor optimizer updates (adamwUpdateSegments, sgdUpdateSegments) are one kernel launch per
//   call over a segment table in device memory. The table is written into a pinned host buffer the backend
//   owns and reuses call after call (both grow when a call has more segments), and copied to the device
//   asynchronously on the compute stream; an event recorded after the copy is waited for before the next
//   call rewrites the pinned buffer, so that call may wait for the previous one's copy (long done in a
//   training loop, where a whole step lies between them).
// - Attention with head sizes up to 128 runs the fused kernel (cuda_flash_attention.cu: nothing (T, T) is
//   stored, forward saves (B, H, T) floats); larger heads the materialised softmax (cuda_attention.cu).
// - One backend per device per process, used from one thread at a time; each call makes the backend's
//   device current on the calling thread first.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "common/status.h"
#include "kernels/backend.h"

namespace ms {

// The CUDA backend on device `device` (an ordinal of cudaGetDeviceCount). An error (no such device, no
// driver, no memory-pool support) comes back as a Status naming the device.
Expected<std::unique_ptr<Backend>> makeCudaBackend(int device);

// The compute stream every op of `backend` is enqueued on, for work on other streams that must order itself
// after it (the NCCL communicator's setComputeStream). nullptr when backend is not a CUDA backend.
cudaStream_t computeStream(Backend& backend);

}  // namespace ms
