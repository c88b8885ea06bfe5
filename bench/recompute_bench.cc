// recompute_bench: what activation recomputation and sequence parallelism
// cost and save, on CPU ranks (forked processes, Gloo over 127.0.0.1). A
// benchmark, never a test: it prints numbers and ratios against the
// baseline measured in the same run.
//
// Part 1, one rank: for each model (GPT-2 124M; a wide/long config where
// the T² attention dominates), model.recompute none, selective and full:
// the median step time and its ratio to none, the activation bytes the
// engine holds (measured resident, Trainer::memory()) and the plan's,
// their ratio to none, and the forward FLOPs the plan says recomputation
// adds.
// Part 2, tp2 (two ranks): without and with parallel.sequence_parallel:
// step time, activation bytes per rank and the tp bytes each rank sent per
// step (the TensorParallelGroup's count of the ops it issued) against the
// plan's.
//
// Usage: recompute_bench [--data data/fortunes.txt] [--steps 2] [--warmup 1]
//                        [--threads 2] [--models gpt2-124m,wide-long]
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
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
  int steps = 2, warmup = 1, threads = 2;
  std::vector<std::string> models = {"gpt2-124m", "wide-long"};
};

struct Model {
  const char* name;
  int layers, heads, dim, vocab, micro, seq;
};
// GPT-2 124M at a CPU-sized batch; a wide, long-context config where the
// attention's T² probabilities are most of the activations.
constexpr Model kModels[] = {
    {"gpt2-124m", 12, 12, 768, 50257, 2, 256},
    {"wide-long", 4, 16, 512, 256, 1, 1024},
};

std::string SpecYaml(const Model& m, const Options& o, const std::string& recompute, int tp,
                     bool sp) {
  // clang-format off
  return absl::StrCat("name: recompute-bench\n",
                      "model: {layers: ", m.layers, ", heads: ", m.heads, ", dim: ", m.dim,
                      ", context: ", m.seq, ", vocab: ", m.vocab, ", recompute: ", recompute, "}\n",
                      "data: {train: \"", o.data, "\", format: text, tokenizer: byte}\n",
                      "batch: {global: ", m.micro, ", micro: ", m.micro, ", seq_len: ", m.seq, "}\n",
                      "parallel: {tp: ", tp, sp ? ", sequence_parallel: true" : "", "}\n",
                      "optimizer: {lr: 1e-4}\n",
                      "steps: ", o.warmup + o.steps, "\n",
                      "timeouts: {collective_s: 300}\n");
  // clang-format on
}

struct RankResult {
  double step_ms = 0;  // median of the timed steps
  int64_t activations = 0, tp_bytes = 0;
};

// One rank of `spec` in this (forked) process; writes its result to `out`.
int RunRank(const JobSpec& spec, int rank, const std::string& store_dir, const std::string& prefix,
            const Options& o, const std::string& out) {
  auto fail = [&](const absl::Status& s) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return 1;
  };
  const int world = spec.parallel.tp;
  auto c = bench::LoopbackWorld(store_dir, rank, world, prefix, absl::Seconds(300));
  if (!c.ok()) return fail(c.status());
  std::unique_ptr<comm::Communicator> comm = *std::move(c);
  // Two ranks share the machine's cores; one rank takes them all.
  const int threads = world > 1 ? 1 : o.threads;
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
      res.tp_bytes = r->tp_bytes;
    }
  }
  res.step_ms = bench::Percentile(ms, 0.5);
  res.activations = (*trainer)->memory().activations;
  if (comm != nullptr) {
    if (absl::Status s = comm->Shutdown(); !s.ok()) return fail(s);
  }
  std::ofstream f(out);
  f << res.step_ms << ' ' << res.activations << ' ' << res.tp_bytes << '\n';
  return f.good() ? 0 : 1;
}

// The busiest rank's result (the slowest step, the most bytes) of `spec`
// run on its tp ranks, or false.
bool Run(const JobSpec& spec, const std::string& dir, const std::string& tag, const Options& o,
         RankResult* out) {
  const std::string store_dir = absl::StrCat(dir, "/store-", tag);
  mkdir(store_dir.c_str(), 0700);
  const int world = spec.parallel.tp;
  if (!bench::ForkRanks(world, [&](int r) {
        return RunRank(spec, r, store_dir, "recompute_bench/" + tag, o,
                       absl::StrCat(dir, "/", tag, ".rank", r));
      })) {
    return false;
  }
  *out = {};
  for (int r = 0; r < world; ++r) {
    RankResult x;
    std::ifstream f(absl::StrCat(dir, "/", tag, ".rank", r));
    if (!(f >> x.step_ms >> x.activations >> x.tp_bytes)) return false;
    out->step_ms = std::max(out->step_ms, x.step_ms);
    out->activations = std::max(out->activations, x.activations);
    out->tp_bytes = std::max(out->tp_bytes, x.tp_bytes);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string models = "gpt2-124m,wide-long";
  CLI::App app{"activation recomputation and sequence parallelism: step time and bytes"};
  app.add_option("--data", o.data, "text file to train on (byte tokens)");
  app.add_option("--steps", o.steps, "timed steps (median reported)");
  app.add_option("--warmup", o.warmup, "untimed steps first");
  app.add_option("--threads", o.threads, "compute threads of a one-rank run");
  app.add_option("--models", models, "comma-separated: gpt2-124m, wide-long");
  CLI11_PARSE(app, argc, argv);
  o.models = absl::StrSplit(models, ',');

  char tmpl[] = "/tmp/recompute_bench.XXXXXX";
  const char* dir = mkdtemp(tmpl);
  if (dir == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  std::printf("recompute_bench: fp32 CPU ranks, %d timed steps after %d warmup; load before: %s\n",
              o.steps, o.warmup, bench::Uptime().c_str());
  int failures = 0;
  for (const Model& m : kModels) {
    if (std::find(o.models.begin(), o.models.end(), m.name) == o.models.end()) continue;
    std::printf("\n%s: L=%d C=%d NH=%d V=%d, micro %d x seq %d, 1 rank x %d threads\n", m.name,
                m.layers, m.dim, m.heads, m.vocab, m.micro, m.seq, o.threads);
    std::printf("%-10s %9s %7s | %12s %12s %7s | %14s %7s\n", "recompute", "step ms", "vs none",
                "acts MiB", "plan MiB", "vs none", "extra fwd FLOP", "of step");
    RankResult none;
    for (const char* mode : {"none", "selective", "full"}) {
      auto spec = ParseJobSpec(SpecYaml(m, o, mode, 1, false));
      auto plan = spec.ok() ? MakePlan(*spec, 1) : absl::StatusOr<v1::Plan>(spec.status());
      RankResult r;
      if (!plan.ok() || !Run(*spec, dir, absl::StrCat(m.name, "-", mode), o, &r)) {
        std::printf("%-10s failed%s\n", mode,
                    plan.ok() ? "" : (": " + plan.status().ToString()).c_str());
        ++failures;
        continue;
      }
      if (std::string(mode) == "none") none = r;
      const MicroBatchFlops f = BusiestRecompute(*spec);
      std::printf("%-10s %9.0f %6.3fx | %12.1f %12.1f %6.3fx | %14.3g %6.1f%%\n", mode, r.step_ms,
                  r.step_ms / none.step_ms, r.activations / kMiB,
                  plan->memory_per_rank().activations_bytes() / kMiB,
                  double(r.activations) / double(none.activations), f.recompute,
                  100 * f.recompute / f.train);
    }
    std::printf("\n%s on tp2 (2 ranks x 1 thread): parallel.sequence_parallel\n", m.name);
    std::printf("%-10s %9s %7s | %12s %12s %7s | %12s %12s %7s\n", "sp", "step ms", "vs off",
                "acts MiB", "plan MiB", "vs off", "tp MB sent", "plan MB", "vs off");
    RankResult off;
    for (bool sp : {false, true}) {
      auto spec = ParseJobSpec(SpecYaml(m, o, "none", 2, sp));
      auto plan = spec.ok() ? MakePlan(*spec, 2) : absl::StatusOr<v1::Plan>(spec.status());
      RankResult r;
      if (!plan.ok() || !Run(*spec, dir, absl::StrCat(m.name, "-tp2-", sp), o, &r)) {
        std::printf("%-10s failed%s\n", sp ? "on" : "off",
                    plan.ok() ? "" : (": " + plan.status().ToString()).c_str());
        ++failures;
        continue;
      }
      if (!sp) off = r;
      std::printf("%-10s %9.0f %6.3fx | %12.1f %12.1f %6.3fx | %12.2f %12.2f %6.3fx\n",
                  sp ? "on" : "off", r.step_ms, r.step_ms / off.step_ms, r.activations / kMiB,
                  plan->memory_per_rank().activations_bytes() / kMiB,
                  double(r.activations) / double(off.activations), r.tp_bytes / 1e6,
                  plan->tp_comm_bytes_per_step() / 1e6, double(r.tp_bytes) / double(off.tp_bytes));
    }
  }
  std::printf("\nload after: %s\n", bench::Uptime().c_str());
  std::string rm = absl::StrCat("rm -rf ", dir);
  if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir);
  return failures == 0 ? 0 : 1;
}
