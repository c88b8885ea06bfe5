// A small binary weights file: the model config, a layout fingerprint and
// the flat fp32 parameter buffer, with a checksum.
//
// Format (little-endian):
//   char[8]  "STWGHTS\0"        uint32 version: 1 (GPT-2), 2 (other families),
//                                3 (+ an extension), 4 (+ MoE layers)
//   int32    layers, heads, dim, context, vocab, padded_vocab
//   uint64   num_params         uint64 layout fingerprint (ParamLayout)
//   version >= 2, the family's recipe:
//     int32  arch (0 = gpt2, version 4 only; 1 = llama), kv_heads, ffn_dim,
//            tie_embeddings (0/1)
//     double norm_eps, rope_theta
//   version >= 3, the extension:
//     double rope factor, low_freq_factor, high_freq_factor (factor 0: off)
//     int32  original_context, head_size (0: dim / heads), qk_norm, reserved
//   version 4, the MoE record:
//     int32  experts, top_k, expert_ffn_dim, shared_experts, sigmoid (0/1),
//            norm_topk_prob (0/1), first_dense_layers, router_bias (0/1)
//   float    params[num_params]
//   uint64   FNV-1a 64 checksum of the params bytes
// Each model is written in the lowest version that holds it: a GPT-2 model
// as version 1, byte for byte as before families.
#ifndef SHARDTRAIN_WORKER_CHECKPOINT_WEIGHTS_FILE_H_
#define SHARDTRAIN_WORKER_CHECKPOINT_WEIGHTS_FILE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/config.h"

namespace shardtrain::checkpoint {

inline constexpr uint32_t kWeightsVersion = 4;  // the newest this build reads and writes

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
