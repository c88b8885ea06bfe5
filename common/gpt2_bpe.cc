#include "common/gpt2_bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace shardtrain {
namespace {

// GPT-2's pre-tokenisation pattern (encoder.py), verbatim.
constexpr char kPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xC0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(char(0xE0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  }
}

// GPT-2's bytes_to_unicode(): printable bytes stand for themselves, the
// other 68 take the code points 256, 257, ... in byte order.
std::vector<uint32_t> ByteToCodePoint() {
  std::vector<uint32_t> cp(256, 0);
  std::vector<bool> printable(256, false);
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) cp[b] = printable[b] ? uint32_t(b) : next++;
  return cp;
}

// The code points of UTF-8 `s` (the vocabulary's strings are valid UTF-8
// of code points below 0x800 and printable ASCII); false when malformed.
bool DecodeUtf8(const std::string& s, std::vector<uint32_t>* out) {
  out->clear();
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      out->push_back(c);
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size()) {
      out->push_back(((c & 0x1F) << 6) | (s[i + 1] & 0x3F));
      i += 2;
    } else if ((c & 0xF0) == 0xE0 && i + 2 < s.size()) {
      out->push_back(((c & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F));
      i += 3;
    } else {
      return false;
    }
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

}  // namespace

struct Gpt2Bpe::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

Gpt2Bpe::Gpt2Bpe() : regex_(std::make_unique<Regex>()) {}
Gpt2Bpe::~Gpt2Bpe() = default;

absl::StatusOr<std::unique_ptr<Gpt2Bpe>> Gpt2Bpe::Load(const std::string& vocab_path,
                                                       const std::string& merges_path) {
  std::unique_ptr<Gpt2Bpe> bpe(new Gpt2Bpe());
  int error = 0;
  PCRE2_SIZE error_at = 0;
  bpe->regex_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &error_at, nullptr);
  if (bpe->regex_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InternalError(absl::StrCat("GPT-2 pattern: ", reinterpret_cast<char*>(message)));
  }
  pcre2_jit_compile(bpe->regex_->code, PCRE2_JIT_COMPLETE);  // the interpreter without JIT

  // The vocabulary: token (GPT-2 unicode) -> id; each id's bytes.
  absl::StatusOr<std::string> text = ReadFile(vocab_path);
  if (!text.ok()) return text.status();
  nlohmann::json vocab = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!vocab.is_object() || vocab.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(vocab_path, ": not a JSON object of token -> id"));
  }
  std::vector<uint32_t> to_cp = ByteToCodePoint();
  std::vector<int> cp_to_byte(512, -1);
  for (int b = 0; b < 256; ++b) cp_to_byte[to_cp[b]] = b;
  bpe->id_bytes_.assign(vocab.size(), std::string());
  std::vector<bool> seen(vocab.size(), false);
  std::vector<uint32_t> cps;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= int64_t(vocab.size()) || seen[it.value().get<int64_t>()]) {
      return absl::InvalidArgumentError(
          absl::StrCat(vocab_path, ": token \"", it.key(), "\": id ", it.value().dump(),
                       " is not a distinct integer in [0, ", vocab.size(), ")"));
    }
    const int id = it.value().get<int>();
    seen[id] = true;
    if (!DecodeUtf8(it.key(), &cps)) {
      return absl::InvalidArgumentError(
          absl::StrCat(vocab_path, ": token ", id, " is not valid UTF-8"));
    }
    std::string bytes;
    for (uint32_t cp : cps) {
      if (cp >= cp_to_byte.size() || cp_to_byte[cp] < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            vocab_path, ": token ", id, " has code point ", cp, " outside GPT-2's byte table"));
      }
      bytes.push_back(char(cp_to_byte[cp]));
    }
    bpe->id_bytes_[id] = std::move(bytes);
    bpe->ids_[it.key()] = id;
  }
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    AppendUtf8(to_cp[b], &symbol);
    auto it = bpe->ids_.find(symbol);
    if (it == bpe->ids_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(vocab_path, ": no token for byte ", b, " (\"", symbol, "\")"));
    }
    bpe->byte_id_[b] = it->second;
  }

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
    auto ia = bpe->ids_.find(a), ib = bpe->ids_.find(b), iab = bpe->ids_.find(a + b);
    if (ia == bpe->ids_.end() || ib == bpe->ids_.end() || iab == bpe->ids_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          merges_path, ":", line_no, ": \"", line,
          "\": ", iab == bpe->ids_.end() ? "its merge" : "a part", " is not in ", vocab_path));
    }
    bpe->merges_.try_emplace(PairKey(ia->second, ib->second), Merge{rank++, iab->second});
  }
  return bpe;
}

namespace {

// The vocabulary files in `dir`, or NOT_FOUND naming it.
absl::StatusOr<Gpt2VocabularyFiles> FilesIn(const std::string& dir) {
  namespace fs = std::filesystem;
  for (const auto& [vocab, merges] :
       {std::pair<const char*, const char*>{"encoder.json", "vocab.bpe"},
        {"vocab.json", "merges.txt"}}) {
    const fs::path v = fs::path(dir) / vocab, m = fs::path(dir) / merges;
    if (fs::exists(v) && fs::exists(m)) return Gpt2VocabularyFiles{v.string(), m.string()};
  }
  return absl::NotFoundError(absl::StrCat(
      dir, ": neither encoder.json + vocab.bpe nor vocab.json + merges.txt (GPT-2's vocabulary)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Gpt2Bpe>> Gpt2Bpe::LoadDir(const std::string& dir) {
  absl::StatusOr<Gpt2VocabularyFiles> files = FilesIn(dir);
  if (!files.ok()) return files.status();
  return Load(files->vocab, files->merges);
}

absl::StatusOr<Gpt2VocabularyFiles> FindGpt2Vocabulary(const std::string& dir) {
  if (!dir.empty()) return FilesIn(dir);
  if (const char* env = std::getenv("SHARDTRAIN_GPT2_VOCAB"); env != nullptr && *env != '\0') {
    absl::StatusOr<Gpt2VocabularyFiles> f = FilesIn(env);
    if (!f.ok()) {
      return absl::Status(f.status().code(),
                          absl::StrCat("$SHARDTRAIN_GPT2_VOCAB: ", f.status().message()));
    }
    return f;
  }
  std::vector<std::string> tried;
  for (const char* d : {SHARDTRAIN_GPT2_VOCAB_BUILD_DIR, "/usr/share/shardtrain/gpt2"}) {
    absl::StatusOr<Gpt2VocabularyFiles> f = FilesIn(d);
    if (f.ok()) return f;
    tried.push_back(d);
  }
  return absl::NotFoundError(absl::StrCat(
      "GPT-2's vocabulary (encoder.json + vocab.bpe, or vocab.json + merges.txt) is in none of ",
      absl::StrJoin(tried, ", "),
      "; scripts/setup installs it, or point --vocab or $SHARDTRAIN_GPT2_VOCAB at a folder "
      "holding it"));
}

absl::StatusOr<std::unique_ptr<Gpt2Bpe>> LoadGpt2Vocabulary(const std::string& dir) {
  absl::StatusOr<Gpt2VocabularyFiles> files = FindGpt2Vocabulary(dir);
  if (!files.ok()) return files.status();
  return Gpt2Bpe::Load(files->vocab, files->merges);
}

void Gpt2Bpe::EncodePiece(std::string_view piece, std::vector<int>* out, Cache* cache) const {
  if (cache != nullptr) {
    auto it = cache->pieces.find(absl::string_view(piece.data(), piece.size()));
    if (it != cache->pieces.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int> word(piece.size());
  for (size_t i = 0; i < piece.size(); ++i)
    word[i] = byte_id_[static_cast<unsigned char>(piece[i])];
  // encoder.py's bpe(): merge every occurrence of the lowest-ranked pair,
  // left to right, until no pair has a rank.
  std::vector<int> merged;
  while (word.size() > 1) {
    int best_rank = std::numeric_limits<int>::max(), first = -1, second = -1, made = -1;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = merges_.find(PairKey(word[i], word[i + 1]));
      if (it != merges_.end() && it->second.rank < best_rank) {
        best_rank = it->second.rank;
        first = word[i];
        second = word[i + 1];
        made = it->second.id;
      }
    }
    if (made < 0) break;
    merged.clear();
    for (size_t i = 0; i < word.size(); ++i) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(made);
        ++i;
      } else {
        merged.push_back(word[i]);
      }
    }
    word.swap(merged);
  }
  out->insert(out->end(), word.begin(), word.end());
  if (cache != nullptr) {
    if (cache->pieces.size() >= Cache::kMaxCacheEntries) cache->pieces.clear();
    cache->pieces.emplace(std::string(piece), std::move(word));
  }
}

void Gpt2Bpe::Encode(std::string_view text, std::vector<int>* out, Cache* cache) const {
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(regex_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t at = 0;
  while (at < text.size()) {
    int rc = pcre2_match(regex_->code, subject, text.size(), at, 0, match, nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {  // e.g. the JIT's stack: the interpreter
      rc = pcre2_match(regex_->code, subject, text.size(), at, PCRE2_NO_JIT, match, nullptr);
    }
    size_t begin = text.size(), end = text.size();
    if (rc >= 0) {
      const PCRE2_SIZE* v = pcre2_get_ovector_pointer(match);
      begin = v[0];
      end = v[1];
    }
    // Bytes before the match are invalid UTF-8 (or the matcher gave up):
    // one piece of raw bytes, so every input encodes and decodes back.
    if (begin > at) EncodePiece(text.substr(at, begin - at), out, cache);
    if (end > begin) EncodePiece(text.substr(begin, end - begin), out, cache);
    at = end > at ? end : text.size();
  }
  pcre2_match_data_free(match);
}

std::vector<int> Gpt2Bpe::Encode(std::string_view text, Cache* cache) const {
  std::vector<int> out;
  Encode(text, &out, cache);
  return out;
}

absl::StatusOr<std::string> Gpt2Bpe::Decode(absl::Span<const int> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token ", i, ": id ", ids[i], " is outside GPT-2's vocabulary [0, ", vocab_size(), ")"));
    }
    out += id_bytes_[ids[i]];
  }
  return out;
}

}  // namespace shardtrain
