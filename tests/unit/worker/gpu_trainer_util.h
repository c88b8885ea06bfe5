// Helpers of the GPU trainer tests (gpu_trainer_test, gpu_parallel_trainer_test):
// a small GPT's spec on fortunes, trainers of it, losses step by step, and
// thread ranks of a layout (Gloo; a cuda spec's ranks share GPU 0).
#ifndef SHARDTRAIN_TESTS_UNIT_WORKER_GPU_TRAINER_UTIL_H_
#define SHARDTRAIN_TESTS_UNIT_WORKER_GPU_TRAINER_UTIL_H_

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/comm/test_util.h"
#include "tests/unit/worker/host_backed_device_comm.h"
#include "worker/device_probe.h"
#include "worker/trainer.h"

#ifndef SHARDTRAIN_FORTUNES_PATH
#error "SHARDTRAIN_FORTUNES_PATH must be defined by CMake"
#endif

namespace shardtrain::worker::gpu_testing {

// Skips the test, with the runtime's reason, where there is no GPU to train on.
#define SKIP_WITHOUT_GPU()                                                       \
  do {                                                                           \
    absl::StatusOr<std::vector<GpuInfo>> gpus = ProbeGpus();                     \
    if (!gpus.ok()) GTEST_SKIP() << gpus.status().message();                     \
    if (gpus->front().major < kMinComputeMajor) {                                \
      GTEST_SKIP() << gpus->front().model << " is below compute capability 8.0"; \
    }                                                                            \
  } while (0)

struct RunSpec {
  std::string device = "cpu";
  std::string precision = "fp32";
  int steps = 10;
  std::string model = "{layers: 2, heads: 4, dim: 64, context: 64, vocab: 256}";
  int micro = 8, seq_len = 37;  // T not a multiple of 32: the kernels' tails run
  std::string checkpoint_dir;   // checkpoint.every 5 when set
  std::string recompute = "none";
};

inline JobSpec SpecOf(const RunSpec& r) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      absl::StrCat(
          "name: gpu-trainer\n", "model: ", r.model, "\n",
          "data: {train: ", SHARDTRAIN_FORTUNES_PATH, "}\n", "batch: {global: ", r.micro,
          ", micro: ", r.micro, ", seq_len: ", r.seq_len, "}\n", "precision: ", r.precision, "\n",
          "optimizer: {lr: 0.003, warmup_steps: 20, weight_decay: 0.1, grad_clip: 1.0}\n",
          "steps: ", r.steps, "\n", "resources: {device: ", r.device, "}\n", "seed: 1337\n",
          r.checkpoint_dir.empty()
              ? ""
              : absl::StrCat("checkpoint: {every: 5, dir: ", r.checkpoint_dir, "}\n")),
      std::vector<std::string>{"model.recompute=" + r.recompute});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

inline std::unique_ptr<Trainer> MakeTrainer(const JobSpec& spec) {
  absl::StatusOr<std::unique_ptr<Trainer>> t =
      Trainer::Create(spec, /*rank=*/0, /*threads=*/2, /*comm=*/nullptr, /*gpu=*/0);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

// Steps [first, last] of `trainer`; the losses (index = step).
inline std::vector<double> Train(Trainer& trainer, int first, int last) {
  std::vector<double> loss(last + 1, NAN);
  for (int step = first; step <= last; ++step) {
    absl::StatusOr<StepResult> r = trainer.Step(step);
    EXPECT_TRUE(r.ok()) << "step " << step << ": " << r.status();
    if (!r.ok()) break;
    loss[step] = r->loss;
  }
  return loss;
}

inline std::vector<float> Params(Trainer& trainer) {
  absl::StatusOr<absl::Span<const float>> p = trainer.WholeModel();
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? std::vector<float>(p->begin(), p->end()) : std::vector<float>{};
}

// max |a - b| / max(1, |b|): relative where values are large, absolute near 0.
inline double MaxRelDiff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(1.0, std::abs(b[i])));
  }
  return worst;
}

inline double Mean(const std::vector<double>& v, size_t from) {
  return std::accumulate(v.begin() + from, v.end(), 0.0) / double(v.size() - from);
}

// `ranks` ranks' overrides of the other fields of a layout.
inline std::vector<std::string> Ranks(int ranks, std::vector<std::string> fields) {
  fields.push_back(absl::StrCat("resources.min_workers=", ranks));
  fields.push_back(absl::StrCat("resources.max_workers=", ranks));
  return fields;
}

// `spec` over `ranks` data-parallel ranks under ZeRO stage `zero` (0: DDP),
// the same global batch split over them.
inline JobSpec OnRanks(const JobSpec& spec, int ranks, int zero) {
  absl::StatusOr<JobSpec> out = ParseJobSpec(
      JobSpecToYaml(spec),
      Ranks(ranks, {absl::StrCat("parallel.dp=", ranks), absl::StrCat("parallel.zero=", zero),
                    absl::StrCat("batch.micro=", spec.batch.global / ranks)}));
  EXPECT_TRUE(out.ok()) << out.status();
  return *out;
}

// One thread rank per rank of `spec`, each with its Trainer over Gloo (a
// cuda spec's ranks all on GPU 0: Gloo through host copies, the way ranks
// share one GPU, which NCCL refuses). The losses of steps [first, last]
// averaged over the last pipeline stage's ranks (each one's is over its dp
// share of the batch; the other stages compute none), with `before` run on
// each rank's trainer first (e.g. a Restore) and `at` after each step.
// `device_memory_comm`: each rank's Gloo behind a HostBackedDeviceComm, so
// the trainer takes NCCL's device-memory paths on the one GPU.
inline std::vector<double> TrainRanks(
    const JobSpec& spec, int first, int last, const std::function<void(Trainer&)>& before = nullptr,
    const std::function<void(Trainer&, int rank, int step)>& at = nullptr,
    bool device_memory_comm = false) {
  const int ranks = spec.World();
  std::vector<std::vector<double>> per_rank(ranks);
  comm::testing::RunRanks(ranks, [&](comm::Communicator& gloo) {
    std::unique_ptr<HostBackedDeviceComm> device;  // outlives the trainer
    if (device_memory_comm) device = std::make_unique<HostBackedDeviceComm>(gloo);
    comm::Communicator& comm = device != nullptr ? *device : gloo;
    absl::StatusOr<std::unique_ptr<Trainer>> t =
        Trainer::Create(spec, comm.rank(), /*threads=*/2, &comm, /*gpu=*/0);
    ASSERT_TRUE(t.ok()) << t.status();
    if (before) before(**t);
    std::vector<double>& loss = per_rank[comm.rank()];
    loss.assign(last + 1, NAN);
    for (int step = first; step <= last; ++step) {
      absl::StatusOr<StepResult> r = (*t)->Step(step);
      ASSERT_TRUE(r.ok()) << "rank " << comm.rank() << " step " << step << ": " << r.status();
      loss[step] = r->loss;
      if (at) at(**t, comm.rank(), step);
    }
  });
  const absl::StatusOr<ParallelDims> dims = spec.Dims();
  std::vector<double> mean(last + 1, NAN);
  for (int step = first; step <= last; ++step) {
    double sum = 0;
    int n = 0;
    for (int r = 0; r < ranks; ++r) {
      if (dims->Coord(r).pp != dims->pp() - 1) continue;
      sum += per_rank[r].size() > size_t(step) ? per_rank[r][step] : NAN;
      ++n;
    }
    mean[step] = sum / n;
  }
  return mean;
}

}  // namespace shardtrain::worker::gpu_testing

#endif  // SHARDTRAIN_TESTS_UNIT_WORKER_GPU_TRAINER_UTIL_H_
