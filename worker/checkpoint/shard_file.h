// One rank's part of a checkpoint: dir/step-N/rank-R.shard.
//
// A shard holds one or more ranges of the model's flat parameter buffer
// (model::ParamLayout): the fp32 params there, AdamW's m and v for the same
// elements, and the job-global training scalars. Under DDP (ZeRO-0) the saved
// shard of rank r of N is the r-th of N even contiguous ranges (EvenSplit);
// under ZeRO-1/2/3 it is what the rank owns (one range per shard unit).
//
// File format, version 1, little-endian, no padding:
//   char[8]  magic "STSHARD\0"
//   uint32   version (1)                 uint32 reserved (0)
//   int64    step                        (the checkpoint's step)
//   int32    rank                        int32  world
//   uint64   layout fingerprint          (ParamLayout::Fingerprint)
//   uint64   num_params                  (of the whole layout)
//   uint32   num_ranges                  uint32 reserved (0)
//   num_ranges x {uint64 begin, uint64 end}   flat [begin, end), sorted, disjoint
//   four sections, in this order, each {char[4] tag, uint32 reserved 0,
//   uint64 length in bytes, bytes}:
//     "PARM"  fp32 params of the ranges, concatenated in range order
//     "ADMM"  fp32 AdamW m, same elements
//     "ADMV"  fp32 AdamW v, same elements
//     "SCAL"  int64 optimizer_step, int64 data_position, uint64 rng_seed,
//             double loss_scale                    (32 bytes)
//   uint64   CRC-64/XZ (crc64.h) of every preceding byte of the file
//
// Thread-compatible (functions over values and a storage).
#ifndef SHARDTRAIN_WORKER_CHECKPOINT_SHARD_FILE_H_
#define SHARDTRAIN_WORKER_CHECKPOINT_SHARD_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/checkpoint/storage.h"

namespace shardtrain::checkpoint {

inline constexpr uint32_t kShardVersion = 1;

// A range [begin, end) of the flat parameter buffer, in floats.
struct FlatRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
};
bool operator==(const FlatRange& a, const FlatRange& b);
inline bool operator!=(const FlatRange& a, const FlatRange& b) { return !(a == b); }
std::string ToString(const FlatRange& r);  // "[begin, end)"

// The r-th of `world` even contiguous ranges of [0, num_params): the first
// num_params % world ranks get one element more. Precondition 0 <= rank < world.
FlatRange EvenSplit(uint64_t num_params, int world, int rank);

// Training state saved alongside the tensors; the same on every rank of a
// job (ReadShard does not check that; the loader does across the shards it reads).
struct TrainingScalars {
  int64_t optimizer_step = 0;  // AdamW step counter (AdamW::step())
  int64_t data_position = 0;   // the next training step to run
  uint64_t rng_seed = 0;
  double loss_scale = 1.0;  // fp16 dynamic loss scale; 1 otherwise
};
bool operator==(const TrainingScalars& a, const TrainingScalars& b);

struct ShardContents {
  int64_t step = 0;
  int rank = 0;
  int world = 1;
  uint64_t layout_fingerprint = 0;
  uint64_t num_params = 0;
  std::vector<FlatRange> ranges;  // sorted, disjoint, within [0, num_params); may be empty
  // Each holds sum(range sizes) floats: the ranges' elements, in range order.
  std::vector<float> params, m, v;
  TrainingScalars scalars;
};

// What a rank reports to the coordinator after writing its shard; the
// manifest records it.
struct ShardFileInfo {
  int rank = 0;
  std::string file;  // name inside the step directory, "rank-R.shard"
  std::vector<FlatRange> ranges;
  uint64_t bytes = 0;     // file size
  uint64_t checksum = 0;  // the file's trailing CRC-64/XZ
};

// "rank-R.shard".
std::string ShardFileName(int rank);

// The bytes of a shard file. InvalidArgument if the contents are inconsistent
// (rank outside [0, world), ranges unsorted/overlapping/outside num_params,
// params/m/v not holding exactly the ranges' elements).
absl::StatusOr<std::string> EncodeShard(const ShardContents& contents);

// Parses and verifies a shard file's bytes; `name` is used in errors.
// DataLoss naming `name` on bad magic, unsupported version, truncation,
// trailing bytes, malformed header or sections, or a checksum mismatch.
absl::StatusOr<ShardContents> DecodeShard(const std::string& bytes, const std::string& name);

// The trailing checksum of an encoded shard (bytes.size() >= 8).
uint64_t StoredChecksum(const std::string& bytes);

// Encodes `contents` and writes it atomically to `path` (normally
// JoinPath(step_dir, ShardFileName(rank))), after checking that its volume
// has room for it (CheckRoomFor). Returns what the manifest needs, with
// `file` = the last component of `path`. InvalidArgument as EncodeShard;
// storage errors as CheckRoomFor and WriteFileAtomic (RESOURCE_EXHAUSTED,
// FAILED_PRECONDITION, UNAVAILABLE, with their StorageFault).
absl::StatusOr<ShardFileInfo> WriteShard(CheckpointStorage& storage, const std::string& path,
                                         const ShardContents& contents);

// Reads and verifies a shard. NotFound if missing; DataLoss as DecodeShard.
absl::StatusOr<ShardContents> ReadShard(CheckpointStorage& storage, const std::string& path);

// Checks that `ranges` are sorted, disjoint and inside [0, num_params).
// InvalidArgument describing the first violation.
absl::Status ValidateRanges(const std::vector<FlatRange>& ranges, uint64_t num_params);

}  // namespace shardtrain::checkpoint

#endif  // SHARDTRAIN_WORKER_CHECKPOINT_SHARD_FILE_H_
