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
//
// A layout of a ModelSlice (slice.h) holds only that slice's tensors, in the
// same order and with the same names, each with its tp-local shape: the
// embeddings unit when the slice has_embeddings(), the blocks of its layers,
// the final unit on the last stage. GlobalRuns maps its elements to the whole
// model's layout (checkpoints and initialisation work in those coordinates,
// so a run saved on one layout resumes on any other).
#ifndef SHARDTRAIN_COMMON_MODEL_PARAM_LAYOUT_H_
#define SHARDTRAIN_COMMON_MODEL_PARAM_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/model/slice.h"

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
  int global = 0;                  // index of this tensor in the whole model's layout
  TpSplit split = TpSplit::kNone;  // how tensor parallelism splits it
  // True when every tp rank of the slice holds the same values (tp > 1 and
  // not split): gradient norms count it on tp rank 0 only.
  bool replicated = false;
};

// `count` consecutive elements at `local` in a slice's flat buffer that are
// the elements at `global` in the whole model's.
struct FlatRun {
  size_t local = 0, global = 0, count = 0;
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
  explicit ParamLayout(const ModelConfig& config, const ModelSlice& slice = {});

  const ModelConfig& config() const { return config_; }
  const ModelSlice& slice() const { return slice_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::vector<UnitInfo>& units() const { return units_; }
  size_t num_params() const { return num_params_; }

  // Index of the tensor with this name, NotFound otherwise.
  absl::StatusOr<int> FindTensor(const std::string& name) const;
  // Tensor index helpers (layer: the model's layer number, within the
  // slice; wte/wpe only when the slice has_embeddings(), lnf on the last
  // stage).
  int wte() const { return 0; }
  int wpe() const { return 1; }
  int block_tensor(int layer, BlockTensor t) const {
    return first_block_ + (layer - slice_.first_layer) * kNumBlockTensors + t;
  }
  int lnf_w() const { return first_block_ + num_layers_ * kNumBlockTensors; }
  int lnf_b() const { return lnf_w() + 1; }
  int first_layer() const { return slice_.first_layer; }
  int num_layers() const { return num_layers_; }

  // The runs of local elements [begin, end) in the whole model's layout, in
  // local order (which is also increasing global order), adjacent runs
  // merged. Precondition: begin <= end <= num_params().
  std::vector<FlatRun> GlobalRuns(size_t begin, size_t end) const;
  std::vector<FlatRun> GlobalRuns() const { return GlobalRuns(0, num_params_); }
  // The ranges [first, second) of this slice's flat buffer that another rank
  // of the mesh holds identically and speaks for: the replicated tensors on
  // tp ranks > 0, and the embeddings unit on a last stage that is not also
  // the first (the tied copy; the first stage's is the one that counts).
  // Gradient norms leave them out, and checkpoints do not save them twice.
  // Sorted, disjoint; empty for a whole model.
  std::vector<std::pair<size_t, size_t>> ReplicaRanges() const;
  // The LayerNorms' weights and biases (ln1, ln2 of every block, the final
  // norm): under sequence parallelism each tp rank computes their gradient
  // on its rows only, so the gradients in these ranges are partial sums
  // over the tp group. Sorted, disjoint.
  std::vector<std::pair<size_t, size_t>> SequenceParallelRanges() const;
  // Elements of the whole model (ParamLayout(config()).num_params()).
  size_t global_num_params() const { return global_num_params_; }
  // Offset in floats of a tensor.
  size_t offset(int tensor) const { return tensors_[tensor].offset; }

  // 64-bit fingerprint of names, shapes and offsets; stored in weights files
  // and checkpoints to detect layout changes. Checkpoints store the whole
  // model's (GlobalFingerprint), whatever slice wrote them.
  uint64_t Fingerprint() const;
  uint64_t GlobalFingerprint() const;

 private:
  ModelConfig config_;
  ModelSlice slice_;
  int first_block_ = 0, num_layers_ = 0;
  size_t global_num_params_ = 0;
  uint64_t global_fingerprint_ = 0;
  std::vector<size_t> global_offsets_;  // per tensor: its offset in the whole layout
  std::vector<TensorInfo> tensors_;
  std::vector<UnitInfo> units_;
  size_t num_params_ = 0;
};

}  // namespace shardtrain::model

#endif  // SHARDTRAIN_COMMON_MODEL_PARAM_LAYOUT_H_
