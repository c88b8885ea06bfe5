// tokenizer_bench: GPT-2 BPE encoding speed, ours against a reference
// encoder measured in the same run on the same text: npm's gpt-3-encoder
// (OpenAI's encoder.py in JavaScript) under node, timed inside node without
// its start-up and vocabulary load. Rows:
//   reference     gpt-3-encoder encode(), one thread
//   Gpt2Bpe       Gpt2Bpe::Encode over the whole text, one thread, a fresh cache
//   prepare -t N  shardtrain prepare's core end to end (read, encode, write
//                 shards) with N threads
// The reference is slow (minutes for the 2.4 MB of fortunes), so it and the
// Gpt2Bpe row encode the first --reference-bytes of the text (cut at a line
// end); prepare runs over the whole file. Each figure is the best of
// --repeat runs; MB/s of input text and the ratio to the reference. Not a
// test: nothing passes or fails.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/bench_util.h"
#include "common/gpt2_bpe.h"
#include "worker/data/prepare.h"

namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string file = SHARDTRAIN_SOURCE_DIR "/data/fortunes.txt";
  int repeat = 3;
  size_t reference_bytes = 256 << 10;
  CLI::App app{"GPT-2 BPE encoding speed: ours vs npm's gpt-3-encoder, same text, same run"};
  app.add_option("--file", file, "text to encode")->capture_default_str();
  app.add_option("--repeat", repeat, "runs per row (best kept)")->capture_default_str();
  app.add_option("--reference-bytes", reference_bytes,
                 "bytes of the text the reference and Gpt2Bpe rows encode")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::ifstream in(file, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (text.empty()) {
    std::fprintf(stderr, "tokenizer_bench: %s is empty or missing (scripts/setup)\n", file.c_str());
    return 1;
  }
  const double mb = text.size() / 1e6;
  std::string head = text.substr(0, reference_bytes);
  if (head.size() < text.size()) head.resize(head.rfind('\n') + 1);
  const double head_mb = head.size() / 1e6;
  auto bpe = shardtrain::LoadGpt2Vocabulary();
  if (!bpe.ok()) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", std::string(bpe.status().message()).c_str());
    return 1;
  }
  auto files = shardtrain::FindGpt2Vocabulary();
  std::printf("tokenizer_bench: %s, %.2f MB (reference rows: the first %.3f MB); %s\n",
              file.c_str(), mb, head_mb, shardtrain::bench::Uptime().c_str());
  std::fflush(stdout);
  const fs::path tmp = fs::temp_directory_path() / ("tokenizer_bench_" + std::to_string(getpid()));
  fs::create_directories(tmp);
  const std::string head_file = (tmp / "head.txt").string();
  std::ofstream(head_file, std::ios::binary) << head;

  // The reference, timed inside node (best of `repeat`).
  const std::string module = fs::path(files->vocab).parent_path().string();
  const std::string cmd =
      "node -e \"const {encode} = require('" + module +
      "'); const fs = require('fs'); const t = fs.readFileSync('" + head_file +
      "', 'utf8'); let best = 1e9, n = 0; for (let i = 0; i < " + std::to_string(repeat) +
      "; ++i) { const t0 = process.hrtime.bigint(); n = encode(t).length; const s = "
      "Number(process.hrtime.bigint() - t0) / 1e9; if (s < best) best = s; } "
      "fs.writeFileSync('" +
      (tmp / "ref.txt").string() + "', best + ' ' + n);\"";
  double ref_s = 0;
  long ref_tokens = 0;
  if (std::system(cmd.c_str()) == 0) {
    std::ifstream r(tmp / "ref.txt");
    r >> ref_s >> ref_tokens;
  }

  double ours_s = 1e9;
  size_t ours_tokens = 0;
  for (int i = 0; i < repeat; ++i) {
    shardtrain::Gpt2Bpe::Cache cache;
    const auto t0 = Clock::now();
    ours_tokens = (*bpe)->Encode(head, &cache).size();
    ours_s = std::min(ours_s, Seconds(t0));
  }

  std::printf("\n%-16s %10s %10s %12s\n", "ROW", "SECONDS", "MB/S", "VS REFERENCE");
  if (ref_s > 0) {
    std::printf("%-16s %10.3f %10.2f %12s   (%ld tokens)\n", "reference", ref_s, head_mb / ref_s,
                "1.00x", ref_tokens);
  } else {
    std::printf("%-16s %10s %10s %12s   (node or gpt-3-encoder missing: scripts/setup)\n",
                "reference", "-", "-", "-");
  }
  const double ref_rate = ref_s > 0 ? head_mb / ref_s : 0;
  auto row = [&](const char* name, double s, double row_mb, size_t tokens) {
    std::printf("%-16s %10.3f %10.2f %11.2fx   (%zu tokens%s)\n", name, s, row_mb / s,
                ref_rate > 0 ? row_mb / s / ref_rate : 0.0, tokens,
                ref_s > 0 && long(tokens) != ref_tokens && std::string(name) == "Gpt2Bpe"
                    ? ", DIFFERENT from the reference"
                    : "");
  };
  row("Gpt2Bpe", ours_s, head_mb, ours_tokens);
  for (int threads : {1, 2}) {
    double best = 1e9;
    int64_t tokens = 0;
    for (int i = 0; i < repeat; ++i) {
      shardtrain::data::PrepareOptions o;
      o.inputs = {file};
      o.out_dir = (tmp / ("out-" + std::to_string(threads) + "-" + std::to_string(i))).string();
      o.threads = threads;
      const auto t0 = Clock::now();
      auto s = shardtrain::data::Prepare(o);
      const double took = Seconds(t0);
      if (!s.ok()) {
        std::fprintf(stderr, "prepare: %s\n", std::string(s.status().message()).c_str());
        return 1;
      }
      best = std::min(best, took);
      tokens = s->train_tokens;
    }
    row(threads == 1 ? "prepare -t 1" : "prepare -t 2", best, mb, size_t(tokens));
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);
  return 0;
}
