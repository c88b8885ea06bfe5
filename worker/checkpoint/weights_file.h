// A small binary weights file: the model config, a layout fingerprint and
// the flat fp32 parameter buffer, with a checksum.
//
// Format (little-endian):
//   char[8]  "STWGHTS\0"        uint32 version = 1 (GPT-2) or 2 (other families)
//   int32    layers, heads, dim, context, vocab, padded_vocab
//   uint64   num_params         uint64 layout fingerprint (ParamLayout)
//   version 2 only, the family's recipe:
//     int32  arch (1 = llama), kv_heads, ffn_dim, tie_embeddings (0/1)
//     double norm_eps, rope_theta
//   float    params[num_params]
//   uint64   FNV-1a 64 checksum of the params bytes
// A GPT-2 model is written as version 1, byte for byte as before families.
#ifndef SHARDTRAIN_WORKER_CHECKPOINT_WEIGHTS_FILE_H_
#define SHARDTRAIN_WORKER_CHECKPOINT_WEIGHTS_FILE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/config.h"

namespace shardtrain::checkpoint {

inline constexpr uint32_t kWeightsVersion = 2;  // the newest this build reads and writes

// Writes atomically: path.tmp.<pid> → fsync → rename → fsync(directory),
// after checking that the volume has room for the file (CheckFreeSpace).
// InvalidArgument if params.size() != ParamLayout(config).num_params();
// on I/O errors a StorageError naming the path (common/storage_fault.h:
// RESOURCE_EXHAUSTED when there is no room, FAILED_PRECONDITION for a
// read-only, unwritable or not-a-directory path, UNAVAILABLE otherwise).
absl::Status SaveWeights(const std::string& path, const model::ModelConfig& config,
                         absl::Span<const float> params);

struct LoadedWeights {
  model::ModelConfig config;
  std::vector<float> params;
};

// NotFound (missing), DataLoss (bad magic/version, truncated, layout
// mismatch, checksum mismatch, invalid config), each naming the path.
absl::StatusOr<LoadedWeights> LoadWeights(const std::string& path);

}  // namespace shardtrain::checkpoint

#endif  // SHARDTRAIN_WORKER_CHECKPOINT_WEIGHTS_FILE_H_
