// The --curve_* client flags of the asyncps tools that talk to shards
// (ps_worker, ps_ctr_worker, ps_ctl), defined once here and linked only into
// binaries: libraries take TransportOptions and never read flags.
//
//   --curve_server_key  the shards' CurveZMQ public key (file or Z85);
//                       empty: no encryption
//   --curve_secret_key  this client's secret key (file or Z85); empty with
//                       --curve_server_key: a throwaway key pair
//   --curve_public_key  this client's public key; empty: derived from
//                       --curve_secret_key
#pragma once

#include <gflags/gflags_declare.h>

#include "common/status.h"
#include "common/transport.h"

DECLARE_string(curve_server_key);
DECLARE_string(curve_secret_key);
DECLARE_string(curve_public_key);

namespace asyncps {

// LoadCurveClientKeys() of the three flags into *options.
Status CurveClientKeysFromFlags(TransportOptions* options);

}  // namespace asyncps
