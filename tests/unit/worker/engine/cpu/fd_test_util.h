// Finite-difference helpers shared by the CPU layers' tests (layers_test,
// moe_layers_test): central differences in double, relative differences
// scaled by the reference tensor, and the printed, checked comparisons.
#ifndef SHARDTRAIN_TESTS_UNIT_WORKER_ENGINE_CPU_FD_TEST_UTIL_H_
#define SHARDTRAIN_TESTS_UNIT_WORKER_ENGINE_CPU_FD_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

namespace shardtrain::engine::cpu::fd {

using Vec = std::vector<double>;

inline Vec RandomVec(size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (double& x : v) x = d(rng);
  return v;
}

// max|a - b| / max(max|b|, 1e-12): relative to the tensor's scale.
inline double MaxRelDiff(const Vec& a, const Vec& b) {
  double diff = 0, scale = 1e-12;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

// Central differences of loss() w.r.t. every element of x.
inline Vec NumericGrad(Vec& x, const std::function<double()>& loss) {
  constexpr double kEps = 1e-5;
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double orig = x[i];
    x[i] = orig + kEps;
    const double lp = loss();
    x[i] = orig - kEps;
    const double lm = loss();
    x[i] = orig;
    g[i] = (lp - lm) / (2 * kEps);
  }
  return g;
}

inline double Dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

constexpr double kFdTol = 1e-6;

// Prints the analytic gradient's largest difference from the numeric one
// and expects it under kFdTol.
inline void ExpectGradClose(const char* layer, const char* input, const Vec& analytic,
                            const Vec& numeric) {
  const double rel = MaxRelDiff(analytic, numeric);
  std::printf("[FD] %-16s d%-8s max rel diff %.3e\n", layer, input, rel);
  EXPECT_LT(rel, kFdTol) << layer << " d" << input;
}

inline std::vector<float> ToFloat(const Vec& v) { return {v.begin(), v.end()}; }

// A float forward against the same forward in double.
inline void ExpectFloatClose(const char* layer, const std::vector<float>& f, const Vec& d,
                             double tol = 2e-6) {
  const double rel = MaxRelDiff(Vec(f.begin(), f.end()), d);
  std::printf("[f32 vs f64] %-14s forward max rel diff %.3e\n", layer, rel);
  EXPECT_LT(rel, tol) << layer;
}

}  // namespace shardtrain::engine::cpu::fd

#endif  // SHARDTRAIN_TESTS_UNIT_WORKER_ENGINE_CPU_FD_TEST_UTIL_H_
