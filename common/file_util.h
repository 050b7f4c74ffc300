// Small file helpers shared by the binaries and libraries.
//
// Thread safety: the functions are thread-compatible (distinct paths from
// different threads are fine).
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace asyncps {

// Writes `content` to `path` atomically: into "<path>.tmp", then rename(2),
// so a reader polling for `path` (a launcher waiting for a ready file) never
// sees a partial file. Unavailable with the path when either step fails.
Status WriteFileAtomically(const std::string& path, std::string_view content);

}  // namespace asyncps
