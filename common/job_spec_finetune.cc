// The job spec's finetune section (job_spec.h: FinetuneSpec): LoRA adapters
// on a frozen model, and how that model is held.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/job_spec_internal.h"
#include "common/job_spec_read.h"
#include "common/model/lora.h"
#include "common/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace shardtrain {
namespace spec_read {

namespace si = spec_internal;

absl::Status ParseFinetune(const Node& root, FinetuneSpec* f) {
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "finetune"));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadEnum(n, "finetune", "base_dtype", si::kBaseDtypes, &f->base_dtype));
  SHARDTRAIN_RETURN_IF_ERROR(ReadBool(n, "finetune", "double_quant", &f->double_quant));
  if (!Present(n, "lora")) return absl::OkStatus();
  const Node lora = n["lora"];
  const std::string path = "finetune.lora";
  if (lora.IsScalar() && (lora.Scalar() == "none" || lora.Scalar() == "null")) {
    f->lora = LoraSpec{};
    return absl::OkStatus();
  }
  if (!lora.IsMap()) {
    return FieldError(path, "expected none or a map {rank, alpha, dropout, targets}, got ",
                      Describe(lora));
  }
  SHARDTRAIN_RETURN_IF_ERROR(CheckMap(lora, path, {"rank", "alpha", "dropout", "targets"}));
  LoraSpec l;
  l.rank = 8;
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(lora, path, "rank", 1, &l.rank));
  SHARDTRAIN_RETURN_IF_ERROR(ReadDouble(lora, path, "alpha", 0.0, /*exclusive=*/true, &l.alpha));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadDouble(lora, path, "dropout", 0.0, /*exclusive=*/false, &l.dropout));
  if (l.dropout >= 1) return FieldError(path + ".dropout", "must be < 1, got ", l.dropout);
  if (Present(lora, "targets")) {
    const Node t = lora["targets"];
    if (!t.IsSequence() || t.size() == 0) {
      return FieldError(path + ".targets",
                        "expected a non-empty list of q, k, v, o, gate, up, down, got ",
                        Describe(t));
    }
    l.targets.clear();
    uint32_t seen = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      const std::string where = absl::StrCat(path, ".targets[", i, "]");
      if (!t[i].IsScalar()) return FieldError(where, "expected a name, got ", Describe(t[i]));
      absl::StatusOr<model::LoraTarget> target = model::LoraTargetByName(t[i].Scalar());
      if (!target.ok()) return FieldError(where, target.status().message());
      if ((seen >> *target) & 1u) {
        return FieldError(where, "\"", t[i].Scalar(), "\" is listed twice");
      }
      seen |= 1u << *target;
      l.targets.push_back(t[i].Scalar());
    }
  }
  f->lora = l;
  return absl::OkStatus();
}

absl::Status CheckFinetune(const JobSpec& spec) {
  const FinetuneSpec& f = spec.finetune;
  if (!spec.model.adapter.empty() && !f.lora.on()) {
    return FieldError("model.adapter", "LoRA adapters to start from: they need finetune.lora");
  }
  if (!f.lora.on()) {
    if (f.base_dtype != BaseDtype::kBf16) {
      return FieldError("finetune.base_dtype", std::string(EnumName(f.base_dtype)),
                        " quantizes a frozen model: it needs finetune.lora");
    }
    return absl::OkStatus();
  }
  // The adapters against the model (names finetune.lora.* and both values).
  if (absl::StatusOr<model::ModelConfig> c = spec.TrainedConfig(); !c.ok()) return c.status();
  // What runs so far.
  if (f.lora.dropout != 0) {
    return FieldError("finetune.lora.dropout", "only 0 is supported so far, got ", f.lora.dropout);
  }
  return absl::OkStatus();
}

}  // namespace spec_read

model::FrozenFormat JobSpec::FrozenFormat() const {
  model::FrozenFormat f;
  f.quant = finetune.base_dtype == BaseDtype::kInt8  ? model::FrozenQuant::kInt8
            : finetune.base_dtype == BaseDtype::kNf4 ? model::FrozenQuant::kNf4
                                                     : model::FrozenQuant::kNone;
  f.double_quant = finetune.double_quant;
  // CPU workers hold it in fp32 whatever the precision (their engine
  // computes in fp32); GPU ranks in the compute type.
  f.compute_bytes = precision == Precision::kFp32 || resources.device == DeviceKind::kCpu ? 4 : 2;
  return f;
}

absl::StatusOr<model::ModelConfig> JobSpec::TrainedConfig() const {
  absl::StatusOr<model::ModelConfig> config = model.Config();
  if (!config.ok() || !finetune.lora.on()) return config;
  model::LoraConfig& lora = config->lora;
  lora.rank = finetune.lora.rank;
  lora.alpha = finetune.lora.alpha;
  for (const std::string& name : finetune.lora.targets) {
    absl::StatusOr<model::LoraTarget> t = model::LoraTargetByName(name);
    if (!t.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("finetune.lora.targets: ", t.status().message()));
    }
    lora.targets |= 1u << *t;
  }
  if (absl::Status s = model::ValidateLora(*config); !s.ok()) return s;
  return config;
}

}  // namespace shardtrain
