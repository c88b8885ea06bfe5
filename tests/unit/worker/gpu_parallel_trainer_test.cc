// Parallel layouts of GPU ranks through the whole trainer (label `gpu`: every
// test that needs a device skips without one, naming the reason):
//   - DDP, ZeRO-1/2/3, DDP with the optimizer offloaded, pp 2, dp 2 × pp 2,
//     tp 2 (also with sequence parallelism) and dp 2 × tp 2 with ranks
//     sharing one GPU (Gloo through host copies) equal one rank;
//   - the same layouts over device-memory communicators (NCCL's paths; Gloo
//     through host copies behind them, so on one GPU) equal one rank;
//   - context parallelism (cp 2, cp 4, cp 2 × tp 2, dp 2 × cp 2; staged and
//     device-memory rings) and an interleaved pipeline (pp 2, 2 chunks per
//     stage) equal one rank;
//   - over NCCL (one rank per GPU; needs two, four for dp 2 × tp 2): DDP,
//     ZeRO-1/2/3, DDP with the optimizer offloaded, tp 2, pp 2 and dp 2 × tp 2
//     equal one rank; what NCCL does not carry yet (ZeRO with the optimizer
//     offloaded) is refused naming the field.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/gpu_trainer_util.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/trainer.h"

namespace shardtrain::worker {
namespace {

using gpu_testing::MaxRelDiff;
using gpu_testing::Ranks;
using gpu_testing::RunSpec;
using gpu_testing::SpecOf;
using gpu_testing::TrainRanks;

constexpr int kSteps = 20;

// The 1-rank cuda spec of `base` (the small GPT by default) in `precision`,
// batch `micro`, kSteps steps.
JobSpec OneGpuSpec(const char* precision, int micro, RunSpec r = RunSpec{}) {
  r.device = "cuda";
  r.precision = precision;
  r.micro = micro;
  r.steps = kSteps;
  return SpecOf(r);
}

// Each named layout (overrides of the 1-rank spec: the same global batch of
// `micro` sequences) with its ranks sharing one GPU equals one rank over 20
// steps: within 1e-5 in fp32, 1e-2 in bf16 (against the 1-rank bf16 run).
// `device_memory_comm`: over HostBackedDeviceComm (NCCL's device-memory
// paths, played by Gloo through host copies).
using Layouts = std::vector<std::pair<std::string, std::vector<std::string>>>;
void ExpectLayoutsOnOneGpuEqualOneRank(int micro, const Layouts& layouts,
                                       bool device_memory_comm = false,
                                       const RunSpec& base = RunSpec{}) {
  for (const auto& [precision, tolerance] :
       {std::pair<const char*, double>{"fp32", 1e-5}, {"bf16", 1e-2}}) {
    const JobSpec spec = OneGpuSpec(precision, micro, base);
    const std::vector<double> want = TrainRanks(spec, 1, kSteps);
    for (const auto& [name, overrides] : layouts) {
      absl::StatusOr<JobSpec> split = ParseJobSpec(JobSpecToYaml(spec), overrides);
      ASSERT_TRUE(split.ok()) << split.status();
      const std::vector<double> got =
          TrainRanks(*split, 1, kSteps, nullptr, nullptr, device_memory_comm);
      const double diff = MaxRelDiff(got, want);
      std::printf(
          "[gpu-trainer] %s %s on one GPU%s vs 1 rank: step 1 %.7f / %.7f, step %d %.7f / %.7f, "
          "max rel diff %.3g\n",
          precision, name.c_str(), device_memory_comm ? " (device-memory comm)" : "", got[1],
          want[1], kSteps, got[kSteps], want[kSteps], diff);
      EXPECT_LE(diff, tolerance) << precision << " " << name;
    }
  }
}

// DDP and ZeRO-1/2/3 on 2 ranks of batch.micro `micro` each.
Layouts DataParallelLayouts(int micro) {
  Layouts layouts;
  for (int zero = 0; zero <= 3; ++zero) {
    layouts.push_back({absl::StrCat("dp2 zero", zero),
                       Ranks(2, {"parallel.dp=2", absl::StrCat("parallel.zero=", zero),
                                 absl::StrCat("batch.micro=", micro)})});
  }
  return layouts;
}

// For a global batch of 8: pp 2 with 1F1B over 4 micro-batches, dp 2 × pp 2
// under ZeRO-1, tp 2 (vocabulary-parallel ends), tp 2 with sequence
// parallelism, dp 2 × tp 2.
Layouts ModelParallelLayouts() {
  return {{"pp2", Ranks(2, {"parallel.pp=2", "batch.micro=2"})},
          {"dp2 pp2 zero1",
           Ranks(4, {"parallel.dp=2", "parallel.pp=2", "parallel.zero=1", "batch.micro=2"})},
          {"tp2", Ranks(2, {"parallel.tp=2"})},
          {"tp2 sp", Ranks(2, {"parallel.tp=2", "parallel.sequence_parallel=true"})},
          {"dp2 tp2", Ranks(4, {"parallel.dp=2", "parallel.tp=2", "batch.micro=4"})}};
}

// What NCCL's device-memory paths run: DataParallelLayouts(4), DDP with the
// optimizer offloaded on 2 ranks, and ModelParallelLayouts().
Layouts NcclPathLayouts() {
  Layouts layouts = DataParallelLayouts(4);
  layouts.push_back(
      {"dp2 offload", Ranks(2, {"parallel.dp=2", "parallel.offload=optimizer", "batch.micro=4"})});
  for (auto& layout : ModelParallelLayouts()) layouts.push_back(std::move(layout));
  return layouts;
}

// DDP and ZeRO-1/2/3 with 2 ranks on one GPU (Gloo through host copies),
// and DDP with the optimizer offloaded to the host on 1 and 2 ranks.
TEST(GpuParallelTrainerTest, DataParallelRanksOnOneGpuEqualOneRank) {
  SKIP_WITHOUT_GPU();
  Layouts layouts = DataParallelLayouts(2);
  layouts.push_back({"offload", {"parallel.offload=optimizer"}});
  layouts.push_back(
      {"dp2 offload", Ranks(2, {"parallel.dp=2", "parallel.offload=optimizer", "batch.micro=2"})});
  ExpectLayoutsOnOneGpuEqualOneRank(4, layouts);
}

// Model parallelism on one GPU (Gloo through host copies): pp 2 with 1F1B
// over 4 micro-batches, dp 2 × pp 2 under ZeRO-1, tp 2 (vocabulary-parallel
// ends, the tp sums through the host in fp32) and dp 2 × tp 2.
TEST(GpuParallelTrainerTest, TensorAndPipelineParallelOnOneGpuEqualOneRank) {
  SKIP_WITHOUT_GPU();
  ExpectLayoutsOnOneGpuEqualOneRank(8, ModelParallelLayouts());
}

// model.attention auto on a model whose heads have 64 channels: flash in
// bf16 (materialized in fp32), under pp 2, dp 2 × pp 2, tp 2, tp 2 with
// sequence parallelism and dp 2 × tp 2 on one GPU, each equal to one rank
// (T = 100: flash's tiles end part-way).
TEST(GpuParallelTrainerTest, FlashAttentionUnderModelParallelismOnOneGpuEqualsOneRank) {
  SKIP_WITHOUT_GPU();
  RunSpec base;
  base.model = "{layers: 2, heads: 2, dim: 128, context: 128, vocab: 256}";
  base.seq_len = 100;
  ASSERT_TRUE(OneGpuSpec("bf16", 8, base).Activations().flash_attention);
  ASSERT_FALSE(OneGpuSpec("fp32", 8, base).Activations().flash_attention);
  ExpectLayoutsOnOneGpuEqualOneRank(8, ModelParallelLayouts(), /*device_memory_comm=*/false, base);
}

// Context parallelism on one GPU, T = 40 (chunks of 10 and 5 tokens): cp 2,
// cp 4, cp 2 × tp 2 and dp 2 × cp 2, the ring's key/value blocks staged
// through the host (Gloo) and passed in the engine's buffers
// (device-memory communicators: NCCL's path, Gloo behind
// HostBackedDeviceComm); and an interleaved pipeline, pp 2 with two model
// chunks per stage. Each equals one rank.
TEST(GpuParallelTrainerTest, ContextParallelAndInterleavedStagesOnOneGpuEqualOneRank) {
  SKIP_WITHOUT_GPU();
  RunSpec base;
  base.model = "{layers: 4, heads: 4, dim: 64, context: 64, vocab: 256}";
  base.seq_len = 40;
  const Layouts cp = {{"cp2", Ranks(2, {"parallel.cp=2"})},
                      {"cp4", Ranks(4, {"parallel.cp=4"})},
                      {"cp2 tp2", Ranks(4, {"parallel.cp=2", "parallel.tp=2"})},
                      {"dp2 cp2", Ranks(4, {"parallel.dp=2", "parallel.cp=2", "batch.micro=4"})}};
  ExpectLayoutsOnOneGpuEqualOneRank(8, cp, /*device_memory_comm=*/false, base);
  ExpectLayoutsOnOneGpuEqualOneRank(8, cp, /*device_memory_comm=*/true, base);
  ExpectLayoutsOnOneGpuEqualOneRank(
      8, {{"pp2 v2", Ranks(2, {"parallel.pp=2", "parallel.pp_virtual=2", "batch.micro=2"})}},
      /*device_memory_comm=*/false, base);
}

// NCCL's device-memory paths with every layout's ranks on one GPU (the
// communicators are Gloo behind HostBackedDeviceComm, since NCCL refuses two
// ranks on one device): DDP and ZeRO-1/2/3 reducing in the engine's
// buffers (DDP also with the optimizer offloaded to the host); pp 2 sending device buffers (1F1B
// over 4 micro-batches) with the tied embeddings summed in device memory; tp 2 (with sequence
// parallelism, its LayerNorm partials summed on the device) with the CUDA engine's tp collectives
// in device memory; dp 2 × tp 2 and dp 2 × pp 2 under ZeRO-1. Each equals one rank like the
// Gloo-staged layouts above.
TEST(GpuParallelTrainerTest, DeviceMemoryPathsWithRanksOnOneGpuEqualOneRank) {
  SKIP_WITHOUT_GPU();
  ExpectLayoutsOnOneGpuEqualOneRank(8, NcclPathLayouts(), /*device_memory_comm=*/true);
}

// A Mixtral-style model (4 experts, top 2) with its experts split over
// ep 2, the ranks sharing one GPU: the rows go to their experts' rank and
// back through host fp32 (CudaModel::EpAllToAll over Gloo), and in the
// engine's buffers in the compute type over a device-memory group (NCCL's
// path; Gloo behind HostBackedDeviceComm here), dp 2 × ep 2 and ZeRO-1
// with ep 2, each equal to one rank over 20 steps. No balancing loss: it is
// per micro-batch, and the one rank's micro-batch is the layouts' two.
TEST(GpuParallelTrainerTest, ExpertParallelRanksOnOneGpuEqualOneRank) {
  SKIP_WITHOUT_GPU();
  RunSpec base;
  base.model =
      "{arch: llama, layers: 2, heads: 4, kv_heads: 2, dim: 64, ffn_dim: 128, context: 64, "
      "vocab: 256, rope_theta: 10000, moe: {experts: 4, top_k: 2, expert_ffn_dim: 64}}";
  for (const auto& [precision, tolerance] :
       {std::pair<const char*, double>{"fp32", 1e-5}, {"bf16", 1e-2}}) {
    absl::StatusOr<JobSpec> one =
        ParseJobSpec(JobSpecToYaml(OneGpuSpec(precision, 8, base)), {"router.aux_loss_coef=0"});
    ASSERT_TRUE(one.ok()) << one.status();
    const std::vector<double> want = TrainRanks(*one, 1, kSteps);
    for (const auto& [name, overrides] : Layouts{
             {"dp2 ep2", Ranks(2, {"parallel.dp=2", "parallel.ep=2", "batch.micro=4"})},
             {"dp2 ep2 zero1",
              Ranks(2, {"parallel.dp=2", "parallel.ep=2", "parallel.zero=1", "batch.micro=4"})}}) {
      absl::StatusOr<JobSpec> split = ParseJobSpec(JobSpecToYaml(*one), overrides);
      ASSERT_TRUE(split.ok()) << split.status();
      for (const bool device_memory : {false, true}) {
        const std::vector<double> got =
            TrainRanks(*split, 1, kSteps, nullptr, nullptr, device_memory);
        const double diff = MaxRelDiff(got, want);
        std::printf(
            "[gpu-trainer] %s moe %s on one GPU%s vs 1 rank: step %d %.7f / %.7f, max rel "
            "diff %.3g\n",
            precision, name.c_str(), device_memory ? " (device-memory comm)" : "", kSteps,
            got[kSteps], want[kSteps], diff);
        EXPECT_LE(diff, tolerance) << precision << " " << name << " " << device_memory;
      }
    }
  }
}

// DDP reducing its buckets in bf16 (parallel.reduce_dtype: bf16, NCCL's
// device path; here Gloo behind HostBackedDeviceComm on one GPU): the CUDA
// conversion kernels around the reduction, within bf16's precision of one
// rank (1e-2 relative over 20 steps, in fp32 and bf16 compute).
TEST(GpuParallelTrainerTest, Bf16GradientReductionOnOneGpuStaysNearOneRank) {
  SKIP_WITHOUT_GPU();
  for (const char* precision : {"fp32", "bf16"}) {
    const JobSpec spec = OneGpuSpec(precision, 8);
    const std::vector<double> want = TrainRanks(spec, 1, kSteps);
    absl::StatusOr<JobSpec> bf16 = ParseJobSpec(
        JobSpecToYaml(spec), Ranks(2, {"parallel.dp=2", "batch.micro=4", "parallel.comm=nccl",
                                       "parallel.reduce_dtype=bf16"}));
    ASSERT_TRUE(bf16.ok()) << bf16.status();
    const std::vector<double> got =
        TrainRanks(*bf16, 1, kSteps, nullptr, nullptr, /*device_memory_comm=*/true);
    const double diff = MaxRelDiff(got, want);
    std::printf(
        "[gpu-trainer] %s dp2 reduce_dtype bf16 on one GPU (device-memory comm) vs 1 rank: step "
        "%d %.7f / %.7f, max rel diff %.3g\n",
        precision, kSteps, got[kSteps], want[kSteps], diff);
    EXPECT_LE(diff, 1e-2) << precision;
  }
}

// What GPU ranks cannot do yet is refused before any device is touched,
// naming the field (the job fails at once instead of a rank aborting in the
// engine mid-step): NCCL offloads the optimizer under DDP only so far (not
// ZeRO's shards). Runs anywhere.
TEST(GpuParallelTrainerTest, NcclWithZeroAndOffloadIsRefusedNamingTheField) {
  RunSpec r;
  r.device = "cuda";
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec(JobSpecToYaml(SpecOf(r)),
                   {"parallel.comm=nccl", "parallel.offload=optimizer", "parallel.zero=1"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(*spec, 0, 1, nullptr, 0);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
  EXPECT_EQ(t.status().message().rfind("parallel.comm: nccl offloads the optimizer under DDP", 0),
            0u)
      << t.status();
}

// `spec`'s ranks over NCCL, rank r on GPU r (threads); the mean loss of
// steps 1..steps over the last stage's ranks.
std::vector<double> TrainNcclRanks(const JobSpec& spec, int steps, const std::string& prefix) {
  const int ranks = spec.World();
  auto store = std::make_shared<comm::InMemoryStore>();
  std::vector<std::vector<double>> losses(ranks, std::vector<double>(steps + 1, NAN));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      comm::NcclOptions o;
      o.device = rank;
      o.prefix = prefix;
      absl::StatusOr<std::unique_ptr<comm::Communicator>> c =
          comm::CreateNcclCommunicator(store, rank, ranks, o);
      ASSERT_TRUE(c.ok()) << c.status();
      absl::StatusOr<std::unique_ptr<Trainer>> t =
          Trainer::Create(spec, rank, /*threads=*/2, c->get(), /*gpu=*/rank);
      ASSERT_TRUE(t.ok()) << t.status();
      for (int step = 1; step <= steps; ++step) {
        absl::StatusOr<StepResult> s = (*t)->Step(step);
        ASSERT_TRUE(s.ok()) << "rank " << rank << " step " << step << ": " << s.status();
        losses[rank][step] = s->loss;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // The mean over the last pipeline stage's ranks (the others compute no loss).
  const absl::StatusOr<ParallelDims> dims = spec.Dims();
  std::vector<double> mean(steps + 1, NAN);
  for (int step = 1; step <= steps; ++step) {
    double sum = 0;
    int n = 0;
    for (int rank = 0; rank < ranks; ++rank) {
      if (dims->Coord(rank).pp != dims->pp() - 1) continue;
      sum += losses[rank][step];
      ++n;
    }
    mean[step] = sum / n;
  }
  return mean;
}

// Layouts over NCCL, one rank per GPU (NCCL refuses two on one): DDP and
// ZeRO-1/2/3 (gradients reduced in device memory as backward makes them
// final), DDP with the optimizer offloaded, pp 2 (activations sent between GPUs), tp 2 with and
// without sequence parallelism (the engine's tp collectives in device memory) on two GPUs, and dp 2
// × tp 2, dp 2 × pp 2 ZeRO-1 on four; each equal to one rank over 20 steps within 1e-5 in fp32,
// 1e-2 in bf16. A layout needing more GPUs than there are is left out, saying so; none at all below
// two.
TEST(GpuParallelTrainerTest, NcclLayoutsOnSeveralGpusEqualOneRank) {
  SKIP_WITHOUT_GPU();
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    GTEST_SKIP() << "needs two CUDA devices (NCCL refuses two ranks on one GPU); found " << devices;
  }
  const Layouts layouts = NcclPathLayouts();
  for (const auto& [precision, tolerance] :
       {std::pair<const char*, double>{"fp32", 1e-5}, {"bf16", 1e-2}}) {
    const JobSpec spec = OneGpuSpec(precision, 8);
    const std::vector<double> want = TrainRanks(spec, 1, kSteps);
    for (const auto& [name, overrides] : layouts) {
      std::vector<std::string> o = overrides;
      o.push_back("parallel.comm=nccl");
      absl::StatusOr<JobSpec> nccl = ParseJobSpec(JobSpecToYaml(spec), o);
      ASSERT_TRUE(nccl.ok()) << nccl.status();
      if (nccl->World() > devices) {
        std::printf("[gpu-trainer] %s NCCL %s left out: needs %d GPUs, found %d\n", precision,
                    name.c_str(), nccl->World(), devices);
        continue;
      }
      const std::vector<double> got =
          TrainNcclRanks(*nccl, kSteps, absl::StrCat("nccl/", precision, "/", name));
      const double diff = MaxRelDiff(got, want);
      std::printf(
          "[gpu-trainer] %s NCCL %s on %d GPUs vs 1 rank: step %d %.7f / %.7f, max rel diff "
          "%.3g\n",
          precision, name.c_str(), nccl->World(), kSteps, got[kSteps], want[kSteps], diff);
      EXPECT_LE(diff, tolerance) << precision << " " << name;
    }
  }
}

}  // namespace
}  // namespace shardtrain::worker
