#include "common/model/activations.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardtrain::model {

ActivationTable::ActivationTable(const GptConfig& config, int B, int T, const ModelSlice& slice,
                                 DataType compute)
    : compute_(compute) {
  const int64_t BT = int64_t{B} * T, C = config.dim, tp = slice.tp;
  const int64_t Ct = C / tp, Vpt = config.padded_vocab / tp;  // tp-local widths
  const int64_t att = int64_t{B} * (config.heads / tp) * T * T;
  const int last = slice.end_layer(config);
  constexpr ActivationKind kSaved = ActivationKind::kSaved, kScratch = ActivationKind::kScratch;
  for (int l = slice.first_layer; l < last; ++l) {
    const std::string b = absl::StrCat("block.", l, ".");
    Add(b + "ln1", BT * C, kSaved);
    Add(b + "ln1_mean", BT, kSaved, true);
    Add(b + "ln1_rstd", BT, kSaved, true);
    Add(b + "qkv", BT * 3 * Ct, kSaved);
    Add(b + "atty", BT * Ct, kSaved);
    Add(b + "att", att, kSaved);
    Add(b + "residual2", BT * C, kSaved);
    Add(b + "ln2", BT * C, kSaved);
    Add(b + "ln2_mean", BT, kSaved, true);
    Add(b + "ln2_rstd", BT, kSaved, true);
    Add(b + "fch", BT * 4 * Ct, kSaved);
    Add(b + "fch_gelu", BT * 4 * Ct, kSaved);
    Add(b + "residual3", BT * C, kSaved);
  }
  Add("encoded", BT * C, kSaved);  // the first stage's embeddings, or the input received
  if (slice.last_stage) {
    Add("lnf", BT * C, kSaved);
    Add("lnf_mean", BT, kSaved, true);
    Add("lnf_rstd", BT, kSaved, true);
    Add("logits", BT * Vpt, kSaved);
    Add("losses", BT, kSaved, true);
    Add("lse", BT, kSaved, true);
  }
  Add("proj_out", BT * C, kScratch);
  Add("dresidual", BT * C, kScratch);
  Add("dln", BT * C, kScratch);
  Add("datty", BT * Ct, kScratch);
  Add("dqkv", BT * 3 * Ct, kScratch);
  Add("dfch", BT * 4 * Ct, kScratch);
  Add("dfch_gelu", BT * 4 * Ct, kScratch);
  Add("att_scratch", att, kScratch);
}

void ActivationTable::Add(std::string name, int64_t numel, ActivationKind kind, bool stat) {
  int64_t& end = kind == ActivationKind::kSaved ? saved_ : scratch_;
  ActivationTensor t{std::move(name), numel, kind, stat ? DataType::kFloat32 : compute_, end};
  end += (t.bytes() + 15) / 16 * 16;  // the next tensor starts 16-byte aligned
  tensors_.push_back(std::move(t));
}

const ActivationTensor& ActivationTable::at(const std::string& name) const {
  for (const ActivationTensor& t : tensors_) {
    if (t.name == name) return t;
  }
  std::fprintf(stderr, "ActivationTable: no tensor \"%s\"\n", name.c_str());
  std::abort();
}

}  // namespace shardtrain::model
