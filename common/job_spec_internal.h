// Internal to the job spec's two halves (job_spec.cc reads and validates
// YAML; job_spec_yaml.cc compares and writes specs): the enum spellings and
// the number format both use. Not part of the public API.
#ifndef SHARDTRAIN_COMMON_JOB_SPEC_INTERNAL_H_
#define SHARDTRAIN_COMMON_JOB_SPEC_INTERNAL_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/job_spec.h"

namespace shardtrain::spec_internal {

template <typename E>
using EnumTable = std::vector<std::pair<absl::string_view, E>>;

inline const EnumTable<DataFormat> kDataFormats = {{"text", DataFormat::kText},
                                                   {"llmc", DataFormat::kLlmc}};
inline const EnumTable<TokenizerKind> kTokenizers = {{"byte", TokenizerKind::kByte},
                                                     {"gpt2", TokenizerKind::kGpt2},
                                                     {"llama3", TokenizerKind::kLlama3},
                                                     {"json", TokenizerKind::kJson}};
inline const EnumTable<OffloadMode> kOffloadModes = {{"none", OffloadMode::kNone},
                                                     {"optimizer", OffloadMode::kOptimizer}};
inline const EnumTable<CommBackend> kCommBackends = {
    {"auto", CommBackend::kAuto}, {"gloo", CommBackend::kGloo}, {"nccl", CommBackend::kNccl}};
inline const EnumTable<ReduceDtype> kReduceDtypes = {{"fp32", ReduceDtype::kFp32},
                                                     {"bf16", ReduceDtype::kBf16}};
inline const EnumTable<PipelineSchedule> kPipelineSchedules = {{"gpipe", PipelineSchedule::kGpipe},
                                                               {"1f1b", PipelineSchedule::k1F1B}};
inline const EnumTable<Precision> kPrecisions = {
    {"fp32", Precision::kFp32}, {"bf16", Precision::kBf16}, {"fp16", Precision::kFp16}};
inline const EnumTable<OptimizerKind> kOptimizers = {{"adamw", OptimizerKind::kAdamW}};
inline const EnumTable<BaseDtype> kBaseDtypes = {
    {"bf16", BaseDtype::kBf16}, {"int8", BaseDtype::kInt8}, {"nf4", BaseDtype::kNf4}};
inline const EnumTable<OptimizerState> kOptimizerStates = {{"fp32", OptimizerState::kFp32},
                                                           {"int8", OptimizerState::kInt8}};
inline const EnumTable<LrSchedule> kLrSchedules = {{"cosine", LrSchedule::kCosine},
                                                   {"constant", LrSchedule::kConstant},
                                                   {"linear", LrSchedule::kLinear}};
inline const EnumTable<DeviceKind> kDevices = {{"cpu", DeviceKind::kCpu},
                                               {"cuda", DeviceKind::kCuda}};
inline const EnumTable<CheckpointFailurePolicy> kCheckpointFailurePolicies = {
    {"warn", CheckpointFailurePolicy::kWarn}, {"fail", CheckpointFailurePolicy::kFail}};
inline const EnumTable<Recompute> kRecomputes = {
    {"none", Recompute::kNone}, {"selective", Recompute::kSelective}, {"full", Recompute::kFull}};

inline const EnumTable<AttentionKind> kAttentionKinds = {
    {"materialized", AttentionKind::kMaterialized}, {"flash", AttentionKind::kFlash}};

inline const EnumTable<model::Arch> kArchs = {{"gpt2", model::Arch::kGpt2},
                                              {"llama", model::Arch::kLlama}};

template <typename E>
inline std::string_view NameIn(const EnumTable<E>& table, E v) {
  for (const auto& [name, value] : table) {
    if (value == v) return std::string_view(name.data(), name.size());
  }
  return "?";
}

// Shortest decimal text that parses back to exactly `v`.
std::string FormatDouble(double v);

}  // namespace shardtrain::spec_internal

#endif  // SHARDTRAIN_COMMON_JOB_SPEC_INTERNAL_H_
