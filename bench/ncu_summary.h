// gpu_train_bench's "where the time goes": Nsight Compute's per-kernel
// summary (ncu --metrics gpu__time_duration.sum --print-summary per-kernel
// --csv) read into kernel families and printed as a table per step.
#ifndef SHARDTRAIN_BENCH_NCU_SUMMARY_H_
#define SHARDTRAIN_BENCH_NCU_SUMMARY_H_

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace shardtrain::bench {

// One kernel family's time in a profiled run.
struct KernelTime {
  std::string family;
  int64_t launches = 0;
  double ns = 0;
};

// "void shardtrain::<unnamed>::LayerNormForwardKernel<__nv_bfloat16>(...)"
// -> "LayerNormForwardKernel<bf16>"; every cuBLAS kernel (nvjet, cutlass,
// xmma, ...) -> "GEMM (cuBLAS)".
std::string KernelFamily(std::string name);
// The families of `ncu --metrics gpu__time_duration.sum --print-summary
// per-kernel --csv` output (lines before its header are the program's), by
// total time, largest first.
std::vector<KernelTime> ParseNcuSummary(std::istream& in);
// Per family: ms per step (the profile's total over `steps` steps), its
// share of all kernel time and its launches per step.
void PrintKernelTable(const std::vector<KernelTime>& kernels, int steps);
// ncu in the CUDA toolkit or on the PATH, or "".
std::string FindNcu();

}  // namespace shardtrain::bench

#endif  // SHARDTRAIN_BENCH_NCU_SUMMARY_H_
