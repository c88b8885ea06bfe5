// ParamLayout: where every parameter tensor of a GPT lives inside ONE flat
// float buffer, grouped into contiguous units that sharding strategies
// (ZeRO/FSDP per unit, checkpoints per tensor range) work on.
//
// Order (each unit contiguous, no gaps, units in this order):
//   unit "embeddings": wte (Vp, C), wpe (context, C)
//   unit "block.l" for l = 0..L-1:
//     block.l.ln1.weight (C), block.l.ln1.bias (C),
//     block.l.attn.qkv.weight (3C, C), block.l.attn.qkv.bias (3C),
//     block.l.attn.proj.weight (C, C), block.l.attn.proj.bias (C),
//     block.l.ln2.weight (C), block.l.ln2.bias (C),
//     block.l.mlp.fc.weight (4C, C), block.l.mlp.fc.bias (4C),
//     block.l.mlp.proj.weight (C, 4C), block.l.mlp.proj.bias (C)
//   unit "final": lnf.weight (C), lnf.bias (C)
// Linear weights are (out, in) row-major like torch.nn.Linear. The LM head is
// tied to wte. Gradients use a buffer with the identical layout.
#ifndef SHARDTRAIN_COMMON_MODEL_PARAM_LAYOUT_H_
#define SHARDTRAIN_COMMON_MODEL_PARAM_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"

namespace shardtrain::model {

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;  // in floats, into the flat buffer
  size_t numel = 0;
  int unit = 0;  // index into ParamLayout::units()
  // Weight decay rule: decay applies to 2-D tensors only (matmul weights and
  // the wte/wpe embeddings); never to biases or LayerNorm weights/biases.
  bool decay = false;
};

struct UnitInfo {
  std::string name;  // "embeddings", "block.0".."block.L-1", "final"
  size_t offset = 0;
  size_t numel = 0;
  int first_tensor = 0;  // tensors [first_tensor, first_tensor + num_tensors)
  int num_tensors = 0;
};

// Per-block tensor indices (relative to the block's first tensor).
enum BlockTensor : int {
  kLn1W = 0,
  kLn1B,
  kQkvW,
  kQkvB,
  kAttnProjW,
  kAttnProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcProjW,
  kFcProjB,
  kNumBlockTensors
};

// Immutable after construction; thread-compatible.
class ParamLayout {
 public:
  explicit ParamLayout(const GptConfig& config);

  const GptConfig& config() const { return config_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::vector<UnitInfo>& units() const { return units_; }
  size_t num_params() const { return num_params_; }

  // Index of the tensor with this name, NotFound otherwise.
  absl::StatusOr<int> FindTensor(const std::string& name) const;
  // Tensor index helpers.
  int wte() const { return 0; }
  int wpe() const { return 1; }
  int block_tensor(int layer, BlockTensor t) const { return 2 + layer * kNumBlockTensors + t; }
  int lnf_w() const { return 2 + config_.layers * kNumBlockTensors; }
  int lnf_b() const { return lnf_w() + 1; }
  // Offset in floats of a tensor.
  size_t offset(int tensor) const { return tensors_[tensor].offset; }

  // 64-bit fingerprint of names, shapes and offsets; stored in weights files
  // and checkpoints to detect layout changes.
  uint64_t Fingerprint() const;

 private:
  GptConfig config_;
  std::vector<TensorInfo> tensors_;
  std::vector<UnitInfo> units_;
  size_t num_params_ = 0;
};

}  // namespace shardtrain::model

#endif  // SHARDTRAIN_COMMON_MODEL_PARAM_LAYOUT_H_
