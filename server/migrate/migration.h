// Migration: a shard's kMigrate requests (elastic shards, server/elastic/):
// freeze, export, import, adopt, abort and describe, by which ps_ctl moves
// chunks and the rows of sparse tables between shards while training runs.
// The steps and their rules are at the top of migration.cc (chunks) and
// migration_rows.cc (rows, by key-range buckets).
//
// Owns: what an import staged toward the next epoch (chunks with their
// memory-budget charges; the buckets whose rows wait in the sparse tables,
// with theirs) and the charges of the chunks an adopt installed.
//
// Needs from the shard (server/shard/shard_state.h): its options, layout,
// chunks, clocks, BSP round, memory budget, sparse tables and the elastic
// state it serves under (ShardState::elastic: the adopted epoch and
// document, which the core persists and routes by, and the freeze, which
// the core enforces on pushes and clocks; Migration sets both), lent as a
// ShardState; the core's Reject, Checkpoint, PinUnsent, EnterDegraded,
// ApplyKeyRanges and the operations that install imported or adopted state,
// lent as ShardServices; and the shard's SparseRequests (an empty shard
// registers the tables of the rows it imports). A Shard built with a
// migrate factory (server/loop/shard_factory.h) builds one Migration and
// hands it every kMigrate request from Shard::Handle().
//
// Thread safety: none; driven by the shard's thread (the event loop).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/buffer.h"
#include "common/status.h"
#include "common/wire.h"
#include "server/shard/memory_budget.h"
#include "server/shard/request_handler.h"
#include "server/shard/shard_state.h"

namespace asyncps {
struct ElasticDoc;  // common/elastic_doc.h
}  // namespace asyncps

namespace asyncps::server {

class Migration : public RequestHandler {
 public:
  // `shard`, `core` and `sparse` must outlive this object.
  Migration(internal::ShardState shard, internal::ShardServices* core,
            SparseRequests* sparse);
  ~Migration() override;
  Migration(const Migration&) = delete;
  Migration& operator=(const Migration&) = delete;

  // A RequestHandlerFactory for Shard::Create.
  static std::unique_ptr<RequestHandler> Make(const internal::ShardState& shard,
                                              internal::ShardServices* core,
                                              SparseRequests* sparse);

  // Handles one kMigrate request; an adopt answers the pulls parked under
  // the old layout into `out`.
  Status Handle(const std::string& peer, const RequestHeader& req,
                const std::vector<ByteView>& data, TimePoint now,
                OutgoingReply* reply, std::vector<OutgoingReply>* out) override;

 private:
  using Chunk = internal::ShardChunk;
  struct Staged {
    std::unique_ptr<Chunk> chunk;
    MemoryBudget::Charge charge;
  };

  // migration.cc: chunks, the freeze, the adopt.
  Status Freeze(const RequestHeader& req, OutgoingReply* r);
  // Frozen toward `req`'s epoch (and, for an export, drained).
  Status CheckFrozenFor(const RequestHeader& req, const char* what,
                        bool drained);
  // BSP: every round below the freeze clock is applied, no sum is open.
  bool Drained() const;
  std::string DescribeJson() const;
  Status ExportChunks(const RequestHeader& req, OutgoingReply* r);
  Status ImportChunks(const RequestHeader& req,
                      const std::vector<ByteView>& data);
  // ImportChunks: for an empty shard the layout of the imported layout
  // record it will register (*candidate, its tables charged), else a check
  // that the record is the registered layout's model.
  Status PrepareImportLayout(const std::vector<TensorSpec>& tensors,
                             const LayoutOptions& lo,
                             std::optional<Layout>* candidate);
  // ImportChunks: the head of the state record (frame 1).
  Status ParseImportState(const ByteView& frame,
                          internal::ImportedClocks* state);
  // ImportChunks: checks chunk record `frame` of chunk `id` of `l` and
  // builds the chunk it stages, charged to the budget.
  Status ParseImportChunk(uint32_t id, const ByteView& frame, const Layout& l,
                          Staged* staged);
  Status Adopt(const RequestHeader& req, std::vector<OutgoingReply>* out);
  // Adopt: the document checked against this shard (epoch, layout, every
  // chunk it gives here held or staged).
  Status CheckAdopt(const ElasticDoc& doc);
  // Adopt: the chunks the document gives this shard installed (held ones
  // kept, staged ones moved in), the others dropped.
  void InstallAdoptedChunks(const ElasticDoc& doc, int num_shards, Layout next);
  void EndFreeze(const char* why);

  // migration_rows.cc: the rows of sparse tables, by key-range buckets.
  Status ExportRows(const RequestHeader& req, OutgoingReply* r);
  Status ImportRows(const RequestHeader& req,
                    const std::vector<ByteView>& data);
  // ImportRows once the tables are registered: checks and stages.
  Status StageRows(const RequestHeader& req, const std::vector<ByteView>& data);
  // The bucket list of an export or import as flags over
  // req.migrate_num_buckets; InvalidArgument for a count that is no cut of
  // this fleet, a bucket out of range or named twice, more than the count.
  Status CheckBucketList(const RequestHeader& req,
                         std::vector<uint8_t>* chosen);
  // The owner of bucket b of a cut into num_buckets by the ranges this
  // shard serves (static: b / (num_buckets / num_shards)); -1: none here.
  int BucketOwnerNow(uint32_t b, uint32_t num_buckets) const;
  // Adopt, before anything moves: every bucket the document gives this
  // shard is held or staged. Then AdoptRows: staged rows installed, rows of
  // buckets given away dropped, the document's ranges served.
  Status CheckAdoptRows(const ElasticDoc& doc);
  Status AdoptRows(const ElasticDoc& doc);

  internal::ShardState shard_;
  internal::ShardServices* core_;      // not owned
  SparseRequests* sparse_;             // not owned
  std::map<uint32_t, Staged> staged_;  // chunks, by chunk id
  // The buckets whose rows are staged (flags over staged_num_buckets_; the
  // rows wait in SparseTables) and their charge.
  uint32_t staged_num_buckets_ = 0;
  std::vector<uint8_t> staged_buckets_;
  MemoryBudget::Charge staged_rows_charge_;
  std::vector<MemoryBudget::Charge> installed_charges_;  // adopted chunks
};

}  // namespace asyncps::server
