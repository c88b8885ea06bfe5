#include "bench/ncu_summary.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

namespace shardtrain::bench {
namespace {

// Splits one CSV line (quoted fields, commas inside quotes).
std::vector<std::string> CsvFields(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

}  // namespace

std::string KernelFamily(std::string name) {
  for (const char* gemm : {"nvjet", "cutlass", "gemm", "xmma"}) {
    if (name.find(gemm) != std::string::npos) return "GEMM (cuBLAS)";
  }
  if (name.rfind("void ", 0) == 0) name.erase(0, 5);
  if (const size_t paren = name.find('('); paren != std::string::npos) name.resize(paren);
  for (size_t at; (at = name.find("<unnamed>::")) != std::string::npos;) name.erase(at, 11);
  if (const size_t ns = name.rfind("::", name.find('<')); ns != std::string::npos) {
    name.erase(0, ns + 2);
  }
  for (auto [from, to] :
       {std::pair<const char*, const char*>{"__nv_bfloat16", "bf16"}, {"__half", "fp16"}}) {
    for (size_t at; (at = name.find(from)) != std::string::npos;) {
      name.replace(at, std::strlen(from), to);
    }
  }
  return name;
}

std::vector<KernelTime> ParseNcuSummary(std::istream& in) {
  std::map<std::string, KernelTime> by_family;
  std::vector<std::string> header;
  for (std::string line; std::getline(in, line);) {
    if (header.empty()) {
      if (line.rfind("\"Process ID\"", 0) == 0) header = CsvFields(line);
      continue;
    }
    const std::vector<std::string> f = CsvFields(line);
    if (f.size() != header.size()) continue;
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < f.size(); ++i) row[header[i]] = f[i];
    if (row["Metric Name"] != "gpu__time_duration.sum") continue;
    std::string avg = row["Average"];
    avg.erase(std::remove(avg.begin(), avg.end(), ','), avg.end());
    const std::string& unit = row["Metric Unit"];
    const double scale = unit == "us" ? 1e3 : unit == "ms" ? 1e6 : unit == "s" ? 1e9 : 1.0;
    const int64_t n = std::atoll(row["Invocations"].c_str());
    const std::string family = KernelFamily(row["Kernel Name"]);
    KernelTime& k = by_family[family];
    k.family = family;
    k.launches += n;
    k.ns += double(n) * std::atof(avg.c_str()) * scale;
  }
  std::vector<KernelTime> out;
  for (auto& [name, k] : by_family) out.push_back(k);
  std::sort(out.begin(), out.end(),
            [](const KernelTime& a, const KernelTime& b) { return a.ns > b.ns; });
  return out;
}

void PrintKernelTable(const std::vector<KernelTime>& kernels, int steps) {
  double total = 0;
  for (const KernelTime& k : kernels) total += k.ns;
  std::printf(
      "\nwhere the time goes (Nsight Compute, per kernel family; %d steps profiled, %.2f ms of "
      "kernels per step):\n",
      steps, total / 1e6 / steps);
  std::printf("%10s %7s %9s  %s\n", "ms/step", "share", "launches", "kernel");
  for (const KernelTime& k : kernels) {
    std::printf("%10.3f %6.1f%% %9.1f  %s\n", k.ns / 1e6 / steps, 100 * k.ns / total,
                double(k.launches) / steps, k.family.c_str());
  }
}

std::string FindNcu() {
  if (access("/usr/local/cuda/bin/ncu", X_OK) == 0) return "/usr/local/cuda/bin/ncu";
  return std::system("command -v ncu >/dev/null 2>&1") == 0 ? "ncu" : "";
}

}  // namespace shardtrain::bench
