#include "client/sample.h"

#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "client/output.h"
#include "worker/data/tokens.h"
#include "worker/model/generate.h"
#include "worker/model/gpt.h"
#include "worker/model/weights_file.h"

namespace shardtrain::client {

int Sample(const GlobalFlags& g, const SampleOptions& o) {
  std::string path = o.checkpoint;
  if (std::filesystem::is_directory(path)) path += "/final.weights";
  auto weights = model::LoadWeights(path);
  if (!weights.ok()) return ReportError(g, absl::InvalidArgumentError(weights.status().message()));
  if (weights->config.vocab != 256) {
    return ReportError(g, absl::InvalidArgumentError(absl::StrCat(
                              path, ": vocab ", weights->config.vocab,
                              " — sampling text needs the byte tokenizer (vocab 256)")));
  }
  const int T = weights->config.context;
  auto model = model::Gpt::Create(weights->config, 1, T, o.threads);
  if (!model.ok()) return ReportError(g, model.status());
  std::copy(weights->params.begin(), weights->params.end(), (*model)->params().begin());
  model::GenerateOptions go;
  go.max_new_tokens = o.tokens;
  go.temperature = static_cast<float>(o.temperature);
  go.seed = o.seed;
  std::vector<int> prompt = data::EncodeBytes(o.prompt.empty() ? "\n" : o.prompt);
  auto out = model::Generate(**model, prompt, go);
  if (!out.ok()) return ReportError(g, out.status());
  const std::string text = data::DecodeBytes(*out);
  if (g.output == "json") {
    std::cout << "{\"checkpoint\": " << JsonString(path) << ", \"prompt\": " << JsonString(o.prompt)
              << ", \"text\": " << JsonString(text) << "}" << std::endl;
  } else {
    std::cout << text << std::endl;
  }
  return 0;
}

}  // namespace shardtrain::client
