#include "worker/checkpoint/model_weights.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/param_layout.h"
#include "worker/checkpoint/hf_gpt2.h"
#include "worker/checkpoint/hf_llama.h"
#include "worker/checkpoint/weights_file.h"

namespace shardtrain::checkpoint {
namespace {

namespace fs = std::filesystem;

// Weights already in memory: the formats read whole.
class VectorSource : public WeightsSource {
 public:
  explicit VectorSource(std::vector<float> params) : params_(std::move(params)) {}
  absl::Status Read(size_t global, size_t n, float* out) override {
    if (global > params_.size() || n > params_.size() - global) {
      return absl::OutOfRangeError(absl::StrCat("elements [", global, ", ", global + n,
                                                ") outside the model's ", params_.size()));
    }
    std::copy(params_.begin() + global, params_.begin() + global + n, out);
    return absl::OkStatus();
  }

 private:
  std::vector<float> params_;
};

}  // namespace

std::string ReadStatsText(const ReadStats& r) {
  auto bytes = [](int64_t b) {
    return b >= (1 << 20) ? absl::StrFormat("%.2f MiB", b / double(1 << 20))
                          : absl::StrFormat("%.1f KiB", b / 1024.0);
  };
  return absl::StrFormat(
      "read %s of the checkpoint's %s of tensors (%.1f%%) from %d of %d files", bytes(r.bytes_read),
      bytes(r.data_bytes),
      r.data_bytes > 0 ? 100.0 * double(r.bytes_read) / double(r.data_bytes) : 0.0, r.files_read,
      r.files);
}

absl::StatusOr<std::unique_ptr<WeightsSource>> OpenModelWeights(const std::string& path,
                                                                const model::ModelConfig& config) {
  std::error_code ec;
  std::string file = path;
  bool safetensors = false;
  if (fs::is_directory(path, ec)) {
    file = path + "/model.safetensors";
    safetensors = fs::exists(file, ec) || fs::exists(path + "/model.safetensors.index.json", ec);
  } else {
    safetensors = absl::EndsWith(path, ".safetensors.index.json") || LooksLikeSafetensors(path);
  }
  if (!safetensors && !fs::exists(file, ec)) {
    return absl::NotFoundError(absl::StrCat(file, " does not exist"));
  }
  if (safetensors && config.arch == model::Arch::kLlama) return OpenHfLlama(path, config);
  if (safetensors) {
    if (absl::EndsWith(path, ".json") || !fs::exists(file, ec)) {
      return absl::UnimplementedError(absl::StrCat(
          path, ": a sharded Hugging Face checkpoint; GPT-2 weights are read from one file"));
    }
    absl::StatusOr<std::map<std::string, NamedTensor>> tensors = ReadSafetensors(file);
    if (!tensors.ok()) return tensors.status();
    absl::StatusOr<std::vector<float>> params = FromHfGpt2(config, *tensors);
    if (!params.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": ", params.status().message()));
    }
    return std::make_unique<VectorSource>(*std::move(params));
  }
  absl::StatusOr<LoadedWeights> w = LoadWeights(file);
  if (!w.ok()) return w.status();
  if (w->config != config) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": weights of ", model::ToString(w->config), " where the model is ",
                     model::ToString(config)));
  }
  return std::make_unique<VectorSource>(std::move(w->params));
}

absl::StatusOr<std::vector<float>> LoadModelWeights(const std::string& path,
                                                    const model::ModelConfig& config) {
  absl::StatusOr<std::unique_ptr<WeightsSource>> source = OpenModelWeights(path, config);
  if (!source.ok()) return source.status();
  std::vector<float> params(model::ParamLayout(config).num_params());
  if (absl::Status s = (*source)->Read(0, params.size(), params.data()); !s.ok()) return s;
  return params;
}

}  // namespace shardtrain::checkpoint
