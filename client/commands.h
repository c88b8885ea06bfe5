// The `shardtrain` CLI's commands, each returning the process exit code
// (client/errors.h: 0 on success, 1 when the operation failed or the job did
// not succeed, 2 for bad input, 3 for unknown ids, 4 when the coordinator
// does not answer).
#ifndef SHARDTRAIN_CLIENT_COMMANDS_H_
#define SHARDTRAIN_CLIENT_COMMANDS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/job_spec.h"
#include "worker/coordinator_client.h"

namespace shardtrain::client {

struct GlobalFlags {
  std::string coordinator = "127.0.0.1:7070";  // --coordinator / $SHARDTRAIN_COORDINATOR
  std::string output = "table";                // table | json (csv for history)
  int64_t timeout_ms = 10'000;                 // per RPC
  bool verbose = false;                        // -v: errors also print their raw cause
  // Token and TLS, read once from --token / --token-file / $SHARDTRAIN_TOKEN
  // and --tls-ca / --tls-cert / --tls-key.
  worker::ConnectOptions connect;
};

int Submit(const GlobalFlags& g, const std::string& spec_path, std::vector<std::string> sets,
           const std::string& resume_from, bool wait);
int List(const GlobalFlags& g);
int Status(const GlobalFlags& g, const std::string& job_id);
// Streams the job's events until it ends; exit 0 only when it SUCCEEDED.
int Watch(const GlobalFlags& g, const std::string& job_id);
int Cancel(const GlobalFlags& g, const std::string& job_id);
int Workers(const GlobalFlags& g);
// history --plot: draw loss (and val_loss) in the terminal, or into an SVG
// file when `file` is set.
struct HistoryPlot {
  bool wanted = false;
  std::string file;
};
int History(const GlobalFlags& g, const std::vector<std::string>& job_ids, const HistoryPlot& plot);
int Checkpoints(const GlobalFlags& g, const std::string& job_id);
// Which rank a running job waits for (client/why.h): the rank missing from a
// stuck collective, or the slowest one. Exit 0 when the coordinator answered
// (whatever the verdict), else as ReportError.
int Why(const GlobalFlags& g, const std::string& job_id);
int Plan(const GlobalFlags& g, const std::string& spec_path, std::vector<std::string> sets,
         int world);

// `plan --auto`: the flags, as given (the cost model's defaults are
// CostModel's, common/auto_layout.h).
struct PlanAutoFlags {
  int ranks = 0;       // --ranks (default: the spec's world)
  std::string memory;  // --memory-per-rank, e.g. "4GiB"; required
  // --tflops-per-rank; 0: a cuda spec's from the peak table (--gpu's dense
  // peak for the spec's precision × --mfu), a cpu spec's 100.
  double tflops = 0;
  std::string gpu = "H100";  // --gpu: the model whose peak a cuda spec assumes
  double mfu = 0.4;          // --mfu: the share of that peak a rank sustains
  double tp_gbps = 300;      // --tp-bandwidth, GB/s inside a tp group
  double link_gbps = 25;     // --link-bandwidth, GB/s between nodes
  int ranks_per_node = 8;    // --ranks-per-node: an ep group inside one uses tp_gbps
};
// Searches the layouts of the spec's model on --ranks ranks
// (common/auto_layout.h) and prints the ranked table and the chosen layout
// as --set overrides. Exit 0 when a layout fits, 2 (with a message naming
// the smallest need) when none does or the flags are bad.
int PlanAuto(const GlobalFlags& g, const std::string& spec_path, std::vector<std::string> sets,
             const PlanAutoFlags& flags);

// Prints `s` on stderr, as text ("shardtrain: <message>") or, with --output
// json, as one JSON object (client/errors.h), with advice for the common
// causes (an unreachable coordinator names its address), and returns its exit
// code.
int ReportError(const GlobalFlags& g, const absl::Status& s);
// Prints a warning on stderr: "shardtrain: warning: <message>", or one JSON
// object with --output json.
void Warn(const GlobalFlags& g, const std::string& message);
// The warning for a spec without checkpoint.dir, whose trained weights are
// dropped at the end; empty when the spec has a checkpoint.dir.
std::string CheckpointDirWarning(const JobSpec& spec);
// The warning for a spec whose checkpoint.dir, reached on this machine as
// `dir` (the spec's dir resolved against the workers' checkpoint root),
// lies on a volume with less free space than two of the job's checkpoints
// (MakePlan's checkpoint_bytes), or than its final weights when it does not
// checkpoint: a full disk said at the start rather than at the first
// checkpoint. Empty when there is room, without a checkpoint.dir, or when
// the free space cannot be asked.
std::string CheckpointSpaceWarning(const JobSpec& spec, const std::string& dir);
// The warning for a spec whose data.val is evaluated after the last step
// only (eval.every = steps, its default with data.val); empty otherwise.
std::string ValidationWarning(const JobSpec& spec);
// The warning for finetune.lora without model.init: adapters on a random
// model ("" otherwise).
std::string FinetuneWarning(const JobSpec& spec);
// Reads a spec file; the error names the path.
absl::Status ReadSpec(const std::string& path, std::string* text);
// For a spec whose model section names only model.init
// (ModelShapeFromInit): reads init's config.json (a relative init from the
// working directory, as `local` runs its workers) and appends to `sets` the
// model.* fields it gives that the spec does not set, saying on stderr
// where the model came from. Nothing for any other spec. INVALID_ARGUMENT
// naming the file when it cannot be read or describes no model shardtrain
// trains.
absl::Status AddModelFromInit(const GlobalFlags& g, const std::string& spec_text,
                              std::vector<std::string>* sets);

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_COMMANDS_H_
