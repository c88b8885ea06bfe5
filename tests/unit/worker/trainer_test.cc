// The trainer as a composition, with fakes: a fake engine (records every
// forward and backward, returns losses of its own) and a fake data-parallel
// strategy (records the calls, returns set statistics). Checks the order of
// the calls of one step, the sampler's windows for the rank's dp
// coordinate, the schedule's learning rate, how results and memory are put
// together, errors passed through, and what a checkpoint shard holds.
#include "worker/trainer.h"

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/checkpoint/fake_storage.h"
#include "worker/engine/cpu/cpu_device.h"
#include "worker/optim/lr_schedule.h"

namespace shardtrain::worker {
namespace {

using Calls = std::vector<std::string>;

class FakeEngine final : public engine::Engine {
 public:
  FakeEngine(const model::ModelConfig& config, int B, int T, Calls* calls)
      : layout_(config), table_(config, B, T), B_(B), T_(T), calls_(calls) {
    params_ = *device_.Allocate(layout_.num_params(), DataType::kFloat32);
    grads_ = *device_.Allocate(layout_.num_params(), DataType::kFloat32);
  }
  const model::ParamLayout& layout() const override { return layout_; }
  int max_batch() const override { return B_; }
  int max_seq_len() const override { return T_; }
  engine::Device& device() override { return device_; }
  engine::Buffer& param_buffer() override { return *params_; }
  engine::Buffer& grad_buffer() override { return *grads_; }
  const model::ActivationTable& activations() const override { return table_; }
  int64_t activation_bytes() const override { return 1000; }
  int64_t ResidentActivationBytes() const override { return 900; }
  engine::ThreadPool* host_pool() override { return &pool_; }
  engine::FlatMath& math() override { return math_; }
  void InitParamsInto(uint64_t, size_t, size_t, float*) override {}
  // The loss is the first token / 100, so each micro-batch's is known.
  float Forward(const int* tokens, const int* targets, int b, int t) override {
    calls_->push_back(absl::StrCat("forward ", b, "x", t));
    fed.emplace_back(tokens, tokens + b * t);
    targets_fed.emplace_back(targets, targets + b * t);
    return tokens[0] / 100.0f;
  }
  void Backward(float loss_scale) override {
    calls_->push_back(absl::StrCat("backward ", loss_scale));
  }
  void ZeroGrad() override { calls_->push_back("zero_grad"); }
  void ReadLogits(int, float*) const override {}
  void set_grads_ready_hook(std::function<void(size_t)>) override {}
  void set_param_hook(std::function<void(int, bool)>) override {}

  std::vector<std::vector<int>> fed, targets_fed;

 private:
  model::ParamLayout layout_;
  model::ActivationTable table_;
  const int B_, T_;
  engine::cpu::CpuDevice device_;
  engine::ThreadPool pool_{1};
  engine::HostFlatMath math_{&pool_};
  std::unique_ptr<engine::Buffer> params_, grads_;
  Calls* calls_;
};

class FakeStrategy final : public parallel::DataParallel {
 public:
  explicit FakeStrategy(Calls* calls) : calls_(calls) {}
  void InitParams(uint64_t seed) override { calls_->push_back(absl::StrCat("init ", seed)); }
  void BeginMicroBatch(int micro, int accum) override {
    calls_->push_back(absl::StrCat("begin ", micro, "/", accum));
  }
  absl::Status EndMicroBatch() override {
    calls_->push_back("end");
    return end_status;
  }
  absl::StatusOr<parallel::StepStats> Step(float lr, float max_norm, float loss_scale) override {
    calls_->push_back(absl::StrCat("step lr ", lr, " clip ", max_norm));
    if (!step_status.ok()) return step_status;
    return stats;
  }
  void BeginEval() override { calls_->push_back("eval begin"); }
  absl::StatusOr<double> EndEval(double loss_sum) override {
    calls_->push_back(absl::StrCat("eval end ", loss_sum));
    if (!eval_status.ok()) return eval_status;
    return loss_sum * eval_replicas;  // as if every replica had this sum
  }
  absl::Status GatherWholeModel() override { return absl::OkStatus(); }
  void set_model_parallel(parallel::ModelParallelGrads) override {}
  parallel::FlatRanges SaveRanges() const override { return {{2, 5}, {9, 10}}; }
  std::vector<float> SaveParams() const override { return {1, 2, 3, 4}; }
  std::vector<float> SaveM() const override { return {5, 6, 7, 8}; }
  std::vector<float> SaveV() const override { return {9, 10, 11, 12}; }
  int64_t optimizer_step() const override { return 7; }
  parallel::FlatRanges LoadRanges() const override { return SaveRanges(); }
  absl::Status Restore(absl::Span<const float>, absl::Span<const float>, absl::Span<const float>,
                       int64_t) override {
    return absl::OkStatus();
  }
  parallel::ModelStateMemory memory() const override {
    parallel::ModelStateMemory m;
    m.params = 10;
    m.grads = 20;
    m.optimizer = 30;
    m.comm_buffers = 40;
    m.working = measure ? 55 : 50;
    return m;
  }
  void set_measure(bool on) override { measure = on; }

  parallel::StepStats stats;
  absl::Status end_status, step_status, eval_status;
  double eval_replicas = 1;
  bool measure = false;

 private:
  Calls* calls_;
};

// dp 2, global 8 = micro 2 × dp 2 × accumulation 2, seq_len 4; rank 1.
JobSpec Spec() {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      "name: trainer-test\n"
      "model: {layers: 1, heads: 2, dim: 8, context: 8, vocab: 256}\n"
      "data: {train: unused.txt}\n"
      "batch: {global: 8, micro: 2, seq_len: 4}\n"
      "parallel: {dp: 2}\n"
      "optimizer: {lr: 0.01, warmup_steps: 2, grad_clip: 0.5}\n"
      "steps: 10\n"
      "seed: 99\n");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

std::vector<uint16_t> Tokens() {
  std::vector<uint16_t> t(500);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>((i * 37) % 256);
  return t;
}

struct Parts {
  Calls calls;
  FakeEngine* engine = nullptr;
  FakeStrategy* strategy = nullptr;
  std::unique_ptr<Trainer> trainer;
};

void Compose(Parts* p, const JobSpec& spec = Spec(), int rank = 1,
             std::vector<uint16_t> val_tokens = {}) {
  auto engine = std::make_unique<FakeEngine>(
      *model::MakeGptConfig(spec.model.layers, spec.model.heads, spec.model.dim, spec.model.context,
                            spec.model.vocab),
      spec.batch.micro, spec.batch.seq_len, &p->calls);
  p->engine = engine.get();
  auto trainer = Trainer::Compose(
      spec, rank, std::move(engine),
      [p](engine::Engine*) -> absl::StatusOr<std::unique_ptr<parallel::DataParallel>> {
        auto s = std::make_unique<FakeStrategy>(&p->calls);
        p->strategy = s.get();
        return std::unique_ptr<parallel::DataParallel>(std::move(s));
      },
      Tokens(), std::move(val_tokens));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  p->trainer = *std::move(trainer);
}

// Validation data distinct from Tokens(): 300 tokens.
std::vector<uint16_t> ValTokens() {
  std::vector<uint16_t> t(300);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>((i * 11 + 5) % 256);
  return t;
}

TEST(TrainerTest, OneStepCallsTheStrategyAroundEveryMicroBatch) {
  Parts p;
  Compose(&p);
  EXPECT_EQ(p.calls, Calls{"init 99"});  // parameters from the seed, through the strategy
  p.calls.clear();
  p.strategy->stats.grad_norm = 3.5;
  p.strategy->stats.comm_ms = 2.0;
  p.strategy->stats.collective_ms = 4.0;
  p.strategy->stats.comm_bytes = 1234;
  absl::StatusOr<StepResult> r = p.trainer->Step(3);
  ASSERT_TRUE(r.ok()) << r.status();
  const float lr = static_cast<float>(optim::LearningRate(Spec().optimizer, 2, 10));
  EXPECT_EQ(p.calls,
            (Calls{"begin 0/2", "forward 2x4", "backward 0.5", "end", "begin 1/2", "forward 2x4",
                   "backward 0.5", "end", absl::StrCat("step lr ", lr, " clip ", 0.5f)}));
  EXPECT_EQ(r->step, 3);
  EXPECT_DOUBLE_EQ(r->lr, optim::LearningRate(Spec().optimizer, 2, 10));
  ASSERT_EQ(p.engine->fed.size(), 2u);
  EXPECT_NEAR(r->loss, (p.engine->fed[0][0] + p.engine->fed[1][0]) / 200.0, 1e-6);
  EXPECT_EQ(r->grad_norm, 3.5);
  EXPECT_GE(r->comm_ms, 2.0);  // the strategy's, plus the time spent in EndMicroBatch
  EXPECT_EQ(r->allreduce_ms, 4.0);
  EXPECT_EQ(r->comm_bytes, 1234);
  EXPECT_EQ(r->tokens, 2 * 2 * 4);
}

// Rank 1 is dp replica 1: its micro-batches are the sampler's windows for
// replica 1 of 2, and the targets are the inputs shifted by one.
TEST(TrainerTest, FeedsTheReplicasWindows) {
  Parts p;
  Compose(&p);
  ASSERT_TRUE(p.trainer->Step(1).ok());
  const data::TokenIds tokens = Tokens();
  auto sampler = data::BatchSampler::Create(&tokens, 99, 8, 4);
  ASSERT_TRUE(sampler.ok());
  for (int m = 0; m < 2; ++m) {
    std::vector<int> in(8), tgt(8);
    ASSERT_TRUE(sampler->Fill(0, m, /*rank=*/1, /*world=*/2, 2, in.data(), tgt.data()).ok());
    EXPECT_EQ(p.engine->fed[m], in) << "micro-batch " << m;
    EXPECT_EQ(p.engine->targets_fed[m], tgt) << "micro-batch " << m;
  }
}

TEST(TrainerTest, EvaluatesEveryNStepsAndAfterTheLast) {
  JobSpec spec = Spec();  // steps: 10
  spec.eval.every = 4;
  for (int64_t step = 1; step <= 10; ++step) {
    EXPECT_EQ(EvalDue(spec, step), step == 4 || step == 8 || step == 10) << step;
  }
  spec.eval.every = 0;
  for (int64_t step = 1; step <= 10; ++step) EXPECT_FALSE(EvalDue(spec, step)) << step;
}

// dp 2, eval.batches 1 × global 8 = 8 windows: replica 1 evaluates windows
// [4, 8) in two forwards of micro 2 after the step's update, inside the
// strategy's eval bracket; the loss is the strategy's sum over dp / 8.
TEST(TrainerTest, EvaluationStepsRunTheReplicasShareForwardOnly) {
  JobSpec spec = Spec();
  spec.data.val = "val.txt";
  spec.eval.every = 2;
  spec.eval.batches = 1;
  Parts p;
  Compose(&p, spec, /*rank=*/1, ValTokens());
  p.strategy->eval_replicas = 2;
  absl::StatusOr<StepResult> r = p.trainer->Step(1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->val_loss.has_value());
  EXPECT_EQ(std::count(p.calls.begin(), p.calls.end(), "eval begin"), 0);
  p.calls.clear();
  p.engine->fed.clear();
  p.engine->targets_fed.clear();
  r = p.trainer->Step(2);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->val_loss.has_value());
  ASSERT_EQ(p.engine->fed.size(), 4u);  // 2 training micro-batches, then 2 forwards
  const double sum = 2.0 * (p.engine->fed[2][0] / 100.0f) + 2.0 * (p.engine->fed[3][0] / 100.0f);
  const float lr = static_cast<float>(optim::LearningRate(spec.optimizer, 1, 10));
  EXPECT_EQ(p.calls,
            (Calls{"begin 0/2", "forward 2x4", "backward 0.5", "end", "begin 1/2", "forward 2x4",
                   "backward 0.5", "end", absl::StrCat("step lr ", lr, " clip ", 0.5f),
                   "eval begin", "forward 2x4", "forward 2x4", absl::StrCat("eval end ", sum)}));
  EXPECT_NEAR(*r->val_loss, sum * 2 / 8, 1e-6);
  EXPECT_GE(r->eval_ms, 0);
  const data::TokenIds val = ValTokens();
  auto windows = data::EvalSampler::Create(&val, 8, 4);
  ASSERT_TRUE(windows.ok());
  std::vector<int> in(4 * 4), tgt(4 * 4);
  ASSERT_TRUE(windows->Fill(4, 4, in.data(), tgt.data()).ok());
  std::vector<int> fed = p.engine->fed[2], fed_tgt = p.engine->targets_fed[2];
  fed.insert(fed.end(), p.engine->fed[3].begin(), p.engine->fed[3].end());
  fed_tgt.insert(fed_tgt.end(), p.engine->targets_fed[3].begin(), p.engine->targets_fed[3].end());
  EXPECT_EQ(fed, in);
  EXPECT_EQ(fed_tgt, tgt);
  // An evaluation error fails the step.
  p.strategy->eval_status = absl::DeadlineExceededError("all-gather timed out");
  EXPECT_EQ(p.trainer->Step(4).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(TrainerTest, EvaluationNeedsValidationData) {
  JobSpec spec = Spec();
  spec.data.val = "val.txt";
  spec.eval.every = 2;
  const model::ModelConfig cfg = *model::MakeGptConfig(1, 2, 8, 8, 256);
  Calls calls;
  auto factory =
      [&calls](engine::Engine*) -> absl::StatusOr<std::unique_ptr<parallel::DataParallel>> {
    return std::unique_ptr<parallel::DataParallel>(std::make_unique<FakeStrategy>(&calls));
  };
  auto no_val = Trainer::Compose(spec, 0, std::make_unique<FakeEngine>(cfg, 2, 4, &calls), factory,
                                 Tokens(), /*val_tokens=*/{});
  EXPECT_EQ(no_val.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(no_val.status().message().rfind("data.val: ", 0), 0u) << no_val.status();
  // The real parts load data.val like data.train, errors naming the field.
  const std::string dir = ::testing::TempDir();
  {
    std::ofstream f(dir + "/trainer_test_train.txt");
    f << std::string(200, 'a');
  }
  spec.parallel.dp = 1;
  spec.batch.global = 4;
  spec.data.train = dir + "/trainer_test_train.txt";
  spec.data.val = dir + "/trainer_test_missing_val.txt";
  auto missing = Trainer::Create(spec, 0, 1, nullptr);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_EQ(missing.status().message().rfind("data.val: ", 0), 0u) << missing.status();
  spec.eval.every = 0;  // not evaluating: data.val is not read
  EXPECT_TRUE(Trainer::Create(spec, 0, 1, nullptr).ok());
}

TEST(TrainerTest, StrategyErrorsStopTheStep) {
  Parts p;
  Compose(&p);
  p.strategy->end_status = absl::AbortedError("peer gone");
  absl::StatusOr<StepResult> r = p.trainer->Step(1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(p.calls.back(), "end");  // nothing after the failed micro-batch
  p.strategy->end_status = absl::OkStatus();
  p.strategy->step_status = absl::DeadlineExceededError("all-gather timed out");
  EXPECT_EQ(p.trainer->Step(1).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(TrainerTest, MemoryIsTheStrategysStateAndTheEnginesActivations) {
  Parts p;
  Compose(&p);
  MemoryUse m = p.trainer->memory();
  EXPECT_EQ(m.params, 10);
  EXPECT_EQ(m.working, 50);
  EXPECT_EQ(m.activations, 1000);  // allocated
  EXPECT_EQ(m.Total(), 10 + 20 + 30 + 1000 + 40 + 50);
  p.trainer->set_measure_memory(true);
  m = p.trainer->memory();
  EXPECT_EQ(m.working, 55);       // the strategy measures too
  EXPECT_EQ(m.activations, 900);  // resident
}

TEST(TrainerTest, ShardHoldsTheStrategysRangesAndState) {
  JobSpec spec = Spec();
  spec.checkpoint.dir = "/ckpt";
  Parts p;
  Compose(&p, spec);
  checkpoint::FakeCheckpointStorage storage;
  std::string path;
  absl::StatusOr<checkpoint::ShardFileInfo> info = p.trainer->SaveShard(storage, 4, &path);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(path, "/ckpt/step-4/rank-1.shard");
  absl::StatusOr<checkpoint::ShardContents> c = checkpoint::ReadShard(storage, path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rank, 1);
  EXPECT_EQ(c->world, 2);
  ASSERT_EQ(c->ranges.size(), 2u);
  EXPECT_EQ(c->ranges[0].begin, 2u);
  EXPECT_EQ(c->ranges[1].end, 10u);
  EXPECT_EQ(c->params, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(c->v, (std::vector<float>{9, 10, 11, 12}));
  EXPECT_EQ(c->scalars.optimizer_step, 7);
  EXPECT_EQ(c->scalars.data_position, 5);
}

TEST(TrainerTest, ComposeRefusesARankOutsideTheWorldAndASmallEngine) {
  const JobSpec spec = Spec();
  auto factory = [](engine::Engine*) -> absl::StatusOr<std::unique_ptr<parallel::DataParallel>> {
    return absl::InternalError("not reached");
  };
  Calls calls;
  const model::ModelConfig cfg = *model::MakeGptConfig(1, 2, 8, 8, 256);
  EXPECT_EQ(
      Trainer::Compose(spec, 2, std::make_unique<FakeEngine>(cfg, 2, 4, &calls), factory, Tokens())
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      Trainer::Compose(spec, 0, std::make_unique<FakeEngine>(cfg, 1, 4, &calls), factory, Tokens())
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      Trainer::Compose(spec, 0, std::make_unique<FakeEngine>(cfg, 2, 4, &calls), factory, Tokens())
          .status()
          .code(),
      absl::StatusCode::kInternal);  // the strategy's own error
}

}  // namespace
}  // namespace shardtrain::worker
