// ps_bench_sparse: rows pulled and pushed per second by one shard's sparse
// tables (server/sparse/sparse_tables.h: request checks, cache, RocksDB
// tier, write-back, SGD per row), for Zipf-distributed keys, at three cache
// hit rates, next to two baselines measured in the same run on the same
// batches:
//   hashmap: every row in one std::unordered_map<key, slot> over a flat
//            float array; a pull copies the row out, a push applies the
//            same SGD step to it (the upper bound for hot rows);
//   rocksdb: a RocksDB of the same records (tuned with RocksDB's own
//            OptimizeForPointLookup recipe, no compression); a pull is one
//            MultiGet of the batch, a push a MultiGet, the SGD step and one
//            WriteBatch of the batch's rows (the bound for cold rows).
// The table's store holds every row of the vocabulary beforehand, so a
// cache miss finds its record (as in a trained table).
//
// Regimes: "hit100" (the cache holds every row), "hit50" (a budget
// calibrated to a ~50% hit rate), "hit0" (a budget of one slice: every
// lookup goes to RocksDB). The measured hit rate is printed.
//
// One JSON object per line:
//   {"bench":"sparse","op":"pull"|"push","dim":..,"regime":..,
//    "hit_rate":..,"batch":..,"vocab":..,"cache_bytes":..,
//    "rows_per_s":..,"baseline":"hashmap"|"rocksdb",
//    "baseline_rows_per_s":..,"ratio":..,"ratio_spread":{..},
//    "hashmap_rows_per_s":..,"rocksdb_rows_per_s":..,
//    "ratio_hashmap":..,"ratio_rocksdb":..,"repeats":..,
//    "rows_per_s_min":..,"rows_per_s_max":..,"ratio_hashmap_min":..,
//    "ratio_hashmap_max":..,"ratio_rocksdb_min":..,"ratio_rocksdb_max":..}
// With --scan, per regime also
//   {"bench":"sparse","op":"scan",...,"entries":..,"rows_per_s":..,
//    "baseline":"plain_scan","baseline_rows_per_s":..,"ratio":..,
//    "open_ms":..}: a whole point-in-time scan of the table (what a save of
// it reads: a checkpoint of its dirty rows, a RocksDB snapshot, pages of
// 4096 from the snapshot) against plain pages of the live table, each after
// the same 16 batches of pushes; open_ms is the checkpoint and snapshot.
// rows_per_s etc. are medians over the repeats (each repeat measures the
// table and both baselines back to back); ratios are per repeat, then the
// median and the spread (min, max). "baseline" is the bound of the regime:
// the hash map when every row is cached (hit100), RocksDB when lookups go to
// it (hit50, hit0); ratio and ratio_spread are the ratio to it (both ratios
// are printed in every row).
#include <gflags/gflags.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/hash.h"
#include "common/sparse_table.h"
#include "experiments/bench/bench_util.h"
#include "server/optimizer/optimizer.h"
#include "server/sparse/row_format.h"
#include "server/sparse/sparse_tables.h"
#include "server/store/store.h"

DEFINE_string(dims, "16,64", "row dimensions");
DEFINE_uint64(vocab, 2000000, "distinct keys (rows stored beforehand)");
DEFINE_uint64(batch, 4096, "unique keys per request");
DEFINE_double(zipf, 1.05, "Zipf exponent of the key distribution");
DEFINE_double(seconds, 1.0, "measuring time per point and repeat");
DEFINE_int32(repeats, 3, "repeats (table and baselines alternate)");
DEFINE_string(regimes, "hit100,hit50,hit0", "cache regimes");
DEFINE_string(dir, "", "scratch directory (default: a new dir in /tmp)");
DEFINE_bool(quick, false, "short run: vocab 200000, 0.3 s, 3 repeats");
DEFINE_bool(scan, true,
            "also a whole scan per regime: point-in-time (checkpoint, store "
            "snapshot, pages from it) against plain pages (op \"scan\")");

namespace {

using namespace asyncps;                  // NOLINT: tool main
using namespace asyncps::server;          // NOLINT
using namespace asyncps::server::sparse;  // NOLINT
using Clock = std::chrono::steady_clock;
namespace bench = asyncps::bench;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "ps_bench_sparse: %s\n", what.c_str());
  std::exit(1);
}

void Check(const Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}

void Check(const rocksdb::Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}

uint64_t KeyOfRank(uint64_t r) { return SplitMix64(r + 1); }

// Batches of unique keys, ranks drawn from Zipf(s) over [0, vocab).
std::vector<std::vector<uint64_t>> MakeBatches(uint64_t vocab, size_t batch,
                                               size_t count, double s) {
  std::vector<double> cdf(vocab);
  double sum = 0;
  for (uint64_t i = 0; i < vocab; ++i)
    cdf[i] = sum += 1.0 / std::pow(static_cast<double>(i + 1), s);
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> u(0, sum);
  std::vector<std::vector<uint64_t>> out(count);
  std::unordered_map<uint64_t, bool> seen;
  for (auto& b : out) {
    seen.clear();
    while (b.size() < batch) {
      const uint64_t r =
          std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin();
      if (seen.emplace(r, true).second) b.push_back(KeyOfRank(r));
    }
  }
  return out;
}

TableSpec Spec(uint32_t dim) {
  TableSpec t;
  t.name = "bench";
  t.dim = dim;
  t.init = InitKind::kUniform;
  t.init_param = 0.05f;
  t.optimizer.kind = RowOptimizerKind::kSgd;
  t.optimizer.lr = 1e-6f;
  return t;
}

// Rows per second of `op` over the batches, run for FLAGS_seconds.
double Rate(const std::vector<std::vector<uint64_t>>& batches,
            const std::function<void(const std::vector<uint64_t>&)>& op) {
  size_t rows = 0, i = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  do {
    const auto& b = batches[i++ % batches.size()];
    op(b);
    rows += b.size();
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < FLAGS_seconds);
  return static_cast<double>(rows) / elapsed;
}

double Median(const std::vector<double>& v) {
  return bench::SpreadOf(v).median;
}

// The same rows in a plain hash map.
class HashMapBaseline {
 public:
  HashMapBaseline(uint64_t vocab, uint32_t dim) : dim_(dim) {
    index_.reserve(vocab);
    rows_.resize(vocab * dim);
    TableSpec spec = Spec(dim);
    for (uint64_t r = 0; r < vocab; ++r) {
      index_[KeyOfRank(r)] = static_cast<uint32_t>(r);
      InitializeRow(spec, KeyOfRank(r), rows_.data() + r * dim);
    }
    OptimizerOptions o;
    o.lr = 1e-6f;
    opt_ = std::move(Optimizer::Create(o)).value();
  }
  void Pull(const std::vector<uint64_t>& keys, float* out) {
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = index_.find(keys[i]);
      std::memcpy(out + i * dim_, rows_.data() + size_t{it->second} * dim_,
                  dim_ * sizeof(float));
    }
  }
  void Push(const std::vector<uint64_t>& keys, const float* g) {
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = index_.find(keys[i]);
      opt_->Apply(rows_.data() + size_t{it->second} * dim_, nullptr,
                  g + i * dim_, dim_, 1.0f, 1);
    }
  }

 private:
  uint32_t dim_;
  std::unordered_map<uint64_t, uint32_t> index_;
  std::vector<float> rows_;
  std::unique_ptr<Optimizer> opt_;
};

// The same records in a RocksDB without a cache in front.
class RocksDbBaseline {
 public:
  RocksDbBaseline(const std::string& path, uint64_t vocab, uint32_t dim)
      : dim_(dim) {
    rocksdb::Options o;
    o.create_if_missing = true;
    o.OptimizeForPointLookup(64);  // bloom filters, hash index, 64 MiB cache
    o.compression = rocksdb::kNoCompression;
    o.bottommost_compression = rocksdb::kNoCompression;
    o.max_background_jobs = 2;
    rocksdb::DB* raw = nullptr;
    Check(rocksdb::DB::Open(o, path, &raw), "opening the baseline RocksDB");
    db_.reset(raw);
    TableSpec spec = Spec(dim);
    std::vector<float> row(dim);
    rocksdb::WriteBatch wb;
    for (uint64_t r = 0; r < vocab; ++r) {
      InitializeRow(spec, KeyOfRank(r), row.data());
      Put(&wb, KeyOfRank(r), row.data());
      if (wb.Count() >= 10000 || r + 1 == vocab) {
        Check(db_->Write(rocksdb::WriteOptions(), &wb), "loading");
        wb.Clear();
      }
    }
    Check(db_->CompactRange(rocksdb::CompactRangeOptions(), nullptr, nullptr),
          "compacting");
    OptimizerOptions oo;
    oo.lr = 1e-6f;
    opt_ = std::move(Optimizer::Create(oo)).value();
  }
  ~RocksDbBaseline() {
    if (db_) (void)db_->Close();
  }

  void Pull(const std::vector<uint64_t>& keys, float* out) {
    Get(keys);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!statuses_[i].ok()) Die("baseline row missing");
      std::memcpy(out + i * dim_, values_[i].data() + kRecordHeaderBytes,
                  dim_ * sizeof(float));
      values_[i].Reset();
    }
  }
  void Push(const std::vector<uint64_t>& keys, const float* g) {
    Get(keys);
    rocksdb::WriteBatch wb;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!statuses_[i].ok()) Die("baseline row missing");
      std::memcpy(row_.data(), values_[i].data() + kRecordHeaderBytes,
                  dim_ * sizeof(float));
      values_[i].Reset();
      opt_->Apply(row_.data(), nullptr, g + i * dim_, dim_, 1.0f, 1);
      Put(&wb, keys[i], row_.data());
    }
    Check(db_->Write(rocksdb::WriteOptions(), &wb), "baseline write");
  }

 private:
  void Put(rocksdb::WriteBatch* wb, uint64_t key, const float* row) {
    const EncodedKey k = EncodeKey(key);
    RecordHeader h;
    h.dim = dim_;
    h.count = 1;
    std::string v(reinterpret_cast<const char*>(&h), sizeof(h));
    v.append(reinterpret_cast<const char*>(row), dim_ * sizeof(float));
    Check(wb->Put(rocksdb::Slice(k.bytes, 8), v), "batch put");
  }
  void Get(const std::vector<uint64_t>& keys) {
    const size_t n = keys.size();
    if (keys_.size() < n) {
      keys_.resize(n);
      slices_.resize(n);
      values_ = std::vector<rocksdb::PinnableSlice>(n);
      statuses_.resize(n);
      row_.resize(dim_);
    }
    for (size_t i = 0; i < n; ++i) {
      keys_[i] = EncodeKey(keys[i]);
      slices_[i] = rocksdb::Slice(keys_[i].bytes, 8);
    }
    db_->MultiGet(rocksdb::ReadOptions(), db_->DefaultColumnFamily(), n,
                  slices_.data(), values_.data(), statuses_.data());
  }

  uint32_t dim_;
  std::unique_ptr<rocksdb::DB> db_;
  std::unique_ptr<Optimizer> opt_;
  std::vector<EncodedKey> keys_;
  std::vector<rocksdb::Slice> slices_;
  std::vector<rocksdb::PinnableSlice> values_;
  std::vector<rocksdb::Status> statuses_;
  std::vector<float> row_;
};

// One shard's tables over the store, with `cache_bytes` of cache.
std::unique_ptr<SparseTables> OpenTables(Store* store, uint32_t dim,
                                         uint64_t cache_bytes) {
  SparseOptions o;
  o.cache_bytes = cache_bytes;
  o.max_keys_per_request = FLAGS_batch;
  auto t = SparseTables::Create(o, {Spec(dim)}, store);
  Check(t.status(), "tables");
  return std::move(t).value();
}

void Pull(SparseTables& t, const std::vector<uint64_t>& keys, float* out) {
  t.BeginRequest();
  Check(t.Check(0, keys.data(), keys.size(), nullptr), "check");
  Check(t.Read(0, keys.data(), keys.size(), out), "read");
}

// As the shard does it (sparse_requests.cc): check, read and hold every row,
// then apply.
void Push(SparseTables& t, const std::vector<uint64_t>& keys, const float* g) {
  t.BeginRequest();
  Check(t.Check(0, keys.data(), keys.size(), g), "check");
  Check(t.Hold(0, keys.data(), keys.size()), "hold");
  Check(t.Apply(0, keys.data(), g, keys.size(), 1, 1.0f, false), "apply");
  t.ReleaseHeld();
}

// Hit rate of pulls over the batches after a warm-up pass.
double HitRate(SparseTables& t, const std::vector<std::vector<uint64_t>>& b,
               std::vector<float>* out) {
  for (const auto& k : b) Pull(t, k, out->data());
  const TableCounters before = t.table(0).counters();
  for (const auto& k : b) Pull(t, k, out->data());
  const TableCounters& after = t.table(0).counters();
  const double hits = static_cast<double>(after.hits - before.hits);
  return hits / static_cast<double>(hits + (after.misses - before.misses));
}

// One whole scan of table 0 in pages of `page` entries (what a save reads:
// kAssign phase 6), from `snapshot` when given; returns the entries.
size_t ScanAll(SparseTables& t, size_t page, const StoreSnapshot* snapshot,
               int64_t clock) {
  const size_t rec = t.table(0).saved_record_bytes();
  std::vector<uint64_t> keys(page);
  std::vector<uint8_t> out(page * rec);
  size_t total = 0;
  for (uint64_t from = 0;;) {
    size_t n = 0;
    Check(t.Scan(0, from, page, keys.data(), out.data(), &n, snapshot, clock),
          "scan");
    total += n;
    if (n < page || keys[n - 1] == UINT64_MAX) return total;
    from = keys[n - 1] + 1;
  }
}

// Every dirty entry of the tables to the store, in one cut.
void WriteCut(SparseTables& t, Store& store, SyncMode sync) {
  auto batch = store.NewBatch();
  Check(t.FlushForCheckpoint(batch.get()), "flush");
  Check(store.Write({}, batch.get(), sync, WriteKind::kCut), "write");
  t.CommitCheckpoint();
}

// What a shard does to open a point-in-time scan (server/shard/
// upload_scan.cc): a checkpoint of the tables' dirty entries, synced, then a
// store snapshot.
std::unique_ptr<StoreSnapshot> OpenSnapshot(SparseTables& t, Store& store) {
  WriteCut(t, store, SyncMode::kSync);
  auto snap = store.NewSnapshot();
  Check(snap.status(), "snapshot");
  return std::move(snap).value();
}

// Rows per second of a point-in-time scan (open: checkpoint + snapshot,
// then its pages) against a plain paged scan of the same table in the same
// run (the baseline), each after the same pushes made rows dirty.
void RunScan(SparseTables& t, Store& store, const std::string& regime,
             double hit, uint64_t budget, uint32_t dim,
             const std::vector<std::vector<uint64_t>>& batches,
             const std::vector<float>& grads) {
  const size_t page = 4096;
  auto dirty = [&] {
    for (size_t i = 0; i < 16; ++i) Push(t, batches[i], grads.data());
  };
  std::vector<double> pit, plain, ratio, open_ms;
  size_t entries = 0;
  for (int rep = 0; rep < FLAGS_repeats; ++rep) {
    for (int order = 0; order < 2; ++order) {
      const bool snapshot = (order == 0) == (rep % 2 == 0);
      dirty();
      const auto start = Clock::now();
      size_t n;
      if (snapshot) {
        std::unique_ptr<StoreSnapshot> snap = OpenSnapshot(t, store);
        open_ms.push_back(
            std::chrono::duration<double, std::milli>(Clock::now() - start)
                .count());
        n = ScanAll(t, page, snap.get(), t.clock());
      } else {
        n = ScanAll(t, page, nullptr, 0);
      }
      const double s =
          std::chrono::duration<double>(Clock::now() - start).count();
      (snapshot ? pit : plain).push_back(static_cast<double>(n) / s);
      entries = n;
    }
    ratio.push_back(pit.back() / plain.back());
  }
  const auto vs = bench::SpreadOf(ratio);
  const auto rows = [](double v) { return std::llround(v); };
  bench::Json j;
  j["bench"] = "sparse";
  j["op"] = "scan";
  j["dim"] = dim;
  j["regime"] = regime;
  j["hit_rate"] = bench::Round(hit, 3);
  j["page"] = page;
  j["entries"] = entries;
  j["cache_bytes"] = budget;
  j["rows_per_s"] = rows(Median(pit));
  j["baseline"] = "plain_scan";
  j["baseline_rows_per_s"] = rows(Median(plain));
  j["ratio"] = bench::Round(vs.median, 3);
  j["ratio_spread"] = bench::ToJson(vs);
  j["open_ms"] = bench::Round(Median(open_ms), 2);
  j["open_ms_max"] =
      bench::Round(*std::max_element(open_ms.begin(), open_ms.end()), 2);
  j["dirty_batches"] = 16;
  j["repeats"] = FLAGS_repeats;
  bench::Emit(j);
}

void RunDim(const std::string& dir, uint32_t dim) {
  const uint64_t vocab = FLAGS_vocab;
  const auto batches = MakeBatches(vocab, FLAGS_batch, 64, FLAGS_zipf);
  std::vector<float> out(FLAGS_batch * dim), grads(FLAGS_batch * dim);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  for (float& g : grads) g = nd(rng);

  HashMapBaseline hashmap(vocab, dim);
  RocksDbBaseline rocks(dir + "/raw" + std::to_string(dim), vocab, dim);
  RocksDbStoreOptions so;
  so.path = dir + "/ours" + std::to_string(dim);
  auto store_or = OpenRocksDbStore(so);
  Check(store_or.status(), "store");
  std::unique_ptr<Store> store = std::move(store_or).value();
  // Store every row of the vocabulary (as a trained table holds them).
  {
    auto t = OpenTables(store.get(), dim, 64 << 20);
    std::vector<uint64_t> keys;
    std::vector<float> zeros(FLAGS_batch * dim, 0.0f);
    for (uint64_t r = 0; r < vocab; ++r) {
      keys.push_back(KeyOfRank(r));
      if (keys.size() == FLAGS_batch || r + 1 == vocab) {
        Push(*t, keys, zeros.data());
        keys.clear();
      }
    }
    WriteCut(*t, *store, SyncMode::kNoSync);
    Check(store->CompactSpace(t->table(0).space()), "compact");
  }
  const size_t entry = dim * sizeof(float) + sizeof(EntryMeta);
  for (const std::string regime : {"hit100", "hit50", "hit0"}) {
    if (FLAGS_regimes.find(regime) == std::string::npos) continue;
    uint64_t budget = 1;
    if (regime == "hit100") budget = vocab * (entry + 64) + (64u << 20);
    if (regime == "hit50") {
      // Bisect the budget (in rows) for a 50% hit rate.
      uint64_t lo = 0, hi = vocab;
      for (int probe = 0; probe < 7; ++probe) {
        const uint64_t mid = (lo + hi) / 2;
        auto t = OpenTables(store.get(), dim, mid * (entry + 32));
        const double h = HitRate(*t, batches, &out);
        (h < 0.5 ? lo : hi) = mid;
      }
      budget = (lo + hi) / 2 * (entry + 32);
    }
    auto t = OpenTables(store.get(), dim, budget);
    const double hit = HitRate(*t, batches, &out);
    for (const char* op : {"pull", "push"}) {
      const bool pull = std::strcmp(op, "pull") == 0;
      std::vector<double> ours, hm, rk, r_hm, r_rk;
      for (int rep = 0; rep < FLAGS_repeats; ++rep) {
        const double a = Rate(batches, [&](const std::vector<uint64_t>& k) {
          pull ? Pull(*t, k, out.data()) : Push(*t, k, grads.data());
        });
        const double b = Rate(batches, [&](const std::vector<uint64_t>& k) {
          pull ? hashmap.Pull(k, out.data()) : hashmap.Push(k, grads.data());
        });
        const double c = Rate(batches, [&](const std::vector<uint64_t>& k) {
          pull ? rocks.Pull(k, out.data()) : rocks.Push(k, grads.data());
        });
        ours.push_back(a);
        hm.push_back(b);
        rk.push_back(c);
        r_hm.push_back(a / b);
        r_rk.push_back(a / c);
      }
      const bool hot = regime == "hit100";
      const auto vs_hm = bench::SpreadOf(r_hm);
      const auto vs_rk = bench::SpreadOf(r_rk);
      const auto& vs = hot ? vs_hm : vs_rk;
      const auto rows = [](double v) { return std::llround(v); };
      bench::Json j;
      j["bench"] = "sparse";
      j["op"] = op;
      j["dim"] = dim;
      j["regime"] = regime;
      j["hit_rate"] = bench::Round(hit, 3);
      j["batch"] = FLAGS_batch;
      j["vocab"] = vocab;
      j["cache_bytes"] = budget;
      j["rows_per_s"] = rows(Median(ours));
      j["baseline"] = hot ? "hashmap" : "rocksdb";
      j["baseline_rows_per_s"] = rows(Median(hot ? hm : rk));
      j["ratio"] = bench::Round(vs.median, 3);
      j["ratio_spread"] = bench::ToJson(vs);
      j["hashmap_rows_per_s"] = rows(Median(hm));
      j["rocksdb_rows_per_s"] = rows(Median(rk));
      j["ratio_hashmap"] = bench::Round(vs_hm.median, 3);
      j["ratio_rocksdb"] = bench::Round(vs_rk.median, 3);
      j["repeats"] = FLAGS_repeats;
      j["rows_per_s_min"] = rows(*std::min_element(ours.begin(), ours.end()));
      j["rows_per_s_max"] = rows(*std::max_element(ours.begin(), ours.end()));
      j["ratio_hashmap_min"] = bench::Round(vs_hm.min, 3);
      j["ratio_hashmap_max"] = bench::Round(vs_hm.max, 3);
      j["ratio_rocksdb_min"] = bench::Round(vs_rk.min, 3);
      j["ratio_rocksdb_max"] = bench::Round(vs_rk.max, 3);
      bench::Emit(j);
    }
    if (FLAGS_scan)
      RunScan(*t, *store, regime, hit, budget, dim, batches, grads);
  }
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_quick) {
    if (gflags::GetCommandLineFlagInfoOrDie("vocab").is_default)
      FLAGS_vocab = 200000;
    FLAGS_seconds = 0.3;
    FLAGS_repeats = 3;
  }
  if (FLAGS_batch < 1 || FLAGS_vocab < FLAGS_batch * 2 || FLAGS_repeats < 1)
    Die("need batch >= 1, vocab >= 2 x batch, repeats >= 1");
  std::string dir = FLAGS_dir;
  bool made = false;
  if (dir.empty()) {
    char tmpl[] = "/tmp/ps_bench_sparse_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) Die("mkdtemp");
    dir = tmpl;
    made = true;
  }
  for (const char* p = FLAGS_dims.c_str(); *p;) {
    char* end = nullptr;
    const unsigned long d = std::strtoul(p, &end, 10);
    if (d < 1 || d > kMaxRowDim) Die("bad --dims");
    RunDim(dir, static_cast<uint32_t>(d));
    p = *end ? end + 1 : end;
  }
  if (made) std::filesystem::remove_all(dir);
  return 0;
}
