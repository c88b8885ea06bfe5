// moe_bench: the training step (forward + backward, one rank, the CPU
// engine) of a Mixture-of-Experts model next to a dense model with the same
// active parameters, measured in the same run, alternating: Llama blocks of
// dim C whose MLP is E SwiGLU experts of He with top K, against one SwiGLU
// MLP of K·He (the same matmul FLOPs per token; the MoE adds the router,
// the permutation and the combine). Prints tokens/s of each and the ratio
// (the goal: MoE step <= 1.3 × the dense one). Then, with
// --ep-ranks N (2 by default; 0 skips it), the same MoE model trains on N
// forked CPU ranks (Gloo over 127.0.0.1) with parallel {dp: N, ep: N}: the
// bytes each rank sent all-to-all per step (the ExpertParallelGroup's
// count) next to the plan's, which assumes routing in balance, with the
// step's load max/mean beside them. Not a test.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "bench/bench_ranks.h"
#include "bench/bench_util.h"
#include "common/job_spec.h"
#include "common/model/config.h"
#include "common/planner.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/rendezvous_store.h"
#include "worker/engine/cpu/cpu_model.h"
#include "worker/trainer.h"

namespace shardtrain::bench {
namespace {

struct Result {
  double median_ms = 0;
  size_t params = 0;
};

// One step's figures of one ep rank: bytes sent all-to-all, load max/mean.
struct EpStep {
  int64_t ep_bytes = 0;
  double max_load = 0;
};

// Rank `rank` of `spec` in this (forked) process: `steps` steps, each
// step's figures written to `out`.
int RunEpRank(const JobSpec& spec, int rank, const std::string& store_dir, int steps,
              const std::string& out) {
  auto fail = [&](const absl::Status& s) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return 1;
  };
  auto c = LoopbackWorld(store_dir, rank, spec.World(), "moe_bench", absl::Seconds(300));
  if (!c.ok()) return fail(c.status());
  auto trainer = worker::Trainer::Create(spec, rank, 1, c->get());
  if (!trainer.ok()) return fail(trainer.status());
  std::ofstream f(out);
  for (int step = 1; step <= steps; ++step) {
    absl::StatusOr<worker::StepResult> r = (*trainer)->Step(step);
    if (!r.ok()) return fail(r.status());
    f << r->ep_bytes << ' ' << r->moe_max_load << '\n';
  }
  if (*c != nullptr) {
    if (absl::Status s = (*c)->Shutdown(); !s.ok()) return fail(s);
  }
  return f.good() ? 0 : 1;
}

// The MoE model on `ranks` forked ranks, dp = ep = ranks: measured
// all-to-all bytes per step against the plan's.
int EpBytes(const model::ModelConfig& moe, int ranks, int B, int T, int steps) {
  const model::MoeConfig& m = moe.moe;
  const std::string yaml = absl::StrCat(
      "name: moe-bench-ep\n", "model: {arch: llama, layers: ", moe.layers, ", heads: ", moe.heads,
      ", kv_heads: ", moe.kv_heads, ", dim: ", moe.dim, ", ffn_dim: ", moe.ffn_dim,
      ", context: ", moe.context, ", vocab: 256, rope_theta: 10000, moe: {experts: ", m.experts,
      ", top_k: ", m.top_k, ", expert_ffn_dim: ", m.expert_ffn_dim, "}}\n",
      "data: {train: data/fortunes.txt}\n", "batch: {global: ", B * ranks, ", micro: ", B,
      ", seq_len: ", T, "}\n", "parallel: {dp: ", ranks, ", ep: ", ranks, "}\n", "steps: ", steps,
      "\n");
  absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml);
  if (!spec.ok()) {
    std::fprintf(stderr, "ep run: %s\n", spec.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<v1::Plan> plan = MakePlan(*spec, ranks);
  if (!plan.ok()) {
    std::fprintf(stderr, "ep run: %s\n", plan.status().ToString().c_str());
    return 1;
  }
  char tmpl[] = "/tmp/moe_bench.XXXXXX";
  const char* dir = mkdtemp(tmpl);
  if (dir == nullptr) return 1;
  const std::string store = absl::StrCat(dir, "/store");
  mkdir(store.c_str(), 0700);
  if (!ForkRanks(ranks, [&](int r) {
        return RunEpRank(*spec, r, store, steps, absl::StrCat(dir, "/rank", r));
      })) {
    std::fprintf(stderr, "ep run: a rank failed\n");
    return 1;
  }
  const double planned = double(plan->ep_comm_bytes_per_step());
  std::printf(
      "\nexpert parallelism: dp %d, ep %d (%d experts per rank), forked CPU ranks over Gloo; "
      "all-to-all bytes per step of the busiest rank, the plan's assuming routing in balance\n",
      ranks, ranks, m.experts / ranks);
  std::printf("%5s %14s %14s %9s %14s\n", "step", "measured B", "planned B", "meas/plan",
              "load max/mean");
  std::vector<std::ifstream> files;
  for (int r = 0; r < ranks; ++r) files.emplace_back(absl::StrCat(dir, "/rank", r));
  double sum_ratio = 0;
  for (int step = 1; step <= steps; ++step) {
    EpStep busiest;
    for (std::ifstream& f : files) {
      EpStep x;
      f >> x.ep_bytes >> x.max_load;
      busiest.ep_bytes = std::max(busiest.ep_bytes, x.ep_bytes);
      busiest.max_load = std::max(busiest.max_load, x.max_load);
    }
    sum_ratio += double(busiest.ep_bytes) / planned;
    std::printf("%5d %14lld %14.0f %9.3f %14.2f\n", step, static_cast<long long>(busiest.ep_bytes),
                planned, double(busiest.ep_bytes) / planned, busiest.max_load);
  }
  std::printf(
      "mean measured / planned: %.3f (the plan counts each rank's pairs spread evenly over "
      "the experts)\n",
      sum_ratio / steps);
  return 0;
}

int Main(int argc, char** argv) {
  CLI::App app(
      "moe_bench: an MoE model's training step next to a dense one's of the same "
      "active parameters (CPU engine, one rank)");
  int dim = 256, layers = 4, experts = 8, top_k = 2, expert_ffn = 256, B = 8, T = 128, threads = 2,
      steps = 10, ep_ranks = 2;
  app.add_option("--dim", dim, "model width C");
  app.add_option("--layers", layers, "layers");
  app.add_option("--experts", experts, "experts E per MoE layer");
  app.add_option("--top-k", top_k, "experts per token K");
  app.add_option("--expert-ffn", expert_ffn, "an expert's hidden width He");
  app.add_option("--batch", B, "sequences per micro-batch");
  app.add_option("--seq-len", T, "tokens per sequence");
  app.add_option("--threads", threads, "compute threads");
  app.add_option("--steps", steps, "timed steps of each model");
  app.add_option("--ep-ranks", ep_ranks,
                 "ranks of the expert-parallel run (dp = ep = this; 0: none)");
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
  if (ep_ranks > 1) return EpBytes(moe, ep_ranks, B, T, steps);
  return 0;
}

}  // namespace
}  // namespace shardtrain::bench

int main(int argc, char** argv) { return shardtrain::bench::Main(argc, argv); }
