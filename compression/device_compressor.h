// DeviceCompressor: the Compressor (compression/compressor.h) for gradients
// that live in GPU memory. A GPU worker compresses on the device and copies
// only the payload to the host.
//
// Same semantics, seeds and payloads as Compressor, with the per-chunk state
// (error-feedback residual, DGC momentum) in device memory:
//  - ef=1: acc = residual + g; payload = encode(acc); residual = acc -
//    decode(payload), all on the device (the payload is copied to the host,
//    and back for the decode).
//  - momentum=m: u = m*u + g; v += u; u and v zeroed where transmitted.
//  - warmup_epochs: the same ratio schedule (internal::WarmupRatio).
//  - chunks below spec.min_elems: kNone (raw fp32 payload, copied to host).
// Each (chunk, step) uses the same seed as Compressor, so for deterministic
// codecs (fp16, bf16, int8, sign, exact topk, randomk) and the counter-RNG
// ones (qsgd, terngrad) payloads and residuals are bit-identical to the
// CPU's. Sampled top-k runs the exact selection on the GPU (see
// compression/cuda_codec.h), so its payloads may differ from the CPU's.
//
// Exposes no CUDA types: device pointers are plain float*. Without CUDA in
// the build, or without a visible device, Create returns Unavailable.
//
// Ownership: owns device buffers (sum of chunk sizes floats each for the
// residual and the momentum, when enabled), a stream and a DeviceCodec.
// The gradients passed in are borrowed, read only during the call, and must
// be complete (their producing stream synchronised) when it starts.
// Thread safety: not thread-safe; use one DeviceCompressor per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "compression/codec.h"
#include "compression/compressor.h"

namespace asyncps::compression {

class DeviceCompressor {
 public:
  // As Compressor::Create. Unavailable without CUDA or a visible device.
  static StatusOr<std::unique_ptr<DeviceCompressor>> Create(
      const CompressorOptions& options, const std::vector<size_t>& chunk_sizes);
  ~DeviceCompressor();
  DeviceCompressor(const DeviceCompressor&) = delete;
  DeviceCompressor& operator=(const DeviceCompressor&) = delete;

  // Compresses the gradient at device pointer d_g (chunk_sizes[chunk]
  // floats) of `chunk` at `epoch` and `step` into host buffer `out`.
  // Returns the codec used (kNone below min_elems). Synchronous. Errors as
  // Compressor::Compress; CUDA failures are Internal (ResourceExhausted when
  // out of device memory).
  StatusOr<CodecId> Compress(size_t chunk, const float* d_g, double epoch,
                             uint64_t step, std::vector<uint8_t>* out);

  // Copies n floats from device pointer d_src to host_dst (raw pushes of
  // small chunks). Synchronous.
  Status CopyToHost(const float* d_src, size_t n, float* host_dst);

  using Stats = Compressor::Stats;
  // Totals since creation (encode_ns includes the device work and copies).
  const Stats& stats() const { return stats_; }

  // As Compressor::RatioAt.
  double RatioAt(double epoch) const;

  // Copies the error-feedback residual (DGC: the accumulated v) of `chunk`
  // to the host; empty without ef or below min_elems. For tests.
  Status ResidualToHost(size_t chunk, std::vector<float>* out) const;
  // Copies the DGC momentum u of `chunk`; empty without momentum.
  Status MomentumToHost(size_t chunk, std::vector<float>* out) const;

  const CodecSpec& spec() const { return options_.spec; }

 private:
  struct Impl;
  DeviceCompressor(const CompressorOptions& options, std::vector<size_t> sizes,
                   std::unique_ptr<Impl> impl);

  const CompressorOptions options_;
  const std::vector<size_t> sizes_;
  std::unique_ptr<Impl> impl_;
  Stats stats_;
};

}  // namespace asyncps::compression
