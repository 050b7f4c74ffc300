// ElasticRouter: how a Client follows an elastic fleet (ps_ctl add-shard /
// remove-shard, common/elastic_doc.h). It owns the layout epoch requests
// are routed by, the sparse tables' key ranges, the shards that own
// chunks or key ranges (active), the newest layout document a
// registration brought, the clocks held back during a reroute, and the
// etcd reads: the layout document before a first registration, and the
// replica-group members a redirect is checked against. It changes the
// core's routing (ClientCore::SetLayout, ConnectJoined) and resends what a
// shard refused for a stale layout through ClientCore::Enqueue.
//
// Thread safety: none; used by the Client's thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/elastic_doc.h"
#include "common/sparse_table.h"
#include "common/status.h"
#include "worker/client.h"
#include "worker/client/request.h"

namespace asyncps::worker::client {

class ClientCore;

class ElasticRouter {
 public:
  explicit ElasticRouter(const ClientOptions& options) : options_(options) {}

  // The epoch routed by (0: a static fleet, or none adopted yet).
  uint64_t epoch() const { return epoch_; }
  // The adopted key ranges of sparse tables (null: ShardOfKey).
  const KeyRanges* key_ranges() const { return key_ranges_.get(); }
  // With epoch() > 0: the shards that own chunks or key ranges.
  const std::vector<int>& active() const { return active_; }

  // Before the first registration of an elastic fleet's worker: the layout
  // document in etcd (ClientOptions::etcd_endpoints), its shards that
  // joined connected and the document kept for AdoptKept(); returns the
  // shards that own chunks or key ranges (all of the core's when there is
  // no document or etcd).
  StatusOr<std::vector<int>> ShardsFromEtcd(ClientCore& core);
  // A registration reply's document, kept if newer than the one held.
  void KeepNewestDoc(const std::string& text);
  // Adopts the document a registration or etcd brought, if any.
  [[nodiscard]] Status AdoptKept(ClientCore& core) {
    return register_doc_.empty() ? Status::OK() : Adopt(core, register_doc_);
  }
  // A shard refused a request routed by an older epoch and sent its layout
  // document: from now on requests go by it (a document not newer than the
  // epoch routed by changes nothing). Shards that joined are connected,
  // shards that left get nothing more. REQUIRES: core.has_layout().
  [[nodiscard]] Status Adopt(ClientCore& core, const std::string& text);

  // Sends `p`, which its shard refused for a stale layout (its document:
  // `doc`), again, split by the layout adopted: the chunks of a push (the
  // same payload frames, no copy; nothing of it was applied) or of a pull
  // go to their new owners, under the same ticket; a clock goes to every
  // shard once the pushes before it are acknowledged. The core has already
  // taken p off its requests and its ticket's count.
  void Reroute(ClientCore& core, Pending p, const std::string& doc);
  // Sends the clocks Reroute() deferred whose earlier pushes are all
  // acknowledged. Called by the core after each acknowledged push.
  void FlushDeferredClocks(ClientCore& core);
  bool has_deferred_clocks() const { return !deferred_clocks_.empty(); }

  // True when a redirect of shard `shard`'s replica group to `endpoint`
  // may be followed: the endpoint is one of `members` (the group this
  // client was given: ClientOptions::servers, an elastic layout document),
  // or, with etcd, a live member of the group in etcd (a replacement). A
  // reply's redirect is only what a peer says: followed anywhere, a hostile
  // or stale shard could send this worker's gradients to any process (and
  // take its pulls). Refusals are cached for a few seconds: no etcd read
  // per reply.
  bool RedirectAllowed(int shard, const std::vector<std::string>& members,
                       const std::string& endpoint,
                       SteadyClock::time_point now);

 private:
  struct DeferredClock {
    Ticket ticket = 0;
    int64_t clock = 0;
  };
  // Splits rows refused by a shard by the layout adopted since: per new
  // owner, the keys (and fp32 gradients) of each part, with the indices
  // into the plan's part they stand for.
  std::map<int, std::vector<RowsSent>> SplitRows(
      const ClientCore& core, const std::vector<RowsSent>& rows) const;
  void RerouteClock(ClientCore& core, const Pending& p);

  const ClientOptions& options_;  // the core's
  uint64_t epoch_ = 0;
  std::shared_ptr<const KeyRanges> key_ranges_;  // null: ShardOfKey
  std::vector<int> active_;
  std::string register_doc_;  // a layout document sent with a registration
  std::vector<DeferredClock> deferred_clocks_;  // see Reroute()
  // Redirects not followed (RedirectAllowed), until when.
  std::map<std::string, SteadyClock::time_point> refused_redirects_;
  static constexpr std::chrono::milliseconds kRefusedRedirectFor{5000};
};

}  // namespace asyncps::worker::client
