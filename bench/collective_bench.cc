// collective_bench: nccl-tests style timing of the Gloo backend on loopback.
//
// Each world size runs as that many forked processes (one Gloo communicator
// each, TCP on 127.0.0.1, rendezvous through a FileStore in a temp dir).
// Rank 0 reports, per op and size: time per op (mean over iterations, after
// a warm-up), algbw = bytes / time, busbw = algbw * factor (all-reduce
// 2(n-1)/n, reduce-scatter and all-gather (n-1)/n, broadcast 1), next to a
// memcpy of the same size measured in the same run.
// "bytes" follows nccl-tests: the full buffer (all-reduce, broadcast) or the
// full gathered / scattered buffer (all-gather output, reduce-scatter input).
//
//   collective_bench [--backend gloo] [--world 2,4] [--min-bytes 8] [--max-bytes 64M]
//                    [--step 8] [--ops allreduce,reducescatter,allgather,broadcast]
//                    (also: allreduce_gloo = gloo::allreduce, for comparison)
//                    [--json]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/rendezvous_store.h"

namespace shardtrain::comm {
namespace {

struct Config {
  std::vector<int> worlds = {2, 4};
  size_t min_bytes = 8;
  size_t max_bytes = size_t{64} << 20;
  size_t step = 8;
  std::vector<std::string> ops = {"allreduce", "reducescatter", "allgather", "broadcast"};
  bool json = false;
};

bool ParseBytes(absl::string_view s, size_t* out) {
  size_t mult = 1;
  if (!s.empty()) {
    const char last = s.back();
    if (last == 'K' || last == 'k') mult = size_t{1} << 10;
    if (last == 'M' || last == 'm') mult = size_t{1} << 20;
    if (last == 'G' || last == 'g') mult = size_t{1} << 30;
    if (mult != 1) s.remove_suffix(1);
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(s, &v)) return false;
  *out = v * mult;
  return true;
}

double BusFactor(const std::string& op, int n) {
  if (op == "allreduce" || op == "allreduce_gloo") return 2.0 * (n - 1) / n;
  if (op == "reducescatter" || op == "allgather") return static_cast<double>(n - 1) / n;
  return 1.0;
}

int Iterations(size_t bytes) {
  const size_t budget = size_t{512} << 20;  // ~bytes moved per measurement
  return static_cast<int>(std::clamp<size_t>(budget / std::max<size_t>(bytes, 1), 5, 200));
}

// Single-threaded memcpy of `bytes`, warm. Source and destination are
// offset from each other by half a page: with equal page offsets this
// machine's memcpy (rep movsb) runs up to 50x slower at 4-32 KiB.
double MemcpyGbps(size_t bytes) {
  std::vector<char> a(bytes + 4096, 1), b(bytes + 4096, 0);
  char* src = a.data();
  char* dst = b.data() + 2048 + 64;
  const int iters = static_cast<int>(
      std::clamp<size_t>((size_t{1} << 30) / std::max<size_t>(bytes, 1), 20, 100000));
  std::memcpy(dst, src, bytes);
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < iters; ++i) {
    src[i % bytes] = static_cast<char>(i);
    std::memcpy(dst, src, bytes);
    asm volatile("" ::: "memory");
  }
  const double s = absl::ToDoubleSeconds(absl::Now() - t0) / iters;
  return bytes / s / 1e9;
}

// One rank of one world size: runs every op and size; rank 0 prints.
int RunRank(const Config& cfg, const std::string& dir, int world, int rank) {
  auto store = std::make_shared<FileStore>(dir);
  GlooOptions options;
  options.prefix = absl::StrCat("bench/world", world);
  options.timeout = absl::Seconds(120);
  auto comm_or = CreateGlooCommunicator(store, rank, world, options);
  if (!comm_or.ok()) {
    std::cerr << "rank " << rank << ": " << comm_or.status() << "\n";
    return 1;
  }
  Communicator& comm = **comm_or;
  // gloo::allreduce on its own context, for comparison with our ring.
  std::unique_ptr<Communicator> gloo_comm;
  if (std::find(cfg.ops.begin(), cfg.ops.end(), "allreduce_gloo") != cfg.ops.end()) {
    GlooOptions g = options;
    g.group_name = "gloo_ring";
    g.allreduce_algorithm = GlooOptions::AllreduceAlgorithm::kGlooRing;
    auto c = CreateGlooCommunicator(store, rank, world, g);
    if (!c.ok()) {
      std::cerr << "rank " << rank << ": " << c.status() << "\n";
      return 1;
    }
    gloo_comm = std::move(*c);
  }
  for (const std::string& op : cfg.ops) {
    for (size_t bytes = cfg.min_bytes; bytes <= cfg.max_bytes;) {
      // Elements: fp32; per-rank count for the gather / scatter ops.
      size_t total = std::max<size_t>(bytes / 4, 1);
      size_t per_rank = total;
      if (op == "reducescatter" || op == "allgather") {
        per_rank = std::max<size_t>(total / world, 1);
        total = per_rank * world;
      }
      const size_t real_bytes = total * 4;
      std::vector<float> in(total, 1.0f), out(total, 0.0f);
      auto run = [&]() -> absl::Status {
        if (op == "allreduce") {
          return comm.AllReduce(in.data(), total, DataType::kFloat32, ReduceOp::kSum);
        } else if (op == "allreduce_gloo") {
          return gloo_comm->AllReduce(in.data(), total, DataType::kFloat32, ReduceOp::kSum);
        } else if (op == "reducescatter") {
          return comm.ReduceScatter(in.data(), out.data(), per_rank, DataType::kFloat32,
                                    ReduceOp::kSum);
        } else if (op == "allgather") {
          return comm.AllGather(in.data(), out.data(), per_rank, DataType::kFloat32);
        } else {
          return comm.Broadcast(in.data(), total, DataType::kFloat32, 0);
        }
      };
      const int iters = Iterations(real_bytes);
      absl::Status s = run();  // warm-up
      if (s.ok()) s = comm.Barrier();
      const absl::Time t0 = absl::Now();
      for (int i = 0; i < iters && s.ok(); ++i) s = run();
      const double sec = absl::ToDoubleSeconds(absl::Now() - t0) / iters;
      if (!s.ok()) {
        std::cerr << "rank " << rank << " " << op << " " << real_bytes << ": " << s << "\n";
        return 1;
      }
      if (rank == 0) {
        const double algbw = real_bytes / sec / 1e9;
        const double busbw = algbw * BusFactor(op, world);
        const double mem = MemcpyGbps(real_bytes);
        if (cfg.json) {
          std::printf(
              "{\"op\": \"%s\", \"bytes\": %zu, \"world\": %d, \"time_us\": %.1f, "
              "\"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f, \"memcpy_gbps\": %.3f}\n",
              op.c_str(), real_bytes, world, sec * 1e6, algbw, busbw, mem);
        } else {
          std::printf("%-14s %5d %12zu %12.1f %10.3f %10.3f %11.2f %8.1f%%\n", op.c_str(), world,
                      real_bytes, sec * 1e6, algbw, busbw, mem, 100.0 * busbw / mem);
          if (op == "allreduce" && world == 2 && real_bytes == (size_t{64} << 20)) {
            std::printf(
                "  reference: PyTorch 1.13 Gloo all-reduce, 2 ranks, this machine: "
                "65 MB in 62 ms (1.05 GB/s algbw), 498 MB in 447 ms (1.11 GB/s); "
                "ours: 67 MB in %.1f ms (%.2f GB/s algbw) = %.2fx\n",
                sec * 1e3, algbw, algbw / 1.05);
          }
        }
        std::fflush(stdout);
      }
      if (bytes == cfg.max_bytes) break;
      bytes = std::min(bytes * cfg.step, cfg.max_bytes);
    }
  }
  if (gloo_comm && !gloo_comm->Shutdown().ok()) return 1;
  return comm.Shutdown().ok() ? 0 : 1;
}

int Main(int argc, char** argv) {
  Config cfg;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << arg << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--json") {
      cfg.json = true;
    } else if (arg == "--backend") {
      // Host buffers over Gloo are what this bench times; NCCL needs a GPU
      // (its numbers come from the gpu-labelled tests on a lent device).
      const std::string backend = value();
      if (backend != "gloo") {
        std::cerr << "--backend: only gloo is measured by this bench (got '" << backend << "')\n";
        return 2;
      }
    } else if (arg == "--world") {
      cfg.worlds.clear();
      for (absl::string_view w : absl::StrSplit(value(), ',')) {
        int n = 0;
        if (!absl::SimpleAtoi(w, &n) || n < 1) {
          std::cerr << "--world: bad size '" << w << "'\n";
          return 2;
        }
        cfg.worlds.push_back(n);
      }
    } else if (arg == "--max-bytes" || arg == "--min-bytes") {
      size_t* target = arg == "--max-bytes" ? &cfg.max_bytes : &cfg.min_bytes;
      if (!ParseBytes(value(), target)) {
        std::cerr << arg << ": bad size\n";
        return 2;
      }
    } else if (arg == "--step") {
      if (!ParseBytes(value(), &cfg.step) || cfg.step < 2) {
        std::cerr << "--step must be >= 2\n";
        return 2;
      }
    } else if (arg == "--ops") {
      cfg.ops = absl::StrSplit(value(), ',');
    } else {
      std::cerr << "usage: collective_bench [--backend gloo] [--world 2,4] [--min-bytes 8] "
                   "[--max-bytes 64M] [--step 8] [--ops allreduce,...] [--json]\n";
      return arg == "--help" ? 0 : 2;
    }
  }
  for (const std::string& op : cfg.ops) {
    if (op != "allreduce" && op != "allreduce_gloo" && op != "reducescatter" && op != "allgather" &&
        op != "broadcast") {
      std::cerr << "--ops: unknown op '" << op << "'\n";
      return 2;
    }
  }
  if (!cfg.json) {
    std::printf("# Gloo backend, fp32, TCP on 127.0.0.1, one forked process per rank\n");
    std::printf("%-14s %5s %12s %12s %10s %10s %11s %9s\n", "op", "world", "bytes", "time_us",
                "algbw_GB/s", "busbw_GB/s", "memcpy_GB/s", "bus/mcpy");
  }
  std::fflush(stdout);
  for (int world : cfg.worlds) {
    char tmpl[] = "/tmp/shardtrain_bench_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    std::vector<pid_t> pids;
    for (int r = 0; r < world; ++r) {
      pid_t pid = fork();
      if (pid < 0) {
        std::perror("fork");
        return 1;
      }
      if (pid == 0) _exit(RunRank(cfg, tmpl, world, r));
      pids.push_back(pid);
    }
    int failures = 0;
    for (pid_t pid : pids) {
      int status = 0;
      waitpid(pid, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
    }
    std::filesystem::remove_all(tmpl);
    if (failures) {
      std::cerr << "world " << world << ": " << failures << " rank(s) failed\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace shardtrain::comm

int main(int argc, char** argv) { return shardtrain::comm::Main(argc, argv); }
