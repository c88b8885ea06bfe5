// Zero's step over this rank's shard (averaging, clipping by the global
// norm, AdamW, the all-gather of updated params for stages 1-2), the
// shard's checkpoint state, and the memory accounting; the hooks, gathers
// and reductions of the micro-batches are in zero.cc.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/parallel/zero.h"

namespace shardtrain::parallel {
namespace {

constexpr int64_t kF32 = sizeof(float);

}  // namespace

absl::Span<float> Zero::ShardGrad(const Part& p) {
  if (options_.stage == 1) return absl::MakeSpan(grads_ + p.begin(), p.own.size());
  return absl::MakeSpan(ShardGrads() + p.shard_offset, p.own.size());
}

float* Zero::ShardParamPtr(const Part& p) {
  if (options_.stage == 3) return ShardParams() + p.shard_offset;
  return params_ + p.begin();
}

engine::FlatMath& Zero::ShardMath() { return on_device_ ? engine_->math() : host_math_; }

absl::StatusOr<double> Zero::SumOverRanks(double local) {
  if (comm_ == nullptr) return local;
  comm_bytes_ += (dp_ - 1) * 2 * kF32;  // an all-gather of one double
  return SumOverGroup(comm_, local, on_device_ ? &engine_->math() : nullptr, &device_norm_scratch_);
}

absl::StatusOr<StepStats> Zero::Step(float lr, float max_norm, float loss_scale) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<double> norm = StepShard(lr, max_norm, loss_scale);
  if (!norm.ok()) return norm.status();
  StepStats stats;
  stats.grad_norm = *norm;
  stats.skipped = !std::isfinite(*norm);
  if (dp_ > 1) {
    stats.comm_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  stats.comm_bytes = TakeCommBytes();
  return stats;
}

absl::StatusOr<double> Zero::StepShard(float lr, float max_norm, float loss_scale) {
  if (!status_.ok()) return status_;
  events_.clear();  // every reduction that waited on them is done
  engine::ThreadPool* pool = engine_->host_pool();
  engine::FlatMath& math = ShardMath();
  // Summed over dp (the experts' over the ranks holding them, which hold
  // every replica's tokens for them); the mean gradient of the global batch
  // is sum / dp.
  double squared = 0;
  for (size_t k = 0; k < units_.size(); ++k) {
    const Unit& u = units_[k];
    for (const Part& p : u.parts) {
      absl::Span<float> g = ShardGrad(p);
      if (dp_ > 1) math.Scale(g.data(), g.size(), 1.0f / static_cast<float>(dp_));
      // The tied embeddings: this shard of the unit and the tied stage's
      // (the same range of the same unit shape) are summed.
      if (k == 0 && mp_.sum_tied && mp_.tied_end == u.numel && !g.empty()) {
        if (absl::Status s =
                SumInPlace(mp_, *engine_, on_device_, g.data(), g.size(), mp_.sum_tied);
            !s.ok()) {
          return s;
        }
      }
      if (absl::Status s = SumTpPartials(mp_, *engine_, on_device_, g.data(), g.size(), p.begin());
          !s.ok()) {
        return s;
      }
      squared += SquaredNormOutside(math, g.data(), g.size(), p.begin(), mp_.norm_skip);
    }
  }
  // Over the replica group every element's square counts once: the
  // experts' shards of each ep rank's experts lie on its expert group.
  auto total = SumOverRanks(squared);
  if (!total.ok()) return total.status();
  if (mp_.sum_squares) total = mp_.sum_squares(*total);
  if (!total.ok()) return total.status();
  // The gradients carry the loss scale (fp16): the norm without it decides
  // clipping; a non-finite one skips the step, parameters unchanged.
  const float norm = static_cast<float>(std::sqrt(*total) / loss_scale);
  if (!std::isfinite(norm)) return static_cast<double>(norm);
  const float clip = optim::ClipScale(norm, max_norm) / loss_scale;
  for (const Unit& u : units_) {
    for (const Part& p : u.parts) {
      absl::Span<float> g = ShardGrad(p);
      if (on_device_) {  // the shard's m and v live on the device; clipped in AdamW's pass
        adamw_[p.adamw].Step(ShardParamPtr(p), g.data(), lr, /*zero_grads=*/false, clip);
      } else {
        if (clip != 1.0f) math.Scale(g.data(), g.size(), clip);
        adamw_[p.adamw].Step(absl::MakeSpan(ShardParamPtr(p), p.own.size()), g, lr, pool);
      }
    }
  }
  if (options_.stage < 3) {
    if (absl::Status s = GatherAllParams(); !s.ok()) return s;
  }
  return static_cast<double>(norm);
}

absl::Status Zero::GatherAllParams() {
  const size_t n = engine_->layout().num_params();
  if (comm_ == nullptr) {
    PushParams(0, n);
    return absl::OkStatus();
  }
  std::vector<std::shared_ptr<comm::Work>> works;
  const engine::Event* after = AfterDeviceWork();  // the step wrote the shards
  for (const Unit& u : units_) {
    for (const Part& p : u.parts) {
      if (p.comm == nullptr) continue;  // this rank alone holds it: updated in place
      float* out = params_ + p.offset;
      const size_t body = p.body * p.dp, tail = p.numel - body;
      if (p.body > 0) {  // in place: this rank's block is already where it belongs
        works.push_back(Count(
            p.comm->AllGatherAsync(out + p.own.begin, out, p.body, comm::DataType::kFloat32, after),
            (p.dp - 1) * int64_t(p.body) * kF32));
      }
      if (tail > 0) {
        works.push_back(Count(
            p.comm->BroadcastAsync(out + body, tail, comm::DataType::kFloat32, p.dp - 1, after),
            (p.dp - 1) * int64_t(tail) * kF32 / p.dp));
      }
    }
  }
  Wait(works);
  events_.clear();
  if (status_.ok()) PushParams(0, n);
  return status_;
}

FlatRanges Zero::SaveRanges() const {
  std::vector<std::pair<size_t, size_t>> out;
  for (const Unit& u : units_) {
    for (const Part& p : u.parts) {
      if (p.own.size() > 0) out.emplace_back(p.begin(), p.offset + p.own.end);
    }
  }
  return out;
}

std::vector<float> Zero::SaveParams() const {
  if (options_.stage == 3 && !on_device_) return shard_params_;
  std::vector<float> out(shard_size_);
  if (options_.stage == 3) {
    engine_->math().CopyToHost(out.data(), device_shard_params_->as<float>(), shard_size_);
    return out;
  }
  for (const Unit& u : units_) {
    for (const Part& p : u.parts) {
      const float* from = params_ + p.begin();
      if (on_device_) {
        engine_->math().CopyToHost(out.data() + p.shard_offset, from, p.own.size());
      } else {
        std::copy(from, from + p.own.size(), out.begin() + p.shard_offset);
      }
    }
  }
  return out;
}

std::vector<float> Zero::SaveM() const {
  return ConcatState([](const optim::AdamW& a) { return a.CopyM(0, a.count()); });
}

std::vector<float> Zero::SaveV() const {
  return ConcatState([](const optim::AdamW& a) { return a.CopyV(0, a.count()); });
}

int64_t Zero::optimizer_step() const { return adamw_.empty() ? 0 : adamw_.front().step(); }

absl::Status Zero::Restore(absl::Span<const float> params, absl::Span<const float> m,
                           absl::Span<const float> v, int64_t step) {
  if (params.size() != shard_size_ || m.size() != shard_size_ || v.size() != shard_size_) {
    return absl::InvalidArgumentError(absl::StrCat("Zero::Restore: ", params.size(), "/", m.size(),
                                                   "/", v.size(), " elements for a shard of ",
                                                   shard_size_));
  }
  for (const Unit& u : units_) {
    for (const Part& p : u.parts) {
      const size_t at = p.shard_offset, n = p.own.size();
      if (on_device_) {
        engine_->math().CopyFromHost(ShardParamPtr(p), params.data() + at, n);
      } else {
        std::copy(params.begin() + at, params.begin() + at + n, ShardParamPtr(p));
      }
      adamw_[p.adamw].SetState(m.subspan(at, n), v.subspan(at, n));
      adamw_[p.adamw].set_step(step);
    }
  }
  return options_.stage < 3 ? GatherAllParams() : absl::OkStatus();
}

ZeroMemory Zero::zero_memory() const {
  // The buffers this rank really holds: the engine's whole-model buffers
  // where the stage keeps them whole, else the shard vectors; m and v of
  // every unit's optimizer.
  ZeroMemory z;
  z.params =
      options_.stage == 3 ? int64_t(shard_size_) * kF32 : int64_t(engine_->param_buffer().bytes());
  z.grads =
      options_.stage >= 2 ? int64_t(shard_size_) * kF32 : int64_t(engine_->grad_buffer().bytes());
  for (const optim::AdamW& a : adamw_) z.optimizer += a.state_bytes();
  // Staged, the host mirrors exist for the collectives only.
  z.comm_buffers = static_cast<int64_t>((has_reduce_scratch() ? shard_size_ : 0) +
                                        host_params_.size() + host_grads_.size()) *
                   kF32;
  if (options_.stage == 3) {
    z.gathered = measure_ ? peak_gathered_bytes_ : int64_t(peak_live_param_elems_) * kF32;
  }
  if (options_.stage >= 2) {
    z.unit_grads = measure_ ? peak_unit_grad_bytes_ : int64_t(peak_live_grad_elems_) * kF32;
  }
  z.optimizer_on_host = options_.offload_optimizer || staged_;
  return z;
}

ModelStateMemory Zero::memory() const {
  const ZeroMemory z = zero_memory();
  ModelStateMemory m;
  m.params = z.params;
  m.grads = z.grads;
  m.optimizer = z.optimizer;
  m.comm_buffers = z.comm_buffers;
  m.working = z.gathered + z.unit_grads;
  m.optimizer_on_host = z.optimizer_on_host;
  return m;
}

}  // namespace shardtrain::parallel
