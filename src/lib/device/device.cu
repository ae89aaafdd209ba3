#include <cuda_runtime.h>

#include <string>

#include "nvfp4mla/device.h"

namespace nvfp4mla {

bool built_with_cuda() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return n;
}

std::string cuda_device_description(int device) {
  if (cuda_device_count() <= device) return "no CUDA device";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return "device properties unavailable";
  return std::string(p.name) + " (sm_" + std::to_string(p.major * 10 + p.minor) + ", " +
         std::to_string(p.multiProcessorCount) + " SMs)";
}

}  // namespace nvfp4mla
