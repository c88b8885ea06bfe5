#include "client/sample.h"

#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "client/output.h"
#include "common/gpt2_bpe.h"
#include "worker/checkpoint/directory.h"
#include "worker/checkpoint/loader.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/storage.h"
#include "worker/checkpoint/weights_file.h"
#include "worker/data/tokens.h"
#include "worker/engine/cpu/gpt.h"
#include "worker/engine/generate.h"

namespace shardtrain::client {

namespace {

// Weights from a final.weights file, or from a sharded checkpoint: a step-N
// directory, or a checkpoint directory (its newest commit whose shards verify).
absl::StatusOr<checkpoint::LoadedWeights> LoadAny(const std::string& path, std::string* from) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) {
    *from = path;
    return checkpoint::LoadWeights(path);
  }
  if (fs::exists(path + "/final.weights")) {
    *from = path + "/final.weights";
    return checkpoint::LoadWeights(*from);
  }
  checkpoint::FileCheckpointStorage storage;
  std::string step_dir = path;
  auto manifest = checkpoint::ReadManifest(storage, checkpoint::ManifestPath(path));
  if (!manifest.ok()) {
    auto latest = checkpoint::LatestValid(storage, path);
    if (!latest.ok()) return latest.status();
    if (!latest->checkpoint) {
      return absl::NotFoundError(path +
                                 " holds no final.weights and no valid committed checkpoint");
    }
    step_dir = latest->checkpoint->step_dir;
    manifest = latest->checkpoint->manifest;
  }
  auto state = checkpoint::LoadAll(storage, step_dir, *manifest);
  if (!state.ok()) return state.status();
  *from = step_dir;
  return checkpoint::LoadedWeights{manifest->config, std::move(state->params)};
}

}  // namespace

int Sample(const GlobalFlags& g, const SampleOptions& o) {
  std::string path;
  auto weights = LoadAny(o.checkpoint, &path);
  if (!weights.ok()) {
    // Missing weights: not found (3); unreadable ones: a bad argument (2).
    return ReportError(g, absl::IsNotFound(weights.status())
                              ? weights.status()
                              : absl::InvalidArgumentError(weights.status().message()));
  }
  // The tokenizer the model was trained with, by its vocabulary: bytes for
  // 256, GPT-2's BPE from 50257 (padded vocabularies included).
  std::unique_ptr<Gpt2Bpe> bpe;
  if (weights->config.vocab >= 50257) {
    absl::StatusOr<std::unique_ptr<Gpt2Bpe>> b = LoadGpt2Vocabulary(o.vocab);
    if (!b.ok()) return ReportError(g, b.status());
    bpe = *std::move(b);
  } else if (weights->config.vocab != 256) {
    return ReportError(g, absl::InvalidArgumentError(absl::StrCat(
                              path, ": vocab ", weights->config.vocab,
                              " — sampling text needs the byte tokenizer (vocab 256) or GPT-2's "
                              "(vocab >= 50257)")));
  }
  const int T = weights->config.context;
  auto model = engine::cpu::Gpt::Create(weights->config, 1, T, o.threads);
  if (!model.ok()) return ReportError(g, model.status());
  std::copy(weights->params.begin(), weights->params.end(), (*model)->params().f32().begin());
  engine::GenerateOptions go;
  go.max_new_tokens = o.tokens;
  go.temperature = static_cast<float>(o.temperature);
  go.seed = o.seed;
  const std::string prompt_text = o.prompt.empty() ? "\n" : o.prompt;
  std::vector<int> prompt = bpe ? bpe->Encode(prompt_text) : data::EncodeBytes(prompt_text);
  auto out = engine::Generate(**model, prompt, go);
  if (!out.ok()) return ReportError(g, out.status());
  std::string text;
  if (bpe) {
    absl::StatusOr<std::string> decoded = bpe->Decode(*out);
    if (!decoded.ok()) return ReportError(g, decoded.status());
    text = *std::move(decoded);
  } else {
    text = data::DecodeBytes(*out);
  }
  if (g.output == "json") {
    std::cout << "{\"checkpoint\": " << JsonString(path) << ", \"prompt\": " << JsonString(o.prompt)
              << ", \"text\": " << JsonString(text) << "}" << std::endl;
  } else {
    std::cout << text << std::endl;
  }
  return 0;
}

}  // namespace shardtrain::client
