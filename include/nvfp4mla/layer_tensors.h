#pragma once
// Per-layer tensors of an activation dump, as `nvfp4mla calibrate` and `nvfp4mla eval --dump`
// read them: one safetensors tensor per layer named layers.<i>.<kind> (kind: kv_c, k_pe, q),
// i = 0, 1, 2, ... written without leading zeros.
#include <string>
#include <vector>

#include "nvfp4mla/safetensors.h"

namespace nvfp4mla {

// "layers.<layer>.<kind>"
std::string layer_tensor_name(int layer, const std::string& kind);

// The names of the layers.<i>.<kind> tensors of `m`, entry i for layer i. Tensors of other
// kinds are ignored. Throws Error naming `origin` when there is none, when an index is malformed
// (layers.x.kv_c, layers.01.kv_c) or when a layer between 0 and the last one is missing.
std::vector<std::string> layer_tensor_names(const TensorMap& m, const std::string& kind, const std::string& origin);

}  // namespace nvfp4mla
