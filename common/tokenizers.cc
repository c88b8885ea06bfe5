#include "common/tokenizers.h"

#include <cstdlib>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardtrain {
namespace {
namespace fs = std::filesystem;

// GPT-2's vocabulary files in `dir`, or NOT_FOUND naming it.
absl::StatusOr<Gpt2VocabularyFiles> Gpt2FilesIn(const std::string& dir) {
  for (const auto& [vocab, merges] :
       {std::pair<const char*, const char*>{"encoder.json", "vocab.bpe"},
        {"vocab.json", "merges.txt"}}) {
    const fs::path v = fs::path(dir) / vocab, m = fs::path(dir) / merges;
    if (fs::exists(v) && fs::exists(m)) return Gpt2VocabularyFiles{v.string(), m.string()};
  }
  return absl::NotFoundError(absl::StrCat(
      dir, ": neither encoder.json + vocab.bpe nor vocab.json + merges.txt (GPT-2's vocabulary)"));
}

// `path` when it is a file, else path/tokenizer.json when that is one;
// NOT_FOUND naming it otherwise.
absl::StatusOr<std::string> TokenizerJsonAt(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path in = fs::path(path) / "tokenizer.json";
    if (fs::is_regular_file(in, ec)) return in.string();
    return absl::NotFoundError(absl::StrCat(path, ": holds no tokenizer.json"));
  }
  if (fs::is_regular_file(path, ec)) return path;
  return absl::NotFoundError(absl::StrCat(path, " does not exist"));
}

// The first of: `given`; $`env`; the folders or files this build knows
// (`known`), each through `at`. NOT_FOUND naming what was tried and `hint`.
template <typename T, typename At>
absl::StatusOr<T> Search(const std::string& given, const char* env,
                         const std::vector<std::string>& known, At at, const char* what,
                         const char* flag) {
  if (!given.empty()) return at(given);
  if (const char* e = std::getenv(env); e != nullptr && *e != '\0') {
    absl::StatusOr<T> found = at(e);
    if (!found.ok()) {
      return absl::Status(found.status().code(),
                          absl::StrCat("$", env, ": ", found.status().message()));
    }
    return found;
  }
  for (const std::string& k : known) {
    absl::StatusOr<T> found = at(k);
    if (found.ok()) return found;
  }
  return absl::NotFoundError(absl::StrCat(what, " is in none of ", absl::StrJoin(known, ", "),
                                          "; scripts/setup installs it, or point ", flag, " or $",
                                          env, " at it"));
}

}  // namespace

absl::StatusOr<Gpt2VocabularyFiles> FindGpt2Vocabulary(const std::string& dir) {
  return Search<Gpt2VocabularyFiles>(
      dir, "SHARDTRAIN_GPT2_VOCAB", {SHARDTRAIN_GPT2_VOCAB_BUILD_DIR, "/usr/share/shardtrain/gpt2"},
      Gpt2FilesIn, "GPT-2's vocabulary (encoder.json + vocab.bpe, or vocab.json + merges.txt)",
      "--vocab");
}

absl::StatusOr<std::unique_ptr<ByteLevelBpe>> LoadGpt2Vocabulary(const std::string& dir) {
  absl::StatusOr<Gpt2VocabularyFiles> files = FindGpt2Vocabulary(dir);
  if (!files.ok()) return files.status();
  return ByteLevelBpe::FromGpt2Files(files->vocab, files->merges);
}

absl::StatusOr<std::string> FindLlama3Tokenizer(const std::string& file) {
  return Search<std::string>(
      file, "SHARDTRAIN_LLAMA3_TOKENIZER",
      {SHARDTRAIN_LLAMA3_TOKENIZER_BUILD_PATH, "/usr/share/shardtrain/llama3/tokenizer.json"},
      TokenizerJsonAt, "Llama 3's tokenizer.json", "--vocab");
}

absl::StatusOr<std::string> FindLlama2Tokenizer(const std::string& file) {
  return Search<std::string>(
      file, "SHARDTRAIN_LLAMA2_TOKENIZER",
      {SHARDTRAIN_LLAMA2_TOKENIZER_BUILD_PATH, "/usr/share/shardtrain/llama2/tokenizer.json"},
      TokenizerJsonAt, "Llama 2's tokenizer.json", "--tokenizer-json");
}

absl::StatusOr<std::unique_ptr<ByteLevelBpe>> LoadTokenizer(TokenizerKind kind,
                                                            const std::string& path) {
  switch (kind) {
    case TokenizerKind::kGpt2:
      return LoadGpt2Vocabulary(path);
    case TokenizerKind::kLlama3: {
      absl::StatusOr<std::string> file = FindLlama3Tokenizer(path);
      if (!file.ok()) return file.status();
      return ByteLevelBpe::FromTokenizerJson(*file);
    }
    case TokenizerKind::kJson: {
      if (path.empty()) {
        return absl::InvalidArgumentError("a tokenizer.json tokenizer needs the file's path");
      }
      absl::StatusOr<std::string> file = TokenizerJsonAt(path);
      if (!file.ok()) return file.status();
      return ByteLevelBpe::FromTokenizerJson(*file);
    }
    case TokenizerKind::kByte:
      break;
  }
  return absl::InvalidArgumentError("the byte tokenizer is no BPE (token = byte value)");
}

}  // namespace shardtrain
