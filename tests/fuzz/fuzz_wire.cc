// libFuzzer target: the wire decoders. The first byte picks DecodeRequest or
// DecodeReply; the rest is the header frame. Decoding must never crash, read
// out of bounds or throw, whatever the bytes.
#include <cstddef>
#include <cstdint>

#include "common/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  asyncps::DecodeLimits limits;
  limits.max_list_entries = 1 << 16;
  if (data[0] & 1) {
    asyncps::RequestHeader h;
    (void)asyncps::DecodeRequest(data + 1, size - 1, limits, &h);
  } else {
    asyncps::ReplyHeader h;
    (void)asyncps::DecodeReply(data + 1, size - 1, limits, &h);
  }
  return 0;
}
