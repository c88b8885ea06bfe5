// `shardtrain sample`: generate text from trained weights, with the byte
// tokenizer (vocab 256) or GPT-2's (vocab >= 50257).
#ifndef SHARDTRAIN_CLIENT_SAMPLE_H_
#define SHARDTRAIN_CLIENT_SAMPLE_H_

#include <cstdint>
#include <string>

#include "client/commands.h"

namespace shardtrain::client {

struct SampleOptions {
  std::string checkpoint;  // a weights file, or a directory holding final.weights
  std::string prompt = "\n";
  int tokens = 200;          // new tokens to generate
  double temperature = 0.8;  // 0 = greedy
  uint64_t seed = 1;
  int threads = 1;
  std::string vocab;  // GPT-2's vocabulary folder (LoadGpt2Vocabulary when empty)
};

int Sample(const GlobalFlags& g, const SampleOptions& o);

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_SAMPLE_H_
