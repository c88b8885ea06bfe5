// The small job spec of the coordinator core's tests (coordinator_test.cc,
// coordinator_restart_test.cc).
#ifndef SHARDTRAIN_TESTS_UNIT_COORDINATOR_CORE_TEST_SPEC_H_
#define SHARDTRAIN_TESTS_UNIT_COORDINATOR_CORE_TEST_SPEC_H_

#include <string>

namespace shardtrain::coordinator {
// max_restarts 0 unless a test is about recovery: a failure then fails the job.
inline std::string CoreTestSpec(int dp, int steps = 3, int max_restarts = 0) {
  return "name: t\nmodel: {layers: 2, heads: 2, dim: 16, context: 16, vocab: 256}\n"
         "data: {train: data/x.txt}\nbatch: {global: " +
         std::to_string(2 * dp) + ", micro: 2, seq_len: 8}\nparallel: {dp: " + std::to_string(dp) +
         "}\nsteps: " + std::to_string(steps) + "\nmax_restarts: " + std::to_string(max_restarts) +
         "\ncheckpoint: {every: 1, dir: /tmp/ckpt-t}\n";
}

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_TESTS_UNIT_COORDINATOR_CORE_TEST_SPEC_H_
