// asyncps.Compressor and the codec helpers: compression::Compressor,
// CodecSpec and the decoders, on numpy arrays. Compression runs without the
// GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mutex>

#include "compression/codec.h"
#include "compression/compressor.h"
#include "worker/python/src/bindings.h"
#include "worker/python/src/errors.h"

namespace py = pybind11;

namespace asyncps::python {

namespace {

using compression::CodecId;
using compression::CodecSpec;
using compression::Compressor;

// A 1-d float32 C-contiguous array of n elements, or InvalidArgument.
const float* CheckedVector(const py::handle& h, size_t n, const char* what) {
  if (!py::isinstance<py::array>(h))
    Raise(
        Status::InvalidArgument(std::string(what) + " must be a numpy array"));
  auto a = py::reinterpret_borrow<py::array>(h);
  if (!a.dtype().is(py::dtype::of<float>()) ||
      !(a.flags() & py::array::c_style) || static_cast<size_t>(a.size()) != n) {
    Raise(Status::InvalidArgument(std::string(what) +
                                  " must be a C-contiguous float32 array of " +
                                  std::to_string(n) + " elements, got dtype " +
                                  std::string(py::str(a.dtype())) + " with " +
                                  std::to_string(a.size()) + " elements"));
  }
  return static_cast<const float*>(a.data());
}

class PyCompressor {
 public:
  PyCompressor(const std::string& spec, std::vector<size_t> sizes,
               uint64_t seed)
      : sizes_(std::move(sizes)) {
    compression::CompressorOptions o;
    o.spec = ValueOrThrow(CodecSpec::Parse(spec));
    o.seed = seed;
    c_ = ValueOrThrow(Compressor::Create(o, sizes_));
  }

  py::tuple Compress(size_t chunk, const py::handle& grad, double epoch,
                     uint64_t step) {
    if (chunk >= sizes_.size())
      Raise(Status::InvalidArgument("chunk " + std::to_string(chunk) +
                                    " out of range"));
    const float* g = CheckedVector(grad, sizes_[chunk], "grad");
    std::vector<uint8_t> out;
    StatusOr<CodecId> id = CodecId::kNone;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> l(mu_);
      id = c_->Compress(chunk, g, epoch, step, &out);
    }
    CodecId got = ValueOrThrow(std::move(id));
    return py::make_tuple(
        static_cast<int>(got),
        py::bytes(reinterpret_cast<const char*>(out.data()), out.size()));
  }

  py::array_t<float> Residual(size_t chunk) {
    if (chunk >= sizes_.size())
      Raise(Status::InvalidArgument("chunk out of range"));
    std::lock_guard<std::mutex> l(mu_);
    const std::vector<float>& r = c_->residual(chunk);
    py::array_t<float> a(static_cast<py::ssize_t>(r.size()));
    std::copy(r.begin(), r.end(), a.mutable_data());
    return a;
  }

  py::dict Stats() {
    std::lock_guard<std::mutex> l(mu_);
    py::dict d;
    d["raw_bytes"] = c_->stats().raw_bytes;
    d["wire_bytes"] = c_->stats().wire_bytes;
    d["encode_ns"] = c_->stats().encode_ns;
    d["chunks"] = c_->stats().chunks;
    return d;
  }

  std::string Spec() const { return c_->spec().ToString(); }
  double RatioAt(double epoch) const { return c_->RatioAt(epoch); }

 private:
  std::vector<size_t> sizes_;
  std::unique_ptr<Compressor> c_;
  std::mutex mu_;
};

}  // namespace

void BindCodecs(py::module_& m) {
  py::class_<PyCompressor>(m, "Compressor", R"doc(
The worker's stateful gradient compressor (compression/compressor.h): the
codec of `spec` plus error feedback and DGC momentum/warm-up, one state per
chunk. The bytes are those ps_worker sends for the same inputs.)doc")
      .def(py::init<const std::string&, std::vector<size_t>, uint64_t>(),
           py::arg("spec"), py::arg("chunk_sizes"), py::arg("seed") = 0)
      .def("compress", &PyCompressor::Compress, py::arg("chunk"),
           py::arg("grad"), py::arg("epoch") = 0.0, py::arg("step") = 0,
           "(codec id, payload bytes) of gradient `grad` of `chunk`.")
      .def("residual", &PyCompressor::Residual, py::arg("chunk"),
           "A copy of the chunk's error-feedback residual.")
      .def("stats", &PyCompressor::Stats)
      .def("ratio_at", &PyCompressor::RatioAt, py::arg("epoch"))
      .def_property_readonly("spec", &PyCompressor::Spec);

  m.def(
      "parse_codec",
      [](const std::string& spec) {
        return ValueOrThrow(CodecSpec::Parse(spec)).ToString();
      },
      py::arg("spec"),
      "The canonical form of a codec spec; InvalidArgument listing the valid "
      "specs when it is not one.");
  m.def(
      "codec_name",
      [](int id) {
        return std::string(compression::CodecName(static_cast<CodecId>(id)));
      },
      py::arg("id"));
  m.def(
      "decode",
      [](py::bytes payload, size_t n) {
        std::string_view p = payload;
        const auto* data = reinterpret_cast<const uint8_t*>(p.data());
        py::array_t<float> out(static_cast<py::ssize_t>(n));
        std::fill(out.mutable_data(), out.mutable_data() + n, 0.0f);
        ThrowIfError(compression::DecodeAddAny(data, p.size(), n, 1.0f,
                                               out.mutable_data()));
        return out;
      },
      py::arg("payload"), py::arg("num_elems"),
      "Decodes any payload of num_elems elements into a new float32 array "
      "(validated first: Corruption/InvalidArgument on bad bytes).");
}

}  // namespace asyncps::python
