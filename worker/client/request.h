// The records ClientCore (worker/client/core.h) keeps of its work: a
// request in flight to one shard (Pending, kept until its reply so it can
// be resent or rerouted), a ticket (TicketState: the requests still
// awaited, the first error, the result) and the ReplyReader a ticket may
// carry: the one place a call's replies are turned into its result (a
// pull's weights, a Stats call's texts, an upload's records), owned by
// the ticket and dropped with it.
//
// Thread safety: none; used by the Client's thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/buffer.h"
#include "common/status.h"
#include "common/transport.h"
#include "common/wire.h"
#include "worker/client.h"
#include "worker/client/shard_conn.h"

namespace asyncps::worker::client {

using SteadyClock = std::chrono::steady_clock;
using Ticket = Client::Ticket;

// One rows ref of a push or pull as sent, kept for a re-route: the keys
// (and a push's fp32 gradients), and where pulled rows go: entries
// `subset` (empty: all) of part plan_part of shard plan_shard's parts in
// the ticket's RowsPlan.
struct RowsSent {
  uint32_t table = 0;
  size_t n = 0;
  BufferPtr keys;
  BufferPtr grads;
  int plan_shard = 0;
  size_t plan_part = 0;
  std::vector<uint32_t> subset;
};

// One request to one shard, kept until its reply for resending.
struct Pending {
  Ticket ticket = 0;
  int shard = 0;
  RequestKind kind = RequestKind::kHeartbeat;
  std::vector<Frame> frames;
  SteadyClock::time_point next_send;
  std::chrono::milliseconds backoff{0};
  bool shm = false;  // a pull into shared memory, slot shm_slot armed
  uint32_t shm_slot = 0;
  int shm_reattach = 0;   // times the shard was sent the segment again
  bool answered = false;  // a refusal came back since it was last sent
  // What a stale-layout refusal needs to send it again (Reroute): a
  // push's chunk refs (into frames), a pull's chunk ids, clock, codec.
  std::vector<ChunkRef> refs;
  std::vector<uint32_t> ids;
  int64_t clock = 0;
  std::string codec;
  bool has_rows = false;
  std::vector<RowsSent> rows;  // the rows refs sent, in order
};

// A successful reply as a ReplyReader sees it. Valid during Read() only.
struct Reply {
  int shard = 0;
  ShardConn* conn = nullptr;      // the shard's connection
  const Pending* sent = nullptr;  // the request it answers
  const ReplyHeader* header = nullptr;
  const Message* msg = nullptr;  // frames[0] is the header
};

// Turns the replies of one ticket into the caller's result. Read() is
// called once per successful reply, after the fields every reply carries
// (staleness, min clock, created) are folded into *result; an error
// becomes the ticket's status, and the reader writes nothing it has not
// checked first.
class ReplyReader {
 public:
  virtual ~ReplyReader() = default;
  virtual Status Read(const Reply& reply, TicketResult* result) = 0;
};

struct TicketState {
  int remaining = 0;  // requests still awaited
  Status status;      // the first error
  TicketResult result;
  SteadyClock::time_point deadline;
  std::unique_ptr<ReplyReader> reader;  // null: nothing beyond `result`
};

}  // namespace asyncps::worker::client
