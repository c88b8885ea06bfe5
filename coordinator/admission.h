// Admission control: the bounds a job must meet before the coordinator
// stores it, so that no submitted job can exhaust the coordinator's memory
// or block its queue. Pure functions; the limits come from coordinator
// flags (main.cc), defaults below.
//
// Each check answers INVALID_ARGUMENT naming the field and the limit, e.g.
// "plan: model.layers 1000000 x parallel.dp 1 needs an estimated 812 MB
// plan, above the coordinator's limit of 4 MiB (--max-plan-bytes)".
#ifndef SHARDTRAIN_COORDINATOR_ADMISSION_H_
#define SHARDTRAIN_COORDINATOR_ADMISSION_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/job_spec.h"
#include "common/parallel_dims.h"
#include "shardtrain/v1/coordinator.pb.h"

namespace shardtrain::coordinator {

struct AdmissionLimits {
  // spec_yaml plus every override, in bytes (the canonical spec of
  // gpt2-1558m is under 2 KiB).
  int64_t max_spec_bytes = 64 * 1024;
  // Model parameters (gpt2-1558m has 1.6e9).
  int64_t max_params = 20'000'000'000;
  // The plan's estimated serialized size: it is stored with the job and
  // answered whole by GetPlan, whose answer must fit gRPC's default 4 MiB.
  int64_t max_plan_bytes = 4 * 1024 * 1024;
  // Ranks per job (dp x tp x pp).
  int max_world = 1024;
};

// The longest path (resume_from, a worker's addresses and roots) accepted.
inline constexpr size_t kMaxPathBytes = 4096;
// The longest SubmitJobRequest.idempotency_key accepted.
inline constexpr size_t kMaxIdempotencyKeyBytes = 128;

// Checks what can be checked before parsing: spec bytes, resume_from's and
// the key's length.
absl::Status CheckSubmitRequest(const v1::SubmitJobRequest& req, const AdmissionLimits& limits);

// Bounds a registration's strings (kMaxPathBytes each), devices and
// precisions, so that ListWorkers answers stay small. INVALID_ARGUMENT
// naming the field.
absl::Status CheckRegisterRequest(const v1::RegisterWorkerRequest& req);

// Checks a validated spec: parameters, plan size, world; and what no
// worker can run yet (MoE layers on CUDA).
absl::Status CheckSpecLimits(const JobSpec& spec, const ParallelDims& dims,
                             const AdmissionLimits& limits);

// Parameters of the model (tied LM head), as a double so that no spec
// overflows it: Vp·C + T·C + L·(12C² + 13C) + 2C.
double ModelParams(const ModelSpec& model);

// An upper estimate of the serialized size of MakePlan(spec, world): the
// parameter layout (12 tensors per layer), the units' per-dp shard lists,
// the ranks and groups. Over-estimates by at most ~2x.
double EstimatePlanBytes(const JobSpec& spec, int world);

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_ADMISSION_H_
