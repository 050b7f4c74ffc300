#include "worker/python/src/errors.h"

namespace py = pybind11;

namespace asyncps::python {

void Raise(const Status& s) {
  // asyncps.errors (pure Python, imported before this module) has one class
  // per code, named as StatusCodeName() names it; unknown codes are Internal.
  py::module_ errors = py::module_::import("asyncps.errors");
  const char* name = StatusCodeName(s.code());
  py::object cls =
      py::hasattr(errors, name) ? errors.attr(name) : errors.attr("Internal");
  PyErr_SetString(cls.ptr(), std::string(s.message()).c_str());
  throw py::error_already_set();
}

Status Interrupter::Check() {
  if (interrupted_.load()) return Status::Cancelled("interrupted");
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) {
    interrupted_.store(true);
    return Status::Cancelled("interrupted by a signal");
  }
  return Status::OK();
}

void Interrupter::DeferIfInterrupted() {
  if (!interrupted_.exchange(false)) return;
  PyErr_Clear();
  PyErr_SetInterrupt();
}

void Interrupter::RethrowIfInterrupted() {
  if (!interrupted_.exchange(false)) return;
  if (PyErr_Occurred()) throw py::error_already_set();
}

}  // namespace asyncps::python
