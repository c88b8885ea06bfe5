// The SentencePiece-style parts of ByteLevelBpe (common/bpe.h): reading
// what such a tokenizer.json adds (decoder, byte fallback, unknown token,
// Metaspace) and BPE over characters.
//
// Speed: without a pre-tokenizer (Llama 2's file) a whole section is one
// piece. It is cut into words before each U+2581 (the marker) that no merge
// of the file can join to the character before it (Llama 2's merges join
// only "▁" to a following "▁"), so each word is merged alone, and
// cached, with the ids the piece would have: a merge never crosses a cut,
// and the merges inside one word happen in the same order either way.
#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_replace.h"
#include "common/bpe.h"
#include "common/bpe_internal.h"

namespace shardtrain {
namespace {

using bpe_internal::Bad;
using bpe_internal::BoolField;
using bpe_internal::Json;
using bpe_internal::PairKey;
using bpe_internal::TypeOf;

// The length of the UTF-8 character at s[i]; 1 for a byte that starts none
// (a byte of invalid UTF-8 is a character of its own).
size_t CharLength(std::string_view s, size_t i) {
  const unsigned char c = s[i];
  auto follows = [&](size_t k, unsigned char lo, unsigned char hi) {
    return i + k < s.size() && static_cast<unsigned char>(s[i + k]) >= lo &&
           static_cast<unsigned char>(s[i + k]) <= hi;
  };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return follows(1, 0x80, 0xBF) ? 2 : 1;
  if (c >= 0xE0 && c <= 0xEF) {  // no overlong forms, no surrogates
    const bool whole =
        follows(1, c == 0xE0 ? 0xA0 : 0x80, c == 0xED ? 0x9F : 0xBF) && follows(2, 0x80, 0xBF);
    return whole ? 3 : 1;
  }
  if (c >= 0xF0 && c <= 0xF4) {  // no overlong forms, nothing past U+10FFFF
    const bool whole = follows(1, c == 0xF0 ? 0x90 : 0x80, c == 0xF4 ? 0x8F : 0xBF) &&
                       follows(2, 0x80, 0xBF) && follows(3, 0x80, 0xBF);
    return whole ? 4 : 1;
  }
  return 1;
}

// The last UTF-8 character of s (s not empty).
std::string_view LastChar(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return s.substr(i);
}

// `j` and its field name, or each step of it when it is a Sequence (its
// steps under `key`).
std::vector<std::pair<const Json*, std::string>> Steps(const Json& j, const std::string& name,
                                                       const char* key) {
  std::vector<std::pair<const Json*, std::string>> steps;
  if (TypeOf(j) == "Sequence" && j.contains(key) && j[key].is_array()) {
    for (size_t i = 0; i < j[key].size(); ++i) {
      steps.push_back({&j[key][i], absl::StrCat(name, ".", key, "[", i, "]")});
    }
  } else if (j.is_object()) {
    steps.push_back({&j, name});
  }
  return steps;
}

// Whether root's `name` (or a step of its Sequence) has one of `types`.
bool HasStep(const Json& root, const char* name, const char* key,
             std::initializer_list<const char*> types) {
  auto it = root.find(name);
  if (it == root.end()) return false;
  for (const auto& [step, field] : Steps(*it, name, key)) {
    for (const char* type : types) {
      if (TypeOf(*step) == type) return true;
    }
  }
  return false;
}

}  // namespace

bool ByteLevelBpe::SentencePiece::Describes(const Json& root) {
  auto model = root.find("model");
  if (model != root.end() && model->is_object() && BoolField(*model, "byte_fallback", false)) {
    return true;
  }
  return HasStep(root, "pre_tokenizer", "pretokenizers", {"Metaspace"}) ||
         HasStep(root, "decoder", "decoders", {"Metaspace", "ByteFallback"}) ||
         HasStep(root, "normalizer", "normalizers", {"Prepend"});
}

absl::Status ByteLevelBpe::SentencePiece::ReadDecoder(const Json& root, const std::string& path) {
  // The marker: Metaspace's replacement where the file has one (read again,
  // and checked, by AddMetaspace).
  if (auto pre = root.find("pre_tokenizer"); pre != root.end()) {
    for (const auto& [step, field] : Steps(*pre, "pre_tokenizer", "pretokenizers")) {
      auto r = step->find("replacement");
      if (TypeOf(*step) == "Metaspace" && r != step->end() && r->is_string() &&
          !r->get<std::string>().empty()) {
        marker = r->get<std::string>();
      }
    }
  }
  auto it = root.find("decoder");
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  bool fused = false;
  for (const auto& [step, field] : Steps(*it, "decoder", "decoders")) {
    const Json& j = *step;
    const std::string type = TypeOf(j);
    auto text = [&](const char* key, std::string* out) {
      auto v = j.find(key);
      if (v == j.end() || !v->is_string() || v->get<std::string>().empty()) return false;
      *out = v->get<std::string>();
      return true;
    };
    if (type == "Replace") {
      DecodeStep d;
      auto p = j.find("pattern");
      if (p == j.end() || !p->is_object() || !p->contains("String") ||
          !(*p)["String"].is_string() || (*p)["String"].get<std::string>().empty()) {
        return Bad(path, field + ".pattern", "expected {\"String\": non-empty string}");
      }
      d.pattern = (*p)["String"].get<std::string>();
      auto c = j.find("content");
      if (c == j.end() || !c->is_string()) return Bad(path, field + ".content", "not a string");
      d.content = c->get<std::string>();
      decode_steps.push_back(std::move(d));
    } else if (type == "ByteFallback") {
      DecodeStep d;
      d.byte_fallback = true;
      decode_steps.push_back(std::move(d));
    } else if (type == "Fuse") {
      fused = true;
    } else if (type == "Strip" || type == "Metaspace") {
      if (!strip_content.empty()) return Bad(path, field, "a second Strip is not supported");
      if (type == "Strip") {
        if (!fused) return Bad(path, field, "Strip before Fuse (on each token) is not supported");
        auto start = j.find("start"), stop = j.find("stop");
        if (!text("content", &strip_content) || start == j.end() || !start->is_number_unsigned() ||
            stop == j.end() || !stop->is_number_unsigned()) {
          return Bad(path, field, "Strip needs a content and start, stop counts >= 0");
        }
        strip_start = start->get<int>();
        strip_stop = stop->get<int>();
        continue;
      }
      // Metaspace: the replacement is a space again, the prepended one
      // (none with prepend_scheme "never" or add_prefix_space false)
      // stripped.
      DecodeStep d;
      if (!text("replacement", &d.pattern)) {
        return Bad(path, field + ".replacement", "a non-empty string is needed");
      }
      d.content = " ";
      decode_steps.push_back(std::move(d));
      auto scheme = j.find("prepend_scheme");
      const bool prepends = scheme != j.end() && scheme->is_string()
                                ? scheme->get<std::string>() != "never"
                                : BoolField(j, "add_prefix_space", true);
      if (prepends) {
        strip_content = " ";
        strip_start = 1;
      }
    } else {
      return Bad(path, field,
                 absl::StrCat("type \"", type,
                              "\" is not supported (Replace, ByteFallback, Fuse, Strip, "
                              "Metaspace, Sequence)"));
    }
  }
  return absl::OkStatus();
}

std::string ByteLevelBpe::SentencePiece::Decoded(const std::string& piece) const {
  std::string text = piece;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (const DecodeStep& d : decode_steps) {
    if (!d.byte_fallback) {
      absl::StrReplaceAll({{d.pattern, d.content}}, &text);
    } else if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>' &&
               hex(text[3]) >= 0 && hex(text[4]) >= 0) {
      text = std::string(1, char(hex(text[3]) * 16 + hex(text[4])));
    }
  }
  return text;
}

absl::Status ByteLevelBpe::SentencePiece::ReadModel(const Json& model, const std::string& path,
                                                    ByteLevelBpe* bpe) {
  byte_fallback = BoolField(model, "byte_fallback", false);
  fuse_unk = BoolField(model, "fuse_unk", false);
  std::string missing;  // the first byte token the vocabulary lacks
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto it = bpe->ids_.find(name);
    bpe->byte_id_[b] = it == bpe->ids_.end() ? -1 : it->second;
    if (it == bpe->ids_.end() && missing.empty()) missing = name;
  }
  if (auto u = model.find("unk_token"); u != model.end() && u->is_string()) {
    unk_piece = u->get<std::string>();
    auto it = bpe->ids_.find(unk_piece);
    if (it == bpe->ids_.end()) {
      return Bad(path, "model.unk_token",
                 absl::StrCat("\"", unk_piece, "\" is not in model.vocab"));
    }
    unk_id = it->second;
  }
  if (unk_id < 0 && (!byte_fallback || !missing.empty())) {
    return Bad(path, "model.unk_token",
               byte_fallback ? absl::StrCat("none, and byte fallback has no token ", missing)
                             : "none, and no byte_fallback: a character outside the vocabulary "
                               "would have no token");
  }
  marker_is_token = bpe->ids_.contains(marker);
  return absl::OkStatus();
}

void ByteLevelBpe::SentencePiece::NoteMerge(absl::string_view a, absl::string_view b) {
  if (a.empty() || b.substr(0, marker.size()) != marker) return;
  const std::string_view last = LastChar(std::string_view(a.data(), a.size()));
  joined_before_marker.emplace(last);
  if (last == ">" || (!unk_piece.empty() && last == LastChar(unk_piece))) joins_fallback = true;
}

bool ByteLevelBpe::SentencePiece::CutsBefore(std::string_view previous,
                                             bool previous_is_token) const {
  if (!marker_is_token) return false;
  if (!previous_is_token) return !joins_fallback;  // a byte token or the unknown token
  return !joined_before_marker.contains(absl::string_view(previous.data(), previous.size()));
}

absl::Status ByteLevelBpe::SentencePiece::AddMetaspace(const Json& j, const std::string& path,
                                                       const std::string& field,
                                                       ByteLevelBpe* bpe) {
  auto r = j.find("replacement");
  if (r == j.end() || !r->is_string() || r->get<std::string>().empty()) {
    return Bad(path, field + ".replacement", "a non-empty string is needed");
  }
  const std::string replacement = r->get<std::string>();
  // prepend_scheme, else the older add_prefix_space (true: "always").
  std::string scheme = BoolField(j, "add_prefix_space", true) ? "always" : "never";
  if (auto p = j.find("prepend_scheme"); p != j.end() && p->is_string()) {
    scheme = p->get<std::string>();
  }
  if (scheme != "always" && scheme != "first" && scheme != "never") {
    return Bad(path, field + ".prepend_scheme",
               absl::StrCat("\"", scheme, "\": expected always, first or never"));
  }
  auto replace = std::make_unique<Normalizer>();
  replace->kind = Normalizer::Kind::kReplace;
  if (absl::Status s = replace->pattern.Compile(" ", true, path + ": " + field); !s.ok()) return s;
  replace->content = replacement;
  bpe->normalizers_.push_back(std::move(replace));
  if (scheme != "never") {
    auto prepend = std::make_unique<Normalizer>();
    prepend->kind = Normalizer::Kind::kPrepend;
    prepend->content = replacement;
    prepend->first_only = scheme == "first";
    prepend->unless_present = true;
    bpe->normalizers_.push_back(std::move(prepend));
  }
  if (BoolField(j, "split", true)) {  // each replacement starts a piece
    Step step;
    if (absl::Status s = step.regex.Compile(replacement, true, path + ": " + field); !s.ok()) {
      return s;
    }
    step.behavior = Step::Behavior::kMergedWithNext;
    bpe->steps_.push_back(std::move(step));
  }
  marker = replacement;
  marker_is_token = bpe->ids_.contains(marker);
  return absl::OkStatus();
}

void ByteLevelBpe::SentencePiece::Strip(std::string* text) const {
  if (strip_content.empty()) return;
  const size_t n = strip_content.size();
  for (int i = 0; i < strip_start && text->compare(0, n, strip_content) == 0; ++i) {
    text->erase(0, n);
  }
  auto ends_with_it = [&] {
    return text->size() >= n && text->compare(text->size() - n, n, strip_content) == 0;
  };
  for (int i = 0; i < strip_stop && ends_with_it(); ++i) text->resize(text->size() - n);
}

void ByteLevelBpe::SentencePiece::EncodeWord(const ByteLevelBpe& bpe, std::string_view word,
                                             std::vector<int>* ids) const {
  // The characters' symbols, a doubly linked list in place.
  struct Symbol {
    int id, prev, next;
    bool merged_away;
  };
  std::vector<Symbol> symbols;
  auto add = [&](int id) {
    const int at = int(symbols.size());
    symbols.push_back({id, at - 1, -1, false});
    if (at > 0) symbols[at - 1].next = at;
  };
  bool unknown_run = false;
  for (size_t i = 0; i < word.size();) {
    const size_t n = CharLength(word, i);
    const std::string_view c = word.substr(i, n);
    i += n;
    if (auto it = bpe.ids_.find(absl::string_view(c.data(), c.size())); it != bpe.ids_.end()) {
      add(it->second);
      unknown_run = false;
      continue;
    }
    if (byte_fallback && std::all_of(c.begin(), c.end(), [&](char b) {
          return bpe.byte_id_[static_cast<unsigned char>(b)] >= 0;
        })) {
      for (char b : c) add(bpe.byte_id_[static_cast<unsigned char>(b)]);
      unknown_run = false;
      continue;
    }
    if (!(fuse_unk && unknown_run)) add(unk_id);
    unknown_run = true;
  }
  // Merge the lowest-ranked adjacent pair, the leftmost of equals, until no
  // pair has a rank (Hugging Face's order), from a heap of candidate merges
  // (rank, left symbol, the id it makes); one that no longer matches its
  // pair is dropped when it comes up.
  struct Candidate {
    int rank, pos, id;
  };
  auto later = [](const Candidate& x, const Candidate& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  std::vector<Candidate> heap;
  auto consider = [&](int pos) {
    auto it = bpe.merges_.find(PairKey(symbols[pos].id, symbols[symbols[pos].next].id));
    if (it == bpe.merges_.end()) return;
    heap.push_back({it->second.rank, pos, it->second.id});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int i = 0; i + 1 < int(symbols.size()); ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = symbols[c.pos];
    if (left.merged_away || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    auto it = bpe.merges_.find(PairKey(left.id, right.id));
    if (it == bpe.merges_.end() || it->second.rank != c.rank || it->second.id != c.id) continue;
    left.id = c.id;
    left.next = right.next;
    right.merged_away = true;
    if (left.next >= 0) symbols[left.next].prev = c.pos;
    if (left.prev >= 0) consider(left.prev);
    if (left.next >= 0) consider(c.pos);
  }
  for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

void ByteLevelBpe::EncodeCharacters(std::string_view piece, std::vector<int>* out,
                                    Cache* cache) const {
  if (piece.empty()) return;
  if (ignore_merges_) {  // a piece that is a token is that token
    auto it = ids_.find(absl::string_view(piece.data(), piece.size()));
    if (it != ids_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  auto encode_word = [&](std::string_view word) {
    if (cache != nullptr) {
      auto it = cache->pieces.find(absl::string_view(word.data(), word.size()));
      if (it != cache->pieces.end()) {
        out->insert(out->end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int> ids;
    sp_->EncodeWord(*this, word, &ids);
    out->insert(out->end(), ids.begin(), ids.end());
    if (cache == nullptr) return;
    if (cache->pieces.size() >= Cache::kMaxCacheEntries) cache->pieces.clear();
    cache->pieces.emplace(std::string(word), std::move(ids));
  };
  // Words: cut before each marker that no merge joins to what precedes it.
  const std::string& marker = sp_->marker;
  size_t word = 0, previous = 0;
  for (size_t i = 0; i < piece.size(); i += CharLength(piece, i)) {
    if (i > word && piece.compare(i, marker.size(), marker) == 0) {
      const std::string_view before = piece.substr(previous, i - previous);
      if (sp_->CutsBefore(before, ids_.contains(absl::string_view(before.data(), before.size())))) {
        encode_word(piece.substr(word, i - word));
        word = i;
      }
    }
    previous = i;
  }
  encode_word(piece.substr(word));
}

}  // namespace shardtrain
