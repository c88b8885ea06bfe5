// Small helpers shared by the benchmarks: the machine's load, printed next to
// every result because this 2-core machine is shared.
#ifndef SHARDTRAIN_BENCH_BENCH_UTIL_H_
#define SHARDTRAIN_BENCH_BENCH_UTIL_H_

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace shardtrain::bench {

// Nearest-rank percentile `p` (0..1) of `samples`, in any order; 0 when
// empty.
inline double Percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(samples.size())));
  return samples[std::clamp<size_t>(rank, 1, samples.size()) - 1];
}

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

// Forks `ranks` processes running body(rank) (its return value is the exit
// code) and waits for all. True when every one exited 0. Call it from a
// process holding no threads.
inline bool ForkRanks(int ranks, const std::function<int(int rank)>& body) {
  std::vector<pid_t> pids;
  bool ok = true;
  for (int r = 0; r < ranks; ++r) {
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      ok = false;
      break;
    }
    if (pid == 0) _exit(body(r));
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

}  // namespace shardtrain::bench

#endif  // SHARDTRAIN_BENCH_BENCH_UTIL_H_
