// Data preparation (`shardtrain prepare`): text files -> llm.c token shards
// that data.format: llmc reads (a directory of *.bin, tokens.h).
//
// Documents are the input files (a directory stands for every regular file
// under it, recursively, in sorted path order). Each document starts with
// its tokenizer's document token (ByteLevelBpe::document_token: gpt2's
// <|endoftext|>, 50256; llama3's <|begin_of_text|>, 128000), as llm.c's
// preparation scripts write them, so the model sees where one ends and the
// next begins; the byte tokenizer has no spare id and concatenates, as does
// a tokenizer.json without such a token. Text that reads like a special
// token is encoded as text (ByteLevelBpe::Specials::kText).
//
// Token files are llm.c's uint16 format when every id of the tokenizer fits
// (byte, gpt2), else its uint32 format (llama3; tokens.h).
//
// Output, under out_dir:
//   train/000000.bin, train/000001.bin, ...   at most shard_tokens tokens each
//   val/000000.bin, ...                       when val_inputs or val_fraction
// val_fraction f (without val_inputs) holds out the last f of the input
// bytes: the documents past that point, the one it falls in split at a line
// start (its second part begins with its own <|endoftext|>).
// Everything is written under a sibling temporary directory first and
// renamed to out_dir at the end: an error (unreadable input, full disk)
// leaves nothing; out_dir must not exist.
//
// Speed: documents are cut into ~256 KB chunks at line starts where no
// byte-level BPE pattern (GPT-2's, Llama 3's, Qwen's, SmolLM's) joins
// pieces across the cut (a '\n' between two printable ASCII bytes), so
// threads encode chunks independently and the ids equal a one-thread
// encoding. For a SentencePiece-style file the same holds while no merge
// joins '\n' to its neighbours (the pinned Llama 2 file's '\n' is a byte
// token no merge uses: sp_bpe_test checks chunks against whole documents).
// Input is read in batches of ~64 MB (memory stays about the batch and its
// tokens).
#ifndef SHARDTRAIN_WORKER_DATA_PREPARE_H_
#define SHARDTRAIN_WORKER_DATA_PREPARE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_spec.h"

namespace shardtrain::data {

struct PrepareProgress {
  int64_t bytes_done = 0, bytes_total = 0;
  int64_t tokens = 0;
  double seconds = 0;
};

struct PrepareOptions {
  std::vector<std::string> inputs;      // files or directories (training text)
  std::vector<std::string> val_inputs;  // held-out text; excludes val_fraction
  double val_fraction = 0;              // in [0, 1)
  std::string out_dir;
  TokenizerKind tokenizer = TokenizerKind::kGpt2;
  // The tokenizer's files (LoadTokenizer): gpt2, the vocabulary's folder;
  // llama3, its tokenizer.json (both searched for when empty); json, the
  // tokenizer.json (required).
  std::string tokenizer_path;
  int64_t shard_tokens = 100'000'000;  // >= 1 (llm.c's 10^8)
  int threads = 1;                     // >= 1
  // Called from the calling thread after each batch of chunks.
  std::function<void(const PrepareProgress&)> progress;
};

struct PrepareSummary {
  int64_t documents = 0;    // train and val
  int document_token = -1;  // the id leading each document; -1 when none
  int vocab_size = 256;     // the tokenizer's
  int token_bytes = 2;      // per token in the files: 2 (uint16) or 4 (uint32)
  int64_t bytes = 0;        // of input text
  int64_t train_tokens = 0, val_tokens = 0;
  std::vector<std::string> train_shards, val_shards;  // paths under out_dir
  double seconds = 0;
};

// INVALID_ARGUMENT naming the option (no inputs, val_fraction outside
// [0, 1), shard_tokens or threads < 1, out_dir empty); ALREADY_EXISTS when
// out_dir exists; NOT_FOUND / PERMISSION_DENIED naming an input that cannot
// be read (or a directory holding no file); the tokenizer's errors
// (LoadTokenizer). Nothing is left under out_dir's parent on error.
absl::StatusOr<PrepareSummary> Prepare(const PrepareOptions& options);

// The safe cut points of `text` near every `chunk` bytes (Prepare's chunks;
// exposed for its test): positions i with text[i-1] == '\n' and text[i-2],
// text[i] printable ASCII (0x21..0x7e), the first at or after each multiple
// of `chunk`; sorted, each in (0, text.size()).
std::vector<size_t> SafeCuts(const std::string& text, size_t chunk);

}  // namespace shardtrain::data

#endif  // SHARDTRAIN_WORKER_DATA_PREPARE_H_
