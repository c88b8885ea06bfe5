#include "common/job_spec.h"

#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/common/job_spec_test_util.h"

namespace shardtrain {
namespace {

using job_spec_testing::kSourceDir;
using job_spec_testing::Make;
using job_spec_testing::ReadFile;
using job_spec_testing::YamlFiles;

TEST(JobSpecTest, MinimalSpecGetsDefaults) {
  auto spec = ParseJobSpec(Make());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "t");
  EXPECT_EQ(spec->model.preset, "");
  EXPECT_EQ(spec->model.layers, 2);
  EXPECT_EQ(spec->model.heads, 2);
  EXPECT_EQ(spec->model.dim, 8);
  EXPECT_EQ(spec->model.context, 16);
  EXPECT_EQ(spec->model.vocab, 256);
  EXPECT_EQ(spec->data.train, "d.txt");
  EXPECT_EQ(spec->data.val, "");
  EXPECT_EQ(spec->data.format, DataFormat::kText);
  EXPECT_EQ(spec->data.tokenizer, TokenizerKind::kByte);
  EXPECT_EQ(spec->batch.global, 4);
  EXPECT_EQ(spec->batch.micro, 2);
  EXPECT_EQ(spec->batch.seq_len, 8);
  EXPECT_EQ(spec->parallel.dp, 1);
  EXPECT_EQ(spec->parallel.tp, 1);
  EXPECT_EQ(spec->parallel.pp, 1);
  EXPECT_EQ(spec->parallel.zero, 0);
  EXPECT_EQ(spec->parallel.offload, OffloadMode::kNone);
  EXPECT_EQ(spec->parallel.schedule, PipelineSchedule::k1F1B);
  EXPECT_TRUE(spec->parallel.reshard_after_forward);
  EXPECT_EQ(spec->parallel.bucket_mb, 25);
  EXPECT_EQ(spec->parallel.comm, CommBackend::kAuto);
  EXPECT_EQ(spec->parallel.reduce_dtype, ReduceDtype::kFp32);
  EXPECT_EQ(spec->precision, Precision::kFp32);
  EXPECT_EQ(spec->optimizer.name, OptimizerKind::kAdamW);
  EXPECT_DOUBLE_EQ(spec->optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(spec->optimizer.min_lr, 3e-5);
  EXPECT_EQ(spec->optimizer.betas, (std::vector<double>{0.9, 0.95}));
  EXPECT_DOUBLE_EQ(spec->optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(spec->optimizer.weight_decay, 0.0);
  EXPECT_EQ(spec->optimizer.warmup_steps, 0);
  EXPECT_EQ(spec->optimizer.schedule, LrSchedule::kCosine);
  EXPECT_DOUBLE_EQ(spec->optimizer.grad_clip, 1.0);
  EXPECT_EQ(spec->steps, 3);
  EXPECT_EQ(spec->checkpoint.every, 0);
  EXPECT_EQ(spec->checkpoint.dir, "");
  EXPECT_EQ(spec->checkpoint.keep, 3);
  EXPECT_EQ(spec->eval.every, 0);  // no validation loss unless asked for
  EXPECT_EQ(spec->eval.batches, 2);
  EXPECT_EQ(spec->seed, 1337u);
  EXPECT_EQ(spec->resources.device, DeviceKind::kCpu);
  EXPECT_EQ(spec->resources.min_workers, 1);
  EXPECT_EQ(spec->resources.max_workers, 1);
  EXPECT_EQ(spec->max_restarts, 3);
  EXPECT_EQ(spec->timeouts.collective_s, 60);
  EXPECT_EQ(spec->World(), 1);
  EXPECT_EQ(spec->Split()->accum, 2);
}

TEST(JobSpecTest, MinLrDefaultsToATenthOfLr) {
  auto spec = ParseJobSpec(Make({{"optimizer", "{lr: 0.002}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->optimizer.min_lr, 0.0002);
}

TEST(JobSpecTest, WorldAndWorkerDefaults) {
  auto spec =
      ParseJobSpec(Make({{"model", "{layers: 4, heads: 4, dim: 16, context: 16, vocab: 256}"},
                         {"batch", "{global: 12, micro: 2, seq_len: 8}"},
                         {"parallel", "{dp: 3, tp: 2, pp: 2}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->World(), 12);
  EXPECT_EQ(spec->Split()->accum, 2);
  EXPECT_EQ(spec->resources.min_workers, 12);
  EXPECT_EQ(spec->resources.max_workers, 12);
}

// model.attention: flash where its kernels serve the job (resources.device
// cuda, bf16 or fp16, heads of 64 or 128 channels), refused elsewhere
// naming the field; the activation policy follows it, and the canonical
// YAML keeps it. auto (the default) resolves to flash exactly where flash
// would be accepted (and parallel.cp is 1), to materialized elsewhere.
TEST(JobSpecTest, FlashAttentionOnCudaIn16BitWithHeadsOf64) {
  const std::string model = "{layers: 2, heads: 2, dim: 128, context: 16, vocab: 256";
  auto parse = [&](const std::string& device, const std::string& precision, const std::string& m) {
    return ParseJobSpec(Make(
        {{"model", m + "}"}, {"resources", "{device: " + device + "}"}, {"precision", precision}}));
  };
  absl::StatusOr<JobSpec> plain = parse("cuda", "bf16", model + ", attention: materialized");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->model.attention, AttentionKind::kMaterialized);
  EXPECT_FALSE(plain->Activations().flash_attention);
  for (const std::string& attention : {std::string(), std::string(", attention: auto")}) {
    for (const auto& [device, precision, m, want] :
         std::vector<std::tuple<std::string, std::string, std::string, AttentionKind>>{
             {"cuda", "bf16", model, AttentionKind::kFlash},
             {"cuda", "fp16", model, AttentionKind::kFlash},
             {"cuda", "fp32", model, AttentionKind::kMaterialized},
             {"cpu", "bf16", model, AttentionKind::kMaterialized},
             {"cuda", "bf16", "{layers: 2, heads: 4, dim: 128, context: 16, vocab: 256",
              AttentionKind::kMaterialized}}) {
      absl::StatusOr<JobSpec> spec = parse(device, precision, m + attention);
      ASSERT_TRUE(spec.ok()) << spec.status();
      EXPECT_EQ(spec->model.attention, want) << device << " " << precision << " " << m;
      absl::StatusOr<JobSpec> again = ParseJobSpec(JobSpecToYaml(*spec));
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_EQ(again->model.attention, want);  // the YAML names the kernels
    }
  }
  // Context parallelism keeps the ring's kernels (CPU ranks so far).
  absl::StatusOr<JobSpec> ring = ParseJobSpec(Make({{"model", model + "}"},
                                                    {"parallel", "{cp: 2}"},
                                                    {"batch", "{global: 1, micro: 1, seq_len: 16}"},
                                                    {"precision", "bf16"}}));
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_EQ(ring->model.attention, AttentionKind::kMaterialized);
  for (const char* precision : {"bf16", "fp16"}) {
    absl::StatusOr<JobSpec> flash = parse("cuda", precision, model + ", attention: flash");
    ASSERT_TRUE(flash.ok()) << flash.status();
    EXPECT_TRUE(flash->Activations().flash_attention);
    absl::StatusOr<JobSpec> again = ParseJobSpec(JobSpecToYaml(*flash));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->model.attention, AttentionKind::kFlash);
  }
  for (const auto& [device, precision, m, why] :
       std::vector<std::tuple<std::string, std::string, std::string, std::string>>{
           {"cpu", "fp32", model, "resources.device: cuda"},
           {"cuda", "fp32", model, "bf16 or fp16"},
           {"cuda", "bf16", "{layers: 2, heads: 4, dim: 128, context: 16, vocab: 256",
            "head size 32"}}) {
    absl::StatusOr<JobSpec> bad = parse(device, precision, m + ", attention: flash");
    ASSERT_FALSE(bad.ok()) << device << " " << precision;
    const std::string message(bad.status().message());
    EXPECT_NE(message.find("model.attention"), std::string::npos) << message;
    EXPECT_NE(message.find(why), std::string::npos) << message;
  }
  absl::StatusOr<JobSpec> bf16 = ParseJobSpec(Make({{"precision", "bf16"}}));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->Compute(), DataType::kBFloat16);
  EXPECT_EQ(ParseJobSpec(Make())->Compute(), DataType::kFloat32);
}

TEST(JobSpecTest, PresetExpandsAndExplicitFieldsOverride) {
  auto spec = ParseJobSpec(Make({{"model", "{preset: gpt2-124m, context: 256}"},
                                 {"batch", "{global: 4, micro: 2, seq_len: 256}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model.preset, "gpt2-124m");
  EXPECT_EQ(spec->model.layers, 12);
  EXPECT_EQ(spec->model.heads, 12);
  EXPECT_EQ(spec->model.dim, 768);
  EXPECT_EQ(spec->model.context, 256);
  EXPECT_EQ(spec->model.vocab, 50257);
}

TEST(JobSpecTest, LlmcDefaultsToGpt2Tokenizer) {
  auto spec = ParseJobSpec(
      Make({{"model", "{preset: gpt2-124m}"}, {"data", "{train: t.bin, format: llmc}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data.format, DataFormat::kLlmc);
  EXPECT_EQ(spec->data.tokenizer, TokenizerKind::kGpt2);
  auto bytes = ParseJobSpec(Make({{"data", "{train: t.bin, format: llmc, tokenizer: byte}"}}));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->data.tokenizer, TokenizerKind::kByte);
}

TEST(JobSpecTest, Llama3AndTokenizerJsonTokenizers) {
  auto llama = ParseJobSpec(Make({{"model", "{preset: llama-tiny, vocab: 128256}"},
                                  {"data", "{train: t, format: llmc, tokenizer: llama3}"}}));
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->data.tokenizer, TokenizerKind::kLlama3);
  EXPECT_TRUE(llama->data.tokenizer_json.empty());
  // tokenizer_json alone means tokenizer: json, and survives the round trip.
  auto json = ParseJobSpec(Make({{"model", "{preset: llama-tiny, vocab: 151936}"},
                                 {"data", "{train: t, format: llmc, tokenizer_json: q/t.json}"}}));
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->data.tokenizer, TokenizerKind::kJson);
  EXPECT_EQ(json->data.tokenizer_json, "q/t.json");
  auto again = ParseJobSpec(JobSpecToYaml(*json));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->data.tokenizer_json, "q/t.json");
  EXPECT_EQ(EnumName(TokenizerKind::kLlama3), "llama3");
  EXPECT_EQ(EnumName(TokenizerKind::kJson), "json");
  const std::pair<std::string, std::string> bad[] = {
      {Make({{"model", "{preset: llama-tiny, vocab: 50257}"},
             {"data", "{train: t, format: llmc, tokenizer: llama3}"}}),
       "model.vocab: 50257 is too small for the llama3 tokenizer (needs >= 128256)"},
      {Make({{"data", "{train: t, tokenizer: llama3}"}}),
       "data.tokenizer: llama3 requires data.format: llmc"},
      {Make({{"data", "{train: t, format: llmc, tokenizer: json}"}}),
       "data.tokenizer_json: required with data.tokenizer: json"},
      {Make({{"model", "{preset: gpt2-124m}"},
             {"data", "{train: t, format: llmc, tokenizer: gpt2, tokenizer_json: x.json}"}}),
       "data.tokenizer_json: only with data.tokenizer: json (it is gpt2)"},
  };
  for (const auto& [text, want] : bad) {
    auto s = ParseJobSpec(text);
    ASSERT_FALSE(s.ok()) << want;
    EXPECT_NE(s.status().message().find(want), std::string::npos) << s.status();
  }
}

TEST(JobSpecTest, ExamplesParse) {
  std::vector<std::string> files = YamlFiles(kSourceDir + "/examples");
  std::vector<std::string> good = YamlFiles(kSourceDir + "/tests/data/specs/good");
  files.insert(files.end(), good.begin(), good.end());
  ASSERT_GE(files.size(), 4u);
  for (const std::string& f : files) {
    auto spec = ParseJobSpec(ReadFile(f));
    EXPECT_TRUE(spec.ok()) << f << ": " << spec.status();
  }
}

TEST(JobSpecTest, ExampleValues) {
  auto tiny = ParseJobSpec(ReadFile(kSourceDir + "/examples/fortunes-tiny.yaml"));
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ(tiny->name, "fortunes-tiny");
  EXPECT_EQ(tiny->model.layers, 4);
  EXPECT_EQ(tiny->model.dim, 128);
  EXPECT_EQ(tiny->data.train, "data/fortunes.txt");
  EXPECT_EQ(tiny->World(), 1);
  EXPECT_EQ(tiny->Split()->accum, 1);
  EXPECT_DOUBLE_EQ(tiny->optimizer.lr, 3e-3);
  EXPECT_DOUBLE_EQ(tiny->optimizer.weight_decay, 0.1);
  EXPECT_EQ(tiny->optimizer.warmup_steps, 20);
  EXPECT_EQ(tiny->steps, 300);
  EXPECT_EQ(tiny->checkpoint.dir, "ckpt/fortunes-tiny");

  auto ddp = ParseJobSpec(ReadFile(kSourceDir + "/examples/fortunes-ddp.yaml"));
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  EXPECT_EQ(ddp->World(), 4);
  EXPECT_EQ(ddp->Split()->accum, 1);
  EXPECT_EQ(ddp->steps, 600);
  EXPECT_EQ(ddp->data.val, "data/fortunes-val.txt");
  EXPECT_EQ(ddp->eval.every, 50);
  EXPECT_EQ(ddp->eval.batches, 2);

  auto big = ParseJobSpec(ReadFile(kSourceDir + "/examples/gpt2-124m-zero3.yaml"));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->model.layers, 12);
  EXPECT_EQ(big->model.vocab, 50257);
  EXPECT_EQ(big->parallel.zero, 3);
  EXPECT_EQ(big->World(), 8);
  EXPECT_EQ(big->precision, Precision::kBf16);
  EXPECT_EQ(big->data.format, DataFormat::kLlmc);
  EXPECT_EQ(big->data.tokenizer, TokenizerKind::kGpt2);
  EXPECT_EQ(big->resources.device, DeviceKind::kCuda);

  auto tiny4 = ParseJobSpec(ReadFile(kSourceDir + "/tests/data/specs/good/tiny.yaml"));
  ASSERT_TRUE(tiny4.ok()) << tiny4.status();
  EXPECT_EQ(tiny4->World(), 4);
  EXPECT_EQ(tiny4->steps, 5);
}

void ExpectRoundTrip(const std::string& text, const std::string& what) {
  auto first = ParseJobSpec(text);
  ASSERT_TRUE(first.ok()) << what << ": " << first.status();
  std::string yaml = JobSpecToYaml(*first);
  auto second = ParseJobSpec(yaml);
  ASSERT_TRUE(second.ok()) << what << ": " << second.status() << "\n" << yaml;
  EXPECT_TRUE(*first == *second) << what << ":\n" << yaml;
  EXPECT_EQ(JobSpecToYaml(*second), yaml) << what;
}

TEST(JobSpecTest, RoundTripExamples) {
  for (const std::string& f : YamlFiles(kSourceDir + "/examples")) ExpectRoundTrip(ReadFile(f), f);
  ExpectRoundTrip(Make(), "minimal");
}

TEST(JobSpecTest, RoundTripEveryFieldChanged) {
  const std::string text = R"(
name: every.field_changed-1
model: {preset: gpt2-124m, layers: 8, context: 512, recompute: full, recompute_layers: 2}
data: {train: "a path: with colon", val: 'v.bin', format: llmc, tokenizer: gpt2}
batch: {global: 96, micro: 4, seq_len: 300}
parallel: {dp: 2, tp: 4, pp: 2, stages: [3, 5], zero: 2, offload: optimizer, schedule: gpipe,
           reshard_after_forward: false, bucket_mb: 7, sequence_parallel: true, comm: nccl}
precision: fp16
optimizer: {name: adamw, lr: 0.0007, min_lr: 1.2345678901234567e-5, betas: [0.8, 0.999],
            eps: 1e-6, weight_decay: 0.01, warmup_steps: 13, schedule: linear, grad_clip: 0}
steps: 77
checkpoint: {every: 5, dir: "/tmp/ck pt", keep: 1}
eval: {every: 11, batches: 3}
seed: 18446744073
resources: {device: cuda, min_workers: 8, max_workers: 32}
max_restarts: 0
timeouts: {collective_s: 5}
)";
  auto spec = ParseJobSpec(text);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model.layers, 8);
  EXPECT_EQ(spec->model.heads, 12);
  EXPECT_EQ(spec->data.train, "a path: with colon");
  EXPECT_EQ(spec->parallel.schedule, PipelineSchedule::kGpipe);
  EXPECT_FALSE(spec->parallel.reshard_after_forward);
  EXPECT_TRUE(spec->parallel.sequence_parallel);
  EXPECT_EQ(spec->parallel.comm, CommBackend::kNccl);
  EXPECT_EQ(spec->model.recompute, Recompute::kFull);
  EXPECT_EQ(spec->model.recompute_layers, 2);
  EXPECT_EQ(spec->parallel.stages, (std::vector<int>{3, 5}));
  EXPECT_DOUBLE_EQ(spec->optimizer.grad_clip, 0.0);
  EXPECT_EQ(spec->optimizer.betas, (std::vector<double>{0.8, 0.999}));
  EXPECT_EQ(spec->seed, 18446744073u);
  EXPECT_EQ(spec->eval.every, 11);
  EXPECT_EQ(spec->eval.batches, 3);
  EXPECT_EQ(spec->World(), 16);
  EXPECT_EQ(spec->Split()->accum, 12);
  ExpectRoundTrip(text, "every field");
  // Doubles survive exactly, not just approximately.
  auto again = ParseJobSpec(JobSpecToYaml(*spec));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->optimizer.min_lr, 1.2345678901234567e-5);
  EXPECT_EQ(again->optimizer.lr, 0.0007);
}

TEST(JobSpecTest, OverridesApplyBeforeValidation) {
  auto spec = ParseJobSpec(
      Make(), {"parallel.zero=3", "steps=20", "optimizer.betas=[0.9,0.99]", "parallel.dp=2",
               "model.preset=gpt2-124m", "precision=bf16", "data.val=v.txt"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->parallel.zero, 3);
  EXPECT_EQ(spec->steps, 20);
  EXPECT_EQ(spec->optimizer.betas, (std::vector<double>{0.9, 0.99}));
  EXPECT_EQ(spec->parallel.dp, 2);
  EXPECT_EQ(spec->model.preset, "gpt2-124m");
  EXPECT_EQ(spec->model.layers, 2);  // explicit field in the file still wins over the preset
  EXPECT_EQ(spec->precision, Precision::kBf16);
  EXPECT_EQ(spec->data.val, "v.txt");
  EXPECT_EQ(spec->World(), 2);
  // Later overrides win; a whole section can be replaced with a flow map.
  auto later =
      ParseJobSpec(Make(), {"steps=5", "steps=6", "batch={global: 8, micro: 4, seq_len: 16}"});
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->steps, 6);
  EXPECT_EQ(later->batch.global, 8);
  // Overrides can make an invalid file valid ...
  auto fixed = ParseJobSpec(Make({{"steps", "<drop>"}}), {"steps=9"});
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(fixed->steps, 9);
  // ... and are validated like the file.
  auto broken = ParseJobSpec(Make(), {"parallel.tp=3"});
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(broken.status().message().rfind("parallel.tp: 3 does not divide model.heads: 2", 0), 0u)
      << broken.status();
}

TEST(JobSpecTest, StagesDefaultToBalancedAndOverride) {
  const std::string model4 = "{layers: 4, heads: 4, dim: 16, context: 16, vocab: 256}";
  auto balanced = ParseJobSpec(Make({{"model", model4}, {"parallel", "{pp: 2}"}}));
  ASSERT_TRUE(balanced.ok()) << balanced.status();
  EXPECT_TRUE(balanced->parallel.stages.empty());
  EXPECT_NE(JobSpecToYaml(*balanced).find("stages: []"), std::string::npos);
  auto explicit_split =
      ParseJobSpec(Make({{"model", model4}, {"parallel", "{pp: 2}"}}), {"parallel.stages=[1,3]"});
  ASSERT_TRUE(explicit_split.ok()) << explicit_split.status();
  EXPECT_EQ(explicit_split->parallel.stages, (std::vector<int>{1, 3}));
  EXPECT_NE(*balanced, *explicit_split);
  auto again = ParseJobSpec(JobSpecToYaml(*explicit_split));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *explicit_split);
  // ZeRO-3 stays allowed without a pipeline, with tp.
  EXPECT_TRUE(ParseJobSpec(Make({{"model", model4}, {"parallel", "{tp: 2, zero: 3}"}})).ok());
}

TEST(JobSpecTest, EvalNeedsValidationData) {
  auto spec = ParseJobSpec(Make({{"data", "{train: d.txt, val: v.txt}"}, {"eval", "{every: 5}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data.val, "v.txt");
  EXPECT_EQ(spec->eval.every, 5);
  EXPECT_EQ(spec->eval.batches, 2);
  // data.val with eval.every 0 is allowed (nothing evaluates), and so is
  // eval.every 0 without data.val.
  auto off = ParseJobSpec(
      Make({{"data", "{train: d.txt, val: v.txt}"}, {"eval", "{every: 0, batches: 5}"}}));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->eval.batches, 5);
  EXPECT_TRUE(ParseJobSpec(Make({{"eval", "{every: 0}"}})).ok());
  auto set = ParseJobSpec(Make(), {"data.val=v.txt", "eval.every=4", "eval.batches=1"});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->eval.every, 4);
  EXPECT_EQ(set->eval.batches, 1);
  ExpectRoundTrip(JobSpecToYaml(*set), "eval overrides");
  EXPECT_NE(JobSpecToYaml(*set).find("eval:\n  every: 4\n  batches: 1\n"), std::string::npos)
      << JobSpecToYaml(*set);
  EXPECT_FALSE(*set == *off);
  // data.val without eval.every: evaluated after the last step only
  // (every = steps, also after a steps override); the canonical YAML keeps it.
  auto end_only = ParseJobSpec(Make(), {"data.val=v.txt", "steps=7"});
  ASSERT_TRUE(end_only.ok()) << end_only.status();
  EXPECT_EQ(end_only->eval.every, 7);
  ExpectRoundTrip(JobSpecToYaml(*end_only), "eval.every defaulted to steps");
  auto no_val = ParseJobSpec(Make());
  ASSERT_TRUE(no_val.ok()) << no_val.status();
  EXPECT_EQ(no_val->eval.every, 0);
}

struct BadOverride {
  std::string override_text;
  std::string message_prefix;
};

TEST(JobSpecTest, BadOverrides) {
  const std::vector<BadOverride> cases = {
      {"steps", "override \"steps\": expected key.path=value"},
      {"parallel.zerro=3",
       "override \"parallel.zerro=3\": unknown field parallel.zerro (did you mean zero?)"},
      {"bogus=1", "override \"bogus=1\": unknown field bogus"},
      {"steps.x=1", "override \"steps.x=1\": unknown field steps.x"},
      {"model.layers.x=1", "override \"model.layers.x=1\": unknown field model.layers.x"},
      {".steps=1", "override \".steps=1\": expected key.path=value"},
      {"optimizer.betas=[0.9", "override \"optimizer.betas=[0.9\": value is not valid YAML"},
      {"steps=ten", "steps: expected an integer, got \"ten\""},
      {"model=5", "model: expected a map of fields, got \"5\""},
  };
  for (const BadOverride& c : cases) {
    auto spec = ParseJobSpec(Make(), {c.override_text});
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << c.override_text;
    EXPECT_EQ(spec.status().message().rfind(c.message_prefix, 0), 0u)
        << c.override_text << " gave: " << spec.status().message();
  }
  auto not_a_map = ParseJobSpec(Make({{"parallel", "3"}}), {"parallel.dp=2"});
  EXPECT_EQ(not_a_map.status().message(),
            "override \"parallel.dp=2\": parallel in the spec is not a map");
}

TEST(JobSpecTest, EnumNames) {
  EXPECT_EQ(EnumName(DataFormat::kLlmc), "llmc");
  EXPECT_EQ(EnumName(TokenizerKind::kGpt2), "gpt2");
  EXPECT_EQ(EnumName(OffloadMode::kOptimizer), "optimizer");
  EXPECT_EQ(EnumName(PipelineSchedule::k1F1B), "1f1b");
  EXPECT_EQ(EnumName(Precision::kBf16), "bf16");
  EXPECT_EQ(EnumName(OptimizerKind::kAdamW), "adamw");
  EXPECT_EQ(EnumName(LrSchedule::kLinear), "linear");
  EXPECT_EQ(EnumName(DeviceKind::kCuda), "cuda");
}

}  // namespace
// parallel.reduce_dtype: bf16 with NCCL DDP, kept through the YAML form.
TEST(JobSpecTest, Bf16GradientReductionForNcclDdpRoundTrips) {
  auto spec = ParseJobSpec(Make(
      {{"parallel", "{dp: 2, comm: nccl, reduce_dtype: bf16}"}, {"resources", "{device: cuda}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->parallel.reduce_dtype, ReduceDtype::kBf16);
  auto again = ParseJobSpec(JobSpecToYaml(*spec));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->parallel.reduce_dtype, ReduceDtype::kBf16);
  EXPECT_TRUE(*again == *spec);
}

}  // namespace shardtrain
