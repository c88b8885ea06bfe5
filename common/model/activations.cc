#include "common/model/activations.h"

#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace shardtrain::model {

ActivationTable::ActivationTable(const ModelConfig& config, int B, int T, const ModelSlice& slice,
                                 DataType compute, const ActivationPolicy& policy)
    : compute_(compute) {
  const int64_t BT = int64_t{B} * T, C = config.dim, tp = slice.tp;
  // Rows of the residual stream on this rank: all, or 1/tp under sequence
  // parallelism.
  const int64_t BTl = policy.sequence_parallel ? BT / tp : BT;
  const int64_t Ct = C / tp, Vpt = config.padded_vocab / tp;  // tp-local widths
  const int64_t att = int64_t{B} * (config.heads / tp) * T * T;
  const int last = slice.end_layer(config);
  constexpr ActivationKind kSaved = ActivationKind::kSaved, kScratch = ActivationKind::kScratch;
  // numel of each block tensor (kBlockActivations order).
  const int64_t block_numel[] = {BTl * C, BTl, BTl, BT * 3 * Ct, BT * Ct,     att,    BTl * C,
                                 BTl * C, BTl, BTl, BT * 4 * Ct, BT * 4 * Ct, BTl * C};
  static_assert(std::size(kBlockActivations) == 13);
  auto is_stat = [](const std::string& n) {
    return absl::EndsWith(n, "_mean") || absl::EndsWith(n, "_rstd");
  };
  // Which block tensors a recomputing block refills rather than keeps.
  auto refilled = [&](const std::string& n) {
    if (policy.recompute == Recompute::kFull) return n != "residual3";
    return policy.recompute == Recompute::kSelective && n == "att";
  };
  bool any_recomputed = false;
  for (int l = slice.first_layer; l < last; ++l) {
    const std::string b = absl::StrCat("block.", l, ".");
    const bool recomputes = policy.Recomputes(l - slice.first_layer);
    any_recomputed |= recomputes;
    for (size_t k = 0; k < std::size(kBlockActivations); ++k) {
      const std::string n = kBlockActivations[k];
      if (recomputes && refilled(n)) continue;
      Add(b + n, block_numel[k], kSaved, is_stat(n));
    }
  }
  Add("encoded", BTl * C, kSaved);  // the first stage's embeddings, or the input received
  if (slice.last_stage) {
    Add("lnf", BT * C, kSaved);
    Add("lnf_mean", BTl, kSaved, true);
    Add("lnf_rstd", BTl, kSaved, true);
    Add("logits", BT * Vpt, kSaved);
    Add("losses", BT, kSaved, true);
    Add("lse", BT, kSaved, true);
  }
  Add("proj_out", BT * C, kScratch);
  Add("dresidual", BTl * C, kScratch);
  Add("dln", BT * C, kScratch);
  Add("datty", BT * Ct, kScratch);
  Add("dqkv", BT * 3 * Ct, kScratch);
  Add("dfch", BT * 4 * Ct, kScratch);
  Add("dfch_gelu", BT * 4 * Ct, kScratch);
  Add("att_scratch", att, kScratch);
  if (policy.sequence_parallel) {
    Add("sp_full", BT * C, kScratch);
    Add("sp_local", BTl * C, kScratch);
  }
  if (any_recomputed) {
    for (size_t k = 0; k < std::size(kBlockActivations); ++k) {
      const std::string n = kBlockActivations[k];
      if (refilled(n)) Add("recompute." + n, block_numel[k], kScratch, is_stat(n));
    }
  }
}

void ActivationTable::Add(std::string name, int64_t numel, ActivationKind kind, bool stat) {
  int64_t& end = kind == ActivationKind::kSaved ? saved_ : scratch_;
  ActivationTensor t{std::move(name), numel, kind, stat ? DataType::kFloat32 : compute_, end};
  end += (t.bytes() + 15) / 16 * 16;  // the next tensor starts 16-byte aligned
  tensors_.push_back(std::move(t));
}

const ActivationTensor* ActivationTable::find(const std::string& name) const {
  for (const ActivationTensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const ActivationTensor& ActivationTable::at(const std::string& name) const {
  if (const ActivationTensor* t = find(name)) return *t;
  std::fprintf(stderr, "ActivationTable: no tensor \"%s\"\n", name.c_str());
  std::abort();
}

const ActivationTensor& ActivationTable::block(int l, const std::string& name) const {
  if (const ActivationTensor* t = find(absl::StrCat("block.", l, ".", name))) return *t;
  return at("recompute." + name);
}

}  // namespace shardtrain::model
