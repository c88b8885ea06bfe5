#include "worker/parallel/sharded_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace shardtrain::parallel {
namespace {

// Waits for every op (so no buffer is still in use on return) and returns the
// first failure, if any.
absl::Status WaitAll(std::initializer_list<comm::Work*> works) {
  absl::Status status;
  for (comm::Work* w : works) {
    if (w == nullptr) continue;
    if (absl::Status s = w->Wait(); !s.ok() && status.ok()) status = std::move(s);
  }
  return status;
}

}  // namespace

ShardRange ZeroShardRange(size_t num_params, int dp, int rank) {
  const size_t s = num_params / static_cast<size_t>(dp);
  ShardRange r;
  r.begin = s * static_cast<size_t>(rank);
  r.end = rank == dp - 1 ? num_params : r.begin + s;
  return r;
}

absl::StatusOr<std::unique_ptr<ShardedOptimizer>> ShardedOptimizer::Create(
    int stage, const model::ParamLayout& layout, const optim::AdamWOptions& options,
    comm::Communicator* comm, model::ThreadPool* pool) {
  if (stage != 1 && stage != 2) {
    return absl::InvalidArgumentError(absl::StrCat("ShardedOptimizer: ZeRO stage ", stage,
                                                   " — only stages 1 and 2 are "
                                                   "handled here (0 is plain data parallelism)"));
  }
  const int dp = comm == nullptr ? 1 : comm->size();
  const int rank = comm == nullptr ? 0 : comm->rank();
  if (dp < 1 || rank < 0 || rank >= dp) {
    return absl::InvalidArgumentError(
        absl::StrCat("ShardedOptimizer: rank ", rank, " of a group of size ", dp));
  }
  const size_t n = layout.num_params();
  const ShardRange range = ZeroShardRange(n, dp, rank);
  auto adamw = optim::AdamW::Create(layout, range.begin, range.size(), options);
  if (!adamw.ok()) return adamw.status();
  return std::unique_ptr<ShardedOptimizer>(
      new ShardedOptimizer(stage, n, dp, rank, dp == 1 ? nullptr : comm, pool, *std::move(adamw)));
}

ShardedOptimizer::ShardedOptimizer(int stage, size_t num_params, int dp, int rank,
                                   comm::Communicator* comm, model::ThreadPool* pool,
                                   optim::AdamW adamw)
    : stage_(stage),
      num_params_(num_params),
      dp_(dp),
      rank_(rank),
      body_count_(num_params / static_cast<size_t>(dp)),
      range_(ZeroShardRange(num_params, dp, rank)),
      comm_(comm),
      pool_(pool),
      adamw_(std::move(adamw)),
      shard_scratch_(dp > 1 ? range_.size() : 0),
      norm_scratch_(2 * static_cast<size_t>(dp)) {}

int64_t ShardedOptimizer::comm_bytes_per_step() const {
  const int64_t bytes = int64_t(num_params_ * sizeof(float));
  const int64_t one_pass = bytes * (dp_ - 1) / dp_;
  return stage_ == 1 ? 3 * one_pass : 2 * one_pass;
}

absl::StatusOr<double> ShardedOptimizer::SumOverRanks(double local) {
  static_assert(sizeof(double) == 2 * sizeof(float));
  if (comm_ == nullptr) return local;
  float mine[2];
  std::memcpy(mine, &local, sizeof(local));
  // AllGather moves fp32 bytes unchanged, so the doubles arrive bit-exact.
  if (absl::Status s = comm_->AllGather(mine, norm_scratch_.data(), 2, comm::DataType::kFloat32);
      !s.ok()) {
    return s;
  }
  double total = 0;
  for (int r = 0; r < dp_; ++r) {
    double v;
    std::memcpy(&v, &norm_scratch_[2 * size_t(r)], sizeof(v));
    total += v;
  }
  return total;
}

absl::StatusOr<double> ShardedOptimizer::Step(absl::Span<float> params, absl::Span<float> grads,
                                              float lr, float max_norm) {
  if (params.size() != num_params_ || grads.size() != num_params_) {
    return absl::InvalidArgumentError(
        absl::StrCat("ShardedOptimizer::Step: params (", params.size(), ") and grads (",
                     grads.size(), ") must hold the whole flat buffer (", num_params_, ")"));
  }
  const size_t s = body_count_, body = s * static_cast<size_t>(dp_);
  const size_t tail = num_params_ - body;  // owned by the last rank
  const bool last = rank_ == dp_ - 1;

  // 1. This rank's shard of the gradient summed over dp.
  absl::Span<float> g;  // the shard's gradient, indexed like adamw_
  if (comm_ == nullptr) {
    g = grads;
  } else if (stage_ == 1) {
    if (absl::Status st = comm_->AllReduce(grads.data(), num_params_, comm::DataType::kFloat32,
                                           comm::ReduceOp::kSum);
        !st.ok()) {
      return st;
    }
    g = grads.subspan(range_.begin, range_.size());
  } else {
    std::shared_ptr<comm::Work> rs, tail_sum;
    if (s > 0) {
      rs = comm_->ReduceScatterAsync(grads.data(), shard_scratch_.data(), s,
                                     comm::DataType::kFloat32, comm::ReduceOp::kSum);
    }
    if (tail > 0) {
      tail_sum = comm_->AllReduceAsync(grads.data() + body, tail, comm::DataType::kFloat32,
                                       comm::ReduceOp::kSum);
    }
    if (absl::Status st = WaitAll({rs.get(), tail_sum.get()}); !st.ok()) return st;
    if (last && tail > 0) {
      std::copy(grads.begin() + body, grads.end(), shard_scratch_.begin() + s);
    }
    g = absl::MakeSpan(shard_scratch_);
  }
  // Summed over dp; the mean gradient of the global batch is sum / dp.
  if (dp_ > 1) optim::ScaleGrads(g, 1.0f / static_cast<float>(dp_), pool_);

  // 2. Global-norm clipping (optim::ClipGradNorm over the distributed shards).
  auto squared = SumOverRanks(optim::GradSquaredNorm(g, pool_));
  if (!squared.ok()) return squared.status();
  const float norm = static_cast<float>(std::sqrt(*squared));
  if (max_norm > 0 && norm > max_norm) optim::ScaleGrads(g, max_norm / (norm + 1e-6f), pool_);

  // 3. AdamW on the shard.
  adamw_.Step(params.subspan(range_.begin, range_.size()), g, lr, pool_);

  // 4. Every rank gets every shard's updated params.
  if (comm_ != nullptr) {
    std::shared_ptr<comm::Work> ag, tail_bcast;
    if (s > 0) {
      std::copy(params.begin() + range_.begin, params.begin() + range_.begin + s,
                shard_scratch_.begin());
      ag = comm_->AllGatherAsync(shard_scratch_.data(), params.data(), s, comm::DataType::kFloat32);
    }
    if (tail > 0) {
      tail_bcast =
          comm_->BroadcastAsync(params.data() + body, tail, comm::DataType::kFloat32, dp_ - 1);
    }
    if (absl::Status st = WaitAll({ag.get(), tail_bcast.get()}); !st.ok()) return st;
  }
  return static_cast<double>(norm);
}

}  // namespace shardtrain::parallel
