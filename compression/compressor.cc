#include "compression/compressor.h"

#include <chrono>
#include <cmath>
#include <limits>

#include "compression/internal/codecs.h"

namespace asyncps::compression {

using internal::IsSparseId;

namespace internal {
double WarmupRatio(const CodecSpec& s, double epoch) {
  constexpr double kWarmupStartRatio = 0.25;
  if (s.warmup_epochs <= 0.0 || epoch >= s.warmup_epochs ||
      s.ratio >= kWarmupStartRatio) {
    return s.ratio;
  }
  const double f = std::max(0.0, epoch) / s.warmup_epochs;
  return kWarmupStartRatio * std::pow(s.ratio / kWarmupStartRatio, f);
}
}  // namespace internal

StatusOr<std::unique_ptr<Compressor>> Compressor::Create(
    const CompressorOptions& options, const std::vector<size_t>& chunk_sizes) {
  RETURN_IF_ERROR(options.spec.Validate());
  for (size_t n : chunk_sizes) {
    if (n > std::numeric_limits<uint32_t>::max()) {
      return Status::InvalidArgument("chunk larger than 2^32-1 elements");
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, CreateCodec(options.spec));
  return std::unique_ptr<Compressor>(
      new Compressor(options, std::move(codec), chunk_sizes));
}

Compressor::Compressor(const CompressorOptions& options,
                       std::unique_ptr<Codec> codec, std::vector<size_t> sizes)
    : options_(options), codec_(std::move(codec)), sizes_(std::move(sizes)) {
  residual_.resize(sizes_.size());
  momentum_.resize(sizes_.size());
  const CodecSpec& s = options_.spec;
  for (size_t c = 0; c < sizes_.size(); ++c) {
    if (sizes_[c] < s.min_elems) continue;
    if (s.error_feedback) residual_[c].assign(sizes_[c], 0.0f);
    if (s.momentum > 0.0f) momentum_[c].assign(sizes_[c], 0.0f);
  }
}

double Compressor::RatioAt(double epoch) const {
  return internal::WarmupRatio(options_.spec, epoch);
}

Status Compressor::Encode(const float* x, size_t n, double epoch, uint64_t seed,
                          std::vector<uint8_t>* out) const {
  const CodecSpec& s = options_.spec;
  if (IsSparseId(s.id) && s.warmup_epochs > 0.0) {
    const size_t k = internal::KForRatio(RatioAt(epoch), n);
    return s.id == CodecId::kTopK
               ? internal::EncodeTopK(x, n, k, s.sampled, seed, out)
               : internal::EncodeRandomK(x, n, k, seed, out);
  }
  return codec_->Encode(x, n, seed, out);
}

StatusOr<CodecId> Compressor::Compress(size_t chunk, const float* g,
                                       double epoch, uint64_t step,
                                       std::vector<uint8_t>* out) {
  if (chunk >= sizes_.size()) {
    return Status::InvalidArgument("chunk index out of range");
  }
  if (g == nullptr || out == nullptr) {
    return Status::InvalidArgument("null gradient or output");
  }
  const auto start = std::chrono::steady_clock::now();
  const size_t n = sizes_[chunk];
  const CodecSpec& s = options_.spec;
  const uint64_t seed = internal::ChunkSeed(options_.seed, chunk, step);
  CodecId used = s.id;
  if (n < s.min_elems) {
    used = CodecId::kNone;
    RETURN_IF_ERROR(CodecForId(CodecId::kNone).Encode(g, n, seed, out));
  } else if (!s.error_feedback) {
    RETURN_IF_ERROR(Encode(g, n, epoch, seed, out));
  } else {
    std::vector<float>& v = residual_[chunk];
    if (s.momentum > 0.0f) {
      std::vector<float>& u = momentum_[chunk];
      const float m = s.momentum;
      for (size_t i = 0; i < n; ++i) {
        u[i] = m * u[i] + g[i];
        v[i] += u[i];
      }
    } else {
      for (size_t i = 0; i < n; ++i) v[i] += g[i];
    }
    RETURN_IF_ERROR(Encode(v.data(), n, epoch, seed, out));
    // residual = acc - decode(payload).
    RETURN_IF_ERROR(
        codec_->DecodeAdd(out->data(), out->size(), n, -1.0f, v.data()));
    if (s.momentum > 0.0f) {
      // Momentum factor masking: zero u where transmitted.
      float* u = momentum_[chunk].data();
      RETURN_IF_ERROR(ForEachSparse(out->data(), out->size(), n,
                                    [u](uint32_t i, float) { u[i] = 0.0f; }));
    }
  }
  stats_.raw_bytes += 4ull * n;
  stats_.wire_bytes += out->size();
  stats_.chunks += 1;
  stats_.encode_ns += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now() - start)
          .count());
  return used;
}

}  // namespace asyncps::compression
