// cp_bench: long sequences with context parallelism (parallel.cp), on CPU
// ranks (forked processes, Gloo over 127.0.0.1). A benchmark, never a
// test: it prints numbers and ratios against the cp 1 run of the same
// sequence length in the same run.
//
// For each sequence length and cp degree, a small Llama-style model (2
// layers, dim 64, 4 heads, 2 kv heads) trains one sequence per step on cp
// ranks: the median step time and its ratio to cp 1; the activation bytes
// the busiest rank's engine holds (measured resident, Trainer::memory())
// next to the plan's, and their ratio to cp 1 (the T² attention scores
// make one rank's activations grow with T², a cp rank's with (T/cp)²); the
// bytes each rank sent on the cp ring per step (the ContextParallelGroup's
// count) next to the plan's. Runs the plan says need more than --max-gib
// of activations per rank are skipped, saying so.
//
// Usage: cp_bench [--data data/fortunes.txt] [--seqs 8192,16384] [--cps 1,2,4]
//                 [--steps 1] [--warmup 1] [--max-gib 8]
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_ranks.h"
#include "bench/bench_util.h"
#include "common/job_spec.h"
#include "common/planner.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/rendezvous_store.h"
#include "worker/trainer.h"

namespace {
using namespace shardtrain;

constexpr double kMiB = 1024.0 * 1024.0;

struct Options {
  std::string data = "data/fortunes.txt";
  std::vector<int> seqs = {8192, 16384}, cps = {1, 2, 4};
  int steps = 1, warmup = 1;
  double max_gib = 8;
};

std::string SpecYaml(const Options& o, int seq, int cp) {
  // clang-format off
  return absl::StrCat("name: cp-bench\n",
                      "model: {arch: llama, layers: 2, dim: 64, heads: 4, kv_heads: 2, ffn_dim: 192, ",
                      "context: ", seq, ", vocab: 256, rope_theta: 10000}\n",
                      "data: {train: \"", o.data, "\", format: text, tokenizer: byte}\n",
                      "batch: {global: 1, micro: 1, seq_len: ", seq, "}\n",
                      "parallel: {cp: ", cp, "}\n",
                      "optimizer: {lr: 1e-4}\n",
                      "steps: ", o.warmup + o.steps, "\n",
                      "timeouts: {collective_s: 600}\n");
  // clang-format on
}

struct RankResult {
  double step_ms = 0;  // median of the timed steps
  int64_t activations = 0, cp_bytes = 0;
};

// One rank of `spec` in this (forked) process; writes its result to `out`.
int RunRank(const JobSpec& spec, int rank, const std::string& store_dir, const std::string& prefix,
            const Options& o, const std::string& out) {
  auto fail = [&](const absl::Status& s) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return 1;
  };
  const int world = spec.World();
  auto c = bench::LoopbackWorld(store_dir, rank, world, prefix);
  if (!c.ok()) return fail(c.status());
  std::unique_ptr<comm::Communicator> comm = *std::move(c);
  // The ranks share the machine's cores.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = std::max(1, cores / world);
  auto trainer = worker::Trainer::Create(spec, rank, threads, comm.get());
  if (!trainer.ok()) return fail(trainer.status());
  (*trainer)->set_measure_memory(true);
  std::vector<double> ms;
  RankResult res;
  for (int s = 1; s <= o.warmup + o.steps; ++s) {
    auto r = (*trainer)->Step(s);
    if (!r.ok()) return fail(r.status());
    if (s > o.warmup) {
      ms.push_back(r->step_ms);
      res.cp_bytes = r->cp_bytes;
    }
  }
  res.step_ms = bench::Percentile(ms, 0.5);
  res.activations = (*trainer)->memory().activations;
  if (comm != nullptr) {
    if (absl::Status s = comm->Shutdown(); !s.ok()) return fail(s);
  }
  std::ofstream f(out);
  f << res.step_ms << ' ' << res.activations << ' ' << res.cp_bytes << '\n';
  return f.good() ? 0 : 1;
}

// The busiest rank's result (the slowest step, the most bytes) of `spec`
// run on its ranks, or false.
bool Run(const JobSpec& spec, const std::string& dir, const std::string& tag, const Options& o,
         RankResult* out) {
  const std::string store_dir = absl::StrCat(dir, "/store-", tag);
  mkdir(store_dir.c_str(), 0700);
  const int world = spec.World();
  if (!bench::ForkRanks(world, [&](int r) {
        return RunRank(spec, r, store_dir, "cp_bench/" + tag, o,
                       absl::StrCat(dir, "/", tag, ".rank", r));
      })) {
    return false;
  }
  *out = {};
  for (int r = 0; r < world; ++r) {
    RankResult x;
    std::ifstream f(absl::StrCat(dir, "/", tag, ".rank", r));
    if (!(f >> x.step_ms >> x.activations >> x.cp_bytes)) return false;
    out->step_ms = std::max(out->step_ms, x.step_ms);
    out->activations = std::max(out->activations, x.activations);
    out->cp_bytes = std::max(out->cp_bytes, x.cp_bytes);
  }
  return true;
}

std::vector<int> Ints(const std::string& csv) {
  std::vector<int> out;
  for (absl::string_view s : absl::StrSplit(csv, ','))
    out.push_back(std::atoi(std::string(s).c_str()));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string seqs = "8192,16384", cps = "1,2,4";
  CLI::App app{"context parallelism on long sequences: step time, activation and ring bytes"};
  app.add_option("--data", o.data, "text file to train on (byte tokens)");
  app.add_option("--seqs", seqs, "comma-separated sequence lengths (2·cp must divide each)");
  app.add_option("--cps", cps, "comma-separated cp degrees; the first is each row's baseline");
  app.add_option("--steps", o.steps, "timed steps (median reported)");
  app.add_option("--warmup", o.warmup, "untimed steps first");
  app.add_option("--max-gib", o.max_gib,
                 "skip runs whose planned activations per rank exceed this");
  CLI11_PARSE(app, argc, argv);
  o.seqs = Ints(seqs);
  o.cps = Ints(cps);

  char tmpl[] = "/tmp/cp_bench.XXXXXX";
  const char* dir = mkdtemp(tmpl);
  if (dir == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  std::printf(
      "cp_bench: llama L=2 C=64 NH=4 KVH=2, one sequence per step, fp32 CPU ranks (forked, "
      "Gloo), %d timed step(s) after %d warmup; load before: %s\n",
      o.steps, o.warmup, bench::Uptime().c_str());
  int failures = 0;
  for (int seq : o.seqs) {
    std::printf("\nseq_len %d\n", seq);
    std::printf("%4s %10s %8s | %10s %10s %9s %8s | %10s %10s %9s\n", "cp", "step ms", "vs base",
                "acts MiB", "plan MiB", "meas/plan", "vs base", "ring MB", "plan MB", "meas/plan");
    RankResult base;
    for (int cp : o.cps) {
      auto spec = ParseJobSpec(SpecYaml(o, seq, cp));
      auto plan =
          spec.ok() ? MakePlan(*spec, spec->World()) : absl::StatusOr<v1::Plan>(spec.status());
      if (!plan.ok()) {
        std::printf("%4d failed: %s\n", cp, plan.status().ToString().c_str());
        ++failures;
        continue;
      }
      const double planned = plan->memory_per_rank().activations_bytes();
      if (planned > o.max_gib * 1024 * kMiB) {
        std::printf(
            "%4d skipped: the plan says %.1f GiB of activations per rank (> --max-gib %g)\n", cp,
            planned / (1024 * kMiB), o.max_gib);
        continue;
      }
      RankResult r;
      if (!Run(*spec, dir, absl::StrCat(seq, "-cp", cp), o, &r)) {
        std::printf("%4d failed (see the ranks' errors above)\n", cp);
        ++failures;
        continue;
      }
      if (base.step_ms == 0) base = r;
      const double ring_plan = plan->cp_comm_bytes_per_step();
      std::printf("%4d %10.0f %7.3fx | %10.1f %10.1f %9.3f %7.3fx | %10.2f %10.2f %9s\n", cp,
                  r.step_ms, r.step_ms / base.step_ms, r.activations / kMiB, planned / kMiB,
                  r.activations / planned, double(r.activations) / double(base.activations),
                  r.cp_bytes / 1e6, ring_plan / 1e6,
                  ring_plan > 0 ? absl::StrFormat("%.3f", r.cp_bytes / ring_plan).c_str() : "-");
      std::fflush(stdout);
    }
  }
  std::printf("\nload after: %s\n", bench::Uptime().c_str());
  std::string rm = absl::StrCat("rm -rf ", dir);
  if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir);
  return failures == 0 ? 0 : 1;
}
