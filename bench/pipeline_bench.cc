// pipeline_bench: tensor and pipeline parallelism on CPU thread ranks (one
// Trainer per rank, Gloo over 127.0.0.1, an in-memory rendezvous store), a
// small GPT, fp32. A benchmark, never a test: it prints measurements next to
// a baseline from the same run (a formula, or a layout measured in the same
// run) and their ratio; nothing passes or fails.
//
//   1. Bubble. pp 2 and 4, m = 1, 4, 8 micro-batches, GPipe and 1F1B
//      (dp 1, tp 1): the measured bubble is the mean over stages and timed
//      steps of StepResult::bubble (the stage's idle fraction of the step,
//      from the pipeline executor's per-action timeline), next to
//      (pp - 1) / (m + pp - 1) (pipeline_schedule.h: BubbleFraction), and the step
//      time next to pp 1 at the same m (the whole model on one rank). With
//      more rank threads than cores the stages share cores: a stage waiting
//      for a core looks busy or idle depending on where it is preempted, so
//      the measurement is distorted there (either way); the output says so
//      per row, and when the load average exceeds the cores.
//   2. Activation memory, pp 4: per stage Engine::activation_bytes() (slots
//      × saved + scratch, allocated once: slots = PeakInFlight of the
//      stage's schedule), via Trainer::memory(), and the resident bytes
//      (set_measure_memory) after the timed steps; 1F1B vs GPipe at each m.
//      1F1B holds min(m, pp - s) micro-batches, GPipe m.
//   3. Tensor-parallel bytes, tp 2 and 4 (pp 1, dp 1): StepResult::tp_bytes
//      per rank per step next to the formula, per layer and
//      micro-batch 2 all-reduces of B·T·C fp32 forward and 2 backward, each
//      sending 2·(tp - 1)/tp of its bytes (ring model):
//        core   = L · m · 4 · B·T·C · 4 B · 2(tp - 1)/tp
//      plus what the engine all-reduces besides, per micro-batch: the
//      vocabulary-parallel embedding (B·T·C forward, first stage), the LM
//      head's input gradient (B·T·C backward, last stage) and 3 of B·T
//      floats in the vocabulary-parallel cross-entropy (max, sum, loss):
//        extras = m · (2·B·T·C + 3·B·T) · 4 B · 2(tp - 1)/tp
//      Step time next to tp 1 measured in the same run.
//   4. Interleaved 1F1B (v model chunks per stage, parallel.pp_virtual):
//      the schedule's simulated idle fraction (pipeline_schedule.h
//      SimulateInterleaved, equal costs) next to (pp - 1) / (v·m + pp - 1)
//      and 1F1B's bubble; then measured runs, pp 2 and 4 at m = pp and 2·pp,
//      v = 1 and 2 in the same run: the measured bubble (as in table 1) next
//      to the formula, the step time of v = 2 next to v = 1's, and each
//      stage's activation allocation (v = 2 keeps each chunk's own peak of
//      half-size sets) next to v = 1's.
//
// Usage: pipeline_bench [--steps 10] [--warmup 2] [--threads 1] [--quick]
//                       [--layers 8] [--heads 4] [--dim 128] [--seq 64]
//                       [--micro 2] [--tp-m 2]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "common/job_spec.h"
#include "common/parallel_dims.h"
#include "common/pipeline_schedule.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/rendezvous_store.h"
#include "worker/trainer.h"

namespace {
using namespace shardtrain;
namespace fs = std::filesystem;

constexpr double kMiB = 1024.0 * 1024.0;

struct Options {
  int steps = 10, warmup = 2, threads = 1;
  bool quick = false;
  int layers = 8, heads = 4, dim = 128, seq = 64, micro = 2;
  int tp_m = 2;  // micro-batches per step in table 3
  std::vector<int> pps = {2, 4}, ms = {1, 4, 8}, tps = {2, 4};
};

struct Layout {
  int tp = 1, pp = 1, m = 1;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int v = 1;  // parallel.pp_virtual
  int world() const { return tp * pp; }
};

const char* ScheduleName(PipelineSchedule s) {
  return s == PipelineSchedule::kGpipe ? "gpipe" : "1f1b";
}

std::string Tag(const Layout& l) {
  return absl::StrCat("tp", l.tp, "pp", l.pp, "m", l.m, ScheduleName(l.schedule), "v", l.v);
}

// What one rank measured.
struct RankOut {
  int stage = 0;
  std::vector<worker::StepResult> steps;  // the timed ones
  worker::MemoryUse allocated, resident;  // after the timed steps
  int slots = 0;
  int64_t saved_bytes = 0, scratch_bytes = 0;  // per slot / shared
};

std::string SpecYaml(const Options& o, const Layout& l, const std::string& train) {
  // steps: more than the bench runs, so that no step is the last (no eval).
  return absl::StrCat("name: pipeline-bench\n", "model: {layers: ", o.layers, ", heads: ", o.heads,
                      ", dim: ", o.dim, ", context: ", o.seq, ", vocab: 256}\n", "data: {train: \"",
                      train, "\", format: text, tokenizer: byte}\n",
                      "batch: {global: ", o.micro * l.m, ", micro: ", o.micro, ", seq_len: ", o.seq,
                      "}\n", "parallel: {dp: 1, tp: ", l.tp, ", pp: ", l.pp,
                      ", schedule: ", ScheduleName(l.schedule), ", pp_virtual: ", l.v, "}\n",
                      "optimizer: {lr: 1e-4, weight_decay: 0.1}\n", "steps: 1000000\n",
                      "timeouts: {collective_s: 300}\n");
}

// Runs `l` on one thread per rank: a Trainer each, o.warmup untimed steps,
// then o.steps timed ones. Empty (and a message on stderr) when a rank
// failed.
std::vector<RankOut> RunLayout(const Options& o, const Layout& l, const std::string& train) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(SpecYaml(o, l, train));
  if (!spec.ok()) {
    std::fprintf(stderr, "%s: spec: %s\n", Tag(l).c_str(), spec.status().ToString().c_str());
    return {};
  }
  const ParallelDims dims = *spec->Dims();
  const int world = dims.world();
  std::vector<RankOut> out(world);
  std::mutex mu;
  std::vector<std::string> errors;
  auto fail = [&](int rank, const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    errors.push_back(absl::StrCat("rank ", rank, ": ", s.ToString()));
  };
  auto store = std::make_shared<comm::InMemoryStore>();
  comm::GlooOptions go;
  go.hostname = "127.0.0.1";
  go.timeout = absl::Seconds(300);
  go.prefix = "pipeline_bench/" + Tag(l);
  auto body = [&](int rank) {
    std::unique_ptr<comm::Communicator> comm;
    if (world > 1) {
      auto c = comm::CreateGlooCommunicator(store, rank, world, go);
      if (!c.ok()) return fail(rank, c.status());
      comm = *std::move(c);
    }
    {
      auto trainer = worker::Trainer::Create(*spec, rank, o.threads, comm.get());
      if (!trainer.ok()) return fail(rank, trainer.status());
      RankOut& r = out[rank];
      r.stage = dims.Coord(rank).pp;
      for (int s = 1; s <= o.warmup + o.steps; ++s) {
        absl::StatusOr<worker::StepResult> step = (*trainer)->Step(s);
        if (!step.ok()) return fail(rank, step.status());
        if (s > o.warmup) r.steps.push_back(*step);
      }
      r.allocated = (*trainer)->memory();
      (*trainer)->set_measure_memory(true);
      r.resident = (*trainer)->memory();
      const engine::Engine& e = (*trainer)->engine();
      r.slots = e.slots();
      r.saved_bytes = e.activations().saved_bytes();
      r.scratch_bytes = e.activations().scratch_bytes();
    }
    if (comm != nullptr) {
      if (absl::Status s = comm->Shutdown(); !s.ok()) fail(rank, s);
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(body, r);
  for (std::thread& t : threads) t.join();
  if (!errors.empty()) {
    for (const std::string& e : errors) std::fprintf(stderr, "%s: %s\n", Tag(l).c_str(), e.c_str());
    return {};
  }
  return out;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Per timed step the slowest rank's step_ms; their median.
double StepMs(const std::vector<RankOut>& ranks) {
  std::vector<double> slowest(ranks.front().steps.size(), 0.0);
  for (const RankOut& r : ranks) {
    for (size_t i = 0; i < slowest.size() && i < r.steps.size(); ++i) {
      slowest[i] = std::max(slowest[i], r.steps[i].step_ms);
    }
  }
  return Median(slowest);
}

// The mean of StepResult::bubble over stages and timed steps, and the
// lowest and highest stage mean.
struct Bubble {
  double mean = 0, lo = 1, hi = 0;
};
Bubble MeasuredBubble(const std::vector<RankOut>& ranks) {
  Bubble b;
  double sum = 0;
  int n = 0;
  for (const RankOut& r : ranks) {
    double stage = 0;
    for (const worker::StepResult& s : r.steps) stage += s.bubble;
    sum += stage;
    n += static_cast<int>(r.steps.size());
    stage /= std::max<size_t>(r.steps.size(), 1);
    b.lo = std::min(b.lo, stage);
    b.hi = std::max(b.hi, stage);
  }
  b.mean = n > 0 ? sum / n : 0;
  return b;
}

// The ring-model bytes one rank sends for an all-reduce of `count` floats.
double RingBytes(double count, int tp) { return count * 4.0 * 2.0 * (tp - 1) / tp; }

std::string Cores(int ranks, int threads, unsigned cores) {
  return ranks * threads > static_cast<int>(cores) ? "shared" : "own";
}

// Table 1 (and the pp 4 runs table 2 reads). Returns the pp 4 runs by
// [m index][schedule: 0 gpipe, 1 1f1b].
std::vector<std::vector<std::vector<RankOut>>> BubbleTable(const Options& o,
                                                           const std::string& train,
                                                           unsigned cores) {
  std::printf(
      "\n== 1. Pipeline bubble (dp 1, tp 1): measured = mean over stages and %d timed steps of "
      "StepResult.bubble;\n   formula = (pp-1)/(m+pp-1); step ms = median over steps of the "
      "slowest rank, vs pp 1 (same m, one rank) ==\n",
      o.steps);
  std::printf("%-3s %-2s %-6s %9s %9s %7s | %9s %9s %9s %13s | %-6s %5s\n", "pp", "m", "sched",
              "step ms", "pp1 ms", "vs pp1", "measured", "formula", "meas/form", "stage range",
              "cores", "load");
  std::vector<std::vector<std::vector<RankOut>>> pp4(o.ms.size(),
                                                     std::vector<std::vector<RankOut>>(2));
  std::vector<double> pp1_ms(o.ms.size(), 0);
  for (size_t k = 0; k < o.ms.size(); ++k) {
    const std::vector<RankOut> base = RunLayout(o, Layout{1, 1, o.ms[k]}, train);
    if (!base.empty()) pp1_ms[k] = StepMs(base);
  }
  for (int pp : o.pps) {
    for (size_t k = 0; k < o.ms.size(); ++k) {
      const int m = o.ms[k];
      for (PipelineSchedule sched : {PipelineSchedule::kGpipe, PipelineSchedule::k1F1B}) {
        const double load = bench::LoadAverage1();
        std::vector<RankOut> ranks = RunLayout(o, Layout{1, pp, m, sched}, train);
        if (ranks.empty()) {
          std::printf("%-3d %-2d %-6s   (failed; see stderr)\n", pp, m, ScheduleName(sched));
          continue;
        }
        const double ms = StepMs(ranks);
        const Bubble b = MeasuredBubble(ranks);
        const double formula = parallel::BubbleFraction(pp, m);
        std::printf("%-3d %-2d %-6s %9.1f %9.1f %6.2fx | %9.3f %9.3f %9.3f %13s | %-6s %5.2f\n", pp,
                    m, ScheduleName(sched), ms, pp1_ms[k], pp1_ms[k] > 0 ? ms / pp1_ms[k] : 0,
                    b.mean, formula, b.mean / formula,
                    absl::StrFormat("%.3f-%.3f", b.lo, b.hi).c_str(),
                    Cores(pp, o.threads, cores).c_str(), load);
        std::fflush(stdout);
        if (pp == 4) pp4[k][sched == PipelineSchedule::kGpipe ? 0 : 1] = std::move(ranks);
      }
    }
  }
  std::printf(
      "cores: %u on this machine (std::thread::hardware_concurrency); pp ranks x %d thread(s) "
      "each. Rows marked 'shared' run more\nrank threads than cores: the stages share cores (and "
      "with Gloo's threads), so the measured bubble there is distorted, either way: an action "
      "preempted\nwhile computing counts the lost time as busy (lower bubble), a stage whose "
      "neighbour is preempted waits longer (higher).\n",
      cores, o.threads);
  if (bench::LoadAverage1() > cores) {
    std::printf(
        "The 1-minute load (%.2f) is above the %u cores: other processes share them as well, on "
        "every row ('own' included).\n",
        bench::LoadAverage1(), cores);
  }
  return pp4;
}

void InterleavedTable(const Options& o, const std::string& train, unsigned cores) {
  std::printf(
      "\n== 4. Interleaved 1F1B, v model chunks per stage: simulated idle fraction (equal "
      "costs) ==\n");
  std::printf("%-3s %-3s %-2s | %9s %9s %7s | %9s %9s\n", "pp", "m", "v", "simulated", "formula",
              "ratio", "1f1b", "1f1b/sim");
  for (int pp : {2, 4}) {
    for (int m : {pp, 2 * pp, 4 * pp}) {
      for (int v : {1, 2, 4}) {
        const absl::StatusOr<parallel::SimulatedTimeline> t =
            parallel::SimulateInterleaved(pp, m, v, 1.0, 1.0);
        if (!t.ok()) {
          std::printf("%-3d %-3d %-2d | %s\n", pp, m, v, t.status().ToString().c_str());
          continue;
        }
        const double formula = parallel::BubbleFraction(pp, m, v);
        const double plain = parallel::BubbleFraction(pp, m);
        std::printf("%-3d %-3d %-2d | %9.4f %9.4f %6.2fx | %9.4f %8.2fx\n", pp, m, v,
                    t->idle_fraction(), formula, t->idle_fraction() / formula, plain,
                    plain / t->idle_fraction());
      }
    }
  }
  std::printf(
      "\n   measured (dp 1, tp 1, 1F1B; v 2 = two chunks per stage): bubble as in table 1, "
      "formula (pp-1)/(v*m+pp-1); step ms and activation MiB\n   (the largest stage's "
      "allocation) vs v 1 in the same run ==\n");
  std::printf("%-3s %-3s %-2s | %9s %7s | %9s %9s %9s | %9s %7s | %-6s %5s\n", "pp", "m", "v",
              "step ms", "vs v1", "measured", "formula", "meas/form", "act MiB", "vs v1", "cores",
              "load");
  std::vector<int> pps = o.quick ? std::vector<int>{2} : std::vector<int>{2, 4};
  for (int pp : pps) {
    if (o.layers % (2 * pp) != 0) {
      std::printf("%-3d (skipped: --layers %d is not a multiple of pp x 2)\n", pp, o.layers);
      continue;
    }
    for (int m : {pp, 2 * pp}) {
      double base_ms = 0, base_act = 0;
      for (int v : {1, 2}) {
        const double load = bench::LoadAverage1();
        const std::vector<RankOut> ranks =
            RunLayout(o, Layout{1, pp, m, PipelineSchedule::k1F1B, v}, train);
        if (ranks.empty()) {
          std::printf("%-3d %-3d %-2d   (failed; see stderr)\n", pp, m, v);
          continue;
        }
        const double ms = StepMs(ranks);
        const Bubble b = MeasuredBubble(ranks);
        const double formula = parallel::BubbleFraction(pp, m, v);
        double act = 0;
        for (const RankOut& r : ranks) act = std::max(act, double(r.allocated.activations));
        if (v == 1) {
          base_ms = ms;
          base_act = act;
        }
        std::printf(
            "%-3d %-3d %-2d | %9.1f %6.2fx | %9.3f %9.3f %9.3f | %9.3f %6.2fx | %-6s %5.2f\n", pp,
            m, v, ms, base_ms > 0 ? ms / base_ms : 0, b.mean, formula, b.mean / formula, act / kMiB,
            base_act > 0 ? act / base_act : 0, Cores(pp, o.threads, cores).c_str(), load);
        std::fflush(stdout);
      }
    }
  }
  std::printf(
      "v 2 sends every chunk's activations and gradients (2x the messages of v 1); the "
      "formula assumes they cost nothing.\n");
}

const RankOut* StageOf(const std::vector<RankOut>& ranks, int stage) {
  for (const RankOut& r : ranks) {
    if (r.stage == stage) return &r;
  }
  return nullptr;
}

void MemoryTable(const Options& o, const std::vector<std::vector<std::vector<RankOut>>>& pp4) {
  const int pp = 4;
  std::printf(
      "\n== 2. Activation memory per stage, pp 4 (Trainer::memory().activations = "
      "Engine::activation_bytes(): slots x saved + scratch;\n   resident = the same with "
      "set_measure_memory(true), after the timed steps); expected slots: GPipe m, 1F1B "
      "min(m, pp-s) ==\n");
  std::printf("%-2s %-5s | %5s %5s %9s %9s %9s | %5s %5s %9s %9s | %9s %9s\n", "m", "stage", "1f1b",
              "exp", "MiB", "resid MiB", "vs m=pp", "gpipe", "exp", "MiB", "resid MiB",
              "gpipe/1f1b", "alloc ok");
  // 1F1B's allocation per stage at the smallest m >= pp in the list: from
  // there on it should not grow with m (min(m, pp - s) = pp - s).
  std::vector<int64_t> f1b_base(pp, 0);
  for (size_t k = 0; k < o.ms.size(); ++k) {
    if (o.ms[k] < pp || pp4[k][1].empty()) continue;
    for (int s = 0; s < pp; ++s) {
      if (const RankOut* r = StageOf(pp4[k][1], s)) f1b_base[s] = r->allocated.activations;
    }
    break;
  }
  for (size_t k = 0; k < o.ms.size(); ++k) {
    const int m = o.ms[k];
    const std::vector<RankOut>& g = pp4[k][0];
    const std::vector<RankOut>& f = pp4[k][1];
    if (g.empty() || f.empty()) {
      std::printf("%-2d (no pp 4 run at this m)\n", m);
      continue;
    }
    for (int s = 0; s < pp; ++s) {
      const RankOut* rg = StageOf(g, s);
      const RankOut* rf = StageOf(f, s);
      if (rg == nullptr || rf == nullptr) continue;
      const int64_t fa = rf->allocated.activations, ga = rg->allocated.activations;
      // The allocation as the table says it should be, in fp32.
      auto expect = [](const RankOut& r) { return r.saved_bytes * r.slots + r.scratch_bytes; };
      const bool ok = expect(*rf) == fa && expect(*rg) == ga;
      std::printf(
          "%-2d %-5d | %5d %5d %9.3f %9.3f %9s | %5d %5d %9.3f %9.3f | %9.2fx %9s\n", m, s,
          rf->slots, std::min(m, pp - s), fa / kMiB, rf->resident.activations / kMiB,
          f1b_base[s] > 0 ? absl::StrFormat("%.2fx", double(fa) / f1b_base[s]).c_str() : "-",
          rg->slots, m, ga / kMiB, rg->resident.activations / kMiB, double(ga) / fa,
          ok ? "yes" : "NO");
    }
  }
  if (!pp4.empty() && !pp4[0][1].empty()) {
    std::printf("per stage (pp 4): saved per slot / scratch MiB:");
    for (int s = 0; s < pp; ++s) {
      if (const RankOut* r = StageOf(pp4[0][1], s)) {
        std::printf(" s%d %.3f/%.3f", s, r->saved_bytes / kMiB, r->scratch_bytes / kMiB);
      }
    }
    std::printf(
        "\nvs m=pp: 1F1B's allocation at this m over its allocation at the smallest m >= pp "
        "run (flat in m: 1.00x for every m >= pp); alloc ok: allocated == (slots x saved + "
        "scratch) x 4 B.\n");
  }
}

void TensorParallelTable(const Options& o, const std::string& train, unsigned cores) {
  const double B = o.micro, T = o.seq, C = o.dim, L = o.layers, m = o.tp_m;
  std::printf(
      "\n== 3. Tensor-parallel bytes sent per rank per step, pp 1, dp 1, m %d (B %d, T %d, C %d, "
      "L %d): measured = StepResult.tp_bytes;\n   core = L*m*4*B*T*C*4*2(tp-1)/tp; +extras = "
      "core + m*(2*B*T*C + 3*B*T)*4*2(tp-1)/tp; step ms vs tp 1 in the same run ==\n",
      o.tp_m, o.micro, o.seq, o.dim, o.layers);
  std::printf("%-3s %9s %7s | %12s %12s %12s %10s %10s %-6s | %-6s %5s\n", "tp", "step ms",
              "vs tp1", "measured MB", "core MB", "+extras MB", "meas/core", "meas/+ext",
              "ranks=", "cores", "load");
  double base_ms = 0;
  std::vector<int> tps = {1};
  tps.insert(tps.end(), o.tps.begin(), o.tps.end());
  for (int tp : tps) {
    const double load = bench::LoadAverage1();
    const std::vector<RankOut> ranks = RunLayout(o, Layout{tp, 1, o.tp_m}, train);
    if (ranks.empty()) {
      std::printf("%-3d   (failed; see stderr)\n", tp);
      continue;
    }
    const double ms = StepMs(ranks);
    if (tp == 1) base_ms = ms;
    // Mean over ranks and timed steps; whether every rank sent the same.
    double sum = 0;
    int n = 0;
    int64_t lo = INT64_MAX, hi = 0;
    for (const RankOut& r : ranks) {
      for (const worker::StepResult& s : r.steps) {
        sum += double(s.tp_bytes);
        ++n;
        lo = std::min(lo, s.tp_bytes);
        hi = std::max(hi, s.tp_bytes);
      }
    }
    const double measured = n > 0 ? sum / n : 0;
    const double core = RingBytes(L * m * 4 * B * T * C, tp);
    const double extras = core + RingBytes(m * (2 * B * T * C + 3 * B * T), tp);
    auto ratio = [&](double f) {
      return f > 0 ? absl::StrFormat("%.3f", measured / f) : std::string("-");
    };
    std::printf("%-3d %9.1f %6.2fx | %12.4f %12.4f %12.4f %10s %10s %-6s | %-6s %5.2f\n", tp, ms,
                base_ms > 0 ? ms / base_ms : 0, measured / 1e6, core / 1e6, extras / 1e6,
                ratio(core).c_str(), ratio(extras).c_str(), lo == hi ? "yes" : "NO",
                Cores(tp, o.threads, cores).c_str(), load);
    std::fflush(stdout);
  }
  std::printf(
      "ranks=: every rank sent the same bytes in every timed step. tp 1 sends nothing (the "
      "baseline for step ms).\n");
}

// A text corpus of byte tokens in `dir`; its path.
std::string WriteCorpus(const std::string& dir) {
  const std::string path = dir + "/train.txt";
  std::ofstream f(path);
  for (int i = 0; i < 4000; ++i) {
    f << "Fortune " << i * 13 % 997 << ": the quick brown fox jumps over the lazy dog.\n";
  }
  return f.good() ? path : "";
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Pipeline bubble, activation memory and tensor-parallel bytes on CPU thread ranks"};
  app.add_option("--steps", o.steps, "timed steps per layout")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--threads", o.threads, "compute threads per rank")->check(CLI::PositiveNumber);
  app.add_flag("--quick", o.quick, "fewer layouts (pp 4, m 1 and 4, tp 2): a smoke run");
  app.add_option("--layers", o.layers, "transformer blocks (>= 4: pp 4)");
  app.add_option("--heads", o.heads, "attention heads (divisible by 4: tp 4)");
  app.add_option("--dim", o.dim, "model width");
  app.add_option("--seq", o.seq, "tokens per sequence (T)");
  app.add_option("--micro", o.micro, "sequences per micro-batch (B)");
  app.add_option("--tp-m", o.tp_m, "micro-batches per step in the tensor-parallel table");
  CLI11_PARSE(app, argc, argv);
  if (o.quick) {
    o.pps = {4};
    o.ms = {1, 4};
    o.tps = {2};
  }
  char tmpl[] = "/tmp/pipeline_bench.XXXXXX";
  const char* dir = mkdtemp(tmpl);
  if (dir == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string train = WriteCorpus(dir);
  if (train.empty()) {
    std::fprintf(stderr, "could not write the corpus in %s\n", dir);
    return 1;
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::printf(
      "pipeline_bench: GPT L=%d C=%d NH=%d vocab 256, micro-batch B=%d x T=%d, fp32, CPU engine "
      "%d thread(s) per rank,\nthread ranks over Gloo (127.0.0.1), %d warm-up + %d timed steps "
      "per layout; this machine has %u cores\n",
      o.layers, o.dim, o.heads, o.micro, o.seq, o.threads, o.warmup, o.steps, cores);
  std::printf("load before: %s\n", bench::Uptime().c_str());
  const auto pp4 = BubbleTable(o, train, cores);
  MemoryTable(o, pp4);
  TensorParallelTable(o, train, cores);
  InterleavedTable(o, train, cores);
  std::printf("\nload after: %s\n", bench::Uptime().c_str());
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}
