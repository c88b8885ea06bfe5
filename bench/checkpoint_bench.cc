// checkpoint_bench: saving and loading a sharded checkpoint of GPT-2 124M
// (shardtrain_checkpoint_format over FileCheckpointStorage) against plain write()/
// read() of the same bytes on the same filesystem, measured in the same run.
// A benchmark: it prints numbers and ratios, it never passes or fails (it
// exits non-zero only if the library returns an error or loads wrong data).
//
// Rows (bytes = the checkpoint's shard bytes; ratio = baseline MB/s / ours,
// i.e. how many times longer than the baseline ours takes for the same bytes):
//   plain_write_1      one file, write() in 8 MiB chunks, fsync    (the baseline)
//   plain_write_4      4 threads, each its quarter to its own file, fsync each
//   encode_4ranks      EncodeShard of the 4 shards in memory (4 threads): the
//                      format's CPU cost (copy + CRC-64), no I/O
//   save_4ranks        4 ranks as 4 THREADS of this process, each doing what
//                      Trainer::SaveShard does (slice its EvenSplit of params/
//                      m/v, WriteShard: encode, write temp, fsync, rename,
//                      fsync dir), then MakeManifest + WriteManifest
//   plain_read_1       the 4 shard files read sequentially with read() in
//                      8 MiB chunks into one reused buffer (the load baseline)
//   load_all           ReadManifest + LoadAll on 1 rank (Trainer::Restore)
//   load_range_2of2.r  ReadManifest + LoadRange of new rank r's EvenSplit
//                      (resharding 4 -> 2), each rank alone in turn
//   ckpt_every_50      save_4ranks / (50 x --step-ms): the step-time overhead
//                      of a synchronous save every 50 steps
// Reads are cold by default: posix_fadvise(DONTNEED) on every shard file
// before each read row (the guest page cache; a VM host may still cache).
//
//   checkpoint_bench [--dir /tmp] [--params N] [--ranks 4] [--step-ms 1430]
//                    [--interval 50] [--cache cold|warm] [--json]
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "common/model/config.h"
#include "common/model/param_layout.h"
#include "worker/checkpoint/directory.h"
#include "worker/checkpoint/loader.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/shard_file.h"
#include "worker/checkpoint/storage.h"

namespace shardtrain::checkpoint {
namespace {

namespace fs = std::filesystem;
constexpr size_t kChunk = size_t{8} << 20;

struct Config {
  std::string dir = "/tmp";
  uint64_t params = 0;  // 0: the gpt2-124m layout's count
  int ranks = 4;
  double step_ms = 1430;
  int interval = 50;
  std::string cache = "cold";
  int reps = 2;
  bool json = false;
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void Die(const std::string& what, const absl::Status& s) {
  std::cerr << "checkpoint_bench: " << what << ": " << s << "\n";
  std::exit(1);
}
[[noreturn]] void DieErrno(const std::string& what, const std::string& path) {
  std::cerr << "checkpoint_bench: " << what << " " << path << ": " << std::strerror(errno) << "\n";
  std::exit(1);
}

// Deterministic pseudo-random floats (splitmix64), `scale` * [lo, lo+1).
void Fill(std::vector<float>& out, uint64_t seed, float lo, float scale) {
  uint64_t x = seed;
  for (size_t i = 0; i < out.size(); i += 2) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    out[i] = scale * (lo + static_cast<float>(z >> 40) * (1.0f / 16777216.0f));
    if (i + 1 < out.size())
      out[i + 1] = scale * (lo + static_cast<float>((z >> 8) & 0xFFFFFF) * (1.0f / 16777216.0f));
  }
}

// Writes `n` bytes from the concatenation of `srcs` (starting `skip` bytes
// in) to a new file in 8 MiB chunks, then fsyncs and closes it.
void PlainWrite(const std::string& path, const std::vector<const std::vector<float>*>& srcs,
                uint64_t skip, uint64_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) DieErrno("creating", path);
  for (const std::vector<float>* src : srcs) {
    const uint64_t size = src->size() * sizeof(float);
    if (skip >= size) {
      skip -= size;
      continue;
    }
    const char* p = reinterpret_cast<const char*>(src->data()) + skip;
    uint64_t left = std::min<uint64_t>(size - skip, n);
    skip = 0;
    n -= left;
    while (left > 0) {
      const ssize_t w = ::write(fd, p, std::min<uint64_t>(left, kChunk));
      if (w < 0) {
        if (errno == EINTR) continue;
        DieErrno("writing", path);
      }
      p += w;
      left -= static_cast<uint64_t>(w);
    }
    if (n == 0) break;
  }
  if (n != 0) {
    std::cerr << "checkpoint_bench: plain write ran out of source bytes\n";
    std::exit(1);
  }
  if (::fsync(fd) != 0) DieErrno("fsync", path);
  if (::close(fd) != 0) DieErrno("close", path);
}

// Reads a whole file with read() in 8 MiB chunks into `buf`; returns bytes.
uint64_t PlainRead(const std::string& path, std::vector<char>& buf) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) DieErrno("opening", path);
  uint64_t total = 0;
  while (true) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      DieErrno("reading", path);
    }
    if (r == 0) break;
    total += static_cast<uint64_t>(r);
  }
  ::close(fd);
  return total;
}

// Drops the (clean) pages of `paths` from the page cache.
void DropCache(const std::vector<std::string>& paths) {
  for (const std::string& p : paths) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) DieErrno("opening", p);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

struct Row {
  Row(std::string w, uint64_t b) : what(std::move(w)), bytes(b) {}
  std::string what;
  uint64_t bytes = 0;
  double seconds = 0;
  std::optional<double> ratio;  // baseline MB/s / ours (= our time / baseline time, same bytes)
  std::string note;
  bool rate = true;             // false: mb_per_s is meaningless (printed as -/null)
  std::string extra_json;       // more ", \"key\": value" fields for this row
  std::vector<double> samples;  // one per repetition; `seconds` is the best (least)
  void Add(double s) {
    samples.push_back(s);
    seconds = *std::min_element(samples.begin(), samples.end());
  }
  double mbps() const { return seconds > 0 ? bytes / seconds / 1e6 : 0; }
};

// Runs `fn(rank)` on `n` threads and waits for all.
void Parallel(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

// The gpt2-124m preset, or for --params N the same shape (12 layers, 12
// heads, context 1024, vocab 50257) with the largest dim (a multiple of 12)
// whose layout has at most N params (dim 12, ~0.64M params, at the least).
model::ModelConfig PickConfig(uint64_t want) {
  auto preset = model::ModelPreset("gpt2-124m");
  if (!preset.ok()) Die("ModelPreset", preset.status());
  if (want == 0 || want >= model::ParamLayout(*preset).num_params()) return *preset;
  model::ModelConfig best = *preset;
  best.dim = 12;
  for (int dim = 24; dim <= preset->dim; dim += 12) {
    model::ModelConfig c = *preset;
    c.dim = dim;
    if (model::ParamLayout(c).num_params() > want) break;
    best = c;
  }
  return best;
}

int Main(int argc, char** argv) {
  Config cfg;
  CLI::App app{"checkpoint_bench: sharded checkpoint save/load vs plain write()/read()"};
  app.add_option("--dir", cfg.dir, "parent of the temp dir (same filesystem as checkpoints)")
      ->capture_default_str();
  app.add_option("--params", cfg.params,
                 "scale down: gpt2-124m shape with a smaller dim, at most N params (0: 124M)")
      ->capture_default_str();
  app.add_option("--ranks", cfg.ranks, "saving ranks (threads)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--step-ms", cfg.step_ms,
                 "training step time for the overhead row (default: the engine's 124M CPU "
                 "step, B=4 T=64, on this 2-core machine)")
      ->capture_default_str();
  app.add_option("--interval", cfg.interval, "steps between checkpoints")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--cache", cfg.cache, "cold: posix_fadvise DONTNEED before each read row")
      ->capture_default_str()
      ->check(CLI::IsMember({"cold", "warm"}));
  app.add_option("--reps", cfg.reps, "repetitions of each row; the best (least time) is reported")
      ->capture_default_str()
      ->check(CLI::Range(1, 10));
  app.add_flag("--json", cfg.json, "one JSON object per row on stdout");
  CLI11_PARSE(app, argc, argv);

  const model::ModelConfig config = PickConfig(cfg.params);
  const model::ParamLayout layout(config);
  const uint64_t n = layout.num_params();
  const int world = cfg.ranks;
  const int new_world = std::max(1, world / 2);
  const int64_t step = 1000;
  FileCheckpointStorage storage;

  // Disk: the shards (12 B/param) plus one plain copy at a time.
  const uint64_t need = 2 * 12 * n + (uint64_t{64} << 20);
  struct statvfs vfs {};
  if (::statvfs(cfg.dir.c_str(), &vfs) != 0) DieErrno("statvfs", cfg.dir);
  const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (avail < need + (uint64_t{1} << 30)) {
    std::cerr << "checkpoint_bench: " << cfg.dir << " has " << avail / 1e9 << " GB free, needs "
              << need / 1e9 << " GB + 1 GB slack; use --params or --dir\n";
    return 1;
  }
  std::string tmpl = (fs::path(cfg.dir) / "checkpoint_bench.XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) DieErrno("mkdtemp", tmpl);
  const std::string root = tmpl;
  struct Cleanup {
    std::string root;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(root, ec);
    }
  } cleanup{root};

  const bool cold = cfg.cache == "cold";
  if (!cfg.json) {
    std::printf(
        "checkpoint_bench: layout {layers %d, heads %d, dim %d, context %d, vocab %d} = %llu "
        "params; params+m+v = %.3f GB\n  save: %d ranks as %d threads of one process; "
        "temp dir %s (%.0f GB free)\n  reads: %s\n",
        config.layers, config.heads, config.dim, config.context, config.vocab,
        static_cast<unsigned long long>(n), 12.0 * n / 1e9, world, world, root.c_str(), avail / 1e9,
        cold ? "cold (posix_fadvise DONTNEED on each file first; guest page cache only)"
             : "warm (page cache as the writes left it)");
    std::fflush(stdout);
  }

  // The model as a DDP rank holds it: full params / m / v.
  std::vector<float> params(n), m(n), v(n);
  Parallel(3, [&](int i) {
    std::vector<float>& buf = i == 0 ? params : i == 1 ? m : v;
    Fill(buf, i + 1, i == 2 ? 0.0f : -0.5f, i == 0 ? 0.2f : i == 1 ? 1e-3f : 1e-6f);
  });
  const uint64_t fingerprint = layout.Fingerprint();
  auto contents = [&](int rank) {
    const FlatRange range = EvenSplit(n, world, rank);
    ShardContents c;
    c.step = step;
    c.rank = rank;
    c.world = world;
    c.layout_fingerprint = fingerprint;
    c.num_params = n;
    c.ranges = {range};
    // As Trainer::SaveShard: copy this rank's slice out of the full buffers.
    c.params.assign(params.begin() + range.begin, params.begin() + range.end);
    c.m.assign(m.begin() + range.begin, m.begin() + range.end);
    c.v.assign(v.begin() + range.begin, v.begin() + range.end);
    c.scalars.optimizer_step = step;
    c.scalars.data_position = step + 1;
    c.scalars.rng_seed = 1234;
    return c;
  };

  std::vector<Row> rows;
  auto emit = [&](Row r) {
    if (r.samples.size() > 1) {
      std::string all;
      for (double x : r.samples) {
        char b[32];
        std::snprintf(b, sizeof(b), "%s%.2f", all.empty() ? "" : "/", x);
        all += b;
      }
      r.note += " [best of " + all + " s]";
    }
    rows.push_back(r);
    if (cfg.json) {
      std::printf("{\"what\": \"%s\", \"bytes\": %llu, \"seconds\": %.4f, \"mb_per_s\": ",
                  r.what.c_str(), static_cast<unsigned long long>(r.bytes), r.seconds);
      if (r.rate) {
        std::printf("%.1f, \"ratio_vs_baseline\": ", r.mbps());
      } else {
        std::printf("null, \"ratio_vs_baseline\": ");
      }
      if (r.ratio) {
        std::printf("%.3f", *r.ratio);
      } else {
        std::printf("null");
      }
      std::printf("%s, \"note\": \"%s\"}\n", r.extra_json.c_str(), r.note.c_str());
    } else {
      if (rows.size() == 1) {
        std::printf("\n%-20s %14s %9s %9s %8s  %s\n", "what", "bytes", "seconds", "MB/s", "x_base",
                    "notes (x_base = baseline MB/s / ours)");
      }
      char ratio[32] = "-";
      if (r.ratio) std::snprintf(ratio, sizeof(ratio), "%.2f", *r.ratio);
      char rate[32] = "-";
      if (r.rate) std::snprintf(rate, sizeof(rate), "%.1f", r.mbps());
      std::printf("%-20s %14llu %9.3f %9s %8s  %s\n", r.what.c_str(),
                  static_cast<unsigned long long>(r.bytes), r.seconds, rate, ratio, r.note.c_str());
    }
    std::fflush(stdout);
  };
  auto vs = [](const Row& ours, const Row& base) { return base.mbps() / ours.mbps(); };

  // Shard file size is known before writing: header + ranges + 4 sections + CRC.
  auto shard_bytes = [&](int rank) {
    const uint64_t e = EvenSplit(n, world, rank).size();
    return uint64_t{8 + 8 + 8 + 8 + 8 + 8 + 8 + 16 + 3 * (16 + 4 * e) + (16 + 32) + 8};
  };
  uint64_t total_bytes = 0;
  for (int r = 0; r < world; ++r) total_bytes += shard_bytes(r);
  // Plain copies are written from params|m|v plus 4 KiB of padding standing
  // in for the shard headers and CRCs, so they have exactly the shards' bytes.
  std::vector<float> extra(1024, 0.5f);
  const std::vector<const std::vector<float>*> srcs_x = {&params, &m, &v, &extra};

  // 1. Baseline: one sequential writer.
  Row base_w1{"plain_write_1", total_bytes};
  for (int rep = 0; rep < cfg.reps; ++rep) {
    const std::string path = JoinPath(root, "plain.bin");
    const double t0 = Now();
    PlainWrite(path, srcs_x, 0, total_bytes);
    base_w1.Add(Now() - t0);
    fs::remove(path);
  }
  base_w1.ratio = 1.0;
  base_w1.note = "1 file, write() 8 MiB chunks + fsync: THE baseline";
  emit(base_w1);

  // 2. Baseline: `world` parallel writers, one file each.
  Row base_wn{"", total_bytes};
  base_wn.what = "plain_write_" + std::to_string(world);
  for (int rep = 0; rep < cfg.reps; ++rep) {
    const double t0 = Now();
    Parallel(world, [&](int r) {
      uint64_t off = 0;
      for (int i = 0; i < r; ++i) off += shard_bytes(i);
      PlainWrite(JoinPath(root, "plain." + std::to_string(r)), srcs_x, off, shard_bytes(r));
    });
    base_wn.Add(Now() - t0);
    for (int r = 0; r < world; ++r) fs::remove(JoinPath(root, "plain." + std::to_string(r)));
  }
  base_wn.ratio = vs(base_wn, base_w1);
  base_wn.note = std::to_string(world) + " threads, 1 file each, fsync each";
  emit(base_wn);

  // 3. The format's CPU cost alone: slice + EncodeShard, no I/O.
  Row enc{"encode_" + std::to_string(world) + "ranks", total_bytes};
  for (int rep = 0; rep < cfg.reps; ++rep) {
    std::vector<uint64_t> sizes(world);
    const double t0 = Now();
    Parallel(world, [&](int r) {
      auto bytes = EncodeShard(contents(r));
      if (!bytes.ok()) Die("EncodeShard", bytes.status());
      sizes[r] = bytes->size();
    });
    enc.Add(Now() - t0);
    for (int r = 0; r < world; ++r) {
      if (sizes[r] != shard_bytes(r)) {
        std::cerr << "checkpoint_bench: shard " << r << " is " << sizes[r] << " bytes, expected "
                  << shard_bytes(r) << "\n";
        return 1;
      }
    }
  }
  enc.ratio = vs(enc, base_w1);
  enc.note = "slice copy + EncodeShard (CRC-64) in memory, " + std::to_string(world) +
             " threads on " + std::to_string(std::thread::hardware_concurrency()) + " cores";
  emit(enc);

  // 4. Save: every rank's WriteShard, then the coordinator's manifest.
  const std::string ckpt_dir = JoinPath(root, "ckpt");
  const std::string step_dir = StepDir(ckpt_dir, step);
  Row save{"save_" + std::to_string(world) + "ranks", total_bytes};
  double manifest_s = 0;
  for (int rep = 0; rep < cfg.reps; ++rep) {
    if (auto s = storage.RemoveAll(ckpt_dir); !s.ok()) Die("RemoveAll", s);  // untimed
    std::vector<ShardFileInfo> infos(world);
    const double t0 = Now();
    Parallel(world, [&](int r) {
      auto info = WriteShard(storage, JoinPath(step_dir, ShardFileName(r)), contents(r));
      if (!info.ok()) Die("WriteShard", info.status());
      infos[r] = *info;
    });
    const double t_shards = Now() - t0;
    auto manifest = MakeManifest(layout, step, world, /*zero_stage=*/0, infos);
    if (!manifest.ok()) Die("MakeManifest", manifest.status());
    if (auto s = WriteManifest(storage, ManifestPath(step_dir), *manifest); !s.ok())
      Die("WriteManifest", s);
    const double t = Now() - t0;
    save.Add(t);
    manifest_s = std::max(manifest_s, t - t_shards);
  }
  {
    char note[160];
    std::snprintf(note, sizeof(note),
                  "WriteShard x%d threads + manifest (<=%.3f s of it); vs plain_write_%d: %.2fx",
                  world, manifest_s, world, base_wn.mbps() / save.mbps());
    save.note = note;
  }
  save.ratio = vs(save, base_w1);
  emit(save);

  std::vector<std::string> shard_paths;
  for (int r = 0; r < world; ++r) shard_paths.push_back(JoinPath(step_dir, ShardFileName(r)));
  auto maybe_drop = [&] {
    if (cold) DropCache(shard_paths);
  };

  // 5. Baseline read: the shard files, sequentially, plain read().
  Row base_r{"plain_read_1", total_bytes};
  for (int rep = 0; rep < cfg.reps; ++rep) {
    std::vector<char> buf(kChunk);
    maybe_drop();
    const double t0 = Now();
    uint64_t got = 0;
    for (const std::string& p : shard_paths) got += PlainRead(p, buf);
    base_r.Add(Now() - t0);
    base_r.bytes = got;
  }
  base_r.ratio = 1.0;
  base_r.note = std::string(
                    "shard files, read() 8 MiB chunks, 1 reused buffer: THE load "
                    "baseline (") +
                (cold ? "cold" : "warm") + ")";
  emit(base_r);

  // 6. LoadAll on one rank (Trainer::Restore).
  Row load_all{"load_all", total_bytes};
  for (int rep = 0; rep < cfg.reps; ++rep) {
    maybe_drop();
    const double t0 = Now();
    auto manifest = ReadManifest(storage, ManifestPath(step_dir));
    if (!manifest.ok()) Die("ReadManifest", manifest.status());
    auto state = LoadAll(storage, step_dir, *manifest);
    if (!state.ok()) Die("LoadAll", state.status());
    load_all.Add(Now() - t0);
    if (state->params != params || state->m != m || state->v != v ||
        state->scalars.optimizer_step != step) {
      std::cerr << "checkpoint_bench: LoadAll returned different data\n";
      return 1;
    }
  }
  load_all.ratio = vs(load_all, base_r);
  load_all.note = "ReadManifest + LoadAll, 1 rank (data verified equal)";
  emit(load_all);

  // 7. Resharding world -> new_world: each new rank's EvenSplit, in turn.
  for (int r = 0; r < new_world; ++r) {
    const FlatRange want = EvenSplit(n, new_world, r);
    uint64_t bytes = 0;
    int files = 0;
    for (int old = 0; old < world; ++old) {
      const FlatRange have = EvenSplit(n, world, old);
      if (have.begin < want.end && want.begin < have.end) {
        bytes += shard_bytes(old);
        ++files;
      }
    }
    Row row{"load_range_" + std::to_string(new_world) + "." + std::to_string(r), bytes};
    for (int rep = 0; rep < cfg.reps; ++rep) {
      maybe_drop();
      const double t0 = Now();
      auto manifest = ReadManifest(storage, ManifestPath(step_dir));
      if (!manifest.ok()) Die("ReadManifest", manifest.status());
      auto state = LoadRange(storage, step_dir, *manifest, want.begin, want.end);
      if (!state.ok()) Die("LoadRange", state.status());
      row.Add(Now() - t0);
      if (!std::equal(state->params.begin(), state->params.end(), params.begin() + want.begin) ||
          !std::equal(state->v.begin(), state->v.end(), v.begin() + want.begin)) {
        std::cerr << "checkpoint_bench: LoadRange returned different data\n";
        return 1;
      }
    }
    row.ratio = vs(row, base_r);
    row.note = "reshard " + std::to_string(world) + "->" + std::to_string(new_world) +
               ": new rank " + std::to_string(r) + " reads " + std::to_string(files) + " of " +
               std::to_string(world) + " shard files";
    emit(row);
  }

  // 8. Step-time overhead of a synchronous save every `interval` steps.
  {
    Row row{"ckpt_every_" + std::to_string(cfg.interval), total_bytes};
    row.seconds = save.seconds / cfg.interval;  // amortized per step
    const double overhead = save.seconds / (cfg.interval * cfg.step_ms / 1e3);
    char note[200];
    std::snprintf(note, sizeof(note),
                  "save_%dranks / (%d x %.0f ms step) = %.1f%% step-time overhead "
                  "(synchronous save); seconds = per step amortized",
                  world, cfg.interval, cfg.step_ms, 100.0 * overhead);
    row.note = note;
    row.rate = false;
    char extra[120];
    std::snprintf(extra, sizeof(extra),
                  ", \"interval_steps\": %d, \"step_ms\": %.1f, \"overhead_fraction\": %.5f",
                  cfg.interval, cfg.step_ms, overhead);
    row.extra_json = extra;
    emit(row);
    if (!cfg.json) {
      std::printf(
          "\nstep time %.0f ms: %s. The trainer's save is synchronous (Trainer::SaveShard "
          "encodes and fsyncs on the training thread), so the whole save is on the step "
          "path.\n",
          cfg.step_ms,
          cfg.step_ms == 1430 ? "default = the engine's measured gpt2-124m CPU step at B=4, "
                                "T=64 on this 2-core machine (train_step_bench; not re-measured "
                                "here, pass --step-ms to override)"
                              : "from --step-ms");
    }
  }
  return 0;
}

}  // namespace
}  // namespace shardtrain::checkpoint

int main(int argc, char** argv) { return shardtrain::checkpoint::Main(argc, argv); }
