#include "worker/internal/rows_plan.h"

#include <cstring>

#include "common/flat_index.h"
#include "common/hash.h"

namespace asyncps::worker::internal {

Status RowsPlan::Build(const std::vector<TableSpec>& tables, int num_shards,
                       const std::vector<RowsInput>& inputs, bool push,
                       const KeyRanges* ranges) {
  tables_ = tables;
  inputs_ = inputs;
  inverse_.assign(inputs.size(), Inverse{});
  parts_.assign(num_shards, {});
  std::vector<bool> seen(tables.size(), false);
  FlatIndex unique;
  std::vector<uint64_t> ukeys;
  std::vector<uint32_t> ushard, uindex;
  std::vector<uint32_t> count(num_shards);
  for (size_t in = 0; in < inputs.size(); ++in) {
    const RowsInput& r = inputs[in];
    if (r.table >= tables.size()) {
      return Status::InvalidArgument("rows of unknown table " +
                                     std::to_string(r.table));
    }
    const TableSpec& spec = tables[r.table];
    if (seen[r.table]) {
      return Status::InvalidArgument("table '" + spec.name +
                                     "' named twice in one request");
    }
    seen[r.table] = true;
    if (r.n > kMaxKeys || (r.n > 0 && r.keys == nullptr) ||
        (r.n > 0 && push && r.grads == nullptr) ||
        (r.n > 0 && !push && r.out == nullptr)) {
      return Status::InvalidArgument("table '" + spec.name +
                                     "': bad key count or buffers");
    }
    const size_t dim = spec.dim;
    const uint64_t name_hash = HashName(spec.name);
    // Unique keys in order of first appearance, and their shards.
    unique.Clear();
    ukeys.clear();
    ushard.clear();
    uindex.clear();
    std::fill(count.begin(), count.end(), 0);
    Inverse& inv = inverse_[in];
    inv.shard.resize(r.n);
    inv.index.resize(r.n);
    std::vector<uint32_t> pos_unique(r.n);
    for (size_t i = 0; i < r.n; ++i) {
      uint32_t u = unique.Find(r.keys[i]);
      if (u == FlatIndex::kNone) {
        u = static_cast<uint32_t>(ukeys.size());
        unique.Insert(r.keys[i], u);
        ukeys.push_back(r.keys[i]);
        const int s = ranges != nullptr
                          ? ranges->Owner(name_hash, r.keys[i])
                          : ShardOfKeyHashed(name_hash, r.keys[i], num_shards);
        if (s < 0 || s >= num_shards) {
          return Status::Internal("key " + std::to_string(r.keys[i]) +
                                  " of table '" + spec.name +
                                  "' routed to shard " + std::to_string(s) +
                                  " of " + std::to_string(num_shards));
        }
        ushard.push_back(static_cast<uint32_t>(s));
        uindex.push_back(count[s]++);
      }
      pos_unique[i] = u;
      inv.shard[i] = ushard[u];
      inv.index[i] = uindex[u];
    }
    inv.part_of_shard.assign(num_shards, -1);
    std::vector<Part*> part(num_shards, nullptr);
    for (int s = 0; s < num_shards; ++s) {
      if (count[s] == 0) continue;
      Part p;
      p.table = r.table;
      p.input = in;
      p.n = count[s];
      p.keys = Buffer::Allocate(p.n * sizeof(uint64_t));
      if (push) p.grads = Buffer::Allocate(p.n * dim * sizeof(float));
      inv.part_of_shard[s] = static_cast<int32_t>(parts_[s].size());
      parts_[s].push_back(std::move(p));
    }
    for (int s = 0; s < num_shards; ++s) {
      if (inv.part_of_shard[s] >= 0) part[s] = &parts_[s][inv.part_of_shard[s]];
    }
    for (size_t u = 0; u < ukeys.size(); ++u) {
      std::memcpy(part[ushard[u]]->keys->data() + uindex[u] * sizeof(uint64_t),
                  &ukeys[u], sizeof(uint64_t));
    }
    if (push) {
      // The first occurrence is copied, later ones added, in position order.
      std::vector<bool> written(ukeys.size(), false);
      for (size_t i = 0; i < r.n; ++i) {
        const uint32_t u = pos_unique[i];
        float* dst = part[ushard[u]]->grads->floats() + uindex[u] * dim;
        const float* g = r.grads + i * dim;
        if (!written[u]) {
          std::memcpy(dst, g, dim * sizeof(float));
          written[u] = true;
        } else {
          for (size_t j = 0; j < dim; ++j) dst[j] += g[j];
        }
      }
    }
  }
  return Status::OK();
}

void RowsPlan::Scatter(int shard, size_t p, const float* rows) {
  const Part& part = parts_[shard][p];
  const RowsInput& r = inputs_[part.input];
  const Inverse& inv = inverse_[part.input];
  const size_t dim = tables_[r.table].dim;
  for (size_t i = 0; i < r.n; ++i) {
    if (inv.shard[i] != static_cast<uint32_t>(shard)) continue;
    std::memcpy(r.out + i * dim, rows + size_t{inv.index[i]} * dim,
                dim * sizeof(float));
  }
}

void RowsPlan::ScatterSubset(int shard, size_t p,
                             const std::vector<uint32_t>& subset,
                             const float* rows) {
  const Part& part = parts_[shard][p];
  const RowsInput& r = inputs_[part.input];
  const Inverse& inv = inverse_[part.input];
  const size_t dim = tables_[r.table].dim;
  std::vector<int64_t> at(part.n, -1);  // index in the part -> row of `rows`
  for (size_t j = 0; j < subset.size(); ++j)
    at[subset[j]] = static_cast<int64_t>(j);
  for (size_t i = 0; i < r.n; ++i) {
    if (inv.shard[i] != static_cast<uint32_t>(shard) || at[inv.index[i]] < 0)
      continue;
    std::memcpy(r.out + i * dim,
                rows + static_cast<size_t>(at[inv.index[i]]) * dim,
                dim * sizeof(float));
  }
}

}  // namespace asyncps::worker::internal
