// The etcd security flags of every asyncps binary that talks to etcd
// (ps_server, ps_worker, ps_ctl, ps_ctr_worker), defined once here and
// linked only into binaries: libraries take EtcdSecurity and never read
// flags.
//
//   --etcd_ca_file        PEM CA that signed etcd's certificate (https://)
//   --etcd_cert_file      this process's client certificate (PEM)
//   --etcd_key_file       its private key (PEM)
//   --etcd_user           etcd user (etcd auth)
//   --etcd_password_file  a file (mode 600) whose first line is its password
#pragma once

#include <gflags/gflags_declare.h>

#include "common/etcd_security.h"
#include "common/status.h"

DECLARE_string(etcd_ca_file);
DECLARE_string(etcd_cert_file);
DECLARE_string(etcd_key_file);
DECLARE_string(etcd_user);
DECLARE_string(etcd_password_file);

namespace asyncps {

// The five flags into *security (the password read from its file).
// InvalidArgument naming the flag: a password file that is missing, empty,
// or readable by others than its owner; a user without a password file or
// the other way round.
Status EtcdSecurityFromFlags(EtcdSecurity* security);

}  // namespace asyncps
