// SparseRequests: the rows of sparse tables in a shard's requests: the
// tables' registration, the RowsRefs of pushes, pulls and uploads
// (validated and decoded), and their apply (ASP/SSP) or BSP sums. The
// tables themselves are server/sparse/; the rules of validation are at the
// top of sparse_requests.cc.
//
// Owns: the per-table validation stamps and the memory-budget charges of
// the embedding cache, of a request's decoded rows and of the BSP round's
// sums of rows.
//
// Needs from the shard (server/shard/shard_state.h): its options, store,
// memory budget and clocks, the sparse tables (which it creates and drops:
// the core owns the pointer, every part of the shard reads the tables), the
// validation stamps shared with the push path and the decoded rows it fills
// (ShardState::rows), lent as a ShardState; and the core's Reject and
// ApplyKeyRanges (an elastic fleet's adopted key ranges), lent as
// ShardServices. The Shard builds one SparseRequests and calls it from its
// registration, push, pull, upload and migration code.
//
// Thread safety: none; driven by the shard's thread (the event loop).
#pragma once

#include <cstdint>
#include <vector>

#include "common/buffer.h"
#include "common/status.h"
#include "common/wire.h"
#include "server/shard/memory_budget.h"
#include "server/shard/shard.h"
#include "server/shard/shard_state.h"

namespace asyncps::server {

class SparseRequests {
 public:
  // `shard` and `core` must outlive this object.
  SparseRequests(internal::ShardState shard, internal::ShardServices* core);
  SparseRequests(const SparseRequests&) = delete;
  SparseRequests& operator=(const SparseRequests&) = delete;

  // Registration of `tables` with the layout: `created` builds them (their
  // cache charged to the budget), else checks they match the registered
  // ones (idempotent re-registration).
  Status RegisterTables(const std::vector<TableSpec>& tables, bool created);
  // Drops the tables and their cache's charge (a registration or import
  // that failed).
  void DropTables();
  // Validates and decodes the RowsRefs of a push or an upload of rows into
  // ShardState::rows. The stamps already hold this request's chunk frames.
  Status ValidatePush(const RequestHeader& req,
                      const std::vector<ByteView>& data);
  // BSP: reserves what this push's rows may add to the round's sums, before
  // anything of the push is applied.
  Status ChargeRound();
  // The round's sums applied: their charge released.
  void ReleaseRoundCharge() { round_charge_.Reset(); }
  // ASP/SSP: reads every row the push names into the cache and holds it
  // there, before anything of the push is applied: a failed store read
  // refuses the push (Unavailable, retried by the client) with nothing of
  // it applied.
  Status HoldPush();
  // Applies (BSP: sums) the held rows; only write-backs of evicted rows can
  // fail, and every row is applied anyway.
  Status ApplyPush(int rank, int64_t clock, float lr_scale);
  // Validates and decodes the keys of a pull (or a read of row records).
  Status ValidatePull(const RequestHeader& req,
                      const std::vector<ByteView>& data);
  // Appends the rows of a pull to its reply; adds the bytes of the buffers
  // made for it to *fresh.
  Status AnswerPull(const RequestHeader& req, const std::vector<ByteView>& data,
                    OutgoingReply* reply, uint64_t* fresh);

 private:
  using PendingRows = internal::PendingRows;
  // What a request's RowsRefs carry: rows (pushes, uploads) or keys only
  // (pulls, reads of records); row records with their optimizer state
  // (uploads kRows, kSaved); saved records (kSaved).
  struct Shape {
    bool push = false;
    bool records = false;
    bool saved = false;
  };

  // ValidatePush's steps: one RowsRef checked against its frames (table,
  // stamps, sizes, codec), before anything is allocated; the decoded rows
  // sized (charged to the budget); one table's part decoded into
  // ShardState::rows and checked by the tables.
  Status CheckRef(const RequestHeader& req, const RowsRef& ref,
                  const std::vector<ByteView>& data, const Shape& shape);
  Status SizeDecoded(size_t total_keys, size_t total_values, size_t total_state,
                     const Shape& shape);
  Status DecodeRef(const RowsRef& ref, const PendingRows& p,
                   const std::vector<ByteView>& data, const Shape& shape);
  // Row records of frame `f` (saved ones when `saved`): the steps, kinds,
  // clocks and state of `p` into ShardState::rows, the weights into `rows`.
  void DecodeRecords(const PendingRows& p, const ByteView& f, bool saved,
                     float* rows);

  internal::ShardState shard_;
  internal::ShardServices* core_;      // not owned
  std::vector<uint64_t> table_stamp_;  // per table: seen in request #stamp
  // The embedding cache's budget, drawn from the shard's MemoryBudget when
  // the tables are registered; a push's decoded keys and rows; BSP sums.
  MemoryBudget::Charge sparse_charge_;
  MemoryBudget::Charge request_charge_;
  MemoryBudget::Charge round_charge_;
};

}  // namespace asyncps::server
