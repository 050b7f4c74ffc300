#include "common/metrics_flags.h"

#include <gflags/gflags.h>

#include <algorithm>

DEFINE_int32(metrics_port, 0,
             "Serve Prometheus metrics on this port at /metrics: 0 off, -1 "
             "any free port (written to --metrics_port_file)");
DEFINE_string(metrics_bind, "127.0.0.1",
              "Address the metrics endpoint binds (loopback by default)");
DEFINE_string(metrics_port_file, "",
              "Write the bound metrics port to this file once serving");

namespace asyncps::metrics {

bool MetricsRequested() { return FLAGS_metrics_port != 0; }

Status ValidateMetricsFlags() {
  if (FLAGS_metrics_port < -1 || FLAGS_metrics_port > 65535) {
    return Status::InvalidArgument("--metrics_port must be in [-1, 65535]");
  }
  if (FLAGS_metrics_bind.empty()) {
    return Status::InvalidArgument("--metrics_bind must not be empty");
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<MetricsServer>> StartMetricsFromFlags(
    const Registry* registry) {
  MetricsServerOptions o;
  o.bind = FLAGS_metrics_bind;
  o.port = std::max(0, FLAGS_metrics_port);
  o.port_file = FLAGS_metrics_port_file;
  return MetricsServer::Start(o, registry);
}

}  // namespace asyncps::metrics
