// Dense codecs: none, fp16, bf16, int8, qsgd, terngrad, sign. Payload formats
// are documented in compression/internal/format.h. Loops are written so that
// g++ -O2/-O3 vectorises them with baseline SSE2 (no libm calls, integer max
// reductions, fixed 8-lane sums, small stack tiles for bit packing).
#include <algorithm>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <cmath>
#include <cstring>
#include <limits>

#include "compression/internal/avx2_kernels.h"
#include "compression/internal/codecs.h"

namespace asyncps::compression::internal {
namespace {

constexpr size_t kTile = 256;  // elements per packing tile (multiple of 8)

template <bool kAdd>
inline void Put(float* d, float v, float alpha) {
  if constexpr (kAdd) {
    *d += alpha * v;
  } else {
    *d = v;
  }
}

// Hot loops get an AVX2 clone picked at load time (ifunc); results are
// bit-identical (integer ops and IEEE single ops, no contraction).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(ASYNCPS_NO_IFUNC)
#define ASYNCPS_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define ASYNCPS_VECTOR_CLONES
#endif

// Largest |x| as float bits; >= 0x7f800000 means inf or NaN was seen.
ASYNCPS_VECTOR_CLONES uint32_t MaxAbsBits(const float* x, size_t len) {
  int32_t m = 0;
  for (size_t i = 0; i < len; ++i) {
    const int32_t v = static_cast<int32_t>(FloatBits(x[i]) & 0x7fffffffu);
    m = v > m ? v : m;
  }
  return static_cast<uint32_t>(m);
}

// Sum of f(x[i]) over 8 lanes in the order format.h specifies.
template <typename F>
inline float LaneSum(const float* x, size_t len, F f) {
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    for (int j = 0; j < 8; ++j) l[j] += f(x[i + j]);
  }
  for (; i < len; ++i) l[i % 8] += f(x[i]);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

inline float LoadF32(const uint8_t* p, size_t i) {
  float v;
  std::memcpy(&v, p + 4 * i, 4);
  return v;
}
inline void StoreF32(uint8_t* p, size_t i, float v) {
  std::memcpy(p + 4 * i, &v, 4);
}

Status NonFinite() {
  return Status::InvalidArgument("non-finite value in gradient");
}

ASYNCPS_VECTOR_CLONES void Int8Quantise(const float* xs, size_t len, float inv,
                                        int8_t* qs) {
  for (size_t i = 0; i < len; ++i) {
    qs[i] = static_cast<int8_t>(
        static_cast<int32_t>(RoundNearestEven(xs[i] * inv)));
  }
}

ASYNCPS_VECTOR_CLONES void Fp16Encode(const float* x, size_t n,
                                      UnalignedU16* o) {
  for (size_t i = 0; i < n; ++i) o[i] = FloatToHalf(x[i]);
}

// The body of an encoded payload is 8-byte aligned (a vector's storage plus
// the 24-byte header), so plain uint16_t stores are fine, and __restrict
// lets the loop vectorise.
ASYNCPS_VECTOR_CLONES void Bf16Encode(const float* __restrict x, size_t n,
                                      uint16_t* __restrict o) {
  for (size_t i = 0; i < n; ++i) o[i] = FloatToBf16(x[i]);
}

// fp16 through the F16C instructions (x86-64 CPUs since 2012), picked at
// run time. Both directions round like FloatToHalf / HalfToFloat (IEEE,
// nearest even); blocks holding a NaN take the scalar path, so every byte
// equals the portable code's (and the GPU's).
#if defined(__x86_64__) && defined(__GNUC__)
#define ASYNCPS_F16C 1
bool HaveF16c() {
  static const bool have =
      __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return have;
}

__attribute__((target("avx,f16c"))) void Fp16EncodeF16c(const float* x,
                                                        size_t n, uint8_t* o) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
      for (size_t j = i; j < i + 8; ++j) {
        const uint16_t h = FloatToHalf(x[j]);
        std::memcpy(o + 2 * j, &h, 2);
      }
      continue;
    }
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(o + 2 * i),
        _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) {
    const uint16_t h = FloatToHalf(x[i]);
    std::memcpy(o + 2 * i, &h, 2);
  }
}

template <bool kAdd>
__attribute__((target("avx,f16c"))) void Fp16DecodeF16c(const uint8_t* h,
                                                        size_t n, float alpha,
                                                        float* dst) {
  const __m256 a = _mm256_set1_ps(alpha);
  const __m128i exp_mask = _mm_set1_epi16(0x7c00);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i hv =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 2 * i));
    // Any exponent all ones (Inf or NaN): the scalar path for this block.
    const __m128i e = _mm_and_si128(hv, exp_mask);
    if (_mm_movemask_epi8(_mm_cmpeq_epi16(e, exp_mask)) != 0) {
      for (size_t j = i; j < i + 8; ++j) {
        Put<kAdd>(dst + j, HalfToFloat(LoadAt<uint16_t>(h, j)), alpha);
      }
      continue;
    }
    const __m256 v = _mm256_cvtph_ps(hv);
    if constexpr (kAdd) {
      // Multiply, then add: no fused multiply-add, as in Put().
      _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i),
                                              _mm256_mul_ps(a, v)));
    } else {
      _mm256_storeu_ps(dst + i, v);
    }
  }
  for (; i < n; ++i)
    Put<kAdd>(dst + i, HalfToFloat(LoadAt<uint16_t>(h, i)), alpha);
}
#endif

// QSGD levels of tl elements starting at global index base.
ASYNCPS_VECTOR_CLONES void QsgdTile(const float* xs, size_t tl, uint32_t base,
                                    uint32_t key, float inv, int32_t smax,
                                    int8_t* tile) {
  for (size_t i = 0; i < tl; ++i) {
    const float r = std::fabs(xs[i]) * inv;
    const float u = Uniform(key, base + static_cast<uint32_t>(i));
    int32_t l = static_cast<int32_t>(r + u);
    l = l < smax ? l : smax;
    tile[i] = static_cast<int8_t>(xs[i] < 0.0f ? -l : l);
  }
}

// TernGrad 2-bit codes of tl elements starting at global index base.
ASYNCPS_VECTOR_CLONES void TernTile(const float* xs, size_t tl, uint32_t base,
                                    uint32_t key, float inv, uint8_t* tile) {
  for (size_t i = 0; i < tl; ++i) {
    const float u = Uniform(key, base + static_cast<uint32_t>(i));
    const uint32_t nz = u < std::fabs(xs[i]) * inv ? 1u : 0u;
    const uint32_t neg = xs[i] < 0.0f ? 2u : 0u;
    tile[i] = static_cast<uint8_t>(nz | (neg & (nz << 1)));
  }
}

// Decoding tables: byte -> 8 signs (sign codec), byte -> 4 ternary values.
struct Tables {
  float sign[256][8];
  float tern[256][4];
  Tables() {
    for (int b = 0; b < 256; ++b) {
      for (int i = 0; i < 8; ++i) sign[b][i] = ((b >> i) & 1) ? -1.0f : 1.0f;
      for (int i = 0; i < 4; ++i) {
        const int c = (b >> (2 * i)) & 3;
        tern[b][i] = (c & 1) ? ((c & 2) ? -1.0f : 1.0f) : 0.0f;
      }
    }
  }
};
const Tables& GetTables() {
  static const Tables t;
  return t;
}

// ---- none ------------------------------------------------------------------

// DecodeUnchecked for codecs whose decode loop is `template <bool kAdd>
// static void Run(p, n, alpha, dst)`: add or overwrite is fixed at compile
// time, and each codec writes its loop once.
template <typename Derived, typename Base>
class RunDecoder : public Base {
 public:
  using Base::Base;

 protected:
  void DecodeUnchecked(const uint8_t* p, size_t n, float alpha, bool add,
                       float* dst) const override {
    if (add) {
      Derived::template Run<true>(p, n, alpha, dst);
    } else {
      Derived::template Run<false>(p, n, alpha, dst);
    }
  }
};

class NoneCodec final : public CodecBase {
 public:
  CodecId id() const override { return CodecId::kNone; }
  size_t MaxEncodedBytes(size_t n) const override {
    return kPayloadHeaderBytes + 4 * n;
  }
  Status Encode(const float* x, size_t n, uint64_t seed,
                std::vector<uint8_t>* out) const override {
    ASSIGN_OR_RETURN(uint8_t * body,
                     BeginPayload(id(), x, n, 0, 0, seed, 4ull * n, out));
    if (n > 0) std::memcpy(body, x, 4 * n);
    return Status::OK();
  }
  Status Validate(const uint8_t* p, size_t bytes, size_t n) const override {
    Header h;
    RETURN_IF_ERROR(CheckHeader(p, bytes, n, id(), &h));
    if (bytes != kPayloadHeaderBytes + 4ull * n) {
      return Status::Corruption("none payload: wrong size");
    }
    return Status::OK();
  }

 protected:
  void DecodeUnchecked(const uint8_t* p, size_t n, float alpha, bool add,
                       float* dst) const override {
    const uint8_t* v = p + kPayloadHeaderBytes;
    if (add) {
      for (size_t i = 0; i < n; ++i) dst[i] += alpha * LoadAt<float>(v, i);
    } else if (n > 0) {
      std::memcpy(dst, v, 4 * n);
    }
  }
};

// ---- fp16 / bf16 -----------------------------------------------------------

template <CodecId kId>
class HalfCodec final : public RunDecoder<HalfCodec<kId>, CodecBase> {
 public:
  CodecId id() const override { return kId; }
  size_t MaxEncodedBytes(size_t n) const override {
    return kPayloadHeaderBytes + 2 * n;
  }
  Status Encode(const float* x, size_t n, uint64_t seed,
                std::vector<uint8_t>* out) const override {
    ASSIGN_OR_RETURN(uint8_t * body,
                     BeginPayload(id(), x, n, 0, 0, seed, 2ull * n, out));
    auto* o = reinterpret_cast<UnalignedU16*>(body);
#ifdef ASYNCPS_F16C
    if (kId == CodecId::kFp16 && HaveF16c()) {
      Fp16EncodeF16c(x, n, body);
      return Status::OK();
    }
#endif
    if (kId == CodecId::kFp16) {
      Fp16Encode(x, n, o);
    } else if (HaveAvx2()) {
      Bf16EncodeAvx2(x, n, reinterpret_cast<uint16_t*>(body));
    } else {
      Bf16Encode(x, n, reinterpret_cast<uint16_t*>(body));
    }
    return Status::OK();
  }
  Status Validate(const uint8_t* p, size_t bytes, size_t n) const override {
    Header h;
    RETURN_IF_ERROR(CheckHeader(p, bytes, n, id(), &h));
    if (bytes != kPayloadHeaderBytes + 2ull * n) {
      return Status::Corruption("half payload: wrong size");
    }
    return Status::OK();
  }

 private:
  friend class RunDecoder<HalfCodec<kId>, CodecBase>;
  static uint16_t ToHalf(float f) {
    return kId == CodecId::kFp16 ? FloatToHalf(f) : FloatToBf16(f);
  }
  static float FromHalf(uint16_t h) {
    return kId == CodecId::kFp16 ? HalfToFloat(h) : Bf16ToFloat(h);
  }
  template <bool kAdd>
  static void Run(const uint8_t* p, size_t n, float alpha, float* dst) {
    const uint8_t* h = p + kPayloadHeaderBytes;
#ifdef ASYNCPS_F16C
    if (kId == CodecId::kFp16 && HaveF16c()) {
      Fp16DecodeF16c<kAdd>(h, n, alpha, dst);
      return;
    }
#endif
    for (size_t i = 0; i < n; ++i) {
      Put<kAdd>(dst + i, FromHalf(LoadAt<uint16_t>(h, i)), alpha);
    }
  }
};

// ---- bucketed quantisers -------------------------------------------------

// Shared layout: header, nb float scales, packed body of `bits` per element.
class BucketCodec : public CodecBase {
 public:
  explicit BucketCodec(int bucket) : bucket_(static_cast<uint32_t>(bucket)) {}
  size_t MaxEncodedBytes(size_t n) const override {
    return kPayloadHeaderBytes + 4 * NumBuckets(n, bucket_) +
           PackedBytes(n, MaxBits());
  }
  Status Validate(const uint8_t* p, size_t bytes, size_t n) const override {
    Header h;
    RETURN_IF_ERROR(CheckHeader(p, bytes, n, id(), &h));
    RETURN_IF_ERROR(CheckBucket(h.p1));
    int bits = 0;
    RETURN_IF_ERROR(BitsFor(h, &bits));
    const uint64_t nb = NumBuckets(n, h.p1);
    if (bytes != kPayloadHeaderBytes + 4 * nb + PackedBytes(n, bits)) {
      return Status::Corruption(std::string(CodecName(id())) +
                                " payload: wrong size");
    }
    if (!ScalesOk(p + kPayloadHeaderBytes, nb)) {
      return Status::Corruption(std::string(CodecName(id())) +
                                " payload: negative or non-finite scale");
    }
    return Status::OK();
  }

 protected:
  // Bits per element for a validated header (and checks its p2).
  virtual Status BitsFor(const Header& h, int* bits) const = 0;
  virtual int MaxBits() const = 0;

  uint32_t bucket_;
};

// Bucket codecs with a fixed number of bits per element.
template <int kBits>
class FixedBits : public BucketCodec {
 public:
  using BucketCodec::BucketCodec;

 protected:
  Status BitsFor(const Header& h, int* bits) const override {
    *bits = kBits;
    return Status::OK();
  }
  int MaxBits() const override { return kBits; }
};

class Int8Codec final : public RunDecoder<Int8Codec, FixedBits<8>> {
 public:
  using RunDecoder::RunDecoder;
  CodecId id() const override { return CodecId::kInt8; }
  Status Encode(const float* x, size_t n, uint64_t seed,
                std::vector<uint8_t>* out) const override {
    const uint64_t nb = NumBuckets(n, bucket_);
    ASSIGN_OR_RETURN(uint8_t * body, BeginPayload(id(), x, n, bucket_, 0, seed,
                                                  4 * nb + n, out));
    uint8_t* scales = body;
    auto* q = reinterpret_cast<int8_t*>(body + 4 * nb);
    for (uint64_t b = 0; b < nb; ++b) {
      const size_t lo = b * bucket_;
      const size_t len = std::min<size_t>(bucket_, n - lo);
      const uint32_t mb = MaxAbsBits(x + lo, len);
      if (mb >= 0x7f800000u) return NonFinite();
      const float m = BitsFloat(mb);
      const float inv = m > 0.0f ? 127.0f / m : 0.0f;
      StoreF32(scales, b, m / 127.0f);
      Int8Quantise(x + lo, len, inv, q + lo);
    }
    return Status::OK();
  }

 private:
  friend class RunDecoder<Int8Codec, FixedBits<8>>;
  template <bool kAdd>
  static void Run(const uint8_t* p, size_t n, float alpha, float* dst) {
    const Header h = ReadHeader(p);
    const uint64_t nb = NumBuckets(n, h.p1);
    const uint8_t* scales = p + kPayloadHeaderBytes;
    const auto* q = reinterpret_cast<const int8_t*>(scales + 4 * nb);
    for (uint64_t b = 0; b < nb; ++b) {
      const size_t lo = b * h.p1;
      const size_t len = std::min<size_t>(h.p1, n - lo);
      const float s = LoadF32(scales, b);
      for (size_t i = 0; i < len; ++i) {
        Put<kAdd>(dst + lo + i, static_cast<float>(q[lo + i]) * s, alpha);
      }
    }
  }
};

class QsgdCodec final : public RunDecoder<QsgdCodec, BucketCodec> {
 public:
  QsgdCodec(int levels, int bucket)
      : RunDecoder(bucket), levels_(static_cast<uint32_t>(levels)) {}
  CodecId id() const override { return CodecId::kQsgd; }
  Status Encode(const float* x, size_t n, uint64_t seed,
                std::vector<uint8_t>* out) const override {
    const uint64_t nb = NumBuckets(n, bucket_);
    const int bits = QsgdBits(levels_);
    ASSIGN_OR_RETURN(uint8_t * body,
                     BeginPayload(id(), x, n, bucket_, levels_, seed,
                                  4 * nb + PackedBytes(n, bits), out));
    uint8_t* packed = body + 4 * nb;
    const uint32_t key = SeedKey(seed);
    const float s = static_cast<float>(levels_);
    const int32_t smax = static_cast<int32_t>(levels_);
    const bool avx2 = HaveAvx2();
    int8_t tile[kTile];
    // AVX2: the norms of 4 full buckets at a time (4 independent sums,
    // each in the format's order), then their levels while in cache.
    float sums[4];
    uint64_t sums_from = nb;  // first bucket of sums[]
    for (uint64_t b = 0; b < nb; ++b) {
      const size_t lo = b * bucket_;
      const size_t len = std::min<size_t>(bucket_, n - lo);
      if (avx2 && b % 4 == 0 && bucket_ % 8 == 0 && (b + 4) * bucket_ <= n) {
        LaneSumSquares4Avx2(x + lo, bucket_, sums);
        sums_from = b;
      }
      const float sum2 =
          b >= sums_from && b < sums_from + 4
              ? sums[b - sums_from]
              : (avx2 ? LaneSumSquaresAvx2(x + lo, len)
                      : LaneSum(x + lo, len, [](float v) { return v * v; }));
      const float norm = std::sqrt(sum2);
      if (!(norm <= std::numeric_limits<float>::max())) return NonFinite();
      StoreF32(body, b, norm);
      const float inv = norm > 0.0f ? s / norm : 0.0f;
      if (avx2) {
        QsgdLevelsAvx2(x + lo, len, static_cast<uint32_t>(lo), key, inv, smax,
                       bits == 4, packed + (bits == 4 ? lo / 2 : lo));
        continue;
      }
      for (size_t t = 0; t < len; t += kTile) {
        const size_t tl = std::min(kTile, len - t);
        const size_t base = lo + t;
        const float* xs = x + base;
        QsgdTile(xs, tl, static_cast<uint32_t>(base), key, inv, smax, tile);
        if (bits == 8) {
          std::memcpy(packed + base, tile, tl);
        } else {
          uint8_t* o = packed + base / 2;
          for (size_t j = 0; j < tl / 2; ++j) {
            o[j] = static_cast<uint8_t>(
                (static_cast<uint8_t>(tile[2 * j]) & 15u) |
                (static_cast<uint32_t>(static_cast<uint8_t>(tile[2 * j + 1]))
                 << 4));
          }
          if (tl % 2) o[tl / 2] = static_cast<uint8_t>(tile[tl - 1] & 15);
        }
      }
    }
    return Status::OK();
  }

 protected:
  Status BitsFor(const Header& h, int* bits) const override {
    if (h.p2 < 1 || h.p2 > 127) return Status::Corruption("qsgd: bad levels");
    *bits = QsgdBits(h.p2);
    return Status::OK();
  }
  int MaxBits() const override { return QsgdBits(levels_); }

 private:
  friend class RunDecoder<QsgdCodec, BucketCodec>;
  template <bool kAdd>
  static void Run(const uint8_t* p, size_t n, float alpha, float* dst) {
    const Header h = ReadHeader(p);
    const uint64_t nb = NumBuckets(n, h.p1);
    const uint8_t* norms = p + kPayloadHeaderBytes;
    const uint8_t* packed = norms + 4 * nb;
    const float s = static_cast<float>(h.p2);
    const bool nibbles = QsgdBits(h.p2) == 4;
    for (uint64_t b = 0; b < nb; ++b) {
      const size_t lo = b * h.p1;
      const size_t len = std::min<size_t>(h.p1, n - lo);
      const float step = LoadF32(norms, b) / s;
      float* d = dst + lo;
      if (!nibbles) {
        const auto* q = reinterpret_cast<const int8_t*>(packed + lo);
        for (size_t i = 0; i < len; ++i) {
          Put<kAdd>(d + i, static_cast<float>(q[i]) * step, alpha);
        }
        continue;
      }
      const uint8_t* q = packed + lo / 2;
      for (size_t j = 0; j < len / 2; ++j) {
        const auto lo4 =
            static_cast<int8_t>(static_cast<uint8_t>(q[j] << 4)) >> 4;
        const auto hi4 = static_cast<int8_t>(q[j]) >> 4;
        Put<kAdd>(d + 2 * j, static_cast<float>(lo4) * step, alpha);
        Put<kAdd>(d + 2 * j + 1, static_cast<float>(hi4) * step, alpha);
      }
      if (len % 2) {
        const auto lo4 =
            static_cast<int8_t>(static_cast<uint8_t>(q[len / 2] << 4)) >> 4;
        Put<kAdd>(d + len - 1, static_cast<float>(lo4) * step, alpha);
      }
    }
  }

  uint32_t levels_;
};

class TernGradCodec final : public RunDecoder<TernGradCodec, FixedBits<2>> {
 public:
  using RunDecoder::RunDecoder;
  CodecId id() const override { return CodecId::kTernGrad; }
  Status Encode(const float* x, size_t n, uint64_t seed,
                std::vector<uint8_t>* out) const override {
    const uint64_t nb = NumBuckets(n, bucket_);
    ASSIGN_OR_RETURN(uint8_t * body,
                     BeginPayload(id(), x, n, bucket_, 0, seed,
                                  4 * nb + PackedBytes(n, 2), out));
    uint8_t* packed = body + 4 * nb;
    const uint32_t key = SeedKey(seed);
    const bool avx2 = HaveAvx2();
    uint8_t tile[kTile];
    for (uint64_t b = 0; b < nb; ++b) {
      const size_t lo = b * bucket_;
      const size_t len = std::min<size_t>(bucket_, n - lo);
      const uint32_t mb = MaxAbsBits(x + lo, len);
      if (mb >= 0x7f800000u) return NonFinite();
      const float m = BitsFloat(mb);
      StoreF32(body, b, m);
      const float inv = m > 0.0f ? 1.0f / m : 0.0f;
      if (avx2) {
        TernCodesAvx2(x + lo, len, static_cast<uint32_t>(lo), key, inv,
                      packed + lo / 4);
        continue;
      }
      for (size_t t = 0; t < len; t += kTile) {
        const size_t tl = std::min(kTile, len - t);
        const size_t base = lo + t;
        const float* xs = x + base;
        TernTile(xs, tl, static_cast<uint32_t>(base), key, inv, tile);
        uint8_t* o = packed + base / 4;
        const size_t full = tl / 4;
        for (size_t j = 0; j < full; ++j) {
          o[j] = static_cast<uint8_t>(tile[4 * j] | (tile[4 * j + 1] << 2) |
                                      (tile[4 * j + 2] << 4) |
                                      (tile[4 * j + 3] << 6));
        }
        if (tl % 4) {
          uint8_t v = 0;
          for (size_t i = 4 * full; i < tl; ++i) v |= tile[i] << (2 * (i % 4));
          o[full] = v;
        }
      }
    }
    return Status::OK();
  }

 private:
  friend class RunDecoder<TernGradCodec, FixedBits<2>>;
  template <bool kAdd>
  static void Run(const uint8_t* p, size_t n, float alpha, float* dst) {
    const Header h = ReadHeader(p);
    const uint64_t nb = NumBuckets(n, h.p1);
    const uint8_t* scales = p + kPayloadHeaderBytes;
    const uint8_t* packed = scales + 4 * nb;
    const auto& tern = GetTables().tern;
    const bool avx2 = HaveAvx2();
    for (uint64_t b = 0; b < nb; ++b) {
      const size_t lo = b * h.p1;
      const size_t len = std::min<size_t>(h.p1, n - lo);
      const float m = LoadF32(scales, b);
      if (avx2) {
        TernDecodeAvx2(packed + lo / 4, len, m, alpha, kAdd, dst + lo);
        continue;
      }
      // lo is a multiple of 8: whole bytes.
      const size_t full = len / 4;
      for (size_t j = 0; j < full; ++j) {
        const float* t = tern[packed[lo / 4 + j]];
        for (int i = 0; i < 4; ++i)
          Put<kAdd>(dst + lo + 4 * j + i, t[i] * m, alpha);
      }
      for (size_t i = lo + 4 * full; i < lo + len; ++i) {
        const uint32_t c = (packed[i / 4] >> (2 * (i % 4))) & 3u;
        Put<kAdd>(dst + i, tern[c][0] * m, alpha);
      }
    }
  }
};

class SignCodec final : public RunDecoder<SignCodec, FixedBits<1>> {
 public:
  using RunDecoder::RunDecoder;
  CodecId id() const override { return CodecId::kSign; }
  Status Encode(const float* x, size_t n, uint64_t seed,
                std::vector<uint8_t>* out) const override {
    const uint64_t nb = NumBuckets(n, bucket_);
    ASSIGN_OR_RETURN(uint8_t * body,
                     BeginPayload(id(), x, n, bucket_, 0, seed,
                                  4 * nb + PackedBytes(n, 1), out));
    uint8_t* packed = body + 4 * nb;
    const bool avx2 = HaveAvx2();
    for (uint64_t b = 0; b < nb; ++b) {
      const size_t lo = b * bucket_;
      const size_t len = std::min<size_t>(bucket_, n - lo);
      const float sum =
          avx2 ? LaneSumAbsAvx2(x + lo, len)
               : LaneSum(x + lo, len, [](float v) { return std::fabs(v); });
      if (!(sum <= std::numeric_limits<float>::max())) return NonFinite();
      StoreF32(body, b, sum / static_cast<float>(len));
    }
    if (avx2) {
      SignBitsAvx2(x, n, packed);
      return Status::OK();
    }
    const size_t full = n / 8;
    for (size_t j = 0; j < full; ++j) {
      const float* xs = x + 8 * j;
      uint32_t v = 0;
      for (int i = 0; i < 8; ++i) v |= (xs[i] < 0.0f ? 1u : 0u) << i;
      packed[j] = static_cast<uint8_t>(v);
    }
    if (n % 8) {
      uint32_t v = 0;
      for (size_t i = 8 * full; i < n; ++i)
        v |= (x[i] < 0.0f ? 1u : 0u) << (i % 8);
      packed[full] = static_cast<uint8_t>(v);
    }
    return Status::OK();
  }

 private:
  friend class RunDecoder<SignCodec, FixedBits<1>>;
  template <bool kAdd>
  static void Run(const uint8_t* p, size_t n, float alpha, float* dst) {
    const Header h = ReadHeader(p);
    const uint64_t nb = NumBuckets(n, h.p1);
    const uint8_t* scales = p + kPayloadHeaderBytes;
    const uint8_t* packed = scales + 4 * nb;
    const auto& sign = GetTables().sign;
    const bool avx2 = HaveAvx2();
    for (uint64_t b = 0; b < nb; ++b) {
      const size_t lo = b * h.p1;
      const size_t len = std::min<size_t>(h.p1, n - lo);
      const float s = LoadF32(scales, b);
      if (avx2) {
        SignDecodeAvx2(packed + lo / 8, len, s, alpha, kAdd, dst + lo);
        continue;
      }
      // lo and full buckets are multiples of 8: whole bytes.
      const size_t bytes = len / 8;
      for (size_t j = 0; j < bytes; ++j) {
        const float* t = sign[packed[lo / 8 + j]];
        for (int i = 0; i < 8; ++i)
          Put<kAdd>(dst + lo + 8 * j + i, t[i] * s, alpha);
      }
      for (size_t i = lo + 8 * bytes; i < lo + len; ++i) {
        Put<kAdd>(dst + i, ((packed[i / 8] >> (i % 8)) & 1u) ? -s : s, alpha);
      }
    }
  }
};

}  // namespace

std::unique_ptr<Codec> NewNoneCodec() { return std::make_unique<NoneCodec>(); }
std::unique_ptr<Codec> NewFp16Codec() {
  return std::make_unique<HalfCodec<CodecId::kFp16>>();
}
std::unique_ptr<Codec> NewBf16Codec() {
  return std::make_unique<HalfCodec<CodecId::kBf16>>();
}
std::unique_ptr<Codec> NewInt8Codec(int bucket) {
  return std::make_unique<Int8Codec>(bucket);
}
std::unique_ptr<Codec> NewQsgdCodec(int levels, int bucket) {
  return std::make_unique<QsgdCodec>(levels, bucket);
}
std::unique_ptr<Codec> NewTernGradCodec(int bucket) {
  return std::make_unique<TernGradCodec>(bucket);
}
std::unique_ptr<Codec> NewSignCodec(int bucket) {
  return std::make_unique<SignCodec>(bucket);
}

}  // namespace asyncps::compression::internal
