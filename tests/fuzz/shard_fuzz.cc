// libFuzzer target: the checkpoint shard file reader (DecodeShard, and
// ReadShard over an in-memory storage). The first input byte picks the mode:
// odd, the rest is decoded as it is; even, its trailing 8-byte CRC-64 is
// rewritten to match, so the fuzzer reaches the header and section parsers.
// A shard that decodes must encode to bytes that decode to the same contents
// (not necessarily to the input: readers ignore the reserved header words).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "worker/checkpoint/crc64.h"
#include "worker/checkpoint/fake_storage.h"
#include "worker/checkpoint/shard_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardtrain::checkpoint;
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0 && bytes.size() >= 8) {
    const uint64_t crc = Crc64(bytes.data(), bytes.size() - 8);
    std::memcpy(bytes.data() + bytes.size() - 8, &crc, 8);  // little-endian host
  }
  absl::StatusOr<ShardContents> c = DecodeShard(bytes, "fuzz/rank-0.shard");
  FakeCheckpointStorage storage;
  if (storage.WriteFileAtomic("step-1/rank-0.shard", bytes).ok()) {
    absl::StatusOr<ShardContents> read = ReadShard(storage, "step-1/rank-0.shard");
    if (read.ok() != c.ok()) {
      std::cerr << "ReadShard and DecodeShard disagree" << std::endl;
      std::abort();
    }
  }
  if (!c.ok()) return 0;
  absl::StatusOr<std::string> again = EncodeShard(*c);
  if (!again.ok()) {
    std::cerr << "a decoded shard does not encode: " << again.status() << std::endl;
    std::abort();
  }
  absl::StatusOr<ShardContents> c2 = DecodeShard(*again, "fuzz/again.shard");
  absl::StatusOr<std::string> again2 = c2.ok() ? EncodeShard(*c2) : c2.status();
  if (!again2.ok() || *again2 != *again) {
    std::cerr << "a re-encoded shard does not decode to the same contents: "
              << (again2.ok() ? "different bytes" : again2.status().ToString()) << std::endl;
    std::abort();
  }
  return 0;
}
