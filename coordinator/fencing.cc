#include "coordinator/fencing.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/process.h"

namespace shardtrain::coordinator {

FencingKey FencingKey::Random() {
  std::string key(kKeyBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), kKeyBytes) != 1) {
    // No entropy means no secrets: refusing to run beats predictable tokens.
    throw std::runtime_error("RAND_bytes failed: no randomness for the fencing key");
  }
  return FencingKey(std::move(key));
}

absl::StatusOr<FencingKey> FencingKey::FromBytes(std::string key) {
  if (key.size() != kKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a fencing key is ", kKeyBytes, " bytes, not ", key.size()));
  }
  return FencingKey(std::move(key));
}

absl::StatusOr<FencingKey> FencingKey::LoadOrCreate(const std::string& path) {
  std::string key;
  absl::Status read = ReadFile(path, &key);
  if (read.ok()) {
    if (key.size() != kKeyBytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": the fencing key must be ", kKeyBytes,
                                                     " bytes, found ", key.size()));
    }
    return FencingKey(std::move(key));
  }
  if (!absl::IsNotFound(read)) return read;
  FencingKey fresh = Random();
  // Created 0600 from the start (never readable by others), then renamed.
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::UnavailableError(absl::StrCat(tmp, ": ", std::strerror(errno)));
  const bool written = ::write(fd, fresh.key_.data(), kKeyBytes) == kKeyBytes && ::fsync(fd) == 0;
  ::close(fd);
  if (!written || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return absl::UnavailableError(absl::StrCat(path, ": cannot write the fencing key"));
  }
  return fresh;
}

std::string FencingKey::Mac(absl::string_view message) const {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len);
  // 128 bits are plenty against guessing; hex keeps them printable in protos.
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(out), 16));
}

std::string FencingKey::LeaseToken(absl::string_view job_id, int64_t generation) const {
  return Mac(absl::StrCat("lease\n", job_id, "\n", generation));
}

std::string FencingKey::WorkerSecret(absl::string_view worker_id) const {
  return Mac(absl::StrCat("worker\n", worker_id));
}

bool SecretEquals(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace shardtrain::coordinator
