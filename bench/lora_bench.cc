// lora_bench: the training step of LoRA fine-tuning (finetune.lora: rank r on
// every projection, the model frozen) next to full fine-tuning of the same
// Llama model, one CPU rank each, through the real Trainer (forward,
// backward, AdamW), measured in the same run, alternating. Prints each
// step's median time, tokens/s, the ratio LoRA / full, and what each rank
// holds (Trainer::memory()). The frozen model's matmuls still give the
// input its gradient, so LoRA saves the weight-gradient GEMMs (a third of
// the matmul FLOPs) and AdamW over the frozen parameters. Then LoRA on the
// frozen model in int8 and NF4 (finetune.base_dtype: the matmuls dequantize
// each weight 64 rows at a time), each as a ratio to LoRA on the fp32 model.
// Not a test.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "common/job_spec.h"
#include "worker/trainer.h"

namespace shardtrain::bench {
namespace {

int Main(int argc, char** argv) {
  CLI::App app("lora_bench: a LoRA fine-tuning step next to a full one (one CPU rank)");
  int dim = 256, layers = 4, rank = 8, B = 8, T = 128, threads = 2, steps = 10;
  app.add_option("--dim", dim, "model width C (Llama, 4 heads, 2 kv heads, ffn 8C/3)");
  app.add_option("--layers", layers, "layers");
  app.add_option("--rank", rank, "LoRA rank");
  app.add_option("--batch", B, "sequences per step");
  app.add_option("--seq-len", T, "tokens per sequence");
  app.add_option("--threads", threads, "compute threads");
  app.add_option("--steps", steps, "timed steps of each run");
  CLI11_PARSE(app, argc, argv);

  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("lora_bench_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir / "text.txt");
    for (int i = 0; i < 20000; ++i) f << "A fortune " << i * 7919 % 1000 << " for the bench.\n";
  }
  const std::string base = absl::StrCat(
      "name: lora-bench\nmodel: {arch: llama, layers: ", layers,
      ", heads: 4, kv_heads: 2, dim: ", dim, ", context: ", T,
      ", vocab: 256}\ndata: {train: ", (dir / "text.txt").string(), "}\nbatch: {global: ", B,
      ", micro: ", B, ", seq_len: ", T, "}\noptimizer: {lr: 1e-3}\nsteps: 1000\n");
  const std::string lora = absl::StrCat("finetune: {lora: {rank: ", rank, ", alpha: ", 2 * rank,
                                        ", targets: [q, k, v, o, gate, up, down]}");
  // Full fine-tuning, then LoRA on the frozen model in fp32 (the CPU's
  // compute type: base_dtype bf16), int8 and NF4 (QLoRA).
  const std::vector<std::pair<const char*, std::string>> runs = {
      {"full", base},
      {"lora", absl::StrCat(base, lora, "}\n")},
      {"lora int8", absl::StrCat(base, lora, ", base_dtype: int8}\n")},
      {"lora nf4", absl::StrCat(base, lora, ", base_dtype: nf4}\n")}};
  const int n = static_cast<int>(runs.size());
  std::printf("lora_bench: %s\n", Uptime().c_str());
  std::printf(
      "llama L=%d C=%d, B=%d T=%d, threads %d; LoRA rank %d on q, k, v, o, gate, up, "
      "down; %d timed steps each (alternating) after 2 warm-up steps\n",
      layers, dim, B, T, threads, rank, steps);
  std::vector<std::unique_ptr<worker::Trainer>> trainers;
  for (const auto& [name, yaml] : runs) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml);
    if (!spec.ok()) {
      std::fprintf(stderr, "%s: %s\n", name, std::string(spec.status().message()).c_str());
      return 1;
    }
    auto t = worker::Trainer::Create(*spec, 0, threads, nullptr);
    if (!t.ok()) {
      std::fprintf(stderr, "%s: %s\n", name, std::string(t.status().message()).c_str());
      return 1;
    }
    trainers.push_back(*std::move(t));
  }
  std::vector<std::vector<double>> ms(n);
  for (int step = 1; step <= steps + 2; ++step) {
    for (int k = 0; k < n; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      if (absl::StatusOr<worker::StepResult> r = trainers[k]->Step(step); !r.ok()) {
        std::fprintf(stderr, "%s: %s\n", runs[k].first, std::string(r.status().message()).c_str());
        return 1;
      }
      const double t =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (step > 2) ms[k].push_back(t);
    }
  }
  std::vector<double> med(n);
  std::vector<int64_t> state(n);
  std::printf("%-9s %12s %12s %10s %10s %12s %12s\n", "run", "trained", "frozen", "median ms",
              "tok/s", "model state", "activations");
  for (int k = 0; k < n; ++k) {
    med[k] = Percentile(ms[k], 0.5);
    const worker::MemoryUse m = trainers[k]->memory();
    engine::Engine& e = trainers[k]->engine();
    const size_t frozen = e.has_frozen() ? e.frozen_layout().num_params() : 0;
    state[k] = m.frozen + m.params + m.grads + m.optimizer;
    std::printf("%-9s %12zu %12zu %10.1f %10.0f %10.2f MB %9.2f MB\n", runs[k].first,
                e.layout().num_params(), frozen, med[k], double(B) * T / med[k] * 1000,
                state[k] / 1e6, m.activations / 1e6);
  }
  std::printf("lora / full step time: %.3f; model state %.3f of full's\n", med[1] / med[0],
              double(state[1]) / double(state[0]));
  for (int k = 2; k < n; ++k) {
    std::printf(
        "%s / lora step time: %.3f (goal <= 1.5); model state %.3f of lora's, %.3f of "
        "full's\n",
        runs[k].first, med[k] / med[1], double(state[k]) / double(state[1]),
        double(state[k]) / double(state[0]));
  }
  std::printf("load avg %.2f\n", LoadAverage1());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}

}  // namespace
}  // namespace shardtrain::bench

int main(int argc, char** argv) { return shardtrain::bench::Main(argc, argv); }
