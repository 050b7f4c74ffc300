// Model layout: named tensors, their chunks, and which shard holds each chunk.
//
// A model is a list of tensors. Each tensor is cut into chunks of at most
// `chunk_elems` floats, and every chunk is assigned to one of `num_shards`
// shards. The assignment is a pure function of (tensors, options), so every
// process computes the same layout without a coordinator.
//
// Balancing: chunks are cut small enough that each shard receives several of
// them, then placed by one of two rules (LayoutOptions::placement), both
// bounding the largest shard by the mean bytes plus one piece (~1.125 x the
// mean; see layout_test.cc), unlike key-range partitioning where every small
// dense tensor lands on server 0:
//   kBalanced: largest first to the least-loaded shard (LPT); every shard
//              holds pieces of the large tensors, wherever they are.
//   kInOrder:  the chunks in registration order, cut into num_shards
//              contiguous ranges of about equal bytes: shard 0 holds the
//              first tensors, the last shard the last ones. With tensors
//              registered in forward order, backward completes the last
//              shards' gradients first, so under BSP their pushes (and
//              rounds) can go while backward still runs (asyncps.overlap).
//
// A Layout is immutable after Create() and safe to share between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace asyncps {

// How a tensor's initial values are drawn. Travels on the wire: never renumber.
enum class InitKind : uint8_t {
  kZeros = 0,
  kConstant = 1,       // every element = param
  kUniform = 2,        // U(-param, param)
  kNormal = 3,         // N(0, param^2)
  kHeNormal = 4,       // N(0, 2 / fan_in), fan_in = shape[0]
  kXavierUniform = 5,  // U(-a, a), a = sqrt(6 / (shape[0] + shape[1]))
};

struct TensorSpec {
  std::string name;            // Unique within the model, 1-255 bytes.
  std::vector<int64_t> shape;  // Row-major; all dims >= 1.
  InitKind init = InitKind::kZeros;
  float init_param = 0.0f;  // See InitKind.
  uint64_t seed = 0;        // Initialiser seed.

  // Product of the dimensions (saturates at INT64_MAX; 0 without any).
  int64_t num_elements() const;
  bool operator==(const TensorSpec& o) const;
  bool operator!=(const TensorSpec& o) const { return !(*this == o); }
};

// How chunks are placed on shards (see above). Travels on the wire and in
// shard checkpoints: never renumber.
enum class Placement : uint8_t {
  kBalanced = 0,
  kInOrder = 1,
};
inline constexpr uint8_t kMaxPlacement =
    static_cast<uint8_t>(Placement::kInOrder);
// "balanced" / "in_order", and back (InvalidArgument naming both).
const char* PlacementName(Placement p);
StatusOr<Placement> ParsePlacement(const std::string& name);

struct LayoutOptions {
  // Largest chunk, in floats. Default: 1 Mi floats (4 MiB), so no single
  // message frame grows past a few MiB.
  size_t chunk_elems = size_t{1} << 20;
  // Smallest chunk a tensor is cut into for balancing, in floats.
  // Default: 4096 (16 KiB); tensors smaller than this stay in one chunk.
  size_t min_chunk_elems = 4096;
  // Number of shards. Default: 1.
  int num_shards = 1;
  // Which shard each chunk goes to. Default: kBalanced (LPT).
  Placement placement = Placement::kBalanced;
};

struct ChunkSpec {
  uint32_t id;         // Global chunk index, 0..num_chunks-1, tensor-major.
  uint32_t tensor;     // Index into tensors().
  uint64_t offset;     // First element within the tensor.
  uint64_t num_elems;  // Length in floats.
  int shard;           // Owning shard.
};

// What a layout would hold, computed from the specs without building it.
struct LayoutSize {
  uint64_t num_tensors = 0;
  uint64_t total_elems = 0;
  uint64_t num_chunks = 0;
  // Bytes of the Layout's own tables (tensor specs, chunk specs, indexes).
  uint64_t table_bytes = 0;
};

class Layout {
 public:
  // Validates the specs (names unique and non-empty, shapes positive, no
  // more than 2^32 chunks) and computes chunks and shard assignment. Nothing
  // sized by the specs is allocated before they are validated.
  static StatusOr<Layout> Create(std::vector<TensorSpec> tensors,
                                 const LayoutOptions& options);
  // Validates as Create() does and returns the layout's size without
  // building it (memory proportional to the number of tensors only), so a
  // server can check a registration against its budget first.
  static StatusOr<LayoutSize> Measure(const std::vector<TensorSpec>& tensors,
                                      const LayoutOptions& options);

  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  const std::vector<ChunkSpec>& chunks() const { return chunks_; }
  // The options the chunks were cut by (options().num_shards is the shard
  // count of the first layout, which fixed the cut; num_shards() is now's).
  const LayoutOptions& options() const { return options_; }
  int num_shards() const { return num_shards_; }
  // Elastic shards (server/elastic/): the same chunks, owned as `owners`
  // says (one shard index per chunk id, each in [0, num_shards)).
  // InvalidArgument when the sizes or an index do not fit.
  StatusOr<Layout> WithOwners(const std::vector<int>& owners,
                              int num_shards) const;
  // The owner of every chunk, by chunk id.
  std::vector<int> Owners() const;

  // Chunks of one tensor, in offset order.
  const std::vector<uint32_t>& tensor_chunks(uint32_t tensor) const {
    return tensor_chunks_[tensor];
  }
  // Chunks held by one shard, in id order.
  const std::vector<uint32_t>& shard_chunks(int shard) const {
    return shard_chunks_[shard];
  }
  // Bytes held by each shard.
  std::vector<uint64_t> ShardBytes() const;
  // Index of the tensor called `name`, or NotFound.
  StatusOr<uint32_t> FindTensor(const std::string& name) const;
  // Total floats in the model.
  uint64_t total_elems() const { return total_elems_; }

 private:
  std::vector<TensorSpec> tensors_;
  std::vector<ChunkSpec> chunks_;
  std::vector<std::vector<uint32_t>> tensor_chunks_;
  std::vector<std::vector<uint32_t>> shard_chunks_;
  LayoutOptions options_;
  int num_shards_ = 1;
  uint64_t total_elems_ = 0;
};

// Fills dst[0..n) with elements [offset, offset+n) of tensor `spec`'s initial
// value. Element i's value depends only on (spec.seed, spec.name, i), so
// chunks initialised separately on different shards equal the whole tensor
// initialised in one process.
void InitializeTensorRange(const TensorSpec& spec, uint64_t offset, uint64_t n,
                           float* dst);

// Fills dst[0..n) with elements [offset, offset+n) of the counter-based
// stream `stream` drawn as `init` says, with `scale` its parameter (the
// constant, the uniform half-width or the normal's standard deviation; He
// and Xavier draw like kNormal and kUniform with the scale the caller
// derived from the shape). Shared by tensors and sparse rows.
void FillInitialValues(InitKind init, float scale, uint64_t stream,
                       uint64_t offset, uint64_t n, float* dst);

}  // namespace asyncps
