// PullReader: writes the replies of one pull ticket (StartPull,
// StartPullRows, StartPullChunks) into the caller's buffers: dense chunks
// (raw, decoded, or sparse changes added), rows of sparse tables scattered
// to every position of their keys, and pulls the shard wrote into shared
// memory itself (only checked). Every ref of a reply is checked against the
// request before anything is written. It owns the ticket's RowsPlan; the
// buffers stay the caller's.
//
// Thread safety: none; used by the Client's thread only.
#pragma once

#include <memory>
#include <vector>

#include "worker/client/request.h"
#include "worker/internal/rows_plan.h"

namespace asyncps::worker::client {

class ClientCore;

class PullReader : public ReplyReader {
 public:
  // `tensors`: one buffer per tensor (empty: rows only); `rows`: where
  // pulled rows go (null: no rows).
  PullReader(ClientCore* core, std::vector<float*> tensors,
             std::shared_ptr<internal::RowsPlan> rows)
      : core_(core), dst_(std::move(tensors)), rows_(std::move(rows)) {}

  Status Read(const Reply& reply, TicketResult* result) override;

 private:
  // A reply's rows refs: one per part sent to this shard, in order, each
  // with its frame of part.n rows.
  Status CheckRows(const Reply& reply) const;
  Status CheckChunks(const Reply& reply, const std::vector<uint32_t>& owned);
  Status WriteRows(const Reply& reply, TicketResult* result);
  void Scatter(const RowsSent& rs, const float* rows);

  ClientCore* core_;
  std::vector<float*> dst_;
  std::shared_ptr<internal::RowsPlan> rows_;
};

}  // namespace asyncps::worker::client
