// Token readers (byte text, llm.c .bin), their errors, and the sampler's
// world-size independence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "worker/data/sampler.h"
#include "worker/data/tokens.h"

namespace shardtrain::data {
namespace {
namespace fs = std::filesystem;

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("shardtrain_data_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Write(const std::string& name, const std::string& bytes) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }
  std::string RawLlmc(const std::string& name, int32_t magic, int32_t version, int32_t count,
                      const std::vector<uint16_t>& tokens) {
    std::string bytes(256 * 4, '\0');
    int32_t h[3] = {magic, version, count};
    std::memcpy(bytes.data(), h, sizeof h);
    bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
    return Write(name, bytes);
  }
  fs::path dir_;
};

void ExpectErrorNames(const absl::Status& s, absl::StatusCode code, const std::string& path,
                      const std::string& what) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
  EXPECT_NE(s.message().find(what), std::string::npos) << s;
}

TEST_F(DataTest, TextFileIsBytes) {
  const std::string p = Write("a.txt", "hi\xff");
  auto t = LoadTokens(p, TokenFormat::kText, 256, 2);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, (std::vector<uint16_t>{'h', 'i', 255}));
  EXPECT_EQ(DecodeBytes(EncodeBytes("hello")), "hello");
}

TEST_F(DataTest, TextDirectoryConcatenatesTxtInSortedOrder) {
  fs::create_directories(dir_ / "corpus");
  Write("corpus/b.txt", "BB");
  Write("corpus/a.txt", "A");
  Write("corpus/c.md", "ignored");
  auto t = LoadTextTokens((dir_ / "corpus").string(), 1);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, (std::vector<uint16_t>{'A', 'B', 'B'}));
}

TEST_F(DataTest, TextErrorsNameTheFile) {
  const std::string missing = (dir_ / "nope.txt").string();
  ExpectErrorNames(LoadTextTokens(missing, 2).status(), absl::StatusCode::kNotFound, missing,
                   "does not exist");
  const std::string empty = Write("empty.txt", "");
  ExpectErrorNames(LoadTextTokens(empty, 2).status(), absl::StatusCode::kInvalidArgument, empty,
                   "empty");
  const std::string shortf = Write("short.txt", "abc");
  ExpectErrorNames(LoadTextTokens(shortf, 65).status(), absl::StatusCode::kInvalidArgument, shortf,
                   "too short");
  fs::create_directories(dir_ / "nothing");
  const std::string nothing = (dir_ / "nothing").string();
  ExpectErrorNames(LoadTextTokens(nothing, 1).status(), absl::StatusCode::kNotFound, nothing,
                   "no .txt files");
  ExpectErrorNames(LoadTokens(shortf, TokenFormat::kText, 100, 1).status(),
                   absl::StatusCode::kInvalidArgument, shortf, "vocab");
}

TEST_F(DataTest, LlmcRoundTrip) {
  const std::vector<uint16_t> tokens = {0, 5, 50256, 7, 1};
  const std::string p = (dir_ / "tok.bin").string();
  ASSERT_TRUE(WriteLlmcTokens(p, tokens).ok());
  auto t = LoadTokens(p, TokenFormat::kLlmc, 50257, 5);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, tokens);
  // Trailing bytes beyond the header's count are ignored.
  const std::string extra = RawLlmc("extra.bin", kLlmcMagic, 1, 2, {3, 4, 5});
  auto e = LoadLlmcTokens(extra, 10, 2);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(*e, (std::vector<uint16_t>{3, 4}));
}

// A directory of shards (what `shardtrain prepare` writes): its .bin files in
// name order, other files ignored; the length check is over them all.
TEST_F(DataTest, LlmcDirectoryConcatenatesBinShardsInSortedOrder) {
  fs::create_directories(dir_ / "shards");
  ASSERT_TRUE(
      WriteLlmcTokens((dir_ / "shards/000001.bin").string(), std::vector<uint16_t>{3, 4}).ok());
  ASSERT_TRUE(
      WriteLlmcTokens((dir_ / "shards/000000.bin").string(), std::vector<uint16_t>{1, 2}).ok());
  Write("shards/README", "not a shard");
  const std::string shards = (dir_ / "shards").string();
  auto t = LoadLlmcTokens(shards, 10, 4);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, (std::vector<uint16_t>{1, 2, 3, 4}));
  ExpectErrorNames(LoadLlmcTokens(shards, 10, 5).status(), absl::StatusCode::kInvalidArgument,
                   shards, "too short: 4 tokens");
  const std::string bad = RawLlmc("shards/000002.bin", kLlmcMagic, 1, 1, {11});
  ExpectErrorNames(LoadLlmcTokens(shards, 10, 1).status(), absl::StatusCode::kInvalidArgument, bad,
                   ">= model.vocab");
  fs::create_directories(dir_ / "empty");
  ExpectErrorNames(LoadLlmcTokens((dir_ / "empty").string(), 10, 1).status(),
                   absl::StatusCode::kNotFound, (dir_ / "empty").string(), "no .bin files");
}

// llm.c's uint32 format (magic 20240801, version 7): Llama 3's ids past
// 65535 round-trip; uint16 files stay 2 bytes a token in memory; a
// directory of both widens.
TEST_F(DataTest, WideLlmcTokensRoundTripAndMix) {
  const TokenIds wide(std::vector<uint32_t>{128000, 9906, 65535, 65536, 128255});
  const std::string p = (dir_ / "wide.bin").string();
  ASSERT_TRUE(WriteLlmcTokens(p, wide).ok());
  EXPECT_EQ(fs::file_size(p), 256 * 4 + 5 * 4u);
  int32_t header[3];
  std::ifstream(p, std::ios::binary).read(reinterpret_cast<char*>(header), sizeof header);
  EXPECT_EQ(header[0], 20240801);
  EXPECT_EQ(header[1], 7);
  EXPECT_EQ(header[2], 5);
  auto t = LoadLlmcTokens(p, 128256, 2);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->wide());
  EXPECT_EQ(*t, wide);
  ExpectErrorNames(LoadLlmcTokens(p, 128000, 2).status(), absl::StatusCode::kInvalidArgument, p,
                   "token 128000 at index 0 is >= model.vocab 128000");

  const std::string narrow = (dir_ / "narrow.bin").string();
  ASSERT_TRUE(WriteLlmcTokens(narrow, std::vector<uint16_t>{1, 2, 3}).ok());
  auto n = LoadLlmcTokens(narrow, 256, 2);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_FALSE(n->wide());
  EXPECT_EQ(fs::file_size(narrow), 256 * 4 + 3 * 2u);

  fs::create_directories(dir_ / "mixed");
  fs::copy_file(narrow, dir_ / "mixed" / "000000.bin");
  fs::copy_file(p, dir_ / "mixed" / "000001.bin");
  auto m = LoadLlmcTokens((dir_ / "mixed").string(), 128256, 2);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->wide());
  EXPECT_EQ(*m, TokenIds(std::vector<uint32_t>{1, 2, 3, 128000, 9906, 65535, 65536, 128255}));

  // The sampler's windows carry the wide ids.
  auto sampler = EvalSampler::Create(&*m, 1, 7);
  ASSERT_TRUE(sampler.ok()) << sampler.status();
  int in[7], tg[7];
  ASSERT_TRUE(sampler->Fill(0, 1, in, tg).ok());
  EXPECT_EQ(in[6], 65536);
  EXPECT_EQ(tg[6], 128255);

  const std::string version = RawLlmc("v1wide.bin", 20240801, 1, 1, {1, 0});
  ExpectErrorNames(LoadLlmcTokens(version, 256, 1).status(), absl::StatusCode::kDataLoss, version,
                   "unsupported version 1 (expected 7 with magic 20240801)");
}

TEST_F(DataTest, LlmcErrorsNameTheFile) {
  const std::string missing = (dir_ / "missing.bin").string();
  ExpectErrorNames(LoadLlmcTokens(missing, 256, 2).status(), absl::StatusCode::kNotFound, missing,
                   "does not exist");
  const std::string tiny = Write("tiny.bin", "xyz");
  ExpectErrorNames(LoadLlmcTokens(tiny, 256, 2).status(), absl::StatusCode::kDataLoss, tiny,
                   "truncated");
  const std::string magic = RawLlmc("magic.bin", 12345, 1, 3, {1, 2, 3});
  ExpectErrorNames(LoadLlmcTokens(magic, 256, 2).status(), absl::StatusCode::kDataLoss, magic,
                   "wrong magic");
  const std::string version = RawLlmc("version.bin", kLlmcMagic, 2, 3, {1, 2, 3});
  ExpectErrorNames(LoadLlmcTokens(version, 256, 2).status(), absl::StatusCode::kDataLoss, version,
                   "version");
  const std::string trunc = RawLlmc("trunc.bin", kLlmcMagic, 1, 10, {1, 2, 3});
  ExpectErrorNames(LoadLlmcTokens(trunc, 256, 2).status(), absl::StatusCode::kDataLoss, trunc,
                   "header says 10 tokens but the file holds 3");
  const std::string empty = RawLlmc("empty.bin", kLlmcMagic, 1, 0, {});
  ExpectErrorNames(LoadLlmcTokens(empty, 256, 2).status(), absl::StatusCode::kInvalidArgument,
                   empty, "empty");
  const std::string shortf = RawLlmc("short.bin", kLlmcMagic, 1, 3, {1, 2, 3});
  ExpectErrorNames(LoadLlmcTokens(shortf, 256, 65).status(), absl::StatusCode::kInvalidArgument,
                   shortf, "too short");
  const std::string big = RawLlmc("big.bin", kLlmcMagic, 1, 3, {1, 300, 3});
  ExpectErrorNames(LoadLlmcTokens(big, 256, 2).status(), absl::StatusCode::kInvalidArgument, big,
                   "token 300 at index 1");
}

TEST(SamplerTest, WindowsAreConsecutiveAndTargetsShifted) {
  std::vector<uint16_t> tokens(1000);
  for (int i = 0; i < 1000; ++i) tokens[i] = static_cast<uint16_t>(i % 997);
  const TokenIds ids(tokens);
  auto s = BatchSampler::Create(&ids, 42, 8, 16);
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<int> in(4 * 16), tg(4 * 16);
  ASSERT_TRUE(s->Fill(3, 1, 0, 1, 4, in.data(), tg.data()).ok());
  for (int b = 0; b < 4; ++b) {
    const int64_t start = s->Start(3 * 8 + 4 + b);
    ASSERT_LE(start + 16, 999);
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(in[b * 16 + t], tokens[start + t]);
      EXPECT_EQ(tg[b * 16 + t], tokens[start + t + 1]);
    }
  }
  // Deterministic, and seed-dependent.
  auto s2 = BatchSampler::Create(&ids, 42, 8, 16);
  auto s3 = BatchSampler::Create(&ids, 43, 8, 16);
  int same = 0;
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(s->Start(i), s2->Start(i));
    same += s->Start(i) == s3->Start(i);
  }
  EXPECT_LT(same, 5);
  // Every start stays in range even for a minimal corpus.
  const TokenIds minimal(std::vector<uint16_t>(17, 1));
  auto sm = BatchSampler::Create(&minimal, 1, 4, 16);
  ASSERT_TRUE(sm.ok());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sm->Start(i), 0);
}

// The union of all ranks' windows for a step, in rank-major order, is the
// 1-rank global batch, for every world size dividing G.
TEST(SamplerTest, UnionOverRanksIsWorldSizeIndependent) {
  std::vector<uint16_t> tokens(5000);
  for (int i = 0; i < 5000; ++i) tokens[i] = static_cast<uint16_t>((i * 7919) % 50257);
  const TokenIds ids(tokens);
  const int G = 24, T = 8;
  auto s = BatchSampler::Create(&ids, 1337, G, T);
  ASSERT_TRUE(s.ok());
  for (int64_t step : {0, 1, 17}) {
    std::vector<int> ref_in, ref_tg;
    for (int world : {1, 2, 3, 4, 6}) {
      for (int B : {1, 2, 4}) {
        if (G % (world * B) != 0) continue;
        std::vector<int> all_in, all_tg, in(B * T), tg(B * T);
        for (int r = 0; r < world; ++r)
          for (int m = 0; m < G / (world * B); ++m) {
            ASSERT_TRUE(s->Fill(step, m, r, world, B, in.data(), tg.data()).ok());
            all_in.insert(all_in.end(), in.begin(), in.end());
            all_tg.insert(all_tg.end(), tg.begin(), tg.end());
          }
        if (ref_in.empty()) {
          ref_in = all_in;
          ref_tg = all_tg;
        }
        EXPECT_EQ(all_in, ref_in) << "world " << world << " B " << B;
        EXPECT_EQ(all_tg, ref_tg) << "world " << world << " B " << B;
      }
    }
  }
  std::vector<int> in(5 * T), tg(5 * T);
  EXPECT_EQ(s->Fill(0, 0, 0, 1, 5, in.data(), tg.data()).code(),
            absl::StatusCode::kInvalidArgument);  // 24 % 5 != 0
  EXPECT_EQ(s->Fill(0, 6, 0, 2, 2, in.data(), tg.data()).code(),
            absl::StatusCode::kInvalidArgument);  // micro out of range
  EXPECT_EQ(s->Fill(0, 0, 2, 2, 2, in.data(), tg.data()).code(),
            absl::StatusCode::kInvalidArgument);  // rank out of range
}

// Validation windows are spread evenly: the first starts at token 0, the last
// ends at the last token, and the starts do not depend on anything but
// (n, count, T).
TEST(EvalSamplerTest, WindowsSpanTheDataEvenly) {
  std::vector<uint16_t> tokens(1000);
  for (int i = 0; i < 1000; ++i) tokens[i] = static_cast<uint16_t>((i * 31) % 256);
  const TokenIds ids(tokens);
  auto s = EvalSampler::Create(&ids, 5, 16);
  ASSERT_TRUE(s.ok()) << s.status();
  // Last start n - T - 1 = 983; starts j * 983 / 4.
  const std::vector<int64_t> want = {0, 245, 491, 737, 983};
  for (int j = 0; j < 5; ++j) EXPECT_EQ(s->Start(j), want[j]) << "window " << j;
  std::vector<int> in(2 * 16), tg(2 * 16);
  ASSERT_TRUE(s->Fill(3, 2, in.data(), tg.data()).ok());
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(in[b * 16 + t], tokens[want[3 + b] + t]);
      EXPECT_EQ(tg[b * 16 + t], tokens[want[3 + b] + t + 1]);
    }
  }
  EXPECT_EQ(tg.back(), tokens.back());  // the last window ends at the last token
  auto one = EvalSampler::Create(&ids, 1, 16);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->Start(0), 0);
  // Errors: a range outside the windows, too little data, no windows.
  EXPECT_EQ(s->Fill(4, 2, in.data(), tg.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Fill(-1, 1, in.data(), tg.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Fill(0, 0, in.data(), tg.data()).code(), absl::StatusCode::kInvalidArgument);
  const TokenIds short_data(std::vector<uint16_t>(16, 1));
  EXPECT_EQ(EvalSampler::Create(&short_data, 4, 16).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EvalSampler::Create(&ids, 0, 16).status().code(), absl::StatusCode::kInvalidArgument);
}

// The replicas' shares, each filled in micro-batches of up to B windows and
// put together in rank order, are the 1-rank set of windows for every world
// size (dividing the count or not), and shares differ by at most one window.
TEST(EvalSamplerTest, UnionOverReplicasIsWorldSizeIndependent) {
  std::vector<uint16_t> tokens(3000);
  for (int i = 0; i < 3000; ++i) tokens[i] = static_cast<uint16_t>((i * 7919) % 50257);
  const TokenIds ids(tokens);
  const int T = 8;
  for (int64_t count : {1, 5, 12, 13}) {
    auto s = EvalSampler::Create(&ids, count, T);
    ASSERT_TRUE(s.ok());
    std::vector<int> ref_in(count * T), ref_tg(count * T);
    ASSERT_TRUE(s->Fill(0, static_cast<int>(count), ref_in.data(), ref_tg.data()).ok());
    for (int world : {1, 2, 3, 4, 5}) {
      for (int B : {1, 2, 4}) {
        std::vector<int> all_in, all_tg, in(B * T), tg(B * T);
        int64_t smallest = count, largest = 0;
        for (int r = 0; r < world; ++r) {
          const auto [first, last] = EvalSampler::Share(count, r, world);
          smallest = std::min(smallest, last - first);
          largest = std::max(largest, last - first);
          for (int64_t at = first; at < last; at += B) {
            const int b = static_cast<int>(std::min<int64_t>(B, last - at));
            ASSERT_TRUE(s->Fill(at, b, in.data(), tg.data()).ok());
            all_in.insert(all_in.end(), in.begin(), in.begin() + b * T);
            all_tg.insert(all_tg.end(), tg.begin(), tg.begin() + b * T);
          }
        }
        EXPECT_EQ(all_in, ref_in) << "count " << count << " world " << world << " B " << B;
        EXPECT_EQ(all_tg, ref_tg) << "count " << count << " world " << world << " B " << B;
        EXPECT_LE(largest - smallest, 1) << "count " << count << " world " << world;
      }
    }
  }
}

}  // namespace
}  // namespace shardtrain::data
