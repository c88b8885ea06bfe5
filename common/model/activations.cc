#include "common/model/activations.h"

#include <algorithm>
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
  // tp-local widths: the attention's output, q/k/v, the MLP's fc output and
  // its activation, the vocabulary.
  // Qt: the attention's output (heads·hs, C unless head_dim is set).
  const int64_t Qt = config.q_dim() / tp, QKVt = config.qkv_dim() / tp;
  const int64_t Vpt = config.padded_vocab / tp;
  const int64_t att = int64_t{B} * (config.heads / tp) * T * T;
  // Context parallelism: the ring's row statistics replace the saved
  // probabilities (see the header).
  const bool cp = policy.cp > 1;
  // Flash attention keeps the same row statistics (see the header).
  const bool rows_att = cp || policy.flash_attention;
  const int64_t rows = int64_t{B} * (config.heads / tp) * T;
  const int64_t KVt = 2 * int64_t{config.kv_heads} * config.head_dim() / tp;
  constexpr ActivationKind kSaved = ActivationKind::kSaved, kScratch = ActivationKind::kScratch;
  // numel of each block tensor (kBlockActivations order); RMSNorm keeps no
  // mean (-1: absent).
  const int64_t mean = config.norm == NormKind::kLayerNorm ? BTl : -1;
  // q/k norms: q's and k's heads before them, and their rstd (absent: -1).
  const int64_t qk_heads = (config.heads + config.kv_heads) / tp;
  const int64_t qk_pre = config.qk_norm ? BT * qk_heads * config.head_dim() : -1;
  const int64_t qk_rstd = config.qk_norm ? BT * qk_heads : -1;
  // An MoE layer's sizes (see the header): E experts, K slots, R rows on
  // the experts' side, their hidden widths on this rank.
  const int64_t E = config.moe.experts, K = config.moe.top_k, R = BT * K * slice.ep;
  const int64_t Het = int64_t{config.moe.expert_ffn_dim} / tp;
  const int64_t FCet = config.fc_rows(static_cast<int>(Het));
  // The widest dense MLP of the slice's layers (the scratch's dfch).
  int64_t Ft = 0;
  bool any_moe = false;
  for (int i = 0; i < slice.total_layers(config); ++i) {
    Ft = std::max<int64_t>(Ft, config.mlp_dim(slice.Layer(config, i)) / tp);
    any_moe |= config.moe_layer(slice.Layer(config, i));
  }
  const int64_t FCt = config.fc_rows(static_cast<int>(Ft));
  auto block_numel = [&](int l) -> std::vector<int64_t> {
    const int64_t Fl = config.mlp_dim(l) / tp, FCl = config.fc_rows(static_cast<int>(Fl));
    const bool dense = Fl > 0, moe = config.moe_layer(l);
    // numel, or -1 when the layer has no such tensor.
    auto when = [](bool present, int64_t numel) { return present ? numel : int64_t{-1}; };
    return {BTl * C,
            mean,
            BTl,
            BT * QKVt,
            qk_pre,
            qk_rstd,
            BT * Qt,
            rows_att ? rows : att,
            BTl * C,
            BTl * C,
            mean,
            BTl,
            when(dense, BT * FCl),
            when(dense, BT * Fl),
            when(moe, BT * E),
            when(moe, BT * E),
            when(moe, BT * K),
            when(moe, BT * K),
            when(moe, 2 * BT * K + 2 * E + 1),
            when(moe, R * C),
            when(moe, R * FCet),
            when(moe, R * Het),
            when(moe, R * C),
            BTl * C};
  };
  static_assert(std::size(kBlockActivations) == 24);
  auto is_stat = [&](const std::string& n) {
    return absl::EndsWith(n, "_mean") || absl::EndsWith(n, "_rstd") || (rows_att && n == "att") ||
           IntBlockActivation(n);
  };
  // Which block tensors a recomputing block refills rather than keeps.
  auto refilled = [&](const std::string& n) {
    if (policy.recompute == Recompute::kFull) return n != "residual3";
    return policy.recompute == Recompute::kSelective && n == "att" && !rows_att;
  };
  bool any_recomputed = false;
  // Per block tensor: its largest size in a recomputing block (the shared
  // "recompute.*" scratch holds any of them).
  std::vector<int64_t> refill_numel(std::size(kBlockActivations), -1);
  // Chunk by chunk (one without an interleaved pipeline): its blocks, then
  // its input; the model's end after the last.
  const int per_chunk = slice.chunk_layers(config);
  for (int c = 0; c < slice.chunks; ++c) {
    const int64_t begin = saved_;
    for (int i = c * per_chunk; i < (c + 1) * per_chunk; ++i) {
      const int l = slice.Layer(config, i);
      const std::string b = absl::StrCat("block.", l, ".");
      const bool recomputes = policy.Recomputes(i);
      any_recomputed |= recomputes;
      const std::vector<int64_t> numel = block_numel(l);
      for (size_t k = 0; k < std::size(kBlockActivations); ++k) {
        const std::string n = kBlockActivations[k];
        if (numel[k] < 0) continue;
        if (recomputes && refilled(n)) {
          refill_numel[k] = std::max(refill_numel[k], numel[k]);
          continue;
        }
        Add(b + n, numel[k], kSaved, is_stat(n));
      }
    }
    // The first stage's embeddings, or the input received.
    Add(c == 0 ? std::string("encoded") : absl::StrCat("encoded.", c), BTl * C, kSaved);
    if (slice.last_stage && c == slice.chunks - 1) {
      Add("lnf", BT * C, kSaved);
      if (mean >= 0) Add("lnf_mean", BTl, kSaved, true);
      Add("lnf_rstd", BTl, kSaved, true);
      Add("logits", BT * Vpt, kSaved);
      Add("losses", BT, kSaved, true);
      Add("lse", BT, kSaved, true);
    }
    chunk_saved_.emplace_back(begin, saved_);
  }
  Add("proj_out", BT * std::max(C, Qt), kScratch);  // also selective recompute's atty
  Add("dresidual", BTl * C, kScratch);
  Add("dln", BT * C, kScratch);
  Add("datty", BT * Qt, kScratch);
  Add("dqkv", BT * QKVt, kScratch);
  Add("dfch", BT * FCt, kScratch);
  Add("dfch_act", BT * Ft, kScratch);
  if (policy.flash_attention && !cp) {
    Add("att_scratch", rows, kScratch, true);  // backward's row dot products
  } else {
    Add("att_scratch", att, kScratch);
  }
  if (cp) {
    Add("cp_kv", 2 * BT * KVt, kScratch);
    Add("cp_dkv", 2 * BT * KVt, kScratch);
    Add("cp_out", BT * Qt, kScratch);
    Add("cp_rows", rows, kScratch, true);
    Add("cp_scores", att, kScratch);
  }
  if (policy.sequence_parallel) {
    Add("sp_full", BT * C, kScratch);
    Add("sp_local", BTl * C, kScratch);
  }
  if (any_moe) {
    Add("moe_out", BT * C, kScratch);
    Add("moe_dxp", R * C, kScratch);
    Add("moe_dy", R * C, kScratch);
    Add("moe_dh", R * Het, kScratch);
    Add("moe_dh_pre", R * FCet, kScratch);
    Add("moe_dscores", BT * E, kScratch);
    Add("moe_dlogits", BT * E, kScratch);
    Add("moe_dgates", BT * K, kScratch);
    if (slice.ep > 1) Add("moe_xfer", R * C, kScratch);  // the exchange's staging
  }
  if (config.lora.on()) {  // LoRA's (N, rank) product and its gradient
    Add("lora_xa", BT * config.lora.rank, kScratch);
    Add("lora_g", BT * config.lora.rank, kScratch);
  }
  if (any_recomputed) {
    for (size_t k = 0; k < std::size(kBlockActivations); ++k) {
      if (refill_numel[k] >= 0) {
        const std::string n = kBlockActivations[k];
        Add("recompute." + n, refill_numel[k], kScratch, is_stat(n));
      }
    }
  }
}

int64_t ActivationTable::bytes(const std::vector<int>& chunk_slots) const {
  int64_t total = scratch_;
  for (size_t c = 0; c < chunk_slots.size() && c < chunk_saved_.size(); ++c) {
    total += chunk_slots[c] * (chunk_saved_[c].second - chunk_saved_[c].first);
  }
  return total;
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

const ActivationTensor* ActivationTable::find_block(int l, const std::string& name) const {
  if (const ActivationTensor* t = find(absl::StrCat("block.", l, ".", name))) return t;
  return find("recompute." + name);
}

}  // namespace shardtrain::model
