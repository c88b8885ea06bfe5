#include "worker/device_probe.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/process.h"

namespace shardtrain::worker {
namespace {

// N of "cuda:N" (digits only, at most 4 of them); -1 for anything else.
int CudaOrdinal(const std::string& name) {
  if (!absl::StartsWith(name, "cuda:")) return -1;
  const std::string digits = name.substr(5);
  if (digits.empty() || digits.size() > 4 ||
      !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) {
    return -1;
  }
  int n = -1;
  return absl::SimpleAtoi(digits, &n) ? n : -1;
}

std::string Names(const std::vector<GpuInfo>& gpus) {
  std::vector<std::string> names;
  for (const GpuInfo& g : gpus) names.push_back(absl::StrCat("cuda:", g.ordinal));
  return absl::StrJoin(names, ", ");
}

}  // namespace

std::vector<std::string> GpuPrecisions(const GpuInfo& gpu) {
  if (gpu.major < kMinComputeMajor) return {};
  return {"fp32", "bf16", "fp16"};
}

absl::StatusOr<v1::Device> DeviceFor(const std::string& name, int threads,
                                     const absl::StatusOr<std::vector<GpuInfo>>& gpus) {
  v1::Device d;
  if (name == "cpu") {
    d.set_name("cpu");
    d.set_kind("cpu");
    d.add_precisions("fp32");  // the CPU engine trains in fp32 only (trainer.cc)
    d.set_memory_bytes(TotalMemoryBytes());
    d.set_model(absl::StrCat("cpu, ", threads, " threads"));
    return d;
  }
  const int ordinal = CudaOrdinal(name);
  if (ordinal < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--device: '", name, "' is not cpu or cuda:N"));
  }
  if (!gpus.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device ", name, ": ", gpus.status().message()));
  }
  auto gpu = std::find_if(gpus->begin(), gpus->end(),
                          [&](const GpuInfo& g) { return g.ordinal == ordinal; });
  if (gpu == gpus->end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device ", name, ": this machine has ", gpus->size(), " CUDA device",
                     gpus->size() == 1 ? "" : "s", " (", Names(*gpus), ")"));
  }
  const std::vector<std::string> precisions = GpuPrecisions(*gpu);
  if (precisions.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device ", name, ": ", gpu->model, " has compute capability ", gpu->major, ".",
        gpu->minor, "; this build's kernels need ", kMinComputeMajor, ".0 or newer"));
  }
  d.set_name(name);
  d.set_kind("cuda");
  d.set_memory_bytes(gpu->memory_bytes);
  d.set_model(absl::StrCat(gpu->model, ", compute capability ", gpu->major, ".", gpu->minor));
  for (const std::string& p : precisions) d.add_precisions(p);
  return d;
}

absl::StatusOr<v1::Device> ProbeDevice(const std::string& name, int threads) {
  if (CudaOrdinal(name) < 0) return DeviceFor(name, threads, std::vector<GpuInfo>{});
  return DeviceFor(name, threads, ProbeGpus());
}

std::string ProbeLines(const std::vector<GpuInfo>& gpus) {
  std::string out;
  for (const GpuInfo& g : gpus) {
    const std::vector<std::string> p = GpuPrecisions(g);
    std::string model = g.model;
    std::replace_if(
        model.begin(), model.end(), [](char c) { return c == '\t' || c == '\n' || c == '\r'; },
        ' ');
    absl::StrAppend(&out, "cuda:", g.ordinal, "\t", p.empty() ? "-" : absl::StrJoin(p, ","), "\t",
                    g.memory_bytes, "\t", g.major, ".", g.minor, "\t", model, "\n");
  }
  return out;
}

}  // namespace shardtrain::worker
