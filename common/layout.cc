#include "common/layout.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <queue>
#include <unordered_set>

#include "common/hash.h"

namespace asyncps {

int64_t TensorSpec::num_elements() const {
  if (shape.empty()) return 0;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0) return 0;
    if (n > INT64_MAX / d) return INT64_MAX;
    n *= d;
  }
  return n;
}

bool TensorSpec::operator==(const TensorSpec& o) const {
  return name == o.name && shape == o.shape && init == o.init &&
         (init_param == o.init_param ||
          (std::isnan(init_param) && std::isnan(o.init_param))) &&
         seed == o.seed;
}

namespace {

// Validates the specs and options; fills the total element count.
Status ValidateSpecs(const std::vector<TensorSpec>& tensors,
                     const LayoutOptions& options, uint64_t* total_elems) {
  if (options.num_shards < 1 || options.num_shards > 4096) {
    return Status::InvalidArgument("num_shards must be in [1, 4096], got " +
                                   std::to_string(options.num_shards));
  }
  if (options.chunk_elems < 1)
    return Status::InvalidArgument("chunk_elems must be >= 1");
  if (static_cast<uint8_t>(options.placement) > kMaxPlacement) {
    return Status::InvalidArgument(
        "unknown placement " +
        std::to_string(static_cast<int>(options.placement)));
  }
  if (tensors.empty())
    return Status::InvalidArgument("a layout needs at least one tensor");
  std::unordered_set<std::string> names;
  uint64_t total = 0;
  for (const TensorSpec& t : tensors) {
    if (t.name.empty() || t.name.size() > 255) {
      return Status::InvalidArgument("tensor name must be 1-255 bytes: '" +
                                     t.name + "'");
    }
    if (!names.insert(t.name).second) {
      return Status::InvalidArgument("duplicate tensor name '" + t.name + "'");
    }
    if (t.shape.empty() || t.shape.size() > 8) {
      return Status::InvalidArgument("tensor '" + t.name +
                                     "' needs 1 to 8 dimensions");
    }
    uint64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 1 || d > (int64_t{1} << 40)) {
        return Status::InvalidArgument("tensor '" + t.name +
                                       "' has a dimension out of range");
      }
      n *= static_cast<uint64_t>(d);
      if (n > (uint64_t{1} << 40)) {
        return Status::InvalidArgument("tensor '" + t.name + "' is too large");
      }
    }
    if (!std::isfinite(t.init_param)) {
      return Status::InvalidArgument("tensor '" + t.name +
                                     "' has a non-finite init parameter");
    }
    total += n;  // <= 2^20 tensors (wire limit) x 2^40: no overflow
  }
  *total_elems = total;
  return Status::OK();
}

// Elements per chunk before equal splitting: small enough that each shard
// gets >= 8 pieces of the model, so LPT bounds the largest shard by mean +
// one piece <= 1.125 x mean. One shard needs no balancing: chunks are only
// capped by chunk_elems.
uint64_t PieceElems(uint64_t total, const LayoutOptions& options) {
  const int S = options.num_shards;
  uint64_t target =
      S == 1 ? options.chunk_elems
             : std::max<uint64_t>(1, total / (8 * static_cast<uint64_t>(S)));
  return std::min<uint64_t>(
      options.chunk_elems,
      std::max<uint64_t>(target, std::min<uint64_t>(options.min_chunk_elems,
                                                    options.chunk_elems)));
}

// LPT: largest first (ties by id), each to the least-loaded shard (ties by
// index).
void PlaceLargestFirst(int S, std::vector<ChunkSpec>* chunks) {
  std::vector<uint32_t> order(chunks->size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return (*chunks)[a].num_elems > (*chunks)[b].num_elems;
  });
  // Min-heap of (load, shard): the least-loaded shard, lowest index on ties.
  using Slot = std::pair<uint64_t, int>;
  std::priority_queue<Slot, std::vector<Slot>, std::greater<Slot>> least;
  for (int s = 0; s < S; ++s) least.push({0, s});
  for (uint32_t id : order) {
    Slot best = least.top();
    least.pop();
    (*chunks)[id].shard = best.second;
    least.push({best.first + (*chunks)[id].num_elems, best.second});
  }
}

// In registration order: a chunk goes to the shard whose equal share of the
// model, [s, s + 1) x total / S, holds the chunk's midpoint. A shard's load is
// then its share plus at most half a piece at either end; every shard gets
// at least one chunk when every piece is at most total / S.
void PlaceInOrder(uint64_t total, int S, std::vector<ChunkSpec>* chunks) {
  const auto s64 = static_cast<unsigned __int128>(S);
  uint64_t before = 0;
  for (ChunkSpec& c : *chunks) {
    // 2 x midpoint x S / (2 x total), in 128 bits: total < 2^61.
    const unsigned __int128 mid2 =
        2 * static_cast<unsigned __int128>(before) + c.num_elems;
    const auto s = static_cast<uint64_t>(
        mid2 * s64 / (2 * static_cast<unsigned __int128>(total)));
    c.shard =
        static_cast<int>(std::min<uint64_t>(s, static_cast<uint64_t>(S - 1)));
    before += c.num_elems;
  }
}

}  // namespace

StatusOr<LayoutSize> Layout::Measure(const std::vector<TensorSpec>& tensors,
                                     const LayoutOptions& options) {
  LayoutSize size;
  RETURN_IF_ERROR(ValidateSpecs(tensors, options, &size.total_elems));
  const uint64_t piece = PieceElems(size.total_elems, options);
  size.num_tensors = tensors.size();
  for (const TensorSpec& t : tensors) {
    const uint64_t n = static_cast<uint64_t>(t.num_elements());
    size.num_chunks += (n + piece - 1) / piece;
    size.table_bytes += sizeof(TensorSpec) + t.name.capacity() +
                        t.shape.size() * sizeof(int64_t) +
                        sizeof(std::vector<uint32_t>);
  }
  // chunks_, tensor_chunks_ and shard_chunks_ entries, the LPT order.
  size.table_bytes +=
      size.num_chunks * (sizeof(ChunkSpec) + 3 * sizeof(uint32_t)) +
      static_cast<uint64_t>(options.num_shards) *
          (sizeof(std::vector<uint32_t>) + sizeof(uint64_t));
  return size;
}

StatusOr<Layout> Layout::Create(std::vector<TensorSpec> tensors,
                                const LayoutOptions& options) {
  ASSIGN_OR_RETURN(LayoutSize size, Measure(tensors, options));
  if (size.num_chunks > UINT32_MAX) {
    return Status::InvalidArgument(
        "too many chunks: " + std::to_string(size.num_chunks) +
        " (at most 2^32; raise chunk_elems)");
  }
  const uint64_t total = size.total_elems;
  Layout l;
  l.options_ = options;
  l.tensors_ = std::move(tensors);
  l.total_elems_ = total;
  const int S = options.num_shards;
  const uint64_t piece = PieceElems(total, options);
  l.chunks_.reserve(size.num_chunks);
  l.tensor_chunks_.resize(l.tensors_.size());
  for (uint32_t t = 0; t < l.tensors_.size(); ++t) {
    uint64_t n = static_cast<uint64_t>(l.tensors_[t].num_elements());
    uint64_t pieces = (n + piece - 1) / piece;
    // Equal-sized pieces (differ by at most one element).
    uint64_t base = n / pieces, extra = n % pieces, off = 0;
    for (uint64_t p = 0; p < pieces; ++p) {
      uint64_t len = base + (p < extra ? 1 : 0);
      ChunkSpec c{static_cast<uint32_t>(l.chunks_.size()), t, off, len, 0};
      l.tensor_chunks_[t].push_back(c.id);
      l.chunks_.push_back(c);
      off += len;
    }
  }
  if (options.placement == Placement::kInOrder) {
    PlaceInOrder(total, S, &l.chunks_);
  } else {
    PlaceLargestFirst(S, &l.chunks_);
  }
  l.num_shards_ = S;
  l.shard_chunks_.resize(S);
  for (const ChunkSpec& c : l.chunks_) l.shard_chunks_[c.shard].push_back(c.id);
  return l;
}

const char* PlacementName(Placement p) {
  return p == Placement::kInOrder ? "in_order" : "balanced";
}

StatusOr<Placement> ParsePlacement(const std::string& name) {
  if (name == "balanced") return Placement::kBalanced;
  if (name == "in_order") return Placement::kInOrder;
  return Status::InvalidArgument("unknown placement '" + name +
                                 "' (balanced or in_order)");
}

StatusOr<Layout> Layout::WithOwners(const std::vector<int>& owners,
                                    int num_shards) const {
  if (num_shards < 1 || num_shards > 4096) {
    return Status::InvalidArgument("num_shards " + std::to_string(num_shards) +
                                   " not in [1, 4096]");
  }
  if (owners.size() != chunks_.size()) {
    return Status::InvalidArgument(
        "owners name " + std::to_string(owners.size()) +
        " chunks, the layout has " + std::to_string(chunks_.size()));
  }
  for (size_t i = 0; i < owners.size(); ++i) {
    if (owners[i] < 0 || owners[i] >= num_shards) {
      return Status::InvalidArgument(
          "chunk " + std::to_string(i) + " owned by shard " +
          std::to_string(owners[i]) + ", not in [0, " +
          std::to_string(num_shards) + ")");
    }
  }
  Layout l = *this;
  l.num_shards_ = num_shards;
  l.shard_chunks_.assign(num_shards, {});
  for (ChunkSpec& c : l.chunks_) {
    c.shard = owners[c.id];
    l.shard_chunks_[c.shard].push_back(c.id);
  }
  return l;
}

std::vector<int> Layout::Owners() const {
  std::vector<int> owners(chunks_.size());
  for (const ChunkSpec& c : chunks_) owners[c.id] = c.shard;
  return owners;
}

std::vector<uint64_t> Layout::ShardBytes() const {
  std::vector<uint64_t> bytes(num_shards_, 0);
  for (const ChunkSpec& c : chunks_)
    bytes[c.shard] += c.num_elems * sizeof(float);
  return bytes;
}

StatusOr<uint32_t> Layout::FindTensor(const std::string& name) const {
  for (uint32_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].name == name) return i;
  }
  return Status::NotFound("unknown tensor '" + name + "'");
}

void FillInitialValues(InitKind init, float scale, uint64_t stream,
                       uint64_t offset, uint64_t n, float* dst) {
  switch (init) {
    case InitKind::kZeros:
      std::fill(dst, dst + n, 0.0f);
      return;
    case InitKind::kConstant:
      std::fill(dst, dst + n, scale);
      return;
    case InitKind::kXavierUniform:
    case InitKind::kUniform:
      for (uint64_t i = 0; i < n; ++i) {
        dst[i] =
            (2.0f * UnitFloat(SplitMix64(stream + offset + i)) - 1.0f) * scale;
      }
      return;
    case InitKind::kHeNormal:
    case InitKind::kNormal:
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t r = SplitMix64(stream + offset + i);
        float u1 = UnitFloat(r), u2 = UnitFloat(r << 24);
        dst[i] =
            scale * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
      }
      return;
  }
  std::fill(dst, dst + n, 0.0f);
}

void InitializeTensorRange(const TensorSpec& spec, uint64_t offset, uint64_t n,
                           float* dst) {
  const uint64_t stream = SplitMix64(spec.seed ^ HashName(spec.name));
  float scale = spec.init_param;
  if (spec.init == InitKind::kXavierUniform) {
    scale = std::sqrt(
        6.0f / static_cast<float>(spec.shape[0] +
                                  (spec.shape.size() > 1 ? spec.shape[1] : 1)));
  } else if (spec.init == InitKind::kHeNormal) {
    scale = std::sqrt(2.0f / static_cast<float>(spec.shape[0]));
  }
  FillInitialValues(spec.init, scale, stream, offset, n, dst);
}

}  // namespace asyncps
