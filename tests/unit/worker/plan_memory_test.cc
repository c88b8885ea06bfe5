// The planner's memory per rank against what the worker really holds: for
// three model shapes and ZeRO stages 0-3 on dp = 2 (thread ranks, each a real
// Trainer — CPU engine, DDP or ZeRO, Gloo over 127.0.0.1), after two steps
// the busiest rank's measured memory (Trainer::memory() with measuring on:
// resident pages of the engine's activation, parameter and gradient
// buffers; the strategy's shard and optimizer vectors) is within 5% of
// MakePlan's activations and model state (params + grads + optimizer).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/parallel_dims.h"
#include "common/planner.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/comm/test_util.h"
#include "worker/trainer.h"

namespace shardtrain::worker {
namespace {
namespace fs = std::filesystem;

struct Shape {
  const char* name;
  int layers, heads, dim, context, vocab;
  int micro, seq_len;
};
constexpr Shape kShapes[] = {
    {"tiny", 2, 2, 32, 32, 256, 4, 32},
    {"fortunes", 4, 4, 128, 64, 256, 8, 64},
    {"wide", 3, 6, 192, 128, 512, 2, 128},
};

class PlanMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardtrain_plan_memory_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream f(dir_ / "text.txt");
    for (int i = 0; i < 2000; ++i)
      f << "The quick brown fox " << i << " jumps over the lazy dog.\n";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  JobSpec Spec(const Shape& s, int zero) const {
    const std::string yaml =
        "name: plan-memory\n"
        "model: {layers: " +
        std::to_string(s.layers) + ", heads: " + std::to_string(s.heads) +
        ", dim: " + std::to_string(s.dim) + ", context: " + std::to_string(s.context) +
        ", vocab: " + std::to_string(s.vocab) +
        "}\n"
        "data: {train: " +
        (dir_ / "text.txt").string() +
        "}\n"
        "batch: {global: " +
        std::to_string(2 * s.micro) + ", micro: " + std::to_string(s.micro) +
        ", seq_len: " + std::to_string(s.seq_len) +
        "}\n"
        "parallel: {dp: 2, zero: " +
        std::to_string(zero) +
        "}\n"
        "steps: 2\n";
    absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml);
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }
  fs::path dir_;
};

double RelDiff(int64_t got, int64_t want) {
  return want == 0 ? (got == 0 ? 0.0 : 1.0) : std::abs(double(got - want)) / double(want);
}

// What each of `world` thread ranks holds (resident, measured) after two
// steps of `spec`.
std::vector<MemoryUse> MeasuredMemory(const JobSpec& spec, int world) {
  std::vector<MemoryUse> out(world);
  comm::testing::RunRanks(world, [&](comm::Communicator& comm) {
    auto trainer = Trainer::Create(spec, comm.rank(), /*threads=*/1, &comm);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    (*trainer)->set_measure_memory(true);
    for (int step = 1; step <= 2; ++step) {
      absl::StatusOr<StepResult> r = (*trainer)->Step(step);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_TRUE(std::isfinite(r->loss));
    }
    out[comm.rank()] = (*trainer)->memory();
  });
  return out;
}

TEST_F(PlanMemoryTest, PlanMatchesWhatTheTrainerHoldsWithin5Percent) {
  std::printf("%-9s %4s  %14s %14s %6s  %14s %14s %6s\n", "shape", "zero", "plan acts",
              "measured acts", "diff", "plan state", "measured state", "diff");
  for (const Shape& shape : kShapes) {
    for (int zero = 0; zero <= 3; ++zero) {
      SCOPED_TRACE(testing::Message() << shape.name << " zero " << zero);
      const JobSpec spec = Spec(shape, zero);
      absl::StatusOr<v1::Plan> plan = MakePlan(spec, 2);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const v1::MemoryEstimate& want = plan->memory_per_rank();
      const MemoryUse busiest = MeasuredMemory(spec, 2)[1];  // the last dp rank's, as the plan
      const int64_t plan_state = want.params_bytes() + want.grads_bytes() + want.optimizer_bytes();
      const int64_t got_state = busiest.params + busiest.grads + busiest.optimizer;
      std::printf("%-9s %4d  %14lld %14lld %5.2f%%  %14lld %14lld %5.2f%%\n", shape.name, zero,
                  static_cast<long long>(want.activations_bytes()),
                  static_cast<long long>(busiest.activations),
                  100 * RelDiff(busiest.activations, want.activations_bytes()),
                  static_cast<long long>(plan_state), static_cast<long long>(got_state),
                  100 * RelDiff(got_state, plan_state));
      EXPECT_LE(RelDiff(busiest.activations, want.activations_bytes()), 0.05);
      EXPECT_LE(RelDiff(got_state, plan_state), 0.05);
      // Each kind on its own too: the plan shards what the strategy shards.
      EXPECT_LE(RelDiff(busiest.params, want.params_bytes()), 0.05);
      EXPECT_LE(RelDiff(busiest.grads, want.grads_bytes()), 0.05);
      EXPECT_LE(RelDiff(busiest.optimizer, want.optimizer_bytes()), 0.05);
    }
  }
}

// Recomputation shrinks what the engine allocates exactly as the plan says:
// for each model.recompute mode, the activations measured resident on the
// busiest rank within 5% of the plan's, each mode below the one before.
TEST_F(PlanMemoryTest, RecomputeModesMatchThePlanWithin5Percent) {
  std::printf("%-9s %-10s %14s %14s %6s %9s\n", "shape", "recompute", "plan acts", "measured acts",
              "diff", "vs none");
  for (const Shape& shape : kShapes) {
    int64_t none = 0, previous = 0;
    for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      SCOPED_TRACE(testing::Message() << shape.name << " " << EnumName(mode));
      JobSpec spec = Spec(shape, 0);
      spec.model.recompute = mode;
      absl::StatusOr<v1::Plan> plan = MakePlan(spec, 2);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const int64_t want = plan->memory_per_rank().activations_bytes();
      const int64_t got = MeasuredMemory(spec, 2)[1].activations;
      if (mode == Recompute::kNone) none = got;
      std::printf("%-9s %-10s %14lld %14lld %5.2f%% %8.3fx\n", shape.name,
                  std::string(EnumName(mode)).c_str(), static_cast<long long>(want),
                  static_cast<long long>(got), 100 * RelDiff(got, want), double(got) / none);
      EXPECT_LE(RelDiff(got, want), 0.05);
      if (mode != Recompute::kNone) {
        EXPECT_LT(got, previous);
      }
      previous = got;
    }
  }
}

// Sequence parallelism on tp2: each rank's activations within 5% of the
// plan with and without it (and with full recomputation), smaller with it.
TEST_F(PlanMemoryTest, SequenceParallelOnTp2MatchesThePlanWithin5Percent) {
  std::printf("%-9s %-10s %-3s %14s %14s %6s %9s\n", "shape", "recompute", "sp", "plan acts",
              "measured acts", "diff", "vs tp2");
  for (const Shape& shape : kShapes) {
    for (Recompute mode : {Recompute::kNone, Recompute::kFull}) {
      int64_t without = 0;
      for (bool sp : {false, true}) {
        SCOPED_TRACE(testing::Message() << shape.name << " " << EnumName(mode) << " sp " << sp);
        JobSpec spec = Spec(shape, 0);
        spec.parallel.dp = 1;
        spec.parallel.tp = 2;
        spec.parallel.sequence_parallel = sp;
        spec.model.recompute = mode;
        absl::StatusOr<v1::Plan> plan = MakePlan(spec, 2);
        ASSERT_TRUE(plan.ok()) << plan.status();
        const int64_t want = plan->memory_per_rank().activations_bytes();
        for (const MemoryUse& got : MeasuredMemory(spec, 2)) {
          EXPECT_LE(RelDiff(got.activations, want), 0.05);
          if (!sp) without = got.activations;
          if (sp) {
            EXPECT_LT(got.activations, without);
          }
          std::printf("%-9s %-10s %-3s %14lld %14lld %5.2f%% %8.3fx\n", shape.name,
                      std::string(EnumName(mode)).c_str(), sp ? "yes" : "no",
                      static_cast<long long>(want), static_cast<long long>(got.activations),
                      100 * RelDiff(got.activations, want), double(got.activations) / without);
        }
      }
    }
  }
}

// The plan's per-stage figures against every rank of a tp2 × pp2 mesh: each
// rank's slice (params, grads, AdamW state) and activations (the slots its
// schedule keeps: GPipe m, 1F1B min(m, pp - stage)) within 5%.
TEST_F(PlanMemoryTest, PipelineStagesMatchEachRankOfATp2Pp2Mesh) {
  const Shape& shape = kShapes[1];  // fortunes: 4 layers, 2 per stage
  std::printf("%-11s %5s %5s  %14s %14s %6s  %14s %14s %6s\n", "sched", "zero", "rank", "plan acts",
              "measured acts", "diff", "plan state", "measured state", "diff");
  // "interleaved": 1F1B over two model chunks per stage (layers 0, 2 and 1, 3).
  for (const char* schedule : {"gpipe", "1f1b", "interleaved"}) {
    for (int zero = 0; zero <= 1; ++zero) {
      JobSpec spec = Spec(shape, zero);
      spec.parallel.dp = 1;
      spec.parallel.tp = 2;
      spec.parallel.pp = 2;
      spec.parallel.schedule =
          std::string(schedule) == "gpipe" ? PipelineSchedule::kGpipe : PipelineSchedule::k1F1B;
      if (std::string(schedule) == "interleaved") spec.parallel.pp_virtual = 2;
      spec.batch.global = 4 * spec.batch.micro;  // m = 4 micro-batches per step
      absl::StatusOr<v1::Plan> plan = MakePlan(spec, 4);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_EQ(plan->stages_size(), 2);
      const std::vector<MemoryUse> got = MeasuredMemory(spec, 4);
      const ParallelDims dims = *spec.Dims();
      for (int rank = 0; rank < 4; ++rank) {
        SCOPED_TRACE(testing::Message() << schedule << " zero " << zero << " rank " << rank);
        const v1::MemoryEstimate& want = plan->stages(dims.Coord(rank).pp).memory();
        const MemoryUse& m = got[rank];
        const int64_t plan_state =
            want.params_bytes() + want.grads_bytes() + want.optimizer_bytes();
        const int64_t got_state = m.params + m.grads + m.optimizer;
        std::printf("%-11s %5d %5d  %14lld %14lld %5.2f%%  %14lld %14lld %5.2f%%\n", schedule, zero,
                    rank, static_cast<long long>(want.activations_bytes()),
                    static_cast<long long>(m.activations),
                    100 * RelDiff(m.activations, want.activations_bytes()),
                    static_cast<long long>(plan_state), static_cast<long long>(got_state),
                    100 * RelDiff(got_state, plan_state));
        EXPECT_LE(RelDiff(m.activations, want.activations_bytes()), 0.05);
        EXPECT_LE(RelDiff(got_state, plan_state), 0.05);
      }
    }
  }
}

// ZeRO under expert parallelism (ep 2 of dp 4): each MoE block's experts
// are sharded over the 2 ranks holding them, the rest over all 4; the
// plan's params, gradients and AdamW state per rank within 5% of what the
// last rank holds for ZeRO 1-3. The AdamW state per rank is then ep 1's
// (E/ep experts over dp/ep ranks: the same share), the whole parameters of
// ZeRO 1-2 smaller (half the experts).
TEST_F(PlanMemoryTest, ZeroUnderExpertParallelismMatchesThePlanWithin5Percent) {
  for (int zero = 1; zero <= 3; ++zero) {
    SCOPED_TRACE(testing::Message() << "zero " << zero);
    const std::string yaml =
        "name: plan-memory-moe\n"
        "model: {arch: llama, layers: 2, heads: 4, kv_heads: 2, dim: 64, ffn_dim: 128, "
        "context: 32, vocab: 256, rope_theta: 10000, "
        "moe: {experts: 4, top_k: 2, expert_ffn_dim: 128}}\n"
        "data: {train: " +
        (dir_ / "text.txt").string() +
        "}\n"
        "batch: {global: 8, micro: 2, seq_len: 32}\n"
        "parallel: {dp: 4, ep: 2, zero: " +
        std::to_string(zero) + "}\nsteps: 2\n";
    absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml);
    ASSERT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<v1::Plan> plan = MakePlan(*spec, 4);
    ASSERT_TRUE(plan.ok()) << plan.status();
    JobSpec naive = *spec;  // the same model without ep: every expert on every rank
    naive.parallel.ep = 1;
    absl::StatusOr<v1::Plan> naive_plan = MakePlan(naive, 4);
    ASSERT_TRUE(naive_plan.ok()) << naive_plan.status();
    const v1::MemoryEstimate& want = plan->memory_per_rank();
    const MemoryUse got = MeasuredMemory(*spec, 4)[3];
    std::printf(
        "moe ep2 dp4 zero %d: plan params %lld grads %lld optimizer %lld; measured %lld %lld "
        "%lld; ep 1 plans params %lld optimizer %lld\n",
        zero, static_cast<long long>(want.params_bytes()),
        static_cast<long long>(want.grads_bytes()), static_cast<long long>(want.optimizer_bytes()),
        static_cast<long long>(got.params), static_cast<long long>(got.grads),
        static_cast<long long>(got.optimizer),
        static_cast<long long>(naive_plan->memory_per_rank().params_bytes()),
        static_cast<long long>(naive_plan->memory_per_rank().optimizer_bytes()));
    EXPECT_LE(RelDiff(got.params, want.params_bytes()), 0.05);
    EXPECT_LE(RelDiff(got.grads, want.grads_bytes()), 0.05);
    EXPECT_LE(RelDiff(got.optimizer, want.optimizer_bytes()), 0.05);
    EXPECT_EQ(want.optimizer_bytes(), naive_plan->memory_per_rank().optimizer_bytes());
    if (zero < 3) {
      EXPECT_LT(want.params_bytes(), naive_plan->memory_per_rank().params_bytes());
    }
  }
}

// optimizer.state int8: AdamW's m and v in 2 bytes per element and 8 per
// block of 2048 (each unit's own grid; ZeRO shards of whole blocks): the
// plan's optimizer bytes per rank equal what the last rank holds for ZeRO
// 0-3 on dp 2, a quarter of fp32's and a little more.
TEST_F(PlanMemoryTest, Int8OptimizerStateMatchesThePlan) {
  for (int zero = 0; zero <= 3; ++zero) {
    SCOPED_TRACE(testing::Message() << "zero " << zero);
    JobSpec spec = Spec(kShapes[1], zero);
    const int64_t fp32 = MakePlan(spec, 2)->memory_per_rank().optimizer_bytes();
    spec.optimizer.state = OptimizerState::kInt8;
    absl::StatusOr<v1::Plan> plan = MakePlan(spec, 2);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const MemoryUse got = MeasuredMemory(spec, 2)[1];
    const v1::MemoryEstimate& want = plan->memory_per_rank();
    std::printf("int8 state, zero %d: optimizer planned %lld, measured %lld (fp32 moments: %lld)\n",
                zero, static_cast<long long>(want.optimizer_bytes()),
                static_cast<long long>(got.optimizer), static_cast<long long>(fp32));
    EXPECT_EQ(got.optimizer, want.optimizer_bytes());
    EXPECT_GT(want.optimizer_bytes(), fp32 / 4);
    EXPECT_LT(want.optimizer_bytes(), fp32 / 4 + fp32 / 100);
    EXPECT_LE(RelDiff(got.params, want.params_bytes()), 0.05);
    EXPECT_LE(RelDiff(got.grads, want.grads_bytes()), 0.05);
  }
}

}  // namespace
}  // namespace shardtrain::worker

namespace shardtrain::worker {
namespace {

// LoRA: the plan's frozen model and the adapters' state (params, grads,
// AdamW) against what the trainer holds, under ZeRO 0-3 with the frozen
// model in fp32, int8 and NF4 (QLoRA); the adapters' state a small fraction
// of the full run's.
TEST_F(PlanMemoryTest, LoraFrozenModelAndAdapterStateMatchThePlan) {
  for (int zero = 0; zero <= 3; ++zero) {
    // Each base format once, on ZeRO 0 and 3: the frozen model does not
    // depend on the stage.
    const char* base = zero == 0 ? "nf4" : zero == 1 ? "int8" : zero == 2 ? "bf16" : "nf4";
    SCOPED_TRACE(testing::Message() << "zero " << zero << ", base_dtype " << base);
    const JobSpec full = Spec(kShapes[1], zero);
    absl::StatusOr<JobSpec> spec = ParseJobSpec(
        JobSpecToYaml(full), {"finetune.lora={rank: 8, alpha: 16, targets: [q, k, v, o, up, down]}",
                              std::string("finetune.base_dtype=") + base});
    ASSERT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<v1::Plan> plan = MakePlan(*spec, 2);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const v1::MemoryEstimate& want = plan->memory_per_rank();
    const v1::MemoryEstimate& whole = MakePlan(full, 2)->memory_per_rank();
    const MemoryUse got = MeasuredMemory(*spec, 2)[1];
    const int64_t plan_state = want.params_bytes() + want.grads_bytes() + want.optimizer_bytes();
    const int64_t got_state = got.params + got.grads + got.optimizer;
    const int64_t full_state = whole.params_bytes() + whole.grads_bytes() + whole.optimizer_bytes();
    std::printf(
        "lora rank 8, zero %d, base %s: frozen planned %lld measured %lld; adapter state planned "
        "%lld measured %lld (full fine-tune %lld, %.1f%%); activations planned %lld "
        "measured %lld\n",
        zero, base, static_cast<long long>(want.frozen_bytes()), static_cast<long long>(got.frozen),
        static_cast<long long>(plan_state), static_cast<long long>(got_state),
        static_cast<long long>(full_state), 100.0 * plan_state / full_state,
        static_cast<long long>(want.activations_bytes()), static_cast<long long>(got.activations));
    EXPECT_EQ(got.frozen, want.frozen_bytes());
    EXPECT_LE(RelDiff(got_state, plan_state), 0.05);
    EXPECT_LE(RelDiff(got.optimizer, want.optimizer_bytes()), 0.05);
    EXPECT_LE(RelDiff(got.activations, want.activations_bytes()), 0.05);
    EXPECT_LT(plan_state, full_state / 5);
  }
}

}  // namespace
}  // namespace shardtrain::worker
