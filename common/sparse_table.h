// Sparse tables: parameters addressed by uint64 key, one row of `dim` floats
// per key, next to the model's dense tensors (common/layout.h).
//
// A table is defined by a TableSpec (name, row dimension, initialiser, the
// per-row optimizer, admission and expiry). Everything here is a pure
// function of the spec, so every process computes it alike without talking
// to the others:
//   - the shard that holds a key: ShardOfKey(spec, key, num_shards), a hash
//     of (table name, key), uniform over the shards;
//   - the initial value of a row: InitializeRow(spec, key, dst), a function
//     of (seed, table name, key). A row that was never stored *is* its
//     initial value, so a pull of an unseen key needs no storage and gives
//     the same answer on every shard and after every restart.
//
// Rows travel as data frames: keys as `n` little-endian uint64, rows as
// n x dim values (float32, or a dense compression codec: fp16, bf16).
//
// Thread safety: all functions are pure; TableSpec is a value type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/layout.h"
#include "common/status.h"

namespace asyncps {

// Per-row update rule of a table. Travels on the wire: never renumber.
enum class RowOptimizerKind : uint8_t {
  kSgd = 0,      // w -= lr g
  kAdaGrad = 1,  // h += g^2; w -= lr g / (sqrt(h) + eps)
  kAdam = 2,     // per-row step count for the bias correction
};
const char* RowOptimizerKindName(RowOptimizerKind kind);
// "sgd" | "adagrad" | "adam".
StatusOr<RowOptimizerKind> ParseRowOptimizerKind(const std::string& name);

struct RowOptimizerOptions {
  // Default: kSgd.
  RowOptimizerKind kind = RowOptimizerKind::kSgd;
  // Learning rate, > 0. Default: 0.01.
  float lr = 0.01f;
  // Adam moment decays in [0, 1). Default: 0.9 / 0.999.
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  // AdaGrad / Adam denominator epsilon, > 0. Default: 1e-8.
  float eps = 1e-8f;
  // AdaGrad: initial value of the squared-gradient sum, >= 0 (TensorFlow's
  // initial_accumulator_value). Default: 0.
  float initial_accumulator = 0.0f;

  // Floats of optimizer state stored beside each row, per weight:
  // SGD 0, AdaGrad 1, Adam 2.
  size_t state_per_elem() const;
  bool operator==(const RowOptimizerOptions& o) const;
};

// Largest row dimension, in floats.
inline constexpr uint32_t kMaxRowDim = 4096;
// Most tables one model may register.
inline constexpr size_t kMaxTables = 1024;

struct TableSpec {
  // Unique among the model's tables, 1-255 bytes. Required.
  std::string name;
  // Floats per row, in [1, kMaxRowDim]. Required.
  uint32_t dim = 0;
  // Initial value of every row: kZeros, kConstant (param), kUniform
  // (U(-param, param)) or kNormal (N(0, param^2)); He and Xavier are for
  // dense matrices and are rejected. Default: kZeros.
  InitKind init = InitKind::kZeros;
  float init_param = 0.0f;
  // Seed of the initial values. Default: 0.
  uint64_t seed = 0;
  // Per-row optimizer (its state is stored beside each row). Default: SGD.
  RowOptimizerOptions optimizer;
  // Admission: a key is stored only from its N-th push on; the gradients of
  // pushes 1..N-1 are counted (a few bytes per key) and dropped, and the
  // row reads as its initial value until then. 0 and 1: stored at the first
  // push. Default: 0.
  uint32_t admit_after_pushes = 0;
  // Expiry: a row (or admission count) not pushed for more than this many
  // clocks (of the shard's clock minimum) is deleted and reads as its initial
  // value again. 0: never. Default: 0.
  int64_t expire_after_clocks = 0;

  // Range and name checks; InvalidArgument naming the table and the field.
  Status Validate() const;
  bool operator==(const TableSpec& o) const;
  bool operator!=(const TableSpec& o) const { return !(*this == o); }
};

// Checks a model's table list: each spec valid, names unique, at most
// kMaxTables.
Status ValidateTables(const std::vector<TableSpec>& tables);

// The most optimizer steps saved state may give a row: 2^53, exact in the
// double of Adam's bias correction.
inline constexpr uint64_t kMaxRowSteps = uint64_t{1} << 53;
// Checks the saved optimizer state of n rows of `table` before it is set
// (a restore: kAssign phase 5, common/protocol.capnp): `optimizer` must
// name the table's row optimizer; keys[i]'s state (dim x state_per_elem()
// floats at state + i * that; AdaGrad [sum], Adam [m | v]) finite, its sums
// of squares (AdaGrad's sum, Adam's v) >= 0, and steps[i] <= kMaxRowSteps.
// InvalidArgument naming the table and the first bad key. The client checks
// before it uploads anything, the shard again before it writes a row.
Status CheckRowState(const TableSpec& table, std::string_view optimizer,
                     const uint64_t* keys, const float* state,
                     const uint64_t* steps, size_t n);

// A saved entry of a table (kAssign phase 6 scan replies, phase 7
// restores; common/protocol.capnp), little-endian, unaligned:
//   u32 kind    kSavedRow, or kSavedCounter (an admission counter: a key
//               pushed fewer than admit_after_pushes times, no row yet)
//   u32 zero
//   u64 count   row: optimizer steps; counter: pushes counted
//   i64 clock   clock of the last push (expiry)
//   f32 weights[dim], f32 state[dim x state_per_elem()] (counter: zeros)
inline constexpr uint32_t kSavedRow = 1;
inline constexpr uint32_t kSavedCounter = 2;
inline constexpr size_t kSavedHeaderBytes = 24;
// The most a saved clock may be from 0 (either way): 2^53.
inline constexpr int64_t kMaxSavedClock = int64_t{1} << 53;
inline size_t SavedRecordBytes(const TableSpec& table) {
  return kSavedHeaderBytes +
         table.dim * (1 + table.optimizer.state_per_elem()) * sizeof(float);
}
// Checks the kinds, counts and clocks of n saved entries of `table` (the
// weights and state: CheckRowState and the finite check of rows): a kind
// is kSavedRow or kSavedCounter; a counter needs a table with admission
// (admit_after_pushes > 1) and 1 <= count < admit_after_pushes; |clock| <=
// kMaxSavedClock. InvalidArgument naming the table and the first bad key.
Status CheckSavedMeta(const TableSpec& table, const uint64_t* keys,
                      const uint32_t* kinds, const uint64_t* counts,
                      const int64_t* clocks, size_t n);

// The shard in [0, num_shards) that holds `key` of table `spec`: a pure
// function of (table name, key). REQUIRES: num_shards >= 1.
int ShardOfKey(const TableSpec& spec, uint64_t key, int num_shards);
// The same from HashName(spec.name), for loops over many keys.
int ShardOfKeyHashed(uint64_t name_hash, uint64_t key, int num_shards);
// The 64-bit hash of (table, key) both of them map onto their range by
// multiply-high: ShardOfKeyHashed is MulHigh(KeyHash(..), num_shards).
uint64_t KeyHash(uint64_t name_hash, uint64_t key);
inline uint32_t MulHigh(uint64_t h, uint32_t n) {
  return static_cast<uint32_t>((static_cast<unsigned __int128>(h) * n) >> 64);
}

// Key ranges of an elastic fleet (common/elastic_doc.h): the hash space of
// every table is cut into num_buckets equal buckets, bucket =
// MulHigh(KeyHash(..), num_buckets), and each bucket has an owner. One cut
// serves all tables: each table's keys spread uniformly over it, so
// balancing the buckets balances every table's rows, and the document stays
// small. With num_buckets = n * kBucketsPerShard for the n shards of the
// static fleet, floor(bucket / kBucketsPerShard) == ShardOfKeyHashed(.., n)
// (floor(floor(h n M / 2^64) / M) == floor(h n / 2^64)), so Static(n) routes
// exactly as the static fleet did and no row moves until a bucket does.
inline constexpr uint32_t kBucketsPerShard = 64;
// Most buckets a document may cut the hash space into.
inline constexpr uint32_t kMaxBuckets = uint32_t{1} << 20;

struct KeyRanges {
  uint32_t num_buckets = 0;
  std::vector<int> owners;  // by bucket; -1: not this fleet's (owns none)

  // The static fleet of n shards (1 <= n, n * kBucketsPerShard <=
  // kMaxBuckets).
  static KeyRanges Static(int num_shards);
  uint32_t BucketOf(uint64_t name_hash, uint64_t key) const {
    return MulHigh(KeyHash(name_hash, key), num_buckets);
  }
  // REQUIRES: num_buckets > 0.
  int Owner(uint64_t name_hash, uint64_t key) const {
    return owners[BucketOf(name_hash, key)];
  }
};

// Writes the initial value of row `key` (spec.dim floats) to dst.
void InitializeRow(const TableSpec& spec, uint64_t key, float* dst);

}  // namespace asyncps
