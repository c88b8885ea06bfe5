// GPT-2's vocabulary for tests: loaded once per test program from where
// scripts/setup installs it (LoadGpt2Vocabulary); a missing vocabulary fails
// the test program naming what to run.
#ifndef SHARDTRAIN_TESTS_UNIT_COMMON_GPT2_TEST_UTIL_H_
#define SHARDTRAIN_TESTS_UNIT_COMMON_GPT2_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdlib>

#include "common/tokenizers.h"

namespace shardtrain::testing {

inline const ByteLevelBpe& TestGpt2Bpe() {
  static const ByteLevelBpe* bpe = [] {
    auto b = LoadGpt2Vocabulary();
    if (!b.ok()) {
      ADD_FAILURE() << b.status() << " (scripts/setup installs GPT-2's vocabulary)";
      std::abort();
    }
    return b->release();
  }();
  return *bpe;
}

}  // namespace shardtrain::testing

#endif  // SHARDTRAIN_TESTS_UNIT_COMMON_GPT2_TEST_UTIL_H_
