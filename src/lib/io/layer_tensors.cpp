#include "nvfp4mla/layer_tensors.h"

#include "nvfp4mla/error.h"

namespace nvfp4mla {

namespace {

constexpr const char* kPrefix = "layers.";

// The layer index of layers.<i>.<kind>, or -1 for a tensor of another kind.
int layer_index(const std::string& name, const std::string& kind, const std::string& origin) {
  const std::string prefix = kPrefix, suffix = "." + kind;
  if (name.size() < prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 6 ||
      (digits.size() > 1 && digits[0] == '0'))
    throw Error(origin + ": tensor '" + name + "' does not name a layer; expected " + kPrefix + "<i>" + suffix +
                " with i = 0, 1, 2, ...");
  return std::stoi(digits);
}

}  // namespace

std::string layer_tensor_name(int layer, const std::string& kind) {
  return kPrefix + std::to_string(layer) + "." + kind;
}

std::vector<std::string> layer_tensor_names(const TensorMap& m, const std::string& kind, const std::string& origin) {
  std::vector<std::string> names;
  for (const auto& entry : m) {
    const int layer = layer_index(entry.first, kind, origin);
    if (layer < 0) continue;
    if (layer >= static_cast<int>(names.size())) names.resize(static_cast<size_t>(layer) + 1);
    names[static_cast<size_t>(layer)] = entry.first;
  }
  const std::string pattern = std::string(kPrefix) + "<i>." + kind;
  if (names.empty()) throw Error(origin + ": no tensors named " + pattern + " (expected one per layer, layers 0..N-1)");
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i].empty())
      throw Error(origin + ": tensor " + layer_tensor_name(static_cast<int>(i), kind) + " is missing (found " + pattern +
                  " up to layer " + std::to_string(names.size() - 1) + "; every layer 0..N-1 must be present)");
  return names;
}

}  // namespace nvfp4mla
