// Unit tests of worker/checkpoint: CRC-64, shard files, manifests, the
// resharding loader and the directory policy. Storage-level tests run on the
// real filesystem (a fresh temp dir) and on the in-memory fake alike.
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/checkpoint/crc64.h"
#include "worker/checkpoint/directory.h"
#include "worker/checkpoint/fake_storage.h"
#include "worker/checkpoint/loader.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/shard_file.h"
#include "worker/checkpoint/storage.h"
#include "worker/model/config.h"
#include "worker/model/param_layout.h"

namespace shardtrain::checkpoint {
namespace {

using ::testing::HasSubstr;

model::GptConfig SmallConfig() {
  absl::StatusOr<model::GptConfig> c = model::MakeGptConfig(/*layers=*/2, /*heads=*/2,
                                                            /*dim=*/16, /*context=*/16,
                                                            /*vocab=*/256);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

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

// ---------------------------------------------------------------- helpers

// A model's full training state: params, m, v over the flat buffer. Values
// are random bit patterns plus -0, denormals, inf and NaN payloads, so only a
// bitwise comparison passes.
struct FlatState {
  std::vector<float> params, m, v;
};

float RandomFloat(std::mt19937& rng) {
  const uint32_t bits = rng();
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

FlatState MakeFlatState(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  FlatState s;
  for (auto* vec : {&s.params, &s.m, &s.v}) {
    vec->resize(n);
    for (float& x : *vec) x = RandomFloat(rng);
  }
  s.params[0] = -0.0f;
  s.params[1] = std::numeric_limits<float>::denorm_min();
  s.m[2] = std::numeric_limits<float>::infinity();
  uint32_t nan_bits = 0x7fc01234u;
  std::memcpy(&s.v[3], &nan_bits, 4);
  return s;
}

// Compares got[i] with want[offset + i] bit for bit; reports the first
// mismatch and how many there are.
::testing::AssertionResult Bitwise(const std::vector<float>& got, const std::vector<float>& want,
                                   uint64_t offset) {
  if (offset + got.size() > want.size()) return ::testing::AssertionFailure() << "out of range";
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[offset + i], 4) != 0 && bad++ == 0) first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements differ, first at flat index "
         << offset + first << ": " << got[first] << " vs " << want[offset + first];
}

// Each rank's saved ranges. zero 0 (and 1/2 saved like it here): the r-th
// even split of the flat buffer; zero 3: the r-th even split of every unit.
std::vector<std::vector<FlatRange>> RankRanges(const model::ParamLayout& layout, int world,
                                               int zero) {
  std::vector<std::vector<FlatRange>> out(world);
  for (int r = 0; r < world; ++r) {
    if (zero < 3) {
      out[r].push_back(EvenSplit(layout.num_params(), world, r));
      continue;
    }
    for (const model::UnitInfo& u : layout.units()) {
      const FlatRange local = EvenSplit(u.numel, world, r);
      out[r].push_back(FlatRange{u.offset + local.begin, u.offset + local.end});
    }
  }
  return out;
}

TrainingScalars Scalars(int64_t step) {
  TrainingScalars s;
  s.optimizer_step = step;
  s.data_position = step + 1;
  s.rng_seed = 0x1234567890abcdefull;
  s.loss_scale = 32768.0 / 3.0;
  return s;
}

ShardContents MakeShard(const model::ParamLayout& layout, int64_t step, int world, int rank,
                        const std::vector<FlatRange>& ranges, const FlatState& state) {
  ShardContents c;
  c.step = step;
  c.rank = rank;
  c.world = world;
  c.layout_fingerprint = layout.Fingerprint();
  c.num_params = layout.num_params();
  c.ranges = ranges;
  for (const FlatRange& r : ranges) {
    c.params.insert(c.params.end(), state.params.begin() + r.begin, state.params.begin() + r.end);
    c.m.insert(c.m.end(), state.m.begin() + r.begin, state.m.begin() + r.end);
    c.v.insert(c.v.end(), state.v.begin() + r.begin, state.v.begin() + r.end);
  }
  c.scalars = Scalars(step);
  return c;
}

// What every rank and then the coordinator do to save step `step`: each rank
// writes its shard, the coordinator writes the manifest once all succeeded.
absl::Status SaveCheckpoint(CheckpointStorage& storage, const std::string& dir,
                            const model::ParamLayout& layout, int64_t step, int world, int zero,
                            const FlatState& state, bool commit = true) {
  const std::string step_dir = StepDir(dir, step);
  const auto ranges = RankRanges(layout, world, zero);
  std::vector<ShardFileInfo> infos;
  for (int r = 0; r < world; ++r) {
    absl::StatusOr<ShardFileInfo> info =
        WriteShard(storage, JoinPath(step_dir, ShardFileName(r)),
                   MakeShard(layout, step, world, r, ranges[r], state));
    if (!info.ok()) return info.status();
    infos.push_back(*info);
  }
  if (!commit) return absl::OkStatus();
  absl::StatusOr<Manifest> m = MakeManifest(layout, step, world, zero, infos);
  if (!m.ok()) return m.status();
  return WriteManifest(storage, ManifestPath(step_dir), *m);
}

// ---------------------------------------------------------------- storages

enum class StorageKind { kFile, kFake };

class StorageTest : public ::testing::TestWithParam<StorageKind> {
 protected:
  void SetUp() override {
    if (GetParam() == StorageKind::kFake) {
      fake_ = std::make_unique<FakeCheckpointStorage>();
      dir_ = "/fake/ckpt";
      return;
    }
    std::string tmpl = JoinPath(::testing::TempDir(), "checkpoint_test.XXXXXX");
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    dir_ = JoinPath(root_, "ckpt");
    file_ = std::make_unique<FileCheckpointStorage>();
  }
  void TearDown() override {
    if (!root_.empty()) std::filesystem::remove_all(root_);
  }

  CheckpointStorage& storage() {
    if (fake_) return *fake_;
    return *file_;
  }

  // Corruptions as a bad disk would cause them (the fake's own injectors, or
  // an in-place rewrite on the real filesystem).
  void Truncate(const std::string& path, size_t size) {
    if (fake_) {
      ASSERT_TRUE(fake_->Truncate(path, size).ok());
      return;
    }
    std::filesystem::resize_file(path, size);
  }
  void FlipByte(const std::string& path, size_t offset) {
    if (fake_) {
      ASSERT_TRUE(fake_->FlipByte(path, offset).ok());
      return;
    }
    absl::StatusOr<std::string> bytes = storage().Read(path);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    ASSERT_LT(offset, bytes->size());
    (*bytes)[offset] = static_cast<char>(~(*bytes)[offset]);
    ASSERT_TRUE(storage().WriteFileAtomic(path, std::string_view(*bytes)).ok());
  }
  size_t FileSize(const std::string& path) {
    absl::StatusOr<std::string> bytes = storage().Read(path);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    return bytes.ok() ? bytes->size() : 0;
  }

  std::unique_ptr<FakeCheckpointStorage> fake_;
  std::unique_ptr<FileCheckpointStorage> file_;
  std::string root_;
  std::string dir_;
  model::ParamLayout layout_{SmallConfig()};
};

INSTANTIATE_TEST_SUITE_P(Storages, StorageTest,
                         ::testing::Values(StorageKind::kFile, StorageKind::kFake),
                         [](const auto& info) {
                           return info.param == StorageKind::kFile ? "File" : "Fake";
                         });

TEST_P(StorageTest, BasicOperations) {
  const std::string a = JoinPath(dir_, "x/a.bin");
  EXPECT_TRUE(absl::IsNotFound(storage().Read(a).status()));
  EXPECT_TRUE(absl::IsNotFound(storage().List(dir_).status()));
  const std::string_view pieces[] = {"hello ", "", "world"};
  ASSERT_TRUE(storage().WriteFileAtomic(a, pieces).ok());
  EXPECT_EQ(*storage().Read(a), "hello world");
  ASSERT_TRUE(storage().WriteFileAtomic(a, std::string_view("replaced")).ok());
  EXPECT_EQ(*storage().Read(a), "replaced");
  ASSERT_TRUE(storage().WriteFileAtomic(JoinPath(dir_, "b"), std::string_view("")).ok());
  EXPECT_EQ(*storage().Read(JoinPath(dir_, "b")), "");
  // No temp files left behind: exactly what was written is listed.
  EXPECT_EQ(*storage().List(dir_), (std::vector<std::string>{"b", "x"}));
  EXPECT_EQ(*storage().List(JoinPath(dir_, "x")), (std::vector<std::string>{"a.bin"}));
  ASSERT_TRUE(storage().RemoveAll(JoinPath(dir_, "x")).ok());
  EXPECT_TRUE(absl::IsNotFound(storage().Read(a).status()));
  EXPECT_EQ(*storage().List(dir_), (std::vector<std::string>{"b"}));
  EXPECT_TRUE(storage().RemoveAll(JoinPath(dir_, "missing")).ok());
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

TEST_P(StorageTest, ShardRoundTripIsBitwise) {
  const FlatState state = MakeFlatState(layout_.num_params(), 1);
  const auto ranges = RankRanges(layout_, 3, /*zero=*/3);  // several ranges per shard
  const ShardContents want = MakeShard(layout_, 40, 3, 1, ranges[1], state);
  const std::string path = JoinPath(StepDir(dir_, 40), ShardFileName(1));
  absl::StatusOr<ShardFileInfo> info = WriteShard(storage(), path, want);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rank, 1);
  EXPECT_EQ(info->file, "rank-1.shard");
  EXPECT_EQ(info->ranges, ranges[1]);
  const std::string bytes = *storage().Read(path);
  EXPECT_EQ(info->bytes, bytes.size());
  EXPECT_EQ(info->checksum, Crc64(bytes.data(), bytes.size() - 8));

  absl::StatusOr<ShardContents> got = ReadShard(storage(), path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->step, 40);
  EXPECT_EQ(got->rank, 1);
  EXPECT_EQ(got->world, 3);
  EXPECT_EQ(got->layout_fingerprint, layout_.Fingerprint());
  EXPECT_EQ(got->num_params, layout_.num_params());
  EXPECT_EQ(got->ranges, want.ranges);
  EXPECT_TRUE(got->scalars == want.scalars);
  EXPECT_TRUE(Bitwise(got->params, want.params, 0));
  EXPECT_TRUE(Bitwise(got->m, want.m, 0));
  EXPECT_TRUE(Bitwise(got->v, want.v, 0));
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

// ---------------------------------------------------------------- resharding

TEST_P(StorageTest, SavedOnFourLoadsOnAnyWorldBitwise) {
  const FlatState state = MakeFlatState(layout_.num_params(), 11);
  for (int save_zero : {0, 3}) {
    const int64_t step = 100 + save_zero;
    ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, step, /*world=*/4, save_zero, state).ok());
    absl::StatusOr<Manifest> m = ReadManifest(storage(), ManifestPath(StepDir(dir_, step)));
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(CheckCompatible(*m, layout_).ok());
    // New world M under ZeRO-0 (one even range per rank) and ZeRO-3 (one
    // range per unit per rank): every rank gets exactly its elements.
    for (int world : {1, 2, 3, 5}) {
      for (int load_zero : {0, 3}) {
        const auto ranges = RankRanges(layout_, world, load_zero);
        for (int r = 0; r < world; ++r) {
          SCOPED_TRACE(absl::StrCat("saved zero ", save_zero, " world 4; loading zero ", load_zero,
                                    " world ", world, " rank ", r));
          absl::StatusOr<LoadedState> got =
              LoadRanges(storage(), StepDir(dir_, step), *m, ranges[r]);
          ASSERT_TRUE(got.ok()) << got.status();
          EXPECT_EQ(got->step, step);
          EXPECT_TRUE(got->scalars == Scalars(step));
          uint64_t at = 0;
          for (const FlatRange& fr : ranges[r]) {
            std::vector<float> p(got->params.begin() + at, got->params.begin() + at + fr.size());
            std::vector<float> mm(got->m.begin() + at, got->m.begin() + at + fr.size());
            std::vector<float> vv(got->v.begin() + at, got->v.begin() + at + fr.size());
            EXPECT_TRUE(Bitwise(p, state.params, fr.begin));
            EXPECT_TRUE(Bitwise(mm, state.m, fr.begin));
            EXPECT_TRUE(Bitwise(vv, state.v, fr.begin));
            at += fr.size();
          }
          EXPECT_EQ(at, got->params.size());
        }
      }
    }
    // Arbitrary ranges: empty, single elements, across shard boundaries.
    std::mt19937_64 rng(5);
    for (int i = 0; i < 50; ++i) {
      uint64_t a = rng() % (layout_.num_params() + 1), b = rng() % (layout_.num_params() + 1);
      if (a > b) std::swap(a, b);
      if (i % 10 == 0) b = a;
      absl::StatusOr<LoadedState> got = LoadRange(storage(), StepDir(dir_, step), *m, a, b);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->params.size(), b - a);
      EXPECT_TRUE(Bitwise(got->params, state.params, a)) << "[" << a << ", " << b << ")";
      EXPECT_TRUE(Bitwise(got->m, state.m, a));
      EXPECT_TRUE(Bitwise(got->v, state.v, a));
      EXPECT_TRUE(got->scalars == Scalars(step));
    }
    absl::StatusOr<LoadedState> all = LoadAll(storage(), StepDir(dir_, step), *m);
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_TRUE(Bitwise(all->params, state.params, 0));
    EXPECT_TRUE(Bitwise(all->m, state.m, 0));
    EXPECT_TRUE(Bitwise(all->v, state.v, 0));
    EXPECT_TRUE(absl::IsInvalidArgument(
        LoadRange(storage(), StepDir(dir_, step), *m, 0, layout_.num_params() + 1).status()));
  }
}

// ---------------------------------------------------------------- directory policy

TEST(StepDirNameTest, ParsesOnlyCanonicalNames) {
  EXPECT_EQ(StepDirName(120), "step-120");
  EXPECT_EQ(ParseStepDirName("step-120"), 120);
  EXPECT_EQ(ParseStepDirName("step-0"), 0);
  for (const char* bad : {"step-", "step-012", "step--1", "step-+1", "step-1x", "stepx-1",
                          "step-1.tmp", "manifest.txt"}) {
    EXPECT_FALSE(ParseStepDirName(bad).has_value()) << bad;
  }
}

enum class Corruption { kFlippedShardByte, kTruncatedShard, kMissingShard, kTruncatedManifest };

TEST_P(StorageTest, CorruptionIsDetectedAndLatestValidFallsBack) {
  const FlatState old_state = MakeFlatState(layout_.num_params(), 21);
  const FlatState new_state = MakeFlatState(layout_.num_params(), 22);
  for (Corruption kind : {Corruption::kFlippedShardByte, Corruption::kTruncatedShard,
                          Corruption::kMissingShard, Corruption::kTruncatedManifest}) {
    SCOPED_TRACE(static_cast<int>(kind));
    ASSERT_TRUE(storage().RemoveAll(dir_).ok());
    ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, 10, 4, 0, old_state).ok());
    ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, 20, 4, 3, new_state).ok());
    const std::string step20 = StepDir(dir_, 20);
    absl::StatusOr<LatestValidResult> before = LatestValid(storage(), dir_);
    ASSERT_TRUE(before.ok() && before->checkpoint.has_value());
    EXPECT_EQ(before->checkpoint->step, 20);
    EXPECT_TRUE(before->skipped.empty());

    std::string bad_file;
    switch (kind) {
      case Corruption::kFlippedShardByte:
        bad_file = JoinPath(step20, "rank-2.shard");
        FlipByte(bad_file, FileSize(bad_file) / 2);
        break;
      case Corruption::kTruncatedShard:
        bad_file = JoinPath(step20, "rank-1.shard");
        Truncate(bad_file, FileSize(bad_file) - 100);
        break;
      case Corruption::kMissingShard:
        bad_file = JoinPath(step20, "rank-3.shard");
        ASSERT_TRUE(storage().RemoveAll(bad_file).ok());
        break;
      case Corruption::kTruncatedManifest:
        bad_file = ManifestPath(step20);
        Truncate(bad_file, FileSize(bad_file) * 2 / 3);
        break;
    }

    // Loading step 20 directly fails with DataLoss naming the file.
    absl::Status load_status;
    absl::StatusOr<Manifest> m = ReadManifest(storage(), ManifestPath(step20));
    if (kind == Corruption::kTruncatedManifest) {
      load_status = m.status();
    } else {
      ASSERT_TRUE(m.ok()) << m.status();
      load_status = LoadAll(storage(), step20, *m).status();
    }
    EXPECT_TRUE(absl::IsDataLoss(load_status)) << load_status;
    EXPECT_THAT(std::string(load_status.message()), HasSubstr(bad_file));

    // LatestValid falls back to step 10 and says why it skipped step 20.
    absl::StatusOr<LatestValidResult> latest = LatestValid(storage(), dir_);
    ASSERT_TRUE(latest.ok()) << latest.status();
    ASSERT_TRUE(latest->checkpoint.has_value());
    EXPECT_EQ(latest->checkpoint->step, 10);
    ASSERT_EQ(latest->skipped.size(), 1u);
    EXPECT_EQ(latest->skipped[0].step_dir, step20);
    EXPECT_TRUE(absl::IsDataLoss(latest->skipped[0].reason)) << latest->skipped[0].reason;
    EXPECT_THAT(std::string(latest->skipped[0].reason.message()), HasSubstr(bad_file));
    absl::StatusOr<LoadedState> loaded =
        LoadAll(storage(), latest->checkpoint->step_dir, latest->checkpoint->manifest);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_TRUE(Bitwise(loaded->params, old_state.params, 0));

    // A corrupt manifest also drops the step from the committed list.
    absl::StatusOr<std::vector<CommittedCheckpoint>> committed = ListCommitted(storage(), dir_);
    ASSERT_TRUE(committed.ok());
    EXPECT_EQ(committed->size(), kind == Corruption::kTruncatedManifest ? 1u : 2u);
  }
}

TEST_P(StorageTest, ShardReplacedByAnotherValidShardIsDetected) {
  // A shard that verifies by itself but is not the one the manifest names
  // (e.g. a stale rank rewrote step 20 after the commit) is still rejected.
  const FlatState state = MakeFlatState(layout_.num_params(), 23);
  ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, 20, 2, 0, state).ok());
  const FlatState other = MakeFlatState(layout_.num_params(), 24);
  const std::string path = JoinPath(StepDir(dir_, 20), ShardFileName(1));
  ASSERT_TRUE(
      WriteShard(storage(), path, MakeShard(layout_, 20, 2, 1, RankRanges(layout_, 2, 0)[1], other))
          .ok());
  absl::StatusOr<Manifest> m = ReadManifest(storage(), ManifestPath(StepDir(dir_, 20)));
  ASSERT_TRUE(m.ok());
  absl::Status s = LoadAll(storage(), StepDir(dir_, 20), *m).status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
}

TEST_P(StorageTest, DirectoryWithoutManifestIsNeverCommitted) {
  const FlatState state = MakeFlatState(layout_.num_params(), 31);
  absl::StatusOr<LatestValidResult> none = LatestValid(storage(), dir_);  // dir absent
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->checkpoint.has_value());
  EXPECT_TRUE(ListCommitted(storage(), dir_)->empty());

  ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, 10, 2, 0, state).ok());
  ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, 30, 2, 0, state, /*commit=*/false).ok());
  // Stray entries that are not step directories are ignored too.
  ASSERT_TRUE(storage().WriteFileAtomic(JoinPath(dir_, "step-x/junk"), std::string_view("j")).ok());
  ASSERT_TRUE(storage().WriteFileAtomic(JoinPath(dir_, "notes.txt"), std::string_view("n")).ok());

  absl::StatusOr<std::vector<CommittedCheckpoint>> committed = ListCommitted(storage(), dir_);
  ASSERT_TRUE(committed.ok()) << committed.status();
  ASSERT_EQ(committed->size(), 1u);
  EXPECT_EQ((*committed)[0].step, 10);
  absl::StatusOr<LatestValidResult> latest = LatestValid(storage(), dir_);
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->checkpoint.has_value());
  EXPECT_EQ(latest->checkpoint->step, 10);
  ASSERT_EQ(latest->skipped.size(), 1u);
  EXPECT_EQ(latest->skipped[0].step_dir, StepDir(dir_, 30));
  EXPECT_TRUE(absl::IsNotFound(latest->skipped[0].reason)) << latest->skipped[0].reason;
}

TEST_P(StorageTest, PruneKeepsNewestCommitted) {
  const FlatState state = MakeFlatState(layout_.num_params(), 41);
  ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, 5, 2, 0, state, /*commit=*/false).ok());
  for (int64_t step : {10, 20, 30, 40, 50}) {
    ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, step, 2, 0, state).ok());
  }
  ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, 35, 2, 0, state, /*commit=*/false).ok());
  ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, 60, 2, 0, state, /*commit=*/false).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(PruneOld(storage(), dir_, 0).status()));

  absl::StatusOr<std::vector<std::string>> removed = PruneOld(storage(), dir_, 2);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed,
            (std::vector<std::string>{StepDir(dir_, 5), StepDir(dir_, 10), StepDir(dir_, 20),
                                      StepDir(dir_, 30), StepDir(dir_, 35)}));
  // Kept: the two newest committed and the (possibly in-progress) newer partial.
  EXPECT_EQ(*storage().List(dir_), (std::vector<std::string>{"step-40", "step-50", "step-60"}));
  absl::StatusOr<std::vector<CommittedCheckpoint>> committed = ListCommitted(storage(), dir_);
  ASSERT_TRUE(committed.ok());
  ASSERT_EQ(committed->size(), 2u);
  EXPECT_EQ((*committed)[0].step, 50);
  EXPECT_EQ((*committed)[1].step, 40);
  EXPECT_TRUE(LoadAll(storage(), (*committed)[1].step_dir, (*committed)[1].manifest).ok());
  // Idempotent; keep larger than what exists removes nothing.
  EXPECT_TRUE(PruneOld(storage(), dir_, 2)->empty());
  EXPECT_TRUE(PruneOld(storage(), dir_, 10)->empty());
}

TEST(FakeStorageTest, WriteFailureMidSaveLeavesNothingVisible) {
  FakeCheckpointStorage storage;
  const model::ParamLayout layout(SmallConfig());
  const FlatState state = MakeFlatState(layout.num_params(), 51);
  ASSERT_TRUE(SaveCheckpoint(storage, "/c", layout, 10, 4, 0, state).ok());
  // Writes of step 20: rank-0..rank-3 shards, then the manifest. Fail the 3rd
  // (rank 2's shard), then separately the 5th (the manifest).
  for (int fail_at : {3, 5}) {
    SCOPED_TRACE(fail_at);
    ASSERT_TRUE(storage.RemoveAll(StepDir("/c", 20)).ok());
    storage.FailNthWrite(fail_at);
    const int before = storage.write_count();
    absl::Status s = SaveCheckpoint(storage, "/c", layout, 20, 4, 0, state);
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_EQ(storage.write_count() - before, fail_at);
    const std::string failed = fail_at == 3 ? JoinPath(StepDir("/c", 20), "rank-2.shard")
                                            : ManifestPath(StepDir("/c", 20));
    EXPECT_THAT(std::string(s.message()), HasSubstr(failed));
    // The half-written temp file is there; the file itself never appears.
    EXPECT_FALSE(storage.Exists(failed));
    EXPECT_TRUE(absl::IsNotFound(storage.Read(failed).status()));
    EXPECT_TRUE(storage.Exists(failed + ".tmp"));
    EXPECT_FALSE(storage.Exists(ManifestPath(StepDir("/c", 20))));
    absl::StatusOr<std::vector<CommittedCheckpoint>> committed = ListCommitted(storage, "/c");
    ASSERT_TRUE(committed.ok());
    ASSERT_EQ(committed->size(), 1u);
    EXPECT_EQ((*committed)[0].step, 10);
    absl::StatusOr<LatestValidResult> latest = LatestValid(storage, "/c");
    ASSERT_TRUE(latest.ok() && latest->checkpoint.has_value());
    EXPECT_EQ(latest->checkpoint->step, 10);
  }
  // Later writes succeed again.
  EXPECT_TRUE(SaveCheckpoint(storage, "/c", layout, 20, 4, 0, state).ok());
  EXPECT_EQ(LatestValid(storage, "/c")->checkpoint->step, 20);
}

TEST(FakeStorageTest, CorruptionInjectors) {
  FakeCheckpointStorage storage;
  ASSERT_TRUE(storage.WriteFileAtomic("/a/f", std::string_view("abcdef")).ok());
  ASSERT_TRUE(storage.FlipByte("/a/f", 1).ok());
  EXPECT_EQ(*storage.Read("/a/f"), std::string("a") + static_cast<char>(~'b') + "cdef");
  ASSERT_TRUE(storage.Truncate("/a/f", 2).ok());
  EXPECT_EQ(storage.Read("/a/f")->size(), 2u);
  EXPECT_TRUE(absl::IsInvalidArgument(storage.FlipByte("/a/f", 2)));
  EXPECT_TRUE(absl::IsInvalidArgument(storage.Truncate("/a/f", 3)));
  EXPECT_TRUE(absl::IsNotFound(storage.FlipByte("/a/g", 0)));
}

TEST(FileStorageTest, FailedWriteLeavesTargetAndNoTempFile) {
  std::string tmpl = JoinPath(::testing::TempDir(), "checkpoint_fs.XXXXXX");
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  FileCheckpointStorage storage;
  // The target is a non-empty directory: the rename at the end must fail.
  const std::string target = JoinPath(tmpl, "target");
  ASSERT_TRUE(storage.WriteFileAtomic(JoinPath(target, "inside"), std::string_view("x")).ok());
  absl::Status s = storage.WriteFileAtomic(target, std::string_view("new contents"));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(target));
  EXPECT_EQ(*storage.List(tmpl), (std::vector<std::string>{"target"}));  // no temp left
  EXPECT_EQ(*storage.Read(JoinPath(target, "inside")), "x");
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace shardtrain::checkpoint
