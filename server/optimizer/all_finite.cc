#include "server/internal/all_finite.h"

#include <cstdint>
#include <cstring>

namespace asyncps::server::internal {

// Branch-free integer reduction over the exponent bits (all ones: NaN or
// Inf), so it vectorises; an AVX2 clone is picked at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(ASYNCPS_NO_IFUNC)
__attribute__((target_clones("avx2", "default")))
#endif
bool AllFinite(const float* __restrict__ x, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, sizeof(b));
    bad |= static_cast<uint32_t>((b & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

}  // namespace asyncps::server::internal
