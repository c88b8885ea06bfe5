#include "client/sample.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/errors.h"
#include "client/output.h"
#include "common/model/lora.h"
#include "common/process.h"
#include "common/tokenizers.h"
#include "worker/checkpoint/directory.h"
#include "worker/checkpoint/hf_gpt2.h"
#include "worker/checkpoint/hf_llama.h"
#include "worker/checkpoint/hf_peft.h"
#include "worker/checkpoint/loader.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/model_weights.h"
#include "worker/checkpoint/storage.h"
#include "worker/checkpoint/weights_file.h"
#include "worker/data/tokens.h"
#include "worker/engine/cpu/cpu_model.h"
#include "worker/engine/cpu/lora_layers.h"
#include "worker/engine/generate.h"

namespace shardtrain::client {

namespace {

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

absl::StatusOr<checkpoint::LoadedWeights> LoadWeightsFrom(const std::string& path,
                                                          std::string* from) {
  absl::StatusOr<checkpoint::LoadedWeights> w = LoadAny(path, from);
  // Missing weights: not found (exit 3); unreadable ones: a bad argument (2).
  if (!w.ok() && !absl::IsNotFound(w.status())) {
    return absl::InvalidArgumentError(w.status().message());
  }
  return w;
}

int Sample(const GlobalFlags& g, const SampleOptions& o) {
  std::string path;
  auto weights = LoadWeightsFrom(o.checkpoint, &path);
  if (!weights.ok()) return ReportError(g, weights.status());
  if (weights->config.lora.on()) {
    return ReportError(g, absl::InvalidArgumentError(
                              absl::StrCat(path,
                                           " holds LoRA adapters, not a model: sample the job's "
                                           "final.weights (the model with the adapters merged)")));
  }
  // The tokenizer the model was trained with: named, or by its vocabulary
  // (bytes for 256, GPT-2's BPE from 50257, Llama 3's from 128256, padded
  // vocabularies included). Bytes on a larger vocabulary (a GPT-2-sized
  // model trained on bytes) generate bytes only.
  const int vocab = weights->config.vocab;
  const std::string tokenizer = !o.tokenizer_json.empty() ? "json"
                                : o.tokenizer != "auto"   ? o.tokenizer
                                : vocab >= 128256         ? "llama3"
                                : vocab >= 50257          ? "gpt2"
                                                          : "byte";
  std::unique_ptr<ByteLevelBpe> bpe;
  if (tokenizer != "byte") {
    const TokenizerKind kind = tokenizer == "json"     ? TokenizerKind::kJson
                               : tokenizer == "llama3" ? TokenizerKind::kLlama3
                                                       : TokenizerKind::kGpt2;
    absl::StatusOr<std::unique_ptr<ByteLevelBpe>> b =
        LoadTokenizer(kind, kind == TokenizerKind::kJson ? o.tokenizer_json : o.vocab);
    if (!b.ok()) return ReportError(g, b.status());
    bpe = *std::move(b);
  }
  if ((bpe && vocab < bpe->vocab_size()) || vocab < 256 ||
      (!bpe && o.tokenizer == "auto" && vocab != 256)) {
    return ReportError(
        g, absl::InvalidArgumentError(absl::StrCat(
               path, ": vocab ", vocab, " is too small for the ", tokenizer, " tokenizer (",
               bpe ? bpe->vocab_size() : 256,
               " ids); sampling text needs the byte tokenizer (vocab >= 256; --tokenizer byte "
               "above 256), GPT-2's (>= 50257), Llama 3's (>= 128256) or --tokenizer-json's")));
  }
  const int T = weights->config.context;
  auto model = engine::cpu::CpuModel::Create(weights->config, 1, T, o.threads);
  if (!model.ok()) return ReportError(g, model.status());
  std::copy(weights->params.begin(), weights->params.end(), (*model)->params().f32().begin());
  engine::GenerateOptions go;
  go.max_new_tokens = o.tokens;
  go.temperature = static_cast<float>(o.temperature);
  go.seed = o.seed;
  // Generated ids stay in the tokenizer's vocabulary (a model's may be
  // larger: padded).
  go.candidates = bpe ? (vocab > bpe->vocab_size() ? bpe->vocab_size() : 0) : 256;
  const std::string prompt_text = o.prompt.empty() ? "\n" : o.prompt;
  // Special tokens in the prompt are tokens (Hugging Face's default); a
  // Llama 3 or tokenizer.json prompt starts with the document token as each
  // prepared document does (<|begin_of_text|>), not printed back.
  std::vector<int> prompt;
  size_t lead = 0;
  if (bpe) {
    ByteLevelBpe::EncodeOptions options;
    options.specials = ByteLevelBpe::Specials::kParse;
    bpe->Encode(prompt_text, &prompt, nullptr, options);
    const int document = bpe->document_token();
    if (tokenizer != "gpt2" && document >= 0 && (prompt.empty() || prompt[0] != document)) {
      prompt.insert(prompt.begin(), document);
      lead = 1;
    }
  } else {
    prompt = data::EncodeBytes(prompt_text);
  }
  auto out = engine::Generate(**model, prompt, go);
  if (!out.ok()) return ReportError(g, out.status());
  std::string text;
  if (bpe) {
    absl::StatusOr<std::string> decoded = bpe->Decode(absl::MakeConstSpan(*out).subspan(lead));
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

namespace shardtrain::client {

// A Llama model: config.json, generation_config.json, the safetensors
// (sharded at --max-shard-size) and a given tokenizer.json
// (worker/checkpoint/hf_llama.h). The caller checked that o.out is absent or
// empty.
int ExportLlama(const GlobalFlags& g, const ExportOptions& o,
                const checkpoint::LoadedWeights& weights, const std::string& from) {
  checkpoint::HfExportOptions options;
  options.dtype = o.dtype == "bf16" ? DataType::kBFloat16 : DataType::kFloat32;
  absl::StatusOr<int64_t> shard = checkpoint::ParseShardSize(o.max_shard_size);
  if (!shard.ok()) return ReportError(g, shard.status());
  options.max_shard_bytes = *shard;
  // The tokenizer.json to write beside the weights: --tokenizer-json, else
  // Llama 3's (scripts/setup installs it) for a model of its vocabulary;
  // read before anything is written.
  std::string tokenizer, tokenizer_path = o.tokenizer_json;
  if (tokenizer_path.empty() && weights.config.vocab == 128256) {
    absl::StatusOr<std::string> llama3 = FindLlama3Tokenizer();
    if (llama3.ok()) tokenizer_path = *llama3;
  }
  if (!tokenizer_path.empty()) {
    if (absl::Status s = ReadFile(tokenizer_path, &tokenizer); !s.ok()) {
      return ReportError(g, absl::NotFoundError(absl::StrCat("--tokenizer-json: ", s.message())));
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) {
    return ReportError(
        g, absl::UnavailableError(absl::StrCat("cannot create ", o.out, ": ", ec.message())));
  }
  absl::Status s = checkpoint::ExportHfLlama(weights.config, weights.params, o.out, options);
  if (s.ok() && !tokenizer.empty()) {
    s = WriteFileAtomically(o.out + "/tokenizer.json", tokenizer);
    if (s.ok()) {
      s = WriteFileAtomically(o.out + "/tokenizer_config.json",
                              "{\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\"\n}\n");
    }
  }
  if (!s.ok()) return ReportError(g, s);
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(o.out, ec)) {
    files.push_back(e.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  const model::ModelConfig& c = weights.config;
  if (g.output == "json") {
    std::cout << "{\"from\": " << JsonString(from) << ", \"out\": " << JsonString(o.out)
              << ", \"format\": \"safetensors\", \"layout\": \"llama\", \"architecture\": "
              << JsonString(checkpoint::HfArchitecture(c)) << ", \"dtype\": " << JsonString(o.dtype)
              << ", \"tokenizer_files\": " << (tokenizer.empty() ? "false" : "true") << "}"
              << std::endl;
  } else {
    const std::string moe = c.moe.on() ? absl::StrCat(", ", c.moe.experts, " experts of ",
                                                      c.moe.expert_ffn_dim, ", top ", c.moe.top_k)
                                       : "";
    std::cout << "exported " << from << " (llama: layers " << c.layers << ", heads " << c.heads
              << ", kv_heads " << c.kv_heads << ", dim " << c.dim << ", ffn_dim " << c.ffn_dim
              << moe << ", vocab " << c.vocab << ", " << (c.tie_embeddings ? "tied" : "untied")
              << " head) to " << o.out << " in " << o.dtype << ": " << absl::StrJoin(files, ", ")
              << " (Hugging Face " << checkpoint::HfArchitecture(c) << " layout)" << std::endl;
  }
  return kExitOk;
}

int ExportAdapter(const GlobalFlags& g, const ExportOptions& o,
                  const checkpoint::LoadedWeights& weights, const std::string& from) {
  const model::ModelConfig& c = weights.config;
  if (!c.lora.on()) {
    return ReportError(g, absl::InvalidArgumentError(absl::StrCat(
                              "--adapter: ", from,
                              " holds a whole model, not LoRA adapters (export --adapter reads "
                              "a step-N dir of a LoRA job's checkpoint.dir)")));
  }
  if (!o.adapter) {
    return ReportError(g, absl::InvalidArgumentError(absl::StrCat(
                              from,
                              " holds LoRA adapters: --adapter writes them in PEFT's format; "
                              "the job's final.weights is the merged model, which exports as any "
                              "model")));
  }
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) {
    return ReportError(
        g, absl::UnavailableError(absl::StrCat("cannot create ", o.out, ": ", ec.message())));
  }
  const DataType dtype = o.dtype == "bf16" ? DataType::kBFloat16 : DataType::kFloat32;
  if (absl::Status s = checkpoint::ExportPeftAdapter(c, weights.params, o.out, dtype); !s.ok()) {
    return ReportError(g, s);
  }
  if (g.output == "json") {
    std::cout << "{\"from\": " << JsonString(from) << ", \"out\": " << JsonString(o.out)
              << ", \"format\": \"peft\", \"rank\": " << c.lora.rank
              << ", \"alpha\": " << c.lora.alpha << ", \"dtype\": " << JsonString(o.dtype) << "}"
              << std::endl;
  } else {
    std::cout << "exported the LoRA adapters of " << from << " (rank " << c.lora.rank << ", alpha "
              << c.lora.alpha << ", targets " << model::LoraTargetList(c.lora.targets) << ", "
              << weights.params.size() << " parameters) to " << o.out << " in " << o.dtype
              << ": adapter_config.json, adapter_model.safetensors (Hugging Face PEFT)"
              << std::endl;
  }
  return kExitOk;
}

namespace {

// A LoRA checkpoint's adapters (weights, read from `from`) merged into the
// base model at `base` (LoadModelWeights: a weights file or a Hugging Face
// folder), W + (alpha / rank)·B·A: the model without adapters.
absl::StatusOr<checkpoint::LoadedWeights> MergeAdapters(const checkpoint::LoadedWeights& weights,
                                                        const std::string& from,
                                                        const std::string& base) {
  if (!weights.config.lora.on()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--merged: ", from,
                     " holds a whole model, not LoRA adapters (export it without --merged)"));
  }
  const model::ModelConfig config = model::BaseConfig(weights.config);
  absl::StatusOr<std::vector<float>> w = checkpoint::LoadModelWeights(base, config);
  if (!w.ok()) {
    return absl::Status(w.status().code(),
                        absl::StrCat("--merged ", base, ": ", w.status().message()));
  }
  engine::cpu::MergeLora(model::ParamLayout(weights.config), weights.params.data(), w->data(),
                         nullptr);
  return checkpoint::LoadedWeights{config, *std::move(w)};
}

}  // namespace

int Export(const GlobalFlags& g, const ExportOptions& o) {
  namespace fs = std::filesystem;
  if (o.format != "safetensors") {
    return ReportError(
        g, absl::InvalidArgumentError(absl::StrCat("--format: ", o.format, " (only safetensors)")));
  }
  std::error_code ec;
  if (fs::exists(o.out, ec) && !fs::is_empty(o.out, ec)) {
    return ReportError(
        g, absl::AlreadyExistsError(
               absl::StrCat(o.out, " exists and is not empty: remove it or choose another --out")));
  }
  std::string from;
  auto weights = LoadWeightsFrom(o.source, &from);
  if (!weights.ok()) return ReportError(g, weights.status());
  if (!o.merged_base.empty()) {
    if (o.adapter) {
      return ReportError(g, absl::InvalidArgumentError(
                                "--adapter and --merged: one or the other (the adapters alone, or "
                                "the model with them merged)"));
    }
    absl::StatusOr<checkpoint::LoadedWeights> merged = MergeAdapters(*weights, from, o.merged_base);
    if (!merged.ok()) return ReportError(g, merged.status());
    weights = *std::move(merged);
  } else if (o.adapter || weights->config.lora.on()) {
    return ExportAdapter(g, o, *weights, from);
  }
  if (weights->config.arch == model::Arch::kLlama) return ExportLlama(g, o, *weights, from);
  if (o.dtype != "fp32" || !o.tokenizer_json.empty()) {
    return ReportError(g, absl::InvalidArgumentError(
                              "--dtype bf16 and --tokenizer-json are for Llama models; GPT-2's "
                              "export is fp32 with GPT-2's tokenizer files"));
  }
  // The tokenizer's files first: a missing vocabulary fails before anything
  // is written.
  std::string vocab_text, merges_text;
  if (weights->config.vocab >= 50257) {
    absl::StatusOr<Gpt2VocabularyFiles> files = FindGpt2Vocabulary(o.vocab);
    if (!files.ok()) return ReportError(g, files.status());
    for (auto [src, dst] : {std::pair<const std::string*, std::string*>{&files->vocab, &vocab_text},
                            {&files->merges, &merges_text}}) {
      if (absl::Status s = ReadFile(*src, dst); !s.ok()) return ReportError(g, s);
    }
  }
  fs::create_directories(o.out, ec);
  if (ec) {
    return ReportError(
        g, absl::UnavailableError(absl::StrCat("cannot create ", o.out, ": ", ec.message())));
  }
  const std::string model = o.out + "/model.safetensors";
  absl::Status s =
      checkpoint::WriteSafetensors(model, checkpoint::ToHfGpt2(weights->config, weights->params),
                                   {{"format", "pt"}, {"source", "shardtrain"}});
  if (s.ok())
    s = WriteFileAtomically(o.out + "/config.json", checkpoint::HfGpt2ConfigJson(weights->config));
  if (s.ok() && !vocab_text.empty()) {
    s = WriteFileAtomically(o.out + "/vocab.json", vocab_text);
    if (s.ok()) s = WriteFileAtomically(o.out + "/merges.txt", merges_text);
  }
  if (!s.ok()) return ReportError(g, s);
  const model::ModelConfig& c = weights->config;
  if (g.output == "json") {
    std::cout << "{\"from\": " << JsonString(from) << ", \"out\": " << JsonString(o.out)
              << ", \"format\": \"safetensors\", \"tokenizer_files\": "
              << (vocab_text.empty() ? "false" : "true") << "}" << std::endl;
  } else {
    std::cout << "exported " << from << " (layers " << c.layers << ", heads " << c.heads << ", dim "
              << c.dim << ", context " << c.context << ", vocab " << c.vocab << ") to " << o.out
              << ": model.safetensors, config.json"
              << (vocab_text.empty() ? "" : ", vocab.json, merges.txt")
              << " (Hugging Face GPT-2 layout)" << std::endl;
  }
  return kExitOk;
}

}  // namespace shardtrain::client
