// `shardtrain prepare`'s core: text -> llm.c shards. The tokens the data
// loader reads back (data.format: llmc over the shard directory) are
// <|endoftext|> + the one-thread GPT-2 encoding of each document (Llama 3:
// <|begin_of_text|> + its encoding, in uint32 files), whatever the threads
// and chunk cuts; shards split at --shard-tokens; a held-out fraction splits
// at a line start and reassembles the text; errors leave nothing behind.
#include "worker/data/prepare.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/tokenizers.h"
#include "tests/unit/common/gpt2_test_util.h"
#include "worker/data/tokens.h"

#ifndef SHARDTRAIN_FORTUNES_PATH
#error "SHARDTRAIN_FORTUNES_PATH must be defined by CMake"
#endif

namespace shardtrain::data {
namespace {
namespace fs = std::filesystem;

const ByteLevelBpe& Bpe() { return testing::TestGpt2Bpe(); }

// The file's bytes ("" when unreadable: the comparisons then fail).
std::string ReadAll(const fs::path& p) {
  std::string out;
  ReadFile(p.string(), &out).IgnoreError();
  return out;
}

std::vector<uint16_t> Expected(const std::vector<std::string>& docs) {
  std::vector<uint16_t> out;
  for (const std::string& d : docs) {
    out.push_back(kGpt2EndOfText);
    for (int id : Bpe().Encode(d)) out.push_back(static_cast<uint16_t>(id));
  }
  return out;
}

std::string Decode(const std::vector<uint16_t>& tokens) {
  std::vector<int> ids;
  for (uint16_t t : tokens) {
    if (t != kGpt2EndOfText) ids.push_back(t);
  }
  return *Bpe().Decode(ids);
}

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardtrain_prepare_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Write(const std::string& name, const std::string& text) {
    fs::create_directories((dir_ / name).parent_path());
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return (dir_ / name).string();
  }
  std::vector<uint16_t> Load(const std::string& sub) {
    auto t = LoadTokens((dir_ / "out" / sub).string(), TokenFormat::kLlmc, 50257, 1);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? t->narrow() : std::vector<uint16_t>{};
  }
  PrepareOptions Options(std::vector<std::string> inputs) {
    PrepareOptions o;
    o.inputs = std::move(inputs);
    o.out_dir = (dir_ / "out").string();
    return o;
  }
  // No temporary directory left beside the output.
  void ExpectNoLeftovers() {
    for (const auto& e : fs::directory_iterator(dir_)) {
      EXPECT_EQ(e.path().filename().string().find(".partial"), std::string::npos) << e.path();
    }
  }
  fs::path dir_;
};

TEST_F(PrepareTest, FortunesOnTwoThreadsEqualOneThreadsEncoding) {
  const std::string text = ReadAll(SHARDTRAIN_FORTUNES_PATH);
  // Many chunks of 256 KB: the cuts are exercised.
  EXPECT_GE(SafeCuts(text, size_t{256} << 10).size(), 8u);
  PrepareOptions o = Options({SHARDTRAIN_FORTUNES_PATH});
  o.threads = 2;
  int64_t calls = 0, last_done = 0;
  o.progress = [&](const PrepareProgress& p) {
    ++calls;
    EXPECT_GE(p.bytes_done, last_done);
    last_done = p.bytes_done;
    EXPECT_EQ(p.bytes_total, int64_t(text.size()));
  };
  absl::StatusOr<PrepareSummary> s = Prepare(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GE(calls, 1);
  EXPECT_EQ(last_done, int64_t(text.size()));
  const std::vector<uint16_t> want = Expected({text});
  EXPECT_EQ(Load("train"), want);
  EXPECT_EQ(s->train_tokens, int64_t(want.size()));
  EXPECT_EQ(s->documents, 1);
  EXPECT_EQ(s->train_shards.size(), 1u);
  EXPECT_TRUE(s->val_shards.empty());
  EXPECT_FALSE(fs::exists(dir_ / "out" / "val"));
  std::printf("[prepare] fortunes: %lld bytes -> %lld tokens in %.2f s (%.2f MB/s, 2 threads)\n",
              (long long)s->bytes, (long long)s->train_tokens, s->seconds,
              s->bytes / 1e6 / s->seconds);
}

TEST_F(PrepareTest, Llama3WritesUint32ShardsLedByBeginOfText) {
  auto llama3 = LoadTokenizer(TokenizerKind::kLlama3);
  ASSERT_TRUE(llama3.ok()) << llama3.status() << " (scripts/setup installs it)";
  // Fortunes' chunks on two threads (their cuts and the chunks' missing
  // prefix space matter to no pattern), and a document whose special-token
  // text stays text.
  const std::string fortunes = ReadAll(SHARDTRAIN_FORTUNES_PATH);
  const std::string tricky = "Ünïcödé <|begin_of_text|> 日本語 12345\n   spaces\n";
  PrepareOptions o = Options({SHARDTRAIN_FORTUNES_PATH, Write("tricky.txt", tricky)});
  o.tokenizer = TokenizerKind::kLlama3;
  o.threads = 2;
  absl::StatusOr<PrepareSummary> s = Prepare(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->document_token, kLlama3BeginOfText);
  EXPECT_EQ(s->vocab_size, 128256);
  EXPECT_EQ(s->token_bytes, 4);
  auto t = LoadTokens((dir_ / "out" / "train").string(), TokenFormat::kLlmc, 128256, 1);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->wide());
  std::vector<uint32_t> want;
  for (const std::string* doc : {&fortunes, &tricky}) {
    want.push_back(kLlama3BeginOfText);
    for (int id : (*llama3)->Encode(*doc)) want.push_back(uint32_t(id));
  }
  EXPECT_EQ(t->wide_ids(), want);
  EXPECT_EQ(s->train_tokens, int64_t(want.size()));
  std::printf("[prepare] llama3: %lld bytes -> %lld tokens in %.2f s (2 threads)\n",
              (long long)s->bytes, (long long)s->train_tokens, s->seconds);
}

TEST_F(PrepareTest, DirectoriesAreDocumentsInPathOrderAndShardsSplit) {
  Write("in/b.txt", "Second document.\nIt has two lines.\n");
  Write("in/a.txt", "First document, don't you think?\n");
  Write("in/sub/c.md", "Third: 3.14159 \xf0\x9f\x98\x80\n");
  PrepareOptions o = Options({(dir_ / "in").string()});
  o.shard_tokens = 7;
  absl::StatusOr<PrepareSummary> s = Prepare(o);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<uint16_t> want =
      Expected({"First document, don't you think?\n", "Second document.\nIt has two lines.\n",
                "Third: 3.14159 \xf0\x9f\x98\x80\n"});
  EXPECT_EQ(s->documents, 3);
  EXPECT_EQ(Load("train"), want);
  EXPECT_EQ(s->train_shards.size(), (want.size() + 6) / 7);
  for (size_t i = 0; i + 1 < s->train_shards.size(); ++i) {
    auto shard = LoadLlmcTokens(s->train_shards[i], 50257, 0);
    ASSERT_TRUE(shard.ok()) << shard.status();
    EXPECT_EQ(shard->size(), 7u) << s->train_shards[i];
  }
}

TEST_F(PrepareTest, ValFractionSplitsAtALineStartAndReassembles) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "Line " + std::to_string(i) + " of the text.\n";
  const std::string in = Write("one.txt", text);
  PrepareOptions o = Options({in});
  o.val_fraction = 0.1;
  absl::StatusOr<PrepareSummary> s = Prepare(o);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<uint16_t> train = Load("train"), val = Load("val");
  ASSERT_FALSE(val.empty());
  EXPECT_EQ(train.front(), kGpt2EndOfText);
  EXPECT_EQ(val.front(), kGpt2EndOfText);  // the held-out part is its own document
  const std::string a = Decode(train), b = Decode(val);
  EXPECT_EQ(a + b, text);
  EXPECT_EQ(b.rfind("Line ", 0), 0u) << b.substr(0, 40);
  EXPECT_NEAR(double(b.size()) / text.size(), 0.1, 0.02);
  EXPECT_EQ(s->val_tokens, int64_t(val.size()));
}

TEST_F(PrepareTest, ByteTokenizerKeepsTheBytes) {
  const std::string in = Write("bytes.txt", std::string("caf\xc3\xa9\n\x01\xff", 8));
  PrepareOptions o = Options({in});
  o.tokenizer = TokenizerKind::kByte;
  ASSERT_TRUE(Prepare(o).ok());
  EXPECT_EQ(Load("train"), (std::vector<uint16_t>{'c', 'a', 'f', 0xc3, 0xa9, '\n', 1, 0xff}));
}

TEST_F(PrepareTest, ErrorsNameTheInputAndLeaveNothing) {
  const std::string ok = Write("ok.txt", "fine\n");
  PrepareOptions missing = Options({ok, (dir_ / "nope.txt").string()});
  absl::StatusOr<PrepareSummary> s = Prepare(missing);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound) << s.status();
  EXPECT_NE(s.status().message().find("nope.txt"), std::string::npos) << s.status();
  EXPECT_FALSE(fs::exists(dir_ / "out"));
  ExpectNoLeftovers();

  fs::create_directories(dir_ / "out");
  Write("out/keep", "mine");
  s = Prepare(Options({ok}));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kAlreadyExists) << s.status();
  EXPECT_EQ(ReadAll(dir_ / "out" / "keep"), "mine");
  fs::remove_all(dir_ / "out");

  PrepareOptions bad = Options({ok});
  bad.val_fraction = 1.0;
  EXPECT_NE(Prepare(bad).status().message().find("--val-fraction"), std::string::npos);
  bad = Options({ok});
  bad.threads = 0;
  EXPECT_NE(Prepare(bad).status().message().find("--threads"), std::string::npos);
  bad = Options({ok});
  bad.tokenizer_path = (dir_ / "no-vocab").string();
  EXPECT_EQ(Prepare(bad).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(fs::exists(dir_ / "out"));
  ExpectNoLeftovers();
}

}  // namespace
}  // namespace shardtrain::data
