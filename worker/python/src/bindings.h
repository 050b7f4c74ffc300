// The parts of the _asyncps extension module, one function per file.
#pragma once

#include <pybind11/pybind11.h>

namespace asyncps::python {

void BindClient(pybind11::module_& m);   // Client, Store, TensorSpec
void BindCodecs(pybind11::module_& m);   // Compressor, parse_codec, decode
void BindData(pybind11::module_& m);     // load_mnist, partitions
void BindMetrics(pybind11::module_& m);  // MetricsExporter

}  // namespace asyncps::python
