#include "common/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/casemap.h>
#include <unicode/normalizer2.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace shardtrain {
namespace {

using Json = nlohmann::json;

// GPT-2's pre-tokenisation pattern (encoder.py; Hugging Face's ByteLevel
// pre-tokenizer with use_regex), verbatim.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xC0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(char(0xE0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(char(0xF0 | (cp >> 18)));
    out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  }
}

// GPT-2's bytes_to_unicode(): printable bytes stand for themselves, the
// other 68 take the code points 256, 257, ... in byte order.
std::vector<uint32_t> ByteCodePoints() {
  std::vector<uint32_t> cp(256, 0);
  std::vector<bool> printable(256, false);
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) cp[b] = printable[b] ? uint32_t(b) : next++;
  return cp;
}

// The bytes a vocabulary token (a string of GPT-2's byte code points)
// stands for; false when it holds a character outside that table (not a
// byte-level vocabulary) or is not valid UTF-8.
bool TokenBytes(const std::string& s, const std::vector<int>& cp_to_byte, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F);
      i += 2;
    } else if ((c & 0xF0) == 0xE0 && i + 2 < s.size()) {
      cp = ((c & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
      i += 3;
    } else {
      return false;
    }
    if (cp >= cp_to_byte.size() || cp_to_byte[cp] < 0) return false;
    out->push_back(char(cp_to_byte[cp]));
  }
  return true;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return s.str();
}

uint64_t PairKey(int a, int b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

}  // namespace

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
// replacement of a pattern (PCRE2) by a string.
struct ByteLevelBpe::Normalizer {
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kReplace };
  Kind kind = Kind::kNfc;
  const icu::Normalizer2* form = nullptr;
  Regex pattern;
  std::string content;

  // *text normalized in place.
  void Apply(std::string* text) const {
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
      if (IsAscii(*text)) {
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
    if (IsAscii(*text)) return;  // every normalization form leaves ASCII as it is
    std::string out;
    icu::StringByteSink<std::string> sink(&out);
    UErrorCode status = U_ZERO_ERROR;
    form->normalizeUTF8(0, icu::StringPiece(text->data(), int32_t(text->size())), sink, nullptr,
                        status);
    if (U_SUCCESS(status)) *text = std::move(out);
  }
};

ByteLevelBpe::ByteLevelBpe() = default;
ByteLevelBpe::~ByteLevelBpe() = default;

absl::StatusOr<std::unique_ptr<ByteLevelBpe>> ByteLevelBpe::FromGpt2Files(
    const std::string& vocab_path, const std::string& merges_path) {
  std::unique_ptr<ByteLevelBpe> bpe(new ByteLevelBpe());
  bpe->steps_.emplace_back();
  if (absl::Status s = bpe->steps_.back().regex.Compile(kGpt2Pattern, false, "GPT-2's pattern");
      !s.ok()) {
    return absl::InternalError(s.message());
  }

  // The vocabulary: token (GPT-2 unicode) -> id; each id's bytes.
  absl::StatusOr<std::string> text = ReadFile(vocab_path);
  if (!text.ok()) return text.status();
  Json vocab = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!vocab.is_object() || vocab.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(vocab_path, ": not a JSON object of token -> id"));
  }
  std::vector<uint32_t> to_cp = ByteCodePoints();
  std::vector<int> cp_to_byte(512, -1);
  for (int b = 0; b < 256; ++b) cp_to_byte[to_cp[b]] = b;
  bpe->id_bytes_.assign(vocab.size(), std::string());
  bpe->is_token_.assign(vocab.size(), false);
  absl::flat_hash_map<std::string, int> by_symbol;  // the file's strings, for the merges
  std::string bytes;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= int64_t(vocab.size()) ||
        bpe->is_token_[it.value().get<int64_t>()]) {
      return absl::InvalidArgumentError(
          absl::StrCat(vocab_path, ": token \"", it.key(), "\": id ", it.value().dump(),
                       " is not a distinct integer in [0, ", vocab.size(), ")"));
    }
    const int id = it.value().get<int>();
    if (!TokenBytes(it.key(), cp_to_byte, &bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat(vocab_path, ": token ", id, " has a character outside GPT-2's byte table"));
    }
    bpe->is_token_[id] = true;
    bpe->id_bytes_[id] = bytes;
    bpe->ids_[bytes] = id;
    by_symbol[it.key()] = id;
  }
  if (absl::Status s = bpe->CheckBytes(vocab_path); !s.ok()) return s;

  // The merges, by rank.
  text = ReadFile(merges_path);
  if (!text.ok()) return text.status();
  std::istringstream lines(*text);
  std::string line;
  int line_no = 0, rank = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(merges_path, ":", line_no, ": expected \"A B\", got \"", line, "\""));
    }
    const std::string a = line.substr(0, space), b = line.substr(space + 1);
    auto ia = by_symbol.find(a), ib = by_symbol.find(b), iab = by_symbol.find(a + b);
    if (ia == by_symbol.end() || ib == by_symbol.end() || iab == by_symbol.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          merges_path, ":", line_no, ": \"", line,
          "\": ", iab == by_symbol.end() ? "its merge" : "a part", " is not in ", vocab_path));
    }
    bpe->merges_.try_emplace(PairKey(ia->second, ib->second), Merge{rank++, iab->second});
  }
  bpe->document_token_ = bpe->TokenId("<|endoftext|>");
  return bpe;
}

namespace {

// "FILE: FIELD: what" errors of a tokenizer.json.
absl::Status Bad(const std::string& path, const std::string& field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", field, ": ", what));
}

bool BoolField(const Json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

std::string TypeOf(const Json& j) {
  auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<ByteLevelBpe>> ByteLevelBpe::FromTokenizerJson(
    const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  const Json root = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object (tokenizer.json)"));
  }
  std::unique_ptr<ByteLevelBpe> bpe(new ByteLevelBpe());

  // model: BPE over GPT-2's byte alphabet.
  auto model_it = root.find("model");
  if (model_it == root.end() || !model_it->is_object()) return Bad(path, "model", "missing");
  const Json& model = *model_it;
  const std::string model_type = TypeOf(model);
  if (model_type != "BPE" && !(model_type.empty() && model.contains("merges"))) {
    return Bad(path, "model.type",
               absl::StrCat("\"", model_type, "\": only byte-level BPE models are supported"));
  }
  if (BoolField(model, "byte_fallback", false)) {
    return Bad(path, "model.byte_fallback",
               "true: a SentencePiece-style BPE, not a byte-level one (unsupported)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    if (it != model.end() && it->is_string() && !it->get<std::string>().empty()) {
      return Bad(path, absl::StrCat("model.", key), "unsupported (byte-level BPE has none)");
    }
  }
  bpe->ignore_merges_ = BoolField(model, "ignore_merges", false);
  auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object() || vocab_it->empty()) {
    return Bad(path, "model.vocab", "not a JSON object of token -> id");
  }
  const Json& vocab = *vocab_it;
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= (int64_t{1} << 30)) {
      return Bad(path, "model.vocab",
                 absl::StrCat("token \"", it.key(), "\": id ", it.value().dump(),
                              " is not an integer in [0, 2^30)"));
    }
    max_id = std::max(max_id, it.value().get<int64_t>());
  }
  std::vector<AddedToken> added;
  if (auto it = root.find("added_tokens"); it != root.end() && it->is_array()) {
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& t = (*it)[i];
      const std::string field = absl::StrCat("added_tokens[", i, "]");
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
          !t.contains("content") || !t["content"].is_string() || t["id"].get<int64_t>() < 0 ||
          t["id"].get<int64_t>() >= (int64_t{1} << 30) || t["content"].get<std::string>().empty()) {
        return Bad(path, field, "expected {\"id\": integer >= 0, \"content\": non-empty string}");
      }
      AddedToken a;
      a.content = t["content"].get<std::string>();
      a.id = t["id"].get<int>();
      a.lstrip = BoolField(t, "lstrip", false);
      a.rstrip = BoolField(t, "rstrip", false);
      a.single_word = BoolField(t, "single_word", false);
      max_id = std::max<int64_t>(max_id, a.id);
      added.push_back(std::move(a));
    }
  }
  std::vector<uint32_t> to_cp = ByteCodePoints();
  std::vector<int> cp_to_byte(512, -1);
  for (int b = 0; b < 256; ++b) cp_to_byte[to_cp[b]] = b;
  bpe->id_bytes_.assign(size_t(max_id + 1), std::string());
  bpe->is_token_.assign(size_t(max_id + 1), false);
  absl::flat_hash_map<std::string, int> by_symbol;  // the file's strings, for the merges
  by_symbol.reserve(vocab.size());
  bpe->ids_.reserve(vocab.size());
  std::string bytes;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int id = it.value().get<int>();
    if (bpe->is_token_[id]) {
      return Bad(path, "model.vocab", absl::StrCat("id ", id, " is given twice"));
    }
    if (!TokenBytes(it.key(), cp_to_byte, &bytes)) {
      return Bad(path, "model.vocab",
                 absl::StrCat("token ", id, " (\"", it.key(),
                              "\") has a character outside GPT-2's byte table: not a byte-level "
                              "BPE vocabulary"));
    }
    bpe->is_token_[id] = true;
    bpe->id_bytes_[id] = bytes;
    bpe->ids_[bytes] = id;
    by_symbol[it.key()] = id;
  }
  for (AddedToken& a : added) {
    bpe->is_token_[a.id] = true;
    bpe->id_bytes_[a.id] = a.content;
    bpe->added_first_byte_[static_cast<unsigned char>(a.content[0])] = true;
  }
  // Longest first: at one position the longest added token wins.
  std::stable_sort(added.begin(), added.end(), [](const AddedToken& x, const AddedToken& y) {
    return x.content.size() > y.content.size();
  });
  bpe->added_ = std::move(added);
  if (absl::Status s = bpe->CheckBytes(path); !s.ok()) return s;

  // model.merges, by rank: "a b" strings, or [a, b] pairs (tokenizers >= 0.20).
  auto merges_it = model.find("merges");
  if (merges_it == model.end() || !merges_it->is_array()) {
    return Bad(path, "model.merges", "not an array");
  }
  bpe->merges_.reserve(merges_it->size());
  int rank = 0;
  std::string joined;
  for (size_t i = 0; i < merges_it->size(); ++i) {
    const Json& m = (*merges_it)[i];
    absl::string_view a, b;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return Bad(path, absl::StrCat("model.merges[", i, "]"),
                   absl::StrCat("expected \"A B\", got \"", s, "\""));
      }
      a = absl::string_view(s).substr(0, space);
      b = absl::string_view(s).substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get_ref<const std::string&>();
      b = m[1].get_ref<const std::string&>();
    } else {
      return Bad(path, absl::StrCat("model.merges[", i, "]"), "expected \"A B\" or [\"A\", \"B\"]");
    }
    joined.assign(a.data(), a.size());
    joined.append(b.data(), b.size());
    auto ia = by_symbol.find(a), ib = by_symbol.find(b), iab = by_symbol.find(joined);
    if (ia == by_symbol.end() || ib == by_symbol.end() || iab == by_symbol.end()) {
      return Bad(
          path, absl::StrCat("model.merges[", i, "]"),
          absl::StrCat("\"", a, " ", b, "\": ", iab == by_symbol.end() ? "its merge" : "a part",
                       " is not in model.vocab"));
    }
    bpe->merges_.try_emplace(PairKey(ia->second, ib->second), Merge{rank++, iab->second});
  }

  // normalizer: none, one, or a Sequence of supported ones.
  std::vector<std::pair<const Json*, std::string>> normalizers;
  if (auto it = root.find("normalizer"); it != root.end() && !it->is_null()) {
    if (TypeOf(*it) == "Sequence" && it->contains("normalizers") &&
        (*it)["normalizers"].is_array()) {
      for (size_t i = 0; i < (*it)["normalizers"].size(); ++i) {
        normalizers.push_back(
            {&(*it)["normalizers"][i], absl::StrCat("normalizer.normalizers[", i, "]")});
      }
    } else {
      normalizers.push_back({&*it, "normalizer"});
    }
  }
  for (const auto& [j, field] : normalizers) {
    auto n = std::make_unique<Normalizer>();
    const std::string type = TypeOf(*j);
    UErrorCode status = U_ZERO_ERROR;
    if (type == "NFC") {
      n->kind = Normalizer::Kind::kNfc;
      n->form = icu::Normalizer2::getNFCInstance(status);
    } else if (type == "NFD") {
      n->kind = Normalizer::Kind::kNfd;
      n->form = icu::Normalizer2::getNFDInstance(status);
    } else if (type == "NFKC") {
      n->kind = Normalizer::Kind::kNfkc;
      n->form = icu::Normalizer2::getNFKCInstance(status);
    } else if (type == "NFKD") {
      n->kind = Normalizer::Kind::kNfkd;
      n->form = icu::Normalizer2::getNFKDInstance(status);
    } else if (type == "Lowercase") {
      n->kind = Normalizer::Kind::kLowercase;
    } else if (type == "Replace") {
      n->kind = Normalizer::Kind::kReplace;
      auto p = j->find("pattern");
      auto c = j->find("content");
      if (p == j->end() || !p->is_object() || c == j->end() || !c->is_string()) {
        return Bad(path, field,
                   "Replace needs a pattern {\"String\"|\"Regex\": ...} and a content");
      }
      const bool literal = p->contains("String") && (*p)["String"].is_string();
      if (!literal && !(p->contains("Regex") && (*p)["Regex"].is_string())) {
        return Bad(path, field + ".pattern", "expected {\"String\": ...} or {\"Regex\": ...}");
      }
      const std::string pattern = (*p)[literal ? "String" : "Regex"].get<std::string>();
      if (absl::Status s = n->pattern.Compile(pattern, literal, path + ": " + field + ".pattern");
          !s.ok()) {
        return s;
      }
      n->content = c->get<std::string>();
    } else {
      return Bad(path, field,
                 absl::StrCat("type \"", type,
                              "\" is not supported (NFC, NFD, NFKC, NFKD, Lowercase, Replace, "
                              "Sequence)"));
    }
    if (U_FAILURE(status)) {
      return absl::InternalError(absl::StrCat("ICU: ", type, ": ", u_errorName(status)));
    }
    bpe->normalizers_.push_back(std::move(n));
  }

  // pre_tokenizer: none, one, or a Sequence: Split, ByteLevel, Digits.
  std::vector<std::pair<const Json*, std::string>> pre;
  if (auto it = root.find("pre_tokenizer"); it != root.end() && !it->is_null()) {
    if (TypeOf(*it) == "Sequence" && it->contains("pretokenizers") &&
        (*it)["pretokenizers"].is_array()) {
      for (size_t i = 0; i < (*it)["pretokenizers"].size(); ++i) {
        pre.push_back(
            {&(*it)["pretokenizers"][i], absl::StrCat("pre_tokenizer.pretokenizers[", i, "]")});
      }
    } else {
      pre.push_back({&*it, "pre_tokenizer"});
    }
  }
  for (size_t i = 0; i < pre.size(); ++i) {
    const Json& j = *pre[i].first;
    const std::string& field = pre[i].second;
    const std::string type = TypeOf(j);
    if (type == "ByteLevel") {
      if (BoolField(j, "add_prefix_space", false)) {
        if (i > 0) {
          return Bad(path, field + ".add_prefix_space",
                     "true after another pre-tokenizer is not supported");
        }
        bpe->add_prefix_space_ = true;
      }
      if (!BoolField(j, "use_regex", true)) continue;
      Step step;
      if (absl::Status s = step.regex.Compile(kGpt2Pattern, false, path + ": " + field); !s.ok()) {
        return s;
      }
      bpe->steps_.push_back(std::move(step));
    } else if (type == "Digits") {
      Step step;
      const char* pattern = BoolField(j, "individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)";
      if (absl::Status s = step.regex.Compile(pattern, false, path + ": " + field); !s.ok()) {
        return s;
      }
      bpe->steps_.push_back(std::move(step));
    } else if (type == "Split") {
      Step step;
      auto p = j.find("pattern");
      const bool literal =
          p != j.end() && p->is_object() && p->contains("String") && (*p)["String"].is_string();
      if (!literal &&
          !(p != j.end() && p->is_object() && p->contains("Regex") && (*p)["Regex"].is_string())) {
        return Bad(path, field + ".pattern", "expected {\"String\": ...} or {\"Regex\": ...}");
      }
      const std::string pattern = (*p)[literal ? "String" : "Regex"].get<std::string>();
      if (absl::Status s = step.regex.Compile(pattern, literal, path + ": " + field + ".pattern");
          !s.ok()) {
        return s;
      }
      const std::string behavior = j.contains("behavior") && j["behavior"].is_string()
                                       ? j["behavior"].get<std::string>()
                                       : "Isolated";
      using B = Step::Behavior;
      const std::pair<const char*, B> behaviors[] = {{"Isolated", B::kIsolated},
                                                     {"Removed", B::kRemoved},
                                                     {"MergedWithPrevious", B::kMergedWithPrevious},
                                                     {"MergedWithNext", B::kMergedWithNext},
                                                     {"Contiguous", B::kContiguous}};
      bool known = false;
      for (const auto& [name, b] : behaviors) {
        if (behavior == name) {
          step.behavior = b;
          known = true;
        }
      }
      if (!known) return Bad(path, field + ".behavior", absl::StrCat("unknown \"", behavior, "\""));
      step.invert = BoolField(j, "invert", false);
      bpe->steps_.push_back(std::move(step));
    } else {
      return Bad(path, field,
                 absl::StrCat("type \"", type,
                              "\" is not supported (Split, ByteLevel, Digits, Sequence)"));
    }
  }

  // The document token: a TemplateProcessing post-processor's leading
  // special token, else <|begin_of_text|>, else <|endoftext|>.
  if (auto it = root.find("post_processor");
      it != root.end() && TypeOf(*it) == "TemplateProcessing") {
    const Json& single = (*it)["single"];
    if (single.is_array() && !single.empty() && single[0].contains("SpecialToken")) {
      const Json& name = single[0]["SpecialToken"]["id"];
      if (name.is_string()) bpe->document_token_ = bpe->TokenId(name.get<std::string>());
    }
  }
  for (const char* name : {"<|begin_of_text|>", "<|endoftext|>"}) {
    if (bpe->document_token_ < 0) bpe->document_token_ = bpe->TokenId(name);
  }
  return bpe;
}

absl::Status ByteLevelBpe::CheckBytes(const std::string& path) {
  std::string symbol;
  for (int b = 0; b < 256; ++b) {
    auto it = ids_.find(std::string(1, char(b)));
    if (it == ids_.end()) {
      AppendUtf8(ByteCodePoints()[b], &symbol);
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": no token for byte ", b, " (\"", symbol, "\")"));
    }
    byte_id_[b] = it->second;
  }
  return absl::OkStatus();
}

int ByteLevelBpe::TokenId(std::string_view token) const {
  for (const AddedToken& a : added_) {
    if (a.content == token) return a.id;
  }
  auto it = ids_.find(absl::string_view(token.data(), token.size()));
  return it == ids_.end() ? -1 : it->second;
}

void ByteLevelBpe::EncodePiece(std::string_view piece, std::vector<int>* out, Cache* cache) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    out->push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (ignore_merges_) {  // a piece that is a token is that token
    auto it = ids_.find(absl::string_view(piece.data(), piece.size()));
    if (it != ids_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  if (cache != nullptr) {
    auto it = cache->pieces.find(absl::string_view(piece.data(), piece.size()));
    if (it != cache->pieces.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  auto remember = [&](std::vector<int> ids) {
    if (cache == nullptr) return;
    if (cache->pieces.size() >= Cache::kMaxCacheEntries) cache->pieces.clear();
    cache->pieces.emplace(std::string(piece), std::move(ids));
  };
  // Merge the lowest-ranked adjacent pair, the leftmost of equals, until no
  // pair has a rank (Hugging Face's order; for merges learnt in order the
  // same as encoder.py's "every occurrence of the lowest pair"). rank[i]
  // and made[i] belong to the pair (word[i], word[i + 1]); a merge looks up
  // only the two pairs beside it.
  constexpr int kNone = std::numeric_limits<int>::max();
  std::vector<int> word(piece.size()), rank(piece.size()), made(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    word[i] = byte_id_[static_cast<unsigned char>(piece[i])];
  }
  auto pair = [&](size_t i) {
    auto it = merges_.find(PairKey(word[i], word[i + 1]));
    rank[i] = it == merges_.end() ? kNone : it->second.rank;
    made[i] = it == merges_.end() ? -1 : it->second.id;
  };
  for (size_t i = 0; i + 1 < word.size(); ++i) pair(i);
  while (word.size() > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < word.size(); ++i) {
      if (rank[i] < rank[best]) best = i;
    }
    if (rank[best] == kNone) break;
    word[best] = made[best];
    word.erase(word.begin() + best + 1);
    rank.erase(rank.begin() + best + 1);
    made.erase(made.begin() + best + 1);
    if (best + 1 < word.size()) pair(best);
    if (best > 0) pair(best - 1);
  }
  out->insert(out->end(), word.begin(), word.end());
  remember(std::move(word));
}

namespace {

// Calls f(run, is_match) for the runs of `text` in order: the matches of
// `regex` and the text between them. Empty matches split nothing. Bytes
// that are not valid UTF-8 never match: they fall between matches.
template <typename Regex, typename F>
void ForEachRun(const Regex& regex, std::string_view text, pcre2_match_data* match, F f) {
  size_t start = 0, from = 0, begin, end;
  while (from < text.size() && regex.Next(text, from, match, &begin, &end)) {
    if (end == begin) {  // from the next character on
      from = begin + 1;
      while (from < text.size() && (static_cast<unsigned char>(text[from]) & 0xC0) == 0x80) ++from;
      continue;
    }
    if (begin > start) f(text.substr(start, begin - start), false);
    f(text.substr(begin, end - begin), true);
    start = from = end;
  }
  if (start < text.size()) f(text.substr(start), false);
}

}  // namespace

void ByteLevelBpe::SplitAndEncode(std::string_view text, size_t step, void* match_data,
                                  std::vector<int>* out, Cache* cache) const {
  if (step == steps_.size()) {
    EncodePiece(text, out, cache);
    return;
  }
  const Step& s = steps_[step];
  pcre2_match_data* match = static_cast<pcre2_match_data**>(match_data)[step];
  auto next = [&](std::string_view piece) {
    SplitAndEncode(piece, step + 1, match_data, out, cache);
  };
  using B = Step::Behavior;
  if (s.behavior == B::kIsolated) {  // every run is a piece (invert or not)
    ForEachRun(s.regex, text, match, [&](std::string_view run, bool) { next(run); });
    return;
  }
  // The other behaviours: the runs as (piece, is_delimiter) first.
  std::vector<std::pair<std::string_view, bool>> runs;
  ForEachRun(s.regex, text, match, [&](std::string_view run, bool matched) {
    runs.push_back({run, matched != s.invert});
  });
  // The run from runs[i] through runs[j], contiguous in text.
  auto span = [&](size_t i, size_t j) {
    const char* first = runs[i].first.data();
    return std::string_view(first, size_t(runs[j].first.data() + runs[j].first.size() - first));
  };
  for (size_t i = 0; i < runs.size(); ++i) {
    const bool delimiter = runs[i].second;
    const bool next_is_delimiter = i + 1 < runs.size() && runs[i + 1].second;
    const bool next_is_piece = i + 1 < runs.size() && !runs[i + 1].second;
    switch (s.behavior) {
      case B::kRemoved:
        if (!delimiter) next(runs[i].first);
        break;
      case B::kMergedWithPrevious:  // a delimiter joins the piece before it
        if (!delimiter && next_is_delimiter) {
          next(span(i, i + 1));
          ++i;
        } else {
          next(runs[i].first);
        }
        break;
      case B::kMergedWithNext:  // a delimiter joins the piece after it
        if (delimiter && next_is_piece) {
          next(span(i, i + 1));
          ++i;
        } else {
          next(runs[i].first);
        }
        break;
      case B::kContiguous: {  // adjacent delimiters make one piece
        size_t j = i;
        while (runs[i].second && j + 1 < runs.size() && runs[j + 1].second) ++j;
        next(span(i, j));
        i = j;
        break;
      }
      case B::kIsolated:
        next(runs[i].first);
        break;
    }
  }
}

void ByteLevelBpe::EncodeSection(std::string_view text, bool prefix_space, std::vector<int>* out,
                                 Cache* cache) const {
  std::string normalized;
  if (!normalizers_.empty() || (prefix_space && !text.empty() && text[0] != ' ')) {
    normalized.assign(text.data(), text.size());
    for (const auto& n : normalizers_) n->Apply(&normalized);
    if (prefix_space && !normalized.empty() && normalized[0] != ' ') normalized.insert(0, " ");
    text = normalized;
  }
  if (text.empty()) return;
  std::vector<pcre2_match_data*> match(steps_.size());
  for (size_t i = 0; i < steps_.size(); ++i) {
    match[i] = pcre2_match_data_create_from_pattern(steps_[i].regex.code, nullptr);
  }
  SplitAndEncode(text, 0, match.data(), out, cache);
  for (pcre2_match_data* m : match) pcre2_match_data_free(m);
}

bool ByteLevelBpe::FindAdded(std::string_view text, size_t from, size_t* at,
                             const AddedToken** token) const {
  for (size_t i = from; i < text.size(); ++i) {
    if (!added_first_byte_[static_cast<unsigned char>(text[i])]) continue;
    for (const AddedToken& a : added_) {  // longest first
      if (text.compare(i, a.content.size(), a.content) != 0) continue;
      if (a.single_word) {
        // Not inside a word: no ASCII letter, digit or '_' on either side.
        auto word = [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || static_cast<unsigned char>(c) >= 0x80;
        };
        const size_t end = i + a.content.size();
        if ((i > 0 && word(text[i - 1])) || (end < text.size() && word(text[end]))) continue;
      }
      *at = i;
      *token = &a;
      return true;
    }
  }
  return false;
}

void ByteLevelBpe::Encode(std::string_view text, std::vector<int>* out, Cache* cache,
                          const EncodeOptions& options) const {
  bool prefix = add_prefix_space_ && options.document_start;
  if (options.specials == Specials::kText || added_.empty()) {
    EncodeSection(text, prefix, out, cache);
    return;
  }
  size_t at = 0, found;
  const AddedToken* token;
  while (at <= text.size()) {
    size_t end = text.size();
    const bool has = FindAdded(text, at, &found, &token);
    if (has) end = found;
    std::string_view section = text.substr(at, end - at);
    // lstrip / rstrip: the token takes the whitespace beside it.
    if (has && token->lstrip) {
      while (!section.empty() && IsSpace(section.back())) section.remove_suffix(1);
    }
    EncodeSection(section, prefix, out, cache);
    if (!has) break;
    out->push_back(token->id);
    prefix = add_prefix_space_;
    at = found + token->content.size();
    if (token->rstrip) {
      while (at < text.size() && IsSpace(text[at])) ++at;
    }
  }
}

std::vector<int> ByteLevelBpe::Encode(std::string_view text, Cache* cache,
                                      const EncodeOptions& options) const {
  std::vector<int> out;
  Encode(text, &out, cache, options);
  return out;
}

absl::StatusOr<std::string> ByteLevelBpe::Decode(absl::Span<const int> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size() || !is_token_[ids[i]]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token ", i, ": id ", ids[i], " is not in the vocabulary [0, ", vocab_size(), ")"));
    }
    out += id_bytes_[ids[i]];
  }
  return out;
}

}  // namespace shardtrain
