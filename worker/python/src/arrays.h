// Checks Python buffers against a model's tensor specs and returns their
// float pointers, without copying.
//
// A buffer is a numpy.ndarray (asyncps.torch hands torch CPU tensors over as
// the numpy views that share their memory). It must be float32,
// C-contiguous, of the spec's shape (a 0-d array matches shape {1}) and, for
// pulls, writeable. Anything else raises asyncps.InvalidArgument naming the
// tensor and what is wrong, before anything is sent or written.
// REQUIRES: GIL held. The pointers stay valid while `arrays` is alive.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "common/layout.h"

namespace asyncps::python {

// `what` names the operation in messages ("pull", "push").
std::vector<float*> CheckedBuffers(const pybind11::sequence& arrays,
                                   const std::vector<TensorSpec>& specs,
                                   bool writeable, const char* what);

// "(3, 4)" for messages.
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace asyncps::python
