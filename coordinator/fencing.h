// Secrets that fence workers from each other and from other clients: the
// lease token of every (job, generation) assignment and the secret bound to
// every worker id. Both are HMAC-SHA256 of a 256-bit random key the
// coordinator keeps in its state directory, truncated to 128 bits (32 hex
// digits): unpredictable without the key, and the same after a coordinator
// restart, so running ranks keep reporting. Nothing derived from them is
// ever stored with a job or a worker, so no List/Get/Watch call can leak one.
//
// Thread-safe (immutable after construction).
#ifndef SHARDTRAIN_COORDINATOR_FENCING_H_
#define SHARDTRAIN_COORDINATOR_FENCING_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardtrain::coordinator {

class FencingKey {
 public:
  // kKeyBytes fresh random bytes (OpenSSL's RAND_bytes).
  static FencingKey Random();
  // The key stored at `path` (raw kKeyBytes bytes); creates it (mode 0600,
  // written atomically) when absent. INVALID_ARGUMENT for a file of another
  // size, the OS error otherwise.
  static absl::StatusOr<FencingKey> LoadOrCreate(const std::string& path);
  // A key kept elsewhere (etcd: EtcdFencingKey): INVALID_ARGUMENT unless it
  // is kKeyBytes bytes.
  static absl::StatusOr<FencingKey> FromBytes(std::string key);
  // Its raw bytes, to store it (a secret: never log it).
  const std::string& bytes() const { return key_; }

  // The lease token of generation `generation` of `job_id`.
  std::string LeaseToken(absl::string_view job_id, int64_t generation) const;
  // The registration secret of `worker_id`.
  std::string WorkerSecret(absl::string_view worker_id) const;

  static constexpr size_t kKeyBytes = 32;

 private:
  explicit FencingKey(std::string key) : key_(std::move(key)) {}
  std::string Mac(absl::string_view message) const;

  std::string key_;
};

// a == b in time that depends only on their lengths (for secrets).
bool SecretEquals(absl::string_view a, absl::string_view b);

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_FENCING_H_
