// ProcessGroup over NCCL on one CUDA device per rank (ARCHITECTURE.md, comm); built when
// TESSERA_CUDA is on (TESSERA_HAS_NCCL).
#pragma once

#include <memory>
#include <string>

#include "comm/process_group.h"
#include "comm/store.h"

namespace tessera::comm {

// Whether this process sees a CUDA device; otherwise *why (when non-null) says what failed.
// Initializes the CUDA runtime: a process that forks workers afterwards cannot use CUDA in them.
bool nccl_available(std::string* why);
// The NCCL library loaded, "NCCL 2.27.3" (ncclGetVersion).
std::string nccl_version();

// A non-blocking NCCL communicator of `size` ranks on CUDA device `device`, rendezvous through
// `store` (rank 0 publishes the ncclUniqueId). Throws StoreError or CollectiveError when the peers
// do not all arrive within `timeout`.
//
// Every buffer passed to its collectives is a DEVICE pointer on `device`. Operations run on the
// group's own non-blocking stream, in call order: the caller must have finished writing the
// inputs before the call, or name the stream that writes them (CollectiveOptions::after), and
// must not touch the buffers before wait() returns. A collective's timeout counts from the call.
// In place: in == out + rank x count for all_gather, out == in + rank x count for
// reduce_scatter; otherwise the buffers must not overlap. Collectives are issued by one thread at a time (in the same
// order on every rank); wait() and abort() may come from any thread.
std::unique_ptr<ProcessGroup> make_nccl_group(Store& store, int rank, int size, int device, Millis timeout);

}  // namespace tessera::comm
