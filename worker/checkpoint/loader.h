// The resharding loader: any flat range of the parameter buffer, read from
// whichever shard files of a committed checkpoint hold it. A checkpoint
// saved by (world N, ZeRO-k) loads under (world M, ZeRO-j) for any N, M, j:
// each new rank asks for the range(s) it owns. No conversion step.
//
// Thread-compatible (functions over values and a storage).
#ifndef SHARDTRAIN_WORKER_CHECKPOINT_LOADER_H_
#define SHARDTRAIN_WORKER_CHECKPOINT_LOADER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/shard_file.h"
#include "worker/checkpoint/storage.h"

namespace shardtrain::checkpoint {

struct LoadedState {
  std::vector<FlatRange> ranges;  // as requested
  // Each holds sum(range sizes) floats: the requested ranges' elements in
  // request order (element i of range k at offset sum(sizes before k) + i).
  std::vector<float> params, m, v;
  int64_t step = 0;  // the checkpoint's step (manifest.step)
  TrainingScalars scalars;
};

// Loads params, m and v for `ranges` (each inside [0, manifest.num_params);
// any order, may overlap or be empty). Reads each shard file that holds part
// of them once (at least one, for the scalars) and verifies it: size and
// checksum equal to the manifest's, its own checksum, and a header (rank,
// world, step, fingerprint, ranges) matching the manifest. All shards read
// must carry the same TrainingScalars.
// InvalidArgument for a range outside the layout; DataLoss naming the file
// for a missing (NotFound is reported as DataLoss: the checkpoint is
// committed, so the file must be there), corrupt or inconsistent shard;
// Unavailable on other I/O errors.
absl::StatusOr<LoadedState> LoadRanges(CheckpointStorage& storage, const std::string& step_dir,
                                       const Manifest& manifest,
                                       absl::Span<const FlatRange> ranges);

// LoadRanges for the single range [begin, end).
absl::StatusOr<LoadedState> LoadRange(CheckpointStorage& storage, const std::string& step_dir,
                                      const Manifest& manifest, uint64_t begin, uint64_t end);

// The whole model on one rank (`shardtrain sample`, world-1 resume).
absl::StatusOr<LoadedState> LoadAll(CheckpointStorage& storage, const std::string& step_dir,
                                    const Manifest& manifest);

// Reads and verifies every shard of the checkpoint as LoadRanges does, without
// keeping the data. OK or the first error (DataLoss naming the file).
absl::Status VerifyShards(CheckpointStorage& storage, const std::string& step_dir,
                          const Manifest& manifest);

}  // namespace shardtrain::checkpoint

#endif  // SHARDTRAIN_WORKER_CHECKPOINT_LOADER_H_
