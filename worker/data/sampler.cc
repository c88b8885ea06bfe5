#include "worker/data/sampler.h"

#include "absl/strings/str_cat.h"
#include "common/rng.h"

namespace shardtrain::data {

absl::StatusOr<BatchSampler> BatchSampler::Create(const TokenIds* tokens, uint64_t seed,
                                                  int global_batch, int T) {
  if (tokens == nullptr) return absl::InvalidArgumentError("sampler: no tokens");
  if (T < 1) return absl::InvalidArgumentError(absl::StrCat("batch.seq_len must be >= 1, got ", T));
  if (global_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch.global must be >= 1, got ", global_batch));
  }
  if (static_cast<int64_t>(tokens->size()) < int64_t{T} + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data has ", tokens->size(), " tokens, need at least seq_len + 1 = ", T + 1));
  }
  return BatchSampler(tokens, seed, global_batch, T);
}

int64_t BatchSampler::Start(int64_t index) const {
  const uint64_t range = tokens_->size() - static_cast<uint64_t>(T_);  // >= 1
  const uint64_t h = SplitMix64(SplitMix64(seed_) ^ static_cast<uint64_t>(index));
  // Lemire's multiply-shift maps h uniformly enough onto [0, range).
  return static_cast<int64_t>((static_cast<unsigned __int128>(h) * range) >> 64);
}

absl::Status BatchSampler::Fill(int64_t step, int micro, int rank, int world, int B, int* inputs,
                                int* targets) const {
  if (world < 1 || rank < 0 || rank >= world || B < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: bad rank ", rank, " / world ", world, " / micro-batch ", B));
  }
  if (G_ % (world * B) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("batch.global (", G_,
                                                   ") must be a multiple of world (", world,
                                                   ") x batch.micro (", B, ")"));
  }
  const int micros = G_ / (world * B);
  if (micro < 0 || micro >= micros) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: micro-batch ", micro, " out of range [0, ", micros, ")"));
  }
  const int64_t first = step * G_ + int64_t{rank} * (G_ / world) + int64_t{micro} * B;
  for (int b = 0; b < B; ++b) {
    tokens_->Window(Start(first + b), T_, inputs + int64_t{b} * T_, targets + int64_t{b} * T_);
  }
  return absl::OkStatus();
}

absl::StatusOr<EvalSampler> EvalSampler::Create(const TokenIds* tokens, int64_t count, int T) {
  if (tokens == nullptr) return absl::InvalidArgumentError("eval sampler: no tokens");
  if (T < 1) return absl::InvalidArgumentError(absl::StrCat("batch.seq_len must be >= 1, got ", T));
  if (count < 1) {
    return absl::InvalidArgumentError(absl::StrCat("eval: ", count, " windows, need at least 1"));
  }
  if (static_cast<int64_t>(tokens->size()) < int64_t{T} + 1) {
    return absl::InvalidArgumentError(absl::StrCat("validation data has ", tokens->size(),
                                                   " tokens, need at least seq_len + 1 = ", T + 1));
  }
  return EvalSampler(tokens, count, T);
}

std::pair<int64_t, int64_t> EvalSampler::Share(int64_t count, int rank, int world) {
  return {count * rank / world, count * (rank + 1) / world};
}

int64_t EvalSampler::Start(int64_t index) const {
  if (count_ == 1) return 0;
  const auto last_start = static_cast<unsigned __int128>(tokens_->size() - T_ - 1);
  return static_cast<int64_t>(last_start * static_cast<uint64_t>(index) /
                              static_cast<uint64_t>(count_ - 1));
}

absl::Status EvalSampler::Fill(int64_t first, int b, int* inputs, int* targets) const {
  if (b < 1 || first < 0 || first + b > count_) {
    return absl::InvalidArgumentError(absl::StrCat("eval sampler: windows [", first, ", ",
                                                   first + b, ") outside [0, ", count_, ")"));
  }
  for (int i = 0; i < b; ++i) {
    tokens_->Window(Start(first + i), T_, inputs + int64_t{i} * T_, targets + int64_t{i} * T_);
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::data
