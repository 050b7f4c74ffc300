#include "server/loop/trust.h"

#include <string>

#include "server/replication/replicator.h"

namespace asyncps::server {

Role RequiredRole(const RequestHeader& req) {
  switch (req.kind) {
    case RequestKind::kCheckpoint:
    case RequestKind::kShutdown:
    case RequestKind::kMigrate:
      return Role::kAdmin;
    case RequestKind::kReplicate:
    case RequestKind::kSnapshot:
      return Role::kPrimary;
    default:
      return Role::kAnyone;
  }
}

Status RelayedRequestOk(const RequestHeader& inner) {
  if (RequiredRole(inner) == Role::kPrimary || !replication::HandedOn(inner)) {
    return Status::InvalidArgument(std::string("a ") +
                                   RequestKindName(inner.kind) +
                                   " request is not replicated");
  }
  return Status::OK();
}

}  // namespace asyncps::server
