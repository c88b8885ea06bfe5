// Small helpers shared by the benchmarks: the machine's load, printed next to
// every result because this 2-core machine is shared.
#ifndef SHARDTRAIN_BENCH_BENCH_UTIL_H_
#define SHARDTRAIN_BENCH_BENCH_UTIL_H_

#include <cstdio>
#include <string>

namespace shardtrain::bench {

// The 1-minute load average (/proc/loadavg), 0 if unreadable.
inline double LoadAverage1() {
  double l = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = 0;
    std::fclose(f);
  }
  return l;
}

// The output of `uptime`, without its newline.
inline std::string Uptime() {
  std::string out;
  if (FILE* p = popen("uptime", "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace shardtrain::bench

#endif  // SHARDTRAIN_BENCH_BENCH_UTIL_H_
