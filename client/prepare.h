// `shardtrain prepare`: text files or directories -> llm.c token shards for
// data.format: llmc (worker/data/prepare.h), with progress on stderr and a
// summary on stdout.
#ifndef SHARDTRAIN_CLIENT_PREPARE_H_
#define SHARDTRAIN_CLIENT_PREPARE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "client/commands.h"

namespace shardtrain::client {

struct PrepareFlags {
  std::vector<std::string> inputs;
  std::vector<std::string> val;  // held-out inputs (--val)
  double val_fraction = 0;
  std::string out;
  std::string tokenizer = "gpt2";  // gpt2 | llama3 | byte
  std::string tokenizer_json;      // any tokenizer.json (instead of --tokenizer)
  std::string vocab;               // the named tokenizer's files (LoadTokenizer's path)
  int64_t shard_tokens = 100'000'000;
  int threads = 1;
};

int Prepare(const GlobalFlags& g, const PrepareFlags& f);

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_PREPARE_H_
