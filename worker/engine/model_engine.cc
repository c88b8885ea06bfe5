#include "worker/engine/model_engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/model/lora.h"
#include "common/rng.h"
#include "worker/engine/model_engine_internal.h"

namespace shardtrain::engine {

using model::BlockTensor;
using model::ModelConfig;
using model::TensorInfo;

namespace {

// Standard normal from a 64-bit counter-based key (Box-Muller, one output).
inline float NormalFromKey(uint64_t key) {
  const uint64_t bits = SplitMix64(key);
  const double u1 = (static_cast<double>(bits >> 40) + 0.5) / 16777216.0;
  const double u2 = static_cast<double>(bits & 0xFFFFFF) / 16777216.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace

absl::Status ValidateModelEngine(const ModelConfig& config, int B, int T,
                                 const ModelEngineOptions& options) {
  if (auto s = model::ValidateModelConfig(config); !s.ok()) return s;
  if (config.lora.on()) {
    if (auto s = model::ValidateLora(config); !s.ok()) return s;
  }
  if (B < 1) return absl::InvalidArgumentError(absl::StrCat("batch size must be >= 1, got ", B));
  if (T < 1 || T > config.context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence length must be in [1, model.context=", config.context, "], got ", T));
  }
  if (options.slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("slots must be >= 1, got ", options.slots));
  }
  if (options.activations.recompute_layers == 0 || options.activations.recompute_layers < -1) {
    return absl::InvalidArgumentError(absl::StrCat("model.recompute_layers must be >= 1, got ",
                                                   options.activations.recompute_layers));
  }
  const model::ModelSlice& sl = options.slice;
  const int end = sl.end_layer(config);
  if (sl.first_layer < 0 || end > config.layers || end <= sl.first_layer || sl.chunks < 1 ||
      (sl.chunks > 1 && (sl.num_layers < 1 || sl.chunk_stride < sl.num_layers ||
                         sl.Layer(config, sl.total_layers(config) - 1) >= config.layers))) {
    return absl::InvalidArgumentError(
        absl::StrCat("layers [", sl.first_layer, ", ", end, ") in ", sl.chunks, " chunk(s) ",
                     sl.chunk_stride, " layers apart: outside the model's ", config.layers));
  }
  if (!options.chunk_slots.empty()) {
    bool ok = static_cast<int>(options.chunk_slots.size()) == sl.chunks;
    for (int n : options.chunk_slots) ok = ok && n >= 1;
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("chunk_slots: ", options.chunk_slots.size(),
                                                     " entries for ", sl.chunks,
                                                     " chunks; each must be >= 1"));
    }
  }
  const int tp = sl.tp;
  if (tp < 1 || sl.tp_rank < 0 || sl.tp_rank >= tp || config.heads % tp != 0 ||
      config.kv_heads % tp != 0 || config.ffn_dim % tp != 0 || config.padded_vocab % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.tp: ", tp, " (rank ", sl.tp_rank, ") must divide model.heads ",
                     config.heads, ", model.kv_heads ", config.kv_heads, ", the MLP width ",
                     config.ffn_dim, " and the padded vocabulary ", config.padded_vocab));
  }
  if (config.moe.on()) {
    const int He = config.moe.expert_ffn_dim, Fs = config.mlp_dim(config.layers - 1);
    if (He % tp != 0 || Fs % tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat("parallel.tp: ", tp,
                                                     " must divide model.moe.expert_ffn_dim ", He,
                                                     " and the shared experts' width ", Fs));
    }
  }
  if (sl.ep < 1 || sl.ep_rank < 0 || sl.ep_rank >= sl.ep ||
      (sl.ep > 1 && (!config.moe.on() || config.moe.experts % sl.ep != 0))) {
    return absl::InvalidArgumentError(absl::StrCat("parallel.ep: ", sl.ep, " (rank ", sl.ep_rank,
                                                   ") must divide model.moe.experts ",
                                                   config.moe.experts));
  }
  if (sl.ep > 1 &&
      (options.ep == nullptr || options.ep->size() != sl.ep || options.ep->rank() != sl.ep_rank)) {
    return absl::InvalidArgumentError("expert-parallel slice without its ep group");
  }
  if (options.activations.sequence_parallel && (tp < 2 || (int64_t{B} * T) % tp != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.sequence_parallel needs parallel.tp > 1 dividing the micro-batch's B·T = ", B,
        "·", T, " rows; tp is ", tp));
  }
  if (tp > 1 &&
      (options.tp == nullptr || options.tp->size() != tp || options.tp->rank() != sl.tp_rank)) {
    return absl::InvalidArgumentError("tensor-parallel slice without its tp group");
  }
  const int cp = options.activations.cp;
  if (cp < 1 || (cp > 1 && (options.cp == nullptr || options.cp->size() != cp))) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.cp: ", cp, " without its context-parallel group of ", cp, " ranks"));
  }
  if (cp > 1 && (int64_t{T} * cp > config.context || T % 2 != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.cp: ", cp, " ranks of ", T, " tokens each make sequences of ",
                     int64_t{T} * cp, " tokens, which must be within model.context ",
                     config.context, " and divisible by 2 × ", cp));
  }
  return absl::OkStatus();
}

ModelEngine::ModelEngine(const ModelConfig& config, int B, int T, const ModelEngineOptions& options,
                         DataType compute)
    : layout_(config, options.slice),
      whole_(config),
      base_(model::BaseConfig(config), options.slice),
      base_whole_(model::BaseConfig(config)),
      tp_(options.slice.tp > 1 ? options.tp : nullptr),
      cp_(options.activations.cp > 1 ? options.cp : nullptr),
      ep_(options.slice.ep > 1 ? options.ep : nullptr),
      B_(B),
      T_(T),
      policy_(options.activations),
      sp_(options.activations.sequence_parallel && options.slice.tp > 1),
      table_(config, B, T, options.slice, compute, options.activations),
      rotary_(model::RotaryTable(config)),
      moe_(options.moe) {
  const int64_t BT = int64_t{B} * T;
  if (cp_ != nullptr) {
    for (int r = 0; r < cp_->size(); ++r) {
      cp_pos_.push_back(model::ContextChunkPositions(T * cp_->size(), cp_->size(), r));
    }
  }
  chunk_slots_ = options.chunk_slots;
  if (chunk_slots_.empty()) chunk_slots_.assign(options.slice.chunks, options.slots);
  const int per_chunk = layout_.num_layers() / chunks();
  for (int c = 0; c < chunks(); ++c) {
    for (int k = 0; k < chunk_slots_[c]; ++k) {
      SlotActs& s = slots_.emplace_back();
      s.chunk = c;
      s.layers.resize(per_chunk);
      s.tokens.assign(BT, 0);
      s.targets.assign(BT, 0);
    }
  }
}

void ModelEngine::BindActivations(char* base) {
  char* const scratch = base + (activation_alloc_bytes() - table_.scratch_bytes());
  // A slot of chunk c holds the table's saved bytes [first, second) of
  // chunk_saved(c), at `saved`: tensor t at saved + t.offset - first.
  std::pair<int64_t, int64_t> range{0, 0};
  auto at = [&](char* saved, const model::ActivationTensor* t) -> void* {
    if (t == nullptr) return nullptr;  // not on this stage, or not in this recipe
    return t->kind == model::ActivationKind::kSaved ? saved + (t->offset - range.first)
                                                    : scratch + t->offset;
  };
  auto f32 = [](void* p) { return static_cast<float*>(p); };
  char* saved = base;
  const int per_chunk = layout_.num_layers() / chunks();
  for (SlotActs& s : slots_) {
    range = table_.chunk_saved(s.chunk);
    for (int j = 0; j < per_chunk; ++j) {
      const int i = s.chunk * per_chunk + j, l = layout_.layer(i);
      // Saved in the slot, or the shared scratch a recomputing block
      // refills; null where the recipe keeps none.
      auto block = [&](const char* name) { return at(saved, table_.find_block(l, name)); };
      LayerActs& a = s.layers[j];
      a.ln1 = block("ln1");
      a.ln1_mean = f32(block("ln1_mean"));
      a.ln1_rstd = f32(block("ln1_rstd"));
      a.qkv = block("qkv");
      a.qk_pre = block("qk_pre");
      a.qk_rstd = f32(block("qk_rstd"));
      a.atty = block("atty");
      a.att = block("att");
      a.residual2 = block("residual2");
      a.ln2 = block("ln2");
      a.ln2_mean = f32(block("ln2_mean"));
      a.ln2_rstd = f32(block("ln2_rstd"));
      a.fch = block("fch");
      a.fch_act = block("fch_act");
      a.router_logits = block("router_logits");
      a.router_scores = block("router_scores");
      a.router_gates = block("router_gates");
      a.router_experts = static_cast<int*>(block("router_experts"));
      a.moe_index = static_cast<int*>(block("moe_index"));
      a.moe_xp = block("moe_xp");
      a.moe_h_pre = block("moe_h_pre");
      a.moe_h = block("moe_h");
      a.moe_y = block("moe_y");
      a.residual3 = block("residual3");
      a.recompute = policy_.Recomputes(i);
    }
    auto take = [&](const std::string& name) { return at(saved, table_.find(name)); };
    s.encoded = take(s.chunk == 0 ? std::string("encoded") : absl::StrCat("encoded.", s.chunk));
    if (PipelineLast(s)) {
      s.lnf = take("lnf");
      s.lnf_mean = f32(take("lnf_mean"));
      s.lnf_rstd = f32(take("lnf_rstd"));
      s.logits = take("logits");
      s.losses = f32(take("losses"));
      s.lse = f32(take("lse"));
    }
    saved += range.second - range.first;
  }
  auto take = [&](const char* name) { return at(nullptr, table_.find(name)); };
  proj_out_ = take("proj_out");
  dresidual_ = take("dresidual");
  dln_ = take("dln");
  datty_ = take("datty");
  dqkv_ = take("dqkv");
  dfch_ = take("dfch");
  dfch_act_ = take("dfch_act");
  att_scratch_ = take("att_scratch");
  sp_full_ = take("sp_full");
  sp_local_ = take("sp_local");
  cp_kv_ = take("cp_kv");
  cp_dkv_ = take("cp_dkv");
  cp_out_ = take("cp_out");
  cp_rows_ = f32(take("cp_rows"));
  cp_scores_ = take("cp_scores");
  moe_out_ = take("moe_out");
  moe_dxp_ = take("moe_dxp");
  moe_dy_ = take("moe_dy");
  moe_dh_ = take("moe_dh");
  moe_dh_pre_ = take("moe_dh_pre");
  moe_dscores_ = take("moe_dscores");
  moe_dlogits_ = take("moe_dlogits");
  moe_dgates_ = take("moe_dgates");
  moe_xfer_ = take("moe_xfer");
  lora_xa_ = take("lora_xa");
  lora_g_ = take("lora_g");
}

void ModelEngine::InitSliceHost(uint64_t seed, size_t begin, size_t end, float* out,
                                ThreadPool* pool) const {
  // Each local element gets its value in the whole model: a slice starts
  // exactly where one rank would.
  for (const model::FlatRun& r : layout_.GlobalRuns(begin, end)) {
    InitGlobal(seed, r.global, r.global + r.count, out + (r.local - begin), pool);
  }
}

void ModelEngine::InitFrozenHost(uint64_t seed, size_t begin, size_t end, float* out,
                                 ThreadPool* pool) const {
  for (const model::FlatRun& r : base_.GlobalRuns(begin, end)) {
    InitGlobalOf(base_whole_, seed, r.global, r.global + r.count, out + (r.local - begin), pool);
  }
}

void ModelEngine::InitGlobalOf(const model::ParamLayout& whole, uint64_t seed, size_t begin,
                               size_t end, float* out, ThreadPool* pool) const {
  const ModelConfig& cfg = layout_.config();
  const float residual_std = 0.02f / std::sqrt(2.0f * cfg.layers);
  const auto& tensors = whole.tensors();
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorInfo& t = tensors[k];
    if (t.frozen) continue;  // InitFrozen's
    // The part [i0, i1) of this tensor inside [begin, end).
    const size_t i0 = std::max(begin, t.offset) - t.offset;
    const size_t i1 = std::min(end, t.offset + t.numel);
    if (t.offset + i0 >= i1) continue;
    const size_t stop = i1 - t.offset;
    float* w = out + (t.offset + i0 - begin);  // w[i - i0]: element i of the tensor
    if (t.shape.size() == 1) {  // biases 0; norm weights (every 1-D weight: ln*, q/k norms) 1
      std::fill(w, w + (stop - i0), absl::EndsWith(t.name, "weight") ? 1.0f : 0.0f);
      continue;
    }
    if (absl::EndsWith(t.name, ".B")) {  // a LoRA adapter's B: 0, the model unchanged at first
      std::fill(w, w + (stop - i0), 0.0f);
      continue;
    }
    if (absl::EndsWith(t.name, ".A")) {  // its A: uniform in ±1/sqrt(in) (PEFT's kaiming_uniform)
      const float bound = 1.0f / std::sqrt(static_cast<float>(t.shape[1]));
      const uint64_t key = SplitMix64(seed ^ SplitMix64(k + 1));
      for (size_t i = i0; i < stop; ++i) {
        const uint64_t bits = SplitMix64(key + i * 0x9E3779B97F4A7C15ull);
        const double u = (static_cast<double>(bits >> 11) + 0.5) / 9007199254740992.0;
        w[i - i0] = static_cast<float>((2.0 * u - 1.0) * bound);
      }
      continue;
    }
    // The projections back into the residual stream: attention's, the
    // MLP's and every expert's.
    const bool residual_proj = absl::EndsWith(t.name, ".proj.weight");
    const float std_dev = residual_proj ? residual_std : 0.02f;
    // wte and an untied lm_head: only the first vocab rows are real; padded
    // rows stay 0.
    const bool vocab_rows =
        static_cast<int>(k) == whole.wte() || static_cast<int>(k) == whole.lm_head();
    const size_t n = vocab_rows ? static_cast<size_t>(cfg.vocab) * cfg.dim : t.numel;
    const uint64_t key = SplitMix64(seed ^ SplitMix64(k + 1));
    const size_t real_end = std::min(n, stop);
    if (i0 < real_end) {
      pool->ParallelFor(
          static_cast<int64_t>(real_end - i0),
          [&](int64_t j0, int64_t j1) {
            for (int64_t j = j0; j < j1; ++j) {
              const uint64_t i = i0 + static_cast<uint64_t>(j);
              w[j] = std_dev * NormalFromKey(key + i * 0x9E3779B97F4A7C15ull);
            }
          },
          4096);
    }
    if (std::max(n, i0) < stop) std::fill(w + (std::max(n, i0) - i0), w + (stop - i0), 0.0f);
  }
}

void ModelEngine::Fail(const char* what) const {
  std::fprintf(stderr, "%s\n", what);
  std::abort();
}

void ModelEngine::CopyToTpRegionBackward(void* dinput, int64_t n) {
  if (tp_ != nullptr && tp_->size() > 1) TpAllReduceSum(dinput, n);
}

void ModelEngine::ReduceFromTpRegionForward(void* output, int64_t n) {
  if (tp_ != nullptr && tp_->size() > 1) TpAllReduceSum(output, n);
}

const void* ModelEngine::GatherFromSequenceRegionForward(const void* local, int64_t n) {
  if (!sp_) return local;
  TpAllGather(sp_full_, local, n);
  return sp_full_;
}

void ModelEngine::GatherFromSequenceRegionBackward(void* dlocal, void* dfull, int64_t n) {
  if (sp_) {
    TpReduceScatter(dlocal, dfull, n);
  } else {
    CopyToTpRegionBackward(dfull, n);  // dlocal == dfull: the whole rows, summed in place
  }
}

const void* ModelEngine::ReduceScatterToSequenceRegionBackward(const void* dlocal, int64_t n) {
  if (!sp_) return dlocal;
  TpAllGather(sp_full_, dlocal, n);
  return sp_full_;
}

float ModelEngine::StageForward(int slot, const int* tokens, const int* targets, const float* input,
                                int b, int t) {
  const ModelConfig& cfg = config();
  const int C = cfg.dim, V = cfg.vocab;
  const int N = b * t;
  const float expected_backward = expected_backward_;  // for this forward only
  expected_backward_ = 0.0f;
  // Preconditions (programming errors, not data errors: the token readers
  // and Generate() validate their input): fail loudly, never corrupt memory.
  if (slot < 0 || slot >= slots() || b < 1 || b > B_ || t < 1 || t > T_) {
    std::fprintf(stderr,
                 "ModelEngine::StageForward: (slot=%d, b=%d, t=%d) outside (%d, 1..%d, 1..%d)\n",
                 slot, b, t, slots(), B_, T_);
    std::abort();
  }
  SlotActs& s = slots_[slot];
  const bool first = PipelineFirst(s), last = PipelineLast(s);
  if ((first && tokens == nullptr) || (!first && input == nullptr)) {
    Fail("ModelEngine::StageForward: the first stage reads tokens, the others input");
  }
  for (int i = 0; i < N; ++i) {
    if ((tokens != nullptr && (tokens[i] < 0 || tokens[i] >= V)) ||
        (targets != nullptr && (targets[i] < 0 || targets[i] >= V))) {
      std::fprintf(stderr, "ModelEngine::StageForward: token/target at %d outside [0, %d)\n", i, V);
      std::abort();
    }
  }
  if (cp_ != nullptr && t != T_) {
    std::fprintf(stderr,
                 "ModelEngine::StageForward: under context parallelism every micro-batch holds "
                 "the rank's %d tokens of each sequence, got %d\n",
                 T_, t);
    std::abort();
  }
  s.b = b;
  s.t = t;
  s.forwarded = last ? targets != nullptr : true;
  s.dlogits_scale = 0.0f;
  if (tokens != nullptr) std::copy(tokens, tokens + N, s.tokens.begin());
  if (targets != nullptr) std::copy(targets, targets + N, s.targets.begin());

  if (first) {
    UnitScope use(*this, layout_.wte());
    EncoderForward(s);
  } else {
    CopyFromFloat32(s.encoded, input, int64_t{LocalRows(N)} * C);
  }
  const void* residual = s.encoded;
  const int first_layer = s.chunk * static_cast<int>(s.layers.size());
  for (size_t i = 0; i < s.layers.size(); ++i) {
    BlockForward(layout_.layer(first_layer + static_cast<int>(i)), s.layers[i], residual, b, t);
    residual = s.layers[i].residual3;
  }
  if (!last) return 0.0f;
  // The LM head computes only this rank's real vocabulary columns (lnf
  // enters the tp region: CopyToTpRegion, an identity). A tied head reads
  // the embeddings unit; an untied one is in the final unit with the norm.
  const bool tied = cfg.tie_embeddings;
  {
    // Under sequence parallelism on this rank's rows, then gathered: the LM
    // head reads every row.
    UnitScope use(*this, layout_.lnf_w());
    const int Nl = LocalRows(N);
    void* lnf = sp_ ? sp_local_ : s.lnf;
    NormForward(lnf, s.lnf_mean, s.lnf_rstd, residual, layout_.lnf_w(), layout_.lnf_b(), Nl);
    if (sp_) TpAllGather(s.lnf, lnf, int64_t{Nl} * C);
    if (!tied) LmHeadForward(s);
  }
  if (tied) {
    UnitScope use(*this, layout_.lm_head());
    LmHeadForward(s);
  }
  if (targets == nullptr) return 0.0f;
  // The backward's dloss, as StageBackward computes it: with an announced
  // backward the device may turn the logits into their gradient now.
  const float dloss = expected_backward / static_cast<float>(N);
  double loss_sum = 0;
  if (expected_backward != 0.0f && tp_ == nullptr &&
      CrossEntropyForwardBackward(s, dloss, &loss_sum)) {
    s.dlogits_scale = dloss;
  } else {
    loss_sum = CrossEntropyForward(s);
  }
  return static_cast<float>(loss_sum / N);
}

void ModelEngine::StageBackward(int slot, float loss_scale, const float* doutput) {
  struct InBackward {  // for UnitScope's OnUnitUse, until this returns
    explicit InBackward(bool& flag) : flag_(flag) { flag_ = true; }
    ~InBackward() { flag_ = false; }
    bool& flag_;
  } in_backward(in_backward_);
  if (slot < 0 || slot >= slots() || !slots_[slot].forwarded ||
      (!PipelineLast(slots_[slot]) && doutput == nullptr)) {
    // precondition: a forward (with targets on the last stage) of this
    // slot, not yet backpropagated; the gradient of its output elsewhere.
    std::fprintf(stderr,
                 "ModelEngine::StageBackward: no preceding Forward with targets of slot %d to "
                 "backpropagate\n",
                 slot);
    std::abort();
  }
  SlotActs& s = slots_[slot];
  const int C = config().dim, b = s.b, t = s.t, N = b * t, Nl = LocalRows(N);
  const int64_t NC = int64_t{N} * C, NlC = int64_t{Nl} * C;
  loss_scale_ = loss_scale;
  if (PipelineLast(s)) {
    const float dloss = loss_scale / static_cast<float>(N);
    if (s.dlogits_scale == 0.0f) {
      CrossEntropyBackward(s, dloss);
    } else if (s.dlogits_scale != dloss) {  // precondition: ExpectBackward's scale
      std::fprintf(stderr,
                   "ModelEngine::StageBackward: slot %d's forward computed the loss's gradient "
                   "for dloss %g (ExpectBackward), the backward asks for %g\n",
                   slot, s.dlogits_scale, dloss);
      std::abort();
    }
    s.dlogits_scale = 0.0f;
    Zero(dresidual_, NlC);
    Zero(dln_, NC);
    void* dlnf = sp_ ? sp_local_ : dln_;
    auto head_backward = [&] {
      LmHeadBackward(s, dln_);
      GatherFromSequenceRegionBackward(dlnf, dln_, NlC);
    };
    auto norm_backward = [&] {
      NormBackward(dresidual_, dlnf, LastOutput(s), s.lnf_mean, s.lnf_rstd, layout_.lnf_w(),
                   layout_.lnf_b(), Nl);
    };
    if (config().tie_embeddings) {  // the head's unit (embeddings), then the final one
      {
        UnitScope use(*this, layout_.lm_head());
        head_backward();
      }
      UnitScope use(*this, layout_.lnf_w());
      norm_backward();
    } else {  // both in the final unit
      UnitScope use(*this, layout_.lnf_w());
      head_backward();
      norm_backward();
    }
    if (grads_ready_) grads_ready_(layout_.unit_offset(layout_.lnf_w()));
  } else {
    CopyFromFloat32(dresidual_, doutput, NlC);
  }
  const int first_layer = s.chunk * static_cast<int>(s.layers.size());
  for (int i = static_cast<int>(s.layers.size()) - 1; i >= 0; --i) {
    const int l = layout_.layer(first_layer + i);
    BlockBackward(l, s.layers[i], i == 0 ? s.encoded : s.layers[i - 1].residual3, b, t);
    if (grads_ready_) grads_ready_(layout_.unit_offset(layout_.block_tensor(l, BlockTensor(0))));
  }
  has_input_grad_ = !PipelineFirst(s);
  if (!has_input_grad_) {
    EncoderBackward(s, ReduceScatterToSequenceRegionBackward(dresidual_, NlC));
  }
  s.forwarded = false;
  // The embeddings unit is final once chunk 0's backward is (a tied head's
  // gradient came in the last chunk's, before it).
  if (layout_.slice().has_embeddings(config()) && s.chunk == 0 && grads_ready_) grads_ready_(0);
}

}  // namespace shardtrain::engine
