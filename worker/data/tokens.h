// Token sources: plain text through the byte tokenizer, and llm.c token
// files. Every error names the offending file.
#ifndef SHARDTRAIN_WORKER_DATA_TOKENS_H_
#define SHARDTRAIN_WORKER_DATA_TOKENS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shardtrain::data {

enum class TokenFormat { kText, kLlmc };

// Parses "text" / "llmc" (the job spec's data.format). InvalidArgument else.
absl::StatusOr<TokenFormat> ParseTokenFormat(const std::string& name);

// llm.c token files: a header of 256 int32 (header[0] a magic number,
// header[1] the format's version, header[2] the number of tokens), then that
// many tokens, little-endian, of the type the version names. Both of llm.c's
// formats (dev/data/data_common.py) are read and written:
//   magic 20240520, version 1: uint16 tokens (GPT-2, the byte tokenizer)
//   magic 20240801, version 7: uint32 tokens (vocabularies past 65,536 ids,
//                              Llama 3's 128,256)
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr int32_t kLlmcWideMagic = 20240801;
inline constexpr int32_t kLlmcWideVersion = 7;
inline constexpr int kLlmcHeaderInts = 256;

// Token ids in memory, in the type of the files they came from: 2 bytes
// each for uint16 files and text (the memory GPT-2 and byte jobs always
// had), 4 bytes for uint32 files. Cheap to move; values compare equal
// whatever their width.
class TokenIds {
 public:
  TokenIds() = default;
  TokenIds(std::vector<uint16_t> ids) : narrow_(std::move(ids)) {}  // NOLINT: implicit
  TokenIds(std::vector<uint32_t> ids) : wide_(std::move(ids)), is_wide_(true) {}  // NOLINT

  size_t size() const { return is_wide_ ? wide_.size() : narrow_.size(); }
  bool empty() const { return size() == 0; }
  // True for 4-byte ids (written as llm.c's uint32 format).
  bool wide() const { return is_wide_; }
  uint32_t operator[](size_t i) const { return is_wide_ ? wide_[i] : narrow_[i]; }
  // The ids of one window: inputs = ids [start, start + T), targets = ids
  // [start + 1, start + T]. Requires start + T < size().
  void Window(size_t start, int T, int* inputs, int* targets) const;
  // Appends `other`'s ids (widening these when `other` is wide; taking
  // its storage when these are empty).
  void Append(TokenIds other);
  // The ids as stored (narrow when !wide(), else wide).
  const std::vector<uint16_t>& narrow() const { return narrow_; }
  const std::vector<uint32_t>& wide_ids() const { return wide_; }

  friend bool operator==(const TokenIds& a, const TokenIds& b);
  friend bool operator!=(const TokenIds& a, const TokenIds& b) { return !(a == b); }

 private:
  std::vector<uint16_t> narrow_;
  std::vector<uint32_t> wide_;
  bool is_wide_ = false;
};

// Byte tokenizer: token = byte value (vocab 256). `path` is a file, or a
// directory whose *.txt files are concatenated in sorted name order.
// Errors: NotFound (missing path; directory without .txt files),
// InvalidArgument (fewer than min_tokens tokens, e.g. T + 1), each naming
// the file or directory.
absl::StatusOr<TokenIds> LoadTextTokens(const std::string& path, int64_t min_tokens);

// llm.c token file of either format, or a directory whose *.bin files (the
// shards `shardtrain prepare` writes) are concatenated in sorted name order;
// wide when any file is uint32.
// Errors, each naming the file: NotFound (missing; a directory without .bin files),
// DataLoss (wrong magic, unsupported version, truncated: the header's count
// exceeds the bytes present, or the file is shorter than the header),
// InvalidArgument (fewer than min_tokens tokens; a token >= vocab, with its
// index).
absl::StatusOr<TokenIds> LoadLlmcTokens(const std::string& path, int vocab, int64_t min_tokens);

// Dispatches on format; for text also checks vocab >= 256.
absl::StatusOr<TokenIds> LoadTokens(const std::string& path, TokenFormat format, int vocab,
                                    int64_t min_tokens);

// Writes an llm.c token file: uint16 (version 1) for narrow ids, uint32
// (version 7) for wide ones. Used by tests and data preparation.
absl::Status WriteLlmcTokens(const std::string& path, const TokenIds& tokens);

// Byte tokenizer helpers.
std::vector<int> EncodeBytes(const std::string& text);
std::string DecodeBytes(const std::vector<int>& tokens);

}  // namespace shardtrain::data

#endif  // SHARDTRAIN_WORKER_DATA_TOKENS_H_
