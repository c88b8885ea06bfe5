#include "common/model/slice.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace shardtrain::model {
namespace {

constexpr int64_t kInf = std::numeric_limits<int64_t>::max();

absl::Status CheckRequested(const GptConfig& config, int pp, const std::vector<int>& requested) {
  if (static_cast<int>(requested.size()) != pp) {
    return absl::InvalidArgumentError(absl::StrCat("parallel.stages: has ", requested.size(),
                                                   " entries, expected one per pipeline stage "
                                                   "(parallel.pp: ",
                                                   pp, ")"));
  }
  int64_t sum = 0;
  for (size_t s = 0; s < requested.size(); ++s) {
    if (requested[s] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("parallel.stages[", s, "]: must be >= 1 layer, got ", requested[s]));
    }
    sum += requested[s];
  }
  if (sum != config.layers) {
    return absl::InvalidArgumentError(absl::StrCat("parallel.stages: layers sum to ", sum,
                                                   ", expected model.layers: ", config.layers));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<int>> StageLayers(const GptConfig& config, int pp,
                                             const std::vector<int>& requested) {
  if (pp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("parallel.pp: must be >= 1, got ", pp));
  }
  if (pp > config.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.pp: ", pp, " exceeds model.layers: ", config.layers));
  }
  if (!requested.empty()) {
    if (absl::Status s = CheckRequested(config, pp, requested); !s.ok()) return s;
    return requested;
  }
  // Parameters of a stage of layers [a, b): its blocks, plus wte and wpe on
  // the first stage, the final norm and the tied wte on the last (the
  // whole model's counts: the split does not depend on tp).
  const int L = config.layers;
  const int64_t C = config.dim;
  const int64_t block = 12 * C * C + 13 * C;
  const int64_t wte = int64_t{config.padded_vocab} * C;
  const int64_t first_extra = wte + int64_t{config.context} * C;
  const int64_t last_extra = wte + 2 * C;
  auto cost = [&](int s, int a, int b) {
    return (b - a) * block + (s == 0 ? first_extra : 0) + (s == pp - 1 ? last_extra : 0);
  };
  // best[k][i]: the smallest largest-stage count over the splits of layers
  // [i, L) into stages k..pp-1, each >= 1 layer.
  std::vector<std::vector<int64_t>> best(pp + 1, std::vector<int64_t>(L + 1, kInf));
  best[pp][L] = 0;
  for (int k = pp - 1; k >= 0; --k) {
    for (int i = k; i <= L - (pp - k); ++i) {
      for (int j = i + 1; j <= L - (pp - k - 1); ++j) {
        if (best[k + 1][j] == kInf) continue;
        best[k][i] = std::min(best[k][i], std::max(cost(k, i, j), best[k + 1][j]));
      }
    }
  }
  // Walk forward taking each stage as short as the optimum allows: among
  // the optimal splits, the one whose every split point comes earliest.
  const int64_t target = best[0][0];
  std::vector<int> out;
  for (int k = 0, i = 0; k < pp; ++k) {
    for (int j = i + 1; j <= L; ++j) {
      if (best[k + 1][j] != kInf && std::max(cost(k, i, j), best[k + 1][j]) <= target) {
        out.push_back(j - i);
        i = j;
        break;
      }
    }
  }
  return out;
}

ModelSlice SliceOf(const std::vector<int>& stage_layers, int stage, int tp, int tp_rank) {
  ModelSlice slice;
  slice.first_layer = 0;
  for (int s = 0; s < stage; ++s) slice.first_layer += stage_layers[s];
  slice.num_layers = stage_layers[stage];
  slice.first_stage = stage == 0;
  slice.last_stage = stage == static_cast<int>(stage_layers.size()) - 1;
  slice.tp = tp;
  slice.tp_rank = tp_rank;
  return slice;
}

}  // namespace shardtrain::model
