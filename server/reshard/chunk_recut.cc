// Chunk records re-cut (server/internal/chunk_recut.h).
#include "server/internal/chunk_recut.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "server/internal/binary_io.h"
#include "server/internal/shard_records.h"

namespace asyncps::server::internal {

namespace {
constexpr size_t kChunkHeaderBytes = 4 + 8 + 4 + 8 + 8 + 4 + 1;
}  // namespace

Status ParseChunkRecord(std::string_view value, uint64_t num_elems,
                        ChunkRecord* out) {
  Reader r(value);
  uint32_t magic = 0;
  uint8_t has_acc = 0;
  if (!r.Get(&magic) || magic != kChunkMagic || !r.Get(&out->n) ||
      !r.Get(&out->state_per_elem) || !r.Get(&out->version) ||
      !r.Get(&out->step) || !r.Get(&out->contributors) || !r.Get(&has_acc)) {
    return Status::Corruption("header");
  }
  if (out->n != num_elems) {
    return Status::Corruption("holds " + std::to_string(out->n) +
                              " elements, the chunk has " +
                              std::to_string(num_elems));
  }
  if (out->state_per_elem > 64 || has_acc > 1)
    return Status::Corruption("header");
  out->has_acc = has_acc == 1;
  const uint64_t want =
      out->n * sizeof(float) * (1 + out->state_per_elem + has_acc);
  if (r.remaining() != want) return Status::Corruption("size");
  out->floats = value.data() + kChunkHeaderBytes;
  return Status::OK();
}

Status RecutChunk(const Layout& from, const ChunkSpec& c,
                  const std::function<const std::string*(uint32_t)>& record,
                  std::string* out, bool* has_record, RecutStats* stats) {
  // The pieces of `from` that overlap c, in offset order, with their records.
  struct Piece {
    const ChunkSpec* spec;
    ChunkRecord rec;
    bool stored;
  };
  std::vector<Piece> pieces;
  const ChunkRecord* first = nullptr;
  for (uint32_t id : from.tensor_chunks(c.tensor)) {
    const ChunkSpec& p = from.chunks()[id];
    if (p.offset + p.num_elems <= c.offset) continue;
    if (p.offset >= c.offset + c.num_elems) break;
    Piece piece{&p, {}, false};
    if (const std::string* v = record(id)) {
      RETURN_IF_ERROR(ParseChunkRecord(*v, p.num_elems, &piece.rec));
      piece.stored = true;
    }
    pieces.push_back(piece);
  }
  *has_record = false;
  for (const Piece& p : pieces) {
    if (p.stored && first == nullptr) first = &p.rec;
  }
  if (first == nullptr) return Status::OK();  // all initial values
  *has_record = true;
  const uint32_t spe = first->state_per_elem;
  const bool has_acc = first->has_acc;
  ChunkRecord merged;
  merged.n = c.num_elems;
  merged.state_per_elem = spe;
  merged.has_acc = has_acc;
  bool steps_differ = false;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const ChunkRecord& r = pieces[k].rec;  // zeros when not stored
    if (pieces[k].stored && (r.state_per_elem != spe || r.has_acc != has_acc)) {
      return Status::FailedPrecondition(
          "chunks " + std::to_string(pieces[0].spec->id) + ".." +
          std::to_string(pieces.back().spec->id) +
          " (old layout) hold optimizer state or BSP sums of different "
          "sizes: written by different server configurations");
    }
    if (k > 0 && r.contributors != pieces[0].rec.contributors && has_acc) {
      return Status::FailedPrecondition(
          "chunks " + std::to_string(pieces[0].spec->id) + " and " +
          std::to_string(pieces[k].spec->id) +
          " were checkpointed in the middle of a BSP round with different "
          "pushes summed: they cannot be merged into one chunk; restore onto "
          "a shard count with the same chunking, or checkpoint at a round "
          "boundary");
    }
    if (k > 0 && r.step != pieces[0].rec.step) steps_differ = true;
    merged.version = std::max(merged.version, r.version);
    merged.step = std::max(merged.step, r.step);
    merged.contributors = r.contributors;
  }
  // Arrays of n floats each: the weights, spe state components, the sums.
  const size_t arrays = 1 + spe + (has_acc ? 1 : 0);
  std::vector<float> dst(c.num_elems * arrays, 0.0f);
  std::vector<float> init;
  for (const Piece& p : pieces) {
    const uint64_t lo = std::max(p.spec->offset, c.offset);
    const uint64_t hi =
        std::min(p.spec->offset + p.spec->num_elems, c.offset + c.num_elems);
    const uint64_t count = hi - lo;
    const uint64_t at_src = lo - p.spec->offset;
    const uint64_t at_dst = lo - c.offset;
    if (!p.stored) {
      // Its initial weights; state and sums are zero.
      init.resize(count);
      InitializeTensorRange(from.tensors()[c.tensor], lo, count, init.data());
      std::memcpy(dst.data() + at_dst, init.data(), count * sizeof(float));
      continue;
    }
    for (size_t a = 0; a < arrays; ++a) {
      std::memcpy(
          dst.data() + a * c.num_elems + at_dst,
          p.rec.floats + (a * p.spec->num_elems + at_src) * sizeof(float),
          count * sizeof(float));
    }
  }
  out->clear();
  Put<uint32_t>(out, kChunkMagic);
  Put<uint64_t>(out, merged.n);
  Put<uint32_t>(out, spe);
  Put<uint64_t>(out, merged.version);
  Put<uint64_t>(out, merged.step);
  Put<uint32_t>(out, merged.contributors);
  Put<uint8_t>(out, has_acc ? 1 : 0);
  out->append(reinterpret_cast<const char*>(dst.data()),
              dst.size() * sizeof(float));
  ++stats->recut_chunks;
  if (steps_differ) ++stats->step_mismatches;
  return Status::OK();
}

}  // namespace asyncps::server::internal
