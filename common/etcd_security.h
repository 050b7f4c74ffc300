// EtcdSecurity: TLS files and credentials of an etcd client, a plain
// struct of its own so that options structs can carry it without the etcd
// client (common/etcd_client.h) or its HTTP library.
#pragma once

#include <string>

#include "common/status.h"

namespace asyncps {

// How a client proves itself to etcd and checks etcd, as a secured etcd
// deployment runs it: TLS with a CA and client certificates (etcd
// --client-cert-auth) and etcd's user/password authentication.
struct EtcdSecurity {
  // PEM files: the CA that signed etcd's server certificate (required for
  // https:// endpoints; the server's name is checked against it), and this
  // client's certificate and its key (both or neither). Default: "".
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // etcd user and password: with a user, each call carries the token of
  // POST /v3/auth/authenticate (taken again when etcd says it expired).
  // Default: "" (no authentication).
  std::string user;
  std::string password;
  bool empty() const {
    return ca_file.empty() && cert_file.empty() && key_file.empty() &&
           user.empty();
  }
};

// Reads an etcd password from `path`: its first line (trailing spaces and
// CR dropped). InvalidArgument when the file is missing, readable by others
// than its owner (mode & 077), or its first line is empty.
Status LoadEtcdPassword(const std::string& path, std::string* password);

}  // namespace asyncps
