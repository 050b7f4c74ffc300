#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "compression/codec.h"
#include "compression/internal/codecs.h"
#include "compression/test_util.h"

namespace asyncps::compression {
namespace {

using testing::Gaussian;
using testing::StudentT;

// Reference: sort all indices by (|x| desc, index asc), take k, sort by index.
std::vector<uint32_t> ReferenceTopK(const std::vector<float>& x, size_t k) {
  std::vector<uint32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) {
    return std::fabs(x[a]) > std::fabs(x[b]);
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<uint32_t> Indices(const std::vector<uint8_t>& p, size_t n,
                              const std::vector<float>& x) {
  auto view = ParseSparse(p.data(), p.size(), n);
  EXPECT_TRUE(view.ok()) << view.status().ToString();
  std::vector<uint32_t> out;
  view->ForEach([&](uint32_t i, float v) {
    EXPECT_EQ(v, x[i]);
    out.push_back(i);
  });
  return out;
}

std::vector<float> Quantised(size_t n, uint64_t seed, int levels) {
  auto x = Gaussian(n, seed);
  for (auto& v : x) v = std::round(v * levels) / levels;  // many ties, zeros
  return x;
}

TEST(TopKTest, ExactlyTheKLargestMagnitudes) {
  struct Case {
    size_t n;
    double ratio;
    int kind;  // 0 gaussian, 1 cauchy, 2 heavy ties, 3 all zero
  };
  for (Case cs :
       {Case{100, 0.05, 0}, Case{5000, 0.01, 0}, Case{100000, 0.001, 0},
        Case{100000, 0.01, 1}, Case{100000, 0.1, 2}, Case{50000, 0.01, 3},
        Case{200000, 0.3, 0}, Case{65536, 1.0, 0}, Case{300000, 0.0001, 1},
        Case{100000, 0.02, 4}}) {
    std::vector<float> x;
    switch (cs.kind) {
      case 0:
        x = Gaussian(cs.n, cs.n);
        break;
      case 1:
        x = StudentT(cs.n, cs.n, 1.0);
        break;
      case 2:
        x = Quantised(cs.n, cs.n, 2);
        break;
      case 3:
        x.assign(cs.n, 0.0f);
        break;
      default: {  // sorted ascending: the largest sit at the end
        x = Gaussian(cs.n, 3);
        std::sort(x.begin(), x.end(),
                  [](float a, float b) { return std::fabs(a) < std::fabs(b); });
      }
    }
    auto spec = CodecSpec::Parse("topk:ratio=" + std::to_string(cs.ratio));
    ASSERT_TRUE(spec.ok());
    auto c = CreateCodec(*spec);
    ASSERT_TRUE(c.ok());
    std::vector<uint8_t> p;
    ASSERT_TRUE((*c)->Encode(x.data(), x.size(), 5, &p).ok());
    const size_t k = internal::KForRatio(cs.ratio, cs.n);
    EXPECT_EQ(Indices(p, cs.n, x), ReferenceTopK(x, k))
        << "n=" << cs.n << " ratio=" << cs.ratio << " kind=" << cs.kind;
    // Decode scatters exactly those values.
    std::vector<float> y(cs.n, 5.0f);
    ASSERT_TRUE((*c)->Decode(p.data(), p.size(), cs.n, y.data()).ok());
    size_t nonzero = 0;
    for (size_t i = 0; i < cs.n; ++i) nonzero += y[i] != 0;
    EXPECT_LE(nonzero, k);
  }
}

TEST(TopKTest, ExplicitKIncludingZeroAndN) {
  auto x = Gaussian(10000, 2);
  std::vector<uint8_t> p;
  for (size_t k : {size_t{0}, size_t{1}, size_t{2}, size_t{999}, size_t{2500},
                   size_t{9999}, size_t{10000}}) {
    ASSERT_TRUE(internal::EncodeTopK(x.data(), x.size(), k, false, 1, &p).ok());
    EXPECT_EQ(Indices(p, x.size(), x), ReferenceTopK(x, k)) << k;
  }
  EXPECT_FALSE(
      internal::EncodeTopK(x.data(), x.size(), 10001, false, 1, &p).ok());
}

// Sampled: within 10% of k, and a threshold selection (every selected
// magnitude >= every unselected one).
void CheckSampled(const std::vector<float>& x, double ratio, const char* what) {
  const size_t n = x.size();
  const size_t k = internal::KForRatio(ratio, n);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::vector<uint8_t> p;
    ASSERT_TRUE(internal::EncodeTopK(x.data(), n, k, true, seed, &p).ok());
    auto idx = Indices(p, n, x);
    EXPECT_GE(idx.size(), k - k / 10) << what << " seed " << seed;
    EXPECT_LE(idx.size(), k + k / 10) << what << " seed " << seed;
    std::vector<char> sel(n, 0);
    float min_sel = INFINITY;
    for (uint32_t i : idx) {
      sel[i] = 1;
      min_sel = std::min(min_sel, std::fabs(x[i]));
    }
    float max_unsel = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!sel[i]) max_unsel = std::max(max_unsel, std::fabs(x[i]));
    }
    EXPECT_GE(min_sel, max_unsel) << what;
  }
}

TEST(TopKTest, SampledWithinTenPercentGaussianAndHeavyTailed) {
  for (double ratio : {0.001, 0.01, 0.1}) {
    CheckSampled(Gaussian(200000, 1), ratio, "gaussian");
    CheckSampled(StudentT(200000, 2, 3.0), ratio, "student-t(3)");
    CheckSampled(StudentT(200000, 3, 1.0), ratio, "cauchy");
    CheckSampled(Quantised(200000, 4, 8), ratio, "quantised");
  }
}

TEST(TopKTest, RejectsNonFiniteInput) {
  auto x = Gaussian(100000, 1);
  x[5] = NAN;
  std::vector<uint8_t> p;
  EXPECT_EQ(internal::EncodeTopK(x.data(), x.size(), 100, false, 1, &p).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(internal::EncodeTopK(x.data(), x.size(), 100, true, 1, &p).code(),
            StatusCode::kInvalidArgument);
  x[5] = -INFINITY;
  EXPECT_EQ(internal::EncodeTopK(x.data(), x.size(), 100, false, 1, &p).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace asyncps::compression
