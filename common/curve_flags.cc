#include "common/curve_flags.h"

#include <gflags/gflags.h>

DEFINE_string(curve_server_key, "",
              "the shards' CurveZMQ public key (file from ps_ctl keygen, or "
              "Z85); empty: no encryption");
DEFINE_string(curve_secret_key, "",
              "this client's CurveZMQ secret key (file or Z85); empty with "
              "--curve_server_key: a throwaway key pair");
DEFINE_string(curve_public_key, "",
              "this client's public key (file or Z85); empty: derived from "
              "--curve_secret_key");

namespace asyncps {

Status CurveClientKeysFromFlags(TransportOptions* options) {
  return LoadCurveClientKeys(FLAGS_curve_server_key, FLAGS_curve_secret_key,
                             FLAGS_curve_public_key, options);
}

}  // namespace asyncps
