#include "common/device_peaks.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace shardtrain {

const std::vector<DevicePeak>& DevicePeaks() {
  // NVIDIA's data sheets, dense. H100 SXM and H200 share the compute die
  // (and the bench's 989.4); GH200 is an H200-class die beside a Grace CPU.
  static const std::vector<DevicePeak> rows = {
      {"H100 PCIe", "H100 PCIe", 756.0, 51.2},
      {"H100 NVL", "H100 NVL", 835.0, 60.0},
      {"GH200", "GH200", 989.4, 67.0},
      {"H200", "H200", 989.4, 67.0},
      {"H100", "H100 SXM", 989.4, 67.0},
      {"H800", "H800", 989.4, 67.0},
      {"B200", "B200", 2250.0, 0.0},
      {"A100", "A100", 312.0, 19.5},
      {"A800", "A800", 312.0, 19.5},
      {"L40S", "L40S", 362.05, 91.6},
      {"L40", "L40", 181.0, 90.5},
      {"A10G", "A10G", 70.0, 31.2},
      {"A10", "A10", 125.0, 31.2},
      {"L4", "L4", 121.0, 30.3},
      {"V100", "V100", 0.0, 15.7},  // no bf16; fp16 tensor cores differ
  };
  return rows;
}

const DevicePeak* FindDevicePeak(std::string_view device_name) {
  const std::string name = absl::AsciiStrToLower(std::string(device_name));
  for (const DevicePeak& p : DevicePeaks()) {
    if (absl::StrContains(name, absl::AsciiStrToLower(p.key))) return &p;
  }
  return nullptr;
}

std::optional<double> DensePeakFlops(std::string_view device_name, DataType compute) {
  const DevicePeak* p = FindDevicePeak(device_name);
  if (p == nullptr) return std::nullopt;
  const double tflops = compute == DataType::kFloat32 ? p->fp32_tflops : p->bf16_tflops;
  if (tflops <= 0) return std::nullopt;
  return tflops * 1e12;
}

std::string WhyNoPeak(std::string_view device_name, DataType compute) {
  if (device_name.empty()) return "no accelerator (the host's CPUs have no row in the peak table)";
  const DevicePeak* p = FindDevicePeak(device_name);
  if (p == nullptr) {
    return absl::StrCat("no dense peak known for \"", std::string(device_name),
                        "\" (common/device_peaks.cc lists the models it knows)");
  }
  return absl::StrCat("no ", DataTypeName(compute), " peak listed for ", p->label);
}

}  // namespace shardtrain
