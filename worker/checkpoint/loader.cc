#include "worker/checkpoint/loader.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"

namespace shardtrain::checkpoint {
namespace {

// Reads shard `rank` of the checkpoint and verifies it against the manifest.
absl::StatusOr<ShardContents> ReadVerifiedShard(CheckpointStorage& storage,
                                                const std::string& step_dir,
                                                const Manifest& manifest, int rank) {
  const ShardFileInfo& info = manifest.shards[rank];
  const std::string path = JoinPath(step_dir, info.file);
  absl::StatusOr<std::string> bytes = storage.Read(path);
  if (!bytes.ok()) {
    if (absl::IsNotFound(bytes.status())) {
      return absl::DataLossError(
          absl::StrCat("checkpoint shard ", path, " is missing (listed in the manifest)"));
    }
    return bytes.status();
  }
  auto loss = [&path](const std::string& why) {
    return absl::DataLossError(absl::StrCat("checkpoint shard ", path, ": ", why));
  };
  if (bytes->size() != info.bytes) {
    return loss(absl::StrCat(bytes->size() < info.bytes ? "truncated" : "too long", " (",
                             bytes->size(), " bytes, the manifest says ", info.bytes, ")"));
  }
  if (StoredChecksum(*bytes) != info.checksum) {
    return loss("checksum differs from the manifest's (corrupted or replaced)");
  }
  absl::StatusOr<ShardContents> c = DecodeShard(*bytes, path);
  if (!c.ok()) return c.status();
  if (c->rank != rank || c->world != manifest.world || c->step != manifest.step ||
      c->layout_fingerprint != manifest.layout_fingerprint ||
      c->num_params != manifest.num_params || c->ranges != info.ranges) {
    return loss(absl::StrCat("header (rank ", c->rank, ", world ", c->world, ", step ", c->step,
                             ") does not match the manifest (rank ", rank, ", world ",
                             manifest.world, ", step ", manifest.step, ", or layout/ranges)"));
  }
  return c;
}

}  // namespace

absl::StatusOr<LoadedState> LoadRanges(CheckpointStorage& storage, const std::string& step_dir,
                                       const Manifest& manifest,
                                       absl::Span<const FlatRange> ranges) {
  LoadedState out;
  out.ranges.assign(ranges.begin(), ranges.end());
  out.step = manifest.step;
  std::vector<uint64_t> out_offset;  // where each requested range starts in out
  uint64_t total = 0;
  for (const FlatRange& r : ranges) {
    if (r.begin > r.end || r.end > manifest.num_params) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LoadRanges: range ", ToString(r), " is not inside [0, ", manifest.num_params, ")"));
    }
    out_offset.push_back(total);
    total += r.size();
  }
  out.params.resize(total);
  out.m.resize(total);
  out.v.resize(total);

  // Shards overlapping any requested range; shard 0 if none (for the scalars).
  std::vector<int> needed;
  for (int rank = 0; rank < manifest.world; ++rank) {
    bool overlaps = false;
    for (const FlatRange& sr : manifest.shards[rank].ranges) {
      for (const FlatRange& r : ranges) {
        overlaps = overlaps || (std::max(sr.begin, r.begin) < std::min(sr.end, r.end));
      }
    }
    if (overlaps) needed.push_back(rank);
  }
  if (needed.empty()) needed.push_back(0);

  std::optional<TrainingScalars> scalars;
  int scalars_rank = 0;
  uint64_t copied = 0;
  for (int rank : needed) {
    absl::StatusOr<ShardContents> shard = ReadVerifiedShard(storage, step_dir, manifest, rank);
    if (!shard.ok()) return shard.status();
    if (!scalars) {
      scalars = shard->scalars;
      scalars_rank = rank;
    } else if (!(*scalars == shard->scalars)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", step_dir, ": shards ", manifest.shards[scalars_rank].file,
                       " and ", manifest.shards[rank].file,
                       " disagree on the training scalars (step/data position/"
                       "seed/loss scale)"));
    }
    uint64_t shard_offset = 0;  // of the current shard range inside the shard's arrays
    for (const FlatRange& sr : shard->ranges) {
      for (size_t k = 0; k < ranges.size(); ++k) {
        const uint64_t lo = std::max(sr.begin, ranges[k].begin);
        const uint64_t hi = std::min(sr.end, ranges[k].end);
        if (lo >= hi) continue;
        const uint64_t src = shard_offset + (lo - sr.begin);
        const uint64_t dst = out_offset[k] + (lo - ranges[k].begin);
        const size_t bytes = (hi - lo) * sizeof(float);
        std::memcpy(out.params.data() + dst, shard->params.data() + src, bytes);
        std::memcpy(out.m.data() + dst, shard->m.data() + src, bytes);
        std::memcpy(out.v.data() + dst, shard->v.data() + src, bytes);
        copied += hi - lo;
      }
      shard_offset += sr.size();
    }
  }
  // The manifest guarantees the shards cover [0, num_params) exactly once,
  // so every requested element was copied exactly once.
  if (copied != total) {
    return absl::InternalError(
        absl::StrCat("LoadRanges(", step_dir, "): copied ", copied, " of ", total, " elements"));
  }
  out.scalars = *scalars;
  return out;
}

absl::StatusOr<LoadedState> LoadRange(CheckpointStorage& storage, const std::string& step_dir,
                                      const Manifest& manifest, uint64_t begin, uint64_t end) {
  const FlatRange r{begin, end};
  return LoadRanges(storage, step_dir, manifest, absl::MakeConstSpan(&r, 1));
}

absl::StatusOr<LoadedState> LoadAll(CheckpointStorage& storage, const std::string& step_dir,
                                    const Manifest& manifest) {
  return LoadRange(storage, step_dir, manifest, 0, manifest.num_params);
}

absl::Status VerifyShards(CheckpointStorage& storage, const std::string& step_dir,
                          const Manifest& manifest) {
  std::optional<TrainingScalars> scalars;
  for (int rank = 0; rank < manifest.world; ++rank) {
    absl::StatusOr<ShardContents> shard = ReadVerifiedShard(storage, step_dir, manifest, rank);
    if (!shard.ok()) return shard.status();
    if (!scalars) {
      scalars = shard->scalars;
    } else if (!(*scalars == shard->scalars)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint shard ", JoinPath(step_dir, manifest.shards[rank].file),
                       ": training scalars differ from those of ", manifest.shards[0].file));
    }
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::checkpoint
