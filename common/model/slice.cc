#include "common/model/slice.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace shardtrain::model {
namespace {

absl::Status CheckRequested(const ModelConfig& config, int pp, const std::vector<int>& requested) {
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

absl::StatusOr<std::vector<int>> StageLayers(const ModelConfig& config, int pp,
                                             const std::vector<int>& requested, int chunks) {
  if (pp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("parallel.pp: must be >= 1, got ", pp));
  }
  if (chunks > 1) {
    if (pp < 2 || !requested.empty() || config.layers % (pp * chunks) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parallel.pp_virtual: ", chunks,
          " model chunks per stage need parallel.pp > 1, no parallel.stages (every chunk has "
          "model.layers / (pp × pp_virtual) layers) and model.layers a multiple of pp × "
          "pp_virtual; got pp ",
          pp, ", ", requested.size(), " stages entries, ", config.layers, " layers"));
    }
    return std::vector<int>(pp * chunks, config.layers / (pp * chunks));
  }
  if (pp > config.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.pp: ", pp, " exceeds model.layers: ", config.layers));
  }
  if (!requested.empty()) {
    if (absl::Status s = CheckRequested(config, pp, requested); !s.ok()) return s;
    return requested;
  }
  // Parameters of a stage of layers [a, b): its blocks, plus the embeddings
  // on the first stage and the final norm (with the tied wte or the untied
  // head) on the last (the whole model's counts: the split does not depend
  // on tp). An MoE model's blocks are counted as its last (MoE) block: its
  // leading dense layers (moe.first_dense_layers) weigh as much here, which
  // slightly favours their stage; parallel.stages sets a split exactly.
  const int L = config.layers;
  const int64_t block = BlockParams(config, L - 1);
  const int64_t wte = int64_t{config.padded_vocab} * config.dim;
  const int64_t first_extra = EmbeddingParams(config);
  const int64_t last_extra = FinalParams(config) + (config.tie_embeddings ? wte : 0);
  auto cost = [&](int s, int a, int b) {
    return (b - a) * block + (s == 0 ? first_extra : 0) + (s == pp - 1 ? last_extra : 0);
  };
  // Every block has the same count, so a split is the number of layers n_k
  // of each stage, and a largest-stage bound `limit` allows stage k at most
  // cap_k = (limit - extra_k) / block layers: feasible iff every cap_k >= 1
  // and they sum to >= L. Binary search the smallest feasible limit (O(log)
  // steps instead of a search over split points, for any L); then take each
  // stage as short as the later stages' caps allow: the earliest split
  // points among the optimal splits.
  auto extra = [&](int k) { return cost(k, 0, 0); };
  auto cap_of = [&](int64_t limit, int k) -> int64_t {
    return limit < extra(k) ? 0 : (limit - extra(k)) / block;
  };
  // Stages 1 .. pp-2 carry no extra and share one cap: O(1) per limit, not
  // O(pp) (a spec may ask for up to kMaxWorld stages).
  auto feasible = [&](int64_t limit) {
    const int64_t first = cap_of(limit, 0);
    if (first < 1) return false;
    if (pp == 1) return first >= L;
    const int64_t last = cap_of(limit, pp - 1);
    const int64_t middle = pp > 2 ? cap_of(limit, 1) : L;
    if (last < 1 || middle < 1) return false;
    const int64_t sum = std::min<int64_t>(first, L) + std::min<int64_t>(last, L) +
                        int64_t{pp - 2} * std::min<int64_t>(middle, L);
    return sum >= L;
  };
  int64_t lo = 0, hi = int64_t{L} * block + first_extra + last_extra;  // hi is feasible
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (feasible(mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  std::vector<int64_t> cap(pp);
  for (int k = 0; k < pp; ++k) cap[k] = cap_of(lo, k);
  std::vector<int64_t> later(pp + 1, 0);  // sum of the caps of stages > k
  for (int k = pp - 1; k >= 0; --k) later[k] = std::min<int64_t>(L, later[k + 1] + cap[k]);
  std::vector<int> out;
  int64_t left = L;
  for (int k = 0; k < pp; ++k) {
    const int64_t n =
        std::max<int64_t>(std::max<int64_t>(1, left - later[k + 1]), k == pp - 1 ? left : 1);
    out.push_back(static_cast<int>(n));
    left -= n;
  }
  return out;
}

ModelSlice SliceOf(const std::vector<int>& stage_layers, int stage, int tp, int tp_rank,
                   int chunks) {
  const int stages = static_cast<int>(stage_layers.size()) / chunks;
  ModelSlice slice;
  slice.first_layer = 0;
  for (int s = 0; s < stage; ++s) slice.first_layer += stage_layers[s];
  slice.num_layers = stage_layers[stage];
  slice.first_stage = stage == 0;
  slice.last_stage = stage == stages - 1;
  slice.tp = tp;
  slice.tp_rank = tp_rank;
  slice.chunks = chunks;
  if (chunks > 1) {  // the layers of one round of virtual stages (all equal)
    slice.chunk_stride = stages * stage_layers[stage];
  }
  return slice;
}

std::vector<int> ContextChunkPositions(int seq_len, int cp, int cp_rank) {
  if (cp < 1 || cp_rank < 0 || cp_rank >= cp || seq_len < 1 ||
      (cp > 1 && seq_len % (2 * cp) != 0)) {
    std::fprintf(stderr, "ContextChunkPositions: seq_len %d, cp %d, rank %d\n", seq_len, cp,
                 cp_rank);
    std::abort();
  }
  std::vector<int> pos(seq_len / cp);
  if (cp == 1) {
    for (int i = 0; i < seq_len; ++i) pos[i] = i;
    return pos;
  }
  const int c = seq_len / (2 * cp);
  for (int i = 0; i < c; ++i) {
    pos[i] = cp_rank * c + i;
    pos[c + i] = (2 * cp - 1 - cp_rank) * c + i;
  }
  return pos;
}

}  // namespace shardtrain::model
