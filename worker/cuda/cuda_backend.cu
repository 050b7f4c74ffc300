// CUDA backend: cuBLAS sgemm for the matrix products plus own kernels for
// bias broadcast, ReLU, softmax cross-entropy and reductions.
//
// Row-major trick: cuBLAS is column-major, and a row-major [m,n] matrix is a
// column-major [n,m] one. So the row-major product C = op(A) op(B) is
// computed as the column-major C^T = op(B)^T op(A)^T, i.e. cublasSgemm with
// the operands swapped and (m, n) exchanged; see Gemm() below.
//
// Memory: parameters, gradients, activations and per-row scratch live on
// the device and persist across steps (they grow to the largest batch seen).
// Host<->device copies go through pinned staging buffers on one stream.
#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "worker/cuda/cublas_api.h"
#include "worker/cuda/cuda_status.h"
#include "worker/internal/backends.h"

namespace asyncps::worker::internal {
namespace {

constexpr int kEvalChunk = 4096;
constexpr int kThreads = 256;

int Blocks(size_t n) {
  return static_cast<int>(
      std::min<size_t>((n + kThreads - 1) / kThreads, 65535 * 4));
}

// z[r, j] = b[j] for every row r.
__global__ void BroadcastRowsKernel(const float* __restrict__ b, int rows,
                                    int cols, float* __restrict__ z) {
  const size_t n = static_cast<size_t>(rows) * cols;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    z[i] = b[i % cols];
  }
}

__global__ void ReluKernel(float* __restrict__ z, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    z[i] = fmaxf(z[i], 0.0f);
  }
}

// da *= (a > 0).
__global__ void ReluBackwardKernel(const float* __restrict__ a, size_t n,
                                   float* __restrict__ da) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    if (!(a[i] > 0.0f)) da[i] = 0.0f;
  }
}

// One warp per row: row loss (log-sum-exp minus the label's logit), whether
// argmax == label, and optionally d(mean loss)/d(logits) = (p - onehot) / B.
__global__ void SoftmaxXentKernel(const float* __restrict__ logits,
                                  const uint8_t* __restrict__ y, int rows,
                                  int classes, float inv_batch,
                                  float* __restrict__ dz,
                                  float* __restrict__ row_loss,
                                  float* __restrict__ row_correct) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= rows) return;
  const float* z = logits + static_cast<size_t>(warp) * classes;
  float mx = -INFINITY;
  int arg = 0;
  for (int j = lane; j < classes; j += 32) {
    if (z[j] > mx) mx = z[j], arg = j;
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float om = __shfl_down_sync(0xffffffff, mx, off);
    const int oa = __shfl_down_sync(0xffffffff, arg, off);
    if (om > mx || (om == mx && oa < arg)) mx = om, arg = oa;
  }
  mx = __shfl_sync(0xffffffff, mx, 0);
  arg = __shfl_sync(0xffffffff, arg, 0);
  float s = 0.0f;
  for (int j = lane; j < classes; j += 32) s += __expf(z[j] - mx);
  for (int off = 16; off > 0; off >>= 1)
    s += __shfl_down_sync(0xffffffff, s, off);
  s = __shfl_sync(0xffffffff, s, 0);
  const int label = y[warp];
  if (lane == 0) {
    row_loss[warp] = logf(s) - (z[label] - mx);
    if (row_correct) row_correct[warp] = arg == label ? 1.0f : 0.0f;
  }
  if (dz) {
    float* d = dz + static_cast<size_t>(warp) * classes;
    const float scale = inv_batch / s;
    for (int j = lane; j < classes; j += 32) {
      d[j] = __expf(z[j] - mx) * scale - (j == label ? inv_batch : 0.0f);
    }
  }
}

// out[j] = sum_r m[r, j]. Block = 32 columns x 8 row groups; shared-memory
// reduction over the row groups.
__global__ void ColumnSumsKernel(const float* __restrict__ m, int rows,
                                 int cols, float* __restrict__ out) {
  __shared__ float partial[8][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (col < cols) {
    for (int r = threadIdx.y; r < rows; r += 8)
      s += m[static_cast<size_t>(r) * cols + col];
  }
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float t = 0.0f;
    for (int k = 0; k < 8; ++k) t += partial[k][threadIdx.x];
    out[col] = t;
  }
}

// out[k] = sum of v_k[0..n) for the two vectors; one block of 1024 threads.
__global__ void SumTwoKernel(const float* __restrict__ a,
                             const float* __restrict__ b, int n,
                             float* __restrict__ out) {
  __shared__ float sa[32], sb[32];
  float x = 0.0f, z = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    x += a[i];
    if (b) z += b[i];
  }
  for (int off = 16; off > 0; off >>= 1) {
    x += __shfl_down_sync(0xffffffff, x, off);
    z += __shfl_down_sync(0xffffffff, z, off);
  }
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sa[w] = x, sb[w] = z;
  __syncthreads();
  if (w == 0) {
    const int nw = blockDim.x / 32;
    x = lane < nw ? sa[lane] : 0.0f;
    z = lane < nw ? sb[lane] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) {
      x += __shfl_down_sync(0xffffffff, x, off);
      z += __shfl_down_sync(0xffffffff, z, off);
    }
    if (lane == 0) out[0] = x, out[1] = z;
  }
}

// A CUDA allocation owned by RAII: device memory (cudaMalloc) or pinned host
// memory (cudaMallocHost), the same code for both.
template <typename T, cudaError_t (*kAlloc)(void**, size_t),
          cudaError_t (*kFree)(void*)>
class CudaArray {
 public:
  CudaArray() = default;
  ~CudaArray() {
    if (p_) kFree(p_);
  }
  CudaArray(const CudaArray&) = delete;
  CudaArray& operator=(const CudaArray&) = delete;
  CudaArray(CudaArray&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  Status Resize(size_t n) {
    if (n <= n_) return Status::OK();
    if (p_) kFree(p_);
    p_ = nullptr;
    n_ = 0;
    void* raw = nullptr;
    CUDA_RETURN_IF_ERROR(kAlloc(&raw, n * sizeof(T)));
    p_ = static_cast<T*>(raw);
    n_ = n;
    return Status::OK();
  }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

inline cudaError_t DeviceAlloc(void** p, size_t bytes) {
  return cudaMalloc(p, bytes);
}
inline cudaError_t PinnedAlloc(void** p, size_t bytes) {
  return cudaMallocHost(p, bytes);
}

template <typename T>
using DeviceArray = CudaArray<T, DeviceAlloc, cudaFree>;
template <typename T>
using PinnedArray = CudaArray<T, PinnedAlloc, cudaFreeHost>;

class CudaBackend final : public Backend {
 public:
  CudaBackend(const BackendOptions& options)
      : Backend(options.layers), ordinal_(options.cuda_device) {}

  ~CudaBackend() override {
    if (handle_) blas_->destroy(handle_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status Init() {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    cudaDeviceProp prop;
    CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal_));
    device_name_ = prop.name;
    CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ASSIGN_OR_RETURN(blas_, LoadCublas());
    CUBLAS_RETURN_IF_ERROR(blas_->create(&handle_));
    CUBLAS_RETURN_IF_ERROR(blas_->set_stream(handle_, stream_));
    // Keep full fp32 (no TF32) so results agree with the CPU backend.
    CUBLAS_RETURN_IF_ERROR(blas_->set_math_mode(handle_, CUBLAS_DEFAULT_MATH));
    const size_t nt = num_tensors();
    params_.resize(nt);
    grads_.resize(nt);
    size_t total = 0;
    for (size_t i = 0; i < nt; ++i) {
      RETURN_IF_ERROR(params_[i].Resize(tensor_elems(i)));
      RETURN_IF_ERROR(grads_[i].Resize(tensor_elems(i)));
      total += tensor_elems(i);
    }
    RETURN_IF_ERROR(staging_params_.Resize(total));
    act_.resize(layers_.size());
    delta_.resize(layers_.size());
    RETURN_IF_ERROR(sums_.Resize(2));
    RETURN_IF_ERROR(host_sums_.Resize(2));
    return Status::OK();
  }

  std::string name() const override {
    return "cuda:" + std::to_string(ordinal_) + " (" + device_name_ +
           ", cuBLAS)";
  }

  Status SetParameters(const std::vector<const float*>& host_tensors) override {
    RETURN_IF_ERROR(CheckParams(host_tensors));
    // One pinned staging copy, then async uploads on the stream.
    size_t off = 0;
    float* stage = staging_params_.get();
    CUDA_RETURN_IF_ERROR(
        cudaStreamSynchronize(stream_));  // staging may still be in flight
    for (size_t i = 0; i < host_tensors.size(); ++i) {
      const size_t n = tensor_elems(i);
      std::memcpy(stage + off, host_tensors[i], n * sizeof(float));
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(params_[i].get(), stage + off,
                                           n * sizeof(float),
                                           cudaMemcpyHostToDevice, stream_));
      off += n;
    }
    return Status::OK();
  }

  StatusOr<float> ForwardBackward(
      const float* x, const uint8_t* y, int batch,
      const std::vector<float*>& host_grads) override {
    RETURN_IF_ERROR(
        CheckStepArgs(x, y, batch, host_grads.size(), /*grads_optional=*/true));
    return Step(x, y, batch, host_grads, LayerHooks());
  }

  bool supports_layered_steps() const override { return true; }

  // The same kernels in the same order as ForwardBackward (so the same
  // bits); each layer's two gradients are copied to the host right after
  // their kernels, before after_backward(l), while ForwardBackward copies
  // them all at the end.
  StatusOr<float> ForwardBackwardLayered(const float* x, const uint8_t* y,
                                         int batch,
                                         const std::vector<float*>& host_grads,
                                         const LayerHooks& hooks) override {
    RETURN_IF_ERROR(CheckLayeredStepArgs(x, y, batch, host_grads));
    return Step(x, y, batch, host_grads, hooks);
  }

  Status SetLayerParameters(int layer, const float* weight,
                            const float* bias) override {
    RETURN_IF_ERROR(CheckLayerParams(layer, weight, bias));
    // The layer's part of the pinned staging copy may still feed an upload
    // (the kernels queued before it are cheap to wait for).
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    float* stage = staging_params_.get();
    for (const size_t i : {size_t(2 * layer), size_t(2 * layer + 1)}) {
      const size_t n = tensor_elems(i);
      std::memcpy(stage + StagingOffset(i), i % 2 == 0 ? weight : bias,
                  n * sizeof(float));
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(params_[i].get(), stage + StagingOffset(i),
                          n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    }
    return Status::OK();
  }

  StatusOr<EvalResult> Evaluate(const float* x, const uint8_t* y,
                                int64_t n) override {
    if (n < 1)
      return Status::InvalidArgument("Evaluate needs at least one example");
    if (x == nullptr || y == nullptr)
      return Status::InvalidArgument("null input or labels");
    const size_t L = layers_.size() - 1;
    const int classes = layers_[L];
    double loss = 0.0, correct = 0.0;
    for (int64_t begin = 0; begin < n; begin += kEvalChunk) {
      const int b = static_cast<int>(std::min<int64_t>(kEvalChunk, n - begin));
      for (int i = 0; i < b; ++i) {
        if (y[begin + i] >= classes)
          return Status::InvalidArgument("label out of range");
      }
      RETURN_IF_ERROR(EnsureCapacity(b));
      RETURN_IF_ERROR(Upload(x + begin * layers_[0], y + begin, b));
      RETURN_IF_ERROR(Forward(d_x_.get(), b));
      SoftmaxXentKernel<<<(b * 32 + kThreads - 1) / kThreads, kThreads, 0,
                          stream_>>>(act_[L].get(), d_y_.get(), b, classes,
                                     1.0f / b, nullptr, row_loss_.get(),
                                     row_correct_.get());
      SumTwoKernel<<<1, 1024, 0, stream_>>>(row_loss_.get(), row_correct_.get(),
                                            b, sums_.get());
      CUDA_RETURN_IF_ERROR(cudaGetLastError());
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_sums_.get(), sums_.get(),
                                           2 * sizeof(float),
                                           cudaMemcpyDeviceToHost, stream_));
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      loss += host_sums_.get()[0];
      correct += host_sums_.get()[1];
    }
    EvalResult r;
    r.examples = n;
    r.loss = loss / n;
    r.accuracy = correct / n;
    return r;
  }

  const float* device_grad(size_t tensor) const override {
    return tensor < grads_.size() ? grads_[tensor].get() : nullptr;
  }

 private:
  // Offset of tensor i in the staging copies of all tensors.
  size_t StagingOffset(size_t i) const {
    size_t off = 0;
    for (size_t j = 0; j < i; ++j) off += tensor_elems(j);
    return off;
  }

  // Copies the gradients of `layer` (tensors 2l, 2l+1) to host_grads once
  // the kernels queued so far have computed them.
  Status LayerGradientsToHost(size_t layer,
                              const std::vector<float*>& host_grads) {
    float* stage = staging_grads_.get();
    for (const size_t i : {2 * layer, 2 * layer + 1}) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          stage + StagingOffset(i), grads_[i].get(),
          tensor_elems(i) * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    for (const size_t i : {2 * layer, 2 * layer + 1}) {
      std::memcpy(host_grads[i], stage + StagingOffset(i),
                  tensor_elems(i) * sizeof(float));
    }
    return Status::OK();
  }

  // One step (arguments checked): host_grads may be empty without hooks
  // (the gradients then stay on the device, device_grad()).
  StatusOr<float> Step(const float* x, const uint8_t* y, int batch,
                       const std::vector<float*>& host_grads,
                       const LayerHooks& hooks) {
    RETURN_IF_ERROR(EnsureCapacity(batch));
    RETURN_IF_ERROR(Upload(x, y, batch));
    RETURN_IF_ERROR(Forward(d_x_.get(), batch, hooks.before_forward));
    const size_t L = layers_.size() - 1;
    const int classes = layers_[L];
    SoftmaxXentKernel<<<(batch * 32 + kThreads - 1) / kThreads, kThreads, 0,
                        stream_>>>(act_[L].get(), d_y_.get(), batch, classes,
                                   1.0f / batch, delta_[L].get(),
                                   row_loss_.get(), nullptr);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    SumTwoKernel<<<1, 1024, 0, stream_>>>(row_loss_.get(), nullptr, batch,
                                          sums_.get());
    for (size_t l = L; l-- > 0;) {
      const int in = layers_[l], out = layers_[l + 1];
      const float* a_prev = l == 0 ? d_x_.get() : act_[l].get();
      const float* dz = delta_[l + 1].get();
      // dW [in,out] = a_prev^T [in,B] * dz [B,out]
      RETURN_IF_ERROR(Gemm(true, false, in, out, batch, a_prev, in, dz, out,
                           0.0f, grads_[2 * l].get(), out));
      ColumnSumsKernel<<<(out + 31) / 32, dim3(32, 8), 0, stream_>>>(
          dz, batch, out, grads_[2 * l + 1].get());
      if (hooks.after_backward) {
        CUDA_RETURN_IF_ERROR(cudaGetLastError());
        RETURN_IF_ERROR(LayerGradientsToHost(l, host_grads));
        RETURN_IF_ERROR(hooks.after_backward(static_cast<int>(l)));
      }
      if (l > 0) {
        // da [B,in] = dz [B,out] * W^T [out,in]
        float* da = delta_[l].get();
        RETURN_IF_ERROR(Gemm(false, true, batch, in, out, dz, out,
                             params_[2 * l].get(), out, 0.0f, da, in));
        const size_t n = static_cast<size_t>(batch) * in;
        ReluBackwardKernel<<<Blocks(n), kThreads, 0, stream_>>>(act_[l].get(),
                                                                n, da);
      }
    }
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_sums_.get(), sums_.get(),
                                         2 * sizeof(float),
                                         cudaMemcpyDeviceToHost, stream_));
    if (!host_grads.empty() && !hooks.after_backward) {
      float* stage = staging_grads_.get();
      size_t off = 0;
      for (size_t i = 0; i < num_tensors(); ++i) {
        const size_t n = tensor_elems(i);
        CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(stage + off, grads_[i].get(),
                                             n * sizeof(float),
                                             cudaMemcpyDeviceToHost, stream_));
        off += n;
      }
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      off = 0;
      for (size_t i = 0; i < num_tensors(); ++i) {
        if (host_grads[i] == nullptr)
          return Status::InvalidArgument("null gradient buffer");
        const size_t n = tensor_elems(i);
        std::memcpy(host_grads[i], stage + off, n * sizeof(float));
        off += n;
      }
    } else {
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    }
    return host_sums_.get()[0] / static_cast<float>(batch);
  }

  Status EnsureCapacity(int batch) {
    if (batch <= capacity_) return Status::OK();
    for (size_t l = 1; l < layers_.size(); ++l) {
      RETURN_IF_ERROR(act_[l].Resize(static_cast<size_t>(batch) * layers_[l]));
      RETURN_IF_ERROR(
          delta_[l].Resize(static_cast<size_t>(batch) * layers_[l]));
    }
    RETURN_IF_ERROR(d_x_.Resize(static_cast<size_t>(batch) * layers_[0]));
    RETURN_IF_ERROR(d_y_.Resize(batch));
    RETURN_IF_ERROR(row_loss_.Resize(batch));
    RETURN_IF_ERROR(row_correct_.Resize(batch));
    RETURN_IF_ERROR(staging_x_.Resize(static_cast<size_t>(batch) * layers_[0]));
    RETURN_IF_ERROR(staging_y_.Resize(batch));
    size_t total = 0;
    for (size_t i = 0; i < num_tensors(); ++i) total += tensor_elems(i);
    RETURN_IF_ERROR(staging_grads_.Resize(total));
    capacity_ = batch;
    return Status::OK();
  }

  Status Upload(const float* x, const uint8_t* y, int batch) {
    // The staging buffers may still feed an earlier copy.
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    const size_t nx = static_cast<size_t>(batch) * layers_[0];
    std::memcpy(staging_x_.get(), x, nx * sizeof(float));
    std::memcpy(staging_y_.get(), y, batch);
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_x_.get(), staging_x_.get(),
                                         nx * sizeof(float),
                                         cudaMemcpyHostToDevice, stream_));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_y_.get(), staging_y_.get(), batch,
                                         cudaMemcpyHostToDevice, stream_));
    return Status::OK();
  }

  // Row-major C[m,n] = alpha op(A)[m,k] op(B)[k,n] + beta C, via the
  // column-major C^T = op(B)^T op(A)^T.
  Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a,
              int lda, const float* b, int ldb, float beta, float* c, int ldc) {
    const float alpha = 1.0f;
    CUBLAS_RETURN_IF_ERROR(
        blas_->sgemm(handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                     ldb, a, lda, &beta, c, ldc));
    return Status::OK();
  }

  // before_forward(l) (may be null) runs before layer l's kernels are
  // queued, so parameters it sets (SetLayerParameters) are used by them.
  Status Forward(const float* x, int batch,
                 const std::function<Status(int)>& before_forward = nullptr) {
    const size_t L = layers_.size() - 1;
    const float* a = x;
    for (size_t l = 0; l < L; ++l) {
      if (before_forward) RETURN_IF_ERROR(before_forward(static_cast<int>(l)));
      const int in = layers_[l], out = layers_[l + 1];
      float* z = act_[l + 1].get();
      const size_t n = static_cast<size_t>(batch) * out;
      BroadcastRowsKernel<<<Blocks(n), kThreads, 0, stream_>>>(
          params_[2 * l + 1].get(), batch, out, z);
      RETURN_IF_ERROR(Gemm(false, false, batch, out, in, a, in,
                           params_[2 * l].get(), out, 1.0f, z, out));
      if (l + 1 < L) ReluKernel<<<Blocks(n), kThreads, 0, stream_>>>(z, n);
      a = z;
    }
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::OK();
  }

  const int ordinal_;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  const CublasApi* blas_ = nullptr;  // set before handle_
  cublasHandle_t handle_ = nullptr;
  int capacity_ = 0;
  std::vector<DeviceArray<float>> params_, grads_, act_, delta_;
  DeviceArray<float> d_x_, row_loss_, row_correct_, sums_;
  DeviceArray<uint8_t> d_y_;
  PinnedArray<float> staging_x_, staging_params_, staging_grads_, host_sums_;
  PinnedArray<uint8_t> staging_y_;
};

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(
    const BackendOptions& options) {
  const int count = CudaDeviceCount();
  if (options.cuda_device < 0 || options.cuda_device >= count) {
    return Status::Unavailable(
        "CUDA device " + std::to_string(options.cuda_device) + " requested, " +
        std::to_string(count) + " visible");
  }
  auto backend = std::make_unique<CudaBackend>(options);
  RETURN_IF_ERROR(backend->Init().WithContext("CUDA backend init"));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace asyncps::worker::internal
