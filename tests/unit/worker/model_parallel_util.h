// Shared by the model-parallel tests (model_parallel_test.cc,
// llama_parallel_test.cc, activation_memory_test.cc): a small GPT-2 or Llama
// job on a text corpus, trained on
// thread ranks through real parts (CPU engine slices, DDP / ZeRO, the
// pipeline executor, Gloo over 127.0.0.1), its losses per step.
#ifndef SHARDTRAIN_TESTS_UNIT_WORKER_MODEL_PARALLEL_UTIL_H_
#define SHARDTRAIN_TESTS_UNIT_WORKER_MODEL_PARALLEL_UTIL_H_

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/parallel_dims.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/comm/test_util.h"
#include "worker/checkpoint/directory.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/storage.h"
#include "worker/trainer.h"

namespace shardtrain::worker {
namespace mp_test {
namespace fs = std::filesystem;

constexpr int kSteps = 20;

struct Layout {
  int dp = 1, tp = 1, pp = 1, zero = 0;
  const char* schedule = "1f1b";
  int micro = 4;                   // global 16: micro-batches per replica m = 16 / (micro · dp)
  const char* recompute = "none";  // model.recompute
  int recompute_layers = -1;       // model.recompute_layers (-1: all)
  bool sp = false;                 // parallel.sequence_parallel
  bool llama = false;              // model.arch: llama (GQA, rotary, SwiGLU, untied head)
  int cp = 1;                      // parallel.cp
  int pp_virtual = 1;              // parallel.pp_virtual (model chunks per stage)
  bool qwen3 = false;              // llama with Qwen3's head_dim (16: q is 64 wide) and q/k norms
  // llama with Mixture-of-Experts layers: 1 Mixtral's (4 SwiGLU experts of
  // 24, top 2, softmax), 2 DeepSeek's (a dense first layer, 6 experts of 16,
  // top 2 by sigmoid, unnormalised gates, a shared expert); both with the
  // Switch loss and a z-loss; 3 DeepSeek-V3's aux-loss-free balancing (4
  // experts of 24, top 2 by sigmoid, a choice bias moved by 0.01 a step, no
  // balancing loss); 4 the same without the bias updates.
  int moe = 0;
  int ep = 1;  // parallel.ep (experts split over ep ranks of dp × cp)
};

// `l` with its MoE layers' experts split over `ep` ranks.
inline Layout Ep(Layout l, int ep) {
  l.ep = ep;
  return l;
}

// `l` interleaved: `v` model chunks per pipeline stage.
inline Layout Interleaved(Layout l, int v) {
  l.pp_virtual = v;
  return l;
}

// `l` with context parallelism over `cp` ranks.
inline Layout Cp(Layout l, int cp) {
  l.cp = cp;
  return l;
}

// `l` for the Llama model (Corpus::Spec).
inline Layout Llama(Layout l) {
  l.llama = true;
  return l;
}

// `l` for the Llama model with MoE layers of `variant` (Layout::moe).
inline Layout Moe(Layout l, int variant = 1) {
  l.llama = true;
  l.moe = variant;
  return l;
}

// `l` for the Llama model with Qwen3's two recipe fields.
inline Layout Qwen3(Layout l) {
  l.llama = true;
  l.qwen3 = true;
  return l;
}

inline std::string Name(const Layout& l) {
  std::string s =
      absl::StrCat("dp", l.dp, l.cp > 1 ? absl::StrCat("_cp", l.cp) : "", "_tp", l.tp, "_pp", l.pp);
  if (l.pp > 1) absl::StrAppend(&s, "_", l.schedule, "_m", 16 / (l.micro * l.dp));
  if (l.pp_virtual > 1) absl::StrAppend(&s, "_v", l.pp_virtual);
  if (l.zero > 0) absl::StrAppend(&s, "_zero", l.zero);
  if (std::string(l.recompute) != "none") absl::StrAppend(&s, "_", l.recompute);
  if (l.recompute_layers > 0) absl::StrAppend(&s, l.recompute_layers);
  if (l.sp) absl::StrAppend(&s, "_sp");
  if (l.ep > 1) absl::StrAppend(&s, "_ep", l.ep);
  if (l.llama) {
    s = (l.qwen3 ? "qwen3_" : l.moe > 0 ? absl::StrCat("moe", l.moe, "_") : "llama_") + s;
  }
  return s;
}

// gtest prints a parameter with this (the test names and failures show the
// layout, not its bytes).
inline void PrintTo(const Layout& l, std::ostream* os) { *os << Name(l); }

class Corpus {
 public:
  Corpus() {
    dir_ = fs::temp_directory_path() / ("shardtrain_mp_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream train(dir_ / "train.txt"), val(dir_ / "val.txt");
    for (int i = 0; i < 400; ++i) train << "Fortune " << i * 13 % 97 << ": the quick fox.\n";
    for (int i = 0; i < 60; ++i) val << "A lazy dog " << i * 7 << " sleeps here.\n";
  }
  ~Corpus() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  JobSpec Spec(const Layout& l, const std::string& ckpt = "") const {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(absl::StrCat(
        "name: mp\n",
        // Llama: 2 kv heads (tp 2 splits them), SwiGLU 48, rotary, untied head.
        l.llama ? "model: {arch: llama, kv_heads: 2, ffn_dim: 48, rope_theta: 10000, " : "model: {",
        l.qwen3 ? "head_dim: 16, qk_norm: true, " : "",
        l.moe == 1 ? "moe: {experts: 4, top_k: 2, expert_ffn_dim: 24}, " : "",
        l.moe == 2 ? "moe: {experts: 6, top_k: 2, expert_ffn_dim: 16, shared_experts: 1, "
                     "scoring: sigmoid, norm_topk_prob: false, first_dense_layers: 1}, "
                   : "",
        l.moe >= 3 ? "moe: {experts: 4, top_k: 2, expert_ffn_dim: 24, scoring: sigmoid, "
                     "router_bias: true}, "
                   : "",
        "layers: 4, heads: 4, dim: 32, context: 32, vocab: 256, recompute: ", l.recompute,
        l.recompute_layers > 0 ? absl::StrCat(", recompute_layers: ", l.recompute_layers) : "",
        "}\n", "data: {train: ", (dir_ / "train.txt").string(),
        ", val: ", (dir_ / "val.txt").string(), "}\n", "batch: {global: 16, micro: ", l.micro,
        ", seq_len: 32}\n", "parallel: {dp: ", l.dp, ", cp: ", l.cp, ", tp: ", l.tp, ", pp: ", l.pp,
        ", zero: ", l.zero, ", ep: ", l.ep, ", schedule: ", l.schedule,
        ", pp_virtual: ", l.pp_virtual, l.sp ? ", sequence_parallel: true" : "", "}\n",
        "optimizer: {lr: 0.003, warmup_steps: 2, weight_decay: 0.1, grad_clip: 1.0}\n",
        "eval: {every: 10, batches: 1}\n", "steps: ", kSteps, "\n",
        l.moe == 1 || l.moe == 2 ? "router: {aux_loss_coef: 0.01, z_loss_coef: 0.001}\n" : "",
        l.moe == 3 ? "router: {aux_loss_coef: 0, bias_update_rate: 0.01}\n" : "",
        l.moe == 4 ? "router: {aux_loss_coef: 0}\n" : "",
        ckpt.empty() ? "" : absl::StrCat("checkpoint: {every: 10, dir: ", ckpt, "}\n")));
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }
  fs::path dir() const { return dir_; }

 private:
  fs::path dir_;
};

// Per step: the replica-mean loss (the speakers' losses averaged, as the
// coordinator aggregates), and the validation loss where evaluated.
struct Losses {
  std::vector<double> loss, val;
  std::vector<double> grad_norm;  // each step's global norm before clipping (rank 0's)
  std::vector<float> whole;       // the whole model after the last step (Trainer::WholeModel)
};

// Trains `spec` on its world of thread ranks over steps [first, kSteps];
// restores from `resume` first when given; saves checkpoints to `save`
// (manifest written as rank 0's commit would) when given.
inline Losses Train(const JobSpec& spec, int first = 1, const std::string& resume = "",
                    bool save = false) {
  const ParallelDims dims = *spec.Dims();
  Losses run;
  run.loss.assign(kSteps + 1, 0.0);
  run.val.assign(kSteps + 1, NAN);
  run.grad_norm.assign(kSteps + 1, 0.0);
  std::mutex mu;
  std::map<int64_t, std::vector<checkpoint::ShardFileInfo>> shards;
  checkpoint::FileCheckpointStorage storage;
  comm::testing::RunRanks(dims.world(), [&](comm::Communicator& comm) {
    auto trainer = Trainer::Create(spec, comm.rank(), /*threads=*/1, &comm);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    if (!resume.empty()) {
      absl::StatusOr<int64_t> done = (*trainer)->Restore(storage, resume);
      ASSERT_TRUE(done.ok()) << done.status();
      ASSERT_EQ(*done, first - 1);
    }
    for (int step = first; step <= kSteps; ++step) {
      absl::StatusOr<StepResult> r = (*trainer)->Step(step);
      ASSERT_TRUE(r.ok()) << "rank " << comm.rank() << " step " << step << ": " << r.status();
      std::lock_guard<std::mutex> lock(mu);
      if (dims.SpeaksForReplica(comm.rank())) run.loss[step] += r->loss / dims.dp();
      if (r->val_loss && comm.rank() == 0) run.val[step] = *r->val_loss;
      if (comm.rank() == 0) run.grad_norm[step] = r->grad_norm;
      if (save && step % spec.checkpoint.every == 0 && step < kSteps) {
        std::string path;
        auto info = (*trainer)->SaveShard(storage, step, &path);
        ASSERT_TRUE(info.ok()) << info.status();
        shards[step].push_back(*info);
      }
    }
    // Every rank takes part; rank 0 holds the whole model.
    absl::StatusOr<absl::Span<const float>> whole = (*trainer)->WholeModel();
    ASSERT_TRUE(whole.ok()) << whole.status();
    if (comm.rank() == 0) run.whole.assign(whole->begin(), whole->end());
  });
  for (auto& [step, infos] : shards) {
    std::sort(infos.begin(), infos.end(),
              [](const auto& a, const auto& b) { return a.rank < b.rank; });
    auto config = spec.TrainedConfig();
    auto manifest = checkpoint::MakeManifest(model::ParamLayout(*config), step, dims.world(),
                                             spec.parallel.zero, infos);
    EXPECT_TRUE(manifest.ok()) << manifest.status();
    const std::string dir = checkpoint::StepDir(spec.checkpoint.dir, step);
    EXPECT_TRUE(checkpoint::WriteManifest(storage, checkpoint::ManifestPath(dir), *manifest).ok());
  }
  return run;
}

inline const Corpus& TheCorpus() {
  static const Corpus* corpus = new Corpus();
  return *corpus;
}
// One rank's run of the family of `l`.
// An MoE model's (Layout::moe) with micro-batches of `micro` sequences: the
// balancing losses are per micro-batch (not linear in its sequences), so a
// layout equals one rank that groups the global batch alike.
inline const Losses& Reference(bool llama = false, bool qwen3 = false, int moe = 0, int micro = 4) {
  if (moe > 0) {
    static std::map<std::pair<int, int>, Losses>* runs = new std::map<std::pair<int, int>, Losses>;
    auto [it, fresh] = runs->try_emplace({moe, micro});
    if (fresh) it->second = Train(TheCorpus().Spec(Moe(Layout{1, 1, 1, 0, "1f1b", micro}, moe)));
    return it->second;
  }
  if (qwen3) {
    static const Losses* q = new Losses(Train(TheCorpus().Spec(Qwen3(Layout{}))));
    return *q;
  }
  static const Losses* gpt2 = new Losses(Train(TheCorpus().Spec(Layout{})));
  if (!llama) return *gpt2;
  static const Losses* run = new Losses(Train(TheCorpus().Spec(Llama(Layout{}))));
  return *run;
}

inline double Worst(const std::vector<double>& got, const std::vector<double>& want,
                    int first = 1) {
  double worst = 0;
  for (int s = first; s <= kSteps; ++s) {
    if (std::isnan(want[s]) && std::isnan(got[s])) continue;
    worst = std::max(worst, std::abs(got[s] - want[s]) / std::abs(want[s]));
  }
  return worst;
}

// Prints `got` beside `want` (the run of `l` against its reference, called
// `reference` in the line) and requires every step's loss and validation
// loss within `tolerance` relative, and a reference that learns.
inline void ExpectSameLosses(const Layout& l, const Losses& got, const Losses& want,
                             const char* reference, double tolerance) {
  const double loss = Worst(got.loss, want.loss), val = Worst(got.val, want.val);
  std::printf(
      "%-36s loss step 1 %.6f step 20 %.6f (%s %.6f %.6f); max rel diff: loss %.3g, "
      "val %.3g\n",
      Name(l).c_str(), got.loss[1], got.loss[kSteps], reference, want.loss[1], want.loss[kSteps],
      loss, val);
  EXPECT_LE(loss, tolerance);
  EXPECT_LE(val, tolerance);
  EXPECT_TRUE(std::isfinite(got.val[10]) && std::isfinite(got.val[kSteps]));
  EXPECT_LT(want.loss[kSteps], want.loss[1] - 0.5) << "the reference does not learn";
}

// ExpectSameLosses against one rank, and every step's gradient norm within
// `tolerance` too.
// The largest |difference| of the whole models after the last step, and
// the largest |weight| of `want`'s.
struct WholeDiff {
  double max_abs = 0, scale = 0;
};
inline WholeDiff WholeModelDiff(const Losses& got, const Losses& want) {
  EXPECT_EQ(got.whole.size(), want.whole.size());
  WholeDiff d;
  for (size_t i = 0; i < std::min(got.whole.size(), want.whole.size()); ++i) {
    d.max_abs = std::max(d.max_abs, std::abs(double(got.whole[i]) - want.whole[i]));
    d.scale = std::max(d.scale, std::abs(double(want.whole[i])));
  }
  return d;
}

inline void ExpectSameLossesAndNorms(const Layout& l, const Losses& got, const Losses& want,
                                     double tolerance) {
  ExpectSameLosses(l, got, want, "1 rank", tolerance);
  const double norm = Worst(got.grad_norm, want.grad_norm);
  std::printf("%-36s grad norm max rel diff %.3g\n", Name(l).c_str(), norm);
  EXPECT_LE(norm, tolerance);
  // The whole model gathered from the layout's slices (every expert group,
  // tp part and stage in its place) is the one rank's.
  const WholeDiff d = WholeModelDiff(got, want);
  std::printf("%-36s whole model after step %d: max abs diff %.3g (largest weight %.3g)\n",
              Name(l).c_str(), kSteps, d.max_abs, d.scale);
  EXPECT_LE(d.max_abs, 10 * tolerance * d.scale);
}

}  // namespace mp_test
}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_TESTS_UNIT_WORKER_MODEL_PARALLEL_UTIL_H_
