// DeviceCodec tests. Need a visible CUDA device (label: gpu); they skip
// otherwise, and in builds without CUDA only the stub contract is checked.
#include <gtest/gtest.h>

#include <limits>

#include "compression/codec.h"
#include "compression/cuda_codec.h"
#include "compression/test_util.h"

#if defined(ASYNCPS_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace asyncps::compression {
namespace {

using testing::Gaussian;

#if !defined(ASYNCPS_WITH_CUDA)

TEST(DeviceCodecTest, StubIsUnimplemented) {
  EXPECT_FALSE(DeviceCodec::DeviceAvailable());
  auto dc = DeviceCodec::Create(*CodecSpec::Parse("int8"));
  ASSERT_TRUE(dc.ok());
  std::vector<uint8_t> out;
  EXPECT_EQ((*dc)->EncodeDevice(nullptr, 0, 0, &out).code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ((*dc)->DecodeDevice(nullptr, 0, 0, nullptr).code(),
            StatusCode::kUnimplemented);
}

#else

// Device copy of a host vector, freed on scope exit.
class DeviceFloats {
 public:
  explicit DeviceFloats(const std::vector<float>& h) : n_(h.size()) {
    EXPECT_EQ(cudaMalloc(&p_, 4 * (n_ + 1)), cudaSuccess);
    if (n_) {
      EXPECT_EQ(cudaMemcpy(p_, h.data(), 4 * n_, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  ~DeviceFloats() { cudaFree(p_); }
  float* get() { return p_; }
  std::vector<float> ToHost() const {
    std::vector<float> h(n_);
    if (n_) {
      EXPECT_EQ(cudaMemcpy(h.data(), p_, 4 * n_, cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return h;
  }

 private:
  float* p_ = nullptr;
  size_t n_;
};

class DeviceCodecTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!DeviceCodec::DeviceAvailable())
      GTEST_SKIP() << "no CUDA device visible";
  }
};

TEST_P(DeviceCodecTest, ByteIdenticalToCpuAndDecodesIdentically) {
  auto spec = CodecSpec::Parse(GetParam());
  ASSERT_TRUE(spec.ok());
  auto dc = DeviceCodec::Create(*spec);
  ASSERT_TRUE(dc.ok()) << dc.status().ToString();
  CodecSpec cpu_spec = *spec;
  cpu_spec.sampled = false;  // the GPU's sampled top-k is the exact one
  auto cpu = CreateCodec(cpu_spec);
  ASSERT_TRUE(cpu.ok());
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1037}, size_t{65536},
                   (size_t{1} << 20) + 3}) {
    auto x = Gaussian(n, n + 1);
    if (n > 100) x[50] = x[60] = 9.0f;  // a tie among the largest
    DeviceFloats dx(x);
    for (uint64_t seed : {uint64_t{1}, uint64_t{12345}}) {
      std::vector<uint8_t> gpu_bytes, cpu_bytes;
      Status st = (*dc)->EncodeDevice(dx.get(), n, seed, &gpu_bytes);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ASSERT_TRUE((*cpu)->Encode(x.data(), n, seed, &cpu_bytes).ok());
      ASSERT_EQ(gpu_bytes.size(), cpu_bytes.size()) << GetParam() << " n=" << n;
      size_t first_diff = gpu_bytes.size();
      for (size_t i = 0; i < gpu_bytes.size(); ++i) {
        if (gpu_bytes[i] != cpu_bytes[i]) {
          first_diff = i;
          break;
        }
      }
      ASSERT_EQ(first_diff, gpu_bytes.size())
          << GetParam() << " n=" << n << ": first differing byte";

      std::vector<float> cpu_dec(n);
      ASSERT_TRUE(
          (*cpu)
              ->Decode(cpu_bytes.data(), cpu_bytes.size(), n, cpu_dec.data())
              .ok());
      DeviceFloats dy(std::vector<float>(n, 3.0f));
      ASSERT_TRUE(
          (*dc)
              ->DecodeDevice(cpu_bytes.data(), cpu_bytes.size(), n, dy.get())
              .ok());
      ASSERT_EQ(dy.ToHost(), cpu_dec);

      auto acc = Gaussian(n, 7);
      std::vector<float> cpu_acc = acc;
      ASSERT_TRUE((*cpu)
                      ->DecodeAdd(cpu_bytes.data(), cpu_bytes.size(), n, -0.5f,
                                  cpu_acc.data())
                      .ok());
      DeviceFloats dacc(acc);
      ASSERT_TRUE((*dc)
                      ->DecodeAddDevice(cpu_bytes.data(), cpu_bytes.size(), n,
                                        -0.5f, dacc.get())
                      .ok());
      ASSERT_EQ(dacc.ToHost(), cpu_acc);
    }
  }
}

TEST_P(DeviceCodecTest, RejectsNonFiniteAndCorruptPayloads) {
  auto spec = CodecSpec::Parse(GetParam());
  auto dc = DeviceCodec::Create(*spec);
  ASSERT_TRUE(dc.ok());
  const size_t n = 5000;
  auto x = Gaussian(n, 3);
  DeviceFloats dx(x);
  std::vector<uint8_t> p;
  ASSERT_TRUE((*dc)->EncodeDevice(dx.get(), n, 1, &p).ok());
  DeviceFloats dy(std::vector<float>(n, 3.0f));
  // Truncated payloads fail before touching the device buffer.
  for (size_t len : {size_t{0}, size_t{10}, p.size() - 1}) {
    EXPECT_FALSE((*dc)->DecodeDevice(p.data(), len, n, dy.get()).ok());
  }
  EXPECT_FALSE((*dc)->DecodeDevice(p.data(), p.size(), n + 1, dy.get()).ok());
  EXPECT_EQ(dy.ToHost(), std::vector<float>(n, 3.0f));
  if (spec->id == CodecId::kNone || spec->id == CodecId::kFp16 ||
      spec->id == CodecId::kBf16) {
    return;
  }
  x[4000] = std::numeric_limits<float>::quiet_NaN();
  DeviceFloats dbad(x);
  if (spec->id == CodecId::kRandomK) return;  // only sampled values are checked
  EXPECT_EQ((*dc)->EncodeDevice(dbad.get(), n, 1, &p).code(),
            StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, DeviceCodecTest,
    ::testing::Values("none", "fp16", "bf16", "int8", "int8:bucket=8", "qsgd",
                      "qsgd:levels=16,bucket=64", "qsgd:levels=1,bucket=8",
                      "terngrad", "terngrad:bucket=8", "sign", "sign:bucket=8",
                      "topk:ratio=0.01", "topk:ratio=0.3",
                      "topk:ratio=0.01,mode=sampled", "randomk:ratio=0.01"));

#endif

}  // namespace
}  // namespace asyncps::compression
