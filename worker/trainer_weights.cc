// The trainer's weights (trainer.h): the initial model and adapters a job
// starts from (model.init, model.adapter), and the whole model gathered for
// the final weights — under LoRA the frozen model with its adapters merged.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/checkpoint/hf_peft.h"
#include "worker/checkpoint/model_weights.h"
#include "worker/engine/cpu/lora_layers.h"
#include "worker/trainer.h"
#include "worker/trainer_internal.h"

namespace shardtrain::worker {

absl::Status Trainer::LoadInitialWeights(const std::string& path) {
  absl::StatusOr<model::ModelConfig> config = spec_.model.Config();
  if (!config.ok()) return config.status();
  auto failed = [](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("model.init: ", s.message()));
  };
  absl::StatusOr<std::unique_ptr<checkpoint::WeightsSource>> source =
      checkpoint::OpenModelWeights(path, *config);
  if (!source.ok()) return failed(source.status());
  if (engine_->has_frozen()) {
    // LoRA: the weights are the frozen model's, this rank's slice of them
    // whole; the adapters keep their init.
    std::vector<float> host(engine_->frozen_layout().num_params());
    absl::Status read;
    for (const model::FlatRun& r : engine_->frozen_layout().GlobalRuns()) {
      if (read.ok()) read = (*source)->Read(r.global, r.count, host.data() + r.local);
    }
    if (!read.ok()) return failed(read);
    if (const checkpoint::ReadStats r = (*source)->Stats(); r.files > 0) {
      init_read_summary_ = "model.init: " + checkpoint::ReadStatsText(r);
    }
    engine_->SetFrozen(host.data());
    return absl::OkStatus();
  }
  // This rank's share, as Restore reads a checkpoint's: the strategy's load
  // ranges of its slice, in the whole model's coordinates, in local order,
  // read piece by piece; AdamW starts from zero moments at step 0.
  std::vector<float> params;
  absl::Status read;
  ForEachGlobalPiece(engine_->layout(), strategy_->LoadRanges(), {},
                     [&](size_t, size_t global, size_t n) {
                       if (!read.ok()) return;
                       params.resize(params.size() + n);
                       read = (*source)->Read(global, n, params.data() + params.size() - n);
                     });
  if (!read.ok()) return failed(read);
  if (const checkpoint::ReadStats r = (*source)->Stats(); r.files > 0) {
    init_read_summary_ = "model.init: " + checkpoint::ReadStatsText(r);
  }
  const std::vector<float> zeros(params.size(), 0.0f);
  return strategy_->Restore(params, zeros, zeros, 0);
}

absl::Status Trainer::LoadInitialAdapter(const std::string& path) {
  absl::StatusOr<std::vector<float>> adapters =
      checkpoint::LoadPeftAdapter(path, engine_->layout().config());
  if (!adapters.ok()) return adapters.status();
  // This rank's share, as LoadInitialWeights reads it; AdamW from zero.
  std::vector<float> params;
  ForEachGlobalPiece(
      engine_->layout(), strategy_->LoadRanges(), {}, [&](size_t, size_t global, size_t n) {
        params.insert(params.end(), adapters->begin() + global, adapters->begin() + global + n);
      });
  const std::vector<float> zeros(params.size(), 0.0f);
  return strategy_->Restore(params, zeros, zeros, 0);
}

absl::Span<const float> Trainer::ParamsOnHost(std::vector<float>* copy) {
  const engine::FlatView p = engine_->params();
  if (p.device == DeviceKind::kCpu) return p.f32();
  copy->resize(p.count);  // the fp32 master on a GPU: copied to the host
  engine_->math().CopyToHost(copy->data(), static_cast<const float*>(p.data), p.count);
  return *copy;
}

absl::StatusOr<absl::Span<const float>> Trainer::WholeModel() {
  if (absl::Status s = strategy_->GatherWholeModel(); !s.ok()) return s;
  if (engine_->has_frozen()) return MergedModel();
  const model::ParamLayout& layout = engine_->layout();
  if (layout.slice().whole()) return ParamsOnHost(&whole_);
  // Every slice adds its elements (one replica of each: dp coordinate 0,
  // no tp or tied replicas) into zeros, summed into rank 0: exact. Under
  // expert parallelism the replicas with dp coordinate 0 hold one group of
  // experts only: the first replica of each other group adds its experts.
  whole_.assign(layout.global_num_params(), 0.0f);
  const bool first_replica = dp_rank_ == 0 && cp_rank_ == 0;
  if (first_replica || expert_dp_rank_ == 0) {
    std::vector<float> copy;
    const absl::Span<const float> p = ParamsOnHost(&copy);
    const parallel::FlatRanges mine = first_replica ? parallel::FlatRanges{{0, layout.num_params()}}
                                                    : parallel::FlatRanges(layout.ExpertRanges());
    for (const auto& [begin, end] : mine) {
      ForEachGlobalPiece(
          layout, {{begin, end}}, layout.ReplicaRanges(), [&](size_t at, size_t global, size_t n) {
            std::copy(p.begin() + begin + at, p.begin() + begin + at + n, whole_.begin() + global);
          });
    }
  }
  return ReduceWholeToRankZero();
}

absl::StatusOr<absl::Span<const float>> Trainer::ReduceWholeToRankZero() {
  if (!world_->device_memory()) {
    if (absl::Status s = world_->Reduce(whole_.data(), whole_.size(), comm::DataType::kFloat32,
                                        comm::ReduceOp::kSum, 0);
        !s.ok()) {
      return s;
    }
    return absl::Span<const float>(whole_);
  }
  // A world of device memory (NCCL) reduces through a scratch of the
  // engine's memory, in pieces of 16 Mi elements (64 MiB).
  constexpr size_t kPiece = size_t{16} << 20;
  engine::FlatMath& math = engine_->math();
  const std::unique_ptr<engine::Buffer> scratch = math.Allocate(std::min(kPiece, whole_.size()));
  float* d = scratch->as<float>();
  for (size_t at = 0; at < whole_.size(); at += kPiece) {
    const size_t n = std::min(kPiece, whole_.size() - at);
    math.CopyFromHost(d, whole_.data() + at, n);  // done when it returns
    if (absl::Status s = world_->Reduce(d, n, comm::DataType::kFloat32, comm::ReduceOp::kSum, 0);
        !s.ok()) {
      return s;
    }
    math.CopyToHost(whole_.data() + at, d, n);
  }
  return absl::Span<const float>(whole_);
}

absl::StatusOr<absl::Span<const float>> Trainer::MergedModel() {
  // Each slice's frozen weights with its adapters merged, in the frozen
  // model's coordinates; one replica of each slice adds them into zeros,
  // summed into rank 0 (exact), as WholeModel does for parameters.
  const model::ParamLayout& base = engine_->frozen_layout();
  std::vector<float> merged(base.num_params()), adapters_copy;
  engine_->GetFrozen(merged.data());
  const absl::Span<const float> adapters = ParamsOnHost(&adapters_copy);
  engine::cpu::MergeLora(engine_->layout(), adapters.data(), merged.data(), engine_->host_pool());
  if (base.slice().whole()) {
    whole_ = std::move(merged);
    return absl::Span<const float>(whole_);
  }
  whole_.assign(base.global_num_params(), 0.0f);
  if (dp_rank_ == 0 && cp_rank_ == 0) {
    ForEachGlobalPiece(base, {{0, base.num_params()}}, base.ReplicaRanges(),
                       [&](size_t at, size_t global, size_t n) {
                         std::copy(merged.begin() + at, merged.begin() + at + n,
                                   whole_.begin() + global);
                       });
  }
  return ReduceWholeToRankZero();
}

}  // namespace shardtrain::worker
