#include "common/model/param_layout.h"

#include "absl/strings/str_cat.h"

namespace shardtrain::model {

ParamLayout::ParamLayout(const GptConfig& config) : config_(config) {
  const int64_t C = config.dim, Vp = config.padded_vocab;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    TensorInfo t;
    t.name = std::move(name);
    t.numel = 1;
    for (int64_t d : shape) t.numel *= static_cast<size_t>(d);
    t.decay = shape.size() == 2;  // see TensorInfo::decay
    t.shape = std::move(shape);
    t.offset = num_params_;
    t.unit = static_cast<int>(units_.size()) - 1;
    num_params_ += t.numel;
    units_.back().numel += t.numel;
    units_.back().num_tensors++;
    tensors_.push_back(std::move(t));
  };
  auto unit = [&](std::string name) {
    UnitInfo u;
    u.name = std::move(name);
    u.offset = num_params_;
    u.first_tensor = static_cast<int>(tensors_.size());
    units_.push_back(std::move(u));
  };
  unit("embeddings");
  add("wte", {Vp, C});
  add("wpe", {config.context, C});
  for (int l = 0; l < config.layers; ++l) {
    const std::string p = absl::StrCat("block.", l, ".");
    unit(absl::StrCat("block.", l));
    add(p + "ln1.weight", {C});
    add(p + "ln1.bias", {C});
    add(p + "attn.qkv.weight", {3 * C, C});
    add(p + "attn.qkv.bias", {3 * C});
    add(p + "attn.proj.weight", {C, C});
    add(p + "attn.proj.bias", {C});
    add(p + "ln2.weight", {C});
    add(p + "ln2.bias", {C});
    add(p + "mlp.fc.weight", {4 * C, C});
    add(p + "mlp.fc.bias", {4 * C});
    add(p + "mlp.proj.weight", {C, 4 * C});
    add(p + "mlp.proj.bias", {C});
  }
  unit("final");
  add("lnf.weight", {C});
  add("lnf.bias", {C});
}

absl::StatusOr<int> ParamLayout::FindTensor(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].name == name) return static_cast<int>(i);
  }
  return absl::NotFoundError(absl::StrCat("no parameter tensor '", name, "'"));
}

uint64_t ParamLayout::Fingerprint() const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&h](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (const TensorInfo& t : tensors_) {
    mix(t.name.data(), t.name.size());
    for (int64_t d : t.shape) mix(&d, sizeof d);
    uint64_t off = t.offset;
    mix(&off, sizeof off);
  }
  return h;
}

}  // namespace shardtrain::model
