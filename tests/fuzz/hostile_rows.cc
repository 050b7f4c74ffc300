// HostileGenerator's sparse part: row refs in pushes and pulls, and hostile
// table definitions in registrations (see tests/fuzz/hostile_requests.h).
// Legal parts carry zero rows (bytes of zeros in fp32, fp16 or bf16), so with
// SGD tables an accepted push changes no row.
#include <algorithm>
#include <cstring>
#include <limits>

#include "common/sparse_table.h"
#include "compression/codec.h"
#include "tests/fuzz/hostile_requests.h"

namespace asyncps::fuzz {
namespace {

constexpr uint32_t kU32Max = std::numeric_limits<uint32_t>::max();

std::vector<uint8_t> KeyBytes(const std::vector<uint64_t>& keys) {
  std::vector<uint8_t> b(keys.size() * sizeof(uint64_t));
  if (!keys.empty()) std::memcpy(b.data(), keys.data(), b.size());
  return b;
}

}  // namespace

std::vector<uint64_t> HostileGenerator::OwnedKeys(uint32_t table, size_t n) {
  std::vector<uint64_t> keys;
  const TableSpec& t = tables_[table];
  while (keys.size() < n) {
    // Small keys now and then (the ids real data has), else any 64 bits.
    const uint64_t k = OneIn(4) ? static_cast<uint64_t>(Uniform(0, 1 << 20))
                                : static_cast<uint64_t>(rng_());
    if (ShardOfKey(t, k, num_shards_) != shard_) continue;
    if (std::find(keys.begin(), keys.end(), k) != keys.end()) continue;
    keys.push_back(k);
  }
  return keys;
}

uint64_t HostileGenerator::ForeignKey(uint32_t table) {
  if (num_shards_ == 1) return rng_();
  while (true) {
    const uint64_t k = rng_();
    if (ShardOfKey(tables_[table], k, num_shards_) != shard_) return k;
  }
}

size_t HostileGenerator::AddRows(HostileMessage* m, uint32_t table, size_t n,
                                 bool push) {
  RequestHeader& h = m->header;
  RowsRef r;
  r.table = table;
  r.num_keys = n;
  m->frames.push_back(KeyBytes(OwnedKeys(table, n)));
  r.keys_frame = static_cast<uint32_t>(m->frames.size());
  r.codec = static_cast<uint8_t>(Uniform(0, 2));  // fp32, fp16, bf16
  if (push) {
    const size_t values = n * tables_[table].dim;
    const size_t bytes = r.codec == 0 ? values * sizeof(float) : 0;
    std::vector<uint8_t> rows(bytes, 0);
    if (r.codec != 0) {
      const std::vector<float> zeros(values, 0.0f);
      const Status s =
          compression::CodecForId(static_cast<compression::CodecId>(r.codec))
              .Encode(zeros.data(), values, rng_(), &rows);
      if (!s.ok()) {
        r.codec = 0;
        rows.assign(values * sizeof(float), 0);
      }
    }
    m->frames.push_back(std::move(rows));
    r.rows_frame = static_cast<uint32_t>(m->frames.size());
  }
  h.rows.push_back(r);
  return h.rows.size() - 1;
}

void HostileGenerator::PushRows(HostileMessage* m) {
  RequestHeader& h = m->header;
  h.kind = RequestKind::kPush;
  h.clock = Clock();
  if (OneIn(4)) h.done_below = Count();
  if (OneIn(3)) {  // chunks and rows in one push
    ChunkRef c;
    c.chunk = mine_[Uniform(0, static_cast<int64_t>(mine_.size()) - 1)];
    c.num_elems = layout_.chunks()[c.chunk].num_elems;
    m->frames.push_back(ZeroPayload(c.chunk, &c.codec));
    c.frame = static_cast<uint32_t>(m->frames.size());
    c.byte_size = m->frames.back().size();
    h.chunks.push_back(c);
  }
  const uint32_t num_tables = static_cast<uint32_t>(tables_.size());
  const uint32_t first = static_cast<uint32_t>(Uniform(0, num_tables - 1));
  AddRows(m, first, static_cast<size_t>(Uniform(1, 64)), true);
  if (num_tables > 1 && OneIn(2))
    AddRows(m, (first + 1) % num_tables, static_cast<size_t>(Uniform(1, 64)),
            true);
  RowsRef& r = h.rows[Uniform(0, static_cast<int64_t>(h.rows.size()) - 1)];
  std::vector<uint8_t>& keys = m->frames[r.keys_frame - 1];
  std::vector<uint8_t>& rows = m->frames[r.rows_frame - 1];
  switch (Uniform(0, 13)) {
    case 0:
      m->shape = "rows/zero_gradient";
      return;
    case 1:
      m->shape = "rows/table";
      r.table = OneIn(2) ? num_tables + static_cast<uint32_t>(Uniform(0, 5))
                         : (OneIn(2) ? kU32Max : static_cast<uint32_t>(rng_()));
      return;
    case 2:
      m->shape = "rows/repeated_table";
      AddRows(m, h.rows[0].table, static_cast<size_t>(Uniform(1, 8)), true);
      return;
    case 3:
      m->shape = "rows/num_keys";
      r.num_keys = Count();
      return;
    case 4:
      m->shape = "rows/frame_index";
      (OneIn(2) ? r.keys_frame : r.rows_frame) =
          OneIn(2) ? 0
                   : static_cast<uint32_t>(m->frames.size() + Uniform(1, 1000));
      return;
    case 5:
      // Two refs on one frame: keys read as rows, or a chunk's frame.
      m->shape = "rows/shared_frame";
      if (!h.chunks.empty() && OneIn(2)) {
        r.keys_frame = h.chunks[0].frame;
      } else {
        r.rows_frame = r.keys_frame;
      }
      return;
    case 6: {
      m->shape = "rows/row_bytes";
      const size_t exact = rows.size();
      size_t n = static_cast<size_t>(Uniform(0, 2 * exact + 16));
      if (n == exact) ++n;
      rows.resize(n, 0);
      return;
    }
    case 7:
      // Any other codec (top-k, random-k: refused for rows; dense ones: the
      // zero bytes fail validation or decode to zeros).
      m->shape = "rows/codec";
      r.codec = static_cast<uint8_t>(Uniform(3, 255));
      return;
    case 8: {
      m->shape = "rows/repeated_key";
      if (r.num_keys < 2) {
        keys.resize(2 * sizeof(uint64_t));
        std::memcpy(keys.data() + 8, keys.data(), 8);
        r.num_keys = 2;
        r.codec = 0;
        rows.assign(2 * tables_[r.table].dim * sizeof(float), 0);
        return;
      }
      const size_t i = static_cast<size_t>(Uniform(1, r.num_keys - 1));
      std::memcpy(keys.data() + 8 * i, keys.data(), 8);
      return;
    }
    case 9: {
      m->shape = "rows/foreign_key";
      const uint64_t k = ForeignKey(r.table);
      const size_t i = static_cast<size_t>(Uniform(0, r.num_keys - 1));
      std::memcpy(keys.data() + 8 * i, &k, 8);
      return;
    }
    case 10: {
      m->shape = "rows/non_finite";
      const size_t values = r.num_keys * tables_[r.table].dim;
      r.codec = 0;
      rows.assign(values * sizeof(float), 0);
      const float bad = OneIn(2) ? std::numeric_limits<float>::quiet_NaN()
                                 : -std::numeric_limits<float>::infinity();
      std::memcpy(rows.data() + sizeof(float) * Uniform(0, values - 1), &bad,
                  sizeof(float));
      return;
    }
    case 11: {
      m->shape = "rows/many_refs";
      const int64_t refs = Uniform(100, 5000);
      const RowsRef base = r;  // r moves as the list grows
      for (int64_t i = 0; i < refs; ++i) {
        RowsRef x = base;
        x.table = static_cast<uint32_t>(Uniform(0, num_tables + 1));
        x.keys_frame = static_cast<uint32_t>(Uniform(0, 4));
        x.rows_frame = static_cast<uint32_t>(Uniform(0, 4));
        h.rows.push_back(x);
      }
      return;
    }
    case 12:
      m->shape = OneIn(2) ? "rows/extra_frames" : "rows/missing_frames";
      if (m->shape == "rows/extra_frames") {
        for (int64_t i = Uniform(1, 8); i > 0; --i)
          m->frames.emplace_back(Uniform(0, 64), 0);
      } else {
        m->frames.pop_back();
      }
      return;
    default:
      m->shape = "rows/clock_rank";
      h.clock = Clock();
      h.rank = Rank();
      return;
  }
}

void HostileGenerator::PullRows(HostileMessage* m) {
  RequestHeader& h = m->header;
  h.kind = RequestKind::kPull;
  h.clock = Clock();
  h.pull_dense = OneIn(3);
  if (h.pull_dense && OneIn(2)) h.pull_codec = PullCodec();
  const uint32_t num_tables = static_cast<uint32_t>(tables_.size());
  const uint32_t first = static_cast<uint32_t>(Uniform(0, num_tables - 1));
  AddRows(m, first, static_cast<size_t>(Uniform(1, 256)), false);
  if (num_tables > 1 && OneIn(2))
    AddRows(m, (first + 1) % num_tables, static_cast<size_t>(Uniform(1, 64)),
            false);
  RowsRef& r = h.rows[Uniform(0, static_cast<int64_t>(h.rows.size()) - 1)];
  std::vector<uint8_t>& keys = m->frames[r.keys_frame - 1];
  switch (Uniform(0, 11)) {
    case 0:
      m->shape = "pull_rows/legal";
      return;
    case 1:
      m->shape = "pull_rows/table";
      r.table = OneIn(2) ? num_tables : static_cast<uint32_t>(rng_());
      return;
    case 2:
      m->shape = "pull_rows/repeated_table";
      AddRows(m, h.rows[0].table, static_cast<size_t>(Uniform(1, 8)), false);
      return;
    case 3:
      m->shape = "pull_rows/num_keys";
      r.num_keys = Count();
      return;
    case 4:
      m->shape = "pull_rows/keys_frame";
      r.keys_frame =
          OneIn(2) ? 0
                   : static_cast<uint32_t>(m->frames.size() + Uniform(1, 9));
      return;
    case 5:
      m->shape = "pull_rows/shared_frame";
      AddRows(m, (r.table + 1) % num_tables, 1, false);
      h.rows.back().keys_frame = h.rows[0].keys_frame;
      return;
    case 6:
      m->shape = "pull_rows/keys_bytes";
      keys.resize(static_cast<size_t>(Uniform(0, keys.size() + 64)) | 1);
      return;
    case 7:
      m->shape = "pull_rows/codec";
      r.codec = static_cast<uint8_t>(Uniform(3, 255));
      return;
    case 8: {
      m->shape = "pull_rows/repeated_key";
      if (r.num_keys < 2) {
        keys.resize(16);
        std::memcpy(keys.data() + 8, keys.data(), 8);
        r.num_keys = 2;
        return;
      }
      const size_t i = static_cast<size_t>(Uniform(1, r.num_keys - 1));
      std::memcpy(keys.data() + 8 * i, keys.data(), 8);
      return;
    }
    case 9: {
      m->shape = "pull_rows/foreign_key";
      const uint64_t k = ForeignKey(r.table);
      std::memcpy(keys.data(), &k, 8);
      return;
    }
    case 10:
      m->shape = "pull_rows/frames";
      if (OneIn(2)) {
        m->frames.emplace_back(Uniform(0, 64), 0);
      } else {
        m->frames.pop_back();
      }
      return;
    default:
      m->shape = "pull_rows/clock_rank";
      h.rank = Rank();
      return;
  }
}

// A page of a scan of a table's rows (kAssign phase 6), plain or
// point-in-time: any table, cursor, page size and scan id, opens and
// names together, stray frames; each answered, none crashes the shard, and
// the opens are bounded (4 open, one per 50 ms: the rest Unavailable).
void HostileGenerator::ScanRows(HostileMessage* m) {
  RequestHeader& h = m->header;
  h.kind = RequestKind::kAssign;
  h.assign_phase = AssignOp::kScan;
  h.assign_upload = OneIn(8) ? 0 : rng_() | 1;
  RowsRef ref;
  ref.table = static_cast<uint32_t>(
      OneIn(4) ? rng_() : Uniform(0, static_cast<int64_t>(tables_.size()) - 1));
  h.rows = {ref};
  h.assign_cursor = OneIn(2) ? 0 : rng_();
  h.assign_scan_rows = static_cast<uint32_t>(
      OneIn(4) ? rng_() : (OneIn(4) ? 0 : Uniform(1, 512)));
  switch (Uniform(0, 4)) {
    case 0:
      m->shape = "scan/plain";
      return;
    case 1:
      m->shape = "scan/open";
      h.assign_open_snapshot = true;
      return;
    case 2:
      m->shape = "scan/unknown_snapshot";
      h.assign_snapshot = OneIn(2) ? rng_() : Uniform(1, 8);
      return;
    case 3:
      m->shape = "scan/open_and_named";
      h.assign_open_snapshot = true;
      h.assign_snapshot = rng_() | 1;
      return;
    default:
      m->shape = "scan/frames";
      h.assign_open_snapshot = OneIn(2);
      if (OneIn(2)) h.rows.push_back(ref);
      m->frames.push_back(std::vector<uint8_t>(
          static_cast<size_t>(Uniform(0, 64)), static_cast<uint8_t>(rng_())));
      return;
  }
}

void HostileGenerator::HostileTables(HostileMessage* m) {
  RequestHeader& h = m->header;
  TableSpec& t =
      h.tables[Uniform(0, static_cast<int64_t>(h.tables.size()) - 1)];
  switch (Uniform(0, 7)) {
    case 0:
      m->shape = "register/table_dim";
      t.dim = OneIn(3) ? 0
                       : (OneIn(2) ? kMaxRowDim + 1
                                   : static_cast<uint32_t>(rng_()) | 1u << 31);
      return;
    case 1: {
      m->shape = "register/many_tables";
      const int64_t n = Uniform(kMaxTables + 1, 3 * kMaxTables);
      const TableSpec base = t;  // t moves as the list grows
      for (int64_t i = 0; i < n; ++i) {
        TableSpec x = base;
        x.name = "t" + std::to_string(i);
        h.tables.push_back(x);
      }
      return;
    }
    case 2:
      m->shape = "register/table_names";
      t.name = OneIn(2) ? "" : std::string(Uniform(256, 4000), 'n');
      if (OneIn(2)) h.tables.push_back(h.tables[0]);  // a repeated name
      return;
    case 3:
      m->shape = "register/table_init";
      t.init = static_cast<InitKind>(Uniform(4, 255));
      t.init_param = OneIn(2) ? std::numeric_limits<float>::infinity()
                              : std::numeric_limits<float>::quiet_NaN();
      return;
    case 4:
      m->shape = "register/table_optimizer";
      t.optimizer.kind = static_cast<RowOptimizerKind>(Uniform(3, 255));
      t.optimizer.lr = OneIn(2) ? std::numeric_limits<float>::quiet_NaN()
                                : -static_cast<float>(Uniform(0, 10));
      t.optimizer.beta1 = 1.5f;
      t.optimizer.eps = 0;
      return;
    case 5:
      m->shape = "register/table_admission";
      t.admit_after_pushes = static_cast<uint32_t>(rng_());
      t.expire_after_clocks =
          OneIn(2) ? -Uniform(1, 1000) : std::numeric_limits<int64_t>::max();
      return;
    case 6:
      m->shape = "register/tables_missing";
      h.tables.pop_back();
      return;
    default:
      m->shape = "register/table_seed";
      t.seed ^= 1;
      return;
  }
}

}  // namespace asyncps::fuzz
