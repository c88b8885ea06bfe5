#include "worker/checkpoint/shard_file.h"

#include <cstring>
#include <filesystem>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "worker/checkpoint/crc64.h"

namespace shardtrain::checkpoint {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "shard files are little-endian");
static_assert(sizeof(float) == 4 && sizeof(double) == 8, "fp32/fp64 expected");

constexpr char kMagic[8] = {'S', 'T', 'S', 'H', 'A', 'R', 'D', '\0'};
constexpr char kParamsTag[4] = {'P', 'A', 'R', 'M'};
constexpr char kMTag[4] = {'A', 'D', 'M', 'M'};
constexpr char kVTag[4] = {'A', 'D', 'M', 'V'};
constexpr char kScalarsTag[4] = {'S', 'C', 'A', 'L'};
constexpr uint64_t kScalarsBytes = 32;
constexpr size_t kFixedHeaderBytes = 8 + 4 + 4 + 8 + 4 + 4 + 8 + 8 + 4 + 4;

class Writer {
 public:
  template <typename T>
  void Put(T value) {
    out_.append(reinterpret_cast<const char*>(&value), sizeof value);
  }
  void PutBytes(const void* data, size_t n) { out_.append(static_cast<const char*>(data), n); }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

// Bounds-checked reads from a byte string; every getter returns false (and
// reads nothing) when fewer bytes remain than asked for.
class Reader {
 public:
  Reader(const std::string& bytes, size_t end) : data_(bytes.data()), end_(end) {}
  template <typename T>
  bool Get(T* value) {
    return GetBytes(value, sizeof *value);
  }
  bool GetBytes(void* out, size_t n) {
    if (remaining() < n) return false;
    if (n == 0) return true;  // `out` may be null (an empty vector's data())
    std::memcpy(out, data_ + pos_, n);
    pos_ += n;
    return true;
  }
  size_t remaining() const { return end_ - pos_; }
  size_t pos() const { return pos_; }

 private:
  const char* data_;
  size_t end_;
  size_t pos_ = 0;
};

uint64_t TotalSize(const std::vector<FlatRange>& ranges) {
  uint64_t n = 0;
  for (const FlatRange& r : ranges) n += r.size();
  return n;
}

void PutSection(Writer& w, const char (&tag)[4], const void* data, uint64_t bytes) {
  w.PutBytes(tag, 4);
  w.Put<uint32_t>(0);
  w.Put<uint64_t>(bytes);
  w.PutBytes(data, bytes);
}

}  // namespace

bool operator==(const FlatRange& a, const FlatRange& b) {
  return a.begin == b.begin && a.end == b.end;
}

std::string ToString(const FlatRange& r) { return absl::StrCat("[", r.begin, ", ", r.end, ")"); }

FlatRange EvenSplit(uint64_t num_params, int world, int rank) {
  const uint64_t w = static_cast<uint64_t>(world), r = static_cast<uint64_t>(rank);
  const uint64_t base = num_params / w, extra = num_params % w;
  const uint64_t begin = r * base + (r < extra ? r : extra);
  return FlatRange{begin, begin + base + (r < extra ? 1 : 0)};
}

bool operator==(const TrainingScalars& a, const TrainingScalars& b) {
  // loss_scale compared bitwise: it was written and read back, not computed.
  return a.optimizer_step == b.optimizer_step && a.data_position == b.data_position &&
         a.rng_seed == b.rng_seed && std::memcmp(&a.loss_scale, &b.loss_scale, sizeof(double)) == 0;
}

std::string ShardFileName(int rank) { return absl::StrCat("rank-", rank, ".shard"); }

absl::Status ValidateRanges(const std::vector<FlatRange>& ranges, uint64_t num_params) {
  uint64_t prev_end = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const FlatRange& r = ranges[i];
    if (r.begin > r.end || r.end > num_params) {
      return absl::InvalidArgumentError(
          absl::StrCat("range ", i, " ", ToString(r), " is not inside [0, ", num_params, ")"));
    }
    if (i > 0 && r.begin < prev_end) {
      return absl::InvalidArgumentError(
          absl::StrCat("range ", i, " ", ToString(r),
                       " overlaps or precedes the previous one (ranges must be "
                       "sorted and disjoint)"));
    }
    prev_end = r.end;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> EncodeShard(const ShardContents& c) {
  if (c.world < 1 || c.rank < 0 || c.rank >= c.world) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard of rank ", c.rank, " in world ", c.world, ": rank outside [0, world)"));
  }
  if (absl::Status s = ValidateRanges(c.ranges, c.num_params); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("shard of rank ", c.rank, ": ", s.message()));
  }
  const uint64_t n = TotalSize(c.ranges);
  if (c.params.size() != n || c.m.size() != n || c.v.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard of rank ", c.rank, ": ranges hold ", n, " elements but params/m/v have ",
        c.params.size(), "/", c.m.size(), "/", c.v.size()));
  }
  Writer w;
  w.out().reserve(kFixedHeaderBytes + 16 * c.ranges.size() + 4 * 16 + 3 * 4 * n + kScalarsBytes +
                  8);
  w.PutBytes(kMagic, sizeof kMagic);
  w.Put<uint32_t>(kShardVersion);
  w.Put<uint32_t>(0);
  w.Put<int64_t>(c.step);
  w.Put<int32_t>(c.rank);
  w.Put<int32_t>(c.world);
  w.Put<uint64_t>(c.layout_fingerprint);
  w.Put<uint64_t>(c.num_params);
  w.Put<uint32_t>(static_cast<uint32_t>(c.ranges.size()));
  w.Put<uint32_t>(0);
  for (const FlatRange& r : c.ranges) {
    w.Put<uint64_t>(r.begin);
    w.Put<uint64_t>(r.end);
  }
  PutSection(w, kParamsTag, c.params.data(), 4 * n);
  PutSection(w, kMTag, c.m.data(), 4 * n);
  PutSection(w, kVTag, c.v.data(), 4 * n);
  Writer scalars;
  scalars.Put<int64_t>(c.scalars.optimizer_step);
  scalars.Put<int64_t>(c.scalars.data_position);
  scalars.Put<uint64_t>(c.scalars.rng_seed);
  scalars.Put<double>(c.scalars.loss_scale);
  PutSection(w, kScalarsTag, scalars.out().data(), kScalarsBytes);
  const uint64_t crc = Crc64(w.out().data(), w.out().size());
  w.Put<uint64_t>(crc);
  return std::move(w.out());
}

uint64_t StoredChecksum(const std::string& bytes) {
  uint64_t crc = 0;
  if (bytes.size() >= 8) std::memcpy(&crc, bytes.data() + bytes.size() - 8, 8);
  return crc;
}

absl::StatusOr<ShardContents> DecodeShard(const std::string& bytes, const std::string& name) {
  auto loss = [&name](const std::string& why) {
    return absl::DataLossError(absl::StrCat("checkpoint shard ", name, ": ", why));
  };
  if (bytes.size() < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    return loss(bytes.size() < sizeof kMagic ? "truncated (no header)"
                                             : "bad magic (not a shard file)");
  }
  // The body is everything but the trailing checksum.
  const size_t body_end = bytes.size() >= 8 ? bytes.size() - 8 : 0;
  Reader r(bytes, body_end);
  char magic[8];
  uint32_t version = 0, reserved = 0, num_ranges = 0;
  int32_t rank = 0, world = 0;
  ShardContents c;
  if (!r.GetBytes(magic, sizeof magic) || !r.Get(&version)) return loss("truncated (no header)");
  if (version != kShardVersion) {
    return loss(
        absl::StrCat("unsupported version ", version, " (this build reads ", kShardVersion, ")"));
  }
  if (!r.Get(&reserved) || !r.Get(&c.step) || !r.Get(&rank) || !r.Get(&world) ||
      !r.Get(&c.layout_fingerprint) || !r.Get(&c.num_params) || !r.Get(&num_ranges) ||
      !r.Get(&reserved)) {
    return loss("truncated (incomplete header)");
  }
  c.rank = rank;
  c.world = world;
  if (r.remaining() / 16 < num_ranges) return loss("truncated (incomplete range table)");
  c.ranges.resize(num_ranges);
  for (FlatRange& fr : c.ranges) {
    r.Get(&fr.begin);
    r.Get(&fr.end);
  }
  // A checksum mismatch caused by a flipped byte in the header could show up
  // below as a bogus "malformed" message; it is DataLoss naming the file either way.
  if (absl::Status s = ValidateRanges(c.ranges, c.num_params); !s.ok()) {
    return loss(absl::StrCat("malformed range table: ", s.message()));
  }
  const uint64_t n = TotalSize(c.ranges);
  if (n > body_end / 12) return loss(absl::StrCat("truncated (the ranges hold ", n, " elements)"));
  struct Section {
    const char* tag;
    uint64_t bytes;
    void* out;
  };
  std::string scalars(kScalarsBytes, '\0');
  const Section sections[] = {{kParamsTag, 4 * n, nullptr},
                              {kMTag, 4 * n, nullptr},
                              {kVTag, 4 * n, nullptr},
                              {kScalarsTag, kScalarsBytes, scalars.data()}};
  std::vector<float>* arrays[] = {&c.params, &c.m, &c.v};
  for (int i = 0; i < 4; ++i) {
    const Section& sec = sections[i];
    char tag[4];
    uint64_t length = 0;
    if (!r.GetBytes(tag, 4) || !r.Get(&reserved) || !r.Get(&length)) {
      return loss(absl::StrCat("truncated (section ", std::string(sec.tag, 4), " missing)"));
    }
    if (std::memcmp(tag, sec.tag, 4) != 0) {
      return loss(absl::StrCat("malformed: expected section ", std::string(sec.tag, 4)));
    }
    if (length != sec.bytes) {
      return loss(absl::StrCat("malformed: section ", std::string(sec.tag, 4), " has ", length,
                               " bytes, the range table implies ", sec.bytes));
    }
    if (r.remaining() < length) {
      return loss(absl::StrCat("truncated (section ", std::string(sec.tag, 4), " incomplete)"));
    }
    void* out = sec.out;
    if (i < 3) {
      arrays[i]->resize(n);
      out = arrays[i]->data();
    }
    r.GetBytes(out, length);
  }
  if (bytes.size() < r.pos() + 8) return loss("truncated (no checksum)");
  if (bytes.size() > r.pos() + 8) {
    return loss(
        absl::StrCat("malformed: ", bytes.size() - r.pos() - 8, " unexpected trailing bytes"));
  }
  const uint64_t computed = Crc64(bytes.data(), body_end);
  if (computed != StoredChecksum(bytes)) return loss("checksum mismatch (corrupted)");
  if (c.world < 1 || c.rank < 0 || c.rank >= c.world) {
    return loss(absl::StrCat("malformed: rank ", c.rank, " in world ", c.world));
  }
  std::memcpy(&c.scalars.optimizer_step, scalars.data(), 8);
  std::memcpy(&c.scalars.data_position, scalars.data() + 8, 8);
  std::memcpy(&c.scalars.rng_seed, scalars.data() + 16, 8);
  std::memcpy(&c.scalars.loss_scale, scalars.data() + 24, 8);
  return c;
}

absl::StatusOr<ShardFileInfo> WriteShard(CheckpointStorage& storage, const std::string& path,
                                         const ShardContents& contents) {
  absl::StatusOr<std::string> bytes = EncodeShard(contents);
  if (!bytes.ok()) return bytes.status();
  if (absl::Status s = CheckRoomFor(storage, path, bytes->size()); !s.ok()) return s;
  if (absl::Status s = storage.WriteFileAtomic(path, std::string_view(*bytes)); !s.ok()) return s;
  ShardFileInfo info;
  info.rank = contents.rank;
  info.file = std::filesystem::path(path).filename().string();
  info.ranges = contents.ranges;
  info.bytes = bytes->size();
  info.checksum = StoredChecksum(*bytes);
  return info;
}

absl::StatusOr<ShardContents> ReadShard(CheckpointStorage& storage, const std::string& path) {
  absl::StatusOr<std::string> bytes = storage.Read(path);
  if (!bytes.ok()) return bytes.status();
  return DecodeShard(*bytes, path);
}

}  // namespace shardtrain::checkpoint
