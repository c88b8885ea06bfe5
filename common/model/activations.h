// ActivationTable: every activation and scratch tensor a rank needs for
// micro-batches of up to (B, T) tokens, by name and size — the one table an
// engine allocates its buffers from and the planner accounts memory with (as
// llm.c's fill_in_activation_sizes feeds both its malloc and its printout).
//
// Kinds:
//   kSaved    written by the forward pass and read by the backward pass of
//             the same micro-batch: a pipeline stage keeps one set per
//             micro-batch in flight;
//   kScratch  temporaries (the forward projection output, the backward
//             gradients of activations): one set whatever the schedule.
//
// Per block l ("block.<l>.<name>"), with BT = B·T, C = dim and Ct = C / tp
// (the tensor-parallel width of a rank):
//   ln1, ln2 (BT·C) and their mean, rstd (BT each); qkv (BT·3Ct); atty
//   (BT·Ct); att (B·(NH/tp)·T·T softmax probabilities); residual2, residual3
//   (BT·C); fch, fch_gelu (BT·4Ct)                                    saved
// Model ends: encoded (BT·C: the embeddings on the first stage, the input
//   received from the previous stage on the others); lnf (BT·C), lnf_mean,
//   lnf_rstd (BT), logits (BT·Vp/tp), losses, lse (BT) on the last    saved
// Scratch: proj_out, dresidual, dln (BT·C each), datty (BT·Ct), dqkv
//   (BT·3Ct), dfch, dfch_gelu (BT·4Ct), att_scratch (B·(NH/tp)·T·T)  scratch
// A pipeline stage keeps one set of the saved tensors per micro-batch in
// flight (Engine::slots()).
//
// Elements, not bytes: an engine stores them in its compute type.
// Thread-compatible: an immutable value.
#ifndef SHARDTRAIN_COMMON_MODEL_ACTIVATIONS_H_
#define SHARDTRAIN_COMMON_MODEL_ACTIVATIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/model/config.h"
#include "common/model/slice.h"

namespace shardtrain::model {

enum class ActivationKind { kSaved, kScratch };

struct ActivationTensor {
  std::string name;  // "block.3.qkv", "logits", "dqkv", ...
  int64_t numel = 0;
  ActivationKind kind = ActivationKind::kSaved;
  int64_t offset = 0;  // in elements, within the kind's contiguous part (see below)
};

class ActivationTable {
 public:
  // Preconditions (the callers validate them): B, T >= 1; slice within the
  // config's layers; tp divides heads.
  ActivationTable(const GptConfig& config, int B, int T, const ModelSlice& slice = {});

  // In allocation order: the saved tensors (layers in order, then the
  // model's ends), then the scratch ones. Each kind is contiguous: a
  // tensor's offset is within its kind.
  const std::vector<ActivationTensor>& tensors() const { return tensors_; }
  // The tensor with this name; aborts when there is none (a programming
  // error: the names are fixed above).
  const ActivationTensor& at(const std::string& name) const;

  int64_t saved_numel() const { return saved_; }  // per micro-batch in flight
  int64_t scratch_numel() const { return scratch_; }
  int64_t total_numel() const { return saved_ + scratch_; }

 private:
  void Add(std::string name, int64_t numel, ActivationKind kind);
  std::vector<ActivationTensor> tensors_;
  int64_t saved_ = 0, scratch_ = 0;
};

}  // namespace shardtrain::model

#endif  // SHARDTRAIN_COMMON_MODEL_ACTIVATIONS_H_
