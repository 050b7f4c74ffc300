// DeviceCodec with CUDA kernels. Kernels use the bit-exact primitives of
// compression/internal/format.h and are compiled with --fmad=false, so every
// deterministic or counter-RNG codec yields the CPU's bytes. Top-k sorts
// (magnitude bits, index) pairs with CUB's stable radix sort: ties keep the
// lower index first, as on the CPU.
//
// CUDA errors are turned into Status only in CudaStatus() (cuda_util.h).
#include <cuda_runtime.h>

#include <cstring>
#include <cub/device/device_radix_sort.cuh>
#include <limits>

#include "compression/cuda/cuda_util.h"
#include "compression/cuda_codec.h"
#include "compression/internal/codecs.h"

namespace asyncps::compression {
namespace {

using internal::Blocks;
using internal::CudaStatus;
using internal::DeviceBuffer;
using internal::Header;
using internal::kThreads;

__device__ __forceinline__ uint32_t MagBitsD(float f) {
  return __float_as_uint(f) & 0x7fffffffu;
}

// ---- encoders ------------------------------------------------------------

template <bool kBf16>
__global__ void HalfEncodeKernel(const float* x, uint64_t n, uint16_t* o) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x) {
    o[i] = kBf16 ? internal::FloatToBf16(x[i]) : internal::FloatToHalf(x[i]);
  }
}

// Block-wide max of magnitude bits over [lo, hi).
__device__ uint32_t BlockMaxBits(const float* x, uint64_t lo, uint64_t hi) {
  __shared__ unsigned int smax;
  if (threadIdx.x == 0) smax = 0;
  __syncthreads();
  uint32_t m = 0;
  for (uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    m = max(m, MagBitsD(x[i]));
  }
  atomicMax(&smax, m);
  __syncthreads();
  const uint32_t r = smax;
  __syncthreads();
  return r;
}

// Sum of f(x) over the 8 lanes of format.h, same order as the CPU.
template <bool kSquare>
__device__ float BlockLaneSum(const float* x, uint64_t lo, uint64_t hi) {
  __shared__ float lanes[8];
  __shared__ float total;
  if (threadIdx.x < 8) {
    float l = 0.0f;
    for (uint64_t i = lo + threadIdx.x; i < hi; i += 8) {
      const float v = x[i];
      l = __fadd_rn(l, kSquare ? __fmul_rn(v, v) : fabsf(v));
    }
    lanes[threadIdx.x] = l;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
            ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  }
  __syncthreads();
  const float r = total;
  __syncthreads();
  return r;
}

__global__ void Int8EncodeKernel(const float* x, uint64_t n, uint32_t bucket,
                                 float* scales, int8_t* q, int* bad) {
  const uint64_t b = blockIdx.x;
  const uint64_t lo = b * bucket, hi = min(n, lo + bucket);
  const uint32_t mb = BlockMaxBits(x, lo, hi);
  if (mb >= 0x7f800000u) {
    if (threadIdx.x == 0) *bad = 1;
    return;
  }
  const float m = __uint_as_float(mb);
  const float inv = m > 0.0f ? 127.0f / m : 0.0f;
  if (threadIdx.x == 0) scales[b] = m / 127.0f;
  for (uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    q[i] = static_cast<int8_t>(
        static_cast<int32_t>(internal::RoundNearestEven(x[i] * inv)));
  }
}

__device__ __forceinline__ int32_t QsgdLevel(float xv, uint32_t i, uint32_t key,
                                             float inv, int32_t smax) {
  const float r = fabsf(xv) * inv;
  const float u = internal::Uniform(key, i);
  int32_t l = static_cast<int32_t>(r + u);
  l = l < smax ? l : smax;
  return xv < 0.0f ? -l : l;
}

__global__ void QsgdEncodeKernel(const float* x, uint64_t n, uint32_t bucket,
                                 uint32_t levels, uint32_t key, float* norms,
                                 uint8_t* packed, int* bad) {
  const uint64_t b = blockIdx.x;
  const uint64_t lo = b * bucket, hi = min(n, lo + bucket);
  const float norm = sqrtf(BlockLaneSum<true>(x, lo, hi));
  if (!(norm <= 3.402823466e+38f)) {
    if (threadIdx.x == 0) *bad = 1;
    return;
  }
  if (threadIdx.x == 0) norms[b] = norm;
  const float s = static_cast<float>(levels);
  const float inv = norm > 0.0f ? s / norm : 0.0f;
  const int32_t smax = static_cast<int32_t>(levels);
  if (levels > 7) {
    for (uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      packed[i] = static_cast<uint8_t>(
          QsgdLevel(x[i], static_cast<uint32_t>(i), key, inv, smax));
    }
    return;
  }
  // lo is even: one byte per pair; an odd tail keeps its high nibble 0.
  for (uint64_t i = lo + 2 * threadIdx.x; i < hi; i += 2 * blockDim.x) {
    const uint32_t q0 = static_cast<uint8_t>(
        QsgdLevel(x[i], static_cast<uint32_t>(i), key, inv, smax));
    uint32_t q1 = 0;
    if (i + 1 < hi) {
      q1 = static_cast<uint8_t>(
          QsgdLevel(x[i + 1], static_cast<uint32_t>(i + 1), key, inv, smax));
    }
    packed[i / 2] = static_cast<uint8_t>((q0 & 15u) | ((q1 & 15u) << 4));
  }
}

__global__ void TernEncodeKernel(const float* x, uint64_t n, uint32_t bucket,
                                 uint32_t key, float* scales, uint8_t* packed,
                                 int* bad) {
  const uint64_t b = blockIdx.x;
  const uint64_t lo = b * bucket, hi = min(n, lo + bucket);
  const uint32_t mb = BlockMaxBits(x, lo, hi);
  if (mb >= 0x7f800000u) {
    if (threadIdx.x == 0) *bad = 1;
    return;
  }
  const float m = __uint_as_float(mb);
  if (threadIdx.x == 0) scales[b] = m;
  const float inv = m > 0.0f ? 1.0f / m : 0.0f;
  for (uint64_t g = lo + 4 * threadIdx.x; g < hi; g += 4 * blockDim.x) {
    uint32_t byte = 0;
    for (uint64_t i = g; i < min(hi, g + 4); ++i) {
      const float u = internal::Uniform(key, static_cast<uint32_t>(i));
      const uint32_t nz = u < fabsf(x[i]) * inv ? 1u : 0u;
      const uint32_t neg = x[i] < 0.0f ? 2u : 0u;
      byte |= (nz | (neg & (nz << 1))) << (2 * (i - g));
    }
    packed[g / 4] = static_cast<uint8_t>(byte);
  }
}

__global__ void SignEncodeKernel(const float* x, uint64_t n, uint32_t bucket,
                                 float* scales, uint8_t* packed, int* bad) {
  const uint64_t b = blockIdx.x;
  const uint64_t lo = b * bucket, hi = min(n, lo + bucket);
  const float sum = BlockLaneSum<false>(x, lo, hi);
  if (!(sum <= 3.402823466e+38f)) {
    if (threadIdx.x == 0) *bad = 1;
    return;
  }
  if (threadIdx.x == 0) scales[b] = sum / static_cast<float>(hi - lo);
  for (uint64_t g = lo + 8 * threadIdx.x; g < hi; g += 8 * blockDim.x) {
    uint32_t byte = 0;
    for (uint64_t i = g; i < min(hi, g + 8); ++i) {
      byte |= (x[i] < 0.0f ? 1u : 0u) << (i - g);
    }
    packed[g / 8] = static_cast<uint8_t>(byte);
  }
}

__global__ void RandomKEncodeKernel(const float* x, uint64_t n, uint64_t k,
                                    uint32_t key, float* vals, int* bad) {
  for (uint64_t j = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; j < k;
       j += uint64_t(gridDim.x) * blockDim.x) {
    const float v = x[internal::RandomKIndex(key, j, n, k)];
    if (MagBitsD(v) >= 0x7f800000u) *bad = 1;
    vals[j] = v;
  }
}

__global__ void TopKKeysKernel(const float* x, uint64_t n, uint32_t* keys,
                               uint32_t* idx, int* bad) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x) {
    const uint32_t m = MagBitsD(x[i]);
    if (m >= 0x7f800000u) *bad = 1;
    keys[i] = m;
    idx[i] = static_cast<uint32_t>(i);
  }
}

__global__ void TopKGatherKernel(const float* x, const uint32_t* sorted_idx,
                                 uint64_t k, uint32_t* out_idx,
                                 float* out_val) {
  for (uint64_t j = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; j < k;
       j += uint64_t(gridDim.x) * blockDim.x) {
    const uint32_t i = sorted_idx[j];
    out_idx[j] = i;
    out_val[j] = x[i];
  }
}

// ---- decoders (payload validated on the host) ----------------------------

__device__ __forceinline__ void PutD(float* d, float v, float alpha, bool add) {
  if (add) {
    *d = __fadd_rn(*d, __fmul_rn(alpha, v));
  } else {
    *d = v;
  }
}

// One kernel for the dense codecs: element i's value from the body.
__global__ void DenseDecodeKernel(uint8_t codec, const uint8_t* body,
                                  uint64_t n, uint32_t bucket, uint32_t levels,
                                  float alpha, bool add, float* dst) {
  const uint64_t nb = bucket ? (n + bucket - 1) / bucket : 0;
  const float* scales = reinterpret_cast<const float*>(body);
  const uint8_t* packed = body + 4 * nb;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x) {
    float v = 0.0f;
    switch (static_cast<CodecId>(codec)) {
      case CodecId::kNone:
        v = reinterpret_cast<const float*>(body)[i];
        break;
      case CodecId::kFp16:
        v = internal::HalfToFloat(reinterpret_cast<const uint16_t*>(body)[i]);
        break;
      case CodecId::kBf16:
        v = internal::Bf16ToFloat(reinterpret_cast<const uint16_t*>(body)[i]);
        break;
      case CodecId::kInt8:
        v = static_cast<float>(reinterpret_cast<const int8_t*>(packed)[i]) *
            scales[i / bucket];
        break;
      case CodecId::kQsgd: {
        int32_t l;
        if (levels > 7) {
          l = reinterpret_cast<const int8_t*>(packed)[i];
        } else {
          const uint32_t nib = (packed[i / 2] >> (4 * (i % 2))) & 15u;
          l = static_cast<int32_t>(nib << 28) >> 28;
        }
        v = static_cast<float>(l) *
            (scales[i / bucket] / static_cast<float>(levels));
        break;
      }
      case CodecId::kTernGrad: {
        const uint32_t c = (packed[i / 4] >> (2 * (i % 4))) & 3u;
        const float t = (c & 1u) ? ((c & 2u) ? -1.0f : 1.0f) : 0.0f;
        v = t * scales[i / bucket];
        break;
      }
      case CodecId::kSign: {
        const float t = ((packed[i / 8] >> (i % 8)) & 1u) ? -1.0f : 1.0f;
        v = t * scales[i / bucket];
        break;
      }
      default:
        break;
    }
    PutD(dst + i, v, alpha, add);
  }
}

__global__ void SparseDecodeKernel(const uint8_t* body, bool topk, uint64_t n,
                                   uint64_t k, uint32_t key, float alpha,
                                   bool add, float* dst) {
  const uint32_t* idx = reinterpret_cast<const uint32_t*>(body);
  const float* val = reinterpret_cast<const float*>(body + (topk ? 4 * k : 0));
  for (uint64_t j = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; j < k;
       j += uint64_t(gridDim.x) * blockDim.x) {
    const uint32_t i = topk ? idx[j] : internal::RandomKIndex(key, j, n, k);
    PutD(dst + i, val[j], alpha, add);  // indices are distinct
  }
}

}  // namespace

struct DeviceCodec::Impl {
  cudaStream_t stream = nullptr;
  DeviceBuffer body, flag, keys, keys_out, idx, idx_out, cub_temp;
  ~Impl() {
    if (stream) cudaStreamDestroy(stream);
  }
  Status Sync() { return CudaStatus(cudaStreamSynchronize(stream), "sync"); }
  // Top-k of d_x[0, n): the keys of every element (non-finite ones flag
  // *bad), sorted descending, and the k largest gathered into d_body
  // (k indices ascending, then their k values). Queued on `stream`.
  Status EncodeTopK(const float* d_x, size_t n, uint64_t k, int* bad,
                    uint8_t* d_body) {
    cudaStream_t st = stream;
    RETURN_IF_ERROR(keys.Reserve(4 * n));
    RETURN_IF_ERROR(keys_out.Reserve(4 * n));
    RETURN_IF_ERROR(idx.Reserve(4 * n));
    RETURN_IF_ERROR(idx_out.Reserve(4 * n));
    TopKKeysKernel<<<Blocks(n), kThreads, 0, st>>>(d_x, n, keys.as<uint32_t>(),
                                                   idx.as<uint32_t>(), bad);
    if (k == 0) return Status::OK();
    size_t temp = 0, temp2 = 0;
    CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairsDescending(
        nullptr, temp, keys.as<uint32_t>(), keys_out.as<uint32_t>(),
        idx.as<uint32_t>(), idx_out.as<uint32_t>(), static_cast<int64_t>(n), 0,
        31, st));
    CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortKeys(
        nullptr, temp2, idx_out.as<uint32_t>(), idx.as<uint32_t>(),
        static_cast<int64_t>(k), 0, 32, st));
    RETURN_IF_ERROR(cub_temp.Reserve(std::max(temp, temp2)));
    CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairsDescending(
        cub_temp.as<void>(), temp, keys.as<uint32_t>(), keys_out.as<uint32_t>(),
        idx.as<uint32_t>(), idx_out.as<uint32_t>(), static_cast<int64_t>(n), 0,
        31, st));
    // The first k are the k largest (ties: lower index first, the sort is
    // stable); sort those indices ascending.
    CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortKeys(
        cub_temp.as<void>(), temp2, idx_out.as<uint32_t>(), idx.as<uint32_t>(),
        static_cast<int64_t>(k), 0, 32, st));
    TopKGatherKernel<<<Blocks(k), kThreads, 0, st>>>(
        d_x, idx.as<uint32_t>(), k, body.as<uint32_t>(),
        reinterpret_cast<float*>(d_body + 4 * k));
    return Status::OK();
  }
};

StatusOr<std::unique_ptr<DeviceCodec>> DeviceCodec::Create(
    const CodecSpec& spec) {
  RETURN_IF_ERROR(spec.Validate());
  auto impl = std::make_unique<Impl>();
  int count = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (count == 0) return Status::Unavailable("no CUDA device");
  CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  RETURN_IF_ERROR(impl->flag.Reserve(sizeof(int)));
  return std::unique_ptr<DeviceCodec>(new DeviceCodec(spec, std::move(impl)));
}

DeviceCodec::DeviceCodec(const CodecSpec& spec, std::unique_ptr<Impl> impl)
    : spec_(spec), impl_(std::move(impl)) {}
DeviceCodec::~DeviceCodec() = default;

bool DeviceCodec::DeviceAvailable() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

Status DeviceCodec::EncodeDevice(const float* d_x, size_t n, uint64_t seed,
                                 std::vector<uint8_t>* host_out) {
  return EncodeImpl(d_x, n, std::numeric_limits<size_t>::max(), seed, host_out);
}

Status DeviceCodec::EncodeSparseDevice(const float* d_x, size_t n, size_t k,
                                       uint64_t seed,
                                       std::vector<uint8_t>* host_out) {
  if (!internal::IsSparseId(spec_.id)) {
    return Status::InvalidArgument("explicit k needs topk or randomk");
  }
  if (k > n) return Status::InvalidArgument("k exceeds the element count");
  return EncodeImpl(d_x, n, k, seed, host_out);
}

Status DeviceCodec::EncodeImpl(const float* d_x, size_t n, size_t k_override,
                               uint64_t seed, std::vector<uint8_t>* host_out) {
  if (host_out == nullptr) return Status::InvalidArgument("null output");
  if (d_x == nullptr && n > 0) return Status::InvalidArgument("null input");
  if (n > std::numeric_limits<uint32_t>::max()) {
    return Status::InvalidArgument("element count exceeds 2^32-1");
  }
  Impl& im = *impl_;
  cudaStream_t st = im.stream;
  const CodecId id = spec_.id;
  const uint32_t bucket = static_cast<uint32_t>(spec_.bucket);
  const uint64_t nb = internal::NumBuckets(n, bucket);
  const uint32_t key = internal::SeedKey(seed);
  uint32_t p1 = 0, p2 = 0;
  uint64_t body = 0;
  uint64_t k = 0;
  switch (id) {
    case CodecId::kNone:
      body = 4ull * n;
      break;
    case CodecId::kFp16:
    case CodecId::kBf16:
      body = 2ull * n;
      break;
    case CodecId::kInt8:
      p1 = bucket;
      body = 4 * nb + n;
      break;
    case CodecId::kQsgd:
      p1 = bucket;
      p2 = static_cast<uint32_t>(spec_.levels);
      body = 4 * nb + internal::PackedBytes(n, internal::QsgdBits(p2));
      break;
    case CodecId::kTernGrad:
      p1 = bucket;
      body = 4 * nb + internal::PackedBytes(n, 2);
      break;
    case CodecId::kSign:
      p1 = bucket;
      body = 4 * nb + internal::PackedBytes(n, 1);
      break;
    case CodecId::kTopK:
      k = k_override != std::numeric_limits<size_t>::max()
              ? k_override
              : internal::KForRatio(spec_.ratio, n);
      p1 = static_cast<uint32_t>(k);
      body = 8 * k;
      break;
    case CodecId::kRandomK:
      k = k_override != std::numeric_limits<size_t>::max()
              ? k_override
              : internal::KForRatio(spec_.ratio, n);
      p1 = static_cast<uint32_t>(k);
      body = 4 * k;
      break;
  }
  host_out->resize(kPayloadHeaderBytes + body);
  Header h;
  h.codec = static_cast<uint8_t>(id);
  h.n = static_cast<uint32_t>(n);
  h.p1 = p1;
  h.p2 = p2;
  h.seed = seed;
  internal::WriteHeader(h, host_out->data());
  if (n == 0) return Status::OK();
  if (id == CodecId::kNone) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_out->data() + kPayloadHeaderBytes,
                                         d_x, body, cudaMemcpyDeviceToHost,
                                         st));
    return im.Sync();
  }
  RETURN_IF_ERROR(im.body.Reserve(body + 16));
  int* bad = im.flag.as<int>();
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(bad, 0, sizeof(int), st));
  uint8_t* d_body = im.body.as<uint8_t>();
  float* scales = im.body.as<float>();
  const unsigned grid = Blocks(n);
  switch (id) {
    case CodecId::kFp16:
      HalfEncodeKernel<false>
          <<<grid, kThreads, 0, st>>>(d_x, n, im.body.as<uint16_t>());
      break;
    case CodecId::kBf16:
      HalfEncodeKernel<true>
          <<<grid, kThreads, 0, st>>>(d_x, n, im.body.as<uint16_t>());
      break;
    case CodecId::kInt8:
      Int8EncodeKernel<<<static_cast<unsigned>(nb), kThreads, 0, st>>>(
          d_x, n, bucket, scales, reinterpret_cast<int8_t*>(d_body + 4 * nb),
          bad);
      break;
    case CodecId::kQsgd:
      QsgdEncodeKernel<<<static_cast<unsigned>(nb), kThreads, 0, st>>>(
          d_x, n, bucket, p2, key, scales, d_body + 4 * nb, bad);
      break;
    case CodecId::kTernGrad:
      TernEncodeKernel<<<static_cast<unsigned>(nb), kThreads, 0, st>>>(
          d_x, n, bucket, key, scales, d_body + 4 * nb, bad);
      break;
    case CodecId::kSign:
      SignEncodeKernel<<<static_cast<unsigned>(nb), kThreads, 0, st>>>(
          d_x, n, bucket, scales, d_body + 4 * nb, bad);
      break;
    case CodecId::kRandomK:
      if (k > 0) {
        RandomKEncodeKernel<<<Blocks(k), kThreads, 0, st>>>(d_x, n, k, key,
                                                            scales, bad);
      }
      break;
    case CodecId::kTopK:
      RETURN_IF_ERROR(im.EncodeTopK(d_x, n, k, bad, d_body));
      break;
    case CodecId::kNone:
      break;
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  int host_bad = 0;
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&host_bad, bad, sizeof(int), cudaMemcpyDeviceToHost, st));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_out->data() + kPayloadHeaderBytes,
                                       d_body, body, cudaMemcpyDeviceToHost,
                                       st));
  RETURN_IF_ERROR(im.Sync());
  if (host_bad) {
    host_out->clear();
    return Status::InvalidArgument("non-finite value in gradient");
  }
  return Status::OK();
}

Status DeviceCodec::DecodeDevice(const uint8_t* payload, size_t bytes, size_t n,
                                 float* d_dst) {
  return DecodeImpl(payload, bytes, n, 1.0f, false, d_dst);
}

Status DeviceCodec::DecodeAddDevice(const uint8_t* payload, size_t bytes,
                                    size_t n, float alpha, float* d_dst) {
  return DecodeImpl(payload, bytes, n, alpha, true, d_dst);
}

Status DeviceCodec::DecodeImpl(const uint8_t* payload, size_t bytes, size_t n,
                               float alpha, bool add, float* d_dst) {
  ASSIGN_OR_RETURN(CodecId id, PeekCodecId(payload, bytes));
  RETURN_IF_ERROR(CodecForId(id).Validate(payload, bytes, n));
  if (d_dst == nullptr && n > 0) return Status::InvalidArgument("null dst");
  if (n == 0) return Status::OK();
  Impl& im = *impl_;
  cudaStream_t st = im.stream;
  const Header h = internal::ReadHeader(payload);
  const size_t body = bytes - kPayloadHeaderBytes;
  RETURN_IF_ERROR(im.body.Reserve(body + 16));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(im.body.as<uint8_t>(),
                                       payload + kPayloadHeaderBytes, body,
                                       cudaMemcpyHostToDevice, st));
  if (id == CodecId::kTopK || id == CodecId::kRandomK) {
    if (!add) CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d_dst, 0, 4 * n, st));
    if (h.p1 > 0) {
      SparseDecodeKernel<<<Blocks(h.p1), kThreads, 0, st>>>(
          im.body.as<uint8_t>(), id == CodecId::kTopK, n, h.p1,
          internal::SeedKey(h.seed), alpha, add, d_dst);
    }
  } else {
    const bool bucketed = id == CodecId::kInt8 || id == CodecId::kQsgd ||
                          id == CodecId::kTernGrad || id == CodecId::kSign;
    DenseDecodeKernel<<<Blocks(n), kThreads, 0, st>>>(
        h.codec, im.body.as<uint8_t>(), n, bucketed ? h.p1 : 0, h.p2, alpha,
        add, d_dst);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return im.Sync();
}

}  // namespace asyncps::compression
