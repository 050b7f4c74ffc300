// Small, fast, platform-independent mixing functions for seeds and
// counter-based random numbers. Results are identical on every machine, so
// processes that share a seed draw the same values (initial weights,
// shuffles, the shard of a sparse key) without talking to each other.
#pragma once

#include <cstdint>
#include <string_view>

namespace asyncps {

// SplitMix64 (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a of a name: the stream of a tensor's or a table's initial values.
inline uint64_t HashName(std::string_view s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// Uniform in (0, 1), from the top 24 bits.
inline float UnitFloat(uint64_t bits) {
  return (static_cast<float>(bits >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

}  // namespace asyncps
