// shardtrain: the command-line client of a shardtrain cluster.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/commands.h"
#include "client/errors.h"
#include "client/local_cluster.h"
#include "client/prepare.h"
#include "client/sample.h"
#include "common/address.h"
#include "common/process.h"
#include "common/version.h"

int main(int argc, char** argv) {
  using namespace shardtrain::client;
  GlobalFlags g;
  if (const char* env = std::getenv("SHARDTRAIN_COORDINATOR"); env && *env) g.coordinator = env;

  CLI::App app{
      "shardtrain: submit, watch and manage training jobs on a shardtrain cluster.\n"
      "Run a whole cluster on this machine with `shardtrain local JOB.yaml`."};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every command");
  app.set_version_flag("--version", shardtrain::VersionLine("shardtrain"));
  app.footer(ExitCodeHelp() +
             "\nWith --output json, an error is one JSON object on stderr,\n"
             "  {\"error\": {\"code\": \"NOT_FOUND\", \"message\": \"job j-9 not found\"}}\n"
             "(with \"detail\" when there is a raw cause), and stdout holds only data.\n"
             "-v shows the raw cause in text mode.");
  std::string token, token_file, tls_ca, tls_cert, tls_key;
  auto add_common = [&](CLI::App* cmd, bool remote, const char* outputs) {
    cmd->add_flag("-v,--verbose", g.verbose, "errors also print their raw cause (gRPC's message)");
    if (remote) {
      cmd->add_option(
             "--coordinator", g.coordinator,
             "coordinator address: " + shardtrain::AddressForms(shardtrain::AddressUse::kDial) +
                 ", or several comma-separated (coordinators on one etcd: the leader is "
                 "followed) (env SHARDTRAIN_COORDINATOR)")
          ->capture_default_str();
      cmd->add_option("--timeout-ms", g.timeout_ms, "deadline of each call to the coordinator")
          ->capture_default_str();
      cmd->add_option(
          "--token", token,
          "bearer token for a coordinator started with --tokens (env SHARDTRAIN_TOKEN)");
      cmd->add_option("--token-file", token_file, "file holding the bearer token");
      cmd->add_option("--tls-ca", tls_ca, "CA certificate (PEM) of a TLS coordinator: TLS on");
      cmd->add_option("--tls-cert", tls_cert, "client certificate (PEM) for mutual TLS");
      cmd->add_option("--tls-key", tls_key, "private key (PEM) of --tls-cert");
    }
    if (outputs) {
      cmd->add_option("--output,-o", g.output, std::string("output format: ") + outputs)
          ->capture_default_str()
          ->check(CLI::IsMember(CLI::detail::split(outputs, '|')));
    }
  };

  std::string spec_path, job_id, resume_from;
  std::vector<std::string> sets;
  bool wait = false;
  int world = 0;
  LocalOptions local;

  auto* submit = app.add_subcommand("submit", "submit a job spec; prints the job id");
  submit->add_option("spec", spec_path, "job spec (YAML)")->required();
  submit->add_option("--set", sets, "override a spec field: key.path=value (repeatable)");
  submit->add_option("--resume-from", resume_from,
                     "start from a committed checkpoint: a checkpoint dir (newest valid commit) "
                     "or one step-N dir; any world size");
  submit->add_flag("--wait", wait, "watch the job and exit with its result (0 = SUCCEEDED)");
  add_common(submit, true, "table|json");

  auto* list = app.add_subcommand("list", "list every job the coordinator acknowledged");
  add_common(list, true, "table|json");

  auto* status = app.add_subcommand("status", "show one job: state, progress, ranks");
  status->add_option("job", job_id, "job id (j-000001)")->required();
  add_common(status, true, "table|json");

  auto* watch = app.add_subcommand(
      "watch", "stream a job's events (one line per step) until it ends; exit 0 if it SUCCEEDED");
  watch->add_option("job", job_id, "job id")->required();
  add_common(watch, true, "table|json");

  auto* cancel =
      app.add_subcommand("cancel", "cancel a job; its ranks stop and free their workers");
  cancel->add_option("job", job_id, "job id")->required();
  add_common(cancel, true, "table|json");

  auto* workers = app.add_subcommand("workers", "list attached workers and their state");
  add_common(workers, true, "table|json");

  std::vector<std::string> history_jobs;
  HistoryPlot history_plot;
  auto* history = app.add_subcommand("history", "per-step history of a job, or its loss curve");
  history->add_option("job", history_jobs, "job id (several with --plot: side by side)")
      ->required();
  auto* plot_opt =
      history
          ->add_option("--plot", history_plot.file,
                       "draw loss and val_loss: in the terminal, or as an SVG chart into "
                       "FILE.svg when given")
          ->expected(0, 1);
  add_common(history, true, "table|csv|json");

  auto* why = app.add_subcommand(
      "why",
      "why a running job is stuck or slow: the rank missing from a collective (from the "
      "ranks' flight recorders and last heartbeats), or the slowest rank");
  why->add_option("job", job_id, "job id")->required();
  add_common(why, true, "table|json");

  auto* ckpts = app.add_subcommand("checkpoints", "committed checkpoints of a job, newest first");
  ckpts->add_option("job", job_id, "job id")->required();
  add_common(ckpts, true, "table|json");

  auto* plan = app.add_subcommand("plan",
                                  "validate a spec and print its plan without a cluster: "
                                  "rank layout, shards, memory per rank (and ZeRO stages 0-3 "
                                  "against the ZeRO paper's formula), comm bytes per step, "
                                  "pipeline bubble");
  plan->add_option("spec", spec_path, "job spec (YAML)")->required();
  plan->add_option("--set", sets, "override a spec field: key.path=value (repeatable)");
  plan->add_option("--world", world, "number of ranks (default: dp·tp·pp of the spec)");
  bool plan_auto = false;
  PlanAutoFlags auto_flags;
  plan->add_flag("--auto", plan_auto,
                 "search every dp×tp×pp layout (ZeRO 0-3, 3 only with pp 1; 1F1B; global "
                 "batch kept; the spec's parallel.cp kept, or for seq_len >= 2048 on CPU ranks "
                 "also cp = 2, 4, ... splitting each sequence; MoE models: every ep) on --ranks "
                 "ranks that fits --memory-per-rank, ranked by predicted "
                 "step time = 6·params·tokens/(ranks·flops)/(1-bubble) + tp bytes/tp bandwidth + "
                 "pp, dp and cp bytes/link bandwidth + ep all-to-all bytes/(tp bandwidth inside "
                 "a node, else link bandwidth) (no overlap); a layout over "
                 "the budget is tried again with activation recomputation, cheapest first "
                 "(model.recompute selective, then full on the first K blocks of each stage); "
                 "prints the top 10 and the chosen layout as --set overrides; exit 2 when "
                 "nothing fits");
  plan->add_option("--ranks", auto_flags.ranks, "--auto: ranks (default: the spec's world)")
      ->check(CLI::Range(1, 1 << 20));
  plan->add_option("--memory-per-rank", auto_flags.memory,
                   "--auto: memory budget per rank, e.g. 4GiB, 80GiB, 512MiB (required)");
  plan->add_option("--tflops-per-rank", auto_flags.tflops,
                   "--auto: sustained TFLOP/s per rank (default: a cuda spec's --gpu dense peak "
                   "for its precision × --mfu, from the table the workers' MFU uses; a cpu "
                   "spec's 100)")
      ->check(CLI::PositiveNumber);
  plan->add_option("--gpu", auto_flags.gpu,
                   "--auto: the GPU model a cuda spec runs on (H100, H200, A100, L40S, L4, ...)")
      ->capture_default_str();
  plan->add_option("--mfu", auto_flags.mfu,
                   "--auto: the share of --gpu's dense peak a rank sustains")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1.0));
  plan->add_option("--tp-bandwidth", auto_flags.tp_gbps,
                   "--auto: GB/s a rank sends inside a tp group")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  plan->add_option("--link-bandwidth", auto_flags.link_gbps,
                   "--auto: GB/s a rank sends between nodes (pp, dp)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  plan->add_option("--ranks-per-node", auto_flags.ranks_per_node,
                   "--auto: ranks of one node; an MoE model's ep group within one (tp · ep "
                   "consecutive ranks) sends its all-to-all at --tp-bandwidth")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  add_common(plan, false, "table|json");

  auto* lc = app.add_subcommand(
      "local",
      "run a coordinator and N workers on this machine, train the job, tear down. A job with "
      "resources.device: cuda gets GPU workers (worker i drives GPU i mod the GPUs that "
      "`shardtrain-worker --probe-devices` lists); on a machine without one it is refused "
      "(exit 1) before anything starts");
  lc->add_option("spec", local.spec_path, "job spec (YAML)")->required();
  lc->add_option("--set", local.sets, "override a spec field: key.path=value (repeatable)");
  lc->add_option("--workers", local.workers, "workers to start (default: the spec's world)")
      ->check(CLI::Range(1, 256));
  lc->add_option("--threads", local.threads, "threads per worker (default: cores / workers)")
      ->check(CLI::Range(1, 1024));
  lc->add_option("--lease-ms", local.lease_ms, "worker lease of the local coordinator")
      ->capture_default_str();
  lc->add_flag("--keep", local.keep, "keep the temporary state and logs");
  lc->add_flag("--plot", local.plot, "draw the loss curve (and val_loss) when the job ends");
  lc->add_option("--resume-from", local.resume_from,
                 "start from a committed checkpoint: a checkpoint dir (newest valid commit) or "
                 "one step-N dir; any world size");
  add_common(lc, false, "table|json");

  ExportOptions export_opts;
  auto* exp = app.add_subcommand(
      "export",
      "write trained weights in Hugging Face's layout. GPT-2: OUT/model.safetensors (fp32, "
      "Conv1D (in, out) weights, the unpadded vocabulary, lm_head tied to wte), "
      "OUT/config.json and, for GPT-2 vocabularies, the tokenizer's vocab.json and merges.txt. "
      "Llama: LlamaForCausalLM's OUT/config.json, generation_config.json and "
      "model.safetensors (q/k rows permuted to rotate_half's order), sharded as "
      "model-0000K-of-0000N.safetensors with model.safetensors.index.json above "
      "--max-shard-size, and --tokenizer-json as OUT/tokenizer.json");
  exp->add_option("weights", export_opts.source,
                  "weights file, a job's checkpoint.dir (final.weights, else its newest valid "
                  "commit) or one step-N dir")
      ->required();
  exp->add_option("--format", export_opts.format, "safetensors")
      ->capture_default_str()
      ->check(CLI::IsMember({"safetensors"}));
  exp->add_option("--out,-O", export_opts.out, "output directory (absent or empty)")->required();
  exp->add_option("--vocab", export_opts.vocab,
                  "folder of GPT-2's vocabulary for the tokenizer files (default: "
                  "$SHARDTRAIN_GPT2_VOCAB, then the one scripts/setup installs)");
  exp->add_option("--dtype", export_opts.dtype, "Llama: the weights' type, fp32 | bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  exp->add_option("--max-shard-size", export_opts.max_shard_size,
                  "Llama: the largest safetensors file, e.g. 5GB, 500MB, 2GiB")
      ->capture_default_str();
  exp->add_flag(
      "--adapter", export_opts.adapter,
      "a LoRA job's checkpoint: its adapters as Hugging Face PEFT's "
      "adapter_config.json and adapter_model.safetensors (Llama family; --dtype applies)");
  exp->add_option(
      "--merged", export_opts.merged_base,
      "BASE: a LoRA job's checkpoint merged into the model it fine-tuned (BASE: the job's "
      "model.init, a weights file or a Hugging Face folder), W + (alpha / rank)·B·A, exported "
      "as any model (the job's final.weights is that model at its last step)");
  exp->add_option("--tokenizer-json", export_opts.tokenizer_json,
                  "Llama: the job's tokenizer.json, written beside the weights (default for a "
                  "vocabulary of 128256: Llama 3's, as scripts/setup installs it)");
  add_common(exp, false, "table|json");

  PrepareFlags prep;
  auto* prepare = app.add_subcommand(
      "prepare",
      "tokenize text files or directories into llm.c token shards for data.format: llmc "
      "(OUT/train/000000.bin, ..., OUT/val/... with --val or --val-fraction); each file is a "
      "document, led by the tokenizer's document token (gpt2: <|endoftext|>, llama3: "
      "<|begin_of_text|>); text that reads like a special token is encoded as text; uint16 "
      "token files, uint32 for vocabularies past 65536 ids (llm.c's two formats); written to a "
      "temporary directory and renamed to OUT when complete, so an error leaves nothing");
  prepare->add_option("inputs", prep.inputs, "text files or directories (every file under them)")
      ->required();
  prepare->add_option("--out,-O", prep.out, "output directory (must not exist)")->required();
  auto* prep_tokenizer =
      prepare
          ->add_option("--tokenizer", prep.tokenizer,
                       "gpt2 (GPT-2's BPE, 50257 ids) | llama3 (Llama 3's, 128256 ids) | byte")
          ->capture_default_str()
          ->check(CLI::IsMember({"gpt2", "llama3", "byte"}));
  prepare
      ->add_option("--tokenizer-json", prep.tokenizer_json,
                   "any BPE tokenizer as Hugging Face's tokenizer.json, byte-level (Qwen, "
                   "SmolLM, ...) or SentencePiece-style with byte fallback (Llama 2, Mistral, "
                   "...; the file or its folder) instead of --tokenizer; a job spec names it as "
                   "data.tokenizer_json")
      ->excludes(prep_tokenizer);
  prepare->add_option("--val", prep.val, "held-out text files or directories (repeatable)");
  prepare
      ->add_option("--val-fraction", prep.val_fraction,
                   "hold out the last fraction of the input bytes as validation data, cut at "
                   "a line start")
      ->check(CLI::Range(0.0, 0.999999))
      ->excludes("--val");
  prepare->add_option("--shard-tokens", prep.shard_tokens, "tokens per shard file")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{2147483647}));
  prepare->add_option("--threads", prep.threads, "encoding threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  prepare->add_option("--vocab", prep.vocab,
                      "the named tokenizer's files: gpt2, a folder of encoder.json + vocab.bpe or "
                      "vocab.json + merges.txt (default: $SHARDTRAIN_GPT2_VOCAB); llama3, its "
                      "tokenizer.json (default: $SHARDTRAIN_LLAMA3_TOKENIZER); then the ones "
                      "scripts/setup installs");
  add_common(prepare, false, "table|json");

  SampleOptions sample_opts;
  auto* sample = app.add_subcommand("sample", "generate text from trained weights");
  sample
      ->add_option("checkpoint", sample_opts.checkpoint,
                   "weights file, or a job's checkpoint.dir (reads final.weights)")
      ->required();
  sample->add_option("--prompt", sample_opts.prompt, "text to continue")->capture_default_str();
  sample->add_option("--tokens", sample_opts.tokens, "tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  sample->add_option("--temperature", sample_opts.temperature, "0 = greedy; higher = more random")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  sample->add_option("--seed", sample_opts.seed, "sampling seed")->capture_default_str();
  sample->add_option("--threads", sample_opts.threads, "compute threads")->capture_default_str();
  sample->add_option("--vocab", sample_opts.vocab,
                     "the named tokenizer's files: gpt2, the folder of GPT-2's vocabulary "
                     "(default: $SHARDTRAIN_GPT2_VOCAB); llama3, its tokenizer.json (default: "
                     "$SHARDTRAIN_LLAMA3_TOKENIZER); then the ones scripts/setup installs");
  auto* sample_tokenizer =
      sample
          ->add_option("--tokenizer", sample_opts.tokenizer,
                       "the tokenizer the model was trained with (data.tokenizer): auto = byte "
                       "for vocab 256, gpt2 from 50257, llama3 from 128256; byte on a larger "
                       "vocabulary samples bytes only. Special tokens in --prompt are tokens; "
                       "llama3 prompts start with <|begin_of_text|>")
          ->capture_default_str()
          ->check(CLI::IsMember({"auto", "byte", "gpt2", "llama3"}));
  sample
      ->add_option("--tokenizer-json", sample_opts.tokenizer_json,
                   "a Hugging Face tokenizer.json the model was trained with "
                   "(data.tokenizer_json) instead of --tokenizer")
      ->excludes(sample_tokenizer);
  add_common(sample, false, "table|json");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    if (!WantsJson(argc, argv)) {
      app.exit(e);  // the message and "Run with --help ..."
      return kExitUsage;
    }
    g.output = "json";
    return ReportError(g, absl::InvalidArgumentError(e.what()));
  }
  // A bad address is a usage error before any call (gRPC would read
  // "HOST:notaport" as port 0 and fail to connect).
  CLI::App* cmd = app.get_subcommands().front();
  if (cmd->get_option_no_throw("--coordinator") != nullptr) {
    const char* source =
        cmd->count("--coordinator") > 0 ? "--coordinator" : "SHARDTRAIN_COORDINATOR";
    auto s = shardtrain::CheckAddressListFlag(source, g.coordinator, shardtrain::AddressUse::kDial);
    if (!s.ok()) return ReportError(g, s);
    const char* env_token = std::getenv("SHARDTRAIN_TOKEN");
    auto connect = shardtrain::worker::ReadConnectOptions(
        token, token_file, env_token ? env_token : "", tls_ca, tls_cert, tls_key);
    if (!connect.ok()) return ReportError(g, connect.status());
    g.connect = *std::move(connect);
  }

  if (*submit) return Submit(g, spec_path, sets, resume_from, wait);
  if (*list) return List(g);
  if (*status) return Status(g, job_id);
  if (*watch) return Watch(g, job_id);
  if (*cancel) return Cancel(g, job_id);
  if (*workers) return Workers(g);
  if (*history) {
    history_plot.wanted = plot_opt->count() > 0;
    return History(g, history_jobs, history_plot);
  }
  if (*plan && plan_auto) {
    if (auto_flags.memory.empty()) {
      return ReportError(g,
                         absl::InvalidArgumentError("plan --auto: --memory-per-rank is required"));
    }
    return PlanAuto(g, spec_path, sets, auto_flags);
  }
  if (*plan) return Plan(g, spec_path, sets, world);
  if (*ckpts) return Checkpoints(g, job_id);
  if (*why) return Why(g, job_id);
  if (*sample) return Sample(g, sample_opts);
  if (*prepare) return Prepare(g, prep);
  if (*exp) return Export(g, export_opts);
  if (*lc) {
    shardtrain::BlockTerminationSignals();
    return Local(g, local);
  }
  return kExitUsage;
}
