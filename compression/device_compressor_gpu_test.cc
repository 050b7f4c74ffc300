// DeviceCompressor vs Compressor: same payloads (bytes), residuals (bits)
// and stats over several steps, for every codec with and without error
// feedback, DGC momentum and warm-up. Need a visible CUDA device (label:
// gpu); they skip otherwise.
#include <gtest/gtest.h>

#include <cstring>

#include "compression/compressor.h"
#include "compression/cuda_codec.h"
#include "compression/device_compressor.h"
#include "compression/test_util.h"

#if defined(ASYNCPS_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace asyncps::compression {
namespace {

using testing::Gaussian;

#if defined(ASYNCPS_WITH_CUDA)

// Device buffer of n floats, freed on scope exit.
class DeviceVec {
 public:
  explicit DeviceVec(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, 4 * (n_ + 1)), cudaSuccess);
  }
  ~DeviceVec() { cudaFree(p_); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  void Set(const std::vector<float>& h) {
    ASSERT_EQ(h.size(), n_);
    if (n_) {
      ASSERT_EQ(cudaMemcpy(p_, h.data(), 4 * n_, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  float* get() { return p_; }

 private:
  float* p_ = nullptr;
  size_t n_;
};

// Index of the first differing bit pattern, or -1.
long FirstBitDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], 4) != 0) return static_cast<long>(i);
  }
  return -1;
}

class DeviceCompressorTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!DeviceCodec::DeviceAvailable())
      GTEST_SKIP() << "no CUDA device visible";
  }
};

TEST_P(DeviceCompressorTest, SamePayloadsResidualsAndStatsAsCompressor) {
  auto spec = CodecSpec::Parse(GetParam());
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  CompressorOptions o;
  o.spec = *spec;
  o.seed = 1234;
  // One chunk below min_elems (raw), an odd one, a large one.
  const std::vector<size_t> sizes = {100, 5003, 70000, (size_t{1} << 20) + 3};
  auto cpu = Compressor::Create(o, sizes);
  auto gpu = DeviceCompressor::Create(o, sizes);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  std::vector<std::unique_ptr<DeviceVec>> dg;
  for (size_t n : sizes) dg.push_back(std::make_unique<DeviceVec>(n));
  std::vector<uint8_t> a, b;
  std::vector<float> res;
  for (uint64_t step = 0; step < 6; ++step) {
    const double epoch = 0.4 * static_cast<double>(step);  // crosses warm-up
    for (size_t c = 0; c < sizes.size(); ++c) {
      SCOPED_TRACE("step " + std::to_string(step) + " chunk " +
                   std::to_string(c));
      const auto g = Gaussian(sizes[c], 100 * step + c + 1, 0.01f);
      dg[c]->Set(g);
      auto ia = (*cpu)->Compress(c, g.data(), epoch, step, &a);
      auto ib = (*gpu)->Compress(c, dg[c]->get(), epoch, step, &b);
      ASSERT_TRUE(ia.ok()) << ia.status().ToString();
      ASSERT_TRUE(ib.ok()) << ib.status().ToString();
      EXPECT_EQ(*ia, *ib);
      ASSERT_EQ(a.size(), b.size());
      ASSERT_TRUE(a == b) << "payloads differ";
      ASSERT_TRUE((*gpu)->ResidualToHost(c, &res).ok());
      EXPECT_EQ(FirstBitDiff(res, (*cpu)->residual(c)), -1)
          << "residuals differ";
    }
  }
  EXPECT_EQ((*gpu)->stats().raw_bytes, (*cpu)->stats().raw_bytes);
  EXPECT_EQ((*gpu)->stats().wire_bytes, (*cpu)->stats().wire_bytes);
  EXPECT_EQ((*gpu)->stats().chunks, (*cpu)->stats().chunks);
  EXPECT_GT((*gpu)->stats().encode_ns, 0u);
  EXPECT_EQ((*gpu)->RatioAt(0.5), (*cpu)->RatioAt(0.5));
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, DeviceCompressorTest,
    ::testing::Values("fp16:ef=1", "bf16:ef=1", "int8:ef=1", "int8",
                      "sign:ef=1", "qsgd:levels=4,ef=1", "terngrad:ef=1",
                      "topk:ratio=0.01,ef=1", "topk:ratio=0.01",
                      "randomk:ratio=0.01,ef=1",
                      "topk:ratio=0.01,ef=1,momentum=0.9,warmup_epochs=2",
                      "randomk:ratio=0.02,ef=1,momentum=0.9,warmup_epochs=1"));

TEST(DeviceCompressorMiscTest, MomentumMaskedWhereSentAndCopyToHost) {
  if (!DeviceCodec::DeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  CompressorOptions o;
  o.spec = *CodecSpec::Parse("topk:ratio=0.01,ef=1,momentum=0.9");
  const size_t n = 10000;
  auto gpu = DeviceCompressor::Create(o, {n});
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  DeviceVec d(n);
  const auto g = Gaussian(n, 7);
  d.Set(g);
  std::vector<uint8_t> out;
  ASSERT_TRUE((*gpu)->Compress(0, d.get(), 0, 0, &out).ok());
  std::vector<float> u, v;
  ASSERT_TRUE((*gpu)->MomentumToHost(0, &u).ok());
  ASSERT_TRUE((*gpu)->ResidualToHost(0, &v).ok());
  ASSERT_EQ(u.size(), n);
  size_t sent = 0;
  ASSERT_TRUE(
      ForEachSparse(out.data(), out.size(), n, [&](uint32_t i, float val) {
        EXPECT_EQ(u[i], 0.0f);
        EXPECT_EQ(v[i], 0.0f);
        EXPECT_EQ(val, g[i]);
        ++sent;
      }).ok());
  EXPECT_EQ(sent, 100u);
  std::vector<float> back(n);
  ASSERT_TRUE((*gpu)->CopyToHost(d.get(), n, back.data()).ok());
  EXPECT_EQ(back, g);
  // Bad arguments.
  EXPECT_EQ((*gpu)->Compress(1, d.get(), 0, 0, &out).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*gpu)->Compress(0, nullptr, 0, 0, &out).status().code(),
            StatusCode::kInvalidArgument);
}

#else

TEST(DeviceCompressorTest, UnavailableWithoutCuda) {
  CompressorOptions o;
  o.spec = *CodecSpec::Parse("int8:ef=1");
  EXPECT_EQ(DeviceCompressor::Create(o, {4096}).status().code(),
            StatusCode::kUnavailable);
}

#endif

}  // namespace
}  // namespace asyncps::compression
