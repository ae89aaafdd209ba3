#pragma once
// What the library was built with and which GPU it can see.
#include <string>

namespace nvfp4mla {

// True when the library was built with its CUDA kernels.
bool built_with_cuda();
// Number of usable CUDA devices (0 without CUDA, without a driver or without a GPU).
int cuda_device_count();
// "NVIDIA H200 (sm_90, 132 SMs)" or a reason why there is none.
std::string cuda_device_description(int device = 0);

}  // namespace nvfp4mla
