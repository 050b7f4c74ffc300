// Gradient codecs: stateless encoders/decoders of float tensors.
//
// A Codec turns n floats into a self-describing payload and back. Every
// payload starts with a fixed 24-byte header (magic, codec id, version,
// element count and the codec's parameters: bucket, levels, k, seed; see
// compression/internal/format.h), so a receiver needs only the payload and
// the expected element count to decode it: CodecForId(id) decodes anything
// that CreateCodec(spec) encoded, whatever the spec's parameters were.
//
// Lossy codecs (everything but kNone, kFp16, kBf16) reject non-finite input
// with InvalidArgument. Decoders check the whole payload before writing: on
// error `dst` is untouched and nothing outside the payload is read.
//
// Ownership: codecs hold only their parameters. Thread safety: Codec objects
// are immutable; all methods are const and may be called concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace asyncps::compression {

// Travels on the wire: never renumber.
enum class CodecId : uint8_t {
  kNone = 0,      // raw float32.
  kFp16 = 1,      // IEEE half, round to nearest even.
  kBf16 = 2,      // bfloat16, round to nearest even.
  kInt8 = 3,      // per-bucket scale max|x|/127, round to nearest.
  kQsgd = 4,      // QSGD: per-bucket L2 norm, s levels, stochastic, unbiased.
  kTernGrad = 5,  // per-bucket max|x|, stochastic ternary, unbiased.
  kSign = 6,      // 1 bit per element, per-bucket scale mean|x|.
  kTopK = 7,      // k largest magnitudes: k indices + k values.
  kRandomK = 8,   // one value per stratum; indices regenerated from the seed.
};
inline constexpr int kNumCodecs = 9;

// "none", "fp16", ... ; "invalid" for an out-of-range id.
const char* CodecName(CodecId id);

// A parsed `--codec` spec, e.g. "qsgd:levels=4,bucket=512" or
// "topk:ratio=0.001,ef=1,momentum=0.9,warmup_epochs=4". Fields that do not
// apply to `id` keep their defaults and are ignored.
struct CodecSpec {
  CodecId id = CodecId::kNone;
  // topk/randomk: fraction of elements sent, in (0, 1]. Default: 0.01.
  double ratio = 0.01;
  // qsgd: number of quantisation levels s, 1..127 (s <= 7 packs 4 bits per
  // element, else 8). Default: 4.
  int levels = 4;
  // int8/qsgd/terngrad/sign: elements per scale, a multiple of 8 in
  // [8, 2^24]. Default: 512.
  int bucket = 512;
  // topk: false = exactly the k largest magnitudes (ties: lower index
  // first); true = DGC-style sampled threshold, k within 10%. Default: false.
  bool sampled = false;
  // Error feedback (Compressor only): the quantisation error is kept and
  // added to the next gradient. Not allowed with kNone. Default: false.
  bool error_feedback = false;
  // DGC momentum correction (Compressor only; topk/randomk, needs ef=1), in
  // [0, 1). Default: 0 (off).
  float momentum = 0.0f;
  // DGC sparsity warm-up (Compressor only; topk/randomk): the ratio decays
  // exponentially from 0.25 to `ratio` over this many epochs. Default: 0.
  double warmup_epochs = 0.0;
  // Tensors/chunks with fewer elements travel uncompressed (kNone).
  // Default: 1024 for lossy codecs, 0 for none/fp16/bf16.
  size_t min_elems = 0;

  // Parses a spec. Unknown codecs, keys or malformed values return
  // InvalidArgument whose message lists the valid specs.
  static StatusOr<CodecSpec> Parse(std::string_view spec);
  // Canonical form; Parse(ToString()) yields an equal spec.
  std::string ToString() const;
  // The default min_elems for `id`.
  static size_t DefaultMinElems(CodecId id);
  // Checks ranges and key/codec combinations (Parse calls it).
  Status Validate() const;

  bool operator==(const CodecSpec& o) const;
};

// Size of the header that starts every payload.
inline constexpr size_t kPayloadHeaderBytes = 24;

class Codec {
 public:
  virtual ~Codec() = default;

  virtual CodecId id() const = 0;

  // Upper bound on encoded bytes for n elements.
  virtual size_t MaxEncodedBytes(size_t n) const = 0;

  // Encodes n floats (n < 2^32). `seed` drives stochastic rounding and
  // random-k index choice. `out` is resized to the exact payload size.
  virtual Status Encode(const float* x, size_t n, uint64_t seed,
                        std::vector<uint8_t>* out) const = 0;

  // Checks the payload for n elements (header, sizes, index bounds, finite
  // scales) without writing anything. InvalidArgument when the payload is
  // for another codec or count, Corruption when it is damaged.
  virtual Status Validate(const uint8_t* p, size_t bytes, size_t n) const = 0;

  // dst[i] += alpha * decoded[i]. Validates first: on error dst is untouched.
  virtual Status DecodeAdd(const uint8_t* p, size_t bytes, size_t n,
                           float alpha, float* dst) const = 0;

  // dst[i] = decoded[i]. Validates first: on error dst is untouched.
  virtual Status Decode(const uint8_t* p, size_t bytes, size_t n,
                        float* dst) const = 0;

  // True for topk/randomk: ParseSparse/ForEachSparse read their payloads.
  virtual bool IsSparse() const { return false; }
};

// An encoder with `spec`'s parameters (wrapper keys ef/momentum/warmup/
// min_elems are the Compressor's business and are ignored here).
StatusOr<std::unique_ptr<Codec>> CreateCodec(const CodecSpec& spec);

// A decoder for `id` (its Encode uses default parameters). Static immutable
// instances; an out-of-range id yields a codec whose every call fails with
// InvalidArgument.
const Codec& CodecForId(CodecId id);

// Reads the codec id from a payload header (checks only the magic byte).
StatusOr<CodecId> PeekCodecId(const uint8_t* p, size_t bytes);

// Decodes any payload: dst[i] += alpha * decoded[i] with the codec named by
// the header. Convenience for the server.
Status DecodeAddAny(const uint8_t* p, size_t bytes, size_t n, float alpha,
                    float* dst);

// A validated view of a topk/randomk payload: k (index, value) pairs with
// strictly increasing indices < n. Points into the payload (which must
// outlive the view); nothing is densified.
class SparseView {
 public:
  size_t k() const { return k_; }
  // REQUIRES: i < k().
  uint32_t index(size_t i) const;
  float value(size_t i) const;

  // Calls f(uint32_t index, float value) for each pair, in index order.
  template <typename F>
  void ForEach(F&& f) const {
    for (size_t i = 0; i < k_; ++i) f(index(i), value(i));
  }

 private:
  friend StatusOr<SparseView> ParseSparse(const uint8_t*, size_t, size_t);
  size_t k_ = 0;
  size_t n_ = 0;
  const uint8_t* indices_ = nullptr;  // topk: k little-endian uint32.
  const uint8_t* values_ = nullptr;   // k little-endian float32.
  uint32_t key_ = 0;                  // randomk: stream key from the seed.
};

// Validates a topk/randomk payload for n elements and returns its view.
// InvalidArgument for dense codecs.
StatusOr<SparseView> ParseSparse(const uint8_t* p, size_t bytes, size_t n);

// Validates, then calls f(uint32_t index, float value) for each pair.
template <typename F>
Status ForEachSparse(const uint8_t* p, size_t bytes, size_t n, F&& f) {
  StatusOr<SparseView> view = ParseSparse(p, bytes, n);
  if (!view.ok()) return view.status();
  view->ForEach(f);
  return Status::OK();
}

}  // namespace asyncps::compression
