#include "server/internal/layout_record.h"

#include "server/internal/binary_io.h"
#include "server/internal/shard_records.h"

namespace asyncps::server::internal {

namespace {

Status Damaged(const char* part) {
  return Status::Corruption(std::string("layout record is damaged: ") + part);
}

}  // namespace

std::string EncodeLayoutRecord(const Layout& layout) {
  std::string h;
  const LayoutOptions& o = layout.options();
  const bool v2 = o.placement != Placement::kBalanced;
  Put<uint32_t>(&h, v2 ? kLayoutMagicV2 : kLayoutMagic);
  Put<uint32_t>(&h, static_cast<uint32_t>(o.num_shards));  // the cut's
  Put<uint64_t>(&h, o.chunk_elems);
  Put<uint64_t>(&h, o.min_chunk_elems);
  if (v2) Put<uint8_t>(&h, static_cast<uint8_t>(o.placement));
  Put<uint32_t>(&h, static_cast<uint32_t>(layout.tensors().size()));
  for (const TensorSpec& t : layout.tensors()) {
    Put<uint32_t>(&h, static_cast<uint32_t>(t.name.size()));
    h += t.name;
    Put<uint32_t>(&h, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) Put<int64_t>(&h, d);
    Put<uint8_t>(&h, static_cast<uint8_t>(t.init));
    Put<float>(&h, t.init_param);
    Put<uint64_t>(&h, t.seed);
  }
  return h;
}

Status ParseLayoutRecord(std::string_view value,
                         std::vector<TensorSpec>* tensors, LayoutOptions* lo) {
  Reader r(value);
  uint32_t magic = 0, num_shards = 0, nt = 0;
  uint64_t ce = 0, mce = 0;
  uint8_t placement = 0;
  if (!r.Get(&magic) || (magic != kLayoutMagic && magic != kLayoutMagicV2) ||
      !r.Get(&num_shards) || !r.Get(&ce) || !r.Get(&mce) ||
      (magic == kLayoutMagicV2 && !r.Get(&placement)) || !r.Get(&nt)) {
    return Damaged("header");
  }
  if (num_shards < 1 || num_shards > 4096) return Damaged("shard count");
  if (placement > kMaxPlacement) return Damaged("placement");
  // Each tensor takes at least 25 bytes; the first check bounds the vector.
  if (nt > (1u << 24) || nt > r.remaining()) return Damaged("tensor count");
  lo->num_shards = static_cast<int>(num_shards);
  lo->chunk_elems = ce;
  lo->min_chunk_elems = mce;
  lo->placement = static_cast<Placement>(placement);
  tensors->assign(nt, TensorSpec{});
  for (TensorSpec& t : *tensors) {
    uint32_t len = 0, nd = 0;
    uint8_t init = 0;
    if (!r.Get(&len) || len > r.remaining()) return Damaged("name");
    t.name.resize(len);
    if (!r.GetBytes(t.name.data(), len) || !r.Get(&nd) || nd > 8)
      return Damaged("shape");
    t.shape.resize(nd);
    for (int64_t& d : t.shape) {
      if (!r.Get(&d)) return Damaged("shape");
    }
    if (!r.Get(&init) || !r.Get(&t.init_param) || !r.Get(&t.seed) ||
        init > static_cast<uint8_t>(InitKind::kXavierUniform)) {
      return Damaged("initialiser");
    }
    t.init = static_cast<InitKind>(init);
  }
  if (r.remaining() != 0) return Damaged("trailing bytes");
  return Status::OK();
}

}  // namespace asyncps::server::internal
