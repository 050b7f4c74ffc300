// CreateShard: a Shard (server/shard/shard.h) with every request handler
// of the layers above it wired in: uploads (kAssign, server/upload/) and
// migration (kMigrate, server/migrate/). The server loop builds its shard
// with it; so do the tests that drive a whole shard.
#pragma once

#include <memory>

#include "common/status.h"
#include "server/shard/shard.h"

namespace asyncps::server {

// Shard::Create with ShardHandlers for kAssign and kMigrate.
ShardHandlers AllShardHandlers();
StatusOr<std::unique_ptr<Shard>> CreateShard(const ShardOptions& options,
                                             Store* store,
                                             Shard::TimePoint now);

}  // namespace asyncps::server
