// ByteLevelBpe's loaders (common/bpe.h): GPT-2's two files and Hugging
// Face's tokenizer.json, byte-level or SentencePiece-style
// (bpe_sentencepiece.cc).
#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "common/bpe.h"
#include "common/bpe_internal.h"

namespace shardtrain {
namespace {

using bpe_internal::Bad;
using bpe_internal::BoolField;
using bpe_internal::Json;
using bpe_internal::PairKey;
using bpe_internal::TypeOf;

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

}  // namespace

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
               absl::StrCat("\"", model_type,
                            "\": only BPE models (byte-level or SentencePiece-style) are "
                            "supported"));
  }
  if (SentencePiece::Describes(root)) {
    bpe->sp_ = std::make_unique<SentencePiece>();
    if (absl::Status s = bpe->sp_->ReadDecoder(root, path); !s.ok()) return s;
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
    if (bpe->sp_ != nullptr) {
      bytes = bpe->sp_->Decoded(it.key());
    } else if (!TokenBytes(it.key(), cp_to_byte, &bytes)) {
      return Bad(path, "model.vocab",
                 absl::StrCat("token ", id, " (\"", it.key(),
                              "\") has a character outside GPT-2's byte table: not a byte-level "
                              "BPE vocabulary"));
    }
    bpe->is_token_[id] = true;
    bpe->id_bytes_[id] = bytes;
    bpe->ids_[bpe->sp_ != nullptr ? it.key() : bytes] = id;
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
  if (absl::Status s =
          bpe->sp_ != nullptr ? bpe->sp_->ReadModel(model, path, bpe.get()) : bpe->CheckBytes(path);
      !s.ok()) {
    return s;
  }

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
    if (bpe->sp_ != nullptr) bpe->sp_->NoteMerge(a, b);
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
    } else if (type == "Prepend") {
      n->kind = Normalizer::Kind::kPrepend;
      auto p = j->find("prepend");
      if (p == j->end() || !p->is_string() || p->get<std::string>().empty()) {
        return Bad(path, field + ".prepend", "Prepend needs a non-empty string");
      }
      n->content = p->get<std::string>();
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
      return Bad(
          path, field,
          absl::StrCat("type \"", type,
                       "\" is not supported (NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, "
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
    if (type == "ByteLevel" && bpe->sp_ != nullptr) {
      return Bad(path, field,
                 "ByteLevel in a SentencePiece-style file (byte_fallback, Metaspace, ByteFallback "
                 "or Prepend) is not supported");
    } else if (type == "Metaspace" && bpe->sp_ != nullptr) {
      if (i > 0) return Bad(path, field, "Metaspace after another pre-tokenizer is not supported");
      if (absl::Status s = bpe->sp_->AddMetaspace(j, path, field, bpe.get()); !s.ok()) return s;
    } else if (type == "ByteLevel") {
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
      return Bad(
          path, field,
          absl::StrCat("type \"", type,
                       "\" is not supported (Split, ByteLevel, Digits, Metaspace, Sequence)"));
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

}  // namespace shardtrain
