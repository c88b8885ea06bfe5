// libFuzzer target: the checkpoint manifest reader (ParseManifest, and
// ReadManifest over an in-memory storage). The first input byte picks the
// mode: odd, the rest is parsed as it is (the checksum line must match); even,
// the trailing "crc64 <hex>" line is recomputed first, so the fuzzer reaches
// the record parser and ValidateManifest instead of stopping at the checksum.
// A manifest that parses must serialize to text that parses back to the same
// text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/str_format.h"
#include "worker/checkpoint/crc64.h"
#include "worker/checkpoint/fake_storage.h"
#include "worker/checkpoint/manifest.h"

namespace {

// Replaces everything from the last line starting "crc64 " with the right one.
std::string FixChecksum(std::string text) {
  const size_t at = text.rfind("\ncrc64 ");
  if (at != std::string::npos) text.resize(at + 1);
  const uint64_t crc = shardtrain::checkpoint::Crc64(text.data(), text.size());
  return text + absl::StrFormat("crc64 %016x\n", crc);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardtrain::checkpoint;
  if (size == 0) return 0;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) text = FixChecksum(std::move(text));
  absl::StatusOr<Manifest> m = ParseManifest(text, "fuzz/manifest.txt");
  FakeCheckpointStorage storage;
  if (storage.WriteFileAtomic("step-1/manifest.txt", text).ok()) {
    absl::StatusOr<Manifest> read = ReadManifest(storage, "step-1/manifest.txt");
    if (read.ok() != m.ok()) {
      std::cerr << "ReadManifest and ParseManifest disagree" << std::endl;
      std::abort();
    }
  }
  if (!m.ok()) return 0;
  const std::string again = SerializeManifest(*m);
  absl::StatusOr<Manifest> m2 = ParseManifest(again, "fuzz/again.txt");
  if (!m2.ok() || SerializeManifest(*m2) != again) {
    std::cerr << "a parsed manifest does not round-trip: "
              << (m2.ok() ? "different text" : m2.status().ToString()) << std::endl;
    std::abort();
  }
  return 0;
}
