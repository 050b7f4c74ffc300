#include "worker/model.h"

#include <cerrno>
#include <cstdlib>

namespace asyncps::worker {

Status ValidateLayers(const std::vector<int>& layers) {
  if (layers.size() < 2) {
    return Status::InvalidArgument(
        "an MLP needs at least two layer sizes (input and output)");
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] < 1 || layers[i] > (1 << 20)) {
      return Status::InvalidArgument("layer size " + std::to_string(i) +
                                     " is " + std::to_string(layers[i]) +
                                     ", must be in [1, 1048576]");
    }
  }
  return Status::OK();
}

std::vector<TensorSpec> MlpTensorSpecs(const std::vector<int>& layers,
                                       uint64_t seed) {
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i + 1 < layers.size(); ++i) {
    TensorSpec w;
    w.name = "fc" + std::to_string(i) + ".weight";
    w.shape = {layers[i], layers[i + 1]};
    w.init = InitKind::kHeNormal;
    w.seed = seed;
    specs.push_back(w);
    TensorSpec b;
    b.name = "fc" + std::to_string(i) + ".bias";
    b.shape = {layers[i + 1]};
    b.init = InitKind::kZeros;
    b.seed = seed;
    specs.push_back(b);
  }
  return specs;
}

StatusOr<std::vector<int>> ParseLayers(const std::string& text) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(pos, comma - pos);
    char* end = nullptr;
    errno = 0;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || v < 1 || v > (1 << 20)) {
      return Status::InvalidArgument("bad layer size '" + item + "' in '" +
                                     text + "' (want e.g. 784,256,128,10)");
    }
    out.push_back(static_cast<int>(v));
    pos = comma + 1;
  }
  RETURN_IF_ERROR(ValidateLayers(out));
  return out;
}

std::string LayersToString(const std::vector<int>& layers) {
  std::string s;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (i) s += "-";
    s += std::to_string(layers[i]);
  }
  return s;
}

std::vector<std::vector<float>> InitializeTensors(
    const std::vector<TensorSpec>& specs) {
  std::vector<std::vector<float>> out;
  for (const auto& s : specs) {
    out.emplace_back(s.num_elements());
    InitializeTensorRange(s, 0, out.back().size(), out.back().data());
  }
  return out;
}

}  // namespace asyncps::worker
