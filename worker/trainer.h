// Trains one rank of a job by composing its parts, each behind its seam:
// the rank's place in the mesh (ParallelDims) and share of the batch
// (SplitBatch), an engine (engine/engine.h: forward and backward on one
// device), a data-parallel strategy over it (parallel/data_parallel.h: DDP
// or ZeRO-1/2/3), the data sampler and the learning-rate schedule. Every
// step: the rank's micro-batches (the sampler makes the union over ranks of
// one step's batch the 1-rank batch), each bracketed by the strategy, then
// the strategy's optimizer step. The trainer itself does not branch on the
// strategy.
//
// Tensor and pipeline parallelism compose around the same loop: the engine
// runs this rank's slice of the model (model::SliceOf its pp stage and tp
// rank), its tensor-parallel layers all-reduce over the mesh's tp group
// (parallel/tensor_parallel_group.h), a PipelineExecutor runs the stage's
// schedule of micro-batches (parallel/pipeline.h) when pp > 1, and the
// strategy's step sums the tied embeddings across the first and last stage
// and the gradient norm across tp and pp (ModelParallelGrads). Checkpoints
// and the final weights are in the whole model's coordinates
// (ParamLayout::GlobalRuns), so any layout resumes from any other.
//
// The engine is the spec's resources.device: the CPU (fp32 only; Create
// refuses other precisions with FAILED_PRECONDITION naming the field) or one
// GPU (engine/cuda: fp32, bf16, fp16; one whole model per GPU so far). Under
// fp16 the backward passes scale the loss by a dynamic loss scale
// (optim::LossScaler) and a step whose gradients overflowed is skipped
// (StepResult::skipped). ZeRO-3 with pp > 1 is refused by the spec.
//
// Not thread-safe: one caller.
#ifndef SHARDTRAIN_WORKER_TRAINER_H_
#define SHARDTRAIN_WORKER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "common/parallel_dims.h"
#include "worker/checkpoint/shard_file.h"
#include "worker/checkpoint/storage.h"
#include "worker/comm/communicator.h"
#include "worker/data/sampler.h"
#include "worker/engine/engine.h"
#include "worker/engine/model_engine.h"
#include "worker/optim/loss_scaler.h"
#include "worker/parallel/context_parallel_group.h"
#include "worker/parallel/data_parallel.h"
#include "worker/parallel/expert_parallel_group.h"
#include "worker/parallel/mesh.h"
#include "worker/parallel/pipeline.h"
#include "worker/parallel/tensor_parallel_group.h"

namespace shardtrain::worker {

// What one optimizer step did on this rank.
struct StepResult {
  int64_t step = 0;      // 1-based
  double loss = 0;       // this rank's mean loss over its micro-batches
  double grad_norm = 0;  // global norm before clipping (identical on every rank)
  double lr = 0;
  double step_ms = 0;
  double comm_ms = 0;       // time blocked on collectives (exposed)
  double allreduce_ms = 0;  // time the gradient all-reduces ran (flight recorder), where
                            // known; 1 - comm/allreduce is the fraction hidden by backward
  int64_t comm_bytes = 0;   // bytes this rank sent (ring model of the ops issued), all groups
  int64_t tp_bytes = 0;     // of which in tensor-parallel all-reduces
  int64_t pp_bytes = 0;     // of which activations and gradients sent between stages
  int64_t cp_bytes = 0;     // of which key/value blocks and their gradients on the cp ring
  int64_t ep_bytes = 0;     // of which MoE layers' tokens and gradients sent all-to-all (ep)
  double bubble = 0;        // pp > 1: the stage's idle fraction of the step (pipeline timeline)
  int64_t tokens = 0;       // tokens this rank processed
  // Set on evaluation steps only (EvalDue): the validation loss of the
  // parameters after this step's update (Evaluate), and the time it took
  // (not part of step_ms).
  std::optional<double> val_loss;
  double eval_ms = 0;
  // fp16: the loss scale the step ran with, and whether its gradients
  // overflowed so that the update was skipped (parameters unchanged).
  bool skipped = false;
  double loss_scale = 0;  // 0 when no loss scaling is used
  // The MoE layers' figures of this rank's slice (MoeFigures; all 0 without
  // MoE layers): v1::StepReport's moe_* fields say what each is.
  double moe_aux_loss = 0, moe_z_loss = 0, moe_max_load = 0, moe_dropped = 0;
};

// The engine of the spec's device on this rank's slice (trainer_mesh.cc).
absl::StatusOr<std::unique_ptr<engine::Engine>> MakeEngine(
    const JobSpec& spec, const model::ModelConfig& config, int threads, int gpu,
    const engine::ModelEngineOptions& options);

// The schedule a stage runs: the spec's when pp > 1; one stage has no bubble
// and runs each micro-batch's forward and backward in turn (1F1B's order).
PipelineSchedule ScheduleOf(const JobSpec& spec);

// StepResult's moe_* figures from an engine's MoeStats of one step.
void MoeFigures(const engine::MoeStats& stats, StepResult* r);

// Whether step `step` (1-based) ends with an evaluation: eval.every > 0 and
// it divides the step, or the step is the last one.
bool EvalDue(const JobSpec& spec, int64_t step);

// Bytes one rank holds, by kind: the strategy's model state and the
// engine's activations.
struct MemoryUse {
  int64_t params = 0;        // parameters kept between steps (ZeRO-3: the shard)
  int64_t grads = 0;         // gradients kept (ZeRO-2/3: the shard)
  int64_t optimizer = 0;     // AdamW m and v (offload: in host memory)
  int64_t activations = 0;   // activations and backward scratch of one micro-batch
  int64_t comm_buffers = 0;  // buffers only communication needs
  int64_t working = 0;       // ZeRO-2/3 peak of whole units alive at once: gathered
                             // params (3) and full-unit gradients in backward
  int64_t frozen = 0;        // LoRA: the frozen model (params .. optimizer: the adapters')
  bool optimizer_on_host = false;
  int64_t Total() const {
    return frozen + params + grads + optimizer + activations + comm_buffers + working;
  }
};

class Trainer {
 public:
  // The real parts for `spec`: the mesh of dp × tp × pp split from `comm`
  // (the job's world communicator; null when the world is one rank; it must
  // outlive the trainer; used as the dp group itself when tp = pp = 1), the
  // CPU engine on this rank's slice with `threads` threads, the strategy
  // parallel.zero asks for over the dp group, the pipeline executor when
  // pp > 1, the training tokens of data.train and, when eval.every > 0, of
  // data.val (errors name the field and the file). Collective when the
  // mesh has tp or pp groups (Mesh::Create).
  // `gpu`: the CUDA device ordinal this worker drives (resources.device:
  // cuda). `wrap_engine` (tests): replaces the engine made for the spec by
  // what it returns, e.g. the same engine posing as a GPU's.
  using EngineWrapper =
      std::function<std::unique_ptr<engine::Engine>(std::unique_ptr<engine::Engine>)>;
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const JobSpec& spec, int rank, int threads, comm::Communicator* comm, int gpu = 0,
      const EngineWrapper& wrap_engine = nullptr);
  // Composes a trainer from given parts (tests pass fakes). `make_strategy`
  // builds the data-parallel strategy over the engine. Initialises the
  // parameters from spec.seed through the strategy. `val_tokens` is
  // data.val's, required (InvalidArgument naming data.val) when
  // eval.every > 0.
  using StrategyFactory = std::function<absl::StatusOr<std::unique_ptr<parallel::DataParallel>>(
      engine::Engine* engine)>;
  static absl::StatusOr<std::unique_ptr<Trainer>> Compose(const JobSpec& spec, int rank,
                                                          std::unique_ptr<engine::Engine> engine,
                                                          const StrategyFactory& make_strategy,
                                                          data::TokenIds tokens,
                                                          data::TokenIds val_tokens = {});

  // Runs optimizer step `step` (1-based), then Evaluate() when EvalDue.
  // Collective when dp > 1.
  absl::StatusOr<StepResult> Step(int64_t step);

  // The validation loss of the current parameters: the mean token loss over
  // the eval.batches × batch.global windows of data.val
  // (data::EvalSampler), of which this replica runs its 1/dp share
  // (EvalSampler::Share; eval.batches × accumulation micro-batches) forward
  // only, inside the strategy's BeginEval/EndEval. The result is identical
  // on every rank and, to rounding, the same whatever dp and batch.micro.
  // FailedPrecondition without validation data. Collective when dp > 1.
  absl::StatusOr<double> Evaluate();

  // Writes this rank's shard of the state after `step` (the strategy's save
  // ranges of params, AdamW m and v, and the scalars) to
  // <checkpoint.dir>/step-<step>/rank-<rank>.shard, atomically (the loss
  // scale among the scalars under fp16), when its volume has room for it.
  // Returns what the coordinator's manifest needs; *path gets the file.
  // Storage errors as checkpoint::WriteShard's (a StorageError: no room,
  // read-only, ...); no collective.
  absl::StatusOr<checkpoint::ShardFileInfo> SaveShard(checkpoint::CheckpointStorage& storage,
                                                      int64_t step, std::string* path);
  // Loads the committed checkpoint in `step_dir` (any world size and
  // strategy that wrote it) into the strategy's load ranges; returns its
  // step, the last one done. Under fp16 the loss scale resumes from the
  // checkpoint's (a checkpoint of another precision, whose scale is 1, leaves
  // the initial 2^16).
  absl::StatusOr<int64_t> Restore(checkpoint::CheckpointStorage& storage,
                                  const std::string& step_dir);

  // The whole model's current parameters (the layout of
  // ParamLayout(config); under LoRA the model without adapters, the adapters
  // merged into its weights), valid on rank 0 until the next call or step:
  // collective where parameters are sharded (ZeRO-3) or the model is split
  // (tp, pp: every slice is summed into rank 0 over the world). Every rank
  // calls it, e.g. before rank 0 saves the weights.
  absl::StatusOr<absl::Span<const float>> WholeModel();

  // Memory this rank holds: the sizes of its buffers, or with
  // set_measure_memory(true) what is resident (the strategy's working set
  // sampled at every unit use; the activations after the last step).
  MemoryUse memory() const;
  void set_measure_memory(bool on) {
    measure_ = on;
    strategy_->set_measure(on);
  }

  engine::Engine& engine() { return *engine_; }
  const JobSpec& spec() const { return spec_; }
  // What reading model.init took from a checkpoint read range by range (a
  // Hugging Face Llama-family one): this rank's share only, e.g. "model.init:
  // read 1.20 MiB of the checkpoint's 4.80 MiB of tensors (25.0%) from 2 of
  // 3 files"; "" otherwise.
  const std::string& init_read_summary() const { return init_read_summary_; }

 private:
  Trainer(JobSpec spec, int rank) : spec_(std::move(spec)), rank_(rank) {}
  // spec.model.init: the whole model's weights from `path`
  // (checkpoint::OpenModelWeights), this rank's share into the strategy.
  absl::Status LoadInitialWeights(const std::string& path);
  // spec.model.adapter: LoRA adapters in PEFT's format
  // (checkpoint::LoadPeftAdapter), this rank's share into the strategy.
  absl::Status LoadInitialAdapter(const std::string& path);
  // WholeModel's sum of every rank's whole_ into rank 0 (each rank filled
  // its share of whole_ in the whole model's coordinates, zeros elsewhere).
  absl::StatusOr<absl::Span<const float>> ReduceWholeToRankZero();
  // WholeModel under LoRA: the frozen model with the adapters merged
  // (engine::cpu::MergeLora), in the layout of the model without adapters.
  absl::StatusOr<absl::Span<const float>> MergedModel();
  // The engine's parameters as host memory: themselves, or (on a GPU)
  // copied into *copy.
  absl::Span<const float> ParamsOnHost(std::vector<float>* copy);
  // The sum of `local` over a tp or pp group of the mesh (null: local),
  // identical on every rank (parallel::SumOverGroup), through a scratch of
  // the engine's memory when the group is a device's.
  absl::StatusOr<double> SumOverModelGroup(comm::Communicator* group, double local);
  // Installs the tensor/context/pipeline parts on a composed trainer.
  // DeepSeek-V3's aux-loss-free balancing (router.bias_update_rate > 0;
  // trainer_moe.cc): each MoE layer's choice bias moved by the sign of its
  // experts' load error over the step's tokens of every replica, centred.
  absl::Status UpdateRouterBiases(const engine::MoeStats& stats);
  // (trainer_mesh.cc)
  absl::Status AttachModelParallel(std::unique_ptr<parallel::Mesh> mesh,
                                   std::unique_ptr<parallel::TensorParallelGroup> tp,
                                   std::unique_ptr<parallel::ContextParallelGroup> cp,
                                   std::unique_ptr<parallel::ExpertParallelGroup> ep,
                                   comm::Communicator* world);
  // One micro-batch of this rank's tokens: what fill_whole gives (B whole
  // sequences), or under cp this rank's columns of them (cp_columns_).
  absl::Status FillLocal(const std::function<absl::Status(int*, int*)>& fill_whole, int* inputs,
                         int* targets);
  // One step's forwards and backwards: the micro-batch loop, or the pipeline
  // schedule when pp > 1. Adds the loss sum, exposed comm time and timeline
  // figures into *r.
  absl::Status RunMicroBatches(int64_t step, StepResult* r);

  const JobSpec spec_;
  const int rank_;
  BatchSplit split_;        // of spec_.batch over dp
  int dp_rank_ = 0;         // this rank's dp coordinate
  int cp_rank_ = 0;         // and its cp coordinate
  int expert_dp_rank_ = 0;  // its index among the ranks holding the same experts
  // Context parallelism: the columns of each sequence this rank holds
  // (ContextChunkPositions; empty without cp), and one micro-batch of whole
  // sequences they are taken from.
  std::vector<int> cp_columns_;
  std::vector<int> seq_inputs_, seq_targets_;
  data::TokenIds tokens_;
  std::unique_ptr<data::BatchSampler> sampler_;
  data::TokenIds val_tokens_;
  std::unique_ptr<data::EvalSampler> eval_sampler_;  // null when eval.every == 0
  // Tensor and pipeline parallelism (null without): the mesh's groups and
  // the engine's tp group, declared before what uses them (destroyed after).
  std::unique_ptr<parallel::Mesh> mesh_;
  std::unique_ptr<parallel::TensorParallelGroup> tp_group_;
  std::unique_ptr<parallel::ContextParallelGroup> cp_group_;
  std::unique_ptr<parallel::ExpertParallelGroup> ep_group_;
  // The replica group (dp × cp; null for one rank): the router biases' loads.
  comm::Communicator* replica_comm_ = nullptr;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<parallel::DataParallel> strategy_;  // after engine_: destroyed first
  // SumOverModelGroup's scratch in the engine's memory (device groups).
  std::unique_ptr<engine::Buffer> model_group_scratch_;
  // The pipeline executor when pp > 1 (destroyed first: it waits for its
  // sends).
  std::unique_ptr<parallel::PipelineExecutor> pipeline_;
  comm::Communicator* world_ = nullptr;
  std::string init_read_summary_;
  std::vector<float> whole_;  // WholeModel's buffer: the model is split or on a GPU
  std::vector<int> inputs_, targets_;
  bool measure_ = false;
  // fp16's dynamic loss scale (none in fp32 / bf16: scale 1).
  std::optional<optim::LossScaler> scaler_;
  float LossScale() const { return scaler_.has_value() ? scaler_->scale() : 1.0f; }
};

// Where rank 0 saves the final weights: <checkpoint.dir>/final.weights, or
// empty when the spec has no checkpoint dir.
std::string FinalWeightsPath(const JobSpec& spec);

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_TRAINER_H_
