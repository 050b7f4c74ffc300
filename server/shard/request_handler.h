// RequestHandler: one kind of request a Shard hands on to a layer above it
// (uploads, server/upload/; migration, server/migrate/), so shard/ includes
// nothing of those layers. The Shard builds each handler it is given a
// factory for, right after its own state (before recovery), lends it a
// ShardState and ShardServices (server/shard/shard_state.h) and its
// SparseRequests, and destroys it before that state. A Shard built without
// a handler for a kind answers that kind Unimplemented.
//
// Thread safety: none; a handler is driven by the shard's thread (the event
// loop), as the Shard itself.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/buffer.h"
#include "common/status.h"
#include "common/wire.h"

namespace asyncps::server {
namespace internal {
struct ShardState;
class ShardServices;
}  // namespace internal
class SparseRequests;  // server/shard/sparse_requests.h
struct OutgoingReply;  // server/shard/shard.h

class RequestHandler {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  virtual ~RequestHandler() = default;

  // Handles one request from `peer`; fills `reply` (header and data frames)
  // and may add replies to other requests to `out` (parked pulls answered).
  // A failure went through ShardServices::Reject.
  virtual Status Handle(const std::string& peer, const RequestHeader& req,
                        const std::vector<ByteView>& data, TimePoint now,
                        OutgoingReply* reply,
                        std::vector<OutgoingReply>* out) = 0;

  // Timers, called from Shard::Tick().
  virtual void Tick(TimePoint now) {}
};

// Builds a handler on the shard's state; `state`, `core` and `sparse`
// outlive it.
using RequestHandlerFactory = std::function<std::unique_ptr<RequestHandler>(
    const internal::ShardState& state, internal::ShardServices* core,
    SparseRequests* sparse)>;

// The handlers a Shard is built with (Shard::Create); an empty one leaves
// its kind unserved.
struct ShardHandlers {
  RequestHandlerFactory assign;   // kAssign: server/upload/upload_handler.h
  RequestHandlerFactory migrate;  // kMigrate: server/migrate/migration.h
};

}  // namespace asyncps::server
