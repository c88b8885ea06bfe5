// tokenizer_bench: BPE encoding speed, ours against the JavaScript
// reference measured in the same run on the same text, for GPT-2 and Llama 3
// (byte-level) and Llama 2 (SentencePiece-style: third_party/llama2's
// tokenizer.json, loaded as a json tokenizer; its vocabulary is Mistral
// 7B's). The reference is @lenml/tokenizers (transformers.js's
// tokenizers) under node, timed inside node without its start-up and
// vocabulary load (tests/tools/bpe_reference.js). Rows, per tokenizer:
//   load           ours: reading the tokenizer's files (once per process)
//   reference      @lenml/tokenizers encode(), one thread
//   ByteLevelBpe   ByteLevelBpe::Encode over the whole text, one thread, a
//                  fresh cache (and whether its ids equal the reference's)
//   prepare -t N   shardtrain prepare's core end to end after the load (read,
//                  encode, write shards) with N threads
// The reference and ByteLevelBpe rows encode the first --reference-bytes of
// the text (cut at a line end); prepare runs over the whole file. Each
// figure is the best of --repeat runs; MB/s of input text and the ratio to
// the reference. With --json one object per row. Not a test: nothing passes
// or fails.
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
#include "common/tokenizers.h"
#include "worker/data/prepare.h"

namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Reference {
  double seconds = 0;  // 0: not run
  std::vector<int> ids;
};

// The reference's best time and ids for `text_file` (tests/tools/bpe_reference.js).
Reference RunReference(const std::string& tokenizer_arg, const fs::path& text_file,
                       const fs::path& tmp, int repeat) {
  const fs::path out = tmp / "ref.txt";
  const std::string cmd = "node " SHARDTRAIN_SOURCE_DIR "/tests/tools/bpe_reference.js '" +
                          tokenizer_arg + "' '" + text_file.string() + "' '" + out.string() + "' " +
                          std::to_string(repeat);
  Reference r;
  if (std::system(cmd.c_str()) != 0) return r;
  std::ifstream in(out);
  in >> r.seconds;
  for (int id; in >> id;) r.ids.push_back(id);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string file = SHARDTRAIN_SOURCE_DIR "/data/fortunes.txt";
  int repeat = 3;
  size_t reference_bytes = 256 << 10;
  bool json = false;
  CLI::App app{
      "BPE encoding speed, GPT-2, Llama 3 and Llama 2: ours vs @lenml/tokenizers (the "
      "JavaScript reference), same text, same run"};
  app.add_option("--file", file, "text to encode")->capture_default_str();
  app.add_option("--repeat", repeat, "runs per row (best kept)")->capture_default_str();
  app.add_option("--reference-bytes", reference_bytes,
                 "bytes of the text the reference and ByteLevelBpe rows encode")
      ->capture_default_str();
  app.add_flag("--json", json, "one JSON object per row");
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
  if (!json) {
    std::printf("tokenizer_bench: %s, %.2f MB (reference rows: the first %.3f MB); %s\n",
                file.c_str(), mb, head_mb, shardtrain::bench::Uptime().c_str());
    std::printf("\n%-8s %-14s %10s %10s %12s\n", "TOKENIZER", "ROW", "SECONDS", "MB/S",
                "VS REFERENCE");
  }
  std::fflush(stdout);
  const fs::path tmp = fs::temp_directory_path() / ("tokenizer_bench_" + std::to_string(getpid()));
  fs::create_directories(tmp);
  const fs::path head_file = tmp / "head.txt";
  std::ofstream(head_file, std::ios::binary) << head;

  int status = 0;
  // The tokenizers: a name, its kind and path as LoadTokenizer and prepare
  // take them (Llama 2: a json tokenizer; "" when its file is missing).
  struct Tokenizer {
    std::string name;
    shardtrain::TokenizerKind kind;
    std::string path;
  };
  const absl::StatusOr<std::string> llama2 = shardtrain::FindLlama2Tokenizer();
  const std::vector<Tokenizer> tokenizers = {
      {"gpt2", shardtrain::TokenizerKind::kGpt2, ""},
      {"llama3", shardtrain::TokenizerKind::kLlama3, ""},
      {"llama2", shardtrain::TokenizerKind::kJson, llama2.ok() ? *llama2 : ""}};
  for (const Tokenizer& t : tokenizers) {
    const std::string& name = t.name;
    const shardtrain::TokenizerKind kind = t.kind;
    if (kind == shardtrain::TokenizerKind::kJson && t.path.empty()) {
      std::fprintf(stderr, "tokenizer_bench: %s: %s\n", name.c_str(),
                   std::string(llama2.status().message()).c_str());
      status = 1;
      continue;
    }
    const auto load_t0 = Clock::now();
    auto bpe = shardtrain::LoadTokenizer(kind, t.path);
    const double load_s = Seconds(load_t0);
    std::string reference_arg = t.path;
    if (kind == shardtrain::TokenizerKind::kGpt2) {
      auto files = shardtrain::FindGpt2Vocabulary();
      if (files.ok()) reference_arg = "gpt2:" + fs::path(files->vocab).parent_path().string();
    } else if (kind == shardtrain::TokenizerKind::kLlama3) {
      auto path = shardtrain::FindLlama3Tokenizer();
      if (path.ok()) reference_arg = *path;
    }
    if (!bpe.ok()) {
      std::fprintf(stderr, "tokenizer_bench: %s\n", std::string(bpe.status().message()).c_str());
      status = 1;
      continue;
    }
    const Reference ref = RunReference(reference_arg, head_file, tmp, repeat);

    double ours_s = 1e9;
    std::vector<int> ours;
    for (int i = 0; i < repeat; ++i) {
      shardtrain::ByteLevelBpe::Cache cache;
      const auto t0 = Clock::now();
      ours = (*bpe)->Encode(head, &cache);
      ours_s = std::min(ours_s, Seconds(t0));
    }

    const double ref_rate = ref.seconds > 0 ? head_mb / ref.seconds : 0;
    auto row = [&](const std::string& row_name, double s, double row_mb, size_t tokens,
                   const std::string& note) {
      const double ratio = ref_rate > 0 ? row_mb / s / ref_rate : 0;
      if (json) {
        std::printf(
            "{\"tokenizer\": \"%s\", \"row\": \"%s\", \"seconds\": %.6f, \"mb_per_s\": %.3f, "
            "\"vs_reference\": %.3f, \"tokens\": %zu}\n",
            name.c_str(), row_name.c_str(), s, row_mb / s, ratio, tokens);
      } else {
        std::printf("%-8s %-14s %10.3f %10.2f %11.2fx   (%zu tokens%s)\n", name.c_str(),
                    row_name.c_str(), s, row_mb / s, ratio, tokens, note.c_str());
      }
      std::fflush(stdout);
    };
    if (json) {
      std::printf("{\"tokenizer\": \"%s\", \"row\": \"load\", \"seconds\": %.6f}\n", name.c_str(),
                  load_s);
    } else {
      std::printf("%-8s %-14s %10.3f %10s %12s   (the files, once per process)\n", name.c_str(),
                  "load", load_s, "-", "-");
    }
    if (ref.seconds > 0) {
      row("reference", ref.seconds, head_mb, ref.ids.size(), "");
    } else if (!json) {
      std::printf(
          "%-8s %-14s %10s %10s %12s   (node or @lenml/tokenizers missing: "
          "scripts/setup)\n",
          name.c_str(), "reference", "-", "-", "-");
    }
    row("ByteLevelBpe", ours_s, head_mb, ours.size(),
        ref.seconds <= 0  ? ""
        : ours == ref.ids ? ", ids equal the reference's"
                          : ", ids DIFFERENT from the reference's");
    for (int threads : {1, 2}) {
      double best = 1e9;
      int64_t tokens = 0;
      for (int i = 0; i < repeat; ++i) {
        shardtrain::data::PrepareOptions o;
        o.inputs = {file};
        o.out_dir =
            (tmp / (name + "-" + std::to_string(threads) + "-" + std::to_string(i))).string();
        o.tokenizer = kind;
        o.tokenizer_path = t.path;
        o.threads = threads;
        auto s = shardtrain::data::Prepare(o);
        if (!s.ok()) {
          std::fprintf(stderr, "prepare: %s\n", std::string(s.status().message()).c_str());
          return 1;
        }
        best = std::min(best, s->seconds);
        tokens = s->train_tokens;
        std::error_code ec;
        fs::remove_all(o.out_dir, ec);
      }
      row("prepare -t " + std::to_string(threads), best, mb, size_t(tokens), ", load excluded");
    }
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);
  return status;
}
