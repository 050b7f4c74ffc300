// Private types of server/shard.h shared by shard.cc, shard_push.cc and
// shard_persist.cc. Not part of the server API.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/buffer.h"
#include "common/wire.h"
#include "server/shard.h"

namespace asyncps::server {

// One chunk owned by this shard.
struct Shard::Chunk {
  uint32_t id = 0;
  uint64_t n = 0;              // elements
  std::vector<float> w;        // weights, n
  std::vector<float> state;    // optimizer state, n * state_per_elem
  std::vector<float> acc;      // BSP: sum of this round's gradients, n
  std::vector<float> scratch;  // decoded / realigned gradient, n (lazy)
  uint64_t version = 0;        // updates applied to this chunk
  uint64_t step = 0;           // optimizer steps (Adam bias correction)
  uint32_t contributors = 0;   // BSP: pushes summed into acc this round
  uint64_t stamp = 0;          // push validation: seen in push #stamp
  BufferPtr snapshot;          // weights as of snapshot_version (pulls)
  uint64_t snapshot_version = ~uint64_t{0};
};

// One validated gradient of a push, waiting for phase 2 (apply).
struct Shard::PendingGrad {
  Chunk* chunk = nullptr;
  const float* dense = nullptr;     // dense gradient (frame or scratch), or
  const uint8_t* sparse = nullptr;  // a validated top-k / random-k payload
  size_t bytes = 0;
};

struct Shard::ParkedPull {
  std::string peer;
  RequestHeader req;
};

namespace internal {

// Little-endian fixed-width encoding helpers (x86 and ARM hosts are LE;
// the formats are documented in shard_persist.cc).
template <typename T>
inline void Put(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  template <typename T>
  bool Get(T* v) {
    if (s_.size() < sizeof(T)) return false;
    std::memcpy(v, s_.data(), sizeof(T));
    s_.remove_prefix(sizeof(T));
    return true;
  }
  bool GetBytes(void* dst, size_t n) {
    if (s_.size() < n) return false;
    std::memcpy(dst, s_.data(), n);
    s_.remove_prefix(n);
    return true;
  }
  size_t remaining() const { return s_.size(); }

 private:
  std::string_view s_;
};

}  // namespace internal
}  // namespace asyncps::server
