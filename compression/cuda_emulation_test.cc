// CPU/GPU byte identity without a GPU: the encode kernels of
// compression/cuda/cuda_codec.cu, transcribed line by line into plain C++
// (each CUDA thread's loop run in turn; the kernels' block-wide reductions
// are order-independent (max) or fixed-order (the 8-lane sums), so thread
// scheduling cannot change a byte), must produce the CPU codecs' payloads
// bit for bit. The CPU side runs whatever this machine dispatches to (the
// AVX2 kernels here); the AVX2 kernels are also compared directly with the
// portable per-element formulas, for every tail length. On a machine with
// a GPU, compression_gpu_test compares the real kernels too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "compression/internal/avx2_kernels.h"
#include "compression/internal/codecs.h"
#include "compression/test_util.h"

namespace asyncps::compression {
namespace {

using internal::Header;

// ---- the kernels, as cuda_codec.cu computes them -------------------------

uint32_t MagBits(float f) { return internal::FloatBits(f) & 0x7fffffffu; }

// BlockLaneSum<kSquare>: thread j < 8 sums elements lo+j, lo+j+8, ...
template <bool kSquare>
float BlockLaneSum(const float* x, uint64_t lo, uint64_t hi) {
  float lanes[8];
  for (uint64_t t = 0; t < 8; ++t) {
    float l = 0.0f;
    for (uint64_t i = lo + t; i < hi; i += 8) {
      const float v = x[i];
      l = l + (kSquare ? v * v : std::fabs(v));
    }
    lanes[t] = l;
  }
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

uint32_t BlockMaxBits(const float* x, uint64_t lo, uint64_t hi) {
  uint32_t m = 0;
  for (uint64_t i = lo; i < hi; ++i) m = std::max(m, MagBits(x[i]));
  return m;
}

int32_t QsgdLevel(float xv, uint32_t i, uint32_t key, float inv, int32_t smax) {
  const float r = std::fabs(xv) * inv;
  const float u = internal::Uniform(key, i);
  int32_t l = static_cast<int32_t>(r + u);
  l = l < smax ? l : smax;
  return xv < 0.0f ? -l : l;
}

// The body the kernels write for codec `id`; false when a kernel flags a
// non-finite input.
bool KernelBody(CodecId id, const float* x, uint64_t n, uint32_t bucket,
                uint32_t levels, uint64_t seed, std::vector<uint8_t>* body) {
  const uint32_t key = internal::SeedKey(seed);
  const uint64_t nb = internal::NumBuckets(n, bucket);
  switch (id) {
    case CodecId::kBf16: {  // HalfEncodeKernel<true>
      body->assign(2 * n, 0);
      for (uint64_t i = 0; i < n; ++i) {
        const uint16_t h = internal::FloatToBf16(x[i]);
        std::memcpy(body->data() + 2 * i, &h, 2);
      }
      return true;
    }
    case CodecId::kQsgd: {  // QsgdEncodeKernel, one block per bucket
      const int bits = internal::QsgdBits(levels);
      body->assign(4 * nb + internal::PackedBytes(n, bits), 0);
      uint8_t* packed = body->data() + 4 * nb;
      for (uint64_t b = 0; b < nb; ++b) {
        const uint64_t lo = b * bucket, hi = std::min(n, lo + bucket);
        const float norm = std::sqrt(BlockLaneSum<true>(x, lo, hi));
        if (!(norm <= 3.402823466e+38f)) return false;
        std::memcpy(body->data() + 4 * b, &norm, 4);
        const float s = static_cast<float>(levels);
        const float inv = norm > 0.0f ? s / norm : 0.0f;
        const int32_t smax = static_cast<int32_t>(levels);
        if (levels > 7) {
          for (uint64_t i = lo; i < hi; ++i) {
            packed[i] = static_cast<uint8_t>(
                QsgdLevel(x[i], static_cast<uint32_t>(i), key, inv, smax));
          }
          continue;
        }
        for (uint64_t i = lo; i < hi; i += 2) {
          const uint32_t q0 = static_cast<uint8_t>(
              QsgdLevel(x[i], static_cast<uint32_t>(i), key, inv, smax));
          uint32_t q1 = 0;
          if (i + 1 < hi) {
            q1 = static_cast<uint8_t>(QsgdLevel(
                x[i + 1], static_cast<uint32_t>(i + 1), key, inv, smax));
          }
          packed[i / 2] = static_cast<uint8_t>((q0 & 15u) | ((q1 & 15u) << 4));
        }
      }
      return true;
    }
    case CodecId::kTernGrad: {  // TernEncodeKernel
      body->assign(4 * nb + internal::PackedBytes(n, 2), 0);
      uint8_t* packed = body->data() + 4 * nb;
      for (uint64_t b = 0; b < nb; ++b) {
        const uint64_t lo = b * bucket, hi = std::min(n, lo + bucket);
        const uint32_t mb = BlockMaxBits(x, lo, hi);
        if (mb >= 0x7f800000u) return false;
        const float m = internal::BitsFloat(mb);
        std::memcpy(body->data() + 4 * b, &m, 4);
        const float inv = m > 0.0f ? 1.0f / m : 0.0f;
        for (uint64_t g = lo; g < hi; g += 4) {
          uint32_t byte = 0;
          for (uint64_t i = g; i < std::min(hi, g + 4); ++i) {
            const float u = internal::Uniform(key, static_cast<uint32_t>(i));
            const uint32_t nz = u < std::fabs(x[i]) * inv ? 1u : 0u;
            const uint32_t neg = x[i] < 0.0f ? 2u : 0u;
            byte |= (nz | (neg & (nz << 1))) << (2 * (i - g));
          }
          packed[g / 4] = static_cast<uint8_t>(byte);
        }
      }
      return true;
    }
    case CodecId::kSign: {  // SignEncodeKernel
      body->assign(4 * nb + internal::PackedBytes(n, 1), 0);
      uint8_t* packed = body->data() + 4 * nb;
      for (uint64_t b = 0; b < nb; ++b) {
        const uint64_t lo = b * bucket, hi = std::min(n, lo + bucket);
        const float sum = BlockLaneSum<false>(x, lo, hi);
        if (!(sum <= 3.402823466e+38f)) return false;
        const float scale = sum / static_cast<float>(hi - lo);
        std::memcpy(body->data() + 4 * b, &scale, 4);
        for (uint64_t g = lo; g < hi; g += 8) {
          uint32_t byte = 0;
          for (uint64_t i = g; i < std::min(hi, g + 8); ++i) {
            byte |= (x[i] < 0.0f ? 1u : 0u) << (i - g);
          }
          packed[g / 8] = static_cast<uint8_t>(byte);
        }
      }
      return true;
    }
    default:
      return false;
  }
}

// The whole payload the GPU path returns (EncodeImpl: header, then body).
bool KernelPayload(const CodecSpec& spec, const std::vector<float>& x,
                   uint64_t seed, std::vector<uint8_t>* out) {
  std::vector<uint8_t> body;
  const uint32_t bucket = static_cast<uint32_t>(spec.bucket);
  const uint32_t levels = static_cast<uint32_t>(spec.levels);
  if (!KernelBody(spec.id, x.data(), x.size(), bucket, levels, seed, &body)) {
    return false;
  }
  Header h;
  h.codec = static_cast<uint8_t>(spec.id);
  h.n = static_cast<uint32_t>(x.size());
  h.p1 = spec.id == CodecId::kBf16 ? 0 : bucket;
  h.p2 = spec.id == CodecId::kQsgd ? levels : 0;
  h.seed = seed;
  out->assign(kPayloadHeaderBytes, 0);
  internal::WriteHeader(h, out->data());
  out->insert(out->end(), body.begin(), body.end());
  return true;
}

// Inputs with the values that trip vector code: signed zeros, subnormals,
// exact ties, the largest finite magnitudes, equal elements (ties with the
// bucket maximum).
std::vector<float> Awkward(size_t n, uint64_t seed) {
  std::vector<float> x = testing::Gaussian(n, seed);
  const float specials[] = {0.0f,     -0.0f, 1e-40f, -1e-40f, 1.0f,
                            -1.0f,    0.5f,  3e38f,  -3e38f,  1e-30f,
                            65504.0f, -2.5f, 2.5f,   1.5f,    -1.5f};
  for (size_t i = 0; i < n; i += 7) {
    x[i] = specials[(i / 7) % (sizeof(specials) / sizeof(specials[0]))];
  }
  return x;
}

class EmulationTest : public ::testing::TestWithParam<const char*> {};

TEST_P(EmulationTest, CpuPayloadEqualsTheKernelsBitForBit) {
  auto spec = CodecSpec::Parse(GetParam());
  ASSERT_TRUE(spec.ok());
  auto codec = CreateCodec(*spec);
  ASSERT_TRUE(codec.ok());
  int compared = 0;
  for (size_t n : {1,  2,  7,  8,   9,   15,  16,  17,   31,   32,        33,
                   63, 64, 65, 100, 511, 512, 513, 1000, 4099, 65536 + 37}) {
    for (uint64_t seed : {uint64_t{1}, uint64_t{0xdeadbeefcafe}}) {
      for (bool awkward : {false, true}) {
        std::vector<float> x =
            awkward ? Awkward(n, n + seed) : testing::Gaussian(n, n * 3 + seed);
        if (spec->id == CodecId::kQsgd || spec->id == CodecId::kSign) {
          // Sums of squares (qsgd) or magnitudes (sign) of 3e38 overflow:
          // both sides reject those; keep the sums finite here.
          for (float& v : x) {
            if (std::fabs(v) > 1e17f) v = v > 0 ? 1e17f : -1e17f;
          }
        }
        std::vector<uint8_t> cpu, gpu;
        const Status s = (*codec)->Encode(x.data(), n, seed, &cpu);
        const bool ok = KernelPayload(*spec, x, seed, &gpu);
        ASSERT_EQ(s.ok(), ok)
            << GetParam() << " n=" << n << " " << s.ToString();
        if (!ok) continue;
        ASSERT_EQ(cpu.size(), gpu.size()) << GetParam() << " n=" << n;
        for (size_t i = 0; i < cpu.size(); ++i) {
          ASSERT_EQ(cpu[i], gpu[i])
              << GetParam() << " n=" << n << " seed " << seed << " byte " << i;
        }
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 60);
}

TEST_P(EmulationTest, NonFiniteInputIsRejectedLikeTheKernels) {
  auto spec = CodecSpec::Parse(GetParam());
  ASSERT_TRUE(spec.ok());
  if (spec->id == CodecId::kBf16) GTEST_SKIP() << "bf16 encodes NaN";
  auto codec = CreateCodec(*spec);
  ASSERT_TRUE(codec.ok());
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = testing::Gaussian(1000, 3);
    x[777] = bad;
    std::vector<uint8_t> cpu, gpu;
    EXPECT_FALSE((*codec)->Encode(x.data(), x.size(), 1, &cpu).ok());
    EXPECT_FALSE(KernelPayload(*spec, x, 1, &gpu));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Quantisers, EmulationTest,
    ::testing::Values("bf16", "qsgd", "qsgd:levels=1,bucket=8",
                      "qsgd:levels=7,bucket=64", "qsgd:levels=16,bucket=512",
                      "qsgd:levels=127,bucket=8", "terngrad",
                      "terngrad:bucket=8", "sign", "sign:bucket=8",
                      "sign:bucket=64"));

// ---- the AVX2 kernels against the per-element formulas -------------------

TEST(Avx2KernelsTest, MatchThePortableFormulasForEveryTail) {
  if (!internal::HaveAvx2()) GTEST_SKIP() << "this CPU has no AVX2";
  for (size_t len = 0; len <= 100; ++len) {
    // Levels need |x| * inv + 1 < 2^31 (within a bucket |x| <= its norm).
    std::vector<float> x = Awkward(len + 1, len);
    for (float& v : x) v = std::fmax(-1e6f, std::fmin(1e6f, v));
    const uint32_t base = 8 * 1001, key = internal::SeedKey(len);
    // Lane sums.
    float l2[8] = {0}, l1[8] = {0};
    for (size_t i = 0; i < len; ++i) {
      l2[i % 8] += x[i] * x[i];
      l1[i % 8] += std::fabs(x[i]);
    }
    auto combine = [](const float* l) {
      return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    };
    const float s2 = internal::LaneSumSquaresAvx2(x.data(), len);
    const float s1 = internal::LaneSumAbsAvx2(x.data(), len);
    EXPECT_EQ(internal::FloatBits(s2), internal::FloatBits(combine(l2))) << len;
    EXPECT_EQ(internal::FloatBits(s1), internal::FloatBits(combine(l1))) << len;
    // QSGD levels, both packings; TernGrad codes; sign bits; bf16.
    const float inv = 0.37f;
    for (bool nibbles : {false, true}) {
      std::vector<uint8_t> got(len + 8, 0xAA), want(len + 8, 0xAA);
      internal::QsgdLevelsAvx2(x.data(), len, base, key, inv, 5, nibbles,
                               got.data());
      for (size_t i = 0; i < len; ++i) {
        const int32_t l =
            QsgdLevel(x[i], base + static_cast<uint32_t>(i), key, inv, 5);
        if (!nibbles) {
          want[i] = static_cast<uint8_t>(l);
        } else if (i % 2 == 0) {
          want[i / 2] = static_cast<uint8_t>(l & 15);
        } else {
          want[i / 2] = static_cast<uint8_t>(want[i / 2] | ((l & 15) << 4));
        }
      }
      EXPECT_EQ(got, want) << "qsgd len " << len << " nibbles " << nibbles;
    }
    std::vector<uint8_t> got(len / 4 + 8, 0xAA), want(len / 4 + 8, 0xAA);
    internal::TernCodesAvx2(x.data(), len, base, key, inv, got.data());
    for (size_t i = 0; i < len; ++i) {
      if (i % 4 == 0) want[i / 4] = 0;
      const float u = internal::Uniform(key, base + static_cast<uint32_t>(i));
      const uint32_t nz = u < std::fabs(x[i]) * inv ? 1u : 0u;
      const uint32_t neg = x[i] < 0.0f ? 2u : 0u;
      want[i / 4] = static_cast<uint8_t>(
          want[i / 4] | ((nz | (neg & (nz << 1))) << (2 * (i % 4))));
    }
    EXPECT_EQ(got, want) << "terngrad len " << len;
    // TernGrad decoding: every code (2 too, which encoders never write), a
    // zero scale (code 3 gives -0.0), overwrite and add.
    std::vector<uint8_t> codes(len / 4 + 1);
    for (size_t j = 0; j < codes.size(); ++j)
      codes[j] = static_cast<uint8_t>(internal::Mix32(j + len) >> 24);
    for (float m : {0.0f, 0.75f, 3e38f}) {
      for (bool add : {false, true}) {
        std::vector<float> dg(len + 1), dw(len + 1);
        for (size_t i = 0; i <= len; ++i) dg[i] = dw[i] = x[i];
        internal::TernDecodeAvx2(codes.data(), len, m, -1.5f, add, dg.data());
        for (size_t i = 0; i < len; ++i) {
          const uint32_t c = (codes[i / 4] >> (2 * (i % 4))) & 3u;
          const float t = (c & 1u) ? ((c & 2u) ? -1.0f : 1.0f) : 0.0f;
          dw[i] = add ? dw[i] + -1.5f * (t * m) : t * m;
        }
        std::vector<uint32_t> bg(len + 1), bw(len + 1);
        for (size_t i = 0; i <= len; ++i) {
          bg[i] = internal::FloatBits(dg[i]);
          bw[i] = internal::FloatBits(dw[i]);
        }
        EXPECT_EQ(bg, bw) << "terngrad decode len " << len << " m " << m
                          << " add " << add;
        // Sign decoding of the same bytes (one bit per element).
        for (size_t i = 0; i <= len; ++i) dg[i] = dw[i] = x[i];
        internal::SignDecodeAvx2(codes.data(), len, m, -1.5f, add, dg.data());
        for (size_t i = 0; i < len; ++i) {
          const float v = ((codes[i / 8] >> (i % 8)) & 1u) ? -m : m;
          dw[i] = add ? dw[i] + -1.5f * v : v;
        }
        for (size_t i = 0; i <= len; ++i) {
          bg[i] = internal::FloatBits(dg[i]);
          bw[i] = internal::FloatBits(dw[i]);
        }
        EXPECT_EQ(bg, bw) << "sign decode len " << len << " s " << m << " add "
                          << add;
      }
    }
    std::vector<uint8_t> sg(len / 8 + 8, 0xAA), sw(len / 8 + 8, 0xAA);
    internal::SignBitsAvx2(x.data(), len, sg.data());
    for (size_t i = 0; i < len; ++i) {
      if (i % 8 == 0) sw[i / 8] = 0;
      sw[i / 8] = static_cast<uint8_t>(sw[i / 8] | ((x[i] < 0.0f) << (i % 8)));
    }
    EXPECT_EQ(sg, sw) << "sign len " << len;
    std::vector<uint16_t> bg(len + 1, 0xAAAA), bw(len + 1, 0xAAAA);
    std::vector<float> xb = x;
    if (len > 3) {
      xb[1] = std::numeric_limits<float>::quiet_NaN();
      xb[2] = -std::numeric_limits<float>::infinity();
      xb[3] = internal::BitsFloat(0xff800001u);  // a negative signalling NaN
    }
    internal::Bf16EncodeAvx2(xb.data(), len, bg.data());
    for (size_t i = 0; i < len; ++i) bw[i] = internal::FloatToBf16(xb[i]);
    EXPECT_EQ(bg, bw) << "bf16 len " << len;
  }
}

}  // namespace
}  // namespace asyncps::compression
