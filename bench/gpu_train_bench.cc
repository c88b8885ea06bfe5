// gpu_train_bench: GPT-2 124M (or --model PRESET: any preset, GPT-2 or Llama)
// training on one GPU (T = 1024 or the model's context if shorter, bf16
// compute, fp32 master weights, AdamW, clip 1.0) through the real Trainer,
// next to PyTorch on the same GPU in the same invocation
// (bench/gpu_train_torch_peer.py: the same model in torch.nn — SDPA
// attention, with grouped-query attention for Llama — autocast bf16, fused
// AdamW; eager and torch.compile rows).
// A benchmark, never a test: it prints numbers and ratios.
//
// Per batch size B (default 16 and 32): ms/step and tok/s over --steps timed
// steps after --warmup ones, MFU = tok/s · FLOPs/token / the GPU's dense
// bf16 peak (--peak-tflops; by default the GPU's row of common/device_peaks.h,
// 989.4 for an H100 SXM or H200), FLOPs/token =
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
// --ranks N adds N data-parallel ranks sharing the GPU (threads, Gloo
// through the host, the same global batch): the staging cost, stated; under
// each ZeRO stage of --zero (default 0, DDP). --offload adds one rank with
// parallel.offload: optimizer (AdamW on the host): its step time and device
// memory next to the plain rank's. --nccl adds N ranks over NCCL (each
// ZeRO stage of --zero, and DDP with the optimizer offloaded when --offload
// is given too), rank r on GPU r (with N GPUs; says so and skips them
// otherwise): the speed-up over one GPU at the same global batch, next to
// PyTorch DDP and FSDP2 on as many GPUs (the peer's ddpN and fsdp2xN rows).
// The main rows run model.attention auto (--attention): flash where it
// applies (bf16 or fp16, heads of 64 or 128), as a job does by default;
// --materialized adds one rank with the materialized (T,T) kernels next to
// them: speed and device memory. --unfused adds one rank with the CUDA
// engine's fusions off (SHARDTRAIN_CUDA_FUSED=0: no GEMM epilogues for the
// GELU and the bias gradients, the wte gradient by the token scan): what
// they are worth, measured in the same run.
// --lora R adds LoRA fine-tuning rows, one rank each: rank-R adapters on
// every projection (alpha 2R) with the model frozen in bf16, in int8 and in
// NF4 (finetune.base_dtype; QLoRA): ours/this row is the full run's speed
// over each (their MFU column counts the full run's 6·N FLOPs per token, a
// LoRA step does about 4·N).
// --kernels B profiles a warm-up and 2 steps at batch B under Nsight Compute
// (ncu, when installed: the toolkit's) and prints the time per kernel
// family (of the main rows' step);
// --ncu-csv FILE prints that table from a saved profile.
//
// Usage: gpu_train_bench [--model gpt2-124m] [--batch 16,32] [--steps 20] [--warmup 3]
//                        [--peer torch|none] [--compile] [--peak-tflops 989.4]
//                        [--data FILE] [--peer-dir DIR] [--kernels B] [--ranks N]
//                        [--zero 0,3] [--offload] [--nccl] [--materialized] [--unfused]
//                        [--lora R]
//        gpu_train_bench --ncu-csv FILE [--ncu-steps 2]
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/ncu_summary.h"
#include "common/device_peaks.h"
#include "common/job_spec.h"
#include "common/model/config.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/rendezvous_store.h"
#include "worker/device_probe.h"
#include "worker/trainer.h"

namespace shardtrain {
namespace {

using bench::FindNcu;
using bench::KernelTime;
using bench::ParseNcuSummary;
using bench::PrintKernelTable;

struct Options {
  std::string model = "gpt2-124m";  // a preset (model::ModelPresetNames())
  int seq = 1024;                   // tokens per sequence: 1024, or the model's context
  std::vector<int> batches = {16, 32};
  int steps = 20;
  int warmup = 3;
  std::string peer = "torch";
  bool compile = false;
  double peak_tflops = 0;  // 0: the GPU's from common/device_peaks.h
  std::string data = SHARDTRAIN_FORTUNES_PATH;
  std::string peer_dir = SHARDTRAIN_BENCH_DIR;  // where gpu_train_torch_peer.py is
  int ranks = 1;  // > 1: also that many ranks sharing the GPU (Gloo through the host)
  std::vector<int> zeros = {0};    // the ZeRO stages of those ranks' rows
  bool offload = false;            // also one rank with the optimizer on the host
  bool nccl = false;               // also --ranks ranks over NCCL, one per GPU
  bool materialized = false;       // also one rank with model.attention: materialized
  bool unfused = false;            // also one rank with SHARDTRAIN_CUDA_FUSED=0
  std::string attention = "auto";  // the main rows' model.attention
  int lora = 0;                    // > 0: also LoRA rows of this rank (bf16, int8, NF4 base)
};

// One row's layout of ours: ranks sharing GPU 0 (or over NCCL, rank r on
// GPU r), their ZeRO stage, offload.
struct Variant {
  int ranks = 1;
  int zero = 0;
  bool offload = false;
  bool nccl = false;
  bool materialized = false;
  bool unfused = false;   // the CUDA engine's fusions off (kernels.h KernelCtx::fused)
  std::string lora_base;  // non-empty: LoRA fine-tuning on the model in this base_dtype
  std::string Name() const {
    if (!lora_base.empty()) {
      return lora_base == "bf16" ? "shardtrain lora" : "shardtrain lora " + lora_base;
    }
    if (ranks == 1 && zero == 0 && !offload && !materialized && !unfused) return "shardtrain";
    std::string name = "shardtrain";
    if (materialized) absl::StrAppend(&name, " materialized");
    if (unfused) absl::StrAppend(&name, " unfused");
    if (nccl) absl::StrAppend(&name, " nccl");
    if (ranks > 1) absl::StrAppend(&name, " dp", ranks);
    if (zero > 0) absl::StrAppend(&name, " z", zero);
    if (offload) absl::StrAppend(&name, " offload");
    return name;
  }
};

struct Row {
  std::string who;
  int batch = 0;
  double tok_s = 0, ms = 0, mem_gib = 0;
};

absl::StatusOr<JobSpec> SpecFor(const Options& o, int batch) {
  return ParseJobSpec(
      absl::StrCat("name: gpu-train-bench\nmodel: {preset: ", o.model, "}\n",
                   "data: {train: ", o.data, "}\n", "batch: {global: ", batch, ", micro: ", batch,
                   ", seq_len: ", o.seq, "}\n", "precision: bf16\n",
                   "optimizer: {lr: 6e-4, warmup_steps: 10, weight_decay: 0.1, grad_clip: 1.0}\n",
                   "steps: ", o.warmup + o.steps, "\nresources: {device: cuda}\nseed: 1337\n"));
}

// FLOPs per token: 6 per parameter per token (forward + backward) plus
// attention's QK^T and att·V, 12·L·C·T.
double FlopsPerToken(const model::ModelConfig& c, int64_t params, int T) {
  return 6.0 * double(params) + 12.0 * c.layers * c.dim * double(T);
}

// Steps one trainer: (warm-up, then timed) steps; the mean ms of the
// timed ones. Step() reads the loss, so each step is synchronous.
absl::StatusOr<double> TimeSteps(worker::Trainer& trainer, const Options& o) {
  double timed_ms = 0;
  for (int step = 1; step <= o.warmup + o.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<worker::StepResult> r = trainer.Step(step);
    if (!r.ok()) return r.status();
    if (step > o.warmup) {
      timed_ms +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  return timed_ms / o.steps;
}

// The device memory the ranks' trainers hold: free memory before they are
// made, and again once every rank has stepped but none has been destroyed
// (the last rank to arrive measures; the others wait for it).
class MemoryHeld {
 public:
  explicit MemoryHeld(int ranks) : ranks_(ranks) {
    size_t total = 0;
    cudaMemGetInfo(&free_before_, &total);
  }
  void Arrive() {
    std::unique_lock<std::mutex> lock(mu_);
    if (++arrived_ == ranks_) {
      size_t total = 0;
      cudaMemGetInfo(&free_after_, &total);
      cv_.notify_all();
    }
    cv_.wait(lock, [&] { return arrived_ >= ranks_; });
  }
  double gib() const { return (double(free_before_) - double(free_after_)) / double(1ull << 30); }

 private:
  const int ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  size_t free_before_ = 0, free_after_ = 0;
};

// `batch` sequences per step on v.ranks ranks sharing GPU 0 (threads, dp =
// ranks, Gloo through the host: the staging cost against one rank).
absl::StatusOr<Row> RunOurs(const Options& o, int batch, const Variant& v,
                            double* flops_per_token) {
  const int ranks = v.ranks;
  absl::StatusOr<JobSpec> spec = SpecFor(o, batch);
  if (!spec.ok()) return spec.status();
  spec = ParseJobSpec(
      JobSpecToYaml(*spec),
      {absl::StrCat("parallel.dp=", ranks), absl::StrCat("batch.micro=", batch / ranks),
       absl::StrCat("resources.min_workers=", ranks), absl::StrCat("resources.max_workers=", ranks),
       absl::StrCat("parallel.zero=", v.zero),
       absl::StrCat("parallel.offload=", v.offload ? "optimizer" : "none"),
       absl::StrCat("parallel.comm=", v.nccl ? "nccl" : "gloo"),
       absl::StrCat("model.attention=", v.materialized ? "materialized" : o.attention)});
  if (spec.ok() && !v.lora_base.empty()) {
    const bool gate = spec->model.arch == model::Arch::kLlama;
    spec =
        ParseJobSpec(JobSpecToYaml(*spec),
                     {absl::StrCat("finetune.lora={rank: ", o.lora, ", alpha: ", 2 * o.lora,
                                   ", targets: [q, k, v, o, ", gate ? "gate, " : "", "up, down]}"),
                      "finetune.base_dtype=" + v.lora_base});
  }
  if (!spec.ok()) return spec.status();
  MemoryHeld memory(ranks);
  // Host threads as workers take them by default (all cores), shared by the
  // ranks on this machine: the offloaded optimizer and host copies use them.
  const int host_threads = std::max(1, int(std::thread::hardware_concurrency()) / ranks);
  absl::StatusOr<double> ms = absl::InternalError("no rank ran");
  if (ranks == 1) {
    // The kernels' context reads it when the engine makes it.
    if (v.unfused) setenv("SHARDTRAIN_CUDA_FUSED", "0", /*overwrite=*/1);
    absl::StatusOr<std::unique_ptr<worker::Trainer>> t =
        worker::Trainer::Create(*spec, /*rank=*/0, host_threads, /*comm=*/nullptr, /*gpu=*/0);
    if (v.unfused) unsetenv("SHARDTRAIN_CUDA_FUSED");
    if (!t.ok()) return t.status();
    *flops_per_token =
        FlopsPerToken((*t)->engine().config(), (*t)->engine().layout().global_num_params(), o.seq);
    ms = TimeSteps(**t, o);
    memory.Arrive();
  } else {
    auto store = std::make_shared<comm::InMemoryStore>();
    std::vector<absl::Status> status(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        absl::StatusOr<std::unique_ptr<comm::Communicator>> c;
        if (v.nccl) {
          comm::NcclOptions no;
          no.device = r;
          no.prefix = absl::StrCat("gpu_train_bench/B", batch);
          c = comm::CreateNcclCommunicator(store, r, ranks, no);
        } else {
          comm::GlooOptions go;
          go.prefix = absl::StrCat("gpu_train_bench/B", batch, "/z", v.zero);
          c = comm::CreateGlooCommunicator(store, r, ranks, go);
        }
        if (!c.ok()) {
          status[r] = c.status();
          memory.Arrive();
          return;
        }
        absl::StatusOr<std::unique_ptr<worker::Trainer>> t =
            worker::Trainer::Create(*spec, r, host_threads, c->get(), /*gpu=*/v.nccl ? r : 0);
        if (!t.ok()) {
          status[r] = t.status();
          memory.Arrive();
          return;
        }
        absl::StatusOr<double> rank_ms = TimeSteps(**t, o);
        memory.Arrive();
        if (!rank_ms.ok()) status[r] = rank_ms.status();
        if (r == 0) ms = rank_ms;  // the ranks step in lockstep (the all-reduce)
        (*c)->Shutdown().IgnoreError();
      });
    }
    for (std::thread& t : threads) t.join();
    for (const absl::Status& s : status) {
      if (!s.ok()) return s;
    }
  }
  if (!ms.ok()) return ms.status();
  Row row{v.Name(), batch};
  row.ms = *ms;
  row.tok_s = batch * double(o.seq) / (row.ms / 1e3);
  row.mem_gib = memory.gib();
  return row;
}

// The PyTorch peer's rows ("torch <mode> B=<b> tok_s <x> ms_per_step <y>
// peak_gib <z>"), run beside this binary's source tree.
// `ranks` > 1: DDP or FSDP2 over that many GPUs (mode ddp, fsdp2).
std::vector<Row> RunTorch(const Options& o, const std::string& mode, int ranks = 1) {
  const model::ModelConfig c = *model::ModelPreset(o.model);
  std::string shape = absl::StrCat(" --layers ", c.layers, " --heads ", c.heads, " --dim ", c.dim,
                                   " --seq ", o.seq, " --vocab ", c.vocab);
  if (c.arch == model::Arch::kLlama) {
    absl::StrAppend(&shape, " --arch llama --kv-heads ", c.kv_heads, " --ffn-dim ", c.ffn_dim,
                    " --rope-theta ", c.rope_theta, " --norm-eps ", c.norm_eps,
                    c.tie_embeddings ? " --tie-embeddings" : "");
  }
  const std::string cmd = absl::StrCat(
      "cd '", o.peer_dir, "' && python3 gpu_train_torch_peer.py --mode ", mode, " --ranks ", ranks,
      " --steps ", o.steps, " --warmup ", std::max(o.warmup, mode == "compile" ? 5 : 3),
      " --batch ", absl::StrJoin(o.batches, " "), shape, " 2>&1");
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
  CLI::App app{
      "GPT-2 124M (or --model) bf16 training on one GPU: shardtrain next to PyTorch "
      "(ratios)"};
  app.add_option("--model", o.model,
                 "the model: a preset (gpt2-124m ... gpt2-1558m, llama-tiny, "
                 "llama3-1b, llama3-8b)")
      ->capture_default_str();
  app.add_option("--batch", o.batches,
                 "batch sizes (sequences of 1024 tokens, or of the "
                 "model's context if shorter)")
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
  app.add_option("--peak-tflops", o.peak_tflops,
                 "dense bf16 peak for MFU (default: the GPU's row of common/device_peaks.h, "
                 "the table the workers' MFU uses)");
  app.add_option("--data", o.data, "training text (bytes)");
  app.add_option("--peer-dir", o.peer_dir, "folder of gpu_train_torch_peer.py (bench/)");
  app.add_option("--ranks", o.ranks,
                 "N > 1: also N data-parallel ranks sharing the GPU (threads, Gloo through the "
                 "host), the same global batch: the staging cost next to one rank")
      ->check(CLI::PositiveNumber);
  app.add_option("--zero", o.zeros, "ZeRO stages of the --ranks rows (0: DDP)")
      ->delimiter(',')
      ->check(CLI::Range(0, 3))
      ->capture_default_str();
  app.add_flag("--offload", o.offload,
               "also one rank with parallel.offload: optimizer (AdamW on the host)");
  app.add_flag("--materialized", o.materialized,
               "also one rank with model.attention: materialized (the (T,T) probabilities kept; "
               "ours/this row: the main rows' speed over the materialized kernels')");
  app.add_flag("--unfused", o.unfused,
               "also one rank with the CUDA engine's fusions off (SHARDTRAIN_CUDA_FUSED=0: "
               "GELU and bias gradients apart from the GEMMs, the wte gradient by token scan); "
               "ours/this row: what the fusions are worth");
  app.add_flag("--nccl", o.nccl,
               "also --ranks ranks over NCCL (each ZeRO stage of --zero), rank r on GPU r "
               "(skipped, saying so, with fewer GPUs): the speed-up over one GPU at the same "
               "global batch");
  app.add_option("--attention", o.attention,
                 "model.attention of the main rows (and of the step --kernels profiles)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "materialized", "flash"}));
  int kernels_batch = 0;
  app.add_option("--lora", o.lora,
                 "also LoRA rows of this adapter rank (one rank each: the model frozen in bf16, "
                 "int8 and NF4)");
  app.add_option("--kernels", kernels_batch,
                 "B: also profile a warm-up and 2 steps at batch B under Nsight Compute (ncu) "
                 "and print the time per kernel family");
  std::string ncu_csv;
  app.add_option("--ncu-csv", ncu_csv,
                 "only print the per-kernel table of a saved `ncu --metrics "
                 "gpu__time_duration.sum --print-summary per-kernel --csv` output (no GPU needed)");
  int ncu_steps = 2;
  app.add_option("--ncu-steps", ncu_steps, "steps that saved profile holds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  {
    const absl::StatusOr<model::ModelConfig> preset = model::ModelPreset(o.model);
    if (!preset.ok()) {
      std::fprintf(stderr, "gpu_train_bench: --model: %s\n",
                   std::string(preset.status().message()).c_str());
      return 2;
    }
    o.seq = std::min(1024, preset->context);
  }
  if (!ncu_csv.empty()) {
    std::ifstream in(ncu_csv);
    if (!in) {
      std::fprintf(stderr, "gpu_train_bench: cannot read %s\n", ncu_csv.c_str());
      return 1;
    }
    const std::vector<KernelTime> kernels = ParseNcuSummary(in);
    if (kernels.empty()) {
      std::fprintf(stderr, "gpu_train_bench: %s holds no per-kernel summary\n", ncu_csv.c_str());
      return 1;
    }
    PrintKernelTable(kernels, ncu_steps);
    return 0;
  }

  absl::StatusOr<std::vector<worker::GpuInfo>> gpus = worker::ProbeGpus();
  if (!gpus.ok()) {
    std::printf("gpu_train_bench: %s; nothing run.\n",
                std::string(gpus.status().message()).c_str());
    return 0;
  }
  std::printf("gpu_train_bench: %s, %s, T=%d, bf16, AdamW, clip 1.0; %d timed steps\n",
              gpus->front().model.c_str(), o.model.c_str(), o.seq, o.steps);
  if (o.peak_tflops <= 0) {
    const std::optional<double> peak = DensePeakFlops(gpus->front().model, DataType::kBFloat16);
    if (!peak) {
      std::printf("(MFU omitted: %s; --peak-tflops gives one)\n",
                  WhyNoPeak(gpus->front().model, DataType::kBFloat16).c_str());
    }
    o.peak_tflops = peak.value_or(0) / 1e12;
  }
  std::vector<Row> rows;
  double flops_per_token = 0;
  for (int b : o.batches) {
    std::vector<Variant> variants = {Variant{}};
    if (o.ranks > 1) {
      for (int z : o.zeros) variants.push_back(Variant{o.ranks, z, false});
    }
    if (o.offload) variants.push_back(Variant{1, 0, true});
    if (o.materialized) variants.push_back(Variant{1, 0, false, false, true});
    if (o.unfused) variants.push_back(Variant{1, 0, false, false, false, true});
    for (const char* base : {"bf16", "int8", "nf4"}) {
      if (o.lora > 0) variants.push_back(Variant{1, 0, false, false, false, false, base});
    }
    if (o.nccl && o.ranks > 1) {
      if (int(gpus->size()) >= o.ranks) {
        for (int z : o.zeros) {
          variants.push_back(Variant{o.ranks, z, false, true});
        }
        // DDP over NCCL with the optimizer offloaded: reduced on the GPUs,
        // AdamW on the host.
        if (o.offload) variants.push_back(Variant{o.ranks, 0, true, true});
      } else if (b == o.batches.front()) {
        std::printf("(no nccl rows: %d ranks need %d GPUs, this machine has %zu)\n", o.ranks,
                    o.ranks, gpus->size());
      }
    }
    for (const Variant& v : variants) {
      absl::StatusOr<Row> r = RunOurs(o, b, v, &flops_per_token);
      if (!r.ok()) {
        std::fprintf(stderr, "gpu_train_bench: B=%d, %s: %s\n", b, v.Name().c_str(),
                     std::string(r.status().message()).c_str());
        return 1;
      }
      rows.push_back(*r);
    }
  }
  if (o.peer == "torch") {
    for (const std::string& mode : o.compile ? std::vector<std::string>{"eager", "compile"}
                                             : std::vector<std::string>{"eager"}) {
      for (Row& r : RunTorch(o, mode)) rows.push_back(r);
    }
    // Beside the nccl rows: PyTorch DDP and FSDP2 (ZeRO-3) on as many GPUs.
    if (o.nccl && o.ranks > 1 && int(gpus->size()) >= o.ranks) {
      for (const char* mode : {"ddp", "fsdp2"}) {
        for (Row& r : RunTorch(o, mode, o.ranks)) rows.push_back(r);
      }
    }
  }
  std::printf("\n%-24s %4s %10s %9s %7s %9s %14s\n", "who", "B", "tok/s", "ms/step", "MFU",
              "mem GiB", "ours/this row");
  for (const Row& r : rows) {
    double ours = 0;
    for (const Row& s : rows) {
      if (s.who == "shardtrain" && s.batch == r.batch) ours = s.tok_s;
    }
    const double mfu = o.peak_tflops > 0 ? r.tok_s * flops_per_token / (o.peak_tflops * 1e12) : 0;
    std::printf("%-24s %4d %10.0f %9.2f %6.1f%% %9.2f %13.3fx\n", r.who.c_str(), r.batch, r.tok_s,
                r.ms, 100 * mfu, r.mem_gib, r.tok_s > 0 ? ours / r.tok_s : 0.0);
  }
  std::printf(
      "(FLOPs/token %.3g; MFU over %.1f TFLOP/s; mem: shardtrain = cudaMemGetInfo delta, "
      "pytorch = max_memory_allocated; on a dpN row (zK: ZeRO-K), ours/this row is one rank's "
      "speed over N ranks sharing the GPU: the cost of staging through the host; on the offload "
      "row, the cost of AdamW on the host; on an nccl row (rank r on GPU r, mem: GPU 0's), "
      "1 / (ours/this row) is the speed-up over one GPU at the same global batch, as on the "
      "pytorch ddpN / fsdp2xN rows)\n",
      flops_per_token, o.peak_tflops);
  if (kernels_batch > 0) {
    const std::string ncu = FindNcu();
    if (ncu.empty()) {
      std::printf("\n(no per-kernel table: ncu is not installed)\n");
      return 0;
    }
    // This program again, a warm-up and 2 steps at one batch size, under ncu.
    char self[4096] = {};
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    const std::string cmd =
        absl::StrCat(ncu, " --metrics gpu__time_duration.sum --print-summary per-kernel --csv '",
                     std::string(self, n > 0 ? n : 0), "' --model ", o.model, " --batch ",
                     kernels_batch, " --steps 2 --warmup 1 --peer none --attention ", o.attention,
                     " --data '", o.data, "' 2>&1");
    std::string text;
    if (FILE* p = popen(cmd.c_str(), "r")) {
      char buf[4096];
      while (std::fgets(buf, sizeof buf, p) != nullptr) text += buf;
      pclose(p);
    }
    std::istringstream in(text);
    const std::vector<KernelTime> kernels = ParseNcuSummary(in);
    if (kernels.empty()) {
      std::printf("\n(ncu gave no per-kernel summary; its output ends:\n%s)\n",
                  text.substr(text.size() > 2000 ? text.size() - 2000 : 0).c_str());
      return 0;
    }
    PrintKernelTable(kernels, 3);  // the warm-up step is in the profile too
  }
  return 0;
}

}  // namespace
}  // namespace shardtrain

int main(int argc, char** argv) { return shardtrain::Main(argc, argv); }
