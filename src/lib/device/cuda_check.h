#pragma once
// Host-side CUDA error handling: every runtime call and launch is checked and turned into an
// nvfp4mla::Error naming the call.
#include <cuda_runtime_api.h>

#include <string>

#include "nvfp4mla/error.h"

namespace nvfp4mla::cuda {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

}  // namespace nvfp4mla::cuda
