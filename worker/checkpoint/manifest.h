// The manifest of a checkpoint, dir/step-N/manifest.txt. Its presence is
// what makes a step directory complete: rank 0 writes it (atomically) only
// after every rank reported its shard (ShardFileInfo), then asks the
// coordinator to record the commit.
// It records everything needed to load the checkpoint under any world size
// and ZeRO stage: the model config, the layout (tensor names, global shapes,
// flat offsets), and for each rank its file, flat ranges, size and checksum.
//
// Text format, version 1: one record per line, "keyword key=value ...",
// fields separated by one space, '\n' after every line, in this order:
//   shardtrain-checkpoint-manifest 1
//   step 100
//   world 4
//   zero_stage 2
//   config layers=2 heads=2 dim=16 context=16 vocab=256 padded_vocab=256
//   layout num_params=10944 fingerprint=<16 hex digits> tensors=28
//   tensor name=wte shape=256x16 offset=0 numel=4096        (one per tensor, layout order)
//   shard rank=0 file=rank-0.shard bytes=43992 crc64=<16 hex> ranges=0:2736,5000:5100
//                                                   (one per rank, rank order; "ranges=-" if none)
//   crc64 <16 hex digits>      CRC-64/XZ of every preceding byte of the file
// A scalar tensor's shape is "-".
//
// Thread-compatible.
#ifndef SHARDTRAIN_WORKER_CHECKPOINT_MANIFEST_H_
#define SHARDTRAIN_WORKER_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/model/param_layout.h"
#include "worker/checkpoint/shard_file.h"
#include "worker/checkpoint/storage.h"

namespace shardtrain::checkpoint {

inline constexpr int kManifestVersion = 1;
inline constexpr char kManifestFileName[] = "manifest.txt";

struct ManifestTensor {
  std::string name;
  std::vector<int64_t> shape;  // global shape
  uint64_t offset = 0;         // in floats, into the flat buffer
  uint64_t numel = 0;
};

struct Manifest {
  int64_t step = 0;
  model::ModelConfig config;
  uint64_t num_params = 0;
  uint64_t layout_fingerprint = 0;
  std::vector<ManifestTensor> tensors;
  int world = 1;                      // ranks that wrote the checkpoint
  int zero_stage = 0;                 // 0..3, informational: loading does not depend on it
  std::vector<ShardFileInfo> shards;  // shards[r] is rank r's
};

// Builds the manifest rank 0 writes once all ranks reported.
// `shards` may come in any order. InvalidArgument unless there is exactly
// one shard per rank in [0, world), the file names are plain distinct names,
// and the ranges of all shards together cover [0, num_params) exactly once.
absl::StatusOr<Manifest> MakeManifest(const model::ParamLayout& layout, int64_t step, int world,
                                      int zero_stage, std::vector<ShardFileInfo> shards);

// The consistency checks of MakeManifest on an existing manifest, plus that
// the tensors and fingerprint are those of ParamLayout(config).
// InvalidArgument describing the first violation.
absl::Status ValidateManifest(const Manifest& manifest);

// Text form (the format above) and back. ParseManifest: DataLoss naming
// `name` if the text is truncated, fails its checksum, is malformed or does
// not pass ValidateManifest.
std::string SerializeManifest(const Manifest& manifest);
absl::StatusOr<Manifest> ParseManifest(const std::string& text, const std::string& name);

// "<step_dir>/manifest.txt".
std::string ManifestPath(const std::string& step_dir);

// Writes atomically (ValidateManifest first: InvalidArgument; Unavailable on I/O).
absl::Status WriteManifest(CheckpointStorage& storage, const std::string& path,
                           const Manifest& manifest);
// NotFound if missing; DataLoss as ParseManifest.
absl::StatusOr<Manifest> ReadManifest(CheckpointStorage& storage, const std::string& path);

// FailedPrecondition unless the checkpoint was saved with `layout`'s model
// (same config and layout fingerprint); the message names both configs.
absl::Status CheckCompatible(const Manifest& manifest, const model::ParamLayout& layout);

}  // namespace shardtrain::checkpoint

#endif  // SHARDTRAIN_WORKER_CHECKPOINT_MANIFEST_H_
