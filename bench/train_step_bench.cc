// train_step_bench: one fp32 training step (Forward, Backward, AdamW over
// all parameters fused with zeroing the gradients for the next step; no
// clipping) of the CPU engine for GPT-2 124M
// and a small config, next to the machine's practical sgemm peak, and
// optionally PyTorch on the same shapes (--peer torch). A benchmark, never a
// test: it prints numbers and ratios, it does not pass or fail.
//
// FLOPs per token (stated, "model FLOPs"):
//   6 * (12*L*C^2 + V*C)  matmul weights incl. the tied LM head (fwd + bwd)
// + 6 * L * T * C         causal attention (QK^T and att*V, fwd + bwd)
//
// Usage: train_step_bench [--threads N] [--steps N] [--peer torch] [--json]
//                         [--profile] [--only 124m|small]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "worker/engine/cpu/cpu_model.h"
#include "worker/engine/cpu/layers.h"
#include "worker/optim/adamw.h"

#ifndef SHARDTRAIN_BENCH_TORCH_SCRIPT
#define SHARDTRAIN_BENCH_TORCH_SCRIPT "bench/train_step_bench.py"
#endif

namespace {
using namespace shardtrain;
using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct Options {
  int threads = 2;
  int steps = 5;
  bool torch = false;
  bool json = false;
  bool profile = false;
  std::string only;
};

struct BenchConfig {
  std::string name;
  model::ModelConfig config;
  int B, T;
};

double FlopsPerToken(const model::ModelConfig& c, int T) {
  const double L = c.layers, C = c.dim, V = c.vocab;
  return 6.0 * (12.0 * L * C * C + V * C) + 6.0 * L * T * C;
}

struct Result {
  double ms_step = 0, tok_s = 0, gflops = 0;
  engine::cpu::CpuModel::Timing fwd, bwd;
  double zero_ms = 0, adam_ms = 0;
};

Result RunEngine(const BenchConfig& bc, const Options& opt) {
  auto m = engine::cpu::CpuModel::Create(bc.config, bc.B, bc.T, opt.threads);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
    std::exit(1);
  }
  engine::cpu::CpuModel& gpt = **m;
  gpt.InitParams(1337);
  auto adam = optim::AdamW::Create(gpt.layout(), 0, gpt.params().f32().size(), {});
  std::mt19937 rng(1);
  std::vector<int> in(bc.B * bc.T), tg(bc.B * bc.T);
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = rng() % bc.config.vocab;
    tg[i] = rng() % bc.config.vocab;
  }
  Result r;
  double total = 0;
  for (int s = -1; s < opt.steps; ++s) {  // step -1: warm-up
    const bool measure = s >= 0;
    gpt.set_profiling(opt.profile && measure);
    const auto t0 = Clock::now();
    if (s == -1) gpt.ZeroGrad();  // later steps: zeroed by the fused AdamW
    const auto t1 = Clock::now();
    gpt.Forward(in.data(), tg.data());
    if (opt.profile && measure) {
      const auto& t = gpt.timing();
      r.fwd.encoder += t.encoder;
      r.fwd.layernorm += t.layernorm;
      r.fwd.matmul += t.matmul;
      r.fwd.attention += t.attention;
      r.fwd.gelu += t.gelu;
      r.fwd.residual += t.residual;
      r.fwd.lm_head += t.lm_head;
      r.fwd.softmax_ce += t.softmax_ce;
    }
    gpt.set_profiling(false);
    if (opt.profile && measure) {
      // Backward's timers accumulate on top of Forward's: take the delta.
      gpt.set_profiling(true);
    }
    const engine::cpu::CpuModel::Timing before = gpt.timing();
    gpt.Backward();
    if (opt.profile && measure) {
      const auto& t = gpt.timing();
      r.bwd.encoder += t.encoder - before.encoder;
      r.bwd.layernorm += t.layernorm - before.layernorm;
      r.bwd.matmul += t.matmul - before.matmul;
      r.bwd.attention += t.attention - before.attention;
      r.bwd.gelu += t.gelu - before.gelu;
      r.bwd.residual += t.residual - before.residual;
      r.bwd.lm_head += t.lm_head - before.lm_head;
      r.bwd.softmax_ce += t.softmax_ce - before.softmax_ce;
    }
    gpt.set_profiling(false);
    const auto t2 = Clock::now();
    adam->StepAndZeroGrads(gpt.params().f32(), gpt.grads().f32(), 1e-4f, gpt.pool());
    const auto t3 = Clock::now();
    if (measure) {
      total += Ms(t0, t3);
      r.zero_ms += Ms(t0, t1);
      r.adam_ms += Ms(t2, t3);
    }
  }
  r.ms_step = total / opt.steps;
  const double tokens = double(bc.B) * bc.T;
  r.tok_s = tokens / (r.ms_step / 1e3);
  r.gflops = FlopsPerToken(bc.config, bc.T) * r.tok_s / 1e9;
  return r;
}

// GFLOP/s of C(768x3072) = A(768x768) B(768x3072): OpenBLAS with `threads`
// threads, and the engine's pool-split Gemm.
std::pair<double, double> SgemmPeak(int threads) {
  const int M = 768, K = 768, N = 3072, iters = 10;
  std::vector<float> a(M * K, 0.5f), b(K * N, 0.25f), c(M * N);
  openblas_set_num_threads(threads);
  auto time_it = [&](auto&& f) {
    f();
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) f();
    return 2.0 * M * N * K * iters / (Ms(t0, Clock::now()) / 1e3) / 1e9;
  };
  const double blas = time_it([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a.data(), K, b.data(), N,
                0.0f, c.data(), N);
  });
  openblas_set_num_threads(1);
  engine::ThreadPool pool(threads);
  const double engine = time_it([&] {
    engine::cpu::Gemm<float>(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(),
                             N, &pool);
  });
  return {blas, engine};
}

// Runs the PyTorch peer; returns {tok/s, ms/step}, or {-1, -1} on failure
// (its output is then echoed to stderr).
std::pair<double, double> RunTorch(const BenchConfig& bc, const Options& opt) {
  char cmd[1024];
  std::snprintf(cmd, sizeof cmd,
                "OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 %s --layers %d --heads %d "
                "--dim %d --context %d --vocab %d --batch %d --seq %d --threads %d "
                "--steps %d 2>&1",
                SHARDTRAIN_BENCH_TORCH_SCRIPT, bc.config.layers, bc.config.heads, bc.config.dim,
                bc.config.context, bc.config.padded_vocab, bc.B, bc.T, opt.threads, opt.steps);
  FILE* p = popen(cmd, "r");
  if (p == nullptr) return {-1, -1};
  char line[512];
  double tok_s = -1, ms = -1;
  std::string output;
  while (std::fgets(line, sizeof line, p) != nullptr) {
    if (std::sscanf(line, "tok_s %lf", &tok_s) != 1 &&
        std::sscanf(line, "ms_per_step %lf", &ms) != 1) {
      output += line;
    }
  }
  pclose(p);
  if (tok_s < 0) std::fprintf(stderr, "torch peer failed:\n%s", output.c_str());
  return {tok_s, ms};
}

void PrintProfile(const Result& r, int steps) {
  auto row = [&](const char* name, double f, double b) {
    std::printf("    %-12s fwd %8.1f ms  bwd %8.1f ms\n", name, f / steps, b / steps);
  };
  row("encoder", r.fwd.encoder, r.bwd.encoder);
  row("layernorm", r.fwd.layernorm, r.bwd.layernorm);
  row("matmul", r.fwd.matmul, r.bwd.matmul);
  row("attention", r.fwd.attention, r.bwd.attention);
  row("gelu", r.fwd.gelu, r.bwd.gelu);
  row("residual", r.fwd.residual, r.bwd.residual);
  row("lm_head", r.fwd.lm_head, r.bwd.lm_head);
  row("softmax_ce", r.fwd.softmax_ce, r.bwd.softmax_ce);
  std::printf("    %-12s %8.1f ms (AdamW step fused with zeroing the grads)\n", "adamw",
              r.adam_ms / steps);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads")
      opt.threads = std::atoi(next().c_str());
    else if (a == "--steps")
      opt.steps = std::atoi(next().c_str());
    else if (a == "--peer")
      opt.torch = next() == "torch";
    else if (a == "--json")
      opt.json = true;
    else if (a == "--profile")
      opt.profile = true;
    else if (a == "--only")
      opt.only = next();
    else {
      std::fprintf(stderr,
                   "usage: %s [--threads N] [--steps N] [--peer torch] [--json] "
                   "[--profile] [--only 124m|small]\n",
                   argv[0]);
      return a == "--help" ? 0 : 2;
    }
  }
  if (opt.threads < 1 || opt.steps < 1) {
    std::fprintf(stderr, "--threads and --steps must be >= 1\n");
    return 2;
  }
  std::vector<BenchConfig> configs;
  if (opt.only.empty() || opt.only == "124m")
    configs.push_back({"gpt2-124m", *model::MakeGptConfig(12, 12, 768, 1024, 50257), 4, 64});
  if (opt.only.empty() || opt.only == "small")
    configs.push_back({"small", *model::MakeGptConfig(4, 4, 256, 1024, 50257), 4, 64});

  const auto [blas_peak, engine_gemm] = SgemmPeak(opt.threads);
  if (opt.json) {
    std::printf(
        "{\"bench\": \"sgemm_768x768x3072\", \"threads\": %d, "
        "\"openblas_gflops\": %.1f, \"engine_gemm_gflops\": %.1f}\n",
        opt.threads, blas_peak, engine_gemm);
  } else {
    std::printf(
        "threads %d, %d timed steps after 1 warm-up; step = "
        "forward + backward + AdamW fused with zero_grad (fp32)\n",
        opt.threads, opt.steps);
    std::printf("FLOPs/token = 6*(12*L*C^2 + V*C) + 6*L*T*C\n");
    std::printf(
        "sgemm 768x768x3072: OpenBLAS %d threads %.1f GFLOP/s; engine "
        "pool-split Gemm %.1f GFLOP/s\n\n",
        opt.threads, blas_peak, engine_gemm);
    std::printf("%-10s %5s %4s %10s %10s %9s %8s %12s %8s\n", "config", "B", "T", "ms/step",
                "tok/s", "GFLOP/s", "%peak", "torch tok/s", "ratio");
  }
  for (const BenchConfig& bc : configs) {
    const Result r = RunEngine(bc, opt);
    const auto [torch_tok_s, torch_ms] = opt.torch ? RunTorch(bc, opt) : std::pair{-1.0, -1.0};
    const double ratio = torch_tok_s > 0 ? r.tok_s / torch_tok_s : 0;
    if (opt.json) {
      std::printf(
          "{\"bench\": \"train_step\", \"config\": \"%s\", \"B\": %d, \"T\": %d, "
          "\"threads\": %d, \"ms_per_step\": %.2f, \"tok_s\": %.1f, "
          "\"gflops\": %.1f, \"peak_fraction\": %.3f",
          bc.name.c_str(), bc.B, bc.T, opt.threads, r.ms_step, r.tok_s, r.gflops,
          r.gflops / blas_peak);
      if (opt.torch) {
        std::printf(
            ", \"torch_ms_per_step\": %.2f, \"torch_tok_s\": %.1f, \"ratio_vs_torch\": %.3f",
            torch_ms, torch_tok_s, ratio);
      }
      std::printf("}\n");
    } else {
      std::printf("%-10s %5d %4d %10.1f %10.1f %9.1f %7.0f%%", bc.name.c_str(), bc.B, bc.T,
                  r.ms_step, r.tok_s, r.gflops, 100 * r.gflops / blas_peak);
      if (opt.torch) std::printf(" %12.1f %7.2fx", torch_tok_s, ratio);
      std::printf("\n");
      if (opt.profile) PrintProfile(r, opt.steps);
    }
    std::fflush(stdout);
  }
  return 0;
}
