// Helpers of the job spec tests (job_spec_test.cc, job_spec_refusals_test.cc):
// the source tree's files and a small valid spec to edit.
#ifndef SHARDTRAIN_TESTS_UNIT_COMMON_JOB_SPEC_TEST_UTIL_H_
#define SHARDTRAIN_TESTS_UNIT_COMMON_JOB_SPEC_TEST_UTIL_H_

#include <dirent.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace shardtrain::job_spec_testing {

inline const std::string kSourceDir = SHARDTRAIN_SOURCE_DIR;

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Sorted paths of the *.yaml files in `dir`.
inline std::vector<std::string> YamlFiles(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.size() > 5 && name.substr(name.size() - 5) == ".yaml") out.push_back(dir + "/" + name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// A small valid spec, one line per top-level key; tests replace or drop lines.
inline std::string Make(const std::map<std::string, std::string>& edits = {}) {
  std::vector<std::pair<std::string, std::string>> lines = {
      {"name", "t"},
      {"model", "{layers: 2, heads: 2, dim: 8, context: 16, vocab: 256}"},
      {"data", "{train: d.txt}"},
      {"batch", "{global: 4, micro: 2, seq_len: 8}"},
      {"steps", "3"},
  };
  std::map<std::string, std::string> pending = edits;
  std::string out;
  for (const auto& [key, value] : lines) {
    auto it = pending.find(key);
    if (it == pending.end()) {
      out += key + ": " + value + "\n";
    } else {
      if (it->second != "<drop>") out += key + ": " + it->second + "\n";
      pending.erase(it);
    }
  }
  for (const auto& [key, value] : pending) out += key + ": " + value + "\n";
  return out;
}

}  // namespace shardtrain::job_spec_testing

#endif  // SHARDTRAIN_TESTS_UNIT_COMMON_JOB_SPEC_TEST_UTIL_H_
