#include "common/sparse_table.h"

#include <cmath>
#include <unordered_set>

#include "common/hash.h"

namespace asyncps {

const char* RowOptimizerKindName(RowOptimizerKind kind) {
  switch (kind) {
    case RowOptimizerKind::kSgd:
      return "sgd";
    case RowOptimizerKind::kAdaGrad:
      return "adagrad";
    case RowOptimizerKind::kAdam:
      return "adam";
  }
  return "invalid";
}

StatusOr<RowOptimizerKind> ParseRowOptimizerKind(const std::string& name) {
  if (name == "sgd") return RowOptimizerKind::kSgd;
  if (name == "adagrad") return RowOptimizerKind::kAdaGrad;
  if (name == "adam") return RowOptimizerKind::kAdam;
  return Status::InvalidArgument("unknown row optimizer '" + name +
                                 "' (valid: sgd, adagrad, adam)");
}

size_t RowOptimizerOptions::state_per_elem() const {
  switch (kind) {
    case RowOptimizerKind::kSgd:
      return 0;
    case RowOptimizerKind::kAdaGrad:
      return 1;
    case RowOptimizerKind::kAdam:
      return 2;
  }
  return 0;
}

bool RowOptimizerOptions::operator==(const RowOptimizerOptions& o) const {
  return kind == o.kind && lr == o.lr && beta1 == o.beta1 && beta2 == o.beta2 &&
         eps == o.eps && initial_accumulator == o.initial_accumulator;
}

Status TableSpec::Validate() const {
  auto bad = [this](const std::string& what) {
    return Status::InvalidArgument("table '" + name + "': " + what);
  };
  if (name.empty() || name.size() > 255) {
    return Status::InvalidArgument("table name must be 1-255 bytes: '" + name +
                                   "'");
  }
  if (dim < 1 || dim > kMaxRowDim) {
    return bad("dim " + std::to_string(dim) + " out of range [1, " +
               std::to_string(kMaxRowDim) + "]");
  }
  switch (init) {
    case InitKind::kZeros:
    case InitKind::kConstant:
    case InitKind::kUniform:
    case InitKind::kNormal:
      break;
    default:
      return bad("initialiser must be zeros, constant, uniform or normal");
  }
  if (!std::isfinite(init_param)) return bad("init parameter is not finite");
  const RowOptimizerOptions& o = optimizer;
  if (static_cast<uint8_t>(o.kind) >
      static_cast<uint8_t>(RowOptimizerKind::kAdam))
    return bad("unknown optimizer");
  if (!(o.lr > 0.0f) || !std::isfinite(o.lr)) return bad("lr must be > 0");
  if (!(o.beta1 >= 0.0f && o.beta1 < 1.0f)) return bad("beta1 not in [0, 1)");
  if (!(o.beta2 >= 0.0f && o.beta2 < 1.0f)) return bad("beta2 not in [0, 1)");
  if (!(o.eps > 0.0f) || !std::isfinite(o.eps)) return bad("eps must be > 0");
  if (!(o.initial_accumulator >= 0.0f) || !std::isfinite(o.initial_accumulator))
    return bad("initial_accumulator must be >= 0");
  if (expire_after_clocks < 0) return bad("expire_after_clocks must be >= 0");
  return Status::OK();
}

bool TableSpec::operator==(const TableSpec& o) const {
  return name == o.name && dim == o.dim && init == o.init &&
         init_param == o.init_param && seed == o.seed &&
         optimizer == o.optimizer &&
         admit_after_pushes == o.admit_after_pushes &&
         expire_after_clocks == o.expire_after_clocks;
}

Status CheckRowState(const TableSpec& table, std::string_view optimizer,
                     const uint64_t* keys, const float* state,
                     const uint64_t* steps, size_t n) {
  const std::string runs = RowOptimizerKindName(table.optimizer.kind);
  if (optimizer != runs) {
    return Status::InvalidArgument("optimizer state of the rows of table '" +
                                   table.name + "' was saved from '" +
                                   std::string(optimizer) +
                                   "', the table runs '" + runs + "': refused");
  }
  const size_t dim = table.dim;
  const size_t k = dim * table.optimizer.state_per_elem();
  // Where the sum of squares (the update takes its square root) starts.
  const size_t squares = table.optimizer.kind == RowOptimizerKind::kAdaGrad ? 0
                         : table.optimizer.kind == RowOptimizerKind::kAdam ? dim
                                                                           : k;
  for (size_t i = 0; i < n; ++i) {
    const float* s = state + i * k;
    const std::string row = "table '" + table.name +
                            "': the optimizer state of key " +
                            std::to_string(keys[i]);
    for (size_t j = 0; j < k; ++j) {
      if (!std::isfinite(s[j]))
        return Status::InvalidArgument(row + " contains NaN or Inf");
      if (j >= squares && j < squares + dim && s[j] < 0.0f) {
        return Status::InvalidArgument(
            row + " has a negative sum of squares (" + runs + ")");
      }
    }
    if (steps[i] > kMaxRowSteps) {
      return Status::InvalidArgument(row + ": " + std::to_string(steps[i]) +
                                     " optimizer steps, at most 2^53");
    }
  }
  return Status::OK();
}

Status CheckSavedMeta(const TableSpec& table, const uint64_t* keys,
                      const uint32_t* kinds, const uint64_t* counts,
                      const int64_t* clocks, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const std::string row = "table '" + table.name +
                            "': the saved entry of key " +
                            std::to_string(keys[i]);
    if (kinds[i] != kSavedRow && kinds[i] != kSavedCounter) {
      return Status::InvalidArgument(row + " is of kind " +
                                     std::to_string(kinds[i]) +
                                     " (1 row, 2 admission counter)");
    }
    if (kinds[i] == kSavedCounter &&
        (table.admit_after_pushes <= 1 || counts[i] < 1 ||
         counts[i] >= table.admit_after_pushes)) {
      return Status::InvalidArgument(row + " is an admission counter of " +
                                     std::to_string(counts[i]) +
                                     " pushes; the table admits after " +
                                     std::to_string(table.admit_after_pushes) +
                                     " (a counter counts 1 to that - 1)");
    }
    if (clocks[i] > kMaxSavedClock || clocks[i] < -kMaxSavedClock) {
      return Status::InvalidArgument(row + ": last push at clock " +
                                     std::to_string(clocks[i]) +
                                     ", outside +-2^53");
    }
  }
  return Status::OK();
}

Status ValidateTables(const std::vector<TableSpec>& tables) {
  if (tables.size() > kMaxTables) {
    return Status::InvalidArgument("more than " + std::to_string(kMaxTables) +
                                   " tables");
  }
  std::unordered_set<std::string> names;
  for (const TableSpec& t : tables) {
    RETURN_IF_ERROR(t.Validate());
    if (!names.insert(t.name).second) {
      return Status::InvalidArgument("duplicate table name '" + t.name + "'");
    }
  }
  return Status::OK();
}

uint64_t KeyHash(uint64_t name_hash, uint64_t key) {
  return SplitMix64(SplitMix64(key) ^ name_hash);
}

int ShardOfKeyHashed(uint64_t name_hash, uint64_t key, int num_shards) {
  // Multiply-high maps the hash uniformly onto [0, num_shards).
  return static_cast<int>(
      MulHigh(KeyHash(name_hash, key), static_cast<uint32_t>(num_shards)));
}

KeyRanges KeyRanges::Static(int num_shards) {
  KeyRanges r;
  r.num_buckets = static_cast<uint32_t>(num_shards) * kBucketsPerShard;
  r.owners.resize(r.num_buckets);
  for (uint32_t b = 0; b < r.num_buckets; ++b)
    r.owners[b] = static_cast<int>(b / kBucketsPerShard);
  return r;
}

int ShardOfKey(const TableSpec& spec, uint64_t key, int num_shards) {
  return ShardOfKeyHashed(HashName(spec.name), key, num_shards);
}

void InitializeRow(const TableSpec& spec, uint64_t key, float* dst) {
  const uint64_t stream =
      SplitMix64(SplitMix64(spec.seed ^ HashName(spec.name)) ^
                 SplitMix64(key ^ 0x5851f42d4c957f2dULL));
  FillInitialValues(spec.init, spec.init_param, stream, 0, spec.dim, dst);
}

}  // namespace asyncps
