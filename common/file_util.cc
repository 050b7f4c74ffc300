#include "common/file_util.h"

#include <cstdio>
#include <fstream>

namespace asyncps {

Status WriteFileAtomically(const std::string& path, std::string_view content) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc | std::ios::binary);
    f.write(content.data(), static_cast<std::streamsize>(content.size()));
    f.flush();
    if (!f) return Status::Unavailable("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::Unavailable("cannot rename " + tmp + " to " + path);
  }
  return Status::OK();
}

}  // namespace asyncps
