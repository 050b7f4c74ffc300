// Compressor: the worker-side, stateful wrapper around a Codec.
//
// It owns, per chunk, the error-feedback residual and the DGC momentum
// buffer, applies sparsity warm-up, sends chunks below spec.min_elems
// uncompressed, and keeps byte/time accounting.
//  - Error feedback (ef=1): acc = residual + g; payload = encode(acc);
//    residual = acc - decode(payload). So transmitted + residual equals the
//    sum of all gradients fed in (up to float rounding of the subtraction;
//    exact for sparse codecs).
//  - DGC momentum correction (momentum=m, topk/randomk): u = m*u + g;
//    v += u; payload = sparsify(v); u and v are zeroed where transmitted.
//  - Warm-up (warmup_epochs=E): the sent ratio decays exponentially from
//    0.25 to spec.ratio over the first E epochs.
//
// Ownership: owns its buffers (sum of chunk sizes floats each for residual
// and momentum, when enabled). Thread safety: not thread-safe; use one
// Compressor per thread or guard it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "compression/codec.h"

namespace asyncps::compression {

struct CompressorOptions {
  // Codec and wrapper settings. Default: none.
  CodecSpec spec;
  // Base seed of the stochastic codecs; each (chunk, step) derives its own.
  // Default: 0.
  uint64_t seed = 0;
};

class Compressor {
 public:
  // chunk_sizes[i]: element count of chunk i (each < 2^32).
  static StatusOr<std::unique_ptr<Compressor>> Create(
      const CompressorOptions& options, const std::vector<size_t>& chunk_sizes);

  // Compresses gradient g (chunk_sizes[chunk] floats) of `chunk` at training
  // `epoch` (fractional, drives warm-up) and `step` into `out` (resized to
  // the payload). Returns the codec actually used: kNone below min_elems.
  // On error the chunk's residual/momentum are unchanged unless the error
  // came from non-finite input (then they may hold the non-finite sum).
  StatusOr<CodecId> Compress(size_t chunk, const float* g, double epoch,
                             uint64_t step, std::vector<uint8_t>* out);

  // Totals since creation.
  struct Stats {
    uint64_t raw_bytes = 0;   // 4 bytes per element compressed
    uint64_t wire_bytes = 0;  // payload bytes produced
    uint64_t encode_ns = 0;   // time spent in Compress
    uint64_t chunks = 0;      // successful Compress calls
  };
  const Stats& stats() const { return stats_; }

  // The sparsification ratio used at `epoch` (spec.ratio after warm-up).
  double RatioAt(double epoch) const;

  // Error-feedback residual of `chunk` (empty without ef or below
  // min_elems). For tests and checkpoints.
  const std::vector<float>& residual(size_t chunk) const {
    return residual_[chunk];
  }

  const CodecSpec& spec() const { return options_.spec; }

 private:
  Compressor(const CompressorOptions& options, std::unique_ptr<Codec> codec,
             std::vector<size_t> sizes);

  Status Encode(const float* x, size_t n, double epoch, uint64_t seed,
                std::vector<uint8_t>* out) const;

  const CompressorOptions options_;
  const std::unique_ptr<Codec> codec_;
  const std::vector<size_t> sizes_;
  std::vector<std::vector<float>> residual_;  // ef: per chunk
  std::vector<std::vector<float>> momentum_;  // DGC: per chunk
  Stats stats_;
};

}  // namespace asyncps::compression
