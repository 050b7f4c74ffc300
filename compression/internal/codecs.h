// Private to compression/: codec factories and helpers shared by the codec
// implementations, the Compressor and the CUDA codec.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/status.h"
#include "compression/codec.h"
#include "compression/internal/format.h"

namespace asyncps::compression::internal {

std::unique_ptr<Codec> NewNoneCodec();
std::unique_ptr<Codec> NewFp16Codec();
std::unique_ptr<Codec> NewBf16Codec();
std::unique_ptr<Codec> NewInt8Codec(int bucket);
std::unique_ptr<Codec> NewQsgdCodec(int levels, int bucket);
std::unique_ptr<Codec> NewTernGradCodec(int bucket);
std::unique_ptr<Codec> NewSignCodec(int bucket);
std::unique_ptr<Codec> NewTopKCodec(double ratio, bool sampled);
std::unique_ptr<Codec> NewRandomKCodec(double ratio);

// k for a sparse codec: round(ratio * n) clamped to [1, n] (0 when n == 0).
size_t KForRatio(double ratio, size_t n);

// The seed of `chunk` at `step` under the base seed: Compressor and
// DeviceCompressor derive the same one, so their payloads match.
inline uint64_t ChunkSeed(uint64_t base, size_t chunk, uint64_t step) {
  return Mix64(base ^ Mix64((static_cast<uint64_t>(chunk) << 40) ^ step));
}

// DGC sparsity warm-up: the ratio sent at `epoch` (spec.ratio once
// spec.warmup_epochs have passed, and without warm-up).
double WarmupRatio(const CodecSpec& spec, double epoch);

// True for the sparse codecs (topk, randomk).
inline bool IsSparseId(CodecId id) {
  return id == CodecId::kTopK || id == CodecId::kRandomK;
}

// Top-k / random-k with an explicit k (the Compressor's warm-up changes k
// every step). REQUIRES: k <= n.
Status EncodeTopK(const float* x, size_t n, size_t k, bool sampled,
                  uint64_t seed, std::vector<uint8_t>* out);
Status EncodeRandomK(const float* x, size_t n, size_t k, uint64_t seed,
                     std::vector<uint8_t>* out);

// Checks size >= header, magic, version, codec id and element count; fills
// `h`. The common prefix of every Validate.
Status CheckHeader(const uint8_t* p, size_t bytes, size_t n, CodecId id,
                   Header* h);

// Checks a bucket parameter read from a header.
Status CheckBucket(uint32_t bucket);

// True if all count floats (unaligned, little-endian) are finite and >= 0.
bool ScalesOk(const uint8_t* p, size_t count);

// Number of buckets.
inline uint64_t NumBuckets(uint64_t n, uint64_t bucket) {
  return (n + bucket - 1) / bucket;
}

// Bits per element of QSGD with `levels` levels.
inline int QsgdBits(uint32_t levels) { return levels <= 7 ? 4 : 8; }

// Unaligned, aliasing-safe views of payload bytes (GCC/Clang): let the
// compiler vectorise loads and stores at any payload offset.
typedef float UnalignedF32 __attribute__((may_alias, aligned(1)));
typedef uint16_t UnalignedU16 __attribute__((may_alias, aligned(1)));
typedef uint32_t UnalignedU32 __attribute__((may_alias, aligned(1)));

// Element i of an array of T that may sit at any address (received payload
// bytes): memcpy is the defined way to read it, and compiles to one load.
// Encoders write into their own vector, whose body is aligned.
template <typename T>
inline T LoadAt(const uint8_t* base, size_t i) {
  T v;
  std::memcpy(&v, base + i * sizeof(T), sizeof(T));
  return v;
}

// Checks the arguments of Encode, resizes `out` to header + body_bytes,
// writes the header and returns the body.
StatusOr<uint8_t*> BeginPayload(CodecId id, const float* x, size_t n,
                                uint32_t p1, uint32_t p2, uint64_t seed,
                                uint64_t body_bytes, std::vector<uint8_t>* out);

// Base of the codecs: Decode/DecodeAdd run Validate, then an unchecked
// decoder.
class CodecBase : public Codec {
 public:
  Status DecodeAdd(const uint8_t* p, size_t bytes, size_t n, float alpha,
                   float* dst) const final;
  Status Decode(const uint8_t* p, size_t bytes, size_t n,
                float* dst) const final;

 protected:
  // REQUIRES: Validate(p, bytes, n) passed. add: dst += alpha * v, else
  // dst = v.
  virtual void DecodeUnchecked(const uint8_t* p, size_t n, float alpha,
                               bool add, float* dst) const = 0;
};

// Checks a sparse payload and returns k and where indices (topk; null for
// randomk) and values start.
struct SparseLayout {
  CodecId id = CodecId::kTopK;
  uint64_t k = 0;
  const uint8_t* indices = nullptr;
  const uint8_t* values = nullptr;
  uint32_t key = 0;
};
Status CheckSparse(const uint8_t* p, size_t bytes, size_t n,
                   SparseLayout* layout);

}  // namespace asyncps::compression::internal
