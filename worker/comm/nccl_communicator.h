// NCCL backend of Communicator (built only when SHARDTRAIN_HAVE_CUDA): device
// buffers, one CUDA stream per communicator.
//
// Bootstrap: rank 0 calls ncclGetUniqueId and publishes the 128 bytes under
// `<prefix>/<group_name>/nccl_id` in the RendezvousStore; the others Get it
// (ExchangeNcclUniqueId, which needs no GPU). Communicators are created
// non-blocking (ncclConfig_t::blocking = 0) so initialisation has a timeout
// too. Sub-groups come from ncclCommSplit.
//
// Execution: Submit launches the NCCL call on the communicator's stream at
// once (ops run in submission order on that stream) and records a CUDA event.
// OpArgs::after becomes a cudaStreamWaitEvent on that stream before the call,
// and Work::BlockStream a cudaStreamWaitEvent of the caller's stream on the
// op's event: neither blocks the host.
// A watchdog thread polls every outstanding event and ncclCommGetAsyncError
// every 1 ms: an op still running at its deadline, or an asynchronous NCCL
// error (a peer died), makes it call ncclCommAbort, exchange failure reports
// through the store (ranks that had not arrived), dump the flight recorder
// and poison the communicator, exactly like the Gloo backend.
//
// Buffers must be device memory of `device` (or memory NCCL can access).
// fp16 / bf16: reduced natively by NCCL (ncclFloat16 / ncclBfloat16,
// ncclSum / ncclAvg / ncclMax); NCCL's kernels accumulate each reduction
// step in the element type's arithmetic, so unlike the Gloo backend partial
// sums are rounded to 16 bits at every hop. Barrier is an all-reduce of one
// float on a device scratch word. Send/Recv use ncclSend/ncclRecv; SendRecv
// groups the two (ncclGroupStart/End), so exchanges never deadlock.
#ifndef SHARDTRAIN_WORKER_COMM_NCCL_COMMUNICATOR_H_
#define SHARDTRAIN_WORKER_COMM_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/rendezvous_store.h"

namespace shardtrain::comm {

struct NcclOptions {
  int device = 0;                              // CUDA device of this rank
  absl::Duration timeout = absl::Seconds(30);  // per op, init and split
  std::string prefix = "default";              // e.g. "job42/gen3"
  std::string group_name = "world";
  size_t flight_recorder_capacity = 256;
  absl::Duration failure_report_grace = absl::Seconds(1);
  bool dump_on_failure = true;
};

// Returns the NCCL unique id (sizeof(ncclUniqueId) = 128 bytes) of the group
// stored at `key`: rank 0 creates it with ncclGetUniqueId and Sets it, the
// other ranks Get it (DEADLINE_EXCEEDED after `timeout`). Needs no GPU.
absl::StatusOr<std::string> ExchangeNcclUniqueId(RendezvousStore& store, const std::string& key,
                                                 int rank, absl::Duration timeout);

// True when the CUDA runtime reports at least one usable device.
bool CudaDeviceAvailable();

// Creates the NCCL communicator of `rank` in a group of `size`. Errors:
// INVALID_ARGUMENT, FAILED_PRECONDITION (no CUDA device), DEADLINE_EXCEEDED
// (peers did not join), UNAVAILABLE / INTERNAL (NCCL errors).
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    std::shared_ptr<RendezvousStore> store, int rank, int size, const NcclOptions& options);

}  // namespace shardtrain::comm

#endif  // SHARDTRAIN_WORKER_COMM_NCCL_COMMUNICATOR_H_
