#include "compression/compressor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "compression/cuda_codec.h"
#include "compression/device_compressor.h"
#include "compression/test_util.h"

namespace asyncps::compression {
namespace {

using testing::Gaussian;

std::unique_ptr<Compressor> MakeCompressor(const std::string& text,
                                           const std::vector<size_t>& sizes,
                                           uint64_t seed = 1) {
  auto spec = CodecSpec::Parse(text);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  CompressorOptions opt;
  opt.spec = *spec;
  opt.seed = seed;
  auto c = Compressor::Create(opt, sizes);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

// transmitted + residual == sum of gradients, for every EF codec.
TEST(CompressorTest, ErrorFeedbackInvariant) {
  for (const char* text :
       {"int8:ef=1", "qsgd:levels=2,ef=1", "terngrad:ef=1", "sign:ef=1",
        "fp16:ef=1", "topk:ratio=0.01,ef=1",
        "topk:ratio=0.01,mode=sampled,ef=1", "randomk:ratio=0.02,ef=1"}) {
    const std::vector<size_t> sizes = {5000, 3000};
    auto comp = MakeCompressor(text, sizes);
    for (size_t chunk = 0; chunk < sizes.size(); ++chunk) {
      const size_t n = sizes[chunk];
      std::vector<double> sent(n, 0.0), fed(n, 0.0), scale(n, 0.0);
      std::vector<uint8_t> out;
      std::vector<float> dec(n);
      for (uint64_t step = 0; step < 30; ++step) {
        auto g = Gaussian(n, step * 31 + chunk);
        for (size_t i = 0; i < n; ++i) fed[i] += g[i];
        auto used = comp->Compress(chunk, g.data(), 0.0, step, &out);
        ASSERT_TRUE(used.ok()) << used.status().ToString();
        ASSERT_EQ(*used, comp->spec().id);
        ASSERT_TRUE(CodecForId(*used)
                        .Decode(out.data(), out.size(), n, dec.data())
                        .ok());
        for (size_t i = 0; i < n; ++i) {
          sent[i] += dec[i];
          scale[i] += std::fabs(dec[i]) + std::fabs(g[i]);
        }
      }
      const auto& r = comp->residual(chunk);
      ASSERT_EQ(r.size(), n);
      // Only float rounding of acc = residual + g and residual = acc - dec,
      // each at most an ulp of the operands' magnitude per step.
      for (size_t i = 0; i < n; ++i) {
        ASSERT_NEAR(sent[i] + r[i], fed[i],
                    1e-6 * (scale[i] + std::fabs(r[i])) + 1e-9)
            << text << " element " << i;
      }
      if (comp->spec().id == CodecId::kTopK) {
        // Error feedback makes top-k eventually send everything: the residual
        // stays bounded instead of growing like the fed sum.
        double rmax = 0;
        for (float v : r) rmax = std::max<double>(rmax, std::fabs(v));
        EXPECT_LT(rmax, 60.0) << text;
      }
    }
  }
}

TEST(CompressorTest, SmallChunksTravelUncompressed) {
  auto comp = MakeCompressor("int8:ef=1", {100, 2000});
  auto g = Gaussian(100, 1);
  std::vector<uint8_t> out;
  auto used = comp->Compress(0, g.data(), 0, 0, &out);
  ASSERT_TRUE(used.ok());
  EXPECT_EQ(*used, CodecId::kNone);
  std::vector<float> y(100);
  ASSERT_TRUE(CodecForId(CodecId::kNone)
                  .Decode(out.data(), out.size(), 100, y.data())
                  .ok());
  EXPECT_EQ(y, g);
  EXPECT_TRUE(comp->residual(0).empty());
  auto g2 = Gaussian(2000, 2);
  used = comp->Compress(1, g2.data(), 0, 0, &out);
  ASSERT_TRUE(used.ok());
  EXPECT_EQ(*used, CodecId::kInt8);
  const auto& st = comp->stats();
  EXPECT_EQ(st.chunks, 2u);
  EXPECT_EQ(st.raw_bytes, 4u * 2100);
  EXPECT_EQ(st.wire_bytes, (kPayloadHeaderBytes + 400) + out.size());
  EXPECT_LT(st.wire_bytes, st.raw_bytes);

  auto tiny = MakeCompressor("int8:min_elems=10", {16});
  used = tiny->Compress(0, g.data(), 0, 0, &out);
  ASSERT_TRUE(used.ok());
  EXPECT_EQ(*used, CodecId::kInt8);
}

TEST(CompressorTest, DgcMomentumCorrectionMatchesReference) {
  const size_t n = 4000;
  const float m = 0.9f;
  auto comp = MakeCompressor("topk:ratio=0.01,ef=1,momentum=0.9", {n});
  std::vector<float> u(n, 0.0f), v(n, 0.0f);
  std::vector<uint8_t> out;
  for (uint64_t step = 0; step < 20; ++step) {
    auto g = Gaussian(n, 100 + step);
    for (size_t i = 0; i < n; ++i) {
      u[i] = m * u[i] + g[i];
      v[i] += u[i];
    }
    // Reference exact top-40 of v.
    std::vector<uint32_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) {
      return std::fabs(v[a]) > std::fabs(v[b]);
    });
    idx.resize(40);
    std::sort(idx.begin(), idx.end());
    auto used = comp->Compress(0, g.data(), 1.0, step, &out);
    ASSERT_TRUE(used.ok());
    std::vector<uint32_t> got;
    ASSERT_TRUE(
        ForEachSparse(out.data(), out.size(), n, [&](uint32_t i, float val) {
          EXPECT_EQ(val, v[i]);
          got.push_back(i);
        }).ok());
    ASSERT_EQ(got, idx) << "step " << step;
    for (uint32_t i : idx) u[i] = v[i] = 0.0f;
    ASSERT_EQ(comp->residual(0), v) << "step " << step;
  }
}

TEST(CompressorTest, SparsityWarmupDecaysExponentially) {
  const size_t n = 100000;
  auto comp =
      MakeCompressor("topk:ratio=0.001,ef=1,momentum=0.9,warmup_epochs=4", {n});
  EXPECT_DOUBLE_EQ(comp->RatioAt(0.0), 0.25);
  EXPECT_NEAR(comp->RatioAt(2.0), std::sqrt(0.25 * 0.001), 1e-12);
  EXPECT_DOUBLE_EQ(comp->RatioAt(4.0), 0.001);
  EXPECT_DOUBLE_EQ(comp->RatioAt(10.0), 0.001);
  double prev = 1;
  for (double e = 0; e <= 4; e += 0.25) {
    EXPECT_LT(comp->RatioAt(e), prev);
    prev = comp->RatioAt(e);
  }
  auto g = Gaussian(n, 1);
  std::vector<uint8_t> out;
  for (double epoch : {0.0, 1.0, 4.0}) {
    ASSERT_TRUE(comp->Compress(0, g.data(), epoch, 0, &out).ok());
    auto view = ParseSparse(out.data(), out.size(), n);
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(view->k(),
              static_cast<size_t>(std::round(comp->RatioAt(epoch) * n)));
  }
}

TEST(CompressorTest, StochasticSeedsDifferPerStepAndChunk) {
  auto comp = MakeCompressor("qsgd:levels=2", {4096, 4096});
  auto g = Gaussian(4096, 1);
  std::vector<uint8_t> a, b, c;
  ASSERT_TRUE(comp->Compress(0, g.data(), 0, 1, &a).ok());
  ASSERT_TRUE(comp->Compress(0, g.data(), 0, 2, &b).ok());
  ASSERT_TRUE(comp->Compress(1, g.data(), 0, 1, &c).ok());
  EXPECT_NE(std::vector<uint8_t>(a.begin() + 24, a.end()),
            std::vector<uint8_t>(b.begin() + 24, b.end()));
  EXPECT_NE(std::vector<uint8_t>(a.begin() + 24, a.end()),
            std::vector<uint8_t>(c.begin() + 24, c.end()));
}

TEST(CompressorTest, Errors) {
  CompressorOptions opt;
  opt.spec.id = CodecId::kInt8;
  opt.spec.bucket = 3;
  EXPECT_FALSE(Compressor::Create(opt, {10}).ok());
  auto comp = MakeCompressor("int8", {10});
  std::vector<uint8_t> out;
  float g[10] = {};
  EXPECT_EQ(comp->Compress(1, g, 0, 0, &out).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(comp->Compress(0, nullptr, 0, 0, &out).ok());
}

// Without a device (or without CUDA in the build) the device path is
// refused up front, so callers fall back to Compressor.
TEST(DeviceCompressorTest, UnavailableWithoutDevice) {
  if (DeviceCodec::DeviceAvailable()) GTEST_SKIP() << "a device is visible";
  CompressorOptions o;
  o.spec = *CodecSpec::Parse("topk:ratio=0.01,ef=1");
  auto d = DeviceCompressor::Create(o, {5000, 3000});
  EXPECT_EQ(d.status().code(), StatusCode::kUnavailable)
      << d.status().ToString();
  o.spec.momentum = 2.0f;  // invalid specs are still InvalidArgument
  EXPECT_EQ(DeviceCompressor::Create(o, {5000}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace asyncps::compression
