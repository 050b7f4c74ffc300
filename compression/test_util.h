// Test helpers for compression/*_test.cc: deterministic random tensors.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace asyncps::compression::testing {

inline std::vector<float> Gaussian(size_t n, uint64_t seed, float scale = 1) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Student-t with `dof` degrees of freedom (dof = 1: Cauchy), heavy-tailed.
inline std::vector<float> StudentT(size_t n, uint64_t seed, double dof) {
  std::mt19937_64 rng(seed);
  std::student_t_distribution<double> d(dof);
  std::vector<float> v(n);
  for (auto& x : v) {
    double y = d(rng);
    if (!std::isfinite(y) || std::fabs(y) > 1e30) y = y > 0 ? 1e30 : -1e30;
    x = static_cast<float>(y);
  }
  return v;
}

}  // namespace asyncps::compression::testing
