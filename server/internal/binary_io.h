// Little-endian fixed-width encoding helpers for the shard's store records
// (x86 and ARM hosts are LE; the formats are documented in shard_persist.cc).
// Not part of the server API.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>

namespace asyncps::server {

namespace internal {

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
    if (n == 0) return true;  // dst may be null (an empty vector's data())
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
