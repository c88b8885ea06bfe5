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

// llm.c token file: 256 x int32 header (header[0] = kLlmcMagic, header[1] =
// kLlmcVersion, header[2] = number of tokens), then that many uint16 tokens.
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr int kLlmcHeaderInts = 256;

// Byte tokenizer: token = byte value (vocab 256). `path` is a file, or a
// directory whose *.txt files are concatenated in sorted name order.
// Errors: NotFound (missing path; directory without .txt files),
// InvalidArgument (fewer than min_tokens tokens, e.g. T + 1), each naming
// the file or directory.
absl::StatusOr<std::vector<uint16_t>> LoadTextTokens(const std::string& path, int64_t min_tokens);

// llm.c token file, or a directory whose *.bin files (the shards
// `shardtrain prepare` writes) are concatenated in sorted name order.
// Errors, each naming the file: NotFound (missing; a directory without .bin files),
// DataLoss (wrong magic, unsupported version, truncated: the header's count
// exceeds the bytes present, or the file is shorter than the header),
// InvalidArgument (fewer than min_tokens tokens; a token >= vocab, with its
// index).
absl::StatusOr<std::vector<uint16_t>> LoadLlmcTokens(const std::string& path, int vocab,
                                                     int64_t min_tokens);

// Dispatches on format; for text also checks vocab >= 256.
absl::StatusOr<std::vector<uint16_t>> LoadTokens(const std::string& path, TokenFormat format,
                                                 int vocab, int64_t min_tokens);

// Writes an llm.c token file (used by tests and data preparation).
absl::Status WriteLlmcTokens(const std::string& path, const std::vector<uint16_t>& tokens);

// Byte tokenizer helpers.
std::vector<int> EncodeBytes(const std::string& text);
std::string DecodeBytes(const std::vector<int>& tokens);

}  // namespace shardtrain::data

#endif  // SHARDTRAIN_WORKER_DATA_TOKENS_H_
