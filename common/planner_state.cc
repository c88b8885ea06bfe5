// The planner's (common/planner.h) bytes of model state per rank: what each
// engine keeps per element, and how ZeRO's shards and the 8-bit optimizer
// state divide it.
#include <cstdint>

#include "common/planner.h"
#include "common/shard_range.h"

namespace shardtrain {

int64_t BusiestShard(int64_t n, int dp, int64_t align) {
  const parallel::ShardRange r =
      parallel::UnitShardRange(static_cast<size_t>(n), dp, dp - 1, static_cast<size_t>(align));
  return static_cast<int64_t>(r.size());
}

StateBytesPerElement EngineStateBytes(Precision precision) {
  if (precision == Precision::kFp32) return {4, 4, 8};
  return {2, 4, 12};
}

bool StateThroughHost(const JobSpec& spec) {
  return spec.resources.device == DeviceKind::kCuda &&
         (spec.parallel.offload == OffloadMode::kOptimizer ||
          (spec.parallel.comm != CommBackend::kNccl && spec.parallel.zero >= 1));
}

ModelStateBytes GpuThroughHostBytes(int64_t num_params, int dp, int stage,
                                    const StateBytesPerElement& per, int64_t* host) {
  const int64_t n = num_params, shard = stage >= 1 ? BusiestShard(n, dp, ShardAlign(per)) : n;
  const int64_t master = per.optimizer - 8;  // fp32 master beside a 16-bit compute copy
  ModelStateBytes b;
  // The device: up to ZeRO-2 the compute copy (the fp32 master itself in
  // fp32) and the fp32 master beside a 16-bit one, whole; the gradients
  // under ZeRO-0/1. (ZeRO-2/3's units in use are the working set: ZeRO-3
  // holds a unit's master and compute copy only while it is in use.)
  b.params = stage < 3 ? (per.params + master) * n : 0;
  b.grads = stage < 2 ? per.grads * n : 0;
  // The host: AdamW's m and v of the shard, fp32 copies of the whole
  // parameters and gradients, the gradient shard (2-3), the parameter shard (3).
  b.optimizer = OptimizerStateBytes(shard, per) - master * shard;
  *host += b.optimizer + 8 * n + (stage >= 2 ? 4 * shard : 0) + (stage == 3 ? 4 * shard : 0);
  return b;
}

int64_t OptimizerStateBytes(int64_t n, const StateBytesPerElement& per) {
  if (!per.int8_moments) return per.optimizer * n;
  return (per.optimizer - 6) * n + 8 * ((n + kInt8StateBlock - 1) / kInt8StateBlock);
}

ModelStateBytes ZeroMemoryBytes(int64_t num_params, int dp, int stage,
                                const StateBytesPerElement& per) {
  const int64_t shard = BusiestShard(num_params, dp, ShardAlign(per));
  ModelStateBytes b;
  b.params = per.params * (stage >= 3 ? shard : num_params);
  b.grads = per.grads * (stage >= 2 ? shard : num_params);
  b.optimizer = OptimizerStateBytes(stage >= 1 ? shard : num_params, per);
  return b;
}

}  // namespace shardtrain
