// Trainer's engine and mesh (trainer.h): the engine of a rank's slice, the
// tensor, context, expert and pipeline groups installed on a composed
// trainer, and the sums over them.
#include <utility>

#include "worker/engine/cpu/cpu_model.h"
#if SHARDTRAIN_HAVE_CUDA
#include "worker/engine/cuda/cuda_model.h"
#endif
#include "worker/parallel/data_parallel.h"
#include "worker/trainer.h"

namespace shardtrain::worker {

absl::StatusOr<std::unique_ptr<engine::Engine>> MakeEngine(
    const JobSpec& spec, const model::ModelConfig& config, int threads, int gpu,
    const engine::ModelEngineOptions& options) {
  if (spec.resources.device == DeviceKind::kCuda) {
#if SHARDTRAIN_HAVE_CUDA
    auto e = engine::cuda::CudaModel::Create(config, spec.batch.micro, spec.LocalSeqLen(), gpu,
                                             spec.Compute(), threads, options);
    if (!e.ok()) return e.status();
    return std::unique_ptr<engine::Engine>(*std::move(e));
#endif
  }
  auto e =
      engine::cpu::CpuModel::Create(config, spec.batch.micro, spec.LocalSeqLen(), threads, options);
  if (!e.ok()) return e.status();
  return std::unique_ptr<engine::Engine>(*std::move(e));
}

PipelineSchedule ScheduleOf(const JobSpec& spec) {
  return spec.parallel.pp > 1 ? spec.parallel.schedule : PipelineSchedule::k1F1B;
}

absl::StatusOr<double> Trainer::SumOverModelGroup(comm::Communicator* group, double local) {
  return parallel::SumOverGroup(group, local, &engine_->math(), &model_group_scratch_);
}

absl::Status Trainer::AttachModelParallel(std::unique_ptr<parallel::Mesh> mesh,
                                          std::unique_ptr<parallel::TensorParallelGroup> tp,
                                          std::unique_ptr<parallel::ContextParallelGroup> cp,
                                          std::unique_ptr<parallel::ExpertParallelGroup> ep,
                                          comm::Communicator* world) {
  mesh_ = std::move(mesh);
  tp_group_ = std::move(tp);
  cp_group_ = std::move(cp);
  ep_group_ = std::move(ep);
  world_ = world;
  const model::ParamLayout& layout = engine_->layout();
  parallel::ModelParallelGrads mp;
  mp.norm_skip = layout.ReplicaRanges();
  parallel::Mesh* m = mesh_.get();
  // The mesh's groups are the world's kind: host memory (Gloo) or device
  // memory (NCCL), where the sums below then take their data.
  mp.device_memory = world != nullptr && world->device_memory();
  mp.sum_squares = [this, m](double squared) -> absl::StatusOr<double> {
    absl::StatusOr<double> over_tp = SumOverModelGroup(m->tp(), squared);
    if (!over_tp.ok()) return over_tp.status();
    return SumOverModelGroup(m->pp(), *over_tp);
  };
  // A tied LM head: the first and last stages sum their wte gradients.
  if (m->tied() != nullptr && layout.config().tie_embeddings) {
    mp.tied_end = layout.units()[0].numel;
    engine::Engine* e = engine_.get();
    mp.sum_tied = [m, e](absl::Span<float> g) {
      return parallel::AllReduceSumNow(*m->tied(), *e, g.data(), g.size());
    };
  }
  if (tp_group_ != nullptr) {
    mp.tp_partial = layout.TpPartialRanges(spec_.parallel.sequence_parallel);
  }
  if (!mp.tp_partial.empty()) {
    parallel::TensorParallelGroup* tp = tp_group_.get();
    mp.sum_tp = [tp](absl::Span<float> g) {
      tp->AllReduceSum(g.data(), g.size());
      return tp->Finish();
    };
  }
  if (ep_group_ != nullptr) {
    // Expert parallelism: the experts' gradients summed over the ranks
    // holding the same experts, their squares over the ep group.
    mp.expert = layout.ExpertRanges();
    if (comm::Communicator* edp = m->expert_dp(); edp != nullptr) {
      engine::Engine* e = engine_.get();
      mp.sum_expert = [edp, e](absl::Span<float> g) {
        return parallel::AllReduceSumNow(*edp, *e, g.data(), g.size());
      };
      mp.expert_dp_rank = edp->rank();
      mp.expert_dp_size = edp->size();
    }
    mp.sum_expert_squares = [this, m](double squared) {
      return SumOverModelGroup(m->ep(), squared);
    };
  }
  strategy_->set_model_parallel(std::move(mp));
  if (mesh_->dims().pp() > 1) {
    auto p =
        parallel::PipelineExecutor::Create(engine_.get(), *mesh_, ScheduleOf(spec_), split_.accum);
    if (!p.ok()) return p.status();
    pipeline_ = *std::move(p);
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::worker
