#include "compression/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "compression/internal/format.h"
#include "compression/test_util.h"

namespace asyncps::compression {
namespace {

using testing::Gaussian;

std::unique_ptr<Codec> Make(const std::string& text) {
  auto spec = CodecSpec::Parse(text);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  auto c = CreateCodec(*spec);
  EXPECT_TRUE(c.ok());
  return std::move(c).value();
}

std::vector<float> RoundTrip(const Codec& c, const std::vector<float>& x,
                             uint64_t seed = 1) {
  std::vector<uint8_t> p;
  Status st = c.Encode(x.data(), x.size(), seed, &p);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_LE(p.size(), c.MaxEncodedBytes(x.size()));
  std::vector<float> y(x.size(), 123.0f);
  st = CodecForId(c.id()).Decode(p.data(), p.size(), x.size(), y.data());
  EXPECT_TRUE(st.ok()) << st.ToString();
  return y;
}

const char* kAllSpecs[] = {"none",
                           "fp16",
                           "bf16",
                           "int8",
                           "int8:bucket=64",
                           "qsgd",
                           "qsgd:levels=16,bucket=64",
                           "qsgd:levels=1,bucket=8",
                           "terngrad",
                           "sign",
                           "sign:bucket=8",
                           "topk:ratio=0.01",
                           "topk:ratio=0.3,mode=sampled",
                           "randomk:ratio=0.1"};

class AllCodecsTest : public ::testing::TestWithParam<const char*> {};

TEST_P(AllCodecsTest, DecodeAddMatchesDecodeAndPayloadIsDeterministic) {
  auto c = Make(GetParam());
  for (size_t n : {0, 1, 7, 8, 9, 513, 1000, 5003, 20000}) {
    auto x = Gaussian(n, n + 7);
    std::vector<uint8_t> p1, p2;
    ASSERT_TRUE(c->Encode(x.data(), n, 42, &p1).ok());
    ASSERT_TRUE(c->Encode(x.data(), n, 42, &p2).ok());
    EXPECT_EQ(p1, p2) << "same seed must give same bytes";
    EXPECT_EQ(p1[1], static_cast<uint8_t>(c->id()));
    EXPECT_LE(p1.size(), c->MaxEncodedBytes(n));
    ASSERT_TRUE(c->Validate(p1.data(), p1.size(), n).ok());
    std::vector<float> dec(n, -1.0f);
    ASSERT_TRUE(c->Decode(p1.data(), p1.size(), n, dec.data()).ok());
    std::vector<float> acc = Gaussian(n, 99);
    std::vector<float> expect = acc;
    for (size_t i = 0; i < n; ++i) expect[i] += -0.5f * dec[i];
    ASSERT_TRUE(CodecForId(c->id())
                    .DecodeAdd(p1.data(), p1.size(), n, -0.5f, acc.data())
                    .ok());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(acc[i], expect[i], 1e-5f * (1 + std::fabs(expect[i]))) << i;
    }
    // DecodeAddAny dispatches on the header.
    std::vector<float> zero(n, 0.0f);
    ASSERT_TRUE(DecodeAddAny(p1.data(), p1.size(), n, 1.0f, zero.data()).ok());
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(zero[i], dec[i]);
  }
}

TEST_P(AllCodecsTest, LossyCodecsRejectNonFiniteInput) {
  auto c = Make(GetParam());
  if (c->id() == CodecId::kNone || c->id() == CodecId::kFp16 ||
      c->id() == CodecId::kBf16 || c->id() == CodecId::kRandomK) {
    GTEST_SKIP() << "passes non-finite values through / samples";
  }
  for (float bad : {std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    auto x = Gaussian(5000, 3);
    x[4321] = bad;
    std::vector<uint8_t> p;
    Status st = c->Encode(x.data(), x.size(), 1, &p);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, AllCodecsTest, ::testing::ValuesIn(kAllSpecs));

TEST(NoneCodecTest, Exact) {
  auto x = Gaussian(1001, 1);
  EXPECT_EQ(RoundTrip(*Make("none"), x), x);
}

// ---- fp16 / bf16 -------------------------------------------------------

double HalfValue(uint16_t h) {  // reference decoding with ldexp
  const int e = (h >> 10) & 31, m = h & 1023;
  const double s = (h & 0x8000) ? -1 : 1;
  if (e == 0) return s * std::ldexp(m, -24);
  if (e == 31) return m ? std::nan("") : s * INFINITY;
  return s * std::ldexp(1024 + m, e - 25);
}

TEST(HalfTest, DecodesEveryHalfAndRoundTripsIt) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = internal::HalfToFloat(static_cast<uint16_t>(h));
    const double ref = HalfValue(static_cast<uint16_t>(h));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_TRUE(std::isnan(internal::HalfToFloat(internal::FloatToHalf(f))));
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), ref) << h;
    ASSERT_EQ(internal::FloatToHalf(f), h) << h;
  }
}

TEST(HalfTest, RoundsToNearestEven) {
  // Midpoints between consecutive finite halves round to the even one;
  // points just off the midpoint round to the nearer one.
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const double a = HalfValue(h), b = HalfValue(h + 1);
    const float mid = static_cast<float>((a + b) / 2);  // exact in float
    const uint16_t even = (h % 2 == 0) ? h : h + 1;
    ASSERT_EQ(internal::FloatToHalf(mid), even) << h;
    ASSERT_EQ(internal::FloatToHalf(-mid), even | 0x8000) << h;
    ASSERT_EQ(internal::FloatToHalf(std::nextafter(mid, -1.0f)), h) << h;
    ASSERT_EQ(internal::FloatToHalf(std::nextafter(mid, 1e9f)), h + 1) << h;
  }
  EXPECT_EQ(internal::FloatToHalf(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(internal::FloatToHalf(65519.99f), 0x7bff);
  EXPECT_EQ(internal::FloatToHalf(1e-9f), 0);
  EXPECT_EQ(internal::FloatToHalf(-1e30f), 0xfc00);
}

TEST(HalfTest, Fp16CodecErrorWithinHalfUlp) {
  auto x = Gaussian(10000, 5, 100.0f);
  auto y = RoundTrip(*Make("fp16"), x);
  for (size_t i = 0; i < x.size(); ++i) {
    const double a = std::fabs(x[i]);
    // Half-precision ulp at |x|: 2^(e-10), subnormal floor 2^-24.
    const double ulp =
        std::max(std::ldexp(1.0, std::ilogb(a) - 10), std::ldexp(1.0, -24));
    ASSERT_LE(std::fabs(x[i] - y[i]), ulp / 2) << x[i];
  }
}

TEST(Bf16Test, RoundsToNearestEven) {
  auto x = Gaussian(10000, 6, 1e3f);
  auto y = RoundTrip(*Make("bf16"), x);
  for (size_t i = 0; i < x.size(); ++i) {
    const double ulp = std::ldexp(1.0, std::ilogb(std::fabs(x[i])) - 7);
    ASSERT_LE(std::fabs(x[i] - y[i]), ulp / 2) << x[i];
    uint32_t b;
    std::memcpy(&b, &y[i], 4);
    ASSERT_EQ(b & 0xffff, 0u);
  }
  // Ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> even (1).
  EXPECT_EQ(internal::FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(internal::FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(internal::Bf16ToFloat(
      internal::FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(internal::FloatToBf16(std::numeric_limits<float>::infinity()),
            0x7f80);
}

// ---- int8 --------------------------------------------------------------

TEST(Int8Test, ErrorWithinHalfStep) {
  for (int bucket : {8, 64, 512}) {
    auto x = Gaussian(10007, bucket);
    x[17] = 1000.0f;  // an outlier only hurts its own bucket
    auto c = Make("int8:bucket=" + std::to_string(bucket));
    auto y = RoundTrip(*c, x);
    for (size_t lo = 0; lo < x.size(); lo += bucket) {
      const size_t hi = std::min(x.size(), lo + bucket);
      float m = 0;
      for (size_t i = lo; i < hi; ++i) m = std::max(m, std::fabs(x[i]));
      const double step = m / 127.0;
      for (size_t i = lo; i < hi; ++i) {
        ASSERT_LE(std::fabs(x[i] - y[i]), step * 0.5 * (1 + 1e-5) + 1e-30) << i;
      }
    }
  }
}

TEST(Int8Test, ZeroBucketAndPayloadSize) {
  std::vector<float> x(1000, 0.0f);
  auto c = Make("int8:bucket=512");
  EXPECT_EQ(RoundTrip(*c, x), x);
  std::vector<uint8_t> p;
  ASSERT_TRUE(c->Encode(x.data(), x.size(), 0, &p).ok());
  EXPECT_EQ(p.size(), kPayloadHeaderBytes + 2 * 4 + 1000);
}

// ---- stochastic quantisers: unbiasedness --------------------------------

// Mean of `draws` decodes with different seeds. Each decoded element takes
// one of two adjacent values `range` apart, so by Hoeffding
// P(|mean - x| >= 4 range / sqrt(draws)) <= 2 exp(-32) per element.
void ExpectUnbiased(const Codec& c, const std::vector<float>& x,
                    const std::vector<double>& range, int draws) {
  std::vector<double> mean(x.size(), 0.0);
  std::vector<float> y(x.size());
  std::vector<uint8_t> p;
  for (int d = 0; d < draws; ++d) {
    ASSERT_TRUE(c.Encode(x.data(), x.size(), 1000 + d, &p).ok());
    ASSERT_TRUE(c.Decode(p.data(), p.size(), x.size(), y.data()).ok());
    for (size_t i = 0; i < x.size(); ++i) mean[i] += y[i];
  }
  for (size_t i = 0; i < x.size(); ++i) {
    mean[i] /= draws;
    const double tol = 4 * range[i] / std::sqrt(draws) + 1e-6 * range[i];
    EXPECT_NEAR(mean[i], x[i], tol) << "element " << i;
  }
}

TEST(QsgdTest, UnbiasedAndBounded) {
  for (int levels : {1, 4, 16}) {
    const int bucket = 64;
    auto c = Make("qsgd:levels=" + std::to_string(levels) +
                  ",bucket=" + std::to_string(bucket));
    auto x = Gaussian(200, levels);
    std::vector<double> range(x.size());
    for (size_t lo = 0; lo < x.size(); lo += bucket) {
      double ss = 0;
      const size_t hi = std::min(x.size(), lo + bucket);
      for (size_t i = lo; i < hi; ++i) ss += double(x[i]) * x[i];
      for (size_t i = lo; i < hi; ++i) range[i] = std::sqrt(ss) / levels;
    }
    ExpectUnbiased(*c, x, range, 4000);
    // Every decoded value is a multiple of norm/levels adjacent to x.
    auto y = RoundTrip(*c, x, 77);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_LE(std::fabs(y[i] - x[i]), range[i] * (1 + 1e-5)) << i;
      ASSERT_TRUE(y[i] == 0 || (y[i] > 0) == (x[i] > 0)) << i;
    }
  }
}

// The stochastic-rounding stream (format.h): over 2^20 consecutive elements
// (the counters an encoder uses), single values and pairs at lag 1 and lag 8
// (the AVX2 lane stride) of the top, middle and low 6 of Uniform's 24 bits
// are uniform by a chi-square test. z = (chi2 - dof) / sqrt(2 dof); a good
// generator gives |z| < 5 with probability > 1 - 1e-6.
TEST(UniformStreamTest, ValuesAndPairsAreUniform) {
  const uint32_t kN = 1u << 20;
  auto z = [](const std::vector<double>& cells, double total) {
    const double e = total / static_cast<double>(cells.size());
    double chi2 = 0;
    for (double c : cells) chi2 += (c - e) * (c - e) / e;
    const double dof = static_cast<double>(cells.size() - 1);
    return (chi2 - dof) / std::sqrt(2 * dof);
  };
  for (uint32_t key :
       {internal::SeedKey(0), internal::SeedKey(12345), 0u, 0xfffffff0u}) {
    for (int shift : {18, 9, 0}) {  // the top, middle and low 6 bits
      std::vector<double> one(64, 0), lag1(4096, 0), lag8(4096, 0);
      std::vector<uint32_t> v(kN);
      for (uint32_t i = 0; i < kN; ++i) {
        const float u = internal::Uniform(key, i);
        ASSERT_TRUE(u >= 0.0f && u < 1.0f);
        v[i] = (static_cast<uint32_t>(u * 16777216.0f) >> shift) & 63;
        one[v[i]] += 1;
        if (i >= 1) lag1[v[i - 1] * 64 + v[i]] += 1;
        if (i >= 8) lag8[v[i - 8] * 64 + v[i]] += 1;
      }
      EXPECT_LT(std::fabs(z(one, kN)), 5) << key << " bits " << shift;
      EXPECT_LT(std::fabs(z(lag1, kN - 1)), 5) << key << " bits " << shift;
      EXPECT_LT(std::fabs(z(lag8, kN - 8)), 5) << key << " bits " << shift;
    }
  }
}

TEST(QsgdTest, PacksFourBitsUpToSevenLevels) {
  auto x = Gaussian(1024, 1);
  std::vector<uint8_t> p;
  ASSERT_TRUE(
      Make("qsgd:levels=7,bucket=512")->Encode(x.data(), 1024, 1, &p).ok());
  EXPECT_EQ(p.size(), kPayloadHeaderBytes + 8 + 512);
  ASSERT_TRUE(
      Make("qsgd:levels=8,bucket=512")->Encode(x.data(), 1024, 1, &p).ok());
  EXPECT_EQ(p.size(), kPayloadHeaderBytes + 8 + 1024);
}

TEST(TernGradTest, UnbiasedTernary) {
  const int bucket = 64;
  auto c = Make("terngrad:bucket=64");
  auto x = Gaussian(200, 9);
  std::vector<double> range(x.size());
  for (size_t lo = 0; lo < x.size(); lo += bucket) {
    float m = 0;
    const size_t hi = std::min(x.size(), lo + bucket);
    for (size_t i = lo; i < hi; ++i) m = std::max(m, std::fabs(x[i]));
    for (size_t i = lo; i < hi; ++i) range[i] = m;
  }
  ExpectUnbiased(*c, x, range, 4000);
  auto y = RoundTrip(*c, x, 5);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(y[i] == 0 || std::fabs(y[i]) == static_cast<float>(range[i]))
        << i;
    ASSERT_TRUE(y[i] == 0 || (y[i] > 0) == (x[i] > 0)) << i;
  }
  EXPECT_NE(RoundTrip(*c, x, 5), RoundTrip(*c, x, 6));  // seed matters
}

TEST(SignTest, SignTimesBucketMeanAbs) {
  for (int bucket : {8, 512}) {
    auto c = Make("sign:bucket=" + std::to_string(bucket));
    auto x = Gaussian(3001, 4);
    auto y = RoundTrip(*c, x);
    for (size_t lo = 0; lo < x.size(); lo += bucket) {
      const size_t hi = std::min(x.size(), lo + bucket);
      double s = 0;
      for (size_t i = lo; i < hi; ++i) s += std::fabs(x[i]);
      s /= (hi - lo);
      for (size_t i = lo; i < hi; ++i) {
        ASSERT_NEAR(std::fabs(y[i]), s, 1e-5 * s) << i;
        ASSERT_EQ(y[i] < 0, x[i] < 0) << i;
      }
    }
  }
  std::vector<uint8_t> p;
  std::vector<float> x(1024, 1.0f);
  ASSERT_TRUE(Make("sign:bucket=512")->Encode(x.data(), 1024, 0, &p).ok());
  EXPECT_EQ(p.size(), kPayloadHeaderBytes + 8 + 128);  // 1 bit per element
}

// ---- random-k ------------------------------------------------------------

TEST(RandomKTest, OneIndexPerStratumFromTheSeed) {
  const size_t n = 10000;
  auto x = Gaussian(n, 11);
  auto c = Make("randomk:ratio=0.01");
  std::vector<uint8_t> p;
  ASSERT_TRUE(c->Encode(x.data(), n, 7, &p).ok());
  EXPECT_EQ(p.size(), kPayloadHeaderBytes + 4 * 100);  // no indices on the wire
  auto view = ParseSparse(p.data(), p.size(), n);
  ASSERT_TRUE(view.ok());
  ASSERT_EQ(view->k(), 100u);
  std::vector<float> y(n);
  ASSERT_TRUE(c->Decode(p.data(), p.size(), n, y.data()).ok());
  size_t nonzero = 0;
  for (size_t j = 0; j < view->k(); ++j) {
    const uint32_t i = view->index(j);
    EXPECT_GE(i, j * 100);
    EXPECT_LT(i, (j + 1) * 100);
    EXPECT_EQ(view->value(j), x[i]);
    EXPECT_EQ(y[i], x[i]);
  }
  for (float v : y) nonzero += v != 0;
  EXPECT_EQ(nonzero, 100u);
  // Another seed picks other indices; every index is reachable.
  std::set<uint32_t> seen;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    ASSERT_TRUE(c->Encode(x.data(), n, seed, &p).ok());
    auto v = ParseSparse(p.data(), p.size(), n);
    ASSERT_TRUE(v.ok());
    seen.insert(v->index(0));
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(SparseViewTest, RejectsDenseCodecs) {
  auto x = Gaussian(100, 1);
  std::vector<uint8_t> p;
  ASSERT_TRUE(Make("fp16")->Encode(x.data(), 100, 0, &p).ok());
  EXPECT_EQ(ParseSparse(p.data(), p.size(), 100).status().code(),
            StatusCode::kInvalidArgument);
  int calls = 0;
  EXPECT_FALSE(ForEachSparse(p.data(), p.size(), 100, [&](uint32_t, float) {
                 ++calls;
               }).ok());
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace asyncps::compression
