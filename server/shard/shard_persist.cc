// Shard: checkpoints, durable writes and recovery.
//
// Store keys and value formats (little-endian, fixed width):
//   "0layout"          the model: its tensors and the options its chunks
//                      were cut by (server/internal/layout_record.h)
//   "1state"           u32 'STA2', i32 shard_id, i32 num_shards,
//                      u32 num_workers, u64 shard_version, i64 bsp_round,
//                      per worker: i64 clock, u64 last_read,
//                      i64 bsp_pushed_round;
//                      the push de-duplication table (PushDedup::Encode);
//                      u64 pushes, duplicate_pushes, pulls, bytes_in,
//                      bytes_out, skipped_pushes;
//                      u32 num_reasons, u64 rejected[num_reasons];
//                      u32 num_buckets, u64 buckets[num_buckets], u64 max
//                      (version 1, 'STA1', still read: per worker i64 clock,
//                      u64 last_read, u8 dedup_valid, u64 incarnation,
//                      u64 last_push_id; no skipped_pushes)
//   "2chunk/" + u32 BE id
//                      u32 'CHK1', u64 n, u32 state_per_elem, u64 version,
//                      u64 step, u32 contributors, u8 has_acc,
//                      f32 w[n], f32 state[n * state_per_elem], f32 acc[n]?
//                      (state: the optimizer's, then DC-ASGD-a's mean square)
//   "0elastic"         the adopted elastic layout document (JSON,
//                      common/elastic_doc.h); only once a shard
//                      joined or left (epoch > 0). Chunks it gives to other
//                      shards may still have records here: skipped.
//   "0tables", "1sparse"  sparse tables (server/sparse/sparse_tables.cc)
// Keys sort in that order, so recovery sees the layout before the chunks
// and the tables before their state. The tables' rows are in key spaces of
// their own, never scanned at recovery.
#include <glog/logging.h>

#include <chrono>
#include <cstring>

#include "common/elastic_doc.h"
#include "server/internal/layout_record.h"
#include "server/internal/push_dedup.h"
#include "server/internal/shard_records.h"
#include "server/shard/shard.h"
#include "server/shard/shard_types.h"
#include "server/shard/sparse_requests.h"

namespace asyncps::server {
namespace {

using internal::ChunkKey;
using internal::kChunkMagic;
using internal::kChunkPrefix;
using internal::kElasticKey;
using internal::kLayoutKey;
using internal::kStateKey;
using internal::kStateMagic;
using internal::kStateMagicV1;
using internal::Put;
using internal::Reader;

Status Damaged(std::string_view what) {
  return Status::Corruption("store record " + std::string(what) +
                            " is damaged");
}

}  // namespace

Status Shard::Checkpoint() {
  if (store_ == nullptr) return Status::OK();
  entries_.clear();
  if (elastic_->epoch > 0) {
    StoreEntry e;
    e.key = std::string(kElasticKey);
    e.head = elastic_->doc;
    entries_.push_back(std::move(e));
  }
  if (layout_) AddLayoutEntry(&entries_);
  ++counters_.checkpoints;
  AddStateEntry(&entries_);
  for (const auto& c : chunks_) AddChunkEntry(*c, &entries_);
  Status s = TimedWrite(/*checkpoint=*/true, SyncMode::kSync,
                        &counters_.checkpoint_ns);
  if (!s.ok()) {
    --counters_.checkpoints;
    return s.WithContext("checkpoint");
  }
  VLOG(1) << "checkpoint: version " << shard_version_ << ", " << chunks_.size()
          << " chunks";
  if (degraded_) {
    // Whatever a failed write left in memory only is in the store now.
    degraded_ = false;
    LOG(INFO) << "checkpoint succeeded: the state is in the store again, "
                 "accepting pushes";
  }
  return Status::OK();
}

Status Shard::WriteDurable(bool sync) {
  entries_.clear();
  AddStateEntry(&entries_);
  for (const Chunk* c : touched_) AddChunkEntry(*c, &entries_);
  ++counters_.durable_writes;
  return TimedWrite(/*checkpoint=*/false,
                    sync ? SyncMode::kSync : SyncMode::kNoSync,
                    &counters_.durable_write_ns);
}

Status Shard::TimedWrite(bool checkpoint, SyncMode mode, uint64_t* ns) {
  uint64_t bytes = 0;
  const auto start = std::chrono::steady_clock::now();
  Status s = WriteCut(checkpoint, mode, &bytes);
  *ns += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now() - start)
          .count());
  entries_.clear();
  if (s.ok()) counters_.store_bytes_written += bytes;
  return s;
}

void Shard::AddLayoutEntry(std::vector<StoreEntry>* entries) const {
  StoreEntry e;
  e.key = std::string(kLayoutKey);
  e.head = internal::EncodeLayoutRecord(*layout_);
  entries->push_back(std::move(e));
}

void Shard::AddStateEntry(std::vector<StoreEntry>* entries) const {
  StoreEntry e;
  e.key = std::string(kStateKey);
  std::string& h = e.head;
  Put<uint32_t>(&h, kStateMagic);
  Put<int32_t>(&h, options_.shard_id);
  Put<int32_t>(&h, options_.num_shards);
  Put<uint32_t>(&h, static_cast<uint32_t>(options_.num_workers));
  Put<uint64_t>(&h, shard_version_);
  Put<int64_t>(&h, bsp_round_);
  for (int r = 0; r < options_.num_workers; ++r) {
    Put<int64_t>(&h, clocks_.clock(r));
    Put<uint64_t>(&h, last_read_[r]);
    Put<int64_t>(&h, bsp_pushed_round_[r]);
  }
  dedup_->Encode(&h);
  Put<uint64_t>(&h, counters_.pushes);
  Put<uint64_t>(&h, counters_.duplicate_pushes);
  Put<uint64_t>(&h, counters_.pulls);
  Put<uint64_t>(&h, counters_.bytes_in);
  Put<uint64_t>(&h, counters_.bytes_out);
  Put<uint64_t>(&h, counters_.skipped_pushes);
  Put<uint32_t>(&h, static_cast<uint32_t>(kNumRejectReasons));
  for (uint64_t v : counters_.rejected) Put<uint64_t>(&h, v);
  Put<uint32_t>(&h, static_cast<uint32_t>(StalenessHistogram::kNumBuckets));
  for (uint64_t v : staleness_.buckets()) Put<uint64_t>(&h, v);
  Put<uint64_t>(&h, staleness_.max());
  entries->push_back(std::move(e));
}

void Shard::AddChunkEntry(const Chunk& c,
                          std::vector<StoreEntry>* entries) const {
  StoreEntry e;
  e.key = ChunkKey(c.id);
  std::string& h = e.head;
  Put<uint32_t>(&h, kChunkMagic);
  Put<uint64_t>(&h, c.n);
  Put<uint32_t>(&h, static_cast<uint32_t>(state_per_elem_));
  Put<uint64_t>(&h, c.version);
  Put<uint64_t>(&h, c.step);
  Put<uint32_t>(&h, c.contributors);
  const bool has_acc = !c.acc.empty();
  Put<uint8_t>(&h, has_acc ? 1 : 0);
  e.parts.push_back({c.w.data(), c.w.size() * sizeof(float)});
  if (!c.state.empty())
    e.parts.push_back({c.state.data(), c.state.size() * sizeof(float)});
  if (has_acc) e.parts.push_back({c.acc.data(), c.acc.size() * sizeof(float)});
  entries->push_back(std::move(e));
}

Status Shard::Recover() {
  bool found = false;
  Status s =
      store_->Scan([&](std::string_view key, std::string_view value) -> Status {
        found = true;
        if (key == kElasticKey) {
          StatusOr<ElasticDoc> doc = ElasticDoc::FromJson(std::string(value));
          if (!doc.ok()) return Damaged("elastic layout");
          if (doc->epoch == 0) return Status::OK();
          elastic_->epoch = doc->epoch;
          elastic_->doc = std::string(value);
          elastic_->owners = doc->owners;
          elastic_->num_servers = doc->servers.size();
          if (doc->num_buckets > 0) {
            auto ranges = std::make_shared<KeyRanges>();
            ranges->num_buckets = doc->num_buckets;
            ranges->owners = doc->bucket_owners;
            elastic_->ranges = std::move(ranges);  // served from "0tables" on
          }
          return Status::OK();
        }
        if (key == kLayoutKey) return RestoreLayout(value);
        if (key == kStateKey) return RestoreState(value);
        if (key == sparse::SparseTables::kTablesKey) {
          ASSIGN_OR_RETURN(std::vector<TableSpec> tables,
                           sparse::SparseTables::ParseSpecs(value));
          return sparse_requests_->RegisterTables(tables, /*created=*/true);
        }
        if (key == sparse::SparseTables::kStateKey) {
          if (!sparse_)
            return Status::Corruption("sparse state without tables");
          return sparse_->RestoreState(value);
        }
        if (key.size() == kChunkPrefix.size() + 4 &&
            key.substr(0, kChunkPrefix.size()) == kChunkPrefix) {
          uint32_t id = 0;
          for (size_t i = kChunkPrefix.size(); i < key.size(); ++i) {
            id = (id << 8) | static_cast<uint8_t>(key[i]);
          }
          return RestoreChunk(id, value);
        }
        LOG(WARNING) << "ignoring unknown store key of " << key.size()
                     << " bytes";
        return Status::OK();
      });
  if (!s.ok())
    return s.WithContext("recovering shard " +
                         std::to_string(options_.shard_id));
  if (found) {
    LOG(INFO) << "shard " << options_.shard_id << " recovered: "
              << (layout_ ? std::to_string(chunks_.size()) + " chunks"
                          : std::string("no layout"))
              << ", version " << shard_version_ << ", min clock "
              << clocks_.MinLiveClock();
  }
  return Status::OK();
}

Status Shard::RestoreLayout(std::string_view value) {
  std::vector<TensorSpec> tensors;
  LayoutOptions lo;
  if (!internal::ParseLayoutRecord(value, &tensors, &lo).ok())
    return Damaged("layout");
  // An elastic fleet's layout was cut for its first shard count.
  if (elastic_->epoch == 0 && lo.num_shards != options_.num_shards) {
    return Status::FailedPrecondition("store holds a layout for " +
                                      std::to_string(lo.num_shards) +
                                      " shards, this server is one of " +
                                      std::to_string(options_.num_shards));
  }
  RETURN_IF_ERROR(ChargeLayoutTables(tensors, lo).WithContext("stored layout"));
  StatusOr<Layout> l = Layout::Create(std::move(tensors), lo);
  if (!l.ok())
    return Status::Corruption("stored layout is invalid: " +
                              l.status().message());
  layout_ = std::move(l).value();
  RETURN_IF_ERROR(ApplyElasticOwners());
  return AllocateChunks().WithContext("stored layout");
}

Status Shard::RestoreState(std::string_view value) {
  Reader r(value);
  uint32_t magic = 0, nw = 0;
  int32_t shard_id = 0, num_shards = 0;
  if (!r.Get(&magic) || (magic != kStateMagic && magic != kStateMagicV1) ||
      !r.Get(&shard_id) || !r.Get(&num_shards) || !r.Get(&nw) ||
      !r.Get(&shard_version_) || !r.Get(&bsp_round_)) {
    return Damaged("state");
  }
  const bool v1 = magic == kStateMagicV1;
  if (shard_id != options_.shard_id ||
      (num_shards != options_.num_shards && elastic_->epoch == 0)) {
    return Status::FailedPrecondition(
        "store belongs to shard " + std::to_string(shard_id) + " of " +
        std::to_string(num_shards) + ", this server is shard " +
        std::to_string(options_.shard_id) + " of " +
        std::to_string(options_.num_shards));
  }
  if (static_cast<int>(nw) != options_.num_workers) {
    LOG(WARNING) << "store was written for " << nw << " workers, now "
                 << options_.num_workers;
  }
  if (nw > r.remaining()) return Damaged("state");
  std::vector<int64_t> clocks(options_.num_workers, 0);
  for (uint32_t w = 0; w < nw; ++w) {
    int64_t clock = 0, pushed_round = -1;
    uint64_t last_read = 0, incarnation = 0, last_id = 0;
    uint8_t valid = 0;
    if (!r.Get(&clock) || !r.Get(&last_read)) return Damaged("state");
    if (v1 ? !r.Get(&valid) || !r.Get(&incarnation) || !r.Get(&last_id)
           : !r.Get(&pushed_round)) {
      return Damaged("state");
    }
    if (static_cast<int>(w) >= options_.num_workers) continue;
    clocks[w] = clock;
    last_read_[w] = last_read;
    bsp_pushed_round_[w] = pushed_round;
    // Per chunk, only the shard's record survives: what a rank pushed
    // for the round, it pushed to every chunk (a second push is skipped).
    for (auto& c : chunks_) {
      if (!c->pushed_round.empty()) c->pushed_round[w] = pushed_round;
    }
    if (v1 && valid) {
      dedup_->RestoreHighWaterMark(static_cast<int>(w), incarnation, last_id);
    }
  }
  clocks_.Restore(clocks, std::chrono::steady_clock::now());
  if (!v1 && !dedup_->Decode(&r)) return Damaged("state (push table)");
  uint32_t nr = 0, nb = 0;
  if (!r.Get(&counters_.pushes) || !r.Get(&counters_.duplicate_pushes) ||
      !r.Get(&counters_.pulls) || !r.Get(&counters_.bytes_in) ||
      !r.Get(&counters_.bytes_out) ||
      (!v1 && !r.Get(&counters_.skipped_pushes)) || !r.Get(&nr)) {
    return Damaged("state");
  }
  for (uint32_t i = 0; i < nr; ++i) {
    uint64_t v = 0;
    if (!r.Get(&v)) return Damaged("state");
    if (i < kNumRejectReasons) counters_.rejected[i] = v;
  }
  std::array<uint64_t, StalenessHistogram::kNumBuckets> buckets{};
  uint64_t max = 0;
  if (!r.Get(&nb)) return Damaged("state");
  for (uint32_t i = 0; i < nb; ++i) {
    uint64_t v = 0;
    if (!r.Get(&v)) return Damaged("state");
    if (i < buckets.size()) buckets[i] = v;
  }
  if (!r.Get(&max)) return Damaged("state");
  staleness_.Restore(buckets, max);
  return Status::OK();
}

Status Shard::RestoreChunk(uint32_t id, std::string_view value) {
  if (!layout_) return Status::Corruption("store holds chunks but no layout");
  if (elastic_->epoch > 0 && id < local_index_.size() && local_index_[id] < 0) {
    return Status::OK();  // moved to another shard since it was written
  }
  if (id >= local_index_.size() || local_index_[id] < 0) {
    return Status::Corruption("store holds chunk " + std::to_string(id) +
                              " that this shard does not own");
  }
  Chunk& c = *chunks_[local_index_[id]];
  Reader r(value);
  uint32_t magic = 0, spe = 0, contributors = 0;
  uint64_t n = 0;
  uint8_t has_acc = 0;
  if (!r.Get(&magic) || magic != kChunkMagic || !r.Get(&n) || n != c.n ||
      !r.Get(&spe) || !r.Get(&c.version) || !r.Get(&c.step) ||
      !r.Get(&contributors) || !r.Get(&has_acc)) {
    return Damaged("chunk " + std::to_string(id));
  }
  const size_t want = n * sizeof(float) * (1 + spe + (has_acc ? 1 : 0));
  if (r.remaining() != want) return Damaged("chunk " + std::to_string(id));
  (void)r.GetBytes(c.w.data(), n * sizeof(float));
  if (spe == state_per_elem_) {
    (void)r.GetBytes(c.state.data(), c.state.size() * sizeof(float));
  } else {
    LOG(WARNING) << "chunk " << id << ": stored optimizer state has " << spe
                 << " floats per element, this optimizer needs "
                 << state_per_elem_ << ": state reset";
    std::vector<float> skip(n * spe);
    (void)r.GetBytes(skip.data(), skip.size() * sizeof(float));
  }
  if (has_acc && !c.acc.empty()) {
    (void)r.GetBytes(c.acc.data(), n * sizeof(float));
    c.contributors = contributors;
  }
  return Status::OK();
}

Status Shard::WriteCut(bool checkpoint, SyncMode sync, uint64_t* bytes) {
  *bytes = StoreEntriesBytes(entries_);
  if (!sparse_) return store_->Write(entries_, sync);
  if (checkpoint) sparse_->AddSpecsEntry(&entries_);
  sparse_->AddStateEntry(&entries_);
  std::unique_ptr<StoreBatch> batch = store_->NewBatch();
  if (checkpoint) {
    RETURN_IF_ERROR(sparse_->FlushForCheckpoint(batch.get()));
  } else {
    sparse_->AddDurable(batch.get());
  }
  *bytes = StoreEntriesBytes(entries_) + batch->bytes();
  Status s = store_->Write(entries_, batch.get(), sync, WriteKind::kCut);
  if (checkpoint) {
    if (s.ok()) sparse_->CommitCheckpoint();
  } else {
    sparse_->CommitDurable(s.ok());
  }
  return s;
}

}  // namespace asyncps::server
