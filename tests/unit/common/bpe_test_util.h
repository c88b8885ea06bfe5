// Shared by the BPE tests (bpe_test, sp_bpe_test): files read whole, a
// scratch folder per test program, the JavaScript reference's ids
// (@lenml/tokenizers run by node: tests/tools/bpe_reference.js) and the
// comparison of ours against them, and SHA-256 of a pinned file.
#ifndef SHARDTRAIN_TESTS_UNIT_COMMON_BPE_TEST_UTIL_H_
#define SHARDTRAIN_TESTS_UNIT_COMMON_BPE_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/bpe.h"
#include "common/process.h"

#ifndef SHARDTRAIN_SOURCE_DIR
#error "SHARDTRAIN_SOURCE_DIR must be defined by CMake"
#endif

namespace shardtrain::bpe_test {

namespace fs = std::filesystem;

inline std::string ReadAll(const fs::path& p) {
  std::string out;
  ReadFile(p.string(), &out).IgnoreError();
  return out;
}

// A scratch folder of this test program ("<prefix><pid>" under the temp
// directory), removed at exit.
inline const fs::path& Scratch(const char* prefix) {
  static const fs::path dir = [prefix] {
    static const fs::path d =
        fs::temp_directory_path() / (std::string(prefix) + std::to_string(getpid()));
    fs::create_directories(d);
    std::atexit([] { fs::remove_all(d); });
    return d;
  }();
  return dir;
}

// The reference's ids for `text` (valid UTF-8) under `tokenizer` (a
// tokenizer.json, or gpt2:DIR), added tokens in the text parsed; the
// reference writes its seconds first, then the ids. `scratch`: where the
// text and ids go.
inline std::vector<int> ReferenceIds(const fs::path& scratch, const std::string& tokenizer,
                                     const std::string& text) {
  const fs::path in = scratch / "in.txt", out = scratch / "ids.txt";
  { std::ofstream(in, std::ios::binary) << text; }
  fs::remove(out);
  const std::string cmd = "node " SHARDTRAIN_SOURCE_DIR "/tests/tools/bpe_reference.js '" +
                          tokenizer + "' '" + in.string() + "' '" + out.string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::istringstream ids(ReadAll(out));
  double seconds = 0;
  ids >> seconds;
  std::vector<int> v;
  for (int id; ids >> id;) v.push_back(id);
  return v;
}

// Ours (specials parsed, as the reference does) equal the reference's; a
// difference prints the tokens around the first one as each side split
// them. Prints "[<tag>] <what>: N bytes -> M ids, equal ...: yes|NO".
inline void ExpectReferenceIds(const fs::path& scratch, const ByteLevelBpe& bpe,
                               const std::string& tokenizer, const std::string& text,
                               const char* what, const char* tag) {
  ByteLevelBpe::Cache cache;
  ByteLevelBpe::EncodeOptions parse;
  parse.specials = ByteLevelBpe::Specials::kParse;
  const std::vector<int> ours = bpe.Encode(text, &cache, parse);
  const std::vector<int> reference = ReferenceIds(scratch, tokenizer, text);
  ASSERT_FALSE(reference.empty()) << what;
  size_t first_diff = 0;
  while (first_diff < ours.size() && first_diff < reference.size() &&
         ours[first_diff] == reference[first_diff]) {
    ++first_diff;
  }
  EXPECT_EQ(ours.size(), reference.size()) << what;
  if (first_diff < ours.size() || first_diff < reference.size()) {
    auto around = [&](const std::vector<int>& ids) {
      std::string out;
      for (size_t i = first_diff < 3 ? 0 : first_diff - 3; i < ids.size() && i < first_diff + 4;
           ++i) {
        absl::StatusOr<std::string> t = bpe.Decode({ids[i]});
        out += "[" + std::to_string(ids[i]) + " " + (t.ok() ? *t : "?") + "]";
      }
      return out;
    };
    ADD_FAILURE() << what << ": ids differ first at token " << first_diff
                  << "\n  ours:      " << around(ours) << "\n  reference: " << around(reference);
  }
  std::printf("[%s] %s: %zu bytes -> %zu ids, equal to @lenml/tokenizers': %s\n", tag, what,
              text.size(), ours.size(), ours == reference ? "yes" : "NO");
  EXPECT_EQ(bpe.Encode(text, &cache, parse), ours) << what << " (from the cache)";
}

inline std::string Sha256(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &n, EVP_sha256(), nullptr);
  std::string hex;
  char b[3];
  for (unsigned int i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", digest[i]);
    hex += b;
  }
  return hex;
}

}  // namespace shardtrain::bpe_test

#endif  // SHARDTRAIN_TESTS_UNIT_COMMON_BPE_TEST_UTIL_H_
