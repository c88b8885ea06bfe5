// zero_bench: ZeRO stages 0-3 side by side on a ~50M-parameter GPT, 2 and 4
// ranks x 1 compute thread (forked processes, Gloo over 127.0.0.1). A
// benchmark, never a test: it prints numbers and ratios.
//
// Per (world, stage): tokens/s (median over the timed steps of the slowest
// rank's step; with --repeat R, the median of R interleaved rounds, and
// their range) and its ratio to stage 0 at the same world; memory per rank,
// predicted by the planner (MakePlan(spec, world).memory_per_rank(): the
// busiest rank) against two measurements of the busiest rank:
//   tracked  Trainer::memory(): the rank's buffers, with the ZeRO-2/3
//            working set measured as resident pages (mincore) at every unit
//            use (Zero::set_measure);
//   rss      peak RSS (VmHWM) of the rank process minus its RSS just before
//            the trainer was created (libraries, communicator, and the
//            bench itself: not part of the plan), the HWM reset there
//            (/proc/self/clear_refs).
// and the bytes each rank sent per step (Zero's count of the ring ops it
// issued; DDP's all-reduce model) against plan.comm_bytes_per_step().
// Then the ZeRO paper's 7.5B-parameter, 64-GPU example (Rajbhandari et al.,
// Fig. 1: 120, 31.4, 16.6, 1.9 GB) from the planner's formula and from
// MakePlan on a 7.5B GPT config, to show the formula is the paper's.
//
// Usage: zero_bench [--data data/fortunes.txt] [--worlds 2,4] [--steps 3]
//                   [--warmup 1] [--repeat 1] [--variants 0,1,2,3,3k,3o] [--layers 7]
//                   [--dim 768] [--micro 4] [--seq 64]
#include <sys/stat.h>
#include <sys/wait.h>
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
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_ranks.h"
#include "bench/bench_util.h"
#include "common/job_spec.h"
#include "common/planner.h"
#include "common/process.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/rendezvous_store.h"
#include "worker/trainer.h"

namespace {
using namespace shardtrain;

constexpr double kMiB = 1024.0 * 1024.0;

struct Options {
  std::string data = "data/fortunes.txt";
  std::vector<int> worlds = {2, 4};
  std::vector<std::string> variants = {"0", "1", "2", "3"};
  int steps = 3, warmup = 1, repeat = 1;
  int layers = 7, heads = 12, dim = 768, context = 128, micro = 4, seq = 64;
};

// "3k": ZeRO-3 without resharding after forward; "3o": with optimizer offload.
std::string VariantSets(const std::string& v) {
  const std::string stage = v.substr(0, 1);
  std::string out = absl::StrCat("zero: ", stage);
  if (v == "3k") out += ", reshard_after_forward: false";
  if (v == "3o") out += ", offload: optimizer";
  return out;
}

std::string SpecYaml(const Options& o, int world, const std::string& variant) {
  // clang-format off
  return absl::StrCat("name: zero-bench\n",
                      "model: {layers: ", o.layers, ", heads: ", o.heads, ", dim: ", o.dim,
                      ", context: ", o.context, ", vocab: 256}\n",
                      "data: {train: \"", o.data, "\", format: text, tokenizer: byte}\n",
                      "batch: {global: ", o.micro * world, ", micro: ", o.micro,
                      ", seq_len: ", o.seq, "}\n",
                      "parallel: {dp: ", world, ", ", VariantSets(variant), "}\n",
                      "optimizer: {lr: 1e-4, weight_decay: 0.1}\n",
                      "steps: ", o.warmup + o.steps, "\n",
                      "timeouts: {collective_s: 300}\n");
  // clang-format on
}

struct RankResult {
  std::vector<double> step_ms;
  int64_t tokens = 0, comm_bytes = 0;  // per step (the last timed one)
  worker::MemoryUse mem;
  int64_t baseline_rss = 0, peak_rss = 0;
};

int RunRank(const JobSpec& spec, int rank, const std::string& store_dir, const std::string& prefix,
            int warmup, int steps, const std::string& out) {
  auto fail = [&](const absl::Status& s) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return 1;
  };
  auto comm =
      bench::LoopbackWorld(store_dir, rank, spec.parallel.dp, prefix, absl::Seconds(300), "dp");
  if (!comm.ok()) return fail(comm.status());
  RankResult res;
  res.baseline_rss = RssBytes();
  ResetPeakRss();
  auto trainer = worker::Trainer::Create(spec, rank, 1, comm->get());
  if (!trainer.ok()) return fail(trainer.status());
  (*trainer)->set_measure_memory(true);
  for (int s = 1; s <= warmup + steps; ++s) {
    auto r = (*trainer)->Step(s);
    if (!r.ok()) return fail(r.status());
    if (s > warmup) {
      res.step_ms.push_back(r->step_ms);
      res.tokens = r->tokens;
      res.comm_bytes = r->comm_bytes;
    }
  }
  res.peak_rss = PeakRssBytes();
  res.mem = (*trainer)->memory();
  if (*comm != nullptr) {
    if (absl::Status s = (*comm)->Shutdown(); !s.ok()) return fail(s);
  }
  std::ofstream f(out);
  const worker::MemoryUse& m = res.mem;
  f << res.tokens << ' ' << res.comm_bytes << ' ' << res.baseline_rss << ' ' << res.peak_rss << ' '
    << m.params << ' ' << m.grads << ' ' << m.optimizer << ' ' << m.activations << ' '
    << m.comm_buffers << ' ' << m.working << ' ' << m.optimizer_on_host << '\n';
  for (double ms : res.step_ms) f << ms << ' ';
  f << '\n';
  return f.good() ? 0 : 1;
}

bool ReadRankResult(const std::string& path, RankResult* r) {
  std::ifstream f(path);
  worker::MemoryUse& m = r->mem;
  f >> r->tokens >> r->comm_bytes >> r->baseline_rss >> r->peak_rss >> m.params >> m.grads >>
      m.optimizer >> m.activations >> m.comm_buffers >> m.working >> m.optimizer_on_host;
  double ms;
  while (f >> ms) r->step_ms.push_back(ms);
  return !r->step_ms.empty();
}

std::vector<RankResult> RunLayout(const JobSpec& spec, const std::string& dir,
                                  const std::string& tag, const Options& o) {
  const std::string store_dir = absl::StrCat(dir, "/store-", tag);
  mkdir(store_dir.c_str(), 0700);
  const int world = spec.parallel.dp;
  const bool ok = bench::ForkRanks(world, [&](int r) {
    return RunRank(spec, r, store_dir, "zero_bench/" + tag, o.warmup, o.steps,
                   absl::StrCat(dir, "/", tag, ".rank", r));
  });
  if (!ok) return {};
  std::vector<RankResult> out(world);
  for (int r = 0; r < world; ++r) {
    if (!ReadRankResult(absl::StrCat(dir, "/", tag, ".rank", r), &out[r])) return {};
  }
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void PaperExample() {
  std::printf(
      "\nZeRO paper, Fig. 1: 7.5B params, N_d = 64, mixed-precision Adam (K = 12), model "
      "state per device:\n");
  std::printf("%-8s %10s %16s %22s\n", "stage", "paper GB", "formula GB",
              "plan GB (GPT L36 C4096)");
  const double paper[4] = {120, 31.4, 16.6, 1.9};
  JobSpec s;
  s.name = "zero-paper";
  s.model = {"", 36, 32, 4096, 2048, 50257, ""};
  s.batch = {64, 1, 1024};
  s.parallel.dp = 64;
  s.precision = Precision::kBf16;
  for (int stage = 0; stage <= 3; ++stage) {
    const double formula = ZeroMemoryBytes(7'500'000'000, 64, stage, kZeroPaperMixed).Total() / 1e9;
    s.parallel.zero = stage;
    double planned = -1, params = 0;
    if (auto p = MakePlan(s, 64); p.ok()) {
      const v1::MemoryEstimate& m = p->memory_per_rank();
      params = double(p->num_params());
      // Scaled to exactly 7.5B parameters: the config has num_params of them.
      planned = double(m.params_bytes() + m.grads_bytes() + m.optimizer_bytes()) / params * 7.5;
    } else {
      std::fprintf(stderr, "plan: %s\n", p.status().ToString().c_str());
    }
    std::printf("%-8s %10.1f %16.2f %22.2f\n", ("Z" + std::to_string(stage)).c_str(), paper[stage],
                formula, planned);
    if (stage == 3) std::printf("(the GPT config has %.3fB params)\n", params / 1e9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string worlds = "2,4", variants = "0,1,2,3";
  CLI::App app{"ZeRO stages 0-3: tok/s and memory per rank, predicted vs measured"};
  app.add_option("--data", o.data, "text file to train on (byte tokens)");
  app.add_option("--worlds", worlds, "comma-separated rank counts");
  app.add_option("--variants", variants,
                 "comma-separated ZeRO variants: 0 1 2 3, 3k (no reshard), 3o (offload)");
  app.add_option("--steps", o.steps, "timed steps");
  app.add_option("--warmup", o.warmup, "untimed steps first");
  app.add_option("--repeat", o.repeat, "rounds over the variants (median tok/s reported)");
  app.add_option("--layers", o.layers, "transformer blocks");
  app.add_option("--dim", o.dim, "model width");
  app.add_option("--heads", o.heads, "attention heads (divide --dim)");
  app.add_option("--micro", o.micro, "sequences per rank per step");
  app.add_option("--seq", o.seq, "tokens per sequence");
  CLI11_PARSE(app, argc, argv);
  o.worlds.clear();
  for (absl::string_view w : absl::StrSplit(worlds, ','))
    o.worlds.push_back(std::atoi(std::string(w).c_str()));
  o.variants = absl::StrSplit(variants, ',');

  char tmpl[] = "/tmp/zero_bench.XXXXXX";
  const char* dir = mkdtemp(tmpl);
  if (dir == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string load_before = bench::Uptime();
  std::printf(
      "zero_bench: GPT L=%d C=%d NH=%d vocab 256, micro %d x seq %d per rank, 1 thread "
      "per rank, %d timed steps\n",
      o.layers, o.dim, o.heads, o.micro, o.seq, o.steps);
  std::printf("load before: %s\n", load_before.c_str());
  std::printf("\n%-5s %-4s %9s %13s %7s | %9s %9s %9s %9s %9s | %10s %10s | %6s\n", "world", "zero",
              "tok/s", "range", "vs z0", "pred MiB", "track MiB", "rss MiB", "trk/pred", "rss/pred",
              "sent MB", "pred MB", "load");
  for (int world : o.worlds) {
    // Rounds over the variants, interleaved so that drifts of the shared
    // machine's load hit every variant alike; per variant the median tok/s
    // over rounds (and its range), the memory of the last round.
    struct Acc {
      std::vector<double> tok_s;
      int64_t tracked = 0, rss = 0, sent = 0;
      double load = 0;
      v1::MemoryEstimate predicted;
      int64_t predicted_comm = 0;
    };
    std::vector<Acc> acc(o.variants.size());
    for (int round = 0; round < o.repeat; ++round) {
      for (size_t k = 0; k < o.variants.size(); ++k) {
        const std::string& variant = o.variants[k];
        acc[k].load = bench::LoadAverage1();
        auto spec = ParseJobSpec(SpecYaml(o, world, variant));
        if (!spec.ok()) {
          std::fprintf(stderr, "spec: %s\n", spec.status().ToString().c_str());
          return 1;
        }
        auto plan = MakePlan(*spec, world);
        if (!plan.ok()) {
          std::fprintf(stderr, "plan: %s\n", plan.status().ToString().c_str());
          return 1;
        }
        acc[k].predicted = plan->memory_per_rank();
        acc[k].predicted_comm = plan->comm_bytes_per_step();
        const std::vector<RankResult> ranks =
            RunLayout(*spec, dir, absl::StrCat("w", world, "z", variant, "r", round), o);
        if (ranks.empty()) {
          std::fprintf(stderr, "world %d zero %s: a rank failed\n", world, variant.c_str());
          continue;
        }
        // Slowest rank per step, median over steps; the busiest rank's memory.
        std::vector<double> step_ms(ranks.front().step_ms.size(), 0.0);
        int64_t tokens = 0;
        acc[k].tracked = acc[k].rss = acc[k].sent = 0;
        for (const RankResult& r : ranks) {
          for (size_t i = 0; i < step_ms.size() && i < r.step_ms.size(); ++i) {
            step_ms[i] = std::max(step_ms[i], r.step_ms[i]);
          }
          acc[k].tracked = std::max(acc[k].tracked, r.mem.Total());
          acc[k].rss = std::max(acc[k].rss, r.peak_rss - r.baseline_rss);
          acc[k].sent = std::max(acc[k].sent, r.comm_bytes);
          tokens += r.tokens;
        }
        acc[k].tok_s.push_back(tokens / (Median(step_ms) / 1e3));
      }
    }
    double base_tok_s = -1;
    for (size_t k = 0; k < o.variants.size(); ++k) {
      if (o.variants[k] == "0" && !acc[k].tok_s.empty()) base_tok_s = Median(acc[k].tok_s);
    }
    for (size_t k = 0; k < o.variants.size(); ++k) {
      const Acc& a = acc[k];
      if (a.tok_s.empty()) {
        std::printf("%-5d %-4s   (failed; see stderr)\n", world, o.variants[k].c_str());
        continue;
      }
      const double tok_s = Median(a.tok_s);
      const auto [lo, hi] = std::minmax_element(a.tok_s.begin(), a.tok_s.end());
      const v1::MemoryEstimate& m = a.predicted;
      const double pred = double(m.total_bytes() + m.host_bytes());  // a CPU rank holds both
      std::printf(
          "%-5d %-4s %9.1f %13s %7s | %9.1f %9.1f %9.1f %9.3f %9.3f | %10.2f %10.2f | %6.2f\n",
          world, o.variants[k].c_str(), tok_s, absl::StrFormat("%.0f-%.0f", *lo, *hi).c_str(),
          base_tok_s > 0 ? absl::StrFormat("%.2fx", tok_s / base_tok_s).c_str() : "-", pred / kMiB,
          a.tracked / kMiB, a.rss / kMiB, a.tracked / pred, a.rss / pred, a.sent / 1e6,
          a.predicted_comm / 1e6, a.load);
      std::fflush(stdout);
    }
  }
  std::printf(
      "\npred = planner's total (+ host) for the busiest rank; track = Trainer::memory() of the "
      "busiest rank\n(buffers + measured ZeRO working set); rss = peak RSS - RSS before the "
      "trainer; sent = bytes a rank sent per step.\n");
  PaperExample();
  std::printf("\nload after: %s\n", bench::Uptime().c_str());
  std::string rm = absl::StrCat("rm -rf ", dir);
  if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir);
  return 0;
}
