// DeviceCompressor for builds without CUDA: Create is Unavailable, so no
// object (and none of the other methods) is ever reachable.
#include "compression/device_compressor.h"
#include "compression/internal/codecs.h"

namespace asyncps::compression {

struct DeviceCompressor::Impl {};

namespace {
Status NoCuda() {
  return Status::Unavailable("asyncps was built without CUDA");
}
}  // namespace

StatusOr<std::unique_ptr<DeviceCompressor>> DeviceCompressor::Create(
    const CompressorOptions& options, const std::vector<size_t>&) {
  RETURN_IF_ERROR(options.spec.Validate());
  return NoCuda();
}

DeviceCompressor::DeviceCompressor(const CompressorOptions& options,
                                   std::vector<size_t> sizes,
                                   std::unique_ptr<Impl> impl)
    : options_(options), sizes_(std::move(sizes)), impl_(std::move(impl)) {}
DeviceCompressor::~DeviceCompressor() = default;

double DeviceCompressor::RatioAt(double epoch) const {
  return internal::WarmupRatio(options_.spec, epoch);
}

StatusOr<CodecId> DeviceCompressor::Compress(size_t, const float*, double,
                                             uint64_t, std::vector<uint8_t>*) {
  return NoCuda();
}
Status DeviceCompressor::CopyToHost(const float*, size_t, float*) {
  return NoCuda();
}
Status DeviceCompressor::ResidualToHost(size_t, std::vector<float>*) const {
  return NoCuda();
}
Status DeviceCompressor::MomentumToHost(size_t, std::vector<float>*) const {
  return NoCuda();
}

}  // namespace asyncps::compression
