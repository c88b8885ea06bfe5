#include "worker/engine/generate.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace shardtrain::engine {

absl::StatusOr<std::vector<int>> Generate(Engine& model, const std::vector<int>& prompt,
                                          const GenerateOptions& options) {
  const int V = model.config().vocab;
  if (prompt.empty()) return absl::InvalidArgumentError("generate: empty prompt");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= V) {
      return absl::InvalidArgumentError(absl::StrCat("generate: prompt token ", prompt[i],
                                                     " at index ", i, " is outside [0, ", V, ")"));
    }
  }
  // Generated tokens are drawn from [0, N): the whole vocabulary, or the
  // first `candidates` of it.
  const int N = options.candidates > 0 ? std::min(options.candidates, V) : V;
  std::vector<int> seq = prompt;
  const int window = model.max_seq_len();
  uint64_t rng = options.seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  std::vector<double> probs(V);
  std::vector<float> logits(V);
  const float* row = logits.data();
  for (int n = 0; n < options.max_new_tokens; ++n) {
    const int t = std::min<int>(static_cast<int>(seq.size()), window);
    const int* ctx = seq.data() + seq.size() - t;
    model.Forward(ctx, nullptr, 1, t);
    model.ReadLogits(t - 1, logits.data());
    int next = 0;
    if (options.temperature <= 0.0f) {
      for (int j = 1; j < N; ++j)
        if (row[j] > row[next]) next = j;
    } else {
      double maxv = row[0];
      for (int j = 1; j < N; ++j) maxv = std::max<double>(maxv, row[j]);
      double sum = 0;
      for (int j = 0; j < N; ++j) {
        probs[j] = std::exp((row[j] - maxv) / options.temperature);
        sum += probs[j];
      }
      // xorshift64* uniform in [0, 1)
      rng ^= rng >> 12;
      rng ^= rng << 25;
      rng ^= rng >> 27;
      const double u =
          static_cast<double>((rng * 2685821657736338717ull) >> 11) / 9007199254740992.0 * sum;
      double acc = 0;
      next = N - 1;
      for (int j = 0; j < N; ++j) {
        acc += probs[j];
        if (u < acc) {
          next = j;
          break;
        }
      }
    }
    seq.push_back(next);
  }
  return seq;
}

}  // namespace shardtrain::engine
