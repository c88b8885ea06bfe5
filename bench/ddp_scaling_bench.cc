// ddp_scaling_bench: data-parallel scaling of the CPU trainer on one machine.
// A benchmark, never a test: it prints numbers and ratios, it does not pass or
// fail.
//
// For each config (same model, same global batch of 2·B sequences of T
// tokens), in one run:
//   1r x 2t  one process, dp = 1, 2 compute threads, micro-batch 2·B
//            (the baseline the 2-rank run is compared with);
//   2r x 1t  two forked processes, dp = 2, 1 compute thread each, micro B,
//            Gloo over TCP on 127.0.0.1 (rendezvous through a FileStore);
//   torch    PyTorch DDP over Gloo, 2 processes x 1 thread, the same GPT-2
//            (bench/ddp_torch_peer.py under /usr/bin/python3);
//   1r x 1t B (diagnostic, --no-share skips it) one rank's share of the batch
//            alone: the 2-rank step minus this is the price of DDP (exposed
//            comm plus the comm threads' contention for the 2 cores).
// Each process runs its own worker::Trainer (data, DDP all-reduce, clipping,
// AdamW): `--warmup` steps, then `--steps` timed steps.
//
// Reported per row: ms per step (median over the timed steps of the slowest
// rank's step time: robust to bursts of other load); tok/s summed over ranks
// at that step time; exposed comm (StepResult::comm_ms, time blocked on the
// gradient all-reduce) and the all-reduce's own run time
// (StepResult::allreduce_ms, flight recorder), both per step and averaged over
// ranks; hidden = 1 - exposed/all-reduce, clamped to [0, 1], averaged over
// ranks and timed steps; ratios against the 1r x 2t baseline and against
// PyTorch DDP. After the timed steps each 2-rank run also all-reduces a
// gradient-sized buffer alone ("bare all-reduce"), and so does the torch peer,
// to separate transport cost from overlap.
//
// The machine has 2 cores and is shared: the load average is printed with the
// results, and each row's 1-minute load when it started.
//
// Usage: ddp_scaling_bench [--configs small,124m] [--quick] [--steps N]
//                          [--steps-124m N] [--warmup N] [--bucket-mb N]
//                          [--no-torch] [--no-share] [--json]
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "common/job_spec.h"
#include "common/model/config.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/rendezvous_store.h"
#include "worker/data/tokens.h"
#include "worker/trainer.h"

#ifndef SHARDTRAIN_BENCH_DDP_TORCH_SCRIPT
#define SHARDTRAIN_BENCH_DDP_TORCH_SCRIPT "bench/ddp_torch_peer.py"
#endif

namespace {
using namespace shardtrain;
using Clock = std::chrono::steady_clock;

constexpr int kVocab = 50257;         // GPT-2 tokenizer; the engine pads wte to 50304
constexpr int kDataTokens = 1 << 18;  // random tokens in the generated llm.c file
constexpr int kTorchTimeoutS = 600;   // the torch peer is killed after this long

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

struct Options {
  std::vector<std::string> configs = {"small", "124m"};
  bool quick = false;
  int steps = 8;       // timed steps, small config
  int steps_124m = 3;  // timed steps, GPT-2 124M (about 3 s each here)
  int warmup = 2;
  int bucket_mb = 25;
  bool torch = true;
  bool share = true;  // also run 1 rank x 1 thread on B alone (diagnostic)
  bool json = false;
};

// One model shape; B is the per-rank micro-batch of the 2-rank run.
struct BenchConfig {
  std::string name;
  int L, NH, C, context, B, T;
  int steps;
};

// One process layout to run the trainer with. `global` is the global batch
// in units of B: 2 for the compared layouts, 1 for the diagnostic run of one
// rank's share alone.
struct Layout {
  int ranks, threads, global = 2;
};

// What one rank measured.
struct RankResult {
  std::vector<worker::StepResult> steps;  // timed steps only
  double bare_allreduce_ms = -1;          // gradient-sized all-reduce alone (dp > 1)
};

// One row of the table.
struct Row {
  std::string config, setup;
  int ranks = 0, threads = 0;
  double tok_s = 0, ms_step = 0;
  double exposed_ms = -1, allreduce_ms = -1, hidden = -1;  // -1: not measured
  double bare_allreduce_ms = -1;
  double vs_single = -1, vs_torch = -1;
  double load1 = 0;
};

std::string SpecYaml(const BenchConfig& bc, const Layout& lay, const std::string& data,
                     int bucket_mb, int total_steps) {
  const int global = lay.global * bc.B;
  const int micro = global / lay.ranks;
  // clang-format off
  return absl::StrCat("name: ddp-bench-", bc.name, "\n",
                      "model: {layers: ", bc.L, ", heads: ", bc.NH, ", dim: ", bc.C,
                      ", context: ", bc.context, ", vocab: ", kVocab, "}\n",
                      "data: {train: \"", data, "\", format: llmc, tokenizer: gpt2}\n",
                      "batch: {global: ", global, ", micro: ", micro, ", seq_len: ", bc.T, "}\n",
                      "parallel: {dp: ", lay.ranks, ", bucket_mb: ", bucket_mb, "}\n",
                      "optimizer: {lr: 1e-4, weight_decay: 0.1}\n",
                      "steps: ", total_steps, "\n",
                      "timeouts: {collective_s: 300}\n");
  // clang-format on
}

// Child process body: runs rank `rank` and writes its RankResult to `out`.
// Returns the process exit code.
int RunRank(const JobSpec& spec, int rank, int threads, const std::string& store_dir,
            const std::string& prefix, int warmup, int steps, const std::string& out) {
  auto fail = [&](const absl::Status& s) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return 1;
  };
  const int dp = spec.parallel.dp;
  std::unique_ptr<comm::Communicator> comm;
  if (dp > 1) {
    comm::GlooOptions o;
    o.hostname = "127.0.0.1";
    o.timeout = absl::Seconds(300);
    o.prefix = prefix;
    o.group_name = "dp";
    auto c =
        comm::CreateGlooCommunicator(std::make_shared<comm::FileStore>(store_dir), rank, dp, o);
    if (!c.ok()) return fail(c.status());
    comm = *std::move(c);
  }
  auto trainer = worker::Trainer::Create(spec, rank, threads, comm.get());
  if (!trainer.ok()) return fail(trainer.status());
  RankResult res;
  for (int s = 1; s <= warmup; ++s) {
    if (auto r = (*trainer)->Step(s); !r.ok()) return fail(r.status());
  }
  for (int s = warmup + 1; s <= warmup + steps; ++s) {
    auto r = (*trainer)->Step(s);
    if (!r.ok()) return fail(r.status());
    res.steps.push_back(*r);
  }
  if (comm) {
    // The whole gradient once, in the trainer's buckets, all in flight; median of 3.
    std::vector<float> buf((*trainer)->engine().grads().count, 1.0f);
    const size_t bucket = size_t(spec.parallel.bucket_mb) * 1024 * 1024 / sizeof(float);
    std::vector<double> ms;
    for (int rep = 0; rep < 3; ++rep) {
      if (absl::Status s = comm->Barrier(); !s.ok()) return fail(s);
      const auto t = Clock::now();
      std::vector<std::shared_ptr<comm::Work>> work;
      for (size_t off = 0; off < buf.size(); off += bucket) {
        work.push_back(comm->AllReduceAsync(buf.data() + off, std::min(bucket, buf.size() - off),
                                            comm::DataType::kFloat32, comm::ReduceOp::kSum));
      }
      for (auto& w : work) {
        if (absl::Status s = w->Wait(); !s.ok()) return fail(s);
      }
      ms.push_back(MsSince(t));
    }
    std::sort(ms.begin(), ms.end());
    res.bare_allreduce_ms = ms[1];
    if (absl::Status s = comm->Shutdown(); !s.ok()) return fail(s);
  }
  std::ofstream f(out);
  f << "bare " << res.bare_allreduce_ms << "\n";
  for (const auto& r : res.steps) {
    f << "step " << r.step << ' ' << r.step_ms << ' ' << r.comm_ms << ' ' << r.allreduce_ms << ' '
      << r.tokens << ' ' << r.loss << "\n";
  }
  return f.good() ? 0 : 1;
}

bool ReadRankResult(const std::string& path, RankResult* res) {
  std::ifstream f(path);
  std::string key;
  while (f >> key) {
    if (key == "bare") {
      f >> res->bare_allreduce_ms;
    } else if (key == "step") {
      worker::StepResult r;
      f >> r.step >> r.step_ms >> r.comm_ms >> r.allreduce_ms >> r.tokens >> r.loss;
      res->steps.push_back(r);
    } else {
      return false;
    }
  }
  return !res->steps.empty();
}

// Forks one process per rank (the parent holds no threads), waits for all and
// returns their results, or an empty vector if any failed.
std::vector<RankResult> RunLayout(const BenchConfig& bc, const Layout& lay, const std::string& dir,
                                  const std::string& data, const Options& opt) {
  const int total = opt.warmup + bc.steps;
  auto spec = ParseJobSpec(SpecYaml(bc, lay, data, opt.bucket_mb, total));
  if (!spec.ok()) {
    std::fprintf(stderr, "spec: %s\n", spec.status().ToString().c_str());
    return {};
  }
  const std::string tag =
      absl::StrCat(bc.name, "-", lay.ranks, "r", lay.threads, "t", lay.global, "b");
  const std::string store_dir = absl::StrCat(dir, "/store-", tag);
  mkdir(store_dir.c_str(), 0700);
  const bool ok = bench::ForkRanks(lay.ranks, [&](int r) {
    return RunRank(*spec, r, lay.threads, store_dir, "ddp_bench/" + tag, opt.warmup, bc.steps,
                   absl::StrCat(dir, "/", tag, ".rank", r));
  });
  if (!ok) return {};
  std::vector<RankResult> out(lay.ranks);
  for (int r = 0; r < lay.ranks; ++r) {
    if (!ReadRankResult(absl::StrCat(dir, "/", tag, ".rank", r), &out[r])) return {};
  }
  return out;
}

Row Summarize(const BenchConfig& bc, const Layout& lay, const std::vector<RankResult>& ranks) {
  Row row;
  row.config = bc.name;
  row.setup = absl::StrCat(lay.ranks, "r x ", lay.threads, "t");
  if (lay.global != 2) absl::StrAppend(&row.setup, " B", lay.global * bc.B);
  row.ranks = lay.ranks;
  row.threads = lay.threads;
  // A step lasts as long as its slowest rank; the median step resists bursts
  // of other load on a shared machine.
  const size_t steps = ranks.front().steps.size();
  std::vector<double> step_ms(steps, 0.0);
  double exposed = 0, allreduce = 0, hidden = 0, bare = 0;
  int n = 0;
  for (const RankResult& r : ranks) {
    bare = std::max(bare, r.bare_allreduce_ms);
    for (size_t i = 0; i < steps && i < r.steps.size(); ++i) {
      step_ms[i] = std::max(step_ms[i], r.steps[i].step_ms);
    }
    for (const worker::StepResult& s : r.steps) {
      exposed += s.comm_ms;
      allreduce += s.allreduce_ms;
      hidden += s.allreduce_ms > 0 ? std::clamp(1.0 - s.comm_ms / s.allreduce_ms, 0.0, 1.0) : 0.0;
      ++n;
    }
  }
  std::sort(step_ms.begin(), step_ms.end());
  row.ms_step = steps % 2 ? step_ms[steps / 2] : (step_ms[steps / 2 - 1] + step_ms[steps / 2]) / 2;
  double tokens = 0;  // per step, all ranks
  for (const RankResult& r : ranks) tokens += r.steps.front().tokens;
  row.tok_s = tokens / (row.ms_step / 1e3);
  if (lay.ranks > 1) {
    row.exposed_ms = exposed / n;
    row.allreduce_ms = allreduce / n;
    row.hidden = hidden / n;
    row.bare_allreduce_ms = bare;
  }
  return row;
}

// Runs the PyTorch DDP peer (2 processes x 1 thread). False if it failed.
bool RunTorch(const BenchConfig& bc, int padded_vocab, const Options& opt, Row* row) {
  const std::string cmd = absl::StrCat(
      "OMP_WAIT_POLICY=PASSIVE timeout ", kTorchTimeoutS, " /usr/bin/python3 ",
      SHARDTRAIN_BENCH_DDP_TORCH_SCRIPT, " --layers ", bc.L, " --heads ", bc.NH, " --dim ", bc.C,
      " --context ", bc.context, " --vocab ", padded_vocab, " --batch ", bc.B, " --seq ", bc.T,
      " --ranks 2 --threads 1", " --warmup ", opt.warmup, " --steps ", bc.steps, " 2>&1");
  std::fflush(nullptr);
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return false;
  char line[1024];
  double ms = -1, tok_s = -1, ar = -1;
  while (std::fgets(line, sizeof line, p) != nullptr) {
    double v;
    if (std::sscanf(line, "ms_per_step %lf", &v) == 1) {
      ms = v;
    } else if (std::sscanf(line, "tok_s %lf", &v) == 1) {
      tok_s = v;
    } else if (std::sscanf(line, "allreduce_ms %lf", &v) == 1) {
      ar = v;
    } else if (std::sscanf(line, "grad_mib %lf", &v) != 1) {
      std::fprintf(stderr, "  torch: %s", line);
    }
  }
  const int rc = pclose(p);
  if (rc != 0 || tok_s <= 0) return false;
  row->config = bc.name;
  row->setup = "torch 2r x 1t";
  row->ranks = 2;
  row->threads = 1;
  row->tok_s = tok_s;
  row->ms_step = ms;
  row->bare_allreduce_ms = ar;
  return true;
}

std::string Num(double v, const char* fmt) {
  if (v < 0) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string Signed(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s %.0f", v < 0 ? "-" : "+", v < 0 ? -v : v);
  return buf;
}

void PrintJson(const Row& r) {
  auto field = [](const char* k, double v) {
    return v < 0 ? absl::StrCat(", \"", k, "\": null") : absl::StrCat(", \"", k, "\": ", v);
  };
  std::printf(
      "{\"config\": \"%s\", \"setup\": \"%s\", \"ranks\": %d, \"threads\": %d%s%s%s%s%s%s%s%s%s}\n",
      r.config.c_str(), r.setup.c_str(), r.ranks, r.threads, field("tok_s", r.tok_s).c_str(),
      field("ms_per_step", r.ms_step).c_str(), field("exposed_comm_ms", r.exposed_ms).c_str(),
      field("allreduce_ms", r.allreduce_ms).c_str(), field("hidden_fraction", r.hidden).c_str(),
      field("bare_allreduce_ms", r.bare_allreduce_ms).c_str(),
      field("ratio_vs_1r2t", r.vs_single).c_str(), field("ratio_vs_torch_ddp", r.vs_torch).c_str(),
      field("load1", r.load1).c_str());
}

void PrintTable(const std::vector<Row>& rows) {
  std::printf("%-6s %-14s %9s %9s %11s %10s %7s %10s %9s %9s %6s\n", "config", "setup", "tok/s",
              "ms/step", "exposed ms", "allred ms", "hidden", "bare AR ms", "vs 1rx2t", "vs torch",
              "load1");
  for (const Row& r : rows) {
    std::printf("%-6s %-14s %9.1f %9.1f %11s %10s %7s %10s %9s %9s %6.2f\n", r.config.c_str(),
                r.setup.c_str(), r.tok_s, r.ms_step, Num(r.exposed_ms, "%.1f").c_str(),
                Num(r.allreduce_ms, "%.1f").c_str(), Num(r.hidden * 100, "%.0f%%").c_str(),
                Num(r.bare_allreduce_ms, "%.1f").c_str(), Num(r.vs_single, "%.2fx").c_str(),
                Num(r.vs_torch, "%.2fx").c_str(), r.load1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  std::string configs = "small,124m";
  CLI::App app{"DDP scaling on CPU: 1 rank x 2 threads vs 2 ranks x 1 thread vs PyTorch DDP"};
  app.add_option("--configs", configs, "comma-separated: small, 124m");
  app.add_flag("--quick", opt.quick, "small config only");
  app.add_option("--steps", opt.steps, "timed steps (small)")->check(CLI::PositiveNumber);
  app.add_option("--steps-124m", opt.steps_124m, "timed steps (124m)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", opt.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--bucket-mb", opt.bucket_mb, "parallel.bucket_mb")->check(CLI::PositiveNumber);
  bool no_torch = false, no_share = false;
  app.add_flag("--no-share", no_share,
               "skip the diagnostic 1r x 1t run of one rank's share (B) alone");
  app.add_flag("--no-torch", no_torch, "skip the PyTorch DDP peer");
  app.add_flag("--json", opt.json, "one JSON object per row instead of the table");
  CLI11_PARSE(app, argc, argv);
  opt.torch = !no_torch;
  opt.share = !no_share;
  opt.configs = absl::StrSplit(configs, ',', absl::SkipEmpty());
  if (opt.quick) opt.configs = {"small"};

  std::vector<BenchConfig> plan;
  for (const std::string& name : opt.configs) {
    if (name == "small") {
      plan.push_back({"small", 4, 4, 256, 64, 4, 64, opt.steps});
    } else if (name == "124m") {
      plan.push_back({"124m", 12, 12, 768, 1024, 4, 64, opt.steps_124m});
    } else {
      std::fprintf(stderr, "--configs: unknown config \"%s\" (small, 124m)\n", name.c_str());
      return 2;
    }
  }

  char tmpl[] = "/tmp/ddp_scaling_bench.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  const std::string data = dir + "/train.bin";
  {
    std::mt19937 rng(1234);
    std::vector<uint16_t> tokens(kDataTokens);
    for (auto& t : tokens) t = uint16_t(rng() % kVocab);
    if (absl::Status s = data::WriteLlmcTokens(data, tokens); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }

  const std::string load_before = bench::Uptime();
  if (!opt.json) {
    std::printf(
        "# ddp_scaling_bench: fp32, T=64, B=4 per rank (global 8), Gloo on 127.0.0.1, "
        "%d warm-up steps\n# load before: %s\n",
        opt.warmup, load_before.c_str());
  }
  std::vector<Row> rows;
  std::vector<std::string> notes;
  int failures = 0;
  for (const BenchConfig& bc : plan) {
    auto config = model::MakeGptConfig(bc.L, bc.NH, bc.C, bc.context, kVocab);
    if (!config.ok()) {
      std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
      return 1;
    }
    if (!opt.json) {
      std::printf("# %s: L%d C%d NH%d V%d (padded %d), %d timed steps\n", bc.name.c_str(), bc.L,
                  bc.C, bc.NH, kVocab, config->padded_vocab, bc.steps);
    }
    Row single, ddp, torch, share;
    bool have_single = false, have_ddp = false, have_torch = false, have_share = false;
    std::vector<Layout> layouts = {Layout{1, 2}, Layout{2, 1}};
    if (opt.share) layouts.push_back(Layout{1, 1, 1});
    for (const Layout& lay : layouts) {
      const double load = bench::LoadAverage1();
      auto res = RunLayout(bc, lay, dir, data, opt);
      if (res.empty()) {
        std::fprintf(stderr, "%s %dr x %dt: failed\n", bc.name.c_str(), lay.ranks, lay.threads);
        ++failures;
        continue;
      }
      Row r = Summarize(bc, lay, res);
      r.load1 = load;
      if (lay.global == 1) {
        share = r;
        have_share = true;
      } else {
        (lay.ranks == 1 ? single : ddp) = r;
        (lay.ranks == 1 ? have_single : have_ddp) = true;
      }
    }
    if (opt.torch) {
      const double load = bench::LoadAverage1();
      have_torch = RunTorch(bc, config->padded_vocab, opt, &torch);
      torch.load1 = load;
      if (!have_torch) {
        std::fprintf(stderr, "%s torch peer: failed\n", bc.name.c_str());
        ++failures;
      }
    }
    if (have_single) single.vs_single = 1.0;
    if (have_ddp && have_single) ddp.vs_single = ddp.tok_s / single.tok_s;
    if (have_torch) {
      torch.vs_torch = 1.0;
      if (have_single) single.vs_torch = single.tok_s / torch.tok_s;
      if (have_ddp) ddp.vs_torch = ddp.tok_s / torch.tok_s;
    }
    for (auto [have, row] : {std::pair{have_single, &single},
                             {have_ddp, &ddp},
                             {have_torch, &torch},
                             {have_share, &share}}) {
      if (!have) continue;
      rows.push_back(*row);
      if (opt.json) PrintJson(*row);
    }
    if (have_share && !opt.json) {
      // Where the 2-rank run's time goes, against one rank's share computed alone.
      std::string line = absl::StrCat("# ", bc.name, ": one rank's share alone (1r x 1t, B", bc.B,
                                      ") ", Num(share.ms_step, "%.0f"), " ms/step");
      if (have_ddp) {
        absl::StrAppend(&line, "; 2r x 1t = ", Num(ddp.ms_step, "%.0f"), " ms/step = that + ",
                        Num(ddp.exposed_ms, "%.0f"), " exposed comm ",
                        Signed(ddp.ms_step - share.ms_step - ddp.exposed_ms),
                        " other (contention with the comm threads, load)");
      }
      if (have_single) {
        absl::StrAppend(&line, "; 1r x 2t on 2B takes ",
                        Num(single.ms_step / share.ms_step, "%.2f"), "x of it");
      }
      notes.push_back(line);
    }
  }
  if (!opt.json) {
    std::printf("\n");
    PrintTable(rows);
    std::printf("\n");
    for (const std::string& n : notes) std::printf("%s\n", n.c_str());
    std::printf(
        "\n# ms/step: median over timed steps of the slowest rank's step; tok/s: tokens of all\n"
        "# ranks per step / ms/step.\n"
        "# exposed ms: time blocked on the gradient all-reduce per step; allred ms: the\n"
        "# all-reduce's run time (flight recorder); hidden = 1 - exposed/allred (clamped,\n"
        "# mean over ranks and timed steps). bare AR ms: the whole fp32 gradient all-reduced\n"
        "# alone after the run (25 MiB buckets; torch: dist.all_reduce the same way).\n"
        "# targets: 2r x 1t / 1r x 2t >= 0.9, 2r x 1t / torch DDP >= 1.5.\n"
        "# load after: %s\n",
        bench::Uptime().c_str());
  }
  std::string rm = "rm -rf " + dir;
  if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir.c_str());
  return failures == 0 ? 0 : 1;
}
