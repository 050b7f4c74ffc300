// libFuzzer target: every codec's Validate + DecodeAdd (CodecForId).
// Input: byte 0 = codec id (mod kNumCodecs), bytes 1-2 = element count n
// (little endian, 1..65536), the rest = the payload. Validate must agree with
// DecodeAdd (an accepted payload decodes; a rejected one leaves dst
// untouched), and nothing may crash or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "compression/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  using asyncps::compression::CodecForId;
  using asyncps::compression::CodecId;
  const auto id =
      static_cast<CodecId>(data[0] % asyncps::compression::kNumCodecs);
  const size_t n = 1 + (static_cast<size_t>(data[1]) | (size_t{data[2]} << 8));
  const uint8_t* p = data + 3;
  const size_t bytes = size - 3;
  const auto& codec = CodecForId(id);
  std::vector<float> dst(n, 1.0f);
  const bool valid = codec.Validate(p, bytes, n).ok();
  const bool added = codec.DecodeAdd(p, bytes, n, 0.5f, dst.data()).ok();
  if (valid != added) std::abort();
  if (!added) {
    for (float x : dst)
      if (x != 1.0f) std::abort();  // a rejected payload touched dst
  }
  (void)asyncps::compression::DecodeAddAny(p, bytes, n, 1.0f, dst.data());
  return 0;
}
