// MFU of a rank's step: the model's FLOPs per token (6 per matmul parameter,
// the LM head's included, plus attention's 12·L·C·T) times tokens per second
// over the device's dense peak for the job's precision; a tensor-parallel
// rank counts its half; CPUs and unlisted GPUs have none and say why.
#include "worker/mfu.h"

#include <gtest/gtest.h>

#include "common/job_spec.h"

namespace shardtrain::worker {
namespace {

JobSpec Spec(const std::string& device, const std::string& precision) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      "name: mfu\nmodel: {preset: gpt2-124m}\ndata: {train: d.txt}\n"
      "batch: {global: 16, micro: 16, seq_len: 1024}\nsteps: 10\nresources: {device: " +
      device + "}\nprecision: " + precision + "\n");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(MfuTest, Gpt2OnAnH200) {
  const JobSpec spec = Spec("cuda", "bf16");
  const model::ModelConfig cfg = *spec.model.Config();
  const MfuMeter mfu(spec, model::ParamLayout(cfg), "NVIDIA H200, compute capability 9.0");
  ASSERT_TRUE(mfu.known());
  EXPECT_EQ(mfu.description(), "MFU against H200's dense bf16 peak, 989.4 TFLOP/s");
  // GPT-2 124M: 12 blocks of 12·C² matmul weights, the head's Vp·C.
  const double C = 768, T = 1024, L = 12;
  const double matmul = L * 12 * C * C + double(cfg.padded_vocab) * C;
  const double per_token = 6 * matmul + 12 * L * C * T;
  EXPECT_NEAR(mfu.flops_per_token(), per_token, 1);
  // gpu_train_bench counts 6 per parameter of every kind (8.59e8, printed
  // as 8.6e+08): 0.5% more than the matmuls and the head.
  EXPECT_NEAR(per_token, 8.547e8, 0.001e8);
  StepResult r;
  r.tokens = 16 * 1024;
  r.step_ms = 60;
  EXPECT_NEAR(mfu.Of(r), r.tokens / 0.060 * per_token / 989.4e12, 1e-12);
  EXPECT_NEAR(mfu.Of(r), 0.2359, 0.0001);  // the H200's 273k tok/s: 23.6% on the progress line
  r.step_ms = 0;
  EXPECT_EQ(mfu.Of(r), 0);
  // A tp rank of two does half the matmuls and half the heads' attention.
  model::ModelSlice half;
  half.tp = 2;
  const MfuMeter tp(spec, model::ParamLayout(cfg, half), "NVIDIA H200");
  EXPECT_NEAR(tp.flops_per_token(), per_token / 2, 1);
}

TEST(MfuTest, OmittedOnCpusAndUnlistedGpus) {
  const JobSpec cpu = Spec("cpu", "fp32");
  const MfuMeter on_cpu(cpu, model::ParamLayout(*cpu.model.Config()), "x86_64, 2 cores");
  EXPECT_FALSE(on_cpu.known());
  EXPECT_EQ(on_cpu.description(),
            "MFU omitted: no accelerator (the host's CPUs have no row in the peak table)");
  StepResult r;
  r.tokens = 100;
  r.step_ms = 10;
  EXPECT_EQ(on_cpu.Of(r), 0);
  const JobSpec gpu = Spec("cuda", "bf16");
  const MfuMeter odd(gpu, model::ParamLayout(*gpu.model.Config()), "Imaginary GPU 9000");
  EXPECT_FALSE(odd.known());
  EXPECT_NE(odd.description().find("no dense peak known for \"Imaginary GPU 9000\""),
            std::string::npos)
      << odd.description();
}

}  // namespace
}  // namespace shardtrain::worker
