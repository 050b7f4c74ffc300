#include "common/etcd_security.h"

#include <sys/stat.h>

#include <fstream>

namespace asyncps {

Status LoadEtcdPassword(const std::string& path, std::string* password) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return Status::InvalidArgument("etcd password file " + path + " not found");
  }
  if ((st.st_mode & 077) != 0) {
    return Status::InvalidArgument("etcd password file " + path +
                                   " is readable by others (chmod 600 it)");
  }
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) line.clear();
  while (!line.empty() && (line.back() == '\r' || line.back() == ' '))
    line.pop_back();
  if (line.empty()) {
    return Status::InvalidArgument("etcd password file " + path +
                                   ": no password on its first line");
  }
  *password = std::move(line);
  return Status::OK();
}

}  // namespace asyncps
