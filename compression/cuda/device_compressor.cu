// DeviceCompressor: DeviceCodec plus two kernels, the error-feedback /
// momentum accumulation and DGC's momentum masking. Both are written with
// explicit round-to-nearest operations (and the module builds with
// --fmad=false), so they round exactly as Compressor's loops (built with
// -ffp-contract=off).
//
// Streams: the accumulation and masking run on this object's stream, the
// codec on the DeviceCodec's; every step synchronises before the next, so
// the two never overlap.
#include <cuda_runtime.h>

#include <chrono>
#include <limits>

#include "compression/cuda/cuda_util.h"
#include "compression/cuda_codec.h"
#include "compression/device_compressor.h"
#include "compression/internal/codecs.h"

namespace asyncps::compression {
namespace {

using internal::Blocks;
using internal::CudaStatus;
using internal::DeviceBuffer;
using internal::kThreads;

// ef: v += g; with momentum m: u = m*u + g; v += u.
__global__ void AccumulateKernel(const float* g, uint64_t n, float m,
                                 bool momentum, float* u, float* v) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x) {
    if (momentum) {
      const float ui = __fadd_rn(__fmul_rn(m, u[i]), g[i]);
      u[i] = ui;
      v[i] = __fadd_rn(v[i], ui);
    } else {
      v[i] = __fadd_rn(v[i], g[i]);
    }
  }
}

// Momentum factor masking: u[i] = 0 for each transmitted index (topk: the
// payload's indices; randomk: regenerated from the key).
__global__ void MaskKernel(const uint32_t* idx, uint64_t n, uint64_t k,
                           uint32_t key, float* u) {
  for (uint64_t j = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; j < k;
       j += uint64_t(gridDim.x) * blockDim.x) {
    const uint64_t i =
        idx != nullptr ? idx[j] : internal::RandomKIndex(key, j, n, k);
    u[i] = 0.0f;
  }
}

}  // namespace

struct DeviceCompressor::Impl {
  std::unique_ptr<DeviceCodec> codec;
  cudaStream_t stream = nullptr;
  DeviceBuffer residual, momentum, indices;
  std::vector<size_t> offset;  // per chunk, in floats, into residual/momentum
  ~Impl() {
    if (stream) cudaStreamDestroy(stream);
  }
  Status Sync() { return CudaStatus(cudaStreamSynchronize(stream), "sync"); }
  Status ToHost(const float* d, size_t n, float* h) {
    if (n == 0) return Status::OK();
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(h, d, 4 * n, cudaMemcpyDeviceToHost, stream));
    return Sync();
  }
};

StatusOr<std::unique_ptr<DeviceCompressor>> DeviceCompressor::Create(
    const CompressorOptions& options, const std::vector<size_t>& chunk_sizes) {
  const CodecSpec& s = options.spec;
  RETURN_IF_ERROR(s.Validate());
  for (size_t n : chunk_sizes) {
    if (n > std::numeric_limits<uint32_t>::max()) {
      return Status::InvalidArgument("chunk larger than 2^32-1 elements");
    }
  }
  if (!DeviceCodec::DeviceAvailable()) {
    return Status::Unavailable("no CUDA device visible");
  }
  auto impl = std::make_unique<Impl>();
  ASSIGN_OR_RETURN(impl->codec, DeviceCodec::Create(s));
  CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  size_t total = 0;
  for (size_t n : chunk_sizes) {
    impl->offset.push_back(total);
    if (n >= s.min_elems) total += n;
  }
  if (total > 0 && s.error_feedback) {
    RETURN_IF_ERROR(impl->residual.Reserve(4 * total));
    CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(impl->residual.as<void>(), 0, 4 * total, impl->stream));
  }
  if (total > 0 && s.momentum > 0.0f) {
    RETURN_IF_ERROR(impl->momentum.Reserve(4 * total));
    CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(impl->momentum.as<void>(), 0, 4 * total, impl->stream));
  }
  RETURN_IF_ERROR(impl->Sync());
  return std::unique_ptr<DeviceCompressor>(
      new DeviceCompressor(options, chunk_sizes, std::move(impl)));
}

DeviceCompressor::DeviceCompressor(const CompressorOptions& options,
                                   std::vector<size_t> sizes,
                                   std::unique_ptr<Impl> impl)
    : options_(options), sizes_(std::move(sizes)), impl_(std::move(impl)) {}
DeviceCompressor::~DeviceCompressor() = default;

double DeviceCompressor::RatioAt(double epoch) const {
  return internal::WarmupRatio(options_.spec, epoch);
}

StatusOr<CodecId> DeviceCompressor::Compress(size_t chunk, const float* d_g,
                                             double epoch, uint64_t step,
                                             std::vector<uint8_t>* out) {
  if (chunk >= sizes_.size()) {
    return Status::InvalidArgument("chunk index out of range");
  }
  if (d_g == nullptr || out == nullptr) {
    return Status::InvalidArgument("null gradient or output");
  }
  const auto start = std::chrono::steady_clock::now();
  const size_t n = sizes_[chunk];
  const CodecSpec& s = options_.spec;
  const uint64_t seed = internal::ChunkSeed(options_.seed, chunk, step);
  Impl& im = *impl_;
  CodecId used = s.id;
  if (n < s.min_elems) {
    used = CodecId::kNone;
    ASSIGN_OR_RETURN(uint8_t * body,
                     internal::BeginPayload(CodecId::kNone, d_g, n, 0, 0, seed,
                                            4ull * n, out));
    RETURN_IF_ERROR(im.ToHost(d_g, n, reinterpret_cast<float*>(body)));
  } else {
    const float* x = d_g;
    float* v = nullptr;
    float* u = nullptr;
    if (s.error_feedback) {
      v = im.residual.as<float>() + im.offset[chunk];
      if (s.momentum > 0.0f) u = im.momentum.as<float>() + im.offset[chunk];
      if (n > 0) {
        AccumulateKernel<<<Blocks(n), kThreads, 0, im.stream>>>(
            d_g, n, s.momentum, u != nullptr, u, v);
        CUDA_RETURN_IF_ERROR(cudaGetLastError());
        RETURN_IF_ERROR(im.Sync());
      }
      x = v;
    }
    if (internal::IsSparseId(s.id) && s.warmup_epochs > 0.0) {
      const size_t k = internal::KForRatio(RatioAt(epoch), n);
      RETURN_IF_ERROR(im.codec->EncodeSparseDevice(x, n, k, seed, out));
    } else {
      RETURN_IF_ERROR(im.codec->EncodeDevice(x, n, seed, out));
    }
    if (v != nullptr) {
      // residual = acc - decode(payload).
      RETURN_IF_ERROR(
          im.codec->DecodeAddDevice(out->data(), out->size(), n, -1.0f, v));
    }
    if (u != nullptr) {
      internal::SparseLayout l;
      RETURN_IF_ERROR(internal::CheckSparse(out->data(), out->size(), n, &l));
      const uint32_t* d_idx = nullptr;
      if (l.indices != nullptr && l.k > 0) {
        RETURN_IF_ERROR(im.indices.Reserve(4 * l.k));
        CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(im.indices.as<void>(), l.indices,
                                             4 * l.k, cudaMemcpyHostToDevice,
                                             im.stream));
        d_idx = im.indices.as<uint32_t>();
      }
      if (l.k > 0) {
        MaskKernel<<<Blocks(l.k), kThreads, 0, im.stream>>>(d_idx, n, l.k,
                                                            l.key, u);
        CUDA_RETURN_IF_ERROR(cudaGetLastError());
      }
      RETURN_IF_ERROR(im.Sync());
    }
  }
  stats_.raw_bytes += 4ull * n;
  stats_.wire_bytes += out->size();
  stats_.chunks += 1;
  stats_.encode_ns += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now() - start)
          .count());
  return used;
}

Status DeviceCompressor::CopyToHost(const float* d_src, size_t n,
                                    float* host_dst) {
  if (n > 0 && (d_src == nullptr || host_dst == nullptr)) {
    return Status::InvalidArgument("null source or destination");
  }
  return impl_->ToHost(d_src, n, host_dst);
}

Status DeviceCompressor::ResidualToHost(size_t chunk,
                                        std::vector<float>* out) const {
  if (chunk >= sizes_.size() || out == nullptr) {
    return Status::InvalidArgument("bad chunk or null output");
  }
  out->clear();
  const size_t n = sizes_[chunk];
  if (!options_.spec.error_feedback || n < options_.spec.min_elems) {
    return Status::OK();
  }
  out->resize(n);
  return impl_->ToHost(impl_->residual.as<float>() + impl_->offset[chunk], n,
                       out->data());
}

Status DeviceCompressor::MomentumToHost(size_t chunk,
                                        std::vector<float>* out) const {
  if (chunk >= sizes_.size() || out == nullptr) {
    return Status::InvalidArgument("bad chunk or null output");
  }
  out->clear();
  const size_t n = sizes_[chunk];
  if (!(options_.spec.momentum > 0.0f) || n < options_.spec.min_elems) {
    return Status::OK();
  }
  out->resize(n);
  return impl_->ToHost(impl_->momentum.as<float>() + impl_->offset[chunk], n,
                       out->data());
}

}  // namespace asyncps::compression
