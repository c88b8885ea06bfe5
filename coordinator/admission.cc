#include "coordinator/admission.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/config.h"

namespace shardtrain::coordinator {
namespace {

std::string Bytes(double b) {
  if (b >= 1024.0 * 1024 * 1024) return absl::StrFormat("%.1f GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return absl::StrFormat("%.1f MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrFormat("%.0f bytes", b);
}

}  // namespace

absl::Status CheckSubmitRequest(const v1::SubmitJobRequest& req, const AdmissionLimits& limits) {
  double bytes = static_cast<double>(req.spec_yaml().size());
  for (const std::string& o : req.overrides()) bytes += static_cast<double>(o.size());
  if (bytes > static_cast<double>(limits.max_spec_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec: ", Bytes(bytes), " of spec and overrides, above the coordinator's limit of ",
        Bytes(static_cast<double>(limits.max_spec_bytes)), " (--max-spec-bytes)"));
  }
  if (req.resume_from().size() > kMaxPathBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("resume_from: ", req.resume_from().size(), " bytes, at most ", kMaxPathBytes));
  }
  if (req.idempotency_key().size() > kMaxIdempotencyKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("idempotency_key: ", req.idempotency_key().size(), " bytes, at most ",
                     kMaxIdempotencyKeyBytes));
  }
  return absl::OkStatus();
}

double ModelParams(const ModelSpec& m) {
  const absl::StatusOr<model::ModelConfig> c = m.Config();
  if (!c.ok()) return 0;  // not a spec ParseJobSpec accepted: refused there
  // In double: layers × a block's parameters may exceed int64.
  double n = double(model::EmbeddingParams(*c)) + double(model::FinalParams(*c));
  for (int l = 0; l < c->layers; ++l) n += double(model::BlockParams(*c, l));
  return n;
}

double EstimatePlanBytes(const JobSpec& spec, int world) {
  const double layers = spec.model.layers;
  const double dp = spec.parallel.dp;
  // ParamTensor: a name like "block.123.attn.proj.weight", a shape, an
  // offset, a unit name; ~80 bytes with framing.
  const double tensors = 12.0 * layers + 4.0;
  // ShardUnit: a name, offset, numel and two int64 lists of dp entries.
  const double units = layers + 2.0;
  // RankPlan ~40 bytes; every rank is in three groups (~8 bytes each).
  const double w = world;
  const double stages = spec.parallel.pp;
  return tensors * 80.0 + units * (40.0 + 22.0 * dp) + w * (40.0 + 3 * 8.0) + 3 * w * 12.0 +
         stages * 16.0 + 256.0;
}

absl::Status CheckRegisterRequest(const v1::RegisterWorkerRequest& req) {
  const std::pair<const char*, const std::string*> fields[] = {
      {"host", &req.host()},
      {"collective_address", &req.collective_address()},
      {"metrics_address", &req.metrics_address()},
      {"checkpoint_root", &req.checkpoint_root()},
      {"previous_worker_id", &req.previous_worker_id()}};
  for (const auto& [name, value] : fields) {
    if (value->size() > kMaxPathBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", value->size(), " bytes, at most ", kMaxPathBytes));
    }
  }
  if (req.threads() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("threads: ", req.threads(), ", must be >= 0"));
  }
  if (req.host_memory_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host_memory_bytes: ", req.host_memory_bytes(), ", must be >= 0"));
  }
  for (const v1::Device& d : req.devices()) {
    if (d.kind() != "cpu" && d.kind() != "cuda") {
      return absl::InvalidArgumentError(
          absl::StrCat("devices.kind: \"", d.kind().substr(0, 32), "\", must be cpu or cuda"));
    }
    if (d.memory_bytes() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices.memory_bytes: ", d.memory_bytes(), ", must be >= 0"));
    }
    for (const std::string* v : {&d.name(), &d.kind(), &d.model()}) {
      if (v->size() > kMaxPathBytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("devices: a field of ", v->size(), " bytes, at most ", kMaxPathBytes));
      }
    }
    if (d.precisions_size() > 8) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices.precisions: ", d.precisions_size(), " entries, at most 8"));
    }
    for (const std::string& p : d.precisions()) {
      if (p.size() > 16) {
        return absl::InvalidArgumentError("devices.precisions: an entry over 16 bytes");
      }
    }
  }
  if (req.devices_size() > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("devices: ", req.devices_size(), " entries, at most 16"));
  }
  return absl::OkStatus();
}

absl::Status CheckSpecLimits(const JobSpec& spec, const ParallelDims& dims,
                             const AdmissionLimits& limits) {
  if (dims.world() > limits.max_world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel: world ", dims.world(), " (dp ", dims.dp(),
        dims.cp() > 1 ? absl::StrCat(" x cp ", dims.cp()) : "", " x tp ", dims.tp(), " x pp ",
        dims.pp(), ") is above the coordinator's limit of ", limits.max_world, " (--max-world)"));
  }
  const double params = ModelParams(spec.model);
  if (params > static_cast<double>(limits.max_params)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model: %.4g parameters (layers %d, dim %d, vocab %d, context %d), above the "
        "coordinator's limit of %d (--max-params)",
        params, spec.model.layers, spec.model.dim, spec.model.vocab, spec.model.context,
        limits.max_params));
  }
  const double plan = EstimatePlanBytes(spec, dims.world());
  if (plan > static_cast<double>(limits.max_plan_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan: model.layers ", spec.model.layers, " x parallel.dp ", dims.dp(),
        " needs an estimated ", Bytes(plan), " plan, above the coordinator's limit of ",
        Bytes(static_cast<double>(limits.max_plan_bytes)), " (--max-plan-bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::coordinator
