// The parts of ByteLevelBpe (common/bpe.h) that its three source files
// share: bpe.cc encodes and decodes, bpe_load.cc reads the files,
// bpe_sentencepiece.cc holds what only SentencePiece-style files have.
// Not for other code.
#ifndef SHARDTRAIN_COMMON_BPE_INTERNAL_H_
#define SHARDTRAIN_COMMON_BPE_INTERNAL_H_

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/casemap.h>
#include <unicode/normalizer2.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/bpe.h"

namespace shardtrain {
namespace bpe_internal {

using Json = nlohmann::json;

inline uint64_t PairKey(int a, int b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

inline bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

// "FILE: FIELD: what" errors of a tokenizer.json.
inline absl::Status Bad(const std::string& path, const std::string& field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", field, ": ", what));
}

inline bool BoolField(const Json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

inline std::string TypeOf(const Json& j) {
  auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace bpe_internal

// A compiled PCRE2 pattern (UTF, Unicode properties, invalid UTF-8 never
// matches; JIT where the platform has it).
struct ByteLevelBpe::Regex {
  pcre2_code* code = nullptr;
  Regex() = default;
  Regex(const Regex&) = delete;
  Regex(Regex&& o) noexcept : code(o.code) { o.code = nullptr; }
  ~Regex() { pcre2_code_free(code); }

  // INVALID_ARGUMENT naming `where` when PCRE2 rejects the pattern.
  absl::Status Compile(std::string_view pattern, bool literal, const std::string& where) {
    int error = 0;
    PCRE2_SIZE error_at = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                         literal ? PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | PCRE2_LITERAL
                                 : PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                         &error, &error_at, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return absl::InvalidArgumentError(absl::StrCat(where, ": pattern rejected at offset ",
                                                     error_at, ": ",
                                                     reinterpret_cast<char*>(message)));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // the interpreter without JIT
    return absl::OkStatus();
  }

  // The next match in text at or after `at`: true with [*begin, *end), or
  // false when there is none.
  bool Next(std::string_view text, size_t at, pcre2_match_data* match, size_t* begin,
            size_t* end) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    int rc = pcre2_match(code, subject, text.size(), at, 0, match, nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {  // e.g. the JIT's stack: the interpreter
      rc = pcre2_match(code, subject, text.size(), at, PCRE2_NO_JIT, match, nullptr);
    }
    if (rc < 0) return false;
    const PCRE2_SIZE* v = pcre2_get_ovector_pointer(match);
    *begin = v[0];
    *end = v[1];
    return true;
  }
};

// One pre-tokenizer split: Hugging Face's Split (its behaviours), ByteLevel's
// GPT-2 pattern and Digits all become one.
struct ByteLevelBpe::Step {
  enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };
  Regex regex;
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;  // the matches are the pieces, the text between them the delimiters
};

// One normalizer: Unicode normalization forms and lower case (ICU), or
// replacement of a pattern (PCRE2) by a string, or a string put first.
struct ByteLevelBpe::Normalizer {
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kReplace, kPrepend };
  Kind kind = Kind::kNfc;
  const icu::Normalizer2* form = nullptr;
  Regex pattern;
  std::string content;
  // kPrepend: `content` goes before a section's text when Prepends says so.
  // Hugging Face's Prepend: before every non-empty section but one that
  // continues a document; Metaspace's prepend_scheme "always" also, but not
  // before text that starts with `content` (unless_present); "first" only
  // at a document's start (first_only).
  bool first_only = false, unless_present = false;
  bool Prepends(std::string_view text, Section where) const {
    return !text.empty() && where != Section::kContinued &&
           !(first_only && where != Section::kDocumentStart) &&
           !(unless_present && text.substr(0, content.size()) == content);
  }

  // *text normalized in place (kPrepend: see Prepends).
  void Apply(std::string* text) const {
    if (kind == Kind::kPrepend) return;
    if (kind == Kind::kReplace) {
      pcre2_match_data* match = pcre2_match_data_create_from_pattern(pattern.code, nullptr);
      std::string out;
      size_t at = 0, begin, end;
      while (at <= text->size() && pattern.Next(*text, at, match, &begin, &end)) {
        out.append(*text, at, begin - at);
        out += content;
        if (end == begin) {  // an empty match: keep the next character
          if (end < text->size()) out.push_back((*text)[end]);
          ++end;
        }
        at = end;
      }
      if (at < text->size()) out.append(*text, at, std::string::npos);
      pcre2_match_data_free(match);
      *text = std::move(out);
      return;
    }
    if (kind == Kind::kLowercase) {
      if (bpe_internal::IsAscii(*text)) {
        for (char& c : *text) c = (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
        return;
      }
      std::string out;
      icu::StringByteSink<std::string> sink(&out);
      UErrorCode status = U_ZERO_ERROR;
      icu::CaseMap::utf8ToLower("", 0, icu::StringPiece(text->data(), int32_t(text->size())), sink,
                                nullptr, status);
      if (U_SUCCESS(status)) *text = std::move(out);
      return;
    }
    if (bpe_internal::IsAscii(*text)) return;  // every normalization form leaves ASCII as it is
    std::string out;
    icu::StringByteSink<std::string> sink(&out);
    UErrorCode status = U_ZERO_ERROR;
    form->normalizeUTF8(0, icu::StringPiece(text->data(), int32_t(text->size())), sink, nullptr,
                        status);
    if (U_SUCCESS(status)) *text = std::move(out);
  }
};

// What a SentencePiece-style file adds (bpe_sentencepiece.cc): its
// alphabet is Unicode characters, not GPT-2's bytes; a character outside
// the vocabulary is its UTF-8 bytes as <0xNN> tokens (byte fallback) or the
// unknown token; the decoder turns pieces back into text.
struct ByteLevelBpe::SentencePiece {
  using Json = bpe_internal::Json;

  // Whether `root`, a tokenizer.json, is SentencePiece-style: model.byte_fallback,
  // a Metaspace pre-tokenizer or decoder, a ByteFallback decoder or a
  // Prepend normalizer.
  static bool Describes(const Json& root);

  // Reads root's decoder, and the marker (a Metaspace pre-tokenizer's
  // replacement). INVALID_ARGUMENT naming the field of a decoder step other
  // than Replace (of a String), ByteFallback, Fuse, Strip (after Fuse),
  // Metaspace or a Sequence of them.
  absl::Status ReadDecoder(const Json& root, const std::string& path);
  // The text of vocabulary token `piece` as the decoder's per-token steps
  // (Replace, ByteFallback) make it: "▁the" -> " the", "<0x0A>" -> "\n".
  std::string Decoded(const std::string& piece) const;
  // model.byte_fallback, unk_token, fuse_unk, after the vocabulary is read:
  // fills bpe->byte_id_ with the <0xNN> tokens' ids (-1 where none).
  // INVALID_ARGUMENT when a character could have no token (no byte
  // fallback, or a byte token missing) and model.unk_token names none.
  absl::Status ReadModel(const Json& model, const std::string& path, ByteLevelBpe* bpe);
  // Notes merge (a, b) of model.merges for the word cuts (CutsBefore).
  void NoteMerge(absl::string_view a, absl::string_view b);
  // A Metaspace pre-tokenizer `j` at `field`: its replacement of spaces and
  // prepend_scheme as normalizers of bpe, its split as a step.
  absl::Status AddMetaspace(const Json& j, const std::string& path, const std::string& field,
                            ByteLevelBpe* bpe);
  // Whether a piece may be cut into words before a marker that follows
  // the character `previous` (a token of the vocabulary or not): true when
  // no merge can join the two, so each word encodes alone to the ids the
  // piece would have.
  bool CutsBefore(std::string_view previous, bool previous_is_token) const;
  // Appends the ids of one word: its characters' symbols (byte fallback,
  // the unknown token) merged by bpe's merges.
  void EncodeWord(const ByteLevelBpe& bpe, std::string_view word, std::vector<int>* ids) const;
  // The decoder's Strip on the whole decoded text.
  void Strip(std::string* text) const;

  bool byte_fallback = false;
  bool fuse_unk = false;
  int unk_id = -1;
  // Where words start: U+2581, or Metaspace's replacement.
  std::string marker = "\xe2\x96\x81";
  bool marker_is_token = false;
  // The last character of each merge's left part whose right part starts
  // with the marker; whether one of them ends a byte or unknown token.
  absl::flat_hash_set<std::string> joined_before_marker;
  bool joins_fallback = false;
  std::string unk_piece;
  // The decoder: per-token steps in order, then Strip.
  struct DecodeStep {
    bool byte_fallback = false;  // else a Replace of `pattern` by `content`
    std::string pattern, content;
  };
  std::vector<DecodeStep> decode_steps;
  std::string strip_content;
  int strip_start = 0, strip_stop = 0;
};

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_BPE_INTERNAL_H_
