// Reshard: reads S shards' checkpoints, writes S' (see reshard.h).
//
// Works on the stored records themselves (formats:
// server/shard/shard_persist.cc, server/sparse/sparse_tables.cc,
// server/sparse/row_format.h): chunk and row records are copied as bytes, never
// decoded into floats, so the restored weights and optimizer state are bitwise
// those of the sources. Only the layout record (its shard count), the state
// records and the sparse state are rebuilt.
#include "server/reshard/reshard.h"

#include <glog/logging.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "common/layout.h"
#include "common/sparse_table.h"
#include "server/internal/binary_io.h"
#include "server/internal/chunk_recut.h"
#include "server/internal/layout_record.h"
#include "server/internal/push_dedup.h"
#include "server/internal/shard_records.h"
#include "server/sparse/row_format.h"
#include "server/sparse/sparse_tables.h"

namespace asyncps::server {
namespace {

using internal::kChunkMagic;
using internal::kChunkPrefix;
using internal::kLayoutKey;
using internal::kStateKey;
using internal::kStateMagic;
using internal::kStateMagicV1;
using internal::PushDedup;
using internal::Put;
using internal::Reader;

constexpr uint32_t kSparseMagic = 0x31535053;  // "SPS1" (sparse_tables.cc)
// Most chunks of a model this tool builds a layout for (a shard needs a
// record per chunk it owns; 2^26 chunks are 256 TiB of fp32 at 1 Mi floats).
constexpr uint64_t kMaxChunks = uint64_t{1} << 26;
// Byte offset of num_shards in the layout record.
constexpr size_t kLayoutShardsOffset = 4;

std::string Printable(std::string_view key) {
  std::string out;
  for (unsigned char c : key) {
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

std::string SourceName(size_t i) { return "source " + std::to_string(i); }

Status Damaged(size_t source, std::string_view key, std::string_view why) {
  return Status::Corruption(SourceName(source) + ": record \"" +
                            Printable(key) + "\" is damaged (" +
                            std::string(why) + ")");
}

// The shard's state record ("1state"), decoded.
struct ShardState {
  uint32_t num_workers = 0;
  uint64_t version = 0;
  int64_t bsp_round = 0;
  std::vector<int64_t> clock;
  std::vector<uint64_t> last_read;
  std::vector<int64_t> pushed_round;
  std::unique_ptr<PushDedup> dedup;
  // pushes, duplicate_pushes, pulls, bytes_in, bytes_out, skipped_pushes.
  std::vector<uint64_t> counters = std::vector<uint64_t>(6, 0);
  std::vector<uint64_t> rejected;
  std::vector<uint64_t> buckets;
  uint64_t max_staleness = 0;
};

// One table's part of the sparse state record ("1sparse").
struct SparseTableState {
  std::vector<uint64_t> counters;
  uint64_t round_pushes = 0;
  std::vector<uint64_t> keys;
  std::vector<float> sums;  // keys.size() x dim
};

struct SparseState {
  int64_t clock = 0;
  std::vector<SparseTableState> tables;
};

struct Source {
  std::optional<std::string> layout;  // the record's bytes
  std::optional<std::string> tables;
  std::optional<ShardState> state;
  int32_t state_num_shards = 0;  // the shard count in the state record
  std::string sparse_value;  // "1sparse" bytes, parsed once tables are known
  bool has_sparse = false;
  std::optional<SparseState> sparse;
  // Chunk records: id -> (key, value).
  std::map<uint32_t, std::pair<std::string, std::string>> chunks;
};

Status ParseState(std::string_view value, ShardState* st, int32_t* shard_id,
                  int32_t* num_shards) {
  Reader r(value);
  uint32_t magic = 0;
  if (!r.Get(&magic) || (magic != kStateMagic && magic != kStateMagicV1) ||
      !r.Get(shard_id) || !r.Get(num_shards) || !r.Get(&st->num_workers) ||
      !r.Get(&st->version) || !r.Get(&st->bsp_round)) {
    return Status::Corruption("header");
  }
  const bool v1 = magic == kStateMagicV1;
  const uint32_t nw = st->num_workers;
  if (nw < 1 || nw > r.remaining() / 16) return Status::Corruption("workers");
  st->dedup =
      std::make_unique<PushDedup>(PushDedup::Options{static_cast<int>(nw)});
  st->clock.resize(nw);
  st->last_read.resize(nw);
  st->pushed_round.assign(nw, -1);
  for (uint32_t w = 0; w < nw; ++w) {
    uint64_t incarnation = 0, last_id = 0;
    uint8_t valid = 0;
    if (!r.Get(&st->clock[w]) || !r.Get(&st->last_read[w]))
      return Status::Corruption("worker " + std::to_string(w));
    if (v1 ? !r.Get(&valid) || !r.Get(&incarnation) || !r.Get(&last_id)
           : !r.Get(&st->pushed_round[w])) {
      return Status::Corruption("worker " + std::to_string(w));
    }
    if (v1 && valid) {
      st->dedup->RestoreHighWaterMark(static_cast<int>(w), incarnation,
                                      last_id);
    }
  }
  if (!v1 && !st->dedup->Decode(&r)) return Status::Corruption("push table");
  for (size_t i = 0; i < st->counters.size(); ++i) {
    if (v1 && i == 5) continue;  // no skipped_pushes in version 1
    if (!r.Get(&st->counters[i])) return Status::Corruption("counters");
  }
  uint32_t nr = 0, nb = 0;
  if (!r.Get(&nr) || nr > r.remaining() / 8)
    return Status::Corruption("rejections");
  st->rejected.resize(nr);
  for (uint64_t& v : st->rejected) (void)r.Get(&v);
  if (!r.Get(&nb) || nb > r.remaining() / 8)
    return Status::Corruption("staleness histogram");
  st->buckets.resize(nb);
  for (uint64_t& v : st->buckets) (void)r.Get(&v);
  if (!r.Get(&st->max_staleness) || r.remaining() != 0)
    return Status::Corruption("staleness histogram");
  return Status::OK();
}

Status ParseSparseState(std::string_view value,
                        const std::vector<TableSpec>& specs, int source,
                        int num_shards, SparseState* out) {
  Reader r(value);
  uint32_t magic = 0, n = 0;
  if (!r.Get(&magic) || magic != kSparseMagic || !r.Get(&out->clock) ||
      !r.Get(&n) || n != specs.size()) {
    return Status::Corruption("header");
  }
  out->tables.resize(n);
  for (size_t t = 0; t < n; ++t) {
    SparseTableState& ts = out->tables[t];
    uint32_t nc = 0;
    if (!r.Get(&nc) || nc > 1024 || nc > r.remaining() / 8)
      return Status::Corruption("counters");
    ts.counters.resize(nc);
    for (uint64_t& v : ts.counters) (void)r.Get(&v);
    uint64_t nk = 0;
    const size_t dim = specs[t].dim;
    if (!r.Get(&ts.round_pushes) || !r.Get(&nk) ||
        nk > r.remaining() / (8 + dim * sizeof(float))) {
      return Status::Corruption("round sums");
    }
    ts.keys.resize(nk);
    ts.sums.resize(nk * dim);
    std::set<uint64_t> seen;
    for (uint64_t i = 0; i < nk; ++i) {
      (void)r.Get(&ts.keys[i]);
      (void)r.GetBytes(ts.sums.data() + i * dim, dim * sizeof(float));
      if (!seen.insert(ts.keys[i]).second)
        return Status::Corruption("round sums name a key twice");
      if (ShardOfKey(specs[t], ts.keys[i], num_shards) != source)
        return Status::Corruption("round sums of a key of another shard");
    }
  }
  if (r.remaining() != 0) return Status::Corruption("trailing bytes");
  return Status::OK();
}

// Reads every default-space record of source i.
Status ReadSource(Store* store, size_t i, Source* src, ReshardReport* report) {
  return store->Scan(
      [&](std::string_view key, std::string_view value) -> Status {
        if (key == internal::kElasticKey) {
          return Status::Unimplemented(
              SourceName(i) +
              " belongs to an elastic fleet (shards joined or "
              "left while it trained: chunks are not where the layout puts "
              "them); restore it onto its own shards, or change the shard "
              "count live with ps_ctl add-shard / remove-shard");
        }
        if (key == kLayoutKey) {
          src->layout.emplace(value);
        } else if (key == sparse::SparseTables::kTablesKey) {
          src->tables.emplace(value);
        } else if (key == sparse::SparseTables::kStateKey) {
          src->sparse_value.assign(value);
          src->has_sparse = true;
        } else if (key == kStateKey) {
          ShardState st;
          int32_t shard_id = 0, num_shards = 0;
          Status s = ParseState(value, &st, &shard_id, &num_shards);
          if (!s.ok()) return Damaged(i, key, s.message());
          if (shard_id != static_cast<int32_t>(i)) {
            return Status::FailedPrecondition(
                SourceName(i) + " holds the state of shard " +
                std::to_string(shard_id) + ": give the stores in shard order");
          }
          src->state = std::move(st);
          src->state_num_shards = num_shards;  // checked by the caller
        } else if (key.size() == kChunkPrefix.size() + 4 &&
                   key.substr(0, kChunkPrefix.size()) == kChunkPrefix) {
          uint32_t id = 0;
          for (size_t k = kChunkPrefix.size(); k < key.size(); ++k)
            id = (id << 8) | static_cast<uint8_t>(key[k]);
          src->chunks.emplace(
              id, std::make_pair(std::string(key), std::string(value)));
        } else {
          LOG(WARNING) << SourceName(i) << ": skipping unknown record \""
                       << Printable(key) << "\"";
          ++report->unknown_keys;
        }
        return Status::OK();
      });
}

// Calls fn(source key, value) for every row record of table t in source i,
// after checking it (key size, record format, owner shard, expiry); expired
// records are counted and skipped.
Status ForEachRow(
    Store* store, size_t i, int num_shards, size_t t, const TableSpec& spec,
    int64_t expiry_clock, uint64_t* expired,
    const std::function<Status(std::string_view, std::string_view)>& fn) {
  const std::string name = sparse::SparseTables::SpaceName(t, spec);
  StatusOr<SpaceId> space = store->OpenSpace(name);
  if (!space.ok())
    return space.status().WithContext(SourceName(i) + ", table " + spec.name);
  const size_t floats_per_row =
      spec.dim * (1 + spec.optimizer.state_per_elem());
  Status s = store->ScanSpace(
      *space, [&](std::string_view key, std::string_view value) -> Status {
        const std::string where = SourceName(i) + ": key space " + name +
                                  ", record \"" + Printable(key) + "\"";
        if (key.size() != 8)
          return Status::Corruption(where + ": a key of " +
                                    std::to_string(key.size()) + " bytes");
        uint64_t k = 0;
        for (unsigned char c : key) k = (k << 8) | c;
        sparse::RecordView rec;
        Status p = sparse::ParseRecord(value, spec.dim, floats_per_row, &rec);
        if (!p.ok()) return Status::Corruption(where + ": " + p.message());
        if (ShardOfKey(spec, k, num_shards) != static_cast<int>(i)) {
          return Status::Corruption(where + ": key " + std::to_string(k) +
                                    " belongs to another shard");
        }
        // expiry_clock - clock > expire_after_clocks, without overflow on
        // any stored clock.
        const int64_t last = rec.header.clock;
        if (spec.expire_after_clocks > 0 &&
            last<expiry_clock&& static_cast<uint64_t>(expiry_clock) -
                 static_cast<uint64_t>(
                     last)> static_cast<uint64_t>(spec.expire_after_clocks)) {
          ++*expired;
          return Status::OK();
        }
        return fn(key, value);
      });
  return s;
}

// The merged push table of `sources` for num_workers workers.
void MergeDedup(const std::vector<const ShardState*>& sources,
                uint32_t num_workers, std::string* out) {
  struct Client {
    uint64_t floor = ~uint64_t{0};
    std::set<uint64_t> ids;
    int64_t recency = INT64_MIN;
  };
  std::map<std::pair<int, uint64_t>, Client> clients;
  for (const ShardState* st : sources) {
    std::vector<std::vector<uint64_t>> order(num_workers);
    st->dedup->ForEach(
        [&](int rank, uint64_t inc, uint64_t, const std::vector<uint64_t>&) {
          order[rank].push_back(inc);
        });
    st->dedup->ForEach([&](int rank, uint64_t inc, uint64_t floor,
                           const std::vector<uint64_t>& ids) {
      Client& c = clients[{rank, inc}];
      c.floor = std::min(c.floor, floor);
      c.ids.insert(ids.begin(), ids.end());
      const auto& o = order[rank];
      const int64_t pos = std::find(o.begin(), o.end(), inc) - o.begin();
      c.recency =
          std::max<int64_t>(c.recency, pos - static_cast<int64_t>(o.size()));
    });
  }
  PushDedup::Options options{static_cast<int>(num_workers)};
  PushDedup merged(options);
  for (uint32_t rank = 0; rank < num_workers; ++rank) {
    std::vector<std::pair<int64_t, uint64_t>> by_recency;
    for (const auto& [k, c] : clients) {
      if (k.first == static_cast<int>(rank))
        by_recency.push_back({c.recency, k.second});
    }
    std::sort(by_recency.begin(), by_recency.end());
    const size_t keep = options.incarnations_per_rank;
    if (by_recency.size() > keep)
      by_recency.erase(by_recency.begin(), by_recency.end() - keep);
    for (const auto& [recency, inc] : by_recency) {
      const Client& c = clients[{static_cast<int>(rank), inc}];
      merged.RaiseFloor(static_cast<int>(rank), inc, c.floor);
      for (auto it = c.ids.lower_bound(c.floor); it != c.ids.end(); ++it)
        merged.Record(static_cast<int>(rank), inc, *it);
    }
  }
  merged.Encode(out);
}

// Adds b to a element-wise, growing a.
void AddInto(std::vector<uint64_t>* a, const std::vector<uint64_t>& b) {
  if (a->size() < b.size()) a->resize(b.size(), 0);
  for (size_t i = 0; i < b.size(); ++i) (*a)[i] += b[i];
}

// The state record of destination j of `to_shards`.
std::string MergedState(const std::vector<Source>& sources, int j,
                        int to_shards, uint32_t num_workers) {
  std::vector<const ShardState*> all;
  for (const Source& s : sources) {
    if (s.state) all.push_back(&*s.state);
  }
  ShardState m;
  m.clock.assign(num_workers, INT64_MAX);
  m.last_read.assign(num_workers, 0);
  m.pushed_round.assign(num_workers, INT64_MAX);
  m.bsp_round = INT64_MAX;
  for (size_t i = 0; i < sources.size(); ++i) {
    // A source without a state record restarts from zero clocks.
    if (!sources[i].state) {
      std::fill(m.clock.begin(), m.clock.end(), 0);
      m.bsp_round = 0;
      std::fill(m.pushed_round.begin(), m.pushed_round.end(), -1);
      continue;
    }
    const ShardState& st = *sources[i].state;
    m.version = std::max(m.version, st.version);
    m.bsp_round = std::min(m.bsp_round, st.bsp_round);
    for (uint32_t w = 0; w < num_workers; ++w) {
      m.clock[w] = std::min(m.clock[w], st.clock[w]);
      m.last_read[w] = std::max(m.last_read[w], st.last_read[w]);
      m.pushed_round[w] = std::min(m.pushed_round[w], st.pushed_round[w]);
    }
    if (static_cast<int>(i % to_shards) == j) {
      AddInto(&m.counters, st.counters);
      AddInto(&m.rejected, st.rejected);
      AddInto(&m.buckets, st.buckets);
      m.max_staleness = std::max(m.max_staleness, st.max_staleness);
    }
  }
  std::string h;
  Put<uint32_t>(&h, kStateMagic);
  Put<int32_t>(&h, j);
  Put<int32_t>(&h, to_shards);
  Put<uint32_t>(&h, num_workers);
  Put<uint64_t>(&h, m.version);
  Put<int64_t>(&h, m.bsp_round);
  for (uint32_t w = 0; w < num_workers; ++w) {
    Put<int64_t>(&h, m.clock[w]);
    Put<uint64_t>(&h, std::min(m.last_read[w], m.version));
    Put<int64_t>(&h, m.pushed_round[w]);
  }
  MergeDedup(all, num_workers, &h);
  for (uint64_t v : m.counters) Put<uint64_t>(&h, v);
  Put<uint32_t>(&h, static_cast<uint32_t>(m.rejected.size()));
  for (uint64_t v : m.rejected) Put<uint64_t>(&h, v);
  Put<uint32_t>(&h, static_cast<uint32_t>(m.buckets.size()));
  for (uint64_t v : m.buckets) Put<uint64_t>(&h, v);
  Put<uint64_t>(&h, m.max_staleness);
  return h;
}

// The sparse state record of destination j.
std::string MergedSparseState(const std::vector<Source>& sources,
                              const std::vector<TableSpec>& specs, int j,
                              int to_shards) {
  int64_t clock = INT64_MAX;
  for (const Source& s : sources)
    clock = std::min(clock, s.sparse ? s.sparse->clock : 0);
  std::string h;
  Put<uint32_t>(&h, kSparseMagic);
  Put<int64_t>(&h, clock);
  Put<uint32_t>(&h, static_cast<uint32_t>(specs.size()));
  for (size_t t = 0; t < specs.size(); ++t) {
    std::vector<uint64_t> counters;
    uint64_t pushes = 0, n = 0;
    std::string sums;
    const size_t dim = specs[t].dim;
    for (size_t i = 0; i < sources.size(); ++i) {
      if (!sources[i].sparse) continue;
      const SparseTableState& ts = sources[i].sparse->tables[t];
      if (static_cast<int>(i % to_shards) == j) AddInto(&counters, ts.counters);
      pushes = std::max(pushes, ts.round_pushes);
      for (size_t k = 0; k < ts.keys.size(); ++k) {
        if (ShardOfKey(specs[t], ts.keys[k], to_shards) != j) continue;
        Put<uint64_t>(&sums, ts.keys[k]);
        sums.append(reinterpret_cast<const char*>(ts.sums.data() + k * dim),
                    dim * sizeof(float));
        ++n;
      }
    }
    Put<uint32_t>(&h, static_cast<uint32_t>(counters.size()));
    for (uint64_t v : counters) Put<uint64_t>(&h, v);
    Put<uint64_t>(&h, pushes);
    Put<uint64_t>(&h, n);
    h += sums;
  }
  return h;
}

std::string ChunkingSummary(const Layout& l) {
  uint64_t largest = 0;
  for (const ChunkSpec& c : l.chunks())
    largest = std::max(largest, c.num_elems);
  return std::to_string(l.chunks().size()) + " chunks of up to " +
         std::to_string(largest) + " floats";
}

// What one Reshard carries from each of its steps to the next.
struct ReshardState {
  ReshardState(const std::vector<Store*>& from, const std::vector<Store*>& to,
               const ReshardOptions& options)
      : from(from), to(to), options(options) {}

  const std::vector<Store*>& from;
  const std::vector<Store*>& to;
  const ReshardOptions& options;
  int S = 0, T = 0;  // source and destination shards
  ReshardReport report;
  // 1. The sources' default-space records, their model and sparse tables.
  std::vector<Source> sources;
  std::vector<TensorSpec> tensors;
  LayoutOptions lo;
  uint32_t num_workers = 0;
  std::vector<TableSpec> specs;
  // 2. The layouts for S and T shards.
  std::optional<Layout> old_layout, new_layout;
  // 3. Re-cut chunk records (report.recut), by new chunk id.
  std::vector<std::optional<std::string>> recut;
  // 4. The clock each source's rows expire by; rows that expired.
  std::vector<int64_t> expiry_clock;
  uint64_t expired = 0;
  // 5. The destinations' sparse key spaces, by table.
  std::vector<std::vector<SpaceId>> to_spaces;
  // 6. Each destination's batch of rows not written yet.
  std::vector<std::unique_ptr<StoreBatch>> batches;
};

// 1. Read and check the sources' default-space records.
Status ReadSources(ReshardState* st) {
  const int S = st->S;
  std::vector<Source>& sources = st->sources;
  sources.resize(S);
  for (int i = 0; i < S; ++i) {
    RETURN_IF_ERROR(ReadSource(st->from[i], i, &sources[i], &st->report));
    if (!sources[i].layout) {
      return Status::FailedPrecondition(
          SourceName(i) +
          " holds no registered model (no layout record): "
          "is it a shard's store, and was a model registered?");
    }
  }
  {
    Status s =
        internal::ParseLayoutRecord(*sources[0].layout, &st->tensors, &st->lo);
    if (!s.ok()) return Damaged(0, kLayoutKey, s.message());
  }
  if (st->lo.num_shards != S) {
    return Status::FailedPrecondition(
        "the sources hold a model of " + std::to_string(st->lo.num_shards) +
        " shards, " + std::to_string(S) +
        " stores were given: give every shard's store, in shard order");
  }
  for (int i = 1; i < S; ++i) {
    if (*sources[i].layout != *sources[0].layout) {
      return Status::FailedPrecondition(
          SourceName(i) +
          " holds another model (its layout record differs "
          "from source 0's)");
    }
  }
  uint32_t& num_workers = st->num_workers;
  for (int i = 0; i < S; ++i) {
    if (!sources[i].state) continue;
    if (sources[i].state_num_shards != S) {
      return Status::FailedPrecondition(
          SourceName(i) + " holds the state of a shard of " +
          std::to_string(sources[i].state_num_shards) + " shards, not " +
          std::to_string(S));
    }
    if (num_workers == 0) num_workers = sources[i].state->num_workers;
    if (sources[i].state->num_workers != num_workers) {
      return Status::FailedPrecondition(
          SourceName(i) + " was written for " +
          std::to_string(sources[i].state->num_workers) +
          " workers, another source for " + std::to_string(num_workers));
    }
  }
  return Status::OK();
}

// 1. (continued) The sources' sparse tables and sparse state records.
Status ReadSparseSources(ReshardState* st) {
  const int S = st->S;
  std::vector<Source>& sources = st->sources;
  for (int i = 1; i < S; ++i) {
    if (sources[i].tables != sources[0].tables) {
      return Status::FailedPrecondition(
          SourceName(i) + " holds other sparse tables than source 0");
    }
  }
  if (sources[0].tables) {
    StatusOr<std::vector<TableSpec>> parsed =
        sparse::SparseTables::ParseSpecs(*sources[0].tables);
    if (!parsed.ok()) {
      return Damaged(0, sparse::SparseTables::kTablesKey,
                     parsed.status().message());
    }
    st->specs = std::move(parsed).value();
  }
  for (int i = 0; i < S; ++i) {
    Source& src = sources[i];
    if (!src.has_sparse) continue;
    if (!src.tables) {
      return Damaged(i, sparse::SparseTables::kStateKey,
                     "sparse state without tables");
    }
    SparseState ss;
    Status s = ParseSparseState(src.sparse_value, st->specs, i, S, &ss);
    if (!s.ok())
      return Damaged(i, sparse::SparseTables::kStateKey, s.message());
    src.sparse = std::move(ss);
  }
  return Status::OK();
}

// 2. The layouts for S and T shards: the same chunks (records copied), or
// the tensors cut differently (records re-cut).
Status CutLayouts(ReshardState* st) {
  LayoutOptions& lo = st->lo;
  lo.num_shards = st->S;
  // A damaged record could still parse into a layout of billions of chunks:
  // measured first, and refused past what the shards themselves accept.
  StatusOr<LayoutSize> size = Layout::Measure(st->tensors, lo);
  if (!size.ok() || size->num_chunks > kMaxChunks) {
    return Damaged(0, kLayoutKey,
                   size.ok() ? std::to_string(size->num_chunks) + " chunks"
                             : "invalid layout: " + size.status().message());
  }
  StatusOr<Layout> old_layout = Layout::Create(st->tensors, lo);
  if (!old_layout.ok()) {
    return Damaged(0, kLayoutKey,
                   "invalid layout: " + old_layout.status().message());
  }
  st->old_layout.emplace(std::move(*old_layout));
  LayoutOptions new_lo = lo;
  new_lo.num_shards = st->T;
  ASSIGN_OR_RETURN(Layout new_layout, Layout::Create(st->tensors, new_lo));
  st->new_layout.emplace(std::move(new_layout));
  const Layout& a_layout = *st->old_layout;
  const Layout& b_layout = *st->new_layout;
  bool same = a_layout.chunks().size() == b_layout.chunks().size();
  for (size_t c = 0; same && c < b_layout.chunks().size(); ++c) {
    const ChunkSpec& a = a_layout.chunks()[c];
    const ChunkSpec& b = b_layout.chunks()[c];
    same = a.tensor == b.tensor && a.offset == b.offset &&
           a.num_elems == b.num_elems;
  }
  st->report.recut = !same;
  if (st->report.recut) {
    LOG(INFO) << "the model is cut differently for " << st->T << " shards ("
              << ChunkingSummary(b_layout) << ") than for " << st->S << " ("
              << ChunkingSummary(a_layout)
              << "): chunk records are re-cut element by element";
  }
  st->report.chunks = b_layout.chunks().size();
  return Status::OK();
}

// 3. Check every chunk record.
Status CheckChunkRecords(const ReshardState& st) {
  const Layout& old_layout = *st.old_layout;
  uint32_t spe = ~uint32_t{0};
  for (int i = 0; i < st.S; ++i) {
    for (const auto& [id, kv] : st.sources[i].chunks) {
      if (id >= old_layout.chunks().size() ||
          old_layout.chunks()[id].shard != i) {
        return Damaged(
            i, kv.first,
            "chunk " + std::to_string(id) + " is not one of this shard's");
      }
      internal::ChunkRecord rec;
      Status s = internal::ParseChunkRecord(
          kv.second, old_layout.chunks()[id].num_elems, &rec);
      if (!s.ok()) return Damaged(i, kv.first, s.message());
      const uint32_t chunk_spe = rec.state_per_elem;
      if (spe == ~uint32_t{0}) spe = chunk_spe;
      if (chunk_spe != spe) {
        LOG(WARNING) << SourceName(i) << ": chunk " << id << " holds "
                     << chunk_spe << " state floats per element, others " << spe
                     << " (copied as they are)";
      }
    }
  }
  return Status::OK();
}

// Re-cut chunk records, built before anything is written (a refusal
// leaves the destinations untouched).
Status RecutChunkRecords(ReshardState* st) {
  st->recut.assign(st->report.recut ? st->new_layout->chunks().size() : 0,
                   std::nullopt);
  if (!st->report.recut) return Status::OK();
  const Layout& old_layout = *st->old_layout;
  internal::RecutStats stats;
  auto record = [&](uint32_t id) -> const std::string* {
    const Source& src = st->sources[old_layout.chunks()[id].shard];
    auto it = src.chunks.find(id);
    return it == src.chunks.end() ? nullptr : &it->second.second;
  };
  for (const ChunkSpec& c : st->new_layout->chunks()) {
    std::string value;
    bool has = false;
    RETURN_IF_ERROR(
        internal::RecutChunk(old_layout, c, record, &value, &has, &stats)
            .WithContext("re-cutting chunk " + std::to_string(c.id) +
                         " of the layout for " + std::to_string(st->T) +
                         " shards"));
    if (has) st->recut[c.id] = std::move(value);
  }
  st->report.recut_chunks = stats.recut_chunks;
  st->report.step_mismatches = stats.step_mismatches;
  if (stats.step_mismatches > 0) {
    LOG(WARNING) << stats.step_mismatches
                 << " re-cut chunks are made of pieces with different "
                    "optimizer steps: each takes the largest";
  }
  return Status::OK();
}

// 4. Check every sparse record (the sources are read twice: nothing is
// written before all of them passed).
Status CheckSparseRecords(ReshardState* st) {
  const int S = st->S;
  st->expiry_clock.assign(S, 0);
  for (int i = 0; i < S; ++i) {
    if (st->sources[i].sparse)
      st->expiry_clock[i] = st->sources[i].sparse->clock;
  }
  for (int i = 0; i < S; ++i) {
    for (size_t t = 0; t < st->specs.size(); ++t) {
      RETURN_IF_ERROR(ForEachRow(
          st->from[i], i, S, t, st->specs[t], st->expiry_clock[i], &st->expired,
          [](std::string_view, std::string_view) { return Status::OK(); }));
    }
  }
  return Status::OK();
}

// 5. The destinations must be empty.
Status OpenEmptyDestinations(ReshardState* st) {
  st->to_spaces.assign(st->T, {});
  for (int j = 0; j < st->T; ++j) {
    Store* to = st->to[j];
    std::optional<std::string> first;
    Status scanned =
        to->Scan([&](std::string_view key, std::string_view) -> Status {
          first.emplace(key);
          return Status::Cancelled("found");
        });
    if (first) {
      return Status::FailedPrecondition(
          "destination " + std::to_string(j) + " is not empty (it holds \"" +
          Printable(*first) + "\"): give new, empty stores");
    }
    RETURN_IF_ERROR(scanned.WithContext("destination " + std::to_string(j)));
    for (size_t t = 0; t < st->specs.size(); ++t) {
      const std::string name = sparse::SparseTables::SpaceName(t, st->specs[t]);
      ASSIGN_OR_RETURN(SpaceId space, to->OpenSpace(name));
      bool any = false;
      Status s = to->ScanSpace(
          space, [&](std::string_view, std::string_view) -> Status {
            any = true;
            return Status::Cancelled("found");
          });
      if (any) {
        return Status::FailedPrecondition(
            "destination " + std::to_string(j) + " is not empty (key space " +
            name + " holds records): give new, empty stores");
      }
      RETURN_IF_ERROR(s.WithContext("destination " + std::to_string(j)));
      st->to_spaces[j].push_back(space);
    }
  }
  return Status::OK();
}

// 6. Rows: streamed from the sources into each destination's batch,
// written as partial writes when full; the rest goes with the cut.
Status CopySparseRows(ReshardState* st) {
  const int T = st->T;
  ReshardReport& report = st->report;
  st->batches.resize(T);
  for (int j = 0; j < T; ++j) st->batches[j] = st->to[j]->NewBatch();
  uint64_t ignored = 0;
  for (int i = 0; i < st->S; ++i) {
    for (size_t t = 0; t < st->specs.size(); ++t) {
      RETURN_IF_ERROR(ForEachRow(
          st->from[i], i, st->S, t, st->specs[t], st->expiry_clock[i], &ignored,
          [&](std::string_view key, std::string_view value) -> Status {
            uint64_t k = 0;
            for (unsigned char c : key) k = (k << 8) | c;
            const int j = ShardOfKey(st->specs[t], k, T);
            StoreBatch* batch = st->batches[j].get();
            batch->Put(st->to_spaces[j][t], key, value, std::string_view());
            ++report.rows;
            ++report.rows_per_shard[j];
            if (batch->bytes() >= st->options.batch_bytes) {
              RETURN_IF_ERROR(
                  st->to[j]
                      ->Write({}, batch, SyncMode::kNoSync, WriteKind::kPartial)
                      .WithContext("writing rows to destination " +
                                   std::to_string(j)));
              batch->Clear();
            }
            return Status::OK();
          }));
    }
  }
  return Status::OK();
}

// 7. Each destination's default-space records, in one cut with the rest
// of its rows.
Status WriteDestinationRecords(ReshardState* st) {
  const int T = st->T;
  const std::vector<Source>& sources = st->sources;
  ReshardReport& report = st->report;
  std::string layout_record = *sources[0].layout;
  {
    const uint32_t t32 = static_cast<uint32_t>(T);
    std::memcpy(layout_record.data() + kLayoutShardsOffset, &t32, sizeof(t32));
  }
  for (int j = 0; j < T; ++j) {
    std::vector<StoreEntry> entries;
    entries.push_back({std::string(kLayoutKey), layout_record, {}});
    if (sources[0].tables) {
      entries.push_back({std::string(sparse::SparseTables::kTablesKey),
                         *sources[0].tables,
                         {}});
      entries.push_back({std::string(sparse::SparseTables::kStateKey),
                         MergedSparseState(sources, st->specs, j, T),
                         {}});
    }
    if (st->num_workers > 0) {
      entries.push_back({std::string(kStateKey),
                         MergedState(sources, j, T, st->num_workers),
                         {}});
    }
    for (uint32_t id : st->new_layout->shard_chunks(j)) {
      if (report.recut) {
        const std::optional<std::string>& value = st->recut[id];
        if (!value) continue;  // never written: initial value
        StoreEntry e;
        e.key = internal::ChunkKey(id);
        e.parts.push_back({value->data(), value->size()});
        entries.push_back(std::move(e));
        ++report.chunk_records;
        continue;
      }
      const Source& src = sources[st->old_layout->chunks()[id].shard];
      auto it = src.chunks.find(id);
      if (it == src.chunks.end()) continue;  // never written: initial value
      StoreEntry e;
      e.key = it->second.first;
      e.parts.push_back({it->second.second.data(), it->second.second.size()});
      entries.push_back(std::move(e));
      ++report.chunk_records;
    }
    RETURN_IF_ERROR(
        st->to[j]
            ->Write(entries, st->batches[j].get(), SyncMode::kSync,
                    WriteKind::kCut)
            .WithContext("writing destination " + std::to_string(j)));
  }
  return Status::OK();
}

}  // namespace

Status Reshard(const std::vector<Store*>& from, const std::vector<Store*>& to,
               const ReshardOptions& options, ReshardReport* report_out) {
  ReshardState st(from, to, options);
  const int S = st.S = static_cast<int>(from.size());
  const int T = st.T = static_cast<int>(to.size());
  if (S < 1) return Status::InvalidArgument("no source store given");
  if (T < 1) return Status::InvalidArgument("no destination store given");
  if (S > 4096 || T > 4096)
    return Status::InvalidArgument("at most 4096 shards");
  for (Store* s : from) {
    if (s == nullptr) return Status::InvalidArgument("a source store is null");
  }
  for (Store* s : to) {
    if (s == nullptr)
      return Status::InvalidArgument("a destination store is null");
  }
  ReshardReport& report = st.report;
  report.from_shards = S;
  report.to_shards = T;

  RETURN_IF_ERROR(ReadSources(&st));            // 1.
  RETURN_IF_ERROR(ReadSparseSources(&st));      // 1.
  RETURN_IF_ERROR(CutLayouts(&st));             // 2.
  RETURN_IF_ERROR(CheckChunkRecords(st));       // 3.
  RETURN_IF_ERROR(RecutChunkRecords(&st));      // 3.
  RETURN_IF_ERROR(CheckSparseRecords(&st));     // 4.
  RETURN_IF_ERROR(OpenEmptyDestinations(&st));  // 5.

  report.chunks_per_shard.assign(T, 0);
  report.rows_per_shard.assign(T, 0);
  report.bytes_per_shard.assign(T, 0);
  for (const ChunkSpec& c : st.new_layout->chunks()) {
    ++report.chunks_per_shard[c.shard];
    report.bytes_per_shard[c.shard] += c.num_elems * sizeof(float);
  }
  report.expired_rows = st.expired;
  if (options.dry_run) {
    if (report_out != nullptr) *report_out = std::move(report);
    return Status::OK();
  }

  RETURN_IF_ERROR(CopySparseRows(&st));           // 6.
  RETURN_IF_ERROR(WriteDestinationRecords(&st));  // 7.
  if (report_out != nullptr) *report_out = std::move(report);
  return Status::OK();
}

}  // namespace asyncps::server
