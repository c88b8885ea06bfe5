// ByteLevelBpe's encoding and decoding (common/bpe.h); its loaders are
// bpe_load.cc's, the SentencePiece-style parts bpe_sentencepiece.cc's.
#include "common/bpe.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/bpe_internal.h"

namespace shardtrain {
namespace {

using bpe_internal::PairKey;

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

}  // namespace

ByteLevelBpe::ByteLevelBpe() = default;
ByteLevelBpe::~ByteLevelBpe() = default;

int ByteLevelBpe::TokenId(std::string_view token) const {
  for (const AddedToken& a : added_) {
    if (a.content == token) return a.id;
  }
  auto it = ids_.find(absl::string_view(token.data(), token.size()));
  return it == ids_.end() ? -1 : it->second;
}

void ByteLevelBpe::EncodePiece(std::string_view piece, std::vector<int>* out, Cache* cache) const {
  if (sp_ != nullptr) {
    EncodeCharacters(piece, out, cache);
    return;
  }
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

void ByteLevelBpe::EncodeSection(std::string_view text, Section where, std::vector<int>* out,
                                 Cache* cache) const {
  const bool prefix_space = add_prefix_space_ && where != Section::kContinued;
  std::string normalized;
  if (!normalizers_.empty() || (prefix_space && !text.empty() && text[0] != ' ')) {
    normalized.assign(text.data(), text.size());
    for (const auto& n : normalizers_) {
      if (n->kind != Normalizer::Kind::kPrepend) {
        n->Apply(&normalized);
      } else if (n->Prepends(normalized, where)) {
        normalized.insert(0, n->content);
      }
    }
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
  Section where = options.document_start ? Section::kDocumentStart : Section::kContinued;
  if (options.specials == Specials::kText || added_.empty()) {
    EncodeSection(text, where, out, cache);
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
    EncodeSection(section, where, out, cache);
    if (!has) break;
    out->push_back(token->id);
    where = Section::kAfterAdded;
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
  if (sp_ != nullptr) sp_->Strip(&out);
  return out;
}

}  // namespace shardtrain
