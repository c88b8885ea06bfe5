#include "common/job_spec.h"

#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/job_spec_internal.h"
#include "common/job_spec_read.h"
#include "common/model/config.h"
#include "common/model/slice.h"
#include "common/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace shardtrain {
namespace {

using YAML::Node;
namespace si = spec_internal;  // enum spellings and number format, shared with job_spec_yaml.cc

using namespace spec_read;  // NOLINT: the reader's own other half (job_spec_read.h)

// ---------------------------------------------------------------------------
// Sections.

absl::Status ParseData(const Node& root, const ModelSpec& model, DataSpec* d) {
  SHARDTRAIN_RETURN_IF_ERROR(Require(root, "", "data"));
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "data"));
  SHARDTRAIN_RETURN_IF_ERROR(Require(n, "data", "train"));
  SHARDTRAIN_RETURN_IF_ERROR(ReadString(n, "data", "train", &d->train));
  if (d->train.empty()) return FieldError("data.train", "must not be empty");
  SHARDTRAIN_RETURN_IF_ERROR(ReadString(n, "data", "val", &d->val));
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, "data", "format", si::kDataFormats, &d->format));
  SHARDTRAIN_RETURN_IF_ERROR(ReadString(n, "data", "tokenizer_json", &d->tokenizer_json));
  d->tokenizer = !d->tokenizer_json.empty()       ? TokenizerKind::kJson
                 : d->format == DataFormat::kLlmc ? TokenizerKind::kGpt2
                                                  : TokenizerKind::kByte;
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, "data", "tokenizer", si::kTokenizers, &d->tokenizer));
  if (d->tokenizer != TokenizerKind::kByte && d->format != DataFormat::kLlmc) {
    return FieldError("data.tokenizer", std::string(EnumName(d->tokenizer)),
                      " requires data.format: llmc (text data uses the byte tokenizer)");
  }
  if (d->tokenizer == TokenizerKind::kJson && d->tokenizer_json.empty()) {
    return FieldError("data.tokenizer_json", "required with data.tokenizer: json");
  }
  if (d->tokenizer != TokenizerKind::kJson && !d->tokenizer_json.empty()) {
    return FieldError("data.tokenizer_json", "only with data.tokenizer: json (it is ",
                      std::string(EnumName(d->tokenizer)), ")");
  }
  // The vocabularies' sizes; a tokenizer.json's is checked against the
  // token files when they are read (every id < model.vocab).
  struct MinVocab {
    TokenizerKind kind;
    int vocab;
  };
  for (const MinVocab& m :
       {MinVocab{TokenizerKind::kByte, 256}, MinVocab{TokenizerKind::kGpt2, 50257},
        MinVocab{TokenizerKind::kLlama3, 128256}}) {
    if (d->tokenizer == m.kind && model.vocab < m.vocab) {
      return FieldError("model.vocab", model.vocab, " is too small for the ",
                        std::string(EnumName(d->tokenizer)), " tokenizer (needs >= ", m.vocab, ")");
    }
  }
  return absl::OkStatus();
}

absl::Status ParseParallel(const Node& root, const ModelSpec& model, ParallelSpec* p) {
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "parallel"));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "parallel", "dp", 1, &p->dp));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "parallel", "cp", 1, &p->cp));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "parallel", "tp", 1, &p->tp));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "parallel", "pp", 1, &p->pp));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "parallel", "ep", 1, &p->ep));
  if (Present(n, "stages")) {
    const Node stages = n["stages"];
    if (!stages.IsSequence()) {
      return FieldError("parallel.stages", "expected a list of layers per stage, got ",
                        Describe(stages));
    }
    for (size_t i = 0; i < stages.size(); ++i) {
      const std::string path = absl::StrCat("parallel.stages[", i, "]");
      SHARDTRAIN_ASSIGN_OR_RETURN(int64_t layers, ParseInt(stages[i], path));
      SHARDTRAIN_RETURN_IF_ERROR(CheckRange(path, layers, 1, INT_MAX));
      p->stages.push_back(static_cast<int>(layers));
    }
  }
  if (Present(n, "zero")) {
    SHARDTRAIN_ASSIGN_OR_RETURN(int64_t zero, ParseInt(n["zero"], "parallel.zero"));
    SHARDTRAIN_RETURN_IF_ERROR(CheckRange("parallel.zero", zero, 0, 3));
    p->zero = static_cast<int>(zero);
  }
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, "parallel", "offload", si::kOffloadModes, &p->offload));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadEnum(n, "parallel", "schedule", si::kPipelineSchedules, &p->schedule));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "parallel", "pp_virtual", 1, &p->pp_virtual));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadBool(n, "parallel", "reshard_after_forward", &p->reshard_after_forward));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "parallel", "bucket_mb", 1, &p->bucket_mb));
  SHARDTRAIN_RETURN_IF_ERROR(ReadBool(n, "parallel", "sequence_parallel", &p->sequence_parallel));
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, "parallel", "comm", si::kCommBackends, &p->comm));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadEnum(n, "parallel", "reduce_dtype", si::kReduceDtypes, &p->reduce_dtype));
  if (p->reduce_dtype == ReduceDtype::kBf16 && (p->comm != CommBackend::kNccl || p->zero != 0)) {
    return FieldError("parallel.reduce_dtype",
                      "bf16 reduces DDP's buckets over NCCL: it needs parallel.comm nccl and "
                      "parallel.zero 0 (comm is ",
                      std::string(EnumName(p->comm)), ", zero ", p->zero,
                      "; Gloo sums in fp32 whatever the type, so bf16 would only lose digits)");
  }
  if (p->sequence_parallel && p->tp < 2) {
    return FieldError("parallel.sequence_parallel", "needs parallel.tp > 1 (tp is ", p->tp, ")");
  }

  SHARDTRAIN_ASSIGN_OR_RETURN(ParallelDims dims, ParallelDims::Create(ParallelDims::Factors{
                                                     p->dp, p->cp, p->tp, p->pp, p->ep}));
  SHARDTRAIN_ASSIGN_OR_RETURN(model::ModelConfig config, model.Config());
  SHARDTRAIN_RETURN_IF_ERROR(dims.CheckModelFits(config));
  SHARDTRAIN_RETURN_IF_ERROR(dims.CheckZero(p->zero));
  if (p->pp_virtual > 1) {
    if (p->schedule != PipelineSchedule::k1F1B) {
      return FieldError("parallel.pp_virtual", "interleaves 1F1B: it needs parallel.schedule 1f1b");
    }
    if (p->zero > 1) {
      return FieldError("parallel.pp_virtual",
                        "needs parallel.zero <= 1: ZeRO-2 reduces each micro-batch's gradients "
                        "as its backward finishes them, and an interleaved stage runs a "
                        "micro-batch's backward in pp_virtual parts (zero is ",
                        p->zero, ")");
    }
    if (p->comm == CommBackend::kNccl) {
      return FieldError("parallel.pp_virtual",
                        "runs over Gloo so far (parallel.comm gloo or auto): its one-way "
                        "channels have not run over NCCL on several GPUs yet");
    }
  }
  return model::StageLayers(config, p->pp, p->stages, p->pp_virtual).status();
}

absl::Status ParseBatch(const Node& root, const ModelSpec& model, const ParallelSpec& par,
                        BatchSpec* b) {
  SHARDTRAIN_RETURN_IF_ERROR(Require(root, "", "batch"));
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "batch"));
  for (const char* key : {"global", "micro", "seq_len"}) {
    SHARDTRAIN_RETURN_IF_ERROR(Require(n, "batch", key));
  }
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "batch", "global", 1, &b->global));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "batch", "micro", 1, &b->micro));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "batch", "seq_len", 1, &b->seq_len));
  if (b->seq_len > model.context) {
    return FieldError("batch.seq_len", b->seq_len, " exceeds model.context: ", model.context);
  }
  SHARDTRAIN_ASSIGN_OR_RETURN(ParallelDims dims, ParallelDims::Create(ParallelDims::Factors{
                                                     par.dp, par.cp, par.tp, par.pp}));
  SHARDTRAIN_RETURN_IF_ERROR(dims.CheckSequence(b->seq_len));
  // A rank's rows: batch.micro × its share of the sequence.
  const int64_t rows = int64_t{b->micro} * (b->seq_len / par.cp);
  if (par.sequence_parallel && rows % par.tp != 0) {
    return FieldError(
        "parallel.sequence_parallel", "parallel.tp ", par.tp, " must divide batch.micro × ",
        par.cp > 1
            ? absl::StrCat("batch.seq_len / parallel.cp = ", b->micro, " × ", b->seq_len / par.cp)
            : absl::StrCat("batch.seq_len = ", b->micro, " × ", b->seq_len),
        " (each tp rank holds an equal part of the micro-batch's rows)");
  }
  SHARDTRAIN_ASSIGN_OR_RETURN(BatchSplit split, SplitBatch(b->global, b->micro, par.dp));
  if (par.pp_virtual > 1 && split.accum % par.pp != 0) {
    return FieldError("parallel.pp_virtual", "the interleaved schedule runs micro-batches in ",
                      "groups of parallel.pp: batch.global / (batch.micro × parallel.dp) = ",
                      split.accum, " must be a multiple of pp ", par.pp);
  }
  return absl::OkStatus();
}

absl::Status ParseOptimizer(const Node& root, OptimizerSpec* o) {
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "optimizer"));
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, "optimizer", "name", si::kOptimizers, &o->name));
  SHARDTRAIN_RETURN_IF_ERROR(ReadDouble(n, "optimizer", "lr", 0.0, /*exclusive=*/true, &o->lr));
  o->min_lr = 0.1 * o->lr;
  SHARDTRAIN_RETURN_IF_ERROR(ReadDouble(n, "optimizer", "min_lr", 0.0, false, &o->min_lr));
  if (o->min_lr > o->lr) {
    return FieldError("optimizer.min_lr", si::FormatDouble(o->min_lr),
                      " exceeds optimizer.lr: ", si::FormatDouble(o->lr));
  }
  if (Present(n, "betas")) {
    const Node betas = n["betas"];
    if (!betas.IsSequence() || betas.size() != 2) {
      return FieldError(
          "optimizer.betas", "expected a list of two numbers [beta1, beta2], got ",
          betas.IsSequence() ? absl::StrCat("a list of ", betas.size()) : Describe(betas));
    }
    std::vector<double> values;
    for (size_t i = 0; i < 2; ++i) {
      std::string path = absl::StrCat("optimizer.betas[", i, "]");
      SHARDTRAIN_ASSIGN_OR_RETURN(double v, ParseDouble(betas[i], path));
      if (!(v >= 0.0 && v < 1.0)) {
        return FieldError(path, "must be in [0, 1), got ", si::FormatDouble(v));
      }
      values.push_back(v);
    }
    o->betas = values;
  }
  SHARDTRAIN_RETURN_IF_ERROR(ReadDouble(n, "optimizer", "eps", 0.0, true, &o->eps));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadDouble(n, "optimizer", "weight_decay", 0.0, false, &o->weight_decay));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "optimizer", "warmup_steps", 0, &o->warmup_steps));
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, "optimizer", "schedule", si::kLrSchedules, &o->schedule));
  SHARDTRAIN_RETURN_IF_ERROR(ReadDouble(n, "optimizer", "grad_clip", 0.0, false, &o->grad_clip));
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, "optimizer", "state", si::kOptimizerStates, &o->state));
  return absl::OkStatus();
}

absl::Status ParseCheckpoint(const Node& root, CheckpointSpec* c) {
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "checkpoint"));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "checkpoint", "every", 0, &c->every));
  SHARDTRAIN_RETURN_IF_ERROR(ReadString(n, "checkpoint", "dir", &c->dir));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "checkpoint", "keep", 1, &c->keep));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadEnum(n, "checkpoint", "on_failure", si::kCheckpointFailurePolicies, &c->on_failure));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadInt(n, "checkpoint", "max_consecutive_failures", 0, &c->max_consecutive_failures));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "checkpoint", "final_retry_s", 0, &c->final_retry_s));
  if (c->every > 0 && c->dir.empty()) {
    return FieldError("checkpoint.dir", "required when checkpoint.every > 0 (every: ", c->every,
                      ")");
  }
  return absl::OkStatus();
}

absl::Status ParseEval(const Node& root, const DataSpec& data, int steps, EvalSpec* e) {
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "eval"));
  // data.val without eval.every: evaluated after the last step only.
  if (!data.val.empty() && !Present(n, "every")) e->every = steps;
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "eval", "every", 0, &e->every));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "eval", "batches", 1, &e->batches));
  if (e->every > 0 && data.val.empty()) {
    return FieldError("data.val", "required when eval.every > 0 (every: ", e->every, ")");
  }
  return absl::OkStatus();
}

// model.attention auto: flash where CheckAttention would let it run (the
// CUDA engine, bf16 or fp16, heads of 64 or 128 channels, no context
// parallelism: 1.2x the materialized kernels' step on GPT-2 124M, and no
// (T,T) activations), materialized elsewhere.
AttentionKind AutoAttention(const JobSpec& spec) {
  const ModelSpec& m = spec.model;
  const bool flash = spec.resources.device == DeviceKind::kCuda &&
                     model::FlashAttentionApplies(spec.Compute(), m.HeadDim()) &&
                     spec.parallel.cp == 1;
  return flash ? AttentionKind::kFlash : AttentionKind::kMaterialized;
}

// model.attention: flash runs where its kernels serve the job.
absl::Status CheckAttention(const JobSpec& spec) {
  const ModelSpec& m = spec.model;
  if (m.attention != AttentionKind::kFlash) return absl::OkStatus();
  if (spec.resources.device != DeviceKind::kCuda) {
    return FieldError("model.attention",
                      "flash runs on the CUDA engine (resources.device: cuda; "
                      "this job's is ",
                      std::string(EnumName(spec.resources.device)), ")");
  }
  if (!model::FlashAttentionApplies(spec.Compute(), m.HeadDim())) {
    return FieldError("model.attention",
                      "flash needs precision bf16 or fp16 and heads of 64 or "
                      "128 channels (this job: ",
                      std::string(EnumName(spec.precision)), ", head size ", m.HeadDim(), ")");
  }
  if (spec.parallel.cp > 1) {
    return FieldError("model.attention",
                      "flash with parallel.cp > 1 (the ring's attention has "
                      "kernels of its own)");
  }
  return absl::OkStatus();
}

absl::Status ParseResources(const Node& root, const ParallelSpec& par, ResourcesSpec* r) {
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "resources"));
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, "resources", "device", si::kDevices, &r->device));
  if (par.comm == CommBackend::kNccl && r->device != DeviceKind::kCuda) {
    return FieldError("parallel.comm", "nccl needs resources.device: cuda (NCCL moves GPU memory; ",
                      "CPU ranks use gloo)");
  }
  const int world = par.dp * par.cp * par.tp * par.pp;
  r->min_workers = world;
  r->max_workers = world;
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "resources", "min_workers", 1, &r->min_workers));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "resources", "max_workers", 1, &r->max_workers));
  std::string world_text =
      par.cp == 1 ? absl::StrCat("world ", world, " (parallel.dp × tp × pp = ", par.dp, " × ",
                                 par.tp, " × ", par.pp, ")")
                  : absl::StrCat("world ", world, " (parallel.dp × cp × tp × pp = ", par.dp, " × ",
                                 par.cp, " × ", par.tp, " × ", par.pp, ")");
  if (r->min_workers > world) {
    return FieldError("resources.min_workers", r->min_workers, " exceeds ", world_text);
  }
  if (r->max_workers < world) {
    return FieldError("resources.max_workers", r->max_workers, " is less than ", world_text);
  }
  return absl::OkStatus();
}

absl::Status ParseAll(const Node& root, JobSpec* spec) {
  SHARDTRAIN_RETURN_IF_ERROR(CheckMap(root, "", kTopKeys));

  SHARDTRAIN_RETURN_IF_ERROR(Require(root, "", "name"));
  SHARDTRAIN_RETURN_IF_ERROR(ReadString(root, "", "name", &spec->name));
  bool name_ok = !spec->name.empty() && spec->name.size() <= 64;
  for (char c : spec->name) {
    name_ok = name_ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
                          c == '_' || c == '-');
  }
  if (!name_ok) {
    return FieldError("name", "must be 1 to 64 characters of [a-z0-9._-], got \"",
                      absl::CEscape(spec->name), "\"");
  }

  SHARDTRAIN_RETURN_IF_ERROR(ParseModel(root, &spec->model));
  SHARDTRAIN_RETURN_IF_ERROR(ParseData(root, spec->model, &spec->data));
  SHARDTRAIN_RETURN_IF_ERROR(ParseParallel(root, spec->model, &spec->parallel));
  SHARDTRAIN_RETURN_IF_ERROR(ParseBatch(root, spec->model, spec->parallel, &spec->batch));
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(root, "", "precision", si::kPrecisions, &spec->precision));
  SHARDTRAIN_RETURN_IF_ERROR(ParseOptimizer(root, &spec->optimizer));
  SHARDTRAIN_RETURN_IF_ERROR(Require(root, "", "steps"));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(root, "", "steps", 1, &spec->steps));
  SHARDTRAIN_RETURN_IF_ERROR(ParseCheckpoint(root, &spec->checkpoint));
  SHARDTRAIN_RETURN_IF_ERROR(ParseEval(root, spec->data, spec->steps, &spec->eval));
  if (Present(root, "seed")) {
    SHARDTRAIN_ASSIGN_OR_RETURN(int64_t seed, ParseInt(root["seed"], "seed"));
    if (seed < 0) return FieldError("seed", "must be >= 0, got ", seed);
    spec->seed = static_cast<uint64_t>(seed);
  }
  SHARDTRAIN_RETURN_IF_ERROR(ParseResources(root, spec->parallel, &spec->resources));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(root, "", "max_restarts", 0, &spec->max_restarts));
  SHARDTRAIN_ASSIGN_OR_RETURN(Node timeouts, Section(root, "timeouts"));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadInt(timeouts, "timeouts", "collective_s", 1, &spec->timeouts.collective_s));
  SHARDTRAIN_RETURN_IF_ERROR(ParseRouter(root, &spec->router));
  if (spec->router.bias_update_rate > 0 &&
      (!spec->model.moe.router_bias || spec->parallel.zero > 2)) {
    return FieldError("router.bias_update_rate",
                      "aux-loss-free balancing updates model.moe.router_bias's bias between "
                      "steps: it needs model.moe.router_bias true (it is ",
                      spec->model.moe.router_bias ? "true" : "false",
                      ") and parallel.zero <= 2 (it is ", spec->parallel.zero, ")");
  }
  SHARDTRAIN_RETURN_IF_ERROR(ParseFinetune(root, &spec->finetune));
  SHARDTRAIN_RETURN_IF_ERROR(CheckFinetune(*spec));
  SHARDTRAIN_ASSIGN_OR_RETURN(Node model, Section(root, "model"));
  if (AttentionIsAuto(model)) spec->model.attention = AutoAttention(*spec);
  return CheckAttention(*spec);
}

}  // namespace

absl::StatusOr<model::ModelConfig> ModelSpec::Config() const {
  if (arch == model::Arch::kGpt2) {
    absl::StatusOr<model::ModelConfig> c = model::MakeGptConfig(layers, heads, dim, context, vocab);
    if (!c.ok() || !moe.on()) return c;
    c->moe = moe;
    if (absl::Status s = model::ValidateModelConfig(*c); !s.ok()) return s;
    return c;
  }
  model::LlamaShape shape;
  shape.layers = layers;
  shape.heads = heads;
  shape.kv_heads = kv_heads;
  shape.dim = dim;
  shape.ffn_dim = ffn_dim;
  shape.context = context;
  shape.vocab = vocab;
  shape.rope_theta = rope_theta;
  shape.norm_eps = norm_eps;
  shape.tie_embeddings = tie_embeddings;
  shape.rope_scaling = rope_scaling;
  shape.head_dim = head_dim;
  shape.qk_norm = qk_norm;
  shape.moe = moe;
  return model::MakeLlamaConfig(shape);
}

absl::StatusOr<ParallelDims> JobSpec::Dims() const {
  return ParallelDims::Create(
      ParallelDims::Factors{parallel.dp, parallel.cp, parallel.tp, parallel.pp, parallel.ep});
}

absl::StatusOr<BatchSplit> JobSpec::Split() const {
  return SplitBatch(batch.global, batch.micro, parallel.dp);
}

namespace {

// The document with `overrides` applied: ParseJobSpec's first half.
absl::StatusOr<Node> LoadSpecDocument(std::string_view yaml_text,
                                      const std::vector<std::string>& overrides) {
  Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) {
      return absl::InvalidArgumentError(absl::StrCat("spec: invalid YAML: ", e.msg));
    }
    return absl::InvalidArgumentError(absl::StrCat("spec: invalid YAML at line ", e.mark.line + 1,
                                                   ", column ", e.mark.column + 1, ": ", e.msg));
  }
  if (!root.IsDefined() || root.IsNull()) {
    return absl::InvalidArgumentError("spec: empty document (expected a map of fields)");
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec: expected a map of fields at the top level, got ", Describe(root)));
  }
  try {
    for (const std::string& o : overrides) SHARDTRAIN_RETURN_IF_ERROR(ApplyOverride(root, o));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("spec: ", e.what()));
  }
  return root;
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(std::string_view yaml_text,
                                     const std::vector<std::string>& overrides) {
  SHARDTRAIN_ASSIGN_OR_RETURN(Node root, LoadSpecDocument(yaml_text, overrides));
  try {
    JobSpec spec;
    SHARDTRAIN_RETURN_IF_ERROR(ParseAll(root, &spec));
    return spec;
  } catch (const YAML::Exception& e) {
    // Not expected: every access above checks types first.
    return absl::InvalidArgumentError(absl::StrCat("spec: ", e.what()));
  }
}

absl::StatusOr<ModelFromInit> ModelShapeFromInit(std::string_view yaml_text,
                                                 const std::vector<std::string>& overrides) {
  SHARDTRAIN_ASSIGN_OR_RETURN(Node root, LoadSpecDocument(yaml_text, overrides));
  ModelFromInit out;
  try {
    const Node model = root["model"];
    if (!model.IsDefined() || !model.IsMap() || !Present(model, "init")) {
      return out;  // nothing to read (or ParseJobSpec refuses it)
    }
    SHARDTRAIN_RETURN_IF_ERROR(ReadString(model, "model", "init", &out.init));
    if (out.init.empty()) return out;
    out.shape_from_init = !Present(model, "preset") && !Present(model, "layers");
    for (const auto& kv : model) out.keys_set.push_back(kv.first.as<std::string>());
    const Node router = root["router"];
    out.aux_loss_coef_set =
        router.IsDefined() && router.IsMap() && Present(router, "aux_loss_coef");
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("spec: ", e.what()));
  }
  return out;
}

DataType JobSpec::Compute() const {
  switch (precision) {
    case Precision::kBf16:
      return DataType::kBFloat16;
    case Precision::kFp16:
      return DataType::kFloat16;
    case Precision::kFp32:
      break;
  }
  return DataType::kFloat32;
}

model::ActivationPolicy JobSpec::Activations() const {
  model::ActivationPolicy p{model.recompute, model.recompute_layers, parallel.sequence_parallel,
                            parallel.cp};
  // ParseJobSpec has checked that flash serves the job (CheckAttention).
  p.flash_attention = model.attention == AttentionKind::kFlash;
  return p;
}

}  // namespace shardtrain
