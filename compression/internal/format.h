// Payload format and the bit-exact scalar primitives shared by the CPU codecs
// and the CUDA kernels (compiled by both g++ and nvcc, so no host-only code).
//
// Every payload (all integers little-endian):
//   offset 0  u8  magic 0xC7
//          1  u8  codec id (CodecId)
//          2  u8  format version (1)
//          3  u8  reserved, 0
//          4  u32 n, element count
//          8  u32 p1: bucket (int8/qsgd/terngrad/sign) or k (topk/randomk)
//         12  u32 p2: levels (qsgd), else 0
//         16  u64 seed (randomk index stream; informational elsewhere)
//         24  body
// Bodies, nb = ceil(n / bucket) and every scale a float32:
//   none      n float32
//   fp16/bf16 n uint16
//   int8      nb scales (max|x|/127), then n int8 (round to nearest even)
//   qsgd      nb L2 norms, then n signed levels: 4-bit two's complement
//             nibbles (low nibble = even element) when levels <= 7, else int8
//   terngrad  nb scales (max|x|), then 2 bits per element, element i at bits
//             2*(i%4) of byte i/4: bit0 = non-zero, bit1 = negative
//   sign      nb scales (mean|x|), then 1 bit per element (bit i%8 of byte
//             i/8), set = negative
//   topk      k uint32 indices (strictly increasing), then k float32 values
//   randomk   k float32 values; index j is drawn in stratum
//             [j*n/k, (j+1)*n/k) from Mix32(j + key), key = SeedKey(seed)
// Stochastic rounding of element i uses Uniform(SeedKey(seed), i): the top
// 24 bits of StreamBits((i + key) * kWeyl) (below).
// Bucket sums (sign's mean, qsgd's norm) run over 8 lanes, lane j adding
// elements j, j+8, ... in order, combined as ((l0+l1)+(l2+l3))+((l4+l5)+
// (l6+l7)), so CPU and GPU produce the same bits.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ASYNCPS_HD __host__ __device__ __forceinline__
#else
#define ASYNCPS_HD inline
#endif

namespace asyncps::compression::internal {

inline constexpr uint8_t kMagic = 0xC7;
inline constexpr uint8_t kVersion = 1;
inline constexpr uint32_t kMaxBucket = 1u << 24;

struct Header {
  uint8_t codec = 0;
  uint32_t n = 0;
  uint32_t p1 = 0;
  uint32_t p2 = 0;
  uint64_t seed = 0;
};

inline void WriteHeader(const Header& h, uint8_t* p) {
  p[0] = kMagic;
  p[1] = h.codec;
  p[2] = kVersion;
  p[3] = 0;
  std::memcpy(p + 4, &h.n, 4);
  std::memcpy(p + 8, &h.p1, 4);
  std::memcpy(p + 12, &h.p2, 4);
  std::memcpy(p + 16, &h.seed, 8);
}

// REQUIRES: at least 24 readable bytes.
inline Header ReadHeader(const uint8_t* p) {
  Header h;
  h.codec = p[1];
  std::memcpy(&h.n, p + 4, 4);
  std::memcpy(&h.p1, p + 8, 4);
  std::memcpy(&h.p2, p + 12, 4);
  std::memcpy(&h.seed, p + 16, 8);
  return h;
}

ASYNCPS_HD uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

ASYNCPS_HD float BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// IEEE binary16, round to nearest even; NaN -> quiet NaN 0x7e00 with sign.
// Branch-free selects so the compiler can vectorise it.
ASYNCPS_HD uint16_t FloatToHalf(float f) {
  uint32_t x = FloatBits(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  // |f| >= 65520 rounds to inf; NaN stays NaN.
  const uint32_t big = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  // |f| < 2^-14: half subnormal; adding 0.5 makes the FPU round for us.
  const uint32_t sub = FloatBits(BitsFloat(x) + 0.5f) - 0x3f000000u;
  // Normal: rebias the exponent and round the 13 dropped bits to even.
  const uint32_t norm =
      (x + (uint32_t(15 - 127) << 23) + 0xfffu + ((x >> 13) & 1u)) >> 13;
  const uint32_t o = x >= 0x477ff000u ? big : (x < 0x38800000u ? sub : norm);
  return static_cast<uint16_t>(o | (sign >> 16));
}

ASYNCPS_HD float HalfToFloat(uint16_t h) {
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t o = (uint32_t(h) & 0x7fffu) << 13;
  const uint32_t exp = shifted_exp & o;
  o += uint32_t(127 - 15) << 23;
  const uint32_t inf_nan = o + (uint32_t(128 - 16) << 23);
  // Subnormal half: renormalise through a float subtraction (exact).
  const uint32_t sub =
      FloatBits(BitsFloat(o + (1u << 23)) - BitsFloat(113u << 23));
  o = exp == shifted_exp ? inf_nan : (exp == 0 ? sub : o);
  return BitsFloat(o | ((uint32_t(h) & 0x8000u) << 16));
}

// bfloat16, round to nearest even; NaN stays a (quiet) NaN.
ASYNCPS_HD uint16_t FloatToBf16(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t nan = (x >> 16) | 0x40u;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

ASYNCPS_HD float Bf16ToFloat(uint16_t h) {
  return BitsFloat(uint32_t(h) << 16);
}

// splitmix64 finaliser.
ASYNCPS_HD uint64_t Mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// 32-bit integer hash (lowbias32, C. Wellons): a counter-based RNG.
ASYNCPS_HD uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x21f0aaadu;
  x ^= x >> 15;
  x *= 0x735a2d97u;
  x ^= x >> 15;
  return x;
}

ASYNCPS_HD uint32_t SeedKey(uint64_t seed) {
  return static_cast<uint32_t>(Mix64(seed) >> 32);
}

// The stochastic-rounding stream: element i's bits are a function of the
// counter i + key alone (counter-based: any element, lane or GPU thread
// computes its own), first multiplied by an odd constant (a Weyl sequence:
// 8 lanes move 8 elements on by one addition), then two xorshift-multiply
// rounds (lowbias32's constants, without its final xorshift: the top 24
// bits are used, and the tests below find them uniform without it; it
// saves two vector operations per 8 elements). Over 2^24 consecutive counters,
// for four keys, 12-bit values and pairs of 6-bit values (at lags 1 and 8)
// taken from the top, middle and low bits of the 24 pass chi-square tests (|z|
// < 3.3), where Mix32 of the bare counter, the stream before, does not (pairs:
// z 15-31 for its bits 12-17, 22-25 for its low bits, 5-6 at lag 8 for its top
// bits).
inline constexpr uint32_t kWeyl = 0x9e3779b9u;
ASYNCPS_HD uint32_t StreamBits(uint32_t w) {
  w ^= w >> 16;
  w *= 0x21f0aaadu;
  w ^= w >> 15;
  return w * 0x735a2d97u;
}

// Uniform in [0, 1) with 24 random bits, for element i.
ASYNCPS_HD float Uniform(uint32_t key, uint32_t i) {
  return static_cast<float>(StreamBits((i + key) * kWeyl) >> 8) *
         (1.0f / 16777216.0f);
}

// Round to nearest even for |t| <= 2^22 without SSE4.1 (vectorisable).
ASYNCPS_HD float RoundNearestEven(float t) {
  return (t + 12582912.0f) - 12582912.0f;
}

// Random-k: the index chosen in stratum j of k over n elements.
ASYNCPS_HD uint32_t RandomKIndex(uint32_t key, uint64_t j, uint64_t n,
                                 uint64_t k) {
  const uint64_t lo = j * n / k;
  const uint64_t hi = (j + 1) * n / k;
  const uint64_t r = Mix32(static_cast<uint32_t>(j) + key);
  return static_cast<uint32_t>(lo + ((r * (hi - lo)) >> 32));
}

// Number of packed body bytes for n elements at `bits` per element.
ASYNCPS_HD uint64_t PackedBytes(uint64_t n, int bits) {
  return (n * static_cast<uint64_t>(bits) + 7) / 8;
}

}  // namespace asyncps::compression::internal
