// Shared by the planner tests: the source dir, a small spec of any mesh, and
// the parameter layout a spec plans.
#ifndef SHARDTRAIN_TESTS_UNIT_COMMON_PLANNER_TEST_UTIL_H_
#define SHARDTRAIN_TESTS_UNIT_COMMON_PLANNER_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/model/activations.h"
#include "common/model/config.h"
#include "common/model/param_layout.h"
#include "common/planner.h"
#include "gtest/gtest.h"

namespace shardtrain {

inline const std::string kSourceDir = SHARDTRAIN_SOURCE_DIR;

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A model every tp in 1..4 divides (NH = 12, C = 96, Vp = 192) with 5 layers,
// so pp = 2..4 splits them unevenly; the batch divides by micro·dp for every
// dp in 1..4.
inline JobSpec SmallSpec(int dp, int tp, int pp) {
  JobSpec s;
  s.name = "small";
  s.model = {"",         /*layers=*/5, /*heads=*/12, /*dim=*/96, /*context=*/16, /*vocab=*/150,
             /*init=*/""};
  s.data.train = "data/x.txt";
  s.batch = {/*global=*/48, /*micro=*/2, /*seq_len=*/16};
  s.parallel.dp = dp;
  s.parallel.tp = tp;
  s.parallel.pp = pp;
  s.steps = 1;
  return s;
}

inline model::ParamLayout LayoutOf(const JobSpec& s) {
  return model::ParamLayout(*model::MakeGptConfig(s.model.layers, s.model.heads, s.model.dim,
                                                  s.model.context, s.model.vocab));
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The shard units of a slice, (name, elements of one tp rank), by the
// splits slice.h documents, written apart from ParamLayout: embeddings (wte
// Vp/tp rows, wpe whole) on the first and last stage; per block the
// LayerNorms and the row-parallel biases whole (6C), the rest over tp
// (12C² + 7C); the final norm (2C) on the last stage.
inline std::vector<std::pair<std::string, int64_t>> SliceUnits(const JobSpec& s,
                                                               const model::ModelSlice& sl) {
  const int64_t C = s.model.dim, tp = sl.tp, Vp = model::PaddedVocab(s.model.vocab);
  std::vector<std::pair<std::string, int64_t>> out;
  if (sl.first_stage || sl.last_stage)
    out.emplace_back("embeddings", Vp * C / tp + s.model.context * C);
  const int end = sl.num_layers < 0 ? s.model.layers : sl.first_layer + sl.num_layers;
  for (int l = sl.first_layer; l < end; ++l) {
    out.emplace_back("block." + std::to_string(l), 6 * C + (12 * C * C + 7 * C) / tp);
  }
  if (sl.last_stage) out.emplace_back("final", 2 * C);
  return out;
}

// The engine's activation table (common/model/activations.h) for a slice of
// the spec's model: the one definition of activation sizes, which the
// engine allocates from (tests/unit/worker/plan_memory_test.cc checks the
// plan against what the engine really holds).
inline model::ActivationTable ActivationsOf(const JobSpec& s, const model::ModelSlice& slice = {}) {
  return model::ActivationTable(
      *model::MakeGptConfig(s.model.layers, s.model.heads, s.model.dim, s.model.context,
                            s.model.vocab),
      s.batch.micro, s.batch.seq_len, slice,
      s.precision == Precision::kFp32 ? DataType::kFloat32 : DataType::kBFloat16);
}

}  // namespace shardtrain

#endif  // SHARDTRAIN_TESTS_UNIT_COMMON_PLANNER_TEST_UTIL_H_
