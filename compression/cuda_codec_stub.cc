// DeviceCodec for builds without CUDA: every device call is Unimplemented.
#include "compression/cuda_codec.h"

namespace asyncps::compression {

struct DeviceCodec::Impl {};

namespace {
Status NoCuda() {
  return Status::Unimplemented("asyncps was built without CUDA");
}
}  // namespace

StatusOr<std::unique_ptr<DeviceCodec>> DeviceCodec::Create(
    const CodecSpec& spec) {
  RETURN_IF_ERROR(spec.Validate());
  return std::unique_ptr<DeviceCodec>(
      new DeviceCodec(spec, std::make_unique<Impl>()));
}

DeviceCodec::DeviceCodec(const CodecSpec& spec, std::unique_ptr<Impl> impl)
    : spec_(spec), impl_(std::move(impl)) {}
DeviceCodec::~DeviceCodec() = default;

bool DeviceCodec::DeviceAvailable() { return false; }

Status DeviceCodec::EncodeDevice(const float*, size_t, uint64_t,
                                 std::vector<uint8_t>*) {
  return NoCuda();
}
Status DeviceCodec::EncodeSparseDevice(const float*, size_t, size_t, uint64_t,
                                       std::vector<uint8_t>*) {
  return NoCuda();
}
Status DeviceCodec::EncodeImpl(const float*, size_t, size_t, uint64_t,
                               std::vector<uint8_t>*) {
  return NoCuda();
}
Status DeviceCodec::DecodeDevice(const uint8_t*, size_t, size_t, float*) {
  return NoCuda();
}
Status DeviceCodec::DecodeAddDevice(const uint8_t*, size_t, size_t, float,
                                    float*) {
  return NoCuda();
}
Status DeviceCodec::DecodeImpl(const uint8_t*, size_t, size_t, float, bool,
                               float*) {
  return NoCuda();
}

}  // namespace asyncps::compression
