#pragma once
// Safetensors tensors built from typed host values, for tests that write input files.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "nvfp4mla/safetensors.h"

namespace nvfp4mla::testing {

template <class T>
Tensor tensor_of(DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
  Tensor t = Tensor::zeros(dtype, std::move(shape));
  EXPECT_EQ(t.data.size(), values.size() * sizeof(T));
  if (!t.data.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

}  // namespace nvfp4mla::testing
