#include "server/loop/shard_factory.h"

#include "server/migrate/migration.h"
#include "server/upload/upload_handler.h"

namespace asyncps::server {

ShardHandlers AllShardHandlers() {
  ShardHandlers h;
  h.assign = &UploadHandler::Make;
  h.migrate = &Migration::Make;
  return h;
}

StatusOr<std::unique_ptr<Shard>> CreateShard(const ShardOptions& options,
                                             Store* store,
                                             Shard::TimePoint now) {
  return Shard::Create(options, store, now, AllShardHandlers());
}

}  // namespace asyncps::server
