// AVX2 encoder loops (see compression/internal/avx2_kernels.h). Each main
// loop takes 8 or 32 elements per step; tails run the portable per-element
// formulas of format.h, so every byte equals the scalar code's.
#include "compression/internal/avx2_kernels.h"

#include <array>
#include <cmath>

#include "compression/internal/format.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ASYNCPS_AVX2_KERNELS 1
#include <immintrin.h>
#endif

namespace asyncps::compression::internal {

#ifdef ASYNCPS_AVX2_KERNELS

#define ASYNCPS_AVX2 __attribute__((target("avx2")))

namespace {

// Bit k of b moved to bit 2k: interleaves the two bit planes of TernGrad.
constexpr std::array<uint16_t, 256> MakeSpread() {
  std::array<uint16_t, 256> t{};
  for (int b = 0; b < 256; ++b) {
    uint16_t v = 0;
    for (int k = 0; k < 8; ++k)
      v |= static_cast<uint16_t>(((b >> k) & 1) << (2 * k));
    t[b] = v;
  }
  return t;
}
constexpr std::array<uint16_t, 256> kSpread = MakeSpread();

// StreamBits (format.h) of 8 lanes.
ASYNCPS_AVX2 inline __m256i StreamBits8(__m256i w) {
  w = _mm256_xor_si256(w, _mm256_srli_epi32(w, 16));
  w = _mm256_mullo_epi32(w, _mm256_set1_epi32(0x21f0aaad));
  w = _mm256_xor_si256(w, _mm256_srli_epi32(w, 15));
  return _mm256_mullo_epi32(w, _mm256_set1_epi32(0x735a2d97));
}

// Uniform(key, i) of 8 lanes, given w = (i + key) * kWeyl.
ASYNCPS_AVX2 inline __m256 Uniform8(__m256i w) {
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(StreamBits8(w), 8)),
                       _mm256_set1_ps(1.0f / 16777216.0f));
}

// The Weyl counters (i + key) * kWeyl of elements base .. base + 7, and the
// step that moves all 8 lanes on by 8 elements.
ASYNCPS_AVX2 inline __m256i Weyl8(uint32_t base, uint32_t key) {
  const __m256i w =
      _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                       _mm256_set1_epi32(static_cast<int32_t>(base + key)));
  return _mm256_mullo_epi32(w, _mm256_set1_epi32(static_cast<int32_t>(kWeyl)));
}
ASYNCPS_AVX2 inline __m256i WeylStep8() {
  return _mm256_set1_epi32(static_cast<int32_t>(8u * kWeyl));
}

ASYNCPS_AVX2 inline __m256 Abs8(__m256 v) {
  return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}

// Combines 8 lane sums in format.h's order.
inline float Combine(const float* l) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

template <bool kSquares>
ASYNCPS_AVX2 float LaneSum(const float* x, size_t len) {
  __m256 acc = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_add_ps(acc, kSquares ? _mm256_mul_ps(v, v) : Abs8(v));
  }
  alignas(32) float l[8];
  _mm256_store_ps(l, acc);
  for (; i < len; ++i) {
    const float v = x[i];
    l[i % 8] += kSquares ? v * v : std::fabs(v);
  }
  return Combine(l);
}

// QSGD levels of 8 elements as int32 lanes.
ASYNCPS_AVX2 inline __m256i QsgdLevels8(const float* x, __m256i w, __m256 inv,
                                        __m256i smax) {
  const __m256 v = _mm256_loadu_ps(x);
  const __m256 t = _mm256_add_ps(_mm256_mul_ps(Abs8(v), inv), Uniform8(w));
  const __m256i l = _mm256_min_epi32(_mm256_cvttps_epi32(t), smax);
  // The sign of x (negative bit pattern: -l; zero bits (+0.0): l is 0).
  return _mm256_sign_epi32(l, _mm256_castps_si256(v));
}

// Signed bytes l[0..7] of one vector of levels (each in [-127, 127]), in
// the low 8 bytes of the result.
ASYNCPS_AVX2 inline __m128i Bytes8(__m256i l) {
  const __m256i b =
      _mm256_packs_epi16(_mm256_packs_epi32(l, l), _mm256_setzero_si256());
  const __m256i o =
      _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  return _mm256_castsi256_si128(o);
}

inline int32_t QsgdLevel(float xv, uint32_t i, uint32_t key, float inv,
                         int32_t smax) {
  const float r = std::fabs(xv) * inv;
  int32_t l = static_cast<int32_t>(r + Uniform(key, i));
  l = l < smax ? l : smax;
  return xv < 0.0f ? -l : l;
}

}  // namespace

bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}

float LaneSumSquaresAvx2(const float* x, size_t len) {
  return LaneSum<true>(x, len);
}

float LaneSumAbsAvx2(const float* x, size_t len) {
  return LaneSum<false>(x, len);
}

ASYNCPS_AVX2 void LaneSumSquares4Avx2(const float* x, size_t len,
                                      float out[4]) {
  // One add chain is latency-bound (an add every 4 cycles); four
  // independent ones keep the adder busy.
  __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                 _mm256_setzero_ps()};
  for (size_t i = 0; i < len; i += 8) {
    for (int k = 0; k < 4; ++k) {
      const __m256 v = _mm256_loadu_ps(x + k * len + i);
      a[k] = _mm256_add_ps(a[k], _mm256_mul_ps(v, v));
    }
  }
  alignas(32) float l[8];
  for (int k = 0; k < 4; ++k) {
    _mm256_store_ps(l, a[k]);
    out[k] = Combine(l);
  }
}

ASYNCPS_AVX2 void QsgdLevelsAvx2(const float* x, size_t len, uint32_t base,
                                 uint32_t key, float inv, int32_t smax,
                                 bool nibbles, uint8_t* out) {
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i vsmax = _mm256_set1_epi32(smax);
  const __m256i step = WeylStep8();
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m256i pair = _mm256_set1_epi16(0x1001);  // bytes (1, 16)
  __m256i w = Weyl8(base, key);
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    __m256i l[4];
    for (int k = 0; k < 4; ++k) {
      l[k] = QsgdLevels8(x + i + 8 * k, w, vinv, vsmax);
      w = _mm256_add_epi32(w, step);
    }
    __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(l[0], l[1]),
                                   _mm256_packs_epi32(l[2], l[3]));
    b = _mm256_permutevar8x32_epi32(b,
                                    _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    if (!nibbles) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), b);
      continue;
    }
    const __m256i p = _mm256_maddubs_epi16(_mm256_and_si256(b, low4), pair);
    const __m256i q = _mm256_permute4x64_epi64(_mm256_packus_epi16(p, p), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i / 2),
                     _mm256_castsi256_si128(q));
  }
  for (; i + 8 <= len; i += 8) {
    const __m128i b = Bytes8(QsgdLevels8(x + i, w, vinv, vsmax));
    w = _mm256_add_epi32(w, step);
    if (!nibbles) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), b);
      continue;
    }
    const __m128i p =
        _mm_maddubs_epi16(_mm_and_si128(b, _mm256_castsi256_si128(low4)),
                          _mm256_castsi256_si128(pair));
    const int32_t w = _mm_cvtsi128_si32(_mm_packus_epi16(p, p));
    __builtin_memcpy(out + i / 2, &w, 4);
  }
  for (; i < len; ++i) {
    const int32_t l =
        QsgdLevel(x[i], base + static_cast<uint32_t>(i), key, inv, smax);
    if (!nibbles) {
      out[i] = static_cast<uint8_t>(l);
    } else if (i % 2 == 0) {
      out[i / 2] = static_cast<uint8_t>(l & 15);
    } else {
      out[i / 2] = static_cast<uint8_t>(out[i / 2] | ((l & 15) << 4));
    }
  }
}

ASYNCPS_AVX2 void TernCodesAvx2(const float* x, size_t len, uint32_t base,
                                uint32_t key, float inv, uint8_t* out) {
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i step = WeylStep8();
  __m256i w = Weyl8(base, key);
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const int nz = _mm256_movemask_ps(
        _mm256_cmp_ps(Uniform8(w), _mm256_mul_ps(Abs8(v), vinv), _CMP_LT_OQ));
    // x < 0 is its sign bit: x is not NaN (the caller checked), and a -0.0
    // is never non-zero (|x| * inv is 0 or NaN, and u < that is false).
    const int neg = nz & _mm256_movemask_ps(v);
    w = _mm256_add_epi32(w, step);
    const uint16_t codes =
        static_cast<uint16_t>(kSpread[nz] | (kSpread[neg] << 1));
    __builtin_memcpy(out + i / 4, &codes, 2);
  }
  if (i < len) {
    uint8_t* o = out + i / 4;
    o[0] = 0;
    if (i + 4 < len) o[1] = 0;
    for (; i < len; ++i) {
      const float xv = x[i];
      const float u = Uniform(key, base + static_cast<uint32_t>(i));
      const uint32_t nz = u < std::fabs(xv) * inv ? 1u : 0u;
      const uint32_t neg = xv < 0.0f ? 2u : 0u;
      out[i / 4] = static_cast<uint8_t>(
          out[i / 4] | ((nz | (neg & (nz << 1))) << (2 * (i % 4))));
    }
  }
}

namespace {

// The values of the TernGrad codes packed[...] times m: code 1 -> m, 3 -> -m,
// 0 and 2 -> +0 (as 1 * m, -1 * m, 0 * m for a finite m >= 0).
struct TernValues {
  const uint8_t* packed;
  float m;
  // Elements i .. i + 7 (i a multiple of 8).
  ASYNCPS_AVX2 __m256 Eight(size_t i) const {
    uint16_t c16;
    __builtin_memcpy(&c16, packed + i / 4, 2);
    const __m256i c = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(c16),
                          _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
        _mm256_set1_epi32(3));
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i nz = _mm256_cmpeq_epi32(_mm256_and_si256(c, one), one);
    const __m256i neg = _mm256_cmpeq_epi32(c, _mm256_set1_epi32(3));
    // m or 0, then the sign bit where the code is 3.
    return _mm256_or_ps(
        _mm256_and_ps(_mm256_castsi256_ps(nz), _mm256_set1_ps(m)),
        _mm256_and_ps(_mm256_castsi256_ps(neg), _mm256_set1_ps(-0.0f)));
  }
  float One(size_t i) const {
    const uint32_t c = (packed[i / 4] >> (2 * (i % 4))) & 3u;
    return ((c & 1u) ? ((c & 2u) ? -1.0f : 1.0f) : 0.0f) * m;
  }
};

// The values of the sign bits packed[...]: s where clear, -s where set.
struct SignValues {
  const uint8_t* packed;
  float s;
  ASYNCPS_AVX2 __m256 Eight(size_t i) const {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i set = _mm256_cmpeq_epi32(
        _mm256_and_si256(_mm256_set1_epi32(packed[i / 8]), bit), bit);
    return _mm256_xor_ps(
        _mm256_set1_ps(s),
        _mm256_and_ps(_mm256_castsi256_ps(set), _mm256_set1_ps(-0.0f)));
  }
  float One(size_t i) const {
    return ((packed[i / 8] >> (i % 8)) & 1u) ? -s : s;
  }
};

// dst[i] = v(i), or dst[i] += alpha * v(i) (a multiply, then an add).
template <bool kAdd, typename Values>
ASYNCPS_AVX2 void DecodeLoop(const Values& v, size_t len, float alpha,
                             float* dst) {
  const __m256 va = _mm256_set1_ps(alpha);
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m256 e = v.Eight(i);
    if constexpr (kAdd) {
      _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i),
                                              _mm256_mul_ps(va, e)));
    } else {
      _mm256_storeu_ps(dst + i, e);
    }
  }
  for (; i < len; ++i) {
    if constexpr (kAdd) {
      dst[i] += alpha * v.One(i);
    } else {
      dst[i] = v.One(i);
    }
  }
}

template <typename Values>
ASYNCPS_AVX2 void Decode(const Values& v, size_t len, float alpha, bool add,
                         float* dst) {
  if (add) {
    DecodeLoop<true>(v, len, alpha, dst);
  } else {
    DecodeLoop<false>(v, len, alpha, dst);
  }
}

}  // namespace

void TernDecodeAvx2(const uint8_t* packed, size_t len, float m, float alpha,
                    bool add, float* dst) {
  Decode(TernValues{packed, m}, len, alpha, add, dst);
}

void SignDecodeAvx2(const uint8_t* packed, size_t len, float s, float alpha,
                    bool add, float* dst) {
  Decode(SignValues{packed, s}, len, alpha, add, dst);
}

ASYNCPS_AVX2 void SignBitsAvx2(const float* x, size_t n, uint8_t* out) {
  const __m256 zero = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    uint32_t w = 0;
    for (int k = 0; k < 4; ++k) {
      const uint32_t m = static_cast<uint32_t>(_mm256_movemask_ps(
          _mm256_cmp_ps(_mm256_loadu_ps(x + i + 8 * k), zero, _CMP_LT_OQ)));
      w |= m << (8 * k);
    }
    __builtin_memcpy(out + i / 8, &w, 4);
  }
  for (; i + 8 <= n; i += 8) {
    out[i / 8] = static_cast<uint8_t>(_mm256_movemask_ps(
        _mm256_cmp_ps(_mm256_loadu_ps(x + i), zero, _CMP_LT_OQ)));
  }
  if (i < n) {
    uint32_t v = 0;
    for (size_t j = i; j < n; ++j) v |= (x[j] < 0.0f ? 1u : 0u) << (j % 8);
    out[i / 8] = static_cast<uint8_t>(v);
  }
}

namespace {

ASYNCPS_AVX2 inline __m256i Bf16x8(const float* x) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i lsb =
      _mm256_and_si256(_mm256_srli_epi32(v, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(v, _mm256_set1_epi32(0x7fff)), lsb),
      16);
  const __m256i nan_value =
      _mm256_or_si256(_mm256_srli_epi32(v, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7fffffff)),
                         _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, nan_value, is_nan);
}

}  // namespace

ASYNCPS_AVX2 void Bf16EncodeAvx2(const float* x, size_t n, uint16_t* out) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_permute4x64_epi64(
        _mm256_packus_epi32(Bf16x8(x + i), Bf16x8(x + i + 8)), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = FloatToBf16(x[i]);
}

#else  // !ASYNCPS_AVX2_KERNELS

bool HaveAvx2() { return false; }
float LaneSumSquaresAvx2(const float*, size_t) { return 0; }
float LaneSumAbsAvx2(const float*, size_t) { return 0; }
void LaneSumSquares4Avx2(const float*, size_t, float*) {}
void QsgdLevelsAvx2(const float*, size_t, uint32_t, uint32_t, float, int32_t,
                    bool, uint8_t*) {}
void TernCodesAvx2(const float*, size_t, uint32_t, uint32_t, float, uint8_t*) {}
void TernDecodeAvx2(const uint8_t*, size_t, float, float, bool, float*) {}
void SignDecodeAvx2(const uint8_t*, size_t, float, float, bool, float*) {}
void SignBitsAvx2(const float*, size_t, uint8_t*) {}
void Bf16EncodeAvx2(const float*, size_t, uint16_t*) {}

#endif

}  // namespace asyncps::compression::internal
