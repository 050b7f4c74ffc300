#include "common/etcd_flags.h"

#include <gflags/gflags.h>

DEFINE_string(etcd_ca_file, "",
              "etcd over TLS (https:// endpoints): the PEM file of the CA "
              "that signed etcd's server certificate");
DEFINE_string(etcd_cert_file, "",
              "etcd over TLS with client certificates (etcd "
              "--client-cert-auth): this process's certificate (PEM)");
DEFINE_string(etcd_key_file, "", "the private key of --etcd_cert_file (PEM)");
DEFINE_string(etcd_user, "",
              "etcd authentication: the user this process signs in as "
              "(needs --etcd_password_file)");
DEFINE_string(etcd_password_file, "",
              "etcd authentication: a file (mode 600) whose first line is "
              "--etcd_user's password");

namespace asyncps {

Status EtcdSecurityFromFlags(EtcdSecurity* security) {
  security->ca_file = FLAGS_etcd_ca_file;
  security->cert_file = FLAGS_etcd_cert_file;
  security->key_file = FLAGS_etcd_key_file;
  security->user = FLAGS_etcd_user;
  security->password.clear();
  if (FLAGS_etcd_user.empty() != FLAGS_etcd_password_file.empty()) {
    return Status::InvalidArgument(
        "--etcd_user and --etcd_password_file go together");
  }
  if (FLAGS_etcd_password_file.empty()) return Status::OK();
  return LoadEtcdPassword(FLAGS_etcd_password_file, &security->password)
      .WithContext("--etcd_password_file");
}

}  // namespace asyncps
