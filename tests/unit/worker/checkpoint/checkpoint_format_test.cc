// Unit tests of the checkpoint file formats: CRC-64, shard files and
// manifests (round trips; every truncation and flipped byte is detected).
#include <utility>

#include "common/planner.h"
#include "tests/unit/worker/checkpoint/checkpoint_test_util.h"

namespace shardtrain::checkpoint {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// ---------------------------------------------------------------- CRC-64

// Bit-at-a-time CRC-64/XZ, straight from the definition.
uint64_t ReferenceCrc64(const unsigned char* p, size_t n) {
  uint64_t c = ~0ull;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int b = 0; b < 8; ++b) c = (c >> 1) ^ ((c & 1) ? 0xC96C5795D7870F42ull : 0);
  }
  return ~c;
}

TEST(Crc64Test, KnownAnswers) {
  EXPECT_EQ(Crc64("123456789", 9), 0x995DC9BBDF1939FAull);  // the catalogued check value
  EXPECT_EQ(Crc64("", 0), 0ull);
  EXPECT_EQ(Crc64("a", 1), 0x330284772E652B05ull);  // Go hash/crc64 ECMA, xz
}

TEST(Crc64Test, MatchesBitwiseReferenceAndExtends) {
  std::mt19937_64 rng(7);
  std::vector<unsigned char> buf(300);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t n = 0; n <= buf.size(); n += 7) {
    const uint64_t want = ReferenceCrc64(buf.data(), n);
    ASSERT_EQ(Crc64(buf.data(), n), want) << "n=" << n;
    for (size_t cut = 0; cut <= n; cut += 5) {
      ASSERT_EQ(Crc64Extend(Crc64(buf.data(), cut), buf.data() + cut, n - cut), want)
          << "n=" << n << " cut=" << cut;
    }
  }
}

// ---------------------------------------------------------------- shards

TEST(EvenSplitTest, CoversEvenly) {
  for (uint64_t n : {0, 1, 10, 11, 10944}) {
    for (int world = 1; world <= 7; ++world) {
      uint64_t next = 0;
      for (int r = 0; r < world; ++r) {
        const FlatRange fr = EvenSplit(n, world, r);
        EXPECT_EQ(fr.begin, next);
        EXPECT_LE(fr.size(), n / world + 1);
        EXPECT_GE(fr.size(), n / world);
        next = fr.end;
      }
      EXPECT_EQ(next, n) << "n=" << n << " world=" << world;
    }
  }
}

TEST(ShardFileTest, EncodeRejectsInconsistentContents) {
  const model::ParamLayout layout(SmallConfig());
  const FlatState state = MakeFlatState(layout.num_params(), 2);
  ShardContents ok = MakeShard(layout, 1, 2, 0, {{0, 10}, {20, 30}}, state);
  ASSERT_TRUE(EncodeShard(ok).ok());
  ShardContents c = ok;
  c.ranges = {{20, 30}, {0, 10}};  // unsorted
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeShard(c).status()));
  c = ok;
  c.ranges = {{0, 10}, {5, 15}};  // overlapping
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeShard(c).status()));
  c = ok;
  c.ranges = {{0, 10}, {layout.num_params() - 5, layout.num_params() + 5}};
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeShard(c).status()));
  c = ok;
  c.m.pop_back();
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeShard(c).status()));
  c = ok;
  c.rank = 2;
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeShard(c).status()));
}

// A rank that holds no part of the model (more ranks than ZeRO units) writes
// a shard with no ranges: its sections are empty. Found by shard_fuzz: the
// reader passed the empty vectors' null data() to memcpy (UBSan: null
// pointer passed as argument 1); the input stays in tests/fuzz/corpus/shard.
TEST(ShardFileTest, ShardWithoutRangesRoundTrips) {
  const model::ParamLayout layout(SmallConfig());
  const FlatState state = MakeFlatState(layout.num_params(), 4);
  const ShardContents empty = MakeShard(layout, 7, 8, 7, {}, state);
  ASSERT_TRUE(empty.params.empty());
  absl::StatusOr<std::string> bytes = EncodeShard(empty);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<ShardContents> got = DecodeShard(*bytes, "ckpt/step-7/rank-7.shard");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->rank, 7);
  EXPECT_EQ(got->world, 8);
  EXPECT_EQ(got->step, 7);
  EXPECT_TRUE(got->ranges.empty());
  EXPECT_TRUE(got->params.empty() && got->m.empty() && got->v.empty());
  EXPECT_EQ(got->scalars, empty.scalars);
  EXPECT_EQ(*EncodeShard(*got), *bytes);
}

// The planner sizes checkpoints with ShardFileBytes (Plan.checkpoint_bytes:
// what `shardtrain plan` prints and `local` and `submit` compare with the
// free space): it is exactly the encoder's size, for DDP's and ZeRO's
// ranges on any world.
TEST(ShardFileTest, PlannersShardSizeIsTheEncodersSize) {
  const model::ParamLayout layout(SmallConfig());
  const FlatState state = MakeFlatState(layout.num_params(), 5);
  for (auto [world, zero] : {std::pair{1, 0}, {2, 0}, {3, 1}, {4, 3}}) {
    const auto ranges = RankRanges(layout, world, zero);
    int64_t total = 0, all_ranges = 0;
    for (int r = 0; r < world; ++r) {
      absl::StatusOr<std::string> bytes =
          EncodeShard(MakeShard(layout, 10, world, r, ranges[r], state));
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      int64_t elements = 0;
      for (const FlatRange& fr : ranges[r]) elements += int64_t(fr.size());
      EXPECT_EQ(int64_t(bytes->size()), ShardFileBytes(elements, int64_t(ranges[r].size())))
          << "world " << world << " zero " << zero << " rank " << r;
      total += int64_t(bytes->size());
      all_ranges += int64_t(ranges[r].size());
    }
    EXPECT_EQ(total, ShardFileBytes(int64_t(layout.num_params()), all_ranges) +
                         (world - 1) * ShardFileBytes(0, 0));
  }
}

TEST(ShardFileTest, EveryTruncationAndEveryFlippedByteIsDataLossNamingTheFile) {
  const model::ParamLayout layout(SmallConfig());
  const FlatState state = MakeFlatState(layout.num_params(), 3);
  absl::StatusOr<std::string> bytes =
      EncodeShard(MakeShard(layout, 5, 4, 2, {{100, 140}, {9000, 9030}}, state));
  ASSERT_TRUE(bytes.ok());
  ASSERT_TRUE(DecodeShard(*bytes, "ckpt/step-5/rank-2.shard").ok());
  for (size_t len = 0; len < bytes->size(); ++len) {
    absl::StatusOr<ShardContents> got =
        DecodeShard(bytes->substr(0, len), "ckpt/step-5/rank-2.shard");
    ASSERT_TRUE(absl::IsDataLoss(got.status())) << "len=" << len << ": " << got.status();
    ASSERT_THAT(std::string(got.status().message()), HasSubstr("ckpt/step-5/rank-2.shard"));
    if (len >= 12) {
      ASSERT_THAT(std::string(got.status().message()), HasSubstr("truncated")) << "len=" << len;
    }
  }
  for (size_t i = 0; i < bytes->size(); ++i) {
    std::string flipped = *bytes;
    flipped[i] = static_cast<char>(flipped[i] ^ (1 << (i % 8)));
    absl::StatusOr<ShardContents> got = DecodeShard(flipped, "ckpt/step-5/rank-2.shard");
    ASSERT_TRUE(absl::IsDataLoss(got.status())) << "byte " << i << ": " << got.status();
    ASSERT_THAT(std::string(got.status().message()), HasSubstr("ckpt/step-5/rank-2.shard"));
  }
  EXPECT_THAT(std::string(DecodeShard(*bytes + "x", "f").status().message()),
              HasSubstr("trailing"));
  std::string bad_magic = *bytes;
  bad_magic[0] = 'X';
  EXPECT_THAT(std::string(DecodeShard(bad_magic, "f").status().message()), HasSubstr("magic"));
  std::string bad_version = *bytes;
  bad_version[8] = 9;
  EXPECT_THAT(std::string(DecodeShard(bad_version, "f").status().message()),
              HasSubstr("unsupported version 9"));
  std::string bad_payload = *bytes;
  bad_payload[bytes->size() / 2] ^= 0x40;
  EXPECT_THAT(std::string(DecodeShard(bad_payload, "f").status().message()),
              HasSubstr("checksum mismatch"));
}

// ---------------------------------------------------------------- manifests

std::vector<ShardFileInfo> FakeInfos(const model::ParamLayout& layout, int world, int zero) {
  std::vector<ShardFileInfo> infos;
  const auto ranges = RankRanges(layout, world, zero);
  for (int r = 0; r < world; ++r) {
    infos.push_back(
        ShardFileInfo{r, ShardFileName(r), ranges[r], 1000u + r, 0xfedcba9876543210ull + r});
  }
  return infos;
}

TEST(ManifestTest, SerializeParseRoundTrip) {
  const model::ParamLayout layout(SmallConfig());
  auto infos = FakeInfos(layout, 3, 3);
  std::swap(infos[0], infos[2]);  // any order in, rank order out
  absl::StatusOr<Manifest> m = MakeManifest(layout, 70, 3, 3, infos);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string text = SerializeManifest(*m);
  absl::StatusOr<Manifest> got = ParseManifest(text, "m.txt");
  ASSERT_TRUE(got.ok()) << got.status() << "\n" << text;
  EXPECT_EQ(got->step, 70);
  EXPECT_EQ(got->world, 3);
  EXPECT_EQ(got->zero_stage, 3);
  EXPECT_EQ(got->config, layout.config());
  EXPECT_EQ(got->num_params, layout.num_params());
  EXPECT_EQ(got->layout_fingerprint, layout.Fingerprint());
  ASSERT_EQ(got->tensors.size(), layout.tensors().size());
  for (size_t i = 0; i < got->tensors.size(); ++i) {
    EXPECT_EQ(got->tensors[i].name, layout.tensors()[i].name);
    EXPECT_EQ(got->tensors[i].shape, layout.tensors()[i].shape);
    EXPECT_EQ(got->tensors[i].offset, layout.tensors()[i].offset);
  }
  ASSERT_EQ(got->shards.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(got->shards[r].rank, r);
    EXPECT_EQ(got->shards[r].file, ShardFileName(r));
    EXPECT_EQ(got->shards[r].ranges, m->shards[r].ranges);
    EXPECT_EQ(got->shards[r].bytes, 1000u + r);
    EXPECT_EQ(got->shards[r].checksum, 0xfedcba9876543210ull + r);
  }
  EXPECT_EQ(SerializeManifest(*got), text);
  EXPECT_THAT(text, HasSubstr("tensor name=wte shape=256x16 offset=0 numel=4096\n"));
  EXPECT_TRUE(CheckCompatible(*got, layout).ok());
  const model::ParamLayout other(*model::MakeGptConfig(2, 2, 16, 32, 256));
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckCompatible(*got, other)));
}

// A Llama model's manifest carries its family's recipe on the config line
// (GPT-2's stays as it was) and reads back equal; a GPT-2 layout of the
// same shape is not compatible with it.
TEST(ManifestTest, LlamaRecipeRoundTrips) {
  // layers, heads, kv_heads, dim, ffn_dim, context, vocab, rope_theta, norm_eps
  const model::ModelConfig llama =
      *model::MakeLlamaConfig({2, 4, 2, 16, 40, 32, 256, 123456.75, 1.5e-6});
  const model::ParamLayout layout(llama);
  absl::StatusOr<Manifest> m = MakeManifest(layout, 5, 2, 1, FakeInfos(layout, 2, 1));
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string text = SerializeManifest(*m);
  EXPECT_THAT(text, HasSubstr(" arch=llama kv_heads=2 ffn_dim=40 tie_embeddings=0 "));
  absl::StatusOr<Manifest> got = ParseManifest(text, "m.txt");
  ASSERT_TRUE(got.ok()) << got.status() << "\n" << text;
  EXPECT_EQ(got->config, llama);
  EXPECT_EQ(SerializeManifest(*got), text);
  EXPECT_TRUE(CheckCompatible(*got, layout).ok());
  const model::ParamLayout gpt2(*model::MakeGptConfig(2, 4, 16, 32, 256));
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckCompatible(*got, gpt2)));
  EXPECT_THAT(SerializeManifest(*MakeManifest(gpt2, 5, 2, 1, FakeInfos(gpt2, 2, 1))),
              HasSubstr("padded_vocab=256\nlayout "));
  // rope_scaling rides on the same line, and only when on.
  EXPECT_THAT(text, Not(HasSubstr("rope_factor")));
  const model::ModelConfig scaled =
      *model::MakeLlamaConfig({2, 4, 2, 16, 40, 32, 256, 1e4, 1e-5, false, {8, 1.25, 4, 24}});
  const model::ParamLayout scaled_layout(scaled);
  const std::string scaled_text =
      SerializeManifest(*MakeManifest(scaled_layout, 5, 2, 1, FakeInfos(scaled_layout, 2, 1)));
  EXPECT_THAT(scaled_text, HasSubstr(" rope_factor=8 rope_low_freq_factor=1.25 "
                                     "rope_high_freq_factor=4 rope_original_context=24\n"));
  got = ParseManifest(scaled_text, "m.txt");
  ASSERT_TRUE(got.ok()) << got.status() << "\n" << scaled_text;
  EXPECT_EQ(got->config, scaled);
  // MoE layers too, in either family.
  model::ModelConfig gpt_moe = *model::MakeGptConfig(2, 4, 16, 32, 256);
  gpt_moe.moe = {4, 2, 8, 1, model::RouterScoring::kSigmoid, false, 1};
  for (const model::ModelConfig& c : {gpt_moe, *model::ModelPreset("moe-tiny")}) {
    const model::ParamLayout moe_layout(c);
    const std::string moe_text =
        SerializeManifest(*MakeManifest(moe_layout, 5, 2, 1, FakeInfos(moe_layout, 2, 1)));
    EXPECT_THAT(moe_text, HasSubstr(" experts=4 top_k=2 "));
    got = ParseManifest(moe_text, "m.txt");
    ASSERT_TRUE(got.ok()) << got.status() << "\n" << moe_text;
    EXPECT_EQ(got->config, c);
    EXPECT_TRUE(CheckCompatible(*got, moe_layout).ok());
  }
}

TEST(ManifestTest, MakeManifestRejectsBadShardSets) {
  const model::ParamLayout layout(SmallConfig());
  auto infos = FakeInfos(layout, 4, 0);
  ASSERT_TRUE(MakeManifest(layout, 1, 4, 0, infos).ok());
  auto missing = infos;
  missing.pop_back();
  EXPECT_TRUE(absl::IsInvalidArgument(MakeManifest(layout, 1, 4, 0, missing).status()));
  auto gap = infos;
  gap[1].ranges[0].end -= 1;
  EXPECT_THAT(std::string(MakeManifest(layout, 1, 4, 0, gap).status().message()),
              HasSubstr("no shard holds"));
  auto overlap = infos;
  overlap[1].ranges[0].end += 1;
  EXPECT_THAT(std::string(MakeManifest(layout, 1, 4, 0, overlap).status().message()),
              HasSubstr("held by two shards"));
  auto dup_rank = infos;
  dup_rank[3].rank = 2;
  EXPECT_TRUE(absl::IsInvalidArgument(MakeManifest(layout, 1, 4, 0, dup_rank).status()));
  auto bad_name = infos;
  bad_name[0].file = "../rank-0.shard";
  EXPECT_TRUE(absl::IsInvalidArgument(MakeManifest(layout, 1, 4, 0, bad_name).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(MakeManifest(layout, 1, 4, 7, infos).status()));
}

TEST(ManifestTest, EveryTruncationAndEveryFlippedByteIsDataLossNamingTheFile) {
  const model::ParamLayout layout(SmallConfig());
  const std::string text =
      SerializeManifest(*MakeManifest(layout, 9, 2, 0, FakeInfos(layout, 2, 0)));
  for (size_t len = 0; len < text.size(); ++len) {
    absl::Status s = ParseManifest(text.substr(0, len), "d/step-9/manifest.txt").status();
    ASSERT_TRUE(absl::IsDataLoss(s)) << "len=" << len << ": " << s;
    ASSERT_THAT(std::string(s.message()), HasSubstr("d/step-9/manifest.txt"));
  }
  for (size_t i = 0; i < text.size(); ++i) {
    std::string flipped = text;
    flipped[i] = static_cast<char>(flipped[i] ^ (1 << (i % 7)));
    absl::Status s = ParseManifest(flipped, "d/step-9/manifest.txt").status();
    ASSERT_TRUE(absl::IsDataLoss(s)) << "byte " << i << ": " << s;
    ASSERT_THAT(std::string(s.message()), HasSubstr("d/step-9/manifest.txt"));
  }
}

}  // namespace
}  // namespace shardtrain::checkpoint
