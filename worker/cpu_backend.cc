// CPU backend: OpenBLAS sgemm for the matrix products, simple loops the
// compiler vectorises (bias broadcast, ReLU, softmax cross-entropy, column
// sums) for the rest. Scratch buffers grow to the largest batch seen and are
// then reused, so steady-state steps allocate nothing.
//
// Row-major shapes for layer l (in = layers[l], out = layers[l+1], B rows):
//   forward   z = a_prev W + b          [B,out] = [B,in][in,out]
//   backward  dW = a_prev^T dz          [in,out] = [in,B][B,out]
//             db = column sums of dz    [out]
//             da_prev = dz W^T          [B,in]  = [B,out][out,in]
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "worker/internal/backends.h"

namespace asyncps::worker::internal {
namespace {

// Largest chunk Evaluate() pushes through the network at once.
constexpr int kEvalChunk = 1024;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options) : Backend(options.layers) {
    openblas_set_num_threads(options.threads);
    threads_ = options.threads;
    params_.resize(num_tensors());
    for (size_t i = 0; i < num_tensors(); ++i)
      params_[i].assign(tensor_elems(i), 0.0f);
    act_.resize(layers_.size());
    delta_.resize(layers_.size());
  }

  std::string name() const override {
    return "cpu (OpenBLAS, " + std::to_string(threads_) + " thread(s))";
  }

  Status SetParameters(const std::vector<const float*>& host_tensors) override {
    RETURN_IF_ERROR(CheckParams(host_tensors));
    for (size_t i = 0; i < params_.size(); ++i) {
      std::memcpy(params_[i].data(), host_tensors[i],
                  params_[i].size() * sizeof(float));
    }
    return Status::OK();
  }

  StatusOr<float> ForwardBackward(
      const float* x, const uint8_t* y, int batch,
      const std::vector<float*>& host_grads) override {
    return ForwardBackwardLayered(x, y, batch, host_grads, LayerHooks());
  }

  bool supports_layered_steps() const override { return true; }

  // The one implementation of the step: ForwardBackward is this without
  // hooks, so both give the same bits.
  StatusOr<float> ForwardBackwardLayered(const float* x, const uint8_t* y,
                                         int batch,
                                         const std::vector<float*>& host_grads,
                                         const LayerHooks& hooks) override {
    RETURN_IF_ERROR(CheckLayeredStepArgs(x, y, batch, host_grads));
    EnsureCapacity(batch);
    RETURN_IF_ERROR(Forward(x, batch, hooks.before_forward));
    const size_t L = layers_.size() - 1;
    const float loss = SoftmaxXent(act_[L].data(), y, batch, delta_[L].data());
    for (size_t l = L; l-- > 0;) {
      const int in = layers_[l], out = layers_[l + 1];
      const float* a_prev = l == 0 ? x : act_[l].data();
      const float* dz = delta_[l + 1].data();
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, batch, 1.0f,
                  a_prev, in, dz, out, 0.0f, host_grads[2 * l], out);
      ColumnSums(dz, batch, out, host_grads[2 * l + 1]);
      if (hooks.after_backward) {
        RETURN_IF_ERROR(hooks.after_backward(static_cast<int>(l)));
      }
      if (l > 0) {
        float* da = delta_[l].data();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, in, out,
                    1.0f, dz, out, params_[2 * l].data(), out, 0.0f, da, in);
        ReluBackward(act_[l].data(), static_cast<size_t>(batch) * in, da);
      }
    }
    return loss;
  }

  Status SetLayerParameters(int layer, const float* weight,
                            const float* bias) override {
    RETURN_IF_ERROR(CheckLayerParams(layer, weight, bias));
    std::memcpy(params_[2 * layer].data(), weight,
                params_[2 * layer].size() * sizeof(float));
    std::memcpy(params_[2 * layer + 1].data(), bias,
                params_[2 * layer + 1].size() * sizeof(float));
    return Status::OK();
  }

  StatusOr<EvalResult> Evaluate(const float* x, const uint8_t* y,
                                int64_t n) override {
    if (n < 1)
      return Status::InvalidArgument("Evaluate needs at least one example");
    RETURN_IF_ERROR(CheckStepArgs(
        x, y, static_cast<int>(std::min<int64_t>(n, 1)), 0, true));
    const size_t L = layers_.size() - 1;
    const int in_dim = layers_[0], classes = layers_[L];
    double loss_sum = 0.0;
    int64_t correct = 0;
    for (int64_t begin = 0; begin < n; begin += kEvalChunk) {
      const int b = static_cast<int>(std::min<int64_t>(kEvalChunk, n - begin));
      for (int i = 0; i < b; ++i) {
        if (y[begin + i] >= classes)
          return Status::InvalidArgument("label out of range");
      }
      EnsureCapacity(b);
      RETURN_IF_ERROR(Forward(x + begin * in_dim, b, nullptr));
      const float* logits = act_[L].data();
      for (int r = 0; r < b; ++r) {
        const float* z = logits + static_cast<size_t>(r) * classes;
        int arg = 0;
        float mx = z[0];
        for (int j = 1; j < classes; ++j) {
          if (z[j] > mx) mx = z[j], arg = j;
        }
        double s = 0.0;
        for (int j = 0; j < classes; ++j)
          s += std::exp(static_cast<double>(z[j] - mx));
        loss_sum += std::log(s) - (z[y[begin + r]] - mx);
        correct += arg == y[begin + r];
      }
    }
    EvalResult r;
    r.examples = n;
    r.loss = loss_sum / static_cast<double>(n);
    r.accuracy = static_cast<double>(correct) / static_cast<double>(n);
    return r;
  }

 private:
  void EnsureCapacity(int batch) {
    if (batch <= capacity_) return;
    for (size_t l = 1; l < layers_.size(); ++l) {
      act_[l].resize(static_cast<size_t>(batch) * layers_[l]);
      delta_[l].resize(static_cast<size_t>(batch) * layers_[l]);
    }
    capacity_ = batch;
  }

  // act_[l] for l = 1..L: post-ReLU activations for hidden layers, logits
  // last. `before` (may be null) runs before each layer.
  Status Forward(const float* x, int batch,
                 const std::function<Status(int)>& before) {
    const size_t L = layers_.size() - 1;
    const float* a = x;
    for (size_t l = 0; l < L; ++l) {
      if (before) RETURN_IF_ERROR(before(static_cast<int>(l)));
      const int in = layers_[l], out = layers_[l + 1];
      float* z = act_[l + 1].data();
      const float* bias = params_[2 * l + 1].data();
      for (int r = 0; r < batch; ++r) {
        std::memcpy(z + static_cast<size_t>(r) * out, bias,
                    out * sizeof(float));
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, out, in,
                  1.0f, a, in, params_[2 * l].data(), out, 1.0f, z, out);
      if (l + 1 < L) Relu(z, static_cast<size_t>(batch) * out);
      a = z;
    }
    return Status::OK();
  }

  static void Relu(float* __restrict z, size_t n) {
    for (size_t i = 0; i < n; ++i) z[i] = z[i] > 0.0f ? z[i] : 0.0f;
  }

  // da *= (a > 0), where a is the post-ReLU activation.
  static void ReluBackward(const float* __restrict a, size_t n,
                           float* __restrict da) {
    for (size_t i = 0; i < n; ++i) da[i] = a[i] > 0.0f ? da[i] : 0.0f;
  }

  static void ColumnSums(const float* __restrict m, int rows, int cols,
                         float* __restrict out) {
    std::memset(out, 0, cols * sizeof(float));
    for (int r = 0; r < rows; ++r) {
      const float* row = m + static_cast<size_t>(r) * cols;
      for (int j = 0; j < cols; ++j) out[j] += row[j];
    }
  }

  // Mean cross-entropy of softmax(logits); writes d(mean loss)/d(logits).
  float SoftmaxXent(const float* logits, const uint8_t* y, int batch,
                    float* dz) const {
    const int classes = layers_.back();
    const float inv_b = 1.0f / static_cast<float>(batch);
    double loss = 0.0;
    for (int r = 0; r < batch; ++r) {
      const float* z = logits + static_cast<size_t>(r) * classes;
      float* d = dz + static_cast<size_t>(r) * classes;
      float mx = z[0];
      for (int j = 1; j < classes; ++j) mx = std::max(mx, z[j]);
      float s = 0.0f;
      for (int j = 0; j < classes; ++j) {
        d[j] = std::exp(z[j] - mx);
        s += d[j];
      }
      loss += std::log(s) - (z[y[r]] - mx);
      const float scale = inv_b / s;
      for (int j = 0; j < classes; ++j) d[j] *= scale;
      d[y[r]] -= inv_b;
    }
    return static_cast<float>(loss / batch);
  }

  int threads_ = 1;
  int capacity_ = 0;
  std::vector<std::vector<float>> params_;
  std::vector<std::vector<float>> act_;    // [l] : capacity x layers[l], l >= 1
  std::vector<std::vector<float>> delta_;  // [l] : d loss / d z_l
};

}  // namespace

StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(
    const BackendOptions& options) {
  return std::unique_ptr<Backend>(new CpuBackend(options));
}

}  // namespace asyncps::worker::internal
