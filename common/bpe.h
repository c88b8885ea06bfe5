// BPE, the one tokenizer implementation shardtrain turns text into ids with
// and back: byte-level BPE (Radford et al. 2019: GPT-2, Llama 3, Qwen,
// SmolLM) and SentencePiece-style BPE (Llama 2, Mistral, Mixtral) are this
// class loaded from different files. The file says which alphabet the
// merges work on: GPT-2's 256 bytes, or Unicode characters with byte
// fallback (a tokenizer.json whose model has byte_fallback, or with a
// Metaspace pre-tokenizer or decoder, a ByteFallback decoder or a Prepend
// normalizer: SentencePiece-style).
//
// Encode(text):
//   1. added tokens (tokenizer.json's added_tokens, e.g. Llama 3's
//      <|begin_of_text|>) are cut out of the text first, when asked
//      (Specials::kParse, Hugging Face's default); each is its id. Between
//      them, each section goes through
//   2. the normalizer, where the file gives one (NFC, NFD, NFKC, NFKD,
//      Lowercase, Replace, Prepend, or a Sequence of them). Prepend (Llama
//      2's "▁") puts its string before each section but one that
//      continues a document (EncodeOptions::document_start false);
//   3. the pre-tokenizer: each step splits every piece further by its
//      pattern (PCRE2 with Unicode properties and JIT: a Split step's Regex
//      or String, ByteLevel's use_regex step with GPT-2's pattern, Digits as
//      \p{N} runs or single digits; Metaspace: spaces become its
//      replacement, put first as its prepend_scheme says, and, with split,
//      each piece ends before the next replacement). Bytes that are not
//      valid UTF-8 match nothing: each run of them is a piece of its own, so
//      every input encodes;
//   4. the model: a piece that is itself a token is that token when the
//      file says ignore_merges (Llama 3); otherwise its bytes (each the
//      printable character of GPT-2's byte<->unicode table in the files) are
//      merged, the lowest-ranked adjacent pair first (leftmost on ties),
//      until no pair has a rank. SentencePiece-style: the same over the
//      piece's characters; a character the vocabulary lacks is its UTF-8
//      bytes as the tokens <0x00>..<0xFF> (byte fallback; a byte that is not
//      valid UTF-8 likewise), or the unknown token (model.unk_token, one for
//      a run of them with fuse_unk) without byte fallback.
// Decode concatenates the ids' bytes (an added token's: its content):
// Decode(Encode(x)) == x for any bytes x, as long as no normalizer changes
// them. SentencePiece-style, a token's bytes are what the file's decoder
// makes of it (Llama 2's: "▁" -> " ", <0xNN> -> that byte), and Decode
// strips from the whole text what the decoder's Strip says (Llama 2's: one
// leading space, the one Prepend put there). Decode(Encode(x)) == x holds
// for any bytes x then (a byte that is not UTF-8 decodes to itself, where
// Hugging Face's ByteFallback decoder writes U+FFFD) but where x holds "▁"
// (U+2581: decoded as a space), where a character the vocabulary lacks has
// no byte fallback (the unknown token), where a Metaspace pre-tokenizer
// prepends no "▁" because x starts with a space, or with added tokens
// parsed (each section after one gets its own "▁", a space when decoded, as
// Hugging Face's does).
//
// Ids equal Hugging Face's tokenizers (checked against transformers.js,
// tests/unit/common/bpe_test.cc and sp_bpe_test.cc), with known
// differences in the JS port: JavaScript's \s also matches U+FEFF (BOM) and
// not U+0085 (NEL); PCRE2's, like Hugging Face's Rust, the reverse. Its
// Metaspace never splits and prepends only with add_prefix_space; Hugging
// Face's (and this class) split unless "split": false and follow
// prepend_scheme.
//
// Immutable once loaded: thread-safe; pass each thread its own Cache.
#ifndef SHARDTRAIN_COMMON_BPE_H_
#define SHARDTRAIN_COMMON_BPE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace shardtrain {

// What the text of an added token (e.g. "<|endoftext|>") in the input is:
// plain text, encoded like any other (kText: what `shardtrain prepare`
// does, as llm.c's scripts and tiktoken's encode_ordinary do, so a corpus
// cannot forge a document boundary), or the token (kParse: Hugging Face's
// default, what `shardtrain sample` does with a prompt).
enum class BpeSpecials { kText, kParse };
struct BpeEncodeOptions {
  BpeSpecials specials = BpeSpecials::kText;
  // False when the text continues a document encoded before it (a later
  // chunk of `shardtrain prepare`): no ByteLevel prefix space, Prepend or
  // Metaspace prefix for it.
  bool document_start = true;
};

class ByteLevelBpe {
 public:
  // Reads a Hugging Face tokenizer.json of a BPE model (model.type BPE;
  // merges as "a b" strings or [a, b] pairs), byte-level (over GPT-2's byte
  // alphabet) or SentencePiece-style (above). NOT_FOUND naming a missing
  // file; INVALID_ARGUMENT naming the file and the JSON field of anything
  // malformed or unsupported (a WordPiece or Unigram model, a vocabulary
  // outside GPT-2's byte table without the marks of a SentencePiece-style
  // file, a normalizer, pre-tokenizer or decoder type not listed above, a
  // pattern PCRE2 rejects, a merge whose parts are not in the vocabulary).
  static absl::StatusOr<std::unique_ptr<ByteLevelBpe>> FromTokenizerJson(const std::string& path);
  // Reads GPT-2's two files: the vocabulary (encoder.json / vocab.json:
  // {"token": id, ...}) and the merges (vocab.bpe / merges.txt: "#version"
  // line, then "a b" per line, by rank); GPT-2's pattern, no added tokens.
  // Errors as FromTokenizerJson's, naming the file and the line or token.
  static absl::StatusOr<std::unique_ptr<ByteLevelBpe>> FromGpt2Files(
      const std::string& vocab_path, const std::string& merges_path);
  ~ByteLevelBpe();

  // Pieces already merged (piece bytes -> ids); one per thread. Bounded:
  // cleared when it holds more than kMaxCacheEntries.
  struct Cache {
    static constexpr size_t kMaxCacheEntries = 1 << 18;
    absl::flat_hash_map<std::string, std::vector<int>> pieces;
  };

  using Specials = BpeSpecials;
  using EncodeOptions = BpeEncodeOptions;
  // The ids of `text` (any bytes), appended to *out. `cache` may be null.
  void Encode(std::string_view text, std::vector<int>* out, Cache* cache = nullptr,
              const EncodeOptions& options = {}) const;
  std::vector<int> Encode(std::string_view text, Cache* cache = nullptr,
                          const EncodeOptions& options = {}) const;
  // The bytes of `ids`; INVALID_ARGUMENT naming the first id that is not a
  // token of this vocabulary.
  absl::StatusOr<std::string> Decode(absl::Span<const int> ids) const;

  // Ids are in [0, vocab_size()): GPT-2's 50,257, Llama 3's 128,256, Llama
  // 2's and Mistral's 32,000.
  int vocab_size() const { return static_cast<int>(id_bytes_.size()); }
  // The id of a token by its text (an added token's content, or a
  // vocabulary token's bytes; SentencePiece-style, the token as the file
  // spells it, e.g. "▁the"); -1 when there is none.
  int TokenId(std::string_view token) const;
  // The token that leads every document in `shardtrain prepare`'s shards;
  // -1 when none. GPT-2: <|endoftext|> (50256); Llama 3: <|begin_of_text|>
  // (128000), as llm.c writes them; Llama 2: <s> (1). For other files: the
  // special token a TemplateProcessing post-processor puts first, else
  // <|begin_of_text|>, else <|endoftext|>, where the vocabulary has one.
  int document_token() const { return document_token_; }

 private:
  struct Regex;
  struct Step;
  struct Normalizer;
  struct SentencePiece;
  // Where a section of Encode's text (text between added tokens) sits: at
  // a document's start, after an added token, or continuing text encoded
  // before it (EncodeOptions::document_start false).
  enum class Section { kDocumentStart, kAfterAdded, kContinued };
  struct AddedToken {
    std::string content;
    int id = 0;
    bool lstrip = false, rstrip = false, single_word = false;
  };
  ByteLevelBpe();
  // Both loaders' check that every byte has its token (fills byte_id_).
  absl::Status CheckBytes(const std::string& path);
  // Encodes one section (no added tokens in it).
  void EncodeSection(std::string_view text, Section where, std::vector<int>* out,
                     Cache* cache) const;
  // Splits `piece` by pre-tokenizer steps [step, end) and encodes the parts.
  void SplitAndEncode(std::string_view piece, size_t step, void* match, std::vector<int>* out,
                      Cache* cache) const;
  // Appends the ids of one pre-tokenised piece.
  void EncodePiece(std::string_view piece, std::vector<int>* out, Cache* cache) const;
  // EncodePiece of a SentencePiece-style file: characters, byte fallback
  // (bpe_sentencepiece.cc).
  void EncodeCharacters(std::string_view piece, std::vector<int>* out, Cache* cache) const;
  // The first added token at or after `from` in `text` (leftmost, longest);
  // false when none.
  bool FindAdded(std::string_view text, size_t from, size_t* at, const AddedToken** token) const;

  std::vector<std::unique_ptr<Normalizer>> normalizers_;
  std::vector<Step> steps_;  // the pre-tokenizer's splits, in order
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;
  // Token bytes -> id (the model's vocabulary), and id -> bytes (added
  // tokens' content included; empty for ids that are no token).
  absl::flat_hash_map<std::string, int> ids_;
  std::vector<std::string> id_bytes_;
  std::vector<bool> is_token_;
  // Merge rank of a pair of ids (first << 32 | second) and the id it makes.
  struct Merge {
    int rank;
    int id;
  };
  absl::flat_hash_map<uint64_t, Merge> merges_;
  int byte_id_[256];  // the id of each single byte's symbol (<0xNN>'s: -1 where none)
  std::vector<AddedToken> added_;
  bool added_first_byte_[256] = {};
  int document_token_ = -1;
  // Set for a SentencePiece-style file (the alphabet is characters; ids_
  // maps the file's token strings), null for a byte-level one.
  std::unique_ptr<SentencePiece> sp_;
};

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_BPE_H_
