// A vectorised check that floats are finite (neither NaN nor +-Inf), used
// on every gradient before it is applied. Not part of the server API.
#pragma once

#include <cstddef>

namespace asyncps::server::internal {

// True if no element of x[0..n) is NaN or +-Inf.
bool AllFinite(const float* x, size_t n);

}  // namespace asyncps::server::internal
