// gpu_train_bench: GPT-2 124M training on one GPU (T = 1024, bf16 compute,
// fp32 master weights, AdamW, clip 1.0) through the real Trainer, next to
// PyTorch on the same GPU in the same invocation (bench/gpu_train_torch_peer.py:
// SDPA attention, autocast bf16, fused AdamW; eager and torch.compile rows).
// A benchmark, never a test: it prints numbers and ratios.
//
// Per batch size B (default 16 and 32): ms/step and tok/s over --steps timed
// steps after --warmup ones, MFU = tok/s · FLOPs/token / the GPU's dense
// bf16 peak (--peak-tflops, default 989.4 for an H100 SXM), FLOPs/token =
// 6·N (N = parameters, the tied LM head counted once) + 12·L·C·T (attention),
// and the device memory the trainer took (cudaMemGetInfo before and after).
//
// Where the time goes, per kernel: run it under Nsight Compute, e.g.
//   ncu --metrics gpu__time_duration.sum --print-summary per-kernel --csv
//       gpu_train_bench --batch 4 --steps 2 --warmup 0 --peer none
// (../shared/notes/gpu.md has the first such table).
//
// Without a CUDA device it says so and exits 0, having run nothing.
//
// Usage: gpu_train_bench [--batch 16,32] [--steps 20] [--warmup 3]
//                        [--peer torch|none] [--compile] [--peak-tflops 989.4]
//                        [--data FILE] [--peer-dir DIR]
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "worker/device_probe.h"
#include "worker/trainer.h"

namespace shardtrain {
namespace {

struct Options {
  std::vector<int> batches = {16, 32};
  int steps = 20;
  int warmup = 3;
  std::string peer = "torch";
  bool compile = false;
  double peak_tflops = 989.4;
  std::string data = SHARDTRAIN_FORTUNES_PATH;
  std::string peer_dir = SHARDTRAIN_BENCH_DIR;  // where gpu_train_torch_peer.py is
};

struct Row {
  std::string who;
  int batch = 0;
  double tok_s = 0, ms = 0, mem_gib = 0;
};

absl::StatusOr<JobSpec> SpecFor(const Options& o, int batch) {
  return ParseJobSpec(absl::StrCat(
      "name: gpu-train-bench\nmodel: {preset: gpt2-124m}\n", "data: {train: ", o.data, "}\n",
      "batch: {global: ", batch, ", micro: ", batch, ", seq_len: 1024}\n", "precision: bf16\n",
      "optimizer: {lr: 6e-4, warmup_steps: 10, weight_decay: 0.1, grad_clip: 1.0}\n",
      "steps: ", o.warmup + o.steps, "\nresources: {device: cuda}\nseed: 1337\n"));
}

// FLOPs per token: 6 per parameter per token (forward + backward) plus
// attention's QK^T and att·V, 12·L·C·T.
double FlopsPerToken(const model::GptConfig& c, int64_t params, int T) {
  return 6.0 * double(params) + 12.0 * c.layers * c.dim * double(T);
}

absl::StatusOr<Row> RunOurs(const Options& o, int batch, double* flops_per_token) {
  absl::StatusOr<JobSpec> spec = SpecFor(o, batch);
  if (!spec.ok()) return spec.status();
  size_t free_before = 0, free_after = 0, total = 0;
  cudaMemGetInfo(&free_before, &total);
  absl::StatusOr<std::unique_ptr<worker::Trainer>> t =
      worker::Trainer::Create(*spec, /*rank=*/0, /*threads=*/4, /*comm=*/nullptr, /*gpu=*/0);
  if (!t.ok()) return t.status();
  worker::Trainer& trainer = **t;
  *flops_per_token =
      FlopsPerToken(trainer.engine().config(), trainer.engine().layout().global_num_params(), 1024);
  double timed_ms = 0;
  for (int step = 1; step <= o.warmup + o.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<worker::StepResult> r = trainer.Step(step);  // reads the loss: synchronous
    if (!r.ok()) return r.status();
    if (step > o.warmup) {
      timed_ms +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  cudaMemGetInfo(&free_after, &total);
  Row row{"shardtrain", batch};
  row.ms = timed_ms / o.steps;
  row.tok_s = batch * 1024.0 / (row.ms / 1e3);
  row.mem_gib = (double(free_before) - double(free_after)) / double(1ull << 30);
  return row;
}

// The PyTorch peer's rows ("torch <mode> B=<b> tok_s <x> ms_per_step <y>
// peak_gib <z>"), run beside this binary's source tree.
std::vector<Row> RunTorch(const Options& o, const std::string& mode) {
  const std::string cmd = absl::StrCat(
      "cd '", o.peer_dir, "' && python3 gpu_train_torch_peer.py --mode ", mode, " --steps ",
      o.steps, " --warmup ", std::max(o.warmup, mode == "compile" ? 5 : 3), " --batch ",
      absl::StrJoin(o.batches, " "), " 2>&1");
  std::vector<Row> rows;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return rows;
  char line[512];
  while (std::fgets(line, sizeof line, p) != nullptr) {
    Row r;
    char m[32];
    if (std::sscanf(line, "torch %31s B=%d tok_s %lf ms_per_step %lf peak_gib %lf", m, &r.batch,
                    &r.tok_s, &r.ms, &r.mem_gib) == 5) {
      r.who = absl::StrCat("pytorch ", m);
      rows.push_back(r);
    } else {
      std::fprintf(stderr, "  [torch] %s", line);
    }
  }
  pclose(p);
  return rows;
}

int Main(int argc, char** argv) {
  Options o;
  CLI::App app{"GPT-2 124M bf16 training on one GPU: shardtrain next to PyTorch (ratios)"};
  app.add_option("--batch", o.batches, "batch sizes (sequences of 1024 tokens)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps per batch size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--peer", o.peer, "torch: PyTorch rows in the same run; none")
      ->check(CLI::IsMember({"torch", "none"}))
      ->capture_default_str();
  app.add_flag("--compile", o.compile, "also torch.compile rows (minutes of compiling)");
  app.add_option("--peak-tflops", o.peak_tflops, "dense bf16 peak for MFU")->capture_default_str();
  app.add_option("--data", o.data, "training text (bytes)");
  app.add_option("--peer-dir", o.peer_dir, "folder of gpu_train_torch_peer.py (bench/)");
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<std::vector<worker::GpuInfo>> gpus = worker::ProbeGpus();
  if (!gpus.ok()) {
    std::printf("gpu_train_bench: %s; nothing run.\n",
                std::string(gpus.status().message()).c_str());
    return 0;
  }
  std::printf("gpu_train_bench: %s, GPT-2 124M, T=1024, bf16, AdamW, clip 1.0; %d timed steps\n",
              gpus->front().model.c_str(), o.steps);
  std::vector<Row> rows;
  double flops_per_token = 0;
  for (int b : o.batches) {
    absl::StatusOr<Row> r = RunOurs(o, b, &flops_per_token);
    if (!r.ok()) {
      std::fprintf(stderr, "gpu_train_bench: B=%d: %s\n", b,
                   std::string(r.status().message()).c_str());
      return 1;
    }
    rows.push_back(*r);
  }
  if (o.peer == "torch") {
    for (const std::string& mode : o.compile ? std::vector<std::string>{"eager", "compile"}
                                             : std::vector<std::string>{"eager"}) {
      for (Row& r : RunTorch(o, mode)) rows.push_back(r);
    }
  }
  std::printf("\n%-18s %4s %10s %9s %7s %9s %14s\n", "who", "B", "tok/s", "ms/step", "MFU",
              "mem GiB", "ours/this row");
  for (const Row& r : rows) {
    double ours = 0;
    for (const Row& s : rows) {
      if (s.who == "shardtrain" && s.batch == r.batch) ours = s.tok_s;
    }
    const double mfu = r.tok_s * flops_per_token / (o.peak_tflops * 1e12);
    std::printf("%-18s %4d %10.0f %9.2f %6.1f%% %9.2f %13.3fx\n", r.who.c_str(), r.batch, r.tok_s,
                r.ms, 100 * mfu, r.mem_gib, r.tok_s > 0 ? ours / r.tok_s : 0.0);
  }
  std::printf(
      "(FLOPs/token %.3g; MFU over %.1f TFLOP/s; mem: shardtrain = cudaMemGetInfo delta, "
      "pytorch = max_memory_allocated)\n",
      flops_per_token, o.peak_tflops);
  return 0;
}

}  // namespace
}  // namespace shardtrain

int main(int argc, char** argv) { return shardtrain::Main(argc, argv); }
