// Weights in and out in Hugging Face's GPT-2 layout (hf_gpt2.h): the
// safetensors format round-trips bit for bit and refuses malformed files
// naming the tensor; GPT-2's names, Conv1D orientation and unpadded
// vocabulary map to ours and back exactly; and a plain-PyTorch GPT-2 reading
// the exported directory (hf_gpt2_logits.py) computes the CPU engine's logits
// within 1e-5.
#include "worker/checkpoint/hf_gpt2.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/model/param_layout.h"
#include "common/process.h"
#include "worker/checkpoint/model_weights.h"
#include "worker/checkpoint/weights_file.h"
#include "worker/engine/cpu/cpu_model.h"

#ifndef SHARDTRAIN_HF_LOGITS_SCRIPT
#error "SHARDTRAIN_HF_LOGITS_SCRIPT must be defined by CMake"
#endif

namespace shardtrain::checkpoint {
namespace {
namespace fs = std::filesystem;

// V = 300 pads to Vp = 384: the export drops the padded rows.
model::ModelConfig Config() { return *model::MakeGptConfig(2, 4, 32, 16, 300); }

std::vector<float> RandomParams(const model::ModelConfig& c) {
  const model::ParamLayout layout(c);
  std::vector<float> p(layout.num_params());
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  for (float& x : p) x = normal(rng);
  // Padded wte rows are zero in every model (they never train).
  const model::TensorInfo& wte = layout.tensors()[*layout.FindTensor("wte")];
  std::fill(p.begin() + wte.offset + size_t(c.vocab) * c.dim, p.begin() + wte.offset + wte.numel,
            0.0f);
  return p;
}

class HfGpt2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardtrain_hf_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(HfGpt2Test, NamesShapesAndOrientationAreGpt2s) {
  const model::ModelConfig c = Config();
  const std::vector<float> p = RandomParams(c);
  const std::map<std::string, NamedTensor> hf = ToHfGpt2(c, p);
  EXPECT_EQ(hf.size(), 2u + 12u * c.layers + 2u);  // wte, wpe, 12 per block, ln_f
  EXPECT_EQ(hf.at("transformer.wte.weight").shape, (std::vector<int64_t>{300, 32}));
  EXPECT_EQ(hf.at("transformer.wpe.weight").shape, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(hf.at("transformer.h.1.attn.c_attn.weight").shape, (std::vector<int64_t>{32, 96}));
  EXPECT_EQ(hf.at("transformer.h.1.mlp.c_fc.weight").shape, (std::vector<int64_t>{32, 128}));
  EXPECT_EQ(hf.at("transformer.h.1.mlp.c_proj.weight").shape, (std::vector<int64_t>{128, 32}));
  EXPECT_EQ(hf.at("transformer.ln_f.bias").shape, (std::vector<int64_t>{32}));
  EXPECT_EQ(hf.count("lm_head.weight"), 0u);  // tied
  // Conv1D is (in, out): element [i][o] is our (out, in) weight's [o][i].
  const model::ParamLayout layout(c);
  const model::TensorInfo& qkv = layout.tensors()[*layout.FindTensor("block.1.attn.qkv.weight")];
  const NamedTensor& c_attn = hf.at("transformer.h.1.attn.c_attn.weight");
  for (int o : {0, 17, 95}) {
    for (int i : {0, 5, 31}) {
      EXPECT_EQ(c_attn.data[size_t(i) * 96 + o], p[qkv.offset + size_t(o) * 32 + i]);
    }
  }
}

TEST_F(HfGpt2Test, ExportThenImportIsBitExact) {
  const model::ModelConfig c = Config();
  const std::vector<float> p = RandomParams(c);
  ASSERT_TRUE(WriteSafetensors(Path("model.safetensors"), ToHfGpt2(c, p), {{"format", "pt"}}).ok());
  EXPECT_TRUE(LooksLikeSafetensors(Path("model.safetensors")));
  absl::StatusOr<std::vector<float>> back = LoadModelWeights(dir_.string(), c);  // the folder
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, p);
  // Our own weights file loads through the same door.
  ASSERT_TRUE(SaveWeights(Path("final.weights"), c, p).ok());
  EXPECT_FALSE(LooksLikeSafetensors(Path("final.weights")));
  absl::StatusOr<std::vector<float>> ours = LoadModelWeights(Path("final.weights"), c);
  ASSERT_TRUE(ours.ok()) << ours.status();
  EXPECT_EQ(*ours, p);
}

TEST_F(HfGpt2Test, MismatchesNameTheTensorAndTheShapes) {
  const model::ModelConfig c = Config();
  const std::vector<float> p = RandomParams(c);
  ASSERT_TRUE(WriteSafetensors(Path("model.safetensors"), ToHfGpt2(c, p)).ok());
  const model::ModelConfig wider = *model::MakeGptConfig(2, 4, 64, 16, 300);
  absl::StatusOr<std::vector<float>> w = LoadModelWeights(Path("model.safetensors"), wider);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("transformer.wte.weight: shape [300, 32] in the file, "
                                      "[300, 64] for the model"),
            std::string::npos)
      << w.status();
  const model::ModelConfig deeper = *model::MakeGptConfig(3, 4, 32, 16, 300);
  w = LoadModelWeights(Path("model.safetensors"), deeper);
  EXPECT_NE(w.status().message().find("transformer.h.2.ln_1.weight: missing"), std::string::npos)
      << w.status();
  ASSERT_TRUE(SaveWeights(Path("final.weights"), c, p).ok());
  w = LoadModelWeights(Path("final.weights"), deeper);
  EXPECT_NE(w.status().message().find("layers 2"), std::string::npos) << w.status();
  EXPECT_EQ(LoadModelWeights(Path("nope"), c).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(HfGpt2Test, MalformedSafetensorsAreDataLossNamingTheTensor) {
  const model::ModelConfig c = Config();
  const std::map<std::string, NamedTensor> hf = ToHfGpt2(c, RandomParams(c));
  ASSERT_TRUE(WriteSafetensors(Path("ok.safetensors"), hf).ok());
  std::string bytes;
  ASSERT_TRUE(ReadFile(Path("ok.safetensors"), &bytes).ok());
  // Truncated data: the last tensor's offsets run past the end.
  ASSERT_TRUE(WriteFileAtomically(Path("cut.safetensors"), bytes.substr(0, bytes.size() - 4)).ok());
  absl::StatusOr<std::map<std::string, NamedTensor>> r = ReadSafetensors(Path("cut.safetensors"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("transformer.wte.weight"), std::string::npos) << r.status();
  // A header length past the file.
  std::string big = bytes;
  big[5] = '\x7f';
  ASSERT_TRUE(WriteFileAtomically(Path("big.safetensors"), big).ok());
  r = ReadSafetensors(Path("big.safetensors"));
  EXPECT_NE(r.status().message().find("exceeds the file"), std::string::npos) << r.status();
  // A dtype that is not read (F32, BF16, F16 are) is named, not misread.
  std::string i32 = bytes;
  const size_t at = i32.find("\"F32\"");
  ASSERT_NE(at, std::string::npos);
  i32.replace(at, 5, "\"I32\"");
  ASSERT_TRUE(WriteFileAtomically(Path("i32.safetensors"), i32).ok());
  r = ReadSafetensors(Path("i32.safetensors"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
  EXPECT_NE(r.status().message().find("I32"), std::string::npos) << r.status();
}

TEST_F(HfGpt2Test, PlainPytorchGpt2OnTheExportGivesTheEnginesLogits) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch (scripts/setup installs python3-torch)";
  }
  const model::ModelConfig c = Config();
  const std::vector<float> p = RandomParams(c);
  ASSERT_TRUE(WriteSafetensors(Path("model.safetensors"), ToHfGpt2(c, p)).ok());
  ASSERT_TRUE(WriteFileAtomically(Path("config.json"), HfGpt2ConfigJson(c)).ok());
  constexpr int B = 2, T = 13;
  std::vector<int> tokens(B * T), targets(B * T, 0);
  for (int i = 0; i < B * T; ++i) tokens[i] = (i * 37 + 11) % c.vocab;
  {
    std::vector<int32_t> raw = {B, T};
    raw.insert(raw.end(), tokens.begin(), tokens.end());
    std::ofstream(Path("tokens.bin"), std::ios::binary)
        .write(reinterpret_cast<const char*>(raw.data()), raw.size() * sizeof(int32_t));
  }
  const std::string cmd = std::string("/usr/bin/python3 ") + SHARDTRAIN_HF_LOGITS_SCRIPT + " " +
                          dir_.string() + " " + Path("tokens.bin") + " " + Path("logits.bin");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<float> torch_logits(size_t(B) * T * c.vocab);
  std::ifstream(Path("logits.bin"), std::ios::binary)
      .read(reinterpret_cast<char*>(torch_logits.data()), torch_logits.size() * sizeof(float));

  auto gpt = engine::cpu::CpuModel::Create(c, B, T, 1);
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  std::copy(p.begin(), p.end(), (*gpt)->params().f32().begin());
  (*gpt)->Forward(tokens.data(), targets.data(), B, T);
  double worst = 0;
  std::vector<float> row(c.vocab);
  for (int r = 0; r < B * T; ++r) {
    (*gpt)->ReadLogits(r, row.data());
    for (int v = 0; v < c.vocab; ++v) {
      const double a = row[v], b = torch_logits[size_t(r) * c.vocab + v];
      worst = std::max(worst, std::abs(a - b) / std::max(1.0, std::abs(b)));
    }
  }
  std::printf(
      "[hf-gpt2] PyTorch GPT-2 on the export vs the CPU engine: max logit diff %.3g "
      "over %d x %d tokens x %d vocab\n",
      worst, B, T, c.vocab);
  EXPECT_LE(worst, 1e-5);
}

}  // namespace
}  // namespace shardtrain::checkpoint
