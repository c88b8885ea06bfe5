// The job spec's output half: enum spellings, equality and the canonical
// YAML a validated spec is stored and shipped as.
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <tuple>

#include "common/job_spec.h"
#include "common/job_spec_internal.h"
#include "yaml-cpp/yaml.h"

namespace shardtrain {
namespace spec_internal {

std::string FormatDouble(double v) {
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace spec_internal

using spec_internal::FormatDouble;
using spec_internal::NameIn;

std::string_view EnumName(DataFormat v) { return NameIn(spec_internal::kDataFormats, v); }
std::string_view EnumName(TokenizerKind v) { return NameIn(spec_internal::kTokenizers, v); }
std::string_view EnumName(OffloadMode v) { return NameIn(spec_internal::kOffloadModes, v); }
std::string_view EnumName(ReduceDtype v) { return NameIn(spec_internal::kReduceDtypes, v); }
std::string_view EnumName(CommBackend v) { return NameIn(spec_internal::kCommBackends, v); }
std::string_view EnumName(PipelineSchedule v) {
  return NameIn(spec_internal::kPipelineSchedules, v);
}
std::string_view EnumName(Precision v) { return NameIn(spec_internal::kPrecisions, v); }
std::string_view EnumName(OptimizerKind v) { return NameIn(spec_internal::kOptimizers, v); }
std::string_view EnumName(LrSchedule v) { return NameIn(spec_internal::kLrSchedules, v); }
std::string_view EnumName(BaseDtype v) { return NameIn(spec_internal::kBaseDtypes, v); }
std::string_view EnumName(OptimizerState v) { return NameIn(spec_internal::kOptimizerStates, v); }
std::string_view EnumName(DeviceKind v) { return NameIn(spec_internal::kDevices, v); }
std::string_view EnumName(Recompute v) { return NameIn(spec_internal::kRecomputes, v); }
std::string_view EnumName(model::Arch v) { return NameIn(spec_internal::kArchs, v); }
std::string_view EnumName(AttentionKind v) { return NameIn(spec_internal::kAttentionKinds, v); }
std::string_view EnumName(CheckpointFailurePolicy v) {
  return NameIn(spec_internal::kCheckpointFailurePolicies, v);
}

bool operator==(const ModelSpec& a, const ModelSpec& b) {
  return std::tie(a.preset, a.arch, a.layers, a.heads, a.dim, a.context, a.vocab, a.kv_heads,
                  a.ffn_dim, a.rope_theta, a.rope_scaling, a.head_dim, a.qk_norm, a.moe, a.norm_eps,
                  a.tie_embeddings, a.init, a.adapter, a.recompute, a.recompute_layers,
                  a.attention) == std::tie(b.preset, b.arch, b.layers, b.heads, b.dim, b.context,
                                           b.vocab, b.kv_heads, b.ffn_dim, b.rope_theta,
                                           b.rope_scaling, b.head_dim, b.qk_norm, b.moe, b.norm_eps,
                                           b.tie_embeddings, b.init, b.adapter, b.recompute,
                                           b.recompute_layers, b.attention);
}
bool operator==(const DataSpec& a, const DataSpec& b) {
  return std::tie(a.train, a.val, a.format, a.tokenizer, a.tokenizer_json) ==
         std::tie(b.train, b.val, b.format, b.tokenizer, b.tokenizer_json);
}
bool operator==(const BatchSpec& a, const BatchSpec& b) {
  return std::tie(a.global, a.micro, a.seq_len) == std::tie(b.global, b.micro, b.seq_len);
}
bool operator==(const ParallelSpec& a, const ParallelSpec& b) {
  return std::tie(a.dp, a.cp, a.tp, a.pp, a.ep, a.stages, a.zero, a.offload, a.schedule,
                  a.pp_virtual, a.reshard_after_forward, a.bucket_mb, a.sequence_parallel, a.comm,
                  a.reduce_dtype) == std::tie(b.dp, b.cp, b.tp, b.pp, b.ep, b.stages, b.zero,
                                              b.offload, b.schedule, b.pp_virtual,
                                              b.reshard_after_forward, b.bucket_mb,
                                              b.sequence_parallel, b.comm, b.reduce_dtype);
}
bool operator==(const OptimizerSpec& a, const OptimizerSpec& b) {
  return std::tie(a.name, a.lr, a.min_lr, a.betas, a.eps, a.weight_decay, a.warmup_steps,
                  a.schedule, a.grad_clip,
                  a.state) == std::tie(b.name, b.lr, b.min_lr, b.betas, b.eps, b.weight_decay,
                                       b.warmup_steps, b.schedule, b.grad_clip, b.state);
}
bool operator==(const CheckpointSpec& a, const CheckpointSpec& b) {
  return std::tie(a.every, a.dir, a.keep, a.on_failure, a.max_consecutive_failures,
                  a.final_retry_s) == std::tie(b.every, b.dir, b.keep, b.on_failure,
                                               b.max_consecutive_failures, b.final_retry_s);
}
bool operator==(const EvalSpec& a, const EvalSpec& b) {
  return std::tie(a.every, a.batches) == std::tie(b.every, b.batches);
}
bool operator==(const ResourcesSpec& a, const ResourcesSpec& b) {
  return std::tie(a.device, a.min_workers, a.max_workers) ==
         std::tie(b.device, b.min_workers, b.max_workers);
}
bool operator==(const TimeoutsSpec& a, const TimeoutsSpec& b) {
  return a.collective_s == b.collective_s;
}
bool operator==(const RouterSpec& a, const RouterSpec& b) {
  return std::tie(a.aux_loss_coef, a.z_loss_coef, a.bias_update_rate, a.capacity_factor) ==
         std::tie(b.aux_loss_coef, b.z_loss_coef, b.bias_update_rate, b.capacity_factor);
}
bool operator==(const FinetuneSpec& a, const FinetuneSpec& b) {
  return std::tie(a.lora.rank, a.lora.alpha, a.lora.dropout, a.lora.targets, a.base_dtype,
                  a.double_quant) == std::tie(b.lora.rank, b.lora.alpha, b.lora.dropout,
                                              b.lora.targets, b.base_dtype, b.double_quant);
}
bool operator==(const JobSpec& a, const JobSpec& b) {
  return std::tie(a.name, a.model, a.data, a.batch, a.parallel, a.precision, a.optimizer, a.steps,
                  a.checkpoint, a.eval, a.seed, a.resources, a.max_restarts, a.timeouts, a.router,
                  a.finetune) == std::tie(b.name, b.model, b.data, b.batch, b.parallel, b.precision,
                                          b.optimizer, b.steps, b.checkpoint, b.eval, b.seed,
                                          b.resources, b.max_restarts, b.timeouts, b.router,
                                          b.finetune);
}

std::string JobSpecToYaml(const JobSpec& s) {
  YAML::Emitter out;
  auto num = [](double v) { return FormatDouble(v); };
  auto boolean = [](bool v) { return std::string(v ? "true" : "false"); };
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << s.name;

  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  if (!s.model.preset.empty()) out << YAML::Key << "preset" << YAML::Value << s.model.preset;
  out << YAML::Key << "layers" << YAML::Value << s.model.layers;
  out << YAML::Key << "heads" << YAML::Value << s.model.heads;
  out << YAML::Key << "dim" << YAML::Value << s.model.dim;
  out << YAML::Key << "context" << YAML::Value << s.model.context;
  out << YAML::Key << "vocab" << YAML::Value << s.model.vocab;
  out << YAML::Key << "arch" << YAML::Value << std::string(EnumName(s.model.arch));
  if (s.model.arch != model::Arch::kGpt2) {  // the fields only Llama has
    out << YAML::Key << "kv_heads" << YAML::Value << s.model.kv_heads;
    out << YAML::Key << "ffn_dim" << YAML::Value << s.model.ffn_dim;
    out << YAML::Key << "rope_theta" << YAML::Value << num(s.model.rope_theta);
    const model::RopeScaling& r = s.model.rope_scaling;
    out << YAML::Key << "rope_scaling";
    if (r.on()) {
      out << YAML::Value << YAML::Flow << YAML::BeginMap;
      out << YAML::Key << "type" << YAML::Value << "llama3";
      out << YAML::Key << "factor" << YAML::Value << num(r.factor);
      out << YAML::Key << "low_freq_factor" << YAML::Value << num(r.low_freq_factor);
      out << YAML::Key << "high_freq_factor" << YAML::Value << num(r.high_freq_factor);
      out << YAML::Key << "original_max_position_embeddings" << YAML::Value << r.original_context;
      out << YAML::EndMap;
    } else {
      out << YAML::Value << "none";
    }
    if (s.model.head_dim > 0) out << YAML::Key << "head_dim" << YAML::Value << s.model.head_dim;
    out << YAML::Key << "qk_norm" << YAML::Value << boolean(s.model.qk_norm);
    out << YAML::Key << "norm_eps" << YAML::Value << num(s.model.norm_eps);
    out << YAML::Key << "tie_embeddings" << YAML::Value << boolean(s.model.tie_embeddings);
  }
  const model::MoeConfig& moe = s.model.moe;
  out << YAML::Key << "moe";
  if (moe.on()) {
    out << YAML::Value << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "experts" << YAML::Value << moe.experts;
    out << YAML::Key << "top_k" << YAML::Value << moe.top_k;
    out << YAML::Key << "expert_ffn_dim" << YAML::Value << moe.expert_ffn_dim;
    out << YAML::Key << "shared_experts" << YAML::Value << moe.shared_experts;
    out << YAML::Key << "scoring" << YAML::Value
        << std::string(moe.scoring == model::RouterScoring::kSigmoid ? "sigmoid" : "softmax");
    out << YAML::Key << "norm_topk_prob" << YAML::Value << boolean(moe.norm_topk_prob);
    out << YAML::Key << "first_dense_layers" << YAML::Value << moe.first_dense_layers;
    out << YAML::Key << "router_bias" << YAML::Value << boolean(moe.router_bias);
    out << YAML::EndMap;
  } else {
    out << YAML::Value << "none";
  }
  if (!s.model.init.empty()) out << YAML::Key << "init" << YAML::Value << s.model.init;
  if (!s.model.adapter.empty()) out << YAML::Key << "adapter" << YAML::Value << s.model.adapter;
  out << YAML::Key << "recompute" << YAML::Value << std::string(EnumName(s.model.recompute));
  if (s.model.recompute_layers > 0) {
    out << YAML::Key << "recompute_layers" << YAML::Value << s.model.recompute_layers;
  }
  out << YAML::Key << "attention" << YAML::Value << std::string(EnumName(s.model.attention));
  out << YAML::EndMap;

  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "train" << YAML::Value << s.data.train;
  if (!s.data.val.empty()) out << YAML::Key << "val" << YAML::Value << s.data.val;
  out << YAML::Key << "format" << YAML::Value << std::string(EnumName(s.data.format));
  out << YAML::Key << "tokenizer" << YAML::Value << std::string(EnumName(s.data.tokenizer));
  if (!s.data.tokenizer_json.empty()) {
    out << YAML::Key << "tokenizer_json" << YAML::Value << s.data.tokenizer_json;
  }
  out << YAML::EndMap;

  out << YAML::Key << "batch" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "global" << YAML::Value << s.batch.global;
  out << YAML::Key << "micro" << YAML::Value << s.batch.micro;
  out << YAML::Key << "seq_len" << YAML::Value << s.batch.seq_len;
  out << YAML::EndMap;

  out << YAML::Key << "parallel" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "dp" << YAML::Value << s.parallel.dp;
  out << YAML::Key << "cp" << YAML::Value << s.parallel.cp;
  out << YAML::Key << "tp" << YAML::Value << s.parallel.tp;
  out << YAML::Key << "pp" << YAML::Value << s.parallel.pp;
  out << YAML::Key << "ep" << YAML::Value << s.parallel.ep;
  out << YAML::Key << "stages" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (int layers : s.parallel.stages) out << layers;
  out << YAML::EndSeq;
  out << YAML::Key << "zero" << YAML::Value << s.parallel.zero;
  out << YAML::Key << "offload" << YAML::Value << std::string(EnumName(s.parallel.offload));
  out << YAML::Key << "schedule" << YAML::Value << std::string(EnumName(s.parallel.schedule));
  out << YAML::Key << "pp_virtual" << YAML::Value << s.parallel.pp_virtual;
  out << YAML::Key << "reshard_after_forward" << YAML::Value
      << boolean(s.parallel.reshard_after_forward);
  out << YAML::Key << "bucket_mb" << YAML::Value << s.parallel.bucket_mb;
  out << YAML::Key << "sequence_parallel" << YAML::Value << boolean(s.parallel.sequence_parallel);
  out << YAML::Key << "comm" << YAML::Value << std::string(EnumName(s.parallel.comm));
  out << YAML::Key << "reduce_dtype" << YAML::Value
      << std::string(EnumName(s.parallel.reduce_dtype));
  out << YAML::EndMap;

  out << YAML::Key << "precision" << YAML::Value << std::string(EnumName(s.precision));

  out << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << std::string(EnumName(s.optimizer.name));
  out << YAML::Key << "lr" << YAML::Value << num(s.optimizer.lr);
  out << YAML::Key << "min_lr" << YAML::Value << num(s.optimizer.min_lr);
  out << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (double b : s.optimizer.betas) out << num(b);
  out << YAML::EndSeq;
  out << YAML::Key << "eps" << YAML::Value << num(s.optimizer.eps);
  out << YAML::Key << "weight_decay" << YAML::Value << num(s.optimizer.weight_decay);
  out << YAML::Key << "warmup_steps" << YAML::Value << s.optimizer.warmup_steps;
  out << YAML::Key << "schedule" << YAML::Value << std::string(EnumName(s.optimizer.schedule));
  out << YAML::Key << "grad_clip" << YAML::Value << num(s.optimizer.grad_clip);
  out << YAML::Key << "state" << YAML::Value << std::string(EnumName(s.optimizer.state));
  out << YAML::EndMap;

  out << YAML::Key << "steps" << YAML::Value << s.steps;

  out << YAML::Key << "checkpoint" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "every" << YAML::Value << s.checkpoint.every;
  out << YAML::Key << "dir" << YAML::Value << s.checkpoint.dir;
  out << YAML::Key << "keep" << YAML::Value << s.checkpoint.keep;
  out << YAML::Key << "on_failure" << YAML::Value << std::string(EnumName(s.checkpoint.on_failure));
  out << YAML::Key << "max_consecutive_failures" << YAML::Value
      << s.checkpoint.max_consecutive_failures;
  out << YAML::Key << "final_retry_s" << YAML::Value << s.checkpoint.final_retry_s;
  out << YAML::EndMap;

  out << YAML::Key << "eval" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "every" << YAML::Value << s.eval.every;
  out << YAML::Key << "batches" << YAML::Value << s.eval.batches;
  out << YAML::EndMap;

  out << YAML::Key << "seed" << YAML::Value << std::to_string(s.seed);

  out << YAML::Key << "resources" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "device" << YAML::Value << std::string(EnumName(s.resources.device));
  out << YAML::Key << "min_workers" << YAML::Value << s.resources.min_workers;
  out << YAML::Key << "max_workers" << YAML::Value << s.resources.max_workers;
  out << YAML::EndMap;

  out << YAML::Key << "max_restarts" << YAML::Value << s.max_restarts;

  out << YAML::Key << "timeouts" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "collective_s" << YAML::Value << s.timeouts.collective_s;
  out << YAML::EndMap;

  out << YAML::Key << "router" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "aux_loss_coef" << YAML::Value << num(s.router.aux_loss_coef);
  out << YAML::Key << "z_loss_coef" << YAML::Value << num(s.router.z_loss_coef);
  out << YAML::Key << "bias_update_rate" << YAML::Value << num(s.router.bias_update_rate);
  out << YAML::Key << "capacity_factor" << YAML::Value << num(s.router.capacity_factor);
  out << YAML::EndMap;

  out << YAML::Key << "finetune" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "lora" << YAML::Value;
  if (s.finetune.lora.on()) {
    out << YAML::BeginMap;
    out << YAML::Key << "rank" << YAML::Value << s.finetune.lora.rank;
    out << YAML::Key << "alpha" << YAML::Value << num(s.finetune.lora.alpha);
    out << YAML::Key << "dropout" << YAML::Value << num(s.finetune.lora.dropout);
    out << YAML::Key << "targets" << YAML::Value << YAML::Flow << s.finetune.lora.targets;
    out << YAML::EndMap;
  } else {
    out << "none";
  }
  out << YAML::Key << "base_dtype" << YAML::Value << std::string(EnumName(s.finetune.base_dtype));
  out << YAML::Key << "double_quant" << YAML::Value << s.finetune.double_quant;
  out << YAML::EndMap;

  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace shardtrain
