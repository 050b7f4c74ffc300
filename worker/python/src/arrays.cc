#include "worker/python/src/arrays.h"

#include "worker/python/src/errors.h"

namespace py = pybind11;

namespace asyncps::python {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

namespace {

std::string Prefix(const char* what, const TensorSpec& spec) {
  return std::string(what) + ": tensor '" + spec.name + "' ";
}

}  // namespace

std::vector<float*> CheckedBuffers(const py::sequence& arrays,
                                   const std::vector<TensorSpec>& specs,
                                   bool writeable, const char* what) {
  if (arrays.size() != specs.size()) {
    Raise(Status::InvalidArgument(
        std::string(what) + ": the model has " + std::to_string(specs.size()) +
        " tensors, got " + std::to_string(arrays.size()) + " buffers"));
  }
  std::vector<float*> out(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& spec = specs[i];
    py::handle h = arrays[i];
    if (!py::isinstance<py::array>(h)) {
      Raise(Status::InvalidArgument(
          Prefix(what, spec) + "is a " +
          std::string(py::str(py::type::handle_of(h).attr("__name__"))) +
          ", not a numpy array or torch CPU tensor"));
    }
    auto a = py::reinterpret_borrow<py::array>(h);
    if (!a.dtype().is(py::dtype::of<float>())) {
      Raise(Status::InvalidArgument(Prefix(what, spec) + "has dtype " +
                                    std::string(py::str(a.dtype())) +
                                    ", expected float32"));
    }
    std::vector<int64_t> shape(a.shape(), a.shape() + a.ndim());
    const bool scalar_ok =
        shape.empty() && spec.shape == std::vector<int64_t>{1};
    if (shape != spec.shape && !scalar_ok) {
      Raise(Status::InvalidArgument(Prefix(what, spec) + "has shape " +
                                    ShapeString(shape) + ", registered as " +
                                    ShapeString(spec.shape)));
    }
    if (!(a.flags() & py::array::c_style)) {
      Raise(Status::InvalidArgument(
          Prefix(what, spec) +
          "is not C-contiguous (pass a contiguous tensor, e.g. "
          ".contiguous() / numpy.ascontiguousarray)"));
    }
    if (writeable && !a.writeable()) {
      Raise(Status::InvalidArgument(Prefix(what, spec) + "is read-only"));
    }
    out[i] = static_cast<float*>(const_cast<void*>(a.data()));
  }
  return out;
}

}  // namespace asyncps::python
