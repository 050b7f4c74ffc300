// The --metrics_* command-line flags of the asyncps binaries (ps_server,
// ps_worker), defined once here and linked only into binaries: libraries
// take MetricsServerOptions and never read flags.
//
//   --metrics_port       0 off (default), -1 any free port, else the port
//   --metrics_bind       address to bind (default 127.0.0.1: loopback only)
//   --metrics_port_file  where the bound port is written once serving
#pragma once

#include <gflags/gflags_declare.h>

#include <memory>

#include "common/metrics_http.h"

DECLARE_int32(metrics_port);
DECLARE_string(metrics_bind);
DECLARE_string(metrics_port_file);

namespace asyncps::metrics {

// True when --metrics_port asks for an endpoint.
bool MetricsRequested();

// InvalidArgument naming the flag when a --metrics_* flag is invalid.
Status ValidateMetricsFlags();

// Starts the endpoint the flags describe, serving `registry`.
// REQUIRES: MetricsRequested().
StatusOr<std::unique_ptr<MetricsServer>> StartMetricsFromFlags(
    const Registry* registry);

}  // namespace asyncps::metrics
