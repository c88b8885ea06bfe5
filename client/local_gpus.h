// `shardtrain local` with resources.device: cuda: which GPUs the machine has,
// as `shardtrain-worker --probe-devices` prints them (the CLI links no CUDA),
// and which one each local worker drives. Pure.
#ifndef SHARDTRAIN_CLIENT_LOCAL_GPUS_H_
#define SHARDTRAIN_CLIENT_LOCAL_GPUS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/job_spec.h"

namespace shardtrain::client {

// The names ("cuda:0", ...) of the GPUs that can train, in the order of
// `probe_output`: the stdout of `shardtrain-worker --probe-devices`, one
// tab-separated line per GPU (NAME, PRECISIONS, MEMORY_BYTES,
// COMPUTE_CAPABILITY, MODEL; PRECISIONS "-" for a GPU that cannot train,
// worker/device_probe.h). Lines of another shape are ignored.
std::vector<std::string> UsableGpus(const std::string& probe_output);

// The --device of local worker `index`: gpus[index mod gpus.size()]
// (`gpus` non-empty), so that N workers spread over the GPUs round-robin.
std::string WorkerGpu(int index, const std::vector<std::string>& gpus);

// OK unless `spec`'s collectives cannot run with `workers` local workers on
// `gpus` GPUs: parallel.comm: nccl over more than one rank needs a GPU per
// worker (NCCL refuses two ranks on one GPU) — FAILED_PRECONDITION naming
// the field, before anything is started.
absl::Status CheckWorkersFitGpus(const JobSpec& spec, int workers, int gpus);

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_LOCAL_GPUS_H_
