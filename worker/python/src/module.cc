// _asyncps: the C++ client stack of asyncps as a Python extension module.
// The public API is the pure-Python package around it (worker/python/asyncps).
#include <pybind11/pybind11.h>

#include "common/transport.h"
#include "worker/python/src/bindings.h"

PYBIND11_MODULE(_asyncps, m) {
  m.doc() = "asyncps C++ client stack (use the asyncps package, not this)";
  // Pulled chunks are malloc'd by ZeroMQ: keep their memory mapped, as
  // ps_worker does (process-wide, like any allocator setting).
  (void)asyncps::TuneAllocatorForMessages();
#ifdef ASYNCPS_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  asyncps::python::BindClient(m);
  asyncps::python::BindCodecs(m);
  asyncps::python::BindData(m);
  asyncps::python::BindMetrics(m);
}
