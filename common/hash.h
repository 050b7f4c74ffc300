// Small, fast, platform-independent mixing functions for seeds and
// counter-based random numbers. Results are identical on every machine, so
// processes that share a seed draw the same values (initial weights,
// shuffles) without talking to each other.
#pragma once

#include <cstdint>

namespace asyncps {

// SplitMix64 (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace asyncps
