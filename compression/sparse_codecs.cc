// Sparse codecs: top-k (exact and sampled) and random-k.
//
// Top-k selection never sorts or nth_elements all n magnitudes. It draws a
// random sample of magnitudes, takes a threshold from the sample's order
// statistics, collects the candidates at or above it in one pass (blocks of
// 16 with a vectorised "any" test; candidates are rare), and:
//  - exact: if there are >= k candidates, the k-th largest (magnitude, then
//    lower index first) among the candidates is the k-th largest overall, so
//    an nth_element over the candidates gives exactly the k largest;
//    otherwise the threshold is lowered (finally to 0 = every element);
//  - sampled (DGC): the candidates are sent as they are when their count is
//    within 10% of k; too many are cut to exactly k, too few lower the
//    threshold and rescan.
// Indices are sent in increasing order (the candidate pass yields them so).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "compression/internal/codecs.h"

namespace asyncps::compression::internal {
namespace {

constexpr uint32_t kNonFiniteBits = 0x7f800000u;

inline uint32_t MagBits(float f) { return FloatBits(f) & 0x7fffffffu; }

// Ordering key: larger magnitude first, then lower index.
inline uint64_t SelectKey(uint32_t mag, uint32_t idx) {
  return (static_cast<uint64_t>(mag) << 32) | (0xffffffffu - idx);
}

// Collects i with MagBits(x[i]) >= t into *cand (ascending). Returns the
// largest magnitude bits seen (>= kNonFiniteBits: inf/NaN present).
uint32_t Collect(const float* x, size_t n, uint32_t t,
                 std::vector<uint32_t>* cand) {
  constexpr size_t kB = 16;
  size_t c = 0;
  if (cand->size() < kB) cand->resize(1024);
  uint32_t* out = cand->data();
  uint32_t mx = 0;
  size_t i = 0;
#if defined(__SSE2__)
  // Per 16 elements: 8 vector compares and 4 movemasks; then only the hits
  // are visited. Magnitude bits are < 2^31, so signed compares are exact.
  const __m128i abs_mask = _mm_set1_epi32(0x7fffffff);
  const __m128i t_minus_1 = _mm_set1_epi32(static_cast<int32_t>(t) - 1);
  const __m128i finite_max = _mm_set1_epi32(0x7f7fffff);
  const bool all = t == 0;
  const bool none = t > 0x7fffffffu;  // no magnitude reaches it
  uint32_t nonfinite = 0;
  for (; i + kB <= n; i += kB) {
    uint32_t mask = 0;
    for (int q = 0; q < 4; ++q) {
      const __m128i v = _mm_and_si128(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i + 4 * q)),
          abs_mask);
      mask |= static_cast<uint32_t>(_mm_movemask_ps(
                  _mm_castsi128_ps(_mm_cmpgt_epi32(v, t_minus_1))))
              << (4 * q);
      nonfinite |= static_cast<uint32_t>(
          _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(v, finite_max))));
    }
    if (all) mask = 0xffff;
    if (none) mask = 0;
    if (mask == 0) continue;
    if (c + kB > cand->size()) {
      cand->resize(2 * cand->size() + kB);
      out = cand->data();
    }
    while (mask) {
      out[c++] = static_cast<uint32_t>(i + __builtin_ctz(mask));
      mask &= mask - 1;
    }
  }
  if (nonfinite) mx = kNonFiniteBits;
#endif
  for (; i + kB <= n; i += kB) {
    uint32_t b[kB];
    std::memcpy(b, x + i, sizeof(b));
    uint32_t any = 0;
    for (size_t j = 0; j < kB; ++j) {
      const uint32_t v = b[j] & 0x7fffffffu;
      any |= v >= t ? 1u : 0u;
      mx = v > mx ? v : mx;
    }
    if (!any) continue;
    if (c + kB > cand->size()) {
      cand->resize(2 * cand->size() + kB);
      out = cand->data();
    }
    for (size_t j = 0; j < kB; ++j) {
      out[c] = static_cast<uint32_t>(i + j);
      c += (b[j] & 0x7fffffffu) >= t ? 1 : 0;
    }
  }
  for (; i < n; ++i) {
    const uint32_t v = MagBits(x[i]);
    mx = v > mx ? v : mx;
    if (v >= t) {
      if (c == cand->size()) cand->resize(2 * c + kB);
      (*cand)[c++] = static_cast<uint32_t>(i);
    }
  }
  cand->resize(c);
  return mx;
}

// Keeps the k best candidates (by SelectKey), preserving ascending order.
// REQUIRES: cand->size() >= k.
void CutToK(const float* x, size_t k, std::vector<uint32_t>* cand) {
  if (cand->size() == k) return;
  if (k == 0) {
    cand->clear();
    return;
  }
  std::vector<uint64_t> keys(cand->size());
  for (size_t i = 0; i < cand->size(); ++i) {
    keys[i] = SelectKey(MagBits(x[(*cand)[i]]), (*cand)[i]);
  }
  std::vector<uint64_t> tmp = keys;
  std::nth_element(tmp.begin(), tmp.begin() + (k - 1), tmp.end(),
                   std::greater<uint64_t>());
  const uint64_t kth = tmp[k - 1];
  size_t c = 0;
  for (size_t i = 0; i < cand->size(); ++i) {
    (*cand)[c] = (*cand)[i];
    c += keys[i] >= kth ? 1 : 0;
  }
  cand->resize(c);
}

// Stratified sample of magnitude bits: one draw in each of s equal strata
// (increasing addresses, friendly to the prefetcher).
std::vector<uint32_t> SampleMagnitudes(const float* x, size_t n, size_t k,
                                       uint64_t seed) {
  // ~32 expected draws above the k-th largest, at least 1024 draws, at most
  // n/16 (scattered reads cost more than the sequential pass).
  const double r = static_cast<double>(k) / static_cast<double>(n);
  size_t s = static_cast<size_t>(std::ceil(32.0 / r));
  s = std::max<size_t>(s, 1024);
  s = std::min<size_t>(s, std::max<size_t>(n / 16, 1024));
  s = std::min(s, n);
  std::vector<uint32_t> sample(s);
  const uint32_t key = SeedKey(seed ^ 0x5eedull);
  for (size_t j = 0; j < s; ++j)
    sample[j] = MagBits(x[RandomKIndex(key, j, n, s)]);
  return sample;
}

// Threshold whose expected count is `target` elements: an order statistic
// of the sample (reordered in place).
uint32_t ThresholdFor(std::vector<uint32_t>* sample, size_t n, double target) {
  const double rank =
      target * static_cast<double>(sample->size()) / static_cast<double>(n);
  if (rank >= static_cast<double>(sample->size())) return 0;
  const size_t r = rank < 1.0 ? 0 : static_cast<size_t>(rank) - 1;
  std::nth_element(sample->begin(), sample->begin() + r, sample->end(),
                   std::greater<uint32_t>());
  return (*sample)[r];
}

// Selects indices (ascending) of exactly k (exact) or k +- 10% (sampled)
// largest magnitudes.
Status Select(const float* x, size_t n, size_t k, bool sampled, uint64_t seed,
              std::vector<uint32_t>* idx) {
  if (k == 0) {
    idx->clear();
    // Still reject non-finite input, like every lossy codec.
    if (Collect(x, n, 0xffffffffu, idx) >= kNonFiniteBits) {
      return Status::InvalidArgument("non-finite value in gradient");
    }
    idx->clear();
    return Status::OK();
  }
  if (k * 4 >= n || n < 4096) {
    // Dense selection: every element is a candidate.
    if (Collect(x, n, 0, idx) >= kNonFiniteBits) {
      return Status::InvalidArgument("non-finite value in gradient");
    }
    CutToK(x, k, idx);
    return Status::OK();
  }
  std::vector<uint32_t> sample = SampleMagnitudes(x, n, k, seed);
  const double q = static_cast<double>(k) * sample.size() / n;  // expected hits
  // Aim above k (exact: ~3 sigma, so one pass almost always suffices;
  // sampled: ~1 sigma, an excess is cut to k cheaply, a shortfall rescans).
  const double sigmas = sampled ? 1.0 : 3.0;
  double target = k * (1.0 + sigmas / std::sqrt(std::max(q, 1.0))) + 8;
  idx->resize(static_cast<size_t>(target * 1.25) + 1024);
  for (int attempt = 0;; ++attempt) {
    const uint32_t t = attempt >= 4 ? 0 : ThresholdFor(&sample, n, target);
    if (Collect(x, n, t, idx) >= kNonFiniteBits) {
      return Status::InvalidArgument("non-finite value in gradient");
    }
    const size_t c = idx->size();
    if (sampled && c >= k - k / 10 && c <= k + k / 10) return Status::OK();
    if (c >= k) break;
    // Too few: aim higher, by the observed shortfall and a margin.
    target *= 1.25 * static_cast<double>(k) /
              static_cast<double>(std::max<size_t>(c, 1));
    if (t == 0) break;  // cannot happen: every element passed
  }
  CutToK(x, k, idx);
  return Status::OK();
}

// Top-k and random-k payloads share one layout and one validation.
class SparseCodec : public CodecBase {
 public:
  Status Validate(const uint8_t* p, size_t bytes, size_t n) const override {
    Header h;
    RETURN_IF_ERROR(CheckHeader(p, bytes, n, id(), &h));
    SparseLayout l;
    return CheckSparse(p, bytes, n, &l);
  }
  bool IsSparse() const override { return true; }
};

class TopKCodec final : public SparseCodec {
 public:
  TopKCodec(double ratio, bool sampled) : ratio_(ratio), sampled_(sampled) {}
  CodecId id() const override { return CodecId::kTopK; }
  size_t MaxEncodedBytes(size_t n) const override {
    // Sampled may send up to 10% more than k.
    const size_t k = KForRatio(ratio_, n);
    return kPayloadHeaderBytes + 8 * std::min(n, k + k / 10 + 1);
  }
  Status Encode(const float* x, size_t n, uint64_t seed,
                std::vector<uint8_t>* out) const override {
    return EncodeTopK(x, n, KForRatio(ratio_, n), sampled_, seed, out);
  }

 protected:
  void DecodeUnchecked(const uint8_t* p, size_t n, float alpha, bool add,
                       float* dst) const override {
    const Header h = ReadHeader(p);
    const uint8_t* idx = p + kPayloadHeaderBytes;
    const uint8_t* val = p + kPayloadHeaderBytes + 4ull * h.p1;
    if (add) {
      for (size_t i = 0; i < h.p1; ++i) {
        dst[LoadAt<uint32_t>(idx, i)] += alpha * LoadAt<float>(val, i);
      }
    } else {
      std::fill(dst, dst + n, 0.0f);
      for (size_t i = 0; i < h.p1; ++i) {
        dst[LoadAt<uint32_t>(idx, i)] = LoadAt<float>(val, i);
      }
    }
  }

 private:
  double ratio_;
  bool sampled_;
};

class RandomKCodec final : public SparseCodec {
 public:
  explicit RandomKCodec(double ratio) : ratio_(ratio) {}
  CodecId id() const override { return CodecId::kRandomK; }
  size_t MaxEncodedBytes(size_t n) const override {
    return kPayloadHeaderBytes + 4 * KForRatio(ratio_, n);
  }
  Status Encode(const float* x, size_t n, uint64_t seed,
                std::vector<uint8_t>* out) const override {
    return EncodeRandomK(x, n, KForRatio(ratio_, n), seed, out);
  }

 protected:
  void DecodeUnchecked(const uint8_t* p, size_t n, float alpha, bool add,
                       float* dst) const override {
    const Header h = ReadHeader(p);
    const uint32_t key = SeedKey(h.seed);
    const uint64_t k = h.p1;
    const uint8_t* val = p + kPayloadHeaderBytes;
    if (!add) std::fill(dst, dst + n, 0.0f);
    for (uint64_t j = 0; j < k; ++j) {
      const uint32_t i = RandomKIndex(key, j, n, k);
      if (add) {
        dst[i] += alpha * LoadAt<float>(val, j);
      } else {
        dst[i] = LoadAt<float>(val, j);
      }
    }
  }

 private:
  double ratio_;
};

}  // namespace

Status EncodeTopK(const float* x, size_t n, size_t k, bool sampled,
                  uint64_t seed, std::vector<uint8_t>* out) {
  if (k > n) return Status::InvalidArgument("top-k: k > n");
  if (x == nullptr && n > 0) return Status::InvalidArgument("null input");
  if (n > std::numeric_limits<uint32_t>::max()) {
    return Status::InvalidArgument("element count exceeds 2^32-1");
  }
  std::vector<uint32_t> idx;
  RETURN_IF_ERROR(Select(x, n, k, sampled, seed, &idx));
  const size_t kk = idx.size();
  ASSIGN_OR_RETURN(uint8_t * body,
                   BeginPayload(CodecId::kTopK, x, n, static_cast<uint32_t>(kk),
                                0, seed, 8ull * kk, out));
  auto* oi = reinterpret_cast<UnalignedU32*>(body);
  auto* ov = reinterpret_cast<UnalignedF32*>(body + 4 * kk);
  for (size_t i = 0; i < kk; ++i) {
    oi[i] = idx[i];
    ov[i] = x[idx[i]];
  }
  return Status::OK();
}

Status EncodeRandomK(const float* x, size_t n, size_t k, uint64_t seed,
                     std::vector<uint8_t>* out) {
  if (k > n) return Status::InvalidArgument("random-k: k > n");
  ASSIGN_OR_RETURN(uint8_t * body, BeginPayload(CodecId::kRandomK, x, n,
                                                static_cast<uint32_t>(k), 0,
                                                seed, 4ull * k, out));
  const uint32_t key = SeedKey(seed);
  auto* ov = reinterpret_cast<UnalignedF32*>(body);
  uint32_t mx = 0;
  for (size_t j = 0; j < k; ++j) {
    const float v = x[RandomKIndex(key, j, n, k)];
    const uint32_t m = MagBits(v);
    mx = m > mx ? m : mx;
    ov[j] = v;
  }
  if (mx >= kNonFiniteBits) {
    out->clear();
    return Status::InvalidArgument("non-finite value in gradient");
  }
  return Status::OK();
}

std::unique_ptr<Codec> NewTopKCodec(double ratio, bool sampled) {
  return std::make_unique<TopKCodec>(ratio, sampled);
}
std::unique_ptr<Codec> NewRandomKCodec(double ratio) {
  return std::make_unique<RandomKCodec>(ratio);
}

}  // namespace asyncps::compression::internal
