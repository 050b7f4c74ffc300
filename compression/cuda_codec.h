// DeviceCodec: encodes gradients that live in GPU memory and decodes payloads
// into GPU memory, producing the same payload format as the CPU codecs.
//
// Deterministic codecs (none, fp16, bf16, int8, sign, topk exact, randomk)
// and the stochastic ones (qsgd, terngrad: same counter-based RNG) produce
// byte-identical payloads to CodecForId(...).Encode for the same input and
// seed. Sampled top-k runs the exact selection on the GPU (k elements, which
// satisfies the sampled contract), so its payload may differ from the CPU's.
//
// Exposes no CUDA types: device pointers are plain float*, and CUDA errors
// become Status (kUnavailable when no device, kInternal otherwise) in one
// place. Built without CUDA, Create succeeds but every call returns
// Unimplemented and DeviceAvailable() is false.
//
// Ownership: owns a stream and scratch device memory, grown on demand.
// Thread safety: not thread-safe (one DeviceCodec per thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "compression/codec.h"

namespace asyncps::compression {

class DeviceCodec {
 public:
  static StatusOr<std::unique_ptr<DeviceCodec>> Create(const CodecSpec& spec);
  ~DeviceCodec();
  DeviceCodec(const DeviceCodec&) = delete;
  DeviceCodec& operator=(const DeviceCodec&) = delete;

  // True when this build has CUDA and at least one device is visible.
  static bool DeviceAvailable();

  // Encodes n floats at device pointer d_x into host_out (resized to the
  // payload). Synchronous.
  Status EncodeDevice(const float* d_x, size_t n, uint64_t seed,
                      std::vector<uint8_t>* host_out);

  // topk/randomk with an explicit k instead of the spec's ratio (the
  // Compressor's sparsity warm-up changes k every step); same payload as
  // internal::EncodeTopK (exact) / EncodeRandomK. InvalidArgument for dense
  // codecs or k > n.
  Status EncodeSparseDevice(const float* d_x, size_t n, size_t k, uint64_t seed,
                            std::vector<uint8_t>* host_out);

  // Validates the host payload (CPU), then d_dst[i] = decoded[i] on the
  // device. Synchronous. On error d_dst is untouched.
  Status DecodeDevice(const uint8_t* payload, size_t bytes, size_t n,
                      float* d_dst);

  // As DecodeDevice, but d_dst[i] += alpha * decoded[i].
  Status DecodeAddDevice(const uint8_t* payload, size_t bytes, size_t n,
                         float alpha, float* d_dst);

  const CodecSpec& spec() const { return spec_; }

 private:
  struct Impl;
  DeviceCodec(const CodecSpec& spec, std::unique_ptr<Impl> impl);
  // k_override: k for topk/randomk; SIZE_MAX = from spec_.ratio.
  Status EncodeImpl(const float* d_x, size_t n, size_t k_override,
                    uint64_t seed, std::vector<uint8_t>* host_out);
  Status DecodeImpl(const uint8_t* payload, size_t bytes, size_t n, float alpha,
                    bool add, float* d_dst);

  CodecSpec spec_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace asyncps::compression
