// Ref-counted byte buffers that can be handed to ZeroMQ without copying.
//
// A Buffer owns a 64-byte aligned block. It is shared through BufferPtr
// (std::shared_ptr): the transport keeps a reference until ZeroMQ has sent
// the bytes, so the producer may drop its own reference right after Send().
// A Buffer is not synchronised: write it before sharing, then only read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace asyncps {

class Buffer {
 public:
  // Allocates `bytes` uninitialised bytes, 64-byte aligned.
  static std::shared_ptr<Buffer> Allocate(size_t bytes);
  // Takes over a vector's storage (no copy).
  static std::shared_ptr<Buffer> FromVector(std::vector<uint8_t>&& bytes);

  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  float* floats() { return reinterpret_cast<float*>(data_); }
  const float* floats() const { return reinterpret_cast<const float*>(data_); }

  // Shrinks the visible size (never grows it). REQUIRES: n <= capacity.
  void Truncate(size_t n);

 private:
  Buffer() = default;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
  bool aligned_alloc_ = false;
  std::vector<uint8_t> vec_;
};

using BufferPtr = std::shared_ptr<Buffer>;

// A read-only view of bytes kept alive by `owner` (a Buffer, a received ZeroMQ
// message, ...). Copying a ByteView copies the reference, never the bytes.
struct ByteView {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;
};

}  // namespace asyncps
