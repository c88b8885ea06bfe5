#ifndef SHARDTRAIN_COMMON_JOB_SPEC_H_
#define SHARDTRAIN_COMMON_JOB_SPEC_H_

// A job spec: the YAML a user submits, validated once into one struct.
//
// ParseJobSpec is pure (no file or network I/O): the caller reads the file and
// passes its text. Every error is INVALID_ARGUMENT and its message starts with
// the full dotted path of the offending field, e.g.
//   "parallel.tp: 3 does not divide model.heads: 4"
//   "steps: expected an integer, got \"ten\""
//   "model.layer: unknown key (did you mean layers?)"
// Errors about the document as a whole start with "spec:" (malformed YAML,
// with its line and column; empty document; top level not a map).
//
// Every field below holds its resolved value: defaults are filled in, a model
// preset is expanded, optimizer.min_lr defaults to 0.1·lr, resources.*_workers
// default to World(). JobSpecToYaml writes all of them out explicitly.
//
// Thread-compatible: plain values and pure functions.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/activations.h"
#include "common/model/weight_quant.h"
#include "common/parallel_dims.h"

namespace shardtrain {

enum class DataFormat { kText, kLlmc };                     // "text" | "llmc"
enum class TokenizerKind { kByte, kGpt2, kLlama3, kJson };  // "byte" | "gpt2" | "llama3" | "json"
enum class OffloadMode { kNone, kOptimizer };               // "none" | "optimizer"
enum class CommBackend { kAuto, kGloo, kNccl };             // "auto" | "gloo" | "nccl"
enum class ReduceDtype { kFp32, kBf16 };                    // "fp32" | "bf16"
enum class PipelineSchedule { kGpipe, k1F1B };              // "gpipe" | "1f1b"
enum class Precision { kFp32, kBf16, kFp16 };               // "fp32" | "bf16" | "fp16"
enum class OptimizerKind { kAdamW };                        // "adamw"
enum class LrSchedule { kCosine, kConstant, kLinear };      // "cosine" | "constant" | "linear"
enum class OptimizerState { kFp32, kInt8 };                 // "fp32" | "int8"
enum class DeviceKind { kCpu, kCuda };                      // "cpu" | "cuda"
enum class AttentionKind { kMaterialized, kFlash };         // "materialized" | "flash"
enum class CheckpointFailurePolicy { kWarn, kFail };        // "warn" | "fail"
enum class BaseDtype { kBf16, kInt8, kNf4 };                // "bf16" | "int8" | "nf4"
using model::Recompute;                                     // "none" | "selective" | "full"

// The spelling used in YAML for each enum value (static storage).
std::string_view EnumName(DataFormat v);
std::string_view EnumName(TokenizerKind v);
std::string_view EnumName(OffloadMode v);
std::string_view EnumName(CommBackend v);
std::string_view EnumName(ReduceDtype v);
std::string_view EnumName(PipelineSchedule v);
std::string_view EnumName(Precision v);
std::string_view EnumName(OptimizerKind v);
std::string_view EnumName(LrSchedule v);
std::string_view EnumName(OptimizerState v);
std::string_view EnumName(DeviceKind v);
std::string_view EnumName(CheckpointFailurePolicy v);
std::string_view EnumName(BaseDtype v);
std::string_view EnumName(Recompute v);
std::string_view EnumName(model::Arch v);
std::string_view EnumName(AttentionKind v);

// The model: its family and shape. Shape letters used across the code
// base: L = layers, NH = heads, C = dim, T = context (max sequence length),
// V = vocab; KVH = kv_heads, F = ffn_dim (common/model/config.h).
struct ModelSpec {
  std::string preset;  // "" or a known preset (model::ModelPresetNames(): "gpt2-124m", ...,
                       // "llama-tiny", "llama3-1b", "llama3-8b"); explicit fields override it
  int layers = 0;      // L > 0
  int heads = 0;       // NH > 0, divides dim
  int dim = 0;         // C > 0
  int context = 0;     // T > 0, >= batch.seq_len
  int vocab = 0;       // V > 0; >= 256 byte, >= 50257 gpt2, >= 128256 llama3 (data.tokenizer)
  // "" (random initialisation from seed) or the weights the job starts from:
  // a safetensors file in Hugging Face's GPT-2 layout (or a folder holding
  // model.safetensors, as `shardtrain export` writes) or a shardtrain
  // weights file, of this model's shape. Resolved like data.train.
  std::string init;
  // "" or LoRA adapters to start from (finetune.lora): a folder holding
  // Hugging Face PEFT's adapter_config.json and adapter_model.safetensors,
  // whose r, lora_alpha and target_modules must be finetune.lora's.
  // Resolved like model.init.
  std::string adapter;
  // Activation recomputation (common/model/activations.h): none keeps every
  // block's activations for backward; selective recomputes the attention's
  // T² probabilities; full keeps only each block's input and recomputes the
  // block. recompute_layers: the first K blocks of each pipeline stage
  // recompute (>= 1; -1, the default: all of them); needs selective or full.
  Recompute recompute = Recompute::kNone;
  int recompute_layers = -1;
  // The attention kernels: materialized (the (T,T) probabilities, saved for
  // backward) or flash (tiles with an online softmax: the rows' logsumexp
  // saved instead; resources.device cuda, bf16 or fp16, heads of 64 or 128
  // channels, parallel.cp 1). The YAML's `auto` (its default) is resolved
  // by ParseJobSpec: flash where flash is accepted, else materialized; this
  // initial value serves specs built in code.
  AttentionKind attention = AttentionKind::kMaterialized;
  model::Arch arch = model::Arch::kGpt2;  // gpt2 | llama (a preset sets it)
  // Llama only (kept at these values for gpt2, whose are fixed: kv_heads =
  // heads, ffn_dim = 4·dim, LayerNorm eps 1e-5, tied; setting them with arch
  // gpt2 is an error):
  int kv_heads = 0;             // KVH, divides heads; default heads (multi-head attention)
  int ffn_dim = 0;              // SwiGLU's width; default 8·dim/3 rounded up to a multiple of 256
  double rope_theta = 500000;   // rotary positions' base, > 0
  double norm_eps = 1e-5;       // RMSNorm's epsilon, > 0
  bool tie_embeddings = false;  // the LM head reads wte
  // Llama 3's long-context frequency adjustment (model::RopeScaling; the
  // YAML's rope_scaling: {type: llama3, factor, low_freq_factor,
  // high_freq_factor, original_max_position_embeddings}, or none). Off by
  // default; the presets llama3-1b and llama3-8b set their checkpoints'.
  model::RopeScaling rope_scaling;

  // Llama only: the head size when it is not dim / heads (Qwen3: 128 with
  // dim 1024, 16 heads); 0: dim / heads. And Qwen3's RMSNorm over each head
  // of q and k.
  int head_dim = 0;
  bool qk_norm = false;
  // A Mixture of Experts (model::MoeConfig; the YAML's model.moe: {experts,
  // top_k, expert_ffn_dim, shared_experts, scoring, norm_topk_prob,
  // first_dense_layers}, or none). Off by default; a preset's is replaced
  // whole. Both families: GELU experts in gpt2, SwiGLU in llama.
  model::MoeConfig moe;
  int HeadDim() const { return head_dim > 0 ? head_dim : heads > 0 ? dim / heads : 0; }

  // The model's config (family recipe and shape), validated as
  // ParseJobSpec validates it: INVALID_ARGUMENT naming the field otherwise.
  absl::StatusOr<model::ModelConfig> Config() const;
};

struct DataSpec {
  std::string train;  // required: a path as the workers see it
  std::string val;    // optional ("" = none): validation data for eval, same format
  DataFormat format = DataFormat::kText;
  // Default: byte for text, gpt2 for llmc (json when tokenizer_json is
  // given). Text data needs the byte tokenizer; gpt2, llama3 and json are
  // accepted only with llmc (their token files are pre-tokenized).
  TokenizerKind tokenizer = TokenizerKind::kByte;
  // The Hugging Face tokenizer.json of tokenizer: json (and only then): a
  // path as `shardtrain sample` and `export` see it. Not read by workers.
  std::string tokenizer_json;
};

struct BatchSpec {
  int global = 0;   // sequences per optimizer step; global % (micro·dp) == 0
  int micro = 0;    // sequences per forward/backward on one rank (B)
  int seq_len = 0;  // tokens per sequence (T), <= model.context
};

struct ParallelSpec {
  int dp = 1;  // data-parallel degree
  // Context parallelism: each sequence split over cp ranks (ring attention;
  // 2·cp divides batch.seq_len); parameters replicated over cp, gradients
  // summed over dp × cp.
  int cp = 1;
  int tp = 1;  // tensor-parallel degree; divides model.heads, 4·dim and the padded vocab
  int pp = 1;  // pipeline stages; <= model.layers
  // Expert parallelism: an MoE layer's experts split over ep ranks of the
  // dp × cp replicas (not a factor of the world; divides dp · cp and
  // model.moe.experts), tokens exchanged all-to-all; expert gradients summed
  // over the dp · cp / ep ranks holding the same experts.
  int ep = 1;
  int zero = 0;  // ZeRO stage 0..3; 3 only with pp = 1
  // Layers per pipeline stage: empty (the default) splits them balanced by
  // parameter count (model::StageLayers), else pp entries >= 1 summing to
  // model.layers.
  std::vector<int> stages;
  OffloadMode offload = OffloadMode::kNone;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  // Interleaved 1F1B: model chunks per pipeline stage (Megatron-LM's virtual
  // stages). 1: one contiguous run of layers per stage. > 1: pp > 1,
  // schedule 1f1b, no explicit stages, model.layers a multiple of pp ×
  // pp_virtual, micro-batches per step a multiple of pp, zero <= 1 and Gloo.
  int pp_virtual = 1;
  bool reshard_after_forward = true;  // ZeRO-3: free gathered params after forward
  // Megatron-LM's sequence parallelism: the LayerNorm and residual regions
  // split along the sequence across the tp ranks (tp > 1; tp divides
  // batch.micro · batch.seq_len); activations outside the tp region / tp.
  bool sequence_parallel = false;
  int bucket_mb = 25;  // gradient bucket size for all-reduce, MiB (> 0)
  // The ranks' collectives: Gloo over TCP on host memory (GPU ranks copy
  // through the host: how several ranks share one GPU), or NCCL on device
  // memory (GPU ranks only, one GPU each). auto: gloo for now.
  CommBackend comm = CommBackend::kAuto;
  // The type DDP's gradient buckets are all-reduced in: fp32, or bf16 (half
  // the bytes; NCCL sums natively in bf16, rounding at each hop; the mean is
  // added back into the fp32 gradient). bf16 needs parallel.comm nccl and
  // zero 0.
  ReduceDtype reduce_dtype = ReduceDtype::kFp32;
};

struct OptimizerSpec {
  OptimizerKind name = OptimizerKind::kAdamW;
  double lr = 3e-4;                         // peak learning rate, finite > 0
  double min_lr = 3e-5;                     // floor of the schedule, 0 <= min_lr <= lr
  std::vector<double> betas = {0.9, 0.95};  // exactly two, each in [0, 1)
  double eps = 1e-8;                        // > 0
  double weight_decay = 0.0;                // >= 0; applies to matrices only
  int warmup_steps = 0;                     // >= 0, linear warmup from 0
  LrSchedule schedule = LrSchedule::kCosine;
  double grad_clip = 1.0;  // global-norm clip, >= 0 (0 = off)
  // AdamW's m and v: fp32, or block-wise 8-bit (worker/optim/adamw8bit.h;
  // CPU workers only so far).
  OptimizerState state = OptimizerState::kFp32;
};

struct CheckpointSpec {
  int every = 0;    // steps between checkpoints, >= 0 (0 = never)
  std::string dir;  // required when every > 0
  int keep = 3;     // committed checkpoints kept, >= 1
  // What a checkpoint that could not be committed (a shard not written, the
  // commit not completed) does to the job: kWarn records a warning event and
  // training goes on; kFail fails the job, naming the path and the cause.
  CheckpointFailurePolicy on_failure = CheckpointFailurePolicy::kWarn;
  // Under kWarn, this many checkpoints in a row not committed fail the job
  // all the same; >= 0 (0 = never).
  int max_consecutive_failures = 3;
  // How long rank 0 retries writing the final weights, with back-off and the
  // trained weights in memory, after a storage error a retry cannot fix
  // (no space, read-only, permission denied, not a directory) before the
  // job fails naming the path and the cause; seconds, >= 0.
  int final_retry_s = 120;
};

// Validation loss: every `every` steps, and after the last step, the job
// evaluates a fixed set of eval.batches × batch.global validation windows of
// batch.seq_len tokens from data.val, forward only: each data-parallel
// replica its 1/dp share, in micro-batches. Counted in global batches, the
// set is the same whatever dp and batch.micro (as a step's batch is), so the
// job's val_loss, their mean token loss, is too (worker/trainer.h).
struct EvalSpec {
  int every = 0;    // steps between evaluations, >= 0 (0 = never); > 0 requires data.val;
                    // default: steps (after the last step only) when data.val is set
  int batches = 2;  // batches of batch.global sequences per evaluation, >= 1
};

struct ResourcesSpec {
  DeviceKind device = DeviceKind::kCpu;
  int min_workers = 0;  // default World(); 1 <= min_workers <= World()
  int max_workers = 0;  // default World(); >= World()
};

struct TimeoutsSpec {
  int collective_s = 60;  // a collective that takes longer is an error, > 0
};

// How MoE layers are trained (the YAML's router section; ignored without
// model.moe): the balancing losses' coefficients, DeepSeek-V3's
// aux-loss-free bias (its update rate; 0: off) and the experts' capacity
// (0: dropless; > 0: ceil(capacity_factor · tokens·top_k / experts) pairs
// per expert of a micro-batch, the rest dropped).
struct RouterSpec {
  double aux_loss_coef = 0.01;  // >= 0
  double z_loss_coef = 0;       // >= 0
  double bias_update_rate = 0;  // >= 0
  double capacity_factor = 0;   // >= 0
};

// Fine-tuning with LoRA adapters on a frozen model (the YAML's finetune
// section; model::LoraConfig says what an adapter computes). lora.rank 0
// (`lora: none`, the default): a full training run. Defaults follow Hugging
// Face PEFT's LoraConfig: rank 8, alpha 8, targets q and v. The model's own
// weights come from model.init (without it the adapters sit on a random
// model, which the CLI warns about).
struct LoraSpec {
  int rank = 0;        // >= 1 when on; at most every target's in and out widths
  double alpha = 8;    // > 0; adapters scale by alpha / rank
  double dropout = 0;  // on the adapters' input; only 0 so far
  std::vector<std::string> targets = {"q", "v"};  // of q, k, v, o, gate, up, down
  bool on() const { return rank > 0; }
};
struct FinetuneSpec {
  LoraSpec lora;
  // How the frozen model is held: bf16 (the engine's compute type: bf16 on
  // a GPU, fp32 on CPU workers, whose engine computes in fp32), int8 (per
  // output channel) or nf4 (QLoRA's 4-bit NormalFloat, common/model/
  // weight_quant.h). int8 and nf4 need lora.
  BaseDtype base_dtype = BaseDtype::kBf16;
  // nf4: the blocks' absmax in 8 bits too (QLoRA's double quantization,
  // ~0.37 bits per parameter saved).
  bool double_quant = true;
};

struct JobSpec {
  std::string name;  // required, [a-z0-9._-]{1,64}
  ModelSpec model;
  DataSpec data;
  BatchSpec batch;
  ParallelSpec parallel;
  Precision precision = Precision::kFp32;
  OptimizerSpec optimizer;
  int steps = 0;  // required, > 0
  CheckpointSpec checkpoint;
  EvalSpec eval;
  uint64_t seed = 1337;
  ResourcesSpec resources;
  int max_restarts = 3;  // recoveries before the job fails, >= 0
  TimeoutsSpec timeouts;
  RouterSpec router;
  FinetuneSpec finetune;

  // The model the engines run: model.Config() with finetune.lora's
  // adapters (model::LoraConfig), validated.
  absl::StatusOr<model::ModelConfig> TrainedConfig() const;
  // How the engines hold the frozen model under LoRA (finetune.base_dtype
  // and double_quant; the compute type's bytes: 4 on CPU workers, else by
  // precision).
  model::FrozenFormat FrozenFormat() const;
  // Ranks the job needs: dp · cp · tp · pp.
  int World() const { return parallel.dp * parallel.cp * parallel.tp * parallel.pp; }
  // Its mesh and its batch split (common/parallel_dims.h), which
  // ParseJobSpec has checked; a spec made by hand may hold errors.
  // Split().accum is the number of micro-batches per optimizer step on each
  // data-parallel replica (for pipelines, m).
  absl::StatusOr<ParallelDims> Dims() const;
  // What each rank keeps of its activations: model.recompute,
  // model.recompute_layers, parallel.sequence_parallel and parallel.cp; and
  // whether the CUDA engine's flash attention runs (resources.device cuda,
  // precision bf16 or fp16, a head size it serves, no cp).
  model::ActivationPolicy Activations() const;
  // The engine's compute type: precision's.
  DataType Compute() const;
  // Tokens of each sequence one rank holds: batch.seq_len / parallel.cp.
  int LocalSeqLen() const { return batch.seq_len / parallel.cp; }
  absl::StatusOr<BatchSplit> Split() const;
};

bool operator==(const ModelSpec& a, const ModelSpec& b);
bool operator==(const DataSpec& a, const DataSpec& b);
bool operator==(const BatchSpec& a, const BatchSpec& b);
bool operator==(const ParallelSpec& a, const ParallelSpec& b);
bool operator==(const OptimizerSpec& a, const OptimizerSpec& b);
bool operator==(const CheckpointSpec& a, const CheckpointSpec& b);
bool operator==(const EvalSpec& a, const EvalSpec& b);
bool operator==(const ResourcesSpec& a, const ResourcesSpec& b);
bool operator==(const TimeoutsSpec& a, const TimeoutsSpec& b);
bool operator==(const RouterSpec& a, const RouterSpec& b);
bool operator==(const FinetuneSpec& a, const FinetuneSpec& b);
bool operator==(const JobSpec& a, const JobSpec& b);
inline bool operator!=(const JobSpec& a, const JobSpec& b) { return !(a == b); }

// Every field a spec may hold, as dotted paths in schema order ("name",
// "model.preset", ...): the list docs/spec.md documents, row for row.
std::vector<std::string> JobSpecFieldPaths();

// Parses and validates a job spec.
//
// `overrides` are "key.path=value" strings ("parallel.zero=3", "steps=20",
// "optimizer.betas=[0.9,0.99]"), applied in order to the YAML tree before
// validation; each value is parsed as YAML (a scalar or a flow collection).
// An override without '=' or with a path that names no spec field is
// INVALID_ARGUMENT whose message starts with "override \"<text>\"".
//
// Returns the validated spec, or INVALID_ARGUMENT naming the first bad field.
absl::StatusOr<JobSpec> ParseJobSpec(std::string_view yaml_text,
                                     const std::vector<std::string>& overrides = {});

// What the CLI completes from model.init's Hugging Face config.json before
// it submits a spec (checkpoint::ModelFieldsFromHfConfig and
// HfRouterAuxLossCoef; the checkpoint's reader checks that what the spec
// sets agrees). `init` is model.init after `overrides` ("" when unset);
// `shape_from_init` says the model section sets neither model.preset nor
// model.layers, so every model field the spec leaves out comes from
// config.json; `keys_set` the model.* keys the spec sets (not overridden);
// `aux_loss_coef_set` whether it sets router.aux_loss_coef (else an MoE
// checkpoint's router_aux_loss_coef gives it). INVALID_ARGUMENT for YAML or
// overrides ParseJobSpec would refuse the same way.
struct ModelFromInit {
  std::string init;
  bool shape_from_init = false;
  std::vector<std::string> keys_set;
  bool aux_loss_coef_set = false;
};
absl::StatusOr<ModelFromInit> ModelShapeFromInit(std::string_view yaml_text,
                                                 const std::vector<std::string>& overrides = {});

// Canonical YAML for a validated spec: every field explicit, fixed order,
// numbers in their shortest exact form. ParseJobSpec(JobSpecToYaml(s)) == s.
// The coordinator stores this text and ships it to workers.
std::string JobSpecToYaml(const JobSpec& spec);

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_JOB_SPEC_H_
