#include "common/model/param_layout.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/model/lora.h"

namespace shardtrain::model {

namespace {

constexpr uint64_t kFnvBasis = 1469598103934665603ull;

// Mixes one tensor's name, shape and offset into an FNV-1a hash: the
// fingerprint of a layout is this over its tensors in order.
void MixTensor(uint64_t& h, const std::string& name, const std::vector<int64_t>& shape,
               uint64_t offset) {
  auto mix = [&h](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  mix(name.data(), name.size());
  for (int64_t d : shape) mix(&d, sizeof d);
  mix(&offset, sizeof offset);
}

}  // namespace

ParamLayout::ParamLayout(const ModelConfig& config, const ModelSlice& slice)
    : config_(config), slice_(slice) {
  const int64_t C = config.dim, Vp = config.padded_vocab, KV = config.kv_dim();
  const int64_t Q = config.q_dim(), hs = config.head_dim();
  const int64_t F = config.ffn_dim;
  const bool bias = config.bias, layer_norm = config.norm == NormKind::kLayerNorm;
  const int tp = slice.tp;
  num_layers_ = slice.total_layers(config);
  // The tensor being visited, in the whole layout: offset, index; and the
  // whole layout's fingerprint, as Fingerprint() computes it.
  size_t global_offset = 0, global_frozen = 0;
  int global_index = 0;
  const bool lora = config.lora.on();
  global_fingerprint_ = kFnvBasis;
  auto unit = [&](std::string name) {
    UnitInfo u;
    u.name = std::move(name);
    u.offset = num_params_;
    u.first_tensor = static_cast<int>(tensors_.size());
    units_.push_back(std::move(u));
  };
  // Visits a tensor of the whole model; keeps its tp-local part when `keep`
  // and returns its index (-1 when not kept).
  // Under LoRA every tensor but the adapters is frozen: counted in the
  // frozen buffer's offsets, left out of the fingerprints.
  auto add = [&](bool keep, std::string name, std::vector<int64_t> shape, TpSplit split,
                 std::vector<int64_t> parts = {}, bool adapter = false) -> int {
    const bool frozen = lora && !adapter;
    size_t global_numel = 1;
    for (int64_t d : shape) global_numel *= static_cast<size_t>(d);
    size_t& counter = frozen ? global_frozen : global_offset;
    if (!frozen) MixTensor(global_fingerprint_, name, shape, global_offset);
    const int index = global_index++;
    const size_t offset = counter;
    counter += global_numel;
    if (!keep) return -1;
    global_offsets_.push_back(offset);
    TensorInfo t;
    t.name = std::move(name);
    t.decay = shape.size() == 2;  // see TensorInfo::decay
    t.global = index;
    t.split = tp > 1 ? split : TpSplit::kNone;
    t.replicated = tp > 1 && split == TpSplit::kNone;
    if (t.split == TpSplit::kCols) {
      shape[1] /= tp;
    } else if (t.split != TpSplit::kNone) {
      shape[0] /= tp;
    }
    if (t.split == TpSplit::kRowParts) t.parts = std::move(parts);
    t.numel = 1;
    for (int64_t d : shape) t.numel *= static_cast<size_t>(d);
    t.shape = std::move(shape);
    t.frozen = frozen;
    t.offset = frozen ? num_frozen_ : num_params_;
    t.unit = static_cast<int>(units_.size()) - 1;
    (frozen ? num_frozen_ : num_params_) += t.numel;
    if (!frozen) units_.back().numel += t.numel;
    units_.back().num_tensors++;
    tensors_.push_back(std::move(t));
    return static_cast<int>(tensors_.size()) - 1;
  };
  const bool emb = slice.has_embeddings(config);
  if (emb) unit("embeddings");
  wte_ = add(emb, "wte", {Vp, C}, TpSplit::kRows);
  if (config.positions == PositionKind::kLearned) {
    wpe_ = add(emb, "wpe", {config.context, C}, TpSplit::kNone);
  }
  // The block's tensors of this recipe, in the order above: a dense
  // block's (moe 0) and an MoE block's (moe 1), with the dense MLP of width
  // Fk (none when 0).
  struct BlockRow {
    BlockTensor id;
    const char* name;
    bool present;
    std::vector<int64_t> shape;
    TpSplit split;
    std::vector<int64_t> parts;
  };
  const std::vector<int64_t> qkv_parts = {Q, KV, KV};
  const bool swiglu = config.mlp == MlpKind::kSwiGlu;
  auto fc_parts = [&](int64_t h) {
    return swiglu ? std::vector<int64_t>{h, h} : std::vector<int64_t>{};
  };
  const TpSplit fc_split = swiglu ? TpSplit::kRowParts : TpSplit::kRows;
  auto block_rows = [&](bool moe) -> std::vector<BlockRow> {
    const int64_t Fk = moe ? config.mlp_dim(config.layers - 1) : F, FCk = config.fc_rows(Fk);
    const bool mlp = Fk > 0;
    return {
        {kLn1W, "ln1.weight", true, {C}, TpSplit::kNone, {}},
        {kLn1B, "ln1.bias", layer_norm, {C}, TpSplit::kNone, {}},
        {kQkvW, "attn.qkv.weight", true, {Q + 2 * KV, C}, TpSplit::kRowParts, qkv_parts},
        {kQkvB, "attn.qkv.bias", bias, {Q + 2 * KV}, TpSplit::kRowParts, qkv_parts},
        {kQNormW, "attn.q_norm.weight", config.qk_norm, {hs}, TpSplit::kNone, {}},
        {kKNormW, "attn.k_norm.weight", config.qk_norm, {hs}, TpSplit::kNone, {}},
        {kAttnProjW, "attn.proj.weight", true, {C, Q}, TpSplit::kCols, {}},
        {kAttnProjB, "attn.proj.bias", bias, {C}, TpSplit::kNone, {}},
        {kLn2W, "ln2.weight", true, {C}, TpSplit::kNone, {}},
        {kLn2B, "ln2.bias", layer_norm, {C}, TpSplit::kNone, {}},
        {kFcW, "mlp.fc.weight", mlp, {FCk, C}, fc_split, fc_parts(Fk)},
        {kFcB, "mlp.fc.bias", mlp && bias, {FCk}, fc_split, fc_parts(Fk)},
        {kFcProjW, "mlp.proj.weight", mlp, {C, Fk}, TpSplit::kCols, {}},
        {kFcProjB, "mlp.proj.bias", mlp && bias, {C}, TpSplit::kNone, {}},
        {kRouterW, "mlp.router.weight", moe, {config.moe.experts, C}, TpSplit::kNone, {}},
        {kRouterB,
         "mlp.router.bias",
         moe && config.moe.router_bias,
         {config.moe.experts},
         TpSplit::kNone,
         {}},
    };
  };
  const std::vector<BlockRow> rows[2] = {block_rows(false), block_rows(true)};
  for (int kind = 0; kind < 2; ++kind) {
    if (rows[kind].size() != kNumBlockTensors) std::abort();  // a row per BlockTensor
    per_block_[kind] = 0;
    for (const BlockRow& r : rows[kind]) {
      block_index_[kind][r.id] = r.present ? per_block_[kind]++ : -1;
    }
  }
  // The experts' tensors, kind by kind (each kind's experts consecutive).
  const int64_t He = config.moe.expert_ffn_dim, FCe = config.fc_rows(static_cast<int>(He));
  const BlockRow expert_rows[] = {
      {kLn1W, "fc.weight", true, {FCe, C}, fc_split, fc_parts(He)},
      {kLn1W, "fc.bias", bias, {FCe}, fc_split, fc_parts(He)},
      {kLn1W, "proj.weight", true, {C, He}, TpSplit::kCols, {}},
      {kLn1W, "proj.bias", bias, {C}, TpSplit::kNone, {}},
  };
  static_assert(sizeof expert_rows / sizeof expert_rows[0] == kNumExpertTensors);
  int kinds = 0;
  for (int t = 0; t < kNumExpertTensors; ++t)
    expert_index_[t] = expert_rows[t].present ? kinds++ : -1;
  const int E = config.moe.experts;
  local_experts_ = config.moe.on() ? slice.local_experts(config) : 0;
  const int e0 = config.moe.on() ? slice.first_expert(config) : 0;
  for (int l = 0; l < config.layers; ++l) {
    const bool keep = slice.LocalLayer(config, l) >= 0;
    const bool moe = config.moe_layer(l);
    const std::string p = absl::StrCat("block.", l, ".");
    if (keep) {
      block_first_.push_back(static_cast<int>(tensors_.size()));
      unit(absl::StrCat("block.", l));
    }
    for (const BlockRow& r : rows[moe]) {
      if (r.present) add(keep, p + r.name, r.shape, r.split, r.parts);
    }
    for (const BlockRow& r : expert_rows) {
      if (!moe || !r.present) continue;
      for (int e = 0; e < E; ++e) {
        const bool mine = e >= e0 && e < e0 + local_experts_;
        add(keep && mine, absl::StrCat(p, "mlp.experts.", e, ".", r.name), r.shape, r.split,
            r.parts);
      }
    }
    if (!lora) continue;
    if (keep) lora_first_.push_back(static_cast<int>(tensors_.size()));
    for (int t = 0, slot = 0; t < kNumLoraTargets; ++t) {
      if (!config.lora.has(LoraTarget(t))) continue;
      lora_slot_[t] = slot++;
      const LoraSite site = LoraTargetSite(config, LoraTarget(t));
      const std::string name = absl::StrCat(p, "lora.", LoraTargetName(LoraTarget(t)), ".");
      // The base weight's split: a column-parallel target's B by rows, a
      // row-parallel one's A by columns; the other whole on every tp rank.
      const bool column = LoraColumnParallel(LoraTarget(t));
      add(keep, name + "A", {config.lora.rank, site.in}, column ? TpSplit::kNone : TpSplit::kCols,
          {}, true);
      add(keep, name + "B", {site.out, config.lora.rank}, column ? TpSplit::kRows : TpSplit::kNone,
          {}, true);
    }
  }
  const bool last = slice.last_stage;
  if (last) unit("final");
  lnf_w_ = add(last, "lnf.weight", {C}, TpSplit::kNone);
  if (layer_norm) lnf_b_ = add(last, "lnf.bias", {C}, TpSplit::kNone);
  if (config.tie_embeddings) {
    lm_head_ = last ? wte_ : -1;
  } else {
    lm_head_ = add(last, "lm_head", {Vp, C}, TpSplit::kRows);
  }
  global_num_params_ = global_offset;
}

std::vector<FlatRun> ParamLayout::GlobalRuns(size_t begin, size_t end) const {
  std::vector<FlatRun> runs;
  auto emit = [&](size_t local, size_t global, size_t count) {
    // Clip to [begin, end).
    const size_t lo = std::max(local, begin), hi = std::min(local + count, end);
    if (lo >= hi) return;
    global += lo - local;
    if (!runs.empty() && runs.back().local + runs.back().count == lo &&
        runs.back().global + runs.back().count == global) {
      runs.back().count += hi - lo;
    } else {
      runs.push_back({lo, global, hi - lo});
    }
  };
  const int tp = slice_.tp, r = slice_.tp_rank;
  for (size_t k = 0; k < tensors_.size(); ++k) {
    const TensorInfo& t = tensors_[k];
    if (t.frozen || t.offset + t.numel <= begin) continue;
    if (t.offset >= end) break;
    const size_t g = global_offsets_[k];
    switch (t.split) {
      case TpSplit::kNone:
        emit(t.offset, g, t.numel);
        break;
      case TpSplit::kRows:  // rows [r·R, (r+1)·R) of R·tp
        emit(t.offset, g + r * t.numel, t.numel);
        break;
      case TpSplit::kRowParts: {  // rows [r·R_j, (r+1)·R_j) of each part j of R_j·tp rows
        const size_t cols = t.shape.size() > 1 ? static_cast<size_t>(t.shape[1]) : 1;
        size_t local = t.offset, global = g;
        for (int64_t rows : t.parts) {
          const size_t part = static_cast<size_t>(rows) / tp * cols;  // local elements
          emit(local, global + r * part, part);
          local += part;
          global += part * tp;
        }
        break;
      }
      case TpSplit::kCols: {  // columns [r·I, (r+1)·I) of I·tp, row by row
        const size_t rows = static_cast<size_t>(t.shape[0]), cols = static_cast<size_t>(t.shape[1]);
        for (size_t i = 0; i < rows; ++i) {
          emit(t.offset + i * cols, g + i * cols * tp + r * cols, cols);
        }
        break;
      }
    }
  }
  return runs;
}

absl::StatusOr<int> ParamLayout::FindTensor(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].name == name) return static_cast<int>(i);
  }
  return absl::NotFoundError(absl::StrCat("no parameter tensor '", name, "'"));
}

uint64_t ParamLayout::Fingerprint() const {
  uint64_t h = kFnvBasis;
  for (const TensorInfo& t : tensors_) {
    if (!t.frozen) MixTensor(h, t.name, t.shape, t.offset);
  }
  return h;
}

std::vector<std::pair<size_t, size_t>> ParamLayout::ReplicaRanges() const {
  std::vector<std::pair<size_t, size_t>> out;
  auto add = [&](size_t begin, size_t end) {
    if (!out.empty() && out.back().second == begin) {
      out.back().second = end;
    } else {
      out.emplace_back(begin, end);
    }
  };
  const bool tied_copy = slice_.has_embeddings(config_) && !slice_.first_stage;
  for (const TensorInfo& t : tensors_) {
    if (t.frozen) continue;
    if ((tied_copy && t.unit == 0) || (t.replicated && slice_.tp_rank > 0)) {
      add(t.offset, t.offset + t.numel);
    }
  }
  return out;
}

std::vector<std::pair<size_t, size_t>> ParamLayout::TpPartialRanges(bool sequence_parallel) const {
  std::vector<std::pair<size_t, size_t>> out;
  auto add = [&](int tensor) {
    const TensorInfo& t = tensors_[tensor];
    if (t.frozen) return;
    if (!out.empty() && out.back().second == t.offset) {
      out.back().second = t.offset + t.numel;
    } else {
      out.emplace_back(t.offset, t.offset + t.numel);
    }
  };
  for (int i = 0; i < num_layers_; ++i) {
    const int l = slice_.Layer(config_, i);
    for (BlockTensor bt : {kLn1W, kLn1B, kQNormW, kKNormW, kLn2W, kLn2B}) {
      const bool qk = bt == kQNormW || bt == kKNormW;
      if (block_tensor(l, bt) >= 0 && (qk ? slice_.tp > 1 : sequence_parallel)) {
        add(block_tensor(l, bt));
      }
    }
  }
  // The adapters every tp rank holds whole (lora.h: LoraColumnParallel)
  // get a partial gradient on each: a column-parallel target's A (from its
  // rank's rows of B), a row-parallel one's B (from its rank's columns of
  // A).
  if (slice_.tp > 1 && config_.lora.on()) {
    for (int i = 0; i < num_layers_; ++i) {
      const int l = slice_.Layer(config_, i);
      for (int t = 0; t < kNumLoraTargets; ++t) {
        const int A = lora_tensor(l, LoraTarget(t), false);
        if (A >= 0) add(LoraColumnParallel(LoraTarget(t)) ? A : A + 1);
      }
    }
  }
  if (slice_.last_stage && sequence_parallel) {
    add(lnf_w());
    if (lnf_b() >= 0) add(lnf_b());
  }
  return out;
}

std::vector<std::pair<size_t, size_t>> ParamLayout::ExpertRanges() const {
  std::vector<std::pair<size_t, size_t>> out;
  for (int i = 0; i < num_layers_; ++i) {
    const int l = slice_.Layer(config_, i);
    if (!config_.moe_layer(l) || local_experts_ == 0 || config_.lora.on()) continue;
    // The experts' tensors close the block: from the first kind's first
    // expert to the block's end.
    int first = -1;
    for (int t = 0; t < kNumExpertTensors && first < 0; ++t) {
      first = expert_tensor(l, ExpertTensor(t), 0);
    }
    const UnitInfo& unit = units_[tensors_[first].unit];
    out.emplace_back(tensors_[first].offset, unit.offset + unit.numel);
  }
  return out;
}

uint64_t ParamLayout::GlobalFingerprint() const { return global_fingerprint_; }

std::vector<TensorInfo> TrainedTensors(const ParamLayout& layout) {
  std::vector<TensorInfo> out;
  for (const TensorInfo& t : layout.tensors()) {
    if (!t.frozen) out.push_back(t);
  }
  return out;
}

}  // namespace shardtrain::model
