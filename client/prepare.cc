#include "client/prepare.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/errors.h"
#include "client/output.h"
#include "worker/data/prepare.h"

namespace shardtrain::client {
namespace {

std::string Mb(int64_t bytes) { return absl::StrFormat("%.1f", bytes / 1e6); }

// "12.3 / 24.5 MB (50%)  3.21 MB/s  ETA 4 s"
std::string ProgressLine(const data::PrepareProgress& p) {
  const double rate = p.seconds > 0 ? p.bytes_done / 1e6 / p.seconds : 0;
  const double left = rate > 0 ? (p.bytes_total - p.bytes_done) / 1e6 / rate : 0;
  return absl::StrFormat("prepare: %s / %s MB (%.0f%%)  %.2f MB/s  %d tokens  ETA %.0f s",
                         Mb(p.bytes_done), Mb(p.bytes_total),
                         p.bytes_total > 0 ? 100.0 * p.bytes_done / p.bytes_total : 100.0, rate,
                         p.tokens, left);
}

std::string Shards(size_t n) { return absl::StrCat(n, n == 1 ? " shard" : " shards"); }

std::string JsonList(const std::vector<std::string>& v) {
  std::vector<std::string> quoted;
  for (const std::string& s : v) quoted.push_back(JsonString(s));
  return absl::StrCat("[", absl::StrJoin(quoted, ", "), "]");
}

}  // namespace

int Prepare(const GlobalFlags& g, const PrepareFlags& f) {
  data::PrepareOptions o;
  o.inputs = f.inputs;
  o.val_inputs = f.val;
  o.val_fraction = f.val_fraction;
  o.out_dir = f.out;
  o.tokenizer = !f.tokenizer_json.empty() ? TokenizerKind::kJson
                : f.tokenizer == "byte"   ? TokenizerKind::kByte
                : f.tokenizer == "llama3" ? TokenizerKind::kLlama3
                                          : TokenizerKind::kGpt2;
  o.tokenizer_path = !f.tokenizer_json.empty() ? f.tokenizer_json : f.vocab;
  o.shard_tokens = f.shard_tokens;
  o.threads = f.threads;
  // Progress on stderr: rewritten in place on a terminal, a line every 2 s
  // otherwise (logs).
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  double printed_at = -1;
  o.progress = [&](const data::PrepareProgress& p) {
    if (!tty && printed_at >= 0 && p.seconds - printed_at < 2 && p.bytes_done < p.bytes_total) {
      return;
    }
    printed_at = p.seconds;
    std::cerr << (tty ? "\r" : "") << ProgressLine(p) << (tty ? "\033[K" : "\n") << std::flush;
  };
  absl::StatusOr<data::PrepareSummary> s = data::Prepare(o);
  if (tty && printed_at >= 0) std::cerr << "\n";
  if (!s.ok()) return ReportError(g, s.status());
  const double rate = s->seconds > 0 ? s->bytes / 1e6 / s->seconds : 0;
  const std::string train_dir = f.out + "/train", val_dir = f.out + "/val";
  const std::string tokenizer = f.tokenizer_json.empty() ? f.tokenizer : "json";
  if (g.output == "json") {
    std::cout << "{\"out\": " << JsonString(f.out) << ", \"tokenizer\": " << JsonString(tokenizer)
              << (f.tokenizer_json.empty()
                      ? ""
                      : ", \"tokenizer_json\": " + JsonString(f.tokenizer_json))
              << ", \"vocab_size\": " << s->vocab_size
              << ", \"document_token\": " << s->document_token
              << ", \"token_bytes\": " << s->token_bytes << ", \"documents\": " << s->documents
              << ", \"bytes\": " << s->bytes << ", \"train_tokens\": " << s->train_tokens
              << ", \"val_tokens\": " << s->val_tokens
              << ", \"train_shards\": " << JsonList(s->train_shards)
              << ", \"val_shards\": " << JsonList(s->val_shards) << ", \"seconds\": " << s->seconds
              << ", \"mb_per_s\": " << rate << ", \"threads\": " << f.threads << "}" << std::endl;
    return kExitOk;
  }
  std::cout << absl::StrFormat(
      "prepared %d document%s, %d bytes -> %d tokens (%s) in %.2f s (%.2f MB/s, %d thread%s)\n",
      s->documents, s->documents == 1 ? "" : "s", s->bytes, s->train_tokens + s->val_tokens,
      tokenizer, s->seconds, rate, f.threads, f.threads == 1 ? "" : "s");
  std::cout << absl::StrFormat(
      "  vocabulary %d ids, uint%d token files, %s\n", s->vocab_size, 8 * s->token_bytes,
      s->document_token >= 0 ? absl::StrCat("id ", s->document_token, " leads each document")
                             : std::string("documents concatenated"));
  std::cout << absl::StrFormat("  train %12d tokens in %-10s %s\n", s->train_tokens,
                               Shards(s->train_shards.size()), train_dir);
  if (!s->val_shards.empty()) {
    std::cout << absl::StrFormat("  val   %12d tokens in %-10s %s\n", s->val_tokens,
                                 Shards(s->val_shards.size()), val_dir);
  }
  std::cout << "in a job spec: data: {train: " << train_dir
            << (s->val_shards.empty() ? "" : ", val: " + val_dir) << ", format: llmc, "
            << (f.tokenizer_json.empty() ? "tokenizer: " + f.tokenizer
                                         : "tokenizer_json: " + f.tokenizer_json)
            << "} (model.vocab >= " << s->vocab_size << ")" << std::endl;
  return kExitOk;
}

}  // namespace shardtrain::client
