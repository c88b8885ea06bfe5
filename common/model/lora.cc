#include "common/model/lora.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace shardtrain::model {
namespace {

constexpr const char* kNames[kNumLoraTargets] = {"q", "k", "v", "o", "gate", "up", "down"};

}  // namespace

const char* LoraTargetName(LoraTarget t) { return kNames[t]; }

absl::StatusOr<LoraTarget> LoraTargetByName(std::string_view name) {
  for (int t = 0; t < kNumLoraTargets; ++t) {
    if (name == kNames[t]) return LoraTarget(t);
  }
  return absl::NotFoundError(absl::StrCat("unknown target \"", std::string(name),
                                          "\" (known: q, k, v, o, gate, up, down)"));
}

std::string LoraTargetList(uint32_t targets) {
  std::string out;
  for (int t = 0; t < kNumLoraTargets; ++t) {
    if ((targets >> t) & 1u) absl::StrAppend(&out, out.empty() ? "" : ", ", kNames[t]);
  }
  return out;
}

LoraSite LoraTargetSite(const ModelConfig& c, LoraTarget t) {
  const int64_t C = c.dim, Q = c.q_dim(), KV = c.kv_dim(), F = c.ffn_dim;
  const bool swiglu = c.mlp == MlpKind::kSwiGlu;
  switch (t) {
    case kLoraQ:
      return {C, Q, 0, Q + 2 * KV};
    case kLoraK:
      return {C, KV, Q, Q + 2 * KV};
    case kLoraV:
      return {C, KV, Q + KV, Q + 2 * KV};
    case kLoraO:
      return {Q, C, 0, C};
    case kLoraGate:
      return swiglu ? LoraSite{C, F, 0, 2 * F} : LoraSite{C, 0, 0, F};
    case kLoraUp:
      return swiglu ? LoraSite{C, F, F, 2 * F} : LoraSite{C, F, 0, F};
    case kLoraDown:
      return {F, C, 0, C};
  }
  return {};
}

bool LoraColumnParallel(LoraTarget t) { return t != kLoraO && t != kLoraDown; }

LoraSite LoraTargetSite(const ModelConfig& c, LoraTarget t, int tp) {
  LoraSite s = LoraTargetSite(c, t);
  if (LoraColumnParallel(t)) {
    s.out /= tp;
    s.first_col /= tp;
    s.row /= tp;
  } else {
    s.in /= tp;
  }
  return s;
}

int64_t LoraParams(const ModelConfig& c) {
  if (!c.lora.on()) return 0;
  int64_t per_block = 0;
  for (int t = 0; t < kNumLoraTargets; ++t) {
    if (!c.lora.has(LoraTarget(t))) continue;
    const LoraSite s = LoraTargetSite(c, LoraTarget(t));
    per_block += int64_t{c.lora.rank} * (s.in + s.out);
  }
  return per_block * c.layers;
}

double MatmulTrainingFlops(const ModelConfig& c, double weights, double adapters) {
  return c.lora.on() ? 4 * weights + 6 * adapters : 6 * weights;
}

absl::Status ValidateLora(const ModelConfig& c) {
  const LoraConfig& l = c.lora;
  if (l.rank < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("finetune.lora.rank: must be >= 1, got ", l.rank));
  }
  if (!(l.alpha > 0) || !std::isfinite(l.alpha)) {
    return absl::InvalidArgumentError(
        absl::StrCat("finetune.lora.alpha: must be finite and > 0, got ", l.alpha));
  }
  if (l.targets == 0 || (l.targets >> kNumLoraTargets) != 0) {
    return absl::InvalidArgumentError(
        "finetune.lora.targets: name at least one of q, k, v, o, gate, up, down");
  }
  if (c.moe.on()) {
    return absl::InvalidArgumentError(
        "finetune.lora: adapters on a model with model.moe are not supported yet");
  }
  for (int i = 0; i < kNumLoraTargets; ++i) {
    const auto t = LoraTarget(i);
    if (!l.has(t)) continue;
    const LoraSite s = LoraTargetSite(c, t);
    if (s.out == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("finetune.lora.targets: ", kNames[i], " is not a layer of model.arch ",
                       ArchName(c.arch), " (its MLP has no gate; use up and down)"));
    }
    if (l.rank > std::min(s.in, s.out)) {
      return absl::InvalidArgumentError(
          absl::StrCat("finetune.lora.rank: ", l.rank, " is larger than target ", kNames[i], "'s (",
                       s.out, ", ", s.in, ") weight allows (at most ", std::min(s.in, s.out), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::model
