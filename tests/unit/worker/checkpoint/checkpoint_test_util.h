// Shared by the checkpoint unit tests: a small model, deterministic flat
// state, shards and checkpoints made from it, and a fixture that runs a test
// on the real filesystem and on the in-memory fake alike.
#ifndef SHARDTRAIN_TESTS_UNIT_WORKER_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
#define SHARDTRAIN_TESTS_UNIT_WORKER_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_

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
#include "common/model/config.h"
#include "common/model/param_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/checkpoint/crc64.h"
#include "worker/checkpoint/directory.h"
#include "worker/checkpoint/fake_storage.h"
#include "worker/checkpoint/loader.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/shard_file.h"
#include "worker/checkpoint/storage.h"

namespace shardtrain::checkpoint {

inline model::ModelConfig SmallConfig() {
  absl::StatusOr<model::ModelConfig> c = model::MakeGptConfig(/*layers=*/2, /*heads=*/2,
                                                              /*dim=*/16, /*context=*/16,
                                                              /*vocab=*/256);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// ---------------------------------------------------------------- helpers

// A model's full training state: params, m, v over the flat buffer. Values
// are random bit patterns plus -0, denormals, inf and NaN payloads, so only a
// bitwise comparison passes.
struct FlatState {
  std::vector<float> params, m, v;
};

inline float RandomFloat(std::mt19937& rng) {
  const uint32_t bits = rng();
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline FlatState MakeFlatState(size_t n, uint32_t seed) {
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
inline ::testing::AssertionResult Bitwise(const std::vector<float>& got,
                                          const std::vector<float>& want, uint64_t offset) {
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
inline std::vector<std::vector<FlatRange>> RankRanges(const model::ParamLayout& layout, int world,
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

inline TrainingScalars Scalars(int64_t step) {
  TrainingScalars s;
  s.optimizer_step = step;
  s.data_position = step + 1;
  s.rng_seed = 0x1234567890abcdefull;
  s.loss_scale = 32768.0 / 3.0;
  return s;
}

inline ShardContents MakeShard(const model::ParamLayout& layout, int64_t step, int world, int rank,
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

// What every rank and then rank 0 do to save step `step`: each rank writes
// its shard, rank 0 writes the manifest once all succeeded.
inline absl::Status SaveCheckpoint(CheckpointStorage& storage, const std::string& dir,
                                   const model::ParamLayout& layout, int64_t step, int world,
                                   int zero, const FlatState& state, bool commit = true) {
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

}  // namespace shardtrain::checkpoint

#endif  // SHARDTRAIN_TESTS_UNIT_WORKER_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
