// moe_bench: the training step (forward + backward, one rank, the CPU
// engine) of a Mixture-of-Experts model next to a dense model with the same
// active parameters, measured in the same run, alternating: Llama blocks of
// dim C whose MLP is E SwiGLU experts of He with top K, against one SwiGLU
// MLP of K·He (the same matmul FLOPs per token; the MoE adds the router,
// the permutation and the combine). Prints tokens/s of each and the ratio
// (the goal: MoE step <= 1.3 × the dense one). Not a test.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/bench_util.h"
#include "common/model/config.h"
#include "worker/engine/cpu/cpu_model.h"

namespace shardtrain::bench {
namespace {

struct Result {
  double median_ms = 0;
  size_t params = 0;
};

int Main(int argc, char** argv) {
  CLI::App app(
      "moe_bench: an MoE model's training step next to a dense one's of the same "
      "active parameters (CPU engine, one rank)");
  int dim = 256, layers = 4, experts = 8, top_k = 2, expert_ffn = 256, B = 8, T = 128, threads = 2,
      steps = 10;
  app.add_option("--dim", dim, "model width C");
  app.add_option("--layers", layers, "layers");
  app.add_option("--experts", experts, "experts E per MoE layer");
  app.add_option("--top-k", top_k, "experts per token K");
  app.add_option("--expert-ffn", expert_ffn, "an expert's hidden width He");
  app.add_option("--batch", B, "sequences per micro-batch");
  app.add_option("--seq-len", T, "tokens per sequence");
  app.add_option("--threads", threads, "compute threads");
  app.add_option("--steps", steps, "timed steps of each model");
  CLI11_PARSE(app, argc, argv);

  model::LlamaShape shape{layers, 4, 2, dim, top_k * expert_ffn, T, 256, 10000, 1e-5, false};
  const model::ModelConfig dense = *model::MakeLlamaConfig(shape);
  shape.moe = {experts, top_k, expert_ffn};
  const model::ModelConfig moe = *model::MakeLlamaConfig(shape);
  std::printf("moe_bench: %s\n", Uptime().c_str());
  std::printf("dense: %s\nmoe:   %s\n", model::ToString(dense).c_str(),
              model::ToString(moe).c_str());
  std::printf("B=%d T=%d threads=%d, %d timed steps each (alternating), after 2 warm-up steps\n", B,
              T, threads, steps);

  std::vector<std::unique_ptr<engine::cpu::CpuModel>> models;
  for (const model::ModelConfig* c : {&dense, &moe}) {
    auto m = engine::cpu::CpuModel::Create(*c, B, T, threads);
    if (!m.ok()) {
      std::fprintf(stderr, "%s\n", std::string(m.status().message()).c_str());
      return 1;
    }
    (*m)->InitParams(1);
    models.push_back(std::move(*m));
  }
  std::mt19937 rng(3);
  std::vector<int> tokens(size_t(B) * T), targets(size_t(B) * T);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = int(rng() % 256);
    targets[i] = int(rng() % 256);
  }
  std::vector<std::vector<double>> ms(2);
  for (int step = 0; step < steps + 2; ++step) {
    for (int k = 0; k < 2; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      models[k]->ZeroGrad();
      models[k]->Forward(tokens.data(), targets.data());
      models[k]->Backward();
      const double t =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (step >= 2) ms[k].push_back(t);
    }
  }
  const engine::MoeStats st = models[1]->TakeMoeStats();
  double max_load = 0;
  for (const auto& load : st.load) {
    int64_t sum = 0, most = 0;
    for (int64_t n : load) sum += n, most = std::max(most, n);
    max_load = std::max(max_load, double(most) * load.size() / std::max<int64_t>(sum, 1));
  }
  const double tokens_per_step = double(B) * T;
  const char* names[] = {"dense", "moe"};
  double med[2];
  for (int k = 0; k < 2; ++k) {
    med[k] = Percentile(ms[k], 0.5);
    std::printf(
        "%-6s params %10zu (active %10lld)  step median %8.2f ms (p90 %8.2f)  %9.0f tok/s\n",
        names[k], models[k]->layout().num_params(),
        static_cast<long long>(model::ActiveModelParams(k == 0 ? dense : moe)), med[k],
        Percentile(ms[k], 0.9), tokens_per_step / med[k] * 1000);
  }
  std::printf(
      "moe / dense step time: %.3f (goal <= 1.3); router load max/mean %.2f, load avg %.2f\n",
      med[1] / med[0], max_load, LoadAverage1());
  return 0;
}

}  // namespace
}  // namespace shardtrain::bench

int main(int argc, char** argv) { return shardtrain::bench::Main(argc, argv); }
