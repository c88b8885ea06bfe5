// Job specs that are refused: every bad field named in its message (inline
// cases, tests/data/specs/bad/*.yaml), and the Llama family's fields, their
// defaults and their refusals.
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "tests/unit/common/job_spec_test_util.h"

namespace shardtrain {
namespace {

using job_spec_testing::kSourceDir;
using job_spec_testing::Make;
using job_spec_testing::ReadFile;
using job_spec_testing::YamlFiles;

struct BadSpec {
  std::string label;
  std::string yaml;
  std::string message_prefix;  // the message must start with this
};

TEST(JobSpecTest, BadSpecsNameTheirField) {
  const std::string kModel4 = "{layers: 4, heads: 4, dim: 16, context: 16, vocab: 256}";
  const std::vector<BadSpec> cases = {
      {"missing name", Make({{"name", "<drop>"}}), "name: required"},
      {"missing steps", Make({{"steps", "<drop>"}}), "steps: required"},
      {"missing model", Make({{"model", "<drop>"}}), "model: required"},
      {"missing data.train", Make({{"data", "{val: v.txt}"}}), "data.train: required"},
      {"missing batch.micro", Make({{"batch", "{global: 4, seq_len: 8}"}}),
       "batch.micro: required"},
      {"missing model.layers", Make({{"model", "{heads: 2, dim: 8, context: 16, vocab: 256}"}}),
       "model.layers: required (or set model.preset, or only model.init: a Hugging Face "
       "checkpoint whose config.json the CLI reads)"},
      {"steps not an integer", Make({{"steps", "ten"}}), "steps: expected an integer, got \"ten\""},
      {"steps fractional", Make({{"steps", "1.5"}}), "steps: expected an integer, got \"1.5\""},
      {"steps quoted", Make({{"steps", "\"10\""}}), "steps: expected an integer, got \"10\""},
      {"steps zero", Make({{"steps", "0"}}), "steps: must be >= 1, got 0"},
      {"heads is a list",
       Make({{"model", "{layers: 2, heads: [2], dim: 8, context: 16, vocab: 256}"}}),
       "model.heads: expected an integer, got a list"},
      {"model not a map", Make({{"model", "5"}}), "model: expected a map of fields, got \"5\""},
      {"heads % tp", Make({{"model", kModel4}, {"parallel", "{tp: 3}"}}),
       "parallel.tp: 3 does not divide model.heads: 4"},
      {"pp > layers", Make({{"model", kModel4}, {"parallel", "{pp: 5}"}}),
       "parallel.pp: 5 exceeds model.layers: 4"},
      {"padded vocab % tp",
       Make({{"model", "{layers: 4, heads: 6, dim: 12, context: 16, vocab: 256}"},
             {"parallel", "{tp: 3}"}}),
       "parallel.tp: 3 does not divide the padded vocabulary 256 (model.vocab 256 rounded up to "
       "a multiple of 64)"},
      {"stages count", Make({{"model", kModel4}, {"parallel", "{pp: 2, stages: [1, 1, 2]}"}}),
       "parallel.stages: has 3 entries, expected one per pipeline stage (parallel.pp: 2)"},
      {"stages sum", Make({{"model", kModel4}, {"parallel", "{pp: 2, stages: [1, 2]}"}}),
       "parallel.stages: layers sum to 3, expected model.layers: 4"},
      {"stages zero", Make({{"model", kModel4}, {"parallel", "{pp: 2, stages: [4, 0]}"}}),
       "parallel.stages[1]: must be >= 1, got 0"},
      {"stages not a list", Make({{"model", kModel4}, {"parallel", "{stages: 4}"}}),
       "parallel.stages: expected a list of layers per stage, got \"4\""},
      {"stages not integers", Make({{"model", kModel4}, {"parallel", "{pp: 2, stages: [a, 2]}"}}),
       "parallel.stages[0]: expected an integer, got \"a\""},
      {"zero 3 with a pipeline", Make({{"model", kModel4}, {"parallel", "{pp: 2, zero: 3}"}}),
       "parallel.zero: 3 cannot be combined with parallel.pp: 2 (ZeRO-3 gathers"},
      {"dim % heads", Make({{"model", "{layers: 2, heads: 4, dim: 10, context: 16, vocab: 256}"}}),
       "model.dim: 10 is not divisible by model.heads: 4"},
      {"negative lr", Make({{"optimizer", "{lr: -0.001}"}}),
       "optimizer.lr: must be > 0, got -0.001"},
      {"infinite lr", Make({{"optimizer", "{lr: inf}"}}), "optimizer.lr: must be a finite number"},
      {"min_lr > lr", Make({{"optimizer", "{lr: 0.001, min_lr: 0.01}"}}),
       "optimizer.min_lr: 0.01 exceeds optimizer.lr: 0.001"},
      {"three betas", Make({{"optimizer", "{betas: [0.9, 0.95, 0.99]}"}}),
       "optimizer.betas: expected a list of two numbers"},
      {"beta of 1", Make({{"optimizer", "{betas: [0.9, 1.0]}"}}),
       "optimizer.betas[1]: must be in [0, 1), got 1"},
      {"unknown top-level key", Make({{"stepz", "3"}}), "stepz: unknown key (did you mean steps?)"},
      {"unknown model key",
       Make({{"model", "{layer: 2, heads: 2, dim: 8, context: 16, vocab: 256}"}}),
       "model.layer: unknown key (did you mean layers?)"},
      {"unknown optimizer key", Make({{"optimizer", "{learning_rate: 0.1}"}}),
       "optimizer.learning_rate: unknown key"},
      {"unknown timeouts key", Make({{"timeouts", "{heartbeat_s: 5}"}}),
       "timeouts.heartbeat_s: unknown key"},
      {"global not divisible",
       Make({{"batch", "{global: 6, micro: 2, seq_len: 8}"}, {"parallel", "{dp: 2}"}}),
       "batch.global: 6 is not divisible by batch.micro × parallel.dp = 2 × 2 = 4"},
      {"seq_len > context", Make({{"batch", "{global: 4, micro: 2, seq_len: 32}"}}),
       "batch.seq_len: 32 exceeds model.context: 16"},
      {"bad precision", Make({{"precision", "fp8"}}),
       "precision: expected one of fp32, bf16, fp16, got \"fp8\""},
      {"bad pipeline schedule", Make({{"parallel", "{schedule: interleaved}"}}),
       "parallel.schedule: expected one of gpipe, 1f1b, got \"interleaved\""},
      {"bad lr schedule", Make({{"optimizer", "{schedule: step}"}}),
       "optimizer.schedule: expected one of cosine, constant, linear"},
      {"bad device", Make({{"resources", "{device: tpu}"}}),
       "resources.device: expected one of cpu, cuda, got \"tpu\""},
      {"bad bool", Make({{"parallel", "{reshard_after_forward: maybe}"}}),
       "parallel.reshard_after_forward: expected true or false, got \"maybe\""},
      {"zero stage 4", Make({{"parallel", "{zero: 4}"}}),
       "parallel.zero: must be between 0 and 3, got 4"},
      {"min_workers > world",
       Make({{"batch", "{global: 4, micro: 2, seq_len: 8}"},
             {"parallel", "{dp: 2}"},
             {"resources", "{min_workers: 3}"}}),
       "resources.min_workers: 3 exceeds world 2 (parallel.dp × tp × pp = 2 × 1 × 1)"},
      {"max_workers < world",
       Make(
           {{"model", kModel4}, {"parallel", "{dp: 2, tp: 2}"}, {"resources", "{max_workers: 3}"}}),
       "resources.max_workers: 3 is less than world 4 (parallel.dp × tp × pp = 2 × 2 × 1)"},
      {"bad name", Make({{"name", "My Job"}}), "name: must be 1 to 64 characters of [a-z0-9._-]"},
      {"unknown preset", Make({{"model", "{preset: gpt5}"}}),
       "model.preset: unknown preset \"gpt5\""},
      {"gpt2 tokenizer on text", Make({{"data", "{train: d.txt, tokenizer: gpt2}"}}),
       "data.tokenizer: gpt2 requires data.format: llmc"},
      {"vocab too small for bytes",
       Make({{"model", "{layers: 2, heads: 2, dim: 8, context: 16, vocab: 100}"}}),
       "model.vocab: 100 is too small for the byte tokenizer"},
      {"bad data format", Make({{"data", "{train: d.txt, format: csv}"}}),
       "data.format: expected one of text, llmc, got \"csv\""},
      {"checkpoint every without dir", Make({{"checkpoint", "{every: 10}"}}),
       "checkpoint.dir: required when checkpoint.every > 0"},
      {"eval every without val", Make({{"eval", "{every: 20}"}}),
       "data.val: required when eval.every > 0 (every: 20)"},
      {"eval every without val, by override",
       Make({{"data", "{train: d.txt, val: \"\"}"}}) + "eval: {every: 3}\n",
       "data.val: required when eval.every > 0 (every: 3)"},
      {"eval every negative", Make({{"eval", "{every: -1}"}}), "eval.every: must be >= 0, got -1"},
      {"eval batches 0", Make({{"eval", "{batches: 0}"}}), "eval.batches: must be >= 1, got 0"},
      {"eval batches fractional", Make({{"eval", "{batches: 2.5}"}}),
       "eval.batches: expected an integer, got \"2.5\""},
      {"unknown eval key", Make({{"eval", "{evry: 5}"}}),
       "eval.evry: unknown key (did you mean every?)"},
      {"eval not a map", Make({{"eval", "10"}}), "eval: expected a map of fields, got \"10\""},
      {"checkpoint keep 0", Make({{"checkpoint", "{keep: 0}"}}),
       "checkpoint.keep: must be >= 1, got 0"},
      {"negative weight decay", Make({{"optimizer", "{weight_decay: -0.1}"}}),
       "optimizer.weight_decay: must be >= 0, got -0.1"},
      {"negative seed", Make({{"seed", "-1"}}), "seed: must be >= 0, got -1"},
      {"duplicate key", Make() + "steps: 4\n", "steps: appears more than once"},
      {"malformed yaml", "name: t\nsteps: 3\nmodel: {layers: 2\n", "spec: invalid YAML at line 4"},
      {"empty document", "", "spec: empty document"},
      {"only comments", "# nothing here\n", "spec: empty document"},
      {"top-level list", "- name: t\n- steps: 3\n",
       "spec: expected a map of fields at the top level, got a list"},
      {"top-level scalar", "hello",
       "spec: expected a map of fields at the top level, got \"hello\""},
      {"recompute unknown", Make({{"model", "{preset: gpt2-124m, recompute: some}"}}),
       "model.recompute: "},
      {"recompute_layers 0",
       Make({{"model",
              "{preset: gpt2-124m, recompute: full, "
              "recompute_layers: 0}"}}),
       "model.recompute_layers: must be >= 1, got 0"},
      {"recompute_layers alone", Make({{"model", "{preset: gpt2-124m, recompute_layers: 2}"}}),
       "model.recompute_layers: needs model.recompute: selective or full (it is none)"},
      {"cp of zero", Make({{"parallel", "{cp: 0}"}}), "parallel.cp: must be >= 1, got 0"},
      {"cp not dividing the sequence", Make({{"parallel", "{cp: 3}"}}),
       "parallel.cp: 2 × 3 = 6 does not divide batch.seq_len: 8"},
      {"cp with flash",
       Make(
           {{"parallel", "{cp: 2}"},
            {"model", "{layers: 2, heads: 2, dim: 128, context: 16, vocab: 256, attention: flash}"},
            {"precision", "bf16"},
            {"resources", "{device: cuda}"}}),
       "model.attention: flash with parallel.cp > 1"},
      {"sequence_parallel on tp 1", Make({{"parallel", "{sequence_parallel: true}"}}),
       "parallel.sequence_parallel: needs parallel.tp > 1 (tp is 1)"},
      {"sequence_parallel rows",
       Make({{"model", kModel4},
             {"parallel", "{tp: 4, sequence_parallel: true}"},
             {"batch", "{global: 1, micro: 1, seq_len: 6}"}}),
       "parallel.sequence_parallel: parallel.tp 4 must divide batch.micro × batch.seq_len = 1 × 6"},
      {"pp_virtual of zero", Make({{"parallel", "{pp_virtual: 0}"}}),
       "parallel.pp_virtual: must be >= 1, got 0"},
      {"pp_virtual on gpipe",
       Make({{"model", kModel4}, {"parallel", "{pp: 2, pp_virtual: 2, schedule: gpipe}"}}),
       "parallel.pp_virtual: interleaves 1F1B: it needs parallel.schedule 1f1b"},
      {"pp_virtual under zero 2",
       Make({{"model", kModel4}, {"parallel", "{pp: 2, pp_virtual: 2, zero: 2}"}}),
       "parallel.pp_virtual: needs parallel.zero <= 1"},
      {"pp_virtual layers", Make({{"parallel", "{pp: 2, pp_virtual: 2}"}}),
       "parallel.pp_virtual: 2 model chunks per stage need parallel.pp > 1, no parallel.stages"},
      {"pp_virtual micro-batches",
       Make({{"model", kModel4},
             {"parallel", "{pp: 2, pp_virtual: 2}"},
             {"batch", "{global: 2, micro: 2, seq_len: 8}"}}),
       "parallel.pp_virtual: the interleaved schedule runs micro-batches in groups of "
       "parallel.pp: batch.global / (batch.micro × parallel.dp) = 1 must be a multiple of pp 2"},
      {"nccl on cpu", Make({{"parallel", "{comm: nccl}"}}),
       "parallel.comm: nccl needs resources.device: cuda"},
      {"comm unknown", Make({{"parallel", "{comm: mpi}"}}), "parallel.comm: "},
      {"bf16 reduce over gloo", Make({{"parallel", "{reduce_dtype: bf16}"}}),
       "parallel.reduce_dtype: bf16 reduces DDP's buckets over NCCL: it needs parallel.comm nccl "
       "and parallel.zero 0 (comm is auto, zero 0"},
      {"bf16 reduce under zero",
       Make({{"parallel", "{comm: nccl, zero: 1, reduce_dtype: bf16}"},
             {"resources", "{device: cuda}"}}),
       "parallel.reduce_dtype: bf16 reduces DDP's buckets over NCCL: it needs parallel.comm nccl "
       "and parallel.zero 0 (comm is nccl, zero 1"},
      {"reduce dtype unknown", Make({{"parallel", "{reduce_dtype: fp8}"}}),
       "parallel.reduce_dtype: "},
  };
  ASSERT_GE(cases.size(), 20u);
  for (const BadSpec& c : cases) {
    auto spec = ParseJobSpec(c.yaml);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument)
        << c.label << ": " << spec.status();
    EXPECT_EQ(spec.status().message().rfind(c.message_prefix, 0), 0u)
        << c.label << "\n  want prefix: " << c.message_prefix
        << "\n  got:         " << spec.status().message();
  }
}

// Each tests/data/specs/bad/*.yaml starts with "# expect: <substring>".
TEST(JobSpecTest, BadSpecFiles) {
  std::vector<std::string> files = YamlFiles(kSourceDir + "/tests/data/specs/bad");
  ASSERT_GE(files.size(), 15u);
  for (const std::string& f : files) {
    std::string text = ReadFile(f);
    const std::string kTag = "# expect: ";
    ASSERT_EQ(text.rfind(kTag, 0), 0u) << f << " lacks a first-line \"# expect: \" comment";
    std::string expect = text.substr(kTag.size(), text.find('\n') - kTag.size());
    auto spec = ParseJobSpec(text);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << f;
    EXPECT_NE(spec.status().message().find(expect), absl::string_view::npos)
        << f << "\n  want: " << expect << "\n  got:  " << spec.status().message();
  }
}

// model.arch: llama — its fields, defaults, presets, the family's config and
// the refusals that name their field.
TEST(JobSpecTest, LlamaModelFieldsDefaultsAndRoundTrip) {
  auto spec =
      ParseJobSpec(Make({{"model",
                          "{arch: llama, layers: 2, heads: 4, kv_heads: 2, dim: 32, ffn_dim: 80, "
                          "context: 16, vocab: 256}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model.arch, model::Arch::kLlama);
  EXPECT_EQ(spec->model.kv_heads, 2);
  EXPECT_EQ(spec->model.ffn_dim, 80);
  EXPECT_EQ(spec->model.rope_theta, 500000.0);
  EXPECT_EQ(spec->model.norm_eps, 1e-5);
  EXPECT_FALSE(spec->model.tie_embeddings);
  const model::ModelConfig c = *spec->model.Config();
  EXPECT_EQ(c.norm, model::NormKind::kRmsNorm);
  EXPECT_EQ(c.positions, model::PositionKind::kRotary);
  EXPECT_EQ(c.mlp, model::MlpKind::kSwiGlu);
  EXPECT_FALSE(c.bias);
  auto again = ParseJobSpec(JobSpecToYaml(*spec));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(*again == *spec);
  // Defaults: kv_heads = heads, ffn_dim = 8·dim/3 up to a multiple of 256.
  auto plain = ParseJobSpec(
      Make({{"model", "{arch: llama, layers: 2, heads: 4, dim: 96, context: 16, vocab: 256}"}}));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->model.kv_heads, 4);
  EXPECT_EQ(plain->model.ffn_dim, 256);
  // A preset sets the family; explicit fields override its shape.
  auto preset = ParseJobSpec(Make({{"model", "{preset: llama3-8b, layers: 2, context: 64}"}}));
  ASSERT_TRUE(preset.ok()) << preset.status();
  EXPECT_EQ(preset->model.arch, model::Arch::kLlama);
  EXPECT_EQ(preset->model.layers, 2);
  EXPECT_EQ(preset->model.kv_heads, 8);
  EXPECT_EQ(preset->model.ffn_dim, 14336);
  EXPECT_EQ(preset->model.vocab, 128256);
  EXPECT_FALSE(preset->model.tie_embeddings);
  EXPECT_TRUE(ParseJobSpec(JobSpecToYaml(*preset)).ok());
  // GPT-2 specs hold the gpt2 family and their canonical YAML says so.
  auto gpt2 = ParseJobSpec(Make());
  ASSERT_TRUE(gpt2.ok());
  EXPECT_EQ(gpt2->model.arch, model::Arch::kGpt2);
  EXPECT_NE(JobSpecToYaml(*gpt2).find("arch: gpt2"), std::string::npos);
  EXPECT_EQ(JobSpecToYaml(*gpt2).find("kv_heads"), std::string::npos);
}

TEST(JobSpecTest, LlamaFieldsAreRefusedNamingThemselves) {
  const std::string llama = "arch: llama, layers: 2, heads: 4, dim: 32, context: 16, vocab: 256";
  const std::vector<BadSpec> cases = {
      {"kv_heads on gpt2",
       Make({{"model",
              "{layers: 2, heads: 2, dim: 8, context: 16, "
              "vocab: 256, kv_heads: 1}"}}),
       "model.kv_heads: only for model.arch: llama"},
      {"tie on gpt2", Make({{"model", "{preset: gpt2-124m, tie_embeddings: false}"}}),
       "model.tie_embeddings: only for model.arch: llama"},
      {"arch unknown",
       Make({{"model",
              "{arch: mamba, layers: 2, heads: 2, dim: 8, "
              "context: 16, vocab: 256}"}}),
       "model.arch: expected one of gpt2, llama"},
      {"arch vs preset", Make({{"model", "{preset: gpt2-124m, arch: llama}"}}),
       "model.arch: llama conflicts with model.preset gpt2-124m (a gpt2 model)"},
      {"kv_heads not dividing", Make({{"model", "{" + llama + ", kv_heads: 3}"}}),
       "model.kv_heads: 3 does not divide model.heads: 4"},
      {"kv_heads zero", Make({{"model", "{" + llama + ", kv_heads: 0}"}}),
       "model.kv_heads: must be >= 1"},
      {"rope_theta zero", Make({{"model", "{" + llama + ", rope_theta: 0}"}}),
       "model.rope_theta: must be > 0"},
      {"norm_eps negative", Make({{"model", "{" + llama + ", norm_eps: -1e-5}"}}),
       "model.norm_eps: must be > 0"},
      {"odd head size",
       Make({{"model",
              "{arch: llama, layers: 2, heads: 4, dim: 12, "
              "context: 16, vocab: 256}"}}),
       "model.dim: rotary positions need an even head size"},
      {"tp over kv_heads",
       Make({{"model", "{" + llama + ", kv_heads: 1}"}, {"parallel", "{tp: 2}"}}),
       "parallel.tp: 2 does not divide model.kv_heads: 1"},
      {"tp over ffn_dim",
       Make({{"model", "{" + llama + ", ffn_dim: 81}"}, {"parallel", "{tp: 2}"}}),
       "parallel.tp: 2 does not divide model.ffn_dim: 81"},
  };
  for (const BadSpec& c : cases) {
    auto spec = ParseJobSpec(c.yaml);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument)
        << c.label << ": " << spec.status();
    EXPECT_EQ(spec.status().message().rfind(c.message_prefix, 0), 0u)
        << c.label << "\n  want prefix: " << c.message_prefix
        << "\n  got:         " << spec.status().message();
  }
}

}  // namespace
}  // namespace shardtrain
